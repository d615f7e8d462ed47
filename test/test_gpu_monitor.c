/*
test_gpu_monitor.c: -lg's NVML readings (llmc/gpu_monitor.h) against a stand-in NVML
(test/fake_nvml.c, built beside this test as libfake_nvml.so): the device found by its PCI
bus id, every reading and its line, n/a where the device does not say, every clock reason by
name, and each way NVML can be missing (no library, a library without NVML's functions,
nvmlInit failing, no device at the bus id), each a reason and never a failed run.
*/
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <libgen.h>
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

int main(int argc, char** argv) {
    (void)argc;
    char self[1024];
    snprintf(self, sizeof(self), "%s", argv[0]);
    snprintf(g_fake, sizeof(g_fake), "%s/libfake_nvml.so", dirname(self));  // built beside this test
    test_readings();
    test_clock_reasons();
    test_missing_nvml();
    return test_summary("test_gpu_monitor");
}
