/*
layernorm.cuh: layernorm forward (plain and fused with the residual add) and its backward.

Why this shape:
- One warp per row. A row is C bf16 (at most 3.2 KB at C=1600), so a warp moves it in a
  few 16-byte loads per lane, and the row statistics need only warp shuffles, no block
  barriers. The forward keeps its row in shared memory so the row is read from global
  memory once although it is used three times (mean, variance, normalize); the variance
  is the two-pass sum of squared deviations, which is accurate where E[x^2]-E[x]^2 is not.
- The fused variant adds the residual branch first (rounded to bf16, as it is stored)
  and normalizes the stored bf16 value, so the recompute and backward passes, which read
  the stored residual, see exactly what the forward normalized.
- The FP8 recipes need the normalized output as E4M3 codes and their transpose (wgrad's
  x^T), and no bf16 copy of it when no bf16 GEMM reads it. With a scale known before the
  kernel (the delayed recipe) the layernorm kernel casts in its own pass: the transpose
  needs a block barrier, so that variant gives each block 32 whole rows and stages their
  codes in shared memory. Where the scale depends on the output itself (current scaling:
  its amax; the block recipe: the amax of each 128-token column tile of x^T), the kernel
  writes only the row statistics (and the amax), and the tile cast recomputes the output
  from the input and those statistics as it stages each tile: the output is never
  written to memory in bf16 and read back just to be cast (details above the launchers).
- The backward must produce dweight/dbias (column sums over all N rows) without float
  atomics. Each warp accumulates its rows' column sums in its own shared-memory slice; at
  the end the block adds its warps' slices in warp order and writes one partial row to the
  scratch; a second small kernel adds the partials of all blocks in block order and adds
  the total into dweight/dbias. The grid size depends only on N (never on the device), so
  the order of every sum, and therefore every bit, is fixed.
- The residual gradient the backward writes is the output gradient dy of a linear (attproj
  under ln2, fcproj under ln1 and lnf), whose bias gradient is dy's column sums and whose FP8
  cast under current scaling needs dy's amax first. The backward takes both as it writes dy
  (LayernormDinpUses), the same way as its own column sums, so that no pass reads dy for them
  alone: that saves reading B*T*C bf16 twice a layer, in bf16 runs as in FP8.
*/
#ifndef LLMC_LAYERNORM_CUH
#define LLMC_LAYERNORM_CUH

#include "cuda_common.h"
#include "cuda_utils.cuh"
#include "fp8_cast.cuh"

#define LAYERNORM_EPS 1e-5f
#define LAYERNORM_FORWARD_WARPS 8
#define LAYERNORM_FORWARD_LOADS 3   // chunks of its row a lane loads before it uses the first (C = 768: all of them)
#define LAYERNORM_FORWARD_MIN_BLOCKS 3  // per SM (24 warps, each with 6 loads in flight at C = 768): at most 80 registers
#define LAYERNORM_BACKWARD_WARPS 4
#define LAYERNORM_BACKWARD_LOADS 4  // chunks of its row a lane loads before it uses the first
// one full wave of 4-warp blocks on a 132-SM Hopper at C=1600 (51 KB shared memory each; two
// waves with the residual gradient's column sums as well, 77 KB)
#define LAYERNORM_BACKWARD_MAX_BLOCKS 528
#define LAYERNORM_BACKWARD_MAX_SUMS 3  // column sums a block keeps: dweight, dbias, and the residual gradient's
#define LAYERNORM_REDUCE_GROUPS 8

static inline void layernorm_check_shape(int N, int C, const char* who) {
    if (N <= 0 || C <= 0 || C % 8 != 0) {
        llm8_die("%s: N=%d, C=%d: need N > 0 and C a positive multiple of 8 (16-byte vector access)", who, N, C);
    }
}

// ----------------------------------------------------------------------------
// forward. inp2 == NULL: normalize inp1. inp2 != NULL: residual_out = bf16(inp1 + inp2),
// then normalize that. mean_out/rstd_out may be NULL (recompute pass), normed_out too (the
// FP8 paths, when no bf16 GEMM reads the output).
//
// What the kernel does for FP8 (the casts of the normalized output x for the FP8 GEMMs):
// - LAYERNORM_FP8_CAST, the per-tensor delayed recipe's one-pass cast: each warp
//   normalizes LAYERNORM_FP8_ROWS_PER_WARP rows, so a block owns LAYERNORM_FP8_BLOCK_ROWS
//   consecutive rows. Each value is cast as stored in bf16 (so the codes are the cast of
//   the bf16 output the bf16 path would see) with the scale of fp8.state, the codes go to
//   fp8.codes row by row and into a shared [LAYERNORM_FP8_BLOCK_ROWS][C] staging tile;
//   after a block barrier each thread writes one column of the tile to x^T (fp8.codes_t,
//   [C][N]) as two 16-byte stores, 32 consecutive tokens: whole 32-byte sectors. Without
//   x^T (-r 2 casts it again in the backward) there is no staging tile, and the launch asks
//   for no shared memory for it. amax, counts and the scale used go to fp8.record (one
//   atomic per block and counter).
// - LAYERNORM_FP8_AMAX, current scaling's first pass: only the output's amax into
//   fp8.record; the cast follows (layernorm_forward_fp8_current).

typedef enum {
    LAYERNORM_NO_FP8 = 0,
    LAYERNORM_FP8_CAST = 1,
    LAYERNORM_FP8_AMAX = 2,
} LayernormFp8Pass;

#define LAYERNORM_FP8_ROWS_PER_WARP 4
#define LAYERNORM_FP8_BLOCK_ROWS (LAYERNORM_FORWARD_WARPS * LAYERNORM_FP8_ROWS_PER_WARP)
static_assert(LAYERNORM_FP8_BLOCK_ROWS == 32, "the x^T store packs 32 tokens per column");

template <int FP8_PASS>
__global__ void __launch_bounds__(LAYERNORM_FORWARD_WARPS * WARP_SIZE, LAYERNORM_FORWARD_MIN_BLOCKS) layernorm_forward_kernel(floatX* __restrict__ residual_out, floatX* __restrict__ normed_out,
                                         float* __restrict__ mean_out, float* __restrict__ rstd_out,
                                         const floatX* __restrict__ inp1, const floatX* __restrict__ inp2,
                                         const floatX* __restrict__ weight, const floatX* __restrict__ bias, int N, int C,
                                         Fp8CastOutput fp8) {
    constexpr bool cast = FP8_PASS == LAYERNORM_FP8_CAST;
    extern __shared__ x128 row_caches[];  // [LAYERNORM_FORWARD_WARPS][C / 8], then (cast with x^T) codes [BLOCK_ROWS][C]
    constexpr int rows_per_warp = cast ? LAYERNORM_FP8_ROWS_PER_WARP : 1;
    const int lane = threadIdx.x % WARP_SIZE;
    const int warp = threadIdx.x / WARP_SIZE;
    const int chunks = C / x128::size;
    x128* cache = row_caches + warp * chunks;
    uint8_t* staged_codes = reinterpret_cast<uint8_t*>(row_caches + LAYERNORM_FORWARD_WARPS * chunks);
    const int block_first_row = blockIdx.x * LAYERNORM_FORWARD_WARPS * rows_per_warp;
    const float scale = cast ? fp8.state->scale : 0.0f;
    Fp8Tally tally = fp8_tally_zero();

    for (int k = 0; k < rows_per_warp; k++) {
        const int local_row = warp * rows_per_warp + k;
        const int row = block_first_row + local_row;
        if (row >= N) { break; }  // whole warps leave the loop; the barriers below are outside it
        const size_t row_offset = (size_t)row * C;

        // a lane issues the loads of LAYERNORM_FORWARD_LOADS chunks of both inputs before it uses
        // the first (the SASS had a round trip a chunk), and stores the residual in the next pass,
        // not between them. Without inp2 the second batch reloads inp1 (cache hits): a branch
        // around it made the first batch wait
        float sum = 0.0f;
        for (int first = lane; first < chunks; first += WARP_SIZE * LAYERNORM_FORWARD_LOADS) {
            x128 x[LAYERNORM_FORWARD_LOADS], branch[LAYERNORM_FORWARD_LOADS];
            load128_batch<LAYERNORM_FORWARD_LOADS, true>(x, inp1 + row_offset, first, WARP_SIZE, chunks, x128::size);
            load128_batch<LAYERNORM_FORWARD_LOADS, true>(branch, (inp2 != NULL ? inp2 : inp1) + row_offset, first, WARP_SIZE,
                                                         chunks, x128::size);
#pragma unroll
            for (int j = 0; j < LAYERNORM_FORWARD_LOADS; j++) {
                const int i = first + j * WARP_SIZE;
                if (i >= chunks) { break; }
                if (inp2 != NULL) {
                    for (int e = 0; e < x128::size; e++) {
                        x[j][e] = __float2bfloat16_rn(x128_float(x[j], e) + x128_float(branch[j], e));
                    }
                }
                cache[i] = x[j];
                for (int e = 0; e < x128::size; e++) { sum += x128_float(x[j], e); }
            }
        }
        const float mean = warp_reduce_sum(sum) / C;

        float squared_deviations = 0.0f;
        for (int i = lane; i < chunks; i += WARP_SIZE) {
            x128 x = cache[i];
            if (inp2 != NULL) { store128(residual_out + row_offset + i * x128::size, x); }
            for (int e = 0; e < x128::size; e++) {
                float deviation = x128_float(x, e) - mean;
                squared_deviations += deviation * deviation;
            }
        }
        const float rstd = 1.0f / sqrtf(warp_reduce_sum(squared_deviations) / C + LAYERNORM_EPS);

        // the weight and bias chunks, too, are loaded a batch at a time (one at a time, each
        // was waited for between the stores)
        const bool computes_output = normed_out != NULL || FP8_PASS != LAYERNORM_NO_FP8;
        for (int first = lane; computes_output && first < chunks; first += WARP_SIZE * LAYERNORM_FORWARD_LOADS) {
            x128 w[LAYERNORM_FORWARD_LOADS], b[LAYERNORM_FORWARD_LOADS];
            load128_batch<LAYERNORM_FORWARD_LOADS, false>(w, weight, first, WARP_SIZE, chunks, x128::size);
            load128_batch<LAYERNORM_FORWARD_LOADS, false>(b, bias, first, WARP_SIZE, chunks, x128::size);
#pragma unroll
            for (int j = 0; j < LAYERNORM_FORWARD_LOADS; j++) {
                const int i = first + j * WARP_SIZE;
                if (i >= chunks) { break; }
                x128 x = cache[i];
                float y[x128::size];
                for (int e = 0; e < x128::size; e++) {
                    y[e] = layernorm_output_element(x128_float(x, e), mean, rstd, x128_float(w[j], e), x128_float(b[j], e));
                }
                x128 out = x128_from_floats(y);
                if (normed_out != NULL) { store128(normed_out + row_offset + i * x128::size, out); }
                if (FP8_PASS != LAYERNORM_NO_FP8) {
                    fp8_tally_amax(&tally, out);
                }
                if (cast) { cache[i] = out; }  // the row's input is not needed again
            }
        }
        if (cast) {
            // the codes of the row's output, two per conversion; the amaxes so far (this row's
            // and the warp's earlier rows') tell whether any value can saturate (fp8_may_saturate),
            // and where none can the counts test each code for a flush only
            const bool row_may_saturate = __any_sync(0xffffffffu, fp8_may_saturate(bits_as_float(tally.amax_bits), scale, fp8.format));
            for (int i = lane; i < chunks; i += WARP_SIZE) {
                x128 out = cache[i];
                float values[x128::size];
                for (int e = 0; e < x128::size; e++) { values[e] = x128_float(out, e); }
                uint2 packed = fp8_quantize8(values, scale, fp8.format);
                fp8_tally_counts8(&tally, values, packed, scale, fp8.format, row_may_saturate, packed_zero_count(out));
                if (fp8.codes != NULL) { *reinterpret_cast<uint2*>(fp8.codes + row_offset + i * x128::size) = packed; }
                if (fp8.codes_t != NULL) { *reinterpret_cast<uint2*>(staged_codes + (size_t)local_row * C + i * x128::size) = packed; }
            }
        }
        if (lane == 0 && mean_out != NULL) { mean_out[row] = mean; }
        if (lane == 0 && rstd_out != NULL) { rstd_out[row] = rstd; }
    }

    if (cast) {
        if (fp8.codes_t != NULL) {
            __syncthreads();
            const int rows_here = min(LAYERNORM_FP8_BLOCK_ROWS, N - block_first_row);  // 16 or 32 (N % 16 == 0)
            for (int c = threadIdx.x; c < C; c += blockDim.x) {
                uint8_t column[LAYERNORM_FP8_BLOCK_ROWS];
                for (int r = 0; r < LAYERNORM_FP8_BLOCK_ROWS; r++) {
                    column[r] = r < rows_here ? staged_codes[(size_t)r * C + c] : 0;
                }
                uint8_t* destination = fp8.codes_t + (size_t)c * N + block_first_row;
                uint2 a = fp8_pack8(column), b = fp8_pack8(column + 8);
                *reinterpret_cast<uint4*>(destination) = make_uint4(a.x, a.y, b.x, b.y);
                if (rows_here > 16) {
                    uint2 c8 = fp8_pack8(column + 16), d8 = fp8_pack8(column + 24);
                    *reinterpret_cast<uint4*>(destination + 16) = make_uint4(c8.x, c8.y, d8.x, d8.y);
                }
            }
        }
        if (blockIdx.x == 0 && threadIdx.x == 0) {
            fp8.record->scale = scale;
            fp8.record->scale_inv = fp8.state->scale_inv;
        }
    }
    if (FP8_PASS != LAYERNORM_NO_FP8) { fp8_tally_commit(tally, fp8.record, true); }
}

template <int FP8_PASS>
static void layernorm_forward_launch(floatX* residual_out, floatX* normed_out, float* mean, float* rstd,
                                     const floatX* inp1, const floatX* inp2, const floatX* weight, const floatX* bias,
                                     int N, int C, const Fp8CastOutput* fp8, cudaStream_t stream) {
    const int block_size = LAYERNORM_FORWARD_WARPS * WARP_SIZE;
    const bool cast = FP8_PASS == LAYERNORM_FP8_CAST;
    const int block_rows = cast ? LAYERNORM_FP8_BLOCK_ROWS : LAYERNORM_FORWARD_WARPS;
    size_t shared_bytes = (size_t)LAYERNORM_FORWARD_WARPS * C * sizeof(floatX);
    if (cast && fp8->codes_t != NULL) { shared_bytes += (size_t)LAYERNORM_FP8_BLOCK_ROWS * C; }  // the x^T staging tile
    cudaCheck(cudaFuncSetAttribute(layernorm_forward_kernel<FP8_PASS>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   (int)shared_bytes));  // above 48 KB (C > 3072; FP8 cast: C > 1024) needs the opt-in
    Fp8CastOutput fp8_out = {};
    if (fp8 != NULL) { fp8_out = *fp8; }
    layernorm_forward_kernel<FP8_PASS><<<ceil_div(N, block_rows), block_size, shared_bytes, stream>>>(
        residual_out, normed_out, mean, rstd, inp1, inp2, weight, bias, N, C, fp8_out);
    cudaCheck(cudaGetLastError());
}

void layernorm_forward(floatX* out, float* mean, float* rstd, const floatX* inp, const floatX* weight,
                       const floatX* bias, int N, int C, cudaStream_t stream) {
    layernorm_check_shape(N, C, "layernorm_forward");
    layernorm_forward_launch<LAYERNORM_NO_FP8>(NULL, out, mean, rstd, inp, NULL, weight, bias, N, C, NULL, stream);
}

void fused_residual_layernorm_forward(floatX* residual_out, floatX* normed_out, float* mean, float* rstd,
                                      const floatX* inp1, const floatX* inp2, const floatX* weight,
                                      const floatX* bias, int N, int C, cudaStream_t stream) {
    layernorm_check_shape(N, C, "fused_residual_layernorm_forward");
    layernorm_forward_launch<LAYERNORM_NO_FP8>(residual_out, normed_out, mean, rstd, inp1, inp2, weight, bias, N, C,
                                               NULL, stream);
}

/*
The FP8 forwards: the layernorm of inp1 (inp2 NULL) or of the residual sum
residual_out = inp1 + inp2, written to normed_out (bf16; may be NULL) and cast to FP8 for
the GEMMs (codes [N][C] and/or codes_t [C][N]), the codes being the cast of the output as
stored in bf16. N and C multiples of 16.
- layernorm_forward_fp8 with a known scale: per tensor, the delayed recipe's one-pass cast
  inside the layernorm kernel (the state's scale, this use's amax recorded for
  fp8_scaling_update_records). Block recipe: two passes, because x^T's 128x1 tiles span
  128 rows and a layernorm block cannot hold 128 whole rows: the layernorm kernel writes
  mean and rstd (and the residual sum), then the tile cast normalizes its 128x128 tile
  from them as it stages it (LayernormOutputTransform). The bf16 output is never written
  for the cast alone: one read of the input instead of a write and a read of the output.
- layernorm_forward_fp8_current, per tensor (the current recipe, and a delayed tensor's
  first use): the layernorm kernel also records the output's amax, the state update sets
  the scale, and the tile cast normalizes from mean and rstd as above.
The two-pass paths need mean and rstd (they are how the cast recomputes the output).
*/

// the bf16-rounded layernorm output of a stored input element, for the tile cast
struct LayernormOutputTransform {
    const float* mean;
    const float* rstd;
    const floatX* weight;
    const floatX* bias;
    static constexpr bool passes_through = false;
    static constexpr bool reads_aux = false;
    template <int N>
    __device__ __forceinline__ void stage(float (&x)[N], int row, int col, x128) const {
        static_assert(N == x128::size, "layernorm's input is staged as bf16, 8 per vector like its weight and bias");
        const float row_mean = mean[row], row_rstd = rstd[row];
        x128 w = load128(weight + col), b = load128(bias + col);
        for (int k = 0; k < N; k++) {
            x[k] = layernorm_output_element(x[k], row_mean, row_rstd, x128_float(w, k), x128_float(b, k));
        }
    }
};

static void layernorm_check_fp8(const Fp8CastOutput* fp8, const float* mean, const float* rstd, bool two_pass,
                                int N, int C, const char* who) {
    layernorm_check_shape(N, C, who);
    fp8_cast_check(fp8, N, C, who);
    if (two_pass && (mean == NULL || rstd == NULL)) {
        llm8_die("%s: this cast normalizes from the row statistics, so mean and rstd must be given", who);
    }
}

// layernorm kernel pass FP8_PASS, then the tile cast of the output from the input it normalized
template <int FP8_PASS>
static void layernorm_forward_two_pass(const Fp8CastOutput* fp8, floatX* residual_out, floatX* normed_out, float* mean,
                                       float* rstd, const floatX* inp1, const floatX* inp2, const floatX* weight,
                                       const floatX* bias, int N, int C, cudaStream_t stream) {
    layernorm_forward_launch<FP8_PASS>(residual_out, normed_out, mean, rstd, inp1, inp2, weight, bias, N, C, fp8, stream);
    if (FP8_PASS == LAYERNORM_FP8_AMAX) { fp8_scaling_update_records(fp8->state, fp8->record, 1, stream); }
    LayernormOutputTransform output = {mean, rstd, weight, bias};
    fp8_cast_transpose_launch(fp8, (floatX*)NULL, (float*)NULL, inp2 == NULL ? inp1 : residual_out, N, C, FP8_RECORD_COUNTS, output,
                              stream);
}

void layernorm_forward_fp8(const Fp8CastOutput* fp8, floatX* residual_out, floatX* normed_out, float* mean, float* rstd,
                           const floatX* inp1, const floatX* inp2, const floatX* weight, const floatX* bias, int N, int C,
                           cudaStream_t stream) {
    const bool per_tensor = fp8->scaling == FP8_SCALING_TENSOR;
    layernorm_check_fp8(fp8, mean, rstd, !per_tensor, N, C, "layernorm_forward_fp8");
    if (fp8->scaling == FP8_SCALING_BLOCKS_128x128) {
        llm8_die("layernorm_forward_fp8: activations are scaled per 1x128 tile in the block recipe");
    }
    if (per_tensor) {
        layernorm_forward_launch<LAYERNORM_FP8_CAST>(residual_out, normed_out, mean, rstd, inp1, inp2, weight, bias, N, C,
                                                     fp8, stream);
    } else {
        layernorm_forward_two_pass<LAYERNORM_NO_FP8>(fp8, residual_out, normed_out, mean, rstd, inp1, inp2, weight, bias,
                                                     N, C, stream);
    }
}

void layernorm_forward_fp8_current(const Fp8CastOutput* fp8, floatX* residual_out, floatX* normed_out, float* mean,
                                   float* rstd, const floatX* inp1, const floatX* inp2, const floatX* weight,
                                   const floatX* bias, int N, int C, cudaStream_t stream) {
    layernorm_check_fp8(fp8, mean, rstd, true, N, C, "layernorm_forward_fp8_current");
    if (fp8->scaling != FP8_SCALING_TENSOR) {
        llm8_die("layernorm_forward_fp8_current: current scaling is per tensor; the block recipe casts per tile");
    }
    layernorm_forward_two_pass<LAYERNORM_FP8_AMAX>(fp8, residual_out, normed_out, mean, rstd, inp1, inp2, weight, bias,
                                                   N, C, stream);
}

/*
The replay of an FP8 layernorm forward's codes (fp8_cast_transpose_replay_with; -r 2: the x^T
of qkv and fc, cast again in the backward): the tile cast normalizes inp, the layernorm's
stored input (the residual sum where the forward fused the add), with the mean and rstd the
forward wrote, as the two-pass paths above do. The delayed recipe's one-pass cast computes
each element with the same layernorm_output_element from the same mean and rstd, so the
codes of every path come out again, bit for bit.
*/
void layernorm_forward_fp8_replay(const Fp8CastOutput* fp8, const floatX* inp, const float* mean, const float* rstd,
                                  const floatX* weight, const floatX* bias, int N, int C, cudaStream_t stream) {
    layernorm_check_fp8(fp8, mean, rstd, true, N, C, "layernorm_forward_fp8_replay");
    LayernormOutputTransform output = {mean, rstd, weight, bias};
    fp8_cast_transpose_replay_with(fp8, inp, N, C, output, "layernorm_forward_fp8_replay", stream);
}

// ----------------------------------------------------------------------------
// backward

static inline int layernorm_backward_num_blocks(int N) {
    int blocks = ceil_div(N, LAYERNORM_BACKWARD_WARPS);
    return blocks < LAYERNORM_BACKWARD_MAX_BLOCKS ? blocks : LAYERNORM_BACKWARD_MAX_BLOCKS;
}

// bytes of the `scratch` argument of layernorm_backward: one partial row of the column sums
// (dweight, dbias and the residual gradient's) per block
size_t layernorm_backward_scratch_bytes(int N, int C) {
    return (size_t)layernorm_backward_num_blocks(N) * LAYERNORM_BACKWARD_MAX_SUMS * C * sizeof(float);
}

/*
What layernorm backward also takes from the residual gradient dinp it writes. In GPT-2 that
gradient is the output gradient dy of the linear below in the backward order (ln2's is
attproj's, ln1's and lnf's are the fcproj's of the layer under them), whose backward would
otherwise read all of dy again just for these (the bf16 backward's bias pass; current
scaling's amax pass before the FP8 cast, matmul_backward_fp8_dout): here they cost no read.
*/
typedef struct {
    floatX* bias_grad;          // += the column sums of dinp as written (bf16); NULL: not summed
    Fp8CastRecord* amax_record; // its amax_bits takes dinp's amax, as a cast's amax pass would; NULL: none
} LayernormDinpUses;

static const LayernormDinpUses LAYERNORM_DINP_UNUSED = {NULL, NULL};

/*
Where a warp keeps the column sums of its rows: the f128 slot, in one sum's C / 4, of the first
(half 0) or last (half 1) four columns of x128 chunk i. A warp's lanes take consecutive chunks and
the same half at once, so slots half * chunks + i put the 32 lanes' f128 side by side: 512 bytes,
the 4 shared-memory wavefronts such an access needs. Slot 2 * i + half (the columns' own order) put
them 32 bytes apart, 1 KB and 8 wavefronts, and the accumulators are read and written for every row.
*/
__host__ __device__ static inline int layernorm_column_slot(int chunk, int half, int chunks) {
    return half * chunks + chunk;
}

/*
Per row, with xhat = (x - mean) * rstd and dnorm = dout * weight:
  dinp += rstd * (dnorm - mean(dnorm) - xhat * mean(dnorm * xhat))
and the row's contributions dout * xhat and dout to the columns of dweight and dbias, and
(SUM_DINP) the new dinp, as stored, to its own column sums. Writes this block's column sums to
partials[blockIdx.x][0..C) (dweight), [C..2C) (dbias) and [2C..3C) (SUM_DINP: dinp's);
dinp_amax != NULL: the amax of the new dinp into dinp_amax->amax_bits.
*/
template <bool SUM_DINP>
__global__ void __launch_bounds__(LAYERNORM_BACKWARD_WARPS * WARP_SIZE)
layernorm_backward_kernel(floatX* dinp, float* partials, Fp8CastRecord* dinp_amax, const floatX* dout, const floatX* inp,
                          const floatX* weight, const float* mean, const float* rstd, int N, int C) {
    constexpr int sums = SUM_DINP ? 3 : 2;
    extern __shared__ f128 column_sums[];  // [LAYERNORM_BACKWARD_WARPS][sums][2][C / 8]: dweight, dbias, dinp
    const int lane = threadIdx.x % WARP_SIZE;
    const int warp = threadIdx.x / WARP_SIZE;
    const int chunks = C / x128::size;
    f128* warp_dweight = column_sums + (size_t)warp * sums * (C / f128::size);
    f128* warp_dbias = warp_dweight + C / f128::size;
    f128* warp_dinp = warp_dbias + C / f128::size;  // SUM_DINP only
    // each lane owns the accumulators of its x128 chunks (two f128 each) for the whole
    // kernel, so no other lane ever touches them and no warp barrier is needed
    for (int i = lane; i < chunks; i += WARP_SIZE) {
        for (int half = 0; half < 2; half++) {
            const int slot = layernorm_column_slot(i, half, chunks);
            warp_dweight[slot] = f128::zeros();
            warp_dbias[slot] = f128::zeros();
            if constexpr (SUM_DINP) { warp_dinp[slot] = f128::zeros(); }
        }
    }
    uint32_t dinp_amax_bits = 0u;

    for (int row = blockIdx.x * LAYERNORM_BACKWARD_WARPS + warp; row < N;
         row += gridDim.x * LAYERNORM_BACKWARD_WARPS) {
        const size_t row_offset = (size_t)row * C;
        const float row_mean = mean[row];
        const float row_rstd = rstd[row];
        float dnorm_sum = 0.0f;
        float dnorm_xhat_sum = 0.0f;
        // each pass takes the lane's chunks in order, LAYERNORM_BACKWARD_LOADS at a time loaded
        // before the first is used (one at a time, each load was waited for)
        const int batch_stride = LAYERNORM_BACKWARD_LOADS * WARP_SIZE;
        for (int first = lane; first < chunks; first += batch_stride) {
            x128 d[LAYERNORM_BACKWARD_LOADS], x[LAYERNORM_BACKWARD_LOADS], w[LAYERNORM_BACKWARD_LOADS];
            load128_batch<LAYERNORM_BACKWARD_LOADS, false>(d, dout + row_offset, first, WARP_SIZE, chunks, x128::size);
            load128_batch<LAYERNORM_BACKWARD_LOADS, false>(x, inp + row_offset, first, WARP_SIZE, chunks, x128::size);
            load128_batch<LAYERNORM_BACKWARD_LOADS, false>(w, weight, first, WARP_SIZE, chunks, x128::size);
#pragma unroll
            for (int b = 0; b < LAYERNORM_BACKWARD_LOADS; b++) {
                const int i = first + b * WARP_SIZE;
                if (i >= chunks) { break; }
                for (int half = 0; half < 2; half++) {  // 8 bf16 columns = two f128 of accumulators
                    const int slot = layernorm_column_slot(i, half, chunks);
                    f128 dweight_acc = warp_dweight[slot];
                    f128 dbias_acc = warp_dbias[slot];
                    for (int j = 0; j < f128::size; j++) {
                        int k = half * f128::size + j;
                        float dout_k = x128_float(d[b], k);
                        float xhat = (x128_float(x[b], k) - row_mean) * row_rstd;
                        float dnorm = x128_float(w[b], k) * dout_k;
                        dnorm_sum += dnorm;
                        dnorm_xhat_sum += dnorm * xhat;
                        dweight_acc[j] += dout_k * xhat;
                        dbias_acc[j] += dout_k;
                    }
                    warp_dweight[slot] = dweight_acc;
                    warp_dbias[slot] = dbias_acc;
                }
            }
        }
        const float dnorm_mean = warp_reduce_sum(dnorm_sum) / C;
        const float dnorm_xhat_mean = warp_reduce_sum(dnorm_xhat_sum) / C;
        for (int first = lane; first < chunks; first += batch_stride) {  // second read of the row: L1/L2 hits
            x128 d[LAYERNORM_BACKWARD_LOADS], x[LAYERNORM_BACKWARD_LOADS], g[LAYERNORM_BACKWARD_LOADS];
            x128 w[LAYERNORM_BACKWARD_LOADS];
            load128_batch<LAYERNORM_BACKWARD_LOADS, true>(d, dout + row_offset, first, WARP_SIZE, chunks, x128::size);
            load128_batch<LAYERNORM_BACKWARD_LOADS, true>(x, inp + row_offset, first, WARP_SIZE, chunks, x128::size);
            load128_batch<LAYERNORM_BACKWARD_LOADS, false>(g, dinp + row_offset, first, WARP_SIZE, chunks, x128::size);
            load128_batch<LAYERNORM_BACKWARD_LOADS, false>(w, weight, first, WARP_SIZE, chunks, x128::size);
#pragma unroll
            for (int b = 0; b < LAYERNORM_BACKWARD_LOADS; b++) {
                const int i = first + b * WARP_SIZE;
                if (i >= chunks) { break; }
                float sum[x128::size];
                for (int k = 0; k < x128::size; k++) {
                    float xhat = (x128_float(x[b], k) - row_mean) * row_rstd;
                    float dnorm = x128_float(w[b], k) * x128_float(d[b], k);
                    float dx = (dnorm - dnorm_mean - xhat * dnorm_xhat_mean) * row_rstd;
                    sum[k] = x128_float(g[b], k) + dx;
                }
                const x128 stored = x128_from_floats(sum);
                store128(dinp + row_offset + i * x128::size, stored);
                if constexpr (SUM_DINP) {
                    for (int half = 0; half < 2; half++) {
                        const int slot = layernorm_column_slot(i, half, chunks);
                        f128 dinp_acc = warp_dinp[slot];
                        for (int j = 0; j < f128::size; j++) { dinp_acc[j] += x128_float(stored, half * f128::size + j); }
                        warp_dinp[slot] = dinp_acc;
                    }
                }
                // unconditional: a test of dinp_amax here took the kernel from 72 to 140 registers
                dinp_amax_bits = max(dinp_amax_bits, x128_amax_bits(stored));
            }
        }
    }
    __syncthreads();

    const float* warp_sums = reinterpret_cast<const float*>(column_sums);
    float* block_partials = partials + (size_t)blockIdx.x * sums * C;
    for (int column = threadIdx.x; column < sums * C; column += blockDim.x) {
        const int sum = column / C;
        const int within = column % C;
        const int slot = layernorm_column_slot(within / x128::size, within % x128::size / f128::size, chunks);
        const size_t offset = (size_t)sum * C + (size_t)slot * f128::size + within % f128::size;
        float total = 0.0f;
        for (int w = 0; w < LAYERNORM_BACKWARD_WARPS; w++) { total += warp_sums[(size_t)w * sums * C + offset]; }
        block_partials[column] = total;
    }
    if (dinp_amax != NULL) {
        Fp8Tally tally = fp8_tally_zero();
        tally.amax_bits = dinp_amax_bits;
        fp8_tally_commit(tally, dinp_amax, true);
    }
}

// each block owns 32 of the sums * C columns; its 8 warps sum interleaved subsets of the block
// partials (warp g takes blocks g, g+8, ...), then warp 0 adds the 8 group sums in order
__global__ void layernorm_backward_reduce_kernel(floatX* dweight, floatX* dbias, floatX* dinp_sums, const float* partials,
                                                 int num_blocks, int sums, int C) {
    __shared__ float group_sums[LAYERNORM_REDUCE_GROUPS][WARP_SIZE];
    const int lane = threadIdx.x % WARP_SIZE;
    const int group = threadIdx.x / WARP_SIZE;
    const int column = blockIdx.x * WARP_SIZE + lane;
    const int columns = sums * C;
    float sum = 0.0f;
    if (column < columns) {
        for (int b = group; b < num_blocks; b += LAYERNORM_REDUCE_GROUPS) { sum += partials[(size_t)b * columns + column]; }
    }
    group_sums[group][lane] = sum;
    __syncthreads();
    if (group == 0 && column < columns) {
        float total = 0.0f;
        for (int g = 0; g < LAYERNORM_REDUCE_GROUPS; g++) { total += group_sums[g][lane]; }
        floatX* target = column < C ? dweight + column : column < 2 * C ? dbias + (column - C) : dinp_sums + (column - 2 * C);
        *target = __float2bfloat16_rn(__bfloat162float(*target) + total);
    }
}

// dinp += (the residual stream's gradient), dweight += , dbias += , and what `uses` asks of the
// new dinp; scratch holds layernorm_backward_scratch_bytes(N, C) bytes
void layernorm_backward(floatX* dinp, floatX* dweight, floatX* dbias, float* scratch, const floatX* dout,
                        const floatX* inp, const floatX* weight, const float* mean, const float* rstd,
                        int N, int C, LayernormDinpUses uses, cudaStream_t stream) {
    layernorm_check_shape(N, C, "layernorm_backward");
    const int num_blocks = layernorm_backward_num_blocks(N);
    const int sums = uses.bias_grad != NULL ? 3 : 2;
    size_t shared_bytes = (size_t)LAYERNORM_BACKWARD_WARPS * sums * C * sizeof(float);
    if (uses.bias_grad != NULL) {
        cudaCheck(cudaFuncSetAttribute(layernorm_backward_kernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       (int)shared_bytes));
        layernorm_backward_kernel<true><<<num_blocks, LAYERNORM_BACKWARD_WARPS * WARP_SIZE, shared_bytes, stream>>>(
            dinp, scratch, uses.amax_record, dout, inp, weight, mean, rstd, N, C);
    } else {
        cudaCheck(cudaFuncSetAttribute(layernorm_backward_kernel<false>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       (int)shared_bytes));
        layernorm_backward_kernel<false><<<num_blocks, LAYERNORM_BACKWARD_WARPS * WARP_SIZE, shared_bytes, stream>>>(
            dinp, scratch, uses.amax_record, dout, inp, weight, mean, rstd, N, C);
    }
    cudaCheck(cudaGetLastError());
    layernorm_backward_reduce_kernel<<<ceil_div(sums * C, WARP_SIZE), LAYERNORM_REDUCE_GROUPS * WARP_SIZE, 0, stream>>>(
        dweight, dbias, uses.bias_grad, scratch, num_blocks, sums, C);
    cudaCheck(cudaGetLastError());
}

#endif // LLMC_LAYERNORM_CUH
