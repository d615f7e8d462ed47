/*
test_rand.c: llmc/rand.h, the generator behind weight init and data shuffling.

Why: a run's initial weights and data order must not change from one llm8 version to the
next (a checkpointed run resumed by a newer binary, a comparison against an old log), and
normal_ now spreads its work over threads. So:
- the MT19937 stream against the C++ standard's check value: a default-seeded std::mt19937
  (seed 5489) returns 4123659995 on its 10000th call ([rand.eng.mt] in the C++ standard),
  independent of our code;
- normal_ against its definition, pair k from uniforms 2k and 2k+1 of the stream, computed
  here one value at a time (an odd n drops the last pair's second value), for 1 and 4 threads;
- the stream after normal_ is where its definition leaves it (shuffles and later tensors);
- gpt2_init_params_random of the tiny model: a fingerprint (FNV-1a over the bytes) frozen
  from the code before normal_ went parallel.
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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

// normal_'s definition, one value at a time from the stream
static void normal_by_definition(float* data, size_t n, float mean, float std, mt19937_state* rng) {
    const double two_pi = 6.283185307179586;
    for (size_t i = 0; i < n; i += 2) {
        double u1 = 1.0 - (double)randfloat32(rng);
        double u2 = (double)randfloat32(rng);
        double radius = sqrt(-2.0 * log(u1));
        data[i] = (float)(mean + std * radius * cos(two_pi * u2));
        if (i + 1 < n) { data[i + 1] = (float)(mean + std * radius * sin(two_pi * u2)); }
    }
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
    CHECK(n == 6966784 && h == 0xd23e5f2812ad1a17ull,
          "tiny init (seed 42, %d threads): %zu parameters, fingerprint %016llx; the frozen one is 6966784, d23e5f2812ad1a17",
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

int main(void) {
    test_stream_matches_the_standard();
    test_sample_coins_are_llmcs();
    size_t sizes[] = {1, 2, 3, 16, 1001, 1 << 20, (1 << 20) + 1};
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        test_normal_matches_its_definition(sizes[i], 1);
        test_normal_matches_its_definition(sizes[i], 4);
    }
    test_tiny_init_is_frozen(1);
    test_tiny_init_is_frozen(4);
    return test_summary("test_rand");
}
