/*
test_fp8_codec.cpp: llmc/fp8.h's software E4M3/E5M2 codec against cuda_fp8.h, whose host
implementation of __nv_cvt_float_to_fp8 / __nv_cvt_fp8_to_halfraw defines what the GPU's
cvt instructions do. C++ because cuda_fp8.h is; built with g++ and CUDA's include path,
no GPU needed:
    g++ -std=c++17 -O2 -Wall -I. -I/usr/local/cuda/include test/test_fp8_codec.cpp -o build/test_fp8_codec

What is covered:
- the pair encode (fp8_quantize2): two encodes, in __nv_cvt_float2_to_fp8x2's byte order;
- decode: all 256 codes of each format, against __nv_cvt_fp8_to_halfraw (widened to float)
  bit for bit (NaN codes: both NaN);
- the optimizer's weight element (fp8_weight_element): the value a weight's FP8 cast reads
  and its code, the encode of value * scale, over every bf16 pattern and Gaussian masters
  under several scales, saturation included;
- encode with SATFINITE: every float32 bit pattern within 2 ulps of every code's value and
  of every midpoint between neighbouring codes (where rounding decides), both signs; the
  neighbourhoods of 0, the float denormals, max, the overflow bound, FLT_MAX, Inf and NaN;
  a stride through all 2^32 bit patterns; and a few million random floats (uniform bits,
  and Gaussians at scales that hit the FP8 range).
Each sweep counts as one check (so make test's total stays readable); the first mismatches are printed.
*/
#include <cuda_fp8.h>
#include <stdint.h>
#include <string.h>
#include <float.h>
#include "test/test_harness.h"
#include "llmc/fp8.h"
#include "llmc/fp8_scaling.h"
#include "llmc/rand.h"

static const Fp8Format FORMATS[2] = {FP8_E4M3, FP8_E5M2};

static __nv_fp8_interpretation_t cuda_interpretation(Fp8Format format) {
    return format == FP8_E4M3 ? __NV_E4M3 : __NV_E5M2;
}

static float half_bits_to_float(uint16_t h) {
    __half_raw raw;
    raw.x = h;
    return __half2float(__half(raw));
}

static int g_encode_mismatches_printed = 0;
static long long g_encode_checks = 0;
static long long g_encode_failures = 0;

// one float against cuda_fp8.h; only the first mismatches are printed (there are millions)
static void check_encode(float x, Fp8Format format) {
    uint8_t expected = (uint8_t)__nv_cvt_float_to_fp8(x, __NV_SATFINITE, cuda_interpretation(format));
    uint8_t got = fp8_encode(x, format);
    g_encode_checks++;
    if (got != expected) {
        g_encode_failures++;
        if (g_encode_mismatches_printed++ < 10) {
            printf("encode mismatch %s: x=%.9g (bits 0x%08x): got 0x%02x, cuda_fp8.h 0x%02x\n", fp8_format_name(format),
                   (double)x, float_as_bits(x), got, expected);
        }
    }
}

// every bit pattern within `radius` ulps of x, both signs
// one harness check per sweep: it passes when the sweep added no mismatch
static void check_sweep(const char* sweep, long long failures_before, long long checks_before) {
    long long mismatches = g_encode_failures - failures_before;
    CHECK(mismatches == 0, "encode sweep '%s': %lld of %lld floats differ from cuda_fp8.h", sweep, mismatches,
          g_encode_checks - checks_before);
}

static void check_encode_around(float x, Fp8Format format, int radius) {
    uint32_t center = float_as_bits(fabsf(x));
    for (int d = -radius; d <= radius; d++) {
        int64_t b = (int64_t)center + d;
        if (b < 0 || b > 0x7fffffffLL) { continue; }
        check_encode(bits_as_float((uint32_t)b), format);
        check_encode(bits_as_float((uint32_t)b | 0x80000000u), format);
    }
}

static void test_decode_all_codes(void) {
    for (int f = 0; f < 2; f++) {
        Fp8Format format = FORMATS[f];
        int bad = 0;
        for (int code = 0; code < 256; code++) {
            __half_raw h = __nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)code, cuda_interpretation(format));
            float expected = half_bits_to_float(h.x);
            float got = fp8_decode((uint8_t)code, format);
            int same = isnan(expected) ? isnan(got) : float_as_bits(got) == float_as_bits(expected);
            if (!same) { bad++; }
            CHECK(same, "decode %s code 0x%02x: got %.9g, cuda_fp8.h %.9g", fp8_format_name(format), code,
                  (double)got, (double)expected);
        }
        printf("decode %s: all 256 codes checked, %d mismatches\n", fp8_format_name(format), bad);
    }
    // the facts the rest of the code relies on
    CHECK(fp8_decode(0x7e, FP8_E4M3) == FP8_E4M3_MAX, "E4M3 0x7e is not 448");
    CHECK(fp8_decode(0x7b, FP8_E5M2) == FP8_E5M2_MAX, "E5M2 0x7b is not 57344");
    CHECK(isinf(fp8_decode(0x7c, FP8_E5M2)) && isinf(fp8_decode(0xfc, FP8_E5M2)), "E5M2 0x7c/0xfc are not +-Inf");
    CHECK(isnan(fp8_decode(0x7f, FP8_E4M3)) && isnan(fp8_decode(0xff, FP8_E4M3)), "E4M3 0x7f/0xff are not NaN");
    CHECK(fp8_decode(0x01, FP8_E4M3) == ldexpf(1.0f, -9), "E4M3 smallest subnormal is not 2^-9");
    CHECK(fp8_decode(0x01, FP8_E5M2) == ldexpf(1.0f, -16), "E5M2 smallest subnormal is not 2^-16");
}

static void test_encode_boundaries(void) {
    for (int f = 0; f < 2; f++) {
        Fp8Format format = FORMATS[f];
        long long failures_before = g_encode_failures, checks_before = g_encode_checks;
        // every finite nonnegative code value, and every midpoint to the next one
        float previous = -1.0f;
        for (int code = 0; code < 0x80; code++) {
            float value = fp8_decode((uint8_t)code, format);
            if (!isfinite(value)) { break; }
            check_encode_around(value, format, 2);
            if (previous >= 0.0f) { check_encode_around(0.5f * (previous + value), format, 2); }
            previous = value;
        }
        float max = fp8_max(format);
        float half_ulp_of_max = format == FP8_E4M3 ? 16.0f : 4096.0f;
        check_encode_around(max + half_ulp_of_max, format, 4);  // the overflow bound
        check_encode_around(max + 2.0f * half_ulp_of_max, format, 4);  // the next code up, if there were one
        check_encode_around(2.0f * max, format, 2);
        check_encode_around(1e30f, format, 2);
        check_encode_around(FLT_MAX, format, 4);
        check_encode(INFINITY, format);
        check_encode(-INFINITY, format);
        check_encode(NAN, format);
        check_encode(-NAN, format);
        check_encode(bits_as_float(0x7f800001u), format);  // signalling NaN
        check_encode(bits_as_float(0xffc12345u), format);
        check_encode_around(0.0f, format, 64);               // zeros and the smallest float denormals
        check_encode_around(FLT_MIN, format, 4);              // smallest normal float
        check_encode_around(bits_as_float(0x00400000u), format, 4);  // a mid-range float denormal
        // a dense sweep through the low binades where FP8 subnormals live
        float smallest = fp8_decode(0x01, format);
        for (float v = smallest / 8.0f; v < 4.0f * smallest; v = nextafterf(v, INFINITY)) { check_encode(v, format); }
        check_sweep(format == FP8_E4M3 ? "e4m3 code boundaries" : "e5m2 code boundaries", failures_before, checks_before);
    }
}

// structural facts of SATFINITE the design relies on, stated explicitly
static void test_encode_saturation_facts(void) {
    CHECK(fp8_encode(1e6f, FP8_E4M3) == 0x7e && fp8_encode(-1e6f, FP8_E4M3) == 0xfe, "E4M3 does not saturate to +-448");
    CHECK(fp8_encode(1e6f, FP8_E5M2) == 0x7b && fp8_encode(-1e6f, FP8_E5M2) == 0xfb, "E5M2 does not saturate to +-57344");
    CHECK(fp8_encode(INFINITY, FP8_E5M2) == 0x7b && fp8_encode(-INFINITY, FP8_E5M2) == 0xfb, "E5M2 Inf is not saturated");
    CHECK(fp8_encode(INFINITY, FP8_E4M3) == 0x7e, "E4M3 Inf is not saturated");
    CHECK(fp8_encode(-NAN, FP8_E4M3) == FP8_CODE_NAN && fp8_encode(NAN, FP8_E5M2) == FP8_CODE_NAN, "NaN is not 0x7f");
    CHECK(fp8_encode(-0.0f, FP8_E4M3) == 0x80, "-0 does not keep its sign");
    CHECK(fp8_encode(464.0f, FP8_E4M3) == 0x7e, "464 (tie) does not round to the even 448");
}

static void test_encode_stride_and_random(void) {
    // a stride through every bit pattern (prime stride: all residues of the low bits get visited)
    const uint32_t stride = 257;
    long long failures_before = g_encode_failures, checks_before = g_encode_checks;
    for (int f = 0; f < 2; f++) {
        for (uint64_t b = 0; b <= 0xffffffffull; b += stride) { check_encode(bits_as_float((uint32_t)b), FORMATS[f]); }
    }
    check_sweep("stride 257 through all bit patterns", failures_before, checks_before);
    failures_before = g_encode_failures;
    checks_before = g_encode_checks;
    mt19937_state rng;
    manual_seed(&rng, 1234);
    for (int i = 0; i < 2000000; i++) {
        float uniform_bits = bits_as_float(randint32(&rng));
        check_encode(uniform_bits, FP8_E4M3);
        check_encode(uniform_bits, FP8_E5M2);
    }
    check_sweep("random bit patterns", failures_before, checks_before);
    failures_before = g_encode_failures;
    checks_before = g_encode_checks;
    // Gaussians at scales that cover the whole FP8 range, subnormals and saturation included
    const float scales[] = {1e-6f, 1e-3f, 1.0f, 100.0f, 3e4f, 1e5f};
    static float normals[200000];
    for (size_t s = 0; s < sizeof(scales) / sizeof(scales[0]); s++) {
        normal_(normals, 200000, 0.0f, scales[s], &rng);
        for (int i = 0; i < 200000; i++) {
            check_encode(normals[i], FP8_E4M3);
            check_encode(normals[i], FP8_E5M2);
        }
    }
    check_sweep("Gaussians at 6 scales", failures_before, checks_before);
}

// decode(encode(v)) == v for every representable v, and the scaled pair round-trips exactly
// with power-of-two scales
static void test_roundtrip_and_scaled(void) {
    for (int f = 0; f < 2; f++) {
        Fp8Format format = FORMATS[f];
        int bad = 0;
        for (int code = 0; code < 256; code++) {
            float value = fp8_decode((uint8_t)code, format);
            if (!isfinite(value)) { continue; }
            if (fp8_encode(value, format) != code) { bad++; }
            for (int e = -8; e <= 8; e += 4) {
                float scale = ldexpf(1.0f, e);
                float x = value / scale;
                if (fp8_dequantize(fp8_quantize(x, scale, format), 1.0f / scale, format) != x) { bad++; }
            }
        }
        CHECK(bad == 0, "%s: %d codes do not round-trip (plain or with power-of-two scales)", fp8_format_name(format), bad);
    }
}

// fp8_quantize2 (the cast kernels' pair encode): two fp8_quantize codes, x0's in the low byte,
// as cuda_fp8.h's __nv_cvt_float2_to_fp8x2 packs them (.x low), on random pairs at several scales
static void test_quantize_pairs(void) {
    mt19937_state rng;
    manual_seed(&rng, 4242);
    for (int f = 0; f < 2; f++) {
        Fp8Format format = FORMATS[f];
        long long bad = 0;
        for (int i = 0; i < 200000; i++) {
            float x0 = ldexpf(randfloat32(&rng) - 0.5f, (int)(randint32(&rng) % 40) - 20);
            float x1 = ldexpf(randfloat32(&rng) - 0.5f, (int)(randint32(&rng) % 40) - 20);
            float scale = ldexpf(1.0f, (int)(randint32(&rng) % 16) - 4);
            uint16_t pair = fp8_quantize2(x0, x1, scale, format);
            uint16_t separate = (uint16_t)(fp8_quantize(x0, scale, format) | (fp8_quantize(x1, scale, format) << 8));
            uint16_t cuda = (uint16_t)__nv_cvt_float2_to_fp8x2(make_float2(x0 * scale, x1 * scale), __NV_SATFINITE,
                                                               cuda_interpretation(format));
            bad += pair != separate || pair != cuda;
        }
        CHECK(bad == 0, "%s: %lld of 200000 pairs differ from two encodes or from __nv_cvt_float2_to_fp8x2",
              fp8_format_name(format), bad);
    }
}

static void test_classify(void) {
    CHECK(fp8_classify(464.0f, 1.0f, fp8_encode(464.0f, FP8_E4M3), FP8_E4M3) == FP8_ELEMENT_REPRESENTED,
          "E4M3 464 (rounds to max) counted as saturated");
    CHECK(fp8_classify(464.0001f, 1.0f, fp8_encode(464.0001f, FP8_E4M3), FP8_E4M3) == FP8_ELEMENT_SATURATED,
          "E4M3 just above 464 not counted as saturated");
    CHECK(fp8_classify(100.0f, 5.0f, fp8_encode(500.0f, FP8_E4M3), FP8_E4M3) == FP8_ELEMENT_SATURATED,
          "x*scale beyond max not counted as saturated");
    CHECK(fp8_classify(61439.0f, 1.0f, fp8_encode(61439.0f, FP8_E5M2), FP8_E5M2) == FP8_ELEMENT_REPRESENTED,
          "E5M2 61439 (rounds to max) counted as saturated");
    CHECK(fp8_classify(61440.0f, 1.0f, fp8_encode(61440.0f, FP8_E5M2), FP8_E5M2) == FP8_ELEMENT_SATURATED,
          "E5M2 61440 (tie to Inf) not counted as saturated");
    CHECK(fp8_classify(-INFINITY, 1.0f, fp8_encode(-INFINITY, FP8_E5M2), FP8_E5M2) == FP8_ELEMENT_SATURATED,
          "-Inf not counted as saturated");
    float tiny = 1e-4f;  // * 1 is below half of E4M3's 2^-9 = 0.00195
    CHECK(fp8_classify(tiny, 1.0f, fp8_encode(tiny, FP8_E4M3), FP8_E4M3) == FP8_ELEMENT_FLUSHED, "underflow not flagged");
    CHECK(fp8_classify(-tiny, 1.0f, fp8_encode(-tiny, FP8_E4M3), FP8_E4M3) == FP8_ELEMENT_FLUSHED, "-underflow not flagged");
    CHECK(fp8_classify(0.0f, 1.0f, fp8_encode(0.0f, FP8_E4M3), FP8_E4M3) == FP8_ELEMENT_REPRESENTED, "zero flagged as flushed");
    CHECK(fp8_classify(NAN, 1.0f, fp8_encode(NAN, FP8_E4M3), FP8_E4M3) == FP8_ELEMENT_REPRESENTED, "NaN flagged");
    // whether a set of amax `amax` may saturate: exactly when the amax does; a NaN amax always may
    CHECK(fp8_may_saturate(NAN, 1.0f, FP8_E4M3) && fp8_may_saturate(465.0f, 1.0f, FP8_E4M3) && !fp8_may_saturate(464.0f, 1.0f, FP8_E4M3),
          "fp8_may_saturate: NaN, 465 must say yes and 464 no (E4M3)");
    CHECK(strcmp(fp8_format_name(FP8_E4M3), "e4m3") == 0 && strcmp(fp8_format_name(FP8_E5M2), "e5m2") == 0,
          "fp8_format_name: %s, %s", fp8_format_name(FP8_E4M3), fp8_format_name(FP8_E5M2));
    CHECK(fp8_amax_bits(NAN) > fp8_amax_bits(INFINITY) && fp8_amax_bits(-INFINITY) > fp8_amax_bits(FLT_MAX) &&
          fp8_amax_bits(-2.0f) > fp8_amax_bits(1.5f), "amax bits do not order NaN > Inf > finite magnitudes");
}

/*
The optimizer's weight element (fp8_weight_element): the value is the written weight (the
master when there is one, else the bf16 weight) and the code is cuda_fp8.h's SATFINITE E4M3
encode of value * scale. Every bf16 bit pattern (the no-master case, exhaustively) and a
million Gaussian masters at magnitudes around the scale's range, under scales from amaxes
at and below the values' (delayed: the previous step's amax), so a share saturate.
*/
static void test_weight_element(void) {
    const float amaxes[] = {1e-3f, 0.02f, 0.05f, 1.0f, 3.0f, 448.0f, 1e4f};
    const int margins[] = {0, 0, 1, 0, 2, 0, 0};
    long long checks = 0, failures = 0, saturated = 0;
    for (size_t a = 0; a < sizeof(amaxes) / sizeof(amaxes[0]); a++) {
        float scale = fp8_scale_from_amax(amaxes[a], FP8_E4M3_MAX, margins[a]);
        for (uint32_t bits = 0; bits < 65536u; bits++) {  // no master: the bf16 weight is what the cast reads
            float weight = bf16_bits_to_float((uint16_t)bits);
            Fp8WeightElement e = fp8_weight_element(0, 12345.0f, (uint16_t)bits, scale);
            uint8_t expected = (uint8_t)__nv_cvt_float_to_fp8(weight * scale, __NV_SATFINITE, __NV_E4M3);
            int same_value = float_as_bits(e.value) == float_as_bits(weight) || (isnan(e.value) && isnan(weight));
            failures += !same_value || e.code != expected;
            saturated += isfinite(weight) && fp8_classify(weight, scale, e.code, FP8_E4M3) == FP8_ELEMENT_SATURATED;
            checks++;
        }
        mt19937_state rng;
        manual_seed(&rng, 77 + (unsigned int)a);
        for (int i = 0; i < 1000000; i++) {  // with a master: the fp32 value, whatever the bf16 weight holds
            float master = amaxes[a] * 1.5f * sqrtf(-2.0f * logf(randfloat32(&rng) + 1e-30f)) * cosf(6.2831853f * randfloat32(&rng));
            Fp8WeightElement e = fp8_weight_element(1, master, 0x7fc0u, scale);
            uint8_t expected = (uint8_t)__nv_cvt_float_to_fp8(master * scale, __NV_SATFINITE, __NV_E4M3);
            failures += float_as_bits(e.value) != float_as_bits(master) || e.code != expected;
            saturated += fp8_classify(master, scale, e.code, FP8_E4M3) == FP8_ELEMENT_SATURATED;
            checks++;
        }
    }
    printf("weight element: %lld values x scales, %lld saturated, %lld mismatches\n", checks, saturated, failures);
    CHECK(failures == 0, "fp8_weight_element: %lld of %lld (value, code) differ from the written value and cuda_fp8.h's encode",
          failures, checks);
    CHECK(saturated > checks / 100, "fp8_weight_element: only %lld of %lld saturated: the sweep misses saturation", saturated,
          checks);

    // the host references' accumulation (Fp8WeightRef): amax over |value|, codes at the call's indices
    float amax = 0.25f;
    uint8_t codes[3] = {0, 0, 0};
    Fp8WeightRef ref = {&amax, codes, fp8_scale_from_amax(1.0f, FP8_E4M3_MAX, 0)};
    fp8_weight_ref_add(&ref, 1, 1, -0.75f, 0);
    fp8_weight_ref_add(&ref, 2, 0, 99.0f, float_to_bf16_bits(0.5f));
    CHECK(amax == 0.75f && codes[0] == 0 && codes[1] == fp8_encode(-0.75f * 448.0f, FP8_E4M3) &&
          codes[2] == fp8_encode(0.5f * 448.0f, FP8_E4M3), "fp8_weight_ref_add: amax %g, codes %02x %02x %02x", amax,
          codes[0], codes[1], codes[2]);
    fp8_weight_ref_add(NULL, 0, 1, 1.0f, 0);  // a weight that is not FP8: nothing to write
}

int main(void) {
    test_weight_element();
    test_decode_all_codes();
    test_encode_boundaries();
    test_encode_saturation_facts();
    test_encode_stride_and_random();
    test_roundtrip_and_scaled();
    test_quantize_pairs();
    test_classify();
    printf("encode: %lld floats checked against __nv_cvt_float_to_fp8 (SATFINITE), %lld mismatches\n",
           g_encode_checks, g_encode_failures);
    return test_summary("test_fp8_codec");
}
