/*
cudasim_runtime.cpp: the simulated grid (one fiber per CUDA thread, switched only where
threads meet) and the CUDA runtime calls llm8 makes, on host memory. See cudasim.h.

Scheduling: a block's threads start in order; each runs until it exits or reaches a meeting
point (block barrier, warp collective). A meeting completes when every thread it names has
arrived at the same kind of point; a meeting that can never complete (a thread of the block
exited before a __syncthreads, threads waiting at two different barriers, a warp collective
whose mask names a lane that left) stops the program with the kernel and the call sites.
Streams are queues (see "streams" below): a launch, copy, memset, event record or wait is
enqueued with its arguments taken at the call, and runs when the host must observe it, in a
seeded pseudo-random order among the streams whose next work may start (dependencies:
cudaStreamWaitEvent, the legacy default stream's implicit ordering with blocking streams;
non-blocking streams are ordered with nothing but their events). Which calls synchronize the
host follows the CUDA runtime's "API synchronization behavior" (enqueue_copy). One host
thread calls the API (the queues take no lock); blocks of one kernel run on OpenMP threads.
*/
#include "cudasim.h"
#if !defined(__x86_64__)
#include <ucontext.h>
#endif
#include <sys/mman.h>
#include <setjmp.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string>
#include <vector>
#include <map>
#include <atomic>
#include <mutex>
#include <deque>
#include <memory>
#include <math.h>
#include <float.h>

namespace cudasim {

[[noreturn]] static void fail(const std::string& message) {
    fprintf(stderr, "cudasim: %s\n", message.c_str());
    fflush(stderr);
    abort();
}

/*
CUDA does not survive fork(): a process forked after its parent called CUDA may not call it
(on a GPU such a call fails with cudaErrorInitializationError, or hangs). The tests fork before
their first CUDA call (test_multi_gpu's ranks, the CHECK_DIES of bad input), or their child
must die before it reaches one; a child that calls CUDA anyway stops here naming the call,
where it would otherwise pass a test that a GPU fails.
*/
static bool called_cuda = false, forked_after_cuda = false;
static const int fork_watch = pthread_atfork(nullptr, nullptr, [] { forked_after_cuda = called_cuda; });

static void note_cuda_call(const char* call) {
    if (forked_after_cuda) {
        fail(std::string(call) + " in a process forked after its parent had called CUDA, which CUDA does not support "
             "(on a GPU it fails): fork before the first CUDA call");
    }
    called_cuda = true;
}

// ----------------------------------------------------------------------------------------
// fibers: on x86-64 a switch saves the callee-saved registers and the stack pointer (glibc's
// swapcontext also saves the signal mask, a system call per switch, and was 30% of the
// run time); elsewhere ucontext

#if defined(__x86_64__)
struct FiberContext { void* stack_pointer; };
extern "C" void cudasim_switch_context(void** save_stack_pointer, void* load_stack_pointer);
asm(R"(
    .text
    .globl cudasim_switch_context
    .type cudasim_switch_context, @function
cudasim_switch_context:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size cudasim_switch_context, .-cudasim_switch_context
)");
static void switch_context(FiberContext* from, FiberContext* to) { cudasim_switch_context(&from->stack_pointer, to->stack_pointer); }
// a new context whose first switch "returns" into entry with the stack aligned as after a call
static void make_context(FiberContext* context, char* stack, size_t bytes, void (*entry)()) {
    uintptr_t top = ((uintptr_t)(stack + bytes)) & ~(uintptr_t)15;
    void** slots = (void**)(top - 8 * sizeof(void*));
    for (int i = 0; i < 6; i++) { slots[i] = nullptr; }  // r15 r14 r13 r12 rbx rbp
    slots[6] = (void*)entry;                             // where ret goes
    slots[7] = nullptr;                                  // entry's (never used) return address
    context->stack_pointer = slots;
}
#else
struct FiberContext { ucontext_t context; };
static void switch_context(FiberContext* from, FiberContext* to) { swapcontext(&from->context, &to->context); }
static void make_context(FiberContext* context, char* stack, size_t bytes, void (*entry)()) {
    getcontext(&context->context);
    context->context.uc_stack.ss_sp = stack;
    context->context.uc_stack.ss_size = bytes;
    context->context.uc_link = nullptr;
    makecontext(&context->context, entry, 0);
}
#endif

static const size_t FIBER_STACK_BYTES = 256 * 1024;
// Fiber i's stack starts i cache lines (modulo 1024) below its mapping's end. The mappings are
// FIBER_STACK_BYTES apart, so the stacks' tops would all fall in the same sets of the CPU's
// caches and evict each other at every switch (a switch's first load was most of its time).
static size_t fiber_stack_offset(int fiber) { return (size_t)(fiber % 1024) * 64; }

enum class Wait { None, Block, Warp, Exited };

struct Fiber {
    FiberContext context;
    char* stack = nullptr;
    ThreadCoordinates coordinates;
    int linear = 0;              // x + y * bx + z * bx * by
    Wait waiting = Wait::None;
    const char* wait_file = nullptr;  // where it waits (for the divergence report)
    int wait_line = 0;
    unsigned wait_mask = 0;
    long generation_seen = 0;   // the meeting generation it waits to see end
    // its cp.async copies not yet landed: committed groups, oldest first, and the open group
    struct PendingCopy {
        void* destination;
        unsigned char bytes[16];
        size_t size;
    };
    std::deque<std::vector<PendingCopy>> copy_groups;
    std::vector<PendingCopy> open_copies;
};

struct Warp {
    WarpSlot slots[2][33];  // by generation parity: see warp_exchange; [32]: a reduction's result
    long generation = 0;
    int arrived = 0;
    int expected = 0;  // the lanes of mask
    unsigned mask = 0;
    const char* what = nullptr;
};

struct Block {
    std::vector<Fiber>* fibers = nullptr;
    int thread_count = 0;
    int exited = 0;
    long barrier_generation = 0;
    int barrier_arrived = 0;
    // __syncthreads_or: barrier g's vote is in barrier_vote[g % 2]; the other slot (barrier
    // g - 1's, read by every thread before it arrived at g) is cleared as g completes
    int barrier_vote[2] = {0, 0};
    const char* barrier_file = nullptr;
    int barrier_line = 0;
    std::vector<Warp> warps;
    const char* kernel_name = nullptr;
    std::function<void()> const* body = nullptr;
    size_t dynamic_shared_bytes = 0;
    size_t static_shared_bytes = 0;  // of the static __shared__ variables the block has reached so far
    size_t shared_limit = 0;         // static + dynamic: 48 KB, or 227 KB once the kernel opted in
};

static thread_local Block* current_block = nullptr;
static thread_local Fiber* current_fiber = nullptr;
static thread_local FiberContext scheduler_context;
// A block's dynamic shared memory ends right before an inaccessible page, as cudaMalloc's
// allocations do, so an index past the launch's dynamic shared bytes faults where it
// happens (on a GPU it reads or corrupts another part of shared memory, or faults).
struct DynamicShared {
    char* mapping = nullptr;
    size_t data_bytes = 0;  // the accessible part before the guard page
    char* start = nullptr;
};
static thread_local DynamicShared dynamic_shared;

static size_t page_bytes() { static size_t p = (size_t)sysconf(_SC_PAGESIZE); return p; }

// whole pages for at least `bytes`, then one inaccessible page: the caller places its data to
// end at *data_bytes, where an access past it faults. nullptr when mmap fails; the mapping
// is *data_bytes + page_bytes() long (for munmap).
static char* map_before_guard_page(size_t bytes, size_t* data_bytes) {
    size_t page = page_bytes();
    *data_bytes = (bytes + page - 1) / page * page;
    void* mapping = mmap(nullptr, *data_bytes + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                         -1, 0);
    if (mapping == MAP_FAILED) { return nullptr; }
    mprotect((char*)mapping + *data_bytes, page, PROT_NONE);
    return (char*)mapping;
}

static void dynamic_shared_prepare(size_t bytes) {
    size_t rounded = (bytes + 15) & ~(size_t)15;  // 16-byte aligned, as a GPU's
    if (dynamic_shared.data_bytes < rounded) {
        if (dynamic_shared.mapping != nullptr) { munmap(dynamic_shared.mapping, dynamic_shared.data_bytes + page_bytes()); }
        dynamic_shared.mapping = map_before_guard_page(rounded, &dynamic_shared.data_bytes);
        if (dynamic_shared.mapping == nullptr) { fail("cannot map dynamic shared memory"); }
    }
    if (dynamic_shared.mapping == nullptr) {  // no launch has asked for any yet
        dynamic_shared.start = nullptr;
        return;
    }
    dynamic_shared.start = dynamic_shared.mapping + dynamic_shared.data_bytes - rounded;
    memset(dynamic_shared.start, 0xff, rounded);  // shared memory starts as garbage on a GPU
}
static thread_local std::vector<Fiber> fiber_pool;

const ThreadCoordinates& coordinates() {
    if (current_fiber == nullptr) { fail("threadIdx/blockIdx used outside a kernel"); }
    return current_fiber->coordinates;
}
void* dynamic_shared_memory() { return dynamic_shared.start; }
static std::atomic<uint64_t> blocks_started{0};
static thread_local uint64_t running_block_serial = 0;
uint64_t block_serial() {
    if (running_block_serial == 0) { fail("static __shared__ memory used outside a kernel"); }
    return running_block_serial;
}
int lane_id() { return current_fiber->linear % 32; }
bool in_kernel() { return current_block != nullptr; }

float gpu_approximation(float exact, float input, int ulps, bool flush_subnormal) {
    if (current_block == nullptr || !std::isfinite(exact) || exact == 0.0f) { return exact; }
    if (flush_subnormal && std::fabs(exact) < FLT_MIN) { return std::copysign(0.0f, exact); }
    uint32_t h;  // the input's bits, mixed (a murmur3 finalizer): the ulps moved are a function of the input
    memcpy(&h, &input, sizeof(h));
    h ^= h >> 16; h *= 0x85ebca6bu; h ^= h >> 13; h *= 0xc2b2ae35u; h ^= h >> 16;
    const int moved = (int)(h % (uint32_t)(2 * ulps + 1)) - ulps;
    uint32_t bits;
    memcpy(&bits, &exact, sizeof(bits));
    const uint32_t sign = bits & 0x80000000u;
    int64_t magnitude = (int64_t)(bits & 0x7fffffffu) + moved;  // along the float line, away from or toward 0
    magnitude = std::min<int64_t>(std::max<int64_t>(magnitude, 0), 0x7f7fffff);  // neither past 0 nor to inf
    bits = sign | (uint32_t)magnitude;
    float result;
    memcpy(&result, &bits, sizeof(result));
    if (flush_subnormal && std::fabs(result) < FLT_MIN) { return std::copysign(0.0f, result); }
    return result;
}

static bool can_resume(const Block& block, const Fiber& fiber);

// The pass over the block's threads in progress (run_pass): its order, and where in it the
// next thread to try is. A thread that waits or exits switches straight to the next one that
// can go on, and only the pass's last one back to the scheduler: one switch a wait instead of
// two (there and back), the threads running in the same order.
struct Pass {
    const std::vector<int>* order = nullptr;
    size_t next = 0;
    bool progressed = false;  // whether any thread went on
};
static thread_local Pass pass;

// saves the context `from` (the running thread's, or the scheduler's to start the pass) and
// goes on with the pass: the next thread that can resume, else the scheduler
static void continue_pass(FiberContext* from) {
    Block& block = *current_block;
    std::vector<Fiber>& fibers = *block.fibers;
    while (pass.next < pass.order->size()) {
        Fiber& fiber = fibers[(*pass.order)[pass.next++]];
        if (!can_resume(block, fiber)) { continue; }
        fiber.waiting = Wait::None;
        pass.progressed = true;
        current_fiber = &fiber;
        switch_context(from, &fiber.context);
        return;
    }
    if (from != &scheduler_context) { switch_context(from, &scheduler_context); }
}

static void yield_to_scheduler() { continue_pass(&current_fiber->context); }

static void fiber_entry() {
    (*current_block->body)();
    current_fiber->waiting = Wait::Exited;
    current_block->exited++;
    // on for good; uc_link is not used so the stack can be reused
    continue_pass(&current_fiber->context);
    fail("a finished fiber was resumed");
}

static std::string block_text() {
    const ThreadCoordinates& c = current_fiber->coordinates;
    char text[160];
    snprintf(text, sizeof(text), "block (%u,%u,%u) of kernel %s", c.block_idx.x, c.block_idx.y, c.block_idx.z,
             current_block->kernel_name);
    return text;
}

void syncthreads(const char* file, int line) {
    Block* block = current_block;
    if (block == nullptr) { fail("__syncthreads outside a kernel"); }
    if (block->barrier_arrived == 0) {
        block->barrier_file = file;
        block->barrier_line = line;
    } else if (block->barrier_line != line || (block->barrier_file != file && strcmp(block->barrier_file, file) != 0)) {
        char text[512];
        snprintf(text, sizeof(text), "divergent __syncthreads in %s: thread %d waits at %s:%d, others at %s:%d",
                 block_text().c_str(), current_fiber->linear, file, line, block->barrier_file, block->barrier_line);
        fail(text);
    }
    block->barrier_arrived++;
    if (block->barrier_arrived == block->thread_count) {
        block->barrier_arrived = 0;
        block->barrier_generation++;
        block->barrier_vote[block->barrier_generation % 2] = 0;
        return;
    }
    current_fiber->waiting = Wait::Block;
    current_fiber->wait_file = file;
    current_fiber->wait_line = line;
    current_fiber->generation_seen = block->barrier_generation;
    yield_to_scheduler();
}

int syncthreads_or(int predicate, const char* file, int line) {
    Block* block = current_block;
    if (block == nullptr) { fail("__syncthreads_or outside a kernel"); }
    const long generation = block->barrier_generation;
    if (predicate) { block->barrier_vote[generation % 2] = 1; }
    syncthreads(file, line);
    return block->barrier_vote[generation % 2];
}

// every lane named in mask deposits its value; returns the slots when all have
WarpSlot* warp_exchange(unsigned mask, const void* value, size_t bytes, const char* what, bool* completed) {
    Block* block = current_block;
    if (block == nullptr) { fail(std::string(what) + " outside a kernel"); }
    if (bytes > 16) { fail(std::string(what) + " of a value wider than 16 bytes"); }
    int lane = lane_id();
    Warp& warp = block->warps[current_fiber->linear / 32];
    if (!(mask & (1u << lane))) {
        char text[256];
        snprintf(text, sizeof(text), "%s in %s: lane %d is not in its own mask 0x%08x", what, block_text().c_str(),
                 lane, mask);
        fail(text);
    }
    if (warp.arrived == 0) {
        warp.mask = mask;
        warp.expected = __builtin_popcount(mask);
        warp.what = what;
    } else if (warp.mask != mask || (warp.what != what && strcmp(warp.what, what) != 0)) {
        char text[256];
        snprintf(text, sizeof(text), "divergent warp collective in %s: lane %d calls %s (mask 0x%08x) while others "
                 "are in %s (mask 0x%08x)", block_text().c_str(), lane, what, mask, warp.what, warp.mask);
        fail(text);
    }
    const long generation = warp.generation;
    WarpSlot* slots = warp.slots[generation & 1];
    memcpy(slots[lane], value, bytes);
    warp.arrived++;
    if (completed != nullptr) { *completed = warp.arrived == warp.expected; }
    if (warp.arrived < warp.expected) {
        current_fiber->waiting = Wait::Warp;
        current_fiber->wait_mask = mask;
        current_fiber->generation_seen = generation;
        yield_to_scheduler();
    } else {
        warp.arrived = 0;
        warp.generation++;
    }
    // The last lane to arrive goes on at once and may deposit into the warp's next collective
    // before the others have read this one, hence two slot sets by generation parity. It
    // cannot get two ahead: the next collective completes only when every lane has left this one.
    return slots;
}

static bool can_resume(const Block& block, const Fiber& fiber) {
    switch (fiber.waiting) {
        case Wait::None: return true;
        case Wait::Exited: return false;
        case Wait::Block: return block.barrier_generation != fiber.generation_seen;
        case Wait::Warp: return block.warps[fiber.linear / 32].generation != fiber.generation_seen;
    }
    return false;
}

/*
The order in which a block's threads run between two meeting points. A race-free kernel
gives the same result in any order; a racy one (a shared or global value read by one thread
and written by another with no barrier between) depends on it. So each block gets its own
pseudo-random order, different for every launch: the GPU tests' "run twice, bitwise equal"
checks then catch the race. One warp of each block of several (a random one) also lags: it
runs only when no other thread can, as a warp the GPU's scheduler left behind. A shuffled
order alone runs every thread once between meeting points, so a read left behind a barrier
still happened before any thread came around to the next write; the lagging warp reads after
the others have gone on as far as they can (block_reduce_sum without its second barrier:
the others' next call overwrote the partial sums it had not read yet).
CUDASIM_SCHEDULE=in-order runs threads in index order instead, no warp lagging.
*/
static bool shuffled_schedule() {
    static const bool shuffled = [] {
        const char* mode = getenv("CUDASIM_SCHEDULE");
        return mode == nullptr || strcmp(mode, "in-order") != 0;
    }();
    return shuffled;
}
static thread_local std::vector<int> schedule_order;    // every thread but the lagging warp's
static thread_local std::vector<int> lagging_order;     // the lagging warp's threads (empty: none lags)
static thread_local uint64_t schedule_seed;

// the next number of a xorshift64 stream (the threads', the blocks' and the streams' orders)
static uint64_t xorshift64(uint64_t* state) {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    return *state;
}

static uint64_t next_schedule_random() { return xorshift64(&schedule_seed); }

static void choose_schedule_order(int thread_count) {
    std::vector<int> order(thread_count);
    for (int i = 0; i < thread_count; i++) { order[i] = i; }
    const int warps = (thread_count + 31) / 32;
    int lagging_warp = -1;
    if (shuffled_schedule()) {
        for (int i = thread_count - 1; i > 0; i--) {  // Fisher-Yates
            std::swap(order[i], order[(int)(next_schedule_random() % (uint64_t)(i + 1))]);
        }
        if (warps > 1) { lagging_warp = (int)(next_schedule_random() % (uint64_t)warps); }
    }
    schedule_order.clear();
    lagging_order.clear();
    for (int thread : order) { (thread / 32 == lagging_warp ? lagging_order : schedule_order).push_back(thread); }
}

// one pass over `order`, resuming each thread that can go on (continue_pass); whether any did
static bool run_pass(const std::vector<int>& order) {
    pass.order = &order;
    pass.next = 0;
    pass.progressed = false;
    continue_pass(&scheduler_context);
    return pass.progressed;
}

// the lagging warp's passes, once no other thread can go on: until it stops too, or it completes
// a block barrier (which is all the others can wait for); whether it went on at all
static bool run_lagging_warp(Block& block) {
    const long generation = block.barrier_generation;
    bool progressed = false;
    while (block.barrier_generation == generation && run_pass(lagging_order)) { progressed = true; }
    return progressed;
}

static void run_block(Block& block) {
    std::vector<Fiber>& fibers = *block.fibers;
    for (int i = 0; i < block.thread_count; i++) {
        Fiber& fiber = fibers[i];
        make_context(&fiber.context, fiber.stack, FIBER_STACK_BYTES - fiber_stack_offset(i), fiber_entry);
        fiber.waiting = Wait::None;
    }
    choose_schedule_order(block.thread_count);
    while (block.exited < block.thread_count) {
        if (!run_pass(schedule_order) && !run_lagging_warp(block)) {
            // a meeting that can never complete: report the first waiting thread
            for (int i = 0; i < block.thread_count; i++) {
                Fiber& fiber = fibers[i];
                current_fiber = &fiber;
                if (fiber.waiting == Wait::Block) {
                    char text[400];
                    snprintf(text, sizeof(text), "deadlock in %s: thread %d waits at __syncthreads %s:%d but %d of %d "
                             "threads exited without reaching it", block_text().c_str(), fiber.linear,
                             fiber.wait_file, fiber.wait_line, block.exited, block.thread_count);
                    fail(text);
                }
                if (fiber.waiting == Wait::Warp) {
                    char text[400];
                    snprintf(text, sizeof(text), "deadlock in %s: lane %d of warp %d waits in %s (mask 0x%08x) for "
                             "lanes that never arrive", block_text().c_str(), fiber.linear % 32, fiber.linear / 32,
                             block.warps[fiber.linear / 32].what, fiber.wait_mask);
                    fail(text);
                }
            }
            fail("deadlock with no waiting thread");
        }
    }
    current_fiber = nullptr;
}

// ----------------------------------------------------------------------------------------
// launches

static std::map<const void*, int> max_dynamic_shared_by_kernel;
static const int DEFAULT_DYNAMIC_SHARED_LIMIT = 48 * 1024;
static const int OPT_IN_DYNAMIC_SHARED_LIMIT = 227 * 1024;  // H100: static + dynamic of one block
static const size_t STATIC_SHARED_LIMIT = 48 * 1024;        // ptxas refuses more static __shared__
static thread_local cudaError_t last_error = cudaSuccess;

static uint64_t launch_count = 0;
// A kernel's access to device addresses without memory (cudasim_driver.cpp's reserved,
// unmapped ranges) ends its grid, and the error sticks, as a GPU fault does: every later
// synchronizing call returns it.
static thread_local sigjmp_buf kernel_fault_jump;
static cudaError_t sticky_error = cudaSuccess;
bool kernel_running() { return current_block != nullptr; }
void abandon_kernel(cudaError_t error) {
    sticky_error = error;
    siglongjmp(kernel_fault_jump, 1);
}
void static_shared_declared(size_t bytes) {
    Block& block = *current_block;
    block.static_shared_bytes += bytes;
    if (block.static_shared_bytes > STATIC_SHARED_LIMIT ||
        block.static_shared_bytes + block.dynamic_shared_bytes > block.shared_limit) {
        fprintf(stderr, "cudasim: kernel %s has %zu bytes of static shared memory and %zu of dynamic a block; a GPU "
                "allows at most %zu static and %zu together (%s)\n", block.kernel_name, block.static_shared_bytes,
                block.dynamic_shared_bytes, STATIC_SHARED_LIMIT, block.shared_limit,
                block.shared_limit > (size_t)DEFAULT_DYNAMIC_SHARED_LIMIT
                    ? "its cudaFuncAttributeMaxDynamicSharedMemorySize was raised"
                    : "without raising its cudaFuncAttributeMaxDynamicSharedMemorySize");
        abandon_kernel(cudaErrorLaunchOutOfResources);
    }
}
void pipeline_copy(void* destination, const void* source, size_t bytes, size_t zfill) {
    if (current_fiber == nullptr) { fail("__pipeline_memcpy_async outside a kernel"); }
    if (bytes != 4 && bytes != 8 && bytes != 16) {
        fail("__pipeline_memcpy_async of " + std::to_string(bytes) + " bytes in " + block_text() + ": 4, 8 or 16 only");
    }
    if (zfill != 0) { fail("__pipeline_memcpy_async: zfill is not modelled"); }
    if ((uintptr_t)destination % bytes != 0) { misaligned_access(destination, bytes); }
    if ((uintptr_t)source % bytes != 0) { misaligned_access(source, bytes); }
    Fiber::PendingCopy copy;
    copy.destination = destination;
    memcpy(copy.bytes, source, bytes);  // the source is read now: a kernel's input does not change under it
    copy.size = bytes;
    current_fiber->open_copies.push_back(copy);
}
void pipeline_commit() {
    if (current_fiber == nullptr) { fail("__pipeline_commit outside a kernel"); }
    current_fiber->copy_groups.push_back(std::move(current_fiber->open_copies));
    current_fiber->open_copies.clear();
}
void pipeline_wait_prior(size_t prior) {
    if (current_fiber == nullptr) { fail("__pipeline_wait_prior outside a kernel"); }
    while (current_fiber->copy_groups.size() > prior) {
        for (const Fiber::PendingCopy& copy : current_fiber->copy_groups.front()) { memcpy(copy.destination, copy.bytes, copy.size); }
        current_fiber->copy_groups.pop_front();
    }
}

void misaligned_access(const void* address, size_t alignment) {
    fprintf(stderr, "cudasim: misaligned address in %s: %p accessed as a type aligned to %zu bytes\n",
            block_text().c_str(), address, alignment);
    abandon_kernel(cudaErrorMisalignedAddress);
}


// block number `linear_block` of a launch, on the calling OS thread's fibers
static void run_one_block(const LaunchConfig& config, const char* name, const std::function<void()>& body,
                          long linear_block, uint64_t launch_number, size_t shared_limit) {
    const dim3 grid = config.grid, block_dim = config.block;
    const int threads = (int)(block_dim.x * block_dim.y * block_dim.z);
    if ((int)fiber_pool.size() < threads) {
        size_t old = fiber_pool.size();
        fiber_pool.resize(threads);
        for (size_t i = old; i < fiber_pool.size(); i++) {
            void* stack = mmap(nullptr, FIBER_STACK_BYTES, PROT_READ | PROT_WRITE,
                               MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
            if (stack == MAP_FAILED) { fail("cannot map a fiber stack"); }
            fiber_pool[i].stack = (char*)stack;
        }
    }
    dynamic_shared_prepare(config.dynamic_shared_bytes);
    Block block;
    block.fibers = &fiber_pool;
    block.thread_count = threads;
    block.warps.resize((threads + 31) / 32);
    block.kernel_name = name;
    block.body = &body;
    block.dynamic_shared_bytes = config.dynamic_shared_bytes;
    block.shared_limit = shared_limit;
    const dim3 block_idx((unsigned)(linear_block % grid.x), (unsigned)(linear_block / grid.x % grid.y),
                         (unsigned)(linear_block / ((long)grid.x * grid.y)));
    int linear = 0;
    for (unsigned tz = 0; tz < block_dim.z; tz++) {
        for (unsigned ty = 0; ty < block_dim.y; ty++) {
            for (unsigned tx = 0; tx < block_dim.x; tx++, linear++) {
                Fiber& fiber = fiber_pool[linear];
                fiber.coordinates.thread_idx = dim3(tx, ty, tz);
                fiber.coordinates.block_idx = block_idx;
                fiber.coordinates.block_dim = block_dim;
                fiber.coordinates.grid_dim = grid;
                fiber.linear = linear;
                fiber.copy_groups.clear();  // a previous block's copies never landed here
                fiber.open_copies.clear();
            }
        }
    }
    // the thread order depends only on the launch and the block, so a failure reproduces
    schedule_seed = (launch_number << 32) ^ (uint64_t)linear_block ^ 0x9e3779b97f4a7c15ull;
    if (sigsetjmp(kernel_fault_jump, 0) != 0) {  // abandon_kernel: this block ends here
        current_fiber = nullptr;
        current_block = nullptr;
        running_block_serial = 0;
        return;
    }
    current_block = &block;
    running_block_serial = ++blocks_started;
    run_block(block);
    running_block_serial = 0;
    current_block = nullptr;
}

/*
The order in which a launch's blocks run. A GPU runs them concurrently, in no set order, so a
kernel whose result depends on it (two blocks writing one global value, or one reading what
another writes, with nothing to order them) is racy; run in index order on one CPU thread it
would still give the same result every time, and "run twice, bitwise equal" could not catch
it. So each launch gets its own pseudo-random order (from the launch's number, so a failure
reproduces), unless CUDASIM_SCHEDULE=in-order.
*/
static std::vector<long> block_order(long blocks, uint64_t launch_number) {
    std::vector<long> order((size_t)blocks);
    for (long b = 0; b < blocks; b++) { order[(size_t)b] = b; }
    if (shuffled_schedule()) {
        uint64_t state = launch_number * 0xd1342543de82ef95ull + 0x2545f4914f6cdd1dull;
        for (long i = blocks - 1; i > 0; i--) {  // Fisher-Yates
            std::swap(order[(size_t)i], order[(size_t)(xorshift64(&state) % (uint64_t)(i + 1))]);
        }
    }
    return order;
}

void launch_grid(const LaunchConfig& config, const void* kernel_address, const char* name,
                 std::function<void()> body) {
    const dim3 grid = config.grid, block_dim = config.block;
    long threads = (long)block_dim.x * block_dim.y * block_dim.z;
    long blocks = (long)grid.x * grid.y * grid.z;
    int shared_limit = DEFAULT_DYNAMIC_SHARED_LIMIT;
    auto found = max_dynamic_shared_by_kernel.find(kernel_address);
    if (found != max_dynamic_shared_by_kernel.end()) { shared_limit = found->second; }
    if (threads > config.max_threads && threads <= 1024) {  // a GPU: "too many resources requested for launch"
        fprintf(stderr, "cudasim: invalid launch of kernel %s: %ld threads per block, above its __launch_bounds__ "
                "of %ld\n", name, threads, config.max_threads);
        last_error = cudaErrorLaunchOutOfResources;
        return;
    }
    if (threads <= 0 || threads > 1024 || blocks <= 0 || grid.y > 65535 || grid.z > 65535 ||
        (size_t)config.dynamic_shared_bytes > (size_t)shared_limit) {
        fprintf(stderr, "cudasim: invalid launch of kernel %s: grid (%u,%u,%u) block (%u,%u,%u) dynamic shared %zu "
                "bytes (limit %d)\n", name, grid.x, grid.y, grid.z, block_dim.x, block_dim.y, block_dim.z,
                config.dynamic_shared_bytes, shared_limit);
        last_error = cudaErrorInvalidConfiguration;
        return;
    }
    const uint64_t launch_number = ++launch_count;
    // static and dynamic shared memory together: 48 KB, or up to 227 KB for a kernel that raised its limit
    const size_t shared_total_limit = found != max_dynamic_shared_by_kernel.end() ? (size_t)OPT_IN_DYNAMIC_SHARED_LIMIT
                                                                                   : (size_t)DEFAULT_DYNAMIC_SHARED_LIMIT;
    enqueue(config.stream, name, [config, name, body, blocks, launch_number, shared_total_limit](double) {
        const std::vector<long> order = block_order(blocks, launch_number);
        // blocks are independent on a GPU too: the OS threads (OpenMP) each run whole blocks
        #pragma omp parallel for schedule(dynamic, 1) if (blocks > 1)
        for (long b = 0; b < blocks; b++) {
            run_one_block(config, name, body, order[b], launch_number, shared_total_limit);
        }
        return true;
    });
}

// ----------------------------------------------------------------------------------------
// streams: queues of work, run when the host must observe it

struct Completion {
    bool done = false;
    double seconds = 0.0;  // when it ran (cudaEventElapsedTime)
};

struct QueuedWork {
    StreamWork work;
    const char* what;
    uint64_t sequence;  // enqueue order, for CUDASIM_STREAM_ORDER=in-order and newest-first
    std::vector<std::shared_ptr<Completion>> after;  // all must be done before it starts
    std::shared_ptr<Completion> completion;
};

} // namespace cudasim

struct CUstream_st {
    bool blocking = true;  // synchronizes with the legacy default stream (no cudaStreamNonBlocking)
    std::deque<cudasim::QueuedWork> queue;
    std::shared_ptr<cudasim::Completion> last;  // of the work enqueued last
};
struct CUevent_st {
    std::shared_ptr<cudasim::Completion> recorded;  // the last cudaEventRecord's; null before one
};

namespace cudasim {

static double now_seconds() { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + 1e-9 * t.tv_nsec; }

static CUstream_st legacy_stream;      // stream 0, cudaStreamLegacy
static CUstream_st per_thread_stream;  // cudaStreamPerThread: a blocking stream (one host thread here)
static std::vector<CUstream_st*> all_streams = {&legacy_stream, &per_thread_stream};
static bool draining = false;
static uint64_t enqueued_count = 0;

static CUstream_st* stream_of(cudaStream_t stream) {
    if (stream == nullptr || stream == cudaStreamLegacy) { return &legacy_stream; }
    if (stream == cudaStreamPerThread) { return &per_thread_stream; }
    return stream;
}

static void add_unfinished(std::vector<std::shared_ptr<Completion>>* after, const std::shared_ptr<Completion>& c) {
    if (c != nullptr && !c->done) { after->push_back(c); }
}

static bool drain_until(const std::function<bool()>& satisfied, double deadline);

/*
CUDASIM_LAUNCH_QUEUE=N: at most N pieces of work pending on a stream. Enqueuing one more blocks
the host until the stream's oldest have run, as a GPU's launch queue (about a thousand entries)
blocks it, and as there with no deadline: behind a collective that waits for a dead peer it
blocks for good, and only a watchdog thread can end the process (llmc/multi_gpu.h). Unset or
0: no limit (work waits until the host observes it).
*/
static size_t launch_queue_limit() {
    static const size_t limit = [] {
        const char* text = getenv("CUDASIM_LAUNCH_QUEUE");
        if (text == nullptr || text[0] == '\0') { return (size_t)0; }
        char* end = nullptr;
        long value = strtol(text, &end, 10);
        if (*end != '\0' || value < 0) { fail(std::string("CUDASIM_LAUNCH_QUEUE=") + text + ": expected a count >= 0"); }
        return (size_t)value;
    }();
    return limit;
}

std::shared_ptr<Completion> enqueue(cudaStream_t handle, const char* what, StreamWork work,
                                    std::shared_ptr<Completion> after) {
    note_cuda_call(what);  // kernel launches, copies, memsets, cuBLASLt's GEMMs, NCCL's collectives
    if (draining) { fail(std::string("enqueue of ") + what + " from work that a stream runs"); }
    CUstream_st* stream = stream_of(handle);
    QueuedWork queued{std::move(work), what, enqueued_count++, {}, std::make_shared<Completion>()};
    add_unfinished(&queued.after, after);
    // the legacy default stream's documented implicit synchronization: its work waits for all
    // work enqueued before it on blocking streams, and work on a blocking stream waits for
    // the legacy stream's work enqueued before it; non-blocking streams take no part
    if (stream == &legacy_stream) {
        for (CUstream_st* other : all_streams) {
            if (other != &legacy_stream && other->blocking) { add_unfinished(&queued.after, other->last); }
        }
    } else if (stream->blocking) {
        add_unfinished(&queued.after, legacy_stream.last);
    }
    stream->last = queued.completion;
    stream->queue.push_back(std::move(queued));
    const size_t limit = launch_queue_limit();
    if (limit > 0 && stream->queue.size() > limit) {  // the host blocks, with no deadline
        while (!drain_until([stream, limit] { return stream->queue.size() <= limit; }, now_seconds() + 0.1)) {
            usleep(1000);
        }
    }
    return stream->last;
}

static bool may_start(const CUstream_st* stream) {
    if (stream->queue.empty()) { return false; }
    for (const std::shared_ptr<Completion>& c : stream->queue.front().after) {
        if (!c->done) { return false; }
    }
    return true;
}

/*
The order in which the streams' work runs. A GPU runs the work of different streams in any
order their dependencies (events, the legacy stream's rules) allow, so each step picks the
next work of a pseudo-randomly chosen stream among those whose next work may start (a fixed
seed: a failure reproduces). A missing dependency then shows as a result that differs between
two runs (or between ranks), which the tests' run-twice and 2-ranks-vs-1 checks catch.
CUDASIM_STREAM_ORDER=in-order runs the oldest startable work first instead (call order), and
=newest-first the most recently enqueued: work issued early on one stream (a collective, a
gather for later) runs as late as its dependents let it, so a reader that forgot to wait for
it reads the old data every time. A run whose streams are ordered right gives the same bits in
every mode (test/gpu_trainer_ranks.py compares newest-first with the default).
*/
enum StreamOrder { STREAM_ORDER_RANDOM, STREAM_ORDER_OLDEST_FIRST, STREAM_ORDER_NEWEST_FIRST };
static StreamOrder stream_order() {
    static const StreamOrder order = [] {
        const char* mode = getenv("CUDASIM_STREAM_ORDER");
        if (mode == nullptr || mode[0] == '\0') { return STREAM_ORDER_RANDOM; }
        if (strcmp(mode, "in-order") == 0) { return STREAM_ORDER_OLDEST_FIRST; }
        if (strcmp(mode, "newest-first") == 0) { return STREAM_ORDER_NEWEST_FIRST; }
        fail(std::string("CUDASIM_STREAM_ORDER=") + mode + ": expected in-order or newest-first (unset: random)");
        return STREAM_ORDER_RANDOM;
    }();
    return order;
}
static uint64_t stream_order_state = 0x2545f4914f6cdd1dull;
static uint64_t next_stream_choice() { return xorshift64(&stream_order_state); }

// runs queued work until `satisfied`; false if work that cannot finish yet (a collective
// waiting for peers) is still unfinished at `deadline`
static bool drain_until(const std::function<bool()>& satisfied, double deadline) {
    if (draining) { fail("a synchronizing call from work that a stream runs"); }
    std::vector<CUstream_st*> startable;
    while (!satisfied()) {
        startable.clear();
        for (CUstream_st* stream : all_streams) {
            if (may_start(stream)) { startable.push_back(stream); }
        }
        if (startable.empty()) {
            std::string waiting;
            for (const CUstream_st* stream : all_streams) {
                if (!stream->queue.empty()) { waiting += std::string(" ") + stream->queue.front().what; }
            }
            fail("streams wait for each other: no queued work can start (a dependency cycle); waiting:" + waiting);
        }
        CUstream_st* chosen = startable[0];
        StreamOrder order = stream_order();
        if (order == STREAM_ORDER_RANDOM) {
            chosen = startable[next_stream_choice() % startable.size()];
        } else {
            for (CUstream_st* stream : startable) {
                uint64_t sequence = stream->queue.front().sequence, best = chosen->queue.front().sequence;
                if (order == STREAM_ORDER_OLDEST_FIRST ? sequence < best : sequence > best) { chosen = stream; }
            }
        }
        QueuedWork& next = chosen->queue.front();
        draining = true;
        const bool finished = next.work(deadline);
        draining = false;
        if (!finished) { return false; }
        next.completion->seconds = now_seconds();
        next.completion->done = true;
        chosen->queue.pop_front();
    }
    return true;
}

} // namespace cudasim

// ----------------------------------------------------------------------------------------
// the CUDA runtime API, as far as llm8 uses it

using namespace cudasim;

namespace {
struct Allocation { void* mapping; size_t mapped_bytes; size_t bytes; };
std::mutex allocations_mutex;
std::map<void*, Allocation> allocations;  // by the pointer handed out
size_t allocated_bytes = 0;
size_t peak_allocated_bytes = 0;  // CUDASIM_MEMORY_REPORT=1 prints it at exit (the tests' measure of a run's device memory)

void count_allocated(size_t bytes) {
    static const bool report = [] {
        const char* text = getenv("CUDASIM_MEMORY_REPORT");
        bool on = text != nullptr && strcmp(text, "1") == 0;
        if (on) {
            atexit([] { fprintf(stderr, "cudasim: at most %zu bytes of device memory allocated at once\n", peak_allocated_bytes); });
        }
        return on;
    }();
    (void)report;
    allocated_bytes += bytes;
    if (allocated_bytes > peak_allocated_bytes) { peak_allocated_bytes = allocated_bytes; }
}
// the device's memory: an H100's 80 GiB, or CUDASIM_MEMORY_BYTES (a test's smaller GPU, to run out of)
size_t simulated_memory_bytes() {
    static const size_t bytes = [] {
        const char* text = getenv("CUDASIM_MEMORY_BYTES");
        return text != nullptr ? (size_t)strtoull(text, nullptr, 10) : (size_t)(80ull << 30);
    }();
    return bytes;
}
std::map<const char*, size_t> pinned_allocations;  // cudaMallocHost's: start, bytes

// how long a query (cudaEventQuery) lets queued work wait for peers
const double QUERY_WAIT_S = 0.01;

bool is_pinned(const void* pointer) {
    auto after = pinned_allocations.upper_bound((const char*)pointer);
    if (after == pinned_allocations.begin()) { return false; }
    --after;
    return (const char*)pointer < after->first + after->second;
}

bool is_cuda_malloc_memory(const void* pointer) {
    std::lock_guard<std::mutex> lock(allocations_mutex);
    auto after = allocations.upper_bound((void*)pointer);
    if (after == allocations.begin()) { return false; }
    --after;
    return (const char*)pointer < (const char*)after->first + after->second.bytes;
}

/*
A copy, as the CUDA runtime documents its synchronization ("API synchronization behavior"):
- host to device from pageable memory: the source is staged at the call (the host may reuse
  its buffer when the call returns); the copy to the device runs in stream order. For the
  synchronous cudaMemcpy the documentation says "a stream sync is performed before the copy
  is initiated" and that it returns once the buffer is staged, "but the DMA to final
  destination may not have completed": so it does not wait for the copy itself.
- host to device from pinned (cudaMallocHost) memory: cudaMemcpyAsync reads the host buffer
  when the copy runs, so a host write before the copy completes races with it; cudaMemcpy
  is synchronous.
- device to host: cudaMemcpy returns once the copy completed; cudaMemcpyAsync too when the
  destination is pageable, and is asynchronous into pinned memory.
- device to device: asynchronous for both; host to host: synchronous for both.
cudaMemcpyDefault infers the kind from the pointers (cudaMalloc'd memory is the device's).
*/
struct Copy {
    char* destination;
    size_t destination_pitch;
    const char* source;
    size_t source_pitch;
    size_t width, height;
};

cudaError_t enqueue_copy(Copy copy, cudaMemcpyKind kind, cudaStream_t stream, bool synchronous_call) {
    if (sticky_error != cudaSuccess) { return sticky_error; }
    if (copy.width == 0 || copy.height == 0) { return cudaSuccess; }
    if (kind == cudaMemcpyDefault) {
        bool from_device = is_cuda_malloc_memory(copy.source), to_device = is_cuda_malloc_memory(copy.destination);
        kind = from_device ? (to_device ? cudaMemcpyDeviceToDevice : cudaMemcpyDeviceToHost)
                           : (to_device ? cudaMemcpyHostToDevice : cudaMemcpyHostToHost);
    }
    bool host_waits = false;
    std::shared_ptr<std::vector<char>> staged;
    switch (kind) {
        case cudaMemcpyHostToDevice:
            if (!is_pinned(copy.source)) {
                staged = std::make_shared<std::vector<char>>((copy.height - 1) * copy.source_pitch + copy.width);
                memcpy(staged->data(), copy.source, staged->size());
                copy.source = staged->data();
            } else {
                host_waits = synchronous_call;
            }
            break;
        case cudaMemcpyDeviceToHost: host_waits = synchronous_call || !is_pinned(copy.destination); break;
        case cudaMemcpyDeviceToDevice: break;
        default: host_waits = true; break;  // host to host
    }
    std::shared_ptr<Completion> done = enqueue(stream, "memory copy", [copy, staged](double) {
        for (size_t row = 0; row < copy.height; row++) {
            memmove(copy.destination + row * copy.destination_pitch, copy.source + row * copy.source_pitch, copy.width);
        }
        return true;
    });
    if (host_waits) { drain_until([&] { return done->done; }, INFINITY); }
    return sticky_error;
}

cudaError_t enqueue_memset(void* destination, int value, size_t bytes, cudaStream_t stream) {
    if (sticky_error != cudaSuccess) { return sticky_error; }
    std::shared_ptr<Completion> done = enqueue(stream, "memset", [destination, value, bytes](double) {
        memset(destination, value, bytes);
        return true;
    });
    // "asynchronous with respect to the host except when the target memory is pinned host memory"
    if (is_pinned(destination)) { drain_until([&] { return done->done; }, INFINITY); }
    return cudaSuccess;
}
}

bool cudasim::synchronize_all_streams(double deadline) {
    return drain_until([] {
        for (const CUstream_st* stream : all_streams) {
            if (!stream->queue.empty()) { return false; }
        }
        return true;
    }, deadline);
}

extern "C" {

cudaError_t cudaMalloc(void** pointer, size_t bytes) {
    cudasim::note_cuda_call(__func__);
    // 0 bytes: success and no allocation, *pointer as it was (CUDA documents nothing here; its
    // runtime leaves the pointer as it was or sets NULL, by version): the caller gets no memory
    if (bytes == 0) { return cudaSuccess; }
    // the allocation ends (rounded up to 256 bytes, CUDA's alignment) right before an
    // inaccessible page, so a write past the end faults where it happens
    size_t rounded = (bytes + 255) & ~(size_t)255;
    if (allocated_bytes + rounded > simulated_memory_bytes()) { last_error = cudaErrorMemoryAllocation; return cudaErrorMemoryAllocation; }
    size_t data_bytes = 0;
    char* mapping = map_before_guard_page(rounded, &data_bytes);
    if (mapping == nullptr) { last_error = cudaErrorMemoryAllocation; return cudaErrorMemoryAllocation; }
    char* start = mapping + data_bytes - rounded;
    memset(start, 0xff, rounded);  // uninitialized device memory: bf16 NaN, fp32 NaN
    std::lock_guard<std::mutex> lock(allocations_mutex);
    allocations[start] = Allocation{mapping, data_bytes + page_bytes(), rounded};
    count_allocated(rounded);
    *pointer = start;
    return cudaSuccess;
}

cudaError_t cudaFree(void* pointer) {
    cudasim::note_cuda_call(__func__);
    if (pointer == nullptr) { return cudaSuccess; }
    synchronize_all_streams(INFINITY);  // documented: cudaFree synchronizes the device
    std::lock_guard<std::mutex> lock(allocations_mutex);
    auto found = allocations.find(pointer);
    if (found == allocations.end()) { fail("cudaFree of a pointer cudaMalloc did not return"); }
    munmap(found->second.mapping, found->second.mapped_bytes);
    allocated_bytes -= found->second.bytes;
    allocations.erase(found);
    return cudaSuccess;
}

cudaError_t cudaMallocHost(void** pointer, size_t bytes) {
    cudasim::note_cuda_call(__func__);
    *pointer = malloc(bytes > 0 ? bytes : 1);
    if (*pointer == nullptr) { return cudaErrorMemoryAllocation; }
    pinned_allocations[(const char*)*pointer] = bytes > 0 ? bytes : 1;
    return cudaSuccess;
}
cudaError_t cudaFreeHost(void* pointer) {
    cudasim::note_cuda_call(__func__);
    if (pointer == nullptr) { return cudaSuccess; }
    synchronize_all_streams(INFINITY);  // queued copies may still read or write it
    if (pinned_allocations.erase((const char*)pointer) == 0) { fail("cudaFreeHost of a pointer cudaMallocHost did not return"); }
    free(pointer);
    return cudaSuccess;
}

cudaError_t cudaMemcpy(void* destination, const void* source, size_t bytes, cudaMemcpyKind kind) {
    return enqueue_copy(Copy{(char*)destination, bytes, (const char*)source, bytes, bytes, 1}, kind, nullptr, true);
}
cudaError_t cudaMemcpyAsync(void* destination, const void* source, size_t bytes, cudaMemcpyKind kind, cudaStream_t stream) {
    return enqueue_copy(Copy{(char*)destination, bytes, (const char*)source, bytes, bytes, 1}, kind, stream, false);
}
cudaError_t cudaMemset(void* destination, int value, size_t bytes) {
    return enqueue_memset(destination, value, bytes, nullptr);
}
cudaError_t cudaMemsetAsync(void* destination, int value, size_t bytes, cudaStream_t stream) {
    return enqueue_memset(destination, value, bytes, stream);
}
cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
    cudasim::note_cuda_call(__func__);
    *total_bytes = simulated_memory_bytes();
    *free_bytes = simulated_memory_bytes() - allocated_bytes;
    return cudaSuccess;
}

cudaError_t cudaGetLastError(void) {
    cudaError_t e = sticky_error != cudaSuccess ? sticky_error : last_error;
    last_error = cudaSuccess;
    return e;
}
const char* cudaGetErrorString(cudaError_t error) {
    switch (error) {
        case cudaSuccess: return "no error";
        case cudaErrorMemoryAllocation: return "out of memory";
        case cudaErrorInvalidConfiguration: return "invalid configuration argument";
        case cudaErrorNotReady: return "device not ready";
        case cudaErrorIllegalAddress: return "an illegal memory access was encountered";
        default: return "cudasim error";
    }
}
const char* cudaGetErrorName(cudaError_t error) {
    switch (error) {
        case cudaSuccess: return "cudaSuccess";
        case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
        case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
        case cudaErrorNotReady: return "cudaErrorNotReady";
        case cudaErrorIllegalAddress: return "cudaErrorIllegalAddress";
        default: return "cudaErrorUnknown";
    }
}

cudaError_t cudaFuncSetAttribute(const void* function, cudaFuncAttribute attribute, int value) {
    cudasim::note_cuda_call(__func__);
    if (attribute == cudaFuncAttributeMaxDynamicSharedMemorySize) {
        if (value > OPT_IN_DYNAMIC_SHARED_LIMIT) { return cudaErrorInvalidValue; }
        max_dynamic_shared_by_kernel[function] = value;
    }
    return cudaSuccess;
}

cudaError_t cudaSetDevice(int) {
    cudasim::note_cuda_call(__func__);
    return cudaSuccess;
}
cudaError_t cudaGetDevice(int* device) {
    cudasim::note_cuda_call(__func__);
    *device = 0;
    return cudaSuccess;
}
cudaError_t cudaGetDeviceCount(int* count) {
    cudasim::note_cuda_call(__func__);
    *count = 1;
    return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize(void) {
    cudasim::note_cuda_call(__func__);
    synchronize_all_streams(INFINITY);
    return sticky_error;
}
// the SM count: an H100 or H200 SXM's 132, or CUDASIM_SM_COUNT (fewer, so that a kernel whose grid
// is what the GPU holds at once gives each block several pieces of work at a test's sizes)
static int simulated_sm_count() {
    const char* text = getenv("CUDASIM_SM_COUNT");
    if (text == nullptr) { return 132; }
    char* end = nullptr;
    long count = strtol(text, &end, 10);
    if (end == text || *end != '\0' || count < 1 || count > 1024) { fail(std::string("CUDASIM_SM_COUNT=") + text + ": expected 1 to 1024"); }
    return (int)count;
}
// the SM count, as cudaGetDeviceProperties says; other attributes are not modelled
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attribute, int) {
    cudasim::note_cuda_call(__func__);
    if (attribute != cudaDevAttrMultiProcessorCount) {
        cudasim::fail("cudaDeviceGetAttribute: attribute " + std::to_string((int)attribute) + " is not modelled");
    }
    *value = simulated_sm_count();
    return cudaSuccess;
}
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int) {
    cudasim::note_cuda_call(__func__);
    memset(prop, 0, sizeof(*prop));
    // CUDASIM_DEVICE_NAME: a GPU's name, so the trainer takes that GPU's peak (a test of the MFU it prints)
    const char* name = getenv("CUDASIM_DEVICE_NAME");
    snprintf(prop->name, sizeof(prop->name), "%s", name != nullptr ? name : "cudasim (CPU)");
    prop->multiProcessorCount = simulated_sm_count();
    prop->totalGlobalMem = simulated_memory_bytes();
    prop->major = 9;
    prop->minor = 0;
    prop->warpSize = 32;
    prop->maxThreadsPerBlock = 1024;
    prop->sharedMemPerBlockOptin = OPT_IN_DYNAMIC_SHARED_LIMIT;
    return cudaSuccess;
}

// streams and events (the queues are above)
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned flags) {
    cudasim::note_cuda_call(__func__);
    *stream = new CUstream_st;
    (*stream)->blocking = (flags & cudaStreamNonBlocking) == 0;
    all_streams.push_back(*stream);
    return cudaSuccess;
}
cudaError_t cudaStreamCreate(cudaStream_t* stream) { return cudaStreamCreateWithFlags(stream, cudaStreamDefault); }
// the documentation lets the work queued on a destroyed stream finish later; running it now is
// one order a GPU may take
cudaError_t cudaStreamDestroy(cudaStream_t stream) {
    cudasim::note_cuda_call(__func__);
    drain_until([stream] { return stream->queue.empty(); }, INFINITY);
    all_streams.erase(std::find(all_streams.begin(), all_streams.end(), stream));
    delete stream;
    return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t handle) {
    cudasim::note_cuda_call(__func__);
    CUstream_st* stream = stream_of(handle);
    drain_until([stream] { return stream->queue.empty(); }, INFINITY);
    return sticky_error;
}
// waits for the event's most recent record at the time of the call (none yet: no wait)
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned) {
    enqueue(stream, "cudaStreamWaitEvent", [](double) { return true; }, event->recorded);
    return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t* event) {
    cudasim::note_cuda_call(__func__);
    *event = new CUevent_st;
    return cudaSuccess;
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned) { return cudaEventCreate(event); }
cudaError_t cudaEventDestroy(cudaEvent_t event) {
    cudasim::note_cuda_call(__func__);
    delete event;
    return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
    event->recorded = enqueue(stream, "cudaEventRecord", [](double) { return true; });
    return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t event) {
    cudasim::note_cuda_call(__func__);
    std::shared_ptr<Completion> recorded = event->recorded;
    if (recorded != nullptr) { drain_until([&] { return recorded->done; }, INFINITY); }
    return sticky_error;
}
cudaError_t cudaEventQuery(cudaEvent_t event) {
    cudasim::note_cuda_call(__func__);
    std::shared_ptr<Completion> recorded = event->recorded;
    bool done = recorded == nullptr || drain_until([&] { return recorded->done; }, now_seconds() + QUERY_WAIT_S);
    return sticky_error != cudaSuccess ? sticky_error : done ? cudaSuccess : cudaErrorNotReady;
}
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
    cudasim::note_cuda_call(__func__);
    if (start->recorded == nullptr || end->recorded == nullptr) { return cudaErrorInvalidResourceHandle; }
    if (!start->recorded->done || !end->recorded->done) { return cudaErrorNotReady; }
    *ms = (float)((end->recorded->seconds - start->recorded->seconds) * 1000.0);
    return cudaSuccess;
}

} // extern "C"

// ----------------------------------------------------------------------------------------
// llmc/zero_comm.cuh's strided copy, and the device memory count cudasim_driver.cpp shares

cudaError_t cudaMemcpy2DAsync(void* destination, size_t destination_pitch, const void* source, size_t source_pitch,
                              size_t width, size_t height, cudaMemcpyKind kind, cudaStream_t stream) {
    if (sticky_error != cudaSuccess) { return sticky_error; }
    if (width > destination_pitch || width > source_pitch) { return cudaErrorInvalidPitchValue; }
    return enqueue_copy(Copy{(char*)destination, destination_pitch, (const char*)source, source_pitch, width, height},
                        kind, stream, false);
}

// device memory not from cudaMalloc (the driver's cuMemCreate) counts in cudaMemGetInfo too
bool cudasim::device_memory_acquire(size_t bytes) {
    std::lock_guard<std::mutex> lock(allocations_mutex);
    if (allocated_bytes + bytes > simulated_memory_bytes()) { return false; }
    count_allocated(bytes);
    return true;
}
void cudasim::device_memory_release(size_t bytes) {
    std::lock_guard<std::mutex> lock(allocations_mutex);
    allocated_bytes -= bytes;
}
