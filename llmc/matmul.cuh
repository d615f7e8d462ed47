/*
matmul.cuh: every GEMM of the model through cuBLASLt, plus the deterministic bias gradient.

Why it is shaped so: one general entry point, matmul_cublaslt(MatmulSpec), takes the data
types, the transposes, the accumulate flag, the epilogue and the FP8 scale pointers, and
builds the cuBLASLt call from them. The BF16 launchers (matmul_forward, matmul_backward) are
thin row-major views of it, and the FP8 GEMMs slot in as further specs (E4M3/E5M2 operands,
scale pointers, fast accumulation) without a second cuBLASLt code path.

Row-major to cuBLASLt: cuBLASLt is column-major, and a row-major [rows][cols] matrix is the
column-major cols x rows matrix with the same bytes. So for y[N][OC] = x[N][C] W[OC][C]^T,
cuBLASLt computes y^T (OC x N) = op(W) (OC x C) * x^T (C x N) with W transposed: both operands
contiguous along K, the "TN" layout that FP8 requires.

Numerics and determinism:
- COMPUTE_32F, fp32 alpha/beta; bias and the GELU epilogue are applied in fp32 before the one
  rounding to bf16. The GELU epilogue is cuBLASLt's tanh approximation (GPT-2's).
- The weight gradients' += (beta = 1, C = D): on an H200 (cuBLASLt 13.1) the fp32 sum was
  rounded to D's type before C was added, so a bf16 gradient is rounded twice per
  accumulation (on exact test data that changed 10% of an FP8 wgrad's elements, and every
  element was one of the two roundings: test/bf16_accumulate.h). An fp32 D stays exact.
  llm.c accumulates the same way; it adds at most half a bf16 step of the sum to each
  accumulation.
- Split-K is allowed only with fp32 partials reduced in a separate step (reduction scheme
  COMPUTE_TYPE): the in-place and output-type schemes would round partial sums to bf16.
  Every cuBLASLt scheme is run-to-run deterministic for a fixed algorithm, and the algorithm
  is a pure function of the problem (cublasLtMatmulAlgoGetHeuristic, first result).
- The bias gradient is ours, not an epilogue's: fixed chunks of rows are summed in a fixed
  order into fp32 partials (dbias_scratch), then each column sums its partials in order.
- dgrad through GELU (matmul_backward's and matmul_backward_fp8's pre_gelu, the trainer's
  -ge 2, llm.c's flag) is cuBLASLt's DGELU epilogue: the fp32 dgrad times gelu'(pre_gelu),
  rounded once. It reads pre_gelu inside the GEMM instead of a kernel's extra pass over the
  bf16 dgrad (read dinp and pre_gelu, write dinp). Its derivative is cuBLASLt's formula, not
  element_math.h's gelu_backward_element, which the reference and the unfused path (-ge 0 and 1:
  gelu_backward_inplace, or the FP8 dout pass) use; tests bound the difference.
Checks: every dimension must be a multiple of 16 bytes' worth of elements (8 for bf16, 16 for
fp8) and every pointer 16-byte aligned; a violation is one clear line naming the GEMM.

FP8 (DESIGN.md section 3): the three GEMMs of a linear all run TN from codes the casts wrote
(fp8_cast.cuh): forward x . W^T from x and W; dgrad from dy and W^T; wgrad from x^T and dy^T.
The A/B scale pointers take the casts' dequantization scales (1/scale: per tensor the
Fp8CastRecord's scale_inv; the block recipe's VEC128 and BLK128x128 arrays, cuBLASLt 13's
CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F / _BLK128x128_32F). D stays bf16 (CUDA 13 refuses a
D scale or amax pointer with a bf16 D, so no amax comes out of a bf16-output GEMM), but for
-fe 1's fc forward (matmul_forward_fp8_gelu_codes): an E4M3 D through GELU_AUX_BIAS, under a
D scale, with its amax (AMAX_D) and the bf16 pre-activation as the aux; wgrad accumulates
with beta = 1 into the bf16 gradient or an fp32 buffer. Fast accumulation only in the
per-tensor forward. The dgrad of fcproj through GELU and the bias gradient move into the
pass that reads dy anyway (matmul_backward_fp8_dout): current scaling's amax pass, or the one
tile-cast pass of a known scale (-fg delayed, the block recipe, lm_head's bound); for attproj
and fcproj under current scaling the trainer has layernorm backward, which writes their dy,
take the bias sums and the amax instead (FP8_DOUT_AMAX_RECORDED). dgrad and
wgrad are FP8 or bf16 each on its own: the cast writes only the codes an FP8 GEMM reads,
and matmul_backward runs the bf16 one alone (NULL for the other's output).
*/
#ifndef LLMC_MATMUL_CUH
#define LLMC_MATMUL_CUH

#include <stdint.h>
#include <cublasLt.h>
#include "cuda_common.h"
#include "gelu.cuh"
#include "fp8_cast.cuh"

// ----------------------------------------------------------------------------
// cuBLASLt state and errors

#define MATMUL_WORKSPACE_BYTES ((size_t)32 * 1024 * 1024)

static cublasLtHandle_t matmul_cublaslt_handle = NULL;
static void* matmul_cublaslt_workspace = NULL;

static inline void cublas_check(cublasStatus_t status, const char* file, int line) {
    if (status != CUBLAS_STATUS_SUCCESS) {
        llm8_die("cuBLAS error %s: %s (%s:%d)", cublasGetStatusName(status), cublasGetStatusString(status), file, line);
    }
}
#define cublasCheck(status) cublas_check((status), __FILE__, __LINE__)

void matmul_setup(void) {
    if (matmul_cublaslt_handle != NULL) { llm8_die("matmul_setup called twice without matmul_teardown"); }
    cublasCheck(cublasLtCreate(&matmul_cublaslt_handle));
    matmul_cublaslt_workspace = cuda_malloc_checked(MATMUL_WORKSPACE_BYTES, "the cuBLASLt workspace");
}

void matmul_teardown(void) {
    if (matmul_cublaslt_workspace != NULL) { cudaCheck(cudaFree(matmul_cublaslt_workspace)); }
    if (matmul_cublaslt_handle != NULL) { cublasCheck(cublasLtDestroy(matmul_cublaslt_handle)); }
    matmul_cublaslt_workspace = NULL;
    matmul_cublaslt_handle = NULL;
}

// ----------------------------------------------------------------------------
// the general GEMM

/*
One cuBLASLt GEMM in cuBLASLt's own (column-major) terms:
    D (m x n) = alpha_scales * op(A) (m x k) * op(B) (k x n)  [+ D if accumulate]  -> epilogue
A is stored m x k (k x m when transpose_a); B is stored k x n (n x k when transpose_b); D is
m x n. All are packed (leading dimension = stored rows). bias [m] and aux [n][m] have D's type.
*/
typedef struct {
    const char* name;              // the GEMM in error messages, with how m, n, k map to the model's sizes
    int m, n, k;
    void* d;
    cudaDataType_t d_type;
    const void* a;
    cudaDataType_t a_type;
    bool transpose_a;
    const void* b;
    cudaDataType_t b_type;
    bool transpose_b;
    bool accumulate;               // D += op(A) op(B) (beta = 1) instead of D = op(A) op(B)
    cublasLtEpilogue_t epilogue;   // DEFAULT, BIAS, GELU_AUX, GELU_AUX_BIAS or DGELU
    const void* bias;              // for the BIAS epilogues
    void* aux;                     // GELU_AUX epilogues: receives the pre-activation; DGELU: reads it
    const float* a_scale;          // device scalar multiplying A (FP8 dequantization), or NULL
    const float* b_scale;          // device scalar multiplying B, or NULL
    bool fast_accumulate;          // FP8 forward only: no periodic promotion to fp32
    cublasLtMatmulMatrixScale_t a_scale_mode; // SCALAR_32F (0, the default), or the block recipe's
    cublasLtMatmulMatrixScale_t b_scale_mode; // VEC128_32F / BLK128x128_32F (a_scale/b_scale are then arrays)
    const float* d_scale;          // FP8 D only: device scalar multiplying the epilogue's result before its conversion
    float* d_amax;                 // FP8 D only: device float receiving max |epilogue result| (before d_scale), or NULL
} MatmulSpec;

static inline bool matmul_is_fp8_type(cudaDataType_t type) { return type == CUDA_R_8F_E4M3 || type == CUDA_R_8F_E5M2; }

static inline int cuda_data_type_bytes(cudaDataType_t type, const char* gemm_name) {
    switch (type) {
        case CUDA_R_32F: return 4;
        case CUDA_R_16BF: case CUDA_R_16F: return 2;
        case CUDA_R_8F_E4M3: case CUDA_R_8F_E5M2: return 1;
        default: llm8_die("matmul %s: unsupported cudaDataType_t %d", gemm_name, (int)type);
    }
    return 0;
}

static inline void matmul_check_aligned(const char* gemm_name, const char* what, const void* pointer) {
    if (((uintptr_t)pointer) % 16 != 0) {
        llm8_die("matmul %s: %s pointer %p is not 16-byte aligned (cuBLASLt and the vector kernels need it)",
                 gemm_name, what, pointer);
    }
}

static void matmul_check_spec(const MatmulSpec* spec) {
    int smallest_bytes = cuda_data_type_bytes(spec->a_type, spec->name);
    int b_bytes = cuda_data_type_bytes(spec->b_type, spec->name);
    int d_bytes = cuda_data_type_bytes(spec->d_type, spec->name);
    if (b_bytes < smallest_bytes) { smallest_bytes = b_bytes; }
    if (d_bytes < smallest_bytes) { smallest_bytes = d_bytes; }
    // every matrix is packed, so its leading dimension is its stored rows: m for D (and the aux), k or m
    // for A, k or n for B. Those must keep each column 16-byte aligned; the other dimension is free
    // (a bf16 GEMM takes any B*T, as llm.c's do). FP8 GEMMs need all three multiples of 16 (cuBLASLt's rule).
    bool fp8 = smallest_bytes == 1;
    int multiple = 16 / smallest_bytes;
    int a_leading = spec->transpose_a ? spec->k : spec->m;
    int b_leading = spec->transpose_b ? spec->n : spec->k;
    bool positive = spec->m > 0 && spec->n > 0 && spec->k > 0;
    bool aligned = fp8 ? spec->m % 16 == 0 && spec->n % 16 == 0 && spec->k % 16 == 0
                       : spec->m % multiple == 0 && a_leading % multiple == 0 && b_leading % multiple == 0;
    if (!positive || !aligned) {
        llm8_die("matmul %s: m=%d n=%d k=%d: %s must be a positive multiple of %d for cuBLASLt (%s)",
                 spec->name, spec->m, spec->n, spec->k, fp8 ? "each" : "m and the leading dimensions of A and B",
                 multiple, fp8 ? "FP8 GEMM dimensions" : "columns of packed 2-byte elements start 16-byte aligned");
    }
    matmul_check_aligned(spec->name, "A", spec->a);
    matmul_check_aligned(spec->name, "B", spec->b);
    matmul_check_aligned(spec->name, "D", spec->d);
    bool wants_bias = spec->epilogue == CUBLASLT_EPILOGUE_BIAS || spec->epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    bool wants_aux = spec->epilogue == CUBLASLT_EPILOGUE_GELU_AUX || spec->epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS
                  || spec->epilogue == CUBLASLT_EPILOGUE_DGELU;
    if (wants_bias != (spec->bias != NULL) || wants_aux != (spec->aux != NULL)) {
        llm8_die("matmul %s: epilogue %d does not match the bias/aux pointers given", spec->name, (int)spec->epilogue);
    }
    if (wants_bias) { matmul_check_aligned(spec->name, "bias", spec->bias); }
    if (wants_aux) { matmul_check_aligned(spec->name, "GELU pre-activation", spec->aux); }
    bool a_fp8 = matmul_is_fp8_type(spec->a_type), b_fp8 = matmul_is_fp8_type(spec->b_type);
    if (matmul_is_fp8_type(spec->d_type)) {  // matmul_forward_fp8_gelu_codes's GEMM: its bf16 aux stands in for C
        if (!a_fp8 || spec->aux == NULL || spec->d_scale == NULL || spec->accumulate) {
            llm8_die("matmul %s: an FP8 D needs FP8 operands, a GELU aux (bf16, C's stand-in), a D scale and no accumulation",
                     spec->name);
        }
        matmul_check_aligned(spec->name, "D scale", spec->d_scale);
        if (spec->d_amax != NULL) { matmul_check_aligned(spec->name, "D amax", spec->d_amax); }
    } else if (spec->d_scale != NULL || spec->d_amax != NULL) {
        llm8_die("matmul %s: a D scale or amax pointer needs an FP8 D (cuBLASLt refuses them with a bf16 D)", spec->name);
    }
    bool scalar = spec->a_scale_mode == CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F
               && spec->b_scale_mode == CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
    if (a_fp8 || b_fp8) {
        if (!(a_fp8 && b_fp8)) { llm8_die("matmul %s: FP8 needs both operands in FP8", spec->name); }
        if (spec->a_type == CUDA_R_8F_E5M2 && spec->b_type == CUDA_R_8F_E5M2) {
            llm8_die("matmul %s: E5M2 x E5M2 is not supported by cuBLASLt", spec->name);
        }
        if (!spec->transpose_a || spec->transpose_b) {
            llm8_die("matmul %s: FP8 needs both operands contiguous along K (the TN layout)", spec->name);
        }
        if (!scalar && spec->fast_accumulate) {
            llm8_die("matmul %s: block scaling takes no fast accumulation", spec->name);
        }
        if (!scalar) {  // cuBLAS docs, "128-element 1D and 128x128 2D Block Scaling For FP8 Data Types"
            const cublasLtMatmulMatrixScale_t vec = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
            const cublasLtMatmulMatrixScale_t blk = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
            bool a_block = spec->a_scale_mode == vec || spec->a_scale_mode == blk;
            bool b_block = spec->b_scale_mode == vec || spec->b_scale_mode == blk;
            if (!a_block || !b_block || (spec->a_scale_mode == blk && spec->b_scale_mode == blk)) {
                llm8_die("matmul %s: scale modes A=%d B=%d: cuBLASLt block scaling takes VEC128 x VEC128, "
                         "VEC128 x BLK128x128 or BLK128x128 x VEC128", spec->name, (int)spec->a_scale_mode,
                         (int)spec->b_scale_mode);
            }
            if (spec->a_scale == NULL || spec->b_scale == NULL) {
                llm8_die("matmul %s: block scaling needs both A and B scale arrays", spec->name);
            }
        }
        // block scale arrays: "must be 16B aligned" (cuBLAS docs); a per-tensor scale pointer too,
        // by measurement (Fp8CastRecord's comment): else the launch fails with NOT_SUPPORTED
        if (spec->a_scale != NULL) { matmul_check_aligned(spec->name, "A scale", spec->a_scale); }
        if (spec->b_scale != NULL) { matmul_check_aligned(spec->name, "B scale", spec->b_scale); }
    } else if (!scalar || spec->fast_accumulate || spec->a_scale != NULL || spec->b_scale != NULL) {
        llm8_die("matmul %s: scale pointers, scale modes and fast accumulation are for FP8 operands", spec->name);
    }
    if (matmul_cublaslt_handle == NULL) { llm8_die("matmul %s: called before matmul_setup", spec->name); }
}

// the largest power of two (16..256) dividing the address: cuBLASLt's heuristic assumes 256-byte
// aligned operands unless told otherwise, and per-layer slices of the parameter and activation
// buffers can be less aligned (e.g. C not a multiple of 128)
static inline uint32_t matmul_pointer_alignment(const void* pointer) {
    uint32_t alignment = 256;
    while (alignment > 16 && ((uintptr_t)pointer) % alignment != 0) { alignment /= 2; }
    return alignment;
}

static inline void matmul_desc_set(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attribute,
                                   const void* value, size_t bytes) {
    cublasCheck(cublasLtMatmulDescSetAttribute(desc, attribute, value, bytes));
}

// the heuristic's preferences for a GEMM on these operands: the workspace, split-K only with fp32
// partials, and the operands' alignments; the caller destroys it
static cublasLtMatmulPreference_t matmul_preference_create(const void* a, const void* b, const void* c, const void* d) {
    cublasLtMatmulPreference_t preference;
    cublasCheck(cublasLtMatmulPreferenceCreate(&preference));
    uint64_t workspace_bytes = MATMUL_WORKSPACE_BYTES;
    uint32_t reduction_schemes = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                     &workspace_bytes, sizeof(workspace_bytes)));
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
                                                     &reduction_schemes, sizeof(reduction_schemes)));
    const uint32_t alignments[4] = {matmul_pointer_alignment(a), matmul_pointer_alignment(b),
                                    matmul_pointer_alignment(c), matmul_pointer_alignment(d)};
    const cublasLtMatmulPreferenceAttributes_t alignment_attributes[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    for (int i = 0; i < 4; i++) {
        cublasCheck(cublasLtMatmulPreferenceSetAttribute(preference, alignment_attributes[i], &alignments[i],
                                                         sizeof(alignments[i])));
    }
    return preference;
}

// C: D itself (read only when accumulating); an FP8 D takes a bf16 C, for which its bf16 aux (the
// pre-activation, of D's shape) stands in: with beta = 0 C is never read
static inline const void* matmul_c(const MatmulSpec* spec) {
    return matmul_is_fp8_type(spec->d_type) ? spec->aux : spec->d;
}

/*
Which algorithm a GEMM runs: training always takes the heuristic's first (rank 0), a pure
function of the problem. dev/bench/bench_gemm.cu's --algorithms also times the next ones
the heuristic lists for the same problem (matmul_cublaslt_ranked), to measure how far the
first is from the fastest this cuBLASLt has for the model's shapes.
*/
#define MATMUL_MAX_ALGORITHMS 16

// the cuBLASLt objects of one GEMM and the heuristic's algorithm of the asked rank (found == 0:
// none; listed: how many the heuristic gave, at most rank + 1)
typedef struct {
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t layout_a, layout_b, layout_c, layout_d;  // layout_c is layout_d but for an FP8 D's bf16 C
    cublasLtMatmulHeuristicResult_t heuristic;
    cublasStatus_t status;
    int found;
    int listed;
} MatmulPlan;

static void matmul_plan_create(MatmulPlan* plan, const MatmulSpec* spec, int rank) {
    if (rank < 0 || rank >= MATMUL_MAX_ALGORITHMS) {
        llm8_die("matmul %s: algorithm rank %d (expected 0..%d)", spec->name, rank, MATMUL_MAX_ALGORITHMS - 1);
    }
    cublasCheck(cublasLtMatmulDescCreate(&plan->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasLtMatmulDesc_t desc = plan->desc;
    cublasOperation_t op_a = spec->transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasOperation_t op_b = spec->transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    matmul_desc_set(desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a));
    matmul_desc_set(desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b));
    matmul_desc_set(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &spec->epilogue, sizeof(spec->epilogue));
    if (spec->bias != NULL) {
        matmul_desc_set(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &spec->bias, sizeof(spec->bias));
    }
    if (spec->aux != NULL) {
        int64_t aux_ld = spec->m;
        matmul_desc_set(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &spec->aux, sizeof(spec->aux));
        matmul_desc_set(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld, sizeof(aux_ld));
    }
    if (spec->a_scale_mode != CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F) {
        int32_t mode = (int32_t)spec->a_scale_mode;
        matmul_desc_set(desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode, sizeof(mode));
    }
    if (spec->b_scale_mode != CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F) {
        int32_t mode = (int32_t)spec->b_scale_mode;
        matmul_desc_set(desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode, sizeof(mode));
    }
    if (spec->a_scale != NULL) {
        matmul_desc_set(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &spec->a_scale, sizeof(spec->a_scale));
    }
    if (spec->b_scale != NULL) {
        matmul_desc_set(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &spec->b_scale, sizeof(spec->b_scale));
    }
    if (spec->fast_accumulate) {
        int8_t fast = 1;
        matmul_desc_set(desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof(fast));
    }
    bool d_fp8 = matmul_is_fp8_type(spec->d_type);
    if (d_fp8) {  // the bias and the aux would default to D's type ("with some exceptions"): both are bf16
        int32_t bf16 = CUDA_R_16BF;
        matmul_desc_set(desc, CUBLASLT_MATMUL_DESC_D_SCALE_POINTER, &spec->d_scale, sizeof(spec->d_scale));
        matmul_desc_set(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, &bf16, sizeof(bf16));
        if (spec->bias != NULL) { matmul_desc_set(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bf16, sizeof(bf16)); }
        if (spec->d_amax != NULL) {
            matmul_desc_set(desc, CUBLASLT_MATMUL_DESC_AMAX_D_POINTER, &spec->d_amax, sizeof(spec->d_amax));
        }
    }

    int a_rows = spec->transpose_a ? spec->k : spec->m;
    int a_cols = spec->transpose_a ? spec->m : spec->k;
    int b_rows = spec->transpose_b ? spec->n : spec->k;
    int b_cols = spec->transpose_b ? spec->k : spec->n;
    cublasCheck(cublasLtMatrixLayoutCreate(&plan->layout_a, spec->a_type, a_rows, a_cols, a_rows));
    cublasCheck(cublasLtMatrixLayoutCreate(&plan->layout_b, spec->b_type, b_rows, b_cols, b_rows));
    cublasCheck(cublasLtMatrixLayoutCreate(&plan->layout_d, spec->d_type, spec->m, spec->n, spec->m));
    cublasCheck(cublasLtMatrixLayoutCreate(&plan->layout_c, d_fp8 ? CUDA_R_16BF : spec->d_type, spec->m, spec->n, spec->m));

    cublasLtMatmulPreference_t preference = matmul_preference_create(spec->a, spec->b, matmul_c(spec), spec->d);
    cublasLtMatmulHeuristicResult_t results[MATMUL_MAX_ALGORITHMS];
    plan->listed = 0;
    plan->status = cublasLtMatmulAlgoGetHeuristic(matmul_cublaslt_handle, desc, plan->layout_a, plan->layout_b,
                                                  plan->layout_c, plan->layout_d, preference, rank + 1, results,
                                                  &plan->listed);
    cublasCheck(cublasLtMatmulPreferenceDestroy(preference));
    if (plan->status != CUBLAS_STATUS_SUCCESS) { plan->listed = 0; }
    for (int i = 0; i < plan->listed; i++) {  // a result whose state is not SUCCESS is no algorithm: the list ends there
        if (results[i].state != CUBLAS_STATUS_SUCCESS) { plan->listed = i; }
    }
    plan->found = plan->listed > rank;
    if (plan->found) { plan->heuristic = results[rank]; }
}

static void matmul_plan_destroy(MatmulPlan* plan) {
    cublasCheck(cublasLtMatrixLayoutDestroy(plan->layout_a));
    cublasCheck(cublasLtMatrixLayoutDestroy(plan->layout_b));
    cublasCheck(cublasLtMatrixLayoutDestroy(plan->layout_c));
    cublasCheck(cublasLtMatrixLayoutDestroy(plan->layout_d));
    cublasCheck(cublasLtMatmulDescDestroy(plan->desc));
}

// whether cuBLASLt has an algorithm for the spec on this GPU (a startup probe: e.g. an
// epilogue with FP8 operands); the spec must pass the same checks as for matmul_cublaslt
bool matmul_cublaslt_supported(const MatmulSpec* spec) {
    matmul_check_spec(spec);
    MatmulPlan plan;
    matmul_plan_create(&plan, spec, 0);
    bool supported = plan.found != 0;
    matmul_plan_destroy(&plan);
    return supported;
}

// how many algorithms the heuristic lists for the spec, at most `most` (<= MATMUL_MAX_ALGORITHMS)
int matmul_cublaslt_algorithms(const MatmulSpec* spec, int most) {
    matmul_check_spec(spec);
    MatmulPlan plan;
    matmul_plan_create(&plan, spec, most - 1);
    int listed = plan.listed;
    matmul_plan_destroy(&plan);
    return listed;
}

// the spec's GEMM with the heuristic's algorithm of this rank (0: the first, what training runs);
// a rank the heuristic does not list stops with one line
void matmul_cublaslt_ranked(const MatmulSpec* spec, int rank, cudaStream_t stream) {
    matmul_check_spec(spec);
    MatmulPlan plan;
    matmul_plan_create(&plan, spec, rank);
    if (rank > 0 && plan.status == CUBLAS_STATUS_SUCCESS && plan.found == 0) {
        llm8_die("matmul %s: algorithm rank %d, but cuBLASLt's heuristic lists %d for m=%d n=%d k=%d", spec->name, rank,
                 plan.listed, spec->m, spec->n, spec->k);
    }
    if (plan.found == 0) {
        bool short_block = spec->a_scale_mode != CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F && spec->k % 128 != 0;
        const char* remedy = short_block ? "; this cuBLASLt lacks block scaling with a short last K block (K not a multiple of "
                                           "128): use -fr delayed or -fr current, or a width and a B*T that are multiples of 128"
                           : spec->epilogue == CUBLASLT_EPILOGUE_DGELU ? "; the DGELU epilogue is -ge 2's: run with -ge 1"
                           : matmul_is_fp8_type(spec->d_type) ? "; an E4M3 output through the GELU epilogue is -fe 1's: run with -fe 0"
                           : "";
        llm8_die("matmul %s: cuBLASLt has no algorithm for m=%d n=%d k=%d, types A=%d B=%d D=%d, "
                 "transposes %d%d, epilogue %d, scale modes %d %d (%s)%s", spec->name, spec->m, spec->n, spec->k,
                 (int)spec->a_type, (int)spec->b_type, (int)spec->d_type, (int)spec->transpose_a,
                 (int)spec->transpose_b, (int)spec->epilogue, (int)spec->a_scale_mode, (int)spec->b_scale_mode,
                 cublasGetStatusName(plan.status), remedy);
    }
    const float alpha = 1.0f;
    const float beta = spec->accumulate ? 1.0f : 0.0f;
    cublasCheck(cublasLtMatmul(matmul_cublaslt_handle, plan.desc, &alpha, spec->a, plan.layout_a, spec->b, plan.layout_b,
                               &beta, matmul_c(spec), plan.layout_c, spec->d, plan.layout_d, &plan.heuristic.algo,
                               matmul_cublaslt_workspace, MATMUL_WORKSPACE_BYTES, stream));
    matmul_plan_destroy(&plan);
}

void matmul_cublaslt(const MatmulSpec* spec, cudaStream_t stream) { matmul_cublaslt_ranked(spec, 0, stream); }

// ----------------------------------------------------------------------------
// the deterministic bias gradient

// A block sums DBIAS_ROWS_PER_CHUNK rows of dout for DBIAS_BLOCK_COLUMNS columns: 32 threads
// across (8 columns each, one 16-byte load) by DBIAS_ROW_LANES threads down (strided rows),
// then the row lanes are added in lane order (the order fp8_cast.cuh defines, which the
// block recipe's tile cast also sums in). Nothing depends on the GPU's size or timing.
#define DBIAS_BLOCK_COLUMNS (32 * 8)
#define DBIAS_LOADS 4  // rows a thread loads before it sums the first (one load at a time waited on each)
static_assert(DBIAS_BLOCK_COLUMNS == 32 * x128::size && DBIAS_ROW_LANES * 32 == DBIAS_BLOCK_COLUMNS,
              "each thread of a dbias block finishes exactly one of the block's columns");

// the most rows N (tokens) a linear's kernels take: the bias gradient's row chunks, like the FP8 casts'
// row tiles of as many rows (fp8_cast.cuh), are CUDA's grid y, at most 65535 of them
#define MATMUL_MAX_ROWS (65535 * DBIAS_ROWS_PER_CHUNK)

size_t matmul_dbias_scratch_floats(int N, int OC) {
    return (size_t)ceil_div(N, DBIAS_ROWS_PER_CHUNK) * (size_t)OC;
}

// The FP8 backward's first pass over dout uses the same kernel: pre_gelu != NULL first
// multiplies dout in place by gelu'(pre_gelu), rounded to bf16 exactly as
// gelu_backward_inplace does; record != NULL also folds the block's amax of (that) dout
// into record->amax_bits, for current scaling. Without them dout is only read.
// at most 80 registers: 3 blocks of 256 threads per SM
// GELU: pre_gelu is given, a template argument so that its loads join dout's batch (a branch
// around them had split the batch, two round trips where one does)
template <bool GELU>
__global__ void __launch_bounds__(DBIAS_BLOCK_COLUMNS, 3)
matmul_dbias_partial_kernel(float* partial, floatX* dout, int N, int OC,
                                            const floatX* pre_gelu, Fp8CastRecord* record) {
    __shared__ float lane_sums[DBIAS_ROW_LANES][DBIAS_BLOCK_COLUMNS];
    int first_column = blockIdx.x * DBIAS_BLOCK_COLUMNS;
    int column = first_column + threadIdx.x * x128::size;
    int row_end = min(N, (int)(blockIdx.y + 1) * DBIAS_ROWS_PER_CHUNK);
    float sums[x128::size] = {0.0f};
    Fp8Tally tally = fp8_tally_zero();
    if (column < OC) {
        // the thread's rows in order, DBIAS_LOADS of them loaded before the first is used
        const int stride = DBIAS_LOADS * DBIAS_ROW_LANES;
        for (int first = blockIdx.y * DBIAS_ROWS_PER_CHUNK + threadIdx.y; first < row_end; first += stride) {
            x128 grads[DBIAS_LOADS], pre[DBIAS_LOADS];
            load128_batch<DBIAS_LOADS, true>(grads, dout + column, first, DBIAS_ROW_LANES, row_end, OC);
            if constexpr (GELU) { load128_batch<DBIAS_LOADS, true>(pre, pre_gelu + column, first, DBIAS_ROW_LANES, row_end, OC); }
#pragma unroll
            for (int j = 0; j < DBIAS_LOADS; j++) {
                const int row = first + j * DBIAS_ROW_LANES;
                if (row >= row_end) { break; }
                x128 grad = grads[j];
                if constexpr (GELU) {
                    float product[x128::size];
                    for (int e = 0; e < x128::size; e++) { product[e] = x128_float(grad, e); }
                    gelu_backward_multiply(product, pre[j]);
                    grad = x128_from_floats(product);
                    store128(dout + (size_t)row * OC + column, grad);
                }
                for (int e = 0; e < x128::size; e++) { sums[e] += x128_float(grad, e); }
                fp8_tally_amax(&tally, grad);
            }
        }
    }
    for (int e = 0; e < x128::size; e++) { lane_sums[threadIdx.y][threadIdx.x * x128::size + e] = sums[e]; }
    __syncthreads();
    int local_column = threadIdx.y * blockDim.x + threadIdx.x;  // 0 .. DBIAS_BLOCK_COLUMNS-1
    if (first_column + local_column < OC) {
        float total = 0.0f;
        for (int lane = 0; lane < DBIAS_ROW_LANES; lane++) { total += lane_sums[lane][local_column]; }
        partial[(size_t)blockIdx.y * OC + first_column + local_column] = total;
    }
    if (record != NULL) { fp8_tally_commit(tally, record, true); }
}

/*
dbias += the chunk partials, added in chunk order from 0.0f. A block finishes 32 columns: its
8 warps stage DBIAS_FINISH_ROWS chunks of them in shared memory (each thread's 16 loads in
flight together, a warp's 32 columns one 128-byte row), then the first warp adds them in order.
A thread per column reading its own partials (the first version) had 3 to 12 blocks for the
whole GPU and one round trip to memory per few chunks: 512 chunks at B*T = 65536.
*/
#define DBIAS_FINISH_COLUMNS WARP_SIZE
#define DBIAS_FINISH_WARPS 8
#define DBIAS_FINISH_ROWS (DBIAS_FINISH_WARPS * 16)
__global__ void __launch_bounds__(DBIAS_FINISH_WARPS * WARP_SIZE)
matmul_dbias_finish_kernel(floatX* dbias, const float* partial, int chunks, int OC) {
    __shared__ float staged[DBIAS_FINISH_ROWS][DBIAS_FINISH_COLUMNS];
    const int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;
    const int column = blockIdx.x * DBIAS_FINISH_COLUMNS + lane;
    float total = 0.0f;
    for (int first = 0; first < chunks; first += DBIAS_FINISH_ROWS) {
        float loaded[DBIAS_FINISH_ROWS / DBIAS_FINISH_WARPS];  // all loads issued, then all stored
#pragma unroll
        for (int j = 0; j < DBIAS_FINISH_ROWS / DBIAS_FINISH_WARPS; j++) {
            const int chunk = first + warp + j * DBIAS_FINISH_WARPS;
            loaded[j] = chunk < chunks && column < OC ? partial[(size_t)chunk * OC + column] : 0.0f;
        }
#pragma unroll
        for (int j = 0; j < DBIAS_FINISH_ROWS / DBIAS_FINISH_WARPS; j++) { staged[warp + j * DBIAS_FINISH_WARPS][lane] = loaded[j]; }
        __syncthreads();
        if (warp == 0) {
            const int rows = min(DBIAS_FINISH_ROWS, chunks - first);
            for (int r = 0; r < rows; r++) { total += staged[r][lane]; }
        }
        __syncthreads();
    }
    if (warp == 0 && column < OC) { dbias[column] = (floatX)((float)dbias[column] + total); }
}

// dbias += the chunk partials in dbias_scratch, in chunk order
static void matmul_dbias_finish(floatX* dbias, const float* dbias_scratch, int N, int OC, cudaStream_t stream) {
    matmul_dbias_finish_kernel<<<ceil_div(OC, DBIAS_FINISH_COLUMNS), DBIAS_FINISH_WARPS * WARP_SIZE, 0, stream>>>(
        dbias, dbias_scratch, ceil_div(N, DBIAS_ROWS_PER_CHUNK), OC);
    cudaCheck(cudaGetLastError());
}

// dbias += column sums of dout (when dbias != NULL); pre_gelu and record as in the partial kernel
static void matmul_dbias_launch(floatX* dbias, float* dbias_scratch, floatX* dout, const floatX* pre_gelu,
                                Fp8CastRecord* record, int N, int OC, cudaStream_t stream) {
    if (dbias_scratch == NULL) { llm8_die("matmul backward: the bias gradient needs dbias_scratch"); }
    dim3 grid(ceil_div(OC, DBIAS_BLOCK_COLUMNS), ceil_div(N, DBIAS_ROWS_PER_CHUNK));
    dim3 block(32, DBIAS_ROW_LANES);
    if (pre_gelu != NULL) {
        matmul_dbias_partial_kernel<true><<<grid, block, 0, stream>>>(dbias_scratch, dout, N, OC, pre_gelu, record);
    } else {
        matmul_dbias_partial_kernel<false><<<grid, block, 0, stream>>>(dbias_scratch, dout, N, OC, pre_gelu, record);
    }
    cudaCheck(cudaGetLastError());
    if (dbias != NULL) { matmul_dbias_finish(dbias, dbias_scratch, N, OC, stream); }
}

// ----------------------------------------------------------------------------
// the three GEMMs of a linear out[N][OC] = inp[N][C] W[OC][C]^T in cuBLASLt's terms: the
// shapes, output and epilogue, shared by the bf16 and the FP8 launchers (which set the operands)

// forward: D = out (m = OC, n = N, k = C), + bias, GELU into out with the pre-activation in pre_gelu
static MatmulSpec matmul_linear_forward_spec(const char* name, floatX* out, const floatX* bias, int N, int C, int OC,
                                             floatX* pre_gelu) {
    MatmulSpec spec = {};
    spec.name = name;
    spec.m = OC; spec.n = N; spec.k = C;
    spec.d = out; spec.d_type = CUDA_R_16BF;
    spec.bias = bias;
    spec.aux = pre_gelu;
    if (pre_gelu != NULL) {
        spec.epilogue = bias != NULL ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
    } else {
        spec.epilogue = bias != NULL ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
    }
    return spec;
}

// dgrad: D = dinp (m = C, n = N, k = OC), overwritten; times gelu'(pre_gelu) [N][C] when given
static MatmulSpec matmul_linear_dgrad_spec(const char* name, floatX* dinp, int N, int C, int OC, const floatX* pre_gelu) {
    MatmulSpec spec = {};
    spec.name = name;
    spec.m = C; spec.n = N; spec.k = OC;
    spec.d = dinp; spec.d_type = CUDA_R_16BF;
    spec.aux = const_cast<floatX*>(pre_gelu);  // DGELU only reads it
    spec.epilogue = pre_gelu != NULL ? CUBLASLT_EPILOGUE_DGELU : CUBLASLT_EPILOGUE_DEFAULT;
    return spec;
}

// wgrad: D = dweight (m = C, n = OC, k = N), accumulated
static MatmulSpec matmul_linear_wgrad_spec(const char* name, void* dweight, cudaDataType_t dweight_type, int N, int C, int OC) {
    MatmulSpec spec = {};
    spec.name = name;
    spec.m = C; spec.n = OC; spec.k = N;
    spec.d = dweight; spec.d_type = dweight_type;
    spec.accumulate = true;
    spec.epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    return spec;
}

static void matmul_bf16_set_operands(MatmulSpec* spec, const floatX* a, bool transpose_a, const floatX* b, bool transpose_b) {
    spec->a = a; spec->a_type = CUDA_R_16BF; spec->transpose_a = transpose_a;
    spec->b = b; spec->b_type = CUDA_R_16BF; spec->transpose_b = transpose_b;
}

// ----------------------------------------------------------------------------
// BF16 launchers (row-major, the model's view)

// out[N][OC] = inp[N][C] weight[OC][C]^T (+ bias); with pre_gelu: pre_gelu = that, out = GELU(it)
static MatmulSpec matmul_forward_spec(floatX* out, const floatX* inp, const floatX* weight, const floatX* bias,
                                      int N, int C, int OC, floatX* pre_gelu) {
    MatmulSpec spec = matmul_linear_forward_spec("forward (m=OC, n=N, k=C)", out, bias, N, C, OC, pre_gelu);
    matmul_bf16_set_operands(&spec, weight, true, inp, false);
    return spec;
}

void matmul_forward(floatX* out, const floatX* inp, const floatX* weight, const floatX* bias,
                    int N, int C, int OC, floatX* pre_gelu, cudaStream_t stream) {
    MatmulSpec spec = matmul_forward_spec(out, inp, weight, bias, N, C, OC, pre_gelu);
    matmul_cublaslt(&spec, stream);
}

// dinp[N][C] = dout[N][OC] weight[OC][C] (overwritten), times gelu'(pre_gelu) when given (DGELU)
static MatmulSpec matmul_dgrad_spec(floatX* dinp, const floatX* dout, const floatX* weight, int N, int C, int OC,
                                    const floatX* pre_gelu) {
    MatmulSpec dgrad = matmul_linear_dgrad_spec("backward dinp (m=C, n=N, k=OC)", dinp, N, C, OC, pre_gelu);
    matmul_bf16_set_operands(&dgrad, weight, false, dout, false);
    return dgrad;
}

// dweight[OC][C] += dout[N][OC]^T inp[N][C] (accumulated)
static MatmulSpec matmul_wgrad_spec(floatX* dweight, const floatX* dout, const floatX* inp, int N, int C, int OC) {
    MatmulSpec wgrad = matmul_linear_wgrad_spec("backward dweight (m=C, n=OC, k=N)", dweight, CUDA_R_16BF, N, C, OC);
    matmul_bf16_set_operands(&wgrad, inp, false, dout, true);
    return wgrad;
}

/*
dinp[N][C] = dout[N][OC] weight[OC][C]          (overwritten; times gelu'(pre_gelu) when given, in
                                                  cuBLASLt's DGELU epilogue, pre_gelu [N][C] being this
                                                  matmul's input before GELU; dinp NULL: no dgrad)
dweight[OC][C] += dout^T inp[N][C]              (accumulated; dweight NULL: no wgrad)
dbias[OC] += column sums of dout                (accumulated, when dbias is not NULL;
                                                  dbias_scratch holds matmul_dbias_scratch_floats(N, OC))
A linear whose other GEMM runs in FP8 passes NULL for that one's output (and for dbias: the
FP8 pass over dout sums the bias), so every GEMM and the bias run exactly once.
*/
void matmul_backward(floatX* dinp, floatX* dweight, floatX* dbias, const floatX* dout, const floatX* inp,
                     const floatX* weight, float* dbias_scratch, int N, int C, int OC,
                     const floatX* pre_gelu, cudaStream_t stream) {
    if (dinp != NULL) {
        MatmulSpec dgrad = matmul_dgrad_spec(dinp, dout, weight, N, C, OC, pre_gelu);
        matmul_cublaslt(&dgrad, stream);
    }
    if (dweight != NULL) {
        MatmulSpec wgrad = matmul_wgrad_spec(dweight, dout, inp, N, C, OC);
        matmul_cublaslt(&wgrad, stream);
    }
    if (dbias != NULL) {  // dout is only read: no pre_gelu, no record
        matmul_dbias_launch(dbias, dbias_scratch, const_cast<floatX*>(dout), NULL, NULL, N, OC, stream);
    }
}

// ----------------------------------------------------------------------------
// FP8 launchers (row-major, the model's view; DESIGN.md section 3)

static inline cudaDataType_t fp8_cuda_type(Fp8Format format) {
    return format == FP8_E4M3 ? CUDA_R_8F_E4M3 : CUDA_R_8F_E5M2;
}

static inline cublasLtMatmulMatrixScale_t fp8_cublaslt_scale_mode(Fp8Scaling scaling) {
    switch (scaling) {
        case FP8_SCALING_ROWS_1x128: return CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
        case FP8_SCALING_BLOCKS_128x128: return CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
        default: return CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
    }
}

static void matmul_fp8_set_operands(MatmulSpec* spec, Fp8Operand a, Fp8Operand b) {
    if (a.codes == NULL || b.codes == NULL || a.scale_inv == NULL || b.scale_inv == NULL) {
        llm8_die("matmul %s: an FP8 operand lacks its codes or its dequantization scale", spec->name);
    }
    if ((a.scaling == FP8_SCALING_TENSOR) != (b.scaling == FP8_SCALING_TENSOR)) {
        llm8_die("matmul %s: both operands are scaled per tensor, or both per block", spec->name);
    }
    spec->a = a.codes; spec->a_type = fp8_cuda_type(a.format); spec->transpose_a = true;
    spec->b = b.codes; spec->b_type = fp8_cuda_type(b.format); spec->transpose_b = false;
    spec->a_scale = a.scale_inv; spec->a_scale_mode = fp8_cublaslt_scale_mode(a.scaling);
    spec->b_scale = b.scale_inv; spec->b_scale_mode = fp8_cublaslt_scale_mode(b.scaling);
}

/*
A startup check of one linear (N tokens, C in, OC out) against cuBLASLt FP8's rules, so a
bad shape is one clear line before training starts, never a cuBLAS status: every GEMM
dimension (N, C, OC) must be a multiple of 16. The block recipe's tiles run along K (C in
the forward, OC in dgrad, N in wgrad) and need no multiple of 128: where K is not one (d48's
C = 1600), the last tile of each row is short, which cuBLASLt's block scale layouts provide
for (ceil(K / 128) scales along K) and which equals zero-padding K to a multiple of 128.
*/
void matmul_fp8_check_shapes(const char* linear, int N, int C, int OC) {
    const char* names[3] = {"B*T", "C (input width)", "OC (output width)"};
    const int dims[3] = {N, C, OC};
    for (int i = 0; i < 3; i++) {
        if (dims[i] <= 0 || dims[i] % 16 != 0) {
            llm8_die("fp8 %s linear: %s = %d must be a positive multiple of 16 for cuBLASLt FP8 GEMMs; "
                     "change the model width or the batch, leave %s out of -f8, or run with -p bf16", linear, names[i],
                     dims[i], linear);
        }
    }
}

static MatmulSpec matmul_forward_fp8_spec(floatX* out, Fp8Operand inp, Fp8Operand weight, const floatX* bias,
                                          int N, int C, int OC, floatX* pre_gelu) {
    MatmulSpec spec = matmul_linear_forward_spec("fp8 forward (m=OC, n=N, k=C)", out, bias, N, C, OC, pre_gelu);
    matmul_fp8_set_operands(&spec, weight, inp);
    spec.fast_accumulate = inp.scaling == FP8_SCALING_TENSOR;  // the block modes take none
    return spec;
}

/*
out[N][OC] (bf16) = inp[N][C] weight[OC][C]^T (+ bias), from FP8 codes: inp E4M3 (or the
block recipe's 1x128 tiles), weight E4M3 (per tensor, or 128x128 blocks); per-tensor
scaling uses fast accumulation. pre_gelu != NULL: cuBLASLt's GELU epilogue as in
matmul_forward; whether cuBLASLt has it with FP8 operands is matmul_forward_fp8_supported's
to say at startup (the FP8 path needs it not: gelu_forward_fp8 fuses GELU into the cast).
*/
void matmul_forward_fp8(floatX* out, Fp8Operand inp, Fp8Operand weight, const floatX* bias,
                        int N, int C, int OC, floatX* pre_gelu, cudaStream_t stream) {
    MatmulSpec spec = matmul_forward_fp8_spec(out, inp, weight, bias, N, C, OC, pre_gelu);
    matmul_cublaslt(&spec, stream);
}

bool matmul_forward_fp8_supported(floatX* out, Fp8Operand inp, Fp8Operand weight, const floatX* bias,
                                  int N, int C, int OC, floatX* pre_gelu) {
    MatmulSpec spec = matmul_forward_fp8_spec(out, inp, weight, bias, N, C, OC, pre_gelu);
    return matmul_cublaslt_supported(&spec);
}

/*
fc's forward writing fcproj's input codes itself (-fe 1, fp8_model_fc_forward_codes):
    pre_gelu[N][OC] = inp[N][C] weight[OC][C]^T + bias              (bf16, the epilogue's aux)
    codes[N][OC]    = E4M3(d_scale * GELU(that, in fp32))            (cuBLASLt's GELU_AUX_BIAS)
    *amax           = max |GELU(that)| over the tensor, before d_scale (AMAX_D), when not NULL
from per-tensor E4M3 operands with fast accumulation, as matmul_forward_fp8. cuBLASLt applies
GELU to the fp32 pre-activation and rounds once into the code, where the unfused path
(gelu_forward_fp8) rounds the pre-activation and GELU's output to bf16 first: the codes may
differ in the last place, the pre-activation is the same. d_scale and amax must be 16-byte
aligned (as the A/B scale pointers must be on an H200).
*/
static MatmulSpec matmul_forward_fp8_gelu_codes_spec(uint8_t* codes, floatX* pre_gelu, Fp8Operand inp, Fp8Operand weight,
                                                     const floatX* bias, int N, int C, int OC, const float* d_scale,
                                                     float* amax) {
    if (inp.scaling != FP8_SCALING_TENSOR || pre_gelu == NULL || bias == NULL) {
        llm8_die("matmul fp8 forward to codes: needs per-tensor operands, the pre-activation and the bias");
    }
    MatmulSpec spec = matmul_forward_fp8_spec(NULL, inp, weight, bias, N, C, OC, pre_gelu);
    spec.name = "fp8 forward to E4M3 codes through GELU (m=OC, n=N, k=C)";
    spec.d = codes;
    spec.d_type = CUDA_R_8F_E4M3;
    spec.d_scale = d_scale;
    spec.d_amax = amax;
    return spec;
}

void matmul_forward_fp8_gelu_codes(uint8_t* codes, floatX* pre_gelu, Fp8Operand inp, Fp8Operand weight, const floatX* bias,
                                   int N, int C, int OC, const float* d_scale, float* amax, cudaStream_t stream) {
    MatmulSpec spec = matmul_forward_fp8_gelu_codes_spec(codes, pre_gelu, inp, weight, bias, N, C, OC, d_scale, amax);
    matmul_cublaslt(&spec, stream);
}

bool matmul_forward_fp8_gelu_codes_supported(uint8_t* codes, floatX* pre_gelu, Fp8Operand inp, Fp8Operand weight,
                                             const floatX* bias, int N, int C, int OC, const float* d_scale, float* amax) {
    MatmulSpec spec = matmul_forward_fp8_gelu_codes_spec(codes, pre_gelu, inp, weight, bias, N, C, OC, d_scale, amax);
    return matmul_cublaslt_supported(&spec);
}

/*
The FP8 backward GEMMs of one linear, once dout has been cast (matmul_backward_fp8_dout):
dinp[N][C] = dout[N][OC] weight[OC][C]      (overwritten; dinp may be NULL: no dgrad; times
           gelu'(pre_gelu) [N][C] in the DGELU epilogue when pre_gelu is given)
           from dout (E5M2, or E4M3 tiles) and weight_t = W^T [C][OC], both contiguous along K = OC;
dweight[OC][C] += dout^T inp                 (accumulated; dweight may be NULL: no wgrad)
           from inp_t = x^T [C][N] and dout_t = dy^T [OC][N], contiguous along K = N.
dweight_type: CUDA_R_16BF (the gradient buffer, like the bf16 path; the += rounds as the top
comment says) or CUDA_R_32F (an fp32 accumulation buffer, exact). No fast accumulation here.
*/
static MatmulSpec matmul_dgrad_fp8_spec(floatX* dinp, Fp8Operand dout, Fp8Operand weight_t, int N, int C, int OC,
                                        const floatX* pre_gelu) {
    MatmulSpec dgrad = matmul_linear_dgrad_spec("fp8 backward dinp (m=C, n=N, k=OC)", dinp, N, C, OC, pre_gelu);
    matmul_fp8_set_operands(&dgrad, weight_t, dout);
    return dgrad;
}

static MatmulSpec matmul_wgrad_fp8_spec(void* dweight, cudaDataType_t dweight_type, Fp8Operand dout_t, Fp8Operand inp_t,
                                        int N, int C, int OC) {
    if (dweight_type != CUDA_R_16BF && dweight_type != CUDA_R_32F) {
        llm8_die("matmul fp8 backward: dweight type %d is neither bf16 nor fp32", (int)dweight_type);
    }
    MatmulSpec wgrad = matmul_linear_wgrad_spec("fp8 backward dweight (m=C, n=OC, k=N)", dweight, dweight_type, N, C, OC);
    matmul_fp8_set_operands(&wgrad, inp_t, dout_t);
    return wgrad;
}

void matmul_backward_fp8(floatX* dinp, void* dweight, cudaDataType_t dweight_type, Fp8Operand dout,
                         Fp8Operand dout_t, Fp8Operand weight_t, Fp8Operand inp_t, int N, int C, int OC,
                         const floatX* pre_gelu, cudaStream_t stream) {
    if (dinp != NULL) {
        MatmulSpec dgrad = matmul_dgrad_fp8_spec(dinp, dout, weight_t, N, C, OC, pre_gelu);
        matmul_cublaslt(&dgrad, stream);
    }
    if (dweight != NULL) {
        MatmulSpec wgrad = matmul_wgrad_fp8_spec(dweight, dweight_type, dout_t, inp_t, N, C, OC);
        matmul_cublaslt(&wgrad, stream);
    }
}

// whether cuBLASLt has algorithms for matmul_backward_fp8's GEMMs with these arguments (a
// probe that runs nothing, as matmul_forward_fp8_supported; e.g. block scaling at a K that
// is not a multiple of 128)
bool matmul_backward_fp8_supported(floatX* dinp, void* dweight, cudaDataType_t dweight_type, Fp8Operand dout,
                                   Fp8Operand dout_t, Fp8Operand weight_t, Fp8Operand inp_t, int N, int C, int OC,
                                   const floatX* pre_gelu) {
    if (dinp != NULL) {
        MatmulSpec dgrad = matmul_dgrad_fp8_spec(dinp, dout, weight_t, N, C, OC, pre_gelu);
        if (!matmul_cublaslt_supported(&dgrad)) { return false; }
    }
    if (dweight != NULL) {
        MatmulSpec wgrad = matmul_wgrad_fp8_spec(dweight, dweight_type, dout_t, inp_t, N, C, OC);
        if (!matmul_cublaslt_supported(&wgrad)) { return false; }
    }
    return true;
}

// what matmul_backward_fp8_dout knows of dout's scale before its pass (described there)
typedef enum {
    FP8_DOUT_NEEDS_AMAX,
    FP8_DOUT_AMAX_RECORDED,
    FP8_DOUT_SCALE_KNOWN,
    FP8_DOUT_SCALE_PREDICTED,
    FP8_DOUT_SCALE_BOUND,
    FP8_DOUT_CODES_WRITTEN,
} Fp8DoutScale;

// matmul_backward_fp8_dout's tile pass over dout: GELU's derivative applied first where pre_gelu is
// given (the product stored into dout, in place, where a bf16 GEMM reads it: store_product), the
// bias columns summed into column_sums (may be NULL), the codes cast as recording says
static void matmul_dout_tile_cast(const Fp8CastOutput* fp8, float* column_sums, floatX* dout, const floatX* pre_gelu,
                                  bool store_product, int N, int OC, Fp8CastRecording recording, cudaStream_t stream) {
    if (pre_gelu != NULL) {
        Fp8GeluBackwardTransform gelu_backward = {pre_gelu, OC};
        fp8_cast_transpose_launch(fp8, store_product ? dout : NULL, column_sums, dout, N, OC, recording, gelu_backward, stream);
    } else {
        fp8_cast_transpose_launch(fp8, (floatX*)NULL, column_sums, dout, N, OC, recording, Fp8Identity(), stream);
    }
}

/*
The fused pass over a linear's output gradient dout [N][OC] before its FP8 GEMMs. With
pre_gelu != NULL the gradient is dout * gelu'(pre_gelu) (fc's dout is fcproj's dgrad output),
stored back into dout where something reads it afterwards: the cast pass of current scaling,
or a bf16 GEMM of the other pass when only one of dgrad and wgrad is FP8. A one-pass cast that
writes both code arrays leaves dout as it was: nothing reads the product, so it is not
written (2 bytes per element saved). The bias partials are summed in fixed order (as matmul_backward's,
so dbias has its bits; the trainer's attproj and fcproj sum theirs in layernorm backward instead,
in that kernel's order, in bf16 runs and under current scaling). The cast writes the codes for an FP8 dgrad (fp8->codes) and
the transpose for an FP8 wgrad (fp8->codes_t), either one NULL when its GEMM runs in bf16;
then the bias sums finish (dbias += , when dbias != NULL).
- FP8_DOUT_NEEDS_AMAX (per-tensor current scaling, E5M2; a delayed state's first use): the
  scale needs this dout's amax before the first code is written, and cuBLASLt cannot give
  the amax of a bf16 D (CUDA 13 refuses an amax pointer there), so the amax is a pass of its
  own and the GELU product and the bias ride on it: pass 1 reads dout (and pre_gelu, writing
  dout), the state update makes the scale, pass 2 reads dout and casts. Bytes per element:
  2 [+ 2 read + 2 written] + 2 + 1 per code array.
- FP8_DOUT_AMAX_RECORDED (the same current scaling, where dout's producer took its amax and
  summed the bias as it wrote dout: layernorm backward's LayernormDinpUses, for attproj and
  fcproj): pass 1 is not needed; the state update, then pass 2. dbias must be NULL (summed).
  Bytes per element: 2 + 1 per code array.
- FP8_DOUT_SCALE_KNOWN (-fg delayed after seeding, with the state's scale; the block
  recipe's 1x128 tiles, always): one tile-cast pass applies GELU's derivative, sums the bias
  columns and casts; per tensor it records this dout's amax, and the state update follows
  (the cast copied the scale it used into the record, which the GEMMs read). Bytes per
  element: 2 [+ 2 read, + 2 written for a bf16 GEMM] + 1 per code array, against the bf16
  path's 2 for the bias alone.
- FP8_DOUT_SCALE_PREDICTED (-fg pow2 after the first backward, per tensor: current scaling with
  power-of-two scales, CURRENT_POW2): SCALE_KNOWN's tile pass with the state's scale, the last
  use's, as a prediction of this use's; the state update (fp8_scaling_settle_prediction) finds
  whether this dout's amax gives the same power of two; if not, the same pass runs again with
  the new scale (fp8_cast.cuh's FP8_RECORD_RECAST, whose blocks return at once otherwise).
  Bytes per element: SCALE_KNOWN's, twice where the amax crossed a power of two; the codes,
  bias and statistics are FP8_DOUT_NEEDS_AMAX's under the same state, bit for bit.
- FP8_DOUT_SCALE_BOUND (per tensor, where the state was updated from a bound on |dout| before
  its producer ran: lm_head's, fp8_model_begin_dlogits): the same one tile-cast pass with the
  state's scale, recording no amax and updating nothing after.
- FP8_DOUT_CODES_WRITTEN (the same bound, where dout's producer already wrote its row-major
  codes: the classifier's, when both of lm_head's backward GEMMs are FP8): only the transpose
  of the codes for wgrad (fp8_transpose_codes); no bias, no GELU, dout not read.
dbias_scratch holds matmul_dbias_scratch_floats(N, OC) floats (needed even without dbias).
*/
void matmul_backward_fp8_dout(const Fp8CastOutput* fp8, floatX* dbias, float* dbias_scratch, floatX* dout,
                              const floatX* pre_gelu, int N, int OC, Fp8DoutScale scale, cudaStream_t stream) {
    fp8_cast_check(fp8, N, OC, "matmul_backward_fp8_dout");
    if (fp8->scaling == FP8_SCALING_BLOCKS_128x128) { llm8_die("matmul_backward_fp8_dout: gradients are scaled per 1x128 tile in the block recipe"); }
    if (dbias_scratch == NULL) { llm8_die("matmul_backward_fp8_dout: the bias gradient needs dbias_scratch"); }
    bool per_tensor = fp8->scaling == FP8_SCALING_TENSOR;
    if ((scale == FP8_DOUT_SCALE_BOUND || scale == FP8_DOUT_CODES_WRITTEN) && !per_tensor) {
        llm8_die("matmul_backward_fp8_dout: a scale from a bound is per tensor; the block recipe scales each tile");
    }
    if (scale == FP8_DOUT_CODES_WRITTEN) {
        if (dbias != NULL || pre_gelu != NULL || fp8->codes == NULL || fp8->codes_t == NULL) {
            llm8_die("matmul_backward_fp8_dout: codes written by dout's producer serve a linear without bias or GELU "
                     "whose dgrad and wgrad are both FP8");
        }
        fp8_transpose_codes(fp8->codes, fp8->codes_t, N, OC, stream);
        return;
    }
    if (scale == FP8_DOUT_AMAX_RECORDED && (!per_tensor || dbias != NULL || pre_gelu != NULL)) {
        llm8_die("matmul_backward_fp8_dout: an amax recorded by dout's producer is per tensor, with the bias summed "
                 "there and no GELU");
    }
    if (per_tensor && (scale == FP8_DOUT_NEEDS_AMAX || scale == FP8_DOUT_AMAX_RECORDED)) {
        if (scale == FP8_DOUT_NEEDS_AMAX) { matmul_dbias_launch(NULL, dbias_scratch, dout, pre_gelu, fp8->record, N, OC, stream); }
        fp8_scaling_update_records(fp8->state, fp8->record, 1, stream);
        fp8_cast_transpose_launch(fp8, (floatX*)NULL, (float*)NULL, dout, N, OC, FP8_RECORD_COUNTS, Fp8Identity(), stream);
    } else {  // one tile pass; per tensor with a known scale, the state update after it
        bool update_after = per_tensor && scale == FP8_DOUT_SCALE_KNOWN;
        Fp8CastRecording recording = scale == FP8_DOUT_SCALE_PREDICTED ? FP8_RECORD_PREDICTED
                                   : update_after ? FP8_RECORD_AMAX : FP8_RECORD_COUNTS;
        float* column_sums = dbias != NULL ? dbias_scratch : NULL;
        bool store_product = pre_gelu != NULL && (fp8->codes == NULL || fp8->codes_t == NULL);  // a bf16 GEMM reads it
        matmul_dout_tile_cast(fp8, column_sums, dout, pre_gelu, store_product, N, OC, recording, stream);
        if (update_after) { fp8_scaling_update_records(fp8->state, fp8->record, 1, stream); }
        if (scale == FP8_DOUT_SCALE_PREDICTED) {
            fp8_scaling_settle_prediction(fp8->state, fp8->record, fp8->prediction, stream);
            // the recast reads dout as the pass left it: where the GELU product went into dout, the
            // product itself (the same staged values, so the same codes and column sums)
            const floatX* recast_pre_gelu = store_product ? NULL : pre_gelu;
            matmul_dout_tile_cast(fp8, column_sums, dout, recast_pre_gelu, false, N, OC, FP8_RECORD_RECAST, stream);
        }
    }
    if (dbias != NULL) { matmul_dbias_finish(dbias, dbias_scratch, N, OC, stream); }
}

#endif // LLMC_MATMUL_CUH
