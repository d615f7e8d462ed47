/*
test_adamw8_gpu.cu: the 8-bit AdamW kernel (llmc/adamw8.cuh) against its host reference
(adamw8_update_bf16_ref in llmc/quant8.h), bit for bit: bf16 weights, fp32 master, m and v
codes, both absmaxes and the FP8 weight outputs (the amax; with the delayed weight cast also
the E4M3 codes, some saturated), over three steps from random states. Sizes: one d12 layer's
fc weight (768 x 3072), an odd size (9999: a short last block and a lane with fewer than
8 elements) and 520 (a last block of one whole lane). With and without the fp32 master; with a
NaN gradient in one block (that block must stay untouched, its codes rewritten with the step's
scale); and adamw8_update_range over
all 16 tensors of a small model, which sends the 32-bit tensors through adamw_update (against
adamw_update_bf16_ref). Each case in both weight scalings. adamw8_update_range as ZeRO calls it
(each rank's window of the states, parts cut per layer slice: offsets and part starts inside a
tensor; 8-bit, mixed and plain AdamW) against the whole model's host step; nothing written past
a tensor whose last lane is short; the launchers' refusals. Runs on a GPU under make gpucheck,
and under cudasim in make test.
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include "llmc/cuda_common.h"
#include "llmc/adamw8.cuh"
#include "test/test_harness.h"
#include "test/test_harness_fork.h"
#include "test/fp8_weight_outputs.cuh"
#include "test/gpu_test_copies.cuh"
#include "llmc/zero.h"

static float uniform01(uint32_t seed, uint32_t index) {
    return ((float)(random_u32(seed, index) >> 8) + 0.5f) / 16777216.0f;
}

static float gaussian(uint32_t seed, uint32_t index) {
    float u1 = uniform01(seed, 2 * index), u2 = uniform01(seed, 2 * index + 1);
    return sqrtf(-2.0f * logf(u1)) * cosf(6.2831853f * u2);
}

static int device_equals(const void* device, const void* host, size_t bytes) {
    void* back = host_copy(device, bytes);
    int same = memcmp(back, host, bytes) == 0;
    free(back);
    return same;
}

// one tensor: host reference state and device copies
typedef struct {
    size_t n, blocks;
    uint16_t *params, *grads;
    float *master, *m_absmax, *v_absmax;
    int8_t* m_codes;
    uint8_t* v_codes;
    floatX *d_params, *d_grads;
    float *d_master, *d_m_absmax, *d_v_absmax;
    int8_t* d_m_codes;
    uint8_t* d_v_codes;
} Case;

static void case_init(Case* c, size_t n, const Quant8Maps* maps) {
    c->n = n;
    c->blocks = ceil_div_size(n, QUANT8_BLOCK);
    c->params = (uint16_t*)mallocCheck(n * 2);
    c->grads = (uint16_t*)mallocCheck(n * 2);
    c->master = (float*)mallocCheck(n * 4);
    c->m_codes = (int8_t*)mallocCheck(n);
    c->v_codes = (uint8_t*)mallocCheck(n);
    c->m_absmax = (float*)mallocCheck(c->blocks * 4);
    c->v_absmax = (float*)mallocCheck(c->blocks * 4);
    float m[QUANT8_BLOCK], v[QUANT8_BLOCK];
    for (size_t b = 0; b < c->blocks; b++) {
        int count = quant8_block_count(n, b);
        for (int k = 0; k < count; k++) {
            uint32_t i = (uint32_t)(b * QUANT8_BLOCK + k);
            float scale = 1e-3f * powf(10.0f, -2.0f * uniform01(3, i));
            m[k] = 0.3f * scale * gaussian(4, i);
            v[k] = scale * scale * (0.5f + uniform01(5, i));
            c->master[i] = 0.02f * gaussian(1, i);
            c->params[i] = float_to_bf16_bits(c->master[i]);
        }
        quant8_quantize_block_signed(m, count, maps, c->m_codes + b * QUANT8_BLOCK, c->m_absmax + b);
        quant8_quantize_block_unsigned(v, count, maps, c->v_codes + b * QUANT8_BLOCK, c->v_absmax + b);
    }
    c->d_params = (floatX*)device_copy(c->params, n * 2);
    c->d_grads = (floatX*)cuda_malloc_checked(n * 2, "grads");
    c->d_master = (float*)device_copy(c->master, n * 4);
    c->d_m_codes = (int8_t*)device_copy(c->m_codes, n);
    c->d_v_codes = (uint8_t*)device_copy(c->v_codes, n);
    c->d_m_absmax = (float*)device_copy(c->m_absmax, c->blocks * 4);
    c->d_v_absmax = (float*)device_copy(c->v_absmax, c->blocks * 4);
}

static void case_free(Case* c) {
    free(c->params); free(c->grads); free(c->master); free(c->m_codes); free(c->v_codes); free(c->m_absmax); free(c->v_absmax);
    void* d[] = {c->d_params, c->d_grads, c->d_master, c->d_m_codes, c->d_v_codes, c->d_m_absmax, c->d_v_absmax};
    for (size_t i = 0; i < sizeof(d) / sizeof(d[0]); i++) { cudaCheck(cudaFree(d[i])); }
}

static void test_kernel(size_t n, int with_master, int nan_block, int delayed, const Quant8Maps* maps, const Quant8Maps* d_maps) {
    Case c;
    case_init(&c, n, maps);
    Fp8WeightOutputs fp8;
    fp8_weight_outputs_init(&fp8, n, delayed, 0.04f);  // the previous step's amax: below the weights' (0.02 * gaussian)
    char mode[64];
    snprintf(mode, sizeof(mode), "%s, %s weights", with_master ? "master" : "bf16 only", delayed ? "delayed" : "current");
    for (int step = 1; step <= 3; step++) {
        for (size_t i = 0; i < n; i++) {
            float g = 1e-3f * gaussian(100 + step, (uint32_t)i);
            if (nan_block >= 0 && i == (size_t)nan_block * QUANT8_BLOCK + 5 && step == 2) { g = NAN; }
            c.grads[i] = float_to_bf16_bits(g);
        }
        cudaCheck(cudaMemcpy(c.d_grads, c.grads, n * 2, cudaMemcpyHostToDevice));
        fp8_weight_outputs_clear(&fp8);
        if (delayed) {  // every step must write every code: the scale here stays the same from step to step, so a
            // code left from the step before (a skipped block's, say) would equal the new one
            cudaCheck(cudaMemset(fp8.d_codes, 0x55, n));
            memset(fp8.codes, 0x55, n);
        }
        AdamWElementParams hp = adamw_element_params(6e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, step);
        uint32_t seed = random_u32(0x5eed, (uint32_t)step);
        float grad_scale = 0.8f;
        Quant8TensorStates d_st = {c.d_m_codes, c.d_v_codes, c.d_m_absmax, c.d_v_absmax};
        adamw8_update(c.d_params, with_master ? c.d_master : NULL, c.d_grads, d_st, n, d_maps, hp, grad_scale, seed, 512,
                      fp8_weight_outputs_device(&fp8, 0), 0);  // as the part of a tensor from its element 512

        uint16_t* before = (uint16_t*)mallocCheck(n * 2);
        memcpy(before, c.params, n * 2);
        Quant8TensorStates st = {c.m_codes, c.v_codes, c.m_absmax, c.v_absmax};
        Fp8WeightRef fp8_ref = fp8_weight_outputs_host(&fp8, 0);
        adamw8_update_bf16_ref(c.params, with_master ? c.master : NULL, c.grads, n, st, maps, hp, grad_scale, seed, 512, &fp8_ref);
        CHECK(device_equals(c.d_params, c.params, n * 2), "n=%zu %s step %d: bf16 weights differ", n, mode, step);
        if (with_master) { CHECK(device_equals(c.d_master, c.master, n * 4), "n=%zu %s step %d: master differs", n, mode, step); }
        CHECK(device_equals(c.d_m_codes, c.m_codes, n) && device_equals(c.d_v_codes, c.v_codes, n),
              "n=%zu %s step %d: m or v codes differ", n, mode, step);
        CHECK(device_equals(c.d_m_absmax, c.m_absmax, c.blocks * 4) && device_equals(c.d_v_absmax, c.v_absmax, c.blocks * 4),
              "n=%zu %s step %d: absmaxes differ", n, mode, step);
        char what[128];
        snprintf(what, sizeof(what), "n=%zu %s step %d", n, mode, step);
        fp8_weight_outputs_check(&fp8, n, what);
        if (nan_block >= 0 && step == 2) {
            size_t start = (size_t)nan_block * QUANT8_BLOCK;
            size_t count = (size_t)quant8_block_count(n, (size_t)nan_block);  // the last block may be short
            CHECK(memcmp(before + start, c.params + start, count * 2) == 0, "n=%zu %s: the NaN block changed", n, mode);
        }
        free(before);
    }
    fp8_weight_outputs_free(&fp8);
    case_free(&c);
}

// all 16 tensors of a small model through adamw8_update_range, 8-bit and 32-bit ones
static void test_update_tensor(Adamw8Selection selection, int delayed, const Quant8Maps* maps, const Quant8Maps* d_maps) {
    GPT2Config cfg = gpt2_config_make(2, 2, 128, 64, 200);  // ln/bias tensors < 4096 per layer: 32-bit by default
    Adamw8Layout layout;
    adamw8_layout_init(&layout, &cfg, selection);
    size_t n = layout.num_parameters;
    uint16_t* params = (uint16_t*)mallocCheck(n * 2);
    uint16_t* grads = (uint16_t*)mallocCheck(n * 2);
    float* master = (float*)mallocCheck(n * 4);
    for (size_t i = 0; i < n; i++) {
        master[i] = 0.02f * gaussian(40, (uint32_t)i);
        params[i] = float_to_bf16_bits(master[i]);
        grads[i] = float_to_bf16_bits(1e-2f * gaussian(41, (uint32_t)i));
    }
    Adamw8States host, device;
    adamw8_states_alloc_host(&host, &layout);
    adamw8_states_alloc_device(&device, &layout);
    floatX* d_params = (floatX*)device_copy(params, n * 2);
    floatX* d_grads = (floatX*)device_copy(grads, n * 2);
    float* d_master = (float*)device_copy(master, n * 4);
    Fp8WeightOutputs fp8;  // every tensor as if it were an FP8 weight, codes at its parameters' offsets
    fp8_weight_outputs_init(&fp8, n, delayed, 0.02f);
    for (int step = 1; step <= 2; step++) {
        for (int t = 0; t < NUM_PARAMETER_TENSORS; t++) {
            AdamWElementParams hp = adamw_element_params(1e-3f, 0.9f, 0.95f, 1e-8f, gpt2_param_is_decayed(t) ? 0.1f : 0.0f, step);
            uint32_t seed = random_u32(7, (uint32_t)(step * 16 + t));
            size_t off = layout.param_offsets[t], count = layout.sizes[t];
            fp8_weight_outputs_clear(&fp8);
            adamw8_update_range(&layout, &device, d_maps, t, 0, count, d_params + off, d_master + off, d_grads + off, hp, 1.0f,
                                seed, fp8_weight_outputs_device(&fp8, off), 0);
            Fp8WeightRef fp8_ref = fp8_weight_outputs_host(&fp8, off);
            if (layout.bits[t] == 8) {
                adamw8_update_bf16_ref(params + off, master + off, grads + off, count, adamw8_tensor_states(&layout, &host, t),
                                       maps, hp, 1.0f, seed, 0, &fp8_ref);
            } else {
                adamw_update_bf16_ref(params + off, master + off, grads + off, host.m32 + layout.fp32_offsets[t],
                                      host.v32 + layout.fp32_offsets[t], count, hp, 1.0f, seed, 0, &fp8_ref);
            }
            char what[128];
            snprintf(what, sizeof(what), "adamw8_update_range (selection %d, %s weights) step %d %s", (int)selection,
                     delayed ? "delayed" : "current", step, PARAM_TENSOR_NAMES[t]);
            fp8_weight_outputs_check(&fp8, count, what);
        }
    }
    fp8_weight_outputs_free(&fp8);
    Adamw8States back;
    adamw8_states_alloc_host(&back, &layout);
    adamw8_states_copy(&back, &device, &layout, cudaMemcpyDeviceToHost);
    int same_states = memcmp(back.m_codes, host.m_codes, layout.num_codes) == 0 &&
                      memcmp(back.v_codes, host.v_codes, layout.num_codes) == 0 &&
                      memcmp(back.m_absmax, host.m_absmax, layout.num_blocks * 4) == 0 &&
                      memcmp(back.v_absmax, host.v_absmax, layout.num_blocks * 4) == 0 &&
                      memcmp(back.m32, host.m32, layout.num_fp32 * 4) == 0 && memcmp(back.v32, host.v32, layout.num_fp32 * 4) == 0;
    CHECK(same_states, "adamw8_update_range (selection %d): device states differ from the host's", (int)selection);
    CHECK(device_equals(d_params, params, n * 2) && device_equals(d_master, master, n * 4),
          "adamw8_update_range (selection %d): weights differ from the host's", (int)selection);
    adamw8_states_free_host(&back);
    adamw8_states_free_host(&host);
    adamw8_states_free_device(&device);
    cudaCheck(cudaFree(d_params));
    cudaCheck(cudaFree(d_grads));
    cudaCheck(cudaFree(d_master));
    free(params); free(grads); free(master);
}

/*
adamw8_update_range as the trainer calls it under ZeRO (gpt2_update): each rank's window of
the states (adamw8_layout_window, arrays that are slices of the model's) and each tensor's
part cut into zero_update_ranges's calls (a matmul weight: one per layer slice, so offset > 0
inside a part, and a part that starts inside a tensor: part_begins > 0). Every rank's device
result, stitched, must be the whole model's host step (whole tensors, first_index 0) bit for
bit: weights, master and all states. The test above only calls offset 0 of whole tensors, so a
range that ignored its offset (codes, absmaxes or fp32 moments of the range's first element),
or a rounding index that left out the offset or the part's start, passed it.
*/
static void test_update_range_windows(Adamw8Selection selection, int num_ranks, const Quant8Maps* maps,
                                      const Quant8Maps* d_maps) {
    GPT2Config cfg = gpt2_config_make(2, 2, 128, 64, 200);
    Adamw8Layout model;
    adamw8_layout_init(&model, &cfg, selection);
    ZeroLayout z;
    zero_layout_init(&z, &cfg, num_ranks);
    size_t n = model.num_parameters;
    uint16_t* params = (uint16_t*)mallocCheck(n * 2);
    uint16_t* grads = (uint16_t*)mallocCheck(n * 2);
    float* master = (float*)mallocCheck(n * 4);
    float* m = (float*)mallocCheck(n * 4);
    float* v = (float*)mallocCheck(n * 4);
    for (size_t i = 0; i < n; i++) {
        master[i] = 0.02f * gaussian(50, (uint32_t)i);
        params[i] = float_to_bf16_bits(master[i]);
        grads[i] = float_to_bf16_bits(1e-2f * gaussian(51, (uint32_t)i));
        float scale = 1e-3f * powf(10.0f, -2.0f * uniform01(52, (uint32_t)i));  // non-zero states: an absmax read at
        m[i] = 0.3f * scale * gaussian(53, (uint32_t)i);                         // the wrong block decodes wrong values
        v[i] = scale * scale * (0.5f + uniform01(54, (uint32_t)i));
    }
    Adamw8States host;
    adamw8_states_alloc_host(&host, &model);
    adamw8_states_from_fp32(&model, maps, m, v, &host);
    floatX* d_params = (floatX*)device_copy(params, n * 2);  // the flat buffers, as every rank holds them
    floatX* d_grads = (floatX*)device_copy(grads, n * 2);
    float* d_master = (float*)device_copy(master, n * 4);    // (each rank's master is its range's: the same slices)
    Adamw8States* windows_host = (Adamw8States*)mallocCheck((size_t)num_ranks * sizeof(Adamw8States));
    Adamw8States* windows_device = (Adamw8States*)mallocCheck((size_t)num_ranks * sizeof(Adamw8States));
    Adamw8Layout* windows = (Adamw8Layout*)mallocCheck((size_t)num_ranks * sizeof(Adamw8Layout));
    for (int r = 0; r < num_ranks; r++) {
        ZeroRange range = zero_rank_range(&z, r);
        adamw8_layout_window(&windows[r], &model, range.begin, range.end);
        Adamw8States slice = {host.m_codes + windows[r].codes_begin, host.v_codes + windows[r].codes_begin,
                              host.m_absmax + windows[r].blocks_begin, host.v_absmax + windows[r].blocks_begin,
                              host.m32 + windows[r].fp32_begin, host.v32 + windows[r].fp32_begin};
        adamw8_states_alloc_device(&windows_device[r], &windows[r]);
        adamw8_states_copy(&windows_device[r], &slice, &windows[r], cudaMemcpyHostToDevice);
        adamw8_states_alloc_host(&windows_host[r], &windows[r]);
    }
    int offset_calls = 0, inner_parts = 0;  // the case must reach both
    for (int step = 1; step <= 2; step++) {
        for (int t = 0; t < NUM_PARAMETER_TENSORS; t++) {
            AdamWElementParams hp = adamw_element_params(1e-3f, 0.9f, 0.95f, 1e-8f, gpt2_param_is_decayed(t) ? 0.1f : 0.0f, step);
            uint32_t seed = random_u32(9, (uint32_t)(step * 16 + t));
            Fp8WeightUpdate none;
            memset(&none, 0, sizeof(none));
            for (int r = 0; r < num_ranks; r++) {
                ZeroUpdateRange ranges[8];
                int count = zero_update_ranges(&z, r, t, ranges);
                size_t part = zero_rank_range(&z, r).begin + windows[r].param_offsets[t];  // flat
                inner_parts += count > 0 && windows[r].part_begins[t] > 0;
                for (int k = 0; k < count; k++) {
                    size_t flat = part + ranges[k].offset;
                    offset_calls += ranges[k].offset > 0;
                    adamw8_update_range(&windows[r], &windows_device[r], d_maps, t, ranges[k].offset, ranges[k].n,
                                        d_params + flat, d_master + flat, d_grads + flat, hp, 1.0f, seed, none, 0);
                }
            }
            size_t off = model.param_offsets[t], size = model.sizes[t];
            if (model.bits[t] == 8) {
                adamw8_update_bf16_ref(params + off, master + off, grads + off, size, adamw8_tensor_states(&model, &host, t), maps,
                                       hp, 1.0f, seed, 0, NULL);
            } else {
                adamw_update_bf16_ref(params + off, master + off, grads + off, host.m32 + model.fp32_offsets[t],
                                      host.v32 + model.fp32_offsets[t], size, hp, 1.0f, seed, 0, NULL);
            }
        }
    }
    CHECK(offset_calls > 0 && inner_parts > 0, "update_range windows (selection %d, N=%d): no call at an offset (%d) or no "
          "part starting inside a tensor (%d)", (int)selection, num_ranks, offset_calls, inner_parts);
    CHECK(device_equals(d_params, params, n * 2) && device_equals(d_master, master, n * 4),
          "update_range windows (selection %d, N=%d): weights differ from the whole model's host step", (int)selection, num_ranks);
    for (int r = 0; r < num_ranks; r++) {
        const Adamw8Layout* w = &windows[r];
        Adamw8States* back = &windows_host[r];
        adamw8_states_copy(back, &windows_device[r], w, cudaMemcpyDeviceToHost);
        int same = memcmp(back->m_codes, host.m_codes + w->codes_begin, w->num_codes) == 0 &&
                   memcmp(back->v_codes, host.v_codes + w->codes_begin, w->num_codes) == 0 &&
                   memcmp(back->m_absmax, host.m_absmax + w->blocks_begin, w->num_blocks * 4) == 0 &&
                   memcmp(back->v_absmax, host.v_absmax + w->blocks_begin, w->num_blocks * 4) == 0 &&
                   memcmp(back->m32, host.m32 + w->fp32_begin, w->num_fp32 * 4) == 0 &&
                   memcmp(back->v32, host.v32 + w->fp32_begin, w->num_fp32 * 4) == 0;
        CHECK(same, "update_range windows (selection %d, N=%d) rank %d: states differ from the whole model's", (int)selection,
              num_ranks, r);
        adamw8_states_free_host(back);
        adamw8_states_free_device(&windows_device[r]);
    }
    free(windows_host); free(windows_device); free(windows);
    adamw8_states_free_host(&host);
    cudaCheck(cudaFree(d_params));
    cudaCheck(cudaFree(d_grads));
    cudaCheck(cudaFree(d_master));
    free(params); free(grads); free(master); free(m); free(v);
}

/*
A tensor whose last lane has fewer than 8 elements (n = 9999 and 3 * 256 + 5), inside larger
device buffers as a part of the trainer's flat arrays is: nothing past element n may change
(bf16 weights, master, m and v codes, absmaxes past the last block, FP8 codes). test_kernel's
n = 9999 compares only the n elements, so a short lane that loaded and stored a whole 8 (its
vector path) wrote past the tensor, into the next one's weights and states, and passed.
*/
static void test_no_write_past_n(size_t n, int with_master, const Quant8Maps* maps, const Quant8Maps* d_maps) {
    const size_t tail = 64, blocks = ceil_div_size(n, QUANT8_BLOCK), total = n + tail;
    Case c;
    case_init(&c, n, maps);  // the host states and values of the first n; the device copies below carry a tail
    uint16_t* params = (uint16_t*)mallocCheck(total * 2);
    float* master = (float*)mallocCheck(total * 4);
    int8_t* m_codes = (int8_t*)mallocCheck(total);
    uint8_t* v_codes = (uint8_t*)mallocCheck(total);
    float* m_absmax = (float*)mallocCheck((blocks + 4) * 4);
    float* v_absmax = (float*)mallocCheck((blocks + 4) * 4);
    uint16_t* grads = (uint16_t*)mallocCheck(total * 2);
    uint8_t* fp8_codes = (uint8_t*)mallocCheck(total);
    for (size_t i = 0; i < total; i++) {  // the tail: another tensor's finite values, so an update there would show
        params[i] = i < n ? c.params[i] : float_to_bf16_bits(0.5f + 1e-3f * (float)(i - n));
        master[i] = i < n ? c.master[i] : 0.5f + 1e-3f * (float)(i - n);
        m_codes[i] = i < n ? c.m_codes[i] : (int8_t)(i % 100);
        v_codes[i] = i < n ? c.v_codes[i] : (uint8_t)(50 + i % 100);
        grads[i] = float_to_bf16_bits(1e-3f * gaussian(300, (uint32_t)i));
        fp8_codes[i] = 0x5a;
    }
    for (size_t b = 0; b < blocks + 4; b++) {
        m_absmax[b] = b < blocks ? c.m_absmax[b] : 1e-3f;
        v_absmax[b] = b < blocks ? c.v_absmax[b] : 1e-6f;
    }
    floatX* d_params = (floatX*)device_copy(params, total * 2);
    floatX* d_grads = (floatX*)device_copy(grads, total * 2);
    float* d_master = (float*)device_copy(master, total * 4);
    int8_t* d_m_codes = (int8_t*)device_copy(m_codes, total);
    uint8_t* d_v_codes = (uint8_t*)device_copy(v_codes, total);
    float* d_m_absmax = (float*)device_copy(m_absmax, (blocks + 4) * 4);
    float* d_v_absmax = (float*)device_copy(v_absmax, (blocks + 4) * 4);
    Fp8WeightOutputs fp8;
    fp8_weight_outputs_init(&fp8, total, 1, 0.04f);
    cudaCheck(cudaMemcpy(fp8_weight_outputs_device(&fp8, 0).codes, fp8_codes, total, cudaMemcpyHostToDevice));
    AdamWElementParams hp = adamw_element_params(6e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 2);
    Quant8TensorStates d_st = {d_m_codes, d_v_codes, d_m_absmax, d_v_absmax};
    adamw8_update(d_params, with_master ? d_master : NULL, d_grads, d_st, n, d_maps, hp, 0.8f, 77u, 0,
                  fp8_weight_outputs_device(&fp8, 0), 0);
    uint16_t* params_back = (uint16_t*)host_copy(d_params, total * 2);
    float* master_back = (float*)host_copy(d_master, total * 4);
    int8_t* m_back = (int8_t*)host_copy(d_m_codes, total);
    uint8_t* v_back = (uint8_t*)host_copy(d_v_codes, total);
    float* ma_back = (float*)host_copy(d_m_absmax, (blocks + 4) * 4);
    float* va_back = (float*)host_copy(d_v_absmax, (blocks + 4) * 4);
    uint8_t* fp8_back = (uint8_t*)host_copy(fp8_weight_outputs_device(&fp8, 0).codes, total);
    int untouched = memcmp(params_back + n, params + n, tail * 2) == 0 && memcmp(master_back + n, master + n, tail * 4) == 0 &&
                    memcmp(m_back + n, m_codes + n, tail) == 0 && memcmp(v_back + n, v_codes + n, tail) == 0 &&
                    memcmp(ma_back + blocks, m_absmax + blocks, 16) == 0 && memcmp(va_back + blocks, v_absmax + blocks, 16) == 0 &&
                    memcmp(fp8_back + n, fp8_codes + n, tail) == 0;
    CHECK(untouched, "n=%zu %s: the step wrote past the tensor's last element", n, with_master ? "master" : "bf16 only");
    CHECK(memcmp(params_back, params, n * 2) != 0, "n=%zu: the step changed nothing (the case is broken)", n);
    free(params_back); free(master_back); free(m_back); free(v_back); free(ma_back); free(va_back); free(fp8_back);
    fp8_weight_outputs_free(&fp8);
    void* d[] = {d_params, d_grads, d_master, d_m_codes, d_v_codes, d_m_absmax, d_v_absmax};
    for (size_t i = 0; i < sizeof(d) / sizeof(d[0]); i++) { cudaCheck(cudaFree(d[i])); }
    free(params); free(master); free(m_codes); free(v_codes); free(m_absmax); free(v_absmax); free(grads); free(fp8_codes);
    case_free(&c);
}

// what adamw8_update and adamw8_update_range refuse, each with one line before any launch: a part
// off the 256-element block grid, a part whose rounding index would pass 2^32 (or start past it), state codes off
// 16-byte alignment (the kernel's uint2 and 128-bit accesses), and a range past the tensor's part
static void test_refusals(const Quant8Maps* d_maps) {
    floatX* params = (floatX*)(uintptr_t)4096;  // never dereferenced: each call dies first
    floatX* grads = (floatX*)(uintptr_t)8192;
    Quant8TensorStates st = {(int8_t*)(uintptr_t)12288, (uint8_t*)(uintptr_t)16384, (float*)(uintptr_t)20480,
                             (float*)(uintptr_t)24576};
    AdamWElementParams hp = adamw_element_params(1e-3f, 0.9f, 0.95f, 1e-8f, 0.0f, 1);
    Fp8WeightUpdate none;
    memset(&none, 0, sizeof(none));
    CHECK_DIES("adamw8_update off the block grid", "off the 256-element block grid",
               adamw8_update(params, NULL, grads, st, 256, d_maps, hp, 1.0f, 1u, 128, none, 0));
    CHECK_DIES("adamw8_update past the 32-bit rounding index", "the rounding index is 32-bit",
               adamw8_update(params, NULL, grads, st, (size_t)UINT32_MAX, d_maps, hp, 1.0f, 1u, 256, none, 0));
    Quant8TensorStates misaligned = st;
    misaligned.m_codes += 8;
    CHECK_DIES("adamw8_update with m codes off 16 bytes", "the m codes",
               adamw8_update(params, NULL, grads, misaligned, 256, d_maps, hp, 1.0f, 1u, 0, none, 0));
    GPT2Config cfg = gpt2_config_make(2, 2, 128, 64, 200);
    Adamw8Layout layout;
    adamw8_layout_init(&layout, &cfg, ADAMW8_SELECT_DEFAULT);
    Adamw8States states;
    memset(&states, 0, sizeof(states));
    CHECK_DIES("adamw8_update_range past the tensor", "whose part has",
               adamw8_update_range(&layout, &states, d_maps, PARAM_FCW, 256, layout.sizes[PARAM_FCW], params, NULL, grads, hp,
                                   1.0f, 1u, none, 0));
    // a part starting past 2^32 within its tensor: refused before the index would wrap to a small one
    layout.part_begins[PARAM_FCW] = (size_t)1 << 32;
    CHECK_DIES("adamw8_update_range from past the 32-bit rounding index", "the rounding index is 32-bit",
               adamw8_update_range(&layout, &states, d_maps, PARAM_FCW, 0, 256, params, NULL, grads, hp, 1.0f, 1u, none, 0));
}

int main(void) {
    Quant8Maps maps;
    quant8_maps_init(&maps);
    Quant8Maps* d_maps = adamw8_maps_upload();
    const size_t d12_fc = (size_t)768 * 3072;
    for (int delayed = 0; delayed < 2; delayed++) {
        test_kernel(d12_fc, 1, -1, delayed, &maps, d_maps);
        test_kernel(d12_fc, 0, -1, delayed, &maps, d_maps);
        test_kernel(9999, 1, 17, delayed, &maps, d_maps);
        test_kernel(9999, 0, 39, delayed, &maps, d_maps);  // the last, short block
        test_update_tensor(ADAMW8_SELECT_DEFAULT, delayed, &maps, d_maps);
        test_update_tensor(ADAMW8_SELECT_ALL, delayed, &maps, d_maps);  // no 32-bit tensors: empty m32/v32
    }
    // a last block of one whole lane (n % 256 == 8): the partial block's launch, its one lane on the vector path
    test_kernel(2 * 256 + 8, 1, -1, 1, &maps, d_maps);
    test_update_range_windows(ADAMW8_SELECT_DEFAULT, 3, &maps, d_maps);
    test_update_range_windows(ADAMW8_SELECT_ALL, 2, &maps, d_maps);
    test_update_range_windows(ADAMW8_SELECT_NONE, 2, &maps, d_maps);  // plain AdamW: matmul weights' fp32 moments at offsets
    test_no_write_past_n(9999, 1, &maps, d_maps);
    test_no_write_past_n(3 * 256 + 5, 0, &maps, d_maps);
    test_refusals(d_maps);
    cudaCheck(cudaFree(d_maps));
    return test_summary("test_adamw8_gpu");
}
