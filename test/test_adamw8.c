/*
test_adamw8.c: the 8-bit AdamW of llmc/quant8.h on the CPU (the GPU kernel runs the same
element functions; test_adamw8_gpu.cu checks it bit for bit against adamw8_update_bf16_ref).

- maps: ascending, 256 distinct values, 0 and +-1 exact, the tree's shape, encode(decode(c)) = c;
- the bucket encode (quant8_nearest_index) picks the sorted binary search's index on every map
  value, midpoint (ties), bucket end, their float neighbours, both signs, random values, every
  61st float of [-1, 1], and +-0, +-1.5, +-Inf; the bucket generator refuses too coarse keys;
- an all-zero block encodes to code 0 (m and v), also after a step with zero gradients;
- quantize/dequantize: the chosen code is the nearest (brute force), and per element
  |x - deq(q(x))| <= absmax * (gap/2 + 2^-23), gap = the map's gap around x/absmax (at most
  the largest gap G: 0.9/64 signed, 0.9/128 unsigned); 2^-23 covers the two fp32 roundings
  (x/absmax and code*absmax, 2^-24 * absmax each);
- one step: bit-identical to fp32 AdamW run on the dequantized states, and within a bound
  derived from the state error of fp32 AdamW run on the original states;
- 500 steps of a noisy quadratic (fp32 master and bf16-only) and of the tiny CPU GPT-2, 8-bit
  against fp32 AdamW: final loss within 1%; "none" selection bit-identical to plain AdamW;
- the delayed FP8 weight cast against the current one on a slowly moving weight: the same
  codes while the amax stands still, half an E4M3 step (or the amax's growth, saturated)
  apart when it moves;
- non-finite updates leave the block untouched; states through the state file bit for bit;
  fp32 <-> 8-bit conversions; which tensors are 8-bit; the persistent bytes per parameter.
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <float.h>
#include "llmc/quant8.h"
#include "llmc/checkpoint.h"
#include "test/gpt2_ref.h"
#include "test/test_harness.h"
#include "test/test_harness_fork.h"

static Quant8Maps g_maps;
static char g_dir[256];

// ----------------------------------------------------------------------------
// deterministic random numbers

static float uniform01(uint32_t seed, uint32_t index) {
    return ((float)(random_u32(seed, index) >> 8) + 0.5f) / 16777216.0f;
}

static float gaussian(uint32_t seed, uint32_t index) {
    float u1 = uniform01(seed, 2 * index), u2 = uniform01(seed, 2 * index + 1);
    return sqrtf(-2.0f * logf(u1)) * cosf(6.2831853f * u2);
}

// ----------------------------------------------------------------------------
// maps

static double largest_gap(const float* map) {
    double gap = 0.0;
    for (int i = 0; i + 1 < QUANT8_CODES; i++) { gap = fmax(gap, (double)map[i + 1] - map[i]); }
    return gap;
}

static void test_maps(void) {
    const float* s = g_maps.signed_values;
    const float* u = g_maps.unsigned_values;
    int ascending_s = 1, ascending_u = 1;
    for (int i = 0; i + 1 < QUANT8_CODES; i++) {
        ascending_s = ascending_s && s[i] < s[i + 1];
        ascending_u = ascending_u && u[i] < u[i + 1];
    }
    CHECK(ascending_s && ascending_u, "maps are not strictly ascending (signed %d, unsigned %d)", ascending_s, ascending_u);
    int distinct_s = 0, distinct_u = 0;
    for (int i = 0; i < QUANT8_CODES; i++) {
        int seen_s = 0, seen_u = 0;
        for (int j = 0; j < i; j++) { seen_s |= s[j] == s[i]; seen_u |= u[j] == u[i]; }
        distinct_s += !seen_s;
        distinct_u += !seen_u;
    }
    CHECK(distinct_s == 256 && distinct_u == 256, "distinct codes: signed %d, unsigned %d", distinct_s, distinct_u);
    CHECK(s[0] == -1.0f && s[255] == 1.0f && s[QUANT8_SIGNED_ZERO_INDEX] == 0.0f, "signed map: -1 %.9g, 0 %.9g, 1 %.9g",
          s[0], s[QUANT8_SIGNED_ZERO_INDEX], s[255]);
    CHECK(u[0] == 0.0f && u[255] == 1.0f, "unsigned map: 0 %.9g, 1 %.9g", u[0], u[255]);
    CHECK(quant8_decode_signed(0, 3.0f, s) == 0.0f && quant8_decode_unsigned(0, 3.0f, u) == 0.0f,
          "a zeroed code is not the value 0");
    int symmetric = 1;
    for (int k = 1; k <= 127; k++) { symmetric = symmetric && s[QUANT8_SIGNED_ZERO_INDEX + k] == -s[QUANT8_SIGNED_ZERO_INDEX - 1 - k]; }
    CHECK(symmetric && s[QUANT8_SIGNED_ZERO_INDEX - 1] == -1e-7f, "signed map is not symmetric (the extra code is %.3g)",
          s[QUANT8_SIGNED_ZERO_INDEX - 1]);
    // the tree: 2^(F) points per decade, F = 6 - e (signed) or 7 - e (unsigned), smallest 1e-6 / 1e-7
    int per_decade_ok = 1;
    for (int e = 0; e < 7; e++) {
        double hi = pow(10.0, -e) * 1.0000001, lo = pow(10.0, -e - 1) * 1.0000001;
        int count_s = 0, count_u = 0;
        for (int i = 0; i < 256; i++) {
            count_s += s[i] > lo && s[i] <= hi;
            count_u += u[i] > lo && u[i] <= hi;
        }
        per_decade_ok = per_decade_ok && count_s == (1 << (6 - e)) && count_u == (1 << (7 - e));
    }
    CHECK(per_decade_ok, "codes per decade do not follow the dynamic tree");
    CHECK(s[QUANT8_SIGNED_ZERO_INDEX + 1] == 1e-6f && u[1] == 1e-7f, "smallest magnitudes %.3g %.3g",
          s[QUANT8_SIGNED_ZERO_INDEX + 1], u[1]);
    // the derived largest gaps, up to the fp32 rounding of the two map values (2^-24 each near 1)
    CHECK_CLOSE(largest_gap(s), 0.9 / 64, ldexp(1.0, -23), 0, "largest gap of the signed map");
    CHECK_CLOSE(largest_gap(u), 0.9 / 128, ldexp(1.0, -23), 0, "largest gap of the unsigned map");
    int roundtrip = 1;
    Quant8Divisor divisor = quant8_divisor(2.5f);
    for (int c = -128; c < 128; c++) { roundtrip = roundtrip && quant8_encode_signed(s[c + 128] * 2.5f, divisor, &g_maps) == c; }
    for (int c = 0; c < 256; c++) { roundtrip = roundtrip && quant8_encode_unsigned(u[c] * 2.5f, divisor, &g_maps) == c; }
    CHECK(roundtrip, "encode(decode(code)) != code");
}

// ----------------------------------------------------------------------------
// quantize / dequantize error

// value of block k's element i under one of several distributions (signed or not)
static float test_value(int distribution, uint32_t k, uint32_t i, int is_signed) {
    float x;
    if (distribution == 0) { x = uniform01(k, i) * 2.0f - 1.0f; }
    else if (distribution == 1) { x = 3e-3f * gaussian(k + 100, i); }
    else { x = powf(10.0f, -9.0f * uniform01(k + 200, i)) * (uniform01(k + 300, i) < 0.5f ? -1.0f : 1.0f); }  // 1e-9..1
    return is_signed ? x : fabsf(x);
}

// the encode's index of x in one map
static int bucket_nearest_index(int is_signed, float x) {
    return is_signed ? quant8_nearest_index(g_maps.signed_thresholds, g_maps.signed_buckets, 1, x)
                     : quant8_nearest_index(g_maps.unsigned_thresholds, g_maps.unsigned_buckets, 0, x);
}

// x, its two float neighbours, and the same three negated: how many the encode puts at another
// index than the sorted search
static long long differs_around(int is_signed, float x, long long* checked) {
    const float probes[6] = {x, nextafterf(x, -INFINITY), nextafterf(x, INFINITY), -x, -nextafterf(x, -INFINITY),
                                 -nextafterf(x, INFINITY)};
    const float* table = is_signed ? g_maps.signed_values : g_maps.unsigned_values;
    long long differ = 0;
    for (int p = 0; p < 6; p++) { differ += bucket_nearest_index(is_signed, probes[p]) != quant8_nearest_by_search(table, probes[p]); }
    *checked += 6;
    return differ;
}

/*
The bucket encode (quant8_nearest_index) gives the sorted search's index for every map value,
every midpoint between neighbours (the ties), every decision point (the thresholds), every
bucket's first and last magnitude, each of them with its float neighbours and negated; for
random values across the decades, every 61st float of [0, 1] (17 million, both signs), and
+-0, +-1.5, +-Inf, a subnormal. Between those points the search's answer cannot change, so this
covers every float but NaN. Each threshold is the first float of its new entry: the float before
it still has the old one. And the generator refuses keys too coarse for the map's decision points.
*/
static void test_bucket_encode(void) {
    for (int is_signed = 0; is_signed <= 1; is_signed++) {
        const float* table = is_signed ? g_maps.signed_values : g_maps.unsigned_values;
        const int bits = QUANT8_BUCKET_BITS(is_signed);
        const int per_sign = QUANT8_BUCKETS_PER_SIGN(bits);
        long long checked = 0, differ = 0;
        const float* thresholds = is_signed ? g_maps.signed_thresholds : g_maps.unsigned_thresholds;
        int thresholds_exact = isnan(thresholds[QUANT8_CODES - 1]);
        for (int i = 0; i < QUANT8_CODES; i++) {
            differ += differs_around(is_signed, table[i], &checked);
            if (i + 1 < QUANT8_CODES) {
                differ += differs_around(is_signed, table[i] + (table[i + 1] - table[i]) / 2.0f, &checked);
                differ += differs_around(is_signed, thresholds[i], &checked);
                thresholds_exact = thresholds_exact && quant8_nearest_by_search(table, thresholds[i]) == i + 1 &&
                                   quant8_nearest_by_search(table, nextafterf(thresholds[i], -INFINITY)) == i;
            }
        }
        const uint32_t first_key = (uint32_t)(127 + QUANT8_BUCKET_MIN_EXPONENT) << bits;
        for (int key = 0; key < per_sign; key++) {
            differ += differs_around(is_signed, bits_as_float((first_key + key) << (23 - bits)), &checked);
            differ += differs_around(is_signed, bits_as_float(((first_key + key + 1) << (23 - bits)) - 1), &checked);
        }
        for (uint32_t i = 0; i < 200000; i++) {
            float x = powf(10.0f, -9.0f * uniform01(400, i)) * (uniform01(401, i) < 0.5f ? -1.0f : 1.0f);
            differ += bucket_nearest_index(is_signed, x) != quant8_nearest_by_search(table, x);
            checked++;
        }
        for (uint32_t x_bits = 0; x_bits <= 0x3f800000u; x_bits += 61) {
            float x = bits_as_float(x_bits);
            differ += bucket_nearest_index(is_signed, x) != quant8_nearest_by_search(table, x);
            differ += bucket_nearest_index(is_signed, -x) != quant8_nearest_by_search(table, -x);
            checked += 2;
        }
        const float special[8] = {0.0f, -0.0f, 1.5f, -1.5f, INFINITY, -INFINITY, 1e-30f, 1e-40f};
        for (int p = 0; p < 8; p++) {
            differ += bucket_nearest_index(is_signed, special[p]) != quant8_nearest_by_search(table, special[p]);
            checked++;
        }
        CHECK(differ == 0, "%s map: the bucket encode differs from the sorted search on %lld of %lld values",
              is_signed ? "signed" : "unsigned", differ, checked);
        CHECK(thresholds_exact, "%s map: a threshold is not the first float of the next entry (or the last is not "
              "NaN)", is_signed ? "signed" : "unsigned");
    }
    // one key bit fewer puts two of the signed map's decision points in a bucket
    uint8_t too_coarse[QUANT8_SIGNED_BUCKETS];
    CHECK_DIES("buckets too coarse for the map", "holds 2 decision points",
               quant8_buckets_init(g_maps.signed_values, QUANT8_BUCKET_BITS(1) - 1, 1, too_coarse));
}

/*
quant8_normalize through the block's reciprocal (quant8_divisor) against the IEEE division x / absmax:
- bit for bit for every float mantissa of x at two exponents under absmax (x in [absmax / 4, absmax]),
  for absmax 1 and the mantissas next to it, the all-ones mantissa and next to it, a half and five
  random ones, each at three exponents (2^-60, 1, 2^126 scale);
- bit for bit on 4 million random pairs (absmax over [2^-60, 2^126], x up to 2^60 times smaller,
  either sign) where |x| >= 2^-100, and the codes of both maps the same for all of them (below
  2^-100 the quotient is under 2^-40, so both give code 0 whatever its last bits);
- where absmax is outside [2^-60, 2^126] (subnormal, 2^-61, 2^127, FLT_MAX) the division itself,
  and 0 for absmax 0 or NaN; +-0 and +-absmax as the division gives them.
*/
static int same_float(float a, float b) { return float_as_bits(a) == float_as_bits(b); }

static int signed_code_by_division(float x, float absmax) {
    return bucket_nearest_index(1, absmax > 0.0f ? x / absmax : 0.0f);
}

static void test_divisor_quotient(void) {
    const uint32_t mantissas[11] = {0u, 1u, 2u, 0x7fffffu, 0x7ffffeu, 0x400000u, 0x1b2e4fu, 0x5a1c07u, 0x3333u, 0x6e9f1du, 0x123457u};
    const int exponents[3] = {-60, 0, 125};
    long long checked = 0, differ = 0;
    for (int b = 0; b < 11; b++) {
        for (int e = 0; e < 3; e++) {
            float absmax = ldexpf(bits_as_float(0x3f800000u | mantissas[b]), exponents[e]);
            Quant8Divisor d = quant8_divisor(absmax);
            for (int shift = 1; shift <= 2; shift++) {  // x in [absmax / 4, absmax / 2) and [absmax / 2, absmax)
                for (uint32_t m = 0; m <= 0x7fffffu; m++) {
                    float x = ldexpf(bits_as_float(0x3f800000u | m), exponents[e] - shift);
                    differ += !same_float(quant8_normalize(x, d), x / absmax);
                    checked++;
                }
            }
        }
    }
    CHECK(differ == 0, "the reciprocal's quotient differs from the division on %lld of %lld mantissa sweeps' values", differ, checked);

    long long random_checked = 0, random_differ = 0, code_differ = 0;
    for (uint32_t i = 0; i < 4000000; i++) {
        float absmax = ldexpf(1.0f + uniform01(500, i), -60 + (int)(uniform01(501, i) * 186.0f));
        float x = ldexpf(1.0f + uniform01(502, i), (int)floorf(log2f(absmax)) - (int)(uniform01(503, i) * 61.0f));
        if (x > absmax) { x = absmax; }
        if (uniform01(504, i) < 0.5f) { x = -x; }
        Quant8Divisor d = quant8_divisor(absmax);
        if (fabsf(x) >= 0x1p-100f) {
            random_differ += !same_float(quant8_normalize(x, d), x / absmax);
            random_checked++;
        }
        code_differ += quant8_encode_signed(x, d, &g_maps) != signed_code_by_division(x, absmax) - QUANT8_SIGNED_ZERO_INDEX;
        code_differ += quant8_encode_unsigned(fabsf(x), d, &g_maps) != bucket_nearest_index(0, fabsf(x) / absmax);
    }
    CHECK(random_checked > 3000000 && random_differ == 0, "random pairs: the reciprocal's quotient differs on %lld of %lld",
          random_differ, random_checked);
    CHECK(code_differ == 0, "random pairs: %lld codes differ from the division's", code_differ);

    const float outside[6] = {1e-40f, 0x1p-61f, 0x1p127f, FLT_MAX, 0.0f, NAN};
    int outside_ok = 1;
    for (int k = 0; k < 6; k++) {
        Quant8Divisor d = quant8_divisor(outside[k]);
        outside_ok = outside_ok && d.reciprocal == 0.0f;
        for (int j = 0; j < 3; j++) {
            float x = k < 4 ? outside[k] * (j == 0 ? 1.0f : j == 1 ? -0.375f : 1e-3f) : 1.25f;
            float want = outside[k] > 0.0f ? x / outside[k] : 0.0f;
            outside_ok = outside_ok && same_float(quant8_normalize(x, d), want);
        }
    }
    CHECK(outside_ok, "an absmax outside [2^-60, 2^126], 0 or NaN does not divide (or give 0) as the division does");
    const float absmax = 3.0f;
    const float edges[4] = {0.0f, -0.0f, absmax, -absmax};
    Quant8Divisor d = quant8_divisor(absmax);
    int edges_ok = 1;
    for (int k = 0; k < 4; k++) {
        edges_ok = edges_ok && quant8_encode_signed(edges[k], d, &g_maps) == signed_code_by_division(edges[k], absmax) - QUANT8_SIGNED_ZERO_INDEX;
        edges_ok = edges_ok && (k % 2 == 1 || same_float(quant8_normalize(edges[k], d), edges[k] / absmax));
    }
    CHECK(edges_ok, "+-0 or +-absmax: not the division's quotient or code");
}

static void test_quantize_error(void) {
    for (int is_signed = 0; is_signed <= 1; is_signed++) {
        const float* map = is_signed ? g_maps.signed_values : g_maps.unsigned_values;
        double half_gap = largest_gap(map) / 2.0;
        double worst_ratio = 0.0, worst_local = 0.0, worst_uniform = 0.0;
        int nearest = 1, exact_absmax = 1;
        for (int distribution = 0; distribution < 3; distribution++) {
            for (uint32_t k = 0; k < 64; k++) {
                float x[QUANT8_BLOCK], back[QUANT8_BLOCK], absmax;
                int8_t sc[QUANT8_BLOCK];
                uint8_t uc[QUANT8_BLOCK];
                int count = (k == 63) ? 77 : QUANT8_BLOCK;  // a short last block
                for (int i = 0; i < count; i++) { x[i] = test_value(distribution, k, (uint32_t)i, is_signed); }
                if (is_signed) { quant8_quantize_block_signed(x, count, &g_maps, sc, &absmax); }
                else { quant8_quantize_block_unsigned(x, count, &g_maps, uc, &absmax); }
                for (int i = 0; i < count; i++) {
                    int index = is_signed ? sc[i] + QUANT8_SIGNED_ZERO_INDEX : uc[i];
                    back[i] = is_signed ? quant8_decode_signed(sc[i], absmax, map) : quant8_decode_unsigned(uc[i], absmax, map);
                    double q = (double)x[i] / absmax, error = fabs((double)back[i] - x[i]);
                    for (int j = 0; j < 256; j++) { nearest = nearest && fabs(map[j] - q) >= fabs(map[index] - q) - 1e-7; }
                    int below = 0;
                    while (below < 254 && map[below + 1] <= q) { below++; }
                    double local_bound = absmax * ((map[below + 1] - map[below]) / 2.0 + ldexp(1.0, -23));
                    worst_local = worst_of(worst_local, error / local_bound);
                    worst_ratio = worst_of(worst_ratio, error / (absmax * (half_gap + ldexp(1.0, -23))));
                    if (distribution == 0) { worst_uniform = worst_of(worst_uniform, error / (absmax * half_gap)); }
                    if (fabsf(x[i]) == absmax) { exact_absmax = exact_absmax && back[i] == x[i]; }
                }
            }
        }
        const char* name = is_signed ? "signed" : "unsigned";
        CHECK(nearest, "%s: a code other than the nearest was chosen", name);
        CHECK(worst_local <= 1.0, "%s: error exceeds the local half-gap bound by x%.4f", name, worst_local);
        CHECK(worst_ratio <= 1.0, "%s: error exceeds absmax * (G/2 + 2^-23) by x%.4f", name, worst_ratio);
        CHECK(worst_uniform > 0.9, "%s: uniform data reaches only %.3f of the G/2 bound (bound not tight?)", name, worst_uniform);
        CHECK(exact_absmax, "%s: the absmax element does not round-trip exactly", name);
    }
}

// an all-zero block (absmax 0: fresh states, or a wte row no token used under -qs all) encodes
// to code 0 for m and v, so a zeroed buffer and a quantized zero block are the same bytes: the
// tests above never quantize one, and a normalize that divided 0 by 0 (NaN: index 0, m code -128,
// which decodes to -0) passed them
static void test_zero_block(void) {
    float zeros[QUANT8_BLOCK] = {0.0f};
    int8_t mc[QUANT8_BLOCK];
    uint8_t vc[QUANT8_BLOCK];
    float ma = 1.0f, va = 1.0f;
    memset(mc, 0x11, sizeof(mc));
    memset(vc, 0x11, sizeof(vc));
    quant8_quantize_block_signed(zeros, 77, &g_maps, mc, &ma);
    quant8_quantize_block_unsigned(zeros, 77, &g_maps, vc, &va);
    int all_zero = ma == 0.0f && va == 0.0f;
    for (int k = 0; k < 77; k++) { all_zero = all_zero && mc[k] == 0 && vc[k] == 0; }
    CHECK(all_zero, "an all-zero block: absmax %g %g, codes m %d v %d (expected 0)", ma, va, mc[0], vc[0]);
    // a step with zero gradients on zero states leaves the states zero, byte for byte
    float params[QUANT8_BLOCK];
    for (int k = 0; k < QUANT8_BLOCK; k++) { params[k] = 0.02f * gaussian(90, (uint32_t)k); }
    memset(mc, 0, sizeof(mc));
    memset(vc, 0, sizeof(vc));
    ma = va = 0.0f;
    Quant8TensorStates st = {mc, vc, &ma, &va};
    AdamWElementParams hp = adamw_element_params(1e-3f, 0.9f, 0.95f, 1e-8f, 0.0f, 1);
    adamw8_update_fp32(params, zeros, QUANT8_BLOCK, st, &g_maps, hp, 1.0f);
    int still_zero = ma == 0.0f && va == 0.0f;
    for (int k = 0; k < QUANT8_BLOCK; k++) { still_zero = still_zero && mc[k] == 0 && vc[k] == 0; }
    CHECK(still_zero, "zero gradients on zero states: absmax %g %g, codes m %d v %d (expected 0)", ma, va, mc[0], vc[0]);
}

// ----------------------------------------------------------------------------
// one step against fp32 AdamW

static void test_one_step(void) {
    const size_t n = 4096 + 100;
    const size_t blocks = (n + QUANT8_BLOCK - 1) / QUANT8_BLOCK;
    float* params = (float*)mallocCheck(n * sizeof(float));
    float* grads = (float*)mallocCheck(n * sizeof(float));
    float* m0 = (float*)mallocCheck(n * sizeof(float));
    float* v0 = (float*)mallocCheck(n * sizeof(float));
    int8_t* mc = (int8_t*)mallocCheck(n);
    uint8_t* vc = (uint8_t*)mallocCheck(n);
    float* ma = (float*)mallocCheck(blocks * sizeof(float));
    float* va = (float*)mallocCheck(blocks * sizeof(float));
    for (size_t i = 0; i < n; i++) {
        params[i] = 0.02f * gaussian(1, (uint32_t)i);
        grads[i] = 1e-2f * gaussian(2, (uint32_t)i);
        float g_scale = 1e-2f * (0.5f + uniform01(3, (uint32_t)i));
        m0[i] = 0.3f * g_scale * gaussian(4, (uint32_t)i);
        v0[i] = g_scale * g_scale * (0.5f + uniform01(5, (uint32_t)i));
    }
    for (size_t b = 0; b < blocks; b++) {
        int count = quant8_block_count(n, b);
        quant8_quantize_block_signed(m0 + b * 256, count, &g_maps, mc + b * 256, ma + b);
        quant8_quantize_block_unsigned(v0 + b * 256, count, &g_maps, vc + b * 256, va + b);
    }
    const float lr = 1e-3f, beta1 = 0.9f, beta2 = 0.95f, grad_scale = 0.75f;
    const int t = 7;
    AdamWElementParams hp = adamw_element_params(lr, beta1, beta2, 1e-8f, 0.1f, t);
    float* p8 = (float*)mallocCheck(n * sizeof(float));
    memcpy(p8, params, n * sizeof(float));
    int8_t* mc_old = (int8_t*)mallocCheck(n);
    uint8_t* vc_old = (uint8_t*)mallocCheck(n);
    memcpy(mc_old, mc, n);
    memcpy(vc_old, vc, n);
    float* ma_old = (float*)mallocCheck(blocks * sizeof(float));
    float* va_old = (float*)mallocCheck(blocks * sizeof(float));
    memcpy(ma_old, ma, blocks * sizeof(float));
    memcpy(va_old, va, blocks * sizeof(float));
    Quant8TensorStates st = {mc, vc, ma, va};
    size_t skipped = adamw8_update_fp32(p8, grads, n, st, &g_maps, hp, grad_scale);
    CHECK(skipped == 0, "one step: %zu blocks skipped", skipped);

    // (a) exactly fp32 AdamW on the dequantized states, then requantized
    size_t not_exact = 0, codes_differ = 0;
    float m_new[QUANT8_BLOCK], v_new[QUANT8_BLOCK];
    for (size_t b = 0; b < blocks; b++) {
        int count = quant8_block_count(n, b);
        for (int k = 0; k < count; k++) {
            size_t i = b * 256 + k;
            m_new[k] = quant8_decode_signed(mc_old[i], ma_old[b], g_maps.signed_values);
            v_new[k] = quant8_decode_unsigned(vc_old[i], va_old[b], g_maps.unsigned_values);
            float p = adamw_element_update(params[i], grads[i] * grad_scale, &m_new[k], &v_new[k], hp);
            not_exact += p != p8[i];
        }
        int8_t expect_m[QUANT8_BLOCK];
        uint8_t expect_v[QUANT8_BLOCK];
        float expect_ma, expect_va;
        quant8_quantize_block_signed(m_new, count, &g_maps, expect_m, &expect_ma);
        quant8_quantize_block_unsigned(v_new, count, &g_maps, expect_v, &expect_va);
        codes_differ += memcmp(expect_m, mc + b * 256, count) != 0 || memcmp(expect_v, vc + b * 256, count) != 0 ||
                        expect_ma != ma[b] || expect_va != va[b];
    }
    CHECK(not_exact == 0, "one step: %zu parameters differ from fp32 AdamW on the dequantized states", not_exact);
    CHECK(codes_differ == 0, "one step: %zu blocks' new states differ from requantizing fp32 AdamW's", codes_differ);

    // (b) fp32 AdamW on the original states, within the bound the state error implies
    double eps23 = ldexp(1.0, -23);
    double g_s = largest_gap(g_maps.signed_values) / 2.0, g_u = largest_gap(g_maps.unsigned_values) / 2.0;
    double worst = 0.0, mean_bound = 0.0, mean_update = 0.0;
    for (size_t i = 0; i < n; i++) {
        size_t b = i / 256;
        float m = m0[i], v = v0[i];
        float p32 = adamw_element_update(params[i], grads[i] * grad_scale, &m, &v, hp);
        double dm = beta1 * ma_old[b] * (g_s + eps23) * hp.m_hat_scale;   // |m_hat error|
        double dv = beta2 * va_old[b] * (g_u + eps23) * hp.v_hat_scale;   // |v_hat error|
        double m_hat = fabs((double)m) * hp.m_hat_scale, v_hat = (double)v * hp.v_hat_scale;
        double s = sqrt(v_hat), s_lo = sqrt(fmax(0.0, v_hat - dv));
        double dsqrt = (s + s_lo > 0.0) ? fmin(sqrt(dv), dv / (s + s_lo)) : sqrt(dv);
        double du = (dm + 1e-6 * m_hat) / (s_lo + hp.eps) + m_hat * dsqrt / ((s + hp.eps) * (s_lo + hp.eps));
        double bound = lr * du + 2.0 * ldexp(fabs(params[i]) + lr * 10.0, -24);  // + the roundings of the update
        worst = worst_of(worst, fabs((double)p8[i] - p32) / bound);
        mean_bound += bound / n;
        mean_update += fabs((double)p32 - params[i]) / n;
    }
    printf("one step: worst |8-bit - fp32| / bound = %.3f, mean bound %.3g vs mean update %.3g\n", worst, mean_bound, mean_update);
    CHECK(worst <= 1.0, "one step: the 8-bit step is x%.3f outside its derived bound around fp32 AdamW", worst);
    CHECK(mean_bound < 0.1 * mean_update, "one step: the bound (%.3g) is not small next to the update (%.3g)", mean_bound,
          mean_update);
    free(params); free(grads); free(m0); free(v0); free(mc); free(vc); free(ma); free(va);
    free(p8); free(mc_old); free(vc_old); free(ma_old); free(va_old);
}

// ----------------------------------------------------------------------------
// non-finite updates

static void test_non_finite(void) {
    const size_t n = 4 * 256;
    float params[4 * 256], grads[4 * 256], before[4 * 256];
    int8_t mc[4 * 256];
    uint8_t vc[4 * 256];
    float ma[4], va[4];
    Quant8TensorStates st = {mc, vc, ma, va};
    AdamWElementParams hp = adamw_element_params(1e-3f, 0.9f, 0.95f, 1e-8f, 0.0f, 1);
    for (size_t i = 0; i < n; i++) { params[i] = gaussian(7, (uint32_t)i); grads[i] = gaussian(8, (uint32_t)i); }
    memset(mc, 0, sizeof(mc)); memset(vc, 0, sizeof(vc)); memset(ma, 0, sizeof(ma)); memset(va, 0, sizeof(va));
    adamw8_update_fp32(params, grads, n, st, &g_maps, hp, 1.0f);  // states become non-trivial
    int8_t mc_before[4 * 256];
    uint8_t vc_before[4 * 256];
    float ma_before[4], va_before[4];
    memcpy(before, params, sizeof(params)); memcpy(mc_before, mc, sizeof(mc)); memcpy(vc_before, vc, sizeof(vc));
    memcpy(ma_before, ma, sizeof(ma)); memcpy(va_before, va, sizeof(va));
    grads[3] = NAN;               // block 0: a NaN gradient
    grads[256 + 100] = INFINITY;  // block 1: an infinite gradient
    grads[512 + 7] = 3e30f;       // block 2: finite, but g^2 overflows v
    size_t skipped = adamw8_update_fp32(params, grads, n, st, &g_maps, hp, 1.0f);
    CHECK(skipped == 3, "non-finite: %zu blocks skipped, expected 3", skipped);
    int untouched = 1, finite = 1;
    for (int b = 0; b < 3; b++) {
        untouched = untouched && memcmp(params + b * 256, before + b * 256, 256 * sizeof(float)) == 0 &&
                    memcmp(mc + b * 256, mc_before + b * 256, 256) == 0 && memcmp(vc + b * 256, vc_before + b * 256, 256) == 0 &&
                    ma[b] == ma_before[b] && va[b] == va_before[b];
    }
    for (int b = 0; b < 4; b++) { finite = finite && isfinite(ma[b]) && isfinite(va[b]); }
    for (size_t i = 0; i < n; i++) { finite = finite && isfinite(params[i]); }
    CHECK(untouched, "non-finite: a block with a non-finite update was modified");
    CHECK(finite, "non-finite: a NaN/Inf reached the states or parameters");
    CHECK(memcmp(params + 768, before + 768, 256 * sizeof(float)) != 0 && ma[3] != ma_before[3],
          "non-finite: the healthy block was not updated");
}

// the same through the bf16 reference the GPU test uses: NaN leaves the block's bf16 weights and
// master alone, and the amax (of the master, what the FP8 cast reads) still covers them
static void test_non_finite_bf16(void) {
    const size_t n = 512;
    uint16_t params[512], grads[512], before[512];
    float master[512], master_before[512];
    int8_t mc[512];
    uint8_t vc[512];
    float ma[2] = {0, 0}, va[2] = {0, 0};
    memset(mc, 0, sizeof(mc));
    memset(vc, 0, sizeof(vc));
    for (size_t i = 0; i < n; i++) {
        master[i] = gaussian(9, (uint32_t)i);
        params[i] = float_to_bf16_bits(master[i]);
        grads[i] = float_to_bf16_bits(i == 300 ? NAN : gaussian(10, (uint32_t)i));
    }
    memcpy(before, params, sizeof(params));
    memcpy(master_before, master, sizeof(master));
    Quant8TensorStates st = {mc, vc, ma, va};
    AdamWElementParams hp = adamw_element_params(1e-2f, 0.9f, 0.95f, 1e-8f, 0.0f, 1);
    float amax = 0.0f;
    Fp8WeightRef fp8 = {&amax, NULL, 1.0f};
    adamw8_update_bf16_ref(params, master, grads, n, st, &g_maps, hp, 1.0f, 1234u, 0, &fp8);
    CHECK(memcmp(params + 256, before + 256, 512) == 0 && memcmp(master + 256, master_before + 256, 1024) == 0 &&
          ma[1] == 0.0f && va[1] == 0.0f, "bf16 non-finite: the NaN block was modified");
    float master_max = 0.0f;
    for (size_t i = 0; i < n; i++) { master_max = fmaxf(master_max, fabsf(master[i])); }
    CHECK(memcmp(params, before, 512) != 0 && amax == master_max && amax > 0.0f,
          "bf16 non-finite: amax %.9g is not the max |master| %.9g over both blocks", amax, master_max);
}

// ----------------------------------------------------------------------------
// the delayed FP8 weight cast (-fw delayed) against the current one, on a slowly moving weight

#define MOVING_N 4096
#define MOVING_STEPS 30

// |x - decode(code) / scale| is at most half an E4M3 step: 2^-4 |x| for normals, 2^-10 / scale below
static int within_half_step(float x, uint8_t code, float scale) {
    float error = fabsf(x - fp8_decode(code, FP8_E4M3) / scale);
    return error <= fmaxf(0.0625f * fabsf(x), 0.0009765625f / scale) * 1.0001f;
}

/*
30 steps of a weight (fp32 AdamW states, or 8-bit) from its optimizer's host reference: the
delayed codes (written in the step, under the scale of the previous step's amax, as
fp8_scaling_init_weight's delayed state gives it) against the current ones (the same new
values under the scale of their own amax). The largest element has no gradient for 15
steps (the amax stands still), then grows every step, by ~10% (lr 1e-2) so that some
delayed codes saturate. Where the two scales are equal the
codes are equal byte for byte; where they differ each code is within half an E4M3 step of
its value, except a delayed code that saturated: it is the previous amax, below its value by
at most the amax's growth over the step.
*/
static void test_delayed_weight_codes(int eight_bit) {
    const char* name = eight_bit ? "adamw8" : "adamw";
    uint16_t* params = (uint16_t*)mallocCheck(MOVING_N * sizeof(uint16_t));
    uint16_t* grads = (uint16_t*)mallocCheck(MOVING_N * sizeof(uint16_t));
    float* master = (float*)mallocCheck(MOVING_N * sizeof(float));
    float* m = (float*)calloc(MOVING_N, sizeof(float));
    float* v = (float*)calloc(MOVING_N, sizeof(float));
    int8_t* m_codes = (int8_t*)calloc(MOVING_N, 1);
    uint8_t* v_codes = (uint8_t*)calloc(MOVING_N, 1);
    float* m_absmax = (float*)calloc(MOVING_N / QUANT8_BLOCK, sizeof(float));
    float* v_absmax = (float*)calloc(MOVING_N / QUANT8_BLOCK, sizeof(float));
    uint8_t* delayed = (uint8_t*)mallocCheck(MOVING_N);
    for (size_t i = 0; i < MOVING_N; i++) {
        master[i] = i == 0 ? 0.1f : 0.02f * gaussian(50, (uint32_t)i);
        params[i] = float_to_bf16_bits(master[i]);
    }
    Fp8TensorScaling state;  // seeded by the start cast: its own amax
    fp8_scaling_init_weight(&state, 1, FP8_AMAX_HISTORY_DEFAULT, 0);
    CHECK(fp8_scaling_casts_after_update(&state), "%s: a fresh delayed weight is not seeded by a current cast", name);
    fp8_scaling_update(&state, 0.1f);
    CHECK(!fp8_scaling_casts_after_update(&state), "%s: a seeded delayed weight still casts after its update", name);
    int same_scale_steps = 0, other_scale_steps = 0, saturated = 0;
    for (int step = 1; step <= MOVING_STEPS; step++) {
        for (size_t i = 0; i < MOVING_N; i++) {
            float g = i == 0 ? (step > 15 ? -1.0f : 0.0f) : 1e-2f * gaussian(60 + (uint32_t)step, (uint32_t)i);
            grads[i] = float_to_bf16_bits(g);
        }
        AdamWElementParams hp = adamw_element_params(step > 15 ? 1e-2f : 1e-3f, 0.9f, 0.95f, 1e-8f, 0.0f, step);
        float previous_amax = state.amax_history[0], previous_scale = state.scale, amax = 0.0f;
        Fp8WeightRef fp8 = {&amax, delayed, previous_scale};
        if (eight_bit) {
            Quant8TensorStates st = {m_codes, v_codes, m_absmax, v_absmax};
            adamw8_update_bf16_ref(params, master, grads, MOVING_N, st, &g_maps, hp, 1.0f, (uint32_t)step, 0, &fp8);
        } else {
            adamw_update_bf16_ref(params, master, grads, m, v, MOVING_N, hp, 1.0f, (uint32_t)step, 0, &fp8);
        }
        fp8_scaling_update(&state, amax);  // the next step's scale: what the current cast uses now
        int mismatched = 0, out_of_bounds = 0;
        for (size_t i = 0; i < MOVING_N; i++) {
            uint8_t current = fp8_quantize(master[i], state.scale, FP8_E4M3);
            mismatched += current != delayed[i];
            if (!within_half_step(master[i], current, state.scale)) { out_of_bounds++; }
            if (fp8_classify(master[i], previous_scale, delayed[i], FP8_E4M3) == FP8_ELEMENT_SATURATED) {
                saturated++;
                float gap = fabsf(master[i]) - fp8_decode(delayed[i], FP8_E4M3) / previous_scale;
                if (!(gap > 0.0f && gap <= (amax - previous_amax) * 1.0001f)) { out_of_bounds++; }
            } else if (!within_half_step(master[i], delayed[i], previous_scale)) {
                out_of_bounds++;
            }
        }
        if (state.scale == previous_scale) {
            same_scale_steps++;
            CHECK(mismatched == 0, "%s step %d: the scale stood still, yet %d delayed codes differ from the current ones", name,
                  step, mismatched);
        } else {
            other_scale_steps++;
        }
        CHECK(out_of_bounds == 0, "%s step %d: %d codes beyond half an E4M3 step of their value (or a saturated one beyond "
              "the amax's growth %.3g)", name, step, out_of_bounds, amax - previous_amax);
    }
    CHECK(same_scale_steps >= 10 && other_scale_steps >= 10 && saturated >= 10,
          "%s: %d steps with the scale unchanged, %d changed, %d saturated codes: the case does not exercise both", name,
          same_scale_steps, other_scale_steps, saturated);
    printf("delayed weight codes (%s): %d steps with the previous scale equal to the new one (codes equal), %d with "
           "it below (%d codes saturated)\n", name, same_scale_steps, other_scale_steps, saturated);
    free(params); free(grads); free(master); free(m); free(v); free(m_codes); free(v_codes); free(m_absmax); free(v_absmax);
    free(delayed);
}

// ----------------------------------------------------------------------------
// 500 steps of a noisy quadratic: loss = 1/2 sum h_i (w_i - w*_i)^2, gradient + noise

#define QUAD_N (16384 + 77)
#define QUAD_STEPS 500

// fp32 AdamW and adamw8, each with an fp32 master or with bf16 weights only (stochastic rounding)
typedef enum { QUAD_FP32, QUAD_8BIT_MASTER, QUAD_FP32_BF16_ONLY, QUAD_8BIT_BF16_ONLY } QuadMode;

static double quad_loss(const float* w, const float* h, const float* target) {
    double loss = 0.0;
    for (size_t i = 0; i < QUAD_N; i++) { double d = (double)w[i] - target[i]; loss += 0.5 * h[i] * d * d; }
    return loss / QUAD_N;
}

static double quad_run(QuadMode mode) {
    const size_t n = QUAD_N, blocks = (n + 255) / 256;
    float* h = (float*)mallocCheck(n * sizeof(float));
    float* target = (float*)mallocCheck(n * sizeof(float));
    float* w = (float*)calloc(n, sizeof(float));
    float* grads = (float*)mallocCheck(n * sizeof(float));
    uint16_t* w_bf16 = (uint16_t*)calloc(n, sizeof(uint16_t));
    uint16_t* g_bf16 = (uint16_t*)mallocCheck(n * sizeof(uint16_t));
    float* m = (float*)calloc(n, sizeof(float));
    float* v = (float*)calloc(n, sizeof(float));
    int8_t* mc = (int8_t*)calloc(n, 1);
    uint8_t* vc = (uint8_t*)calloc(n, 1);
    float* ma = (float*)calloc(blocks, sizeof(float));
    float* va = (float*)calloc(blocks, sizeof(float));
    Quant8TensorStates st = {mc, vc, ma, va};
    int bf16_only = mode == QUAD_FP32_BF16_ONLY || mode == QUAD_8BIT_BF16_ONLY;
    for (size_t i = 0; i < n; i++) {
        h[i] = powf(10.0f, -0.5f + uniform01(20, (uint32_t)i));  // curvature 0.32..3.2 (see doc/adamw8.md)
        target[i] = gaussian(21, (uint32_t)i);
    }
    for (int step = 0; step < QUAD_STEPS; step++) {
        float lr = 0.002f + 0.018f * 0.5f * (1.0f + cosf(3.14159265f * step / QUAD_STEPS));
        AdamWElementParams hp = adamw_element_params(lr, 0.9f, 0.95f, 1e-8f, 0.0f, step + 1);
        for (size_t i = 0; i < n; i++) {
            float wi = bf16_only ? bf16_bits_to_float(w_bf16[i]) : w[i];
            grads[i] = h[i] * (wi - target[i]) + 0.5f * gaussian(1000 + step, (uint32_t)i);
        }
        if (mode == QUAD_FP32) {
            for (size_t i = 0; i < n; i++) { w[i] = adamw_element_update(w[i], grads[i], &m[i], &v[i], hp); }
        } else if (mode == QUAD_8BIT_MASTER) {
            adamw8_update_fp32(w, grads, n, st, &g_maps, hp, 1.0f);
        } else {
            for (size_t i = 0; i < n; i++) { g_bf16[i] = float_to_bf16_bits(grads[i]); }
            if (mode == QUAD_FP32_BF16_ONLY) {  // what llmc/adamw.cuh does with no master
                adamw_update_bf16_ref(w_bf16, NULL, g_bf16, m, v, n, hp, 1.0f, (uint32_t)step, 0, NULL);
            } else {
                adamw8_update_bf16_ref(w_bf16, NULL, g_bf16, n, st, &g_maps, hp, 1.0f, (uint32_t)step, 0, NULL);
            }
        }
    }
    if (bf16_only) { for (size_t i = 0; i < n; i++) { w[i] = bf16_bits_to_float(w_bf16[i]); } }
    double loss = quad_loss(w, h, target);
    free(h); free(target); free(w); free(grads); free(w_bf16); free(g_bf16); free(m); free(v);
    free(mc); free(vc); free(ma); free(va);
    return loss;
}

static void test_quadratic(void) {
    double fp32 = quad_run(QUAD_FP32), eight = quad_run(QUAD_8BIT_MASTER);
    double fp32_bf16 = quad_run(QUAD_FP32_BF16_ONLY), eight_bf16 = quad_run(QUAD_8BIT_BF16_ONLY);
    printf("noisy quadratic, %d steps: loss fp32 AdamW %.6g | adamw8 %.6g (%+.3f%%) | bf16 weights only: AdamW %.6g, "
           "adamw8 %.6g (%+.3f%%)\n", QUAD_STEPS, fp32, eight, 100.0 * (eight / fp32 - 1.0), fp32_bf16, eight_bf16,
           100.0 * (eight_bf16 / fp32_bf16 - 1.0));
    CHECK(fp32 < 0.01, "noisy quadratic: fp32 AdamW did not converge (loss %.4g; the test problem is broken)", fp32);
    CHECK_CLOSE(eight, fp32, 0.0, 0.01, "noisy quadratic: adamw8 final loss vs fp32 AdamW");
    CHECK_CLOSE(eight_bf16, fp32_bf16, 0.0, 0.01, "noisy quadratic, bf16 weights only: adamw8 vs fp32-state AdamW");
}

// ----------------------------------------------------------------------------
// 500 steps of the tiny CPU GPT-2 (test/gpt2_ref.h) on a Markov chain: adamw8 vs fp32 AdamW

#define GPT_STEPS 500
#define GPT_B 2
#define GPT_T 16
#define GPT_V 64

// sequences of a fixed Markov chain: each token has 4 successors, one of them likely
static void markov_batch(int step, int* inputs, int* targets) {
    for (int b = 0; b < GPT_B; b++) {
        uint32_t row = (uint32_t)(step * GPT_B + b) * (GPT_T + 1);
        int token = (int)(random_u32(77, row) % GPT_V);
        for (int t = 0; t <= GPT_T; t++) {
            if (t < GPT_T) { inputs[b * GPT_T + t] = token; }
            if (t > 0) { targets[b * GPT_T + t - 1] = token; }
            uint32_t r = random_u32(78, row + (uint32_t)t + 1) % 10;
            int successor = r < 7 ? 0 : (int)(r - 6);  // 0 with probability 0.7, else 1..3
            token = (int)(random_u32(79, (uint32_t)(token * 4 + successor)) % GPT_V);
        }
    }
}

static GPT2Config tiny_config(void) { return gpt2_config_make(2, 2, 64, GPT_T, GPT_V); }

// mean training loss of the last 20 steps; selection < 0: fp32 AdamW (gpt2ref_adamw_update)
static double gpt_run(int selection, int steps, float* final_params) {
    GPT2Config cfg = tiny_config();
    size_t n = gpt2_num_parameters(&cfg);
    float* init = (float*)mallocCheck(n * sizeof(float));
    gpt2_init_params_random(init, &cfg, GPT2_INIT_SEED);
    GPT2Ref model;
    gpt2ref_init(&model, &cfg, init);
    free(init);
    Adamw8Layout layout;
    Adamw8States states;
    adamw8_layout_init(&layout, &cfg, selection < 0 ? ADAMW8_SELECT_NONE : (Adamw8Selection)selection);
    adamw8_states_alloc_host(&states, &layout);
    int inputs[GPT_B * GPT_T], targets[GPT_B * GPT_T];
    double tail_loss = 0.0;
    const float grad_clip = 1.0f;
    for (int step = 0; step < steps; step++) {
        markov_batch(step, inputs, targets);
        gpt2ref_zero_grad(&model);
        float loss = gpt2ref_forward(&model, inputs, targets, GPT_B, GPT_T);
        gpt2ref_backward(&model, 1);
        float lr = 3e-4f + 2.7e-3f * 0.5f * (1.0f + cosf(3.14159265f * step / steps));
        if (selection < 0) {
            gpt2ref_adamw_update(&model, lr, 0.9f, 0.95f, 1e-8f, 0.1f, step + 1, grad_clip);
        } else {
            float norm = gpt2ref_global_norm(&model);
            float grad_scale = norm > grad_clip ? grad_clip / norm : 1.0f;
            adamw8_model_update_fp32(&layout, &states, &g_maps, model.params, model.grads, lr, 0.9f, 0.95f, 1e-8f, 0.1f,
                                     step + 1, grad_scale);
        }
        if (step >= steps - 20) { tail_loss += loss / 20.0; }
    }
    if (final_params != NULL) { memcpy(final_params, model.params, n * sizeof(float)); }
    adamw8_states_free_host(&states);
    gpt2ref_free(&model);
    return tail_loss;
}

static void test_gpt2_training(void) {
    GPT2Config cfg = tiny_config();
    size_t n = gpt2_num_parameters(&cfg);
    // the 32-bit plumbing: selection "none" is plain AdamW, bit for bit
    float* plain = (float*)mallocCheck(n * sizeof(float));
    float* none = (float*)mallocCheck(n * sizeof(float));
    gpt_run(-1, 3, plain);
    gpt_run(ADAMW8_SELECT_NONE, 3, none);
    CHECK(memcmp(plain, none, n * sizeof(float)) == 0, "gpt2: adamw8 with no 8-bit tensor differs from AdamW");
    free(plain);
    free(none);

    // three independent runs: fp32 AdamW, adamw8 default selection, adamw8 on every tensor
    const int selections[3] = {-1, ADAMW8_SELECT_DEFAULT, ADAMW8_SELECT_ALL};
    double losses[3];
    #pragma omp parallel for schedule(dynamic, 1)
    for (int k = 0; k < 3; k++) { losses[k] = gpt_run(selections[k], GPT_STEPS, NULL); }
    double fp32 = losses[0], eight = losses[1], all = losses[2];
    printf("tiny GPT-2 (L=2 C=64 V=64), %d steps, mean loss of the last 20: fp32 AdamW %.5f | adamw8 %.5f (%+.3f%%) | "
           "adamw8 all tensors %.5f (%+.3f%%) | start %.3f\n", GPT_STEPS, fp32, eight, 100.0 * (eight / fp32 - 1.0), all,
           100.0 * (all / fp32 - 1.0), log((double)GPT_V));
    CHECK(fp32 < 0.6 * log((double)GPT_V), "gpt2: fp32 AdamW did not learn the chain (loss %.3f)", fp32);
    CHECK_CLOSE(eight, fp32, 0.0, 0.01, "gpt2: adamw8 final loss vs fp32 AdamW");
    CHECK_CLOSE(all, fp32, 0.0, 0.01, "gpt2: adamw8 (all tensors 8-bit) final loss vs fp32 AdamW");
}

// ----------------------------------------------------------------------------
// state files: sections round-trip, conversions

static void write_tiny_shard(const char* path) {
    int32_t header[256];
    memset(header, 0, sizeof(header));
    uint16_t tokens[512];
    for (int i = 0; i < 512; i++) { tokens[i] = (uint16_t)(random_u32(5, (uint32_t)i) % GPT_V); }
    header[0] = 20240520;
    header[1] = 1;
    header[2] = 512;
    FILE* fp = fopenCheck(path, "wb");
    fwriteCheck(header, sizeof(int32_t), 256, fp);
    fwriteCheck(tokens, sizeof(uint16_t), 512, fp);
    fcloseCheck(fp);
}

// fp32 moments shaped like training's: m ~ N(0, s^2), v ~ s^2 with s varying per element
static void fill_moments(float* m, float* v, size_t n, uint32_t seed) {
    for (size_t i = 0; i < n; i++) {
        float scale = 1e-3f * powf(10.0f, -2.0f * uniform01(seed, (uint32_t)i));
        m[i] = 0.3f * scale * gaussian(seed + 1, (uint32_t)i);
        v[i] = scale * scale * (0.5f + uniform01(seed + 2, (uint32_t)i));
    }
}

static int states_equal(const Adamw8Layout* layout, const Adamw8States* a, const Adamw8States* b) {
    return memcmp(a->m_codes, b->m_codes, layout->num_codes) == 0 && memcmp(a->v_codes, b->v_codes, layout->num_codes) == 0 &&
           memcmp(a->m_absmax, b->m_absmax, layout->num_blocks * sizeof(float)) == 0 &&
           memcmp(a->v_absmax, b->v_absmax, layout->num_blocks * sizeof(float)) == 0 &&
           memcmp(a->m32, b->m32, layout->num_fp32 * sizeof(float)) == 0 &&
           memcmp(a->v32, b->v32, layout->num_fp32 * sizeof(float)) == 0;
}

static void test_state_files(void) {
    char shard[512], path8[512], path32[512];
    snprintf(shard, sizeof(shard), "%s/tiny_train_000.bin", g_dir);
    snprintf(path8, sizeof(path8), "%s/state_adamw8.bin", g_dir);
    snprintf(path32, sizeof(path32), "%s/state_adamw.bin", g_dir);
    write_tiny_shard(shard);
    DataLoader loader;
    dataloader_init(&loader, shard, 1, 8, 0, 1, 0, GPT_V);
    GPT2Config cfg = tiny_config();
    Adamw8Layout layout;
    adamw8_layout_init(&layout, &cfg, ADAMW8_SELECT_DEFAULT);
    size_t n = layout.num_parameters;
    float* m = (float*)mallocCheck(n * sizeof(float));
    float* v = (float*)mallocCheck(n * sizeof(float));
    float* master = (float*)mallocCheck(n * sizeof(float));
    fill_moments(m, v, n, 30);
    for (size_t i = 0; i < n; i++) { master[i] = gaussian(33, (uint32_t)i); }
    Adamw8States states, back;
    adamw8_states_alloc_host(&states, &layout);
    adamw8_states_alloc_host(&back, &layout);
    adamw8_states_from_fp32(&layout, &g_maps, m, v, &states);

    // adamw8 state file: sections round-trip bit for bit
    StateSection sections[ADAMW8_NUM_SECTIONS], into[ADAMW8_NUM_SECTIONS];
    int32_t bits[NUM_PARAMETER_TENSORS], bits_back[NUM_PARAMETER_TENSORS];
    int num = adamw8_state_sections(sections, &layout, &states, bits);
    TrainState state = {42, 0, 0, 0, 0};
    StateBuffers buffers = {n, NULL, NULL, master, sections, num};
    state_file_write(path8, &state, &buffers, &loader);
    float* master_back = (float*)mallocCheck(n * sizeof(float));
    adamw8_state_sections(into, &layout, &back, bits_back);
    memset(bits_back, 0, sizeof(bits_back));
    StateBuffers into_buffers = {n, NULL, NULL, master_back, into, num};
    TrainState got;
    state_file_read(path8, &got, &into_buffers, &loader);
    adamw8_check_bits(&layout, bits_back, path8);
    CHECK(states_equal(&layout, &states, &back) && memcmp(master, master_back, n * sizeof(float)) == 0 && got.step == 42,
          "adamw8 states do not round-trip through the state file");
    CHECK(state_file_has_fp32_moments(path8) == 0, "an adamw8 state file claims fp32 moments");
    bits_back[PARAM_QKVW] = 32;
    CHECK_DIES("state: other 8-bit selection", "qkvw", adamw8_check_bits(&layout, bits_back, path8));
    Adamw8Layout all_layout;
    adamw8_layout_init(&all_layout, &cfg, ADAMW8_SELECT_ALL);
    Adamw8States all_states;
    adamw8_states_alloc_host(&all_states, &all_layout);
    StateSection all_sections[ADAMW8_NUM_SECTIONS];
    int32_t all_bits[NUM_PARAMETER_TENSORS];
    adamw8_state_sections(all_sections, &all_layout, &all_states, all_bits);
    StateBuffers all_buffers = {n, NULL, NULL, master_back, all_sections, num};
    CHECK_DIES("state: sizes of another selection", "adamw8.", state_file_read(path8, &got, &all_buffers, &loader));
    adamw8_states_free_host(&all_states);

    // converting: fp32 -> 8-bit is within the per-block bound, 32-bit tensors exact, and
    // quantizing the dequantized states gives the same states back
    float* m_back = (float*)mallocCheck(n * sizeof(float));
    float* v_back = (float*)mallocCheck(n * sizeof(float));
    adamw8_states_to_fp32(&layout, &g_maps, &states, m_back, v_back);
    double eps23 = ldexp(1.0, -23);
    double half_s = largest_gap(g_maps.signed_values) / 2.0, half_u = largest_gap(g_maps.unsigned_values) / 2.0;
    int within = 1, exact32 = 1;
    for (int t = 0; t < NUM_PARAMETER_TENSORS; t++) {
        size_t off = layout.param_offsets[t];
        for (size_t k = 0; k < layout.sizes[t]; k++) {
            if (layout.bits[t] == 32) { exact32 = exact32 && m_back[off + k] == m[off + k] && v_back[off + k] == v[off + k]; continue; }
            size_t b = layout.block_offsets[t] + k / 256;
            within = within && fabs((double)m_back[off + k] - m[off + k]) <= states.m_absmax[b] * (half_s + eps23) &&
                     fabs((double)v_back[off + k] - v[off + k]) <= states.v_absmax[b] * (half_u + eps23);
        }
    }
    CHECK(within, "fp32 -> adamw8 conversion error exceeds the per-block bound");
    CHECK(exact32, "fp32 -> adamw8 conversion changed the moments of a 32-bit tensor");
    Adamw8States again;
    adamw8_states_alloc_host(&again, &layout);
    adamw8_states_from_fp32(&layout, &g_maps, m_back, v_back, &again);
    CHECK(states_equal(&layout, &states, &again), "quantize(dequantize(states)) != states");

    // a plain AdamW (version 1) state file converts into adamw8, and an adamw8 file back to fp32
    StateBuffers fp32_buffers = {n, m, v, master, NULL, 0};
    state_file_write(path32, &state, &fp32_buffers, &loader);
    CHECK(state_file_has_fp32_moments(path32) == 1, "a plain AdamW state file does not report fp32 moments");
    float* m_read = (float*)mallocCheck(n * sizeof(float));
    float* v_read = (float*)mallocCheck(n * sizeof(float));
    StateBuffers fp32_into = {n, m_read, v_read, master_back, NULL, 0};
    state_file_read(path32, &got, &fp32_into, &loader);
    adamw8_states_from_fp32(&layout, &g_maps, m_read, v_read, &again);
    CHECK(states_equal(&layout, &states, &again), "a converted fp32 state file differs from quantizing its moments");
    state_file_read(path8, &got, &into_buffers, &loader);
    adamw8_states_to_fp32(&layout, &g_maps, &back, m_read, v_read);
    CHECK(memcmp(m_read, m_back, n * sizeof(float)) == 0 && memcmp(v_read, v_back, n * sizeof(float)) == 0,
          "an adamw8 state file does not dequantize to the states' fp32 values");
    m_read[5] = NAN;
    CHECK_DIES("conversion: NaN moment", "parameter 5", adamw8_states_from_fp32(&layout, &g_maps, m_read, v_read, &again));
    m_read[5] = 0.0f;
    v_read[9] = -1.0f;
    CHECK_DIES("conversion: negative v", "parameter 9", adamw8_states_from_fp32(&layout, &g_maps, m_read, v_read, &again));
    v_read[9] = 0.0f;  // v = 0 (a parameter no gradient has reached yet, e.g. an unused token's row) is a moment like any other
    CHECK_LIVES("conversion: v = 0", adamw8_states_from_fp32(&layout, &g_maps, m_read, v_read, &again));

    adamw8_states_free_host(&states);
    adamw8_states_free_host(&back);
    adamw8_states_free_host(&again);
    free(m); free(v); free(master); free(master_back); free(m_back); free(v_back); free(m_read); free(v_read);
    dataloader_free(&loader);
}

// ----------------------------------------------------------------------------
// which tensors are 8-bit, and the memory figure

static void test_selection(void) {
    GPT2Config d12 = gpt2_config_from_descriptor("d12");
    int default_ok = 1, all_ok = 1, none_ok = 1;
    for (int t = 0; t < NUM_PARAMETER_TENSORS; t++) {
        int matmul = t == PARAM_QKVW || t == PARAM_ATTPROJW || t == PARAM_FCW || t == PARAM_FCPROJW;
        default_ok = default_ok && adamw8_tensor_is_8bit(&d12, t, ADAMW8_SELECT_DEFAULT) == matmul;
        all_ok = all_ok && adamw8_tensor_is_8bit(&d12, t, ADAMW8_SELECT_ALL);
        none_ok = none_ok && !adamw8_tensor_is_8bit(&d12, t, ADAMW8_SELECT_NONE);
    }
    CHECK(default_ok, "d12 default: 8-bit states are not exactly the four matmul weights");
    CHECK(all_ok && none_ok, "selections all/none do not select all/none");
    GPT2Config small = gpt2_config_make(2, 2, 32, 64, 64);  // attproj per layer 32*32 = 1024 < 4096; fc 4096
    CHECK(!adamw8_tensor_is_8bit(&small, PARAM_ATTPROJW, ADAMW8_SELECT_DEFAULT) &&
          adamw8_tensor_is_8bit(&small, PARAM_FCW, ADAMW8_SELECT_DEFAULT),
          "the 4096-element threshold is not applied per layer");
    GPT2Config wide = gpt2_config_make(1, 1, 4096, 64, 64);  // lnfw has 4096 elements: 8-bit; wpe stays 32-bit
    CHECK(adamw8_tensor_is_8bit(&wide, PARAM_LNFW, ADAMW8_SELECT_DEFAULT) && !adamw8_tensor_is_8bit(&wide, PARAM_WPE, ADAMW8_SELECT_DEFAULT),
          "4096 elements or the embedding rule misapplied");
    GPT2Config wide2 = gpt2_config_make(2, 1, 4096, 64, 64);  // two layers: lnf's 4096 are one tensor, not 2048 a layer
    CHECK(adamw8_tensor_is_8bit(&wide2, PARAM_LNFW, ADAMW8_SELECT_DEFAULT) && adamw8_tensor_is_8bit(&wide2, PARAM_LNFB, ADAMW8_SELECT_DEFAULT),
          "L=2 C=4096: lnfw or lnfb (whole-model tensors of 4096) taken per layer");
    Adamw8Layout layout;
    adamw8_layout_init(&layout, &d12, ADAMW8_SELECT_ALL);
    int aligned = 1;
    for (int t = 0; t < NUM_PARAMETER_TENSORS; t++) { aligned = aligned && layout.code_offsets[t] % 256 == 0; }
    CHECK(aligned && layout.num_codes % 256 == 0 && layout.num_fp32 == 0, "8-bit tensors' codes do not start on a block");
    // d12's tensors are all whole blocks, so the check above holds without any padding: at C = 64 layernorm's
    // 2 x 64 elements are half a block, and the next tensor's codes must still start on a block
    GPT2Config odd = gpt2_config_make(2, 2, 64, 16, 64);
    Adamw8Layout odd_layout;
    adamw8_layout_init(&odd_layout, &odd, ADAMW8_SELECT_ALL);
    int odd_aligned = 1;
    for (int t = 0; t < NUM_PARAMETER_TENSORS; t++) {
        odd_aligned = odd_aligned && odd_layout.code_offsets[t] % 256 == 0 &&
                      odd_layout.block_offsets[t] * 256 == odd_layout.code_offsets[t];
    }
    CHECK(odd_aligned && odd_layout.num_codes == odd_layout.num_blocks * 256 && odd_layout.sizes[PARAM_LN1W] % 256 != 0,
          "C=64, all 8-bit: codes not padded to whole blocks (%zu codes, %zu blocks)", odd_layout.num_codes,
          odd_layout.num_blocks);
    CHECK(adamw8_selection_from_name("all", "-qs") == ADAMW8_SELECT_ALL, "selection name 'all'");
    CHECK_DIES("bad selection name", "'some'", adamw8_selection_from_name("some", "-qs"));
}

/*
Windows of the layout (adamw8_layout_window, a ZeRO rank's states) cut where tensors start, at C = 64: windows
that end on tensors of half a block (fcprojb's 2 x 64, lnfb's 64) must still take that tensor's padding codes and
its last, partial block's absmax, so consecutive windows' arrays tile the model's exactly. test_zero.c checks
the tiling on models whose tensors are all whole blocks, where a window that dropped the padding, or took
part_end / 256 blocks (the partial block's absmax, which the kernel writes, left out), passed.
*/
static void test_window_tiling(void) {
    GPT2Config cfg = gpt2_config_make(2, 2, 64, 16, 64);
    const Adamw8Selection selections[2] = {ADAMW8_SELECT_ALL, ADAMW8_SELECT_DEFAULT};
    for (int k = 0; k < 2; k++) {
        Adamw8Layout model;
        adamw8_layout_init(&model, &cfg, selections[k]);
        size_t cuts[4] = {0, model.param_offsets[PARAM_QKVW], model.param_offsets[PARAM_LNFW], model.num_parameters};
        size_t codes = 0, blocks = 0, fp32 = 0;
        int tiles = 1;
        for (int w = 0; w < 3; w++) {
            Adamw8Layout window;
            adamw8_layout_window(&window, &model, cuts[w], cuts[w + 1]);
            tiles = tiles && (window.num_codes == 0 || window.codes_begin == codes) &&
                    (window.num_blocks == 0 || window.blocks_begin == blocks) && (window.num_fp32 == 0 || window.fp32_begin == fp32);
            codes += window.num_codes;
            blocks += window.num_blocks;
            fp32 += window.num_fp32;
        }
        CHECK(tiles && codes == model.num_codes && blocks == model.num_blocks && fp32 == model.num_fp32,
              "C=64 selection %d: windows cover %zu codes, %zu blocks, %zu fp32 of %zu, %zu, %zu (or leave gaps)", (int)selections[k],
              codes, blocks, fp32, model.num_codes, model.num_blocks, model.num_fp32);
    }
}

static void test_bytes_per_param(void) {
    const char* names[2] = {"d12", "d48"};
    for (int k = 0; k < 2; k++) {
        GPT2Config cfg = gpt2_config_from_descriptor(names[k]);
        Adamw8Layout layout, plain;
        adamw8_layout_init(&layout, &cfg, ADAMW8_SELECT_DEFAULT);
        adamw8_layout_init(&plain, &cfg, ADAMW8_SELECT_NONE);
        Adamw8BytesPerParam with = adamw8_bytes_per_param(&layout, 1), without = adamw8_bytes_per_param(&layout, 0);
        Adamw8BytesPerParam base = adamw8_bytes_per_param(&plain, 1), base_no_master = adamw8_bytes_per_param(&plain, 0);
        CHECK(with.eight_bit == 10.03125 && without.eight_bit == 6.03125,
              "%s: 8-bit tensors take %.6f / %.6f bytes per parameter, DESIGN says 10.03 / 6.03", names[k], with.eight_bit,
              without.eight_bit);
        CHECK(base.model == 16.0 && base_no_master.model == 12.0, "%s: fp32 AdamW takes %.4f / %.4f bytes per parameter",
              names[k], base.model, base_no_master.model);
        CHECK(base.eight_bit == 0.0 && base.eight_bit_params == 0, "%s: no 8-bit tensors, yet %zu 8-bit parameters taking "
              "%.4f bytes each (expected 0 and 0)", names[k], base.eight_bit_params, base.eight_bit);
        size_t n = layout.num_parameters, n8 = with.eight_bit_params;
        double expected = (n8 * 10.03125 + (double)(n - n8) * 16.0) / n;
        CHECK_CLOSE(with.model, expected, 0.0, 1e-12, "model-wide bytes per parameter");
        printf("%s: %zu parameters, %zu (%.1f%%) with 8-bit states | bytes/param: 8-bit tensors %.5f (%.5f no master), "
               "model-wide %.3f (%.3f no master), fp32 AdamW %.0f (%.0f)\n", names[k], n, n8, 100.0 * n8 / n, with.eight_bit,
               without.eight_bit, with.model, without.model, base.model, base_no_master.model);
    }
}

int main(void) {
    quant8_maps_init(&g_maps);
    test_make_temp_dir(g_dir, sizeof(g_dir));
    test_maps();
    test_bucket_encode();
    test_divisor_quotient();
    test_quantize_error();
    test_zero_block();
    test_one_step();
    test_non_finite();
    test_non_finite_bf16();
    test_delayed_weight_codes(0);
    test_delayed_weight_codes(1);
    test_selection();
    test_window_tiling();
    test_bytes_per_param();
    test_state_files();
    test_quadratic();
    test_gpt2_training();
    test_remove_dir(g_dir);
    CHECK(llm8_open_file_count() == 0, "%d files opened by fopenCheck are not closed by fcloseCheck", llm8_open_file_count());
    return test_summary("test_adamw8");
}
