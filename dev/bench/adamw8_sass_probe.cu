/*
adamw8_sass_probe.cu: adamw8's kernel body (llmc/adamw8.cuh's adamw8_update_blocks) built for
the common case only (every lane whole, an fp32 master, no FP8 outputs: a bf16 run's 8-bit
tensors; absmaxes in quant8.h's reciprocal range, QUANT8_ASSUME_RECIPROCAL, where the compiler
puts the division's fallback on the fall-through path that sass_path.py walks), so that
dev/bench/sass_path.py can count the instructions its path executes from the machine code. Not
part of the trainer; make builds it into build/adamw8_sass_probe.cubin.
*/
#define QUANT8_ASSUME_RECIPROCAL
#include "llmc/adamw8.cuh"

__global__ void __launch_bounds__(ADAMW8_WARPS_PER_BLOCK * WARP_SIZE, ADAMW8_MIN_BLOCKS)
adamw8_sass_probe(floatX* params, float* master, const floatX* grads, Quant8TensorStates st, size_t n, const Quant8Maps* maps,
                  AdamWElementParams hp, float grad_scale, uint32_t seed) {
    __builtin_assume(master != NULL);
    Fp8WeightUpdate no_fp8;
    memset(&no_fp8, 0, sizeof(no_fp8));
    adamw8_update_blocks<true>(params, master, grads, st, n, 0, n / QUANT8_BLOCK, maps, hp, grad_scale, seed, 0, no_fp8);
}
