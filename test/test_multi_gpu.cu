/*
test_multi_gpu.cu: the NCCL side of llmc/multi_gpu.h and the ZeRO collectives of llmc/zero.h
on one GPU.
- one rank (a one-rank communicator through -pi fs): all-reduce MAX of amaxes, reduce-scatter
  and all-gather of bf16 and of FP8 bytes, the float all-reduce: the API end to end;
- two ranks on the one GPU (two processes forked before any CUDA call, NCCL 2.30+ with
  NCCL_MULTI_RANK_GPU_ENABLE=1): the same collectives with real data from both, the per-layer
  gradient reduction as zero_chunk_pieces plans it, the FP8 weight gather (amax on the GPU,
  MAX all-reduce, cast with the hardware conversion, all-gather) equal to the single-rank
  host cast bit for bit, the replica check (-pc) naming the one region and rank that differ
  (the first of two regions, the last region alone) and counting them, and a dead peer (at a
  collective; under cudasim at the finalize too) or a hung one ending the other rank with one
  error line in bounded time, the id file gone once the ranks joined;
- a rank alone (rank 1 waiting for the id file, rank 0 in the communicator's creation), -pi fs
  without -pf, a -pg past the visible GPUs: one line each, after at most -pt;
- the flags' checks (-pn -pr -pg -pt at the process's start, -ps's address and port), rank 0
  removing a stale id file at its start (the other ranks leave it), and a rank taking the id
  only from a file of its own run's -pn (another run's, an older bare id, junk: named at -pt);
- the watchdog: a host stuck in an armed region ended after -pt with one line, also after a
  completed all-reduce; one that makes progress, then disarms, runs on;
- the replica check's fingerprint kernel equal to its host function at odd sizes and
  offsets, and changed by one flipped byte and by two swapped ones;
- llmc/zero_comm.cuh's pieces that need no second rank: the gradient mean (an fp32 sum / N
  rounded once, and only into the pieces the rank owns) and a rank's part of an FP8 weight at
  the edges of its range.
*/
#include <sys/wait.h>
#include "llmc/multi_gpu.h"
#include "llmc/zero.h"
#include "llmc/replica_check.cuh"
#include "llmc/zero_comm.cuh"
#include "test/test_harness.h"
#include "test/test_harness_fork.h"
#include "test/gpu_test_copies.cuh"

#define TWO_RANK_MIN_NCCL NCCL_VERSION(2, 30, 0)
#define RANK_TIMEOUT_S 60
#define DEAD_PEER_TIMEOUT_S 5
#define NUM_AMAXES 5

// per slice: the amax of the elements of [begin, end) that fall in this rank's shard
__global__ void slice_amax_kernel(const float* shard, size_t shard_begin, size_t shard_size, const ZeroPiece* slices,
                                  unsigned int* amax_bits) {
    ZeroPiece slice = slices[blockIdx.x];
    size_t begin = slice.begin > shard_begin ? slice.begin : shard_begin;
    size_t end = slice.end < shard_begin + shard_size ? slice.end : shard_begin + shard_size;
    unsigned int local = 0;
    for (size_t j = begin + threadIdx.x; j < end; j += blockDim.x) {
        unsigned int bits = fp8_amax_bits(shard[j - shard_begin]);
        local = bits > local ? bits : local;
    }
    atomicMax(&amax_bits[blockIdx.x], local);
}

// casts this rank's part of every slice with the scale from the global amax
__global__ void slice_cast_kernel(const float* shard, size_t shard_begin, size_t shard_size, const ZeroPiece* slices,
                                  const float* global_amax, Fp8Format format, uint8_t* codes) {
    ZeroPiece slice = slices[blockIdx.x];
    float scale = fp8_scale_from_amax(global_amax[blockIdx.x], fp8_max(format), 0);
    size_t begin = slice.begin > shard_begin ? slice.begin : shard_begin;
    size_t end = slice.end < shard_begin + shard_size ? slice.end : shard_begin + shard_size;
    for (size_t j = begin + threadIdx.x; j < end; j += blockDim.x) {
        codes[j - shard_begin] = fp8_quantize(shard[j - shard_begin], scale, format);
    }
}

static uint16_t bf16_of(float x) { return float_to_bf16_bits(x); }

// the value rank r contributes at element j in the sum tests: small integers, exact in bf16 sums
static float contribution(int rank, size_t j) { return (float)((int)(j % 13) - 6 + 3 * rank); }

static void test_basic_collectives(const MultiGpuConfig* mg, const char* who) {
    int n = mg->num_processes, r = mg->process_rank;
    cudaStream_t s = mg->nccl_stream;
    // all-reduce MAX of per-rank amaxes
    float amaxes[NUM_AMAXES], expected[NUM_AMAXES];
    for (int i = 0; i < NUM_AMAXES; i++) {
        amaxes[i] = (float)((i + 1) * (r + 1) % 7) + 0.25f * (float)i;
        expected[i] = 0.0f;
        for (int q = 0; q < n; q++) { expected[i] = fmaxf(expected[i], (float)((i + 1) * (q + 1) % 7) + 0.25f * (float)i); }
    }
    float* d_amax = (float*)device_copy(amaxes, sizeof(amaxes));
    multi_gpu_nccl_settle(mg, ncclAllReduce(d_amax, d_amax, NUM_AMAXES, ncclFloat, ncclMax, mg->nccl_comm, s), "amax all-reduce");
    multi_gpu_wait(mg, s, "amax all-reduce");
    cudaCheck(cudaMemcpy(amaxes, d_amax, sizeof(amaxes), cudaMemcpyDeviceToHost));
    CHECK(memcmp(amaxes, expected, sizeof(amaxes)) == 0, "%s: MAX all-reduce of amaxes wrong (got %g, expected %g)",
          who, amaxes[0], expected[0]);
    // reduce-scatter bf16 (sum) and all-gather bf16 and bytes
    const size_t count = 4096 + 256;
    uint16_t* send = (uint16_t*)mallocCheck(count * n * sizeof(uint16_t));
    for (size_t j = 0; j < count * n; j++) { send[j] = bf16_of(contribution(r, j)); }
    uint16_t* d_send = (uint16_t*)device_copy(send, count * n * sizeof(uint16_t));
    uint16_t* d_recv = NULL;
    cudaCheck(cudaMalloc((void**)&d_recv, count * n * sizeof(uint16_t)));
    multi_gpu_nccl_settle(mg, ncclReduceScatter(d_send, d_recv, count, ncclBfloat16, ncclSum, mg->nccl_comm, s), "bf16 reduce-scatter");
    uint16_t* got = (uint16_t*)mallocCheck(count * n * sizeof(uint16_t));
    multi_gpu_wait(mg, s, "bf16 reduce-scatter");
    cudaCheck(cudaMemcpy(got, d_recv, count * sizeof(uint16_t), cudaMemcpyDeviceToHost));
    size_t wrong = 0;
    for (size_t j = 0; j < count; j++) {
        float sum = 0.0f;
        for (int q = 0; q < n; q++) { sum += contribution(q, (size_t)r * count + j); }
        wrong += got[j] != bf16_of(sum);
    }
    CHECK(wrong == 0, "%s: bf16 reduce-scatter: %zu of %zu elements wrong", who, wrong, count);
    // all-gather, in place: this rank's part sits at rank * count
    cudaCheck(cudaMemcpyAsync(d_recv + (size_t)r * count, d_send, count * sizeof(uint16_t), cudaMemcpyDeviceToDevice, s));
    multi_gpu_nccl_settle(mg, ncclAllGather(d_recv + (size_t)r * count, d_recv, count, ncclBfloat16, mg->nccl_comm, s), "bf16 all-gather");
    multi_gpu_wait(mg, s, "bf16 all-gather");
    cudaCheck(cudaMemcpy(got, d_recv, count * n * sizeof(uint16_t), cudaMemcpyDeviceToHost));
    wrong = 0;
    for (int q = 0; q < n; q++) {
        for (size_t j = 0; j < count; j++) { wrong += got[(size_t)q * count + j] != bf16_of(contribution(q, j)); }
    }
    CHECK(wrong == 0, "%s: bf16 all-gather: %zu elements wrong", who, wrong);
    uint8_t* bytes = (uint8_t*)mallocCheck(count * n);
    for (size_t j = 0; j < count; j++) { bytes[j] = (uint8_t)(j * 31 + (size_t)r * 101); }
    uint8_t* d_bytes = NULL;
    cudaCheck(cudaMalloc((void**)&d_bytes, count * n));
    cudaCheck(cudaMemcpyAsync(d_bytes + (size_t)r * count, bytes, count, cudaMemcpyHostToDevice, s));
    multi_gpu_nccl_settle(mg, ncclAllGather(d_bytes + (size_t)r * count, d_bytes, count, ncclUint8, mg->nccl_comm, s), "fp8 all-gather");
    multi_gpu_wait(mg, s, "fp8 all-gather");
    cudaCheck(cudaMemcpy(bytes, d_bytes, count * n, cudaMemcpyDeviceToHost));
    wrong = 0;
    for (int q = 0; q < n; q++) {
        for (size_t j = 0; j < count; j++) { wrong += bytes[(size_t)q * count + j] != (uint8_t)(j * 31 + (size_t)q * 101); }
    }
    CHECK(wrong == 0, "%s: uint8 all-gather: %zu bytes wrong", who, wrong);
    float total = multi_gpu_all_reduce_float(mg, (float)(r + 1), ncclSum, s, "loss all-reduce");
    CHECK(total == (float)(n * (n + 1) / 2), "%s: float all-reduce gave %g", who, total);
    float top = multi_gpu_all_reduce_float(mg, (float)(r + 1), ncclMax, s, "max all-reduce");
    CHECK(top == (float)n, "%s: float MAX all-reduce gave %g (the op not passed on?)", who, top);
    cudaCheck(cudaFree(d_amax)); cudaCheck(cudaFree(d_send)); cudaCheck(cudaFree(d_recv)); cudaCheck(cudaFree(d_bytes));
    free(send); free(got); free(bytes);
}

// the gradient reduction as zero.h plans it: per chunk, one ncclReduce per piece to its owner, in one group
static void test_chunk_reduction(const MultiGpuConfig* mg, const ZeroLayout* z, const char* who) {
    int r = mg->process_rank;
    cudaStream_t s = mg->nccl_stream;
    uint16_t* grads = (uint16_t*)mallocCheck(z->num_parameters * sizeof(uint16_t));
    for (size_t j = 0; j < z->num_parameters; j++) { grads[j] = bf16_of(contribution(r, j)); }
    uint16_t* d_grads = (uint16_t*)device_copy(grads, z->num_parameters * sizeof(uint16_t));
    ZeroPiece* pieces = (ZeroPiece*)mallocCheck((size_t)zero_chunk_max_pieces(z) * sizeof(ZeroPiece));
    for (int k = 0; k < zero_num_chunks(z); k++) {  // in backward order: layers L-1 .. 0, then wte/wpe/lnf
        int chunk = k < z->num_layers ? z->num_layers - 1 - k : z->num_layers;
        int count = zero_chunk_pieces(z, chunk, pieces);
        multi_gpu_nccl_settle(mg, ncclGroupStart(), "group start");
        for (int p = 0; p < count; p++) {
            uint16_t* at = d_grads + pieces[p].begin;
            multi_gpu_nccl_settle(mg, ncclReduce(at, at, pieces[p].end - pieces[p].begin, ncclBfloat16, ncclSum,
                                                 pieces[p].owner, mg->nccl_comm, s), "chunk reduce");
        }
        multi_gpu_nccl_settle(mg, ncclGroupEnd(), "chunk reduce group");
    }
    multi_gpu_wait(mg, s, "chunk reduce");
    cudaCheck(cudaMemcpy(grads, d_grads, z->num_parameters * sizeof(uint16_t), cudaMemcpyDeviceToHost));
    ZeroRange mine = zero_rank_range(z, r);
    size_t wrong = 0;
    for (size_t j = mine.begin; j < mine.end; j++) {
        float sum = 0.0f;
        for (int q = 0; q < mg->num_processes; q++) { sum += contribution(q, j); }
        wrong += grads[j] != bf16_of(sum);
    }
    CHECK(wrong == 0, "%s: per-chunk reduction: %zu of %zu owned gradients wrong", who, wrong, mine.end - mine.begin);
    cudaCheck(cudaFree(d_grads));
    free(grads); free(pieces);
}

// the ZeRO-1 FP8 weight gather on the GPU against the single-rank host cast, bit for bit
static void test_fp8_weight_gather(const MultiGpuConfig* mg, const GPT2Config* model, Fp8Format format, const char* who) {
    int n = mg->num_processes, r = mg->process_rank;
    cudaStream_t s = mg->nccl_stream;
    ZeroLayout z, single;
    zero_layout_init(&z, model, n);
    zero_layout_init(&single, model, 1);
    float* params = (float*)mallocCheck(z.padded_total * sizeof(float));
    memset(params, 0, z.padded_total * sizeof(float));
    gpt2_init_params_random(params, model, GPT2_INIT_SEED);
    ZeroPiece* slices = (ZeroPiece*)mallocCheck((size_t)ZERO_MATMUL_KINDS * model->num_layers * sizeof(ZeroPiece));
    int num_slices = zero_fp8_weight_slices(&z, slices);
    float* ref_scales = (float*)mallocCheck((size_t)num_slices * sizeof(float));
    uint8_t* ref_codes = (uint8_t*)mallocCheck(z.padded_total);
    memset(ref_codes, 0, z.padded_total);
    zero_simulate_fp8_weight_gather(&single, params, slices, num_slices, format, 0, ref_scales, ref_codes);

    size_t shard_begin = (size_t)r * z.shard_size;
    float* d_shard = (float*)device_copy(params + shard_begin, z.shard_size * sizeof(float));
    ZeroPiece* d_slices = (ZeroPiece*)device_copy(slices, (size_t)num_slices * sizeof(ZeroPiece));
    unsigned int* d_amax = NULL;
    uint8_t* d_codes = NULL;
    cudaCheck(cudaMalloc((void**)&d_amax, (size_t)num_slices * sizeof(unsigned int)));
    cudaCheck(cudaMalloc((void**)&d_codes, z.padded_total));
    cudaCheck(cudaMemsetAsync(d_amax, 0, (size_t)num_slices * sizeof(unsigned int), s));
    cudaCheck(cudaMemsetAsync(d_codes, 0, z.padded_total, s));
    slice_amax_kernel<<<num_slices, 256, 0, s>>>(d_shard, shard_begin, z.shard_size, d_slices, d_amax);
    cudaCheck(cudaGetLastError());
    // amax bits of non-negative floats order like the floats, so MAX on floats is the global amax
    multi_gpu_nccl_settle(mg, ncclAllReduce(d_amax, d_amax, num_slices, ncclFloat, ncclMax, mg->nccl_comm, s), "weight amax all-reduce");
    uint8_t* d_my_codes = d_codes + shard_begin;
    slice_cast_kernel<<<num_slices, 256, 0, s>>>(d_shard, shard_begin, z.shard_size, d_slices, (const float*)d_amax, format, d_my_codes);
    cudaCheck(cudaGetLastError());
    multi_gpu_nccl_settle(mg, ncclAllGather(d_my_codes, d_codes, z.shard_size, ncclUint8, mg->nccl_comm, s), "fp8 weight all-gather");
    multi_gpu_wait(mg, s, "fp8 weight all-gather");
    uint8_t* codes = (uint8_t*)mallocCheck(z.padded_total);
    cudaCheck(cudaMemcpy(codes, d_codes, z.padded_total, cudaMemcpyDeviceToHost));
    size_t wrong = 0;
    for (size_t j = 0; j < z.num_parameters; j++) { wrong += codes[j] != ref_codes[j]; }
    CHECK(wrong == 0, "%s %s: gathered FP8 weights differ from the single-rank cast in %zu of %zu bytes", who,
          fp8_format_name(format), wrong, z.num_parameters);
    cudaCheck(cudaFree(d_shard)); cudaCheck(cudaFree(d_slices)); cudaCheck(cudaFree(d_amax)); cudaCheck(cudaFree(d_codes));
    free(params); free(slices); free(ref_scales); free(ref_codes); free(codes);
}

// the fingerprint kernel against replica_fingerprint_host, and what a fingerprint must notice
static void test_replica_fingerprints(void) {
    const size_t sizes[] = {1, 3, 255, 4096 + 7, 3 * 16 * REPLICA_THREADS * 1024 + 5};  // the last: more than the grid
    const size_t max_bytes = 3 * 16 * REPLICA_THREADS * 1024 + 5 + 1;
    uint8_t* host = (uint8_t*)mallocCheck(max_bytes);
    for (size_t i = 0; i < max_bytes; i++) { host[i] = (uint8_t)((i * 2654435761u) >> 13); }
    uint8_t* device = (uint8_t*)device_copy(host, max_bytes);
    ReplicaCheck check;
    replica_check_init(&check);
    for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
        replica_check_add(&check, device + 1, sizes[k], "odd offset, %zu bytes", sizes[k]);  // unaligned start
    }
    replica_check_finish(&check, 1);
    replica_fingerprints(&check, 0);
    unsigned long long got[8];
    cudaCheck(cudaMemcpy(got, check.fingerprints, (size_t)check.count * sizeof(unsigned long long), cudaMemcpyDeviceToHost));
    for (int k = 0; k < check.count; k++) {
        CHECK(got[k] == replica_fingerprint_host(host + 1, sizes[k]), "fingerprint of %s: kernel %llx, host %llx",
              check.regions[k].name, got[k], (unsigned long long)replica_fingerprint_host(host + 1, sizes[k]));
    }
    uint64_t base = replica_fingerprint_host(host, 4096);
    host[100] ^= 0x01;
    CHECK(replica_fingerprint_host(host, 4096) != base, "fingerprint: one flipped bit went unnoticed");
    host[100] ^= 0x01;
    uint8_t a = host[10], b = host[20];
    CHECK(a != b, "fingerprint test data: bytes 10 and 20 are equal");
    host[10] = b; host[20] = a;
    CHECK(replica_fingerprint_host(host, 4096) != base, "fingerprint: two swapped bytes went unnoticed");
    replica_check_free(&check);
    cudaCheck(cudaFree(device));
    free(host);
}

// rank 1 alone writes one byte of its copy of the regions
static void poke_on_rank_1(const MultiGpuConfig* mg, uint8_t* at, uint8_t value) {
    if (mg->process_rank != 1) { return; }
    cudaCheck(cudaMemcpy(at, &value, 1, cudaMemcpyHostToDevice));
    cudaCheck(cudaDeviceSynchronize());
}

// rank 1 differs from rank 0 in `regions` regions, of which `region` is the first
static void check_replica_mismatch(ReplicaCheck* check, const MultiGpuConfig* mg, const char* who, const char* what,
                                   int region, int regions) {
    ReplicaMismatch found = replica_check_compare(check, mg, mg->nccl_stream);
    CHECK(found.region == region && found.rank == 1 && found.regions_differing == regions && found.ranks_differing == 1,
          "%s: %s: found region %d rank %d (%d regions, %d ranks)", who, what, found.region, found.rank,
          found.regions_differing, found.ranks_differing);
}

// replica_check_compare over the ranks: identical regions pass; one byte of one region on
// rank 1 names that region and rank; with the last region changed too, the first region that
// differs is still the one named, and both are counted; with only the last one differing, it is
// named and rank 1 counted (a rank whose only difference is in the last region)
static void test_replica_compare(const MultiGpuConfig* mg, const char* who) {
    const size_t bytes = 1000;
    uint8_t host[3][1000];
    for (int r = 0; r < 3; r++) {
        for (size_t i = 0; i < bytes; i++) { host[r][i] = (uint8_t)(i * 7 + r); }
    }
    uint8_t* device = (uint8_t*)device_copy(host, sizeof(host));
    ReplicaCheck check;
    replica_check_init(&check);
    for (int r = 0; r < 3; r++) { replica_check_add(&check, device + r * bytes, bytes, "region %d", r); }
    replica_check_finish(&check, mg->num_processes);
    ReplicaMismatch same = replica_check_compare(&check, mg, mg->nccl_stream);
    CHECK(same.region == -1 && same.regions_differing == 0 && same.ranks_differing == 0,
          "%s: identical regions reported as different (region %d, rank %d)", who, same.region, same.rank);
    poke_on_rank_1(mg, device + bytes + 999, (uint8_t)(host[1][999] ^ 0x80));
    check_replica_mismatch(&check, mg, who, "one byte of region 1 on rank 1", 1, 1);
    poke_on_rank_1(mg, device + 2 * bytes, (uint8_t)(host[2][0] ^ 0x01));
    check_replica_mismatch(&check, mg, who, "regions 1 and 2 changed on rank 1", 1, 2);
    poke_on_rank_1(mg, device + bytes + 999, host[1][999]);
    check_replica_mismatch(&check, mg, who, "only the last region changed on rank 1", 2, 1);
    replica_check_free(&check);
    cudaCheck(cudaFree(device));
}

static MultiGpuOptions fs_options(int num_processes, int rank, const char* dir, int timeout_s) {
    MultiGpuOptions opts = multi_gpu_options_default();
    opts.num_processes = num_processes;
    opts.process_rank = rank;
    opts.gpus_per_node = 1;
    opts.init_method = MULTI_GPU_INIT_FS;
    opts.fs_path = dir;
    opts.timeout_s = timeout_s;
    return opts;
}

// one rank of the two-rank run, in a forked child; its exit status is its failure count
// a rank's process and device set up in one call (the trainer takes the two steps apart: it checks
// its files in between, before it touches a GPU)
static MultiGpuConfig multi_gpu_config_init(const MultiGpuOptions* options, int force_communicator) {
    MultiGpuOptions opts = *options;
    MultiGpuConfig cfg = multi_gpu_process_init(&opts);
    multi_gpu_device_init(&cfg, &opts, force_communicator);
    return cfg;
}

static int run_rank(int rank, const char* dir) {
    alarm(CHILD_TIME_LIMIT_S * 3);
    MultiGpuOptions opts = fs_options(2, rank, dir, RANK_TIMEOUT_S);
    MultiGpuConfig mg = multi_gpu_config_init(&opts, 0);
    char who[32];
    snprintf(who, sizeof(who), "rank %d of 2", rank);
    GPT2Config tiny = gpt2_config_from_descriptor("tiny");
    ZeroLayout z;
    zero_layout_init(&z, &tiny, 2);
    test_basic_collectives(&mg, who);
    test_chunk_reduction(&mg, &z, who);
    test_fp8_weight_gather(&mg, &tiny, FP8_E4M3, who);
    test_fp8_weight_gather(&mg, &tiny, FP8_E5M2, who);
    test_replica_compare(&mg, who);
    multi_gpu_config_free(&mg);
    test_summary(who);
    fflush(stdout);  // the caller _exits, which skips stdio: piped (make gpucheck), this rank's FAIL lines were lost
    return g_tests_failed > 0 ? 1 : 0;
}

// waits for a child at most limit_s; kills it after that
static int wait_child(pid_t pid, int limit_s) {
    double deadline = multi_gpu_now_s() + limit_s;
    int status = 0;
    while (waitpid(pid, &status, WNOHANG) == 0) {
        if (multi_gpu_now_s() > deadline) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            return -1;
        }
        usleep(10000);
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// what rank 0 does once both ranks have joined, in check_rank_0_outlives_its_peer
static void all_reduce_the_loss(MultiGpuConfig* mg) {
    multi_gpu_all_reduce_float(mg, 1.0f, ncclSum, mg->nccl_stream, "loss all-reduce");
}

#ifdef CUDASIM  // its case, a dead peer at the finalize, runs under cudasim alone (test_two_ranks)
static void free_the_communicator(MultiGpuConfig* mg) { multi_gpu_config_free(mg); }
#endif

// rank 1 joins, then exits (peer_lives 0) or lives on without another NCCL call (1); rank 0, a
// second later, does `step`, which must end it with one line, in bounded time
static void check_rank_0_outlives_its_peer(const char* what, int peer_lives, void (*step)(MultiGpuConfig*),
                                           const char* must_contain) {
    char dir[256];
    test_make_temp_dir(dir, sizeof(dir));
    pid_t peer = fork();
    if (peer == 0) {
        MultiGpuOptions opts = fs_options(2, 1, dir, RANK_TIMEOUT_S);
        multi_gpu_config_init(&opts, 0);
        if (peer_lives) { sleep(CHILD_TIME_LIMIT_S); }
        _exit(0);
    }
    double start = multi_gpu_now_s();
    CHECK_DIES(what, must_contain, {
        MultiGpuOptions opts = fs_options(2, 0, dir, DEAD_PEER_TIMEOUT_S);
        MultiGpuConfig mg = multi_gpu_config_init(&opts, 0);
        sleep(1);
        step(&mg);
    });
    CHECK(multi_gpu_now_s() - start < 4 * DEAD_PEER_TIMEOUT_S + 30, "%s: took %.0f s", what, multi_gpu_now_s() - start);
    if (peer_lives) { kill(peer, SIGKILL); }
    wait_child(peer, 10);
    test_remove_dir(dir);
}

static void test_two_ranks(void) {
    char dir[256];
    test_make_temp_dir(dir, sizeof(dir));
    pid_t pids[2];
    for (int rank = 0; rank < 2; rank++) {
        fflush(stdout);
        pids[rank] = fork();
        if (pids[rank] == 0) { _exit(run_rank(rank, dir)); }
    }
    for (int rank = 0; rank < 2; rank++) {
        int status = wait_child(pids[rank], CHILD_TIME_LIMIT_S * 3);
        CHECK(status == 0, "two ranks: rank %d exited with %d (failures above; -1: crash or hang)", rank, status);
    }
    char id_path[4096];  // once every rank has joined, rank 0 removes the id: a stale one would mislead the next run
    MultiGpuOptions rank_0 = fs_options(2, 0, dir, RANK_TIMEOUT_S);
    multi_gpu_id_file_path(&rank_0, id_path, sizeof(id_path));
    CHECK(access(id_path, F_OK) != 0, "two ranks: %s left in -pf after the communicator formed", id_path);
    test_remove_dir(dir);

    // rank 1 dies after joining (a crash): rank 0's next collective, or its finalize, ends it with
    // one line, in bounded time. cudasim reports a peer that exited as ncclRemoteError
    // (test/cudasim/cudasim_nccl.cpp), which the wait and the settle must act on at once; a real
    // NCCL may only time out (or, alone at its finalize, not notice). Rank 1 alive but in no
    // collective: rank 0's wait ends at its deadline, in the launch (NCCL 2.32.3 on the H200: the
    // all-reduce call stays in progress) or in the wait for the GPU (cudasim), both "did not complete"
#ifdef CUDASIM
    check_rank_0_outlives_its_peer("dead peer", 0, all_reduce_the_loss, "rank 0 of 2: NCCL loss all-reduce: remote process exited");
    check_rank_0_outlives_its_peer("dead peer at finalize", 0, free_the_communicator, "rank 0 of 2: NCCL ncclCommFinalize: ");
#else
    check_rank_0_outlives_its_peer("dead peer", 0, all_reduce_the_loss, "rank 0 of 2: NCCL loss all-reduce: ");
#endif
    check_rank_0_outlives_its_peer("hung peer", 1, all_reduce_the_loss, "rank 0 of 2: NCCL loss all-reduce: did not complete");
#ifdef CUDASIM
    // the same with an ncclCommAbort that never returns, as a real one can: the line comes before
    // the abort, and the process still ends in bounded time (multi_gpu_abort_and_die's alarm; the
    // child's own 60 s alarm, a signal, would fail the check)
    setenv("CUDASIM_NCCL_ABORT_HANGS", "1", 1);
    check_rank_0_outlives_its_peer("hung peer, abort hangs", 1, all_reduce_the_loss,
                                   "rank 0 of 2: NCCL loss all-reduce: did not complete");
    unsetenv("CUDASIM_NCCL_ABORT_HANGS");
#endif

    // rank 1 waits in ncclCommFinalize; rank 0 comes late, finalizes, destroys and exits at once
    // (the trainer's rank 0 writing the last checkpoint): both must exit 0. Under cudasim rank 1
    // is made to stall (as a descheduled process does) between seeing rank 0 missing and
    // looking whether it left, so rank 0 arrives, leaves and exits inside that window; a real
    // NCCL ignores the variable
    test_make_temp_dir(dir, sizeof(dir));
    for (int rank = 0; rank < 2; rank++) {
        fflush(stdout);
        pids[rank] = fork();
        if (pids[rank] == 0) {
            alarm(CHILD_TIME_LIMIT_S);
            if (rank == 1) { setenv("CUDASIM_NCCL_PEER_CHECK_STALL_S", "1.5", 1); }
            MultiGpuOptions opts = fs_options(2, rank, dir, RANK_TIMEOUT_S);
            MultiGpuConfig mg = multi_gpu_config_init(&opts, 0);
            if (rank == 0) { usleep(500 * 1000); }
            multi_gpu_config_free(&mg);
            _exit(0);
        }
    }
    for (int rank = 0; rank < 2; rank++) {
        int status = wait_child(pids[rank], CHILD_TIME_LIMIT_S * 2);
        CHECK(status == 0, "late finalize: rank %d exited with %d (0 expected; its error line above)", rank, status);
    }
    test_remove_dir(dir);
}

/*
The watchdog (llmc/multi_gpu.h), each case in a child forked before this process touches CUDA:
armed and then stuck outside any bounded wait (a sleep stands in for a launch that blocks), the
process ends after -pt with one line naming the rank and the region; a host that completes a
bounded wait more often than every -pt s, and then disarms, runs on past -pt and exits 0; one
stuck after a completed all-reduce (a settle and a wait) is ended like the first.
*/
static void test_watchdog(const char* dir) {
    CHECK_DIES("watchdog: an armed host stuck for -pt", "rank 0 of 1: NCCL watchdog: the test's region made no progress for 1 s", {
        MultiGpuOptions opts = fs_options(1, 0, dir, 1);
        MultiGpuConfig mg = multi_gpu_config_init(&opts, 1);
        multi_gpu_watchdog_arm(&mg, "the test's %s", "region");
        sleep(20);
    });
    // a completed bounded wait (a collective's settle and its stream wait) restarts the deadline
    // but leaves the watchdog watching: a host stuck after it is ended all the same
    CHECK_DIES("watchdog: stuck after a completed all-reduce", "rank 0 of 1: NCCL watchdog: the region after a wait made no progress", {
        MultiGpuOptions opts = fs_options(1, 0, dir, 1);
        MultiGpuConfig mg = multi_gpu_config_init(&opts, 1);
        multi_gpu_watchdog_arm(&mg, "the region after a wait");
        multi_gpu_all_reduce_float(&mg, 1.0f, ncclSum, mg.nccl_stream, "loss all-reduce");
        sleep(20);
    });
    ChildRun run;
    if (child_run_begin(&run)) {
        MultiGpuOptions opts = fs_options(1, 0, dir, 1);
        MultiGpuConfig mg = multi_gpu_config_init(&opts, 1);
        multi_gpu_watchdog_arm(&mg, "the progressing region");
        for (int i = 0; i < 4; i++) {  // 2.4 s armed, a completed wait every 0.6 s
            usleep(600000);
            multi_gpu_wait(&mg, mg.nccl_stream, "the test's wait");
        }
        multi_gpu_watchdog_disarm(&mg);
        usleep(1500000);
        multi_gpu_config_free(&mg);
        _exit(0);
    }
    char text[CHILD_STDERR_MAX + 1];
    size_t length;
    int status = child_run_collect(&run, text, &length);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0,
          "watchdog: a host making progress, then disarmed, was ended (status %d): [%s]", status, text);
}

/*
zero_comm.cuh's mean of a piece's fp32 sum (-pa fp32: the sums sit in the scratch at each piece's
offset): the owner's elements get sum / N correctly rounded in fp32, then rounded to bf16 once.
The sums lie within 2 fp32 steps of 3 times a bf16 rounding midpoint, where multiplying by 1/3
(rounded) instead lands one bf16 step off for some of them. The piece another rank owns keeps
its bytes: the reduce left only the owner's meaningful.
*/
static void test_mean_of_fp32_sums_rounds_once(void) {
    const int num_ranks = 3, rank = 1, n = 128 * 5;  // 128 midpoints in [1, 2), 5 sums around each
    ZeroPiece pieces[2] = {};
    pieces[0].begin = 0; pieces[0].end = n; pieces[0].owner = 0;
    pieces[1].begin = n; pieces[1].end = 2 * n; pieces[1].owner = rank;
    const size_t offsets[2] = {(size_t)n, 0};  // the scratch holds piece 1's sums first
    float* sums = (float*)mallocCheck(2 * (size_t)n * sizeof(float));
    uint16_t* grads = (uint16_t*)mallocCheck(2 * (size_t)n * sizeof(uint16_t));
    for (int i = 0; i < n; i++) {
        float near = (float)(num_ranks * (1.0 + (i / 5 + 0.5) / 128.0));  // exact: 3 times a midpoint
        uint32_t bits;
        memcpy(&bits, &near, sizeof(bits));
        bits += (uint32_t)(i % 5) - 2u;
        memcpy(&sums[i], &bits, sizeof(float));
        sums[n + i] = -1.0f;  // piece 0's slot: not this rank's
        grads[i] = bf16_of(0.5f);
        grads[n + i] = bf16_of(0.25f);
    }
    floatX* d_grads = (floatX*)device_copy(grads, 2 * (size_t)n * sizeof(uint16_t));
    float* d_sums = (float*)device_copy(sums, 2 * (size_t)n * sizeof(float));
    ZeroPiece* d_pieces = (ZeroPiece*)device_copy(pieces, sizeof(pieces));
    size_t* d_offsets = (size_t*)device_copy(offsets, sizeof(offsets));
    zero_mean_pieces_kernel<float><<<dim3(2, 2), 64>>>(d_grads, d_sums, d_pieces, d_offsets, rank, (float)num_ranks);
    cudaCheck(cudaGetLastError());
    uint16_t* got = (uint16_t*)mallocCheck(2 * (size_t)n * sizeof(uint16_t));
    cudaCheck(cudaMemcpy(got, d_grads, 2 * (size_t)n * sizeof(uint16_t), cudaMemcpyDeviceToHost));
    size_t wrong = 0, touched = 0;
    for (int i = 0; i < n; i++) {
        touched += got[i] != grads[i];
        wrong += got[n + i] != bf16_of(sums[i] / (float)num_ranks);
    }
    CHECK(wrong == 0, "mean kernel: %zu of %d owned elements are not their fp32 sum / 3 rounded once to bf16", wrong, n);
    CHECK(touched == 0, "mean kernel: %zu elements of the piece rank 0 owns were written by rank 1", touched);
    cudaCheck(cudaFree(d_grads)); cudaCheck(cudaFree(d_sums)); cudaCheck(cudaFree(d_pieces)); cudaCheck(cudaFree(d_offsets));
    free(sums); free(grads); free(got);
}

// zero_comm_owned_weight_part on 2 ranks, for a weight of 256 elements that ends where rank 1's
// range begins, begins where rank 0's ends, or crosses there: a rank whose range only touches the
// weight owns none of it (an empty part would reach the amax launch, which dies on one)
static void test_owned_weight_part_at_range_edges(void) {
    GPT2Config tiny = gpt2_config_from_descriptor("tiny");
    ZeroComm comm;
    memset(&comm, 0, sizeof(comm));
    zero_layout_init(&comm.layout, &tiny, 2);
    const size_t b = zero_rank_range(&comm.layout, 1).begin;
    Fp8Linear lin;
    memset(&lin, 0, sizeof(lin));
    lin.OC = 4;
    lin.K = 64;
    const struct { int rank; size_t offset; int owned; size_t lo, hi; } cases[] = {
        {0, b - 256, 1, b - 256, b}, {1, b - 256, 0, 0, 0},
        {0, b, 0, 0, 0},             {1, b, 1, b, b + 256},
        {0, b - 16, 1, b - 16, b},   {1, b - 16, 1, b, b + 240},
    };
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        comm.rank = cases[c].rank;
        lin.weight_offset = cases[c].offset;
        size_t lo = 0, hi = 0;
        int owned = zero_comm_owned_weight_part(&comm, &lin, &lo, &hi);
        CHECK(owned == cases[c].owned && (!owned || (lo == cases[c].lo && hi == cases[c].hi)),
              "owned part of [%zu, %zu) on rank %d (ranges meet at %zu): %d [%zu, %zu), expected %d [%zu, %zu)", cases[c].offset,
              cases[c].offset + 256, cases[c].rank, b, owned, lo, hi, cases[c].owned, cases[c].lo, cases[c].hi);
    }
}

/*
A rank whose peers never show up, each case in a child forked before this process touches CUDA:
it ends after -pt with one line naming what it waited for, never hangs. Rank 1 alone waits for
the id file rank 0 writes (-pi fs); rank 0 alone has written it and waits in the communicator's
creation for rank 1. Without -pf there is no file to hand the id over, and a -pg that puts the
rank on a GPU past the visible ones: each stops with its own line before any NCCL call.
*/
static void check_lone_rank_dies(const char* what, int rank, const char* must_contain) {
    char dir[256];
    test_make_temp_dir(dir, sizeof(dir));
    CHECK_DIES(what, must_contain, {
        setenv("NCCL_MULTI_RANK_GPU_ENABLE", "1", 1);  // as test_two_ranks: -pg 1 puts both ranks on GPU 0
        MultiGpuOptions opts = fs_options(2, rank, dir, 1);
        multi_gpu_config_init(&opts, 0);
    });
    test_remove_dir(dir);
}

static void test_lone_ranks(void) {
    check_lone_rank_dies("rank 1 without rank 0", 1, "rank 1: no NCCL id from rank 0 in");
    check_lone_rank_dies("rank 0 without rank 1", 0, "did not complete within 1 s (still being launched");
    CHECK_DIES("-pi fs without -pf", "flag -pi fs (what -pi auto takes without mpirun) needs -pf", {
        MultiGpuOptions opts = fs_options(2, 0, NULL, 1);
        multi_gpu_config_init(&opts, 0);
    });
    for (int rank = 0; rank < 2; rank++) {  // at once, not after -pt: rank 0 would fail to write there, rank 1 poll on
        CHECK_DIES("-pf that does not exist", "flag -pf /nonexistent/llm8: No such file or directory (expected a directory", {
            MultiGpuOptions opts = fs_options(2, rank, "/nonexistent/llm8", 60);
            multi_gpu_config_init(&opts, 0);
        });
        CHECK_DIES("-pf that is a file", "flag -pf /dev/null: not a directory", {
            MultiGpuOptions opts = fs_options(2, rank, "/dev/null", 60);
            multi_gpu_config_init(&opts, 0);
        });
    }
    CHECK_DIES("-pg past the visible GPUs", "of this node wanted (-pg", {
        int visible = cuda_device_count_or_die();
        MultiGpuOptions opts = fs_options(visible + 1, visible, "/nonexistent", 1);
        opts.gpus_per_node = visible + 1;
        multi_gpu_config_init(&opts, 0);
    });
}

// -ps: the port given, else the default, in network byte order (what other tools and firewalls see)
static void check_server_address(const char* server, const char* ip, int port) {
    struct sockaddr_in addr = multi_gpu_parse_server(server);
    char text[INET_ADDRSTRLEN] = "";
    inet_ntop(AF_INET, &addr.sin_addr, text, sizeof(text));
    CHECK(addr.sin_family == AF_INET && strcmp(text, ip) == 0 && ntohs(addr.sin_port) == port,
          "-ps %s: parsed as %s port %d, expected %s port %d", server, text, ntohs(addr.sin_port), ip, port);
}

// each rank flag's bad value is refused at the process's start, with one line naming the flag
static void check_options_refused(const char* what, const char* flag, int num_processes, int rank, int gpus_per_node,
                                  int timeout_s) {
    MultiGpuOptions o = fs_options(num_processes, rank, NULL, timeout_s);
    o.gpus_per_node = gpus_per_node;
    CHECK_DIES(what, flag, { multi_gpu_process_init(&o); });
}

/*
-pi fs: rank 0 removes an id file an earlier failed run left in -pf when it starts (the others
would read it and wait out -pt on a communicator that never forms); another rank leaves it, as
it may already be this run's own. No GPU is touched.
*/
static void test_stale_id_file_removed_by_rank_0_only(void) {
    char dir[256], path[4096];
    test_make_temp_dir(dir, sizeof(dir));
    MultiGpuOptions any_rank = fs_options(2, 0, dir, 1);
    multi_gpu_id_file_path(&any_rank, path, sizeof(path));
    for (int rank = 1; rank >= 0; rank--) {
        FILE* fp = fopenCheck(path, "wb");
        fcloseCheck(fp);
        MultiGpuOptions opts = fs_options(2, rank, dir, 1);
        multi_gpu_process_init(&opts);
        CHECK((access(path, F_OK) == 0) == (rank != 0), "rank %d of 2 at its start: an id file in -pf was %s", rank,
              rank == 0 ? "left" : "removed");
    }
    test_remove_dir(dir);
}

/*
-pi fs: a rank takes the id only from a file rank 0 of a run of its own -pn wrote; from any
other file (another run's in the same -pf, an older llm8's bare id, junk) it takes nothing and
says at -pt what it found. No GPU is touched.
*/
static void write_id_file(const char* path, const void* bytes, size_t size) {
    FILE* fp = fopenCheck(path, "wb");
    fwriteCheck(bytes, 1, size, fp);
    fcloseCheck(fp);
}

static void check_id_file_read(const char* path, int num_processes, int expect_taken, const char* expect_found) {
    ncclUniqueId id;
    memset(&id, 0, sizeof(id));
    char found[256];
    int taken = multi_gpu_id_file_read(path, num_processes, &id, found, sizeof(found));
    CHECK(taken == expect_taken && strstr(found, expect_found) != NULL && (expect_found[0] != '\0' || found[0] == '\0'),
          "id file read by a rank of -pn %d: taken %d (expected %d), found '%s' (expected '%s')", num_processes, taken,
          expect_taken, found, expect_found);
    CHECK(!taken || (id.internal[0] == 7 && id.internal[sizeof(id.internal) - 1] == 9),
          "id file read by a rank of -pn %d: the id's bytes were not the file's", num_processes);
}

static void test_id_file_of_another_run_not_taken(void) {
    char dir[256], path[4096];
    test_make_temp_dir(dir, sizeof(dir));
    MultiGpuOptions any_rank = fs_options(2, 0, dir, 1);
    multi_gpu_id_file_path(&any_rank, path, sizeof(path));
    check_id_file_read(path, 2, 0, "");
    MultiGpuIdFile file;
    memset(&file, 0, sizeof(file));
    file.magic = MULTI_GPU_ID_FILE_MAGIC;
    file.num_processes = 3;
    file.id.internal[0] = 7;
    file.id.internal[sizeof(file.id.internal) - 1] = 9;
    write_id_file(path, &file, sizeof(file));
    check_id_file_read(path, 3, 1, "");
    check_id_file_read(path, 2, 0, "for a run of 3 ranks, not of this rank's -pn 2");
    unsigned char longer[sizeof(file) + 1] = {0};
    memcpy(longer, &file, sizeof(file));
    write_id_file(path, longer, sizeof(longer));
    check_id_file_read(path, 3, 0, "not an llm8 id file");
    write_id_file(path, &file, sizeof(file) - 1);
    check_id_file_read(path, 3, 0, "not an llm8 id file");
    file.magic ^= 1;
    write_id_file(path, &file, sizeof(file));
    check_id_file_read(path, 3, 0, "not an llm8 id file");
    write_id_file(path, &file.id, sizeof(file.id));
    check_id_file_read(path, 3, 0, "a bare id, as llm8 wrote before");
    // a lone rank 1 keeps polling past another run's file, and its timeout names that file
    file.magic = MULTI_GPU_ID_FILE_MAGIC;
    write_id_file(path, &file, sizeof(file));
    CHECK_DIES("rank 1 of 2 with only a 3-rank run's id in -pf", "after 1 s (the id there is for a run of 3 ranks", {
        MultiGpuOptions opts = fs_options(2, 1, dir, 1);
        multi_gpu_config_init(&opts, 0);
    });
    test_remove_dir(dir);
}

/*
-pi fs within a Slurm job: the id file's name holds SLURM_JOB_ID (a number; anything else, or
none, gives the plain name), so two jobs sharing -pf keep apart: rank 0 removes at its start
only its own job's file, and a rank polls past another job's (of the same -pn) until -pt. No GPU
is touched.
*/
static void check_id_file_name(const char* job, const char* dir, const char* expect_name) {
    if (job != NULL) { setenv("SLURM_JOB_ID", job, 1); } else { unsetenv("SLURM_JOB_ID"); }
    char path[4096], expected[4096];
    MultiGpuOptions opts = fs_options(2, 0, dir, 1);
    multi_gpu_id_file_path(&opts, path, sizeof(path));
    path_in_dir(expected, sizeof(expected), dir, expect_name);
    CHECK(strcmp(path, expected) == 0, "SLURM_JOB_ID %s: id file %s (expected %s)", job != NULL ? job : "unset", path,
          expected);
}

static void test_id_file_named_by_slurm_job(void) {
    const char* saved = getenv("SLURM_JOB_ID");
    char saved_job[64];
    snprintf(saved_job, sizeof(saved_job), "%s", saved != NULL ? saved : "");
    char dir[256], other_job[4096], own_job[4096];
    test_make_temp_dir(dir, sizeof(dir));
    check_id_file_name(NULL, dir, "llm8_nccl_id.bin");
    check_id_file_name("", dir, "llm8_nccl_id.bin");
    check_id_file_name("42x", dir, "llm8_nccl_id.bin");
    check_id_file_name("../42", dir, "llm8_nccl_id.bin");
    check_id_file_name("123456789012345678901", dir, "llm8_nccl_id.bin");
    check_id_file_name("4242", dir, "llm8_nccl_id.job4242.bin");
    path_in_dir(other_job, sizeof(other_job), dir, "llm8_nccl_id.job4242.bin");
    path_in_dir(own_job, sizeof(own_job), dir, "llm8_nccl_id.job4243.bin");
    MultiGpuIdFile file;  // a valid id of a 2-rank run of job 4242
    memset(&file, 0, sizeof(file));
    file.magic = MULTI_GPU_ID_FILE_MAGIC;
    file.num_processes = 2;
    write_id_file(other_job, &file, sizeof(file));
    write_id_file(own_job, &file, sizeof(file));
    setenv("SLURM_JOB_ID", "4243", 1);
    MultiGpuOptions rank_0 = fs_options(2, 0, dir, 1);
    multi_gpu_process_init(&rank_0);
    CHECK(access(own_job, F_OK) != 0 && access(other_job, F_OK) == 0, "rank 0 of job 4243 at its start: its own id "
          "file %s, job 4242's %s", access(own_job, F_OK) == 0 ? "left" : "removed",
          access(other_job, F_OK) == 0 ? "left" : "removed");
    CHECK_DIES("rank 1 of job 4243 with only job 4242's id in -pf", "llm8_nccl_id.job4243.bin' after 1 s", {
        MultiGpuOptions opts = fs_options(2, 1, dir, 1);
        multi_gpu_config_init(&opts, 0);
    });
    if (saved != NULL) { setenv("SLURM_JOB_ID", saved_job, 1); } else { unsetenv("SLURM_JOB_ID"); }
    test_remove_dir(dir);
}

/*
The one-rank communicator (-pi fs with force_communicator) and the collectives through it, in a
forked child like each rank of test_two_ranks; its exit status is its failure count. This process
itself never creates a communicator: with NCCL 2.32.3 (H200, 2026-11-30) every child forked after
the parent had made and freed one died at exit() with "terminate called without an active
exception" (SIGABRT) instead of its one error line, and the parent printed that line at its own
exit (NCCL 2.28.9 did neither; the trainer, which never forks, exits 0 with 2.32.3)
*/
static int run_one_rank(const char* dir) {
    alarm(CHILD_TIME_LIMIT_S * 3);
    MultiGpuOptions opts = fs_options(1, 0, dir, RANK_TIMEOUT_S);
    MultiGpuConfig mg = multi_gpu_config_init(&opts, 1);
    CHECK(mg.nccl_comm != NULL, "one rank: no communicator");
    test_basic_collectives(&mg, "one rank");
    multi_gpu_config_free(&mg);
    test_summary("one rank");
    fflush(stdout);  // the caller _exits, which skips stdio
    return g_tests_failed > 0 ? 1 : 0;
}

// a process's GPU: the node-local id under mpirun or srun (any task layout), else the rank, modulo -pg (0: the GPUs it
// sees); srun's SLURM_LOCALID only in an srun step whose SLURM_PROCID is this process's rank
static void test_device_choice(void) {
    CHECK(multi_gpu_device_index(-1, 11, 8, 8) == 3, "no local id: rank 11 %% -pg 8");
    CHECK(multi_gpu_device_index(5, 40, 8, 8) == 5, "srun -m cyclic: rank 40, local id 5 (not 40 %% 8 = 0)");
    CHECK(multi_gpu_device_index(3, 11, 0, 1) == 0, "--gpus-per-task=1 with -pg 0: the one GPU the task sees");
    CHECK(multi_gpu_device_index(-1, 3, 0, 4) == 3, "-pg 0: all four visible");
    CHECK_DIES("-pg 8 where a task sees one GPU", "rank 11: GPU 3 of this node wanted (-pg 8) but only 1 are visible "
               "(-pg 0 takes the GPUs this rank sees)", { multi_gpu_device_index(3, 11, 8, 1); });
    const char* names[3] = {"SLURM_STEP_NUM_TASKS", "SLURM_PROCID", "SLURM_LOCALID"};
    char* saved[3];
    for (int i = 0; i < 3; i++) { saved[i] = getenv(names[i]) ? strdup(getenv(names[i])) : NULL; }
    setenv("SLURM_STEP_NUM_TASKS", "64", 1);
    setenv("SLURM_PROCID", "40", 1);
    setenv("SLURM_LOCALID", "5", 1);
    CHECK(multi_gpu_srun_local_id(40) == 5, "srun task 40: SLURM_LOCALID 5");
    CHECK(multi_gpu_srun_local_id(41) == -1, "a process of rank 41 started by task 40: not its local id");
    setenv("SLURM_LOCALID", "5x", 1);
    CHECK(multi_gpu_srun_local_id(40) == -1, "SLURM_LOCALID not a number: none");
    setenv("SLURM_LOCALID", "5", 1);
    unsetenv("SLURM_STEP_NUM_TASKS");  // a batch script's own shell, not an srun step
    CHECK(multi_gpu_srun_local_id(40) == -1, "outside an srun step: none");
    for (int i = 0; i < 3; i++) {
        if (saved[i] != NULL) { setenv(names[i], saved[i], 1); free(saved[i]); } else { unsetenv(names[i]); }
    }
}

int main(void) {
    // the checks that fork a child which must exit with one line come first, before this process
    // touches NCCL (run_one_rank's comment)
    char watchdog_dir[256];
    test_make_temp_dir(watchdog_dir, sizeof(watchdog_dir));
    test_watchdog(watchdog_dir);
    test_remove_dir(watchdog_dir);
    test_lone_ranks();
    test_id_file_of_another_run_not_taken();
    test_id_file_named_by_slurm_job();
    test_device_choice();
    CHECK_DIES("bad rank", "-pr", { MultiGpuOptions o = fs_options(2, 2, "/tmp", 5); multi_gpu_options_check(&o); });
    CHECK_DIES("bad method", "-pi", { multi_gpu_init_method_from_name("slurm"); });
    CHECK_DIES("bad server", "-ps", { multi_gpu_parse_server("not-an-ip"); });
    // port 0 would have rank 0 listen on a port the kernel picks, which no other rank can know
    CHECK_DIES("server port 0", "flag -ps (port): 0 is out of range (expected 1..65535)", { multi_gpu_parse_server("127.0.0.1:0"); });
    CHECK_DIES("server port 65536", "flag -ps (port): 65536 is out of range", { multi_gpu_parse_server("127.0.0.1:65536"); });
    check_options_refused("-pn 0", "flag -pn", 0, 0, 1, 5);
    check_options_refused("-pr -1", "flag -pr", 2, -1, 1, 5);
    check_options_refused("-pg -1", "flag -pg", 2, 0, -1, 5);
    check_options_refused("-pt 0", "flag -pt", 2, 0, 1, 0);
    int version = 0;
    ncclGetVersion(&version);
    printf("NCCL runtime %d, headers %d\n", version, NCCL_VERSION_CODE);
    // NCCL before 2.30 refuses two ranks on one GPU; the two processes must fork before CUDA starts here
    if (version >= TWO_RANK_MIN_NCCL) {
        setenv("NCCL_MULTI_RANK_GPU_ENABLE", "1", 1);
        test_two_ranks();
    } else if (getenv("LLM8_ALLOW_NO_TWO_RANKS") != NULL && strcmp(getenv("LLM8_ALLOW_NO_TWO_RANKS"), "1") == 0) {
        printf("SKIP two ranks on one GPU: NCCL %d is older than 2.30 (needs NCCL_MULTI_RANK_GPU_ENABLE=1 support); "
               "LLM8_ALLOW_NO_TWO_RANKS=1 lets this run pass without them\n", version);
    } else {  // a green make gpucheck includes the 2-rank tests
        CHECK(false, "two ranks on one GPU: NCCL %d is older than 2.30, the first that allows them "
              "(NCCL_MULTI_RANK_GPU_ENABLE=1): pip install 'nvidia-nccl-cu13>=2.30' and rebuild "
              "(doc/gpu-environment.md), or set LLM8_ALLOW_NO_TWO_RANKS=1 to pass without the 2-rank tests", version);
    }
    char dir[256];
    test_make_temp_dir(dir, sizeof(dir));
    fflush(stdout);
    pid_t one_rank = fork();
    if (one_rank == 0) { _exit(run_one_rank(dir)); }
    int one_rank_status = wait_child(one_rank, CHILD_TIME_LIMIT_S * 3);
    CHECK(one_rank_status == 0, "one rank: exited with %d (failures above; -1: crash or hang)", one_rank_status);
    test_replica_fingerprints();
    MultiGpuOptions single = fs_options(1, 0, dir, RANK_TIMEOUT_S);
    MultiGpuConfig plain = multi_gpu_config_init(&single, 0);
    CHECK(plain.nccl_comm == NULL, "one process without -pi: a communicator was made");
    CHECK(multi_gpu_all_reduce_float(&plain, 2.5f, ncclSum, plain.nccl_stream, "loss") == 2.5f, "one process: all-reduce changed the value");
    multi_gpu_config_free(&plain);
    test_remove_dir(dir);
    test_mean_of_fp32_sums_rounds_once();
    test_owned_weight_part_at_range_edges();
    check_server_address("10.1.2.3", "10.1.2.3", MULTI_GPU_DEFAULT_PORT);
    check_server_address("127.0.0.1:4242", "127.0.0.1", 4242);
    test_stale_id_file_removed_by_rank_0_only();
    return test_summary("test_multi_gpu");
}
