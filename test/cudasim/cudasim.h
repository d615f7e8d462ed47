/*
cudasim.h: runs llm8's CUDA kernels on the CPU, for tests on machines without a GPU.

Why: most sessions that write llm8's kernels have no GPU, and CUDA code that was only
compiled has never been checked: an index off by one, a missing __syncthreads, a warp
shuffle across a divergent branch, a shared-memory size above the 48 KB default without the
attribute. cudasim compiles the kernels with the host C++ compiler and runs every CUDA
thread of a block as a fiber on one CPU thread, switching fibers only at the points where
CUDA threads meet (__syncthreads, warp shuffles and votes, __syncwarp). So the kernels'
indexing, shared memory, barriers and warp collectives run as written, and the GPU tests
(test/test_*.cu) and the trainer run unchanged against the same CPU references.

What it checks that a GPU would not report: threads of one block waiting at different
__syncthreads (or some exited), a warp collective whose mask names a lane that never
arrives, device buffers read before written (cudaMalloc fills them with 0xff: bf16 NaN),
shared memory read before the block wrote it (dynamic and static shared memory start each
block as 0xff bytes, CUDASIM_FRESH_SHARED),
writes past an allocation or past a block's dynamic shared memory (a guard page after each),
a launch wider than 1024 threads (or than the kernel's __launch_bounds__, which a GPU refuses
at the launch) or with more dynamic shared memory than the kernel's attribute allows, a CUDA
call in a process forked after its parent called CUDA (which CUDA does not support). And what a GPU faults on but x86 does not: a uint2/int4/Packed128 access
through a misaligned pointer (checked_reinterpret_cast below: cudaErrorMisalignedAddress).

A data race between the threads of a block shows as a result that depends on the order
they run in: each block runs its threads in a fresh pseudo-random order, one warp of it
lagging (run only when no other thread can), so the tests' "run twice, bitwise equal" checks
and their references catch it (cudasim_runtime.cpp, choose_schedule_order). A race between
blocks shows the same way: each launch runs its blocks in its own pseudo-random order
(block_order).

A missing dependency between streams shows the same way: every stream-ordered call (kernel
launch, async copy and memset, event record and wait, cublasLtMatmul, NCCL collective) is
queued with its arguments taken at the call, and the queues run only when the host must
observe them (stream/event synchronization and queries, device synchronization, cudaFree,
copies the CUDA documentation calls synchronous), each step taking the next work of a
pseudo-randomly chosen stream among those whose next work may start: events, and the legacy
default stream's implicit ordering with blocking (not non-blocking) streams. A host write to
a cudaMallocHost buffer before the copy from it has run reaches the device, as on a GPU
(cudasim_runtime.cpp, drain_until). CUDASIM_STREAM_ORDER=newest-first runs the most recently
enqueued startable work first instead: work issued early for a later reader (a collective on
a communication stream) runs as late as the waits on it allow, so a reader that does not wait
reads the old data every time, and its bits differ from the default order's.
CUDASIM_MEMORY_REPORT=1 prints at exit the most device memory allocated at once (the tests
compare it with what the trainer says it allocates). The device has 80 GiB, or
CUDASIM_MEMORY_BYTES (a test's smaller GPU, to run out of memory), and 132 SMs, or
CUDASIM_SM_COUNT (fewer: a grid sized to what the GPU holds at once then gives each block
several pieces of work at a test's sizes). Its name is "cudasim (CPU)",
or CUDASIM_DEVICE_NAME (a GPU's, whose peak the trainer's MFU takes).
CUDASIM_LAUNCH_QUEUE=N bounds each stream's queue at N pieces of work, as a GPU's launch queue
is bounded: one more blocks the host until the oldest have run, with no deadline (behind a
collective that waits for a dead peer, for good: what llmc/multi_gpu.h's watchdog is for).

What it does not model: work running while the host goes on (queued work runs only inside a
synchronizing call, so a race between the host and a kernel shows only through pinned
memory); graphs, per-thread default stream semantics beyond one host thread, stream
priorities; timing; the GPU's exact bits where its math is approximate (a kernel gets the
host's result moved within the GPU's error bound instead: gpu_approximation below). cuBLASLt, NCCL and the
driver's virtual-memory calls are emulated in cudasim_*.cpp from their documented
semantics, so a misunderstanding of those semantics is shared with the code under test;
the GPU tests on a real device remain the authority.

Use: translate.py rewrites `kernel<<<cfg>>>(args)` into cudasim::launch(...) and
`extern __shared__ T name[]` into a pointer, then the sources compile with g++ and this
header force-included (-include). Nothing here is used by the real build.
*/
#ifndef CUDASIM_H
#define CUDASIM_H

#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <stdint.h>
#include <string.h>
#include <math.h>
#include <tuple>
#include <utility>
#include <type_traits>
#include <functional>
#include <memory>
#include <algorithm>

// the CUDA qualifiers: everything is host code here
#undef __global__
#undef __device__
#undef __host__
#undef __shared__
#undef __constant__
#undef __forceinline__
#undef __launch_bounds__
#undef __align__
#define __global__
#define __device__
#define __host__
#define __constant__ static
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __align__(n) alignas(n)
// one copy per simulated block: an OS thread runs one block at a time
#define __shared__ static thread_local

#define CUDASIM 1

namespace cudasim {

struct LaunchConfig {
    dim3 grid, block;
    size_t dynamic_shared_bytes;
    cudaStream_t stream;
    long max_threads = 1024;  // per block: the kernel's __launch_bounds__ (translate.py's bounded())
    LaunchConfig(dim3 g, dim3 b, size_t shared = 0, cudaStream_t s = 0)
        : grid(g), block(b), dynamic_shared_bytes(shared), stream(s) {}
    LaunchConfig bounded(long threads) const { LaunchConfig c = *this; c.max_threads = threads; return c; }
};

// the simulated thread now running
struct ThreadCoordinates {
    dim3 thread_idx, block_idx, block_dim, grid_dim;
};
const ThreadCoordinates& coordinates();
void* dynamic_shared_memory();
// a number of its own for each block run (never 0), for CUDASIM_FRESH_SHARED
uint64_t block_serial();
// CUDASIM_FRESH_SHARED: the running block has a static __shared__ variable of `bytes`; counted
// against a GPU's limits (48 KB static; static + dynamic 48 KB, or 227 KB for a kernel whose
// cudaFuncAttributeMaxDynamicSharedMemorySize was raised), beyond which the block ends with
// cudaErrorLaunchOutOfResources (a GPU refuses such a kernel at its build or launch)
void static_shared_declared(size_t bytes);

// Static __shared__ memory holds garbage at the start of every block on a GPU. Here a static
// __shared__ variable is a thread_local, which would keep the previous block's values (so a
// read before the block's first write would see plausible numbers): translate.py follows each
// declaration with CUDASIM_FRESH_SHARED(name), and the first thread of a block to pass it fills
// the variable with 0xff bytes (NaN as a float), as dynamic_shared_memory() is filled, and
// counts its size into the block's static shared memory.
inline void fresh_shared(void* memory, size_t bytes, uint64_t* filled_for_block) {
    uint64_t block = block_serial();
    if (*filled_for_block != block) {
        *filled_for_block = block;
        memset(memory, 0xff, bytes);
        static_shared_declared(bytes);
    }
}
#define CUDASIM_FRESH_SHARED(name)                                                  \
    do {                                                                            \
        static thread_local uint64_t cudasim_filled_for_block_##name = 0;           \
        cudasim::fresh_shared((void*)&(name), sizeof(name), &cudasim_filled_for_block_##name); \
    } while (0)

// Stream-ordered work (cudasim_runtime.cpp): enqueue puts `work` at the end of `stream`'s
// queue (0: the legacy default stream); it runs when the host must observe it (a
// synchronizing call drains the queues, in a pseudo-random order among the streams whose next
// work may start). work(deadline) returns false while it cannot finish (a collective waiting
// for peers) and is called again later; the deadline (INFINITY where the host blocks) says
// how long it may wait. It starts only after `after` (if any) has completed. Returns its own
// completion, for a later enqueue's `after`.
struct Completion;
using StreamWork = std::function<bool(double deadline)>;
std::shared_ptr<Completion> enqueue(cudaStream_t stream, const char* what, StreamWork work,
                                    std::shared_ptr<Completion> after = nullptr);
// runs every stream's queued work until all is done (true) or `deadline` passes (false): what
// a host that blocks for a collective's peers must do first, so that no peer waits for work
// that only this host's waiting would run
bool synchronize_all_streams(double deadline);

// checks a launch and enqueues body (run once per CUDA thread of the grid) on config.stream;
// kernel_address identifies the kernel for its attributes (cudaFuncSetAttribute) and the
// error messages
void launch_grid(const LaunchConfig& config, const void* kernel_address, const char* kernel_name,
                 std::function<void()> body);

template <class... Params>
struct Launcher {
    void (*kernel)(Params...);
    LaunchConfig config;
    const char* name;
    template <class... Args>
    void operator()(Args&&... args) const {
        // converted once at the launch, like the argument buffer of a real launch (the queued
        // grid keeps its copy); each thread's call copies it into its own parameters
        std::tuple<Params...> params(std::forward<Args>(args)...);
        void (*k)(Params...) = kernel;
        launch_grid(config, (const void*)k, name, [k, params]() { std::apply(k, params); });
    }
};
template <class... Params>
Launcher<Params...> launch(LaunchConfig config, void (*kernel)(Params...), const char* name) {
    return Launcher<Params...>{kernel, config, name};
}

// for the driver emulation (cudasim_driver.cpp): device memory in use besides cudaMalloc's, and
// a kernel touching addresses without memory (ends the grid; the error sticks, as on a GPU)
bool device_memory_acquire(size_t bytes);
void device_memory_release(size_t bytes);
bool kernel_running();
[[noreturn]] void abandon_kernel(cudaError_t error);

// A GPU loads and stores a uint2, int4 or Packed128 with one instruction that needs the address
// aligned to the type's size, and faults otherwise (cudaErrorMisalignedAddress, sticky); x86
// does not care. translate.py rewrites every reinterpret_cast<To>(from) into this, so a kernel
// that makes such a pointer from a misaligned address ends its grid with that error, as on a
// GPU, and one stderr line names the kernel and the address. Host code is not checked.
[[noreturn]] void misaligned_access(const void* address, size_t alignment);
template <class To, class From>
inline To checked_reinterpret_cast(From from) {
    if constexpr (std::is_pointer<To>::value && std::is_pointer<From>::value) {
        typedef typename std::remove_cv<typename std::remove_pointer<To>::type>::type Pointee;
        if constexpr (!std::is_void<Pointee>::value) {
            if ((uintptr_t)from % alignof(Pointee) != 0 && kernel_running()) { misaligned_access(from, alignof(Pointee)); }
        }
    }
    return reinterpret_cast<To>(from);
}

// block barrier and warp collectives; file/line name the call site in a divergence report
void syncthreads(const char* file, int line);
// the barrier that also returns whether any thread of the block passed a nonzero predicate
int syncthreads_or(int predicate, const char* file, int line);
// every lane of mask deposits its value (at most 16 bytes); returns, once all have, the
// warp's slots by lane, valid until this lane's next collective, and a 33rd for a result the
// lane that completed the exchange (*completed, where not null) leaves there for the others
typedef unsigned char WarpSlot[16];
WarpSlot* warp_exchange(unsigned mask, const void* value, size_t bytes, const char* what, bool* completed = nullptr);
const int WARP_RESULT_SLOT = 32;
int lane_id();
template <class T>
T slot_value(const WarpSlot* slots, int lane) {
    T value;
    memcpy(&value, slots[lane], sizeof(T));
    return value;
}

template <class T>
T shfl_xor(unsigned mask, T value, int lane_mask, int width) {
    const WarpSlot* slots = warp_exchange(mask, &value, sizeof(T), "__shfl_xor_sync");
    int lane = lane_id();
    int source = lane ^ lane_mask;
    if ((source & ~(width - 1)) != (lane & ~(width - 1))) { source = lane; }
    return slot_value<T>(slots, source);
}
// the lanes' values combined in lane order, once, by the lane that completes the exchange
template <class T, class Combine>
T warp_reduce(unsigned mask, T value, Combine combine, const char* what) {
    bool completed = false;
    WarpSlot* slots = warp_exchange(mask, &value, sizeof(T), what, &completed);
    if (completed) {
        bool first = true;
        T result = value;
        for (int l = 0; l < 32; l++) {
            if (!(mask & (1u << l))) { continue; }
            result = first ? slot_value<T>(slots, l) : combine(result, slot_value<T>(slots, l));
            first = false;
        }
        memcpy(slots[WARP_RESULT_SLOT], &result, sizeof(T));
    }
    return slot_value<T>(slots, WARP_RESULT_SLOT);
}

// cp.async (the pipeline primitives of cuda_pipeline_primitives.h): a thread's copies from global
// to shared memory are queued, committed in groups, and land when the thread waits for them
// (__pipeline_wait_prior), the latest a GPU may land them: a read of the destination before
// the wait, or by another thread before a barrier after it, sees what was there before
void pipeline_copy(void* destination, const void* source, size_t bytes, size_t zfill);
void pipeline_commit();
void pipeline_wait_prior(size_t prior);

/*
The GPU's math is not the host's. Where a kernel calls a function the GPU computes only to
within some ulps (expf and logf as CUDA's math library has them without fast math, 2 and 1 ulp;
exp2_approx's ex2.approx.ftz and gelu's __fdividef reciprocal, about 2 ulp with results below
2^-126 flushed to 0: element_math.h's LLMC_GPU_APPROXIMATE), a kernel run here gets the host's
correctly rounded result moved by up to that many ulps, by an amount that is a fixed function of
the input (a GPU's result is one too), and flushed where the GPU flushes. So a test that holds
such a kernel's output bit for bit to a host reference fails here as it would on a GPU, and a
tolerance that is too tight for the GPU's error shows. Outside a kernel (the host references)
the result is the host's.
*/
bool in_kernel();
float gpu_approximation(float exact, float input, int ulps, bool flush_subnormal);

} // namespace cudasim

static inline float cudasim_expf(float x) { return cudasim::gpu_approximation(expf(x), x, 2, false); }
static inline float cudasim_logf(float x) { return cudasim::gpu_approximation(logf(x), x, 1, false); }
#define expf(x) cudasim_expf(x)
#define logf(x) cudasim_logf(x)
#define LLMC_GPU_APPROXIMATE(exact, input, ulps) cudasim::gpu_approximation(exact, input, ulps, true)

static inline void __pipeline_memcpy_async(void* destination, const void* source, size_t bytes, size_t zfill = 0) {
    cudasim::pipeline_copy(destination, source, bytes, zfill);
}
static inline void __pipeline_commit() { cudasim::pipeline_commit(); }
static inline void __pipeline_wait_prior(size_t prior) { cudasim::pipeline_wait_prior(prior); }

#define threadIdx (cudasim::coordinates().thread_idx)
#define blockIdx (cudasim::coordinates().block_idx)
#define blockDim (cudasim::coordinates().block_dim)
#define gridDim (cudasim::coordinates().grid_dim)

#define __syncthreads() cudasim::syncthreads(__FILE__, __LINE__)
#define __syncthreads_or(predicate) cudasim::syncthreads_or((predicate), __FILE__, __LINE__)
static inline void __syncwarp(unsigned mask = 0xffffffffu) {
    int dummy = 0;
    cudasim::warp_exchange(mask, &dummy, sizeof(dummy), "__syncwarp");
}
template <class T>
static inline T __shfl_xor_sync(unsigned mask, T value, int lane_mask, int width = 32) {
    return cudasim::shfl_xor(mask, value, lane_mask, width);
}
// CUDA has these for int and unsigned
template <class T>
static inline T __reduce_add_sync(unsigned mask, T value) {
    return cudasim::warp_reduce(mask, value, [](T a, T b) { return (T)(a + b); }, "__reduce_add_sync");
}
template <class T>
static inline T __reduce_max_sync(unsigned mask, T value) {
    return cudasim::warp_reduce(mask, value, [](T a, T b) { return a > b ? a : b; }, "__reduce_max_sync");
}
template <class T>
static inline T __reduce_min_sync(unsigned mask, T value) {
    return cudasim::warp_reduce(mask, value, [](T a, T b) { return a < b ? a : b; }, "__reduce_min_sync");
}
static inline int __all_sync(unsigned mask, int predicate) {
    return cudasim::warp_reduce(mask, predicate != 0, [](bool a, bool b) { return a && b; }, "__all_sync");
}
static inline int __any_sync(unsigned mask, int predicate) {
    return cudasim::warp_reduce(mask, predicate != 0, [](bool a, bool b) { return a || b; }, "__any_sync");
}

// atomics: blocks run on several OS threads, so these are real read-modify-writes
template <class T, class Update>
static inline T cudasim_atomic_update(T* address, Update update) {
    T expected, desired;
    __atomic_load(address, &expected, __ATOMIC_RELAXED);
    do {
        desired = update(expected);
    } while (!__atomic_compare_exchange(address, &expected, &desired, false, __ATOMIC_SEQ_CST, __ATOMIC_RELAXED));
    return expected;
}
template <class T> static inline T atomicAdd(T* address, T value) { return cudasim_atomic_update(address, [=](T old) { return (T)(old + value); }); }
template <class T> static inline T atomicMax(T* address, T value) { return cudasim_atomic_update(address, [=](T old) { return value > old ? value : old; }); }
template <class T> static inline T atomicMin(T* address, T value) { return cudasim_atomic_update(address, [=](T old) { return value < old ? value : old; }); }

// loads and stores with cache hints, and the bit casts
template <class T> static inline T __ldcs(const T* address) { return *address; }
template <class T> static inline void __stcs(T* address, T value) { *address = value; }
static inline unsigned __float_as_uint(float x) { unsigned u; memcpy(&u, &x, 4); return u; }
static inline float __uint_as_float(unsigned u) { float x; memcpy(&x, &u, 4); return x; }
static inline float __int_as_float(int u) { float x; memcpy(&x, &u, 4); return x; }
// SIMD video intrinsics: each 16-bit half compared on its own, unsigned
static inline unsigned __vmaxu2(unsigned a, unsigned b) {
    unsigned low = (a & 0xffffu) > (b & 0xffffu) ? (a & 0xffffu) : (b & 0xffffu);
    unsigned high = (a >> 16) > (b >> 16) ? (a >> 16) : (b >> 16);
    return (high << 16) | low;
}
static inline float __fdiv_rn(float a, float b) { return a / b; }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline int __popc(unsigned x) { return __builtin_popcount(x); }
// the kernel-pointer overload of the runtime call (cuda_runtime.h has it for nvcc only)
template <class... Params>
static inline cudaError_t cudaFuncSetAttribute(void (*kernel)(Params...), cudaFuncAttribute attribute, int value) {
    return cudaFuncSetAttribute((const void*)kernel, attribute, value);
}
using std::min;
using std::max;

#endif // CUDASIM_H
