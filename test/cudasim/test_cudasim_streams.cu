/*
test_cudasim_streams.cu: cudasim's streams find missing synchronization (run under cudasim
only: on a GPU the unsynchronized cases are races whose outcome depends on timing).

cudasim queues each stream's work and runs it, when the host must observe it, in a
pseudo-random order among the streams whose next work may start. So:
- a reader on one stream that waits (cudaStreamWaitEvent) for a writer on another always sees
  the written value; without the wait some trials see the old one;
- the legacy default stream orders work with blocking streams, not with non-blocking ones;
- a host write to a cudaMallocHost buffer before the copy reading it has run (its event not
  synchronized) reaches the device; a pageable source is staged at the call;
- cudaMemcpyAsync into pageable memory returns with the copy done;
- a kernel's arguments are taken at the launch;
- a collective of a nonblocking NCCL communicator returns ncclInProgress and reaches its
  stream at the next ncclCommGetAsyncError, so a kernel the host puts on that stream before
  it polls runs first (as it may on a GPU, where NCCL's own thread launches the collective);
  a blocking communicator's collective is on its stream when the call returns.
*/
#include <nccl.h>
#include "llmc/cuda_common.h"
#include "test/test_harness.h"

static const int N = 1024;
static const int TRIALS = 32;

__global__ void fill_kernel(int* x, int n, int value) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) { x[i] = value; }
}

__global__ void copy_kernel(int* out, const int* in, int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) { out[i] = in[i]; }
}

// trials in which y, copied from x on `reader` after x was filled on `writer`, misses the fill
static int stale_trials(cudaStream_t writer, cudaStream_t reader, bool wait, int* x, int* y) {
    cudaEvent_t written;
    cudaCheck(cudaEventCreateWithFlags(&written, cudaEventDisableTiming));
    int stale = 0;
    int* host = (int*)malloc(N * sizeof(int));
    for (int trial = 0; trial < TRIALS; trial++) {
        cudaCheck(cudaMemset(x, 0, N * sizeof(int)));
        cudaCheck(cudaDeviceSynchronize());
        fill_kernel<<<4, 64, 0, writer>>>(x, N, trial + 1);
        cudaCheck(cudaEventRecord(written, writer));
        if (wait) { cudaCheck(cudaStreamWaitEvent(reader, written, 0)); }
        copy_kernel<<<4, 64, 0, reader>>>(y, x, N);
        cudaCheck(cudaStreamSynchronize(reader));
        cudaCheck(cudaMemcpy(host, y, N * sizeof(int), cudaMemcpyDeviceToHost));
        if (host[0] != trial + 1) { stale++; }
        cudaCheck(cudaDeviceSynchronize());
    }
    free(host);
    cudaCheck(cudaEventDestroy(written));
    return stale;
}

// polls until the communicator's last call has settled; its final state
static ncclResult_t settle(ncclComm_t comm, ncclResult_t result) {
    while (result == ncclInProgress) {
        if (ncclCommGetAsyncError(comm, &result) != ncclSuccess) { return ncclInternalError; }
    }
    return result;
}

// a one-rank all-reduce of x (5) into y on `stream`, then y filled with 7 on the same stream
// before the host polls: what y holds after both, and what the all-reduce call returned
static int collective_then_fill(bool blocking, int* x, int* y, cudaStream_t stream, ncclResult_t* returned) {
    ncclUniqueId id;
    ncclComm_t comm;
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = blocking ? 1 : 0;
    CHECK(ncclGetUniqueId(&id) == ncclSuccess, "ncclGetUniqueId");
    ncclResult_t created = ncclCommInitRankConfig(&comm, 1, id, 0, &config);  // comm is set before it is polled
    CHECK(settle(comm, created) == ncclSuccess, "one-rank communicator");
    fill_kernel<<<4, 64, 0, stream>>>(x, N, 5);
    cudaCheck(cudaStreamSynchronize(stream));
    *returned = ncclAllReduce(x, y, N, ncclInt32, ncclSum, comm, stream);
    fill_kernel<<<4, 64, 0, stream>>>(y, N, 7);
    CHECK(settle(comm, *returned) == ncclSuccess, "the all-reduce did not settle");
    cudaCheck(cudaStreamSynchronize(stream));
    int host = 0;
    cudaCheck(cudaMemcpy(&host, y + N - 1, sizeof(int), cudaMemcpyDeviceToHost));
    CHECK(settle(comm, ncclCommFinalize(comm)) == ncclSuccess && ncclCommDestroy(comm) == ncclSuccess, "communicator end");
    return host;
}

int main() {
    int *x, *y;
    cudaCheck(cudaMalloc(&x, N * sizeof(int)));
    cudaCheck(cudaMalloc(&y, N * sizeof(int)));
    cudaStream_t first, second, blocking;
    cudaCheck(cudaStreamCreateWithFlags(&first, cudaStreamNonBlocking));
    cudaCheck(cudaStreamCreateWithFlags(&second, cudaStreamNonBlocking));
    cudaCheck(cudaStreamCreate(&blocking));

    int stale = stale_trials(first, second, true, x, y);
    CHECK(stale == 0, "with cudaStreamWaitEvent: %d of %d trials read before the write", stale, TRIALS);
    stale = stale_trials(first, second, false, x, y);
    CHECK(stale > 0 && stale < TRIALS, "without cudaStreamWaitEvent: %d of %d trials read before the write "
          "(a missing wait must show in some trials, in a random order not all)", stale, TRIALS);

    stale = stale_trials(0, blocking, false, x, y);
    CHECK(stale == 0, "legacy stream then blocking stream: %d of %d trials unordered", stale, TRIALS);
    stale = stale_trials(blocking, 0, false, x, y);
    CHECK(stale == 0, "blocking stream then legacy stream: %d of %d trials unordered", stale, TRIALS);
    stale = stale_trials(0, first, false, x, y);
    CHECK(stale > 0, "legacy stream then non-blocking stream: never unordered in %d trials", TRIALS);

    // pinned source: read when the copy runs; pageable source: staged at the call
    int* pinned;
    cudaCheck(cudaMallocHost((void**)&pinned, N * sizeof(int)));
    int* pageable = (int*)malloc(N * sizeof(int));
    int* host = (int*)malloc(N * sizeof(int));
    cudaEvent_t uploaded;
    cudaCheck(cudaEventCreate(&uploaded));
    for (int synchronized = 0; synchronized < 2; synchronized++) {
        pinned[0] = 1;
        cudaCheck(cudaMemcpyAsync(x, pinned, N * sizeof(int), cudaMemcpyHostToDevice, first));
        cudaCheck(cudaEventRecord(uploaded, first));
        if (synchronized) { cudaCheck(cudaEventSynchronize(uploaded)); }
        pinned[0] = 2;  // the next upload's data, written early when not synchronized
        cudaCheck(cudaMemcpyAsync(host, x, sizeof(int), cudaMemcpyDeviceToHost, first));  // pageable: returns done
        CHECK(host[0] == (synchronized ? 1 : 2), "pinned upload %s the event: the device has %d",
              synchronized ? "synchronized by" : "not synchronized by", host[0]);
    }
    pageable[0] = 1;
    cudaCheck(cudaMemcpyAsync(x, pageable, N * sizeof(int), cudaMemcpyHostToDevice, first));
    pageable[0] = 2;
    cudaCheck(cudaMemcpyAsync(host, x, sizeof(int), cudaMemcpyDeviceToHost, first));
    CHECK(host[0] == 1, "pageable upload: the device has %d, not the value at the call", host[0]);

    // arguments at the launch: the value changes after it, before the work runs
    int value = 7;
    fill_kernel<<<1, 32, 0, second>>>(y, N, value);
    value = 8;
    cudaCheck(cudaMemcpyAsync(host, y, N * sizeof(int), cudaMemcpyDeviceToHost, second));
    CHECK(host[0] == 7 && host[N - 1] == 7, "a kernel argument changed after the launch reached the kernel (%d)", host[0]);
    CHECK(cudaEventQuery(uploaded) == cudaSuccess, "the event of a finished stream is not complete");

    ncclResult_t returned;
    int after = collective_then_fill(false, x, y, first, &returned);
    CHECK(returned == ncclInProgress && after == 5, "nonblocking all-reduce: returned %d (expected ncclInProgress), "
          "then y = %d (expected 5: the fill put on the stream before the poll ran first)", (int)returned, after);
    after = collective_then_fill(true, x, y, first, &returned);
    CHECK(returned == ncclSuccess && after == 7, "blocking all-reduce: returned %d (expected ncclSuccess), then y = %d "
          "(expected 7: the fill after the collective)", (int)returned, after);

    cudaCheck(cudaEventDestroy(uploaded));
    cudaCheck(cudaFreeHost(pinned));
    free(pageable);
    free(host);
    cudaCheck(cudaStreamDestroy(first));
    cudaCheck(cudaStreamDestroy(second));
    cudaCheck(cudaStreamDestroy(blocking));
    cudaCheck(cudaFree(x));
    cudaCheck(cudaFree(y));
    return test_summary("test_cudasim_streams");
}
