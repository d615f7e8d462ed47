/*
fake_nvml.c: a stand-in for the driver's NVML library (build/libfake_nvml.so), so the tests
of llmc/gpu_monitor.h (-lg) run on a machine without a GPU: LLM8_NVML_LIBRARY points the
monitor at it. It answers with fixed readings; the environment steers it:
- FAKE_NVML_BUS_ID: the one PCI bus id it knows (others: NVML_ERROR_NOT_FOUND); unset: any;
- FAKE_NVML_REASONS: the clock-reason bits, hex (default 0x4: power cap);
- FAKE_NVML_UNSUPPORTED: a comma list of readings that answer NVML_ERROR_NOT_SUPPORTED
  (utilization, clock, max_clock, power, power_limit, temperature, reasons);
- FAKE_NVML_INIT_FAILS: nvmlInit answers NVML_ERROR_DRIVER_NOT_LOADED.
fake_nvml_live_inits() tells a test holding the library open how many nvmlInit calls no
nvmlShutdown has matched yet (NVML counts them alike: each init wants its shutdown).
*/
#include <stdlib.h>
#include <string.h>

enum { SUCCESS = 0, ERROR_NOT_SUPPORTED = 3, ERROR_NOT_FOUND = 6, ERROR_DRIVER_NOT_LOADED = 9 };
typedef struct { unsigned int gpu, memory; } Utilization;
static int the_device;
static int live_inits;

int fake_nvml_live_inits(void) { return live_inits; }

static int unsupported(const char* reading) {
    const char* list = getenv("FAKE_NVML_UNSUPPORTED");
    if (list == NULL) { return 0; }
    size_t n = strlen(reading);
    for (const char* p = list; (p = strstr(p, reading)) != NULL; p += n) {
        if ((p == list || p[-1] == ',') && (p[n] == ',' || p[n] == '\0')) { return 1; }
    }
    return 0;
}

int nvmlInit_v2(void) {
    if (getenv("FAKE_NVML_INIT_FAILS") != NULL) { return ERROR_DRIVER_NOT_LOADED; }
    live_inits++;
    return SUCCESS;
}
int nvmlShutdown(void) {
    live_inits--;
    return SUCCESS;
}

int nvmlDeviceGetHandleByPciBusId_v2(const char* bus_id, void** device) {
    const char* known = getenv("FAKE_NVML_BUS_ID");
    if (known != NULL && strcmp(known, bus_id) != 0) { return ERROR_NOT_FOUND; }
    *device = &the_device;
    return SUCCESS;
}

int nvmlDeviceGetUtilizationRates(void* device, Utilization* u) {
    if (device != &the_device) { return ERROR_NOT_FOUND; }
    if (unsupported("utilization")) { return ERROR_NOT_SUPPORTED; }
    u->gpu = 97;
    u->memory = 64;
    return SUCCESS;
}

// one reading of the one device: its value, or NOT_SUPPORTED when FAKE_NVML_UNSUPPORTED names it
static int answer(void* device, const char* reading, unsigned int value, unsigned int* out) {
    if (device != &the_device) { return ERROR_NOT_FOUND; }
    if (unsupported(reading)) { return ERROR_NOT_SUPPORTED; }
    *out = value;
    return SUCCESS;
}

// the SM clock only (type 1), the GPU sensor only (0)
int nvmlDeviceGetClockInfo(void* device, int type, unsigned int* mhz) {
    return type == 1 ? answer(device, "clock", 1755, mhz) : ERROR_NOT_FOUND;
}
int nvmlDeviceGetMaxClockInfo(void* device, int type, unsigned int* mhz) {
    return type == 1 ? answer(device, "max_clock", 1980, mhz) : ERROR_NOT_FOUND;
}
int nvmlDeviceGetPowerUsage(void* device, unsigned int* milliwatts) { return answer(device, "power", 689400, milliwatts); }
int nvmlDeviceGetEnforcedPowerLimit(void* device, unsigned int* milliwatts) {
    return answer(device, "power_limit", 700000, milliwatts);
}
int nvmlDeviceGetTemperature(void* device, int sensor, unsigned int* celsius) {
    return sensor == 0 ? answer(device, "temperature", 71, celsius) : ERROR_NOT_FOUND;
}

int nvmlDeviceGetCurrentClocksThrottleReasons(void* device, unsigned long long* reasons) {
    if (device != &the_device) { return ERROR_NOT_FOUND; }
    if (unsupported("reasons")) { return ERROR_NOT_SUPPORTED; }
    const char* bits = getenv("FAKE_NVML_REASONS");
    *reasons = bits != NULL ? strtoull(bits, NULL, 16) : 0x4ULL;
    return SUCCESS;
}
