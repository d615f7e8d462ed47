/*
rand.h: Mersenne Twister (MT19937) and Box-Muller normals for deterministic weight init
and data shuffling; llm.c's xorshift* coins for text samples.

Why: initialization and shuffling must be reproducible across runs, machines and the
CPU/GPU trainers, so they run on the host from a fixed seed. The generator state is a
plain struct, so it can be written into the resume state file and restored exactly.

The stream is std::mt19937's, and so PyTorch's and llm.c's for the same seed; normal_ is
PyTorch's (and llm.c's) Box-Muller, so the random init draws llm.c's weights. normal_ draws
its uniforms in one sequential pass (the generator is a sequence) and turns them into normals
in a second, parallel pass. The twist is written without index wrap-around, which halved the
cost of a uniform (2.3 -> 1.1 ns). test/test_rand.c holds the stream to the C++ standard's
check value, normal_ to PyTorch's own output, and the tiny model's init to a frozen
fingerprint.
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

// uniform in [0, 1) with 53 bits of resolution, from two words (the first the high one)
static inline double randfloat64(mt19937_state* rng) {
    uint64_t high = randint32(rng);
    uint64_t low = randint32(rng);
    return (double)(((high << 32) | low) & ((1ull << 53) - 1)) * (1.0 / (double)(1ull << 53));
}

/*
normal_ is PyTorch's CPU normal_, as llm.c's rand.h reproduces it, so that a seed gives llm.c's
weights (and PyTorch's, to its libm's last bit). Box-Muller in float:
- n >= 16: n uniforms (randfloat32) in stream order, then each whole block of 16 becomes 16
  normals: value t and t + 8 of the block (t < 8) from uniform t (the radius, of 1 - u) and
  uniform t + 8 (the angle). When 16 does not divide n, 16 more uniforms are drawn and the
  last 16 positions are made again from them as one block (over what the last whole block
  wrote there and over the tail's uniforms).
- n < 16: value pairs from two 53-bit uniforms each rounded to float, the angle from the first
  and the radius from the second, the pair's second value kept in double for the next position.
The constants are llm.c's: the log's argument is offset by 1e-12 (in double, then rounded to
float: it matters only where 1 - u rounds to 0) and the angle is 2 pi u in double, rounded to
float. The blocks are independent, so they run in parallel (OpenMP where the build enables it:
the transform is most of the time, d48's 1.56 billion weights on every start) with the same bits
for any number of threads.
*/
#define NORMAL_TWO_PI 6.283185307179586  // 2 pi in double, as llm.c's 2.0 * M_PI
#define NORMAL_LOG_OFFSET 1e-12

// the radius sqrt(-2 ln(1 - u)) of a uniform u, in float
static inline float normal_radius_(float uniform) {
    return sqrtf(-2.0f * logf((float)((double)(1.0f - uniform) + NORMAL_LOG_OFFSET)));
}

static inline float normal_angle_(float uniform) { return (float)(NORMAL_TWO_PI * (double)uniform); }

// 16 uniforms in place to 16 N(mean, std) values
static inline void normal_block16_(float* x, float mean, float std) {
    for (int t = 0; t < 8; t++) {
        float radius = normal_radius_(x[t]);
        float angle = normal_angle_(x[t + 8]);
        x[t] = radius * cosf(angle) * std + mean;
        x[t + 8] = radius * sinf(angle) * std + mean;
    }
}

static inline void normal_(float* data, size_t n, float mean, float std, mt19937_state* rng) {
    if (n < 16) {
        double held = 0.0;  // the pair's second value
        for (size_t t = 0; t < n; t++) {
            if (t % 2 == 1) { data[t] = (float)(held * std + mean); continue; }
            float angle_uniform = (float)randfloat64(rng);
            float radius_uniform = (float)randfloat64(rng);
            float radius = normal_radius_(radius_uniform);
            float angle = normal_angle_(angle_uniform);
            held = (double)(radius * sinf(angle));
            data[t] = radius * cosf(angle) * std + mean;
        }
        return;
    }
    for (size_t i = 0; i < n; i++) { data[i] = randfloat32(rng); }  // exact in float (24 bits)
    size_t blocks = n / 16;
#ifdef _OPENMP
#pragma omp parallel for schedule(static)
#endif
    for (size_t b = 0; b < blocks; b++) { normal_block16_(data + 16 * b, mean, std); }
    if (n % 16 != 0) {
        float* last = data + n - 16;
        for (int i = 0; i < 16; i++) { last[i] = randfloat32(rng); }
        normal_block16_(last, mean, std);
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
