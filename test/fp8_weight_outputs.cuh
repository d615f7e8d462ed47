/*
fp8_weight_outputs.cuh: the FP8 weight outputs of an optimizer kernel on the device
(Fp8WeightUpdate, llmc/fp8_scaling.cuh) beside its host reference's (Fp8WeightRef,
llmc/fp8.h), for the GPU optimizer tests (test_kernels.cu, test_adamw8_gpu.cu), and their
comparison bit for bit: the amax, and under the delayed weight cast the E4M3 codes and the
record's element count. Why a helper: both kernels take the same outputs, so both tests set
them up and check them the same way.
*/
#ifndef TEST_FP8_WEIGHT_OUTPUTS_CUH
#define TEST_FP8_WEIGHT_OUTPUTS_CUH

#include <string.h>
#include "llmc/cuda_common.h"
#include "llmc/fp8.h"
#include "llmc/fp8_scaling.h"
#include "llmc/fp8_scaling.cuh"
#include "test/test_harness.h"

typedef struct {
    size_t n;
    int delayed;
    Fp8CastRecord* d_record;
    Fp8TensorScaling* d_state;
    uint8_t* d_codes;          // delayed only
    uint8_t* codes;            // the host reference's codes (delayed only)
    float amax;                // the host reference's amax
    Fp8WeightRef host;         // what the host reference is handed
} Fp8WeightOutputs;

/*
Outputs for a call of n elements. delayed: codes under the scale fp8_scaling_init_weight's
delayed state takes from previous_amax (the previous step's amax; pick it below the new
values' to make some codes saturate); else the amax alone.
*/
static void fp8_weight_outputs_init(Fp8WeightOutputs* o, size_t n, int delayed, float previous_amax) {
    memset(o, 0, sizeof(*o));
    o->n = n;
    o->delayed = delayed;
    o->d_record = (Fp8CastRecord*)cuda_malloc_checked(sizeof(Fp8CastRecord), "a weight's cast record");
    o->d_state = (Fp8TensorScaling*)cuda_malloc_checked(sizeof(Fp8TensorScaling), "a weight's scaling state");
    Fp8TensorScaling state;
    fp8_scaling_init_weight(&state, delayed, FP8_AMAX_HISTORY_DEFAULT, 0);
    fp8_scaling_update(&state, previous_amax);
    cudaCheck(cudaMemcpy(o->d_state, &state, sizeof(state), cudaMemcpyHostToDevice));
    o->host.amax = &o->amax;
    o->host.scale = state.scale;
    if (delayed) {
        o->d_codes = (uint8_t*)cuda_malloc_checked(n, "FP8 weight codes");
        cudaCheck(cudaMemset(o->d_codes, 0x55, n));  // not a code the tests' values give
        o->codes = (uint8_t*)mallocCheck(n);
        memset(o->codes, 0x55, n);
        o->host.codes = o->codes;
    }
}

// a fresh record and amax before the next call (the trainer's state update clears the amax)
static void fp8_weight_outputs_clear(Fp8WeightOutputs* o) {
    fp8_cast_records_init(o->d_record, 1, 0);
    o->amax = 0.0f;
}

// what the kernel is handed, codes from element `first` of the call's tensor on
static Fp8WeightUpdate fp8_weight_outputs_device(const Fp8WeightOutputs* o, size_t first) {
    Fp8WeightUpdate update = {o->d_record, o->delayed ? o->d_codes + first : NULL, o->d_state};
    return update;
}

// the host reference's outputs from element `first` on
static Fp8WeightRef fp8_weight_outputs_host(Fp8WeightOutputs* o, size_t first) {
    Fp8WeightRef ref = o->host;
    if (o->delayed) { ref.codes = o->codes + first; }
    return ref;
}

// amax, codes and the record's element count, device against host; `what` names the case
static void fp8_weight_outputs_check(const Fp8WeightOutputs* o, size_t elements, const char* what) {
    Fp8CastRecord record;
    cudaCheck(cudaDeviceSynchronize());
    cudaCheck(cudaMemcpy(&record, o->d_record, sizeof(record), cudaMemcpyDeviceToHost));
    CHECK(record.amax_bits == fp8_amax_bits(o->amax), "%s: FP8 weight amax %.9g, host %.9g", what,
          bits_as_float(record.amax_bits), o->amax);
    if (!o->delayed) {
        CHECK(record.elements == 0, "%s: current weight scaling counted %llu cast elements", what, record.elements);
        return;
    }
    uint8_t* got = (uint8_t*)mallocCheck(o->n);
    cudaCheck(cudaMemcpy(got, o->d_codes, o->n, cudaMemcpyDeviceToHost));
    size_t bad = 0, first = 0, saturated = 0;
    for (size_t i = 0; i < o->n; i++) {
        if (got[i] != o->codes[i]) { if (bad == 0) { first = i; } bad++; }
        saturated += (o->codes[i] & 0x7fu) == 0x7eu;
    }
    CHECK(bad == 0, "%s: %zu FP8 weight codes differ from the host's (first %zu: 0x%02x, host 0x%02x)", what, bad, first,
          got[first], o->codes[first]);
    CHECK(saturated > 0, "%s: no code reached the E4M3 maximum: the case does not exercise saturation", what);
    CHECK(record.elements == elements, "%s: the record counts %llu cast elements, expected %zu", what, record.elements,
          elements);
    free(got);
}

static void fp8_weight_outputs_free(Fp8WeightOutputs* o) {
    cudaCheck(cudaFree(o->d_record));
    cudaCheck(cudaFree(o->d_state));
    if (o->d_codes != NULL) { cudaCheck(cudaFree(o->d_codes)); }
    free(o->codes);
    memset(o, 0, sizeof(*o));
}

#endif // TEST_FP8_WEIGHT_OUTPUTS_CUH
