/*
test_gradcheck.c: finite-difference checks of every backward in test/gpt2_ref.h, op by op
and for the whole tiny model, plus gradient accumulation and the reference's bad-input
errors.

How the checks stay reliable in fp32: each op is reduced to a scalar
loss = sum_i out_i * r_i with fixed random r (so every output element matters), summed in
double; the numerical derivative is the central difference (loss(x+h) - loss(x-h)) / 2h.
Its rounding error is about (fp32 noise of the loss) / h and its truncation error O(h^2):
h = 1/128 (a power of two, so x +- h is exact for most x) balances the two. Measured, the
largest disagreement is about 5e-5 on O(0.1..1) gradients for the ops and the model alike,
so the tolerance |fd - analytic| <= 1e-4 + 2e-3 * max(|fd|, |analytic|) has a margin of a
few times. Deliberate bugs (a dropped layernorm term, dp instead of dp - D in attention, a
missing bias gradient, a 1% error in dbias, a 0.3% error in dlogits) each fail many checks.
Gradient outputs are filled with random values before the backward and those are
subtracted after, so the tests also check that every backward ADDS (dinp included).

The whole model is checked per parameter tensor, twice: along a random +-1 direction over
the whole tensor (a strong signal: every element of the gradient contributes) and on single
elements (the largest gradients and random ones).
*/
#include "test/test_harness.h"
#include "test/test_harness_fork.h"
#include "test/gpt2_ref.h"

#define FD_STEP (1.0 / 128)
#define FD_RTOL 2e-3
#define FD_ATOL 1e-4

static mt19937_state g_rng;

static float* alloc_normal(size_t n, float mean, float std) {
    float* x = (float*)mallocCheck(n * sizeof(float));
    normal_(x, n, mean, std, &g_rng);
    return x;
}

static float* alloc_copy(const float* x, size_t n) {
    float* y = (float*)mallocCheck(n * sizeof(float));
    memcpy(y, x, n * sizeof(float));
    return y;
}

static int* alloc_tokens(size_t n, int V) {
    int* tokens = (int*)mallocCheck(n * sizeof(int));
    for (size_t i = 0; i < n; i++) { tokens[i] = (int)(randint32(&g_rng) % (uint32_t)V); }
    return tokens;
}

static double weighted_sum(const float* out, const float* weights, size_t n) {
    double acc = 0.0;
    for (size_t i = 0; i < n; i++) { acc += (double)out[i] * weights[i]; }
    return acc;
}

// returns the scalar loss of an op at its current inputs
typedef double (*LossFn)(void* ctx);

/*
Compares analytic[i] with the central difference of loss() in x[i], for every i in
[0, n). `grad_after` is the gradient buffer after the backward and `grad_before` what it
held before (the random prefill), so analytic = after - before.
*/
static void check_op_gradient(const char* what, float* x, size_t n, const float* grad_before, const float* grad_after,
                              LossFn loss, void* ctx) {
    double max_err = 0.0;
    int failures = 0;
    for (size_t i = 0; i < n; i++) {
        float saved = x[i];
        x[i] = saved + (float)FD_STEP;
        double loss_plus = loss(ctx);
        x[i] = saved - (float)FD_STEP;
        double loss_minus = loss(ctx);
        x[i] = saved;
        double step = ((double)(saved + (float)FD_STEP) - (double)(saved - (float)FD_STEP)); // the step really taken
        double fd = (loss_plus - loss_minus) / step;
        double analytic = (double)grad_after[i] - (double)grad_before[i];
        double err = fabs(fd - analytic);
        double allowed = FD_ATOL + FD_RTOL * fmax(fabs(fd), fabs(analytic));
        max_err = worst_of(max_err, err);
        if (!isfinite(analytic) || !(err <= allowed)) {
            if (failures < 3) { printf("  %s[%zu]: analytic %.8g, finite difference %.8g\n", what, i, analytic, fd); }
            failures++;
        }
    }
    CHECK(failures == 0, "%s: %d of %zu gradient elements disagree with finite differences (max err %.3g)",
          what, failures, n, max_err);
}

// ----------------------------------------------------------------------------
// one check per op: forward, a loss over its output, backward, finite differences

typedef struct { int B, T, C, V, maxT; int* inp; float* wte; float* wpe; float* out; float* r; } EncoderCase;
static double encoder_loss(void* ctx) {
    EncoderCase* e = (EncoderCase*)ctx;
    ref_encoder_forward(e->out, e->inp, e->wte, e->wpe, e->B, e->T, e->C);
    return weighted_sum(e->out, e->r, (size_t)e->B * e->T * e->C);
}
static void test_encoder(void) {
    EncoderCase e;
    e.B = 2; e.T = 3; e.C = 5; e.V = 4; e.maxT = 4;
    size_t n_out = (size_t)e.B * e.T * e.C;
    e.inp = alloc_tokens((size_t)e.B * e.T, e.V);  // 6 tokens from 4 ids: repeats exercise the scatter-add
    e.wte = alloc_normal((size_t)e.V * e.C, 0.0f, 1.0f);
    e.wpe = alloc_normal((size_t)e.maxT * e.C, 0.0f, 1.0f);
    e.out = (float*)mallocCheck(n_out * sizeof(float));
    e.r = alloc_normal(n_out, 0.0f, 1.0f);
    float* dwte = alloc_normal((size_t)e.V * e.C, 0.0f, 1.0f);
    float* dwpe = alloc_normal((size_t)e.maxT * e.C, 0.0f, 1.0f);
    float* dwte0 = alloc_copy(dwte, (size_t)e.V * e.C);
    float* dwpe0 = alloc_copy(dwpe, (size_t)e.maxT * e.C);
    ref_encoder_backward(dwte, dwpe, e.r, e.inp, e.B, e.T, e.C);
    check_op_gradient("encoder dwte", e.wte, (size_t)e.V * e.C, dwte0, dwte, encoder_loss, &e);
    check_op_gradient("encoder dwpe", e.wpe, (size_t)e.maxT * e.C, dwpe0, dwpe, encoder_loss, &e);
    free(e.inp); free(e.wte); free(e.wpe); free(e.out); free(e.r); free(dwte); free(dwpe); free(dwte0); free(dwpe0);
}

typedef struct { int N, C; float* inp; float* weight; float* bias; float* out; float* mean; float* rstd; float* r; } LayernormCase;
static double layernorm_loss(void* ctx) {
    LayernormCase* c = (LayernormCase*)ctx;
    ref_layernorm_forward(c->out, c->mean, c->rstd, c->inp, c->weight, c->bias, c->N, c->C);
    return weighted_sum(c->out, c->r, (size_t)c->N * c->C);
}
static void test_layernorm(void) {
    LayernormCase c;
    c.N = 4; c.C = 16;
    size_t n = (size_t)c.N * c.C;
    c.inp = alloc_normal(n, 0.5f, 2.0f);
    c.weight = alloc_normal((size_t)c.C, 1.0f, 0.5f);
    c.bias = alloc_normal((size_t)c.C, 0.0f, 0.5f);
    c.out = (float*)mallocCheck(n * sizeof(float));
    c.mean = (float*)mallocCheck((size_t)c.N * sizeof(float));
    c.rstd = (float*)mallocCheck((size_t)c.N * sizeof(float));
    c.r = alloc_normal(n, 0.0f, 1.0f);
    layernorm_loss(&c);
    // forward sanity: each normalized row has mean 0 and variance 1 before the affine part
    for (int i = 0; i < c.N; i++) {
        double s = 0.0, s2 = 0.0;
        for (int j = 0; j < c.C; j++) {
            double xhat = (c.out[i * c.C + j] - c.bias[j]) / c.weight[j];
            s += xhat; s2 += xhat * xhat;
        }
        CHECK(fabs(s / c.C) < 1e-4 && fabs(s2 / c.C - 1.0) < 1e-3, "layernorm row %d: mean %g, variance %g", i, s / c.C, s2 / c.C);
    }
    float* dinp = alloc_normal(n, 0.0f, 1.0f);
    float* dweight = alloc_normal((size_t)c.C, 0.0f, 1.0f);
    float* dbias = alloc_normal((size_t)c.C, 0.0f, 1.0f);
    float* dinp0 = alloc_copy(dinp, n);
    float* dweight0 = alloc_copy(dweight, (size_t)c.C);
    float* dbias0 = alloc_copy(dbias, (size_t)c.C);
    ref_layernorm_backward(dinp, dweight, dbias, c.r, c.inp, c.weight, c.mean, c.rstd, c.N, c.C);
    check_op_gradient("layernorm dinp", c.inp, n, dinp0, dinp, layernorm_loss, &c);
    check_op_gradient("layernorm dweight", c.weight, (size_t)c.C, dweight0, dweight, layernorm_loss, &c);
    check_op_gradient("layernorm dbias", c.bias, (size_t)c.C, dbias0, dbias, layernorm_loss, &c);
    free(c.inp); free(c.weight); free(c.bias); free(c.out); free(c.mean); free(c.rstd); free(c.r);
    free(dinp); free(dweight); free(dbias); free(dinp0); free(dweight0); free(dbias0);
}

typedef struct { int N, C, OC; float* inp; float* weight; float* bias; float* out; float* r; } MatmulCase;
static double matmul_loss(void* ctx) {
    MatmulCase* m = (MatmulCase*)ctx;
    ref_matmul_forward(m->out, m->inp, m->weight, m->bias, m->N, m->C, m->OC);
    return weighted_sum(m->out, m->r, (size_t)m->N * m->OC);
}
static void test_matmul(void) {
    MatmulCase m;
    m.N = 5; m.C = 7; m.OC = 6;
    size_t n_inp = (size_t)m.N * m.C, n_w = (size_t)m.OC * m.C, n_out = (size_t)m.N * m.OC;
    m.inp = alloc_normal(n_inp, 0.0f, 1.0f);
    m.weight = alloc_normal(n_w, 0.0f, 1.0f);
    m.bias = alloc_normal((size_t)m.OC, 0.0f, 1.0f);
    m.out = (float*)mallocCheck(n_out * sizeof(float));
    m.r = alloc_normal(n_out, 0.0f, 1.0f);
    float* dinp = alloc_normal(n_inp, 0.0f, 1.0f);
    float* dweight = alloc_normal(n_w, 0.0f, 1.0f);
    float* dbias = alloc_normal((size_t)m.OC, 0.0f, 1.0f);
    float* dinp0 = alloc_copy(dinp, n_inp);
    float* dweight0 = alloc_copy(dweight, n_w);
    float* dbias0 = alloc_copy(dbias, (size_t)m.OC);
    ref_matmul_backward(dinp, dweight, dbias, m.r, m.inp, m.weight, m.N, m.C, m.OC);
    check_op_gradient("matmul dinp", m.inp, n_inp, dinp0, dinp, matmul_loss, &m);
    check_op_gradient("matmul dweight", m.weight, n_w, dweight0, dweight, matmul_loss, &m);
    check_op_gradient("matmul dbias", m.bias, (size_t)m.OC, dbias0, dbias, matmul_loss, &m);

    // without a bias: the same as a zero bias; a NULL dbias leaves dinp and dweight as with one
    float* zero_bias = (float*)mallocCheck((size_t)m.OC * sizeof(float));
    memset(zero_bias, 0, (size_t)m.OC * sizeof(float));
    float* out_no_bias = (float*)mallocCheck(n_out * sizeof(float));
    ref_matmul_forward(out_no_bias, m.inp, m.weight, NULL, m.N, m.C, m.OC);
    ref_matmul_forward(m.out, m.inp, m.weight, zero_bias, m.N, m.C, m.OC);
    CHECK(memcmp(out_no_bias, m.out, n_out * sizeof(float)) == 0, "matmul forward with a NULL bias differs from a zero bias");
    ref_matmul_backward(dinp0, dweight0, NULL, m.r, m.inp, m.weight, m.N, m.C, m.OC);
    CHECK(memcmp(dinp0, dinp, n_inp * sizeof(float)) == 0 && memcmp(dweight0, dweight, n_w * sizeof(float)) == 0,
          "matmul backward with a NULL dbias gives other dinp or dweight");
    free(m.inp); free(m.weight); free(m.bias); free(m.out); free(m.r); free(dinp); free(dweight); free(dbias);
    free(dinp0); free(dweight0); free(dbias0); free(zero_bias); free(out_no_bias);
}

// The reference's matmuls take rows in blocks, weights in chunks, and run their inner loops as
// AVX2 clones where the CPU has AVX2 (gpt2_ref.h): each must equal, bit for bit, the plain
// loops below, which this file compiles for baseline x86-64 (SSE2) and which add each output's
// terms in the order the blocked ones must keep. N runs across several row blocks with a short
// last one, OC across two weight chunks with a short last one, and C = 37 leaves every vector
// loop a tail.
static void plain_matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int N, int C, int OC) {
    for (int n = 0; n < N; n++) {
        for (int o = 0; o < OC; o++) {
            double acc = bias != NULL ? bias[o] : 0.0;
            for (int c = 0; c < C; c++) { acc += (double)inp[(size_t)n * C + c] * (double)weight[(size_t)o * C + c]; }
            out[(size_t)n * OC + o] = (float)acc;
        }
    }
}

static void plain_matmul_dgrad(float* dinp, const float* dout, const float* weight, int N, int C, int OC) {
    for (int n = 0; n < N; n++) {
        for (int o = 0; o < OC; o++) {
            const float d = dout[(size_t)n * OC + o];
            for (int c = 0; c < C; c++) { dinp[(size_t)n * C + c] += d * weight[(size_t)o * C + c]; }
        }
    }
}

static void plain_matmul_wgrad(float* dweight, const float* dout, const float* inp, int N, int C, int OC) {
    for (int o = 0; o < OC; o++) {
        for (int n = 0; n < N; n++) {
            const float d = dout[(size_t)n * OC + o];
            for (int c = 0; c < C; c++) { dweight[(size_t)o * C + c] += d * inp[(size_t)n * C + c]; }
        }
    }
}

static void test_matmul_blocks_and_clones(void) {
    const int C = 2 * REF_AXPY_LANES + 5, OC = 2 * REF_WEIGHT_CHUNK + 5;  // every block, lane block and tail
    for (int N = 1; N <= 2 * REF_ROW_BLOCK + 3; N++) {
        float* inp = alloc_normal((size_t)N * C, 0.0f, 1.0f);
        float* weight = alloc_normal((size_t)OC * C, 0.0f, 1.0f);
        float* bias = alloc_normal((size_t)OC, 0.0f, 1.0f);
        float* dout = alloc_normal((size_t)N * OC, 0.0f, 1.0f);
        float* got[3] = {alloc_normal((size_t)N * OC, 0.0f, 1.0f), alloc_normal((size_t)N * C, 0.0f, 1.0f),
                         alloc_normal((size_t)OC * C, 0.0f, 1.0f)};  // out, dinp, dweight (the backward adds to them)
        float* want[3];
        const size_t sizes[3] = {(size_t)N * OC, (size_t)N * C, (size_t)OC * C};
        for (int k = 0; k < 3; k++) {
            want[k] = (float*)mallocCheck(sizes[k] * sizeof(float));
            memcpy(want[k], got[k], sizes[k] * sizeof(float));
        }
        ref_matmul_forward(got[0], inp, weight, bias, N, C, OC);
        ref_matmul_backward_dgrad(got[1], dout, weight, N, C, OC);
        ref_matmul_backward_wgrad(got[2], dout, inp, N, C, OC);
        plain_matmul_forward(want[0], inp, weight, bias, N, C, OC);
        plain_matmul_dgrad(want[1], dout, weight, N, C, OC);
        plain_matmul_wgrad(want[2], dout, inp, N, C, OC);
        const char* names[3] = {"forward", "dgrad", "wgrad"};
        for (int k = 0; k < 3; k++) {
            CHECK(memcmp(got[k], want[k], sizes[k] * sizeof(float)) == 0, "matmul %s of %d rows differs from the plain loops",
                  names[k], N);
            free(got[k]);
            free(want[k]);
        }
        free(inp); free(weight); free(bias); free(dout);
    }
}

typedef struct { int B, T, C, NH; float* qkv; float* out; float* lse; float* r; } AttentionCase;
static double attention_loss(void* ctx) {
    AttentionCase* a = (AttentionCase*)ctx;
    ref_attention_forward(a->out, a->lse, a->qkv, a->B, a->T, a->C, a->NH);
    return weighted_sum(a->out, a->r, (size_t)a->B * a->T * a->C);
}
static void test_attention(void) {
    AttentionCase a;
    a.B = 2; a.T = 5; a.C = 12; a.NH = 3;
    size_t n_qkv = (size_t)a.B * a.T * 3 * a.C, n_out = (size_t)a.B * a.T * a.C;
    a.qkv = alloc_normal(n_qkv, 0.0f, 1.0f);
    a.out = (float*)mallocCheck(n_out * sizeof(float));
    a.lse = (float*)mallocCheck((size_t)a.B * a.NH * a.T * sizeof(float));
    a.r = alloc_normal(n_out, 0.0f, 1.0f);
    attention_loss(&a);
    // causality: the first position attends only to itself, so its output is its own v
    int HS = a.C / a.NH;
    double first_err = 0.0;
    for (int b = 0; b < a.B; b++) {
        for (int i = 0; i < a.C; i++) {
            first_err = worst_of(first_err, fabs(a.out[(size_t)b * a.T * a.C + i] - a.qkv[(size_t)b * a.T * 3 * a.C + 2 * a.C + i]));
        }
    }
    CHECK(first_err < 1e-6, "attention: output at t=0 differs from v by %g", first_err);
    // lse at t=0 is the single scaled score q.k / sqrt(HS)
    double s0 = ref_dot(a.qkv, a.qkv + a.C, HS) / sqrt((double)HS);
    CHECK_CLOSE(a.lse[0], s0, 1e-6, 1e-6, "attention lse at b=0 h=0 t=0");
    float* dqkv = alloc_normal(n_qkv, 0.0f, 1.0f);
    float* dqkv0 = alloc_copy(dqkv, n_qkv);
    ref_attention_backward(dqkv, a.r, a.qkv, a.out, a.lse, a.B, a.T, a.C, a.NH);
    check_op_gradient("attention dqkv", a.qkv, n_qkv, dqkv0, dqkv, attention_loss, &a);
    free(a.qkv); free(a.out); free(a.lse); free(a.r); free(dqkv); free(dqkv0);
}

typedef struct { int N; float* inp; float* out; float* r; } GeluCase;
static double gelu_loss(void* ctx) {
    GeluCase* g = (GeluCase*)ctx;
    ref_gelu_forward(g->out, g->inp, g->N);
    return weighted_sum(g->out, g->r, (size_t)g->N);
}
static void test_gelu(void) {
    GeluCase g;
    g.N = 81;
    g.inp = (float*)mallocCheck((size_t)g.N * sizeof(float));
    for (int i = 0; i < g.N; i++) { g.inp[i] = -4.0f + 0.1f * i; }  // covers both tails and the bend
    g.out = (float*)mallocCheck((size_t)g.N * sizeof(float));
    g.r = alloc_normal((size_t)g.N, 0.0f, 1.0f);
    float* dinp = alloc_normal((size_t)g.N, 0.0f, 1.0f);
    float* dinp0 = alloc_copy(dinp, (size_t)g.N);
    ref_gelu_backward(dinp, g.inp, g.r, g.N);
    check_op_gradient("gelu dinp", g.inp, (size_t)g.N, dinp0, dinp, gelu_loss, &g);
    free(g.inp); free(g.out); free(g.r); free(dinp); free(dinp0);
}

typedef struct { int N, V, Vp; float dloss; float* logits; int* targets; float* losses; } CrossentropyCase;
static double crossentropy_loss(void* ctx) {
    CrossentropyCase* c = (CrossentropyCase*)ctx;
    ref_crossentropy_forward_backward(c->losses, NULL, c->logits, c->targets, c->N, c->V, c->Vp, 0.0f);
    double sum = 0.0;
    for (int i = 0; i < c->N; i++) { sum += c->losses[i]; }
    return c->dloss * sum;
}
static void test_crossentropy(void) {
    CrossentropyCase c;
    c.N = 4; c.V = 11; c.Vp = 16; c.dloss = 0.37f;
    size_t n = (size_t)c.N * c.Vp;
    c.logits = alloc_normal(n, 0.0f, 2.0f);
    c.targets = alloc_tokens((size_t)c.N, c.V);
    c.losses = (float*)mallocCheck((size_t)c.N * sizeof(float));
    // forward against the definition, in double
    crossentropy_loss(&c);
    for (int i = 0; i < c.N; i++) {
        double sum = 0.0;
        for (int j = 0; j < c.V; j++) { sum += exp((double)c.logits[i * c.Vp + j]); }
        CHECK_CLOSE(c.losses[i], log(sum) - c.logits[i * c.Vp + c.targets[i]], 1e-6, 1e-6, "crossentropy loss");
    }
    float* dlogits = alloc_normal(n, 0.0f, 1.0f);  // garbage: dlogits is overwritten, not added to
    float* zeros = (float*)mallocCheck(n * sizeof(float));
    memset(zeros, 0, n * sizeof(float));
    ref_crossentropy_forward_backward(c.losses, dlogits, c.logits, c.targets, c.N, c.V, c.Vp, c.dloss);
    // finite differences over all Vp columns: the padded ones must have zero gradient
    check_op_gradient("crossentropy dlogits", c.logits, n, zeros, dlogits, crossentropy_loss, &c);
    int padded_zero = 1;
    for (int i = 0; i < c.N; i++) {
        for (int j = c.V; j < c.Vp; j++) { padded_zero = padded_zero && dlogits[i * c.Vp + j] == 0.0f; }
    }
    CHECK(padded_zero, "crossentropy: dlogits in the padded columns are not zero");
    free(c.logits); free(c.targets); free(c.losses); free(dlogits); free(zeros);
}

// ----------------------------------------------------------------------------
// the whole model

typedef struct { GPT2Ref* model; const int* inputs; const int* targets; int B, T; } ModelCase;

// the mean loss summed in double from the per-position losses (skips one fp32 rounding)
static double model_loss(ModelCase* mc) {
    gpt2ref_forward(mc->model, mc->inputs, mc->targets, mc->B, mc->T);
    double sum = 0.0;
    for (int i = 0; i < mc->B * mc->T; i++) { sum += mc->model->acts.losses[i]; }
    return sum / (mc->B * mc->T);
}

// central difference of the loss along `direction` in parameter tensor `tensor`
static double model_directional_fd(ModelCase* mc, int tensor, const float* direction, double h) {
    float* p = mc->model->param_tensors[tensor];
    size_t n = mc->model->param_sizes[tensor];
    float* saved = alloc_copy(p, n);
    for (size_t i = 0; i < n; i++) { p[i] = saved[i] + (float)h * direction[i]; }
    double loss_plus = model_loss(mc);
    for (size_t i = 0; i < n; i++) { p[i] = saved[i] - (float)h * direction[i]; }
    double loss_minus = model_loss(mc);
    memcpy(p, saved, n * sizeof(float));
    free(saved);
    return (loss_plus - loss_minus) / (2.0 * h);
}

static GPT2Config tiny_config(void) {
    GPT2Config cfg = gpt2_config_make(2, 4, 32, 8, 67);  // L, NH, C, maxT, V (Vp = 128)
    return cfg;
}

// llm.c init, then N(0, 0.1) noise on everything so attention is far from uniform and
// biases and layernorm parameters are not at their trivial values
static float* tiny_params(const GPT2Config* cfg) {
    size_t n = gpt2_num_parameters(cfg);
    float* params = (float*)mallocCheck(n * sizeof(float));
    gpt2_init_params_random(params, cfg, GPT2_INIT_SEED);
    float* noise = alloc_normal(n, 0.0f, 0.1f);
    for (size_t i = 0; i < n; i++) { params[i] += noise[i]; }
    free(noise);
    return params;
}

static void test_model_gradients(void) {
    GPT2Config cfg = tiny_config();
    float* params = tiny_params(&cfg);
    GPT2Ref model;
    gpt2ref_init(&model, &cfg, params);
    int B = 2, T = 8;
    int* inputs = alloc_tokens((size_t)B * T, cfg.vocab_size);
    int* targets = alloc_tokens((size_t)B * T, cfg.vocab_size);
    ModelCase mc = { &model, inputs, targets, B, T };
    double loss = model_loss(&mc);
    CHECK(loss > 1.0 && loss < 20.0, "tiny model loss %g is not plausible", loss);
    gpt2ref_zero_grad(&model);
    gpt2ref_backward(&model, 1);
    float* grads = alloc_copy(model.grads, model.num_parameters);

    for (int t = 0; t < NUM_PARAMETER_TENSORS; t++) {
        size_t n = model.param_sizes[t];
        const float* g = grads + (model.grad_tensors[t] - model.grads);
        // along a random unit direction of +-1/sqrt(n) entries over the whole tensor
        float* direction = (float*)mallocCheck(n * sizeof(float));
        float unit = (float)(1.0 / sqrt((double)n));
        double analytic = 0.0;
        for (size_t i = 0; i < n; i++) {
            direction[i] = (randint32(&g_rng) & 1u) ? unit : -unit;
            analytic += (double)direction[i] * g[i];
        }
        double fd = model_directional_fd(&mc, t, direction, FD_STEP);
        CHECK(fabs(fd - analytic) <= FD_ATOL + FD_RTOL * fmax(fabs(fd), fabs(analytic)),
              "model d%s along a random direction: analytic %.8g, finite difference %.8g", PARAM_TENSOR_NAMES[t], analytic, fd);
        // single elements: the 4 largest gradients and 4 random ones
        size_t picks[8];
        for (int k = 0; k < 4; k++) {
            size_t best = 0;
            double best_abs = -1.0;
            for (size_t i = 0; i < n; i++) {
                int taken = 0;
                for (int j = 0; j < k; j++) { taken = taken || picks[j] == i; }
                if (!taken && fabs(g[i]) > best_abs) { best_abs = fabs(g[i]); best = i; }
            }
            picks[k] = best;
        }
        for (int k = 4; k < 8; k++) { picks[k] = randint32(&g_rng) % n; }
        memset(direction, 0, n * sizeof(float));
        for (int k = 0; k < 8; k++) {
            direction[picks[k]] = 1.0f;
            double fd_one = model_directional_fd(&mc, t, direction, FD_STEP);
            direction[picks[k]] = 0.0f;
            CHECK(fabs(fd_one - g[picks[k]]) <= FD_ATOL + FD_RTOL * fmax(fabs(fd_one), fabs((double)g[picks[k]])),
                  "model d%s[%zu]: analytic %.8g, finite difference %.8g", PARAM_TENSOR_NAMES[t], picks[k],
                  (double)g[picks[k]], fd_one);
        }
        free(direction);
    }
    // the padded vocab rows of wte never receive gradient
    size_t C = cfg.channels;
    double padded_abs = 0.0;
    for (size_t i = (size_t)cfg.vocab_size * C; i < (size_t)cfg.padded_vocab_size * C; i++) { padded_abs += fabs(grads[i]); }
    CHECK(padded_abs == 0.0, "gradient of the padded wte rows is %g, expected 0", padded_abs);
    free(grads); free(inputs); free(targets); free(params);
    gpt2ref_free(&model);
}

// K micro-steps with backward(model, K) accumulate the gradient of the big batch's mean loss
static void test_gradient_accumulation(void) {
    GPT2Config cfg = tiny_config();
    float* params = tiny_params(&cfg);
    int B = 4, T = 8, K = 2, micro_B = B / K;
    int* inputs = alloc_tokens((size_t)B * T, cfg.vocab_size);
    int* targets = alloc_tokens((size_t)B * T, cfg.vocab_size);
    GPT2Ref model;
    gpt2ref_init(&model, &cfg, params);
    float big_loss = gpt2ref_forward(&model, inputs, targets, B, T);
    gpt2ref_zero_grad(&model);
    gpt2ref_backward(&model, 1);
    float* big_grads = alloc_copy(model.grads, model.num_parameters);
    // the same model object: micro-batches are smaller than the first forward's batch
    gpt2ref_zero_grad(&model);
    double micro_loss_sum = 0.0;
    for (int k = 0; k < K; k++) {
        size_t offset = (size_t)k * micro_B * T;
        micro_loss_sum += gpt2ref_forward(&model, inputs + offset, targets + offset, micro_B, T);
        gpt2ref_backward(&model, K);
    }
    CHECK_CLOSE(micro_loss_sum / K, big_loss, 1e-6, 1e-6, "mean of micro-step losses vs big-batch loss");
    double max_err = 0.0, max_abs = 0.0;
    for (size_t i = 0; i < model.num_parameters; i++) {
        max_err = worst_of(max_err, fabs((double)model.grads[i] - big_grads[i]));
        max_abs = fmax(max_abs, fabs((double)big_grads[i]));
    }
    CHECK(isfinite(max_abs) && max_err <= 1e-5 * max_abs, "accumulated gradients differ from the big batch's by %g (max |grad| %g)",
          max_err, max_abs);

    // logits do not depend on whether targets are given
    gpt2ref_forward(&model, inputs, targets, B, T);
    size_t n_logits = (size_t)B * T * cfg.padded_vocab_size;
    float* logits = alloc_copy(model.acts.logits, n_logits);
    float no_target_loss = gpt2ref_forward(&model, inputs, NULL, B, T);
    CHECK(no_target_loss == -1.0f, "forward without targets returned %g, expected -1", no_target_loss);
    CHECK(memcmp(logits, model.acts.logits, n_logits * sizeof(float)) == 0, "logits differ without targets");
    free(logits); free(big_grads); free(inputs); free(targets); free(params);
    gpt2ref_free(&model);
}

// ----------------------------------------------------------------------------
// bad input: each must exit non-zero with one "error: ..." line naming the problem

typedef enum { MISUSE_TOO_LONG, MISUSE_BATCH_TOO_BIG, MISUSE_BAD_TOKEN, MISUSE_BACKWARD_WITHOUT_TARGETS } Misuse;

static void run_misuse(Misuse misuse) {
    GPT2Config cfg = tiny_config();
    float* params = tiny_params(&cfg);
    GPT2Ref model;
    gpt2ref_init(&model, &cfg, params);
    int tokens[64] = {0};
    gpt2ref_forward(&model, tokens, tokens, 2, 4);
    switch (misuse) {
        case MISUSE_TOO_LONG: gpt2ref_forward(&model, tokens, tokens, 1, cfg.max_seq_len + 1); break;
        case MISUSE_BATCH_TOO_BIG: gpt2ref_forward(&model, tokens, tokens, 3, 4); break;
        case MISUSE_BAD_TOKEN: tokens[5] = cfg.vocab_size; gpt2ref_forward(&model, tokens, tokens, 2, 4); break;
        case MISUSE_BACKWARD_WITHOUT_TARGETS: gpt2ref_forward(&model, tokens, NULL, 2, 4); gpt2ref_backward(&model, 1); break;
    }
}

int main(void) {
    manual_seed(&g_rng, 1337);
    // forked children first: with -fopenmp a child forked after the parent's thread pool started would hang
    CHECK_DIES("T > maxT", "maxT=8", run_misuse(MISUSE_TOO_LONG));
    CHECK_DIES("B*T over the first forward's", "exceeds the activations", run_misuse(MISUSE_BATCH_TOO_BIG));
    CHECK_DIES("token id >= V", "out of range", run_misuse(MISUSE_BAD_TOKEN));
    CHECK_DIES("backward after a forward without targets", "no targets", run_misuse(MISUSE_BACKWARD_WITHOUT_TARGETS));
    test_encoder();
    test_layernorm();
    test_matmul();
    test_matmul_blocks_and_clones();
    test_attention();
    test_gelu();
    test_crossentropy();
    test_model_gradients();
    test_gradient_accumulation();
    return test_summary("test_gradcheck");
}
