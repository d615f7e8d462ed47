/*
fp8_model.cuh: the FP8 side of the model for -p fp8: per FP8 linear its scaling states and
cast records, the code buffers the casts write and the GEMMs read, the weight casts after
each optimizer step, evaluation without touching the scaling histories, the state file
sections, and the numerics log.

Why it is shaped so:
- The trainer's forward and backward stay one code path for both precisions: they ask this
  module whether a linear runs in FP8 (fp8_model_linear) and for the Fp8CastOutput of each
  operand, and call the kernels' FP8 launchers with it. Everything FP8 owns lives in one
  struct and one device allocation, so its size is one number printed at startup.
- Tensors: an FP8 linear is one of qkv, attproj, fc, fcproj in each layer and lm_head,
  with at least one pass in FP8 (Fp8Settings.passes[kind], from -f8 and -f8p); linear i has
  three per-tensor states, ordered as whole groups [0, n) activations x, [n, 2n) output
  gradients dy, [2n, 3n) weights W, so the delayed update of all activations is one kernel
  over the first group (a state whose tensor is never cast, e.g. x of a linear with only
  dgrad in FP8, then records amax 0 and is never read).
- Buffers, per DESIGN.md section 3, each only where a pass of its linear reads it: x codes
  [BT][K] (FP8 forward) are a scratch read at once by the forward GEMM; x^T [K][BT] (FP8
  wgrad) is kept per linear until its wgrad; dy (FP8 dgrad) and dy^T (FP8 wgrad) are
  scratch, reused linear after linear; W [OC][K] (FP8 forward) and W^T [K][OC] (FP8 dgrad)
  are kept per linear, cast once per optimizer step. The block recipe adds the tile scales
  of each (fp8_block_scale_floats). So x is cast for an FP8 forward or wgrad, dy for an FP8
  dgrad or wgrad, W for an FP8 forward or dgrad (fp8_model_casts_x / _dy / _w).
- Recompute (-r, as bf16 recomputes the GELU and layernorm outputs its wgrads read): x^T
  is the FP8 run's activation memory, so -r 1 keeps no fcproj x^T from the forward and -r 2
  none of qkv's, attproj's and fc's either (linear_input_recompute_level). The forward casts such an
  x into its codes only (x^T written only where no FP8 forward writes codes, to a scratch,
  for the statistics); the backward casts it again into one x^T scratch just before the
  wgrad (fp8_model_recast_gelu, _layernorm, _activation: fcproj's GELU of the stored
  pre-activation, a layernorm output from the stored input, mean and rstd, the stored
  attention output), as a replay (fp8_cast.cuh's FP8_RECORD_NOTHING): with the scale the
  forward's cast used, recording nothing. The codes are the forward's, bit for bit, so -r
  changes memory and time, never results.
- Activation scaling (doc/fp8-numerics.md, the cast protocol): a delayed activation that
  was never updated takes the current path once (first-step seeding); afterwards its
  producer casts in one pass and fp8_model_end_forward folds every activation's amax into
  its state with one kernel after each forward. The cast copied the scale it used into its
  record, which the backward GEMMs read, so updating right after the forward is exact. The
  host knows which path to take without reading the GPU: x_seeded flips after the first
  forward, and is read from the states on resume. Output gradients under -fg delayed
  likewise: dy_seeded flips after the first backward (fp8_model_dy_scale_known); under -fg
  pow2 the one pass after it predicts the scale and a recast follows where it was wrong
  (fp8_model_dout_scale). lm_head's
  output gradient, the logits' gradient, has a bound instead (fp8_gradient_recipe): before a
  forward that writes it, its state takes the bound as its amax (fp8_model_begin_dlogits), and
  the classifier writes its codes where both of lm_head's backward GEMMs read codes.
- -fe 1: from the second forward on (the delayed scales seeded), fc's GEMM writes fcproj's x
  codes through cuBLASLt's GELU epilogue and a byte transpose makes x^T
  (fp8_model_fc_forward_codes, fp8_model_fc_codes_transpose); fc's own x codes then live apart
  (fc_x_codes), as the GEMM reads them while it writes fcproj's into the x scratch.
- Weights (-fw, DESIGN.md section 3), per-tensor recipes: the optimizer pass writes the new
  amax of each weight it casts into its record (fp8_model_weight_update; the block linears'
  when each FP8 one runs all its GEMMs in FP8, fp8_weight_cast_in_update). current: the cast
  follows the pass with that amax, one launch per linear kind for all the layers
  (fp8_model_cast_weights_in_update, Fp8CastJob: 4 launches at d12, not 96 tiny ones). delayed: the pass itself writes
  W's codes with the weight state's scale (the previous step's amax, history 1,
  fp8_scaling.h), then fp8_model_weights_after_update copies that scale into the record for
  the GEMMs, folds the new amax into the state for the next step, and makes W^T from the
  codes (a byte per element, no re-read of the weights). The start cast seeds it (current),
  and a resume rebuilds the codes with the scale the saved records hold
  (fp8_model_restore_weight_codes). The other FP8 weights (lm_head, from the bf16 wte) are
  cast after the update from the bf16 weights, current-scaled, as several ranks must.
- ZeRO-3 (-z 3, zero_comm.cuh): the block linears' W codes are not kept whole. Each keeps
  only the codes of the part of its weight this rank owns (owned_codes, cast there after
  each optimizer step), and two layer slots hold one layer's four W and W^T at a time,
  gathered just before use; fp8_model_bind_layer points the layer's linears at its slot,
  so fp8_model_w and the GEMMs are unchanged. lm_head (wte, replicated) stays whole.
- Evaluation (val loss, HellaSwag, samples) runs the FP8 forward but must not change
  training: fp8_model_begin_eval snapshots the states and records on the device and
  fp8_model_end_eval puts them back, so the histories and the numerics log see training
  forwards only, a run's trajectory does not depend on -v or -s, and a resumed run (whose
  checkpoint step may also be a val step) stays bitwise identical.
*/
#ifndef LLMC_FP8_MODEL_CUH
#define LLMC_FP8_MODEL_CUH

#include <stdio.h>
#include <stdint.h>
#include <string.h>
#include "cuda_common.h"
#include "gpt2_config.h"
#include "checkpoint.h"
#include "logger.h"
#include "fp8_recipe.h"
#include "fp8_scaling.h"
#include "fp8_scaling.cuh"
#include "fp8_cast.cuh"
#include "gelu.cuh"
#include "layernorm.cuh"
#include "matmul.cuh"

typedef struct {
    int kind;                 // LinearKind
    int layer;                // -1 for lm_head
    int K, OC;                // y[BT][OC] = x[BT][K] W[OC][K]^T
    size_t weight_offset;     // the weight's first element in the parameter buffers
    uint8_t* x_codes_t;       // [K][BT], from the forward's cast to the wgrad (FP8 wgrad only; -r: the scratch)
    float* x_scale_inv_t;     // block recipe: its 128x1 tile scales
    int x_t_recast;           // -r: x^T is not kept from the forward but cast again for the wgrad
    uint8_t* w_codes;         // [OC][K] (FP8 forward only)
    uint8_t* w_codes_t;       // [K][OC] (FP8 dgrad only)
    float* w_scale_inv;       // block recipe: 128x128 block scales of w_codes and w_codes_t
    float* w_scale_inv_t;
    uint8_t* owned_codes;     // ZeRO-3: codes of the weight's elements [owned_begin, owned_end) only
    size_t owned_begin, owned_end; // in the weight's own coordinates (empty: this rank owns none of it)
} Fp8Linear;

// ZeRO-3's sharded FP8 weights: the flat parameter range this rank owns (zero.h)
typedef struct {
    int enabled;
    size_t owned_begin, owned_end;
} Fp8WeightSharding;

#define FP8_LAYER_SLOTS 2  // one layer in use, the next one arriving

// the operand of each group of states (and records): [0, n) x, [n, 2n) dy, [2n, 3n) W
static const char* const FP8_MODEL_STATE_GROUPS[3] = {"x", "dy", "w"};

typedef struct {
    Fp8Settings settings;
    int BT;
    int num_linears;                     // 0 when the run is bf16
    int rank_in_layer[NUM_LINEAR_KINDS]; // a block kind's index within its layer, -1: bf16
    int per_layer;                       // FP8 block linears per layer
    int lm_head;                         // lm_head's linear index, -1: bf16
    Fp8Linear* linears;                  // host [num_linears]
    Fp8TensorScaling* states;            // device [3 * num_linears]: x, dy, W
    Fp8CastRecord* records;              // device, beside the states
    Fp8TensorScaling* saved_states;      // the snapshot of fp8_model_begin_eval
    Fp8CastRecord* saved_records;
    Fp8TensorScaling* step_states;       // the states before this training step (fp8_model_begin_step)
    int step_x_seeded, step_dy_seeded;
    int x_seeded;                        // every state of a cast activation has been updated (host mirror)
    int dy_seeded;                       // every state of a cast output gradient has been updated (host mirror)
    int saved_x_seeded;
    int sharded;                         // ZeRO-3: block linears' W codes live in owned_codes and the slots
    uint8_t* slot_w[FP8_LAYER_SLOTS][LINEAR_KINDS_PER_LAYER];   // ZeRO-3: a gathered layer's W [OC][K]
    uint8_t* slot_w_t[FP8_LAYER_SLOTS][LINEAR_KINDS_PER_LAYER]; // and W^T [K][OC]
    size_t owned_code_bytes;             // ZeRO-3: this rank's part of the block weights' codes
    Fp8CastJob* weight_jobs;             // device, the weights the optimizer pass casts, a kind's layers together
                                         // (fp8_model_kind_jobs); NULL under ZeRO-3 (not cast whole)
    uint8_t* x_codes;                    // [BT][widest K of an FP8 forward] scratch
    uint8_t* fc_x_codes;                 // -fe 1: [BT][C] fc's x codes apart, as fc's GEMM writes fcproj's into x_codes
    float* x_scale_inv;
    uint8_t* dy_codes;                   // [BT][widest OC of an FP8 dgrad] scratch
    uint8_t* dy_codes_t;                 // [widest OC of an FP8 wgrad][BT] scratch
    float* dy_scale_inv;
    float* dy_scale_inv_t;
    Fp8Prediction* dy_prediction;        // -fg pow2: the predicted dy cast in flight (one at a time, as the scratches)
    uint8_t* x_t_recast_codes;           // [widest K of a recast x^T][BT] scratch (-r)
    float* x_t_recast_scale_inv;
    Fp8GemmScalars* gemm_scalars;        // -fe 1: per linear, the D scale and amax of a GEMM writing its x codes
    void* memory;                        // one allocation holds every buffer above
    size_t bytes;
    FILE* numerics_file;                 // numerics.jsonl, NULL: not logging
} Fp8Model;

// what a state file records about the FP8 settings, so a resume with other settings is refused
typedef struct {
    int32_t recipe, passes[NUM_LINEAR_KINDS], history_len, margin, num_linears;
} Fp8SavedSettings;

#define FP8_STATE_SECTIONS 3

static inline void fp8_linear_shape(LinearKind kind, int C, int Vp, int* K, int* OC) {
    switch (kind) {
        case LINEAR_QKV: *K = C; *OC = 3 * C; break;
        case LINEAR_ATTPROJ: *K = C; *OC = C; break;
        case LINEAR_FC: *K = C; *OC = 4 * C; break;
        case LINEAR_FCPROJ: *K = 4 * C; *OC = C; break;
        default: *K = C; *OC = Vp; break;
    }
}

/*
Host-only, before any CUDA work: every FP8 linear's shape against cuBLASLt FP8's rules
(multiples of 16), one line naming the linear and the remedy.
*/
void fp8_model_check_shapes(const Fp8Settings* s, const GPT2Config* cfg, int BT) {
    if (!s->enabled) { return; }
    for (int kind = 0; kind < NUM_LINEAR_KINDS; kind++) {
        if (s->passes[kind] == 0) { continue; }
        int K, OC;
        fp8_linear_shape((LinearKind)kind, cfg->channels, cfg->padded_vocab_size, &K, &OC);
        matmul_fp8_check_shapes(LINEAR_KIND_NAMES[kind], BT, K, OC);
    }
}

// linear (layer, kind)'s FP8 index, or -1 when it runs in bf16 (or the run is bf16)
static inline int fp8_model_linear(const Fp8Model* fp8, int layer, int kind) {
    if (fp8->num_linears == 0) { return -1; }
    if (kind == LINEAR_LM_HEAD) { return fp8->lm_head; }
    int rank = fp8->rank_in_layer[kind];
    return rank < 0 ? -1 : layer * fp8->per_layer + rank;
}

// whether linear i (from fp8_model_linear) runs `pass` in FP8
static inline bool fp8_model_runs(const Fp8Model* fp8, int i, Fp8Pass pass) {
    return i >= 0 && (fp8->settings.passes[fp8->linears[i].kind] & pass) != 0;
}

// whether linear i's input x is cast (for an FP8 forward or an FP8 wgrad)
static inline bool fp8_model_casts_x(const Fp8Model* fp8, int i) {
    return fp8_model_runs(fp8, i, FP8_FWD) || fp8_model_runs(fp8, i, FP8_WGRAD);
}

// -r: whether linear i's x^T is cast again for its wgrad (fp8_model_recast_gelu and the others)
static inline bool fp8_model_recasts_x_t(const Fp8Model* fp8, int i) {
    return i >= 0 && fp8->linears[i].x_t_recast;
}

// whether linear i's output gradient dy is cast (for an FP8 dgrad or an FP8 wgrad)
static inline bool fp8_model_casts_dy(const Fp8Model* fp8, int i) {
    return fp8_model_runs(fp8, i, FP8_DGRAD) || fp8_model_runs(fp8, i, FP8_WGRAD);
}

// whether linear i's weight W is cast (for an FP8 forward or an FP8 dgrad)
static inline bool fp8_model_casts_w(const Fp8Model* fp8, int i) {
    return fp8_model_runs(fp8, i, FP8_FWD) || fp8_model_runs(fp8, i, FP8_DGRAD);
}

static inline bool fp8_model_block(const Fp8Model* fp8) { return fp8->settings.recipe == FP8_MODEL_BLOCK; }

// whether the optimizer pass casts linear i's weight, from the master weights: the block
// linears' when each FP8 one runs all its GEMMs in FP8; lm_head's and the others' are cast after
// the update from the bf16 weights, current-scaled (fp8_weight_cast_in_update says why)
static inline bool fp8_model_weight_cast_in_update(const Fp8Model* fp8, int i) {
    return fp8_weight_cast_in_update(fp8->settings.passes, fp8->linears[i].kind);
}

// how many FP8 linears the optimizer pass casts: the first ones (the block linears come first)
static inline int fp8_model_linears_cast_in_update(const Fp8Model* fp8) {
    return fp8->per_layer > 0 && fp8_model_weight_cast_in_update(fp8, 0) ? fp8->num_linears - (fp8->lm_head >= 0) : 0;
}

// -fw delayed: the optimizer pass writes the codes of the weights it casts (DESIGN.md section 3)
static inline bool fp8_model_delayed_weights(const Fp8Model* fp8) {
    return fp8->num_linears > 0 && fp8->settings.weight_scaling == FP8_WEIGHTS_DELAYED;
}

// whether linear i's weight has delayed scaling: -fw delayed and cast in the optimizer pass
static inline bool fp8_model_weight_delayed(const Fp8Model* fp8, int i) {
    return fp8_model_delayed_weights(fp8) && fp8_model_weight_cast_in_update(fp8, i);
}

// the cast of linear i's input x: codes for an FP8 forward, x^T for an FP8 wgrad
static inline Fp8CastOutput fp8_model_x(const Fp8Model* fp8, int i) {
    const Fp8Linear* lin = &fp8->linears[i];
    Fp8CastOutput out = {};
    out.format = FP8_E4M3;
    out.scaling = fp8_model_block(fp8) ? FP8_SCALING_ROWS_1x128 : FP8_SCALING_TENSOR;
    uint8_t* codes = lin->kind == LINEAR_FC && fp8->fc_x_codes != NULL ? fp8->fc_x_codes : fp8->x_codes;
    out.codes = fp8_model_runs(fp8, i, FP8_FWD) ? codes : NULL;
    out.codes_t = lin->x_codes_t;
    out.state = &fp8->states[i];
    out.record = &fp8->records[i];
    out.scale_inv = out.codes != NULL ? fp8->x_scale_inv : NULL;
    out.scale_inv_t = lin->x_scale_inv_t;
    return out;
}

// the cast of linear i's output gradient: E5M2 per tensor (E4M3 1x128 tiles in the block
// recipe); codes for an FP8 dgrad, dy^T for an FP8 wgrad
static inline Fp8CastOutput fp8_model_dy(const Fp8Model* fp8, int i) {
    Fp8CastOutput out = {};
    bool block = fp8_model_block(fp8);
    bool dgrad = fp8_model_runs(fp8, i, FP8_DGRAD), wgrad = fp8_model_runs(fp8, i, FP8_WGRAD);
    out.format = block ? FP8_E4M3 : FP8_E5M2;
    out.scaling = block ? FP8_SCALING_ROWS_1x128 : FP8_SCALING_TENSOR;
    out.codes = dgrad ? fp8->dy_codes : NULL;
    out.codes_t = wgrad ? fp8->dy_codes_t : NULL;
    out.state = &fp8->states[fp8->num_linears + i];
    out.record = &fp8->records[fp8->num_linears + i];
    out.scale_inv = dgrad ? fp8->dy_scale_inv : NULL;
    out.scale_inv_t = wgrad ? fp8->dy_scale_inv_t : NULL;
    out.prediction = fp8->dy_prediction;
    return out;
}

// the cast of linear i's weight: W for an FP8 forward, W^T for an FP8 dgrad
static inline Fp8CastOutput fp8_model_w(const Fp8Model* fp8, int i) {
    const Fp8Linear* lin = &fp8->linears[i];
    Fp8CastOutput out = {};
    out.format = FP8_E4M3;
    out.scaling = fp8_model_block(fp8) ? FP8_SCALING_BLOCKS_128x128 : FP8_SCALING_TENSOR;
    out.codes = lin->w_codes;
    out.codes_t = lin->w_codes_t;
    out.state = &fp8->states[2 * fp8->num_linears + i];
    out.record = &fp8->records[2 * fp8->num_linears + i];
    out.scale_inv = lin->w_scale_inv;
    out.scale_inv_t = lin->w_scale_inv_t;
    return out;
}

// ZeRO-3: the block linears of `layer` read their W and W^T from layer slot `slot` from now on
static inline void fp8_model_bind_layer(Fp8Model* fp8, int layer, int slot) {
    for (int kind = 0; kind < LINEAR_KINDS_PER_LAYER; kind++) {
        int i = fp8_model_linear(fp8, layer, kind);
        if (i < 0) { continue; }
        fp8->linears[i].w_codes = fp8->slot_w[slot][kind];
        fp8->linears[i].w_codes_t = fp8->slot_w_t[slot][kind];
    }
}

// ----------------------------------------------------------------------------
// setup

// the next 256-byte aligned piece of `bytes` from base (base NULL: only counts)
static void* fp8_model_carve(char* base, size_t* offset, size_t bytes) {
    if (bytes == 0) { return NULL; }
    size_t at = (*offset + 255) / 256 * 256;
    *offset = at + bytes;
    return base == NULL ? NULL : (void*)(base + at);
}

// lays every buffer out from base (NULL: only sizes it); returns the bytes. Each buffer is
// there only where a pass of its linear reads it (the top comment); the scratches are as
// wide as the widest linear that uses them.
static size_t fp8_model_layout(Fp8Model* fp8, char* base) {
    size_t offset = 0;
    int states = 3 * fp8->num_linears;
    bool block = fp8_model_block(fp8);
    int forward_k = 0, dgrad_oc = 0, wgrad_oc = 0, recast_k = 0;
    size_t bt = (size_t)fp8->BT;
    fp8->states = (Fp8TensorScaling*)fp8_model_carve(base, &offset, states * sizeof(Fp8TensorScaling));
    fp8->records = (Fp8CastRecord*)fp8_model_carve(base, &offset, states * sizeof(Fp8CastRecord));
    fp8->saved_states = (Fp8TensorScaling*)fp8_model_carve(base, &offset, states * sizeof(Fp8TensorScaling));
    fp8->saved_records = (Fp8CastRecord*)fp8_model_carve(base, &offset, states * sizeof(Fp8CastRecord));
    fp8->step_states = (Fp8TensorScaling*)fp8_model_carve(base, &offset, states * sizeof(Fp8TensorScaling));
    for (int i = 0; i < fp8->num_linears; i++) {
        Fp8Linear* lin = &fp8->linears[i];
        size_t K = (size_t)lin->K, OC = (size_t)lin->OC;
        bool forward = fp8_model_runs(fp8, i, FP8_FWD), dgrad = fp8_model_runs(fp8, i, FP8_DGRAD);
        bool wgrad = fp8_model_runs(fp8, i, FP8_WGRAD);
        if (forward && lin->K > forward_k) { forward_k = lin->K; }
        if (dgrad && lin->OC > dgrad_oc) { dgrad_oc = lin->OC; }
        if (wgrad && lin->OC > wgrad_oc) { wgrad_oc = lin->OC; }
        bool sharded = fp8->sharded && lin->layer >= 0;  // W lives in owned_codes and the slots
        bool x_t_kept = wgrad && !lin->x_t_recast;
        if (lin->x_t_recast && lin->K > recast_k) { recast_k = lin->K; }
        lin->x_codes_t = (uint8_t*)fp8_model_carve(base, &offset, x_t_kept ? K * bt : 0);
        lin->w_codes = (uint8_t*)fp8_model_carve(base, &offset, forward && !sharded ? OC * K : 0);
        lin->w_codes_t = (uint8_t*)fp8_model_carve(base, &offset, dgrad && !sharded ? K * OC : 0);
        lin->owned_codes = (uint8_t*)fp8_model_carve(base, &offset, sharded ? lin->owned_end - lin->owned_begin : 0);
        size_t x_t_scales = x_t_kept ? fp8_block_scale_floats(FP8_SCALING_ROWS_1x128, lin->K, fp8->BT) : 0;
        size_t w_scales = forward ? fp8_block_scale_floats(FP8_SCALING_BLOCKS_128x128, lin->OC, lin->K) : 0;
        size_t w_t_scales = dgrad ? fp8_block_scale_floats(FP8_SCALING_BLOCKS_128x128, lin->K, lin->OC) : 0;
        lin->x_scale_inv_t = (float*)fp8_model_carve(base, &offset, block ? x_t_scales * sizeof(float) : 0);
        lin->w_scale_inv = (float*)fp8_model_carve(base, &offset, block ? w_scales * sizeof(float) : 0);
        lin->w_scale_inv_t = (float*)fp8_model_carve(base, &offset, block ? w_t_scales * sizeof(float) : 0);
    }
    for (int slot = 0; slot < FP8_LAYER_SLOTS && fp8->sharded; slot++) {
        for (int kind = 0; kind < LINEAR_KINDS_PER_LAYER; kind++) {
            int i = fp8_model_linear(fp8, 0, kind);
            if (i < 0) { continue; }
            size_t elements = (size_t)fp8->linears[i].OC * fp8->linears[i].K;
            fp8->slot_w[slot][kind] = (uint8_t*)fp8_model_carve(base, &offset, elements);
            fp8->slot_w_t[slot][kind] = (uint8_t*)fp8_model_carve(base, &offset, elements);
        }
    }
    size_t weight_jobs = fp8->sharded ? 0 : (size_t)fp8_model_linears_cast_in_update(fp8);
    fp8->weight_jobs = (Fp8CastJob*)fp8_model_carve(base, &offset, weight_jobs * sizeof(Fp8CastJob));
    fp8->x_codes = (uint8_t*)fp8_model_carve(base, &offset, bt * forward_k);
    fp8->dy_codes = (uint8_t*)fp8_model_carve(base, &offset, bt * dgrad_oc);
    fp8->dy_codes_t = (uint8_t*)fp8_model_carve(base, &offset, bt * wgrad_oc);
    size_t x_scales = forward_k > 0 ? fp8_block_scale_floats(FP8_SCALING_ROWS_1x128, fp8->BT, forward_k) : 0;
    size_t dy_scales = dgrad_oc > 0 ? fp8_block_scale_floats(FP8_SCALING_ROWS_1x128, fp8->BT, dgrad_oc) : 0;
    size_t dy_t_scales = wgrad_oc > 0 ? fp8_block_scale_floats(FP8_SCALING_ROWS_1x128, wgrad_oc, fp8->BT) : 0;
    fp8->x_scale_inv = (float*)fp8_model_carve(base, &offset, block ? x_scales * sizeof(float) : 0);
    fp8->dy_scale_inv = (float*)fp8_model_carve(base, &offset, block ? dy_scales * sizeof(float) : 0);
    fp8->dy_scale_inv_t = (float*)fp8_model_carve(base, &offset, block ? dy_t_scales * sizeof(float) : 0);
    bool predicts = fp8->settings.grad_scaling == FP8_GRADS_POW2;
    fp8->dy_prediction = (Fp8Prediction*)fp8_model_carve(base, &offset, predicts ? sizeof(Fp8Prediction) : 0);
    size_t recast_scales = recast_k > 0 ? fp8_block_scale_floats(FP8_SCALING_ROWS_1x128, recast_k, fp8->BT) : 0;
    fp8->x_t_recast_codes = (uint8_t*)fp8_model_carve(base, &offset, bt * recast_k);
    fp8->x_t_recast_scale_inv = (float*)fp8_model_carve(base, &offset, block ? recast_scales * sizeof(float) : 0);
    bool fc_writes_codes = fp8->settings.fc_writes_codes && fp8->num_linears > 0;
    fp8->gemm_scalars = (Fp8GemmScalars*)fp8_model_carve(base, &offset,
                                                         fc_writes_codes ? fp8->num_linears * sizeof(Fp8GemmScalars) : 0);
    int fc = fp8_model_linear(fp8, 0, LINEAR_FC);  // -fe 1 needs fc in FP8 (train_config_check_fc_codes)
    fp8->fc_x_codes = (uint8_t*)fp8_model_carve(base, &offset, fc_writes_codes && fc >= 0 ? bt * fp8->linears[fc].K : 0);
    for (int i = 0; i < fp8->num_linears; i++) {
        if (!fp8->linears[i].x_t_recast) { continue; }
        fp8->linears[i].x_codes_t = fp8->x_t_recast_codes;
        fp8->linears[i].x_scale_inv_t = fp8->x_t_recast_scale_inv;
    }
    return offset;
}

// host states, fresh: activations by the recipe, gradients as -fg says (lm_head's from its bound:
// fp8_gradient_recipe), weights as -fw says
// (those the optimizer pass casts; the others current)
static void fp8_model_init_states(const Fp8Model* fp8, Fp8TensorScaling* host) {
    const Fp8Settings* s = &fp8->settings;
    int n = fp8->num_linears;
    for (int i = 0; i < n; i++) {
        fp8_scaling_init(&host[i], fp8_activation_recipe(s), FP8_E4M3, s->history_len, s->margin);
        fp8_scaling_init(&host[n + i], fp8_gradient_recipe(s->grad_scaling, fp8->linears[i].kind), FP8_E5M2,
                         s->history_len, s->margin);
        fp8_scaling_init_weight(&host[2 * n + i], fp8_model_weight_delayed(fp8, i), s->history_len, s->margin);
    }
}

/*
The jobs of the batched weight casts and transposes (Fp8CastJob): the weights the optimizer
pass casts, kind by kind, each kind's layers in order, so fp8_model_kind_jobs gives a launch's
L jobs of one shape. Their codes, states and records stay where they are for the whole run.
*/
static void fp8_model_upload_weight_jobs(const Fp8Model* fp8, cudaStream_t stream) {
    if (fp8->weight_jobs == NULL) { return; }
    int count = fp8_model_linears_cast_in_update(fp8), layers = count / fp8->per_layer;
    Fp8CastJob* host = (Fp8CastJob*)mallocCheck((size_t)count * sizeof(Fp8CastJob));
    for (int rank = 0; rank < fp8->per_layer; rank++) {
        for (int layer = 0; layer < layers; layer++) {
            int i = layer * fp8->per_layer + rank;
            Fp8CastJob* job = &host[rank * layers + layer];
            job->out = fp8_model_w(fp8, i);
            job->in_offset = fp8->linears[i].weight_offset;
            fp8_cast_check(&job->out, fp8->linears[i].OC, fp8->linears[i].K, "fp8_model_create (weight casts)");
        }
    }
    cudaCheck(cudaMemcpyAsync(fp8->weight_jobs, host, (size_t)count * sizeof(Fp8CastJob), cudaMemcpyHostToDevice, stream));
    cudaCheck(cudaStreamSynchronize(stream));  // host is freed next
    free(host);
}

// the jobs of the weights of the kind at `rank` within a layer (its linear index in layer 0), one per
// layer: *layers of them
static inline const Fp8CastJob* fp8_model_kind_jobs(const Fp8Model* fp8, int rank, int* layers) {
    if (fp8->weight_jobs == NULL) { llm8_die("fp8_model_kind_jobs: no batched weight casts (ZeRO-3 casts each rank's parts)"); }
    *layers = fp8_model_linears_cast_in_update(fp8) / fp8->per_layer;
    return fp8->weight_jobs + (size_t)rank * *layers;
}

/*
The FP8 model for micro-batches of BT tokens (nothing when settings->enabled is 0). Weight
i's slices come from param_offsets / param_sizes (gpt2_config.h's order); the weights are
not cast yet: fp8_model_cast_weights does that once the parameters are on the GPU.
recompute: the trainer's -r (which x^T the backward casts again, linear_input_recompute_level).
sharding (NULL or not enabled: every weight whole) is ZeRO-3's: the block linears keep the
codes of the rank's part only, plus the two layer slots (the top comment).
*/
void fp8_model_create(Fp8Model* fp8, const Fp8Settings* settings, const GPT2Config* cfg, int BT, int recompute,
                      const size_t* param_offsets, const size_t* param_sizes, const Fp8WeightSharding* sharding,
                      cudaStream_t stream) {
    memset(fp8, 0, sizeof(*fp8));
    fp8->settings = *settings;
    fp8->BT = BT;
    fp8->lm_head = -1;
    for (int kind = 0; kind < NUM_LINEAR_KINDS; kind++) { fp8->rank_in_layer[kind] = -1; }
    if (!settings->enabled) { return; }
    if (settings->weight_scaling == FP8_WEIGHTS_DELAYED &&
        (settings->recipe == FP8_MODEL_BLOCK || !fp8_weights_cast_in_update(settings->passes))) {
        llm8_die("fp8_model_create: delayed weight scaling needs a per-tensor recipe, and weights the optimizer pass casts "
                 "(train_config_fp8_settings)");
    }
    if (settings->grad_scaling != FP8_GRADS_CURRENT && settings->recipe == FP8_MODEL_BLOCK) {
        llm8_die("fp8_model_create: delayed or pow2 gradient scaling needs a per-tensor recipe (train_config_fp8_settings)");
    }
    const int weight_tensor[LINEAR_KINDS_PER_LAYER] = {PARAM_QKVW, PARAM_ATTPROJW, PARAM_FCW, PARAM_FCPROJW};
    for (int kind = 0; kind < LINEAR_KINDS_PER_LAYER; kind++) {
        if (settings->passes[kind] != 0) { fp8->rank_in_layer[kind] = fp8->per_layer++; }
    }
    int L = cfg->num_layers;
    int lm_head = settings->passes[LINEAR_LM_HEAD] != 0;
    fp8->num_linears = L * fp8->per_layer + lm_head;
    fp8->linears = (Fp8Linear*)mallocCheck((size_t)(fp8->num_linears > 0 ? fp8->num_linears : 1) * sizeof(Fp8Linear));
    for (int l = 0; l < L; l++) {
        for (int kind = 0; kind < LINEAR_KINDS_PER_LAYER; kind++) {
            int i = fp8_model_linear(fp8, l, kind);
            if (i < 0) { continue; }
            Fp8Linear* lin = &fp8->linears[i];
            memset(lin, 0, sizeof(*lin));
            lin->kind = kind;
            lin->layer = l;
            fp8_linear_shape((LinearKind)kind, cfg->channels, cfg->padded_vocab_size, &lin->K, &lin->OC);
            lin->weight_offset = param_offsets[weight_tensor[kind]] + (size_t)l * (param_sizes[weight_tensor[kind]] / L);
            lin->x_t_recast = (settings->passes[kind] & FP8_WGRAD) != 0 && recompute >= linear_input_recompute_level(kind);
            if (sharding != NULL && sharding->enabled) {
                size_t begin = lin->weight_offset, end = begin + (size_t)lin->OC * lin->K;
                size_t lo = begin > sharding->owned_begin ? begin : sharding->owned_begin;
                size_t hi = end < sharding->owned_end ? end : sharding->owned_end;
                lin->owned_begin = lo < hi ? lo - begin : 0;
                lin->owned_end = lo < hi ? hi - begin : 0;
                fp8->owned_code_bytes += lin->owned_end - lin->owned_begin;
            }
        }
    }
    fp8->sharded = sharding != NULL && sharding->enabled && fp8->per_layer > 0;
    if (lm_head) {
        fp8->lm_head = L * fp8->per_layer;
        Fp8Linear* lin = &fp8->linears[fp8->lm_head];
        memset(lin, 0, sizeof(*lin));
        lin->kind = LINEAR_LM_HEAD;
        lin->layer = -1;
        fp8_linear_shape(LINEAR_LM_HEAD, cfg->channels, cfg->padded_vocab_size, &lin->K, &lin->OC);
        lin->weight_offset = param_offsets[PARAM_WTE];  // tied: wte [Vp][C] is lm_head's weight
    }
    fp8->bytes = fp8_model_layout(fp8, NULL);
    fp8->memory = cuda_malloc_checked(fp8->bytes, "FP8 buffers (codes, transposes, scaling states; -f8 lists fewer linears)");
    fp8_model_layout(fp8, (char*)fp8->memory);
    fp8_model_upload_weight_jobs(fp8, stream);

    int states = 3 * fp8->num_linears;
    Fp8TensorScaling* host = (Fp8TensorScaling*)mallocCheck((size_t)states * sizeof(Fp8TensorScaling));
    fp8_model_init_states(fp8, host);
    cudaCheck(cudaMemcpyAsync(fp8->states, host, (size_t)states * sizeof(Fp8TensorScaling), cudaMemcpyHostToDevice, stream));
    cudaCheck(cudaStreamSynchronize(stream));  // host is freed next
    free(host);
    fp8_cast_records_init(fp8->records, states, stream);
    if (fp8->dy_prediction != NULL) { cudaCheck(cudaMemsetAsync(fp8->dy_prediction, 0, sizeof(Fp8Prediction), stream)); }
    fp8->x_seeded = 0;
    fp8->dy_seeded = 0;
}

void fp8_model_free(Fp8Model* fp8) {
    if (fp8->memory != NULL) { cudaCheck(cudaFree(fp8->memory)); }
    if (fp8->numerics_file != NULL) { fcloseCheck(fp8->numerics_file); }
    free(fp8->linears);
    memset(fp8, 0, sizeof(*fp8));
}

// ----------------------------------------------------------------------------
// casts

// whether activations are cast with the delayed recipe's scale: after the seeding forward
static inline bool fp8_model_delayed_x(const Fp8Model* fp8) {
    return fp8->settings.recipe == FP8_MODEL_DELAYED && fp8->x_seeded;
}

// whether an activation's cast knows its scale before it reads the tensor (the delayed
// recipe after seeding, the block recipe's tiles), else it takes current scaling's amax pass
static inline bool fp8_model_x_scale_known(const Fp8Model* fp8) {
    return fp8_model_block(fp8) || fp8_model_delayed_x(fp8);
}

/*
The forward's cast of linear i's input: fp8_model_x, but where the backward casts x^T again
(-r) and an FP8 forward's codes are written (they carry the statistics), no x^T. A cast for
the wgrad alone still writes x^T, into the recast scratch, which the backward overwrites.
*/
static inline Fp8CastOutput fp8_model_x_in_forward(const Fp8Model* fp8, int i) {
    Fp8CastOutput out = fp8_model_x(fp8, i);
    if (fp8_model_recasts_x_t(fp8, i) && out.codes != NULL) {
        out.codes_t = NULL;
        out.scale_inv_t = NULL;
    }
    return out;
}

/*
Casts linear i's input x (bf16 [BT][K], as stored) with the recipe's path: the block
recipe's tiles; current scaling (the current recipe, and a delayed activation's first use);
or the delayed one-pass cast. E.g. the attention output; the producers that cast in their
own pass have their launchers below.
*/
void fp8_model_cast_activation(const Fp8Model* fp8, int i, const floatX* x, cudaStream_t stream) {
    Fp8CastOutput out = fp8_model_x_in_forward(fp8, i);
    if (fp8_model_x_scale_known(fp8)) {
        fp8_cast_transpose(&out, x, fp8->BT, fp8->linears[i].K, stream);
    } else {
        fp8_cast_transpose_current(&out, x, fp8->BT, fp8->linears[i].K, stream);
    }
}

/*
Linear i's x = the layernorm of inp1 (inp2 NULL) or of residual_out = inp1 + inp2, straight
into FP8, and into normed_out (bf16) unless it is NULL. mean and rstd are needed.
*/
void fp8_model_layernorm_forward(const Fp8Model* fp8, int i, floatX* residual_out, floatX* normed_out, float* mean,
                                 float* rstd, const floatX* inp1, const floatX* inp2, const floatX* weight,
                                 const floatX* bias, cudaStream_t stream) {
    Fp8CastOutput x = fp8_model_x_in_forward(fp8, i);
    if (fp8_model_x_scale_known(fp8)) {
        layernorm_forward_fp8(&x, residual_out, normed_out, mean, rstd, inp1, inp2, weight, bias, fp8->BT,
                              fp8->linears[i].K, stream);
    } else {
        layernorm_forward_fp8_current(&x, residual_out, normed_out, mean, rstd, inp1, inp2, weight, bias, fp8->BT,
                                      fp8->linears[i].K, stream);
    }
}

// linear i's x = GELU(pre_gelu) straight into FP8 (and into out, bf16, unless out is NULL)
void fp8_model_gelu_forward(const Fp8Model* fp8, int i, floatX* out, const floatX* pre_gelu, cudaStream_t stream) {
    Fp8CastOutput x = fp8_model_x_in_forward(fp8, i);
    if (fp8_model_x_scale_known(fp8)) {
        gelu_forward_fp8(&x, out, pre_gelu, fp8->BT, fp8->linears[i].K, stream);
    } else {
        gelu_forward_fp8_current(&x, out, pre_gelu, fp8->BT, fp8->linears[i].K, stream);
    }
}

/*
-fe 1, once the activations' scales come from their histories (after the first forward: before
it, fcproj's x takes the current path, fp8_model_gelu_forward): fc's forward GEMM writes fcproj's
x codes itself, through cuBLASLt's GELU epilogue under that scale, and the pre-activation into
pre_gelu (fp8_model_fc_forward_codes); fp8_model_fc_codes_transpose then makes x^T from the
codes and records the cast (fp8_cast.cuh's Fp8GemmScalars). -fe 1 is refused unless fc's
forward and fcproj's three GEMMs are FP8 under -fr delayed and -r 0 (train_config_check_fc_codes).
*/
static inline bool fp8_model_fc_writes_codes(const Fp8Model* fp8) {
    return fp8->num_linears > 0 && fp8->settings.fc_writes_codes && fp8_model_x_scale_known(fp8);
}

void fp8_model_fc_forward_codes(const Fp8Model* fp8, int fc, int fcproj, floatX* pre_gelu, const floatX* bias,
                                cudaStream_t stream) {
    Fp8CastOutput x = fp8_model_x(fp8, fcproj), fc_x = fp8_model_x(fp8, fc), fc_w = fp8_model_w(fp8, fc);
    Fp8GemmScalars* scalars = &fp8->gemm_scalars[fcproj];
    fp8_gemm_codes_begin(&x, scalars, stream);
    matmul_forward_fp8_gelu_codes(x.codes, pre_gelu, fp8_operand(&fc_x, false), fp8_operand(&fc_w, false), bias, fp8->BT,
                                  fp8->linears[fc].K, fp8->linears[fc].OC, &scalars->scale, &scalars->amax, stream);
}

void fp8_model_fc_codes_transpose(const Fp8Model* fp8, int fcproj, cudaStream_t stream) {
    Fp8CastOutput x = fp8_model_x(fp8, fcproj);
    fp8_transpose_codes_counted(&x, fp8->BT, fp8->linears[fcproj].K, &fp8->gemm_scalars[fcproj], stream);
}

/*
-r: linear i's x^T, not kept from the forward, cast again into the recast scratch just before
its wgrad reads it, as a replay of the forward's cast (fp8_cast.cuh's FP8_RECORD_NOTHING: the
codes the forward would have kept, bit for bit, with nothing recorded), from what the forward
cast it from. The replay's Fp8CastOutput is x's with x^T only.
*/
static Fp8CastOutput fp8_model_x_t_replay(const Fp8Model* fp8, int i, const char* who) {
    if (!fp8_model_recasts_x_t(fp8, i)) { llm8_die("%s: linear %d keeps its x^T from the forward", who, i); }
    Fp8CastOutput x_t = fp8_model_x(fp8, i);
    x_t.codes = NULL;
    x_t.scale_inv = NULL;
    return x_t;
}

// fcproj's x^T: GELU of the stored pre-activation
void fp8_model_recast_gelu(const Fp8Model* fp8, int i, const floatX* pre_gelu, cudaStream_t stream) {
    Fp8CastOutput x_t = fp8_model_x_t_replay(fp8, i, "fp8_model_recast_gelu");
    gelu_forward_fp8_replay(&x_t, pre_gelu, fp8->BT, fp8->linears[i].K, stream);
}

// qkv's and fc's x^T: the layernorm of its stored input inp (the residual sum where the
// forward fused the add), with the mean and rstd the forward wrote
void fp8_model_recast_layernorm(const Fp8Model* fp8, int i, const floatX* inp, const float* mean, const float* rstd,
                                const floatX* weight, const floatX* bias, cudaStream_t stream) {
    Fp8CastOutput x_t = fp8_model_x_t_replay(fp8, i, "fp8_model_recast_layernorm");
    layernorm_forward_fp8_replay(&x_t, inp, mean, rstd, weight, bias, fp8->BT, fp8->linears[i].K, stream);
}

// attproj's x^T: the stored attention output
void fp8_model_recast_activation(const Fp8Model* fp8, int i, const floatX* x, cudaStream_t stream) {
    Fp8CastOutput x_t = fp8_model_x_t_replay(fp8, i, "fp8_model_recast_activation");
    fp8_cast_transpose_replay(&x_t, x, fp8->BT, fp8->linears[i].K, stream);
}

// after every forward: the delayed activations' amaxes into their states (one kernel)
void fp8_model_end_forward(Fp8Model* fp8, cudaStream_t stream) {
    if (fp8->num_linears == 0) { return; }
    if (fp8_model_delayed_x(fp8)) { fp8_scaling_update_records(fp8->states, fp8->records, fp8->num_linears, stream); }
    fp8->x_seeded = 1;
}

/*
Whether output gradients are cast with a scale known before the pass reads dy: the block
recipe's tiles, or -fg delayed after the first backward (which seeds each history with the
current path). matmul_backward_fp8_dout then sums the bias and casts in one pass, and
updates the state right after (the cast copied the scale it used into the record, which
both backward GEMMs read).
*/
static inline bool fp8_model_dy_scale_known(const Fp8Model* fp8) {
    return fp8_model_block(fp8) || (fp8->settings.grad_scaling == FP8_GRADS_DELAYED && fp8->dy_seeded);
}

// whether lm_head's output gradient (the logits' gradient) is cast per tensor with the scale of
// its bound (an FP8 lm_head dgrad or wgrad in a per-tensor recipe; fp8_gradient_recipe)
static inline bool fp8_model_dlogits_bounded(const Fp8Model* fp8) {
    return !fp8_model_block(fp8) && fp8_model_casts_dy(fp8, fp8_model_linear(fp8, -1, LINEAR_LM_HEAD));
}

// whether the classifier writes lm_head's dy codes itself (fused_classifier): bounded, and both
// backward GEMMs in FP8, so no bf16 GEMM reads the bf16 gradient and it is never written
static inline bool fp8_model_classifier_casts_dlogits(const Fp8Model* fp8) {
    int i = fp8_model_linear(fp8, -1, LINEAR_LM_HEAD);
    return fp8_model_dlogits_bounded(fp8) && fp8_model_runs(fp8, i, FP8_DGRAD) && fp8_model_runs(fp8, i, FP8_WGRAD);
}

/*
Before a forward that writes the logits' gradient (loss gradient dloss): where lm_head's dy is
bounded, its state takes the bound as this use's amax and publishes the scale into the record,
so the classifier (or the cast pass after it) writes codes with it and both backward GEMMs
read its inverse. Returns the cast the classifier writes, into *out, or NULL: it writes the
bf16 gradient (fp8_model_classifier_casts_dlogits).
*/
const Fp8CastOutput* fp8_model_begin_dlogits(const Fp8Model* fp8, float dloss, Fp8CastOutput* out, cudaStream_t stream) {
    if (!fp8_model_dlogits_bounded(fp8)) { return NULL; }
    *out = fp8_model_dy(fp8, fp8_model_linear(fp8, -1, LINEAR_LM_HEAD));
    fp8_scaling_update_with_amax(out->state, out->record, fp8_dlogits_amax_bound(dloss), stream);
    if (!fp8_model_classifier_casts_dlogits(fp8)) { return NULL; }
    out->codes_t = NULL;  // transposed in the backward (matmul_backward_fp8_dout, FP8_DOUT_CODES_WRITTEN)
    return out;
}

// what the cast of FP8 linear i's output gradient knows of its scale (matmul_backward_fp8_dout):
// under -fg pow2 after the first backward, the last use's power of two predicts it (the first
// backward takes current's path, as it seeds -fg delayed's histories)
static inline Fp8DoutScale fp8_model_dout_scale(const Fp8Model* fp8, int i) {
    if (i == fp8_model_linear(fp8, -1, LINEAR_LM_HEAD) && fp8_model_dlogits_bounded(fp8)) {
        return fp8_model_classifier_casts_dlogits(fp8) ? FP8_DOUT_CODES_WRITTEN : FP8_DOUT_SCALE_BOUND;
    }
    if (fp8_model_dy_scale_known(fp8)) { return FP8_DOUT_SCALE_KNOWN; }
    return fp8->settings.grad_scaling == FP8_GRADS_POW2 && fp8->dy_seeded ? FP8_DOUT_SCALE_PREDICTED : FP8_DOUT_NEEDS_AMAX;
}

// -fg pow2: how often the predicted scale of an output gradient held, a line at the end of training
void fp8_model_print_predictions(const Fp8Model* fp8, cudaStream_t stream) {
    if (fp8->dy_prediction == NULL) { return; }
    Fp8Prediction held;
    cudaCheck(cudaMemcpyAsync(&held, fp8->dy_prediction, sizeof(held), cudaMemcpyDeviceToHost, stream));
    cudaCheck(cudaStreamSynchronize(stream));
    printf("fp8 | -fg pow2: %llu output gradients cast with a predicted scale, %llu cast again (%.2f%%)\n",
           held.predictions, held.recasts, held.predictions > 0 ? 100.0 * (double)held.recasts / (double)held.predictions : 0.0);
}

// after every backward: each FP8 output gradient's state has been updated at least once
void fp8_model_end_backward(Fp8Model* fp8) { fp8->dy_seeded = 1; }

/*
FP8 linear i's weight W (for an FP8 forward) and W^T (for an FP8 dgrad), with current
scaling; nothing when neither pass is FP8. A weight the optimizer pass casts comes from the
fp32 master when master != NULL (all of it: one GPU), else from the bf16 weights; amax_known:
the pass has written its amax into its record (fp8_model_weight_update), so the per-tensor
cast skips its amax pass. Any other weight (lm_head; all of them when a block linear has a
bf16 GEMM) always comes from the bf16 weights with an amax pass of its own, as several ranks
cast it after their bf16 gather. At the start (seeding a delayed weight's state), after
loading a checkpoint, and after each optimizer step.
*/
void fp8_model_cast_weight(const Fp8Model* fp8, int i, const float* master, const floatX* params, bool amax_known,
                           cudaStream_t stream) {
    if (!fp8_model_casts_w(fp8, i)) { return; }
    if (!fp8_model_weight_cast_in_update(fp8, i)) {
        master = NULL;
        amax_known = false;
    }
    const Fp8Linear* lin = &fp8->linears[i];
    Fp8CastOutput w = fp8_model_w(fp8, i);
    fp8_cast_weight(&w, master != NULL ? master + lin->weight_offset : NULL,
                    master != NULL ? NULL : params + lin->weight_offset, lin->OC, lin->K, amax_known, stream);
}

// every FP8 weight as fp8_model_cast_weight casts it: once at the start, after loading a
// checkpoint, and after each optimizer step
void fp8_model_cast_weights(const Fp8Model* fp8, const float* master, const floatX* params, bool amax_known,
                            cudaStream_t stream) {
    for (int i = 0; i < fp8->num_linears; i++) { fp8_model_cast_weight(fp8, i, master, params, amax_known, stream); }
}

/*
What the optimizer call that updates FP8 linear i's weight from its element `first` on writes
for the weight's cast (zeroed: i is -1, W is not cast (no FP8 forward or dgrad), W is cast
after the update from the bf16 weights (fp8_model_weight_cast_in_update), or the block recipe,
whose cast finds every 128x128 block's amax itself): the new amax into the weight's record,
and under -fw delayed the codes from W's element `first` on, with the weight state's scale.
*/
static inline Fp8WeightUpdate fp8_model_weight_update(const Fp8Model* fp8, int i, size_t first) {
    Fp8WeightUpdate update = {};
    if (!fp8_model_casts_w(fp8, i) || !fp8_model_weight_cast_in_update(fp8, i) || fp8_model_block(fp8)) { return update; }
    Fp8CastOutput w = fp8_model_w(fp8, i);
    update.record = w.record;
    if (fp8_model_delayed_weights(fp8)) {
        update.codes = w.codes + first;
        update.state = w.state;
    }
    return update;
}

// W^T from the W codes of `layer`'s FP8 linears (the ones whose dgrad runs in FP8): ZeRO-1's
// gather, layer by layer as each arrives
void fp8_model_transpose_layer_weights(const Fp8Model* fp8, int layer, cudaStream_t stream) {
    for (int i = layer * fp8->per_layer; i < (layer + 1) * fp8->per_layer; i++) {
        const Fp8Linear* lin = &fp8->linears[i];
        if (lin->w_codes_t != NULL) { fp8_transpose_codes(lin->w_codes, lin->w_codes_t, lin->OC, lin->K, stream); }
    }
}

// W^T from the W codes of every weight the optimizer pass casts (all their passes are FP8):
// one launch per linear kind
void fp8_model_transpose_weights(const Fp8Model* fp8, cudaStream_t stream) {
    if (fp8_model_linears_cast_in_update(fp8) == 0) { return; }
    for (int rank = 0; rank < fp8->per_layer; rank++) {
        int layers;
        const Fp8CastJob* jobs = fp8_model_kind_jobs(fp8, rank, &layers);
        Fp8CastOutput first = fp8_model_w(fp8, rank);
        fp8_transpose_codes_batched(jobs, layers, &first, fp8->linears[rank].OC, fp8->linears[rank].K, stream);
    }
}

/*
-fw current: the casts of the weights the optimizer pass casts, after it, with the amaxes it
wrote (what fp8_model_cast_weight does for each with amax_known, the same bits): per tensor
their states updated in one launch, then one batched cast per linear kind.
*/
static void fp8_model_cast_weights_in_update(const Fp8Model* fp8, const float* master, const floatX* params,
                                             cudaStream_t stream) {
    int n = fp8->num_linears, in_update = fp8_model_linears_cast_in_update(fp8);
    if (in_update == 0) { return; }
    if (!fp8_model_block(fp8)) { fp8_scaling_update_records(&fp8->states[2 * n], &fp8->records[2 * n], in_update, stream); }
    for (int rank = 0; rank < fp8->per_layer; rank++) {
        const Fp8Linear* lin = &fp8->linears[rank];
        Fp8CastOutput first = fp8_model_w(fp8, rank);
        int layers;
        const Fp8CastJob* jobs = fp8_model_kind_jobs(fp8, rank, &layers);
        if (master != NULL) { fp8_cast_weights_batched(jobs, layers, &first, master, lin->OC, lin->K, stream); }
        else { fp8_cast_weights_batched(jobs, layers, &first, params, lin->OC, lin->K, stream); }
    }
}

// the FP8 weights the optimizer pass does not cast (lm_head; all of them when a block linear
// has a bf16 GEMM): from the bf16 weights, current-scaled, once they are updated (with several
// ranks: once they are gathered, zero_comm.cuh)
void fp8_model_cast_weights_from_bf16(const Fp8Model* fp8, const floatX* params, cudaStream_t stream) {
    for (int i = fp8_model_linears_cast_in_update(fp8); i < fp8->num_linears; i++) {
        fp8_model_cast_weight(fp8, i, NULL, params, false, stream);
    }
}

/*
After each optimizer step on one GPU (zero_comm_gather_weights with several): the FP8 weights
follow the update. Those the pass cast (the first in_update linears), -fw current: the casts,
from the amaxes the pass wrote; -fw delayed: the pass wrote W's codes with the states' scales,
which become the records' (what the GEMMs read), then the pass's amaxes update the states
(the next step's scales), as a delayed activation's cast does; W^T is the codes' transpose.
The rest: fp8_model_cast_weights_from_bf16.
*/
void fp8_model_weights_after_update(const Fp8Model* fp8, const float* master, const floatX* params, cudaStream_t stream) {
    int n = fp8->num_linears, in_update = fp8_model_linears_cast_in_update(fp8);
    if (fp8_model_delayed_weights(fp8)) {
        fp8_scaling_publish_scales(&fp8->states[2 * n], &fp8->records[2 * n], in_update, stream);
        fp8_scaling_update_records(&fp8->states[2 * n], &fp8->records[2 * n], in_update, stream);
        fp8_model_transpose_weights(fp8, stream);
    } else {
        fp8_model_cast_weights_in_update(fp8, master, params, stream);
    }
    fp8_model_cast_weights_from_bf16(fp8, params, stream);
}

/*
After a resume under -fw delayed on one GPU (zero_comm_restore_weight_codes with several):
the start cast before fp8_model_upload wrote every weight with current scaling, but the run's
codes of the weights the optimizer pass casts were written there with the previous step's
scale, which the restored records hold. Their W and W^T are rebuilt with it; nothing else
changes (not a use of the tensors; the others were current-scaled in the run too).
*/
void fp8_model_restore_weight_codes(const Fp8Model* fp8, const float* master, const floatX* params, cudaStream_t stream) {
    if (!fp8_model_delayed_weights(fp8)) { return; }
    int in_update = fp8_model_linears_cast_in_update(fp8);
    for (int i = 0; i < in_update; i++) {
        if (!fp8_model_casts_w(fp8, i)) { continue; }
        const Fp8Linear* lin = &fp8->linears[i];
        Fp8CastOutput w = fp8_model_w(fp8, i);
        size_t n = (size_t)lin->OC * lin->K;
        if (master != NULL) { fp8_weight_codes(lin->w_codes, master + lin->weight_offset, n, w.record, stream); }
        else { fp8_weight_codes(lin->w_codes, params + lin->weight_offset, n, w.record, stream); }
    }
    fp8_model_transpose_weights(fp8, stream);
}

// ----------------------------------------------------------------------------
// evaluation leaves the scaling untouched

void fp8_model_begin_eval(Fp8Model* fp8, cudaStream_t stream) {
    size_t n = (size_t)3 * fp8->num_linears;
    if (n == 0) { return; }
    cudaCheck(cudaMemcpyAsync(fp8->saved_states, fp8->states, n * sizeof(Fp8TensorScaling), cudaMemcpyDeviceToDevice, stream));
    cudaCheck(cudaMemcpyAsync(fp8->saved_records, fp8->records, n * sizeof(Fp8CastRecord), cudaMemcpyDeviceToDevice, stream));
    fp8->saved_x_seeded = fp8->x_seeded;
}

void fp8_model_end_eval(Fp8Model* fp8, cudaStream_t stream) {
    size_t n = (size_t)3 * fp8->num_linears;
    if (n == 0) { return; }
    cudaCheck(cudaMemcpyAsync(fp8->states, fp8->saved_states, n * sizeof(Fp8TensorScaling), cudaMemcpyDeviceToDevice, stream));
    cudaCheck(cudaMemcpyAsync(fp8->records, fp8->saved_records, n * sizeof(Fp8CastRecord), cudaMemcpyDeviceToDevice, stream));
    fp8->x_seeded = fp8->saved_x_seeded;
}

// ----------------------------------------------------------------------------
// a skipped training step leaves no trace in the scaling (fp8_scaling_restore says why): the
// states are put back, all but their non-finite counts; the records keep what the casts saw,
// for the numerics log

void fp8_model_begin_step(Fp8Model* fp8, cudaStream_t stream) {
    size_t n = (size_t)3 * fp8->num_linears;
    if (n == 0) { return; }
    cudaCheck(cudaMemcpyAsync(fp8->step_states, fp8->states, n * sizeof(Fp8TensorScaling), cudaMemcpyDeviceToDevice, stream));
    fp8->step_x_seeded = fp8->x_seeded;
    fp8->step_dy_seeded = fp8->dy_seeded;
}

void fp8_model_discard_step(Fp8Model* fp8, cudaStream_t stream) {
    int n = 3 * fp8->num_linears;
    if (n == 0) { return; }
    fp8_scaling_restore_states(fp8->states, fp8->step_states, n, stream);
    fp8->x_seeded = fp8->step_x_seeded;  // a skipped first step seeds nothing: the next one takes the seeding path
    fp8->dy_seeded = fp8->step_dy_seeded;
}

// ----------------------------------------------------------------------------
// state files: the settings, the states and the records (so the numerics log resumes too)

typedef struct {
    Fp8SavedSettings settings;
    Fp8TensorScaling* states;  // host copies
    Fp8CastRecord* records;
} Fp8HostState;

static Fp8SavedSettings fp8_model_saved_settings(const Fp8Model* fp8) {
    Fp8SavedSettings s;
    memset(&s, 0, sizeof(s));
    s.recipe = fp8->settings.recipe;
    for (int kind = 0; kind < NUM_LINEAR_KINDS; kind++) { s.passes[kind] = fp8->settings.passes[kind]; }
    s.history_len = fp8->settings.history_len;
    s.margin = fp8->settings.margin;
    s.num_linears = fp8->num_linears;
    return s;
}

// host buffers for the state file, and its sections (returns how many: 0 for a bf16 run)
int fp8_model_state_sections(const Fp8Model* fp8, Fp8HostState* host, StateSection sections[FP8_STATE_SECTIONS]) {
    size_t n = (size_t)3 * fp8->num_linears;
    memset(host, 0, sizeof(*host));
    if (n == 0) { return 0; }
    host->settings = fp8_model_saved_settings(fp8);
    host->states = (Fp8TensorScaling*)mallocCheck(n * sizeof(Fp8TensorScaling));
    host->records = (Fp8CastRecord*)mallocCheck(n * sizeof(Fp8CastRecord));
    StateSection list[FP8_STATE_SECTIONS] = {
        {"fp8_settings", &host->settings, sizeof(host->settings), 0},
        {"fp8_scaling", host->states, n * sizeof(Fp8TensorScaling), 0},
        {"fp8_records", host->records, n * sizeof(Fp8CastRecord), 0},
    };
    memcpy(sections, list, sizeof(list));
    return FP8_STATE_SECTIONS;
}

void fp8_host_state_free(Fp8HostState* host) {
    free(host->states);
    free(host->records);
    memset(host, 0, sizeof(*host));
}

// the device state into host (call fp8_model_state_sections first)
void fp8_model_download(const Fp8Model* fp8, Fp8HostState* host, cudaStream_t stream) {
    size_t n = (size_t)3 * fp8->num_linears;
    if (n == 0) { return; }
    cudaCheck(cudaMemcpyAsync(host->states, fp8->states, n * sizeof(Fp8TensorScaling), cudaMemcpyDeviceToHost, stream));
    cudaCheck(cudaMemcpyAsync(host->records, fp8->records, n * sizeof(Fp8CastRecord), cudaMemcpyDeviceToHost, stream));
    cudaCheck(cudaStreamSynchronize(stream));
}

// the -fw / -fg value a state's recipe stands for (fp8_recipe.h's names; "invalid": a corrupt file's)
static const char* fp8_model_scaling_flag_value(int32_t recipe) {
    return recipe == FP8_RECIPE_CURRENT ? "current" : recipe == FP8_RECIPE_DELAYED ? "delayed"
         : recipe == FP8_RECIPE_CURRENT_POW2 ? "pow2" : "invalid";
}

// a per-tensor scaling choice (-fw: the weights' states, -fg: the gradients'), as saved, against this run's
static void fp8_model_check_saved_scaling(const char* path, const char* flag, const Fp8TensorScaling* saved,
                                          Fp8Recipe want) {
    if (saved->recipe != (int32_t)want) {
        Fp8SettingsDifference difference = {"", ""};
        fp8_append_difference(&difference, flag, flag, fp8_model_scaling_flag_value(saved->recipe),
                              fp8_model_scaling_flag_value(want));
        fp8_refuse_resume(path, &difference);
    }
}

/*
A current-scaled weight's saved record holds the scale its last cast took from the weights,
which the start cast before fp8_model_upload (fp8_model_cast_weights; with several ranks
zero_comm_refresh_weights, with the same all-reduced amax) has just taken again from the
restored ones: a record that differs belongs to other weights (the state of another
checkpoint, or a corrupt record whose scale and inverse still agree), and would dequantize these
weights' codes with another scale. Delayed weights (-fw delayed) hold the previous step's scale,
which their codes are rebuilt with (fp8_model_restore_weight_codes); the block recipe's weights
keep theirs per block, beside the codes.
*/
static void fp8_model_check_weight_records(const Fp8Model* fp8, const Fp8HostState* host, const char* path,
                                           cudaStream_t stream) {
    int n = fp8->num_linears;
    if (fp8_model_block(fp8)) { return; }
    Fp8CastRecord* cast = (Fp8CastRecord*)mallocCheck((size_t)n * sizeof(Fp8CastRecord));
    cudaCheck(cudaMemcpyAsync(cast, &fp8->records[2 * n], (size_t)n * sizeof(Fp8CastRecord), cudaMemcpyDeviceToHost, stream));
    cudaCheck(cudaStreamSynchronize(stream));
    for (int i = 0; i < n; i++) {
        const Fp8CastRecord* saved = &host->records[2 * n + i];
        if (!fp8_model_casts_w(fp8, i) || fp8_model_weight_delayed(fp8, i) || saved->scale == cast[i].scale) { continue; }
        llm8_die("state file '%s': the FP8 weight of linear %d (%s) was cast with scale %g before the save, its restored "
                 "weights give %g: the state belongs to other weights (another checkpoint's?)", path, i,
                 LINEAR_KIND_NAMES[fp8->linears[i].kind], saved->scale, cast[i].scale);
    }
    free(cast);
}

/*
A state read from `path` back onto the device (refused, naming the flags, when it was
written with other FP8 settings; and, naming the tensor, when a state or record is one no run
writes, or a current-scaled weight's record does not match the restored weights). Call after
the start cast of the restored weights (fp8_model_cast_weights, or zero_comm_refresh_weights):
that cast rebuilt the weight codes (under -fw current the same bytes as before the save; under
-fw delayed fp8_model_restore_weight_codes comes next), gave the scales the weight records are
checked against, and counted as a use, which the saved states and records now overwrite.
*/
void fp8_model_upload(Fp8Model* fp8, const Fp8HostState* host, const char* path, cudaStream_t stream) {
    size_t n = (size_t)3 * fp8->num_linears;
    if (n == 0) { return; }
    Fp8SavedSettings want = fp8_model_saved_settings(fp8);
    const Fp8SavedSettings* got = &host->settings;
    if (memcmp(got, &want, sizeof(want)) != 0) {
        Fp8Settings saved = fp8->settings;  // -fw and -fg are in the states, checked below
        saved.recipe = got->recipe;
        for (int kind = 0; kind < NUM_LINEAR_KINDS; kind++) { saved.passes[kind] = got->passes[kind]; }
        saved.history_len = got->history_len;
        saved.margin = got->margin;
        Fp8SettingsDifference difference = fp8_settings_difference(&saved, &fp8->settings);
        if (difference.text[0] != '\0') {
            fp8_refuse_resume(path, &difference);
        }
        llm8_die("state file '%s' holds the FP8 state of %d linears, this run has %d with the same FP8 settings: "
                 "a corrupt file?", path, got->num_linears, want.num_linears);
    }
    if (fp8->settings.recipe != FP8_MODEL_BLOCK) {  // -fw and -fg are in the states: the recipe they were made with
        fp8_model_check_saved_scaling(path, "-fw", &host->states[2 * fp8->num_linears],
                                      fp8_model_delayed_weights(fp8) ? FP8_RECIPE_DELAYED : FP8_RECIPE_CURRENT);
        for (int i = 0; i < fp8->num_linears; i++) {
            Fp8Recipe want_dy = fp8_gradient_recipe(fp8->settings.grad_scaling, fp8->linears[i].kind);
            fp8_model_check_saved_scaling(path, "-fg", &host->states[fp8->num_linears + i], want_dy);
        }
    }
    Fp8TensorScaling* fresh = (Fp8TensorScaling*)mallocCheck(n * sizeof(Fp8TensorScaling));
    fp8_model_init_states(fp8, fresh);
    for (size_t i = 0; i < n; i++) {
        const char* what = "scaling state";
        const char* error = fp8_scaling_loaded_error(&host->states[i], &fresh[i]);
        if (error == NULL) { what = "cast record"; error = fp8_cast_record_loaded_error(&host->records[i]); }
        if (error != NULL) {
            size_t linear = i % (size_t)fp8->num_linears;
            llm8_die("state file '%s': the FP8 %s of %s of linear %zu (%s) is corrupt: %s", path, what,
                     FP8_MODEL_STATE_GROUPS[i / (size_t)fp8->num_linears], linear,
                     LINEAR_KIND_NAMES[fp8->linears[linear].kind], error);
        }
    }
    free(fresh);
    fp8_model_check_weight_records(fp8, host, path, stream);
    cudaCheck(cudaMemcpyAsync(fp8->states, host->states, n * sizeof(Fp8TensorScaling), cudaMemcpyHostToDevice, stream));
    cudaCheck(cudaMemcpyAsync(fp8->records, host->records, n * sizeof(Fp8CastRecord), cudaMemcpyHostToDevice, stream));
    cudaCheck(cudaStreamSynchronize(stream));  // host is the caller's to free
    fp8->x_seeded = 1;
    fp8->dy_seeded = 1;
    for (int i = 0; i < fp8->num_linears; i++) {  // a tensor that is never cast says nothing
        if (fp8_model_casts_x(fp8, i) && !fp8_scaling_seeded(&host->states[i])) { fp8->x_seeded = 0; }
        if (fp8_model_casts_dy(fp8, i) && !fp8_scaling_seeded(&host->states[fp8->num_linears + i])) { fp8->dy_seeded = 0; }
    }
}

// ----------------------------------------------------------------------------
// the numerics log: numerics.jsonl, one line per FP8 tensor every N steps

void fp8_model_open_numerics_log(Fp8Model* fp8, const char* dir, int resume) {
    if (fp8->num_linears == 0 || dir == NULL || fp8->settings.numerics_every == 0) { return; }
    char path[4096];
    path_in_dir(path, sizeof(path), dir, "numerics.jsonl");
    fp8->numerics_file = open_line_log(path, resume);
}

/*
At the end of step `step` (1-based, as the progress line counts), when it is a multiple of
the interval: per tensor the interval's largest amax, the smallest scale a cast used,
the fractions of elements saturated and flushed to zero (fp8_classify), and, per-tensor
recipes, how many amaxes were non-finite so far. Reads the GPU (one sync), on log steps only.
*/
void fp8_model_log_numerics(Fp8Model* fp8, int step, cudaStream_t stream) {
    if (fp8->numerics_file == NULL || step % fp8->settings.numerics_every != 0) { return; }
    int n = fp8->num_linears;
    Fp8CastStats* stats = (Fp8CastStats*)mallocCheck((size_t)3 * n * sizeof(Fp8CastStats));
    Fp8TensorScaling* states = (Fp8TensorScaling*)mallocCheck((size_t)3 * n * sizeof(Fp8TensorScaling));
    cudaCheck(cudaMemcpyAsync(states, fp8->states, (size_t)3 * n * sizeof(Fp8TensorScaling), cudaMemcpyDeviceToHost, stream));
    fp8_cast_records_read(stats, fp8->records, 3 * n, stream);  // synchronizes the stream
    const char* const* operands = FP8_MODEL_STATE_GROUPS;
    for (int t = 0; t < 3 * n; t++) {
        const Fp8Linear* lin = &fp8->linears[t % n];
        const Fp8CastStats* s = &stats[t];
        if (s->elements == 0) { continue; }  // not cast in this interval (e.g. no FP8 forward: no W codes)
        char name[64];
        if (lin->layer >= 0) { snprintf(name, sizeof(name), "L%d.%s.%s", lin->layer, LINEAR_KIND_NAMES[lin->kind], operands[t / n]); }
        else { snprintf(name, sizeof(name), "%s.%s", LINEAR_KIND_NAMES[lin->kind], operands[t / n]); }
        Fp8Format format = (t / n == 1 && !fp8_model_block(fp8)) ? FP8_E5M2 : FP8_E4M3;
        fprintf(fp8->numerics_file, "{\"step\":%d,\"tensor\":\"%s\",\"layer\":%d,\"linear\":\"%s\",\"operand\":\"%s\",\"format\":\"%s\"",
                step, name, lin->layer, LINEAR_KIND_NAMES[lin->kind], operands[t / n], fp8_format_name(format));
        json_number(fp8->numerics_file, "amax", s->amax);
        json_number(fp8->numerics_file, "scale", s->scale);
        json_number(fp8->numerics_file, "frac_saturated", fp8_cast_stats_fraction(s->saturated, s->elements));
        json_number(fp8->numerics_file, "frac_flushed", fp8_cast_stats_fraction(s->flushed, s->elements));
        fprintf(fp8->numerics_file, ",\"elements\":%llu", (unsigned long long)s->elements);
        if (!fp8_model_block(fp8)) { fprintf(fp8->numerics_file, ",\"nonfinite\":%d", states[t].nonfinite_count); }
        fprintf(fp8->numerics_file, "}\n");
    }
    fflushCheck(fp8->numerics_file);
    free(stats);
    free(states);
}

#endif // LLMC_FP8_MODEL_CUH
