/*
test_reshard.c: resuming a checkpoint written with N ranks on M ranks (llmc/state_reshard.h),
on the CPU. The N state files are written with the trainers' writer (train_state_write) from
one one-rank state; every rank of M reads its window back through the trainer's entry
(train_state_read_checkpoint), which must equal the slice of the one-rank state bit for bit
(or, converting, the slice of the one-rank conversion), for N, M in {1, 2, 3, 8}, a d12-like
shape and one with C off the 256 grid, fp32 AdamW and every -qs, with and without master.
Also: the per-rank extra section comes from old rank r % N, the loader lands exactly where
an M-rank loader is after the same batches (shuffled too), and broken checkpoints (a missing
file, a file of another step or rank count, another -qs) die with one line naming them.
*/
#include <stdlib.h>
#include <sys/stat.h>
#include "llmc/state_reshard.h"
#include "test/test_harness.h"
#include "test/test_harness_fork.h"

static const int RANK_COUNTS[] = {1, 2, 3, 8};
#define NUM_RANK_COUNTS (int)(sizeof(RANK_COUNTS) / sizeof(RANK_COUNTS[0]))
#define TEST_B 2
#define TEST_T 8
#define TEST_VOCAB 300
#define BATCHES_PER_STEP_ONE_RANK 24   // the global batch: 24 B*T sequences, so 24 / N per rank
#define TEST_STEP 5
#define EXTRA_BYTES 64

static char g_dir[256];
static char g_pattern[300];

static const char* in_dir(const char* dir, const char* name) {
    static char paths[4][1024];
    static int next = 0;
    char* out = paths[next++ % 4];
    snprintf(out, sizeof(paths[0]), "%s/%s", dir, name);
    return out;
}

// two token shards of different lengths (the steps below run past both: a new epoch)
static void write_shards(void) {
    const size_t lengths[2] = {700, 905};
    for (int s = 0; s < 2; s++) {
        char name[64];
        snprintf(name, sizeof(name), "tokens_%03d.bin", s);
        FILE* fp = fopenCheck(in_dir(g_dir, name), "wb");
        int32_t header[DATA_HEADER_INTS];
        memset(header, 0, sizeof(header));
        header[0] = DATA_SHARD_MAGIC;
        header[1] = DATA_SHARD_VERSION;
        header[2] = (int32_t)lengths[s];
        fwriteCheck(header, sizeof(int32_t), DATA_HEADER_INTS, fp);
        for (size_t i = 0; i < lengths[s]; i++) {
            uint16_t token = (uint16_t)((i * 7 + (size_t)s * 101) % TEST_VOCAB);
            fwriteCheck(&token, sizeof(token), 1, fp);
        }
        fcloseCheck(fp);
    }
    snprintf(g_pattern, sizeof(g_pattern), "%s/tokens_*.bin", g_dir);
}

static void loader_init(DataLoader* loader, int rank, int num_ranks, int shuffle) {
    dataloader_init(loader, g_pattern, TEST_B, TEST_T, rank, num_ranks, shuffle, TEST_VOCAB);
}

static size_t batches_per_step(int num_ranks) { return BATCHES_PER_STEP_ONE_RANK / (size_t)num_ranks; }

// a loader of rank r of M after `step` steps of real batches: what the resharded loader must equal
static void loader_after_steps(DataLoader* loader, int rank, int num_ranks, int shuffle, int step) {
    loader_init(loader, rank, num_ranks, shuffle);
    for (size_t b = 0; b < (size_t)step * batches_per_step(num_ranks); b++) { dataloader_next_batch(loader); }
}

// ----------------------------------------------------------------------------
// the one-rank state, and which rank counts a run could use with it

typedef struct {
    GPT2Config cfg;
    const char* name;
    int eight_bit;                 // the files keep 8-bit states (else fp32 AdamW moments)
    Adamw8Selection selection;     // the 8-bit files' -qs
    Adamw8Layout model;            // for selection (fp32 files: every tensor 32-bit)
    float* m;                      // the fp32 moments of every parameter (fp32 files)
    float* v;
    float* master;
    Adamw8States states;           // the 8-bit states of the whole model: m and v quantized (8-bit files)
    float* dequantized_m;          // states dequantized: what a plain AdamW run reads from 8-bit files
    float* dequantized_v;
} OneRank;

static float uniform_pm1(uint32_t stream, size_t i) {  // in [-1, 1)
    return 2.0f * bits_as_float(0x3f800000u | (random_u32(stream, (uint32_t)i) >> 9)) - 3.0f;
}

static void one_rank_init(OneRank* s, const GPT2Config* cfg, const char* name, int eight_bit, Adamw8Selection selection) {
    memset(s, 0, sizeof(*s));
    s->cfg = *cfg;
    s->name = name;
    s->eight_bit = eight_bit;
    s->selection = selection;
    adamw8_layout_init(&s->model, cfg, eight_bit ? selection : ADAMW8_SELECT_NONE);
    size_t n = s->model.num_parameters;
    s->m = (float*)mallocCheck(n * sizeof(float));
    s->v = (float*)mallocCheck(n * sizeof(float));
    s->master = (float*)mallocCheck(n * sizeof(float));
    for (size_t i = 0; i < n; i++) {
        s->m[i] = 1e-4f * uniform_pm1(11u, i);
        s->v[i] = 1e-8f * (1.0f + uniform_pm1(12u, i));
        s->master[i] = 0.02f * uniform_pm1(13u, i);
    }
    Quant8Maps maps;
    quant8_maps_init(&maps);
    Adamw8Layout converted;  // the layout conversions use: the run's -qs
    adamw8_layout_init(&converted, cfg, selection);
    adamw8_states_alloc_host(&s->states, &converted);
    adamw8_states_from_fp32(&converted, &maps, s->m, s->v, &s->states);
    s->dequantized_m = (float*)mallocCheck(n * sizeof(float));
    s->dequantized_v = (float*)mallocCheck(n * sizeof(float));
    adamw8_states_to_fp32(&converted, &maps, &s->states, s->dequantized_m, s->dequantized_v);
}

static void one_rank_free(OneRank* s) {
    free(s->m); free(s->v); free(s->master); free(s->dequantized_m); free(s->dequantized_v);
    adamw8_states_free_host(&s->states);
}

// 0 when some rank of N would cut an 8-bit tensor of `selection` off its block grid (the trainer refuses that at startup)
static int ranks_can_run(const GPT2Config* cfg, Adamw8Selection selection, int num_ranks) {
    int rank;
    size_t element;
    return zero_8bit_part_off_block_grid(cfg, num_ranks, selection, &rank, &element) < 0;
}

// the window's slice of whole-model states (pointers into them: a window's arrays are slices)
static Adamw8States states_slice(const Adamw8States* whole, const Adamw8Layout* window) {
    Adamw8States slice;
    slice.m_codes = whole->m_codes + window->codes_begin;
    slice.v_codes = whole->v_codes + window->codes_begin;
    slice.m_absmax = whole->m_absmax + window->blocks_begin;
    slice.v_absmax = whole->v_absmax + window->blocks_begin;
    slice.m32 = whole->m32 + window->fp32_begin;
    slice.v32 = whole->v32 + window->fp32_begin;
    return slice;
}

static void fill_extra(unsigned char* extra, int rank) {
    for (int i = 0; i < EXTRA_BYTES; i++) { extra[i] = (unsigned char)(rank * 37 + i); }
}

/*
checkpoint `step` of `s` written by N ranks into dir, each rank's file by the trainers' writer, with
num_extra (0 or 1) per-rank sections; a rank that owns only padding keeps no master (the trainer's
is NULL there)
*/
static void write_checkpoint_sections(const OneRank* s, const char* dir, int step, int num_ranks, int with_master,
                                      int shuffle, int num_extra) {
    ZeroLayout z;
    zero_layout_init(&z, &s->cfg, num_ranks);
    for (int q = 0; q < num_ranks; q++) {
        ZeroRange range = zero_rank_range(&z, q);
        Adamw8Layout window;
        adamw8_layout_window(&window, &s->model, range.begin, range.end);
        Adamw8States states = states_slice(&s->states, &window);
        DataLoader loader;
        loader_after_steps(&loader, q, num_ranks, shuffle, step);
        unsigned char extra_bytes[EXTRA_BYTES];
        fill_extra(extra_bytes, q);
        StateSection extra = {"test.per_rank", extra_bytes, EXTRA_BYTES, 0};
        char path[CHECKPOINT_PATH_MAX];
        checkpoint_state_path(path, sizeof(path), dir, step, q);
        train_state_write(path, step, 0, &loader, &window, s->eight_bit, s->m + range.begin, s->v + range.begin, &states,
                          with_master && range.end > range.begin ? s->master + range.begin : NULL, &extra, num_extra);
        dataloader_free(&loader);
    }
}

static void write_checkpoint(const OneRank* s, const char* dir, int step, int num_ranks, int with_master, int shuffle) {
    write_checkpoint_sections(s, dir, step, num_ranks, with_master, shuffle, 1);
}

// what one rank of M reads back
typedef struct {
    Adamw8Layout window;    // the run's layout for its range
    ZeroRange range;
    float* m;
    float* v;
    Adamw8States states;
    float* master;
    unsigned char extra[EXTRA_BYTES];
    char extra_path[CHECKPOINT_PATH_MAX];
    DataLoader loader;
    int step;
    char printed[2048];     // what the read printed
} RankResume;

static void rank_resume(RankResume* out, const OneRank* s, const char* dir, int rank, int num_ranks, int use_adamw8,
                        Adamw8Selection selection, int with_master, int shuffle) {
    ZeroLayout z;
    zero_layout_init(&z, &s->cfg, num_ranks);
    out->range = zero_rank_range(&z, rank);
    Adamw8Layout model;
    adamw8_layout_init(&model, &s->cfg, use_adamw8 ? selection : ADAMW8_SELECT_NONE);
    adamw8_layout_window(&out->window, &model, out->range.begin, out->range.end);
    size_t n = out->range.end - out->range.begin;
    out->m = (float*)mallocCheck(n * sizeof(float));
    out->v = (float*)mallocCheck(n * sizeof(float));
    out->master = with_master ? (float*)mallocCheck(n * sizeof(float)) : NULL;
    adamw8_states_alloc_host(&out->states, &out->window);
    memset(out->extra, 0, sizeof(out->extra));
    StateSection extra = {"test.per_rank", out->extra, EXTRA_BYTES, 0};
    loader_init(&out->loader, rank, num_ranks, shuffle);
    STDOUT_OF(out->printed, out->step = train_state_read_checkpoint(
                                  dir, TEST_STEP, batches_per_step(num_ranks), &out->loader, &s->cfg, use_adamw8, selection,
                                  use_adamw8 ? NULL : out->m, use_adamw8 ? NULL : out->v, &out->states, out->master, &extra,
                                  1, out->extra_path));
}

static void rank_resume_free(RankResume* r) {
    free(r->m); free(r->v); free(r->master);
    adamw8_states_free_host(&r->states);
    dataloader_free(&r->loader);
}

// the loader of a resumed rank against a loader that read the batches itself: position, orders, rng, next batch
static int same_loader(DataLoader* got, DataLoader* want) {
    int same = got->current_shard_idx == want->current_shard_idx && got->current_sample_idx == want->current_sample_idx &&
               got->loaded_shard == want->loaded_shard;
    if (same && want->should_shuffle) {
        same = memcmp(got->shard_indices, want->shard_indices, want->num_shards * sizeof(int)) == 0 &&
               got->num_intra_shard_indices == want->num_intra_shard_indices &&
               memcmp(got->intra_shard_indices, want->intra_shard_indices, want->num_intra_shard_indices * sizeof(int)) == 0 &&
               memcmp(&got->shuffle_rng, &want->shuffle_rng, sizeof(want->shuffle_rng)) == 0;
    }
    for (int b = 0; same && b < 40; b++) {  // on into the next shards and epochs
        dataloader_next_batch(got);
        dataloader_next_batch(want);
        same = memcmp(got->inputs, want->inputs, TEST_B * TEST_T * sizeof(int)) == 0 &&
               memcmp(got->targets, want->targets, TEST_B * TEST_T * sizeof(int)) == 0;
    }
    return same;
}

// the old windows of N ranks that overlap rank r of M's (a touching one holds none of it): the files a resharded read opens
static int overlapping_windows(const GPT2Config* cfg, int rank, int num_ranks, int file_ranks) {
    ZeroLayout z, old;
    zero_layout_init(&z, cfg, num_ranks);
    zero_layout_init(&old, cfg, file_ranks);
    ZeroRange range = zero_rank_range(&z, rank);
    int count = 0;
    for (int q = 0; q < file_ranks; q++) {
        ZeroRange window = zero_rank_range(&old, q);
        count += window.end > range.begin && window.begin < range.end;
    }
    return count;
}

/*
Rank r of M against the one-rank state: the run's form of the file's optimizer state, sliced
(converted first when the run's optimizer is the other one), the master slice, old rank
r % N's extra section, the step, the loader of an M-rank run, and its line: with N != M, the count
of old files it read (those whose windows overlap its own), with N == M none (its own file, read as written).
*/
static void check_rank(const OneRank* s, RankResume* got, int rank, int file_ranks, int num_ranks, int use_adamw8,
                       int with_master, int shuffle, const char* what) {
    size_t b = got->range.begin, n = got->range.end - got->range.begin;
    CHECK(got->step == TEST_STEP, "%s rank %d: step %d", what, rank, got->step);
    char line[160] = "resumed a checkpoint";
    if (file_ranks != num_ranks) {
        snprintf(line, sizeof(line), "resumed a checkpoint of %d rank%s: optimizer state and master assembled from %d of "
                 "its state files,", file_ranks, file_ranks == 1 ? "" : "s", overlapping_windows(&s->cfg, rank, num_ranks,
                 file_ranks));
    }
    CHECK((strstr(got->printed, line) != NULL) == (file_ranks != num_ranks), "%s rank %d printed [%s], expected %s'%s'",
          what, rank, got->printed, file_ranks != num_ranks ? "" : "no ", line);
    if (use_adamw8) {
        Adamw8States want = states_slice(&s->states, &got->window);
        const Adamw8Layout* w = &got->window;
        CHECK(memcmp(got->states.m_codes, want.m_codes, w->num_codes) == 0 &&
              memcmp(got->states.v_codes, want.v_codes, w->num_codes) == 0 &&
              memcmp(got->states.m_absmax, want.m_absmax, w->num_blocks * sizeof(float)) == 0 &&
              memcmp(got->states.v_absmax, want.v_absmax, w->num_blocks * sizeof(float)) == 0 &&
              memcmp(got->states.m32, want.m32, w->num_fp32 * sizeof(float)) == 0 &&
              memcmp(got->states.v32, want.v32, w->num_fp32 * sizeof(float)) == 0,
              "%s rank %d: 8-bit states differ from the one-rank slice", what, rank);
    } else {
        const float* want_m = s->eight_bit ? s->dequantized_m : s->m;
        const float* want_v = s->eight_bit ? s->dequantized_v : s->v;
        CHECK(memcmp(got->m, want_m + b, n * sizeof(float)) == 0 && memcmp(got->v, want_v + b, n * sizeof(float)) == 0,
              "%s rank %d: fp32 moments differ from the one-rank slice", what, rank);
    }
    if (with_master) {
        CHECK(memcmp(got->master, s->master + b, n * sizeof(float)) == 0, "%s rank %d: master differs from the one-rank slice",
              what, rank);
    }
    unsigned char want_extra[EXTRA_BYTES];
    fill_extra(want_extra, rank % file_ranks);
    CHECK(memcmp(got->extra, want_extra, EXTRA_BYTES) == 0, "%s rank %d: the extra section is not old rank %d's", what,
          rank, rank % file_ranks);
    char want_path[CHECKPOINT_PATH_MAX];
    checkpoint_state_path(want_path, sizeof(want_path), g_dir, TEST_STEP, rank % file_ranks);
    CHECK(strcmp(got->extra_path, want_path) == 0, "%s rank %d: extra path '%s'", what, rank, got->extra_path);
    DataLoader want_loader;
    loader_after_steps(&want_loader, rank, num_ranks, shuffle, TEST_STEP);
    CHECK(same_loader(&got->loader, &want_loader), "%s rank %d: the loader is not where an %d-rank run's is", what, rank,
          num_ranks);
    dataloader_free(&want_loader);
}

/*
Files of `s` written by every N that can run, read by every M that can run, with the run's
optimizer use_adamw8 (-qs run_selection): the pairs and the ranks checked.
*/
static void test_reshard_pairs(const OneRank* s, int use_adamw8, Adamw8Selection run_selection, int with_master) {
    char what[160];
    int pairs = 0;
    for (int i = 0; i < NUM_RANK_COUNTS; i++) {
        int file_ranks = RANK_COUNTS[i];
        if (s->eight_bit && !ranks_can_run(&s->cfg, s->selection, file_ranks)) { continue; }
        write_checkpoint(s, g_dir, TEST_STEP, file_ranks, with_master, 0);
        for (int j = 0; j < NUM_RANK_COUNTS; j++) {
            int num_ranks = RANK_COUNTS[j];
            // 8-bit states, or states becoming 8-bit, need the run's block grid (a conversion's too)
            if ((use_adamw8 || s->eight_bit) && !ranks_can_run(&s->cfg, run_selection, num_ranks)) { continue; }
            snprintf(what, sizeof(what), "%s, %s files -> %s run, master %d, N=%d M=%d", s->name,
                     s->eight_bit ? ADAMW8_SELECTION_NAMES[s->selection] : "fp32", use_adamw8 ? "adamw8" : "adamw",
                     with_master, file_ranks, num_ranks);
            for (int r = 0; r < num_ranks; r++) {
                RankResume got;
                rank_resume(&got, s, g_dir, r, num_ranks, use_adamw8, run_selection, with_master, 0);
                check_rank(s, &got, r, file_ranks, num_ranks, use_adamw8, with_master, 0, what);
                rank_resume_free(&got);
            }
            pairs++;
        }
        checkpoint_remove(g_dir, TEST_STEP);
    }
    printf("%s, %s files -> %s run, master %d: %d (N, M) pairs\n", s->name,
           s->eight_bit ? ADAMW8_SELECTION_NAMES[s->selection] : "fp32", use_adamw8 ? "adamw8" : "adamw", with_master, pairs);
    CHECK(pairs > 0, "%s: no (N, M) pair could run", s->name);
}

static void test_shape(const GPT2Config* cfg, const char* name) {
    for (int with_master = 0; with_master <= 1; with_master++) {
        OneRank fp32_files;
        one_rank_init(&fp32_files, cfg, name, 0, ADAMW8_SELECT_DEFAULT);
        test_reshard_pairs(&fp32_files, 0, ADAMW8_SELECT_DEFAULT, with_master);
        test_reshard_pairs(&fp32_files, 1, ADAMW8_SELECT_DEFAULT, with_master);  // quantized while resharding
        one_rank_free(&fp32_files);
        for (int sel = 0; sel < ADAMW8_NUM_SELECTIONS; sel++) {
            OneRank eight_bit_files;
            one_rank_init(&eight_bit_files, cfg, name, 1, (Adamw8Selection)sel);
            test_reshard_pairs(&eight_bit_files, 1, (Adamw8Selection)sel, with_master);
            if (sel == ADAMW8_SELECT_DEFAULT) { test_reshard_pairs(&eight_bit_files, 0, ADAMW8_SELECT_DEFAULT, with_master); }
            one_rank_free(&eight_bit_files);
        }
    }
}

// shuffled data: the resumed loaders are those of an M-rank run (orders, rng, position), old ranks' orders notwithstanding
static void test_shuffled(const GPT2Config* cfg) {
    OneRank s;
    one_rank_init(&s, cfg, "small shuffled", 0, ADAMW8_SELECT_DEFAULT);
    const int pairs[3][2] = {{2, 3}, {1, 8}, {8, 1}};
    for (int p = 0; p < 3; p++) {
        write_checkpoint(&s, g_dir, TEST_STEP, pairs[p][0], 1, 1);
        for (int r = 0; r < pairs[p][1]; r++) {
            char what[96];
            snprintf(what, sizeof(what), "shuffled N=%d M=%d", pairs[p][0], pairs[p][1]);
            RankResume got;
            rank_resume(&got, &s, g_dir, r, pairs[p][1], 0, ADAMW8_SELECT_DEFAULT, 1, 1);
            check_rank(&s, &got, r, pairs[p][0], pairs[p][1], 0, 1, 1, what);
            rank_resume_free(&got);
        }
        checkpoint_remove(g_dir, TEST_STEP);
    }
    one_rank_free(&s);
}

// replaying a loader is reading its batches: every count up to three epochs, both shuffle modes
static void test_seek_batches(void) {
    for (int shuffle = 0; shuffle <= 1; shuffle++) {
        for (int num_ranks = 1; num_ranks <= 3; num_ranks += 2) {
            DataLoader reading;
            loader_init(&reading, num_ranks - 1, num_ranks, shuffle);
            int mismatches = 0;
            for (size_t batches = 0; batches < 3 * (1605 / (TEST_B * TEST_T * (size_t)num_ranks)); batches++) {
                DataLoader seeking;
                loader_init(&seeking, num_ranks - 1, num_ranks, shuffle);
                dataloader_seek_batches(&seeking, batches);
                mismatches += !same_loader(&seeking, &reading) ? 1 : 0;
                dataloader_free(&seeking);
                dataloader_free(&reading);
                loader_init(&reading, num_ranks - 1, num_ranks, shuffle);
                for (size_t b = 0; b <= batches; b++) { dataloader_next_batch(&reading); }
            }
            CHECK(mismatches == 0, "dataloader_seek_batches (shuffle %d, %d ranks): %d batch counts land elsewhere than "
                  "reading the batches", shuffle, num_ranks, mismatches);
            dataloader_free(&reading);
        }
    }
    CHECK_DIES("seek on a used loader", "has read batches", {
        DataLoader loader;
        loader_init(&loader, 0, 1, 0);
        dataloader_next_batch(&loader);
        dataloader_seek_batches(&loader, 3);
    });
}

// broken checkpoints: one line naming the file (and, for another selection, the flag)
static void test_broken_checkpoints(const GPT2Config* cfg) {
    OneRank s;
    one_rank_init(&s, cfg, "small", 0, ADAMW8_SELECT_DEFAULT);
    char other_dir[300];
    snprintf(other_dir, sizeof(other_dir), "%s/other", g_dir);
    if (mkdir(other_dir, 0755) != 0) { perror("mkdir"); exit(2); }
    write_checkpoint(&s, g_dir, TEST_STEP, 2, 1, 0);
    write_checkpoint(&s, g_dir, TEST_STEP + 1, 2, 1, 0);   // another step
    write_checkpoint(&s, other_dir, TEST_STEP, 3, 1, 0);   // another rank count
    char rank1[CHECKPOINT_PATH_MAX], saved[CHECKPOINT_PATH_MAX + 8], command[3 * CHECKPOINT_PATH_MAX];
    checkpoint_state_path(rank1, sizeof(rank1), g_dir, TEST_STEP, 1);
    snprintf(saved, sizeof(saved), "%s.saved", rank1);
    if (rename(rank1, saved) != 0) { perror("rename"); exit(2); }
    CHECK_DIES("reshard: a missing file", rank1, {
        RankResume got;
        rank_resume(&got, &s, g_dir, 0, 1, 0, ADAMW8_SELECT_DEFAULT, 1, 0);
    });
    CHECK_DIES("reshard: a missing file, said so", "missing", {
        RankResume got;
        rank_resume(&got, &s, g_dir, 0, 3, 0, ADAMW8_SELECT_DEFAULT, 1, 0);
    });
    char step6[CHECKPOINT_PATH_MAX];
    checkpoint_state_path(step6, sizeof(step6), g_dir, TEST_STEP + 1, 1);
    snprintf(command, sizeof(command), "cp '%s' '%s'", step6, rank1);
    CHECK(system(command) == 0, "%s", command);
    CHECK_DIES("reshard: a file of another step", "at step 6", {
        RankResume got;
        rank_resume(&got, &s, g_dir, 0, 1, 0, ADAMW8_SELECT_DEFAULT, 1, 0);
    });
    CHECK_DIES("reshard: a file of another step, named", rank1, {
        RankResume got;
        rank_resume(&got, &s, g_dir, 0, 1, 0, ADAMW8_SELECT_DEFAULT, 1, 0);
    });
    char three_ranks[CHECKPOINT_PATH_MAX];
    checkpoint_state_path(three_ranks, sizeof(three_ranks), other_dir, TEST_STEP, 1);
    snprintf(command, sizeof(command), "cp '%s' '%s'", three_ranks, rank1);
    CHECK(system(command) == 0, "%s", command);
    CHECK_DIES("reshard: a file of another rank count", "rank 1 of 3", {
        RankResume got;
        rank_resume(&got, &s, g_dir, 0, 3, 0, ADAMW8_SELECT_DEFAULT, 1, 0);
    });
    if (rename(saved, rank1) != 0) { perror("rename"); exit(2); }
    CHECK_DIES("reshard: master weights the run does not keep", "use_master_weights", {
        RankResume got;
        rank_resume(&got, &s, g_dir, 0, 3, 0, ADAMW8_SELECT_DEFAULT, 0, 0);
    });
    CHECK_DIES("reshard: shuffling the run does not do", "shuffling", {
        RankResume got;
        rank_resume(&got, &s, g_dir, 0, 3, 0, ADAMW8_SELECT_DEFAULT, 1, 1);
    });
    CHECK_DIES("reshard: sections the run does not keep", "section 'test.per_rank' this run does not keep", {
        DataLoader loader;
        loader_init(&loader, 0, 3, 0);
        float m[1];
        float v[1];
        float master[1];
        char path[CHECKPOINT_PATH_MAX];
        train_state_read_checkpoint(g_dir, TEST_STEP, 8, &loader, &s.cfg, 0, ADAMW8_SELECT_DEFAULT, m, v, NULL, master,
                                    NULL, 0, path);
    });
    char rank0[CHECKPOINT_PATH_MAX];
    checkpoint_state_path(rank0, sizeof(rank0), g_dir, TEST_STEP, 0);
    remove(rank0);
    CHECK_DIES("reshard: no rank 0 file", rank0, {
        RankResume got;
        rank_resume(&got, &s, g_dir, 0, 3, 0, ADAMW8_SELECT_DEFAULT, 1, 0);
    });
    checkpoint_remove(g_dir, TEST_STEP);
    checkpoint_remove(g_dir, TEST_STEP + 1);
    test_remove_dir(other_dir);
    one_rank_free(&s);

    // 8-bit files of -qs default read by a run with -qs all: the flag is named
    OneRank eight_bit;
    one_rank_init(&eight_bit, cfg, "small", 1, ADAMW8_SELECT_DEFAULT);
    write_checkpoint(&eight_bit, g_dir, TEST_STEP, 2, 0, 0);
    CHECK_DIES("reshard: another -qs", "-qs default", {
        RankResume got;
        rank_resume(&got, &eight_bit, g_dir, 0, 3, 1, ADAMW8_SELECT_ALL, 0, 0);
    });
    CHECK_DIES("reshard: another -qs, converting", "-qs default", {
        RankResume got;
        rank_resume(&got, &eight_bit, g_dir, 1, 3, 0, ADAMW8_SELECT_ALL, 0, 0);
    });
    checkpoint_remove(g_dir, TEST_STEP);
    one_rank_free(&eight_bit);
}

// an optional section the files lack (the -sl/-sg windows of a run without them): the resharded read
// leaves it as the caller set it and still takes the per-rank one from old rank r % N; a required one is named
static void test_optional_section(const GPT2Config* cfg) {
    OneRank s;
    one_rank_init(&s, cfg, "small", 0, ADAMW8_SELECT_DEFAULT);
    write_checkpoint(&s, g_dir, TEST_STEP, 2, 0, 0);
    for (int optional = 1; optional >= 0; optional--) {
        unsigned char per_rank[EXTRA_BYTES], absent[16], want_per_rank[EXTRA_BYTES], untouched[16];
        memset(per_rank, 0, sizeof(per_rank));
        memset(absent, 0x5A, sizeof(absent));
        memset(untouched, 0x5A, sizeof(untouched));
        fill_extra(want_per_rank, 2 % 2);
        StateSection extra[2] = {{"test.per_rank", per_rank, EXTRA_BYTES, 0}, {"test.optional", absent, sizeof(absent), optional}};
        ZeroLayout z;
        zero_layout_init(&z, &s.cfg, 3);
        ZeroRange range = zero_rank_range(&z, 2);
        size_t n = range.end - range.begin;
        float* m = (float*)mallocCheck(n * sizeof(float));
        float* v = (float*)mallocCheck(n * sizeof(float));
        DataLoader loader;
        loader_init(&loader, 2, 3, 0);
        char path[CHECKPOINT_PATH_MAX];
        if (optional) {
            train_state_read_checkpoint(g_dir, TEST_STEP, batches_per_step(3), &loader, &s.cfg, 0, ADAMW8_SELECT_DEFAULT, m, v,
                                        NULL, NULL, extra, 2, path);
            CHECK(memcmp(absent, untouched, sizeof(absent)) == 0 && memcmp(per_rank, want_per_rank, EXTRA_BYTES) == 0,
                  "reshard, optional section absent: it was written to, or the per-rank section is not old rank 0's");
        } else {
            CHECK_DIES("reshard: a required section the files lack", "no section 'test.optional'",
                       train_state_read_checkpoint(g_dir, TEST_STEP, batches_per_step(3), &loader, &s.cfg, 0,
                                                   ADAMW8_SELECT_DEFAULT, m, v, NULL, NULL, extra, 2, path));
        }
        free(m); free(v);
        dataloader_free(&loader);
    }
    checkpoint_remove(g_dir, TEST_STEP);
    one_rank_free(&s);
}

/*
With M = N, llm.c's rank file `path` (arrays_floats: the floats of its m, v and master, if any) holds the loader
`got` replayed to: the position in header slots 30 to 33 and, shuffling, the trailer after the
arrays, to the file's end, byte for byte what dataloader_write_state writes of `got` (whose
layout test_formats holds to llm.c's files). So llm8's walk over the shards is llm.c's, as
make_llmc_files.py models it.
*/
static int loader_is_llmc_files(const DataLoader* got, const char* path, size_t arrays_floats) {
    FILE* fp = fopenCheck(path, "rb");
    long file_bytes = file_size_bytes(fp);
    int32_t header[CHECKPOINT_HEADER_INTS];
    freadCheck(header, sizeof(int32_t), CHECKPOINT_HEADER_INTS, fp);
    uint64_t position[2];
    memcpy(position, &header[30], sizeof(position));
    int same = position[0] == got->current_shard_idx && position[1] == got->current_sample_idx &&
               header[5] == got->should_shuffle;
    long trailer_at = (long)(CHECKPOINT_HEADER_BYTES + arrays_floats * sizeof(float));
    FILE* expected = tmpfile();
    dataloader_write_state(got, expected);
    long trailer_bytes = ftell(expected);
    same = same && file_bytes - trailer_at == trailer_bytes;
    if (same && trailer_bytes > 0) {
        char* in_file = (char*)mallocCheck((size_t)trailer_bytes);
        char* written = (char*)mallocCheck((size_t)trailer_bytes);
        fseekCheck(fp, trailer_at, SEEK_SET);
        freadCheck(in_file, 1, (size_t)trailer_bytes, fp);
        rewind(expected);
        freadCheck(written, 1, (size_t)trailer_bytes, expected);
        same = memcmp(in_file, written, (size_t)trailer_bytes) == 0;
        free(in_file);
        free(written);
    }
    fclose(expected);
    fcloseCheck(fp);
    return same;
}

/*
llm.c's checkpoints of several ranks (test/make_llmc_files.py writes them as llm.c's ZeRO-1 and
-z 0 ranks do, from a whole m, v and master it also writes): every rank of M = 1 to 4 (M = N
included) must read its window of the whole arrays bit for bit, whatever cut the files have, and
its loader must be where an M-rank run's is after the checkpoint's batches (one a step). Shuffled:
llm.c's training loader always shuffles, so its files carry each rank's trailer after the arrays,
which the reader skips (and counts in the file sizes that tell -z 0's from -z 1's); the files'
arrays are the unshuffled ones'. -z 0's files of a run without master weights hold m and v alone (a
body of 2 whole arrays, less than a -z 0 body with master) and are read as -z 0's all the same.
*/
static void test_llmc_one_rank_file(const char* py_dir, const GPT2Config* cfg, const float* whole);

static void test_llmc_rank_checkpoints(void) {
    char py_dir[512];
    if (!test_make_llmc_files(g_dir, py_dir, sizeof(py_dir))) { return; }
    GPT2Config cfg = gpt2_config_make(2, 2, 16, 8, 60);  // make_llmc_files.py's model
    size_t n = gpt2_num_parameters(&cfg);
    float* whole = (float*)mallocCheck(3 * n * sizeof(float));  // m, v, master
    FILE* fp = fopenCheck(in_dir(py_dir, "llmc_ranks_expected.bin"), "rb");
    freadCheck(whole, sizeof(float), 3 * n, fp);
    fcloseCheck(fp);
    const struct { const char* dir; int file_ranks, zero_stage, shuffle, step, master; } runs[] = {
        {"llmc_z1_n2", 2, 1, 0, 5, 1}, {"llmc_z1_n4", 4, 1, 0, 5, 1}, {"llmc_z0_n2", 2, 0, 0, 5, 1},
        {"llmc_z1_n2_shuffle", 2, 1, 1, 70, 1}, {"llmc_z1_n4_shuffle", 4, 1, 1, 70, 1}, {"llmc_z0_n2_shuffle", 2, 0, 1, 70, 1},
        {"llmc_z0_n2_no_master", 2, 0, 0, 5, 0}};
    char pattern[700];
    snprintf(pattern, sizeof(pattern), "%s/data_train_*.bin", py_dir);
    for (int d = 0; d < (int)(sizeof(runs) / sizeof(runs[0])); d++) {
        char dir[700];  // (in_dir's paths are reused)
        snprintf(dir, sizeof(dir), "%s", in_dir(py_dir, runs[d].dir));
        for (int num_ranks = 1; num_ranks <= 4; num_ranks++) {
            ZeroLayout zero;
            zero_layout_init(&zero, &cfg, num_ranks);
            for (int rank = 0; rank < num_ranks; rank++) {
                ZeroRange range = zero_rank_range(&zero, rank);
                size_t count = range.end - range.begin;
                float* got = (float*)mallocCheck(3 * count * sizeof(float) + 1);
                DataLoader loader;
                dataloader_init(&loader, pattern, 2, 8, rank, num_ranks, runs[d].shuffle, 50257);
                char extra_path[CHECKPOINT_PATH_MAX], printed[2048], line[160];
                int step = 0;
                STDOUT_OF(printed, step = train_state_read_checkpoint(dir, runs[d].step, 1, &loader, &cfg, 0,
                                                                      ADAMW8_SELECT_DEFAULT, got, got + count, NULL,
                                                                      runs[d].master ? got + 2 * count : NULL, NULL, 0,
                                                                      extra_path));
                // every rank reads all -z 1 files (each holds a part of every slice: of lnfw's 16 too), one -z 0 file
                snprintf(line, sizeof(line), "resumed a checkpoint of %d rank%s%s: optimizer state and master assembled "
                         "from %d of its state files", runs[d].file_ranks, runs[d].file_ranks == 1 ? "" : "s",
                         runs[d].zero_stage == 1 ? " (llm.c's -z 1 cut)" : " (llm.c's -z 0: each holds all)",
                         runs[d].zero_stage == 1 ? runs[d].file_ranks : 1);
                CHECK(strstr(printed, line) != NULL, "%s: rank %d of %d printed [%s], expected '%s'", runs[d].dir, rank,
                      num_ranks, printed, line);
                int same = step == runs[d].step;
                for (int a = 0; a < 2 + runs[d].master; a++) {
                    same = same && memcmp(got + a * count, whole + a * n + range.begin, count * sizeof(float)) == 0;
                }
                CHECK(same, "%s: rank %d of %d read another window of m, v or master than llm.c's files cut (step %d)",
                      runs[d].dir, rank, num_ranks, step);
                if (num_ranks == runs[d].file_ranks) {
                    char path[CHECKPOINT_PATH_MAX];
                    checkpoint_state_path(path, sizeof(path), dir, runs[d].step, rank);
                    size_t held = runs[d].zero_stage == 1 ? n / (size_t)num_ranks : n;
                    size_t arrays_floats = (2 + (size_t)runs[d].master) * held;
                    CHECK(loader_is_llmc_files(&loader, path, arrays_floats), "%s: rank %d's loader replayed %d batches "
                          "is not where llm.c's file says llm.c's rank %d was (position, shuffle trailer)", runs[d].dir,
                          rank, runs[d].step, rank);
                }
                DataLoader want;
                dataloader_init(&want, pattern, 2, 8, rank, num_ranks, runs[d].shuffle, 50257);
                for (int b = 0; b < runs[d].step; b++) { dataloader_next_batch(&want); }
                CHECK(same_loader(&loader, &want), "%s: rank %d of %d: the loader is not where a %d-rank run's is after %d "
                      "batches", runs[d].dir, rank, num_ranks, num_ranks, runs[d].step);
                dataloader_free(&want);
                free(got);
                dataloader_free(&loader);
            }
        }
        // the files' shuffling must be the run's
        DataLoader other;
        dataloader_init(&other, pattern, 2, 8, 0, 1, !runs[d].shuffle, 50257);
        float* got = (float*)mallocCheck(3 * n * sizeof(float));
        char extra_path[CHECKPOINT_PATH_MAX];
        CHECK_DIES("llm.c's checkpoint of several ranks, resumed with the other shuffling", "shuffling=",
                   train_state_read_checkpoint(dir, runs[d].step, 1, &other, &cfg, 0, ADAMW8_SELECT_DEFAULT, got, got + n,
                                               NULL, runs[d].master ? got + 2 * n : NULL, NULL, 0, extra_path));
        free(got);
        dataloader_free(&other);
    }
    // 8 ranks' files of which rank 7's (no master weights) is another run's: named, though llm8's 8 windows of this
    // model leave rank 7 only padding (which keeps no master in llm8's own files)
    char mixed[700], rank7[CHECKPOINT_PATH_MAX], message[CHECKPOINT_PATH_MAX + 64];
    snprintf(mixed, sizeof(mixed), "%s", in_dir(py_dir, "llmc_z1_n8_mixed"));
    checkpoint_state_path(rank7, sizeof(rank7), mixed, 5, 7);
    snprintf(message, sizeof(message), "'%s' has use_master_weights 0, rank 0's", rank7);
    CHECK_DIES("llm.c's checkpoint of 8 ranks, rank 7's file without master weights", message, {
        DataLoader loader;
        dataloader_init(&loader, pattern, 2, 8, 0, 1, 0, 50257);
        float* got = (float*)mallocCheck(3 * n * sizeof(float));
        char extra_path[CHECKPOINT_PATH_MAX];
        train_state_read_checkpoint(mixed, 5, 1, &loader, &cfg, 0, ADAMW8_SELECT_DEFAULT, got, got + n, NULL, got + 2 * n,
                                    NULL, 0, extra_path);
    });
    test_llmc_one_rank_file(py_dir, &cfg, whole);
    free(whole);
    test_remove_dir(py_dir);
}

/*
llm.c's -z 1 cut (reshard_pieces_) for 1 to 3 layers (test_llmc_rank_checkpoints' files have 2): over
N ranks the pieces hold every flat parameter once, each rank's pieces fill its file's n / N floats once,
and no rank has more pieces than reshard_max_pieces_ counts (the buffer the resharded read allocates:
at L = 1 every one of its 16 x L is taken)
*/
static void test_llmc_zero1_pieces(void) {
    for (int layers = 1; layers <= 3; layers++) {
        GPT2Config cfg = gpt2_config_make(layers, 2, 16, 8, 60);  // every layer slice divides by 1, 2 and 4
        for (int num_ranks = 1; num_ranks <= 4; num_ranks *= 2) {
            ZeroLayout zero;
            zero_layout_init(&zero, &cfg, num_ranks);
            size_t n = zero.num_parameters, held = n / (size_t)num_ranks;
            int max_pieces = reshard_max_pieces_(&zero);
            // room past the bound, so that a count over it is reported rather than written past the buffer
            ReshardPiece* pieces = (ReshardPiece*)mallocCheck((size_t)(max_pieces + NUM_PARAMETER_TENSORS) * sizeof(ReshardPiece));
            unsigned char* flat_hits = (unsigned char*)calloc(n, 1);
            unsigned char* file_hits = (unsigned char*)calloc(held, 1);
            int within_bounds = 1, fills_file = 1;
            for (int q = 0; q < num_ranks; q++) {
                int count = reshard_pieces_(RESHARD_LLMC_ZERO1, &zero, zero_rank_range(&zero, q), q, num_ranks, pieces);
                within_bounds = within_bounds && count <= max_pieces;
                memset(file_hits, 0, held);
                for (int p = 0; p < count; p++) {
                    for (size_t i = pieces[p].begin; i < pieces[p].end && i < n; i++) { flat_hits[i]++; }
                    size_t file_end = pieces[p].file_element + (pieces[p].end - pieces[p].begin);
                    for (size_t e = pieces[p].file_element; e < file_end && e < held; e++) { file_hits[e]++; }
                    within_bounds = within_bounds && pieces[p].end <= n && file_end <= held;
                }
                for (size_t e = 0; e < held; e++) { fills_file = fills_file && file_hits[e] == 1; }
            }
            int covers_flat = 1;
            for (size_t i = 0; i < n; i++) { covers_flat = covers_flat && flat_hits[i] == 1; }
            CHECK(within_bounds && covers_flat && fills_file, "llm.c's -z 1 cut, L=%d N=%d: %s", layers, num_ranks,
                  !within_bounds ? "pieces past reshard_max_pieces_ or the arrays' ends"
                  : !covers_flat ? "a flat parameter held by no piece, or by two"
                                 : "a rank's file floats read by no piece, or by two");
            free(pieces);
            free(flat_hits);
            free(file_hits);
        }
    }
}

// llm8's files of several ranks carry its mark in header slot 9 and are version 2 (which llm.c
// refuses), with nothing else to make them so; one rank's stay llm.c's version 1
static void test_rank_files_are_marked(void) {
    GPT2Config cfg = gpt2_config_make(2, 4, 256, 32, TEST_VOCAB);
    size_t n = gpt2_num_parameters(&cfg);
    float* zeros = (float*)calloc(n, sizeof(float));
    for (int num_ranks = 1; num_ranks <= 2; num_ranks++) {
        ZeroLayout zero;
        zero_layout_init(&zero, &cfg, num_ranks);
        ZeroRange range = zero_rank_range(&zero, 0);
        Adamw8Layout model, window;
        adamw8_layout_init(&model, &cfg, ADAMW8_SELECT_NONE);
        adamw8_layout_window(&window, &model, range.begin, range.end);
        DataLoader loader;
        loader_init(&loader, 0, num_ranks, 0);
        const char* path = in_dir(g_dir, "marked_state.bin");
        train_state_write(path, 3, 0, &loader, &window, 0, zeros, zeros, NULL, NULL, NULL, 0);
        int32_t header[CHECKPOINT_HEADER_INTS];
        FILE* fp = fopenCheck(path, "rb");
        freadCheck(header, sizeof(int32_t), CHECKPOINT_HEADER_INTS, fp);
        fcloseCheck(fp);
        CHECK(header[1] == (num_ranks == 1 ? STATE_VERSION_LLMC : STATE_VERSION_SECTIONS) &&
              header[STATE_SLOT_LAYOUT] == STATE_LAYOUT_LLM8_WINDOWS && header[20] != 0,
              "%d ranks: a state file of version %d, slot %d = %d, llm.c's rng state slot 20 = %d", num_ranks, header[1],
              STATE_SLOT_LAYOUT, header[STATE_SLOT_LAYOUT], header[20]);
        dataloader_free(&loader);
        unlink(path);
    }
    free(zeros);
}

// writes `bytes` bytes at byte `at` of the file at path
static void patch_bytes(const char* path, long at, const void* data, size_t bytes) {
    FILE* fp = fopenCheck(path, "r+b");
    fseekCheck(fp, at, SEEK_SET);
    fwriteCheck(data, 1, bytes, fp);
    fcloseCheck(fp);
}

// sets int32 header slot `slot` of the file at path to value
static void patch_header_slot(const char* path, int slot, int32_t value) {
    patch_bytes(path, slot * (long)sizeof(int32_t), &value, sizeof(value));
}

/*
llm8's files of several ranks from before header slot 9 marked them: version 1 (no sections)
with B and T in slots 7 and 8, or version 2. llm.c writes neither, so they are read as llm8's
windows (read as llm.c's cut, a 2-rank file whose windows need no padding has the sizes of
llm.c's and would be read on the wrong parameters)
*/
static void test_older_llm8_rank_files(void) {
    GPT2Config cfg = gpt2_config_make(2, 4, 256, 32, TEST_VOCAB);
    size_t n = gpt2_num_parameters(&cfg);
    float* m = (float*)mallocCheck(n * sizeof(float));
    float* v = (float*)mallocCheck(n * sizeof(float));
    for (size_t i = 0; i < n; i++) { m[i] = uniform_pm1(1, i); v[i] = 1.0f + uniform_pm1(2, i); }
    ZeroLayout zero;
    zero_layout_init(&zero, &cfg, 2);
    Adamw8Layout model;
    adamw8_layout_init(&model, &cfg, ADAMW8_SELECT_NONE);
    for (int with_section = 0; with_section <= 1; with_section++) {
        unsigned char extra_bytes[EXTRA_BYTES];
        StateSection extra = {"test.per_rank", extra_bytes, EXTRA_BYTES, 0};
        for (int q = 0; q < 2; q++) {
            ZeroRange range = zero_rank_range(&zero, q);
            Adamw8Layout window;
            adamw8_layout_window(&window, &model, range.begin, range.end);
            DataLoader loader;
            loader_after_steps(&loader, q, 2, 0, TEST_STEP);
            fill_extra(extra_bytes, q);
            char path[CHECKPOINT_PATH_MAX];
            checkpoint_state_path(path, sizeof(path), g_dir, TEST_STEP, q);
            train_state_write(path, TEST_STEP, 0, &loader, &window, 0, m + range.begin, v + range.begin, NULL, NULL, &extra,
                              with_section);
            patch_header_slot(path, STATE_SLOT_LAYOUT, 0);  // as 8fb4f48 wrote them
            if (!with_section) { patch_header_slot(path, 1, STATE_VERSION_LLMC); }
            dataloader_free(&loader);
        }
        for (int r = 0; r < 2; r++) {
            ZeroRange range = zero_rank_range(&zero, r);
            size_t count = range.end - range.begin;
            float* got = (float*)mallocCheck(2 * count * sizeof(float));
            DataLoader loader;
            loader_init(&loader, r, 2, 0);
            char extra_path[CHECKPOINT_PATH_MAX];
            train_state_read_checkpoint(g_dir, TEST_STEP, batches_per_step(2), &loader, &cfg, 0, ADAMW8_SELECT_DEFAULT, got,
                                        got + count, NULL, NULL, &extra, with_section, extra_path);
            CHECK(memcmp(got, m + range.begin, count * sizeof(float)) == 0 &&
                  memcmp(got + count, v + range.begin, count * sizeof(float)) == 0,
                  "an older llm8 file of 2 ranks (version %d, no mark): rank %d read other moments than it wrote",
                  with_section ? 2 : 1, r);
            free(got);
            dataloader_free(&loader);
        }
        checkpoint_remove(g_dir, TEST_STEP);
    }
    free(m);
    free(v);
}

/*
Files that do not agree with rank 0's on a field of the header (checkpoint 5 of 2 ranks whose rank 1's
file is another checkpoint's, or patched): one line naming rank 1's file and the field, before any is read
*/
static void test_disagreeing_files(const GPT2Config* cfg) {
    OneRank fp32, eight_bit;
    one_rank_init(&fp32, cfg, "disagreeing", 0, ADAMW8_SELECT_DEFAULT);
    one_rank_init(&eight_bit, cfg, "disagreeing", 1, ADAMW8_SELECT_DEFAULT);
    char other_dir[300], rank1[CHECKPOINT_PATH_MAX], odd[CHECKPOINT_PATH_MAX], command[3 * CHECKPOINT_PATH_MAX];
    snprintf(other_dir, sizeof(other_dir), "%s/odd", g_dir);
    if (mkdir(other_dir, 0755) != 0) { perror("mkdir"); exit(2); }
    checkpoint_state_path(rank1, sizeof(rank1), g_dir, TEST_STEP, 1);
    checkpoint_state_path(odd, sizeof(odd), other_dir, TEST_STEP, 1);
    // rank 1's file: version 1 (patched, in files of no sections), or one written as the case says
    const struct { const char* field; const OneRank* odd; int with_master, shuffle, num_extra; } cases[] = {
        {"version 1", NULL, 1, 0, 0}, {"use_master_weights 0", &fp32, 0, 0, 1}, {"shuffling 1", &fp32, 1, 1, 1},
        {"fp32 moments 0", &eight_bit, 1, 0, 1}, {"section count 0", &fp32, 1, 0, 0}};
    for (int c = 0; c < (int)(sizeof(cases) / sizeof(cases[0])); c++) {
        write_checkpoint_sections(&fp32, g_dir, TEST_STEP, 2, 1, 0, cases[c].odd == NULL ? 0 : 1);
        if (cases[c].odd == NULL) {
            patch_header_slot(rank1, 1, STATE_VERSION_LLMC);
        } else {
            write_checkpoint_sections(cases[c].odd, other_dir, TEST_STEP, 2, cases[c].with_master, cases[c].shuffle,
                                      cases[c].num_extra);
            snprintf(command, sizeof(command), "cp '%s' '%s'", odd, rank1);
            CHECK(system(command) == 0, "%s", command);
        }
        char what[96], message[CHECKPOINT_PATH_MAX + 64];
        snprintf(what, sizeof(what), "reshard: rank 1's file has %s", cases[c].field);
        snprintf(message, sizeof(message), "'%s' has %s, rank 0's", rank1, cases[c].field);
        CHECK_DIES(what, message, {
            RankResume got;
            rank_resume(&got, &fp32, g_dir, 0, 3, 0, ADAMW8_SELECT_DEFAULT, 1, 0);
        });
        checkpoint_remove(g_dir, TEST_STEP);
        checkpoint_remove(other_dir, TEST_STEP);
    }
    // rank 0's file in rank 1's place
    write_checkpoint(&fp32, g_dir, TEST_STEP, 2, 1, 0);
    char rank0[CHECKPOINT_PATH_MAX], message[CHECKPOINT_PATH_MAX + 64];
    checkpoint_state_path(rank0, sizeof(rank0), g_dir, TEST_STEP, 0);
    snprintf(command, sizeof(command), "cp '%s' '%s'", rank0, rank1);
    CHECK(system(command) == 0, "%s", command);
    snprintf(message, sizeof(message), "'%s' is rank 0 of 2 at step %d", rank1, TEST_STEP);
    CHECK_DIES("reshard: rank 0's file as rank 1's", message, {
        RankResume got;
        rank_resume(&got, &fp32, g_dir, 0, 3, 0, ADAMW8_SELECT_DEFAULT, 1, 0);
    });
    checkpoint_remove(g_dir, TEST_STEP);
    // rank 1's file made llm.c's (version 1, no B, T or llm8 mark), rank 0's llm8's
    write_checkpoint_sections(&fp32, g_dir, TEST_STEP, 2, 1, 0, 0);
    const int llmc_slots[4][2] = {{1, STATE_VERSION_LLMC}, {STATE_SLOT_MICRO_BATCH, 0}, {STATE_SLOT_SEQ_LEN, 0},
                                  {STATE_SLOT_LAYOUT, 0}};
    for (int k = 0; k < 4; k++) { patch_header_slot(rank1, llmc_slots[k][0], llmc_slots[k][1]); }
    snprintf(message, sizeof(message), "'%s' was written by llm.c, rank 0's", rank1);
    CHECK_DIES("reshard: an llm.c file beside llm8's", message, {
        RankResume got;
        rank_resume(&got, &fp32, g_dir, 0, 3, 0, ADAMW8_SELECT_DEFAULT, 1, 0);
    });
    checkpoint_remove(g_dir, TEST_STEP);
    test_remove_dir(other_dir);
    one_rank_free(&fp32);
    one_rank_free(&eight_bit);
}

/*
A rank that owns only padding (rank 7 of 8 on `cfg`, of 8768 parameters) keeps no master weights:
its file has none, which is no disagreement with rank 0's (N = 8 read by M = 3), and resumed it
passes none (N = 3 read by M = 8)
*/
static void test_padding_only_ranks(const GPT2Config* cfg) {
    OneRank s;
    one_rank_init(&s, cfg, "padding ranks", 0, ADAMW8_SELECT_DEFAULT);
    ZeroLayout z;
    zero_layout_init(&z, cfg, 8);
    ZeroRange last = zero_rank_range(&z, 7);
    CHECK(last.begin == last.end, "N=8: rank 7 owns [%zu, %zu) of %zu, expected none", last.begin, last.end, z.num_parameters);
    const int pairs[2][2] = {{8, 3}, {3, 8}};
    for (int k = 0; k < 2; k++) {
        int file_ranks = pairs[k][0], num_ranks = pairs[k][1];
        write_checkpoint(&s, g_dir, TEST_STEP, file_ranks, 1, 0);
        zero_layout_init(&z, cfg, num_ranks);
        char what[96];
        snprintf(what, sizeof(what), "padding-only ranks, N=%d M=%d", file_ranks, num_ranks);
        for (int r = 0; r < num_ranks; r++) {
            ZeroRange range = zero_rank_range(&z, r);
            int with_master = range.end > range.begin;
            RankResume got;
            rank_resume(&got, &s, g_dir, r, num_ranks, 0, ADAMW8_SELECT_DEFAULT, with_master, 0);
            check_rank(&s, &got, r, file_ranks, num_ranks, 0, with_master, 0, what);
            rank_resume_free(&got);
        }
        checkpoint_remove(g_dir, TEST_STEP);
    }
    one_rank_free(&s);
}

/*
A resharded read checks the values it assembled as train_state_read checks one file's: a NaN moment
in old rank 1's file (N = 2) stops the rank of M = 3 whose window holds it, naming the checkpoint and
the element of its window
*/
static void test_non_finite_state(const GPT2Config* cfg) {
    OneRank s;
    one_rank_init(&s, cfg, "non-finite", 0, ADAMW8_SELECT_DEFAULT);
    ZeroLayout old, z;
    zero_layout_init(&old, cfg, 2);
    zero_layout_init(&z, cfg, 3);
    size_t bad = zero_rank_range(&old, 1).begin + 5;
    s.m[bad] = NAN;
    write_checkpoint(&s, g_dir, TEST_STEP, 2, 1, 0);
    int rank = 0;
    while (zero_rank_range(&z, rank).end <= bad) { rank++; }
    char message[CHECKPOINT_PATH_MAX + 128];
    snprintf(message, sizeof(message), "checkpoint %d in '%s' (its state files): AdamW m of parameter %zu of this rank's "
             "window is nan", TEST_STEP, g_dir, bad - zero_rank_range(&z, rank).begin);
    CHECK_DIES("reshard: a NaN moment in an old rank's file", message, {
        RankResume got;
        rank_resume(&got, &s, g_dir, rank, 3, 0, ADAMW8_SELECT_DEFAULT, 1, 0);
    });
    checkpoint_remove(g_dir, TEST_STEP);
    one_rank_free(&s);
}

// the place of section `tag` in the state file at path
static StateSectionPlace section_place(const char* path, const char* tag) {
    StateFileIndex index;
    state_file_read_header(path, &index);
    state_file_index(path, (size_t)index.shard_num_parameters, &index);
    const StateSectionPlace* place = state_file_find_section(&index, tag);
    CHECK(place != NULL, "'%s' has no section '%s'", path, tag);
    StateSectionPlace none = {"", 0, 0};
    return place != NULL ? *place : none;
}

/*
llm.c's file of one rank (its -z 0 rank 0's made rank 0 of 1, at a position of its own: shard 1 sample 2)
is its rank's own file on one rank: read as written (train_state_read), its loader where the file says,
not replayed to the step, and nothing resharded
*/
static void test_llmc_one_rank_file(const char* py_dir, const GPT2Config* cfg, const float* whole) {
    char dir[700], from[CHECKPOINT_PATH_MAX], path[CHECKPOINT_PATH_MAX], command[3 * CHECKPOINT_PATH_MAX];
    snprintf(dir, sizeof(dir), "%s/llmc_one_rank", py_dir);
    if (mkdir(dir, 0755) != 0) { perror("mkdir"); exit(2); }
    checkpoint_state_path(from, sizeof(from), in_dir(py_dir, "llmc_z0_n2"), 5, 0);
    checkpoint_state_path(path, sizeof(path), dir, 5, 0);
    snprintf(command, sizeof(command), "cp '%s' '%s'", from, path);
    CHECK(system(command) == 0, "%s", command);
    patch_header_slot(path, 2, 1);
    uint64_t position[2] = {1, 2};
    patch_bytes(path, 30 * (long)sizeof(int32_t), position, sizeof(position));
    size_t n = gpt2_num_parameters(cfg);
    float* got = (float*)mallocCheck(3 * n * sizeof(float));
    char pattern[700], extra_path[CHECKPOINT_PATH_MAX], printed[2048];
    snprintf(pattern, sizeof(pattern), "%s/data_train_*.bin", py_dir);
    DataLoader loader;
    dataloader_init(&loader, pattern, 2, 8, 0, 1, 0, 50257);
    int step = 0;
    STDOUT_OF(printed, step = train_state_read_checkpoint(dir, 5, 1, &loader, cfg, 0, ADAMW8_SELECT_DEFAULT, got, got + n,
                                                          NULL, got + 2 * n, NULL, 0, extra_path));
    CHECK(step == 5 && memcmp(got, whole, 3 * n * sizeof(float)) == 0 && loader.current_shard_idx == 1 &&
          loader.current_sample_idx == 2 && strstr(printed, "resumed a checkpoint") == NULL,
          "llm.c's file of one rank: step %d, arrays %s, loader at shard %zu sample %zu (expected 1, 2), printed [%s]", step,
          memcmp(got, whole, 3 * n * sizeof(float)) == 0 ? "as written" : "differ", loader.current_shard_idx,
          loader.current_sample_idx, printed);
    dataloader_free(&loader);
    free(got);
}

// rewrites the state file at path with its section `tag` cut to its first `bytes` bytes (-1: dropped), all else kept
static void rewrite_section(const char* path, const char* tag, long bytes) {
    StateSectionPlace place = section_place(path, tag);
    FILE* fp = fopenCheck(path, "rb");
    long size = file_size_bytes(fp);
    char* data = (char*)mallocCheck((size_t)size);
    freadCheck(data, 1, (size_t)size, fp);
    fcloseCheck(fp);
    long tag_at = place.offset - (long)(STATE_SECTION_TAG_BYTES + sizeof(uint64_t));
    long after = place.offset + (long)place.bytes;
    fp = fopenCheck(path, "wb");
    fwriteCheck(data, 1, (size_t)tag_at, fp);
    if (bytes >= 0) {
        uint64_t length = (uint64_t)bytes;
        fwriteCheck(data + tag_at, 1, STATE_SECTION_TAG_BYTES, fp);
        fwriteCheck(&length, sizeof(length), 1, fp);
        fwriteCheck(data + place.offset, 1, (size_t)bytes, fp);
    }
    fwriteCheck(data + after, 1, (size_t)(size - after), fp);
    fcloseCheck(fp);
    free(data);
    if (bytes < 0) {
        StateFileIndex header;
        state_file_read_header(path, &header);
        patch_header_slot(path, STATE_SLOT_NUM_SECTIONS, header.num_sections - 1);
    }
}

/*
8-bit files of 2 ranks whose rank 0's file is broken (edit k below): one line naming it and what is wrong.
Its adamw8.bits (the tensor selection) dropped, short, or no -qs's (wte's 16 bits); a section twice; the
per-rank section of another size; its header's process count (0, past the most, the most) or rank; no file.
Edits 1 to 4 (its sections, as many as rank 0's) are also made to rank 1's file alone: every file's
sections are checked, not only rank 0's (rank 0 of M = 3 reads none of rank 1's state nor its per-rank section).
*/
static void break_state_file(const char* path, int k) {
    char m32[STATE_SECTION_TAG_BYTES] = "adamw8.m32";
    int32_t sixteen = 16;
    const int slots[4][2] = {{2, 0}, {2, ZERO_MAX_RANKS + 1}, {2, ZERO_MAX_RANKS}, {3, 1}};
    switch (k) {
    case 0: rewrite_section(path, "adamw8.bits", -1); break;
    case 1: rewrite_section(path, "adamw8.bits", (long)((NUM_PARAMETER_TENSORS - 1) * sizeof(int32_t))); break;
    case 2: patch_bytes(path, section_place(path, "adamw8.bits").offset + PARAM_WTE * (long)sizeof(int32_t), &sixteen,
                        sizeof(sixteen)); break;
    case 3: patch_bytes(path, section_place(path, "adamw8.v32").offset - (long)(sizeof(m32) + sizeof(uint64_t)), m32,
                        sizeof(m32)); break;
    case 4: rewrite_section(path, "test.per_rank", EXTRA_BYTES / 2); break;
    case 9: remove(path); break;
    default: patch_header_slot(path, slots[k - 5][0], slots[k - 5][1]); break;
    }
}

static void test_broken_state_files(const GPT2Config* cfg) {
    OneRank s;
    one_rank_init(&s, cfg, "broken files", 1, ADAMW8_SELECT_DEFAULT);
    char message[CHECKPOINT_PATH_MAX + 96];
    static const char* const messages[] = {
        "'%s' has 8-bit AdamW states but no 64-byte adamw8.bits section",
        "'%s' has 8-bit AdamW states but no 64-byte adamw8.bits section",
        "'%s' keeps 16-bit AdamW states for wte",
        "'%s' has section 'adamw8.m32' twice",
        "'%s': section 'test.per_rank' is 32 bytes, this run expects 64",
        "'%s' says rank 0 of 0 processes, expected rank 0 of 1..4096",
        "'%s' says rank 0 of 4097 processes, expected rank 0 of 1..4096",
        "'%s' holds",  // 4096 ranks are taken: its window is not rank 0 of 4096's
        "'%s' says rank 1 of 2 processes, expected rank 0 of 1..4096",
        "'%s' is missing"};
    CHECK(NUM_PARAMETER_TENSORS * sizeof(int32_t) == 64 && EXTRA_BYTES == 64 && ZERO_MAX_RANKS == 4096,
          "the messages below assume 16 tensors, 64 extra bytes, 4096 ranks at most");
    for (int broken_rank = 0; broken_rank < 2; broken_rank++) {
        char broken[CHECKPOINT_PATH_MAX];
        checkpoint_state_path(broken, sizeof(broken), g_dir, TEST_STEP, broken_rank);
        int first_edit = broken_rank == 0 ? 0 : 1, end_edit = broken_rank == 0 ? (int)(sizeof(messages) / sizeof(messages[0])) : 5;
        for (int k = first_edit; k < end_edit; k++) {
            write_checkpoint(&s, g_dir, TEST_STEP, 2, 0, 0);
            break_state_file(broken, k);
            snprintf(message, sizeof(message), messages[k], broken);
            char what[64];
            snprintf(what, sizeof(what), "reshard: broken rank %d file (edit %d)", broken_rank, k);
            CHECK_DIES(what, message, {
                RankResume got;
                rank_resume(&got, &s, g_dir, 0, 3, 1, ADAMW8_SELECT_DEFAULT, 0, 0);
            });
            checkpoint_remove(g_dir, TEST_STEP);
        }
    }
    one_rank_free(&s);
}

int main(void) {
    test_make_temp_dir(g_dir, sizeof(g_dir));
    write_shards();
    test_older_llm8_rank_files();
    test_llmc_rank_checkpoints();
    test_llmc_zero1_pieces();
    test_rank_files_are_marked();
    test_seek_batches();
    // every tensor on the 256 grid (C = 256): every -qs runs on every rank count
    GPT2Config small = gpt2_config_make(2, 4, 256, 32, TEST_VOCAB);
    test_broken_checkpoints(&small);
    test_optional_section(&small);
    test_shuffled(&small);
    // C = 192: tensors start off the 256 grid; only the rank counts that can run are paired
    GPT2Config odd = gpt2_config_make(2, 3, 192, 32, TEST_VOCAB);
    test_shape(&odd, "C=192");
    // d12's width and heads (one layer, a small vocabulary, to stay fast)
    GPT2Config d12_like = gpt2_config_make(1, 12, 768, 64, 1000);
    test_shape(&d12_like, "d12 L=1");
    // 8768 parameters: shards of 1280 on 8 ranks leave rank 7 only padding
    GPT2Config toy = gpt2_config_make(2, 1, 16, TEST_T, 128);
    test_disagreeing_files(&toy);
    test_padding_only_ranks(&toy);
    test_non_finite_state(&toy);
    test_broken_state_files(&toy);
    test_remove_dir(g_dir);
    CHECK(llm8_open_file_count() == 0, "%d files opened by fopenCheck are not closed by fcloseCheck", llm8_open_file_count());
    return test_summary("test_reshard");
}
