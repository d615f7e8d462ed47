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
- Split-K is allowed only with fp32 partials reduced in a separate step (reduction scheme
  COMPUTE_TYPE): the in-place and output-type schemes would round partial sums to bf16.
  Every cuBLASLt scheme is run-to-run deterministic for a fixed algorithm, and the algorithm
  is a pure function of the problem (cublasLtMatmulAlgoGetHeuristic, first result).
- The bias gradient is ours, not an epilogue's: fixed chunks of rows are summed in a fixed
  order into fp32 partials (dbias_scratch), then each column sums its partials in order.
- dgrad through GELU multiplies the bf16 dgrad by gelu'(pre_gelu) in place with gelu.cuh's
  gelu_backward_inplace (gelu_backward_element, the formula the CPU reference uses), not with
  cuBLASLt's DGELU epilogue, so GPU and reference share the derivative's formula.
Checks: every dimension must be a multiple of 16 bytes' worth of elements (8 for bf16, 16 for
fp8) and every pointer 16-byte aligned; a violation is one clear line naming the GEMM.
*/
#ifndef LLMC_MATMUL_CUH
#define LLMC_MATMUL_CUH

#include <stdint.h>
#include <limits.h>
#include <cublasLt.h>
#include "cuda_common.h"
#include "gelu.cuh"

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
    cublasLtEpilogue_t epilogue;   // DEFAULT, BIAS, GELU_AUX or GELU_AUX_BIAS
    const void* bias;              // for the BIAS epilogues
    void* aux;                     // GELU_AUX epilogues: receives the pre-activation
    const float* a_scale;          // device scalar multiplying A (FP8 dequantization), or NULL
    const float* b_scale;          // device scalar multiplying B, or NULL
    bool fast_accumulate;          // FP8 forward only: no periodic promotion to fp32
} MatmulSpec;

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
    int multiple = 16 / smallest_bytes;
    if (spec->m <= 0 || spec->n <= 0 || spec->k <= 0
        || spec->m % multiple != 0 || spec->n % multiple != 0 || spec->k % multiple != 0) {
        llm8_die("matmul %s: m=%d n=%d k=%d: each must be a positive multiple of %d for cuBLASLt "
                 "(rows of %d-byte elements must start 16-byte aligned)",
                 spec->name, spec->m, spec->n, spec->k, multiple, smallest_bytes);
    }
    matmul_check_aligned(spec->name, "A", spec->a);
    matmul_check_aligned(spec->name, "B", spec->b);
    matmul_check_aligned(spec->name, "D", spec->d);
    bool wants_bias = spec->epilogue == CUBLASLT_EPILOGUE_BIAS || spec->epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    bool wants_aux = spec->epilogue == CUBLASLT_EPILOGUE_GELU_AUX || spec->epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    if (wants_bias != (spec->bias != NULL) || wants_aux != (spec->aux != NULL)) {
        llm8_die("matmul %s: epilogue %d does not match the bias/aux pointers given", spec->name, (int)spec->epilogue);
    }
    if (wants_bias) { matmul_check_aligned(spec->name, "bias", spec->bias); }
    if (wants_aux) { matmul_check_aligned(spec->name, "GELU pre-activation", spec->aux); }
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

void matmul_cublaslt(const MatmulSpec* spec, cudaStream_t stream) {
    matmul_check_spec(spec);

    cublasLtMatmulDesc_t desc;
    cublasCheck(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
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

    cublasLtMatrixLayout_t layout_a, layout_b, layout_d;
    int a_rows = spec->transpose_a ? spec->k : spec->m;
    int a_cols = spec->transpose_a ? spec->m : spec->k;
    int b_rows = spec->transpose_b ? spec->n : spec->k;
    int b_cols = spec->transpose_b ? spec->k : spec->n;
    cublasCheck(cublasLtMatrixLayoutCreate(&layout_a, spec->a_type, a_rows, a_cols, a_rows));
    cublasCheck(cublasLtMatrixLayoutCreate(&layout_b, spec->b_type, b_rows, b_cols, b_rows));
    cublasCheck(cublasLtMatrixLayoutCreate(&layout_d, spec->d_type, spec->m, spec->n, spec->m));

    cublasLtMatmulPreference_t preference;
    cublasCheck(cublasLtMatmulPreferenceCreate(&preference));
    uint64_t workspace_bytes = MATMUL_WORKSPACE_BYTES;
    uint32_t reduction_schemes = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                     &workspace_bytes, sizeof(workspace_bytes)));
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
                                                     &reduction_schemes, sizeof(reduction_schemes)));
    const uint32_t alignments[4] = {matmul_pointer_alignment(spec->a), matmul_pointer_alignment(spec->b),
                                    matmul_pointer_alignment(spec->d), matmul_pointer_alignment(spec->d)};
    const cublasLtMatmulPreferenceAttributes_t alignment_attributes[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    for (int i = 0; i < 4; i++) {
        cublasCheck(cublasLtMatmulPreferenceSetAttribute(preference, alignment_attributes[i], &alignments[i],
                                                         sizeof(alignments[i])));
    }
    cublasLtMatmulHeuristicResult_t heuristic;
    int found = 0;
    cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(matmul_cublaslt_handle, desc, layout_a, layout_b,
                                                           layout_d, layout_d, preference, 1, &heuristic, &found);
    if (status != CUBLAS_STATUS_SUCCESS || found == 0) {
        llm8_die("matmul %s: cuBLASLt has no algorithm for m=%d n=%d k=%d, types A=%d B=%d D=%d, "
                 "transposes %d%d, epilogue %d (%s)", spec->name, spec->m, spec->n, spec->k,
                 (int)spec->a_type, (int)spec->b_type, (int)spec->d_type, (int)spec->transpose_a,
                 (int)spec->transpose_b, (int)spec->epilogue, cublasGetStatusName(status));
    }

    const float alpha = 1.0f;
    const float beta = spec->accumulate ? 1.0f : 0.0f;
    cublasCheck(cublasLtMatmul(matmul_cublaslt_handle, desc, &alpha, spec->a, layout_a, spec->b, layout_b,
                               &beta, spec->d, layout_d, spec->d, layout_d, &heuristic.algo,
                               matmul_cublaslt_workspace, MATMUL_WORKSPACE_BYTES, stream));

    cublasCheck(cublasLtMatmulPreferenceDestroy(preference));
    cublasCheck(cublasLtMatrixLayoutDestroy(layout_a));
    cublasCheck(cublasLtMatrixLayoutDestroy(layout_b));
    cublasCheck(cublasLtMatrixLayoutDestroy(layout_d));
    cublasCheck(cublasLtMatmulDescDestroy(desc));
}

// ----------------------------------------------------------------------------
// the deterministic bias gradient

// A block sums DBIAS_ROWS_PER_CHUNK rows of dout for DBIAS_BLOCK_COLUMNS columns: 32 threads
// across (8 columns each, one 16-byte load) by DBIAS_ROW_LANES threads down (strided rows),
// then the row lanes are added in lane order. Nothing depends on the GPU's size or timing.
#define DBIAS_ROWS_PER_CHUNK 256
#define DBIAS_ROW_LANES 8
#define DBIAS_BLOCK_COLUMNS (32 * 8)
static_assert(DBIAS_BLOCK_COLUMNS == 32 * x128::size && DBIAS_ROW_LANES * 32 == DBIAS_BLOCK_COLUMNS,
              "each thread of a dbias block finishes exactly one of the block's columns");

size_t matmul_dbias_scratch_floats(int N, int OC) {
    return (size_t)ceil_div(N, DBIAS_ROWS_PER_CHUNK) * (size_t)OC;
}

__global__ void matmul_dbias_partial_kernel(float* partial, const floatX* dout, int N, int OC) {
    __shared__ float lane_sums[DBIAS_ROW_LANES][DBIAS_BLOCK_COLUMNS];
    int first_column = blockIdx.x * DBIAS_BLOCK_COLUMNS;
    int column = first_column + threadIdx.x * x128::size;
    int row_end = min(N, (int)(blockIdx.y + 1) * DBIAS_ROWS_PER_CHUNK);
    float sums[x128::size] = {0.0f};
    if (column < OC) {
        for (int row = blockIdx.y * DBIAS_ROWS_PER_CHUNK + threadIdx.y; row < row_end; row += DBIAS_ROW_LANES) {
            x128 grad = load128cs(dout + (size_t)row * OC + column);
            for (int e = 0; e < x128::size; e++) { sums[e] += (float)grad[e]; }
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
}

__global__ void matmul_dbias_finish_kernel(floatX* dbias, const float* partial, int chunks, int OC) {
    int column = blockIdx.x * blockDim.x + threadIdx.x;
    if (column >= OC) { return; }
    float total = 0.0f;
    for (int chunk = 0; chunk < chunks; chunk++) { total += partial[(size_t)chunk * OC + column]; }
    dbias[column] = (floatX)((float)dbias[column] + total);
}

// ----------------------------------------------------------------------------
// BF16 launchers (row-major, the model's view)

// out[N][OC] = inp[N][C] weight[OC][C]^T (+ bias); with pre_gelu: pre_gelu = that, out = GELU(it)
void matmul_forward(floatX* out, const floatX* inp, const floatX* weight, const floatX* bias,
                    int N, int C, int OC, floatX* pre_gelu, cudaStream_t stream) {
    MatmulSpec spec = {};
    spec.name = "forward (m=OC, n=N, k=C)";
    spec.m = OC; spec.n = N; spec.k = C;
    spec.d = out; spec.d_type = CUDA_R_16BF;
    spec.a = weight; spec.a_type = CUDA_R_16BF; spec.transpose_a = true;
    spec.b = inp; spec.b_type = CUDA_R_16BF; spec.transpose_b = false;
    spec.bias = bias;
    spec.aux = pre_gelu;
    if (pre_gelu != NULL) {
        spec.epilogue = bias != NULL ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
    } else {
        spec.epilogue = bias != NULL ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
    }
    matmul_cublaslt(&spec, stream);
}

/*
dinp[N][C] = dout[N][OC] weight[OC][C]          (overwritten; times gelu'(pre_gelu) when given,
                                                  pre_gelu [N][C] being this matmul's input before GELU)
dweight[OC][C] += dout^T inp[N][C]              (accumulated)
dbias[OC] += column sums of dout                (accumulated, when dbias is not NULL;
                                                  dbias_scratch holds matmul_dbias_scratch_floats(N, OC))
*/
void matmul_backward(floatX* dinp, floatX* dweight, floatX* dbias, const floatX* dout, const floatX* inp,
                     const floatX* weight, float* dbias_scratch, int N, int C, int OC,
                     const floatX* pre_gelu, cudaStream_t stream) {
    MatmulSpec dgrad = {};
    dgrad.name = "backward dinp (m=C, n=N, k=OC)";
    dgrad.m = C; dgrad.n = N; dgrad.k = OC;
    dgrad.d = dinp; dgrad.d_type = CUDA_R_16BF;
    dgrad.a = weight; dgrad.a_type = CUDA_R_16BF; dgrad.transpose_a = false;
    dgrad.b = dout; dgrad.b_type = CUDA_R_16BF; dgrad.transpose_b = false;
    dgrad.epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    if (pre_gelu != NULL) { matmul_check_aligned(dgrad.name, "GELU pre-activation", pre_gelu); }
    matmul_cublaslt(&dgrad, stream);
    if (pre_gelu != NULL) {
        if ((size_t)N * C > (size_t)INT_MAX) { llm8_die("matmul backward: N*C = %zu elements is too many for the GELU backward", (size_t)N * C); }
        gelu_backward_inplace(dinp, pre_gelu, N * C, stream);
    }

    MatmulSpec wgrad = {};
    wgrad.name = "backward dweight (m=C, n=OC, k=N)";
    wgrad.m = C; wgrad.n = OC; wgrad.k = N;
    wgrad.d = dweight; wgrad.d_type = CUDA_R_16BF;
    wgrad.a = inp; wgrad.a_type = CUDA_R_16BF; wgrad.transpose_a = false;
    wgrad.b = dout; wgrad.b_type = CUDA_R_16BF; wgrad.transpose_b = true;
    wgrad.accumulate = true;
    wgrad.epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    matmul_cublaslt(&wgrad, stream);

    if (dbias != NULL) {
        if (dbias_scratch == NULL) { llm8_die("matmul backward: dbias given without dbias_scratch"); }
        int chunks = ceil_div(N, DBIAS_ROWS_PER_CHUNK);
        dim3 grid(ceil_div(OC, DBIAS_BLOCK_COLUMNS), chunks);
        dim3 block(32, DBIAS_ROW_LANES);
        matmul_dbias_partial_kernel<<<grid, block, 0, stream>>>(dbias_scratch, dout, N, OC);
        cudaCheck(cudaGetLastError());
        const int finish_block = 256;
        matmul_dbias_finish_kernel<<<ceil_div(OC, finish_block), finish_block, 0, stream>>>(dbias, dbias_scratch, chunks, OC);
        cudaCheck(cudaGetLastError());
    }
}

#endif // LLMC_MATMUL_CUH
