/*
test_kernels.cu: every non-matmul kernel against the fp32 CPU reference (test/gpt2_ref.h),
run twice for bitwise determinism, at a realistic shape (B=4, T=64, C=768, V=50257,
Vp=50304) and an odd small one (B=3, T=5, C=40, V=97, Vp=104: C not a multiple of 64, a
row shorter than a warp's reach, V not a multiple of 8). Runs on a GPU under make gpucheck, and under cudasim in make test.

Inputs are random bf16; the reference gets the same values converted to fp32. Tolerances,
per element |gpu - ref| <= atol + rtol * |ref|, in the spirit of llm.c's bf16 checks
(dev/cuda: about 1e-2 for bf16 outputs of size ~1):
- bit-exact where the GPU computes the same single fp32 operation and rounds once:
  encoder forward, the fused residual sum: gpu == bf16_rne(ref);
- GELU forward and backward: rtol 2^-7 (one bf16 ulp; the GPU's exp2 and reciprocal may
  differ from the host's by a few fp32 ulps and flip a rounding), atol 1e-6;
- layernorm forward: atol = rtol = 1e-2 (bf16 rounding of a value of size ~1 is 2^-9 and the
  GPU's fp32 row statistics differ from the double reference by ~1e-6); mean and rstd
  (fp32): rtol 1e-5, atol 1e-6;
- layernorm backward (dinp += , dweight/dbias += sums over N rows): rtol 1e-2, atol 2e-2 for
  dinp and atol 0.05 for the column sums (size ~sqrt(N));
- encoder backward: rtol 1e-2, atol 0.05 (sums of up to ~50 values of size ~1, rounded once);
  and bit-exact against the same fp32 sums in the kernel's documented order (a token's
  positions ascending, b ascending for wpe), each added to the old gradient and rounded to
  nearest even once: a wrong rounding mode or summation order is within the tolerance;
  dwpe has the next tensor's gradient after it (as the trainer lays them out), unchanged;
- cross-entropy: loss (fp32 sum of 50k exps) atol 1e-4, rtol 1e-5; dlogits rtol 2^-7 and atol
  1e-6 * dloss; padding columns exactly 0; with FP8 codes instead (an FP8 lm_head), every code
  bit-exact against the host encode of the bf16 gradient under the bound's scale;
- global norm: rtol 1e-5 against a double sum;
- x128_float (every loop over packed bf16 reads through it): bit-exact for all 65536 patterns
  at every position of a vector; x128_amax_bits exact against the floats' largest
  fp8_amax_bits;
- AdamW: bit-exact against its host reference (quant8.h's adamw_update_bf16_ref, the same
  element functions), the FP8 weight outputs too: the amax, and the delayed weight cast's
  codes under a scale from a smaller previous amax (so some saturate).
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include "llmc/cuda_common.h"
#include "llmc/cuda_utils.cuh"
#include "llmc/encoder.cuh"
#include "llmc/layernorm.cuh"
#include "llmc/gelu.cuh"
#include "llmc/fused_classifier.cuh"
#include "llmc/adamw.cuh"
#include "llmc/global_norm.cuh"
#include "llmc/profiler.h"
#include "llmc/quant8.h"
#include "test/gpt2_ref.h"
#include "test/test_harness.h"
#include "test/test_harness_fork.h"
#include "test/fp8_weight_outputs.cuh"
#include "test/gpu_test_copies.cuh"

typedef struct { const char* name; int B, T, C, V, Vp; } Shape;

// ----------------------------------------------------------------------------
// host data helpers (bf16 as raw uint16 on the host)

static uint64_t rng_state = 0x2545f4914f6cdd1dULL;
static float rand_uniform(float lo, float hi) {
    rng_state ^= rng_state << 13; rng_state ^= rng_state >> 7; rng_state ^= rng_state << 17;
    return lo + (hi - lo) * (float)((rng_state >> 40) / 16777216.0);
}

static uint16_t* random_bf16(size_t n, float lo, float hi) {
    uint16_t* h = (uint16_t*)mallocCheck(n * sizeof(uint16_t));
    for (size_t i = 0; i < n; i++) { h[i] = float_to_bf16_bits(rand_uniform(lo, hi)); }
    return h;
}

// ----------------------------------------------------------------------------
// comparisons: one CHECK per tensor, naming the worst element

static void check_bf16_close(const char* what, const Shape* s, const uint16_t* got, const float* expected, size_t n,
                             double atol, double rtol) {
    size_t bad = 0, worst = 0;
    double worst_excess = -1.0;
    for (size_t i = 0; i < n; i++) {
        double g = bf16_bits_to_float(got[i]), e = expected[i];
        double excess = fabs(g - e) - (atol + rtol * fabs(e));
        if (!(excess <= 0.0)) { bad++; }  // NaN counts as bad
        if (excess > worst_excess || excess != excess) { worst_excess = excess; worst = i; }
    }
    CHECK(bad == 0, "%s [%s]: %zu of %zu off (atol %g, rtol %g); worst [%zu] got %.6g expected %.6g", what, s->name,
          bad, n, atol, rtol, worst, bf16_bits_to_float(got[worst]), expected[worst]);
}

static void check_float_close(const char* what, const Shape* s, const float* got, const float* expected, size_t n,
                              double atol, double rtol) {
    size_t bad = 0, worst = 0;
    double worst_excess = -1.0;
    for (size_t i = 0; i < n; i++) {
        double excess = fabs((double)got[i] - expected[i]) - (atol + rtol * fabs((double)expected[i]));
        if (!(excess <= 0.0)) { bad++; }
        if (excess > worst_excess || excess != excess) { worst_excess = excess; worst = i; }
    }
    CHECK(bad == 0, "%s [%s]: %zu of %zu off (atol %g, rtol %g); worst [%zu] got %.9g expected %.9g", what, s->name,
          bad, n, atol, rtol, worst, got[worst], expected[worst]);
}

// gpu == round-to-nearest-even(ref) for every element
static void check_bf16_exact(const char* what, const Shape* s, const uint16_t* got, const float* expected, size_t n) {
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < n; i++) {
        if (got[i] != float_to_bf16_bits(expected[i])) { if (bad == 0) { first = i; } bad++; }
    }
    CHECK(bad == 0, "%s [%s]: %zu of %zu not bit-exact; first [%zu] got 0x%04x expected 0x%04x", what, s->name, bad, n,
          first, got[first], float_to_bf16_bits(expected[first]));
}

static void check_bitwise_equal(const char* what, const Shape* s, const void* a, const void* b, size_t bytes) {
    CHECK(memcmp(a, b, bytes) == 0, "%s [%s]: two runs differ bitwise", what, s->name);
}

// ----------------------------------------------------------------------------

// what encoder_backward's kernels compute, in their order: per wte row, the fp32 sum of its
// token's dout rows in ascending position, then one add to the old gradient; per wpe row, the
// fp32 sum over b ascending, then one add (expected: the old gradients as floats, updated)
static void ordered_encoder_backward(float* dwte, float* dwpe, const float* dout, const int* tokens, int B, int T, int C,
                                     int Vp) {
    float* sums = (float*)calloc((size_t)Vp * C, sizeof(float));
    char* present = (char*)calloc((size_t)Vp, 1);
    for (int bt = 0; bt < B * T; bt++) {
        present[tokens[bt]] = 1;
        for (int c = 0; c < C; c++) { sums[(size_t)tokens[bt] * C + c] += dout[(size_t)bt * C + c]; }
    }
    for (int v = 0; v < Vp; v++) {
        if (!present[v]) { continue; }  // no bucket: the row is not written
        for (int c = 0; c < C; c++) { dwte[(size_t)v * C + c] += sums[(size_t)v * C + c]; }
    }
    for (int t = 0; t < T; t++) {
        for (int c = 0; c < C; c++) {
            float sum = 0.0f;
            for (int b = 0; b < B; b++) { sum += dout[((size_t)b * T + t) * C + c]; }
            dwpe[(size_t)t * C + c] += sum;
        }
    }
    free(sums); free(present);
}

static void test_encoder(const Shape* s) {
    const int B = s->B, T = s->T, C = s->C, BT = s->B * s->T;
    const size_t wte_n = (size_t)s->Vp * C, wpe_n = (size_t)T * C, act_n = (size_t)BT * C;
    int* tokens = (int*)mallocCheck(BT * sizeof(int));
    for (int i = 0; i < BT; i++) {  // a fifth of the positions share one token: one large bucket
        tokens[i] = (i % 5 == 0) ? s->V / 2 : (int)rand_uniform(0.0f, (float)s->V - 0.5f);
    }
    uint16_t* wte = random_bf16(wte_n, -1.0f, 1.0f);
    uint16_t* wpe = random_bf16(wpe_n, -1.0f, 1.0f);
    uint16_t* dout = random_bf16(act_n, -1.0f, 1.0f);
    uint16_t* dwte0 = random_bf16(wte_n, -0.5f, 0.5f);
    uint16_t* dwpe0 = random_bf16(wpe_n, -0.5f, 0.5f);
    float* wte_f = bf16_bits_to_floats(wte, wte_n);
    float* wpe_f = bf16_bits_to_floats(wpe, wpe_n);
    float* dout_f = bf16_bits_to_floats(dout, act_n);
    float* ref_out = (float*)mallocCheck(act_n * sizeof(float));
    float* ref_dwte = bf16_bits_to_floats(dwte0, wte_n);
    float* ref_dwpe = bf16_bits_to_floats(dwpe0, wpe_n);
    ref_encoder_forward(ref_out, tokens, wte_f, wpe_f, B, T, C);
    ref_encoder_backward(ref_dwte, ref_dwpe, dout_f, tokens, B, T, C);
    float* ordered_dwte = bf16_bits_to_floats(dwte0, wte_n);
    float* ordered_dwpe = bf16_bits_to_floats(dwpe0, wpe_n);
    ordered_encoder_backward(ordered_dwte, ordered_dwpe, dout_f, tokens, B, T, C, s->Vp);
    // dwpe followed by one row of the next tensor's gradient, which the backward must not touch
    // (a fixed pattern: drawn, it would shift the later tests' random inputs)
    uint16_t* next_grad = (uint16_t*)mallocCheck((size_t)C * sizeof(uint16_t));
    for (int c = 0; c < C; c++) { next_grad[c] = float_to_bf16_bits(0.125f * (float)(c % 9) - 0.5f); }

    int* d_tokens = (int*)device_copy(tokens, BT * sizeof(int));
    floatX* d_wte = (floatX*)device_copy(wte, wte_n * 2);
    floatX* d_wpe = (floatX*)device_copy(wpe, wpe_n * 2);
    floatX* d_dout = (floatX*)device_copy(dout, act_n * 2);
    floatX* d_out = (floatX*)cuda_malloc_checked(act_n * 2, "encoder out");
    floatX* d_dwte = (floatX*)cuda_malloc_checked(wte_n * 2, "dwte");
    floatX* d_dwpe = (floatX*)cuda_malloc_checked((wpe_n + C) * 2, "dwpe and the next gradient");
    EncoderBackwardScratch* scratch = encoder_backward_scratch_create(B, T, s->V);

    encoder_forward(d_out, d_tokens, d_wte, d_wpe, B, T, C, 0);
    uint16_t* out = (uint16_t*)host_copy(d_out, act_n * 2);
    check_bf16_exact("encoder_forward", s, out, ref_out, act_n);

    uint16_t* runs_dwte[2];
    uint16_t* runs_dwpe[2];
    for (int run = 0; run < 2; run++) {
        cudaCheck(cudaMemcpy(d_dwte, dwte0, wte_n * 2, cudaMemcpyHostToDevice));
        cudaCheck(cudaMemcpy(d_dwpe, dwpe0, wpe_n * 2, cudaMemcpyHostToDevice));
        cudaCheck(cudaMemcpy(d_dwpe + wpe_n, next_grad, (size_t)C * 2, cudaMemcpyHostToDevice));
        encoder_backward(d_dwte, d_dwpe, d_dout, tokens, B, T, C, scratch, 0);
        runs_dwte[run] = (uint16_t*)host_copy(d_dwte, wte_n * 2);
        runs_dwpe[run] = (uint16_t*)host_copy(d_dwpe, (wpe_n + C) * 2);
    }
    check_bf16_close("encoder_backward dwte", s, runs_dwte[0], ref_dwte, wte_n, 0.05, 1e-2);
    check_bf16_close("encoder_backward dwpe", s, runs_dwpe[0], ref_dwpe, wpe_n, 0.05, 1e-2);
    check_bf16_exact("encoder_backward dwte (fp32 sums in order)", s, runs_dwte[0], ordered_dwte, wte_n);
    check_bf16_exact("encoder_backward dwpe (fp32 sums in order)", s, runs_dwpe[0], ordered_dwpe, wpe_n);
    CHECK(memcmp(runs_dwpe[0] + wpe_n, next_grad, (size_t)C * 2) == 0,
          "encoder_backward [%s]: the gradient after dwpe changed (a write past dwpe's T rows)", s->name);
    check_bitwise_equal("encoder_backward dwte", s, runs_dwte[0], runs_dwte[1], wte_n * 2);
    check_bitwise_equal("encoder_backward dwpe", s, runs_dwpe[0], runs_dwpe[1], wpe_n * 2);

    encoder_backward_scratch_free(scratch);
    cudaCheck(cudaFree(d_tokens)); cudaCheck(cudaFree(d_wte)); cudaCheck(cudaFree(d_wpe)); cudaCheck(cudaFree(d_dout));
    cudaCheck(cudaFree(d_out)); cudaCheck(cudaFree(d_dwte)); cudaCheck(cudaFree(d_dwpe));
    free(tokens); free(wte); free(wpe); free(dout); free(dwte0); free(dwpe0); free(wte_f); free(wpe_f); free(dout_f);
    free(ref_out); free(ref_dwte); free(ref_dwpe); free(out);
    free(ordered_dwte); free(ordered_dwpe); free(next_grad);
    for (int run = 0; run < 2; run++) { free(runs_dwte[run]); free(runs_dwpe[run]); }
}

static void test_layernorm(const Shape* s) {
    const int N = s->B * s->T, C = s->C;
    const size_t n = (size_t)N * C;
    uint16_t* inp1 = random_bf16(n, -2.0f, 2.0f);
    uint16_t* inp2 = random_bf16(n, -1.0f, 1.0f);
    uint16_t* weight = random_bf16(C, 0.5f, 1.5f);
    uint16_t* bias = random_bf16(C, -0.2f, 0.2f);
    uint16_t* dout = random_bf16(n, -1.0f, 1.0f);
    uint16_t* dinp0 = random_bf16(n, -0.5f, 0.5f);
    uint16_t* dweight0 = random_bf16(C, -0.5f, 0.5f);
    uint16_t* dbias0 = random_bf16(C, -0.5f, 0.5f);
    float* inp1_f = bf16_bits_to_floats(inp1, n);
    float* inp2_f = bf16_bits_to_floats(inp2, n);
    float* weight_f = bf16_bits_to_floats(weight, C);
    float* bias_f = bf16_bits_to_floats(bias, C);
    float* dout_f = bf16_bits_to_floats(dout, n);

    floatX* d_inp1 = (floatX*)device_copy(inp1, n * 2);
    floatX* d_inp2 = (floatX*)device_copy(inp2, n * 2);
    floatX* d_weight = (floatX*)device_copy(weight, C * 2);
    floatX* d_bias = (floatX*)device_copy(bias, C * 2);
    floatX* d_dout = (floatX*)device_copy(dout, n * 2);
    floatX* d_out = (floatX*)cuda_malloc_checked(n * 2, "ln out");
    floatX* d_residual = (floatX*)cuda_malloc_checked(n * 2, "residual");
    floatX* d_dinp = (floatX*)cuda_malloc_checked(n * 2, "ln dinp");
    floatX* d_dweight = (floatX*)cuda_malloc_checked(C * 2, "ln dweight");
    floatX* d_dbias = (floatX*)cuda_malloc_checked(C * 2, "ln dbias");
    float* d_mean = (float*)cuda_malloc_checked(N * sizeof(float), "mean");
    float* d_rstd = (float*)cuda_malloc_checked(N * sizeof(float), "rstd");
    float* d_scratch = (float*)cuda_malloc_checked(layernorm_backward_scratch_bytes(N, C), "ln scratch");
    float* ref_sum = (float*)mallocCheck(n * sizeof(float));
    ref_residual_forward(ref_sum, inp1_f, inp2_f, (int)n);

    // layernorm_forward, twice
    float* ref_out = (float*)mallocCheck(n * sizeof(float));
    float* ref_mean = (float*)mallocCheck(N * sizeof(float));
    float* ref_rstd = (float*)mallocCheck(N * sizeof(float));
    ref_layernorm_forward(ref_out, ref_mean, ref_rstd, inp1_f, weight_f, bias_f, N, C);
    uint16_t* outs[2];
    float* means[2];
    float* rstds[2];
    for (int run = 0; run < 2; run++) {
        layernorm_forward(d_out, d_mean, d_rstd, d_inp1, d_weight, d_bias, N, C, 0);
        outs[run] = (uint16_t*)host_copy(d_out, n * 2);
        means[run] = (float*)host_copy(d_mean, N * sizeof(float));
        rstds[run] = (float*)host_copy(d_rstd, N * sizeof(float));
    }
    check_bf16_close("layernorm_forward out", s, outs[0], ref_out, n, 1e-2, 1e-2);
    check_float_close("layernorm_forward mean", s, means[0], ref_mean, N, 1e-6, 1e-5);
    check_float_close("layernorm_forward rstd", s, rstds[0], ref_rstd, N, 1e-6, 1e-5);
    check_bitwise_equal("layernorm_forward out", s, outs[0], outs[1], n * 2);
    check_bitwise_equal("layernorm_forward rstd", s, rstds[0], rstds[1], N * sizeof(float));
    // mean/rstd are optional: the normalized output must not depend on whether they are written
    layernorm_forward(d_out, NULL, NULL, d_inp1, d_weight, d_bias, N, C, 0);
    uint16_t* out_no_stats = (uint16_t*)host_copy(d_out, n * 2);
    check_bitwise_equal("layernorm_forward without mean/rstd", s, outs[0], out_no_stats, n * 2);

    // fused residual + layernorm: residual bit-exact, then LN of the rounded residual
    float* rounded_sum = (float*)mallocCheck(n * sizeof(float));
    for (size_t i = 0; i < n; i++) { rounded_sum[i] = bf16_bits_to_float(float_to_bf16_bits(ref_sum[i])); }
    float* ref_fused = (float*)mallocCheck(n * sizeof(float));
    ref_layernorm_forward(ref_fused, ref_mean, ref_rstd, rounded_sum, weight_f, bias_f, N, C);
    fused_residual_layernorm_forward(d_residual, d_out, d_mean, d_rstd, d_inp1, d_inp2, d_weight, d_bias, N, C, 0);
    uint16_t* fused_residual = (uint16_t*)host_copy(d_residual, n * 2);
    uint16_t* fused_out = (uint16_t*)host_copy(d_out, n * 2);
    float* fused_rstd = (float*)host_copy(d_rstd, N * sizeof(float));
    check_bf16_exact("fused_residual_layernorm_forward residual", s, fused_residual, ref_sum, n);
    check_bf16_close("fused_residual_layernorm_forward out", s, fused_out, ref_fused, n, 1e-2, 1e-2);
    check_float_close("fused_residual_layernorm_forward rstd", s, fused_rstd, ref_rstd, N, 1e-6, 1e-5);

    // layernorm_backward on inp1 with the reference statistics (so only the backward is tested)
    ref_layernorm_forward(ref_out, ref_mean, ref_rstd, inp1_f, weight_f, bias_f, N, C);
    float* ref_dinp = bf16_bits_to_floats(dinp0, n);
    float* ref_dweight = bf16_bits_to_floats(dweight0, C);
    float* ref_dbias = bf16_bits_to_floats(dbias0, C);
    ref_layernorm_backward(ref_dinp, ref_dweight, ref_dbias, dout_f, inp1_f, weight_f, ref_mean, ref_rstd, N, C);
    cudaCheck(cudaMemcpy(d_mean, ref_mean, N * sizeof(float), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(d_rstd, ref_rstd, N * sizeof(float), cudaMemcpyHostToDevice));
    uint16_t* dinps[2];
    uint16_t* dweights[2];
    uint16_t* dbiases[2];
    for (int run = 0; run < 2; run++) {
        cudaCheck(cudaMemcpy(d_dinp, dinp0, n * 2, cudaMemcpyHostToDevice));
        cudaCheck(cudaMemcpy(d_dweight, dweight0, C * 2, cudaMemcpyHostToDevice));
        cudaCheck(cudaMemcpy(d_dbias, dbias0, C * 2, cudaMemcpyHostToDevice));
        layernorm_backward(d_dinp, d_dweight, d_dbias, d_scratch, d_dout, d_inp1, d_weight, d_mean, d_rstd, N, C,
                           LAYERNORM_DINP_UNUSED, 0);
        dinps[run] = (uint16_t*)host_copy(d_dinp, n * 2);
        dweights[run] = (uint16_t*)host_copy(d_dweight, C * 2);
        dbiases[run] = (uint16_t*)host_copy(d_dbias, C * 2);
    }
    check_bf16_close("layernorm_backward dinp", s, dinps[0], ref_dinp, n, 2e-2, 1e-2);
    check_bf16_close("layernorm_backward dweight", s, dweights[0], ref_dweight, C, 0.05, 1e-2);
    check_bf16_close("layernorm_backward dbias", s, dbiases[0], ref_dbias, C, 0.05, 1e-2);
    check_bitwise_equal("layernorm_backward dinp", s, dinps[0], dinps[1], n * 2);
    check_bitwise_equal("layernorm_backward dweight", s, dweights[0], dweights[1], C * 2);
    check_bitwise_equal("layernorm_backward dbias", s, dbiases[0], dbiases[1], C * 2);

    cudaCheck(cudaFree(d_inp1)); cudaCheck(cudaFree(d_inp2)); cudaCheck(cudaFree(d_weight)); cudaCheck(cudaFree(d_bias));
    cudaCheck(cudaFree(d_dout)); cudaCheck(cudaFree(d_out)); cudaCheck(cudaFree(d_residual)); cudaCheck(cudaFree(d_dinp));
    cudaCheck(cudaFree(d_dweight)); cudaCheck(cudaFree(d_dbias)); cudaCheck(cudaFree(d_mean)); cudaCheck(cudaFree(d_rstd));
    cudaCheck(cudaFree(d_scratch));
    free(inp1); free(inp2); free(weight); free(bias); free(dout); free(dinp0); free(dweight0); free(dbias0);
    free(inp1_f); free(inp2_f); free(weight_f); free(bias_f); free(dout_f); free(ref_sum);
    free(ref_out); free(ref_mean); free(ref_rstd); free(out_no_stats); free(rounded_sum); free(ref_fused);
    free(fused_residual); free(fused_out); free(fused_rstd); free(ref_dinp); free(ref_dweight); free(ref_dbias);
    for (int run = 0; run < 2; run++) {
        free(outs[run]); free(means[run]); free(rstds[run]); free(dinps[run]); free(dweights[run]); free(dbiases[run]);
    }
}

// A linear's bias gradient as layernorm_backward sums the dinp it wrote (LayernormDinpUses): each
// warp its rows in order, each block its warps in order, then LAYERNORM_REDUCE_GROUPS groups of
// interleaved blocks, each in block order, added in group order, and the total into bias0's bf16
static uint16_t* host_layernorm_dinp_bias(const uint16_t* bias0, const uint16_t* dinp, int N, int C) {
    const int blocks = layernorm_backward_num_blocks(N);
    float* partials = (float*)mallocCheck((size_t)blocks * C * sizeof(float));
    for (int b = 0; b < blocks; b++) {
        for (int c = 0; c < C; c++) {
            float block_sum = 0.0f;
            for (int w = 0; w < LAYERNORM_BACKWARD_WARPS; w++) {
                float warp_sum = 0.0f;
                for (int row = b * LAYERNORM_BACKWARD_WARPS + w; row < N; row += blocks * LAYERNORM_BACKWARD_WARPS) {
                    warp_sum += bf16_bits_to_float(dinp[(size_t)row * C + c]);
                }
                block_sum += warp_sum;
            }
            partials[(size_t)b * C + c] = block_sum;
        }
    }
    uint16_t* bias = (uint16_t*)mallocCheck((size_t)C * 2);
    for (int c = 0; c < C; c++) {
        float total = 0.0f;
        for (int g = 0; g < LAYERNORM_REDUCE_GROUPS; g++) {
            float group_sum = 0.0f;
            for (int b = g; b < blocks; b += LAYERNORM_REDUCE_GROUPS) { group_sum += partials[(size_t)b * C + c]; }
            total += group_sum;
        }
        bias[c] = float_to_bf16_bits(bf16_bits_to_float(bias0[c]) + total);
    }
    free(partials);
    return bias;
}

/*
layernorm_backward's LayernormDinpUses: the column sums of the dinp it writes into a linear's
bias gradient and dinp's amax into a record, with dinp, dweight and dbias bitwise as without
them. N above LAYERNORM_BACKWARD_MAX_BLOCKS * LAYERNORM_BACKWARD_WARPS rows, so warps take
several rows and the order of the sums shows.
*/
static void test_layernorm_dinp_uses(const Shape* s) {
    const int N = s->B * s->T, C = s->C;
    const size_t n = (size_t)N * C;
    uint16_t* inp = random_bf16(n, -2.0f, 2.0f);
    uint16_t* weight = random_bf16(C, 0.5f, 1.5f);
    uint16_t* bias = random_bf16(C, -0.2f, 0.2f);
    uint16_t* dout = random_bf16(n, -1.0f, 1.0f);
    uint16_t* dinp0 = random_bf16(n, -0.5f, 0.5f);
    uint16_t* ln_grads0 = random_bf16(2 * C, -0.5f, 0.5f);  // dweight, dbias
    uint16_t* linear_bias0 = random_bf16(C, -0.5f, 0.5f);
    float* inp_f = bf16_bits_to_floats(inp, n);
    float* weight_f = bf16_bits_to_floats(weight, C);
    float* bias_f = bf16_bits_to_floats(bias, C);
    float* out = (float*)mallocCheck(n * sizeof(float));
    float* mean = (float*)mallocCheck(N * sizeof(float));
    float* rstd = (float*)mallocCheck(N * sizeof(float));
    ref_layernorm_forward(out, mean, rstd, inp_f, weight_f, bias_f, N, C);

    floatX* d_inp = (floatX*)device_copy(inp, n * 2);
    floatX* d_weight = (floatX*)device_copy(weight, C * 2);
    floatX* d_dout = (floatX*)device_copy(dout, n * 2);
    float* d_mean = (float*)device_copy(mean, N * sizeof(float));
    float* d_rstd = (float*)device_copy(rstd, N * sizeof(float));
    floatX* d_dinp = (floatX*)cuda_malloc_checked(n * 2, "ln dinp");
    floatX* d_ln_grads = (floatX*)cuda_malloc_checked(2 * C * 2, "ln dweight, dbias");
    floatX* d_linear_bias = (floatX*)cuda_malloc_checked(C * 2, "linear dbias");
    float* d_scratch = (float*)cuda_malloc_checked(layernorm_backward_scratch_bytes(N, C), "ln scratch");
    Fp8CastRecord* d_record = (Fp8CastRecord*)cuda_malloc_checked(sizeof(Fp8CastRecord), "record");

    // runs: 0 nothing taken, 1 the bias and the amax, 2 the amax alone
    uint16_t* dinps[3];
    uint16_t* ln_grads[3];
    uint32_t amax_bits[3];
    uint16_t* linear_bias = NULL;
    for (int run = 0; run < 3; run++) {
        cudaCheck(cudaMemcpy(d_dinp, dinp0, n * 2, cudaMemcpyHostToDevice));
        cudaCheck(cudaMemcpy(d_ln_grads, ln_grads0, 2 * C * 2, cudaMemcpyHostToDevice));
        cudaCheck(cudaMemcpy(d_linear_bias, linear_bias0, C * 2, cudaMemcpyHostToDevice));
        fp8_cast_records_init(d_record, 1, 0);
        const uint32_t untouched = 0x1234u;  // a denormal's bits, below any amax of dinp
        cudaCheck(cudaMemcpy(&d_record->amax_bits, &untouched, sizeof(untouched), cudaMemcpyHostToDevice));
        LayernormDinpUses uses = LAYERNORM_DINP_UNUSED;
        if (run == 1) { uses.bias_grad = d_linear_bias; }
        if (run >= 1) { uses.amax_record = d_record; }
        layernorm_backward(d_dinp, d_ln_grads, d_ln_grads + C, d_scratch, d_dout, d_inp, d_weight, d_mean, d_rstd, N, C,
                           uses, 0);
        dinps[run] = (uint16_t*)host_copy(d_dinp, n * 2);
        ln_grads[run] = (uint16_t*)host_copy(d_ln_grads, 2 * C * 2);
        Fp8CastRecord* record = (Fp8CastRecord*)host_copy(d_record, sizeof(Fp8CastRecord));
        amax_bits[run] = record->amax_bits;
        free(record);
        if (run == 1) { linear_bias = (uint16_t*)host_copy(d_linear_bias, C * 2); }
    }
    uint32_t expected_amax = 0u;
    for (size_t i = 0; i < n; i++) {
        uint32_t bits = fp8_amax_bits(bf16_bits_to_float(dinps[0][i]));
        if (bits > expected_amax) { expected_amax = bits; }
    }
    uint16_t* expected_bias = host_layernorm_dinp_bias(linear_bias0, dinps[0], N, C);
    for (int run = 1; run < 3; run++) {
        check_bitwise_equal("layernorm_backward dinp, with uses", s, dinps[0], dinps[run], n * 2);
        check_bitwise_equal("layernorm_backward dweight and dbias, with uses", s, ln_grads[0], ln_grads[run], 2 * C * 2);
        CHECK(amax_bits[run] == expected_amax, "layernorm_backward dinp amax [%s], run %d: got %.9g, expected %.9g", s->name,
              run, bits_as_float(amax_bits[run]), bits_as_float(expected_amax));
    }
    CHECK(amax_bits[0] == 0x1234u, "layernorm_backward [%s]: no record given, yet the record changed", s->name);
    check_bitwise_equal("layernorm_backward the linear's bias gradient, in its order", s, linear_bias, expected_bias, C * 2);
    // and against the plain column sums in double (what the separate bias pass would give, to its rounding)
    float* plain_bias = (float*)mallocCheck(C * sizeof(float));
    for (int c = 0; c < C; c++) {
        double sum = 0.0;
        for (int row = 0; row < N; row++) { sum += bf16_bits_to_float(dinps[0][(size_t)row * C + c]); }
        plain_bias[c] = (float)(bf16_bits_to_float(linear_bias0[c]) + sum);
    }
    check_bf16_close("layernorm_backward the linear's bias gradient", s, linear_bias, plain_bias, C, 1e-2, 8e-3);

    cudaCheck(cudaFree(d_inp)); cudaCheck(cudaFree(d_weight)); cudaCheck(cudaFree(d_dout)); cudaCheck(cudaFree(d_mean));
    cudaCheck(cudaFree(d_rstd)); cudaCheck(cudaFree(d_dinp)); cudaCheck(cudaFree(d_ln_grads));
    cudaCheck(cudaFree(d_linear_bias)); cudaCheck(cudaFree(d_scratch)); cudaCheck(cudaFree(d_record));
    free(inp); free(weight); free(bias); free(dout); free(dinp0); free(ln_grads0); free(linear_bias0);
    free(inp_f); free(weight_f); free(bias_f); free(out); free(mean); free(rstd);
    free(linear_bias); free(expected_bias); free(plain_bias);
    for (int run = 0; run < 3; run++) { free(dinps[run]); free(ln_grads[run]); }
}

/*
layernorm_forward on rows of small variance, where LAYERNORM_EPS is a large part of var + eps.
test_layernorm's rows (variance ~1.3) see eps only as ~4e-6 of rstd, below its rtol of 1e-5, so
a dropped eps, eps added outside the square root or a wrong eps passed there. Here: constant
rows (variance 0: rstd = 1/sqrt(eps), the output exactly the bias; without eps, NaN) and rows of
spread ~1e-3 and ~1e-2 (eps ~10% and ~0.1% of the variance); the fused residual variant (inp2 = 0,
so its sum is inp1) must give the same bits. Inputs are a fixed pattern: no draws of rng_state.
*/
static void test_layernorm_low_variance(int N, int C) {
    char name[64];
    snprintf(name, sizeof(name), "low variance N=%d C=%d", N, C);
    const Shape shape = {name, 1, N, C, 0, 0};
    const Shape* s = &shape;
    const size_t n = (size_t)N * C;
    uint16_t* inp = (uint16_t*)mallocCheck(n * 2);
    uint16_t* zeros = (uint16_t*)calloc(n, 2);
    uint16_t* weight = (uint16_t*)mallocCheck(C * 2);
    uint16_t* bias = (uint16_t*)mallocCheck(C * 2);
    const float spreads[4] = {0.0f, 1e-3f, 1e-2f, 3e-3f};
    const float offsets[4] = {0.5f, 0.0f, 0.0f, -0.125f};
    for (int r = 0; r < N; r++) {
        for (int c = 0; c < C; c++) {
            float pattern = (float)((c * 7 + r * 3) % 11 - 5) / 5.0f;  // in [-1, 1]
            inp[(size_t)r * C + c] = float_to_bf16_bits(offsets[r % 4] + spreads[r % 4] * pattern);
        }
    }
    for (int c = 0; c < C; c++) {
        weight[c] = float_to_bf16_bits(1.0f + 0.25f * (float)(c % 5 - 2) / 2.0f);
        bias[c] = float_to_bf16_bits(0.1f * (float)(c % 7 - 3) / 3.0f);
    }
    float* inp_f = bf16_bits_to_floats(inp, n);
    float* weight_f = bf16_bits_to_floats(weight, C);
    float* bias_f = bf16_bits_to_floats(bias, C);
    float* ref_out = (float*)mallocCheck(n * sizeof(float));
    float* ref_mean = (float*)mallocCheck(N * sizeof(float));
    float* ref_rstd = (float*)mallocCheck(N * sizeof(float));
    ref_layernorm_forward(ref_out, ref_mean, ref_rstd, inp_f, weight_f, bias_f, N, C);

    floatX* d_inp = (floatX*)device_copy(inp, n * 2);
    floatX* d_zeros = (floatX*)device_copy(zeros, n * 2);
    floatX* d_weight = (floatX*)device_copy(weight, C * 2);
    floatX* d_bias = (floatX*)device_copy(bias, C * 2);
    floatX* d_out = (floatX*)cuda_malloc_checked(n * 2, "ln out");
    floatX* d_residual = (floatX*)cuda_malloc_checked(n * 2, "residual");
    float* d_mean = (float*)cuda_malloc_checked(N * sizeof(float), "mean");
    float* d_rstd = (float*)cuda_malloc_checked(N * sizeof(float), "rstd");
    layernorm_forward(d_out, d_mean, d_rstd, d_inp, d_weight, d_bias, N, C, 0);
    uint16_t* out = (uint16_t*)host_copy(d_out, n * 2);
    float* mean = (float*)host_copy(d_mean, N * sizeof(float));
    float* rstd = (float*)host_copy(d_rstd, N * sizeof(float));
    check_bf16_close("layernorm_forward low variance out", s, out, ref_out, n, 1e-2, 1e-2);
    check_float_close("layernorm_forward low variance mean", s, mean, ref_mean, N, 1e-6, 1e-5);
    check_float_close("layernorm_forward low variance rstd", s, rstd, ref_rstd, N, 1e-6, 1e-5);
    size_t not_bias = 0;  // a constant row's output is (0 * rstd) * weight + bias: the bias, exactly
    for (int r = 0; r < N; r += 4) {
        for (int c = 0; c < C; c++) { not_bias += out[(size_t)r * C + c] != bias[c]; }
    }
    CHECK(not_bias == 0, "layernorm_forward [%s]: %zu outputs of the constant rows are not the bias", s->name, not_bias);
    fused_residual_layernorm_forward(d_residual, d_out, d_mean, d_rstd, d_inp, d_zeros, d_weight, d_bias, N, C, 0);
    uint16_t* fused_out = (uint16_t*)host_copy(d_out, n * 2);
    float* fused_rstd = (float*)host_copy(d_rstd, N * sizeof(float));
    check_bitwise_equal("fused_residual_layernorm_forward low variance out (inp2 = 0)", s, fused_out, out, n * 2);
    check_bitwise_equal("fused_residual_layernorm_forward low variance rstd (inp2 = 0)", s, fused_rstd, rstd, N * sizeof(float));

    void* buffers[8] = {d_inp, d_zeros, d_weight, d_bias, d_out, d_residual, d_mean, d_rstd};
    for (int i = 0; i < 8; i++) { cudaCheck(cudaFree(buffers[i])); }
    free(inp); free(zeros); free(weight); free(bias); free(inp_f); free(weight_f); free(bias_f);
    free(ref_out); free(ref_mean); free(ref_rstd); free(out); free(mean); free(rstd); free(fused_out); free(fused_rstd);
}

/*
layernorm_backward's dinp to its bf16 rounding, where test_layernorm's check (dinp0 + dx against
atol 2e-2, rtol 1e-2) lets through a mean term divided by C - 1 instead of C (a few percent of a
term that is itself a few percent of dx) or dx off by a fraction of a percent. dinp starts at 0,
so it is bf16(dx), within half a bf16 ulp (2^-9 relative) of the double reference plus fp32's
error: checked at rtol 2^-8, atol 1e-5, in two cases:
- random dout and weight;
- weight = 1 and dout = a + b * xhat per row: the two directions the backward projects out, so
  dinp = rstd * (dout - mean(dout) - xhat * mean(dout * xhat)) is about 0 (what is left comes
  from dout's bf16 rounding and eps, which the double reference has exactly), and a wrong mean
  term leaves about a / C or b * xhat / C where the answer is nearly 0.
*/
static void test_layernorm_backward_precise(int N, int C, bool null_directions) {
    char name[64];
    snprintf(name, sizeof(name), "%s N=%d C=%d", null_directions ? "dout in the null directions" : "random dout", N, C);
    const Shape shape = {name, 1, N, C, 0, 0};
    const Shape* s = &shape;
    const size_t n = (size_t)N * C;
    uint16_t* inp = random_bf16(n, -2.0f, 2.0f);
    uint16_t* weight = (uint16_t*)mallocCheck(C * 2);
    uint16_t* zeros = (uint16_t*)calloc(n > (size_t)C ? n : (size_t)C, 2);
    for (int c = 0; c < C; c++) { weight[c] = float_to_bf16_bits(null_directions ? 1.0f : rand_uniform(0.5f, 1.5f)); }
    float* inp_f = bf16_bits_to_floats(inp, n);
    float* weight_f = bf16_bits_to_floats(weight, C);
    float* bias_f = (float*)calloc(C, sizeof(float));
    float* out = (float*)mallocCheck(n * sizeof(float));
    float* mean = (float*)mallocCheck(N * sizeof(float));
    float* rstd = (float*)mallocCheck(N * sizeof(float));
    ref_layernorm_forward(out, mean, rstd, inp_f, weight_f, bias_f, N, C);
    uint16_t* dout = (uint16_t*)mallocCheck(n * 2);
    for (int r = 0; r < N; r++) {
        const float a = rand_uniform(-1.0f, 1.0f), b = rand_uniform(-1.0f, 1.0f);
        for (int c = 0; c < C; c++) {
            double xhat = ((double)inp_f[(size_t)r * C + c] - mean[r]) * rstd[r];
            float value = null_directions ? (float)(a + b * xhat) : rand_uniform(-1.0f, 1.0f);
            dout[(size_t)r * C + c] = float_to_bf16_bits(value);
        }
    }
    float* dout_f = bf16_bits_to_floats(dout, n);
    float* ref_dinp = (float*)calloc(n, sizeof(float));
    float* ref_dweight = (float*)calloc(C, sizeof(float));
    float* ref_dbias = (float*)calloc(C, sizeof(float));
    ref_layernorm_backward(ref_dinp, ref_dweight, ref_dbias, dout_f, inp_f, weight_f, mean, rstd, N, C);

    floatX* d_inp = (floatX*)device_copy(inp, n * 2);
    floatX* d_weight = (floatX*)device_copy(weight, C * 2);
    floatX* d_dout = (floatX*)device_copy(dout, n * 2);
    float* d_mean = (float*)device_copy(mean, N * sizeof(float));
    float* d_rstd = (float*)device_copy(rstd, N * sizeof(float));
    floatX* d_dinp = (floatX*)device_copy(zeros, n * 2);
    floatX* d_dweight = (floatX*)device_copy(zeros, C * 2);
    floatX* d_dbias = (floatX*)device_copy(zeros, C * 2);
    float* d_scratch = (float*)cuda_malloc_checked(layernorm_backward_scratch_bytes(N, C), "ln scratch");
    layernorm_backward(d_dinp, d_dweight, d_dbias, d_scratch, d_dout, d_inp, d_weight, d_mean, d_rstd, N, C,
                       LAYERNORM_DINP_UNUSED, 0);
    uint16_t* dinp = (uint16_t*)host_copy(d_dinp, n * 2);
    double largest_dout = 0.0, largest_dinp = 0.0;
    for (size_t i = 0; i < n; i++) {
        largest_dout = fmax(largest_dout, fabs(dout_f[i]));
        largest_dinp = fmax(largest_dinp, fabs(ref_dinp[i]));
    }
    if (null_directions) {  // the data is what the case is about: the reference dinp is well below dout
        CHECK(largest_dinp < 0.05 * largest_dout, "layernorm_backward [%s]: reference dinp up to %g for dout up to %g",
              s->name, largest_dinp, largest_dout);
    }
    check_bf16_close("layernorm_backward dinp from 0, to its bf16 rounding", s, dinp, ref_dinp, n, 1e-5, 1.0 / 256.0);

    void* buffers[9] = {d_inp, d_weight, d_dout, d_mean, d_rstd, d_dinp, d_dweight, d_dbias, d_scratch};
    for (int i = 0; i < 9; i++) { cudaCheck(cudaFree(buffers[i])); }
    free(inp); free(weight); free(zeros); free(inp_f); free(weight_f); free(bias_f); free(out); free(mean); free(rstd);
    free(dout); free(dout_f); free(ref_dinp); free(ref_dweight); free(ref_dbias); free(dinp);
}

static void test_gelu(const Shape* s) {
    const size_t n = (size_t)s->B * s->T * 4 * s->C;
    uint16_t* inp = random_bf16(n, -6.0f, 6.0f);
    uint16_t* dout = random_bf16(n, -1.0f, 1.0f);
    float* inp_f = bf16_bits_to_floats(inp, n);
    float* dout_f = bf16_bits_to_floats(dout, n);
    float* ref_out = (float*)mallocCheck(n * sizeof(float));
    float* ref_dinp = (float*)calloc(n, sizeof(float));
    ref_gelu_forward(ref_out, inp_f, (int)n);
    ref_gelu_backward(ref_dinp, inp_f, dout_f, (int)n);

    floatX* d_inp = (floatX*)device_copy(inp, n * 2);
    floatX* d_out = (floatX*)cuda_malloc_checked(n * 2, "gelu out");
    floatX* d_grad = (floatX*)cuda_malloc_checked(n * 2, "gelu grad");
    uint16_t* outs[2];
    uint16_t* grads[2];
    for (int run = 0; run < 2; run++) {
        gelu_forward(d_out, d_inp, (int)n, 0);
        cudaCheck(cudaMemcpy(d_grad, dout, n * 2, cudaMemcpyHostToDevice));
        gelu_backward_inplace(d_grad, d_inp, (int)n, 0);
        outs[run] = (uint16_t*)host_copy(d_out, n * 2);
        grads[run] = (uint16_t*)host_copy(d_grad, n * 2);
    }
    const double one_bf16_ulp = 1.0 / 128.0;
    check_bf16_close("gelu_forward", s, outs[0], ref_out, n, 1e-6, one_bf16_ulp);
    check_bf16_close("gelu_backward_inplace", s, grads[0], ref_dinp, n, 1e-6, one_bf16_ulp);
    check_bitwise_equal("gelu_forward", s, outs[0], outs[1], n * 2);
    check_bitwise_equal("gelu_backward_inplace", s, grads[0], grads[1], n * 2);

    cudaCheck(cudaFree(d_inp)); cudaCheck(cudaFree(d_out)); cudaCheck(cudaFree(d_grad));
    free(inp); free(dout); free(inp_f); free(dout_f); free(ref_out); free(ref_dinp);
    for (int run = 0; run < 2; run++) { free(outs[run]); free(grads[run]); }
}

/*
The classifier writing an FP8 lm_head's dy codes itself (both backward GEMMs in FP8): after the
state took the bound dloss as its amax (fp8_scaling_update_with_amax, as fp8_model_begin_dlogits),
every code is the host encode of the bf16 gradient the bf16 path writes (dlogits), under the
state's scale; the logits stay, the losses are the bf16 path's bits, and the record holds the
scale, the gradients' amax and counts as a cast's, and no amax as a use.
shrink > 1: the state takes the bound / shrink instead, a scale too large for the largest gradients,
which saturate and are counted so (the trainer's bound never lets one saturate; the kernel's count must
still be a cast's).
*/
static void test_fused_classifier_fp8(const Shape* s, const uint16_t* logits, const int* d_targets,
                                      const float* initial_losses, const uint16_t* dlogits, const float* losses,
                                      float shrink) {
    const int BT = s->B * s->T, V = s->V, Vp = s->Vp;
    const size_t n = (size_t)BT * Vp;
    const float dloss = 1.0f / (float)BT;
    const float bound = fp8_dlogits_amax_bound(dloss) / shrink;
    Fp8TensorScaling state;
    fp8_scaling_init(&state, FP8_RECIPE_CURRENT, FP8_E5M2, FP8_AMAX_HISTORY_DEFAULT, 0);
    Fp8TensorScaling* d_state = (Fp8TensorScaling*)device_copy(&state, sizeof(state));
    Fp8CastRecord* d_record = (Fp8CastRecord*)cuda_malloc_checked(sizeof(Fp8CastRecord), "dlogits record");
    fp8_cast_records_init(d_record, 1, 0);
    uint8_t* d_codes = (uint8_t*)cuda_malloc_checked(n, "dlogits codes");
    floatX* d_logits = (floatX*)device_copy(logits, n * 2);
    float* d_losses = (float*)device_copy(initial_losses, BT * sizeof(float));
    Fp8CastOutput out = {};
    out.format = FP8_E5M2;
    out.scaling = FP8_SCALING_TENSOR;
    out.codes = d_codes;
    out.state = d_state;
    out.record = d_record;
    fp8_scaling_update_with_amax(d_state, d_record, bound, 0);
    fused_classifier(d_logits, d_losses, dloss, d_targets, s->B, s->T, V, Vp, 1, &out, 0);

    uint16_t* logits_after = (uint16_t*)host_copy(d_logits, n * 2);
    float* losses_fp8 = (float*)host_copy(d_losses, BT * sizeof(float));
    uint8_t* codes = (uint8_t*)host_copy(d_codes, n);
    CHECK(memcmp(logits_after, logits, n * 2) == 0, "fused_classifier fp8 [%s]: writing codes changed the logits", s->name);
    check_bitwise_equal("fused_classifier fp8 loss", s, losses_fp8, losses, BT * sizeof(float));
    fp8_scaling_update(&state, bound);
    size_t wrong = 0, saturated = 0, flushed = 0;
    uint32_t amax_bits = 0;
    for (size_t i = 0; i < n; i++) {
        float value = bf16_bits_to_float(dlogits[i]);
        uint8_t expected = fp8_quantize(value, state.scale, FP8_E5M2);
        wrong += codes[i] != expected;
        Fp8ElementStatus status = fp8_classify(value, state.scale, expected, FP8_E5M2);
        saturated += status == FP8_ELEMENT_SATURATED;
        flushed += status == FP8_ELEMENT_FLUSHED;
        uint32_t bits = fp8_amax_bits(value);
        amax_bits = bits > amax_bits ? bits : amax_bits;
    }
    CHECK(wrong == 0, "fused_classifier fp8 [%s]: %zu of %zu codes differ from the host encode of the bf16 gradients "
          "under the bound's scale %g", s->name, wrong, n, state.scale);
    CHECK((shrink > 1.0f ? saturated > 0 : saturated == 0) && amax_bits > 0 && bits_as_float(amax_bits) <= dloss,
          "fused_classifier fp8 [%s]: %zu gradients saturate, amax %g against the bound %g / %g", s->name, saturated,
          bits_as_float(amax_bits), dloss, shrink);
    Fp8CastRecord record;
    cudaCheck(cudaMemcpy(&record, d_record, sizeof(record), cudaMemcpyDeviceToHost));
    Fp8TensorScaling state_after;
    cudaCheck(cudaMemcpy(&state_after, d_state, sizeof(state_after), cudaMemcpyDeviceToHost));
    CHECK(memcmp(&state_after, &state, sizeof(state)) == 0, "fused_classifier fp8 [%s]: the device state is not the "
          "host state machine's after one update with the bound", s->name);
    CHECK(record.scale == state.scale && record.scale_inv == state.scale_inv && record.amax_bits == 0u &&
          record.interval_amax_bits == amax_bits && record.elements == n && record.saturated == saturated && record.flushed == flushed,
          "fused_classifier fp8 [%s], bound / %g: the record holds scale %g (want %g), amax bits 0x%x as a use (want 0), "
          "interval amax 0x%x (want 0x%x), %llu elements (want %zu), %llu saturated (want %zu), %llu flushed (want %zu)",
          s->name, shrink, record.scale, state.scale, record.amax_bits, record.interval_amax_bits, amax_bits,
          (unsigned long long)record.elements, n, (unsigned long long)record.saturated, saturated,
          (unsigned long long)record.flushed, flushed);
    free(logits_after); free(losses_fp8); free(codes);
    void* buffers[5] = {d_state, d_record, d_codes, d_logits, d_losses};
    for (int i = 0; i < 5; i++) { cudaCheck(cudaFree(buffers[i])); }
}

static void test_fused_classifier(const Shape* s) {
    const int BT = s->B * s->T, V = s->V, Vp = s->Vp;
    const size_t n = (size_t)BT * Vp;
    const float dloss = 1.0f / (float)BT;
    const float initial_loss = 0.25f;  // losses accumulate: start from a non-zero value
    uint16_t* logits = random_bf16(n, -4.0f, 4.0f);
    for (int bt = 0; bt < BT; bt++) {  // garbage in the padding, which must be ignored
        for (int j = V; j < Vp; j++) { logits[(size_t)bt * Vp + j] = float_to_bf16_bits(100.0f); }
    }
    int* targets = (int*)mallocCheck(BT * sizeof(int));
    for (int i = 0; i < BT; i++) { targets[i] = (i == 0) ? V - 1 : (int)rand_uniform(0.0f, (float)V - 0.5f); }
    float* logits_f = bf16_bits_to_floats(logits, n);
    float* ref_losses = (float*)mallocCheck(BT * sizeof(float));
    float* ref_dlogits = (float*)mallocCheck(n * sizeof(float));
    ref_crossentropy_forward_backward(ref_losses, ref_dlogits, logits_f, targets, BT, V, Vp, dloss);
    for (int i = 0; i < BT; i++) { ref_losses[i] += initial_loss; }

    floatX* d_logits = (floatX*)cuda_malloc_checked(n * 2, "logits");
    int* d_targets = (int*)device_copy(targets, BT * sizeof(int));
    float* d_losses = (float*)cuda_malloc_checked(BT * sizeof(float), "losses");
    float* initial_losses = (float*)mallocCheck(BT * sizeof(float));
    for (int i = 0; i < BT; i++) { initial_losses[i] = initial_loss; }

    // forward only: losses accumulate, logits untouched
    cudaCheck(cudaMemcpy(d_logits, logits, n * 2, cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(d_losses, initial_losses, BT * sizeof(float), cudaMemcpyHostToDevice));
    fused_classifier(d_logits, d_losses, dloss, d_targets, s->B, s->T, V, Vp, 0, NULL, 0);
    float* losses_forward = (float*)host_copy(d_losses, BT * sizeof(float));
    uint16_t* logits_after = (uint16_t*)host_copy(d_logits, n * 2);
    check_float_close("fused_classifier loss (forward only)", s, losses_forward, ref_losses, BT, 1e-4, 1e-5);
    CHECK(memcmp(logits_after, logits, n * 2) == 0, "fused_classifier [%s]: write_dlogits=0 changed the logits", s->name);

    uint16_t* dlogits[2];
    float* losses[2];
    for (int run = 0; run < 2; run++) {
        cudaCheck(cudaMemcpy(d_logits, logits, n * 2, cudaMemcpyHostToDevice));
        cudaCheck(cudaMemcpy(d_losses, initial_losses, BT * sizeof(float), cudaMemcpyHostToDevice));
        fused_classifier(d_logits, d_losses, dloss, d_targets, s->B, s->T, V, Vp, 1, NULL, 0);
        dlogits[run] = (uint16_t*)host_copy(d_logits, n * 2);
        losses[run] = (float*)host_copy(d_losses, BT * sizeof(float));
    }
    check_float_close("fused_classifier loss", s, losses[0], ref_losses, BT, 1e-4, 1e-5);
    check_bf16_close("fused_classifier dlogits", s, dlogits[0], ref_dlogits, n, 1e-6 * dloss, 1.0 / 128.0);
    size_t nonzero_padding = 0;
    for (int bt = 0; bt < BT; bt++) {
        for (int j = V; j < Vp; j++) { nonzero_padding += dlogits[0][(size_t)bt * Vp + j] != 0; }
    }
    CHECK(nonzero_padding == 0, "fused_classifier [%s]: %zu padding gradients are not +0", s->name, nonzero_padding);
    check_bitwise_equal("fused_classifier dlogits", s, dlogits[0], dlogits[1], n * 2);
    check_bitwise_equal("fused_classifier loss", s, losses[0], losses[1], BT * sizeof(float));
    if (BT % 16 == 0 && Vp % 16 == 0) {
        test_fused_classifier_fp8(s, logits, d_targets, initial_losses, dlogits[0], losses[0], 1.0f);
        // a scale 64 times too large, where it costs little (the rows of the small shapes)
        if (n <= ((size_t)1 << 20)) { test_fused_classifier_fp8(s, logits, d_targets, initial_losses, dlogits[0], losses[0], 64.0f); }
    }

    // an out-of-range target must give a NaN loss, not a silent number
    int bad_target = V;
    cudaCheck(cudaMemcpy(d_targets, &bad_target, sizeof(int), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(d_logits, logits, n * 2, cudaMemcpyHostToDevice));
    fused_classifier(d_logits, d_losses, dloss, d_targets, s->B, s->T, V, Vp, 0, NULL, 0);
    float* losses_bad = (float*)host_copy(d_losses, BT * sizeof(float));
    CHECK(isnan(losses_bad[0]), "fused_classifier [%s]: target %d >= V gave loss %g instead of NaN", s->name, V, losses_bad[0]);
    // and so must a negative one (an ignore index such as -1 is not supported): on the last row, where a read of
    // row[target] would find the row before's last logit, not a fault
    int negative_target = -1;
    cudaCheck(cudaMemcpy(d_targets + BT - 1, &negative_target, sizeof(int), cudaMemcpyHostToDevice));
    fused_classifier(d_logits, d_losses, dloss, d_targets, s->B, s->T, V, Vp, 0, NULL, 0);
    float* losses_negative = (float*)host_copy(d_losses, BT * sizeof(float));
    CHECK(isnan(losses_negative[BT - 1]), "fused_classifier [%s]: target -1 gave loss %g instead of NaN", s->name,
          losses_negative[BT - 1]);
    free(losses_negative);

    cudaCheck(cudaFree(d_logits)); cudaCheck(cudaFree(d_targets)); cudaCheck(cudaFree(d_losses));
    free(logits); free(targets); free(logits_f); free(ref_losses); free(ref_dlogits); free(initial_losses);
    free(losses_forward); free(logits_after); free(losses_bad);
    for (int run = 0; run < 2; run++) { free(dlogits[run]); free(losses[run]); }
}

static void test_global_norm(const Shape* s, size_t count) {
    uint16_t* values = random_bf16(count, -0.01f, 0.01f);
    double expected = 0.0;
    for (size_t i = 0; i < count; i++) { double v = bf16_bits_to_float(values[i]); expected += v * v; }
    floatX* d_values = (floatX*)device_copy(values, count * 2);
    float* d_partials = (float*)cuda_malloc_checked(global_norm_scratch_floats() * sizeof(float), "norm partials");
    float* d_out = (float*)cuda_malloc_checked(sizeof(float), "norm out");
    float results[2];
    for (int run = 0; run < 2; run++) {
        global_norm_squared(d_out, d_partials, d_values, count, 0);
        cudaCheck(cudaMemcpy(&results[run], d_out, sizeof(float), cudaMemcpyDeviceToHost));
    }
    float expected_f = (float)expected;
    check_float_close("global_norm_squared", s, &results[0], &expected_f, 1, 0.0, 1e-5);
    check_bitwise_equal("global_norm_squared", s, &results[0], &results[1], sizeof(float));
    cudaCheck(cudaFree(d_values)); cudaCheck(cudaFree(d_partials)); cudaCheck(cudaFree(d_out));
    free(values);
}

// AdamW on the GPU vs its host reference (adamw_update_bf16_ref, the same element functions):
// must be bit-identical, the FP8 weight outputs too (the amax; delayed: the codes). split > 0:
// two calls, elements [0, split) and [split, n), as ZeRO's parts of a tensor; the second's
// arrays start at an element that is not a multiple of 4 where split is not, so it runs the
// one-element kernel (a multiple of 4: the 4-element one). misaligned: 1 m, 2 the FP8 codes
// (delayed only) start off their alignment, every other array aligned
static void test_adamw(const Shape* s, size_t n, int with_master, int delayed, size_t split, int misaligned) {
    uint16_t* params = random_bf16(n, -0.1f, 0.1f);
    uint16_t* grads = random_bf16(n, -0.05f, 0.05f);
    float* master = bf16_bits_to_floats(params, n);
    for (size_t i = 0; i < n; i++) { master[i] += rand_uniform(-1e-4f, 1e-4f); }  // master != bf16 weight
    float* m = (float*)mallocCheck(n * sizeof(float));
    float* v = (float*)mallocCheck(n * sizeof(float));
    for (size_t i = 0; i < n; i++) { m[i] = rand_uniform(-1e-3f, 1e-3f); v[i] = rand_uniform(0.0f, 1e-5f); }
    AdamWElementParams hp;
    hp.learning_rate = 6e-4f; hp.beta1 = 0.9f; hp.beta2 = 0.95f;
    hp.m_hat_scale = (float)(1.0 / (1.0 - pow(0.9, 7))); hp.v_hat_scale = (float)(1.0 / (1.0 - pow(0.95, 7)));
    hp.eps = 1e-8f; hp.weight_decay = 0.1f;
    const float grad_scale = 0.75f;
    const uint32_t seed = 0x1234567u;

    floatX* d_params = (floatX*)device_copy(params, n * 2);
    float* d_master = with_master ? (float*)device_copy(master, n * sizeof(float)) : NULL;
    floatX* d_grads = (floatX*)device_copy(grads, n * 2);
    // misaligned == 1: m alone starts a float past 16-byte alignment, so the call must take the
    // one-element kernel although every other array would allow 4 elements a thread
    const size_t m_shift = misaligned == 1 ? 1 : 0;
    float* d_m_base = (float*)cuda_malloc_checked((n + m_shift) * sizeof(float), "adamw m");
    float* d_m = d_m_base + m_shift;
    cudaCheck(cudaMemcpy(d_m, m, n * sizeof(float), cudaMemcpyHostToDevice));
    float* d_v = (float*)device_copy(v, n * sizeof(float));
    const uint32_t first_index = 1000;  // as the part of a tensor from its element 1000
    Fp8WeightOutputs fp8;
    fp8_weight_outputs_init(&fp8, n, delayed, 0.05f);  // the previous step's amax: the values reach 0.1, some saturate
    fp8_weight_outputs_clear(&fp8);
    // misaligned == 2: the codes a byte past 4-byte alignment (copied into fp8's buffer after), so
    // the call must take the one-element kernel although every other array allows 4 elements a thread
    uint8_t* d_codes_shifted = NULL;
    if (misaligned == 2 && delayed) {
        d_codes_shifted = (uint8_t*)cuda_malloc_checked(n + 1, "adamw FP8 codes, misaligned");
        cudaCheck(cudaMemcpy(d_codes_shifted + 1, fp8.d_codes, n, cudaMemcpyDeviceToDevice));
    }
    if (split == 0) {
        Fp8WeightUpdate update = fp8_weight_outputs_device(&fp8, 0);
        if (d_codes_shifted != NULL) { update.codes = d_codes_shifted + 1; }
        adamw_update(d_params, d_master, d_grads, d_m, d_v, n, hp, grad_scale, seed, first_index, update, 0);
        if (d_codes_shifted != NULL) {
            cudaCheck(cudaMemcpy(fp8.d_codes, d_codes_shifted + 1, n, cudaMemcpyDeviceToDevice));
            cudaCheck(cudaFree(d_codes_shifted));
        }
    } else {
        adamw_update(d_params, d_master, d_grads, d_m, d_v, split, hp, grad_scale, seed, first_index,
                     fp8_weight_outputs_device(&fp8, 0), 0);
        adamw_update(d_params + split, with_master ? d_master + split : NULL, d_grads + split, d_m + split, d_v + split,
                     n - split, hp, grad_scale, seed, first_index + (uint32_t)split, fp8_weight_outputs_device(&fp8, split), 0);
    }
    uint16_t* got_params = (uint16_t*)host_copy(d_params, n * 2);
    float* got_m = (float*)host_copy(d_m, n * sizeof(float));
    float* got_v = (float*)host_copy(d_v, n * sizeof(float));
    float* got_master = with_master ? (float*)host_copy(d_master, n * sizeof(float)) : NULL;

    Fp8WeightRef fp8_ref = fp8_weight_outputs_host(&fp8, 0);
    adamw_update_bf16_ref(params, with_master ? master : NULL, grads, m, v, n, hp, grad_scale, seed, first_index, &fp8_ref);
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < n; i++) {
        int same = got_params[i] == params[i] && float_as_bits(got_m[i]) == float_as_bits(m[i]) &&
                   float_as_bits(got_v[i]) == float_as_bits(v[i]) &&
                   (!with_master || float_as_bits(got_master[i]) == float_as_bits(master[i]));
        if (!same) { if (bad == 0) { first = i; } bad++; }
    }
    char what[160];
    snprintf(what, sizeof(what), "adamw_update [%s, %s master, n=%zu split at %zu%s, %s weights]", s->name,
             with_master ? "fp32" : "no", n, split, misaligned == 1 ? ", m misaligned" : misaligned == 2 ? ", codes misaligned" : "",
             delayed ? "delayed" : "current");
    CHECK(bad == 0, "%s: %zu elements not bit-identical to the host reference (first %zu)", what, bad, first);
    fp8_weight_outputs_check(&fp8, n, what);

    fp8_weight_outputs_free(&fp8);
    cudaCheck(cudaFree(d_params)); cudaCheck(cudaFree(d_grads)); cudaCheck(cudaFree(d_m_base)); cudaCheck(cudaFree(d_v));
    if (with_master) { cudaCheck(cudaFree(d_master)); free(got_master); }
    free(params); free(grads); free(master); free(m); free(v); free(got_params); free(got_m); free(got_v);
}

/*
x128_float against the bf16's float bits for every bf16 bit pattern at every position of the
vector (vector v holds the patterns v + 8192 m, m = 0..7, rotated by 0..7 over 8 launches, so
each pattern is at each position once, and each vector mixes signs and exponents), the NaNs and
infinities included: the conversion is exact.
And x128_amax_bits of each vector against the largest fp8_amax_bits of its 8 floats (signs,
infinities and NaNs, whose order is the float bits').
*/
__global__ void x128_float_kernel(float* out, uint32_t* amax_bits, const floatX* in, int vectors) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= vectors) { return; }
    x128 x = load128(in + (size_t)i * x128::size);
    for (int k = 0; k < x128::size; k++) { out[(size_t)i * x128::size + k] = x128_float(x, k); }
    amax_bits[i] = x128_amax_bits(x);
}

static void test_x128_float(void) {
    const int patterns = 65536, vectors = patterns / x128::size;
    uint16_t* in = (uint16_t*)mallocCheck(patterns * sizeof(uint16_t));
    floatX* d_in = (floatX*)cuda_malloc_checked(patterns * sizeof(uint16_t), "x128_float input");
    float* d_out = (float*)cuda_malloc_checked(patterns * sizeof(float), "x128_float output");
    float* out = (float*)mallocCheck(patterns * sizeof(float));
    uint32_t* d_amax = (uint32_t*)cuda_malloc_checked(vectors * sizeof(uint32_t), "x128_amax_bits output");
    uint32_t* amax = (uint32_t*)mallocCheck(vectors * sizeof(uint32_t));
    size_t wrong = 0, wrong_amax = 0;
    for (int rotation = 0; rotation < x128::size; rotation++) {
        for (int i = 0; i < patterns; i++) {  // vector v: patterns v + 8192 m, its 8 top-3-bit ranges (sign, exponent)
            in[i] = (uint16_t)(i / x128::size + (patterns / x128::size) * ((i + rotation) % x128::size));
        }
        cudaCheck(cudaMemcpy(d_in, in, patterns * sizeof(uint16_t), cudaMemcpyHostToDevice));
        x128_float_kernel<<<ceil_div(vectors, 256), 256>>>(d_out, d_amax, d_in, vectors);
        cudaCheck(cudaGetLastError());
        cudaCheck(cudaMemcpy(out, d_out, patterns * sizeof(float), cudaMemcpyDeviceToHost));
        cudaCheck(cudaMemcpy(amax, d_amax, vectors * sizeof(uint32_t), cudaMemcpyDeviceToHost));
        for (int v = 0; v < vectors; v++) {
            uint32_t want_amax = 0;
            for (int k = 0; k < x128::size; k++) {
                int i = v * x128::size + k;
                uint32_t got, want = (uint32_t)in[i] << 16;
                memcpy(&got, &out[i], sizeof(got));
                wrong += got != want;
                uint32_t magnitude = fp8_amax_bits(bf16_bits_to_float(in[i]));
                want_amax = magnitude > want_amax ? magnitude : want_amax;
            }
            wrong_amax += amax[v] != want_amax;
        }
    }
    CHECK(wrong == 0, "x128_float: %zu of %d conversions differ from the bf16's float bits", wrong, x128::size * patterns);
    CHECK(wrong_amax == 0, "x128_amax_bits: %zu of %d vectors differ from their floats' largest fp8_amax_bits", wrong_amax,
          x128::size * vectors);
    free(in); free(out); free(amax);
    cudaCheck(cudaFree(d_in)); cudaCheck(cudaFree(d_out)); cudaCheck(cudaFree(d_amax));
}

/*
Shared-memory wavefronts of one warp's f128 access at the given slots (lanes < 0 idle): the
access runs a quarter-warp at a time (8 lanes x 16 bytes), and a quarter takes as many wavefronts
as the most distinct 128-byte rows any of the 32 four-byte banks is asked for.
*/
static int f128_access_wavefronts(const int* slots) {
    int wavefronts = 0;
    for (int quarter = 0; quarter < WARP_SIZE / 8; quarter++) {
        int rows_of_bank[32][8];
        int count_of_bank[32] = {0};
        int worst = 0;
        for (int lane = quarter * 8; lane < quarter * 8 + 8; lane++) {
            if (slots[lane] < 0) { continue; }
            for (int word = 0; word < 4; word++) {
                const int byte = slots[lane] * 16 + word * 4;
                const int bank = byte / 4 % 32, row = byte / 128;
                bool seen = false;
                for (int r = 0; r < count_of_bank[bank]; r++) { seen = seen || rows_of_bank[bank][r] == row; }
                if (!seen) { rows_of_bank[bank][count_of_bank[bank]++] = row; }
                worst = count_of_bank[bank] > worst ? count_of_bank[bank] : worst;
            }
        }
        wavefronts += worst;
    }
    return wavefronts;
}

// layernorm_backward's column-sum slots: each (chunk, half) its own slot among a sum's C / 4, and
// every warp access (the lanes' chunks first + lane, one half) in the fewest wavefronts
static void test_layernorm_column_slots(void) {
    const int widths[] = {40, 768, 1024, 1280, 1600};
    for (int w = 0; w < 5; w++) {
        const int chunks = widths[w] / x128::size;
        int* owner = (int*)mallocCheck(2 * chunks * sizeof(int));
        for (int i = 0; i < 2 * chunks; i++) { owner[i] = -1; }
        int clashes = 0, slow_accesses = 0;
        for (int half = 0; half < 2; half++) {
            for (int first = 0; first < chunks; first += WARP_SIZE) {
                int slots[WARP_SIZE];
                int active = 0;
                for (int lane = 0; lane < WARP_SIZE; lane++) {
                    const int chunk = first + lane;
                    slots[lane] = chunk < chunks ? layernorm_column_slot(chunk, half, chunks) : -1;
                    if (slots[lane] < 0) { continue; }
                    active++;
                    if (slots[lane] >= 2 * chunks || owner[slots[lane]] >= 0) { clashes++; continue; }
                    owner[slots[lane]] = 2 * chunk + half;
                }
                slow_accesses += f128_access_wavefronts(slots) > ceil_div(active, 8);
            }
        }
        CHECK(clashes == 0, "layernorm_column_slot at C=%d: %d (chunk, half) pairs share a slot or leave the sum", widths[w],
              clashes);
        CHECK(slow_accesses == 0, "layernorm_column_slot at C=%d: %d warp accesses take more shared-memory wavefronts than "
              "their lanes' bytes need (bank conflicts)", widths[w], slow_accesses);
        free(owner);
    }
}

// the MFU denominator: datasheet names as cudaGetDeviceProperties reports them
static void test_device_peaks(void) {
    CHECK(bf16_dense_peak_tflops("NVIDIA H100 80GB HBM3") == 989.0f, "H100 SXM peak");
    CHECK(bf16_dense_peak_tflops("NVIDIA H100 PCIe") == 756.0f, "H100 PCIe peak");
    CHECK(bf16_dense_peak_tflops("NVIDIA H100 NVL") == 835.0f, "H100 NVL peak");
    CHECK(bf16_dense_peak_tflops("NVIDIA H200") == 989.0f, "H200 peak");
    CHECK(bf16_dense_peak_tflops("NVIDIA H200 NVL") == 835.0f, "H200 NVL peak");
    CHECK(bf16_dense_peak_tflops("NVIDIA GH200 480GB") == 989.0f, "GH200 peak");
    CHECK(bf16_dense_peak_tflops("NVIDIA A100-SXM4-80GB") == 0.0f, "unknown device has no peak");
}

// the elementwise kernels' grid, computed on the host at counts no test allocates: B*T*4C passes
// 2^31 elements on a shallow wide model that fits an H200 (L=1, C=1600, B=328, T=1024), where
// an int count went negative, or wrapped to a small positive one and left the rest stale
static void test_vector_kernel_grid(void) {
    const size_t past_int = (size_t)328 * 1024 * 4 * 1600;  // 2,149,580,800
    const size_t past_uint = (size_t)656 * 1024 * 4 * 1600;  // 4,299,161,600, which an int wraps to 4,194,304
    CHECK(vector_kernel_grid(past_int, 256, "gelu_forward") == 1049600, "grid of 2^31 + 4M elements");
    CHECK(vector_kernel_grid(past_uint, 256, "gelu_forward") == 2099200, "grid of 2^32 + 100M elements");
    CHECK(vector_kernel_grid(8, 256, "gelu_forward") == 1, "grid of one vector");
    CHECK(vector_kernel_grid((size_t)256 * 8 + 8, 256, "gelu_forward") == 2, "grid of one block and a vector");
    CHECK_DIES("vector_kernel_grid of 12 elements", "gelu_forward: 12 elements must be a positive multiple of 8",
               vector_kernel_grid(12, 256, "gelu_forward"));
    CHECK_DIES("vector_kernel_grid of 0 elements", "must be a positive multiple of 8", vector_kernel_grid(0, 256, "gelu_forward"));
    CHECK_DIES("vector_kernel_grid past CUDA's grid", "above CUDA's 2^31-1",
               vector_kernel_grid((size_t)1 << 45, 256, "gelu_backward_inplace"));
    // the limit itself: 2^31-1 blocks is CUDA's largest grid, one block more is not
    CHECK(vector_kernel_grid((size_t)0x7fffffff * 256 * 8, 256, "gelu_forward") == 0x7fffffffu, "grid of 2^31-1 blocks");
    CHECK_DIES("vector_kernel_grid of 2^31 blocks", "need 2147483648 blocks of 256 threads, above CUDA's 2^31-1",
               vector_kernel_grid((size_t)1 << 42, 256, "gelu_forward"));
}

// a request past any GPU's memory after 256 MiB taken: the one line names the request and what it was for
// (cuda_malloc_checked), and the memory free, at most the device's less those 256 MiB, before the device's, not the
// runtime's error code. Before any CUDA call in this process (a child may not follow one)
static void allocate_past_the_device(void) {
    (void)cuda_malloc_checked((size_t)256 << 20, "a first tensor");
    (void)cuda_malloc_checked((size_t)1 << 40, "a test tensor");
}

static void test_out_of_memory_line(void) {
    const char* line = "out of GPU memory: 1024.00 GiB requested for a test tensor, ";
    CHECK_DIES("cuda_malloc_checked of 1 TiB", line, allocate_past_the_device());
    ChildRun run;
    if (child_run_begin(&run)) { allocate_past_the_device(); _exit(0); }
    char text[CHILD_STDERR_MAX + 1];
    size_t length;
    child_run_collect(&run, text, &length);
    const char* at = strstr(text, line);
    double free_gib = -1.0, total_gib = -1.0;
    int parsed = at != NULL && sscanf(at + strlen(line), "%lf GiB free of %lf GiB", &free_gib, &total_gib) == 2;
    CHECK(parsed && free_gib >= 0.0 && free_gib <= total_gib - 0.2, "out-of-memory line, free then total: [%s]", text);
}

// what device_info_query reports is the current device's properties (the trainer's device line, MFU and -lg)
static void test_device_info(void) {
    DeviceInfo info = device_info_query();
    cudaDeviceProp prop;
    cudaCheck(cudaGetDeviceProperties(&prop, 0));
    char bus_id[32];
    snprintf(bus_id, sizeof(bus_id), "%04x:%02x:%02x.0", (unsigned)prop.pciDomainID, (unsigned)prop.pciBusID,
             (unsigned)prop.pciDeviceID);
    CHECK(strcmp(info.name, prop.name) == 0 && info.sm_count == prop.multiProcessorCount &&
          info.total_memory_bytes == prop.totalGlobalMem && info.bf16_peak_tflops == bf16_dense_peak_tflops(prop.name) &&
          strcmp(info.pci_bus_id, bus_id) == 0,
          "device_info_query: %s, %d SMs, %zu bytes, %.0f TFLOP/s, bus %s; the properties: %s, %d SMs, %zu bytes, bus %s",
          info.name, info.sm_count, info.total_memory_bytes, info.bf16_peak_tflops, info.pci_bus_id, prop.name,
          prop.multiProcessorCount, prop.totalGlobalMem, bus_id);
}

/*
The -kt table (llmc/profiler.h) by what it counts, which a GPU and cudasim agree on (the times do not): a first
step discarded, two recorded steps of PROFILER_MAX_MARKS + 5 marks cycling through PROFILER_MAX_NAMES + 2 names.
Each name's calls per step is its share of the first PROFILER_MAX_MARKS marks, the names past the table's
last row charged to that row, the 5 marks a step past the limit dropped and said so; and no table before a
recorded step, nor a count of a mark outside a step.
*/
#define PROFILER_TEST_NAMES (PROFILER_MAX_NAMES + 2)
static void test_profiler_counts(void) {
    static char names[PROFILER_TEST_NAMES][8];
    for (int k = 0; k < PROFILER_TEST_NAMES; k++) { snprintf(names[k], sizeof(names[k]), "k%02d", k); }
    const int extra = 5;
    profiler_init(1);
    for (int step = 0; step < 3; step++) {
        profiler_begin_step(0);
        for (int i = 0; i < (step == 0 ? 3 : PROFILER_MAX_MARKS + extra); i++) { profiler_mark(names[i % PROFILER_TEST_NAMES]); }
        profiler_end_step(step > 0);
        if (step == 0) {
            FILE* none = tmpfile();
            profiler_print(none);
            CHECK(ftell(none) == 0, "profiler: a table printed before any recorded step");
            fclose(none);
        }
    }
    profiler_mark(names[0]);  // outside a step (an eval's forward): neither charged nor dropped
    FILE* out = tmpfile();
    profiler_print(out);
    rewind(out);
    long want[PROFILER_MAX_NAMES] = {0}, got[PROFILER_MAX_NAMES], rows = 0;
    for (int i = 0; i < PROFILER_MAX_MARKS; i++) {
        int k = i % PROFILER_TEST_NAMES;
        want[k < PROFILER_MAX_NAMES ? k : PROFILER_MAX_NAMES - 1]++;
    }
    for (int k = 0; k < PROFILER_MAX_NAMES; k++) { got[k] = -1; }
    char line[256], header[256] = "", dropped[256] = "";
    while (fgets(line, sizeof(line), out) != NULL) {
        char name[32];
        double ms, share;
        long calls;
        int k;
        if (strncmp(line, "kernel breakdown", 16) == 0) { snprintf(header, sizeof(header), "%s", line); }
        if (line[0] == '(') { snprintf(dropped, sizeof(dropped), "%s", line); }
        if (sscanf(line, "| %31s | %lf | %lf%% | %ld |", name, &ms, &share, &calls) == 4 && sscanf(name, "k%d", &k) == 1 &&
            k >= 0 && k < PROFILER_MAX_NAMES) {
            got[k] = calls;
            rows++;
        }
    }
    fclose(out);
    profiler_free();
    int wrong = 0;
    for (int k = 0; k < PROFILER_MAX_NAMES; k++) { wrong += got[k] != want[k]; }
    CHECK(rows == PROFILER_MAX_NAMES && wrong == 0, "profiler: %ld rows, %d with calls per step other than expected (k00: %ld, "
          "want %ld; k%02d: %ld, want %ld)", rows, wrong, got[0], want[0], PROFILER_MAX_NAMES - 1, got[PROFILER_MAX_NAMES - 1],
          want[PROFILER_MAX_NAMES - 1]);
    CHECK(strcmp(header, "kernel breakdown over 2 steps (ms per step):\n") == 0, "profiler header: %s", header);
    char want_dropped[128];
    snprintf(want_dropped, sizeof(want_dropped), "(%d marks beyond %d per step were dropped", 2 * extra, PROFILER_MAX_MARKS);
    CHECK(strncmp(dropped, want_dropped, strlen(want_dropped)) == 0, "profiler: dropped marks line [%s]", dropped);
}

int main(void) {
    test_device_peaks();
    test_vector_kernel_grid();
    test_out_of_memory_line();
    int device_count = 0;
    if (cudaGetDeviceCount(&device_count) != cudaSuccess || device_count == 0) {
        llm8_die("test_kernels needs a CUDA GPU and found none (run it with make gpucheck on a GPU machine)");
    }
    DeviceInfo info = device_info_query();
    printf("device: %s, %d SMs, %.1f GiB, bf16 peak %.0f TFLOP/s\n", info.name, info.sm_count,
           info.total_memory_bytes / 1073741824.0, info.bf16_peak_tflops);
    test_device_info();
    const Shape shapes[] = {
        {"B=4 T=64 C=768 V=50257", 4, 64, 768, 50257, 50304},
        {"B=3 T=5 C=40 V=97", 3, 5, 40, 97, 104},
    };
    for (int i = 0; i < 2; i++) {
        const Shape* s = &shapes[i];
        printf("shape %s\n", s->name);
        test_encoder(s);
        test_layernorm(s);
        test_gelu(s);
        test_fused_classifier(s);
    }
    // the classifier's chunks with no padding column among them (V a multiple of 8), none at all
    // (Vp = V), and a row shorter than one chunk (V < 8): its whole-chunk loops and the rest
    const Shape classifier_edges[] = {
        {"B=2 T=8 V=96 Vp=112", 2, 8, 40, 96, 112},
        {"B=2 T=8 V=96 Vp=96", 2, 8, 40, 96, 96},
        {"B=2 T=8 V=5 Vp=16", 2, 8, 40, 5, 16},
    };
    for (int i = 0; i < 3; i++) {
        printf("shape %s\n", classifier_edges[i].name);
        test_fused_classifier(&classifier_edges[i]);
    }
    // d48's width: a lane's 6 or 7 chunks of a row take two of layernorm_backward's batches of loads
    const Shape d48_width = {"B=2 T=16 C=1600", 2, 16, 1600, 97, 104};
    printf("shape %s\n", d48_width.name);
    test_layernorm(&d48_width);
    // more rows than layernorm_backward's grid has warps (528 x 4): a warp sums several rows
    const Shape many_rows = {"B=1 T=4261 C=40", 1, 4261, 40, 97, 104};
    test_layernorm_dinp_uses(&many_rows);
    test_layernorm_dinp_uses(&d48_width);
    test_x128_float();
    test_layernorm_column_slots();
    test_global_norm(&shapes[0], (size_t)50 * 1000 * 1000 + 5);
    test_global_norm(&shapes[1], 1003);
    test_global_norm(&shapes[1], (size_t)8 * 512 * 37 + 8 * 5 + 3);  // a grid of 38 blocks, the last one short
    for (int delayed = 0; delayed < 2; delayed++) {
        test_adamw(&shapes[0], (size_t)(1 << 22) + 3, 1, delayed, 0, 0);
        test_adamw(&shapes[0], (size_t)(1 << 22) + 3, 0, delayed, 0, 0);
        test_adamw(&shapes[1], 37, 1, delayed, 0, 0);
        test_adamw(&shapes[1], 1003, 1, delayed, 5, 0);  // the second part misaligned: one element a thread
        test_adamw(&shapes[1], 1003, 0, delayed, 8, 0);  // the second part aligned, from element 8
        test_adamw(&shapes[1], 1003, 1, delayed, 0, 1);
        if (delayed) { test_adamw(&shapes[1], 1003, 1, delayed, 0, 2); }
    }
    // a row wider than a block's 256 x 8 channels (C > 2048, a checkpoint's width): the encoder's
    // kernels take the row's second slice from blockIdx.y (last: its draws shift no other test's inputs)
    const Shape wide_rows = {"B=2 T=3 C=2056", 2, 3, 2056, 11, 16};
    printf("shape %s\n", wide_rows.name);
    test_encoder(&wide_rows);
    test_global_norm(&shapes[1], 5);  // fewer than one 16-byte chunk: the tail alone, still one block
    // layernorm where the tolerances of test_layernorm hide eps and the backward's mean terms
    // (after the tests above: the backward's draws shift no other test's inputs)
    test_layernorm_low_variance(16, 40);
    test_layernorm_low_variance(16, 768);
    for (int null_directions = 0; null_directions < 2; null_directions++) {
        test_layernorm_backward_precise(64, 40, null_directions);
        test_layernorm_backward_precise(64, 768, null_directions);
        test_layernorm_backward_precise(32, 1600, null_directions);
    }
    // the classifier's first pass where a thread's last batch of whole chunks ends inside the batch, with a
    // step of it landing exactly on the chunk V falls in (6 + 512 = V / 8; GPT-2's V = 50257 never has
    // that): that chunk is not a whole one, and taking its zeros as logits would add 8 terms exp(0 - max)
    const Shape classifier_batch_edge = {"B=2 T=8 V=4147 Vp=4160", 2, 8, 40, 4147, 4160};
    printf("shape %s\n", classifier_batch_edge.name);
    test_fused_classifier(&classifier_batch_edge);
    test_profiler_counts();
    return test_summary("test_kernels");
}
