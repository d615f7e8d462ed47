/*
adamw8.cuh: the 8-bit AdamW step (quant8.h) on the GPU, one fused pass per element.

Why: the update is memory-bound, so each element is read and written once: its bf16 gradient,
its m and v codes, its parameter (fp32 master, or the bf16 weight with no master), and the
block's two absmaxes. One warp owns one 256-element quantization block, 8 elements a lane,
so every load is one instruction (16 bytes of bf16 or fp32, 8 bytes of codes) and the block's
new absmax is a warp butterfly max with no shared memory and no atomics: deterministic, and
max is exact, so the codes equal the host reference's bit for bit.
At 16 bytes an element the pass has about 110 instructions an element to spend before it stops
being bound by memory on an H100/H200 (4.8 TB/s against 132 SMs issuing 4 warp instructions a
cycle), and the first version spent about 400: on an H200 it took 1.9 ms at d12 against plain
AdamW's 1.1 ms (doc/adamw8.md). So the instructions are what this file economizes:
- the encode reads a bucket and a decision point, not a binary search (quant8.h: about 12
  instructions and 2 shared-memory reads a value instead of 90 and 10);
- the maps, thresholds and buckets (10.3 KB) are copied into shared memory, 16 bytes a load,
  once per thread block of a grid the GPU holds at once, whose warps stride over the blocks;
- all blocks but a tensor's partial last one run the instantiation with no bounds tests
  (kWholeLanes);
- AdamW's bias corrections are multiplies (element_math.h), and the requantization divides by
  each block's two absmaxes through one reciprocal each (quant8.h's quant8_divisor: the same
  quotients as the division, about 12 instructions an element fewer);
- the new bf16 weights are rounded two at a time from one random hash (rounding_bits), and with
  no inf/NaN test (phase 2 sees only finite values): about 17 instructions an element fewer.
The per-element arithmetic is quant8.h's __host__ __device__ code; the new bf16 weight is
rounded stochastically with rounding_bits(seed, element index counted from the tensor's start),
as llmc/adamw.cuh does, two elements a hash: a lane's first element, first_index (a multiple of
256, checked) plus a multiple of 8, is even. A block whose update is not finite somewhere is not written at all.
The optional FP8 weight outputs (Fp8WeightUpdate, fp8_scaling.cuh; DESIGN.md section 3) are
those of llmc/adamw.cuh, through the same element function (fp8_weight_element): the amax of
the value the cast reads (the master when there is one, else the bf16 weight) and, with the
delayed weight cast, its E4M3 codes, 8 bytes a lane in one store. A skipped block's unchanged
values count too, and their codes are rewritten: this step's codes all share one scale. Each
warp commits its tally once, with one atomic per field (a max and integer counts, so the
result is deterministic).
*/
#ifndef LLMC_ADAMW8_CUH
#define LLMC_ADAMW8_CUH

#include <stdint.h>
#include "cuda_common.h"
#include "cuda_utils.cuh"
#include "element_math.h"
#include "quant8.h"
#include "fp8_scaling.cuh"
#include "adamw.cuh"

#define ADAMW8_WARPS_PER_BLOCK 8
#define ADAMW8_ELEMENTS_PER_LANE (QUANT8_BLOCK / WARP_SIZE)  // 8
#define ADAMW8_MIN_BLOCKS 4  // per SM: at most 64 registers, so 4 blocks (32 warps) fit an SM

/*
One quantization block's step, by one warp. kWholeLanes: each lane's 8 elements are all in the
tensor (every block but a tensor's last, partial one), so the element loops have no bounds to
test and every load and store is one vector instruction. The block's FP8 weight outputs go
into the lane's tally.
*/
template <bool kWholeLanes>
__device__ __forceinline__ void adamw8_update_block(size_t block, floatX* params, float* master, const floatX* grads,
                                                    Quant8TensorStates st, size_t n, const Quant8Maps* maps,
                                                    AdamWElementParams hp, float grad_scale, uint32_t seed,
                                                    uint32_t first_index, Fp8WeightUpdate fp8, float fp8_scale,
                                                    Fp8Tally* tally) {
    const int lane = threadIdx.x % WARP_SIZE;
    const size_t start = block * QUANT8_BLOCK + (size_t)lane * ADAMW8_ELEMENTS_PER_LANE;
    const int count = kWholeLanes ? ADAMW8_ELEMENTS_PER_LANE
                                  : (start >= n ? 0 : (n - start < ADAMW8_ELEMENTS_PER_LANE ? (int)(n - start) : ADAMW8_ELEMENTS_PER_LANE));
    const bool vector = count == ADAMW8_ELEMENTS_PER_LANE;

    // load: 8 elements per lane, one instruction per array when the lane's 8 are all in the tensor
    // (a partial lane's params past its count are 0: the bf16 rounding takes elements in pairs)
    float param[ADAMW8_ELEMENTS_PER_LANE] = {}, grad[ADAMW8_ELEMENTS_PER_LANE];
    int8_t m_code[ADAMW8_ELEMENTS_PER_LANE];
    uint8_t v_code[ADAMW8_ELEMENTS_PER_LANE];
    if (vector) {
        x128 g = load128cs(grads + start);
        uint2 mc = *reinterpret_cast<const uint2*>(st.m_codes + start);
        uint2 vc = *reinterpret_cast<const uint2*>(st.v_codes + start);
        memcpy(m_code, &mc, sizeof(mc));
        memcpy(v_code, &vc, sizeof(vc));
        if (master != NULL) {
            f128 lo = load128cs(master + start), hi = load128cs(master + start + 4);
            for (int k = 0; k < 4; k++) { param[k] = lo[k]; param[4 + k] = hi[k]; }
        } else {
            x128 p = load128cs(params + start);
            #pragma unroll
            for (int k = 0; k < ADAMW8_ELEMENTS_PER_LANE; k++) { param[k] = x128_float(p, k); }
        }
        for (int k = 0; k < ADAMW8_ELEMENTS_PER_LANE; k++) { grad[k] = x128_float(g, k); }
    } else {
        #pragma unroll
        for (int k = 0; k < ADAMW8_ELEMENTS_PER_LANE; k++) {
            if (k >= count) { break; }
            grad[k] = __bfloat162float(grads[start + k]);
            m_code[k] = st.m_codes[start + k];
            v_code[k] = st.v_codes[start + k];
            param[k] = master != NULL ? master[start + k] : __bfloat162float(params[start + k]);
        }
    }

    // phase 1: dequantize, fp32 AdamW; the block's new absmaxes and whether all is finite
    const float m_absmax_old = st.m_absmax[block], v_absmax_old = st.v_absmax[block];
    float m[ADAMW8_ELEMENTS_PER_LANE], v[ADAMW8_ELEMENTS_PER_LANE];
    float m_max = 0.0f, v_max = 0.0f;
    int finite = 1;
    #pragma unroll
    for (int k = 0; k < ADAMW8_ELEMENTS_PER_LANE; k++) {
        if (k >= count) { break; }
        param[k] = adamw8_element_update(param[k], grad[k] * grad_scale, m_code[k], v_code[k], m_absmax_old, v_absmax_old,
                                         maps, hp, &m[k], &v[k]);
        finite = finite && adamw8_element_is_finite(param[k], m[k], v[k]);
        m_max = fmaxf(m_max, fabsf(m[k]));
        v_max = fmaxf(v_max, fabsf(v[k]));
    }
    uint8_t fp8_code[ADAMW8_ELEMENTS_PER_LANE];
    if (!__all_sync(0xffffffffu, finite)) {  // leave the whole block as it was; its FP8 side still counts
        if (fp8.record != NULL) {
            #pragma unroll
            for (int k = 0; k < ADAMW8_ELEMENTS_PER_LANE; k++) {
                if (k >= count) { break; }
                float old_master = master != NULL ? master[start + k] : 0.0f;
                fp8_code[k] = fp8_weight_update_element(fp8, fp8_scale, master != NULL, old_master, params[start + k], tally);
                if (fp8.codes != NULL) { fp8.codes[start + k] = fp8_code[k]; }
            }
        }
        return;
    }
    m_max = warp_reduce_max(m_max);
    v_max = warp_reduce_max(v_max);

    // phase 2: requantize with the new absmaxes (a reciprocal each, quant8_divisor), write the parameter (and its FP8 side)
    const Quant8Divisor m_divisor = quant8_divisor(m_max), v_divisor = quant8_divisor(v_max);
    #pragma unroll
    for (int k = 0; k < ADAMW8_ELEMENTS_PER_LANE; k++) {
        if (k >= count) { break; }
        m_code[k] = quant8_encode_signed(m[k], m_divisor, maps);
        v_code[k] = quant8_encode_unsigned(v[k], v_divisor, maps);
    }
    floatX weight[ADAMW8_ELEMENTS_PER_LANE];
    #pragma unroll
    for (int k = 0; k < ADAMW8_ELEMENTS_PER_LANE; k += 2) {  // two weights a hash: a lane's first index is even (above)
        if (k >= count) { break; }
        stochastic_round_bf16_pair(param[k], param[k + 1], seed, first_index + (uint32_t)(start + k), &weight[k],
                                   &weight[k + 1]);
        if (fp8.record != NULL) {
            for (int j = k; j < k + 2 && j < count; j++) {
                fp8_code[j] = fp8_weight_update_element(fp8, fp8_scale, master != NULL, param[j], weight[j], tally);
            }
        }
    }
    if (vector) {
        uint2 mc, vc;
        memcpy(&mc, m_code, sizeof(mc));
        memcpy(&vc, v_code, sizeof(vc));
        *reinterpret_cast<uint2*>(st.m_codes + start) = mc;
        *reinterpret_cast<uint2*>(st.v_codes + start) = vc;
        if (master != NULL) {
            f128 lo, hi;
            for (int k = 0; k < 4; k++) { lo[k] = param[k]; hi[k] = param[4 + k]; }
            store128(master + start, lo);
            store128(master + start + 4, hi);
        }
        x128 p;
        for (int k = 0; k < ADAMW8_ELEMENTS_PER_LANE; k++) { p[k] = weight[k]; }
        store128(params + start, p);
        if (fp8.codes != NULL) {
            uint2 codes;
            memcpy(&codes, fp8_code, sizeof(codes));
            *reinterpret_cast<uint2*>(fp8.codes + start) = codes;
        }
    } else {
        #pragma unroll
        for (int k = 0; k < ADAMW8_ELEMENTS_PER_LANE; k++) {
            if (k >= count) { break; }
            st.m_codes[start + k] = m_code[k];
            st.v_codes[start + k] = v_code[k];
            if (master != NULL) { master[start + k] = param[k]; }
            params[start + k] = weight[k];
            if (fp8.codes != NULL) { fp8.codes[start + k] = fp8_code[k]; }
        }
    }
    if (lane == 0) {
        st.m_absmax[block] = m_max;
        st.v_absmax[block] = v_max;
    }
}

/*
The block's copy of the maps (10.3 KB) into shared memory (`words`, 16-byte aligned as a uint4
array is; the maps copy is what the kernel reads), from global memory (cudaMalloc's, 256-byte
aligned), by the block's ADAMW8_WARPS_PER_BLOCK warps (adamw8_update launches no other size):
16 bytes a load, every load of a thread issued before its first store, so the block waits out
one global-memory latency at the launch's start, not one per 4-byte word (11 of them).
*/
#define ADAMW8_MAPS_WORDS ((sizeof(Quant8Maps) + sizeof(uint4) - 1) / sizeof(uint4))
__device__ __forceinline__ const Quant8Maps* adamw8_copy_maps(uint4* words, const Quant8Maps* maps) {
    static_assert(sizeof(Quant8Maps) % sizeof(uint32_t) == 0, "the maps' tail is copied in 4-byte words");
    constexpr int vectors = (int)(sizeof(Quant8Maps) / sizeof(uint4));  // whole ones; a 4-byte-word tail follows
    constexpr int threads = ADAMW8_WARPS_PER_BLOCK * WARP_SIZE;
    constexpr int per_thread = (vectors + threads - 1) / threads;
    uint4 loaded[per_thread];
    #pragma unroll
    for (int k = 0; k < per_thread; k++) {
        int i = threadIdx.x + k * threads;
        if (i < vectors) { loaded[k] = reinterpret_cast<const uint4*>(maps)[i]; }
    }
    #pragma unroll
    for (int k = 0; k < per_thread; k++) {
        int i = threadIdx.x + k * threads;
        if (i < vectors) { words[i] = loaded[k]; }
    }
    constexpr int tail_words = (int)((sizeof(Quant8Maps) % sizeof(uint4)) / sizeof(uint32_t));
    if ((int)threadIdx.x < tail_words) {
        const int word = vectors * (int)(sizeof(uint4) / sizeof(uint32_t)) + (int)threadIdx.x;
        reinterpret_cast<uint32_t*>(words)[word] = reinterpret_cast<const uint32_t*>(maps)[word];
    }
    __syncthreads();
    return reinterpret_cast<const Quant8Maps*>(words);
}

/*
Quantization blocks [first_block, end_block) of the tensor, each by one warp, the warps of the
grid striding over them: the grid is what the GPU holds at once, so each thread block copies
the maps into shared memory once per launch, not once per 8 blocks. Each warp commits its FP8
tally once, at the end. The kernel's whole body, so that dev/bench/adamw8_sass_probe.cu can
build it for one case alone.
*/
template <bool kWholeLanes>
__device__ __forceinline__ void adamw8_update_blocks(floatX* params, float* master, const floatX* grads,
                                                     Quant8TensorStates st, size_t n, size_t first_block,
                                                     size_t end_block, const Quant8Maps* maps, AdamWElementParams hp,
                                                     float grad_scale, uint32_t seed, uint32_t first_index,
                                                     Fp8WeightUpdate fp8) {
    __shared__ uint4 maps_words[ADAMW8_MAPS_WORDS];
    const Quant8Maps* shared_maps = adamw8_copy_maps(maps_words, maps);
    const float fp8_scale = fp8_weight_update_scale(fp8);
    Fp8Tally tally = fp8_tally_zero();
    const size_t warps = (size_t)gridDim.x * (blockDim.x / WARP_SIZE);
    for (size_t block = first_block + (size_t)blockIdx.x * (blockDim.x / WARP_SIZE) + threadIdx.x / WARP_SIZE;
         block < end_block; block += warps) {  // the same for a warp's lanes: no warp-wide op below misses one
        adamw8_update_block<kWholeLanes>(block, params, master, grads, st, n, shared_maps, hp, grad_scale, seed,
                                         first_index, fp8, fp8_scale, &tally);
    }
    if (fp8.record != NULL) { fp8_tally_commit_warp(tally, fp8.record, true); }
}

template <bool kWholeLanes>  // the partial block's launch is one thread block: no occupancy to keep, room not to spill
__global__ void __launch_bounds__(ADAMW8_WARPS_PER_BLOCK * WARP_SIZE, kWholeLanes ? ADAMW8_MIN_BLOCKS : 1)
adamw8_update_kernel(floatX* params, float* master, const floatX* grads, Quant8TensorStates st, size_t n,
                     size_t first_block, size_t end_block, const Quant8Maps* maps, AdamWElementParams hp,
                     float grad_scale, uint32_t seed, uint32_t first_index, Fp8WeightUpdate fp8) {
    adamw8_update_blocks<kWholeLanes>(params, master, grads, st, n, first_block, end_block, maps, hp, grad_scale, seed,
                                      first_index, fp8);
}

static inline void adamw8_check_aligned_(const void* ptr, const char* what) {
    if (ptr != NULL && ((uintptr_t)ptr % 16) != 0) {
        llm8_die("adamw8_update: %s at %p is not 16-byte aligned (tensor offsets must be multiples of 8 elements)", what, ptr);
    }
}

/*
One 8-bit AdamW step of n elements of a tensor, starting at its element first_index (a
multiple of 256: a ZeRO rank's part). master may be NULL (the bf16 weights are the
parameters); fp8: the FP8 weight outputs (see above; zeroed: none), codes pointing at this
run's first element; the record's amax_bits takes a max over the weight's calls (the state
update after them clears it). params, grads, master and the state codes must be 16-byte aligned, the FP8 codes 8-byte aligned, and
the state slice must start on a 256-element block (adamw8_layout_window cuts them so; checked below).
*/
void adamw8_update(floatX* params, float* master, const floatX* grads, Quant8TensorStates st, size_t n,
                   const Quant8Maps* maps_device, AdamWElementParams hp, float grad_scale, uint32_t seed,
                   uint32_t first_index, Fp8WeightUpdate fp8, cudaStream_t stream) {
    if (n > (size_t)UINT32_MAX - first_index) {
        llm8_die("adamw8_update: %zu elements from element %u of a tensor; the rounding index is 32-bit", n, first_index);
    }
    if (first_index % QUANT8_BLOCK != 0) {
        llm8_die("adamw8_update: a part starting at element %u is off the %d-element block grid", first_index, QUANT8_BLOCK);
    }
    if (n == 0) { return; }
    adamw8_check_aligned_(params, "the bf16 weights");
    adamw8_check_aligned_(grads, "the gradients");
    adamw8_check_aligned_(master, "the fp32 master weights");
    adamw8_check_aligned_(st.m_codes, "the m codes");
    adamw8_check_aligned_(st.v_codes, "the v codes");
    if (((uintptr_t)fp8.codes) % 8 != 0) {
        llm8_die("adamw8_update: the FP8 weight codes at %p are not 8-byte aligned", (void*)fp8.codes);
    }
    // the whole blocks by a grid the device holds at once, then a partial last block by one warp
    const size_t whole_blocks = n / QUANT8_BLOCK;
    const unsigned int threads = ADAMW8_WARPS_PER_BLOCK * WARP_SIZE;
    if (whole_blocks > 0) {
        size_t grid = ceil_div_size(whole_blocks, ADAMW8_WARPS_PER_BLOCK);
        unsigned int resident = (unsigned int)(device_sm_count() * ADAMW8_MIN_BLOCKS);  // the blocks the GPU holds at once
        adamw8_update_kernel<true><<<grid < resident ? (unsigned int)grid : resident, threads, 0, stream>>>(
            params, master, grads, st, n, 0, whole_blocks, maps_device, hp, grad_scale, seed, first_index, fp8);
    }
    if (n % QUANT8_BLOCK != 0) {
        adamw8_update_kernel<false><<<1, threads, 0, stream>>>(params, master, grads, st, n, whole_blocks, whole_blocks + 1,
                                                               maps_device, hp, grad_scale, seed, first_index, fp8);
    }
    cudaCheck(cudaGetLastError());
}

// ----------------------------------------------------------------------------
// the whole model's states on the device

// the generated maps, on the device
static Quant8Maps* adamw8_maps_upload(void) {
    Quant8Maps host;
    quant8_maps_init(&host);
    Quant8Maps* device = (Quant8Maps*)cuda_malloc_checked(sizeof(Quant8Maps), "adamw8 quantization maps");
    cudaCheck(cudaMemcpy(device, &host, sizeof(Quant8Maps), cudaMemcpyHostToDevice));
    return device;
}

// a zeroed device buffer (none for 0 bytes: e.g. no 32-bit tensors with -qs all)
static void* adamw8_device_zeros_(size_t bytes, const char* what) {
    if (bytes == 0) { return NULL; }
    void* ptr = cuda_malloc_checked(bytes, what);
    cudaCheck(cudaMemset(ptr, 0, bytes));
    return ptr;
}

static void adamw8_copy_(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
    if (bytes > 0) { cudaCheck(cudaMemcpy(dst, src, bytes, kind)); }
}

// zeroed device states (every moment 0)
static void adamw8_states_alloc_device(Adamw8States* states, const Adamw8Layout* layout) {
    states->m_codes = (int8_t*)adamw8_device_zeros_(layout->num_codes, "adamw8 m (8-bit)");
    states->v_codes = (uint8_t*)adamw8_device_zeros_(layout->num_codes, "adamw8 v (8-bit)");
    states->m_absmax = (float*)adamw8_device_zeros_(layout->num_blocks * sizeof(float), "adamw8 m absmax");
    states->v_absmax = (float*)adamw8_device_zeros_(layout->num_blocks * sizeof(float), "adamw8 v absmax");
    states->m32 = (float*)adamw8_device_zeros_(layout->num_fp32 * sizeof(float), "adamw8 m (32-bit tensors)");
    states->v32 = (float*)adamw8_device_zeros_(layout->num_fp32 * sizeof(float), "adamw8 v (32-bit tensors)");
}

static void adamw8_states_free_device(Adamw8States* states) {
    void* buffers[] = {states->m_codes, states->v_codes, states->m_absmax, states->v_absmax, states->m32, states->v32};
    for (size_t i = 0; i < sizeof(buffers) / sizeof(buffers[0]); i++) {
        if (buffers[i] != NULL) { cudaCheck(cudaFree(buffers[i])); }
    }
    memset(states, 0, sizeof(*states));
}

// copies every state array between host and device (kind: cudaMemcpyHostToDevice or DeviceToHost)
static void adamw8_states_copy(Adamw8States* dst, const Adamw8States* src, const Adamw8Layout* layout, cudaMemcpyKind kind) {
    adamw8_copy_(dst->m_codes, src->m_codes, layout->num_codes, kind);
    adamw8_copy_(dst->v_codes, src->v_codes, layout->num_codes, kind);
    adamw8_copy_(dst->m_absmax, src->m_absmax, layout->num_blocks * sizeof(float), kind);
    adamw8_copy_(dst->v_absmax, src->v_absmax, layout->num_blocks * sizeof(float), kind);
    adamw8_copy_(dst->m32, src->m32, layout->num_fp32 * sizeof(float), kind);
    adamw8_copy_(dst->v32, src->v32, layout->num_fp32 * sizeof(float), kind);
}

/*
The step of elements [offset, offset + n) of tensor t's part in `layout` (the whole model's
layout, or a ZeRO rank's window: adamw8_layout_window): 8-bit tensors through adamw8_update
(offset a multiple of 256), 32-bit ones through adamw_update on the layout's m32/v32. Plain
AdamW is the layout with no 8-bit tensor. params, master (nullable) and grads point at the
range's first element; fp8 gets the range's FP8 weight outputs (its codes pointer also at the
range's first element; zeroed: none). Callers split a tensor into ranges where each FP8 weight
(one layer's slice) needs its own.
*/
static void adamw8_update_range(const Adamw8Layout* layout, const Adamw8States* states, const Quant8Maps* maps_device,
                                int tensor, size_t offset, size_t n, floatX* params, float* master, const floatX* grads,
                                AdamWElementParams hp, float grad_scale, uint32_t seed, Fp8WeightUpdate fp8,
                                cudaStream_t stream) {
    if (offset + n > layout->sizes[tensor]) {
        llm8_die("adamw8_update_range: elements %zu..%zu of %s, whose part has %zu", offset, offset + n,
                 PARAM_TENSOR_NAMES[tensor], layout->sizes[tensor]);
    }
    const size_t first = layout->part_begins[tensor] + offset;  // the range's first element within its tensor
    if (first > (size_t)UINT32_MAX || n > (size_t)UINT32_MAX - first) {
        llm8_die("adamw8_update_range: elements %zu..%zu of %s; the rounding index is 32-bit", first, first + n,
                 PARAM_TENSOR_NAMES[tensor]);
    }
    const uint32_t first_index = (uint32_t)first;
    if (layout->bits[tensor] == 8) {
        Quant8TensorStates st = adamw8_tensor_states(layout, states, tensor);
        st.m_codes += offset;
        st.v_codes += offset;
        st.m_absmax += offset / QUANT8_BLOCK;
        st.v_absmax += offset / QUANT8_BLOCK;
        adamw8_update(params, master, grads, st, n, maps_device, hp, grad_scale, seed, first_index, fp8, stream);
    } else {
        size_t at = layout->fp32_offsets[tensor] + offset;
        adamw_update(params, master, grads, states->m32 + at, states->v32 + at, n, hp, grad_scale, seed, first_index,
                     fp8, stream);
    }
}

#endif // LLMC_ADAMW8_CUH
