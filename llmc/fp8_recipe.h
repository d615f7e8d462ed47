/*
fp8_recipe.h: what a -p fp8 run quantizes and how: the scaling recipe, the amax history and
margin, how the weights are scaled (-fw), which GEMMs of which linears run in FP8, and the
numerics-log interval; the linears' and passes' names, and parsing the comma lists the flags
take.

Why it is shaped so:
- It is host-only C with no CUDA type, so the command line (train_config.h, shared with the
  CPU trainer) rejects a bad list before any GPU work, and the CLI tests run without a GPU.
  The GPU side (fp8_model.cuh) and the numerics log name tensors from the same tables.
- The bits follow the CPU reference's FP8 emulation (test/gpt2_ref.h: linear kinds
  qkv=0 .. lm_head=4, passes forward=1, dgrad=2, wgrad=4), so a test maps one onto the other
  by value; the names differ from the reference's only because both are included together.
- Passes are chosen per linear kind (Fp8Settings.passes[kind]), so a user can find where FP8
  pays and where it does not: -f8 lists the linears that may run in FP8, and -f8p the passes,
  each item a pass for every one of them (fwd), a pass of one linear (fc.wgrad), or all.
  dgrad and wgrad are independent: both read a cast of dy (E5M2 codes for dgrad, their
  transpose for wgrad, DESIGN.md section 3), but the one fused pass over dy writes only the
  codes an FP8 GEMM reads, and the bf16 GEMM of the other pass reads dy as stored in bf16.
*/
#ifndef LLMC_FP8_RECIPE_H
#define LLMC_FP8_RECIPE_H

#include <string.h>
#include <stdio.h>
#include "utils.h"
#include "fp8_scaling.h"

typedef enum { LINEAR_QKV, LINEAR_ATTPROJ, LINEAR_FC, LINEAR_FCPROJ, LINEAR_LM_HEAD, NUM_LINEAR_KINDS } LinearKind;
static const char* const LINEAR_KIND_NAMES[NUM_LINEAR_KINDS] = {"qkv", "attproj", "fc", "fcproj", "lm_head"};
#define LINEAR_KINDS_PER_LAYER 4  // qkv, attproj, fc, fcproj; lm_head is once per model

/*
The -r level from which the backward recomputes linear kind's wgrad input instead of keeping
it from the forward: fcproj's (GELU's output) from 1; qkv's and fc's (layernorm outputs) and
attproj's (the attention output) from 2. A bf16 run keeps the attention output for the
attention backward anyway, so for attproj only an FP8 wgrad's x^T is cast again. lm_head's
(lnf's output) is one buffer, not one per layer: always kept (a level above -r's 0 to 2).
*/
#define RECOMPUTE_LEVEL_NEVER 3
static inline int linear_input_recompute_level(int kind) {
    return kind == LINEAR_FCPROJ ? 1 : kind == LINEAR_LM_HEAD ? RECOMPUTE_LEVEL_NEVER : 2;
}

typedef enum { FP8_FWD = 1, FP8_DGRAD = 2, FP8_WGRAD = 4 } Fp8Pass;
#define NUM_FP8_PASSES 3
static const char* const FP8_PASS_NAMES[NUM_FP8_PASSES] = {"fwd", "dgrad", "wgrad"};

typedef enum { FP8_MODEL_DELAYED, FP8_MODEL_CURRENT, FP8_MODEL_BLOCK } Fp8ModelRecipe;
static const char* const FP8_MODEL_RECIPE_NAMES[3] = {"delayed", "current", "block"};

#define FP8_ALL_PASSES (FP8_FWD | FP8_DGRAD | FP8_WGRAD)

// -fw and -fg choose between per-tensor scalings named alike: -fw the first two, -fg all three
// (Fp8WeightScaling, Fp8GradScaling)
#define FP8_WEIGHT_SCALING_CHOICES 2
#define FP8_GRAD_SCALING_CHOICES 3
static const char* const FP8_SCALING_CHOICE_NAMES[FP8_GRAD_SCALING_CHOICES] = {"current", "delayed", "pow2"};

// the name of a value of a flag with `choices` values; "invalid" for one it does not give (a
// corrupted state file's)
static inline const char* fp8_scaling_choice_name(int choice, int choices) {
    return choice >= 0 && choice < choices ? FP8_SCALING_CHOICE_NAMES[choice] : "invalid";
}

// how the per-tensor recipes scale the weights (-fw): cast after the optimizer pass with the new
// amax, or inside it with the previous step's (DESIGN.md section 3; fp8_scaling_init_weight)
typedef enum { FP8_WEIGHTS_CURRENT, FP8_WEIGHTS_DELAYED } Fp8WeightScaling;

// how the per-tensor recipes scale the output gradients dy (-fg): current (DESIGN.md section 3:
// an amax pass, then the cast; dy read twice, once for attproj and fcproj, whose amax and bias
// layernorm backward takes as it writes their dy), delayed (the amax history's scale, so the
// pass that sums the bias also casts: dy read once; the first backward seeds the history), or
// pow2 (current scaling with the scale rounded down to a power of two, fp8_scaling.h's
// CURRENT_POW2: cast in one pass with the last use's scale, and again where this use's amax
// gave another; the first backward takes current's path)
typedef enum { FP8_GRADS_CURRENT, FP8_GRADS_DELAYED, FP8_GRADS_POW2 } Fp8GradScaling;

typedef struct {
    int enabled;                  // -p fp8
    int recipe;                   // Fp8ModelRecipe
    int history_len;              // delayed activations: amax history length, 1..1024
    int margin;                   // scales divided by 2^margin, 0..16 (per-tensor recipes)
    int weight_scaling;           // Fp8WeightScaling (per-tensor recipes)
    int grad_scaling;             // Fp8GradScaling (per-tensor recipes)
    int passes[NUM_LINEAR_KINDS]; // per LinearKind its Fp8Pass bits; 0: that linear runs in bf16
    int numerics_every;           // numerics log interval in steps (0 = never)
    int fc_writes_codes;          // -fe 1: fc's forward GEMM writes fcproj's x codes (fp8_model_fc_forward_codes)
} Fp8Settings;

// whether any tensor keeps an amax history of -fh uses: the delayed recipe's activations, -fg
// delayed's gradients (a delayed weight's history is its last step's amax alone)
static inline int fp8_settings_read_history(const Fp8Settings* s) {
    return s->recipe == FP8_MODEL_DELAYED || s->grad_scaling == FP8_GRADS_DELAYED;
}

// whether any scale is per tensor, which -fm divides: the block recipe scales each tile and block
// by its own amax
static inline int fp8_settings_read_margin(const Fp8Settings* s) { return s->recipe != FP8_MODEL_BLOCK; }

// "qkv,attproj,fc,fcproj" from bits (for the startup line and the errors)
static inline void fp8_names_from_bits(char* out, size_t n, int bits, const char* const* names, int count) {
    out[0] = '\0';
    for (int i = 0; i < count; i++) {
        if (!(bits & (1 << i))) { continue; }
        if (out[0] != '\0') { strncat(out, ",", n - strlen(out) - 1); }
        strncat(out, names[i], n - strlen(out) - 1);
    }
}

// "qkv=fwd,dgrad,wgrad fc=fwd": each FP8 linear's passes (for the startup line and the errors)
static inline void fp8_passes_text(char* out, size_t n, const int passes[NUM_LINEAR_KINDS]) {
    out[0] = '\0';
    for (int kind = 0; kind < NUM_LINEAR_KINDS; kind++) {
        if (passes[kind] == 0) { continue; }
        char names[64];
        if (passes[kind] & ~FP8_ALL_PASSES) {  // a corrupt state file's
            snprintf(names, sizeof(names), "invalid (%d)", passes[kind]);
        } else {
            fp8_names_from_bits(names, sizeof(names), passes[kind], FP8_PASS_NAMES, NUM_FP8_PASSES);
        }
        snprintf(out + strlen(out), n - strlen(out), "%s%s=%s", out[0] != '\0' ? " " : "", LINEAR_KIND_NAMES[kind], names);
    }
    if (out[0] == '\0') { snprintf(out, n, "none"); }
}

// ", history 16, margin 0": the -fh and -fm this recipe reads (fp8_settings_read_*), empty where
// it reads neither (for the startup lines; the values held at their defaults would mislead there)
static inline void fp8_tuning_text(char* out, size_t n, const Fp8Settings* s) {
    out[0] = '\0';
    if (fp8_settings_read_history(s)) { snprintf(out, n, ", history %d", s->history_len); }
    if (fp8_settings_read_margin(s)) { snprintf(out + strlen(out), n - strlen(out), ", margin %d", s->margin); }
}

// the index of the name text[0..length) in names[0..count), or -1
static inline int fp8_find_name(const char* text, size_t length, const char* const* names, int count) {
    for (int i = 0; i < count; i++) {
        if (strlen(names[i]) == length && strncmp(names[i], text, length) == 0) { return i; }
    }
    return -1;
}

/*
Parses a comma list of names (each an index into names[0..count)) into bits, dying with one
line naming the flag on an empty list, an unknown name or a repeated one. "all" means every
name.
*/
static inline int fp8_parse_name_list(const char* flag, const char* text, const char* const* names, int count) {
    int bits = 0;
    const char* p = text;
    if (strcmp(text, "all") == 0) { return (1 << count) - 1; }
    while (1) {
        const char* end = strchr(p, ',');
        size_t length = end ? (size_t)(end - p) : strlen(p);
        int found = fp8_find_name(p, length, names, count);
        if (found < 0) {
            char expected[256];
            fp8_names_from_bits(expected, sizeof(expected), (1 << count) - 1, names, count);
            llm8_die("flag %s: '%.*s' in '%s' is not one of %s (a comma list, or all)", flag, (int)length, p, text, expected);
        }
        if (bits & (1 << found)) { llm8_die("flag %s: '%s' is listed twice in '%s'", flag, names[found], text); }
        bits |= 1 << found;
        if (end == NULL) { break; }
        p = end + 1;
    }
    return bits;
}

static inline int fp8_parse_linears(const char* flag, const char* text) {
    return fp8_parse_name_list(flag, text, LINEAR_KIND_NAMES, NUM_LINEAR_KINDS);
}

// whether the item p[0..length) of the comma list `text` is also an earlier item of it
static inline int fp8_item_listed_before(const char* text, const char* p, size_t length) {
    for (const char* q = text; q < p;) {
        const char* end = strchr(q, ',');
        if ((size_t)(end - q) == length && strncmp(q, p, length) == 0) { return 1; }
        q = end + 1;  // q < p: an item follows, so there is a comma
    }
    return 0;
}

// one -f8p item p[0..length) of `text` (see fp8_parse_passes): its Fp8Pass bits, with *kind
// the linear it is for, -1 for every linear of -f8 (bits `linears`)
static inline int fp8_parse_pass_item(const char* flag, const char* text, const char* p, int length, int linears, int* kind) {
    *kind = -1;
    if (length == 3 && strncmp(p, "all", 3) == 0) { return FP8_ALL_PASSES; }
    char pass_names[64];
    fp8_names_from_bits(pass_names, sizeof(pass_names), FP8_ALL_PASSES, FP8_PASS_NAMES, NUM_FP8_PASSES);
    const char* dot = (const char*)memchr(p, '.', (size_t)length);
    if (dot == NULL) {
        int pass = fp8_find_name(p, (size_t)length, FP8_PASS_NAMES, NUM_FP8_PASSES);
        if (pass < 0) {
            llm8_die("flag %s: '%.*s' in '%s' is not a pass (one of %s), a <linear>.<pass> (e.g. fc.wgrad) or all",
                     flag, length, p, text, pass_names);
        }
        return 1 << pass;
    }
    int linear_length = (int)(dot - p), pass_length = length - linear_length - 1;
    *kind = fp8_find_name(p, (size_t)linear_length, LINEAR_KIND_NAMES, NUM_LINEAR_KINDS);
    if (*kind < 0) {
        char linear_names[128];
        fp8_names_from_bits(linear_names, sizeof(linear_names), (1 << NUM_LINEAR_KINDS) - 1, LINEAR_KIND_NAMES, NUM_LINEAR_KINDS);
        llm8_die("flag %s: '%.*s' in '%s': '%.*s' is not a linear (one of %s)", flag, length, p, text, linear_length, p,
                 linear_names);
    }
    if (!(linears & (1 << *kind))) {
        char f8[128];
        fp8_names_from_bits(f8, sizeof(f8), linears, LINEAR_KIND_NAMES, NUM_LINEAR_KINDS);
        llm8_die("flag %s: '%.*s' in '%s' is for %s, which -f8 does not list (-f8 %s): add it to -f8, or drop the item",
                 flag, length, p, text, LINEAR_KIND_NAMES[*kind], f8);
    }
    int pass = fp8_find_name(dot + 1, (size_t)pass_length, FP8_PASS_NAMES, NUM_FP8_PASSES);
    if (pass < 0) {
        llm8_die("flag %s: '%.*s' in '%s': '%.*s' is not a pass (one of %s)", flag, length, p, text, pass_length, dot + 1,
                 pass_names);
    }
    return 1 << pass;
}

/*
Parses the -f8p list into passes[kind], for the linears `linears` (-f8's bits). Each item is
a pass name (that pass for every linear in `linears`), <linear>.<pass> (that pass of that
linear only, e.g. fc.wgrad), or all (every pass of every linear in `linears`); passes[kind]
is the union of what the items give that linear, 0 when none reaches it (it runs in bf16).
Dies with one line naming the flag on an empty or unknown item, an item listed twice, or
a <linear>.<pass> whose linear -f8 does not list.
*/
static inline void fp8_parse_passes(const char* flag, const char* text, int linears, int passes[NUM_LINEAR_KINDS]) {
    for (int kind = 0; kind < NUM_LINEAR_KINDS; kind++) { passes[kind] = 0; }
    const char* p = text;
    while (1) {
        const char* end = strchr(p, ',');
        int length = (int)(end ? (size_t)(end - p) : strlen(p));
        int kind;
        int pass_bits = fp8_parse_pass_item(flag, text, p, length, linears, &kind);
        if (fp8_item_listed_before(text, p, (size_t)length)) {
            llm8_die("flag %s: '%.*s' is listed twice in '%s'", flag, length, p, text);
        }
        for (int k = 0; k < NUM_LINEAR_KINDS; k++) {
            if ((linears & (1 << k)) && (kind < 0 || k == kind)) { passes[k] |= pass_bits; }
        }
        if (end == NULL) { break; }
        p = end + 1;
    }
}

// the -fr name of a recipe number, "invalid" for one outside the enum (a state file may hold any)
static inline const char* fp8_model_recipe_name(int recipe) {
    return recipe >= 0 && recipe < 3 ? FP8_MODEL_RECIPE_NAMES[recipe] : "invalid";
}

static inline int fp8_model_recipe_from_name(const char* name) {
    for (int i = 0; i < 3; i++) {
        if (strcmp(name, FP8_MODEL_RECIPE_NAMES[i]) == 0) { return i; }
    }
    llm8_die("fp8 recipe '%s' is not one of delayed, current, block", name);
    return -1;
}

// -fw's or -fg's value, one of the first `choices` names (flag names the flag in the error)
static inline int fp8_scaling_choice_from_name(const char* flag, const char* name, int choices) {
    for (int i = 0; i < choices; i++) {
        if (strcmp(name, FP8_SCALING_CHOICE_NAMES[i]) == 0) { return i; }
    }
    llm8_die("flag %s: '%s' is not one of current, delayed%s", flag, name, choices > 2 ? ", pow2" : "");
    return -1;
}

// a setting as its flag writes it: name from the flag's table, "invalid" (a corrupt state file's
// number) shown with the number
static inline const char* fp8_flag_value_text(char* out, size_t n, const char* name, int value) {
    if (strcmp(name, "invalid") != 0) { snprintf(out, n, "%s", name); } else { snprintf(out, n, "invalid (%d)", value); }
    return out;
}

// where a state file's FP8 settings and this run's differ (fp8_settings_difference)
typedef struct {
    char text[1024];  // "-fh 16 (this run: 32), -fm 0 (this run: 1)"
    char flags[64];   // "-fh -fm"
} Fp8SettingsDifference;

// one setting: appends "label saved (this run: run)" and the flags that set it when the values differ
static inline void fp8_append_difference(Fp8SettingsDifference* d, const char* flags, const char* label,
                                         const char* saved, const char* run) {
    if (strcmp(saved, run) == 0) { return; }
    size_t used = strlen(d->text);
    snprintf(d->text + used, sizeof(d->text) - used, "%s%s %s (this run: %s)", used > 0 ? ", " : "", label, saved, run);
    used = strlen(d->flags);
    snprintf(d->flags + used, sizeof(d->flags) - used, "%s%s", used > 0 ? " " : "", flags);
}

static inline void fp8_append_int_difference(Fp8SettingsDifference* d, const char* flag, int saved, int run) {
    char a[16], b[16];
    snprintf(a, sizeof(a), "%d", saved);
    snprintf(b, sizeof(b), "%d", run);
    fp8_append_difference(d, flag, flag, a, b);
}

/*
Where a state file's FP8 settings and this run's differ, for the resume refusal: it names the
flag to change instead of printing two lists to compare. The passes (which -f8 and -f8p set
together) show as each FP8 linear's. Empty when the two agree on the recipe, the passes, -fh,
-fm, -fw and -fg (numerics_every and fc_writes_codes change no state).
*/
static inline Fp8SettingsDifference fp8_settings_difference(const Fp8Settings* saved, const Fp8Settings* run) {
    Fp8SettingsDifference d;
    char a[256], b[256];
    d.text[0] = '\0';
    d.flags[0] = '\0';
    fp8_append_difference(&d, "-fr", "-fr",
                          fp8_flag_value_text(a, sizeof(a), fp8_model_recipe_name(saved->recipe), saved->recipe),
                          fp8_flag_value_text(b, sizeof(b), fp8_model_recipe_name(run->recipe), run->recipe));
    fp8_passes_text(a, sizeof(a), saved->passes);
    fp8_passes_text(b, sizeof(b), run->passes);
    fp8_append_difference(&d, "-f8 -f8p", "FP8 passes", a, b);
    fp8_append_int_difference(&d, "-fh", saved->history_len, run->history_len);
    fp8_append_int_difference(&d, "-fm", saved->margin, run->margin);
    fp8_append_difference(&d, "-fw", "-fw",
        fp8_flag_value_text(a, sizeof(a), fp8_scaling_choice_name(saved->weight_scaling, FP8_WEIGHT_SCALING_CHOICES), saved->weight_scaling),
        fp8_flag_value_text(b, sizeof(b), fp8_scaling_choice_name(run->weight_scaling, FP8_WEIGHT_SCALING_CHOICES), run->weight_scaling));
    fp8_append_difference(&d, "-fg", "-fg",
        fp8_flag_value_text(a, sizeof(a), fp8_scaling_choice_name(saved->grad_scaling, FP8_GRAD_SCALING_CHOICES), saved->grad_scaling),
        fp8_flag_value_text(b, sizeof(b), fp8_scaling_choice_name(run->grad_scaling, FP8_GRAD_SCALING_CHOICES), run->grad_scaling));
    return d;
}

// the resume refusal, one line naming the state file and the flags that differ
static inline void fp8_refuse_resume(const char* path, const Fp8SettingsDifference* d) {
    llm8_die("state file '%s' was written with other FP8 settings: %s: resume with the same %s", path, d->text, d->flags);
}

/*
Where an FP8 weight is cast (DESIGN.md section 3): the block linears' weights in the optimizer
pass, from the master weights (-fw current: the pass supplies the amax; -fw delayed: the pass
writes the codes), when every FP8 block linear runs all three GEMMs in FP8, so no bf16 GEMM
reads their bf16 weights; with several ranks their owners cast them and they travel as FP8
codes (zero_comm.cuh). Otherwise, and always for lm_head (its bf16 wte is the embedding's),
after the update, from the bf16 weights, with current scaling; with several ranks every rank
casts them after their bf16 gather. One GPU draws the line where several must, so N ranks on
the same batch compute one rank's bits (doc/multi-gpu.md, twin batches). Passes indexed by
LinearKind, Fp8Pass bits (the CPU reference's arrays have the same order and bits).

The first block kind with FP8 and bf16 GEMMs both, or -1 when none has.
*/
static inline int fp8_block_kind_with_bf16_pass(const int* passes) {
    for (int kind = 0; kind < LINEAR_KINDS_PER_LAYER; kind++) {
        if (passes[kind] != 0 && passes[kind] != FP8_ALL_PASSES) { return kind; }
    }
    return -1;
}

// whether the optimizer pass casts linear kind `kind`'s FP8 weight (see above)
static inline int fp8_weight_cast_in_update(const int* passes, int kind) {
    return kind < LINEAR_KINDS_PER_LAYER && passes[kind] != 0 && fp8_block_kind_with_bf16_pass(passes) < 0;
}

// whether the optimizer pass casts any FP8 weight: what -fw delayed acts on
static inline int fp8_weights_cast_in_update(const int* passes) {
    for (int kind = 0; kind < LINEAR_KINDS_PER_LAYER; kind++) {
        if (fp8_weight_cast_in_update(passes, kind)) { return 1; }
    }
    return 0;
}

// the per-tensor state recipe of activations (dy as -fg says, W as -fw says)
static inline Fp8Recipe fp8_activation_recipe(const Fp8Settings* s) {
    return s->recipe == FP8_MODEL_DELAYED ? FP8_RECIPE_DELAYED : FP8_RECIPE_CURRENT;
}

/*
The per-tensor state recipe of the output gradient of a linear of kind `kind`: as -fg says,
except lm_head's. lm_head's output gradient is the logits' gradient (softmax - onehot(target))
* dloss: a probability lies in [0, 1], so every element lies in [-dloss, dloss]. Its scale is
current scaling's formula with that bound as the amax (fp8_dlogits_amax_bound), which is known
before the classifier writes the first gradient. So the classifier writes the E5M2 codes itself
(fused_classifier), no pass reads the B T x Vp gradients again just for their amax or for a
cast, and no element can saturate. What it costs: where the true amax is below the bound, the
scale is smaller than current scaling's by that ratio, so tiny gradients flush to zero that
amax-based scaling would keep. The numerics log prints the amax the classifier saw beside the
scale it used, so the ratio can be read there.
*/
static inline Fp8Recipe fp8_gradient_recipe(int grad_scaling, int kind) {
    if (kind == LINEAR_LM_HEAD) { return FP8_RECIPE_CURRENT; }  // updated with the bound before each use
    return grad_scaling == FP8_GRADS_DELAYED ? FP8_RECIPE_DELAYED
         : grad_scaling == FP8_GRADS_POW2 ? FP8_RECIPE_CURRENT_POW2 : FP8_RECIPE_CURRENT;
}

// whether a block linear casts its output gradient (an FP8 dgrad or wgrad): what -fg acts on
static inline int fp8_block_linears_cast_dy(const int* passes) {
    for (int kind = 0; kind < LINEAR_KINDS_PER_LAYER; kind++) {
        if (passes[kind] & (FP8_DGRAD | FP8_WGRAD)) { return 1; }
    }
    return 0;
}

// the bound on |lm_head's output gradient| for a loss gradient dloss (fp8_gradient_recipe)
static inline float fp8_dlogits_amax_bound(float dloss) { return dloss; }

#endif // LLMC_FP8_RECIPE_H
