/*
test_matmul_attention.cu: llmc/matmul.cuh and llmc/attention.cuh (both backends) against the
CPU reference (test/gpt2_ref.h, double accumulation). Runs on a GPU under make gpucheck, and
under cudasim (test/cudasim, without cuDNN: -DLLM8_NO_CUDNN) in make test.

Tolerances, per element |gpu - ref| <= atol + rtol * |ref|. The reference always gets the very
bf16 values the GPU got, converted to fp32, so the GPU's only errors are its fp32 accumulation
order (~1e-6 relative) and its roundings to bf16: at most half an ulp, 2^-8 relative (7
stored mantissa bits).
- matmul, exact: integer data in [-3, 3] (initial gradients in [-8, 8]) makes every bf16
  product and every fp32 partial sum exact, so forward (with and without bias), dinp, dweight
  and dbias must equal the exact sum rounded once to bf16, bit for bit. Backward runs twice:
  dinp must be overwritten, dweight and dbias accumulated (+=) onto the bf16 they held.
- matmul, Gaussian data at GPT-2 d12 shapes (N=256; C=768 to OC=2304 and 3072; fcproj's
  C=3072 to OC=768): one rounding, rtol 2^-8 with atol 1e-3 for the accumulation order (values
  are of size ~1, dweight ~16); GELU output rtol 2^-7, atol 2e-3 (cuBLASLt's tanh is not ours
  to the ulp); dinp through gelu' (-ge 2's DGELU epilogue: the fp32 dgrad times cuBLASLt's
  derivative, rounded once) rtol 2^-6: the derivative is cuBLASLt's formula, not the
  reference's, and near its zero (pre ~ -0.75) it scales an absolute error into a large
  relative one.
- determinism: each launcher twice from the same state, bitwise equal; the bias gradient also
  at N=2056 (a partial row chunk) and OC=264 (a partial column block).
- attention, B=2, NH=12, HS=64, T = 64, 128, 1024 (under cudasim B=1, NH=2 at T=1024), and
  HS=128 at T=128. The backward is checked
  against the reference backward fed with the same out and stats the GPU backward got.
  fallback (fp32 throughout, one rounding): out rtol 2^-8, atol 1e-3; stats atol 1e-4 (lse
  ~ log T in fp32); dq, dk, dv each atol 1e-2 * rms(ref), rtol 1e-2, relative L2 <= 5e-3
  (rounding alone gives ~2e-3).
  cuDNN (P and dS pass through bf16 inside the fused kernels): out atol = rtol = 1e-2; stats
  atol 1e-3; dq, dk, dv atol 5e-2 * rms(ref), rtol 5e-2, relative L2 <= 2e-2. The same bounds
  for cuDNN against the fallback, and the fallback backward fed with cuDNN's out and stats
  must meet the fallback bounds (the two backends' stats are interchangeable). cuDNN's
  backward with float atomics (the trainer's -ad 0) meets the same bounds; it alone is not
  checked for bitwise repeatability.
- bad input dies with one clear line: a dim not a multiple of 8, a misaligned pointer, a head
  size the fallback lacks, cuDNN asked of a -DLLM8_NO_CUDNN build; and (at the end) C not a
  multiple of NH, attention_setup twice, a launch before attention_setup.
- the fallback at qkv std 8 (scores in the hundreds, past expf's range: the softmax must
  subtract the row max), with the fallback bounds; and a larger shape after a smaller one under
  one attention_setup (the backward's row-dot buffer must grow).
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include "llmc/cuda_common.h"
#include "llmc/matmul.cuh"
#include "llmc/attention.cuh"
#include "llmc/rand.h"
#include "test/gpt2_ref.h"
#include "test/bf16_accumulate.h"
#include "test/test_harness.h"
#include "test/test_harness_fork.h"
#include "test/gpu_test_copies.cuh"

static mt19937_state test_rng;

// ----------------------------------------------------------------------------
// host tensors: bf16 as raw bits, with the same values as floats for the reference

typedef struct {
    size_t count;
    uint16_t* bits;
    float* values;
} HostTensor;

static HostTensor host_tensor_from_floats(const float* source, size_t count) {
    HostTensor t;
    t.count = count;
    t.bits = (uint16_t*)mallocCheck(count * sizeof(uint16_t));
    t.values = (float*)mallocCheck(count * sizeof(float));
    for (size_t i = 0; i < count; i++) {
        t.bits[i] = float_to_bf16_bits(source[i]);
        t.values[i] = bf16_bits_to_float(t.bits[i]);
    }
    return t;
}

static HostTensor host_tensor_normal(size_t count, float std) {
    float* draws = (float*)mallocCheck(count * sizeof(float));
    normal_(draws, count, 0.0f, std, &test_rng);
    HostTensor t = host_tensor_from_floats(draws, count);
    free(draws);
    return t;
}

static HostTensor host_tensor_integers(size_t count, int lo, int hi) {
    float* draws = (float*)mallocCheck(count * sizeof(float));
    for (size_t i = 0; i < count; i++) { draws[i] = (float)(lo + (int)(randint32(&test_rng) % (uint32_t)(hi - lo + 1))); }
    HostTensor t = host_tensor_from_floats(draws, count);
    free(draws);
    return t;
}

static void host_tensor_free(HostTensor* t) {
    free(t->bits);
    free(t->values);
}

static floatX* device_bf16(const HostTensor* t) {
    floatX* d = (floatX*)cuda_malloc_checked(t->count * sizeof(floatX), "a test tensor");
    cudaCheck(cudaMemcpy(d, t->bits, t->count * sizeof(uint16_t), cudaMemcpyHostToDevice));
    return d;
}

static floatX* device_bf16_empty(size_t count) {
    floatX* d = (floatX*)cuda_malloc_checked(count * sizeof(floatX), "a test tensor");
    cudaCheck(cudaMemset(d, 0xff, count * sizeof(floatX)));  // NaN bits: anything not written shows
    return d;
}

static void device_bf16_set(floatX* d, const HostTensor* t) {
    cudaCheck(cudaMemcpy(d, t->bits, t->count * sizeof(uint16_t), cudaMemcpyHostToDevice));
}

// synchronizes, then copies back the bf16 bits
static uint16_t* download_bf16(const floatX* d, size_t count) { return (uint16_t*)host_copy(d, count * sizeof(uint16_t)); }

static float* download_floats(const float* d, size_t count) { return (float*)host_copy(d, count * sizeof(float)); }

// ----------------------------------------------------------------------------
// comparisons: one CHECK per tensor, naming the worst element

// |got - expected| <= atol + rtol * |expected|; with previous (a "+=" result, expected = previous
// + sum): + rtol * |sum| more, for cuBLASLt's rounding of the sum before previous joins it
// (test/bf16_accumulate.h)
static void check_close_accumulated(const char* what, const float* got, const float* expected, const float* previous,
                                    size_t count, double atol, double rtol) {
    size_t worst = 0, bad = 0;
    double worst_excess = -INFINITY;
    for (size_t i = 0; i < count; i++) {
        double error = fabs((double)got[i] - (double)expected[i]);
        double sum = previous != NULL ? (double)expected[i] - (double)previous[i] : 0.0;
        double excess = error - (atol + rtol * (fabs((double)expected[i]) + fabs(sum)));
        if (!(excess <= 0.0)) { bad++; }  // NaN counts as bad
        if (!(excess <= worst_excess)) { worst_excess = excess; worst = i; }
    }
    CHECK(bad == 0, "%s: %zu of %zu elements out of tolerance (atol %g, rtol %g%s); worst [%zu] got %.9g expected %.9g",
          what, bad, count, atol, rtol, previous != NULL ? ", the sum rounded first" : "", worst, (double)got[worst],
          (double)expected[worst]);
}

static void check_close(const char* what, const float* got, const float* expected, size_t count,
                        double atol, double rtol) {
    check_close_accumulated(what, got, expected, NULL, count, atol, rtol);
}

static void check_bf16_close(const char* what, const uint16_t* got_bits, const float* expected, size_t count,
                             double atol, double rtol) {
    float* got = bf16_bits_to_floats(got_bits, count);
    check_close(what, got, expected, count, atol, rtol);
    free(got);
}

// got must be exactly the bf16 rounding of the (exact) expected value
static void check_bf16_exact(const char* what, const uint16_t* got_bits, const float* expected, size_t count) {
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < count; i++) {
        if (got_bits[i] != float_to_bf16_bits(expected[i])) {
            if (bad == 0) { first = i; }
            bad++;
        }
    }
    CHECK(bad == 0, "%s: %zu of %zu elements differ from the exact result; first [%zu] got %.9g expected %.9g",
          what, bad, count, first, (double)bf16_bits_to_float(got_bits[first]),
          (double)bf16_bits_to_float(float_to_bf16_bits(expected[first])));
}

static void check_bitwise_equal(const char* what, const void* a, const void* b, size_t bytes) {
    CHECK(memcmp(a, b, bytes) == 0, "%s: two runs differ", what);
}

static double root_mean_square(const float* x, size_t count) {
    double sum = 0.0;
    for (size_t i = 0; i < count; i++) { sum += (double)x[i] * x[i]; }
    return sqrt(sum / (double)count);
}

// elementwise with atol relative to the reference's rms, plus the relative L2 error
static void check_close_scaled(const char* what, const float* got, const float* expected, size_t count,
                               double atol_of_rms, double rtol, double max_relative_l2) {
    double rms = root_mean_square(expected, count);
    check_close(what, got, expected, count, atol_of_rms * rms, rtol);
    double error_sum = 0.0, norm_sum = 0.0;
    for (size_t i = 0; i < count; i++) {
        double e = (double)got[i] - (double)expected[i];
        error_sum += e * e;
        norm_sum += (double)expected[i] * expected[i];
    }
    double relative_l2 = sqrt(error_sum / norm_sum);
    CHECK(relative_l2 <= max_relative_l2, "%s: relative L2 error %.3g > %.3g", what, relative_l2, max_relative_l2);
}

// ----------------------------------------------------------------------------
// matmul: exact on small integers

static float* host_matmul_exact(const float* inp, const float* weight, const float* bias, int N, int C, int OC) {
    float* out = (float*)mallocCheck((size_t)N * OC * sizeof(float));
    ref_matmul_forward(out, inp, weight, bias, N, C, OC);  // integer sums: exact in double and in fp32
    return out;
}

static void test_matmul_exact(int N, int C, int OC) {
    printf("matmul exact on integers: N=%d C=%d OC=%d\n", N, C, OC);
    HostTensor inp = host_tensor_integers((size_t)N * C, -3, 3);
    HostTensor weight = host_tensor_integers((size_t)OC * C, -3, 3);
    HostTensor bias = host_tensor_integers((size_t)OC, -3, 3);
    HostTensor dout = host_tensor_integers((size_t)N * OC, -3, 3);
    HostTensor dweight_init = host_tensor_integers((size_t)OC * C, -8, 8);
    HostTensor dbias_init = host_tensor_integers((size_t)OC, -8, 8);
    floatX* d_inp = device_bf16(&inp);
    floatX* d_weight = device_bf16(&weight);
    floatX* d_bias = device_bf16(&bias);
    floatX* d_dout = device_bf16(&dout);
    floatX* d_dweight = device_bf16(&dweight_init);
    floatX* d_dbias = device_bf16(&dbias_init);
    floatX* d_out = device_bf16_empty((size_t)N * OC);
    floatX* d_dinp = device_bf16_empty((size_t)N * C);
    float* d_scratch = (float*)cuda_malloc_checked(matmul_dbias_scratch_floats(N, OC) * sizeof(float), "dbias scratch");

    // forward, with and without bias
    float* expected = host_matmul_exact(inp.values, weight.values, bias.values, N, C, OC);
    matmul_forward(d_out, d_inp, d_weight, d_bias, N, C, OC, NULL, 0);
    uint16_t* got = download_bf16(d_out, (size_t)N * OC);
    check_bf16_exact("exact forward with bias", got, expected, (size_t)N * OC);
    free(expected); free(got);
    expected = host_matmul_exact(inp.values, weight.values, NULL, N, C, OC);
    matmul_forward(d_out, d_inp, d_weight, NULL, N, C, OC, NULL, 0);
    got = download_bf16(d_out, (size_t)N * OC);
    check_bf16_exact("exact forward without bias", got, expected, (size_t)N * OC);
    free(expected); free(got);

    // backward twice: dinp overwritten, dweight and dbias accumulated
    float* dinp_exact = (float*)calloc((size_t)N * C, sizeof(float));
    float* dweight_sum = (float*)calloc((size_t)OC * C, sizeof(float));
    float* dbias_sum = (float*)calloc((size_t)OC, sizeof(float));
    ref_matmul_backward(dinp_exact, dweight_sum, dbias_sum, dout.values, inp.values, weight.values, N, C, OC);
    double* dweight_sum_exact = (double*)mallocCheck((size_t)OC * C * sizeof(double));
    for (size_t i = 0; i < (size_t)OC * C; i++) { dweight_sum_exact[i] = dweight_sum[i]; }  // integers: exact
    float* dweight_previous = (float*)mallocCheck((size_t)OC * C * sizeof(float));
    memcpy(dweight_previous, dweight_init.values, (size_t)OC * C * sizeof(float));
    float* dbias_expected = (float*)mallocCheck((size_t)OC * sizeof(float));
    for (int o = 0; o < OC; o++) { dbias_expected[o] = dbias_init.values[o]; }
    for (int round = 1; round <= 2; round++) {
        matmul_backward(d_dinp, d_dweight, d_dbias, d_dout, d_inp, d_weight, d_scratch, N, C, OC, NULL, 0);
        // dbias (our kernel): the previous bf16 value plus the exact sum, rounded once
        for (int o = 0; o < OC; o++) {
            dbias_expected[o] = bf16_bits_to_float(float_to_bf16_bits(dbias_expected[o])) + dbias_sum[o];
        }
        char name[128];
        uint16_t* dinp_got = download_bf16(d_dinp, (size_t)N * C);
        snprintf(name, sizeof(name), "exact dinp (overwritten), backward #%d", round);
        check_bf16_exact(name, dinp_got, dinp_exact, (size_t)N * C);
        // dweight (cuBLASLt's +=): the GPU's previous value plus the exact sum, rounded once or twice
        uint16_t* dweight_got_bits = download_bf16(d_dweight, (size_t)OC * C);
        float* dweight_got = bf16_bits_to_floats(dweight_got_bits, (size_t)OC * C);
        snprintf(name, sizeof(name), "exact dweight (+=), backward #%d", round);
        CHECK(bf16_accumulate_mismatches(dweight_got, dweight_previous, dweight_sum_exact, (size_t)OC * C, name) == 0,
              "%s: not previous + the exact sum, rounded once or with the sum rounded to bf16 first", name);
        memcpy(dweight_previous, dweight_got, (size_t)OC * C * sizeof(float));
        free(dweight_got_bits);
        uint16_t* dbias_got = download_bf16(d_dbias, (size_t)OC);
        snprintf(name, sizeof(name), "exact dbias (+=), backward #%d", round);
        check_bf16_exact(name, dbias_got, dbias_expected, (size_t)OC);
        free(dinp_got); free(dweight_got); free(dbias_got);
    }

    free(dinp_exact); free(dweight_sum); free(dbias_sum); free(dweight_sum_exact); free(dweight_previous); free(dbias_expected);
    host_tensor_free(&inp); host_tensor_free(&weight); host_tensor_free(&bias); host_tensor_free(&dout);
    host_tensor_free(&dweight_init); host_tensor_free(&dbias_init);
    cudaCheck(cudaFree(d_inp)); cudaCheck(cudaFree(d_weight)); cudaCheck(cudaFree(d_bias)); cudaCheck(cudaFree(d_dout));
    cudaCheck(cudaFree(d_dweight)); cudaCheck(cudaFree(d_dbias)); cudaCheck(cudaFree(d_out)); cudaCheck(cudaFree(d_dinp));
    cudaCheck(cudaFree(d_scratch));
}

// every algorithm cuBLASLt's heuristic lists for a linear's three bf16 GEMMs (what bench_gemm's
// --algorithms times): each one exact on integers, as the first is; cudasim lists 3, summing in
// two lane counts
static void test_matmul_ranked_algorithms(int N, int C, int OC) {
    printf("matmul: every listed algorithm exact on integers: N=%d C=%d OC=%d\n", N, C, OC);
    HostTensor inp = host_tensor_integers((size_t)N * C, -3, 3);
    HostTensor weight = host_tensor_integers((size_t)OC * C, -3, 3);
    HostTensor dout = host_tensor_integers((size_t)N * OC, -3, 3);
    floatX* d_inp = device_bf16(&inp);
    floatX* d_weight = device_bf16(&weight);
    floatX* d_dout = device_bf16(&dout);
    floatX* d_out = device_bf16_empty((size_t)N * OC);
    floatX* d_dinp = device_bf16_empty((size_t)N * C);
    floatX* d_dweight = device_bf16_empty((size_t)OC * C);
    float* out_exact = host_matmul_exact(inp.values, weight.values, NULL, N, C, OC);
    float* dinp_exact = (float*)calloc((size_t)N * C, sizeof(float));
    float* dweight_exact = (float*)calloc((size_t)OC * C, sizeof(float));
    float* dbias_unused = (float*)calloc((size_t)OC, sizeof(float));
    ref_matmul_backward(dinp_exact, dweight_exact, dbias_unused, dout.values, inp.values, weight.values, N, C, OC);

    const MatmulSpec specs[3] = {matmul_forward_spec(d_out, d_inp, d_weight, NULL, N, C, OC, NULL),
                                 matmul_dgrad_spec(d_dinp, d_dout, d_weight, N, C, OC, NULL),
                                 matmul_wgrad_spec(d_dweight, d_dout, d_inp, N, C, OC)};
    const char* names[3] = {"forward", "dgrad", "wgrad (+= onto zeros)"};
    floatX* outputs[3] = {d_out, d_dinp, d_dweight};
    const float* expected[3] = {out_exact, dinp_exact, dweight_exact};
    const size_t counts[3] = {(size_t)N * OC, (size_t)N * C, (size_t)OC * C};
    for (int g = 0; g < 3; g++) {
        int listed = matmul_cublaslt_algorithms(&specs[g], MATMUL_MAX_ALGORITHMS);
        CHECK(listed >= 1, "%s: the heuristic lists no algorithm", names[g]);
#ifdef CUDASIM
        CHECK(listed == 3, "%s: cudasim's heuristic lists %d algorithms, expected 3", names[g], listed);
        CHECK(matmul_cublaslt_algorithms(&specs[g], 2) == 2, "%s: asked for at most 2, more listed", names[g]);
#endif
        for (int rank = 0; rank < listed; rank++) {
            cudaCheck(cudaMemset(outputs[g], 0, counts[g] * sizeof(floatX)));
            matmul_cublaslt_ranked(&specs[g], rank, 0);
            uint16_t* got = download_bf16(outputs[g], counts[g]);
            char what[128];
            snprintf(what, sizeof(what), "%s, algorithm %d of %d", names[g], rank, listed);
            check_bf16_exact(what, got, expected[g], counts[g]);
            free(got);
        }
    }
#ifdef CUDASIM
    // the rank reaches cublasLtMatmul: cudasim's second algorithm sums in 8 lanes along K where the
    // first takes 16 (the buffers are fully aligned), which shows where a row's +4096 (k = 0) and
    // -4096 (k = 8) share a lane and cancel before its 2^-14s (k = 16, 24) are added, or do not
    // and absorb them (a GPU's algorithms need not differ so, hence cudasim only)
    float* row_values = (float*)calloc((size_t)N * C, sizeof(float));
    float* ones = (float*)mallocCheck((size_t)OC * C * sizeof(float));
    for (int n = 0; n < N; n++) {
        row_values[(size_t)n * C + 0] = 4096.0f;
        row_values[(size_t)n * C + 8] = -4096.0f;
        row_values[(size_t)n * C + 16] = row_values[(size_t)n * C + 24] = 0x1p-14f;
    }
    for (size_t i = 0; i < (size_t)OC * C; i++) { ones[i] = 1.0f; }
    HostTensor cancelling = host_tensor_from_floats(row_values, (size_t)N * C);
    HostTensor all_ones = host_tensor_from_floats(ones, (size_t)OC * C);
    device_bf16_set(d_inp, &cancelling);
    device_bf16_set(d_weight, &all_ones);
    const float by_rank[2] = {0.0f, 0x1p-13f};
    for (int rank = 0; rank < 2; rank++) {
        matmul_cublaslt_ranked(&specs[0], rank, 0);
        uint16_t* got = download_bf16(d_out, counts[0]);
        CHECK(bf16_bits_to_float(got[0]) == by_rank[rank], "cancelling rows, algorithm %d: %g, expected %g", rank,
              (double)bf16_bits_to_float(got[0]), (double)by_rank[rank]);
        free(got);
    }
    free(row_values); free(ones);
    host_tensor_free(&cancelling); host_tensor_free(&all_ones);
#endif
    free(out_exact); free(dinp_exact); free(dweight_exact); free(dbias_unused);
    host_tensor_free(&inp); host_tensor_free(&weight); host_tensor_free(&dout);
    cudaCheck(cudaFree(d_inp)); cudaCheck(cudaFree(d_weight)); cudaCheck(cudaFree(d_dout));
    cudaCheck(cudaFree(d_out)); cudaCheck(cudaFree(d_dinp)); cudaCheck(cudaFree(d_dweight));
}

// operands at offsets from cudaMalloc's 256-byte alignment, as per-layer slices of the parameter and
// activation buffers can be: the heuristic must be told each pointer's own alignment (cudasim refuses
// a pointer below what the algorithm was chosen for). The weight (cuBLASLt's A) 16 bytes past, the
// output 32 past, the input (B) aligned; exact on integers
static void test_matmul_offset_operands(int N, int C, int OC) {
    printf("matmul forward on offset operands: N=%d C=%d OC=%d\n", N, C, OC);
    HostTensor inp = host_tensor_integers((size_t)N * C, -3, 3);
    HostTensor weight = host_tensor_integers((size_t)OC * C, -3, 3);
    floatX* d_inp = device_bf16(&inp);
    floatX* weight_buffer = device_bf16_empty((size_t)OC * C + 8);
    floatX* out_buffer = device_bf16_empty((size_t)N * OC + 16);
    floatX* d_weight = weight_buffer + 8;  // 16 bytes
    floatX* d_out = out_buffer + 16;       // 32 bytes
    device_bf16_set(d_weight, &weight);
    float* expected = host_matmul_exact(inp.values, weight.values, NULL, N, C, OC);
    matmul_forward(d_out, d_inp, d_weight, NULL, N, C, OC, NULL, 0);
    uint16_t* got = download_bf16(d_out, (size_t)N * OC);
    check_bf16_exact("exact forward on offset operands", got, expected, (size_t)N * OC);
    free(expected); free(got);
    host_tensor_free(&inp); host_tensor_free(&weight);
    cudaCheck(cudaFree(d_inp)); cudaCheck(cudaFree(weight_buffer)); cudaCheck(cudaFree(out_buffer));
}

// ----------------------------------------------------------------------------
// matmul: Gaussian data, bias and GELU fusion, determinism

#define MATMUL_RTOL (1.0 / 256.0)
#define MATMUL_ATOL 1e-3
#define GELU_RTOL (1.0 / 128.0)
#define GELU_ATOL 2e-3
#define DGELU_RTOL (1.0 / 64.0)

static void test_matmul_forward_gaussian(int N, int C, int OC, bool with_bias, bool with_gelu) {
    printf("matmul forward: N=%d C=%d OC=%d bias=%d gelu=%d\n", N, C, OC, (int)with_bias, (int)with_gelu);
    HostTensor inp = host_tensor_normal((size_t)N * C, 1.0f);
    HostTensor weight = host_tensor_normal((size_t)OC * C, 1.0f / sqrtf((float)C));
    HostTensor bias = host_tensor_normal((size_t)OC, 0.5f);
    floatX* d_inp = device_bf16(&inp);
    floatX* d_weight = device_bf16(&weight);
    floatX* d_bias = with_bias ? device_bf16(&bias) : NULL;
    floatX* d_out = device_bf16_empty((size_t)N * OC);
    floatX* d_pre = with_gelu ? device_bf16_empty((size_t)N * OC) : NULL;
    size_t count = (size_t)N * OC;

    float* pre_expected = (float*)mallocCheck(count * sizeof(float));
    ref_matmul_forward(pre_expected, inp.values, weight.values, with_bias ? bias.values : NULL, N, C, OC);
    matmul_forward(d_out, d_inp, d_weight, d_bias, N, C, OC, d_pre, 0);
    uint16_t* out_first = download_bf16(d_out, count);
    char name[160];
    if (with_gelu) {
        float* out_expected = (float*)mallocCheck(count * sizeof(float));
        ref_gelu_forward(out_expected, pre_expected, (int)count);
        uint16_t* pre_got = download_bf16(d_pre, count);
        snprintf(name, sizeof(name), "forward pre-GELU N=%d C=%d OC=%d bias=%d", N, C, OC, (int)with_bias);
        check_bf16_close(name, pre_got, pre_expected, count, MATMUL_ATOL, MATMUL_RTOL);
        snprintf(name, sizeof(name), "forward GELU output N=%d C=%d OC=%d bias=%d", N, C, OC, (int)with_bias);
        check_bf16_close(name, out_first, out_expected, count, GELU_ATOL, GELU_RTOL);
        free(out_expected); free(pre_got);
    } else {
        snprintf(name, sizeof(name), "forward N=%d C=%d OC=%d bias=%d", N, C, OC, (int)with_bias);
        check_bf16_close(name, out_first, pre_expected, count, MATMUL_ATOL, MATMUL_RTOL);
    }
    matmul_forward(d_out, d_inp, d_weight, d_bias, N, C, OC, d_pre, 0);
    uint16_t* out_second = download_bf16(d_out, count);
    snprintf(name, sizeof(name), "forward determinism N=%d C=%d OC=%d", N, C, OC);
    check_bitwise_equal(name, out_first, out_second, count * sizeof(uint16_t));

    free(pre_expected); free(out_first); free(out_second);
    host_tensor_free(&inp); host_tensor_free(&weight); host_tensor_free(&bias);
    cudaCheck(cudaFree(d_inp)); cudaCheck(cudaFree(d_weight)); cudaCheck(cudaFree(d_out));
    if (d_bias != NULL) { cudaCheck(cudaFree(d_bias)); }
    if (d_pre != NULL) { cudaCheck(cudaFree(d_pre)); }
}

// runs matmul_backward from the initial gradients and downloads dinp, dweight, dbias
static void run_matmul_backward(uint16_t** dinp, uint16_t** dweight, uint16_t** dbias,
                                floatX* d_dinp, floatX* d_dweight, floatX* d_dbias, float* d_scratch,
                                const HostTensor* dweight_init, const HostTensor* dbias_init,
                                const floatX* d_dout, const floatX* d_inp, const floatX* d_weight,
                                const floatX* d_pre, int N, int C, int OC) {
    device_bf16_set(d_dweight, dweight_init);
    if (d_dbias != NULL) { device_bf16_set(d_dbias, dbias_init); }
    matmul_backward(d_dinp, d_dweight, d_dbias, d_dout, d_inp, d_weight, d_scratch, N, C, OC, d_pre, 0);
    *dinp = download_bf16(d_dinp, (size_t)N * C);
    *dweight = download_bf16(d_dweight, (size_t)OC * C);
    *dbias = d_dbias != NULL ? download_bf16(d_dbias, (size_t)OC) : NULL;
}

static void test_matmul_backward_gaussian(int N, int C, int OC, bool with_bias, bool with_gelu) {
    printf("matmul backward: N=%d C=%d OC=%d bias=%d gelu=%d\n", N, C, OC, (int)with_bias, (int)with_gelu);
    HostTensor pre = host_tensor_normal((size_t)N * C, 1.0f);
    float* gelu_of_pre = (float*)mallocCheck((size_t)N * C * sizeof(float));
    ref_gelu_forward(gelu_of_pre, pre.values, N * C);
    // the matmul's input: gelu(pre) when the GELU is fused, else independent Gaussian data
    HostTensor inp = with_gelu ? host_tensor_from_floats(gelu_of_pre, (size_t)N * C) : host_tensor_normal((size_t)N * C, 1.0f);
    HostTensor weight = host_tensor_normal((size_t)OC * C, 1.0f / sqrtf((float)OC));
    HostTensor dout = host_tensor_normal((size_t)N * OC, 1.0f);
    HostTensor dweight_init = host_tensor_normal((size_t)OC * C, 1.0f);
    HostTensor dbias_init = host_tensor_normal((size_t)OC, 1.0f);
    floatX* d_pre = with_gelu ? device_bf16(&pre) : NULL;
    floatX* d_inp = device_bf16(&inp);
    floatX* d_weight = device_bf16(&weight);
    floatX* d_dout = device_bf16(&dout);
    floatX* d_dinp = device_bf16_empty((size_t)N * C);
    floatX* d_dweight = device_bf16_empty((size_t)OC * C);
    floatX* d_dbias = with_bias ? device_bf16_empty((size_t)OC) : NULL;
    float* d_scratch = with_bias ? (float*)cuda_malloc_checked(matmul_dbias_scratch_floats(N, OC) * sizeof(float), "dbias scratch") : NULL;

    // reference: dinp from zero (then times gelu'), dweight and dbias from their initial values
    float* dinp_expected = (float*)calloc((size_t)N * C, sizeof(float));
    float* dweight_expected = (float*)mallocCheck((size_t)OC * C * sizeof(float));
    float* dbias_expected = (float*)mallocCheck((size_t)OC * sizeof(float));
    memcpy(dweight_expected, dweight_init.values, (size_t)OC * C * sizeof(float));
    memcpy(dbias_expected, dbias_init.values, (size_t)OC * sizeof(float));
    ref_matmul_backward(dinp_expected, dweight_expected, with_bias ? dbias_expected : NULL, dout.values, inp.values,
                        weight.values, N, C, OC);
    if (with_gelu) {
        for (size_t i = 0; i < (size_t)N * C; i++) { dinp_expected[i] *= gelu_backward_element(pre.values[i]); }
    }

    uint16_t *dinp1, *dweight1, *dbias1, *dinp2, *dweight2, *dbias2;
    run_matmul_backward(&dinp1, &dweight1, &dbias1, d_dinp, d_dweight, d_dbias, d_scratch, &dweight_init, &dbias_init,
                        d_dout, d_inp, d_weight, d_pre, N, C, OC);
    run_matmul_backward(&dinp2, &dweight2, &dbias2, d_dinp, d_dweight, d_dbias, d_scratch, &dweight_init, &dbias_init,
                        d_dout, d_inp, d_weight, d_pre, N, C, OC);
    char name[160];
    snprintf(name, sizeof(name), "backward dinp N=%d C=%d OC=%d gelu=%d", N, C, OC, (int)with_gelu);
    check_bf16_close(name, dinp1, dinp_expected, (size_t)N * C, MATMUL_ATOL, with_gelu ? DGELU_RTOL : MATMUL_RTOL);
    snprintf(name, sizeof(name), "backward dweight (+=) N=%d C=%d OC=%d", N, C, OC);
    float* dweight1_values = bf16_bits_to_floats(dweight1, (size_t)OC * C);
    check_close_accumulated(name, dweight1_values, dweight_expected, dweight_init.values, (size_t)OC * C, MATMUL_ATOL,
                            MATMUL_RTOL);
    free(dweight1_values);
    snprintf(name, sizeof(name), "backward determinism N=%d C=%d OC=%d", N, C, OC);
    check_bitwise_equal(name, dinp1, dinp2, (size_t)N * C * sizeof(uint16_t));
    check_bitwise_equal(name, dweight1, dweight2, (size_t)OC * C * sizeof(uint16_t));
    if (with_bias) {
        snprintf(name, sizeof(name), "backward dbias (+=) N=%d OC=%d", N, OC);
        check_bf16_close(name, dbias1, dbias_expected, (size_t)OC, MATMUL_ATOL, MATMUL_RTOL);
        snprintf(name, sizeof(name), "dbias determinism N=%d OC=%d", N, OC);
        check_bitwise_equal(name, dbias1, dbias2, (size_t)OC * sizeof(uint16_t));
        free(dbias1); free(dbias2);
    }

    free(dinp1); free(dweight1); free(dinp2); free(dweight2);
    free(gelu_of_pre); free(dinp_expected); free(dweight_expected); free(dbias_expected);
    host_tensor_free(&pre); host_tensor_free(&inp); host_tensor_free(&weight); host_tensor_free(&dout);
    host_tensor_free(&dweight_init); host_tensor_free(&dbias_init);
    cudaCheck(cudaFree(d_inp)); cudaCheck(cudaFree(d_weight)); cudaCheck(cudaFree(d_dout));
    cudaCheck(cudaFree(d_dinp)); cudaCheck(cudaFree(d_dweight));
    if (d_pre != NULL) { cudaCheck(cudaFree(d_pre)); }
    if (d_dbias != NULL) { cudaCheck(cudaFree(d_dbias)); cudaCheck(cudaFree(d_scratch)); }
}

// ----------------------------------------------------------------------------
// attention

typedef struct {
    int B, T, NH, C;
    HostTensor qkv;
    HostTensor dout;
    float* out_ref;  // [B][T][C]
    float* lse_ref;  // [B][NH][T]
} AttentionCase;

static AttentionCase attention_case_make_std(int B, int T, int NH, int C, float qkv_std) {
    AttentionCase c;
    c.B = B; c.T = T; c.NH = NH; c.C = C;
    c.qkv = host_tensor_normal((size_t)B * T * 3 * C, qkv_std);
    c.dout = host_tensor_normal((size_t)B * T * C, 1.0f);
    c.out_ref = (float*)mallocCheck((size_t)B * T * C * sizeof(float));
    c.lse_ref = (float*)mallocCheck((size_t)B * NH * T * sizeof(float));
    ref_attention_forward(c.out_ref, c.lse_ref, c.qkv.values, B, T, C, NH);
    return c;
}

static AttentionCase attention_case_make(int B, int T, int NH, int C) {
    return attention_case_make_std(B, T, NH, C, 1.5f);  // std 1.5: peaked rows as well as flat ones
}

static void attention_case_free(AttentionCase* c) {
    host_tensor_free(&c->qkv); host_tensor_free(&c->dout);
    free(c->out_ref); free(c->lse_ref);
}

// what one backend produced for a case (host copies, out and dqkv converted to float), and
// the reference backward computed from this very forward's out and stats (the backward's
// inputs: a reference fed its own fp32 out would differ by the bf16 rounding of out, which
// D = dout.out carries into dq and dk)
typedef struct {
    float* out;
    float* stats;
    float* dqkv;
    float* dqkv_ref;
} AttentionResult;

typedef struct {
    double out_atol, out_rtol, stats_atol, grad_atol_of_rms, grad_rtol, grad_relative_l2;
} AttentionTolerance;

static const AttentionTolerance FALLBACK_TOLERANCE = {1e-3, 1.0 / 256.0, 1e-4, 1e-2, 1e-2, 5e-3};
#ifndef LLM8_NO_CUDNN
static const AttentionTolerance CUDNN_TOLERANCE = {1e-2, 1e-2, 1e-3, 5e-2, 5e-2, 2e-2};
#endif

static void attention_result_free(AttentionResult* r) {
    free(r->out); free(r->stats); free(r->dqkv); free(r->dqkv_ref);
}

static const char* backend_name(AttentionBackend backend) {
    return backend == ATTENTION_CUDNN ? "cudnn" : "fallback";
}

// dq, dk or dv (part 0, 1, 2) of a [B*T][3][C] tensor
static float* qkv_part(const float* dqkv, size_t rows, int C, int part) {
    float* x = (float*)mallocCheck(rows * C * sizeof(float));
    for (size_t r = 0; r < rows; r++) { memcpy(x + r * C, dqkv + (r * 3 + part) * C, C * sizeof(float)); }
    return x;
}

static void check_attention_forward(const char* label, const AttentionCase* c, const float* out, const float* stats,
                                    const float* out_expected, const float* stats_expected, AttentionTolerance tol) {
    char name[200];
    snprintf(name, sizeof(name), "%s T=%d HS=%d: out", label, c->T, c->C / c->NH);
    check_close(name, out, out_expected, (size_t)c->B * c->T * c->C, tol.out_atol, tol.out_rtol);
    snprintf(name, sizeof(name), "%s T=%d HS=%d: stats (lse)", label, c->T, c->C / c->NH);
    check_close(name, stats, stats_expected, (size_t)c->B * c->NH * c->T, tol.stats_atol, 0.0);
}

static void check_attention_backward(const char* label, const AttentionCase* c, const float* dqkv,
                                     const float* dqkv_expected, AttentionTolerance tol) {
    size_t rows = (size_t)c->B * c->T;
    const char* parts[3] = {"dq", "dk", "dv"};
    for (int part = 0; part < 3; part++) {
        float* got = qkv_part(dqkv, rows, c->C, part);
        float* expected = qkv_part(dqkv_expected, rows, c->C, part);
        char name[200];
        snprintf(name, sizeof(name), "%s T=%d HS=%d: %s", label, c->T, c->C / c->NH, parts[part]);
        check_close_scaled(name, got, expected, rows * c->C, tol.grad_atol_of_rms, tol.grad_rtol, tol.grad_relative_l2);
        free(got); free(expected);
    }
}

// device copies of a case's inputs and outputs
typedef struct {
    floatX* qkv;
    floatX* dout;
    floatX* out;
    floatX* dqkv;
    float* stats;
} AttentionBuffers;

static AttentionBuffers attention_buffers_make(const AttentionCase* c) {
    AttentionBuffers d;
    d.qkv = device_bf16(&c->qkv);
    d.dout = device_bf16(&c->dout);
    d.out = device_bf16_empty((size_t)c->B * c->T * c->C);
    d.dqkv = device_bf16_empty((size_t)c->B * c->T * 3 * c->C);
    d.stats = (float*)cuda_malloc_checked((size_t)c->B * c->NH * c->T * sizeof(float), "attention stats");
    return d;
}

static void attention_buffers_free(AttentionBuffers* d) {
    cudaCheck(cudaFree(d->qkv)); cudaCheck(cudaFree(d->dout)); cudaCheck(cudaFree(d->out));
    cudaCheck(cudaFree(d->dqkv)); cudaCheck(cudaFree(d->stats));
}

// dqkv is filled with NaN bits first: the backward must overwrite every element
static float* run_attention_backward(const AttentionCase* c, AttentionBuffers* d) {
    size_t qkv_count = (size_t)c->B * c->T * 3 * c->C;
    cudaCheck(cudaMemset(d->dqkv, 0xff, qkv_count * sizeof(floatX)));
    attention_backward(d->dqkv, d->dout, d->qkv, d->out, d->stats, c->B, c->T, c->NH, c->C, 0);
    uint16_t* bits = download_bf16(d->dqkv, qkv_count);
    float* dqkv = bf16_bits_to_floats(bits, qkv_count);
    free(bits);
    return dqkv;
}

// forward and backward twice with one backend: checks the runs are bitwise equal (the backward
// only where it is the deterministic one), returns the first
static AttentionResult run_attention(AttentionBackend backend, bool deterministic_backward, const AttentionCase* c) {
    size_t out_count = (size_t)c->B * c->T * c->C, stats_count = (size_t)c->B * c->NH * c->T;
    size_t qkv_count = out_count * 3;
    AttentionBuffers d = attention_buffers_make(c);
    attention_setup(backend, deterministic_backward);
    AttentionResult runs[2];
    for (int run = 0; run < 2; run++) {
        attention_forward(d.out, d.stats, d.qkv, c->B, c->T, c->NH, c->C, 0);
        uint16_t* out_bits = download_bf16(d.out, out_count);
        runs[run].out = bf16_bits_to_floats(out_bits, out_count);
        free(out_bits);
        runs[run].stats = download_floats(d.stats, stats_count);
        runs[run].dqkv = run_attention_backward(c, &d);
        runs[run].dqkv_ref = NULL;
    }
    attention_teardown();
    attention_buffers_free(&d);
    char name[160];
    snprintf(name, sizeof(name), "%s T=%d HS=%d determinism", backend_name(backend), c->T, c->C / c->NH);
    check_bitwise_equal(name, runs[0].out, runs[1].out, out_count * sizeof(float));
    check_bitwise_equal(name, runs[0].stats, runs[1].stats, stats_count * sizeof(float));
    if (deterministic_backward) { check_bitwise_equal(name, runs[0].dqkv, runs[1].dqkv, qkv_count * sizeof(float)); }
    attention_result_free(&runs[1]);
    runs[0].dqkv_ref = (float*)calloc(qkv_count, sizeof(float));
    ref_attention_backward(runs[0].dqkv_ref, c->dout.values, c->qkv.values, runs[0].out, runs[0].stats,
                           c->B, c->T, c->C, c->NH);
    return runs[0];
}

#ifndef LLM8_NO_CUDNN
// the fallback backward fed with another backend's forward (its out and stats)
static float* run_fallback_backward_on(const AttentionCase* c, const AttentionResult* forward) {
    size_t out_count = (size_t)c->B * c->T * c->C, stats_count = (size_t)c->B * c->NH * c->T;
    AttentionBuffers d = attention_buffers_make(c);
    HostTensor out = host_tensor_from_floats(forward->out, out_count);  // bf16 values: exact round trip
    device_bf16_set(d.out, &out);
    cudaCheck(cudaMemcpy(d.stats, forward->stats, stats_count * sizeof(float), cudaMemcpyHostToDevice));
    attention_setup(ATTENTION_FALLBACK, true);
    float* dqkv = run_attention_backward(c, &d);
    attention_teardown();
    host_tensor_free(&out);
    attention_buffers_free(&d);
    return dqkv;
}
#endif

static void test_attention(int B, int T, int NH, int C) {
    printf("attention: B=%d T=%d NH=%d HS=%d\n", B, T, NH, C / NH);
    AttentionCase c = attention_case_make(B, T, NH, C);
    AttentionResult fallback = run_attention(ATTENTION_FALLBACK, true, &c);
    check_attention_forward("fallback vs reference", &c, fallback.out, fallback.stats, c.out_ref, c.lse_ref,
                            FALLBACK_TOLERANCE);
    check_attention_backward("fallback vs reference", &c, fallback.dqkv, fallback.dqkv_ref, FALLBACK_TOLERANCE);
#ifndef LLM8_NO_CUDNN
    AttentionResult cudnn = run_attention(ATTENTION_CUDNN, true, &c);
    check_attention_forward("cudnn vs reference", &c, cudnn.out, cudnn.stats, c.out_ref, c.lse_ref, CUDNN_TOLERANCE);
    check_attention_backward("cudnn vs reference", &c, cudnn.dqkv, cudnn.dqkv_ref, CUDNN_TOLERANCE);
    check_attention_forward("cudnn vs fallback", &c, cudnn.out, cudnn.stats, fallback.out, fallback.stats,
                            CUDNN_TOLERANCE);
    check_attention_backward("cudnn vs fallback", &c, cudnn.dqkv, fallback.dqkv, CUDNN_TOLERANCE);
    // the stats are interchangeable: the fallback backward on cuDNN's forward is as exact as on its own
    float* mixed = run_fallback_backward_on(&c, &cudnn);
    check_attention_backward("fallback backward on cudnn forward", &c, mixed, cudnn.dqkv_ref, FALLBACK_TOLERANCE);
    free(mixed);
    attention_result_free(&cudnn);
    // -ad 0: cuDNN's backward with float atomics, as exact as the deterministic one
    AttentionResult atomics = run_attention(ATTENTION_CUDNN, false, &c);
    check_attention_forward("cudnn (atomics backward) vs reference", &c, atomics.out, atomics.stats, c.out_ref, c.lse_ref,
                            CUDNN_TOLERANCE);
    check_attention_backward("cudnn atomics backward vs reference", &c, atomics.dqkv, atomics.dqkv_ref, CUDNN_TOLERANCE);
    attention_result_free(&atomics);
#endif
    attention_result_free(&fallback);
    attention_case_free(&c);
}

// scores far past fp32 exp's range: qkv of std 8 puts the scaled scores at std ~64, so rows peak
// in the hundreds, where expf overflows (above ~88.7). Only a softmax that subtracts the running
// row max (the forward) and the lse (the backward) stays finite; at std 1.5 the scores stay
// within +-20 and a softmax without the max subtraction passes. The fallback only: the bounds
// claimed for cuDNN are those of the std-1.5 cases.
static void test_attention_large_scores(int B, int T, int NH, int C) {
    printf("attention, large scores (qkv std 8): B=%d T=%d NH=%d HS=%d\n", B, T, NH, C / NH);
    AttentionCase c = attention_case_make_std(B, T, NH, C, 8.0f);
    AttentionResult fallback = run_attention(ATTENTION_FALLBACK, true, &c);
    check_attention_forward("fallback vs reference, large scores", &c, fallback.out, fallback.stats, c.out_ref, c.lse_ref,
                            FALLBACK_TOLERANCE);
    check_attention_backward("fallback vs reference, large scores", &c, fallback.dqkv, fallback.dqkv_ref,
                             FALLBACK_TOLERANCE);
    attention_result_free(&fallback);
    attention_case_free(&c);
}

// one attention_setup, then a larger shape after a smaller one: the backward's row-dot buffer
// (D_i, B*NH*T floats) must grow on the larger. run_attention sets up and tears down around each
// shape, so only this reaches the growth; a buffer kept at the first shape's size is written past.
static void test_attention_row_dots_grow(void) {
    printf("attention: a larger shape after a smaller one under one setup\n");
    AttentionCase small = attention_case_make(1, 32, 2, 128);
    AttentionCase large = attention_case_make(2, 64, 2, 128);
    AttentionBuffers d_small = attention_buffers_make(&small), d_large = attention_buffers_make(&large);
    attention_setup(ATTENTION_FALLBACK, true);
    const AttentionCase* cases[2] = {&small, &large};
    AttentionBuffers* buffers[2] = {&d_small, &d_large};
    AttentionResult results[2];
    for (int k = 0; k < 2; k++) {
        const AttentionCase* c = cases[k];
        AttentionBuffers* d = buffers[k];
        size_t out_count = (size_t)c->B * c->T * c->C, stats_count = (size_t)c->B * c->NH * c->T;
        attention_forward(d->out, d->stats, d->qkv, c->B, c->T, c->NH, c->C, 0);
        uint16_t* out_bits = download_bf16(d->out, out_count);
        results[k].out = bf16_bits_to_floats(out_bits, out_count);
        free(out_bits);
        results[k].stats = download_floats(d->stats, stats_count);
        results[k].dqkv = run_attention_backward(c, d);
        results[k].dqkv_ref = (float*)calloc(out_count * 3, sizeof(float));
        ref_attention_backward(results[k].dqkv_ref, c->dout.values, c->qkv.values, results[k].out, results[k].stats,
                               c->B, c->T, c->C, c->NH);
    }
    attention_teardown();
    check_attention_backward("fallback, smaller shape first", &small, results[0].dqkv, results[0].dqkv_ref,
                             FALLBACK_TOLERANCE);
    check_attention_backward("fallback, larger shape second", &large, results[1].dqkv, results[1].dqkv_ref,
                             FALLBACK_TOLERANCE);
    for (int k = 0; k < 2; k++) { attention_result_free(&results[k]); }
    attention_buffers_free(&d_small);
    attention_buffers_free(&d_large);
    attention_case_free(&small);
    attention_case_free(&large);
}

// the launchers' host checks the bad-input section leaves out (each statement dies before any
// CUDA call): C not a multiple of NH (770 / 12 truncates to the supported 64), forward's out
// pointer misaligned, a second attention_setup, a launch before attention_setup
static void test_attention_more_bad_input(void) {
    floatX* fake = (floatX*)(uintptr_t)0x100000;  // aligned, never dereferenced
    CHECK_DIES("attention C not a multiple of NH", "multiple of NH",
               { attention_setup(ATTENTION_FALLBACK, true); attention_forward(fake, (float*)fake, fake, 2, 64, 12, 770, 0); });
    CHECK_DIES("attention forward out pointer not 16-byte aligned", "out pointer",
               { attention_setup(ATTENTION_FALLBACK, true); attention_forward(fake + 1, (float*)fake, fake, 2, 64, 12, 768, 0); });
    CHECK_DIES("attention_setup twice", "called twice",
               { attention_setup(ATTENTION_FALLBACK, true); attention_setup(ATTENTION_FALLBACK, true); });
    CHECK_DIES("attention before attention_setup", "before attention_setup",
               attention_forward(fake, (float*)fake, fake, 2, 64, 12, 768, 0));
}

// a GEMM spec that passes matmul_check_spec's every rule on fake aligned pointers (never run): an
// FP8 TN GEMM (E4M3 x E4M3 into bf16, per-tensor scales) or a bf16 one; each case below breaks one
// rule, and before matmul_setup the spec left as it is dies for that alone
static MatmulSpec spec_check_base(bool fp8) {
    MatmulSpec spec = {};
    spec.name = fp8 ? "fp8 spec check" : "bf16 spec check";
    spec.m = 768; spec.n = 256; spec.k = 768;
    spec.a = (const void*)(uintptr_t)0x100000; spec.b = (const void*)(uintptr_t)0x200000; spec.d = (void*)(uintptr_t)0x300000;
    spec.a_type = fp8 ? CUDA_R_8F_E4M3 : CUDA_R_16BF; spec.b_type = spec.a_type; spec.d_type = CUDA_R_16BF;
    spec.transpose_a = true;
    spec.epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    if (fp8) { spec.a_scale = (const float*)(uintptr_t)0x400000; spec.b_scale = (const float*)(uintptr_t)0x400010; }
    return spec;
}

// the spec's checks one rule at a time (each dies in a forked child before any CUDA call)
static void test_matmul_spec_checks(void) {
    for (int fp8 = 0; fp8 < 2; fp8++) {
        MatmulSpec spec = spec_check_base(fp8);
        CHECK_DIES(fp8 ? "fp8 spec before matmul_setup" : "bf16 spec before matmul_setup", "called before matmul_setup",
                   matmul_cublaslt(&spec, 0));
    }
    MatmulSpec spec = spec_check_base(true);
    spec.k = 776;  // a multiple of 8 elements, not of FP8's 16
    CHECK_DIES("fp8 K not a multiple of 16", "positive multiple of 16", matmul_cublaslt(&spec, 0));
    spec = spec_check_base(false);
    spec.n = 0;
    CHECK_DIES("bf16 GEMM of no columns", "positive multiple of 8", matmul_cublaslt(&spec, 0));
    spec = spec_check_base(false);
    spec.d = (void*)(uintptr_t)0x300008;
    CHECK_DIES("D pointer 8 bytes past alignment", "D pointer 0x300008 is not 16-byte aligned", matmul_cublaslt(&spec, 0));
    spec = spec_check_base(false);
    spec.epilogue = CUBLASLT_EPILOGUE_BIAS;
    CHECK_DIES("BIAS epilogue without a bias", "does not match the bias/aux pointers", matmul_cublaslt(&spec, 0));
    spec.bias = (const void*)(uintptr_t)0x500008;
    CHECK_DIES("bias 8 bytes past alignment", "bias pointer 0x500008 is not 16-byte aligned", matmul_cublaslt(&spec, 0));
    spec = spec_check_base(false);
    spec.epilogue = CUBLASLT_EPILOGUE_GELU_AUX;
    spec.aux = (void*)(uintptr_t)0x600008;
    CHECK_DIES("GELU aux 8 bytes past alignment", "pre-activation pointer 0x600008 is not 16-byte aligned",
               matmul_cublaslt(&spec, 0));
    spec = spec_check_base(false);
    spec.a_scale = (const float*)(uintptr_t)0x400000;
    CHECK_DIES("bf16 GEMM with an A scale", "are for FP8 operands", matmul_cublaslt(&spec, 0));
    spec = spec_check_base(true);
    spec.b_type = CUDA_R_16BF;
    CHECK_DIES("fp8 A with a bf16 B", "FP8 needs both operands in FP8", matmul_cublaslt(&spec, 0));
    spec = spec_check_base(true);
    spec.a_type = CUDA_R_8F_E5M2; spec.b_type = CUDA_R_8F_E5M2;
    CHECK_DIES("fp8 E5M2 x E5M2", "E5M2 x E5M2", matmul_cublaslt(&spec, 0));
    spec = spec_check_base(true);
    spec.transpose_a = false;  // NN: A not contiguous along K
    CHECK_DIES("fp8 NN layout", "the TN layout", matmul_cublaslt(&spec, 0));
    spec = spec_check_base(true);
    spec.a_scale_mode = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F; spec.b_scale_mode = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
    spec.fast_accumulate = true;
    CHECK_DIES("fp8 block scaling with fast accumulation", "block scaling takes no fast accumulation", matmul_cublaslt(&spec, 0));
    CHECK_DIES("matmul_setup twice", "matmul_setup called twice", { matmul_setup(); matmul_setup(); });
}

// ----------------------------------------------------------------------------
// bad input: each runs in a forked child before this process touches CUDA

static void test_bad_input(void) {
    floatX* fake = (floatX*)(uintptr_t)0x100000;  // aligned, never dereferenced: the checks come first
    CHECK_DIES("matmul C not a multiple of 8", "multiple of 8",
               matmul_forward(fake, fake, fake, NULL, 256, 770, 2304, NULL, 0));
    CHECK_DIES("matmul OC not a multiple of 8", "multiple of 8",
               matmul_forward(fake, fake, fake, NULL, 256, 768, 2302, NULL, 0));
    CHECK_DIES("fp8 matmul B*T not a multiple of 16", "multiple of 16",
               {
                   MatmulSpec spec = {};  // an FP8 forward of 189 tokens
                   spec.name = "fp8 test"; spec.m = 768; spec.n = 189; spec.k = 768; spec.transpose_a = true;
                   spec.a = fake; spec.b = fake; spec.d = fake;
                   spec.a_type = CUDA_R_8F_E4M3; spec.b_type = CUDA_R_8F_E4M3; spec.d_type = CUDA_R_16BF;
                   matmul_cublaslt(&spec, 0);
               });
    CHECK_DIES("matmul misaligned pointer", "not 16-byte aligned",
               matmul_forward(fake, fake + 1, fake, NULL, 256, 768, 2304, NULL, 0));
    CHECK_DIES("fallback attention head size 96", "head size",
               { attention_setup(ATTENTION_FALLBACK, true); attention_forward(fake, NULL, fake, 2, 64, 8, 768, 0); });
    CHECK_DIES("attention stats pointer not 16-byte aligned", "stats pointer",
               { attention_setup(ATTENTION_FALLBACK, true); attention_backward(fake, fake, fake, fake, (const float*)fake + 2, 2, 64, 12, 768, 0); });
#ifdef LLM8_NO_CUDNN
    CHECK_DIES("cudnn attention in a build without cuDNN", "no cuDNN", attention_setup(ATTENTION_CUDNN, true));
#endif
    test_matmul_spec_checks();
}

int main(void) {
    manual_seed(&test_rng, 42);
    test_bad_input();

    int device_count = 0;
    bool has_gpu = cudaGetDeviceCount(&device_count) == cudaSuccess && device_count > 0;
    CHECK(has_gpu, "no CUDA GPU found: the GPU tests need one (make gpucheck on an H100/H200)");
    if (!has_gpu) { return test_summary("test_matmul_attention"); }
    matmul_setup();
    test_matmul_exact(256, 768, 2304);
    // 130 bias chunks, the last one short: the finish kernel stages 128 at a time; and 40
    // columns, the second block of 32 partly past OC
    test_matmul_exact(128 * 129 + 40, 16, 40);
    test_matmul_forward_gaussian(256, 768, 2304, true, false);   // qkv
    test_matmul_forward_gaussian(256, 768, 3072, true, true);    // fc with GELU_AUX_BIAS
    test_matmul_forward_gaussian(256, 768, 3072, false, true);   // GELU_AUX
    test_matmul_forward_gaussian(256, 768, 2304, false, false);
    test_matmul_backward_gaussian(256, 768, 2304, true, false);  // qkv
    test_matmul_backward_gaussian(256, 3072, 768, true, true);   // fcproj: its input is gelu(fc)
    test_matmul_backward_gaussian(256, 768, 3072, false, false); // no bias
    test_matmul_backward_gaussian(2056, 64, 264, true, false);   // a partial dbias row chunk, OC not a multiple of 256
    // B*T = 189 tokens (-b 3 -t 63): a bf16 GEMM takes any token count, as llm.c's do (only the leading
    // dimensions keep columns 16-byte aligned); the wgrad's K and the dbias row chunks are then odd
    test_matmul_exact(189, 64, 40);
    test_matmul_forward_gaussian(189, 128, 512, true, true);
    test_matmul_backward_gaussian(189, 512, 128, true, true);
    test_matmul_offset_operands(64, 64, 64);
    test_matmul_ranked_algorithms(128, 64, 96);
    matmul_teardown();

    test_attention(2, 64, 12, 768);
    test_attention(2, 128, 12, 768);
#ifdef CUDASIM
    test_attention(1, 1024, 2, 128);  // the long sequence with 2 heads: a CPU runs 24 in minutes
#else
    test_attention(2, 1024, 12, 768);
#endif
    test_attention(1, 128, 6, 768);  // HS=128
    test_attention(3, 63, 2, 128);   // an odd T (-b 3 -t 63): B*NH*T stats floats, not a multiple of 4
    test_attention_large_scores(2, 64, 2, 128);  // two key chunks a row: the running max grows between them
    test_attention_row_dots_grow();
    test_attention_more_bad_input();
    return test_summary("test_matmul_attention");
}
