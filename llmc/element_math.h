/*
element_math.h: the per-element arithmetic that the CUDA kernels and the CPU reference share.

Why: the GPU must agree with the CPU reference, and CI has no GPU. Every element function
that has to match across the two (bf16 rounding, stochastic rounding, the counter-based
random numbers behind it, the AdamW update, GELU, the layernorm output) is written once here as a
__host__ __device__ function, so the CPU tests exercise exactly the code the kernels run.
Functions that must be bit-exact across host and device use explicit fmaf() and only
IEEE-exact operations (+ - * / sqrtf), so nvcc's FMA contraction cannot make them differ
(test/test_fma_contraction.py checks the kernels' PTX with contraction on and off).
Values are passed as float and bf16 as raw uint16 bits: no CUDA types needed on the host.
*/
#ifndef LLMC_ELEMENT_MATH_H
#define LLMC_ELEMENT_MATH_H

#include <stdint.h>
#include <string.h>
#include <math.h>

#ifdef __CUDACC__
#define LLMC_HD __host__ __device__ __forceinline__
#else
#define LLMC_HD static inline
#endif

// On the host, the correctly rounded result of an operation that the GPU computes only
// approximately (exact: the host's value; input: the operation's argument; ulps: the GPU's
// error bound). cudasim defines it to model the GPU's error inside its kernels
// (test/cudasim/cudasim.h), so tests meet it without a GPU.
#ifndef LLMC_GPU_APPROXIMATE
#define LLMC_GPU_APPROXIMATE(exact, input, ulps) (exact)
#endif

LLMC_HD uint32_t float_as_bits(float x) {
#ifdef __CUDA_ARCH__
    return __float_as_uint(x);
#else
    uint32_t u; memcpy(&u, &x, 4); return u;
#endif
}

LLMC_HD float bits_as_float(uint32_t u) {
#ifdef __CUDA_ARCH__
    return __uint_as_float(u);
#else
    float x; memcpy(&x, &u, 4); return x;
#endif
}

// ----------------------------------------------------------------------------
// bf16 as raw bits

LLMC_HD float bf16_bits_to_float(uint16_t b) {
    return bits_as_float(((uint32_t)b) << 16);
}

// round to nearest even; NaN stays a (quiet) NaN
LLMC_HD uint16_t float_to_bf16_bits(float x) {
    uint32_t u = float_as_bits(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) { return (uint16_t)((u >> 16) | 0x0040u); }
    uint32_t rounding_bias = 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)((u + rounding_bias) >> 16);
}

// stochastic rounding of a finite x: round up with probability equal to the dropped fraction.
// `random` is a uniform 32-bit value; only its low 16 bits are used.
LLMC_HD uint16_t float_to_bf16_bits_stochastic_finite(float x, uint32_t random) {
    uint32_t u = float_as_bits(x);
    uint32_t dithered = u + (random & 0xffffu);
    if ((dithered & 0x7f800000u) == 0x7f800000u) { return (uint16_t)(u >> 16); } // never round to inf
    return (uint16_t)(dithered >> 16);
}

// stochastic rounding of any x: inf and NaN are not dithered
LLMC_HD uint16_t float_to_bf16_bits_stochastic(float x, uint32_t random) {
    if ((float_as_bits(x) & 0x7f800000u) == 0x7f800000u) { return float_to_bf16_bits(x); }
    return float_to_bf16_bits_stochastic_finite(x, random);
}

// ----------------------------------------------------------------------------
// counter-based random numbers: value = f(seed, index), no state to carry between
// threads, so the GPU kernel and the CPU reference draw the same numbers for the same
// element. A 32-bit integer mixer (xorshift-multiply rounds) with good avalanche.

LLMC_HD uint32_t random_u32(uint32_t seed, uint32_t index) {
    uint32_t h = index * 0x9e3779b1u ^ (seed + 0x7f4a7c15u) * 0x85ebca77u;
    h ^= h >> 16; h *= 0x7feb352du;
    h ^= h >> 15; h *= 0x846ca68bu;
    h ^= h >> 16;
    h ^= seed;
    h ^= h >> 16; h *= 0x7feb352du;
    h ^= h >> 15; h *= 0x846ca68bu;
    h ^= h >> 16;
    return h;
}

/*
The random bits that stochastic rounding adds below element `index`'s bf16 cut (its low 16 bits;
float_to_bf16_bits_stochastic uses no others): one half of random_u32(seed, index / 2), the low
half for an even index, the high half for the odd one after it. A rounding takes 16 bits, so one
hash serves two elements: a kernel that rounds an even element and the next together spends one
hash on both (stochastic_round_bf16_pair), where the hash a value had been a fifth of adamw8's
instructions (doc/adamw8.md).
*/
LLMC_HD uint32_t rounding_bits(uint32_t seed, uint32_t index) {
    return random_u32(seed, index >> 1) >> ((index & 1u) * 16u);
}

/*
2^x in one special-function instruction on the GPU (PTX ex2.approx.ftz: relative error about
2^-22, results below 2^-126 flushed to 0), for the exponentials of memory-bound kernels (softmax,
GELU), where exp2f adds a test and two multiplies for results below 2^-126 and expf a range
reduction of about 10 instructions. The host (the CPU reference) runs exp2f, so the two agree
to a few ulps, not bit for bit; cudasim's kernels get exp2f moved within that bound.
*/
LLMC_HD float exp2_approx(float x) {
#ifdef __CUDA_ARCH__
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
#else
    return LLMC_GPU_APPROXIMATE(exp2f(x), x, 2);
#endif
}

// ----------------------------------------------------------------------------
// layernorm's output from the row's mean and 1/std, before its bf16 rounding. Bit-exact
// host/device: layernorm.cuh's kernel and its FP8 tile cast both compute it, so the codes
// a two-pass FP8 cast writes are those of the values the one-pass kernel stores.

LLMC_HD float layernorm_output_element(float x, float mean, float rstd, float weight, float bias) {
    return fmaf((x - mean) * rstd, weight, bias);
}

// ----------------------------------------------------------------------------
// GELU, tanh approximation (GPT-2's): gelu(x) = x * 0.5 (1 + tanh u), u = sqrt(2/pi) (x + 0.044715 x^3),
// computed as x * s with s = 0.5 (1 + tanh u) = 1 / (1 + e), e = e^-2u. On the GPU e is one
// exp2_approx and 1 / (1 + e) one approximate reciprocal, where tanhf took about 20 instructions
// with its branches: a large share of the budget of the memory-bound GELU kernels and casts
// (SASS, 2026-11-27: the bf16 forward kernel went from 232 to 128 instructions for 8 elements, 104
// with the folded constants below). The
// form has no cancellation where tanh nears -1: for x below about -5, 1 + tanhf(u) was 0 or a
// few ulps of 1, now s is good to a few ulps relative. Not bit-exact across host and device
// (the GPU's exp2 and reciprocal are good to about 2 ulps, the host's are correctly rounded);
// tests compare with a tolerance.

// The exponent of e = 2^E, E = -2 log2(e) u = x (GELU_E1 + GELU_E3 x^2), and twice u's derivative,
// 2 u' = GELU_D1 + GELU_D3 x^2: the constants folded (computed in double, rounded once), so each is
// a multiply and one fmaf on x^2 (the GPU had run u as written, four multiplies and an add, then
// two more for the factor -2 log2(e)). fmaf rounds once on the host too, so both sides agree.
#define GELU_E1 -2.3022082f     // -2 log2(e) sqrt(2/pi)
#define GELU_E3 -0.10294324f    // -2 log2(e) sqrt(2/pi) 0.044715
#define GELU_D1 1.5957692f      // 2 sqrt(2/pi)
#define GELU_D3 0.21406445f     // 2 sqrt(2/pi) 3 0.044715

LLMC_HD float gelu_exponent_(float x, float x2) { return x * fmaf(GELU_E3, x2, GELU_E1); }

// 1 / y: one approximate reciprocal on the GPU (0 for y above 2^126), a division on the host
LLMC_HD float gelu_reciprocal_(float y) {
#ifdef __CUDA_ARCH__
    return __fdividef(1.0f, y);
#else
    return LLMC_GPU_APPROXIMATE(1.0f / y, y, 2);
#endif
}

LLMC_HD float gelu_forward_element(float x) {
    return x * gelu_reciprocal_(1.0f + exp2_approx(gelu_exponent_(x, x * x)));
}

// d gelu(x) / dx = s + x ds/dx, ds/dx = 2 u'(x) e s^2, where e s is 1 - s without its rounding.
// e is capped at 2^126, so that it stays finite (e s^2 is never inf * 0) and s at least 2^-126.
// Where the cap holds (x below about -10) or e s^2 is 0 (x above about 10) the derivative is s:
// the second term is below s's rounding there, and x u'(x) overflows for |x| above 1e13 (inf * 0
// was NaN). A NaN x compares false and stays NaN.
LLMC_HD float gelu_backward_element(float x) {
    const float x2 = x * x;
    float exponent = gelu_exponent_(x, x2);
    float e = exp2_approx(fminf(exponent, 126.0f));
    float s = gelu_reciprocal_(1.0f + e);
    float e_s2 = (e * s) * s;
    if (exponent >= 126.0f || e_s2 == 0.0f) { return s; }
    return s + x * fmaf(GELU_D3, x2, GELU_D1) * e_s2;
}

// ----------------------------------------------------------------------------
// AdamW on one element, bit-exact host/device. m and v are updated in place and the
// new parameter is returned. grad is already multiplied by the clipping scale.
// m_hat_scale = 1 / (1 - beta1^t), v_hat_scale = 1 / (1 - beta2^t), computed once on the host:
// the bias corrections are multiplies, not divisions, because the 8-bit optimizer's pass is
// bound by instruction issue, where an IEEE division is about ten instructions (doc/adamw8.md).
// Decoupled weight decay: param -= lr * (update + weight_decay * param).

typedef struct {
    float learning_rate;
    float beta1;
    float beta2;
    float m_hat_scale;
    float v_hat_scale;
    float eps;
    float weight_decay;  // already 0 for tensors that are not decayed
} AdamWElementParams;

// the step-t hyperparameters (t counts from 1); weight_decay 0 for tensors that are not decayed.
// Computed on the host once per tensor and step, so both sides use the same corrections.
static inline AdamWElementParams adamw_element_params(float learning_rate, float beta1, float beta2, float eps,
                                                      float weight_decay, int t) {
    AdamWElementParams p;
    p.learning_rate = learning_rate;
    p.beta1 = beta1;
    p.beta2 = beta2;
    p.m_hat_scale = (float)(1.0 / (1.0 - pow(beta1, t)));
    p.v_hat_scale = (float)(1.0 / (1.0 - pow(beta2, t)));
    p.eps = eps;
    p.weight_decay = weight_decay;
    return p;
}

LLMC_HD float adamw_element_update(float param, float grad, float* m, float* v, AdamWElementParams p) {
    float m_new = fmaf(p.beta1, *m, (1.0f - p.beta1) * grad);
    float v_new = fmaf(p.beta2, *v, (1.0f - p.beta2) * (grad * grad));
    *m = m_new;
    *v = v_new;
    float m_hat = m_new * p.m_hat_scale;
    float v_hat = v_new * p.v_hat_scale;
    float update = m_hat / (sqrtf(v_hat) + p.eps);
    return fmaf(-p.learning_rate, fmaf(p.weight_decay, param, update), param);
}

#endif // LLMC_ELEMENT_MATH_H
