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
The optional FP8 weight outputs (Fp8WeightUpdate, fp8_scaling.cuh; DESIGN.md section 3:
the optimizer pass finds each weight's new amax, and with the delayed weight cast writes its
codes): per element fp8_weight_element (fp8.h) of the value the cast reads (the master when
there is one, else the bf16 weight), its code stored at the element's place, everything
tallied per thread and committed once per block (fp8_tally_commit: a deterministic max and
integer counts).
*/
#ifndef LLMC_ADAMW_CUH
#define LLMC_ADAMW_CUH

#include "cuda_common.h"
#include "cuda_utils.cuh"
#include "element_math.h"
#include "fp8.h"
#include "fp8_scaling.cuh"

__global__ void adamw_update_kernel(floatX* params, float* master_params, const floatX* grads, float* m, float* v,
                                    size_t n, AdamWElementParams hp, float grad_scale, uint32_t seed,
                                    uint32_t first_index, Fp8WeightUpdate fp8) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    Fp8Tally tally = fp8_tally_zero();
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
        if (fp8.record != NULL) {
            uint8_t code = fp8_weight_update_element(fp8, fp8_weight_update_scale(fp8), master_params != NULL, new_param,
                                                     weight, &tally);
            if (fp8.codes != NULL) { fp8.codes[i] = code; }
        }
    }
    if (fp8.record != NULL) { fp8_tally_commit(tally, fp8.record, true); }  // the same branch in every thread
}

/*
n elements of one tensor, starting at its element first_index; master_params may be NULL
(bf16 weights only); grad_scale multiplies each gradient first (1, or the clipping factor);
fp8: the FP8 weight outputs (see above; zeroed: none), codes pointing at this run's first element.
*/
void adamw_update(floatX* params, float* master_params, const floatX* grads, float* m, float* v, size_t n,
                  AdamWElementParams hp, float grad_scale, uint32_t seed, uint32_t first_index, Fp8WeightUpdate fp8,
                  cudaStream_t stream) {
    if (n > (size_t)UINT32_MAX - first_index) {
        llm8_die("adamw_update: %zu elements from element %u of a tensor; the rounding index is 32-bit", n, first_index);
    }
    if (n == 0) { return; }
    const int block_size = 512;
    adamw_update_kernel<<<(unsigned int)ceil_div_size(n, block_size), block_size, 0, stream>>>(
        params, master_params, grads, m, v, n, hp, grad_scale, seed, first_index, fp8);
    cudaCheck(cudaGetLastError());
}

#endif // LLMC_ADAMW_CUH
