/*
fp8.h: the two FP8 formats (E4M3 and E5M2) as raw uint8_t codes: encode with round to
nearest even and SATFINITE saturation, decode, scaled quantize/dequantize, the per-element
classification (saturated, flushed to zero) behind the numerics log, and the FP8 side of a
weight element an optimizer step writes (the value its cast reads, and its code).

Why it is shaped so:
- One definition of FP8 for the GPU kernels and the CPU reference (DESIGN.md section 6):
  every function is LLMC_HD, takes and returns plain float / uint8_t, and needs no CUDA
  type on the host, so the CPU tests exercise the very code the kernels run.
- On the device, encode is the hardware conversion (cvt.rn.satfinite via cuda_fp8.h's
  __nv_cvt_float_to_fp8): it is what the cast kernels must use for speed, and it defines
  the semantics. On the host, encode is an integer-only software implementation (no float
  rounding modes, no double rounding); test/test_fp8_codec.cpp proves it equals
  cuda_fp8.h's __nv_cvt_float_to_fp8(x, __NV_SATFINITE, ...) exhaustively around every
  code boundary and on millions of random floats.
- The scale convention is the one cuBLASLt wants and is fixed here once:
      code        = encode(x * scale)          scale multiplies INTO the FP8 range
      dequantized = decode(code) * scale_inv   scale_inv = 1 / scale
  cuBLASLt's A/B scale pointers dequantize, so they receive scale_inv.
  x * scale is one fp32 multiply (correctly rounded; no FMA can form), so host and device
  agree bit for bit.

SATFINITE, exactly as __nv_cvt_float_to_fp8 does it (checked by the codec test):
- finite |x| beyond the format's max rounds to +-max; +-Inf also becomes +-max (E5M2 too,
  although E5M2 has an Inf code: SATFINITE never produces it);
- NaN becomes the canonical NaN 0x7f in both formats (the sign of a NaN is dropped);
- -0 and negative values that round to zero keep their sign: 0x80.
Decode: E4M3 has no Inf, NaN is 0x7f/0xff; E5M2 Inf is 0x7c/0xfc, NaN 0x7d-0x7f/0xfd-0xff.
*/
#ifndef LLMC_FP8_H
#define LLMC_FP8_H

#include <stdint.h>
#include <stddef.h>
#include <math.h>
#include "element_math.h"
#ifdef __CUDACC__
#include <cuda_fp8.h>
#endif

typedef enum { FP8_E4M3 = 0, FP8_E5M2 = 1 } Fp8Format;

#define FP8_E4M3_MAX 448.0f
#define FP8_E5M2_MAX 57344.0f
#define FP8_CODE_NAN 0x7f  // what encode returns for a NaN, in both formats

// the largest finite value of the format
LLMC_HD float fp8_max(Fp8Format format) {
    return format == FP8_E4M3 ? FP8_E4M3_MAX : FP8_E5M2_MAX;
}

LLMC_HD const char* fp8_format_name(Fp8Format format) {
    return format == FP8_E4M3 ? "e4m3" : "e5m2";
}

/*
Software encode. With M mantissa bits and exponent bias E, an FP8 code without its sign,
read as an integer, is value / 2^(1-E-M) for subnormals and ((e8-1) << M) + significand
for normals (significand with its implicit bit, in [2^M, 2^(M+1))). So one formula covers
both: shift the float's 24-bit significand right by s bits with round to nearest even,
where s grows by one per binade below the smallest normal, and add the exponent base.
A carry out of the significand lands in the exponent by plain integer addition.
*/
LLMC_HD uint8_t fp8_encode_software(float x, Fp8Format format) {
    const int mantissa_bits = format == FP8_E4M3 ? 3 : 2;
    const int exponent_bias = format == FP8_E4M3 ? 7 : 15;
    const uint32_t max_code = format == FP8_E4M3 ? 0x7eu : 0x7bu;
    uint32_t bits = float_as_bits(x);
    uint32_t sign = (bits >> 24) & 0x80u;
    uint32_t magnitude = bits & 0x7fffffffu;
    if (magnitude > 0x7f800000u) { return FP8_CODE_NAN; }
    if (magnitude >= 0x7f800000u) { return (uint8_t)(sign | max_code); }  // Inf saturates
    int float_exponent = (int)(magnitude >> 23);
    uint32_t significand = (magnitude & 0x7fffffu) | (float_exponent != 0 ? 0x800000u : 0u);
    int unbiased = (float_exponent != 0 ? float_exponent : 1) - 127;
    int binades_below_normal = (1 - exponent_bias) - unbiased;
    int shift = 23 - mantissa_bits + (binades_below_normal > 0 ? binades_below_normal : 0);
    shift = shift < 25 ? shift : 25;  // below half the smallest subnormal: nothing kept, and dropped < half
    uint32_t base = binades_below_normal < 0 ? (uint32_t)(unbiased + exponent_bias - 1) << mantissa_bits : 0u;
    uint32_t kept = significand >> shift;
    uint32_t dropped = significand & ((1u << shift) - 1u);
    uint32_t half = 1u << (shift - 1);
    // round to nearest, ties to even, without a branch: the CPU reference encodes every element
    // of every FP8 tensor here, and a branch on the dropped bits mispredicts about half the time
    kept += (uint32_t)(dropped > half) | ((uint32_t)(dropped == half) & kept);
    uint32_t code = base + kept;
    code = code < max_code ? code : max_code;
    return (uint8_t)(sign | code);
}

// encode with round to nearest even and SATFINITE: the hardware conversion on the device
LLMC_HD uint8_t fp8_encode(float x, Fp8Format format) {
#ifdef __CUDA_ARCH__
    return (uint8_t)__nv_cvt_float_to_fp8(x, __NV_SATFINITE, format == FP8_E4M3 ? __NV_E4M3 : __NV_E5M2);
#else
    return fp8_encode_software(x, format);
#endif
}

// exact: every FP8 value is a float. NaN codes give a quiet NaN, E5M2's Inf codes give Inf.
LLMC_HD float fp8_decode(uint8_t code, Fp8Format format) {
    const int mantissa_bits = format == FP8_E4M3 ? 3 : 2;
    const int exponent_bias = format == FP8_E4M3 ? 7 : 15;
    uint32_t sign = (uint32_t)(code & 0x80u) << 24;
    uint32_t magnitude = code & 0x7fu;
    uint32_t exponent = magnitude >> mantissa_bits;
    uint32_t mantissa = magnitude & ((1u << mantissa_bits) - 1u);
    if (format == FP8_E4M3 && magnitude == 0x7fu) { return bits_as_float(0x7fc00000u); }
    if (format == FP8_E5M2 && exponent == 31u) {
        return bits_as_float(mantissa == 0 ? (sign | 0x7f800000u) : 0x7fc00000u);
    }
    if (exponent == 0) {
        // subnormal: mantissa * 2^(1 - bias - M); a small integer times a power of two, exact
        float smallest_subnormal = bits_as_float((uint32_t)(127 + 1 - exponent_bias - mantissa_bits) << 23);
        return bits_as_float(sign | float_as_bits((float)mantissa * smallest_subnormal));
    }
    uint32_t float_exponent = exponent - (uint32_t)exponent_bias + 127u;
    return bits_as_float(sign | (float_exponent << 23) | (mantissa << (23 - mantissa_bits)));
}

// code = encode(x * scale)
LLMC_HD uint8_t fp8_quantize(float x, float scale, Fp8Format format) {
    return fp8_encode(x * scale, format);
}

// two neighbouring codes, encode(x0 * scale) in the low byte and encode(x1 * scale) in the
// high one: on the device one conversion instruction for both (fp8_encode issues that same
// pair instruction, cvt.rn.satfinite.e4m3x2 / e5m2x2, and keeps one half), on the host two
// fp8_quantize calls; test_fp8_codec checks the byte order against cuda_fp8.h's
LLMC_HD uint16_t fp8_quantize2(float x0, float x1, float scale, Fp8Format format) {
#ifdef __CUDA_ARCH__
    return (uint16_t)__nv_cvt_float2_to_fp8x2(make_float2(x0 * scale, x1 * scale), __NV_SATFINITE,
                                              format == FP8_E4M3 ? __NV_E4M3 : __NV_E5M2);
#else
    return (uint16_t)(fp8_quantize(x0, scale, format) | (fp8_quantize(x1, scale, format) << 8));
#endif
}

// decode(code) * scale_inv, scale_inv = 1 / scale
LLMC_HD float fp8_dequantize(uint8_t code, float scale_inv, Fp8Format format) {
    return fp8_decode(code, format) * scale_inv;
}

/*
What the cast did to one element, for the numerics log:
- SATURATED: the SATFINITE clamp changed the result, i.e. x*scale lies beyond where round
  to nearest would still give +-max (E4M3: |x*scale| > 464, since 464 ties to the even 448;
  E5M2: |x*scale| >= 61440, since that tie goes to the even 2^16, which is Inf). Inf counts.
  The band between max and that bound is ordinary rounding, not saturation: with current
  scaling the amax element itself lands on 448 * (1 +- 2^-24), and it must not count.
- FLUSHED: x was a nonzero number but its code decodes to zero (underflow).
A NaN is neither (it stays NaN and the loss guard catches it).
*/
typedef enum { FP8_ELEMENT_REPRESENTED = 0, FP8_ELEMENT_SATURATED = 1, FP8_ELEMENT_FLUSHED = 2 } Fp8ElementStatus;

LLMC_HD int fp8_saturates(float x, float scale, Fp8Format format) {
    float scaled = fabsf(x * scale);
    return format == FP8_E4M3 ? scaled > 464.0f : scaled >= 61440.0f;
}

LLMC_HD int fp8_flushed(float x, uint8_t code) { return x != 0.0f && (code & 0x7fu) == 0u; }

LLMC_HD Fp8ElementStatus fp8_classify(float x, float scale, uint8_t code, Fp8Format format) {
    if (fp8_saturates(x, scale, format)) { return FP8_ELEMENT_SATURATED; }
    if (fp8_flushed(x, code)) { return FP8_ELEMENT_FLUSHED; }
    return FP8_ELEMENT_REPRESENTED;
}

/*
Whether any element of a set whose amax is `amax` may saturate under `scale`: fl(|x| * scale)
rises with |x| (rounding to nearest is monotonic), so none does when the amax does not, and
this is exact. A NaN amax (the set holds a NaN) answers yes: its elements need classifying.
*/
LLMC_HD int fp8_may_saturate(float amax, float scale, Fp8Format format) {
    return amax != amax || fp8_saturates(amax, scale, format);
}

// |x| as float bits, for amax reductions: as unsigned integers these order like the
// magnitudes, and any NaN orders above Inf, so atomicMax on them yields NaN when a NaN
// was present and Inf when an Inf was (fp8_scaling.h then refuses to record it)
LLMC_HD uint32_t fp8_amax_bits(float x) {
    return float_as_bits(x) & 0x7fffffffu;
}

/*
The FP8 side of one weight element an optimizer step has just written (DESIGN.md section 3),
shared by both optimizer kernels (llmc/adamw.cuh, llmc/adamw8.cuh) and their host references
(llmc/quant8.h): the value the weight's FP8 cast reads, the new fp32 master when there is one,
else the new bf16 weight (its bits), whose amax the step reports; and that value's E4M3 code
under `scale` (SATFINITE), which the delayed weight cast writes with the scale of the previous
step's amax. The current weight cast later reads the same value, so both scalings quantize
the same number.
*/
typedef struct {
    float value;
    uint8_t code;
} Fp8WeightElement;

LLMC_HD Fp8WeightElement fp8_weight_element(int has_master, float new_master, uint16_t new_weight_bits, float scale) {
    Fp8WeightElement e;
    e.value = has_master ? new_master : bf16_bits_to_float(new_weight_bits);
    e.code = fp8_quantize(e.value, scale, FP8_E4M3);
    return e;
}

/*
What a host reference of an optimizer step writes for the FP8 cast of the weight it updates
(the kernels' Fp8WeightUpdate, llmc/fp8_scaling.cuh): *amax (amax NULL: none) becomes the max
of |value| over the call's elements; codes (NULL: current scaling, no codes) get each
element's code under `scale`, from the call's first element on.
*/
typedef struct {
    float* amax;
    uint8_t* codes;
    float scale;
} Fp8WeightRef;

// element i of the call, just written; out may be NULL (the weight is not FP8)
static inline void fp8_weight_ref_add(const Fp8WeightRef* out, size_t i, int has_master, float new_master,
                                      uint16_t new_weight_bits) {
    if (out == NULL) { return; }
    Fp8WeightElement e = fp8_weight_element(has_master, new_master, new_weight_bits, out->scale);
    if (out->amax != NULL && fp8_amax_bits(e.value) > fp8_amax_bits(*out->amax)) { *out->amax = bits_as_float(fp8_amax_bits(e.value)); }
    if (out->codes != NULL) { out->codes[i] = e.code; }
}

#endif // LLMC_FP8_H
