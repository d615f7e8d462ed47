/*
fused_classifier.cuh: softmax, cross-entropy loss and the logits' gradient in one kernel.

Why: the logits are the largest tensor of the step (B*T*Vp bf16, 6.6 GB at B=64, T=1024),
so every extra pass over them is expensive and no probabilities are ever stored. One
block owns one row (a thread per 16 bytes of it, at most 512 threads, each with 4 loads in
flight: the SASS of one load at a time showed the kernel waiting on memory). It reads the row
once, keeping an online softmax (running maximum and the sum of exp(x - maximum), rescaled
when the maximum grows), then combines the threads' (max, sum) pairs, first by an xor
butterfly inside each warp (lane 0's pair is the warp's; on the GPU the partners' sums may
differ in the last bit, as ptxas folds a different product into an FMA on each side) and then
across warps in warp order: the result does not depend on timing. If the gradient is wanted, a second read of the row (mostly from L2) overwrites
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

#define CLASSIFIER_BLOCK_SIZE 512
#define CLASSIFIER_LOADS 4  // 16-byte loads a thread has in flight in each pass over its row

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

/*
e^(x - max) of a logit, as 2^((x - max) log2(e)): an add, a multiply and one exp2_approx, where
expf's range reduction took about 10 instructions, twice a logit, in a kernel bound by its
instruction issue (the first pass had about 24 instructions a logit by the SASS; about 8 since
the whole chunks run without column tests and odd elements convert in one instruction,
x128_float). The difference
first, so that no logit size overflows (max log2(e) does above 2.4e38); the roundings and the
approximate exp2 add a relative error of about 3e-6 to the terms that count (x - max > -20), far
below the bf16 gradient's 4e-3; terms below 2^-126 (of a sum >= 1, and gradients below bf16's
reach at dloss = 1/(B T)) become 0.
*/
#define CLASSIFIER_LOG2E 1.4426950408889634f
__device__ __forceinline__ float classifier_exp(float x, float max) { return exp2_approx((x - max) * CLASSIFIER_LOG2E); }

/*
Per chunk of 8 logits from column `column`. WHOLE: every column is below V (all chunks of a
row but the one V falls in and the padding chunks after it), so none is tested. The kernel
walks the whole chunks in loops of their own and the few others after them: with the test in
the one loop, the compiler predicated every column (about 3 instructions a logit, in each
pass), and with a branch between two versions in it, it merged them back into that code.
*/
// the running stats after the chunk x
template <bool WHOLE>
__device__ __forceinline__ SoftmaxStats softmax_stats_add_chunk(SoftmaxStats stats, x128 x, int column, int V) {
    float chunk_max = -FLT_MAX;
    for (int k = 0; k < x128::size; k++) {
        if (WHOLE || column + k < V) { chunk_max = fmaxf(chunk_max, x128_float(x, k)); }
    }
    float new_max = fmaxf(stats.max, chunk_max);
    float sum = __fmul_rn(stats.sum, expf(stats.max - new_max));  // rounded before the first term is added: no FFMA
    for (int k = 0; k < x128::size; k++) {
        if (WHOLE || column + k < V) { sum += classifier_exp(x128_float(x, k), new_max); }
    }
    SoftmaxStats updated = {new_max, sum};
    return updated;
}

/*
The chunk x's gradients (softmax - onehot(target)) * dloss, 0 from V on: written over it in
bf16, or as the E5M2 codes under `scale` into code_row, counted in tally.
*/
template <bool WHOLE>
__device__ __forceinline__ void classifier_write_chunk_gradients(floatX* row, uint8_t* code_row, x128 x, int column, int V,
                                                                 int target, float row_max, float inverse_sum, float dloss,
                                                                 float scale, Fp8Format format, Fp8Tally* tally) {
    const unsigned int target_k = (unsigned int)target - (unsigned int)column;  // below 8 in the target's chunk only
    float g[x128::size];
    for (int k = 0; k < x128::size; k++) {
        g[k] = 0.0f;
        if (WHOLE || column + k < V) {
            float probability = classifier_exp(x128_float(x, k), row_max) * inverse_sum;
            g[k] = (probability - ((unsigned int)k == target_k ? 1.0f : 0.0f)) * dloss;
        }
    }
    x128 grad = x128_from_floats(g);
    if (code_row != NULL) {
        float values[x128::size];
        for (int k = 0; k < x128::size; k++) { values[k] = x128_float(grad, k); }
        uint2 codes = fp8_quantize8(values, scale, format);
        const uint32_t chunk_amax_bits = x128_amax_bits(grad);  // where it cannot saturate, count flushes only
        tally->amax_bits = max(tally->amax_bits, chunk_amax_bits);
        fp8_tally_counts8(tally, values, codes, scale, format, fp8_may_saturate(bits_as_float(chunk_amax_bits), scale, format),
                          packed_zero_count(grad));
        *reinterpret_cast<uint2*>(code_row + column) = codes;
    } else {
        store128cs(row + column, grad);
    }
}

// one block per row; each thread walks its whole chunks (threadIdx.x, + blockDim.x, ...) in order,
// loading CLASSIFIER_LOADS of them before it uses the first (two 512-thread blocks per SM at
// up to 64 registers: 64 KB in flight per SM, and one block's barrier and reduction overlap
// the other's loads)
__global__ void __launch_bounds__(CLASSIFIER_BLOCK_SIZE, 2)
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
    const int whole_chunks = V / x128::size;  // the chunks with no column from V on
    const int batch_stride = CLASSIFIER_LOADS * blockDim.x;
    SoftmaxStats stats = {-FLT_MAX, 0.0f};
    for (int first = threadIdx.x; first < whole_chunks; first += batch_stride) {
        x128 loaded[CLASSIFIER_LOADS];
        load128_batch<CLASSIFIER_LOADS, false>(loaded, row, first, blockDim.x, whole_chunks, x128::size);
#pragma unroll
        for (int j = 0; j < CLASSIFIER_LOADS; j++) {
            const int i = first + j * blockDim.x;
            if (i < whole_chunks) { stats = softmax_stats_add_chunk<true>(stats, loaded[j], i * x128::size, V); }
        }
    }
    // the chunk V falls in is the last of its thread's walk with real columns (the padding chunks
    // after it add nothing), so the sums are those of one walk over every chunk in order
    if (whole_chunks < chunks && threadIdx.x == whole_chunks % blockDim.x) {
        stats = softmax_stats_add_chunk<false>(stats, load128(row + whole_chunks * x128::size), whole_chunks * x128::size, V);
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
    const Fp8Format format = dlogits_fp8.format;
    Fp8Tally tally = fp8_tally_zero();
    for (int first = threadIdx.x; first < whole_chunks; first += batch_stride) {
        x128 loaded[CLASSIFIER_LOADS];
        load128_batch<CLASSIFIER_LOADS, true>(loaded, row, first, blockDim.x, whole_chunks, x128::size);
#pragma unroll
        for (int j = 0; j < CLASSIFIER_LOADS; j++) {
            const int i = first + j * blockDim.x;
            if (i >= whole_chunks) { break; }
            classifier_write_chunk_gradients<true>(row, code_row, loaded[j], i * x128::size, V, target, row_stats.max,
                                                   inverse_sum, dloss, scale, format, &tally);
        }
    }
    for (int i = whole_chunks + threadIdx.x; i < chunks; i += blockDim.x) {  // the chunk V falls in, and the padding
        classifier_write_chunk_gradients<false>(row, code_row, load128cs(row + i * x128::size), i * x128::size, V, target,
                                                row_stats.max, inverse_sum, dloss, scale, format, &tally);
    }
    if (code_row != NULL) { fp8_tally_commit(tally, dlogits_fp8.record, false); }
}

// one thread per 16-byte chunk of a row, in whole warps, at most CLASSIFIER_BLOCK_SIZE (GPT-2's
// rows of 6288 chunks: 512 threads striding); a function of Vp only, so the bits are too
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
