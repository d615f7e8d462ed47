/*
zero.h: who owns which parameters under ZeRO sharding (DESIGN.md section 5), as host-only
arithmetic: the trainer, the CPU tests and the docs' byte counts use these functions; the
simulated gathers and the ZeRO-3 byte counts near the end are the tests' (they check the
trainer's kernels and its memory line against them).

Why it is shaped so:
- Rank r of N owns ONE contiguous range of the flat parameter vector (llm.c order, the
  trainer's buffers unchanged): [r * S, (r + 1) * S), S the same for every rank, so each
  owner's slices go to the others in place (zero_comm.cuh: ncclBroadcast from each owner,
  grouped per stage, which moves what one ncclAllGather of S elements per rank would). The vector is
  padded at its end to N * S; S is the smallest multiple of 256 with N * S >= the number of
  parameters, so the padding is minimal under that rule.
- S is a multiple of 256 (QUANT8_BLOCK): in every GPT-2 shape whose channels are a
  multiple of 256 (d12, d24, d36) every tensor starts at a multiple of 256, so no 8-bit
  AdamW block straddles two ranks, and a rank's 8-bit states are a slice of the single-GPU
  states (quant8.h's adamw8_layout_window). Otherwise (d48: C = 1600) only lnfb starts off
  the grid; zero_tensor_part says so through `block_aligned`. lnfb keeps 32-bit states by
  default; a shard boundary inside an 8-bit tensor's block (there with -qs all, or in other
  shapes) is refused at startup (zero_8bit_part_off_block_grid).
- The optimizer works per tensor, so zero_tensor_part gives the piece of tensor i a rank
  owns, in the tensor's own coordinates, and where it sits in the rank's shard;
  zero_update_ranges cuts it into the optimizer's calls: one per layer slice of a matmul
  weight, since each slice is its own FP8 tensor whose amax the optimizer pass computes
  (the trainer joins consecutive slices that have no FP8 outputs into one call).
- Gradients are reduced per layer while the backward pass goes on: chunk l (l < L) holds
  layer l's twelve slices, complete as soon as layer l's backward is done; chunk L holds
  wte, wpe, lnfw, lnfb, complete at the end. A contiguous rank range does not cut a chunk
  into N equal parts, so a chunk is reduced as pieces, each a contiguous run of one slice
  owned by one rank, with one ncclReduce per piece to its owner in one NCCL group (a
  reduce-scatter with unequal counts; each rank still sends about what a ring
  reduce-scatter sends). zero_chunk_pieces lists them.
- FP8 weights (the matmul weight slices qkvw/attprojw/fcw/fcprojw per layer; an FP8
  lm_head is cast from the gathered bf16 wte on every rank): a rank's amax of its part, a MAX all-reduce over ranks, one scale from the
  global amax, each rank casts its part: since max is exact and order free, and the cast
  is elementwise, the gathered codes equal a single rank's cast bit for bit.
  zero_simulate_fp8_weight_gather does exactly that with simulated ranks, for the tests.
  The block recipe (one scale per 128x128 block) does the same per block: a rank's flat
  part cuts blocks, so each rank's partial amax of every block it touches, one MAX
  all-reduce of all those, each rank casts its part with its elements' block scales
  (zero_simulate_fp8_block_weight_gather).
- ZeRO-3 keeps the flat addressing of the bf16 parameter buffer (every kernel indexes it by
  flat offset) but backs with memory only what a rank reads: zero3_resident_ranges gives
  those byte ranges, rounded to the granule that device memory can be mapped in
  (llmc/sparse_buffer.cuh maps them); the others' parts of the matmul weights stay unmapped.
Plain C that also compiles as C++.
*/
#ifndef LLMC_ZERO_H
#define LLMC_ZERO_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include "utils.h"
#include "gpt2_config.h"
#include "fp8.h"
#include "fp8_scaling.h"
#include "quant8.h"

#define ZERO_ALIGN QUANT8_BLOCK          // shard boundaries are multiples of this many elements
#define ZERO_MAX_RANKS 4096
#define ZERO_LAYER_TENSORS 12            // per-layer tensors: ln1w .. fcprojb
#define ZERO_MATMUL_KINDS 4              // qkvw, attprojw, fcw, fcprojw

typedef struct {
    int num_ranks;
    int num_layers;
    size_t num_parameters;                        // real elements
    size_t shard_size;                            // S: elements per rank, a multiple of ZERO_ALIGN
    size_t padded_total;                          // N * S
    size_t tensor_sizes[NUM_PARAMETER_TENSORS];
    size_t tensor_offsets[NUM_PARAMETER_TENSORS]; // into the flat vector
} ZeroLayout;

// a half-open range [begin, end) of flat elements (of bytes where a function says so)
typedef struct {
    size_t begin;
    size_t end;
} ZeroRange;

// the part of one tensor a rank owns
typedef struct {
    size_t begin;          // in the tensor's own coordinates
    size_t end;
    size_t shard_offset;   // where `begin` sits in the rank's shard (0..S)
    int block_aligned;     // begin is on the tensor's own 256-element block grid
} ZeroPart;

// one contiguous run of one slice owned by one rank: one ncclReduce (gradients) or one cast unit
typedef struct {
    int tensor;
    int layer;             // -1 for wte, wpe, lnfw, lnfb
    size_t begin;          // flat
    size_t end;
    int owner;
} ZeroPiece;

static inline int zero_tensor_is_per_layer(int tensor) {
    return tensor != PARAM_WTE && tensor != PARAM_WPE && tensor != PARAM_LNFW && tensor != PARAM_LNFB;
}

static inline void zero_layout_init(ZeroLayout* layout, const GPT2Config* cfg, int num_ranks) {
    if (num_ranks < 1 || num_ranks > ZERO_MAX_RANKS) {
        llm8_die("ZeRO sharding: %d ranks (expected 1..%d)", num_ranks, ZERO_MAX_RANKS);
    }
    memset(layout, 0, sizeof(*layout));
    layout->num_ranks = num_ranks;
    layout->num_layers = cfg->num_layers;
    gpt2_param_sizes(cfg, layout->tensor_sizes);
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        layout->tensor_offsets[i] = layout->num_parameters;
        layout->num_parameters += layout->tensor_sizes[i];
    }
    size_t unit = (size_t)num_ranks * ZERO_ALIGN;
    size_t units = (layout->num_parameters + unit - 1) / unit;
    layout->shard_size = units * ZERO_ALIGN;
    layout->padded_total = layout->shard_size * (size_t)num_ranks;
}

// the real elements rank r owns (the padding excluded; empty when r holds only padding)
static inline ZeroRange zero_rank_range(const ZeroLayout* layout, int rank) {
    ZeroRange range;
    size_t begin = (size_t)rank * layout->shard_size;
    size_t end = begin + layout->shard_size;
    range.begin = begin < layout->num_parameters ? begin : layout->num_parameters;
    range.end = end < layout->num_parameters ? end : layout->num_parameters;
    return range;
}

// the rank that owns flat element `index` (index < padded_total)
static inline int zero_owner(const ZeroLayout* layout, size_t index) {
    return (int)(index / layout->shard_size);
}

// 1 and the part when rank r owns some of tensor i, else 0
static inline int zero_tensor_part(const ZeroLayout* layout, int rank, int tensor, ZeroPart* part) {
    ZeroRange range = zero_rank_range(layout, rank);
    size_t tensor_begin = layout->tensor_offsets[tensor];
    size_t tensor_end = tensor_begin + layout->tensor_sizes[tensor];
    size_t begin = range.begin > tensor_begin ? range.begin : tensor_begin;
    size_t end = range.end < tensor_end ? range.end : tensor_end;
    if (begin >= end) { return 0; }
    part->begin = begin - tensor_begin;
    part->end = end - tensor_begin;
    part->shard_offset = begin - (size_t)rank * layout->shard_size;
    part->block_aligned = part->begin % QUANT8_BLOCK == 0;
    return 1;
}

// ----------------------------------------------------------------------------
// the optimizer's calls

// tensors whose per-layer slices are FP8 weights (qkvw, attprojw, fcw, fcprojw)
static inline int zero_tensor_is_matmul_weight(int tensor) {
    return tensor == PARAM_QKVW || tensor == PARAM_ATTPROJW || tensor == PARAM_FCW || tensor == PARAM_FCPROJW;
}

/*
The update ranges cut each matmul weight at its layers' boundaries (the optimizer writes one
FP8 amax per layer's weight), and a block of 256 8-bit states cannot be split between two
calls, so an 8-bit matmul weight's per-layer slice must be a whole number of blocks. A width C
that is a multiple of 16 always gives that (C^2, 3C^2, 4C^2); the GPU trainer refuses another
(a checkpoint's C = 72: qkvw and attprojw) at startup, naming the tensor, instead of dying at
its first update. Returns the first such tensor under `selection`, or -1.
*/
static inline int zero_8bit_weight_off_block_grid(const GPT2Config* cfg, Adamw8Selection selection) {
    for (int t = 0; t < NUM_PARAMETER_TENSORS; t++) {
        if (zero_tensor_is_matmul_weight(t) && adamw8_tensor_is_8bit(cfg, t, selection) &&
            gpt2_param_layer_elements(cfg, t) % QUANT8_BLOCK != 0) {
            return t;
        }
    }
    return -1;
}

/*
A rank's part of an 8-bit tensor must start on the tensor's block grid (adamw8_layout_window):
the shard boundaries are multiples of 256 of the flat vector, so that holds wherever a tensor
starts on the grid, as every tensor of d12, d24 and d36 does, and all but lnfb of d48. Other
shapes (a checkpoint with L = 3, C = 384: ln1w's L C = 1152 puts every later tensor off it)
can cut an 8-bit tensor inside a block for some number of ranks. The trainer asks this at
startup, on every rank alike, so all of them stop with the same line before any collective
(the rank whose part it was had died at its first update, the others in a gather). Returns
the first such tensor under `selection` (and the rank and element where its part begins), or -1.
*/
static inline int zero_8bit_part_off_block_grid(const GPT2Config* cfg, int num_ranks, Adamw8Selection selection,
                                                int* rank, size_t* element) {
    ZeroLayout layout;
    zero_layout_init(&layout, cfg, num_ranks);
    for (int t = 0; t < NUM_PARAMETER_TENSORS; t++) {
        if (!adamw8_tensor_is_8bit(cfg, t, selection)) { continue; }
        for (int r = 0; r < num_ranks; r++) {
            ZeroPart part;
            if (zero_tensor_part(&layout, r, t, &part) && !part.block_aligned) {
                *rank = r;
                *element = part.begin;
                return t;
            }
        }
    }
    return -1;
}

// one optimizer call: elements [offset, offset + n) of a rank's part of `tensor` (offset in
// the part's coordinates), all in layer `layer`'s slice (-1: a whole-model tensor)
typedef struct {
    int tensor;
    int layer;
    size_t offset;
    size_t n;
} ZeroUpdateRange;

/*
The calls that update rank r's part of `tensor`: the part itself, cut at layer boundaries for
a matmul weight (each layer's slice is its own FP8 tensor, with its own amax); other per-layer
tensors are one call with layer set to the part's first layer. `ranges` holds L entries.
Returns the count (0 when the rank owns none of the tensor).
*/
static inline int zero_update_ranges(const ZeroLayout* layout, int rank, int tensor, ZeroUpdateRange* ranges) {
    ZeroPart part;
    if (!zero_tensor_part(layout, rank, tensor, &part)) { return 0; }
    if (!zero_tensor_is_per_layer(tensor)) {
        ranges[0].tensor = tensor;
        ranges[0].layer = -1;
        ranges[0].offset = 0;
        ranges[0].n = part.end - part.begin;
        return 1;
    }
    size_t slice = layout->tensor_sizes[tensor] / (size_t)layout->num_layers;
    int count = 0;
    size_t at = part.begin;
    while (at < part.end) {
        int layer = (int)(at / slice);
        size_t end = zero_tensor_is_matmul_weight(tensor) && (size_t)(layer + 1) * slice < part.end ? (size_t)(layer + 1) * slice
                                                                                                        : part.end;
        ranges[count].tensor = tensor;
        ranges[count].layer = layer;
        ranges[count].offset = at - part.begin;
        ranges[count].n = end - at;
        count++;
        at = end;
    }
    return count;
}

// ----------------------------------------------------------------------------
// chunks: the units of the gradient reduction, in the order backward completes them

static inline int zero_num_chunks(const ZeroLayout* layout) { return layout->num_layers + 1; }

// the most pieces one chunk can have: each boundary inside the chunk adds one
static inline int zero_chunk_max_pieces(const ZeroLayout* layout) {
    return ZERO_LAYER_TENSORS + layout->num_ranks - 1;
}

// the flat range of slice (tensor, layer); layer -1 for the whole tensor
static inline ZeroRange zero_slice_range(const ZeroLayout* layout, int tensor, int layer) {
    ZeroRange range;
    size_t n = layout->tensor_sizes[tensor];
    range.begin = layout->tensor_offsets[tensor];
    if (layer >= 0) {
        n /= (size_t)layout->num_layers;
        range.begin += (size_t)layer * n;
    }
    range.end = range.begin + n;
    return range;
}

// appends the owner-pieces of one slice to `pieces`; returns the new count
static inline int zero_slice_pieces(const ZeroLayout* layout, int tensor, int layer, ZeroPiece* pieces, int count) {
    ZeroRange slice = zero_slice_range(layout, tensor, layer);
    size_t at = slice.begin;
    while (at < slice.end) {
        int owner = zero_owner(layout, at);
        size_t owner_end = (size_t)(owner + 1) * layout->shard_size;
        ZeroPiece piece;
        piece.tensor = tensor;
        piece.layer = layer;
        piece.begin = at;
        piece.end = owner_end < slice.end ? owner_end : slice.end;
        piece.owner = owner;
        pieces[count++] = piece;
        at = piece.end;
    }
    return count;
}

/*
The pieces of chunk c (c < L: layer c's twelve slices; c == L: wte, wpe, lnfw, lnfb), in
tensor order. `pieces` holds zero_chunk_max_pieces(layout) entries. Returns the count.
*/
static inline int zero_chunk_pieces(const ZeroLayout* layout, int chunk, ZeroPiece* pieces) {
    if (chunk < 0 || chunk > layout->num_layers) {
        llm8_die("ZeRO: chunk %d out of range (expected 0..%d)", chunk, layout->num_layers);
    }
    int count = 0;
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        int per_layer = zero_tensor_is_per_layer(i);
        if (chunk < layout->num_layers && per_layer) {
            count = zero_slice_pieces(layout, i, chunk, pieces, count);
        } else if (chunk == layout->num_layers && !per_layer) {
            count = zero_slice_pieces(layout, i, -1, pieces, count);
        }
    }
    return count;
}

// elements of chunk c that rank r receives (reduces into its shard); rank -1: all of them
static inline size_t zero_chunk_elements(const ZeroLayout* layout, int chunk, int rank) {
    ZeroPiece* pieces = (ZeroPiece*)mallocCheck((size_t)zero_chunk_max_pieces(layout) * sizeof(ZeroPiece));
    int count = zero_chunk_pieces(layout, chunk, pieces);
    size_t total = 0;
    for (int p = 0; p < count; p++) {
        if (rank < 0 || pieces[p].owner == rank) { total += pieces[p].end - pieces[p].begin; }
    }
    free(pieces);
    return total;
}

// ----------------------------------------------------------------------------
// the FP8 weight all-gather

// the weight slices gathered as FP8 codes, in Fp8 linear order: per layer qkvw, attprojw,
// fcw, fcprojw (lm_head is cast locally from the gathered bf16 wte); `slices` holds 4 L
// entries (begin/end flat, owner unused). Returns the count.
static inline int zero_fp8_weight_slices(const ZeroLayout* layout, ZeroPiece* slices) {
    static const int matmul_tensors[ZERO_MATMUL_KINDS] = {PARAM_QKVW, PARAM_ATTPROJW, PARAM_FCW, PARAM_FCPROJW};
    int count = 0;
    for (int l = 0; l < layout->num_layers; l++) {
        for (int k = 0; k < ZERO_MATMUL_KINDS; k++) {
            ZeroRange range = zero_slice_range(layout, matmul_tensors[k], l);
            slices[count].tensor = matmul_tensors[k];
            slices[count].layer = l;
            slices[count].begin = range.begin;
            slices[count].end = range.end;
            slices[count].owner = -1;
            count++;
        }
    }
    return count;
}

// amax of params[begin, end) (0 for an empty range), as each rank computes it for its part
static inline float zero_range_amax(const float* params, size_t begin, size_t end) {
    float amax = 0.0f;
    for (size_t j = begin; j < end; j++) {
        if (fp8_amax_bits(params[j]) > fp8_amax_bits(amax)) { amax = bits_as_float(fp8_amax_bits(params[j])); }
    }
    return amax;
}

/*
The ZeRO-1 FP8 weight gather with `layout->num_ranks` simulated ranks, in the order the GPU
does it: (1) each rank the amax of its part of every slice, (2) the MAX over ranks (the
all-reduce), (3) scale = fp8_scale_from_amax(global amax), (4) each rank casts its part,
(5) the parts land at their flat positions in `codes` (the all-gather; codes holds
num_parameters bytes, only the slices' bytes are written). `scales` gets one per slice.
`params` is the full flat fp32 vector (in the trainer each rank reads only its range).
*/
static inline void zero_simulate_fp8_weight_gather(const ZeroLayout* layout, const float* params,
                                                   const ZeroPiece* slices, int num_slices, Fp8Format format,
                                                   int margin, float* scales, uint8_t* codes) {
    float* rank_amax = (float*)mallocCheck((size_t)layout->num_ranks * num_slices * sizeof(float));
    for (int r = 0; r < layout->num_ranks; r++) {
        ZeroRange range = zero_rank_range(layout, r);
        for (int s = 0; s < num_slices; s++) {
            size_t begin = slices[s].begin > range.begin ? slices[s].begin : range.begin;
            size_t end = slices[s].end < range.end ? slices[s].end : range.end;
            rank_amax[(size_t)r * num_slices + s] = begin < end ? zero_range_amax(params, begin, end) : 0.0f;
        }
    }
    for (int s = 0; s < num_slices; s++) {
        float global_amax = 0.0f;
        for (int r = 0; r < layout->num_ranks; r++) {
            float amax = rank_amax[(size_t)r * num_slices + s];
            if (fp8_amax_bits(amax) > fp8_amax_bits(global_amax)) { global_amax = amax; }
        }
        scales[s] = fp8_scale_from_amax(global_amax, fp8_max(format), margin);
    }
    for (int r = 0; r < layout->num_ranks; r++) {
        ZeroRange range = zero_rank_range(layout, r);
        for (int s = 0; s < num_slices; s++) {
            size_t begin = slices[s].begin > range.begin ? slices[s].begin : range.begin;
            size_t end = slices[s].end < range.end ? slices[s].end : range.end;
            for (size_t j = begin; j < end; j++) { codes[j] = fp8_quantize(params[j], scales[s], format); }
        }
    }
    free(rank_amax);
}

// K (the columns) of an FP8 weight slice [OC][K] of `tensor`: C, or 4C for fcprojw
static inline int zero_weight_cols(const ZeroLayout* layout, int tensor) {
    int channels = (int)(layout->tensor_sizes[PARAM_LN1W] / (size_t)layout->num_layers);
    return tensor == PARAM_FCPROJW ? 4 * channels : channels;
}

// fold |params[j]| for flat j in [begin, end) of a weight slice (flat slice_begin, K = cols)
// into its blocks' amaxes block_amax[fp8_weight_block_of(...)]: a rank's partial block amax
static inline void zero_fold_block_amax(const float* params, size_t begin, size_t end, size_t slice_begin, int cols,
                                        float* block_amax) {
    for (size_t j = begin; j < end; j++) {
        float* amax = &block_amax[fp8_weight_block_of(j - slice_begin, cols)];
        if (fp8_amax_bits(params[j]) > fp8_amax_bits(*amax)) { *amax = bits_as_float(fp8_amax_bits(params[j])); }
    }
}

/*
The same gather under the block recipe (one scale per 128x128 block): a rank's flat part
cuts blocks, so (1) each rank folds its part of every slice into a per-block partial amax
array (0 where it owns nothing), (2) the MAX over ranks of the whole array (one all-reduce),
(3) every block's scale = fp8_weight_block_scale(global block amax), (4) each rank casts
its part with its elements' block scales, (5) the codes land at their flat positions.
`block_scales` gets the slices' blocks back to back (fp8_weight_blocks each, in slice
order); `slices` are the block linears' weights (zero_fp8_weight_slices).
*/
static inline void zero_simulate_fp8_block_weight_gather(const ZeroLayout* layout, const float* params,
                                                         const ZeroPiece* slices, int num_slices, float* block_scales,
                                                         uint8_t* codes) {
    size_t total_blocks = 0;
    for (int s = 0; s < num_slices; s++) {
        int cols = zero_weight_cols(layout, slices[s].tensor);
        total_blocks += fp8_weight_blocks((int)((slices[s].end - slices[s].begin) / (size_t)cols), cols);
    }
    float* rank_amax = (float*)mallocCheck((size_t)layout->num_ranks * total_blocks * sizeof(float));
    for (int r = 0; r < layout->num_ranks; r++) {
        ZeroRange range = zero_rank_range(layout, r);
        float* partial = rank_amax + (size_t)r * total_blocks;
        size_t first_block = 0;
        for (int s = 0; s < num_slices; s++) {
            int cols = zero_weight_cols(layout, slices[s].tensor);
            size_t blocks = fp8_weight_blocks((int)((slices[s].end - slices[s].begin) / (size_t)cols), cols);
            for (size_t b = 0; b < blocks; b++) { partial[first_block + b] = 0.0f; }
            size_t begin = slices[s].begin > range.begin ? slices[s].begin : range.begin;
            size_t end = slices[s].end < range.end ? slices[s].end : range.end;
            if (begin < end) { zero_fold_block_amax(params, begin, end, slices[s].begin, cols, partial + first_block); }
            first_block += blocks;
        }
    }
    for (size_t b = 0; b < total_blocks; b++) {
        float global_amax = 0.0f;
        for (int r = 0; r < layout->num_ranks; r++) {
            float amax = rank_amax[(size_t)r * total_blocks + b];
            if (fp8_amax_bits(amax) > fp8_amax_bits(global_amax)) { global_amax = amax; }
        }
        block_scales[b] = fp8_weight_block_scale(global_amax);
    }
    for (int r = 0; r < layout->num_ranks; r++) {
        ZeroRange range = zero_rank_range(layout, r);
        size_t first_block = 0;
        for (int s = 0; s < num_slices; s++) {
            int cols = zero_weight_cols(layout, slices[s].tensor);
            size_t begin = slices[s].begin > range.begin ? slices[s].begin : range.begin;
            size_t end = slices[s].end < range.end ? slices[s].end : range.end;
            for (size_t j = begin; j < end; j++) {
                float scale = block_scales[first_block + fp8_weight_block_of(j - slices[s].begin, cols)];
                codes[j] = fp8_quantize(params[j], scale, FP8_E4M3);
            }
            first_block += fp8_weight_blocks((int)((slices[s].end - slices[s].begin) / (size_t)cols), cols);
        }
    }
    free(rank_amax);
}

// ----------------------------------------------------------------------------
// ZeRO-3: the parts of the flat parameter buffer a rank keeps in memory

// the most ranges zero3_resident_ranges returns: the non-matmul tensors, the padding, the owned range
#define ZERO3_MAX_RESIDENT_RANGES (NUM_PARAMETER_TENSORS - ZERO_MATMUL_KINDS + 2)

// the byte size of the flat buffer of padded_total elements, rounded up to the granule
static inline size_t zero3_buffer_bytes(const ZeroLayout* layout, size_t element_bytes, size_t granule_bytes) {
    size_t bytes = layout->padded_total * element_bytes;
    return (bytes + granule_bytes - 1) / granule_bytes * granule_bytes;
}

/*
The byte ranges [begin, end) of the flat parameter buffer (element i at byte i * element_bytes,
zero3_buffer_bytes in all) that rank `rank` must have backed by memory under ZeRO-3:
- every tensor that is not a block matmul weight (wte, wpe, layernorms, biases), which every
  rank reads whole;
- the rank's own range (zero_rank_range) of the matmul weights, which its optimizer updates;
- the padding after the last tensor (N * S - P elements, right after lnfb: free to include,
  and a kernel over the last rank's whole shard may touch it).
NOT resident: the other ranks' parts of qkvw, attprojw, fcw and fcprojw, except what the
rounding pulls in. Each range is rounded OUTWARD to multiples of granule_bytes (a mapping's
unit; an end rounds to at most zero3_buffer_bytes, the buffer's rounded end), then the ranges
are sorted and merged where they overlap or touch, so the result is sorted, disjoint,
non-touching and granule-aligned. Returns the count (at most ZERO3_MAX_RESIDENT_RANGES);
dies when `out` (max_out entries) is too small.
*/
static inline int zero3_resident_ranges(const ZeroLayout* layout, int rank, size_t element_bytes, size_t granule_bytes,
                                        ZeroRange* out, int max_out) {
    if (element_bytes == 0 || granule_bytes == 0) {
        llm8_die("ZeRO-3 resident ranges: element size %zu and granule %zu bytes (expected both > 0)", element_bytes,
                 granule_bytes);
    }
    if (rank < 0 || rank >= layout->num_ranks) {
        llm8_die("ZeRO-3 resident ranges: rank %d (expected 0..%d)", rank, layout->num_ranks - 1);
    }
    ZeroRange elements[ZERO3_MAX_RESIDENT_RANGES];
    int count = 0;
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        if (zero_tensor_is_matmul_weight(i)) { continue; }
        elements[count].begin = layout->tensor_offsets[i];
        elements[count].end = layout->tensor_offsets[i] + layout->tensor_sizes[i];
        count++;
    }
    elements[count].begin = layout->num_parameters;
    elements[count].end = layout->padded_total;
    count++;
    elements[count++] = zero_rank_range(layout, rank);
    // to granule-aligned bytes, sorted by begin (insertion: a handful of ranges, all but the
    // owned one in order), the empty ones dropped (no padding, a rank of padding only)
    ZeroRange bytes[ZERO3_MAX_RESIDENT_RANGES];
    int num_bytes = 0;
    for (int k = 0; k < count; k++) {
        if (elements[k].begin >= elements[k].end) { continue; }
        ZeroRange range;
        range.begin = elements[k].begin * element_bytes / granule_bytes * granule_bytes;
        range.end = (elements[k].end * element_bytes + granule_bytes - 1) / granule_bytes * granule_bytes;
        int at = num_bytes++;
        while (at > 0 && bytes[at - 1].begin > range.begin) {
            bytes[at] = bytes[at - 1];
            at--;
        }
        bytes[at] = range;
    }
    int merged = 0;
    for (int k = 0; k < num_bytes; k++) {
        if (merged > 0 && bytes[k].begin <= bytes[merged - 1].end) {
            if (bytes[k].end > bytes[merged - 1].end) { bytes[merged - 1].end = bytes[k].end; }
        } else {
            bytes[merged++] = bytes[k];
        }
    }
    if (merged > max_out) {
        llm8_die("ZeRO-3 resident ranges: rank %d needs %d ranges, room for %d (size the array with "
                 "ZERO3_MAX_RESIDENT_RANGES)", rank, merged, max_out);
    }
    memcpy(out, bytes, (size_t)merged * sizeof(ZeroRange));
    return merged;
}

// the bytes the ranges cover (what a rank maps)
static inline size_t zero3_resident_bytes(const ZeroRange* ranges, int count) {
    size_t total = 0;
    for (int k = 0; k < count; k++) { total += ranges[k].end - ranges[k].begin; }
    return total;
}

#endif // LLMC_ZERO_H
