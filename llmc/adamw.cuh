/*
adamw.cuh: the AdamW step for one parameter tensor (or any contiguous run of them), with an
fp32 master copy and bf16 working weights written by stochastic rounding.

Why: the update is one memory-bound pass, so everything happens per element in one kernel:
read the bf16 gradient, scale it (gradient clipping), read the fp32 master (or, with no
master, the bf16 weight itself), run adamw_element_update from element_math.h, write the
master and the bf16 weight. Rounding the new weight to bf16 stochastically, with the random
bits random_u32(seed, element index), keeps small updates from being rounded away on
average, and makes the result a pure function of (inputs, seed): the CPU can compute the
same bits with the same element functions, which is how the GPU test checks it. One thread
per element, with plain coalesced loads, handles any n (no alignment or multiple-of-8 rule).
The caller picks a different seed per tensor and step, so no two roundings share bits; the
element index is counted from the tensor's start (first_index: where this call's run
begins), so a tensor updated in parts, as ZeRO ranks do, rounds exactly as in one call.
The optional amax output is the FP8 weight cast's (DESIGN.md section 3: the optimizer pass
finds each weight's new amax): max |new value the cast reads| (the master when there is
one, else the bf16 weight), a warp max, then one atomicMax on the float's bits per warp.
*/
#ifndef LLMC_ADAMW_CUH
#define LLMC_ADAMW_CUH

#include "cuda_common.h"
#include "cuda_utils.cuh"
#include "element_math.h"

__global__ void adamw_update_kernel(floatX* params, float* master_params, const floatX* grads, float* m, float* v,
                                    size_t n, AdamWElementParams hp, float grad_scale, uint32_t seed,
                                    uint32_t first_index, unsigned int* amax_bits) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    float cast_input = 0.0f;
    if (i < n) {
        float grad = __bfloat162float(grads[i]) * grad_scale;
        float param = master_params != NULL ? master_params[i] : __bfloat162float(params[i]);
        float m_i = m[i];
        float v_i = v[i];
        float new_param = adamw_element_update(param, grad, &m_i, &v_i, hp);
        m[i] = m_i;
        v[i] = v_i;
        if (master_params != NULL) { master_params[i] = new_param; }
        floatX weight = stochastic_round_bf16(new_param, seed, first_index + (uint32_t)i);
        params[i] = weight;
        cast_input = master_params != NULL ? new_param : __bfloat162float(weight);
    }
    if (amax_bits != NULL) {  // whole warps reach here: the block size is a multiple of 32
        float warp_max = warp_reduce_max(fabsf(cast_input));
        if (threadIdx.x % WARP_SIZE == 0) { atomicMax(amax_bits, __float_as_uint(warp_max)); }
    }
}

/*
n elements of one tensor, starting at its element first_index; master_params may be NULL
(bf16 weights only); grad_scale multiplies each gradient first (1, or the clipping factor);
amax_bits (nullable) receives max(*amax_bits, bits of |new value|) (see above).
*/
void adamw_update(floatX* params, float* master_params, const floatX* grads, float* m, float* v, size_t n,
                  AdamWElementParams hp, float grad_scale, uint32_t seed, uint32_t first_index, unsigned int* amax_bits,
                  cudaStream_t stream) {
    if (n > (size_t)UINT32_MAX - first_index) {
        llm8_die("adamw_update: %zu elements from element %u of a tensor; the rounding index is 32-bit", n, first_index);
    }
    if (n == 0) { return; }
    const int block_size = 512;
    adamw_update_kernel<<<(unsigned int)ceil_div_size(n, block_size), block_size, 0, stream>>>(
        params, master_params, grads, m, v, n, hp, grad_scale, seed, first_index, amax_bits);
    cudaCheck(cudaGetLastError());
}

#endif // LLMC_ADAMW_CUH
