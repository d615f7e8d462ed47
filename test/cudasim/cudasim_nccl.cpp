/*
cudasim_nccl.cpp: the NCCL calls llm8 makes, between the processes of a cudasim run.

Why: llm8 runs one process per GPU (test_multi_gpu forks two ranks, the trainer is launched
once per rank), so its collectives, its ZeRO group calls and its watchdog (llmc/multi_gpu.h:
a nonblocking communicator polled with ncclCommGetAsyncError up to a deadline, then
ncclCommAbort) can only be checked with ranks that are separate processes exchanging data.

How: ncclGetUniqueId creates a POSIX shared-memory region and writes its name into the id;
every rank maps it in ncclCommInitRankConfig. The region holds, per rank, its pid, how many
barriers it has reached and what collective it is in, and two staging buffers. A collective
(or a group's, at its ncclGroupEnd) is queued on its stream (cudasim_runtime.cpp) and moves
its data when the stream runs it (enqueue_collectives): in chunks of at most STAGING_BYTES
per rank, each chunk one round of "every rank copies its part into its staging buffer,
barrier, every rank reads what it needs from all buffers". Staging buffers alternate by barrier parity, so one barrier per
round suffices: a rank can only come back to a buffer after every rank passed the barrier
that follows its reads. The barrier is a futex on a sequence word bumped at every arrival.

What NCCL documents and this does:
- Nonblocking communicators (config.blocking = 0): a host-side call (creation, finalization)
  that cannot finish because a peer has not arrived returns ncclInProgress after a short wait;
  the operation continues in ncclCommGetAsyncError, which reports ncclInProgress until it
  completes. A collective (or a group's, at ncclGroupEnd) returns ncclInProgress always, as
  NCCL may: NCCL's own thread puts it on its stream later, here at the first
  ncclCommGetAsyncError after the call. So CUDA work the host puts on that stream (an event
  record, a kernel) before the state reaches ncclSuccess runs before the collective, as it may
  on a GPU. The documentation requires the state to reach ncclSuccess before the next NCCL call
  on the communicator and before CUDA work that depends on it; an NCCL call made earlier stops
  the program (a usage error a GPU would turn into a race). Blocking communicators wait in the
  call for as long as the peers live, and put a collective on its stream in the call.
- A peer that exited (or aborted or destroyed its communicator) before reaching the point a
  rank waits at gives ncclRemoteError ("a remote process exiting prematurely" is one of its
  documented causes), with the rank, the pid and the operation in ncclGetLastError. A peer
  that lives but never arrives leaves the operation in progress: the caller's deadline
  decides, as with a GPU kernel waiting for a hung peer.
- Group calls: operations between ncclGroupStart and the outermost ncclGroupEnd are queued
  and run at ncclGroupEnd. NCCL fuses them into one launch and documents no order among
  them, so an operation writing memory another one of the same group reads or writes stops
  the program; independent ones run in call order.
- Every rank must issue the same collectives in the same order (NCCL matches them by order):
  each round compares the ranks' operations (kind, count, type, operation, root) and a
  mismatch, which on a GPU hangs or mixes data, stops the program naming both sides.
- Reductions follow rank order 0, 1, ..., N-1, rounding to the element type after each step,
  so they are deterministic. NCCL documents neither the order nor the precision: it reduces
  in the element type along its ring or tree, in an order that depends on the algorithm, so
  with more than two ranks its low bits may differ from these. ncclAvg is NCCL's, which its
  documentation leaves out (its source, src/enqueue.cc, hostToDevRedOp): integers summed,
  then divided; floating types each multiplied by 1/N, rounded to float and then to the
  element type, before the sum (PreMulSum): bf16's 1/3 is 0.333984375, so a bf16 average
  over 3 ranks comes out 0.2% large. MAX and MIN of
  floating types follow fmax/fmin (a NaN operand loses; NCCL documents nothing on NaN).
  FP8 sums saturate to the largest finite value (cuda_fp8.h's conversion; undocumented).
- ncclCommFinalize waits until every rank has finalized (the documented "globally
  quiescent"); ncclCommDestroy and ncclCommAbort free the local resources (Abort drops
  unfinished operations); peers still waiting for this rank then see ncclRemoteError.
- Buffers: a send and a receive buffer that overlap in any way but NCCL's documented in-place
  forms stop the program (see check_buffers).
- Two ranks on one GPU: every cudasim process is device 0, so a communicator of more than one
  rank is refused with ncclInvalidUsage unless NCCL_MULTI_RANK_GPU_ENABLE is set, as NCCL 2.30+
  does (older NCCL refuses it always). The version reported is 2.30.0, the first that allows
  it, so the two-ranks-on-one-GPU tests run. Only the calls llm8 uses exist here.
*/
#include "cudasim.h"
#include <nccl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <linux/futex.h>
#include <fcntl.h>
#include <unistd.h>
#include <signal.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <limits.h>
#include <atomic>
#include <deque>
#include <memory>
#include <math.h>
#include <string>
#include <type_traits>
#include <vector>

namespace {

const int MAX_RANKS = 64;
const size_t STAGING_BYTES = 4u << 20;          // per rank and parity: one chunk of a collective
const double NONBLOCKING_CALL_WAIT_S = 0.05;     // a nonblocking call waits this long, then ncclInProgress
const double ASYNC_ERROR_WAIT_S = 0.01;          // each ncclCommGetAsyncError progresses this long
const double PEER_CHECK_INTERVAL_S = 0.1;        // how often a waiting rank looks for dead peers
const char ID_MAGIC[] = "cudasim-nccl-id";       // leads the name in an ncclUniqueId
const uint32_t REGION_MAGIC = 0x6e63636cu;

[[noreturn]] void fail(const std::string& message) {
    fprintf(stderr, "cudasim NCCL: %s\n", message.c_str());
    fflush(stderr);
    abort();
}

double now_s() {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

// ----------------------------------------------------------------------------------------
// operations and what the ranks must agree on

enum class Kind : int32_t { Join, Finalize, AllReduce, Reduce, Broadcast, AllGather, ReduceScatter };

const char* kind_name(Kind kind) {
    switch (kind) {
        case Kind::Join: return "communicator creation";
        case Kind::Finalize: return "ncclCommFinalize";
        case Kind::AllReduce: return "ncclAllReduce";
        case Kind::Reduce: return "ncclReduce";
        case Kind::Broadcast: return "ncclBroadcast";
        case Kind::AllGather: return "ncclAllGather";
        case Kind::ReduceScatter: return "ncclReduceScatter";
    }
    return "?";
}
bool has_root(Kind kind) { return kind == Kind::Reduce || kind == Kind::Broadcast; }
bool reduces(Kind kind) { return kind == Kind::AllReduce || kind == Kind::Reduce || kind == Kind::ReduceScatter; }

// what a rank posts for a round; every rank's must be equal
struct Descriptor {
    Kind kind;
    int32_t datatype;
    int32_t op;
    int32_t root;
    uint64_t count;   // per rank: NCCL's count, sendcount or recvcount
    uint64_t serial;  // the how-manyth operation of this rank on the communicator (messages only)
};

bool same_operation(const Descriptor& a, const Descriptor& b) {
    return a.kind == b.kind && a.count == b.count &&
           (a.kind == Kind::Join || a.kind == Kind::Finalize || a.datatype == b.datatype) &&
           (!reduces(a.kind) || a.op == b.op) && (!has_root(a.kind) || a.root == b.root);
}

size_t element_bytes(int datatype) {
    switch ((ncclDataType_t)datatype) {
        case ncclInt8: case ncclUint8: case ncclFloat8e4m3: case ncclFloat8e5m2: return 1;
        case ncclFloat16: case ncclBfloat16: return 2;
        case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
        case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
        default: return 0;
    }
}

const char* datatype_name(int datatype) {
    static const char* names[] = {"int8", "uint8", "int32", "uint32", "int64", "uint64", "float16", "float32",
                                  "float64", "bfloat16", "float8e4m3", "float8e5m2"};
    return datatype >= 0 && datatype < ncclNumTypes ? names[datatype] : "?";
}

const char* op_name(int op) {
    static const char* names[] = {"sum", "prod", "max", "min", "avg"};
    return op >= 0 && op < ncclNumOps ? names[op] : "?";
}

std::string describe(const Descriptor& d) {
    char text[192];
    if (d.kind == Kind::Join || d.kind == Kind::Finalize) {
        snprintf(text, sizeof(text), "%s", kind_name(d.kind));
        return text;
    }
    int n = snprintf(text, sizeof(text), "%s #%llu of %llu %s", kind_name(d.kind), (unsigned long long)d.serial,
                     (unsigned long long)d.count, datatype_name(d.datatype));
    if (reduces(d.kind)) { n += snprintf(text + n, sizeof(text) - n, " (%s)", op_name(d.op)); }
    if (has_root(d.kind)) { snprintf(text + n, sizeof(text) - n, " root %d", d.root); }
    return text;
}

// ----------------------------------------------------------------------------------------
// the shared region

struct RankRecord {
    std::atomic<int32_t> pid;        // 0 until the rank joins
    std::atomic<int32_t> departed;   // 1 once it aborted or destroyed its communicator
    std::atomic<uint32_t> arrivals;  // barriers reached
    Descriptor posted[2];            // its operation, by the parity of the barrier it reached
};

struct Region {
    uint32_t magic;
    std::atomic<int32_t> nranks;     // set by the first rank to join
    std::atomic<uint32_t> sequence;  // futex word: bumped at every arrival and departure
    RankRecord ranks[MAX_RANKS];
};
static_assert(std::atomic<uint32_t>::is_always_lock_free && std::atomic<int32_t>::is_always_lock_free,
              "process-shared atomics must be lock-free");

size_t page_bytes() { return (size_t)sysconf(_SC_PAGESIZE); }
size_t header_bytes() { return (sizeof(Region) + page_bytes() - 1) / page_bytes() * page_bytes(); }
size_t region_bytes(int nranks) { return header_bytes() + (size_t)nranks * 2 * STAGING_BYTES; }

void futex_wait(std::atomic<uint32_t>* word, uint32_t expected, double seconds) {
    struct timespec timeout;
    timeout.tv_sec = (time_t)seconds;
    timeout.tv_nsec = (long)((seconds - (double)timeout.tv_sec) * 1e9);
    syscall(SYS_futex, (uint32_t*)word, FUTEX_WAIT, expected, &timeout, nullptr, 0);
}
void futex_wake_all(std::atomic<uint32_t>* word) {
    syscall(SYS_futex, (uint32_t*)word, FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

bool process_gone(pid_t pid) {
    if (kill(pid, 0) != 0 && errno == ESRCH) { return true; }
    // an exited child its parent has not reaped yet is a zombie: gone all the same
    char path[64], state = '?';
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    FILE* f = fopen(path, "r");
    if (f == nullptr) { return true; }
    int matched = fscanf(f, "%*d (%*[^)]) %c", &state);
    fclose(f);
    return matched == 1 && (state == 'Z' || state == 'X');
}

char last_error_text[512] = "";

ncclResult_t record_error(ncclResult_t result, const std::string& text) {
    snprintf(last_error_text, sizeof(last_error_text), "%s", text.c_str());
    return result;
}

// ----------------------------------------------------------------------------------------
// element arithmetic: in the element type, one step at a time

template <class T> double widen(T v) { return (double)v; }
template <> double widen(__half v) { return (double)__half2float(v); }
template <> double widen(__nv_bfloat16 v) { return (double)__bfloat162float(v); }
template <> double widen(__nv_fp8_e4m3 v) { return (double)(float)v; }
template <> double widen(__nv_fp8_e5m2 v) { return (double)(float)v; }
template <class T> T narrow(double v) { return T(v); }

template <class T, bool integral = std::is_integral<T>::value>
struct Arithmetic {  // integers: sum and product wrap (computed unsigned), avg truncates
    using U = typename std::make_unsigned<T>::type;
    static constexpr bool average_premultiplies = false;  // ncclAvg: the sum, then divided
    static T average_factor(int) { return T(1); }
    static T sum(T a, T b) { return (T)(U)((U)a + (U)b); }
    static T prod(T a, T b) { return (T)(U)((U)a * (U)b); }
    static T max(T a, T b) { return a > b ? a : b; }
    static T min(T a, T b) { return a < b ? a : b; }
    static T divide(T a, int n) { return (T)(a / (T)n); }
};
template <class T>
struct Arithmetic<T, false> {  // floating types through double, each result rounded once to T: sums
    // and products of two float (or narrower) values are exact in double, so that is the correctly
    // rounded result in T
    static T sum(T a, T b) { return narrow<T>(widen(a) + widen(b)); }
    static T prod(T a, T b) { return narrow<T>(widen(a) * widen(b)); }
    static T max(T a, T b) { return narrow<T>(fmax(widen(a), widen(b))); }
    static T min(T a, T b) { return narrow<T>(fmin(widen(a), widen(b))); }
    static constexpr bool average_premultiplies = true;  // ncclAvg: each value times 1/N, then the sum
    static T average_factor(int n) { return narrow<T>((double)(float)(1.0 / n)); }
};

template <class T>
void reduce_typed(void* destination, const char* const* sources, int nsources, size_t count, ncclRedOp_t op) {
    using A = Arithmetic<T>;
    T* out = (T*)destination;
    const bool premultiply = op == ncclAvg && A::average_premultiplies;
    const T factor = A::average_factor(nsources);
    auto source = [&](int q, size_t i) {
        T v;
        memcpy(&v, sources[q] + i * sizeof(T), sizeof(T));
        return premultiply ? A::prod(v, factor) : v;
    };
    for (size_t i = 0; i < count; i++) {
        T value = source(0, i);
        for (int q = 1; q < nsources; q++) {
            T next = source(q, i);
            switch (op) {
                case ncclSum: case ncclAvg: value = A::sum(value, next); break;
                case ncclProd: value = A::prod(value, next); break;
                case ncclMax: value = A::max(value, next); break;
                case ncclMin: value = A::min(value, next); break;
                default: break;
            }
        }
        if constexpr (!A::average_premultiplies) {
            if (op == ncclAvg) { value = A::divide(value, nsources); }
        }
        memcpy(&out[i], &value, sizeof(T));
    }
}

// destination[i] = sources[0][i] op sources[1][i] op ... (rank order)
void reduce(void* destination, const char* const* sources, int nsources, size_t count, int datatype, ncclRedOp_t op) {
    switch ((ncclDataType_t)datatype) {
        case ncclInt8: reduce_typed<int8_t>(destination, sources, nsources, count, op); break;
        case ncclUint8: reduce_typed<uint8_t>(destination, sources, nsources, count, op); break;
        case ncclInt32: reduce_typed<int32_t>(destination, sources, nsources, count, op); break;
        case ncclUint32: reduce_typed<uint32_t>(destination, sources, nsources, count, op); break;
        case ncclInt64: reduce_typed<int64_t>(destination, sources, nsources, count, op); break;
        case ncclUint64: reduce_typed<uint64_t>(destination, sources, nsources, count, op); break;
        case ncclFloat16: reduce_typed<__half>(destination, sources, nsources, count, op); break;
        case ncclFloat32: reduce_typed<float>(destination, sources, nsources, count, op); break;
        case ncclFloat64: reduce_typed<double>(destination, sources, nsources, count, op); break;
        case ncclBfloat16: reduce_typed<__nv_bfloat16>(destination, sources, nsources, count, op); break;
        case ncclFloat8e4m3: reduce_typed<__nv_fp8_e4m3>(destination, sources, nsources, count, op); break;
        case ncclFloat8e5m2: reduce_typed<__nv_fp8_e5m2>(destination, sources, nsources, count, op); break;
        default: fail("reduction of an unknown data type");
    }
}

struct Operation {
    Descriptor what;
    const char* send;
    char* recv;
    size_t chunk_elements;  // per rank and round
    size_t rounds;
    size_t next_round = 0;
    bool arrived = false;   // this rank has deposited round next_round and reached its barrier
    bool lost = false;      // CUDASIM_NCCL_LOSE_BROADCAST: this rank's receive buffer keeps its bytes
};

} // namespace

// the communicator (nccl.h declares it opaque)
struct ncclComm {
    std::string region_name;
    Region* region = nullptr;
    size_t mapped_bytes = 0;
    int rank = 0, nranks = 0;
    bool blocking = true;
    bool finalize_issued = false;
    uint32_t barriers_passed = 0;
    uint64_t operations_issued = 0;
    std::deque<Operation> pending;      // host-side operations (creation, finalization) not complete
    // a nonblocking communicator's collectives not yet on their stream (ncclCommGetAsyncError puts them there)
    std::vector<std::pair<cudaStream_t, std::deque<Operation>>> unlaunched;
    ncclResult_t state = ncclSuccess;   // ncclInProgress while pending or unlaunched is not empty, or an error
    // collectives run from the streams' queues, which outlive the communicator: Abort and
    // Destroy set this and the queued ones are dropped
    std::shared_ptr<bool> released = std::make_shared<bool>(false);
    std::shared_ptr<cudasim::Completion> last_collective;  // the one enqueued last
};

namespace {

char* staging(ncclComm* comm, int rank, uint32_t parity) {
    return (char*)comm->region + header_bytes() + ((size_t)rank * 2 + parity) * STAGING_BYTES;
}

// a rank copies its part of round r into its staging buffer
void deposit(ncclComm* comm, const Operation& op, uint32_t parity) {
    const Descriptor& d = op.what;
    size_t esize = element_bytes(d.datatype);
    size_t first = op.next_round * op.chunk_elements;
    size_t n = std::min(op.chunk_elements, d.count - std::min(d.count, first));
    char* mine = staging(comm, comm->rank, parity);
    switch (d.kind) {
        case Kind::AllReduce: case Kind::Reduce: case Kind::AllGather:
            memcpy(mine, op.send + first * esize, n * esize);
            break;
        case Kind::Broadcast:
            if (comm->rank == d.root) { memcpy(mine, op.send + first * esize, n * esize); }
            break;
        case Kind::ReduceScatter:
            for (int q = 0; q < comm->nranks; q++) {
                memcpy(mine + q * op.chunk_elements * esize, op.send + (q * d.count + first) * esize, n * esize);
            }
            break;
        case Kind::Join: case Kind::Finalize:
            break;
    }
}

// after the barrier: a rank takes what it needs of round r from every rank's buffer
void collect(ncclComm* comm, const Operation& op, uint32_t parity) {
    const Descriptor& d = op.what;
    size_t esize = element_bytes(d.datatype);
    size_t first = op.next_round * op.chunk_elements;
    size_t n = std::min(op.chunk_elements, d.count - std::min(d.count, first));
    std::vector<const char*> parts(comm->nranks);
    for (int q = 0; q < comm->nranks; q++) {
        parts[q] = staging(comm, q, parity) + (d.kind == Kind::ReduceScatter ? comm->rank * op.chunk_elements * esize : 0);
    }
    switch (d.kind) {
        case Kind::AllReduce: case Kind::ReduceScatter:
            reduce(op.recv + first * esize, parts.data(), comm->nranks, n, d.datatype, (ncclRedOp_t)d.op);
            break;
        case Kind::Reduce:
            if (comm->rank == d.root) {
                reduce(op.recv + first * esize, parts.data(), comm->nranks, n, d.datatype, (ncclRedOp_t)d.op);
            }
            break;
        case Kind::Broadcast:
            if (!op.lost) { memcpy(op.recv + first * esize, parts[d.root], n * esize); }
            break;
        case Kind::AllGather:
            for (int q = 0; q < comm->nranks; q++) { memcpy(op.recv + (q * d.count + first) * esize, parts[q], n * esize); }
            break;
        case Kind::Join: case Kind::Finalize:
            break;
    }
}

void arrive(ncclComm* comm, const Operation& op, uint32_t parity) {
    RankRecord& me = comm->region->ranks[comm->rank];
    me.posted[parity] = op.what;
    me.arrivals.fetch_add(1);
    comm->region->sequence.fetch_add(1);
    futex_wake_all(&comm->region->sequence);
}

// every rank's operation at the barrier just passed must be this rank's
void check_agreement(ncclComm* comm, const Operation& op, uint32_t parity) {
    for (int q = 0; q < comm->nranks; q++) {
        const Descriptor& theirs = comm->region->ranks[q].posted[parity];
        if (!same_operation(theirs, op.what)) {
            fail("ranks disagree on the next collective: rank " + std::to_string(comm->rank) + " calls " +
                 describe(op.what) + ", rank " + std::to_string(q) + " calls " + describe(theirs) +
                 " (NCCL needs every rank to issue the same collectives in the same order; on a GPU this hangs or "
                 "mixes data)");
        }
    }
}

// CUDASIM_NCCL_PEER_CHECK_STALL_S (tests): a waiting rank that found a peer missing sleeps this
// long before it looks whether the peer left, as a descheduled process may; the peer can
// arrive, finish and exit meanwhile
void peer_check_stall() {
    static const double seconds = [] {
        const char* text = getenv("CUDASIM_NCCL_PEER_CHECK_STALL_S");
        return text != nullptr ? atof(text) : 0.0;
    }();
    if (seconds > 0) { usleep((useconds_t)(seconds * 1e6)); }
}

// waits until every rank has reached barrier number barriers_passed (counting from 0), up to
// `deadline` (ncclInProgress after it); ncclRemoteError when a missing rank is gone
ncclResult_t wait_barrier(ncclComm* comm, const Operation& op, double deadline) {
    Region* region = comm->region;
    const uint32_t needed = comm->barriers_passed + 1;
    double next_peer_check = now_s();
    for (;;) {
        uint32_t seen = region->sequence.load();
        int missing = -1;
        for (int q = 0; q < comm->nranks && missing < 0; q++) {
            if ((int32_t)(region->ranks[q].arrivals.load() - needed) < 0) { missing = q; }
        }
        if (missing < 0) { return ncclSuccess; }
        double now = now_s();
        if (now >= next_peer_check) {
            next_peer_check = now + PEER_CHECK_INTERVAL_S;
            for (int q = 0; q < comm->nranks; q++) {
                const RankRecord& peer = region->ranks[q];
                if ((int32_t)(peer.arrivals.load() - needed) >= 0) { continue; }
                peer_check_stall();
                int32_t pid = peer.pid.load();
                bool departed = peer.departed.load() != 0;
                if (!departed && !(pid != 0 && process_gone(pid))) { continue; }
                // it left, but maybe only after it arrived here (the arrival read above may
                // predate it: it can arrive, finish, destroy and exit while this rank is
                // descheduled): what it stored before leaving is visible now, so read again
                if ((int32_t)(peer.arrivals.load() - needed) >= 0) { continue; }
                char text[320];
                snprintf(text, sizeof(text), "cudasim NCCL: rank %d of %d (pid %d) %s; rank %d waits for it in %s",
                         q, comm->nranks, (int)pid, departed ? "aborted or destroyed its communicator" : "has exited",
                         comm->rank, describe(op.what).c_str());
                return record_error(ncclRemoteError, text);
            }
        }
        if (now >= deadline) { return ncclInProgress; }
        double wait = std::min(deadline - now, next_peer_check - now);
        futex_wait(&region->sequence, seen, std::max(wait, 1e-4));
    }
}

// runs one operation's rounds until done, an error, or the deadline (ncclInProgress; the
// operation remembers where it is and goes on at the next call)
ncclResult_t advance(ncclComm* comm, Operation& op, double deadline) {
    while (op.next_round < op.rounds) {
        const uint32_t parity = comm->barriers_passed & 1;
        if (!op.arrived) {
            deposit(comm, op, parity);
            arrive(comm, op, parity);
            op.arrived = true;
        }
        ncclResult_t result = wait_barrier(comm, op, deadline);
        if (result != ncclSuccess) { return result; }
        check_agreement(comm, op, parity);
        collect(comm, op, parity);
        comm->barriers_passed++;
        op.arrived = false;
        op.next_round++;
    }
    return ncclSuccess;
}

// runs the pending host-side operations (creation, finalization) in order until done, an
// error, or the deadline. Before it waits for its peers a rank runs the work queued on its
// streams (collectives included): a peer may be blocked in a stream synchronization waiting
// for this rank's part of a collective that only a host wait here runs
ncclResult_t progress(ncclComm* comm, double deadline) {
    if (comm->state != ncclSuccess && comm->state != ncclInProgress) { return comm->state; }
    while (!comm->pending.empty()) {
        if (!cudasim::synchronize_all_streams(deadline)) { return comm->state; }
        if (comm->state != ncclInProgress) { return comm->state; }  // a queued collective failed
        Operation& op = comm->pending.front();
        ncclResult_t result = advance(comm, op, deadline);
        if (result != ncclSuccess) {
            if (result != ncclInProgress) { comm->state = result; }
            return result;
        }
        if (op.what.kind == Kind::Join) { shm_unlink(comm->region_name.c_str()); }  // every rank has it mapped
        comm->pending.pop_front();
    }
    comm->state = ncclSuccess;
    return ncclSuccess;
}

double call_deadline(const ncclComm* comm) { return comm->blocking ? INFINITY : now_s() + NONBLOCKING_CALL_WAIT_S; }

// the documentation: after ncclInProgress, nothing but ncclCommGetAsyncError (or Abort) until it settles
void require_settled(const ncclComm* comm, const char* call) {
    if (comm->state == ncclInProgress) {
        fail(std::string(call) + " on a communicator whose previous operation is still ncclInProgress (NCCL requires "
             "polling ncclCommGetAsyncError until ncclSuccess first)");
    }
}

// CUDASIM_NCCL_LOSE_BROADCAST=N (tests): the N-th ncclBroadcast this process receives as a
// non-root (counting from 1, every communicator) leaves its receive buffer as it was, as a
// delivery that never landed would: the bytes stay stale, every rank still completes it, and
// only a comparison of the ranks' data (the trainer's -pc) can tell
bool lose_this_broadcast(const ncclComm* comm, Kind kind, int root) {
    static const long lose = [] {
        const char* text = getenv("CUDASIM_NCCL_LOSE_BROADCAST");
        return text != nullptr ? atol(text) : 0L;
    }();
    static long received = 0;
    if (kind != Kind::Broadcast || comm->rank == root) { return false; }
    return ++received == lose;
}

Operation make_operation(ncclComm* comm, Kind kind, const void* send, void* recv, size_t count, int datatype, int op,
                         int root) {
    Operation o;
    o.what = Descriptor{kind, (int32_t)datatype, (int32_t)op, (int32_t)root, (uint64_t)count, comm->operations_issued++};
    o.send = (const char*)send;
    o.recv = (char*)recv;
    size_t esize = std::max<size_t>(element_bytes(datatype), 1);
    o.chunk_elements = STAGING_BYTES / esize / (kind == Kind::ReduceScatter ? comm->nranks : 1);
    o.rounds = std::max<size_t>(1, (count + o.chunk_elements - 1) / o.chunk_elements);
    o.lost = lose_this_broadcast(comm, kind, root);
    return o;
}

// this rank's memory an operation reads and writes, for the in-group independence check
struct Extent { const char* begin; const char* end; };
bool overlap(Extent a, Extent b) { return a.begin < b.end && b.begin < a.end; }
void extents(const ncclComm* comm, const Operation& op, Extent* read, Extent* written) {
    const Descriptor& d = op.what;
    size_t bytes = d.count * element_bytes(d.datatype), all = bytes * comm->nranks;
    bool root = comm->rank == d.root;
    size_t read_bytes = d.kind == Kind::ReduceScatter ? all : (d.kind == Kind::Broadcast && !root) ? 0 : bytes;
    size_t written_bytes = d.kind == Kind::AllGather ? all : (d.kind == Kind::Reduce && !root) ? 0 : bytes;
    *read = Extent{op.send, op.send + read_bytes};
    *written = Extent{op.recv, op.recv + written_bytes};
}

// NCCL's in-place forms (usage/inplace.html): send == recv for AllReduce, Reduce and Broadcast,
// send == recv + rank * count for AllGather, recv == send + rank * count for ReduceScatter. Any
// other overlap of what a rank reads and writes is undocumented (its kernels read the send
// buffer while they write the receive buffer): it stops the program, naming the layout
void check_buffers(const ncclComm* comm, const Operation& op) {
    const Descriptor& d = op.what;
    size_t bytes = d.count * element_bytes(d.datatype), rank_offset = (size_t)comm->rank * bytes;
    bool in_place = d.kind == Kind::AllGather       ? op.send == op.recv + rank_offset
                    : d.kind == Kind::ReduceScatter ? op.recv == op.send + rank_offset
                                                    : op.send == op.recv;
    Extent read, written;
    extents(comm, op, &read, &written);
    if (in_place || !overlap(read, written)) { return; }
    char text[256];
    snprintf(text, sizeof(text), "the send buffer (%zu bytes read) and the receive buffer (%zu bytes written) overlap "
             "but are not in place (recv %+lld bytes from send)", (size_t)(read.end - read.begin),
             (size_t)(written.end - written.begin), (long long)(op.recv - op.send));
    fail(describe(d) + " on rank " + std::to_string(comm->rank) + ": " + text + "; NCCL documents only " +
         (d.kind == Kind::AllGather ? "sendbuff == recvbuff + rank * sendcount"
          : d.kind == Kind::ReduceScatter ? "recvbuff == sendbuff + rank * recvcount" : "sendbuff == recvbuff") +
         " as in place (on a GPU the result is undefined)");
}

struct GroupedOperation { ncclComm* comm; Operation op; cudaStream_t stream; };
thread_local int group_depth = 0;
thread_local std::vector<GroupedOperation> group_operations;

void check_group_independence() {
    for (size_t i = 0; i < group_operations.size(); i++) {
        for (size_t j = i + 1; j < group_operations.size(); j++) {
            const GroupedOperation& a = group_operations[i];
            const GroupedOperation& b = group_operations[j];
            Extent read_a, written_a, read_b, written_b;
            extents(a.comm, a.op, &read_a, &written_a);
            extents(b.comm, b.op, &read_b, &written_b);
            if (overlap(written_a, read_b) || overlap(written_a, written_b) || overlap(read_a, written_b)) {
                fail("one NCCL group holds dependent operations: " + describe(a.op.what) + " and " + describe(b.op.what) +
                     " touch the same memory and one of them writes it (a group runs as one launch, in no documented "
                     "order)");
            }
        }
    }
}

/*
Collectives (one, or a group's) on a stream: they run when the stream reaches them and wait
there for the peers' parts, as an NCCL kernel does. A collective whose peer left stays
unfinished with the error in the communicator (ncclCommGetAsyncError reports it, the stream
stays blocked) until ncclCommAbort drops it; a host blocking on such a stream would hang on
a GPU, so that stops the program. One communicator's collectives run in the order they were
issued, whatever streams they are on: NCCL matches them across ranks by that order (it does
not document how it orders one communicator's kernels on different streams, but runs them in
issue order; llm8 issues on two: the loss, norm and checkpoint-barrier all-reduces on the
compute stream, the gradient reduces and weight gathers on its NCCL stream).
*/
void enqueue_collectives(ncclComm* comm, cudaStream_t stream, std::deque<Operation> operations) {
    std::shared_ptr<bool> released = comm->released;
    comm->last_collective = cudasim::enqueue(stream, "NCCL collective", [comm, released, operations](double deadline) mutable {
        if (*released) { return true; }
        while (!operations.empty()) {
            const bool failed_before = comm->state != ncclSuccess && comm->state != ncclInProgress;
            ncclResult_t result = failed_before ? comm->state : advance(comm, operations.front(), deadline);
            if (result == ncclInProgress) { return false; }
            if (result != ncclSuccess) {
                comm->state = result;
                if (deadline == INFINITY) {
                    fail("the host waits for a stream whose " + describe(operations.front().what) +
                         " can never complete (" + last_error_text + "): on a GPU this hangs");
                }
                return false;
            }
            operations.pop_front();
        }
        return true;
    }, comm->last_collective);
}

// a launch of collectives: on its stream now for a blocking communicator; for a nonblocking one
// later, when ncclCommGetAsyncError polls (ncclInProgress until then)
ncclResult_t launch_collectives(ncclComm* comm, cudaStream_t stream, std::deque<Operation> operations) {
    if (comm->blocking) {
        enqueue_collectives(comm, stream, std::move(operations));
        return ncclSuccess;
    }
    comm->unlaunched.emplace_back(stream, std::move(operations));
    comm->state = ncclInProgress;
    return ncclInProgress;
}

// a collective: queued in a group, else launched
ncclResult_t issue(Kind kind, const void* send, void* recv, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                   int root, ncclComm* comm, cudaStream_t stream) {
    if (comm == nullptr) { return record_error(ncclInvalidArgument, std::string(kind_name(kind)) + ": NULL communicator"); }
    require_settled(comm, kind_name(kind));
    if (comm->state != ncclSuccess) { return comm->state; }
    if (element_bytes(datatype) == 0 || (reduces(kind) && (op < 0 || op >= ncclNumOps)) ||
        (has_root(kind) && (root < 0 || root >= comm->nranks))) {
        return record_error(ncclInvalidArgument, std::string(kind_name(kind)) + ": invalid data type, operation or root");
    }
    bool sends = !(kind == Kind::Broadcast && comm->rank != root);
    bool receives = !(kind == Kind::Reduce && comm->rank != root);
    if (count > 0 && ((sends && send == nullptr) || (receives && recv == nullptr))) {
        return record_error(ncclInvalidArgument, std::string(kind_name(kind)) + ": NULL buffer");
    }
    Operation operation = make_operation(comm, kind, send, recv, count, datatype, op, root);
    check_buffers(comm, operation);
    if (group_depth > 0) {
        group_operations.push_back(GroupedOperation{comm, operation, stream});
        return ncclSuccess;
    }
    return launch_collectives(comm, stream, {operation});
}

} // namespace

// ----------------------------------------------------------------------------------------
// the API

extern "C" {

ncclResult_t ncclGetVersion(int* version) {
    if (version == nullptr) { return ncclInvalidArgument; }
    const char* pretend = getenv("CUDASIM_NCCL_VERSION");  // a test's older NCCL (e.g. 22809: 2.28.9)
    *version = pretend != nullptr ? atoi(pretend) : NCCL_VERSION(2, 30, 0);
    return ncclSuccess;
}

const char* ncclGetErrorString(ncclResult_t result) {
    switch (result) {
        case ncclSuccess: return "no error";
        case ncclUnhandledCudaError: return "unhandled cuda error";
        case ncclSystemError: return "unhandled system error";
        case ncclInternalError: return "internal error";
        case ncclInvalidArgument: return "invalid argument";
        case ncclInvalidUsage: return "invalid usage";
        case ncclRemoteError: return "remote process exited or there was a network error";
        case ncclInProgress: return "NCCL operation in progress";
        default: return "unknown result code";
    }
}

const char* ncclGetLastError(ncclComm_t) { return last_error_text; }

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
    if (id == nullptr) { return record_error(ncclInvalidArgument, "ncclGetUniqueId: NULL id"); }
    static unsigned serial = 0;
    char name[96];
    int fd = -1;
    for (int attempt = 0; fd < 0 && attempt < 100; attempt++) {
        snprintf(name, sizeof(name), "/cudasim-nccl-%d-%u-%lx", (int)getpid(), serial++, (unsigned long)(now_s() * 1e9));
        fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
    }
    if (fd < 0 || ftruncate(fd, (off_t)header_bytes()) != 0) {
        if (fd >= 0) { close(fd); shm_unlink(name); }
        return record_error(ncclSystemError, std::string("ncclGetUniqueId: cannot create shared memory: ") + strerror(errno));
    }
    Region* region = (Region*)mmap(nullptr, header_bytes(), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (region == MAP_FAILED) {
        shm_unlink(name);
        return record_error(ncclSystemError, "ncclGetUniqueId: cannot map shared memory");
    }
    region->magic = REGION_MAGIC;  // the rest is zero: no rank has joined
    munmap(region, header_bytes());
    memset(id, 0, sizeof(*id));
    snprintf(id->internal, sizeof(id->internal), "%s%s", ID_MAGIC, name);
    return ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t* out, int nranks, ncclUniqueId id, int rank, ncclConfig_t* config) {
    if (out == nullptr || nranks < 1 || nranks > MAX_RANKS || rank < 0 || rank >= nranks) {
        return record_error(ncclInvalidArgument, "ncclCommInitRankConfig: invalid rank, rank count or output");
    }
    *out = nullptr;
    // every cudasim process is device 0, so two ranks always share one GPU: NCCL (2.30+) refuses
    // that unless NCCL_MULTI_RANK_GPU_ENABLE is set (non-zero), as it does here
    const char* multi_rank = getenv("NCCL_MULTI_RANK_GPU_ENABLE");
    if (nranks > 1 && (multi_rank == nullptr || strtoll(multi_rank, nullptr, 0) == 0)) {
        return record_error(ncclInvalidUsage, "Multiple Ranks are using the same GPU/Partition. Set "
                            "NCCL_MULTI_RANK_GPU_ENABLE=1 to enable this configuration. (cudasim NCCL: every process is "
                            "device 0)");
    }
    bool blocking = true;
    if (config != nullptr) {
        if (config->magic != 0xcafebeef || config->size != sizeof(ncclConfig_t)) {
            return record_error(ncclInvalidArgument, "ncclCommInitRankConfig: config not set from NCCL_CONFIG_INITIALIZER");
        }
        if (config->blocking != NCCL_CONFIG_UNDEF_INT && config->blocking != 0 && config->blocking != 1) {
            return record_error(ncclInvalidArgument, "ncclCommInitRankConfig: config.blocking is neither 0 nor 1");
        }
        blocking = config->blocking != 0;
    }
    id.internal[sizeof(id.internal) - 1] = '\0';
    if (strncmp(id.internal, ID_MAGIC, strlen(ID_MAGIC)) != 0) {
        return record_error(ncclInvalidArgument, "ncclCommInitRankConfig: the id is not from ncclGetUniqueId");
    }
    std::string name = id.internal + strlen(ID_MAGIC);
    int fd = shm_open(name.c_str(), O_RDWR, 0);
    if (fd < 0) {
        return record_error(ncclInvalidUsage, "ncclCommInitRankConfig: no communicator of this id is forming (" + name +
                            ": " + strerror(errno) + "; every rank joined already, or a stale id)");
    }
    struct stat info;
    size_t bytes = region_bytes(nranks);
    bool sized = fstat(fd, &info) == 0 && ((size_t)info.st_size >= bytes || ftruncate(fd, (off_t)bytes) == 0);
    Region* region = sized ? (Region*)mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : (Region*)MAP_FAILED;
    close(fd);
    if (region == MAP_FAILED) { return record_error(ncclSystemError, "ncclCommInitRankConfig: cannot map " + name); }
    int32_t expected = 0;
    if (region->magic != REGION_MAGIC ||
        (!region->nranks.compare_exchange_strong(expected, nranks) && expected != nranks)) {
        munmap(region, bytes);
        return record_error(ncclInvalidUsage, "ncclCommInitRankConfig: ranks disagree on the number of ranks (" +
                            std::to_string(nranks) + " here, " + std::to_string(expected) + " before)");
    }
    int32_t no_pid = 0;
    if (!region->ranks[rank].pid.compare_exchange_strong(no_pid, (int32_t)getpid())) {
        munmap(region, bytes);
        return record_error(ncclInvalidUsage, "ncclCommInitRankConfig: rank " + std::to_string(rank) +
                            " joined this communicator already (pid " + std::to_string(no_pid) + ")");
    }
    ncclComm* comm = new ncclComm;
    comm->region_name = name;
    comm->region = region;
    comm->mapped_bytes = bytes;
    comm->rank = rank;
    comm->nranks = nranks;
    comm->blocking = blocking;
    Operation join = make_operation(comm, Kind::Join, nullptr, nullptr, (size_t)nranks, ncclUint8, 0, 0);
    comm->pending.push_back(join);
    comm->state = ncclInProgress;
    *out = comm;
    return progress(comm, call_deadline(comm));
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* async_error) {
    if (comm == nullptr || async_error == nullptr) { return ncclInvalidArgument; }
    if (!comm->unlaunched.empty()) {  // NCCL's thread puts them on their streams, and the call has settled
        for (auto& launch : comm->unlaunched) { enqueue_collectives(comm, launch.first, std::move(launch.second)); }
        comm->unlaunched.clear();
        if (comm->state == ncclInProgress) { comm->state = ncclSuccess; }  // nothing run: the streams run them later
    } else if (comm->state == ncclInProgress) {
        progress(comm, now_s() + ASYNC_ERROR_WAIT_S);
    }
    *async_error = comm->state;
    return ncclSuccess;
}

ncclResult_t ncclCommFinalize(ncclComm_t comm) {
    if (comm == nullptr) { return ncclInvalidArgument; }
    require_settled(comm, "ncclCommFinalize");
    if (comm->state != ncclSuccess) { return comm->state; }
    if (comm->finalize_issued) { return record_error(ncclInvalidUsage, "ncclCommFinalize called twice"); }
    comm->finalize_issued = true;
    comm->pending.push_back(make_operation(comm, Kind::Finalize, nullptr, nullptr, 0, ncclUint8, 0, 0));
    comm->state = ncclInProgress;
    return progress(comm, call_deadline(comm));
}

// Destroy and Abort: peers still waiting for this rank learn that it left
static void release_communicator(ncclComm* comm) {
    *comm->released = true;
    comm->region->ranks[comm->rank].departed.store(1);
    comm->region->sequence.fetch_add(1);
    futex_wake_all(&comm->region->sequence);
    munmap(comm->region, comm->mapped_bytes);
    shm_unlink(comm->region_name.c_str());  // gone already once every rank joined
    delete comm;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
    if (comm == nullptr) { return ncclInvalidArgument; }
    require_settled(comm, "ncclCommDestroy");
    release_communicator(comm);
    return ncclSuccess;
}

// CUDASIM_NCCL_ABORT_HANGS=1 (tests): ncclCommAbort never returns, as a real one can where a
// peer misbehaves (its proxy thread), so a test sees what bounds the exit
ncclResult_t ncclCommAbort(ncclComm_t comm) {
    if (comm == nullptr) { return ncclInvalidArgument; }
    const char* hangs = getenv("CUDASIM_NCCL_ABORT_HANGS");
    while (hangs != nullptr && strcmp(hangs, "1") == 0) { pause(); }
    release_communicator(comm);
    return ncclSuccess;
}

ncclResult_t ncclGroupStart() {
    group_depth++;
    return ncclSuccess;
}

ncclResult_t ncclGroupEnd() {
    if (group_depth == 0) { return record_error(ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart"); }
    if (--group_depth > 0) { return ncclSuccess; }
    check_group_independence();
    std::vector<ncclComm*> comms;  // each once, in order of first use
    for (const GroupedOperation& g : group_operations) {
        if (std::find(comms.begin(), comms.end(), g.comm) == comms.end()) { comms.push_back(g.comm); }
    }
    for (ncclComm* comm : comms) {
        require_settled(comm, "ncclGroupEnd");
        if (comm->state != ncclSuccess) {  // a communicator in error runs nothing more
            group_operations.clear();
            return comm->state;
        }
    }
    // one launch per communicator (a group spanning several would need every rank to list
    // them in the same order; llm8's groups hold one), on its operations' stream
    ncclResult_t result = ncclSuccess;
    for (ncclComm* comm : comms) {
        std::deque<Operation> operations;
        cudaStream_t stream = nullptr;
        for (const GroupedOperation& g : group_operations) {
            if (g.comm != comm) { continue; }
            if (!operations.empty() && g.stream != stream) {
                fail("an NCCL group with operations on different streams (not emulated)");
            }
            stream = g.stream;
            operations.push_back(g.op);
        }
        if (launch_collectives(comm, stream, std::move(operations)) == ncclInProgress) { result = ncclInProgress; }
    }
    group_operations.clear();
    return result;
}

ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream) {
    return issue(Kind::AllReduce, sendbuff, recvbuff, count, datatype, op, 0, comm, stream);
}

ncclResult_t ncclReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                        int root, ncclComm_t comm, cudaStream_t stream) {
    return issue(Kind::Reduce, sendbuff, recvbuff, count, datatype, op, root, comm, stream);
}

ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
                           ncclComm_t comm, cudaStream_t stream) {
    return issue(Kind::Broadcast, sendbuff, recvbuff, count, datatype, ncclSum, root, comm, stream);
}

ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream) {
    return issue(Kind::AllGather, sendbuff, recvbuff, sendcount, datatype, ncclSum, 0, comm, stream);
}

ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount, ncclDataType_t datatype,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
    return issue(Kind::ReduceScatter, sendbuff, recvbuff, recvcount, datatype, op, 0, comm, stream);
}

} // extern "C"
