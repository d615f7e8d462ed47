/*
quant8.h: blockwise 8-bit quantization of the AdamW moments (DESIGN.md section 4), and
everything about adamw8 that is not a kernel: the maps, the per-element step shared with
the GPU, host references of the kernels' step (the 8-bit one, and the fp32 AdamW that the
32-bit tensors take), with the FP8 weight outputs both kernels write (fp8.h), which tensors
get 8-bit states, the state layout, the persistent-memory figure, the state-file sections
and the conversions to and from fp32 moments.

Why it is shaped this way:
- Dettmers' dynamic tree quantization, generated here (not pasted): after an optional sign
  bit, the number of leading zero bits e is a decimal exponent (scale 10^-e), the first 1 is
  an indicator, and the remaining bits are a linear fraction in (0.1, 1]. Large values get
  many fraction bits, tiny ones few, so 8 bits span seven or eight decades. m is signed
  (7 bits after the sign: e = 0..6, 6-e fraction bits; 127 magnitudes a side); v >= 0 uses
  the sign bit as one more fraction bit (e = 0..7, 7-e bits; 255 magnitudes). The fraction
  points are the right ends of 2^F equal steps of (0.1, 1], so the top point is exactly 1:
  a block's absmax element round-trips exactly. The signed tree's negative zero is spent
  on the tree's next decade, -1e-7, so the 256 codes are distinct.
- Codes are stored so that a zeroed buffer means "all moments 0": an m code is an int8 whose
  value orders the map (map index = code + 128, zero at code 0), a v code is a uint8 (zero at
  code 0). Encoding finds the nearest map value, ties to the lower value, through a table of
  buckets keyed by the float's bits and the decision points between neighbouring map values
  (quant8_nearest_index): no search.
- Blocks of 256 elements with one fp32 absmax per block per state; x is normalized by x/absmax
  (through the block's reciprocal and one correction, quant8_normalize: the same quotient).
  Every operation on the path is a single IEEE-rounded + - * / fma or a comparison, so the host
  and the device produce the same codes bit for bit (the GPU test checks it).
- The step is two phases because a block's new absmax depends on all its elements:
  adamw8_element_update (dequantize, fp32 AdamW from element_math.h) per element, then the
  block max, then quant8_encode_* per element. The AdamW update itself uses the fp32 moments
  before requantization, as bitsandbytes does. A block with any non-finite new moment or
  parameter is left entirely untouched (states, absmax and parameters).
- Which tensors are 8-bit: "tensors under 4096 elements" means one layer's tensor (what a
  framework calls a parameter; bitsandbytes's min_8bit_size applies per parameter), although
  llm8 stores the L layers of a tensor contiguously. The embeddings (wte, wpe) keep 32-bit
  states by default: 8-bit embedding states are known to destabilize pretraining.
- Each 8-bit tensor's codes start at a multiple of 256, so blocks never straddle tensors and
  shard boundaries can be multiples of 256. The fp32 states of the 32-bit tensors sit in
  their own compact m32/v32 arrays.
Host code here is C that also compiles as C++; the element functions are __host__ __device__.
*/
#ifndef LLMC_QUANT8_H
#define LLMC_QUANT8_H

#include <stdint.h>
#include <stddef.h>
#include <string.h>
#include <math.h>
#include "element_math.h"
#include "fp8.h"
#include "utils.h"
#include "gpt2_config.h"
#include "checkpoint.h"

#define QUANT8_CODES 256
#define QUANT8_BLOCK 256
#define QUANT8_SIGNED_ZERO_INDEX 128        // map index of the signed code 0
#define ADAMW8_MIN_8BIT_ELEMENTS 4096       // per-layer tensors smaller than this keep 32-bit states

/*
The encode finds a value's nearest map entry without a search. The nearest entry, ties to the
lower one (quant8_nearest_by_search defines it), steps from entry i to i + 1 at one float, the
decision point between them: the thresholds table holds it for each i (the smallest float whose
nearest entry is above i; NaN after the last entry, which no x passes). A table of buckets
keyed by the value's float bits (sign, exponent and the top mantissa bits) holds for each
bucket the nearest entry of its smallest value. The keys are fine enough that no bucket holds
two decision points (quant8_maps_init checks it), so the nearest entry of x is its bucket's
entry, or the next one from that entry's threshold on: a bucket read, a threshold read and a
compare (quant8_nearest_index).
Magnitudes below 2^-25 share the first bucket (the smallest nonzero map values are 1e-7 and
1e-6: their midpoints with 0 are at least 5e-8 > 2^-25), and 1 and above the last. The keys
have the fewest mantissa bits for which no bucket holds two decision points: 6 for the signed
map (its top decade has 64 points, 0.014 apart, and a bucket of [0.5, 1) is 2^-7 wide), 7 for
the unsigned one (128 points, 0.007 apart). The signed map's keys have a second half for
negative values. The binary search this replaced spent about 90 instructions and a chain of 9
dependent shared-memory reads on each value, the bucket encode before this one (the entry at or
below the bucket's start, then three map reads and two distances) about 20 (doc/adamw8.md).
*/
#define QUANT8_BUCKET_MIN_EXPONENT (-25)  // magnitudes below 2^-25 share the first bucket
// mantissa bits in a bucket's key, for the signed map (m) and the unsigned one (v)
#define QUANT8_BUCKET_BITS(is_signed) ((is_signed) ? 6 : 7)
// the buckets of one sign: 2^bits per binade from 2^-25 to 2^-1, then one for [1, inf]
#define QUANT8_BUCKETS_PER_SIGN(bits) ((-QUANT8_BUCKET_MIN_EXPONENT << (bits)) + 1)
#define QUANT8_SIGNED_BUCKETS (2 * QUANT8_BUCKETS_PER_SIGN(QUANT8_BUCKET_BITS(1)))  // 3202
#define QUANT8_UNSIGNED_BUCKETS QUANT8_BUCKETS_PER_SIGN(QUANT8_BUCKET_BITS(0))     // 3201

// the two dynamic maps, each ascending (signed_values[code + 128], unsigned_values[code]), and
// their encode tables: the decision points after each entry, and the buckets (map indices)
typedef struct {
    float signed_values[QUANT8_CODES];
    float unsigned_values[QUANT8_CODES];
    float signed_thresholds[QUANT8_CODES];
    float unsigned_thresholds[QUANT8_CODES];
    uint8_t signed_buckets[QUANT8_SIGNED_BUCKETS];
    uint8_t unsigned_buckets[QUANT8_UNSIGNED_BUCKETS];
} Quant8Maps;

// ----------------------------------------------------------------------------
// map generation (host)

/*
Appends, in ascending order, the magnitudes of a dynamic tree with `tree_bits` bits: for each
decade e = tree_bits-1 down to 0 (e leading zeros, then the indicator bit), F = tree_bits-1-e
fraction bits give the 2^F points 10^-e * (0.1 + 0.9 * (k+1) / 2^F), k = 0..2^F-1.
Returns the number written (2^tree_bits - 1).
*/
static inline int quant8_tree_magnitudes(double* out, int tree_bits) {
    int count = 0;
    for (int e = tree_bits - 1; e >= 0; e--) {
        int fraction_points = 1 << (tree_bits - 1 - e);
        double decade = pow(10.0, -e);
        for (int k = 0; k < fraction_points; k++) {
            // (0.1 + 0.9 * (k+1)/2^F) written as one ratio, so the top point is exactly 1
            out[count++] = decade * (double)(fraction_points + 9 * (k + 1)) / (10.0 * fraction_points);
        }
    }
    return count;
}

/*
The encode's definition: the entry of the ascending table nearest to x, ties to the lower one,
with the distances as floats compute them (x not NaN). A binary search for the last entry <= x
(0 if none), then a look at the entry after it. Host only: it builds the encode's tables.
*/
static inline int quant8_nearest_by_search(const float* table, float x) {
    int below = 0;
    for (int step = QUANT8_CODES / 2; step > 0; step >>= 1) {
        if (table[below + step] <= x) { below += step; }
    }
    if (below < QUANT8_CODES - 1 && table[below + 1] - x < x - table[below]) { below++; }
    return below;
}

// floats in ascending order as ascending unsigned integers (-0 just below +0), and back
static inline uint32_t quant8_float_order(float x) {
    uint32_t u = float_as_bits(x);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

static inline float quant8_float_from_order(uint32_t order) {
    return bits_as_float((order & 0x80000000u) ? (order & 0x7fffffffu) : ~order);
}

/*
thresholds[i]: the smallest float whose nearest entry (quant8_nearest_by_search) is above i, found
by a binary search over the floats from table[i] to table[i + 1] (the nearest entry only grows
with x, and table[i + 1] is its own nearest entry); after the last entry NaN, which x >= never
passes (not +inf: x = +inf would pass it).
*/
static inline void quant8_thresholds_init(const float* table, float* thresholds) {
    for (int i = 0; i + 1 < QUANT8_CODES; i++) {
        uint32_t below = quant8_float_order(table[i]), above = quant8_float_order(table[i + 1]);
        while (above - below > 1) {
            uint32_t middle = below + (above - below) / 2;
            if (quant8_nearest_by_search(table, quant8_float_from_order(middle)) > i) { above = middle; } else { below = middle; }
        }
        thresholds[i] = quant8_float_from_order(above);
    }
    thresholds[QUANT8_CODES - 1] = NAN;
}

/*
Each bucket's entry, with keys of bucket_bits mantissa bits (the encode's: QUANT8_BUCKET_BITS):
the nearest entry of the bucket's smallest value. Dies if the nearest entry changes twice inside
a bucket (two decision points), which QUANT8_BUCKET_BITS rules out for these maps; a change to
the generator that broke it would stop here.
*/
static inline void quant8_buckets_init(const float* table, int bucket_bits, int is_signed, uint8_t* buckets) {
    const int per_sign = QUANT8_BUCKETS_PER_SIGN(bucket_bits), shift = 23 - bucket_bits;
    const uint32_t first_key = (uint32_t)(127 + QUANT8_BUCKET_MIN_EXPONENT) << bucket_bits;
    for (int negative = 0; negative <= is_signed; negative++) {
        for (int key = 0; key < per_sign; key++) {
            // the bucket's magnitudes: from 0 in the first, to infinity in the last
            float small = bits_as_float(key == 0 ? 0u : (first_key + key) << shift);
            float large = bits_as_float(key == per_sign - 1 ? 0x7f800000u : ((first_key + key + 1) << shift) - 1);
            int first = quant8_nearest_by_search(table, negative ? -large : small);
            int last = quant8_nearest_by_search(table, negative ? -small : large);
            if (last - first > 1) {
                llm8_die("quant8_buckets_init: bucket %d of the %s map holds %d decision points; at most one fits the "
                         "encode", negative * per_sign + key, is_signed ? "signed" : "unsigned", last - first);
            }
            buckets[negative * per_sign + key] = (uint8_t)first;
        }
    }
}

static inline void quant8_maps_init(Quant8Maps* maps) {
    double magnitudes[QUANT8_CODES];
    // signed: 7 tree bits after the sign give 127 magnitudes a side (1e-6 ... 1); with 0 and
    // -1e-7 (the negative zero's code) that is 256 values: -1 at index 0, 0 at 128, 1 at 255
    int a_side = quant8_tree_magnitudes(magnitudes, 7);
    for (int i = 0; i < a_side; i++) {
        maps->signed_values[QUANT8_SIGNED_ZERO_INDEX + 1 + i] = (float)magnitudes[i];
        maps->signed_values[QUANT8_SIGNED_ZERO_INDEX - 2 - i] = (float)-magnitudes[i];
    }
    maps->signed_values[QUANT8_SIGNED_ZERO_INDEX - 1] = -1e-7f;
    maps->signed_values[QUANT8_SIGNED_ZERO_INDEX] = 0.0f;
    // unsigned: 8 tree bits give 255 magnitudes (1e-7 ... 1), and 0
    int unsigned_count = quant8_tree_magnitudes(magnitudes, 8);
    maps->unsigned_values[0] = 0.0f;
    for (int i = 0; i < unsigned_count; i++) { maps->unsigned_values[1 + i] = (float)magnitudes[i]; }
    quant8_thresholds_init(maps->signed_values, maps->signed_thresholds);
    quant8_thresholds_init(maps->unsigned_values, maps->unsigned_thresholds);
    quant8_buckets_init(maps->signed_values, QUANT8_BUCKET_BITS(1), 1, maps->signed_buckets);
    quant8_buckets_init(maps->unsigned_values, QUANT8_BUCKET_BITS(0), 0, maps->unsigned_buckets);
}

// ----------------------------------------------------------------------------
// element functions, shared by the kernel and the host reference

/*
x's bucket: its magnitude's key, clamped to the first and the last bucket of a sign. A negative
x takes the second half's key with the signed map, and the first bucket (that of 0, which is
also the nearest entry to every negative value) with the unsigned one.
*/
LLMC_HD int quant8_bucket(float x, int is_signed) {
    uint32_t bits = float_as_bits(x);
    const int key_bits = QUANT8_BUCKET_BITS(is_signed), per_sign = QUANT8_BUCKETS_PER_SIGN(key_bits);
    int key = (int)((bits & 0x7fffffffu) >> (23 - key_bits)) - ((127 + QUANT8_BUCKET_MIN_EXPONENT) << key_bits);
    key = key < 0 ? 0 : (key > per_sign - 1 ? per_sign - 1 : key);
    if (bits >> 31) { key = is_signed ? key + per_sign : 0; }
    return key;
}

/*
The index of the map entry nearest to x, ties to the lower one (quant8_nearest_by_search's
answer), for any x but NaN (the encode never sees one: a block with a non-finite value is
skipped before it): x's bucket's entry, or the next one from that entry's decision point on
(test_adamw8 compares the two on every map value, midpoint and decision point, their float
neighbours, and every bucket's ends).
*/
LLMC_HD int quant8_nearest_index(const float* thresholds, const uint8_t* buckets, int is_signed, float x) {
    int entry = buckets[quant8_bucket(x, is_signed)];
    return entry + (x >= thresholds[entry]);
}

/*
A block's absmax as the divisor of its values' normalization x / absmax, with no division per
value: the GPU's IEEE division (__fdiv_rn) is about 11 instructions with its slow-path test, and
the 8-bit step divides 16 values a lane, about 22 instructions an element of a pass bound by
instruction issue (doc/adamw8.md). So each block takes r = RN(1 / absmax) once, and each value
q0 = RN(x r), the residual e = x - q0 absmax (one fma, exact), and q = RN(q0 + e r) (Markstein's
correction; every step IEEE-rounded, the same on host and device). Where absmax lies in
[2^-60, 2^126] (r is then a normal float) and |x| >= 2^-100 (the residual is not subnormal), q
is RN(x / absmax) bit for bit: test_adamw8 checks it for every mantissa of x against several
absmax mantissas and on random pairs. Below |x| = 2^-100, |x / absmax| < 2^-40, far under half
the maps' smallest nonzero values (1e-7), so the code is 0 whatever the last bits of q. Outside
that range of absmax (a decayed moment can reach subnormal absmaxes) the quotient is the IEEE
division; absmax 0 (an all-zero block) or not a number normalizes everything to 0.
*/
#define QUANT8_RECIPROCAL_MIN 0x1p-60f
#define QUANT8_RECIPROCAL_MAX 0x1p126f

typedef struct {
    float absmax;
    float reciprocal;  // RN(1 / absmax) where absmax is in [QUANT8_RECIPROCAL_MIN, QUANT8_RECIPROCAL_MAX]; 0: divide
} Quant8Divisor;

LLMC_HD Quant8Divisor quant8_divisor(float absmax) {
    Quant8Divisor d = {absmax, 0.0f};
    if (absmax >= QUANT8_RECIPROCAL_MIN && absmax <= QUANT8_RECIPROCAL_MAX) {
#ifdef __CUDA_ARCH__
        d.reciprocal = __frcp_rn(absmax);
#else
        d.reciprocal = 1.0f / absmax;
#endif
    }
    return d;
}

// x / d.absmax (the comment above); an all-zero block (absmax 0) maps to 0
LLMC_HD float quant8_normalize(float x, Quant8Divisor d) {
#ifdef QUANT8_ASSUME_RECIPROCAL  // dev/bench/adamw8_sass_probe.cu: the common case alone, for its instruction count
    __builtin_assume(d.reciprocal != 0.0f);
#endif
    if (d.reciprocal != 0.0f) {
#ifdef __CUDA_ARCH__
        float q0 = __fmul_rn(x, d.reciprocal);
        return __fmaf_rn(__fmaf_rn(-q0, d.absmax, x), d.reciprocal, q0);
#else
        float q0 = x * d.reciprocal;
        return fmaf(fmaf(-q0, d.absmax, x), d.reciprocal, q0);
#endif
    }
    if (!(d.absmax > 0.0f)) { return 0.0f; }
#ifdef __CUDA_ARCH__
    return __fdiv_rn(x, d.absmax);
#else
    return x / d.absmax;
#endif
}

// the code of x in a block whose absmax is d's: normalized, then the nearest map entry
LLMC_HD int8_t quant8_encode_signed(float x, Quant8Divisor d, const Quant8Maps* maps) {
    int index = quant8_nearest_index(maps->signed_thresholds, maps->signed_buckets, 1, quant8_normalize(x, d));
    return (int8_t)(index - QUANT8_SIGNED_ZERO_INDEX);
}

LLMC_HD uint8_t quant8_encode_unsigned(float x, Quant8Divisor d, const Quant8Maps* maps) {
    return (uint8_t)quant8_nearest_index(maps->unsigned_thresholds, maps->unsigned_buckets, 0, quant8_normalize(x, d));
}

LLMC_HD float quant8_decode_signed(int8_t code, float absmax, const float* signed_map) {
    return signed_map[(int)code + QUANT8_SIGNED_ZERO_INDEX] * absmax;
}

LLMC_HD float quant8_decode_unsigned(uint8_t code, float absmax, const float* unsigned_map) {
    return unsigned_map[code] * absmax;
}

/*
Phase 1 of the 8-bit AdamW step on one element: dequantize m and v with the block's current
absmaxes and run the fp32 AdamW update (element_math.h). *m and *v receive the new fp32
moments, which phase 2 requantizes with the block's new absmax (quant8_encode_*); returns the
new parameter. grad is already multiplied by the clipping scale.
*/
LLMC_HD float adamw8_element_update(float param, float grad, int8_t m_code, uint8_t v_code, float m_absmax,
                                    float v_absmax, const Quant8Maps* maps, AdamWElementParams hp, float* m, float* v) {
    *m = quant8_decode_signed(m_code, m_absmax, maps->signed_values);
    *v = quant8_decode_unsigned(v_code, v_absmax, maps->unsigned_values);
    return adamw_element_update(param, grad, m, v, hp);
}

LLMC_HD int adamw8_element_is_finite(float param, float m, float v) {
    return isfinite(param) && isfinite(m) && isfinite(v);
}

// ----------------------------------------------------------------------------
// host reference of the step

// the 8-bit states of one tensor (or of any run of whole blocks): codes [n], absmaxes [ceil(n/256)]
typedef struct {
    int8_t* m_codes;
    uint8_t* v_codes;
    float* m_absmax;
    float* v_absmax;
} Quant8TensorStates;

// absmax of a block and its codes; x holds count <= 256 finite values
static inline void quant8_quantize_block_signed(const float* x, int count, const Quant8Maps* maps, int8_t* codes, float* absmax) {
    float block_max = 0.0f;
    for (int k = 0; k < count; k++) { block_max = fmaxf(block_max, fabsf(x[k])); }
    Quant8Divisor divisor = quant8_divisor(block_max);
    for (int k = 0; k < count; k++) { codes[k] = quant8_encode_signed(x[k], divisor, maps); }
    *absmax = block_max;
}

static inline void quant8_quantize_block_unsigned(const float* x, int count, const Quant8Maps* maps, uint8_t* codes, float* absmax) {
    float block_max = 0.0f;
    for (int k = 0; k < count; k++) { block_max = fmaxf(block_max, fabsf(x[k])); }
    Quant8Divisor divisor = quant8_divisor(block_max);
    for (int k = 0; k < count; k++) { codes[k] = quant8_encode_unsigned(x[k], divisor, maps); }
    *absmax = block_max;
}

/*
One block of `count` (<= 256) elements: params in place (fp32), grads multiplied by grad_scale
first. Returns 1, or 0 when some new moment or parameter is not finite: then nothing in the
block changes (parameters, codes, absmaxes).
*/
static inline int adamw8_block_update(float* params, const float* grads, float grad_scale, int count,
                                      int8_t* m_codes, uint8_t* v_codes, float* m_absmax, float* v_absmax,
                                      const Quant8Maps* maps, AdamWElementParams hp) {
    float new_params[QUANT8_BLOCK], m[QUANT8_BLOCK], v[QUANT8_BLOCK];
    for (int k = 0; k < count; k++) {
        new_params[k] = adamw8_element_update(params[k], grads[k] * grad_scale, m_codes[k], v_codes[k], *m_absmax,
                                              *v_absmax, maps, hp, &m[k], &v[k]);
        if (!adamw8_element_is_finite(new_params[k], m[k], v[k])) { return 0; }
    }
    quant8_quantize_block_signed(m, count, maps, m_codes, m_absmax);
    quant8_quantize_block_unsigned(v, count, maps, v_codes, v_absmax);
    memcpy(params, new_params, (size_t)count * sizeof(float));
    return 1;
}

// elements in block b of an n-element tensor (256, less in the last block)
static inline int quant8_block_count(size_t n, size_t b) {
    size_t rest = n - b * QUANT8_BLOCK;
    return rest < QUANT8_BLOCK ? (int)rest : QUANT8_BLOCK;
}

// n fp32 parameters and gradients (the CPU trainer's model); returns the number of blocks skipped
static inline size_t adamw8_update_fp32(float* params, const float* grads, size_t n, Quant8TensorStates st,
                                        const Quant8Maps* maps, AdamWElementParams hp, float grad_scale) {
    size_t skipped = 0;
    for (size_t b = 0; b * QUANT8_BLOCK < n; b++) {
        size_t start = b * QUANT8_BLOCK;
        skipped += !adamw8_block_update(params + start, grads + start, grad_scale, quant8_block_count(n, b),
                                        st.m_codes + start, st.v_codes + start, st.m_absmax + b, st.v_absmax + b, maps, hp);
    }
    return skipped;
}

/*
What the GPU kernel (adamw8.cuh) computes, on the host: n elements of a tensor from its
element first_index, bf16 parameters (raw bits) with an optional fp32 master (NULL: the bf16
weights are the parameters), bf16 gradients. The new parameter goes to the master and, by
stochastic rounding with rounding_bits(seed, first_index + i), to bf16. fp8 (nullable) gets the
FP8 weight outputs (fp8.h's Fp8WeightRef: the amax of the value the cast reads, the master if
given, else the bf16 weight, and the delayed cast's codes) of every element, a skipped
block's unchanged values included.
*/
static inline void adamw8_update_bf16_ref(uint16_t* params, float* master, const uint16_t* grads, size_t n,
                                          Quant8TensorStates st, const Quant8Maps* maps, AdamWElementParams hp,
                                          float grad_scale, uint32_t seed, uint32_t first_index, const Fp8WeightRef* fp8) {
    float block_params[QUANT8_BLOCK], block_grads[QUANT8_BLOCK];
    for (size_t b = 0; b * QUANT8_BLOCK < n; b++) {
        size_t start = b * QUANT8_BLOCK;
        int count = quant8_block_count(n, b);
        for (int k = 0; k < count; k++) {
            block_params[k] = master != NULL ? master[start + k] : bf16_bits_to_float(params[start + k]);
            block_grads[k] = bf16_bits_to_float(grads[start + k]);
        }
        int updated = adamw8_block_update(block_params, block_grads, grad_scale, count, st.m_codes + start,
                                          st.v_codes + start, st.m_absmax + b, st.v_absmax + b, maps, hp);
        for (int k = 0; k < count; k++) {
            size_t i = start + k;
            if (updated) {
                if (master != NULL) { master[i] = block_params[k]; }
                params[i] = float_to_bf16_bits_stochastic(block_params[k], rounding_bits(seed, first_index + (uint32_t)i));
            }
            fp8_weight_ref_add(fp8, i, master != NULL, master != NULL ? master[i] : 0.0f, params[i]);
        }
    }
}

/*
What llmc/adamw.cuh's kernel computes (plain AdamW, and adamw8's 32-bit tensors), on the host,
with the same arguments as adamw8_update_bf16_ref but fp32 moments m, v [n].
*/
static inline void adamw_update_bf16_ref(uint16_t* params, float* master, const uint16_t* grads, float* m, float* v,
                                         size_t n, AdamWElementParams hp, float grad_scale, uint32_t seed,
                                         uint32_t first_index, const Fp8WeightRef* fp8) {
    for (size_t i = 0; i < n; i++) {
        float param = master != NULL ? master[i] : bf16_bits_to_float(params[i]);
        float new_param = adamw_element_update(param, bf16_bits_to_float(grads[i]) * grad_scale, &m[i], &v[i], hp);
        if (master != NULL) { master[i] = new_param; }
        params[i] = float_to_bf16_bits_stochastic(new_param, rounding_bits(seed, first_index + (uint32_t)i));
        fp8_weight_ref_add(fp8, i, master != NULL, new_param, params[i]);
    }
}

// ----------------------------------------------------------------------------
// which tensors are 8-bit, and where their states live

typedef enum { ADAMW8_SELECT_DEFAULT, ADAMW8_SELECT_ALL, ADAMW8_SELECT_NONE } Adamw8Selection;

// "default" | "all" | "none"; `flag` names the source in the error
static inline Adamw8Selection adamw8_selection_from_name(const char* name, const char* flag) {
    if (strcmp(name, "default") == 0) { return ADAMW8_SELECT_DEFAULT; }
    if (strcmp(name, "all") == 0) { return ADAMW8_SELECT_ALL; }
    if (strcmp(name, "none") == 0) { return ADAMW8_SELECT_NONE; }
    llm8_die("%s: '%s' is not an 8-bit state selection (expected default, all or none)", flag, name);
    return ADAMW8_SELECT_DEFAULT; // unreachable
}

// elements of one layer's slice of tensor i (the whole tensor for wte, wpe, lnfw, lnfb)
static inline size_t gpt2_param_layer_elements(const GPT2Config* cfg, int tensor) {
    size_t sizes[NUM_PARAMETER_TENSORS];
    gpt2_param_sizes(cfg, sizes);
    int per_layer = tensor != PARAM_WTE && tensor != PARAM_WPE && tensor != PARAM_LNFW && tensor != PARAM_LNFB;
    return per_layer ? sizes[tensor] / (size_t)cfg->num_layers : sizes[tensor];
}

/*
default: 8-bit states for every tensor whose per-layer slice has at least 4096 elements,
except the embeddings (for d12: the four matmul weights; from d24 on also fcb, 4C elements, and at
d48 qkvb, 3C = 4800). all: every tensor. none: every
tensor keeps fp32 states (the same arithmetic as plain AdamW; a check of the plumbing).
*/
static inline int adamw8_tensor_is_8bit(const GPT2Config* cfg, int tensor, Adamw8Selection selection) {
    if (selection == ADAMW8_SELECT_ALL) { return 1; }
    if (selection == ADAMW8_SELECT_NONE) { return 0; }
    if (tensor == PARAM_WTE || tensor == PARAM_WPE) { return 0; }
    return gpt2_param_layer_elements(cfg, tensor) >= ADAMW8_MIN_8BIT_ELEMENTS;
}

/*
Where the states of each tensor live. The whole model's layout (adamw8_layout_init), or a
window of it (adamw8_layout_window): the states of one ZeRO rank's range of the flat
parameters only, laid out the same way, so a rank's arrays are slices of the single-GPU
arrays and every function taking a layout works on either.
*/
typedef struct {
    size_t num_parameters;
    size_t sizes[NUM_PARAMETER_TENSORS];          // elements (a window: of the tensor's part, 0 for none)
    size_t param_offsets[NUM_PARAMETER_TENSORS];  // into the flat parameter buffer (llm.c order; a window: into its range)
    size_t part_begins[NUM_PARAMETER_TENSORS];    // a window: the part's first element within its tensor (else 0)
    size_t codes_begin, blocks_begin, fp32_begin; // a window: where its arrays start in the model's (else 0)
    int32_t bits[NUM_PARAMETER_TENSORS];          // 8 or 32
    size_t code_offsets[NUM_PARAMETER_TENSORS];   // 8-bit tensors: first code (a multiple of 256)
    size_t block_offsets[NUM_PARAMETER_TENSORS];  // 8-bit tensors: first absmax
    size_t fp32_offsets[NUM_PARAMETER_TENSORS];   // 32-bit tensors: first element in m32/v32
    size_t num_codes;                             // per state (m or v), padding included
    size_t num_blocks;                            // absmaxes per state
    size_t num_fp32;                              // fp32 moments per state
} Adamw8Layout;

static inline void adamw8_layout_init(Adamw8Layout* layout, const GPT2Config* cfg, Adamw8Selection selection) {
    memset(layout, 0, sizeof(*layout));
    gpt2_param_sizes(cfg, layout->sizes);
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        size_t n = layout->sizes[i];
        layout->param_offsets[i] = layout->num_parameters;
        layout->num_parameters += n;
        layout->bits[i] = adamw8_tensor_is_8bit(cfg, i, selection) ? 8 : 32;
        if (layout->bits[i] == 8) {
            size_t blocks = (n + QUANT8_BLOCK - 1) / QUANT8_BLOCK;
            layout->code_offsets[i] = layout->num_codes;
            layout->block_offsets[i] = layout->num_blocks;
            layout->num_codes += blocks * QUANT8_BLOCK;
            layout->num_blocks += blocks;
        } else {
            layout->fp32_offsets[i] = layout->num_fp32;
            layout->num_fp32 += n;
        }
    }
}

/*
The layout of the states of flat parameters [begin, end) of `model` (a ZeRO rank's range).
Each tensor's part keeps its place: codes, absmaxes and fp32 moments are the contiguous
ranges of the whole model's arrays that the parts cover (padding after a tensor's last
block included), so the window's states are the single-GPU states' slice, bit for bit.
An 8-bit tensor's part must start on its 256-element block grid (zero.h's shard boundaries
guarantee it wherever a tensor starts on the grid); otherwise this dies naming the tensor.
*/
static inline void adamw8_layout_window(Adamw8Layout* window, const Adamw8Layout* model, size_t begin, size_t end) {
    memset(window, 0, sizeof(*window));
    memcpy(window->bits, model->bits, sizeof(model->bits));
    window->num_parameters = end - begin;
    size_t codes_begin = SIZE_MAX, blocks_begin = SIZE_MAX, fp32_begin = SIZE_MAX;
    size_t codes_end = 0, blocks_end = 0, fp32_end = 0;
    for (int t = 0; t < NUM_PARAMETER_TENSORS; t++) {  // pass 1: the ranges, in the model's coordinates
        size_t tensor_begin = model->param_offsets[t], n = model->sizes[t];
        size_t lo = begin > tensor_begin ? begin : tensor_begin;
        size_t hi = end < tensor_begin + n ? end : tensor_begin + n;
        if (lo >= hi) { continue; }
        size_t part_begin = lo - tensor_begin, part_end = hi - tensor_begin;
        window->sizes[t] = hi - lo;
        window->param_offsets[t] = lo - begin;
        window->part_begins[t] = part_begin;
        if (model->bits[t] == 8) {
            if (part_begin % QUANT8_BLOCK != 0) {
                llm8_die("8-bit AdamW states of %s: a shard starts at its element %zu, inside a %d-element block "
                         "(zero_8bit_part_off_block_grid refuses such a run at startup)",
                         PARAM_TENSOR_NAMES[t], part_begin, QUANT8_BLOCK);
            }
            size_t padded_end = part_end == n ? (n + QUANT8_BLOCK - 1) / QUANT8_BLOCK * QUANT8_BLOCK : part_end;
            window->code_offsets[t] = model->code_offsets[t] + part_begin;  // made relative in pass 2
            window->block_offsets[t] = model->block_offsets[t] + part_begin / QUANT8_BLOCK;
            if (window->code_offsets[t] < codes_begin) { codes_begin = window->code_offsets[t]; }
            if (window->block_offsets[t] < blocks_begin) { blocks_begin = window->block_offsets[t]; }
            if (model->code_offsets[t] + padded_end > codes_end) { codes_end = model->code_offsets[t] + padded_end; }
            size_t block_end = model->block_offsets[t] + (part_end + QUANT8_BLOCK - 1) / QUANT8_BLOCK;
            if (block_end > blocks_end) { blocks_end = block_end; }
        } else {
            window->fp32_offsets[t] = model->fp32_offsets[t] + part_begin;
            if (window->fp32_offsets[t] < fp32_begin) { fp32_begin = window->fp32_offsets[t]; }
            if (model->fp32_offsets[t] + part_end > fp32_end) { fp32_end = model->fp32_offsets[t] + part_end; }
        }
    }
    for (int t = 0; t < NUM_PARAMETER_TENSORS; t++) {  // pass 2: into the window's own arrays
        if (window->sizes[t] == 0) { continue; }
        if (window->bits[t] == 8) {
            window->code_offsets[t] -= codes_begin;
            window->block_offsets[t] -= blocks_begin;
        } else {
            window->fp32_offsets[t] -= fp32_begin;
        }
    }
    window->codes_begin = codes_end > 0 ? codes_begin : 0;
    window->blocks_begin = blocks_end > 0 ? blocks_begin : 0;
    window->fp32_begin = fp32_end > 0 ? fp32_begin : 0;
    window->num_codes = codes_end > 0 ? codes_end - codes_begin : 0;
    window->num_blocks = blocks_end > 0 ? blocks_end - blocks_begin : 0;
    window->num_fp32 = fp32_end > 0 ? fp32_end - fp32_begin : 0;
}

typedef struct {
    double model;            // all parameters
    double eight_bit;        // the parameters of 8-bit tensors only (0 when there are none)
    size_t eight_bit_params;
} Adamw8BytesPerParam;

/*
Persistent bytes per parameter: bf16 weights and gradients (2 + 2), the fp32 master (4, when
kept), and the moments: 4 + 4 for a 32-bit tensor; for an 8-bit tensor 1 + 1 per element as
allocated (padded to 256) plus two fp32 absmaxes per block. At 256 elements a block that is
2 + 2 + 4 + 1 + 1 + 8/256 = 10.03125 (6.03125 without master) for the 8-bit tensors.
*/
static inline Adamw8BytesPerParam adamw8_bytes_per_param(const Adamw8Layout* layout, int use_master_weights) {
    double all_bytes = 0.0, eight_bit_bytes = 0.0;
    size_t eight_bit_params = 0;
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        size_t n = layout->sizes[i];
        double bytes = (2.0 + 2.0 + (use_master_weights ? 4.0 : 0.0)) * (double)n;
        if (layout->bits[i] == 8) {
            size_t blocks = (n + QUANT8_BLOCK - 1) / QUANT8_BLOCK;
            bytes += 2.0 * (double)(blocks * QUANT8_BLOCK) + 2.0 * sizeof(float) * (double)blocks;
            eight_bit_bytes += bytes;
            eight_bit_params += n;
        } else {
            bytes += 2.0 * sizeof(float) * (double)n;
        }
        all_bytes += bytes;
    }
    Adamw8BytesPerParam result;
    result.model = all_bytes / (double)layout->num_parameters;
    result.eight_bit = eight_bit_params > 0 ? eight_bit_bytes / (double)eight_bit_params : 0.0;
    result.eight_bit_params = eight_bit_params;
    return result;
}

// ----------------------------------------------------------------------------
// the states (host or device pointers: the layout only does arithmetic on them)

typedef struct {
    int8_t* m_codes;    // [num_codes]
    uint8_t* v_codes;   // [num_codes]
    float* m_absmax;    // [num_blocks]
    float* v_absmax;    // [num_blocks]
    float* m32;         // [num_fp32]
    float* v32;         // [num_fp32]
} Adamw8States;

static inline Quant8TensorStates adamw8_tensor_states(const Adamw8Layout* layout, const Adamw8States* states, int tensor) {
    Quant8TensorStates st;
    st.m_codes = states->m_codes + layout->code_offsets[tensor];
    st.v_codes = states->v_codes + layout->code_offsets[tensor];
    st.m_absmax = states->m_absmax + layout->block_offsets[tensor];
    st.v_absmax = states->v_absmax + layout->block_offsets[tensor];
    return st;
}

// zeroed host states: every moment 0
static inline void adamw8_states_alloc_host(Adamw8States* states, const Adamw8Layout* layout) {
    states->m_codes = (int8_t*)mallocCheck(layout->num_codes);
    states->v_codes = (uint8_t*)mallocCheck(layout->num_codes);
    states->m_absmax = (float*)mallocCheck(layout->num_blocks * sizeof(float));
    states->v_absmax = (float*)mallocCheck(layout->num_blocks * sizeof(float));
    states->m32 = (float*)mallocCheck(layout->num_fp32 * sizeof(float));
    states->v32 = (float*)mallocCheck(layout->num_fp32 * sizeof(float));
    memset(states->m_codes, 0, layout->num_codes);
    memset(states->v_codes, 0, layout->num_codes);
    memset(states->m_absmax, 0, layout->num_blocks * sizeof(float));
    memset(states->v_absmax, 0, layout->num_blocks * sizeof(float));
    memset(states->m32, 0, layout->num_fp32 * sizeof(float));
    memset(states->v32, 0, layout->num_fp32 * sizeof(float));
}

static inline void adamw8_states_free_host(Adamw8States* states) {
    free(states->m_codes);
    free(states->v_codes);
    free(states->m_absmax);
    free(states->v_absmax);
    free(states->m32);
    free(states->v32);
    memset(states, 0, sizeof(*states));
}

/*
One AdamW step of the whole model on the host (the CPU trainer and the tests): fp32
parameters and gradients in llm.c order; 8-bit tensors through adamw8_update_fp32, 32-bit
ones through adamw_element_update on m32/v32. Weight decay only where llm.c decays. t counts
from 1. Returns the number of 8-bit blocks left untouched because their update was not finite.
*/
static inline size_t adamw8_model_update_fp32(const Adamw8Layout* layout, Adamw8States* states, const Quant8Maps* maps,
                                              float* params, const float* grads, float learning_rate, float beta1,
                                              float beta2, float eps, float weight_decay, int t, float grad_scale) {
    size_t skipped = 0;
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        AdamWElementParams hp = adamw_element_params(learning_rate, beta1, beta2, eps,
                                                     gpt2_param_is_decayed(i) ? weight_decay : 0.0f, t);
        size_t off = layout->param_offsets[i], n = layout->sizes[i];
        if (layout->bits[i] == 8) {
            skipped += adamw8_update_fp32(params + off, grads + off, n, adamw8_tensor_states(layout, states, i), maps, hp,
                                          grad_scale);
        } else {
            float* m = states->m32 + layout->fp32_offsets[i];
            float* v = states->v32 + layout->fp32_offsets[i];
            for (size_t k = 0; k < n; k++) {
                params[off + k] = adamw_element_update(params[off + k], grads[off + k] * grad_scale, &m[k], &v[k], hp);
            }
        }
    }
    return skipped;
}

// ----------------------------------------------------------------------------
// conversions between fp32 moments (a version-1 state file, plain AdamW) and adamw8 states

/*
Quantizes the fp32 moments of all parameters (llm.c order, as plain AdamW keeps them) into
adamw8 states; 32-bit tensors are copied. Dies on a non-finite moment or a negative v.
*/
static inline void adamw8_states_from_fp32(const Adamw8Layout* layout, const Quant8Maps* maps, const float* m,
                                           const float* v, Adamw8States* out) {
    for (size_t i = 0; i < layout->num_parameters; i++) {
        if (!isfinite(m[i]) || !isfinite(v[i]) || v[i] < 0.0f) {
            llm8_die("AdamW moments of parameter %zu are m=%g v=%g; expected finite values and v >= 0", i, m[i], v[i]);
        }
    }
    for (int t = 0; t < NUM_PARAMETER_TENSORS; t++) {
        size_t off = layout->param_offsets[t], n = layout->sizes[t];
        if (layout->bits[t] == 32) {
            memcpy(out->m32 + layout->fp32_offsets[t], m + off, n * sizeof(float));
            memcpy(out->v32 + layout->fp32_offsets[t], v + off, n * sizeof(float));
            continue;
        }
        Quant8TensorStates st = adamw8_tensor_states(layout, out, t);
        for (size_t b = 0; b * QUANT8_BLOCK < n; b++) {
            size_t start = b * QUANT8_BLOCK;
            int count = quant8_block_count(n, b);
            quant8_quantize_block_signed(m + off + start, count, maps, st.m_codes + start, st.m_absmax + b);
            quant8_quantize_block_unsigned(v + off + start, count, maps, st.v_codes + start, st.v_absmax + b);
        }
    }
}

// the reverse: fp32 moments of all parameters, 8-bit tensors dequantized
static inline void adamw8_states_to_fp32(const Adamw8Layout* layout, const Quant8Maps* maps, const Adamw8States* states,
                                         float* m, float* v) {
    for (int t = 0; t < NUM_PARAMETER_TENSORS; t++) {
        size_t off = layout->param_offsets[t], n = layout->sizes[t];
        if (layout->bits[t] == 32) {
            memcpy(m + off, states->m32 + layout->fp32_offsets[t], n * sizeof(float));
            memcpy(v + off, states->v32 + layout->fp32_offsets[t], n * sizeof(float));
            continue;
        }
        Quant8TensorStates st = adamw8_tensor_states(layout, states, t);
        for (size_t k = 0; k < n; k++) {
            m[off + k] = quant8_decode_signed(st.m_codes[k], st.m_absmax[k / QUANT8_BLOCK], maps->signed_values);
            v[off + k] = quant8_decode_unsigned(st.v_codes[k], st.v_absmax[k / QUANT8_BLOCK], maps->unsigned_values);
        }
    }
}

// ----------------------------------------------------------------------------
// state-file sections (checkpoint.h, version 2, header [6] = 1: no fp32 m, v in the body)

#define ADAMW8_NUM_SECTIONS 7

/*
The sections of adamw8's state, pointing into host states: "adamw8.bits" (int32 per tensor:
8 or 32, the selection the states were written with), "adamw8.m" (int8 codes) and "adamw8.v"
(uint8 codes), num_codes bytes each; "adamw8.m_absmax" and "adamw8.v_absmax", num_blocks fp32
each; "adamw8.m32" and "adamw8.v32", num_fp32 fp32 each (the 32-bit tensors). bits_buffer
receives the file's selection on read: check it with adamw8_check_bits. Returns the count.
*/
static inline int adamw8_state_sections(StateSection sections[ADAMW8_NUM_SECTIONS], const Adamw8Layout* layout,
                                        Adamw8States* host, int32_t bits_buffer[NUM_PARAMETER_TENSORS]) {
    memcpy(bits_buffer, layout->bits, sizeof(layout->bits));
    StateSection list[ADAMW8_NUM_SECTIONS] = {
        {"adamw8.bits", bits_buffer, sizeof(layout->bits), 0},
        {"adamw8.m", host->m_codes, layout->num_codes, 0},
        {"adamw8.v", host->v_codes, layout->num_codes, 0},
        {"adamw8.m_absmax", host->m_absmax, layout->num_blocks * sizeof(float), 0},
        {"adamw8.v_absmax", host->v_absmax, layout->num_blocks * sizeof(float), 0},
        {"adamw8.m32", host->m32, layout->num_fp32 * sizeof(float), 0},
        {"adamw8.v32", host->v32, layout->num_fp32 * sizeof(float), 0},
    };
    memcpy(sections, list, sizeof(list));
    return ADAMW8_NUM_SECTIONS;
}

/*
Where each of adamw8_state_sections's sections of a window starts within the same section of
the whole model, in bytes: a window's arrays are slices of the model's (adamw8_layout_window),
so consecutive windows' sections tile the model's. The bits section is no slice (every window
has all of it): 0.
*/
static inline void adamw8_state_section_origins(const Adamw8Layout* layout, size_t origins[ADAMW8_NUM_SECTIONS]) {
    size_t list[ADAMW8_NUM_SECTIONS] = {0, layout->codes_begin, layout->codes_begin,
                                        layout->blocks_begin * sizeof(float), layout->blocks_begin * sizeof(float),
                                        layout->fp32_begin * sizeof(float), layout->fp32_begin * sizeof(float)};
    memcpy(origins, list, sizeof(list));
}

// after a read: the file's per-tensor selection must be this run's
static inline void adamw8_check_bits(const Adamw8Layout* layout, const int32_t bits_buffer[NUM_PARAMETER_TENSORS],
                                     const char* path) {
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        if (bits_buffer[i] != layout->bits[i]) {
            llm8_die("state file '%s' keeps %d-bit AdamW states for %s, this run keeps %d-bit (use the same 8-bit state selection flag)",
                     path, bits_buffer[i], PARAM_TENSOR_NAMES[i], layout->bits[i]);
        }
    }
}

// 1 when the state file holds plain fp32 AdamW moments in its body (llm.c's, or llm8's plain AdamW)
static inline int state_file_has_fp32_moments(const char* path) {
    StateFileIndex header;
    state_file_read_header(path, &header);
    return header.fp32_moments;
}

#endif // LLMC_QUANT8_H
