/*
fp8_recipe.h: what a -p fp8 run quantizes and how: the scaling recipe, the amax history and
margin, how the weights are scaled (-fw), which linears and which of their GEMMs run in FP8,
and the numerics-log interval;
the linears' and passes' names, and parsing the comma lists the flags take.

Why it is shaped so:
- It is host-only C with no CUDA type, so the command line (train_config.h, shared with the
  CPU trainer) rejects a bad list before any GPU work, and the CLI tests run without a GPU.
  The GPU side (fp8_model.cuh) and the numerics log name tensors from the same tables.
- The bits follow the CPU reference's FP8 emulation (test/gpt2_ref.h: linear kinds
  qkv=0 .. lm_head=4, passes forward=1, dgrad=2, wgrad=4), so a test maps one onto the other
  by value; the names differ from the reference's only because both are included together.
- dgrad and wgrad go together: both read the one cast of dy (E5M2 codes and their
  transpose, DESIGN.md section 3), and the bf16 matmul_backward runs both GEMMs at once, so
  a split would waste a bf16 GEMM. So the valid pass sets are fwd, dgrad+wgrad, and all.
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

typedef enum { FP8_FWD = 1, FP8_DGRAD = 2, FP8_WGRAD = 4 } Fp8Pass;
#define NUM_FP8_PASSES 3
static const char* const FP8_PASS_NAMES[NUM_FP8_PASSES] = {"fwd", "dgrad", "wgrad"};

typedef enum { FP8_MODEL_DELAYED, FP8_MODEL_CURRENT, FP8_MODEL_BLOCK } Fp8ModelRecipe;
static const char* const FP8_MODEL_RECIPE_NAMES[3] = {"delayed", "current", "block"};

// how the per-tensor recipes scale the weights (-fw): cast after the optimizer pass with the new
// amax, or inside it with the previous step's (DESIGN.md section 3; fp8_scaling_init_weight)
typedef enum { FP8_WEIGHTS_CURRENT, FP8_WEIGHTS_DELAYED } Fp8WeightScaling;
static const char* const FP8_WEIGHT_SCALING_NAMES[2] = {"current", "delayed"};

typedef struct {
    int enabled;        // -p fp8
    int recipe;         // Fp8ModelRecipe
    int history_len;    // delayed activations: amax history length, 1..1024
    int margin;         // scales divided by 2^margin, 0..16 (per-tensor recipes)
    int weight_scaling; // Fp8WeightScaling (per-tensor recipes)
    int linears;        // (1 << LinearKind) bits
    int passes;         // Fp8Pass bits
    int numerics_every; // numerics log interval in steps (0 = never)
} Fp8Settings;

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
        int found = -1;
        for (int i = 0; i < count; i++) {
            if (strlen(names[i]) == length && strncmp(names[i], p, length) == 0) { found = i; }
        }
        if (found < 0) {
            char expected[256] = "";
            for (int i = 0; i < count; i++) {
                strncat(expected, names[i], sizeof(expected) - strlen(expected) - 1);
                strncat(expected, i + 1 < count ? "," : "", sizeof(expected) - strlen(expected) - 1);
            }
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

static inline int fp8_parse_passes(const char* flag, const char* text) {
    int passes = fp8_parse_name_list(flag, text, FP8_PASS_NAMES, NUM_FP8_PASSES);
    if (((passes & FP8_DGRAD) != 0) != ((passes & FP8_WGRAD) != 0)) {
        llm8_die("flag %s '%s': dgrad and wgrad run in FP8 together (they share the one cast of dy); "
                 "use fwd, dgrad,wgrad or fwd,dgrad,wgrad", flag, text);
    }
    return passes;
}

static inline int fp8_model_recipe_from_name(const char* name) {
    for (int i = 0; i < 3; i++) {
        if (strcmp(name, FP8_MODEL_RECIPE_NAMES[i]) == 0) { return i; }
    }
    llm8_die("fp8 recipe '%s' is not one of delayed, current, block", name);
    return -1;
}

static inline int fp8_weight_scaling_from_name(const char* name) {
    for (int i = 0; i < 2; i++) {
        if (strcmp(name, FP8_WEIGHT_SCALING_NAMES[i]) == 0) { return i; }
    }
    llm8_die("fp8 weight scaling '%s' is not one of current, delayed", name);
    return -1;
}

// the per-tensor state recipe of activations (dy is always current, W as -fw says)
static inline Fp8Recipe fp8_activation_recipe(const Fp8Settings* s) {
    return s->recipe == FP8_MODEL_DELAYED ? FP8_RECIPE_DELAYED : FP8_RECIPE_CURRENT;
}

// "qkv,attproj,fc,fcproj" from bits (for the startup line)
static inline void fp8_names_from_bits(char* out, size_t n, int bits, const char* const* names, int count) {
    out[0] = '\0';
    for (int i = 0; i < count; i++) {
        if (!(bits & (1 << i))) { continue; }
        if (out[0] != '\0') { strncat(out, ",", n - strlen(out) - 1); }
        strncat(out, names[i], n - strlen(out) - 1);
    }
}

#endif // LLMC_FP8_RECIPE_H
