/*
rand.h: Mersenne Twister (MT19937) and Box-Muller normals for deterministic weight init
and data shuffling.

Why: initialization and shuffling must be reproducible across runs, machines and the
CPU/GPU trainers, so they run on the host from a fixed seed. The generator state is a
plain struct, so it can be written into the resume state file and restored exactly.
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

static inline void mt19937_twist(mt19937_state* rng) {
    for (uint32_t i = 0; i < MT19937_N; i++) {
        uint32_t y = (rng->state[i] & 0x80000000u) | (rng->state[(i + 1) % MT19937_N] & 0x7fffffffu);
        uint32_t next = rng->state[(i + MT19937_M) % MT19937_N] ^ (y >> 1);
        if (y & 1u) { next ^= 0x9908b0dfu; }
        rng->state[i] = next;
    }
    rng->index = 0;
}

static inline uint32_t randint32(mt19937_state* rng) {
    if (rng->index >= MT19937_N) { mt19937_twist(rng); }
    uint32_t y = rng->state[rng->index++];
    y ^= y >> 11;
    y ^= (y << 7) & 0x9d2c5680u;
    y ^= (y << 15) & 0xefc60000u;
    y ^= y >> 18;
    return y;
}

// uniform in [0, 1) with 24 bits of resolution
static inline float randfloat32(mt19937_state* rng) {
    return (float)(randint32(rng) & ((1u << 24) - 1)) * (1.0f / (float)(1u << 24));
}

// fills data[0..n) with N(mean, std), Box-Muller, pairs of values per two uniforms
static inline void normal_(float* data, size_t n, float mean, float std, mt19937_state* rng) {
    const double two_pi = 6.283185307179586;
    for (size_t i = 0; i < n; i += 2) {
        double u1 = 1.0 - (double)randfloat32(rng);  // (0, 1]: log is finite
        double u2 = (double)randfloat32(rng);
        double radius = sqrt(-2.0 * log(u1));
        data[i] = (float)(mean + std * radius * cos(two_pi * u2));
        if (i + 1 < n) { data[i + 1] = (float)(mean + std * radius * sin(two_pi * u2)); }
    }
}

// Fisher-Yates shuffle of an int array
static inline void random_permutation(int* data, int n, mt19937_state* rng) {
    for (int i = 0; i < n; i++) { data[i] = i; }
    for (int i = n - 1; i > 0; i--) {
        int j = (int)(randint32(rng) % (uint32_t)(i + 1));
        int tmp = data[i]; data[i] = data[j]; data[j] = tmp;
    }
}

#endif // LLMC_RAND_H
