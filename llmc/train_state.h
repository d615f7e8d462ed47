/*
train_state.h: writing a run's optimizer state, and resuming it whichever optimizer wrote it.

Why: a checkpoint written with fp32 AdamW must resume under 8-bit AdamW and the reverse
(DESIGN.md section 4), and both trainers must do it the same way. checkpoint.h knows the
file layout, quant8.h the 8-bit states and their conversions; this module puts the two
together: train_state_write lays a window's optimizer state out as both trainers write it
(so the tests write files exactly as the trainers do), and train_state_read reads a state
file into the form this run keeps, converting when the file's optimizer differs, and names
the -qs flag when the 8-bit tensor selection does not match. state_reshard.h does the same
across the files of a checkpoint written with another number of ranks.
*/
#ifndef LLMC_TRAIN_STATE_H
#define LLMC_TRAIN_STATE_H

#include <math.h>
#include <stdio.h>
#include <string.h>
#include "utils.h"
#include "gpt2_config.h"
#include "dataloader.h"
#include "checkpoint.h"
#include "quant8.h"

// -qs's values, in Adamw8Selection's order
#define ADAMW8_NUM_SELECTIONS 3
static const char* const ADAMW8_SELECTION_NAMES[ADAMW8_NUM_SELECTIONS] = {"default", "all", "none"};
#define TRAIN_STATE_MAX_EXTRA_SECTIONS 8

// A run's section list starts with the caller's extra sections (adamw8's follow them);
// `who` names the caller in the error. num_extra = 0 may come with extra = NULL.
static inline int train_state_copy_extra_sections(StateSection* sections, const StateSection* extra, int num_extra,
                                                  const char* who) {
    if (num_extra < 0 || num_extra > TRAIN_STATE_MAX_EXTRA_SECTIONS) {
        llm8_die("%s: %d extra sections, expected 0..%d", who, num_extra, TRAIN_STATE_MAX_EXTRA_SECTIONS);
    }
    if (num_extra > 0) { memcpy(sections, extra, (size_t)num_extra * sizeof(StateSection)); }
    return num_extra;
}

/*
The per-tensor state widths (the adamw8.bits section) of a state file with 8-bit states, found
before the state is read: state_file_read stops at the first section whose size differs, which
another -qs always causes, so this is how the error can name the flag. Walks the file as
checkpoint.h writes it, past the shuffle trailer (skipped, not read: the loader is state_file_read's
to set, which leaves it fresh when the file's B or T differ, for a replay). Returns 0 when the
file is not laid out as this run expects (ranks, shuffling, master weights, truncation), leaving
the precise error to state_file_read.
*/
static inline int state_file_find_adamw8_bits(const char* path, const DataLoader* loader, const Adamw8Layout* layout,
                                              int has_master, int32_t bits[NUM_PARAMETER_TENSORS]) {
    StateSection sections[ADAMW8_NUM_SECTIONS];  // only for the bits section's tag and size
    Adamw8States no_states;
    int32_t unused_bits[NUM_PARAMETER_TENSORS];
    memset(&no_states, 0, sizeof(no_states));
    adamw8_state_sections(sections, layout, &no_states, unused_bits);
    const StateSection* wanted = &sections[0];

    int32_t header[CHECKPOINT_HEADER_INTS];
    long file_bytes;
    FILE* fp = checkpoint_open_read_(path, "state", STATE_FILE_MAGIC, header, &file_bytes);
    long body_bytes = (long)(CHECKPOINT_HEADER_BYTES + (header[4] ? layout->num_parameters * sizeof(float) : 0));
    int found = 0;
    if (header[1] == STATE_VERSION_SECTIONS && header[STATE_SLOT_MOMENTS_IN_SECTIONS] == 1 &&
        header[2] == loader->num_processes && header[3] == loader->process_rank && header[4] == has_master &&
        header[5] == loader->should_shuffle && file_bytes >= body_bytes) {
        fseekCheck(fp, body_bytes, SEEK_SET);
        if (loader->should_shuffle) { dataloader_skip_state(fp, path); }
        for (int i = 0; i < header[STATE_SLOT_NUM_SECTIONS] && !found; i++) {
            char tag[STATE_SECTION_TAG_BYTES];
            uint64_t bytes;
            if (file_bytes - ftell(fp) < (long)(sizeof(tag) + sizeof(bytes))) { break; }
            freadCheck(tag, 1, sizeof(tag), fp);
            freadCheck(&bytes, sizeof(bytes), 1, fp);
            tag[STATE_SECTION_TAG_BYTES - 1] = '\0';
            if ((uint64_t)(file_bytes - ftell(fp)) < bytes) { break; }
            if (strcmp(tag, wanted->tag) == 0 && bytes == wanted->bytes) {
                freadCheck(bits, 1, wanted->bytes, fp);
                found = 1;
            } else {
                fseekCheck(fp, (long)bytes, SEEK_CUR);
            }
        }
    }
    fcloseCheck(fp);
    return found;
}

/*
Writes state file `path` for step `step` as the trainers do: the optimizer state of `layout`
(the whole model, or a ZeRO rank's window) as adamw8's sections after the caller's extra ones
(use_adamw8: states8), or as llm.c's fp32 m and v in the body (else: m and v, layout's
num_parameters each); the fp32 master (NULL: none), the loader's position and shuffle state, and
the run's tokens per step (total_batch_size, -d resolved: a resume with another is noted,
train_state_note_total_batch).
*/
static inline void train_state_write(const char* path, int step, int total_batch_size, const DataLoader* loader,
                                     const Adamw8Layout* layout, int use_adamw8, float* m, float* v,
                                     Adamw8States* states8, float* master, const StateSection* extra, int num_extra) {
    StateSection sections[TRAIN_STATE_MAX_EXTRA_SECTIONS + ADAMW8_NUM_SECTIONS];
    train_state_copy_extra_sections(sections, extra, num_extra, "train_state_write");
    int32_t bits[NUM_PARAMETER_TENSORS];
    int num_sections = num_extra + (use_adamw8 ? adamw8_state_sections(sections + num_extra, layout, states8, bits) : 0);
    // llm8's stochastic rounding seeds derive from the step: no RNG state to keep. llm.c draws its
    // seeds from header [20] (and [22]) with xorshift, which stays 0 from 0, so llm.c continuing this
    // checkpoint would round every step alike: a nonzero state, llm.c's starting one advanced by the step
    uint64_t llmc_rng_state = 13371337ull + (uint64_t)loader->process_rank + (uint64_t)step * 0x9E3779B97F4A7C15ull;
    if (llmc_rng_state == 0) { llmc_rng_state = 13371337ull; }
    TrainState state = {step, llmc_rng_state, llmc_rng_state, total_batch_size, 0};
    StateBuffers buffers = {layout->num_parameters, use_adamw8 ? NULL : m, use_adamw8 ? NULL : v, master, sections,
                            num_sections};
    state_file_write(path, &state, &buffers, loader);
}

/*
Dies, naming -qs, when a file's 8-bit states were kept for the tensors of another -qs. Two -qs
can keep the same tensors 8-bit (in a model with C < 32, default and none both keep none):
a file matching the run's own layout is the run's, whichever other -qs it also matches.
*/
static inline void state_file_check_adamw8_selection(const char* path, const int32_t file_bits[NUM_PARAMETER_TENSORS],
                                                     const GPT2Config* cfg, Adamw8Selection selection) {
    Adamw8Layout own;
    adamw8_layout_init(&own, cfg, selection);
    if (memcmp(own.bits, file_bits, sizeof(own.bits)) == 0) { return; }
    for (int s = 0; s < ADAMW8_NUM_SELECTIONS; s++) {
        Adamw8Layout layout;
        adamw8_layout_init(&layout, cfg, (Adamw8Selection)s);
        if (memcmp(layout.bits, file_bits, sizeof(layout.bits)) == 0) {
            llm8_die("state file '%s' keeps 8-bit AdamW states for the tensors of -qs %s, this run has -qs %s: resume with -qs %s",
                     path, ADAMW8_SELECTION_NAMES[s], ADAMW8_SELECTION_NAMES[selection], ADAMW8_SELECTION_NAMES[s]);
        }
    }
}

// what a state file holds, in the run's buffers or, when the file's optimizer is the other one,
// in temporary ones (train_state_file_form_init_), until train_state_file_form_finish_
typedef struct {
    int fp32;             // fp32 moments (else 8-bit states)
    float* m;             // fp32: the window's num_parameters each
    float* v;
    Adamw8States states;  // 8-bit: laid out as the window
} TrainStateFileForm;

static inline TrainStateFileForm train_state_file_form_init_(int file_fp32, const Adamw8Layout* layout, int use_adamw8,
                                                             float* m, float* v, Adamw8States* states8) {
    TrainStateFileForm form;
    memset(&form, 0, sizeof(form));
    form.fp32 = file_fp32;
    form.m = m;
    form.v = v;
    if (use_adamw8) { form.states = *states8; }
    if (file_fp32 && use_adamw8) {
        form.m = (float*)mallocCheck(layout->num_parameters * sizeof(float));
        form.v = (float*)mallocCheck(layout->num_parameters * sizeof(float));
    }
    if (!file_fp32 && !use_adamw8) { adamw8_states_alloc_host(&form.states, layout); }
    return form;
}

// into the run's form: fp32 moments quantized, or 8-bit states dequantized, when the optimizers differ
static inline void train_state_file_form_finish_(TrainStateFileForm* form, const char* source, const Adamw8Layout* layout,
                                                 Adamw8Selection selection, int use_adamw8, float* m, float* v,
                                                 Adamw8States* states8) {
    if (form->fp32 == !use_adamw8) { return; }
    Quant8Maps maps;
    quant8_maps_init(&maps);
    if (use_adamw8) {
        adamw8_states_from_fp32(layout, &maps, form->m, form->v, states8);
        printf("%s: fp32 AdamW moments quantized into 8-bit states (-opt adamw8 -qs %s)\n", source, ADAMW8_SELECTION_NAMES[selection]);
        free(form->m);
        free(form->v);
    } else {
        adamw8_states_to_fp32(layout, &maps, &form->states, m, v);
        printf("%s: 8-bit AdamW states dequantized into fp32 moments (-opt adamw)\n", source);
        adamw8_states_free_host(&form->states);
    }
}

// dies naming `source` and the first of values[0..count) that is not finite (or, non_negative, below 0)
static inline void train_state_check_array_(const char* source, const char* what, const float* values, size_t count,
                                            int non_negative) {
    for (size_t i = 0; i < count; i++) {
        if (!isfinite(values[i]) || (non_negative && values[i] < 0.0f)) {
            llm8_die("%s: %s %zu of this rank's window is %g, expected a finite number%s", source, what, i,
                     values[i], non_negative ? " >= 0" : "");
        }
    }
}

/*
The optimizer state a file holds, as read (before any conversion): every moment and master
weight finite, every v and 8-bit block absmax finite and >= 0. A file that passes every shape
check can still carry a NaN (a disk error, a file another tool wrote): the first update would
write it into the weights, since a NaN moment is no non-finite gradient, which the step's skip
catches; a NaN absmax would leave its block frozen for good. source: the file (or files) in errors.
*/
static inline void train_state_check_values_(const TrainStateFileForm* form, const Adamw8Layout* layout,
                                             const float* master, const char* source) {
    if (form->fp32) {
        train_state_check_array_(source, "AdamW m of parameter", form->m, layout->num_parameters, 0);
        train_state_check_array_(source, "AdamW v of parameter", form->v, layout->num_parameters, 1);
    } else {
        train_state_check_array_(source, "adamw8 m absmax of block", form->states.m_absmax, layout->num_blocks, 1);
        train_state_check_array_(source, "adamw8 v absmax of block", form->states.v_absmax, layout->num_blocks, 1);
        train_state_check_array_(source, "adamw8 32-bit m of element", form->states.m32, layout->num_fp32, 0);
        train_state_check_array_(source, "adamw8 32-bit v of element", form->states.v32, layout->num_fp32, 1);
    }
    if (master != NULL) { train_state_check_array_(source, "master weight of parameter", master, layout->num_parameters, 0); }
}

/*
The layout of flat parameters [flat_begin, flat_end) in which the states are read: -qs's
selection when the file or the run keeps 8-bit states, else every tensor 32-bit (plain AdamW
in and out needs no 8-bit block grid, whatever -qs says).
*/
static inline void train_state_window_(Adamw8Layout* window, const GPT2Config* cfg, Adamw8Selection selection,
                                       int use_adamw8, int file_fp32, size_t flat_begin, size_t flat_end) {
    Adamw8Layout model;
    adamw8_layout_init(&model, cfg, use_adamw8 || !file_fp32 ? selection : ADAMW8_SELECT_NONE);
    adamw8_layout_window(window, &model, flat_begin, flat_end);
}

/*
Reads state file `path` with the caller's other sections (extra, e.g. FP8's) and leaves the
optimizer state in the form this run keeps: fp32 moments in m and v (use_adamw8 0), or adamw8
states in the host states8 laid out for `selection` (use_adamw8 1), for the flat parameters
[flat_begin, flat_end) (all of them on one GPU; a ZeRO rank's range: its own state file). A file written by the other
optimizer is converted (doc/adamw8.md): its fp32 moments quantized, or its 8-bit states
dequantized, which needs the -qs it was written with. step: the checkpoint's (its file name's and
DONE marker's); a file holding another is refused. Returns the step to continue from.
batches_per_step: the loader's batches per optimizer step in this run (gradient accumulation; 0
with -a 1, whose batch is not the loader's); a file of another B or T has its position replayed:
the loader goes where a run with this B and T is after `step` steps (dataloader_seek_batches).
*/
static inline int train_state_read(const char* path, int step, size_t batches_per_step, DataLoader* loader,
                                   const GPT2Config* cfg, int use_adamw8,
                                   Adamw8Selection selection, size_t flat_begin, size_t flat_end, float* m, float* v,
                                   Adamw8States* states8, float* master, const StateSection* extra, int num_extra) {
    int file_fp32 = state_file_has_fp32_moments(path);
    Adamw8Layout layout;  // this process's window: the whole model, or its ZeRO range
    train_state_window_(&layout, cfg, selection, use_adamw8, file_fp32, flat_begin, flat_end);
    size_t n = layout.num_parameters;
    int32_t file_bits[NUM_PARAMETER_TENSORS];
    if (!file_fp32 && state_file_find_adamw8_bits(path, loader, &layout, master != NULL, file_bits)) {
        state_file_check_adamw8_selection(path, file_bits, cfg, selection);
    }
    TrainStateFileForm form = train_state_file_form_init_(file_fp32, &layout, use_adamw8, m, v, states8);
    StateSection sections[TRAIN_STATE_MAX_EXTRA_SECTIONS + ADAMW8_NUM_SECTIONS];
    int num_sections = train_state_copy_extra_sections(sections, extra, num_extra, "train_state_read");
    int32_t bits[NUM_PARAMETER_TENSORS];
    if (!file_fp32) { num_sections += adamw8_state_sections(sections + num_extra, &layout, &form.states, bits); }
    StateBuffers buffers = {n, file_fp32 ? form.m : NULL, file_fp32 ? form.v : NULL, master, sections, num_sections};
    TrainState state;
    state_file_read(path, &state, &buffers, loader);
    if (state.step != step) {
        llm8_die("state file '%s' holds step %d, expected %d (the checkpoint's step)", path, state.step, step);
    }
    if (state.data_reshaped) {
        StateFileIndex header;
        state_file_read_header(path, &header);
        dataloader_seek_batches(loader, (size_t)step * batches_per_step);
        printf("%s: written with B=%d T=%d, this run has B=%zu T=%zu: data loader replayed %zu batches to shard %zu "
               "sample %zu, where a run with this B and T is at step %d\n", path, header.micro_batch, header.seq_len,
               loader->B, loader->T, (size_t)step * batches_per_step, loader->current_shard_idx, loader->current_sample_idx,
               step);
    }
    if (!file_fp32) { adamw8_check_bits(&layout, bits, path); }
    char source[CHECKPOINT_PATH_MAX + 16];
    snprintf(source, sizeof(source), "state file '%s'", path);
    train_state_check_values_(&form, &layout, master, source);
    train_state_file_form_finish_(&form, path, &layout, selection, use_adamw8, m, v, states8);
    return state.step;
}

/*
A note when a resumed run's tokens per step (total_batch_size, -d resolved) are not those its
checkpoint was written with (`path`: rank 0's state file). -d's default, B*T times the
processes, moves with the number of GPUs and with -b and -t, so a checkpoint of 8 GPUs
continued on 4 without -d would take steps of half the tokens under the schedule and learning
rate of the original. A changed batch can be meant (a batch-size ramp): a note, with the -d
that keeps the checkpoint's, not an error. Files that do not record it (llm.c's, and llm8's
before slot 11) give none.
*/
static inline void train_state_note_total_batch(const char* path, int total_batch_size, int grad_accum_steps) {
    StateFileIndex file;
    state_file_read_header(path, &file);
    if (file.total_batch_size == 0 || file.total_batch_size == total_batch_size) { return; }
    int tokens_per_micro_step = total_batch_size / grad_accum_steps;
    printf("note: %s was written by a run of %d tokens per step (-d); this run's are %d: ", path, file.total_batch_size,
           total_batch_size);
    if (file.total_batch_size % tokens_per_micro_step == 0) {
        printf("-d %d trains on with the checkpoint's\n", file.total_batch_size);
    } else {
        printf("the checkpoint's are not a multiple of this run's B*T*processes, %d\n", tokens_per_micro_step);
    }
}

#endif // LLMC_TRAIN_STATE_H
