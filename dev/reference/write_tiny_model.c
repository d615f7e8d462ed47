/*
write_tiny_model.c: writes a small random GPT-2 as an llm.c fp32 model file (version 3),
the input of dev/reference/gpt2_torch.py and of the committed golden-tensor fixture.

Why: the fixture's weights must come from our own init code (gpt2_config.h, rand.h) and
our own writer (checkpoint.h), so the PyTorch side only ever reads the format. On top of
llm.c's init (std 0.02) every parameter except the padded wte rows gets N(0, 0.1) noise:
at std 0.02 attention is almost uniform and layernorm parameters sit at 1 and 0, so a
wrong attention scale or a swapped layernorm weight/bias would barely move the golden
tensors. The padded rows stay 0, as llm.c keeps them.

build: gcc -std=gnu11 -O2 -I. dev/reference/write_tiny_model.c -lm -o build/write_tiny_model
usage: build/write_tiny_model OUT.bin [L NH C maxT V]   (defaults: 2 4 64 32 97, Vp = V rounded up to 128)
*/
#include "llmc/utils.h"
#include "llmc/gpt2_config.h"
#include "llmc/checkpoint.h"

#define TINY_NOISE_STD 0.1f
#define TINY_NOISE_SEED 1234

int main(int argc, char** argv) {
    if (argc != 2 && argc != 7) {
        llm8_die("usage: %s OUT.bin [L NH C maxT V] (got %d arguments)", argv[0], argc - 1);
    }
    int L = 2, NH = 4, C = 64, maxT = 32, V = 97;
    if (argc == 7) {
        L = (int)parse_long_flag("L", argv[2], 1, 64);
        NH = (int)parse_long_flag("NH", argv[3], 1, 64);
        C = (int)parse_long_flag("C", argv[4], 1, 4096);
        maxT = (int)parse_long_flag("maxT", argv[5], 1, 4096);
        V = (int)parse_long_flag("V", argv[6], 1, 1 << 20);
    }
    GPT2Config cfg = gpt2_config_make(L, NH, C, maxT, V);
    gpt2_config_validate(&cfg, "write_tiny_model");
    size_t n = gpt2_num_parameters(&cfg);
    float* params = (float*)mallocCheck(n * sizeof(float));
    gpt2_init_params_random(params, &cfg, GPT2_INIT_SEED);
    float* noise = (float*)mallocCheck(n * sizeof(float));
    mt19937_state rng;
    manual_seed(&rng, TINY_NOISE_SEED);
    normal_(noise, n, 0.0f, TINY_NOISE_STD, &rng);
    size_t wte_live_end = (size_t)V * C;                // wte rows V..Vp-1 (padding) keep 0
    size_t wte_end = (size_t)cfg.padded_vocab_size * C;
    for (size_t i = 0; i < n; i++) {
        if (i >= wte_live_end && i < wte_end) { continue; }
        params[i] += noise[i];
    }
    model_file_write(argv[1], &cfg, params, MODEL_VERSION_FP32);
    printf("wrote %s: L=%d NH=%d C=%d maxT=%d V=%d Vp=%d, %zu parameters\n", argv[1], L, NH, C, maxT, V,
           cfg.padded_vocab_size, n);
    free(noise);
    free(params);
    return 0;
}
