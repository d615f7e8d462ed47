/*
train_gpt2_fp8.cu: GPT-2 pretraining on one GPU or several, llm.c style: config, model (parameters,
activations), forward, backward, update, main loop and CLI in one translation unit.

Why one file: as in llm.c, the whole training step reads top to bottom in one place; the
kernels live in llmc/, one module per concern. Precision is a run-time choice (-p), so one
binary runs both sides of every bf16-vs-FP8 comparison on the same code path. FP8 adds
quantized copies beside the bf16 tensors (llmc/fp8_model.cuh), it does not fork this file:
each linear goes through gpt2_linear_forward / gpt2_linear_backward, which run its GEMMs in
FP8 or bf16, and the producers of a linear's input (layernorm, attention, GELU) also write
its FP8 codes when it takes them. The optimizer is a run-time choice too (-opt adamw |
adamw8): the 8-bit states replace the fp32 m and v in place (llmc/adamw8.cuh), and a
checkpoint of either optimizer resumes under both. Several GPUs (-pn, mpirun) run ZeRO-1:
each rank keeps the optimizer state of its range of the parameters only (llmc/zero.h), the
backward reduces each layer's gradients to their owners as it goes, and after the update the
weights are gathered back, the FP8 matmul weights as FP8 (llmc/zero_comm.cuh). ZeRO-3 (-z 3)
keeps the block linears' weights sharded too, each layer's gathered just before its use
(llmc/sparse_buffer.cuh backs only the rank's own part). One GPU is the one-rank case of
the same code: it owns everything and nothing is communicated.

Everything that can be checked without the GPU (flags, model file headers, data shards,
output dir) is checked before the first CUDA call, so bad input fails fast with one line.
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <time.h>
#include <unistd.h>
#include "llmc/utils.h"            // fail-fast I/O, llm8_die, flag parsing helpers
#include "llmc/rand.h"             // llm.c's xorshift* coins for text samples
#include "llmc/element_math.h"     // bf16 rounding, AdamW element update (shared with the CPU reference)
#include "llmc/gpt2_config.h"      // GPT2Config, the 16 parameter tensors, random init
#include "llmc/train_config.h"     // the command line (one table: flags, defaults, ranges, help)
#include "llmc/dataloader.h"       // llm.c token shards
#include "llmc/eval_loader.h"      // HellaSwag eval files
#include "llmc/tokenizer.h"        // decoding samples
#include "llmc/checkpoint.h"       // model/state files, atomic writes, DONE markers
#include "llmc/train_state.h"      // resume into either optimizer, converting fp32 <-> 8-bit states
#include "llmc/state_reshard.h"    // resume a checkpoint of N ranks on M: optimizer state resharded
#include "llmc/schedulers.h"       // learning-rate schedules
#include "llmc/logger.h"           // main.log (llm.c format) + main.jsonl
#include "llmc/cuda_common.h"      // cudaCheck, floatX, allocation with OOM advice, device info
#include "llmc/cuda_utils.cuh"     // reductions, device stochastic rounding
#include "llmc/encoder.cuh"        // token + position embedding, forward/backward
#include "llmc/layernorm.cuh"      // layernorm, fused residual+layernorm
#include "llmc/gelu.cuh"           // GELU (when not fused into the matmul epilogue)
#include "llmc/matmul.cuh"         // cuBLASLt GEMMs with bias/GELU epilogues
#include "llmc/attention.cuh"      // causal attention: cuDNN flash attention or fallback
#include "llmc/fused_classifier.cuh" // softmax + cross-entropy + dlogits
#include "llmc/adamw.cuh"          // AdamW with fp32 master weights, stochastic rounding
#include "llmc/adamw8.cuh"         // 8-bit AdamW (-opt adamw8): fused kernel, device states
#include "llmc/global_norm.cuh"    // deterministic global gradient norm
#include "llmc/profiler.h"         // per-kernel time breakdown (-kt 1)
#include "llmc/fp8_recipe.h"       // what -p fp8 quantizes: recipe, linears, passes
#include "llmc/fp8_model.cuh"      // FP8 codes, scaling states, weight casts, numerics log
#include "llmc/multi_gpu.h"        // one process per GPU: NCCL communicator, bounded waits
#include "llmc/zero.h"             // ZeRO: which rank owns which parameters
#include "llmc/zero_comm.cuh"      // ZeRO-1/3's collectives: gradient reduce, weight gather (bf16 / FP8)
#include "llmc/sparse_buffer.cuh"  // ZeRO-3's parameters: an address range backed only where the rank needs it
#include "llmc/outlier_skip.h"     // -sl / -sg: skip an update whose loss or gradient norm is an outlier
#include "llmc/gpu_monitor.h"      // -lg: the GPU's clock, power and temperature through NVML


// ----------------------------------------------------------------------------
// activations

typedef struct {
    floatX* encoded;      // [B][T][C]
    floatX* ln1;          // [L][B][T][C] ([B][T][C] when one layer's buffer serves all: ln1_stride 0)
    float* ln1_mean;      // [L][B][T]
    float* ln1_rstd;      // [L][B][T]
    floatX* qkv;          // [L][B][T][3C]
    floatX* atty;         // [L][B][T][C]
    float* att_stats;     // [L][B][NH][T] logsumexp per query row, each layer's att_stats_stride apart
    floatX* residual2;    // [L][B][T][C]
    floatX* ln2;          // [L][B][T][C] (or one layer's, ln2_stride 0)
    float* ln2_mean;      // [L][B][T]
    float* ln2_rstd;      // [L][B][T]
    floatX* fch;          // [L][B][T][4C] pre-GELU
    floatX* fch_gelu;     // [L][B][T][4C] (or one layer's, fch_gelu_stride 0)
    floatX* residual3;    // [L][B][T][C]
    floatX* lnf;          // [B][T][C]
    float* lnf_mean;      // [B][T]
    float* lnf_rstd;      // [B][T]
    float* losses;        // [B][T], summed over micro-steps
    floatX* output;       // [B][T][Vp] logits, then dlogits
    floatX* scratch_btc;  // [B][T][C] matmul outputs before the residual add; dinp in backward
    floatX* scratch_bt4c; // [B][T][4C] backward scratch (also dqkv)
    floatX* dresidual;    // [B][T][C] gradient of the residual stream
    float* scratch_f;     // dbias / layernorm / norm partial sums
    size_t ln1_stride, ln2_stride, fch_gelu_stride; // elements from one layer's copy to the next, a multiple of 256 bytes (0: one shared buffer)
    size_t att_stats_stride; // B*NH*T rounded up to 4 floats: attention wants every layer's stats 16-byte aligned
} Activations;

// one layer's slices of the activations
typedef struct {
    floatX* residual;     // the layer's input: encoded, or the previous layer's residual3
    floatX* ln1;
    float* ln1_mean;
    float* ln1_rstd;
    floatX* qkv;
    floatX* atty;
    float* att_stats;
    floatX* residual2;
    floatX* ln2;
    float* ln2_mean;
    float* ln2_rstd;
    floatX* fch;
    floatX* fch_gelu;
    floatX* residual3;
} LayerActivations;

typedef struct {
    GPT2Config config;
    size_t param_sizes[NUM_PARAMETER_TENSORS];
    size_t param_offsets[NUM_PARAMETER_TENSORS];
    size_t num_parameters;
    floatX* params;         // bf16 weights used by the kernels, all of them (padded to the ZeRO layout); ZeRO-3:
                            // the other ranks' parts of the block linears' weights are not mapped (params_buffer)
    SparseBuffer params_buffer; // ZeRO-3's params: reserved whole, backed under zero3_resident_ranges only
    int zero3;              // -z 3 (llmc/zero_comm.cuh)
    floatX* grads;          // bf16 gradients, accumulated over micro-steps (same size)
    ZeroLayout zero;        // which rank owns which parameters (one GPU: rank 0 owns all)
    int rank;
    ZeroRange owned;        // this rank's flat parameters: the optimizer updates these only
    ZeroComm* comm;         // the collectives (NULL on one GPU)
    float* master;          // fp32 master weights of the owned range (NULL with -w 0)
    int use_adamw8;                // -opt adamw8: 8-bit m and v (doc/adamw8.md); else fp32 m and v
    Adamw8Selection adamw8_selection;
    Adamw8Layout opt_layout;       // the owned range's optimizer states (plain AdamW: no 8-bit tensor)
    Adamw8States opt_states;       // device
    Quant8Maps* opt_maps;          // device, -opt adamw8 only
    float* norm_squared;    // [1] on the device
    Activations acts;
    int B, T;
    int recompute;
    int gelu_fusion;
    EncoderBackwardScratch* encoder_scratch;
    Fp8Model fp8;           // the FP8 linears' codes and scaling (nothing in a bf16 run)
    int* inputs;            // [B][T] device
    int* targets;           // [B][T] device
    int* inputs_cpu;        // copy of the last forward's inputs, for the encoder backward
    float* losses_cpu;      // [B][T]
    floatX* logits_row_cpu; // [Vp], for sampling
} GPT2;

// pointer to tensor i (all layers) in a bf16 buffer laid out like the parameters
static floatX* param_tensor(const GPT2* model, floatX* base, int i) { return base + model->param_offsets[i]; }
// pointer to layer l's slice of per-layer tensor i
static floatX* layer_tensor(const GPT2* model, floatX* base, int i, int l) {
    return base + model->param_offsets[i] + (size_t)l * (model->param_sizes[i] / model->config.num_layers);
}

static void gpt2_init_layout(GPT2* model, const GPT2Config* cfg) {
    memset(model, 0, sizeof(*model));
    model->config = *cfg;
    gpt2_param_sizes(cfg, model->param_sizes);
    size_t offset = 0;
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        model->param_offsets[i] = offset;
        offset += model->param_sizes[i];
    }
    model->num_parameters = offset;
}

// each value to the nearest bf16, in place: llm.c stores its random init in bf16 and its fp32 master
// weights start from those bf16 weights, so a run from a descriptor starts where llm.c's does
static void params_round_to_bf16(float* params, size_t n) {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) { params[i] = bf16_bits_to_float(float_to_bf16_bits(params[i])); }
}

// uploads fp32 parameters: bf16 copy by round-to-nearest (all), and the fp32 master (owned range) if kept
static void gpt2_upload_params(GPT2* model, const float* params_cpu, int use_master_weights) {
    size_t n = model->num_parameters, padded = model->zero.padded_total;
    uint16_t* bf16 = (uint16_t*)mallocCheck(n * sizeof(uint16_t));
#pragma omp parallel for schedule(static)  // d48: 1.56e9 conversions, at every start
    for (size_t i = 0; i < n; i++) { bf16[i] = float_to_bf16_bits(params_cpu[i]); }
    if (!model->zero3) {
        model->params = (floatX*)cuda_malloc_checked(padded * sizeof(floatX), "parameters (bf16)");
        cudaCheck(cudaMemset(model->params, 0, padded * sizeof(floatX)));
        cudaCheck(cudaMemcpy(model->params, bf16, n * sizeof(floatX), cudaMemcpyHostToDevice));
    } else {  // only what this rank keeps (every tensor but the others' parts of the block linears' weights)
        int device;
        cudaCheck(cudaGetDevice(&device));
        ZeroRange ranges[ZERO3_MAX_RESIDENT_RANGES];
        int count = zero3_resident_ranges(&model->zero, model->rank, sizeof(floatX), sparse_buffer_granularity(device), ranges,
                                          ZERO3_MAX_RESIDENT_RANGES);
        sparse_buffer_create(&model->params_buffer, padded * sizeof(floatX), ranges, count, device, "parameters (bf16, ZeRO-3)");
        model->params = (floatX*)model->params_buffer.base;
        for (int r = 0; r < count; r++) {
            char* at = (char*)model->params + ranges[r].begin;
            cudaCheck(cudaMemset(at, 0, ranges[r].end - ranges[r].begin));
            size_t real_end = ranges[r].end < n * sizeof(floatX) ? ranges[r].end : n * sizeof(floatX);
            if (ranges[r].begin < real_end) {
                cudaCheck(cudaMemcpy(at, (const char*)bf16 + ranges[r].begin, real_end - ranges[r].begin, cudaMemcpyHostToDevice));
            }
        }
    }
    free(bf16);
    model->master = NULL;
    size_t owned = model->owned.end - model->owned.begin;
    if (use_master_weights && owned > 0) {
        model->master = (float*)cuda_malloc_checked(owned * sizeof(float), "fp32 master weights (-w 0 drops them)");
        cudaCheck(cudaMemcpy(model->master, params_cpu + model->owned.begin, owned * sizeof(float), cudaMemcpyHostToDevice));
    }
}

// whether linear (layer, kind) reads the bf16 copy of its input in `pass` (FP8_FWD: the
// forward GEMM, FP8_WGRAD: the weight gradient's; dgrad never reads the input), which it
// does unless that pass of that linear runs in FP8
static int gpt2_reads_bf16_input(const GPT2* model, int layer, int kind, Fp8Pass pass) {
    return !fp8_model_runs(&model->fp8, fp8_model_linear(&model->fp8, layer, kind), pass);
}

// whether the forward must store that bf16 copy at all (an all-FP8 linear reads only codes)
static int gpt2_stores_bf16_input(const GPT2* model, int layer, int kind) {
    return gpt2_reads_bf16_input(model, layer, kind, FP8_FWD) || gpt2_reads_bf16_input(model, layer, kind, FP8_WGRAD);
}

// elements from one layer's slice of a per-layer bf16 activation to the next: `elements`
// rounded up so that every slice starts 256-byte aligned, as a buffer of its own does
static size_t layer_slice_stride(size_t elements) {
    const size_t per_256_bytes = 256 / sizeof(floatX);
    return ceil_div_size(elements, per_256_bytes) * per_256_bytes;
}

static void gpt2_allocate_state(GPT2* model, int B, int T) {
    const GPT2Config* cfg = &model->config;
    size_t padded = model->zero.padded_total;
    model->grads = (floatX*)cuda_malloc_checked(padded * sizeof(floatX), "gradients (bf16)");
    cudaCheck(cudaMemset(model->grads, 0, padded * sizeof(floatX)));
    adamw8_states_alloc_device(&model->opt_states, &model->opt_layout);  // fp32 m and v are its m32, v32
    if (model->use_adamw8) { model->opt_maps = adamw8_maps_upload(); }
    model->norm_squared = (float*)cuda_malloc_checked(sizeof(float), "gradient norm");

    size_t L = cfg->num_layers, C = cfg->channels, NH = cfg->num_heads, Vp = cfg->padded_vocab_size;
    size_t BT = (size_t)B * T;
    // a layer's bf16 layernorm or GELU output is kept for the backward only when a bf16 GEMM
    // reads it there (and -r does not recompute it); else one layer's buffer serves every
    // layer: the forward writes it and its consumers read it right away (or, in all-FP8
    // linears, only its FP8 cast does). Every kept layer's slice starts 256-byte aligned, as the
    // shared buffer does: cuBLASLt's heuristic may choose another algorithm (other bits) for a
    // less aligned operand, and -r must not change the bits
    Activations* a = &model->acts;
    int r = model->recompute;
    a->ln1_stride = r < linear_input_recompute_level(LINEAR_QKV) && gpt2_stores_bf16_input(model, 0, LINEAR_QKV)
                  ? layer_slice_stride(BT * C) : 0;
    a->ln2_stride = r < linear_input_recompute_level(LINEAR_FC) && gpt2_stores_bf16_input(model, 0, LINEAR_FC)
                  ? layer_slice_stride(BT * C) : 0;
    a->fch_gelu_stride = r < linear_input_recompute_level(LINEAR_FCPROJ) && gpt2_stores_bf16_input(model, 0, LINEAR_FCPROJ)
                       ? layer_slice_stride(BT * 4 * C) : 0;
    size_t ln1_bytes = (a->ln1_stride ? L * a->ln1_stride : BT * C) * sizeof(floatX);
    size_t ln2_bytes = (a->ln2_stride ? L * a->ln2_stride : BT * C) * sizeof(floatX);
    size_t gelu_bytes = (a->fch_gelu_stride ? L * a->fch_gelu_stride : BT * 4 * C) * sizeof(floatX);
    a->encoded = (floatX*)cuda_malloc_checked(BT * C * sizeof(floatX), "activations: encoded");
    a->ln1 = (floatX*)cuda_malloc_checked(ln1_bytes, "activations: ln1 (-r 2 saves this)");
    a->ln1_mean = (float*)cuda_malloc_checked(L * BT * sizeof(float), "activations: ln1 mean");
    a->ln1_rstd = (float*)cuda_malloc_checked(L * BT * sizeof(float), "activations: ln1 rstd");
    a->qkv = (floatX*)cuda_malloc_checked(L * BT * 3 * C * sizeof(floatX), "activations: qkv");
    a->atty = (floatX*)cuda_malloc_checked(L * BT * C * sizeof(floatX), "activations: attention output");
    a->att_stats_stride = ceil_div_size(BT * NH, 4) * 4;  // B*T*NH need not be a multiple of 4 (-b 3 -t 63, NH=2)
    a->att_stats = (float*)cuda_malloc_checked(L * a->att_stats_stride * sizeof(float), "activations: attention stats");
    a->residual2 = (floatX*)cuda_malloc_checked(L * BT * C * sizeof(floatX), "activations: residual2");
    a->ln2 = (floatX*)cuda_malloc_checked(ln2_bytes, "activations: ln2 (-r 2 saves this)");
    a->ln2_mean = (float*)cuda_malloc_checked(L * BT * sizeof(float), "activations: ln2 mean");
    a->ln2_rstd = (float*)cuda_malloc_checked(L * BT * sizeof(float), "activations: ln2 rstd");
    a->fch = (floatX*)cuda_malloc_checked(L * BT * 4 * C * sizeof(floatX), "activations: fc pre-GELU");
    a->fch_gelu = (floatX*)cuda_malloc_checked(gelu_bytes, "activations: GELU (-r 1 saves this)");
    a->residual3 = (floatX*)cuda_malloc_checked(L * BT * C * sizeof(floatX), "activations: residual3");
    a->lnf = (floatX*)cuda_malloc_checked(BT * C * sizeof(floatX), "activations: lnf");
    a->lnf_mean = (float*)cuda_malloc_checked(BT * sizeof(float), "activations: lnf mean");
    a->lnf_rstd = (float*)cuda_malloc_checked(BT * sizeof(float), "activations: lnf rstd");
    a->losses = (float*)cuda_malloc_checked(BT * sizeof(float), "activations: losses");
    a->output = (floatX*)cuda_malloc_checked(BT * Vp * sizeof(floatX), "activations: logits");
    a->scratch_btc = (floatX*)cuda_malloc_checked(BT * C * sizeof(floatX), "scratch (B*T*C)");
    a->scratch_bt4c = (floatX*)cuda_malloc_checked(BT * 4 * C * sizeof(floatX), "scratch (B*T*4C)");
    a->dresidual = (floatX*)cuda_malloc_checked(BT * C * sizeof(floatX), "residual gradient");
    // the widest bias: fc; lm_head has none, but its FP8 dy pass sums columns all the same
    int lm_head_casts_dy = fp8_model_casts_dy(&model->fp8, fp8_model_linear(&model->fp8, -1, LINEAR_LM_HEAD));
    int widest_dout = lm_head_casts_dy && Vp > 4 * C ? (int)Vp : 4 * (int)C;
    size_t scratch_floats = matmul_dbias_scratch_floats((int)BT, widest_dout);
    size_t ln_scratch = layernorm_backward_scratch_bytes((int)BT, (int)C) / sizeof(float) + 1;
    if (ln_scratch > scratch_floats) { scratch_floats = ln_scratch; }
    if (global_norm_scratch_floats() > scratch_floats) { scratch_floats = global_norm_scratch_floats(); }
    a->scratch_f = (float*)cuda_malloc_checked(scratch_floats * sizeof(float), "float scratch");

    model->B = B;
    model->T = T;
    model->encoder_scratch = encoder_backward_scratch_create(B, T, cfg->vocab_size);
    model->inputs = (int*)cuda_malloc_checked(BT * sizeof(int), "input tokens");
    model->targets = (int*)cuda_malloc_checked(BT * sizeof(int), "target tokens");
    model->inputs_cpu = (int*)mallocCheck(BT * sizeof(int));
    model->losses_cpu = (float*)mallocCheck(BT * sizeof(float));
    model->logits_row_cpu = (floatX*)mallocCheck(Vp * sizeof(floatX));
}

// the FP8 weights from the weights as they are (at the start, after a resume): on one GPU from
// the master; with several ranks each casts its parts and the codes are gathered
static void gpt2_cast_weights(GPT2* model, cudaStream_t stream) {
    if (model->comm != NULL) { zero_comm_refresh_weights(model->comm, &model->fp8, model->params, model->master, stream); }
    else { fp8_model_cast_weights(&model->fp8, model->master, model->params, false, stream); }
}

/*
The model on the GPU, from fp32 parameters in llm.c order, sized for micro-batches of B x T;
use_adamw8: 8-bit AdamW states for the tensors adamw8_selection picks (-opt adamw8 -qs);
fp8: what runs in FP8 (NULL or not enabled: everything in bf16); multi_gpu: the ranks (NULL
or one process: one GPU), reduce_fp32 its gradient reduce in fp32 (-pa), zero3 -z 3. Every
rank holds all weights (ZeRO-3: all but the others' parts of the block linears' weights); the
optimizer state is its range's.
*/
static void gpt2_build(GPT2* model, const GPT2Config* cfg, const float* params_cpu, int use_master_weights,
                       int B, int T, int recompute, int gelu_fusion, int use_adamw8, Adamw8Selection adamw8_selection,
                       const Fp8Settings* fp8, const MultiGpuConfig* multi_gpu, int reduce_fp32, int zero3, cudaStream_t stream) {
    gpt2_init_layout(model, cfg);
    model->recompute = recompute;
    model->gelu_fusion = gelu_fusion;
    model->use_adamw8 = use_adamw8;
    model->adamw8_selection = adamw8_selection;
    int num_ranks = multi_gpu != NULL ? multi_gpu->num_processes : 1;
    model->rank = multi_gpu != NULL ? multi_gpu->process_rank : 0;
    zero_layout_init(&model->zero, cfg, num_ranks);
    model->owned = zero_rank_range(&model->zero, model->rank);
    Adamw8Layout whole;  // plain AdamW: the same layout with every tensor 32-bit
    adamw8_layout_init(&whole, cfg, use_adamw8 ? adamw8_selection : ADAMW8_SELECT_NONE);
    adamw8_layout_window(&model->opt_layout, &whole, model->owned.begin, model->owned.end);
    model->zero3 = zero3;
    Fp8Settings bf16_only = {};
    Fp8WeightSharding sharding = {zero3, model->owned.begin, model->owned.end};
    fp8_model_create(&model->fp8, fp8 != NULL ? fp8 : &bf16_only, cfg, B * T, recompute, model->param_offsets,
                     model->param_sizes, &sharding, stream);
    gpt2_upload_params(model, params_cpu, use_master_weights);
    gpt2_allocate_state(model, B, T);
    if (num_ranks > 1) {
        model->comm = (ZeroComm*)mallocCheck(sizeof(ZeroComm));
        zero_comm_create(model->comm, multi_gpu, cfg, &model->fp8, reduce_fp32, zero3);
    }
    gpt2_cast_weights(model, stream);
    // bounded: the weight gather waits for every peer, and the synchronous copies that may come
    // next (a resume's state upload) would wait for it with no deadline
    if (model->comm != NULL) { multi_gpu_wait(multi_gpu, stream, "weight gather (start)"); }
}

// ----------------------------------------------------------------------------
// linears: FP8 or bf16 per linear and pass (llmc/fp8_model.cuh decides)

static void gpt2_linear_shape(const GPT2* model, int kind, int* K, int* OC) {
    fp8_linear_shape((LinearKind)kind, model->config.channels, model->config.padded_vocab_size, K, OC);
}

// out[BT][OC] = inp[BT][K] weight^T + bias (pre_gelu: cuBLASLt's GELU epilogue, bf16 only).
// In FP8 the producer of inp has already written its codes.
static void gpt2_linear_forward(GPT2* model, int layer, int kind, floatX* out, const floatX* inp, const floatX* weight,
                                const floatX* bias, floatX* pre_gelu, cudaStream_t stream) {
    const Fp8Model* fp8 = &model->fp8;
    int i = fp8_model_linear(fp8, layer, kind);
    int K, OC;
    gpt2_linear_shape(model, kind, &K, &OC);
    if (fp8_model_runs(fp8, i, FP8_FWD)) {
        if (pre_gelu != NULL) { llm8_die("gpt2_linear_forward: the FP8 path fuses GELU into the next cast, not the epilogue"); }
        Fp8CastOutput x = fp8_model_x(fp8, i), w = fp8_model_w(fp8, i);
        matmul_forward_fp8(out, fp8_operand(&x, false), fp8_operand(&w, false), bias, model->B * model->T, K, OC, NULL, stream);
    } else {
        matmul_forward(out, inp, weight, bias, model->B * model->T, K, OC, pre_gelu, stream);
    }
}

/*
What the layernorm backward that writes linear (layer, kind)'s output gradient takes from it for
the linear (layernorm.cuh's LayernormDinpUses): attproj's dy is ln2's residual gradient, and
fcproj's is ln1's of the layer above (lnf's for the last layer); layer -1 (ln1 of layer 0,
which feeds the encoder) is no linear's, and no layernorm writes the dy of qkv, fc or lm_head:
for them it takes nothing. The bias gradient, wherever the linear's backward
would read dy for it alone (a bf16 backward's bias pass; current scaling's amax pass), and then
the amax too for an FP8 cast of current scaling (-fg current, and -fg pow2, whose cast then
needs no prediction). A one-pass FP8 cast (a known scale) sums the bias itself as it reads dy
for the codes, so there the layernorm takes nothing.
*/
static LayernormDinpUses gpt2_layernorm_dinp_uses(GPT2* model, int layer, int kind) {
    LayernormDinpUses uses = LAYERNORM_DINP_UNUSED;
    if (layer < 0 || (kind != LINEAR_ATTPROJ && kind != LINEAR_FCPROJ)) { return uses; }
    const Fp8Model* fp8 = &model->fp8;
    int i = fp8_model_linear(fp8, layer, kind);
    if (fp8_model_casts_dy(fp8, i)) {
        Fp8CastOutput dy = fp8_model_dy(fp8, i);
        Fp8DoutScale scale = fp8_model_dout_scale(fp8, i);  // pow2's prediction is never needed where the amax is taken
        if (dy.scaling != FP8_SCALING_TENSOR || (scale != FP8_DOUT_NEEDS_AMAX && scale != FP8_DOUT_SCALE_PREDICTED)) { return uses; }
        uses.amax_record = dy.record;
    }
    uses.bias_grad = layer_tensor(model, model->grads, kind == LINEAR_ATTPROJ ? PARAM_ATTPROJB : PARAM_FCPROJB, layer);
    return uses;
}

/*
The backward of one linear: dinp = dout weight (overwritten), dweight += dout^T inp,
dbias += column sums of dout. GELU's derivative, between fcproj's dgrad and fc's backward, is
applied at one of two places: dout_pre_gelu != NULL: dout is the gradient of GELU's output, to
be multiplied by gelu'(dout_pre_gelu) (fc, whose output went through GELU; -ge 0 and 1);
dinp_pre_gelu != NULL: the dgrad GEMM's DGELU epilogue multiplies dinp by gelu'(dinp_pre_gelu)
(fcproj, whose input came out of GELU; -ge 2), and fc's dout arrives multiplied. dgrad and wgrad are FP8 or
bf16 each on its own (-f8p). With either in FP8, the pass that casts dout
(matmul_backward_fp8_dout) also applies GELU's derivative and sums the bias (unless the
layernorm backward that wrote dout took the bias and the amax: gpt2_layernorm_dinp_uses), and writes the
codes the FP8 GEMMs read (dy for dgrad, dy^T for wgrad; where the classifier wrote lm_head's
dy codes, only their transpose); the FP8 GEMMs read those and the
codes of the forward's and the weight's casts, and a bf16 GEMM of the other pass reads dout
as that pass left it (the pass stores the product into dout whenever a bf16 GEMM reads it),
with inp or weight. All bf16: dout is multiplied in place first, and the bias summed by its
own pass unless that layernorm backward summed it.
*/
static void gpt2_linear_backward(GPT2* model, int layer, int kind, floatX* dinp, floatX* dweight, floatX* dbias,
                                 floatX* dout, const floatX* inp, const floatX* weight, const floatX* dout_pre_gelu,
                                 const floatX* dinp_pre_gelu, cudaStream_t stream) {
    const Fp8Model* fp8 = &model->fp8;
    int i = fp8_model_linear(fp8, layer, kind);
    int BT = model->B * model->T, K, OC;
    gpt2_linear_shape(model, kind, &K, &OC);
    bool dgrad_fp8 = fp8_model_runs(fp8, i, FP8_DGRAD), wgrad_fp8 = fp8_model_runs(fp8, i, FP8_WGRAD);
    // where a layernorm backward wrote dy, it may have taken the bias gradient (and the amax) already
    LayernormDinpUses taken = gpt2_layernorm_dinp_uses(model, layer, kind);
    if (taken.bias_grad != NULL) {
        if (taken.bias_grad != dbias) { llm8_die("gpt2_linear_backward: layernorm backward summed another bias than this linear's"); }
        dbias = NULL;
    }
    if (dgrad_fp8 || wgrad_fp8) {
        Fp8CastOutput dy = fp8_model_dy(fp8, i), x = fp8_model_x(fp8, i), w = fp8_model_w(fp8, i);
        Fp8DoutScale dy_scale = taken.amax_record != NULL ? FP8_DOUT_AMAX_RECORDED : fp8_model_dout_scale(fp8, i);
        matmul_backward_fp8_dout(&dy, dbias, model->acts.scratch_f, dout, dout_pre_gelu, BT, OC, dy_scale, stream);
        matmul_backward_fp8(dgrad_fp8 ? dinp : NULL, wgrad_fp8 ? dweight : NULL, CUDA_R_16BF, fp8_operand(&dy, false),
                            fp8_operand(&dy, true), fp8_operand(&w, true), fp8_operand(&x, true), BT, K, OC,
                            dinp_pre_gelu, stream);
        if (!dgrad_fp8 || !wgrad_fp8) {  // the bias is summed already
            matmul_backward(dgrad_fp8 ? NULL : dinp, wgrad_fp8 ? NULL : dweight, NULL, dout, inp, weight, NULL, BT, K, OC,
                            dinp_pre_gelu, stream);
        }
    } else {
        if (dout_pre_gelu != NULL) { gelu_backward_inplace(dout, dout_pre_gelu, (size_t)BT * OC, stream); profiler_mark("gelu bwd"); }
        matmul_backward(dinp, dweight, dbias, dout, inp, weight, model->acts.scratch_f, BT, K, OC, dinp_pre_gelu, stream);
    }
}

/*
The layernorm in front of linear (layer, kind) (layer -1: lnf before lm_head): normalizes
inp1, or with inp2 the residual sum residual_out = inp1 + inp2, into normed_out, and casts
the result to FP8 when the linear takes FP8 input (an FP8 forward or wgrad), without a bf16
copy of the output unless some bf16 GEMM reads it (fp8_model_layernorm_forward).
*/
static void gpt2_layernorm_forward(GPT2* model, int layer, int kind, floatX* residual_out, floatX* normed_out, float* mean,
                                   float* rstd, const floatX* inp1, const floatX* inp2, const floatX* weight, const floatX* bias,
                                   cudaStream_t stream) {
    const Fp8Model* fp8 = &model->fp8;
    int BT = model->B * model->T, C = model->config.channels;
    int i = fp8_model_linear(fp8, layer, kind);
    if (fp8_model_casts_x(fp8, i)) {
        floatX* normed = gpt2_stores_bf16_input(model, layer, kind) ? normed_out : NULL;
        fp8_model_layernorm_forward(fp8, i, residual_out, normed, mean, rstd, inp1, inp2, weight, bias, stream);
    } else if (inp2 == NULL) {
        layernorm_forward(normed_out, mean, rstd, inp1, weight, bias, BT, C, stream);
    } else {
        fused_residual_layernorm_forward(residual_out, normed_out, mean, rstd, inp1, inp2, weight, bias, BT, C, stream);
    }
}

// layer l's slices of the activations
static LayerActivations gpt2_layer_activations(const GPT2* model, int l) {
    const Activations* a = &model->acts;
    size_t BT = (size_t)model->B * model->T, C = model->config.channels;
    LayerActivations la;
    la.residual = l == 0 ? a->encoded : a->residual3 + (size_t)(l - 1) * BT * C;
    la.ln1 = a->ln1 + l * a->ln1_stride;
    la.ln1_mean = a->ln1_mean + l * BT;
    la.ln1_rstd = a->ln1_rstd + l * BT;
    la.qkv = a->qkv + l * BT * 3 * C;
    la.atty = a->atty + l * BT * C;
    la.att_stats = a->att_stats + l * a->att_stats_stride;
    la.residual2 = a->residual2 + l * BT * C;
    la.ln2 = a->ln2 + l * a->ln2_stride;
    la.ln2_mean = a->ln2_mean + l * BT;
    la.ln2_rstd = a->ln2_rstd + l * BT;
    la.fch = a->fch + l * BT * 4 * C;
    la.fch_gelu = a->fch_gelu + l * a->fch_gelu_stride;
    la.residual3 = a->residual3 + l * BT * C;
    return la;
}

// the bf16 weight block linear (layer, kind)'s bf16 GEMMs read: in the parameters, or under
// ZeRO-3 in the layer slot it was gathered into (NULL for an FP8 linear, which reads codes)
static const floatX* gpt2_block_weight(const GPT2* model, int layer, int kind) {
    if (model->zero3) { return zero_comm_layer_weight(model->comm, layer, kind); }
    return layer_tensor(model, model->params, zero_comm_weight_tensor(kind), layer);
}

// With several ranks, `stream` waits until the weights of layer `layer` (-1: wte and wpe; lnf
// comes with the last layer) have come back from their owners after the last update (zero_comm.cuh's gather
// stages): each forward waits for them where it first reads them, so the gather of the later
// layers runs behind the first ones' compute. Once arrived, waiting again costs nothing.
static void gpt2_wait_gathered(const GPT2* model, int layer, cudaStream_t stream) {
    if (model->comm != NULL) { zero_comm_wait_gathered(model->comm, layer, stream); }
}

// ----------------------------------------------------------------------------
// forward / backward / update

// Runs the network on inputs (and, with targets, the loss). With targets, losses[bt]
// accumulates -log p and, if write_dlogits, the logits buffer holds dloss * dlogits.
// In FP8 every forward is a use of the activations' scaling; evaluations put it back
// (fp8_model_begin_eval / fp8_model_end_eval).
static void gpt2_forward(GPT2* model, const int* inputs_cpu, const int* targets_cpu, float dloss,
                         int write_dlogits, cudaStream_t stream) {
    const GPT2Config* cfg = &model->config;
    int B = model->B, T = model->T;
    int L = cfg->num_layers, C = cfg->channels, NH = cfg->num_heads, V = cfg->vocab_size, Vp = cfg->padded_vocab_size;
    int BT = B * T;
    Activations* a = &model->acts;
    floatX* p = model->params;
    Fp8Model* fp8 = &model->fp8;

    memcpy(model->inputs_cpu, inputs_cpu, (size_t)BT * sizeof(int));
    cudaCheck(cudaMemcpyAsync(model->inputs, inputs_cpu, (size_t)BT * sizeof(int), cudaMemcpyHostToDevice, stream));
    if (targets_cpu != NULL) {
        cudaCheck(cudaMemcpyAsync(model->targets, targets_cpu, (size_t)BT * sizeof(int), cudaMemcpyHostToDevice, stream));
    }

    gpt2_wait_gathered(model, -1, stream);
    encoder_forward(a->encoded, model->inputs, param_tensor(model, p, PARAM_WTE), param_tensor(model, p, PARAM_WPE), B, T, C, stream);
    profiler_mark("encoder fwd");
    gpt2_wait_gathered(model, 0, stream);
    gpt2_layernorm_forward(model, 0, LINEAR_QKV, NULL, a->ln1, a->ln1_mean, a->ln1_rstd, a->encoded, NULL,
                           layer_tensor(model, p, PARAM_LN1W, 0), layer_tensor(model, p, PARAM_LN1B, 0), stream);
    profiler_mark("layernorm fwd");
    ZeroComm* zero3 = model->zero3 ? model->comm : NULL;  // -z 3: each layer's weights gathered one layer ahead
    if (zero3 != NULL) { zero_comm_gather_layer(zero3, fp8, p, 0, false); }
    for (int l = 0; l < L; l++) {
        LayerActivations la = gpt2_layer_activations(model, l);
        if (zero3 != NULL) {
            zero_comm_use_layer(zero3, fp8, l, stream);
            if (l + 1 < L) { zero_comm_gather_layer(zero3, fp8, p, l + 1, false); }
        }

        gpt2_linear_forward(model, l, LINEAR_QKV, la.qkv, la.ln1, gpt2_block_weight(model, l, LINEAR_QKV), layer_tensor(model, p, PARAM_QKVB, l), NULL, stream);
        profiler_mark("matmul qkv fwd");
        attention_forward(la.atty, la.att_stats, la.qkv, B, T, NH, C, stream);
        profiler_mark("attention fwd");
        int attproj = fp8_model_linear(fp8, l, LINEAR_ATTPROJ);
        if (fp8_model_casts_x(fp8, attproj)) {
            fp8_model_cast_activation(fp8, attproj, la.atty, stream);
            profiler_mark("fp8 cast attention out");
        }
        gpt2_linear_forward(model, l, LINEAR_ATTPROJ, a->scratch_btc, la.atty, gpt2_block_weight(model, l, LINEAR_ATTPROJ), layer_tensor(model, p, PARAM_ATTPROJB, l), NULL, stream);
        profiler_mark("matmul attproj fwd");
        gpt2_layernorm_forward(model, l, LINEAR_FC, la.residual2, la.ln2, la.ln2_mean, la.ln2_rstd,
                               la.residual, a->scratch_btc, layer_tensor(model, p, PARAM_LN2W, l), layer_tensor(model, p, PARAM_LN2B, l), stream);
        profiler_mark("residual+layernorm fwd");
        int fcproj = fp8_model_linear(fp8, l, LINEAR_FCPROJ);
        if (fp8_model_fc_writes_codes(fp8)) {  // -fe 1: fc's GEMM writes fcproj's x codes through its GELU epilogue
            fp8_model_fc_forward_codes(fp8, fp8_model_linear(fp8, l, LINEAR_FC), fcproj, la.fch, layer_tensor(model, p, PARAM_FCB, l), stream);
            profiler_mark("matmul fc+gelu fp8 codes fwd");
            fp8_model_fc_codes_transpose(fp8, fcproj, stream);
            profiler_mark("fp8 transpose gelu out");
        } else if (fp8_model_casts_x(fp8, fcproj)) {  // GELU is the element transform of fcproj's input cast
            gpt2_linear_forward(model, l, LINEAR_FC, la.fch, la.ln2, gpt2_block_weight(model, l, LINEAR_FC), layer_tensor(model, p, PARAM_FCB, l), NULL, stream);
            profiler_mark("matmul fc fwd");
            fp8_model_gelu_forward(fp8, fcproj, gpt2_stores_bf16_input(model, l, LINEAR_FCPROJ) ? la.fch_gelu : NULL, la.fch, stream);
            profiler_mark("gelu+fp8 cast fwd");
        } else if (model->gelu_fusion && gpt2_reads_bf16_input(model, l, LINEAR_FC, FP8_FWD)) {
            gpt2_linear_forward(model, l, LINEAR_FC, la.fch_gelu, la.ln2, gpt2_block_weight(model, l, LINEAR_FC), layer_tensor(model, p, PARAM_FCB, l), la.fch, stream);
            profiler_mark("matmul fc+gelu fwd");
        } else {
            gpt2_linear_forward(model, l, LINEAR_FC, la.fch, la.ln2, gpt2_block_weight(model, l, LINEAR_FC), layer_tensor(model, p, PARAM_FCB, l), NULL, stream);
            profiler_mark("matmul fc fwd");
            gelu_forward(la.fch_gelu, la.fch, (size_t)BT * 4 * C, stream);
            profiler_mark("gelu fwd");
        }
        gpt2_linear_forward(model, l, LINEAR_FCPROJ, a->scratch_btc, la.fch_gelu, gpt2_block_weight(model, l, LINEAR_FCPROJ), layer_tensor(model, p, PARAM_FCPROJB, l), NULL, stream);
        profiler_mark("matmul fcproj fwd");
        if (zero3 != NULL) { zero_comm_release_layer(zero3, l, stream); }
        if (l + 1 < L) {
            LayerActivations next = gpt2_layer_activations(model, l + 1);
            gpt2_wait_gathered(model, l + 1, stream);
            gpt2_layernorm_forward(model, l + 1, LINEAR_QKV, la.residual3, next.ln1, next.ln1_mean, next.ln1_rstd, la.residual2, a->scratch_btc,
                                   layer_tensor(model, p, PARAM_LN1W, l + 1), layer_tensor(model, p, PARAM_LN1B, l + 1), stream);
        } else {
            gpt2_layernorm_forward(model, -1, LINEAR_LM_HEAD, la.residual3, a->lnf, a->lnf_mean, a->lnf_rstd, la.residual2, a->scratch_btc,
                                   param_tensor(model, p, PARAM_LNFW), param_tensor(model, p, PARAM_LNFB), stream);
        }
        profiler_mark("residual+layernorm fwd");
    }
    gpt2_linear_forward(model, -1, LINEAR_LM_HEAD, a->output, a->lnf, param_tensor(model, p, PARAM_WTE), NULL, NULL, stream);
    profiler_mark("matmul lm_head fwd");
    fp8_model_end_forward(fp8, stream);
    if (targets_cpu != NULL) {
        Fp8CastOutput dlogits_codes;  // where the classifier writes lm_head's dy codes itself
        const Fp8CastOutput* dlogits_fp8 = write_dlogits ? fp8_model_begin_dlogits(fp8, dloss, &dlogits_codes, stream) : NULL;
        fused_classifier(a->output, a->losses, dloss, model->targets, B, T, V, Vp, write_dlogits, dlogits_fp8, stream);
        profiler_mark("classifier");
    }
}

/*
-r: block linear (layer, kind)'s input for its wgrad where the forward did not keep it,
recomputed from what the forward made it from: for a bf16 wgrad the GELU output (-r 1) or
the layernorm output (-r 2, mean and rstd not written again); for an FP8 wgrad its x^T codes
(fp8_model.cuh's recompute), at the levels of linear_input_recompute_level. The same kernels
or casts as the forward's, so -r changes no result.
*/
static void gpt2_recompute_input(GPT2* model, int layer, int kind, const LayerActivations* la, cudaStream_t stream) {
    const Fp8Model* fp8 = &model->fp8;
    int i = fp8_model_linear(fp8, layer, kind);
    bool bf16_wgrad = gpt2_reads_bf16_input(model, layer, kind, FP8_WGRAD);
    bool recomputed = bf16_wgrad ? model->recompute >= linear_input_recompute_level(kind) && kind != LINEAR_ATTPROJ
                                 : fp8_model_recasts_x_t(fp8, i);
    if (!recomputed) { return; }
    int BT = model->B * model->T, C = model->config.channels;
    switch (kind) {
        case LINEAR_FCPROJ:
            if (bf16_wgrad) { gelu_forward(la->fch_gelu, la->fch, (size_t)BT * 4 * C, stream); }
            else { fp8_model_recast_gelu(fp8, i, la->fch, stream); }
            profiler_mark("gelu recompute");
            break;
        case LINEAR_ATTPROJ:
            fp8_model_recast_activation(fp8, i, la->atty, stream);
            profiler_mark("fp8 cast attention out recompute");
            break;
        default: {  // qkv: ln1 of the layer's input; fc: ln2 of the residual after attention
            bool ln1 = kind == LINEAR_QKV;
            const floatX* ln_input = ln1 ? la->residual : la->residual2;
            const floatX* ln_weight = layer_tensor(model, model->params, ln1 ? PARAM_LN1W : PARAM_LN2W, layer);
            const floatX* ln_bias = layer_tensor(model, model->params, ln1 ? PARAM_LN1B : PARAM_LN2B, layer);
            if (bf16_wgrad) {
                layernorm_forward(ln1 ? la->ln1 : la->ln2, NULL, NULL, ln_input, ln_weight, ln_bias, BT, C, stream);
            } else {
                fp8_model_recast_layernorm(fp8, i, ln_input, ln1 ? la->ln1_mean : la->ln2_mean, ln1 ? la->ln1_rstd : la->ln2_rstd,
                                           ln_weight, ln_bias, stream);
            }
            profiler_mark("layernorm recompute");
        }
    }
}

// Backward of the last gpt2_forward (which must have written dlogits). Gradients add
// into model->grads, so micro-steps accumulate. With several ranks and reduce set (the last
// micro-step), each layer's gradients go to their owners as soon as they are complete.
static void gpt2_backward(GPT2* model, int reduce, cudaStream_t stream) {
    const GPT2Config* cfg = &model->config;
    int B = model->B, T = model->T;
    int L = cfg->num_layers, C = cfg->channels, NH = cfg->num_heads;
    int BT = B * T;
    Activations* a = &model->acts;
    floatX* p = model->params;
    floatX* g = model->grads;

    // lm_head (tied to wte) and the final layernorm
    gpt2_linear_backward(model, -1, LINEAR_LM_HEAD, a->scratch_btc, param_tensor(model, g, PARAM_WTE), NULL, a->output, a->lnf,
                         param_tensor(model, p, PARAM_WTE), NULL, NULL, stream);
    profiler_mark("matmul lm_head bwd");
    cudaCheck(cudaMemsetAsync(a->dresidual, 0, (size_t)BT * C * sizeof(floatX), stream));
    layernorm_backward(a->dresidual, param_tensor(model, g, PARAM_LNFW), param_tensor(model, g, PARAM_LNFB), a->scratch_f, a->scratch_btc,
                       a->residual3 + (size_t)(L - 1) * BT * C, param_tensor(model, p, PARAM_LNFW), a->lnf_mean, a->lnf_rstd, BT, C,
                       gpt2_layernorm_dinp_uses(model, L - 1, LINEAR_FCPROJ), stream);
    profiler_mark("layernorm bwd");

    ZeroComm* zero3 = model->zero3 ? model->comm : NULL;  // -z 3: the layers' weights again (FP8: W and W^T), one layer ahead
    if (zero3 != NULL) { zero_comm_gather_layer(zero3, &model->fp8, p, L - 1, true); }
    for (int l = L - 1; l >= 0; l--) {
        LayerActivations la = gpt2_layer_activations(model, l);
        if (zero3 != NULL) {
            zero_comm_use_layer(zero3, &model->fp8, l, stream);
            if (l > 0) { zero_comm_gather_layer(zero3, &model->fp8, p, l - 1, true); }
        }
        floatX* dqkv = a->scratch_bt4c;  // 3C of the 4C scratch, free once the MLP backward is done

        // MLP: dresidual holds d(residual3) = d(fcproj output); scratch_bt4c gets d(GELU output)
        gpt2_recompute_input(model, l, LINEAR_FCPROJ, &la, stream);
        const floatX* gelu_in_dgrad = model->gelu_fusion >= 2 ? la.fch : NULL;  // -ge 2: DGELU in fcproj's dgrad
        gpt2_linear_backward(model, l, LINEAR_FCPROJ, a->scratch_bt4c, layer_tensor(model, g, PARAM_FCPROJW, l), layer_tensor(model, g, PARAM_FCPROJB, l),
                             a->dresidual, la.fch_gelu, gpt2_block_weight(model, l, LINEAR_FCPROJ), NULL, gelu_in_dgrad, stream);
        profiler_mark("matmul fcproj bwd");
        gpt2_recompute_input(model, l, LINEAR_FC, &la, stream);
        gpt2_linear_backward(model, l, LINEAR_FC, a->scratch_btc, layer_tensor(model, g, PARAM_FCW, l), layer_tensor(model, g, PARAM_FCB, l),
                             a->scratch_bt4c, la.ln2, gpt2_block_weight(model, l, LINEAR_FC), gelu_in_dgrad != NULL ? NULL : la.fch,
                             NULL, stream);
        profiler_mark("matmul fc bwd");
        layernorm_backward(a->dresidual, layer_tensor(model, g, PARAM_LN2W, l), layer_tensor(model, g, PARAM_LN2B, l), a->scratch_f, a->scratch_btc,
                           la.residual2, layer_tensor(model, p, PARAM_LN2W, l), la.ln2_mean, la.ln2_rstd, BT, C,
                           gpt2_layernorm_dinp_uses(model, l, LINEAR_ATTPROJ), stream);
        profiler_mark("layernorm bwd");

        // attention: dresidual now holds d(residual2) = d(attproj output)
        gpt2_recompute_input(model, l, LINEAR_ATTPROJ, &la, stream);
        gpt2_linear_backward(model, l, LINEAR_ATTPROJ, a->scratch_btc, layer_tensor(model, g, PARAM_ATTPROJW, l), layer_tensor(model, g, PARAM_ATTPROJB, l),
                             a->dresidual, la.atty, gpt2_block_weight(model, l, LINEAR_ATTPROJ), NULL, NULL, stream);
        profiler_mark("matmul attproj bwd");
        attention_backward(dqkv, a->scratch_btc, la.qkv, la.atty, la.att_stats, B, T, NH, C, stream);
        profiler_mark("attention bwd");
        gpt2_recompute_input(model, l, LINEAR_QKV, &la, stream);
        gpt2_linear_backward(model, l, LINEAR_QKV, a->scratch_btc, layer_tensor(model, g, PARAM_QKVW, l), layer_tensor(model, g, PARAM_QKVB, l),
                             dqkv, la.ln1, gpt2_block_weight(model, l, LINEAR_QKV), NULL, NULL, stream);
        profiler_mark("matmul qkv bwd");
        if (zero3 != NULL) { zero_comm_release_layer(zero3, l, stream); }
        layernorm_backward(a->dresidual, layer_tensor(model, g, PARAM_LN1W, l), layer_tensor(model, g, PARAM_LN1B, l), a->scratch_f, a->scratch_btc,
                           la.residual, layer_tensor(model, p, PARAM_LN1W, l), la.ln1_mean, la.ln1_rstd, BT, C,
                           gpt2_layernorm_dinp_uses(model, l - 1, LINEAR_FCPROJ), stream);
        profiler_mark("layernorm bwd");
        if (reduce && model->comm != NULL) { zero_comm_reduce_chunk(model->comm, g, l, stream); }
    }
    if (model->comm != NULL) {  // encoder_backward's host wait, bounded first: the work before it may wait for collectives
        multi_gpu_wait_event(model->comm->multi_gpu, encoder_backward_pending_upload(model->encoder_scratch),
                             "encoder backward (the previous micro-step's upload)");
    }
    encoder_backward(param_tensor(model, g, PARAM_WTE), param_tensor(model, g, PARAM_WPE), a->dresidual, model->inputs_cpu,
                     B, T, C, model->encoder_scratch, stream);
    profiler_mark("encoder bwd");
    fp8_model_end_backward(&model->fp8);
    if (reduce && model->comm != NULL) {
        zero_comm_reduce_chunk(model->comm, g, L, stream);  // wte (lm_head and encoder), wpe, lnf
        zero_comm_wait_reduced(model->comm, stream);
        profiler_mark("gradient reduce (exposed)");
    }
}

// the multi-GPU setup the model was built with (NULL: one GPU)
static const MultiGpuConfig* gpt2_multi_gpu(const GPT2* model) { return model->comm != NULL ? model->comm->multi_gpu : NULL; }

// the host waits for `stream`; with several ranks in bounded time (a dead peer leaves its
// collectives spinning: multi_gpu_wait aborts them after -pt s and names `what`)
static void gpt2_wait(const GPT2* model, cudaStream_t stream, const char* what) {
    const MultiGpuConfig* multi_gpu = gpt2_multi_gpu(model);
    if (multi_gpu != NULL) { multi_gpu_wait(multi_gpu, stream, what); }
    else { cudaCheck(cudaStreamSynchronize(stream)); }
}

// one float summed (or averaged, op) over the ranks; on one GPU the value itself
static float gpt2_all_reduce(const GPT2* model, float value, ncclRedOp_t op, cudaStream_t stream, const char* what) {
    const MultiGpuConfig* multi_gpu = gpt2_multi_gpu(model);
    return multi_gpu != NULL ? multi_gpu_all_reduce_float(multi_gpu, value, op, stream, what) : value;
}

// global gradient norm over the owned (reduced) gradients of every rank, in two halves: the
// kernel is queued first (gpt2_grad_norm_launch), and the host reads its result after it has
// read the loss (gpt2_grad_norm_read), so the GPU sums the gradients while the host sums the
// losses, and one wait serves both. The progress line and the skip decision need the norm.
static void gpt2_grad_norm_launch(GPT2* model, cudaStream_t stream) {
    global_norm_squared(model->norm_squared, model->acts.scratch_f, model->grads + model->owned.begin,
                        model->owned.end - model->owned.begin, stream);
    profiler_mark("grad norm");
}

static float gpt2_grad_norm_read(GPT2* model, cudaStream_t stream) {
    float norm_squared;
    // the bounded wait first: a copy into pageable memory returns only once it completed, so
    // queued behind the gradient reduce it would block on a dead peer with no deadline
    gpt2_wait(model, stream, "gradient reduce (waiting for the gradient norm)");
    cudaCheck(cudaMemcpyAsync(&norm_squared, model->norm_squared, sizeof(float), cudaMemcpyDeviceToHost, stream));
    return sqrtf(gpt2_all_reduce(model, norm_squared, ncclSum, stream, "gradient norm all-reduce"));
}

// Seed of the stochastic rounding of tensor i at step t: a pure function of (t, i), so a
// resumed run draws the same numbers as an uninterrupted one.
static uint32_t update_seed(int step, int tensor) {
    return random_u32(0x5eed1234u, (uint32_t)step * NUM_PARAMETER_TENSORS + (uint32_t)tensor);
}

// What the optimizer call that updates FP8 weight (tensor, layer) from flat element `flat` on
// writes for the weight's cast (zeroed: none is wanted, e.g. lm_head, which is cast from the
// bf16 wte after the update): fp8_model_weight_update
static Fp8WeightUpdate gpt2_weight_update(const GPT2* model, int tensor, int layer, size_t flat) {
    Fp8WeightUpdate none = {};
    int kind = zero_comm_weight_kind(tensor);
    int i = kind < 0 ? -1 : fp8_model_linear(&model->fp8, layer, kind);
    if (i < 0) { return none; }
    return fp8_model_weight_update(&model->fp8, i, flat - model->fp8.linears[i].weight_offset);
}

// AdamW (fp32 or 8-bit states) on the owned range, tensor part by part (zero_update_ranges)
static void gpt2_update(GPT2* model, float learning_rate, float beta1, float beta2, float eps, float weight_decay,
                        float grad_scale, int step, cudaStream_t stream) {
    int t = step + 1;
    ZeroUpdateRange* ranges = (ZeroUpdateRange*)mallocCheck((size_t)model->config.num_layers * sizeof(ZeroUpdateRange));
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        AdamWElementParams hp = adamw_element_params(learning_rate, beta1, beta2, eps,
                                                     gpt2_param_is_decayed(i) ? weight_decay : 0.0f, t);
        int count = zero_update_ranges(&model->zero, model->rank, i, ranges);
        size_t part = model->owned.begin + model->opt_layout.param_offsets[i];  // flat
        for (int r = 0, next; r < count; r = next) {
            size_t flat = part + ranges[r].offset, n = ranges[r].n;
            Fp8WeightUpdate fp8 = gpt2_weight_update(model, i, ranges[r].layer, flat);
            // layer slices with no FP8 outputs (all of a bf16 run's) go in one call: one launch a
            // tensor instead of one a layer, and the same bits (the rounding index runs on)
            for (next = r + 1; next < count && fp8.record == NULL && ranges[next].offset == ranges[r].offset + n &&
                               gpt2_weight_update(model, i, ranges[next].layer, part + ranges[next].offset).record == NULL;
                 next++) {
                n += ranges[next].n;
            }
            float* master = model->master ? model->master + (flat - model->owned.begin) : NULL;
            adamw8_update_range(&model->opt_layout, &model->opt_states, model->opt_maps, i, ranges[r].offset, n,
                                model->params + flat, master, model->grads + flat, hp, grad_scale, update_seed(step, i), fp8,
                                stream);
        }
        // wte and wpe, the first tensors, are what the next forward reads first: with several ranks they
        // travel now, behind the rest of the update
        if (i == PARAM_WPE && model->comm != NULL) { zero_comm_gather_embeddings(model->comm, &model->fp8, model->params, stream); }
    }
    free(ranges);
    profiler_mark(model->use_adamw8 ? "adamw8" : "adamw");  // the optimizer step alone, for the benchmark
}

static void gpt2_free(GPT2* model) {
    Activations* a = &model->acts;
    if (model->zero3) {  // unmapping, unlike cudaFree, does not wait for work that may still write there
        cudaCheck(cudaDeviceSynchronize());
        sparse_buffer_free(&model->params_buffer);
        model->params = NULL;
    }
    void* device_buffers[] = {
        model->params, model->grads, model->master, model->norm_squared,
        a->encoded, a->ln1, a->ln1_mean, a->ln1_rstd, a->qkv, a->atty, a->att_stats, a->residual2, a->ln2,
        a->ln2_mean, a->ln2_rstd, a->fch, a->fch_gelu, a->residual3, a->lnf, a->lnf_mean, a->lnf_rstd,
        a->losses, a->output, a->scratch_btc, a->scratch_bt4c, a->dresidual, a->scratch_f,
        model->inputs, model->targets,
    };
    for (size_t i = 0; i < sizeof(device_buffers) / sizeof(device_buffers[0]); i++) {
        if (device_buffers[i] != NULL) { cudaCheck(cudaFree(device_buffers[i])); }
    }
    adamw8_states_free_device(&model->opt_states);
    if (model->opt_maps != NULL) { cudaCheck(cudaFree(model->opt_maps)); }
    if (model->comm != NULL) {
        zero_comm_free(model->comm);
        free(model->comm);
    }
    encoder_backward_scratch_free(model->encoder_scratch);
    fp8_model_free(&model->fp8);
    free(model->inputs_cpu);
    free(model->losses_cpu);
    free(model->logits_row_cpu);
}

// ----------------------------------------------------------------------------
// host <-> device copies for checkpoints

/*
Every rank's bf16 weights as fp32 on rank 0's host (NULL on the other ranks), for the model
file. Collective with several ranks: they are gathered (bf16 all-gather in place; ZeRO-3:
the sharded weights piece by piece from their owners, zero_comm_params_to_host).
*/
static float* gpt2_gather_params_fp32(GPT2* model, cudaStream_t stream) {
    size_t n = model->num_parameters;
    uint16_t* bf16 = model->rank == 0 ? (uint16_t*)mallocCheck(n * sizeof(uint16_t)) : NULL;
    if (model->zero3) {
        zero_comm_params_to_host(model->comm, model->params, bf16, stream);
    } else {
        if (model->comm != NULL) { zero_comm_all_gather_bf16(model->comm, model->params, stream); }
        gpt2_wait(model, stream, "bf16 weight all-gather (checkpoint)");
        if (bf16 != NULL) { cudaCheck(cudaMemcpy(bf16, model->params, n * sizeof(uint16_t), cudaMemcpyDeviceToHost)); }
    }
    if (bf16 == NULL) { return NULL; }
    float* out = (float*)mallocCheck(n * sizeof(float));
    for (size_t i = 0; i < n; i++) { out[i] = bf16_bits_to_float(bf16[i]); }
    free(bf16);
    return out;
}

static float* device_to_host_floats(const float* device, size_t n) {
    float* host = (float*)mallocCheck(n * sizeof(float));
    cudaCheck(cudaMemcpy(host, device, n * sizeof(float), cudaMemcpyDeviceToHost));
    return host;
}

// mean of the losses accumulated over `micro_steps` forward passes, over all ranks
static float gpt2_mean_loss(GPT2* model, int micro_steps, cudaStream_t stream) {
    size_t BT = (size_t)model->B * model->T;
    gpt2_wait(model, stream, "gradient reduce (waiting for the loss)");  // bounded, before the blocking copy:
    cudaCheck(cudaMemcpyAsync(model->losses_cpu, model->acts.losses, BT * sizeof(float), cudaMemcpyDeviceToHost, stream));
    double sum = 0.0;
    for (size_t i = 0; i < BT; i++) { sum += model->losses_cpu[i]; }
    return gpt2_all_reduce(model, (float)(sum / ((double)BT * micro_steps)), ncclAvg, stream, "loss all-reduce");
}

typedef struct {
    float beta1, beta2, eps, weight_decay;
    float grad_clip;  // <= 0: no clipping
} OptimizerConfig;

typedef struct {
    float loss;       // mean over the step's micro-batches
    float grad_norm;  // before clipping
    StepOutcome outcome;  // updated, or why the update did not run (outlier_skip.h)
    double skip_z;        // the z-score that skipped it (outlier outcomes)
} StepResult;

/*
One optimizer step: zero the gradients, grad_accum_steps micro-steps of forward + backward
on the loader's next batches (or, with reuse_batch, on the batch it holds: -a 1), the global norm,
then AdamW with clipping. A non-finite loss or norm skips the update, so nothing
non-finite ever reaches the weights or the optimizer state; so does, with outliers (-sl /
-sg; NULL: no such checks), a loss or norm far above the previous steps' (outlier_skip.h).
*/
static StepResult gpt2_train_step(GPT2* model, DataLoader* loader, int grad_accum_steps, int reuse_batch,
                                  const OptimizerConfig* opt, OutlierSkip* outliers, float learning_rate, int step,
                                  cudaStream_t stream) {
    size_t BT = (size_t)model->B * model->T;
    profiler_begin_step(stream);
    cudaCheck(cudaMemsetAsync(model->grads, 0, model->num_parameters * sizeof(floatX), stream));
    cudaCheck(cudaMemsetAsync(model->acts.losses, 0, BT * sizeof(float), stream));
    profiler_mark("zero grads");
    float dloss = 1.0f / (float)(BT * grad_accum_steps);
    fp8_model_begin_step(&model->fp8, stream);
    for (int micro = 0; micro < grad_accum_steps; micro++) {
        if (!reuse_batch) { dataloader_next_batch(loader); }
        gpt2_forward(model, loader->inputs, loader->targets, dloss, 1, stream);
        gpt2_backward(model, micro == grad_accum_steps - 1, stream);
    }
    StepResult r;
    gpt2_grad_norm_launch(model, stream);
    r.loss = gpt2_mean_loss(model, grad_accum_steps, stream);
    r.grad_norm = gpt2_grad_norm_read(model, stream);
    r.outcome = outlier_skip_judge(outliers, r.loss, r.grad_norm, &r.skip_z);
    if (r.outcome == STEP_UPDATED) {
        float grad_scale = (opt->grad_clip > 0.0f && r.grad_norm > opt->grad_clip) ? opt->grad_clip / r.grad_norm : 1.0f;
        gpt2_update(model, learning_rate, opt->beta1, opt->beta2, opt->eps, opt->weight_decay, grad_scale, step, stream);
        if (model->comm != NULL) {  // the weights whole again on every rank, FP8 ones cast with the global amax
            zero_comm_gather_weights(model->comm, &model->fp8, model->params, model->master, stream);
            profiler_mark("weight gather + fp8 weight casts");
        } else if (model->fp8.num_linears > 0) {  // FP8 weights follow the update (a bf16 run has no row for it)
            fp8_model_weights_after_update(&model->fp8, model->master, model->params, stream);
            profiler_mark("fp8 weight casts");
        }
    } else {
        fp8_model_discard_step(&model->fp8, stream);  // nor in the FP8 scaling
    }
    return r;
}

// ----------------------------------------------------------------------------
// evaluation and sampling: in FP8 they run the FP8 forward, with the scaling states and
// records put back afterwards (fp8_model_begin_eval), so evaluating never changes training

/*
The val loss over val_max_steps batches. Every VAL_BATCHES_PER_WAIT batches the host waits for the
GPU, bounded (gpt2_wait): with several ranks the watchdog (llmc/multi_gpu.h) counts such a wait as
progress, and a ZeRO-1 val forward has no collective or wait of its own, so a long val (-m -1 at
d48: thousands of batches) with the host blocked in a full launch queue outlasted -pt and was
ended as a hang.
*/
#define VAL_BATCHES_PER_WAIT 4

static float evaluate_val_loss(GPT2* model, DataLoader* val_loader, int val_max_steps, cudaStream_t stream) {
    dataloader_reset(val_loader);
    size_t BT = (size_t)model->B * model->T;
    fp8_model_begin_eval(&model->fp8, stream);
    cudaCheck(cudaMemsetAsync(model->acts.losses, 0, BT * sizeof(float), stream));
    for (int i = 0; i < val_max_steps; i++) {
        dataloader_next_batch(val_loader);
        gpt2_forward(model, val_loader->inputs, val_loader->targets, 1.0f, 0, stream);
        if ((i + 1) % VAL_BATCHES_PER_WAIT == 0) { gpt2_wait(model, stream, "val forward"); }
    }
    fp8_model_end_eval(&model->fp8, stream);
    return gpt2_mean_loss(model, val_max_steps, stream);
}

// HellaSwag over every rank's examples: prints llm.c's line ("HellaSwag: correct/total = accuracy"), returns the accuracy
static float evaluate_hellaswag(GPT2* model, EvalLoader* eval_loader, cudaStream_t stream) {
    evalloader_reset(eval_loader);
    size_t BT = (size_t)model->B * model->T;
    int correct = 0, total = 0;
    fp8_model_begin_eval(&model->fp8, stream);
    for (int i = 0; i < eval_loader->num_batches; i++) {
        evalloader_next_batch(eval_loader);
        cudaCheck(cudaMemsetAsync(model->acts.losses, 0, BT * sizeof(float), stream));
        gpt2_forward(model, eval_loader->inputs, eval_loader->targets, 1.0f, 0, stream);
        gpt2_wait(model, stream, "HellaSwag forward");  // bounded (ZeRO-3 gathers), before the blocking copy
        cudaCheck(cudaMemcpyAsync(model->losses_cpu, model->acts.losses, BT * sizeof(float), cudaMemcpyDeviceToHost, stream));
        correct += evalloader_stat_losses(eval_loader, model->losses_cpu);
    }
    fp8_model_end_eval(&model->fp8, stream);
    total = eval_loader->end_example_index - eval_loader->start_example_index;  // this rank's share
    float all_correct = gpt2_all_reduce(model, (float)correct, ncclSum, stream, "HellaSwag all-reduce");
    float all_total = gpt2_all_reduce(model, (float)total, ncclSum, stream, "HellaSwag all-reduce");
    float accuracy = all_total > 0 ? all_correct / all_total : 0.0f;
    printf("HellaSwag: %d/%d = %f\n", (int)all_correct, (int)all_total, accuracy);
    return accuracy;
}

/*
A text sample of gen_tokens tokens (-g, llm.c's genT): an <|endoftext|> prompt, then gen_tokens - 1
tokens drawn one at a time from row 0 of the batch. As llm.c, each sample draws its coins from a
generator seeded 1337 afresh (llm.c's xorshift*: rand.h), so samples at two steps differ by the
weights alone, and a resumed run prints what an uninterrupted one prints; and a draw is llm.c's
sample_softmax: the exponentials of the logits as they are, summed in double, the coin scaled by
that sum, the first token whose float running sum passes it. So the same weights give llm.c's
sample. Only a logit above 80 (exp overflows float at 88.7, which GPT-2's logits do not reach)
is shifted by the largest first.
*/
static void sample_text(GPT2* model, Tokenizer* tokenizer, int gen_tokens, cudaStream_t stream) {
    int B = model->B, T = model->T, V = model->config.vocab_size, Vp = model->config.padded_vocab_size;
    int eot = tokenizer->init_ok ? (int)tokenizer->eot_token : 50256;
    if (eot >= V) { eot = 0; }
    int* tokens = (int*)mallocCheck((size_t)B * T * sizeof(int));
    for (int i = 0; i < B * T; i++) { tokens[i] = eot; }
    if (gen_tokens > T) { gen_tokens = T; }
    uint64_t coins = 1337;
    float* logits = (float*)mallocCheck((size_t)V * sizeof(float));
    printf("generating:\n---\n");
    fp8_model_begin_eval(&model->fp8, stream);
    for (int t = 1; t < gen_tokens; t++) {
        gpt2_forward(model, tokens, NULL, 1.0f, 0, stream);
        gpt2_wait(model, stream, "sampling forward");  // bounded (ZeRO-3 gathers), before the blocking copy
        cudaCheck(cudaMemcpyAsync(model->logits_row_cpu, model->acts.output + (size_t)(t - 1) * Vp, (size_t)Vp * sizeof(floatX),
                                  cudaMemcpyDeviceToHost, stream));
        const uint16_t* row = (const uint16_t*)model->logits_row_cpu;
        float max_logit = -INFINITY;
        for (int v = 0; v < V; v++) { logits[v] = bf16_bits_to_float(row[v]); max_logit = fmaxf(max_logit, logits[v]); }
        float shift = max_logit > 80.0f ? max_logit : 0.0f;
        double norm = 0.0;
        for (int v = 0; v < V; v++) { norm += expf(logits[v] - shift); }
        float coin = xorshift_star_f32(&coins);
        coin *= norm;  // in double, rounded to float, as llm.c's
        int next = V - 1;
        float cdf = 0.0f;
        for (int v = 0; v < V; v++) { cdf += expf(logits[v] - shift); if (coin < cdf) { next = v; break; } }
        tokens[t] = next;
        if (tokenizer->init_ok) { safe_printf(tokenizer_decode(tokenizer, (uint32_t)next)); } else { printf("%d ", next); }
        fflush(stdout);
    }
    fp8_model_end_eval(&model->fp8, stream);
    printf("\n---\n");
    free(logits);
    free(tokens);
}

// ----------------------------------------------------------------------------
// checkpoints

/*
A checkpoint of step `step`: rank 0 writes the model file (every rank's weights, gathered
first), each rank its state file (llm.c's state_<step>_<rank>.bin: its range's master and
optimizer state, its data position, its FP8 scaling, and with -sl / -sg their windows), and
once all are written rank 0 writes DONE. Every rank calls this. With several ranks `dir`
must be shared by all.
*/
static void save_checkpoint(GPT2* model, const DataLoader* loader, OutlierSkip* outliers, const char* dir, int step,
                            int total_batch_size, cudaStream_t stream) {
    char path[CHECKPOINT_PATH_MAX];
    if (model->rank == 0) { checkpoint_remove(dir, step); }  // a step written before (a resumed run's), leftovers
    gpt2_all_reduce(model, 0.0f, ncclSum, stream, "checkpoint barrier (before writing)");  // before any rank writes
    float* params = gpt2_gather_params_fp32(model, stream);
    if (params != NULL) {  // rank 0
        checkpoint_model_path(path, sizeof(path), dir, step);
        model_file_write(path, &model->config, params, 5);  // the bf16 weights: llm.c's version 5, exact
        free(params);
    }

    size_t n = model->owned.end - model->owned.begin;
    float* master = model->master ? device_to_host_floats(model->master, n) : NULL;
    Fp8HostState fp8;
    StateSection sections[FP8_STATE_SECTIONS + OUTLIER_SKIP_SECTIONS];
    int num_sections = fp8_model_state_sections(&model->fp8, &fp8, sections);
    fp8_model_download(&model->fp8, &fp8, 0);
    num_sections += outlier_skip_state_sections(outliers, 0, sections + num_sections);
    Adamw8States opt;  // host copy; adamw8's go in tagged sections, plain AdamW's m32/v32 are llm.c's m and v
    adamw8_states_alloc_host(&opt, &model->opt_layout);
    adamw8_states_copy(&opt, &model->opt_states, &model->opt_layout, cudaMemcpyDeviceToHost);
    checkpoint_state_path(path, sizeof(path), dir, step, model->rank);
    train_state_write(path, step, total_batch_size, loader, &model->opt_layout, model->use_adamw8, opt.m32, opt.v32, &opt,
                      master, sections, num_sections);
    adamw8_states_free_host(&opt);
    fp8_host_state_free(&fp8);
    free(master);
    // every rank's file is complete: the peers wait for rank 0's model file too, within -pt
    gpt2_all_reduce(model, 0.0f, ncclSum, stream,
                    "checkpoint barrier (after writing: checkpoints slower to write than -pt need a larger -pt)");
    if (model->rank == 0) {
        checkpoint_write_done(dir, step);
        printf("wrote checkpoint %s/model_%08d.bin (+ %d state file%s, DONE)\n", dir, step, model->zero.num_ranks,
               model->zero.num_ranks > 1 ? "s" : "");
    }
}

/*
Restores this rank's optimizer state, master weights, FP8 scaling, data position and -sl /
-sg windows (when the file has them) from its state file; returns the step to continue
from. A state file of the other optimizer is converted (train_state_read): plain AdamW's
(or llm.c's) fp32 moments resume an adamw8 run, and adamw8's states a plain one. A
checkpoint written with another number of ranks is resharded (state_reshard.h): the rank's
window assembled from the old files, the FP8 scaling of old rank r % N, the loader replayed
by step * grad_accum_steps batches. A file without master weights resumed with -w 1 keeps
the master gpt2_build made of the model file's weights (one with them resumed with -w 0 is
refused: state_file_check_master). Under -fw delayed the FP8 weight codes are then rebuilt
with the scale the optimizer pass wrote them with (the start cast here used the current one;
fp8_model_restore_weight_codes).
*/
static int load_state(GPT2* model, DataLoader* loader, OutlierSkip* outliers, const char* dir, int step, int grad_accum_steps,
                      cudaStream_t stream) {
    char path[CHECKPOINT_PATH_MAX];
    size_t n = model->owned.end - model->owned.begin;
    Adamw8States opt;
    adamw8_states_alloc_host(&opt, &model->opt_layout);
    // a file without master weights (a -w 0 run's, train_gpt2cpu's) resumed with -w 1: the master
    // starts from the weights that run trained, the model file's, as gpt2_build uploaded them
    checkpoint_state_path(path, sizeof(path), dir, step, 0);
    StateFileIndex rank0;
    state_file_read_header(path, &rank0);
    int master_from_model_file = model->master != NULL && !rank0.has_master;
    if (master_from_model_file) {
        printf("%s has no fp32 master weights (a -w 0 run's, or train_gpt2cpu's): the master weights (-w 1) start from "
               "its model file's weights\n", path);
    }
    float* master = model->master != NULL && !master_from_model_file ? (float*)mallocCheck(n * sizeof(float)) : NULL;
    Fp8HostState fp8;
    StateSection sections[FP8_STATE_SECTIONS + OUTLIER_SKIP_SECTIONS];
    int num_sections = fp8_model_state_sections(&model->fp8, &fp8, sections);
    num_sections += outlier_skip_state_sections(outliers, 1, sections + num_sections);  // optional, both
    int resumed_step = train_state_read_checkpoint(dir, step, (size_t)grad_accum_steps, loader, &model->config,
                                                   model->use_adamw8, model->adamw8_selection,
                                                   model->use_adamw8 ? NULL : opt.m32, model->use_adamw8 ? NULL : opt.v32,
                                                   &opt, master, sections, num_sections, path);
    outlier_skip_check_loaded(outliers, path);
    adamw8_states_copy(&model->opt_states, &opt, &model->opt_layout, cudaMemcpyHostToDevice);
    adamw8_states_free_host(&opt);
    if (master != NULL) { cudaCheck(cudaMemcpy(model->master, master, n * sizeof(float), cudaMemcpyHostToDevice)); }
    // the FP8 weights from the restored master, then the saved scaling over what that cast changed
    gpt2_cast_weights(model, stream);
    gpt2_wait(model, stream, "weight gather (resume)");
    fp8_model_upload(&model->fp8, &fp8, path, 0);
    if (model->comm != NULL) { zero_comm_restore_weight_codes(model->comm, &model->fp8, model->params, model->master, stream); }
    else { fp8_model_restore_weight_codes(&model->fp8, model->master, model->params, stream); }
    fp8_host_state_free(&fp8);
    free(master);
    return resumed_step;
}

// ----------------------------------------------------------------------------
// progress reporting

// training FLOPs per token, llm.c's count (gpt2_estimate_mfu), so an MFU here reads as one of
// llm.c's: 6 per parameter (forward + backward of every weight, the tied lm_head counted
// through wte) plus attention's 6*L*C*T (PaLM's appendix B counts 12*L*C*T, non-causal; 7% more
// at d12, T=1024)
static double flops_per_token(const GPT2Config* cfg, size_t num_parameters, int T) {
    return 6.0 * (double)num_parameters + 6.0 * cfg->num_layers * (double)cfg->channels * T;
}

static void format_eta(char* buf, size_t n, double seconds) {
    if (seconds < 0 || !isfinite(seconds)) { snprintf(buf, n, "?"); return; }
    long s = (long)seconds;
    snprintf(buf, n, "%ldh%02ldm%02lds", s / 3600, (s / 60) % 60, s % 60);
}

// bytes of the optimizer's moments on the GPU: fp32 m and v, or adamw8's codes, absmaxes and
// the 32-bit tensors' m32/v32
static size_t gpt2_optimizer_state_bytes(const GPT2* model) {
    const Adamw8Layout* l = &model->opt_layout;
    return 2 * l->num_codes + 2 * l->num_blocks * sizeof(float) + 2 * l->num_fp32 * sizeof(float);
}

static double gpu_memory_used_mib(void) {
    size_t free_bytes, total_bytes;
    cudaCheck(cudaMemGetInfo(&free_bytes, &total_bytes));
    return (double)(total_bytes - free_bytes) / 1048576.0;
}

// ----------------------------------------------------------------------------
// main

// -pn -pr -pg -pi -pf -ps -pt as multi_gpu.h takes them; -pi auto is MPI when mpirun started
// this process (and the binary has MPI), else the shared-directory exchange
static MultiGpuOptions multi_gpu_options_from_flags(const TrainConfig* tc) {
    MultiGpuOptions opts = multi_gpu_options_default();
    opts.num_processes = tc->num_processes;
    opts.process_rank = tc->process_rank;
    opts.gpus_per_node = tc->gpus_per_node;
    opts.fs_path = tc->nccl_fs_path[0] ? tc->nccl_fs_path : NULL;
    opts.server = tc->nccl_server[0] ? tc->nccl_server : NULL;
    opts.timeout_s = tc->nccl_timeout_s;
    if (strcmp(tc->nccl_init, "auto") != 0) { opts.init_method = multi_gpu_init_method_from_name(tc->nccl_init); }
    else {
        // (a binary without MPI that mpirun started is refused by multi_gpu_check_launcher_world)
#ifdef USE_MPI
        int under_mpirun = getenv("OMPI_COMM_WORLD_SIZE") != NULL || getenv("PMIX_RANK") != NULL;
#else
        int under_mpirun = 0;
#endif
        opts.init_method = under_mpirun ? MULTI_GPU_INIT_MPI : MULTI_GPU_INIT_FS;
    }
    return opts;
}

// dies on every rank when the ranks were launched with different flags, models or checkpoints, naming the first item
// that differs (train_config_fingerprints) and this rank's value of it
static void check_same_config_on_all_ranks(const MultiGpuConfig* multi_gpu, const TrainConfig* tc, const GPT2Config* model,
                                           int resume_step, cudaStream_t stream) {
    if (multi_gpu->num_processes == 1) { return; }
    uint32_t fingerprints[NUM_CONFIG_ITEMS];
    train_config_fingerprints(tc, model, resume_step, fingerprints);
    float lowest[2 * NUM_CONFIG_ITEMS], highest[2 * NUM_CONFIG_ITEMS];  // 16-bit halves: exact in a float
    for (int i = 0; i < NUM_CONFIG_ITEMS; i++) {
        lowest[2 * i] = highest[2 * i] = (float)(fingerprints[i] >> 16);
        lowest[2 * i + 1] = highest[2 * i + 1] = (float)(fingerprints[i] & 0xffffu);
    }
    multi_gpu_all_reduce_floats(multi_gpu, lowest, 2 * NUM_CONFIG_ITEMS, ncclMin, stream, "startup config check");
    multi_gpu_all_reduce_floats(multi_gpu, highest, 2 * NUM_CONFIG_ITEMS, ncclMax, stream, "startup config check");
    int first = -1, differing = 0;
    for (int i = 0; i < NUM_CONFIG_ITEMS; i++) {
        if (lowest[2 * i] != highest[2 * i] || lowest[2 * i + 1] != highest[2 * i + 1]) {
            if (first < 0) { first = i; }
            differing++;
        }
    }
    if (first >= 0) {
        char what[64], value[4200];
        train_config_item_text(first, tc, model, resume_step, what, sizeof(what), value, sizeof(value));
        char more[64] = "";
        if (differing > 1) { snprintf(more, sizeof(more), ", and %d more item%s", differing - 1, differing > 2 ? "s" : ""); }
        llm8_die("rank %d of %d: the ranks were started with different %s (this rank's: %s%s): launch every rank with the "
                 "same command line and -o", multi_gpu->process_rank, multi_gpu->num_processes, what, value, more);
    }
}

#ifndef LLM8_TESTING
// the memory line: persistent bytes per parameter (DESIGN.md section 4; plain AdamW is a layout
// with no 8-bit tensor), the optimizer state, the GPU memory in use
static void print_memory_summary(const GPT2* model, const TrainConfig* tc, int num_ranks) {
    Adamw8Layout whole_model_states;
    adamw8_layout_init(&whole_model_states, &model->config, model->use_adamw8 ? model->adamw8_selection : ADAMW8_SELECT_NONE);
    Adamw8BytesPerParam bytes = adamw8_bytes_per_param(&whole_model_states, model->master != NULL);
    char eight_bit[160] = "";
    if (model->use_adamw8) {
        snprintf(eight_bit, sizeof(eight_bit), "; %.3f for the %.1f%% of parameters with 8-bit states, -qs %s", bytes.eight_bit,
                 100.0 * bytes.eight_bit_params / model->num_parameters, tc->adamw8_states);
    }
    printf("memory | persistent %.3f bytes/parameter on one GPU (bf16 weights+grads%s, %s m+v%s) | optimizer %s m+v %.2f GiB%s | GPU memory in use before the first step %.0f MiB (the step lines' mem adds cuDNN's workspace and NCCL's buffers)\n",
           bytes.model, model->master ? ", fp32 master" : "", model->use_adamw8 ? "8-bit" : "fp32", eight_bit, tc->optimizer,
           gpt2_optimizer_state_bytes(model) / 1073741824.0, num_ranks > 1 ? " on this rank" : "", gpu_memory_used_mib());
}

// the multi-GPU lines: the ZeRO layout, how the ranks met (-pi, auto resolved) and what a step
// sends; under ZeRO-3 also what stays sharded on this rank (rank 0 prints) and the memory it saves
// against ZeRO-1, the least and the most over the ranks (every rank calls this: those two are all-reduced)
static void print_multi_gpu_summary(const GPT2* model, const TrainConfig* tc, MultiGpuInitMethod id_exchange, int rank,
                                    int num_ranks, cudaStream_t stream) {
    const ZeroComm* z = model->comm;
    char fp32_scratch[64] = "";
    if (z->reduce_fp32) { snprintf(fp32_scratch, sizeof(fp32_scratch), " (fp32 scratch %.1f MiB)", z->reduce_scratch_elements * 4.0 / 1048576.0); }
    printf("zero | ZeRO-%d over %d ranks (-pi %s) | %zu parameters per rank (%zu padding) | weights gathered per step: "
           "%.1f MB as FP8 + %.1f MB as bf16 (all bf16: %.1f MB) | gradients reduced per step: %.1f MB %s%s\n",
           model->zero3 ? 3 : 1, num_ranks, multi_gpu_init_method_name(id_exchange), z->layout.shard_size, z->layout.padded_total - z->layout.num_parameters,
           z->gathered_bytes_fp8 / 1e6, z->gathered_bytes_bf16 / 1e6,
           zero_comm_received_bytes(&z->layout, rank, 0, z->layout.num_parameters, 2) / 1e6,
           (z->reduce_fp32 ? 4.0 : 2.0) * z->layout.num_parameters / 1e6, tc->grad_reduce, fp32_scratch);
    if (model->zero3) {  // what stays sharded, against ZeRO-1 on this rank
        size_t fp8_weights = 0, bf16_weights = 0;  // the block linears' weight elements, by the format they travel in
        for (int kind = 0; kind < LINEAR_KINDS_PER_LAYER; kind++) {
            size_t elements = z->layout.tensor_sizes[zero_comm_weight_tensor(kind)];
            if (model->fp8.rank_in_layer[kind] >= 0) { fp8_weights += elements; } else { bf16_weights += elements; }
        }
        size_t fp8_slots = (size_t)FP8_LAYER_SLOTS * 2 * fp8_weights / model->config.num_layers;  // W and W^T, bytes
        size_t bf16_slots = (size_t)FP8_LAYER_SLOTS * sizeof(floatX) * bf16_weights / model->config.num_layers;
        size_t whole_params = z->layout.padded_total * sizeof(floatX);
        // a rank whose own range lies in wte (rank 0) maps less of the matmul weights than the others
        float saved_mib = (float)(((double)whole_params - model->params_buffer.mapped_bytes + 2.0 * fp8_weights
                                   - model->fp8.owned_code_bytes - fp8_slots - bf16_slots) / 1048576.0);
        float least_saved_mib = gpt2_all_reduce(model, saved_mib, ncclMin, stream, "zero3 memory line");
        float most_saved_mib = gpt2_all_reduce(model, saved_mib, ncclMax, stream, "zero3 memory line");
        printf("zero3 | block linears' weights sharded on rank %d: bf16 parameters %.1f MiB mapped of %.1f MiB, FP8 weights %.1f MiB "
               "owned + %.1f MiB in %d layer slots (whole W and W^T: %.1f MiB), bf16 layer slots %.1f MiB | saves %.1f MiB "
               "per GPU at least, %.1f at most%s | weights gathered per micro-step (forward and backward): %.1f MB as FP8 + %.1f MB as bf16\n",
               rank, model->params_buffer.mapped_bytes / 1048576.0, whole_params / 1048576.0, model->fp8.owned_code_bytes / 1048576.0,
               fp8_slots / 1048576.0, FP8_LAYER_SLOTS, 2.0 * fp8_weights / 1048576.0, bf16_slots / 1048576.0,
               least_saved_mib, most_saved_mib,
               least_saved_mib < 0 ? " (below 0: at this model's size the layer slots and whole mapping granules cost more than the sharded "
                                     "weights)" : "",
               2.0 * fp8_weights / 1e6, 2.0 * sizeof(floatX) * bf16_weights / 1e6);
    }
}

// the FP8 line: the recipe, its scalings, the passes in FP8 and the buffers
static void print_fp8_summary(const GPT2* model) {
    const Fp8Model* fp8 = &model->fp8;
    const Fp8Settings* s = &fp8->settings;
    char passes[256];
    fp8_passes_text(passes, sizeof(passes), s->passes);
    bool block = s->recipe == FP8_MODEL_BLOCK;
    // where the optimizer pass casts only some FP8 weights, the rest are cast from bf16 after it
    int in_update = fp8_model_linears_cast_in_update(fp8);
    const char* after_update = in_update == fp8->num_linears ? ""
                             : in_update > 0 ? ", lm_head from bf16 after the update"
                             : " (from bf16 after the update: a block linear has a bf16 GEMM, or none is FP8)";
    // lm_head's output gradient is scaled from its bound (fp8_gradient_recipe), whatever -fg says
    bool bounded = fp8_model_dlogits_bounded(fp8);
    bool only_lm_head = bounded && !fp8_block_linears_cast_dy(s->passes);
    const char* gradients = block ? "1x128 tiles" : only_lm_head ? "lm_head's" : FP8_SCALING_CHOICE_NAMES[s->grad_scaling];
    char tuning[64];  // -fh, -fm where the recipe reads them
    fp8_tuning_text(tuning, sizeof(tuning), s);
    printf("fp8 | recipe %s (weights %s%s, gradients %s%s%s) | passes %s (the rest bf16)%s | %d FP8 linears | FP8 buffers %.1f MiB | numerics log %s\n",
           FP8_MODEL_RECIPE_NAMES[s->recipe],
           block ? "128x128 blocks" : FP8_SCALING_CHOICE_NAMES[s->weight_scaling], after_update,
           gradients, only_lm_head ? " from its bound" : bounded ? ", lm_head's from its bound" : "", tuning, passes,
           s->fc_writes_codes ? " | fcproj's x codes from fc's GEMM (-fe 1)" : "",
           fp8->num_linears, fp8->bytes / 1048576.0, fp8->numerics_file != NULL ? "numerics.jsonl" : "off (needs -o and -fn > 0)");
}

// -pc: every rank's gathered weights against rank 0's, bitwise, after `steps` steps (a skipped
// update, -sl / -sg or non-finite, is a step too); one line and exit on a difference (replica_check.cuh)
static void check_replicas_identical(const GPT2* model, ReplicaCheck* replicas, int steps, cudaStream_t stream) {
    zero_comm_join(model->comm, stream);  // every stage of the last weight gather
    ReplicaMismatch m = replica_check_compare(replicas, model->comm->multi_gpu, stream);
    if (m.region >= 0) {
        llm8_die("-pc: after %d steps rank %d's %s differs from rank 0's (%d of %d regions differ, on %d of the other %d ranks): "
                 "a weight gather delivered stale or wrong bytes", steps, m.rank, replicas->regions[m.region].name,
                 m.regions_differing, replicas->count, m.ranks_differing, replicas->num_ranks - 1);
    }
    printf("replicas | after %d steps: %d regions (%.1f MB) bitwise identical on %d ranks\n", steps, replicas->count,
           replicas->total_bytes / 1e6, replicas->num_ranks);
}

/*
Startup, on every rank alike: no rank's shard may cut an 8-bit tensor's states inside a block
(zero_8bit_part_off_block_grid). Where one would, the line names the nearest rank counts that
cut none (1 never does; above N, the first within N + 64).
*/
static void check_8bit_shards_on_block_grid(const GPT2Config* cfg, int num_ranks, Adamw8Selection selection,
                                            const char* qs_name) {
    int rank;
    size_t element;
    int off_grid = zero_8bit_part_off_block_grid(cfg, num_ranks, selection, &rank, &element);
    if (off_grid < 0) { return; }
    int fewer = 1, more = 0, other_rank;
    size_t other_element;
    for (int n = num_ranks - 1; n > 1 && fewer == 1; n--) {
        if (zero_8bit_part_off_block_grid(cfg, n, selection, &other_rank, &other_element) < 0) { fewer = n; }
    }
    for (int n = num_ranks + 1; n <= num_ranks + 64 && n <= ZERO_MAX_RANKS && more == 0; n++) {
        if (zero_8bit_part_off_block_grid(cfg, n, selection, &other_rank, &other_element) < 0) { more = n; }
    }
    char counts[64];
    if (more > 0) { snprintf(counts, sizeof(counts), "%d or %d would do", fewer, more); }
    else { snprintf(counts, sizeof(counts), "%d would do", fewer); }
    int default_keeps_32bit = selection == ADAMW8_SELECT_ALL && !adamw8_tensor_is_8bit(cfg, off_grid, ADAMW8_SELECT_DEFAULT);
    llm8_die("-opt adamw8 -qs %s over %d GPUs: rank %d's part of %s starts at its element %zu, inside a %d-element block "
             "of 8-bit states (this model's tensors do not all start on that grid, and the shards are cut for the flat "
             "parameters): use another number of GPUs (%s), -qs %s or -opt adamw", qs_name, num_ranks, rank,
             PARAM_TENSOR_NAMES[off_grid], element, QUANT8_BLOCK, counts, default_keeps_32bit ? "default" : "none");
}

int main(int argc, char** argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);  // each progress line reaches a pipe or file (tee, nohup) as it is printed
    TrainConfig tc = train_config_defaults();
    train_config_parse(&tc, argc, argv);
    const char* out_dir = tc.output_log_dir[0] ? tc.output_log_dir : NULL;
    // the processes (MPI or the flags): the rank is known before the data is checked, no GPU touched yet
    MultiGpuOptions multi_gpu_options = multi_gpu_options_from_flags(&tc);
    MultiGpuConfig multi_gpu = multi_gpu_process_init(&multi_gpu_options);
    int rank = multi_gpu.process_rank, num_ranks = multi_gpu.num_processes;
    if (rank != 0) {  // rank 0 reports; the others print only their errors (stderr)
        if (freopen("/dev/null", "w", stdout) == NULL) { llm8_die("rank %d: cannot silence stdout", rank); }
    }

    // the model: a checkpoint to resume, a model file, or a descriptor
    GPT2Config model_config;
    int resume_step = -1;
    char model_path[4096] = "";
    checkpoint_claim_dir(out_dir, rank, tc.resume);
    if (tc.resume) {
        resume_step = checkpoint_resume_step(out_dir);
        if (resume_step >= 0) { checkpoint_model_path(model_path, sizeof(model_path), out_dir, resume_step); }
    }
    if (model_path[0] == '\0') { train_config_model_file(&tc, model_path, sizeof(model_path)); }
    int model_version = 0;
    if (model_path[0] != '\0') { model_file_read_header(model_path, &model_config, &model_version); }
    else { model_config = gpt2_config_from_descriptor(tc.model); }
    if (resume_step >= 0) { train_config_note_resumed_model(&tc, &model_config, model_path); }
    int grad_accum_steps = train_config_check_batch(&tc, &model_config, num_ranks);
    if (tc.B * tc.T > MATMUL_MAX_ROWS) {  // B*T fits an int (train_config_check_batch); beyond: a launch error at step 1
        llm8_die("flags -b %d, -t %d: %d tokens per GPU micro-step exceed %d, the most the bias gradient and the FP8 "
                 "casts take (128-token row tiles, at most 65535 in CUDA's grid y); lower -b", tc.B, tc.T, tc.B * tc.T,
                 MATMUL_MAX_ROWS);
    }
    Fp8Settings fp8_settings = train_config_fp8_settings(&tc);
    train_config_check_zero_stage(&tc, &fp8_settings, num_ranks);
    fp8_model_check_shapes(&fp8_settings, &model_config, tc.B * tc.T);  // e.g. the block recipe on d48: one line, no GPU touched
    if (train_config_uses_adamw8(&tc)) {
        Adamw8Selection selection = adamw8_selection_from_name(tc.adamw8_states, "-qs");
        int off_grid = zero_8bit_weight_off_block_grid(&model_config, selection);
        if (off_grid >= 0) {
            llm8_die("-opt adamw8 -qs %s: %s's layer slice of %zu elements is not a whole number of %d-element blocks (C=%d "
                     "is not a multiple of 16), and the update takes each layer's weight on its own: use -qs none or "
                     "-opt adamw", tc.adamw8_states, PARAM_TENSOR_NAMES[off_grid],
                     gpt2_param_layer_elements(&model_config, off_grid), QUANT8_BLOCK, model_config.channels);
        }
        check_8bit_shards_on_block_grid(&model_config, num_ranks, selection, tc.adamw8_states);
    }
    AttentionBackend attention = strcmp(tc.attention, "cudnn") == 0 ? ATTENTION_CUDNN : ATTENTION_FALLBACK;
    if (!tc.attention_deterministic && attention != ATTENTION_CUDNN) {
        llm8_die("-ad 0: the backward with float atomics is cuDNN's (-at cudnn); -at %s is deterministic, "
                 "leave -ad at 1", tc.attention);
    }
    int head_size = model_config.channels / model_config.num_heads;
    const char* model_name = model_path[0] != '\0' ? model_path : tc.model;
    const char* head_error = attention_head_size_error(attention, head_size);
    if (head_error != NULL) {
        llm8_die("model '%s': head size C/NH = %d/%d = %d: %s", model_name, model_config.channels, model_config.num_heads,
                 head_size, head_error);
    }
    if (model_config.padded_vocab_size % 8 != 0) {  // C is one already: the head size is
        llm8_die("model '%s': padded vocab Vp = %d must be a multiple of 8 (lm_head's bf16 GEMM has Vp rows, each "
                 "starting 16-byte aligned); llm.c's files pad V to a multiple of 128 (50304)", model_name,
                 model_config.padded_vocab_size);
    }

    // data: validated before the GPU is touched
    DataLoader train_loader, val_loader;
    int val_batches;
    int run_val = train_config_open_data(&tc, model_config.vocab_size, rank, num_ranks, &train_loader, &val_loader,
                                         &val_batches);
    int train_num_batches = tc.max_steps == -1 ? dataloader_epoch_steps(&train_loader, grad_accum_steps) : tc.max_steps;
    EvalLoader eval_loader;
    const char* hellaswag_path = "dev/data/hellaswag/hellaswag_val.bin";
    if (tc.hellaswag && !file_exists(hellaswag_path)) {  // llm.c's path, from the working directory
        char cwd[4096];
        llm8_die("flag -h 1: no %s in the working directory %s (run from the checkout, where python3 "
                 "dev/data/hellaswag.py makes it: it downloads HellaSwag's val split; or run with -h 0)", hellaswag_path,
                 getcwd(cwd, sizeof(cwd)) != NULL ? cwd : "(unknown)");
    }
    if (tc.hellaswag) { evalloader_init(&eval_loader, hellaswag_path, tc.B, tc.T, rank, num_ranks,
                                    model_config.vocab_size); }
    Tokenizer tokenizer;  // for text samples only
    char tokenizer_path[4096];
    train_config_tokenizer_path(&tc, tokenizer_path, sizeof(tokenizer_path));
    if (tc.sample_every > 0) { tokenizer_init(&tokenizer, tokenizer_path); } else { memset(&tokenizer, 0, sizeof(tokenizer)); }
    LearningRateScheduler lr_scheduler;
    lr_scheduler_init(&lr_scheduler, tc.lr_schedule, tc.learning_rate, tc.warmup_iterations, train_num_batches, tc.final_lr_frac);
    train_config_note_schedule(&tc);
    train_config_note_unused_fp8_flags(&tc);
    train_config_note_idle_fp8_tuning(&tc);

    // the GPU, the communicator, and the ranks' agreement on what they run
    multi_gpu_device_init(&multi_gpu, &multi_gpu_options, 0);
    DeviceInfo device = device_info_query();
    cudaStream_t stream;
    cudaCheck(cudaStreamCreate(&stream));
    check_same_config_on_all_ranks(&multi_gpu, &tc, &model_config, resume_step, stream);
    matmul_setup();
    attention_setup(attention, tc.attention_deterministic != 0);
    profiler_init(tc.kernel_timing);

    GPT2 model;
    float* params_cpu = (float*)mallocCheck(gpt2_num_parameters(&model_config) * sizeof(float));
    if (model_path[0] != '\0') { model_file_read_params(model_path, &model_config, params_cpu); }
    else {
        gpt2_init_params_random(params_cpu, &model_config, GPT2_INIT_SEED);
        params_round_to_bf16(params_cpu, gpt2_num_parameters(&model_config));
    }
    gpt2_build(&model, &model_config, params_cpu, tc.use_master_weights, tc.B, tc.T, tc.recompute, tc.gelu_fusion,
               train_config_uses_adamw8(&tc), adamw8_selection_from_name(tc.adamw8_states, "-qs"), &fp8_settings, &multi_gpu,
               strcmp(tc.grad_reduce, "fp32") == 0, tc.zero_stage == 3, stream);
    free(params_cpu);
    int start_step = 0;
    OutlierSkip outliers;  // -sl / -sg, their windows restored with the state
    outlier_skip_init(&outliers, tc.skip_loss_z, tc.skip_norm_z);
    if (resume_step >= 0) {
        // -a 1 reads no batches from the loader: a resume replays none
        start_step = load_state(&model, &train_loader, &outliers, out_dir, resume_step,
                                tc.overfit_single_batch ? 0 : grad_accum_steps, stream);
        char rank0_state[CHECKPOINT_PATH_MAX];
        checkpoint_state_path(rank0_state, sizeof(rank0_state), out_dir, resume_step, 0);
        train_state_note_total_batch(rank0_state, tc.total_batch_size, grad_accum_steps);
        outlier_skip_note_resume(&outliers, resume_step);
        if (start_step >= train_num_batches) {
            printf("note: -y 1 resumed at step %d, and the run has %d steps (-x): nothing left to train\n", start_step,
                   train_num_batches);
        }
    }

    // -a 1, as llm.c: every micro-step of every step trains on the run's first batch
    if (tc.overfit_single_batch) { dataloader_fill_first_batch(&train_loader, tc.train_data_pattern); }

    Logger logger;  // rank 0 writes the logs
    logger_init(&logger, out_dir, rank, resume_step >= 0);
    fp8_model_open_numerics_log(&model.fp8, rank == 0 ? out_dir : NULL, resume_step >= 0);

    const GPT2Config* c = &model_config;
    printf("llm8 | device %s (%d SMs, bf16 peak %.0f TFLOP/s)\n", device.name, device.sm_count, device.bf16_peak_tflops);
    printf("model | L=%d NH=%d C=%d maxT=%d V=%d Vp=%d | %zu parameters (%.1fM) | %s\n", c->num_layers, c->num_heads, c->channels,
           c->max_seq_len, c->vocab_size, c->padded_vocab_size, model.num_parameters, model.num_parameters / 1e6,
           model_name);
    printf("train | precision %s | B=%d T=%d | total batch %d tokens = %d micro-steps | %d steps | lr %g (%s, warmup %d, final frac %g) | wd %g | clip %g\n",
           tc.precision, tc.B, tc.T, tc.total_batch_size, grad_accum_steps, train_num_batches, tc.learning_rate, tc.lr_schedule,
           tc.warmup_iterations, tc.final_lr_frac, tc.weight_decay, tc.grad_clip);
    print_memory_summary(&model, &tc, num_ranks);
    if (model.comm != NULL) { print_multi_gpu_summary(&model, &tc, multi_gpu_options.init_method, rank, num_ranks, stream); }
    if (fp8_settings.enabled) { print_fp8_summary(&model); }
    if (tc.sample_every > 0 && tc.gen_tokens > tc.T) {
        printf("note: -g %d is longer than -t %d: samples stop at %d tokens\n", tc.gen_tokens, tc.T, tc.T);
    }
    printf("data | train %zu tokens | attention %s%s | recompute %d | gelu fusion %d\n", train_loader.num_tokens, tc.attention,
           tc.attention_deterministic ? "" : " (backward with float atomics, -ad 0: not bitwise repeatable)", tc.recompute,
           tc.gelu_fusion);
    outlier_skip_print_settings(&outliers);
    GpuMonitor gpu_monitor;  // -lg
    memset(&gpu_monitor, 0, sizeof(gpu_monitor));
    if (tc.log_gpu_every > 0) {
        gpu_monitor_open(&gpu_monitor, device.pci_bus_id);
        if (!gpu_monitor.enabled) { printf("note: -lg %d: %s; no GPU lines\n", tc.log_gpu_every, gpu_monitor.why_not); }
    }

    ReplicaCheck replicas;  // -pc: what the weight gather must leave identical on every rank
    replica_check_init(&replicas);
    int check_replicas = model.comm != NULL && tc.replica_check_every > 0;
    if (check_replicas) {
        zero_comm_replicated_regions(model.comm, &model.fp8, model.params, &replicas);
        replica_check_finish(&replicas, num_ranks);
    }

    double flops_per_step = flops_per_token(c, model.num_parameters, tc.T) * tc.total_batch_size;
    double ema_ms = -1.0;
    cudaEvent_t start_event, end_event;
    cudaCheck(cudaEventCreate(&start_event));
    cudaCheck(cudaEventCreate(&end_event));
    OptimizerConfig optimizer = {0.9f, 0.95f, 1e-8f, tc.weight_decay, tc.grad_clip};

    for (int step = start_step; step <= train_num_batches; step++) {
        int last_step = step == train_num_batches;
        multi_gpu_watchdog_arm(&multi_gpu, "the evaluations before step %d", step + 1);  // llmc/multi_gpu.h
        if (check_replicas && (step % tc.replica_check_every == 0 || last_step)) {
            check_replicas_identical(&model, &replicas, step, stream);
        }
        if (run_val && (step % tc.val_every == 0 || last_step)) {
            float val_loss = evaluate_val_loss(&model, &val_loader, val_batches, stream);
            printf("val loss %f\n", val_loss);
            logger_log_val(&logger, step, val_loss);
        }
        // as llm.c: at the val steps after step 0, and at the end
        if (tc.hellaswag && ((step > 0 && step % (tc.val_every > 0 ? tc.val_every : train_num_batches) == 0) || last_step)) {
            float acc = evaluate_hellaswag(&model, &eval_loader, stream);
            logger_log_eval(&logger, step, acc);
        }
        // as llm.c: every -s steps after step 0, and at the end (-x 0: the model as it starts)
        if ((rank == 0 || model.zero3) && tc.sample_every > 0 && ((step > 0 && step % tc.sample_every == 0) || last_step)) {
            // ZeRO-1's forward is local; ZeRO-3's gathers weights, so every rank samples (rank 0 prints)
            sample_text(&model, &tokenizer, tc.gen_tokens, stream);
        }
        if (out_dir != NULL && tc.checkpoint_every > 0 && step > start_step && (step % tc.checkpoint_every == 0 || last_step)) {
            multi_gpu_watchdog_disarm(&multi_gpu);  // writing files takes as long as the disk does; the barriers are bounded
            save_checkpoint(&model, &train_loader, &outliers, out_dir, step, tc.total_batch_size, stream);
            if (rank == 0) { checkpoint_keep_newest(out_dir, tc.checkpoints_keep, tc.checkpoints_major_every); }
        }
        if (last_step) { break; }
        multi_gpu_watchdog_arm(&multi_gpu, "training step %d", step + 1);

        cudaCheck(cudaEventRecord(start_event, stream));
        float lr = get_learning_rate(&lr_scheduler, step);
        uint64_t traffic_before[ZERO_TRAFFIC_KINDS];
        if (model.comm != NULL) { memcpy(traffic_before, model.comm->traffic, sizeof(traffic_before)); }
        StepResult r = gpt2_train_step(&model, &train_loader, grad_accum_steps, tc.overfit_single_batch, &optimizer, &outliers,
                                       lr, step, stream);
        if (model.comm != NULL && step == start_step) { zero_comm_print_traffic(model.comm, traffic_before, step + 1); }
        float loss = r.loss, grad_norm = r.grad_norm;
        int skip = r.outcome != STEP_UPDATED;
        if (skip) {
            outlier_skip_print(step + 1, r.outcome, loss, grad_norm, r.skip_z, &outliers);
        }
        cudaCheck(cudaEventRecord(end_event, stream));
        gpt2_wait(&model, stream, "step end (weight gather)");  // bounded: the gather may wait for a dead peer
        profiler_end_step(step > start_step);  // the first step includes one-time setup
        float ms;
        cudaCheck(cudaEventElapsedTime(&ms, start_event, end_event));
        if (step > start_step) { ema_ms = ema_ms < 0 ? ms : 0.95 * ema_ms + 0.05 * ms; }
        double step_ms = ema_ms > 0 ? ema_ms : ms;
        double tok_per_s = tc.total_batch_size / (ms / 1000.0);
        double mfu = device.bf16_peak_tflops > 0 ? flops_per_step / num_ranks / (ms / 1000.0) / (device.bf16_peak_tflops * 1e12) : -1.0;
        char eta[64];
        format_eta(eta, sizeof(eta), (train_num_batches - step - 1) * step_ms / 1000.0);
        char mfu_text[32];
        if (mfu >= 0) { snprintf(mfu_text, sizeof(mfu_text), "%.1f%%", 100.0 * mfu); } else { snprintf(mfu_text, sizeof(mfu_text), "n/a"); }
        printf("step %5d/%d | loss %.6f | norm %.4f | lr %.2e | %.2f ms | %.0f tok/s | MFU %s | ETA %s | mem %.0f MiB%s\n",
               step + 1, train_num_batches, loss, grad_norm, lr, ms, tok_per_s, mfu_text, eta, gpu_memory_used_mib(),
               skip ? " | SKIPPED" : "");
        logger_log_train(&logger, step, loss, lr, grad_norm, ms, (float)tok_per_s, (float)(mfu >= 0 ? mfu : 0.0), skip);
        if (gpu_monitor.enabled && (step + 1) % tc.log_gpu_every == 0) {
            GpuSample sample = gpu_monitor_sample(&gpu_monitor);
            char line[GPU_MONITOR_LINE_MAX];
            gpu_monitor_format(&sample, line, sizeof(line));
            printf("%s\n", line);
        }
        fp8_model_log_numerics(&model.fp8, step + 1, stream);
    }
    // the last update's weight gather may still run on the communication stream (the forward
    // waits for it, and none follows): its end, bounded, before the buffers it writes are freed
    multi_gpu_watchdog_arm(&multi_gpu, "the end of training");
    if (model.comm != NULL) { zero_comm_join(model.comm, stream); }
    gpt2_wait(&model, stream, "weight gather (end of training)");
    multi_gpu_watchdog_disarm(&multi_gpu);
    fp8_model_print_predictions(&model.fp8, stream);
    profiler_print(stdout);
    outlier_skip_print_summary(&outliers);

    cudaCheck(cudaEventDestroy(start_event));
    cudaCheck(cudaEventDestroy(end_event));
    if (check_replicas) { replica_check_free(&replicas); }
    gpu_monitor_close(&gpu_monitor);
    logger_free(&logger);
    tokenizer_free(&tokenizer);
    if (tc.hellaswag) { evalloader_free(&eval_loader); }
    dataloader_free(&train_loader);
    if (run_val) { dataloader_free(&val_loader); }
    gpt2_free(&model);
    profiler_free();
    attention_teardown();
    matmul_teardown();
    cudaCheck(cudaStreamDestroy(stream));
    multi_gpu_config_free(&multi_gpu);
    return 0;
}
#endif // LLM8_TESTING
