/*
state_reshard.h: resuming a checkpoint written with N ranks on M ranks (doc/multi-gpu.md).

Why it is shaped so:
- Rank q of N wrote the optimizer state of its ZeRO window ([q S, (q + 1) S) of the flat
  parameters, zero.h) to state_<step>_<q>.bin. Every array of that state is a contiguous
  range of the one-rank array: the fp32 m, v and master are flat parameters; adamw8's codes,
  absmaxes and m32/v32 are adamw8_layout_window's slices of the whole model's arrays, and
  consecutive windows' slices tile them (shard boundaries are multiples of 256, and 8-bit
  blocks lie on a 256 grid from each tensor's start). So rank r of M's state is an exact
  assembly of byte ranges of the old files, bit for bit what an M-rank run holds, and only
  the overlapping pieces are read (state_file_index says where they lie).
- Conversions (an fp32 file into an adamw8 run, or the reverse) work block by block inside
  a window, so they run on the assembled window exactly as train_state_read runs them on one
  file; a file of another -qs is refused naming the flag, as there.
- The files must form one checkpoint: rank 0's header gives N; every file must exist and agree
  with rank 0's on step, N, version, master weights, shuffling, optimizer and sections, or the
  error names the file.
- The caller's extra sections (the FP8 scaling state) are per rank: the weights' histories are
  the same on every rank (their amax is all-reduced), the activations' and gradients' come
  from each rank's own micro-batches. Rank r takes old rank r % N's: histories of the same
  data distribution, the same weights'.
- The data loader: N ranks' positions and shuffle permutations are in samples of N*B*T tokens,
  which map to nothing on M ranks. The loader is replayed (dataloader_seek_batches) to where
  an M-rank run is after `step` steps, so the run goes on with the data an uninterrupted M-rank
  run would read.
- llm.c's files of N > 1 ranks (header [9] 0: checkpoint.h) cut the state otherwise: under
  its ZeRO-1 rank q holds the q-th 1/N of every layer's slice of every tensor, in tensor order
  then layer order (llm.c's gpt2_update: a tensor's state starts at its flat offset / N, a
  layer's part at layer x slice / N after it), and under its -z 0 every rank holds all of it
  (told apart by the files' size). Each file is then a list of pieces of the flat arrays
  (reshard_pieces_), read the same way, for any M, N == M included. llm.c keeps fp32 m and v
  only, and no llm8 sections.
- With llm8's files and N == M nothing here runs: train_state_read reads the rank's own file.
Host C that also compiles as C++.
*/
#ifndef LLMC_STATE_RESHARD_H
#define LLMC_STATE_RESHARD_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "utils.h"
#include "gpt2_config.h"
#include "dataloader.h"
#include "checkpoint.h"
#include "quant8.h"
#include "zero.h"
#include "train_state.h"

// the number of ranks that wrote checkpoint `step` in dir, as its rank 0 state file's header
// says; *llmc_cut: several ranks' files cut as llm.c's (header [9] 0)
static inline int checkpoint_state_num_ranks(const char* dir, int step, int* llmc_cut) {
    char path[CHECKPOINT_PATH_MAX];
    checkpoint_state_path(path, sizeof(path), dir, step, 0);
    if (access(path, F_OK) != 0) {
        llm8_die("checkpoint %d in '%s' has no state file of rank 0 ('%s' is missing)", step, dir, path);
    }
    StateFileIndex header;
    state_file_read_header(path, &header);
    if (header.num_processes < 1 || header.num_processes > ZERO_MAX_RANKS || header.process_rank != 0) {
        llm8_die("state file '%s' says rank %d of %d processes, expected rank 0 of 1..%d", path, header.process_rank,
                 header.num_processes, ZERO_MAX_RANKS);
    }
    *llmc_cut = header.num_processes > 1 && !header.llm8_windows;
    return header.num_processes;
}

// how the old ranks cut the flat arrays (m, v, master)
typedef enum {
    RESHARD_LLM8_WINDOWS,   // rank q: [q S, (q + 1) S) (zero.h)
    RESHARD_LLMC_ZERO1,     // llm.c -z 1: the q-th 1/N of every tensor's layer slice
    RESHARD_LLMC_WHOLE,     // llm.c -z 0: every rank all of it
} ReshardCut;

// one old rank's file: where it is, what it holds
typedef struct {
    char path[CHECKPOINT_PATH_MAX];
    ZeroRange range;        // its flat parameters (llm8's windows)
    Adamw8Layout window;    // its optimizer states' window
    StateFileIndex index;
} ReshardSource;

// a run of flat elements [begin, end) an old file holds from element file_element of each flat array
typedef struct {
    size_t begin, end;
    size_t file_element;
} ReshardPiece;

// the pieces old rank q of N holds (at most reshard_max_pieces_); returns the count
static inline int reshard_max_pieces_(const ZeroLayout* zero) { return NUM_PARAMETER_TENSORS * zero->num_layers; }
static inline int reshard_pieces_(ReshardCut cut, const ZeroLayout* zero, ZeroRange range, int q, int num_ranks,
                                  ReshardPiece* pieces) {
    if (cut == RESHARD_LLM8_WINDOWS) {
        ReshardPiece window = {range.begin, range.end, 0};
        pieces[0] = window;
        return 1;
    }
    if (cut == RESHARD_LLMC_WHOLE) {
        if (q > 0) { return 0; }  // the same as rank 0's
        ReshardPiece whole = {0, zero->num_parameters, 0};
        pieces[0] = whole;
        return 1;
    }
    int count = 0;
    for (int tensor = 0; tensor < NUM_PARAMETER_TENSORS; tensor++) {
        int per_layer = zero_tensor_is_per_layer(tensor);
        for (int layer = 0; layer < (per_layer ? zero->num_layers : 1); layer++) {
            ZeroRange slice = zero_slice_range(zero, tensor, per_layer ? layer : -1);
            size_t part = (slice.end - slice.begin) / (size_t)num_ranks;
            ReshardPiece piece = {slice.begin + (size_t)q * part, slice.begin + (size_t)(q + 1) * part,
                                  zero->tensor_offsets[tensor] / (size_t)num_ranks + (size_t)layer * part};
            pieces[count++] = piece;
        }
    }
    return count;
}

/*
How llm.c's N > 1 ranks cut a checkpoint: -z 1 files hold num_parameters / N floats per array,
-z 0 files all of them (rank 0's file's size says which: a -z 0 body is at least its m, v and
master, which a -z 1 body reaches only with a shuffle trailer of 4 bytes a parameter or more, in
toy models). -z 1 needs every tensor's layer slice to divide by N (llm.c stops otherwise), so a
file that does not is -z 0's.
*/
static inline ReshardCut reshard_llmc_cut_(const char* path, const StateFileIndex* header, const ZeroLayout* zero) {
    size_t n = (size_t)header->num_processes;
    for (int tensor = 0; tensor < NUM_PARAMETER_TENSORS; tensor++) {
        size_t slice = zero->tensor_sizes[tensor] / (zero_tensor_is_per_layer(tensor) ? (size_t)zero->num_layers : 1);
        if (slice % n != 0) { return RESHARD_LLMC_WHOLE; }
    }
    FILE* fp = fopenCheck(path, "rb");
    long body = file_size_bytes(fp) - (long)CHECKPOINT_HEADER_BYTES;
    fcloseCheck(fp);
    long whole_arrays = (long)((2 + (size_t)header->has_master) * zero->num_parameters * sizeof(float));
    return body >= whole_arrays ? RESHARD_LLMC_WHOLE : RESHARD_LLMC_ZERO1;
}

static inline void reshard_check_agrees_(const ReshardSource* source, const ReshardSource* rank0, const char* what,
                                         int value, int rank0_value) {
    if (value != rank0_value) {
        llm8_die("state file '%s' has %s %d, rank 0's '%s' has %d: files of different checkpoints?", source->path, what,
                 value, rank0->path, rank0_value);
    }
}

/*
The 8-bit states of an indexed file: its tensor selection must be -qs's (the flag is named:
another -qs changes every section's size), then its window as `model` cuts it.
*/
static inline void reshard_eight_bit_window_(ReshardSource* s, const GPT2Config* cfg, Adamw8Selection selection,
                                             const Adamw8Layout* model) {
    const StateSectionPlace* place = state_file_find_section(&s->index, "adamw8.bits");
    int32_t bits[NUM_PARAMETER_TENSORS];
    if (place == NULL || place->bytes != sizeof(bits)) {
        llm8_die("state file '%s' has 8-bit AdamW states but no %zu-byte adamw8.bits section", s->path, sizeof(bits));
    }
    FILE* fp = fopenCheck(s->path, "rb");
    fseekCheck(fp, place->offset, SEEK_SET);
    freadCheck(bits, sizeof(bits), 1, fp);
    fcloseCheck(fp);
    state_file_check_adamw8_selection(s->path, bits, cfg, selection);
    adamw8_layout_window(&s->window, model, s->range.begin, s->range.end);
    adamw8_check_bits(&s->window, bits, s->path);
}

/*
The N files of checkpoint `step`, each checked against rank 0's and indexed, and how they cut
the flat arrays (*cut); in files with 8-bit states, each rank's window as N ranks cut it under
-qs `selection`. Free with free().
*/
static inline ReshardSource* reshard_sources_open_(const char* dir, int step, int num_ranks, const GPT2Config* cfg,
                                                   Adamw8Selection selection, ReshardCut* cut) {
    ZeroLayout zero;
    zero_layout_init(&zero, cfg, num_ranks);
    Adamw8Layout model;
    adamw8_layout_init(&model, cfg, selection);
    ReshardSource* sources = (ReshardSource*)mallocCheck((size_t)num_ranks * sizeof(ReshardSource));
    *cut = RESHARD_LLM8_WINDOWS;
    for (int q = 0; q < num_ranks; q++) {
        ReshardSource* s = &sources[q];
        checkpoint_state_path(s->path, sizeof(s->path), dir, step, q);
        if (access(s->path, F_OK) != 0) {
            llm8_die("checkpoint %d in '%s' was written by %d ranks (rank 0's state file says so), but the state file "
                     "of rank %d, '%s', is missing", step, dir, num_ranks, q, s->path);
        }
        s->range = zero_rank_range(&zero, q);
        StateFileIndex header;
        state_file_read_header(s->path, &header);
        if (header.num_processes != num_ranks || header.process_rank != q || header.step != step) {
            llm8_die("state file '%s' is rank %d of %d at step %d; checkpoint %d in '%s' needs rank %d of %d (rank 0's "
                     "file says %d ranks) at step %d", s->path, header.process_rank, header.num_processes, header.step,
                     step, dir, q, num_ranks, num_ranks, step);
        }
        if (q == 0 && num_ranks > 1 && !header.llm8_windows) { *cut = reshard_llmc_cut_(s->path, &header, &zero); }
        if (q > 0 && header.llm8_windows != sources[0].index.llm8_windows) {
            llm8_die("state file '%s' was written by %s, rank 0's '%s' by %s (header slots 7 to 9, version): files of "
                     "different checkpoints?", s->path, header.llm8_windows ? "llm8" : "llm.c", sources[0].path,
                     header.llm8_windows ? "llm.c" : "llm8");
        }
        size_t held = *cut == RESHARD_LLM8_WINDOWS ? s->range.end - s->range.begin
                    : *cut == RESHARD_LLMC_WHOLE ? zero.num_parameters : zero.num_parameters / (size_t)num_ranks;
        state_file_index(s->path, held, &s->index);
        const StateFileIndex* a = &s->index;
        const StateFileIndex* b = &sources[0].index;
        reshard_check_agrees_(s, &sources[0], "version", a->version, b->version);
        // an llm8 rank that owns only padding keeps no master; llm.c's ranks all hold n / N (or all) of the parameters
        if (*cut != RESHARD_LLM8_WINDOWS || s->range.end > s->range.begin) {
            reshard_check_agrees_(s, &sources[0], "use_master_weights", a->has_master, b->has_master);
        }
        reshard_check_agrees_(s, &sources[0], "shuffling", a->should_shuffle, b->should_shuffle);
        reshard_check_agrees_(s, &sources[0], "fp32 moments", a->fp32_moments, b->fp32_moments);
        reshard_check_agrees_(s, &sources[0], "section count", a->num_sections, b->num_sections);
        memset(&s->window, 0, sizeof(s->window));
        if (!a->fp32_moments) { reshard_eight_bit_window_(s, cfg, selection, &model); }
    }
    return sources;
}

// each file's sections must be the caller's extra ones (same sizes; an optional one may be missing) plus, with
// 8-bit states, adamw8's for its window
static inline void reshard_check_sections_(const ReshardSource* s, const StateSection* extra, int num_extra) {
    const StateFileIndex* index = &s->index;
    StateSection expected[TRAIN_STATE_MAX_EXTRA_SECTIONS + ADAMW8_NUM_SECTIONS];
    int num_expected = train_state_copy_extra_sections(expected, extra, num_extra, "train_state_read_resharded");
    Adamw8States no_states;
    memset(&no_states, 0, sizeof(no_states));
    int32_t unused_bits[NUM_PARAMETER_TENSORS];
    if (!index->fp32_moments) { num_expected += adamw8_state_sections(expected + num_extra, &s->window, &no_states, unused_bits); }
    int found[STATE_FILE_MAX_SECTIONS] = {0};
    for (int i = 0; i < index->num_sections; i++) {
        int j = state_sections_find_(expected, num_expected, index->sections[i].tag, s->path);
        if (found[j]) { llm8_die("state file '%s' has section '%s' twice", s->path, index->sections[i].tag); }
        found[j] = 1;
    }
    state_file_check_required_(s->path, expected, num_expected, found);
    for (int i = 0; i < num_expected; i++) {
        const StateSectionPlace* place = state_file_find_section(index, expected[i].tag);
        if (place == NULL) { continue; }  // optional, and not in this file
        state_section_check_size_(s->path, expected[i].tag, place->bytes, expected[i].bytes);
    }
}

// one array of a window's state, as a byte range of the whole model's array
typedef struct {
    const char* tag;   // "m", "v", "master" (the body's), or adamw8's section tag
    void* data;        // the window's buffer (NULL: only where it lies)
    size_t origin;     // first byte in the whole model's array
    size_t bytes;
} ReshardArray;

/*
The arrays of the state of flat range `range` (window: its layout): fp32 m and v (fp32), or
adamw8's sections but the bits (whose slices of the model's they are: adamw8_state_section_origins),
then the master (with_master). Returns the count.
*/
static inline int reshard_arrays_(ReshardArray arrays[ADAMW8_NUM_SECTIONS + 1], int fp32, int with_master, ZeroRange range,
                                  const Adamw8Layout* window, Adamw8States* states, float* m, float* v, float* master) {
    size_t flat_origin = range.begin * sizeof(float), flat_bytes = (range.end - range.begin) * sizeof(float);
    int count = 0;
    if (fp32) {
        ReshardArray moments[2] = {{"m", m, flat_origin, flat_bytes}, {"v", v, flat_origin, flat_bytes}};
        memcpy(arrays, moments, sizeof(moments));
        count = 2;
    } else {
        StateSection sections[ADAMW8_NUM_SECTIONS];
        size_t origins[ADAMW8_NUM_SECTIONS];
        int32_t bits[NUM_PARAMETER_TENSORS];
        adamw8_state_sections(sections, window, states, bits);
        adamw8_state_section_origins(window, origins);
        for (int i = 1; i < ADAMW8_NUM_SECTIONS; i++, count++) {  // [0] is the bits: no slice
            ReshardArray array = {sections[i].tag, sections[i].data, origins[i], sections[i].bytes};
            arrays[count] = array;
        }
    }
    if (with_master) {
        ReshardArray array = {"master", master, flat_origin, flat_bytes};
        arrays[count++] = array;
    }
    return count;
}

// the arrays of flat parameters (the body's), against adamw8's sections
static inline int reshard_array_is_flat_(const char* tag) {
    return strcmp(tag, "m") == 0 || strcmp(tag, "v") == 0 || strcmp(tag, "master") == 0;
}

// where array `tag` of an indexed file lies (reshard_check_sections_ made sure the sections exist)
static inline long reshard_array_offset_(const StateFileIndex* index, const char* tag) {
    if (strcmp(tag, "m") == 0) { return index->m_offset; }
    if (strcmp(tag, "v") == 0) { return index->v_offset; }
    if (strcmp(tag, "master") == 0) { return index->master_offset; }
    return state_file_find_section(index, tag)->offset;
}

// reads into `want` the part of it that `have`, at `offset` in fp, holds; returns the bytes read
static inline size_t reshard_read_overlap_(FILE* fp, long offset, const ReshardArray* have, const ReshardArray* want) {
    size_t begin = have->origin > want->origin ? have->origin : want->origin;
    size_t have_end = have->origin + have->bytes, want_end = want->origin + want->bytes;
    size_t end = have_end < want_end ? have_end : want_end;
    if (begin >= end) { return 0; }
    fseekCheck(fp, offset + (long)(begin - have->origin), SEEK_SET);
    freadCheck((char*)want->data + (begin - want->origin), 1, end - begin, fp);
    return end - begin;
}

/*
Resumes rank loader->process_rank of loader->num_processes (M) from checkpoint `step` in dir,
written by file_ranks ranks (N != M, or N cut as llm.c cuts them): the rank's window of the optimizer state and master,
assembled from the old files and left in the form this run keeps (train_state_read's m, v,
states8, master; fp32 <-> 8-bit converted when the optimizers differ), the extra sections from
old rank r % N's file (its path goes to extra_path), and the loader replayed by step *
batches_per_step batches. Prints one line saying so. Returns the step.
*/
static inline int train_state_read_resharded(const char* dir, int step, int file_ranks, size_t batches_per_step,
                                             DataLoader* loader, const GPT2Config* cfg, int use_adamw8,
                                             Adamw8Selection selection, float* m, float* v, Adamw8States* states8,
                                             float* master, const StateSection* extra, int num_extra,
                                             char extra_path[CHECKPOINT_PATH_MAX]) {
    int rank = loader->process_rank;
    ZeroLayout zero;
    zero_layout_init(&zero, cfg, loader->num_processes);
    ZeroRange range = zero_rank_range(&zero, rank);
    ReshardCut cut;
    ReshardSource* sources = reshard_sources_open_(dir, step, file_ranks, cfg, selection, &cut);
    const StateFileIndex* index0 = &sources[0].index;
    Adamw8Layout layout;  // this rank's window
    train_state_window_(&layout, cfg, selection, use_adamw8, index0->fp32_moments, range.begin, range.end);
    if (range.end > range.begin) { state_file_check_master(sources[0].path, index0->has_master, master != NULL); }
    if (index0->should_shuffle != loader->should_shuffle) {
        llm8_die("state file '%s' was written with shuffling=%d, this run has %d", sources[0].path,
                 index0->should_shuffle, loader->should_shuffle);
    }
    for (int q = 0; q < file_ranks; q++) { reshard_check_sections_(&sources[q], extra, num_extra); }

    // the window's arrays, each assembled from the overlapping parts of the old windows' same arrays
    TrainStateFileForm form = train_state_file_form_init_(index0->fp32_moments, &layout, use_adamw8, m, v, states8);
    ReshardArray wanted[ADAMW8_NUM_SECTIONS + 1];
    int num_arrays = reshard_arrays_(wanted, form.fp32, master != NULL, range, &layout, &form.states, form.m, form.v, master);
    size_t bytes_read[ADAMW8_NUM_SECTIONS + 1] = {0};
    int files_read = 0;
    ZeroLayout old_zero;
    zero_layout_init(&old_zero, cfg, file_ranks);
    ReshardPiece* pieces = (ReshardPiece*)mallocCheck((size_t)reshard_max_pieces_(&old_zero) * sizeof(ReshardPiece));
    for (int q = 0; q < file_ranks; q++) {
        const ReshardSource* s = &sources[q];
        int num_pieces = reshard_pieces_(cut, &old_zero, s->range, q, file_ranks, pieces);
        int overlaps = 0;
        for (int p = 0; p < num_pieces; p++) { overlaps |= pieces[p].end > range.begin && pieces[p].begin < range.end; }
        if (!overlaps) { continue; }
        files_read++;
        ReshardArray held[ADAMW8_NUM_SECTIONS + 1];
        Adamw8States no_states;
        memset(&no_states, 0, sizeof(no_states));
        reshard_arrays_(held, form.fp32, master != NULL, s->range, &s->window, &no_states, NULL, NULL, NULL);
        FILE* fp = fopenCheck(s->path, "rb");
        for (int i = 0; i < num_arrays; i++) {
            long offset = reshard_array_offset_(&s->index, held[i].tag);
            if (!reshard_array_is_flat_(held[i].tag)) {  // adamw8's, in llm8's windows only
                bytes_read[i] += reshard_read_overlap_(fp, offset, &held[i], &wanted[i]);
                continue;
            }
            for (int p = 0; p < num_pieces; p++) {
                ReshardArray piece = {held[i].tag, NULL, pieces[p].begin * sizeof(float),
                                      (pieces[p].end - pieces[p].begin) * sizeof(float)};
                bytes_read[i] += reshard_read_overlap_(fp, offset + (long)(pieces[p].file_element * sizeof(float)), &piece,
                                                       &wanted[i]);
            }
        }
        fcloseCheck(fp);
    }
    free(pieces);
    for (int i = 0; i < num_arrays; i++) {
        if (bytes_read[i] != wanted[i].bytes) {
            llm8_die("checkpoint %d in '%s': the %d state files hold %zu of the %zu bytes of '%s' rank %d of %d needs",
                     step, dir, file_ranks, bytes_read[i], wanted[i].bytes, wanted[i].tag, rank, loader->num_processes);
        }
    }

    // the per-rank state: old rank r % N's
    const ReshardSource* own = &sources[rank % file_ranks];
    FILE* fp = fopenCheck(own->path, "rb");
    char extra_tags[STATE_FILE_MAX_SECTIONS * (STATE_SECTION_TAG_BYTES + 2)] = "";  // the ones read, for the line below
    for (int i = 0; i < num_extra; i++) {
        const StateSectionPlace* place = state_file_find_section(&own->index, extra[i].tag);
        if (place == NULL) { continue; }  // optional, and not in this file: left as the caller set it
        fseekCheck(fp, place->offset, SEEK_SET);
        freadCheck(extra[i].data, 1, extra[i].bytes, fp);
        snprintf(extra_tags + strlen(extra_tags), sizeof(extra_tags) - strlen(extra_tags), "%s%s",
                 extra_tags[0] != '\0' ? ", " : "", extra[i].tag);
    }
    fcloseCheck(fp);
    snprintf(extra_path, CHECKPOINT_PATH_MAX, "%s", own->path);

    size_t batches = (size_t)step * batches_per_step;
    dataloader_seek_batches(loader, batches);
    const char* cut_names[] = {"", " (llm.c's -z 1 cut)", " (llm.c's -z 0: each holds all)"};
    printf("%s: rank %d of %d resumed a checkpoint of %d rank%s%s: optimizer state and master assembled from %d of its "
           "state files, per-rank sections (%s) from rank %d's; data loader replayed %zu batches to shard %zu sample %zu, "
           "where a %d-rank run is at step %d\n", sources[0].path, rank, loader->num_processes, file_ranks,
           file_ranks == 1 ? "" : "s", cut_names[cut], files_read, extra_tags[0] != '\0' ? extra_tags : "none",
           rank % file_ranks, batches, loader->current_shard_idx, loader->current_sample_idx, loader->num_processes, step);
    char source[CHECKPOINT_PATH_MAX + 64];
    snprintf(source, sizeof(source), "checkpoint %d in '%s' (its state files)", step, dir);
    train_state_check_values_(&form, &layout, master, source);
    train_state_file_form_finish_(&form, sources[0].path, &layout, selection, use_adamw8, m, v, states8);
    free(sources);
    return step;
}

/*
Resumes rank loader->process_rank of loader->num_processes from checkpoint `step` in dir, in
train_state_read's form (its m, v, states8, master and extra sections). With the rank count
that wrote it: the rank's own file, bitwise as written; with another: resharded
(train_state_read_resharded). extra_path receives the file the extra sections came from.
batches_per_step: the loader's batches per optimizer step (gradient accumulation).
*/
static inline int train_state_read_checkpoint(const char* dir, int step, size_t batches_per_step, DataLoader* loader,
                                              const GPT2Config* cfg, int use_adamw8, Adamw8Selection selection,
                                              float* m, float* v, Adamw8States* states8, float* master,
                                              const StateSection* extra, int num_extra,
                                              char extra_path[CHECKPOINT_PATH_MAX]) {
    int llmc_cut;
    int file_ranks = checkpoint_state_num_ranks(dir, step, &llmc_cut);
    if (file_ranks != loader->num_processes || llmc_cut) {
        return train_state_read_resharded(dir, step, file_ranks, batches_per_step, loader, cfg, use_adamw8, selection,
                                          m, v, states8, master, extra, num_extra, extra_path);
    }
    ZeroLayout zero;
    zero_layout_init(&zero, cfg, loader->num_processes);
    ZeroRange range = zero_rank_range(&zero, loader->process_rank);
    checkpoint_state_path(extra_path, CHECKPOINT_PATH_MAX, dir, step, loader->process_rank);
    return train_state_read(extra_path, step, batches_per_step, loader, cfg, use_adamw8, selection, range.begin, range.end, m,
                            v, states8, master, extra, num_extra);
}

#endif // LLMC_STATE_RESHARD_H
