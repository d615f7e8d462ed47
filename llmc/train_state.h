/*
train_state.h: resuming a run's optimizer state, whichever optimizer wrote it.

Why: a checkpoint written with fp32 AdamW must resume under 8-bit AdamW and the reverse
(DESIGN.md section 4), and both trainers must do it the same way. checkpoint.h knows the
file layout, quant8.h the 8-bit states and their conversions; this module puts the two
together: it reads a state file into the form this run keeps, converting when the file's
optimizer differs, and names the -qs flag when the 8-bit tensor selection does not match.
*/
#ifndef LLMC_TRAIN_STATE_H
#define LLMC_TRAIN_STATE_H

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

/*
The per-tensor state widths (the adamw8.bits section) of a state file with 8-bit states, found
before the state is read: state_file_read stops at the first section whose size differs, which
another -qs always causes, so this is how the error can name the flag. Walks the file as
checkpoint.h writes it; the shuffle trailer is read into loader on the way (state_file_read
reads the same bytes again). Returns 0 when the file is not laid out as this run expects
(ranks, shuffling, master weights, truncation), leaving the precise error to state_file_read.
*/
static inline int state_file_find_adamw8_bits(const char* path, DataLoader* loader, const Adamw8Layout* layout,
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
        dataloader_read_state(loader, fp, path);
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

// dies, naming -qs, when a file's 8-bit states were kept for the tensors of another -qs
static inline void state_file_check_adamw8_selection(const char* path, const int32_t file_bits[NUM_PARAMETER_TENSORS],
                                                     const GPT2Config* cfg, Adamw8Selection selection) {
    for (int s = 0; s < ADAMW8_NUM_SELECTIONS; s++) {
        Adamw8Layout layout;
        adamw8_layout_init(&layout, cfg, (Adamw8Selection)s);
        if (s != (int)selection && memcmp(layout.bits, file_bits, sizeof(layout.bits)) == 0) {
            llm8_die("state file '%s' keeps 8-bit AdamW states for the tensors of -qs %s, this run has -qs %s: resume with -qs %s",
                     path, ADAMW8_SELECTION_NAMES[s], ADAMW8_SELECTION_NAMES[selection], ADAMW8_SELECTION_NAMES[s]);
        }
    }
}

/*
Reads state file `path` with the caller's other sections (extra, e.g. FP8's) and leaves the
optimizer state in the form this run keeps: fp32 moments in m and v (use_adamw8 0), or adamw8
states in the host states8 laid out for `selection` (use_adamw8 1), for the flat parameters
[flat_begin, flat_end) (all of them on one GPU; a ZeRO rank's range: its own state file). A file written by the other
optimizer is converted (doc/adamw8.md): its fp32 moments quantized, or its 8-bit states
dequantized, which needs the -qs it was written with. Returns the step to continue from.
*/
static inline int train_state_read(const char* path, DataLoader* loader, const GPT2Config* cfg, int use_adamw8,
                                   Adamw8Selection selection, size_t flat_begin, size_t flat_end, float* m, float* v,
                                   Adamw8States* states8, float* master, const StateSection* extra, int num_extra) {
    if (num_extra > TRAIN_STATE_MAX_EXTRA_SECTIONS) {
        llm8_die("train_state_read: %d extra sections, at most %d", num_extra, TRAIN_STATE_MAX_EXTRA_SECTIONS);
    }
    Adamw8Layout model_layout, layout;  // this process's window: the whole model, or its ZeRO range
    adamw8_layout_init(&model_layout, cfg, selection);
    adamw8_layout_window(&layout, &model_layout, flat_begin, flat_end);
    size_t n = layout.num_parameters;
    int file_fp32 = state_file_has_fp32_moments(path);
    int32_t file_bits[NUM_PARAMETER_TENSORS];
    if (!file_fp32 && state_file_find_adamw8_bits(path, loader, &layout, master != NULL, file_bits)) {
        state_file_check_adamw8_selection(path, file_bits, cfg, selection);
    }
    // what the file holds, in this run's buffers or, when converting, in temporary ones
    float* file_m = m;
    float* file_v = v;
    Adamw8States file_states;
    memset(&file_states, 0, sizeof(file_states));
    if (use_adamw8) { file_states = *states8; }
    if (file_fp32 && use_adamw8) {
        file_m = (float*)mallocCheck(n * sizeof(float));
        file_v = (float*)mallocCheck(n * sizeof(float));
    }
    if (!file_fp32 && !use_adamw8) { adamw8_states_alloc_host(&file_states, &layout); }

    StateSection sections[TRAIN_STATE_MAX_EXTRA_SECTIONS + ADAMW8_NUM_SECTIONS];
    memcpy(sections, extra, (size_t)num_extra * sizeof(StateSection));
    int num_sections = num_extra;
    int32_t bits[NUM_PARAMETER_TENSORS];
    if (!file_fp32) { num_sections += adamw8_state_sections(sections + num_extra, &layout, &file_states, bits); }
    StateBuffers buffers = {n, file_fp32 ? file_m : NULL, file_fp32 ? file_v : NULL, master, sections, num_sections};
    TrainState state;
    state_file_read(path, &state, &buffers, loader);
    if (!file_fp32) { adamw8_check_bits(&layout, bits, path); }

    if (file_fp32 != !use_adamw8) {
        Quant8Maps maps;
        quant8_maps_init(&maps);
        if (use_adamw8) {
            adamw8_states_from_fp32(&layout, &maps, file_m, file_v, states8);
            printf("%s: fp32 AdamW moments quantized into 8-bit states (-opt adamw8 -qs %s)\n", path, ADAMW8_SELECTION_NAMES[selection]);
            free(file_m);
            free(file_v);
        } else {
            adamw8_states_to_fp32(&layout, &maps, &file_states, m, v);
            printf("%s: 8-bit AdamW states dequantized into fp32 moments (-opt adamw)\n", path);
            adamw8_states_free_host(&file_states);
        }
    }
    return state.step;
}

#endif // LLMC_TRAIN_STATE_H
