/*
encoder.cuh: token + position embedding, forward and backward.

Why: the forward is a gather, one 16-byte vector per thread, a block per row. The backward is a scatter-add
into wte rows, where many positions share a token; the usual float atomicAdd would make
the gradient depend on thread timing. Instead the host, which has the batch's tokens
anyway, sorts the positions by token (a stable counting sort, so positions stay in
increasing order) into one "bucket" per distinct token. One thread block owns one bucket
and sums its positions in that fixed order, then adds the sum into the wte row: no two
blocks write the same row, and the order of every sum is fixed, so the result is the same
bits on every run. Buckets are launched largest first, so a very frequent token (newline,
"the") starts early instead of being the tail of the launch. dwpe is a plain column sum
over the batch, in b order.

The bucket lists go to the GPU in one async copy from pinned memory. The host waits for
the previous call's copy (an event, normally long finished) before reusing the pinned
buffer, so it never races an in-flight copy; the GPU work itself is never synchronized.
All calls must use the same stream (the device workload buffer is reused in stream order).
*/
#ifndef LLMC_ENCODER_CUH
#define LLMC_ENCODER_CUH

#include "cuda_common.h"
#include "cuda_utils.cuh"

// ----------------------------------------------------------------------------
// forward: out[b][t][:] = wte[inp[b][t]][:] + wpe[t][:]

// One block per row (grid x: B*T rows fit its 2^31 - 1, not grid y's 65535), its threads
// across the row's 16-byte chunks (grid y where a row is wider than a block). The row's token
// and position come from the block index: no division per thread (a flat index took two, about
// half the kernel's instructions by the SASS), and the wpe load does not wait for the token's.
__global__ void encoder_forward_kernel(floatX* out, const int* inp, const floatX* wte, const floatX* wpe, int T, int C) {
    const int bt = blockIdx.x;
    const int c = (blockIdx.y * blockDim.x + threadIdx.x) * x128::size;
    if (c >= C) { return; }
    x128 position_vec = load128(wpe + (size_t)(bt % T) * C + c);  // rows of wpe: reused across b
    x128 token_vec = load128cs(wte + (size_t)inp[bt] * C + c);    // rows of wte: scattered, read once
    x128 result;
    for (int k = 0; k < x128::size; k++) {
        result[k] = __float2bfloat16_rn(x128_float(token_vec, k) + x128_float(position_vec, k));
    }
    store128(out + (size_t)bt * C + c, result);
}

static inline void encoder_check_channels(int C, const char* who) {
    if (C <= 0 || C % 8 != 0) {
        llm8_die("%s: channels C=%d must be a positive multiple of 8 (16-byte vector access)", who, C);
    }
}

void encoder_forward(floatX* out, const int* inp, const floatX* wte, const floatX* wpe,
                     int B, int T, int C, cudaStream_t stream) {
    encoder_check_channels(C, "encoder_forward");
    const int chunks = C / x128::size;
    const int block_size = chunks < 256 ? ceil_div(chunks, WARP_SIZE) * WARP_SIZE : 256;  // whole warps
    dim3 grid(B * T, ceil_div(chunks, block_size));
    encoder_forward_kernel<<<grid, block_size, 0, stream>>>(out, inp, wte, wpe, T, C);
    cudaCheck(cudaGetLastError());
}

// ----------------------------------------------------------------------------
// backward scratch: the bucket work list, built on the host per call

typedef struct {
    int max_BT;             // positions per call at most (B*T at creation)
    int vocab_size;         // token ids must be < vocab_size
    int* token_ends;        // host, [vocab_size + 1]: counting sort of positions by token
    int* sorted_positions;  // host, [max_BT]: positions grouped by token, ascending within a token
    int* size_slots;        // host, [max_BT + 2]: counting sort of buckets by size
    int* bucket_sizes;      // host, [max_BT]
    int* host_workload;     // pinned host, the layout of device_workload
    int* device_workload;   // device, [3 * max_BT + 1]: positions | bucket starts | bucket tokens
    cudaEvent_t upload_done;
} EncoderBackwardScratch;

// V bounds the token ids (the sort counts per token); B*T bounds the positions per call
EncoderBackwardScratch* encoder_backward_scratch_create(int B, int T, int V) {
    EncoderBackwardScratch* s = (EncoderBackwardScratch*)mallocCheck(sizeof(EncoderBackwardScratch));
    s->max_BT = B * T;
    s->vocab_size = V;
    s->token_ends = (int*)mallocCheck((size_t)(V + 1) * sizeof(int));
    s->sorted_positions = (int*)mallocCheck((size_t)s->max_BT * sizeof(int));
    s->size_slots = (int*)mallocCheck((size_t)(s->max_BT + 2) * sizeof(int));
    s->bucket_sizes = (int*)mallocCheck((size_t)s->max_BT * sizeof(int));
    size_t workload_bytes = (size_t)(3 * s->max_BT + 1) * sizeof(int);
    cudaCheck(cudaMallocHost((void**)&s->host_workload, workload_bytes));
    s->device_workload = (int*)cuda_malloc_checked(workload_bytes, "the encoder backward work list");
    cudaCheck(cudaEventCreateWithFlags(&s->upload_done, cudaEventDisableTiming));
    cudaCheck(cudaEventRecord(s->upload_done, 0));  // so the first call's wait returns at once
    return s;
}

void encoder_backward_scratch_free(EncoderBackwardScratch* s) {
    free(s->token_ends);
    free(s->sorted_positions);
    free(s->size_slots);
    free(s->bucket_sizes);
    cudaCheck(cudaFreeHost(s->host_workload));
    cudaCheck(cudaFree(s->device_workload));
    cudaCheck(cudaEventDestroy(s->upload_done));
    free(s);
}

/*
Fills host_workload = [positions (BT) | bucket_starts (num_buckets + 1) | bucket_tokens
(num_buckets)] back to back and returns num_buckets. Bucket k covers positions
[bucket_starts[k], bucket_starts[k+1]) (ascending bt), all holding token bucket_tokens[k];
buckets are ordered by size, largest first, ties by ascending token id. Linear time: two
counting sorts, by token and then by bucket size.
*/
static int encoder_build_buckets(EncoderBackwardScratch* s, const int* inputs_cpu, int BT) {
    const int V = s->vocab_size;
    int* token_ends = s->token_ends;
    memset(token_ends, 0, (size_t)(V + 1) * sizeof(int));
    for (int bt = 0; bt < BT; bt++) {
        int token = inputs_cpu[bt];
        if (token < 0 || token >= V) {
            llm8_die("encoder_backward: token id %d at position %d is outside the vocabulary [0, %d)", token, bt, V);
        }
        token_ends[token + 1]++;
    }
    for (int token = 0; token < V; token++) { token_ends[token + 1] += token_ends[token]; }
    // token_ends[token] is now the first slot of the token's run; filling advances it to the end
    for (int bt = 0; bt < BT; bt++) { s->sorted_positions[token_ends[inputs_cpu[bt]]++] = bt; }

    // bucket size n gets key BT - n, so ascending keys are descending sizes
    int* size_slots = s->size_slots;
    memset(size_slots, 0, (size_t)(BT + 2) * sizeof(int));
    int num_buckets = 0;
    for (int start = 0; start < BT; start = token_ends[inputs_cpu[s->sorted_positions[start]]]) {
        int size = token_ends[inputs_cpu[s->sorted_positions[start]]] - start;
        size_slots[BT - size + 1]++;
        num_buckets++;
    }
    for (int key = 0; key <= BT; key++) { size_slots[key + 1] += size_slots[key]; }
    int* positions = s->host_workload;
    int* bucket_starts = positions + BT;
    int* bucket_tokens = bucket_starts + num_buckets + 1;
    for (int start = 0; start < BT; ) {  // tokens ascend here, so equal sizes keep token order
        int token = inputs_cpu[s->sorted_positions[start]];
        int size = token_ends[token] - start;
        int slot = size_slots[BT - size]++;
        bucket_tokens[slot] = token;
        s->bucket_sizes[slot] = size;
        bucket_starts[slot] = start;  // temporarily: where the run starts in sorted_positions
        start += size;
    }
    int next = 0;
    for (int k = 0; k < num_buckets; k++) {
        memcpy(positions + next, s->sorted_positions + bucket_starts[k], (size_t)s->bucket_sizes[k] * sizeof(int));
        bucket_starts[k] = next;
        next += s->bucket_sizes[k];
    }
    bucket_starts[num_buckets] = next;
    return num_buckets;
}

// one block per bucket (blockIdx.x), blockIdx.y picks a slice of channels; each thread
// owns 8 channels and sums the bucket's positions in order, in fp32
__global__ void encoder_backward_wte_kernel(floatX* dwte, const floatX* dout, const int* workload,
                                           int BT, int num_buckets, int C) {
    const int* positions = workload;
    const int* bucket_starts = workload + BT;
    const int* bucket_tokens = bucket_starts + num_buckets + 1;
    int bucket = blockIdx.x;
    int c = (blockIdx.y * blockDim.x + threadIdx.x) * x128::size;
    if (c >= C) { return; }
    float sum[x128::size];
    for (int k = 0; k < x128::size; k++) { sum[k] = 0.0f; }
    int end = bucket_starts[bucket + 1];
    for (int i = bucket_starts[bucket]; i < end; i++) {
        x128 grad = load128cs(dout + (size_t)positions[i] * C + c);
        for (int k = 0; k < x128::size; k++) { sum[k] += x128_float(grad, k); }
    }
    floatX* row = dwte + (size_t)bucket_tokens[bucket] * C + c;
    x128 accumulated = load128(row);
    for (int k = 0; k < x128::size; k++) {
        accumulated[k] = __float2bfloat16_rn(x128_float(accumulated, k) + sum[k]);
    }
    store128(row, accumulated);
}

// dwpe[t][c] += sum over b of dout[b][t][c], b ascending; one thread per 8 channels of a t
__global__ void encoder_backward_wpe_kernel(floatX* dwpe, const floatX* dout, int B, int T, int C) {
    const int chunks_per_row = C / x128::size;
    int chunk = blockIdx.x * blockDim.x + threadIdx.x;
    if (chunk >= T * chunks_per_row) { return; }
    int t = chunk / chunks_per_row;
    int c = (chunk % chunks_per_row) * x128::size;
    float sum[x128::size];
    for (int k = 0; k < x128::size; k++) { sum[k] = 0.0f; }
    for (int b = 0; b < B; b++) {
        x128 grad = load128cs(dout + ((size_t)b * T + t) * C + c);
        for (int k = 0; k < x128::size; k++) { sum[k] += x128_float(grad, k); }
    }
    floatX* row = dwpe + (size_t)t * C + c;
    x128 accumulated = load128(row);
    for (int k = 0; k < x128::size; k++) {
        accumulated[k] = __float2bfloat16_rn(x128_float(accumulated, k) + sum[k]);
    }
    store128(row, accumulated);
}

// the event encoder_backward's next call waits for on the host (the previous call's upload
// out of the pinned buffer). With several ranks the work before it may wait for collectives
// (a weight gather's stages), so the caller waits for it first in bounded time (multi_gpu.h)
static inline cudaEvent_t encoder_backward_pending_upload(const EncoderBackwardScratch* scratch) {
    return scratch->upload_done;
}

// dwte += and dwpe += the gradient of the embedding sum; inputs_cpu is the host copy of
// the B*T tokens that encoder_forward read on the device
void encoder_backward(floatX* dwte, floatX* dwpe, const floatX* dout, const int* inputs_cpu, int B, int T, int C,
                      EncoderBackwardScratch* scratch, cudaStream_t stream) {
    encoder_check_channels(C, "encoder_backward");
    int BT = B * T;
    if (BT > scratch->max_BT) {
        llm8_die("encoder_backward: B*T=%d exceeds the %d positions its scratch was created for", BT, scratch->max_BT);
    }
    cudaCheck(cudaEventSynchronize(scratch->upload_done));  // the pinned buffer is free again
    int num_buckets = encoder_build_buckets(scratch, inputs_cpu, BT);
    size_t workload_bytes = (size_t)(BT + 2 * num_buckets + 1) * sizeof(int);  // the layout above
    cudaCheck(cudaMemcpyAsync(scratch->device_workload, scratch->host_workload, workload_bytes,
                              cudaMemcpyHostToDevice, stream));
    cudaCheck(cudaEventRecord(scratch->upload_done, stream));

    const int chunks_per_row = C / x128::size;
    int wte_block = chunks_per_row < 256 ? ceil_div(chunks_per_row, 32) * 32 : 256;
    dim3 wte_grid(num_buckets, ceil_div(chunks_per_row, wte_block));
    encoder_backward_wte_kernel<<<wte_grid, wte_block, 0, stream>>>(dwte, dout, scratch->device_workload,
                                                                   BT, num_buckets, C);
    cudaCheck(cudaGetLastError());
    const int wpe_block = 256;
    encoder_backward_wpe_kernel<<<ceil_div(T * chunks_per_row, wpe_block), wpe_block, 0, stream>>>(dwpe, dout, B, T, C);
    cudaCheck(cudaGetLastError());
}

#endif // LLMC_ENCODER_CUH
