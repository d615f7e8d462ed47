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
The caller picks a different seed per tensor and step, so no two roundings share bits.
*/
#ifndef LLMC_ADAMW_CUH
#define LLMC_ADAMW_CUH

#include "cuda_common.h"
#include "cuda_utils.cuh"
#include "element_math.h"

__global__ void adamw_update_kernel(floatX* params, float* master_params, const floatX* grads, float* m, float* v,
                                    size_t n, AdamWElementParams hp, float grad_scale, uint32_t seed) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) { return; }
    float grad = __bfloat162float(grads[i]) * grad_scale;
    float param = master_params != NULL ? master_params[i] : __bfloat162float(params[i]);
    float m_i = m[i];
    float v_i = v[i];
    float new_param = adamw_element_update(param, grad, &m_i, &v_i, hp);
    m[i] = m_i;
    v[i] = v_i;
    if (master_params != NULL) { master_params[i] = new_param; }
    params[i] = stochastic_round_bf16(new_param, seed, (uint32_t)i);
}

// n elements; master_params may be NULL (bf16 weights only); grad_scale multiplies each
// gradient first (1, or the clipping factor)
void adamw_update(floatX* params, float* master_params, const floatX* grads, float* m, float* v, size_t n,
                  AdamWElementParams hp, float grad_scale, uint32_t seed, cudaStream_t stream) {
    if (n > (size_t)UINT32_MAX) {
        llm8_die("adamw_update: %zu elements in one call; the rounding index is 32-bit, split the call", n);
    }
    if (n == 0) { return; }
    const int block_size = 512;
    adamw_update_kernel<<<(unsigned int)ceil_div_size(n, block_size), block_size, 0, stream>>>(
        params, master_params, grads, m, v, n, hp, grad_scale, seed);
    cudaCheck(cudaGetLastError());
}

#endif // LLMC_ADAMW_CUH
