/*
test_harness.h: the smallest possible test framework for the C and CUDA tests.

Why: every test binary reports the same way, so `make test` can add them up and CI can
read the closing line. CHECK records a failure with file, line and a message and goes on;
test_summary() prints "<name>: N passed, N failed" and returns the exit code. stdout is
line-buffered, so what a binary printed survives its being stopped.
*/
#ifndef TEST_HARNESS_H
#define TEST_HARNESS_H

#include <stdio.h>
#include <math.h>

static int g_tests_passed = 0;
static int g_tests_failed = 0;

// stdout line-buffered before main: through a pipe (test/run_cpu_tests.sh tees it) it would be
// block-buffered, and a binary stopped by the runner's timeout, or by a device call's time limit,
// would lose the FAIL lines it had printed
__attribute__((constructor)) static void test_harness_line_buffered_stdout(void) { setvbuf(stdout, NULL, _IOLBF, 0); }

#define CHECK(cond, ...) do { \
    if (cond) { g_tests_passed++; } \
    else { g_tests_failed++; printf("FAIL %s:%d: ", __FILE__, __LINE__); printf(__VA_ARGS__); printf("\n"); } \
} while (0)

// |a - b| <= atol + rtol * |b|
#define CHECK_CLOSE(a, b, atol, rtol, what) do { \
    double _a = (double)(a), _b = (double)(b); \
    CHECK(fabs(_a - _b) <= (atol) + (rtol) * fabs(_b), "%s: got %.9g, expected %.9g (atol %g, rtol %g)", \
          what, _a, _b, (double)(atol), (double)(rtol)); \
} while (0)

// the larger of a running worst error and a new one, where a NaN, once met, stays: fmax drops
// a NaN, and `worst <= bound` would then pass a NaN result
static inline double worst_of(double worst, double x) { return isnan(worst) || isnan(x) ? NAN : fmax(worst, x); }

static inline int test_summary(const char* name) {
    printf("%s: %d passed, %d failed\n", name, g_tests_passed, g_tests_failed);
    return g_tests_failed == 0 ? 0 : 1;
}

#endif // TEST_HARNESS_H
