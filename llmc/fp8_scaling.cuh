/*
fp8_scaling.cuh: the device side of FP8 scaling. Per FP8 tensor the trainer keeps one
Fp8TensorScaling (llmc/fp8_scaling.h: the amax history and the scale) and one
Fp8CastRecord (this file: what the casts of the tensor did). Casts read the state and
write the record; one small kernel folds the records into the states; every N steps the
host reads the records back for the numerics log, and a resume checks the records a state
file brings (fp8_cast_record_loaded_error) before they go back to the device.

Why it is shaped so:
- No host sync per step (DESIGN.md section 3). A cast kernel reads the scale from the
  state on the device and writes this use's amax into the record with one atomicMax per
  block; fp8_scaling_update_records (one thread per tensor, fp8_scaling_update from
  fp8_scaling.h, the CPU reference's very code) turns it into the next scale. Integer
  atomics (max of the float bits, add of counts) give the same result in any order, so
  every bit stays deterministic.
- The GEMMs never read the state: a delayed cast uses the scale from before its update,
  and the backward GEMMs (wgrad reads x^T) run long after that update. So each per-tensor
  cast copies the scale it used, and its inverse, into the record, and the GEMMs take
  &record->scale_inv as cuBLASLt's dequantization scale. The record stays valid until the
  tensor's next cast, which comes after its last GEMM of the micro-step.
- The numerics log needs amax, scale and the fractions saturated and flushed to zero per
  tensor (fp8_classify). Counting per element is a few integer ops in kernels that are
  memory bound; each thread counts, the block reduces, and one atomicAdd per counter per
  block lands in the record. The log reads the records every N steps (that read is the
  one host sync, and only on those steps) and clears the interval counters.
- The optimizer pass is a weight's producer (DESIGN.md section 3): Fp8WeightUpdate says
  where it puts the weight's new amax and, for the delayed weight cast, its codes; it tallies
  like a cast, so the numerics log reads a weight's record the same in both weight scalings.
*/
#ifndef LLMC_FP8_SCALING_CUH
#define LLMC_FP8_SCALING_CUH

#include <stddef.h>
#include <stdint.h>
#include "cuda_common.h"
#include "cuda_utils.cuh"
#include "fp8.h"
#include "fp8_scaling.h"

// what the casts of one FP8 tensor did; zeroed by fp8_cast_records_init. scale_inv comes first
// and the size is a multiple of 16 bytes, so in the trainer's 256-byte aligned record array
// every &record->scale_inv is 16-byte aligned, as cuBLASLt needs of a scale pointer (on an H200
// with cuBLASLt 13.1 a pointer 4 bytes past that passed the heuristic and failed at the launch
// with CUBLAS_STATUS_NOT_SUPPORTED; matmul_check_spec names it first)
typedef struct {
    float scale_inv;                // 1 / scale: the GEMMs' dequantization scale (A/B scale pointer)
    float scale;                    // per-tensor casts: the scale the last cast used
    uint32_t amax_bits;             // fp8_amax_bits of this use, folded and cleared by fp8_scaling_update_records
    uint32_t interval_amax_bits;    // largest amax since the last fp8_cast_records_read
    uint32_t interval_min_scale_bits; // smallest scale used since the last read (the block recipe: over tiles)
    uint32_t unused_padding;
    unsigned long long elements;    // since the last read
    unsigned long long saturated;
    unsigned long long flushed;
} Fp8CastRecord;
static_assert(offsetof(Fp8CastRecord, scale_inv) == 0 && offsetof(Fp8CastRecord, scale) == sizeof(float)
              && sizeof(Fp8CastRecord) % 16 == 0,
              "every record of a 16-byte aligned array has a 16-byte aligned scale_inv, its scale next");

/*
A predicted cast (fp8_cast.cuh's FP8_RECORD_PREDICTED: -fg pow2's output gradients) in flight:
its counts, held apart from the record's until fp8_scaling_settle_prediction keeps them (the
prediction was this use's scale) or drops them and sets recast (the recast counts its own).
Outside the record, whose layout the state files hold: it lives from the predicted cast to its
recast, within one output gradient's pass, so nothing of it is saved but two counts of this
process's predictions, for the trainer's last lines.
*/
typedef struct {
    unsigned long long elements;
    unsigned long long saturated;
    unsigned long long flushed;
    unsigned long long predictions;  // every verdict so far
    unsigned long long recasts;      // the wrong ones
    uint32_t recast;  // 1: the prediction was wrong, the recast runs
    uint32_t unused_padding;
} Fp8Prediction;

// ----------------------------------------------------------------------------
// per-thread tally of a cast, committed once per block

typedef struct {
    uint32_t amax_bits;
    uint32_t min_scale_bits;  // the smallest scale cast with (positive floats order as their bits)
    uint32_t elements;
    uint32_t saturated;
    uint32_t flushed;
} Fp8Tally;

#define FP8_NO_SCALE_BITS 0x7f800000u  // +Inf: nothing cast yet

/*
What is wrong with a record read from a state file (NULL: nothing). Every record a run writes
has a positive normal scale with its own (normal) inverse (fp8_cast_records_init's 1, or a state's scale
copied with its scale_inv), a pending amax that is a finite float's fp8_amax_bits (0 once
folded), an interval scale that is a scale or FP8_NO_SCALE_BITS, and counts of saturated and
flushed elements within the elements cast. The GEMMs read scale_inv and -fw delayed rebuilds
the weight codes from scale until the tensor's next cast, which for a weight is the next
update: a NaN there makes every forward NaN, every step is skipped, and no update ever comes.
*/
static inline const char* fp8_cast_record_loaded_error(const Fp8CastRecord* r) {
    if (!fp8_scale_pair_valid(r->scale, r->scale_inv)) { return FP8_SCALE_PAIR_ERROR; }
    // the sign bit too: amaxes fold by an unsigned atomicMax of their bits, where a "negative" one
    // would outrank every real amax, NaN included, and hide them
    if ((r->amax_bits & 0x80000000u) != 0 || !isfinite(bits_as_float(r->amax_bits))) {
        return "its pending amax is not a finite amax (>= 0)";
    }
    float interval_scale = bits_as_float(r->interval_min_scale_bits);
    if (r->interval_min_scale_bits != FP8_NO_SCALE_BITS && !(isfinite(interval_scale) && interval_scale > 0.0f)) {
        return "its interval's smallest scale is not a finite positive number";
    }
    if (r->saturated > r->elements || r->flushed > r->elements) {
        return "it counts more saturated or flushed elements than it cast";
    }
    return NULL;
}

__device__ __forceinline__ Fp8Tally fp8_tally_zero(void) {
    Fp8Tally t = {0u, FP8_NO_SCALE_BITS, 0u, 0u, 0u};
    return t;
}

__device__ __forceinline__ void fp8_tally_amax(Fp8Tally* t, float x) {
    t->amax_bits = max(t->amax_bits, fp8_amax_bits(x));
}
// the same of a 16-byte vector: bf16 two halves at a time (x128_amax_bits), fp32 value by value
__device__ __forceinline__ void fp8_tally_amax(Fp8Tally* t, const x128& v) {
    t->amax_bits = max(t->amax_bits, x128_amax_bits(v));
}
__device__ __forceinline__ void fp8_tally_amax(Fp8Tally* t, const f128& v) {
    for (int k = 0; k < f128::size; k++) { fp8_tally_amax(t, v[k]); }
}

// what the cast of one element did to it (fp8_classify), counted; the caller counts the element
__device__ __forceinline__ void fp8_tally_status(Fp8Tally* t, float x, float scale, uint8_t code, Fp8Format format) {
    Fp8ElementStatus status = fp8_classify(x, scale, code, format);
    t->saturated += status == FP8_ELEMENT_SATURATED;
    t->flushed += status == FP8_ELEMENT_FLUSHED;
}

// one element cast with `scale` into `code`: its amax and what the cast did to it
__device__ __forceinline__ void fp8_tally_cast(Fp8Tally* t, float x, float scale, uint8_t code, Fp8Format format) {
    fp8_tally_amax(t, x);
    t->min_scale_bits = min(t->min_scale_bits, float_as_bits(scale));
    fp8_tally_status(t, x, scale, code, format);
    t->elements++;
}

/*
Zeros counted a word at a time, for the flush count of a cast that cannot saturate. A flushed
element is a nonzero value whose code is ±0, and a value that is ±0 always gets a ±0 code, so
flushed = (codes that are ±0) - (values that are ±0). Each is a carry-free test of a packed
word: with the sign bits masked off a field is at most 0x7f (a code) or 0x7fff (a bf16), and
adding 0x7f (0x7fff) sets the field's top bit exactly where the field is nonzero, carrying
nothing into the next one. Testing each code beside its value had cost about 6 instructions
an element, a large share of a memory-bound cast's budget (doc/performance.md).
*/
__device__ __forceinline__ uint32_t fp8_zero_fields_(uint32_t word, uint32_t low_bits, uint32_t top_bits) {
    uint32_t magnitude = word & low_bits;
    return ~((magnitude + low_bits) | magnitude) & top_bits;
}

// how many of 8 packed codes are ±0
__device__ __forceinline__ int fp8_zero_codes8(uint2 codes) {
    return __popc(fp8_zero_fields_(codes.x, 0x7f7f7f7fu, 0x80808080u)) +
           __popc(fp8_zero_fields_(codes.y, 0x7f7f7f7fu, 0x80808080u));
}

// how many values of a 16-byte vector are ±0: 8 bf16 two per word, or 4 floats
__device__ __forceinline__ int packed_zero_count(x128 v) {
    int4 b = v.bits();
    return __popc(fp8_zero_fields_((uint32_t)b.x, 0x7fff7fffu, 0x80008000u)) +
           __popc(fp8_zero_fields_((uint32_t)b.y, 0x7fff7fffu, 0x80008000u)) +
           __popc(fp8_zero_fields_((uint32_t)b.z, 0x7fff7fffu, 0x80008000u)) +
           __popc(fp8_zero_fields_((uint32_t)b.w, 0x7fff7fffu, 0x80008000u));
}
__device__ __forceinline__ int packed_zero_count(f128 v) {
    int zeros = 0;
    for (int k = 0; k < f128::size; k++) { zeros += v[k] == 0.0f; }
    return zeros;
}

// the same of 8 values held as floats
__device__ __forceinline__ int fp8_zero_count8(const float x[8]) {
    int zeros = 0;
    for (int k = 0; k < 8; k++) { zeros += x[k] == 0.0f; }
    return zeros;
}

// the counts of 8 codes just cast with one scale (codes: x[0]'s in the lowest byte), for a
// cast whose staging already tallied the amax of x: fp8_tally_cast's counts without the amax,
// the scale's minimum taken once. may_saturate false (fp8_may_saturate of an amax over these
// values said no) leaves only the flushes, counted from the zeros: zero_values is how many of x
// are ±0 (packed_zero_count of the vectors they came from).
__device__ __forceinline__ void fp8_tally_counts8(Fp8Tally* t, const float x[8], uint2 codes, float scale,
                                                  Fp8Format format, bool may_saturate, int zero_values) {
    t->min_scale_bits = min(t->min_scale_bits, float_as_bits(scale));
    if (may_saturate) {
        for (int k = 0; k < 8; k++) {
            fp8_tally_status(t, x[k], scale, (uint8_t)((k < 4 ? codes.x : codes.y) >> (8 * (k % 4))), format);
        }
    } else {
        t->flushed += (uint32_t)(fp8_zero_codes8(codes) - zero_values);
    }
    t->elements += 8;
}

// the tally of the whole warp, in every lane (all 32 lanes call it)
__device__ __forceinline__ Fp8Tally fp8_tally_warp_reduce(Fp8Tally t) {
    Fp8Tally w;
    w.amax_bits = __reduce_max_sync(0xffffffffu, t.amax_bits);
    w.min_scale_bits = __reduce_min_sync(0xffffffffu, t.min_scale_bits);
    w.elements = __reduce_add_sync(0xffffffffu, t.elements);
    w.saturated = __reduce_add_sync(0xffffffffu, t.saturated);
    w.flushed = __reduce_add_sync(0xffffffffu, t.flushed);
    return w;
}

// a reduced tally into the record, one atomic per field it changes; record_amax: also fold
// the amax into record->amax_bits (a use whose amax the next state update takes); held (a
// predicted cast's, else NULL): the counts go there, and the scale nowhere (the record holds
// the one it used), until fp8_scaling_settle_prediction keeps or drops them
__device__ __forceinline__ void fp8_tally_add(Fp8Tally t, Fp8CastRecord* record, bool record_amax, Fp8Prediction* held) {
    atomicMax(&record->interval_amax_bits, t.amax_bits);
    if (record_amax) { atomicMax(&record->amax_bits, t.amax_bits); }
    if (t.min_scale_bits != FP8_NO_SCALE_BITS && held == NULL) { atomicMin(&record->interval_min_scale_bits, t.min_scale_bits); }
    unsigned long long* elements = held != NULL ? &held->elements : &record->elements;
    unsigned long long* saturated = held != NULL ? &held->saturated : &record->saturated;
    unsigned long long* flushed = held != NULL ? &held->flushed : &record->flushed;
    if (t.elements != 0u) { atomicAdd(elements, (unsigned long long)t.elements); }
    if (t.saturated != 0u) { atomicAdd(saturated, (unsigned long long)t.saturated); }
    if (t.flushed != 0u) { atomicAdd(flushed, (unsigned long long)t.flushed); }
}

/*
Reduces the tallies of the whole block and adds them to the record (fp8_tally_add). Every
thread of the block must call it (it has block barriers); the block is
blockDim.x * blockDim.y * blockDim.z threads, a multiple of 32.
*/
__device__ void fp8_tally_commit(Fp8Tally t, Fp8CastRecord* record, bool record_amax, Fp8Prediction* held = NULL) {
    __shared__ uint32_t warp_values[5][WARP_SIZE];
    const int thread = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    const int threads = blockDim.x * blockDim.y * blockDim.z;
    const int lane = thread % WARP_SIZE;
    const int warp = thread / WARP_SIZE;
    Fp8Tally w = fp8_tally_warp_reduce(t);
    __syncthreads();  // warp_values may still be read by a previous call
    if (lane == 0) {
        warp_values[0][warp] = w.amax_bits;
        warp_values[1][warp] = w.elements;
        warp_values[2][warp] = w.saturated;
        warp_values[3][warp] = w.flushed;
        warp_values[4][warp] = w.min_scale_bits;
    }
    __syncthreads();
    if (warp == 0) {
        const int warps = threads / WARP_SIZE;
        bool valid = lane < warps;
        Fp8Tally b;
        b.amax_bits = valid ? warp_values[0][lane] : 0u;
        b.elements = valid ? warp_values[1][lane] : 0u;
        b.saturated = valid ? warp_values[2][lane] : 0u;
        b.flushed = valid ? warp_values[3][lane] : 0u;
        b.min_scale_bits = valid ? warp_values[4][lane] : FP8_NO_SCALE_BITS;
        b = fp8_tally_warp_reduce(b);
        if (lane == 0) { fp8_tally_add(b, record, record_amax, held); }
    }
}

// the same for one warp on its own, in kernels whose warps finish independently (adamw8.cuh)
__device__ __forceinline__ void fp8_tally_commit_warp(Fp8Tally t, Fp8CastRecord* record, bool record_amax) {
    Fp8Tally w = fp8_tally_warp_reduce(t);
    if (threadIdx.x % WARP_SIZE == 0) { fp8_tally_add(w, record, record_amax, NULL); }
}

// ----------------------------------------------------------------------------
// the FP8 weight outputs of an optimizer pass (DESIGN.md section 3)

/*
What one optimizer call (llmc/adamw.cuh, llmc/adamw8.cuh: a layer's slice of a weight, or a
ZeRO rank's part of one) writes for the FP8 cast of the weight it updates; all NULL: the
weight is not FP8 here. record: the weight's cast record; record->amax_bits receives the new
values' amax. codes (the delayed weight cast; NULL: current, the cast follows the pass): the
E4M3 codes of the new values, from the call's first element on, under state->scale (from the
previous step's amax), counted in the record's statistics like any cast. Values are
fp8_weight_element's (llmc/fp8.h), as the host references' (Fp8WeightRef).
*/
typedef struct {
    Fp8CastRecord* record;
    uint8_t* codes;
    const Fp8TensorScaling* state;
} Fp8WeightUpdate;

// the scale a pass writes its codes with (read once per thread; unused without codes)
__device__ __forceinline__ float fp8_weight_update_scale(const Fp8WeightUpdate& w) {
    return w.codes != NULL ? w.state->scale : 1.0f;
}

// one element the pass has just written into the thread's tally; returns its code (meaningful with codes)
__device__ __forceinline__ uint8_t fp8_weight_update_element(const Fp8WeightUpdate& w, float scale, int has_master,
                                                             float new_master, floatX new_weight, Fp8Tally* tally) {
    Fp8WeightElement e = fp8_weight_element(has_master, new_master, __bfloat16_as_ushort(new_weight), scale);
    if (w.codes != NULL) { fp8_tally_cast(tally, e.value, scale, e.code, FP8_E4M3); }
    else { fp8_tally_amax(tally, e.value); }
    return e.code;
}

// ----------------------------------------------------------------------------
// state updates and the records' life cycle

// the state's scale (and its inverse) as the one the record's GEMMs use
__device__ __forceinline__ void fp8_record_take_scale(Fp8CastRecord* record, const Fp8TensorScaling* state) {
    record->scale = state->scale;
    record->scale_inv = state->scale_inv;
}

// fold this use's amax (the record's) into the state, clear it for the next use
__device__ __forceinline__ void fp8_scaling_fold_record(Fp8TensorScaling* state, Fp8CastRecord* record) {
    fp8_scaling_update(state, bits_as_float(record->amax_bits));
    record->amax_bits = 0u;
}

// one thread per tensor: fp8_scaling_fold_record
__global__ void fp8_scaling_update_records_kernel(Fp8TensorScaling* states, Fp8CastRecord* records, int count) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < count) { fp8_scaling_fold_record(&states[i], &records[i]); }
}

// one thread per tensor: the state from before a skipped step (fp8_scaling_restore)
__global__ void fp8_scaling_restore_kernel(Fp8TensorScaling* states, const Fp8TensorScaling* before, int count) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < count) { fp8_scaling_restore(&states[i], &before[i]); }
}

void fp8_scaling_restore_states(Fp8TensorScaling* states, const Fp8TensorScaling* before, int count, cudaStream_t stream) {
    if (count <= 0) { llm8_die("fp8_scaling_restore_states: count %d must be positive", count); }
    const int block_size = 128;
    fp8_scaling_restore_kernel<<<ceil_div(count, block_size), block_size, 0, stream>>>(states, before, count);
    cudaCheck(cudaGetLastError());
}

// states[0..count) and records[0..count) side by side (pass &states[first], &records[first])
void fp8_scaling_update_records(Fp8TensorScaling* states, Fp8CastRecord* records, int count, cudaStream_t stream) {
    if (count <= 0) { llm8_die("fp8_scaling_update_records: count %d must be positive", count); }
    const int block_size = 128;
    fp8_scaling_update_records_kernel<<<ceil_div(count, block_size), block_size, 0, stream>>>(states, records, count);
    cudaCheck(cudaGetLastError());
}

/*
One thread: after a predicted cast (fp8_cast.cuh's FP8_RECORD_PREDICTED: the state's scale, which
under CURRENT_POW2 is the last use's), the state's update with this use's amax, then the verdict.
The same scale: the codes are this use's, and the cast's held counts and its scale join the
interval's statistics. Another: the record takes the new scale and the recast is asked for
(FP8_RECORD_RECAST), which counts its own. Either way the codes and the numerics log are what
current scaling's two passes (amax, update, cast) make under the same state.
*/
__global__ void fp8_scaling_settle_prediction_kernel(Fp8TensorScaling* state, Fp8CastRecord* record, Fp8Prediction* held) {
    const float predicted = record->scale;
    fp8_scaling_fold_record(state, record);
    const bool kept = state->scale == predicted;
    if (kept) {
        record->interval_min_scale_bits = min(record->interval_min_scale_bits, float_as_bits(predicted));
        record->elements += held->elements;
        record->saturated += held->saturated;
        record->flushed += held->flushed;
    } else {
        fp8_record_take_scale(record, state);
    }
    held->recast = kept ? 0u : 1u;
    held->predictions++;
    held->recasts += kept ? 0ull : 1ull;
    held->elements = 0ull;
    held->saturated = 0ull;
    held->flushed = 0ull;
}

void fp8_scaling_settle_prediction(Fp8TensorScaling* state, Fp8CastRecord* record, Fp8Prediction* held, cudaStream_t stream) {
    fp8_scaling_settle_prediction_kernel<<<1, 1, 0, stream>>>(state, record, held);
    cudaCheck(cudaGetLastError());
}

// one thread: the state's update with an amax the host knows before the tensor is written (a
// bound on it: lm_head's output gradient, fp8_gradient_recipe), and the new scale into the record
// for the cast and the GEMMs; the record's pending amax is left alone (no use folds one in)
__global__ void fp8_scaling_update_with_amax_kernel(Fp8TensorScaling* state, Fp8CastRecord* record, float amax) {
    fp8_scaling_update(state, amax);
    fp8_record_take_scale(record, state);
}

void fp8_scaling_update_with_amax(Fp8TensorScaling* state, Fp8CastRecord* record, float amax, cudaStream_t stream) {
    fp8_scaling_update_with_amax_kernel<<<1, 1, 0, stream>>>(state, record, amax);
    cudaCheck(cudaGetLastError());
}

// records[i] takes states[i]'s scale as the one its GEMMs use: for a cast done in parts
// (fp8_cast_weight_part, one ZeRO rank's part each), where no single cast kernel owns the tensor
__global__ void fp8_scaling_publish_scales_kernel(const Fp8TensorScaling* states, Fp8CastRecord* records, int count) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= count) { return; }
    fp8_record_take_scale(&records[i], &states[i]);
}

void fp8_scaling_publish_scales(const Fp8TensorScaling* states, Fp8CastRecord* records, int count, cudaStream_t stream) {
    if (count <= 0) { llm8_die("fp8_scaling_publish_scales: count %d must be positive", count); }
    const int block_size = 128;
    fp8_scaling_publish_scales_kernel<<<ceil_div(count, block_size), block_size, 0, stream>>>(states, records, count);
    cudaCheck(cudaGetLastError());
}

// clears the interval statistics (and, with everything, the pending amax and the scales)
__global__ void fp8_cast_records_clear_kernel(Fp8CastRecord* records, int count, bool everything) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= count) { return; }
    Fp8CastRecord* r = &records[i];
    if (everything) {
        r->scale = 1.0f;
        r->scale_inv = 1.0f;
        r->amax_bits = 0u;
        r->unused_padding = 0u;
    }
    r->interval_amax_bits = 0u;
    r->interval_min_scale_bits = FP8_NO_SCALE_BITS;
    r->elements = 0ull;
    r->saturated = 0ull;
    r->flushed = 0ull;
}

static void fp8_cast_records_clear(Fp8CastRecord* records, int count, bool everything, cudaStream_t stream) {
    if (count <= 0) { llm8_die("fp8_cast_records: count %d must be positive", count); }
    const int block_size = 128;
    fp8_cast_records_clear_kernel<<<ceil_div(count, block_size), block_size, 0, stream>>>(records, count, everything);
    cudaCheck(cudaGetLastError());
}

// a fresh array of records (device memory from the caller)
void fp8_cast_records_init(Fp8CastRecord* records, int count, cudaStream_t stream) {
    fp8_cast_records_clear(records, count, true, stream);
}

/*
The numerics log, every N steps: stats[i] = the interval of records[i] since the last read
(amax: the largest seen; scale: the smallest used; element, saturated and flushed counts),
then the interval counters are cleared. Synchronizes the stream: call it only on log steps.
*/
void fp8_cast_records_read(Fp8CastStats* stats, Fp8CastRecord* records, int count, cudaStream_t stream) {
    if (count <= 0) { llm8_die("fp8_cast_records_read: count %d must be positive", count); }
    Fp8CastRecord* host = (Fp8CastRecord*)mallocCheck((size_t)count * sizeof(Fp8CastRecord));
    cudaCheck(cudaMemcpyAsync(host, records, (size_t)count * sizeof(Fp8CastRecord), cudaMemcpyDeviceToHost, stream));
    cudaCheck(cudaStreamSynchronize(stream));
    for (int i = 0; i < count; i++) {
        stats[i].amax = bits_as_float(host[i].interval_amax_bits);
        stats[i].scale = bits_as_float(host[i].interval_min_scale_bits);
        stats[i].elements = host[i].elements;
        stats[i].saturated = host[i].saturated;
        stats[i].flushed = host[i].flushed;
    }
    free(host);
    fp8_cast_records_clear(records, count, false, stream);
}

#endif // LLMC_FP8_SCALING_CUH
