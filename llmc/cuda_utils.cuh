/*
cuda_utils.cuh: warp and block reductions, and bf16 stochastic rounding on the device.

Why: every reduction in llm8 must give the same bits on every run (architecture.md,
determinism), so none of them uses float atomics. A warp reduction here is an xor
butterfly: at each step lane i adds the value of lane i^offset, and because IEEE addition
is commutative both partners compute the same sum, so after five steps every lane holds
the identical, run-independent result. block_reduce_sum then combines the per-warp sums in
warp order through shared memory. Stochastic rounding is a thin wrapper over the host/device
element functions in element_math.h, so the device rounds exactly as the CPU reference does.
*/
#ifndef LLMC_CUDA_UTILS_CUH
#define LLMC_CUDA_UTILS_CUH

#include "cuda_common.h"
#include "element_math.h"

#define WARP_SIZE 32

__device__ __forceinline__ float warp_reduce_sum(float value) {
    for (int offset = WARP_SIZE / 2; offset > 0; offset /= 2) {
        value += __shfl_xor_sync(0xffffffffu, value, offset);
    }
    return value;
}

__device__ __forceinline__ float warp_reduce_max(float value) {
    for (int offset = WARP_SIZE / 2; offset > 0; offset /= 2) {
        value = fmaxf(value, __shfl_xor_sync(0xffffffffu, value, offset));
    }
    return value;
}

// Sum over the whole block, returned to every thread. blockDim.x must be a multiple of 32
// (at most 1024) and every thread of the block must call it. Safe to call repeatedly.
__device__ __forceinline__ float block_reduce_sum(float value) {
    __shared__ float warp_sums[WARP_SIZE];
    const int lane = threadIdx.x % WARP_SIZE;
    const int warp = threadIdx.x / WARP_SIZE;
    const int num_warps = blockDim.x / WARP_SIZE;
    float warp_sum = warp_reduce_sum(value);
    if (lane == 0) { warp_sums[warp] = warp_sum; }
    __syncthreads();
    float partial = (lane < num_warps) ? warp_sums[lane] : 0.0f;
    float total = warp_reduce_sum(partial);
    __syncthreads();  // warp_sums may be reused by the next call
    return total;
}

// bf16 by stochastic rounding, with the random bits rounding_bits(seed, index): the same
// seed and index give the same bf16 on the host (float_to_bf16_bits_stochastic) and here.
__device__ __forceinline__ floatX stochastic_round_bf16(float x, uint32_t seed, uint32_t index) {
    return bf16_from_bits(float_to_bf16_bits_stochastic(x, rounding_bits(seed, index)));
}

// finite elements even_index and even_index + 1 (even_index even) from one hash: the bits of two
// stochastic_round_bf16 calls
__device__ __forceinline__ void stochastic_round_bf16_pair(float x0, float x1, uint32_t seed, uint32_t even_index,
                                                           floatX* rounded0, floatX* rounded1) {
    uint32_t bits = random_u32(seed, even_index >> 1);
    *rounded0 = bf16_from_bits(float_to_bf16_bits_stochastic_finite(x0, bits));
    *rounded1 = bf16_from_bits(float_to_bf16_bits_stochastic_finite(x1, bits >> 16));
}

#endif // LLMC_CUDA_UTILS_CUH
