/*
test_reference_fixture.c: the CPU reference (test/gpt2_ref.h) against PyTorch's golden
tensors for a tiny model (test/fixtures/, written by dev/reference/gpt2_torch.py; see
dev/reference/README.md for how to regenerate them).

Why: the finite-difference test proves each backward matches its own forward, but a forward
that is self-consistent and wrong (attention scale, GELU variant, layernorm eps, a tied
weight, the padded vocab, the decay mask, the clipping rule) passes it. An independent
implementation catches those.

Tolerances (fp32 on both sides; the measured differences, in brackets, are 50-1000 times
smaller, while a layernorm eps of 1e-6, a 1% attention-scale error, decaying every tensor,
no clipping or a missing bias correction each fail):
- loss: |ref - torch| <= 1e-5 * |torch|  [1e-7];
- logits: |ref - torch| <= 1e-4 absolute, logits being O(1..10)  [2e-6];
- gradients: per tensor, |ref - torch| <= 1e-4 * max|torch| over that tensor, i.e. 1e-4 of
  the tensor's own scale  [1e-6 of it]. Elementwise relative error would be dominated by
  entries near 0, and one absolute bound would be loose for tensors with small gradients;
- the 10 AdamW steps: each loss within 1e-4 relative of PyTorch's  [1e-7], with the
  hyperparameters read from the debug state's header.
Usage: build/test_reference_fixture [FIXTURE_DIR] (default test/fixtures).
*/
#include "test/test_harness.h"
#include "test/gpt2_ref.h"
#include "llmc/checkpoint.h"

#define DEBUG_STATE_MAGIC 20240327
#define DEBUG_STATE_VERSION_WITH_STEPS 3

typedef struct {
    int B, T, steps;
    float learning_rate, beta1, beta2, eps, weight_decay, grad_clip;
    int* x;          // [B*T]
    int* y;          // [B*T]
    float* logits;   // [B*T*V]
    float loss;
    float* grads;    // [num_parameters]
    float* losses;   // [steps]
} DebugState;

// reads the version-3 debug state format (dev/reference/gpt2_torch.py); dies on anything else
static void debug_state_read(DebugState* ds, const char* path, const GPT2Config* cfg) {
    FILE* fp = fopenCheck(path, "rb");
    long file_bytes = file_size_bytes(fp);
    int32_t header[256];
    if (file_bytes < (long)sizeof(header)) {
        llm8_die("debug state '%s' is %ld bytes, shorter than its 1024-byte header", path, file_bytes);
    }
    freadCheck(header, sizeof(int32_t), 256, fp);
    if (header[0] != DEBUG_STATE_MAGIC || header[1] != DEBUG_STATE_VERSION_WITH_STEPS) {
        llm8_die("debug state '%s' has magic %d version %d, expected %d version %d", path, header[0], header[1],
                 DEBUG_STATE_MAGIC, DEBUG_STATE_VERSION_WITH_STEPS);
    }
    ds->B = header[2];
    ds->T = header[3];
    ds->steps = header[4];
    if (ds->B < 1 || ds->T < 1 || ds->T > cfg->max_seq_len || ds->steps < 1) {
        llm8_die("debug state '%s' has B=%d T=%d steps=%d (expected positive, T <= maxT=%d)", path, ds->B, ds->T,
                 ds->steps, cfg->max_seq_len);
    }
    float hyper[6];
    memcpy(hyper, header + 5, sizeof(hyper));
    ds->learning_rate = hyper[0]; ds->beta1 = hyper[1]; ds->beta2 = hyper[2];
    ds->eps = hyper[3]; ds->weight_decay = hyper[4]; ds->grad_clip = hyper[5];
    size_t BT = (size_t)ds->B * ds->T, P = gpt2_num_parameters(cfg);
    long expected = (long)(sizeof(header) + 2 * BT * sizeof(int) + (BT * cfg->vocab_size + 1 + P + ds->steps) * sizeof(float));
    if (file_bytes != expected) {
        llm8_die("debug state '%s' is %ld bytes, expected %ld for B=%d T=%d V=%d, %zu parameters, %d steps", path,
                 file_bytes, expected, ds->B, ds->T, cfg->vocab_size, P, ds->steps);
    }
    ds->x = (int*)mallocCheck(BT * sizeof(int));
    ds->y = (int*)mallocCheck(BT * sizeof(int));
    ds->logits = (float*)mallocCheck(BT * cfg->vocab_size * sizeof(float));
    ds->grads = (float*)mallocCheck(P * sizeof(float));
    ds->losses = (float*)mallocCheck((size_t)ds->steps * sizeof(float));
    freadCheck(ds->x, sizeof(int), BT, fp);
    freadCheck(ds->y, sizeof(int), BT, fp);
    freadCheck(ds->logits, sizeof(float), BT * cfg->vocab_size, fp);
    freadCheck(&ds->loss, sizeof(float), 1, fp);
    freadCheck(ds->grads, sizeof(float), P, fp);
    freadCheck(ds->losses, sizeof(float), (size_t)ds->steps, fp);
    fcloseCheck(fp);
}

static void debug_state_free(DebugState* ds) {
    free(ds->x); free(ds->y); free(ds->logits); free(ds->grads); free(ds->losses);
}

int main(int argc, char** argv) {
    const char* dir = argc > 1 ? argv[1] : "test/fixtures";
    char model_path[4096], state_path[4096];
    snprintf(model_path, sizeof(model_path), "%s/gpt2_tiny_model.bin", dir);
    snprintf(state_path, sizeof(state_path), "%s/gpt2_tiny_debug_state.bin", dir);

    GPT2Config cfg;
    int version;
    model_file_read_header(model_path, &cfg, &version);
    CHECK(version == MODEL_VERSION_FP32, "fixture model version %d, expected %d", version, MODEL_VERSION_FP32);
    float* params = (float*)mallocCheck(gpt2_num_parameters(&cfg) * sizeof(float));
    model_file_read_params(model_path, &cfg, params);
    DebugState ds;
    debug_state_read(&ds, state_path, &cfg);
    GPT2Ref model;
    gpt2ref_init(&model, &cfg, params);
    int V = cfg.vocab_size, Vp = cfg.padded_vocab_size, BT = ds.B * ds.T;

    // forward: loss and logits (the first V columns of each padded row)
    float loss = gpt2ref_forward(&model, ds.x, ds.y, ds.B, ds.T);
    CHECK_CLOSE(loss, ds.loss, 0.0, 1e-5, "loss vs PyTorch");
    double logits_err = 0.0;
    for (int i = 0; i < BT; i++) {
        for (int j = 0; j < V; j++) {
            logits_err = worst_of(logits_err, fabs((double)model.acts.logits[(size_t)i * Vp + j] - ds.logits[(size_t)i * V + j]));
        }
    }
    printf("loss %.7f (PyTorch %.7f), max logits error %.3g\n", loss, ds.loss, logits_err);
    CHECK(logits_err <= 1e-4, "logits differ from PyTorch's by up to %g (allowed 1e-4)", logits_err);

    // backward: every gradient tensor
    gpt2ref_zero_grad(&model);
    gpt2ref_backward(&model, 1);
    for (int t = 0; t < NUM_PARAMETER_TENSORS; t++) {
        const float* ours = model.grad_tensors[t];
        const float* expected = ds.grads + (model.grad_tensors[t] - model.grads);
        double max_err = 0.0, scale = 0.0;
        for (size_t i = 0; i < model.param_sizes[t]; i++) {
            max_err = worst_of(max_err, fabs((double)ours[i] - expected[i]));
            scale = fmax(scale, fabs((double)expected[i]));
        }
        printf("  d%-9s max |grad| %.3e, max error %.3e (%.2e of the scale)\n", PARAM_TENSOR_NAMES[t], scale, max_err,
               max_err / scale);
        CHECK(scale > 0.0 && max_err <= 1e-4 * scale, "d%s differs from PyTorch's by %g, more than 1e-4 x max|grad| = %g",
              PARAM_TENSOR_NAMES[t], max_err, 1e-4 * scale);
    }

    // AdamW steps on the same batch, as gpt2_torch.py ran them
    float norm0 = gpt2ref_global_norm(&model);
    printf("initial grad norm %.4f (clip at %g), lr %g, weight decay %g\n", norm0, ds.grad_clip, ds.learning_rate, ds.weight_decay);
    for (int step = 0; step < ds.steps; step++) {
        float step_loss = gpt2ref_forward(&model, ds.x, ds.y, ds.B, ds.T);
        printf("  step %d: loss %.7f (PyTorch %.7f)\n", step, step_loss, ds.losses[step]);
        CHECK_CLOSE(step_loss, ds.losses[step], 0.0, 1e-4, "loss before AdamW step vs PyTorch");
        gpt2ref_zero_grad(&model);
        gpt2ref_backward(&model, 1);
        gpt2ref_adamw_update(&model, ds.learning_rate, ds.beta1, ds.beta2, ds.eps, ds.weight_decay, step + 1, ds.grad_clip);
    }
    debug_state_free(&ds);
    free(params);
    gpt2ref_free(&model);
    CHECK(llm8_open_file_count() == 0, "%d files opened by fopenCheck are not closed by fcloseCheck", llm8_open_file_count());
    return test_summary("test_reference_fixture");
}
