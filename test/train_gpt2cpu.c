/*
train_gpt2cpu.c: trains GPT-2 on the CPU with the fp32 reference model (test/gpt2_ref.h).

Why: a machine without a GPU (CI, a laptop) can still run the whole pipeline end to end:
the same flag table, data loader, learning-rate schedules, logs and checkpoint/resume code
as train_gpt2_fp8, on a tiny model. It is the README's first command where no GPU is found,
and the end-to-end tests drive it. Flags that only mean something on a GPU (-p, -at, -r,
-ge, -kt) are accepted and have no effect here; the model trains in fp32 and checkpoints
as llm.c's fp32 model files (version 3).
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <time.h>
#include "llmc/utils.h"          // fail-fast I/O
#include "llmc/gpt2_config.h"    // config, parameter layout, random init
#include "llmc/train_config.h"   // the command line shared with train_gpt2_fp8
#include "llmc/dataloader.h"     // llm.c token shards
#include "llmc/checkpoint.h"     // model/state files, DONE markers
#include "llmc/schedulers.h"     // learning-rate schedules
#include "llmc/logger.h"         // main.log + main.jsonl
#include "test/gpt2_ref.h"       // the fp32 CPU model

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static float cpu_val_loss(GPT2Ref* model, DataLoader* loader, int batches, int B, int T) {
    dataloader_reset(loader);
    double sum = 0.0;
    for (int i = 0; i < batches; i++) {
        dataloader_next_batch(loader);
        sum += gpt2ref_forward(model, loader->inputs, loader->targets, B, T);
    }
    return (float)(sum / batches);
}

static void cpu_save_checkpoint(const GPT2Ref* model, const DataLoader* loader, const char* dir, int step) {
    char path[CHECKPOINT_PATH_MAX];
    checkpoint_model_path(path, sizeof(path), dir, step);
    model_file_write(path, &model->config, model->params, 3);
    TrainState state = {step, 0, 0};
    StateBuffers buffers = {model->num_parameters, model->adam_m, model->adam_v, NULL, NULL, 0};
    checkpoint_state_path(path, sizeof(path), dir, step, 0);
    state_file_write(path, &state, &buffers, loader);
    checkpoint_write_done(dir, step);
}

int main(int argc, char** argv) {
    TrainConfig tc = train_config_defaults();
    tc.model = "tiny";
    train_config_parse(&tc, argc, argv);
    const char* out_dir = tc.output_log_dir[0] ? tc.output_log_dir : NULL;
    if (out_dir != NULL) { ensure_writable_dir(out_dir); }

    char model_path[CHECKPOINT_PATH_MAX] = "";
    int resume_step = tc.resume ? checkpoint_find_latest(out_dir) : -1;
    if (resume_step >= 0) { checkpoint_model_path(model_path, sizeof(model_path), out_dir, resume_step); }
    else if (strstr(tc.model, ".bin") != NULL) { snprintf(model_path, sizeof(model_path), "%s", tc.model); }
    GPT2Config cfg;
    int model_version = 0;
    if (model_path[0]) { model_file_read_header(model_path, &cfg, &model_version); }
    else { cfg = gpt2_config_from_descriptor(tc.model); }
    int grad_accum_steps = train_config_check_batch(&tc, &cfg, 1);

    DataLoader train_loader, val_loader;
    dataloader_init(&train_loader, tc.train_data_pattern, tc.B, tc.T, 0, 1, tc.shuffle, cfg.vocab_size);
    int run_val = tc.val_data_pattern[0] != '\0' && tc.val_every > 0;
    if (run_val) { dataloader_init(&val_loader, tc.val_data_pattern, tc.B, tc.T, 0, 1, 0, cfg.vocab_size); }
    int num_steps = tc.max_steps;
    if (num_steps == -1) {
        num_steps = (int)(train_loader.num_tokens / (size_t)tc.total_batch_size);
        if (num_steps < 1) { num_steps = 1; }
    }
    LearningRateScheduler scheduler;
    lr_scheduler_init(&scheduler, tc.lr_schedule, tc.learning_rate, tc.warmup_iterations, num_steps, tc.final_lr_frac);

    size_t n = gpt2_num_parameters(&cfg);
    float* params = (float*)mallocCheck(n * sizeof(float));
    if (model_path[0]) { model_file_read_params(model_path, &cfg, params); }
    else { gpt2_init_params_random(params, &cfg, GPT2_INIT_SEED); }
    GPT2Ref model;
    gpt2ref_init(&model, &cfg, params);
    free(params);
    int start_step = 0;
    if (resume_step >= 0) {
        char state_path[CHECKPOINT_PATH_MAX];
        checkpoint_state_path(state_path, sizeof(state_path), out_dir, resume_step, 0);
        TrainState state;
        StateBuffers buffers = {model.num_parameters, model.adam_m, model.adam_v, NULL, NULL, 0};
        state_file_read(state_path, &state, &buffers, &train_loader);
        start_step = state.step;
        printf("resumed from %s at step %d\n", model_path, start_step);
    }
    Logger logger;
    logger_init(&logger, out_dir, 0, resume_step >= 0);

    printf("train_gpt2cpu | L=%d NH=%d C=%d V=%d | %zu parameters | B=%d T=%d, %d micro-steps | %d steps | lr %g (%s)\n",
           cfg.num_layers, cfg.num_heads, cfg.channels, cfg.vocab_size, n, tc.B, tc.T, grad_accum_steps, num_steps,
           tc.learning_rate, tc.lr_schedule);

    for (int step = start_step; step <= num_steps; step++) {
        int last_step = step == num_steps;
        if (run_val && (step % tc.val_every == 0 || last_step)) {
            float val_loss = cpu_val_loss(&model, &val_loader, tc.val_max_steps, tc.B, tc.T);
            printf("val loss %f\n", val_loss);
            logger_log_val(&logger, step, val_loss);
        }
        if (out_dir != NULL && tc.checkpoint_every > 0 && step > start_step && (step % tc.checkpoint_every == 0 || last_step)) {
            cpu_save_checkpoint(&model, &train_loader, out_dir, step);
        }
        if (last_step) { break; }

        double t0 = now_seconds();
        gpt2ref_zero_grad(&model);
        double loss_sum = 0.0;
        for (int micro = 0; micro < grad_accum_steps; micro++) {
            if (tc.overfit_single_batch == 0 || (step == 0 && micro == 0)) { dataloader_next_batch(&train_loader); }
            loss_sum += gpt2ref_forward(&model, train_loader.inputs, train_loader.targets, tc.B, tc.T);
            gpt2ref_backward(&model, grad_accum_steps);
        }
        float loss = (float)(loss_sum / grad_accum_steps);
        float lr = get_learning_rate(&scheduler, step);
        int skipped = !isfinite(loss);
        float norm = skipped ? NAN : gpt2ref_adamw_update(&model, lr, 0.9f, 0.95f, 1e-8f, tc.weight_decay, step + 1, tc.grad_clip);
        skipped = skipped || !isfinite(norm);
        double ms = (now_seconds() - t0) * 1000.0;
        double tok_per_s = tc.total_batch_size / (ms / 1000.0);
        printf("step %4d/%d | loss %.6f | norm %.4f | lr %.2e | %.1f ms | %.0f tok/s%s\n", step + 1, num_steps, loss, norm, lr,
               ms, tok_per_s, skipped ? " | SKIPPED (non-finite)" : "");
        logger_log_train(&logger, step + 1, loss, lr, norm, (float)ms, (float)tok_per_s, 0.0f, skipped);
    }
    logger_free(&logger);
    gpt2ref_free(&model);
    dataloader_free(&train_loader);
    if (run_val) { dataloader_free(&val_loader); }
    return 0;
}
