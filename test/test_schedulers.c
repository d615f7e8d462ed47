/*
test_schedulers.c: learning-rate schedules at their key steps, computed independently here
in double from the formulas documented in llmc/schedulers.h, plus bad arguments and the edges
of each argument's range; cosine and wsd bit for bit against llm.c's formulas; the note of a
warmup longer than the run.
*/
#include <stdio.h>
#include <math.h>
#include <string.h>
#include "test/test_harness.h"
#include "test/test_harness_fork.h"
#include "llmc/schedulers.h"

#define LR 6e-4
#define WARMUP 10
#define STEPS 100
#define FRAC 0.1

static double min_lr(void) { return LR * FRAC; }

static void check_lr(const LearningRateScheduler* s, const char* type, int step, double want) {
    char what[128];
    snprintf(what, sizeof(what), "%s lr at step %d", type, step);
    CHECK_CLOSE(get_learning_rate(s, step), want, 1e-9, 1e-5, what);
}

static void check_warmup(const LearningRateScheduler* s, const char* type) {
    check_lr(s, type, 0, LR / WARMUP);           // step 0 already trains, at lr / warmup
    check_lr(s, type, 4, LR * 5 / WARMUP);
    check_lr(s, type, WARMUP - 1, LR);           // the last warmup step reaches lr
}

static void test_cosine(void) {
    LearningRateScheduler s;
    lr_scheduler_init(&s, "cosine", (float)LR, WARMUP, STEPS, (float)FRAC);
    check_warmup(&s, "cosine");
    check_lr(&s, "cosine", WARMUP, LR);
    check_lr(&s, "cosine", 55, min_lr() + 0.5 * (LR - min_lr()));                          // half way: the middle
    check_lr(&s, "cosine", 32, min_lr() + 0.5 * (1.0 + cos(M_PI * 22.0 / 90.0)) * (LR - min_lr()));
    check_lr(&s, "cosine", STEPS, min_lr());
    check_lr(&s, "cosine", STEPS + 50, min_lr());                                          // clamped past the end
    int monotone = 1;
    for (int step = WARMUP + 1; step <= STEPS; step++) {
        monotone &= get_learning_rate(&s, step) <= get_learning_rate(&s, step - 1);
    }
    CHECK(monotone, "cosine must not increase after warmup");
}

static void test_linear(void) {
    LearningRateScheduler s;
    lr_scheduler_init(&s, "linear", (float)LR, WARMUP, STEPS, (float)FRAC);
    check_warmup(&s, "linear");
    check_lr(&s, "linear", WARMUP, LR);
    check_lr(&s, "linear", 55, LR - 0.5 * (LR - min_lr()));
    check_lr(&s, "linear", 28, LR - 0.2 * (LR - min_lr()));
    check_lr(&s, "linear", STEPS, min_lr());
    check_lr(&s, "linear", STEPS + 1, min_lr());
}

static void test_constant(void) {
    LearningRateScheduler s;
    lr_scheduler_init(&s, "constant", (float)LR, WARMUP, STEPS, (float)FRAC);
    check_warmup(&s, "constant");
    check_lr(&s, "constant", WARMUP, LR);
    check_lr(&s, "constant", STEPS - 1, LR);
    check_lr(&s, "constant", STEPS * 3, LR);
}

static void test_wsd(void) {
    LearningRateScheduler s;
    lr_scheduler_init(&s, "wsd", (float)LR, WARMUP, STEPS, (float)FRAC);
    check_warmup(&s, "wsd");
    check_lr(&s, "wsd", WARMUP, LR);
    check_lr(&s, "wsd", 79, LR);                                                // stable until 80% of the steps
    check_lr(&s, "wsd", 80, LR);                                                // decay starts at full lr
    check_lr(&s, "wsd", 85, min_lr() + (1.0 - sqrt(0.25)) * (LR - min_lr()));
    check_lr(&s, "wsd", 90, min_lr() + (1.0 - sqrt(0.5)) * (LR - min_lr()));
    check_lr(&s, "wsd", STEPS, min_lr());
    check_lr(&s, "wsd", STEPS + 7, min_lr());
    // a warmup longer than the stable phase: decay starts right after warmup
    LearningRateScheduler late;
    lr_scheduler_init(&late, "wsd", (float)LR, 90, STEPS, 0.0f);
    check_lr(&late, "wsd (warmup 90)", 89, LR);
    check_lr(&late, "wsd (warmup 90)", 90, LR);
    check_lr(&late, "wsd (warmup 90)", 95, (1.0 - sqrt(0.5)) * LR);
}

static void test_no_warmup(void) {
    LearningRateScheduler s;
    lr_scheduler_init(&s, "cosine", (float)LR, 0, STEPS, 0.0f);
    check_lr(&s, "cosine (no warmup)", 0, LR);
    check_lr(&s, "cosine (no warmup)", 50, 0.5 * LR);
    check_lr(&s, "cosine (no warmup)", STEPS, 0.0);
    lr_scheduler_init(&s, "linear", (float)LR, STEPS, STEPS, 0.0f);  // all warmup: never divides by zero
    check_lr(&s, "linear (all warmup)", STEPS - 1, LR);
    check_lr(&s, "linear (all warmup)", STEPS, 0.0);
    lr_scheduler_init(&s, "cosine", (float)LR, 2 * STEPS, STEPS, 0.0f);  // longer than the run: warms up throughout, as llm.c
    check_lr(&s, "cosine (warmup longer than the run)", STEPS - 1, LR * STEPS / (2 * STEPS));
}

static void test_bad_arguments(void) {
    LearningRateScheduler s;
    CHECK_DIES("unknown schedule (name)", "'cosin'", lr_scheduler_init(&s, "cosin", 1e-3f, 0, 10, 0.0f));
    CHECK_DIES("unknown schedule (choices)", "cosine, linear, constant or wsd",
               lr_scheduler_init(&s, "step", 1e-3f, 0, 10, 0.0f));
    CHECK_DIES("negative warmup", "warmup of -1", lr_scheduler_init(&s, "cosine", 1e-3f, -1, 10, 0.0f));
    CHECK_DIES("negative steps", "-2 steps is negative", lr_scheduler_init(&s, "cosine", 1e-3f, 0, -2, 0.0f));
    CHECK_DIES("final fraction above 1", "fraction 1.5", lr_scheduler_init(&s, "cosine", 1e-3f, 0, 10, 1.5f));
    CHECK_DIES("negative learning rate", "learning rate -0.001", lr_scheduler_init(&s, "cosine", -1e-3f, 0, 10, 0.0f));
}

/*
llm.c's schedules, their formulas written out as llm.c's schedulers.h evaluates them (float
ratios, the cosine's M_PI times the ratio in double then cosf; wsd's decay from
(int)(0.8f * steps), its rate at that step min_lr + (1 - sqrtf(0)) * (lr - min_lr), not lr), for
the run scripts' settings (-l -u -x -q of scripts/run_gpt2_{124M,350M,774M,1558M}_*.sh, as
llm.c's) and others: the same bits at every step, so a reproduction's learning rates are llm.c's,
not a float rounding away.
*/
static float llmc_cosine(float lr, int warmup, int steps, float final_frac, int step) {
    if (step < warmup) { return lr * ((float)(step + 1)) / warmup; }
    float decay_ratio = ((float)(step - warmup)) / (steps - warmup);
    float coeff = 0.5f * (1.0f + cosf(M_PI * decay_ratio));
    float min_lr = lr * final_frac;
    return min_lr + coeff * (lr - min_lr);
}

static float llmc_wsd(float lr, int warmup, int steps, float final_frac, int step) {
    int decay_point = (int)(0.8f * steps);
    if (step < warmup) {  // the ratio first, where cosine multiplies first
        float warmup_ratio = ((float)(step + 1)) / warmup;
        return lr * warmup_ratio;
    }
    if (step < decay_point) { return lr; }
    float decay_ratio = ((float)(step - decay_point)) / (steps - decay_point);
    float min_lr = lr * final_frac;
    return min_lr + (1.0f - sqrtf(decay_ratio)) * (lr - min_lr);
}

typedef struct { float lr; int warmup, steps; float frac; int first, last; } LlmcRun;  // steps first..last compared

static void check_bits_are_llmcs(const char* type, float (*llmc)(float, int, int, float, int), const LlmcRun* runs,
                                 int count) {
    for (int r = 0; r < count; r++) {
        LearningRateScheduler s;
        lr_scheduler_init(&s, type, runs[r].lr, runs[r].warmup, runs[r].steps, runs[r].frac);
        int differing = 0;
        for (int step = runs[r].first; step <= runs[r].last; step++) {
            float ours = get_learning_rate(&s, step);
            float want = llmc(runs[r].lr, runs[r].warmup, runs[r].steps, runs[r].frac, step);
            differing += memcmp(&ours, &want, sizeof(float)) != 0;
        }
        CHECK(differing == 0, "%s -l %g -u %d -x %d -q %g: %d of steps %d..%d's rates differ from llm.c's bits", type,
              runs[r].lr, runs[r].warmup, runs[r].steps, runs[r].frac, differing, runs[r].first, runs[r].last);
    }
}

static void test_cosine_bits_are_llmcs(void) {
    const LlmcRun runs[] = {{6e-4f, 700, 18865, 0.0f, 0, 18865}, {3e-4f, 700, 60000, 0.0f, 0, 60000},
                            {2.5e-4f, 700, 286102, 0.0f, 0, 286102}, {6e-4f, 700, 32000, 0.1f, 0, 32000}};
    check_bits_are_llmcs("cosine", llmc_cosine, runs, 4);
}

// wsd where the warmup ends before the decay (llm8 starts a later decay after the warmup instead), with
// 0.8 * steps not a whole number (101: decay from step 80, not 81), a fraction whose min_lr + (lr - min_lr)
// rounds below lr (0.023 of 1e-3: the decay's first step is not lr), and 12345678 steps, where 0.8f * steps in
// float is 9876543 and 0.8 * steps in double 9876542 (the steps around it); -u 5 at 6e-4, whose warmup step 2
// is 3.60000035e-4 with llm.c's ratio first and 3.60000005e-4 with the product first
static void test_wsd_bits_are_llmcs(void) {
    const LlmcRun runs[] = {{6e-4f, 700, 18865, 0.0f, 0, 18865}, {6e-4f, 10, 101, 0.1f, 0, 101},
                            {1e-3f, 10, 101, 0.023f, 0, 101}, {6e-4f, 700, 12345678, 0.0f, 9876540, 9876546},
                            {6e-4f, 5, 7, 0.0f, 0, 7}};
    check_bits_are_llmcs("wsd", llmc_wsd, runs, 5);
}

// the edges of each argument's range are accepted, a step count of -1 is for the caller to resolve (one epoch),
// and a NaN is no rate
static void test_argument_edges(void) {
    LearningRateScheduler s;
    CHECK_LIVES("learning rate 0", lr_scheduler_init(&s, "cosine", 0.0f, 0, 10, 0.0f));
    CHECK_LIVES("final fraction 1", lr_scheduler_init(&s, "cosine", 1e-3f, 0, 10, 1.0f));
    CHECK_DIES("NaN learning rate", "learning rate nan", lr_scheduler_init(&s, "cosine", NAN, 0, 10, 0.0f));
    CHECK_DIES("-1 steps (one epoch, unresolved)", "-1 steps is negative", lr_scheduler_init(&s, "cosine", 1e-3f, 0, -1, 0.0f));
    CHECK_DIES("negative final fraction", "fraction -0.5", lr_scheduler_init(&s, "cosine", 1e-3f, 0, 10, -0.5f));
}

// the note of a warmup longer than the run: what it says, and none for a warmup as long as the run or for -x 0
static void check_init_prints(int warmup, int steps, const char* want) {
    char text[512];
    LearningRateScheduler s;
    STDOUT_OF(text, lr_scheduler_init(&s, "cosine", 1e-3f, warmup, steps, 0.0f));
    CHECK(strcmp(text, want) == 0, "-u %d -x %d: init printed [%s], expected [%s]", warmup, steps, text, want);
}

static void test_long_warmup_note(void) {
    check_init_prints(200, 100, "note: -u 200 is longer than the run's 100 steps (-x): the learning rate warms up throughout, "
                                "to 100/200 of -l at the last step\n");
    check_init_prints(100, 100, "");
    check_init_prints(5, 0, "");
}

int main(void) {
    test_cosine();
    test_cosine_bits_are_llmcs();
    test_linear();
    test_constant();
    test_wsd();
    test_no_warmup();
    test_bad_arguments();
    test_wsd_bits_are_llmcs();
    test_argument_edges();
    test_long_warmup_note();
    return test_summary("test_schedulers");
}
