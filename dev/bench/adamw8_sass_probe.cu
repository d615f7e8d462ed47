/*
adamw8_sass_probe.cu: adamw8's block step (llmc/adamw8.cuh) in the loop of its kernel, built for
the common case only (every lane whole, an fp32 master, no FP8 outputs: a bf16 run's 8-bit
tensors), so that dev/bench/sass_path.py can count the instructions its path executes from the
machine code. Not part of any build; the command is in sass_path.py.
*/
#include "llmc/adamw8.cuh"

__global__ void __launch_bounds__(ADAMW8_WARPS_PER_BLOCK * WARP_SIZE, ADAMW8_MIN_BLOCKS)
adamw8_sass_probe(floatX* params, float* master, const floatX* grads, Quant8TensorStates st, size_t n, const Quant8Maps* maps,
                  AdamWElementParams hp, float grad_scale, uint32_t seed) {
    __shared__ Quant8Maps shared_maps;
    for (int i = threadIdx.x; i < (int)(sizeof(Quant8Maps) / sizeof(uint32_t)); i += blockDim.x) {
        reinterpret_cast<uint32_t*>(&shared_maps)[i] = reinterpret_cast<const uint32_t*>(maps)[i];
    }
    __syncthreads();
    __builtin_assume(master != NULL);
    Fp8WeightUpdate no_fp8;
    memset(&no_fp8, 0, sizeof(no_fp8));
    Fp8Tally tally = fp8_tally_zero();
    const size_t warps = (size_t)gridDim.x * ADAMW8_WARPS_PER_BLOCK;
    for (size_t block = (size_t)blockIdx.x * ADAMW8_WARPS_PER_BLOCK + threadIdx.x / WARP_SIZE; block < n / QUANT8_BLOCK;
         block += warps) {
        adamw8_update_block<true>(block, params, master, grads, st, n, &shared_maps, hp, grad_scale, seed, 0, no_fp8, 1.0f,
                                  &tally);
    }
}
