/*
adamw.cuh: the AdamW step for one parameter tensor (or any contiguous run of them), with an
fp32 master copy and bf16 working weights written by stochastic rounding.

Why: the update is one memory-bound pass, so everything happens per element in one kernel:
read the bf16 gradient, scale it (gradient clipping), read the fp32 master (or, with no
master, the bf16 weight itself), run adamw_element_update from element_math.h, write the
master and the bf16 weight. Rounding the new weight to bf16 stochastically, with the random
bits rounding_bits(seed, element index), keeps small updates from being rounded away on
average, and makes the result a pure function of (inputs, seed): the CPU can compute the
same bits with the same element functions, which is how the GPU test checks it. Any n and
any alignment: 4 elements a thread where the arrays allow, one where not (below).
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

/*
Each thread updates ADAMW_VECTOR consecutive elements where every array of the call is aligned
for it (8-byte bf16 loads, 16-byte fp32 loads: the SASS of one element a thread had 4 scalar
loads in flight, 28 KB an SM, and about 155 instructions an element against a memory budget of
about 165), else one; the elements past the last whole vector go through the one-element kernel.
The arithmetic and the rounding index of every element are the same in both.
*/
#define ADAMW_VECTOR 4

template <int K> struct AdamWLanes;  // K consecutive elements as one load or store
template <> struct AdamWLanes<1> {
    __device__ static void load(const floatX* p, float (&x)[1]) { x[0] = __bfloat162float(*p); }
    __device__ static void load(const float* p, float (&x)[1]) { x[0] = *p; }
    __device__ static void store(float* p, const float (&x)[1]) { *p = x[0]; }
    __device__ static void store(floatX* p, const floatX (&x)[1]) { *p = x[0]; }
    __device__ static void store(uint8_t* p, const uint8_t (&x)[1]) { *p = x[0]; }
};
template <> struct AdamWLanes<4> {
    __device__ static void load(const floatX* p, float (&x)[4]) {
        uint2 bits = *reinterpret_cast<const uint2*>(p);
        x[0] = __uint_as_float(bits.x << 16); x[1] = __uint_as_float(bits.x & 0xffff0000u);
        x[2] = __uint_as_float(bits.y << 16); x[3] = __uint_as_float(bits.y & 0xffff0000u);
    }
    __device__ static void load(const float* p, float (&x)[4]) {
        float4 v = *reinterpret_cast<const float4*>(p);
        x[0] = v.x; x[1] = v.y; x[2] = v.z; x[3] = v.w;
    }
    __device__ static void store(float* p, const float (&x)[4]) { *reinterpret_cast<float4*>(p) = make_float4(x[0], x[1], x[2], x[3]); }
    __device__ static void store(floatX* p, const floatX (&x)[4]) {
        uint32_t b[4];
        for (int k = 0; k < 4; k++) { b[k] = __bfloat16_as_ushort(x[k]); }
        *reinterpret_cast<uint2*>(p) = make_uint2(b[0] | (b[1] << 16), b[2] | (b[3] << 16));
    }
    __device__ static void store(uint8_t* p, const uint8_t (&x)[4]) {
        *reinterpret_cast<uint32_t*>(p) = (uint32_t)x[0] | ((uint32_t)x[1] << 8) | ((uint32_t)x[2] << 16) | ((uint32_t)x[3] << 24);
    }
};

// elements [0, n) of the arrays, K a thread (n a multiple of K)
template <int K>
__global__ void adamw_update_kernel(floatX* params, float* master_params, const floatX* grads, float* m, float* v,
                                    size_t n, AdamWElementParams hp, float grad_scale, uint32_t seed,
                                    uint32_t first_index, Fp8WeightUpdate fp8) {
    typedef AdamWLanes<K> Lanes;
    size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * K;
    Fp8Tally tally = fp8_tally_zero();
    if (i < n) {
        const float fp8_scale = fp8.record != NULL ? fp8_weight_update_scale(fp8) : 1.0f;  // read first, not after the stores
        float grad[K], param[K], m_k[K], v_k[K];
        Lanes::load(grads + i, grad);
        if (master_params != NULL) { Lanes::load(master_params + i, param); } else { Lanes::load(params + i, param); }
        Lanes::load(m + i, m_k);
        Lanes::load(v + i, v_k);
        float new_param[K];
        floatX weight[K];
        uint8_t code[K];
        for (int k = 0; k < K; k++) {
            new_param[k] = adamw_element_update(param[k], grad[k] * grad_scale, &m_k[k], &v_k[k], hp);
            weight[k] = stochastic_round_bf16(new_param[k], seed, first_index + (uint32_t)(i + k));
            if (fp8.record != NULL) {
                code[k] = fp8_weight_update_element(fp8, fp8_scale, master_params != NULL, new_param[k], weight[k], &tally);
            }
        }
        Lanes::store(m + i, m_k);
        Lanes::store(v + i, v_k);
        if (master_params != NULL) { Lanes::store(master_params + i, new_param); }
        Lanes::store(params + i, weight);
        if (fp8.record != NULL && fp8.codes != NULL) { Lanes::store(fp8.codes + i, code); }
    }
    if (fp8.record != NULL) { fp8_tally_commit(tally, fp8.record, true); }  // the same branch in every thread
}

template <int K>
static void adamw_update_launch(floatX* params, float* master_params, const floatX* grads, float* m, float* v, size_t n,
                                AdamWElementParams hp, float grad_scale, uint32_t seed, uint32_t first_index,
                                Fp8WeightUpdate fp8, cudaStream_t stream) {
    const int block_size = 512;
    adamw_update_kernel<K><<<(unsigned int)ceil_div_size(n / K, block_size), block_size, 0, stream>>>(
        params, master_params, grads, m, v, n, hp, grad_scale, seed, first_index, fp8);
    cudaCheck(cudaGetLastError());
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
    const bool aligned = (uintptr_t)params % 8 == 0 && (uintptr_t)grads % 8 == 0 && (uintptr_t)m % 16 == 0 &&
                         (uintptr_t)v % 16 == 0 && (uintptr_t)master_params % 16 == 0 && (uintptr_t)fp8.codes % 4 == 0;
    size_t vectors = aligned ? n / ADAMW_VECTOR * ADAMW_VECTOR : 0;
    if (vectors > 0) {
        adamw_update_launch<ADAMW_VECTOR>(params, master_params, grads, m, v, vectors, hp, grad_scale, seed, first_index,
                                          fp8, stream);
    }
    if (vectors < n) {
        Fp8WeightUpdate tail = fp8;
        if (tail.codes != NULL) { tail.codes += vectors; }
        adamw_update_launch<1>(params + vectors, master_params != NULL ? master_params + vectors : NULL, grads + vectors,
                               m + vectors, v + vectors, n - vectors, hp, grad_scale, seed, first_index + (uint32_t)vectors,
                               tail, stream);
    }
}

#endif // LLMC_ADAMW_CUH
