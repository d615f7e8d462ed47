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
appends it to summary.txt.
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
    float *scales;  // a, b, d scales (1.0) and the amax slot
} ProbeBuffers;

static bool is_fp8(cudaDataType_t type) { return type == CUDA_R_8F_E4M3 || type == CUDA_R_8F_E5M2; }

// the descriptor and layouts of one case at m x n x k (row-major view as in matmul.cuh: D [n][m])
typedef struct {
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t a, b, c, d;
} ProbePlan;

static ProbePlan probe_plan(const EpilogueCase* p, const ProbeBuffers* buf, int m, int n, int k) {
    ProbePlan plan;
    cublasCheck(cublasLtMatmulDescCreate(&plan.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t transpose = CUBLAS_OP_T, none = CUBLAS_OP_N;
    matmul_desc_set(plan.desc, CUBLASLT_MATMUL_DESC_TRANSA, &transpose, sizeof(transpose));
    matmul_desc_set(plan.desc, CUBLASLT_MATMUL_DESC_TRANSB, &none, sizeof(none));
    matmul_desc_set(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &p->epilogue, sizeof(p->epilogue));
    float* a_scale = buf->scales;
    float* b_scale = buf->scales + 1;
    float* d_scale = buf->scales + 2;
    float* amax = buf->scales + 3;
    matmul_desc_set(plan.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &a_scale, sizeof(a_scale));
    matmul_desc_set(plan.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &b_scale, sizeof(b_scale));
    if (is_fp8(p->d_type)) { matmul_desc_set(plan.desc, CUBLASLT_MATMUL_DESC_D_SCALE_POINTER, &d_scale, sizeof(d_scale)); }
    if (p->amax_d) { matmul_desc_set(plan.desc, CUBLASLT_MATMUL_DESC_AMAX_D_POINTER, &amax, sizeof(amax)); }
    if (p->fast_accumulate) {
        int8_t fast = 1;
        matmul_desc_set(plan.desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof(fast));
    }
    if (p->bias) {  // a bias (forward) or the bias gradient it writes (BGRAD), bf16
        int32_t bias_type = CUDA_R_16BF;
        matmul_desc_set(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &buf->bias, sizeof(buf->bias));
        matmul_desc_set(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof(bias_type));
    }
    if (p->aux) {  // the pre-activation, bf16 [n][m]: written by GELU_AUX, read by DGELU
        int64_t aux_ld = m;
        int32_t aux_type = CUDA_R_16BF;
        matmul_desc_set(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &buf->aux, sizeof(buf->aux));
        matmul_desc_set(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld, sizeof(aux_ld));
        matmul_desc_set(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, &aux_type, sizeof(aux_type));
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
    cublasLtMatmulPreference_t preference;
    cublasCheck(cublasLtMatmulPreferenceCreate(&preference));
    uint64_t workspace_bytes = MATMUL_WORKSPACE_BYTES;
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                     &workspace_bytes, sizeof(workspace_bytes)));
    *found = 0;
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
    buf.scales = (float*)cuda_malloc_checked(4 * sizeof(float), "probe scales");
    const float scales[4] = {1.0f, 1.0f, 1.0f, -1.0f};  // the amax slot starts at -1: a written amax is >= 0
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
        char heuristic[64], ran[64] = "-", amax_written[16] = "-";
        snprintf(heuristic, sizeof(heuristic), "%s", status == CUBLAS_STATUS_SUCCESS && found > 0 ? "yes"
                                                     : status == CUBLAS_STATUS_SUCCESS ? "no algorithm"
                                                     : cublasGetStatusName(status));
        if (status == CUBLAS_STATUS_SUCCESS && found > 0) {
            plan = probe_plan(p, &buf, PROBE_RUN_SIZE, PROBE_RUN_SIZE, PROBE_RUN_SIZE);
            status = probe_heuristic(&plan, &result, &found);
            if (status == CUBLAS_STATUS_SUCCESS && found > 0) {
                const float alpha = 1.0f, beta = 0.0f;
                cudaCheck(cudaMemcpy(buf.scales + 3, &scales[3], sizeof(float), cudaMemcpyHostToDevice));
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
                    float amax = -1.0f;
                    cudaCheck(cudaMemcpy(&amax, buf.scales + 3, sizeof(float), cudaMemcpyDeviceToHost));
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
