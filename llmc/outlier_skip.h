/*
outlier_skip.h: llm.c's -sl and -sg stability checks. An optimizer step whose loss (-sl) or
gradient norm (-sg) lies more than that many standard deviations above the mean of the
previous OUTLIER_WINDOW steps' values is skipped: the gradients are dropped, the weights and
the optimizer state stay as they were, as for a non-finite loss.

Why it is shaped so:
- A z-score against the window *before* this step's value. Scored against a window that holds
  it, one value can never score above sqrt(OUTLIER_WINDOW - 1), about 11.3, and a spike
  would widen the very spread it is measured with.
- Every finite value enters the window, skipped or not: the window follows what training
  sees, so a lasting change of level stops counting as an outlier once the window has taken
  it in, instead of skipping every step from then on. Non-finite values stay out (the
  non-finite policy skips those steps anyway, and one would poison the window's sums).
- No score until the window is full: the first OUTLIER_WINDOW steps of a run are never
  skipped for it.
- The windows are plain data, kept in the state file (an optional section: a checkpoint
  written without them resumes with empty windows), so a resumed run skips exactly the steps
  an uninterrupted one skips. So are the counts of skipped updates (any cause, non-finite
  included): a resumed run's lines count the whole run, as an uninterrupted one's do. The
  mean and variance are recomputed from the values in window order at each score, so they
  depend on the values alone, not on a running sum's history.
- Host only: both trainers, every rank alike (the loss and norm it sees are all-reduced).
*/
#ifndef LLMC_OUTLIER_SKIP_H
#define LLMC_OUTLIER_SKIP_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include "checkpoint.h"

#define OUTLIER_WINDOW 128

// the last OUTLIER_WINDOW finite values of one quantity, oldest at `next` once full
typedef struct {
    double values[OUTLIER_WINDOW];
    int32_t count;  // values held, up to OUTLIER_WINDOW
    int32_t next;   // where the next value goes
} OutlierWindow;

// how many standard deviations x lies above the window's mean; NAN until the window is full
// (or x is not finite); 0 when the window has no spread (all its values equal): no yardstick
static inline double outlier_zscore(const OutlierWindow* w, double x) {
    if (w->count < OUTLIER_WINDOW || !isfinite(x)) { return NAN; }
    double sum = 0.0;
    for (int i = 0; i < OUTLIER_WINDOW; i++) { sum += w->values[(w->next + i) % OUTLIER_WINDOW]; }
    double mean = sum / OUTLIER_WINDOW;
    double squares = 0.0;
    for (int i = 0; i < OUTLIER_WINDOW; i++) {
        double d = w->values[(w->next + i) % OUTLIER_WINDOW] - mean;
        squares += d * d;
    }
    double std_dev = sqrt(squares / OUTLIER_WINDOW);
    if (std_dev == 0.0) { return 0.0; }
    return (x - mean) / std_dev;
}

// x into the window, replacing the oldest value once it is full; a non-finite x is left out
static inline void outlier_window_add(OutlierWindow* w, double x) {
    if (!isfinite(x)) { return; }
    w->values[w->next] = x;
    w->next = (w->next + 1) % OUTLIER_WINDOW;
    if (w->count < OUTLIER_WINDOW) { w->count++; }
}

typedef enum { STEP_UPDATED, STEP_SKIPPED_NONFINITE, STEP_SKIPPED_LOSS_OUTLIER, STEP_SKIPPED_NORM_OUTLIER,
               NUM_STEP_OUTCOMES } StepOutcome;

// the checks of a run: the flags' thresholds (0: that check is off), the two windows, and the
// updates skipped so far by cause (skipped[STEP_UPDATED] stays 0)
typedef struct {
    float max_loss_z;  // -sl
    float max_norm_z;  // -sg
    OutlierWindow windows[2];  // the loss's, the gradient norm's
    int32_t skipped[NUM_STEP_OUTCOMES];
} OutlierSkip;

static inline void outlier_skip_init(OutlierSkip* s, float max_loss_z, float max_norm_z) {
    memset(s, 0, sizeof(*s));
    s->max_loss_z = max_loss_z;
    s->max_norm_z = max_norm_z;
}

static inline int outlier_skip_enabled(const OutlierSkip* s) { return s->max_loss_z > 0.0f || s->max_norm_z > 0.0f; }

/*
One optimizer step's verdict on its loss and gradient norm, before its update: skipped for a
non-finite value, else for a loss or norm z-score above its threshold (the loss's checked
first), else updated. Both values then enter their windows, and a skip its count. z_out (may
be NULL) receives the z-score that skipped the step, NAN otherwise. s may be NULL: only the
non-finite policy.
*/
static inline StepOutcome outlier_skip_judge(OutlierSkip* s, float loss, float grad_norm, double* z_out) {
    StepOutcome outcome = !isfinite(loss) || !isfinite(grad_norm) ? STEP_SKIPPED_NONFINITE : STEP_UPDATED;
    double z = NAN;
    if (s != NULL) {
        double loss_z = outlier_zscore(&s->windows[0], loss);
        double norm_z = outlier_zscore(&s->windows[1], grad_norm);
        if (outcome == STEP_UPDATED && s->max_loss_z > 0.0f && loss_z > s->max_loss_z) {
            outcome = STEP_SKIPPED_LOSS_OUTLIER;
            z = loss_z;
        } else if (outcome == STEP_UPDATED && s->max_norm_z > 0.0f && norm_z > s->max_norm_z) {
            outcome = STEP_SKIPPED_NORM_OUTLIER;
            z = norm_z;
        }
        outlier_window_add(&s->windows[0], loss);
        outlier_window_add(&s->windows[1], grad_norm);
        if (outcome != STEP_UPDATED) { s->skipped[outcome]++; }
    }
    if (z_out != NULL) { *z_out = z; }
    return outcome;
}

// the startup line of a run with a check on (nothing otherwise)
static inline void outlier_skip_print_settings(const OutlierSkip* s) {
    if (!outlier_skip_enabled(s)) { return; }
    char loss[32] = "off", norm[32] = "off";
    if (s->max_loss_z > 0.0f) { snprintf(loss, sizeof(loss), "%g", s->max_loss_z); }
    if (s->max_norm_z > 0.0f) { snprintf(norm, sizeof(norm), "%g", s->max_norm_z); }
    printf("outliers | skip an update whose loss (-sl %s) or gradient norm (-sg %s) lies that many standard deviations "
           "above the previous %d steps' mean\n", loss, norm, OUTLIER_WINDOW);
}

// how many of the run's steps skipped their update, of any cause
static inline int outlier_skip_total_skipped(const OutlierSkip* s) {
    return s->skipped[STEP_SKIPPED_NONFINITE] + s->skipped[STEP_SKIPPED_LOSS_OUTLIER] + s->skipped[STEP_SKIPPED_NORM_OUTLIER];
}

// the line a trainer prints when step `step` (1-based) skipped its update (judged by outlier_skip_judge)
static inline void outlier_skip_print(int step, StepOutcome outcome, float loss, float grad_norm, double z,
                                      const OutlierSkip* s) {
    int so_far = outlier_skip_total_skipped(s);
    if (outcome == STEP_SKIPPED_NONFINITE) {
        printf("step %d: non-finite %s (loss %f, norm %f): update skipped (%d so far)\n", step,
               isfinite(loss) ? "gradient norm" : "loss", loss, grad_norm, so_far);
    } else if (outcome == STEP_SKIPPED_LOSS_OUTLIER) {
        printf("step %d: loss %f is %.2f standard deviations above the last %d steps' mean (-sl %g): update skipped "
               "(%d so far)\n", step, loss, z, OUTLIER_WINDOW, s->max_loss_z, so_far);
    } else if (outcome == STEP_SKIPPED_NORM_OUTLIER) {
        printf("step %d: gradient norm %f is %.2f standard deviations above the last %d steps' mean (-sg %g): update "
               "skipped (%d so far)\n", step, grad_norm, z, OUTLIER_WINDOW, s->max_norm_z, so_far);
    }
}

// a run's last word on its skipped updates, by cause (nothing when none was skipped)
static inline void outlier_skip_print_summary(const OutlierSkip* s) {
    int total = outlier_skip_total_skipped(s);
    if (total == 0) { return; }
    printf("%d updates were skipped: %d for a non-finite loss or gradient norm, %d for a loss outlier (-sl), %d for a "
           "gradient norm outlier (-sg)\n", total, s->skipped[STEP_SKIPPED_NONFINITE],
           s->skipped[STEP_SKIPPED_LOSS_OUTLIER], s->skipped[STEP_SKIPPED_NORM_OUTLIER]);
}

// after the sections were read from state file `path`: dies, naming it, when the windows cannot be a window's (a
// corrupt or foreign file must not index past the ring) or a count of skipped updates is negative
static inline void outlier_skip_check_loaded(const OutlierSkip* s, const char* path) {
    for (int k = 0; k < 2; k++) {
        const OutlierWindow* w = &s->windows[k];
        int ok = w->count >= 0 && w->count <= OUTLIER_WINDOW && w->next >= 0 && w->next < OUTLIER_WINDOW &&
                 (w->count == OUTLIER_WINDOW || w->next == w->count);
        for (int i = 0; ok && i < w->count; i++) { ok = isfinite(w->values[i]); }
        if (!ok) {
            llm8_die("state file '%s': section 'outlier_windows' holds no valid %s window (count %d, next %d; expected "
                     "0..%d values, all finite)", path, k == 0 ? "loss" : "gradient norm", (int)w->count, (int)w->next,
                     OUTLIER_WINDOW);
        }
    }
    for (int outcome = 0; outcome < NUM_STEP_OUTCOMES; outcome++) {
        if (s->skipped[outcome] < 0 || (outcome == STEP_UPDATED && s->skipped[outcome] != 0)) {
            llm8_die("state file '%s': section 'skipped_updates' holds %d for outcome %d (expected counts >= 0, the "
                     "first 0)", path, (int)s->skipped[outcome], outcome);
        }
    }
}

// after a resume: says when -sl / -sg start from empty windows (the checkpoint was written without them)
static inline void outlier_skip_note_resume(const OutlierSkip* s, int step) {
    if (outlier_skip_enabled(s) && step > 0 && s->windows[0].count == 0 && s->windows[1].count == 0) {
        printf("note: the checkpoint of step %d has no -sl/-sg windows (written without them): the checks start "
               "%d steps from now\n", step, OUTLIER_WINDOW);
    }
}

/*
The state file sections, both optional: the windows, written when a check is on (a checkpoint
written without -sl/-sg resumes with empty windows), and the counts of skipped updates, written
once a step was skipped (one written before any resumes with none). A plain bf16 AdamW state
file of one rank whose run skipped nothing so stays llm.c's version 1. for_reading: both, for
the reader to fill where the file has them; else those this run writes. Returns how many.
*/
#define OUTLIER_SKIP_SECTIONS 2
static inline int outlier_skip_state_sections(OutlierSkip* s, int for_reading, StateSection sections[OUTLIER_SKIP_SECTIONS]) {
    int count = 0;
    if (for_reading || outlier_skip_enabled(s)) {
        StateSection windows = {"outlier_windows", s->windows, sizeof(s->windows), 1};
        sections[count++] = windows;
    }
    if (for_reading || outlier_skip_total_skipped(s) > 0) {
        StateSection skipped = {"skipped_updates", s->skipped, sizeof(s->skipped), 1};
        sections[count++] = skipped;
    }
    return count;
}

#endif // LLMC_OUTLIER_SKIP_H
