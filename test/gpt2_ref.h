/*
gpt2_ref.h: the fp32 CPU reference of GPT-2: one function per op, and a whole model
(forward, backward, zero-grad, global norm, AdamW) built from them.

Why: it is the oracle. The GPU kernel tests (test/test_*.cu) compare each kernel with the
op of the same name here, the PyTorch fixture test checks this file against an independent
implementation, and `make train_gpt2cpu` trains a tiny model with it on a machine without a
GPU. So it is written to be obviously right rather than fast:
- plain loops over the llm.c layouts (activations [B][T][C], weights [OC][C]), header-only
  static functions in C that also compiles as C++ and under nvcc;
- fp32 storage; every dot product and row statistic (matmul outputs, attention scores,
  layernorm mean/variance, softmax normalizers, the global norm) accumulates in double, so
  the reference's own rounding stays far below the tolerances of the GPU comparisons.
  Scatter-style sums (weight gradients, dq/dk/dv) accumulate in place in fp32;
- every backward ADDS into its gradient outputs (dinp included): the caller zeroes them.
  That keeps the ops composable (a residual stream's gradient is a sum) and makes
  gradient accumulation across micro-steps free;
- attention never materializes the B*NH*T*T score matrix: the forward saves the
  log-sum-exp of each query row and the backward recomputes probabilities row by row
  (the flash-attention identity D = dout . out), so T=1024 comparisons fit in memory;
- the element math (GELU, the AdamW update) comes from llmc/element_math.h, the very code
  the kernels run.
- FP8 emulation (off by default; gpt2ref_set_fp8_emulation turns it on): the linears
  quantize-dequantize their GEMM operands at exactly the points the GPU casts to FP8, with
  llmc/fp8.h's codec and llmc/fp8_scaling.h's scaling state machine, so it emulates what the
  GPU computes; with it off every op is the plain fp32 one, bit for bit.
Built with -fopenmp, every op of a step runs on all cores but a few small serial sums (the
encoder's backward scatter, the bias gradients, the mean loss, the global norm); without it
the pragmas vanish. Each thread owns whole outputs: matmul rows, a row's layernorm or softmax,
one (batch, head) of attention, a chunk of elements, so every output sums its terms in the
plain loop's order and results do not depend on the thread count (test_fp8_emulation's
test_thread_count compares 1 thread with 4). Reductions across threads are only maxima and
integer counts (an FP8 cast's amax and statistics), which any order adds alike. Why all: on one CI core a
d12 step with the FP8 emulation (B=4, T=64) spent 58% in the matmuls and 28% in the casts, so
with only the matmuls parallel two cores ran it 1.2x faster than one and a GPU machine's 16
would have waited on the serial rest most of the time (test_gpt2's reference-heavy section 6
took 162 s on an H200's host); with every op parallel two cores run it 1.7x faster than one
(the step took 16.1 s on two CI cores before, 11.4 s after). The forward walks rows in blocks
(REF_ROW_BLOCK), with each element's sum in the plain loop's order.
*/
#ifndef TEST_GPT2_REF_H
#define TEST_GPT2_REF_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include "llmc/utils.h"
#include "llmc/element_math.h"
#include "llmc/gpt2_config.h"
#include "llmc/fp8_scaling.h"
#include "llmc/fp8_recipe.h"

#ifdef _OPENMP
#define REF_PARALLEL_FOR _Pragma("omp parallel for")
#define REF_PRAGMA(text) _Pragma(#text)
#define REF_PARALLEL_FOR_MAX(variable) REF_PRAGMA(omp parallel for reduction(max : variable))
#else
#define REF_PARALLEL_FOR
#define REF_PARALLEL_FOR_MAX(variable)
#endif

// an FP8 cast (each chunk counting into its own statistics) and AdamW's update split their
// elements into chunks of REF_CHUNK, a thread each: chunk k of n elements starts at k * REF_CHUNK
#define REF_CHUNK ((size_t)1 << 16)
static inline size_t ref_chunk_count(size_t n) { return (n + REF_CHUNK - 1) / REF_CHUNK; }
static inline size_t ref_chunk_length(size_t n, size_t k) { return n - k * REF_CHUNK < REF_CHUNK ? n - k * REF_CHUNK : REF_CHUNK; }

#define REF_LAYERNORM_EPS 1e-5

// ----------------------------------------------------------------------------
// ops

// out[b][t][:] = wte[inp[b][t]][:] + wpe[t][:]
static inline void ref_encoder_forward(float* out, const int* inp, const float* wte, const float* wpe, int B, int T, int C) {
    REF_PARALLEL_FOR
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            float* out_bt = out + ((size_t)b * T + t) * C;
            const float* wte_row = wte + (size_t)inp[b * T + t] * C;
            const float* wpe_row = wpe + (size_t)t * C;
            for (int c = 0; c < C; c++) { out_bt[c] = wte_row[c] + wpe_row[c]; }
        }
    }
}

// dwte, dwpe += (scatter of dout)
static inline void ref_encoder_backward(float* dwte, float* dwpe, const float* dout, const int* inp, int B, int T, int C) {
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            const float* dout_bt = dout + ((size_t)b * T + t) * C;
            float* dwte_row = dwte + (size_t)inp[b * T + t] * C;
            float* dwpe_row = dwpe + (size_t)t * C;
            for (int c = 0; c < C; c++) {
                dwte_row[c] += dout_bt[c];
                dwpe_row[c] += dout_bt[c];
            }
        }
    }
}

// out = (inp - mean) * rstd * weight + bias over each row of C; mean[N], rstd[N] saved for
// the backward; rstd = 1/sqrt(var + 1e-5), var the biased variance
static inline void ref_layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                                  const float* weight, const float* bias, int N, int C) {
    REF_PARALLEL_FOR
    for (int i = 0; i < N; i++) {
        const float* x = inp + (size_t)i * C;
        double sum = 0.0;
        for (int c = 0; c < C; c++) { sum += x[c]; }
        double m = sum / C;
        double var_sum = 0.0;
        for (int c = 0; c < C; c++) { double d = x[c] - m; var_sum += d * d; }
        double s = 1.0 / sqrt(var_sum / C + REF_LAYERNORM_EPS);
        float* y = out + (size_t)i * C;
        for (int c = 0; c < C; c++) { y[c] = (float)((x[c] - m) * s) * weight[c] + bias[c]; }
        mean[i] = (float)m;
        rstd[i] = (float)s;
    }
}

// dinp, dweight, dbias += (gradients of the layernorm above). dinp's rows, then dweight's and
// dbias's columns (each summing over the rows in order), are split among the threads
#define REF_LAYERNORM_COLUMNS 64
static inline void ref_layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                                   const float* weight, const float* mean, const float* rstd, int N, int C) {
    REF_PARALLEL_FOR
    for (int i = 0; i < N; i++) {
        const float* x = inp + (size_t)i * C;
        const float* dy = dout + (size_t)i * C;
        float* dx = dinp + (size_t)i * C;
        double m = mean[i], s = rstd[i];
        // with xhat = (x - mean) * rstd and dxhat = dout * weight:
        // dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat))
        double dxhat_sum = 0.0, dxhat_xhat_sum = 0.0;
        for (int c = 0; c < C; c++) {
            double xhat = (x[c] - m) * s;
            double dxhat = (double)dy[c] * weight[c];
            dxhat_sum += dxhat;
            dxhat_xhat_sum += dxhat * xhat;
        }
        double dxhat_mean = dxhat_sum / C, dxhat_xhat_mean = dxhat_xhat_sum / C;
        for (int c = 0; c < C; c++) {
            double xhat = (x[c] - m) * s;
            double dxhat = (double)dy[c] * weight[c];
            dx[c] += (float)(s * (dxhat - dxhat_mean - xhat * dxhat_xhat_mean));
        }
    }
    REF_PARALLEL_FOR
    for (int c0 = 0; c0 < C; c0 += REF_LAYERNORM_COLUMNS) {
        const int c1 = c0 + REF_LAYERNORM_COLUMNS < C ? c0 + REF_LAYERNORM_COLUMNS : C;
        for (int i = 0; i < N; i++) {
            const float* x = inp + (size_t)i * C;
            const float* dy = dout + (size_t)i * C;
            double m = mean[i], s = rstd[i];
            for (int c = c0; c < c1; c++) {
                double xhat = (x[c] - m) * s;
                dweight[c] += (float)(dy[c] * xhat);
                dbias[c] += dy[c];
            }
        }
    }
}

// The forward takes REF_ROW_BLOCK rows of its input at a time, converted to double once and
// stored column by column (x_block[c][r]): each weight row is then read once per block rather
// than once per row, and the block's double-precision dot products are REF_ROW_BLOCK
// independent chains that the compiler runs as vector lanes (a single chain waits on each
// add; with the rows strided in memory they ran one at a time: 4x slower on lm_head's shape).
// Every output element still sums its terms in the same order (c ascending) as a loop over
// single rows, so the results are bitwise the same; a thread owns whole blocks of rows.
#define REF_ROW_BLOCK 16

// The backward matmuls' inner loop is built twice, for AVX2 and for baseline x86-64 (SSE2), and
// the loader picks by the CPU: AVX2's vectors have twice the lanes, so the reference runs its
// matmuls up to twice as fast where the CPU has it (every CI and GPU machine) and still runs
// where it does not. Both clones give the same bits: each lane adds its terms in the same
// order, and neither contracts a multiply and an add into an FMA (AVX2 does not enable FMA:
// the float products there are rounded, and an FMA would skip that rounding).
#if defined(__GNUC__) && defined(__x86_64__)
#define REF_VECTOR_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define REF_VECTOR_CLONES
#endif

// A clone with FMA (and the 256-bit vectors that come with it), only for code whose bits a
// fused multiply-add cannot change: the forward's dot products add double products of two
// floats, which are exact (24 + 24 significant bits of 53), so an FMA rounds exactly as the
// multiply and the add; AdamW's update (ref_adamw_range) calls fmaf, which rounds once either
// way, and adds no other product.
#if defined(__GNUC__) && defined(__x86_64__)
#define REF_FMA_CLONES __attribute__((target_clones("fma", "default")))
#else
#define REF_FMA_CLONES
#endif

// acc[j][r] += sum over c of x_block[c][r] * w_j[c], for the REF_ROW_BLOCK rows of a block and
// two weight rows, c ascending: 2 x REF_ROW_BLOCK independent sums keep more multiply-adds in
// flight while each waits on its previous add, and each x_block load serves both rows (on a CI
// core, at d12's shapes, one weight row at a time ran 1.1x to 1.5x slower; the backward's
// pairs below gained 1.0x to 1.4x)
REF_FMA_CLONES static inline void ref_block_dot_pair(double (*__restrict__ acc)[REF_ROW_BLOCK],
                                                     const double* __restrict__ x_block, const float* __restrict__ w0,
                                                     const float* __restrict__ w1, int C) {
    for (int c = 0; c < C; c++) {
        const double w0_c = w0[c], w1_c = w1[c];
        const double* x_c = x_block + (size_t)c * REF_ROW_BLOCK;
        for (int r = 0; r < REF_ROW_BLOCK; r++) {
            acc[0][r] += x_c[r] * w0_c;
            acc[1][r] += x_c[r] * w1_c;
        }
    }
}

// y0[0..n) += a0[0] x[0][0..n), then += a0[1] x[1][0..n), ..., k terms in turn (a0's terms
// a_stride floats apart, x's rows x_stride), and y1 likewise with a1's terms on the same x: k
// axpys one after another, bit for bit (each element adds the rounded product a[j] x[j][i] in j
// order), but with REF_AXPY_LANES elements of each y held in registers across the k terms, where
// one axpy a call loaded and stored all of y k times and paid a call through the clone's dispatch
// each time (41% of a tiny CPU model's step, perf), and each load of x serving both rows. A row
// alone is passed as both (y1 = y0, a1 = a0): the two sums are then the same and so is the store.
#define REF_AXPY_LANES 32
REF_VECTOR_CLONES static void ref_axpy_terms_pair(float* y0, float* y1, const float* __restrict__ a0,
                                                  const float* __restrict__ a1, size_t a_stride,
                                                  const float* __restrict__ x, size_t x_stride, int k, int n) {
    int i0 = 0;
    for (; i0 + REF_AXPY_LANES <= n; i0 += REF_AXPY_LANES) {
        float acc0[REF_AXPY_LANES], acc1[REF_AXPY_LANES];
        for (int r = 0; r < REF_AXPY_LANES; r++) {
            acc0[r] = y0[i0 + r];
            acc1[r] = y1[i0 + r];
        }
        for (int j = 0; j < k; j++) {
            const float a0_j = a0[(size_t)j * a_stride], a1_j = a1[(size_t)j * a_stride];
            const float* x_j = x + (size_t)j * x_stride + i0;
            for (int r = 0; r < REF_AXPY_LANES; r++) {
                acc0[r] += a0_j * x_j[r];
                acc1[r] += a1_j * x_j[r];
            }
        }
        for (int r = 0; r < REF_AXPY_LANES; r++) {
            y0[i0 + r] = acc0[r];
            y1[i0 + r] = acc1[r];
        }
    }
    for (int i = i0; i < n; i++) {
        float acc0 = y0[i], acc1 = y1[i];
        for (int j = 0; j < k; j++) {
            acc0 += a0[(size_t)j * a_stride] * x[(size_t)j * x_stride + i];
            acc1 += a1[(size_t)j * a_stride] * x[(size_t)j * x_stride + i];
        }
        y0[i] = acc0;
        y1[i] = acc1;
    }
}

// out[N][OC] = inp[N][C] . weight[OC][C]^T + bias[OC] (bias may be NULL)
static inline void ref_matmul_forward(float* out, const float* inp, const float* weight, const float* bias,
                               int N, int C, int OC) {
    REF_PARALLEL_FOR
    for (int n0 = 0; n0 < N; n0 += REF_ROW_BLOCK) {
        const int rows = N - n0 < REF_ROW_BLOCK ? N - n0 : REF_ROW_BLOCK;
        double* x_block = (double*)malloc(sizeof(double) * REF_ROW_BLOCK * (size_t)C);
        if (x_block == NULL) { llm8_die("ref_matmul_forward: out of memory for a block of %d x %d", REF_ROW_BLOCK, C); }
        for (int c = 0; c < C; c++) {
            for (int r = 0; r < REF_ROW_BLOCK; r++) {  // a short last block is padded with zeros, not stored
                x_block[(size_t)c * REF_ROW_BLOCK + r] = r < rows ? (double)inp[(size_t)(n0 + r) * C + c] : 0.0;
            }
        }
        for (int o = 0; o < OC; o += 2) {
            const int pair = OC - o < 2 ? 1 : 2;  // an odd OC's last row goes alone (twice, the copy unused)
            double acc[2][REF_ROW_BLOCK];
            for (int j = 0; j < 2; j++) {
                for (int r = 0; r < REF_ROW_BLOCK; r++) { acc[j][r] = bias != NULL ? bias[o + j % pair] : 0.0; }
            }
            ref_block_dot_pair(acc, x_block, weight + (size_t)o * C, weight + (size_t)(o + pair - 1) * C, C);
            for (int j = 0; j < pair; j++) {
                for (int r = 0; r < rows; r++) { out[(size_t)(n0 + r) * OC + o + j] = (float)acc[j][r]; }
            }
        }
        free(x_block);
    }
}

// The backward's axpys are ordered so that what they reread stays in cache: the dgrad applies
// REF_WEIGHT_CHUNK weight rows at a time to a block of REF_ROW_BLOCK input-gradient rows (row
// by row, each row streamed the whole weight from memory: lm_head's 154 MB, 256 times a batch),
// and the wgrad takes REF_WEIGHT_CHUNK weight-gradient rows at a time through the N input rows
// (each input row read once for all of them, not once per weight row), REF_WEIGHT_CHUNK input
// rows to a ref_axpy_terms_pair call, two output rows at a time. Every element still adds its
// terms in the same order (o ascending in dinp, n ascending in dweight), so the results are
// bitwise those of the plain loops.
#define REF_WEIGHT_CHUNK 32

// dinp[N][C] += dout . weight (dgrad)
static inline void ref_matmul_backward_dgrad(float* dinp, const float* dout, const float* weight, int N, int C, int OC) {
    REF_PARALLEL_FOR
    for (int n0 = 0; n0 < N; n0 += REF_ROW_BLOCK) {
        const int n_end = N - n0 < REF_ROW_BLOCK ? N : n0 + REF_ROW_BLOCK;
        for (int o0 = 0; o0 < OC; o0 += REF_WEIGHT_CHUNK) {
            const int terms = OC - o0 < REF_WEIGHT_CHUNK ? OC - o0 : REF_WEIGHT_CHUNK;
            for (int n = n0; n < n_end; n += 2) {
                const int last = n_end - n < 2 ? n : n + 1;  // an odd last row goes alone
                ref_axpy_terms_pair(dinp + (size_t)n * C, dinp + (size_t)last * C, dout + (size_t)n * OC + o0,
                                    dout + (size_t)last * OC + o0, 1, weight + (size_t)o0 * C, C, terms, C);
            }
        }
    }
}

// dweight[OC][C] += dout^T . inp (wgrad)
static inline void ref_matmul_backward_wgrad(float* dweight, const float* dout, const float* inp, int N, int C, int OC) {
    REF_PARALLEL_FOR
    for (int o0 = 0; o0 < OC; o0 += REF_WEIGHT_CHUNK) {
        const int o_end = OC - o0 < REF_WEIGHT_CHUNK ? OC : o0 + REF_WEIGHT_CHUNK;
        for (int n0 = 0; n0 < N; n0 += REF_WEIGHT_CHUNK) {
            const int terms = N - n0 < REF_WEIGHT_CHUNK ? N - n0 : REF_WEIGHT_CHUNK;
            for (int o = o0; o < o_end; o += 2) {
                const int last = o_end - o < 2 ? o : o + 1;  // an odd last row goes alone
                ref_axpy_terms_pair(dweight + (size_t)o * C, dweight + (size_t)last * C, dout + (size_t)n0 * OC + o,
                                    dout + (size_t)n0 * OC + last, (size_t)OC, inp + (size_t)n0 * C, C, terms, C);
            }
        }
    }
}

// dbias[OC] += column sums of dout
static inline void ref_matmul_backward_bias(float* dbias, const float* dout, int N, int OC) {
    for (int o = 0; o < OC; o++) {
        double bias_sum = 0.0;
        for (int n = 0; n < N; n++) { bias_sum += dout[(size_t)n * OC + o]; }
        dbias[o] += (float)bias_sum;
    }
}

// dinp[N][C] += dout . weight; dweight[OC][C] += dout^T . inp; dbias[OC] += column sums of
// dout (dbias may be NULL for a matmul without bias). Unlike the GPU matmul, whose dinp is
// overwritten, every output here is added to.
static inline void ref_matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                                const float* weight, int N, int C, int OC) {
    ref_matmul_backward_dgrad(dinp, dout, weight, N, C, OC);
    ref_matmul_backward_wgrad(dweight, dout, inp, N, C, OC);
    if (dbias != NULL) { ref_matmul_backward_bias(dbias, dout, N, OC); }
}

// dot product of two fp32 vectors, accumulated in double
static inline double ref_dot(const float* a, const float* b, int n) {
    double acc = 0.0;
    for (int i = 0; i < n; i++) { acc += (double)a[i] * b[i]; }
    return acc;
}

/*
Causal multi-head self-attention. qkv is [B][T][3C]: q, then k, then v, each [NH][HS] with
HS = C/NH. out is [B][T][C] ([NH][HS] per position). Scores are scaled by 1/sqrt(HS).
lse[B][NH][T] receives log(sum_{s<=t} exp(score(t,s))), all the backward needs to rebuild
the probabilities.
*/
static inline void ref_attention_forward(float* out, float* lse, const float* qkv, int B, int T, int C, int NH) {
    int HS = C / NH;
    size_t C3 = (size_t)3 * C;
    double scale = 1.0 / sqrt((double)HS);
    REF_PARALLEL_FOR
    for (int bh = 0; bh < B * NH; bh++) {  // a thread owns one (b, h)
        const int b = bh / NH, h = bh % NH;
        const float* qkv_b = qkv + (size_t)b * T * C3;
        double* scores = (double*)mallocCheck((size_t)T * sizeof(double));
        double* acc = (double*)mallocCheck((size_t)HS * sizeof(double));
        for (int t = 0; t < T; t++) {
            const float* q = qkv_b + t * C3 + (size_t)h * HS;
            double max_score = -INFINITY;
            for (int s = 0; s <= t; s++) {
                scores[s] = scale * ref_dot(q, qkv_b + s * C3 + C + (size_t)h * HS, HS);
                if (scores[s] > max_score) { max_score = scores[s]; }
            }
            double sum = 0.0;
            for (int s = 0; s <= t; s++) { scores[s] = exp(scores[s] - max_score); sum += scores[s]; }
            for (int i = 0; i < HS; i++) { acc[i] = 0.0; }
            for (int s = 0; s <= t; s++) {
                const float* v = qkv_b + s * C3 + 2 * C + (size_t)h * HS;
                for (int i = 0; i < HS; i++) { acc[i] += scores[s] * v[i]; }
            }
            float* out_t = out + ((size_t)b * T + t) * C + (size_t)h * HS;
            for (int i = 0; i < HS; i++) { out_t[i] = (float)(acc[i] / sum); }
            lse[((size_t)b * NH + h) * T + t] = (float)(max_score + log(sum));
        }
        free(scores);
        free(acc);
    }
}

// dqkv += gradient of the attention above; out and lse are what the forward wrote
static inline void ref_attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                                   const float* lse, int B, int T, int C, int NH) {
    int HS = C / NH;
    size_t C3 = (size_t)3 * C;
    double scale = 1.0 / sqrt((double)HS);
    REF_PARALLEL_FOR
    for (int bh = 0; bh < B * NH; bh++) {  // a thread owns one (b, h): its q, k, v and their gradients
        const int b = bh / NH, h = bh % NH;
        const float* qkv_b = qkv + (size_t)b * T * C3;
        float* dqkv_b = dqkv + (size_t)b * T * C3;
        for (int t = 0; t < T; t++) {
            size_t head = (size_t)h * HS;
            const float* q = qkv_b + t * C3 + head;
            float* dq = dqkv_b + t * C3 + head;
            const float* dout_t = dout + ((size_t)b * T + t) * C + head;
            const float* out_t = out + ((size_t)b * T + t) * C + head;
            // softmax backward: dscore_s = p_s * (dp_s - sum_s' p_s' dp_s'), and that sum is dout . out
            double dout_dot_out = ref_dot(dout_t, out_t, HS);
            double row_lse = lse[((size_t)b * NH + h) * T + t];
            for (int s = 0; s <= t; s++) {
                const float* k = qkv_b + s * C3 + C + head;
                const float* v = qkv_b + s * C3 + 2 * C + head;
                float* dk = dqkv_b + s * C3 + C + head;
                float* dv = dqkv_b + s * C3 + 2 * C + head;
                double p = exp(scale * ref_dot(q, k, HS) - row_lse);
                double dp = ref_dot(dout_t, v, HS);
                double dscore = scale * p * (dp - dout_dot_out);
                for (int i = 0; i < HS; i++) {
                    dv[i] += (float)(p * dout_t[i]);
                    dq[i] += (float)(dscore * k[i]);
                    dk[i] += (float)(dscore * q[i]);
                }
            }
        }
    }
}

static inline void ref_gelu_forward(float* out, const float* inp, int N) {
    REF_PARALLEL_FOR
    for (int i = 0; i < N; i++) { out[i] = gelu_forward_element(inp[i]); }
}

// dinp += gelu'(inp) * dout
static inline void ref_gelu_backward(float* dinp, const float* inp, const float* dout, int N) {
    REF_PARALLEL_FOR
    for (int i = 0; i < N; i++) { dinp[i] += gelu_backward_element(inp[i]) * dout[i]; }
}

static inline void ref_residual_forward(float* out, const float* a, const float* b, int N) {
    REF_PARALLEL_FOR
    for (int i = 0; i < N; i++) { out[i] = a[i] + b[i]; }
}

/*
Softmax cross-entropy over the first V columns of each Vp-wide logits row (the padded
columns V..Vp-1 are ignored). losses[i] = -log p[targets[i]]. If dlogits is not NULL it is
OVERWRITTEN with (p - onehot(target)) * dloss, and 0 in the padded columns.
*/
static inline void ref_crossentropy_forward_backward(float* losses, float* dlogits, const float* logits, const int* targets,
                                              int N, int V, int Vp, float dloss) {
    REF_PARALLEL_FOR
    for (int i = 0; i < N; i++) {
        const float* row = logits + (size_t)i * Vp;
        double max_logit = -INFINITY;
        for (int j = 0; j < V; j++) { if (row[j] > max_logit) { max_logit = row[j]; } }
        double sum = 0.0;
        for (int j = 0; j < V; j++) { sum += exp(row[j] - max_logit); }
        double row_lse = max_logit + log(sum);
        losses[i] = (float)(row_lse - row[targets[i]]);
        if (dlogits != NULL) {
            float* drow = dlogits + (size_t)i * Vp;
            for (int j = 0; j < V; j++) {
                double p = exp(row[j] - row_lse);
                drow[j] = (float)((p - (j == targets[i] ? 1.0 : 0.0)) * dloss);
            }
            for (int j = V; j < Vp; j++) { drow[j] = 0.0f; }
        }
    }
}

// ----------------------------------------------------------------------------
// FP8 emulation: the quantize-dequantize points of DESIGN.md section 3, in fp32

/*
A linear y = x . W^T (+ b), x [N][C], W [OC][C], runs in FP8 on the GPU as three GEMMs
whose operands are cast to FP8 first. The reference emulates each cast as an element-wise
quantize + dequantize (fp8.h, the kernels' code) and keeps the GEMMs themselves in fp32
operands with double accumulation:
    forward  y  = Q_e4m3(x) . Q_e4m3(W)^T + b
    dgrad    dx = Q_e5m2(dy) . Q_e4m3(W)          (the same Q(W) as the forward)
    wgrad    dW = Q_e5m2(dy)^T . Q_e4m3(x)        (the same Q(dy) as dgrad, Q(x) as the forward)
    bias     db = column sums of dy, unquantized   (the fused bias-grad kernel reads bf16 dy)
Scales, per recipe:
- x: per tensor, DELAYED (history, first use seeded) or CURRENT, through fp8_scaling.h;
- W: per tensor. Current (-fw current): the weight's own amax; cast once per optimizer step
  on the GPU, which is the same thing as casting at each use from unchanged weights. Delayed
  (-fw delayed): the GPU's optimizer pass writes the codes with the previous step's amax;
  here gpt2ref_fp8_weights_updated does that step's part after each optimizer step (the scale
  pair into forward_used[W], the new amax into the state) and the forwards quantize with
  the pair; the first forward seeds the state with a current cast, as the GPU's start cast;
- dy: per tensor, current (delayed under -fg delayed: an amax history, seeded by its first use;
  under -fg pow2 current with the scale rounded down to a power of two, which the GPU's one-pass
  prediction reproduces bit for bit and so needs no emulation of its own), E5M2;
- BLOCK: no state: every operand E4M3 with one scale per tile, amax/448 with no margin,
  tiles along each GEMM's K: x and dy 1x128 along C / OC for forward and dgrad, and
  128x1 (along N) for wgrad, where K is N (so x and dy are re-cast transposed, as the
  cast-transpose kernels write them); W in 128x128 blocks, shared by forward and dgrad.
  A K that is not a multiple of 128 gets a short last tile, which is exactly what
  zero-padding K to a multiple of 128 gives (zeros change no tile amax and add nothing).
Each per-tensor state is updated once per cast, in the order fp8_scaling.h prescribes,
and the scale a cast used is kept, so the backward reuses the forward's Q(x) and Q(W)
exactly. Each operand keeps the statistics of its last cast (amax, scale, fractions
saturated and flushed) for cross-checking the GPU's numerics log. Passes are chosen per
linear kind (Fp8Emulation.passes[kind], as -f8p does on the GPU), each of the three on its
own: a GEMM not in FP8 reads its operands unquantized, and an operand no FP8 GEMM reads is
never cast (its state stays untouched).
*/

enum { FP8_PASS_FORWARD = 1, FP8_PASS_DGRAD = 2, FP8_PASS_WGRAD = 4, FP8_PASS_ALL = 7 };
enum { FP8_LINEAR_QKV, FP8_LINEAR_ATTPROJ, FP8_LINEAR_FC, FP8_LINEAR_FCPROJ, FP8_LINEAR_LM_HEAD, FP8_NUM_LINEAR_KINDS };
static const char* const FP8_LINEAR_NAMES[FP8_NUM_LINEAR_KINDS] = {"qkv", "attproj", "fc", "fcproj", "lm_head"};
// the same kinds and bits as fp8_recipe.h's, so its checks take these arrays (a compile error otherwise)
typedef char fp8_emulation_matches_fp8_recipe[((int)FP8_NUM_LINEAR_KINDS == (int)NUM_LINEAR_KINDS &&
                                               (int)FP8_PASS_FORWARD == (int)FP8_FWD && (int)FP8_PASS_DGRAD == (int)FP8_DGRAD &&
                                               (int)FP8_PASS_WGRAD == (int)FP8_WGRAD) ? 1 : -1];

typedef enum { FP8_EMULATE_DELAYED, FP8_EMULATE_CURRENT, FP8_EMULATE_BLOCK } Fp8EmulationRecipe;
#define FP8_BLOCK_TILE 128

typedef struct {
    int recipe;                        // Fp8EmulationRecipe: DELAYED / CURRENT say how x is scaled; BLOCK tiles everything
    int passes[FP8_NUM_LINEAR_KINDS];  // per FP8_LINEAR_* kind its FP8_PASS_* bits; 0: that linear runs in fp32
    int history_len;                   // delayed amax history, 1..1024
    int margin;                        // delayed and current scales are divided by 2^margin
    int weight_scaling;                // Fp8WeightScaling (fp8_recipe.h): W current, or delayed (per-tensor recipes)
    int grad_scaling;                  // Fp8GradScaling (fp8_recipe.h): dy current, delayed or pow2 (per-tensor recipes)
} Fp8Emulation;

// the default FP8 recipe: delayed activations, current gradients and weights, all three
// passes of the four block linears, lm_head in bf16
static inline Fp8Emulation fp8_emulation_default(void) {
    Fp8Emulation e;
    e.recipe = FP8_EMULATE_DELAYED;
    for (int kind = 0; kind < FP8_NUM_LINEAR_KINDS; kind++) { e.passes[kind] = kind == FP8_LINEAR_LM_HEAD ? 0 : FP8_PASS_ALL; }
    e.history_len = FP8_AMAX_HISTORY_DEFAULT;
    e.margin = 0;
    e.weight_scaling = FP8_WEIGHTS_CURRENT;
    e.grad_scaling = FP8_GRADS_CURRENT;
    return e;
}

// the emulation of what a trainer's FP8 flags select (llmc/fp8_recipe.h's pass bits and
// linear kinds are the emulation's own)
static inline Fp8Emulation fp8_emulation_from_settings(const Fp8Settings* s) {
    Fp8Emulation e = fp8_emulation_default();
    e.recipe = s->recipe == FP8_MODEL_DELAYED ? FP8_EMULATE_DELAYED
             : s->recipe == FP8_MODEL_CURRENT ? FP8_EMULATE_CURRENT : FP8_EMULATE_BLOCK;
    for (int kind = 0; kind < FP8_NUM_LINEAR_KINDS; kind++) { e.passes[kind] = s->passes[kind]; }
    e.history_len = s->history_len;
    e.margin = s->margin;
    e.weight_scaling = s->weight_scaling;
    e.grad_scaling = s->grad_scaling;
    return e;
}

// the trainer's FP8 flags an emulation stands for (the inverse of fp8_emulation_from_settings;
// a recipe outside the enum, a corrupt state file's, keeps its number, which fp8_recipe.h's
// names show as invalid)
static inline Fp8Settings fp8_settings_from_emulation(const Fp8Emulation* e) {
    Fp8Settings s;
    memset(&s, 0, sizeof(s));
    s.enabled = 1;
    s.recipe = e->recipe == FP8_EMULATE_DELAYED ? FP8_MODEL_DELAYED : e->recipe == FP8_EMULATE_CURRENT ? FP8_MODEL_CURRENT
             : e->recipe == FP8_EMULATE_BLOCK ? FP8_MODEL_BLOCK : e->recipe;
    for (int kind = 0; kind < FP8_NUM_LINEAR_KINDS; kind++) { s.passes[kind] = e->passes[kind]; }
    s.history_len = e->history_len;
    s.margin = e->margin;
    s.weight_scaling = e->weight_scaling;
    s.grad_scaling = e->grad_scaling;
    return s;
}

static inline void fp8_emulation_validate(const Fp8Emulation* e) {
    if (e->recipe < FP8_EMULATE_DELAYED || e->recipe > FP8_EMULATE_BLOCK) {
        llm8_die("fp8 emulation: recipe %d is unknown (expected delayed, current or block)", e->recipe);
    }
    for (int kind = 0; kind < FP8_NUM_LINEAR_KINDS; kind++) {
        if (e->passes[kind] & ~FP8_PASS_ALL) {
            llm8_die("fp8 emulation: %s passes 0x%x has unknown bits (expected within 0x7)", FP8_LINEAR_NAMES[kind], e->passes[kind]);
        }
    }
    const char* error = fp8_scaling_config_error(e->history_len, e->margin);
    if (error != NULL) { llm8_die("fp8 emulation: history %d, margin %d: %s", e->history_len, e->margin, error); }
    if (e->weight_scaling != FP8_WEIGHTS_CURRENT && e->weight_scaling != FP8_WEIGHTS_DELAYED) {
        llm8_die("fp8 emulation: weight scaling %d is unknown (expected current or delayed)", e->weight_scaling);
    }
    if (e->weight_scaling == FP8_WEIGHTS_DELAYED && e->recipe == FP8_EMULATE_BLOCK) {
        llm8_die("fp8 emulation: delayed weight scaling needs a per-tensor recipe");
    }
    if (e->grad_scaling != FP8_GRADS_CURRENT && e->grad_scaling != FP8_GRADS_DELAYED && e->grad_scaling != FP8_GRADS_POW2) {
        llm8_die("fp8 emulation: gradient scaling %d is unknown (expected current, delayed or pow2)", e->grad_scaling);
    }
    if (e->grad_scaling != FP8_GRADS_CURRENT && e->recipe == FP8_EMULATE_BLOCK) {
        llm8_die("fp8 emulation: delayed or pow2 gradient scaling needs a per-tensor recipe");
    }
    if (e->grad_scaling != FP8_GRADS_CURRENT && !fp8_block_linears_cast_dy(e->passes)) {
        llm8_die("fp8 emulation: delayed or pow2 gradient scaling acts on the block linears' output gradients, and these "
                 "passes cast none (lm_head's is scaled from its bound; fp8_gradient_recipe)");
    }
    if (e->weight_scaling == FP8_WEIGHTS_DELAYED && !fp8_weights_cast_in_update(e->passes)) {
        llm8_die("fp8 emulation: delayed weight scaling acts on the weights the optimizer pass casts, and these passes leave "
                 "none there (a block linear has a bf16 GEMM, or none is FP8; fp8_weight_cast_in_update)");
    }
}

enum { FP8_OPERAND_X, FP8_OPERAND_W, FP8_OPERAND_DY, FP8_NUM_OPERANDS };
static const char* const FP8_OPERAND_NAMES[FP8_NUM_OPERANDS] = {"x", "w", "dy"};

// the scale pair one cast used, so a later GEMM can re-create the same quantized tensor
typedef struct { float scale; float scale_inv; } Fp8ScalePair;

typedef struct {
    int passes;                                 // this linear's FP8_PASS_* bits (Fp8Emulation.passes[kind])
    Fp8TensorScaling scaling[FP8_NUM_OPERANDS]; // per-tensor recipes (unused by BLOCK)
    Fp8CastStats stats[FP8_NUM_OPERANDS];       // of each operand's last cast
    Fp8ScalePair forward_used[FP8_NUM_OPERANDS]; // x and W as the forward cast them (delayed W: as the step wrote it)
} Fp8LinearState;

// the state of a linear of kind `kind` (FP8_LINEAR_*) under e
static inline void fp8_linear_state_init(Fp8LinearState* q, const Fp8Emulation* e, int kind) {
    memset(q, 0, sizeof(*q));
    q->passes = e->passes[kind];
    Fp8Recipe x_recipe = e->recipe == FP8_EMULATE_DELAYED ? FP8_RECIPE_DELAYED : FP8_RECIPE_CURRENT;
    fp8_scaling_init(&q->scaling[FP8_OPERAND_X], x_recipe, FP8_E4M3, e->history_len, e->margin);
    int delayed_weight = e->weight_scaling == FP8_WEIGHTS_DELAYED && fp8_weight_cast_in_update(e->passes, kind);
    fp8_scaling_init_weight(&q->scaling[FP8_OPERAND_W], delayed_weight, e->history_len, e->margin);
    fp8_scaling_init(&q->scaling[FP8_OPERAND_DY], fp8_gradient_recipe(e->grad_scaling, kind), FP8_E5M2, e->history_len,
                     e->margin);
}

// ref_fp8_qdq_serial's loop, inlined into it once per format so that the format is a constant
// there: the encode and the decode then run without their tests of it
__attribute__((always_inline)) static inline void ref_fp8_qdq_format(float* out, const float* x, size_t n,
                                                                     Fp8ScalePair pair, const Fp8Format format,
                                                                     Fp8CastStats* stats) {
    for (size_t i = 0; i < n; i++) {
        uint8_t code = fp8_quantize(x[i], pair.scale, format);
        out[i] = fp8_dequantize(code, pair.scale_inv, format);
        if (stats != NULL) { fp8_cast_stats_add(stats, x[i], fp8_classify(x[i], pair.scale, code, format)); }
    }
}

// out = dequantize(quantize(x)) with one scale pair, on one thread; stats (may be NULL) count the cast
static inline void ref_fp8_qdq_serial(float* out, const float* x, size_t n, Fp8ScalePair pair, Fp8Format format,
                                      Fp8CastStats* stats) {
    if (format == FP8_E4M3) {
        ref_fp8_qdq_format(out, x, n, pair, FP8_E4M3, stats);
    } else {
        ref_fp8_qdq_format(out, x, n, pair, FP8_E5M2, stats);
    }
}

// the same over REF_CHUNK elements a thread, each chunk counting into its own statistics
static inline void ref_fp8_qdq(float* out, const float* x, size_t n, Fp8ScalePair pair, Fp8Format format,
                               Fp8CastStats* stats) {
    size_t chunks = ref_chunk_count(n);
    Fp8CastStats* chunk_stats = stats != NULL ? (Fp8CastStats*)calloc(chunks, sizeof(Fp8CastStats)) : NULL;
    if (stats != NULL && chunk_stats == NULL) { llm8_die("ref_fp8_qdq: out of memory for %zu chunks' statistics", chunks); }
    REF_PARALLEL_FOR
    for (size_t k = 0; k < chunks; k++) {
        size_t start = k * REF_CHUNK;
        ref_fp8_qdq_serial(out + start, x + start, ref_chunk_length(n, k), pair, format,
                           chunk_stats != NULL ? &chunk_stats[k] : NULL);
    }
    if (stats == NULL) { return; }
    for (size_t k = 0; k < chunks; k++) { fp8_cast_stats_merge(stats, &chunk_stats[k]); }
    free(chunk_stats);
}

static inline float ref_fp8_amax(const float* x, size_t n) {
    uint32_t amax_bits = 0;
    REF_PARALLEL_FOR_MAX(amax_bits)
    for (size_t i = 0; i < n; i++) {
        uint32_t b = fp8_amax_bits(x[i]);
        if (b > amax_bits) { amax_bits = b; }
    }
    return bits_as_float(amax_bits);
}

// a per-tensor cast following fp8_scaling.h's protocol (update before or after the cast), with
// `amax` as this use's amax; returns the scale pair it used
static inline Fp8ScalePair ref_fp8_cast_tensor_with_amax(float* out, const float* x, size_t n, Fp8TensorScaling* s,
                                                         Fp8Format format, Fp8CastStats* stats, float amax) {
    int after = fp8_scaling_casts_after_update(s);
    if (after) { fp8_scaling_update(s, amax); }
    Fp8ScalePair pair = {s->scale, s->scale_inv};
    memset(stats, 0, sizeof(*stats));
    stats->scale = pair.scale;
    ref_fp8_qdq(out, x, n, pair, format, stats);
    if (!after) { fp8_scaling_update(s, amax); }
    return pair;
}

// the same with the tensor's own amax
static inline Fp8ScalePair ref_fp8_cast_tensor(float* out, const float* x, size_t n, Fp8TensorScaling* s,
                                               Fp8Format format, Fp8CastStats* stats) {
    return ref_fp8_cast_tensor_with_amax(out, x, n, s, format, stats, ref_fp8_amax(x, n));
}

// E4M3 with one current scale per tile of tile_rows x tile_cols over x [rows][cols]
// (edge tiles are short); stats->scale is the smallest tile scale (the amax's tile). A thread
// casts whole tiles, each counting into its own statistics
static inline void ref_fp8_cast_tiles(float* out, const float* x, int rows, int cols, int tile_rows, int tile_cols,
                                      Fp8CastStats* stats) {
    const int row_tiles = (rows + tile_rows - 1) / tile_rows, col_tiles = (cols + tile_cols - 1) / tile_cols;
    const int tiles = row_tiles * col_tiles;
    Fp8CastStats* tile_stats = (Fp8CastStats*)calloc((size_t)tiles, sizeof(Fp8CastStats));
    if (tile_stats == NULL) { llm8_die("ref_fp8_cast_tiles: out of memory for %d tiles' statistics", tiles); }
    REF_PARALLEL_FOR
    for (int tile = 0; tile < tiles; tile++) {
        const int r0 = tile / col_tiles * tile_rows, c0 = tile % col_tiles * tile_cols;
        const int r1 = r0 + tile_rows < rows ? r0 + tile_rows : rows;
        const int c1 = c0 + tile_cols < cols ? c0 + tile_cols : cols;
        uint32_t amax_bits = 0;
        for (int r = r0; r < r1; r++) {
            for (int c = c0; c < c1; c++) {
                uint32_t b = fp8_amax_bits(x[(size_t)r * cols + c]);
                if (b > amax_bits) { amax_bits = b; }
            }
        }
        Fp8ScalePair pair;
        pair.scale = fp8_scale_from_amax(bits_as_float(amax_bits), FP8_E4M3_MAX, 0);
        pair.scale_inv = fp8_reciprocal(pair.scale);
        tile_stats[tile].scale = pair.scale;
        for (int r = r0; r < r1; r++) {
            size_t at = (size_t)r * cols + c0;
            ref_fp8_qdq_serial(out + at, x + at, (size_t)(c1 - c0), pair, FP8_E4M3, &tile_stats[tile]);
        }
    }
    memset(stats, 0, sizeof(*stats));
    stats->scale = INFINITY;
    for (int tile = 0; tile < tiles; tile++) {
        fp8_cast_stats_merge(stats, &tile_stats[tile]);
        if (tile_stats[tile].scale < stats->scale) { stats->scale = tile_stats[tile].scale; }
    }
    free(tile_stats);
}

/*
Q(W) for a forward (per-tensor recipes); returns the scale pair. A cast after the update
(fp8_scaling_casts_after_update: current weights, and a delayed weight's first use, the
seeding) is a current cast of the weight as it is. A delayed weight's codes are the ones its
last optimizer step wrote, with the pair gpt2ref_fp8_weights_updated kept in forward_used[W].
*/
static inline Fp8ScalePair ref_fp8_cast_weight(Fp8LinearState* q, float* out, const float* weight, size_t n) {
    Fp8TensorScaling* s = &q->scaling[FP8_OPERAND_W];
    Fp8CastStats* stats = &q->stats[FP8_OPERAND_W];
    if (fp8_scaling_casts_after_update(s)) { return ref_fp8_cast_tensor(out, weight, n, s, FP8_E4M3, stats); }
    Fp8ScalePair pair = q->forward_used[FP8_OPERAND_W];
    memset(stats, 0, sizeof(*stats));
    stats->scale = pair.scale;
    ref_fp8_qdq(out, weight, n, pair, FP8_E4M3, stats);
    return pair;
}

/*
The FP8 forward of one linear: out[N][OC] = Q(inp) . Q(weight)^T + bias. q is the
linear's state; with q NULL, or the forward pass not in q->passes, it is ref_matmul_forward.
*/
static inline void ref_fp8_linear_forward(Fp8LinearState* q, const Fp8Emulation* e, float* out, const float* inp,
                                          const float* weight, const float* bias, int N, int C, int OC) {
    if (q == NULL || !(q->passes & FP8_PASS_FORWARD)) {
        ref_matmul_forward(out, inp, weight, bias, N, C, OC);
        return;
    }
    float* inp_q = (float*)mallocCheck((size_t)N * C * sizeof(float));
    float* weight_q = (float*)mallocCheck((size_t)OC * C * sizeof(float));
    if (e->recipe == FP8_EMULATE_BLOCK) {
        ref_fp8_cast_tiles(inp_q, inp, N, C, 1, FP8_BLOCK_TILE, &q->stats[FP8_OPERAND_X]);
        ref_fp8_cast_tiles(weight_q, weight, OC, C, FP8_BLOCK_TILE, FP8_BLOCK_TILE, &q->stats[FP8_OPERAND_W]);
    } else {
        q->forward_used[FP8_OPERAND_X] = ref_fp8_cast_tensor(inp_q, inp, (size_t)N * C, &q->scaling[FP8_OPERAND_X],
                                                             FP8_E4M3, &q->stats[FP8_OPERAND_X]);
        q->forward_used[FP8_OPERAND_W] = ref_fp8_cast_weight(q, weight_q, weight, (size_t)OC * C);
    }
    ref_matmul_forward(out, inp_q, weight_q, bias, N, C, OC);
    free(inp_q);
    free(weight_q);
}

// Q(x) or Q(W) for a backward GEMM: the forward's cast when the forward ran in FP8
// (same scale pair, so the same values), else a cast of its own (per-tensor recipes)
static inline void ref_fp8_recast_operand(float* out, const float* x, size_t n, Fp8LinearState* q, int operand) {
    if (q->passes & FP8_PASS_FORWARD) {
        ref_fp8_qdq(out, x, n, q->forward_used[operand], FP8_E4M3, NULL);
    } else {
        q->forward_used[operand] = ref_fp8_cast_tensor(out, x, n, &q->scaling[operand], FP8_E4M3, &q->stats[operand]);
    }
}

/*
The FP8 backward of one linear (call after its ref_fp8_linear_forward on the same inp and
weight): dinp += Q(dout) . Q(weight), dweight += Q(dout)^T . Q(inp), dbias += column sums
of dout, each GEMM in FP8 when its pass is in q->passes. Like ref_matmul_backward, every
output is added to; dbias may be NULL. dout_bound > 0: per tensor, Q(dout) is scaled with that
bound on |dout| as its amax (lm_head's, fp8_gradient_recipe), else with dout's own amax.
*/
static inline void ref_fp8_linear_backward(Fp8LinearState* q, const Fp8Emulation* e, float* dinp, float* dweight,
                                           float* dbias, const float* dout, const float* inp, const float* weight,
                                           int N, int C, int OC, float dout_bound) {
    int dgrad_fp8 = q != NULL && (q->passes & FP8_PASS_DGRAD);
    int wgrad_fp8 = q != NULL && (q->passes & FP8_PASS_WGRAD);
    if (!dgrad_fp8 && !wgrad_fp8) {
        ref_matmul_backward(dinp, dweight, dbias, dout, inp, weight, N, C, OC);
        return;
    }
    int block = e->recipe == FP8_EMULATE_BLOCK;
    float* dout_q = (float*)mallocCheck((size_t)N * OC * sizeof(float));
    float* operand_q = (float*)mallocCheck((size_t)(N > OC ? N : OC) * C * sizeof(float));
    if (dbias != NULL) { ref_matmul_backward_bias(dbias, dout, N, OC); }
    if (!block) {  // one per-tensor Q(dy) serves both GEMMs
        float amax = dout_bound > 0.0f ? dout_bound : ref_fp8_amax(dout, (size_t)N * OC);
        ref_fp8_cast_tensor_with_amax(dout_q, dout, (size_t)N * OC, &q->scaling[FP8_OPERAND_DY], FP8_E5M2,
                                      &q->stats[FP8_OPERAND_DY], amax);
    }
    if (dgrad_fp8) {
        if (block) {
            ref_fp8_cast_tiles(dout_q, dout, N, OC, 1, FP8_BLOCK_TILE, &q->stats[FP8_OPERAND_DY]);
            Fp8CastStats weight_stats;  // the forward's blocks again; its statistics are the forward's
            ref_fp8_cast_tiles(operand_q, weight, OC, C, FP8_BLOCK_TILE, FP8_BLOCK_TILE,
                               (q->passes & FP8_PASS_FORWARD) ? &weight_stats : &q->stats[FP8_OPERAND_W]);
        } else {
            ref_fp8_recast_operand(operand_q, weight, (size_t)OC * C, q, FP8_OPERAND_W);
        }
        ref_matmul_backward_dgrad(dinp, dout_q, operand_q, N, C, OC);
    } else {
        ref_matmul_backward_dgrad(dinp, dout, weight, N, C, OC);
    }
    if (wgrad_fp8) {
        if (block) {  // K = N: tiles run down the columns
            Fp8CastStats transposed_stats;
            ref_fp8_cast_tiles(dout_q, dout, N, OC, FP8_BLOCK_TILE, 1, dgrad_fp8 ? &transposed_stats : &q->stats[FP8_OPERAND_DY]);
            ref_fp8_cast_tiles(operand_q, inp, N, C, FP8_BLOCK_TILE, 1,
                               (q->passes & FP8_PASS_FORWARD) ? &transposed_stats : &q->stats[FP8_OPERAND_X]);
        } else {
            ref_fp8_recast_operand(operand_q, inp, (size_t)N * C, q, FP8_OPERAND_X);
        }
        ref_matmul_backward_wgrad(dweight, dout_q, operand_q, N, C, OC);
    } else {
        ref_matmul_backward_wgrad(dweight, dout, inp, N, C, OC);
    }
    free(dout_q);
    free(operand_q);
}

// ----------------------------------------------------------------------------
// the whole model

// activations of one forward pass; per-layer tensors are [L][...]
#define GPT2REF_NUM_ACTS 21
typedef struct {
    float* encoded;    // [B][T][C]
    float* ln1;        // [L][B][T][C]
    float* ln1_mean;   // [L][B][T]
    float* ln1_rstd;   // [L][B][T]
    float* qkv;        // [L][B][T][3C]
    float* atty;       // [L][B][T][C]
    float* att_lse;    // [L][B][NH][T]
    float* attproj;    // [L][B][T][C]
    float* residual2;  // [L][B][T][C]
    float* ln2;        // [L][B][T][C]
    float* ln2_mean;   // [L][B][T]
    float* ln2_rstd;   // [L][B][T]
    float* fch;        // [L][B][T][4C]
    float* fch_gelu;   // [L][B][T][4C]
    float* fcproj;     // [L][B][T][C]
    float* residual3;  // [L][B][T][C]
    float* lnf;        // [B][T][C]
    float* lnf_mean;   // [B][T]
    float* lnf_rstd;   // [B][T]
    float* logits;     // [B][T][Vp]
    float* losses;     // [B][T]
} GPT2RefActs;

// gradient scratch of the backward pass, reused by every layer
#define GPT2REF_NUM_GRAD_ACTS 7
typedef struct {
    float* residual;   // [B][T][C] gradient of the residual stream, walked from the top down
    float* ln;         // [B][T][C] gradient of a layernorm output (ln1, ln2 or lnf)
    float* qkv;        // [B][T][3C]
    float* atty;       // [B][T][C]
    float* fch;        // [B][T][4C]
    float* fch_gelu;   // [B][T][4C]
    float* logits;     // [B][T][Vp]
} GPT2RefGradActs;

typedef struct {
    GPT2Config config;
    size_t param_sizes[NUM_PARAMETER_TENSORS];
    size_t num_parameters;
    float* params;                               // all parameters, llm.c order, contiguous
    float* param_tensors[NUM_PARAMETER_TENSORS]; // pointers into params, indexed by PARAM_*
    float* grads;                                // same layout as params
    float* grad_tensors[NUM_PARAMETER_TENSORS];
    float* adam_m;                               // AdamW first moment, same layout
    float* adam_v;                               // AdamW second moment
    // activations: allocated by the first forward for its (B, T); later calls need B*T and T within them
    int capacity_B;
    int capacity_T;
    float* acts_memory;
    GPT2RefActs acts;
    float* grad_acts_memory;
    GPT2RefGradActs grad_acts;
    int* inputs;   // [B][T] of the last forward
    int* targets;  // [B][T] of the last forward (valid when has_targets)
    int B;         // shape of the last forward
    int T;
    int has_targets;
    float mean_loss; // of the last forward, -1 when it had no targets
    // FP8 emulation (gpt2ref_set_fp8_emulation): NULL runs in fp32, the default; else one
    // state per linear, layer l's kind k at 4*l + k, lm_head at 4*L
    Fp8Emulation fp8_config;
    Fp8LinearState* fp8_linears;
} GPT2Ref;

static inline void gpt2ref_act_sizes(size_t sizes[GPT2REF_NUM_ACTS], const GPT2Config* cfg, int B, int T) {
    size_t L = cfg->num_layers, C = cfg->channels, NH = cfg->num_heads, Vp = cfg->padded_vocab_size;
    size_t BT = (size_t)B * T;
    size_t per_size[GPT2REF_NUM_ACTS] = {
        BT * C, L * BT * C, L * BT, L * BT, L * BT * 3 * C, L * BT * C, L * NH * BT, L * BT * C, L * BT * C,
        L * BT * C, L * BT, L * BT, L * BT * 4 * C, L * BT * 4 * C, L * BT * C, L * BT * C,
        BT * C, BT, BT, BT * Vp, BT
    };
    memcpy(sizes, per_size, sizeof(per_size));
}

static inline void gpt2ref_grad_act_sizes(size_t sizes[GPT2REF_NUM_GRAD_ACTS], const GPT2Config* cfg, int B, int T) {
    size_t C = cfg->channels, Vp = cfg->padded_vocab_size, BT = (size_t)B * T;
    size_t per_size[GPT2REF_NUM_GRAD_ACTS] = { BT * C, BT * C, BT * 3 * C, BT * C, BT * 4 * C, BT * 4 * C, BT * Vp };
    memcpy(sizes, per_size, sizeof(per_size));
}

// one calloc for `count` tensors, pointers carved out in order into *ptrs[i]
static inline float* gpt2ref_carve(float** ptrs[], const size_t sizes[], int count) {
    size_t total = 0;
    for (int i = 0; i < count; i++) { total += sizes[i]; }
    float* memory = (float*)mallocCheck(total * sizeof(float));
    memset(memory, 0, total * sizeof(float));
    size_t offset = 0;
    for (int i = 0; i < count; i++) { *ptrs[i] = memory + offset; offset += sizes[i]; }
    return memory;
}

static inline void gpt2ref_point_tensors(float* tensors[NUM_PARAMETER_TENSORS], float* memory, const size_t sizes[]) {
    size_t offset = 0;
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) { tensors[i] = memory + offset; offset += sizes[i]; }
}

// copies `params` (gpt2_num_parameters(cfg) floats, llm.c order); grads and AdamW state start at zero
static inline void gpt2ref_init(GPT2Ref* model, const GPT2Config* cfg, const float* params) {
    gpt2_config_validate(cfg, "gpt2ref_init");
    memset(model, 0, sizeof(*model));
    model->config = *cfg;
    gpt2_param_sizes(cfg, model->param_sizes);
    model->num_parameters = gpt2_num_parameters(cfg);
    size_t bytes = model->num_parameters * sizeof(float);
    model->params = (float*)mallocCheck(bytes);
    memcpy(model->params, params, bytes);
    model->grads = (float*)mallocCheck(bytes);
    model->adam_m = (float*)mallocCheck(bytes);
    model->adam_v = (float*)mallocCheck(bytes);
    memset(model->grads, 0, bytes);
    memset(model->adam_m, 0, bytes);
    memset(model->adam_v, 0, bytes);
    gpt2ref_point_tensors(model->param_tensors, model->params, model->param_sizes);
    gpt2ref_point_tensors(model->grad_tensors, model->grads, model->param_sizes);
    model->mean_loss = -1.0f;
}

static inline void gpt2ref_allocate_activations(GPT2Ref* model, int B, int T) {
    size_t act_sizes[GPT2REF_NUM_ACTS];
    gpt2ref_act_sizes(act_sizes, &model->config, B, T);
    GPT2RefActs* a = &model->acts;
    float** act_ptrs[GPT2REF_NUM_ACTS] = {
        &a->encoded, &a->ln1, &a->ln1_mean, &a->ln1_rstd, &a->qkv, &a->atty, &a->att_lse, &a->attproj,
        &a->residual2, &a->ln2, &a->ln2_mean, &a->ln2_rstd, &a->fch, &a->fch_gelu, &a->fcproj, &a->residual3,
        &a->lnf, &a->lnf_mean, &a->lnf_rstd, &a->logits, &a->losses
    };
    model->acts_memory = gpt2ref_carve(act_ptrs, act_sizes, GPT2REF_NUM_ACTS);
    size_t grad_sizes[GPT2REF_NUM_GRAD_ACTS];
    gpt2ref_grad_act_sizes(grad_sizes, &model->config, B, T);
    GPT2RefGradActs* g = &model->grad_acts;
    float** grad_ptrs[GPT2REF_NUM_GRAD_ACTS] = { &g->residual, &g->ln, &g->qkv, &g->atty, &g->fch, &g->fch_gelu, &g->logits };
    model->grad_acts_memory = gpt2ref_carve(grad_ptrs, grad_sizes, GPT2REF_NUM_GRAD_ACTS);
    model->inputs = (int*)mallocCheck((size_t)B * T * sizeof(int));
    model->targets = (int*)mallocCheck((size_t)B * T * sizeof(int));
    model->capacity_B = B;
    model->capacity_T = T;
}

/*
Turns FP8 emulation on with `config` (validated; dies with a clear line when invalid), or
off with NULL. Every scaling state starts fresh, so the next forward seeds the delayed
histories. Call it after gpt2ref_init, before the forward passes it should affect.
*/
static inline void gpt2ref_set_fp8_emulation(GPT2Ref* model, const Fp8Emulation* config) {
    free(model->fp8_linears);
    model->fp8_linears = NULL;
    if (config == NULL) { return; }
    fp8_emulation_validate(config);
    model->fp8_config = *config;
    int count = 4 * model->config.num_layers + 1;
    model->fp8_linears = (Fp8LinearState*)mallocCheck((size_t)count * sizeof(Fp8LinearState));
    for (int i = 0; i < count; i++) {
        fp8_linear_state_init(&model->fp8_linears[i], config, i == count - 1 ? FP8_LINEAR_LM_HEAD : i % 4);
    }
}

// the scaling states just read from a state file against fresh ones of the same settings
// (fp8_scaling_loaded_error); one line naming the file and the state on the first bad one
static inline void gpt2ref_check_loaded_fp8(const GPT2Ref* model, const char* path) {
    if (model->fp8_linears == NULL) { return; }
    int count = 4 * model->config.num_layers + 1;
    for (int i = 0; i < count; i++) {
        Fp8LinearState fresh;
        fp8_linear_state_init(&fresh, &model->fp8_config, i == count - 1 ? FP8_LINEAR_LM_HEAD : i % 4);
        for (int operand = 0; operand < FP8_NUM_OPERANDS; operand++) {
            const char* error = fp8_scaling_loaded_error(&model->fp8_linears[i].scaling[operand], &fresh.scaling[operand]);
            if (error != NULL) {
                llm8_die("state file '%s': the FP8 scaling state of %s of linear %d is corrupt: %s", path,
                         FP8_OPERAND_NAMES[operand], i, error);
            }
        }
    }
}

// the FP8 state of one linear (layer is ignored for lm_head); NULL when it runs in fp32
static inline Fp8LinearState* gpt2ref_fp8_linear(GPT2Ref* model, int layer, int kind) {
    if (model->fp8_linears == NULL || model->fp8_config.passes[kind] == 0) { return NULL; }
    int index = kind == FP8_LINEAR_LM_HEAD ? 4 * model->config.num_layers : 4 * layer + kind;
    return &model->fp8_linears[index];
}

// the weight of FP8 linear (layer, kind) in the parameters, and its element count
static inline float* gpt2ref_fp8_weight(GPT2Ref* model, int layer, int kind, size_t* n) {
    size_t C = (size_t)model->config.channels, lc = (size_t)layer * C;
    float* const* p = model->param_tensors;
    switch (kind) {
        case FP8_LINEAR_QKV: *n = 3 * C * C; return p[PARAM_QKVW] + lc * 3 * C;
        case FP8_LINEAR_ATTPROJ: *n = C * C; return p[PARAM_ATTPROJW] + lc * C;
        case FP8_LINEAR_FC: *n = 4 * C * C; return p[PARAM_FCW] + lc * 4 * C;
        case FP8_LINEAR_FCPROJ: *n = 4 * C * C; return p[PARAM_FCPROJW] + lc * 4 * C;
        default: *n = (size_t)model->config.padded_vocab_size * C; return p[PARAM_WTE];
    }
}

/*
The FP8 side of an optimizer step under delayed weight scaling (-fw delayed): call it after
every step that changed the parameters (gpt2ref_adamw_update does). As the GPU's optimizer
pass, each delayed FP8 weight's new codes take its state's scale (the previous step's amax),
kept in forward_used[W] for the forwards until the next step, and the new weights' amax
updates the state. A state never used (no forward yet) is left to its first forward's
seeding. Current weights (lm_head's under -fw delayed too, fp8_weight_cast_in_update) need
nothing: their forwards cast from the weights as they are.
*/
static inline void gpt2ref_fp8_weights_updated(GPT2Ref* model) {
    if (model->fp8_linears == NULL || model->fp8_config.weight_scaling != FP8_WEIGHTS_DELAYED) { return; }
    for (int layer = 0; layer < model->config.num_layers; layer++) {
        for (int kind = 0; kind < FP8_NUM_LINEAR_KINDS; kind++) {
            if (kind == FP8_LINEAR_LM_HEAD && layer > 0) { continue; }  // lm_head once
            Fp8LinearState* q = gpt2ref_fp8_linear(model, layer, kind);
            if (q == NULL || q->scaling[FP8_OPERAND_W].recipe != FP8_RECIPE_DELAYED) { continue; }
            if (!fp8_scaling_seeded(&q->scaling[FP8_OPERAND_W])) { continue; }
            Fp8TensorScaling* s = &q->scaling[FP8_OPERAND_W];
            Fp8ScalePair pair = {s->scale, s->scale_inv};
            q->forward_used[FP8_OPERAND_W] = pair;
            size_t n;
            const float* weight = gpt2ref_fp8_weight(model, layer, kind, &n);
            fp8_scaling_update(s, ref_fp8_amax(weight, n));
        }
    }
}

static inline void gpt2ref_check_tokens(const int* tokens, int n, int V, const char* what) {
    for (int i = 0; i < n; i++) {
        if (tokens[i] < 0 || tokens[i] >= V) {
            llm8_die("gpt2ref_forward: %s token %d at position %d is out of range (expected 0..%d)", what, tokens[i], i, V - 1);
        }
    }
}

/*
Forward pass on inputs[B][T]. With targets (same shape) it computes the per-position losses
and returns their mean; with targets NULL it computes only the logits and returns -1.
The logits ([B][T][Vp], padded columns included) stay in model->acts.logits.
*/
static inline float gpt2ref_forward(GPT2Ref* model, const int* inputs, const int* targets, int B, int T) {
    const GPT2Config* cfg = &model->config;
    int L = cfg->num_layers, NH = cfg->num_heads, C = cfg->channels, V = cfg->vocab_size, Vp = cfg->padded_vocab_size;
    if (B <= 0 || T <= 0 || T > cfg->max_seq_len) {
        llm8_die("gpt2ref_forward: B=%d T=%d is invalid (expected B >= 1 and 1 <= T <= maxT=%d)", B, T, cfg->max_seq_len);
    }
    if (model->acts_memory == NULL) { gpt2ref_allocate_activations(model, B, T); }
    if (T > model->capacity_T || (size_t)B * T > (size_t)model->capacity_B * model->capacity_T) {
        llm8_die("gpt2ref_forward: B=%d T=%d exceeds the activations allocated by the first forward (B=%d T=%d); "
                 "use a new GPT2Ref for a larger shape", B, T, model->capacity_B, model->capacity_T);
    }
    int BT = B * T;
    gpt2ref_check_tokens(inputs, BT, V, "input");
    memcpy(model->inputs, inputs, (size_t)BT * sizeof(int));
    if (targets != NULL) {
        gpt2ref_check_tokens(targets, BT, V, "target");
        memcpy(model->targets, targets, (size_t)BT * sizeof(int));
    }
    model->B = B;
    model->T = T;
    model->has_targets = targets != NULL;

    float* const* p = model->param_tensors;
    GPT2RefActs* a = &model->acts;
    const Fp8Emulation* fp8 = &model->fp8_config;
    size_t btc = (size_t)BT * C;
    ref_encoder_forward(a->encoded, inputs, p[PARAM_WTE], p[PARAM_WPE], B, T, C);
    const float* residual = a->encoded;
    for (int l = 0; l < L; l++) {
        float* ln1 = a->ln1 + l * btc;
        float* ln1_mean = a->ln1_mean + (size_t)l * BT;
        float* ln1_rstd = a->ln1_rstd + (size_t)l * BT;
        float* qkv = a->qkv + l * 3 * btc;
        float* atty = a->atty + l * btc;
        float* att_lse = a->att_lse + (size_t)l * NH * BT;
        float* attproj = a->attproj + l * btc;
        float* residual2 = a->residual2 + l * btc;
        float* ln2 = a->ln2 + l * btc;
        float* ln2_mean = a->ln2_mean + (size_t)l * BT;
        float* ln2_rstd = a->ln2_rstd + (size_t)l * BT;
        float* fch = a->fch + l * 4 * btc;
        float* fch_gelu = a->fch_gelu + l * 4 * btc;
        float* fcproj = a->fcproj + l * btc;
        float* residual3 = a->residual3 + l * btc;
        size_t lc = (size_t)l * C;

        ref_layernorm_forward(ln1, ln1_mean, ln1_rstd, residual, p[PARAM_LN1W] + lc, p[PARAM_LN1B] + lc, BT, C);
        ref_fp8_linear_forward(gpt2ref_fp8_linear(model, l, FP8_LINEAR_QKV), fp8, qkv, ln1, p[PARAM_QKVW] + lc * 3 * C,
                               p[PARAM_QKVB] + lc * 3, BT, C, 3 * C);
        ref_attention_forward(atty, att_lse, qkv, B, T, C, NH);
        ref_fp8_linear_forward(gpt2ref_fp8_linear(model, l, FP8_LINEAR_ATTPROJ), fp8, attproj, atty,
                               p[PARAM_ATTPROJW] + lc * C, p[PARAM_ATTPROJB] + lc, BT, C, C);
        ref_residual_forward(residual2, residual, attproj, BT * C);
        ref_layernorm_forward(ln2, ln2_mean, ln2_rstd, residual2, p[PARAM_LN2W] + lc, p[PARAM_LN2B] + lc, BT, C);
        ref_fp8_linear_forward(gpt2ref_fp8_linear(model, l, FP8_LINEAR_FC), fp8, fch, ln2, p[PARAM_FCW] + lc * 4 * C,
                               p[PARAM_FCB] + lc * 4, BT, C, 4 * C);
        ref_gelu_forward(fch_gelu, fch, BT * 4 * C);
        ref_fp8_linear_forward(gpt2ref_fp8_linear(model, l, FP8_LINEAR_FCPROJ), fp8, fcproj, fch_gelu,
                               p[PARAM_FCPROJW] + lc * 4 * C, p[PARAM_FCPROJB] + lc, BT, 4 * C, C);
        ref_residual_forward(residual3, residual2, fcproj, BT * C);
        residual = residual3;
    }
    ref_layernorm_forward(a->lnf, a->lnf_mean, a->lnf_rstd, residual, p[PARAM_LNFW], p[PARAM_LNFB], BT, C);
    ref_fp8_linear_forward(gpt2ref_fp8_linear(model, 0, FP8_LINEAR_LM_HEAD), fp8, a->logits, a->lnf, p[PARAM_WTE], NULL,
                           BT, C, Vp);
    if (targets == NULL) {
        model->mean_loss = -1.0f;
        return model->mean_loss;
    }
    ref_crossentropy_forward_backward(a->losses, NULL, a->logits, targets, BT, V, Vp, 0.0f);
    double loss_sum = 0.0;
    for (int i = 0; i < BT; i++) { loss_sum += a->losses[i]; }
    model->mean_loss = (float)(loss_sum / BT);
    return model->mean_loss;
}

static inline void gpt2ref_zero_grad(GPT2Ref* model) {
    memset(model->grads, 0, model->num_parameters * sizeof(float));
}

/*
Backward of the last forward (which must have had targets). ADDS to model->grads the
gradient of mean_loss / grad_accum_steps. Gradient accumulation: zero_grad, then K
micro-steps of forward + backward(model, K) leave in grads exactly the gradient of the mean
loss over all K micro-batches, as one forward + backward(model, 1) on the concatenated
batch would. Use grad_accum_steps = 1 without accumulation.
*/
static inline void gpt2ref_backward(GPT2Ref* model, int grad_accum_steps) {
    if (model->acts_memory == NULL || !model->has_targets) {
        llm8_die("gpt2ref_backward: the last gpt2ref_forward had no targets (call it with targets first)");
    }
    if (grad_accum_steps < 1) {
        llm8_die("gpt2ref_backward: grad_accum_steps=%d is invalid (expected >= 1)", grad_accum_steps);
    }
    const GPT2Config* cfg = &model->config;
    int B = model->B, T = model->T, BT = B * T;
    int L = cfg->num_layers, NH = cfg->num_heads, C = cfg->channels, V = cfg->vocab_size, Vp = cfg->padded_vocab_size;
    float* const* p = model->param_tensors;
    float* const* g = model->grad_tensors;
    GPT2RefActs* a = &model->acts;
    GPT2RefGradActs* d = &model->grad_acts;
    const Fp8Emulation* fp8 = &model->fp8_config;
    size_t btc = (size_t)BT * C;

    float dloss = 1.0f / ((float)BT * grad_accum_steps);
    ref_crossentropy_forward_backward(a->losses, d->logits, a->logits, model->targets, BT, V, Vp, dloss);
    memset(d->ln, 0, btc * sizeof(float));
    ref_fp8_linear_backward(gpt2ref_fp8_linear(model, 0, FP8_LINEAR_LM_HEAD), fp8, d->ln, g[PARAM_WTE], NULL, d->logits,
                            a->lnf, p[PARAM_WTE], BT, C, Vp, fp8_dlogits_amax_bound(dloss));
    const float* top_residual = a->residual3 + (L - 1) * btc;
    memset(d->residual, 0, btc * sizeof(float));
    ref_layernorm_backward(d->residual, g[PARAM_LNFW], g[PARAM_LNFB], d->ln, top_residual, p[PARAM_LNFW],
                           a->lnf_mean, a->lnf_rstd, BT, C);
    // d->residual holds the gradient of the residual stream above the current layer; the
    // residual adds pass it unchanged to both of their inputs, so it is updated in place
    for (int l = L - 1; l >= 0; l--) {
        const float* residual = l == 0 ? a->encoded : a->residual3 + (l - 1) * btc;
        size_t lc = (size_t)l * C;
        memset(d->fch_gelu, 0, 4 * btc * sizeof(float));
        ref_fp8_linear_backward(gpt2ref_fp8_linear(model, l, FP8_LINEAR_FCPROJ), fp8, d->fch_gelu,
                                g[PARAM_FCPROJW] + lc * 4 * C, g[PARAM_FCPROJB] + lc, d->residual,
                                a->fch_gelu + l * 4 * btc, p[PARAM_FCPROJW] + lc * 4 * C, BT, 4 * C, C, 0.0f);
        memset(d->fch, 0, 4 * btc * sizeof(float));
        ref_gelu_backward(d->fch, a->fch + l * 4 * btc, d->fch_gelu, BT * 4 * C);
        memset(d->ln, 0, btc * sizeof(float));
        ref_fp8_linear_backward(gpt2ref_fp8_linear(model, l, FP8_LINEAR_FC), fp8, d->ln, g[PARAM_FCW] + lc * 4 * C,
                                g[PARAM_FCB] + lc * 4, d->fch, a->ln2 + l * btc, p[PARAM_FCW] + lc * 4 * C, BT, C, 4 * C, 0.0f);
        ref_layernorm_backward(d->residual, g[PARAM_LN2W] + lc, g[PARAM_LN2B] + lc, d->ln, a->residual2 + l * btc,
                               p[PARAM_LN2W] + lc, a->ln2_mean + (size_t)l * BT, a->ln2_rstd + (size_t)l * BT, BT, C);
        memset(d->atty, 0, btc * sizeof(float));
        ref_fp8_linear_backward(gpt2ref_fp8_linear(model, l, FP8_LINEAR_ATTPROJ), fp8, d->atty, g[PARAM_ATTPROJW] + lc * C,
                                g[PARAM_ATTPROJB] + lc, d->residual, a->atty + l * btc, p[PARAM_ATTPROJW] + lc * C,
                                BT, C, C, 0.0f);
        memset(d->qkv, 0, 3 * btc * sizeof(float));
        ref_attention_backward(d->qkv, d->atty, a->qkv + l * 3 * btc, a->atty + l * btc,
                               a->att_lse + (size_t)l * NH * BT, B, T, C, NH);
        memset(d->ln, 0, btc * sizeof(float));
        ref_fp8_linear_backward(gpt2ref_fp8_linear(model, l, FP8_LINEAR_QKV), fp8, d->ln, g[PARAM_QKVW] + lc * 3 * C,
                                g[PARAM_QKVB] + lc * 3, d->qkv, a->ln1 + l * btc, p[PARAM_QKVW] + lc * 3 * C,
                                BT, C, 3 * C, 0.0f);
        ref_layernorm_backward(d->residual, g[PARAM_LN1W] + lc, g[PARAM_LN1B] + lc, d->ln, residual,
                               p[PARAM_LN1W] + lc, a->ln1_mean + (size_t)l * BT, a->ln1_rstd + (size_t)l * BT, BT, C);
    }
    ref_encoder_backward(g[PARAM_WTE], g[PARAM_WPE], d->residual, model->inputs, B, T, C);
}

// sqrt of the sum of squares of all gradients, accumulated in double
static inline float gpt2ref_global_norm(GPT2Ref* model) {
    double sum = 0.0;
    for (size_t i = 0; i < model->num_parameters; i++) { sum += (double)model->grads[i] * model->grads[i]; }
    return (float)sqrt(sum);
}

// params[0..n) updated by AdamW from grads * grad_scale, m and v updated. adamw_element_update's
// four fmaf are each a call into libm where the target lacks FMA (on the tiny CPU model the calls
// and the loop around them were 28% of a step: every parameter, every step); the FMA clone makes
// each one instruction
REF_FMA_CLONES static void ref_adamw_range(float* params, const float* grads, float* m, float* v, size_t n,
                                           float grad_scale, AdamWElementParams hp) {
    for (size_t i = 0; i < n; i++) { params[i] = adamw_element_update(params[i], grads[i] * grad_scale, &m[i], &v[i], hp); }
}

/*
One AdamW step (t counts from 1) with llm.c's clipping: the gradients are multiplied by
grad_clip / norm when the global norm exceeds grad_clip (grad_clip <= 0 disables clipping).
Weight decay applies only to the tensors gpt2_param_is_decayed marks. Each element goes
through adamw_element_update, the code the GPU optimizer runs; then the FP8 weights' part of
the step (gpt2ref_fp8_weights_updated). Returns the global norm before clipping; when it is
not finite the parameters, moments and FP8 states are left untouched.
*/
static inline float gpt2ref_adamw_update(GPT2Ref* model, float learning_rate, float beta1, float beta2, float eps,
                                  float weight_decay, int t, float grad_clip) {
    if (t < 1) { llm8_die("gpt2ref_adamw_update: step t=%d is invalid (expected >= 1)", t); }
    float norm = gpt2ref_global_norm(model);
    if (!isfinite(norm)) { return norm; }
    float grad_scale = (grad_clip > 0.0f && norm > grad_clip) ? grad_clip / norm : 1.0f;
    size_t offset = 0;
    for (int tensor = 0; tensor < NUM_PARAMETER_TENSORS; tensor++) {
        AdamWElementParams hp = adamw_element_params(learning_rate, beta1, beta2, eps,
                                                     gpt2_param_is_decayed(tensor) ? weight_decay : 0.0f, t);
        const size_t n = model->param_sizes[tensor], chunks = ref_chunk_count(n);
        REF_PARALLEL_FOR
        for (size_t k = 0; k < chunks; k++) {
            const size_t start = offset + k * REF_CHUNK;
            ref_adamw_range(model->params + start, model->grads + start, model->adam_m + start, model->adam_v + start,
                            ref_chunk_length(n, k), grad_scale, hp);
        }
        offset += n;
    }
    gpt2ref_fp8_weights_updated(model);
    return norm;
}

static inline void gpt2ref_free(GPT2Ref* model) {
    free(model->params);
    free(model->grads);
    free(model->adam_m);
    free(model->adam_v);
    free(model->acts_memory);
    free(model->grad_acts_memory);
    free(model->inputs);
    free(model->targets);
    free(model->fp8_linears);
    memset(model, 0, sizeof(*model));
}

#endif // TEST_GPT2_REF_H
