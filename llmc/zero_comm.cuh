/*
zero_comm.cuh: the collectives of a ZeRO-1 training step (DESIGN.md section 5,
doc/multi-gpu.md): gradients reduced to their owners layer by layer during the backward,
and after the update the weights gathered back, the FP8 matmul weights as FP8 codes.

Why it is shaped so:
- Ownership is zero.h's (one contiguous range of the flat parameters per rank), so the
  trainer's buffers keep llm.c's layout and every kernel is unchanged; only the optimizer
  runs on the owned range, and this module moves bytes between ranks.
- Gradients: chunk l is layer l's slices, complete when layer l's backward is done. The
  compute stream records an event there and the communication stream (multi_gpu.h's
  nccl_stream) waits for it, then runs one NCCL group of ncclReduce(ncclSum) per owner
  piece, in place: the backward of layer l - 1 overlaps the reduction of layer l. Each
  rank's gradients are a mean over its tokens, so the average over ranks is the global
  mean: the owner divides its pieces' sum by N in fp32 and rounds to bf16 once
  (zero_mean_pieces_kernel). Not ncclAvg: NCCL multiplies each rank's value by 1/N rounded
  to the element type before summing (its PreMulSum), and bf16's 1/3 is 0.333984375, so a
  bf16 average over 3, 6 or 7 ranks came out 0.2% off, every gradient and the norm alike.
  bf16 on the wire by default; never FP8 (NCCL re-rounds at every hop). With -pa fp32
  the chunk's pieces are first widened into an fp32 scratch (on the communication stream,
  so it still overlaps the backward), reduced in fp32 and rounded to bf16 once, on the
  owner, into its gradients: twice the bytes, and the sum of N ranks no longer collects N
  bf16 roundings. The scratch holds the largest chunk (wte, wpe, lnf), printed at startup.
- Weights after the update, where every FP8 block linear runs all three GEMMs in FP8 (-f8p
  all, the default; lm_head's passes do not count): per-tensor recipes: the optimizer pass
  has put each rank's amax of its part of every FP8 weight into the weight's cast record;
  one all-reduce(MAX) of those amaxes gives every rank the single-GPU amax (max is exact and
  order free), the scale follows on the device, each rank casts its part
  (fp8_cast_weight_part), ncclBroadcast from each piece's owner gathers the codes (1 byte
  per weight instead of 2), and each rank builds W^T locally. The block
  recipe (one scale per 128x128 block; a rank's flat part cuts blocks) does the same per
  block: each rank's partial amax of every block of its parts (fp8_block_amax_part, read
  from the owned master or bf16 part, not the optimizer's amax), ONE all-reduce(MAX) of all
  blocks' amaxes (432 per d12 layer), every rank writes every block's scale_inv for W and
  W^T and casts its part with them (fp8_cast_weight_block_part): bit for bit the
  single-GPU block cast. Under -fw delayed the optimizer pass has already written each rank's
  codes with the previous step's scale: no cast runs, that scale becomes the records' (the
  GEMMs'), and the all-reduced amax only updates the states for the next step. A resume
  rebuilds those codes with the saved scale the same way (zero_comm_restore_weight_codes).
  The rest (layernorms, biases, embeddings, and every matmul weight some bf16 GEMM reads) is
  gathered in bf16 the same way. The gather runs in stages (zero_comm_gather_stages): wte and
  wpe, sent by the update as soon as it has written them (zero_comm_gather_embeddings), then
  each layer's slices and W^T (lnf with the last), one NCCL group each on the
  communication stream, and the next forward waits for each stage where it first reads it
  (zero_comm_wait_gathered), not for the gather as a whole: layer l + 1's weights travel while
  layer l computes, and only the first stage is sure to show in the step time (ZeRO-3's small
  bf16 rest goes in one stage, zero_comm_num_stages). Matmul weights gathered as FP8 leave
  the bf16 copies of the other ranks' parts stale: nothing reads them, and
  zero_comm_all_gather_bf16 refreshes all of them before a checkpoint writes the model file.
- Every collective adds its payload (count x element size, what NCCL is handed, as
  nccl-tests counts "size") to a per-kind counter, so the trainer prints what a step
  actually sent, not what the layout predicts: the check that FP8 halves the matmul
  weights' gather is made on the calls that ran.
- ZeRO-3 (-z 3): the block linears' weights stay sharded, and each layer's four are
  gathered just before use, forward and again backward, in the one format their GEMMs read:
  FP8 codes for a linear whose three GEMMs all run in FP8 (per-tensor recipes, -fw current;
  W^T is transposed from them on arrival in the backward), bf16 for a linear with no FP8
  GEMM (a bf16 run: all four, at twice the bytes; the baseline FP8's gather is measured
  against). A linear in both is refused (train_config_check_zero_stage). After the update
  each rank casts only its part of an FP8 weight, into the linear's owned codes
  (fp8_model.cuh), and nothing of the four is gathered. A layer's weights go into one of two
  layer slots (FP8 in fp8_model.cuh's, bf16 in slot_bf16 here): zero_comm_gather_layer for
  layer l + 1 (l - 1 backward) is issued on the communication stream when layer l starts,
  after the slot's previous layer has released it (an event after that layer's last GEMM),
  and zero_comm_use_layer makes the compute stream wait for the gathered slot. The bf16
  copies of the other ranks' parts are never mapped (sparse_buffer.cuh): a checkpoint's
  model file gets them from their owners piece by piece (zero_comm_params_to_host).
- Every NCCL call goes through multi_gpu_nccl_settle, and the host waits only through
  multi_gpu_wait, so a dead peer ends the run with one line in bounded time.
*/
#ifndef LLMC_ZERO_COMM_CUH
#define LLMC_ZERO_COMM_CUH

#include <nccl.h>
#include "cuda_common.h"
#include "multi_gpu.h"
#include "zero.h"
#include "fp8_model.cuh"
#include "replica_check.cuh"

// the collectives of a step, by kind, for the traffic counters
typedef enum { ZERO_TRAFFIC_GRAD_REDUCE, ZERO_TRAFFIC_AMAX_ALL_REDUCE, ZERO_TRAFFIC_FP8_GATHER, ZERO_TRAFFIC_BF16_GATHER,
               ZERO_TRAFFIC_KINDS } ZeroTrafficKind;
static const char* const ZERO_TRAFFIC_NAMES[ZERO_TRAFFIC_KINDS] = {"gradient reduce", "FP8 weight amax all-reduce",
                                                                  "FP8 weight gather", "bf16 weight gather"};

typedef struct {
    const MultiGpuConfig* multi_gpu;
    ZeroLayout layout;
    int rank;
    ZeroPiece* pieces;          // [chunk][max_pieces]: the gradient reduction's pieces
    int* num_pieces;            // [chunk]
    int max_pieces;
    cudaEvent_t* chunk_ready;   // [chunk], recorded on the compute stream when its gradients are complete
    int reduce_fp32;            // -pa fp32: gradients reduced in fp32 through reduce_scratch
    float* reduce_scratch;      // device [largest chunk], -pa fp32 only
    size_t reduce_scratch_elements;
    ZeroPiece* pieces_device;   // the pieces again, for the widen and mean kernels
    size_t* scratch_offsets;    // device [chunk][max_pieces]: where each piece sits in the scratch (-pa fp32 only)
    cudaEvent_t reduced;        // on the communication stream, after the last chunk
    cudaEvent_t updated;        // on the compute stream, after the update: the gathers wait for it
    cudaEvent_t gathered;       // on the communication stream: zero_comm_join's
    cudaEvent_t* stage_gathered; // [zero_comm_num_stages], on the communication stream: the weight gather's stage has arrived
    int fp8_gather;             // the block linears' weights travel as FP8 (zero_comm_create)
    int zero3;                  // -z 3: the block linears' weights stay sharded, gathered per layer
    floatX* slot_bf16[FP8_LAYER_SLOTS][LINEAR_KINDS_PER_LAYER]; // ZeRO-3: a gathered layer's bf16 W [OC][K] of each
                                // linear with no FP8 GEMM (NULL for the FP8 ones: fp8_model.cuh's slots)
    cudaEvent_t slot_gathered[FP8_LAYER_SLOTS]; // ZeRO-3, on the communication stream: the slot's layer has arrived
    cudaEvent_t slot_free[FP8_LAYER_SLOTS];     // ZeRO-3, on the compute stream: the slot's last GEMM is enqueued before it
    int fp8_tensor[NUM_PARAMETER_TENSORS]; // the tensors that go as FP8 codes when fp8_gather
    uint32_t* amax_bits;        // device [FP8 block linears]: the weights' amaxes, all-reduced (per-tensor recipes)
    uint32_t* block_amax_bits;  // device [block_amax_count]: every 128x128 block's amax, all-reduced (block recipe)
    size_t* block_amax_offsets; // host [FP8 block linears]: where each weight's blocks start in block_amax_bits
    size_t block_amax_count;
    size_t gathered_bytes_fp8;  // bytes this rank receives per step, by kind
    size_t gathered_bytes_bf16;
    uint64_t traffic[ZERO_TRAFFIC_KINDS]; // payload bytes of the collectives issued so far, by kind
} ZeroComm;

// ZeRO-3 keeps tensor t sharded, gathered per layer and never after the update: the block
// linears' weights, the ones zero3_resident_ranges leaves unmapped
static inline int zero_comm_sharded(const ZeroComm* comm, int t) { return comm->zero3 && zero_tensor_is_matmul_weight(t); }

// FP8 linear index -> its weight tensor, for the four block kinds
static inline int zero_comm_weight_tensor(int kind) {
    static const int tensors[LINEAR_KINDS_PER_LAYER] = {PARAM_QKVW, PARAM_ATTPROJW, PARAM_FCW, PARAM_FCPROJW};
    return tensors[kind];
}

// the inverse: the block kind whose weight tensor t is, or -1 (not a block linear's weight)
static inline int zero_comm_weight_kind(int t) {
    for (int kind = 0; kind < LINEAR_KINDS_PER_LAYER; kind++) {
        if (zero_comm_weight_tensor(kind) == t) { return kind; }
    }
    return -1;
}

/*
The weight gather's stages (zero_comm_gather_stages): ZeRO-1, wte and wpe, then one per layer
(lnf with the last). ZeRO-3 gathers only the small bf16 rest after the update (its matmul
weights travel per use), in one stage: L more NCCL groups would cost their latency and delay
layer 0's gather, queued behind them, for no bytes worth hiding.
*/
static inline int zero_comm_num_stages(const ZeroComm* comm) { return comm->zero3 ? 1 : 1 + comm->layout.num_layers; }

// the stage that carries layer `layer`'s weights (-1: those outside the layers the forward reads
// first, wte and wpe)
static inline int zero_comm_stage_of(const ZeroComm* comm, int layer) { return comm->zero3 ? 0 : 1 + layer; }

// the stage that carries tensor t's slice of layer `layer` (-1: a tensor outside the layers).
// ZeRO-1's stage 0 is wte and wpe alone, so the update can send it as soon as it has them
// (zero_comm_gather_embeddings); lnf, which the forward reads after the last layer, rides with it.
static inline int zero_comm_tensor_stage(const ZeroComm* comm, int t, int layer) {
    if (!comm->zero3 && (t == PARAM_LNFW || t == PARAM_LNFB)) { return comm->layout.num_layers; }
    return zero_comm_stage_of(comm, layer);
}

// `stream` waits until the last weight gather's stage with layer `layer`'s weights (-1: wte and
// wpe) has arrived, and its W^T is built
static inline void zero_comm_wait_gathered(const ZeroComm* comm, int layer, cudaStream_t stream) {
    cudaCheck(cudaStreamWaitEvent(stream, comm->stage_gathered[zero_comm_stage_of(comm, layer)], 0));
}

// bytes this rank receives when every piece of flat [begin, end) comes from its owner
static inline size_t zero_comm_received_bytes(const ZeroLayout* layout, int rank, size_t begin, size_t end, size_t bytes) {
    ZeroRange own = zero_rank_range(layout, rank);
    size_t lo = begin > own.begin ? begin : own.begin, hi = end < own.end ? end : own.end;
    return ((end - begin) - (lo < hi ? hi - lo : 0)) * bytes;
}

// -pa fp32: where each piece sits in the scratch (each chunk's pieces back to back), and the
// scratch, which holds the largest chunk
static void zero_comm_create_fp32_scratch(ZeroComm* comm) {
    size_t table = (size_t)zero_num_chunks(&comm->layout) * comm->max_pieces;
    size_t* offsets = (size_t*)mallocCheck(table * sizeof(size_t));
    for (int c = 0; c < zero_num_chunks(&comm->layout); c++) {
        size_t at = 0;
        for (int p = 0; p < comm->num_pieces[c]; p++) {
            const ZeroPiece* piece = &comm->pieces[(size_t)c * comm->max_pieces + p];
            offsets[(size_t)c * comm->max_pieces + p] = at;
            at += piece->end - piece->begin;
        }
        if (at > comm->reduce_scratch_elements) { comm->reduce_scratch_elements = at; }
    }
    comm->reduce_scratch = (float*)cuda_malloc_checked(comm->reduce_scratch_elements * sizeof(float),
                                                       "fp32 gradient reduce scratch (-pa fp32; -pa bf16 needs none)");
    comm->scratch_offsets = (size_t*)cuda_malloc_checked(table * sizeof(size_t), "fp32 gradient reduce offsets");
    cudaCheck(cudaMemcpy(comm->scratch_offsets, offsets, table * sizeof(size_t), cudaMemcpyHostToDevice));
    free(offsets);
}

// the gradient reduce's device tables: the pieces (for the widen and mean kernels), and -pa fp32's
static void zero_comm_create_reduce_tables(ZeroComm* comm) {
    size_t table = (size_t)zero_num_chunks(&comm->layout) * comm->max_pieces;
    comm->pieces_device = (ZeroPiece*)cuda_malloc_checked(table * sizeof(ZeroPiece), "gradient reduce pieces");
    cudaCheck(cudaMemcpy(comm->pieces_device, comm->pieces, table * sizeof(ZeroPiece), cudaMemcpyHostToDevice));
    if (comm->reduce_fp32) { zero_comm_create_fp32_scratch(comm); }
    // the tables are read on the non-blocking NCCL stream, which does not wait for these copies
    // on the legacy stream (from pageable memory cudaMemcpy may return before they land)
    cudaCheck(cudaDeviceSynchronize());
}

#define ZERO3_SLOT_ALIGNMENT 256  // bytes: what cuBLASLt's heuristic asks of an operand at most (matmul.cuh)

/*
Where layer `layer`'s gathered bf16 weight of block linear `kind` starts in its slot: as many
bytes past the slot's 256-byte aligned start as its slice of the parameters is past 256-byte
alignment. cuBLASLt's heuristic picks its algorithm by the operands' alignment (matmul.cuh's
preference), and an algorithm by its order of summation sets the bits: so the GEMM reads the
weight at the alignment it has in one GPU's parameters, and ZeRO-3 trains that run's bits.
(A slice of GPT-2's weights is 256-byte aligned anyway; one of C = 192 need not be.)
*/
static inline floatX* zero_comm_slot_weight(const ZeroComm* comm, int layer, int kind) {
    ZeroRange slice = zero_slice_range(&comm->layout, zero_comm_weight_tensor(kind), layer);
    return comm->slot_bf16[layer % FP8_LAYER_SLOTS][kind] + slice.begin % (ZERO3_SLOT_ALIGNMENT / sizeof(floatX));
}

/*
ZeRO-3's part of zero_comm_create: the bf16 layer slots
of the linears with no FP8 GEMM, the slots' events. Each linear must be all FP8 (with the
FP8 weights sharded, per tensor, -fw current) or all bf16: train_config_check_zero_stage
refuses the rest on the command line first.
*/
static void zero_comm_create_zero3(ZeroComm* comm, const Fp8Model* fp8) {
    if (fp8->per_layer > 0 && (!comm->fp8_gather || !fp8->sharded || fp8_model_delayed_weights(fp8) || fp8_model_block(fp8))) {
        llm8_die("zero_comm_create: ZeRO-3 gathers a block linear's weight as FP8 only with every GEMM of it in FP8, "
                 "sharded FP8 weights, a per-tensor recipe and -fw current (train_config_check_zero_stage checks the flags first)");
    }
    const ZeroLayout* layout = &comm->layout;
    for (int kind = 0; kind < LINEAR_KINDS_PER_LAYER; kind++) {
        int t = zero_comm_weight_tensor(kind);
        for (int slot = 0; slot < FP8_LAYER_SLOTS && fp8->rank_in_layer[kind] < 0; slot++) {
            size_t slice = layout->tensor_sizes[t] / (size_t)layout->num_layers;  // + room for zero_comm_slot_weight's offset
            comm->slot_bf16[slot][kind] = (floatX*)cuda_malloc_checked(slice * sizeof(floatX) + ZERO3_SLOT_ALIGNMENT,
                                                                       "ZeRO-3 bf16 layer slot");
        }
    }
    for (int slot = 0; slot < FP8_LAYER_SLOTS; slot++) {
        cudaCheck(cudaEventCreateWithFlags(&comm->slot_gathered[slot], cudaEventDisableTiming));
        cudaCheck(cudaEventCreateWithFlags(&comm->slot_free[slot], cudaEventDisableTiming));
    }
}

void zero_comm_create(ZeroComm* comm, const MultiGpuConfig* multi_gpu, const GPT2Config* cfg, const Fp8Model* fp8,
                      int reduce_fp32, int zero3) {
    memset(comm, 0, sizeof(*comm));
    comm->multi_gpu = multi_gpu;
    comm->rank = multi_gpu->process_rank;
    zero_layout_init(&comm->layout, cfg, multi_gpu->num_processes);
    int chunks = zero_num_chunks(&comm->layout);
    comm->max_pieces = zero_chunk_max_pieces(&comm->layout);
    comm->pieces = (ZeroPiece*)mallocCheck((size_t)chunks * comm->max_pieces * sizeof(ZeroPiece));
    comm->num_pieces = (int*)mallocCheck((size_t)chunks * sizeof(int));
    comm->chunk_ready = (cudaEvent_t*)mallocCheck((size_t)chunks * sizeof(cudaEvent_t));
    for (int c = 0; c < chunks; c++) {
        comm->num_pieces[c] = zero_chunk_pieces(&comm->layout, c, comm->pieces + (size_t)c * comm->max_pieces);
        cudaCheck(cudaEventCreateWithFlags(&comm->chunk_ready[c], cudaEventDisableTiming));
    }
    comm->reduce_fp32 = reduce_fp32;
    zero_comm_create_reduce_tables(comm);
    cudaCheck(cudaEventCreateWithFlags(&comm->reduced, cudaEventDisableTiming));
    cudaCheck(cudaEventCreateWithFlags(&comm->updated, cudaEventDisableTiming));
    cudaCheck(cudaEventCreateWithFlags(&comm->gathered, cudaEventDisableTiming));
    comm->zero3 = zero3;  // before the stages are counted: ZeRO-3 has one
    comm->stage_gathered = (cudaEvent_t*)mallocCheck((size_t)zero_comm_num_stages(comm) * sizeof(cudaEvent_t));
    for (int s = 0; s < zero_comm_num_stages(comm); s++) {
        cudaCheck(cudaEventCreateWithFlags(&comm->stage_gathered[s], cudaEventDisableTiming));
    }

    // the block linears' weights travel as FP8 when the optimizer pass casts them (each FP8 one
    // runs all three GEMMs in FP8: no bf16 GEMM reads the bf16 weight, and W and W^T both exist);
    // otherwise in bf16, each rank casting them after the gather, as one GPU casts them from its
    // bf16 weights (fp8_weight_cast_in_update). lm_head is cast from the gathered bf16 wte.
    comm->fp8_gather = fp8_model_linears_cast_in_update(fp8) > 0;
    if (zero3) { zero_comm_create_zero3(comm, fp8); }
    if (comm->fp8_gather) {
        for (int k = 0; k < LINEAR_KINDS_PER_LAYER; k++) {
            comm->fp8_tensor[zero_comm_weight_tensor(k)] = fp8->rank_in_layer[k] >= 0;
        }
        int block_linears = fp8->per_layer * cfg->num_layers;
        if (fp8_model_block(fp8)) {
            comm->block_amax_offsets = (size_t*)mallocCheck((size_t)block_linears * sizeof(size_t));
            for (int i = 0; i < block_linears; i++) {
                comm->block_amax_offsets[i] = comm->block_amax_count;
                comm->block_amax_count += fp8_weight_blocks(fp8->linears[i].OC, fp8->linears[i].K);
            }
            comm->block_amax_bits = (uint32_t*)cuda_malloc_checked(comm->block_amax_count * sizeof(uint32_t),
                                                                   "ZeRO weight block amaxes (block recipe)");
        } else {
            comm->amax_bits = (uint32_t*)cuda_malloc_checked((size_t)block_linears * sizeof(uint32_t), "ZeRO weight amaxes");
        }
    }
    for (int t = 0; t < NUM_PARAMETER_TENSORS; t++) {
        size_t begin = comm->layout.tensor_offsets[t], end = begin + comm->layout.tensor_sizes[t];
        size_t bytes = zero_comm_received_bytes(&comm->layout, comm->rank, begin, end, comm->fp8_tensor[t] ? 1 : 2);
        if (zero_comm_sharded(comm, t)) { bytes = 0; }  // gathered per layer as they are used instead
        if (comm->fp8_tensor[t]) { comm->gathered_bytes_fp8 += bytes; } else { comm->gathered_bytes_bf16 += bytes; }
    }
}

void zero_comm_free(ZeroComm* comm) {
    for (int c = 0; c < zero_num_chunks(&comm->layout); c++) { cudaCheck(cudaEventDestroy(comm->chunk_ready[c])); }
    cudaCheck(cudaEventDestroy(comm->reduced));
    cudaCheck(cudaEventDestroy(comm->updated));
    cudaCheck(cudaEventDestroy(comm->gathered));
    for (int s = 0; s < zero_comm_num_stages(comm); s++) { cudaCheck(cudaEventDestroy(comm->stage_gathered[s])); }
    free(comm->stage_gathered);
    for (int slot = 0; slot < FP8_LAYER_SLOTS && comm->zero3; slot++) {
        cudaCheck(cudaEventDestroy(comm->slot_gathered[slot]));
        cudaCheck(cudaEventDestroy(comm->slot_free[slot]));
        for (int kind = 0; kind < LINEAR_KINDS_PER_LAYER; kind++) {
            if (comm->slot_bf16[slot][kind] != NULL) { cudaCheck(cudaFree(comm->slot_bf16[slot][kind])); }
        }
    }
    if (comm->amax_bits != NULL) { cudaCheck(cudaFree(comm->amax_bits)); }
    if (comm->block_amax_bits != NULL) { cudaCheck(cudaFree(comm->block_amax_bits)); }
    free(comm->block_amax_offsets);
    cudaCheck(cudaFree(comm->pieces_device));
    if (comm->reduce_fp32) {
        cudaCheck(cudaFree(comm->reduce_scratch));
        cudaCheck(cudaFree(comm->scratch_offsets));
    }
    free(comm->pieces);
    free(comm->num_pieces);
    free(comm->chunk_ready);
    memset(comm, 0, sizeof(*comm));
}

// one line: the payload of the collectives issued since the `before` snapshot of traffic, by kind
// (MB to the byte, so a check of a few amax bytes is as exact as one of the weights')
static void zero_comm_print_traffic(const ZeroComm* comm, const uint64_t before[ZERO_TRAFFIC_KINDS], int step) {
    uint64_t total = 0;
    printf("comm | step %d, payload by collective:", step);
    for (int k = 0; k < ZERO_TRAFFIC_KINDS; k++) {
        uint64_t bytes = comm->traffic[k] - before[k];
        total += bytes;
        printf("%s %s %.6f MB", k == 0 ? "" : ",", ZERO_TRAFFIC_NAMES[k], bytes / 1e6);
        if (k == ZERO_TRAFFIC_GRAD_REDUCE) { printf(" (%s)", comm->reduce_fp32 ? "fp32" : "bf16"); }
    }
    printf(" | total %.6f MB, plus two float all-reduces (loss, norm)\n", total / 1e6);
}

static inline void zero_comm_settle(const ZeroComm* comm, ncclResult_t result, const char* what) {
    multi_gpu_nccl_settle(comm->multi_gpu, result, what);
}

// the communication stream waits for what `stream` has enqueued so far
static inline void zero_comm_follow(ZeroComm* comm, cudaStream_t stream) {
    cudaCheck(cudaEventRecord(comm->updated, stream));
    cudaCheck(cudaStreamWaitEvent(comm->multi_gpu->nccl_stream, comm->updated, 0));
}

// `stream` waits for what the communication stream has enqueued so far
static inline void zero_comm_join(ZeroComm* comm, cudaStream_t stream) {
    cudaCheck(cudaEventRecord(comm->gathered, comm->multi_gpu->nccl_stream));
    cudaCheck(cudaStreamWaitEvent(stream, comm->gathered, 0));
}

// ----------------------------------------------------------------------------
// gradients

/*
After a chunk's sums, one launch each, block row y handling piece y. -pa fp32's widen copies
every piece into the fp32 scratch before the reduce. The mean kernel writes only the pieces
`rank` owns, the only ones the reduce left meaningful: their sum (the fp32 scratch, or with
-pa bf16 the gradients themselves, in place) divided by the rank count in fp32 (correctly
rounded: exact for a power of two, and for an exact sum of N equal values), rounded to bf16
once (to nearest even). sum_offsets: where each piece's sum sits in `sums`; NULL: at its own place in the
gradients (sums == grads).
*/
__global__ void zero_widen_pieces_kernel(float* scratch, const floatX* grads, const ZeroPiece* pieces,
                                         const size_t* offsets) {
    const ZeroPiece piece = pieces[blockIdx.y];
    float* out = scratch + offsets[blockIdx.y];
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < piece.end - piece.begin; i += (size_t)gridDim.x * blockDim.x) {
        out[i] = (float)grads[piece.begin + i];
    }
}

template <typename Sum>
__global__ void zero_mean_pieces_kernel(floatX* grads, const Sum* sums, const ZeroPiece* pieces, const size_t* sum_offsets,
                                        int rank, float num_ranks) {
    const ZeroPiece piece = pieces[blockIdx.y];
    if (piece.owner != rank) { return; }
    const Sum* in = sums + (sum_offsets != NULL ? sum_offsets[blockIdx.y] : piece.begin);
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < piece.end - piece.begin; i += (size_t)gridDim.x * blockDim.x) {
        grads[piece.begin + i] = (floatX)__fdiv_rn((float)in[i], num_ranks);
    }
}

// chunk's gradients are complete on the compute stream: reduce them to their owners, overlapped
void zero_comm_reduce_chunk(ZeroComm* comm, floatX* grads, int chunk, cudaStream_t compute) {
    cudaStream_t nccl_stream = comm->multi_gpu->nccl_stream;
    cudaCheck(cudaEventRecord(comm->chunk_ready[chunk], compute));  // one event per chunk: the reduces queue up
    cudaCheck(cudaStreamWaitEvent(nccl_stream, comm->chunk_ready[chunk], 0));
    size_t table_at = (size_t)chunk * comm->max_pieces;
    const ZeroPiece* pieces = comm->pieces + table_at;
    int num_pieces = comm->num_pieces[chunk];
    dim3 grid(256, (unsigned)num_pieces);
    if (comm->reduce_fp32) {
        zero_widen_pieces_kernel<<<grid, 256, 0, nccl_stream>>>(comm->reduce_scratch, grads, comm->pieces_device + table_at,
                                                                comm->scratch_offsets + table_at);
        cudaCheck(cudaGetLastError());
    }
    ncclComm_t nccl = comm->multi_gpu->nccl_comm;
    zero_comm_settle(comm, ncclGroupStart(), "gradient reduce (group start)");
    size_t scratch_at = 0;
    for (int p = 0; p < num_pieces; p++) {
        size_t count = pieces[p].end - pieces[p].begin;
        void* at = comm->reduce_fp32 ? (void*)(comm->reduce_scratch + scratch_at) : (void*)(grads + pieces[p].begin);
        zero_comm_settle(comm, ncclReduce(at, at, count, comm->reduce_fp32 ? ncclFloat32 : ncclBfloat16, ncclSum,
                                          pieces[p].owner, nccl, nccl_stream), "gradient reduce (ncclReduce)");
        comm->traffic[ZERO_TRAFFIC_GRAD_REDUCE] += count * (comm->reduce_fp32 ? sizeof(float) : sizeof(floatX));
        scratch_at += count;
    }
    zero_comm_settle(comm, ncclGroupEnd(), "gradient reduce");
    float num_ranks = (float)comm->layout.num_ranks;
    if (comm->reduce_fp32) {
        zero_mean_pieces_kernel<float><<<grid, 256, 0, nccl_stream>>>(grads, comm->reduce_scratch, comm->pieces_device + table_at,
                                                                      comm->scratch_offsets + table_at, comm->rank, num_ranks);
    } else {
        zero_mean_pieces_kernel<floatX><<<grid, 256, 0, nccl_stream>>>(grads, grads, comm->pieces_device + table_at, nullptr,
                                                                       comm->rank, num_ranks);
    }
    cudaCheck(cudaGetLastError());
    if (chunk == zero_num_chunks(&comm->layout) - 1) { cudaCheck(cudaEventRecord(comm->reduced, nccl_stream)); }
}

// the compute stream waits until every chunk has been reduced (before the norm and the update)
void zero_comm_wait_reduced(const ZeroComm* comm, cudaStream_t compute) {
    cudaCheck(cudaStreamWaitEvent(compute, comm->reduced, 0));
}

// ----------------------------------------------------------------------------
// weights

/*
Inside an NCCL group: flat elements [begin, end) into recv (which holds element `begin`), each
piece broadcast by the rank that owns it, from `own`, which holds flat element own_first on
this rank: the same memory as recv for an in-place gather (zero_comm_broadcast_range), or a
rank's own buffer of its part (ZeRO-3's owned codes, the parameters for the checkpoint).
Codes (ncclUint8) count as FP8 gather traffic, the rest as bf16.
*/
static void zero_comm_broadcast_pieces(ZeroComm* comm, void* recv, const void* own, size_t own_first, size_t begin, size_t end,
                                       ncclDataType_t type, size_t element_bytes, const char* what) {
    for (size_t at = begin; at < end;) {
        int owner = zero_owner(&comm->layout, at);
        size_t owner_end = (size_t)(owner + 1) * comm->layout.shard_size;
        size_t piece_end = owner_end < end ? owner_end : end;
        char* piece = (char*)recv + (at - begin) * element_bytes;
        const char* send = owner == comm->rank ? (const char*)own + (at - own_first) * element_bytes : piece;
        zero_comm_settle(comm, ncclBroadcast(send, piece, piece_end - at, type, owner, comm->multi_gpu->nccl_comm,
                                             comm->multi_gpu->nccl_stream), what);
        comm->traffic[type == ncclUint8 ? ZERO_TRAFFIC_FP8_GATHER : ZERO_TRAFFIC_BF16_GATHER] += (piece_end - at) * element_bytes;
        at = piece_end;
    }
}

// the same in place: base holds element `begin` on every rank (one linear's codes, or the
// bf16 parameters at their offset)
static void zero_comm_broadcast_range(ZeroComm* comm, void* base, size_t begin, size_t end, ncclDataType_t type,
                                      size_t element_bytes, const char* what) {
    zero_comm_broadcast_pieces(comm, base, base, begin, begin, end, type, element_bytes, what);
}

// every rank's bf16 parameters whole (one ncclAllGather, in place); waits on `stream`'s work so far
void zero_comm_all_gather_bf16(ZeroComm* comm, floatX* params, cudaStream_t stream) {
    zero_comm_follow(comm, stream);
    size_t S = comm->layout.shard_size;
    zero_comm_settle(comm, ncclAllGather(params + (size_t)comm->rank * S, params, S, ncclBfloat16, comm->multi_gpu->nccl_comm,
                                         comm->multi_gpu->nccl_stream), "bf16 weight all-gather");
    comm->traffic[ZERO_TRAFFIC_BF16_GATHER] += comm->layout.padded_total * sizeof(floatX);
    zero_comm_join(comm, stream);
}

// the part of FP8 linear lin's weight this rank owns, flat [*lo, *hi); 0 when it owns none
static inline int zero_comm_owned_weight_part(const ZeroComm* comm, const Fp8Linear* lin, size_t* lo, size_t* hi) {
    ZeroRange own = zero_rank_range(&comm->layout, comm->rank);
    size_t begin = lin->weight_offset, end = begin + (size_t)lin->OC * lin->K;
    *lo = begin > own.begin ? begin : own.begin;
    *hi = end < own.end ? end : own.end;
    return *lo < *hi;
}

// inside an NCCL group: the block linears' W codes, every piece from its owner
static void zero_comm_broadcast_weight_codes(ZeroComm* comm, const Fp8Model* fp8, int block_linears) {
    for (int i = 0; i < block_linears; i++) {
        const Fp8Linear* lin = &fp8->linears[i];
        zero_comm_broadcast_range(comm, lin->w_codes, lin->weight_offset, lin->weight_offset + (size_t)lin->OC * lin->K,
                                  ncclUint8, 1, "FP8 weight gather (ncclBroadcast)");
    }
}

/*
The block recipe's casts of the parts this rank owns (steps 1 and 2 of zero_comm_gather):
each rank's partial amax of every 128x128 block of the block linears' weights (its own part
of each, read from master or params; the optimizer's per-tensor amax is not used), ONE
all-reduce(MAX) of all the blocks, then every rank writes every block's scale_inv (W and W^T
layouts) and casts its part with them: with max exact and order free, the same codes and
scales as one rank's whole-weight cast (zero.h's zero_simulate_fp8_block_weight_gather).
*/
static void zero_comm_cast_block_parts(ZeroComm* comm, Fp8Model* fp8, const floatX* params, const float* master,
                                       cudaStream_t stream) {
    ZeroRange own = zero_rank_range(&comm->layout, comm->rank);
    int block_linears = fp8->per_layer * comm->layout.num_layers;
    cudaCheck(cudaMemsetAsync(comm->block_amax_bits, 0, comm->block_amax_count * sizeof(uint32_t), stream));
    for (int i = 0; i < block_linears; i++) {
        const Fp8Linear* lin = &fp8->linears[i];
        size_t lo, hi;
        if (!zero_comm_owned_weight_part(comm, lin, &lo, &hi)) { continue; }
        uint32_t* block_amax = comm->block_amax_bits + comm->block_amax_offsets[i];
        size_t first = lo - lin->weight_offset;
        if (master != NULL) { fp8_block_amax_part(block_amax, master + (lo - own.begin), first, hi - lo, lin->K, stream); }
        else { fp8_block_amax_part(block_amax, params + lo, first, hi - lo, lin->K, stream); }
    }
    zero_comm_follow(comm, stream);
    zero_comm_settle(comm, ncclAllReduce(comm->block_amax_bits, comm->block_amax_bits, comm->block_amax_count, ncclUint32,
                                         ncclMax, comm->multi_gpu->nccl_comm, comm->multi_gpu->nccl_stream),
                     "FP8 weight block amax all-reduce");
    comm->traffic[ZERO_TRAFFIC_AMAX_ALL_REDUCE] += comm->block_amax_count * sizeof(uint32_t);
    zero_comm_join(comm, stream);
    for (int i = 0; i < block_linears; i++) {
        const Fp8Linear* lin = &fp8->linears[i];
        size_t lo, hi;
        int owned = zero_comm_owned_weight_part(comm, lin, &lo, &hi);  // none owned: the scales only
        size_t first = owned ? lo - lin->weight_offset : 0, n = owned ? hi - lo : 0;
        Fp8CastOutput w = fp8_model_w(fp8, i);
        const uint32_t* block_amax = comm->block_amax_bits + comm->block_amax_offsets[i];
        if (master != NULL) {
            const float* part = owned ? master + (lo - own.begin) : master;
            fp8_cast_weight_block_part(&w, part, first, n, lin->OC, lin->K, block_amax, stream);
        } else {
            fp8_cast_weight_block_part(&w, params + lin->weight_offset + first, first, n, lin->OC, lin->K, block_amax, stream);
        }
    }
}

// the per-tensor recipes' steps 1 and 2 of zero_comm_gather: the weights' amaxes all-reduced,
// the scales, and (unless the optimizer pass wrote them) this rank's codes of its parts
static void zero_comm_cast_tensor_parts(ZeroComm* comm, Fp8Model* fp8, const floatX* params, const float* master,
                                        bool codes_written, cudaStream_t stream) {
    cudaStream_t nccl_stream = comm->multi_gpu->nccl_stream;
    ZeroRange own = zero_rank_range(&comm->layout, comm->rank);
    int block_linears = fp8->per_layer * comm->layout.num_layers;
    Fp8TensorScaling* w_states = fp8->states + 2 * fp8->num_linears;
    Fp8CastRecord* w_records = fp8->records + 2 * fp8->num_linears;

    // (1) the amaxes of every block linear's weight, MAX over ranks, then the scales (written
    // codes: the scales they used go to the records first; the new ones are the next step's)
    if (codes_written) { fp8_scaling_publish_scales(w_states, w_records, block_linears, stream); }
    cudaCheck(cudaMemcpy2DAsync(comm->amax_bits, sizeof(uint32_t), &w_records[0].amax_bits, sizeof(Fp8CastRecord),
                                sizeof(uint32_t), (size_t)block_linears, cudaMemcpyDeviceToDevice, stream));
    zero_comm_follow(comm, stream);
    zero_comm_settle(comm, ncclAllReduce(comm->amax_bits, comm->amax_bits, (size_t)block_linears, ncclUint32, ncclMax,
                                         comm->multi_gpu->nccl_comm, nccl_stream), "FP8 weight amax all-reduce");
    comm->traffic[ZERO_TRAFFIC_AMAX_ALL_REDUCE] += (size_t)block_linears * sizeof(uint32_t);
    zero_comm_join(comm, stream);
    cudaCheck(cudaMemcpy2DAsync(&w_records[0].amax_bits, sizeof(Fp8CastRecord), comm->amax_bits, sizeof(uint32_t),
                                sizeof(uint32_t), (size_t)block_linears, cudaMemcpyDeviceToDevice, stream));
    fp8_scaling_update_records(w_states, w_records, block_linears, stream);

    // (2) unless the codes are written, each rank casts its parts with the global scale
    if (!codes_written) {
        fp8_scaling_publish_scales(w_states, w_records, block_linears, stream);
        for (int i = 0; i < block_linears; i++) {
            const Fp8Linear* lin = &fp8->linears[i];
            size_t lo, hi;
            if (!zero_comm_owned_weight_part(comm, lin, &lo, &hi)) { continue; }
            Fp8CastOutput w = fp8_model_w(fp8, i);
            size_t first = lo - lin->weight_offset;
            if (comm->zero3) { w.codes = lin->owned_codes; first = 0; }  // the owned part's own buffer
            if (master != NULL) { fp8_cast_weight_part(&w, master + (lo - own.begin), first, hi - lo, stream); }
            else { fp8_cast_weight_part(&w, params + lo, first, hi - lo, stream); }
        }
    }
}

/*
Steps 3 and 4 of zero_comm_gather, in every recipe: the weights whole again, in stages that
the next forward waits for one at a time (zero_comm_wait_gathered) rather than all at once, so
layer l + 1's weights travel while layer l computes. Stage 0: wte and wpe, in bf16; stage 1 + l: layer l's slices, the block linears' W as FP8 codes when
they travel so (W^T follows from them, on the communication stream), everything else in bf16,
and lnf with the last layer; ZeRO-3's sharded weights are in none, and its bf16 rest is all
stage 0 (zero_comm_num_stages). Stages [first_stage, end_stage), each one NCCL group, issued
back to back after `stream`'s work so far.
*/
static void zero_comm_gather_stages(ZeroComm* comm, Fp8Model* fp8, floatX* params, int first_stage, int end_stage,
                                    cudaStream_t stream) {
    cudaStream_t nccl_stream = comm->multi_gpu->nccl_stream;
    const ZeroLayout* layout = &comm->layout;
    zero_comm_follow(comm, stream);
    for (int stage = first_stage; stage < end_stage; stage++) {
        zero_comm_settle(comm, ncclGroupStart(), "weight gather (group start)");
        for (int layer = -1; layer < layout->num_layers; layer++) {  // -1: the tensors outside the layers
            for (int t = 0; t < NUM_PARAMETER_TENSORS; t++) {
                if (zero_tensor_is_per_layer(t) != (layer >= 0) || zero_comm_sharded(comm, t)) { continue; }
                if (zero_comm_tensor_stage(comm, t, layer) != stage) { continue; }
                ZeroRange slice = zero_slice_range(layout, t, layer);
                if (comm->fp8_tensor[t]) {
                    const Fp8Linear* lin = &fp8->linears[fp8_model_linear(fp8, layer, zero_comm_weight_kind(t))];
                    zero_comm_broadcast_range(comm, lin->w_codes, lin->weight_offset, lin->weight_offset + (size_t)lin->OC * lin->K,
                                              ncclUint8, 1, "FP8 weight gather (ncclBroadcast)");
                } else {
                    zero_comm_broadcast_range(comm, params + slice.begin, slice.begin, slice.end, ncclBfloat16, sizeof(floatX),
                                              "bf16 weight gather (ncclBroadcast)");
                }
            }
        }
        zero_comm_settle(comm, ncclGroupEnd(), "weight gather");
        int layer = stage - 1;  // ZeRO-1's stage of layer `layer`; ZeRO-3 transposes each use's gather instead
        if (layer >= 0 && comm->fp8_gather && !comm->zero3) {
            fp8_model_transpose_layer_weights(fp8, layer, nccl_stream);
        }
        cudaCheck(cudaEventRecord(comm->stage_gathered[stage], nccl_stream));
    }
}

/*
Every rank's weights whole again, bf16 and FP8 (see the top comment), params and master (the
owned range only, NULL with -w 0) as they are now. Per-tensor recipes: the FP8 weights'
records hold this rank's amax of its parts. codes_written: the optimizer pass wrote this
rank's codes (-fw delayed). The stages from first_stage on are sent (ZeRO-1 after an update:
1, the update sent stage 0). `stream` goes on once stage 0 has arrived (lm_head, FP8 or not,
is cast from the gathered bf16 wte), or once every stage has where the FP8 block linears'
weights travel in bf16 and each rank casts them itself (not the default: not overlapped).
*/
static void zero_comm_gather(ZeroComm* comm, Fp8Model* fp8, floatX* params, const float* master, bool codes_written,
                             int first_stage, cudaStream_t stream) {
    int block_linears = fp8->per_layer * comm->layout.num_layers;
    if (comm->fp8_gather && fp8_model_block(fp8)) {
        zero_comm_cast_block_parts(comm, fp8, params, master, stream);
    } else if (comm->fp8_gather) {
        zero_comm_cast_tensor_parts(comm, fp8, params, master, codes_written, stream);
    }
    zero_comm_gather_stages(comm, fp8, params, first_stage, zero_comm_num_stages(comm), stream);
    if (fp8_model_linears_cast_in_update(fp8) < fp8->num_linears) {  // some FP8 weights are cast from the gathered bf16:
        if (!comm->fp8_gather && block_linears > 0) { zero_comm_join(comm, stream); }  // every one (all stages)
        else { zero_comm_wait_gathered(comm, -1, stream); }                              // lm_head alone (stage 0: wte)
        fp8_model_cast_weights_from_bf16(fp8, params, stream);
    }
}

/*
ZeRO-1, during the update, once it has written this rank's parts of wte and wpe (the first
tensors it updates): their stage 0 goes now, behind the rest of the update, rather than after
it, and zero_comm_gather_weights sends the other stages. Nothing under ZeRO-3, whose one stage
needs every tensor's update.
*/
void zero_comm_gather_embeddings(ZeroComm* comm, Fp8Model* fp8, floatX* params, cudaStream_t stream) {
    if (!comm->zero3) { zero_comm_gather_stages(comm, fp8, params, 0, 1, stream); }
}

// after the update of the owned range: the optimizer pass wrote the FP8 weights' amaxes, and
// under -fw delayed this rank's codes of the weights gathered as FP8 (gpt2_update decides which);
// under ZeRO-1 it also sent stage 0 (zero_comm_gather_embeddings)
void zero_comm_gather_weights(ZeroComm* comm, Fp8Model* fp8, floatX* params, const float* master, cudaStream_t stream) {
    zero_comm_gather(comm, fp8, params, master, fp8_model_delayed_weights(fp8), comm->zero3 ? 0 : 1, stream);
}

// the same with no optimizer pass before it (at the start, after a resume): each rank finds
// the amax of its parts of the FP8 weights itself and casts them (current scaling, which also
// seeds a delayed weight), so the codes are those training would have; the block recipe's
// gather finds its block amaxes itself either way. `stream` waits for every stage: what
// follows (a resume's zero_comm_restore_weight_codes) may rewrite the codes just sent.
void zero_comm_refresh_weights(ZeroComm* comm, Fp8Model* fp8, floatX* params, const float* master, cudaStream_t stream) {
    if (comm->fp8_gather && !fp8_model_block(fp8)) {
        ZeroRange own = zero_rank_range(&comm->layout, comm->rank);
        for (int i = 0; i < fp8->per_layer * comm->layout.num_layers; i++) {
            const Fp8Linear* lin = &fp8->linears[i];
            size_t lo, hi;
            if (!zero_comm_owned_weight_part(comm, lin, &lo, &hi)) { continue; }
            Fp8CastOutput w = fp8_model_w(fp8, i);
            if (master != NULL) { fp8_amax_launch(w.record, master + (lo - own.begin), hi - lo, Fp8Identity(), stream); }
            else { fp8_amax_launch(w.record, params + lo, hi - lo, Fp8Identity(), stream); }
        }
    }
    zero_comm_gather(comm, fp8, params, master, false, 0, stream);
    zero_comm_join(comm, stream);
}

/*
After a resume under -fw delayed (fp8_model_restore_weight_codes on one GPU): the weights
gathered as FP8 get back the codes the optimizer pass wrote, each rank rebuilding its parts
with the restored records' scales, then the gather and W^T as after an update. The others
(the bf16-gathered weights, lm_head) were cast after the gather in the run too: the refresh
before the restore already gave them their codes. Not a use: no state or record changes.
*/
void zero_comm_restore_weight_codes(ZeroComm* comm, Fp8Model* fp8, const floatX* params, const float* master,
                                    cudaStream_t stream) {
    if (!comm->fp8_gather || !fp8_model_delayed_weights(fp8)) { return; }
    ZeroRange own = zero_rank_range(&comm->layout, comm->rank);
    int block_linears = fp8->per_layer * comm->layout.num_layers;
    for (int i = 0; i < block_linears; i++) {
        const Fp8Linear* lin = &fp8->linears[i];
        size_t lo, hi;
        if (!zero_comm_owned_weight_part(comm, lin, &lo, &hi)) { continue; }
        const Fp8CastRecord* record = fp8_model_w(fp8, i).record;
        uint8_t* codes = lin->w_codes + (lo - lin->weight_offset);
        if (master != NULL) { fp8_weight_codes(codes, master + (lo - own.begin), hi - lo, record, stream); }
        else { fp8_weight_codes(codes, params + lo, hi - lo, record, stream); }
    }
    zero_comm_follow(comm, stream);
    zero_comm_settle(comm, ncclGroupStart(), "weight gather (group start)");
    zero_comm_broadcast_weight_codes(comm, fp8, block_linears);
    zero_comm_settle(comm, ncclGroupEnd(), "weight gather");
    zero_comm_join(comm, stream);
    fp8_model_transpose_weights(fp8, stream);
}

/*
For -pc (replica_check.cuh): what the weight gather leaves bitwise identical on every rank,
one region per slice as zero_comm_gather_stages sends it: the bf16 slices, or the FP8 codes
of a weight gathered as FP8 (whose bf16 copies of other ranks' parts are stale by design);
then every FP8 linear's W and W^T codes that are not ZeRO-3's (those live in the layer slots
only while in use), its block scales, and its weight scaling state and the scale its GEMMs
read, which the all-reduced amax makes the same everywhere. Not the owned-range state
(master, optimizer) nor the activations' scaling (each rank's own data).
*/
void zero_comm_replicated_regions(const ZeroComm* comm, const Fp8Model* fp8, const floatX* params, ReplicaCheck* check) {
    const ZeroLayout* layout = &comm->layout;
    char where[32];  // "layer l " before a per-layer name, "" outside the layers (replica_layer_prefix)
    for (int layer = -1; layer < layout->num_layers; layer++) {  // -1: the tensors outside the layers
        replica_layer_prefix(where, sizeof(where), layer);
        for (int t = 0; t < NUM_PARAMETER_TENSORS; t++) {
            if (zero_tensor_is_per_layer(t) != (layer >= 0) || zero_comm_sharded(comm, t) || comm->fp8_tensor[t]) { continue; }
            ZeroRange slice = zero_slice_range(layout, t, layer);
            replica_check_add(check, params + slice.begin, (slice.end - slice.begin) * sizeof(floatX), "%s%s (bf16)", where,
                              PARAM_TENSOR_NAMES[t]);
        }
    }
    for (int i = 0; i < fp8->num_linears; i++) {
        const Fp8Linear* lin = &fp8->linears[i];
        const char* kind = LINEAR_KIND_NAMES[lin->kind];
        replica_layer_prefix(where, sizeof(where), lin->layer);
        size_t elements = (size_t)lin->OC * lin->K;
        if (!(fp8->sharded && lin->layer >= 0)) {
            if (lin->w_codes != NULL) { replica_check_add(check, lin->w_codes, elements, "%s%s W (FP8 codes)", where, kind); }
            if (lin->w_codes_t != NULL) { replica_check_add(check, lin->w_codes_t, elements, "%s%s W^T (FP8 codes)", where, kind); }
            if (lin->w_scale_inv != NULL) {
                replica_check_add(check, lin->w_scale_inv, fp8_block_scale_floats(FP8_SCALING_BLOCKS_128x128, lin->OC, lin->K)
                                  * sizeof(float), "%s%s W block scales", where, kind);
            }
            if (lin->w_scale_inv_t != NULL) {
                replica_check_add(check, lin->w_scale_inv_t, fp8_block_scale_floats(FP8_SCALING_BLOCKS_128x128, lin->K, lin->OC)
                                  * sizeof(float), "%s%s W^T block scales", where, kind);
            }
        }
        Fp8CastOutput w = fp8_model_w(fp8, i);
        replica_check_add(check, w.state, sizeof(Fp8TensorScaling), "%s%s W scaling state", where, kind);
        replica_check_add(check, &w.record->scale_inv, 2 * sizeof(float), "%s%s W scale (its GEMMs')", where, kind);  // scale_inv, scale
    }
}

// ----------------------------------------------------------------------------
// ZeRO-3: one layer's weights at a time

/*
Layer `layer`'s block linears' weights into the layer's slot (layer % FP8_LAYER_SLOTS), every
piece from its owner: an FP8 linear's W codes from the owner's owned codes, a bf16 linear's W
from the owner's parameters; on the communication stream once the slot's previous layer has
released it. with_transpose (the backward's FP8 dgrad reads W^T): W^T of the FP8 ones follows
there too. Issued one layer ahead of its use, in the same order on every rank.
*/
void zero_comm_gather_layer(ZeroComm* comm, Fp8Model* fp8, const floatX* params, int layer, bool with_transpose) {
    int slot = layer % FP8_LAYER_SLOTS;
    cudaStream_t nccl_stream = comm->multi_gpu->nccl_stream;
    cudaCheck(cudaStreamWaitEvent(nccl_stream, comm->slot_free[slot], 0));
    zero_comm_settle(comm, ncclGroupStart(), "ZeRO-3 layer gather (group start)");
    for (int kind = 0; kind < LINEAR_KINDS_PER_LAYER; kind++) {
        int i = fp8_model_linear(fp8, layer, kind);
        if (i < 0) {
            ZeroRange slice = zero_slice_range(&comm->layout, zero_comm_weight_tensor(kind), layer);
            zero_comm_broadcast_pieces(comm, zero_comm_slot_weight(comm, layer, kind), params, 0, slice.begin, slice.end, ncclBfloat16,
                                       sizeof(floatX), "ZeRO-3 layer gather (ncclBroadcast)");
            continue;
        }
        const Fp8Linear* lin = &fp8->linears[i];
        size_t begin = lin->weight_offset;
        zero_comm_broadcast_pieces(comm, fp8->slot_w[slot][kind], lin->owned_codes, begin + lin->owned_begin, begin,
                                   begin + (size_t)lin->OC * lin->K, ncclUint8, 1, "ZeRO-3 layer gather (ncclBroadcast)");
    }
    zero_comm_settle(comm, ncclGroupEnd(), "ZeRO-3 layer gather");
    for (int kind = 0; kind < LINEAR_KINDS_PER_LAYER && with_transpose; kind++) {
        int i = fp8_model_linear(fp8, layer, kind);
        if (i < 0) { continue; }
        fp8_transpose_codes(fp8->slot_w[slot][kind], fp8->slot_w_t[slot][kind], fp8->linears[i].OC, fp8->linears[i].K,
                            nccl_stream);
    }
    cudaCheck(cudaEventRecord(comm->slot_gathered[slot], nccl_stream));
}

// the compute stream waits for layer `layer`'s gathered slot, and its linears read from it
// (the FP8 ones bound here, the bf16 ones through zero_comm_layer_weight)
void zero_comm_use_layer(ZeroComm* comm, Fp8Model* fp8, int layer, cudaStream_t compute) {
    int slot = layer % FP8_LAYER_SLOTS;
    cudaCheck(cudaStreamWaitEvent(compute, comm->slot_gathered[slot], 0));
    fp8_model_bind_layer(fp8, layer, slot);
}

// the gathered bf16 weight of bf16 block linear (layer, kind), in use since zero_comm_use_layer
// (NULL for an FP8 linear: its GEMMs read the codes)
static inline const floatX* zero_comm_layer_weight(const ZeroComm* comm, int layer, int kind) {
    return comm->slot_bf16[layer % FP8_LAYER_SLOTS][kind] != NULL ? zero_comm_slot_weight(comm, layer, kind) : NULL;
}

// layer `layer`'s last GEMM is enqueued on `compute`: its slot may take the next layer after it
void zero_comm_release_layer(ZeroComm* comm, int layer, cudaStream_t compute) {
    cudaCheck(cudaEventRecord(comm->slot_free[layer % FP8_LAYER_SLOTS], compute));
}

/*
Every rank's bf16 parameters into host_bf16 [num_parameters] on rank 0 (the others only
send), for the model file: under ZeRO-3 no rank holds the others' parts of the block linears'
weights, so each of those pieces comes from its owner through a bounce buffer, one weight
slice at a time; everything else is whole on rank 0 once the last weight gather has arrived:
it runs on the communication stream, which nothing on `stream` waits for before the next
forward, so it is joined first (without that, the model file held the other ranks' parts of
the replicated tensors as of the update before). save_checkpoint's barrier before writing
(an all-reduce on the same communicator, which the host waits for) happens to order it as well
today; the join keeps this function right without relying on its caller. Collective: every
rank calls it.
*/
void zero_comm_params_to_host(ZeroComm* comm, const floatX* params, uint16_t* host_bf16, cudaStream_t stream) {
    const ZeroLayout* layout = &comm->layout;
    size_t widest = 0;
    for (int t = 0; t < NUM_PARAMETER_TENSORS; t++) {
        size_t slice = layout->tensor_sizes[t] / (zero_tensor_is_per_layer(t) ? (size_t)layout->num_layers : 1);
        if (zero_comm_sharded(comm, t) && slice > widest) { widest = slice; }
    }
    floatX* bounce = (floatX*)cuda_malloc_checked(widest * sizeof(floatX), "checkpoint bounce buffer (one weight slice, ZeRO-3)");
    zero_comm_join(comm, stream);
    multi_gpu_wait(comm->multi_gpu, stream, "checkpoint gather (start)");
    for (int t = 0; t < NUM_PARAMETER_TENSORS; t++) {
        size_t begin = layout->tensor_offsets[t], end = begin + layout->tensor_sizes[t];
        if (!zero_comm_sharded(comm, t)) {  // replicated: rank 0 has it
            if (comm->rank == 0) { cudaCheck(cudaMemcpy(host_bf16 + begin, params + begin, (end - begin) * sizeof(floatX), cudaMemcpyDeviceToHost)); }
            continue;
        }
        for (int layer = 0; layer < layout->num_layers; layer++) {
            ZeroRange slice = zero_slice_range(layout, t, layer);
            zero_comm_follow(comm, stream);
            zero_comm_settle(comm, ncclGroupStart(), "checkpoint gather (group start)");
            zero_comm_broadcast_pieces(comm, bounce, params, 0, slice.begin, slice.end, ncclBfloat16, sizeof(floatX),
                                       "checkpoint gather (ncclBroadcast)");
            zero_comm_settle(comm, ncclGroupEnd(), "checkpoint gather");
            zero_comm_join(comm, stream);
            multi_gpu_wait(comm->multi_gpu, stream, "checkpoint gather");
            if (comm->rank == 0) {
                cudaCheck(cudaMemcpy(host_bf16 + slice.begin, bounce, (slice.end - slice.begin) * sizeof(floatX), cudaMemcpyDeviceToHost));
            }
        }
    }
    cudaCheck(cudaFree(bounce));
}

#endif // LLMC_ZERO_COMM_CUH
