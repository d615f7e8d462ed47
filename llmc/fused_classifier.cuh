/*
fused_classifier.cuh: softmax, cross-entropy loss and the logits' gradient in one kernel.

Why: the logits are the largest tensor of the step (B*T*Vp bf16, 6.6 GB at B=64, T=1024),
so every extra pass over them is expensive and no probabilities are ever stored. One
block owns one row (a thread per 16 bytes of it, at most 1024 threads). It reads the row
once, keeping an online softmax (running maximum and the sum of exp(x - maximum), rescaled
when the maximum grows), then combines the threads' (max, sum) pairs, first by an xor
butterfly inside each warp (both partners compute the same commutative sum, so every lane
ends with identical bits) and then across warps in warp order: the result does not depend
on timing. If the gradient is wanted, a second read of the row (mostly from L2) overwrites
it in place with (softmax - onehot) * dloss, and with zeros in the padding columns V..Vp, so
the lm_head backward never sees garbage. An FP8
lm_head whose backward GEMMs are both FP8 (per-tensor recipes) reads no bf16 gradient at all:
the second read writes the E5M2 codes instead (dlogits_fp8: 1 byte per element instead of 2,
and no cast pass re-reads 2 bytes per element), with the scale of the gradients' bound
|(softmax - onehot) * dloss| <= dloss, which the state took before the kernel ran
(fp8_gradient_recipe, fp8_model_begin_dlogits). The codes are those of the bf16 gradient, as a
cast of the bf16 gradients would write them; the row-major codes only (a block owns a row),
lm_head's backward transposes them for wgrad. The logits stay as they were.
A target outside [0, V) gives a NaN loss rather than a read out of bounds: the trainer
treats a non-finite loss as a skipped step, so a bad token is loud, not silent.
*/
#ifndef LLMC_FUSED_CLASSIFIER_CUH
#define LLMC_FUSED_CLASSIFIER_CUH

#include <float.h>
#include "cuda_common.h"
#include "cuda_utils.cuh"
#include "fp8_cast.cuh"

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
                        int V, int Vp, int write_dlogits, Fp8CastOutput dlogits_fp8) {
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
    uint8_t* code_row = dlogits_fp8.codes != NULL ? dlogits_fp8.codes + (size_t)blockIdx.x * Vp : NULL;
    const float scale = code_row != NULL ? dlogits_fp8.state->scale : 0.0f;
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
        }
        if (code_row != NULL) {
            uint8_t codes[x128::size];
            for (int k = 0; k < x128::size; k++) {
                float value = __bfloat162float(grad[k]);
                codes[k] = fp8_quantize(value, scale, dlogits_fp8.format);
                fp8_tally_cast(&tally, value, scale, codes[k], dlogits_fp8.format);
            }
            *reinterpret_cast<uint2*>(code_row + i * x128::size) = fp8_pack8(codes);
        } else {
            store128cs(row + i * x128::size, grad);
        }
    }
    if (code_row != NULL) { fp8_tally_commit(tally, dlogits_fp8.record, false); }
}

// one thread per 16-byte chunk of a row, in whole warps, at most CLASSIFIER_BLOCK_SIZE (GPT-2's
// rows of 6288 chunks: 1024 threads striding); a function of Vp only, so the bits are too
static unsigned int fused_classifier_block_size(int Vp) {
    int threads = ceil_div(Vp / x128::size, WARP_SIZE) * WARP_SIZE;
    return (unsigned int)(threads < CLASSIFIER_BLOCK_SIZE ? threads : CLASSIFIER_BLOCK_SIZE);
}

/*
logits: [B*T][Vp] bf16, the first V columns real. losses[bt] += -log softmax[target]. If
write_dlogits, the gradients (softmax - onehot(target)) * dloss, 0 in V..Vp, are written:
over the logits in bf16, or with dlogits_fp8 != NULL (per tensor, codes only: its state
holds the scale) as the codes [B*T][Vp] of the bf16 gradients, counted in its record (no
amax recorded as a use), the logits left as they were.
*/
void fused_classifier(floatX* logits, float* losses, float dloss, const int* targets, int B, int T, int V, int Vp,
                      int write_dlogits, const Fp8CastOutput* dlogits_fp8, cudaStream_t stream) {
    if (V <= 0 || Vp < V || Vp % 8 != 0) {
        llm8_die("fused_classifier: V=%d, Vp=%d: need 0 < V <= Vp and Vp a multiple of 8 (16-byte rows)", V, Vp);
    }
    Fp8CastOutput codes_only = {};
    if (dlogits_fp8 != NULL) {
        if (!write_dlogits) { llm8_die("fused_classifier: FP8 codes of the gradients, but no gradients asked for"); }
        fp8_cast_check(dlogits_fp8, B * T, Vp, "fused_classifier");
        if (dlogits_fp8->scaling != FP8_SCALING_TENSOR || dlogits_fp8->codes == NULL || dlogits_fp8->codes_t != NULL) {
            llm8_die("fused_classifier: the gradients' codes are per tensor and row-major only (a block owns a row)");
        }
        codes_only = *dlogits_fp8;
    }
    fused_classifier_kernel<<<B * T, fused_classifier_block_size(Vp), 0, stream>>>(logits, losses, dloss, targets, V, Vp,
                                                                                  write_dlogits, codes_only);
    cudaCheck(cudaGetLastError());
}

#endif // LLMC_FUSED_CLASSIFIER_CUH
