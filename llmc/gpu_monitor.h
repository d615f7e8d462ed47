/*
gpu_monitor.h: -lg N (llm.c's flag): every N steps, one line of what the GPU is doing: SM
and memory utilization, the SM clock against its maximum, power draw against the enforced
limit, temperature, and what holds the clock down (power cap, thermal or hardware slowdown).

Why it is shaped so:
- A tok/s figure is only as good as the clock it ran at. FP8 GEMMs draw more power per
  second than bf16 ones, so an FP8 run can be power-capped where its bf16 baseline was not;
  this line is how a user sees that the comparison measured the cooling or the power limit
  rather than the recipe.
- NVML is the driver's library, opened at run time (dlopen of libnvidia-ml.so.1, or
  $LLM8_NVML_LIBRARY), so the trainer neither links it nor needs it: without it, or without
  the device, -lg says why in one note and the run goes on without the lines.
- The device is found by its PCI bus id (from cudaGetDeviceProperties, the caller's), which
  NVML and CUDA agree on; CUDA's device index need not be NVML's (CUDA_VISIBLE_DEVICES).
- A reading the device does not support shows as n/a, never as a made-up number.
- Host C; the tests drive it with a stand-in NVML (test/fake_nvml.c).
*/
#ifndef LLMC_GPU_MONITOR_H
#define LLMC_GPU_MONITOR_H

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// NVML's ABI as its header declares it (nvml.h is not needed to build llm8)
typedef int gpu_nvml_return;
typedef void* gpu_nvml_device;
typedef struct { unsigned int gpu, memory; } gpu_nvml_utilization;
enum { GPU_NVML_SUCCESS = 0, GPU_NVML_CLOCK_SM = 1, GPU_NVML_TEMPERATURE_GPU = 0 };

// the bits of nvmlDeviceGetCurrentClocksThrottleReasons that say why the clock is held down
static const struct { unsigned long long bit; const char* name; } GPU_CLOCK_REASONS[] = {
    {0x2ULL, "applications clock setting"}, {0x4ULL, "power cap"}, {0x8ULL, "hardware slowdown"},
    {0x10ULL, "sync boost"}, {0x20ULL, "thermal (software)"}, {0x40ULL, "thermal (hardware)"},
    {0x80ULL, "power brake"}, {0x100ULL, "display clock setting"},
};
#define GPU_NUM_CLOCK_REASONS ((int)(sizeof(GPU_CLOCK_REASONS) / sizeof(GPU_CLOCK_REASONS[0])))

typedef struct {
    int enabled;              // NVML opened and the device found
    char why_not[256];        // when not enabled: the reason, for the note
    void* library;
    gpu_nvml_device device;
    gpu_nvml_return (*shutdown)(void);
    gpu_nvml_return (*utilization)(gpu_nvml_device, gpu_nvml_utilization*);
    gpu_nvml_return (*clock)(gpu_nvml_device, int, unsigned int*);
    gpu_nvml_return (*max_clock)(gpu_nvml_device, int, unsigned int*);
    gpu_nvml_return (*power)(gpu_nvml_device, unsigned int*);
    gpu_nvml_return (*power_limit)(gpu_nvml_device, unsigned int*);
    gpu_nvml_return (*temperature)(gpu_nvml_device, int, unsigned int*);
    gpu_nvml_return (*clock_reasons)(gpu_nvml_device, unsigned long long*);
} GpuMonitor;

// one reading; -1 (reasons: ~0) where the device did not say
typedef struct {
    long long sm_util, memory_util;      // %
    long long sm_mhz, sm_max_mhz;
    long long power_mw, power_limit_mw;
    long long temperature_c;
    unsigned long long clock_reasons;    // GPU_CLOCK_REASONS bits
} GpuSample;

static inline void* gpu_monitor_symbol_(GpuMonitor* m, const char* name) {
    void* symbol = dlsym(m->library, name);
    if (symbol == NULL && m->why_not[0] == '\0') {
        snprintf(m->why_not, sizeof(m->why_not), "the NVML library has no %s", name);
    }
    return symbol;
}

// gives up on NVML (m->why_not says why): shut down when it was initialized, and closed
static inline void gpu_monitor_give_up_(GpuMonitor* m, int initialized) {
    if (initialized) { m->shutdown(); }
    dlclose(m->library);
    m->library = NULL;
}

/*
Opens NVML and finds the device with PCI bus id `bus_id` ("dddd:bb:dd.f", hex, as CUDA and
NVML write it). Never fails the run: on any problem m->enabled is 0 and m->why_not says why.
*/
static inline void gpu_monitor_open(GpuMonitor* m, const char* bus_id) {
    memset(m, 0, sizeof(*m));
    const char* path = getenv("LLM8_NVML_LIBRARY");
    if (path == NULL || path[0] == '\0') { path = "libnvidia-ml.so.1"; }
    m->library = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (m->library == NULL) {
        snprintf(m->why_not, sizeof(m->why_not), "cannot load NVML ('%s', the driver's library): %s", path, dlerror());
        return;
    }
    gpu_nvml_return (*init)(void) = (gpu_nvml_return (*)(void))gpu_monitor_symbol_(m, "nvmlInit_v2");
    gpu_nvml_return (*by_bus_id)(const char*, gpu_nvml_device*) =
        (gpu_nvml_return (*)(const char*, gpu_nvml_device*))gpu_monitor_symbol_(m, "nvmlDeviceGetHandleByPciBusId_v2");
    m->shutdown = (gpu_nvml_return (*)(void))gpu_monitor_symbol_(m, "nvmlShutdown");
    m->utilization = (gpu_nvml_return (*)(gpu_nvml_device, gpu_nvml_utilization*))gpu_monitor_symbol_(m, "nvmlDeviceGetUtilizationRates");
    m->clock = (gpu_nvml_return (*)(gpu_nvml_device, int, unsigned int*))gpu_monitor_symbol_(m, "nvmlDeviceGetClockInfo");
    m->max_clock = (gpu_nvml_return (*)(gpu_nvml_device, int, unsigned int*))gpu_monitor_symbol_(m, "nvmlDeviceGetMaxClockInfo");
    m->power = (gpu_nvml_return (*)(gpu_nvml_device, unsigned int*))gpu_monitor_symbol_(m, "nvmlDeviceGetPowerUsage");
    m->power_limit = (gpu_nvml_return (*)(gpu_nvml_device, unsigned int*))gpu_monitor_symbol_(m, "nvmlDeviceGetEnforcedPowerLimit");
    m->temperature = (gpu_nvml_return (*)(gpu_nvml_device, int, unsigned int*))gpu_monitor_symbol_(m, "nvmlDeviceGetTemperature");
    m->clock_reasons = (gpu_nvml_return (*)(gpu_nvml_device, unsigned long long*))
        gpu_monitor_symbol_(m, "nvmlDeviceGetCurrentClocksThrottleReasons");
    if (m->why_not[0] != '\0') {  // a function missing: not NVML
        gpu_monitor_give_up_(m, 0);
        return;
    }
    gpu_nvml_return status = init();
    if (status != GPU_NVML_SUCCESS) {
        snprintf(m->why_not, sizeof(m->why_not), "nvmlInit failed (NVML error %d)", status);
        gpu_monitor_give_up_(m, 0);
        return;
    }
    status = by_bus_id(bus_id, &m->device);
    if (status != GPU_NVML_SUCCESS) {
        snprintf(m->why_not, sizeof(m->why_not), "NVML finds no device at PCI bus id %s (NVML error %d)", bus_id, status);
        gpu_monitor_give_up_(m, 1);
        return;
    }
    m->enabled = 1;
}

// one reading of every quantity (a quantity the device does not report: -1)
static inline GpuSample gpu_monitor_sample(const GpuMonitor* m) {
    GpuSample s = {-1, -1, -1, -1, -1, -1, -1, ~0ULL};
    if (!m->enabled) { return s; }
    gpu_nvml_utilization util;
    if (m->utilization(m->device, &util) == GPU_NVML_SUCCESS) {
        s.sm_util = util.gpu;
        s.memory_util = util.memory;
    }
    unsigned int value;
    if (m->clock(m->device, GPU_NVML_CLOCK_SM, &value) == GPU_NVML_SUCCESS) { s.sm_mhz = value; }
    if (m->max_clock(m->device, GPU_NVML_CLOCK_SM, &value) == GPU_NVML_SUCCESS) { s.sm_max_mhz = value; }
    if (m->power(m->device, &value) == GPU_NVML_SUCCESS) { s.power_mw = value; }
    if (m->power_limit(m->device, &value) == GPU_NVML_SUCCESS) { s.power_limit_mw = value; }
    if (m->temperature(m->device, GPU_NVML_TEMPERATURE_GPU, &value) == GPU_NVML_SUCCESS) { s.temperature_c = value; }
    unsigned long long reasons;
    if (m->clock_reasons(m->device, &reasons) == GPU_NVML_SUCCESS) { s.clock_reasons = reasons; }
    return s;
}

// "<value><unit>" or "n/a" into out
static inline void gpu_monitor_value_(char* out, size_t n, long long value, const char* unit) {
    if (value < 0) { snprintf(out, n, "n/a"); } else { snprintf(out, n, "%lld%s", value, unit); }
}

// room for any -lg line: seven values of at most 31 characters, every clock reason named (at
// most 255), and the line's own text
#define GPU_MONITOR_LINE_MAX 640

// the -lg line of a reading, e.g. "gpu | SM 97% | memory 64% | SM clock 1755/1980 MHz | power 689/700 W | 71 C | clock held by: power cap"
static inline void gpu_monitor_format(const GpuSample* s, char* out, size_t n) {
    char sm[32], memory[32], mhz[32], max_mhz[32], power[32], limit[32], temperature[32];
    gpu_monitor_value_(sm, sizeof(sm), s->sm_util, "%");
    gpu_monitor_value_(memory, sizeof(memory), s->memory_util, "%");
    gpu_monitor_value_(mhz, sizeof(mhz), s->sm_mhz, "");
    gpu_monitor_value_(max_mhz, sizeof(max_mhz), s->sm_max_mhz, "");
    gpu_monitor_value_(power, sizeof(power), s->power_mw < 0 ? -1 : (s->power_mw + 500) / 1000, "");
    gpu_monitor_value_(limit, sizeof(limit), s->power_limit_mw < 0 ? -1 : (s->power_limit_mw + 500) / 1000, "");
    gpu_monitor_value_(temperature, sizeof(temperature), s->temperature_c, " C");
    char reasons[256] = "";
    if (s->clock_reasons == ~0ULL) {
        snprintf(reasons, sizeof(reasons), "n/a");
    } else {
        for (int i = 0; i < GPU_NUM_CLOCK_REASONS; i++) {
            if (!(s->clock_reasons & GPU_CLOCK_REASONS[i].bit)) { continue; }
            size_t used = strlen(reasons);
            snprintf(reasons + used, sizeof(reasons) - used, "%s%s", used > 0 ? ", " : "", GPU_CLOCK_REASONS[i].name);
        }
        if (reasons[0] == '\0') { snprintf(reasons, sizeof(reasons), "nothing"); }
    }
    snprintf(out, n, "gpu | SM %s | memory %s | SM clock %s/%s MHz | power %s/%s W | %s | clock held by: %s", sm, memory,
             mhz, max_mhz, power, limit, temperature, reasons);
}

static inline void gpu_monitor_close(GpuMonitor* m) {
    if (m->enabled) { m->shutdown(); }
    if (m->library != NULL) { dlclose(m->library); }
    memset(m, 0, sizeof(*m));
}

#endif // LLMC_GPU_MONITOR_H
