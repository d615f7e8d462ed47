/*
gpt2_ref.h: the fp32 CPU reference of GPT-2: one function per op, and a whole model
(forward, backward, zero-grad, global norm, AdamW) built from them.

Why: it is the oracle. The GPU kernel tests (test/test_*.cu) compare each kernel with the
op of the same name here, the PyTorch fixture test checks this file against an independent
implementation, and `make train_gpt2cpu` trains a tiny model with it on a machine without a
GPU. So it is written to be obviously right rather than fast:
- plain loops over the llm.c layouts (activations [B][T][C], weights [OC][C]), header-only
  static functions in C that also compiles as C++ and under nvcc;
- fp32 storage; every dot product and row statistic (matmul outputs, attention scores,
  layernorm mean/variance, softmax normalizers, the global norm) accumulates in double, so
  the reference's own rounding stays far below the tolerances of the GPU comparisons.
  Scatter-style sums (weight gradients, dq/dk/dv) accumulate in place in fp32;
- every backward ADDS into its gradient outputs (dinp included): the caller zeroes them.
  That keeps the ops composable (a residual stream's gradient is a sum) and makes
  gradient accumulation across micro-steps free;
- attention never materializes the B*NH*T*T score matrix: the forward saves the
  log-sum-exp of each query row and the backward recomputes probabilities row by row
  (the flash-attention identity D = dout . out), so T=1024 comparisons fit in memory;
- the element math (GELU, the AdamW update) comes from llmc/element_math.h, the very code
  the kernels run.
Matmuls parallelize with OpenMP when built with -fopenmp (each thread owns whole output
rows, so results do not depend on the thread count); without it the pragmas vanish.
*/
#ifndef TEST_GPT2_REF_H
#define TEST_GPT2_REF_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include "llmc/utils.h"
#include "llmc/element_math.h"
#include "llmc/gpt2_config.h"

#ifdef _OPENMP
#define REF_PARALLEL_FOR _Pragma("omp parallel for")
#else
#define REF_PARALLEL_FOR
#endif

#define REF_LAYERNORM_EPS 1e-5

// ----------------------------------------------------------------------------
// ops

// out[b][t][:] = wte[inp[b][t]][:] + wpe[t][:]
static inline void ref_encoder_forward(float* out, const int* inp, const float* wte, const float* wpe, int B, int T, int C) {
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            float* out_bt = out + ((size_t)b * T + t) * C;
            const float* wte_row = wte + (size_t)inp[b * T + t] * C;
            const float* wpe_row = wpe + (size_t)t * C;
            for (int c = 0; c < C; c++) { out_bt[c] = wte_row[c] + wpe_row[c]; }
        }
    }
}

// dwte, dwpe += (scatter of dout)
static inline void ref_encoder_backward(float* dwte, float* dwpe, const float* dout, const int* inp, int B, int T, int C) {
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            const float* dout_bt = dout + ((size_t)b * T + t) * C;
            float* dwte_row = dwte + (size_t)inp[b * T + t] * C;
            float* dwpe_row = dwpe + (size_t)t * C;
            for (int c = 0; c < C; c++) {
                dwte_row[c] += dout_bt[c];
                dwpe_row[c] += dout_bt[c];
            }
        }
    }
}

// out = (inp - mean) * rstd * weight + bias over each row of C; mean[N], rstd[N] saved for
// the backward; rstd = 1/sqrt(var + 1e-5), var the biased variance
static inline void ref_layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                                  const float* weight, const float* bias, int N, int C) {
    for (int i = 0; i < N; i++) {
        const float* x = inp + (size_t)i * C;
        double sum = 0.0;
        for (int c = 0; c < C; c++) { sum += x[c]; }
        double m = sum / C;
        double var_sum = 0.0;
        for (int c = 0; c < C; c++) { double d = x[c] - m; var_sum += d * d; }
        double s = 1.0 / sqrt(var_sum / C + REF_LAYERNORM_EPS);
        float* y = out + (size_t)i * C;
        for (int c = 0; c < C; c++) { y[c] = (float)((x[c] - m) * s) * weight[c] + bias[c]; }
        mean[i] = (float)m;
        rstd[i] = (float)s;
    }
}

// dinp, dweight, dbias += (gradients of the layernorm above)
static inline void ref_layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                                   const float* weight, const float* mean, const float* rstd, int N, int C) {
    for (int i = 0; i < N; i++) {
        const float* x = inp + (size_t)i * C;
        const float* dy = dout + (size_t)i * C;
        float* dx = dinp + (size_t)i * C;
        double m = mean[i], s = rstd[i];
        // with xhat = (x - mean) * rstd and dxhat = dout * weight:
        // dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat))
        double dxhat_sum = 0.0, dxhat_xhat_sum = 0.0;
        for (int c = 0; c < C; c++) {
            double xhat = (x[c] - m) * s;
            double dxhat = (double)dy[c] * weight[c];
            dxhat_sum += dxhat;
            dxhat_xhat_sum += dxhat * xhat;
        }
        double dxhat_mean = dxhat_sum / C, dxhat_xhat_mean = dxhat_xhat_sum / C;
        for (int c = 0; c < C; c++) {
            double xhat = (x[c] - m) * s;
            double dxhat = (double)dy[c] * weight[c];
            dx[c] += (float)(s * (dxhat - dxhat_mean - xhat * dxhat_xhat_mean));
            dweight[c] += (float)(dy[c] * xhat);
            dbias[c] += dy[c];
        }
    }
}

// out[N][OC] = inp[N][C] . weight[OC][C]^T + bias[OC] (bias may be NULL)
static inline void ref_matmul_forward(float* out, const float* inp, const float* weight, const float* bias,
                               int N, int C, int OC) {
    REF_PARALLEL_FOR
    for (int n = 0; n < N; n++) {
        const float* x = inp + (size_t)n * C;
        for (int o = 0; o < OC; o++) {
            const float* w = weight + (size_t)o * C;
            double acc = bias != NULL ? bias[o] : 0.0;
            for (int c = 0; c < C; c++) { acc += (double)x[c] * w[c]; }
            out[(size_t)n * OC + o] = (float)acc;
        }
    }
}

// dinp[N][C] += dout . weight; dweight[OC][C] += dout^T . inp; dbias[OC] += column sums of
// dout (dbias may be NULL for a matmul without bias). Unlike the GPU matmul, whose dinp is
// overwritten, every output here is added to.
static inline void ref_matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                                const float* weight, int N, int C, int OC) {
    REF_PARALLEL_FOR
    for (int n = 0; n < N; n++) {
        float* dx = dinp + (size_t)n * C;
        for (int o = 0; o < OC; o++) {
            float d = dout[(size_t)n * OC + o];
            const float* w = weight + (size_t)o * C;
            for (int c = 0; c < C; c++) { dx[c] += d * w[c]; }
        }
    }
    REF_PARALLEL_FOR
    for (int o = 0; o < OC; o++) {
        float* dw = dweight + (size_t)o * C;
        double bias_sum = 0.0;
        for (int n = 0; n < N; n++) {
            float d = dout[(size_t)n * OC + o];
            const float* x = inp + (size_t)n * C;
            for (int c = 0; c < C; c++) { dw[c] += d * x[c]; }
            bias_sum += d;
        }
        if (dbias != NULL) { dbias[o] += (float)bias_sum; }
    }
}

// dot product of two fp32 vectors, accumulated in double
static inline double ref_dot(const float* a, const float* b, int n) {
    double acc = 0.0;
    for (int i = 0; i < n; i++) { acc += (double)a[i] * b[i]; }
    return acc;
}

/*
Causal multi-head self-attention. qkv is [B][T][3C]: q, then k, then v, each [NH][HS] with
HS = C/NH. out is [B][T][C] ([NH][HS] per position). Scores are scaled by 1/sqrt(HS).
lse[B][NH][T] receives log(sum_{s<=t} exp(score(t,s))), all the backward needs to rebuild
the probabilities.
*/
static inline void ref_attention_forward(float* out, float* lse, const float* qkv, int B, int T, int C, int NH) {
    int HS = C / NH;
    size_t C3 = (size_t)3 * C;
    double scale = 1.0 / sqrt((double)HS);
    double* scores = (double*)mallocCheck((size_t)T * sizeof(double));
    double* acc = (double*)mallocCheck((size_t)HS * sizeof(double));
    for (int b = 0; b < B; b++) {
        const float* qkv_b = qkv + (size_t)b * T * C3;
        for (int h = 0; h < NH; h++) {
            for (int t = 0; t < T; t++) {
                const float* q = qkv_b + t * C3 + (size_t)h * HS;
                double max_score = -INFINITY;
                for (int s = 0; s <= t; s++) {
                    scores[s] = scale * ref_dot(q, qkv_b + s * C3 + C + (size_t)h * HS, HS);
                    if (scores[s] > max_score) { max_score = scores[s]; }
                }
                double sum = 0.0;
                for (int s = 0; s <= t; s++) { scores[s] = exp(scores[s] - max_score); sum += scores[s]; }
                for (int i = 0; i < HS; i++) { acc[i] = 0.0; }
                for (int s = 0; s <= t; s++) {
                    const float* v = qkv_b + s * C3 + 2 * C + (size_t)h * HS;
                    for (int i = 0; i < HS; i++) { acc[i] += scores[s] * v[i]; }
                }
                float* out_t = out + ((size_t)b * T + t) * C + (size_t)h * HS;
                for (int i = 0; i < HS; i++) { out_t[i] = (float)(acc[i] / sum); }
                lse[((size_t)b * NH + h) * T + t] = (float)(max_score + log(sum));
            }
        }
    }
    free(scores);
    free(acc);
}

// dqkv += gradient of the attention above; out and lse are what the forward wrote
static inline void ref_attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                                   const float* lse, int B, int T, int C, int NH) {
    int HS = C / NH;
    size_t C3 = (size_t)3 * C;
    double scale = 1.0 / sqrt((double)HS);
    for (int b = 0; b < B; b++) {
        const float* qkv_b = qkv + (size_t)b * T * C3;
        float* dqkv_b = dqkv + (size_t)b * T * C3;
        for (int h = 0; h < NH; h++) {
            for (int t = 0; t < T; t++) {
                size_t head = (size_t)h * HS;
                const float* q = qkv_b + t * C3 + head;
                float* dq = dqkv_b + t * C3 + head;
                const float* dout_t = dout + ((size_t)b * T + t) * C + head;
                const float* out_t = out + ((size_t)b * T + t) * C + head;
                // softmax backward: dscore_s = p_s * (dp_s - sum_s' p_s' dp_s'), and that sum is dout . out
                double dout_dot_out = ref_dot(dout_t, out_t, HS);
                double row_lse = lse[((size_t)b * NH + h) * T + t];
                for (int s = 0; s <= t; s++) {
                    const float* k = qkv_b + s * C3 + C + head;
                    const float* v = qkv_b + s * C3 + 2 * C + head;
                    float* dk = dqkv_b + s * C3 + C + head;
                    float* dv = dqkv_b + s * C3 + 2 * C + head;
                    double p = exp(scale * ref_dot(q, k, HS) - row_lse);
                    double dp = ref_dot(dout_t, v, HS);
                    double dscore = scale * p * (dp - dout_dot_out);
                    for (int i = 0; i < HS; i++) {
                        dv[i] += (float)(p * dout_t[i]);
                        dq[i] += (float)(dscore * k[i]);
                        dk[i] += (float)(dscore * q[i]);
                    }
                }
            }
        }
    }
}

static inline void ref_gelu_forward(float* out, const float* inp, int N) {
    for (int i = 0; i < N; i++) { out[i] = gelu_forward_element(inp[i]); }
}

// dinp += gelu'(inp) * dout
static inline void ref_gelu_backward(float* dinp, const float* inp, const float* dout, int N) {
    for (int i = 0; i < N; i++) { dinp[i] += gelu_backward_element(inp[i]) * dout[i]; }
}

static inline void ref_residual_forward(float* out, const float* a, const float* b, int N) {
    for (int i = 0; i < N; i++) { out[i] = a[i] + b[i]; }
}

// da += dout, db += dout
static inline void ref_residual_backward(float* da, float* db, const float* dout, int N) {
    for (int i = 0; i < N; i++) { da[i] += dout[i]; db[i] += dout[i]; }
}

/*
Softmax cross-entropy over the first V columns of each Vp-wide logits row (the padded
columns V..Vp-1 are ignored). losses[i] = -log p[targets[i]]. If dlogits is not NULL it is
OVERWRITTEN with (p - onehot(target)) * dloss, and 0 in the padded columns.
*/
static inline void ref_crossentropy_forward_backward(float* losses, float* dlogits, const float* logits, const int* targets,
                                              int N, int V, int Vp, float dloss) {
    for (int i = 0; i < N; i++) {
        const float* row = logits + (size_t)i * Vp;
        double max_logit = -INFINITY;
        for (int j = 0; j < V; j++) { if (row[j] > max_logit) { max_logit = row[j]; } }
        double sum = 0.0;
        for (int j = 0; j < V; j++) { sum += exp(row[j] - max_logit); }
        double row_lse = max_logit + log(sum);
        losses[i] = (float)(row_lse - row[targets[i]]);
        if (dlogits != NULL) {
            float* drow = dlogits + (size_t)i * Vp;
            for (int j = 0; j < V; j++) {
                double p = exp(row[j] - row_lse);
                drow[j] = (float)((p - (j == targets[i] ? 1.0 : 0.0)) * dloss);
            }
            for (int j = V; j < Vp; j++) { drow[j] = 0.0f; }
        }
    }
}

// ----------------------------------------------------------------------------
// the whole model

// activations of one forward pass; per-layer tensors are [L][...]
#define GPT2REF_NUM_ACTS 21
typedef struct {
    float* encoded;    // [B][T][C]
    float* ln1;        // [L][B][T][C]
    float* ln1_mean;   // [L][B][T]
    float* ln1_rstd;   // [L][B][T]
    float* qkv;        // [L][B][T][3C]
    float* atty;       // [L][B][T][C]
    float* att_lse;    // [L][B][NH][T]
    float* attproj;    // [L][B][T][C]
    float* residual2;  // [L][B][T][C]
    float* ln2;        // [L][B][T][C]
    float* ln2_mean;   // [L][B][T]
    float* ln2_rstd;   // [L][B][T]
    float* fch;        // [L][B][T][4C]
    float* fch_gelu;   // [L][B][T][4C]
    float* fcproj;     // [L][B][T][C]
    float* residual3;  // [L][B][T][C]
    float* lnf;        // [B][T][C]
    float* lnf_mean;   // [B][T]
    float* lnf_rstd;   // [B][T]
    float* logits;     // [B][T][Vp]
    float* losses;     // [B][T]
} GPT2RefActs;

// gradient scratch of the backward pass, reused by every layer
#define GPT2REF_NUM_GRAD_ACTS 7
typedef struct {
    float* residual;   // [B][T][C] gradient of the residual stream, walked from the top down
    float* ln;         // [B][T][C] gradient of a layernorm output (ln1, ln2 or lnf)
    float* qkv;        // [B][T][3C]
    float* atty;       // [B][T][C]
    float* fch;        // [B][T][4C]
    float* fch_gelu;   // [B][T][4C]
    float* logits;     // [B][T][Vp]
} GPT2RefGradActs;

typedef struct {
    GPT2Config config;
    size_t param_sizes[NUM_PARAMETER_TENSORS];
    size_t num_parameters;
    float* params;                               // all parameters, llm.c order, contiguous
    float* param_tensors[NUM_PARAMETER_TENSORS]; // pointers into params, indexed by PARAM_*
    float* grads;                                // same layout as params
    float* grad_tensors[NUM_PARAMETER_TENSORS];
    float* adam_m;                               // AdamW first moment, same layout
    float* adam_v;                               // AdamW second moment
    // activations: allocated by the first forward for its (B, T); later calls need B*T and T within them
    int capacity_B;
    int capacity_T;
    float* acts_memory;
    GPT2RefActs acts;
    float* grad_acts_memory;
    GPT2RefGradActs grad_acts;
    int* inputs;   // [B][T] of the last forward
    int* targets;  // [B][T] of the last forward (valid when has_targets)
    int B;         // shape of the last forward
    int T;
    int has_targets;
    float mean_loss; // of the last forward, -1 when it had no targets
} GPT2Ref;

static inline void gpt2ref_act_sizes(size_t sizes[GPT2REF_NUM_ACTS], const GPT2Config* cfg, int B, int T) {
    size_t L = cfg->num_layers, C = cfg->channels, NH = cfg->num_heads, Vp = cfg->padded_vocab_size;
    size_t BT = (size_t)B * T;
    size_t per_size[GPT2REF_NUM_ACTS] = {
        BT * C, L * BT * C, L * BT, L * BT, L * BT * 3 * C, L * BT * C, L * NH * BT, L * BT * C, L * BT * C,
        L * BT * C, L * BT, L * BT, L * BT * 4 * C, L * BT * 4 * C, L * BT * C, L * BT * C,
        BT * C, BT, BT, BT * Vp, BT
    };
    memcpy(sizes, per_size, sizeof(per_size));
}

static inline void gpt2ref_grad_act_sizes(size_t sizes[GPT2REF_NUM_GRAD_ACTS], const GPT2Config* cfg, int B, int T) {
    size_t C = cfg->channels, Vp = cfg->padded_vocab_size, BT = (size_t)B * T;
    size_t per_size[GPT2REF_NUM_GRAD_ACTS] = { BT * C, BT * C, BT * 3 * C, BT * C, BT * 4 * C, BT * 4 * C, BT * Vp };
    memcpy(sizes, per_size, sizeof(per_size));
}

// one calloc for `count` tensors, pointers carved out in order into *ptrs[i]
static inline float* gpt2ref_carve(float** ptrs[], const size_t sizes[], int count) {
    size_t total = 0;
    for (int i = 0; i < count; i++) { total += sizes[i]; }
    float* memory = (float*)mallocCheck(total * sizeof(float));
    memset(memory, 0, total * sizeof(float));
    size_t offset = 0;
    for (int i = 0; i < count; i++) { *ptrs[i] = memory + offset; offset += sizes[i]; }
    return memory;
}

static inline void gpt2ref_point_tensors(float* tensors[NUM_PARAMETER_TENSORS], float* memory, const size_t sizes[]) {
    size_t offset = 0;
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) { tensors[i] = memory + offset; offset += sizes[i]; }
}

// copies `params` (gpt2_num_parameters(cfg) floats, llm.c order); grads and AdamW state start at zero
static inline void gpt2ref_init(GPT2Ref* model, const GPT2Config* cfg, const float* params) {
    gpt2_config_validate(cfg, "gpt2ref_init");
    memset(model, 0, sizeof(*model));
    model->config = *cfg;
    gpt2_param_sizes(cfg, model->param_sizes);
    model->num_parameters = gpt2_num_parameters(cfg);
    size_t bytes = model->num_parameters * sizeof(float);
    model->params = (float*)mallocCheck(bytes);
    memcpy(model->params, params, bytes);
    model->grads = (float*)mallocCheck(bytes);
    model->adam_m = (float*)mallocCheck(bytes);
    model->adam_v = (float*)mallocCheck(bytes);
    memset(model->grads, 0, bytes);
    memset(model->adam_m, 0, bytes);
    memset(model->adam_v, 0, bytes);
    gpt2ref_point_tensors(model->param_tensors, model->params, model->param_sizes);
    gpt2ref_point_tensors(model->grad_tensors, model->grads, model->param_sizes);
    model->mean_loss = -1.0f;
}

static inline void gpt2ref_allocate_activations(GPT2Ref* model, int B, int T) {
    size_t act_sizes[GPT2REF_NUM_ACTS];
    gpt2ref_act_sizes(act_sizes, &model->config, B, T);
    GPT2RefActs* a = &model->acts;
    float** act_ptrs[GPT2REF_NUM_ACTS] = {
        &a->encoded, &a->ln1, &a->ln1_mean, &a->ln1_rstd, &a->qkv, &a->atty, &a->att_lse, &a->attproj,
        &a->residual2, &a->ln2, &a->ln2_mean, &a->ln2_rstd, &a->fch, &a->fch_gelu, &a->fcproj, &a->residual3,
        &a->lnf, &a->lnf_mean, &a->lnf_rstd, &a->logits, &a->losses
    };
    model->acts_memory = gpt2ref_carve(act_ptrs, act_sizes, GPT2REF_NUM_ACTS);
    size_t grad_sizes[GPT2REF_NUM_GRAD_ACTS];
    gpt2ref_grad_act_sizes(grad_sizes, &model->config, B, T);
    GPT2RefGradActs* g = &model->grad_acts;
    float** grad_ptrs[GPT2REF_NUM_GRAD_ACTS] = { &g->residual, &g->ln, &g->qkv, &g->atty, &g->fch, &g->fch_gelu, &g->logits };
    model->grad_acts_memory = gpt2ref_carve(grad_ptrs, grad_sizes, GPT2REF_NUM_GRAD_ACTS);
    model->inputs = (int*)mallocCheck((size_t)B * T * sizeof(int));
    model->targets = (int*)mallocCheck((size_t)B * T * sizeof(int));
    model->capacity_B = B;
    model->capacity_T = T;
}

static inline void gpt2ref_check_tokens(const int* tokens, int n, int V, const char* what) {
    for (int i = 0; i < n; i++) {
        if (tokens[i] < 0 || tokens[i] >= V) {
            llm8_die("gpt2ref_forward: %s token %d at position %d is out of range (expected 0..%d)", what, tokens[i], i, V - 1);
        }
    }
}

/*
Forward pass on inputs[B][T]. With targets (same shape) it computes the per-position losses
and returns their mean; with targets NULL it computes only the logits and returns -1.
The logits ([B][T][Vp], padded columns included) stay in model->acts.logits.
*/
static inline float gpt2ref_forward(GPT2Ref* model, const int* inputs, const int* targets, int B, int T) {
    const GPT2Config* cfg = &model->config;
    int L = cfg->num_layers, NH = cfg->num_heads, C = cfg->channels, V = cfg->vocab_size, Vp = cfg->padded_vocab_size;
    if (B <= 0 || T <= 0 || T > cfg->max_seq_len) {
        llm8_die("gpt2ref_forward: B=%d T=%d is invalid (expected B >= 1 and 1 <= T <= maxT=%d)", B, T, cfg->max_seq_len);
    }
    if (model->acts_memory == NULL) { gpt2ref_allocate_activations(model, B, T); }
    if (T > model->capacity_T || (size_t)B * T > (size_t)model->capacity_B * model->capacity_T) {
        llm8_die("gpt2ref_forward: B=%d T=%d exceeds the activations allocated by the first forward (B=%d T=%d); "
                 "use a new GPT2Ref for a larger shape", B, T, model->capacity_B, model->capacity_T);
    }
    int BT = B * T;
    gpt2ref_check_tokens(inputs, BT, V, "input");
    memcpy(model->inputs, inputs, (size_t)BT * sizeof(int));
    if (targets != NULL) {
        gpt2ref_check_tokens(targets, BT, V, "target");
        memcpy(model->targets, targets, (size_t)BT * sizeof(int));
    }
    model->B = B;
    model->T = T;
    model->has_targets = targets != NULL;

    float* const* p = model->param_tensors;
    GPT2RefActs* a = &model->acts;
    size_t btc = (size_t)BT * C;
    ref_encoder_forward(a->encoded, inputs, p[PARAM_WTE], p[PARAM_WPE], B, T, C);
    const float* residual = a->encoded;
    for (int l = 0; l < L; l++) {
        float* ln1 = a->ln1 + l * btc;
        float* ln1_mean = a->ln1_mean + (size_t)l * BT;
        float* ln1_rstd = a->ln1_rstd + (size_t)l * BT;
        float* qkv = a->qkv + l * 3 * btc;
        float* atty = a->atty + l * btc;
        float* att_lse = a->att_lse + (size_t)l * NH * BT;
        float* attproj = a->attproj + l * btc;
        float* residual2 = a->residual2 + l * btc;
        float* ln2 = a->ln2 + l * btc;
        float* ln2_mean = a->ln2_mean + (size_t)l * BT;
        float* ln2_rstd = a->ln2_rstd + (size_t)l * BT;
        float* fch = a->fch + l * 4 * btc;
        float* fch_gelu = a->fch_gelu + l * 4 * btc;
        float* fcproj = a->fcproj + l * btc;
        float* residual3 = a->residual3 + l * btc;
        size_t lc = (size_t)l * C;

        ref_layernorm_forward(ln1, ln1_mean, ln1_rstd, residual, p[PARAM_LN1W] + lc, p[PARAM_LN1B] + lc, BT, C);
        ref_matmul_forward(qkv, ln1, p[PARAM_QKVW] + lc * 3 * C, p[PARAM_QKVB] + lc * 3, BT, C, 3 * C);
        ref_attention_forward(atty, att_lse, qkv, B, T, C, NH);
        ref_matmul_forward(attproj, atty, p[PARAM_ATTPROJW] + lc * C, p[PARAM_ATTPROJB] + lc, BT, C, C);
        ref_residual_forward(residual2, residual, attproj, BT * C);
        ref_layernorm_forward(ln2, ln2_mean, ln2_rstd, residual2, p[PARAM_LN2W] + lc, p[PARAM_LN2B] + lc, BT, C);
        ref_matmul_forward(fch, ln2, p[PARAM_FCW] + lc * 4 * C, p[PARAM_FCB] + lc * 4, BT, C, 4 * C);
        ref_gelu_forward(fch_gelu, fch, BT * 4 * C);
        ref_matmul_forward(fcproj, fch_gelu, p[PARAM_FCPROJW] + lc * 4 * C, p[PARAM_FCPROJB] + lc, BT, 4 * C, C);
        ref_residual_forward(residual3, residual2, fcproj, BT * C);
        residual = residual3;
    }
    ref_layernorm_forward(a->lnf, a->lnf_mean, a->lnf_rstd, residual, p[PARAM_LNFW], p[PARAM_LNFB], BT, C);
    ref_matmul_forward(a->logits, a->lnf, p[PARAM_WTE], NULL, BT, C, Vp);
    if (targets == NULL) {
        model->mean_loss = -1.0f;
        return model->mean_loss;
    }
    ref_crossentropy_forward_backward(a->losses, NULL, a->logits, targets, BT, V, Vp, 0.0f);
    double loss_sum = 0.0;
    for (int i = 0; i < BT; i++) { loss_sum += a->losses[i]; }
    model->mean_loss = (float)(loss_sum / BT);
    return model->mean_loss;
}

static inline void gpt2ref_zero_grad(GPT2Ref* model) {
    memset(model->grads, 0, model->num_parameters * sizeof(float));
}

/*
Backward of the last forward (which must have had targets). ADDS to model->grads the
gradient of mean_loss / grad_accum_steps. Gradient accumulation: zero_grad, then K
micro-steps of forward + backward(model, K) leave in grads exactly the gradient of the mean
loss over all K micro-batches, as one forward + backward(model, 1) on the concatenated
batch would. Use grad_accum_steps = 1 without accumulation.
*/
static inline void gpt2ref_backward(GPT2Ref* model, int grad_accum_steps) {
    if (model->acts_memory == NULL || !model->has_targets) {
        llm8_die("gpt2ref_backward: the last gpt2ref_forward had no targets (call it with targets first)");
    }
    if (grad_accum_steps < 1) {
        llm8_die("gpt2ref_backward: grad_accum_steps=%d is invalid (expected >= 1)", grad_accum_steps);
    }
    const GPT2Config* cfg = &model->config;
    int B = model->B, T = model->T, BT = B * T;
    int L = cfg->num_layers, NH = cfg->num_heads, C = cfg->channels, V = cfg->vocab_size, Vp = cfg->padded_vocab_size;
    float* const* p = model->param_tensors;
    float* const* g = model->grad_tensors;
    GPT2RefActs* a = &model->acts;
    GPT2RefGradActs* d = &model->grad_acts;
    size_t btc = (size_t)BT * C;

    float dloss = 1.0f / ((float)BT * grad_accum_steps);
    ref_crossentropy_forward_backward(a->losses, d->logits, a->logits, model->targets, BT, V, Vp, dloss);
    memset(d->ln, 0, btc * sizeof(float));
    ref_matmul_backward(d->ln, g[PARAM_WTE], NULL, d->logits, a->lnf, p[PARAM_WTE], BT, C, Vp);
    const float* top_residual = a->residual3 + (L - 1) * btc;
    memset(d->residual, 0, btc * sizeof(float));
    ref_layernorm_backward(d->residual, g[PARAM_LNFW], g[PARAM_LNFB], d->ln, top_residual, p[PARAM_LNFW],
                           a->lnf_mean, a->lnf_rstd, BT, C);
    // d->residual holds the gradient of the residual stream above the current layer; the
    // residual adds pass it unchanged to both of their inputs, so it is updated in place
    for (int l = L - 1; l >= 0; l--) {
        const float* residual = l == 0 ? a->encoded : a->residual3 + (l - 1) * btc;
        size_t lc = (size_t)l * C;
        memset(d->fch_gelu, 0, 4 * btc * sizeof(float));
        ref_matmul_backward(d->fch_gelu, g[PARAM_FCPROJW] + lc * 4 * C, g[PARAM_FCPROJB] + lc, d->residual,
                            a->fch_gelu + l * 4 * btc, p[PARAM_FCPROJW] + lc * 4 * C, BT, 4 * C, C);
        memset(d->fch, 0, 4 * btc * sizeof(float));
        ref_gelu_backward(d->fch, a->fch + l * 4 * btc, d->fch_gelu, BT * 4 * C);
        memset(d->ln, 0, btc * sizeof(float));
        ref_matmul_backward(d->ln, g[PARAM_FCW] + lc * 4 * C, g[PARAM_FCB] + lc * 4, d->fch,
                            a->ln2 + l * btc, p[PARAM_FCW] + lc * 4 * C, BT, C, 4 * C);
        ref_layernorm_backward(d->residual, g[PARAM_LN2W] + lc, g[PARAM_LN2B] + lc, d->ln, a->residual2 + l * btc,
                               p[PARAM_LN2W] + lc, a->ln2_mean + (size_t)l * BT, a->ln2_rstd + (size_t)l * BT, BT, C);
        memset(d->atty, 0, btc * sizeof(float));
        ref_matmul_backward(d->atty, g[PARAM_ATTPROJW] + lc * C, g[PARAM_ATTPROJB] + lc, d->residual,
                            a->atty + l * btc, p[PARAM_ATTPROJW] + lc * C, BT, C, C);
        memset(d->qkv, 0, 3 * btc * sizeof(float));
        ref_attention_backward(d->qkv, d->atty, a->qkv + l * 3 * btc, a->atty + l * btc,
                               a->att_lse + (size_t)l * NH * BT, B, T, C, NH);
        memset(d->ln, 0, btc * sizeof(float));
        ref_matmul_backward(d->ln, g[PARAM_QKVW] + lc * 3 * C, g[PARAM_QKVB] + lc * 3, d->qkv,
                            a->ln1 + l * btc, p[PARAM_QKVW] + lc * 3 * C, BT, C, 3 * C);
        ref_layernorm_backward(d->residual, g[PARAM_LN1W] + lc, g[PARAM_LN1B] + lc, d->ln, residual,
                               p[PARAM_LN1W] + lc, a->ln1_mean + (size_t)l * BT, a->ln1_rstd + (size_t)l * BT, BT, C);
    }
    ref_encoder_backward(g[PARAM_WTE], g[PARAM_WPE], d->residual, model->inputs, B, T, C);
}

// sqrt of the sum of squares of all gradients, accumulated in double
static inline float gpt2ref_global_norm(GPT2Ref* model) {
    double sum = 0.0;
    for (size_t i = 0; i < model->num_parameters; i++) { sum += (double)model->grads[i] * model->grads[i]; }
    return (float)sqrt(sum);
}

/*
One AdamW step (t counts from 1) with llm.c's clipping: the gradients are multiplied by
grad_clip / norm when the global norm exceeds grad_clip (grad_clip <= 0 disables clipping).
Weight decay applies only to the tensors gpt2_param_is_decayed marks. Each element goes
through adamw_element_update, the code the GPU optimizer runs. Returns the global norm
before clipping; when it is not finite the parameters and moments are left untouched.
*/
static inline float gpt2ref_adamw_update(GPT2Ref* model, float learning_rate, float beta1, float beta2, float eps,
                                  float weight_decay, int t, float grad_clip) {
    if (t < 1) { llm8_die("gpt2ref_adamw_update: step t=%d is invalid (expected >= 1)", t); }
    float norm = gpt2ref_global_norm(model);
    if (!isfinite(norm)) { return norm; }
    float grad_scale = (grad_clip > 0.0f && norm > grad_clip) ? grad_clip / norm : 1.0f;
    size_t offset = 0;
    for (int tensor = 0; tensor < NUM_PARAMETER_TENSORS; tensor++) {
        AdamWElementParams hp = adamw_element_params(learning_rate, beta1, beta2, eps,
                                                     gpt2_param_is_decayed(tensor) ? weight_decay : 0.0f, t);
        for (size_t i = offset; i < offset + model->param_sizes[tensor]; i++) {
            model->params[i] = adamw_element_update(model->params[i], model->grads[i] * grad_scale,
                                                    &model->adam_m[i], &model->adam_v[i], hp);
        }
        offset += model->param_sizes[tensor];
    }
    return norm;
}

static inline void gpt2ref_free(GPT2Ref* model) {
    free(model->params);
    free(model->grads);
    free(model->adam_m);
    free(model->adam_v);
    free(model->acts_memory);
    free(model->grad_acts_memory);
    free(model->inputs);
    free(model->targets);
    memset(model, 0, sizeof(*model));
}

#endif // TEST_GPT2_REF_H
