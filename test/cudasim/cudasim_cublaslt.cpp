/*
cudasim_cublaslt.cpp: the cuBLASLt calls llm8 makes (llmc/matmul.cuh), computed on the CPU
from cuBLASLt's documented semantics. See cudasim.h.

Why: llm8's every GEMM goes through cublasLtMatmul, and the ways it can be wrong are mostly
ways of calling cuBLASLt wrongly: a transpose or a leading dimension swapped, a scale tensor
in the wrong layout, an FP8 GEMM that is not "TN", a size or pointer the FP8 kernels refuse,
an epilogue without its pointer. So this emulation computes exactly what the documentation
says the call means and refuses what the documentation says the library refuses, with the
status the library returns and one line on stderr, "cudasim cublasLt: ...", naming the rule.

What a call means (cuBLASLt documentation, cublasLtMatmul and cublasLtMatmulDescAttributes_t):
matrices are column-major: element (row, col) of a layout is at data[row + col * ld].
    D = epilogue(alpha * scale_A * scale_B * op(A) op(B) + beta * C [+ bias])
op(A) is m x k, op(B) k x n, C and D m x n; with beta == 0 C is not read (BLAS convention).
The bias [m] is broadcast along the columns; GELU_AUX epilogues store the GELU input (after
the bias) in the aux matrix [aux_ld x n], in D's type unless EPILOGUE_AUX_DATA_TYPE says
otherwise; DGELU reads that matrix back and multiplies the product by GELU's derivative at it.
An FP8 D (from FP8 operands, with a bf16 C type, beta 0) is the epilogue's result times the D
scale (D_SCALE_POINTER, NULL: 1) converted to the nearest code, saturating (fp8_code_saturating),
and AMAX_D_POINTER receives the largest |result| before the D scale, a NaN winning; a bias or a
GELU aux with an FP8 D must have its type set (bf16), and DGELU with one is refused, as an H200
refused it. A D scale or amax pointer with a bf16 or fp32 D is refused (NOT_SUPPORTED).
FP8 scale modes: SCALAR_32F, one float (NULL: 1); VEC128_32F, one float per row of op(X)^T per
128 elements along K, rows fastest: scale[(k / 128) * rows + row];
BLK128x128_32F, one float per 128x128 block, K blocks fastest, each row of blocks padded to a
multiple of 4 floats: scale[(row / 128) * round_up(ceil(K / 128), 4) + k / 128] ("Scaling
factors layouts" in the cuBLAS documentation; rows are m for A, n for B).

Numerics: operands are decoded exactly to fp32 (bf16, E4M3, E5M2 are subsets of it); each
dot product is accumulated in fp32 in a fixed order (16 lanes along K, then the lanes in
order), per 128-element K block when block scaling applies; the epilogue runs in fp32 and D
is rounded once (bf16: round to nearest even). The dequantization scales are multiplied
together first, then into the sum (per K block with block scaling), as CUTLASS's sm90 FP8
epilogue and blockwise mainloop do: (sum * scale_A) * scale_B overflows fp32 where the true
result does not (an 8e35 weight's scale_inv of 1.8e33 times a sum of 448 x 448). So results
are deterministic and at least as accurate as a GPU's; FAST_ACCUM is accepted and changes
nothing. The order is the algorithm's,
and the heuristic picks its algorithm by the MIN_ALIGNMENT preferences as the library may: a
promised 256-byte alignment on all four matrices (and cublasLtMatmul without an algorithm)
sums as above, any less aligned promise takes 8 lanes along K instead, whose bits differ. So
a claim that two configurations give the same bits fails here when they hand the same GEMM
pointers of different alignment (a per-layer slice at an odd offset in one, a buffer of its
own in the other), as it may on a GPU. Asked for several, the heuristic lists 3 algorithms;
the second sums in the other lane count than the first (bench_gemm's --algorithms times
them). One rounding more, as an
H200 showed (cuBLASLt 13.1, bf16 and FP8 operands alike): with beta != 0 the sum is rounded
to D's type before C is added, so a bf16 D += is rounded twice (an fp32 D's sum stays exact).
The emulation does that always, and matched the H200 on every element of the exact tests
(test/bf16_accumulate.h); those tests still admit either rounding, for other GPUs'
algorithms. The GELU epilogue is taken to be the tanh approximation: the documentation says
only "GELU"; DGELU is its exact derivative.

Refused as the library refuses (the FP8 rules are those of cublasLtMatmul's "FP8" section for
Hopper, sm_90, the GPU llm8 targets): FP8 operands not in the TN layout (A transposed, B not),
FP8 with a non-FP8 operand or E5M2 x E5M2, FP8 sizes m, n, k or leading dimensions not
multiples of 16 bytes, FP8 matrix pointers not 16-byte aligned, block scaling other than
VEC128 x VEC128, VEC128 x BLK128x128, BLK128x128 x VEC128, block scaling without both scale
pointers or with scale arrays not 16-byte aligned, per-tensor scale pointers not 16-byte
aligned (at cublasLtMatmul only, as the H200 did: its heuristic accepted them), scale pointers
or modes with non-FP8 operands, a BIAS epilogue without its pointer, a GELU_AUX epilogue
without its pointer or with an aux leading dimension below m or not a multiple of 8 (DGELU's
too), layouts whose sizes do not fit together, a workspace not 256-byte aligned, and a pointer less aligned than the MIN_ALIGNMENT
preference the algorithm was chosen for. What the emulation does not do (other types,
epilogues, attributes, orders, batches) is refused too, with CUBLAS_STATUS_NOT_SUPPORTED and a
line saying "not emulated". Block scaling takes any K (a multiple of 16 as FP8 needs): the
documentation's L = ceil(K / 128) blocks, the last one short (CUDASIM_CUBLASLT_WHOLE_K_BLOCKS=1
plays a library that refuses such a K, so a test can see what llm8 says then). The scale layouts are those of
the documentation's "Scaling factors layouts" (cuBLAS 13): VEC128 is M-major M x L for A and
N-major N x L for B; BLK128x128 is K-major, L4 x ceil(M / 128) for A and L4 x ceil(N / 128)
for B, L4 being L rounded up to a multiple of 4.
Beyond the library: D (or aux) overlapping A or B is refused, as its result on a GPU is
undefined; and the workspace's first and last byte are read, so a workspace smaller than
its stated size faults at cudasim's guard page.

Where the documentation is ambiguous, the choice made: GELU is applied to the fp32
pre-activation, not to the aux copy rounded to its type; block scaling with FAST_ACCUM is
refused (DESIGN.md: the block modes "take no fast accumulation"; PyTorch refuses it too),
while the epilogues are not restricted under block scaling (TransformerEngine uses only
DEFAULT, BIAS and DGELU there); DGELU with beta != 0 is refused as not emulated (whether C
joins before the derivative is not said); a pointer below the algorithm's promised alignment gets
INVALID_VALUE (the documentation only says such algorithms are excluded by the preference).
*/
#include "cudasim.h"
#include <cublasLt.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <stdio.h>
#include <vector>

struct cublasLtContext {
    int unused;
};

namespace {

// ----------------------------------------------------------------------------------------
// refusals

const char* status_name(cublasStatus_t status) {
    switch (status) {
        case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
        case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
        case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
        case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
        case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
        case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
        case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
        case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
        case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
        case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
    }
    return "CUBLAS_STATUS_UNKNOWN";
}

__attribute__((format(printf, 2, 3)))
cublasStatus_t refuse(cublasStatus_t status, const char* format, ...) {
    char text[512];
    va_list args;
    va_start(args, format);
    vsnprintf(text, sizeof(text), format, args);
    va_end(args);
    fprintf(stderr, "cudasim cublasLt: %s (%s)\n", text, status_name(status));
    return status;
}

#define REFUSE_IF(condition, status, ...) do { if (condition) { return refuse((status), __VA_ARGS__); } } while (0)

// ----------------------------------------------------------------------------------------
// descriptors: plain structs behind the opaque pointers, attributes set by size-checked copy

struct MatmulDesc {
    int32_t compute_type;
    int32_t scale_type;
    int32_t pointer_mode = CUBLASLT_POINTER_MODE_HOST;
    int32_t transpose[3] = {CUBLAS_OP_N, CUBLAS_OP_N, CUBLAS_OP_N};  // A, B, C
    uint32_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    const void* bias = nullptr;
    int32_t bias_type = -1;  // -1: the documented default
    void* aux = nullptr;
    int64_t aux_ld = 0;
    int32_t aux_type = -1;   // -1: D's type
    const void* scale[2] = {nullptr, nullptr};  // A, B
    const void* d_scale = nullptr;  // FP8 D: multiplies the epilogue's result before the conversion
    void* amax_d = nullptr;         // FP8 D: receives the largest |epilogue result| (before d_scale)
    int32_t scale_mode[2] = {CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F, CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F};
    int8_t fast_accumulate = 0;
    int32_t sm_count_target = 0;  // a performance hint
};

struct MatrixLayout {
    cudaDataType_t type;
    uint64_t rows, cols;
    int64_t ld;
};

struct Preference {
    uint32_t search_mode = CUBLASLT_SEARCH_BEST_FIT;
    uint64_t max_workspace_bytes = 0;
    uint32_t reduction_scheme_mask = CUBLASLT_REDUCTION_SCHEME_MASK;
    uint32_t min_alignment[4] = {256, 256, 256, 256};  // A, B, C, D
    float max_waves_count = 0.0f;
    uint64_t impl_mask = ~(uint64_t)0;
};

MatmulDesc* desc_of(cublasLtMatmulDesc_t d) { return reinterpret_cast<MatmulDesc*>(d); }
MatrixLayout* layout_of(cublasLtMatrixLayout_t l) { return reinterpret_cast<MatrixLayout*>(l); }
Preference* preference_of(cublasLtMatmulPreference_t p) { return reinterpret_cast<Preference*>(p); }

struct AttributeSlot {
    void* field;
    size_t bytes;
};

cublasStatus_t set_attribute(const char* kind, int attribute, AttributeSlot slot, const void* buffer, size_t bytes) {
    REFUSE_IF(slot.field == nullptr, CUBLAS_STATUS_NOT_SUPPORTED, "%s attribute %d is not emulated", kind, attribute);
    REFUSE_IF(buffer == nullptr || bytes != slot.bytes, CUBLAS_STATUS_INVALID_VALUE,
              "%s attribute %d takes %zu bytes, got %zu%s", kind, attribute, slot.bytes, bytes,
              buffer == nullptr ? " and a NULL buffer" : "");
    memcpy(slot.field, buffer, bytes);
    return CUBLAS_STATUS_SUCCESS;
}

AttributeSlot desc_slot(MatmulDesc* d, cublasLtMatmulDescAttributes_t attribute) {
    switch (attribute) {
        case CUBLASLT_MATMUL_DESC_COMPUTE_TYPE: return {&d->compute_type, sizeof(int32_t)};
        case CUBLASLT_MATMUL_DESC_SCALE_TYPE: return {&d->scale_type, sizeof(int32_t)};
        case CUBLASLT_MATMUL_DESC_POINTER_MODE: return {&d->pointer_mode, sizeof(int32_t)};
        case CUBLASLT_MATMUL_DESC_TRANSA: return {&d->transpose[0], sizeof(int32_t)};
        case CUBLASLT_MATMUL_DESC_TRANSB: return {&d->transpose[1], sizeof(int32_t)};
        case CUBLASLT_MATMUL_DESC_TRANSC: return {&d->transpose[2], sizeof(int32_t)};
        case CUBLASLT_MATMUL_DESC_EPILOGUE: return {&d->epilogue, sizeof(uint32_t)};
        case CUBLASLT_MATMUL_DESC_BIAS_POINTER: return {&d->bias, sizeof(void*)};
        case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE: return {&d->bias_type, sizeof(int32_t)};
        case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER: return {&d->aux, sizeof(void*)};
        case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD: return {&d->aux_ld, sizeof(int64_t)};
        case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE: return {&d->aux_type, sizeof(int32_t)};
        case CUBLASLT_MATMUL_DESC_A_SCALE_POINTER: return {&d->scale[0], sizeof(void*)};
        case CUBLASLT_MATMUL_DESC_B_SCALE_POINTER: return {&d->scale[1], sizeof(void*)};
        case CUBLASLT_MATMUL_DESC_D_SCALE_POINTER: return {&d->d_scale, sizeof(void*)};
        case CUBLASLT_MATMUL_DESC_AMAX_D_POINTER: return {&d->amax_d, sizeof(void*)};
        case CUBLASLT_MATMUL_DESC_A_SCALE_MODE: return {&d->scale_mode[0], sizeof(int32_t)};
        case CUBLASLT_MATMUL_DESC_B_SCALE_MODE: return {&d->scale_mode[1], sizeof(int32_t)};
        case CUBLASLT_MATMUL_DESC_FAST_ACCUM: return {&d->fast_accumulate, sizeof(int8_t)};
        case CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET: return {&d->sm_count_target, sizeof(int32_t)};
        default: return {nullptr, 0};
    }
}

AttributeSlot preference_slot(Preference* p, cublasLtMatmulPreferenceAttributes_t attribute) {
    switch (attribute) {
        case CUBLASLT_MATMUL_PREF_SEARCH_MODE: return {&p->search_mode, sizeof(uint32_t)};
        case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES: return {&p->max_workspace_bytes, sizeof(uint64_t)};
        case CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK: return {&p->reduction_scheme_mask, sizeof(uint32_t)};
        case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES: return {&p->min_alignment[0], sizeof(uint32_t)};
        case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES: return {&p->min_alignment[1], sizeof(uint32_t)};
        case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES: return {&p->min_alignment[2], sizeof(uint32_t)};
        case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES: return {&p->min_alignment[3], sizeof(uint32_t)};
        case CUBLASLT_MATMUL_PREF_MAX_WAVES_COUNT: return {&p->max_waves_count, sizeof(float)};
        case CUBLASLT_MATMUL_PREF_IMPL_MASK: return {&p->impl_mask, sizeof(uint64_t)};
        default: return {nullptr, 0};
    }
}

// ----------------------------------------------------------------------------------------
// element types: decoded exactly to fp32, stored with one rounding

bool is_fp8(cudaDataType_t type) { return type == CUDA_R_8F_E4M3 || type == CUDA_R_8F_E5M2; }

// bytes of an emulated element type, 0 for the others
size_t element_bytes(cudaDataType_t type) {
    switch (type) {
        case CUDA_R_32F: return 4;
        case CUDA_R_16BF: return 2;
        case CUDA_R_8F_E4M3: case CUDA_R_8F_E5M2: return 1;
        default: return 0;
    }
}

float float_from_bits(uint32_t bits) { float f; memcpy(&f, &bits, 4); return f; }
uint32_t bits_from_float(float f) { uint32_t bits; memcpy(&bits, &f, 4); return bits; }

// an FP8 code with exponent_bits (4: E4M3, 5: E5M2) per the OCP FP8 formats: E4M3 has no
// infinity and one NaN mantissa (all ones with exponent all ones); E5M2 follows IEEE 754
float fp8_value(uint8_t code, int exponent_bits) {
    const int mantissa_bits = 7 - exponent_bits;
    const int bias = (1 << (exponent_bits - 1)) - 1;
    const int exponent_max = (1 << exponent_bits) - 1;
    const int exponent = (code >> mantissa_bits) & exponent_max;
    const int mantissa = code & ((1 << mantissa_bits) - 1);
    const float sign = (code & 0x80) ? -1.0f : 1.0f;
    if (exponent_bits == 4 && exponent == exponent_max && mantissa == (1 << mantissa_bits) - 1) { return NAN; }
    if (exponent_bits == 5 && exponent == exponent_max) { return mantissa == 0 ? sign * INFINITY : NAN; }
    if (exponent == 0) { return sign * ldexpf((float)mantissa, 1 - bias - mantissa_bits); }
    return sign * ldexpf((float)(mantissa + (1 << mantissa_bits)), exponent - bias - mantissa_bits);
}

struct Fp8Tables {
    float e4m3[256], e5m2[256];
    Fp8Tables() {
        for (int code = 0; code < 256; code++) {
            e4m3[code] = fp8_value((uint8_t)code, 4);
            e5m2[code] = fp8_value((uint8_t)code, 5);
        }
    }
};
const Fp8Tables fp8_tables;

/*
The FP8 code of value for an FP8 D: to nearest, ties to the even code, saturating to the
largest finite magnitude (Inf too), NaN to a NaN code (0x7f is one in both formats). That
cuBLASLt's FP8 outputs saturate is this emulation's reading (the documentation does not say);
test_fp8_kernels' fused GEMM case checks it on a GPU.
*/
uint8_t fp8_code_saturating(float value, cudaDataType_t type) {
    if (value != value) { return 0x7f; }
    const float* table = type == CUDA_R_8F_E4M3 ? fp8_tables.e4m3 : fp8_tables.e5m2;
    const int largest = type == CUDA_R_8F_E4M3 ? 0x7e : 0x7b;  // the largest finite positive code
    const uint8_t sign = (bits_from_float(value) >> 24) & 0x80;
    const float magnitude = fabsf(value);
    if (magnitude >= table[largest]) { return (uint8_t)(sign | largest); }
    int below = 0, top = largest;  // the largest code whose value is at most magnitude, by bisection
    while (below < top) {
        const int mid = (below + top + 1) / 2;
        if (table[mid] <= magnitude) { below = mid; } else { top = mid - 1; }
    }
    // both differences are exact (Sterbenz: the two neighbours are within a factor of 2, or the lower is 0)
    const float to_below = magnitude - table[below], to_above = table[below + 1] - magnitude;
    const int code = to_below < to_above ? below : to_above < to_below ? below + 1 : (below % 2 == 0 ? below : below + 1);
    return (uint8_t)(sign | code);
}

float load_element(const void* data, cudaDataType_t type, size_t index) {
    switch (type) {
        case CUDA_R_32F: return ((const float*)data)[index];
        case CUDA_R_16BF: return float_from_bits((uint32_t)((const uint16_t*)data)[index] << 16);
        case CUDA_R_8F_E4M3: return fp8_tables.e4m3[((const uint8_t*)data)[index]];
        case CUDA_R_8F_E5M2: return fp8_tables.e5m2[((const uint8_t*)data)[index]];
        default: abort();  // the checks admit only the types above
    }
}

uint16_t bf16_round_nearest_even(float value) {
    uint32_t bits = bits_from_float(value);
    if ((bits & 0x7fffffffu) > 0x7f800000u) { return (uint16_t)((bits >> 16) | 0x0040u); }  // NaN stays (quiet) NaN
    bits += 0x7fffu + ((bits >> 16) & 1u);
    return (uint16_t)(bits >> 16);
}

// value as D's type holds it (bf16: rounded to nearest even), in fp32
float rounded_to(cudaDataType_t type, float value) {
    return type == CUDA_R_16BF ? float_from_bits((uint32_t)bf16_round_nearest_even(value) << 16) : value;
}

void store_element(void* data, cudaDataType_t type, size_t index, float value) {
    switch (type) {
        case CUDA_R_32F: ((float*)data)[index] = value; break;
        case CUDA_R_16BF: ((uint16_t*)data)[index] = bf16_round_nearest_even(value); break;
        case CUDA_R_8F_E4M3: case CUDA_R_8F_E5M2: ((uint8_t*)data)[index] = fp8_code_saturating(value, type); break;
        default: abort();  // the checks admit only these outputs
    }
}

// ----------------------------------------------------------------------------------------
// the problem and its checks

const uint32_t ALIGNMENT_CAP = 256;  // the largest alignment a preference or an algorithm asks for

uint32_t pointer_alignment(const void* pointer) {
    uint32_t alignment = ALIGNMENT_CAP;
    while (alignment > 1 && ((uintptr_t)pointer) % alignment != 0) { alignment /= 2; }
    return alignment;
}

const char* const MATRIX_NAMES[4] = {"A", "B", "C", "D"};

struct Problem {
    const MatmulDesc* desc;
    const MatrixLayout* layouts[4];  // A, B, C, D
    uint64_t m, n, k;
    bool transpose_a, transpose_b;
    bool block_scaled;
    bool has_bias, has_aux, gelu, dgelu;
    cudaDataType_t bias_type, aux_type;
};

bool epilogue_is_emulated(uint32_t epilogue) {
    switch (epilogue) {
        case CUBLASLT_EPILOGUE_DEFAULT: case CUBLASLT_EPILOGUE_BIAS:
        case CUBLASLT_EPILOGUE_GELU: case CUBLASLT_EPILOGUE_GELU_BIAS:
        case CUBLASLT_EPILOGUE_GELU_AUX: case CUBLASLT_EPILOGUE_GELU_AUX_BIAS: case CUBLASLT_EPILOGUE_DGELU:
            return true;
        default:
            return false;
    }
}

bool is_block_scale_mode(int32_t mode) {
    return mode == CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F || mode == CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
}

// the descriptor, the layouts and the epilogue: everything but the data pointers
cublasStatus_t check_problem_shape(Problem* p) {
    const MatmulDesc& d = *p->desc;
    const MatrixLayout &a = *p->layouts[0], &b = *p->layouts[1], &c = *p->layouts[2], &out = *p->layouts[3];
    REFUSE_IF(d.compute_type != CUBLAS_COMPUTE_32F || d.scale_type != CUDA_R_32F, CUBLAS_STATUS_NOT_SUPPORTED,
              "compute type %d with scale type %d is not emulated (only CUBLAS_COMPUTE_32F with CUDA_R_32F)",
              d.compute_type, d.scale_type);
    REFUSE_IF(d.pointer_mode != CUBLASLT_POINTER_MODE_HOST && d.pointer_mode != CUBLASLT_POINTER_MODE_DEVICE,
              CUBLAS_STATUS_NOT_SUPPORTED, "pointer mode %d is not emulated (alpha and beta scalars only)", d.pointer_mode);
    for (int i = 0; i < 3; i++) {
        REFUSE_IF(d.transpose[i] != CUBLAS_OP_N && d.transpose[i] != CUBLAS_OP_T, CUBLAS_STATUS_NOT_SUPPORTED,
                  "operation %d on %s is not emulated (CUBLAS_OP_N or CUBLAS_OP_T)", d.transpose[i], MATRIX_NAMES[i]);
    }
    REFUSE_IF(d.transpose[2] != CUBLAS_OP_N, CUBLAS_STATUS_NOT_SUPPORTED, "TRANSC must be CUBLAS_OP_N");
    for (int i = 0; i < 4; i++) {
        const MatrixLayout& l = *p->layouts[i];
        REFUSE_IF(element_bytes(l.type) == 0, CUBLAS_STATUS_NOT_SUPPORTED, "%s type %d is not emulated "
                  "(CUDA_R_32F, CUDA_R_16BF, CUDA_R_8F_E4M3, CUDA_R_8F_E5M2)", MATRIX_NAMES[i], (int)l.type);
        REFUSE_IF(l.ld < (int64_t)l.rows || l.ld < 1, CUBLAS_STATUS_INVALID_VALUE,
                  "%s leading dimension %lld is below its %llu rows", MATRIX_NAMES[i], (long long)l.ld,
                  (unsigned long long)l.rows);
    }
    p->transpose_a = d.transpose[0] == CUBLAS_OP_T;
    p->transpose_b = d.transpose[1] == CUBLAS_OP_T;
    p->m = out.rows;
    p->n = out.cols;
    p->k = p->transpose_a ? a.rows : a.cols;
    const uint64_t a_m = p->transpose_a ? a.cols : a.rows;
    const uint64_t b_k = p->transpose_b ? b.cols : b.rows, b_n = p->transpose_b ? b.rows : b.cols;
    REFUSE_IF(a_m != p->m || b_k != p->k || b_n != p->n || c.rows != p->m || c.cols != p->n, CUBLAS_STATUS_INVALID_VALUE,
              "sizes do not fit: op(A) %llux%llu, op(B) %llux%llu, C %llux%llu, D %llux%llu",
              (unsigned long long)a_m, (unsigned long long)p->k, (unsigned long long)b_k, (unsigned long long)b_n,
              (unsigned long long)c.rows, (unsigned long long)c.cols, (unsigned long long)p->m, (unsigned long long)p->n);

    const bool fp8 = is_fp8(a.type) || is_fp8(b.type);
    const char* shape = p->transpose_a ? (p->transpose_b ? "TT" : "TN") : (p->transpose_b ? "NT" : "NN");
    const bool fp8_d = is_fp8(out.type);
    REFUSE_IF(out.type != CUDA_R_16BF && out.type != CUDA_R_32F && !fp8_d, CUBLAS_STATUS_NOT_SUPPORTED,
              "D type %d is not emulated (CUDA_R_16BF, CUDA_R_32F, or FP8 from FP8 operands)", (int)out.type);
    if (fp8_d) {
        REFUSE_IF(!fp8, CUBLAS_STATUS_NOT_SUPPORTED, "an FP8 D needs FP8 operands");
        REFUSE_IF(c.type != CUDA_R_16BF, CUBLAS_STATUS_NOT_SUPPORTED,
                  "C type %d with an FP8 D is not emulated (CUDA_R_16BF: an FP8 D takes no FP8 C)", (int)c.type);
    } else {
        REFUSE_IF(c.type != out.type, CUBLAS_STATUS_NOT_SUPPORTED, "C type %d differs from D type %d", (int)c.type, (int)out.type);
        // as an H200's cuBLASLt 13.1 refused it (dev/bench/probe_epilogues.cu), and DESIGN.md section 3 says of CUDA 13
        REFUSE_IF(d.amax_d != nullptr || d.d_scale != nullptr, CUBLAS_STATUS_NOT_SUPPORTED,
                  "a D scale or D amax pointer needs an FP8 D (D type %d)", (int)out.type);
    }
    REFUSE_IF(d.amax_d != nullptr && pointer_alignment(d.amax_d) < 4, CUBLAS_STATUS_INVALID_VALUE,
              "D amax pointer %p is not float-aligned", d.amax_d);
    REFUSE_IF(d.d_scale != nullptr && pointer_alignment(d.d_scale) < 4, CUBLAS_STATUS_INVALID_VALUE,
              "D scale pointer %p is not float-aligned", d.d_scale);
    if (fp8) {
        REFUSE_IF(!is_fp8(a.type) || !is_fp8(b.type), CUBLAS_STATUS_NOT_SUPPORTED,
                  "FP8 GEMMs need both A and B in FP8 (A type %d, B type %d)", (int)a.type, (int)b.type);
        REFUSE_IF(a.type == CUDA_R_8F_E5M2 && b.type == CUDA_R_8F_E5M2, CUBLAS_STATUS_NOT_SUPPORTED,
                  "FP8 GEMMs do not take E5M2 x E5M2");
        REFUSE_IF(!p->transpose_a || p->transpose_b, CUBLAS_STATUS_NOT_SUPPORTED,
                  "FP8 GEMMs need A transposed and B not (the TN layout) on sm_90, got %s", shape);
        REFUSE_IF(p->m % 16 || p->n % 16 || p->k % 16, CUBLAS_STATUS_NOT_SUPPORTED,
                  "FP8 GEMMs need m, n, k multiples of 16, got m=%llu n=%llu k=%llu",
                  (unsigned long long)p->m, (unsigned long long)p->n, (unsigned long long)p->k);
        for (int i = 0; i < 4; i++) {
            const MatrixLayout& l = *p->layouts[i];
            REFUSE_IF(l.ld * element_bytes(l.type) % 16 != 0, CUBLAS_STATUS_NOT_SUPPORTED,
                      "FP8 GEMMs need leading dimensions of 16 bytes' multiples: %s's is %lld elements of %zu bytes",
                      MATRIX_NAMES[i], (long long)l.ld, element_bytes(l.type));
        }
    } else {
        REFUSE_IF(a.type != CUDA_R_16BF || b.type != CUDA_R_16BF, CUBLAS_STATUS_NOT_SUPPORTED,
                  "A type %d with B type %d is not emulated (bf16 x bf16, or FP8)", (int)a.type, (int)b.type);
        REFUSE_IF(d.scale[0] != nullptr || d.scale[1] != nullptr, CUBLAS_STATUS_INVALID_VALUE,
                  "A/B scale pointers are for FP8 operands");
    }

    const int32_t mode_a = d.scale_mode[0], mode_b = d.scale_mode[1];
    for (int i = 0; i < 2; i++) {
        const int32_t mode = d.scale_mode[i];
        REFUSE_IF(mode != CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F && !is_block_scale_mode(mode), CUBLAS_STATUS_NOT_SUPPORTED,
                  "%s scale mode %d is not emulated (SCALAR_32F, VEC128_32F, BLK128x128_32F)", MATRIX_NAMES[i], mode);
    }
    p->block_scaled = is_block_scale_mode(mode_a) || is_block_scale_mode(mode_b);
    if (p->block_scaled) {
        REFUSE_IF(!fp8, CUBLAS_STATUS_NOT_SUPPORTED, "block scale modes are for FP8 operands");
        REFUSE_IF(!is_block_scale_mode(mode_a) || !is_block_scale_mode(mode_b) ||
                  (mode_a == CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F && mode_b == CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F),
                  CUBLAS_STATUS_NOT_SUPPORTED, "scale modes A=%d B=%d: block scaling takes VEC128 x VEC128, "
                  "VEC128 x BLK128x128 or BLK128x128 x VEC128", mode_a, mode_b);
        REFUSE_IF(d.fast_accumulate != 0, CUBLAS_STATUS_NOT_SUPPORTED, "block scaling takes no FAST_ACCUM");
        REFUSE_IF(d.scale[0] == nullptr || d.scale[1] == nullptr, CUBLAS_STATUS_INVALID_VALUE,
                  "block scale modes need both A and B scale pointers");
        for (int i = 0; i < 2; i++) {
            REFUSE_IF(pointer_alignment(d.scale[i]) < 16, CUBLAS_STATUS_INVALID_VALUE,
                      "%s block scale pointer %p is not 16-byte aligned", MATRIX_NAMES[i], d.scale[i]);
        }
        const char* whole_blocks = getenv("CUDASIM_CUBLASLT_WHOLE_K_BLOCKS");
        REFUSE_IF(whole_blocks != nullptr && strcmp(whole_blocks, "1") == 0 && p->k % 128 != 0, CUBLAS_STATUS_NOT_SUPPORTED,
                  "block scaling with k=%llu, not a multiple of 128 (CUDASIM_CUBLASLT_WHOLE_K_BLOCKS=1)",
                  (unsigned long long)p->k);
    } else {
        for (int i = 0; i < 2; i++) {
            REFUSE_IF(pointer_alignment(d.scale[i]) < 4, CUBLAS_STATUS_INVALID_VALUE,
                      "%s scale pointer %p is not float-aligned", MATRIX_NAMES[i], d.scale[i]);
        }
    }

    REFUSE_IF(!epilogue_is_emulated(d.epilogue), CUBLAS_STATUS_NOT_SUPPORTED,
              "epilogue %u is not emulated (DEFAULT, BIAS, GELU, GELU_BIAS, GELU_AUX, GELU_AUX_BIAS, DGELU)", d.epilogue);
    p->has_bias = (d.epilogue & CUBLASLT_EPILOGUE_BIAS) != 0;
    p->gelu = (d.epilogue & CUBLASLT_EPILOGUE_GELU) != 0;
    p->dgelu = d.epilogue == CUBLASLT_EPILOGUE_DGELU;
    p->has_aux = (d.epilogue & 128) != 0;  // the _AUX bit of cublasLtEpilogue_t: GELU_AUX writes it, DGELU reads it
    if (p->has_bias) {
        REFUSE_IF(d.bias == nullptr, CUBLAS_STATUS_INVALID_VALUE, "epilogue %u needs CUBLASLT_MATMUL_DESC_BIAS_POINTER", d.epilogue);
        // the documented default: D's type, but bf16 for FP8 GEMMs with an fp32 D
        cudaDataType_t default_type = fp8 && out.type == CUDA_R_32F ? CUDA_R_16BF : out.type;
        REFUSE_IF(fp8_d && d.bias_type == -1, CUBLAS_STATUS_NOT_SUPPORTED,
                  "a bias with an FP8 D and no BIAS_DATA_TYPE is not emulated");
        p->bias_type = d.bias_type == -1 ? default_type : (cudaDataType_t)d.bias_type;
        REFUSE_IF(p->bias_type != CUDA_R_16BF && p->bias_type != CUDA_R_32F, CUBLAS_STATUS_NOT_SUPPORTED,
                  "bias type %d is not emulated (CUDA_R_16BF or CUDA_R_32F)", (int)p->bias_type);
        REFUSE_IF(pointer_alignment(d.bias) < element_bytes(p->bias_type), CUBLAS_STATUS_INVALID_VALUE,
                  "bias pointer %p is not aligned to its elements", d.bias);
    }
    if (p->has_aux) {
        REFUSE_IF(d.aux == nullptr, CUBLAS_STATUS_INVALID_VALUE, "epilogue %u needs CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER", d.epilogue);
        REFUSE_IF(d.aux_ld < (int64_t)p->m || d.aux_ld % 8 != 0, CUBLAS_STATUS_INVALID_VALUE,
                  "GELU aux leading dimension %lld must be a multiple of 8 and at least m=%llu", (long long)d.aux_ld,
                  (unsigned long long)p->m);
        // an FP8 D's default aux type is not said plainly ("with some exceptions"): llm8 names it
        REFUSE_IF(fp8_d && d.aux_type == -1, CUBLAS_STATUS_NOT_SUPPORTED,
                  "a GELU aux with an FP8 D and no EPILOGUE_AUX_DATA_TYPE is not emulated");
        REFUSE_IF(fp8_d && p->dgelu, CUBLAS_STATUS_NOT_SUPPORTED,
                  "DGELU with an FP8 D (an H200's cuBLASLt 13.1 had no algorithm for it: dev/bench/probe_epilogues.cu)");
        p->aux_type = d.aux_type == -1 ? out.type : (cudaDataType_t)d.aux_type;
        REFUSE_IF(p->aux_type != CUDA_R_16BF && p->aux_type != CUDA_R_32F, CUBLAS_STATUS_NOT_SUPPORTED,
                  "aux type %d is not emulated (CUDA_R_16BF or CUDA_R_32F)", (int)p->aux_type);
        REFUSE_IF(pointer_alignment(d.aux) < element_bytes(p->aux_type), CUBLAS_STATUS_INVALID_VALUE,
                  "aux pointer %p is not aligned to its elements", d.aux);
    }
    return CUBLAS_STATUS_SUCCESS;
}

// alignment[i]: what matrix i's pointer is (cublasLtMatmul) or is promised to be (the heuristic)
cublasStatus_t check_alignments(const Problem& p, const uint32_t alignment[4], const char* whose) {
    const bool fp8 = is_fp8(p.layouts[0]->type);
    for (int i = 0; i < 4; i++) {
        const size_t bytes = element_bytes(p.layouts[i]->type);
        REFUSE_IF(alignment[i] < bytes, CUBLAS_STATUS_INVALID_VALUE, "%s %s alignment %u is below its %zu-byte elements",
                  MATRIX_NAMES[i], whose, alignment[i], bytes);
        REFUSE_IF(fp8 && alignment[i] < 16, CUBLAS_STATUS_NOT_SUPPORTED, "FP8 GEMMs need 16-byte aligned matrices: "
                  "%s %s alignment is %u", MATRIX_NAMES[i], whose, alignment[i]);
    }
    return CUBLAS_STATUS_SUCCESS;
}

// bytes a layout spans from its first element to past its last
size_t layout_span_bytes(const MatrixLayout& l) {
    if (l.rows == 0 || l.cols == 0) { return 0; }
    return ((size_t)l.ld * (l.cols - 1) + l.rows) * element_bytes(l.type);
}

bool spans_overlap(const void* p, size_t p_bytes, const void* q, size_t q_bytes) {
    const char *p0 = (const char*)p, *q0 = (const char*)q;
    return p_bytes > 0 && q_bytes > 0 && p0 < q0 + q_bytes && q0 < p0 + p_bytes;
}

// ----------------------------------------------------------------------------------------
// the computation

// op(X) as rows x k fp32, each row contiguous along K; X stored k x rows when transposed
// (op(X) = X^T, rows contiguous already), rows x k otherwise
std::vector<float> operand_rows(const void* data, const MatrixLayout& layout, bool transposed, uint64_t rows, uint64_t k) {
    std::vector<float> out(rows * k);
    for (uint64_t row = 0; row < rows; row++) {
        for (uint64_t p = 0; p < k; p++) {
            size_t index = transposed ? p + row * (size_t)layout.ld : row + p * (size_t)layout.ld;
            out[row * k + p] = load_element(data, layout.type, index);
        }
    }
    return out;
}

// one operand's dequantization scale for (row of op(X)^T, K block of 128)
struct OperandScale {
    int32_t mode;
    const float* values;  // NULL: 1 (scalar mode only)
    uint64_t rows;
    uint64_t padded_k_blocks;  // BLK128x128: each row of blocks padded to 4 floats

    OperandScale(int32_t mode_, const void* values_, uint64_t rows_, uint64_t k)
        : mode(mode_), values((const float*)values_), rows(rows_), padded_k_blocks(((k + 127) / 128 + 3) / 4 * 4) {}

    float at(uint64_t row, uint64_t k_block) const {
        switch (mode) {
            case CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F: return values[k_block * rows + row];
            case CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F: return values[row / 128 * padded_k_blocks + k_block];
            default: return values != nullptr ? values[0] : 1.0f;
        }
    }
};

typedef float Lanes __attribute__((vector_size(32)));
const int LANES = 8;

// sums[c] = the sum of a[i] * b[c][i] in fp32 for COLUMNS rows b[c] of op(B)^T, each in the
// same order: two 8-lane accumulators along K (one with SPLIT false: the less aligned
// algorithm's order), then the lanes in order. A load of a serves every column (test_gpt2
// under cudasim: 232 -> 222 s at 4 columns); a column's bits do not depend on COLUMNS.
template <int COLUMNS, bool SPLIT>
void dots(const float* a, const float* const* b, uint64_t count, float* sums) {
    Lanes even[COLUMNS] = {}, odd[COLUMNS] = {};
    uint64_t i = 0;
    for (; i + 2 * LANES <= count; i += 2 * LANES) {
        Lanes a0, a1;
        memcpy(&a0, a + i, sizeof(Lanes)); memcpy(&a1, a + i + LANES, sizeof(Lanes));
        for (int c = 0; c < COLUMNS; c++) {
            Lanes b0, b1;
            memcpy(&b0, b[c] + i, sizeof(Lanes)); memcpy(&b1, b[c] + i + LANES, sizeof(Lanes));
            even[c] += a0 * b0;
            if (SPLIT) { odd[c] += a1 * b1; } else { even[c] += a1 * b1; }
        }
    }
    for (int c = 0; c < COLUMNS; c++) {
        Lanes both = even[c] + odd[c];
        float sum = 0.0f;
        for (int lane = 0; lane < LANES; lane++) { sum += both[lane]; }
        for (uint64_t tail = i; tail < count; tail++) { sum += a[tail] * b[c][tail]; }
        sums[c] = sum;
    }
}

// GPT-2's tanh approximation (see the top comment), 0.5 x (1 + tanh(y)), written as
// x / (1 + exp(-2y)) so that large negative x loses no precision to 1 + tanh(y) ~ 0
float gelu_tanh(float x) {
    const float sqrt_2_over_pi = 0.7978845608028654f;
    const float y = sqrt_2_over_pi * (x + 0.044715f * x * x * x);
    return x / (1.0f + expf(-2.0f * y));
}

// the derivative of gelu_tanh: 0.5 (1 + tanh(y)) + 0.5 x (1 - tanh(y)^2) dy/dx
float gelu_tanh_derivative(float x) {
    const float sqrt_2_over_pi = 0.7978845608028654f;
    const float tanh_y = tanhf(sqrt_2_over_pi * (x + 0.044715f * x * x * x));
    const float dy_dx = sqrt_2_over_pi * (1.0f + 3.0f * 0.044715f * x * x);
    return 0.5f * (1.0f + tanh_y) + 0.5f * x * (1.0f - tanh_y * tanh_y) * dy_dx;
}

// libgomp's thread pool does not survive fork(): a forked child (the tests' CHECK_DIES) that
// opens a parallel region after its parent did hangs, so a child computes on one thread
bool in_forked_child = false;
struct ForkWatch {
    ForkWatch() { pthread_atfork(nullptr, nullptr, [] { in_forked_child = true; }); }
} fork_watch;

struct Pointers {
    const void* a;
    const void* b;
    const void* c;
    void* d;
};

const int DOT_GROUP = 4;  // columns of D whose dot products share the loads of A's row (dots)

// one K segment's dot products for `columns` (at most DOT_GROUP) columns of D in the algorithm's order
template <bool SPLIT>
void segment_dots(const float* a, const float* const* b, uint64_t count, int columns, float* sums) {
    if (columns == DOT_GROUP) {
        dots<DOT_GROUP, SPLIT>(a, b, count, sums);
    } else {
        for (int c = 0; c < columns; c++) { dots<1, SPLIT>(a, b + c, count, sums + c); }
    }
}

// fully_aligned: the algorithm was chosen for 256-byte alignment of every matrix (top comment)
// the larger magnitude, a NaN winning (an amax of data holding a NaN is NaN)
float amax_of(float amax, float value) {
    const float magnitude = fabsf(value);
    return amax != amax || magnitude != magnitude ? NAN : std::max(amax, magnitude);
}

void compute(const Problem& p, const Pointers& data, float alpha, float beta, bool fully_aligned) {
    const MatmulDesc& desc = *p.desc;
    const MatrixLayout &c_layout = *p.layouts[2], &d_layout = *p.layouts[3];
    const uint64_t m = p.m, n = p.n, k = p.k;
    const std::vector<float> a_rows = operand_rows(data.a, *p.layouts[0], p.transpose_a, m, k);
    const std::vector<float> b_rows = operand_rows(data.b, *p.layouts[1], !p.transpose_b, n, k);
    const OperandScale scale_a(desc.scale_mode[0], desc.scale[0], m, k), scale_b(desc.scale_mode[1], desc.scale[1], n, k);
    const uint64_t segment = p.block_scaled ? 128 : k;
    const int64_t column_block = 16;  // columns of D per task: their rows of op(B)^T stay in cache
    const float d_scale = desc.d_scale != nullptr ? *(const float*)desc.d_scale : 1.0f;
    std::vector<float> task_amax((n + column_block - 1) / column_block, 0.0f);
    #pragma omp parallel for schedule(static) if (!in_forked_child)
    for (int64_t first_column = 0; first_column < (int64_t)n; first_column += column_block) {
        const uint64_t end_column = std::min<uint64_t>(n, first_column + column_block);
        float& amax = task_amax[first_column / column_block];
        for (uint64_t i = 0; i < m; i++) {
            const float* a_row = a_rows.data() + i * k;
            for (uint64_t first = first_column; first < end_column; first += DOT_GROUP) {
                const int columns = (int)std::min<uint64_t>(DOT_GROUP, end_column - first);
                float products[DOT_GROUP] = {};
                for (uint64_t start = 0; start < k; start += segment) {
                    const uint64_t block = start / 128, length = std::min(segment, k - start);
                    const float* b_segments[DOT_GROUP];
                    float sums[DOT_GROUP];
                    for (int c = 0; c < columns; c++) { b_segments[c] = b_rows.data() + (first + c) * k + start; }
                    if (fully_aligned) {
                        segment_dots<true>(a_row + start, b_segments, length, columns, sums);
                    } else {
                        segment_dots<false>(a_row + start, b_segments, length, columns, sums);
                    }
                    for (int c = 0; c < columns; c++) { products[c] += sums[c] * (scale_a.at(i, block) * scale_b.at(first + c, block)); }
                }
                for (int c = 0; c < columns; c++) {
                    const uint64_t j = first + c;
                    float value = alpha * products[c];
                    if (beta != 0.0f) {  // the sum rounded to D's type first, as measured (the top comment)
                        value = rounded_to(d_layout.type, value) + beta * load_element(data.c, c_layout.type, i + j * (size_t)c_layout.ld);
                    }
                    if (p.has_bias) { value += load_element(desc.bias, p.bias_type, i); }
                    const size_t aux_index = i + j * (size_t)desc.aux_ld;
                    if (p.dgelu) {
                        value *= gelu_tanh_derivative(load_element(desc.aux, p.aux_type, aux_index));
                    } else if (p.has_aux) {
                        store_element(desc.aux, p.aux_type, aux_index, value);
                    }
                    if (p.gelu) { value = gelu_tanh(value); }
                    if (is_fp8(d_layout.type)) {
                        amax = amax_of(amax, value);
                        value *= d_scale;
                    }
                    store_element(data.d, d_layout.type, i + j * (size_t)d_layout.ld, value);
                }
            }
        }
    }
    if (desc.amax_d != nullptr) {
        float amax = 0.0f;
        for (float task : task_amax) { amax = amax_of(amax, task); }
        *(float*)desc.amax_d = amax;
    }
}

Problem make_problem(cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                     cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d) {
    Problem problem = {};
    problem.desc = desc_of(desc);
    const cublasLtMatrixLayout_t layouts[4] = {a, b, c, d};
    for (int i = 0; i < 4; i++) { problem.layouts[i] = layout_of(layouts[i]); }
    return problem;
}

const uint64_t ALGO_MARK = 0x636d73696d6c7431ull;  // "cmsimlt1": this emulation's heuristic chose it
// the heuristic lists this many algorithms (where asked for as many), best first; an odd-ranked
// one sums in the other lane count (16 or 8 along K) than the first, so its bits may differ, as
// another algorithm's may on a GPU. Its rank is kept in the algorithm's data at ALGO_RANK_SLOT.
const int HEURISTIC_ALGORITHMS = 3;
const int ALGO_RANK_SLOT = 5;

} // namespace

// ----------------------------------------------------------------------------------------
// the API

extern "C" {

const char* cublasGetStatusName(cublasStatus_t status) { return status_name(status); }

const char* cublasGetStatusString(cublasStatus_t status) {
    switch (status) {
        case CUBLAS_STATUS_SUCCESS: return "success";
        case CUBLAS_STATUS_NOT_INITIALIZED: return "the library was not initialized";
        case CUBLAS_STATUS_ALLOC_FAILED: return "resource allocation failed";
        case CUBLAS_STATUS_INVALID_VALUE: return "an invalid value was used as an argument";
        case CUBLAS_STATUS_ARCH_MISMATCH: return "the device lacks a feature the operation needs";
        case CUBLAS_STATUS_MAPPING_ERROR: return "an access to GPU memory failed";
        case CUBLAS_STATUS_EXECUTION_FAILED: return "the GPU program failed to execute";
        case CUBLAS_STATUS_INTERNAL_ERROR: return "an internal operation failed";
        case CUBLAS_STATUS_NOT_SUPPORTED: return "the operation is not supported";
        case CUBLAS_STATUS_LICENSE_ERROR: return "license error";
    }
    return "unknown status";
}

size_t cublasLtGetVersion(void) { return CUBLAS_VERSION; }

cublasStatus_t cublasLtCreate(cublasLtHandle_t* handle) {
    REFUSE_IF(handle == nullptr, CUBLAS_STATUS_INVALID_VALUE, "cublasLtCreate with a NULL handle pointer");
    *handle = new cublasLtContext{0};
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtDestroy(cublasLtHandle_t handle) {
    REFUSE_IF(handle == nullptr, CUBLAS_STATUS_NOT_INITIALIZED, "cublasLtDestroy of a NULL handle");
    delete handle;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* desc, cublasComputeType_t compute_type, cudaDataType_t scale_type) {
    MatmulDesc* d = new MatmulDesc();
    d->compute_type = compute_type;
    d->scale_type = scale_type;
    *desc = reinterpret_cast<cublasLtMatmulDesc_t>(d);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc) {
    delete desc_of(desc);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attribute,
                                              const void* buffer, size_t bytes) {
    return set_attribute("matmul descriptor", attribute, desc_slot(desc_of(desc), attribute), buffer, bytes);
}

// a descriptor's attribute read back (a test's check of what llm8 set, e.g. FAST_ACCUM, which the sums
// here do not show); buffer NULL and bytes 0 ask for the size alone, as the library documents
cublasStatus_t cublasLtMatmulDescGetAttribute(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attribute,
                                              void* buffer, size_t bytes, size_t* size_written) {
    const AttributeSlot slot = desc_slot(desc_of(desc), attribute);
    REFUSE_IF(slot.field == nullptr, CUBLAS_STATUS_NOT_SUPPORTED, "matmul descriptor attribute %d is not emulated", (int)attribute);
    if (size_written != nullptr) { *size_written = slot.bytes; }
    if (buffer == nullptr && bytes == 0) { return CUBLAS_STATUS_SUCCESS; }
    REFUSE_IF(buffer == nullptr || bytes < slot.bytes, CUBLAS_STATUS_INVALID_VALUE,
              "matmul descriptor attribute %d needs %zu bytes, got %zu", (int)attribute, slot.bytes, bytes);
    memcpy(buffer, slot.field, slot.bytes);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* layout, cudaDataType type, uint64_t rows,
                                          uint64_t cols, int64_t ld) {
    *layout = reinterpret_cast<cublasLtMatrixLayout_t>(new MatrixLayout{type, rows, cols, ld});
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout) {
    delete layout_of(layout);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* preference) {
    *preference = reinterpret_cast<cublasLtMatmulPreference_t>(new Preference());
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t preference) {
    delete preference_of(preference);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t preference,
                                                    cublasLtMatmulPreferenceAttributes_t attribute,
                                                    const void* buffer, size_t bytes) {
    return set_attribute("preference", attribute, preference_slot(preference_of(preference), attribute), buffer, bytes);
}

// One algorithm for any problem the checks admit at the promised alignments; it needs no
// workspace. The algorithm remembers the promised alignments, which cublasLtMatmul then holds
// the pointers to, and which choose its order of summation (the top comment).
cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                                              cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                              cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
                                              cublasLtMatmulPreference_t preference, int requested_count,
                                              cublasLtMatmulHeuristicResult_t results[], int* returned_count) {
    REFUSE_IF(handle == nullptr, CUBLAS_STATUS_NOT_INITIALIZED, "cublasLtMatmulAlgoGetHeuristic without a handle");
    REFUSE_IF(requested_count <= 0 || results == nullptr || returned_count == nullptr || preference == nullptr,
              CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmulAlgoGetHeuristic: no room for results (requested %d)",
              requested_count);
    *returned_count = 0;
    Problem problem = make_problem(desc, a, b, c, d);
    const Preference& pref = *preference_of(preference);
    cublasStatus_t status = check_problem_shape(&problem);
    if (status == CUBLAS_STATUS_SUCCESS) { status = check_alignments(problem, pref.min_alignment, "promised"); }
    if (status != CUBLAS_STATUS_SUCCESS) { return status; }
    const int listed = std::min(requested_count, HEURISTIC_ALGORITHMS);
    for (int rank = 0; rank < listed; rank++) {
        cublasLtMatmulHeuristicResult_t& result = results[rank];
        memset(&result, 0, sizeof(result));
        result.algo.data[0] = ALGO_MARK;
        for (int i = 0; i < 4; i++) { result.algo.data[1 + i] = std::min(pref.min_alignment[i], ALIGNMENT_CAP); }
        result.algo.data[ALGO_RANK_SLOT] = (uint64_t)rank;
        result.workspaceSize = 0;
        result.state = CUBLAS_STATUS_SUCCESS;
        result.wavesCount = 1.0f;
    }
    *returned_count = listed;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, const void* alpha, const void* A,
                              cublasLtMatrixLayout_t a_layout, const void* B, cublasLtMatrixLayout_t b_layout,
                              const void* beta, const void* C, cublasLtMatrixLayout_t c_layout, void* D,
                              cublasLtMatrixLayout_t d_layout, const cublasLtMatmulAlgo_t* algo, void* workspace,
                              size_t workspace_bytes, cudaStream_t stream) {
    REFUSE_IF(handle == nullptr, CUBLAS_STATUS_NOT_INITIALIZED, "cublasLtMatmul without a handle");
    REFUSE_IF(alpha == nullptr || beta == nullptr || A == nullptr || B == nullptr || D == nullptr,
              CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmul with a NULL alpha, beta, A, B or D");
    Problem problem = make_problem(desc, a_layout, b_layout, c_layout, d_layout);
    cublasStatus_t status = check_problem_shape(&problem);
    if (status != CUBLAS_STATUS_SUCCESS) { return status; }

    const float alpha_value = *(const float*)alpha, beta_value = *(const float*)beta;
    REFUSE_IF(beta_value != 0.0f && C == nullptr, CUBLAS_STATUS_INVALID_VALUE, "beta is not 0 but C is NULL");
    REFUSE_IF(beta_value != 0.0f && problem.dgelu, CUBLAS_STATUS_NOT_SUPPORTED, "DGELU with beta != 0 is not emulated");
    REFUSE_IF(beta_value != 0.0f && is_fp8(problem.layouts[3]->type), CUBLAS_STATUS_NOT_SUPPORTED,
              "an FP8 D with beta != 0 is not emulated");
    REFUSE_IF(problem.desc->d_scale != nullptr && pointer_alignment(problem.desc->d_scale) < 16, CUBLAS_STATUS_NOT_SUPPORTED,
              "D scale pointer %p is not 16-byte aligned (as the A and B scale pointers must be on an H200)",
              problem.desc->d_scale);
    for (int i = 0; i < 2; i++) {  // measured, not documented: the heuristic takes it, the launch refuses it
        const void* scale = problem.desc->scale[i];
        REFUSE_IF(!problem.block_scaled && scale != nullptr && pointer_alignment(scale) < 16, CUBLAS_STATUS_NOT_SUPPORTED,
                  "%s scale pointer %p is not 16-byte aligned (an H200's cuBLASLt 13.1 refused such a launch)",
                  MATRIX_NAMES[i], scale);
    }
    // C is not read when beta is 0 (and then may be anything)
    const void* matrices[4] = {A, B, beta_value != 0.0f ? C : D, D};
    uint32_t alignment[4];
    for (int i = 0; i < 4; i++) { alignment[i] = pointer_alignment(matrices[i]); }
    status = check_alignments(problem, alignment, "pointer");
    if (status != CUBLAS_STATUS_SUCCESS) { return status; }
    if (algo != nullptr) {
        REFUSE_IF(algo->data[0] != ALGO_MARK, CUBLAS_STATUS_INVALID_VALUE,
                  "the algorithm was not filled in by cublasLtMatmulAlgoGetHeuristic");
        for (int i = 0; i < 4; i++) {
            // the documentation leaves open what the library does with a pointer below the
            // preference's MIN_ALIGNMENT: the algorithm may rely on it, so it is refused
            REFUSE_IF(alignment[i] < algo->data[1 + i], CUBLAS_STATUS_INVALID_VALUE,
                      "%s pointer %p is %u-byte aligned, but the algorithm was chosen for %u-byte alignment "
                      "(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_%s_BYTES)", MATRIX_NAMES[i], matrices[i], alignment[i],
                      (unsigned)algo->data[1 + i], MATRIX_NAMES[i]);
        }
    }
    if (C != nullptr && C == D) {
        const MatrixLayout &c = *problem.layouts[2], &d = *problem.layouts[3];
        REFUSE_IF(c.type != d.type || c.rows != d.rows || c.cols != d.cols || c.ld != d.ld, CUBLAS_STATUS_INVALID_VALUE,
                  "in-place C == D needs the same layout for C and D");
    }
    const size_t d_bytes = layout_span_bytes(*problem.layouts[3]);
    const MatrixLayout aux_layout = {problem.aux_type, problem.m, problem.n, problem.desc->aux_ld};
    const size_t aux_bytes = problem.has_aux ? layout_span_bytes(aux_layout) : 0;
    for (int i = 0; i < 2; i++) {
        const size_t operand_bytes = layout_span_bytes(*problem.layouts[i]);
        REFUSE_IF(spans_overlap(D, d_bytes, matrices[i], operand_bytes), CUBLAS_STATUS_INVALID_VALUE,
                  "D overlaps %s: the result would be undefined on a GPU", MATRIX_NAMES[i]);
        REFUSE_IF(spans_overlap(problem.desc->aux, aux_bytes, matrices[i], operand_bytes), CUBLAS_STATUS_INVALID_VALUE,
                  "the GELU aux matrix overlaps %s: the result would be undefined on a GPU", MATRIX_NAMES[i]);
    }
    REFUSE_IF(workspace_bytes > 0 && workspace == nullptr, CUBLAS_STATUS_INVALID_VALUE,
              "a workspace of %zu bytes at NULL", workspace_bytes);
    REFUSE_IF(workspace_bytes > 0 && ((uintptr_t)workspace) % 256 != 0, CUBLAS_STATUS_INVALID_VALUE,
              "the workspace %p is not 256-byte aligned", workspace);
    if (workspace_bytes > 0) {  // a workspace smaller than stated faults here, at its guard page
        volatile const char* bytes = (volatile const char*)workspace;
        (void)bytes[0];
        (void)bytes[workspace_bytes - 1];
    }
    // the descriptors are read at the call (the caller may change or destroy them after it);
    // the matrices, scales and bias when the stream reaches the matmul
    struct QueuedMatmul { MatmulDesc desc; MatrixLayout layouts[4]; Problem problem; };
    auto queued = std::make_shared<QueuedMatmul>();
    queued->desc = *problem.desc;
    queued->problem = problem;
    queued->problem.desc = &queued->desc;
    for (int i = 0; i < 4; i++) {
        queued->layouts[i] = *problem.layouts[i];
        queued->problem.layouts[i] = &queued->layouts[i];
    }
    const Pointers data{A, B, C, D};
    bool fully_aligned = true;
    for (int i = 0; i < 4 && algo != nullptr; i++) { fully_aligned = fully_aligned && algo->data[1 + i] == ALIGNMENT_CAP; }
    if (algo != nullptr && algo->data[ALGO_RANK_SLOT] % 2 == 1) { fully_aligned = !fully_aligned; }  // the other lane count
    cudasim::enqueue(stream, "cublasLtMatmul", [queued, data, alpha_value, beta_value, fully_aligned](double) {
        compute(queued->problem, data, alpha_value, beta_value, fully_aligned);
        return true;
    });
    return CUBLAS_STATUS_SUCCESS;
}

} // extern "C"
