/*
global_norm.cuh: the sum of squares of a bf16 tensor (the gradients), for the global
gradient norm and clipping.

Why: the norm decides the clipping factor of every weight, so it must be the same bits on
every run. The grid is a function of the size alone, never of the device: one block per
GLOBAL_NORM_BLOCK_SIZE 16-byte chunks, at most GLOBAL_NORM_BLOCKS (a grid that fills any
GPU; more blocks stride over the rest), so a small tensor does not launch a full grid of
idle blocks. Each block reduces its threads in a fixed order (block_reduce_sum) into one
partial; a one-block second kernel adds the partials in block order. No atomics, so the
same size always gives the same bits. The caller takes the square root (and may add
further tensors' results) on the device or the host.
*/
#ifndef LLMC_GLOBAL_NORM_CUH
#define LLMC_GLOBAL_NORM_CUH

#include "cuda_common.h"
#include "cuda_utils.cuh"

#define GLOBAL_NORM_BLOCKS 1024
#define GLOBAL_NORM_BLOCK_SIZE 512
#define GLOBAL_NORM_LOADS 4  // 16-byte loads a thread has in flight

// floats of the partials_scratch argument
size_t global_norm_scratch_floats(void) { return GLOBAL_NORM_BLOCKS; }

// the partials kernel's grid for `count` values (the count % 8 tail goes to block 0)
static unsigned int global_norm_blocks(size_t count) {
    size_t blocks = ceil_div_size(count / x128::size, GLOBAL_NORM_BLOCK_SIZE);
    return (unsigned int)(blocks < 1 ? 1 : blocks > GLOBAL_NORM_BLOCKS ? GLOBAL_NORM_BLOCKS : blocks);
}

// each thread sums its chunks in order, GLOBAL_NORM_LOADS of them loaded before it uses the first
__global__ void global_norm_partials_kernel(float* partials, const floatX* values, size_t count) {
    const int chunks = (int)(count / x128::size);
    const int step = gridDim.x * blockDim.x;
    float sum = 0.0f;
    for (int first = blockIdx.x * blockDim.x + threadIdx.x; first < chunks; first += GLOBAL_NORM_LOADS * step) {
        x128 loaded[GLOBAL_NORM_LOADS];
        load128_batch<GLOBAL_NORM_LOADS, true>(loaded, values, first, step, chunks, x128::size);
#pragma unroll
        for (int j = 0; j < GLOBAL_NORM_LOADS; j++) {
            if (first + j * step >= chunks) { break; }
            for (int k = 0; k < x128::size; k++) {
                float value = x128_float(loaded[j], k);
                sum += value * value;
            }
        }
    }
    // the count % 8 trailing elements, one per thread of the first block
    if (blockIdx.x == 0 && threadIdx.x < count % x128::size) {
        float value = __bfloat162float(values[(size_t)chunks * x128::size + threadIdx.x]);  // past 2^31 elements
        sum += value * value;
    }
    float block_sum = block_reduce_sum(sum);
    if (threadIdx.x == 0) { partials[blockIdx.x] = block_sum; }
}

__global__ void global_norm_finish_kernel(float* out, const float* partials, int num_partials) {
    float sum = 0.0f;
    for (int i = threadIdx.x; i < num_partials; i += blockDim.x) { sum += partials[i]; }
    float total = block_reduce_sum(sum);
    if (threadIdx.x == 0) { out[0] = total; }
}

// out[0] = sum of values[i]^2 in fp32; values must be 16-byte aligned;
// partials_scratch holds global_norm_scratch_floats() floats
void global_norm_squared(float* out, float* partials_scratch, const floatX* values, size_t count,
                         cudaStream_t stream) {
    if (((uintptr_t)values) % 16 != 0) {
        llm8_die("global_norm_squared: values pointer %p is not 16-byte aligned", (const void*)values);
    }
    if (count / x128::size > ((size_t)1 << 30)) {  // int indices with room for the walk's last step past the end
        llm8_die("global_norm_squared: %zu values are more than 2^30 16-byte chunks", count);
    }
    const unsigned int blocks = global_norm_blocks(count);
    global_norm_partials_kernel<<<blocks, GLOBAL_NORM_BLOCK_SIZE, 0, stream>>>(partials_scratch, values, count);
    cudaCheck(cudaGetLastError());
    global_norm_finish_kernel<<<1, 1024, 0, stream>>>(out, partials_scratch, (int)blocks);
    cudaCheck(cudaGetLastError());
}

#endif // LLMC_GLOBAL_NORM_CUH
