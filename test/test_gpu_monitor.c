/*
test_gpu_monitor.c: -lg's NVML readings (llmc/gpu_monitor.h) against a stand-in NVML
(test/fake_nvml.c, built beside this test as libfake_nvml.so): the device found by its PCI
bus id, every reading and its line, n/a where the device does not say, every clock reason by
name, and each way NVML can be missing (no library, a library without NVML's functions,
nvmlInit failing, no device at the bus id), each a reason and never a failed run; every
nvmlInit matched by a shutdown and the library closed, whichever way open and close go.
*/
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <libgen.h>
#include <dlfcn.h>
#include "test/test_harness.h"
#include "llmc/gpu_monitor.h"

#define BUS_ID "0000:3b:00.0"

static char g_fake[1024];

static void use_library(const char* path) { setenv("LLM8_NVML_LIBRARY", path, 1); }

static void check_line(const GpuSample* s, const char* want, const char* what) {
    char line[GPU_MONITOR_LINE_MAX];
    gpu_monitor_format(s, line, sizeof(line));
    CHECK(strcmp(line, want) == 0, "%s: got \"%s\"\n    expected \"%s\"", what, line, want);
}

static void test_readings(void) {
    use_library(g_fake);
    setenv("FAKE_NVML_BUS_ID", BUS_ID, 1);
    GpuMonitor m;
    gpu_monitor_open(&m, BUS_ID);
    CHECK(m.enabled, "the stand-in NVML at %s was not used: %s", g_fake, m.why_not);
    GpuSample s = gpu_monitor_sample(&m);
    CHECK(s.sm_util == 97 && s.memory_util == 64 && s.sm_mhz == 1755 && s.sm_max_mhz == 1980 && s.power_mw == 689400 &&
          s.power_limit_mw == 700000 && s.temperature_c == 71 && s.clock_reasons == 0x4ULL,
          "readings %lld %lld %lld %lld %lld %lld %lld %llx", s.sm_util, s.memory_util, s.sm_mhz, s.sm_max_mhz, s.power_mw,
          s.power_limit_mw, s.temperature_c, s.clock_reasons);
    check_line(&s, "gpu | SM 97% | memory 64% | SM clock 1755/1980 MHz | power 689/700 W | 71 C | clock held by: power cap",
               "a power-capped reading");
    gpu_monitor_close(&m);

    setenv("FAKE_NVML_UNSUPPORTED", "power,reasons,max_clock", 1);
    gpu_monitor_open(&m, BUS_ID);
    s = gpu_monitor_sample(&m);
    check_line(&s, "gpu | SM 97% | memory 64% | SM clock 1755/n/a MHz | power n/a/700 W | 71 C | clock held by: n/a",
               "readings the device does not report");
    gpu_monitor_close(&m);
    unsetenv("FAKE_NVML_UNSUPPORTED");

    setenv("FAKE_NVML_REASONS", "0", 1);
    gpu_monitor_open(&m, BUS_ID);
    s = gpu_monitor_sample(&m);
    CHECK(s.clock_reasons == 0, "reasons %llx", s.clock_reasons);
    gpu_monitor_close(&m);
    unsetenv("FAKE_NVML_REASONS");
    unsetenv("FAKE_NVML_BUS_ID");
}

static void test_clock_reasons(void) {
    GpuSample s = {1, 2, 3, 4, 5000, 6000, 7, 0};
    check_line(&s, "gpu | SM 1% | memory 2% | SM clock 3/4 MHz | power 5/6 W | 7 C | clock held by: nothing", "no reason");
    const char* names[] = {"applications clock setting", "power cap", "hardware slowdown", "sync boost", "thermal (software)",
                           "thermal (hardware)", "power brake", "display clock setting"};
    const unsigned long long bits[] = {0x2, 0x4, 0x8, 0x10, 0x20, 0x40, 0x80, 0x100};
    for (int i = 0; i < 8; i++) {
        s.clock_reasons = bits[i] | 0x1ULL;  // GPU idle (bit 0) is no reason the clock is held down
        char want[256];
        snprintf(want, sizeof(want), "gpu | SM 1%% | memory 2%% | SM clock 3/4 MHz | power 5/6 W | 7 C | clock held by: %s",
                 names[i]);
        check_line(&s, want, names[i]);
    }
    s.clock_reasons = 0x4 | 0x40 | 0x200000;  // two known, one unknown bit
    check_line(&s, "gpu | SM 1% | memory 2% | SM clock 3/4 MHz | power 5/6 W | 7 C | clock held by: power cap, thermal (hardware)",
               "two reasons");
    s.power_mw = 689499;  // rounded to the nearest watt
    s.power_limit_mw = 699500;
    s.clock_reasons = 0;
    check_line(&s, "gpu | SM 1% | memory 2% | SM clock 3/4 MHz | power 689/700 W | 7 C | clock held by: nothing", "watts rounded");
    // the widest line: the largest values and every reason, whole in GPU_MONITOR_LINE_MAX
    GpuSample widest = {LLONG_MAX, LLONG_MAX, LLONG_MAX, LLONG_MAX, LLONG_MAX - 500, LLONG_MAX - 500, LLONG_MAX, 0x1FEULL};
    check_line(&widest, "gpu | SM 9223372036854775807% | memory 9223372036854775807% | SM clock "
               "9223372036854775807/9223372036854775807 MHz | power 9223372036854775/9223372036854775 W | 9223372036854775807 C"
               " | clock held by: applications clock setting, power cap, hardware slowdown, sync boost, thermal (software), "
               "thermal (hardware), power brake, display clock setting", "widest line");
}

// each way NVML can be missing: disabled with a reason, every reading n/a
static void check_disabled(const char* bus_id, const char* fragment, const char* what) {
    GpuMonitor m;
    gpu_monitor_open(&m, bus_id);
    CHECK(!m.enabled && strstr(m.why_not, fragment) != NULL, "%s: enabled %d, reason \"%s\" (expected it to say \"%s\")",
          what, m.enabled, m.why_not, fragment);
    GpuSample s = gpu_monitor_sample(&m);
    check_line(&s, "gpu | SM n/a | memory n/a | SM clock n/a/n/a MHz | power n/a/n/a W | n/a | clock held by: n/a", what);
    gpu_monitor_close(&m);
}

static void test_missing_nvml(void) {
    use_library("/nonexistent/libnvidia-ml.so.1");
    check_disabled(BUS_ID, "cannot load NVML ('/nonexistent/libnvidia-ml.so.1'", "no library");
    use_library("libm.so.6");
    check_disabled(BUS_ID, "has no nvmlInit_v2", "a library that is not NVML");
    use_library(g_fake);
    setenv("FAKE_NVML_INIT_FAILS", "1", 1);
    check_disabled(BUS_ID, "nvmlInit failed (NVML error 9)", "nvmlInit failing");
    unsetenv("FAKE_NVML_INIT_FAILS");
    setenv("FAKE_NVML_BUS_ID", BUS_ID, 1);
    check_disabled("0000:3c:00.0", "no device at PCI bus id 0000:3c:00.0 (NVML error 6)", "another bus id");
    unsetenv("FAKE_NVML_BUS_ID");
}

// the line of one reading from the stand-in NVML at BUS_ID, with FAKE_NVML_UNSUPPORTED set to `unsupported`
static void check_fake_line(const char* unsupported, const char* want, const char* what) {
    use_library(g_fake);
    setenv("FAKE_NVML_UNSUPPORTED", unsupported, 1);
    GpuMonitor m;
    gpu_monitor_open(&m, BUS_ID);
    GpuSample s = gpu_monitor_sample(&m);
    check_line(&s, want, what);
    gpu_monitor_close(&m);
    unsetenv("FAKE_NVML_UNSUPPORTED");
}

// every reading test_readings leaves supported, unsupported in turn: each shows n/a, never a stale or
// uninitialized value, while the others still show theirs
static void test_other_readings_unsupported(void) {
    check_fake_line("utilization,clock,power_limit,temperature",
                    "gpu | SM n/a | memory n/a | SM clock n/a/1980 MHz | power 689/n/a W | n/a | clock held by: power cap",
                    "utilization, SM clock, power limit and temperature unsupported");
}

// a reading of 0 is a value (an idle GPU's 0%, a clock at 0), not n/a; watts round half up
static void test_zero_readings_and_half_watts(void) {
    GpuSample zero = {0, 0, 0, 0, 0, 0, 0, 0};
    check_line(&zero, "gpu | SM 0% | memory 0% | SM clock 0/0 MHz | power 0/0 W | 0 C | clock held by: nothing", "zero readings");
    GpuSample half = {1, 2, 3, 4, 689500, 699499, 7, 0};
    check_line(&half, "gpu | SM 1% | memory 2% | SM clock 3/4 MHz | power 690/699 W | 7 C | clock held by: nothing",
               "689.5 W rounds up, 699.499 W down");
}

// NVML is shut down once for each init (after a bus id it does not know too) and the library closed
// (dlopen's RTLD_NOLOAD finds it no longer loaded), every way open and close can go; a closed monitor
// reads n/a and closes again as a no-op
static void check_unloaded(const char* what) {
    void* still = dlopen(g_fake, RTLD_NOW | RTLD_NOLOAD);
    CHECK(still == NULL, "%s: the NVML library is still loaded", what);
    if (still != NULL) { dlclose(still); }
}

static void test_nvml_shut_down_and_closed(void) {
    use_library(g_fake);
    setenv("FAKE_NVML_BUS_ID", BUS_ID, 1);
    GpuMonitor m;
    gpu_monitor_open(&m, BUS_ID);
    gpu_monitor_close(&m);
    check_unloaded("closed after a reading");
    gpu_monitor_open(&m, "0000:3c:00.0");
    CHECK(!m.enabled, "a bus id the stand-in does not know was found");
    gpu_monitor_close(&m);
    check_unloaded("a bus id NVML does not know");
    setenv("FAKE_NVML_INIT_FAILS", "1", 1);
    gpu_monitor_open(&m, BUS_ID);
    gpu_monitor_close(&m);
    check_unloaded("nvmlInit failing");
    unsetenv("FAKE_NVML_INIT_FAILS");

    void* held = dlopen(g_fake, RTLD_NOW | RTLD_LOCAL);  // the test's own hold: the count survives each close
    int (*live_inits)(void) = held != NULL ? (int (*)(void))dlsym(held, "fake_nvml_live_inits") : NULL;
    CHECK(live_inits != NULL, "the stand-in NVML has no fake_nvml_live_inits");
    if (live_inits == NULL) { return; }
    gpu_monitor_open(&m, BUS_ID);
    CHECK(m.enabled && live_inits() == 1, "open: enabled %d, %d NVML inits live (expected 1)", m.enabled, live_inits());
    gpu_monitor_close(&m);
    CHECK(live_inits() == 0 && !m.enabled && m.library == NULL, "close: %d NVML inits live, enabled %d, library %p",
          live_inits(), m.enabled, m.library);
    GpuSample s = gpu_monitor_sample(&m);
    check_line(&s, "gpu | SM n/a | memory n/a | SM clock n/a/n/a MHz | power n/a/n/a W | n/a | clock held by: n/a",
               "a closed monitor");
    gpu_monitor_close(&m);
    gpu_monitor_open(&m, "0000:3c:00.0");
    CHECK(!m.enabled && live_inits() == 0, "a bus id NVML does not know: %d NVML inits live (expected 0)", live_inits());
    gpu_monitor_close(&m);
    dlclose(held);
    unsetenv("FAKE_NVML_BUS_ID");
}

// LLM8_NVML_LIBRARY set but empty (a script's "${VAR:-}") means the driver's library, not dlopen(""), which
// is the program itself: here no libnvidia-ml.so.1 loads; on a machine with a driver, its NVML does
static void test_empty_library_variable(void) {
    use_library("");
    GpuMonitor m;
    gpu_monitor_open(&m, BUS_ID);
    int tried_drivers = strstr(m.why_not, "('libnvidia-ml.so.1'") != NULL;
    int loaded_drivers = strstr(m.why_not, "cannot load") == NULL && strstr(m.why_not, "has no") == NULL;
    CHECK(tried_drivers || loaded_drivers, "an empty LLM8_NVML_LIBRARY: \"%s\" (expected libnvidia-ml.so.1 tried)", m.why_not);
    gpu_monitor_close(&m);
}

int main(int argc, char** argv) {
    (void)argc;
    char self[1024];
    snprintf(self, sizeof(self), "%s", argv[0]);
    snprintf(g_fake, sizeof(g_fake), "%s/libfake_nvml.so", dirname(self));  // built beside this test
    test_readings();
    test_clock_reasons();
    test_missing_nvml();
    test_other_readings_unsupported();
    test_zero_readings_and_half_watts();
    test_nvml_shut_down_and_closed();
    test_empty_library_variable();
    return test_summary("test_gpu_monitor");
}
