/*
gpt2_config.h: the GPT-2 shape (config), the 16 parameter tensors in llm.c's order, and
llm.c-style random initialization.

Why: the GPU trainer, the CPU reference, the checkpoint code and the tests must agree on
one parameter layout, byte for byte, or checkpoints stop being interchangeable with
llm.c. Keeping the layout and the init in one host-only header makes that a single fact.
*/
#ifndef LLMC_GPT2_CONFIG_H
#define LLMC_GPT2_CONFIG_H

#include <stddef.h>
#include <string.h>
#include <stdio.h>
#include "utils.h"
#include "rand.h"

typedef struct {
    int max_seq_len;        // maxT, 1024 for GPT-2
    int vocab_size;         // V, 50257
    int padded_vocab_size;  // Vp, V rounded up to a multiple of 128 (50304)
    int num_layers;         // L
    int num_heads;          // NH
    int channels;           // C
} GPT2Config;

#define NUM_PARAMETER_TENSORS 16
enum {
    PARAM_WTE, PARAM_WPE, PARAM_LN1W, PARAM_LN1B, PARAM_QKVW, PARAM_QKVB,
    PARAM_ATTPROJW, PARAM_ATTPROJB, PARAM_LN2W, PARAM_LN2B, PARAM_FCW, PARAM_FCB,
    PARAM_FCPROJW, PARAM_FCPROJB, PARAM_LNFW, PARAM_LNFB
};

static const char* const PARAM_TENSOR_NAMES[NUM_PARAMETER_TENSORS] = {
    "wte", "wpe", "ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb",
    "ln2w", "ln2b", "fcw", "fcb", "fcprojw", "fcprojb", "lnfw", "lnfb"
};

#define GPT2_DEFAULT_VOCAB 50257
#define GPT2_DEFAULT_MAXT 1024
#define GPT2_INIT_SEED 42

static inline int round_up_int(int x, int multiple) { return ((x + multiple - 1) / multiple) * multiple; }

// element counts of the 16 tensors, all layers included (per-layer tensors are [L][...])
static inline void gpt2_param_sizes(const GPT2Config* cfg, size_t sizes[NUM_PARAMETER_TENSORS]) {
    size_t Vp = cfg->padded_vocab_size, C = cfg->channels, maxT = cfg->max_seq_len, L = cfg->num_layers;
    sizes[PARAM_WTE] = Vp * C;
    sizes[PARAM_WPE] = maxT * C;
    sizes[PARAM_LN1W] = L * C;
    sizes[PARAM_LN1B] = L * C;
    sizes[PARAM_QKVW] = L * (3 * C) * C;
    sizes[PARAM_QKVB] = L * (3 * C);
    sizes[PARAM_ATTPROJW] = L * C * C;
    sizes[PARAM_ATTPROJB] = L * C;
    sizes[PARAM_LN2W] = L * C;
    sizes[PARAM_LN2B] = L * C;
    sizes[PARAM_FCW] = L * (4 * C) * C;
    sizes[PARAM_FCB] = L * (4 * C);
    sizes[PARAM_FCPROJW] = L * C * (4 * C);
    sizes[PARAM_FCPROJB] = L * C;
    sizes[PARAM_LNFW] = C;
    sizes[PARAM_LNFB] = C;
}

static inline size_t gpt2_num_parameters(const GPT2Config* cfg) {
    size_t sizes[NUM_PARAMETER_TENSORS];
    gpt2_param_sizes(cfg, sizes);
    size_t total = 0;
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) { total += sizes[i]; }
    return total;
}

// llm.c decays the 2D tensors (embeddings and matmul weights), not biases or layernorms
static inline int gpt2_param_is_decayed(int tensor) {
    return tensor == PARAM_WTE || tensor == PARAM_WPE || tensor == PARAM_QKVW ||
           tensor == PARAM_ATTPROJW || tensor == PARAM_FCW || tensor == PARAM_FCPROJW;
}

// the largest shape a model file may give (gpt2_config_validate says why)
#define GPT2_MAX_LAYERS 4096
#define GPT2_MAX_CHANNELS 65536
#define GPT2_MAX_SEQ_LEN (1 << 20)
#define GPT2_MAX_PADDED_VOCAB (1 << 20)

// checks the invariants every kernel relies on; dies with a one-line message naming `source`
static inline void gpt2_config_validate(const GPT2Config* cfg, const char* source) {
    if (cfg->num_layers <= 0 || cfg->num_heads <= 0 || cfg->channels <= 0 ||
        cfg->max_seq_len <= 0 || cfg->vocab_size <= 0) {
        llm8_die("%s: invalid model shape L=%d NH=%d C=%d maxT=%d V=%d (all must be positive)", source,
                 cfg->num_layers, cfg->num_heads, cfg->channels, cfg->max_seq_len, cfg->vocab_size);
    }
    if (cfg->channels % cfg->num_heads != 0) {
        llm8_die("%s: channels C=%d is not a multiple of num_heads NH=%d", source, cfg->channels, cfg->num_heads);
    }
    if (cfg->padded_vocab_size < cfg->vocab_size) {
        llm8_die("%s: padded vocab Vp=%d is smaller than vocab V=%d", source, cfg->padded_vocab_size, cfg->vocab_size);
    }
    // far above any GPT-2 (d48: L 48, C 1600, maxT 1024, Vp 50304), and low enough that the parameter count (about
    // Vp C + maxT C + 12 L C^2, below 2^53 here) and every tensor's size stay exact in size_t: a corrupt header's
    // values would otherwise wrap it and a file of the wrapped length pass the length check
    if (cfg->num_layers > GPT2_MAX_LAYERS || cfg->channels > GPT2_MAX_CHANNELS || cfg->max_seq_len > GPT2_MAX_SEQ_LEN ||
        cfg->padded_vocab_size > GPT2_MAX_PADDED_VOCAB) {
        llm8_die("%s: model shape L=%d C=%d maxT=%d Vp=%d is past what llm8 reads (L <= %d, C <= %d, maxT <= %d, "
                 "Vp <= %d): a corrupt header?", source, cfg->num_layers, cfg->channels, cfg->max_seq_len,
                 cfg->padded_vocab_size, GPT2_MAX_LAYERS, GPT2_MAX_CHANNELS, GPT2_MAX_SEQ_LEN, GPT2_MAX_PADDED_VOCAB);
    }
}

static inline GPT2Config gpt2_config_make(int L, int NH, int C, int maxT, int V) {
    GPT2Config cfg;
    cfg.num_layers = L;
    cfg.num_heads = NH;
    cfg.channels = C;
    cfg.max_seq_len = maxT;
    cfg.vocab_size = V;
    cfg.padded_vocab_size = round_up_int(V, 128);
    return cfg;
}

/*
The models -e names, llm.c's descriptors: "d12" / "d24" / "d36" / "d48" (GPT-2 124M/350M/774M/
1558M), "d6" and "tiny" for quick runs, llm.c's unofficial d60 / d72 / d84 (2.7B/7.3B/12.2B),
each also as "gpt2:dN"; and llm.c's "gpt3:cN" (GPT-3's depth and head size for N channels,
maxT 2048; dense attention, as llm.c). llm.c's gpt3:c5140 is not one: 5140 channels are no
whole number of its 128-wide heads (llm.c stops at an assert).
*/
static inline GPT2Config gpt2_config_from_descriptor(const char* desc) {
    static const struct { const char* name; int L, NH, C, maxT; } presets[] = {
        {"tiny", 2, 2, 128, 1024}, {"d6", 6, 6, 384, 1024}, {"d12", 12, 12, 768, 1024},
        {"d24", 24, 16, 1024, 1024}, {"d36", 36, 20, 1280, 1024}, {"d48", 48, 25, 1600, 1024},
        {"d60", 60, 30, 1920, 1024}, {"d72", 72, 30, 2880, 1024}, {"d84", 84, 36, 3456, 1024},
        {"gpt3:c384", 6, 6, 384, 2048}, {"gpt3:c768", 12, 12, 768, 2048}, {"gpt3:c1024", 24, 16, 1024, 2048},
        {"gpt3:c1536", 24, 16, 1536, 2048}, {"gpt3:c2048", 24, 16, 2048, 2048}, {"gpt3:c2560", 32, 32, 2560, 2048},
        {"gpt3:c4096", 32, 32, 4096, 2048}, {"gpt3:c12288", 96, 96, 12288, 2048},
    };
    const char* gpt2_prefix = "gpt2:";
    const char* name = strncmp(desc, gpt2_prefix, strlen(gpt2_prefix)) == 0 && desc[strlen(gpt2_prefix)] == 'd'
                           ? desc + strlen(gpt2_prefix) : desc;
    for (size_t i = 0; i < sizeof(presets) / sizeof(presets[0]); i++) {
        if (strcmp(name, presets[i].name) == 0) {
            return gpt2_config_make(presets[i].L, presets[i].NH, presets[i].C, presets[i].maxT, GPT2_DEFAULT_VOCAB);
        }
    }
    llm8_die("model descriptor '%s' is unknown (expected tiny, d6, d12, d24, d36, d48, d60, d72, d84, llm.c's gpt2:dN "
             "for those dN, llm.c's gpt3:cN for N in 384 768 1024 1536 2048 2560 4096 12288, or a .bin checkpoint)", desc);
    return gpt2_config_make(0, 0, 0, 0, 0); // unreachable
}

/*
Random init in llm.c's order with llm.c's (PyTorch's) normal_, so a given seed gives the fp32
values llm.c draws (the GPU trainer then keeps their bf16 rounding, as llm.c does):
layernorm weights 1, biases 0, wte (first V rows only) / wpe / the four matmul weights
N(0, 0.02), the two projections back into the residual (attproj, fcproj) scaled by
1/sqrt(2L). Matmul weights are drawn one layer at a time, layer-major, tensor order within
a layer, exactly as llm.c walks them. `params` holds gpt2_num_parameters(cfg) floats.
*/
static inline void gpt2_init_params_random(float* params, const GPT2Config* cfg, uint32_t seed) {
    size_t sizes[NUM_PARAMETER_TENSORS];
    gpt2_param_sizes(cfg, sizes);
    size_t L = cfg->num_layers;
    memset(params, 0, gpt2_num_parameters(cfg) * sizeof(float));
    mt19937_state rng;
    manual_seed(&rng, seed);
    float residual_scale = 1.0f / sqrtf(2.0f * (float)L);
    for (size_t l = 0; l < L; l++) {
        size_t offset = 0;
        for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
            if (l == 0 && (i == PARAM_LN1W || i == PARAM_LN2W || i == PARAM_LNFW)) {
                for (size_t j = 0; j < sizes[i]; j++) { params[offset + j] = 1.0f; }
            }
            int is_embedding = (i == PARAM_WTE || i == PARAM_WPE);
            int is_matmul = (i == PARAM_QKVW || i == PARAM_ATTPROJW || i == PARAM_FCW || i == PARAM_FCPROJW);
            if ((l == 0 && is_embedding) || is_matmul) {
                size_t n = sizes[i];
                size_t layer_offset = 0;
                if (i == PARAM_WTE) { n = (size_t)cfg->vocab_size * cfg->channels; }
                if (is_matmul) { n = n / L; layer_offset = l * n; }
                float std = (i == PARAM_ATTPROJW || i == PARAM_FCPROJW) ? 0.02f * residual_scale : 0.02f;
                normal_(params + offset + layer_offset, n, 0.0f, std, &rng);
            }
            offset += sizes[i];
        }
    }
}

#endif // LLMC_GPT2_CONFIG_H
