/*
fp8_cast.cuh: casts of bf16 (or fp32) tensors to FP8 for the cuBLASLt GEMMs, each writing
the tensor and its transpose in one pass, plus the amax pass of current scaling.

Why it is shaped so:
- cuBLASLt's FP8 GEMMs on Hopper take both operands contiguous along K (DESIGN.md section
  3). For y = x W^T that is x itself in the forward, but wgrad (dW = dy^T x, K = tokens)
  needs x^T and dy^T, and dgrad needs W^T. So every cast that feeds a wgrad or a dgrad
  writes the row-major codes and the transposed codes from one read of the input.
- One tile kernel does every cast: a block stages a 128 x 128 tile in shared memory (after
  a transform: identity, GELU or its derivative times dy in gelu.cuh, or the layernorm output in
  layernorm.cuh; optionally summing its columns for the bias gradient), then writes the row-major codes
  (16 bytes per thread, a warp covers 4 whole 128-byte tile rows) and the transposed
  codes (a thread packs 32 rows of one column into two 16-byte stores: each store fills
  a whole 32-byte sector of x^T; a warp reads 32 neighbouring columns of one staged row,
  so shared memory has no bank conflicts). 128 x 128 is also exactly the tile of the block
  recipe: in one tile the kernel finds the amax of every 1 x 128 row piece (x, dy in the
  forward and dgrad), of every 128 x 1 column piece (x^T, dy^T in wgrad), and of the whole
  128 x 128 block (weights), so the block recipe costs no extra pass.
- What bounds it is not settled. The 2026-11-26 H200 benchmark put the casts at 2.4 to 3
  times their memory floor, and the SASS showed staging issuing one 16-byte load per thread
  and waiting for it before the next. By 2026-11-30 staging had 4 loads in flight (64
  registers, 4 blocks an SM) and the code passes were slimmer: GELU's cast went from 6.03 to
  4.25 ms a step, but the plain attention-output cast stayed at 1.22 ms (about 2 TB/s at 4
  bytes an element: 2 in, a code and a transposed code out), slower per tile than GELU's
  with about 14 instructions an element against about 24 (the SASS; about 1 µs of an SM's
  issue a tile, against 4.3 µs measured). Neither more loads in flight per block nor fewer
  instructions moved it; what a block still did not do was overlap its loads with its own
  casting (with 4 blocks an SM, the others had to), and each tile paid a block launch and a
  commit of its statistics. The byte transpose below, with the same transposed stores, moved
  its bytes at about 3 TB/s (lm_head's FP8 backward row less bench_gemm's GEMMs, 2026-11-30).
  So, since 2026-12-01 (not yet measured):
  - the grid is what the GPU holds at once (FP8_TILE_BLOCKS_PER_SM blocks an SM), and a block
    takes tile after tile; its staging copies go to shared memory with cp.async, a thread's
    whole share of a tile in flight at once and no registers held, and with two staging
    buffers (Fp8TileStaging) the next tile's copies are in flight while this one is cast;
    each block commits its statistics once, not once a tile;
  - a plain cast stages the copied bits as they are; a transform converts its results back
    to bf16 two per instruction (fp8_stage_pack) in place, and reads what else it needs
    (layernorm's weight and bias 16 bytes at a time; GELU backward's pre-activation copied in
    beside the tile);
  - the code passes convert two values per instruction (fp8_quantize2) and take the counts
    8 at a time (fp8_tally_counts8), the amax once while staging; where nothing can saturate,
    the flushes are counted from the zeros of the packed codes and values, a word at a time;
  - per tensor, one barrier vote (__syncthreads_or) tells the tile whether any of its values
    can saturate under the known scale (exactly, from the amaxes: fp8_may_saturate); where
    none can, the counts test each code for a flush only.
  Whether this helps is the next GPU benchmark's to say (dev/bench/compare_bench.py sets its
  rows beside 2026-11-30's); if it does not, the one-tile-a-block kernel is 7e318fa's parent.
- Scales: the per-tensor recipes read the scale from the tensor's Fp8TensorScaling on the
  device and record amax and counts in its Fp8CastRecord (fp8_scaling.cuh). Delayed: one
  pass (cast with the history's scale, record this amax). Current (gradients under -fg
  current, weights under -fw current, and a delayed tensor's first use): amax pass, update
  kernel, cast pass; the input is read twice because the scale must be known before the
  first code is written. Current with power-of-two scales (gradients under -fg pow2, after the
  first backward): the scale changes only where the amax crosses a power of two, so one pass
  casts with the last use's scale as a prediction, the update kernel gives the verdict, and a
  recast launch reads the input again only where the prediction failed (FP8_RECORD_PREDICTED,
  FP8_RECORD_RECAST): current scaling's codes, at about delayed's bytes.
- Codes are fp8_quantize(value, scale) from fp8.h, where value is the tensor as stored in
  bf16 (the rounded GELU or layernorm output, as the bf16 path sees it) or the fp32 weight:
  bit-exact with the host encode the CPU reference and the tests use.
- Under -fe 1 fc's forward GEMM writes fcproj's x codes itself (cuBLASLt's GELU epilogue with
  an E4M3 output): fp8_gemm_codes_begin hands it the scale, and fp8_transpose_codes_counted
  makes x^T from the codes and records the cast from them (Fp8GemmScalars says how exactly).
- The delayed weight cast (-fw delayed) writes W's codes inside the optimizer pass
  (llmc/adamw.cuh, adamw8.cuh); here it takes only W^T from them (fp8_transpose_codes, a byte
  per element) and, after a resume, the codes rebuilt with their saved scale (fp8_weight_codes).
- ZeRO's sharded weight casts (zero_comm.cuh): each rank casts its flat part of W. Per
  tensor, with the all-reduced amax's scale (fp8_cast_weight_part). Block recipe: a flat part
  cuts 128x128 blocks, so a rank folds its part into partial block amaxes
  (fp8_block_amax_part), the caller all-reduces them (MAX), and fp8_cast_weight_block_part
  writes every block's scale_inv for W and W^T and the part's codes, with the block scale
  the tile kernel uses (fp8_weight_block_scale): the whole-weight cast's bits.
Shapes: rows and cols are multiples of 16 (cuBLASLt FP8's rule for every GEMM dimension),
so tile edges fall on 16-byte boundaries; the last tile in each direction may be short.
*/
#ifndef LLMC_FP8_CAST_CUH
#define LLMC_FP8_CAST_CUH

#include <stdint.h>
#ifndef CUDASIM  // cudasim.h emulates the three pipeline primitives the tile cast uses
#include <cuda_pipeline_primitives.h>
#endif
#include "cuda_common.h"
#include "cuda_utils.cuh"
#include "fp8.h"
#include "fp8_scaling.h"
#include "fp8_scaling.cuh"

#define FP8_TILE 128
#define FP8_TILE_THREADS 256
#define FP8_AMAX_BATCH 4  // 16-byte loads a thread of the amax pass has in flight
#define FP8_BLOCK_SCALE_ALIGN 4  // the 128x128 scale rows are padded to 16 bytes (4 floats)

/*
The bias gradient's fixed summation order, shared by matmul.cuh's dbias kernel and the tile
cast's column sums (the one-pass dy of a known scale: -fg delayed, the block recipe), so both give the same bits: rows are
summed in chunks of DBIAS_ROWS_PER_CHUNK (one tile) into one fp32 partial per chunk and
column; within a chunk, lane l of DBIAS_ROW_LANES sums rows l, l + DBIAS_ROW_LANES, ... in
order from 0.0f, and the lanes are then added in lane order from 0.0f.
*/
#define DBIAS_ROWS_PER_CHUNK FP8_TILE
#define DBIAS_ROW_LANES 8

typedef enum {
    FP8_SCALING_TENSOR = 0,     // one scale per tensor, from its Fp8TensorScaling (delayed or current)
    FP8_SCALING_ROWS_1x128 = 1, // block recipe, activations and gradients: one scale per 1x128 piece along K
    FP8_SCALING_BLOCKS_128x128 = 2, // block recipe, weights: one scale per 128x128 block
} Fp8Scaling;

/*
Where one cast of a [rows][cols] tensor goes. codes [rows][cols] and codes_t [cols][rows]
(either may be NULL). TENSOR: state gives the scale, record gets amax, counts and the scale
used. Block recipes (no state): scale_inv / scale_inv_t receive the dequantization scales of
codes / codes_t in cuBLASLt's layouts (fp8_block_scale_floats), and record the statistics.
*/
typedef struct {
    Fp8Format format;
    Fp8Scaling scaling;
    uint8_t* codes;
    uint8_t* codes_t;
    Fp8TensorScaling* state;
    Fp8CastRecord* record;
    float* scale_inv;
    float* scale_inv_t;
    Fp8Prediction* prediction;  // per tensor, for FP8_RECORD_PREDICTED and _RECAST (else NULL)
} Fp8CastOutput;

/*
What a tile cast writes into its Fp8CastRecord:
- FP8_RECORD_COUNTS: the statistics (elements, saturated, flushed; the interval's amax and
  smallest scale) and, per tensor, the scale it used, which the GEMMs read; this use's amax
  is the amax pass's (current scaling) or is not folded into a state (block recipes);
- FP8_RECORD_AMAX: also this use's amax, into record->amax_bits for the state update after it
  (the one-pass cast with a known per-tensor scale: delayed);
- FP8_RECORD_NOTHING, a replay: the backward casts an activation again whose x^T the forward
  did not keep (-r, fp8_model.cuh), per tensor with the scale the forward's cast used (the
  record's, which the wgrad GEMM reads as x^T's dequantization scale), and records nothing,
  so the statistics and the amax histories see each training use once. The block recipe's
  tiles find the same amaxes, so the same scales, as the forward's cast did.
- FP8_RECORD_PREDICTED (per tensor, with out.prediction): FP8_RECORD_AMAX's cast with the
  state's scale taken as a prediction of this use's (CURRENT_POW2 output gradients: the last
  use's power of two), its counts held in out.prediction until fp8_scaling_settle_prediction
  folds the amax into the state and keeps them, or drops them and sets out.prediction->recast;
- FP8_RECORD_RECAST (the same): the same launch again, after that verdict: where recast is 0
  every block returns at once (a launch, no bytes); else FP8_RECORD_COUNTS' cast with the
  state's new scale, over every output the predicted cast wrote (codes, column sums,
  transformed_out: the same bits where they do not depend on the scale).
*/
typedef enum {
    FP8_RECORD_COUNTS = 0,
    FP8_RECORD_AMAX = 1,
    FP8_RECORD_NOTHING = 2,
    FP8_RECORD_PREDICTED = 3,
    FP8_RECORD_RECAST = 4,
} Fp8CastRecording;

/*
One weight of a batched launch (fp8_cast_weights_batched, fp8_transpose_codes_batched): where
its cast goes, and where its input starts. The weights of one linear kind share a shape in
every layer, so one launch covers them all, blockIdx.z picking the weight: the per-step weight
casts at d12 are then 4 launches instead of 2 x 48 tiny ones, each of a few hundred tiles at
most, under one wave of the GPU (the H200 benchmark measured 0.92 ms for their 0.11 ms floor).
*/
typedef struct {
    Fp8CastOutput out;
    size_t in_offset;  // the weight's first element, from the input base the launch is given
} Fp8CastJob;

// where the tile kernel finds its output and input offset: a launch's one cast (in the kernel's
// parameters, which the kernel only reads, so they stay in the constant bank and cost no
// registers), or a batch's job blockIdx.z, copied once into shared memory (read from global
// memory, its fields took registers the 64-register cap of that time did not have: it spilled)
struct Fp8OneCast {
    Fp8CastOutput out;
    __device__ __forceinline__ const Fp8CastOutput& output() const { return out; }
    __device__ __forceinline__ size_t input_offset() const { return 0; }
};
struct Fp8BatchedCasts {
    const Fp8CastJob* jobs;
    __device__ __forceinline__ const Fp8CastOutput& output() const {  // every thread of the block, once
        __shared__ Fp8CastOutput job_out;
        if (threadIdx.x == 0) { job_out = jobs[blockIdx.z].out; }
        __syncthreads();
        return job_out;
    }
    __device__ __forceinline__ size_t input_offset() const { return jobs[blockIdx.z].in_offset; }
};

// floats per row of 128x128 block scales over a K of k elements: ceil(k / 128), padded to 16 bytes
__host__ __device__ inline int fp8_block_scale_ld(int k) {
    int blocks = (k + FP8_TILE - 1) / FP8_TILE;
    return (blocks + FP8_BLOCK_SCALE_ALIGN - 1) / FP8_BLOCK_SCALE_ALIGN * FP8_BLOCK_SCALE_ALIGN;
}

/*
Floats of the dequantization scales of codes [rows][cols] whose K is cols, as cuBLASLt
reads them on Hopper:
- ROWS_1x128 (CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F): one per row per 128 columns,
  rows fastest: scale_inv[(col / 128) * rows + row];
- BLOCKS_128x128 (CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F): one per 128x128 block,
  K blocks fastest, each row of blocks padded to 4 floats (16 bytes):
  scale_inv[(row / 128) * round_up(ceil(cols / 128), 4) + col / 128].
(The layouts PyTorch's _scaled_mm hands to cuBLASLt for its 1x128 and 128x128 modes.)
*/
static inline size_t fp8_block_scale_floats(Fp8Scaling scaling, int rows, int cols) {
    if (scaling == FP8_SCALING_ROWS_1x128) { return (size_t)ceil_div(cols, FP8_TILE) * (size_t)rows; }
    if (scaling == FP8_SCALING_BLOCKS_128x128) {
        return (size_t)ceil_div(rows, FP8_TILE) * (size_t)fp8_block_scale_ld(cols);
    }
    return 0;
}

static inline void fp8_cast_check(const Fp8CastOutput* out, int rows, int cols, const char* who) {
    if (rows <= 0 || cols <= 0 || rows % 16 != 0 || cols % 16 != 0) {
        llm8_die("%s: rows=%d, cols=%d: each must be a positive multiple of 16 (cuBLASLt FP8 GEMM dimensions)",
                 who, rows, cols);
    }
    if (out->codes == NULL && out->codes_t == NULL) { llm8_die("%s: neither codes nor codes_t given", who); }
    if (out->record == NULL) { llm8_die("%s: no Fp8CastRecord given", who); }
    if (out->scaling == FP8_SCALING_TENSOR) {
        if (out->state == NULL) { llm8_die("%s: per-tensor scaling without an Fp8TensorScaling state", who); }
    } else {
        if (out->format != FP8_E4M3) { llm8_die("%s: the block recipe is E4M3 throughout, got %s", who, fp8_format_name(out->format)); }
        if ((out->codes != NULL && out->scale_inv == NULL) || (out->codes_t != NULL && out->scale_inv_t == NULL)) {
            llm8_die("%s: the block recipe needs scale_inv for every code array it writes", who);
        }
    }
    const void* pointers[2] = {out->codes, out->codes_t};
    for (int i = 0; i < 2; i++) {
        if (((uintptr_t)pointers[i]) % 16 != 0) { llm8_die("%s: code array %p is not 16-byte aligned", who, pointers[i]); }
    }
}

// ----------------------------------------------------------------------------
// staging types: the tile holds the tensor as stored (bf16), or the fp32 master weight

__device__ __forceinline__ float fp8_stage_to_float(floatX x) { return __bfloat162float(x); }
__device__ __forceinline__ float fp8_stage_to_float(float x) { return x; }
// element k of a staged 16-byte vector as a float (bf16: x128_float, an instruction each)
__device__ __forceinline__ float fp8_stage_to_float(const x128& v, int k) { return x128_float(v, k); }
__device__ __forceinline__ float fp8_stage_to_float(const f128& v, int k) { return v[k]; }
template <class T> __device__ __forceinline__ T fp8_stage_from_float(float x);
template <> __device__ __forceinline__ floatX fp8_stage_from_float<floatX>(float x) { return __float2bfloat16_rn(x); }
template <> __device__ __forceinline__ float fp8_stage_from_float<float>(float x) { return x; }

/*
Transforms: what a cast applies to each stored element before it stages and casts it.
- stage(x, row, col, aux): the 16-byte vector x[0..N) of row `row`, columns col..col+N, as
  floats, transformed in place. Vector-wide, so a transform that reads other tensors at the
  same positions (layernorm.cuh's weight and bias) loads them 16 bytes at a time, and row
  statistics once per vector.
- reads_aux: the transform reads a second bf16 tensor of the input's shape at the staged
  positions (GELU backward's pre-activation), at aux_at(row, col). The tile cast loads it in
  the batch with the input and hands it to stage as aux (zeros otherwise): loaded inside stage,
  each vector's load was waited for before the next was issued.
- operator()(x): element-wise transforms also serve the amax pass, which has no positions.
- passes_through: staging keeps the loaded bits as they are (no conversion to float and
  back), the plain cast's case.
*/
struct Fp8Identity {
    static constexpr bool passes_through = true;
    static constexpr bool reads_aux = false;
    __device__ __forceinline__ float operator()(float x) const { return x; }
};

// transformed values as staged: bf16 (x128_from_floats, two per conversion), or fp32 as they are
template <class In> __device__ __forceinline__ Packed128<In> fp8_stage_pack(const float (&x)[Packed128<In>::size]);
template <> __device__ __forceinline__ Packed128<floatX> fp8_stage_pack<floatX>(const float (&x)[x128::size]) {
    return x128_from_floats(x);
}
template <> __device__ __forceinline__ f128 fp8_stage_pack<float>(const float (&x)[f128::size]) {
    f128 packed;
    for (int k = 0; k < f128::size; k++) { packed[k] = x[k]; }
    return packed;
}

// one loaded 16-byte vector of row `row` from column `col`, transformed as the tile stages it
template <class In, class Transform>
__device__ __forceinline__ Packed128<In> fp8_stage_vector(Packed128<In> loaded, const Transform& transform, int row, int col,
                                                          x128 aux) {
    if constexpr (Transform::passes_through) {
        return loaded;
    } else {
        float x[Packed128<In>::size];
        for (int k = 0; k < Packed128<In>::size; k++) { x[k] = fp8_stage_to_float(loaded, k); }
        transform.stage(x, row, col, aux);
        return fp8_stage_pack<In>(x);
    }
}

// 8 consecutive codes, packed little-endian (code i in byte i)
__device__ __forceinline__ uint2 fp8_pack8(const uint8_t codes[8]) {
    uint2 packed;
    packed.x = (uint32_t)codes[0] | ((uint32_t)codes[1] << 8) | ((uint32_t)codes[2] << 16) | ((uint32_t)codes[3] << 24);
    packed.y = (uint32_t)codes[4] | ((uint32_t)codes[5] << 8) | ((uint32_t)codes[6] << 16) | ((uint32_t)codes[7] << 24);
    return packed;
}

// the codes of 8 values under one scale, packed little-endian (x[i]'s code in byte i), two
// per conversion instruction
__device__ __forceinline__ uint2 fp8_quantize8(const float x[8], float scale, Fp8Format format) {
    uint32_t words[2];
    for (int w = 0; w < 2; w++) {
        words[w] = (uint32_t)fp8_quantize2(x[4 * w], x[4 * w + 1], scale, format)
                 | ((uint32_t)fp8_quantize2(x[4 * w + 2], x[4 * w + 3], scale, format) << 16);
    }
    return make_uint2(words[0], words[1]);
}

// ----------------------------------------------------------------------------
// the amax pass (current scaling): this use's amax into record->amax_bits

// a grid-stride walk over the 16-byte vectors, FP8_AMAX_BATCH of them loaded before the first is used
template <class In, class Transform>
__global__ void fp8_amax_kernel(Fp8CastRecord* record, const In* in, size_t n, Transform transform) {
    constexpr int vector = (int)(16 / sizeof(In));
    Fp8Tally tally = fp8_tally_zero();
    const int vectors = (int)(n / vector), step = gridDim.x * blockDim.x;
    for (int first = blockIdx.x * blockDim.x + threadIdx.x; first < vectors; first += FP8_AMAX_BATCH * step) {
        Packed128<In> loaded[FP8_AMAX_BATCH];
        load128_batch<FP8_AMAX_BATCH, true>(loaded, in, first, step, vectors, vector);
#pragma unroll
        for (int j = 0; j < FP8_AMAX_BATCH; j++) {
            if (first + j * step >= vectors) { break; }
            if constexpr (Transform::passes_through) {  // the values as stored, as the plain cast stages them
                fp8_tally_amax(&tally, loaded[j]);
            } else {  // transformed, then stored as the tensor's type, as the cast stages them
                float transformed[vector];
                for (int k = 0; k < vector; k++) { transformed[k] = transform(fp8_stage_to_float(loaded[j], k)); }
                fp8_tally_amax(&tally, fp8_stage_pack<In>(transformed));
            }
        }
    }
    fp8_tally_commit(tally, record, true);
}

template <class In, class Transform>
void fp8_amax_launch(Fp8CastRecord* record, const In* in, size_t n, Transform transform, cudaStream_t stream) {
    // int indices with room for the walk's last step past the end: at most 2^30 vectors
    if (n == 0 || n % 16 != 0 || n / (16 / sizeof(In)) > ((size_t)1 << 30)) {
        llm8_die("fp8 amax: %zu elements must be a positive multiple of 16, in at most 2^30 16-byte vectors", n);
    }
    const int block_size = 256;
    const size_t vectors = n / (16 / sizeof(In));
    const int blocks = (int)(vectors / block_size + 1 < 2048 ? vectors / block_size + 1 : 2048);
    fp8_amax_kernel<In, Transform><<<blocks, block_size, 0, stream>>>(record, in, n, transform);
    cudaCheck(cudaGetLastError());
}

// ----------------------------------------------------------------------------
// the tile cast

/*
The tile cast's staging: the input tile, [FP8_TILE][stride] of In (one 16-byte pad per row,
so a column read has no bank conflicts), and beside it, for a transform that reads an aux
tensor (GELU backward's pre-activation), the aux tile the same way in bf16. The copies go from
global to shared memory with cp.async (no registers held), a thread's share of a tile all in
flight at once. With two buffers (bf16 input, no aux: the plain casts, GELU's, layernorm's),
a block copies its next tile in while it casts this one; one buffer for fp32 master weights
and GELU backward, whose two staged buffers would leave one block an SM. Each case is at most
about 70 KB, so FP8_TILE_BLOCKS_PER_SM blocks share an SM's 227 KB.
*/
#define FP8_TILE_BLOCKS_PER_SM 3

template <class In, class Transform>
struct Fp8TileStaging {
    static constexpr int vector = (int)(16 / sizeof(In));
    static constexpr int stride = FP8_TILE + vector;
    static constexpr int aux_stride = FP8_TILE + x128::size;
    static constexpr size_t input_bytes = (size_t)FP8_TILE * stride * sizeof(In);
    static constexpr size_t buffer_bytes = input_bytes + (Transform::reads_aux ? (size_t)FP8_TILE * aux_stride * sizeof(floatX) : 0);
    static constexpr int buffers = sizeof(In) == sizeof(floatX) && !Transform::reads_aux ? 2 : 1;
    static constexpr size_t bytes = buffers * buffer_bytes;
    // a thread stages one 16-byte column piece of every rows_per_pass-th row
    static constexpr int vectors_per_row = FP8_TILE / vector;
    static constexpr int rows_per_pass = FP8_TILE_THREADS / vectors_per_row;
    static constexpr int vectors_per_thread = FP8_TILE / rows_per_pass;
    // an SM has 228 KB of shared memory, 1 KB of it reserved per block; the kernel's static shared
    // memory is under 3 KB (cuobjdump -res-usage: 2768 bytes on 2026-12-01)
    static_assert(FP8_TILE_BLOCKS_PER_SM * (bytes + 3072 + 1024) <= 228 * 1024, "FP8_TILE_BLOCKS_PER_SM blocks an SM");
};

// where one tile of a cast lies: rows r0.., columns c0.., tile_row the row tile (column_sums' row)
typedef struct {
    int r0, c0, tile_row, rows_here, cols_here;
} Fp8TilePlace;

__device__ __forceinline__ Fp8TilePlace fp8_tile_place(int tile, int rows, int cols) {
    const int tiles_x = ceil_div(cols, FP8_TILE);
    Fp8TilePlace p;
    p.tile_row = tile / tiles_x;
    p.r0 = p.tile_row * FP8_TILE;
    p.c0 = (tile % tiles_x) * FP8_TILE;
    p.rows_here = min(FP8_TILE, rows - p.r0);
    p.cols_here = min(FP8_TILE, cols - p.c0);
    return p;
}

// the thread's copies of one tile (input, and aux where the transform reads one) into a staging
// buffer, committed as one group; positions outside a short tile are not copied (nor ever read)
template <class In, class Transform>
__device__ __forceinline__ void fp8_tile_copy_in(unsigned char* buffer, const In* in, int cols, const Fp8TilePlace& p,
                                                 const Transform& transform) {
    typedef Fp8TileStaging<In, Transform> S;
    In* tile = reinterpret_cast<In*>(buffer);
    floatX* aux_tile = reinterpret_cast<floatX*>(buffer + S::input_bytes);
    const int c = (threadIdx.x % S::vectors_per_row) * S::vector;
#pragma unroll
    for (int j = 0; j < S::vectors_per_thread; j++) {
        const int r = threadIdx.x / S::vectors_per_row + j * S::rows_per_pass;
        if (r >= p.rows_here || c >= p.cols_here) { continue; }
        __pipeline_memcpy_async(tile + r * S::stride + c, in + (size_t)(p.r0 + r) * cols + p.c0 + c, 16);
        if constexpr (Transform::reads_aux) {
            __pipeline_memcpy_async(aux_tile + r * S::aux_stride + c, transform.aux_at(p.r0 + r, p.c0 + c), 16);
        }
    }
    __pipeline_commit();
}

/*
One staged tile into codes: the thread's own vectors transformed in place (its copies have
landed: the caller waited), their amax voted on, then the column sums, the block recipe's
scales, and the two code passes over the whole tile. Ends with a barrier: the buffer and the
tile's shared scales are free for the next tile when it returns.
*/
template <class In, class Transform>
__device__ __forceinline__ void fp8_cast_tile(unsigned char* buffer, const Fp8CastOutput& out, const Fp8TilePlace& p,
                                              In* transformed_out, float* column_sums, int rows, int cols,
                                              float tensor_scale, const Transform& transform, Fp8Tally* tally) {
    typedef Fp8TileStaging<In, Transform> S;
    constexpr int vector = S::vector, stride = S::stride;
    In* tile = reinterpret_cast<In*>(buffer);
    const floatX* aux_tile = reinterpret_cast<const floatX*>(buffer + S::input_bytes);
    __shared__ float row_scales[FP8_TILE];
    __shared__ float col_scales[FP8_TILE];
    __shared__ uint32_t block_amax_bits;
    const int r0 = p.r0, c0 = p.c0, rows_here = p.rows_here, cols_here = p.cols_here;
    const float fmax = fp8_max(out.format);

    // the transform, in place, on the vectors this thread copied in; the tile's amax
    Fp8Tally staged_amax = fp8_tally_zero();
    {
        const int c = (threadIdx.x % S::vectors_per_row) * vector;
#pragma unroll
        for (int j = 0; j < S::vectors_per_thread; j++) {
            const int r = threadIdx.x / S::vectors_per_row + j * S::rows_per_pass;
            if (r >= rows_here || c >= cols_here) { continue; }
            In* slot = tile + r * stride + c;
            Packed128<In> staged = load128(slot);
            if constexpr (!Transform::passes_through) {
                const x128 aux = Transform::reads_aux ? load128(aux_tile + r * S::aux_stride + c) : x128::zeros();
                staged = fp8_stage_vector(staged, transform, r0 + r, c0 + c, aux);
                store128(slot, staged);
            }
            fp8_tally_amax(&staged_amax, staged);
            if (transformed_out != NULL) { store128(transformed_out + (size_t)(r0 + r) * cols + c0 + c, staged); }
        }
    }
    tally->amax_bits = max(tally->amax_bits, staged_amax.amax_bits);
    // per tensor, the scale is known before any code: if no staged value of the tile saturates
    // under it (exact from the amaxes, fp8_may_saturate), the code passes count flushes only.
    // The vote is also the barrier after which every thread's transformed vectors are in place
    const bool tile_may_saturate = __syncthreads_or(
        out.scaling != FP8_SCALING_TENSOR || fp8_may_saturate(bits_as_float(staged_amax.amax_bits), tensor_scale, out.format));

    if (column_sums != NULL && threadIdx.x < cols_here) {
        const int c = threadIdx.x;
        float total = 0.0f;
        for (int lane = 0; lane < DBIAS_ROW_LANES; lane++) {
            float lane_sum = 0.0f;
            for (int r = lane; r < rows_here; r += DBIAS_ROW_LANES) { lane_sum += fp8_stage_to_float(tile[r * stride + c]); }
            total += lane_sum;
        }
        column_sums[(size_t)p.tile_row * cols + c0 + c] = total;
    }

    // block recipes: the amax of every row piece and column piece of the tile, two threads each
    float tile_scale = 0.0f;
    if (out.scaling != FP8_SCALING_TENSOR) {
        const int line = threadIdx.x / 2, half = threadIdx.x % 2;
        uint32_t row_bits = 0u, col_bits = 0u;
        for (int j = half * (FP8_TILE / 2); j < (half + 1) * (FP8_TILE / 2); j++) {
            if (line < rows_here && j < cols_here) { row_bits = max(row_bits, fp8_amax_bits(fp8_stage_to_float(tile[line * stride + j]))); }
            if (line < cols_here && j < rows_here) { col_bits = max(col_bits, fp8_amax_bits(fp8_stage_to_float(tile[j * stride + line]))); }
        }
        row_bits = max(row_bits, __shfl_xor_sync(0xffffffffu, row_bits, 1));
        col_bits = max(col_bits, __shfl_xor_sync(0xffffffffu, col_bits, 1));
        if (threadIdx.x == 0) { block_amax_bits = 0u; }
        __syncthreads();
        if (half == 0) {
            row_scales[line] = fp8_scale_from_amax(bits_as_float(row_bits), fmax, 0);
            col_scales[line] = fp8_scale_from_amax(bits_as_float(col_bits), fmax, 0);
            atomicMax(&block_amax_bits, row_bits);  // shared memory: the tile's amax, any order
        }
        __syncthreads();
        tile_scale = fp8_weight_block_scale(bits_as_float(block_amax_bits));  // used by BLOCKS_128x128 only
        if (out.scaling == FP8_SCALING_ROWS_1x128) {
            if (half == 0 && out.codes != NULL && line < rows_here) {
                out.scale_inv[(size_t)(c0 / FP8_TILE) * rows + r0 + line] = fp8_reciprocal(row_scales[line]);
            }
            if (half == 0 && out.codes_t != NULL && line < cols_here) {
                out.scale_inv_t[(size_t)(r0 / FP8_TILE) * cols + c0 + line] = fp8_reciprocal(col_scales[line]);
            }
        } else if (threadIdx.x == 0) {
            float tile_scale_inv = fp8_reciprocal(tile_scale);
            if (out.codes != NULL) { out.scale_inv[(size_t)(r0 / FP8_TILE) * fp8_block_scale_ld(cols) + c0 / FP8_TILE] = tile_scale_inv; }
            if (out.codes_t != NULL) { out.scale_inv_t[(size_t)(c0 / FP8_TILE) * fp8_block_scale_ld(rows) + r0 / FP8_TILE] = tile_scale_inv; }
        }
    }

    // row-major codes: 16 per thread, 8 threads per 128-byte tile row
    const bool count_rows = out.codes != NULL;
    if (out.codes != NULL) {
        for (int i = threadIdx.x; i < FP8_TILE * (FP8_TILE / 16); i += FP8_TILE_THREADS) {
            int r = i / (FP8_TILE / 16);
            int c = (i % (FP8_TILE / 16)) * 16;
            if (r >= rows_here || c >= cols_here) { continue; }
            float scale = out.scaling == FP8_SCALING_TENSOR ? tensor_scale
                        : out.scaling == FP8_SCALING_ROWS_1x128 ? row_scales[r] : tile_scale;
            uint2 codes[2];
#pragma unroll
            for (int half = 0; half < 2; half++) {  // 8 values at a time: fewer live registers
                float x[8];
                int zeros = 0;
                for (int v = 0; v < 8; v += vector) {  // 16-byte reads: the staged row is 16-byte aligned
                    Packed128<In> staged = load128(tile + r * stride + c + 8 * half + v);
                    for (int k = 0; k < vector; k++) { x[v + k] = fp8_stage_to_float(staged, k); }
                    zeros += packed_zero_count(staged);
                }
                codes[half] = fp8_quantize8(x, scale, out.format);
                fp8_tally_counts8(tally, x, codes[half], scale, out.format, tile_may_saturate, zeros);
            }
            *reinterpret_cast<uint4*>(out.codes + (size_t)(r0 + r) * cols + c0 + c) =
                make_uint4(codes[0].x, codes[0].y, codes[1].x, codes[1].y);
        }
    }

    // transposed codes: a thread packs 32 rows of one column (two 16-byte stores, the second
    // only where the tile has those rows: rows_here is a multiple of 16); a warp takes 32
    // neighbouring columns, so each staged row is read without bank conflicts
    if (out.codes_t != NULL) {
        for (int i = threadIdx.x; i < FP8_TILE * (FP8_TILE / 32); i += FP8_TILE_THREADS) {
            int c = i % FP8_TILE;
            int r = (i / FP8_TILE) * 32;
            if (c >= cols_here || r >= rows_here) { continue; }
            float scale = out.scaling == FP8_SCALING_TENSOR ? tensor_scale
                        : out.scaling == FP8_SCALING_ROWS_1x128 ? col_scales[c] : tile_scale;
            uint8_t* destination = out.codes_t + (size_t)(c0 + c) * rows + r0 + r;
            for (int half = 0; half < 2 && r + 16 * half < rows_here; half++) {
                uint2 codes[2];
#pragma unroll
                for (int quarter = 0; quarter < 2; quarter++) {
                    const int first = r + 16 * half + 8 * quarter;
                    float x[8];
                    for (int k = 0; k < 8; k++) { x[k] = fp8_stage_to_float(tile[(first + k) * stride + c]); }
                    codes[quarter] = fp8_quantize8(x, scale, out.format);
                    if (!count_rows) {
                        fp8_tally_counts8(tally, x, codes[quarter], scale, out.format, tile_may_saturate, fp8_zero_count8(x));
                    }
                }
                *reinterpret_cast<uint4*>(destination + 16 * half) = make_uint4(codes[0].x, codes[0].y, codes[1].x, codes[1].y);
            }
        }
    }
    __syncthreads();  // every thread is done with the buffer and the tile's shared scales
}

/*
The tile cast: FP8_TILE_THREADS threads a block, FP8_TILE_BLOCKS_PER_SM blocks an SM, the
grid as many blocks as the GPU holds at once (fp8_cast_transpose_grid); a block takes the
cast's 128 x 128 tiles (the last ones short) blockIdx.x, + gridDim.x, ..., row tile by row
tile, copying its next tile in while it casts this one where it has two staging buffers
(Fp8TileStaging), and commits its statistics once.
transformed_out (bf16 staging only, may be NULL): also store the transformed tensor.
column_sums (may be NULL): the tile's column sums of the staged (transformed, rounded)
values, in the bias gradient's order (DBIAS_ROWS_PER_CHUNK), at [row tile][cols].
recording: what goes into out.record (Fp8CastRecording; a replay takes its per-tensor scale from it).
cast: Fp8OneCast, or Fp8BatchedCasts (grid z the cast; then transformed_out and column_sums are NULL).
Statistics count the row-major codes when they are written, else the transposed ones.
*/
template <class In, class Transform, class Source>
__global__ void __launch_bounds__(FP8_TILE_THREADS, FP8_TILE_BLOCKS_PER_SM)
fp8_cast_transpose_kernel(Source cast, In* transformed_out, float* column_sums, const In* in, int rows, int cols,
                          Fp8CastRecording recording, Transform transform) {
    typedef Fp8TileStaging<In, Transform> S;
    const Fp8CastOutput& out = cast.output();
    if (recording == FP8_RECORD_RECAST && out.prediction->recast == 0u) { return; }  // the prediction held: the whole block
    const bool replay = recording == FP8_RECORD_NOTHING;
    in += cast.input_offset();
    extern __shared__ __align__(16) unsigned char fp8_tile_memory[];
    const float tensor_scale = out.scaling != FP8_SCALING_TENSOR ? 0.0f : replay ? out.record->scale : out.state->scale;
    const int tiles = ceil_div(rows, FP8_TILE) * ceil_div(cols, FP8_TILE);
    Fp8Tally tally = fp8_tally_zero();

    int tile = blockIdx.x;
    if (tile < tiles) { fp8_tile_copy_in(fp8_tile_memory, in, cols, fp8_tile_place(tile, rows, cols), transform); }
    for (int k = 0; tile < tiles; k++, tile += gridDim.x) {
        const int next = tile + gridDim.x;
        unsigned char* buffer = fp8_tile_memory + (size_t)(k % S::buffers) * S::buffer_bytes;
        if constexpr (S::buffers == 2) {  // the next tile's copies go out before this one's are waited for
            if (next < tiles) {
                fp8_tile_copy_in(fp8_tile_memory + (size_t)((k + 1) % 2) * S::buffer_bytes, in, cols,
                                 fp8_tile_place(next, rows, cols), transform);
            }
            __pipeline_wait_prior(next < tiles ? 1 : 0);
        } else {
            __pipeline_wait_prior(0);
        }
        fp8_cast_tile(buffer, out, fp8_tile_place(tile, rows, cols), transformed_out, column_sums, rows, cols, tensor_scale,
                      transform, &tally);
        if constexpr (S::buffers == 1) {
            if (next < tiles) { fp8_tile_copy_in(fp8_tile_memory, in, cols, fp8_tile_place(next, rows, cols), transform); }
        }
    }

    if (replay) { return; }  // the whole block: recording is the launch's
    // per-tensor: the scale this cast used, for the GEMMs and the log (same value from every block)
    if (out.scaling == FP8_SCALING_TENSOR && blockIdx.x == 0 && threadIdx.x == 0) {
        out.record->scale = tensor_scale;
        out.record->scale_inv = out.state->scale_inv;
    }
    const bool predicted = recording == FP8_RECORD_PREDICTED;
    fp8_tally_commit(tally, out.record, (recording == FP8_RECORD_AMAX || predicted) && out.scaling == FP8_SCALING_TENSOR,
                     predicted ? out.prediction : NULL);
}

// the tile cast's blocks the GPU holds at once
static int fp8_tile_resident_blocks(void) { return device_sm_count() * FP8_TILE_BLOCKS_PER_SM; }

// count tensors [rows][cols] (grid z): one from an Fp8OneCast, count from an Fp8BatchedCasts
template <class In, class Transform, class Source>
void fp8_cast_transpose_grid(Source cast, int count, In* transformed_out, float* column_sums, const In* in,
                             int rows, int cols, Fp8CastRecording recording, Transform transform, cudaStream_t stream) {
    typedef Fp8TileStaging<In, Transform> S;
    static bool configured = false;  // per instantiation, once a process (one device): not a host call per cast
    if (!configured) {
        auto kernel = fp8_cast_transpose_kernel<In, Transform, Source>;
        cudaCheck(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)S::bytes));  // above 48 KB
        cudaCheck(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared));
        configured = true;
    }
    const int tiles = ceil_div(rows, FP8_TILE) * ceil_div(cols, FP8_TILE);
    const int blocks_per_cast = max(1, min(tiles, ceil_div(fp8_tile_resident_blocks(), count)));
    dim3 grid(blocks_per_cast, 1, count);
    fp8_cast_transpose_kernel<In, Transform, Source><<<grid, FP8_TILE_THREADS, S::bytes, stream>>>(
        cast, transformed_out, column_sums, in, rows, cols, recording, transform);
    cudaCheck(cudaGetLastError());
}

template <class In, class Transform>
void fp8_cast_transpose_launch(const Fp8CastOutput* out, In* transformed_out, float* column_sums, const In* in,
                               int rows, int cols, Fp8CastRecording recording, Transform transform, cudaStream_t stream) {
    if ((recording == FP8_RECORD_PREDICTED || recording == FP8_RECORD_RECAST) &&
        (out->scaling != FP8_SCALING_TENSOR || out->prediction == NULL)) {
        llm8_die("fp8_cast_transpose_launch: a predicted scale is per tensor, with an Fp8Prediction");
    }
    Fp8OneCast one = {*out};
    fp8_cast_transpose_grid(one, 1, transformed_out, column_sums, in, rows, cols, recording, transform, stream);
}

/*
The cast with a known scale: the per-tensor recipes' one-pass delayed cast (the state's
scale, this use's amax recorded for fp8_scaling_update_records), or a block-recipe cast.
*/
template <class In, class Transform>
void fp8_cast_transpose_with(const Fp8CastOutput* out, In* transformed_out, const In* in, int rows, int cols,
                             Transform transform, const char* who, cudaStream_t stream) {
    fp8_cast_check(out, rows, cols, who);
    fp8_cast_transpose_launch(out, transformed_out, (float*)NULL, in, rows, cols, FP8_RECORD_AMAX, transform, stream);
}

/*
Current scaling of one tensor (gradients, weights, and a delayed tensor's first use, see
fp8_scaling_casts_after_update): amax pass, the state update, the cast with the new scale.
amax_known: record->amax_bits already holds this use's amax (e.g. the optimizer wrote it).
*/
template <class In, class Transform>
void fp8_cast_transpose_current_with(const Fp8CastOutput* out, In* transformed_out, const In* in, int rows, int cols,
                                     bool amax_known, Transform transform, const char* who, cudaStream_t stream) {
    fp8_cast_check(out, rows, cols, who);
    if (out->scaling != FP8_SCALING_TENSOR) { llm8_die("%s: current scaling is per tensor; the block recipe casts per tile", who); }
    if (!amax_known) { fp8_amax_launch(out->record, in, (size_t)rows * cols, transform, stream); }
    fp8_scaling_update_records(out->state, out->record, 1, stream);
    fp8_cast_transpose_launch(out, transformed_out, (float*)NULL, in, rows, cols, FP8_RECORD_COUNTS, transform, stream);
}

/*
A replay (FP8_RECORD_NOTHING): the codes an earlier cast of the same input through the same
transform wrote, written again into out's arrays (with -r, the x^T a wgrad reads, cast again
in the backward instead of kept since the forward). The caller gives out with only the
arrays to write; nothing is recorded.
*/
template <class In, class Transform>
void fp8_cast_transpose_replay_with(const Fp8CastOutput* out, const In* in, int rows, int cols, Transform transform,
                                    const char* who, cudaStream_t stream) {
    fp8_cast_check(out, rows, cols, who);
    fp8_cast_transpose_launch(out, (In*)NULL, (float*)NULL, in, rows, cols, FP8_RECORD_NOTHING, transform, stream);
}

// ----------------------------------------------------------------------------
// launchers of the plain casts

// bf16 in [rows][cols] -> out (delayed one-pass, or block recipe); e.g. the attention output
void fp8_cast_transpose(const Fp8CastOutput* out, const floatX* in, int rows, int cols, cudaStream_t stream) {
    fp8_cast_transpose_with(out, (floatX*)NULL, in, rows, cols, Fp8Identity(), "fp8_cast_transpose", stream);
}

// bf16 in [rows][cols] -> out with current scaling (amax, update, cast)
void fp8_cast_transpose_current(const Fp8CastOutput* out, const floatX* in, int rows, int cols, cudaStream_t stream) {
    fp8_cast_transpose_current_with(out, (floatX*)NULL, in, rows, cols, false, Fp8Identity(),
                                    "fp8_cast_transpose_current", stream);
}

// the replay of fp8_cast_transpose's codes from the same bf16 in (e.g. the attention output's x^T, -r 2)
void fp8_cast_transpose_replay(const Fp8CastOutput* out, const floatX* in, int rows, int cols, cudaStream_t stream) {
    fp8_cast_transpose_replay_with(out, in, rows, cols, Fp8Identity(), "fp8_cast_transpose_replay", stream);
}

/*
A matmul weight [OC][C] -> E4M3 W and W^T, once per optimizer step: from the fp32 master
when master != NULL, else from the bf16 weight. Per tensor: current scaling from the
weight's amax (computed here unless amax_known: the optimizer pass atomicMax'ed it into
out->record->amax_bits). Block recipe: 128x128 blocks.
*/
void fp8_cast_weight(const Fp8CastOutput* out, const float* master, const floatX* weight, int OC, int C,
                     bool amax_known, cudaStream_t stream) {
    if ((master == NULL) == (weight == NULL)) { llm8_die("fp8_cast_weight: give exactly one of the fp32 master and the bf16 weight"); }
    if (out->format != FP8_E4M3) { llm8_die("fp8_cast_weight: weights are E4M3, got %s", fp8_format_name(out->format)); }
    if (out->scaling == FP8_SCALING_TENSOR) {
        if (master != NULL) {
            fp8_cast_transpose_current_with(out, (float*)NULL, master, OC, C, amax_known, Fp8Identity(), "fp8_cast_weight", stream);
        } else {
            fp8_cast_transpose_current_with(out, (floatX*)NULL, weight, OC, C, amax_known, Fp8Identity(), "fp8_cast_weight", stream);
        }
    } else {
        if (out->scaling != FP8_SCALING_BLOCKS_128x128) { llm8_die("fp8_cast_weight: the block recipe scales weights per 128x128 block"); }
        fp8_cast_check(out, OC, C, "fp8_cast_weight");
        if (master != NULL) {
            fp8_cast_transpose_launch(out, (float*)NULL, (float*)NULL, master, OC, C, FP8_RECORD_COUNTS, Fp8Identity(), stream);
        } else {
            fp8_cast_transpose_launch(out, (floatX*)NULL, (float*)NULL, weight, OC, C, FP8_RECORD_COUNTS, Fp8Identity(), stream);
        }
    }
}

/*
The casts after an optimizer step of `count` weights [OC][C] of one shape whose amaxes the pass
wrote (fp8_cast_weight with amax_known, the same bits), in one launch: jobs is a device array
of count Fp8CastJobs, first a host copy of jobs[0].out (checked here; every job has its kind's
format and scaling), input the fp32 master or the bf16 weights the jobs' in_offsets count from.
Per tensor the caller has already folded those amaxes into the states, for all the weights in
one fp8_scaling_update_records, as fp8_cast_transpose_current_with does for one.
*/
template <class In>
void fp8_cast_weights_batched(const Fp8CastJob* jobs, int count, const Fp8CastOutput* first, const In* input, int OC, int C,
                              cudaStream_t stream) {
    if (first->format != FP8_E4M3) { llm8_die("fp8_cast_weights_batched: weights are E4M3, got %s", fp8_format_name(first->format)); }
    if (first->scaling == FP8_SCALING_ROWS_1x128) { llm8_die("fp8_cast_weights_batched: weights are scaled per tensor or per 128x128 block"); }
    if (count < 1 || count > 65535) { llm8_die("fp8_cast_weights_batched: %d weights: a launch takes 1 to 65535", count); }
    fp8_cast_check(first, OC, C, "fp8_cast_weights_batched");
    Fp8BatchedCasts batch = {jobs};
    fp8_cast_transpose_grid(batch, count, (In*)NULL, (float*)NULL, input, OC, C, FP8_RECORD_COUNTS, Fp8Identity(), stream);
}

// ----------------------------------------------------------------------------
// the sharded weight cast (ZeRO, llmc/zero_comm.cuh): each rank casts the part it updated,
// the codes are all-gathered, and each rank builds W^T from the gathered W

template <class In>
__global__ void fp8_cast_part_kernel(Fp8CastOutput out, const In* in, size_t first, size_t n) {
    const float scale = out.state->scale;
    Fp8Tally tally = fp8_tally_zero();
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float x = fp8_stage_to_float(in[i]);
        uint8_t code = fp8_quantize(x, scale, out.format);
        fp8_tally_cast(&tally, x, scale, code, out.format);
        out.codes[first + i] = code;
    }
    fp8_tally_commit(tally, out.record, false);
}

/*
Elements [first, first + n) of a per-tensor-scaled weight [OC][C] (row-major) into
out->codes + first, with the scale already in out->state (updated from the all-reduced
amax): the same codes a whole-tensor cast writes there. in points at element first of the
fp32 master or of the bf16 weight. The GEMMs' scale comes from fp8_scaling_publish_scales.
*/
template <class In>
void fp8_cast_weight_part(const Fp8CastOutput* out, const In* in, size_t first, size_t n, cudaStream_t stream) {
    if (out->scaling != FP8_SCALING_TENSOR || out->codes == NULL || out->state == NULL || out->record == NULL) {
        llm8_die("fp8_cast_weight_part: needs per-tensor scaling with codes, state and record");
    }
    if (n == 0) { return; }
    const int block_size = 256;
    size_t blocks = ceil_div_size(n, block_size);
    fp8_cast_part_kernel<In><<<(unsigned int)(blocks < 1024 ? blocks : 1024), block_size, 0, stream>>>(*out, in, first, n);
    cudaCheck(cudaGetLastError());
}

// ----------------------------------------------------------------------------
// the sharded weight cast of the block recipe: a rank's flat part cuts 128x128 blocks, so
// each rank's partial amax of every block it touches, a MAX all-reduce of those (the
// caller), then every rank has every block's scale and casts its part with them

/*
One warp per 1 x 128 run of a block row (row r, block column c / 128) inside the part: the
warp's max, then one atomicMax on the block's slot (uint32 bits of |x|: order-free, so
deterministic). Runs are numbered r * blocks_per_row + c / 128; the part's first and last
runs may be cut.
*/
template <class In>
__global__ void fp8_block_amax_part_kernel(uint32_t* block_amax_bits, const In* in, size_t first, size_t n, int cols) {
    const int blocks_per_row = (cols + FP8_WEIGHT_BLOCK - 1) / FP8_WEIGHT_BLOCK;
    const size_t first_run = first / cols * blocks_per_row + first % cols / FP8_WEIGHT_BLOCK;
    const size_t last = first + n - 1;
    const size_t runs = last / cols * blocks_per_row + last % cols / FP8_WEIGHT_BLOCK + 1 - first_run;
    const int lane = threadIdx.x % 32;
    const size_t warps = (size_t)gridDim.x * blockDim.x / 32;
    for (size_t run = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) / 32; run < runs; run += warps) {
        size_t at = first_run + run;
        size_t row = at / blocks_per_row;
        int c0 = (int)(at % blocks_per_row) * FP8_WEIGHT_BLOCK;
        size_t run_begin = row * cols + c0, run_end = row * cols + min(c0 + FP8_WEIGHT_BLOCK, cols);
        uint32_t bits = 0u;
        for (size_t e = run_begin + lane; e < run_end; e += 32) {
            if (e >= first && e <= last) { bits = max(bits, fp8_amax_bits(fp8_stage_to_float(in[e - first]))); }
        }
        for (int offset = 16; offset > 0; offset /= 2) { bits = max(bits, __shfl_xor_sync(0xffffffffu, bits, offset)); }
        if (lane == 0) { atomicMax(&block_amax_bits[fp8_weight_block_of(run_begin, cols)], bits); }
    }
}

/*
Fold elements [first, first + n) of a block-scaled weight [OC][cols] (in points at element
first of the fp32 master or the bf16 weight) into block_amax_bits [fp8_weight_blocks], which
the caller zeroed: this rank's partial block amaxes, for the all-reduce.
*/
template <class In>
void fp8_block_amax_part(uint32_t* block_amax_bits, const In* in, size_t first, size_t n, int cols, cudaStream_t stream) {
    if (n == 0) { return; }
    const int block_size = 256;
    size_t runs = ceil_div_size(n, FP8_WEIGHT_BLOCK) + 2;  // at most: the cut runs at each end
    size_t blocks = ceil_div_size(runs, block_size / 32);
    fp8_block_amax_part_kernel<In><<<(unsigned int)(blocks < 2048 ? blocks : 2048), block_size, 0, stream>>>(
        block_amax_bits, in, first, n, cols);
    cudaCheck(cudaGetLastError());
}

// one thread per 128x128 block: its scale from the global amax, 1 / scale into the layouts
// of W and of W^T (fp8_block_scale_floats), as the whole-weight cast writes them
__global__ void fp8_block_scales_kernel(const uint32_t* block_amax_bits, int rows, int cols, float* scale_inv,
                                        float* scale_inv_t) {
    const int blocks_per_row = (cols + FP8_WEIGHT_BLOCK - 1) / FP8_WEIGHT_BLOCK;
    const int block = blockIdx.x * blockDim.x + threadIdx.x;
    if ((size_t)block >= fp8_weight_blocks(rows, cols)) { return; }
    const int block_row = block / blocks_per_row, block_col = block % blocks_per_row;
    float inverse = fp8_reciprocal(fp8_weight_block_scale(bits_as_float(block_amax_bits[block])));
    if (scale_inv != NULL) { scale_inv[(size_t)block_row * fp8_block_scale_ld(cols) + block_col] = inverse; }
    if (scale_inv_t != NULL) { scale_inv_t[(size_t)block_col * fp8_block_scale_ld(rows) + block_row] = inverse; }
}

template <class In>
__global__ void fp8_cast_block_part_kernel(Fp8CastOutput out, const In* in, size_t first, size_t n, int cols,
                                           const uint32_t* block_amax_bits) {
    Fp8Tally tally = fp8_tally_zero();
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float scale = fp8_weight_block_scale(bits_as_float(block_amax_bits[fp8_weight_block_of(first + i, cols)]));
        float x = fp8_stage_to_float(in[i]);
        uint8_t code = fp8_quantize(x, scale, FP8_E4M3);
        fp8_tally_cast(&tally, x, scale, code, FP8_E4M3);
        out.codes[first + i] = code;
    }
    fp8_tally_commit(tally, out.record, false);
}

/*
The block recipe's sharded weight cast, once block_amax_bits [fp8_weight_blocks(OC, cols)]
holds every block's global amax (all-reduced): W's and W^T's dequantization scales whole
(every rank writes all of them), and elements [first, first + n) of W's codes (in points at
element first of the fp32 master or the bf16 weight; n = 0: this rank owns none). The same
codes and scales the whole-weight cast (fp8_cast_weight) writes; W^T's codes follow from
the gathered W (fp8_transpose_codes).
*/
template <class In>
void fp8_cast_weight_block_part(const Fp8CastOutput* out, const In* in, size_t first, size_t n, int OC, int cols,
                                const uint32_t* block_amax_bits, cudaStream_t stream) {
    if (out->scaling != FP8_SCALING_BLOCKS_128x128 || out->codes == NULL || out->scale_inv == NULL || out->record == NULL) {
        llm8_die("fp8_cast_weight_block_part: needs 128x128 block scaling with codes, scale_inv and record");
    }
    int blocks = (int)fp8_weight_blocks(OC, cols);
    fp8_block_scales_kernel<<<ceil_div(blocks, 256), 256, 0, stream>>>(block_amax_bits, OC, cols, out->scale_inv,
                                                                         out->scale_inv_t);
    cudaCheck(cudaGetLastError());
    if (n == 0) { return; }
    const int block_size = 256;
    size_t grid = ceil_div_size(n, block_size);
    fp8_cast_block_part_kernel<In><<<(unsigned int)(grid < 1024 ? grid : 1024), block_size, 0, stream>>>(
        *out, in, first, n, cols, block_amax_bits);
    cudaCheck(cudaGetLastError());
}

// the E4M3 code of a weight element under `scale`, as the optimizer pass writes it (fp8_weight_element)
__device__ __forceinline__ uint8_t fp8_weight_code_of(float master, float scale) {
    return fp8_weight_element(1, master, 0, scale).code;
}
__device__ __forceinline__ uint8_t fp8_weight_code_of(floatX weight, float scale) {
    return fp8_weight_element(0, 0.0f, __bfloat16_as_ushort(weight), scale).code;
}

template <class In>
__global__ void fp8_weight_codes_kernel(uint8_t* codes, const In* in, size_t n, const Fp8CastRecord* record) {
    const float scale = record->scale;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        codes[i] = fp8_weight_code_of(in[i], scale);
    }
}

/*
codes[0, n) = the codes the delayed weight cast's optimizer pass wrote for in[0, n) (the fp32
master or the bf16 weight), under record->scale, the scale they were written with: to rebuild
them after a resume. Not a use of the tensor: no state, amax or statistic changes.
*/
template <class In>
void fp8_weight_codes(uint8_t* codes, const In* in, size_t n, const Fp8CastRecord* record, cudaStream_t stream) {
    if (n == 0) { return; }
    const int block_size = 256;
    size_t blocks = ceil_div_size(n, block_size);
    fp8_weight_codes_kernel<In><<<(unsigned int)(blocks < 1024 ? blocks : 1024), block_size, 0, stream>>>(codes, in, n, record);
    cudaCheck(cudaGetLastError());
}

/*
E4M3 codes a GEMM wrote itself (-fe 1: fc's forward writes fcproj's x codes through cuBLASLt's
GELU epilogue, matmul_forward_fp8_gelu_codes) still need what a cast gives the tensor's record:
the scale they were written with (the GEMMs read its inverse), this use's amax, the statistics.
fp8_gemm_codes_begin copies the state's scale into the record and into scalars->scale, the
16-byte aligned slot cuBLASLt's D scale pointer needs (a state's own scale is not aligned); the
GEMM writes its amax into scalars->amax; the transpose that makes x^T from the codes
(fp8_transpose_codes_counted) then counts the codes into the record as a cast would, from the
codes alone, where a cast classifies each value (fp8_classify):
- saturated: 0 where the amax shows nothing can saturate (fp8_may_saturate, exact, as a cast's
  vote); else the codes of the largest magnitude (or NaN), an upper bound: a value that rounds
  to 448 without being clipped counts too;
- flushed: the codes that are ±0, an upper bound too: a GELU output that is exactly 0 counts.
*/
typedef struct {
    float scale;        // the scale the GEMM writes the codes with (D scale)
    float unused_a[3];
    float amax;         // the amax of the values it encoded, before the scale (AMAX_D)
    float unused_b[3];
} Fp8GemmScalars;
static_assert(offsetof(Fp8GemmScalars, amax) % 16 == 0 && sizeof(Fp8GemmScalars) % 16 == 0,
              "in a 16-byte aligned array each scale and amax is 16-byte aligned");

__global__ void fp8_gemm_codes_begin_kernel(const Fp8TensorScaling* state, Fp8CastRecord* record, Fp8GemmScalars* scalars) {
    fp8_record_take_scale(record, state);
    scalars->scale = state->scale;
}

// before the GEMM that writes a per-tensor E4M3 tensor's codes with out's state's scale (the top comment)
void fp8_gemm_codes_begin(const Fp8CastOutput* out, Fp8GemmScalars* scalars, cudaStream_t stream) {
    if (out->scaling != FP8_SCALING_TENSOR || out->format != FP8_E4M3 || out->state == NULL || out->record == NULL
        || scalars == NULL || (uintptr_t)scalars % 16 != 0) {
        llm8_die("fp8_gemm_codes_begin: needs a per-tensor E4M3 output with its state and record, and 16-byte aligned scalars");
    }
    fp8_gemm_codes_begin_kernel<<<1, 1, 0, stream>>>(out->state, out->record, scalars);
    cudaCheck(cudaGetLastError());
}

// a counted transpose's tally before its first code (kCounted): the GEMM's amax and scale
__device__ __forceinline__ Fp8Tally fp8_gemm_codes_tally(const Fp8GemmScalars* scalars) {
    Fp8Tally t = fp8_tally_zero();
    t.amax_bits = fp8_amax_bits(scalars->amax);
    t.min_scale_bits = float_as_bits(scalars->scale);
    return t;
}

// 16 codes into it: the ±0 ones as flushed and, where something may saturate, those at E4M3's
// largest magnitude or NaN (0x7e, 0x7f) as saturated (a field's magnitude + 2 reaches 0x80
// exactly from 0x7e on, carrying nothing into the next field)
__device__ __forceinline__ void fp8_gemm_codes_count16(Fp8Tally* t, uint4 codes, bool may_saturate) {
    t->flushed += fp8_zero_codes8(make_uint2(codes.x, codes.y)) + fp8_zero_codes8(make_uint2(codes.z, codes.w));
    if (may_saturate) {
        const uint32_t words[4] = {codes.x, codes.y, codes.z, codes.w};
        for (int k = 0; k < 4; k++) { t->saturated += __popc(((words[k] & 0x7f7f7f7fu) + 0x02020202u) & 0x80808080u); }
    }
    t->elements += 16;
}

/*
codes_t [cols][rows] = codes [rows][cols]^T: W^T from W's codes (-fw delayed, ZeRO's gathered
W), lm_head's dy^T from the codes the classifier wrote (B T x Vp bytes, 3.3 GB at d12, so
this runs at copy speed or costs milliseconds), and fcproj's x^T from the codes fc's GEMM wrote
(-fe 1; kCounted: counted into record, the top comment of Fp8GemmScalars). One 128 x 128 tile
per block, moved 16 bytes at a time as the cast kernel moves its codes: a warp reads 4 whole
128-byte tile rows, and a thread packs 32 rows of one column into two 16-byte stores that fill a
32-byte sector of codes_t (a warp reads 32 neighbouring bytes of one staged row: no bank
conflicts). rows and cols are multiples of 16 (cuBLASLt FP8's rule), so every edge falls on 16 bytes.
*/
template <bool kCounted>
__global__ void __launch_bounds__(FP8_TILE_THREADS)
fp8_transpose_codes_kernel(const uint8_t* codes, uint8_t* codes_t, int rows, int cols, const Fp8CastJob* jobs,
                           Fp8CastRecord* record, const Fp8GemmScalars* scalars) {
    if (jobs != NULL) {  // a batched launch: weight blockIdx.z's W and W^T
        codes = jobs[blockIdx.z].out.codes;
        codes_t = jobs[blockIdx.z].out.codes_t;
    }
    constexpr int stride = FP8_TILE + 16;  // one 16-byte pad per staged row
    __shared__ uint4 tile_words[FP8_TILE * stride / 16];  // uint4: 16-byte aligned
    uint8_t* tile = reinterpret_cast<uint8_t*>(tile_words);
    const int r0 = blockIdx.y * FP8_TILE, c0 = blockIdx.x * FP8_TILE;
    const int rows_here = min(FP8_TILE, rows - r0), cols_here = min(FP8_TILE, cols - c0);
    Fp8Tally tally = fp8_tally_zero();
    bool may_saturate = false;
    if constexpr (kCounted) {
        tally = fp8_gemm_codes_tally(scalars);
        may_saturate = fp8_may_saturate(scalars->amax, scalars->scale, FP8_E4M3);
    }
    for (int i = threadIdx.x; i < FP8_TILE * (FP8_TILE / 16); i += FP8_TILE_THREADS) {
        int r = i / (FP8_TILE / 16), c = (i % (FP8_TILE / 16)) * 16;
        if (r >= rows_here || c >= cols_here) { continue; }
        uint4 word = *reinterpret_cast<const uint4*>(codes + (size_t)(r0 + r) * cols + c0 + c);
        *reinterpret_cast<uint4*>(tile + r * stride + c) = word;
        if constexpr (kCounted) { fp8_gemm_codes_count16(&tally, word, may_saturate); }
    }
    if constexpr (kCounted) { fp8_tally_commit(tally, record, true); }
    __syncthreads();
    for (int i = threadIdx.x; i < FP8_TILE * (FP8_TILE / 32); i += FP8_TILE_THREADS) {
        int c = i % FP8_TILE, r = (i / FP8_TILE) * 32;
        if (c >= cols_here || r >= rows_here) { continue; }
        uint8_t column[32];
        for (int k = 0; k < 32; k++) { column[k] = r + k < rows_here ? tile[(r + k) * stride + c] : 0; }
        uint8_t* destination = codes_t + (size_t)(c0 + c) * rows + r0 + r;
        uint2 a = fp8_pack8(column), b = fp8_pack8(column + 8);
        *reinterpret_cast<uint4*>(destination) = make_uint4(a.x, a.y, b.x, b.y);
        if (r + 16 < rows_here) {  // rows_here is a multiple of 16
            uint2 c8 = fp8_pack8(column + 16), d8 = fp8_pack8(column + 24);
            *reinterpret_cast<uint4*>(destination + 16) = make_uint4(c8.x, c8.y, d8.x, d8.y);
        }
    }
}

static void fp8_transpose_check(const uint8_t* codes, const uint8_t* codes_t, int rows, int cols, const char* who) {
    if (rows <= 0 || cols <= 0 || rows % 16 != 0 || cols % 16 != 0) {
        llm8_die("%s: rows=%d, cols=%d: each must be a positive multiple of 16 (cuBLASLt FP8 GEMM dimensions)", who, rows, cols);
    }
    if (codes == NULL || codes_t == NULL || (uintptr_t)codes % 16 != 0 || (uintptr_t)codes_t % 16 != 0) {
        llm8_die("%s: code arrays %p and %p must be given and 16-byte aligned", who, (const void*)codes, (const void*)codes_t);
    }
}

void fp8_transpose_codes(const uint8_t* codes, uint8_t* codes_t, int rows, int cols, cudaStream_t stream) {
    fp8_transpose_check(codes, codes_t, rows, cols, "fp8_transpose_codes");
    dim3 grid(ceil_div(cols, FP8_TILE), ceil_div(rows, FP8_TILE));
    fp8_transpose_codes_kernel<false><<<grid, FP8_TILE_THREADS, 0, stream>>>(codes, codes_t, rows, cols, (const Fp8CastJob*)NULL,
                                                                              (Fp8CastRecord*)NULL, (const Fp8GemmScalars*)NULL);
    cudaCheck(cudaGetLastError());
}

// out's codes_t from its codes, which a GEMM wrote with scalars->scale (fp8_gemm_codes_begin), counted
// into out's record as the cast of that use: its amax (scalars->amax), scale and statistics
void fp8_transpose_codes_counted(const Fp8CastOutput* out, int rows, int cols, const Fp8GemmScalars* scalars,
                                 cudaStream_t stream) {
    fp8_transpose_check(out->codes, out->codes_t, rows, cols, "fp8_transpose_codes_counted");
    if (out->scaling != FP8_SCALING_TENSOR || out->format != FP8_E4M3 || out->record == NULL || scalars == NULL) {
        llm8_die("fp8_transpose_codes_counted: needs a per-tensor E4M3 output with its record, and the GEMM's scalars");
    }
    dim3 grid(ceil_div(cols, FP8_TILE), ceil_div(rows, FP8_TILE));
    fp8_transpose_codes_kernel<true><<<grid, FP8_TILE_THREADS, 0, stream>>>(out->codes, out->codes_t, rows, cols,
                                                                             (const Fp8CastJob*)NULL, out->record, scalars);
    cudaCheck(cudaGetLastError());
}

// W^T from W's codes for `count` weights [rows][cols] in one launch: jobs is a device array of
// count Fp8CastJobs (their out.codes and out.codes_t), first a host copy of jobs[0].out
void fp8_transpose_codes_batched(const Fp8CastJob* jobs, int count, const Fp8CastOutput* first, int rows, int cols,
                                 cudaStream_t stream) {
    if (count < 1 || count > 65535) { llm8_die("fp8_transpose_codes_batched: %d weights: a launch takes 1 to 65535", count); }
    fp8_transpose_check(first->codes, first->codes_t, rows, cols, "fp8_transpose_codes_batched");
    dim3 grid(ceil_div(cols, FP8_TILE), ceil_div(rows, FP8_TILE), count);
    fp8_transpose_codes_kernel<false><<<grid, FP8_TILE_THREADS, 0, stream>>>((const uint8_t*)NULL, (uint8_t*)NULL, rows, cols,
                                                                              jobs, (Fp8CastRecord*)NULL, (const Fp8GemmScalars*)NULL);
    cudaCheck(cudaGetLastError());
}

// the GEMM operand a cast produced: its codes (transposed: codes_t) and their dequantization scales
typedef struct {
    const uint8_t* codes;   // row-major, contiguous along the GEMM's K
    Fp8Format format;
    Fp8Scaling scaling;
    const float* scale_inv; // device: TENSOR one float (the record's), else the block-scale array
} Fp8Operand;

static inline Fp8Operand fp8_operand(const Fp8CastOutput* out, bool transposed) {
    Fp8Operand operand;
    operand.codes = transposed ? out->codes_t : out->codes;
    operand.format = out->format;
    operand.scaling = out->scaling;
    if (out->scaling == FP8_SCALING_TENSOR) {
        operand.scale_inv = &out->record->scale_inv;
    } else {
        operand.scale_inv = transposed ? out->scale_inv_t : out->scale_inv;
    }
    return operand;
}

#endif // LLMC_FP8_CAST_CUH
