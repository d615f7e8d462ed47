/*
bench_gemm.cu: per-GEMM time of FP8 against bf16, per model size and per linear (qkv,
attproj, fc, fcproj, lm_head), the "FP8 GEMMs incl. casts over bf16 GEMMs" column of
DESIGN.md section 7.

Usage: ./bench_gemm [--models d12,d24,d36,d48] [--iters N] [--warmup N] [--algorithms N] [--json PATH]

Why it is shaped so:
- It times the trainer's own launchers (llmc/matmul.cuh, llmc/fp8_cast.cuh) with the
  operands built the way llmc/fp8_model.cuh builds them, never a private GEMM: the figure
  must be the one training gets, host-side plan building per call included. Shapes come
  from fp8_linear_shape and gpt2_config_from_descriptor, the trainer's sources for them.
- What each variant times, per linear and pass (y[BT][OC] = x[BT][K] W[OC][K]^T):
    bf16        fwd: matmul_forward (bias epilogue; lm_head has no bias)
                bwd: matmul_backward (dgrad + wgrad + the bias gradient's pass over dy)
    bf16-gemms  fwd: as bf16; bwd: matmul_backward without the bias gradient: the GEMMs alone,
                what the GEMM-only FP8 variants (fp8, block) are measured against, while the
                +cast variants, whose dy pass sums the bias gradient too, are measured against bf16
    fp8         fwd: matmul_forward_fp8, per-tensor E4M3 x E4M3, fast accumulation
                bwd: matmul_backward_fp8 (dgrad E5M2 dy x E4M3 W^T, wgrad E5M2 dy^T x E4M3 x^T)
    fp8+cast    fwd: a standalone cast-transpose of x (the delayed one-pass cast), then the
                     GEMM. The trainer fuses that cast into layernorm and GELU (but not for
                     attproj, whose input, the attention output, is cast on its own), so
                     fp8 and fp8+cast bound the forward from below and above.
                bwd: matmul_backward_fp8_dout (bias grad + amax + cast + transpose of dy,
                     which replaces bf16's dbias) then the GEMMs. For attproj and fcproj
                     the trainer takes dy's bias sums (both precisions) and amax (-fg
                     current) in layernorm backward, which writes dy: there bf16-gemms is
                     what bf16 pays, and fp8+cast overstates FP8's dy pass by one read.
    fp8+cast-fgd  as fp8+cast, with the output gradient scaled as under -fg delayed: the dy
                pass casts with the state's (seeded) scale in the same pass that sums the
                bias, reading dy once, where fp8+cast (-fg current, the default) reads it twice.
    block, block+cast: the same with the block recipe (1x128 tiles for x and dy, 128x128
                     blocks for W, all E4M3, no fast accumulation; at d48, C=1600, the last
                     tile along C and 3C is short). Its layernorm casts in a tile cast of
                     their own (reading the layernorm's input, not a bf16 output), so
                     block+cast is about what the qkv and fc forwards pay. Skipped, with the reason recorded, for a
                     linear whose GEMMs cuBLASLt has no block-scaled algorithm for.
    wcast       fp8_cast_weight from the fp32 master (W and W^T), once per optimizer step,
                so reported on its own and not added into fwd or bwd; per tensor it
                includes the weight's amax pass (an upper bound where the optimizer pass
                hands the cast that amax).
  --algorithms N (default 0: off) times each GEMM again, alone (fwd, dgrad, wgrad; bf16 and
  per-tensor FP8) with every algorithm cuBLASLt's heuristic lists for it, up to N, and prints
  the first's time (the one training runs: matmul.cuh) against the fastest's, per GEMM and
  for the whole model: how much a choice other than the heuristic's first could gain.
  The delayed and current recipes run the same GEMMs, so "fp8" stands for both. GELU's
  backward is left out of both sides (in bf16 an elementwise pass after fcproj's dgrad, in
  FP8 fused into fc's dy pass), and so is the GELU epilogue of fc's bf16 forward.
- Inputs are Gaussian with training-like scales (x std 1, W std 0.02, dy std 1e-3), so the
  casts see realistic amaxes and the per-tensor scales are seeded from them (a current
  cast first) as in training. They are drawn on the GPU from random_u32 (a d12 lm_head's
  dy alone is 3.3e9 numbers).
- Timing: warmup launches, then BENCH_REPEATS times a CUDA-event pair around --iters
  launches; the median of the repetitions, per launch. FLOPs are 2*BT*K*OC per GEMM (the
  backward has two); casts add none, so a +cast variant's TFLOP/s is the effective rate.
- fwd+bwd rows are sums of the fwd and bwd rows; a model's "total" row sums each linear's
  time times how often it runs per micro-step (L for the four block linears, 1 for
  lm_head), which weights every linear's ratio by its share of the model's GEMM time.
  Ratios are bf16 time over FP8 time (above 1: FP8 is faster): a GEMM-only variant's over
  bf16-gemms, a +cast variant's over bf16 (bench_baseline), so each side does the same work.
- The tables print as markdown (dev/bench/bench.py pastes them into doc/benchmarks/), and
  --json writes one JSON object per line: a "run" record (device, settings), then per model
  "time" records (model, linear, B, T, K, OC, pass, variant, ms, tflops), "ratio" records,
  "skip" records and, with --algorithms, "algorithms" records (model, linear, B, T, gemm,
  precision, listed, first_ms, fastest_ms, fastest_rank). Flags are checked before the first
  CUDA call, so bad input is one line even on a machine without a GPU.
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include "llmc/utils.h"
#include "llmc/cuda_common.h"
#include "llmc/gpt2_config.h"
#include "llmc/fp8_recipe.h"
#include "llmc/fp8_cast.cuh"
#include "llmc/matmul.cuh"
#include "llmc/fp8_model.cuh"

#define BENCH_T 1024
#define BENCH_REPEATS 5
#define BENCH_NUM_MODELS 4
#define BENCH_MAX_ALLOCATIONS 32

// the sizes DESIGN.md section 7 sets targets for, with its micro-batch sizes at T=1024
static const char* const BENCH_MODEL_NAMES[BENCH_NUM_MODELS] = {"d12", "d24", "d36", "d48"};
static const int BENCH_MODEL_BATCH[BENCH_NUM_MODELS] = {64, 32, 16, 16};

typedef enum { PASS_FWD, PASS_BWD, PASS_FWD_BWD, PASS_WCAST, NUM_BENCH_PASSES } BenchPass;
static const char* const BENCH_PASS_NAMES[NUM_BENCH_PASSES] = {"fwd", "bwd", "fwd+bwd", "wcast"};

// the two bf16 baselines; each FP8 recipe's GEMM-only variant followed by its +cast variant; last, fp8+cast with
// -fg delayed's dy pass
typedef enum { VARIANT_BF16, VARIANT_BF16_GEMMS, VARIANT_FP8, VARIANT_FP8_CAST, VARIANT_BLOCK, VARIANT_BLOCK_CAST,
               VARIANT_FP8_CAST_FGD, NUM_BENCH_VARIANTS } BenchVariant;
static const char* const BENCH_VARIANT_NAMES[NUM_BENCH_VARIANTS] = {"bf16", "bf16-gemms", "fp8", "fp8+cast", "block",
                                                                     "block+cast", "fp8+cast-fgd"};

// what a variant is measured against: the bf16 GEMMs alone, or bf16 with the bias gradient the dy pass also sums
static BenchVariant bench_baseline(int variant) {
    return variant == VARIANT_FP8 || variant == VARIANT_BLOCK ? VARIANT_BF16_GEMMS : VARIANT_BF16;
}

#define BENCH_TOTAL_ROW NUM_LINEAR_KINDS  // after the five linears: the model total
#define BENCH_ROWS (NUM_LINEAR_KINDS + 1)

typedef struct {
    int models;             // bits over BENCH_MODEL_NAMES
    int iters;
    int warmup;
    int algorithms;         // --algorithms: the most heuristic algorithms timed per GEMM (0: none)
    const char* json_path;  // NULL: no JSON
} BenchOptions;

// ----------------------------------------------------------------------------
// command line (checked before any CUDA call)

static void bench_print_usage(void) {
    printf("usage: ./bench_gemm [--models LIST] [--iters N] [--warmup N] [--algorithms N] [--json PATH]\n"
           "  --models LIST  comma list of d12,d24,d36,d48 (B = 64, 32, 16, 16; T = 1024), or all (default all)\n"
           "  --iters N      launches per timed repetition, 1..100000 (default 20); the median of %d repetitions\n"
           "  --warmup N     untimed launches before each measurement, 0..100000 (default 5)\n"
           "  --algorithms N also time each GEMM with every algorithm cuBLASLt's heuristic lists, up to N (1..%d),\n"
           "                 the first (training's) against the fastest; 0 = not (default 0)\n"
           "  --json PATH    also write one JSON object per line (time, ratio and skip records) to PATH\n",
           BENCH_REPEATS, MATMUL_MAX_ALGORITHMS);
}

static BenchOptions bench_parse_args(int argc, char** argv) {
    BenchOptions options = {(1 << BENCH_NUM_MODELS) - 1, 20, 5, 0, NULL};
    for (int i = 1; i < argc; i++) {
        const char* flag = argv[i];
        if (strcmp(flag, "-h") == 0 || strcmp(flag, "--help") == 0) {
            bench_print_usage();
            exit(EXIT_SUCCESS);
        }
        bool known = strcmp(flag, "--models") == 0 || strcmp(flag, "--iters") == 0 || strcmp(flag, "--warmup") == 0
                  || strcmp(flag, "--algorithms") == 0 || strcmp(flag, "--json") == 0;
        if (!known) {
            llm8_die("unknown flag '%s' (expected --models, --iters, --warmup, --algorithms or --json; --help lists them)", flag);
        }
        if (i + 1 >= argc) { llm8_die("flag %s needs a value (--help lists the flags)", flag); }
        const char* value = argv[++i];
        if (strcmp(flag, "--models") == 0) {
            options.models = fp8_parse_name_list(flag, value, BENCH_MODEL_NAMES, BENCH_NUM_MODELS);
        } else if (strcmp(flag, "--iters") == 0) {
            options.iters = (int)parse_long_flag(flag, value, 1, 100000);
        } else if (strcmp(flag, "--warmup") == 0) {
            options.warmup = (int)parse_long_flag(flag, value, 0, 100000);
        } else if (strcmp(flag, "--algorithms") == 0) {
            options.algorithms = (int)parse_long_flag(flag, value, 0, MATMUL_MAX_ALGORITHMS);
        } else {
            options.json_path = value;
        }
    }
    return options;
}

// ----------------------------------------------------------------------------
// Gaussian inputs, drawn on the device

// out[i] = std * N(0, 1) by Box-Muller from two counter-based draws; i beyond 2^32 moves
// to another seed, since random_u32 takes a 32-bit index
template <class T>
__global__ void bench_fill_normal_kernel(T* out, size_t n, float std, uint32_t seed) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint32_t stream_seed = random_u32(seed, (uint32_t)(i >> 32));
        float u1 = ((float)random_u32(stream_seed, (uint32_t)i) + 0.5f) * 0x1p-32f;  // in (0, 1]
        float u2 = (float)random_u32(stream_seed + 1u, (uint32_t)i) * 0x1p-32f;
        out[i] = fp8_stage_from_float<T>(std * sqrtf(-2.0f * logf(u1)) * cospif(2.0f * u2));
    }
}

template <class T>
static void bench_fill_normal(T* out, size_t n, float std, uint32_t seed, cudaStream_t stream) {
    bench_fill_normal_kernel<T><<<1024, 256, 0, stream>>>(out, n, std, seed);
    cudaCheck(cudaGetLastError());
}

// ----------------------------------------------------------------------------
// one linear's operands, bf16 and FP8

typedef struct {
    int BT, K, OC;
    floatX *x, *w, *bias, *out, *dy, *dinp, *dw, *dbias;  // bias and dbias: NULL for lm_head
    float* master;                                        // the fp32 master of w (the weight cast reads it)
    float* dbias_scratch;
    uint8_t *x_codes, *x_codes_t, *w_codes, *w_codes_t, *dy_codes, *dy_codes_t;  // shared by both recipes
    Fp8TensorScaling* states;  // device [4]: x, dy, W, and dy under -fg delayed (per-tensor recipe)
    Fp8CastRecord* records;    // device [4], beside them
    float *x_scale_inv, *x_scale_inv_t, *w_scale_inv, *w_scale_inv_t, *dy_scale_inv, *dy_scale_inv_t;  // block recipe
    Fp8CastOutput x8, w8, dy8; // the casts of the recipe being timed (bench_linear_use_recipe)
    Fp8CastOutput dy8_delayed; // per-tensor recipe: dy's cast under -fg delayed (the same codes, its own scale)
    MatmulSpec ranked;         // --algorithms: the GEMM bench_ranked_gemm runs, with the heuristic's algorithm `rank`
    int rank;
    void* allocations[BENCH_MAX_ALLOCATIONS];
    int num_allocations;
} LinearBench;

static void* bench_linear_alloc(LinearBench* b, size_t bytes, const char* what) {
    if (b->num_allocations == BENCH_MAX_ALLOCATIONS) { llm8_die("bench_gemm: more than %d buffers for one linear", BENCH_MAX_ALLOCATIONS); }
    void* pointer = cuda_malloc_checked(bytes, what);
    b->allocations[b->num_allocations++] = pointer;
    return pointer;
}

static void bench_linear_create(LinearBench* b, int BT, int K, int OC, bool has_bias, bool block, uint32_t seed,
                                cudaStream_t stream) {
    memset(b, 0, sizeof(*b));
    b->BT = BT; b->K = K; b->OC = OC;
    size_t nx = (size_t)BT * K, nw = (size_t)OC * K, ny = (size_t)BT * OC;
    b->x = (floatX*)bench_linear_alloc(b, nx * sizeof(floatX), "bench x");
    b->w = (floatX*)bench_linear_alloc(b, nw * sizeof(floatX), "bench W");
    b->master = (float*)bench_linear_alloc(b, nw * sizeof(float), "bench fp32 master W");
    b->out = (floatX*)bench_linear_alloc(b, ny * sizeof(floatX), "bench y");
    b->dy = (floatX*)bench_linear_alloc(b, ny * sizeof(floatX), "bench dy");
    b->dinp = (floatX*)bench_linear_alloc(b, nx * sizeof(floatX), "bench dx");
    b->dw = (floatX*)bench_linear_alloc(b, nw * sizeof(floatX), "bench dW");
    b->dbias_scratch = (float*)bench_linear_alloc(b, matmul_dbias_scratch_floats(BT, OC) * sizeof(float), "bench dbias scratch");
    b->x_codes = (uint8_t*)bench_linear_alloc(b, nx, "bench x codes");
    b->x_codes_t = (uint8_t*)bench_linear_alloc(b, nx, "bench x^T codes");
    b->w_codes = (uint8_t*)bench_linear_alloc(b, nw, "bench W codes");
    b->w_codes_t = (uint8_t*)bench_linear_alloc(b, nw, "bench W^T codes");
    b->dy_codes = (uint8_t*)bench_linear_alloc(b, ny, "bench dy codes");
    b->dy_codes_t = (uint8_t*)bench_linear_alloc(b, ny, "bench dy^T codes");
    b->states = (Fp8TensorScaling*)bench_linear_alloc(b, 4 * sizeof(Fp8TensorScaling), "bench scaling states");
    b->records = (Fp8CastRecord*)bench_linear_alloc(b, 4 * sizeof(Fp8CastRecord), "bench cast records");
    if (has_bias) {
        b->bias = (floatX*)bench_linear_alloc(b, OC * sizeof(floatX), "bench bias");
        b->dbias = (floatX*)bench_linear_alloc(b, OC * sizeof(floatX), "bench dbias");
        bench_fill_normal(b->bias, OC, 0.02f, seed + 1, stream);
        cudaCheck(cudaMemsetAsync(b->dbias, 0, OC * sizeof(floatX), stream));
    }
    if (block) {
        const char* what = "bench block scales";
        b->x_scale_inv = (float*)bench_linear_alloc(b, fp8_block_scale_floats(FP8_SCALING_ROWS_1x128, BT, K) * sizeof(float), what);
        b->x_scale_inv_t = (float*)bench_linear_alloc(b, fp8_block_scale_floats(FP8_SCALING_ROWS_1x128, K, BT) * sizeof(float), what);
        b->w_scale_inv = (float*)bench_linear_alloc(b, fp8_block_scale_floats(FP8_SCALING_BLOCKS_128x128, OC, K) * sizeof(float), what);
        b->w_scale_inv_t = (float*)bench_linear_alloc(b, fp8_block_scale_floats(FP8_SCALING_BLOCKS_128x128, K, OC) * sizeof(float), what);
        b->dy_scale_inv = (float*)bench_linear_alloc(b, fp8_block_scale_floats(FP8_SCALING_ROWS_1x128, BT, OC) * sizeof(float), what);
        b->dy_scale_inv_t = (float*)bench_linear_alloc(b, fp8_block_scale_floats(FP8_SCALING_ROWS_1x128, OC, BT) * sizeof(float), what);
    }
    bench_fill_normal(b->x, nx, 1.0f, seed + 2, stream);
    bench_fill_normal(b->w, nw, 0.02f, seed + 3, stream);
    bench_fill_normal(b->master, nw, 0.02f, seed + 3, stream);  // same draws: w is the master rounded to bf16
    bench_fill_normal(b->dy, ny, 1e-3f, seed + 4, stream);
    cudaCheck(cudaMemsetAsync(b->dw, 0, nw * sizeof(floatX), stream));
}

static void bench_linear_free(LinearBench* b) {
    cudaCheck(cudaDeviceSynchronize());
    for (int i = 0; i < b->num_allocations; i++) { cudaCheck(cudaFree(b->allocations[i])); }
    memset(b, 0, sizeof(*b));
}

static Fp8CastOutput bench_cast_output(Fp8Format format, Fp8Scaling scaling, uint8_t* codes, uint8_t* codes_t,
                                       Fp8TensorScaling* state, Fp8CastRecord* record, float* scale_inv, float* scale_inv_t) {
    bool block = scaling != FP8_SCALING_TENSOR;
    Fp8CastOutput out = {};
    out.format = format;
    out.scaling = scaling;
    out.codes = codes;
    out.codes_t = codes_t;
    out.state = state;
    out.record = record;
    out.scale_inv = block ? scale_inv : NULL;
    out.scale_inv_t = block ? scale_inv_t : NULL;
    return out;
}

/*
Points the FP8 casts at one recipe, as fp8_model.cuh does (x: E4M3, delayed per tensor or
1x128 tiles; dy: E5M2 current per tensor or E4M3 1x128 tiles; W: E4M3 current per tensor
or 128x128 blocks), with fresh states and records, then writes every code the GEMMs read:
the weight cast, x's cast (current scaling first, which seeds the delayed state from this
x's amax) and the dy pass (per tensor also -fg delayed's, whose first use seeds its history).
*/
static void bench_linear_use_recipe(LinearBench* b, bool block, cudaStream_t stream) {
    Fp8Scaling tiles = block ? FP8_SCALING_ROWS_1x128 : FP8_SCALING_TENSOR;
    b->x8 = bench_cast_output(FP8_E4M3, tiles, b->x_codes, b->x_codes_t, &b->states[0], &b->records[0],
                              b->x_scale_inv, b->x_scale_inv_t);
    b->dy8 = bench_cast_output(block ? FP8_E4M3 : FP8_E5M2, tiles, b->dy_codes, b->dy_codes_t, &b->states[1], &b->records[1],
                               b->dy_scale_inv, b->dy_scale_inv_t);
    b->w8 = bench_cast_output(FP8_E4M3, block ? FP8_SCALING_BLOCKS_128x128 : FP8_SCALING_TENSOR, b->w_codes, b->w_codes_t,
                              &b->states[2], &b->records[2], b->w_scale_inv, b->w_scale_inv_t);
    b->dy8_delayed = bench_cast_output(FP8_E5M2, FP8_SCALING_TENSOR, b->dy_codes, b->dy_codes_t, &b->states[3],
                                       &b->records[3], NULL, NULL);
    Fp8TensorScaling host[4];
    fp8_scaling_init(&host[0], FP8_RECIPE_DELAYED, FP8_E4M3, FP8_AMAX_HISTORY_DEFAULT, 0);
    fp8_scaling_init(&host[1], FP8_RECIPE_CURRENT, FP8_E5M2, FP8_AMAX_HISTORY_DEFAULT, 0);
    fp8_scaling_init(&host[2], FP8_RECIPE_CURRENT, FP8_E4M3, FP8_AMAX_HISTORY_DEFAULT, 0);
    fp8_scaling_init(&host[3], FP8_RECIPE_DELAYED, FP8_E5M2, FP8_AMAX_HISTORY_DEFAULT, 0);
    cudaCheck(cudaMemcpyAsync(b->states, host, sizeof(host), cudaMemcpyHostToDevice, stream));
    cudaCheck(cudaStreamSynchronize(stream));  // host is on this function's stack
    fp8_cast_records_init(b->records, 4, stream);

    fp8_cast_weight(&b->w8, b->master, NULL, b->OC, b->K, false, stream);
    if (block) { fp8_cast_transpose(&b->x8, b->x, b->BT, b->K, stream); }
    else { fp8_cast_transpose_current(&b->x8, b->x, b->BT, b->K, stream); }
    if (!block) { matmul_backward_fp8_dout(&b->dy8_delayed, NULL, b->dbias_scratch, b->dy, NULL, b->BT, b->OC, FP8_DOUT_NEEDS_AMAX, stream); }
    matmul_backward_fp8_dout(&b->dy8, NULL, b->dbias_scratch, b->dy, NULL, b->BT, b->OC, FP8_DOUT_NEEDS_AMAX, stream);
}

// ----------------------------------------------------------------------------
// what is timed: one launch of each variant and pass

typedef void (*BenchLaunch)(LinearBench* b, cudaStream_t stream);

static void bench_bf16_forward(LinearBench* b, cudaStream_t stream) {
    matmul_forward(b->out, b->x, b->w, b->bias, b->BT, b->K, b->OC, NULL, stream);
}

static void bench_bf16_backward(LinearBench* b, cudaStream_t stream) {
    matmul_backward(b->dinp, b->dw, b->dbias, b->dy, b->x, b->w, b->dbias_scratch, b->BT, b->K, b->OC, NULL, stream);
}

static void bench_bf16_backward_gemms(LinearBench* b, cudaStream_t stream) {
    matmul_backward(b->dinp, b->dw, (floatX*)NULL, b->dy, b->x, b->w, b->dbias_scratch, b->BT, b->K, b->OC, NULL, stream);
}

static void bench_fp8_forward(LinearBench* b, cudaStream_t stream) {
    matmul_forward_fp8(b->out, fp8_operand(&b->x8, false), fp8_operand(&b->w8, false), b->bias, b->BT, b->K, b->OC,
                       NULL, stream);
}

static void bench_fp8_forward_with_cast(LinearBench* b, cudaStream_t stream) {
    fp8_cast_transpose(&b->x8, b->x, b->BT, b->K, stream);
    bench_fp8_forward(b, stream);
}

static void bench_fp8_backward_gemms(LinearBench* b, const Fp8CastOutput* dy8, cudaStream_t stream) {
    matmul_backward_fp8(b->dinp, b->dw, CUDA_R_16BF, fp8_operand(dy8, false), fp8_operand(dy8, true),
                        fp8_operand(&b->w8, true), fp8_operand(&b->x8, true), b->BT, b->K, b->OC, NULL, stream);
}

static void bench_fp8_backward(LinearBench* b, cudaStream_t stream) { bench_fp8_backward_gemms(b, &b->dy8, stream); }

static void bench_fp8_backward_with_cast(LinearBench* b, cudaStream_t stream) {
    matmul_backward_fp8_dout(&b->dy8, b->dbias, b->dbias_scratch, b->dy, NULL, b->BT, b->OC, FP8_DOUT_NEEDS_AMAX, stream);
    bench_fp8_backward_gemms(b, &b->dy8, stream);
}

// -fg delayed: the dy pass casts with the seeded state's scale (one read of dy)
static void bench_fp8_backward_with_delayed_cast(LinearBench* b, cudaStream_t stream) {
    matmul_backward_fp8_dout(&b->dy8_delayed, b->dbias, b->dbias_scratch, b->dy, NULL, b->BT, b->OC, FP8_DOUT_SCALE_KNOWN, stream);
    bench_fp8_backward_gemms(b, &b->dy8_delayed, stream);
}

static void bench_fp8_weight_cast(LinearBench* b, cudaStream_t stream) {
    fp8_cast_weight(&b->w8, b->master, NULL, b->OC, b->K, false, stream);
}

static void bench_ranked_gemm(LinearBench* b, cudaStream_t stream) { matmul_cublaslt_ranked(&b->ranked, b->rank, stream); }

// --algorithms: a linear's three GEMMs alone, as the trainer's launchers build them (bf16: the forward
// with its bias epilogue; FP8: the per-tensor recipe's codes, bench_linear_use_recipe)
typedef enum { GEMM_FWD, GEMM_DGRAD, GEMM_WGRAD, NUM_BENCH_GEMMS } BenchGemm;
static const char* const BENCH_GEMM_NAMES[NUM_BENCH_GEMMS] = {"fwd", "dgrad", "wgrad"};
typedef enum { GEMM_BF16, GEMM_FP8, NUM_GEMM_PRECISIONS } BenchGemmPrecision;
static const char* const BENCH_GEMM_PRECISION_NAMES[NUM_GEMM_PRECISIONS] = {"bf16", "fp8"};

static MatmulSpec bench_gemm_spec(LinearBench* b, int gemm, int precision) {
    if (precision == GEMM_BF16) {
        if (gemm == GEMM_FWD) { return matmul_forward_spec(b->out, b->x, b->w, b->bias, b->BT, b->K, b->OC, NULL); }
        if (gemm == GEMM_DGRAD) { return matmul_dgrad_spec(b->dinp, b->dy, b->w, b->BT, b->K, b->OC, NULL); }
        return matmul_wgrad_spec(b->dw, b->dy, b->x, b->BT, b->K, b->OC);
    }
    if (gemm == GEMM_FWD) {
        return matmul_forward_fp8_spec(b->out, fp8_operand(&b->x8, false), fp8_operand(&b->w8, false), b->bias, b->BT,
                                       b->K, b->OC, NULL);
    }
    if (gemm == GEMM_DGRAD) {
        return matmul_dgrad_fp8_spec(b->dinp, fp8_operand(&b->dy8, false), fp8_operand(&b->w8, true), b->BT, b->K, b->OC, NULL);
    }
    return matmul_wgrad_fp8_spec(b->dw, CUDA_R_16BF, fp8_operand(&b->dy8, true), fp8_operand(&b->x8, true), b->BT, b->K, b->OC);
}

typedef struct {
    cudaStream_t stream;
    cudaEvent_t start, stop;
    const BenchOptions* options;
} BenchTimer;

static int bench_compare_floats(const void* a, const void* b) {
    float x = *(const float*)a, y = *(const float*)b;
    return (x > y) - (x < y);
}

// ms per launch: the median over BENCH_REPEATS event-timed loops of options->iters launches
static double bench_time_ms(const BenchTimer* timer, BenchLaunch launch, LinearBench* b) {
    for (int i = 0; i < timer->options->warmup; i++) { launch(b, timer->stream); }
    float ms[BENCH_REPEATS];
    for (int r = 0; r < BENCH_REPEATS; r++) {
        cudaCheck(cudaEventRecord(timer->start, timer->stream));
        for (int i = 0; i < timer->options->iters; i++) { launch(b, timer->stream); }
        cudaCheck(cudaEventRecord(timer->stop, timer->stream));
        cudaCheck(cudaEventSynchronize(timer->stop));
        cudaCheck(cudaEventElapsedTime(&ms[r], timer->start, timer->stop));
        ms[r] /= (float)timer->options->iters;
    }
    qsort(ms, BENCH_REPEATS, sizeof(float), bench_compare_floats);
    return ms[BENCH_REPEATS / 2];
}

// ----------------------------------------------------------------------------
// one model: measure every linear, then the derived rows

// one GEMM's algorithms (--algorithms): how many the heuristic listed (up to the flag; 0: not
// measured), the first's time and the fastest's, in ms per launch
typedef struct {
    int listed;
    double first_ms, fastest_ms;
    int fastest_rank;
} AlgorithmTiming;

typedef struct {
    const char* name;
    GPT2Config cfg;
    int B, BT;
    const char* block_skip;  // why the block recipe is not measured, or NULL
    char block_skip_text[256];
    int K[NUM_LINEAR_KINDS], OC[NUM_LINEAR_KINDS];
    double ms[BENCH_ROWS][NUM_BENCH_PASSES][NUM_BENCH_VARIANTS];  // NaN: not measured, not applicable
    double flops[BENCH_ROWS][NUM_BENCH_PASSES];
    AlgorithmTiming algorithms[NUM_LINEAR_KINDS][NUM_GEMM_PRECISIONS][NUM_BENCH_GEMMS];
} ModelBench;

// how often linear `kind` runs per micro-step
static int bench_linear_count(const ModelBench* m, int kind) {
    return kind == LINEAR_LM_HEAD ? 1 : m->cfg.num_layers;
}

// why the block recipe is not measured for this linear (cuBLASLt has no block-scaled
// algorithm for one of its GEMMs, e.g. a K that is not a multiple of 128), or NULL; the
// recipe's codes are in place (bench_linear_use_recipe)
static const char* bench_block_skip_reason(const LinearBench* b, const char* linear, char* buffer, size_t size) {
    bool forward = matmul_forward_fp8_supported(b->out, fp8_operand(&b->x8, false), fp8_operand(&b->w8, false), b->bias,
                                                b->BT, b->K, b->OC, NULL);
    bool backward = matmul_backward_fp8_supported(b->dinp, b->dw, CUDA_R_16BF, fp8_operand(&b->dy8, false),
                                                  fp8_operand(&b->dy8, true), fp8_operand(&b->w8, true),
                                                  fp8_operand(&b->x8, true), b->BT, b->K, b->OC, NULL);
    if (forward && backward) { return NULL; }
    snprintf(buffer, size, "block recipe not measured: this cuBLASLt has no block-scaled algorithm for %s's %s "
             "(BT=%d, K=%d, OC=%d)", linear, forward ? "backward" : "forward", b->BT, b->K, b->OC);
    return buffer;
}

// --algorithms: each of the linear's GEMMs in `precision` with every algorithm listed, up to the flag's count
static void bench_measure_algorithms(ModelBench* m, int kind, int precision, LinearBench* b, const BenchTimer* timer) {
    for (int gemm = 0; gemm < NUM_BENCH_GEMMS; gemm++) {
        AlgorithmTiming* t = &m->algorithms[kind][precision][gemm];
        b->ranked = bench_gemm_spec(b, gemm, precision);
        t->listed = matmul_cublaslt_algorithms(&b->ranked, timer->options->algorithms);
        for (b->rank = 0; b->rank < t->listed; b->rank++) {
            double ms = bench_time_ms(timer, bench_ranked_gemm, b);
            if (b->rank == 0) { t->first_ms = ms; }
            if (b->rank == 0 || ms < t->fastest_ms) { t->fastest_ms = ms; t->fastest_rank = b->rank; }
        }
    }
}

static void bench_measure_linear(ModelBench* m, int kind, const BenchTimer* timer) {
    int K = m->K[kind], OC = m->OC[kind];
    fprintf(stderr, "bench_gemm: %s %s (BT=%d, K=%d, OC=%d)\n", m->name, LINEAR_KIND_NAMES[kind], m->BT, K, OC);
    LinearBench b;
    bench_linear_create(&b, m->BT, K, OC, kind != LINEAR_LM_HEAD, true, 1000u * (uint32_t)kind, timer->stream);
    double (*ms)[NUM_BENCH_VARIANTS] = m->ms[kind];
    ms[PASS_FWD][VARIANT_BF16] = bench_time_ms(timer, bench_bf16_forward, &b);
    ms[PASS_BWD][VARIANT_BF16] = bench_time_ms(timer, bench_bf16_backward, &b);
    ms[PASS_FWD][VARIANT_BF16_GEMMS] = ms[PASS_FWD][VARIANT_BF16];  // the same launch
    ms[PASS_BWD][VARIANT_BF16_GEMMS] = bench_time_ms(timer, bench_bf16_backward_gemms, &b);
    if (timer->options->algorithms > 0) { bench_measure_algorithms(m, kind, GEMM_BF16, &b, timer); }
    for (int block = 0; block <= 1; block++) {
        if (block && m->block_skip != NULL) { continue; }
        int gemm = block ? VARIANT_BLOCK : VARIANT_FP8, with_cast = gemm + 1;
        bench_linear_use_recipe(&b, block, timer->stream);
        if (block) {
            m->block_skip = bench_block_skip_reason(&b, LINEAR_KIND_NAMES[kind], m->block_skip_text, sizeof(m->block_skip_text));
            if (m->block_skip != NULL) { continue; }
        }
        ms[PASS_FWD][gemm] = bench_time_ms(timer, bench_fp8_forward, &b);
        ms[PASS_FWD][with_cast] = bench_time_ms(timer, bench_fp8_forward_with_cast, &b);
        ms[PASS_BWD][gemm] = bench_time_ms(timer, bench_fp8_backward, &b);
        ms[PASS_BWD][with_cast] = bench_time_ms(timer, bench_fp8_backward_with_cast, &b);
        ms[PASS_WCAST][gemm] = bench_time_ms(timer, bench_fp8_weight_cast, &b);
        if (!block) {  // the same forward, and the backward with -fg delayed's dy pass
            ms[PASS_FWD][VARIANT_FP8_CAST_FGD] = bench_time_ms(timer, bench_fp8_forward_with_cast, &b);
            ms[PASS_BWD][VARIANT_FP8_CAST_FGD] = bench_time_ms(timer, bench_fp8_backward_with_delayed_cast, &b);
            if (timer->options->algorithms > 0) { bench_measure_algorithms(m, kind, GEMM_FP8, &b, timer); }
        }
    }
    bench_linear_free(&b);
}

// fwd+bwd rows, FLOPs, and the total row (each linear times how often it runs)
static void bench_derive(ModelBench* m) {
    for (int kind = 0; kind < NUM_LINEAR_KINDS; kind++) {
        double gemm_flops = 2.0 * m->BT * m->K[kind] * m->OC[kind];
        m->flops[kind][PASS_FWD] = gemm_flops;
        m->flops[kind][PASS_BWD] = 2.0 * gemm_flops;
        m->flops[kind][PASS_FWD_BWD] = 3.0 * gemm_flops;
        m->flops[kind][PASS_WCAST] = 0.0;
        for (int v = 0; v < NUM_BENCH_VARIANTS; v++) {
            m->ms[kind][PASS_FWD_BWD][v] = m->ms[kind][PASS_FWD][v] + m->ms[kind][PASS_BWD][v];
        }
    }
    for (int p = 0; p < NUM_BENCH_PASSES; p++) {
        m->flops[BENCH_TOTAL_ROW][p] = 0.0;
        for (int v = 0; v < NUM_BENCH_VARIANTS; v++) { m->ms[BENCH_TOTAL_ROW][p][v] = 0.0; }
        for (int kind = 0; kind < NUM_LINEAR_KINDS; kind++) {
            int count = bench_linear_count(m, kind);
            m->flops[BENCH_TOTAL_ROW][p] += count * m->flops[kind][p];
            for (int v = 0; v < NUM_BENCH_VARIANTS; v++) { m->ms[BENCH_TOTAL_ROW][p][v] += count * m->ms[kind][p][v]; }
        }
    }
}

static const char* bench_row_name(int row) { return row == BENCH_TOTAL_ROW ? "total" : LINEAR_KIND_NAMES[row]; }

static double bench_tflops(const ModelBench* m, int row, int pass, int variant) {
    double ms = m->ms[row][pass][variant];
    return m->flops[row][pass] > 0.0 ? m->flops[row][pass] / (ms * 1e-3) / 1e12 : NAN;
}

// the variant's baseline's time over its own (NaN where either is missing)
static double bench_ratio(const ModelBench* m, int row, int pass, int variant) {
    return m->ms[row][pass][bench_baseline(variant)] / m->ms[row][pass][variant];
}

// ----------------------------------------------------------------------------
// output: a markdown table per model, and JSON lines

static const char* bench_cell(char* buffer, size_t size, const char* format, double value) {
    if (isfinite(value)) { snprintf(buffer, size, format, value); } else { snprintf(buffer, size, "-"); }
    return buffer;
}

static void bench_print_model(const ModelBench* m) {
    printf("\n### %s: L=%d, C=%d, B=%d, T=%d (BT=%d); total = L x (qkv + attproj + fc + fcproj) + lm_head\n\n",
           m->name, m->cfg.num_layers, m->cfg.channels, m->B, BENCH_T, m->BT);
    printf("| linear | K | OC | pass | bf16 ms | TFLOP/s | bf16-gemms ms | TFLOP/s |");
    for (int v = VARIANT_FP8; v < NUM_BENCH_VARIANTS; v++) { printf(" %s ms | TFLOP/s | x |", BENCH_VARIANT_NAMES[v]); }
    printf("\n|---|---|---|---|---|---|---|---|");
    for (int v = VARIANT_FP8; v < NUM_BENCH_VARIANTS; v++) { printf("---|---|---|"); }
    printf("\n");
    for (int row = 0; row < BENCH_ROWS; row++) {
        for (int p = 0; p < NUM_BENCH_PASSES; p++) {
            char k[16], oc[16], a[32], b[32], c[32];
            bench_cell(k, sizeof(k), "%.0f", row == BENCH_TOTAL_ROW ? NAN : (double)m->K[row]);
            bench_cell(oc, sizeof(oc), "%.0f", row == BENCH_TOTAL_ROW ? NAN : (double)m->OC[row]);
            printf("| %s | %s | %s | %s |", bench_row_name(row), k, oc, BENCH_PASS_NAMES[p]);
            for (int v = 0; v < NUM_BENCH_VARIANTS; v++) {
                printf(" %s | %s |", bench_cell(a, sizeof(a), "%.4f", m->ms[row][p][v]),
                       bench_cell(b, sizeof(b), "%.0f", bench_tflops(m, row, p, v)));
                if (v >= VARIANT_FP8) { printf(" %s |", bench_cell(c, sizeof(c), "%.2fx", bench_ratio(m, row, p, v))); }
            }
            printf("\n");
        }
    }
    if (m->block_skip != NULL) { printf("\n%s: %s\n", m->name, m->block_skip); }
    fflush(stdout);
}

// the whole model's first and fastest times of a precision's GEMMs (each linear times its count); false
// where a GEMM was not measured
static bool bench_algorithms_total(const ModelBench* m, int precision, double* first_ms, double* fastest_ms) {
    *first_ms = *fastest_ms = 0.0;
    for (int kind = 0; kind < NUM_LINEAR_KINDS; kind++) {
        for (int gemm = 0; gemm < NUM_BENCH_GEMMS; gemm++) {
            const AlgorithmTiming* t = &m->algorithms[kind][precision][gemm];
            if (t->listed == 0) { return false; }
            *first_ms += bench_linear_count(m, kind) * t->first_ms;
            *fastest_ms += bench_linear_count(m, kind) * t->fastest_ms;
        }
    }
    return true;
}

// --algorithms: per GEMM and for the whole model, the heuristic's first algorithm against the fastest listed
static void bench_print_algorithms(const ModelBench* m, int most) {
    printf("\n#### %s: cuBLASLt's first algorithm (training's) against the fastest of the first %d it lists\n\n"
           "| linear | GEMM | precision | listed | first ms | fastest ms | fastest rank | first / fastest |\n"
           "|---|---|---|---|---|---|---|---|\n", m->name, most);
    for (int kind = 0; kind < NUM_LINEAR_KINDS; kind++) {
        for (int precision = 0; precision < NUM_GEMM_PRECISIONS; precision++) {
            for (int gemm = 0; gemm < NUM_BENCH_GEMMS; gemm++) {
                const AlgorithmTiming* t = &m->algorithms[kind][precision][gemm];
                if (t->listed == 0) { continue; }
                printf("| %s | %s | %s | %d | %.4f | %.4f | %d | %.3fx |\n", LINEAR_KIND_NAMES[kind], BENCH_GEMM_NAMES[gemm],
                       BENCH_GEMM_PRECISION_NAMES[precision], t->listed, t->first_ms, t->fastest_ms, t->fastest_rank,
                       t->first_ms / t->fastest_ms);
            }
        }
    }
    for (int precision = 0; precision < NUM_GEMM_PRECISIONS; precision++) {
        double first_ms, fastest_ms;
        if (bench_algorithms_total(m, precision, &first_ms, &fastest_ms)) {
            printf("| total | all | %s | - | %.4f | %.4f | - | %.3fx |\n", BENCH_GEMM_PRECISION_NAMES[precision], first_ms,
                   fastest_ms, first_ms / fastest_ms);
        }
    }
    fflush(stdout);
}

// a JSON string: quotes and backslashes escaped, control characters dropped
static void bench_json_string(FILE* fp, const char* text) {
    fputc('"', fp);
    for (const char* c = text; *c != '\0'; c++) {
        if (*c == '"' || *c == '\\') { fputc('\\', fp); }
        if ((unsigned char)*c >= 0x20) { fputc(*c, fp); }
    }
    fputc('"', fp);
}

static void bench_json_begin(FILE* fp, const char* record, const ModelBench* m, int row) {
    fprintf(fp, "{\"record\":\"%s\",\"model\":\"%s\",\"linear\":\"%s\",\"L\":%d,\"C\":%d,\"B\":%d,\"T\":%d",
            record, m->name, bench_row_name(row), m->cfg.num_layers, m->cfg.channels, m->B, BENCH_T);
    if (row != BENCH_TOTAL_ROW) { fprintf(fp, ",\"K\":%d,\"OC\":%d,\"count\":%d", m->K[row], m->OC[row], bench_linear_count(m, row)); }
}

// every measured or derived time, then every ratio; nothing for what was not measured
static void bench_write_json_model(FILE* fp, const ModelBench* m) {
    for (int row = 0; row < BENCH_ROWS; row++) {
        for (int p = 0; p < NUM_BENCH_PASSES; p++) {
            for (int v = 0; v < NUM_BENCH_VARIANTS; v++) {
                double ms = m->ms[row][p][v];
                if (!isfinite(ms)) { continue; }
                bench_json_begin(fp, "time", m, row);
                fprintf(fp, ",\"pass\":\"%s\",\"variant\":\"%s\",\"derived\":%s,\"ms\":%.9g",
                        BENCH_PASS_NAMES[p], BENCH_VARIANT_NAMES[v],
                        (row == BENCH_TOTAL_ROW || p == PASS_FWD_BWD) ? "true" : "false", ms);
                double tflops = bench_tflops(m, row, p, v);
                if (isfinite(tflops)) { fprintf(fp, ",\"tflops\":%.9g}\n", tflops); } else { fprintf(fp, ",\"tflops\":null}\n"); }
            }
        }
    }
    for (int row = 0; row < BENCH_ROWS; row++) {
        for (int p = PASS_FWD; p <= PASS_FWD_BWD; p++) {
            for (int v = VARIANT_FP8; v < NUM_BENCH_VARIANTS; v++) {
                double ratio = bench_ratio(m, row, p, v);
                if (!isfinite(ratio)) { continue; }
                bench_json_begin(fp, "ratio", m, row);
                fprintf(fp, ",\"pass\":\"%s\",\"variant\":\"%s\",\"ratio\":%.9g}\n", BENCH_PASS_NAMES[p], BENCH_VARIANT_NAMES[v], ratio);
            }
        }
    }
    for (int kind = 0; kind < NUM_LINEAR_KINDS; kind++) {
        for (int precision = 0; precision < NUM_GEMM_PRECISIONS; precision++) {
            for (int gemm = 0; gemm < NUM_BENCH_GEMMS; gemm++) {
                const AlgorithmTiming* t = &m->algorithms[kind][precision][gemm];
                if (t->listed == 0) { continue; }
                bench_json_begin(fp, "algorithms", m, kind);
                fprintf(fp, ",\"gemm\":\"%s\",\"precision\":\"%s\",\"listed\":%d,\"first_ms\":%.9g,\"fastest_ms\":%.9g,"
                        "\"fastest_rank\":%d}\n", BENCH_GEMM_NAMES[gemm], BENCH_GEMM_PRECISION_NAMES[precision], t->listed,
                        t->first_ms, t->fastest_ms, t->fastest_rank);
            }
        }
    }
    if (m->block_skip != NULL) {
        fprintf(fp, "{\"record\":\"skip\",\"model\":\"%s\",\"variant\":\"block\",\"reason\":", m->name);
        bench_json_string(fp, m->block_skip);
        fprintf(fp, "}\n");
    }
    fflush(fp);
}

static void bench_model(int index, const BenchTimer* timer, FILE* json) {
    ModelBench m;
    memset(&m, 0, sizeof(m));
    m.name = BENCH_MODEL_NAMES[index];
    m.cfg = gpt2_config_from_descriptor(m.name);
    m.B = BENCH_MODEL_BATCH[index];
    m.BT = m.B * BENCH_T;
    for (int row = 0; row < BENCH_ROWS; row++) {
        for (int p = 0; p < NUM_BENCH_PASSES; p++) {
            for (int v = 0; v < NUM_BENCH_VARIANTS; v++) { m.ms[row][p][v] = NAN; }
        }
    }
    for (int kind = 0; kind < NUM_LINEAR_KINDS; kind++) {
        fp8_linear_shape((LinearKind)kind, m.cfg.channels, m.cfg.padded_vocab_size, &m.K[kind], &m.OC[kind]);
        bench_measure_linear(&m, kind, timer);
    }
    bench_derive(&m);
    bench_print_model(&m);
    if (timer->options->algorithms > 0) { bench_print_algorithms(&m, timer->options->algorithms); }
    if (json != NULL) { bench_write_json_model(json, &m); }
}

int main(int argc, char** argv) {
    BenchOptions options = bench_parse_args(argc, argv);
    FILE* json = options.json_path != NULL ? fopenCheck(options.json_path, "w") : NULL;

    DeviceInfo device = device_info_query();
    BenchTimer timer;
    timer.options = &options;
    cudaCheck(cudaStreamCreate(&timer.stream));
    cudaCheck(cudaEventCreate(&timer.start));
    cudaCheck(cudaEventCreate(&timer.stop));
    matmul_setup();
    printf("bench_gemm on %s, cuBLASLt %zu: ms per launch, median of %d repetitions of %d launches after %d warmup; "
           "x = bf16 ms / FP8 ms\n", device.name, cublasLtGetVersion(), BENCH_REPEATS, options.iters, options.warmup);
    if (json != NULL) {
        fprintf(json, "{\"record\":\"run\",\"device\":");
        bench_json_string(json, device.name);
        fprintf(json, ",\"cublaslt_version\":%zu,\"iters\":%d,\"warmup\":%d,\"repeats\":%d,\"algorithms\":%d,\"T\":%d}\n",
                cublasLtGetVersion(), options.iters, options.warmup, BENCH_REPEATS, options.algorithms, BENCH_T);
    }
    for (int i = 0; i < BENCH_NUM_MODELS; i++) {
        if (options.models & (1 << i)) { bench_model(i, &timer, json); }
    }
    if (json != NULL) { fcloseCheck(json); }
    matmul_teardown();
    cudaCheck(cudaEventDestroy(timer.start));
    cudaCheck(cudaEventDestroy(timer.stop));
    cudaCheck(cudaStreamDestroy(timer.stream));
    return 0;
}
