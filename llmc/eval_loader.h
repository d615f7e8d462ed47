/*
eval_loader.h: multiple-choice evals (HellaSwag) in the file format llm.c's
dev/data/hellaswag.py writes, packed into (B, T) batches for the model's forward pass.

Why it is shaped this way:
- The file stays llm.c's: header of 256 int32 ([0] 20240522, [1] version 1, [2] number of
  examples, [3] longest example in bytes), then per example a uint16 stream
  <START_EXAMPLE=65535> <EXAMPLE_BYTES> <EXAMPLE_INDEX> <LABEL> <NUM_COMPLETIONS=4>
  <CONTEXT_LENGTH> context... then per completion <LENGTH> tokens...
- The file is small (HellaSwag val is about 2 MB), so init reads it whole and checks every
  example once (delimiter, index, label, lengths, fit in T, total length, every token id below
  the model's vocabulary): a bad file fails at startup with the example named, and next_batch
  cannot fail afterwards, nor hand the model an id past its embedding table.
- Each example takes 4 rows of the batch, one per completion: row = context + completion.
  A batch holds B / 4 examples; with B not a multiple of 4 the last rows stay empty, as in llm.c.
  The target at position t is the token at t+1; the mask is 1 exactly on the positions that
  predict completion tokens, so the mean loss under the mask scores a completion, and the
  lowest mean loss is the model's answer (llm.c's rule).
- Ranks split the examples into contiguous ranges of ceil(N / num_processes); every rank
  runs the same number of batches (num_batches), so collectives stay matched.
*/
#ifndef LLMC_EVAL_LOADER_H
#define LLMC_EVAL_LOADER_H

#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include "utils.h"

#define EVAL_FILE_MAGIC 20240522
#define EVAL_FILE_VERSION 1
#define EVAL_HEADER_INTS 256
#define EVAL_START_EXAMPLE 65535
#define EVAL_NUM_COMPLETIONS 4

typedef struct {
    size_t B;
    size_t T;
    int vocab_size;           // every token id in the file is below it
    uint16_t* stream;         // every example, as in the file after the header
    size_t* example_offsets;  // index into stream of each example's <START_EXAMPLE>
    int num_examples;         // in the file, across all processes
    int num_batches;          // batches every rank runs to cover its examples
    int start_example_index;  // this rank's examples: [start, end)
    int end_example_index;
    int current_example_index;
    int* inputs;              // B*T
    int* targets;             // B*T
    float* mask;              // B*T, 1 where the target is a completion token
    int* label;               // B/4: correct completion of each example in the batch, -1 for none
} EvalLoader;

// dies unless the `count` token ids at `tokens` are below the loader's vocabulary
static inline void evalloader_check_tokens_(const EvalLoader* loader, const char* path, int index, const char* part,
                                            const uint16_t* tokens, size_t count) {
    for (size_t i = 0; i < count; i++) {
        if ((int)tokens[i] >= loader->vocab_size) {
            llm8_die("eval file '%s': example %d, %s token %zu has id %d, not below the vocab size %d", path, index, part,
                     i, (int)tokens[i], loader->vocab_size);
        }
    }
}

// checks example `index` at stream[offset..], returns its length in uint16 words
static inline size_t evalloader_check_example_(const EvalLoader* loader, const char* path, int index,
                                               size_t offset, size_t stream_words) {
    const uint16_t* ex = loader->stream + offset;
    size_t words_left = stream_words - offset;
    if (words_left < 6) {
        llm8_die("eval file '%s': truncated at example %d", path, index);
    }
    if (ex[0] != EVAL_START_EXAMPLE) {
        llm8_die("eval file '%s': example %d does not start with the delimiter %d (found %d)",
                 path, index, EVAL_START_EXAMPLE, (int)ex[0]);
    }
    size_t words = ex[1] / 2;
    if (ex[1] % 2 != 0 || words < 6 || words > words_left) {
        llm8_die("eval file '%s': example %d claims %d bytes, but %zu bytes are left", path, index, (int)ex[1],
                 words_left * 2);
    }
    if (ex[2] != (uint16_t)index) {
        llm8_die("eval file '%s': example %d carries index %d", path, index, (int)ex[2]);
    }
    if (ex[3] >= EVAL_NUM_COMPLETIONS) {
        llm8_die("eval file '%s': example %d has label %d, expected 0..%d", path, index, (int)ex[3],
                 EVAL_NUM_COMPLETIONS - 1);
    }
    if (ex[4] != EVAL_NUM_COMPLETIONS) {
        llm8_die("eval file '%s': example %d has %d completions, expected %d", path, index, (int)ex[4],
                 EVAL_NUM_COMPLETIONS);
    }
    size_t context_length = ex[5];
    size_t pos = 6 + context_length;
    if (context_length == 0 || pos > words) {
        llm8_die("eval file '%s': example %d has a context of %zu tokens that does not fit its %zu bytes",
                 path, index, context_length, words * 2);
    }
    evalloader_check_tokens_(loader, path, index, "context", ex + 6, context_length);
    static const char* const completion_names[EVAL_NUM_COMPLETIONS] = {"completion 0", "completion 1", "completion 2",
                                                                       "completion 3"};
    for (int c = 0; c < EVAL_NUM_COMPLETIONS; c++) {
        size_t completion_length = (pos < words) ? ex[pos] : 0;
        if (completion_length == 0 || pos + 1 + completion_length > words) {
            llm8_die("eval file '%s': example %d, completion %d is empty or overruns the example", path, index, c);
        }
        if (context_length + completion_length > loader->T) {
            llm8_die("eval file '%s': example %d, completion %d needs %zu tokens, more than T=%zu",
                     path, index, c, context_length + completion_length, loader->T);
        }
        evalloader_check_tokens_(loader, path, index, completion_names[c], ex + pos + 1, completion_length);
        pos += 1 + completion_length;
    }
    if (pos != words) {
        llm8_die("eval file '%s': example %d claims %zu bytes but its fields take %zu", path, index, words * 2, pos * 2);
    }
    return words;
}

// rewinds this rank to its first example
static inline void evalloader_reset(EvalLoader* loader) {
    loader->current_example_index = loader->start_example_index;
}

// vocab_size: the model's; every token id in the file must be below it
static inline void evalloader_init(EvalLoader* loader, const char* path, size_t B, size_t T,
                                   int process_rank, int num_processes, int vocab_size) {
    if (B < EVAL_NUM_COMPLETIONS) {
        llm8_die("eval file '%s': batch size B=%zu holds no example: each takes %d rows, one per completion (raise -b, "
                 "or -h 0)", path, B, EVAL_NUM_COMPLETIONS);
    }
    if (T == 0) { llm8_die("eval file '%s': T must be positive", path); }
    if (num_processes <= 0 || process_rank < 0 || process_rank >= num_processes) {
        llm8_die("eval file '%s': process rank %d is not in [0, %d)", path, process_rank, num_processes);
    }
    if (vocab_size <= 0) { llm8_die("eval file '%s': vocab size %d must be positive", path, vocab_size); }
    memset(loader, 0, sizeof(*loader));
    loader->vocab_size = vocab_size;
    loader->B = B;
    loader->T = T;

    FILE* fp = fopenCheck(path, "rb");
    long file_bytes = file_size_bytes(fp);
    long header_bytes = (long)(EVAL_HEADER_INTS * sizeof(int32_t));
    if (file_bytes < header_bytes) {
        llm8_die("eval file '%s' is %ld bytes, shorter than its %ld-byte header", path, file_bytes, header_bytes);
    }
    int32_t header[EVAL_HEADER_INTS];
    freadCheck(header, sizeof(int32_t), EVAL_HEADER_INTS, fp);
    if (header[0] != EVAL_FILE_MAGIC) {
        llm8_die("eval file '%s' has magic %d, expected %d (not a hellaswag.py eval file)", path, header[0], EVAL_FILE_MAGIC);
    }
    if (header[1] != EVAL_FILE_VERSION) {
        llm8_die("eval file '%s' has version %d, expected %d", path, header[1], EVAL_FILE_VERSION);
    }
    if (header[2] < num_processes) {
        llm8_die("eval file '%s' has %d examples, fewer than the %d processes", path, header[2], num_processes);
    }
    if ((file_bytes - header_bytes) % 2 != 0) {
        llm8_die("eval file '%s': %ld bytes after the header is not a whole number of uint16", path, file_bytes - header_bytes);
    }
    loader->num_examples = header[2];
    size_t stream_words = (size_t)(file_bytes - header_bytes) / 2;
    if ((size_t)loader->num_examples > stream_words / 6) {  // an example is at least 6 words: no huge allocation
        llm8_die("eval file '%s' claims %d examples, but its %zu bytes after the header hold at most %zu", path,
                 loader->num_examples, stream_words * 2, stream_words / 6);
    }
    loader->stream = (uint16_t*)mallocCheck(stream_words * sizeof(uint16_t));
    freadCheck(loader->stream, sizeof(uint16_t), stream_words, fp);
    fcloseCheck(fp);

    loader->example_offsets = (size_t*)mallocCheck((size_t)loader->num_examples * sizeof(size_t));
    size_t offset = 0;
    size_t longest_bytes = 0;
    for (int i = 0; i < loader->num_examples; i++) {
        loader->example_offsets[i] = offset;
        size_t words = evalloader_check_example_(loader, path, i, offset, stream_words);
        if (words * 2 > longest_bytes) { longest_bytes = words * 2; }
        offset += words;
    }
    if (offset != stream_words) {
        llm8_die("eval file '%s': %zu bytes follow the last of its %d examples", path, (stream_words - offset) * 2,
                 loader->num_examples);
    }
    if (longest_bytes != (size_t)header[3]) {
        llm8_die("eval file '%s': header says the longest example is %d bytes, the file's is %zu", path, header[3],
                 longest_bytes);
    }

    int examples_per_process = (loader->num_examples + num_processes - 1) / num_processes;
    int examples_per_batch = (int)(B / EVAL_NUM_COMPLETIONS);
    loader->num_batches = (examples_per_process + examples_per_batch - 1) / examples_per_batch;
    loader->start_example_index = examples_per_process * process_rank;
    loader->end_example_index = examples_per_process * (process_rank + 1);
    if (loader->end_example_index > loader->num_examples) { loader->end_example_index = loader->num_examples; }
    if (loader->start_example_index > loader->end_example_index) {
        loader->start_example_index = loader->end_example_index;
    }

    loader->inputs = (int*)mallocCheck(B * T * sizeof(int));
    loader->targets = (int*)mallocCheck(B * T * sizeof(int));
    loader->mask = (float*)mallocCheck(B * T * sizeof(float));
    loader->label = (int*)mallocCheck((size_t)examples_per_batch * sizeof(int));
    evalloader_reset(loader);
}

// fills the next B/4 examples of this rank; rows past the rank's last example are all zero
static inline void evalloader_next_batch(EvalLoader* loader) {
    size_t B = loader->B, T = loader->T;
    memset(loader->inputs, 0, B * T * sizeof(int));
    memset(loader->targets, 0, B * T * sizeof(int));
    memset(loader->mask, 0, B * T * sizeof(float));
    int examples_per_batch = (int)(B / EVAL_NUM_COMPLETIONS);
    for (int e = 0; e < examples_per_batch; e++) {
        loader->label[e] = -1;
        if (loader->current_example_index >= loader->end_example_index) { continue; }
        const uint16_t* ex = loader->stream + loader->example_offsets[loader->current_example_index];
        loader->label[e] = ex[3];
        size_t context_length = ex[5];
        const uint16_t* context = ex + 6;
        const uint16_t* completion = context + context_length;
        for (int c = 0; c < EVAL_NUM_COMPLETIONS; c++) {
            size_t completion_length = completion[0];
            size_t row = (size_t)(e * EVAL_NUM_COMPLETIONS + c) * T;
            size_t length = context_length + completion_length;
            for (size_t t = 0; t < length; t++) {
                int token = (t < context_length) ? context[t] : completion[1 + t - context_length];
                loader->inputs[row + t] = token;
                if (t > 0) { loader->targets[row + t - 1] = token; }
                if (t >= context_length) { loader->mask[row + t - 1] = 1.0f; }
            }
            completion += 1 + completion_length;
        }
        loader->current_example_index++;
    }
}

// losses: B*T per-position losses of the batch; returns how many examples the model got right
static inline int evalloader_stat_losses(const EvalLoader* loader, const float* losses) {
    size_t T = loader->T;
    int examples_per_batch = (int)(loader->B / EVAL_NUM_COMPLETIONS);
    int correct = 0;
    for (int e = 0; e < examples_per_batch; e++) {
        if (loader->label[e] < 0) { continue; }
        int best = -1;
        float best_loss = 0.0f;
        for (int c = 0; c < EVAL_NUM_COMPLETIONS; c++) {
            size_t row = (size_t)(e * EVAL_NUM_COMPLETIONS + c) * T;
            float sum = 0.0f;
            int count = 0;
            for (size_t t = 0; t < T; t++) {
                if (loader->mask[row + t] != 0.0f) { sum += losses[row + t]; count++; }
            }
            float mean = sum / (float)count;  // count >= 1: every completion is non-empty
            if (best < 0 || mean < best_loss) { best = c; best_loss = mean; }
        }
        if (best == loader->label[e]) { correct++; }
    }
    return correct;
}

static inline void evalloader_free(EvalLoader* loader) {
    free(loader->stream);
    free(loader->example_offsets);
    free(loader->inputs);
    free(loader->targets);
    free(loader->mask);
    free(loader->label);
    memset(loader, 0, sizeof(*loader));
}

#endif // LLMC_EVAL_LOADER_H
