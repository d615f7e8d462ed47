/*
replica_check.cuh: do all ranks hold the same bytes where they must? (-pc N, multi-GPU)

Why: with ZeRO, each rank updates only its shard and the weight gather (zero_comm.cuh) puts
the others' shards back, so every rank's forward reads weights it got over the wire. A gather
that delivers stale or wrong bytes (issued before the update wrote them, a stage skipped, a
lost delivery, a bad link) leaves the ranks training slightly different models. Nothing
crashes: the losses stay plausible and the all-reduced gradients average the divergence
away, so the trainer's output cannot show it. This check can: every N steps each rank
fingerprints every region that must be identical on all ranks (zero_comm_replicated_regions
lists them), the fingerprints are all-gathered, and any difference names the region and the
ranks.

How:
- A region's fingerprint is the sum, modulo 2^64, of one term per byte: splitmix64's
  finalizer (a bijection) of (position, byte). Changing any one byte always changes the sum;
  any other difference is missed with probability about 2^-64. A sum is order free, so the
  GPU's atomics give the same bits every run and replica_fingerprint_host (the tests' and
  the CPU's reference) gives the same value as the kernel.
- One kernel launch per region (about 1,150 at d48 under ZeRO-1 FP8), then one ncclAllGather
  of 8 bytes per region per rank and one bounded host wait (multi_gpu_wait): one read of the
  replicated weights every N steps (not yet timed on a GPU), nothing in the steps between.
- The comparison is against rank 0, and it returns what it found (replica_check_compare)
  rather than dying, so the tests can read it; the trainer dies with one line naming the step,
  the region and the ranks. Every rank sees the same gathered fingerprints, so every rank
  reaches the same verdict and exits with no peer left waiting.
*/
#ifndef LLMC_REPLICA_CHECK_CUH
#define LLMC_REPLICA_CHECK_CUH

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <cuda_runtime.h>
#include <nccl.h>
#include "utils.h"
#include "cuda_common.h"
#include "multi_gpu.h"

#define REPLICA_NAME_MAX 64
#define REPLICA_THREADS 256

// one byte's term of a fingerprint: splitmix64's finalizer of its position and value
__host__ __device__ inline uint64_t replica_byte_term(uint64_t position, uint8_t byte) {
    uint64_t z = ((position << 8) | byte) + 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

// the fingerprint of `bytes` bytes, on the host
static inline uint64_t replica_fingerprint_host(const void* data, size_t bytes) {
    const uint8_t* p = (const uint8_t*)data;
    uint64_t sum = 0;
    for (size_t i = 0; i < bytes; i++) { sum += replica_byte_term(i, p[i]); }
    return sum;
}

// adds the fingerprint of data[0, bytes) to *fingerprint (zeroed before)
__global__ void replica_fingerprint_kernel(const uint8_t* data, size_t bytes, unsigned long long* fingerprint) {
    unsigned long long sum = 0;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < bytes; i += (size_t)gridDim.x * blockDim.x) {
        sum += replica_byte_term(i, data[i]);
    }
    for (int offset = 16; offset > 0; offset /= 2) { sum += __shfl_xor_sync(0xffffffffu, sum, offset); }
    __shared__ unsigned long long warp_sums[REPLICA_THREADS / 32];
    int warp = threadIdx.x / 32;
    if (threadIdx.x % 32 == 0) { warp_sums[warp] = sum; }
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned long long block_sum = 0;
        for (int w = 0; w < (int)(blockDim.x / 32); w++) { block_sum += warp_sums[w]; }
        atomicAdd(fingerprint, block_sum);
    }
}

typedef struct {
    const void* data;  // device memory
    size_t bytes;
    char name[REPLICA_NAME_MAX];
} ReplicaRegion;

typedef struct {
    ReplicaRegion* regions;
    int count, capacity;
    size_t total_bytes;
    int num_ranks;
    unsigned long long* fingerprints;  // device [count]: this rank's
    unsigned long long* gathered;      // device [num_ranks][count]
    unsigned long long* gathered_host; // [num_ranks][count]
} ReplicaCheck;

// what replica_check_compare found: region -1 when every rank matched rank 0 everywhere
typedef struct {
    int region;            // the first region some rank differs in
    int rank;              // the first rank that differs from rank 0 there
    int regions_differing; // regions where some rank differs from rank 0
    int ranks_differing;   // ranks that differ from rank 0 in at least one region
} ReplicaMismatch;

static inline void replica_check_init(ReplicaCheck* check) { memset(check, 0, sizeof(*check)); }

// "layer l " for a region of layer l (>= 0), "" for one outside the layers: what region names start with
static inline void replica_layer_prefix(char* out, size_t size, int layer) {
    if (layer >= 0) { snprintf(out, size, "layer %d ", layer); } else if (size > 0) { out[0] = '\0'; }
}

// a region that must be bitwise identical on every rank; the name is printf-formatted
__attribute__((format(printf, 4, 5))) static inline void replica_check_add(ReplicaCheck* check, const void* data, size_t bytes, const char* format, ...) {
    if (bytes == 0) { return; }
    if (check->count == check->capacity) {
        check->capacity = check->capacity > 0 ? 2 * check->capacity : 64;
        check->regions = (ReplicaRegion*)realloc(check->regions, (size_t)check->capacity * sizeof(ReplicaRegion));
        if (check->regions == NULL) { llm8_die("replica check: out of host memory for %d regions", check->capacity); }
    }
    ReplicaRegion* region = &check->regions[check->count++];
    region->data = data;
    region->bytes = bytes;
    va_list args;
    va_start(args, format);
    vsnprintf(region->name, sizeof(region->name), format, args);
    va_end(args);
    check->total_bytes += bytes;
}

// after the last replica_check_add: the buffers for `num_ranks` ranks' fingerprints
static inline void replica_check_finish(ReplicaCheck* check, int num_ranks) {
    check->num_ranks = num_ranks;
    size_t gathered = (size_t)num_ranks * check->count;
    check->fingerprints = (unsigned long long*)cuda_malloc_checked((check->count > 0 ? check->count : 1) * sizeof(unsigned long long),
                                                                   "the replica check's fingerprints (-pc)");
    check->gathered = (unsigned long long*)cuda_malloc_checked((gathered > 0 ? gathered : 1) * sizeof(unsigned long long),
                                                               "every rank's replica fingerprints (-pc)");
    check->gathered_host = (unsigned long long*)mallocCheck((gathered > 0 ? gathered : 1) * sizeof(unsigned long long));
}

static inline void replica_check_free(ReplicaCheck* check) {
    cudaCheck(cudaFree(check->fingerprints));
    cudaCheck(cudaFree(check->gathered));
    free(check->gathered_host);
    free(check->regions);
    replica_check_init(check);
}

// this rank's fingerprint of every region into check->fingerprints, on `stream`
static inline void replica_fingerprints(ReplicaCheck* check, cudaStream_t stream) {
    cudaCheck(cudaMemsetAsync(check->fingerprints, 0, (size_t)check->count * sizeof(unsigned long long), stream));
    for (int r = 0; r < check->count; r++) {
        const ReplicaRegion* region = &check->regions[r];
        size_t blocks = (region->bytes + 16 * REPLICA_THREADS - 1) / (16 * REPLICA_THREADS);
        if (blocks > 1024) { blocks = 1024; }
        replica_fingerprint_kernel<<<(unsigned)blocks, REPLICA_THREADS, 0, stream>>>((const uint8_t*)region->data,
                                                                                  region->bytes, &check->fingerprints[r]);
        cudaCheck(cudaGetLastError());
    }
}

/*
Every rank's fingerprints, compared with rank 0's. Collective (a communicator of
check->num_ranks ranks): every rank calls it at the same point, after `stream` has everything
the regions must hold (the trainer joins the weight gather first). The host waits, bounded by
-pt, for the all-gather.
*/
static inline ReplicaMismatch replica_check_compare(ReplicaCheck* check, const MultiGpuConfig* multi_gpu, cudaStream_t stream) {
    replica_fingerprints(check, stream);
    int n = check->count;
    multi_gpu_nccl_settle(multi_gpu, ncclAllGather(check->fingerprints, check->gathered, (size_t)n, ncclUint64,
                                                   multi_gpu->nccl_comm, stream), "replica check (fingerprint all-gather)");
    multi_gpu_wait(multi_gpu, stream, "replica check (fingerprint all-gather)");
    cudaCheck(cudaMemcpy(check->gathered_host, check->gathered, (size_t)check->num_ranks * n * sizeof(unsigned long long),
                         cudaMemcpyDeviceToHost));
    ReplicaMismatch found = {-1, -1, 0, 0};
    for (int r = 0; r < n; r++) {
        int differs = 0;
        for (int q = 1; q < check->num_ranks; q++) {
            if (check->gathered_host[(size_t)q * n + r] == check->gathered_host[r]) { continue; }
            differs = 1;
            if (found.region < 0) { found.region = r; found.rank = q; }
        }
        found.regions_differing += differs;
    }
    for (int q = 1; q < check->num_ranks; q++) {
        found.ranks_differing += memcmp(&check->gathered_host[(size_t)q * n], check->gathered_host,
                                        (size_t)n * sizeof(unsigned long long)) != 0;
    }
    return found;
}

#endif // LLMC_REPLICA_CHECK_CUH
