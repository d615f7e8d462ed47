/*
cudnn_att.h: causal self-attention through cuDNN's fused flash attention (the cuDNN
frontend's SDPA graphs), forward and backward.

Why a separate translation unit: the cuDNN frontend is a large header-only C++ library
that takes tens of seconds to compile; keeping it in llmc/cudnn_att.cpp (compiled once into
build/cudnn_att.o) keeps the trainer's own compile fast, and lets a machine without the
frontend headers build everything else with -DLLM8_NO_CUDNN. This header therefore uses only
CUDA runtime types, so both the .cpp (host compiler) and the .cu files can include it.
Callers go through llmc/attention.cuh, which picks this backend or the fallback kernels.

Layouts (the same as the fallback's): qkv [B][T][3][NH][HS] bf16, out [B][T][NH][HS] bf16,
stats [B][NH][T] fp32 = natural-log logsumexp of the scaled scores of each query row.
The scale is 1/sqrt(HS) and the mask is causal. Graphs are built on first use of a shape and
cached; the workspace grows on demand (only while a new shape is first seen).
*/
#ifndef LLMC_CUDNN_ATT_H
#define LLMC_CUDNN_ATT_H

#include <cuda_runtime.h>
#include <cuda_bf16.h>

// cuDNN's fused attention as llm8 builds it takes heads of a multiple of 8 channels, at most 128
static inline bool cudnn_att_head_size_supported(int HS) { return HS > 0 && HS % 8 == 0 && HS <= 128; }

// deterministic_backward: cuDNN's deterministic backward algorithm, bitwise repeatable; false:
// its faster one, which accumulates dQ with float atomics
void cudnn_att_setup(bool deterministic_backward);
void cudnn_att_teardown(void);

void cudnn_att_forward(__nv_bfloat16* out, float* stats, const __nv_bfloat16* qkv,
                       int B, int T, int NH, int C, cudaStream_t stream);

// dqkv is overwritten; by the algorithm cudnn_att_setup chose
void cudnn_att_backward(__nv_bfloat16* dqkv, const __nv_bfloat16* dout, const __nv_bfloat16* qkv,
                        const __nv_bfloat16* out, const float* stats,
                        int B, int T, int NH, int C, cudaStream_t stream);

#endif // LLMC_CUDNN_ATT_H
