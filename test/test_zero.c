// test_zero.c: the ZeRO shard layout (llmc/zero.h) with simulated ranks, on the CPU.
#include <stdlib.h>
#include "llmc/zero.h"
#include "llmc/train_config.h"
#include "test/test_harness.h"
#include "test/test_harness_fork.h"

static const int RANK_COUNTS[] = {1, 2, 3, 8};
#define NUM_RANK_COUNTS (int)(sizeof(RANK_COUNTS) / sizeof(RANK_COUNTS[0]))

static int compare_pieces_by_begin(const void* a, const void* b) {
    size_t x = ((const ZeroPiece*)a)->begin, y = ((const ZeroPiece*)b)->begin;
    return x < y ? -1 : (x > y ? 1 : 0);
}

// shard size, padding, contiguity and 256-alignment of the rank ranges
static void test_rank_ranges(const ZeroLayout* z, const char* name) {
    int n = z->num_ranks;
    CHECK(z->shard_size % ZERO_ALIGN == 0, "%s N=%d: shard %zu not a multiple of 256", name, n, z->shard_size);
    CHECK(z->padded_total == z->shard_size * (size_t)n, "%s N=%d: padded total %zu", name, n, z->padded_total);
    CHECK(z->padded_total >= z->num_parameters, "%s N=%d: padded total below the parameter count", name, n);
    CHECK(z->padded_total - z->num_parameters < (size_t)n * ZERO_ALIGN,
          "%s N=%d: padding %zu is not minimal (a smaller 256-multiple shard would do)", name, n,
          z->padded_total - z->num_parameters);
    size_t expected_begin = 0;
    for (int r = 0; r < n; r++) {
        ZeroRange range = zero_rank_range(z, r);
        CHECK(range.begin == expected_begin, "%s N=%d rank %d: begins at %zu, expected %zu", name, n, r, range.begin,
              expected_begin);
        CHECK(range.begin == z->num_parameters || range.begin % ZERO_ALIGN == 0,
              "%s N=%d rank %d: boundary %zu not a multiple of 256", name, n, r, range.begin);
        CHECK(range.end - range.begin <= z->shard_size, "%s N=%d rank %d: owns more than a shard", name, n, r);
        if (range.end > range.begin) {
            CHECK(zero_owner(z, range.begin) == r && zero_owner(z, range.end - 1) == r,
                  "%s N=%d rank %d: zero_owner disagrees with the range", name, n, r);
        }
        expected_begin = range.end;
    }
    CHECK(expected_begin == z->num_parameters, "%s N=%d: ranges end at %zu of %zu", name, n, expected_begin,
          z->num_parameters);
}

// per-tensor parts tile each tensor in rank order, with consistent shard offsets
static void test_tensor_parts(const ZeroLayout* z, const GPT2Config* cfg, const char* name) {
    int n = z->num_ranks;
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        size_t covered = 0;
        int all_aligned = 1;
        for (int r = 0; r < n; r++) {
            ZeroPart part;
            if (!zero_tensor_part(z, r, i, &part)) { continue; }
            CHECK(part.begin == covered, "%s N=%d %s rank %d: part begins at %zu, expected %zu", name, n,
                  PARAM_TENSOR_NAMES[i], r, part.begin, covered);
            CHECK(part.end > part.begin && part.end <= z->tensor_sizes[i], "%s N=%d %s rank %d: bad part end %zu",
                  name, n, PARAM_TENSOR_NAMES[i], r, part.end);
            CHECK(z->tensor_offsets[i] + part.begin == (size_t)r * z->shard_size + part.shard_offset &&
                  part.shard_offset + (part.end - part.begin) <= z->shard_size,
                  "%s N=%d %s rank %d: shard offset %zu inconsistent", name, n, PARAM_TENSOR_NAMES[i], r,
                  part.shard_offset);
            CHECK(part.block_aligned == (part.begin % QUANT8_BLOCK == 0), "%s N=%d %s rank %d: block_aligned wrong",
                  name, n, PARAM_TENSOR_NAMES[i], r);
            all_aligned = all_aligned && part.block_aligned;
            covered = part.end;
        }
        CHECK(covered == z->tensor_sizes[i], "%s N=%d %s: parts cover %zu of %zu", name, n, PARAM_TENSOR_NAMES[i],
              covered, z->tensor_sizes[i]);
        // what the 8-bit optimizer relies on: its tensors' parts start on their own block grid
        if (adamw8_tensor_is_8bit(cfg, i, ADAMW8_SELECT_DEFAULT) || cfg->channels % 256 == 0) {
            CHECK(all_aligned, "%s N=%d %s: a rank's part starts inside an 8-bit block", name, n,
                  PARAM_TENSOR_NAMES[i]);
        }
    }
}

// the per-layer reduction chunks cover every gradient element exactly once, each piece in its owner's range
static void test_chunks(const ZeroLayout* z, const char* name) {
    int n = z->num_ranks;
    int max_pieces = zero_chunk_max_pieces(z);
    int num_chunks = zero_num_chunks(z);
    ZeroPiece* all = (ZeroPiece*)mallocCheck((size_t)num_chunks * max_pieces * sizeof(ZeroPiece));
    int total_pieces = 0;
    for (int c = 0; c < num_chunks; c++) {
        int count = zero_chunk_pieces(z, c, all + total_pieces);
        CHECK(count > 0 && count <= max_pieces, "%s N=%d chunk %d: %d pieces (max %d)", name, n, c, count, max_pieces);
        size_t by_rank = 0;
        for (int r = 0; r < n; r++) { by_rank += zero_chunk_elements(z, c, r); }
        CHECK(by_rank == zero_chunk_elements(z, c, -1), "%s N=%d chunk %d: per-rank sizes sum to %zu, not %zu", name,
              n, c, by_rank, zero_chunk_elements(z, c, -1));
        for (int p = total_pieces; p < total_pieces + count; p++) {
            ZeroRange owner = zero_rank_range(z, all[p].owner);
            CHECK(all[p].begin >= owner.begin && all[p].end <= owner.end && all[p].begin < all[p].end,
                  "%s N=%d chunk %d: piece [%zu, %zu) outside its owner %d's range", name, n, c, all[p].begin,
                  all[p].end, all[p].owner);
            CHECK((all[p].layer == c) == (c < z->num_layers), "%s N=%d chunk %d: piece of layer %d", name, n, c,
                  all[p].layer);
        }
        total_pieces += count;
    }
    qsort(all, (size_t)total_pieces, sizeof(ZeroPiece), compare_pieces_by_begin);
    size_t expected = 0;
    int gaps = 0;
    for (int p = 0; p < total_pieces; p++) {
        gaps += all[p].begin != expected;
        expected = all[p].end;
    }
    CHECK(gaps == 0 && expected == z->num_parameters, "%s N=%d: chunks leave %d gaps/overlaps, end at %zu of %zu",
          name, n, gaps, expected, z->num_parameters);
    free(all);
}

// element by element on a small model: every element owned by exactly one rank, once per chunk walk
static void test_element_ownership(const GPT2Config* cfg, int num_ranks) {
    ZeroLayout z;
    zero_layout_init(&z, cfg, num_ranks);
    unsigned char* seen = (unsigned char*)mallocCheck(z.num_parameters);
    memset(seen, 0, z.num_parameters);
    for (int r = 0; r < num_ranks; r++) {
        for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
            ZeroPart part;
            if (!zero_tensor_part(&z, r, i, &part)) { continue; }
            for (size_t j = part.begin; j < part.end; j++) { seen[z.tensor_offsets[i] + j]++; }
        }
    }
    size_t wrong = 0;
    for (size_t j = 0; j < z.num_parameters; j++) { wrong += seen[j] != 1; }
    CHECK(wrong == 0, "tiny N=%d: %zu elements not owned exactly once", num_ranks, wrong);
    free(seen);
}

// random weights whose slices have very different magnitudes, so a wrong scale shows
static void fill_weights(float* params, const ZeroLayout* z, uint32_t seed) {
    mt19937_state rng;
    manual_seed(&rng, seed);
    normal_(params, z->num_parameters, 0.0f, 0.02f, &rng);
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        int per_layer = zero_tensor_is_per_layer(i);
        for (int l = 0; l < (per_layer ? z->num_layers : 1); l++) {
            ZeroRange slice = zero_slice_range(z, i, per_layer ? l : -1);
            float magnitude = ldexpf(1.0f, (int)(randint32(&rng) % 24) - 12);
            for (size_t j = slice.begin; j < slice.end; j++) { params[j] *= magnitude; }
        }
    }
}

/*
The FP8 weight gather with N simulated ranks against one rank computing each slice's amax,
scale and cast over the whole slice: codes and scales bit for bit. And the negative control:
casting with each rank's LOCAL amax (no all-reduce) differs, so the test sees the MAX step.
*/
static void test_fp8_gather(const GPT2Config* cfg, Fp8Format format, int margin) {
    ZeroLayout single;
    zero_layout_init(&single, cfg, 1);
    float* params = (float*)mallocCheck(single.num_parameters * sizeof(float));
    fill_weights(params, &single, 1234u + (uint32_t)format * 7u + (uint32_t)margin);
    ZeroPiece* slices = (ZeroPiece*)mallocCheck((size_t)ZERO_MATMUL_KINDS * cfg->num_layers * sizeof(ZeroPiece));
    int num_slices = zero_fp8_weight_slices(&single, slices);
    CHECK(num_slices == ZERO_MATMUL_KINDS * cfg->num_layers, "%d FP8 weight slices", num_slices);
    float* ref_scales = (float*)mallocCheck((size_t)num_slices * sizeof(float));
    uint8_t* ref_codes = (uint8_t*)mallocCheck(single.num_parameters);
    memset(ref_codes, 0, single.num_parameters);
    for (int s = 0; s < num_slices; s++) {
        float amax = 0.0f;
        for (size_t j = slices[s].begin; j < slices[s].end; j++) { amax = fmaxf(amax, fabsf(params[j])); }
        ref_scales[s] = fp8_scale_from_amax(amax, fp8_max(format), margin);
        for (size_t j = slices[s].begin; j < slices[s].end; j++) { ref_codes[j] = fp8_quantize(params[j], ref_scales[s], format); }
    }
    float* scales = (float*)mallocCheck((size_t)num_slices * sizeof(float));
    uint8_t* codes = (uint8_t*)mallocCheck(single.num_parameters);
    for (int k = 0; k < NUM_RANK_COUNTS; k++) {
        ZeroLayout z;
        zero_layout_init(&z, cfg, RANK_COUNTS[k]);
        memset(codes, 0, z.num_parameters);
        zero_simulate_fp8_weight_gather(&z, params, slices, num_slices, format, margin, scales, codes);
        int scale_mismatch = 0;
        for (int s = 0; s < num_slices; s++) { scale_mismatch += float_as_bits(scales[s]) != float_as_bits(ref_scales[s]); }
        CHECK(scale_mismatch == 0, "%s margin %d N=%d: %d slice scales differ from the single-rank scales",
              fp8_format_name(format), margin, RANK_COUNTS[k], scale_mismatch);
        CHECK(memcmp(codes, ref_codes, z.num_parameters) == 0,
              "%s margin %d N=%d: gathered FP8 codes differ from the single-rank cast", fp8_format_name(format), margin,
              RANK_COUNTS[k]);
        if (RANK_COUNTS[k] > 1) {
            // negative control: rank-local scales change some code where a slice spans two ranks
            size_t differing = 0;
            for (int r = 0; r < z.num_ranks; r++) {
                ZeroRange range = zero_rank_range(&z, r);
                for (int s = 0; s < num_slices; s++) {
                    size_t begin = slices[s].begin > range.begin ? slices[s].begin : range.begin;
                    size_t end = slices[s].end < range.end ? slices[s].end : range.end;
                    if (begin >= end) { continue; }
                    float local_scale = fp8_scale_from_amax(zero_range_amax(params, begin, end), fp8_max(format), margin);
                    for (size_t j = begin; j < end; j++) { differing += fp8_quantize(params[j], local_scale, format) != ref_codes[j]; }
                }
            }
            CHECK(differing > 0, "%s N=%d: rank-local scales gave the same codes (the test cannot see the all-reduce)",
                  fp8_format_name(format), RANK_COUNTS[k]);
        }
    }
    free(params); free(slices); free(ref_scales); free(ref_codes); free(scales); free(codes);
}

// ----------------------------------------------------------------------------
// the sharded optimizer step: each simulated rank updates its window, split as the trainer
// splits it (zero_update_ranges), against one whole-model step: bit for bit, the FP8 weight
// amaxes (all-reduced) and the delayed weight cast's codes (each rank's parts) included

typedef struct {
    uint16_t* params;
    float* master;
    Adamw8States states;
} OptimizerCopy;

static void optimizer_copy_init(OptimizerCopy* c, const OptimizerCopy* from, const Adamw8Layout* layout) {
    size_t n = layout->num_parameters;
    c->params = (uint16_t*)mallocCheck(n * sizeof(uint16_t));
    c->master = (float*)mallocCheck(n * sizeof(float));
    adamw8_states_alloc_host(&c->states, layout);
    if (from == NULL) { return; }
    memcpy(c->params, from->params, n * sizeof(uint16_t));
    memcpy(c->master, from->master, n * sizeof(float));
    memcpy(c->states.m_codes, from->states.m_codes, layout->num_codes);
    memcpy(c->states.v_codes, from->states.v_codes, layout->num_codes);
    memcpy(c->states.m_absmax, from->states.m_absmax, layout->num_blocks * sizeof(float));
    memcpy(c->states.v_absmax, from->states.v_absmax, layout->num_blocks * sizeof(float));
    memcpy(c->states.m32, from->states.m32, layout->num_fp32 * sizeof(float));
    memcpy(c->states.v32, from->states.v32, layout->num_fp32 * sizeof(float));
}

static void optimizer_copy_free(OptimizerCopy* c) {
    free(c->params);
    free(c->master);
    adamw8_states_free_host(&c->states);
}

// one step of elements [offset, offset + n) of tensor t's part in `layout` (params, master, grads at the part's start)
static void update_range_ref(const Adamw8Layout* layout, Adamw8States* states, const Quant8Maps* maps, int t, size_t offset,
                             size_t n, uint16_t* params, float* master, const uint16_t* grads, AdamWElementParams hp,
                             uint32_t seed, const Fp8WeightRef* fp8) {
    uint32_t first_index = (uint32_t)(layout->part_begins[t] + offset);
    if (layout->bits[t] == 8) {
        Quant8TensorStates st = adamw8_tensor_states(layout, states, t);
        st.m_codes += offset; st.v_codes += offset;
        st.m_absmax += offset / QUANT8_BLOCK; st.v_absmax += offset / QUANT8_BLOCK;
        adamw8_update_bf16_ref(params + offset, master + offset, grads + offset, n, st, maps, hp, 1.0f, seed, first_index, fp8);
    } else {
        size_t at = layout->fp32_offsets[t] + offset;
        adamw_update_bf16_ref(params + offset, master + offset, grads + offset, states->m32 + at, states->v32 + at, n, hp, 1.0f,
                              seed, first_index, fp8);
    }
}

static void test_sharded_update(const GPT2Config* cfg, Adamw8Selection selection, const char* name) {
    Quant8Maps maps;
    quant8_maps_init(&maps);
    Adamw8Layout model;
    adamw8_layout_init(&model, cfg, selection);
    size_t n = model.num_parameters;
    Adamw8Layout all;
    adamw8_layout_window(&all, &model, 0, n);
    CHECK(all.num_codes == model.num_codes && all.num_blocks == model.num_blocks && all.num_fp32 == model.num_fp32 &&
          memcmp(all.code_offsets, model.code_offsets, sizeof(model.code_offsets)) == 0 &&
          memcmp(all.fp32_offsets, model.fp32_offsets, sizeof(model.fp32_offsets)) == 0,
          "%s: the whole-model window is not the model's layout", name);

    // the starting point: random weights, gradients and moments (quantized by the 8-bit path)
    OptimizerCopy start;
    optimizer_copy_init(&start, NULL, &model);
    uint16_t* grads = (uint16_t*)mallocCheck(n * sizeof(uint16_t));
    float* m = (float*)mallocCheck(n * sizeof(float));
    float* v = (float*)mallocCheck(n * sizeof(float));
    for (size_t i = 0; i < n; i++) {
        start.master[i] = 0.02f * (2.0f * bits_as_float(0x3f800000u | (random_u32(1u, (uint32_t)i) >> 9)) - 3.0f);
        start.params[i] = float_to_bf16_bits(start.master[i]);
        grads[i] = float_to_bf16_bits(1e-3f * (2.0f * bits_as_float(0x3f800000u | (random_u32(2u, (uint32_t)i) >> 9)) - 3.0f));
        m[i] = 1e-4f * (2.0f * bits_as_float(0x3f800000u | (random_u32(3u, (uint32_t)i) >> 9)) - 3.0f);
        v[i] = 1e-8f * bits_as_float(0x3f800000u | (random_u32(4u, (uint32_t)i) >> 9));
    }
    adamw8_states_from_fp32(&model, &maps, m, v, &start.states);
    AdamWElementParams hp = adamw_element_params(6e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 5);
    int slots = ZERO_MATMUL_KINDS * cfg->num_layers;

    // the delayed weight cast's scale of every matmul weight (one for all here: the previous
    // step's amax, below the new values' so some codes saturate)
    const float code_scale = fp8_scale_from_amax(0.015f, FP8_E4M3_MAX, 0);

    // one rank: whole tensors (the delayed codes at their flat places), the amax of each matmul
    // weight slice from its new master
    OptimizerCopy ref;
    optimizer_copy_init(&ref, &start, &model);
    uint8_t* ref_codes = (uint8_t*)calloc(n, 1);
    for (int t = 0; t < NUM_PARAMETER_TENSORS; t++) {
        size_t off = model.param_offsets[t];
        Fp8WeightRef whole = {NULL, ref_codes + off, code_scale};
        update_range_ref(&model, &ref.states, &maps, t, 0, model.sizes[t], ref.params + off, ref.master + off, grads + off,
                         hp, 100u + (uint32_t)t, zero_tensor_is_matmul_weight(t) ? &whole : NULL);
    }
    float* ref_amax = (float*)calloc((size_t)slots, sizeof(float));
    ZeroLayout one;
    zero_layout_init(&one, cfg, 1);
    for (int t = 0, kind = 0; t < NUM_PARAMETER_TENSORS; t++) {
        if (!zero_tensor_is_matmul_weight(t)) { continue; }
        for (int l = 0; l < cfg->num_layers; l++) {
            ZeroRange slice = zero_slice_range(&one, t, l);
            ref_amax[kind * cfg->num_layers + l] = zero_range_amax(ref.master, slice.begin, slice.end);
        }
        kind++;
    }

    for (int k = 1; k < NUM_RANK_COUNTS; k++) {
        ZeroLayout z;
        zero_layout_init(&z, cfg, RANK_COUNTS[k]);
        OptimizerCopy sharded;
        optimizer_copy_init(&sharded, &start, &model);
        float* amax = (float*)calloc((size_t)slots, sizeof(float));
        uint8_t* codes = (uint8_t*)calloc(n, 1);
        size_t codes_covered = 0, blocks_covered = 0, fp32_covered = 0;
        for (int r = 0; r < z.num_ranks; r++) {
            ZeroRange range = zero_rank_range(&z, r);
            Adamw8Layout window;
            adamw8_layout_window(&window, &model, range.begin, range.end);
            // the rank's states: its slice of the starting states, in arrays of its own
            OptimizerCopy rank;
            optimizer_copy_init(&rank, NULL, &window);
            memcpy(rank.states.m_codes, start.states.m_codes + window.codes_begin, window.num_codes);
            memcpy(rank.states.v_codes, start.states.v_codes + window.codes_begin, window.num_codes);
            memcpy(rank.states.m_absmax, start.states.m_absmax + window.blocks_begin, window.num_blocks * sizeof(float));
            memcpy(rank.states.v_absmax, start.states.v_absmax + window.blocks_begin, window.num_blocks * sizeof(float));
            memcpy(rank.states.m32, start.states.m32 + window.fp32_begin, window.num_fp32 * sizeof(float));
            memcpy(rank.states.v32, start.states.v32 + window.fp32_begin, window.num_fp32 * sizeof(float));
            for (int t = 0, kind = 0; t < NUM_PARAMETER_TENSORS; t++) {
                ZeroUpdateRange ranges[64];
                int count = zero_update_ranges(&z, r, t, ranges);
                size_t part = range.begin + window.param_offsets[t];
                size_t done = 0;
                for (int i = 0; i < count; i++) {
                    CHECK(ranges[i].offset == done, "%s N=%d rank %d %s: ranges not contiguous", name, z.num_ranks, r,
                          PARAM_TENSOR_NAMES[t]);
                    done += ranges[i].n;
                    // as the trainer points a call at its weight's codes (gpt2_weight_update): the
                    // layer slice's W codes, offset by where the call starts in the slice
                    float local = 0.0f;
                    size_t flat = part + ranges[i].offset;
                    size_t slice_begin = zero_tensor_is_matmul_weight(t) ? zero_slice_range(&one, t, ranges[i].layer).begin : flat;
                    Fp8WeightRef fp8 = {&local, codes + slice_begin + (flat - slice_begin), code_scale};
                    update_range_ref(&window, &rank.states, &maps, t, ranges[i].offset, ranges[i].n, sharded.params + part,
                                     sharded.master + part, grads + part, hp, 100u + (uint32_t)t, &fp8);
                    if (zero_tensor_is_matmul_weight(t)) {
                        float* slot = &amax[kind * cfg->num_layers + ranges[i].layer];
                        *slot = fmaxf(*slot, local);  // the all-reduce(MAX)
                    }
                }
                CHECK(done == window.sizes[t], "%s N=%d rank %d %s: ranges cover %zu of %zu", name, z.num_ranks, r,
                      PARAM_TENSOR_NAMES[t], done, window.sizes[t]);
                kind += zero_tensor_is_matmul_weight(t);
            }
            // the rank's states back at their place in the whole model's arrays
            memcpy(sharded.states.m_codes + window.codes_begin, rank.states.m_codes, window.num_codes);
            memcpy(sharded.states.v_codes + window.codes_begin, rank.states.v_codes, window.num_codes);
            memcpy(sharded.states.m_absmax + window.blocks_begin, rank.states.m_absmax, window.num_blocks * sizeof(float));
            memcpy(sharded.states.v_absmax + window.blocks_begin, rank.states.v_absmax, window.num_blocks * sizeof(float));
            memcpy(sharded.states.m32 + window.fp32_begin, rank.states.m32, window.num_fp32 * sizeof(float));
            memcpy(sharded.states.v32 + window.fp32_begin, rank.states.v32, window.num_fp32 * sizeof(float));
            codes_covered += window.num_codes;
            blocks_covered += window.num_blocks;
            fp32_covered += window.num_fp32;
            optimizer_copy_free(&rank);
        }
        CHECK(codes_covered == model.num_codes && blocks_covered == model.num_blocks && fp32_covered == model.num_fp32,
              "%s N=%d: the windows cover %zu codes, %zu blocks, %zu fp32 moments of %zu, %zu, %zu", name, z.num_ranks,
              codes_covered, blocks_covered, fp32_covered, model.num_codes, model.num_blocks, model.num_fp32);
        CHECK(memcmp(sharded.params, ref.params, n * sizeof(uint16_t)) == 0 && memcmp(sharded.master, ref.master, n * sizeof(float)) == 0,
              "%s N=%d: sharded weights differ from the one-rank step", name, z.num_ranks);
        CHECK(memcmp(sharded.states.m_codes, ref.states.m_codes, model.num_codes) == 0 &&
              memcmp(sharded.states.v_codes, ref.states.v_codes, model.num_codes) == 0 &&
              memcmp(sharded.states.m_absmax, ref.states.m_absmax, model.num_blocks * sizeof(float)) == 0 &&
              memcmp(sharded.states.v_absmax, ref.states.v_absmax, model.num_blocks * sizeof(float)) == 0 &&
              memcmp(sharded.states.m32, ref.states.m32, model.num_fp32 * sizeof(float)) == 0 &&
              memcmp(sharded.states.v32, ref.states.v32, model.num_fp32 * sizeof(float)) == 0,
              "%s N=%d: sharded optimizer states differ from the one-rank step", name, z.num_ranks);
        CHECK(memcmp(amax, ref_amax, (size_t)slots * sizeof(float)) == 0,
              "%s N=%d: all-reduced per-slice amaxes differ from the one-rank amaxes", name, z.num_ranks);
        size_t saturated = 0, differing = 0;
        for (int t = 0; t < NUM_PARAMETER_TENSORS; t++) {
            if (!zero_tensor_is_matmul_weight(t)) { continue; }
            for (size_t j = model.param_offsets[t]; j < model.param_offsets[t] + model.sizes[t]; j++) {
                differing += codes[j] != ref_codes[j];
                saturated += (ref_codes[j] & 0x7fu) == 0x7eu;
            }
        }
        CHECK(differing == 0 && saturated > 0, "%s N=%d: %zu delayed FP8 weight codes of the ranks' parts differ from the "
              "one-rank step's (%zu saturated)", name, z.num_ranks, differing, saturated);
        free(codes);
        free(amax);
        optimizer_copy_free(&sharded);
    }
    free(ref_amax);
    free(ref_codes);
    optimizer_copy_free(&ref);
    optimizer_copy_free(&start);
    free(grads); free(m); free(v);
}

// the multi-GPU startup check: what must agree across ranks changes its own item's fingerprint and no other one, the
// rank changes none; train_config_item_text names each item
static int fingerprints_differing(const uint32_t* a, const uint32_t* b, int* first) {
    int count = 0;
    *first = -1;
    for (int i = 0; i < NUM_CONFIG_ITEMS; i++) {
        if (a[i] != b[i]) {
            if (*first < 0) { *first = i; }
            count++;
        }
    }
    return count;
}

static void test_config_fingerprints(void) {
    GPT2Config d12 = gpt2_config_from_descriptor("d12"), d24 = gpt2_config_from_descriptor("d24");
    TrainConfig base = train_config_defaults();
    uint32_t reference[NUM_CONFIG_ITEMS], other_items[NUM_CONFIG_ITEMS];
    train_config_fingerprints(&base, &d12, -1, reference);
    int first;
    // every flag changed alone (a number to another in its range, a text to another): its item alone, but -pr's
    for (int i = 0; i < NUM_TRAIN_FLAGS; i++) {
        const FlagSpec* f = &TRAIN_FLAGS[i];
        TrainConfig other = base;
        char* field = (char*)&other + f->offset;
        if (f->kind == FLAG_INT) { *(int*)field = *(int*)field == (int)f->lo ? (int)f->lo + 1 : (int)f->lo; }
        else if (f->kind == FLAG_FLOAT) { *(float*)field = *(float*)field == (float)f->lo ? (float)f->hi : (float)f->lo; }
        else { *(const char**)field = "another"; }
        train_config_fingerprints(&other, &d12, -1, other_items);
        int count = fingerprints_differing(reference, other_items, &first);
        if (strcmp(f->name, "-pr") == 0) { CHECK(count == 0, "the rank (-pr) changed %d fingerprints", count); }
        else { CHECK(count == 1 && first == i, "%s changed alone: %d fingerprints changed, the first item %d", f->name, count, first); }
    }
    // a float flag one ulp away (%g's 6 digits print both alike): -l, -c, -gc, -q, -sl, -sg
    int floats = 0;
    for (int i = 0; i < NUM_TRAIN_FLAGS; i++) {
        const FlagSpec* f = &TRAIN_FLAGS[i];
        if (f->kind != FLAG_FLOAT) { continue; }
        TrainConfig other = base;
        float* field = (float*)((char*)&other + f->offset);
        *field = nextafterf(*field == 0.0f ? 3.0f : *field, INFINITY);
        TrainConfig same_text = other;
        *(float*)((char*)&same_text + f->offset) = nextafterf(*field, INFINITY);
        train_config_fingerprints(&other, &d12, -1, reference);
        train_config_fingerprints(&same_text, &d12, -1, other_items);
        CHECK(fingerprints_differing(reference, other_items, &first) == 1 && first == i,
              "%s one ulp apart (%.9g, %.9g): its fingerprint did not change alone", f->name, *field,
              *(float*)((char*)&same_text + f->offset));
        char what[64], value[64];
        train_config_item_text(i, &same_text, &d12, -1, what, sizeof(what), value, sizeof(value));
        CHECK(strcmp(what, f->name) == 0 && strtof(value, NULL) == *(float*)((char*)&same_text + f->offset),
              "%s's item reads '%s' '%s': the value does not round-trip", f->name, what, value);
        floats++;
    }
    CHECK(floats >= 6, "%d float flags: expected -l, -c, -gc, -q, -sl and -sg", floats);
    train_config_fingerprints(&base, &d12, -1, reference);
    for (int k = 0; k < 6; k++) {  // every shape field: the model's item alone
        GPT2Config other = d12;
        int* shape[6] = {&other.max_seq_len, &other.vocab_size, &other.padded_vocab_size, &other.num_layers,
                         &other.num_heads, &other.channels};
        (*shape[k])++;
        train_config_fingerprints(&base, &other, -1, other_items);
        CHECK(fingerprints_differing(reference, other_items, &first) == 1 && first == CONFIG_ITEM_MODEL,
              "shape field %d changed alone: not the model's item alone", k);
    }
    train_config_fingerprints(&base, &d24, -1, other_items);
    CHECK(fingerprints_differing(reference, other_items, &first) == 1 && first == CONFIG_ITEM_MODEL, "d24: not the model's item");
    train_config_fingerprints(&base, &d12, 100, other_items);
    CHECK(fingerprints_differing(reference, other_items, &first) == 1 && first == CONFIG_ITEM_RESUME,
          "the resume step: not its item alone");
    // the names and values the startup line gives
    const struct { int item; int resume_step; const char* what; const char* value; } named[] = {
        {CONFIG_ITEM_MODEL, -1, "models", "L=12 NH=12 C=768 maxT=1024 V=50257 Vp=50304"},
        {CONFIG_ITEM_RESUME, -1, "checkpoints to resume (-y 1 in -o)", "none: a fresh start"},
        {CONFIG_ITEM_RESUME, 40, "checkpoints to resume (-y 1 in -o)", "step 40"},
    };
    for (size_t i = 0; i < sizeof(named) / sizeof(named[0]); i++) {
        char what[64], value[128];
        train_config_item_text(named[i].item, &base, &d12, named[i].resume_step, what, sizeof(what), value, sizeof(value));
        CHECK(strcmp(what, named[i].what) == 0 && strcmp(value, named[i].value) == 0, "item %d: '%s' '%s', expected '%s' '%s'",
              named[i].item, what, value, named[i].what, named[i].value);
    }
    for (int i = 0; i < NUM_TRAIN_FLAGS; i++) {
        if (strcmp(TRAIN_FLAGS[i].name, "-b") != 0) { continue; }
        char what[64], value[64];
        train_config_item_text(i, &base, &d12, -1, what, sizeof(what), value, sizeof(value));
        char expected[64];
        snprintf(expected, sizeof(expected), "%d", base.B);
        CHECK(strcmp(what, "-b") == 0 && strcmp(value, expected) == 0, "-b's item reads '%s' '%s'", what, value);
    }
}

// ----------------------------------------------------------------------------
// ZeRO-3: the byte ranges of the flat parameter buffer a rank keeps mapped

typedef struct {
    const char* name;
    const GPT2Config* cfg;
    size_t element_bytes;
    size_t granule;
} ResidentCase;

// 1 when bytes [begin, end) lie inside one of the (merged, so maximal) ranges
static int resident_covers(const ZeroRange* ranges, int count, size_t begin, size_t end) {
    for (int k = 0; k < count; k++) {
        if (ranges[k].begin <= begin && begin < ranges[k].end) { return end <= ranges[k].end; }
    }
    return begin >= end;
}

// the tensor whose bytes hold byte `at` (-1: past the last tensor)
static int tensor_at_byte(const ZeroLayout* z, size_t element_bytes, size_t at) {
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        if (at < (z->tensor_offsets[i] + z->tensor_sizes[i]) * element_bytes) { return i; }
    }
    return -1;
}

// an uncovered byte range lies inside one matmul weight and outside the rank's own range
static void check_resident_gap(const ZeroLayout* z, const ResidentCase* c, int rank, size_t begin, size_t end) {
    if (begin >= end) { return; }
    int t = tensor_at_byte(z, c->element_bytes, begin);
    size_t tensor_end = t < 0 ? 0 : (z->tensor_offsets[t] + z->tensor_sizes[t]) * c->element_bytes;
    CHECK(t >= 0 && zero_tensor_is_matmul_weight(t) && end <= tensor_end,
          "%s N=%d rank %d granule %zu: unmapped bytes [%zu, %zu) are not inside one matmul weight (%s)", c->name,
          z->num_ranks, rank, c->granule, begin, end, t < 0 ? "padding" : PARAM_TENSOR_NAMES[t]);
    ZeroRange owned = zero_rank_range(z, rank);
    CHECK(end <= owned.begin * c->element_bytes || begin >= owned.end * c->element_bytes,
          "%s N=%d rank %d granule %zu: unmapped bytes [%zu, %zu) overlap the rank's own range", c->name, z->num_ranks,
          rank, c->granule, begin, end);
}

/*
Against the definition, granule by granule: a granule is mapped exactly when one of its bytes
belongs to a non-matmul tensor, the padding or the rank's own range, and the ranges are the
runs of mapped granules. This is what makes the rounding minimal (outward, never further).
*/
static void check_resident_granules(const ZeroLayout* z, const ResidentCase* c, int rank, const ZeroRange* ranges,
                                    int count) {
    size_t buffer_bytes = zero3_buffer_bytes(z, c->element_bytes, c->granule);
    size_t num_granules = buffer_bytes / c->granule;
    unsigned char* mapped = (unsigned char*)mallocCheck(num_granules);
    memset(mapped, 0, num_granules);
    ZeroRange needed[NUM_PARAMETER_TENSORS + 2];
    int num_needed = 0;
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        if (zero_tensor_is_matmul_weight(i)) { continue; }
        needed[num_needed].begin = z->tensor_offsets[i];
        needed[num_needed++].end = z->tensor_offsets[i] + z->tensor_sizes[i];
    }
    needed[num_needed].begin = z->num_parameters;
    needed[num_needed++].end = z->padded_total;
    needed[num_needed++] = zero_rank_range(z, rank);
    for (int k = 0; k < num_needed; k++) {
        if (needed[k].begin >= needed[k].end) { continue; }
        size_t last = (needed[k].end * c->element_bytes - 1) / c->granule;
        for (size_t g = needed[k].begin * c->element_bytes / c->granule; g <= last; g++) { mapped[g] = 1; }
    }
    int runs = 0, mismatched = 0;
    for (size_t g = 0; g < num_granules; g++) {
        if (!mapped[g] || (g > 0 && mapped[g - 1])) { continue; }
        size_t end = g;
        while (end < num_granules && mapped[end]) { end++; }
        mismatched += runs >= count || ranges[runs].begin != g * c->granule || ranges[runs].end != end * c->granule;
        runs++;
    }
    CHECK(runs == count && mismatched == 0,
          "%s N=%d rank %d granule %zu: %d ranges, expected the %d runs of granules holding needed bytes (%d differ)",
          c->name, z->num_ranks, rank, c->granule, count, runs, mismatched);
    free(mapped);
}

// every rank's ranges for one case: structure, coverage, what is left out; returns the smallest saving in bytes
static size_t test_resident_ranges(const ResidentCase* c, int num_ranks) {
    ZeroLayout z;
    zero_layout_init(&z, c->cfg, num_ranks);
    size_t buffer_bytes = zero3_buffer_bytes(&z, c->element_bytes, c->granule);
    CHECK(buffer_bytes % c->granule == 0 && buffer_bytes >= z.padded_total * c->element_bytes &&
          buffer_bytes - z.padded_total * c->element_bytes < c->granule,
          "%s N=%d granule %zu: buffer of %zu bytes for %zu elements", c->name, num_ranks, c->granule, buffer_bytes,
          z.padded_total);
    size_t min_saving = buffer_bytes;
    for (int r = 0; r < num_ranks; r++) {
        ZeroRange ranges[ZERO3_MAX_RESIDENT_RANGES];
        int count = zero3_resident_ranges(&z, r, c->element_bytes, c->granule, ranges, ZERO3_MAX_RESIDENT_RANGES);
        int bad = 0;
        for (int k = 0; k < count; k++) {
            bad += ranges[k].begin >= ranges[k].end || ranges[k].begin % c->granule != 0 ||
                   ranges[k].end % c->granule != 0 || ranges[k].end > buffer_bytes ||
                   (k > 0 && ranges[k].begin <= ranges[k - 1].end);
        }
        CHECK(count >= 1 && bad == 0,
              "%s N=%d rank %d granule %zu: %d of %d ranges empty, unaligned, past the buffer, unsorted or touching",
              c->name, num_ranks, r, c->granule, bad, count);
        if (bad != 0) { continue; }
        for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
            if (zero_tensor_is_matmul_weight(i)) { continue; }
            size_t begin = z.tensor_offsets[i] * c->element_bytes;
            CHECK(resident_covers(ranges, count, begin, begin + z.tensor_sizes[i] * c->element_bytes),
                  "%s N=%d rank %d granule %zu: %s not mapped", c->name, num_ranks, r, c->granule, PARAM_TENSOR_NAMES[i]);
        }
        ZeroRange owned = zero_rank_range(&z, r);
        CHECK(resident_covers(ranges, count, owned.begin * c->element_bytes, owned.end * c->element_bytes),
              "%s N=%d rank %d granule %zu: own range [%zu, %zu) not mapped", c->name, num_ranks, r, c->granule,
              owned.begin, owned.end);
        CHECK(resident_covers(ranges, count, z.num_parameters * c->element_bytes, z.padded_total * c->element_bytes),
              "%s N=%d rank %d granule %zu: padding not mapped", c->name, num_ranks, r, c->granule);
        check_resident_gap(&z, c, r, 0, ranges[0].begin);
        for (int k = 1; k < count; k++) { check_resident_gap(&z, c, r, ranges[k - 1].end, ranges[k].begin); }
        check_resident_gap(&z, c, r, ranges[count - 1].end, buffer_bytes);
        check_resident_granules(&z, c, r, ranges, count);
        size_t saving = buffer_bytes - zero3_resident_bytes(ranges, count);
        if (saving < min_saving) { min_saving = saving; }
    }
    return min_saving;
}

static void test_zero3(void) {
    GPT2Config d12 = gpt2_config_from_descriptor("d12");
    GPT2Config d48 = gpt2_config_from_descriptor("d48");
    GPT2Config odd = gpt2_config_make(3, 5, 80, 37, 301);  // no tensor size a multiple of 256 or of a granule
    const size_t MiB2 = 2u << 20;
    const ResidentCase cases[] = {
        {"d12", &d12, 2, MiB2}, {"d12", &d12, 2, 512}, {"d48", &d48, 2, MiB2}, {"d48", &d48, 2, 512},
        {"odd", &odd, 2, MiB2}, {"odd", &odd, 2, 512}, {"odd", &odd, 1, 64}, {"odd", &odd, 4, 96},
    };
    const int rank_counts[] = {1, 2, 3, 8};
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        for (size_t k = 0; k < sizeof(rank_counts) / sizeof(rank_counts[0]); k++) {
            size_t min_saving = test_resident_ranges(&cases[c], rank_counts[k]);
            if (rank_counts[k] != 8 || cases[c].granule != MiB2 || cases[c].cfg == &odd) { continue; }
            ZeroLayout z;
            zero_layout_init(&z, cases[c].cfg, 8);
            size_t matmul_bytes = 0;
            for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
                if (zero_tensor_is_matmul_weight(i)) { matmul_bytes += z.tensor_sizes[i] * cases[c].element_bytes; }
            }
            size_t buffer_bytes = zero3_buffer_bytes(&z, cases[c].element_bytes, MiB2);
            printf("ZeRO-3 %s N=8, bf16, 2 MiB granule: buffer %.1f MiB, matmul weights %.1f MiB, each rank maps at most "
                   "%.1f MiB, saving at least %.1f MiB (%.1f%% of the matmul weights)\n",
                   cases[c].name, buffer_bytes / 1048576.0, matmul_bytes / 1048576.0,
                   (buffer_bytes - min_saving) / 1048576.0, min_saving / 1048576.0, 100.0 * min_saving / matmul_bytes);
            if (cases[c].cfg == &d48) {
                CHECK(min_saving >= matmul_bytes / 10 * 8, "d48 N=8: a rank saves only %zu of the %zu matmul weight bytes",
                      min_saving, matmul_bytes);
            }
        }
    }
    ZeroLayout z;
    zero_layout_init(&z, &d12, 8);
    CHECK_DIES("too few resident ranges", "ZERO3_MAX_RESIDENT_RANGES", {
        ZeroRange two[2];
        zero3_resident_ranges(&z, 3, 2, 512, two, 2);
    });
    CHECK_DIES("resident ranges of rank 8 of 8", "rank 8", {
        ZeroRange ranges[ZERO3_MAX_RESIDENT_RANGES];
        zero3_resident_ranges(&z, 8, 2, 512, ranges, ZERO3_MAX_RESIDENT_RANGES);
    });
}

// one rank's whole-weight block cast of every slice, one 128x128 block at a time
static void block_cast_reference(const ZeroLayout* z, const float* params, const ZeroPiece* slices, int num_slices,
                                 float* ref_scales, uint8_t* ref_codes) {
    size_t block = 0;
    for (int s = 0; s < num_slices; s++) {
        int cols = zero_weight_cols(z, slices[s].tensor);
        int rows = (int)((slices[s].end - slices[s].begin) / cols);
        const float* w = params + slices[s].begin;
        for (int r0 = 0; r0 < rows; r0 += 128) {
            for (int c0 = 0; c0 < cols; c0 += 128, block++) {
                float amax = 0.0f;
                for (int r = r0; r < r0 + 128 && r < rows; r++) {
                    for (int c = c0; c < c0 + 128 && c < cols; c++) { amax = fmaxf(amax, fabsf(w[(size_t)r * cols + c])); }
                }
                ref_scales[block] = fp8_scale_from_amax(amax, FP8_E4M3_MAX, 0);
                for (int r = r0; r < r0 + 128 && r < rows; r++) {
                    for (int c = c0; c < c0 + 128 && c < cols; c++) {
                        size_t at = slices[s].begin + (size_t)r * cols + c;
                        ref_codes[at] = fp8_quantize(params[at], ref_scales[block], FP8_E4M3);
                    }
                }
            }
        }
    }
}

// the slice holding flat element j, or -1
static int slice_of(const ZeroPiece* slices, int num_slices, size_t j) {
    for (int s = 0; s < num_slices; s++) {
        if (j >= slices[s].begin && j < slices[s].end) { return s; }
    }
    return -1;
}

/*
The block recipe's FP8 weight gather (one scale per 128x128 block) with N simulated ranks
against one rank's whole-weight block cast: block scales and codes bit for bit. A rank's
part cuts blocks (a block is 128 runs of 128 elements), and each cut block gets its amax at
the cut: on the later part's first element (edge 0), then on the earlier part's last
(edge 1), so a partial amax that misses either end of a part changes a scale. Negative
control: each rank's part cast with block scales from its LOCAL partial amax differs.
*/
static void test_fp8_block_gather(const GPT2Config* cfg) {
    ZeroLayout single;
    zero_layout_init(&single, cfg, 1);
    float* clean = (float*)mallocCheck(single.num_parameters * sizeof(float));
    float* params = (float*)mallocCheck(single.num_parameters * sizeof(float));
    fill_weights(clean, &single, 4321u);
    ZeroPiece* slices = (ZeroPiece*)mallocCheck((size_t)ZERO_MATMUL_KINDS * cfg->num_layers * sizeof(ZeroPiece));
    int num_slices = zero_fp8_weight_slices(&single, slices);
    size_t total_blocks = 0;
    for (int s = 0; s < num_slices; s++) {
        int cols = zero_weight_cols(&single, slices[s].tensor);
        total_blocks += fp8_weight_blocks((int)((slices[s].end - slices[s].begin) / cols), cols);
    }
    // per layer qkv [3C][C], attproj [C][C], fc [4C][C], fcproj [C][4C], each a grid of 128x128
    // blocks, the last row and column of blocks short where a width is not a multiple of 128
    size_t c_blocks = ((size_t)cfg->channels + FP8_WEIGHT_BLOCK - 1) / FP8_WEIGHT_BLOCK;
    size_t c3_blocks = (3 * (size_t)cfg->channels + FP8_WEIGHT_BLOCK - 1) / FP8_WEIGHT_BLOCK;
    size_t c4_blocks = (4 * (size_t)cfg->channels + FP8_WEIGHT_BLOCK - 1) / FP8_WEIGHT_BLOCK;
    CHECK(total_blocks == (size_t)cfg->num_layers * c_blocks * (c3_blocks + c_blocks + 2 * c4_blocks),
          "%zu blocks for %d layers of C=%d", total_blocks, cfg->num_layers, cfg->channels);
    float* ref_scales = (float*)mallocCheck(total_blocks * sizeof(float));
    uint8_t* ref_codes = (uint8_t*)mallocCheck(single.num_parameters);
    float* scales = (float*)mallocCheck(total_blocks * sizeof(float));
    uint8_t* codes = (uint8_t*)mallocCheck(single.num_parameters);
    float* local_amax = (float*)mallocCheck(total_blocks * sizeof(float));
    const int rank_counts[] = {2, 3, 8};
    for (int k = 0; k < 3; k++) {
        ZeroLayout z;
        zero_layout_init(&z, cfg, rank_counts[k]);
        for (int edge = 0; edge < 2; edge++) {
            memcpy(params, clean, single.num_parameters * sizeof(float));
            int cut_blocks = 0;
            for (int r = 1; r < z.num_ranks; r++) {
                size_t spike = zero_rank_range(&z, r).begin - (size_t)edge;
                int s = slice_of(slices, num_slices, spike);
                if (s < 0) { continue; }
                params[spike] = (edge ? -3.0f : 3.0f) * fmaxf(zero_range_amax(clean, slices[s].begin, slices[s].end), 1e-6f);
                cut_blocks++;
            }
            CHECK(cut_blocks > 0, "block gather N=%d: no rank boundary inside a block linear", rank_counts[k]);
            block_cast_reference(&single, params, slices, num_slices, ref_scales, ref_codes);
            memset(codes, 0, z.num_parameters);
            zero_simulate_fp8_block_weight_gather(&z, params, slices, num_slices, scales, codes);
            size_t scale_mismatch = 0;
            for (size_t b = 0; b < total_blocks; b++) { scale_mismatch += float_as_bits(scales[b]) != float_as_bits(ref_scales[b]); }
            CHECK(scale_mismatch == 0, "block gather N=%d edge %d: %zu of %zu block scales differ from the whole-weight cast",
                  rank_counts[k], edge, scale_mismatch, total_blocks);
            for (int s = 0; s < num_slices; s++) {
                CHECK(memcmp(codes + slices[s].begin, ref_codes + slices[s].begin, slices[s].end - slices[s].begin) == 0,
                      "block gather N=%d edge %d: slice %d's gathered FP8 codes differ from the whole-weight block cast",
                      rank_counts[k], edge, s);
            }
            // negative control: each rank's part cast with its own partial block amaxes
            size_t differing = 0;
            for (int r = 0; r < z.num_ranks; r++) {
                ZeroRange range = zero_rank_range(&z, r);
                for (int s = 0; s < num_slices; s++) {
                    int cols = zero_weight_cols(&z, slices[s].tensor);
                    size_t begin = slices[s].begin > range.begin ? slices[s].begin : range.begin;
                    size_t end = slices[s].end < range.end ? slices[s].end : range.end;
                    if (begin >= end) { continue; }
                    for (size_t b = 0; b < total_blocks; b++) { local_amax[b] = 0.0f; }
                    zero_fold_block_amax(params, begin, end, slices[s].begin, cols, local_amax);
                    for (size_t j = begin; j < end; j++) {
                        float scale = fp8_weight_block_scale(local_amax[fp8_weight_block_of(j - slices[s].begin, cols)]);
                        differing += fp8_quantize(params[j], scale, FP8_E4M3) != ref_codes[j];
                    }
                }
            }
            CHECK(differing > 0, "block gather N=%d: rank-local block scales gave the same codes (no block is split)",
                  rank_counts[k]);
        }
    }
    free(clean); free(params); free(slices); free(ref_scales); free(ref_codes); free(scales); free(codes); free(local_amax);
}

/*
zero_8bit_part_off_block_grid, the trainer's startup check: GPT-2's shapes keep every rank's part
of every 8-bit tensor on its block grid under -qs default at 1 to 512 ranks (under -qs all, d48's
lnfb, which starts off the grid, may be cut); L = 3, C = 384 puts attprojw and the tensors after
it off the grid, and 3 ranks cut attprojw inside a block, where the optimizer's window dies.
*/
static void test_8bit_parts_on_the_block_grid(void) {
    const char* names[] = {"d12", "d24", "d36", "d48"};
    for (int m = 0; m < 4; m++) {
        GPT2Config cfg = gpt2_config_from_descriptor(names[m]);
        for (int ranks = 1; ranks <= 512; ranks++) {
            int rank = -1;
            size_t element = 0;
            int tensor = zero_8bit_part_off_block_grid(&cfg, ranks, ADAMW8_SELECT_DEFAULT, &rank, &element);
            CHECK(tensor == -1, "%s over %d ranks -qs default: rank %d's part of %s off the grid", names[m], ranks, rank,
                  tensor >= 0 ? PARAM_TENSOR_NAMES[tensor] : "-");
            tensor = zero_8bit_part_off_block_grid(&cfg, ranks, ADAMW8_SELECT_ALL, &rank, &element);
            CHECK(tensor == -1 || (m == 3 && tensor == PARAM_LNFB), "%s over %d ranks -qs all: %s off the grid",
                  names[m], ranks, tensor >= 0 ? PARAM_TENSOR_NAMES[tensor] : "-");
        }
    }
    GPT2Config l3 = gpt2_config_make(3, 3, 384, 128, 1000);
    int rank = -1;
    size_t element = 0;
    CHECK(zero_8bit_part_off_block_grid(&l3, 3, ADAMW8_SELECT_DEFAULT, &rank, &element) == PARAM_ATTPROJW &&
          rank == 1 && element == 147072, "L=3 C=384 over 3 ranks: attprojw at rank 1's element 147072 expected, "
          "got rank %d element %zu", rank, element);
    CHECK(zero_8bit_part_off_block_grid(&l3, 1, ADAMW8_SELECT_DEFAULT, &rank, &element) == -1, "L=3 C=384, 1 rank");
    CHECK(zero_8bit_part_off_block_grid(&l3, 3, ADAMW8_SELECT_NONE, &rank, &element) == -1, "L=3 C=384 -qs none");
    CHECK_DIES("rank 1's 8-bit window of L=3 C=384 over 3 ranks", "attprojw: a shard starts at its element 147072", {
        ZeroLayout layout;
        zero_layout_init(&layout, &l3, 3);
        ZeroRange range = zero_rank_range(&layout, 1);
        Adamw8Layout model;
        Adamw8Layout window;
        adamw8_layout_init(&model, &l3, ADAMW8_SELECT_DEFAULT);
        adamw8_layout_window(&window, &model, range.begin, range.end);
    });
}

/*
zero_update_ranges against its definition, rank by rank on tiny over 1 to 8 ranks (boundaries inside layer
slices): a whole-model tensor is one call (layer -1); a matmul weight one call per layer its part touches,
cut at the layer boundaries; any other per-layer tensor one call, its layer the part's first
*/
static void test_update_ranges(const GPT2Config* cfg) {
    for (int k = 0; k < NUM_RANK_COUNTS; k++) {
        ZeroLayout z;
        zero_layout_init(&z, cfg, RANK_COUNTS[k]);
        int wrong = 0;
        for (int r = 0; r < z.num_ranks; r++) {
            for (int t = 0; t < NUM_PARAMETER_TENSORS; t++) {
                ZeroUpdateRange ranges[64];
                int count = zero_update_ranges(&z, r, t, ranges);
                ZeroPart part;
                if (!zero_tensor_part(&z, r, t, &part)) {
                    wrong += count != 0;
                    continue;
                }
                size_t slice = z.tensor_sizes[t] / (zero_tensor_is_per_layer(t) ? (size_t)z.num_layers : 1);
                int first = (int)(part.begin / slice), last = (int)((part.end - 1) / slice);
                int want_count = zero_tensor_is_matmul_weight(t) ? last - first + 1 : 1;
                wrong += count != want_count;
                for (int i = 0; i < count && count == want_count; i++) {
                    size_t begin = i == 0 ? part.begin : (size_t)(first + i) * slice;
                    size_t end = i == count - 1 ? part.end : (size_t)(first + i + 1) * slice;
                    int layer = zero_tensor_is_per_layer(t) ? first + i : -1;
                    wrong += ranges[i].tensor != t || ranges[i].layer != layer || ranges[i].offset != begin - part.begin ||
                             ranges[i].n != end - begin;
                }
            }
        }
        CHECK(wrong == 0, "update ranges N=%d: %d wrong", z.num_ranks, wrong);
    }
}

// the edges of what the layout functions take: 4096 ranks and not 4097; chunks 0..L; ZeRO-3 ranges of a
// rank 0..N-1, of positive element and granule sizes, into an array exactly as long as needed; and the
// FP8 weights' columns (the block gather's reference takes them from zero_weight_cols too); the bytes ranges cover
static void test_argument_edges(const GPT2Config* cfg) {
    ZeroLayout z;
    zero_layout_init(&z, cfg, ZERO_MAX_RANKS);
    CHECK(z.num_ranks == ZERO_MAX_RANKS, "%d ranks: a layout of %d", ZERO_MAX_RANKS, z.num_ranks);
    CHECK_DIES("4097 ranks", "4097 ranks (expected 1..4096)", zero_layout_init(&z, cfg, ZERO_MAX_RANKS + 1));
    zero_layout_init(&z, cfg, 2);
    CHECK_DIES("chunk -1", "chunk -1 out of range", {
        ZeroPiece pieces[64];
        zero_chunk_pieces(&z, -1, pieces);
    });
    ZeroRange ranges[ZERO3_MAX_RESIDENT_RANGES];
    CHECK_DIES("resident ranges of rank -1", "rank -1 (expected 0..1)", zero3_resident_ranges(&z, -1, 2, 512, ranges, 2));
    CHECK_DIES("resident ranges of 0-byte elements", "element size 0", zero3_resident_ranges(&z, 0, 0, 512, ranges, 2));
    CHECK_DIES("resident ranges in 0-byte granules", "granule 0 bytes", zero3_resident_ranges(&z, 0, 2, 0, ranges, 2));
    CHECK(zero_weight_cols(&z, PARAM_QKVW) == cfg->channels && zero_weight_cols(&z, PARAM_ATTPROJW) == cfg->channels &&
          zero_weight_cols(&z, PARAM_FCW) == cfg->channels && zero_weight_cols(&z, PARAM_FCPROJW) == 4 * cfg->channels,
          "the columns K of the FP8 weights: C for qkvw, attprojw and fcw, 4C for fcprojw");
    ZeroRange two[2] = {{0, 512}, {1024, 1536}};
    CHECK(zero3_resident_bytes(two, 2) == 1024, "two ranges of 512 bytes cover %zu", zero3_resident_bytes(two, 2));
    int count = zero3_resident_ranges(&z, 1, 2, 512, ranges, ZERO3_MAX_RESIDENT_RANGES);
    ZeroRange exact[ZERO3_MAX_RESIDENT_RANGES];
    CHECK(zero3_resident_ranges(&z, 1, 2, 512, exact, count) == count && memcmp(exact, ranges, (size_t)count * sizeof(ZeroRange)) == 0,
          "resident ranges into an array of exactly their %d", count);
}

int main(void) {
    const char* names[] = {"tiny", "d12", "d48"};
    for (int m = 0; m < 3; m++) {
        GPT2Config cfg = gpt2_config_from_descriptor(names[m]);
        for (int k = 0; k < NUM_RANK_COUNTS; k++) {
            ZeroLayout z;
            zero_layout_init(&z, &cfg, RANK_COUNTS[k]);
            CHECK(z.num_parameters == gpt2_num_parameters(&cfg), "%s: parameter count", names[m]);
            test_rank_ranges(&z, names[m]);
            test_tensor_parts(&z, &cfg, names[m]);
            test_chunks(&z, names[m]);
        }
    }
    GPT2Config tiny = gpt2_config_from_descriptor("tiny");
    for (int k = 0; k < NUM_RANK_COUNTS; k++) { test_element_ownership(&tiny, RANK_COUNTS[k]); }
    // d12's padding with 8 ranks: 124475904 parameters, shard 15559680 (a multiple of 256)
    ZeroLayout d12_8;
    GPT2Config d12 = gpt2_config_from_descriptor("d12");
    zero_layout_init(&d12_8, &d12, 8);
    CHECK(d12_8.shard_size == 15559680 && d12_8.padded_total == 124477440,
          "d12 N=8: shard %zu, padded %zu", d12_8.shard_size, d12_8.padded_total);
    test_config_fingerprints();
    // tiny with a small vocabulary, so the rank boundaries cut matmul weight slices (tiny's wte
    // alone would hold every boundary but the last)
    GPT2Config tiny_vocab = tiny;
    tiny_vocab.vocab_size = 1000;
    tiny_vocab.padded_vocab_size = 1024;
    test_fp8_gather(&tiny_vocab, FP8_E4M3, 0);
    // a small model whose tensors all start on the 256 grid (C = 256), in every state selection
    GPT2Config small = tiny;
    small.channels = 256;
    small.num_heads = 4;
    test_sharded_update(&small, ADAMW8_SELECT_DEFAULT, "C=256 -qs default");
    test_sharded_update(&small, ADAMW8_SELECT_ALL, "C=256 -qs all");
    test_sharded_update(&small, ADAMW8_SELECT_NONE, "C=256 plain AdamW");
    test_sharded_update(&tiny, ADAMW8_SELECT_DEFAULT, "tiny -qs default");
    // tiny's lnfb (C = 128) starts off the grid: 8-bit states for it cannot be cut there
    CHECK_DIES("8-bit part off the block grid", "inside a 256-element block", {
        Adamw8Layout model;
        Adamw8Layout window;
        adamw8_layout_init(&model, &tiny, ADAMW8_SELECT_ALL);
        size_t lnfb = model.param_offsets[PARAM_LNFB];
        adamw8_layout_window(&window, &model, lnfb + 64, model.num_parameters);
    });
    // C = 72 (a checkpoint's width, a multiple of 8 but not 16): qkvw's layer slice 3C^2 = 15552 and attprojw's C^2 =
    // 5184 are not whole blocks, which the per-layer 8-bit update needs; fcw and fcprojw (4C^2) are
    for (int m = 0; m < 3; m++) {
        GPT2Config cfg = gpt2_config_from_descriptor(names[m]);
        CHECK(zero_8bit_weight_off_block_grid(&cfg, ADAMW8_SELECT_ALL) == -1, "%s: an 8-bit weight off the grid", names[m]);
    }
    GPT2Config c72 = gpt2_config_make(2, 1, 72, 256, 1000);
    CHECK(zero_8bit_weight_off_block_grid(&c72, ADAMW8_SELECT_DEFAULT) == PARAM_QKVW, "C=72 -qs default: qkvw expected");
    CHECK(zero_8bit_weight_off_block_grid(&c72, ADAMW8_SELECT_NONE) == -1, "C=72 -qs none: no 8-bit weight");
    GPT2Config c80 = gpt2_config_make(2, 1, 80, 256, 1000);
    CHECK(zero_8bit_weight_off_block_grid(&c80, ADAMW8_SELECT_ALL) == -1, "C=80: every layer slice is whole blocks");
    test_8bit_parts_on_the_block_grid();
    test_fp8_gather(&tiny_vocab, FP8_E5M2, 1);
    // d12's weight shapes (C = 768: 432 blocks per layer) in two layers, a small vocabulary
    GPT2Config d12_like = d12;
    d12_like.num_layers = 2;
    d12_like.vocab_size = 1000;
    d12_like.padded_vocab_size = 1024;
    d12_like.max_seq_len = 256;
    test_fp8_block_gather(&d12_like);
    // a width that is not a multiple of 128, as d48's C = 1600: C = 192 (1.5 blocks, 3C = 4.5)
    GPT2Config uneven = gpt2_config_make(2, 3, 192, 256, 1000);
    test_fp8_block_gather(&uneven);
    test_zero3();
    CHECK_DIES("zero ranks", "ranks", { ZeroLayout z; zero_layout_init(&z, &tiny, 0); });
    CHECK_DIES("bad chunk", "chunk", {
        ZeroLayout z; ZeroPiece pieces[64];
        zero_layout_init(&z, &tiny, 2);
        zero_chunk_pieces(&z, tiny.num_layers + 1, pieces);
    });
    // 8768 parameters on 8 ranks of 1280: rank 7 holds only padding (an empty range at the end)
    GPT2Config toy = gpt2_config_make(2, 1, 16, 8, 128);
    ZeroLayout toy_8;
    zero_layout_init(&toy_8, &toy, 8);
    ZeroRange last = zero_rank_range(&toy_8, 7);
    CHECK(last.begin == toy_8.num_parameters && last.end == toy_8.num_parameters, "toy N=8: rank 7 owns [%zu, %zu)",
          last.begin, last.end);
    test_rank_ranges(&toy_8, "toy");
    test_tensor_parts(&toy_8, &toy, "toy");
    test_chunks(&toy_8, "toy");
    test_update_ranges(&tiny_vocab);
    test_argument_edges(&tiny);
    return test_summary("test_zero");
}
