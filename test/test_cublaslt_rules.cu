/*
test_cublaslt_rules.cu: the cuBLASLt rules llmc/matmul.cuh relies on, and that cudasim's cuBLASLt
(test/cudasim/cudasim_cublaslt.cpp) emulates for every other simulated test: block scaling as the
cuBLAS documentation has it, and what an H200 showed beyond it. One source, two builds: on a GPU
it checks the library (so a rule the emulation got wrong fails in make gpucheck, not only in a
trainer run), under cudasim the emulation's reading of the same rules. The emulation's own
summation orders are checked under cudasim alone.

cuBLAS 13 documentation, "128-element 1D and 128x128 2D Block Scaling For FP8 Data Types":
- A/B scale modes VEC128 x VEC128, VEC128 x BLK128x128 and BLK128x128 x VEC128 are supported,
  BLK128x128 x BLK128x128 is not;
- L = ceil(K / 128) blocks along K (the last one may be short);
- "Scaling factors layouts": VEC128 is M-major M x L for A (N-major N x L for B); BLK128x128
  is K-major, L4 x ceil(M / 128) for A (L4 x ceil(N / 128) for B), L4 = L rounded up to 4;
  scale arrays start 16-byte aligned.
cublasLtMatmul: the workspace must be 256-byte aligned.
Beyond the documentation, what an H200 showed (cuBLASLt 13.1) and the emulation copies: a
per-tensor scale pointer not 16-byte aligned fails the launch (not the heuristic), and a bf16
D += rounds the sum to bf16 before adding C.
Each GEMM here has distinct power-of-two scales per block and small integer codes, so the
result is exact in fp32 and any mix-up of the layouts shows.
*/
#include <cublasLt.h>
#include <cuda_fp8.h>
#include "llmc/cuda_common.h"
#include "test/test_harness.h"

static const int M = 144, N = 32, K = 144;  // two blocks along M and K, the second short
static const int L = (K + 127) / 128, L4 = (L + 3) / 4 * 4;

static void lt_check(cublasStatus_t status, const char* what) {
    if (status != CUBLAS_STATUS_SUCCESS) { fprintf(stderr, "%s failed: %d\n", what, (int)status); exit(2); }
}

struct Gemm {
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t a, b, d;
    cublasLtMatmulPreference_t preference;
};

// D (M x N, fp32) = A^T-stored (K x M) x B (K x N), E4M3, with the given scale modes and arrays
static Gemm gemm_create(int32_t mode_a, int32_t mode_b, const float* scale_a, const float* scale_b) {
    Gemm g;
    lt_check(cublasLtMatmulDescCreate(&g.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "desc");
    int32_t transpose = CUBLAS_OP_T;
    lt_check(cublasLtMatmulDescSetAttribute(g.desc, CUBLASLT_MATMUL_DESC_TRANSA, &transpose, sizeof(transpose)), "TRANSA");
    lt_check(cublasLtMatmulDescSetAttribute(g.desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode_a, sizeof(mode_a)), "A mode");
    lt_check(cublasLtMatmulDescSetAttribute(g.desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode_b, sizeof(mode_b)), "B mode");
    lt_check(cublasLtMatmulDescSetAttribute(g.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &scale_a, sizeof(scale_a)), "A scale");
    lt_check(cublasLtMatmulDescSetAttribute(g.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &scale_b, sizeof(scale_b)), "B scale");
    lt_check(cublasLtMatrixLayoutCreate(&g.a, CUDA_R_8F_E4M3, K, M, K), "A layout");
    lt_check(cublasLtMatrixLayoutCreate(&g.b, CUDA_R_8F_E4M3, K, N, K), "B layout");
    lt_check(cublasLtMatrixLayoutCreate(&g.d, CUDA_R_32F, M, N, M), "D layout");
    lt_check(cublasLtMatmulPreferenceCreate(&g.preference), "preference");
    uint64_t workspace_bytes = 1 << 20;
    lt_check(cublasLtMatmulPreferenceSetAttribute(g.preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes,
                                                  sizeof(workspace_bytes)), "workspace preference");
    return g;
}

static void gemm_destroy(Gemm* g) {
    cublasLtMatmulPreferenceDestroy(g->preference);
    cublasLtMatrixLayoutDestroy(g->a);
    cublasLtMatrixLayoutDestroy(g->b);
    cublasLtMatrixLayoutDestroy(g->d);
    cublasLtMatmulDescDestroy(g->desc);
}

// the documented layouts: the scale of row `row` (m for A, n for B) and K block `kb`
static size_t scale_index(int32_t mode, int rows, int row, int kb) {
    if (mode == CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F) { return (size_t)kb * rows + row; }
    return (size_t)(row / 128) * L4 + kb;  // BLK128x128
}

static size_t scale_count(int32_t mode, int rows) {
    return mode == CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F ? (size_t)L * rows : (size_t)((rows + 127) / 128) * L4;
}

/*
D += A^T B into bf16 (beta = 1, C = D) rounds the fp32 sum to bf16 before C joins, as an H200
did (cuBLASLt 13.1): one 16 x 16 output, K = 16, every A code 1 and B's column summing to 259
(15 x 16 + 19); with C = 7, the sum rounded first is 260 and 267 rounds to 268, where 7 + 259
rounded once is 266
*/
static void test_bf16_accumulate_rounds_sum_first(cublasLtHandle_t handle, char* workspace) {
    const int n = 16;
    uint16_t a_host[n * n], b_host[n * n], d_host[n * n];
    for (int i = 0; i < n * n; i++) {
        a_host[i] = 0x3f80;                                   // 1.0
        b_host[i] = i % n == n - 1 ? 0x4198 : 0x4180;         // 19.0 last along K, else 16.0
        d_host[i] = 0x40e0;                                   // 7.0
    }
    uint16_t *a, *b, *d;
    cudaCheck(cudaMalloc(&a, sizeof(a_host)));
    cudaCheck(cudaMalloc(&b, sizeof(b_host)));
    cudaCheck(cudaMalloc(&d, sizeof(d_host)));
    cudaCheck(cudaMemcpy(a, a_host, sizeof(a_host), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(b, b_host, sizeof(b_host), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(d, d_host, sizeof(d_host), cudaMemcpyHostToDevice));
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t layout;
    lt_check(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "bf16 desc");
    int32_t transpose = CUBLAS_OP_T;
    lt_check(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &transpose, sizeof(transpose)), "bf16 TRANSA");
    lt_check(cublasLtMatrixLayoutCreate(&layout, CUDA_R_16BF, n, n, n), "bf16 layout");
    cublasLtMatmulPreference_t preference;
    lt_check(cublasLtMatmulPreferenceCreate(&preference), "bf16 preference");
    cublasLtMatmulHeuristicResult_t result;
    int found = 0;
    lt_check(cublasLtMatmulAlgoGetHeuristic(handle, desc, layout, layout, layout, layout, preference, 1, &result, &found),
             "bf16 heuristic");
    const float alpha = 1.0f, beta = 1.0f;
    lt_check(cublasLtMatmul(handle, desc, &alpha, a, layout, b, layout, &beta, d, layout, d, layout, &result.algo,
                            workspace, 1 << 20, 0), "bf16 matmul");
    cudaCheck(cudaMemcpy(d_host, d, sizeof(d_host), cudaMemcpyDeviceToHost));
    int bad = 0;
    for (int i = 0; i < n * n; i++) { bad += d_host[i] != 0x4386; }  // 268.0
    CHECK(bad == 0, "bf16 D += 259 from 7: %d of %d outputs are not 268 (the sum rounded to 260 first); first 0x%04x",
          bad, n * n, (unsigned)d_host[0]);
    cublasLtMatmulPreferenceDestroy(preference);
    cublasLtMatrixLayoutDestroy(layout);
    cublasLtMatmulDescDestroy(desc);
    cudaCheck(cudaFree(a)); cudaCheck(cudaFree(b)); cudaCheck(cudaFree(d));
}

#ifdef CUDASIM
/*
The heuristic picks its algorithm by the promised alignments, and the emulation's algorithms
sum in different orders (cudasim_cublaslt.cpp's top comment), so a claim that two
configurations give the same bits fails here where they hand a GEMM differently aligned
pointers, as it may on a GPU. One 16 x 16 fp32 output, K = 32, A all ones, B's column
2^24, 1, -2^24, 1 in groups of 8 along K: summed in two 8-lane accumulators each lane is
(2^24 - 2^24) + (1 + 1) = 2, output 16; in one, ((2^24 + 1) - 2^24) + 1 = 1 (2^24 + 1 rounds
to 2^24), output 8. With no preference set 256 bytes are promised.
*/
static void test_order_follows_promised_alignment(cublasLtHandle_t handle, char* workspace) {
    const int n = 16, k = 32;
    const uint16_t group_values[4] = {0x4b80, 0x3f80, 0xcb80, 0x3f80};  // bf16 2^24, 1, -2^24, 1
    uint16_t a_host[k * n], b_host[k * n];
    for (int i = 0; i < k * n; i++) {
        a_host[i] = 0x3f80;
        b_host[i] = group_values[(i % k) / 8];
    }
    uint16_t *a, *b;
    float* d;
    cudaCheck(cudaMalloc(&a, sizeof(a_host)));
    cudaCheck(cudaMalloc(&b, sizeof(b_host)));
    cudaCheck(cudaMalloc(&d, sizeof(float) * n * n));
    cudaCheck(cudaMemcpy(a, a_host, sizeof(a_host), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(b, b_host, sizeof(b_host), cudaMemcpyHostToDevice));
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t layout_ab, layout_d;
    lt_check(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "order desc");
    int32_t transpose = CUBLAS_OP_T;
    lt_check(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &transpose, sizeof(transpose)), "order TRANSA");
    lt_check(cublasLtMatrixLayoutCreate(&layout_ab, CUDA_R_16BF, k, n, k), "order A/B layout");
    lt_check(cublasLtMatrixLayoutCreate(&layout_d, CUDA_R_32F, n, n, n), "order D layout");
    const uint32_t promised_a[2] = {256, 128};
    const float expected[2] = {16.0f, 8.0f};
    for (int c = 0; c < 2; c++) {
        cublasLtMatmulPreference_t preference;
        lt_check(cublasLtMatmulPreferenceCreate(&preference), "order preference");
        if (promised_a[c] != 256) {
            lt_check(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                                          &promised_a[c], sizeof(promised_a[c])), "order alignment");
        }
        cublasLtMatmulHeuristicResult_t result;
        int found = 0;
        lt_check(cublasLtMatmulAlgoGetHeuristic(handle, desc, layout_ab, layout_ab, layout_d, layout_d, preference, 1,
                                                &result, &found), "order heuristic");
        const float alpha = 1.0f, beta = 0.0f;
        lt_check(cublasLtMatmul(handle, desc, &alpha, a, layout_ab, b, layout_ab, &beta, d, layout_d, d, layout_d,
                                &result.algo, workspace, 1 << 20, 0), "order matmul");
        float got[n * n];
        cudaCheck(cudaMemcpy(got, d, sizeof(got), cudaMemcpyDeviceToHost));
        int bad = 0;
        for (int i = 0; i < n * n; i++) { bad += got[i] != expected[c]; }
        CHECK(bad == 0, "A promised %u-byte aligned: %d of %d outputs are not %g (first %g)", promised_a[c], bad, n * n,
              expected[c], got[0]);
        cublasLtMatmulPreferenceDestroy(preference);
    }
    cublasLtMatrixLayoutDestroy(layout_ab);
    cublasLtMatrixLayoutDestroy(layout_d);
    cublasLtMatmulDescDestroy(desc);
    cudaCheck(cudaFree(a)); cudaCheck(cudaFree(b)); cudaCheck(cudaFree(d));
}
#endif

/*
The dequantization scales are multiplied together before they multiply a sum (cudasim_cublaslt.cpp's
top comment): with every A scale 2^127 and every B scale 2^-107, D = 2^20 A^T B exactly, where
sum * 2^127 overflows to Inf for any |sum| >= 2. Per tensor and per 128-element block alike.
*/
static void test_scale_product_comes_first(cublasLtHandle_t handle, char* workspace, const uint8_t* a, const uint8_t* b,
                                           float* d, float* scales_a, float* scales_b, const float* a_value,
                                           const float* b_value, size_t scale_floats) {
    float* sa = (float*)malloc(sizeof(float) * scale_floats);
    float* sb = (float*)malloc(sizeof(float) * scale_floats);
    for (size_t i = 0; i < scale_floats; i++) { sa[i] = ldexpf(1.0f, 127); sb[i] = ldexpf(1.0f, -107); }
    cudaCheck(cudaMemcpy(scales_a, sa, sizeof(float) * scale_floats, cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(scales_b, sb, sizeof(float) * scale_floats, cudaMemcpyHostToDevice));
    float* got = (float*)malloc(sizeof(float) * M * N);
    const int32_t modes[2] = {CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F, CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F};
    const float alpha = 1.0f, beta = 0.0f;
    for (int c = 0; c < 2; c++) {
        Gemm g = gemm_create(modes[c], modes[c], scales_a, scales_b);
        cublasLtMatmulHeuristicResult_t result;
        int found = 0;
        lt_check(cublasLtMatmulAlgoGetHeuristic(handle, g.desc, g.a, g.b, g.d, g.d, g.preference, 1, &result, &found),
                 "scale-product heuristic");
        lt_check(cublasLtMatmul(handle, g.desc, &alpha, a, g.a, b, g.b, &beta, d, g.d, d, g.d, &result.algo, workspace,
                                1 << 20, 0), "scale-product matmul");
        cudaCheck(cudaMemcpy(got, d, sizeof(float) * M * N, cudaMemcpyDeviceToHost));
        int bad = 0, large = 0;
        for (int j = 0; j < N; j++) {
            for (int i = 0; i < M; i++) {
                double sum = 0.0;
                for (int p = 0; p < K; p++) { sum += (double)a_value[(size_t)i * K + p] * b_value[(size_t)j * K + p]; }
                large += fabs(sum) >= 2.0;
                bad += (double)got[i + (size_t)j * M] != ldexp(sum, 20);
            }
        }
        CHECK(large > M * N / 2 && bad == 0, "scale mode %d, scales 2^127 x 2^-107: %d of %d outputs are not 2^20 times "
              "the sum (%d sums of 2 or more)", modes[c], bad, M * N, large);
        gemm_destroy(&g);
    }
    free(got); free(sa); free(sb);
}

int main() {
    // codes: small integers, exact in E4M3; A stored K x M (column m contiguous along K)
    uint8_t* a_host = (uint8_t*)malloc((size_t)K * M);
    uint8_t* b_host = (uint8_t*)malloc((size_t)K * N);
    float* a_value = (float*)malloc(sizeof(float) * K * M);
    float* b_value = (float*)malloc(sizeof(float) * K * N);
    for (int i = 0; i < K * M; i++) {
        a_value[i] = (float)((i * 7 + 3) % 9 - 4);
        a_host[i] = __nv_fp8_e4m3(a_value[i]).__x;
    }
    for (int i = 0; i < K * N; i++) {
        b_value[i] = (float)((i * 5 + 1) % 7 - 3);
        b_host[i] = __nv_fp8_e4m3(b_value[i]).__x;
    }
    uint8_t *a, *b;
    float *d, *scales_a, *scales_b;
    char* workspace;
    const size_t scale_floats = 4096;
    cudaCheck(cudaMalloc(&a, (size_t)K * M));
    cudaCheck(cudaMalloc(&b, (size_t)K * N));
    cudaCheck(cudaMalloc(&d, sizeof(float) * M * N));
    cudaCheck(cudaMalloc(&scales_a, sizeof(float) * scale_floats));
    cudaCheck(cudaMalloc(&scales_b, sizeof(float) * scale_floats));
    cudaCheck(cudaMalloc(&workspace, 1 << 20));
    cudaCheck(cudaMemcpy(a, a_host, (size_t)K * M, cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(b, b_host, (size_t)K * N, cudaMemcpyHostToDevice));
    cublasLtHandle_t handle;
    lt_check(cublasLtCreate(&handle), "handle");
    const float alpha = 1.0f, beta = 0.0f;

    const int32_t vec = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F, blk = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
    const int32_t modes[3][2] = {{vec, vec}, {vec, blk}, {blk, vec}};
    for (int c = 0; c < 3; c++) {
        const int32_t mode_a = modes[c][0], mode_b = modes[c][1];
        // a distinct power of two in every stored slot (padding included), so a wrong index shows
        float* sa = (float*)malloc(sizeof(float) * scale_floats);
        float* sb = (float*)malloc(sizeof(float) * scale_floats);
        for (size_t i = 0; i < scale_floats; i++) {
            sa[i] = ldexpf(1.0f, (int)(i % 5) - 2);
            sb[i] = ldexpf(1.0f, (int)(i % 7) - 3);
        }
        CHECK(scale_count(mode_a, M) < scale_floats && scale_count(mode_b, N) < scale_floats, "scale arrays too small");
        cudaCheck(cudaMemcpy(scales_a, sa, sizeof(float) * scale_floats, cudaMemcpyHostToDevice));
        cudaCheck(cudaMemcpy(scales_b, sb, sizeof(float) * scale_floats, cudaMemcpyHostToDevice));
        Gemm g = gemm_create(mode_a, mode_b, scales_a, scales_b);
        cublasLtMatmulHeuristicResult_t result;
        int found = 0;
        cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(handle, g.desc, g.a, g.b, g.d, g.d, g.preference, 1,
                                                                &result, &found);
        CHECK(status == CUBLAS_STATUS_SUCCESS && found == 1, "modes %d x %d with K=%d: no algorithm (status %d)",
              mode_a, mode_b, K, (int)status);
        if (found == 1) {
            lt_check(cublasLtMatmul(handle, g.desc, &alpha, a, g.a, b, g.b, &beta, d, g.d, d, g.d, &result.algo,
                                    workspace, 1 << 20, 0), "matmul");
            float* got = (float*)malloc(sizeof(float) * M * N);
            cudaCheck(cudaMemcpy(got, d, sizeof(float) * M * N, cudaMemcpyDeviceToHost));
            int bad = 0;
            for (int j = 0; j < N; j++) {
                for (int i = 0; i < M; i++) {
                    double expected = 0.0;
                    for (int p = 0; p < K; p++) {
                        expected += (double)a_value[(size_t)i * K + p] * b_value[(size_t)j * K + p] *
                                    sa[scale_index(mode_a, M, i, p / 128)] * sb[scale_index(mode_b, N, j, p / 128)];
                    }
                    bad += (double)got[i + (size_t)j * M] != expected;
                }
            }
            CHECK(bad == 0, "modes %d x %d: %d of %d outputs differ from the documented scale layouts", mode_a, mode_b,
                  bad, M * N);
            // a workspace that is not 256-byte aligned is refused
            status = cublasLtMatmul(handle, g.desc, &alpha, a, g.a, b, g.b, &beta, d, g.d, d, g.d, &result.algo,
                                    workspace + 16, (1 << 20) - 16, 0);
            CHECK(status == CUBLAS_STATUS_INVALID_VALUE, "a workspace at 16 bytes' alignment: status %d", (int)status);
            free(got);
        }
        gemm_destroy(&g);
        free(sa);
        free(sb);
    }

    // BLK128x128 on both operands, and block scales not 16-byte aligned, have no algorithm
    Gemm both = gemm_create(blk, blk, scales_a, scales_b);
    cublasLtMatmulHeuristicResult_t result;
    int found = 0;
    cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(handle, both.desc, both.a, both.b, both.d, both.d,
                                                           both.preference, 1, &result, &found);
    CHECK(status != CUBLAS_STATUS_SUCCESS && found == 0, "BLK128x128 x BLK128x128: an algorithm (status %d)", (int)status);
    gemm_destroy(&both);
    Gemm misaligned = gemm_create(vec, vec, scales_a + 1, scales_b);
    status = cublasLtMatmulAlgoGetHeuristic(handle, misaligned.desc, misaligned.a, misaligned.b, misaligned.d,
                                            misaligned.d, misaligned.preference, 1, &result, &found);
    CHECK(status != CUBLAS_STATUS_SUCCESS && found == 0, "A scales at 4 bytes' alignment: an algorithm (status %d)",
          (int)status);
    gemm_destroy(&misaligned);

    // a per-tensor scale 4 bytes past 16-byte alignment: the heuristic takes it, the launch refuses
    // it (as an H200's cuBLASLt 13.1 did); at 16 bytes it runs
    const int32_t scalar = CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
    for (int offset = 1; offset <= 4; offset += 3) {
        Gemm tensor = gemm_create(scalar, scalar, scales_a + offset, scales_b);
        status = cublasLtMatmulAlgoGetHeuristic(handle, tensor.desc, tensor.a, tensor.b, tensor.d, tensor.d,
                                                tensor.preference, 1, &result, &found);
        CHECK(status == CUBLAS_STATUS_SUCCESS && found == 1, "per-tensor scale at +%d floats: no algorithm (status %d)",
              offset, (int)status);
        status = cublasLtMatmul(handle, tensor.desc, &alpha, a, tensor.a, b, tensor.b, &beta, d, tensor.d, d, tensor.d,
                                &result.algo, workspace, 1 << 20, 0);
        cublasStatus_t want = offset == 4 ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_NOT_SUPPORTED;
        CHECK(status == want, "per-tensor scale at +%d floats: status %d, expected %d", offset, (int)status, (int)want);
        gemm_destroy(&tensor);
    }
    cudaCheck(cudaDeviceSynchronize());

    test_bf16_accumulate_rounds_sum_first(handle, workspace);
#ifdef CUDASIM
    test_order_follows_promised_alignment(handle, workspace);
#endif
    test_scale_product_comes_first(handle, workspace, a, b, d, scales_a, scales_b, a_value, b_value, scale_floats);

    lt_check(cublasLtDestroy(handle), "destroy");
    void* buffers[6] = {a, b, d, scales_a, scales_b, workspace};
    for (int i = 0; i < 6; i++) { cudaCheck(cudaFree(buffers[i])); }
    free(a_host); free(b_host); free(a_value); free(b_value);
    return test_summary("test_cublaslt_rules");
}
