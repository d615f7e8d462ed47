/*
test_fp8_scaling.c: the per-tensor scaling state machine of llmc/fp8_scaling.h, the code the
GPU's scale-update kernel runs: the scale formula and its exactness, margin, amax = 0,
Inf and NaN amax, first-step seeding, a jump above the history, ring wrap-around, the three
recipes (power-of-two current scaling's scale against a reference in double), the cast protocol (update before or after the cast), the config checks, and the
cast statistics.
*/
#include <string.h>
#include "test/test_harness.h"
#include "llmc/fp8_scaling.h"
#include "llmc/rand.h"

// one producer use following the protocol of fp8_scaling.h: cast with the state's scale
// (before or after the update, as fp8_scaling_casts_after_update says), count the statistics
static Fp8CastStats produce(Fp8TensorScaling* s, const float* x, int n, Fp8Format format) {
    float amax = 0.0f;
    for (int i = 0; i < n; i++) { amax = fmaxf(amax, fabsf(x[i])); }
    int after = fp8_scaling_casts_after_update(s);
    if (after) { fp8_scaling_update(s, amax); }
    Fp8CastStats stats = {0.0f, s->scale, 0, 0, 0};
    for (int i = 0; i < n; i++) {
        uint8_t code = fp8_quantize(x[i], s->scale, format);
        fp8_cast_stats_add(&stats, x[i], fp8_classify(x[i], s->scale, code, format));
    }
    if (!after) { fp8_scaling_update(s, amax); }
    return stats;
}

static void test_scale_formula(void) {
    // power-of-two-free and exact: one correctly rounded division, then an exact 2^-margin
    const float amaxes[] = {1.0f, 3.0f, 0.1f, 7.3e-5f, 1234.567f, 3.4e20f};
    for (size_t i = 0; i < sizeof(amaxes) / sizeof(amaxes[0]); i++) {
        float a = amaxes[i];
        volatile float quotient = FP8_E4M3_MAX / a;  // volatile: the division done by itself
        CHECK(fp8_scale_from_amax(a, FP8_E4M3_MAX, 0) == quotient, "scale(%g) is not 448/%g exactly", a, a);
        for (int m = 1; m <= 4; m++) {
            float scaled = fp8_scale_from_amax(a, FP8_E4M3_MAX, m);
            CHECK(scaled == quotient / (float)(1 << m) && ldexpf(scaled, m) == quotient,
                  "margin %d: scale(%g)=%.9g is not 448/%g/2^%d exactly", m, a, scaled, a, m);
        }
    }
    CHECK(fp8_scale_from_amax(3.0f, FP8_E4M3_MAX, 0) != 128.0f && fp8_scale_from_amax(3.0f, FP8_E4M3_MAX, 0) != 256.0f,
          "the scale was rounded to a power of two");
    // amax = 0 and anything below the floor clamp to 1e-12: a large finite scale
    float zero_scale = fp8_scale_from_amax(0.0f, FP8_E4M3_MAX, 0);
    CHECK(isfinite(zero_scale) && zero_scale == FP8_E4M3_MAX / 1e-12f, "scale(0)=%g is not 448/1e-12", zero_scale);
    CHECK(fp8_scale_from_amax(1e-30f, FP8_E5M2_MAX, 0) == FP8_E5M2_MAX / 1e-12f, "amax below the floor not clamped");
    CHECK(isfinite(fp8_reciprocal(zero_scale)) && fp8_reciprocal(zero_scale) > 0.0f, "1/scale(0) is not a positive float");
    // a finite amax near FLT_MAX under the largest margin: the scale stops at the smallest normal
    // float, so 1/scale (the GEMMs' dequantization scale) stays finite, and the amax still fits
    for (int format = 0; format < 2; format++) {
        float fmax = format == 0 ? FP8_E4M3_MAX : FP8_E5M2_MAX;
        float huge = fp8_scale_from_amax(3.0e38f, fmax, FP8_MARGIN_MAX);
        CHECK(huge == bits_as_float(0x00800000u) && isfinite(fp8_reciprocal(huge)),
              "scale(3e38, margin 16) = %g, 1/scale = %g: expected 2^-126 and a finite inverse", huge, fp8_reciprocal(huge));
        Fp8Format f = format == 0 ? FP8_E4M3 : FP8_E5M2;
        CHECK(fp8_classify(3.0e38f, huge, fp8_quantize(3.0e38f, huge, f), f) == FP8_ELEMENT_REPRESENTED,
              "the amax saturates under the clamped scale");
    }
    // with the scale, the amax element itself lands on max (within rounding), never saturated
    mt19937_state rng;
    manual_seed(&rng, 5);
    int saturated = 0;
    for (int i = 0; i < 100000; i++) {
        float a = bits_as_float(0x30000000u + randint32(&rng) % 0x1e000000u);  // 2^-31 .. 2^29
        float s = fp8_scale_from_amax(a, FP8_E4M3_MAX, 0);
        saturated += fp8_classify(a, s, fp8_quantize(a, s, FP8_E4M3), FP8_E4M3) != FP8_ELEMENT_REPRESENTED;
        saturated += fp8_decode(fp8_quantize(a, s, FP8_E4M3), FP8_E4M3) != FP8_E4M3_MAX;
    }
    CHECK(saturated == 0, "%d amaxes did not land exactly on 448 under their own scale", saturated);
}

static void test_current_recipe(void) {
    Fp8TensorScaling s;
    fp8_scaling_init(&s, FP8_RECIPE_CURRENT, FP8_E5M2, 16, 0);
    CHECK(s.scale == 1.0f && s.scale_inv == 1.0f && s.fp8_max == FP8_E5M2_MAX, "init is not scale 1 with E5M2's max");
    const float amaxes[] = {10.0f, 0.5f, 100.0f, 2.0f};
    for (int i = 0; i < 4; i++) {
        CHECK(fp8_scaling_casts_after_update(&s), "current recipe must cast after the update (use %d)", i);
        fp8_scaling_update(&s, amaxes[i]);
        CHECK(s.scale == fp8_scale_from_amax(amaxes[i], FP8_E5M2_MAX, 0), "current scale at use %d ignores the history?", i);
        CHECK(s.scale_inv == 1.0f / s.scale, "scale_inv is not 1/scale");
    }
}

/*
CURRENT_POW2 (-fg pow2): the scale is the largest power of two 2^k with amax * 2^k <= fp8_max
(then / 2^margin), against a reference in double over random amaxes of every exponent and on
the edges: amaxes at a power of two times fp8_max's mantissa (where amax * 2^k == fp8_max
exactly) and one float either side, where a rounded quotient would pick the wrong power. Under
it the amax never saturates, and lands in the top octave [fp8_max / 2, fp8_max]. The state
machine casts after the update, as current scaling, and moves the scale only where the amax
crosses a power of two, which is what lets the GPU predict it (matmul.cuh).
*/
static double pow2_scale_reference(double amax, double fp8_max, int margin) {
    double clamped = amax > FP8_AMAX_FLOOR ? amax : (double)FP8_AMAX_FLOOR;
    double scale = ldexp(1.0, (int)floor(log2(fp8_max / clamped)) + 2);
    while (clamped * scale > fp8_max) { scale *= 0.5; }  // log2 in double may be off by one near a power
    scale = ldexp(scale, -margin);
    return scale >= ldexp(1.0, -126) ? scale : ldexp(1.0, -126);
}

static void test_pow2_recipe(void) {
    mt19937_state rng;
    manual_seed(&rng, 11);
    int wrong = 0, outside = 0;
    for (int format = 0; format < 2; format++) {
        Fp8Format f = format == 0 ? FP8_E4M3 : FP8_E5M2;
        float fmax = format == 0 ? FP8_E4M3_MAX : FP8_E5M2_MAX;
        for (int i = 0; i < 200000; i++) {
            float a;
            if (i < 600) {  // fmax's mantissa at every exponent the clamp and the smallest normal leave, and a float either side
                float edge = ldexpf(fmax, i / 3 - 140);
                a = i % 3 == 0 ? edge : i % 3 == 1 ? nextafterf(edge, 0.0f) : nextafterf(edge, INFINITY);
            } else {
                a = bits_as_float(randint32(&rng) % 0x7f800000u);  // any finite positive float
            }
            int margin = i % 5 == 4 ? 3 : 0;
            float s = fp8_scale_pow2_from_amax(a, fmax, margin);
            wrong += (double)s != pow2_scale_reference(a, fmax, margin);
            if (margin == 0 && a >= FP8_AMAX_FLOOR && s > bits_as_float(0x00800000u)) {  // unclamped: the top octave
                float top = a * s;
                outside += !(top <= fmax && top > 0.5f * fmax);
                outside += fp8_classify(a, s, fp8_quantize(a, s, f), f) != FP8_ELEMENT_REPRESENTED;
            }
        }
    }
    CHECK(wrong == 0, "%d power-of-two scales differ from the reference in double", wrong);
    CHECK(outside == 0, "%d amaxes saturated or fell below fp8_max / 2 under their power-of-two scale", outside);
    CHECK(fp8_scale_pow2_from_amax(0.0f, FP8_E5M2_MAX, 0) == (float)pow2_scale_reference(0.0, FP8_E5M2_MAX, 0),
          "amax 0 is not clamped to 1e-12 like current scaling's");

    Fp8TensorScaling s;
    fp8_scaling_init(&s, FP8_RECIPE_CURRENT_POW2, FP8_E5M2, 16, 0);
    const float amaxes[] = {1.0f, 1.5f, 1.75f, 0.9f, 2.0f, 0.001f};  // 57344 = 1.75 * 2^15
    const float scales[] = {32768.0f, 32768.0f, 32768.0f, 32768.0f, 16384.0f, 32768.0f * 1024.0f};
    for (int i = 0; i < 6; i++) {
        CHECK(fp8_scaling_casts_after_update(&s), "pow2 scaling must cast after the update (use %d)", i);
        fp8_scaling_update(&s, amaxes[i]);
        CHECK(s.scale == scales[i] && s.scale_inv == 1.0f / scales[i], "use %d, amax %g: scale %g, expected %g", i,
              amaxes[i], s.scale, scales[i]);
    }
    fp8_scaling_update(&s, NAN);  // non-finite: nothing moves, as in every recipe
    CHECK(s.scale == scales[5] && s.nonfinite_count == 1, "a NaN amax moved the pow2 scale");
}

static void test_delayed_seeding_and_history(void) {
    Fp8TensorScaling s;
    fp8_scaling_init(&s, FP8_RECIPE_DELAYED, FP8_E4M3, 4, 0);
    CHECK(fp8_scaling_casts_after_update(&s), "a delayed tensor never updated must seed (cast after its update)");
    fp8_scaling_update(&s, 8.0f);
    CHECK(s.scale == FP8_E4M3_MAX / 8.0f, "seeding: the first scale %g is not from the first amax", s.scale);
    CHECK(!fp8_scaling_casts_after_update(&s), "after seeding, a delayed tensor must cast before its update");
    // history 4: 8 stays the max for 3 more updates, then falls out of the ring
    const float next[] = {1.0f, 1.0f, 1.0f, 1.0f, 2.0f};
    const float expected_max[] = {8.0f, 8.0f, 8.0f, 1.0f, 2.0f};
    for (int i = 0; i < 5; i++) {
        fp8_scaling_update(&s, next[i]);
        CHECK(s.scale == FP8_E4M3_MAX / expected_max[i], "update %d: scale %g, expected 448/%g (ring of 4)", i + 1,
              s.scale, expected_max[i]);
    }
    CHECK(s.recorded == 6 && s.position == 2, "ring bookkeeping: recorded %d position %d, expected 6 and 2",
          s.recorded, s.position);
    // a full ring wraps many times and stays bounded to its length
    for (int i = 0; i < 1000; i++) { fp8_scaling_update(&s, (float)(i % 7) + 1.0f); }
    // the last 4 amaxes were (996..999 % 7) + 1 = 3, 4, 5, 6
    CHECK(fp8_scaling_history_max(&s) == 6.0f && s.position == (6 + 1000) % 4, "after 1000 updates: max %g position %d",
          fp8_scaling_history_max(&s), s.position);
    // history length 1: delayed = the previous use's amax
    Fp8TensorScaling one;
    fp8_scaling_init(&one, FP8_RECIPE_DELAYED, FP8_E4M3, 1, 0);
    fp8_scaling_update(&one, 5.0f);
    fp8_scaling_update(&one, 0.25f);
    CHECK(one.scale == FP8_E4M3_MAX / 0.25f, "history of 1 does not forget the older amax");
    // the longest history
    Fp8TensorScaling longest;
    fp8_scaling_init(&longest, FP8_RECIPE_DELAYED, FP8_E4M3, FP8_AMAX_HISTORY_MAX, 0);
    fp8_scaling_update(&longest, 100.0f);
    for (int i = 0; i < FP8_AMAX_HISTORY_MAX - 1; i++) { fp8_scaling_update(&longest, 1.0f); }
    CHECK(longest.scale == FP8_E4M3_MAX / 100.0f, "history 1024 forgot its first amax too early");
    fp8_scaling_update(&longest, 1.0f);
    CHECK(longest.scale == FP8_E4M3_MAX, "history 1024 did not forget its first amax after 1024 more");
}

static void test_margin(void) {
    Fp8TensorScaling a, b;
    fp8_scaling_init(&a, FP8_RECIPE_DELAYED, FP8_E4M3, 16, 0);
    fp8_scaling_init(&b, FP8_RECIPE_DELAYED, FP8_E4M3, 16, 2);
    fp8_scaling_update(&a, 3.0f);
    fp8_scaling_update(&b, 3.0f);
    CHECK(b.scale * 4.0f == a.scale && b.scale_inv == a.scale_inv * 4.0f, "margin 2 does not divide the scale by 4 exactly");
    // with margin 2 an amax 4x larger than the history still does not saturate
    CHECK(fp8_classify(12.0f, b.scale, fp8_quantize(12.0f, b.scale, FP8_E4M3), FP8_E4M3) == FP8_ELEMENT_REPRESENTED,
          "margin 2 saturates 4x the recorded amax");
}

static void test_nonfinite_amax(void) {
    Fp8TensorScaling s;
    fp8_scaling_init(&s, FP8_RECIPE_DELAYED, FP8_E4M3, 4, 0);
    fp8_scaling_update(&s, 2.0f);
    float scale_before = s.scale;
    const float bad[] = {INFINITY, -INFINITY, NAN};
    for (int i = 0; i < 3; i++) {
        fp8_scaling_update(&s, bad[i]);
        CHECK(s.scale == scale_before && s.scale_inv == 1.0f / scale_before, "non-finite amax %g changed the scale", bad[i]);
        CHECK(isfinite(fp8_scaling_history_max(&s)), "non-finite amax %g entered the history", bad[i]);
    }
    CHECK(s.nonfinite_count == 3 && s.recorded == 1, "counters: nonfinite %d recorded %d, expected 3 and 1",
          s.nonfinite_count, s.recorded);
    CHECK(isnan(s.last_amax), "last_amax does not show the NaN for the log");
    fp8_scaling_update(&s, 4.0f);
    CHECK(s.scale == FP8_E4M3_MAX / 4.0f, "the scale did not recover after the non-finite amaxes");
    // current recipe: same rule
    Fp8TensorScaling c;
    fp8_scaling_init(&c, FP8_RECIPE_CURRENT, FP8_E5M2, 16, 0);
    fp8_scaling_update(&c, 1.0f);
    fp8_scaling_update(&c, NAN);
    CHECK(c.scale == FP8_E5M2_MAX && c.nonfinite_count == 1, "current recipe: NaN amax changed the scale");
    // a NaN on the very first use records nothing: the next use seeds (current path) as a fresh tensor's does, also
    // after the skipped step's rollback, which keeps the non-finite count
    Fp8TensorScaling first, fresh;
    fp8_scaling_init(&first, FP8_RECIPE_DELAYED, FP8_E4M3, 16, 0);
    fresh = first;
    fp8_scaling_update(&first, NAN);
    CHECK(fp8_scaling_casts_after_update(&first) && !fp8_scaling_seeded(&first) && first.scale == 1.0f &&
          fp8_scaling_history_max(&first) == 0.0f, "a NaN first use: expected the seeding path still, scale 1");
    fp8_scaling_restore(&first, &fresh);
    CHECK(fp8_scaling_casts_after_update(&first) && first.nonfinite_count == 1, "a rolled-back NaN first use must seed next");
    fp8_scaling_update(&first, 2.0f);
    CHECK(first.scale == FP8_E4M3_MAX / 2.0f && fp8_scaling_seeded(&first) && !fp8_scaling_casts_after_update(&first),
          "after a NaN first use the next finite amax does not seed the scale");
    // amax = 0 is finite: recorded, huge but finite scale
    Fp8TensorScaling z;
    fp8_scaling_init(&z, FP8_RECIPE_DELAYED, FP8_E4M3, 16, 0);
    fp8_scaling_update(&z, 0.0f);
    CHECK(z.recorded == 1 && isfinite(z.scale) && z.scale == FP8_E4M3_MAX / 1e-12f && isfinite(z.scale_inv),
          "amax 0: scale %g (expected 448/1e-12, finite)", z.scale);
    CHECK(fp8_quantize(0.0f, z.scale, FP8_E4M3) == 0, "zero does not encode to zero under the amax-0 scale");
}

// the protocol end to end: seeding wastes no step, a jump saturates once and is adapted to
static void test_protocol_jump(void) {
    enum { N = 4096 };
    static float x[N];
    mt19937_state rng;
    manual_seed(&rng, 11);
    Fp8TensorScaling s;
    fp8_scaling_init(&s, FP8_RECIPE_DELAYED, FP8_E4M3, 16, 0);
    double sat[8];
    for (int step = 0; step < 8; step++) {
        float sigma = step == 5 ? 20.0f : 1.0f;  // a 20x jump at step 5
        normal_(x, N, 0.0f, sigma, &rng);
        Fp8CastStats stats = produce(&s, x, N, FP8_E4M3);
        sat[step] = fp8_cast_stats_fraction(stats.saturated, stats.elements);
        if (step == 0) {
            CHECK(stats.saturated == 0 && stats.scale == fp8_scale_from_amax(stats.amax, FP8_E4M3_MAX, 0),
                  "step 0 was not current-scaled (seeding): %llu saturated", (unsigned long long)stats.saturated);
        }
    }
    printf("protocol: fraction saturated per step %.4f %.4f %.4f %.4f %.4f %.4f %.4f %.4f\n", sat[0], sat[1], sat[2],
           sat[3], sat[4], sat[5], sat[6], sat[7]);
    CHECK(sat[5] > 0.5, "the 20x jump saturated only %.3f of the tensor", sat[5]);
    CHECK(sat[6] == 0.0 && sat[7] == 0.0, "the scale did not adapt after the jump (%.3f, %.3f saturated)", sat[6], sat[7]);
    CHECK(sat[1] < 0.01 && sat[4] < 0.01, "steady state saturates (%.4f, %.4f)", sat[1], sat[4]);
    // the same data under current scaling never saturates
    Fp8TensorScaling c;
    fp8_scaling_init(&c, FP8_RECIPE_CURRENT, FP8_E4M3, 16, 0);
    normal_(x, N, 0.0f, 20.0f, &rng);
    CHECK(produce(&c, x, N, FP8_E4M3).saturated == 0, "current scaling saturated");
    // cast statistics: flushes, and a NaN element shows in the amax
    Fp8CastStats stats = {0.0f, 1.0f, 0, 0, 0};
    fp8_cast_stats_add(&stats, 1e-4f, fp8_classify(1e-4f, 1.0f, fp8_quantize(1e-4f, 1.0f, FP8_E4M3), FP8_E4M3));
    fp8_cast_stats_add(&stats, NAN, fp8_classify(NAN, 1.0f, fp8_quantize(NAN, 1.0f, FP8_E4M3), FP8_E4M3));
    fp8_cast_stats_add(&stats, 3.0f, FP8_ELEMENT_REPRESENTED);
    CHECK(stats.flushed == 1 && stats.elements == 3 && isnan(stats.amax), "stats: flushed %llu amax %g",
          (unsigned long long)stats.flushed, stats.amax);
}

/*
A state read from a state file (fp8_scaling_loaded_error): every state a run can reach loads,
including the extreme scales (amax 0 clamped to 1e-12; a huge amax under the largest margin,
whose scale stops at 2^-126), and a subnormal scale is refused: its inverse rounds to +Inf, equal
to fp8_reciprocal's, and every dequantized code would be 0 * Inf = NaN.
*/
static void test_loaded_state_errors(void) {
    for (int format = 0; format < 2; format++) {
        Fp8Format f = format == 0 ? FP8_E4M3 : FP8_E5M2;
        Fp8TensorScaling fresh, s;
        fp8_scaling_init(&fresh, FP8_RECIPE_DELAYED, f, 4, FP8_MARGIN_MAX);
        s = fresh;
        CHECK(fp8_scaling_loaded_error(&s, &fresh) == NULL, "a fresh state is refused: %s", fp8_scaling_loaded_error(&s, &fresh));
        const float amaxes[] = {0.0f, 3.0e38f, 1.0f, 0.0f, 3.0e38f};
        for (size_t i = 0; i < sizeof(amaxes) / sizeof(amaxes[0]); i++) {
            fp8_scaling_update(&s, amaxes[i]);
            const char* error = fp8_scaling_loaded_error(&s, &fresh);
            CHECK(error == NULL, "format %d, after amax %g (scale %g): refused: %s", format, amaxes[i], s.scale, error);
        }
        s = fresh;
        s.scale = 1e-40f;
        s.scale_inv = fp8_reciprocal(s.scale);
        CHECK(isinf(s.scale_inv), "1/1e-40 = %g: expected +Inf in float", s.scale_inv);
        CHECK(fp8_scaling_loaded_error(&s, &fresh) != NULL, "format %d: a subnormal scale with an infinite inverse loads", format);
        s.scale = bits_as_float(0x00800000u);  // 2^-126, the smallest a run makes: normal, and so is 2^126
        s.scale_inv = fp8_reciprocal(s.scale);
        CHECK(fp8_scaling_loaded_error(&s, &fresh) == NULL, "format %d: the scale 2^-126 is refused", format);
        // another run's settings, a negative count, a recorded amax that is not one: each refused
        Fp8TensorScaling other_format, other_recipe, other_history, other_margin;
        fp8_scaling_init(&other_format, FP8_RECIPE_DELAYED, format == 0 ? FP8_E5M2 : FP8_E4M3, 4, FP8_MARGIN_MAX);
        fp8_scaling_init(&other_recipe, FP8_RECIPE_CURRENT, f, 4, FP8_MARGIN_MAX);
        fp8_scaling_init(&other_history, FP8_RECIPE_DELAYED, f, 5, FP8_MARGIN_MAX);
        fp8_scaling_init(&other_margin, FP8_RECIPE_DELAYED, f, 4, 0);
        const Fp8TensorScaling* others[4] = {&other_format, &other_recipe, &other_history, &other_margin};
        for (int k = 0; k < 4; k++) {
            CHECK(fp8_scaling_loaded_error(others[k], &fresh) != NULL, "format %d: a state of other settings (%d) loads",
                  format, k);
        }
        // a ring position one past the last slot is outside the history, whatever the count says
        s = fresh;
        s.position = s.history_len;
        s.recorded = s.history_len;
        const char* error = fp8_scaling_loaded_error(&s, &fresh);
        CHECK(error != NULL && strcmp(error, "its ring position lies outside its history") == 0,
              "format %d: position %d of a history of %d: %s", format, s.position, s.history_len, error ? error : "loads");
        s = fresh;
        s.nonfinite_count = -1;
        CHECK(fp8_scaling_loaded_error(&s, &fresh) != NULL, "format %d: a negative non-finite count loads", format);
        const float bad_amaxes[2] = {NAN, -1.0f};
        for (int k = 0; k < 2; k++) {
            s = fresh;
            fp8_scaling_update(&s, 2.0f);
            fp8_scaling_update(&s, 3.0f);
            CHECK(fp8_scaling_loaded_error(&s, &fresh) == NULL, "format %d: two updates' state is refused", format);
            s.amax_history[1] = bad_amaxes[k];
            CHECK(fp8_scaling_loaded_error(&s, &fresh) != NULL, "format %d: a recorded amax of %g loads", format,
                  bad_amaxes[k]);
            s.amax_history[1] = 3.0f;
            s.amax_history[2] = bad_amaxes[k];  // past the recorded part: never read as history
            CHECK(fp8_scaling_loaded_error(&s, &fresh) == NULL, "format %d: an unrecorded slot's %g is refused", format,
                  bad_amaxes[k]);
        }
    }
}

// the CPU reference's casts split among threads: merged statistics count every part's elements and take the
// largest amax (a NaN part's NaN, as the GPU's unsigned atomicMax of the bits does)
static void test_cast_stats_merge(void) {
    Fp8CastStats into = {1.0f, 2.0f, 10, 1, 2}, part = {4.0f, 2.0f, 5, 3, 0}, nan_part = {NAN, 2.0f, 1, 0, 0};
    fp8_cast_stats_merge(&into, &part);
    CHECK(into.amax == 4.0f && into.elements == 15 && into.saturated == 4 && into.flushed == 2,
          "merged: amax %g, %llu elements, %llu saturated, %llu flushed", into.amax, (unsigned long long)into.elements,
          (unsigned long long)into.saturated, (unsigned long long)into.flushed);
    Fp8CastStats smaller = {0.5f, 2.0f, 1, 0, 0};
    fp8_cast_stats_merge(&into, &smaller);
    CHECK(into.amax == 4.0f && into.elements == 16, "a smaller part's amax replaced the larger (%g)", into.amax);
    fp8_cast_stats_merge(&into, &nan_part);
    CHECK(isnan(into.amax), "a NaN part's amax was lost in the merge (%g)", into.amax);
}

static void test_config_errors(void) {
    CHECK(fp8_scaling_config_error(16, 0) == NULL, "the defaults are rejected");
    CHECK(fp8_scaling_config_error(1024, 16) == NULL && fp8_scaling_config_error(1, 0) == NULL, "the bounds are rejected");
    CHECK(fp8_scaling_config_error(0, 0) != NULL && fp8_scaling_config_error(1025, 0) != NULL, "bad history length accepted");
    CHECK(fp8_scaling_config_error(16, -1) != NULL && fp8_scaling_config_error(16, 17) != NULL, "bad margin accepted");
}

int main(void) {
    test_scale_formula();
    test_current_recipe();
    test_pow2_recipe();
    test_delayed_seeding_and_history();
    test_margin();
    test_nonfinite_amax();
    test_protocol_jump();
    test_config_errors();
    test_loaded_state_errors();
    test_cast_stats_merge();
    return test_summary("test_fp8_scaling");
}
