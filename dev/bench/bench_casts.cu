/*
bench_casts.cu: what bounds the FP8 tile cast (llmc/fp8_cast.cuh), by the bandwidth of each of
its parts at d12's shapes: B*T = 65536 rows of 768 columns (the attention output, attproj's x)
and of 3072 (GELU's output, fcproj's x).

Why: on 2026-11-26 and 2026-11-30 the plain cast moved about 2 TB/s (4 bytes an element: 2 in,
a code and a transposed code out) although its loads in flight went from 1 to 4 a thread in
between, and by the SASS it issues about a quarter of what an SM can; the lm_head dy's byte
transpose, with the same transposed stores, moved about 3. One run of this says which part is
slow: the row-major codes, the transposed ones, or the cast as a whole against a plain copy.

Usage: ./bench_casts [--rows N] [--cols C,C,...] [--iters N]   (rows and cols multiples of 16)

Rows of its markdown table (GB/s of the bytes each moves, and that over the copy's):
  copy        cudaMemcpyAsync of the bf16 input, device to device: 2 bytes in, 2 out
  cast        fp8_cast_transpose, the delayed one-pass plain cast: 2 in, 1 + 1 out
  codes       the same, codes_t NULL (row-major codes only): 2 in, 1 out
  transposed  the same, codes NULL (transposed codes only): 2 in, 1 out
  gelu cast   gelu_forward_fp8 (the GELU transform, delayed): 2 in, 1 + 1 out
  transpose   fp8_transpose_codes (codes to codes_t, a byte each): 1 in, 1 out
Timing: 2 warmup launches, then 3 repetitions of a CUDA-event pair around --iters launches;
the median, per launch. The input is uniform in [-2, 2), so nothing saturates under the
delayed state's first scale (1): the casts count flushes only, as in training.
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "llmc/utils.h"
#include "llmc/cuda_common.h"
#include "llmc/fp8_cast.cuh"
#include "llmc/gelu.cuh"

#define BENCH_CASTS_REPEATS 3
#define BENCH_CASTS_MAX_SHAPES 8

__global__ void bench_casts_fill_kernel(floatX* out, size_t n, uint32_t seed) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        out[i] = __float2bfloat16_rn((float)random_u32(seed, (uint32_t)i) * 0x1p-30f - 2.0f);
    }
}

typedef struct {
    int rows, cols;
    floatX* x;
    floatX* copy;
    uint8_t* codes;
    uint8_t* codes_t;
    Fp8TensorScaling* state;
    Fp8CastRecord* record;
} CastBench;

typedef enum { CAST_COPY, CAST_BOTH, CAST_CODES, CAST_TRANSPOSED, CAST_GELU, CAST_TRANSPOSE, CAST_KINDS } CastKind;
static const char* cast_kind_names[CAST_KINDS] = {"copy", "cast", "codes", "transposed", "gelu cast", "transpose"};
static const int cast_kind_bytes[CAST_KINDS] = {4, 4, 3, 3, 4, 2};  // bytes moved per element

static Fp8CastOutput cast_bench_output(const CastBench* b, bool codes, bool codes_t) {
    Fp8CastOutput out = {};
    out.format = FP8_E4M3;
    out.scaling = FP8_SCALING_TENSOR;
    out.codes = codes ? b->codes : NULL;
    out.codes_t = codes_t ? b->codes_t : NULL;
    out.state = b->state;
    out.record = b->record;
    return out;
}

static void cast_bench_launch(const CastBench* b, CastKind kind, cudaStream_t stream) {
    const size_t n = (size_t)b->rows * b->cols;
    Fp8CastOutput both = cast_bench_output(b, true, true), codes = cast_bench_output(b, true, false),
                  transposed = cast_bench_output(b, false, true);
    switch (kind) {
    case CAST_COPY: cudaCheck(cudaMemcpyAsync(b->copy, b->x, n * sizeof(floatX), cudaMemcpyDeviceToDevice, stream)); break;
    case CAST_BOTH: fp8_cast_transpose(&both, b->x, b->rows, b->cols, stream); break;
    case CAST_CODES: fp8_cast_transpose(&codes, b->x, b->rows, b->cols, stream); break;
    case CAST_TRANSPOSED: fp8_cast_transpose(&transposed, b->x, b->rows, b->cols, stream); break;
    case CAST_GELU: gelu_forward_fp8(&both, (floatX*)NULL, b->x, b->rows, b->cols, stream); break;
    case CAST_TRANSPOSE: fp8_transpose_codes(b->codes, b->codes_t, b->rows, b->cols, stream); break;
    default: llm8_die("bench_casts: no cast kind %d", (int)kind);
    }
}

static int compare_floats(const void* a, const void* b) {
    float x = *(const float*)a, y = *(const float*)b;
    return (x > y) - (x < y);
}

// ms per launch: the median of BENCH_CASTS_REPEATS event-timed loops of iters launches
static float cast_bench_time_ms(const CastBench* b, CastKind kind, int iters, cudaStream_t stream) {
    cudaEvent_t start, stop;
    cudaCheck(cudaEventCreate(&start));
    cudaCheck(cudaEventCreate(&stop));
    for (int i = 0; i < 2; i++) { cast_bench_launch(b, kind, stream); }
    float ms[BENCH_CASTS_REPEATS];
    for (int r = 0; r < BENCH_CASTS_REPEATS; r++) {
        cudaCheck(cudaEventRecord(start, stream));
        for (int i = 0; i < iters; i++) { cast_bench_launch(b, kind, stream); }
        cudaCheck(cudaEventRecord(stop, stream));
        cudaCheck(cudaEventSynchronize(stop));
        cudaCheck(cudaEventElapsedTime(&ms[r], start, stop));
        ms[r] /= (float)iters;
    }
    cudaCheck(cudaEventDestroy(start));
    cudaCheck(cudaEventDestroy(stop));
    qsort(ms, BENCH_CASTS_REPEATS, sizeof(float), compare_floats);
    return ms[BENCH_CASTS_REPEATS / 2];
}

static void usage_die(const char* message, const char* value) {
    llm8_die("bench_casts: %s %s (usage: ./bench_casts [--rows N] [--cols C,C,...] [--iters N]; rows and cols "
             "multiples of 16)", message, value);
}

static int parse_dimension(const char* text, const char* flag) {
    char* end = NULL;
    long v = strtol(text, &end, 10);
    if (end == text || *end != '\0' || v < 16 || v > (1L << 20) || v % 16 != 0) {
        usage_die(flag, text);
    }
    return (int)v;
}

int main(int argc, char** argv) {
    int rows = 65536, iters = 20, shapes = 2;
    int cols[BENCH_CASTS_MAX_SHAPES] = {768, 3072};
    for (int i = 1; i < argc; i += 2) {
        if (i + 1 >= argc) { usage_die("a value is missing after", argv[i]); }
        if (strcmp(argv[i], "--rows") == 0) {
            rows = parse_dimension(argv[i + 1], "--rows");
        } else if (strcmp(argv[i], "--cols") == 0) {
            shapes = 0;
            char list[256];
            snprintf(list, sizeof(list), "%s", argv[i + 1]);
            for (char* part = strtok(list, ","); part != NULL; part = strtok(NULL, ",")) {
                if (shapes == BENCH_CASTS_MAX_SHAPES) { usage_die("more than 8 widths in --cols", argv[i + 1]); }
                cols[shapes++] = parse_dimension(part, "--cols");
            }
            if (shapes == 0) { usage_die("no width in --cols", argv[i + 1]); }
        } else if (strcmp(argv[i], "--iters") == 0) {
            char* end = NULL;
            long v = strtol(argv[i + 1], &end, 10);
            if (end == argv[i + 1] || *end != '\0' || v < 1 || v > 10000) { usage_die("--iters must be 1 to 10000, got", argv[i + 1]); }
            iters = (int)v;
        } else {
            usage_die("unknown flag", argv[i]);
        }
    }
    DeviceInfo device = device_info_query();
    cudaStream_t stream;
    cudaCheck(cudaStreamCreate(&stream));
    printf("## FP8 tile cast bandwidth (dev/bench/bench_casts.cu) on %s\n\n", device.name);
    printf("GB/s of the bytes each moves (bytes/element); \"of copy\": over the device-to-device copy's GB/s. "
           "ms per launch, the median of %d repetitions of %d launches.\n\n", BENCH_CASTS_REPEATS, iters);
    printf("| rows x cols | what | bytes/element | ms | GB/s | of copy |\n|---|---|---|---|---|---|\n");
    for (int s = 0; s < shapes; s++) {
        CastBench b = {};
        b.rows = rows;
        b.cols = cols[s];
        const size_t n = (size_t)rows * cols[s];
        b.x = (floatX*)cuda_malloc_checked(n * sizeof(floatX), "bench_casts input");
        b.copy = (floatX*)cuda_malloc_checked(n * sizeof(floatX), "bench_casts copy");
        b.codes = (uint8_t*)cuda_malloc_checked(n, "bench_casts codes");
        b.codes_t = (uint8_t*)cuda_malloc_checked(n, "bench_casts transposed codes");
        b.state = (Fp8TensorScaling*)cuda_malloc_checked(sizeof(Fp8TensorScaling), "bench_casts state");
        b.record = (Fp8CastRecord*)cuda_malloc_checked(sizeof(Fp8CastRecord), "bench_casts record");
        Fp8TensorScaling host_state;
        fp8_scaling_init(&host_state, FP8_RECIPE_DELAYED, FP8_E4M3, FP8_AMAX_HISTORY_DEFAULT, 0);
        cudaCheck(cudaMemcpyAsync(b.state, &host_state, sizeof(host_state), cudaMemcpyHostToDevice, stream));
        fp8_cast_records_init(b.record, 1, stream);
        bench_casts_fill_kernel<<<1024, 256, 0, stream>>>(b.x, n, 1234u + (uint32_t)s);
        cudaCheck(cudaGetLastError());
        cast_bench_launch(&b, CAST_BOTH, stream);  // codes for the transpose to read
        cudaCheck(cudaStreamSynchronize(stream));
        double copy_gbs = 0.0;
        for (int k = 0; k < CAST_KINDS; k++) {
            float ms = cast_bench_time_ms(&b, (CastKind)k, iters, stream);
            double gbs = ms > 0.0f ? (double)n * cast_kind_bytes[k] / (ms * 1e6) : 0.0;
            if (k == CAST_COPY) { copy_gbs = gbs; }
            printf("| %d x %d | %s | %d | %.4f | %.0f | %.2f |\n", rows, cols[s], cast_kind_names[k], cast_kind_bytes[k],
                   ms, gbs, copy_gbs > 0.0 ? gbs / copy_gbs : 0.0);
        }
        cudaCheck(cudaFree(b.x));
        cudaCheck(cudaFree(b.copy));
        cudaCheck(cudaFree(b.codes));
        cudaCheck(cudaFree(b.codes_t));
        cudaCheck(cudaFree(b.state));
        cudaCheck(cudaFree(b.record));
    }
    cudaCheck(cudaStreamDestroy(stream));
    return 0;
}
