/*
test_cudasim_faults.cu: what a GPU refuses or faults on and x86 would let pass, cudasim
refuses too (run under cudasim only):
- a uint2 load (one 8-byte instruction on a GPU, which needs an 8-byte aligned address)
  from an aligned address delivers the values; 4 bytes further on, the grid ends with
  cudaErrorMisalignedAddress, which sticks (so this case comes last);
- a block's dynamic shared memory ends at an inaccessible page: the last byte is writable,
  the byte after it faults (in a forked child, before this process touches CUDA);
- a kernel declared __launch_bounds__(64) launched with 128 threads per block fails at the
  launch (cudaErrorLaunchOutOfResources, not sticky), and nothing of it runs;
- __syncthreads_or returns, in every thread, whether any thread of the block passed a
  nonzero predicate to that barrier: one thread, none, all, over consecutive barriers (each
  barrier's vote is its own);
- __reduce_add_sync, __reduce_max_sync, __reduce_min_sync, __any_sync and __all_sync give
  every lane of the mask the reduction over the mask's lanes, in consecutive reductions of
  different kinds and masks (each one's result its own: one lane combines, the others read);
- a read of shared memory with no barrier before the next write to it is a race the schedule
  shows: two block sums in a row, as block_reduce_sum takes them but without its second
  barrier, give some threads a wrong first sum (the warp left behind reads the partial sums
  of the second), and block_reduce_sum itself gives every thread both sums right;
- static __shared__ memory holds garbage (0xff bytes) at the start of every block, not the
  values the previous block on the same OS thread left (a read before the block's first
  write shows), in a kernel and in a __device__ function it calls twice (the second call
  sees the first call's value: one variable per block).
- a block's static __shared__ memory counts against a GPU's limits: more than 48 KB of it,
  more than 48 KB of static and dynamic together for a kernel that did not raise its dynamic
  limit, or more than 227 KB for one that did, ends the kernel with an error (in forked
  children); 40 KB static with 4 KB dynamic, or with 180 KB after raising the limit, runs.
- cp.async (__pipeline_memcpy_async): a copy lands in shared memory when its thread waits for
  its group, not before: read before the wait, the destination holds what it held (garbage);
  __pipeline_wait_prior(1) lands every group but the newest, (0) all of them;
- blocks run in no set order, as on a GPU: each block takes a ticket as it starts, and in two
  launches of 64 blocks every block runs once, neither launch in index order, the two orders
  different; so a race between blocks (the last to write one global value wins) gives
  different results from one launch to the next, which "run twice, bitwise equal" catches;
- the GPU's approximate math in a kernel: over 4096 inputs, expf and exp2_approx and gelu's
  reciprocal differ from the host's correctly rounded results by at most 2 ulps and logf by at
  most 1, some by each amount (so a test that wants them bit for bit fails here, as on a GPU),
  the same input always giving the same result; exp2_approx and the reciprocal flush results
  below 2^-126 to 0, as ex2.approx.ftz and __fdividef do; the same calls on the host are exact;
- cudaMalloc of 0 bytes succeeds and allocates nothing: the pointer stays as it was (CUDA
  documents nothing; runtimes leave it or set NULL), so no caller can use such a buffer;
- CUDA does not survive fork(): once this process has called CUDA, a forked child's
  cudaMalloc, kernel launch or memset stops the child with cudasim's line (on a GPU it would
  fail), and a child that makes no CUDA call exits as it likes.
*/
#include "llmc/cuda_common.h"
#include "llmc/cuda_utils.cuh"
#include "llmc/element_math.h"
#include "test/test_harness.h"
#include "test/test_harness_fork.h"

__global__ void load_pair_kernel(uint2* out, const uint32_t* in, int offset) {
    *out = *reinterpret_cast<const uint2*>(in + offset);
}

__global__ void write_shared_byte_kernel(int index) {
    extern __shared__ unsigned char bytes[];
    bytes[index] = 1;
}

// whether a child that writes byte `index` of 64 bytes of dynamic shared memory ends by SIGSEGV
static bool shared_write_faults(int index) {
    ChildRun run;
    if (child_run_begin(&run)) {
        write_shared_byte_kernel<<<1, 1, 64>>>(index);
        _exit(cudaDeviceSynchronize() == cudaSuccess ? 0 : 1);
    }
    close(run.stderr_pipe[0]);
    int status = 0;
    waitpid(run.pid, &status, 0);
    return WIFSIGNALED(status) && WTERMSIG(status) == SIGSEGV;
}

__global__ void big_static_shared_kernel(int* out) {
    __shared__ unsigned char big[52 * 1024];
    big[threadIdx.x] = 1;
    *out = big[0];
}
__global__ void static_and_dynamic_shared_kernel(int* out) {
    __shared__ unsigned char fixed[40 * 1024];
    extern __shared__ unsigned char flexible[];
    fixed[threadIdx.x] = 1;
    flexible[threadIdx.x] = 2;
    *out = fixed[0] + flexible[0];
}

// a child runs one of the kernels above (dynamic_kb > 0: the second, with that much dynamic
// shared memory, its limit raised to it first if raise_limit): SHARED_KERNEL_RAN (no CUDA error,
// the right value), SHARED_KERNEL_REFUSED (a CUDA error and cudasim's line on the shared memory)
// or SHARED_KERNEL_OTHER
enum { SHARED_KERNEL_RAN, SHARED_KERNEL_REFUSED, SHARED_KERNEL_OTHER };
static int shared_kernel_outcome(int dynamic_kb, bool raise_limit) {
    ChildRun run;
    if (child_run_begin(&run)) {
        int* out;
        if (cudaMalloc(&out, sizeof(int)) != cudaSuccess) { _exit(2); }
        if (dynamic_kb == 0) {
            big_static_shared_kernel<<<1, 1>>>(out);
        } else {
            if (raise_limit) {
                cudaFuncSetAttribute(static_and_dynamic_shared_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     dynamic_kb * 1024);
            }
            static_and_dynamic_shared_kernel<<<1, 1, dynamic_kb * 1024>>>(out);
        }
        if (cudaDeviceSynchronize() != cudaSuccess) { _exit(1); }
        int got = 0;
        cudaMemcpy(&got, out, sizeof(int), cudaMemcpyDeviceToHost);
        _exit(got == (dynamic_kb == 0 ? 1 : 3) ? 0 : 2);
    }
    char text[CHILD_STDERR_MAX + 1];
    size_t length;
    int status = child_run_collect(&run, text, &length);
    if (!WIFEXITED(status)) { return SHARED_KERNEL_OTHER; }
    if (WEXITSTATUS(status) == 0 && length == 0) { return SHARED_KERNEL_RAN; }
    if (WEXITSTATUS(status) == 1 && strstr(text, "of static shared memory") != NULL) { return SHARED_KERNEL_REFUSED; }
    return SHARED_KERNEL_OTHER;
}

__global__ void __launch_bounds__(64) mark_kernel(int* flag) { *flag = 1; }

// a child forked after this process called CUDA makes call `which` (0 none, 1 cudaMalloc, 2 a
// kernel launch, 3 cudaMemsetAsync): whether it was stopped, by SIGABRT with cudasim's line
static bool forked_child_call_stopped(int which, int* flag) {
    ChildRun run;
    if (child_run_begin(&run)) {
        void* memory = nullptr;
        if (which == 1) { (void)cudaMalloc(&memory, 16); }
        if (which == 2) { mark_kernel<<<1, 1>>>(flag); }
        if (which == 3) { (void)cudaMemsetAsync(flag, 0, sizeof(int), 0); }
        _exit(0);
    }
    char text[CHILD_STDERR_MAX + 1];
    size_t length;
    int status = child_run_collect(&run, text, &length);
    return WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT && strstr(text, "forked after its parent had called CUDA") != NULL;
}

// votes[3 * thread + k]: what barrier k returned to the thread (predicates: thread 37 only,
// none, every thread)
__global__ void vote_kernel(int* votes) {
    const int t = threadIdx.x;
    votes[3 * t + 0] = __syncthreads_or(t == 37);
    votes[3 * t + 1] = __syncthreads_or(0);
    votes[3 * t + 2] = __syncthreads_or(1);
}

static void test_syncthreads_or(void) {
    const int threads = 96;
    int* votes;
    cudaCheck(cudaMalloc(&votes, 3 * threads * sizeof(int)));
    vote_kernel<<<2, threads>>>(votes);
    cudaCheck(cudaDeviceSynchronize());
    int host[3 * 96];
    cudaCheck(cudaMemcpy(host, votes, sizeof(host), cudaMemcpyDeviceToHost));
    int wrong = 0;
    for (int t = 0; t < threads; t++) { wrong += host[3 * t] != 1 || host[3 * t + 1] != 0 || host[3 * t + 2] != 1; }
    CHECK(wrong == 0, "__syncthreads_or: %d of %d threads got other votes than (1, 0, 1)", wrong, threads);
    cudaCheck(cudaFree(votes));
}

// each thread's value for the warp reductions
__host__ __device__ static unsigned reduction_input(unsigned block, unsigned thread) { return (thread * 7u) % 13u + 5u * block; }
#define REDUCTIONS 5
#define EVEN_LANES 0x55555555u

// out[REDUCTIONS t + k]: thread t's k-th reduction (the odd lanes skip the last, over the even lanes:
// cudasim has a warp in one collective at a time, so they may not go on to another before it ends)
__global__ void warp_reductions_kernel(unsigned* out) {
    const unsigned lane = threadIdx.x % 32, value = reduction_input(blockIdx.x, threadIdx.x);
    unsigned* mine = out + REDUCTIONS * ((size_t)blockIdx.x * blockDim.x + threadIdx.x);
    mine[0] = __reduce_add_sync(0xffffffffu, value);
    mine[1] = __reduce_max_sync(0xffffffffu, value);
    mine[2] = (unsigned)__any_sync(0xffffffffu, lane == 5 && threadIdx.x < 32);
    mine[3] = (unsigned)__all_sync(0xffffffffu, lane != 31 || threadIdx.x >= 32);
    mine[4] = lane % 2 == 0 ? __reduce_min_sync(EVEN_LANES, value) : 0u;
}

static void test_warp_reductions(void) {
    enum { blocks = 3, threads = 64 };
    unsigned* out;
    cudaCheck(cudaMalloc(&out, REDUCTIONS * blocks * threads * sizeof(unsigned)));
    warp_reductions_kernel<<<blocks, threads>>>(out);
    unsigned host[REDUCTIONS * blocks * threads];
    cudaCheck(cudaMemcpy(host, out, sizeof(host), cudaMemcpyDeviceToHost));
    cudaCheck(cudaFree(out));
    int wrong = 0;
    for (unsigned b = 0; b < blocks; b++) {
        for (unsigned t = 0; t < threads; t++) {
            const unsigned warp = t / 32 * 32;
            unsigned expected[REDUCTIONS] = {0u, 0u, warp == 0 ? 1u : 0u, warp == 0 ? 0u : 1u, t % 2 == 0 ? ~0u : 0u};
            for (unsigned lane = 0; lane < 32; lane++) {
                const unsigned value = reduction_input(b, warp + lane);
                expected[0] += value;
                expected[1] = value > expected[1] ? value : expected[1];
                if (t % 2 == 0 && lane % 2 == 0 && value < expected[4]) { expected[4] = value; }
            }
            const unsigned* got = host + REDUCTIONS * (b * threads + t);
            for (int k = 0; k < REDUCTIONS; k++) { wrong += got[k] != expected[k]; }
        }
    }
    CHECK(wrong == 0, "warp reductions: %d of %d results wrong", wrong, REDUCTIONS * blocks * threads);
}

// the word of static shared memory a __device__ function keeps: returns what it held, stores `value`
__device__ uint32_t swap_shared_word(uint32_t value) {
    __shared__ uint32_t word;
    uint32_t before = word;
    word = value;
    return before;
}

// one thread a block: seen[3 b] the kernel's own shared word before its first write, seen[3 b + 1]
// and [3 b + 2] what the function's word held at its first and second call
__global__ void shared_before_write_kernel(uint32_t* seen) {
    __shared__ uint32_t word;
    seen[3 * blockIdx.x] = word;
    word = blockIdx.x;
    seen[3 * blockIdx.x + 1] = swap_shared_word(100 + blockIdx.x);
    seen[3 * blockIdx.x + 2] = swap_shared_word(200 + blockIdx.x);
}

static void test_static_shared_starts_as_garbage(void) {
    const int blocks = 4;
    uint32_t* seen;
    cudaCheck(cudaMalloc(&seen, 3 * blocks * sizeof(uint32_t)));
    shared_before_write_kernel<<<blocks, 1>>>(seen);
    uint32_t host[3 * blocks];
    cudaCheck(cudaMemcpy(host, seen, sizeof(host), cudaMemcpyDeviceToHost));
    int wrong = 0;
    for (int b = 0; b < blocks; b++) {
        wrong += host[3 * b] != 0xffffffffu || host[3 * b + 1] != 0xffffffffu || host[3 * b + 2] != 100u + b;
    }
    CHECK(wrong == 0, "static __shared__ memory: %d of %d blocks did not start from 0xff bytes in the kernel and its "
          "function, or lost the function's word between its calls (block 1 saw 0x%x, 0x%x, %u)", wrong, blocks,
          host[3], host[4], host[5]);
    cudaCheck(cudaFree(seen));
}

// each block records its index at the ticket it draws as it starts, and writes it into *last
__global__ void block_ticket_kernel(int* order, int* tickets, int* last) {
    order[atomicAdd(tickets, 1)] = (int)blockIdx.x;
    *last = (int)blockIdx.x;
}

static void test_blocks_run_in_no_set_order(void) {
    const int blocks = 64;
    int *order, *tickets, *last;
    cudaCheck(cudaMalloc(&order, 2 * blocks * sizeof(int)));
    cudaCheck(cudaMalloc(&tickets, sizeof(int)));
    cudaCheck(cudaMalloc(&last, 2 * sizeof(int)));
    cudaCheck(cudaMemset(tickets, 0, sizeof(int)));
    block_ticket_kernel<<<blocks, 1>>>(order, tickets, last);
    block_ticket_kernel<<<blocks, 1>>>(order, tickets, last + 1);
    int host[2 * blocks], host_last[2];
    cudaCheck(cudaMemcpy(host, order, sizeof(host), cudaMemcpyDeviceToHost));
    cudaCheck(cudaMemcpy(host_last, last, sizeof(host_last), cudaMemcpyDeviceToHost));
    for (int launch = 0; launch < 2; launch++) {
        const int* ran = host + launch * blocks;
        int seen[blocks] = {0}, duplicates = 0, in_index_order = 1;
        for (int i = 0; i < blocks; i++) {
            duplicates += ran[i] < 0 || ran[i] >= blocks || seen[ran[i]]++ > 0;
            in_index_order = in_index_order && ran[i] == i;
        }
        CHECK(duplicates == 0, "launch %d of %d blocks: %d tickets went to a block that had run or to no block", launch,
              blocks, duplicates);
        CHECK(!in_index_order, "launch %d of %d blocks ran them in index order", launch, blocks);
        CHECK(host_last[launch] == ran[blocks - 1], "launch %d: the last block to run was %d but %d wrote last", launch,
              ran[blocks - 1], host_last[launch]);
    }
    CHECK(memcmp(host, host + blocks, blocks * sizeof(int)) != 0, "two launches of %d blocks ran them in one order",
          blocks);
    cudaCheck(cudaFree(order));
    cudaCheck(cudaFree(tickets));
    cudaCheck(cudaFree(last));
}

#define GPU_MATH_FUNCTIONS 4
#define GPU_MATH_INPUTS 4096

// function f of input i: expf, logf, exp2_approx, gelu's reciprocal
__host__ __device__ float gpu_math(int f, float x) {
    if (f == 0) { return expf(x); }
    if (f == 1) { return logf(x); }
    if (f == 2) { return exp2_approx(x); }
    return gelu_reciprocal_(x);
}

__host__ __device__ float gpu_math_input(int f, int i) {
    float t = (float)i / GPU_MATH_INPUTS;
    return f == 1 ? 0.01f + 100.0f * t : (f == 3 ? 1.0f + 1000.0f * t : -20.0f + 40.0f * t);
}

__global__ void gpu_math_kernel(float* out) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    for (int f = 0; f < GPU_MATH_FUNCTIONS; f++) { out[f * GPU_MATH_INPUTS + i] = gpu_math(f, gpu_math_input(f, i)); }
}

__global__ void flush_kernel(float* out) {
    out[0] = exp2_approx(-130.0f);
    out[1] = gelu_reciprocal_(0x1p127f);
}

static int ulps_apart(float a, float b) {
    int32_t x, y;
    memcpy(&x, &a, 4);
    memcpy(&y, &b, 4);
    return x > y ? x - y : y - x;
}

static void test_gpu_math_is_approximate_in_kernels(void) {
    const int allowed[GPU_MATH_FUNCTIONS] = {2, 1, 2, 2};
    const char* names[GPU_MATH_FUNCTIONS] = {"expf", "logf", "exp2_approx", "gelu_reciprocal_"};
    float *out, *flushed;
    cudaCheck(cudaMalloc(&out, 2 * GPU_MATH_FUNCTIONS * GPU_MATH_INPUTS * sizeof(float)));
    cudaCheck(cudaMalloc(&flushed, 2 * sizeof(float)));
    gpu_math_kernel<<<GPU_MATH_INPUTS / 256, 256>>>(out);
    gpu_math_kernel<<<GPU_MATH_INPUTS / 256, 256>>>(out + GPU_MATH_FUNCTIONS * GPU_MATH_INPUTS);
    flush_kernel<<<1, 1>>>(flushed);
    static float host[2 * GPU_MATH_FUNCTIONS * GPU_MATH_INPUTS];
    float host_flushed[2];
    cudaCheck(cudaMemcpy(host, out, sizeof(host), cudaMemcpyDeviceToHost));
    cudaCheck(cudaMemcpy(host_flushed, flushed, sizeof(host_flushed), cudaMemcpyDeviceToHost));
    for (int f = 0; f < GPU_MATH_FUNCTIONS; f++) {
        int count_by_ulps[3] = {0, 0, 0}, beyond = 0, unstable = 0, host_inexact = 0;
        for (int i = 0; i < GPU_MATH_INPUTS; i++) {
            float x = gpu_math_input(f, i), kernel = host[f * GPU_MATH_INPUTS + i];
            float exact = f == 0 ? expf(x) : f == 1 ? logf(x) : f == 2 ? exp2f(x) : 1.0f / x;
            int apart = ulps_apart(kernel, exact);
            if (apart > allowed[f]) { beyond++; } else { count_by_ulps[apart]++; }
            unstable += memcmp(&kernel, &host[(GPU_MATH_FUNCTIONS + f) * GPU_MATH_INPUTS + i], 4) != 0;
            float on_host = gpu_math(f, x);
            host_inexact += memcmp(&on_host, &exact, 4) != 0;
        }
        CHECK(beyond == 0, "%s in a kernel: %d of %d results more than %d ulps from the host's", names[f], beyond,
              GPU_MATH_INPUTS, allowed[f]);
        for (int u = 0; u <= allowed[f]; u++) {
            CHECK(count_by_ulps[u] > GPU_MATH_INPUTS / 10, "%s in a kernel: only %d of %d results %d ulps from the "
                  "host's", names[f], count_by_ulps[u], GPU_MATH_INPUTS, u);
        }
        CHECK(unstable == 0, "%s in a kernel: %d inputs gave a different result the second time", names[f], unstable);
        CHECK(host_inexact == 0, "%s on the host: %d of %d results not the correctly rounded one", names[f],
              host_inexact, GPU_MATH_INPUTS);
    }
    CHECK(host_flushed[0] == 0.0f && host_flushed[1] == 0.0f, "results below 2^-126 in a kernel: exp2_approx(-130) "
          "= %g, gelu_reciprocal_(2^127) = %g, expected both flushed to 0", host_flushed[0], host_flushed[1]);
    CHECK(exp2_approx(-130.0f) == exp2f(-130.0f), "exp2_approx(-130) on the host is not exp2f's subnormal");
    cudaCheck(cudaFree(out));
    cudaCheck(cudaFree(flushed));
}

// one thread, two groups of one 16-byte copy each: what shared memory holds before any wait,
// after waiting for all but the newest group, and after waiting for all
__global__ void pipeline_copy_kernel(uint4* seen, const uint4* in) {
    __shared__ uint4 staged[2];
    __pipeline_memcpy_async(&staged[0], &in[0], 16);
    __pipeline_commit();
    __pipeline_memcpy_async(&staged[1], &in[1], 16);
    __pipeline_commit();
    seen[0] = staged[0];
    __pipeline_wait_prior(1);
    seen[1] = staged[0];
    seen[2] = staged[1];
    __pipeline_wait_prior(0);
    seen[3] = staged[1];
}

static void test_pipeline_copies_land_at_the_wait(void) {
    uint4 host_in[2] = {make_uint4(1, 2, 3, 4), make_uint4(5, 6, 7, 8)};
    uint4 *in, *seen;
    cudaCheck(cudaMalloc(&in, sizeof(host_in)));
    cudaCheck(cudaMalloc(&seen, 4 * sizeof(uint4)));
    cudaCheck(cudaMemcpy(in, host_in, sizeof(host_in), cudaMemcpyHostToDevice));
    pipeline_copy_kernel<<<1, 1>>>(seen, in);
    uint4 host[4];
    cudaCheck(cudaMemcpy(host, seen, sizeof(host), cudaMemcpyDeviceToHost));
    CHECK(host[0].x == 0xffffffffu, "a cp.async copy landed before its wait (0x%x, not the 0xff garbage)", host[0].x);
    CHECK(host[1].x == 1 && host[1].w == 4, "__pipeline_wait_prior(1) did not land the older group (%u)", host[1].x);
    CHECK(host[2].x == 0xffffffffu, "__pipeline_wait_prior(1) landed the newest group too (0x%x)", host[2].x);
    CHECK(host[3].x == 5 && host[3].w == 8, "__pipeline_wait_prior(0) did not land the newest group (%u)", host[3].x);
    cudaCheck(cudaFree(in));
    cudaCheck(cudaFree(seen));
}

// block_reduce_sum without the barrier after its read of the partial sums
__device__ float block_sum_missing_a_barrier(float value) {
    __shared__ float warp_sums[WARP_SIZE];
    float warp_sum = warp_reduce_sum(value);
    if (threadIdx.x % WARP_SIZE == 0) { warp_sums[threadIdx.x / WARP_SIZE] = warp_sum; }
    __syncthreads();
    float partial = threadIdx.x % WARP_SIZE < blockDim.x / WARP_SIZE ? warp_sums[threadIdx.x % WARP_SIZE] : 0.0f;
    return warp_reduce_sum(partial);
}

// every thread's two sums: of 1 over the block, then of 2
__global__ void two_block_sums_kernel(float* sums, int racy) {
    float* mine = sums + 2 * ((size_t)blockIdx.x * blockDim.x + threadIdx.x);
    mine[0] = racy ? block_sum_missing_a_barrier(1.0f) : block_reduce_sum(1.0f);
    mine[1] = racy ? block_sum_missing_a_barrier(2.0f) : block_reduce_sum(2.0f);
}

// how many of the threads' sums are wrong, over 8 blocks of 4 warps
static int wrong_block_sums(int racy) {
    enum { blocks = 8, threads = 128 };
    float* sums;
    cudaCheck(cudaMalloc(&sums, 2 * blocks * threads * sizeof(float)));
    two_block_sums_kernel<<<blocks, threads>>>(sums, racy);
    float host[2 * blocks * threads];
    cudaCheck(cudaMemcpy(host, sums, sizeof(host), cudaMemcpyDeviceToHost));
    cudaCheck(cudaFree(sums));
    int wrong = 0;
    for (int i = 0; i < blocks * threads; i++) { wrong += host[2 * i] != threads || host[2 * i + 1] != 2 * threads; }
    return wrong;
}

int main() {
    CHECK(!shared_write_faults(63), "writing the last byte of 64 bytes of dynamic shared memory faults");
    CHECK(shared_write_faults(64), "writing one byte past 64 bytes of dynamic shared memory does not fault");
    CHECK(shared_kernel_outcome(0, false) == SHARED_KERNEL_REFUSED, "a kernel with 52 KB of static shared memory was "
          "not refused (a GPU allows 48 KB)");
    CHECK(shared_kernel_outcome(4, false) == SHARED_KERNEL_RAN, "a kernel with 40 KB of static and 4 KB of dynamic "
          "shared memory did not run");
    CHECK(shared_kernel_outcome(44, false) == SHARED_KERNEL_REFUSED, "a kernel with 40 KB of static and 44 KB of dynamic "
          "shared memory, its limit not raised, was not refused (a GPU allows 48 KB together)");
    CHECK(shared_kernel_outcome(180, true) == SHARED_KERNEL_RAN, "a kernel with 40 KB of static and 180 KB of dynamic "
          "shared memory, its limit raised, did not run");
    CHECK(shared_kernel_outcome(190, true) == SHARED_KERNEL_REFUSED, "a kernel with 40 KB of static and 190 KB of "
          "dynamic shared memory was not refused (a GPU allows 227 KB together)");
    void* nothing = (void*)(uintptr_t)0x1000;
    CHECK(cudaMalloc(&nothing, 0) == cudaSuccess && nothing == (void*)(uintptr_t)0x1000,
          "cudaMalloc of 0 bytes failed or set the pointer (%p)", nothing);
    uint32_t host_in[4] = {11, 22, 33, 44};
    uint32_t* in;
    uint2* out;
    cudaCheck(cudaMalloc(&in, sizeof(host_in)));
    cudaCheck(cudaMalloc(&out, sizeof(uint2)));
    cudaCheck(cudaMemcpy(in, host_in, sizeof(host_in), cudaMemcpyHostToDevice));

    load_pair_kernel<<<1, 1>>>(out, in, 2);
    cudaCheck(cudaDeviceSynchronize());
    uint2 got;
    cudaCheck(cudaMemcpy(&got, out, sizeof(got), cudaMemcpyDeviceToHost));
    CHECK(got.x == 33 && got.y == 44, "aligned uint2 load: got (%u, %u), expected (33, 44)", got.x, got.y);

    int* flag;
    cudaCheck(cudaMalloc(&flag, sizeof(int)));
    cudaCheck(cudaMemset(flag, 0, sizeof(int)));
    mark_kernel<<<1, 128>>>(flag);
    cudaError_t launch = cudaGetLastError();
    CHECK(launch == cudaErrorLaunchOutOfResources, "128 threads for __launch_bounds__(64): %s, expected "
          "cudaErrorLaunchOutOfResources", cudaGetErrorName(launch));
    int host_flag = -1;
    cudaCheck(cudaMemcpy(&host_flag, flag, sizeof(int), cudaMemcpyDeviceToHost));  // not sticky: this succeeds
    CHECK(host_flag == 0, "the refused launch ran");
    mark_kernel<<<1, 64>>>(flag);
    cudaCheck(cudaGetLastError());
    cudaCheck(cudaMemcpy(&host_flag, flag, sizeof(int), cudaMemcpyDeviceToHost));
    CHECK(host_flag == 1, "64 threads for __launch_bounds__(64) did not run");

    test_syncthreads_or();
    test_warp_reductions();
    test_pipeline_copies_land_at_the_wait();
    int racy_wrong = wrong_block_sums(1), wrong = wrong_block_sums(0);
    CHECK(racy_wrong > 0, "two block sums with no barrier between a read and the next write: no thread's sum wrong");
    CHECK(wrong == 0, "block_reduce_sum twice in a row: %d threads' sums wrong", wrong);
    test_static_shared_starts_as_garbage();
    test_blocks_run_in_no_set_order();
    test_gpu_math_is_approximate_in_kernels();
    CHECK(!forked_child_call_stopped(0, flag), "a child forked after CUDA calls, making none itself, was stopped");
    const char* calls[4] = {"", "cudaMalloc", "a kernel launch", "cudaMemsetAsync"};
    for (int which = 1; which <= 3; which++) {
        CHECK(forked_child_call_stopped(which, flag), "a child forked after this process called CUDA made %s unstopped",
              calls[which]);
    }

    load_pair_kernel<<<1, 1>>>(out, in, 1);
    cudaError_t error = cudaDeviceSynchronize();
    CHECK(error == cudaErrorMisalignedAddress, "uint2 load 4 bytes off alignment: %s, expected cudaErrorMisalignedAddress",
          cudaGetErrorName(error));
    return test_summary("test_cudasim_faults");
}
