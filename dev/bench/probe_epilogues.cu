/*
probe_epilogues.cu: whether this GPU's cuBLASLt has FP8 GEMMs that write FP8 codes through a
GELU epilogue, the fusions that would take bytes out of llm8's FP8 path. It asks, it does not
time: the answer decides whether building them is worth a session.

Why these: doc/performance.md's floor model says an H100 needs bytes out of the FP8 path to
meet DESIGN.md section 7's targets, and two of its largest memory-bound passes read a GEMM's
bf16 output only to cast it:
- fc's forward writes the bf16 pre-activation, and the GELU cast reads it to write fcproj's
  E4M3 x and x^T (4 bytes an element in, 2 out, beside the GEMM's 2). With GELU_AUX_BIAS and an
  E4M3 D under the activation's delayed scale, the GEMM would write x's codes and the bf16
  pre-activation (its aux, which the backward reads), leaving a byte transpose for x^T;
- fcproj's dgrad writes bf16, and fc's dy pass reads it with the pre-activation to apply GELU's
  derivative and write E5M2 dy and dy^T. With DGELU and an E5M2 D under -fg delayed's scale, the
  GEMM would write dy's codes (the amax from AMAX_D), leaving the transpose and the bias
  gradient (DGELU_BGRAD, or a pass over the codes).
The cuBLAS documentation does not say which epilogues an FP8 D takes, so each case is put to
cublasLtMatmulAlgoGetHeuristic at d12's shape (B=64, T=1024), and each case it accepts is run
once at 256 x 256 x 256 on zeroed operands (that it launches and finishes; no numerics). The bf16-D
cases are the controls: the trainer runs them today (the -ge 2 DGELU, the GELU epilogue).

Usage: ./probe_epilogues (a GPU); prints one markdown table. dev/gpu_session.sh's first stage
puts it in env.txt and summary.txt. An attribute cuBLASLt refuses is a row of the table, not the
end of the probe. make test runs it under cudasim (test/test_trainer_cli.py), whose cuBLASLt has
no FP8 D: there the controls run and the FP8-D cases name the refused D scale pointer.
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "llmc/cuda_common.h"
#include "llmc/matmul.cuh"

typedef struct {
    const char* name;
    cudaDataType_t a_type, b_type, d_type;
    cublasLtEpilogue_t epilogue;
    bool aux, bias, amax_d, fast_accumulate;
} EpilogueCase;

// d12's fc: C = 768 in, 4C = 3072 out, BT = 65536 rows; the dgrad of fcproj has the same m, n, k
#define PROBE_M 3072
#define PROBE_N 65536
#define PROBE_K 768
#define PROBE_RUN_SIZE 256
// floats between the scale pointers: cuBLASLt refuses a scale pointer that is not 16-byte aligned
// (matmul.cuh: measured on an H200's cuBLASLt 13.1), and so does cudasim
#define PROBE_SLOT 4

static const EpilogueCase PROBE_CASES[] = {
    {"fc fwd: bf16 D, GELU_AUX_BIAS (control)", CUDA_R_8F_E4M3, CUDA_R_8F_E4M3, CUDA_R_16BF,
     CUBLASLT_EPILOGUE_GELU_AUX_BIAS, true, true, false, true},
    {"fc fwd: E4M3 D, GELU_BIAS", CUDA_R_8F_E4M3, CUDA_R_8F_E4M3, CUDA_R_8F_E4M3,
     CUBLASLT_EPILOGUE_GELU_BIAS, false, true, false, true},
    {"fc fwd: E4M3 D, GELU_AUX_BIAS, bf16 aux", CUDA_R_8F_E4M3, CUDA_R_8F_E4M3, CUDA_R_8F_E4M3,
     CUBLASLT_EPILOGUE_GELU_AUX_BIAS, true, true, false, true},
    {"fc fwd: E4M3 D, GELU_AUX_BIAS, bf16 aux, amax D", CUDA_R_8F_E4M3, CUDA_R_8F_E4M3, CUDA_R_8F_E4M3,
     CUBLASLT_EPILOGUE_GELU_AUX_BIAS, true, true, true, true},
    {"fcproj dgrad: bf16 D, DGELU (control, -ge 2)", CUDA_R_8F_E4M3, CUDA_R_8F_E5M2, CUDA_R_16BF,
     CUBLASLT_EPILOGUE_DGELU, true, false, false, false},
    {"fcproj dgrad: E5M2 D, DGELU", CUDA_R_8F_E4M3, CUDA_R_8F_E5M2, CUDA_R_8F_E5M2,
     CUBLASLT_EPILOGUE_DGELU, true, false, false, false},
    {"fcproj dgrad: E5M2 D, DGELU, amax D", CUDA_R_8F_E4M3, CUDA_R_8F_E5M2, CUDA_R_8F_E5M2,
     CUBLASLT_EPILOGUE_DGELU, true, false, true, false},
    {"fcproj dgrad: E5M2 D, DGELU_BGRAD, amax D", CUDA_R_8F_E4M3, CUDA_R_8F_E5M2, CUDA_R_8F_E5M2,
     CUBLASLT_EPILOGUE_DGELU_BGRAD, true, true, true, false},
};
#define PROBE_NUM_CASES ((int)(sizeof(PROBE_CASES) / sizeof(PROBE_CASES[0])))

// device memory every case points into: operands and outputs of the run, scales, amax, bias
typedef struct {
    void *a, *b, *d, *c, *aux, *bias;
    float *scales;  // a, b, d scales (1.0) and the amax slot, 16 bytes apart (PROBE_SLOT)
} ProbeBuffers;

static bool is_fp8(cudaDataType_t type) { return type == CUDA_R_8F_E4M3 || type == CUDA_R_8F_E5M2; }

/*
The descriptor and layouts of one case at m x n x k (row-major view as in matmul.cuh: D [n][m]).
An attribute cuBLASLt refuses is not fatal here: status and refused name it, and the table says so.
*/
typedef struct {
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t a, b, c, d;
    cublasStatus_t status;  // the first refused attribute's status (else success)
    const char* refused;    // its name
} ProbePlan;

static void probe_set(ProbePlan* plan, cublasLtMatmulDescAttributes_t attribute, const char* name, const void* value,
                      size_t bytes) {
    if (plan->status != CUBLAS_STATUS_SUCCESS) { return; }
    plan->status = cublasLtMatmulDescSetAttribute(plan->desc, attribute, value, bytes);
    if (plan->status != CUBLAS_STATUS_SUCCESS) { plan->refused = name; }
}
#define PROBE_SET(plan, attribute, value) probe_set(plan, attribute, #attribute, &(value), sizeof(value))

static ProbePlan probe_plan(const EpilogueCase* p, const ProbeBuffers* buf, int m, int n, int k) {
    ProbePlan plan;
    plan.status = CUBLAS_STATUS_SUCCESS;
    plan.refused = NULL;
    cublasCheck(cublasLtMatmulDescCreate(&plan.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t transpose = CUBLAS_OP_T, none = CUBLAS_OP_N;
    PROBE_SET(&plan, CUBLASLT_MATMUL_DESC_TRANSA, transpose);
    PROBE_SET(&plan, CUBLASLT_MATMUL_DESC_TRANSB, none);
    PROBE_SET(&plan, CUBLASLT_MATMUL_DESC_EPILOGUE, p->epilogue);
    float* a_scale = buf->scales;
    float* b_scale = buf->scales + PROBE_SLOT;
    float* d_scale = buf->scales + 2 * PROBE_SLOT;
    float* amax = buf->scales + 3 * PROBE_SLOT;
    PROBE_SET(&plan, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, a_scale);
    PROBE_SET(&plan, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, b_scale);
    if (is_fp8(p->d_type)) { PROBE_SET(&plan, CUBLASLT_MATMUL_DESC_D_SCALE_POINTER, d_scale); }
    if (p->amax_d) { PROBE_SET(&plan, CUBLASLT_MATMUL_DESC_AMAX_D_POINTER, amax); }
    if (p->fast_accumulate) {
        int8_t fast = 1;
        PROBE_SET(&plan, CUBLASLT_MATMUL_DESC_FAST_ACCUM, fast);
    }
    if (p->bias) {  // a bias (forward) or the bias gradient it writes (BGRAD), bf16
        int32_t bias_type = CUDA_R_16BF;
        PROBE_SET(&plan, CUBLASLT_MATMUL_DESC_BIAS_POINTER, buf->bias);
        PROBE_SET(&plan, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, bias_type);
    }
    if (p->aux) {  // the pre-activation, bf16 [n][m]: written by GELU_AUX, read by DGELU
        int64_t aux_ld = m;
        int32_t aux_type = CUDA_R_16BF;
        PROBE_SET(&plan, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, buf->aux);
        PROBE_SET(&plan, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, aux_ld);
        PROBE_SET(&plan, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, aux_type);
    }
    cublasCheck(cublasLtMatrixLayoutCreate(&plan.a, p->a_type, k, m, k));
    cublasCheck(cublasLtMatrixLayoutCreate(&plan.b, p->b_type, k, n, k));
    // an FP8 D takes a bf16 C (cuBLAS docs' FP8 type table); beta = 0, so C is never read
    cublasCheck(cublasLtMatrixLayoutCreate(&plan.c, is_fp8(p->d_type) ? CUDA_R_16BF : p->d_type, m, n, m));
    cublasCheck(cublasLtMatrixLayoutCreate(&plan.d, p->d_type, m, n, m));
    return plan;
}

static void probe_plan_destroy(ProbePlan* plan) {
    cublasCheck(cublasLtMatrixLayoutDestroy(plan->a));
    cublasCheck(cublasLtMatrixLayoutDestroy(plan->b));
    cublasCheck(cublasLtMatrixLayoutDestroy(plan->c));
    cublasCheck(cublasLtMatrixLayoutDestroy(plan->d));
    cublasCheck(cublasLtMatmulDescDestroy(plan->desc));
}

// the heuristic's first algorithm for the plan; its status (found 0: none)
static cublasStatus_t probe_heuristic(const ProbePlan* plan, cublasLtMatmulHeuristicResult_t* result, int* found) {
    *found = 0;
    if (plan->status != CUBLAS_STATUS_SUCCESS) { return plan->status; }
    cublasLtMatmulPreference_t preference;
    cublasCheck(cublasLtMatmulPreferenceCreate(&preference));
    uint64_t workspace_bytes = MATMUL_WORKSPACE_BYTES;
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                     &workspace_bytes, sizeof(workspace_bytes)));
    cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(matmul_cublaslt_handle, plan->desc, plan->a, plan->b, plan->c,
                                                           plan->d, preference, 1, result, found);
    cublasCheck(cublasLtMatmulPreferenceDestroy(preference));
    return status;
}

int main(int argc, char** argv) {
    if (argc > 1) {
        bool help = strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0;
        printf("usage: ./probe_epilogues (no flags): which FP8-output GELU epilogues this GPU's cuBLASLt has "
               "(dev/bench/probe_epilogues.cu)\n");
        if (!help) { llm8_die("probe_epilogues: unknown argument '%s' (it takes none)", argv[1]); }
        return 0;
    }
    cuda_device_count_or_die();
    matmul_setup();
    const size_t run = PROBE_RUN_SIZE;
    ProbeBuffers buf;
    void** operands[5] = {&buf.a, &buf.b, &buf.d, &buf.c, &buf.aux};
    for (int i = 0; i < 5; i++) {  // 2 bytes an element holds any of the types
        *operands[i] = cuda_malloc_checked(run * run * 2, "probe operand");
        cudaCheck(cudaMemset(*operands[i], 0, run * run * 2));
    }
    buf.bias = cuda_malloc_checked(run * 2, "probe bias");
    cudaCheck(cudaMemset(buf.bias, 0, run * 2));
    float scales[4 * PROBE_SLOT] = {};
    for (int i = 0; i < 3; i++) { scales[i * PROBE_SLOT] = 1.0f; }
    const float amax_unwritten = -1.0f;  // the amax slot starts below any amax: a written one is >= 0
    scales[3 * PROBE_SLOT] = amax_unwritten;
    buf.scales = (float*)cuda_malloc_checked(sizeof(scales), "probe scales");
    cudaCheck(cudaMemcpy(buf.scales, scales, sizeof(scales), cudaMemcpyHostToDevice));

    int device = 0;
    cudaDeviceProp prop;
    cudaCheck(cudaGetDevice(&device));
    cudaCheck(cudaGetDeviceProperties(&prop, device));
    printf("## cuBLASLt FP8 GEMMs with FP8 outputs through GELU epilogues (%s, cuBLASLt %zu)\n\n", prop.name,
           cublasLtGetVersion());
    printf("Heuristic at m=%d n=%d k=%d (d12's fc forward and fcproj dgrad, B=64); run once at %d^3 on zeros.\n\n",
           PROBE_M, PROBE_N, PROBE_K, PROBE_RUN_SIZE);
    printf("| case | heuristic | run | amax D written |\n|---|---|---|---|\n");
    for (int i = 0; i < PROBE_NUM_CASES; i++) {
        const EpilogueCase* p = &PROBE_CASES[i];
        ProbePlan plan = probe_plan(p, &buf, PROBE_M, PROBE_N, PROBE_K);
        cublasLtMatmulHeuristicResult_t result;
        int found = 0;
        cublasStatus_t status = probe_heuristic(&plan, &result, &found);
        probe_plan_destroy(&plan);
        char heuristic[160], ran[64] = "-", amax_written[16] = "-";
        if (plan.refused != NULL) {
            snprintf(heuristic, sizeof(heuristic), "%s refused: %s", plan.refused, cublasGetStatusName(status));
        } else {
            snprintf(heuristic, sizeof(heuristic), "%s", status == CUBLAS_STATUS_SUCCESS && found > 0 ? "yes"
                                                         : status == CUBLAS_STATUS_SUCCESS ? "no algorithm"
                                                         : cublasGetStatusName(status));
        }
        if (status == CUBLAS_STATUS_SUCCESS && found > 0) {
            plan = probe_plan(p, &buf, PROBE_RUN_SIZE, PROBE_RUN_SIZE, PROBE_RUN_SIZE);
            status = probe_heuristic(&plan, &result, &found);
            if (status == CUBLAS_STATUS_SUCCESS && found > 0) {
                const float alpha = 1.0f, beta = 0.0f;
                cudaCheck(cudaMemcpy(buf.scales + 3 * PROBE_SLOT, &amax_unwritten, sizeof(float), cudaMemcpyHostToDevice));
                status = cublasLtMatmul(matmul_cublaslt_handle, plan.desc, &alpha, buf.a, plan.a, buf.b, plan.b, &beta,
                                        buf.c, plan.c, buf.d, plan.d, &result.algo, matmul_cublaslt_workspace,
                                        MATMUL_WORKSPACE_BYTES, 0);
                cudaError_t finished = cudaDeviceSynchronize();
                snprintf(ran, sizeof(ran), "%s", status != CUBLAS_STATUS_SUCCESS ? cublasGetStatusName(status)
                                                 : finished != cudaSuccess ? cudaGetErrorName(finished) : "yes");
                if (finished != cudaSuccess) {  // the context is lost: the rest cannot be asked
                    printf("| %s | %s | %s | - |\n", p->name, heuristic, ran);
                    llm8_die("probe_epilogues: case '%s' failed on the GPU (%s); the cases after it were not probed",
                             p->name, cudaGetErrorName(finished));
                }
                if (p->amax_d && status == CUBLAS_STATUS_SUCCESS) {
                    float amax = amax_unwritten;
                    cudaCheck(cudaMemcpy(&amax, buf.scales + 3 * PROBE_SLOT, sizeof(float), cudaMemcpyDeviceToHost));
                    snprintf(amax_written, sizeof(amax_written), "%s", amax >= 0.0f ? "yes" : "no");
                }
            } else {
                snprintf(ran, sizeof(ran), "no algorithm at %d^3", PROBE_RUN_SIZE);
            }
            probe_plan_destroy(&plan);
        }
        printf("| %s | %s | %s | %s |\n", p->name, heuristic, ran, amax_written);
    }
    matmul_teardown();
    return 0;
}
