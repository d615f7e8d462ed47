/*
train_gpt2cpu.c: trains GPT-2 on the CPU with the fp32 reference model (test/gpt2_ref.h).

Why: a machine without a GPU (CI, a laptop) can still run the whole pipeline end to end:
the same flag table, data loader, learning-rate schedules, logs and checkpoint/resume code
as train_gpt2_fp8, on a tiny model. It is the README's first command where no GPU is found,
and the end-to-end tests drive it. The numerical choices run through the reference's own
versions of them: -p fp8 through its FP8 emulation (quantize-dequantize at the points the
GPU casts, with the -fr -fh -fm -fw -fg -f8 -f8p settings; the scaling states go into the state
file, and evaluation puts them back, as on the GPU), and -opt adamw8 through the 8-bit
AdamW host reference (llmc/quant8.h) with the GPU trainer's state-file sections and
conversions. Flags that only mean something on a GPU, with several processes (-pn above 1 is
refused) or with a tokenizer and text are accepted, with any value the flag table allows (-z 2
and -ad 0 included, which the GPU trainer refuses), and have no effect here:
CPU_FLAGS_WITHOUT_EFFECT lists them, --help marks them, and one moved off its default gets a
note at startup (a run could be taken for one that measured HellaSwag, or an llm.c user wait
for -s's samples). A -tk given must still exist, as for the GPU trainer, so that a command
line checked here runs there; -n, -nk and -nm write and prune checkpoints as on the GPU.
Weights are fp32 and checkpoints are llm.c's fp32 model files (version 3).
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <time.h>
#include "llmc/utils.h"          // fail-fast I/O
#include "llmc/gpt2_config.h"    // config, parameter layout, random init
#include "llmc/train_config.h"   // the command line shared with train_gpt2_fp8, resume of either optimizer's state
#include "llmc/dataloader.h"     // llm.c token shards
#include "llmc/checkpoint.h"     // model/state files, DONE markers
#include "llmc/train_state.h"    // resume into either optimizer
#include "llmc/schedulers.h"     // learning-rate schedules
#include "llmc/logger.h"         // main.log + main.jsonl
#include "llmc/outlier_skip.h"   // -sl / -sg: skip an update whose loss or gradient norm is an outlier
#include "llmc/quant8.h"         // 8-bit AdamW (-opt adamw8), host reference
#include "test/gpt2_ref.h"       // the fp32 CPU model, with FP8 emulation

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

// ----------------------------------------------------------------------------
// FP8 (-p fp8): the reference's emulation, with the flags' settings

// the number of FP8 states gpt2ref_set_fp8_emulation keeps: 4 linears a layer and lm_head
static size_t cpu_fp8_num_linears(const GPT2Ref* model) { return 4 * (size_t)model->config.num_layers + 1; }

#define CPU_FP8_SECTIONS 2

// the state-file sections of the FP8 emulation: its settings and every linear's scaling
// (0 sections in an fp32 run); config receives the file's settings on read
static int cpu_fp8_state_sections(GPT2Ref* model, Fp8Emulation* config, StateSection sections[CPU_FP8_SECTIONS]) {
    if (model->fp8_linears == NULL) { return 0; }
    *config = model->fp8_config;
    StateSection list[CPU_FP8_SECTIONS] = {
        {"fp8emu_config", config, sizeof(*config), 0},
        {"fp8emu_linears", model->fp8_linears, cpu_fp8_num_linears(model) * sizeof(Fp8LinearState), 0},
    };
    memcpy(sections, list, sizeof(list));
    return CPU_FP8_SECTIONS;
}

// val loss; with FP8 emulation the scaling states are put back afterwards, so evaluating
// never changes training (as fp8_model_begin_eval / end_eval do on the GPU)
static float cpu_val_loss(GPT2Ref* model, DataLoader* loader, int batches, int B, int T) {
    size_t fp8_bytes = model->fp8_linears != NULL ? cpu_fp8_num_linears(model) * sizeof(Fp8LinearState) : 0;
    Fp8LinearState* saved = NULL;
    if (fp8_bytes > 0) {
        saved = (Fp8LinearState*)mallocCheck(fp8_bytes);
        memcpy(saved, model->fp8_linears, fp8_bytes);
    }
    dataloader_reset(loader);
    double sum = 0.0;
    for (int i = 0; i < batches; i++) {
        dataloader_next_batch(loader);
        sum += gpt2ref_forward(model, loader->inputs, loader->targets, B, T);
    }
    if (fp8_bytes > 0) {
        memcpy(model->fp8_linears, saved, fp8_bytes);
        free(saved);
    }
    return (float)(sum / batches);
}

// a skipped step leaves no trace in the FP8 scaling (fp8_scaling_restore, as
// fp8_model_discard_step on the GPU): each state as it was before the step, all but its
// non-finite count; the linears' last-cast statistics keep what the step saw
static void cpu_fp8_discard_step(GPT2Ref* model, const Fp8LinearState* before) {
    if (model->fp8_linears == NULL) { return; }
    for (size_t i = 0; i < cpu_fp8_num_linears(model); i++) {
        for (int operand = 0; operand < FP8_NUM_OPERANDS; operand++) {
            fp8_scaling_restore(&model->fp8_linears[i].scaling[operand], &before[i].scaling[operand]);
        }
    }
}

// ----------------------------------------------------------------------------
// the optimizer: fp32 AdamW in the model (adam_m, adam_v), or adamw8's host states

typedef struct {
    int use_adamw8;
    Adamw8Selection selection;
    Adamw8Layout layout;
    Adamw8States states;  // allocated with -opt adamw8 only
    Quant8Maps maps;
} CpuOptimizer;

static void cpu_optimizer_init(CpuOptimizer* opt, const GPT2Config* cfg, const TrainConfig* tc) {
    memset(opt, 0, sizeof(*opt));
    opt->use_adamw8 = train_config_uses_adamw8(tc);
    opt->selection = adamw8_selection_from_name(tc->adamw8_states, "-qs");
    adamw8_layout_init(&opt->layout, cfg, opt->selection);
    if (opt->use_adamw8) { adamw8_states_alloc_host(&opt->states, &opt->layout); }
    quant8_maps_init(&opt->maps);
}

static void cpu_optimizer_free(CpuOptimizer* opt) {
    if (opt->use_adamw8) { adamw8_states_free_host(&opt->states); }
}

// the update of a step judged to make one (outlier_skip_judge), with llm.c's clipping
static void cpu_optimizer_step(CpuOptimizer* opt, GPT2Ref* model, float lr, float weight_decay, int t, float grad_clip) {
    const float beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f;
    if (!opt->use_adamw8) {
        gpt2ref_adamw_update(model, lr, beta1, beta2, eps, weight_decay, t, grad_clip);
        return;
    }
    float norm = gpt2ref_global_norm(model);
    float grad_scale = (grad_clip > 0.0f && norm > grad_clip) ? grad_clip / norm : 1.0f;
    adamw8_model_update_fp32(&opt->layout, &opt->states, &opt->maps, model->params, model->grads, lr, beta1, beta2, eps,
                             weight_decay, t, grad_scale);
    gpt2ref_fp8_weights_updated(model);  // as gpt2ref_adamw_update does: the delayed FP8 weights' part of the step
}

// ----------------------------------------------------------------------------
// checkpoints: the GPU trainer's state-file sections for the optimizer, and the emulation's

static void cpu_save_checkpoint(GPT2Ref* model, CpuOptimizer* opt, const DataLoader* loader, OutlierSkip* outliers,
                                const char* dir, int step, int total_batch_size) {
    char path[CHECKPOINT_PATH_MAX];
    checkpoint_remove(dir, step);  // a step written before (a resumed run's), leftovers
    checkpoint_model_path(path, sizeof(path), dir, step);
    model_file_write(path, &model->config, model->params, 3);
    StateSection sections[CPU_FP8_SECTIONS + OUTLIER_SKIP_SECTIONS];
    Fp8Emulation fp8_config;
    int num_sections = cpu_fp8_state_sections(model, &fp8_config, sections);
    num_sections += outlier_skip_state_sections(outliers, 0, sections + num_sections);
    checkpoint_state_path(path, sizeof(path), dir, step, 0);
    // 8-bit states in sections, no fp32 m and v (doc/adamw8.md); plain AdamW: llm.c's m and v
    train_state_write(path, step, total_batch_size, loader, &opt->layout, opt->use_adamw8, model->adam_m, model->adam_v,
                      &opt->states, NULL, sections, num_sections);
    checkpoint_write_done(dir, step);
}

// restores the optimizer (converting a file of the other optimizer), the FP8 scaling, the
// data position (batches_per_step: train_state_read's) and the -sl / -sg windows (when the
// file has them); returns the step. A file with fp32 master weights (a GPU run's, -w 1; the CPU
// trainer has no bf16 weights, so no -w) gives the weights: the model file holds them rounded
// to bf16
// path: the state file of the checkpoint whose model file is model_path (named in the errors)
static int cpu_load_state(GPT2Ref* model, CpuOptimizer* opt, DataLoader* loader, OutlierSkip* outliers, const char* path,
                          const char* model_path, int step, size_t batches_per_step) {
    StateSection sections[CPU_FP8_SECTIONS + OUTLIER_SKIP_SECTIONS];
    Fp8Emulation fp8_config;
    memset(&fp8_config, 0, sizeof(fp8_config));
    int fp8_sections = cpu_fp8_state_sections(model, &fp8_config, sections);
    int num_sections = fp8_sections + outlier_skip_state_sections(outliers, 1, sections + fp8_sections);  // optional
    StateFileIndex header;
    state_file_read_header(path, &header);
    if (header.num_processes > 1) {  // train_gpt2_fp8 reshards those (state_reshard.h); this trainer reads its own only
        llm8_die("state file '%s' is one of %d ranks' (train_gpt2_fp8's): train_gpt2cpu resumes one-process checkpoints; "
                 "resume it with train_gpt2_fp8 (on any number of GPUs), or start from its weights with -e %s", path,
                 header.num_processes, model_path);
    }
    float* master = header.has_master ? (float*)mallocCheck(model->num_parameters * sizeof(float)) : NULL;
    step = train_state_read(path, step, batches_per_step, loader, &model->config, opt->use_adamw8, opt->selection, 0,
                            model->num_parameters, model->adam_m, model->adam_v, &opt->states, master, sections,
                            num_sections);
    if (master != NULL) {
        memcpy(model->params, master, model->num_parameters * sizeof(float));
        free(master);
        printf("%s: the weights are its fp32 master weights\n", path);
    }
    outlier_skip_check_loaded(outliers, path);
    if (fp8_sections > 0) {
        Fp8Settings saved = fp8_settings_from_emulation(&fp8_config), run = fp8_settings_from_emulation(&model->fp8_config);
        Fp8SettingsDifference difference = fp8_settings_difference(&saved, &run);
        if (difference.text[0] != '\0') {
            fp8_refuse_resume(path, &difference);
        }
    }
    gpt2ref_check_loaded_fp8(model, path);
    return step;
}

// the flags this trainer accepts and ignores (the header comment says why), marked in its --help
static const char CPU_FLAGS_WITHOUT_EFFECT[] =
    "-at -ad -r -ge -kt -lg -z -fn -fe -w -f "  // GPU kernels (-f: TF32), timing and memory
    "-pr -pg -pi -pf -ps -pa -pt -pc "          // several processes
    "-tk -s -g -h";                             // a tokenizer and text

int main(int argc, char** argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);  // each progress line reaches a pipe or file (tee, nohup) as it is printed
    TrainConfig tc = train_config_defaults();
    tc.model = "tiny";
    tc.sample_every = 0;  // no sampler here
    tc.flags_without_effect = CPU_FLAGS_WITHOUT_EFFECT;
    const TrainConfig cpu_defaults = tc;
    train_config_parse(&tc, argc, argv);
    char tokenizer_path[CHECKPOINT_PATH_MAX];
    train_config_tokenizer_path(&tc, tokenizer_path, sizeof(tokenizer_path));  // a -tk given must exist (unused here)
    if (tc.num_processes > 1) { llm8_die("flag -pn %d: the CPU trainer runs one process (several GPUs: train_gpt2_fp8)", tc.num_processes); }
    const char* out_dir = tc.output_log_dir[0] ? tc.output_log_dir : NULL;
    checkpoint_claim_dir(out_dir, 0, tc.resume);

    char model_path[CHECKPOINT_PATH_MAX] = "";
    int resume_step = tc.resume ? checkpoint_resume_step(out_dir) : -1;
    if (resume_step >= 0) { checkpoint_model_path(model_path, sizeof(model_path), out_dir, resume_step); }
    else { train_config_model_file(&tc, model_path, sizeof(model_path)); }
    GPT2Config cfg;
    int model_version = 0;
    if (model_path[0]) { model_file_read_header(model_path, &cfg, &model_version); }
    else { cfg = gpt2_config_from_descriptor(tc.model); }
    if (resume_step >= 0) { train_config_note_resumed_model(&tc, &cfg, model_path); }
    train_config_note_flags_without_effect(&tc, &cpu_defaults, "train_gpt2cpu");
    int grad_accum_steps = train_config_check_batch(&tc, &cfg, 1);
    Fp8Settings fp8_settings = train_config_fp8_settings(&tc);

    DataLoader train_loader, val_loader;
    int val_batches;
    int run_val = train_config_open_data(&tc, cfg.vocab_size, 0, 1, &train_loader, &val_loader, &val_batches);
    int num_steps = tc.max_steps == -1 ? dataloader_epoch_steps(&train_loader, grad_accum_steps) : tc.max_steps;
    LearningRateScheduler scheduler;
    lr_scheduler_init(&scheduler, tc.lr_schedule, tc.learning_rate, tc.warmup_iterations, num_steps, tc.final_lr_frac);
    train_config_note_schedule(&tc);
    train_config_note_unused_fp8_flags(&tc);
    train_config_note_idle_fp8_tuning(&tc);

    size_t n = gpt2_num_parameters(&cfg);
    float* params = (float*)mallocCheck(n * sizeof(float));
    if (model_path[0]) { model_file_read_params(model_path, &cfg, params); }
    else { gpt2_init_params_random(params, &cfg, GPT2_INIT_SEED); }
    GPT2Ref model;
    gpt2ref_init(&model, &cfg, params);
    free(params);
    if (fp8_settings.enabled) {
        Fp8Emulation emulation = fp8_emulation_from_settings(&fp8_settings);
        gpt2ref_set_fp8_emulation(&model, &emulation);
    }
    CpuOptimizer optimizer;
    cpu_optimizer_init(&optimizer, &cfg, &tc);
    int start_step = 0;
    OutlierSkip outliers;  // -sl / -sg, their windows restored with the state
    outlier_skip_init(&outliers, tc.skip_loss_z, tc.skip_norm_z);
    if (resume_step >= 0) {
        char state_path[CHECKPOINT_PATH_MAX];
        checkpoint_state_path(state_path, sizeof(state_path), out_dir, resume_step, 0);
        start_step = cpu_load_state(&model, &optimizer, &train_loader, &outliers, state_path, model_path, resume_step,
                                    tc.overfit_single_batch ? 0 : (size_t)grad_accum_steps);  // -a 1 reads no batches
        printf("resumed from %s at step %d\n", model_path, start_step);
        train_state_note_total_batch(state_path, tc.total_batch_size, grad_accum_steps);
        outlier_skip_note_resume(&outliers, resume_step);
        if (start_step >= num_steps) {
            printf("note: -y 1 resumed at step %d, and the run has %d steps (-x): nothing left to train\n", start_step,
                   num_steps);
        }
    }
    Logger logger;
    logger_init(&logger, out_dir, 0, resume_step >= 0);

    printf("train_gpt2cpu | L=%d NH=%d C=%d V=%d | %zu parameters | B=%d T=%d, %d micro-steps | %d steps | lr %g (%s, "
           "warmup %d, final frac %g)\n", cfg.num_layers, cfg.num_heads, cfg.channels, cfg.vocab_size, n, tc.B, tc.T,
           grad_accum_steps, num_steps, tc.learning_rate, tc.lr_schedule, tc.warmup_iterations, tc.final_lr_frac);
    int eight_bit_tensors = 0;
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) { eight_bit_tensors += optimizer.layout.bits[i] == 8; }
    char fp8_passes[256] = "";
    if (fp8_settings.enabled) {
        int block = fp8_settings.recipe == FP8_MODEL_BLOCK;
        snprintf(fp8_passes, sizeof(fp8_passes), ", weights %s, gradients %s, passes ",
                 block ? "128x128 blocks" : FP8_SCALING_CHOICE_NAMES[fp8_settings.weight_scaling],
                 block ? "1x128 tiles" : FP8_SCALING_CHOICE_NAMES[fp8_settings.grad_scaling]);
        fp8_passes_text(fp8_passes + strlen(fp8_passes), sizeof(fp8_passes) - strlen(fp8_passes), fp8_settings.passes);
        fp8_tuning_text(fp8_passes + strlen(fp8_passes), sizeof(fp8_passes) - strlen(fp8_passes), &fp8_settings);
    }
    printf("precision %s%s%s | optimizer %s", fp8_settings.enabled ? "fp8 emulated, recipe " : "fp32",
           fp8_settings.enabled ? FP8_MODEL_RECIPE_NAMES[fp8_settings.recipe] : "", fp8_passes, tc.optimizer);
    if (optimizer.use_adamw8) {
        printf(" (-qs %s: 8-bit states for %d of %d tensors)", tc.adamw8_states, eight_bit_tensors, NUM_PARAMETER_TENSORS);
    }
    printf("\n");

    if (tc.overfit_single_batch) { dataloader_fill_first_batch(&train_loader, tc.train_data_pattern); }  // -a 1's batch
    outlier_skip_print_settings(&outliers);
    size_t step_fp8_bytes = model.fp8_linears != NULL ? cpu_fp8_num_linears(&model) * sizeof(Fp8LinearState) : 0;
    Fp8LinearState* step_fp8_before = step_fp8_bytes > 0 ? (Fp8LinearState*)mallocCheck(step_fp8_bytes) : NULL;
    for (int step = start_step; step <= num_steps; step++) {
        int last_step = step == num_steps;
        if (run_val && (step % tc.val_every == 0 || last_step)) {
            float val_loss = cpu_val_loss(&model, &val_loader, val_batches, tc.B, tc.T);
            printf("val loss %f\n", val_loss);
            logger_log_val(&logger, step, val_loss);
        }
        if (out_dir != NULL && tc.checkpoint_every > 0 && step > start_step && (step % tc.checkpoint_every == 0 || last_step)) {
            cpu_save_checkpoint(&model, &optimizer, &train_loader, &outliers, out_dir, step, tc.total_batch_size);
            checkpoint_keep_newest(out_dir, tc.checkpoints_keep, tc.checkpoints_major_every);
        }
        if (last_step) { break; }

        double t0 = now_seconds();
        if (step_fp8_before != NULL) { memcpy(step_fp8_before, model.fp8_linears, step_fp8_bytes); }
        gpt2ref_zero_grad(&model);
        double loss_sum = 0.0;
        for (int micro = 0; micro < grad_accum_steps; micro++) {
            if (!tc.overfit_single_batch) { dataloader_next_batch(&train_loader); }
            loss_sum += gpt2ref_forward(&model, train_loader.inputs, train_loader.targets, tc.B, tc.T);
            gpt2ref_backward(&model, grad_accum_steps);
        }
        float loss = (float)(loss_sum / grad_accum_steps);
        float lr = get_learning_rate(&scheduler, step);
        float norm = isfinite(loss) ? gpt2ref_global_norm(&model) : NAN;
        double z;
        StepOutcome outcome = outlier_skip_judge(&outliers, loss, norm, &z);  // non-finite, -sl, -sg
        int skipped = outcome != STEP_UPDATED;
        if (skipped) {
            outlier_skip_print(step + 1, outcome, loss, norm, z, &outliers);
            cpu_fp8_discard_step(&model, step_fp8_before);
        } else {
            cpu_optimizer_step(&optimizer, &model, lr, tc.weight_decay, step + 1, tc.grad_clip);
        }
        double ms = (now_seconds() - t0) * 1000.0;
        double tok_per_s = tc.total_batch_size / (ms / 1000.0);
        printf("step %4d/%d | loss %.6f | norm %.4f | lr %.2e | %.1f ms | %.0f tok/s%s\n", step + 1, num_steps, loss, norm, lr,
               ms, tok_per_s, skipped ? " | SKIPPED" : "");
        logger_log_train(&logger, step, loss, lr, norm, (float)ms, (float)tok_per_s, 0.0f, skipped);
    }
    outlier_skip_print_summary(&outliers);
    free(step_fp8_before);
    logger_free(&logger);
    cpu_optimizer_free(&optimizer);
    gpt2ref_free(&model);
    dataloader_free(&train_loader);
    if (run_val) { dataloader_free(&val_loader); }
    return 0;
}
