/*
schedulers.h: the learning rate at each step.

Why it is shaped this way: runs here are compared against llm.c runs and against each other
(bf16 vs fp8), so the schedules are llm.c's formulas, evaluated on the host in float:
- every schedule starts with a linear warmup: lr * (step + 1) / warmup for step < warmup
  (so step 0 already trains, at lr / warmup). llm.c skips warmup for "constant"; here it
  applies to all four, so the -u flag means the same thing whatever the schedule.
- cosine:   from lr at the end of warmup down to lr * final_frac at train_num_batches,
            along half a cosine.
- linear:   the same endpoints along a straight line.
- constant: lr after warmup.
- wsd:      warmup, then stable at lr, then over the last 20% of the steps a decay to
            lr * final_frac of the shape 1 - sqrt(progress) (Hägele et al. 2024,
            arXiv:2405.18392, as llm.c). The decay starts at max(0.8 * steps, warmup).
Past train_num_batches the decay stays at its end value instead of failing. A warmup longer
than the run (llm.c's scripts' -u 700 with a short -x) warms up throughout, as llm.c's
schedules do (but for its constant one, which never warms up), with a note saying so.
*/
#ifndef LLMC_SCHEDULERS_H
#define LLMC_SCHEDULERS_H

#include <math.h>
#include <string.h>
#include "utils.h"

typedef enum { LR_COSINE, LR_LINEAR, LR_CONSTANT, LR_WSD } LearningRateSchedule;

typedef struct {
    LearningRateSchedule schedule;
    float learning_rate;
    int warmup_iterations;
    int train_num_batches;
    float final_learning_rate_frac;
} LearningRateScheduler;

static inline void lr_scheduler_init(LearningRateScheduler* scheduler, const char* type, float learning_rate,
                                     int warmup_iterations, int train_num_batches, float final_learning_rate_frac) {
    if (strcmp(type, "cosine") == 0) { scheduler->schedule = LR_COSINE; }
    else if (strcmp(type, "linear") == 0) { scheduler->schedule = LR_LINEAR; }
    else if (strcmp(type, "constant") == 0) { scheduler->schedule = LR_CONSTANT; }
    else if (strcmp(type, "wsd") == 0) { scheduler->schedule = LR_WSD; }
    else { llm8_die("flag -k: learning rate schedule '%s' is unknown (expected cosine, linear, constant or wsd)", type); }
    if (!(learning_rate >= 0.0f)) { llm8_die("flag -l: learning rate %g must be non-negative", learning_rate); }
    if (train_num_batches < 0) { llm8_die("flag -x: %d steps is negative (-1 trains one epoch, 0 only evaluates)", train_num_batches); }
    if (warmup_iterations < 0) { llm8_die("flag -u: warmup of %d steps is negative", warmup_iterations); }
    if (train_num_batches > 0 && warmup_iterations > train_num_batches) {  // -x 0 asks for no rate
        printf("note: -u %d is longer than the run's %d steps (-x): the learning rate warms up throughout, to %d/%d of -l "
               "at the last step\n", warmup_iterations, train_num_batches, train_num_batches, warmup_iterations);
    }
    if (!(final_learning_rate_frac >= 0.0f && final_learning_rate_frac <= 1.0f)) {
        llm8_die("flag -q: final learning rate fraction %g is not in [0, 1]", final_learning_rate_frac);
    }
    scheduler->learning_rate = learning_rate;
    scheduler->warmup_iterations = warmup_iterations;
    scheduler->train_num_batches = train_num_batches;
    scheduler->final_learning_rate_frac = final_learning_rate_frac;
}

// fraction of the way from `start` to train_num_batches, clamped to [0, 1]
static inline float lr_scheduler_progress_(const LearningRateScheduler* scheduler, int start, int step) {
    int span = scheduler->train_num_batches - start;
    if (span <= 0) { return 1.0f; }
    float progress = (float)(step - start) / (float)span;
    return fminf(fmaxf(progress, 0.0f), 1.0f);
}

static inline float get_learning_rate(const LearningRateScheduler* scheduler, int step) {
    float max_lr = scheduler->learning_rate;
    float min_lr = max_lr * scheduler->final_learning_rate_frac;
    int warmup = scheduler->warmup_iterations;
    if (step < warmup) {  // llm.c's wsd takes the ratio first, its other schedules the product: each one's bits
        if (scheduler->schedule == LR_WSD) { return max_lr * ((float)(step + 1) / (float)warmup); }
        return max_lr * (float)(step + 1) / (float)warmup;
    }
    switch (scheduler->schedule) {
        case LR_COSINE: {
            // M_PI times the float progress in double, then rounded, as llm.c: the same bits at every step
            float coeff = 0.5f * (1.0f + cosf(M_PI * lr_scheduler_progress_(scheduler, warmup, step)));
            return min_lr + coeff * (max_lr - min_lr);
        }
        case LR_LINEAR:
            return max_lr - lr_scheduler_progress_(scheduler, warmup, step) * (max_lr - min_lr);
        case LR_CONSTANT:
            return max_lr;
        case LR_WSD: {
            int decay_start = (int)(0.8f * (float)scheduler->train_num_batches);
            if (decay_start < warmup) { decay_start = warmup; }
            if (step < decay_start) { return max_lr; }
            float progress = lr_scheduler_progress_(scheduler, decay_start, step);
            return min_lr + (1.0f - sqrtf(progress)) * (max_lr - min_lr);
        }
    }
    return max_lr; // unreachable: init accepts only the four schedules
}

#endif // LLMC_SCHEDULERS_H
