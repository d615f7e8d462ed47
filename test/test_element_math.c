/*
test_element_math.c: CPU checks of llmc/element_math.h, the element functions the CUDA
kernels and the CPU reference share.

Each function is checked against a reference computed a different way:
- bf16 round-to-nearest-even: every one of the 2^16 upper halves with a set of low halves
  (the edge cases 0, 1, 0x7fff, 0x8000, 0x8001, 0xffff and random ones), against a rounding
  decided in double arithmetic: the two bf16 neighbours of x, the nearer wins, a tie goes
  to the even mantissa, and the neighbour beyond the largest finite value is inf (2^128).
- stochastic rounding (with rounding_bits over consecutive elements): the result is always one
  of the two neighbours; the mean of many draws is x within 5 standard deviations of the Bernoulli mean; it never rounds a finite
  value to inf; inf and NaN pass through.
- random_u32: chi-square of the top and bottom bytes over 256 buckets, each bit's balance,
  and independence of two seeds. rounding_bits: the two halves of random_u32(seed, j) for
  elements 2j and 2j+1, each byte stochastic rounding uses uniform over consecutive elements,
  and the two elements of a pair independent (chi-square of their joint top nibbles).
- adamw_element_update: against the AdamW formula in double, one step on random inputs
  and a 2000-step trajectory.
- GELU: against the tanh formula in double; its derivative against a central finite
  difference of the double formula.
*/
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <math.h>
#include "llmc/element_math.h"
#include "test/test_harness.h"

// a small deterministic generator for test inputs (independent of random_u32 under test)
static uint64_t test_rng_state = 0x853c49e6748fea9bULL;
static uint32_t test_rand_u32(void) {
    test_rng_state = test_rng_state * 6364136223846793005ULL + 1442695040888963407ULL;
    uint32_t xorshifted = (uint32_t)(((test_rng_state >> 18) ^ test_rng_state) >> 27);
    uint32_t rotation = (uint32_t)(test_rng_state >> 59);
    return (xorshifted >> rotation) | (xorshifted << ((32 - rotation) & 31));
}
static double test_rand_uniform(double lo, double hi) {
    return lo + (hi - lo) * (test_rand_u32() / 4294967296.0);
}

// value of a non-NaN bf16 pattern as a double; the inf pattern counts as 2^128, which is
// where IEEE round-to-nearest sends overflowing values
static double bf16_bits_value_for_rounding(uint16_t bits) {
    double sign = (bits & 0x8000u) ? -1.0 : 1.0;
    if ((bits & 0x7fffu) == 0x7f80u) { return sign * ldexp(1.0, 128); }
    return (double)bf16_bits_to_float(bits);
}

// RNE to bf16 decided in double arithmetic, for finite x
static uint16_t reference_bf16_rne(float x) {
    uint32_t u = float_as_bits(x);
    uint16_t toward_zero = (uint16_t)(u >> 16);
    if ((u & 0xffffu) == 0) { return toward_zero; }
    uint16_t away_from_zero = (uint16_t)(toward_zero + 1);
    double below = fabs(bf16_bits_value_for_rounding(toward_zero));
    double above = fabs(bf16_bits_value_for_rounding(away_from_zero));
    double magnitude = fabs((double)x);
    double distance_below = magnitude - below, distance_above = above - magnitude;
    if (distance_below < distance_above) { return toward_zero; }
    if (distance_above < distance_below) { return away_from_zero; }
    return (toward_zero & 1u) ? away_from_zero : toward_zero;
}

static void test_bf16_round_to_nearest_even(void) {
    const uint16_t edge_lows[] = {0x0000, 0x0001, 0x7fff, 0x8000, 0x8001, 0xffff};
    const int random_lows = 10;
    long mismatches = 0, checked = 0;
    uint32_t first_bad = 0;
    for (uint32_t upper = 0; upper < 65536u; upper++) {
        for (int j = 0; j < (int)(sizeof(edge_lows) / sizeof(edge_lows[0])) + random_lows; j++) {
            uint32_t low = j < 6 ? edge_lows[j] : (test_rand_u32() & 0xffffu);
            uint32_t u = (upper << 16) | low;
            float x = bits_as_float(u);
            uint16_t got = float_to_bf16_bits(x);
            int ok;
            if (isnan(x)) {
                ok = ((got & 0x7f80u) == 0x7f80u) && (got & 0x007fu) != 0;  // still a NaN
            } else {
                ok = got == reference_bf16_rne(x);
            }
            checked++;
            if (!ok) { if (mismatches == 0) { first_bad = u; } mismatches++; }
        }
    }
    CHECK(mismatches == 0, "bf16 RNE: %ld of %ld inputs differ from the double-rounding reference (first 0x%08x)",
          mismatches, checked, first_bad);
    CHECK(float_to_bf16_bits(INFINITY) == 0x7f80u && float_to_bf16_bits(-INFINITY) == 0xff80u, "bf16 RNE keeps +-inf");
    // bf16 max is (2 - 2^-7) * 2^127 = 3.3895e38; values from max + half an ulp (3.3961e38) up overflow
    CHECK(float_to_bf16_bits(3.39e38f) == 0x7f7fu, "bf16 RNE: 3.39e38 rounds down to the bf16 max");
    CHECK(float_to_bf16_bits(3.4e38f) == 0x7f80u, "bf16 RNE: 3.4e38 (above bf16 max + half ulp) overflows to inf");
    CHECK(bf16_bits_to_float(float_to_bf16_bits(1.0f)) == 1.0f, "bf16 round trip of 1");
}

static void test_stochastic_rounding(void) {
    const int draws = 200000;
    const int num_values = 40;
    uint32_t seed = 1234;
    for (int j = 0; j < num_values; j++) {
        // magnitudes from 1e-30 to 1e30, both signs, exactly representable ones included
        float x = (float)(test_rand_uniform(1.0, 2.0) * pow(10.0, test_rand_uniform(-30.0, 30.0)));
        if (j % 2 == 1) { x = -x; }
        if (j == 0) { x = 1.0f; }
        if (j == 1) { x = 1.0f + 1.0f / 512.0f; }  // exactly half way between two bf16
        if (j == 2) { x = bits_as_float(0x00000007u); }  // subnormal float
        uint32_t u = float_as_bits(x);
        uint16_t toward_zero = (uint16_t)(u >> 16);
        double lo = bf16_bits_to_float(toward_zero);
        double hi = (u & 0xffffu) ? bf16_bits_to_float((uint16_t)(toward_zero + 1)) : lo;
        double p = (double)(u & 0xffffu) / 65536.0;  // probability of rounding away from zero
        double sum = 0.0;
        int outside = 0;
        for (int i = 0; i < draws; i++) {
            float r = bf16_bits_to_float(float_to_bf16_bits_stochastic(x, rounding_bits(seed, (uint32_t)i)));
            if ((double)r != lo && (double)r != hi) { outside++; }
            sum += r;
        }
        double mean = sum / draws;
        double sigma = fabs(hi - lo) * sqrt(p * (1.0 - p) / draws);
        double bound = 5.0 * sigma + 1e-12 * fabs((double)x);
        CHECK(outside == 0, "stochastic rounding of %.9g gave %d results that are not its two bf16 neighbours",
              (double)x, outside);
        CHECK(fabs(mean - (double)x) <= bound, "stochastic rounding of %.9g is biased: mean %.12g, |diff| %.3g > %.3g",
              (double)x, mean, fabs(mean - (double)x), bound);
        seed++;
    }
    // near the top of the range a round-up would be inf: it must never happen
    long infinities = 0;
    for (uint32_t low = 0; low < 65536u; low += 7) {
        for (int sign = 0; sign < 2; sign++) {
            float x = bits_as_float((sign ? 0xff7f0000u : 0x7f7f0000u) | low);
            for (uint32_t i = 0; i < 64; i++) {
                float r = bf16_bits_to_float(float_to_bf16_bits_stochastic(x, random_u32(77, low * 64 + i)));
                if (isinf(r)) { infinities++; }
            }
        }
    }
    CHECK(infinities == 0, "stochastic rounding turned %ld finite values near FLT_MAX into inf", infinities);
    CHECK(float_to_bf16_bits_stochastic(INFINITY, 0xffffu) == 0x7f80u, "stochastic rounding keeps +inf");
    CHECK(isnan(bf16_bits_to_float(float_to_bf16_bits_stochastic(NAN, 0x1234u))), "stochastic rounding keeps NaN");
    // a NaN whose payload lies in the low 16 bits only: dropping them would make it Inf
    CHECK(isnan(bf16_bits_to_float(float_to_bf16_bits_stochastic(bits_as_float(0x7f800001u), 0u))),
          "stochastic rounding turned the NaN 0x7f800001 into a non-NaN");
}

// chi-square statistic of 256 buckets holding `total` counts
static double chi_square_256(const long counts[256], long total) {
    double expected = total / 256.0, chi2 = 0.0;
    for (int i = 0; i < 256; i++) { double d = counts[i] - expected; chi2 += d * d / expected; }
    return chi2;
}

static void test_random_u32(void) {
    const long n = 1L << 20;
    // 255 degrees of freedom: mean 255, standard deviation sqrt(510) = 22.6; 6 sigma
    const double chi2_limit = 255.0 + 6.0 * sqrt(510.0);
    const uint32_t seeds[] = {0u, 1u, 42u, 0xdeadbeefu};
    for (int s = 0; s < 4; s++) {
        long top[256] = {0}, bottom[256] = {0}, bit_ones[32] = {0};
        for (long i = 0; i < n; i++) {
            uint32_t r = random_u32(seeds[s], (uint32_t)i);
            top[r >> 24]++;
            bottom[(r >> 8) & 0xffu]++;  // bits 8..15: the high half of what stochastic rounding uses
            for (int b = 0; b < 32; b++) { bit_ones[b] += (r >> b) & 1u; }
        }
        double chi2_top = chi_square_256(top, n), chi2_bottom = chi_square_256(bottom, n);
        CHECK(chi2_top < chi2_limit, "random_u32 seed %u: chi-square of the top byte %.1f >= %.1f", seeds[s], chi2_top, chi2_limit);
        CHECK(chi2_bottom < chi2_limit, "random_u32 seed %u: chi-square of bits 8..15 %.1f >= %.1f", seeds[s], chi2_bottom, chi2_limit);
        int unbalanced = 0;
        for (int b = 0; b < 32; b++) {
            if (fabs(bit_ones[b] - n / 2.0) > 6.0 * sqrt(n / 4.0)) { unbalanced++; }  // binomial, 6 sigma
        }
        CHECK(unbalanced == 0, "random_u32 seed %u: %d of 32 bits are unbalanced", seeds[s], unbalanced);
    }
    // two seeds must give unrelated streams: equal low bytes at the same index ~ 1/256
    long equal_bytes = 0;
    for (long i = 0; i < n; i++) {
        equal_bytes += (random_u32(1u, (uint32_t)i) & 0xffu) == (random_u32(2u, (uint32_t)i) & 0xffu);
    }
    double expected_equal = n / 256.0, sd = sqrt(n * (1.0 / 256.0) * (255.0 / 256.0));
    CHECK(fabs(equal_bytes - expected_equal) < 6.0 * sd, "random_u32 seeds 1 and 2 agree on %ld low bytes (expected %.0f)",
          equal_bytes, expected_equal);
}

// rounding_bits: element 2j's low 16 bits are random_u32(seed, j)'s low half, element 2j+1's its
// high half; over consecutive elements each of the two bytes stochastic rounding uses is uniform,
// and an even element's bits are independent of the odd one's after it (the joint top nibbles
// of the pair, 256 buckets)
static void test_rounding_bits(void) {
    const long pairs = 1L << 19;
    const double chi2_limit = 255.0 + 6.0 * sqrt(510.0);
    const uint32_t seed = 0x5eedu;
    long low_byte[256] = {0}, high_byte[256] = {0}, joint[256] = {0};
    long mismatched = 0;
    for (long j = 0; j < pairs; j++) {
        uint32_t whole = random_u32(seed, (uint32_t)j);
        uint32_t even = rounding_bits(seed, (uint32_t)(2 * j)) & 0xffffu, odd = rounding_bits(seed, (uint32_t)(2 * j + 1)) & 0xffffu;
        mismatched += even != (whole & 0xffffu) || odd != (whole >> 16);
        low_byte[even & 0xffu]++;
        low_byte[odd & 0xffu]++;
        high_byte[even >> 8]++;
        high_byte[odd >> 8]++;
        joint[((even >> 12) << 4) | (odd >> 12)]++;
    }
    CHECK(mismatched == 0, "rounding_bits: %ld of %ld pairs are not the two halves of random_u32(seed, j)", mismatched, pairs);
    double chi2_low = chi_square_256(low_byte, 2 * pairs), chi2_high = chi_square_256(high_byte, 2 * pairs);
    double chi2_joint = chi_square_256(joint, pairs);
    CHECK(chi2_low < chi2_limit, "rounding_bits: chi-square of bits 0..7 %.1f >= %.1f", chi2_low, chi2_limit);
    CHECK(chi2_high < chi2_limit, "rounding_bits: chi-square of bits 8..15 %.1f >= %.1f", chi2_high, chi2_limit);
    CHECK(chi2_joint < chi2_limit, "rounding_bits: chi-square of a pair's joint top nibbles %.1f >= %.1f", chi2_joint,
          chi2_limit);
}

typedef struct { double param, m, v; } AdamWDoubleState;

// the textbook AdamW step t in double (decoupled weight decay, bias corrections divided out)
static void adamw_reference_double(AdamWDoubleState* s, double grad, AdamWElementParams p, int t) {
    s->m = p.beta1 * s->m + (1.0 - p.beta1) * grad;
    s->v = p.beta2 * s->v + (1.0 - p.beta2) * grad * grad;
    double m_hat = s->m / (1.0 - pow(p.beta1, t));
    double v_hat = s->v / (1.0 - pow(p.beta2, t));
    s->param -= p.learning_rate * (m_hat / (sqrt(v_hat) + p.eps) + p.weight_decay * s->param);
}

static AdamWElementParams adamw_params_at_step(int t, float lr, float weight_decay) {
    AdamWElementParams p;
    p.learning_rate = lr;
    p.beta1 = 0.9f;
    p.beta2 = 0.95f;
    p.m_hat_scale = (float)(1.0 / (1.0 - pow(p.beta1, t)));
    p.v_hat_scale = (float)(1.0 / (1.0 - pow(p.beta2, t)));
    p.eps = 1e-8f;
    p.weight_decay = weight_decay;
    return p;
}

static void test_adamw_element_update(void) {
    // one step from random states
    int bad = 0;
    double worst = 0.0;
    for (int i = 0; i < 100000; i++) {
        int t = 1 + (int)(test_rand_u32() % 5000);
        AdamWElementParams p = adamw_params_at_step(t, (float)test_rand_uniform(1e-5, 1e-3), (i % 2) ? 0.1f : 0.0f);
        float param = (float)test_rand_uniform(-0.2, 0.2);
        float grad = (float)(test_rand_uniform(-1.0, 1.0) * pow(10.0, test_rand_uniform(-6.0, 1.0)));
        float m = (float)(test_rand_uniform(-1.0, 1.0) * 0.01);
        float v = (float)(test_rand_uniform(0.0, 1.0) * 1e-4);
        AdamWDoubleState s = {param, m, v};
        // m and v are sums of two terms: their rounding error scales with the terms, not the sum
        double m_terms = fabs((double)p.beta1 * m) + fabs((1.0 - p.beta1) * grad);
        double v_terms = (double)p.beta2 * v + (1.0 - p.beta2) * (double)grad * grad;
        float new_param = adamw_element_update(param, grad, &m, &v, p);
        adamw_reference_double(&s, grad, p, t);
        // each float op rounds with relative error 2^-24: m and v are a few ulps off, and the
        // update (|update| <= ~1/sqrt(1-beta2) = 4.5) is off by ~1e-6 relative
        double update_size = fabs(s.param - param) + p.learning_rate * 5.0;
        double param_error = fabs(new_param - s.param);
        double param_bound = 2.0 * 6e-8 * fabs(s.param) + 4e-6 * update_size;
        if (param_error > param_bound || fabs(m - s.m) > 4e-7 * m_terms || fabs(v - s.v) > 4e-7 * v_terms) {
            bad++;
        }
        if (param_error / param_bound > worst) { worst = param_error / param_bound; }
    }
    CHECK(bad == 0, "adamw_element_update: %d of 100000 single steps off the double formula (worst at %.2f x bound)",
          bad, worst);

    // a trajectory: descend 0.5 * (param - 10)^2 from 0 for 2000 steps of lr 1e-3, far from
    // the minimum (near it the sign of tiny gradients decides each step and any two
    // implementations part ways); float and double must stay together
    float param = 0.0f, m = 0.0f, v = 0.0f;
    AdamWDoubleState s = {0.0, 0.0, 0.0};
    double max_gap = 0.0;
    for (int t = 1; t <= 2000; t++) {
        AdamWElementParams p = adamw_params_at_step(t, 1e-3f, 0.01f);
        float grad = param - 10.0f;
        param = adamw_element_update(param, grad, &m, &v, p);
        adamw_reference_double(&s, s.param - 10.0, p, t);
        if (fabs(param - s.param) > max_gap) { max_gap = fabs(param - s.param); }
    }
    CHECK(max_gap < 1e-5, "adamw_element_update: 2000-step trajectory drifts %.3g from double (limit 1e-5)", max_gap);
    // each step moves ~lr (|m_hat / sqrt(v_hat)| ~ 1), less the weight decay: about 2 in all
    CHECK(fabs(s.param - 2.0) < 0.1, "adamw reference trajectory moved to %.4f, expected about 2", s.param);

    // zero gradient and state: only the decoupled weight decay acts
    AdamWElementParams p = adamw_params_at_step(1, 0.01f, 0.1f);
    float zero_m = 0.0f, zero_v = 0.0f;
    float decayed = adamw_element_update(2.0f, 0.0f, &zero_m, &zero_v, p);
    CHECK_CLOSE(decayed, 2.0 - 0.01 * 0.1 * 2.0, 1e-7, 0.0, "adamw weight decay alone");
    // adamw_element_params (what the optimizers call) gives the step-t bias-correction scales this test uses
    for (int t = 1; t <= 3; t++) {
        AdamWElementParams expected = adamw_params_at_step(t, 1e-3f, 0.1f);
        AdamWElementParams got = adamw_element_params(1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, t);
        CHECK(memcmp(&got, &expected, sizeof(got)) == 0, "adamw_element_params at t=%d: bias-correction scales %.9g %.9g, expected %.9g %.9g",
              t, got.m_hat_scale, got.v_hat_scale, expected.m_hat_scale, expected.v_hat_scale);
    }
}

static double gelu_double(double x) {
    const double k = sqrt(2.0 / M_PI);
    return 0.5 * x * (1.0 + tanh(k * (x + 0.044715 * x * x * x)));
}

static void test_gelu(void) {
    int bad_forward = 0, bad_backward = 0, nonfinite = 0;
    double worst_forward = 0.0, worst_backward = 0.0;
    for (int i = -120000; i <= 120000; i++) {
        float x = (float)(i * 1e-4);  // [-12, 12]
        double expected = gelu_double(x);
        double got = gelu_forward_element(x);
        // exp2f, the division and the float argument are good to a few ulps of values of size
        // ~1, and the result is x times that: abs error ~1e-7 * max(1, |x|)
        double forward_bound = 5e-7 * fmax(1.0, fabs(x)) + 1e-6 * fabs(expected);
        if (fabs(got - expected) > forward_bound) { bad_forward++; }
        if (fabs(got - expected) / forward_bound > worst_forward) { worst_forward = fabs(got - expected) / forward_bound; }

        const double h = 1e-4;  // central difference: truncation error ~ h^2 |gelu'''| / 6 < 1e-8
        double slope = (gelu_double((double)x + h) - gelu_double((double)x - h)) / (2.0 * h);
        double derivative = gelu_backward_element(x);
        double backward_bound = 2e-6 * fmax(1.0, fabs(x)) + 1e-6 * fabs(slope);
        if (fabs(derivative - slope) > backward_bound) { bad_backward++; }
        if (fabs(derivative - slope) / backward_bound > worst_backward) { worst_backward = fabs(derivative - slope) / backward_bound; }
    }
    CHECK(bad_forward == 0, "gelu_forward_element: %d points off the double formula (worst %.2f x bound)", bad_forward, worst_forward);
    CHECK(bad_backward == 0, "gelu_backward_element: %d points off the finite difference (worst %.2f x bound)", bad_backward, worst_backward);
    const float extremes[] = {-1e4f, -50.0f, -20.0f, 20.0f, 50.0f, 1e4f};
    for (int i = 0; i < 6; i++) {
        float y = gelu_forward_element(extremes[i]);
        float d = gelu_backward_element(extremes[i]);
        if (!isfinite(y) || !isfinite(d)) { nonfinite++; }
    }
    CHECK(nonfinite == 0, "gelu: %d non-finite results for large |x|", nonfinite);
    // far out, where x u'(x) overflows a float (|x| above about 1e13): the derivative is s, 0 or
    // 1, not inf * 0; GELU itself is 0 or x. NaN stays NaN
    const float far_out[] = {1e12f, 1.2e13f, 1e19f, 3e38f, INFINITY};
    for (int i = 0; i < 5; i++) {
        CHECK(gelu_backward_element(far_out[i]) == 1.0f, "gelu'(%g) = %g, expected 1", far_out[i], gelu_backward_element(far_out[i]));
        CHECK(fabsf(gelu_backward_element(-far_out[i])) < 1e-30f, "gelu'(%g) = %g, expected 0", -far_out[i],
              gelu_backward_element(-far_out[i]));
        CHECK(fabsf(gelu_forward_element(-far_out[i])) < 1e-30f || isinf(far_out[i]), "gelu(%g) = %g, expected 0", -far_out[i],
              gelu_forward_element(-far_out[i]));
    }
    CHECK(isnan(gelu_backward_element(NAN)) && isnan(gelu_forward_element(NAN)), "gelu of NaN must be NaN");
    CHECK_CLOSE(gelu_forward_element(1e4f), 1e4, 0.0, 1e-6, "gelu(1e4) = 1e4");
    CHECK_CLOSE(gelu_backward_element(1e4f), 1.0, 1e-6, 0.0, "gelu'(1e4) = 1");
    CHECK_CLOSE(gelu_forward_element(-1e4f), 0.0, 1e-6, 0.0, "gelu(-1e4) = 0");
    // the derivative against its closed form in double over [-6, 6], to a float's precision (the finite
    // difference above admits 2e-6 * |x|: a folded constant off in its sixth digit passes it)
    double worst_closed = 0.0;
    for (int i = -6000; i <= 6000; i++) {
        const double x = i * 1e-3, k = sqrt(2.0 / M_PI), t = tanh(k * (x + 0.044715 * x * x * x));
        const double closed = 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * k * (1.0 + 3.0 * 0.044715 * x * x);
        worst_closed = fmax(worst_closed, fabs(gelu_backward_element((float)x) - closed));
    }
    CHECK(worst_closed < 1e-6, "gelu_backward_element: %.3g off the closed-form derivative on [-6, 6]", worst_closed);
    CHECK(layernorm_output_element(3.0f, 1.0f, 0.5f, 2.0f, 0.25f) == 2.25f, "layernorm_output_element(3; mean 1, rstd 0.5, w 2, b 0.25) = %g, expected 2.25",
          layernorm_output_element(3.0f, 1.0f, 0.5f, 2.0f, 0.25f));
}

int main(void) {
    test_bf16_round_to_nearest_even();
    test_stochastic_rounding();
    test_random_u32();
    test_rounding_bits();
    test_adamw_element_update();
    test_gelu();
    return test_summary("test_element_math");
}
