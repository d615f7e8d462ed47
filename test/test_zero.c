// test_zero.c: the ZeRO shard layout (llmc/zero.h) with simulated ranks, on the CPU.
#include <stdlib.h>
#include "llmc/zero.h"
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
    ZeroPiece* slices = (ZeroPiece*)mallocCheck((size_t)(ZERO_MATMUL_KINDS * cfg->num_layers + 1) * sizeof(ZeroPiece));
    int num_slices = zero_fp8_weight_slices(&single, slices);
    CHECK(num_slices == ZERO_MATMUL_KINDS * cfg->num_layers + 1, "%d FP8 weight slices", num_slices);
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
    test_fp8_gather(&tiny, FP8_E4M3, 0);
    test_fp8_gather(&tiny, FP8_E5M2, 1);
    CHECK_DIES("zero ranks", "ranks", { ZeroLayout z; zero_layout_init(&z, &tiny, 0); });
    CHECK_DIES("bad chunk", "chunk", {
        ZeroLayout z; ZeroPiece pieces[64];
        zero_layout_init(&z, &tiny, 2);
        zero_chunk_pieces(&z, tiny.num_layers + 1, pieces);
    });
    return test_summary("test_zero");
}
