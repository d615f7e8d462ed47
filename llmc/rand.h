/*
rand.h: Mersenne Twister (MT19937) and Box-Muller normals for deterministic weight init
and data shuffling; llm.c's xorshift* coins for text samples.

Why: initialization and shuffling must be reproducible across runs, machines and the
CPU/GPU trainers, so they run on the host from a fixed seed. The generator state is a
plain struct, so it can be written into the resume state file and restored exactly.

normal_ draws its uniforms in one sequential pass (the generator is a sequence) and turns
them into normals in a second, parallel pass (OpenMP where the build enables it): the
transform (log, sqrt, cos, sin in double) is most of the time (15.5 ns of 17 per value on
one core before: d48's 1.56 billion weights took over 20 s on every start). Each pair of
values depends only on its own two uniforms, so the result is the same bits for any
number of threads. The twist is written without index wrap-around, which halved the cost
of a uniform (2.3 -> 1.1 ns). test/test_rand.c holds the stream to the C++ standard's
check value and the tiny model's init to a frozen fingerprint.
*/
#ifndef LLMC_RAND_H
#define LLMC_RAND_H

#include <stdint.h>
#include <math.h>

#define MT19937_N 624
#define MT19937_M 397

typedef struct {
    uint32_t state[MT19937_N];
    uint32_t index;
} mt19937_state;

static inline void manual_seed(mt19937_state* rng, uint32_t seed) {
    rng->state[0] = seed;
    for (uint32_t i = 1; i < MT19937_N; i++) {
        uint32_t prev = rng->state[i - 1];
        rng->state[i] = 1812433253u * (prev ^ (prev >> 30)) + i;
    }
    rng->index = MT19937_N;
}

// the new state word i from word i, word i + 1 and word i + M (indices mod N)
static inline uint32_t mt19937_mix(uint32_t word, uint32_t next, uint32_t far) {
    uint32_t y = (word & 0x80000000u) | (next & 0x7fffffffu);
    return far ^ (y >> 1) ^ ((0u - (y & 1u)) & 0x9908b0dfu);
}

// the next N words, in place. Word i reads words i + 1 and i + M as they are at that moment
// (the old ones, or, past the end, the new words 0.. already written); split in three loops
// so that no index wraps and the compiler can vectorize the first two.
static inline void mt19937_twist(mt19937_state* rng) {
    uint32_t* s = rng->state;
    uint32_t i = 0;
    for (; i < MT19937_N - MT19937_M; i++) { s[i] = mt19937_mix(s[i], s[i + 1], s[i + MT19937_M]); }
    for (; i < MT19937_N - 1; i++) { s[i] = mt19937_mix(s[i], s[i + 1], s[i + MT19937_M - MT19937_N]); }
    s[MT19937_N - 1] = mt19937_mix(s[MT19937_N - 1], s[0], s[MT19937_M - 1]);
    rng->index = 0;
}

static inline uint32_t mt19937_temper(uint32_t y) {
    y ^= y >> 11;
    y ^= (y << 7) & 0x9d2c5680u;
    y ^= (y << 15) & 0xefc60000u;
    y ^= y >> 18;
    return y;
}

static inline uint32_t randint32(mt19937_state* rng) {
    if (rng->index >= MT19937_N) { mt19937_twist(rng); }
    return mt19937_temper(rng->state[rng->index++]);
}

// uniform in [0, 1) with 24 bits of resolution
static inline float randfloat32(mt19937_state* rng) {
    return (float)(randint32(rng) & ((1u << 24) - 1)) * (1.0f / (float)(1u << 24));
}

// Box-Muller: the pair of N(mean, std) values of two uniforms in [0, 1)
static inline void normal_pair(float uniform1, float uniform2, float mean, float std, float* first, float* second) {
    const double two_pi = 6.283185307179586;
    double u1 = 1.0 - (double)uniform1;  // (0, 1]: log is finite
    double radius = sqrt(-2.0 * log(u1));
    *first = (float)(mean + std * radius * cos(two_pi * (double)uniform2));
    *second = (float)(mean + std * radius * sin(two_pi * (double)uniform2));
}

// fills data[0..n) with N(mean, std): value pair k from uniforms 2k and 2k+1 of the stream
// (an odd n drops the last pair's second value)
static inline void normal_(float* data, size_t n, float mean, float std, mt19937_state* rng) {
    size_t pairs = n / 2;
    for (size_t i = 0; i < 2 * pairs; i++) { data[i] = randfloat32(rng); }  // exact in float (24 bits)
#ifdef _OPENMP
#pragma omp parallel for schedule(static)
#endif
    for (size_t k = 0; k < pairs; k++) {
        normal_pair(data[2 * k], data[2 * k + 1], mean, std, &data[2 * k], &data[2 * k + 1]);
    }
    if (n % 2 != 0) {
        float uniform1 = randfloat32(rng), uniform2 = randfloat32(rng), unused;
        normal_pair(uniform1, uniform2, mean, std, &data[n - 1], &unused);
    }
}

/*
The coins of text samples, as llm.c draws them (train_gpt2.cu's sampling loop, random_f32):
xorshift* (Vigna 2016: shifts 12, 25 and 27 of a 64-bit state, the upper 32 bits of its
product with 0x2545F4914F6CDD1D), the coin the top 24 of those bits over 2^24, from a state
seeded 1337 for every sample. With the same weights a sample is then llm.c's, token for token.
*/
static inline uint32_t xorshift_star_u32(uint64_t* state) {
    *state ^= *state >> 12;
    *state ^= *state << 25;
    *state ^= *state >> 27;
    return (uint32_t)((*state * 0x2545F4914F6CDD1Dull) >> 32);
}

static inline float xorshift_star_f32(uint64_t* state) { return (float)(xorshift_star_u32(state) >> 8) / 16777216.0f; }

static inline void identity_permutation(int* data, int n) {
    for (int i = 0; i < n; i++) { data[i] = i; }
}

// Fisher-Yates shuffle of an int array, in place: llm.c shuffles its shard order this way at every
// epoch, each epoch's order a shuffle of the last one's (a fresh order starts from identity_permutation)
static inline void random_permutation(int* data, int n, mt19937_state* rng) {
    for (int i = n - 1; i > 0; i--) {
        int j = (int)(randint32(rng) % (uint32_t)(i + 1));
        int tmp = data[i]; data[i] = data[j]; data[j] = tmp;
    }
}

#endif // LLMC_RAND_H
