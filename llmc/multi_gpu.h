/*
multi_gpu.h: one process per GPU, an NCCL communicator between them, and collectives that
never hang (DESIGN.md section 5). Host code for nvcc (it includes nccl.h).

Why it is shaped so:
- The flags are llm.c's (-pn processes, -pr rank, -pg GPUs per node, -pi mpi|fs|tcp, -pf
  directory, -ps server), so llm.c launch scripts carry over. Only rank 0 creates the NCCL
  id; the three ways of getting it to the others cover mpirun (MPI, compiled in only with
  -DUSE_MPI), Slurm without PMIx (a shared directory) and bare machines (one TCP server).
  Each way waits at most the timeout (-pt), then dies naming what it waited for (under
  mpirun the job ends when a rank exits). The tcp way's rank 0 serves each of the run's ranks
  once, so a stray connection cannot take a rank's place.
- The communicator is created NONBLOCKING (ncclConfig_t.blocking = 0): every NCCL call
  returns at once, ncclInProgress included, and multi_gpu_nccl_settle polls
  ncclCommGetAsyncError until the call has settled, up to a deadline. So even the
  communicator's creation is bounded when a peer never shows up.
- A peer that dies in the middle of a collective leaves this rank's NCCL kernel waiting on
  the GPU forever, which no error code reports. multi_gpu_wait is where the host waits for
  a stream that ran collectives: it polls an event and the async error with the deadline
  (-pt, default 300 s), and on an error or the deadline dies with one line naming the rank and
  the collective, then calls ncclCommAbort (which stops the kernels), itself bounded by an
  alarm (multi_gpu_abort_and_die).
- The host can also block where no deadline reaches it: inside a kernel launch once the
  stream's queue is full (about a thousand launches pending: d48's forward and backward queue
  more than that between two waits, all behind a collective that waits for a dead peer), or
  in a copy that synchronizes with the stream. A watchdog thread covers that: while the
  trainer has armed it (a training step, an evaluation), it ends the process once the host has
  made no progress for -pt s (no bounded wait completed, none under way), with one line naming
  the rank and the armed step. It exits without ncclCommAbort, which could wait on the stuck
  stream; the exit frees the GPU, and each peer's own wait or watchdog ends it in turn.
- With one process nothing touches NCCL: no communicator, the float all-reduce returns
  its input, multi_gpu_wait is a stream synchronize, no watchdog.
*/
#ifndef LLMC_MULTI_GPU_H
#define LLMC_MULTI_GPU_H

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <netdb.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <cuda_runtime.h>
#include <nccl.h>
#ifdef USE_MPI
// C only: OpenMPI's C++ bindings (mpicxx.h, which mpi.h includes in C++ where the library was
// built with them, as Debian's is) need libmpi_cxx at link time, and nothing here uses them
#define OMPI_SKIP_MPICXX 1
#include <mpi.h>
#endif
#include "utils.h"
#include "cuda_common.h"

#define MULTI_GPU_DEFAULT_TIMEOUT_S 300
#define MULTI_GPU_DEFAULT_PORT 12345
#define MULTI_GPU_ID_POLL_US 100000  // the id exchange polls its file or server every 0.1 s
#define MULTI_GPU_ID_FILE "llm8_nccl_id.bin"  // -pi fs's file outside a Slurm job (multi_gpu_id_file_path)

typedef enum { MULTI_GPU_INIT_MPI, MULTI_GPU_INIT_FS, MULTI_GPU_INIT_TCP } MultiGpuInitMethod;

// what the command line says (-pn -pr -pg -pi -pf -ps -pt)
typedef struct {
    int num_processes;          // -pn, 1: no NCCL
    int process_rank;           // -pr (fs, tcp); MPI gives its own
    int gpus_per_node;          // -pg, 0: every visible GPU
    MultiGpuInitMethod init_method;  // -pi
    const char* fs_path;        // -pf: directory shared by all ranks
    const char* server;         // -ps: rank 0's address, "ip" or "ip:port"
    int timeout_s;              // -pt: the longest any rank waits for the others
} MultiGpuOptions;

// the watchdog's state (the top comment), shared by the host thread and the watchdog thread
typedef struct {
    pthread_t thread;
    pthread_mutex_t lock;
    int running;
    int armed;
    int waits;                  // bounded waits under way: they keep their own deadline
    double deadline;            // armed and not waiting: the host must make progress by then
    char what[160];             // what is armed, for the error line
    int process_rank, num_processes, timeout_s;
} MultiGpuWatchdog;

typedef struct {
    int process_rank;
    int num_processes;
    int local_device_idx;       // the GPU this process uses
    int timeout_s;
    MultiGpuWatchdog* watchdog; // NULL without a communicator
    ncclComm_t nccl_comm;       // NULL with one process
    cudaStream_t nccl_stream;   // collectives overlapped with compute run here
    float* scalar_device;       // [1], for multi_gpu_all_reduce_float
    int uses_mpi;
} MultiGpuConfig;

static inline MultiGpuOptions multi_gpu_options_default(void) {
    MultiGpuOptions opts;
    opts.num_processes = 1;
    opts.process_rank = 0;
    opts.gpus_per_node = 0;
#ifdef USE_MPI
    opts.init_method = MULTI_GPU_INIT_MPI;
#else
    opts.init_method = MULTI_GPU_INIT_FS;
#endif
    opts.fs_path = NULL;
    opts.server = NULL;
    opts.timeout_s = MULTI_GPU_DEFAULT_TIMEOUT_S;
    return opts;
}

// -pi's value
static inline MultiGpuInitMethod multi_gpu_init_method_from_name(const char* name) {
    if (strcmp(name, "mpi") == 0) { return MULTI_GPU_INIT_MPI; }
    if (strcmp(name, "fs") == 0) { return MULTI_GPU_INIT_FS; }
    if (strcmp(name, "tcp") == 0) { return MULTI_GPU_INIT_TCP; }
    llm8_die("flag -pi: '%s' is not an init method (expected mpi, fs or tcp)", name);
    return MULTI_GPU_INIT_FS;  // unreachable
}

// the name -pi gives a method (for the trainer's startup line, where -pi auto has been resolved)
static inline const char* multi_gpu_init_method_name(MultiGpuInitMethod method) {
    return method == MULTI_GPU_INIT_MPI ? "mpi" : method == MULTI_GPU_INIT_TCP ? "tcp" : "fs";
}

static inline double multi_gpu_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

// ----------------------------------------------------------------------------
// the watchdog thread (the top comment)

#define MULTI_GPU_WATCHDOG_POLL_US 100000

static void* multi_gpu_watchdog_main(void* argument) {
    MultiGpuWatchdog* w = (MultiGpuWatchdog*)argument;
    for (;;) {
        usleep(MULTI_GPU_WATCHDOG_POLL_US);
        pthread_mutex_lock(&w->lock);
        int running = w->running;
        int expired = w->armed && w->waits == 0 && multi_gpu_now_s() > w->deadline;
        char line[320];
        if (expired) {
            snprintf(line, sizeof(line), "error: rank %d of %d: NCCL watchdog: %s made no progress for %d s (a peer died or "
                     "hangs?)\n", w->process_rank, w->num_processes, w->what, w->timeout_s);
        }
        pthread_mutex_unlock(&w->lock);
        if (!running) { return NULL; }
        if (expired) {  // write(2) and _exit: no lock the stuck host thread may hold (stdio's, atexit's, CUDA's)
            ssize_t written = write(STDERR_FILENO, line, strlen(line));
            (void)written;
            _exit(EXIT_FAILURE);
        }
    }
}

static inline void multi_gpu_watchdog_start(MultiGpuConfig* cfg) {
    MultiGpuWatchdog* w = (MultiGpuWatchdog*)calloc(1, sizeof(MultiGpuWatchdog));
    if (w == NULL) { llm8_die("rank %d: out of host memory for the NCCL watchdog", cfg->process_rank); }
    pthread_mutex_init(&w->lock, NULL);
    w->running = 1;
    w->process_rank = cfg->process_rank;
    w->num_processes = cfg->num_processes;
    w->timeout_s = cfg->timeout_s;
    if (pthread_create(&w->thread, NULL, multi_gpu_watchdog_main, w) != 0) {
        llm8_die("rank %d: cannot start the NCCL watchdog thread", cfg->process_rank);
    }
    cfg->watchdog = w;
}

static inline void multi_gpu_watchdog_stop(MultiGpuConfig* cfg) {
    MultiGpuWatchdog* w = cfg->watchdog;
    if (w == NULL) { return; }
    pthread_mutex_lock(&w->lock);
    w->running = 0;
    pthread_mutex_unlock(&w->lock);
    pthread_join(w->thread, NULL);
    pthread_mutex_destroy(&w->lock);
    free(w);
    cfg->watchdog = NULL;
}

// from now on the host must make progress every -pt s; `what` (printf format) names the region
__attribute__((format(printf, 2, 3))) static inline void multi_gpu_watchdog_arm(const MultiGpuConfig* cfg, const char* format, ...) {
    MultiGpuWatchdog* w = cfg->watchdog;
    if (w == NULL) { return; }
    pthread_mutex_lock(&w->lock);
    va_list args;
    va_start(args, format);
    vsnprintf(w->what, sizeof(w->what), format, args);
    va_end(args);
    w->armed = 1;
    w->deadline = multi_gpu_now_s() + w->timeout_s;
    pthread_mutex_unlock(&w->lock);
}

// host-only work that may take long (writing a checkpoint): no deadline
static inline void multi_gpu_watchdog_disarm(const MultiGpuConfig* cfg) {
    MultiGpuWatchdog* w = cfg->watchdog;
    if (w == NULL) { return; }
    pthread_mutex_lock(&w->lock);
    w->armed = 0;
    pthread_mutex_unlock(&w->lock);
}

// a bounded wait begins (begin = 1) or has completed (0): progress, the deadline starts again
static inline void multi_gpu_watchdog_wait(const MultiGpuConfig* cfg, int begin) {
    MultiGpuWatchdog* w = cfg->watchdog;
    if (w == NULL) { return; }
    pthread_mutex_lock(&w->lock);
    w->waits += begin ? 1 : -1;
    w->deadline = multi_gpu_now_s() + w->timeout_s;
    pthread_mutex_unlock(&w->lock);
}

// ----------------------------------------------------------------------------
// failure handling

/*
The death of a failed or overdue collective: one line naming the rank and the collective, then
ncclCommAbort, which stops this rank's NCCL kernels so the exit frees the GPU. The abort itself
can block where a peer misbehaves (NCCL's proxy thread; NVIDIA/nccl issues 863 and 992), and
nothing else bounds it: the wait that called it keeps the watchdog off (a bounded wait, whose own
deadline has passed). So the line goes out first, and SIGALRM ends the process (_exit, nothing
more printed) if the abort and the exit take longer than MULTI_GPU_ABORT_GRACE_S, or -pt when
that is shorter.
*/
#define MULTI_GPU_ABORT_GRACE_S 30

static void multi_gpu_abort_overdue(int signal_number) {
    (void)signal_number;
    _exit(EXIT_FAILURE);
}

__attribute__((noreturn)) static inline void multi_gpu_abort_and_die(const MultiGpuConfig* cfg, const char* what,
                                                                     const char* reason) {
    llm8_print_error("rank %d of %d: NCCL %s: %s", cfg->process_rank, cfg->num_processes, what, reason);
    if (cfg->nccl_comm != NULL) {
        signal(SIGALRM, multi_gpu_abort_overdue);
        alarm(cfg->timeout_s < MULTI_GPU_ABORT_GRACE_S ? (unsigned)cfg->timeout_s : MULTI_GPU_ABORT_GRACE_S);
        ncclCommAbort(cfg->nccl_comm);
    }
    exit(EXIT_FAILURE);
}

/*
The bounded waits' pause between two polls: 5 us at first, doubling up to 100 us. A nonblocking
communicator's call returns ncclInProgress while NCCL's own thread launches it, which takes
microseconds, so a fixed 1 ms pause (until 2026-11-29) held the host about 1 ms per collective
call: 2L + 5 a ZeRO-1 step, and ZeRO-3's gathers before the layer's kernels were queued. A wait
for the GPU sees its event within 100 us, where 1 ms added up to 1 ms to each of the step's waits.
*/
#define MULTI_GPU_POLL_FIRST_US 5
#define MULTI_GPU_POLL_LONGEST_US 100

static inline void multi_gpu_poll_pause(useconds_t* pause_us) {
    usleep(*pause_us);
    *pause_us = *pause_us * 2 < MULTI_GPU_POLL_LONGEST_US ? *pause_us * 2 : MULTI_GPU_POLL_LONGEST_US;
}

// waits until an NCCL call (nonblocking communicator) has settled; dies on error or deadline
static inline void multi_gpu_nccl_settle(const MultiGpuConfig* cfg, ncclResult_t result, const char* what) {
    double deadline = multi_gpu_now_s() + cfg->timeout_s;
    useconds_t pause_us = MULTI_GPU_POLL_FIRST_US;
    if (result == ncclInProgress) { multi_gpu_watchdog_wait(cfg, 1); }
    while (result == ncclInProgress) {
        if (multi_gpu_now_s() > deadline) {
            char reason[128];
            snprintf(reason, sizeof(reason), "did not complete within %d s (still being launched: a peer died or hangs?)", cfg->timeout_s);
            multi_gpu_abort_and_die(cfg, what, reason);
        }
        multi_gpu_poll_pause(&pause_us);
        if (ncclCommGetAsyncError(cfg->nccl_comm, &result) != ncclSuccess) { result = ncclInternalError; }
        if (result != ncclInProgress) { multi_gpu_watchdog_wait(cfg, 0); }
    }
    if (result != ncclSuccess) {
        char reason[512];
        snprintf(reason, sizeof(reason), "%s (%s)", ncclGetErrorString(result), ncclGetLastError(cfg->nccl_comm));
        multi_gpu_abort_and_die(cfg, what, reason);
    }
}

/*
Waits until `done` has completed (the work before it may wait for collectives), polling the
communicator's async error; after timeout_s: ncclCommAbort and one line naming the rank
and `what`. Every host wait of a multi-GPU run goes through it, never an unbounded one.
*/
static inline void multi_gpu_wait_event(const MultiGpuConfig* cfg, cudaEvent_t done, const char* what) {
    if (cfg->nccl_comm == NULL) {
        cudaCheck(cudaEventSynchronize(done));
        return;
    }
    double deadline = multi_gpu_now_s() + cfg->timeout_s;
    useconds_t pause_us = MULTI_GPU_POLL_FIRST_US;
    multi_gpu_watchdog_wait(cfg, 1);
    for (;;) {
        cudaError_t status = cudaEventQuery(done);
        if (status == cudaSuccess) { break; }
        if (status != cudaErrorNotReady) { cudaCheck(status); }
        ncclResult_t async_error = ncclSuccess;
        ncclCommGetAsyncError(cfg->nccl_comm, &async_error);
        if (async_error != ncclSuccess && async_error != ncclInProgress) {
            multi_gpu_abort_and_die(cfg, what, ncclGetErrorString(async_error));
        }
        if (multi_gpu_now_s() > deadline) {
            char reason[128];
            snprintf(reason, sizeof(reason), "did not complete within %d s (a peer died or hangs?)", cfg->timeout_s);
            multi_gpu_abort_and_die(cfg, what, reason);
        }
        multi_gpu_poll_pause(&pause_us);
    }
    multi_gpu_watchdog_wait(cfg, 0);
}

/*
Waits for everything enqueued on `stream` so far (collectives included), bounded as
multi_gpu_wait_event. The trainer calls it where it already waits (reading the loss, the norm).
*/
static inline void multi_gpu_wait(const MultiGpuConfig* cfg, cudaStream_t stream, const char* what) {
    cudaEvent_t done;
    cudaCheck(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    cudaCheck(cudaEventRecord(done, stream));
    multi_gpu_wait_event(cfg, done, what);
    cudaCheck(cudaEventDestroy(done));
}

// values[0..count) reduced (op) over the ranks, in place (on one process they stay); `what` names it in errors
static inline void multi_gpu_all_reduce_floats(const MultiGpuConfig* cfg, float* values, int count, ncclRedOp_t op,
                                               cudaStream_t stream, const char* what) {
    if (cfg->nccl_comm == NULL) { return; }
    float* device = cfg->scalar_device;  // one value: the config's own; more (at startup): a buffer of their own
    if (count > 1) { cudaCheck(cudaMalloc((void**)&device, (size_t)count * sizeof(float))); }
    cudaCheck(cudaMemcpyAsync(device, values, (size_t)count * sizeof(float), cudaMemcpyHostToDevice, stream));
    multi_gpu_nccl_settle(cfg, ncclAllReduce(device, device, (size_t)count, ncclFloat, op, cfg->nccl_comm, stream), what);
    // the watchdog's wait first: a copy into pageable memory returns only once it completed,
    // so queued before the wait it would block on a dead or hung peer with no deadline
    multi_gpu_wait(cfg, stream, what);
    cudaCheck(cudaMemcpyAsync(values, device, (size_t)count * sizeof(float), cudaMemcpyDeviceToHost, stream));
    if (count > 1) { cudaCheck(cudaFree(device)); }
}

// one float (the loss, a norm) all-reduced across the ranks
static inline float multi_gpu_all_reduce_float(const MultiGpuConfig* cfg, float value, ncclRedOp_t op,
                                               cudaStream_t stream, const char* what) {
    multi_gpu_all_reduce_floats(cfg, &value, 1, op, stream, what);
    return value;
}

// ----------------------------------------------------------------------------
// getting rank 0's ncclUniqueId to every rank

/*
-pi fs: the file in -pf through which rank 0 hands out the NCCL id. Within a Slurm job its name
holds the job id, llm8_nccl_id.job<SLURM_JOB_ID>.bin: every rank of a job sees the same one
(srun's tasks, and ranks a launcher starts inside the allocation, inherit it), so jobs that
share a -pf never read or remove each other's id, nor one an earlier job left. Elsewhere, and
for a SLURM_JOB_ID that is not a number, it is llm8_nccl_id.bin.
*/
static inline void multi_gpu_id_file_path(const MultiGpuOptions* opts, char* path, size_t size) {
    const char* job = getenv("SLURM_JOB_ID");
    size_t digits = job != NULL ? strspn(job, "0123456789") : 0;
    char name[64];
    if (digits > 0 && digits <= 20 && job[digits] == '\0') {
        snprintf(name, sizeof(name), "llm8_nccl_id.job%s.bin", job);
    } else {
        snprintf(name, sizeof(name), "%s", MULTI_GPU_ID_FILE);
    }
    path_in_dir(path, size, opts->fs_path, name);
}

static inline void multi_gpu_id_file_remove(const MultiGpuOptions* opts) {
    char path[4096];
    multi_gpu_id_file_path(opts, path, sizeof(path));
    remove(path);
}

/*
-pi fs's file: a magic and rank 0's -pn before the id, so that a rank tells its own run's id
from one another run left or is writing in the same -pf (a run of another size, or an older
llm8's bare id). A file that is not this run's is not used: the rank goes on polling, as its
own rank 0 may yet replace it, and its timeout message says what it found instead. Two runs
of the same size sharing -pf outside Slurm (inside, the file's name holds the job id) still
cannot be told apart: give each launch its own directory.
*/
#define MULTI_GPU_ID_FILE_MAGIC 0x4649384cu  // "L8IF"

typedef struct {
    uint32_t magic;
    int32_t num_processes;   // rank 0's -pn
    ncclUniqueId id;
} MultiGpuIdFile;

// reads the id file: 1 when it holds the id of a run of num_processes ranks; else 0, with what
// is there instead in `found` (empty when there is no file yet)
static inline int multi_gpu_id_file_read(const char* path, int num_processes, ncclUniqueId* id, char* found,
                                         size_t found_size) {
    found[0] = '\0';
    FILE* fp = fopen(path, "rb");
    if (fp == NULL) { return 0; }
    unsigned char bytes[sizeof(MultiGpuIdFile) + 1];  // one more, to tell a longer file
    size_t size = fread(bytes, 1, sizeof(bytes), fp);
    fclose(fp);
    MultiGpuIdFile file;
    memcpy(&file, bytes, sizeof(file));
    if (size != sizeof(file) || file.magic != MULTI_GPU_ID_FILE_MAGIC) {
        snprintf(found, found_size, size == sizeof(file.id) ? "the file there is a bare id, as llm8 wrote before "
                 "its ids had a header: remove it" : "the file there is not an llm8 id file: remove it");
        return 0;
    }
    if (file.num_processes != num_processes) {
        snprintf(found, found_size, "the id there is for a run of %d ranks, not of this rank's -pn %d: another run "
                 "sharing -pf, or one that failed before its ranks joined?", (int)file.num_processes, num_processes);
        return 0;
    }
    *id = file.id;
    return 1;
}

// fs: rank 0 writes the id atomically (a temporary file renamed); the others poll for it
static inline void multi_gpu_id_exchange_fs(ncclUniqueId* id, const MultiGpuOptions* opts) {
    if (opts->fs_path == NULL) {
        llm8_die("flag -pi fs (what -pi auto takes without mpirun) needs -pf <directory shared by all ranks>, or give "
                 "-pi tcp -ps <rank 0's IPv4 address>");
    }
    struct stat dir_stat;  // checked by every rank: a missing one is not -pt of polling
    const int dir_exists = stat(opts->fs_path, &dir_stat) == 0;
    if (!dir_exists || !S_ISDIR(dir_stat.st_mode)) {
        llm8_die("rank %d: flag -pf %s: %s (expected a directory shared by all ranks)", opts->process_rank, opts->fs_path,
                 dir_exists ? "not a directory" : strerror(errno));
    }
    char path[4096], temp_path[4200];
    multi_gpu_id_file_path(opts, path, sizeof(path));
    if (opts->process_rank == 0) {
        MultiGpuIdFile file = {MULTI_GPU_ID_FILE_MAGIC, opts->num_processes, *id};
        snprintf(temp_path, sizeof(temp_path), "%s.tmp.%d", path, (int)getpid());
        FILE* fp = fopenCheck(temp_path, "wb");
        fwriteCheck(&file, sizeof(file), 1, fp);
        fcloseCheck(fp);
        if (rename(temp_path, path) != 0) {
            llm8_die("-pf %s: cannot rename %s to %s: %s", opts->fs_path, temp_path, path, strerror(errno));
        }
        return;
    }
    double deadline = multi_gpu_now_s() + opts->timeout_s;
    char found[256];
    while (!multi_gpu_id_file_read(path, opts->num_processes, id, found, sizeof(found))) {
        if (multi_gpu_now_s() > deadline) {
            llm8_die("rank %d: no NCCL id from rank 0 in '%s' after %d s (%s)", opts->process_rank, path,
                     opts->timeout_s, found[0] != '\0' ? found : "is -pf shared by all ranks, is rank 0 up?");
        }
        usleep(MULTI_GPU_ID_POLL_US);
    }
}

// splits "ip" or "ip:port" into an IPv4 socket address
static inline struct sockaddr_in multi_gpu_parse_server(const char* server) {
    if (server == NULL) { llm8_die("flag -pi tcp needs -ps <rank 0's IPv4 address>[:port]"); }
    char host[256];
    int port = MULTI_GPU_DEFAULT_PORT;
    snprintf(host, sizeof(host), "%s", server);
    char* colon = strchr(host, ':');
    if (colon != NULL) {
        *colon = '\0';
        port = (int)parse_long_flag("-ps (port)", colon + 1, 1, 65535);
    }
    struct sockaddr_in addr;
    memset(&addr, 0, sizeof(addr));
    addr.sin_family = AF_INET;
    addr.sin_port = htons((uint16_t)port);
    if (inet_pton(AF_INET, host, &addr.sin_addr) != 1) {
        llm8_die("flag -ps: '%s' is not an IPv4 address (expected a.b.c.d or a.b.c.d:port)", server);
    }
    return addr;
}

// waits until fd is readable (events POLLIN) or writable (POLLOUT); 0 at the deadline. poll
// takes int milliseconds, which -pt (up to 2^31 - 1 s) overflows: it waits an hour at most a call
static inline int multi_gpu_poll_fd(int fd, short events, double deadline) {
    for (;;) {
        double remaining_s = deadline - multi_gpu_now_s();
        if (remaining_s <= 0.0) { return 0; }
        int remaining_ms = remaining_s < 3600.0 ? (int)(remaining_s * 1000.0) + 1 : 3600 * 1000;
        struct pollfd p;
        p.fd = fd;
        p.events = events;
        p.revents = 0;
        int ready = poll(&p, 1, remaining_ms);
        if (ready > 0) { return 1; }
        if (ready < 0 && errno != EINTR) { return 0; }
    }
}

/*
connect() bounded by the deadline: a blocking connect to a host that drops the SYNs (a firewall,
an address not up yet, rank 0's accept queue full) waits out the kernel's SYN retries, about
two minutes, whatever -pt says. So the socket connects non-blocking and poll waits for the
outcome. 1: connected (the socket blocking again, as the reads after expect); 0: not (yet).
*/
static inline int multi_gpu_connect_by(int fd, const struct sockaddr_in* addr, double deadline) {
    int flags = fcntl(fd, F_GETFL, 0);
    if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) != 0) { return 0; }
    int connected = connect(fd, (const struct sockaddr*)addr, sizeof(*addr)) == 0;
    if (!connected && errno == EINPROGRESS && multi_gpu_poll_fd(fd, POLLOUT, deadline)) {
        int error = 0;
        socklen_t length = sizeof(error);
        connected = getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &length) == 0 && error == 0;
    }
    return connected && fcntl(fd, F_SETFL, flags) == 0;
}

/*
-pi tcp's protocol. A rank connects to rank 0 and says who it is (MultiGpuHello); rank 0
answers with its verdict and, when it is yes, the id (MultiGpuIdReply). Rank 0 serves each
rank 1..N-1 once, and only for a run of its own size: a process that is not one of them (an
earlier launch's rank still retrying, another job given the same port with another -pn, a
port scanner) no longer takes a place that one of this run's ranks then lacks. A refused
llm8 rank stops at once with rank 0's reason; rank 0 notes each refusal and goes on serving.
A second rank r is refused, so when an earlier launch's rank r got there first, this launch's
rank r stops with a line saying so, or, when that was the last place, finds no server and
stops at -pt. All fields little-endian, as on every machine this runs.
*/
#define MULTI_GPU_TCP_MAGIC 0x4449384cu  // "L8ID"
#define MULTI_GPU_TCP_HELLO_S 5.0        // how long rank 0 waits for a connection to say who it is

typedef struct {
    uint32_t magic;
    int32_t rank;
    int32_t num_processes;
} MultiGpuHello;

typedef enum {
    MULTI_GPU_TCP_ACCEPTED = 0,
    MULTI_GPU_TCP_OTHER_SIZE = 1,   // the rank's -pn is not rank 0's
    MULTI_GPU_TCP_BAD_RANK = 2,     // not in 1 .. -pn - 1
    MULTI_GPU_TCP_RANK_TAKEN = 3,   // that rank has already been served
} MultiGpuTcpVerdict;

typedef struct {
    uint32_t magic;
    int32_t verdict;                // MultiGpuTcpVerdict
    int32_t num_processes;          // rank 0's -pn, for the refusal's message
    ncclUniqueId id;                // meaningful when accepted
} MultiGpuIdReply;

// reads size bytes by the deadline; 1 when all came
static inline int multi_gpu_recv_all(int fd, void* buffer, size_t size, double deadline) {
    size_t got = 0;
    while (got < size && multi_gpu_poll_fd(fd, POLLIN, deadline)) {
        ssize_t n = recv(fd, (char*)buffer + got, size - got, 0);
        if (n <= 0) { return 0; }
        got += (size_t)n;
    }
    return got == size;
}

static inline const char* multi_gpu_tcp_verdict_text(int verdict) {
    switch (verdict) {
        case MULTI_GPU_TCP_OTHER_SIZE: return "its -pn differs from rank 0's";
        case MULTI_GPU_TCP_BAD_RANK: return "its rank is not one of 1 .. -pn - 1";
        case MULTI_GPU_TCP_RANK_TAKEN: return "that rank has already joined (an earlier launch's rank still running, "
                                              "or two ranks given the same -pr?)";
        default: return "an unknown reason";
    }
}

/*
Rank 0 hears one connection out: reads its hello (MULTI_GPU_TCP_HELLO_S at most), judges it
and answers. Returns the rank it served, or 0 when it served none (refused, silent, gone).
*/
static inline int multi_gpu_tcp_serve_one(int client_fd, const char* peer, const ncclUniqueId* id,
                                          const MultiGpuOptions* opts, unsigned char* joined) {
    MultiGpuHello hello;
    double hello_deadline = multi_gpu_now_s() + MULTI_GPU_TCP_HELLO_S;
    if (!multi_gpu_recv_all(client_fd, &hello, sizeof(hello), hello_deadline) || hello.magic != MULTI_GPU_TCP_MAGIC) {
        fprintf(stderr, "note: rank 0: %s connected to %s but is no llm8 rank; ignored\n", peer, opts->server);
        return 0;
    }
    MultiGpuIdReply reply;
    memset(&reply, 0, sizeof(reply));
    reply.magic = MULTI_GPU_TCP_MAGIC;
    reply.num_processes = opts->num_processes;
    if (hello.num_processes != opts->num_processes) {
        reply.verdict = MULTI_GPU_TCP_OTHER_SIZE;
    } else if (hello.rank < 1 || hello.rank >= opts->num_processes) {
        reply.verdict = MULTI_GPU_TCP_BAD_RANK;
    } else if (joined[hello.rank]) {
        reply.verdict = MULTI_GPU_TCP_RANK_TAKEN;
    } else {
        reply.verdict = MULTI_GPU_TCP_ACCEPTED;
        reply.id = *id;
    }
    int sent = send(client_fd, &reply, sizeof(reply), MSG_NOSIGNAL) == (ssize_t)sizeof(reply);
    if (reply.verdict != MULTI_GPU_TCP_ACCEPTED) {
        fprintf(stderr, "note: rank 0: refused rank %d of %d from %s: %s\n", (int)hello.rank, (int)hello.num_processes,
                peer, multi_gpu_tcp_verdict_text(reply.verdict));
        return 0;
    }
    if (!sent) { return 0; }  // the rank went away before its answer; it connects again if it is still there
    joined[hello.rank] = 1;
    return hello.rank;
}

// tcp: rank 0 serves the id to the other num_processes - 1 ranks; they connect, say who they are and read it
static inline void multi_gpu_id_exchange_tcp(ncclUniqueId* id, const MultiGpuOptions* opts) {
    struct sockaddr_in addr = multi_gpu_parse_server(opts->server);
    double deadline = multi_gpu_now_s() + opts->timeout_s;
    if (opts->process_rank == 0) {
        int server_fd = socket(AF_INET, SOCK_STREAM, 0);
        int one = 1;
        setsockopt(server_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
        if (server_fd < 0 || bind(server_fd, (struct sockaddr*)&addr, sizeof(addr)) != 0 ||
            listen(server_fd, opts->num_processes) != 0) {
            llm8_die("-ps %s: rank 0 cannot listen there: %s", opts->server, strerror(errno));
        }
        unsigned char* joined = (unsigned char*)mallocCheck((size_t)opts->num_processes);
        memset(joined, 0, (size_t)opts->num_processes);
        for (int served = 1; served < opts->num_processes;) {
            if (!multi_gpu_poll_fd(server_fd, POLLIN, deadline)) {
                llm8_die("rank 0: only %d of %d ranks connected to %s within %d s", served, opts->num_processes,
                         opts->server, opts->timeout_s);
            }
            struct sockaddr_in peer_addr;
            socklen_t peer_length = sizeof(peer_addr);
            int client_fd = accept(server_fd, (struct sockaddr*)&peer_addr, &peer_length);
            if (client_fd < 0) { continue; }  // the connection went away while queued
            char peer_ip[INET_ADDRSTRLEN] = "?", peer[INET_ADDRSTRLEN + 8];
            inet_ntop(AF_INET, &peer_addr.sin_addr, peer_ip, sizeof(peer_ip));
            snprintf(peer, sizeof(peer), "%s:%d", peer_ip, (int)ntohs(peer_addr.sin_port));
            served += multi_gpu_tcp_serve_one(client_fd, peer, id, opts, joined) > 0;
            close(client_fd);
        }
        free(joined);
        close(server_fd);
        return;
    }
    MultiGpuHello hello = {MULTI_GPU_TCP_MAGIC, opts->process_rank, opts->num_processes};
    for (;;) {
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        if (fd >= 0 && multi_gpu_connect_by(fd, &addr, deadline)) {
            MultiGpuIdReply reply;
            int answered = send(fd, &hello, sizeof(hello), MSG_NOSIGNAL) == (ssize_t)sizeof(hello) &&
                           multi_gpu_recv_all(fd, &reply, sizeof(reply), deadline) && reply.magic == MULTI_GPU_TCP_MAGIC;
            close(fd);
            if (answered && reply.verdict == MULTI_GPU_TCP_ACCEPTED) {
                *id = reply.id;
                return;
            }
            if (answered) {
                llm8_die("rank %d of %d: rank 0 at %s (a run of %d ranks) refused it: %s", opts->process_rank,
                         opts->num_processes, opts->server, (int)reply.num_processes,
                         multi_gpu_tcp_verdict_text(reply.verdict));
            }
        } else if (fd >= 0) {
            close(fd);
        }
        if (multi_gpu_now_s() > deadline) {
            llm8_die("rank %d: no NCCL id from rank 0 at %s after %d s (is rank 0 up, is the port open? it stops "
                     "listening once it has served every rank)", opts->process_rank, opts->server, opts->timeout_s);
        }
        usleep(MULTI_GPU_ID_POLL_US);
    }
}

#ifdef USE_MPI
/*
mpi: the id goes by a broadcast, bounded like the other ways. MPI_Bcast waits as long as rank
0 takes to reach it, and rank 0 checks its data and model first: one stuck there (a hung
filesystem) would hold every other rank past -pt. So the broadcast is MPI_Ibcast, and each
rank tests it until the deadline; one that gives up exits, and mpirun then ends the job.
*/
static inline void multi_gpu_id_exchange_mpi(ncclUniqueId* id, const MultiGpuOptions* opts) {
    MPI_Request request;
    MPI_Ibcast(id, sizeof(*id), MPI_BYTE, 0, MPI_COMM_WORLD, &request);
    double deadline = multi_gpu_now_s() + opts->timeout_s;
    useconds_t pause_us = MULTI_GPU_POLL_FIRST_US;
    for (;;) {
        int done = 0;
        MPI_Test(&request, &done, MPI_STATUS_IGNORE);
        if (done) { return; }
        if (multi_gpu_now_s() > deadline) {
            if (opts->process_rank == 0) {  // the root's part may wait for the others
                llm8_die("rank 0: MPI's broadcast of the NCCL id not done after %d s (is a rank stuck reading its data "
                         "or model?)", opts->timeout_s);
            }
            llm8_die("rank %d: no NCCL id from rank 0 by MPI's broadcast after %d s (is rank 0 stuck reading its data "
                     "or model?)", opts->process_rank, opts->timeout_s);
        }
        multi_gpu_poll_pause(&pause_us);
    }
}
#endif

// ----------------------------------------------------------------------------
// setup and teardown

static inline void multi_gpu_options_check(const MultiGpuOptions* opts) {
    if (opts->num_processes < 1) { llm8_die("flag -pn: %d processes (expected >= 1)", opts->num_processes); }
    if (opts->process_rank < 0 || opts->process_rank >= opts->num_processes) {
        llm8_die("flag -pr: rank %d (expected 0..%d for -pn %d)", opts->process_rank, opts->num_processes - 1,
                 opts->num_processes);
    }
    if (opts->gpus_per_node < 0) { llm8_die("flag -pg: %d GPUs per node (expected >= 1, or 0 for all)", opts->gpus_per_node); }
    if (opts->timeout_s < 1) { llm8_die("flag -pt: %d s (expected >= 1)", opts->timeout_s); }
#ifndef USE_MPI
    if (opts->init_method == MULTI_GPU_INIT_MPI && opts->num_processes > 1) {
        llm8_die("flag -pi mpi: this binary was built without MPI (the Makefile found no OpenMPI); use -pi fs or -pi tcp");
    }
#endif
}

/*
The task's node-local id under srun (SLURM_LOCALID), which makes its GPU index as MPI's
node-local rank does under mpirun: rank % -pg holds only for srun's default block
distribution (-m cyclic puts ranks 0, 8, 16, ... on one node), the local id for any, and with
-pg 0 also for a task bound to a GPU of its own (--gpus-per-task=1: it sees one). Only in an srun
step (SLURM_STEP_NUM_TASKS) whose SLURM_PROCID is this process's rank: a process that a task
started itself (launch_one_node.sh inside an allocation) inherits its starter's variables and
does not take them. Else -1.
*/
static inline int multi_gpu_srun_local_id(int process_rank) {
    const char* step = getenv("SLURM_STEP_NUM_TASKS");
    const char* task = getenv("SLURM_PROCID");
    const char* local = getenv("SLURM_LOCALID");
    if (step == NULL || task == NULL || local == NULL) { return -1; }
    char* end;
    long task_rank = strtol(task, &end, 10);
    if (end == task || *end != '\0' || task_rank != process_rank) { return -1; }
    long local_id = strtol(local, &end, 10);
    if (end == local || *end != '\0' || local_id < 0 || local_id > INT_MAX) { return -1; }
    return (int)local_id;
}

/*
A launcher that started N copies of the program while each copy sees a world of 1 (no rank
flags, an MPI other than the one built in, or none built in) would have N processes each train
the whole model alone, on GPU 0, into the same -o. The variable each launcher sets in every copy
gives it away: OpenMPI's mpirun OMPI_COMM_WORLD_SIZE, MPICH's and Intel MPI's mpiexec (and
srun --mpi=pmi2) PMI_SIZE, srun SLURM_STEP_NUM_TASKS (a batch script's own shell is no srun step).
*/
static inline void multi_gpu_check_launcher_world(const MultiGpuOptions* opts) {
    if (opts->num_processes != 1) { return; }
    static const struct { const char* variable; const char* launcher; } worlds[] = {
        {"OMPI_COMM_WORLD_SIZE", "mpirun"}, {"PMI_SIZE", "an MPI launcher"}, {"SLURM_STEP_NUM_TASKS", "srun"}};
    for (size_t i = 0; i < sizeof(worlds) / sizeof(worlds[0]); i++) {
        const char* value = getenv(worlds[i].variable);
        if (value == NULL || atoi(value) <= 1) { continue; }
#ifdef USE_MPI
        int openmpi = i == 0;  // the MPI this build links: under its mpirun only -pi (or -pn) can have kept MPI out
        const char* remedy = openmpi ? "leave -pi at auto (MPI under mpirun), or give every rank -pn N -pr R with -pi fs|tcp"
            : "launch with this build's OpenMPI (mpirun, or srun --mpi=pmix), or give every rank -pn N -pr R with -pi fs|tcp "
              "(scripts/slurm_gpt2.sbatch does)";
#else
        const char* remedy = "this binary was built without MPI (the Makefile found no OpenMPI mpi.h under OPENMPI_DIR; "
            "rebuild with OPENMPI_DIR=<OpenMPI prefix>), so give every rank -pn N -pr R with -pi fs|tcp "
            "(scripts/launch_one_node.sh -m fs and scripts/slurm_gpt2.sbatch do)";
#endif
        llm8_die("started by %s as %s processes (%s), but this one is rank 0 of 1: each would train alone, on GPU 0, "
                 "into the same files; %s", worlds[i].launcher, value, worlds[i].variable, remedy);
    }
}

/*
Step 1, no GPU touched: the rank and the process count. With -pi mpi they come from MPI
(MPI_Init here), otherwise from -pr and -pn. The trainer checks its data between the two
steps, knowing its rank, so bad input still fails before any CUDA call.
*/
static inline MultiGpuConfig multi_gpu_process_init(MultiGpuOptions* opts) {
    MultiGpuConfig cfg;
    memset(&cfg, 0, sizeof(cfg));
    cfg.local_device_idx = -1;
#ifdef USE_MPI
    if (opts->init_method == MULTI_GPU_INIT_MPI) {
        if (MPI_Init(NULL, NULL) != MPI_SUCCESS) { llm8_die("-pi mpi: MPI_Init failed (launched by mpirun?)"); }
        int requested = opts->num_processes;  // -pn, 1 unless given
        MPI_Comm_rank(MPI_COMM_WORLD, &opts->process_rank);
        MPI_Comm_size(MPI_COMM_WORLD, &opts->num_processes);
        if (requested > 1 && requested != opts->num_processes) {  // e.g. started by hand, each its own world of 1
            llm8_die("flag -pn %d: MPI has %d process%s (-pi mpi takes the count from mpirun -np; without mpirun use -pi fs "
                     "or -pi tcp)", requested, opts->num_processes, opts->num_processes == 1 ? "" : "es");
        }
        MPI_Comm node_comm;
        MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, opts->process_rank, MPI_INFO_NULL, &node_comm);
        MPI_Comm_rank(node_comm, &cfg.local_device_idx);  // the node-local rank, made a GPU index in step 2
        MPI_Comm_free(&node_comm);
        cfg.uses_mpi = 1;
    }
#endif
    multi_gpu_options_check(opts);
    multi_gpu_check_launcher_world(opts);
    if (cfg.local_device_idx < 0) { cfg.local_device_idx = multi_gpu_srun_local_id(opts->process_rank); }
    if (opts->init_method == MULTI_GPU_INIT_FS && opts->num_processes > 1 && opts->process_rank == 0 &&
        opts->fs_path != NULL) {
        // an id left in -pf by an earlier run that failed before its ranks joined (rank 0 removes
        // it only once they have) would be read by this run's other ranks if it were still there
        // when they look, and they would wait out -pt on a communicator that never forms: rank 0
        // removes it at its start, before the others (which poll only after their CUDA setup) look
        multi_gpu_id_file_remove(opts);
    }
    cfg.process_rank = opts->process_rank;
    cfg.num_processes = opts->num_processes;
    cfg.timeout_s = opts->timeout_s;
    return cfg;
}

/*
The GPU a process takes: its node-local id (local_id: MPI's shared-memory rank under mpirun,
SLURM_LOCALID under srun; -1 when there is none, and then its rank stands in) modulo the GPUs
per node (-pg; 0: all it sees), which must be one it sees. Host-only: the tests check it.
*/
static inline int multi_gpu_device_index(int local_id, int process_rank, int gpus_per_node_flag, int device_count) {
    int gpus_per_node = gpus_per_node_flag > 0 ? gpus_per_node_flag : device_count;
    int device = (local_id >= 0 ? local_id : process_rank) % gpus_per_node;
    if (device >= device_count) {
        llm8_die("rank %d: GPU %d of this node wanted (-pg %d) but only %d are visible%s", process_rank, device,
                 gpus_per_node, device_count, gpus_per_node_flag > 0 ? " (-pg 0 takes the GPUs this rank sees)" : "");
    }
    return device;
}

/*
Step 2: the GPU (multi_gpu_device_index) and the communicator. One process: no NCCL.
`force_communicator` makes a one-rank communicator anyway (the tests use it).
*/
static inline void multi_gpu_device_init(MultiGpuConfig* cfg, const MultiGpuOptions* opts, int force_communicator) {
    cfg->local_device_idx = multi_gpu_device_index(cfg->local_device_idx, cfg->process_rank, opts->gpus_per_node,
                                                   cuda_device_count_or_die());
    cudaCheck(cudaSetDevice(cfg->local_device_idx));
    cudaCheck(cudaStreamCreateWithFlags(&cfg->nccl_stream, cudaStreamNonBlocking));
    if (cfg->num_processes == 1 && !force_communicator) { return; }

    ncclUniqueId id;
    memset(&id, 0, sizeof(id));
    if (cfg->process_rank == 0) {
        MultiGpuConfig no_comm = *cfg;
        multi_gpu_nccl_settle(&no_comm, ncclGetUniqueId(&id), "ncclGetUniqueId");
    }
    MultiGpuOptions exchange = *opts;  // with MPI the rank and count came from MPI, not the flags
    exchange.process_rank = cfg->process_rank;
    exchange.num_processes = cfg->num_processes;
    if (opts->init_method == MULTI_GPU_INIT_FS) {
        multi_gpu_id_exchange_fs(&id, &exchange);
    } else if (opts->init_method == MULTI_GPU_INIT_TCP) {
        multi_gpu_id_exchange_tcp(&id, &exchange);
    } else {
#ifdef USE_MPI
        multi_gpu_id_exchange_mpi(&id, &exchange);
#endif
    }
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclResult_t result = ncclCommInitRankConfig(&cfg->nccl_comm, cfg->num_processes, id, cfg->process_rank, &config);
    multi_gpu_nccl_settle(cfg, result, opts->init_method == MULTI_GPU_INIT_FS
        ? "communicator creation (ncclCommInitRankConfig; if rank 0 started after the others, they may have read an "
          "earlier run's NCCL id file in -pf, llm8_nccl_id*.bin: remove it and start again)"
        : "communicator creation (ncclCommInitRankConfig)");
    if (opts->init_method == MULTI_GPU_INIT_FS && cfg->process_rank == 0) {
        // every rank has joined, so none still needs the file; a stale one would mislead the next run
        multi_gpu_id_file_remove(opts);
    }
    cudaCheck(cudaMalloc((void**)&cfg->scalar_device, sizeof(float)));
    multi_gpu_watchdog_start(cfg);
}

static inline void multi_gpu_config_free(MultiGpuConfig* cfg) {
    multi_gpu_watchdog_stop(cfg);
    if (cfg->nccl_comm != NULL) {
        multi_gpu_nccl_settle(cfg, ncclCommFinalize(cfg->nccl_comm), "ncclCommFinalize");
        ncclCommDestroy(cfg->nccl_comm);
        cudaCheck(cudaFree(cfg->scalar_device));
    }
    cudaCheck(cudaStreamDestroy(cfg->nccl_stream));
#ifdef USE_MPI
    if (cfg->uses_mpi) { MPI_Finalize(); }
#endif
    memset(cfg, 0, sizeof(*cfg));
}

#endif // LLMC_MULTI_GPU_H
