/*
test_overfit.c: the tiny reference model, trained with AdamW on ONE fixed batch, must
memorize it. This is the end-to-end check that forward, backward and the optimizer work
together (a sign error or a wrong update drives the loss up or leaves it flat).

Why the threshold: the batch is 64 random tokens from a vocabulary of 67, so at init the
loss is about ln(67) = 4.2 and no pattern is shared between positions: the only way below
0.01 x the initial loss (0.042, the right token at p > 0.96 on average) is for the model to
memorize each position from its prefix, which needs correct gradients on every path. With
lr 1e-2 the loss measured 0.41 at step 20, 0.047 at step 30 and 0.002 at step 60; the test
allows 60 steps (about 0.3 s), twice what it needs. It also checks that the loss at step 0
is near ln(V), that the first update lowers it, and that a run is reproducible bit for bit.
*/
#include "test/test_harness.h"
#include "test/gpt2_ref.h"

#define OVERFIT_B 4
#define OVERFIT_T 16
#define OVERFIT_STEPS 60

// trains from the llm.c init for `steps` steps; losses[s] is the loss before update s+1
static void train_on_one_batch(float* losses, int steps) {
    GPT2Config cfg = gpt2_config_make(2, 4, 32, OVERFIT_T, 67);  // L, NH, C, maxT, V
    float* params = (float*)mallocCheck(gpt2_num_parameters(&cfg) * sizeof(float));
    gpt2_init_params_random(params, &cfg, GPT2_INIT_SEED);
    GPT2Ref model;
    gpt2ref_init(&model, &cfg, params);
    mt19937_state rng;
    manual_seed(&rng, 7);
    int tokens[OVERFIT_B * OVERFIT_T + 1];
    for (int i = 0; i < OVERFIT_B * OVERFIT_T + 1; i++) { tokens[i] = (int)(randint32(&rng) % (uint32_t)cfg.vocab_size); }
    for (int step = 0; step < steps; step++) {
        losses[step] = gpt2ref_forward(&model, tokens, tokens + 1, OVERFIT_B, OVERFIT_T);
        gpt2ref_zero_grad(&model);
        gpt2ref_backward(&model, 1);
        gpt2ref_adamw_update(&model, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.0f, step + 1, 1.0f);
    }
    free(params);
    gpt2ref_free(&model);
}

int main(void) {
    float losses[OVERFIT_STEPS];
    train_on_one_batch(losses, OVERFIT_STEPS);
    float initial = losses[0], final_loss = losses[OVERFIT_STEPS - 1];
    printf("overfit: loss %.4f at step 0, %.4f at step %d\n", initial, final_loss, OVERFIT_STEPS - 1);
    CHECK(fabsf(initial - logf(67.0f)) < 0.1f, "initial loss %g is not near ln(67) = %g", initial, logf(67.0f));
    CHECK(final_loss < 0.01f * initial, "loss %g after %d steps is not below 0.01 x the initial %g", final_loss, OVERFIT_STEPS, initial);
    CHECK(losses[1] < losses[0], "the first update did not lower the loss (%g -> %g)", losses[0], losses[1]);
    float again[OVERFIT_STEPS];
    train_on_one_batch(again, OVERFIT_STEPS);
    CHECK(memcmp(losses, again, sizeof(losses)) == 0, "two identical runs gave different losses");
    return test_summary("test_overfit");
}
