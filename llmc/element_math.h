/*
element_math.h: the per-element arithmetic that the CUDA kernels and the CPU reference share.

Why: the GPU must agree with the CPU reference, and CI has no GPU. Every element function
that has to match across the two (bf16 rounding, stochastic rounding, the counter-based
random numbers behind it, the AdamW update, GELU, the layernorm output) is written once here as a
__host__ __device__ function, so the CPU tests exercise exactly the code the kernels run.
Functions that must be bit-exact across host and device use explicit fmaf() and only
IEEE-exact operations (+ - * / sqrtf), so nvcc's FMA contraction cannot make them differ.
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

// stochastic rounding: round up with probability equal to the dropped fraction.
// `random` is a uniform 32-bit value; only its low 16 bits are used.
LLMC_HD uint16_t float_to_bf16_bits_stochastic(float x, uint32_t random) {
    uint32_t u = float_as_bits(x);
    if ((u & 0x7f800000u) == 0x7f800000u) { return float_to_bf16_bits(x); } // inf/nan: no dither
    uint32_t dithered = u + (random & 0xffffu);
    if ((dithered & 0x7f800000u) == 0x7f800000u) { return (uint16_t)(u >> 16); } // never round to inf
    return (uint16_t)(dithered >> 16);
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

// ----------------------------------------------------------------------------
// layernorm's output from the row's mean and 1/std, before its bf16 rounding. Bit-exact
// host/device: layernorm.cuh's kernel and its FP8 tile cast both compute it, so the codes
// a two-pass FP8 cast writes are those of the values the one-pass kernel stores.

LLMC_HD float layernorm_output_element(float x, float mean, float rstd, float weight, float bias) {
    return fmaf((x - mean) * rstd, weight, bias);
}

// ----------------------------------------------------------------------------
// GELU, tanh approximation (GPT-2's). Not bit-exact across host and device (tanhf differs
// by an ulp); tests compare it with a tolerance.

#define GELU_SCALING_FACTOR 0.7978845608028654f  // sqrt(2/pi)

LLMC_HD float gelu_forward_element(float x) {
    float cube = 0.044715f * x * x * x;
    return 0.5f * x * (1.0f + tanhf(GELU_SCALING_FACTOR * (x + cube)));
}

// d gelu(x) / dx. sech^2 as 1 - tanh^2: one tanhf instead of also a coshf and a division, which
// on the GPU are 2 special-function instructions per element instead of 5 (those run at a
// quarter of the FMA rate and bounded the GELU backward kernels). Where tanh nears 1 the
// difference loses relative accuracy: against float64 over x in [-20, 20] the derivative is
// off by at most 1.3e-6 (the cosh form: 1.9e-7), far below the bf16 rounding (2^-9 = 2e-3) of
// the gradient it multiplies.
LLMC_HD float gelu_backward_element(float x) {
    float cube = 0.044715f * x * x * x;
    float tanh_out = tanhf(GELU_SCALING_FACTOR * (x + cube));
    float sech2 = 1.0f - tanh_out * tanh_out;
    return 0.5f * (1.0f + tanh_out) + x * 0.5f * sech2 * GELU_SCALING_FACTOR * (1.0f + 3.0f * 0.044715f * x * x);
}

// ----------------------------------------------------------------------------
// AdamW on one element, bit-exact host/device. m and v are updated in place and the
// new parameter is returned. grad is already multiplied by the clipping scale.
// beta1_correction = 1 - beta1^t, beta2_correction = 1 - beta2^t (computed once on the host).
// Decoupled weight decay: param -= lr * (update + weight_decay * param).

typedef struct {
    float learning_rate;
    float beta1;
    float beta2;
    float beta1_correction;
    float beta2_correction;
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
    p.beta1_correction = 1.0f - powf(beta1, (float)t);
    p.beta2_correction = 1.0f - powf(beta2, (float)t);
    p.eps = eps;
    p.weight_decay = weight_decay;
    return p;
}

LLMC_HD float adamw_element_update(float param, float grad, float* m, float* v, AdamWElementParams p) {
    float m_new = fmaf(p.beta1, *m, (1.0f - p.beta1) * grad);
    float v_new = fmaf(p.beta2, *v, (1.0f - p.beta2) * (grad * grad));
    *m = m_new;
    *v = v_new;
    float m_hat = m_new / p.beta1_correction;
    float v_hat = v_new / p.beta2_correction;
    float update = m_hat / (sqrtf(v_hat) + p.eps);
    return fmaf(-p.learning_rate, fmaf(p.weight_decay, param, update), param);
}

#endif // LLMC_ELEMENT_MATH_H
