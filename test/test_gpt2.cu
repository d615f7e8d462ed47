/*
test_gpt2.cu: the whole GPU model against the CPU reference, and the trainer's
bitwise-reproducibility promises. Runs on an H100/H200 (make gpucheck).

1. d12 at B=4, T=64, one forward + backward, both attention backends: logits, loss and
   every parameter gradient against test/gpt2_ref.h (fp32). Tolerances are relative L2
   errors per tensor, sized for bf16 activations, weights and gradients (8 mantissa bits,
   relative rounding 2^-9 per op, accumulated over 12 layers): logits 2e-2, gradients 5e-2,
   loss 2e-2 absolute at ln(V) ~ 10.8.
2. 10 AdamW steps on d6 in lockstep with the CPU reference: each loss within 1e-2 relative.
3. Determinism: two runs of 10 steps from the same init give bitwise equal losses and weights.
4. Recompute changes memory, not results: -r 1 and -r 2 bitwise equal, and -r 0 and -r 1
   with -ge 0 (a fused-GELU forward uses cuBLASLt's GELU, the recompute llm8's kernel).
5. Resume: 10 steps straight vs 5 steps, checkpoint, a fresh model loaded from it, 5 more
   steps: bitwise equal losses and weights.
*/
#define LLM8_TESTING
#include "train_gpt2_fp8.cu"
#include "test/gpt2_ref.h"
#include "test/test_harness.h"

static const int B = 4;
static const int T = 64;
static const char* SHARD_PATH = "build/test_gpt2_data_train_000000.bin";

static double relative_l2_error(const float* got, const float* want, size_t n) {
    double diff = 0.0, norm = 0.0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)got[i] - want[i];
        diff += d * d;
        norm += (double)want[i] * want[i];
    }
    return sqrt(diff / (norm > 0 ? norm : 1.0));
}

static void write_random_shard(const char* path, size_t num_tokens, int vocab) {
    mt19937_state rng;
    manual_seed(&rng, 7);
    int32_t header[256] = {0};
    header[0] = 20240520;
    header[1] = 1;
    header[2] = (int32_t)num_tokens;
    uint16_t* tokens = (uint16_t*)mallocCheck(num_tokens * sizeof(uint16_t));
    for (size_t i = 0; i < num_tokens; i++) { tokens[i] = (uint16_t)(randint32(&rng) % (uint32_t)vocab); }
    FILE* fp = fopenCheck(path, "wb");
    fwriteCheck(header, sizeof(int32_t), 256, fp);
    fwriteCheck(tokens, sizeof(uint16_t), num_tokens, fp);
    fcloseCheck(fp);
    free(tokens);
}

static float* bf16_device_to_float(const floatX* device, size_t n) {
    uint16_t* bits = (uint16_t*)mallocCheck(n * sizeof(uint16_t));
    cudaCheck(cudaMemcpy(bits, device, n * sizeof(uint16_t), cudaMemcpyDeviceToHost));
    float* out = (float*)mallocCheck(n * sizeof(float));
    for (size_t i = 0; i < n; i++) { out[i] = bf16_bits_to_float(bits[i]); }
    free(bits);
    return out;
}

static float* random_params(const GPT2Config* cfg) {
    float* params = (float*)mallocCheck(gpt2_num_parameters(cfg) * sizeof(float));
    gpt2_init_params_random(params, cfg, GPT2_INIT_SEED);
    return params;
}

static void test_forward_backward_vs_reference(AttentionBackend backend, const char* backend_name, cudaStream_t stream) {
    GPT2Config cfg = gpt2_config_from_descriptor("d12");
    float* params = random_params(&cfg);
    attention_setup(backend);
    GPT2 model;
    gpt2_build(&model, &cfg, params, 1, B, T, 1, 1);
    GPT2Ref ref;
    gpt2ref_init(&ref, &cfg, params);
    DataLoader loader;
    dataloader_init(&loader, SHARD_PATH, B, T, 0, 1, 0, cfg.vocab_size);
    dataloader_next_batch(&loader);
    size_t BT = (size_t)B * T, Vp = cfg.padded_vocab_size, V = cfg.vocab_size;

    // logits (a forward without dlogits), then the training forward + backward
    gpt2_forward(&model, loader.inputs, NULL, 1.0f, 0, stream);
    cudaCheck(cudaStreamSynchronize(stream));
    float* logits = bf16_device_to_float(model.acts.output, BT * Vp);
    float ref_loss = gpt2ref_forward(&ref, loader.inputs, loader.targets, B, T);
    gpt2ref_zero_grad(&ref);
    gpt2ref_backward(&ref, 1);
    double diff = 0.0, norm = 0.0;
    for (size_t bt = 0; bt < BT; bt++) {
        for (size_t v = 0; v < V; v++) {
            double d = (double)logits[bt * Vp + v] - ref.acts.logits[bt * Vp + v];
            diff += d * d;
            norm += (double)ref.acts.logits[bt * Vp + v] * ref.acts.logits[bt * Vp + v];
        }
    }
    CHECK(sqrt(diff / norm) < 2e-2, "[%s] logits relative L2 error %.3e >= 2e-2", backend_name, sqrt(diff / norm));

    cudaCheck(cudaMemsetAsync(model.grads, 0, model.num_parameters * sizeof(floatX), stream));
    cudaCheck(cudaMemsetAsync(model.acts.losses, 0, BT * sizeof(float), stream));
    gpt2_forward(&model, loader.inputs, loader.targets, 1.0f / (float)BT, 1, stream);
    gpt2_backward(&model, stream);
    float loss = gpt2_mean_loss(&model, 1, stream);
    CHECK_CLOSE(loss, ref_loss, 2e-2, 0.0, "loss");
    float* grads = bf16_device_to_float(model.grads, model.num_parameters);
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        size_t off = model.param_offsets[i];
        double err = relative_l2_error(grads + off, ref.grads + off, model.param_sizes[i]);
        CHECK(err < 5e-2, "[%s] grad of %s: relative L2 error %.3e >= 5e-2", backend_name, PARAM_TENSOR_NAMES[i], err);
        printf("[%s] grad %-9s relative L2 error %.3e\n", backend_name, PARAM_TENSOR_NAMES[i], err);
    }
    printf("[%s] loss gpu %.6f ref %.6f\n", backend_name, loss, ref_loss);
    free(grads);
    free(logits);
    free(params);
    dataloader_free(&loader);
    gpt2ref_free(&ref);
    gpt2_free(&model);
    attention_teardown();
}

static void test_training_trajectory_vs_reference(cudaStream_t stream) {
    GPT2Config cfg = gpt2_config_from_descriptor("d6");
    float* params = random_params(&cfg);
    attention_setup(ATTENTION_CUDNN);
    GPT2 model;
    gpt2_build(&model, &cfg, params, 1, B, T, 1, 1);
    GPT2Ref ref;
    gpt2ref_init(&ref, &cfg, params);
    DataLoader loader, ref_loader;
    dataloader_init(&loader, SHARD_PATH, B, T, 0, 1, 0, cfg.vocab_size);
    dataloader_init(&ref_loader, SHARD_PATH, B, T, 0, 1, 0, cfg.vocab_size);
    OptimizerConfig opt = {0.9f, 0.95f, 1e-8f, 0.1f, 1.0f};
    float lr = 3e-4f;
    for (int step = 0; step < 10; step++) {
        StepResult r = gpt2_train_step(&model, &loader, 1, 0, &opt, lr, step, stream);
        dataloader_next_batch(&ref_loader);
        float ref_loss = gpt2ref_forward(&ref, ref_loader.inputs, ref_loader.targets, B, T);
        gpt2ref_zero_grad(&ref);
        gpt2ref_backward(&ref, 1);
        gpt2ref_adamw_update(&ref, lr, opt.beta1, opt.beta2, opt.eps, opt.weight_decay, step + 1, opt.grad_clip);
        printf("step %d: loss gpu %.6f ref %.6f\n", step + 1, r.loss, ref_loss);
        CHECK_CLOSE(r.loss, ref_loss, 0.0, 1e-2, "10-step trajectory loss");
    }
    free(params);
    dataloader_free(&loader);
    dataloader_free(&ref_loader);
    gpt2ref_free(&ref);
    gpt2_free(&model);
    attention_teardown();
}

typedef struct {
    float losses[10];
    float* weights;  // final bf16 weights as floats
} RunRecord;

// trains `steps` steps from a fresh d12 model (or from a checkpoint when resume_dir is set)
static RunRecord train_run(int steps, int recompute, int gelu_fusion, const char* checkpoint_dir, int checkpoint_step, int resume,
                           cudaStream_t stream) {
    GPT2Config cfg = gpt2_config_from_descriptor("d12");
    float* params = random_params(&cfg);
    char path[CHECKPOINT_PATH_MAX];
    if (resume) {
        checkpoint_model_path(path, sizeof(path), checkpoint_dir, checkpoint_step);
        model_file_read_params(path, &cfg, params);
    }
    attention_setup(ATTENTION_CUDNN);
    GPT2 model;
    gpt2_build(&model, &cfg, params, 1, B, T, recompute, gelu_fusion);
    DataLoader loader;
    dataloader_init(&loader, SHARD_PATH, B, T, 0, 1, 0, cfg.vocab_size);
    int start = resume ? load_state(&model, &loader, checkpoint_dir, checkpoint_step) : 0;
    OptimizerConfig opt = {0.9f, 0.95f, 1e-8f, 0.1f, 1.0f};
    RunRecord rec;
    memset(&rec, 0, sizeof(rec));
    for (int step = start; step < steps; step++) {
        rec.losses[step] = gpt2_train_step(&model, &loader, 1, 0, &opt, 6e-4f, step, stream).loss;
        if (!resume && checkpoint_dir != NULL && step + 1 == checkpoint_step) { save_checkpoint(&model, &loader, checkpoint_dir, step + 1); }
    }
    cudaCheck(cudaStreamSynchronize(stream));
    rec.weights = bf16_device_to_float(model.params, model.num_parameters);
    free(params);
    dataloader_free(&loader);
    gpt2_free(&model);
    attention_teardown();
    return rec;
}

static int same_bits(const float* a, const float* b, size_t n) { return memcmp(a, b, n * sizeof(float)) == 0; }

int main(void) {
    ensure_writable_dir("build");
    GPT2Config d12 = gpt2_config_from_descriptor("d12");
    size_t n = gpt2_num_parameters(&d12);
    write_random_shard(SHARD_PATH, 40 * B * T + 1, d12.vocab_size);
    cudaStream_t stream;
    cudaCheck(cudaStreamCreate(&stream));
    matmul_setup();

    test_forward_backward_vs_reference(ATTENTION_CUDNN, "cudnn", stream);
    test_forward_backward_vs_reference(ATTENTION_FALLBACK, "fallback", stream);
    test_training_trajectory_vs_reference(stream);

    RunRecord a = train_run(10, 1, 1, NULL, 0, 0, stream);
    RunRecord b = train_run(10, 1, 1, NULL, 0, 0, stream);
    CHECK(memcmp(a.losses, b.losses, sizeof(a.losses)) == 0, "two identical runs: losses differ");
    CHECK(same_bits(a.weights, b.weights, n), "two identical runs: final weights differ");

    // recompute reruns the forward's own kernels: -r 1 vs -r 2 always, -r 0 vs -r 1 with -ge 0
    // (with -ge 1 the forward's GELU is cuBLASLt's epilogue, the recompute llm8's kernel)
    RunRecord r1 = train_run(3, 1, 1, NULL, 0, 0, stream);
    RunRecord r2 = train_run(3, 2, 1, NULL, 0, 0, stream);
    CHECK(memcmp(r1.losses, r2.losses, 3 * sizeof(float)) == 0, "-r 1 vs -r 2: losses differ");
    CHECK(same_bits(r1.weights, r2.weights, n), "-r 1 vs -r 2: final weights differ");
    RunRecord r0_unfused = train_run(3, 0, 0, NULL, 0, 0, stream);
    RunRecord r1_unfused = train_run(3, 1, 0, NULL, 0, 0, stream);
    CHECK(memcmp(r0_unfused.losses, r1_unfused.losses, 3 * sizeof(float)) == 0, "-r 0 vs -r 1 (-ge 0): losses differ");
    CHECK(same_bits(r0_unfused.weights, r1_unfused.weights, n), "-r 0 vs -r 1 (-ge 0): final weights differ");

    const char* dir = "build/test_gpt2_ckpt";
    ensure_writable_dir(dir);
    RunRecord straight = train_run(10, 1, 1, dir, 5, 0, stream);
    RunRecord resumed = train_run(10, 1, 1, dir, 5, 1, stream);
    CHECK(memcmp(straight.losses + 5, resumed.losses + 5, 5 * sizeof(float)) == 0, "resume: losses of steps 6..10 differ");
    CHECK(same_bits(straight.weights, resumed.weights, n), "resume: final weights differ");
    CHECK(same_bits(straight.weights, a.weights, n), "the checkpointing run differs from a plain run");

    free(a.weights); free(b.weights); free(r1.weights); free(r2.weights); free(r0_unfused.weights); free(r1_unfused.weights); free(straight.weights); free(resumed.weights);
    matmul_teardown();
    cudaCheck(cudaStreamDestroy(stream));
    return test_summary("test_gpt2");
}
