/*
bf16_accumulate.h: what a bf16 gradient may hold after a GEMM's "+=" (cuBLASLt with beta = 1
and C = D in bf16: the weight gradients of llmc/matmul.cuh), for the GPU tests on exact data.

Why: cuBLASLt documents D = alpha * A B + beta * C computed in fp32, but an H200 (cuBLASLt
13.1) rounded the fp32 sum to bf16 before adding C, for bf16 and FP8 operands alike: an element
was previous + bf16(sum), rounded, where the previous value plus the exact sum rounded once
gives the neighbour. On exact data (every sum and every previous value exact in fp32) either
rounding is one definite bf16 value, so a test admits those two and nothing else, and says how
many came out rounded twice. On the H200 those counts were cudasim's, which always rounds the
sum first (test_matmul_attention: 30 and 9; test_fp8_kernels: 875, 177861, 17643, 21480): every
element where the two differ was rounded twice. (An fp32 D's sum is exact either way.)
*/
#ifndef TEST_BF16_ACCUMULATE_H
#define TEST_BF16_ACCUMULATE_H

#include <stdio.h>
#include <stddef.h>
#include "llmc/element_math.h"

static inline float bf16_rounded(float x) { return bf16_bits_to_float(float_to_bf16_bits(x)); }

/*
got[i] (a bf16 value) against previous[i] + sum[i] (both exact in fp32): counts the elements
that are neither rounding (printing the first under `what`) and those rounded twice only.
Returns the count of elements that are neither.
*/
static size_t bf16_accumulate_mismatches(const float* got, const float* previous, const double* sum, size_t n,
                                         const char* what) {
    size_t neither = 0, twice_only = 0;
    for (size_t i = 0; i < n; i++) {
        float once = bf16_rounded((float)((double)previous[i] + sum[i]));
        float twice = bf16_rounded(previous[i] + bf16_rounded((float)sum[i]));
        if (got[i] == once) { continue; }
        if (got[i] == twice) { twice_only++; continue; }
        if (neither == 0) {
            printf("  %s: first mismatch at %zu: got %.9g; previous %.9g + sum %.9g rounded once is %.9g, "
                   "with the sum rounded first %.9g\n", what, i, got[i], previous[i], sum[i], once, twice);
        }
        neither++;
    }
    printf("  %s: %zu of %zu elements rounded twice (the sum to bf16 first), %zu neither\n", what, twice_only, n, neither);
    return neither;
}

#endif // TEST_BF16_ACCUMULATE_H
