/*
test_dataloader.c: batch order, sharding across ranks, shuffling, resume, the HellaSwag eval
loader, and one test per bad input.

The shards written here hold token = shard * 1000 + position, so every token says where it
came from and the expected order can be recomputed. Files from test/make_llmc_files.py
(llm.c's layout, written by numpy) are read as well.
Run from the repository root: build/test_dataloader
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "test/test_harness.h"
#include "test/test_harness_fork.h"
#include "llmc/utils.h"
#include "llmc/dataloader.h"
#include "llmc/eval_loader.h"

#define NUM_SHARDS 3
#define VOCAB 4000
static const size_t SHARD_TOKENS[NUM_SHARDS] = {301, 250, 199};

static char g_dir[256];
static char g_py_dir[512];
static char g_pattern[512];

static const char* in_dir(const char* dir, const char* name) {
    static char paths[8][1024];
    static int next = 0;
    char* path = paths[next];
    next = (next + 1) % 8;
    snprintf(path, 1024, "%s/%s", dir, name);
    return path;
}

// writes a shard in llm.c's layout; header_tokens is what the header claims
static void write_shard(const char* path, const uint16_t* tokens, size_t num_tokens, int32_t magic, int32_t version,
                        int32_t header_tokens) {
    int32_t header[256];
    memset(header, 0, sizeof(header));
    header[0] = magic;
    header[1] = version;
    header[2] = header_tokens;
    FILE* fp = fopenCheck(path, "wb");
    fwriteCheck(header, sizeof(header), 1, fp);
    fwriteCheck(tokens, sizeof(uint16_t), num_tokens, fp);
    fcloseCheck(fp);
}

static uint16_t* make_tokens(int shard, size_t n) {
    uint16_t* tokens = (uint16_t*)mallocCheck(n * sizeof(uint16_t));
    for (size_t i = 0; i < n; i++) { tokens[i] = (uint16_t)(shard * 1000 + i); }
    return tokens;
}

static void write_good_shards(void) {
    for (int s = 0; s < NUM_SHARDS; s++) {
        char name[64];
        snprintf(name, sizeof(name), "tiny_train_%06d.bin", s);
        uint16_t* tokens = make_tokens(s, SHARD_TOKENS[s]);
        write_shard(in_dir(g_dir, name), tokens, SHARD_TOKENS[s], 20240520, 1, (int32_t)SHARD_TOKENS[s]);
        free(tokens);
    }
    snprintf(g_pattern, sizeof(g_pattern), "%s/tiny_train_*.bin", g_dir);
}

static size_t shard_samples(int shard, size_t B, size_t T, int num_processes) {
    return (SHARD_TOKENS[shard] - 1) / (num_processes * B * T);
}

// each batch must be B*T consecutive tokens of one shard, and targets the inputs shifted by one
static int batch_is_contiguous(const DataLoader* loader) {
    size_t BT = loader->B * loader->T;
    for (size_t i = 0; i < BT; i++) {
        if (loader->inputs[i] != loader->inputs[0] + (int)i) { return 0; }
        if (loader->targets[i] != loader->inputs[0] + (int)i + 1) { return 0; }
    }
    return 1;
}

static void test_unshuffled_order(void) {
    size_t B = 2, T = 4, BT = B * T;
    DataLoader loader;
    dataloader_init(&loader, g_pattern, B, T, 0, 1, 0, VOCAB);
    CHECK(loader.num_tokens == 301 + 250 + 199, "num_tokens %zu", loader.num_tokens);
    CHECK(loader.num_shards == NUM_SHARDS, "num_shards %zu", loader.num_shards);
    // one epoch: the token stream of each shard in order, cut into B*T pieces
    int in_order = 1, contiguous = 1;
    for (int s = 0; s < NUM_SHARDS; s++) {
        for (size_t k = 0; k < shard_samples(s, B, T, 1); k++) {
            dataloader_next_batch(&loader);
            contiguous &= batch_is_contiguous(&loader);
            in_order &= loader.inputs[0] == (int)(s * 1000 + k * BT);
        }
    }
    CHECK(in_order && contiguous, "unshuffled epoch is not the token stream in order");
    dataloader_next_batch(&loader);
    CHECK(loader.inputs[0] == 0 && loader.current_shard_idx == 0, "no wrap to the start after an epoch (got %d)",
          loader.inputs[0]);
    dataloader_next_batch(&loader);
    dataloader_reset(&loader);
    dataloader_next_batch(&loader);
    CHECK(loader.inputs[0] == 0, "reset does not restart at the first batch");
    dataloader_free(&loader);

    // two ranks: rank r reads the window at r*B*T of every sample of num_processes*B*T tokens
    for (int rank = 0; rank < 2; rank++) {
        dataloader_init(&loader, g_pattern, B, T, rank, 2, 0, VOCAB);
        int ok = 1;
        for (int s = 0; s < NUM_SHARDS; s++) {
            for (size_t k = 0; k < shard_samples(s, B, T, 2); k++) {
                dataloader_next_batch(&loader);
                ok &= batch_is_contiguous(&loader) && loader.inputs[0] == (int)(s * 1000 + k * 2 * BT + rank * BT);
            }
        }
        CHECK(ok, "rank %d of 2 does not read its interleaved windows", rank);
        dataloader_free(&loader);
    }
}

// one epoch of first tokens (each identifies its window) for a loader
static size_t epoch_windows(DataLoader* loader, int* windows) {
    size_t count = 0;
    for (int s = 0; s < NUM_SHARDS; s++) {
        size_t n = shard_samples(s, loader->B, loader->T, loader->num_processes);
        for (size_t k = 0; k < n; k++) {
            dataloader_next_batch(loader);
            windows[count++] = batch_is_contiguous(loader) ? loader->inputs[0] : -1;
        }
    }
    return count;
}

static int compare_ints(const void* a, const void* b) { return *(const int*)a - *(const int*)b; }

static void test_shuffled_order(void) {
    size_t B = 1, T = 4;
    int plain[256], first[256], again[256], second_epoch[256], rank_windows[2][256], all[512];
    DataLoader loader;
    dataloader_init(&loader, g_pattern, B, T, 0, 1, 0, VOCAB);
    size_t n = epoch_windows(&loader, plain);
    dataloader_free(&loader);

    dataloader_init(&loader, g_pattern, B, T, 0, 1, 1, VOCAB);
    CHECK(epoch_windows(&loader, first) == n, "shuffled epoch length");
    CHECK(epoch_windows(&loader, second_epoch) == n, "second epoch length");
    dataloader_free(&loader);
    dataloader_init(&loader, g_pattern, B, T, 0, 1, 1, VOCAB);
    epoch_windows(&loader, again);
    dataloader_free(&loader);

    CHECK(memcmp(first, again, n * sizeof(int)) == 0, "shuffle is not deterministic for a fixed seed and rank");
    CHECK(memcmp(first, plain, n * sizeof(int)) != 0, "shuffled order equals the unshuffled order");
    CHECK(memcmp(first, second_epoch, n * sizeof(int)) != 0, "two epochs have the same shuffled order");
    int sorted_first[256], sorted_second[256];
    memcpy(sorted_first, first, n * sizeof(int));
    memcpy(sorted_second, second_epoch, n * sizeof(int));
    qsort(sorted_first, n, sizeof(int), compare_ints);
    qsort(sorted_second, n, sizeof(int), compare_ints);
    CHECK(memcmp(sorted_first, plain, n * sizeof(int)) == 0, "shuffled epoch is not a permutation of the samples");
    CHECK(memcmp(sorted_second, plain, n * sizeof(int)) == 0, "second epoch is not a permutation of the samples");
    // shards stay whole: within an epoch the windows of one shard come together, in shuffled order
    int changes = 0, ascending_pairs = 0;
    for (size_t i = 1; i < n; i++) {
        int same_shard = first[i] / 1000 == first[i - 1] / 1000;
        changes += !same_shard;
        ascending_pairs += same_shard && first[i] > first[i - 1];
    }
    CHECK(changes == NUM_SHARDS - 1, "shuffled epoch interleaves shards (%d shard changes)", changes);
    CHECK(ascending_pairs < (int)(n * 3 / 4), "samples within a shard are not shuffled (%d of %zu in order)",
          ascending_pairs, n);

    // two ranks: different orders, disjoint windows, together every window of the 2-rank split
    size_t per_rank = 0;
    for (int rank = 0; rank < 2; rank++) {
        dataloader_init(&loader, g_pattern, B, T, rank, 2, 1, VOCAB);
        per_rank = epoch_windows(&loader, rank_windows[rank]);
        dataloader_free(&loader);
    }
    int same_order = 1;  // each rank has its own seed, so its own order
    for (size_t i = 0; i < per_rank; i++) { same_order &= rank_windows[1][i] - (int)(B * T) == rank_windows[0][i]; }
    CHECK(!same_order, "both ranks shuffle in the same order (seed must include the rank)");
    memcpy(all, rank_windows[0], per_rank * sizeof(int));
    memcpy(all + per_rank, rank_windows[1], per_rank * sizeof(int));
    qsort(all, 2 * per_rank, sizeof(int), compare_ints);
    int disjoint_and_complete = 1;
    size_t idx = 0;
    for (int s = 0; s < NUM_SHARDS; s++) {
        for (size_t k = 0; k < shard_samples(s, B, T, 2) * 2; k++) {
            disjoint_and_complete &= all[idx++] == (int)(s * 1000 + k * B * T);
        }
    }
    CHECK(idx == 2 * per_rank && disjoint_and_complete, "ranks' shuffled windows are not disjoint and complete");
}

/*
llm.c's shuffled order, written out from its dataloader: the shard order is the identity once, at
init, and each epoch shuffles the previous epoch's order in place (Fisher-Yates from the last
index down, j = draw % (i + 1)); a shard's sample order is the identity shuffled when the epoch
reaches the shard. One MT19937 seeded 42 + rank makes every draw, in that order. Three epochs:
from the second on, an order shuffled from the identity each epoch differs.
*/
static void fisher_yates(int* data, int n, mt19937_state* rng) {
    for (int i = n - 1; i > 0; i--) {
        int j = (int)(randint32(rng) % (uint32_t)(i + 1));
        int tmp = data[i]; data[i] = data[j]; data[j] = tmp;
    }
}

static void test_shuffled_order_is_llmcs(void) {
    size_t B = 1, T = 4;
    enum { EPOCHS = 3 };
    mt19937_state rng;
    manual_seed(&rng, 42);
    int shards[NUM_SHARDS], expected[EPOCHS * 256];
    for (int i = 0; i < NUM_SHARDS; i++) { shards[i] = i; }
    size_t count = 0;
    for (int epoch = 0; epoch < EPOCHS; epoch++) {
        fisher_yates(shards, NUM_SHARDS, &rng);
        for (int p = 0; p < NUM_SHARDS; p++) {
            int samples[256];
            int n = (int)shard_samples(shards[p], B, T, 1);
            for (int k = 0; k < n; k++) { samples[k] = k; }
            fisher_yates(samples, n, &rng);
            for (int k = 0; k < n; k++) { expected[count++] = shards[p] * 1000 + samples[k] * (int)(B * T); }
        }
    }
    DataLoader loader;
    dataloader_init(&loader, g_pattern, B, T, 0, 1, 1, VOCAB);
    size_t first_wrong = count;
    for (size_t i = 0; i < count; i++) {
        dataloader_next_batch(&loader);
        if (loader.inputs[0] != expected[i] && first_wrong == count) { first_wrong = i; }
    }
    CHECK(first_wrong == count, "shuffled batch %zu of %zu (%d epochs) is not llm.c's", first_wrong, count, EPOCHS);
    dataloader_free(&loader);
}

// runs `before` batches, saves the position and shuffle state, restores a new loader from it,
// and checks the next two epochs of batches match the uninterrupted loader
static void check_resume(int should_shuffle, int rank, int num_processes, int before) {
    size_t B = 2, T = 3;
    DataLoader loader, resumed;
    dataloader_init(&loader, g_pattern, B, T, rank, num_processes, should_shuffle, VOCAB);
    for (int i = 0; i < before; i++) { dataloader_next_batch(&loader); }
    const char* path = in_dir(g_dir, "loader_state.bin");
    FILE* fp = fopenCheck(path, "wb");
    dataloader_write_state(&loader, fp);
    fcloseCheck(fp);

    dataloader_init(&resumed, g_pattern, B, T, rank, num_processes, should_shuffle, VOCAB);
    dataloader_next_batch(&resumed);  // move it away from the start, so resume has to do the work
    fp = fopenCheck(path, "rb");
    dataloader_read_state(&resumed, fp, path);
    fcloseCheck(fp);
    dataloader_resume(&resumed, loader.current_shard_idx, loader.current_sample_idx, path);
    int same = 1;
    for (int i = 0; i < 2 * 120; i++) {
        dataloader_next_batch(&loader);
        dataloader_next_batch(&resumed);
        same &= memcmp(loader.inputs, resumed.inputs, B * T * sizeof(int)) == 0 &&
                memcmp(loader.targets, resumed.targets, B * T * sizeof(int)) == 0;
    }
    CHECK(same, "resume after %d batches (shuffle %d, rank %d of %d) diverges", before, should_shuffle, rank,
          num_processes);
    dataloader_free(&loader);
    dataloader_free(&resumed);
}

static void test_resume(void) {
    // B*T = 6: shard samples 50, 41, 33 for one rank; 25, 20, 16 for two
    int points[] = {0, 1, 49, 50, 51, 123, 124, 125, 200};
    for (size_t i = 0; i < sizeof(points) / sizeof(points[0]); i++) {
        check_resume(0, 0, 1, points[i]);
        check_resume(1, 0, 1, points[i]);
        check_resume(1, 1, 2, points[i] / 2);
    }
    // without read_state, a shuffled loader cannot resume into a shard of another size
    DataLoader loader;
    dataloader_init(&loader, g_pattern, 2, 3, 0, 1, 1, VOCAB);
    // epoch position 1 is another shard than position 0, and every shard has its own sample count
    CHECK_DIES("resume: shuffle state missing", "shuffle state", dataloader_resume(&loader, 1, 0, "test_state.bin"));
    CHECK_DIES("resume: shard out of range", "shard index 3", dataloader_resume(&loader, 3, 0, "test_state.bin"));
    CHECK_DIES("resume: sample out of range", "sample index 99", dataloader_resume(&loader, 0, 99, "test_state.bin"));
    dataloader_free(&loader);
}

static void test_shards_from_llmc(void) {
    DataLoader loader;
    char pattern[600];
    snprintf(pattern, sizeof(pattern), "%s/data_train_*.bin", g_py_dir);
    size_t B = 4, T = 16;
    dataloader_init(&loader, pattern, B, T, 0, 1, 0, 50257);
    CHECK(loader.num_tokens == 1777, "llm.c shards: %zu tokens", loader.num_tokens);
    int ok = 1;
    size_t sizes[2] = {1000, 777};
    for (int s = 0; s < 2; s++) {
        for (size_t k = 0; k < (sizes[s] - 1) / (B * T); k++) {
            dataloader_next_batch(&loader);
            for (size_t i = 0; i < B * T; i++) {
                size_t pos = k * B * T + i;
                ok &= loader.inputs[i] == (int)((pos * 31 + s * 1000 + 7) % 50000);
                ok &= loader.targets[i] == (int)(((pos + 1) * 31 + s * 1000 + 7) % 50000);
            }
        }
    }
    CHECK(ok, "llm.c shards do not read back as numpy wrote them");
    dataloader_free(&loader);
}

static void test_dataloader_bad_inputs(void) {
    DataLoader loader;
    uint16_t* tokens = make_tokens(0, 100);
    char pattern[600];
    snprintf(pattern, sizeof(pattern), "%s/nothing_here_*.bin", g_dir);
    CHECK_DIES("shards: no match", pattern, dataloader_init(&loader, pattern, 2, 4, 0, 1, 0, VOCAB));

    const char* magic = in_dir(g_dir, "bad_magic.bin");
    write_shard(magic, tokens, 100, 20240522, 1, 100);
    CHECK_DIES("shards: wrong magic", magic, dataloader_init(&loader, magic, 2, 4, 0, 1, 0, VOCAB));
    const char* version = in_dir(g_dir, "bad_version.bin");
    write_shard(version, tokens, 100, 20240520, 2, 100);
    CHECK_DIES("shards: wrong version", version, dataloader_init(&loader, version, 2, 4, 0, 1, 0, VOCAB));
    const char* truncated = in_dir(g_dir, "truncated.bin");
    write_shard(truncated, tokens, 90, 20240520, 1, 100);
    CHECK_DIES("shards: truncated (file)", truncated, dataloader_init(&loader, truncated, 2, 4, 0, 1, 0, VOCAB));
    CHECK_DIES("shards: truncated (lengths)", "1204 bytes", dataloader_init(&loader, truncated, 2, 4, 0, 1, 0, VOCAB));
    CHECK_DIES("shards: truncated (expected)", "1224 bytes", dataloader_init(&loader, truncated, 2, 4, 0, 1, 0, VOCAB));
    const char* header_only = in_dir(g_dir, "header_short.bin");
    write_shard(header_only, tokens, 0, 20240520, 1, 100);
    FILE* fp = fopenCheck(header_only, "wb");  // 10 bytes: not even a header
    fwriteCheck(tokens, 1, 10, fp);
    fcloseCheck(fp);
    CHECK_DIES("shards: shorter than header", header_only, dataloader_init(&loader, header_only, 2, 4, 0, 1, 0, VOCAB));
    const char* few = in_dir(g_dir, "few_tokens.bin");
    write_shard(few, tokens, 8, 20240520, 1, 8);
    CHECK_DIES("shards: fewer tokens than a batch", few, dataloader_init(&loader, few, 2, 4, 0, 1, 0, VOCAB));
    tokens[57] = VOCAB - 1;  // the largest valid id loads
    const char* edge_id = in_dir(g_dir, "edge_id.bin");
    write_shard(edge_id, tokens, 100, 20240520, 1, 100);
    dataloader_init(&loader, edge_id, 2, 4, 0, 1, 0, VOCAB);
    for (int i = 0; i < 8; i++) { dataloader_next_batch(&loader); }
    CHECK(loader.inputs[1] == VOCAB - 1, "a shard with token id V-1 must load and read back (got %d)", loader.inputs[1]);
    dataloader_free(&loader);
    tokens[57] = VOCAB;
    const char* big_id = in_dir(g_dir, "big_id.bin");
    write_shard(big_id, tokens, 100, 20240520, 1, 100);
    CHECK_DIES("shards: token id >= V (file)", big_id, dataloader_init(&loader, big_id, 2, 4, 0, 1, 0, VOCAB));
    CHECK_DIES("shards: token id >= V (position, id)", "token 57 has id 4000",
               dataloader_init(&loader, big_id, 2, 4, 0, 1, 0, VOCAB));
    // a bad token in a later shard is found when that shard is loaded
    const char* later_dir_pattern = in_dir(g_dir, "later_*.bin");
    uint16_t* good_tokens = make_tokens(0, 100);
    write_shard(in_dir(g_dir, "later_0.bin"), good_tokens, 100, 20240520, 1, 100);
    write_shard(in_dir(g_dir, "later_1.bin"), tokens, 100, 20240520, 1, 100);
    dataloader_init(&loader, later_dir_pattern, 2, 4, 0, 1, 0, VOCAB);
    for (int i = 0; i < 12; i++) { dataloader_next_batch(&loader); }  // all of later_0
    CHECK_DIES("shards: bad token in the next shard", "later_1.bin", dataloader_next_batch(&loader));
    dataloader_free(&loader);
    CHECK_DIES("shards: rank out of range", "rank 2", dataloader_init(&loader, g_pattern, 2, 4, 2, 2, 0, VOCAB));
    CHECK_DIES("shards: vocab too large", "vocab size", dataloader_init(&loader, g_pattern, 2, 4, 0, 1, 0, 70000));
    free(tokens);
    free(good_tokens);
}

// ----------------------------------------------------------------------------
// HellaSwag eval loader (file from make_llmc_files.py: 10 examples, token ids below 6000)

#define EVAL_TEST_VOCAB 50257

static int ex_label(int idx) { return (idx * 3) % 4; }
static int ex_context_length(int idx) { return 2 + idx % 4; }
static int ex_completion_length(int idx, int c) { return 1 + (idx + c) % 3; }

static void test_eval_loader(void) {
    EvalLoader loader;
    size_t B = 8, T = 9;
    evalloader_init(&loader, in_dir(g_py_dir, "hellaswag.bin"), B, T, 0, 1, EVAL_TEST_VOCAB);
    CHECK(loader.num_examples == 10 && loader.num_batches == 5, "examples %d batches %d", loader.num_examples,
          loader.num_batches);
    int content_ok = 1;
    float* losses = (float*)mallocCheck(B * T * sizeof(float));
    int total_correct = 0, expected_correct = 0;
    for (int batch = 0; batch < loader.num_batches; batch++) {
        evalloader_next_batch(&loader);
        for (int e = 0; e < 2; e++) {
            int idx = batch * 2 + e;
            content_ok &= loader.label[e] == ex_label(idx);
            int ctx = ex_context_length(idx);
            for (int c = 0; c < 4; c++) {
                size_t row = (size_t)(e * 4 + c) * T;
                int len = ex_completion_length(idx, c);
                for (int t = 0; t < (int)T; t++) {
                    int want_input = t < ctx ? 100 + idx * 10 + t : t < ctx + len ? 5000 + idx * 100 + c * 10 + (t - ctx) : 0;
                    int want_target = t + 1 < ctx ? 100 + idx * 10 + t + 1
                                      : t + 1 < ctx + len ? 5000 + idx * 100 + c * 10 + (t + 1 - ctx) : 0;
                    float want_mask = (t + 1 >= ctx && t + 1 < ctx + len) ? 1.0f : 0.0f;
                    content_ok &= loader.inputs[row + t] == want_input && loader.targets[row + t] == want_target &&
                                  loader.mask[row + t] == want_mask;
                }
            }
            // losses: masked positions of completion c get 1 + c, except that completion
            // (idx % 4) gets 0.5; in example 3 completion 3 only its last position is low
            for (int c = 0; c < 4; c++) {
                size_t row = (size_t)(e * 4 + c) * T;
                for (int t = 0; t < (int)T; t++) {
                    losses[row + t] = (c == idx % 4) ? 0.5f : 1.0f + (float)c;
                    if (loader.mask[row + t] == 0.0f) { losses[row + t] = -100.0f; }  // must be ignored
                }
            }
            expected_correct += (idx % 4) == ex_label(idx);
        }
        total_correct += evalloader_stat_losses(&loader, losses);
    }
    CHECK(content_ok, "eval batches differ from the examples written by hellaswag.py's layout");
    CHECK(total_correct == expected_correct && expected_correct > 0 && expected_correct < 10,
          "stat_losses counted %d correct, expected %d", total_correct, expected_correct);
    evalloader_reset(&loader);
    evalloader_next_batch(&loader);
    CHECK(loader.label[0] == ex_label(0) && loader.inputs[0] == 100, "reset does not restart at example 0");
    evalloader_free(&loader);

    // the mean over the completion decides, not the sum: a long completion with a lower mean wins
    evalloader_init(&loader, in_dir(g_py_dir, "hellaswag.bin"), 4, T, 0, 1, EVAL_TEST_VOCAB);
    evalloader_next_batch(&loader);  // example 0: label 0, completion lengths 1, 2, 3, 1
    for (size_t i = 0; i < 4 * T; i++) { losses[i] = 0.0f; }
    for (int c = 0; c < 4; c++) {
        for (size_t t = 0; t < T; t++) {
            if (loader.mask[c * T + t] != 0.0f) { losses[c * T + t] = (c == 2) ? 1.0f : 2.0f; }
        }
    }
    CHECK(evalloader_stat_losses(&loader, losses) == 0, "completion 2 has the lowest mean; label 0 must be wrong");
    for (size_t t = 0; t < T; t++) { if (loader.mask[t] != 0.0f) { losses[t] = 0.9f; } }
    CHECK(evalloader_stat_losses(&loader, losses) == 1, "completion 0 has the lowest mean now");
    evalloader_free(&loader);

    // B = 6 (not a multiple of 4, as llm.c allows): one example a batch, rows 4 and 5 empty and never scored
    evalloader_init(&loader, in_dir(g_py_dir, "hellaswag.bin"), 6, T, 0, 1, EVAL_TEST_VOCAB);
    CHECK(loader.num_batches == 10, "B=6: %d batches for 10 examples, expected 10", loader.num_batches);
    int spare_rows_empty = 1, labels_ok = 1;
    for (int b = 0; b < loader.num_batches; b++) {
        evalloader_next_batch(&loader);
        labels_ok &= loader.label[0] == ex_label(b);
        for (size_t i = 4 * T; i < 6 * T; i++) {
            spare_rows_empty &= loader.inputs[i] == 0 && loader.targets[i] == 0 && loader.mask[i] == 0.0f;
        }
    }
    CHECK(labels_ok && spare_rows_empty, "B=6: labels %d, spare rows empty %d", labels_ok, spare_rows_empty);
    evalloader_free(&loader);

    // three ranks: ceil(10 / 3) = 4 examples each, the last rank gets 2 and padding rows
    evalloader_init(&loader, in_dir(g_py_dir, "hellaswag.bin"), 8, T, 2, 3, EVAL_TEST_VOCAB);
    CHECK(loader.start_example_index == 8 && loader.end_example_index == 10 && loader.num_batches == 2,
          "rank 2 of 3: [%d, %d) in %d batches", loader.start_example_index, loader.end_example_index, loader.num_batches);
    evalloader_next_batch(&loader);
    CHECK(loader.label[0] == ex_label(8) && loader.label[1] == ex_label(9), "rank 2 first batch labels");
    evalloader_next_batch(&loader);
    int empty = loader.label[0] == -1 && loader.label[1] == -1;
    for (size_t i = 0; i < B * T; i++) { empty &= loader.mask[i] == 0.0f && loader.inputs[i] == 0; }
    CHECK(empty, "past the rank's examples the batch must be empty");
    CHECK(evalloader_stat_losses(&loader, losses) == 0, "an empty batch has no correct examples");
    evalloader_free(&loader);
    free(losses);
}

// writes `length` bytes as the file `name` in the test dir; returns its path
static const char* write_test_file(const char* name, const void* bytes, size_t length) {
    const char* path = in_dir(g_dir, name);
    FILE* fp = fopenCheck(path, "wb");
    fwriteCheck(bytes, 1, length, fp);
    fcloseCheck(fp);
    return path;
}

static void test_eval_bad_inputs(void) {
    EvalLoader loader;
    const char* good = in_dir(g_py_dir, "hellaswag.bin");
    FILE* fp = fopenCheck(good, "rb");
    long n = file_size_bytes(fp);
    unsigned char* bytes = (unsigned char*)mallocCheck((size_t)n + 4);
    freadCheck(bytes, 1, (size_t)n, fp);
    fcloseCheck(fp);

    CHECK_DIES("eval: B below 4", "holds no example", evalloader_init(&loader, good, 3, 16, 0, 1, EVAL_TEST_VOCAB));
    const char* missing = in_dir(g_dir, "no_such_eval.bin");
    CHECK_DIES("eval: missing file", missing, evalloader_init(&loader, missing, 4, 16, 0, 1, EVAL_TEST_VOCAB));
    CHECK_DIES("eval: completion longer than T", good, evalloader_init(&loader, good, 4, 4, 0, 1, EVAL_TEST_VOCAB));
    CHECK_DIES("eval: more processes than examples", good, evalloader_init(&loader, good, 4, 16, 0, 11, EVAL_TEST_VOCAB));
    // the contexts' ids are below 1000, the completions' are not: the error names the first
    CHECK_DIES("eval: completion token id past the vocab", "example 0, completion 0 token 0 has id 5000, not below the vocab size 1000",
               evalloader_init(&loader, good, 4, 16, 0, 1, 1000));
    // each variant: a copy of the good file, `length` bytes long, with the uint16 at `offset` set to `value`
    // (offset 0 with value 0: no patch)
    struct { const char* name; size_t offset; uint16_t value; long length; const char* what; } variants[] = {
        {"eval_magic.bin", 0, 7, n, "wrong magic"},
        {"eval_version.bin", 4, 2, n, "wrong version"},
        {"eval_longest.bin", 12, 2, n, "longest example mismatch"},
        {"eval_delimiter.bin", 1024, 65534, n, "bad delimiter"},
        {"eval_index.bin", 1024 + 4, 3, n, "wrong example index"},
        {"eval_label.bin", 1024 + 6, 4, n, "label out of range"},
        {"eval_completions.bin", 1024 + 8, 5, n, "not 4 completions"},
        {"eval_context.bin", 1024 + 10, 200, n, "context overruns"},
        {"eval_token.bin", 1024 + 12, 65535, n, "context token id past the vocab"},
        {"eval_truncated.bin", 0, 0, n - 2, "truncated"},
        {"eval_trailing.bin", 0, 0, n + 2, "trailing bytes"},
    };
    for (size_t i = 0; i < sizeof(variants) / sizeof(variants[0]); i++) {
        unsigned char* copy = (unsigned char*)mallocCheck((size_t)n + 4);
        memcpy(copy, bytes, (size_t)n);
        memset(copy + n, 0, 4);
        if (variants[i].value != 0) { memcpy(copy + variants[i].offset, &variants[i].value, 2); }
        const char* path = write_test_file(variants[i].name, copy, (size_t)variants[i].length);
        free(copy);
        CHECK_DIES(variants[i].what, path, evalloader_init(&loader, path, 4, 16, 0, 1, EVAL_TEST_VOCAB));
    }
    // a count of examples the file cannot hold is refused before anything is allocated for them
    int32_t claimed = INT32_MAX, saved_count;
    memcpy(&saved_count, bytes + 8, 4);
    memcpy(bytes + 8, &claimed, 4);
    const char* count_path = write_test_file("eval_count.bin", bytes, (size_t)n);
    memcpy(bytes + 8, &saved_count, 4);
    CHECK_DIES("eval: example count past the file", "claims 2147483647 examples",
               evalloader_init(&loader, count_path, 4, 16, 0, 1, EVAL_TEST_VOCAB));
    // an example whose <EXAMPLE_BYTES> disagrees with its fields is named as such
    uint16_t example_bytes;
    memcpy(&example_bytes, bytes + 1024 + 2, 2);
    example_bytes += 2;
    memcpy(bytes + 1024 + 2, &example_bytes, 2);
    const char* claims = write_test_file("eval_claims.bin", bytes, (size_t)n);
    CHECK_DIES("eval: example bytes vs fields", "its fields take", evalloader_init(&loader, claims, 4, 16, 0, 1, EVAL_TEST_VOCAB));
    example_bytes -= 1;  // odd: half of it rounds down to the right count, so only the parity check refuses it
    memcpy(bytes + 1024 + 2, &example_bytes, 2);
    const char* odd = write_test_file("eval_odd_bytes.bin", bytes, (size_t)n);
    CHECK_DIES("eval: an odd byte count", "claims", evalloader_init(&loader, odd, 4, 16, 0, 1, EVAL_TEST_VOCAB));
    example_bytes -= 1;
    memcpy(bytes + 1024 + 2, &example_bytes, 2);
    // completion 0 of length 0 (its length field zeroed): an empty completion, whose mean loss would be 0/0
    uint16_t context_length, zero = 0;
    memcpy(&context_length, bytes + 1024 + 10, 2);
    size_t completion0 = 1024 + 2 * (6 + (size_t)context_length);
    uint16_t saved_length;
    memcpy(&saved_length, bytes + completion0, 2);
    memcpy(bytes + completion0, &zero, 2);
    const char* empty = write_test_file("eval_empty_completion.bin", bytes, (size_t)n);
    memcpy(bytes + completion0, &saved_length, 2);
    CHECK_DIES("eval: an empty completion", "example 0, completion 0 is empty",
               evalloader_init(&loader, empty, 4, 16, 0, 1, EVAL_TEST_VOCAB));
    // as many processes as examples: one each, not refused
    CHECK_LIVES("eval: one example per process",
                evalloader_init(&loader, in_dir(g_py_dir, "hellaswag.bin"), 4, 16, 9, 10, EVAL_TEST_VOCAB));
    free(bytes);
}

// a shuffle trailer whose generator has drawn exactly a whole state's worth since its twist (llm.c writes next
// = 624, left = 1 then; ours: index = N) is a valid one: read back, the next draws are the same
static void test_read_state_at_a_full_state(void) {
    DataLoader loader, resumed;
    dataloader_init(&loader, g_pattern, 2, 3, 0, 1, 1, VOCAB);
    while (loader.shuffle_rng.index != MT19937_N) { randint32(&loader.shuffle_rng); }
    const char* path = in_dir(g_dir, "loader_state_full.bin");
    FILE* fp = fopenCheck(path, "wb");
    dataloader_write_state(&loader, fp);
    fcloseCheck(fp);
    dataloader_init(&resumed, g_pattern, 2, 3, 0, 1, 1, VOCAB);
    fp = fopenCheck(path, "rb");
    dataloader_read_state(&resumed, fp, path);
    fcloseCheck(fp);
    CHECK(resumed.shuffle_rng.index == MT19937_N && randint32(&resumed.shuffle_rng) == randint32(&loader.shuffle_rng),
          "a trailer at a full state (index %u) read back to index %u or other draws", MT19937_N, resumed.shuffle_rng.index);
    dataloader_free(&loader);
    dataloader_free(&resumed);
}

// ----------------------------------------------------------------------------
// edges the tests above do not reach (found by mutation testing)

// a shard of exactly k*B*T tokens holds k-1 samples, not k: the last sample's last target would be
// the token past the shard's end. Catches a sample count without the -1 for the last target.
static void test_exact_multiple_shard(void) {
    uint16_t* tokens = make_tokens(0, 100);
    const char* exact = in_dir(g_dir, "exact_multiple.bin");
    write_shard(exact, tokens, 100, 20240520, 1, 100);
    DataLoader loader;
    dataloader_init(&loader, exact, 2, 5, 0, 1, 0, VOCAB);  // B*T = 10: 100 tokens hold 9 samples
    CHECK(dataloader_epoch_batches(&loader) == 9, "a 100-token shard at B*T=10 has %zu batches, expected 9",
          dataloader_epoch_batches(&loader));
    int ok = 1;
    for (int k = 0; k < 9; k++) {
        dataloader_next_batch(&loader);
        ok &= batch_is_contiguous(&loader) && loader.inputs[0] == k * 10;
    }
    dataloader_next_batch(&loader);
    CHECK(ok && loader.inputs[0] == 0, "a shard of exactly 10 samples' tokens must wrap after 9 (got %d)", loader.inputs[0]);
    dataloader_free(&loader);
    free(tokens);
}

/*
A shard shorter than one sample (here 5 tokens among 301 and 199, and a 0-token one) holds
none: the walk passes it by, in order and shuffled, at the epoch's start and in its middle, and
dataloader_seek_batches lands where that many batches land, so resumes agree. Catches a loader
that refuses such a glob (llm.c's), reads a short shard (out of its bounds), or a seek that
counts it.
*/
static void test_short_shards_passed_over(void) {
    const size_t sizes[4] = {5, 301, 0, 199};
    char pattern[600];
    snprintf(pattern, sizeof(pattern), "%s/short_*.bin", g_dir);
    for (int s = 0; s < 4; s++) {
        char name[64];
        snprintf(name, sizeof(name), "short_%d.bin", s);
        uint16_t* tokens = make_tokens(s, sizes[s]);
        write_shard(in_dir(g_dir, name), tokens, sizes[s], 20240520, 1, (int32_t)sizes[s]);
        free(tokens);
    }
    const size_t B = 2, T = 4;  // a sample is 8 tokens and one more: 37 samples of shard 1, 24 of shard 3
    enum { EPOCH = 37 + 24, BATCHES = 3 * EPOCH };
    for (int shuffle = 0; shuffle < 2; shuffle++) {
        DataLoader loader;
        dataloader_init(&loader, pattern, B, T, 0, 1, shuffle, VOCAB);
        CHECK(dataloader_epoch_batches(&loader) == EPOCH, "shuffle %d: %zu epoch batches, expected 37 + 24", shuffle,
              dataloader_epoch_batches(&loader));
        int first_token[BATCHES], from[4] = {0, 0, 0, 0}, contiguous = 1;
        for (int k = 0; k < BATCHES; k++) {
            dataloader_next_batch(&loader);
            contiguous &= batch_is_contiguous(&loader);
            first_token[k] = loader.inputs[0];
            from[loader.inputs[0] / 1000]++;
        }
        dataloader_free(&loader);
        CHECK(contiguous, "shuffle %d: a batch is not a contiguous piece of one shard", shuffle);
        CHECK(from[0] == 0 && from[2] == 0 && from[1] == 3 * 37 && from[3] == 3 * 24,
              "shuffle %d: three epochs read %d %d %d %d batches of the four shards, expected 0 111 0 72", shuffle,
              from[0], from[1], from[2], from[3]);
        // a seek to k batches, then one batch: the walk's batch k + 1, at shard ends and epoch ends too
        int seeks_agree = 1;
        for (int k = 0; k < BATCHES; k++) {
            if (!(k % 5 == 0 || k % EPOCH == 36 || k % EPOCH == 37 || k % EPOCH == 23 || k % EPOCH == 24)) { continue; }
            DataLoader seeker;
            dataloader_init(&seeker, pattern, B, T, 0, 1, shuffle, VOCAB);
            dataloader_seek_batches(&seeker, (size_t)k);
            dataloader_next_batch(&seeker);
            if (seeker.inputs[0] != first_token[k]) {
                seeks_agree = 0;
                printf("  shuffle %d: seek to %d batches reads token %d first, the walk %d\n", shuffle, k,
                       seeker.inputs[0], first_token[k]);
            }
            dataloader_free(&seeker);
        }
        CHECK(seeks_agree, "shuffle %d: dataloader_seek_batches lands elsewhere than the walk", shuffle);
    }
    DataLoader loader;
    snprintf(pattern, sizeof(pattern), "%s/short_[02].bin", g_dir);
    CHECK_DIES("shards: none holds a batch", "no token shard matching", dataloader_init(&loader, pattern, B, T, 0, 1, 0, VOCAB));
    CHECK_DIES("shards: none holds a batch (the largest named)", "short_0.bin", dataloader_init(&loader, pattern, B, T, 0, 1, 0, VOCAB));
}

// dataloader_epoch_batches counts every shard (the trainer's val batches come from it). Catches a
// count that leaves a shard out.
static void test_epoch_batches(void) {
    DataLoader loader;
    dataloader_init(&loader, g_pattern, 2, 4, 0, 1, 0, VOCAB);
    size_t expected = shard_samples(0, 2, 4, 1) + shard_samples(1, 2, 4, 1) + shard_samples(2, 2, 4, 1);
    CHECK(dataloader_epoch_batches(&loader) == expected, "epoch batches %zu, expected %zu",
          dataloader_epoch_batches(&loader), expected);
    CHECK(dataloader_eval_batches(&loader, 5) == 5, "-m 5 of %zu batches must read 5", expected);
    CHECK(dataloader_eval_batches(&loader, -1) == (int)expected, "-m -1 must read the whole split");
    CHECK(dataloader_eval_batches(&loader, 1000) == (int)expected, "-m past the split must read the split once");
    dataloader_free(&loader);
}

// -a 1's batch is the first batch of a fresh loader with the same shuffle flag and rank, and the
// loader's own position stays. Catches a fresh loader made without shuffling (or another rank).
static void test_fill_first_batch(void) {
    for (int shuffle = 0; shuffle < 2; shuffle++) {
        DataLoader loader, fresh;
        dataloader_init(&fresh, g_pattern, 2, 3, 1, 2, shuffle, VOCAB);
        dataloader_next_batch(&fresh);
        dataloader_init(&loader, g_pattern, 2, 3, 1, 2, shuffle, VOCAB);
        for (int i = 0; i < 7; i++) { dataloader_next_batch(&loader); }
        size_t shard = loader.current_shard_idx, sample = loader.current_sample_idx;
        dataloader_fill_first_batch(&loader, g_pattern);
        CHECK(memcmp(loader.inputs, fresh.inputs, 6 * sizeof(int)) == 0 &&
              memcmp(loader.targets, fresh.targets, 6 * sizeof(int)) == 0,
              "fill_first_batch (shuffle %d) is not a fresh loader's first batch", shuffle);
        CHECK(loader.current_shard_idx == shard && loader.current_sample_idx == sample,
              "fill_first_batch (shuffle %d) moved the loader", shuffle);
        dataloader_free(&loader);
        dataloader_free(&fresh);
    }
}

// header and token checks the bad-input test does not reach: each must die with its own message
static void test_dataloader_more_bad_inputs(void) {
    DataLoader loader;
    uint16_t* tokens = make_tokens(0, 100);
    // catches a dropped negative-count check (the count would wrap to a huge size_t)
    const char* negative = in_dir(g_dir, "negative_count.bin");
    write_shard(negative, tokens, 100, 20240520, 1, -5);
    CHECK_DIES("shards: negative token count", "negative token count -5",
               dataloader_init(&loader, negative, 2, 4, 0, 1, 0, VOCAB));
    // catches a length check that accepts a file longer than its header says (garbage after the tokens)
    const char* longer = in_dir(g_dir, "longer.bin");
    write_shard(longer, tokens, 100, 20240520, 1, 90);
    CHECK_DIES("shards: longer than the header says", "header says 90 tokens",
               dataloader_init(&loader, longer, 2, 4, 0, 1, 0, VOCAB));
    // catches a dropped shorter-than-header check (the header read would fail with a generic EOF)
    const char* tiny = in_dir(g_dir, "tiny.bin");
    FILE* fp = fopenCheck(tiny, "wb");
    fwriteCheck(tokens, 1, 10, fp);
    fcloseCheck(fp);
    CHECK_DIES("shards: shorter than header (message)", "shorter than its 1024-byte header",
               dataloader_init(&loader, tiny, 2, 4, 0, 1, 0, VOCAB));
    // catches a token scan that stops before the last token
    tokens[99] = VOCAB;
    const char* last_bad = in_dir(g_dir, "last_bad.bin");
    write_shard(last_bad, tokens, 100, 20240520, 1, 100);
    CHECK_DIES("shards: token id >= V in the last position", "token 99 has id 4000",
               dataloader_init(&loader, last_bad, 2, 4, 0, 1, 0, VOCAB));
    tokens[99] = 99;
    // catches a dropped vocab bound (65537 cannot be a uint16 token's vocab)
    CHECK_DIES("shards: vocab 65537", "vocab size 65537", dataloader_init(&loader, g_pattern, 2, 4, 0, 1, 0, 65537));
    // catches a dropped "changed during the run" check: a later shard rewritten with another length
    const char* grow_pattern = in_dir(g_dir, "grow_*.bin");
    write_shard(in_dir(g_dir, "grow_0.bin"), tokens, 100, 20240520, 1, 100);
    write_shard(in_dir(g_dir, "grow_1.bin"), tokens, 100, 20240520, 1, 100);
    dataloader_init(&loader, grow_pattern, 2, 4, 0, 1, 0, VOCAB);
    write_shard(in_dir(g_dir, "grow_1.bin"), tokens, 90, 20240520, 1, 90);
    for (int i = 0; i < 12; i++) { dataloader_next_batch(&loader); }  // all of grow_0
    CHECK_DIES("shards: a shard changed during the run", "when the run started", dataloader_next_batch(&loader));
    dataloader_free(&loader);
    free(tokens);
}

// writes a shuffled loader's trailer, lets `corrupt` change it, and checks dataloader_read_state dies
// with `must_contain`. The trailer: u64 shards, int[shards], u64 samples, int[samples], llm.c's rng.
typedef void (*TrailerCorruption)(unsigned char* bytes, long* length, size_t shards, size_t samples);
static void check_trailer_dies(const char* what, const char* must_contain, TrailerCorruption corrupt) {
    DataLoader loader;
    dataloader_init(&loader, g_pattern, 2, 3, 0, 1, 1, VOCAB);
    for (int i = 0; i < 5; i++) { dataloader_next_batch(&loader); }
    const char* path = in_dir(g_dir, "corrupt_trailer.bin");
    FILE* fp = fopenCheck(path, "wb");
    dataloader_write_state(&loader, fp);
    fcloseCheck(fp);
    size_t shards = loader.num_shards, samples = loader.num_intra_shard_indices;
    unsigned char bytes[8192];
    fp = fopenCheck(path, "rb");
    long length = (long)fread(bytes, 1, sizeof(bytes), fp);
    fcloseCheck(fp);
    corrupt(bytes, &length, shards, samples);
    fp = fopenCheck(path, "wb");
    fwriteCheck(bytes, 1, (size_t)length, fp);
    fcloseCheck(fp);
    DataLoader resumed;
    dataloader_init(&resumed, g_pattern, 2, 3, 0, 1, 1, VOCAB);
    fp = fopenCheck(path, "rb");
    CHECK_DIES(what, must_contain, dataloader_read_state(&resumed, fp, path));
    fcloseCheck(fp);
    dataloader_free(&resumed);
    dataloader_free(&loader);
}
static int* trailer_shard_order_(unsigned char* bytes) { return (int*)(bytes + 8); }
static int* trailer_sample_order_(unsigned char* bytes, size_t shards) { return (int*)(bytes + 8 + 4 * shards + 8); }
static void corrupt_repeat_(unsigned char* b, long* n, size_t shards, size_t samples) {
    (void)n; (void)samples; int* order = trailer_shard_order_(b); order[1] = order[0]; (void)shards;
}
static void corrupt_range_(unsigned char* b, long* n, size_t shards, size_t samples) {
    (void)n; trailer_sample_order_(b, shards)[0] = (int)samples;
}
static void corrupt_shard_count_(unsigned char* b, long* n, size_t shards, size_t samples) {
    (void)n; (void)samples; uint64_t count = shards + 1; memcpy(b, &count, 8);
}
static void corrupt_sample_count_(unsigned char* b, long* n, size_t shards, size_t samples) {
    (void)n; (void)samples; uint64_t count = 1000000; memcpy(b + 8 + 4 * shards, &count, 8);
}
static void corrupt_matrix_(unsigned char* b, long* n, size_t shards, size_t samples) {
    (void)shards; (void)samples; uint32_t bad = 1; memcpy(b + *n - 4, &bad, 4);  // matrix_a[1]
}
static void corrupt_truncate_rng_(unsigned char* b, long* n, size_t shards, size_t samples) {
    (void)b; (void)shards; (void)samples; *n -= 8;
}
// each check on a shuffle trailer read back: catches any one of them dropped or off by one
static void test_read_state_bad_trailers(void) {
    check_trailer_dies("trailer: shard order repeats", "repeats", corrupt_repeat_);
    check_trailer_dies("trailer: sample index == count", "sample order entry 0 is", corrupt_range_);
    check_trailer_dies("trailer: another shard count", "the run had 4 shards", corrupt_shard_count_);
    check_trailer_dies("trailer: sample count past the file", "claims 1000000 samples", corrupt_sample_count_);
    check_trailer_dies("trailer: rng constants", "rng state is corrupt", corrupt_matrix_);
    check_trailer_dies("trailer: rng truncated", "(rng state)", corrupt_truncate_rng_);
}

// eval loader edges (found by mutation testing)
static void write_eval_variant(const char* path, const unsigned char* bytes, long length, size_t offset, uint16_t value,
                               int patch) {
    unsigned char* copy = (unsigned char*)mallocCheck((size_t)length + 4);
    memcpy(copy, bytes, (size_t)length);
    if (patch) { memcpy(copy + offset, &value, 2); }
    FILE* fp = fopenCheck(path, "wb");
    fwriteCheck(copy, 1, (size_t)length, fp);
    fcloseCheck(fp);
    free(copy);
}
static void test_eval_edges(void) {
    EvalLoader loader;
    const char* good = in_dir(g_py_dir, "hellaswag.bin");
    // the longest example (context 5 + completion 3) fits T=8 exactly. Catches a fit check of >= T
    evalloader_init(&loader, good, 4, 8, 0, 1, EVAL_TEST_VOCAB);
    CHECK(loader.num_examples == 10, "T=8 exactly fits the longest example: %d examples", loader.num_examples);
    evalloader_free(&loader);
    // id 5000 (example 0, completion 0, token 0) is not below V=5000. Catches a token check of > V
    CHECK_DIES("eval: completion token id == V", "example 0, completion 0 token 0 has id 5000",
               evalloader_init(&loader, good, 4, 16, 0, 1, 5000));
    // B=12: 3 examples a batch, so 10 examples take ceil(10/3) = 4 batches, the last holding example 9 alone.
    // Catches a floor division of the batch count (example 9 would never be scored)
    evalloader_init(&loader, good, 12, 16, 0, 1, EVAL_TEST_VOCAB);
    CHECK(loader.num_batches == 4, "B=12: %d batches for 10 examples, expected 4", loader.num_batches);
    for (int b = 0; b < 4; b++) { evalloader_next_batch(&loader); }
    CHECK(loader.label[0] == ex_label(9) && loader.label[1] == -1 && loader.label[2] == -1,
          "B=12: the 4th batch holds example 9 alone (labels %d %d %d)", loader.label[0], loader.label[1], loader.label[2]);
    evalloader_free(&loader);

    FILE* fp = fopenCheck(good, "rb");
    long n = file_size_bytes(fp);
    unsigned char* bytes = (unsigned char*)mallocCheck((size_t)n + 4);
    freadCheck(bytes, 1, (size_t)n, fp);
    fcloseCheck(fp);
    memset(bytes + n, 0, 4);
    // one stray byte after the examples. Catches a dropped whole-uint16 check (the byte would be ignored)
    const char* odd = in_dir(g_dir, "eval_odd.bin");
    write_eval_variant(odd, bytes, n + 1, 0, 0, 0);
    CHECK_DIES("eval: an odd byte count", "not a whole number of uint16",
               evalloader_init(&loader, odd, 4, 16, 0, 1, EVAL_TEST_VOCAB));
    // a context of 0 tokens. Catches a dropped empty-context check (it would fail later as a bad completion)
    const char* no_context = in_dir(g_dir, "eval_no_context.bin");
    write_eval_variant(no_context, bytes, n, 1024 + 10, 0, 1);
    CHECK_DIES("eval: empty context", "has a context of 0 tokens",
               evalloader_init(&loader, no_context, 4, 16, 0, 1, EVAL_TEST_VOCAB));
    free(bytes);
}

// ----------------------------------------------------------------------------
// boundaries the tests above do not reach (found by boundary-mutation testing)

// a shard of exactly num_processes*B*T+1 tokens holds one sample, the smallest that does; at 65536 every
// uint16 id is below the vocab, so the largest, 65535, loads. Catches a sample-size check of <= (the glob
// refused) and a vocab bound of >= 65536
static void test_smallest_shard_and_largest_vocab(void) {
    uint16_t* tokens = make_tokens(0, 9);
    tokens[8] = 65535;  // the last target
    const char* one_sample = in_dir(g_dir, "one_sample.bin");
    write_shard(one_sample, tokens, 9, 20240520, 1, 9);
    DataLoader loader;
    dataloader_init(&loader, one_sample, 2, 4, 0, 1, 0, 65536);  // a sample is 8 tokens and one more
    CHECK(dataloader_epoch_batches(&loader) == 1, "a shard of B*T+1 tokens holds %zu batches, expected 1",
          dataloader_epoch_batches(&loader));
    dataloader_next_batch(&loader);
    CHECK(loader.inputs[0] == 0 && loader.inputs[7] == 7 && loader.targets[7] == 65535,
          "the one sample reads %d..%d, last target %d; expected 0..7, 65535", loader.inputs[0], loader.inputs[7],
          loader.targets[7]);
    dataloader_free(&loader);
    free(tokens);
    CHECK_DIES("shards: vocab 0", "vocab size 0 is not in 1..65536",
               dataloader_init(&loader, g_pattern, 2, 4, 0, 1, 0, 0));
}

// the trainers' note on short shards: how many of the glob's, and the smallest named; nothing when there are
// none. -m equal to the split's batches reads them with no note. Catches the count or the early return
// inverted, and a note printed for -m at the split's size
static void test_notes(void) {
    char pattern[600], text[1024];
    snprintf(pattern, sizeof(pattern), "%s/short_*.bin", g_dir);  // test_short_shards_passed_over's: 5, 301, 0, 199 tokens
    DataLoader loader;
    dataloader_init(&loader, pattern, 2, 4, 0, 1, 0, VOCAB);
    STDOUT_OF(text, dataloader_note_short_shards(&loader, "-i"));
    CHECK(strstr(text, "note: -i: 2 of the 4 token shards hold fewer than one batch's num_processes*B*T+1 = 9 tokens") &&
          strstr(text, "short_2.bin', 0 tokens)"), "short shards' note: [%s]", text);
    dataloader_free(&loader);
    dataloader_init(&loader, g_pattern, 2, 4, 0, 1, 0, VOCAB);
    STDOUT_OF(text, dataloader_note_short_shards(&loader, "-i"));
    CHECK(text[0] == '\0', "no shard is short, yet a note: [%s]", text);
    int all = (int)dataloader_epoch_batches(&loader), batches = 0;
    STDOUT_OF(text, batches = dataloader_eval_batches(&loader, all));
    CHECK(batches == all && text[0] == '\0', "-m %d of %d batches: %d read, note [%s]", all, all, batches, text);
    dataloader_free(&loader);
}

// -x -1's steps as an int: an epoch of INT_MAX steps runs, one more dies. The shard sizes are set as their
// headers would give them (a shard of 2^31 tokens is 4 GB). Catches a bound of >= INT_MAX
static void test_epoch_steps_bound(void) {
    DataLoader loader;
    dataloader_init(&loader, g_pattern, 1, 1, 0, 1, 0, VOCAB);
    loader.file_num_tokens[0] = (size_t)INT_MAX + 1;  // INT_MAX samples of B*T = 1
    loader.file_num_tokens[1] = loader.file_num_tokens[2] = 0;
    CHECK(dataloader_epoch_steps(&loader, 1) == INT_MAX, "an epoch of INT_MAX batches: %d steps",
          dataloader_epoch_steps(&loader, 1));
    loader.file_num_tokens[1] = 2;  // one sample more
    CHECK_DIES("-x -1: an epoch past INT_MAX steps", "more than 2147483647", dataloader_epoch_steps(&loader, 1));
    dataloader_free(&loader);
}

// a trailer cut at each boundary of its parts names the part that is missing, in dataloader_read_state and in
// dataloader_skip_state (state_file_index's). Catches each length check of <= (or >=), which names the part before
static void check_trailer_cut(long length, const char* read_says, const char* skip_says) {
    DataLoader loader, resumed;
    dataloader_init(&loader, g_pattern, 2, 3, 0, 1, 1, VOCAB);
    const char* path = in_dir(g_dir, "cut_trailer.bin");
    FILE* fp = fopenCheck(path, "wb");
    dataloader_write_state(&loader, fp);
    fcloseCheck(fp);
    CHECK(truncate(path, length) == 0, "cannot cut %s to %ld bytes", path, length);
    dataloader_init(&resumed, g_pattern, 2, 3, 0, 1, 1, VOCAB);
    CHECK_DIES(read_says, read_says, dataloader_read_state(&resumed, fopenCheck(path, "rb"), path));
    CHECK_DIES(skip_says, skip_says, dataloader_skip_state(fopenCheck(path, "rb"), path));
    dataloader_free(&resumed);
    dataloader_free(&loader);
}
static void test_trailer_cut_at_each_part(void) {
    DataLoader loader;
    dataloader_init(&loader, g_pattern, 2, 3, 0, 1, 1, VOCAB);
    long shards = (long)loader.num_shards, samples = (long)loader.num_intra_shard_indices;
    dataloader_free(&loader);
    check_trailer_cut(8, "(shard order)", "(shard order)");
    check_trailer_cut(8 + 4 * shards, "(sample count)", "(sample order)");
    check_trailer_cut(8 + 4 * shards + 8, "more than the file holds", "(sample order)");
    check_trailer_cut(8 + 4 * shards + 8 + 4 * samples, "(rng state)", "(rng state)");
}

// eval loader boundaries: a rank equal to the process count and a vocab of 0 are refused by name, and equal mean
// losses go to the first completion, as in llm.c (so example 0, label 0, is right). Catches bounds of > and < 0,
// and ties broken toward the later completion
static void test_eval_boundaries(void) {
    EvalLoader loader;
    const char* good = in_dir(g_py_dir, "hellaswag.bin");
    CHECK_DIES("eval: rank == process count", "process rank 1 is not in [0, 1)",
               evalloader_init(&loader, good, 4, 16, 1, 1, EVAL_TEST_VOCAB));
    CHECK_DIES("eval: vocab 0", "vocab size 0 must be positive", evalloader_init(&loader, good, 4, 16, 0, 1, 0));
    size_t T = 16;
    evalloader_init(&loader, good, 4, T, 0, 1, EVAL_TEST_VOCAB);
    evalloader_next_batch(&loader);  // example 0: label 0
    float* losses = (float*)mallocCheck(4 * T * sizeof(float));
    for (size_t i = 0; i < 4 * T; i++) { losses[i] = 2.0f; }
    CHECK(loader.label[0] == 0 && evalloader_stat_losses(&loader, losses) == 1,
          "four completions of equal mean loss: the first (label 0) must be the answer");
    free(losses);
    evalloader_free(&loader);
}

int main(void) {
    test_make_temp_dir(g_dir, sizeof(g_dir));
    if (!test_make_llmc_files(g_dir, g_py_dir, sizeof(g_py_dir))) { return test_summary("test_dataloader"); }
    write_good_shards();

    test_unshuffled_order();
    test_shuffled_order();
    test_shuffled_order_is_llmcs();
    test_resume();
    test_shards_from_llmc();
    test_dataloader_bad_inputs();
    test_eval_loader();
    test_eval_bad_inputs();
    test_exact_multiple_shard();
    test_epoch_batches();
    test_short_shards_passed_over();
    test_read_state_at_a_full_state();
    test_fill_first_batch();
    test_dataloader_more_bad_inputs();
    test_read_state_bad_trailers();
    test_eval_edges();
    test_smallest_shard_and_largest_vocab();
    test_notes();
    test_epoch_steps_bound();
    test_trailer_cut_at_each_part();
    test_eval_boundaries();

    test_remove_dir(g_py_dir);
    test_remove_dir(g_dir);
    CHECK(llm8_open_file_count() == 0, "%d files opened by fopenCheck are not closed by fcloseCheck", llm8_open_file_count());
    return test_summary("test_dataloader");
}
