/*
fp8_scaling.h: the per-tensor FP8 scaling state (amax history, scale and its inverse) and
the state machine that moves it from step to step, for the delayed and current recipes.

Why it is shaped so:
- Scales live on the GPU and the step loop never waits for them (DESIGN.md section 3).
  So the state is a flat POD struct (an array of them is one cudaMalloc, one memcpy into
  a checkpoint), and every function is LLMC_HD: the trainer's tiny update kernel (one
  thread per tensor) and the CPU reference run the same code, and the CPU tests check it.
- One update per tensor per use, in both recipes: fp8_scaling_update(state, amax). What
  differs is only whether the cast happens after the update (current scaling: the scale
  comes from this use's own amax) or before it (delayed: the cast uses the scale the
  history gave, then this use's amax is recorded for the next one).
  fp8_scaling_casts_after_update() says which, and depends only on the recipe and on
  whether the tensor was ever updated, which the host knows without reading the GPU
  (fresh run: not before its first step; resumed run: restored with the state).
- First-step seeding: a DELAYED tensor that was never updated is cast after its update,
  exactly like CURRENT, so its first step uses its own amax and no step is wasted. On the
  GPU that means the producer takes the two-pass path once (amax, update kernel, cast),
  and the one-pass path (cast with the known scale and record amax) from then on.
- Non-finite amax (Inf/NaN, from an overflow or a NaN upstream): it is NOT recorded (it
  would poison the max of the history for history_len steps), the scale stays what it
  was, and nonfinite_count counts it. A non-finite amax means non-finite values in the
  tensor, so that step's loss or gradient norm is non-finite and the trainer skips the
  update (section 3); the scales recover by themselves because nothing bad was recorded.
- scale = fp8_max / max(amax, 1e-12) / 2^margin: one correctly rounded fp32 division
  (__fdiv_rn on the device, so even --use_fast_math cannot change it) and an exact
  multiplication by 2^-margin. The scale is not rounded to a power of two: an FP8 cast
  loses nothing by a non-power-of-two scale, and it uses the whole range. scale_inv is
  1/scale, also one correctly rounded division. Both sides therefore agree bit for bit.
- CURRENT_POW2 (gradients under -fg pow2) is current scaling with the scale rounded down to a
  power of two: the largest 2^k with amax * 2^k <= fp8_max, then / 2^margin
  (fp8_scale_pow2_from_amax, exact on both sides). The codes are then a function of this use's
  amax alone, as in CURRENT, but the scale changes only where the amax crosses a power of two,
  so the GPU can cast in one pass with the last use's scale and cast again only where this
  use's turned out different (matmul.cuh's FP8_DOUT_SCALE_PREDICTED). What it costs: the
  amax lands in [fp8_max / 2, fp8_max], not on fp8_max, so the scale is up to 2x smaller than
  CURRENT's, and values up to twice as large as those CURRENT flushes to zero flush too.
- amax = 0 (an all-zero tensor) is a finite amax: recorded, and the clamp to 1e-12 gives a
  large finite scale (448e12 for E4M3); zeros encode to zero under any scale.
- A jump above the history (delayed): this use saturates (the numerics log shows its
  fraction saturated), its amax enters the history, and the next use's scale covers it.
- Weights (fp8_scaling_init_weight) run the same machine, one use per optimizer step: current
  (the cast follows the optimizer pass, with the new amax), or delayed with a history of one
  step (the optimizer pass casts with the previous step's amax and records the new one).
- The block recipe's weights have no state: one scale per 128x128 block from the block's
  amax (fp8_weight_block_scale, with the block numbering fp8_weight_block_of) here once, so
  the whole-weight cast and ZeRO's sharded one (each rank a flat part) agree bit for bit.
*/
#ifndef LLMC_FP8_SCALING_H
#define LLMC_FP8_SCALING_H

#include <stdint.h>
#include <math.h>
#include "element_math.h"
#include "fp8.h"

#define FP8_AMAX_HISTORY_MAX 1024
#define FP8_AMAX_HISTORY_DEFAULT 16
#define FP8_AMAX_FLOOR 1e-12f
#define FP8_MARGIN_MAX 16

typedef enum { FP8_RECIPE_DELAYED = 0, FP8_RECIPE_CURRENT = 1, FP8_RECIPE_CURRENT_POW2 = 2 } Fp8Recipe;

typedef struct {
    float amax_history[FP8_AMAX_HISTORY_MAX]; // ring of the last history_len finite amaxes
    float scale;          // multiplies into the FP8 range: code = encode(x * scale)
    float scale_inv;      // 1 / scale, what cuBLASLt's A/B scale pointers take
    float fp8_max;        // 448 (E4M3) or 57344 (E5M2)
    float last_amax;      // the amax of the last update, finite or not (for the log)
    int32_t recipe;       // Fp8Recipe
    int32_t history_len;  // 1..FP8_AMAX_HISTORY_MAX
    int32_t margin;       // scale is divided by 2^margin, 0..FP8_MARGIN_MAX
    int32_t position;     // ring slot the next finite amax goes into
    int32_t recorded;     // finite amaxes recorded so far (the ring holds min(recorded, history_len))
    int32_t nonfinite_count; // updates whose amax was Inf/NaN, skipped
} Fp8TensorScaling;

// scale * 2^-margin (exact above 2^-126), at least the smallest normal float 2^-126
LLMC_HD float fp8_scale_apply_margin_(float scale, int margin) {
    float scaled = scale * bits_as_float((uint32_t)(127 - margin) << 23);
    const float smallest_normal = bits_as_float(0x00800000u);
    return scaled >= smallest_normal ? scaled : smallest_normal;
}

// fp8_max / max(amax, 1e-12) / 2^margin, bit-identical on host and device; at least the
// smallest normal float, 2^-126, so that 1/scale (cuBLASLt's scale_inv) stays finite: a finite
// amax near FLT_MAX under a margin of 16 would make it a subnormal and its inverse +Inf
LLMC_HD float fp8_scale_from_amax(float amax, float fp8_max, int margin) {
    float clamped = amax > FP8_AMAX_FLOOR ? amax : FP8_AMAX_FLOOR;
#ifdef __CUDA_ARCH__
    float scale = __fdiv_rn(fp8_max, clamped);
#else
    float scale = fp8_max / clamped;
#endif
    return fp8_scale_apply_margin_(scale, margin);
}

/*
CURRENT_POW2's scale: the largest power of two 2^k with max(amax, 1e-12) * 2^k <= fp8_max, times
2^-margin, at least 2^-126: the exponent of the correctly rounded quotient fp8_max / amax, which
is the exact quotient's. Rounding cannot cross a power of two 2^k: up, it would need an amax in
(fp8_max 2^-k, fp8_max 2^-k (1 + 2^-25)], and fp8_max 2^-k is a float, the next one 2^-24 or
more above it (relative); down, 2^k itself is a float. Both sides agree bit for bit
(test_fp8_scaling checks it against a reference in double).
*/
LLMC_HD float fp8_scale_pow2_from_amax(float amax, float fp8_max, int margin) {
    float quotient = fp8_scale_from_amax(amax, fp8_max, 0);  // clamps amax to 1e-12, and is a normal float
    float scale = bits_as_float(float_as_bits(quotient) & 0x7f800000u);  // 2^exponent
    return fp8_scale_apply_margin_(scale, margin);
}

LLMC_HD float fp8_reciprocal(float scale) {
#ifdef __CUDA_ARCH__
    return __fdiv_rn(1.0f, scale);
#else
    return 1.0f / scale;
#endif
}

/*
The block recipe's weights: one E4M3 scale per 128x128 block of W [rows][cols] (row-major),
from the block's amax with no margin. Blocks are numbered K blocks fastest, unpadded:
block (r / 128, c / 128) is (r / 128) * ceil(cols / 128) + c / 128. The whole-weight cast
(fp8_cast.cuh) and the sharded one (ZeRO, each rank a flat part: zero.h, zero_comm.cuh)
both take the scale from here, so their codes agree bit for bit.
*/
#define FP8_WEIGHT_BLOCK 128

LLMC_HD float fp8_weight_block_scale(float block_amax) {
    return fp8_scale_from_amax(block_amax, FP8_E4M3_MAX, 0);
}

LLMC_HD size_t fp8_weight_blocks(int rows, int cols) {
    return (size_t)((rows + FP8_WEIGHT_BLOCK - 1) / FP8_WEIGHT_BLOCK) * (size_t)((cols + FP8_WEIGHT_BLOCK - 1) / FP8_WEIGHT_BLOCK);
}

// the block of flat element `element` of W [.][cols]
LLMC_HD size_t fp8_weight_block_of(size_t element, int cols) {
    size_t row = element / (size_t)cols, col = element % (size_t)cols;
    size_t blocks_per_row = (size_t)((cols + FP8_WEIGHT_BLOCK - 1) / FP8_WEIGHT_BLOCK);
    return row / FP8_WEIGHT_BLOCK * blocks_per_row + col / FP8_WEIGHT_BLOCK;
}

// the caller validates history_len and margin first (fp8_scaling_config_error on the host)
LLMC_HD void fp8_scaling_init(Fp8TensorScaling* s, Fp8Recipe recipe, Fp8Format format, int history_len, int margin) {
    for (int i = 0; i < FP8_AMAX_HISTORY_MAX; i++) { s->amax_history[i] = 0.0f; }
    s->scale = 1.0f;
    s->scale_inv = 1.0f;
    s->fp8_max = fp8_max(format);
    s->last_amax = 0.0f;
    s->recipe = (int32_t)recipe;
    s->history_len = history_len;
    s->margin = margin;
    s->position = 0;
    s->recorded = 0;
    s->nonfinite_count = 0;
}

/*
A weight's state (-fw, DESIGN.md section 3). current: CURRENT (history_len is unused).
delayed: DELAYED with a history of one step, so a cast's scale comes from the previous
step's amax (and the margin): the optimizer pass casts the new values with it and records
their amax for the next step. Its first use (the start cast) is seeded like any delayed
tensor's, with its own amax; and a delayed weight whose cast follows its update (with several
ranks, the weights gathered in bf16) is current-scaled, since one step of history makes the
scale that amax's.
*/
LLMC_HD void fp8_scaling_init_weight(Fp8TensorScaling* s, int delayed, int history_len, int margin) {
    fp8_scaling_init(s, delayed ? FP8_RECIPE_DELAYED : FP8_RECIPE_CURRENT, FP8_E4M3, delayed ? 1 : history_len, margin);
}

// NULL when the settings are valid, else what is wrong (for the caller's llm8_die line)
static inline const char* fp8_scaling_config_error(int history_len, int margin) {
    if (history_len < 1 || history_len > FP8_AMAX_HISTORY_MAX) { return "amax history length must be in 1..1024"; }
    if (margin < 0 || margin > FP8_MARGIN_MAX) { return "margin must be in 0..16"; }
    return NULL;
}

// a scale as every state and record holds one (read from a state file: fp8_scaling_loaded_error,
// fp8_cast_record_loaded_error): a positive normal float beside its own inverse, also normal. A
// run's scales lie in [2^-126, fp8_max / 1e-12] (fp8_scale_from_amax), so both always are; a
// subnormal scale's inverse rounds to +Inf, which would pass the equality alone and make every
// dequantized code NaN (0 * Inf)
#define FP8_SCALE_PAIR_ERROR "its scale is not a positive normal float with its inverse"
static inline int fp8_scale_pair_valid(float scale, float scale_inv) {
    return isnormal(scale) && scale > 0.0f && isnormal(scale_inv) && scale_inv == fp8_reciprocal(scale);
}

/*
What is wrong with a scaling state read from a state file (NULL: nothing), against `fresh`, the
state this run's settings initialize it to: the same recipe, format, history length and margin,
a ring position inside the history and where the count of amaxes recorded puts it (every
update moves both), counts >= 0, a positive normal scale with its own (normal) inverse, finite
non-negative amaxes in the recorded part of the ring. Anything else (a corrupt or foreign
file) would index past the ring, cast with a scale of 0, Inf or NaN, or count a slot never
recorded (a corrupt one's huge amax flushing the tensor for a history of uses) as history.
*/
static inline const char* fp8_scaling_loaded_error(const Fp8TensorScaling* s, const Fp8TensorScaling* fresh) {
    if (s->recipe != fresh->recipe || s->fp8_max != fresh->fp8_max) { return "its recipe or format is not this run's"; }
    if (s->history_len != fresh->history_len || s->margin != fresh->margin) { return "its history length or margin is not this run's"; }
    if (s->position < 0 || s->position >= s->history_len) { return "its ring position lies outside its history"; }
    if (s->recorded < 0 || s->nonfinite_count < 0) { return "a negative count"; }
    if (s->position != s->recorded % s->history_len) { return "its ring position does not follow its count of amaxes"; }
    if (!fp8_scale_pair_valid(s->scale, s->scale_inv)) { return FP8_SCALE_PAIR_ERROR; }
    int valid = s->recorded < s->history_len ? s->recorded : s->history_len;
    for (int i = 0; i < valid; i++) {
        if (!(isfinite(s->amax_history[i]) && s->amax_history[i] >= 0.0f)) { return "a recorded amax that is not finite and >= 0"; }
    }
    return NULL;
}

// the uses the state has seen, finite or not (the tests count them)
LLMC_HD int fp8_scaling_updates_seen(const Fp8TensorScaling* s) {
    return s->recorded + s->nonfinite_count;
}

/*
Whether the tensor has a scale of its own: a finite amax recorded. A non-finite one records
nothing, so a tensor whose only uses were non-finite (a first step that overflowed, skipped and
rolled back) is seeded at its next use like a fresh one: the trainer after the rollback, the
trainer resumed from a checkpoint of that point, and the CPU emulation all decide from this.
*/
LLMC_HD int fp8_scaling_seeded(const Fp8TensorScaling* s) { return s->recorded > 0; }

// 1: the producer computes amax, calls fp8_scaling_update, then casts with s->scale
//    (current scaling, and a delayed tensor's seeding use);
// 0: the producer casts with s->scale and records amax, then fp8_scaling_update (delayed).
LLMC_HD int fp8_scaling_casts_after_update(const Fp8TensorScaling* s) {
    return s->recipe != FP8_RECIPE_DELAYED || !fp8_scaling_seeded(s);
}

// max over the recorded part of the ring; 0 when nothing is recorded
LLMC_HD float fp8_scaling_history_max(const Fp8TensorScaling* s) {
    int valid = s->recorded < s->history_len ? s->recorded : s->history_len;
    float history_max = 0.0f;
    for (int i = 0; i < valid; i++) { history_max = fmaxf(history_max, s->amax_history[i]); }
    return history_max;
}

/*
One use of the tensor: record its amax and compute the scale for the next cast.
CURRENT: the new scale comes from this amax alone (CURRENT_POW2: rounded down to a power of
two). DELAYED: from the max of the history, this amax included. A non-finite amax changes
nothing but the counters (see above).
*/
LLMC_HD void fp8_scaling_update(Fp8TensorScaling* s, float amax) {
    s->last_amax = amax;
    if (!isfinite(amax)) {
        s->nonfinite_count++;
        return;
    }
    s->amax_history[s->position] = amax;
    s->position = s->position + 1 == s->history_len ? 0 : s->position + 1;
    s->recorded++;
    if (s->recipe == FP8_RECIPE_CURRENT_POW2) {
        s->scale = fp8_scale_pow2_from_amax(amax, s->fp8_max, s->margin);
    } else {
        float scaling_amax = s->recipe == FP8_RECIPE_CURRENT ? amax : fp8_scaling_history_max(s);
        s->scale = fp8_scale_from_amax(scaling_amax, s->fp8_max, s->margin);
    }
    s->scale_inv = fp8_reciprocal(s->scale);
}

/*
A skipped step leaves no trace in the scaling: its updates are undone by putting back the state
from before the step, all but the count of non-finite amaxes (the numerics log reports those).
A finite spike the step saw (a loss outlier skipped by -sl, the finite amaxes upstream of an
overflow) would otherwise hold the delayed scales down for a whole history of uses.
*/
LLMC_HD void fp8_scaling_restore(Fp8TensorScaling* s, const Fp8TensorScaling* before) {
    int32_t nonfinite_count = s->nonfinite_count;
    *s = *before;
    s->nonfinite_count = nonfinite_count;
}

/*
What one cast did, for the numerics log: the amax seen, the scale used, and the fractions
of elements saturated and flushed to zero (fp8_classify). The CPU reference counts with
fp8_cast_stats_add; the GPU's casts count per block and add each block's counts once
(fp8_scaling.cuh's Fp8Tally).
*/
typedef struct {
    float amax;
    float scale;
    uint64_t elements;
    uint64_t saturated;
    uint64_t flushed;
} Fp8CastStats;

// amax through fp8_amax_bits, so a NaN element shows as a NaN amax (fmaxf would hide it)
LLMC_HD void fp8_cast_stats_add(Fp8CastStats* stats, float x, Fp8ElementStatus status) {
    if (fp8_amax_bits(x) > fp8_amax_bits(stats->amax)) { stats->amax = bits_as_float(fp8_amax_bits(x)); }
    stats->elements++;
    stats->saturated += status == FP8_ELEMENT_SATURATED;
    stats->flushed += status == FP8_ELEMENT_FLUSHED;
}

// adds the counts and the amax of part (a piece of the same cast) into `into` (the CPU
// reference's casts split among threads); the scale is the caller's
static inline void fp8_cast_stats_merge(Fp8CastStats* into, const Fp8CastStats* part) {
    if (fp8_amax_bits(part->amax) > fp8_amax_bits(into->amax)) { into->amax = bits_as_float(fp8_amax_bits(part->amax)); }
    into->elements += part->elements;
    into->saturated += part->saturated;
    into->flushed += part->flushed;
}

static inline double fp8_cast_stats_fraction(uint64_t count, uint64_t elements) {
    return elements == 0 ? 0.0 : (double)count / (double)elements;
}

#endif // LLMC_FP8_SCALING_H
