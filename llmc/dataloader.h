/*
dataloader.h: llm.c token shards in, (B, T) batches of inputs and targets out.

Why it is shaped this way:
- Shards stay byte-compatible with llm.c (header of 256 int32: [0] 20240520, [1] version 1,
  [2] token count; then uint16 tokens), so datasets prepared for llm.c train here unchanged.
- The batch order is llm.c's: a shard is cut into samples of num_processes*B*T tokens (plus
  one for the last target); within a sample rank r reads the window starting at r*B*T, so
  ranks are interleaved and, over an epoch, disjoint. When shuffling, the shard order and
  the sample order inside each shard are permuted per epoch from an MT19937 seeded with
  42 + rank, so a run is reproducible and resumable. As in llm.c, each epoch's shard order is
  a shuffle of the previous epoch's (the saved order matters on resume), and each shard's
  sample order a shuffle of the identity. A shard shorter than one sample holds none and is
  passed over (llm.c refuses the glob; a split's last shard is often short), and the trainers
  say so (dataloader_note_short_shards); only a glob with no sample at all is refused.
- Bad data must fail before it can reach a kernel as an out-of-range embedding index: every
  shard's header and length are checked at init (cheap), and every token id is checked
  against the vocabulary when the shard is loaded for use. A loaded shard is held in host
  memory (at most a few hundred MB for FineWeb's 100M-token shards), which makes that scan
  free and each batch a memcpy.
- Resume must continue bit for bit: the position (current_shard_idx, current_sample_idx)
  goes in the state header, and the shuffle state (permutations and rng) in llm.c's state
  file trailer via dataloader_write_state / dataloader_read_state. The rng is written in
  llm.c's struct layout (seed_, left_, next_, state_[624], MATRIX_A[2]) so the trailer is
  byte-compatible with llm.c's.
- A checkpoint written with another number of ranks, B or T holds positions and permutations
  of another sample size, which map to nothing in this run. The loader's walk is a function of
  the batch count alone (shard sizes, num_processes*B*T, the rng seeded per rank), so
  dataloader_seek_batches replays it from the shard headers (no tokens are read; the
  shuffle rng makes exactly the draws the batches would have made) and lands where a run
  with this loader's ranks, B and T is after that many batches: doc/multi-gpu.md.
*/
#ifndef LLMC_DATALOADER_H
#define LLMC_DATALOADER_H

#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <glob.h>
#include <limits.h>
#include "utils.h"
#include "rand.h"

#define DATA_SHARD_MAGIC 20240520
#define DATA_SHARD_VERSION 1
#define DATA_HEADER_INTS 256
#define DATA_HEADER_BYTES (DATA_HEADER_INTS * sizeof(int32_t))
#define DATALOADER_SHUFFLE_SEED 42

typedef struct {
    // configuration
    int process_rank;
    int num_processes;
    size_t B;
    size_t T;
    int vocab_size;
    int should_shuffle;
    // the shards matched by the pattern, sorted by name
    glob_t glob_result;
    size_t num_shards;
    size_t num_tokens;          // total over all shards
    size_t* file_num_tokens;    // num_shards entries: each shard's token count (glob order)
    // the shard in memory
    int loaded_shard;           // index into glob_result, -1 when none
    uint16_t* shard_tokens;
    size_t shard_num_samples;   // samples of num_processes*B*T (+1) tokens in this shard
    // position: the next batch is sample current_sample_idx of shard current_shard_idx
    size_t current_shard_idx;
    size_t current_sample_idx;
    // shuffle state (only used when should_shuffle)
    mt19937_state shuffle_rng;
    int* shard_indices;         // num_shards entries: epoch order of the shards
    int* intra_shard_indices;   // num_intra_shard_indices entries: sample order in the shard
    size_t num_intra_shard_indices;
    // outputs of dataloader_next_batch, B*T each
    int* inputs;
    int* targets;
} DataLoader;

// reads and checks a shard header and the file length; returns the token count
static inline size_t dataloader_read_shard_header_(const char* path) {
    FILE* fp = fopenCheck(path, "rb");
    long file_bytes = file_size_bytes(fp);
    if (file_bytes < (long)DATA_HEADER_BYTES) {
        llm8_die("token shard '%s' is %ld bytes, shorter than its %zu-byte header", path, file_bytes, DATA_HEADER_BYTES);
    }
    int32_t header[DATA_HEADER_INTS];
    freadCheck(header, sizeof(int32_t), DATA_HEADER_INTS, fp);
    fcloseCheck(fp);
    if (header[0] != DATA_SHARD_MAGIC) {
        llm8_die("token shard '%s' has magic %d, expected %d (not an llm.c token shard)", path, header[0], DATA_SHARD_MAGIC);
    }
    if (header[1] != DATA_SHARD_VERSION) {
        llm8_die("token shard '%s' has version %d, expected %d", path, header[1], DATA_SHARD_VERSION);
    }
    if (header[2] < 0) {
        llm8_die("token shard '%s' has a negative token count %d", path, header[2]);
    }
    size_t num_tokens = (size_t)header[2];
    long expected_bytes = (long)(DATA_HEADER_BYTES + num_tokens * sizeof(uint16_t));
    if (file_bytes != expected_bytes) {
        llm8_die("token shard '%s' is %ld bytes but its header says %zu tokens (%ld bytes): truncated or corrupt",
                 path, file_bytes, num_tokens, expected_bytes);
    }
    return num_tokens;
}

// samples of num_processes*B*T tokens in shard `file_index`; one token more than a sample
// is read (the last target), hence the -1 (a shard of 0 tokens has 0 samples)
static inline size_t dataloader_file_samples_(const DataLoader* loader, int file_index) {
    size_t tokens = loader->file_num_tokens[file_index];
    return tokens == 0 ? 0 : (tokens - 1) / ((size_t)loader->num_processes * loader->B * loader->T);
}

// loads shard `file_index` (an index into glob_result) into memory and checks every token id
static inline void dataloader_load_shard_file_(DataLoader* loader, int file_index) {
    if (loader->loaded_shard == file_index) { return; }
    const char* path = loader->glob_result.gl_pathv[file_index];
    size_t num_tokens = dataloader_read_shard_header_(path);
    if (num_tokens != loader->file_num_tokens[file_index]) {
        llm8_die("token shard '%s' has %zu tokens now, %zu when the run started (changed during the run?)", path,
                 num_tokens, loader->file_num_tokens[file_index]);
    }
    free(loader->shard_tokens);
    loader->shard_tokens = (uint16_t*)mallocCheck(num_tokens * sizeof(uint16_t));
    FILE* fp = fopenCheck(path, "rb");
    fseekCheck(fp, (long)DATA_HEADER_BYTES, SEEK_SET);
    freadCheck(loader->shard_tokens, sizeof(uint16_t), num_tokens, fp);
    fcloseCheck(fp);
    for (size_t i = 0; i < num_tokens; i++) {
        if ((int)loader->shard_tokens[i] >= loader->vocab_size) {
            llm8_die("token shard '%s': token %zu has id %d, not below the vocab size %d",
                     path, i, (int)loader->shard_tokens[i], loader->vocab_size);
        }
    }
    loader->loaded_shard = file_index;
    loader->shard_num_samples = dataloader_file_samples_(loader, file_index);
}

// the shard file at epoch position shard_idx
static inline int dataloader_file_index_(const DataLoader* loader, size_t shard_idx) {
    return loader->should_shuffle ? loader->shard_indices[shard_idx] : (int)shard_idx;
}

// makes the shard at epoch position shard_idx the one in memory
static inline void dataloader_load_shard_(DataLoader* loader, size_t shard_idx) {
    dataloader_load_shard_file_(loader, dataloader_file_index_(loader, shard_idx));
}

// when shuffling, draws the sample order of the shard at the current epoch position
static inline void dataloader_shuffle_samples_(DataLoader* loader) {
    if (!loader->should_shuffle) { return; }
    size_t num_samples = dataloader_file_samples_(loader, dataloader_file_index_(loader, loader->current_shard_idx));
    free(loader->intra_shard_indices);
    loader->num_intra_shard_indices = num_samples;
    loader->intra_shard_indices = (int*)mallocCheck(num_samples * sizeof(int));
    identity_permutation(loader->intra_shard_indices, (int)num_samples);
    random_permutation(loader->intra_shard_indices, (int)num_samples, &loader->shuffle_rng);
}

// moves to the next epoch position, first sample, drawing the orders a shuffled run draws
// there; loads nothing (dataloader_seek_batches walks with it)
static inline void dataloader_step_shard_(DataLoader* loader, int new_epoch) {
    loader->current_shard_idx = new_epoch ? 0 : loader->current_shard_idx + 1;
    loader->current_sample_idx = 0;
    if (new_epoch && loader->should_shuffle) {
        random_permutation(loader->shard_indices, (int)loader->num_shards, &loader->shuffle_rng);
    }
    dataloader_shuffle_samples_(loader);
}

// starts an epoch: first shard, first sample (a new shard and sample order when shuffling)
static inline void dataloader_reset(DataLoader* loader) {
    dataloader_step_shard_(loader, 1);
    dataloader_load_shard_(loader, 0);
}

static inline void dataloader_advance_(DataLoader* loader) {
    dataloader_step_shard_(loader, loader->current_shard_idx == loader->num_shards - 1);
    dataloader_load_shard_(loader, loader->current_shard_idx);
}

static inline void dataloader_init(DataLoader* loader, const char* filename_pattern, size_t B, size_t T,
                                   int process_rank, int num_processes, int should_shuffle, int vocab_size) {
    if (B == 0 || T == 0) { llm8_die("dataloader for '%s': B=%zu and T=%zu must be positive", filename_pattern, B, T); }
    if (num_processes <= 0 || process_rank < 0 || process_rank >= num_processes) {
        llm8_die("dataloader for '%s': process rank %d is not in [0, %d)", filename_pattern, process_rank, num_processes);
    }
    if (vocab_size <= 0 || vocab_size > 65536) {
        llm8_die("dataloader for '%s': vocab size %d is not in 1..65536 (tokens are uint16)", filename_pattern, vocab_size);
    }
    memset(loader, 0, sizeof(*loader));
    loader->process_rank = process_rank;
    loader->num_processes = num_processes;
    loader->B = B;
    loader->T = T;
    loader->vocab_size = vocab_size;
    loader->should_shuffle = should_shuffle ? 1 : 0;
    loader->loaded_shard = -1;

    int glob_status = glob(filename_pattern, 0, NULL, &loader->glob_result);
    if (glob_status != 0 || loader->glob_result.gl_pathc == 0) {
        llm8_die("no token shards match '%s' (check the path; shards are made by dev/data/)", filename_pattern);
    }
    loader->num_shards = loader->glob_result.gl_pathc;

    // check every shard up front, so a bad one fails now rather than hours into a run
    size_t sample_tokens = (size_t)num_processes * B * T + 1;
    loader->file_num_tokens = (size_t*)mallocCheck(loader->num_shards * sizeof(size_t));
    size_t largest = 0;
    for (size_t i = 0; i < loader->num_shards; i++) {
        size_t shard_tokens = dataloader_read_shard_header_(loader->glob_result.gl_pathv[i]);
        loader->file_num_tokens[i] = shard_tokens;
        loader->num_tokens += shard_tokens;
        if (shard_tokens > loader->file_num_tokens[largest]) { largest = i; }
    }
    // a shard shorter than one sample holds none, and the walk passes it by (a split's last
    // shard holds what was left over, often little; llm.c refuses the whole glob for it)
    if (loader->file_num_tokens[largest] < sample_tokens) {
        llm8_die("no token shard matching '%s' holds one batch: the largest, '%s', has %zu tokens, fewer than one batch "
                 "needs (num_processes*B*T+1 = %zu): lower -b or -t", filename_pattern,
                 loader->glob_result.gl_pathv[largest], loader->file_num_tokens[largest], sample_tokens);
    }

    if (loader->should_shuffle) {
        manual_seed(&loader->shuffle_rng, (uint32_t)(DATALOADER_SHUFFLE_SEED + process_rank));
        loader->shard_indices = (int*)mallocCheck(loader->num_shards * sizeof(int));
        identity_permutation(loader->shard_indices, (int)loader->num_shards);
    }
    loader->inputs = (int*)mallocCheck(B * T * sizeof(int));
    loader->targets = (int*)mallocCheck(B * T * sizeof(int));
    dataloader_reset(loader);
}

// batches in one epoch of this rank's windows: every shard's samples, its tail left out
static inline size_t dataloader_epoch_batches(const DataLoader* loader) {
    size_t batches = 0;
    for (size_t i = 0; i < loader->num_shards; i++) { batches += dataloader_file_samples_(loader, (int)i); }
    return batches;
}

// the trainers' note, after init, of the shards too short for a sample (nothing when there are none)
static inline void dataloader_note_short_shards(const DataLoader* loader, const char* flag) {
    size_t short_shards = 0, smallest = 0;
    for (size_t i = 0; i < loader->num_shards; i++) {
        short_shards += dataloader_file_samples_(loader, (int)i) == 0;
        if (loader->file_num_tokens[i] < loader->file_num_tokens[smallest]) { smallest = i; }
    }
    if (short_shards == 0) { return; }
    printf("note: %s: %zu of the %zu token shards hold fewer than one batch's num_processes*B*T+1 = %zu tokens and are "
           "passed over (the smallest: '%s', %zu tokens)\n", flag, short_shards, loader->num_shards,
           (size_t)loader->num_processes * loader->B * loader->T + 1, loader->glob_result.gl_pathv[smallest],
           loader->file_num_tokens[smallest]);
}

/*
-x -1's step count: one epoch of the train split, the steps of grad_accum_steps batches its
shards hold (at least 1: a split shorter than one step trains one, its micro-steps wrapping).
llm.c takes num_tokens / total batch, which counts each shard's tail that no sample covers (the
loader reads whole samples of num_processes*B*T tokens, plus one), so with many shards it ran
into a second epoch; every rank's epoch has the same number of batches.
*/
static inline int dataloader_epoch_steps(const DataLoader* loader, int grad_accum_steps) {
    size_t steps = dataloader_epoch_batches(loader) / (size_t)grad_accum_steps;
    if (steps > (size_t)INT_MAX) {
        llm8_die("flag -x -1: one epoch of the train data is %zu steps, more than %d: give the number of steps with -x",
                 steps, INT_MAX);
    }
    return steps < 1 ? 1 : (int)steps;
}

/*
The batches an evaluation of the val split reads, from -m's `requested` (-1: the whole split,
llm.c's meaning): at most the split's, since past them the loader wraps and would count its
first batches again in the mean (llm.c wraps); a note says when -m is cut so.
*/
static inline int dataloader_eval_batches(const DataLoader* loader, int requested) {
    size_t available = dataloader_epoch_batches(loader);
    if (requested > 0 && (size_t)requested <= available) { return requested; }
    if (requested > 0) {
        printf("note: -m %d: the val split has %zu batches of B x T, so each evaluation reads those %zu, once each\n",
               requested, available, available);
    }
    return available > (size_t)INT_MAX ? INT_MAX : (int)available;
}

// fills inputs and targets with the next batch (targets are inputs shifted by one token); shards
// of no sample are passed over (dataloader_init saw that one has a sample)
static inline void dataloader_next_batch(DataLoader* loader) {
    while (loader->current_sample_idx >= loader->shard_num_samples) { dataloader_advance_(loader); }
    size_t sample = loader->should_shuffle ? (size_t)loader->intra_shard_indices[loader->current_sample_idx]
                                           : loader->current_sample_idx;
    size_t BT = loader->B * loader->T;
    const uint16_t* window = loader->shard_tokens + sample * loader->num_processes * BT + loader->process_rank * BT;
    for (size_t i = 0; i < BT; i++) {
        loader->inputs[i] = (int)window[i];
        loader->targets[i] = (int)window[i + 1];
    }
    loader->current_sample_idx++;
}

// continues at a saved position; when shuffling, dataloader_read_state must come first.
// `source` names the file the position came from, in the error when it fits no batch here
// (llm8's files record their B and T, and another B or T replays the loader instead; llm.c's do not)
#define DATALOADER_RESUME_MISFIT_HINT "another -i, the shards changed, or an llm.c state file, which does not record " \
                                      "B and T, resumed with another -b or -t?"
static inline void dataloader_resume(DataLoader* loader, size_t current_shard_idx, size_t current_sample_idx,
                                     const char* source) {
    if (current_shard_idx >= loader->num_shards) {
        llm8_die("state file '%s': shard index %zu is not below the %zu shards matching the pattern", source,
                 current_shard_idx, loader->num_shards);
    }
    dataloader_load_shard_(loader, current_shard_idx);
    if (current_sample_idx > loader->shard_num_samples) {
        llm8_die("state file '%s': sample index %zu is past the %zu samples of shard '%s' (" DATALOADER_RESUME_MISFIT_HINT ")",
                 source, current_sample_idx, loader->shard_num_samples, loader->glob_result.gl_pathv[loader->loaded_shard]);
    }
    if (loader->should_shuffle && loader->num_intra_shard_indices != loader->shard_num_samples) {
        llm8_die("state file '%s': the shuffle state holds %zu samples but shard '%s' has %zu (" DATALOADER_RESUME_MISFIT_HINT
                 ")", source,
                 loader->num_intra_shard_indices, loader->glob_result.gl_pathv[loader->loaded_shard],
                 loader->shard_num_samples);
    }
    loader->current_shard_idx = current_shard_idx;
    loader->current_sample_idx = current_sample_idx;
}

/*
On a loader fresh from dataloader_init: the position (and, shuffling, the orders and rng) it
would have after `num_batches` calls of dataloader_next_batch, found from the shard sizes
alone; the shard it lands in is loaded. Resuming a checkpoint of another rank count puts
each rank where a run with this loader's ranks, B and T is after that many batches.
*/
static inline void dataloader_seek_batches(DataLoader* loader, size_t num_batches) {
    if (loader->current_shard_idx != 0 || loader->current_sample_idx != 0) {
        llm8_die("dataloader_seek_batches: the loader has read batches already (shard %zu, sample %zu)",
                 loader->current_shard_idx, loader->current_sample_idx);
    }
    size_t left = num_batches;
    for (;;) {
        size_t shard_samples = dataloader_file_samples_(loader, dataloader_file_index_(loader, loader->current_shard_idx));
        if (left <= shard_samples - loader->current_sample_idx) { break; }
        left -= shard_samples - loader->current_sample_idx;
        dataloader_step_shard_(loader, loader->current_shard_idx == loader->num_shards - 1);
    }
    loader->current_sample_idx += left;
    dataloader_load_shard_(loader, loader->current_shard_idx);
}

// ----------------------------------------------------------------------------
// shuffle state, as llm.c's state file trailer: size_t num shards, int shard_indices[],
// size_t shard_num_samples, int intra_shard_indices[], then llm.c's mt19937 struct.
// Nothing is written or read when not shuffling (llm.c's files have no trailer then).

typedef struct {
    uint64_t seed;        // unused by the generator; written as 0
    int32_t left;         // draws before the next twist, plus one
    uint32_t next;        // index of the next state word
    uint32_t state[MT19937_N];
    uint32_t matrix_a[2]; // {0, 0x9908b0df}
} LlmcRngLayout;

static inline void dataloader_write_state(const DataLoader* loader, FILE* fp) {
    if (!loader->should_shuffle) { return; }
    uint64_t num_shards = loader->num_shards;
    uint64_t num_samples = loader->num_intra_shard_indices;
    fwriteCheck(&num_shards, sizeof(num_shards), 1, fp);
    fwriteCheck(loader->shard_indices, sizeof(int), loader->num_shards, fp);
    fwriteCheck(&num_samples, sizeof(num_samples), 1, fp);
    fwriteCheck(loader->intra_shard_indices, sizeof(int), loader->num_intra_shard_indices, fp);
    LlmcRngLayout rng;
    memset(&rng, 0, sizeof(rng));
    memcpy(rng.state, loader->shuffle_rng.state, sizeof(rng.state));
    // llm.c twists when --left reaches 0; our generator twists when index reaches N
    rng.next = loader->shuffle_rng.index;
    rng.left = (int32_t)(MT19937_N + 1 - loader->shuffle_rng.index);
    rng.matrix_a[1] = 0x9908b0dfu;
    fwriteCheck(&rng, sizeof(rng), 1, fp);
}

// reads `count` ints of a permutation of [0, count) at the file position; `source` names the file
static inline void dataloader_read_permutation_(int* out, size_t count, FILE* fp, long* bytes_left,
                                                const char* source, const char* what) {
    if (*bytes_left < (long)(count * sizeof(int))) {
        llm8_die("state file '%s': truncated in the shuffle trailer (%s)", source, what);
    }
    freadCheck(out, sizeof(int), count, fp);
    *bytes_left -= (long)(count * sizeof(int));
    // each index exactly once: a repeated one would read some samples twice and skip others
    unsigned char* seen = (unsigned char*)mallocCheck(count);
    if (count > 0) { memset(seen, 0, count); }
    for (size_t i = 0; i < count; i++) {
        if (out[i] < 0 || (size_t)out[i] >= count) {
            llm8_die("state file '%s': %s entry %zu is %d, not in [0, %zu)", source, what, i, out[i], count);
        }
        if (seen[out[i]]) {
            llm8_die("state file '%s': %s entry %zu repeats %d (expected a permutation of [0, %zu))", source, what, i,
                     out[i], count);
        }
        seen[out[i]] = 1;
    }
    free(seen);
}

static inline uint64_t dataloader_read_count_(FILE* fp, long* bytes_left, const char* source, const char* what) {
    uint64_t value;
    if (*bytes_left < (long)sizeof(value)) {
        llm8_die("state file '%s': truncated in the shuffle trailer (%s)", source, what);
    }
    freadCheck(&value, sizeof(value), 1, fp);
    *bytes_left -= (long)sizeof(value);
    return value;
}

// reads the trailer written by dataloader_write_state; `source` names the file in errors
static inline void dataloader_read_state(DataLoader* loader, FILE* fp, const char* source) {
    if (!loader->should_shuffle) { return; }
    long here = ftell(fp);
    fseekCheck(fp, 0, SEEK_END);
    long bytes_left = ftell(fp) - here;
    fseekCheck(fp, here, SEEK_SET);

    uint64_t num_shards = dataloader_read_count_(fp, &bytes_left, source, "shard count");
    if (num_shards != loader->num_shards) {
        llm8_die("state file '%s': the run had %llu shards, the pattern now matches %zu",
                 source, (unsigned long long)num_shards, loader->num_shards);
    }
    dataloader_read_permutation_(loader->shard_indices, loader->num_shards, fp, &bytes_left, source, "shard order");
    uint64_t num_samples = dataloader_read_count_(fp, &bytes_left, source, "sample count");
    if (num_samples > (uint64_t)bytes_left / sizeof(int)) {
        llm8_die("state file '%s': the shuffle trailer claims %llu samples, more than the file holds",
                 source, (unsigned long long)num_samples);
    }
    free(loader->intra_shard_indices);
    loader->num_intra_shard_indices = (size_t)num_samples;
    loader->intra_shard_indices = (int*)mallocCheck(loader->num_intra_shard_indices * sizeof(int));
    dataloader_read_permutation_(loader->intra_shard_indices, loader->num_intra_shard_indices, fp, &bytes_left,
                                 source, "sample order");
    LlmcRngLayout rng;
    if (bytes_left < (long)sizeof(rng)) {
        llm8_die("state file '%s': truncated in the shuffle trailer (rng state)", source);
    }
    freadCheck(&rng, sizeof(rng), 1, fp);
    if (rng.matrix_a[0] != 0 || rng.matrix_a[1] != 0x9908b0dfu || rng.next > MT19937_N) {
        llm8_die("state file '%s': the shuffle rng state is corrupt", source);
    }
    memcpy(loader->shuffle_rng.state, rng.state, sizeof(rng.state));
    loader->shuffle_rng.index = (rng.left <= 1) ? MT19937_N : rng.next;
}

// moves past a trailer dataloader_write_state wrote, whatever run wrote it (its counts are
// checked against the file's length only): for a reader that takes no position from it
static inline void dataloader_skip_state(FILE* fp, const char* source) {
    long here = ftell(fp);
    fseekCheck(fp, 0, SEEK_END);
    long bytes_left = ftell(fp) - here;
    fseekCheck(fp, here, SEEK_SET);
    const char* what[2] = {"shard order", "sample order"};
    for (int i = 0; i < 2; i++) {
        uint64_t count = dataloader_read_count_(fp, &bytes_left, source, what[i]);
        if (count > (uint64_t)bytes_left / sizeof(int)) {
            llm8_die("state file '%s': truncated in the shuffle trailer (%s)", source, what[i]);
        }
        fseekCheck(fp, (long)(count * sizeof(int)), SEEK_CUR);
        bytes_left -= (long)(count * sizeof(int));
    }
    if (bytes_left < (long)sizeof(LlmcRngLayout)) {
        llm8_die("state file '%s': truncated in the shuffle trailer (rng state)", source);
    }
    fseekCheck(fp, (long)sizeof(LlmcRngLayout), SEEK_CUR);
}

static inline void dataloader_free(DataLoader* loader) {
    globfree(&loader->glob_result);
    free(loader->file_num_tokens);
    free(loader->shard_tokens);
    free(loader->shard_indices);
    free(loader->intra_shard_indices);
    free(loader->inputs);
    free(loader->targets);
    memset(loader, 0, sizeof(*loader));
}

/*
-a 1's batch, which every micro-step of the run trains on: the run's first (what a fresh loader
reads first), into loader's inputs and targets, from a loader of its own, so loader's position
stays where it is (at its start, or where a resume put it). pattern: the one loader came from.
*/
static inline void dataloader_fill_first_batch(DataLoader* loader, const char* pattern) {
    DataLoader fresh;
    dataloader_init(&fresh, pattern, loader->B, loader->T, loader->process_rank, loader->num_processes,
                    loader->should_shuffle, loader->vocab_size);
    dataloader_next_batch(&fresh);
    memcpy(loader->inputs, fresh.inputs, loader->B * loader->T * sizeof(int));
    memcpy(loader->targets, fresh.targets, loader->B * loader->T * sizeof(int));
    dataloader_free(&fresh);
}

#endif // LLMC_DATALOADER_H
