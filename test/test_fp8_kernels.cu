/*
test_fp8_kernels.cu: the FP8 kernels (llmc/fp8_cast.cuh, llmc/fp8_scaling.cuh, the FP8
parts of llmc/layernorm.cuh, llmc/gelu.cuh and llmc/matmul.cuh) against the host: fp8.h's
software encode, fp8_scaling.h's state machine, and exact or double-precision GEMMs.
Runs on a GPU under make gpucheck, and under cudasim (test/cudasim) in make test.
- casts, bit for bit: every code (row-major and transposed) equals fp8_quantize on the host
  of the value as stored (bf16, or the fp32 master weight), at shapes that are not
  multiples of the 128 tile (80 x 208, 272 x 208) and at 256 x 384; amax exact; the
  saturated / flushed / element counts equal fp8_classify's; the scale recorded; the block
  recipe's scales and their cuBLASLt layouts (VEC128: [col/128][rows], BLK128x128:
  [row/128][round_up(ceil(cols/128), 4)]).
- the batched weight casts and W^T transposes (one launch for a kind's weights in every
  layer): codes, W^T, records, states and block scales equal the one-weight cast's, byte for byte.
- the block recipe's sharded weight cast (ZeRO): W in 2, 3 or 8 flat parts that cut 128x128
  blocks, partial block amaxes MAX-ed, each part cast with the global block scales, W^T
  transposed from the codes: codes and both scale layouts equal the whole-weight cast's.
- the scaling state after fp8_scaling_update_records (and after the current-scaling casts)
  equals the host state machine byte for byte; fp8_cast_records_read reports and clears.
- layernorm (plain and fused residual) and GELU with the fused cast, in each recipe (the
  delayed one-pass cast, current scaling, the block recipe's tiles): their bf16 outputs equal
  the plain kernels' bit for bit, the codes and x^T are the host cast of those outputs (with
  the host state machine's scale, or the host's tile scales in their cuBLASLt layouts), and
  without a bf16 output (codes only) the same codes come and no bf16 is written; without x^T
  (-r 2's forward of qkv and fc) the same codes and record, and no x^T is written. GELU's
  input has a negative value larger than any other in magnitude (GELU maps it to about 0),
  so current scaling's amax is that of GELU's output, not of its input.
- replays (-r: x^T cast again in the backward) of the plain cast per tensor (delayed and
  current) and in 1x128 tiles, of layernorm and of GELU, each recipe: after the state's scale
  has moved on, x^T and its tile scales come out bit for bit as the cast wrote them, and the
  codes, the record and the state are untouched.
- dy: the fused pass gives dout * gelu' equal to gelu_backward_inplace, the bias gradient
  equal to the bf16 path's bit for bit (and within 1e-5 relative of a double sum), twice
  the same bits, and codes cast with the host-updated scale.
- FP8 GEMMs, exact: integer data (x, W in [-15, 15], dy in {0, +-1..8, +-12}: exact in E4M3
  and E5M2) with power-of-two dequantization scales give exactly the integer sums rounded
  once to bf16: forward with fast accumulation (K = 32, partial sums below 2^12), forward
  without it and with the bias epilogue (K = 208), dgrad, wgrad accumulating into bf16 and
  into fp32. dgrad through GELU (-ge 2's DGELU epilogue, where cuBLASLt has it with FP8
  operands): the exact sums times GELU's derivative at the pre-activation, rounded once, within
  the forward GELU epilogue's tolerance (cuBLASLt's formula, not ours). The block recipe: data whose every tile amax is 14 * 2^-e (scales 32 * 2^e,
  powers of two, different per tile) is exact too.
- FP8 GEMMs on Gaussian data, each recipe, vs fp64 GEMMs of the unquantized bf16 data:
  SQNR >= 25 dB forward, >= 24 dB with an E5M2 operand (E5M2's own ceiling is ~25 dB, see
  test_fp8_emulation.c), >= 25 dB in the block recipe (E4M3 throughout).
- bad shapes die with one clear line.
- the per-tensor sharded weight cast (fp8_cast_weight_part + fp8_scaling_publish_scales) and the
  resume's code rebuild (fp8_weight_codes) equal the whole-weight cast byte for byte; the restore
  of states after a skipped step; a loaded record's count checks; the smallest 16 x 32 cast.
- a cast that writes x^T alone counts its statistics; the record after fp8_scaling_update_with_amax;
  each FP8 GEMM spec's operand order, types, scale modes and fast accumulation (host side only).
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include "llmc/cuda_common.h"
#include "llmc/fp8.h"
#include "llmc/fp8_scaling.h"
#include "llmc/fp8_scaling.cuh"
#include "llmc/fp8_cast.cuh"
#include "llmc/layernorm.cuh"
#include "llmc/gelu.cuh"
#include "llmc/matmul.cuh"
#include "llmc/rand.h"
#include "test/bf16_accumulate.h"
#include "test/test_harness.h"
#include "test/test_harness_fork.h"
#include "test/gpu_test_copies.cuh"

static mt19937_state test_rng;

// ----------------------------------------------------------------------------
// host and device buffers

static float* host_floats(size_t n) { return (float*)mallocCheck(n * sizeof(float)); }

// Gaussian values rounded to bf16 (returned as floats, exactly the bf16 values)
static float* host_bf16_normal(size_t n, float std) {
    float* x = host_floats(n);
    normal_(x, n, 0.0f, std, &test_rng);
    for (size_t i = 0; i < n; i++) { x[i] = bf16_bits_to_float(float_to_bf16_bits(x[i])); }
    return x;
}

static float* host_integers(size_t n, int lo, int hi) {
    float* x = host_floats(n);
    for (size_t i = 0; i < n; i++) { x[i] = (float)(lo + (int)(randint32(&test_rng) % (uint32_t)(hi - lo + 1))); }
    return x;
}

static void* device_alloc(size_t bytes) {
    void* d = cuda_malloc_checked(bytes, "a test buffer");
    cudaCheck(cudaMemset(d, 0xff, bytes));  // anything not written shows
    return d;
}

static floatX* device_bf16_from(const float* x, size_t n) {
    uint16_t* bits = (uint16_t*)mallocCheck(n * sizeof(uint16_t));
    for (size_t i = 0; i < n; i++) { bits[i] = float_to_bf16_bits(x[i]); }
    floatX* d = (floatX*)device_alloc(n * sizeof(floatX));
    cudaCheck(cudaMemcpy(d, bits, n * sizeof(uint16_t), cudaMemcpyHostToDevice));
    free(bits);
    return d;
}

static float* device_floats_from(const float* x, size_t n) { return (float*)device_copy(x, n * sizeof(float)); }

static float* download_bf16_as_floats(const floatX* d, size_t n) {
    uint16_t* bits = (uint16_t*)host_copy(d, n * sizeof(uint16_t));
    float* x = bf16_bits_to_floats(bits, n);
    free(bits);
    return x;
}

// counts the positions where two byte arrays differ, reporting the first
static size_t count_code_mismatches(const uint8_t* got, const uint8_t* expected, size_t n, const char* what) {
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        if (got[i] != expected[i]) {
            if (bad == 0) { printf("  %s: first mismatch at %zu: got 0x%02x, expected 0x%02x\n", what, i, got[i], expected[i]); }
            bad++;
        }
    }
    return bad;
}

static size_t count_float_mismatches(const float* got, const float* expected, size_t n, const char* what) {
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        if (float_as_bits(got[i]) != float_as_bits(expected[i])) {
            if (bad == 0) { printf("  %s: first mismatch at %zu: got %.9g, expected %.9g\n", what, i, got[i], expected[i]); }
            bad++;
        }
    }
    return bad;
}

// ----------------------------------------------------------------------------
// one FP8 tensor on the device: codes, transposed codes, state, record, block scales

typedef struct {
    Fp8CastOutput out;
    int rows, cols;
} DeviceFp8;

static DeviceFp8 device_fp8_make(int rows, int cols, Fp8Format format, Fp8Scaling scaling, const Fp8TensorScaling* state) {
    DeviceFp8 t;
    memset(&t, 0, sizeof(t));
    t.rows = rows;
    t.cols = cols;
    t.out.format = format;
    t.out.scaling = scaling;
    t.out.codes = (uint8_t*)device_alloc((size_t)rows * cols);
    t.out.codes_t = (uint8_t*)device_alloc((size_t)rows * cols);
    t.out.record = (Fp8CastRecord*)device_alloc(sizeof(Fp8CastRecord));
    fp8_cast_records_init(t.out.record, 1, 0);
    if (scaling == FP8_SCALING_TENSOR) {
        t.out.state = (Fp8TensorScaling*)device_alloc(sizeof(Fp8TensorScaling));
        cudaCheck(cudaMemcpy(t.out.state, state, sizeof(Fp8TensorScaling), cudaMemcpyHostToDevice));
    } else {
        t.out.scale_inv = (float*)device_alloc(fp8_block_scale_floats(scaling, rows, cols) * sizeof(float));
        t.out.scale_inv_t = (float*)device_alloc(fp8_block_scale_floats(scaling, cols, rows) * sizeof(float));
    }
    return t;
}

static void device_fp8_free(DeviceFp8* t) {
    cudaCheck(cudaFree(t->out.codes));
    cudaCheck(cudaFree(t->out.codes_t));
    cudaCheck(cudaFree(t->out.record));
    if (t->out.state != NULL) { cudaCheck(cudaFree(t->out.state)); }
    if (t->out.scale_inv != NULL) { cudaCheck(cudaFree(t->out.scale_inv)); }
    if (t->out.scale_inv_t != NULL) { cudaCheck(cudaFree(t->out.scale_inv_t)); }
}

static Fp8CastRecord download_record(const DeviceFp8* t) {
    Fp8CastRecord r;
    Fp8CastRecord* h = (Fp8CastRecord*)host_copy(t->out.record, sizeof(Fp8CastRecord));
    r = *h;
    free(h);
    return r;
}

static Fp8TensorScaling download_state(const DeviceFp8* t) {
    Fp8TensorScaling s;
    Fp8TensorScaling* h = (Fp8TensorScaling*)host_copy(t->out.state, sizeof(Fp8TensorScaling));
    s = *h;
    free(h);
    return s;
}

// the host's cast of x [rows][cols] with per-element scales: codes, codes^T and the statistics
typedef struct {
    uint8_t* codes;
    uint8_t* codes_t;
    Fp8CastStats stats;
} HostCast;

typedef float (*ScaleOf)(const void* context, int row, int col, int transposed);

static HostCast host_cast(const float* x, int rows, int cols, Fp8Format format, ScaleOf scale_of, const void* context) {
    HostCast h;
    size_t n = (size_t)rows * cols;
    h.codes = (uint8_t*)mallocCheck(n);
    h.codes_t = (uint8_t*)mallocCheck(n);
    memset(&h.stats, 0, sizeof(h.stats));
    h.stats.scale = INFINITY;
    for (int r = 0; r < rows; r++) {
        for (int c = 0; c < cols; c++) {
            float value = x[(size_t)r * cols + c];
            float scale = scale_of(context, r, c, 0);
            uint8_t code = fp8_quantize(value, scale, format);
            h.codes[(size_t)r * cols + c] = code;
            fp8_cast_stats_add(&h.stats, value, fp8_classify(value, scale, code, format));
            if (scale < h.stats.scale) { h.stats.scale = scale; }
            h.codes_t[(size_t)c * rows + r] = fp8_quantize(value, scale_of(context, r, c, 1), format);
        }
    }
    return h;
}

static void host_cast_free(HostCast* h) {
    free(h->codes);
    free(h->codes_t);
}

static float scale_of_tensor(const void* context, int row, int col, int transposed) {
    (void)row; (void)col; (void)transposed;
    return *(const float*)context;
}

// the block recipe's scales of x [rows][cols], precomputed: 1x128 pieces along the rows
// (codes), 128x1 pieces along the columns (codes^T), and 128x128 blocks
typedef struct {
    int rows, cols;
    Fp8Scaling scaling;
    float* row_piece;  // [cols / 128][rows]
    float* col_piece;  // [rows / 128][cols]
    float* block;      // [rows / 128][cols / 128]
} TileContext;

static TileContext tile_context_make(const float* x, int rows, int cols, Fp8Scaling scaling) {
    TileContext t;
    t.rows = rows;
    t.cols = cols;
    t.scaling = scaling;
    int row_blocks = ceil_div(rows, FP8_TILE), col_blocks = ceil_div(cols, FP8_TILE);
    uint32_t* row_bits = (uint32_t*)calloc((size_t)col_blocks * rows, sizeof(uint32_t));
    uint32_t* col_bits = (uint32_t*)calloc((size_t)row_blocks * cols, sizeof(uint32_t));
    uint32_t* block_bits = (uint32_t*)calloc((size_t)row_blocks * col_blocks, sizeof(uint32_t));
    for (int r = 0; r < rows; r++) {
        for (int c = 0; c < cols; c++) {
            uint32_t b = fp8_amax_bits(x[(size_t)r * cols + c]);
            uint32_t* targets[3] = {&row_bits[(size_t)(c / FP8_TILE) * rows + r], &col_bits[(size_t)(r / FP8_TILE) * cols + c],
                                    &block_bits[(size_t)(r / FP8_TILE) * col_blocks + c / FP8_TILE]};
            for (int k = 0; k < 3; k++) { if (b > *targets[k]) { *targets[k] = b; } }
        }
    }
    size_t counts[3] = {(size_t)col_blocks * rows, (size_t)row_blocks * cols, (size_t)row_blocks * col_blocks};
    uint32_t* bits[3] = {row_bits, col_bits, block_bits};
    float** outputs[3] = {&t.row_piece, &t.col_piece, &t.block};
    for (int k = 0; k < 3; k++) {
        *outputs[k] = host_floats(counts[k]);
        for (size_t i = 0; i < counts[k]; i++) {
            (*outputs[k])[i] = fp8_scale_from_amax(bits_as_float(bits[k][i]), FP8_E4M3_MAX, 0);
        }
        free(bits[k]);
    }
    return t;
}

static void tile_context_free(TileContext* t) {
    free(t->row_piece);
    free(t->col_piece);
    free(t->block);
}

// the block recipe's scale of element (row, col) in codes (transposed: in codes^T)
static float scale_of_tile(const void* context, int row, int col, int transposed) {
    const TileContext* t = (const TileContext*)context;
    if (t->scaling == FP8_SCALING_BLOCKS_128x128) {
        return t->block[(size_t)(row / FP8_TILE) * ceil_div(t->cols, FP8_TILE) + col / FP8_TILE];
    }
    return transposed ? t->col_piece[(size_t)(row / FP8_TILE) * t->cols + col]
                      : t->row_piece[(size_t)(col / FP8_TILE) * t->rows + row];
}

static float host_amax(const float* x, size_t n) {
    uint32_t bits = 0;
    for (size_t i = 0; i < n; i++) { if (fp8_amax_bits(x[i]) > bits) { bits = fp8_amax_bits(x[i]); } }
    return bits_as_float(bits);
}

// compares a device cast with the host's: codes, codes^T, counts, amax; returns the host cast
static void check_cast(const DeviceFp8* t, const HostCast* h, bool transposed_only, const char* what) {
    size_t n = (size_t)t->rows * t->cols;
    char label[256];
    if (!transposed_only) {
        uint8_t* codes = (uint8_t*)host_copy(t->out.codes, n);
        snprintf(label, sizeof(label), "%s codes", what);
        CHECK(count_code_mismatches(codes, h->codes, n, label) == 0, "%s: codes differ from the host encode", what);
        free(codes);
    }
    uint8_t* codes_t = (uint8_t*)host_copy(t->out.codes_t, n);
    snprintf(label, sizeof(label), "%s codes_t", what);
    CHECK(count_code_mismatches(codes_t, h->codes_t, n, label) == 0, "%s: transposed codes differ from the host encode", what);
    free(codes_t);
    Fp8CastRecord r = download_record(t);
    CHECK(r.elements == h->stats.elements, "%s: %llu elements counted, expected %llu", what, r.elements,
          (unsigned long long)h->stats.elements);
    if (!transposed_only) {  // the block recipe's transposed cast has scales of its own; its counts are the row-major ones
        CHECK(r.saturated == h->stats.saturated && r.flushed == h->stats.flushed,
              "%s: saturated %llu flushed %llu, expected %llu %llu", what, r.saturated, r.flushed,
              (unsigned long long)h->stats.saturated, (unsigned long long)h->stats.flushed);
        CHECK(r.interval_min_scale_bits == float_as_bits(h->stats.scale), "%s: smallest scale %g, expected %g", what,
              bits_as_float(r.interval_min_scale_bits), h->stats.scale);
    }
    CHECK(r.interval_amax_bits == float_as_bits(h->stats.amax), "%s: amax %g, expected %g", what,
          bits_as_float(r.interval_amax_bits), h->stats.amax);
}

/*
The replay of the cast t just made (-r: the backward casts x^T again instead of keeping it;
fp8_cast.cuh's FP8_RECORD_NOTHING), after the state has moved on as it does between the forward
and the backward (per tensor: a scale unlike the cast's, which the replay must take from the
record): replay(x_t), given t's output with x^T only, writes x^T (and its 1x128 scales) bit
for bit as the cast did, and changes nothing else: not the codes, the record or the state.
*/
template <class Replay>
static void check_replay(const DeviceFp8* t, Replay replay, const char* what) {
    size_t n = (size_t)t->rows * t->cols;
    Fp8TensorScaling moved;
    if (t->out.state != NULL) {
        moved = download_state(t);
        moved.scale *= 2.0f;
        moved.scale_inv *= 0.5f;
        cudaCheck(cudaMemcpy(t->out.state, &moved, sizeof(moved), cudaMemcpyHostToDevice));
    }
    bool block = t->out.scaling != FP8_SCALING_TENSOR;
    size_t scale_bytes = block ? fp8_block_scale_floats(t->out.scaling, t->cols, t->rows) * sizeof(float) : 0;
    uint8_t* codes = (uint8_t*)host_copy(t->out.codes, n);
    uint8_t* codes_t = (uint8_t*)host_copy(t->out.codes_t, n);
    float* scale_inv_t = block ? (float*)host_copy(t->out.scale_inv_t, scale_bytes) : NULL;
    Fp8CastRecord record = download_record(t);
    cudaCheck(cudaMemset(t->out.codes_t, 0x55, n));
    if (block) { cudaCheck(cudaMemset(t->out.scale_inv_t, 0, scale_bytes)); }

    Fp8CastOutput x_t = t->out;
    x_t.codes = NULL;
    x_t.scale_inv = NULL;
    replay(&x_t);
    char label[256];
    snprintf(label, sizeof(label), "%s replay codes_t", what);
    uint8_t* replayed = (uint8_t*)host_copy(t->out.codes_t, n);
    CHECK(count_code_mismatches(replayed, codes_t, n, label) == 0, "%s: the replay's x^T differs from the cast's", what);
    uint8_t* codes_after = (uint8_t*)host_copy(t->out.codes, n);
    CHECK(memcmp(codes_after, codes, n) == 0, "%s: the replay wrote the row-major codes", what);
    if (block) {
        float* replayed_scales = (float*)host_copy(t->out.scale_inv_t, scale_bytes);
        CHECK(memcmp(replayed_scales, scale_inv_t, scale_bytes) == 0, "%s: the replay's x^T tile scales differ", what);
        free(replayed_scales);
    }
    Fp8CastRecord record_after = download_record(t);
    CHECK(memcmp(&record_after, &record, sizeof(record)) == 0, "%s: the replay changed the record", what);
    if (t->out.state != NULL) {
        Fp8TensorScaling state_after = download_state(t);
        CHECK(memcmp(&state_after, &moved, sizeof(moved)) == 0, "%s: the replay changed the state", what);
    }
    free(codes); free(codes_t); free(scale_inv_t); free(replayed); free(codes_after);
}

// ----------------------------------------------------------------------------
// casts with per-tensor scaling

/*
A delayed state whose history says amax 1.0 casts Gaussian data of std 0.2 (1.03, where
saturation starts, is 5 std): the values planted in the first 128x128 tile saturate, so
the other tiles count flushes alone (fp8_may_saturate; one is planted in the last tile), and
the counts must still be exact.
nan_tile: also a NaN and a saturating value in the last tile, where the NaN makes the amax
NaN, so that tile must classify every element and count the saturated one.
*/
static void test_cast_tensor(int rows, int cols, Fp8Format format, bool nan_tile) {
    char what[128];
    snprintf(what, sizeof(what), "fp8_cast_transpose %s %dx%d%s", fp8_format_name(format), rows, cols,
             nan_tile ? ", a NaN" : "");
    size_t n = (size_t)rows * cols;
    float* x = host_bf16_normal(n, 0.2f);
    x[3] = 0.0f;
    x[5] = -1e-12f;  // flushed to zero at these scales
    x[7] = bf16_bits_to_float(float_to_bf16_bits(-1e-6f));
    x[9] = 3.0f;
    x[(size_t)2 * cols + 1] = -2.0f;
    x[n - 5] = 1e-12f;  // a flush in the last tile, which saturates nothing unless nan_tile
    // the flushes there are counted from the zeros of codes and values (fp8_tally_counts8):
    // signed zeros are no flush, a denormal bf16 is one
    x[n - 7] = -0.0f;
    x[n - 9] = bf16_bits_to_float(0x0003u);  // a denormal bf16 (and float)
    x[n - 11] = bf16_bits_to_float(0x8001u);
    // zeros in each 4-byte word of a 16-byte bf16 vector (elements 6 and 7 here, rows are 16-element
    // multiples): a value zero missed by packed_zero_count would count as a flush
    x[n - 26] = 0.0f;
    x[n - 17] = -0.0f;
    if (nan_tile) {
        x[n - 1] = NAN;
        x[n - 2] = 2.5f;
    }
    Fp8TensorScaling state;
    fp8_scaling_init(&state, FP8_RECIPE_DELAYED, format, 4, 0);
    fp8_scaling_update(&state, 1.0f);
    DeviceFp8 t = device_fp8_make(rows, cols, format, FP8_SCALING_TENSOR, &state);
    floatX* d_x = device_bf16_from(x, n);
    fp8_cast_transpose(&t.out, d_x, rows, cols, 0);

    HostCast h = host_cast(x, rows, cols, format, scale_of_tensor, &state.scale);
    check_cast(&t, &h, false, what);
    CHECK(format == FP8_E5M2 || h.stats.saturated > 0, "%s: the test data should saturate some elements", what);
    CHECK(h.stats.flushed > 0, "%s: the test data should flush some elements", what);
    Fp8CastRecord r = download_record(&t);
    CHECK(r.scale == state.scale && r.scale_inv == state.scale_inv, "%s: recorded scale %g / %g, expected %g / %g",
          what, r.scale, r.scale_inv, state.scale, state.scale_inv);
    CHECK(r.amax_bits == float_as_bits(host_amax(x, n)), "%s: pending amax %g, expected %g", what,
          bits_as_float(r.amax_bits), host_amax(x, n));
    Fp8TensorScaling cast_state = download_state(&t);
    check_replay(&t, [&](const Fp8CastOutput* x_t) { fp8_cast_transpose_replay(x_t, d_x, rows, cols, 0); }, what);
    cudaCheck(cudaMemcpy(t.out.state, &cast_state, sizeof(cast_state), cudaMemcpyHostToDevice));  // as the cast left it

    // the delayed update: the device state equals the host state machine's, byte for byte
    fp8_scaling_update_records(t.out.state, t.out.record, 1, 0);
    fp8_scaling_update(&state, host_amax(x, n));
    Fp8TensorScaling device_state = download_state(&t);
    CHECK(memcmp(&device_state, &state, sizeof(state)) == 0, "%s: state after the update differs from the host's", what);
    CHECK(download_record(&t).amax_bits == 0u, "%s: the update must clear the pending amax", what);

    // the log's read: the interval's statistics, then cleared
    Fp8CastStats stats;
    fp8_cast_records_read(&stats, t.out.record, 1, 0);
    CHECK(stats.elements == n && stats.saturated == h.stats.saturated && stats.flushed == h.stats.flushed &&
          float_as_bits(stats.amax) == float_as_bits(h.stats.amax), "%s: fp8_cast_records_read reports wrong statistics", what);
    CHECK(float_as_bits(stats.scale) == float_as_bits(h.stats.scale), "%s: fp8_cast_records_read reports scale %g, expected %g",
          what, stats.scale, h.stats.scale);
    Fp8CastRecord cleared = download_record(&t);
    CHECK(cleared.elements == 0 && cleared.saturated == 0 && cleared.flushed == 0 && cleared.interval_amax_bits == 0,
          "%s: fp8_cast_records_read must clear the interval", what);
    CHECK(cleared.interval_min_scale_bits == FP8_NO_SCALE_BITS,  // else the next interval reports this one's scale
          "%s: fp8_cast_records_read must clear the interval's smallest scale", what);

    host_cast_free(&h);
    device_fp8_free(&t);
    cudaCheck(cudaFree(d_x));
    free(x);
}

/*
A per-tensor cast that writes only x^T (an FP8 wgrad beside a bf16 dgrad: codes NULL) counts
its statistics from the transposed codes: the same elements, saturations and flushes as the
host's cast, under the one scale. A cast that counted only row-major codes would log an
empty interval for such a tensor.
*/
static void test_cast_transposed_only(int rows, int cols, Fp8Format format) {
    char what[128];
    snprintf(what, sizeof(what), "fp8_cast_transpose %s %dx%d, x^T only", fp8_format_name(format), rows, cols);
    size_t n = (size_t)rows * cols;
    float* x = host_bf16_normal(n, 0.2f);
    x[9] = 3.0f;                        // saturates (E4M3) under amax 1.0's scale
    x[(size_t)2 * cols + 1] = -2.0f;
    x[5] = -1e-12f;                     // flushed
    x[n - 5] = 1e-12f;                  // a flush in the last tile, which saturates nothing
    x[n - 7] = -0.0f;                   // a zero value: no flush
    Fp8TensorScaling state;
    fp8_scaling_init(&state, FP8_RECIPE_DELAYED, format, 4, 0);
    fp8_scaling_update(&state, 1.0f);
    DeviceFp8 t = device_fp8_make(rows, cols, format, FP8_SCALING_TENSOR, &state);
    floatX* d_x = device_bf16_from(x, n);
    Fp8CastOutput x_t = t.out;
    x_t.codes = NULL;
    fp8_cast_transpose(&x_t, d_x, rows, cols, 0);

    HostCast h = host_cast(x, rows, cols, format, scale_of_tensor, &state.scale);
    CHECK(h.stats.flushed > 0 && (format == FP8_E5M2 || h.stats.saturated > 0),
          "%s: the test data should flush (and in E4M3 saturate) some elements", what);
    uint8_t* codes_t = (uint8_t*)host_copy(t.out.codes_t, n);
    CHECK(count_code_mismatches(codes_t, h.codes_t, n, what) == 0, "%s: transposed codes differ from the host encode", what);
    free(codes_t);
    Fp8CastRecord r = download_record(&t);
    CHECK(r.elements == h.stats.elements && r.saturated == h.stats.saturated && r.flushed == h.stats.flushed,
          "%s: %llu elements, %llu saturated, %llu flushed counted, expected %llu %llu %llu", what, r.elements,
          r.saturated, r.flushed, (unsigned long long)h.stats.elements, (unsigned long long)h.stats.saturated,
          (unsigned long long)h.stats.flushed);
    CHECK(r.interval_min_scale_bits == float_as_bits(h.stats.scale) && r.interval_amax_bits == float_as_bits(h.stats.amax),
          "%s: smallest scale %g and amax %g, expected %g and %g", what, bits_as_float(r.interval_min_scale_bits),
          bits_as_float(r.interval_amax_bits), h.stats.scale, h.stats.amax);
    host_cast_free(&h);
    device_fp8_free(&t);
    cudaCheck(cudaFree(d_x));
    free(x);
}

/*
The amax pass on a tensor longer than its grid's first sweep (2048 blocks of 256 threads, 4
vectors each: 2^21 vectors), so threads take a second batch, the last one short: the amax is
the host's, for a largest value planted among the last elements, then (GELU transform) in the
first sweep.
*/
static void test_amax_pass_long(void) {
    const size_t n = ((size_t)1 << 24) + ((size_t)3 << 20) + 16;  // 19 Mi + 16 bf16 elements
    float* x = host_floats(n);
    for (size_t i = 0; i < n; i++) {  // in [-0.5, 0.5), as stored in bf16
        x[i] = bf16_bits_to_float(float_to_bf16_bits((float)((i * 2654435761u) % 1000u) / 1000.0f - 0.5f));
    }
    x[n - 3] = -7.5f;
    floatX* d_x = device_bf16_from(x, n);
    Fp8CastRecord* d_record = (Fp8CastRecord*)device_alloc(sizeof(Fp8CastRecord));
    fp8_cast_records_init(d_record, 1, 0);
    fp8_amax_launch(d_record, d_x, n, Fp8Identity(), 0);
    Fp8CastRecord* r = (Fp8CastRecord*)host_copy(d_record, sizeof(Fp8CastRecord));
    CHECK(r->amax_bits == float_as_bits(7.5f), "fp8 amax pass over %zu elements: amax %g, expected 7.5", n, bits_as_float(r->amax_bits));
    free(r);
    x[n - 3] = 0.0f;
    x[12345] = 3.25f;  // GELU(3.25) rounded to bf16 is the largest transformed value
    cudaCheck(cudaFree(d_x));
    d_x = device_bf16_from(x, n);
    fp8_cast_records_init(d_record, 1, 0);
    fp8_amax_launch(d_record, d_x, n, Fp8GeluTransform(), 0);
    r = (Fp8CastRecord*)host_copy(d_record, sizeof(Fp8CastRecord));
    float expected = bf16_bits_to_float(float_to_bf16_bits(gelu_forward_element(3.25f)));
    CHECK_CLOSE(bits_as_float(r->amax_bits), expected, 0.0, 1e-2, "fp8 amax pass with GELU over a long tensor");
    free(r);
    cudaCheck(cudaFree(d_x));
    cudaCheck(cudaFree(d_record));
    free(x);
}

// current scaling (and a delayed tensor's first use): amax, update, cast with the new scale
static void test_cast_current(int rows, int cols, Fp8Recipe recipe) {
    char what[128];
    snprintf(what, sizeof(what), "fp8_cast_transpose_current recipe %d %dx%d", (int)recipe, rows, cols);
    size_t n = (size_t)rows * cols;
    float* x = host_bf16_normal(n, 3.0f);
    Fp8TensorScaling state;
    fp8_scaling_init(&state, recipe, FP8_E4M3, 16, 1);
    CHECK(fp8_scaling_casts_after_update(&state), "%s: a fresh state casts after its update", what);
    DeviceFp8 t = device_fp8_make(rows, cols, FP8_E4M3, FP8_SCALING_TENSOR, &state);
    floatX* d_x = device_bf16_from(x, n);
    fp8_cast_transpose_current(&t.out, d_x, rows, cols, 0);
    fp8_scaling_update(&state, host_amax(x, n));
    Fp8TensorScaling device_state = download_state(&t);
    CHECK(memcmp(&device_state, &state, sizeof(state)) == 0, "%s: state differs from the host state machine", what);
    HostCast h = host_cast(x, rows, cols, FP8_E4M3, scale_of_tensor, &state.scale);
    check_cast(&t, &h, false, what);
    CHECK(download_record(&t).amax_bits == 0u, "%s: the cast after the update must not record amax again", what);
    check_replay(&t, [&](const Fp8CastOutput* x_t) { fp8_cast_transpose_replay(x_t, d_x, rows, cols, 0); }, what);
    host_cast_free(&h);
    device_fp8_free(&t);
    cudaCheck(cudaFree(d_x));
    free(x);
}

// ----------------------------------------------------------------------------
// block recipe casts

static void check_block_scales(const DeviceFp8* t, const TileContext* context, const char* what) {
    int rows = t->rows, cols = t->cols;
    Fp8Scaling scaling = context->scaling;
    size_t floats = fp8_block_scale_floats(scaling, rows, cols);
    size_t floats_t = fp8_block_scale_floats(scaling, cols, rows);
    float* got = (float*)host_copy(t->out.scale_inv, floats * sizeof(float));
    float* got_t = (float*)host_copy(t->out.scale_inv_t, floats_t * sizeof(float));
    size_t bad = 0;
    for (int r = 0; r < rows; r++) {
        for (int c = 0; c < cols; c++) {
            float inv = fp8_reciprocal(scale_of_tile(context, r, c, 0));
            float inv_t = fp8_reciprocal(scale_of_tile(context, r, c, 1));
            size_t at, at_t;
            if (scaling == FP8_SCALING_ROWS_1x128) {
                at = (size_t)(c / FP8_TILE) * rows + r;
                at_t = (size_t)(r / FP8_TILE) * cols + c;
            } else {
                at = (size_t)(r / FP8_TILE) * fp8_block_scale_ld(cols) + c / FP8_TILE;
                at_t = (size_t)(c / FP8_TILE) * fp8_block_scale_ld(rows) + r / FP8_TILE;
            }
            bad += float_as_bits(got[at]) != float_as_bits(inv);
            bad += float_as_bits(got_t[at_t]) != float_as_bits(inv_t);
        }
    }
    CHECK(bad == 0, "%s: %zu dequantization scales differ from the host's (value or cuBLASLt layout)", what, bad);
    free(got);
    free(got_t);
}

static void test_cast_blocks(int rows, int cols) {
    size_t n = (size_t)rows * cols;
    float* x = host_bf16_normal(n, 1.0f);
    for (size_t i = 0; i < n; i += 97) { x[i] *= 64.0f; }  // tiles of different amax
    floatX* d_x = device_bf16_from(x, n);
    char what[128];

    // activations and gradients: 1x128 along the rows for codes, along the columns for codes^T
    snprintf(what, sizeof(what), "block 1x128 cast %dx%d", rows, cols);
    DeviceFp8 t = device_fp8_make(rows, cols, FP8_E4M3, FP8_SCALING_ROWS_1x128, NULL);
    fp8_cast_transpose(&t.out, d_x, rows, cols, 0);
    TileContext context = tile_context_make(x, rows, cols, FP8_SCALING_ROWS_1x128);
    HostCast h = host_cast(x, rows, cols, FP8_E4M3, scale_of_tile, &context);
    check_cast(&t, &h, false, what);
    check_block_scales(&t, &context, what);
    check_replay(&t, [&](const Fp8CastOutput* x_t) { fp8_cast_transpose_replay(x_t, d_x, rows, cols, 0); }, what);
    host_cast_free(&h);
    tile_context_free(&context);
    device_fp8_free(&t);

    // weights: 128x128 blocks, from the bf16 weight and from the fp32 master
    float* master = host_floats(n);
    normal_(master, n, 0.0f, 0.02f, &test_rng);
    float* d_master = device_floats_from(master, n);
    for (int from_master = 0; from_master < 2; from_master++) {
        snprintf(what, sizeof(what), "block 128x128 weight cast from %s %dx%d", from_master ? "fp32" : "bf16", rows, cols);
        const float* source = from_master ? master : x;
        DeviceFp8 w = device_fp8_make(rows, cols, FP8_E4M3, FP8_SCALING_BLOCKS_128x128, NULL);
        fp8_cast_weight(&w.out, from_master ? d_master : NULL, from_master ? NULL : d_x, rows, cols, false, 0);
        TileContext wc = tile_context_make(source, rows, cols, FP8_SCALING_BLOCKS_128x128);
        HostCast hw = host_cast(source, rows, cols, FP8_E4M3, scale_of_tile, &wc);
        check_cast(&w, &hw, false, what);
        check_block_scales(&w, &wc, what);
        host_cast_free(&hw);
        tile_context_free(&wc);
        device_fp8_free(&w);
    }

    // per-tensor weight cast from the fp32 master: current scaling, state as the host's. It
    // saturates nothing, so flushes are counted from the zeros: plant signed zeros, a denormal and
    // values that flush
    snprintf(what, sizeof(what), "per-tensor weight cast from fp32 %dx%d", rows, cols);
    const float planted[6] = {0.0f, -0.0f, 1e-40f, -1e-9f, 1e-9f, -0.0f};
    for (int k = 0; k < 6; k++) { master[(size_t)k * 37] = planted[k]; }
    cudaCheck(cudaMemcpy(d_master, master, n * sizeof(float), cudaMemcpyHostToDevice));
    Fp8TensorScaling state;
    fp8_scaling_init(&state, FP8_RECIPE_CURRENT, FP8_E4M3, 16, 0);
    DeviceFp8 w = device_fp8_make(rows, cols, FP8_E4M3, FP8_SCALING_TENSOR, &state);
    fp8_cast_weight(&w.out, d_master, NULL, rows, cols, false, 0);
    fp8_scaling_update(&state, host_amax(master, n));
    Fp8TensorScaling device_state = download_state(&w);
    CHECK(memcmp(&device_state, &state, sizeof(state)) == 0, "%s: state differs from the host state machine", what);
    HostCast hw = host_cast(master, rows, cols, FP8_E4M3, scale_of_tensor, &state.scale);
    check_cast(&w, &hw, false, what);
    CHECK(hw.stats.flushed >= 3 && hw.stats.saturated == 0, "%s: the test data should flush, not saturate", what);
    host_cast_free(&hw);
    device_fp8_free(&w);

    cudaCheck(cudaFree(d_master));
    cudaCheck(cudaFree(d_x));
    free(master);
    free(x);
}

/*
The batched weight casts and transposes after an optimizer step (Fp8CastJob, one launch for
`count` weights of a shape): each weight's codes, W^T, record, state and block scales equal
the one-weight cast's (fp8_cast_weight with the amax known), byte for byte. The weights sit in
one input buffer at offsets out of order (job z is not weight z's position), from the fp32
master and from bf16; then W^T is cleared and fp8_transpose_codes_batched rebuilds it.
*/
static void test_batched_weight_casts(int rows, int cols, int count, Fp8Scaling scaling) {
    size_t n = (size_t)rows * cols, gap = 48, stride = n + gap;  // stride: 16-byte aligned in bf16 and fp32
    float* master = host_floats(stride * count);
    normal_(master, stride * count, 0.0f, 0.02f, &test_rng);
    for (size_t i = 0; i < stride * count; i += 89) { master[i] *= (float)(1 + i % 7); }  // amaxes differ by weight and tile
    float* d_master = device_floats_from(master, stride * count);
    floatX* d_x = device_bf16_from(master, stride * count);  // the bf16 weights
    bool per_tensor = scaling == FP8_SCALING_TENSOR;
    Fp8TensorScaling state;
    fp8_scaling_init(&state, FP8_RECIPE_CURRENT, FP8_E4M3, 16, 0);
    Fp8TensorScaling* d_states = (Fp8TensorScaling*)device_alloc((size_t)count * sizeof(Fp8TensorScaling));
    Fp8CastRecord* d_records = (Fp8CastRecord*)device_alloc((size_t)count * sizeof(Fp8CastRecord));
    DeviceFp8* one = (DeviceFp8*)mallocCheck((size_t)count * sizeof(DeviceFp8));
    DeviceFp8* batched = (DeviceFp8*)mallocCheck((size_t)count * sizeof(DeviceFp8));
    Fp8CastJob* jobs = (Fp8CastJob*)mallocCheck((size_t)count * sizeof(Fp8CastJob));
    Fp8CastJob* d_jobs = (Fp8CastJob*)device_alloc((size_t)count * sizeof(Fp8CastJob));
    for (int from_master = 0; from_master < 2; from_master++) {
        char what[160];
        snprintf(what, sizeof(what), "batched %s weight casts from %s, %d of %dx%d", per_tensor ? "per-tensor" : "128x128 block",
                 from_master ? "fp32" : "bf16", count, rows, cols);
        for (int z = 0; z < count; z++) {
            size_t offset = stride * (size_t)((z * 2 + 1) % count);  // out of order (count odd)
            one[z] = device_fp8_make(rows, cols, FP8_E4M3, scaling, &state);
            fp8_cast_weight(&one[z].out, from_master ? d_master + offset : NULL, from_master ? NULL : d_x + offset, rows, cols,
                            false, 0);
            batched[z] = device_fp8_make(rows, cols, FP8_E4M3, scaling, &state);
            cudaCheck(cudaFree(batched[z].out.record));  // the batch's records and states are one array each,
            batched[z].out.record = d_records + z;        // as the model's, for one fp8_scaling_update_records
            fp8_cast_records_init(batched[z].out.record, 1, 0);
            if (per_tensor) {
                cudaCheck(cudaFree(batched[z].out.state));
                batched[z].out.state = d_states + z;
                cudaCheck(cudaMemcpy(batched[z].out.state, &state, sizeof(state), cudaMemcpyHostToDevice));
                // the optimizer pass's amax (fp8_model_weight_update)
                if (from_master) { fp8_amax_launch(batched[z].out.record, d_master + offset, n, Fp8Identity(), 0); }
                else { fp8_amax_launch(batched[z].out.record, d_x + offset, n, Fp8Identity(), 0); }
            }
            jobs[z].out = batched[z].out;
            jobs[z].in_offset = offset;
        }
        cudaCheck(cudaMemcpy(d_jobs, jobs, (size_t)count * sizeof(Fp8CastJob), cudaMemcpyHostToDevice));
        if (per_tensor) { fp8_scaling_update_records(d_states, d_records, count, 0); }
        if (from_master) { fp8_cast_weights_batched(d_jobs, count, &jobs[0].out, (const float*)d_master, rows, cols, 0); }
        else { fp8_cast_weights_batched(d_jobs, count, &jobs[0].out, (const floatX*)d_x, rows, cols, 0); }
        for (int pass = 0; pass < 2; pass++) {  // the casts, then W^T again from the codes alone
            if (pass == 1) {
                for (int z = 0; z < count; z++) { cudaCheck(cudaMemset(batched[z].out.codes_t, 0, n)); }
                fp8_transpose_codes_batched(d_jobs, count, &jobs[0].out, rows, cols, 0);
            }
            for (int z = 0; z < count; z++) {
                char label[200];
                snprintf(label, sizeof(label), "%s%s, weight %d", what, pass == 1 ? " (W^T transposed)" : "", z);
                uint8_t* expected[2] = {(uint8_t*)host_copy(one[z].out.codes, n), (uint8_t*)host_copy(one[z].out.codes_t, n)};
                uint8_t* got[2] = {(uint8_t*)host_copy(batched[z].out.codes, n), (uint8_t*)host_copy(batched[z].out.codes_t, n)};
                CHECK(count_code_mismatches(got[0], expected[0], n, label) == 0, "%s: codes differ from the one-weight cast", label);
                CHECK(count_code_mismatches(got[1], expected[1], n, label) == 0, "%s: W^T differs from the one-weight cast", label);
                for (int k = 0; k < 2; k++) { free(expected[k]); free(got[k]); }
                Fp8CastRecord r_one = download_record(&one[z]), r_batched = download_record(&batched[z]);
                CHECK(memcmp(&r_one, &r_batched, sizeof(r_one)) == 0, "%s: record differs from the one-weight cast's", label);
                if (per_tensor) {
                    Fp8TensorScaling s_one = download_state(&one[z]), s_batched = download_state(&batched[z]);
                    CHECK(memcmp(&s_one, &s_batched, sizeof(s_one)) == 0, "%s: state differs from the one-weight cast's", label);
                } else {
                    size_t scales = fp8_block_scale_floats(scaling, rows, cols) * sizeof(float);
                    size_t scales_t = fp8_block_scale_floats(scaling, cols, rows) * sizeof(float);
                    void* e[2] = {host_copy(one[z].out.scale_inv, scales), host_copy(one[z].out.scale_inv_t, scales_t)};
                    void* g[2] = {host_copy(batched[z].out.scale_inv, scales), host_copy(batched[z].out.scale_inv_t, scales_t)};
                    CHECK(memcmp(e[0], g[0], scales) == 0 && memcmp(e[1], g[1], scales_t) == 0,
                          "%s: block scales differ from the one-weight cast's", label);
                    for (int k = 0; k < 2; k++) { free(e[k]); free(g[k]); }
                }
            }
        }
        for (int z = 0; z < count; z++) {
            device_fp8_free(&one[z]);
            batched[z].out.record = NULL;  // the arrays', freed below
            batched[z].out.state = NULL;
            cudaCheck(cudaFree(batched[z].out.codes));
            cudaCheck(cudaFree(batched[z].out.codes_t));
            if (batched[z].out.scale_inv != NULL) { cudaCheck(cudaFree(batched[z].out.scale_inv)); }
            if (batched[z].out.scale_inv_t != NULL) { cudaCheck(cudaFree(batched[z].out.scale_inv_t)); }
        }
    }
    cudaCheck(cudaFree(d_jobs)); cudaCheck(cudaFree(d_states)); cudaCheck(cudaFree(d_records));
    cudaCheck(cudaFree(d_master)); cudaCheck(cudaFree(d_x));
    free(jobs); free(one); free(batched); free(master);
}

/*
The block recipe's sharded weight cast (ZeRO, zero_comm.cuh): W [rows][cols] split into
`parts` flat parts at multiples of 256 (cutting 128x128 blocks), each part's partial block
amaxes (fp8_block_amax_part, one array per simulated rank), their MAX on the host (the
all-reduce), each part's scales and codes (fp8_cast_weight_block_part), W^T transposed from
the gathered codes: codes, W^T codes and both scale layouts equal the whole-weight cast's
bit for bit. The amax of each cut block sits at the cut, on the later part's first element
(edge 0) or the earlier part's last (edge 1), so a partial amax missing an end shows.
*/
static void test_cast_weight_block_parts(int rows, int cols, int parts) {
    size_t n = (size_t)rows * cols;
    size_t blocks = fp8_weight_blocks(rows, cols);
    size_t* bounds = (size_t*)mallocCheck((size_t)(parts + 1) * sizeof(size_t));
    for (int k = 0; k <= parts; k++) { bounds[k] = n / 256 * (size_t)k / (size_t)parts * 256; }
    bounds[parts] = n;
    for (int edge = 0; edge < 2; edge++) {
        float* x = host_bf16_normal(n, 1.0f);
        for (int k = 1; k < parts; k++) { x[bounds[k] - (size_t)edge] = edge ? -1024.0f : 1024.0f; }
        floatX* d_x = device_bf16_from(x, n);
        float* d_master = device_floats_from(x, n);
        for (int from_master = 0; from_master < 2; from_master++) {
            char what[128];
            snprintf(what, sizeof(what), "block weight cast in %d parts from %s %dx%d edge %d", parts,
                     from_master ? "fp32" : "bf16", rows, cols, edge);
            DeviceFp8 whole = device_fp8_make(rows, cols, FP8_E4M3, FP8_SCALING_BLOCKS_128x128, NULL);
            fp8_cast_weight(&whole.out, from_master ? d_master : NULL, from_master ? NULL : d_x, rows, cols, false, 0);
            // each simulated rank's partial block amaxes, then their MAX (the all-reduce)
            uint32_t* d_amax = (uint32_t*)device_alloc(blocks * sizeof(uint32_t));
            uint32_t* global = (uint32_t*)calloc(blocks, sizeof(uint32_t));
            for (int k = 0; k < parts; k++) {
                cudaCheck(cudaMemset(d_amax, 0, blocks * sizeof(uint32_t)));
                size_t first = bounds[k], count = bounds[k + 1] - bounds[k];
                if (from_master) { fp8_block_amax_part(d_amax, d_master + first, first, count, cols, 0); }
                else { fp8_block_amax_part(d_amax, d_x + first, first, count, cols, 0); }
                uint32_t* partial = (uint32_t*)host_copy(d_amax, blocks * sizeof(uint32_t));
                for (size_t b = 0; b < blocks; b++) { global[b] = partial[b] > global[b] ? partial[b] : global[b]; }
                free(partial);
            }
            cudaCheck(cudaMemcpy(d_amax, global, blocks * sizeof(uint32_t), cudaMemcpyHostToDevice));
            DeviceFp8 sharded = device_fp8_make(rows, cols, FP8_E4M3, FP8_SCALING_BLOCKS_128x128, NULL);
            for (int k = 0; k < parts; k++) {
                size_t first = bounds[k], count = bounds[k + 1] - bounds[k];
                if (from_master) { fp8_cast_weight_block_part(&sharded.out, d_master + first, first, count, rows, cols, d_amax, 0); }
                else { fp8_cast_weight_block_part(&sharded.out, d_x + first, first, count, rows, cols, d_amax, 0); }
            }
            fp8_transpose_codes(sharded.out.codes, sharded.out.codes_t, rows, cols, 0);
            uint8_t* codes[2][2];
            float* scales[2][2];
            const DeviceFp8* casts[2] = {&whole, &sharded};
            size_t floats = fp8_block_scale_floats(FP8_SCALING_BLOCKS_128x128, rows, cols);
            size_t floats_t = fp8_block_scale_floats(FP8_SCALING_BLOCKS_128x128, cols, rows);
            for (int c = 0; c < 2; c++) {
                codes[c][0] = (uint8_t*)host_copy(casts[c]->out.codes, n);
                codes[c][1] = (uint8_t*)host_copy(casts[c]->out.codes_t, n);
                scales[c][0] = (float*)host_copy(casts[c]->out.scale_inv, floats * sizeof(float));
                scales[c][1] = (float*)host_copy(casts[c]->out.scale_inv_t, floats_t * sizeof(float));
            }
            CHECK(memcmp(codes[0][0], codes[1][0], n) == 0, "%s: W codes differ from the whole-weight cast", what);
            CHECK(memcmp(codes[0][1], codes[1][1], n) == 0, "%s: W^T codes differ from the whole-weight cast", what);
            CHECK(memcmp(scales[0][0], scales[1][0], floats * sizeof(float)) == 0, "%s: W scale_inv differs", what);
            CHECK(memcmp(scales[0][1], scales[1][1], floats_t * sizeof(float)) == 0, "%s: W^T scale_inv differs", what);
            // the parts' record is the whole cast's: the same counts, amax and smallest scale, and no
            // pending amax (a block recipe's cast records no use for a state update)
            Fp8CastRecord records[2] = {download_record(&whole), download_record(&sharded)};
            CHECK(records[1].elements == records[0].elements && records[1].saturated == records[0].saturated &&
                  records[1].flushed == records[0].flushed && records[1].interval_amax_bits == records[0].interval_amax_bits &&
                  records[1].interval_min_scale_bits == records[0].interval_min_scale_bits,
                  "%s: the parts' record counts %llu elements, %llu saturated, %llu flushed (amax bits %08x, scale bits %08x); "
                  "the whole cast's %llu, %llu, %llu (%08x, %08x)", what, records[1].elements, records[1].saturated,
                  records[1].flushed, records[1].interval_amax_bits, records[1].interval_min_scale_bits, records[0].elements,
                  records[0].saturated, records[0].flushed, records[0].interval_amax_bits, records[0].interval_min_scale_bits);
            CHECK(records[0].amax_bits == 0u && records[1].amax_bits == 0u,
                  "%s: a pending amax recorded (whole cast %08x, parts %08x)", what, records[0].amax_bits, records[1].amax_bits);
            for (int c = 0; c < 2; c++) {
                for (int j = 0; j < 2; j++) { free(codes[c][j]); free(scales[c][j]); }
            }
            free(global);
            cudaCheck(cudaFree(d_amax));
            device_fp8_free(&whole);
            device_fp8_free(&sharded);
        }
        cudaCheck(cudaFree(d_x));
        cudaCheck(cudaFree(d_master));
        free(x);
    }
    free(bounds);
}

// ----------------------------------------------------------------------------
// layernorm and GELU with the fused cast, in each of the three ways a producer casts

typedef enum {
    PRODUCER_CAST_DELAYED,  // per tensor, the scale known: the delayed recipe's one-pass cast
    PRODUCER_CAST_CURRENT,  // per tensor, current scaling: amax, update, cast
    PRODUCER_CAST_BLOCK,    // the block recipe's 1x128 tiles
} ProducerCast;

static const char* producer_cast_name(ProducerCast cast) {
    return cast == PRODUCER_CAST_DELAYED ? "delayed" : cast == PRODUCER_CAST_CURRENT ? "current" : "block";
}

// the device tensor a producer test casts into; delayed_amax: the delayed state's history
static DeviceFp8 producer_cast_make(ProducerCast cast, int N, int C, float delayed_amax, Fp8TensorScaling* state) {
    fp8_scaling_init(state, FP8_RECIPE_DELAYED, FP8_E4M3, 16, 0);
    if (cast == PRODUCER_CAST_DELAYED) { fp8_scaling_update(state, delayed_amax); }
    if (cast == PRODUCER_CAST_BLOCK) { return device_fp8_make(N, C, FP8_E4M3, FP8_SCALING_ROWS_1x128, NULL); }
    return device_fp8_make(N, C, FP8_E4M3, FP8_SCALING_TENSOR, state);
}

// puts the tensor back as producer_cast_make left it (a second run must see the same state)
static void producer_cast_reset(DeviceFp8* t, const Fp8TensorScaling* initial) {
    size_t n = (size_t)t->rows * t->cols;
    cudaCheck(cudaMemset(t->out.codes, 0, n));
    cudaCheck(cudaMemset(t->out.codes_t, 0, n));
    fp8_cast_records_init(t->out.record, 1, 0);
    if (t->out.state != NULL) {
        cudaCheck(cudaMemcpy(t->out.state, initial, sizeof(Fp8TensorScaling), cudaMemcpyHostToDevice));
    }
}

/*
Checks a producer's cast of `stored` (its bf16 output, [N][C]) against the host: codes and
x^T bit for bit, counts and amax; delayed: the record's pending amax and the scale used;
current: the device state equals the host state machine after this amax, and no amax is left
pending; block: the tile scales and their layouts. initial: the state before the cast.
*/
static void check_producer_cast(ProducerCast cast, const DeviceFp8* t, const float* stored, const Fp8TensorScaling* initial,
                                 const char* what) {
    int N = t->rows, C = t->cols;
    size_t n = (size_t)N * C;
    if (cast == PRODUCER_CAST_BLOCK) {
        TileContext context = tile_context_make(stored, N, C, FP8_SCALING_ROWS_1x128);
        HostCast h = host_cast(stored, N, C, FP8_E4M3, scale_of_tile, &context);
        check_cast(t, &h, false, what);
        check_block_scales(t, &context, what);
        host_cast_free(&h);
        tile_context_free(&context);
        return;
    }
    Fp8TensorScaling state = *initial;
    if (cast == PRODUCER_CAST_CURRENT) { fp8_scaling_update(&state, host_amax(stored, n)); }
    HostCast h = host_cast(stored, N, C, FP8_E4M3, scale_of_tensor, &state.scale);
    check_cast(t, &h, false, what);
    Fp8CastRecord r = download_record(t);
    CHECK(r.scale == state.scale && r.scale_inv == state.scale_inv, "%s: the record's scale is not the one cast with", what);
    if (cast == PRODUCER_CAST_DELAYED) {
        CHECK(r.amax_bits == float_as_bits(h.stats.amax), "%s: the record's pending amax is wrong", what);
    } else {
        Fp8TensorScaling device_state = download_state(t);
        CHECK(memcmp(&device_state, &state, sizeof(state)) == 0, "%s: state differs from the host state machine", what);
        CHECK(r.amax_bits == 0u, "%s: the cast after the update must not leave an amax pending", what);
    }
    host_cast_free(&h);
}

// two bf16 device tensors bit for bit
static void check_same_bf16(const floatX* d_got, const floatX* d_expected, size_t n, const char* what, const char* tensor) {
    float* got = download_bf16_as_floats(d_got, n);
    float* expected = download_bf16_as_floats(d_expected, n);
    CHECK(count_float_mismatches(got, expected, n, what) == 0, "%s: %s differs from the plain kernel's", what, tensor);
    free(got);
    free(expected);
}

static void run_layernorm_fp8(ProducerCast cast, const Fp8CastOutput* out, floatX* residual, floatX* normed, float* mean,
                              float* rstd, const floatX* inp1, const floatX* inp2, const floatX* weight, const floatX* bias,
                              int N, int C) {
    if (cast == PRODUCER_CAST_CURRENT) {
        layernorm_forward_fp8_current(out, residual, normed, mean, rstd, inp1, inp2, weight, bias, N, C, 0);
    } else {
        layernorm_forward_fp8(out, residual, normed, mean, rstd, inp1, inp2, weight, bias, N, C, 0);
    }
}

// a bf16 value whose E4M3 code at the layernorm tests' scales (448 / 3 and those of their amaxes) is 0
static float bias_tiny_value(void) { return bf16_bits_to_float(float_to_bf16_bits(1e-7f)); }

static void test_layernorm_fp8(int N, int C, bool fused_residual, ProducerCast cast) {
    char what[128];
    snprintf(what, sizeof(what), "%s fp8 %s N=%d C=%d", fused_residual ? "fused_residual_layernorm" : "layernorm",
             producer_cast_name(cast), N, C);
    size_t n = (size_t)N * C;
    float* inp1 = host_bf16_normal(n, 1.0f);
    float* inp2 = host_bf16_normal(n, 1.0f);
    float* weight = host_bf16_normal(C, 1.0f);
    float* bias = host_bf16_normal(C, 0.5f);
    // the first 4 rows are constant, so their output is the bias, which saturates nothing: the
    // one-pass cast's first warp counts flushes only; column 1's tiny weight and bias flush
    // to zero in every row
    for (size_t i = 0; i < (size_t)4 * C; i++) { inp1[i] = inp2[i] = 0.25f; }
    weight[1] = bias_tiny_value();
    bias[1] = bias_tiny_value();
    // column 2's output in the constant rows is exactly 0: a zero the flush-only counts must not take for a flush
    bias[2] = 0.0f;
    floatX *d_inp1 = device_bf16_from(inp1, n), *d_inp2 = fused_residual ? device_bf16_from(inp2, n) : NULL;
    floatX *d_weight = device_bf16_from(weight, C), *d_bias = device_bf16_from(bias, C);
    floatX *d_res_plain = (floatX*)device_alloc(n * 2), *d_res_fp8 = (floatX*)device_alloc(n * 2);
    floatX *d_out_plain = (floatX*)device_alloc(n * 2), *d_out_fp8 = (floatX*)device_alloc(n * 2);
    float* d_stats = (float*)device_alloc(4 * N * sizeof(float));
    Fp8TensorScaling state;
    DeviceFp8 t = producer_cast_make(cast, N, C, 3.0f, &state);  // delayed: saturates the output's tail beyond 3
    if (fused_residual) {
        fused_residual_layernorm_forward(d_res_plain, d_out_plain, d_stats, d_stats + N, d_inp1, d_inp2, d_weight, d_bias, N, C, 0);
    } else {
        layernorm_forward(d_out_plain, d_stats, d_stats + N, d_inp1, d_weight, d_bias, N, C, 0);
    }
    floatX* residual = fused_residual ? d_res_fp8 : NULL;
    run_layernorm_fp8(cast, &t.out, residual, d_out_fp8, d_stats + 2 * N, d_stats + 3 * N, d_inp1, d_inp2, d_weight, d_bias, N, C);
    float* out_plain = download_bf16_as_floats(d_out_plain, n);
    float* out_fp8 = download_bf16_as_floats(d_out_fp8, n);
    CHECK(count_float_mismatches(out_fp8, out_plain, n, what) == 0, "%s: bf16 output differs from the plain kernel's", what);
    float* stats = (float*)host_copy(d_stats, 4 * N * sizeof(float));
    CHECK(count_float_mismatches(stats + 2 * N, stats, 2 * N, what) == 0, "%s: mean/rstd differ from the plain kernel's", what);
    if (fused_residual) { check_same_bf16(d_res_fp8, d_res_plain, n, what, "the residual sum"); }
    check_producer_cast(cast, &t, out_plain, &state, what);
    // the replay normalizes the stored input (the residual sum where fused) with the mean and rstd written
    check_replay(&t, [&](const Fp8CastOutput* x_t) {
        layernorm_forward_fp8_replay(x_t, fused_residual ? d_res_fp8 : d_inp1, d_stats + 2 * N, d_stats + 3 * N, d_weight,
                                     d_bias, N, C, 0);
    }, what);
    if (cast == PRODUCER_CAST_DELAYED) {
        CHECK(download_record(&t).saturated > 0, "%s: the test data should saturate some elements", what);
        CHECK(download_record(&t).flushed > 0, "%s: the test data should flush some elements", what);
    }

    // codes only (no bf16 output): the same codes, and the output buffer untouched. The
    // one-pass cast needs no row statistics; the two-pass casts normalize from them.
    producer_cast_reset(&t, &state);
    cudaCheck(cudaMemset(d_out_fp8, 0, n * 2));
    cudaCheck(cudaMemset(d_res_fp8, 0, n * 2));  // the two-pass casts read the residual sum this run writes
    cudaCheck(cudaMemset(d_stats + 2 * N, 0, 2 * N * sizeof(float)));
    bool one_pass = cast == PRODUCER_CAST_DELAYED;
    run_layernorm_fp8(cast, &t.out, residual, NULL, one_pass ? NULL : d_stats + 2 * N, one_pass ? NULL : d_stats + 3 * N,
                      d_inp1, d_inp2, d_weight, d_bias, N, C);
    check_producer_cast(cast, &t, out_plain, &state, what);
    float* untouched = download_bf16_as_floats(d_out_fp8, n);
    size_t written = 0;
    for (size_t i = 0; i < n; i++) { written += untouched[i] != 0.0f; }
    CHECK(written == 0, "%s: %zu bf16 outputs written although normed_out is NULL", what, written);
    if (fused_residual) { check_same_bf16(d_res_fp8, d_res_plain, n, what, "codes only: the residual sum"); }

    // x's codes without x^T (the forward of a linear whose x^T -r casts again; the one-pass cast
    // then stages no tile): the same codes and record, and x^T left alone
    uint8_t* codes_with_t = (uint8_t*)host_copy(t.out.codes, n);
    Fp8CastRecord record_with_t = download_record(&t);
    producer_cast_reset(&t, &state);
    cudaCheck(cudaMemset(t.out.codes_t, 0x55, n));
    Fp8CastOutput x_only = t.out;
    x_only.codes_t = NULL;
    x_only.scale_inv_t = NULL;
    run_layernorm_fp8(cast, &x_only, residual, NULL, d_stats + 2 * N, d_stats + 3 * N, d_inp1, d_inp2, d_weight, d_bias, N, C);
    uint8_t* codes_without_t = (uint8_t*)host_copy(t.out.codes, n);
    uint8_t* codes_t_left = (uint8_t*)host_copy(t.out.codes_t, n);
    Fp8CastRecord record_without_t = download_record(&t);
    size_t t_written = 0;
    for (size_t i = 0; i < n; i++) { t_written += codes_t_left[i] != 0x55; }
    CHECK(memcmp(codes_without_t, codes_with_t, n) == 0, "%s: without x^T the codes differ", what);
    CHECK(memcmp(&record_without_t, &record_with_t, sizeof(Fp8CastRecord)) == 0, "%s: without x^T the record differs", what);
    CHECK(t_written == 0, "%s: %zu x^T bytes written although codes_t is NULL", what, t_written);
    free(codes_with_t); free(codes_without_t); free(codes_t_left);

    device_fp8_free(&t);
    free(untouched); free(stats); free(out_plain); free(out_fp8); free(inp1); free(inp2); free(weight); free(bias);
    void* buffers[9] = {d_inp1, d_inp2, d_weight, d_bias, d_res_plain, d_res_fp8, d_out_plain, d_out_fp8, d_stats};
    for (int i = 0; i < 9; i++) { if (buffers[i] != NULL) { cudaCheck(cudaFree(buffers[i])); } }
}

static void test_gelu_fp8(int N, int C, ProducerCast cast) {
    char what[128];
    snprintf(what, sizeof(what), "gelu_forward_fp8 %s N=%d C=%d", producer_cast_name(cast), N, C);
    size_t n = (size_t)N * C;
    float* pre = host_bf16_normal(n, 2.0f);
    // the largest |pre| negative, where GELU is about 0: the amax pass must see GELU's output
    pre[n / 3] = -16.0f;
    floatX* d_pre = device_bf16_from(pre, n);
    floatX *d_plain = (floatX*)device_alloc(n * 2), *d_fused = (floatX*)device_alloc(n * 2);
    Fp8TensorScaling state;
    DeviceFp8 t = producer_cast_make(cast, N, C, 2.5f, &state);
    gelu_forward(d_plain, d_pre, (int)n, 0);
    if (cast == PRODUCER_CAST_CURRENT) {
        gelu_forward_fp8_current(&t.out, d_fused, d_pre, N, C, 0);
    } else {
        gelu_forward_fp8(&t.out, d_fused, d_pre, N, C, 0);
    }
    float* plain = download_bf16_as_floats(d_plain, n);
    float* fused = download_bf16_as_floats(d_fused, n);
    CHECK(count_float_mismatches(fused, plain, n, what) == 0, "%s: bf16 GELU output differs from gelu_forward's", what);
    check_producer_cast(cast, &t, plain, &state, what);
    check_replay(&t, [&](const Fp8CastOutput* x_t) { gelu_forward_fp8_replay(x_t, d_pre, N, C, 0); }, what);
    device_fp8_free(&t);
    free(pre); free(plain); free(fused);
    cudaCheck(cudaFree(d_pre)); cudaCheck(cudaFree(d_plain)); cudaCheck(cudaFree(d_fused));
}

/*
The per-tensor sharded weight cast (ZeRO, zero_comm.cuh): W [rows][cols] in `parts` flat parts
at multiples of 16 (none on a row boundary), each cast by fp8_cast_weight_part with the scale
the whole cast's update made, then fp8_scaling_publish_scales: the codes and the whole record
(scale and scale_inv the GEMMs read, counts, interval amax and smallest scale) equal the
whole-weight cast's byte for byte (catches a part written at the wrong offset, or a scale_inv
not published). Then fp8_weight_codes rebuilds the codes from the record's scale alone (a
resume under -fw delayed): the same bytes again (catches a rebuild with any other scale).
*/
static void test_cast_weight_parts_per_tensor(int rows, int cols, int parts) {
    size_t n = (size_t)rows * cols;
    float* master = host_floats(n);
    normal_(master, n, 0.0f, 0.02f, &test_rng);
    for (size_t i = 0; i < n; i += 101) { master[i] *= 8.0f; }
    float* d_master = device_floats_from(master, n);
    floatX* d_x = device_bf16_from(master, n);
    Fp8TensorScaling state;
    fp8_scaling_init(&state, FP8_RECIPE_CURRENT, FP8_E4M3, 16, 0);
    for (int from_master = 0; from_master < 2; from_master++) {
        char what[128];
        snprintf(what, sizeof(what), "per-tensor weight cast in %d parts from %s %dx%d", parts, from_master ? "fp32" : "bf16",
                 rows, cols);
        DeviceFp8 whole = device_fp8_make(rows, cols, FP8_E4M3, FP8_SCALING_TENSOR, &state);
        fp8_cast_weight(&whole.out, from_master ? d_master : NULL, from_master ? NULL : d_x, rows, cols, false, 0);
        Fp8TensorScaling updated = download_state(&whole);  // what the all-reduced amax's update makes
        CHECK(updated.scale != 1.0f, "%s: the test needs a scale other than 1", what);
        DeviceFp8 sharded = device_fp8_make(rows, cols, FP8_E4M3, FP8_SCALING_TENSOR, &updated);
        for (int k = 0; k < parts; k++) {
            size_t first = n / 16 * (size_t)k / (size_t)parts * 16, last = n / 16 * (size_t)(k + 1) / (size_t)parts * 16;
            if (from_master) { fp8_cast_weight_part(&sharded.out, d_master + first, first, last - first, 0); }
            else { fp8_cast_weight_part(&sharded.out, d_x + first, first, last - first, 0); }
        }
        fp8_scaling_publish_scales(sharded.out.state, sharded.out.record, 1, 0);
        uint8_t* expected = (uint8_t*)host_copy(whole.out.codes, n);
        uint8_t* got = (uint8_t*)host_copy(sharded.out.codes, n);
        CHECK(count_code_mismatches(got, expected, n, what) == 0, "%s: codes differ from the whole-weight cast", what);
        free(got);
        Fp8CastRecord r_whole = download_record(&whole), r_sharded = download_record(&sharded);
        CHECK(memcmp(&r_whole, &r_sharded, sizeof(r_whole)) == 0,
              "%s: record (scale %g / %g, %llu elements) differs from the whole-weight cast's (%g / %g, %llu)", what,
              r_sharded.scale, r_sharded.scale_inv, r_sharded.elements, r_whole.scale, r_whole.scale_inv, r_whole.elements);
        // the rebuild after a resume: the codes from the record's scale
        cudaCheck(cudaMemset(sharded.out.codes, 0, n));
        if (from_master) { fp8_weight_codes(sharded.out.codes, (const float*)d_master, n, whole.out.record, 0); }
        else { fp8_weight_codes(sharded.out.codes, (const floatX*)d_x, n, whole.out.record, 0); }
        got = (uint8_t*)host_copy(sharded.out.codes, n);
        CHECK(count_code_mismatches(got, expected, n, what) == 0, "%s: fp8_weight_codes differs from the cast's codes", what);
        free(got); free(expected);
        device_fp8_free(&whole);
        device_fp8_free(&sharded);
    }
    cudaCheck(cudaFree(d_master)); cudaCheck(cudaFree(d_x));
    free(master);
}

/*
fp8_scaling_restore_states (a skipped step's updates undone) on 3 states: each equals the host's
fp8_scaling_restore of it, i.e. the state from before, with the non-finite count kept.
*/
static void test_scaling_restore_states(void) {
    const int count = 3;
    Fp8TensorScaling before[3], after[3];
    for (int i = 0; i < count; i++) {
        fp8_scaling_init(&before[i], FP8_RECIPE_DELAYED, i == 1 ? FP8_E5M2 : FP8_E4M3, 4, 0);
        fp8_scaling_update(&before[i], 0.5f + (float)i);
        after[i] = before[i];
        fp8_scaling_update(&after[i], 8.0f * (float)(i + 1));
        fp8_scaling_update(&after[i], NAN);
    }
    Fp8TensorScaling* d_states = (Fp8TensorScaling*)device_copy(after, sizeof(after));
    Fp8TensorScaling* d_before = (Fp8TensorScaling*)device_copy(before, sizeof(before));
    fp8_scaling_restore_states(d_states, d_before, count, 0);
    Fp8TensorScaling* got = (Fp8TensorScaling*)host_copy(d_states, sizeof(after));
    for (int i = 0; i < count; i++) {
        Fp8TensorScaling expected = after[i];
        fp8_scaling_restore(&expected, &before[i]);
        CHECK(memcmp(&got[i], &expected, sizeof(expected)) == 0 && got[i].scale == before[i].scale,
              "fp8_scaling_restore_states: state %d is not the host's restore of it", i);
    }
    free(got);
    cudaCheck(cudaFree(d_states)); cudaCheck(cudaFree(d_before));
}

/*
fp8_scaling_update_with_amax (lm_head's dy, from the bound on it: fp8_model_begin_dlogits): the
state takes the host's update, and the record the new scale and its inverse. Where the
classifier writes dy's codes itself (FP8_DOUT_CODES_WRITTEN) no cast kernel copies them into the
record afterwards, so both backward GEMMs dequantize with the record's scale_inv as this kernel
left it. The pending amax is left alone.
*/
static void test_scaling_update_with_amax(void) {
    const char* what = "fp8_scaling_update_with_amax";
    Fp8TensorScaling state;
    fp8_scaling_init(&state, FP8_RECIPE_CURRENT, FP8_E5M2, 16, 0);
    fp8_scaling_update(&state, 0.01f);  // a scale unlike the bound's
    DeviceFp8 t = device_fp8_make(16, 16, FP8_E5M2, FP8_SCALING_TENSOR, &state);
    const uint32_t pending = fp8_amax_bits(0.125f);
    cudaCheck(cudaMemcpy(&t.out.record->amax_bits, &pending, sizeof(pending), cudaMemcpyHostToDevice));
    const float bound = 3.5f;
    fp8_scaling_update_with_amax(t.out.state, t.out.record, bound, 0);
    fp8_scaling_update(&state, bound);
    Fp8TensorScaling device_state = download_state(&t);
    CHECK(memcmp(&device_state, &state, sizeof(state)) == 0, "%s: state differs from the host's update", what);
    Fp8CastRecord r = download_record(&t);
    CHECK(r.scale == state.scale && r.scale_inv == state.scale_inv && r.amax_bits == pending,
          "%s: record holds scale %g / %g and amax bits 0x%x, expected %g / %g and 0x%x", what, r.scale, r.scale_inv,
          r.amax_bits, state.scale, state.scale_inv, pending);
    device_fp8_free(&t);
}

// a record read from a state file: counts of saturated or flushed elements up to the elements
// cast are valid (a tensor may saturate or flush whole), more are not; a pending amax must be
// one (sign bit clear) and the scale a normal float with a normal inverse
static void test_cast_record_loaded_error(void) {
    Fp8CastRecord r;
    memset(&r, 0, sizeof(r));
    r.scale = 2.0f;
    r.scale_inv = fp8_reciprocal(2.0f);
    r.interval_min_scale_bits = FP8_NO_SCALE_BITS;
    r.elements = 64;
    r.saturated = 64;
    r.flushed = 64;
    CHECK(fp8_cast_record_loaded_error(&r) == NULL, "a record with every element saturated and flushed must be valid");
    r.saturated = 65;
    CHECK(fp8_cast_record_loaded_error(&r) != NULL, "a record with more saturated elements than cast must be refused");
    r.saturated = 0;
    r.flushed = 65;
    CHECK(fp8_cast_record_loaded_error(&r) != NULL, "a record with more flushed elements than cast must be refused");
    r.flushed = 0;
    // a pending amax with the sign bit set would outrank every real amax (NaN too) in the unsigned
    // atomicMax of the next fold
    r.amax_bits = 0x80000001u;
    CHECK(fp8_cast_record_loaded_error(&r) != NULL, "a record whose pending amax has the sign bit set must be refused");
    r.amax_bits = fp8_amax_bits(3.5f);
    CHECK(fp8_cast_record_loaded_error(&r) == NULL, "a record with a pending amax of 3.5 must be valid");
    r.scale = 1e-40f;  // subnormal: its inverse rounds to +Inf
    r.scale_inv = fp8_reciprocal(r.scale);
    CHECK(fp8_cast_record_loaded_error(&r) != NULL, "a record with a subnormal scale and an infinite inverse must be refused");
}

/*
A kept prediction (-fg pow2) joins the interval the numerics log reads: its held counts are added
to the record's, which earlier uses since the last read left, and the interval's smallest scale
becomes the smaller of the earlier uses' (a quarter of this use's, none yet, or four times it)
and this use's.
*/
static void test_settle_prediction_joins_the_interval(void) {
    const float amax = 3.0f;
    Fp8TensorScaling state;
    fp8_scaling_init(&state, FP8_RECIPE_CURRENT_POW2, FP8_E5M2, 16, 0);
    fp8_scaling_update(&state, amax);  // the last use's scale, which predicts this one's: the same amax
    const float predicted = state.scale;
    const uint32_t earlier_bits[3] = {float_as_bits(predicted / 4.0f), FP8_NO_SCALE_BITS, float_as_bits(predicted * 4.0f)};
    for (int c = 0; c < 3; c++) {
        Fp8CastRecord record;
        memset(&record, 0, sizeof(record));
        record.scale = predicted;
        record.scale_inv = state.scale_inv;
        record.amax_bits = fp8_amax_bits(amax);
        record.interval_min_scale_bits = earlier_bits[c];
        record.elements = 100;
        record.saturated = 1;
        record.flushed = 2;
        Fp8Prediction held;
        memset(&held, 0, sizeof(held));
        held.elements = 50;
        held.saturated = 3;
        held.flushed = 4;
        Fp8TensorScaling* d_state = (Fp8TensorScaling*)device_copy(&state, sizeof(state));
        Fp8CastRecord* d_record = (Fp8CastRecord*)device_copy(&record, sizeof(record));
        Fp8Prediction* d_held = (Fp8Prediction*)device_copy(&held, sizeof(held));
        fp8_scaling_settle_prediction(d_state, d_record, d_held, 0);
        Fp8CastRecord* r = (Fp8CastRecord*)host_copy(d_record, sizeof(record));
        Fp8Prediction* h = (Fp8Prediction*)host_copy(d_held, sizeof(held));
        const uint32_t smallest = earlier_bits[c] < float_as_bits(predicted) ? earlier_bits[c] : float_as_bits(predicted);
        CHECK(h->recast == 0u && h->predictions == 1ull && h->recasts == 0ull && h->elements == 0ull,
              "settled prediction, case %d: recast %u, %llu predictions, %llu recasts, %llu elements still held", c,
              h->recast, h->predictions, h->recasts, h->elements);
        CHECK(r->interval_min_scale_bits == smallest && r->elements == 150ull && r->saturated == 4ull &&
              r->flushed == 6ull && r->amax_bits == 0u,
              "settled prediction, case %d: the interval's smallest scale bits %08x (want %08x), %llu elements, %llu "
              "saturated, %llu flushed (want 150, 4, 6), pending amax bits %08x (want none)", c,
              r->interval_min_scale_bits, smallest, r->elements, r->saturated, r->flushed, r->amax_bits);
        free(r); free(h);
        cudaCheck(cudaFree(d_state)); cudaCheck(cudaFree(d_record)); cudaCheck(cudaFree(d_held));
    }
}

/*
GELU's current scaling where the amax is not a bf16 value before rounding: the largest input is
1.0 (GELU(1) = 0.84134..., stored as bf16 0.83984375), so the amax pass must take the amax of the
transformed values as stored in bf16, as the cast stages them (the fp32 GELU's amax gives
another state). test_gelu_fp8's large inputs have GELU(x) = x, where the two agree.
*/
static void test_gelu_fp8_current_amax_rounded(int N, int C) {
    char what[128];
    snprintf(what, sizeof(what), "gelu_forward_fp8 current, amax rounded to bf16, N=%d C=%d", N, C);
    size_t n = (size_t)N * C;
    float* pre = host_bf16_normal(n, 0.1f);
    pre[n / 2 + 3] = 1.0f;
    floatX* d_pre = device_bf16_from(pre, n);
    floatX *d_plain = (floatX*)device_alloc(n * 2), *d_fused = (floatX*)device_alloc(n * 2);
    gelu_forward(d_plain, d_pre, (int)n, 0);
    float* plain = download_bf16_as_floats(d_plain, n);
    CHECK(host_amax(plain, n) != gelu_forward_element(1.0f), "%s: the test needs an amax that bf16 rounds", what);
    Fp8TensorScaling state;
    DeviceFp8 t = producer_cast_make(PRODUCER_CAST_CURRENT, N, C, 0.0f, &state);
    gelu_forward_fp8_current(&t.out, d_fused, d_pre, N, C, 0);
    check_producer_cast(PRODUCER_CAST_CURRENT, &t, plain, &state, what);
    device_fp8_free(&t);
    free(pre); free(plain);
    cudaCheck(cudaFree(d_pre)); cudaCheck(cudaFree(d_plain)); cudaCheck(cudaFree(d_fused));
}

// ----------------------------------------------------------------------------
// the fused dy pass: (GELU backward) + bias gradient + amax + update + cast-transpose

// how the dy pass scales: per tensor from this dy's amax (two passes), per tensor from a bound
// the state took before (one pass: lm_head's dy), per tensor with a delayed state's known scale
// (one pass), 1x128 tiles (one pass), or per tensor from this dy's amax rounded down to a power
// of two (-fg pow2), the last use's scale predicting it: rightly (its amax was this dy's), too
// small (64 times this amax: no code saturates, many flush) or too large (1/64 of it: many
// saturate), the last two cast again
typedef enum { DOUT_CURRENT, DOUT_BOUND, DOUT_DELAYED, DOUT_BLOCK, DOUT_POW2_RIGHT, DOUT_POW2_LOW, DOUT_POW2_HIGH } DoutScaling;
static const char* const DOUT_SCALING_NAMES[7] = {"current", "bound", "delayed", "block", "pow2 predicted right",
                                                  "pow2 predicted too small", "pow2 predicted too large"};
static const Fp8DoutScale DOUT_PASS_SCALE[7] = {FP8_DOUT_NEEDS_AMAX, FP8_DOUT_SCALE_BOUND, FP8_DOUT_SCALE_KNOWN,
                                                FP8_DOUT_SCALE_KNOWN, FP8_DOUT_SCALE_PREDICTED, FP8_DOUT_SCALE_PREDICTED,
                                                FP8_DOUT_SCALE_PREDICTED};
static const float DOUT_POW2_SEED_TIMES_AMAX[7] = {0.0f, 0.0f, 0.0f, 0.0f, 1.0f, 64.0f, 1.0f / 64.0f};

// DOUT_BOUND: what fp8_model_begin_dlogits does before dout's producer runs, with a bound of 4x
// dout's amax (above any GELU product's: gelu' < 1.2), on the device and on the host mirror
static void update_with_bound(const DeviceFp8* t, Fp8TensorScaling* host_state, const float* dout, size_t n) {
    float bound = 4.0f * host_amax(dout, n);
    fp8_scaling_update_with_amax(t->out.state, t->out.record, bound, 0);
    fp8_scaling_update(host_state, bound);
}

static void test_backward_dout(int N, int OC, bool with_gelu, DoutScaling scaling) {
    char what[128];
    snprintf(what, sizeof(what), "matmul_backward_fp8_dout%s %s N=%d OC=%d", with_gelu ? " gelu" : "",
             DOUT_SCALING_NAMES[scaling], N, OC);
    bool block = scaling == DOUT_BLOCK;
    size_t n = (size_t)N * OC;
    float* dout = host_bf16_normal(n, 1e-3f);
    float* pre = host_bf16_normal(n, 2.0f);
    float* dbias0 = host_bf16_normal(OC, 0.1f);
    floatX* d_dout = device_bf16_from(dout, n);
    floatX* d_expected = device_bf16_from(dout, n);
    floatX* d_pre = device_bf16_from(pre, n);
    floatX* d_dbias = device_bf16_from(dbias0, OC);
    floatX* d_dbias_expected = device_bf16_from(dbias0, OC);
    float* d_scratch = (float*)device_alloc(matmul_dbias_scratch_floats(N, OC) * sizeof(float));
    bool pow2 = DOUT_PASS_SCALE[scaling] == FP8_DOUT_SCALE_PREDICTED;
    Fp8TensorScaling state;
    fp8_scaling_init(&state, scaling == DOUT_DELAYED ? FP8_RECIPE_DELAYED : pow2 ? FP8_RECIPE_CURRENT_POW2 : FP8_RECIPE_CURRENT,
                     FP8_E5M2, 16, 0);
    if (scaling == DOUT_DELAYED) { fp8_scaling_update(&state, 0.5f); }  // seeded: a scale unlike this dout's own

    // the expected dout and dbias through the bf16 path's kernels
    if (with_gelu) { gelu_backward_inplace(d_expected, d_pre, (int)n, 0); }
    if (pow2) {  // the last use, whose scale predicts this one's
        float* product = download_bf16_as_floats(d_expected, n);
        fp8_scaling_update(&state, DOUT_POW2_SEED_TIMES_AMAX[scaling] * host_amax(product, n));
        free(product);
    }
    DeviceFp8 t = block ? device_fp8_make(N, OC, FP8_E4M3, FP8_SCALING_ROWS_1x128, NULL)
                        : device_fp8_make(N, OC, FP8_E5M2, FP8_SCALING_TENSOR, &state);
    const float predicted_scale = state.scale;
    const Fp8TensorScaling seeded = state;  // the state the pass starts from
    if (pow2) {
        t.out.prediction = (Fp8Prediction*)device_alloc(sizeof(Fp8Prediction));
        cudaCheck(cudaMemset(t.out.prediction, 0, sizeof(Fp8Prediction)));
    }
    matmul_dbias_launch(d_dbias_expected, d_scratch, d_expected, NULL, NULL, N, OC, 0);
    size_t partial_bytes = matmul_dbias_scratch_floats(N, OC) * sizeof(float);
    float* partials_expected = (float*)host_copy(d_scratch, partial_bytes);
    cudaCheck(cudaMemset(d_scratch, 0xff, partial_bytes));  // NaNs: the pass must write every partial
    if (scaling == DOUT_BOUND) { update_with_bound(&t, &state, dout, n); }
    matmul_backward_fp8_dout(&t.out, d_dbias, d_scratch, d_dout, with_gelu ? d_pre : NULL, N, OC, DOUT_PASS_SCALE[scaling], 0);
    // the fp32 chunk partials, bit for bit (the bf16 dbias alone would hide a different order)
    float* partials = (float*)host_copy(d_scratch, partial_bytes);
    CHECK(memcmp(partials, partials_expected, partial_bytes) == 0,
          "%s: the bias gradient's fp32 chunk partials differ from the bf16 path's (summation order)", what);
    free(partials); free(partials_expected);

    // dout afterwards: the product where something reads it (current scaling's cast pass), else as it was
    // (a one-pass cast writing both code arrays: no bf16 GEMM reads the product)
    float* got = download_bf16_as_floats(d_dout, n);
    float* expected = download_bf16_as_floats(d_expected, n);
    bool product_stored = scaling == DOUT_CURRENT;
    CHECK(count_float_mismatches(got, product_stored ? expected : dout, n, what) == 0, "%s: dout after the pass is not %s",
          what, product_stored ? "the bf16 path's product" : "left as it was");
    float* dbias = download_bf16_as_floats(d_dbias, OC);
    float* dbias_expected = download_bf16_as_floats(d_dbias_expected, OC);
    CHECK(count_float_mismatches(dbias, dbias_expected, OC, what) == 0, "%s: dbias differs from the bf16 path's bits", what);
    size_t far = 0;
    for (int c = 0; c < OC; c++) {
        double sum = dbias0[c];
        for (int r = 0; r < N; r++) { sum += expected[(size_t)r * OC + c]; }
        far += !(fabs(dbias[c] - sum) <= 1e-5 + 4e-3 * fabs(sum));  // one bf16 rounding
    }
    CHECK(far == 0, "%s: %zu dbias columns are off the double-precision sums", what, far);

    if (block) {
        TileContext context = tile_context_make(expected, N, OC, FP8_SCALING_ROWS_1x128);
        HostCast h = host_cast(expected, N, OC, FP8_E4M3, scale_of_tile, &context);
        check_cast(&t, &h, false, what);
        check_block_scales(&t, &context, what);
        host_cast_free(&h);
        tile_context_free(&context);
    } else {  // current and pow2: the scale from this dout's amax; delayed: the state's scale, then this amax
              // recorded; bound: the state's scale, and no update
        float scale_used = state.scale;
        if (scaling != DOUT_BOUND) { fp8_scaling_update(&state, host_amax(expected, n)); }
        if (scaling == DOUT_CURRENT || pow2) { scale_used = state.scale; }
        Fp8TensorScaling device_state = download_state(&t);
        CHECK(memcmp(&device_state, &state, sizeof(state)) == 0, "%s: state differs from the host state machine", what);
        Fp8CastRecord record = download_record(&t);
        CHECK(record.scale == scale_used && record.scale_inv == state.scale_inv && record.amax_bits == 0u,
              "%s: record holds scale %g and amax bits 0x%x, expected the scale used %g and the amax consumed", what,
              record.scale, record.amax_bits, scale_used);
        if (pow2) {  // the verdict, and the predicted cast's held counts settled
            bool recast = scale_used != predicted_scale;
            CHECK(recast == (scaling != DOUT_POW2_RIGHT), "%s: the prediction %g of the scale %g was %s", what,
                  predicted_scale, scale_used, recast ? "wrong" : "right");
            Fp8Prediction* held = (Fp8Prediction*)host_copy(t.out.prediction, sizeof(Fp8Prediction));
            CHECK(held->recast == (recast ? 1u : 0u) && held->elements == 0ull && held->saturated == 0ull &&
                  held->flushed == 0ull, "%s: recast %u and held counts %llu %llu %llu, expected %d and none", what,
                  held->recast, held->elements, held->saturated, held->flushed, (int)recast);
            // the trainer's last lines: one verdict so far, a recast counted only when wrong
            CHECK(held->predictions == 1ull && held->recasts == (recast ? 1ull : 0ull),
                  "%s: %llu predictions and %llu recasts counted, expected 1 and %d", what, held->predictions,
                  held->recasts, (int)recast);
            free(held);
        }
        HostCast h = host_cast(expected, N, OC, FP8_E5M2, scale_of_tensor, &scale_used);
        check_cast(&t, &h, false, what);
        host_cast_free(&h);
    }

    // one code array only (wgrad in FP8, dgrad in bf16): the bf16 dgrad reads the product, so it is stored
    // (pow2: from the same seeded state, so a wrong prediction's recast reads the stored product, once, and
    // writes the codes the pass above wrote)
    if (with_gelu && (DOUT_PASS_SCALE[scaling] == FP8_DOUT_SCALE_KNOWN || pow2)) {
        Fp8CastOutput wgrad_only = t.out;
        wgrad_only.codes = NULL;
        wgrad_only.scale_inv = NULL;
        uint8_t* codes_t_before = (uint8_t*)host_copy(t.out.codes_t, n);
        if (pow2) { cudaCheck(cudaMemcpy(t.out.state, &seeded, sizeof(seeded), cudaMemcpyHostToDevice)); }
        floatX* d_dout3 = device_bf16_from(dout, n);
        matmul_backward_fp8_dout(&wgrad_only, NULL, d_scratch, d_dout3, d_pre, N, OC, DOUT_PASS_SCALE[scaling], 0);
        float* product = download_bf16_as_floats(d_dout3, n);
        CHECK(count_float_mismatches(product, expected, n, what) == 0, "%s: with a bf16 dgrad, dout is not the product", what);
        if (pow2) {
            uint8_t* codes_t = (uint8_t*)host_copy(t.out.codes_t, n);
            CHECK(count_code_mismatches(codes_t, codes_t_before, n, what) == 0,
                  "%s: with a bf16 dgrad, the transposed codes differ from those of both code arrays", what);
            free(codes_t);
        }
        free(product);
        free(codes_t_before);
        cudaCheck(cudaFree(d_dout3));
    }

    // determinism: the same bias bits again
    floatX* d_dbias2 = device_bf16_from(dbias0, OC);
    floatX* d_dout2 = device_bf16_from(dout, n);
    if (scaling == DOUT_BOUND) { update_with_bound(&t, &state, dout, n); }
    matmul_backward_fp8_dout(&t.out, d_dbias2, d_scratch, d_dout2, with_gelu ? d_pre : NULL, N, OC, DOUT_PASS_SCALE[scaling], 0);
    float* dbias2 = download_bf16_as_floats(d_dbias2, OC);
    CHECK(count_float_mismatches(dbias2, dbias, OC, what) == 0, "%s: the bias gradient is not bitwise deterministic", what);

    free(dout); free(pre); free(dbias0); free(got); free(expected); free(dbias); free(dbias_expected); free(dbias2);
    if (t.out.prediction != NULL) { cudaCheck(cudaFree(t.out.prediction)); }
    device_fp8_free(&t);
    void* buffers[8] = {d_dout, d_expected, d_pre, d_dbias, d_dbias_expected, d_scratch, d_dbias2, d_dout2};
    for (int i = 0; i < 8; i++) { cudaCheck(cudaFree(buffers[i])); }
}

/*
FP8_DOUT_AMAX_RECORDED: dy's producer (layernorm backward, LayernormDinpUses) took the amax and
summed the bias as it wrote dy, so the pass only updates the state from that amax and casts: the
same state and codes as current scaling's two passes, with dout and the scratch left untouched.
An amax other than dout's own (twice it) shows the scale comes from the record, not from dout.
*/
static void test_backward_dout_amax_recorded(int N, int OC) {
    char what[96];
    snprintf(what, sizeof(what), "matmul_backward_fp8_dout amax recorded N=%d OC=%d", N, OC);
    size_t n = (size_t)N * OC;
    float* dout = host_bf16_normal(n, 1e-3f);
    floatX* d_dout = device_bf16_from(dout, n);
    size_t partial_bytes = matmul_dbias_scratch_floats(N, OC) * sizeof(float);
    float* d_scratch = (float*)device_alloc(partial_bytes);
    cudaCheck(cudaMemset(d_scratch, 0x7f, partial_bytes));
    Fp8TensorScaling state;
    fp8_scaling_init(&state, FP8_RECIPE_CURRENT, FP8_E5M2, 16, 0);
    DeviceFp8 t = device_fp8_make(N, OC, FP8_E5M2, FP8_SCALING_TENSOR, &state);
    float recorded_amax = 2.0f * host_amax(dout, n);
    uint32_t recorded_bits = fp8_amax_bits(recorded_amax);
    cudaCheck(cudaMemcpy(&t.out.record->amax_bits, &recorded_bits, sizeof(recorded_bits), cudaMemcpyHostToDevice));
    matmul_backward_fp8_dout(&t.out, NULL, d_scratch, d_dout, NULL, N, OC, FP8_DOUT_AMAX_RECORDED, 0);

    fp8_scaling_update(&state, recorded_amax);
    Fp8TensorScaling device_state = download_state(&t);
    CHECK(memcmp(&device_state, &state, sizeof(state)) == 0, "%s: state differs from the host state machine", what);
    Fp8CastRecord record = download_record(&t);
    CHECK(record.scale == state.scale && record.amax_bits == 0u,
          "%s: record holds scale %g and amax bits 0x%x, expected the scale %g and the amax consumed", what, record.scale,
          record.amax_bits, state.scale);
    HostCast h = host_cast(dout, N, OC, FP8_E5M2, scale_of_tensor, &state.scale);
    check_cast(&t, &h, false, what);
    host_cast_free(&h);
    float* after = download_bf16_as_floats(d_dout, n);
    CHECK(count_float_mismatches(after, dout, n, what) == 0, "%s: dout changed", what);
    uint8_t* scratch = (uint8_t*)host_copy(d_scratch, partial_bytes);
    size_t touched = 0;
    for (size_t i = 0; i < partial_bytes; i++) { touched += scratch[i] != 0x7f; }
    CHECK(touched == 0, "%s: %zu bytes of the bias scratch written (the bias is summed by dout's producer)", what, touched);
    CHECK_DIES("matmul_backward_fp8_dout amax recorded with a dbias", "bias summed there",
               matmul_backward_fp8_dout(&t.out, (floatX*)d_scratch, d_scratch, d_dout, NULL, N, OC, FP8_DOUT_AMAX_RECORDED, 0));
    CHECK_DIES("matmul_backward_fp8_dout amax recorded with GELU", "no GELU",
               matmul_backward_fp8_dout(&t.out, NULL, d_scratch, d_dout, d_dout, N, OC, FP8_DOUT_AMAX_RECORDED, 0));
    DeviceFp8 tiles = device_fp8_make(N, OC, FP8_E4M3, FP8_SCALING_ROWS_1x128, NULL);
    CHECK_DIES("matmul_backward_fp8_dout amax recorded with 1x128 tiles", "is per tensor",
               matmul_backward_fp8_dout(&tiles.out, NULL, d_scratch, d_dout, NULL, N, OC, FP8_DOUT_AMAX_RECORDED, 0));
    device_fp8_free(&tiles);
    free(dout); free(after); free(scratch);
    device_fp8_free(&t);
    cudaCheck(cudaFree(d_dout)); cudaCheck(cudaFree(d_scratch));
}

// ----------------------------------------------------------------------------
// the transpose of codes (W^T from W's codes; lm_head's dy^T from the classifier's codes)

// every byte against the host transpose, with guard bytes after codes_t that must stay untouched;
// shapes with short last tiles of 16 and 48 rows reach the one-store and the two-store ends
static void test_transpose_codes(int rows, int cols) {
    char what[96];
    snprintf(what, sizeof(what), "fp8_transpose_codes %d x %d", rows, cols);
    size_t n = (size_t)rows * cols, guard = 256;
    uint8_t* codes = (uint8_t*)mallocCheck(n);
    for (size_t i = 0; i < n; i++) { codes[i] = (uint8_t)(randint32(&test_rng) & 0xffu); }
    uint8_t* d_codes = (uint8_t*)device_alloc(n);
    uint8_t* d_codes_t = (uint8_t*)device_alloc(n + guard);
    cudaCheck(cudaMemcpy(d_codes, codes, n, cudaMemcpyHostToDevice));
    cudaCheck(cudaMemset(d_codes_t, 0xa5, n + guard));
    fp8_transpose_codes(d_codes, d_codes_t, rows, cols, 0);
    uint8_t* got = (uint8_t*)host_copy(d_codes_t, n + guard);
    size_t wrong = 0, first = n;
    for (int r = 0; r < rows; r++) {
        for (int c = 0; c < cols; c++) {
            bool differs = got[(size_t)c * rows + r] != codes[(size_t)r * cols + c];
            wrong += differs;
            if (differs && first == n) { first = (size_t)r * cols + c; }
        }
    }
    CHECK(wrong == 0, "%s: %zu bytes differ from the host transpose, the first at row %zu column %zu", what, wrong,
          first / cols, first % cols);
    size_t touched = 0;
    for (size_t i = n; i < n + guard; i++) { touched += got[i] != 0xa5; }
    CHECK(touched == 0, "%s: %zu bytes past codes_t were written", what, touched);
    free(codes); free(got);
    cudaCheck(cudaFree(d_codes)); cudaCheck(cudaFree(d_codes_t));
}

// ----------------------------------------------------------------------------
// FP8 GEMMs, exact

typedef struct {
    uint8_t* codes;     // device
    float* scale_inv;   // device, one float
    Fp8Operand operand;
} ExactOperand;

// codes of value * 2^scale_log2 (exact by construction), dequantized by 2^-scale_log2
static ExactOperand exact_operand(const float* values, size_t n, Fp8Format format, int scale_log2) {
    ExactOperand e;
    uint8_t* codes = (uint8_t*)mallocCheck(n);
    float scale = ldexpf(1.0f, scale_log2);
    for (size_t i = 0; i < n; i++) {
        codes[i] = fp8_quantize(values[i], scale, format);
        if (fp8_decode(codes[i], format) != values[i] * scale) {
            llm8_die("test data %g is not exact in %s at scale %g", values[i], fp8_format_name(format), scale);
        }
    }
    e.codes = (uint8_t*)device_alloc(n);
    cudaCheck(cudaMemcpy(e.codes, codes, n, cudaMemcpyHostToDevice));
    float inv = ldexpf(1.0f, -scale_log2);
    e.scale_inv = device_floats_from(&inv, 1);
    e.operand.codes = e.codes;
    e.operand.format = format;
    e.operand.scaling = FP8_SCALING_TENSOR;
    e.operand.scale_inv = e.scale_inv;
    free(codes);
    return e;
}

static void exact_operand_free(ExactOperand* e) {
    cudaCheck(cudaFree(e->codes));
    cudaCheck(cudaFree(e->scale_inv));
}

static float* transpose_host(const float* x, int rows, int cols) {
    float* t = host_floats((size_t)rows * cols);
    for (int r = 0; r < rows; r++) { for (int c = 0; c < cols; c++) { t[(size_t)c * rows + r] = x[(size_t)r * cols + c]; } }
    return t;
}

// out[i][j] = init[i][j] + sum_k a[i][k] b[j][k] (double), both row-major along K
static double* host_gemm_nt(const float* a, const float* b, const float* init, int rows, int cols, int K) {
    double* out = (double*)mallocCheck((size_t)rows * cols * sizeof(double));
    for (int i = 0; i < rows; i++) {
        for (int j = 0; j < cols; j++) {
            double sum = init != NULL ? init[(size_t)i * cols + j] : 0.0;
            for (int k = 0; k < K; k++) { sum += (double)a[(size_t)i * K + k] * b[(size_t)j * K + k]; }
            out[(size_t)i * cols + j] = sum;
        }
    }
    return out;
}

static size_t count_bf16_inexact(const float* got, const double* exact, size_t n, const char* what) {
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        float expected = bf16_bits_to_float(float_to_bf16_bits((float)exact[i]));
        if (float_as_bits(got[i]) != float_as_bits(expected)) {
            if (bad == 0) { printf("  %s: first mismatch at %zu: got %.9g, expected %.9g\n", what, i, got[i], expected); }
            bad++;
        }
    }
    return bad;
}

static void test_gemm_exact(int N, int C, int OC) {
    char what[160];
    size_t nx = (size_t)N * C, nw = (size_t)OC * C, ny = (size_t)N * OC;
    float* x = host_integers(nx, -15, 15);
    float* w = host_integers(nw, -15, 15);
    float* dy = host_integers(ny, -8, 8);
    for (size_t i = 0; i < ny; i += 7) { dy[i] = (i % 2) ? 12.0f : -12.0f; }
    float* bias = host_integers(OC, -20, 20);
    float* dw0 = host_integers(nw, -50, 50);
    float* xt = transpose_host(x, N, C);
    float* wt = transpose_host(w, OC, C);
    float* dyt = transpose_host(dy, N, OC);
    // x, W dequantized by 1/4 and 1/2; dy by 1/2: the GEMMs see x/4, w/2, dy/2 exactly
    float* xq = host_floats(nx); for (size_t i = 0; i < nx; i++) { xq[i] = x[i] / 4.0f; }
    float* wq = host_floats(nw); for (size_t i = 0; i < nw; i++) { wq[i] = w[i] / 2.0f; }
    float* dyq = host_floats(ny); for (size_t i = 0; i < ny; i++) { dyq[i] = dy[i] / 2.0f; }
    ExactOperand ex = exact_operand(xq, nx, FP8_E4M3, 2), ew = exact_operand(wq, nw, FP8_E4M3, 1);
    float* xtq = transpose_host(xq, N, C); float* wtq = transpose_host(wq, OC, C); float* dytq = transpose_host(dyq, N, OC);
    ExactOperand ext = exact_operand(xtq, nx, FP8_E4M3, 2), ewt = exact_operand(wtq, nw, FP8_E4M3, 1);
    ExactOperand edy = exact_operand(dyq, ny, FP8_E5M2, 1), edyt = exact_operand(dytq, ny, FP8_E5M2, 1);
    floatX* d_bias = device_bf16_from(bias, OC);
    floatX* d_out = (floatX*)device_alloc(ny * 2);

    // forward without fast accumulation and with the bias epilogue (K = C)
    snprintf(what, sizeof(what), "fp8 forward exact N=%d C=%d OC=%d", N, C, OC);
    MatmulSpec spec = matmul_forward_fp8_spec(d_out, ex.operand, ew.operand, d_bias, N, C, OC, NULL);
    spec.fast_accumulate = false;
    matmul_cublaslt(&spec, 0);
    double* expected = host_gemm_nt(xq, wq, NULL, N, OC, C);
    for (int i = 0; i < N; i++) { for (int j = 0; j < OC; j++) { expected[(size_t)i * OC + j] += bias[j]; } }
    float* got = download_bf16_as_floats(d_out, ny);
    CHECK(count_bf16_inexact(got, expected, ny, what) == 0, "%s: not the exact sums rounded once to bf16", what);
    free(got);
    free(expected);

    // GELU epilogue with FP8 operands: cuBLASLt may lack it (the FP8 path does not need it)
    floatX* d_pre = (floatX*)device_alloc(ny * 2);
    if (matmul_forward_fp8_supported(d_out, ex.operand, ew.operand, d_bias, N, C, OC, d_pre)) {
        matmul_forward_fp8(d_out, ex.operand, ew.operand, d_bias, N, C, OC, d_pre, 0);
        float* pre = download_bf16_as_floats(d_pre, ny);
        float* out = download_bf16_as_floats(d_out, ny);
        size_t far = 0;
        for (size_t i = 0; i < ny; i++) {
            double g = gelu_forward_element(pre[i]);
            far += !(fabs(out[i] - g) <= 2e-3 + fabs(g) / 128.0);
        }
        CHECK(far == 0, "%s: %zu GELU epilogue outputs off gelu(pre-activation)", what, far);
        printf("fp8 forward: cuBLASLt has the GELU_AUX_BIAS epilogue with FP8 operands\n");
        free(pre);
        free(out);
    } else {
        printf("fp8 forward: cuBLASLt has NO GELU_AUX_BIAS epilogue with FP8 operands (gelu_forward_fp8 does it)\n");
    }
    cudaCheck(cudaFree(d_pre));

    // dgrad: dinp = dy W from dy (E5M2) and W^T (K = OC)
    snprintf(what, sizeof(what), "fp8 dgrad exact N=%d C=%d OC=%d", N, C, OC);
    floatX* d_dinp = (floatX*)device_alloc(nx * 2);
    // the probe bench_gemm asks before it times a backward: yes for the layouts every FP8 linear runs
    CHECK(matmul_backward_fp8_supported(d_dinp, d_out, CUDA_R_16BF, edy.operand, edyt.operand, ewt.operand, ext.operand,
                                        N, C, OC, NULL), "%s: matmul_backward_fp8_supported says no to per-tensor E5M2 x E4M3", what);
    matmul_backward_fp8(d_dinp, NULL, CUDA_R_16BF, edy.operand, edyt.operand, ewt.operand, ext.operand, N, C, OC, NULL, 0);
    expected = host_gemm_nt(dyq, wtq, NULL, N, C, OC);
    got = download_bf16_as_floats(d_dinp, nx);
    CHECK(count_bf16_inexact(got, expected, nx, what) == 0, "%s: not the exact sums rounded once to bf16", what);
    free(got);

    // dgrad through GELU (-ge 2): the same sums times gelu'(pre-activation) in the DGELU epilogue
    snprintf(what, sizeof(what), "fp8 dgrad through GELU N=%d C=%d OC=%d", N, C, OC);
    float* pre = host_integers(nx, -15, 15);
    for (size_t i = 0; i < nx; i++) { pre[i] /= 4.0f; }  // -3.75 .. 3.75, exact in bf16
    floatX* d_pre_gelu = device_bf16_from(pre, nx);
    if (matmul_backward_fp8_supported(d_dinp, NULL, CUDA_R_16BF, edy.operand, edyt.operand, ewt.operand, ext.operand,
                                      N, C, OC, d_pre_gelu)) {
        matmul_backward_fp8(d_dinp, NULL, CUDA_R_16BF, edy.operand, edyt.operand, ewt.operand, ext.operand, N, C, OC,
                            d_pre_gelu, 0);
        got = download_bf16_as_floats(d_dinp, nx);
        size_t far = 0;
        for (size_t i = 0; i < nx; i++) {
            double want = expected[i] * gelu_backward_element(pre[i]);
            far += !(fabs(got[i] - want) <= 2e-3 * fabs(expected[i]) + fabs(want) / 128.0);
        }
        CHECK(far == 0, "%s: %zu of %zu outputs off the sums times gelu'(pre)", what, far, nx);
        printf("fp8 dgrad: cuBLASLt has the DGELU epilogue with FP8 operands (-p fp8 -ge 2 runs)\n");
        free(got);
    } else {
        printf("fp8 dgrad: cuBLASLt has NO DGELU epilogue with FP8 operands (-p fp8 -ge 2 stops at its first backward)\n");
    }
    cudaCheck(cudaFree(d_pre_gelu));
    free(pre);
    free(expected);

    // wgrad: dW += dy^T x from dy^T (E5M2) and x^T (K = N), into bf16 and into fp32
    for (int fp32 = 0; fp32 < 2; fp32++) {
        snprintf(what, sizeof(what), "fp8 wgrad exact into %s N=%d C=%d OC=%d", fp32 ? "fp32" : "bf16", N, C, OC);
        void* d_dw = fp32 ? (void*)device_floats_from(dw0, nw) : (void*)device_bf16_from(dw0, nw);
        matmul_backward_fp8(NULL, d_dw, fp32 ? CUDA_R_32F : CUDA_R_16BF, edy.operand, edyt.operand, ewt.operand,
                            ext.operand, N, C, OC, NULL, 0);
        if (fp32) {
            expected = host_gemm_nt(dytq, xtq, dw0, OC, C, N);
            float* g = (float*)host_copy(d_dw, nw * sizeof(float));
            size_t bad = 0;
            for (size_t i = 0; i < nw; i++) { bad += (double)g[i] != expected[i]; }
            CHECK(bad == 0, "%s: %zu sums not exact", what, bad);
            free(g);
        } else {
            expected = host_gemm_nt(dytq, xtq, NULL, OC, C, N);
            got = download_bf16_as_floats((floatX*)d_dw, nw);
            CHECK(bf16_accumulate_mismatches(got, dw0, expected, nw, what) == 0,
                  "%s: not init + the exact sums, rounded once or with the sums rounded to bf16 first", what);
            free(got);
        }
        free(expected);
        cudaCheck(cudaFree(d_dw));
    }

    free(x); free(w); free(dy); free(bias); free(dw0); free(xt); free(wt); free(dyt);
    free(xq); free(wq); free(dyq); free(xtq); free(wtq); free(dytq);
    ExactOperand* all[6] = {&ex, &ew, &ext, &ewt, &edy, &edyt};
    for (int i = 0; i < 6; i++) { exact_operand_free(all[i]); }
    cudaCheck(cudaFree(d_bias)); cudaCheck(cudaFree(d_out)); cudaCheck(cudaFree(d_dinp));
}

/*
-fe 1's GEMM (matmul_forward_fp8_gelu_codes): fc's forward writing the E4M3 codes of GELU through cuBLASLt's
epilogue under a given scale (fp8_gemm_codes_begin's copy of the state's), its pre-activation as the bf16 aux
and its amax; then fp8_transpose_codes_counted's x^T and record. Exact operands (the sums are exact in fp32):
the aux is the exact pre-activation rounded once to bf16; each code is the host's E4M3 of scale * GELU (the tanh
form, in double) of the exact pre-activation, or where the library's GELU differs in the last bits its
neighbour, for at most 5% of the elements (a GELU that differs more, a wrong scale or layout fails); the amax
is the host's within 2^-8. Under a scale 4x too large for the amax the codes saturate to ±448, never a NaN code
(cuBLASLt's FP8 output conversion is taken to saturate: cudasim's reading, which a GPU checks here), and the
record counts what the codes show: every element, the ±0 codes as flushed, the ±448 codes as saturated where the
amax says something may saturate (else none), this use's amax and the scale.
*/
static double gelu_tanh_double(double x) {
    return 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}

static void test_gemm_gelu_codes(int N, int C, int OC) {
    char what[160];
    size_t nx = (size_t)N * C, nw = (size_t)OC * C, ny = (size_t)N * OC;
    float* x = host_integers(nx, -4, 4);  // products of 1/64ths at most 16 of them: every sum below 2^12 of them (C <= 256),
    float* w = host_integers(nw, -4, 4);  // exact under fast accumulation (test_gemm_exact_fast_accumulate)
    float* bias = host_integers(OC, -8, 8);
    for (size_t i = 0; i < nx; i++) { x[i] /= 8.0f; }  // E4M3-exact at scale 8: the codes are the integers
    for (size_t i = 0; i < nw; i++) { w[i] /= 8.0f; }
    for (int j = 0; j < OC; j++) { bias[j] /= 4.0f; }
    ExactOperand ex = exact_operand(x, nx, FP8_E4M3, 3), ew = exact_operand(w, nw, FP8_E4M3, 3);
    floatX* d_bias = device_bf16_from(bias, OC);
    floatX* d_pre = (floatX*)device_alloc(ny * 2);
    Fp8GemmScalars* d_scalars = (Fp8GemmScalars*)device_alloc(sizeof(Fp8GemmScalars));
    double* pre = host_gemm_nt(x, w, NULL, N, OC, C);
    double* gelu = (double*)mallocCheck(ny * sizeof(double));
    double amax = 0.0;
    for (int i = 0; i < N; i++) {
        for (int j = 0; j < OC; j++) {
            size_t k = (size_t)i * OC + j;
            pre[k] += bias[j];
            gelu[k] = gelu_tanh_double(pre[k]);
            amax = fmax(amax, fabs(gelu[k]));
        }
    }
    // scale 0: the power of two under 448 / amax; 1: four times that, saturating; 2: 448 / amax, where the
    // largest codes are 448 and nothing saturates (a code at 448 counts as saturated only where the amax
    // shows that a value may saturate)
    for (int kind = 0; kind < 3; kind++) {
        const int saturating = kind == 1;
        snprintf(what, sizeof(what), "fp8 forward to GELU codes%s N=%d C=%d OC=%d",
                 saturating ? ", saturating" : kind == 2 ? ", codes at 448" : "", N, C, OC);
        float scale = kind == 2 ? (float)(448.0 / amax) : ldexpf(1.0f, (int)floor(log2(448.0 / amax)) + (saturating ? 2 : 0));
        Fp8TensorScaling state;
        fp8_scaling_init(&state, FP8_RECIPE_DELAYED, FP8_E4M3, 16, 0);
        state.scale = scale;
        state.scale_inv = 1.0f / scale;
        DeviceFp8 t = device_fp8_make(N, OC, FP8_E4M3, FP8_SCALING_TENSOR, &state);
        if (!matmul_forward_fp8_gelu_codes_supported(t.out.codes, d_pre, ex.operand, ew.operand, d_bias, N, C, OC,
                                                     &d_scalars->scale, &d_scalars->amax)) {
            CHECK(false, "%s: cuBLASLt has no E4M3 output through GELU_AUX_BIAS here (-fe 1 cannot run)", what);
            device_fp8_free(&t);
            break;
        }
        fp8_gemm_codes_begin(&t.out, d_scalars, 0);
        matmul_forward_fp8_gelu_codes(t.out.codes, d_pre, ex.operand, ew.operand, d_bias, N, C, OC, &d_scalars->scale,
                                      &d_scalars->amax, 0);
        fp8_transpose_codes_counted(&t.out, N, OC, d_scalars, 0);
        uint8_t* codes = (uint8_t*)host_copy(t.out.codes, ny);
        uint8_t* codes_t = (uint8_t*)host_copy(t.out.codes_t, ny);
        Fp8GemmScalars scalars;
        cudaCheck(cudaMemcpy(&scalars, d_scalars, sizeof(scalars), cudaMemcpyDeviceToHost));
        Fp8CastRecord record = download_record(&t);
        float* got_pre = download_bf16_as_floats(d_pre, ny);
        CHECK(count_bf16_inexact(got_pre, pre, ny, what) == 0, "%s: the aux is not the exact pre-activation rounded once", what);
        size_t near = 0, far = 0, nan_codes = 0, zero_codes = 0, largest_codes = 0, transposed_wrong = 0;
        for (int i = 0; i < N; i++) {
            for (int j = 0; j < OC; j++) {
                size_t k = (size_t)i * OC + j;
                uint8_t got = codes[k], want = fp8_quantize((float)gelu[k], scale, FP8_E4M3);
                bool neighbour = (got & 0x80) == (want & 0x80) && abs((int)(got & 0x7f) - (int)(want & 0x7f)) == 1;
                near += got != want && neighbour;
                far += got != want && !neighbour;
                nan_codes += (got & 0x7f) == 0x7f;
                zero_codes += (got & 0x7f) == 0;
                largest_codes += (got & 0x7f) >= 0x7e;
                transposed_wrong += codes_t[(size_t)j * N + i] != got;
            }
        }
        CHECK(far == 0 && near <= ny / 20, "%s: %zu codes two or more steps off the host's, %zu one step (of %zu)", what,
              far, near, ny);
        CHECK(nan_codes == 0, "%s: %zu NaN codes: the FP8 output does not saturate", what, nan_codes);
        if (kind != 0) { CHECK(largest_codes > 0, "%s: no code at 448", what); }
        CHECK(fabs(scalars.amax - amax) <= amax / 256.0, "%s: amax %.9g, the host's %.9g", what, scalars.amax, amax);
        CHECK(transposed_wrong == 0, "%s: %zu x^T codes are not the transpose of the codes", what, transposed_wrong);
        uint64_t want_saturated = saturating ? largest_codes : 0;
        CHECK(record.elements == ny && record.flushed == zero_codes && record.saturated == want_saturated,
              "%s: record counts %llu elements, %llu flushed, %llu saturated; the codes show %zu, %zu, %llu", what,
              record.elements, record.flushed, record.saturated, ny, zero_codes, (unsigned long long)want_saturated);
        CHECK(record.amax_bits == fp8_amax_bits(scalars.amax) && record.interval_amax_bits == record.amax_bits,
              "%s: the record's amax is not the GEMM's", what);
        CHECK(record.scale == scale && record.scale_inv == state.scale_inv && record.interval_min_scale_bits == float_as_bits(scale),
              "%s: the record's scale %g (inverse %g) is not the state's %g", what, record.scale, record.scale_inv, scale);
        free(codes); free(codes_t); free(got_pre);
        device_fp8_free(&t);
    }
    free(x); free(w); free(bias); free(pre); free(gelu);
    exact_operand_free(&ex); exact_operand_free(&ew);
    cudaCheck(cudaFree(d_bias)); cudaCheck(cudaFree(d_pre)); cudaCheck(cudaFree(d_scalars));
}

// the launcher's forward with fast accumulation: partial sums stay below 2^12, exact
static void test_gemm_exact_fast_accumulate(int N, int C, int OC) {
    char what[128];
    snprintf(what, sizeof(what), "fp8 forward fast accumulation exact N=%d C=%d OC=%d", N, C, OC);
    size_t nx = (size_t)N * C, nw = (size_t)OC * C, ny = (size_t)N * OC;
    float* x = host_integers(nx, -15, 15);
    float* w = host_integers(nw, -7, 7);
    ExactOperand ex = exact_operand(x, nx, FP8_E4M3, 0), ew = exact_operand(w, nw, FP8_E4M3, 0);
    floatX* d_out = (floatX*)device_alloc(ny * 2);
    matmul_forward_fp8(d_out, ex.operand, ew.operand, NULL, N, C, OC, NULL, 0);
    double* expected = host_gemm_nt(x, w, NULL, N, OC, C);
    float* got = download_bf16_as_floats(d_out, ny);
    CHECK(count_bf16_inexact(got, expected, ny, what) == 0, "%s: not the exact sums rounded once to bf16", what);
    free(x); free(w); free(expected); free(got);
    exact_operand_free(&ex); exact_operand_free(&ew);
    cudaCheck(cudaFree(d_out));
}

// block recipe: integers in [-14, 14] times 2^-e, e = (row / 128 + col / 128) % 3 per 128x128
// block, and a +-14 * 2^-e in every row and column of every block: every tile amax is
// 14 * 2^-e, every scale 32 * 2^e, so the casts and the GEMMs are exact
static float* block_exact_data(int rows, int cols) {
    float* x = host_integers((size_t)rows * cols, -13, 13);
    for (int r = 0; r < rows; r++) {
        for (int c = 0; c < cols; c++) {
            float* v = &x[(size_t)r * cols + c];
            if (r % 16 == c % 16) { *v = (r + c) % 2 ? 14.0f : -14.0f; }
            *v = ldexpf(*v, -((r / FP8_TILE + c / FP8_TILE) % 3));
        }
    }
    return x;
}

static void test_gemm_block_exact(int N, int C, int OC) {
    char what[160];
    size_t nx = (size_t)N * C, nw = (size_t)OC * C, ny = (size_t)N * OC;
    float* x = block_exact_data(N, C);
    float* w = block_exact_data(OC, C);
    float* dy = block_exact_data(N, OC);
    float* dw0 = host_integers(nw, -50, 50);
    floatX *d_x = device_bf16_from(x, nx), *d_w = device_bf16_from(w, nw), *d_dy = device_bf16_from(dy, ny);
    DeviceFp8 fx = device_fp8_make(N, C, FP8_E4M3, FP8_SCALING_ROWS_1x128, NULL);
    DeviceFp8 fw = device_fp8_make(OC, C, FP8_E4M3, FP8_SCALING_BLOCKS_128x128, NULL);
    DeviceFp8 fdy = device_fp8_make(N, OC, FP8_E4M3, FP8_SCALING_ROWS_1x128, NULL);
    float* d_scratch = (float*)device_alloc(matmul_dbias_scratch_floats(N, OC) * sizeof(float));
    fp8_cast_transpose(&fx.out, d_x, N, C, 0);
    fp8_cast_weight(&fw.out, NULL, d_w, OC, C, false, 0);
    matmul_backward_fp8_dout(&fdy.out, NULL, d_scratch, d_dy, NULL, N, OC, FP8_DOUT_SCALE_KNOWN, 0);
    float* xt = transpose_host(x, N, C); float* wt = transpose_host(w, OC, C); float* dyt = transpose_host(dy, N, OC);

    snprintf(what, sizeof(what), "fp8 block forward exact N=%d C=%d OC=%d", N, C, OC);
    floatX* d_out = (floatX*)device_alloc(ny * 2);
    matmul_forward_fp8(d_out, fp8_operand(&fx.out, false), fp8_operand(&fw.out, false), NULL, N, C, OC, NULL, 0);
    double* expected = host_gemm_nt(x, w, NULL, N, OC, C);
    float* got = download_bf16_as_floats(d_out, ny);
    CHECK(count_bf16_inexact(got, expected, ny, what) == 0, "%s: not the exact sums rounded once to bf16", what);
    free(got); free(expected);

    snprintf(what, sizeof(what), "fp8 block dgrad exact N=%d C=%d OC=%d", N, C, OC);
    floatX* d_dinp = (floatX*)device_alloc(nx * 2);
    matmul_backward_fp8(d_dinp, NULL, CUDA_R_16BF, fp8_operand(&fdy.out, false), fp8_operand(&fdy.out, true),
                        fp8_operand(&fw.out, true), fp8_operand(&fx.out, true), N, C, OC, NULL, 0);
    expected = host_gemm_nt(dy, wt, NULL, N, C, OC);
    got = download_bf16_as_floats(d_dinp, nx);
    CHECK(count_bf16_inexact(got, expected, nx, what) == 0, "%s: not the exact sums rounded once to bf16", what);
    free(got); free(expected);

    snprintf(what, sizeof(what), "fp8 block wgrad exact N=%d C=%d OC=%d", N, C, OC);
    floatX* d_dw = device_bf16_from(dw0, nw);
    matmul_backward_fp8(NULL, d_dw, CUDA_R_16BF, fp8_operand(&fdy.out, false), fp8_operand(&fdy.out, true),
                        fp8_operand(&fw.out, true), fp8_operand(&fx.out, true), N, C, OC, NULL, 0);
    expected = host_gemm_nt(dyt, xt, NULL, OC, C, N);
    got = download_bf16_as_floats(d_dw, nw);
    CHECK(bf16_accumulate_mismatches(got, dw0, expected, nw, what) == 0,
          "%s: not init + the exact sums, rounded once or with the sums rounded to bf16 first", what);
    free(got); free(expected);

    free(x); free(w); free(dy); free(dw0); free(xt); free(wt); free(dyt);
    device_fp8_free(&fx); device_fp8_free(&fw); device_fp8_free(&fdy);
    void* buffers[7] = {d_x, d_w, d_dy, d_scratch, d_out, d_dinp, d_dw};
    for (int i = 0; i < 7; i++) { cudaCheck(cudaFree(buffers[i])); }
}

// ----------------------------------------------------------------------------
// FP8 GEMMs on Gaussian data: SQNR vs fp64 GEMMs of the bf16 data

static double sqnr_db(const double* ref, const float* got, size_t n) {
    double signal = 0.0, noise = 0.0;
    for (size_t i = 0; i < n; i++) {
        double d = ref[i] - got[i];
        signal += ref[i] * ref[i];
        noise += d * d;
    }
    return noise == 0.0 ? INFINITY : 10.0 * log10(signal / noise);
}

static void test_gemm_sqnr(int N, int C, int OC, bool block) {
    size_t nx = (size_t)N * C, nw = (size_t)OC * C, ny = (size_t)N * OC;
    float* x = host_bf16_normal(nx, 1.0f);
    float* w = host_bf16_normal(nw, 0.02f);
    float* dy = host_bf16_normal(ny, 1e-4f);
    float* zeros = host_floats(nw);
    for (size_t i = 0; i < nw; i++) { zeros[i] = 0.0f; }
    floatX *d_x = device_bf16_from(x, nx), *d_w = device_bf16_from(w, nw), *d_dy = device_bf16_from(dy, ny);
    Fp8TensorScaling x_state, w_state, dy_state;
    fp8_scaling_init(&x_state, FP8_RECIPE_DELAYED, FP8_E4M3, 16, 0);
    fp8_scaling_init(&w_state, FP8_RECIPE_CURRENT, FP8_E4M3, 16, 0);
    fp8_scaling_init(&dy_state, FP8_RECIPE_CURRENT, FP8_E5M2, 16, 0);
    Fp8Scaling activations = block ? FP8_SCALING_ROWS_1x128 : FP8_SCALING_TENSOR;
    DeviceFp8 fx = device_fp8_make(N, C, FP8_E4M3, activations, &x_state);
    DeviceFp8 fw = device_fp8_make(OC, C, FP8_E4M3, block ? FP8_SCALING_BLOCKS_128x128 : FP8_SCALING_TENSOR, &w_state);
    DeviceFp8 fdy = device_fp8_make(N, OC, block ? FP8_E4M3 : FP8_E5M2, activations, &dy_state);
    float* d_scratch = (float*)device_alloc(matmul_dbias_scratch_floats(N, OC) * sizeof(float));
    if (block) { fp8_cast_transpose(&fx.out, d_x, N, C, 0); } else { fp8_cast_transpose_current(&fx.out, d_x, N, C, 0); }
    fp8_cast_weight(&fw.out, NULL, d_w, OC, C, false, 0);
    matmul_backward_fp8_dout(&fdy.out, NULL, d_scratch, d_dy, NULL, N, OC, block ? FP8_DOUT_SCALE_KNOWN : FP8_DOUT_NEEDS_AMAX, 0);

    floatX* d_out = (floatX*)device_alloc(ny * 2);
    floatX* d_dinp = (floatX*)device_alloc(nx * 2);
    floatX* d_dw = device_bf16_from(zeros, nw);
    matmul_forward_fp8(d_out, fp8_operand(&fx.out, false), fp8_operand(&fw.out, false), NULL, N, C, OC, NULL, 0);
    matmul_backward_fp8(d_dinp, d_dw, CUDA_R_16BF, fp8_operand(&fdy.out, false), fp8_operand(&fdy.out, true),
                        fp8_operand(&fw.out, true), fp8_operand(&fx.out, true), N, C, OC, NULL, 0);
    float* xt = transpose_host(x, N, C); float* wt = transpose_host(w, OC, C); float* dyt = transpose_host(dy, N, OC);
    double* ref_out = host_gemm_nt(x, w, NULL, N, OC, C);
    double* ref_dinp = host_gemm_nt(dy, wt, NULL, N, C, OC);
    double* ref_dw = host_gemm_nt(dyt, xt, NULL, OC, C, N);
    float* out = download_bf16_as_floats(d_out, ny);
    float* dinp = download_bf16_as_floats(d_dinp, nx);
    float* dw = download_bf16_as_floats(d_dw, nw);
    double s_out = sqnr_db(ref_out, out, ny), s_dinp = sqnr_db(ref_dinp, dinp, nx), s_dw = sqnr_db(ref_dw, dw, nw);
    printf("fp8 GEMM SQNR %s N=%d C=%d OC=%d: forward %.2f dB, dgrad %.2f dB, wgrad %.2f dB\n",
           block ? "block " : "tensor", N, C, OC, s_out, s_dinp, s_dw);
    double backward_floor = block ? 25.0 : 24.0;  // E5M2 x E4M3 tops out near 24.6 dB
    CHECK(s_out >= 25.0, "%s forward SQNR %.2f dB < 25 dB", block ? "block" : "tensor", s_out);
    CHECK(s_dinp >= backward_floor, "%s dgrad SQNR %.2f dB < %.0f dB", block ? "block" : "tensor", s_dinp, backward_floor);
    CHECK(s_dw >= backward_floor, "%s wgrad SQNR %.2f dB < %.0f dB", block ? "block" : "tensor", s_dw, backward_floor);

    free(x); free(w); free(dy); free(zeros); free(xt); free(wt); free(dyt);
    free(ref_out); free(ref_dinp); free(ref_dw); free(out); free(dinp); free(dw);
    device_fp8_free(&fx); device_fp8_free(&fw); device_fp8_free(&fdy);
    void* buffers[7] = {d_x, d_w, d_dy, d_scratch, d_out, d_dinp, d_dw};
    for (int i = 0; i < 7; i++) { cudaCheck(cudaFree(buffers[i])); }
}

// the host side of the FP8 GEMMs, spec by spec (no GEMM runs): which code array is cuBLASLt's
// A and which its B, their types, scale pointers and scale modes, the TN layout, and fast
// accumulation (on for the per-tensor forward only). cudasim accepts FAST_ACCUM and computes
// the same sums without it, so only the spec shows whether the forward asks for it; an
// operand order, type or scale mode mixed up between the launchers is caught here by name,
// before any exactness test has to trip over its numbers
static Fp8Operand fake_operand(uintptr_t codes, Fp8Format format, Fp8Scaling scaling, uintptr_t scale_inv) {
    Fp8Operand o;
    o.codes = (const uint8_t*)codes; o.format = format; o.scaling = scaling; o.scale_inv = (const float*)scale_inv;
    return o;
}

static void check_fp8_spec(const MatmulSpec* spec, const Fp8Operand* a, const Fp8Operand* b, bool fast, const char* what) {
    const cudaDataType_t a_type = a->format == FP8_E4M3 ? CUDA_R_8F_E4M3 : CUDA_R_8F_E5M2;
    const cudaDataType_t b_type = b->format == FP8_E4M3 ? CUDA_R_8F_E4M3 : CUDA_R_8F_E5M2;
    const cublasLtMatmulMatrixScale_t modes[3] = {CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F, CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F,
                                                  CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F};
    CHECK(spec->a == a->codes && spec->b == b->codes && spec->a_scale == a->scale_inv && spec->b_scale == b->scale_inv,
          "%s: A %p (scale %p), B %p (scale %p); expected A %p (%p), B %p (%p)", what, spec->a, (const void*)spec->a_scale,
          spec->b, (const void*)spec->b_scale, (const void*)a->codes, (const void*)a->scale_inv, (const void*)b->codes,
          (const void*)b->scale_inv);
    CHECK(spec->a_type == a_type && spec->b_type == b_type, "%s: types A %d B %d, expected %d %d", what, (int)spec->a_type,
          (int)spec->b_type, (int)a_type, (int)b_type);
    CHECK(spec->a_scale_mode == modes[a->scaling] && spec->b_scale_mode == modes[b->scaling],
          "%s: scale modes A %d B %d, expected %d %d", what, (int)spec->a_scale_mode, (int)spec->b_scale_mode,
          (int)modes[a->scaling], (int)modes[b->scaling]);
    CHECK(spec->transpose_a && !spec->transpose_b, "%s: transpose A %d B %d, expected the TN layout", what,
          (int)spec->transpose_a, (int)spec->transpose_b);
    CHECK(spec->fast_accumulate == fast, "%s: fast accumulation %d, expected %d", what, (int)spec->fast_accumulate, (int)fast);
}

// the descriptor matmul_cublaslt builds from an FP8 spec: fast accumulation, the scale pointers and
// modes and the transposes as the spec has them (cudasim's sums ignore FAST_ACCUM, so only the
// descriptor shows whether the forward asks cuBLASLt for it)
static void check_fp8_descriptor(const MatmulSpec* spec, const char* what) {
    MatmulPlan plan;
    matmul_plan_create(&plan, spec, 0);
    int8_t fast = -1;
    const void* scales[2] = {NULL, NULL};
    int32_t modes[2] = {-1, -1}, transposes[2] = {-1, -1};
    const cublasLtMatmulDescAttributes_t scale_attributes[2] = {CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER};
    const cublasLtMatmulDescAttributes_t mode_attributes[2] = {CUBLASLT_MATMUL_DESC_A_SCALE_MODE, CUBLASLT_MATMUL_DESC_B_SCALE_MODE};
    const cublasLtMatmulDescAttributes_t transpose_attributes[2] = {CUBLASLT_MATMUL_DESC_TRANSA, CUBLASLT_MATMUL_DESC_TRANSB};
    size_t written = 0;
    cublasCheck(cublasLtMatmulDescGetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof(fast), &written));
    for (int i = 0; i < 2; i++) {
        cublasCheck(cublasLtMatmulDescGetAttribute(plan.desc, scale_attributes[i], &scales[i], sizeof(scales[i]), &written));
        cublasCheck(cublasLtMatmulDescGetAttribute(plan.desc, mode_attributes[i], &modes[i], sizeof(modes[i]), &written));
        cublasCheck(cublasLtMatmulDescGetAttribute(plan.desc, transpose_attributes[i], &transposes[i], sizeof(transposes[i]), &written));
    }
    matmul_plan_destroy(&plan);
    CHECK(fast == (int8_t)spec->fast_accumulate, "%s: descriptor FAST_ACCUM %d, spec %d", what, (int)fast, (int)spec->fast_accumulate);
    CHECK(scales[0] == spec->a_scale && scales[1] == spec->b_scale, "%s: descriptor scales A %p B %p, spec %p %p", what,
          scales[0], scales[1], (const void*)spec->a_scale, (const void*)spec->b_scale);
    CHECK(modes[0] == (int32_t)spec->a_scale_mode && modes[1] == (int32_t)spec->b_scale_mode,
          "%s: descriptor scale modes %d %d, spec %d %d", what, (int)modes[0], (int)modes[1], (int)spec->a_scale_mode,
          (int)spec->b_scale_mode);
    CHECK(transposes[0] == CUBLAS_OP_T && transposes[1] == CUBLAS_OP_N, "%s: descriptor transposes %d %d, expected TN", what,
          (int)transposes[0], (int)transposes[1]);
}

/*
-fe 1's fc forward (matmul_forward_fp8_gelu_codes_spec): the operands and fast accumulation of the FP8
forward, an E4M3 D into the codes, and a descriptor with GELU_AUX_BIAS, the D scale and amax pointers
and the bias and aux types named bf16 (with an FP8 D cuBLASLt's defaults for them are not bf16)
*/
static void check_gelu_codes_descriptor(int N, int C, int OC) {
    const char* what = "fp8 forward to GELU codes";
    Fp8Operand x = fake_operand(0x10000, FP8_E4M3, FP8_SCALING_TENSOR, 0x11000);
    Fp8Operand w = fake_operand(0x30000, FP8_E4M3, FP8_SCALING_TENSOR, 0x31000);
    uint8_t* codes = (uint8_t*)(uintptr_t)0x200000;
    floatX* pre_gelu = (floatX*)(uintptr_t)0x400000;
    const floatX* bias = (const floatX*)(uintptr_t)0x70000;
    const float* d_scale = (const float*)(uintptr_t)0x71000;
    float* amax = (float*)(uintptr_t)0x71010;
    MatmulSpec spec = matmul_forward_fp8_gelu_codes_spec(codes, pre_gelu, x, w, bias, N, C, OC, d_scale, amax);
    check_fp8_spec(&spec, &w, &x, true, what);
    CHECK(spec.d == codes && spec.d_type == CUDA_R_8F_E4M3 && spec.aux == pre_gelu && spec.bias == bias,
          "%s: D %p (type %d), aux %p, bias %p", what, spec.d, (int)spec.d_type, spec.aux, spec.bias);
    check_fp8_descriptor(&spec, what);
    MatmulPlan plan;
    matmul_plan_create(&plan, &spec, 0);
    const void *got_scale = NULL, *got_amax = NULL, *got_aux = NULL;
    int32_t aux_type = -1, bias_type = -1;
    uint32_t epilogue = 0;
    size_t written = 0;
    cublasCheck(cublasLtMatmulDescGetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_D_SCALE_POINTER, &got_scale, sizeof(got_scale), &written));
    cublasCheck(cublasLtMatmulDescGetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_AMAX_D_POINTER, &got_amax, sizeof(got_amax), &written));
    cublasCheck(cublasLtMatmulDescGetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &got_aux, sizeof(got_aux), &written));
    cublasCheck(cublasLtMatmulDescGetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, &aux_type, sizeof(aux_type), &written));
    cublasCheck(cublasLtMatmulDescGetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof(bias_type), &written));
    cublasCheck(cublasLtMatmulDescGetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue), &written));
    matmul_plan_destroy(&plan);
    CHECK(got_scale == d_scale && got_amax == amax && got_aux == pre_gelu, "%s: descriptor D scale %p, amax %p, aux %p", what,
          got_scale, got_amax, got_aux);
    CHECK(aux_type == CUDA_R_16BF && bias_type == CUDA_R_16BF && epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS,
          "%s: descriptor aux type %d, bias type %d, epilogue %u: expected bf16, bf16, GELU_AUX_BIAS", what, (int)aux_type,
          (int)bias_type, epilogue);
}

static void test_fp8_gemm_specs(void) {
    const int N = 256, C = 384, OC = 512;
    floatX* out = (floatX*)(uintptr_t)0x100000;
    for (int block = 0; block < 2; block++) {
        const Fp8Scaling act = block ? FP8_SCALING_ROWS_1x128 : FP8_SCALING_TENSOR;
        const Fp8Scaling wgt = block ? FP8_SCALING_BLOCKS_128x128 : FP8_SCALING_TENSOR;
        const Fp8Format grad = block ? FP8_E4M3 : FP8_E5M2;  // per tensor, gradients are E5M2
        Fp8Operand x = fake_operand(0x10000, FP8_E4M3, act, 0x11000), xt = fake_operand(0x20000, FP8_E4M3, act, 0x21000);
        Fp8Operand w = fake_operand(0x30000, FP8_E4M3, wgt, 0x31000), wt = fake_operand(0x40000, FP8_E4M3, wgt, 0x41000);
        Fp8Operand dy = fake_operand(0x50000, grad, act, 0x51000), dyt = fake_operand(0x60000, grad, act, 0x61000);
        char what[96];
        snprintf(what, sizeof(what), "fp8 forward spec (%s)", block ? "block" : "per tensor");
        MatmulSpec forward = matmul_forward_fp8_spec(out, x, w, NULL, N, C, OC, NULL);
        check_fp8_spec(&forward, &w, &x, !block, what);  // D^T = W x^T: A is W, B is x
        check_fp8_descriptor(&forward, block ? "fp8 forward descriptor (block)" : "fp8 forward descriptor (per tensor)");
        snprintf(what, sizeof(what), "fp8 dgrad spec (%s)", block ? "block" : "per tensor");
        MatmulSpec dgrad = matmul_dgrad_fp8_spec(out, dy, wt, N, C, OC, NULL);
        check_fp8_spec(&dgrad, &wt, &dy, false, what);  // A is W^T, B is dy
        check_fp8_descriptor(&dgrad, block ? "fp8 dgrad descriptor (block)" : "fp8 dgrad descriptor (per tensor)");
        snprintf(what, sizeof(what), "fp8 wgrad spec (%s)", block ? "block" : "per tensor");
        MatmulSpec wgrad = matmul_wgrad_fp8_spec(out, CUDA_R_16BF, dyt, xt, N, C, OC);
        check_fp8_spec(&wgrad, &xt, &dyt, false, what);  // dW^T = x^T dy: A is x^T, B is dy^T
    }
    check_gelu_codes_descriptor(N, C, OC);
}

// the startup probes against a cuBLASLt without short K blocks (cudasim's CUDASIM_CUBLASLT_WHOLE_K_BLOCKS=1):
// the forward (K = C), dgrad (K = OC) and wgrad (K = N) each refused where its own K is not a multiple
// of 128, accepted where it is
static void test_fp8_supported_probes(void) {
#ifdef CUDASIM
    setenv("CUDASIM_CUBLASLT_WHOLE_K_BLOCKS", "1", 1);
    floatX* d = (floatX*)(uintptr_t)0x100000;
    Fp8Operand x = fake_operand(0x10000, FP8_E4M3, FP8_SCALING_ROWS_1x128, 0x11000);
    Fp8Operand w = fake_operand(0x30000, FP8_E4M3, FP8_SCALING_BLOCKS_128x128, 0x31000);
    CHECK(matmul_forward_fp8_supported(d, x, w, NULL, 256, 256, 384, NULL), "probe: block forward at K = C = 256 refused");
    CHECK(!matmul_forward_fp8_supported(d, x, w, NULL, 256, 192, 384, NULL), "probe: block forward at K = C = 192 accepted");
    const int sizes[3][3] = {{256, 256, 384}, {256, 256, 192}, {272, 256, 384}};  // N, C, OC: all whole, OC short, N short
    for (int i = 0; i < 3; i++) {
        const int N = sizes[i][0], C = sizes[i][1], OC = sizes[i][2];
        bool dgrad = matmul_backward_fp8_supported(d, NULL, CUDA_R_16BF, x, x, w, x, N, C, OC, NULL);
        bool wgrad = matmul_backward_fp8_supported(NULL, d, CUDA_R_16BF, x, x, w, x, N, C, OC, NULL);
        CHECK(dgrad == (OC % 128 == 0) && wgrad == (N % 128 == 0), "probe N=%d C=%d OC=%d: dgrad %d, wgrad %d supported", N, C,
              OC, (int)dgrad, (int)wgrad);
    }
    unsetenv("CUDASIM_CUBLASLT_WHOLE_K_BLOCKS");
#endif
}

// a cast output of dout that passes fp8_cast_check (fake aligned pointers, never written): per tensor
// E5M2, or tiles / blocks in E4M3
static Fp8CastOutput fake_dout_cast(Fp8Scaling scaling) {
    Fp8CastOutput o;
    memset(&o, 0, sizeof(o));
    o.codes = (uint8_t*)(uintptr_t)0x10000; o.codes_t = (uint8_t*)(uintptr_t)0x20000;
    o.record = (Fp8CastRecord*)(uintptr_t)0x30000; o.state = (Fp8TensorScaling*)(uintptr_t)0x40000;
    o.scale_inv = (float*)(uintptr_t)0x50000; o.scale_inv_t = (float*)(uintptr_t)0x60000;
    o.scaling = scaling;
    o.format = scaling == FP8_SCALING_TENSOR ? FP8_E5M2 : FP8_E4M3;
    return o;
}

// matmul_backward_fp8_dout's refusals of a scale source its dout cast cannot have (forked, before CUDA)
static void test_backward_dout_bad_input(void) {
    floatX* dout = (floatX*)(uintptr_t)0x70000;
    floatX* dbias = (floatX*)(uintptr_t)0x90000;
    float* scratch = (float*)(uintptr_t)0x80000;
    Fp8CastOutput cast = fake_dout_cast(FP8_SCALING_BLOCKS_128x128);
    CHECK_DIES("dout cast in 128x128 blocks", "gradients are scaled per 1x128 tile",
               matmul_backward_fp8_dout(&cast, NULL, scratch, dout, NULL, 32, 32, FP8_DOUT_SCALE_KNOWN, 0));
    cast = fake_dout_cast(FP8_SCALING_ROWS_1x128);
    CHECK_DIES("dout tiles with a scale from a bound", "a scale from a bound is per tensor",
               matmul_backward_fp8_dout(&cast, NULL, scratch, dout, NULL, 32, 32, FP8_DOUT_SCALE_BOUND, 0));
    cast = fake_dout_cast(FP8_SCALING_TENSOR);
    cast.codes_t = NULL;
    CHECK_DIES("dout codes written without their transpose", "codes written by dout's producer",
               matmul_backward_fp8_dout(&cast, NULL, scratch, dout, NULL, 32, 32, FP8_DOUT_CODES_WRITTEN, 0));
    cast = fake_dout_cast(FP8_SCALING_TENSOR);
    CHECK_DIES("dout amax recorded with a bias left to sum", "an amax recorded by dout's producer",
               matmul_backward_fp8_dout(&cast, dbias, scratch, dout, NULL, 32, 32, FP8_DOUT_AMAX_RECORDED, 0));
}

// ----------------------------------------------------------------------------

static void test_bad_input(void) {
    CHECK_DIES("fp8 linear C not a multiple of 16", "multiple of 16", matmul_fp8_check_shapes("qkv", 1024, 100, 300));
    CHECK_DIES("fp8 linear B*T not a multiple of 16", "B*T", matmul_fp8_check_shapes("fc", 88, 768, 3072));
    CHECK_DIES("fp8 linear of no tokens", "B*T = 0 must be a positive multiple of 16", matmul_fp8_check_shapes("fc", 0, 768, 3072));
    // block-scaled GEMM specs cuBLASLt refuses (cuBLAS docs, 128-element 1D and 128x128 2D block
    // scaling): BLK128x128 on both operands, and scale arrays not 16-byte aligned
    MatmulSpec blk = {};
    blk.name = "block spec";
    blk.m = 128; blk.n = 128; blk.k = 128;
    blk.a = (const void*)(uintptr_t)4096; blk.b = (const void*)(uintptr_t)8192; blk.d = (void*)(uintptr_t)16384;
    blk.a_type = CUDA_R_8F_E4M3; blk.b_type = CUDA_R_8F_E4M3; blk.d_type = CUDA_R_16BF;
    blk.transpose_a = true;
    blk.epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    blk.a_scale = (const float*)(uintptr_t)32768; blk.b_scale = (const float*)(uintptr_t)65536;
    blk.a_scale_mode = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
    blk.b_scale_mode = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
    CHECK_DIES("fp8 block GEMM BLK128x128 x BLK128x128", "BLK128x128 x VEC128", matmul_cublaslt(&blk, 0));
    blk.b_scale_mode = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
    blk.b_scale = (const float*)(uintptr_t)65540;
    CHECK_DIES("fp8 block GEMM with scales at 4 bytes' alignment", "B scale pointer 0x10004 is not 16-byte aligned",
               matmul_cublaslt(&blk, 0));
    blk.b_scale = NULL;
    CHECK_DIES("fp8 block GEMM without B scales", "both A and B scale arrays", matmul_cublaslt(&blk, 0));
    // a per-tensor scale 4 bytes past 16-byte alignment, as Fp8CastRecord's scale_inv once was:
    // an H200's cublasLtMatmul refused it with NOT_SUPPORTED; the check names it first
    MatmulSpec tensor = blk;
    tensor.a_scale_mode = CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
    tensor.b_scale_mode = CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
    tensor.a_scale = (const float*)(uintptr_t)32772;
    tensor.b_scale = (const float*)(uintptr_t)65536;
    CHECK_DIES("fp8 per-tensor GEMM with its A scale at 4 bytes' alignment", "A scale pointer 0x8004 is not 16-byte aligned",
               matmul_cublaslt(&tensor, 0));
    // one operand per tensor and the other per block: refused where the launcher sets the operands,
    // by name (else cuBLASLt's scale-mode check dies later, naming modes)
    Fp8Operand per_tensor_op = {(const uint8_t*)(uintptr_t)4096, FP8_E4M3, FP8_SCALING_TENSOR, (const float*)(uintptr_t)32768};
    Fp8Operand tiles_op = {(const uint8_t*)(uintptr_t)8192, FP8_E4M3, FP8_SCALING_ROWS_1x128, (const float*)(uintptr_t)65536};
    CHECK_DIES("fp8 forward with 1x128 x and a per-tensor W", "both operands are scaled per tensor, or both per block",
               matmul_forward_fp8((floatX*)(uintptr_t)16384, tiles_op, per_tensor_op, NULL, 128, 128, 128, NULL, 0));
    Fp8Operand unscaled_op = per_tensor_op;
    unscaled_op.scale_inv = NULL;
    CHECK_DIES("fp8 forward with a W lacking its scale", "lacks its codes or its dequantization scale",
               matmul_forward_fp8((floatX*)(uintptr_t)16384, per_tensor_op, unscaled_op, NULL, 128, 128, 128, NULL, 0));
    CHECK_DIES("fp8 wgrad into an fp16 dweight", "neither bf16 nor fp32",
               matmul_backward_fp8(NULL, (void*)(uintptr_t)16384, CUDA_R_16F, per_tensor_op, per_tensor_op, per_tensor_op,
                                   per_tensor_op, 128, 128, 128, NULL, 0));
    Fp8CastOutput out;
    memset(&out, 0, sizeof(out));
    CHECK_DIES("fp8 cast of 40 x 24", "multiple of 16", fp8_cast_transpose(&out, NULL, 40, 24, 0));
    CHECK_DIES("fp8 cast without outputs", "neither codes nor codes_t", fp8_cast_transpose(&out, NULL, 32, 32, 0));
    uint8_t* codes = (uint8_t*)(uintptr_t)4096;
    out.codes = codes;
    out.record = (Fp8CastRecord*)(uintptr_t)8192;
    out.scaling = FP8_SCALING_ROWS_1x128;
    out.format = FP8_E4M3;
    out.scale_inv = (float*)(uintptr_t)16384;
    CHECK_DIES("block layernorm cast without row statistics", "mean and rstd must be given",
               layernorm_forward_fp8(&out, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 32, 32, 0));
    // the tile cast stores codes 16 bytes at a time: a code array 8 bytes past alignment dies; weights are E4M3 only
    out.scaling = FP8_SCALING_TENSOR;
    out.state = (Fp8TensorScaling*)(uintptr_t)12288;
    out.codes = (uint8_t*)(uintptr_t)4104;
    CHECK_DIES("fp8 cast into codes at 8 bytes' alignment", "is not 16-byte aligned", fp8_cast_transpose(&out, NULL, 32, 32, 0));
    out.codes = codes;
    out.format = FP8_E5M2;
    CHECK_DIES("fp8 weight cast in E5M2", "weights are E4M3",
               fp8_cast_weight(&out, NULL, (const floatX*)(uintptr_t)4096, 32, 32, false, 0));
    test_backward_dout_bad_input();
}

int main(void) {
    test_bad_input();  // forks before this process touches CUDA
#ifdef CUDASIM
    // one SM: the tile cast's grid is 3 blocks (what one SM holds), so each block takes several
    // tiles, copying the next one in while it casts this one, at these tests' sizes
    setenv("CUDASIM_SM_COUNT", "1", 1);
#endif
    // d48's widths (C = 1600) and a B*T of 80 pass the shape check (a die here ends the test):
    // the block recipe's last tile along K may be short, as test_gemm_block_exact(272, 192, 576) runs
    matmul_fp8_check_shapes("fc", 1024, 1600, 6400);
    matmul_fp8_check_shapes("qkv", 80, 1600, 4800);
    manual_seed(&test_rng, 8128);
    matmul_setup();

    test_cast_tensor(80, 208, FP8_E4M3, false);
    test_cast_tensor(80, 208, FP8_E5M2, false);
    test_cast_tensor(256, 384, FP8_E4M3, false);
    test_cast_tensor(272, 208, FP8_E5M2, true);
#ifndef CUDASIM
    // 416 tiles, more than an H100's or H200's 396 resident blocks: some blocks take two, the
    // second copied in while the first is cast (cudasim runs every case so, on one SM)
    test_cast_tensor(2048, 3328, FP8_E4M3, false);
#endif
    test_amax_pass_long();
    test_cast_current(80, 208, FP8_RECIPE_DELAYED);
    test_cast_current(272, 208, FP8_RECIPE_CURRENT);
    test_cast_current(16, 32, FP8_RECIPE_CURRENT);  // 64 vectors: an amax pass of one block (its grid rounds up)
    test_cast_blocks(80, 208);
    test_cast_blocks(272, 208);
    test_batched_weight_casts(272, 208, 3, FP8_SCALING_TENSOR);
    test_batched_weight_casts(208, 400, 5, FP8_SCALING_TENSOR);
    test_batched_weight_casts(272, 208, 3, FP8_SCALING_BLOCKS_128x128);
    test_cast_weight_block_parts(272, 208, 3);
    test_cast_weight_block_parts(384, 768, 2);
    test_cast_weight_block_parts(768, 3072, 8);
    test_cast_weight_parts_per_tensor(272, 208, 3);
    test_scaling_restore_states();
    test_scaling_update_with_amax();
    test_cast_record_loaded_error();
    test_settle_prediction_joins_the_interval();
    for (int cast = PRODUCER_CAST_DELAYED; cast <= PRODUCER_CAST_BLOCK; cast++) {
        test_layernorm_fp8(80, 208, false, (ProducerCast)cast);
        test_layernorm_fp8(80, 208, true, (ProducerCast)cast);
        test_layernorm_fp8(272, 768, true, (ProducerCast)cast);
        test_gelu_fp8(80, 208, (ProducerCast)cast);
        test_gelu_fp8(272, 832, (ProducerCast)cast);
    }
    test_gelu_fp8_current_amax_rounded(80, 208);
    test_backward_dout(80, 208, false, DOUT_CURRENT);
    test_backward_dout(272, 832, true, DOUT_CURRENT);
    test_backward_dout(80, 208, false, DOUT_BOUND);
    test_backward_dout(272, 832, true, DOUT_BOUND);
    test_backward_dout(80, 208, false, DOUT_DELAYED);
    test_backward_dout(272, 832, true, DOUT_DELAYED);
    test_backward_dout(272, 208, true, DOUT_BLOCK);
    test_backward_dout(144, 400, false, DOUT_BLOCK);
    test_backward_dout(80, 208, false, DOUT_POW2_RIGHT);
    test_backward_dout(272, 832, true, DOUT_POW2_RIGHT);
    test_backward_dout(80, 208, false, DOUT_POW2_LOW);
    test_backward_dout(272, 832, true, DOUT_POW2_LOW);
    test_backward_dout(80, 208, false, DOUT_POW2_HIGH);
    test_backward_dout(272, 832, true, DOUT_POW2_HIGH);
    test_backward_dout_amax_recorded(272, 832);
#ifndef CUDASIM
    test_backward_dout(2048, 3328, true, DOUT_DELAYED);  // the one-buffer staging (GELU backward's aux), 416 tiles
#endif
    test_transpose_codes(16, 16);
    test_transpose_codes(144, 400);   // rows: a 16-row last tile
    test_transpose_codes(176, 272);   // rows: a 48-row last tile (32 + 16)
    test_transpose_codes(400, 1040);
    test_gemm_exact(96, 208, 48);
    test_gemm_exact(256, 768, 2304);
    test_gemm_exact_fast_accumulate(96, 32, 48);
    test_gemm_gelu_codes(96, 208, 144);
    test_gemm_gelu_codes(272, 64, 400);  // tiles of x^T that end short in both directions
    test_gemm_block_exact(256, 256, 384);
    test_gemm_block_exact(272, 192, 576);  // every K (192, 576, 272) ends in a short tile, as d48's C = 1600
    test_gemm_sqnr(256, 384, 512, false);
    test_gemm_sqnr(256, 384, 512, true);
    test_gemm_sqnr(272, 192, 576, true);
    // the layernorm casts on a grid of one block (N = 16: half of the one-pass cast's 32 rows), where the
    // block that writes the record's scale is also the last, short one (last: its draws shift no other test's inputs)
    for (int cast = PRODUCER_CAST_DELAYED; cast <= PRODUCER_CAST_BLOCK; cast++) {
        test_layernorm_fp8(16, 208, true, (ProducerCast)cast);
    }
    test_fp8_gemm_specs();
    test_fp8_supported_probes();
    // last: their draws shift no other test's inputs
    test_cast_transposed_only(80, 208, FP8_E4M3);
    test_cast_transposed_only(272, 208, FP8_E5M2);

    matmul_teardown();
    return test_summary("test_fp8_kernels");
}
