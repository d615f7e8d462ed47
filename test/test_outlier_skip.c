/*
test_outlier_skip.c: the -sl / -sg checks of llmc/outlier_skip.h. z-scores against a mean and
standard deviation computed here independently (in long double, over the values the window
must hold), the window's ring order, what enters it, the verdicts and their order, and the
state section.
*/
#include <stdio.h>
#include <math.h>
#include <string.h>
#include "test/test_harness.h"
#include "test/test_harness_fork.h"
#include "llmc/outlier_skip.h"

// the z-score of x against values[0..n) (population standard deviation), computed directly
static double direct_zscore(const double* values, int n, double x) {
    long double sum = 0.0L, squares = 0.0L;
    for (int i = 0; i < n; i++) { sum += values[i]; }
    long double mean = sum / n;
    for (int i = 0; i < n; i++) { squares += (values[i] - mean) * (values[i] - mean); }
    return (double)((x - mean) / sqrtl(squares / n));
}

static void test_zscore_and_window(void) {
    OutlierWindow w;
    memset(&w, 0, sizeof(w));
    double history[OUTLIER_WINDOW + 40];
    for (int i = 0; i < OUTLIER_WINDOW + 40; i++) { history[i] = 3.0 + 0.01 * i + 0.5 * sin(0.7 * i); }
    for (int i = 0; i < OUTLIER_WINDOW; i++) {
        CHECK(isnan(outlier_zscore(&w, 10.0)), "a z-score with %d of %d values in the window", i, OUTLIER_WINDOW);
        outlier_window_add(&w, history[i]);
    }
    CHECK(w.count == OUTLIER_WINDOW && w.next == 0, "full window: count %d next %d", w.count, w.next);
    double z = outlier_zscore(&w, 6.0);
    CHECK_CLOSE(z, direct_zscore(history, OUTLIER_WINDOW, 6.0), 1e-12, 1e-12, "z-score of a full window");
    // 40 more: the oldest 40 leave, in order
    for (int i = OUTLIER_WINDOW; i < OUTLIER_WINDOW + 40; i++) { outlier_window_add(&w, history[i]); }
    CHECK(w.count == OUTLIER_WINDOW && w.next == 40, "after wrapping: count %d next %d", w.count, w.next);
    CHECK_CLOSE(outlier_zscore(&w, 6.0), direct_zscore(history + 40, OUTLIER_WINDOW, 6.0), 1e-12, 1e-12,
                "z-score after the window moved on by 40");
    CHECK(outlier_zscore(&w, 1.0) < 0.0, "a value below the mean scores negative");
    // non-finite values neither score nor enter
    OutlierWindow before = w;
    outlier_window_add(&w, NAN);
    outlier_window_add(&w, INFINITY);
    CHECK(memcmp(&before, &w, sizeof(w)) == 0, "a non-finite value entered the window");
    CHECK(isnan(outlier_zscore(&w, NAN)) && isnan(outlier_zscore(&w, INFINITY)), "a non-finite value has a z-score");
    // no spread: no verdict
    OutlierWindow flat;
    memset(&flat, 0, sizeof(flat));
    for (int i = 0; i < OUTLIER_WINDOW; i++) { outlier_window_add(&flat, 2.5); }
    CHECK(outlier_zscore(&flat, 1e9) == 0.0, "a window without spread scored %g", outlier_zscore(&flat, 1e9));
}

// a skip outcome and the windows' counts after one judgement
static void check_judge(OutlierSkip* s, float loss, float norm, StepOutcome want, const char* what) {
    int loss_count = s->windows[0].count, norm_count = s->windows[1].count;
    double z;
    StepOutcome got = outlier_skip_judge(s, loss, norm, &z);
    CHECK(got == want, "%s: outcome %d, expected %d", what, (int)got, (int)want);
    CHECK((want == STEP_SKIPPED_LOSS_OUTLIER || want == STEP_SKIPPED_NORM_OUTLIER) == !isnan(z),
          "%s: z %g for outcome %d", what, z, (int)got);
    int want_loss = loss_count + (isfinite(loss) && loss_count < OUTLIER_WINDOW);
    int want_norm = norm_count + (isfinite(norm) && norm_count < OUTLIER_WINDOW);
    CHECK(s->windows[0].count == want_loss && s->windows[1].count == want_norm,
          "%s: windows hold %d and %d values, expected %d and %d (every finite value enters, skipped or not)", what,
          s->windows[0].count, s->windows[1].count, want_loss, want_norm);
}

static void fill(OutlierSkip* s) {
    for (int i = 0; i < OUTLIER_WINDOW; i++) {
        double z;
        StepOutcome o = outlier_skip_judge(s, 2.0f + 0.01f * (float)(i % 7), 1.0f + 0.02f * (float)(i % 5), &z);
        CHECK(o == STEP_UPDATED, "step %d before the window is full was skipped (%d)", i, (int)o);
    }
}

static void test_verdicts(void) {
    OutlierSkip s;
    outlier_skip_init(&s, 3.0f, 3.0f);
    CHECK(outlier_skip_enabled(&s), "-sl 3 -sg 3: not enabled");
    check_judge(&s, 100.0f, 100.0f, STEP_UPDATED, "an empty window: no verdict on a spike");
    memset(s.windows, 0, sizeof(s.windows));
    fill(&s);
    check_judge(&s, NAN, NAN, STEP_SKIPPED_NONFINITE, "a non-finite loss");
    check_judge(&s, 2.03f, INFINITY, STEP_SKIPPED_NONFINITE, "a non-finite norm");
    check_judge(&s, 2.03f, 1.04f, STEP_UPDATED, "values inside the window's range");
    check_judge(&s, 50.0f, 50.0f, STEP_SKIPPED_LOSS_OUTLIER, "both spike: the loss check comes first");
    check_judge(&s, 2.03f, 50.0f, STEP_SKIPPED_NORM_OUTLIER, "a norm spike");
    // at the threshold: not above it
    OutlierSkip edge;
    outlier_skip_init(&edge, 3.0f, 0.0f);
    fill(&edge);
    double z_at = outlier_zscore(&edge.windows[0], 0.0);
    double mean = 0.0;  // the loss whose z-score is exactly 3: mean + 3 sd, found by the line through z(0) and z(mean)
    for (int i = 0; i < OUTLIER_WINDOW; i++) { mean += edge.windows[0].values[i]; }
    mean /= OUTLIER_WINDOW;
    double sd = -mean / z_at;
    float above = (float)(mean + 3.5 * sd), below = (float)(mean + 2.5 * sd);
    check_judge(&edge, below, 1.0f, STEP_UPDATED, "z 2.5 under -sl 3");
    check_judge(&edge, above, 1e6f, STEP_SKIPPED_LOSS_OUTLIER, "z 3.5 under -sl 3 (-sg off: the norm is not judged)");
    // checks off: only the non-finite policy
    OutlierSkip off;
    outlier_skip_init(&off, 0.0f, 0.0f);
    CHECK(!outlier_skip_enabled(&off), "-sl 0 -sg 0: enabled");
    fill(&off);
    check_judge(&off, 1e6f, 1e6f, STEP_UPDATED, "checks off: a spike updates");
    check_judge(&off, NAN, 1.0f, STEP_SKIPPED_NONFINITE, "checks off: a non-finite loss");
    double z;
    CHECK(outlier_skip_judge(NULL, 1.0f, NAN, &z) == STEP_SKIPPED_NONFINITE && isnan(z) &&
          outlier_skip_judge(NULL, 1.0f, 2.0f, &z) == STEP_UPDATED, "no checks (NULL): the non-finite policy alone");
}

static void test_state_section(void) {
    OutlierSkip s;
    outlier_skip_init(&s, 2.0f, 0.0f);
    StateSection sections[OUTLIER_SKIP_SECTIONS];
    CHECK(outlier_skip_state_sections(&s, 1, sections) == 2 && strcmp(sections[0].tag, "outlier_windows") == 0 &&
          sections[0].data == (void*)s.windows && sections[0].bytes == sizeof(s.windows) && sections[0].optional &&
          strcmp(sections[1].tag, "skipped_updates") == 0 && sections[1].data == (void*)s.skipped &&
          sections[1].bytes == sizeof(s.skipped) && sections[1].optional, "the state sections: tags, data, sizes, optional");
    // written: the windows with a check on, the counts once a step was skipped
    CHECK(outlier_skip_state_sections(&s, 0, sections) == 1 && sections[0].data == (void*)s.windows, "-sl on, nothing skipped");
    OutlierSkip off;
    outlier_skip_init(&off, 0.0f, 0.0f);
    CHECK(outlier_skip_state_sections(&off, 0, sections) == 0, "checks off, nothing skipped: no section (llm.c's version 1)");
    // read: both, with the checks off too (a run resumed without -sl/-sg still takes the checkpoint's windows and counts)
    CHECK(outlier_skip_state_sections(&off, 1, sections) == 2 && strcmp(sections[0].tag, "outlier_windows") == 0 &&
          strcmp(sections[1].tag, "skipped_updates") == 0, "checks off, reading: both sections");
    double z;
    CHECK(outlier_skip_judge(&off, NAN, 1.0f, &z) == STEP_SKIPPED_NONFINITE && off.skipped[STEP_SKIPPED_NONFINITE] == 1 &&
          outlier_skip_total_skipped(&off) == 1, "a skip is counted");
    CHECK(outlier_skip_state_sections(&off, 0, sections) == 1 && sections[0].data == (void*)off.skipped,
          "checks off, a step skipped: the counts");
    CHECK(sizeof(s.windows) == 2 * (OUTLIER_WINDOW * sizeof(double) + 2 * sizeof(int32_t)),
          "the windows' bytes (%zu) are not the packed layout the state file keeps", sizeof(s.windows));
}

// windows read from a file: a valid one passes, one that would index past the ring or hold a NaN is named
static void test_loaded_windows_checked(void) {
    OutlierSkip s;
    outlier_skip_init(&s, 3.0f, 0.0f);
    outlier_skip_check_loaded(&s, "empty.bin");  // empty windows: valid
    fill(&s);
    outlier_skip_check_loaded(&s, "full.bin");
    OutlierSkip bad = s;
    bad.windows[1].count = 1000;
    CHECK_DIES("a count past the window", "gradient norm window (count 1000", outlier_skip_check_loaded(&bad, "state_x.bin"));
    bad = s;
    bad.windows[0].next = -3;
    CHECK_DIES("a negative position", "state_x.bin", outlier_skip_check_loaded(&bad, "state_x.bin"));
    bad = s;
    bad.windows[0].count = 5;  // filling: the next value goes at `count`
    bad.windows[0].next = 9;
    CHECK_DIES("a filling window whose next is not its count", "loss window (count 5, next 9", outlier_skip_check_loaded(&bad, "s.bin"));
    bad = s;
    bad.windows[0].values[7] = NAN;
    CHECK_DIES("a NaN in the window", "all finite", outlier_skip_check_loaded(&bad, "s.bin"));
    bad = s;
    bad.skipped[STEP_SKIPPED_LOSS_OUTLIER] = -2;
    CHECK_DIES("a negative count of skips", "section 'skipped_updates' holds -2", outlier_skip_check_loaded(&bad, "s.bin"));
}

// edges the tests above do not reach (found by mutation testing)

// a window of 64 zeros and 64 twos has mean 1 and standard deviation 1 exactly, so 4 scores z = 3
// exactly: at -sl 3 / -sg 3 that is not above the threshold. Catches > turned into >=.
static void fill_exact(OutlierSkip* s) {
    for (int i = 0; i < OUTLIER_WINDOW; i++) {
        float v = (i % 2) ? 2.0f : 0.0f;
        outlier_skip_judge(s, v, v, NULL);
    }
}
static void test_exact_threshold(void) {
    OutlierSkip s;
    outlier_skip_init(&s, 3.0f, 0.0f);
    fill_exact(&s);
    CHECK(outlier_zscore(&s.windows[0], 4.0) == 3.0, "the exact window scores 4 at %.17g, expected 3",
          outlier_zscore(&s.windows[0], 4.0));
    check_judge(&s, 4.0f, 1.0f, STEP_UPDATED, "loss z exactly 3 under -sl 3");
    outlier_skip_init(&s, 0.0f, 3.0f);
    fill_exact(&s);
    check_judge(&s, 1.0f, 4.0f, STEP_UPDATED, "norm z exactly 3 under -sg 3");
    // -sg alone is a check: enabled (its windows are written, its note printed)
    CHECK(outlier_skip_enabled(&s), "-sl 0 -sg 3: not enabled");
}

// a skipped step's loss and norm enter the windows as the newest values (the count alone cannot show it
// once the window is full). Catches a skipped step's values left out of the windows.
static void test_skipped_values_enter(void) {
    OutlierSkip s;
    outlier_skip_init(&s, 3.0f, 3.0f);
    fill(&s);
    check_judge(&s, 50.0f, 1.0f, STEP_SKIPPED_LOSS_OUTLIER, "a loss spike");
    check_judge(&s, 2.0f, 60.0f, STEP_SKIPPED_NORM_OUTLIER, "a norm spike");
    const OutlierWindow* loss = &s.windows[0];
    const OutlierWindow* norm = &s.windows[1];
    CHECK(loss->next == 2 && loss->values[0] == 50.0 && loss->values[1] == 2.0,
          "the skipped steps' losses are not the window's newest (next %d: %g %g)", loss->next, loss->values[0],
          loss->values[1]);
    CHECK(norm->next == 2 && norm->values[0] == 1.0 && norm->values[1] == 60.0,
          "the skipped steps' norms are not the window's newest (next %d: %g %g)", norm->next, norm->values[0],
          norm->values[1]);
    // every cause counts in the total. Catches a total that leaves one cause out
    check_judge(&s, NAN, 1.0f, STEP_SKIPPED_NONFINITE, "a non-finite loss");
    CHECK(outlier_skip_total_skipped(&s) == 3 && s.skipped[STEP_SKIPPED_LOSS_OUTLIER] == 1 &&
          s.skipped[STEP_SKIPPED_NORM_OUTLIER] == 1 && s.skipped[STEP_SKIPPED_NONFINITE] == 1,
          "skipped: total %d (loss %d, norm %d, non-finite %d), expected 3 (1 each)", outlier_skip_total_skipped(&s),
          s.skipped[STEP_SKIPPED_LOSS_OUTLIER], s.skipped[STEP_SKIPPED_NORM_OUTLIER], s.skipped[STEP_SKIPPED_NONFINITE]);
}

// loaded windows at the edges of the ring. Catches next == OUTLIER_WINDOW accepted (the next add would
// write past the ring), the finite scan stopping before the last slot, and a nonzero count of updates
static void test_loaded_windows_edges(void) {
    OutlierSkip s;
    outlier_skip_init(&s, 3.0f, 0.0f);
    fill(&s);
    OutlierSkip bad = s;
    bad.windows[0].next = OUTLIER_WINDOW;
    CHECK_DIES("a full window whose next is past the ring", "loss window (count 128, next 128",
               outlier_skip_check_loaded(&bad, "s.bin"));
    bad = s;
    bad.windows[1].values[OUTLIER_WINDOW - 1] = INFINITY;
    CHECK_DIES("an Inf in the window's last slot", "gradient norm window", outlier_skip_check_loaded(&bad, "s.bin"));
    bad = s;
    bad.skipped[STEP_UPDATED] = 4;
    CHECK_DIES("a count of skipped updates for 'updated'", "holds 4 for outcome 0", outlier_skip_check_loaded(&bad, "s.bin"));
}

// a filling window's slots from its count on hold no values: whatever a file has there is never read, so it cannot
// refuse the file. Catches the finite scan reading one slot past the count
static void test_loaded_window_unused_slots(void) {
    OutlierSkip s;
    outlier_skip_init(&s, 3.0f, 0.0f);
    for (int i = 0; i < 5; i++) { outlier_skip_judge(&s, 2.0f + (float)i, 1.0f, NULL); }
    s.windows[0].values[s.windows[0].count] = NAN;
    CHECK_LIVES("a NaN in a filling window's first unused slot", outlier_skip_check_loaded(&s, "s.bin"));
}

// the resume note is for a checkpoint of a step that ran without -sl/-sg windows: none at step 0, whose windows
// are empty in any run. Catches the note printed for a checkpoint of step 0
static void test_resume_note(void) {
    OutlierSkip s;
    outlier_skip_init(&s, 3.0f, 0.0f);
    char text[512];
    STDOUT_OF(text, outlier_skip_note_resume(&s, 0));
    CHECK(strcmp(text, "") == 0, "resumed at step 0: printed [%s], expected nothing", text);
    STDOUT_OF(text, outlier_skip_note_resume(&s, 1));
    CHECK(strstr(text, "note: the checkpoint of step 1 has no -sl/-sg windows") != NULL, "resumed at step 1: printed [%s]",
          text);
}

int main(void) {
    test_zscore_and_window();
    test_verdicts();
    test_state_section();
    test_loaded_windows_checked();
    test_exact_threshold();
    test_skipped_values_enter();
    test_loaded_windows_edges();
    test_loaded_window_unused_slots();
    test_resume_note();
    return test_summary("test_outlier_skip");
}
