/*
train_config.h: the trainers' command line: every flag, its default, its range and its help
text, in ONE table.

Why: llm.c users carry their command lines over, so the letters follow llm.c. Keeping the
parser, the range checks and --help in a single table means a flag cannot exist without
its help line and its range check, and the GPU trainer and the CPU trainer
(train_gpt2cpu) share the same parsing, so the bad-input tests run without a GPU. All
checks here happen before any GPU work starts: a bad command line fails in milliseconds
with one line naming the flag, the value and what was expected.

The resume logic both trainers share (reading a state file's optimizer state in the form
-opt asks for, converting between fp32 and 8-bit moments, and refusing by naming -qs a file
whose 8-bit states were kept for other tensors) is in train_state.h.
*/
#ifndef LLMC_TRAIN_CONFIG_H
#define LLMC_TRAIN_CONFIG_H

#include <glob.h>
#include <limits.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <stdio.h>
#include "utils.h"
#include "gpt2_config.h"
#include "fp8_recipe.h"
#include "quant8.h"
#include "dataloader.h"

typedef struct {
    const char* train_data_pattern;
    const char* val_data_pattern;
    const char* model;            // descriptor (d12...) or a model_*.bin checkpoint
    const char* output_log_dir;   // NULL: no logs, no checkpoints
    const char* tokenizer_path;
    const char* precision;        // bf16 | fp8
    const char* lr_schedule;
    const char* attention;        // cudnn | fallback
    int attention_deterministic;  // -at cudnn: its deterministic backward (1) or the one with float atomics (0)
    const char* fp8_recipe;       // delayed | current | block
    const char* fp8_linears;      // comma list of LINEAR_KIND_NAMES, or all
    const char* fp8_passes;       // comma list of FP8_PASS_NAMES, <linear>.<pass> items, or all (fp8_parse_passes)
    const char* fp8_weight_scaling; // current | delayed (fp8_recipe.h)
    const char* fp8_grad_scaling;   // current | delayed (fp8_recipe.h)
    const char* optimizer;        // adamw | adamw8
    const char* adamw8_states;    // which tensors keep 8-bit states: default | all | none (quant8.h)
    int fp8_history;
    int fp8_margin;
    int fp8_numerics_every;
    int fp8_fc_writes_codes;      // -fe: fc's forward GEMM writes fcproj's input codes (fp8_recipe.h)
    int checkpoint_every;
    int checkpoints_keep;
    int checkpoints_major_every;  // -nm: checkpoints of steps that are multiples of this are never removed by -nk
    int resume;
    int B;
    int T;
    int total_batch_size;
    float learning_rate;
    int warmup_iterations;
    float final_lr_frac;
    float weight_decay;
    float grad_clip;
    float skip_loss_z;            // -sl: skip an update whose loss z-score is above this (0: off; outlier_skip.h)
    float skip_norm_z;            // -sg: the same for the gradient norm
    int max_steps;
    int val_every;
    int val_max_steps;
    int sample_every;
    int gen_tokens;
    int hellaswag;
    int overfit_single_batch;
    int use_master_weights;
    int llmc_tf32;                // -f: llm.c's TF32 switch, accepted for its command lines (no matmul here is fp32)
    int recompute;
    int gelu_fusion;
    int zero_stage;
    int shuffle;
    int kernel_timing;
    int num_processes;            // -pn (mpirun: from MPI)
    int process_rank;             // -pr
    int gpus_per_node;            // -pg, 0: all visible
    const char* nccl_init;        // -pi: auto | mpi | fs | tcp
    const char* grad_reduce;      // -pa: bf16 | fp32, the gradients' type in the reduce across GPUs
    const char* nccl_fs_path;     // -pf
    const char* nccl_server;      // -ps
    int nccl_timeout_s;           // -pt
    int replica_check_every;      // -pc
    int log_gpu_every;            // -lg: the GPU's clock, power and temperature every N steps (0 or -1: off; gpu_monitor.h)
    const char* flags_without_effect;  // not a flag: the program's list (space-separated) of the flags it accepts and
                                       // ignores, marked in its --help (train_gpt2cpu's GPU-only ones; NULL: none)
} TrainConfig;

typedef enum { FLAG_INT, FLAG_FLOAT, FLAG_STRING, FLAG_CHOICE } FlagKind;

typedef struct {
    const char* name;
    FlagKind kind;
    size_t offset;
    double lo, hi;          // FLAG_INT / FLAG_FLOAT range
    const char* choices;    // FLAG_CHOICE: space-separated list
    const char* help;
} FlagSpec;

#define TC_OFF(field) offsetof(TrainConfig, field)
#define INT_MAX_FLAG 2147483647.0

static const FlagSpec TRAIN_FLAGS[] = {
    {"-i", FLAG_STRING, TC_OFF(train_data_pattern), 0, 0, NULL, "train data shard glob"},
    {"-j", FLAG_STRING, TC_OFF(val_data_pattern), 0, 0, NULL, "val data shard glob (\"\" disables val)"},
    {"-e", FLAG_STRING, TC_OFF(model), 0, 0, NULL, "model: tiny|d6|d12|d24|d36|d48|d60|d72|d84 (or llm.c's gpt2:dN), llm.c's gpt3:cN (N channels, T 2048), or a model_*.bin checkpoint"},
    {"-o", FLAG_STRING, TC_OFF(output_log_dir), 0, 0, NULL, "output dir for main.log, main.jsonl and checkpoints (\"\" = none)"},
    {"-tk", FLAG_STRING, TC_OFF(tokenizer_path), 0, 0, NULL, "decode tokenizer file, for text samples (\"\" = the gpt2_tokenizer.bin beside the -i shards, else ./gpt2_tokenizer.bin as in llm.c, else token ids)"},
    {"-p", FLAG_CHOICE, TC_OFF(precision), 0, 0, "bf16 fp8", "matmul precision (the -f flags below apply to fp8; train_gpt2cpu: bf16 trains its fp32 model, fp8 emulates the FP8 casts in it)"},
    {"-fr", FLAG_CHOICE, TC_OFF(fp8_recipe), 0, 0, "delayed current block",
     "fp8 scaling: delayed (activations from an amax history; gradients as -fg says, weights as -fw says), current, or block (1x128/128x128 tiles, all E4M3)"},
    {"-fh", FLAG_INT, TC_OFF(fp8_history), 1, FP8_AMAX_HISTORY_MAX, NULL, "fp8: amax history length of the delayed recipe's activations and of -fg delayed's gradients, in uses (one per forward: a micro-step)"},
    {"-fm", FLAG_INT, TC_OFF(fp8_margin), 0, FP8_MARGIN_MAX, NULL, "fp8 scale margin: per-tensor scales are divided by 2^margin"},
    {"-fw", FLAG_CHOICE, TC_OFF(fp8_weight_scaling), 0, 0, "current delayed",
     "fp8 weight scaling (-fr delayed|current) of the block linears' weights when each FP8 one runs all three GEMMs in FP8: current (cast after the optimizer step, with the new amax) or delayed (cast inside it, with the previous step's amax and the -fm margin); lm_head, and the others, are cast from bf16 after the step, current"},
    {"-fg", FLAG_CHOICE, TC_OFF(fp8_grad_scaling), 0, 0, "current delayed pow2",
     "fp8 output-gradient scaling (-fr delayed|current): current (an amax pass, then the cast: dy read twice, once for attproj and fcproj, whose amax layernorm backward takes), delayed (the cast rides on the bias-gradient pass with an amax history's scale: dy read once) or pow2 (current with the scale rounded down to a power of two: the cast rides on that pass with the last use's scale, and runs again where dy's amax crossed a power of two); an FP8 lm_head's gradient is scaled from its bound |dlogit| <= dloss under all three"},
    {"-f8", FLAG_STRING, TC_OFF(fp8_linears), 0, 0, NULL, "fp8: linears in FP8 (in the passes -f8p gives them), a comma list of qkv,attproj,fc,fcproj,lm_head (or all); the rest stay bf16"},
    {"-f8p", FLAG_STRING, TC_OFF(fp8_passes), 0, 0, NULL, "fp8: GEMM passes in FP8, a comma list of fwd,dgrad,wgrad (for every -f8 linear), <linear>.<pass> (e.g. fc.wgrad: that linear only), or all; the union runs in FP8, the rest in bf16"},
    {"-fe", FLAG_INT, TC_OFF(fp8_fc_writes_codes), 0, 1, NULL,
     "fp8: 1 = fc's forward GEMM writes fcproj's E4M3 input codes itself (cuBLASLt's GELU epilogue, under the delayed scale) and a byte transpose makes x^T, instead of a GELU cast pass over the bf16 pre-activation; needs -fr delayed, fc's forward and fcproj's three GEMMs in FP8, and -r 0"},
    {"-fn", FLAG_INT, TC_OFF(fp8_numerics_every), 0, INT_MAX_FLAG, NULL, "fp8: numerics log (numerics.jsonl in -o) every N steps (0 = never)"},
    {"-opt", FLAG_CHOICE, TC_OFF(optimizer), 0, 0, "adamw adamw8",
     "optimizer: AdamW with fp32 m and v, or adamw8 with 8-bit m and v (doc/adamw8.md); a checkpoint of either resumes under both"},
    {"-qs", FLAG_CHOICE, TC_OFF(adamw8_states), 0, 0, "default all none",
     "adamw8: tensors with 8-bit states: default (>= 4096 elements per layer, not wte/wpe: the matmul weights, and fcb/qkvb where 4C/3C >= 4096), all, none; resume with the -qs the checkpoint was written with"},
    {"-k", FLAG_CHOICE, TC_OFF(lr_schedule), 0, 0, "cosine linear constant wsd", "learning-rate schedule"},
    {"-at", FLAG_CHOICE, TC_OFF(attention), 0, 0, "cudnn fallback", "attention kernels: cuDNN flash attention or llm8's own"},
    {"-ad", FLAG_INT, TC_OFF(attention_deterministic), 0, 1, NULL,
     "-at cudnn's backward: 1 deterministic (runs and resumes repeat bit for bit; it stores dP, B*NH*T*T bf16 a layer, in a workspace), 0 with float atomics (no dP workspace; the last bits vary from run to run)"},
    {"-n", FLAG_INT, TC_OFF(checkpoint_every), 0, INT_MAX_FLAG, NULL, "write a checkpoint every N steps (0 = never)"},
    {"-nk", FLAG_INT, TC_OFF(checkpoints_keep), 0, INT_MAX_FLAG, NULL, "keep only the newest N checkpoints (0 = keep all), and the major ones (-nm)"},
    {"-nm", FLAG_INT, TC_OFF(checkpoints_major_every), 0, INT_MAX_FLAG, NULL, "major checkpoints: those of steps that are multiples of N, which -nk never removes (0 = none)"},
    {"-y", FLAG_INT, TC_OFF(resume), 0, 1, NULL, "resume from the newest complete checkpoint in -o (0: an -o holding checkpoints is refused when -n writes more)"},
    {"-b", FLAG_INT, TC_OFF(B), 1, 65536, NULL, "micro-batch size per GPU (sequences)"},
    {"-t", FLAG_INT, TC_OFF(T), 1, 1048576, NULL, "sequence length"},
    {"-d", FLAG_INT, TC_OFF(total_batch_size), -1, INT_MAX_FLAG, NULL, "total batch in tokens, via gradient accumulation (-1 = B*T times the processes)"},
    {"-l", FLAG_FLOAT, TC_OFF(learning_rate), 0.0, 10.0, NULL, "peak learning rate"},
    {"-u", FLAG_INT, TC_OFF(warmup_iterations), 0, INT_MAX_FLAG, NULL, "learning-rate warmup steps"},
    {"-q", FLAG_FLOAT, TC_OFF(final_lr_frac), 0.0, 1.0, NULL, "final learning rate as a fraction of the peak"},
    {"-c", FLAG_FLOAT, TC_OFF(weight_decay), 0.0, 10.0, NULL, "AdamW weight decay (2D tensors only)"},
    {"-gc", FLAG_FLOAT, TC_OFF(grad_clip), 0.0, 1e6, NULL, "clip the global gradient norm to this (0 = no clipping)"},
    {"-sl", FLAG_FLOAT, TC_OFF(skip_loss_z), 0.0, 1e6, NULL, "skip an update whose loss lies more than this many standard deviations above the previous 128 steps' mean (0 = off)"},
    {"-sg", FLAG_FLOAT, TC_OFF(skip_norm_z), 0.0, 1e6, NULL, "skip an update whose gradient norm lies more than this many standard deviations above the previous 128 steps' mean (0 = off)"},
    {"-x", FLAG_INT, TC_OFF(max_steps), -1, INT_MAX_FLAG, NULL, "number of optimizer steps (-1 = one epoch of the train data, 0 = evaluate only, as llm.c: val loss, and HellaSwag and a sample where -h and -s ask)"},
    {"-v", FLAG_INT, TC_OFF(val_every), 0, INT_MAX_FLAG, NULL, "val loss every N steps (0 = never)"},
    {"-m", FLAG_INT, TC_OFF(val_max_steps), -1, INT_MAX_FLAG, NULL, "val batches per evaluation (-1 = the whole val split; more than it has: all of them, once)"},
    {"-s", FLAG_INT, TC_OFF(sample_every), 0, INT_MAX_FLAG, NULL, "text sample every N steps (0 = never)"},
    {"-g", FLAG_INT, TC_OFF(gen_tokens), 1, INT_MAX_FLAG, NULL, "tokens per text sample, its <|endoftext|> prompt included (llm.c's genT; at most -t)"},
    {"-h", FLAG_INT, TC_OFF(hellaswag), 0, 1, NULL, "HellaSwag accuracy at the val steps after step 0 and at the end (-v 0: at the end)"},
    {"-a", FLAG_INT, TC_OFF(overfit_single_batch), 0, 1, NULL, "overfit a single batch (debugging)"},
    {"-f", FLAG_INT, TC_OFF(llmc_tf32), 0, 1, NULL, "llm.c's TF32 switch, accepted so that llm.c's command lines run: train_gpt2_fp8's matmuls are bf16 or FP8, none fp32, so TF32 never applies and 0 and 1 train alike"},
    {"-w", FLAG_INT, TC_OFF(use_master_weights), 0, 1, NULL, "keep fp32 master weights"},
    {"-r", FLAG_INT, TC_OFF(recompute), 0, 2, NULL, "recompute in backward: 0 none, 1 GELU, 2 GELU+LayerNorm (FP8: the wgrads' x^T of those)"},
    {"-ge", FLAG_INT, TC_OFF(gelu_fusion), 0, 2, NULL, "GELU in the cuBLASLt epilogues (as llm.c's -ge): 0 none, 1 forward (bf16 fc), 2 also backward (fcproj's dgrad times GELU's derivative)"},
    {"-z", FLAG_INT, TC_OFF(zero_stage), 0, 3, NULL, "ZeRO stage with several GPUs (on one GPU 0 and 1 are the same): 1 shards the optimizer state; 3 also the block linears' weights, gathered per layer as FP8 (linears with every pass in FP8) or bf16 (with none)"},
    {"-sh", FLAG_INT, TC_OFF(shuffle), 0, 1, NULL, "shuffle shards and samples each epoch (deterministic)"},
    {"-lg", FLAG_INT, TC_OFF(log_gpu_every), -1, INT_MAX_FLAG, NULL, "every N steps, print the GPU's utilization, SM clock, power, temperature and what holds the clock down (NVML; 0 or -1 = off)"},
    {"-kt", FLAG_INT, TC_OFF(kernel_timing), 0, 1, NULL, "print a per-kernel time breakdown at the end (CUDA events)"},
    {"-pn", FLAG_INT, TC_OFF(num_processes), 1, 4096, NULL, "number of processes, one per GPU (under mpirun: from MPI)"},
    {"-pr", FLAG_INT, TC_OFF(process_rank), 0, 4095, NULL, "this process's rank, 0..-pn minus 1 (under mpirun: from MPI)"},
    {"-pg", FLAG_INT, TC_OFF(gpus_per_node), 0, 1024, NULL, "GPUs per node: rank r uses GPU r % -pg (0 = all visible GPUs); under mpirun and srun the node-local rank stands in for r"},
    {"-pi", FLAG_CHOICE, TC_OFF(nccl_init), 0, 0, "auto mpi fs tcp",
     "how ranks share the NCCL id: mpi, fs (a file in -pf), tcp (rank 0 at -ps); auto = mpi under mpirun, else fs"},
    {"-pf", FLAG_STRING, TC_OFF(nccl_fs_path), 0, 0, NULL, "-pi fs: a directory every rank sees"},
    {"-ps", FLAG_STRING, TC_OFF(nccl_server), 0, 0, NULL, "-pi tcp: rank 0's IPv4 address, a.b.c.d or a.b.c.d:port (port 12345)"},
    {"-pa", FLAG_CHOICE, TC_OFF(grad_reduce), 0, 0, "bf16 fp32",
     "gradient reduce across GPUs: bf16 on the wire, or fp32 (widened, summed in fp32, divided by N, rounded to bf16 once; twice the bytes)"},
    {"-pt", FLAG_INT, TC_OFF(nccl_timeout_s), 1, INT_MAX_FLAG, NULL, "seconds any rank waits for the others before it exits with an error"},
    {"-pc", FLAG_INT, TC_OFF(replica_check_every), 0, INT_MAX_FLAG, NULL, "several GPUs: every N steps (and at the end) check that all ranks hold bitwise identical gathered weights, else exit naming the tensor (0 = never)"},
};
#define NUM_TRAIN_FLAGS ((int)(sizeof(TRAIN_FLAGS) / sizeof(TRAIN_FLAGS[0])))

static inline TrainConfig train_config_defaults(void) {
    TrainConfig c;
    memset(&c, 0, sizeof(c));
    c.train_data_pattern = "dev/data/offline/offline_train_*.bin";
    c.val_data_pattern = "dev/data/offline/offline_val_*.bin";
    c.model = "d12";
    c.output_log_dir = "";
    c.tokenizer_path = "";
    c.precision = "bf16";
    c.lr_schedule = "cosine";
#ifdef LLM8_NO_CUDNN
    c.attention = "fallback";  // a NO_CUDNN=1 build has only llm8's own kernels
#else
    c.attention = "cudnn";
#endif
    c.attention_deterministic = 1;
    c.fp8_recipe = "delayed";
    c.fp8_linears = "qkv,attproj,fc,fcproj";
    c.fp8_passes = "fwd,dgrad,wgrad";
    c.fp8_weight_scaling = "current";
    c.fp8_grad_scaling = "current";
    c.fp8_history = FP8_AMAX_HISTORY_DEFAULT;
    c.fp8_margin = 0;
    c.fp8_numerics_every = 100;
    c.fp8_fc_writes_codes = 0;
    c.optimizer = "adamw";
    c.adamw8_states = "default";
    c.checkpoint_every = 0;
    c.checkpoints_keep = 0;
    c.resume = 0;
    c.B = 4;
    c.T = 1024;
    c.total_batch_size = -1;
    c.learning_rate = 3e-4f;
    c.warmup_iterations = 0;
    c.final_lr_frac = 1.0f;
    c.weight_decay = 0.0f;
    c.grad_clip = 1.0f;
    c.max_steps = -1;
    c.val_every = 20;
    c.val_max_steps = 20;
    c.sample_every = 20;
    c.gen_tokens = 64;
    c.hellaswag = 0;
    c.overfit_single_batch = 0;
    c.use_master_weights = 1;
    c.llmc_tf32 = 1;
    c.recompute = 1;
    c.gelu_fusion = 1;
    c.zero_stage = 1;
    c.shuffle = 1;
    c.kernel_timing = 0;
    c.num_processes = 1;
    c.process_rank = 0;
    c.gpus_per_node = 0;
    c.nccl_init = "auto";
    c.grad_reduce = "bf16";
    c.nccl_fs_path = "";
    c.nccl_server = "";
    c.nccl_timeout_s = 300;
    c.replica_check_every = 0;
    return c;
}

static inline void flag_value_to_text(const FlagSpec* f, const TrainConfig* c, char* buf, size_t n) {
    const char* base = (const char*)c;
    switch (f->kind) {
        case FLAG_INT: snprintf(buf, n, "%d", *(const int*)(base + f->offset)); break;
        case FLAG_FLOAT: {  // %g, or enough digits to tell it from the floats beside it
            float x = *(const float*)(base + f->offset);
            snprintf(buf, n, "%g", x);
            if (strtof(buf, NULL) != x) { snprintf(buf, n, "%.9g", x); }
            break;
        }
        default: {
            const char* s = *(const char* const*)(base + f->offset);
            snprintf(buf, n, "\"%s\"", s ? s : "");
        }
    }
}

// whether word is one of the words of a space-separated list
static inline int list_has_word(const char* list, const char* word) {
    size_t len = strlen(word);
    const char* p = list;
    while (*p) {
        const char* end = strchr(p, ' ');
        size_t length = end ? (size_t)(end - p) : strlen(p);
        if (length == len && strncmp(p, word, len) == 0) { return 1; }
        if (!end) { break; }
        p = end + 1;
    }
    return 0;
}

// defaults: the program's (the CPU trainer's model differs; its flags_without_effect are marked)
static inline void train_config_print_usage(FILE* out, const char* program, const TrainConfig* defaults) {
    const TrainConfig d = *defaults;
    fprintf(out, "Usage: %s [flags]   (flags take one value each, as in llm.c)\n", program);
    for (int i = 0; i < NUM_TRAIN_FLAGS; i++) {
        const FlagSpec* f = &TRAIN_FLAGS[i];
        char value[512];
        flag_value_to_text(f, &d, value, sizeof(value));
        fprintf(out, "  %-4s %s", f->name, f->help);
        if (d.flags_without_effect != NULL && list_has_word(d.flags_without_effect, f->name)) {
            const char* name = strrchr(program, '/');
            fprintf(out, " [no effect in %s]", name != NULL ? name + 1 : program);
        }
        fprintf(out, " (default %s", value);
        if (f->kind == FLAG_CHOICE) { fprintf(out, "; one of: %s", f->choices); }
        if (f->kind == FLAG_INT && f->hi == INT_MAX_FLAG) { fprintf(out, "; >= %.0f", f->lo); }
        else if (f->kind == FLAG_INT) { fprintf(out, "; range %.0f..%.0f", f->lo, f->hi); }
        else if (f->kind == FLAG_FLOAT) { fprintf(out, "; range %g..%g", f->lo, f->hi); }
        fprintf(out, ")\n");
    }
    fprintf(out, "  --help  print this and exit\n");
}


/*
-fe 1 (fc's forward GEMM writes fcproj's x codes, fp8_model_fc_forward_codes) where it can act:
the GEMM scales its output before the amax of this use exists, so the scale must come from a
history (the delayed recipe's activations); it reads fc's codes and writes fcproj's, so both
forwards are FP8; fcproj's x^T is the transpose of those codes, kept from the forward (FP8
wgrad, -r 0: a recast in the backward would use llm8's GELU, whose codes may differ in the
last place from cuBLASLt's, and -r promises the same results).
*/
static inline void train_config_check_fc_codes(const TrainConfig* c, const Fp8Settings* s) {
    if (s->recipe != FP8_MODEL_DELAYED) {
        llm8_die("flag -fe 1: fc's GEMM writes fcproj's input codes under a scale known before it runs, the delayed recipe's "
                 "(-fr delayed); -fr %s scales from this use's own amax", c->fp8_recipe);
    }
    if (!(s->passes[LINEAR_FC] & FP8_FWD) || s->passes[LINEAR_FCPROJ] != FP8_ALL_PASSES) {
        llm8_die("flag -fe 1: needs fc's forward and all three of fcproj's GEMMs in FP8, and -f8 %s -f8p %s does not run them so",
                 c->fp8_linears, c->fp8_passes);
    }
    if (c->recompute != 0) {
        llm8_die("flag -fe 1 needs -r 0 (given -r %d): fcproj's x^T is the transpose of the codes fc's GEMM wrote, kept from the "
                 "forward; -r would cast it again in the backward with llm8's GELU, whose codes may differ", c->recompute);
    }
}

/*
The FP8 settings of the command line (the lists are parsed here; a bad one dies naming its
flag). -fw delayed and -fg delayed need a per-tensor recipe (the block recipe scales weights per 128x128
block, from the block's own amax) and an FP8 forward (the optimizer writes the forward's W
codes; dgrad's W^T is their transpose).
*/
static inline Fp8Settings train_config_fp8_settings(const TrainConfig* c) {
    Fp8Settings s;
    s.enabled = strcmp(c->precision, "fp8") == 0;
    s.recipe = fp8_model_recipe_from_name(c->fp8_recipe);
    s.history_len = c->fp8_history;
    s.margin = c->fp8_margin;
    s.weight_scaling = fp8_scaling_choice_from_name("-fw", c->fp8_weight_scaling, FP8_WEIGHT_SCALING_CHOICES);
    s.grad_scaling = fp8_scaling_choice_from_name("-fg", c->fp8_grad_scaling, FP8_GRAD_SCALING_CHOICES);
    fp8_parse_passes("-f8p", c->fp8_passes, fp8_parse_linears("-f8", c->fp8_linears), s.passes);
    s.numerics_every = c->fp8_numerics_every;
    s.fc_writes_codes = c->fp8_fc_writes_codes;
    if (s.enabled && s.fc_writes_codes) { train_config_check_fc_codes(c, &s); }
    if (s.weight_scaling == FP8_WEIGHTS_DELAYED && s.recipe == FP8_MODEL_BLOCK) {
        llm8_die("flag -fw delayed: -fr block scales each 128x128 weight block by its own amax; "
                 "use -fw current with -fr block, or -fr delayed|current");
    }
    if (s.grad_scaling != FP8_GRADS_CURRENT && s.recipe == FP8_MODEL_BLOCK) {
        llm8_die("flag -fg %s: -fr block scales each 1x128 gradient tile by its own amax, in one pass already; "
                 "use -fg current with -fr block, or -fr delayed|current", c->fp8_grad_scaling);
    }
    if (s.grad_scaling != FP8_GRADS_CURRENT && !fp8_block_linears_cast_dy(s.passes)) {
        llm8_die("flag -fg %s: -f8 %s -f8p %s casts no block linear's output gradient, and lm_head's is scaled from "
                 "its bound |dlogit| <= dloss under any -fg; use -fg current", c->fp8_grad_scaling, c->fp8_linears,
                 c->fp8_passes);
    }
    if (s.weight_scaling == FP8_WEIGHTS_DELAYED && !fp8_weights_cast_in_update(s.passes)) {
        int partial = fp8_block_kind_with_bf16_pass(s.passes);
        if (partial >= 0) {
            llm8_die("flag -fw delayed: the optimizer pass writes the weights' codes only when every FP8 block linear runs all "
                     "three GEMMs in FP8, and -f8p %s leaves %s a bf16 GEMM (every FP8 weight is then cast from the bf16 "
                     "weights after the update, current-scaled); use -fw current, or -f8p all",
                     c->fp8_passes, LINEAR_KIND_NAMES[partial]);
        }
        llm8_die("flag -fw delayed: -f8 %s has no FP8 block linear, and lm_head's weight is cast from the bf16 wte after "
                 "the update, current-scaled; use -fw current", c->fp8_linears);
    }
    // a tuning value the recipe does not read (train_config_note_idle_fp8_tuning) is held at its
    // default: the state file then records none, and a resume may give another
    const TrainConfig defaults = train_config_defaults();
    if (!fp8_settings_read_history(&s)) { s.history_len = defaults.fp8_history; }
    if (!fp8_settings_read_margin(&s)) { s.margin = defaults.fp8_margin; }
    return s;
}

/*
-z against the rest of the run, before any GPU work. Several GPUs need a sharded optimizer
(1 or 3; there is no stage 2). ZeRO-3 keeps the block linears' weights sharded and gathers
each layer's just before use in the one format its GEMMs read (zero_comm.cuh): FP8 codes for
a linear whose three GEMMs all run in FP8, bf16 for a linear with none in FP8 (a bf16 run:
all four). A linear with some passes in each would need both, so it is refused. FP8 gathers
need a per-tensor recipe (the block recipe's scales are per 128x128 block) and -fw current
(the delayed cast writes whole weights' codes in the optimizer pass).
*/
static inline void train_config_check_zero_stage(const TrainConfig* c, const Fp8Settings* fp8, int num_ranks) {
    if (c->zero_stage == 2) { llm8_die("flag -z 2: llm8 has ZeRO stages 0 (one GPU), 1 and 3"); }
    if (num_ranks > 1 && c->zero_stage == 0) {
        llm8_die("flag -z 0: with %d GPUs llm8 shards the optimizer state: -z 1 (the default) makes the same updates with "
                 "1/N of the state per GPU, or -z 3", num_ranks);
    }
    if (c->zero_stage != 3) { return; }
    if (num_ranks < 2) { llm8_die("flag -z 3 shards the weights over several GPUs (-pn or mpirun); with one GPU use -z 1"); }
    int fp8_linears = 0;
    for (int kind = 0; kind < LINEAR_KINDS_PER_LAYER && fp8->enabled; kind++) {
        if (fp8->passes[kind] == 0) { continue; }
        if (fp8->passes[kind] != FP8_ALL_PASSES) {
            llm8_die("flag -z 3 gathers each block linear's weight in FP8 or in bf16, and -f8p %s runs %s partly in each: "
                     "give it all three passes or none, or use -z 1", c->fp8_passes, LINEAR_KIND_NAMES[kind]);
        }
        fp8_linears++;
    }
    if (fp8_linears == 0) { return; }  // every block linear gathered in bf16
    if (fp8->recipe == FP8_MODEL_BLOCK) { llm8_die("flag -z 3 with -fr block: ZeRO-3 gathers only per-tensor-scaled FP8 weights, not 128x128 block-scaled ones: use -fr delayed or current, or -z 1"); }
    if (fp8->weight_scaling == FP8_WEIGHTS_DELAYED) { llm8_die("flag -z 3 needs -fw current (-fw delayed writes whole weights in the optimizer pass)"); }
}

// parses argv into *c (which holds defaults); dies on any problem; --help prints and exits 0
static inline void train_config_parse(TrainConfig* c, int argc, char** argv) {
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-help") == 0) {
            train_config_print_usage(stdout, argv[0], c);
            exit(EXIT_SUCCESS);
        }
    }
    for (int i = 1; i < argc; i += 2) {
        const char* name = argv[i];
        const FlagSpec* f = NULL;
        for (int k = 0; k < NUM_TRAIN_FLAGS; k++) {
            if (strcmp(TRAIN_FLAGS[k].name, name) == 0) { f = &TRAIN_FLAGS[k]; break; }
        }
        if (f == NULL && name[0] != '-') {
            llm8_die("'%s' is not a flag: a value without its flag, or a glob the shell expanded into several files "
                     "(quote -i and -j patterns: -i 'dir/*_train_*.bin')", name);
        }
        if (f == NULL) { llm8_die("unknown flag '%s' (see --help for the list)", name); }
        if (i + 1 >= argc) { llm8_die("flag %s needs a value (see --help)", name); }
        const char* text = argv[i + 1];
        char* base = (char*)c;
        switch (f->kind) {
            case FLAG_INT: *(int*)(base + f->offset) = (int)parse_long_flag(name, text, (long)f->lo, (long)f->hi); break;
            case FLAG_FLOAT: *(float*)(base + f->offset) = parse_float_flag(name, text, f->lo, f->hi); break;
            case FLAG_CHOICE:
                if (!list_has_word(f->choices, text)) {
                    llm8_die("flag %s: '%s' is not one of: %s", name, text, f->choices);
                }
                *(const char**)(base + f->offset) = text;
                break;
            case FLAG_STRING: *(const char**)(base + f->offset) = text; break;
        }
    }
    if (c->val_max_steps == 0) { llm8_die("flag -m 0: expected at least 1 val batch per evaluation, or -1 for the whole val split"); }
    if (c->resume && c->output_log_dir[0] == '\0') {
        llm8_die("flag -y 1 needs an output dir -o to resume from");
    }
    if (c->checkpoint_every > 0 && c->output_log_dir[0] == '\0') {
        llm8_die("flag -n %d needs an output dir -o to write checkpoints into", c->checkpoint_every);
    }
    train_config_fp8_settings(c);  // the -f8 / -f8p lists and -fw: checked here, before any GPU work
    if (c->process_rank >= c->num_processes) {
        llm8_die("flag -pr %d: rank must be below -pn %d", c->process_rank, c->num_processes);
    }
}

// the checks that need the model and the number of processes; returns grad_accum_steps
static inline int train_config_check_batch(TrainConfig* c, const GPT2Config* model, int num_processes) {
    if (c->T > model->max_seq_len) {
        llm8_die("flag -t %d: sequence length exceeds the model's max_seq_len %d", c->T, model->max_seq_len);
    }
    long long tokens = (long long)c->B * c->T * num_processes;
    if (tokens > INT_MAX) {
        llm8_die("flags -b %d, -t %d with %d processes: %lld tokens per micro-step exceed %d; lower -b", c->B, c->T,
                 num_processes, tokens, INT_MAX);
    }
    int tokens_per_micro_step = (int)tokens;
    if (c->total_batch_size == -1) { c->total_batch_size = tokens_per_micro_step; }
    if (c->total_batch_size == 0 || c->total_batch_size % tokens_per_micro_step != 0) {
        llm8_die("flag -d %d: total batch must be a positive multiple of B*T*processes = %d*%d*%d = %d (or -1 for one)",
                 c->total_batch_size, c->B, c->T, num_processes, tokens_per_micro_step);
    }
    return c->total_batch_size / tokens_per_micro_step;
}

// -e names a model file (an llm.c model_*.bin), not a descriptor (d12, ...)
static inline int train_config_names_model_file(const TrainConfig* c) { return strstr(c->model, ".bin") != NULL; }

/*
-y 1 takes the model from the checkpoint it resumes, whatever -e says (as llm.c); an -e naming a
model of another shape (a descriptor, or a model file that exists) is not used, and a note says so
instead of nothing.
*/
static inline void train_config_note_resumed_model(const TrainConfig* c, const GPT2Config* resumed, const char* checkpoint) {
    GPT2Config named;
    int version;
    if (!train_config_names_model_file(c)) { named = gpt2_config_from_descriptor(c->model); }
    else if (file_exists(c->model)) { model_file_read_header(c->model, &named, &version); }
    else { return; }
    if (memcmp(&named, resumed, sizeof(named)) != 0) {
        printf("note: -y 1 resumes %s (L=%d NH=%d C=%d); -e %s (L=%d NH=%d C=%d) is not used\n", checkpoint,
               resumed->num_layers, resumed->num_heads, resumed->channels, c->model, named.num_layers, named.num_heads,
               named.channels);
    }
}

// whether flag f has in c a value other than in defaults; its value in c, as --help writes it, into value
static inline int flag_moved_from_default(const FlagSpec* f, const TrainConfig* c, const TrainConfig* defaults,
                                          char* value, size_t size) {
    char default_value[4200];
    flag_value_to_text(f, c, value, size);
    flag_value_to_text(f, defaults, default_value, sizeof(default_value));
    return strcmp(value, default_value) != 0;
}

// the flags a program accepts and ignores (its flags_without_effect), given a value other than its default
// (`defaults`, the program's): one note each, naming the program (an llm.c user's -s on the CPU trainer would
// otherwise print no sample without a word)
static inline void train_config_note_flags_without_effect(const TrainConfig* c, const TrainConfig* defaults,
                                                          const char* program) {
    if (c->flags_without_effect == NULL) { return; }
    for (int i = 0; i < NUM_TRAIN_FLAGS; i++) {
        const FlagSpec* f = &TRAIN_FLAGS[i];
        if (!list_has_word(c->flags_without_effect, f->name)) { continue; }
        char value[4200];
        if (flag_moved_from_default(f, c, defaults, value, sizeof(value))) {
            printf("note: %s %.60s has no effect in %s (train_gpt2_fp8 has it; --help marks the flags %s ignores)\n",
                   f->name, value, program, program);
        }
    }
}

// FP8 flags (-fr, -fh, ...) given a value other than their default in a run without -p fp8 change nothing: one note
// names them (an FP8-against-bf16 comparison whose -p went missing would otherwise train bf16 silently)
static inline void train_config_note_unused_fp8_flags(const TrainConfig* c) {
    if (strcmp(c->precision, "fp8") == 0) { return; }
    const TrainConfig defaults = train_config_defaults();
    char given[1024] = "";  // at most 9 flags of at most 70 characters
    for (int i = 0; i < NUM_TRAIN_FLAGS; i++) {
        const FlagSpec* f = &TRAIN_FLAGS[i];
        if (strncmp(f->name, "-f", 2) != 0 || strcmp(f->name, "-f") == 0) { continue; }  // -f: llm.c's TF32 switch
        char value[4200];
        if (flag_moved_from_default(f, c, &defaults, value, sizeof(value))) {
            snprintf(given + strlen(given), sizeof(given) - strlen(given), "%s%s %.60s", given[0] != '\0' ? ", " : "",
                     f->name, value);
        }
    }
    if (given[0] != '\0') { printf("note: %s: FP8 flags, and this run has -p %s: they change nothing\n", given, c->precision); }
}

/*
Within an FP8 run, the tuning flags the chosen recipe does not read: -fh is the length of the
amax history that -fr delayed keeps for the activations and -fg delayed for the gradients, and
-fm divides per-tensor scales, which -fr block has none of. Moved off their defaults there,
they would change nothing without a word: one note each. (The run's settings hold such a value
at its default, train_config_fp8_settings, so a resume of the run may give any.)
*/
static inline void train_config_note_idle_fp8_tuning(const TrainConfig* c) {
    if (strcmp(c->precision, "fp8") != 0) { return; }  // train_config_note_unused_fp8_flags's case
    const TrainConfig defaults = train_config_defaults();
    const Fp8Settings settings = train_config_fp8_settings(c);
    if (!fp8_settings_read_history(&settings) && c->fp8_history != defaults.fp8_history) {
        printf("note: -fh %d: no tensor of this run keeps an amax history (-fr %s -fg %s; -fr delayed or -fg delayed "
               "would): it changes nothing\n", c->fp8_history, c->fp8_recipe, c->fp8_grad_scaling);
    }
    if (!fp8_settings_read_margin(&settings) && c->fp8_margin != defaults.fp8_margin) {
        printf("note: -fm %d: the margin divides per-tensor scales, and -fr block scales each tile and block by its own "
               "amax: it changes nothing\n", c->fp8_margin);
    }
}

// whether the shard glob `pattern` matches a file
static inline int train_config_glob_matches(const char* pattern) {
    glob_t found;
    int status = glob(pattern, 0, NULL, &found);
    int matches = status == 0 && found.gl_pathc > 0;
    globfree(&found);
    return matches;
}

/*
-i, and -j where val runs (run_val), match shard files: one line naming the flag, where the
loader's own error could only name the pattern. A tokenized folder too small for a val split
has no val shards, so -j's says how to train without val.
*/
static inline void train_config_check_shard_globs(const TrainConfig* c, int run_val) {
    if (!train_config_glob_matches(c->train_data_pattern)) {
        llm8_die("flag -i '%s': no token shards match it (check the path; dev/data/ makes shards)", c->train_data_pattern);
    }
    if (run_val && !train_config_glob_matches(c->val_data_pattern)) {
        llm8_die("flag -j '%s': no token shards match it (check the path; dev/data/ makes shards; -j \"\" trains "
                 "without val)", c->val_data_pattern);
    }
}

/*
The data the flags name, for both trainers: -i's loader (shuffled under -sh 1) and, where val
runs (-j not empty, -v > 0), -j's unshuffled one with val_batches, the batches an evaluation
reads (-m, at most the split's). Each notes shards too short for a batch, naming its flag.
Returns whether val runs (val is then open; dataloader_free it as train).
*/
static inline int train_config_open_data(const TrainConfig* c, int vocab_size, int rank, int num_ranks,
                                         DataLoader* train, DataLoader* val, int* val_batches) {
    int run_val = c->val_data_pattern[0] != '\0' && c->val_every > 0;
    train_config_check_shard_globs(c, run_val);
    dataloader_init(train, c->train_data_pattern, c->B, c->T, rank, num_ranks, c->shuffle, vocab_size);
    dataloader_note_short_shards(train, "-i");
    *val_batches = 0;
    if (run_val) {
        dataloader_init(val, c->val_data_pattern, c->B, c->T, rank, num_ranks, 0, vocab_size);
        dataloader_note_short_shards(val, "-j");
        *val_batches = dataloader_eval_batches(val, c->val_max_steps);
    }
    return run_val;
}

// -q 1 (llm.c's default) leaves nothing for a decaying schedule to decay to: llm.c's run scripts
// pass -q 0.0, and a run without it trains at -l after its warmup, whatever -k says (-x 0 trains
// nothing: no note)
static inline void train_config_note_schedule(const TrainConfig* c) {
    if (c->final_lr_frac == 1.0f && strcmp(c->lr_schedule, "constant") != 0 && c->max_steps != 0) {
        printf("note: -q 1 (the default, as in llm.c): -k %s decays to the peak rate -l itself, so the rate stays at %g after "
               "the warmup; llm.c's scripts pass -q 0.0\n", c->lr_schedule, c->learning_rate);
    }
}

// The model file -e names (a path with ".bin": an llm.c model_*.bin) into path (path_size bytes),
// else "" (a descriptor: a random init). One named must exist.
static inline void train_config_model_file(const TrainConfig* c, char* path, size_t path_size) {
    path[0] = '\0';
    if (!train_config_names_model_file(c)) { return; }
    if (!file_exists(c->model)) {
        llm8_die("flag -e %s: no such model file (expected an llm.c model_*.bin, or a descriptor: tiny, d6, d12, d24, "
                 "d36, d48)", c->model);
    }
    snprintf(path, path_size, "%s", c->model);
}

/*
The decode tokenizer file for text samples, into path (path_size bytes). A -tk the user gave must exist.
Left out: the gpt2_tokenizer.bin that the data scripts in dev/data/ write beside their shards, in the
folder of the -i glob (when that folder has no wildcard), else llm.c's default ./gpt2_tokenizer.bin
(where its starter pack puts it); with neither, "" (samples then print token ids).
*/
#define TOKENIZER_FILENAME "gpt2_tokenizer.bin"
static inline void train_config_tokenizer_path(const TrainConfig* c, char* path, size_t path_size) {
    if (c->tokenizer_path[0] != '\0') {
        if (!file_exists(c->tokenizer_path)) {
            llm8_die("flag -tk %s: no such tokenizer file (leave -tk out to use the %s beside the -i shards, or "
                     "./%s)", c->tokenizer_path, TOKENIZER_FILENAME, TOKENIZER_FILENAME);
        }
        snprintf(path, path_size, "%s", c->tokenizer_path);
        return;
    }
    const char* slash = strrchr(c->train_data_pattern, '/');
    size_t folder_length = slash == NULL ? 0 : (size_t)(slash - c->train_data_pattern);
    int literal_folder = strcspn(c->train_data_pattern, "*?[") > folder_length;
    if (slash != NULL && literal_folder &&
        snprintf(path, path_size, "%.*s/%s", (int)folder_length, c->train_data_pattern, TOKENIZER_FILENAME) < (int)path_size &&
        file_exists(path)) {
        return;
    }
    snprintf(path, path_size, "%s", file_exists(TOKENIZER_FILENAME) ? TOKENIZER_FILENAME : "");
}

static inline int train_config_uses_adamw8(const TrainConfig* c) { return strcmp(c->optimizer, "adamw8") == 0; }

static inline uint32_t fingerprint_add(uint32_t hash, const void* data, size_t bytes) {  // FNV-1a
    const unsigned char* p = (const unsigned char*)data;
    for (size_t i = 0; i < bytes; i++) { hash = (hash ^ p[i]) * 16777619u; }
    return hash;
}

/*
What every rank of a multi-GPU run must agree on, one number an item: each flag but the rank's
own (-pr, whose item stays 0), then the model's shape, then the step it resumes from. The ranks
compare them at startup, so mismatched launches (another -b, -p, model or checkpoint) fail at
once, not in a hang, with a line naming the first item that differs.
A float flag counts by its bits, not its text: %g's 6 digits left -l 0.0006 and 0.0006000001
(two floats) alike, and ranks with another learning rate or -sl would train their shards
differently, or skip different steps and leave the weight gather's collectives unpaired.
*/
#define CONFIG_ITEM_MODEL NUM_TRAIN_FLAGS
#define CONFIG_ITEM_RESUME (NUM_TRAIN_FLAGS + 1)
#define NUM_CONFIG_ITEMS (NUM_TRAIN_FLAGS + 2)
static inline void train_config_fingerprints(const TrainConfig* c, const GPT2Config* model, int resume_step,
                                             uint32_t fingerprints[NUM_CONFIG_ITEMS]) {
    const uint32_t empty = 2166136261u;
    for (int i = 0; i < NUM_TRAIN_FLAGS; i++) {
        const FlagSpec* f = &TRAIN_FLAGS[i];
        fingerprints[i] = 0;
        if (strcmp(f->name, "-pr") == 0) { continue; }
        if (f->kind == FLAG_FLOAT) {
            fingerprints[i] = fingerprint_add(empty, (const char*)c + f->offset, sizeof(float));
            continue;
        }
        char value[4200];
        flag_value_to_text(f, c, value, sizeof(value));
        fingerprints[i] = fingerprint_add(empty, value, strlen(value) + 1);
    }
    int shape[6] = {model->max_seq_len, model->vocab_size, model->padded_vocab_size, model->num_layers, model->num_heads,
                    model->channels};
    fingerprints[CONFIG_ITEM_MODEL] = fingerprint_add(empty, shape, sizeof(shape));
    fingerprints[CONFIG_ITEM_RESUME] = fingerprint_add(empty, &resume_step, sizeof(resume_step));
}

// item i of train_config_fingerprints and this process's value of it, as the startup check names them
static inline void train_config_item_text(int item, const TrainConfig* c, const GPT2Config* model, int resume_step,
                                          char* what, size_t what_size, char* value, size_t value_size) {
    if (item == CONFIG_ITEM_MODEL) {
        snprintf(what, what_size, "models");
        snprintf(value, value_size, "L=%d NH=%d C=%d maxT=%d V=%d Vp=%d", model->num_layers, model->num_heads,
                 model->channels, model->max_seq_len, model->vocab_size, model->padded_vocab_size);
    } else if (item == CONFIG_ITEM_RESUME) {
        snprintf(what, what_size, "checkpoints to resume (-y 1 in -o)");
        if (resume_step >= 0) { snprintf(value, value_size, "step %d", resume_step); }
        else { snprintf(value, value_size, "none: a fresh start"); }
    } else {
        snprintf(what, what_size, "%s", TRAIN_FLAGS[item].name);
        flag_value_to_text(&TRAIN_FLAGS[item], c, value, value_size);
    }
}

#endif // LLMC_TRAIN_CONFIG_H
