/*
probe_epilogues.cu: whether this GPU's cuBLASLt has FP8 GEMMs that write FP8 codes, or a bf16
output's amax, through a GELU epilogue: the fusions that would take bytes out of llm8's FP8
path. It asks, it does not time: the answer decides whether building them is worth a session.

Why these: doc/performance.md's floor model says an H100 needs bytes out of the FP8 path to
meet DESIGN.md section 7's targets, and three of its largest memory-bound passes read a GEMM's
bf16 output only to cast it:
- fc's forward writes the bf16 pre-activation, and the GELU cast reads it to write fcproj's
  E4M3 x and x^T (2 bytes an element in, 2 out, beside the GEMM's 2). With GELU_AUX_BIAS and an
  E4M3 D under the activation's delayed scale, the GEMM would write x's codes and the
  pre-activation (its aux, which the backward reads), leaving a byte transpose for x^T;
- fcproj's dgrad writes bf16, and fc's dy pass reads it with the pre-activation to apply GELU's
  derivative and write E5M2 dy and dy^T. With DGELU and an E5M2 D under -fg delayed's scale, the
  GEMM would write dy's codes (the amax from AMAX_D), leaving the transpose and the bias
  gradient (DGELU_BGRAD, or a pass over the codes).
- under the default -fg current, fc's dy needs its amax before any code is written, so today a
  first pass reads fcproj's bf16 dgrad and the pre-activation for GELU's derivative, the bias
  partials and the amax, writing dy (6 bytes an element), and the cast reads dy again (4). With
  -ge 2's DGELU, a bf16 D and AMAX_D, the GEMM would write dy and its amax, and one cast pass
  would read it for the codes, dy^T and the bias partials: 8 bytes an element in all instead of
  12 (-ge 1) or 10 (-ge 2 today). DESIGN.md section 3 says CUDA 13 refuses an amax pointer with a
  bf16 D (cublasLt.h names no D type for AMAX_D): these two rows expect a "no" and check it.
cublasLt.h allows an E4M3 or fp16 aux with an E4M3 D "with some restrictions" and says no more
(nothing on bf16, on DGELU's aux with an E5M2 D, on the bias types), so each case is put to
cublasLtMatmulAlgoGetHeuristic at d12's shape (B=64, T=1024) with the trainer's preferences, and
each case it accepts is run once at 256 x 256 x 256 on zeroed operands (that it launches and
finishes: some refusals come only from cublasLtMatmul; no numerics). The bf16-D cases are the
controls, as the trainer runs them today (the FP8 fc forward with its bias, -ge 2's DGELU).
A "yes" for DGELU_BGRAD is a bias gradient cuBLASLt writes (not accumulates) in its own order,
not llm8's fixed one (matmul.cuh): using it would change how the bias gradient is summed.

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

/*
One case: fc's forward (E4M3 x E4M3, fast accumulation) or fcproj's dgrad (E4M3 W^T x E5M2 dy),
its D, C, aux and bias types (PROBE_UNSET: the attribute left at cuBLASLt's default, as the
trainer leaves it), and whether it asks for D's amax. cublasLt.h: "for fp8 kernels with output
type CUDA_R_8F_E4M3 the aux data type can be CUDA_R_8F_E4M3 or CUDA_R_16F", bf16 not named; an
FP8 D takes a bf16 or fp16 C; hence the fp16 and E4M3 variants beside the bf16 the trainer keeps
its pre-activation in.
*/
#define PROBE_UNSET ((cudaDataType_t)-1)
typedef struct {
    const char* name;
    bool forward;
    cublasLtEpilogue_t epilogue;
    cudaDataType_t d_type, c_type, aux_type, bias_type;
    bool amax_d;
} EpilogueCase;

// d12's fc: C = 768 in, 4C = 3072 out, BT = 65536 rows; the dgrad of fcproj has the same m, n, k
#define PROBE_M 3072
#define PROBE_N 65536
#define PROBE_K 768
#define PROBE_RUN_SIZE 256
// floats between the scale pointers: cuBLASLt refuses a scale pointer that is not 16-byte aligned
// (matmul.cuh: measured on an H200's cuBLASLt 13.1), and so does cudasim
#define PROBE_SLOT 4

#define BF16 CUDA_R_16BF
#define F16 CUDA_R_16F
#define E4M3 CUDA_R_8F_E4M3
#define E5M2 CUDA_R_8F_E5M2
static const EpilogueCase PROBE_CASES[] = {
    {"fc fwd: bf16 D, BIAS (control: the trainer's)", true, CUBLASLT_EPILOGUE_BIAS, BF16, BF16, PROBE_UNSET, PROBE_UNSET, false},
    {"fc fwd: E4M3 D, GELU_BIAS, amax", true, CUBLASLT_EPILOGUE_GELU_BIAS, E4M3, BF16, PROBE_UNSET, BF16, true},
    {"fc fwd: E4M3 D, GELU_AUX_BIAS, bf16 aux, amax", true, CUBLASLT_EPILOGUE_GELU_AUX_BIAS, E4M3, BF16, BF16, BF16, true},
    {"fc fwd: E4M3 D, GELU_AUX_BIAS, fp16 aux, amax", true, CUBLASLT_EPILOGUE_GELU_AUX_BIAS, E4M3, BF16, F16, BF16, true},
    {"fc fwd: E4M3 D, GELU_AUX_BIAS, fp16 aux, C and bias, amax", true, CUBLASLT_EPILOGUE_GELU_AUX_BIAS, E4M3, F16, F16, F16, true},
    {"fc fwd: E4M3 D, GELU_AUX_BIAS, E4M3 aux, amax", true, CUBLASLT_EPILOGUE_GELU_AUX_BIAS, E4M3, BF16, E4M3, BF16, true},
    {"fcproj dgrad: bf16 D, DGELU (control: -ge 2)", false, CUBLASLT_EPILOGUE_DGELU, BF16, BF16, PROBE_UNSET, PROBE_UNSET, false},
    {"fcproj dgrad: bf16 D, DGELU, amax (-fg current)", false, CUBLASLT_EPILOGUE_DGELU, BF16, BF16, PROBE_UNSET, PROBE_UNSET, true},
    {"fcproj dgrad: bf16 D, DGELU_BGRAD, bf16 bias, amax (-fg current)", false, CUBLASLT_EPILOGUE_DGELU_BGRAD, BF16, BF16, PROBE_UNSET, BF16, true},
    {"fcproj dgrad: E5M2 D, DGELU, bf16 aux", false, CUBLASLT_EPILOGUE_DGELU, E5M2, BF16, BF16, PROBE_UNSET, false},
    {"fcproj dgrad: E5M2 D, DGELU, bf16 aux, amax", false, CUBLASLT_EPILOGUE_DGELU, E5M2, BF16, BF16, PROBE_UNSET, true},
    {"fcproj dgrad: E5M2 D, DGELU, fp16 aux and C, amax", false, CUBLASLT_EPILOGUE_DGELU, E5M2, F16, F16, PROBE_UNSET, true},
    {"fcproj dgrad: E5M2 D, DGELU_BGRAD, bf16 aux and bias, amax", false, CUBLASLT_EPILOGUE_DGELU_BGRAD, E5M2, BF16, BF16, BF16, true},
    {"fcproj dgrad: E5M2 D, DGELU_BGRAD, fp16 aux, C and bias, amax", false, CUBLASLT_EPILOGUE_DGELU_BGRAD, E5M2, F16, F16, F16, true},
};
#undef BF16
#undef F16
#undef E4M3
#undef E5M2
#define PROBE_NUM_CASES ((int)(sizeof(PROBE_CASES) / sizeof(PROBE_CASES[0])))

// device memory every case points into: operands and outputs of the run, scales, amax, bias
typedef struct {
    void *a, *b, *d, *c, *aux, *bias;
    float *scales;  // a, b, d, aux scales (1.0) and the amax slot, 16 bytes apart (PROBE_SLOT)
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

static bool epilogue_has_aux(cublasLtEpilogue_t epilogue) {
    return epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS || epilogue == CUBLASLT_EPILOGUE_DGELU
        || epilogue == CUBLASLT_EPILOGUE_DGELU_BGRAD;
}
static bool epilogue_has_bias(cublasLtEpilogue_t epilogue) {  // a bias (forward) or the bias gradient it writes
    return epilogue == CUBLASLT_EPILOGUE_BIAS || epilogue == CUBLASLT_EPILOGUE_GELU_BIAS
        || epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS || epilogue == CUBLASLT_EPILOGUE_DGELU_BGRAD;
}

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
    float* aux_scale = buf->scales + 3 * PROBE_SLOT;
    float* amax = buf->scales + 4 * PROBE_SLOT;
    PROBE_SET(&plan, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, a_scale);
    PROBE_SET(&plan, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, b_scale);
    if (is_fp8(p->d_type)) { PROBE_SET(&plan, CUBLASLT_MATMUL_DESC_D_SCALE_POINTER, d_scale); }
    if (p->amax_d) { PROBE_SET(&plan, CUBLASLT_MATMUL_DESC_AMAX_D_POINTER, amax); }
    if (p->forward) {
        int8_t fast = 1;
        PROBE_SET(&plan, CUBLASLT_MATMUL_DESC_FAST_ACCUM, fast);
    }
    if (epilogue_has_bias(p->epilogue)) {
        PROBE_SET(&plan, CUBLASLT_MATMUL_DESC_BIAS_POINTER, buf->bias);
        if (p->bias_type != PROBE_UNSET) {
            int32_t bias_type = p->bias_type;
            PROBE_SET(&plan, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, bias_type);
        }
    }
    if (epilogue_has_aux(p->epilogue)) {  // the pre-activation [n][m]: written by GELU_AUX, read by DGELU
        int64_t aux_ld = m;
        PROBE_SET(&plan, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, buf->aux);
        PROBE_SET(&plan, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, aux_ld);
        if (p->aux_type != PROBE_UNSET) {
            int32_t aux_type = p->aux_type;
            PROBE_SET(&plan, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, aux_type);
        }
        if (is_fp8(p->aux_type)) { PROBE_SET(&plan, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_SCALE_POINTER, aux_scale); }
    }
    cudaDataType_t b_type = p->forward ? CUDA_R_8F_E4M3 : CUDA_R_8F_E5M2;  // x, or dy
    cublasCheck(cublasLtMatrixLayoutCreate(&plan.a, CUDA_R_8F_E4M3, k, m, k));  // W, or W^T
    cublasCheck(cublasLtMatrixLayoutCreate(&plan.b, b_type, k, n, k));
    cublasCheck(cublasLtMatrixLayoutCreate(&plan.c, p->c_type, m, n, m));  // beta = 0: C is never read
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

// the heuristic's first algorithm for the plan, under the trainer's preferences (matmul.cuh); its
// status (found 0: none)
static cublasStatus_t probe_heuristic(const ProbePlan* plan, const ProbeBuffers* buf,
                                      cublasLtMatmulHeuristicResult_t* result, int* found) {
    *found = 0;
    if (plan->status != CUBLAS_STATUS_SUCCESS) { return plan->status; }
    cublasLtMatmulPreference_t preference = matmul_preference_create(buf->a, buf->b, buf->c, buf->d);
    cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(matmul_cublaslt_handle, plan->desc, plan->a, plan->b, plan->c,
                                                           plan->d, preference, 1, result, found);
    cublasCheck(cublasLtMatmulPreferenceDestroy(preference));
    return status;
}

int main(int argc, char** argv) {
    if (argc > 1) {
        bool help = strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0;
        printf("usage: ./probe_epilogues (no flags): which FP8 GELU epilogues (FP8 outputs, bf16 with amax) this GPU's cuBLASLt has "
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
    float scales[5 * PROBE_SLOT] = {};
    for (int i = 0; i < 4; i++) { scales[i * PROBE_SLOT] = 1.0f; }
    const float amax_unwritten = -1.0f;  // the amax slot starts below any amax: a written one is >= 0
    scales[4 * PROBE_SLOT] = amax_unwritten;
    buf.scales = (float*)cuda_malloc_checked(sizeof(scales), "probe scales");
    cudaCheck(cudaMemcpy(buf.scales, scales, sizeof(scales), cudaMemcpyHostToDevice));

    int device = 0;
    cudaDeviceProp prop;
    cudaCheck(cudaGetDevice(&device));
    cudaCheck(cudaGetDeviceProperties(&prop, device));
    printf("## cuBLASLt FP8 GEMMs through GELU epilogues: FP8 outputs, bf16 with amax (%s, cuBLASLt %zu)\n\n", prop.name,
           cublasLtGetVersion());
    printf("Heuristic at m=%d n=%d k=%d (d12's fc forward and fcproj dgrad, B=64); run once at %d^3 on zeros.\n\n",
           PROBE_M, PROBE_N, PROBE_K, PROBE_RUN_SIZE);
    printf("| case | heuristic | run | amax D written |\n|---|---|---|---|\n");
    for (int i = 0; i < PROBE_NUM_CASES; i++) {
        const EpilogueCase* p = &PROBE_CASES[i];
        ProbePlan plan = probe_plan(p, &buf, PROBE_M, PROBE_N, PROBE_K);
        cublasLtMatmulHeuristicResult_t result;
        int found = 0;
        cublasStatus_t status = probe_heuristic(&plan, &buf, &result, &found);
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
            status = probe_heuristic(&plan, &buf, &result, &found);
            if (status == CUBLAS_STATUS_SUCCESS && found > 0) {
                const float alpha = 1.0f, beta = 0.0f;
                cudaCheck(cudaMemcpy(buf.scales + 4 * PROBE_SLOT, &amax_unwritten, sizeof(float), cudaMemcpyHostToDevice));
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
                    cudaCheck(cudaMemcpy(&amax, buf.scales + 4 * PROBE_SLOT, sizeof(float), cudaMemcpyDeviceToHost));
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
