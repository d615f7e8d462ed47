/*
layernorm.cuh: layernorm forward (plain and fused with the residual add), its backward,
and the residual add.

Why this shape:
- One warp per row. A row is C bf16 (at most 3.2 KB at C=1600), so a warp moves it in a
  few 16-byte loads per lane, and the row statistics need only warp shuffles, no block
  barriers. The forward keeps its row in shared memory so the row is read from global
  memory once although it is used three times (mean, variance, normalize); the variance
  is the two-pass sum of squared deviations, which is accurate where E[x^2]-E[x]^2 is not.
- The fused variant adds the residual branch first (rounded to bf16, as it is stored)
  and normalizes the stored bf16 value, so the recompute and backward passes, which read
  the stored residual, see exactly what the forward normalized.
- The backward must produce dweight/dbias (column sums over all N rows) without float
  atomics. Each warp accumulates its rows' column sums in its own shared-memory slice; at
  the end the block adds its warps' slices in warp order and writes one partial row to the
  scratch; a second small kernel adds the partials of all blocks in block order and adds
  the total into dweight/dbias. The grid size depends only on N (never on the device), so
  the order of every sum, and therefore every bit, is fixed.
*/
#ifndef LLMC_LAYERNORM_CUH
#define LLMC_LAYERNORM_CUH

#include "cuda_common.h"
#include "cuda_utils.cuh"

#define LAYERNORM_EPS 1e-5f
#define LAYERNORM_FORWARD_WARPS 8
#define LAYERNORM_BACKWARD_WARPS 4
// one full wave of 4-warp blocks on a 132-SM Hopper at C=1600 (51 KB shared memory each)
#define LAYERNORM_BACKWARD_MAX_BLOCKS 528
#define LAYERNORM_REDUCE_GROUPS 8

static inline void layernorm_check_shape(int N, int C, const char* who) {
    if (N <= 0 || C <= 0 || C % 8 != 0) {
        llm8_die("%s: N=%d, C=%d: need N > 0 and C a positive multiple of 8 (16-byte vector access)", who, N, C);
    }
}

// ----------------------------------------------------------------------------
// forward. inp2 == NULL: normalize inp1. inp2 != NULL: residual_out = bf16(inp1 + inp2),
// then normalize that. mean_out/rstd_out may be NULL (recompute pass).

__global__ void layernorm_forward_kernel(floatX* residual_out, floatX* normed_out, float* mean_out, float* rstd_out,
                                         const floatX* inp1, const floatX* inp2,
                                         const floatX* weight, const floatX* bias, int N, int C) {
    extern __shared__ x128 row_caches[];  // [LAYERNORM_FORWARD_WARPS][C / 8]
    const int lane = threadIdx.x % WARP_SIZE;
    const int warp = threadIdx.x / WARP_SIZE;
    const int row = blockIdx.x * LAYERNORM_FORWARD_WARPS + warp;
    if (row >= N) { return; }  // whole warps leave; the kernel has no block barrier
    const int chunks = C / x128::size;
    x128* cache = row_caches + warp * chunks;
    const size_t row_offset = (size_t)row * C;

    float sum = 0.0f;
    for (int i = lane; i < chunks; i += WARP_SIZE) {
        x128 x = load128cs(inp1 + row_offset + i * x128::size);
        if (inp2 != NULL) {
            x128 branch = load128cs(inp2 + row_offset + i * x128::size);
            for (int k = 0; k < x128::size; k++) {
                x[k] = __float2bfloat16_rn(__bfloat162float(x[k]) + __bfloat162float(branch[k]));
            }
            store128(residual_out + row_offset + i * x128::size, x);
        }
        cache[i] = x;
        for (int k = 0; k < x128::size; k++) { sum += __bfloat162float(x[k]); }
    }
    const float mean = warp_reduce_sum(sum) / C;

    float squared_deviations = 0.0f;
    for (int i = lane; i < chunks; i += WARP_SIZE) {
        x128 x = cache[i];
        for (int k = 0; k < x128::size; k++) {
            float deviation = __bfloat162float(x[k]) - mean;
            squared_deviations += deviation * deviation;
        }
    }
    const float rstd = 1.0f / sqrtf(warp_reduce_sum(squared_deviations) / C + LAYERNORM_EPS);

    for (int i = lane; i < chunks; i += WARP_SIZE) {
        x128 x = cache[i];
        x128 w = load128(weight + i * x128::size);
        x128 b = load128(bias + i * x128::size);
        x128 out;
        for (int k = 0; k < x128::size; k++) {
            float normalized = (__bfloat162float(x[k]) - mean) * rstd;
            out[k] = __float2bfloat16_rn(normalized * __bfloat162float(w[k]) + __bfloat162float(b[k]));
        }
        store128(normed_out + row_offset + i * x128::size, out);
    }
    if (lane == 0 && mean_out != NULL) { mean_out[row] = mean; }
    if (lane == 0 && rstd_out != NULL) { rstd_out[row] = rstd; }
}

static void layernorm_forward_launch(floatX* residual_out, floatX* normed_out, float* mean, float* rstd,
                                     const floatX* inp1, const floatX* inp2, const floatX* weight, const floatX* bias,
                                     int N, int C, cudaStream_t stream) {
    const int block_size = LAYERNORM_FORWARD_WARPS * WARP_SIZE;
    size_t shared_bytes = (size_t)LAYERNORM_FORWARD_WARPS * C * sizeof(floatX);
    cudaCheck(cudaFuncSetAttribute(layernorm_forward_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   (int)shared_bytes));  // above 48 KB (C > 3072) needs the opt-in
    layernorm_forward_kernel<<<ceil_div(N, LAYERNORM_FORWARD_WARPS), block_size, shared_bytes, stream>>>(
        residual_out, normed_out, mean, rstd, inp1, inp2, weight, bias, N, C);
    cudaCheck(cudaGetLastError());
}

void layernorm_forward(floatX* out, float* mean, float* rstd, const floatX* inp, const floatX* weight,
                       const floatX* bias, int N, int C, cudaStream_t stream) {
    layernorm_check_shape(N, C, "layernorm_forward");
    layernorm_forward_launch(NULL, out, mean, rstd, inp, NULL, weight, bias, N, C, stream);
}

void fused_residual_layernorm_forward(floatX* residual_out, floatX* normed_out, float* mean, float* rstd,
                                      const floatX* inp1, const floatX* inp2, const floatX* weight,
                                      const floatX* bias, int N, int C, cudaStream_t stream) {
    layernorm_check_shape(N, C, "fused_residual_layernorm_forward");
    layernorm_forward_launch(residual_out, normed_out, mean, rstd, inp1, inp2, weight, bias, N, C, stream);
}

// ----------------------------------------------------------------------------
// backward

static inline int layernorm_backward_num_blocks(int N) {
    int blocks = ceil_div(N, LAYERNORM_BACKWARD_WARPS);
    return blocks < LAYERNORM_BACKWARD_MAX_BLOCKS ? blocks : LAYERNORM_BACKWARD_MAX_BLOCKS;
}

// bytes of the `scratch` argument of layernorm_backward: one dweight+dbias partial row per block
size_t layernorm_backward_scratch_bytes(int N, int C) {
    return (size_t)layernorm_backward_num_blocks(N) * 2 * C * sizeof(float);
}

/*
Per row, with xhat = (x - mean) * rstd and dnorm = dout * weight:
  dinp += rstd * (dnorm - mean(dnorm) - xhat * mean(dnorm * xhat))
and the row's contributions dout * xhat and dout to the columns of dweight and dbias.
Writes this block's column sums to partials[blockIdx.x][0..C) (dweight) and [C..2C) (dbias).
*/
__global__ void layernorm_backward_kernel(floatX* dinp, float* partials, const floatX* dout, const floatX* inp,
                                          const floatX* weight, const float* mean, const float* rstd, int N, int C) {
    extern __shared__ f128 column_sums[];  // [LAYERNORM_BACKWARD_WARPS][2][C / 4]: dweight, then dbias
    const int lane = threadIdx.x % WARP_SIZE;
    const int warp = threadIdx.x / WARP_SIZE;
    const int chunks = C / x128::size;
    f128* warp_dweight = column_sums + (size_t)warp * 2 * (C / f128::size);
    f128* warp_dbias = warp_dweight + C / f128::size;
    // each lane owns the accumulators of its x128 chunks (two f128 each) for the whole
    // kernel, so no other lane ever touches them and no warp barrier is needed
    for (int i = lane; i < chunks; i += WARP_SIZE) {
        for (int half = 0; half < 2; half++) {
            warp_dweight[2 * i + half] = f128::zeros();
            warp_dbias[2 * i + half] = f128::zeros();
        }
    }

    for (int row = blockIdx.x * LAYERNORM_BACKWARD_WARPS + warp; row < N;
         row += gridDim.x * LAYERNORM_BACKWARD_WARPS) {
        const size_t row_offset = (size_t)row * C;
        const float row_mean = mean[row];
        const float row_rstd = rstd[row];
        float dnorm_sum = 0.0f;
        float dnorm_xhat_sum = 0.0f;
        for (int i = lane; i < chunks; i += WARP_SIZE) {
            x128 d = load128(dout + row_offset + i * x128::size);
            x128 x = load128(inp + row_offset + i * x128::size);
            x128 w = load128(weight + i * x128::size);
            for (int half = 0; half < 2; half++) {  // 8 bf16 columns = two f128 of accumulators
                f128 dweight_acc = warp_dweight[2 * i + half];
                f128 dbias_acc = warp_dbias[2 * i + half];
                for (int j = 0; j < f128::size; j++) {
                    int k = half * f128::size + j;
                    float dout_k = __bfloat162float(d[k]);
                    float xhat = (__bfloat162float(x[k]) - row_mean) * row_rstd;
                    float dnorm = __bfloat162float(w[k]) * dout_k;
                    dnorm_sum += dnorm;
                    dnorm_xhat_sum += dnorm * xhat;
                    dweight_acc[j] += dout_k * xhat;
                    dbias_acc[j] += dout_k;
                }
                warp_dweight[2 * i + half] = dweight_acc;
                warp_dbias[2 * i + half] = dbias_acc;
            }
        }
        const float dnorm_mean = warp_reduce_sum(dnorm_sum) / C;
        const float dnorm_xhat_mean = warp_reduce_sum(dnorm_xhat_sum) / C;
        for (int i = lane; i < chunks; i += WARP_SIZE) {  // second read of the row: L1/L2 hits
            x128 d = load128cs(dout + row_offset + i * x128::size);
            x128 x = load128cs(inp + row_offset + i * x128::size);
            x128 w = load128(weight + i * x128::size);
            x128 g = load128(dinp + row_offset + i * x128::size);
            for (int k = 0; k < x128::size; k++) {
                float xhat = (__bfloat162float(x[k]) - row_mean) * row_rstd;
                float dnorm = __bfloat162float(w[k]) * __bfloat162float(d[k]);
                float dx = (dnorm - dnorm_mean - xhat * dnorm_xhat_mean) * row_rstd;
                g[k] = __float2bfloat16_rn(__bfloat162float(g[k]) + dx);
            }
            store128(dinp + row_offset + i * x128::size, g);
        }
    }
    __syncthreads();

    const float* sums = reinterpret_cast<const float*>(column_sums);
    float* block_partials = partials + (size_t)blockIdx.x * 2 * C;
    for (int column = threadIdx.x; column < 2 * C; column += blockDim.x) {
        float total = 0.0f;
        for (int w = 0; w < LAYERNORM_BACKWARD_WARPS; w++) { total += sums[(size_t)w * 2 * C + column]; }
        block_partials[column] = total;
    }
}

// each block owns 32 of the 2C columns; its 8 warps sum interleaved subsets of the block
// partials (warp g takes blocks g, g+8, ...), then warp 0 adds the 8 group sums in order
__global__ void layernorm_backward_reduce_kernel(floatX* dweight, floatX* dbias, const float* partials,
                                                 int num_blocks, int C) {
    __shared__ float group_sums[LAYERNORM_REDUCE_GROUPS][WARP_SIZE];
    const int lane = threadIdx.x % WARP_SIZE;
    const int group = threadIdx.x / WARP_SIZE;
    const int column = blockIdx.x * WARP_SIZE + lane;
    float sum = 0.0f;
    if (column < 2 * C) {
        for (int b = group; b < num_blocks; b += LAYERNORM_REDUCE_GROUPS) { sum += partials[(size_t)b * 2 * C + column]; }
    }
    group_sums[group][lane] = sum;
    __syncthreads();
    if (group == 0 && column < 2 * C) {
        float total = 0.0f;
        for (int g = 0; g < LAYERNORM_REDUCE_GROUPS; g++) { total += group_sums[g][lane]; }
        floatX* target = column < C ? dweight + column : dbias + (column - C);
        *target = __float2bfloat16_rn(__bfloat162float(*target) + total);
    }
}

// dinp += (the residual stream's gradient), dweight += , dbias += ; scratch holds
// layernorm_backward_scratch_bytes(N, C) bytes
void layernorm_backward(floatX* dinp, floatX* dweight, floatX* dbias, float* scratch, const floatX* dout,
                        const floatX* inp, const floatX* weight, const float* mean, const float* rstd,
                        int N, int C, cudaStream_t stream) {
    layernorm_check_shape(N, C, "layernorm_backward");
    const int num_blocks = layernorm_backward_num_blocks(N);
    size_t shared_bytes = (size_t)LAYERNORM_BACKWARD_WARPS * 2 * C * sizeof(float);
    cudaCheck(cudaFuncSetAttribute(layernorm_backward_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   (int)shared_bytes));
    layernorm_backward_kernel<<<num_blocks, LAYERNORM_BACKWARD_WARPS * WARP_SIZE, shared_bytes, stream>>>(
        dinp, scratch, dout, inp, weight, mean, rstd, N, C);
    cudaCheck(cudaGetLastError());
    layernorm_backward_reduce_kernel<<<ceil_div(2 * C, WARP_SIZE), LAYERNORM_REDUCE_GROUPS * WARP_SIZE, 0, stream>>>(
        dweight, dbias, scratch, num_blocks, C);
    cudaCheck(cudaGetLastError());
}

// ----------------------------------------------------------------------------
// residual: out = bf16(a + b), N elements

__global__ void residual_forward_kernel(floatX* out, const floatX* a, const floatX* b, int N) {
    int i = (blockIdx.x * blockDim.x + threadIdx.x) * x128::size;
    if (i >= N) { return; }
    x128 va = load128cs(a + i);
    x128 vb = load128cs(b + i);
    x128 sum;
    for (int k = 0; k < x128::size; k++) {
        sum[k] = __float2bfloat16_rn(__bfloat162float(va[k]) + __bfloat162float(vb[k]));
    }
    store128(out + i, sum);
}

void residual_forward(floatX* out, const floatX* a, const floatX* b, int N, cudaStream_t stream) {
    if (N <= 0 || N % 8 != 0) {
        llm8_die("residual_forward: N=%d elements must be a positive multiple of 8 (16-byte vector access)", N);
    }
    const int block_size = 256;
    residual_forward_kernel<<<ceil_div(N / x128::size, block_size), block_size, 0, stream>>>(out, a, b, N);
    cudaCheck(cudaGetLastError());
}

#endif // LLMC_LAYERNORM_CUH
