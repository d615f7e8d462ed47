/*
fused_classifier.cuh: softmax, cross-entropy loss and the logits' gradient in one kernel.

Why: the logits are the largest tensor of the step (B*T*Vp bf16, 6.6 GB at B=64, T=1024),
so every extra pass over them is expensive and no probabilities are ever stored. One
block owns one row. It reads the row once, keeping an online softmax (running maximum and
the sum of exp(x - maximum), rescaled when the maximum grows), then combines the threads'
(max, sum) pairs, first by an xor butterfly inside each warp (both partners compute the
same commutative sum, so every lane ends with identical bits) and then across warps in
warp order: the result does not depend on timing. If the gradient is wanted, a second read
of the row (mostly from L2) overwrites it in place with (softmax - onehot) * dloss, and
with zeros in the padding columns V..Vp, so the lm_head backward never sees garbage. An FP8
lm_head under current scaling needs the amax of those gradients before its cast: the kernel
folds it into the cast record as it writes them (dlogits_record), which spares the backward a
full pass over the logits just to find it (matmul_backward_fp8_dout, FP8_DOUT_AMAX_RECORDED).
A target outside [0, V) gives a NaN loss rather than a read out of bounds: the trainer
treats a non-finite loss as a skipped step, so a bad token is loud, not silent.
*/
#ifndef LLMC_FUSED_CLASSIFIER_CUH
#define LLMC_FUSED_CLASSIFIER_CUH

#include <float.h>
#include "cuda_common.h"
#include "cuda_utils.cuh"
#include "fp8_scaling.cuh"

#define CLASSIFIER_BLOCK_SIZE 1024

typedef struct {
    float max;  // running maximum of the logits seen
    float sum;  // sum of exp(logit - max) over them
} SoftmaxStats;

// -FLT_MAX (not -inf) marks "nothing seen yet", so combining two empty stats gives exp(0) * 0
__device__ __forceinline__ SoftmaxStats softmax_stats_combine(SoftmaxStats a, SoftmaxStats b) {
    SoftmaxStats combined;
    combined.max = fmaxf(a.max, b.max);
    combined.sum = a.sum * expf(a.max - combined.max) + b.sum * expf(b.max - combined.max);
    return combined;
}

__global__ void __launch_bounds__(CLASSIFIER_BLOCK_SIZE)
fused_classifier_kernel(floatX* logits, float* losses, float dloss, const int* targets,
                        int V, int Vp, int write_dlogits, Fp8CastRecord* dlogits_record) {
    __shared__ SoftmaxStats warp_stats[CLASSIFIER_BLOCK_SIZE / WARP_SIZE];
    const int lane = threadIdx.x % WARP_SIZE;
    const int warp = threadIdx.x / WARP_SIZE;
    const int num_warps = blockDim.x / WARP_SIZE;
    floatX* row = logits + (size_t)blockIdx.x * Vp;
    const int target = targets[blockIdx.x];
    const int target_valid = target >= 0 && target < V;
    float target_logit = 0.0f;
    if (threadIdx.x == 0 && target_valid) { target_logit = __bfloat162float(row[target]); }

    const int chunks = Vp / x128::size;
    SoftmaxStats stats = {-FLT_MAX, 0.0f};
    for (int i = threadIdx.x; i < chunks; i += blockDim.x) {
        x128 x = load128(row + i * x128::size);
        float chunk_max = -FLT_MAX;
        for (int k = 0; k < x128::size; k++) {
            if (i * x128::size + k < V) { chunk_max = fmaxf(chunk_max, __bfloat162float(x[k])); }
        }
        float new_max = fmaxf(stats.max, chunk_max);
        float sum = stats.sum * expf(stats.max - new_max);
        for (int k = 0; k < x128::size; k++) {
            if (i * x128::size + k < V) { sum += expf(__bfloat162float(x[k]) - new_max); }
        }
        stats.max = new_max;
        stats.sum = sum;
    }
    for (int offset = WARP_SIZE / 2; offset > 0; offset /= 2) {
        SoftmaxStats other;
        other.max = __shfl_xor_sync(0xffffffffu, stats.max, offset);
        other.sum = __shfl_xor_sync(0xffffffffu, stats.sum, offset);
        stats = softmax_stats_combine(stats, other);
    }
    if (lane == 0) { warp_stats[warp] = stats; }
    __syncthreads();
    SoftmaxStats row_stats = warp_stats[0];
    for (int w = 1; w < num_warps; w++) { row_stats = softmax_stats_combine(row_stats, warp_stats[w]); }

    if (threadIdx.x == 0) {
        float loss = target_valid ? logf(row_stats.sum) + row_stats.max - target_logit : __int_as_float(0x7fc00000);
        losses[blockIdx.x] += loss;
    }
    if (!write_dlogits) { return; }
    const float inverse_sum = 1.0f / row_stats.sum;
    Fp8Tally tally = fp8_tally_zero();
    for (int i = threadIdx.x; i < chunks; i += blockDim.x) {
        x128 x = load128cs(row + i * x128::size);
        x128 grad;
        for (int k = 0; k < x128::size; k++) {
            int column = i * x128::size + k;
            float g = 0.0f;
            if (column < V) {
                float probability = expf(__bfloat162float(x[k]) - row_stats.max) * inverse_sum;
                g = (probability - (column == target ? 1.0f : 0.0f)) * dloss;
            }
            grad[k] = __float2bfloat16_rn(g);
            fp8_tally_amax(&tally, __bfloat162float(grad[k]));
        }
        store128cs(row + i * x128::size, grad);
    }
    if (dlogits_record != NULL) { fp8_tally_commit(tally, dlogits_record, true); }
}

// logits: [B*T][Vp] bf16, the first V columns real. losses[bt] += -log softmax[target];
// if write_dlogits, logits is overwritten with (softmax - onehot(target)) * dloss, 0 in V..Vp,
// and dlogits_record (may be NULL) receives their amax, as a use (record->amax_bits)
void fused_classifier(floatX* logits, float* losses, float dloss, const int* targets, int B, int T, int V, int Vp,
                      int write_dlogits, Fp8CastRecord* dlogits_record, cudaStream_t stream) {
    if (V <= 0 || Vp < V || Vp % 8 != 0) {
        llm8_die("fused_classifier: V=%d, Vp=%d: need 0 < V <= Vp and Vp a multiple of 8 (16-byte rows)", V, Vp);
    }
    if (dlogits_record != NULL && !write_dlogits) { llm8_die("fused_classifier: an amax record without dlogits to take it of"); }
    fused_classifier_kernel<<<B * T, CLASSIFIER_BLOCK_SIZE, 0, stream>>>(logits, losses, dloss, targets, V, Vp,
                                                                         write_dlogits, dlogits_record);
    cudaCheck(cudaGetLastError());
}

#endif // LLMC_FUSED_CLASSIFIER_CUH
