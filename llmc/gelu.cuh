/*
gelu.cuh: tanh-approximation GELU, forward and in-place backward.

Why: both are pure streams over B*T*4C bf16 (the largest activations of the model), so each
thread moves 16 bytes per load and store and uses the cache-streaming hints for what it
reads once. The math is gelu_forward_element / gelu_backward_element from element_math.h,
the same functions the CPU reference calls. The backward overwrites the incoming gradient
in place: the fc output's gradient is never needed once it has been multiplied by GELU's
derivative, so no extra buffer is needed.
The FP8 forward (gelu_forward_fp8) is fp8_cast.cuh's tile cast with GELU as the element
transform: one read of the pre-activation gives the FP8 codes for fcproj's forward and
their transpose for its wgrad, with no bf16 GELU output in between (cheaper than cuBLASLt's
GELU epilogue followed by a cast, which writes and reads that bf16 tensor).
*/
#ifndef LLMC_GELU_CUH
#define LLMC_GELU_CUH

#include "cuda_common.h"
#include "element_math.h"
#include "fp8_cast.cuh"

__global__ void gelu_forward_kernel(floatX* out, const floatX* inp, size_t N) {
    size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * x128::size;
    if (i >= N) { return; }
    x128 x = load128cs(inp + i);
    x128 y;
    for (int k = 0; k < x128::size; k++) {
        y[k] = __float2bfloat16_rn(gelu_forward_element(x128_float(x, k)));
    }
    store128(out + i, y);
}

void gelu_forward(floatX* out, const floatX* inp, size_t N, cudaStream_t stream) {
    const int block_size = 256;
    gelu_forward_kernel<<<vector_kernel_grid(N, block_size, "gelu_forward"), block_size, 0, stream>>>(out, inp, N);
    cudaCheck(cudaGetLastError());
}

// dout: in, the gradient of GELU's output at 8 neighbouring elements (bf16 values); out, that of
// its input, gelu'(pre) * dout in fp32, which every caller rounds to bf16 (this kernel, the bias
// pass and the FP8 dy cast alike, so all give the same bits)
__device__ __forceinline__ void gelu_backward_multiply(float (&dout)[x128::size], x128 pre) {
    for (int k = 0; k < x128::size; k++) { dout[k] = gelu_backward_element(x128_float(pre, k)) * dout[k]; }
}

// d_in_out: in, the gradient of GELU's output; out, the gradient of its input
__global__ void gelu_backward_inplace_kernel(floatX* d_in_out, const floatX* inp, size_t N) {
    size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * x128::size;
    if (i >= N) { return; }
    x128 stored = load128cs(d_in_out + i);
    float d[x128::size];
    for (int k = 0; k < x128::size; k++) { d[k] = x128_float(stored, k); }
    gelu_backward_multiply(d, load128cs(inp + i));
    store128(d_in_out + i, x128_from_floats(d));
}

void gelu_backward_inplace(floatX* d_in_out, const floatX* inp, size_t N, cudaStream_t stream) {
    const int block_size = 256;
    gelu_backward_inplace_kernel<<<vector_kernel_grid(N, block_size, "gelu_backward_inplace"), block_size, 0, stream>>>(
        d_in_out, inp, N);
    cudaCheck(cudaGetLastError());
}

// ----------------------------------------------------------------------------
// FP8: GELU fused into the cast of its output

// the bf16 GELU output, as gelu_forward_kernel stores it (the tile cast rounds the result to bf16)
struct Fp8GeluTransform {
    static constexpr bool passes_through = false;
    static constexpr bool reads_aux = false;
    __device__ __forceinline__ float operator()(float x) const { return gelu_forward_element(x); }
    template <int N>
    __device__ __forceinline__ void stage(float (&x)[N], int, int, x128) const {
        for (int k = 0; k < N; k++) { x[k] = gelu_forward_element(x[k]); }
    }
};

// the bf16 dout * gelu'(pre_gelu), as gelu_backward_inplace stores it (the tile cast rounds
// the product to bf16): the one pass over fc's output gradient when its scale is known
// (-fg delayed, the block recipe; matmul_backward_fp8_dout). pre_gelu is the aux tensor: the
// tile cast loads it 16 bytes at a time, in the batch with dout.
struct Fp8GeluBackwardTransform {
    static constexpr bool passes_through = false;
    static constexpr bool reads_aux = true;
    const floatX* pre_gelu;  // [rows][cols], the tile's rows and cols
    int cols;
    __device__ __forceinline__ const floatX* aux_at(int row, int col) const { return pre_gelu + (size_t)row * cols + col; }
    template <int N>
    __device__ __forceinline__ void stage(float (&dout)[N], int, int, x128 pre) const {
        static_assert(N == x128::size, "the gradient is staged as bf16, 8 per vector like pre_gelu");
        gelu_backward_multiply(dout, pre);
    }
};

/*
inp [rows][cols] pre-GELU -> fp8: the codes of GELU(inp) as stored in bf16, and/or their
transpose. out (may be NULL) also receives the bf16 GELU output. Per tensor: the one-pass
delayed cast (the state's scale, this use's amax recorded); block recipe: 1x128 tiles.
*/
void gelu_forward_fp8(const Fp8CastOutput* fp8, floatX* out, const floatX* inp, int rows, int cols, cudaStream_t stream) {
    fp8_cast_transpose_with(fp8, out, inp, rows, cols, Fp8GeluTransform(), "gelu_forward_fp8", stream);
}

// the same with current scaling (amax of GELU(inp), the state update, then the cast): the
// current recipe, and a delayed tensor's first use
void gelu_forward_fp8_current(const Fp8CastOutput* fp8, floatX* out, const floatX* inp, int rows, int cols,
                              cudaStream_t stream) {
    fp8_cast_transpose_current_with(fp8, out, inp, rows, cols, false, Fp8GeluTransform(), "gelu_forward_fp8_current", stream);
}

// the replay of either's codes from the same inp (fp8_cast_transpose_replay_with; -r 1: fcproj's
// x^T, cast again in the backward)
void gelu_forward_fp8_replay(const Fp8CastOutput* fp8, const floatX* inp, int rows, int cols, cudaStream_t stream) {
    fp8_cast_transpose_replay_with(fp8, inp, rows, cols, Fp8GeluTransform(), "gelu_forward_fp8_replay", stream);
}

#endif // LLMC_GELU_CUH
