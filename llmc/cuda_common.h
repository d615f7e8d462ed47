/*
cuda_common.h: what every CUDA module needs: the cudaCheck macro, floatX, 128-bit vector
loads/stores (Packed128), a cudaMalloc that explains an out-of-memory error, and a
description of the device (for the MFU figure).

Why: the non-matmul kernels are memory bound, and on Hopper a kernel only approaches the
memory bandwidth when each thread moves 16 bytes per instruction. Packed128 makes that the
easy way to write a kernel: load 8 bf16 (or 4 floats) at once, work on them as an array,
store them at once. The cache-streaming variants (..cs) are for data that is read or
written exactly once, so it does not evict what the next kernel will reuse from L2.
An allocation failure must say what to change (DESIGN.md section 8), so every device
allocation goes through cuda_malloc_checked with a description of what it is for.
*/
#ifndef LLMC_CUDA_COMMON_H
#define LLMC_CUDA_COMMON_H

#include <stdio.h>
#include <string.h>
#include <stdint.h>
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include "utils.h"

// ----------------------------------------------------------------------------
// error checking

static inline void cuda_check(cudaError_t err, const char* file, int line) {
    if (err != cudaSuccess) {
        llm8_die("CUDA error %s: %s (%s:%d)", cudaGetErrorName(err), cudaGetErrorString(err), file, line);
    }
}
#define cudaCheck(err) cuda_check((err), __FILE__, __LINE__)

// the number of GPUs; a machine without one (no device, or no driver, which the runtime reports
// as an insufficient driver) gets one line saying so and where to go instead, not a driver hint
static inline int cuda_device_count_or_die(void) {
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver || (err == cudaSuccess && count == 0)) {
        llm8_die("no usable NVIDIA GPU here (the CUDA runtime says: %s): llm8 needs a GPU and a driver for CUDA 13; "
                 "train_gpt2cpu trains on the CPU", err == cudaSuccess ? "no devices" : cudaGetErrorString(err));
    }
    cudaCheck(err);
    return count;
}

__host__ __device__ static inline int ceil_div(int a, int b) { return (a + b - 1) / b; }
static inline size_t ceil_div_size(size_t a, size_t b) { return (a + b - 1) / b; }

// the grid of an elementwise kernel whose threads each take one 16-byte vector (8 bf16) of an
// n-element tensor. Counts are size_t: the largest activations (B*T*4C) pass 2^31 elements at
// shapes that fit one GPU, where an int count wrapped and the kernel silently skipped most of
// the tensor
static inline unsigned int vector_kernel_grid(size_t n, int block_size, const char* who) {
    if (n == 0 || n % 8 != 0) {
        llm8_die("%s: %zu elements must be a positive multiple of 8 (16-byte vector access)", who, n);
    }
    size_t blocks = ceil_div_size(n / 8, (size_t)block_size);
    if (blocks > 0x7fffffffu) {
        llm8_die("%s: %zu elements need %zu blocks of %d threads, above CUDA's 2^31-1", who, n, blocks, block_size);
    }
    return (unsigned int)blocks;
}

// ----------------------------------------------------------------------------
// the activation / weight / gradient type, bf16 in both precisions (FP8 copies live beside)

typedef __nv_bfloat16 floatX;

__device__ __forceinline__ floatX bf16_from_bits(uint16_t bits) {
    __nv_bfloat16_raw raw;
    raw.x = bits;
    return floatX(raw);
}

// ----------------------------------------------------------------------------
// Packed128: 16 bytes as an array of T (8 bf16 or 4 floats), loaded and stored in one
// instruction. The address must be 16-byte aligned.

template <class T>
struct alignas(16) Packed128 {
    static constexpr int size = (int)(sizeof(int4) / sizeof(T));
    T payload[size];

    Packed128() = default;
    __device__ __forceinline__ explicit Packed128(int4 bits) { memcpy(payload, &bits, sizeof(bits)); }
    __device__ __forceinline__ static Packed128 zeros() { return Packed128(make_int4(0, 0, 0, 0)); }
    __device__ __forceinline__ T& operator[](int index) { return payload[index]; }
    __device__ __forceinline__ const T& operator[](int index) const { return payload[index]; }
    __device__ __forceinline__ int4 bits() const { int4 b; memcpy(&b, payload, sizeof(b)); return b; }
};

typedef Packed128<floatX> x128;  // 8 bf16
typedef Packed128<float> f128;   // 4 floats

/*
Element k of x as a float, taken from the word that holds it: an even element is the low half
shifted up, an odd one the high half masked, one instruction each. __bfloat162float(x[k])
compiled an odd element to a byte permute that moved the high half down and a shift that moved
it back up, an extra instruction for every second element of every loop over a tensor's values.
Exact: a bf16 is the top half of its float. k is meant to be known at compile time (an unrolled
loop); a run-time k still works, through selects between the words.
*/
__device__ __forceinline__ float x128_float(const x128& x, int k) {
    const int4 words = x.bits();
    const uint32_t word = (uint32_t)(k < 4 ? (k < 2 ? words.x : words.y) : (k < 6 ? words.z : words.w));
    return __uint_as_float(k % 2 == 0 ? word << 16 : word & 0xffff0000u);
}

/*
The largest |x[k]| of 8 packed bf16, as that float's bits with the sign cleared (fp8_amax_bits:
their order is the floats' magnitudes', a NaN above +Inf). A bf16 is the top half of its float, so
the largest sign-cleared 16-bit half is the largest magnitude: the 4 words are compared two
halves at a time (__vmaxu2, a 16x2 max on sm_90: 2 to 3 instructions for the 4 words), then the
two halves. Element by element it took a conversion, a mask and half a 3-input max each.
*/
__device__ __forceinline__ uint32_t x128_amax_bits(const x128& x) {
    const int4 w = x.bits();
    const uint32_t halves = __vmaxu2(__vmaxu2((uint32_t)w.x & 0x7fff7fffu, (uint32_t)w.y & 0x7fff7fffu),
                                     __vmaxu2((uint32_t)w.z & 0x7fff7fffu, (uint32_t)w.w & 0x7fff7fffu));
    return max(halves << 16, halves & 0xffff0000u);
}

// 8 floats rounded to bf16, two per conversion instruction: the bits of 8 __float2bfloat16_rn
__device__ __forceinline__ x128 x128_from_floats(const float (&x)[x128::size]) {
    x128 packed;
    for (int k = 0; k < x128::size; k += 2) {
        __nv_bfloat162 pair = __floats2bfloat162_rn(x[k], x[k + 1]);
        packed[k] = pair.x;
        packed[k + 1] = pair.y;
    }
    return packed;
}

// default caching: data that is read again soon (weights, a row read twice)
template <class T>
__device__ __forceinline__ Packed128<T> load128(const T* address) {
    return Packed128<T>(*reinterpret_cast<const int4*>(address));
}
// cache streaming: data read once
template <class T>
__device__ __forceinline__ Packed128<T> load128cs(const T* address) {
    return Packed128<T>(__ldcs(reinterpret_cast<const int4*>(address)));
}
template <class T>
__device__ __forceinline__ void store128(T* address, Packed128<T> value) {
    *reinterpret_cast<int4*>(address) = value.bits();
}
// cache streaming: data not read again by this kernel or the next
template <class T>
__device__ __forceinline__ void store128cs(T* address, Packed128<T> value) {
    __stcs(reinterpret_cast<int4*>(address), value.bits());
}

// the 16-byte vector at address where valid, else zeros; chosen as 4 words, not as 8 bf16, whose
// select compiled to two predicated byte permutes an element (a predicated load into zeroed registers)
template <bool STREAMING, class T>
__device__ __forceinline__ Packed128<T> load128_or_zeros(const T* address, bool valid) {
    int4 bits = make_int4(0, 0, 0, 0);
    if (valid) {
        const int4* words = reinterpret_cast<const int4*>(address);
        bits = STREAMING ? __ldcs(words) : *words;
    }
    return Packed128<T>(bits);
}

/*
N 16-byte vectors of a thread's strided walk: out[j] = the vector at element (first + j * step) *
stride of base, zeros where first + j * step >= count. All N loads are issued before any is used,
so they are in flight together: a loop that loads one and uses it waits out the memory latency
every time (the 2026-11-26 SASS of several kernels). STREAMING: data read once (load128cs).
*/
template <int N, bool STREAMING, class T>
__device__ __forceinline__ void load128_batch(Packed128<T> (&out)[N], const T* base, int first, int step, int count,
                                              size_t stride) {
#pragma unroll
    for (int j = 0; j < N; j++) {
        const int i = first + j * step;
        out[j] = load128_or_zeros<STREAMING>(base + (size_t)i * stride, i < count);
    }
}

// ----------------------------------------------------------------------------
// device allocation that tells the user what to lower when the GPU is full

static inline void* cuda_malloc_checked(size_t bytes, const char* what) {
    void* ptr = NULL;
    cudaError_t err = cudaMalloc(&ptr, bytes);
    if (err == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError();  // reset the last-error state; the context is still usable
        size_t free_bytes = 0, total_bytes = 0;
        cudaCheck(cudaMemGetInfo(&free_bytes, &total_bytes));
        llm8_die("out of GPU memory: %.2f GiB requested for %s, %.2f GiB free of %.2f GiB; "
                 "lower the batch size (-b), turn on activation recompute (-r), or use a higher ZeRO stage",
                 bytes / 1073741824.0, what, free_bytes / 1073741824.0, total_bytes / 1073741824.0);
    }
    cudaCheck(err);
    return ptr;
}

// ----------------------------------------------------------------------------
// the device, and its bf16 dense tensor-core peak for MFU

typedef struct {
    char name[256];
    int sm_count;
    size_t total_memory_bytes;
    float bf16_peak_tflops;  // dense, no sparsity; 0 when the device is not in the table (MFU n/a)
    char pci_bus_id[32];     // "dddd:bb:dd.0", as NVML finds the device (-lg, gpu_monitor.h)
} DeviceInfo;

/*
Dense BF16 tensor-core peaks from NVIDIA's datasheets, which quote them "with sparsity"
(twice the dense figure): H100 SXM 1,979 -> 989; H100 PCIe 1,513 -> 756; H100 NVL and
H200 NVL 1,671 -> 835; H200 SXM 1,979 -> 989 (NVIDIA H100 and H200 product pages /
datasheets). GH200 uses the SXM-class H100/H200 die at full clocks: 989.
The more specific names are tested first ("H100 PCIe" before "H100").
*/
static inline float bf16_dense_peak_tflops(const char* device_name) {
    static const struct { const char* name_part; float tflops; } peaks[] = {
        {"H100 PCIe", 756.0f}, {"H100 NVL", 835.0f}, {"H200 NVL", 835.0f},
        {"GH200", 989.0f}, {"H100", 989.0f}, {"H200", 989.0f},
    };
    for (size_t i = 0; i < sizeof(peaks) / sizeof(peaks[0]); i++) {
        if (strstr(device_name, peaks[i].name_part) != NULL) { return peaks[i].tflops; }
    }
    return 0.0f;
}

// the current device's SM count, asked once (one device per process): kernels that size their
// grid to what the GPU holds at once (adamw8, the FP8 tile cast)
static inline int device_sm_count(void) {
    static int sm_count = 0;
    if (sm_count == 0) {
        int device = 0;
        cudaCheck(cudaGetDevice(&device));
        cudaCheck(cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, device));
    }
    return sm_count;
}

// the current device (cudaSetDevice picks it)
static inline DeviceInfo device_info_query(void) {
    cuda_device_count_or_die();
    int device = 0;
    cudaCheck(cudaGetDevice(&device));
    cudaDeviceProp prop;
    cudaCheck(cudaGetDeviceProperties(&prop, device));
    DeviceInfo info;
    snprintf(info.name, sizeof(info.name), "%s", prop.name);
    info.sm_count = prop.multiProcessorCount;
    info.total_memory_bytes = prop.totalGlobalMem;
    info.bf16_peak_tflops = bf16_dense_peak_tflops(prop.name);
    snprintf(info.pci_bus_id, sizeof(info.pci_bus_id), "%04x:%02x:%02x.0", (unsigned)prop.pciDomainID, (unsigned)prop.pciBusID,
             (unsigned)prop.pciDeviceID);
    return info;
}

#endif // LLMC_CUDA_COMMON_H
