/*
gpu_test_copies.cuh: the host <-> device copies the GPU tests make, in one place. Why a
helper: every GPU test uploads inputs and reads results back, and each had grown its own
copy of these few lines under its own name. Both directions synchronize the device: an
upload is then seen by work on any stream (NCCL's non-blocking one included, which does not
wait for the legacy stream's cudaMemcpy from pageable memory), and a read-back sees every
kernel queued before it.
*/
#ifndef TEST_GPU_TEST_COPIES_CUH
#define TEST_GPU_TEST_COPIES_CUH

#include <stdint.h>
#include "llmc/cuda_common.h"
#include "llmc/element_math.h"
#include "llmc/utils.h"

// a new device buffer holding `bytes` host bytes
static inline void* device_copy(const void* host, size_t bytes) {
    void* device = cuda_malloc_checked(bytes, "a test tensor");
    cudaCheck(cudaMemcpy(device, host, bytes, cudaMemcpyHostToDevice));
    cudaCheck(cudaDeviceSynchronize());
    return device;
}

// a new host buffer holding `bytes` device bytes, once the device has finished its queued work
static inline void* host_copy(const void* device, size_t bytes) {
    void* host = mallocCheck(bytes);
    cudaCheck(cudaDeviceSynchronize());
    cudaCheck(cudaMemcpy(host, device, bytes, cudaMemcpyDeviceToHost));
    return host;
}

// bf16 bits as floats (exact), in a new host buffer
static inline float* bf16_bits_to_floats(const uint16_t* bits, size_t n) {
    float* f = (float*)mallocCheck(n * sizeof(float));
    for (size_t i = 0; i < n; i++) { f[i] = bf16_bits_to_float(bits[i]); }
    return f;
}

#endif // TEST_GPU_TEST_COPIES_CUH
