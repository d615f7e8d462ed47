/*
test_rand.c: llmc/rand.h, the generator behind weight init and data shuffling.

Why: a run's initial weights and data order must not change from one llm8 version to the
next (a checkpointed run resumed by a newer binary, a comparison against an old log), and
normal_ now spreads its work over threads. So:
- the MT19937 stream against the C++ standard's check value: a default-seeded std::mt19937
  (seed 5489) returns 4123659995 on its 10000th call ([rand.eng.mt] in the C++ standard),
  independent of our code;
- normal_ against PyTorch's own output for seed 137 (the values llm.c's rand.h records), so the
  random init is llm.c's;
- normal_ against its definition, written out here one value at a time, for 1 and 4 threads,
  at sizes under 16, whole blocks of 16 and not (the redrawn last block);
- the stream after normal_ is where its definition leaves it (shuffles and later tensors);
- gpt2_init_params_random of the tiny model: a fingerprint (FNV-1a over the bytes) frozen
  from the code when normal_ became PyTorch's; and that it writes every parameter, from the
  seed it is given.
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <omp.h>
#include "test/test_harness.h"
#include "llmc/utils.h"
#include "llmc/rand.h"
#include "llmc/gpt2_config.h"

static void test_stream_matches_the_standard(void) {
    mt19937_state rng;
    manual_seed(&rng, 5489u);
    uint32_t value = 0;
    for (int i = 0; i < 10000; i++) { value = randint32(&rng); }
    CHECK(value == 4123659995u, "the 10000th MT19937 word after seed 5489 is %u, the C++ standard says 4123659995", value);
}

// normal_'s definition (PyTorch's CPU normal_, llm.c's rand.h), written out one value at a time
static float radius_of(float uniform) { return sqrtf(-2.0f * logf((float)((double)(1.0f - uniform) + 1e-12))); }
static float angle_of(float uniform) { return (float)(2.0 * 3.141592653589793 * (double)uniform); }

static void normal_by_definition(float* data, size_t n, float mean, float std, mt19937_state* rng) {
    if (n < 16) {  // pairs: the angle's 53-bit uniform, then the radius's
        for (size_t i = 0; i < n; i += 2) {
            uint64_t a_high = randint32(rng), a_low = randint32(rng), r_high = randint32(rng), r_low = randint32(rng);
            // the low 53 bits of the 64-bit word over 2^53
            float u_angle = (float)((double)(((a_high << 32) | a_low) & 0x1fffffffffffffull) / 9007199254740992.0);
            float u_radius = (float)((double)(((r_high << 32) | r_low) & 0x1fffffffffffffull) / 9007199254740992.0);
            float radius = radius_of(u_radius), angle = angle_of(u_angle);
            data[i] = radius * cosf(angle) * std + mean;
            if (i + 1 < n) { data[i + 1] = (float)((double)(radius * sinf(angle)) * std + mean); }
        }
        return;
    }
    float* uniforms = (float*)mallocCheck((n + 16) * sizeof(float));
    for (size_t i = 0; i < n + (n % 16 != 0 ? 16 : 0); i++) { uniforms[i] = randfloat32(rng); }
    for (size_t i = 0; i < n; i++) {
        // position i is made from the block it falls in: a whole block of the first n uniforms, or,
        // past the last whole block's start n - 16 when 16 does not divide n, the redrawn block
        int redrawn = n % 16 != 0 && i >= n - 16;
        size_t block = redrawn ? n : i / 16 * 16;  // the redrawn uniforms sit after the first n
        size_t t = redrawn ? i - (n - 16) : i % 16;
        const float* u = uniforms + block;
        float radius = radius_of(u[t % 8]), angle = angle_of(u[t % 8 + 8]);
        data[i] = radius * (t < 8 ? cosf(angle) : sinf(angle)) * std + mean;
    }
    free(uniforms);
}

static void test_normal_matches_its_definition(size_t n, int threads) {
    float* got = (float*)mallocCheck((n + 1) * sizeof(float));
    float* want = (float*)mallocCheck((n + 1) * sizeof(float));
    mt19937_state rng_got, rng_want;
    manual_seed(&rng_got, 1234u);
    manual_seed(&rng_want, 1234u);
    omp_set_num_threads(threads);
    normal_(got, n, 0.5f, 0.02f, &rng_got);
    normal_by_definition(want, n, 0.5f, 0.02f, &rng_want);
    size_t differing = 0;
    for (size_t i = 0; i < n; i++) { differing += memcmp(&got[i], &want[i], sizeof(float)) != 0; }
    CHECK(differing == 0, "normal_ n=%zu with %d threads: %zu values differ from the definition", n, threads, differing);
    CHECK(randint32(&rng_got) == randint32(&rng_want), "normal_ n=%zu with %d threads: the stream after it moved", n, threads);
    free(got);
    free(want);
}

/*
PyTorch's own output (torch.manual_seed(137), five torch.randint(0, 0xFFFFFFFF, [1]), t = torch.zeros(8);
t.normal_(), one more randint, a 16-element normal_, one more randint), as llm.c's rand.h records it. The
words must match exactly; the normals to the 6 decimals llm.c prints them with (printf %f) when it says its
code and PyTorch's give the same output: PyTorch computes the 16-blocks' angle in float (llm.c: in double)
and the under-16 path in double (llm.c: mostly float), about 1e-6 relative apart. A wrong pairing or draw
order misses by far more.
*/
static void test_normal_matches_pytorch(void) {
    const uint32_t words[5] = {4053805790u, 2173880614u, 380293709u, 1237255315u, 2986595568u};
    const double normals8[8] = {0.7947664260864258, 1.4369317293167114, -0.2292192131280899, 0.47556325793266296,
                                -0.6334410905838013, -0.5791953802108765, -0.0925704762339592, -0.8659197092056274};
    const double normals16[16] = {-1.2813878059387207, -2.646395683288574, -0.06569503247737885, 0.2180829495191574,
                                  -0.46536165475845337, -0.33108410239219666, 2.5485482215881348, 0.10425379872322083,
                                  0.8460659980773926, 0.9462448358535767, -0.2913765013217926, 0.34313806891441345,
                                  -1.1186704635620117, -0.18305328488349915, -2.3153159618377686, 0.3961987793445587};
    mt19937_state rng;
    manual_seed(&rng, 137u);
    for (int i = 0; i < 5; i++) {
        uint32_t word = randint32(&rng);
        CHECK(word == words[i], "seed 137, word %d: %u, PyTorch draws %u", i, word, words[i]);
    }
    float t8[8], t16[16];
    normal_(t8, 8, 0.0f, 1.0f, &rng);
    uint32_t between = randint32(&rng);
    normal_(t16, 16, 0.0f, 1.0f, &rng);
    uint32_t after = randint32(&rng);
    CHECK(between == 2186503452u && after == 2756748748u,
          "the words after PyTorch's normal_ of 8 and of 16: %u and %u, PyTorch's 2186503452 and 2756748748", between, after);
    for (int i = 0; i < 24; i++) {
        float got = i < 8 ? t8[i] : t16[i - 8];
        double want = i < 8 ? normals8[i] : normals16[i - 8];
        CHECK(fabs(got - want) <= 1e-6, "normal_ value %d: %.9g, PyTorch's %.9g", i, got, want);
    }
}

static uint64_t fnv1a(const void* data, size_t bytes) {
    const unsigned char* b = (const unsigned char*)data;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < bytes; i++) { h ^= b[i]; h *= 1099511628211ull; }
    return h;
}

static void test_tiny_init_is_frozen(int threads) {
    GPT2Config cfg = gpt2_config_from_descriptor("tiny");
    size_t n = gpt2_num_parameters(&cfg);
    float* params = (float*)mallocCheck(n * sizeof(float));
    omp_set_num_threads(threads);
    gpt2_init_params_random(params, &cfg, 42u);
    uint64_t h = fnv1a(params, n * sizeof(float));
    CHECK(n == 6966784 && h == 0x93587f53676a0159ull,
          "tiny init (seed 42, %d threads): %zu parameters, fingerprint %016llx; the frozen one is 6966784, 93587f53676a0159",
          threads, n, (unsigned long long)h);
    free(params);
}

// llm.c's sampling coins from its seed 1337: the first five words and coins, computed by an
// independent implementation of xorshift* (Python's integers, masked to 64 bits)
static void test_sample_coins_are_llmcs(void) {
    const uint32_t words[5] = {989205090u, 818269915u, 1335155955u, 3876892996u, 2941700015u};
    uint64_t state = 1337, coin_state = 1337;
    for (int i = 0; i < 5; i++) {
        uint32_t word = xorshift_star_u32(&state);
        float coin = xorshift_star_f32(&coin_state);
        CHECK(word == words[i] && coin == (float)(words[i] >> 8) / 16777216.0f,
              "xorshift* draw %d from 1337: %u (coin %.9g), expected %u", i, word, coin, words[i]);
    }
}

// normal_ under 16 values, call after call from one stream, against its definition: the pair's second value
// is the float radius * sinf(angle), then times std plus mean in double (llm.c's), bits that a single short
// call rarely tells apart from float arithmetic or a double sin
static void test_short_normals_match_their_definition(float mean, float std) {
    mt19937_state rng_got, rng_want;
    manual_seed(&rng_got, 2024u);
    manual_seed(&rng_want, 2024u);
    size_t differing = 0, values = 0;
    for (int call = 0; call < 150; call++) {
        size_t n = 2 + (size_t)call % 14;  // 2..15
        float got[16], want[16];
        normal_(got, n, mean, std, &rng_got);
        normal_by_definition(want, n, mean, std, &rng_want);
        for (size_t i = 0; i < n; i++) { differing += memcmp(&got[i], &want[i], sizeof(float)) != 0; }
        values += n;
    }
    CHECK(differing == 0, "normal_ under 16 (mean %g, std %g): %zu of %zu values differ from the definition", mean, std,
          differing, values);
    CHECK(randint32(&rng_got) == randint32(&rng_want), "normal_ under 16 (mean %g, std %g): the stream after it moved", mean, std);
}

// gpt2_init_params_random writes every parameter (what was in the buffer before does not show through: the
// biases and wte's padded rows are zeros it writes), draws from the seed it is given, and the trainer's
// seed is llm.c's 42
static void test_init_writes_every_parameter_from_its_seed(void) {
    GPT2Config cfg = gpt2_config_make(2, 2, 16, 8, 60);  // Vp 128: wte has 68 padded rows
    size_t n = gpt2_num_parameters(&cfg);
    float* zeroed = (float*)mallocCheck(n * sizeof(float));
    float* garbage = (float*)mallocCheck(n * sizeof(float));
    float* other_seed = (float*)mallocCheck(n * sizeof(float));
    memset(zeroed, 0, n * sizeof(float));
    for (size_t i = 0; i < n; i++) { garbage[i] = NAN; }
    memset(other_seed, 0, n * sizeof(float));
    gpt2_init_params_random(zeroed, &cfg, 42u);
    gpt2_init_params_random(garbage, &cfg, 42u);
    gpt2_init_params_random(other_seed, &cfg, 43u);
    CHECK(memcmp(zeroed, garbage, n * sizeof(float)) == 0, "init into a buffer of NaNs differs from init into zeros");
    CHECK(memcmp(zeroed, other_seed, n * sizeof(float)) != 0, "init with seed 43 equals init with seed 42");
    CHECK(GPT2_INIT_SEED == 42, "the trainer's init seed is %d, llm.c's is 42", GPT2_INIT_SEED);
    free(zeroed);
    free(garbage);
    free(other_seed);
}

// the layernorm weights start at 1 and every bias at 0 in a model of any depth, one layer included (the ones are
// written while the init walks the first layer)
static void test_init_layernorms_and_biases(void) {
    const int depths[2] = {1, 3};
    for (int d = 0; d < 2; d++) {
        GPT2Config cfg = gpt2_config_make(depths[d], 2, 16, 8, 60);
        size_t sizes[NUM_PARAMETER_TENSORS];
        gpt2_param_sizes(&cfg, sizes);
        float* params = (float*)mallocCheck(gpt2_num_parameters(&cfg) * sizeof(float));
        gpt2_init_params_random(params, &cfg, 42u);
        size_t offset = 0, wrong = 0;
        for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
            int ones = i == PARAM_LN1W || i == PARAM_LN2W || i == PARAM_LNFW;
            int zeros = i == PARAM_LN1B || i == PARAM_QKVB || i == PARAM_ATTPROJB || i == PARAM_LN2B || i == PARAM_FCB ||
                        i == PARAM_FCPROJB || i == PARAM_LNFB;
            for (size_t j = 0; j < sizes[i] && (ones || zeros); j++) { wrong += params[offset + j] != (ones ? 1.0f : 0.0f); }
            offset += sizes[i];
        }
        CHECK(wrong == 0, "init of %d layers: %zu layernorm weights not 1 or biases not 0", depths[d], wrong);
        free(params);
    }
}

int main(void) {
    test_stream_matches_the_standard();
    test_sample_coins_are_llmcs();
    test_normal_matches_pytorch();
    size_t sizes[] = {1, 2, 3, 8, 15, 16, 17, 31, 32, 1001, 1 << 20, (1 << 20) + 1};
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        test_normal_matches_its_definition(sizes[i], 1);
        test_normal_matches_its_definition(sizes[i], 4);
    }
    test_tiny_init_is_frozen(1);
    test_tiny_init_is_frozen(4);
    test_short_normals_match_their_definition(0.0f, 1.0f);
    test_short_normals_match_their_definition(0.5f, 0.02f);
    test_init_writes_every_parameter_from_its_seed();
    test_init_layernorms_and_biases();
    return test_summary("test_rand");
}
