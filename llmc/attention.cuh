/*
attention.cuh: causal multi-head self-attention, forward and backward, with two backends
chosen once at startup (attention_setup).

- ATTENTION_CUDNN: cuDNN's fused flash attention (llmc/cudnn_att.cpp). The fast path.
- ATTENTION_FALLBACK: the kernels below. They exist so that llm8 builds and trains where the
  cuDNN frontend is missing (-DLLM8_NO_CUDNN) or cuDNN refuses a shape, and as a second,
  independent implementation to test cuDNN against. They are written to be obviously right
  and deterministic, not fast.

Layouts: qkv [B][T][3][NH][HS], out [B][T][NH][HS], stats [B][NH][T] fp32. Both backends
write stats as the natural-log logsumexp of the scaled scores of each query row (what cuDNN
calls Stats), so the probabilities are P[i][j] = exp(scale * q_i.k_j - stats[i]) in either.

Fallback design: no B*NH*T*T buffer anywhere; one warp per row; every sum in a fixed order.
- forward, one warp per query row i: keys are taken 32 at a time, lane l scoring key j0+l
  (a full dot product against the query held in shared memory), then an online softmax
  (running max and sum, fp32) and the lanes, each owning HS/32 output dims, accumulate the
  probability-weighted value rows.
- backward in two kernels, neither with atomics (the flash-attention identities, with
  D_i = dout_i . out_i and dS_ij = P_ij (dout_i . v_j - D_i)):
  1. one warp per query row i: D_i (saved for kernel 2) and dq_i = scale * sum_j dS_ij k_j;
  2. one warp per key row j: dv_j = sum_{i>=j} P_ij dout_i, dk_j = scale * sum_{i>=j} dS_ij q_i.
  Kernel 2 recomputes each score with the same products in the same order as kernel 1,
  so both see bitwise the same P.
Rows are ordered longest first, so the long causal rows do not start last.
Each lane's per-key values of a chunk (the forward's probability, the backward's P and dS)
reach the other lanes through the warp's row of shared memory, read by all lanes at once (a
broadcast): a __syncwarp before the chunk's reads and one after, where a shuffle per key is
32 warp collectives a chunk. Under test/cudasim each collective is a fiber switch per lane:
the shuffles made these kernels two thirds of test_gpt2's switches, and its run 35% longer.
*/
#ifndef LLMC_ATTENTION_CUH
#define LLMC_ATTENTION_CUH

#include <math.h>
#include <stdint.h>
#include "cuda_common.h"
#include "cuda_utils.cuh"
#include "cudnn_att.h"

typedef enum {
    ATTENTION_CUDNN,
    ATTENTION_FALLBACK
} AttentionBackend;

static AttentionBackend attention_backend = ATTENTION_FALLBACK;
static bool attention_ready = false;
static float* attention_row_dots = NULL;  // fallback backward: D_i per query row, [B][NH][T]
static size_t attention_row_dots_count = 0;

// deterministic_backward: cuDNN's deterministic backward algorithm (the fallback kernels are
// deterministic either way); false takes its faster one, whose float atomics vary the last bits
void attention_setup(AttentionBackend backend, bool deterministic_backward) {
    if (attention_ready) { llm8_die("attention_setup called twice without attention_teardown"); }
    if (backend == ATTENTION_CUDNN) {
#ifdef LLM8_NO_CUDNN
        (void)deterministic_backward;
        llm8_die("attention: this build has no cuDNN (built with -DLLM8_NO_CUDNN); "
                 "use the fallback attention backend, or rebuild with the cuDNN frontend headers");
#else
        cudnn_att_setup(deterministic_backward);
#endif
    } else if (backend != ATTENTION_FALLBACK) {
        llm8_die("attention_setup: unknown backend %d", (int)backend);
    }
    attention_backend = backend;
    attention_ready = true;
}

void attention_teardown(void) {
#ifndef LLM8_NO_CUDNN
    if (attention_ready && attention_backend == ATTENTION_CUDNN) { cudnn_att_teardown(); }
#endif
    if (attention_row_dots != NULL) { cudaCheck(cudaFree(attention_row_dots)); }
    attention_row_dots = NULL;
    attention_row_dots_count = 0;
    attention_ready = false;
}

// why `backend` cannot run heads of HS channels, or NULL: the fallback kernels are built for
// 64 and 128 (HS is a template parameter), cuDNN takes multiples of 8 up to 128. The trainer
// asks at startup, naming the model, before the GPU is touched.
static const char* attention_head_size_error(AttentionBackend backend, int HS) {
    if (backend == ATTENTION_FALLBACK && HS != 64 && HS != 128) {
        return "the fallback attention kernels take 64 or 128 (-at fallback; -at cudnn takes a multiple of 8 up to 128)";
    }
    if (backend == ATTENTION_CUDNN && !cudnn_att_head_size_supported(HS)) {
        return "cuDNN attention takes a multiple of 8 up to 128 (-at cudnn)";
    }
    return NULL;
}

// checks the shape on every call (host only, no sync); returns the head size
static int attention_check_shape(const char* what, int B, int T, int NH, int C) {
    if (!attention_ready) { llm8_die("attention %s: called before attention_setup", what); }
    if (B <= 0 || T <= 0 || NH <= 0 || C <= 0 || C % NH != 0) {
        llm8_die("attention %s: bad shape B=%d T=%d NH=%d C=%d (C must be a positive multiple of NH)", what, B, T, NH, C);
    }
    int HS = C / NH;
    const char* error = attention_head_size_error(attention_backend, HS);
    if (error != NULL) { llm8_die("attention %s: head size C/NH = %d: %s", what, HS, error); }
    return HS;
}

// bf16 buffers are read 16 bytes at a time, and cuDNN assumes 16-byte alignment of every pointer
// it takes, the fp32 stats included: it chooses its kernels by that, and does not check the stats
// pointer (a layer's slice of the trainer's stats is aligned only if padded: train_gpt2_fp8.cu)
static void attention_check_aligned(const char* what, const char* buffer_name, const void* pointer) {
    if (((uintptr_t)pointer) % 16 != 0) {
        llm8_die("attention %s: %s pointer %p is not 16-byte aligned", what, buffer_name, pointer);
    }
}

// ----------------------------------------------------------------------------
// fallback kernels

#define ATTENTION_WARPS_PER_BLOCK 8

// sum over d of vec[d] * row[d], vec in shared memory (all lanes read the same address:
// a broadcast), row a bf16 head vector in global memory; one lane, sequential order
template <int HS>
__device__ __forceinline__ float attention_dot(const float* vec, const floatX* row) {
    float sum = 0.0f;
    for (int d = 0; d < HS; d += x128::size) {
        x128 packed = load128(row + d);
        for (int e = 0; e < x128::size; e++) { sum += vec[d + e] * (float)packed[e]; }
    }
    return sum;
}

// copies a bf16 head vector into this warp's shared memory as fp32
template <int HS>
__device__ __forceinline__ void attention_load_shared(float* dest, const floatX* row, int lane) {
    for (int d = lane; d < HS; d += WARP_SIZE) { dest[d] = (float)row[d]; }
}

// the (b, h, t) of a warp's row; reverse_t runs t from T-1 down, for rows whose work grows with t
__device__ __forceinline__ void attention_row_coordinates(int row, int T, int NH, bool reverse_t,
                                                          int* b, int* h, int* t) {
    int t_index = row % T;
    *t = reverse_t ? T - 1 - t_index : t_index;
    *h = (row / T) % NH;
    *b = row / (T * NH);
}

template <int HS>
__global__ void __launch_bounds__(ATTENTION_WARPS_PER_BLOCK * WARP_SIZE)
attention_forward_fallback_kernel(floatX* out, float* stats, const floatX* qkv, int B, int T, int NH, float scale) {
    constexpr int DIMS_PER_LANE = HS / WARP_SIZE;
    __shared__ float query_shared[ATTENTION_WARPS_PER_BLOCK][HS];
    __shared__ float p_shared[ATTENTION_WARPS_PER_BLOCK][WARP_SIZE];
    int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    int row = blockIdx.x * ATTENTION_WARPS_PER_BLOCK + warp;
    if (row >= B * NH * T) { return; }  // whole warps only; the kernel syncs warps, never the block
    int b, h, i;
    attention_row_coordinates(row, T, NH, true, &b, &h, &i);
    int C = NH * HS;
    size_t C3 = (size_t)3 * C;
    const floatX* keys = qkv + (size_t)b * T * C3 + C + h * HS;  // key j at keys + j * C3
    const floatX* values = keys + C;
    float* query = query_shared[warp];
    attention_load_shared<HS>(query, qkv + ((size_t)b * T + i) * C3 + h * HS, lane);
    __syncwarp();

    float running_max = -INFINITY;
    float running_sum = 0.0f;
    float acc[DIMS_PER_LANE] = {0.0f};
    for (int j0 = 0; j0 <= i; j0 += WARP_SIZE) {
        int j = j0 + lane;
        float score = j <= i ? scale * attention_dot<HS>(query, keys + j * C3) : -INFINITY;
        float new_max = fmaxf(running_max, warp_reduce_max(score));
        float p = j <= i ? expf(score - new_max) : 0.0f;
        float correction = expf(running_max - new_max);  // 0 on the first chunk
        running_sum = running_sum * correction + warp_reduce_sum(p);
        running_max = new_max;
        for (int k = 0; k < DIMS_PER_LANE; k++) { acc[k] *= correction; }
        int chunk = min(WARP_SIZE, i - j0 + 1);
        p_shared[warp][lane] = p;
        __syncwarp();  // the chunk's values, all written before any lane reads them
        for (int jj = 0; jj < chunk; jj++) {
            float p_jj = p_shared[warp][jj];
            const floatX* v = values + (j0 + jj) * C3;
            for (int k = 0; k < DIMS_PER_LANE; k++) { acc[k] += p_jj * (float)v[lane + k * WARP_SIZE]; }
        }
        __syncwarp();  // all lanes have read them: the next chunk may overwrite them
    }
    floatX* o = out + ((size_t)b * T + i) * C + h * HS;
    for (int k = 0; k < DIMS_PER_LANE; k++) { o[lane + k * WARP_SIZE] = (floatX)(acc[k] / running_sum); }
    if (lane == 0) { stats[((size_t)b * NH + h) * T + i] = running_max + logf(running_sum); }
}

// backward 1: one warp per query row i writes dq_i and D_i = dout_i . out_i
template <int HS>
__global__ void __launch_bounds__(ATTENTION_WARPS_PER_BLOCK * WARP_SIZE)
attention_backward_query_kernel(floatX* dqkv, float* row_dots, const floatX* dout, const floatX* qkv,
                                const floatX* out, const float* stats, int B, int T, int NH, float scale) {
    constexpr int DIMS_PER_LANE = HS / WARP_SIZE;
    __shared__ float query_shared[ATTENTION_WARPS_PER_BLOCK][HS];
    __shared__ float dout_shared[ATTENTION_WARPS_PER_BLOCK][HS];
    __shared__ float dscore_shared[ATTENTION_WARPS_PER_BLOCK][WARP_SIZE];
    int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    int row = blockIdx.x * ATTENTION_WARPS_PER_BLOCK + warp;
    if (row >= B * NH * T) { return; }
    int b, h, i;
    attention_row_coordinates(row, T, NH, true, &b, &h, &i);
    int C = NH * HS;
    size_t C3 = (size_t)3 * C;
    const floatX* keys = qkv + (size_t)b * T * C3 + C + h * HS;
    const floatX* values = keys + C;
    size_t out_offset = ((size_t)b * T + i) * C + h * HS;
    size_t stats_index = ((size_t)b * NH + h) * T + i;
    float* query = query_shared[warp];
    float* dout_row = dout_shared[warp];
    attention_load_shared<HS>(query, qkv + ((size_t)b * T + i) * C3 + h * HS, lane);
    attention_load_shared<HS>(dout_row, dout + out_offset, lane);
    __syncwarp();

    float partial = 0.0f;
    for (int k = 0; k < DIMS_PER_LANE; k++) {
        int d = lane + k * WARP_SIZE;
        partial += dout_row[d] * (float)out[out_offset + d];
    }
    float row_dot = warp_reduce_sum(partial);
    if (lane == 0) { row_dots[stats_index] = row_dot; }
    float lse = stats[stats_index];

    float dq[DIMS_PER_LANE] = {0.0f};
    for (int j0 = 0; j0 <= i; j0 += WARP_SIZE) {
        int j = j0 + lane;
        float dscore = 0.0f;
        if (j <= i) {
            float p = expf(scale * attention_dot<HS>(query, keys + j * C3) - lse);
            dscore = p * (attention_dot<HS>(dout_row, values + j * C3) - row_dot);
        }
        int chunk = min(WARP_SIZE, i - j0 + 1);
        dscore_shared[warp][lane] = dscore;
        __syncwarp();
        for (int jj = 0; jj < chunk; jj++) {
            float dscore_jj = dscore_shared[warp][jj];
            const floatX* k_row = keys + (j0 + jj) * C3;
            for (int k = 0; k < DIMS_PER_LANE; k++) { dq[k] += dscore_jj * (float)k_row[lane + k * WARP_SIZE]; }
        }
        __syncwarp();  // all lanes have read them: the next chunk may overwrite them
    }
    floatX* dq_out = dqkv + ((size_t)b * T + i) * C3 + h * HS;
    for (int k = 0; k < DIMS_PER_LANE; k++) { dq_out[lane + k * WARP_SIZE] = (floatX)(scale * dq[k]); }
}

// backward 2: one warp per key row j writes dk_j and dv_j (needs row_dots from backward 1)
template <int HS>
__global__ void __launch_bounds__(ATTENTION_WARPS_PER_BLOCK * WARP_SIZE)
attention_backward_key_kernel(floatX* dqkv, const float* row_dots, const floatX* dout, const floatX* qkv,
                              const float* stats, int B, int T, int NH, float scale) {
    constexpr int DIMS_PER_LANE = HS / WARP_SIZE;
    __shared__ float key_shared[ATTENTION_WARPS_PER_BLOCK][HS];
    __shared__ float value_shared[ATTENTION_WARPS_PER_BLOCK][HS];
    __shared__ float p_shared[ATTENTION_WARPS_PER_BLOCK][WARP_SIZE];
    __shared__ float dscore_shared[ATTENTION_WARPS_PER_BLOCK][WARP_SIZE];
    int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    int row = blockIdx.x * ATTENTION_WARPS_PER_BLOCK + warp;
    if (row >= B * NH * T) { return; }
    int b, h, j;
    attention_row_coordinates(row, T, NH, false, &b, &h, &j);  // small j has the most queries
    int C = NH * HS;
    size_t C3 = (size_t)3 * C;
    const floatX* queries = qkv + (size_t)b * T * C3 + h * HS;  // query i at queries + i * C3
    const floatX* douts = dout + (size_t)b * T * C + h * HS;    // dout i at douts + i * C
    const float* row_stats = stats + ((size_t)b * NH + h) * T;
    const float* row_dot = row_dots + ((size_t)b * NH + h) * T;
    float* key = key_shared[warp];
    float* value = value_shared[warp];
    attention_load_shared<HS>(key, queries + j * C3 + C, lane);
    attention_load_shared<HS>(value, queries + j * C3 + 2 * C, lane);
    __syncwarp();

    float dk[DIMS_PER_LANE] = {0.0f};
    float dv[DIMS_PER_LANE] = {0.0f};
    for (int i0 = j; i0 < T; i0 += WARP_SIZE) {
        int i = i0 + lane;
        float p = 0.0f, dscore = 0.0f;
        if (i < T) {
            p = expf(scale * attention_dot<HS>(key, queries + i * C3) - row_stats[i]);
            dscore = p * (attention_dot<HS>(value, douts + i * C) - row_dot[i]);
        }
        int chunk = min(WARP_SIZE, T - i0);
        p_shared[warp][lane] = p;
        dscore_shared[warp][lane] = dscore;
        __syncwarp();
        for (int ii = 0; ii < chunk; ii++) {
            float p_ii = p_shared[warp][ii];
            float dscore_ii = dscore_shared[warp][ii];
            const floatX* q_row = queries + (i0 + ii) * C3;
            const floatX* dout_row = douts + (i0 + ii) * C;
            for (int k = 0; k < DIMS_PER_LANE; k++) {
                int d = lane + k * WARP_SIZE;
                dv[k] += p_ii * (float)dout_row[d];
                dk[k] += dscore_ii * (float)q_row[d];
            }
        }
        __syncwarp();
    }
    floatX* dk_out = dqkv + ((size_t)b * T + j) * C3 + C + h * HS;
    floatX* dv_out = dk_out + C;
    for (int k = 0; k < DIMS_PER_LANE; k++) {
        dk_out[lane + k * WARP_SIZE] = (floatX)(scale * dk[k]);
        dv_out[lane + k * WARP_SIZE] = (floatX)dv[k];
    }
}

static inline int attention_fallback_blocks(int B, int T, int NH) {
    return ceil_div(B * NH * T, ATTENTION_WARPS_PER_BLOCK);
}

template <int HS>
void attention_forward_fallback(floatX* out, float* stats, const floatX* qkv, int B, int T, int NH,
                                cudaStream_t stream) {
    float scale = 1.0f / sqrtf((float)HS);
    attention_forward_fallback_kernel<HS><<<attention_fallback_blocks(B, T, NH), ATTENTION_WARPS_PER_BLOCK * WARP_SIZE,
                                            0, stream>>>(out, stats, qkv, B, T, NH, scale);
    cudaCheck(cudaGetLastError());
}

template <int HS>
void attention_backward_fallback(floatX* dqkv, const floatX* dout, const floatX* qkv, const floatX* out,
                                 const float* stats, int B, int T, int NH, cudaStream_t stream) {
    size_t rows = (size_t)B * NH * T;
    if (rows > attention_row_dots_count) {  // grows only when a larger shape is first seen
        if (attention_row_dots != NULL) { cudaCheck(cudaFree(attention_row_dots)); }
        attention_row_dots = (float*)cuda_malloc_checked(rows * sizeof(float), "the attention backward row dots");
        attention_row_dots_count = rows;
    }
    float scale = 1.0f / sqrtf((float)HS);
    int blocks = attention_fallback_blocks(B, T, NH);
    attention_backward_query_kernel<HS><<<blocks, ATTENTION_WARPS_PER_BLOCK * WARP_SIZE, 0, stream>>>(
        dqkv, attention_row_dots, dout, qkv, out, stats, B, T, NH, scale);
    cudaCheck(cudaGetLastError());
    attention_backward_key_kernel<HS><<<blocks, ATTENTION_WARPS_PER_BLOCK * WARP_SIZE, 0, stream>>>(
        dqkv, attention_row_dots, dout, qkv, stats, B, T, NH, scale);
    cudaCheck(cudaGetLastError());
}

// ----------------------------------------------------------------------------
// launchers

// out[B][T][C] and stats[B][NH][T] from qkv[B][T][3C]
void attention_forward(floatX* out, float* stats, const floatX* qkv, int B, int T, int NH, int C,
                       cudaStream_t stream) {
    int HS = attention_check_shape("forward", B, T, NH, C);
    attention_check_aligned("forward", "out", out);
    attention_check_aligned("forward", "qkv", qkv);
    attention_check_aligned("forward", "stats", stats);
#ifndef LLM8_NO_CUDNN
    if (attention_backend == ATTENTION_CUDNN) {
        cudnn_att_forward(out, stats, qkv, B, T, NH, C, stream);
        return;
    }
#endif
    if (HS == 64) {
        attention_forward_fallback<64>(out, stats, qkv, B, T, NH, stream);
    } else {
        attention_forward_fallback<128>(out, stats, qkv, B, T, NH, stream);
    }
}

// dqkv[B][T][3C] (overwritten) from dout[B][T][C] and the forward's qkv, out and stats
void attention_backward(floatX* dqkv, const floatX* dout, const floatX* qkv, const floatX* out, const float* stats,
                        int B, int T, int NH, int C, cudaStream_t stream) {
    int HS = attention_check_shape("backward", B, T, NH, C);
    attention_check_aligned("backward", "dqkv", dqkv);
    attention_check_aligned("backward", "dout", dout);
    attention_check_aligned("backward", "qkv", qkv);
    attention_check_aligned("backward", "out", out);
    attention_check_aligned("backward", "stats", stats);
#ifndef LLM8_NO_CUDNN
    if (attention_backend == ATTENTION_CUDNN) {
        cudnn_att_backward(dqkv, dout, qkv, out, stats, B, T, NH, C, stream);
        return;
    }
#endif
    if (HS == 64) {
        attention_backward_fallback<64>(dqkv, dout, qkv, out, stats, B, T, NH, stream);
    } else {
        attention_backward_fallback<128>(dqkv, dout, qkv, out, stats, B, T, NH, stream);
    }
}

#endif // LLMC_ATTENTION_CUH
