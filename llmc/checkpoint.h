/*
checkpoint.h: model files, resume-state files, and making a checkpoint atomic.

Why it is shaped this way:
- Files stay byte-compatible with llm.c, so checkpoints move both ways (one rank's; several
  ranks' below):
  model_XXXXXXXX.bin: 256 int32 header ([0] 20240326, [1] 3 = fp32 or 5 = bf16 params,
  [2] maxT, [3] V, [4] L, [5] NH, [6] C, [7] Vp), then all parameters in gpt2_config.h's
  order. state_XXXXXXXX_RRRRR.bin (one per rank), version 1, is llm.c's layout exactly:
  header [0] 20240527, [1] 1, [2] num_processes, [3] process_rank, [4] use_master_weights,
  [5] should_shuffle, [10] step, uint64 at [20] rng_state and [22] rng_state_last_update,
  uint64 (size_t) at [30] current_shard_idx and [32] current_sample_idx; then fp32 m, v and
  (if used) master weights, shard_num_parameters each; then, when shuffling, the
  dataloader's trailer (dataloader.h).
- llm8 adds state llm.c does not have (FP8 scaling histories, 8-bit optimizer states). Those
  go in version 2, which is version 1's layout with TAGGED SECTIONS appended after the
  trailer: header [40] holds the section count, and each section is a 16-byte NUL-padded
  ASCII tag, a uint64 byte count and the bytes. Header [6] = 1 says the body has no fp32
  m and v (an 8-bit optimizer keeps its states in sections instead). Header [7] and [8] (both
  versions; llm.c leaves them 0) hold the writer's B and T: the saved position counts
  samples of B*T tokens, so a run resumed with another B or T replays the loader instead.
  Header [42] (uint64, both versions; 0 in llm.c's files and llm8's before 2026-11-29) holds
  the parameters per body array: a state of another model is refused by it before its trailer
  and sections are read from inside its arrays. New state is a new tag,
  never a changed layout, so version 1 files (ours with nothing to add, and llm.c's) read
  unchanged; a file whose sections do not match what the run asks for is refused by tag, since
  silently dropping state would break bitwise resume. A one-rank file with no sections and
  fp32 m, v is always written as version 1.
- Several ranks cut the optimizer state differently in llm.c and llm8. llm.c's ZeRO-1 rank q
  holds the q-th 1/N of every layer's slice of every tensor; llm8's holds one window of the
  flat parameters (zero.h). Header [9] = 1 marks llm8's files (llm.c leaves it 0), and llm8
  writes several ranks' files as version 2, which llm.c refuses, so that neither reads the
  other's shards as its own: llm8 assembles its windows from llm.c's files
  (state_reshard.h), and llm.c continues an llm8 run of several GPUs from its model file.
  llm8's files from before the mark are told by what llm.c never writes: version 2, or B and T
  in [7] and [8] (written since 2026-11-26).
- Atomic: every file is written to <path>.tmp, flushed, fsynced and renamed over <path> (the directory synced after), so a
  killed run leaves either the old file or the new one. After every file of a step is
  complete (all ranks), rank 0 writes DONE_XXXXXXXX; checkpoint_find_latest only trusts steps
  with that marker, so a checkpoint cut off half way is never resumed from. checkpoint_remove
  deletes the marker first (its removal synced before any file goes), so a removal cut off half
  way is never resumed from either, and a step written again (a resumed run's step) is first
  removed, so its marker never stands over a mix of old and new files. One dir holds one run:
  checkpoint_claim_dir.
- Every read checks magic, version, shape and the exact file length up front, and names the
  file in a one-line error, so a truncated or foreign file never becomes silent garbage.
- state_file_index maps a state file (header fields, where the body's arrays and each
  section lie) without reading its arrays, for a reader that takes pieces of several files:
  resuming with another number of ranks (state_reshard.h).
*/
#ifndef LLMC_CHECKPOINT_H
#define LLMC_CHECKPOINT_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>
#include <sys/file.h>
#include "utils.h"
#include "element_math.h"
#include "gpt2_config.h"
#include "dataloader.h"

#define CHECKPOINT_HEADER_INTS 256
#define CHECKPOINT_HEADER_BYTES (CHECKPOINT_HEADER_INTS * sizeof(int32_t))
#define MODEL_FILE_MAGIC 20240326
#define MODEL_VERSION_FP32 3
#define MODEL_VERSION_BF16 5
#define STATE_FILE_MAGIC 20240527
#define STATE_VERSION_LLMC 1
#define STATE_VERSION_SECTIONS 2
#define STATE_SLOT_MOMENTS_IN_SECTIONS 6
#define STATE_SLOT_MICRO_BATCH 7   // llm8's: the writer's B and T, 0 in llm.c's files (and llm8's before them)
#define STATE_SLOT_SEQ_LEN 8
#define STATE_SLOT_LAYOUT 9        // llm8's: 1 in its files; llm.c's leave it 0 (state_reshard.h)
#define STATE_LAYOUT_LLM8_WINDOWS 1
#define STATE_SLOT_TOTAL_BATCH 11  // llm8's: the writer's tokens per optimizer step (-d); 0: not recorded
#define STATE_SLOT_NUM_SECTIONS 40
#define STATE_SLOT_SHARD_PARAMETERS 42  // llm8's: uint64 in slots 42-43, the parameters each body array holds (0: not recorded)
#define STATE_SECTION_TAG_BYTES 16
#define STATE_FILE_MAX_SECTIONS 64  // sections a state file, or a run, may have
#define CHECKPOINT_PATH_MAX 4096
#define CHECKPOINT_CHUNK_ELEMS ((size_t)1 << 20)

// ----------------------------------------------------------------------------
// paths and atomic writes

static inline void checkpoint_format_path_(char* out, size_t out_size, const char* fmt, const char* dir, int step, int rank) {
    int n = snprintf(out, out_size, fmt, dir, step, rank);
    if (n < 0 || (size_t)n >= out_size) {
        llm8_die("checkpoint path in dir '%s' for step %d is longer than %zu bytes", dir, step, out_size - 1);
    }
}

static inline void checkpoint_model_path(char* out, size_t out_size, const char* dir, int step) {
    checkpoint_format_path_(out, out_size, "%s/model_%08d.bin", dir, step, 0);
}

static inline void checkpoint_state_path(char* out, size_t out_size, const char* dir, int step, int rank) {
    checkpoint_format_path_(out, out_size, "%s/state_%08d_%05d.bin", dir, step, rank);
}

static inline void checkpoint_done_path(char* out, size_t out_size, const char* dir, int step) {
    checkpoint_format_path_(out, out_size, "%s/DONE_%08d", dir, step, 0);
}

// opens <path>.tmp for writing; tmp_path receives its name
static inline FILE* checkpoint_open_tmp_(const char* path, char tmp_path[CHECKPOINT_PATH_MAX]) {
    int n = snprintf(tmp_path, CHECKPOINT_PATH_MAX, "%s.tmp", path);
    if (n < 0 || n >= CHECKPOINT_PATH_MAX) { llm8_die("checkpoint path '%s' is too long", path); }
    return fopenCheck(tmp_path, "wb");
}

// puts the directory holding `path` on disk, so that its rename or removal reaches the disk
// before any later one (after a power cut as after a kill: DONE after the files, the files
// after DONE's removal); `done` says which ("writing", "removing") for the error
static inline void checkpoint_sync_dir_of_(const char* path, const char* done) {
    char dir[CHECKPOINT_PATH_MAX];
    snprintf(dir, sizeof(dir), "%s", path);
    char* slash = strrchr(dir, '/');
    if (slash == NULL) { snprintf(dir, sizeof(dir), "."); }
    else if (slash == dir) { dir[1] = '\0'; }
    else { *slash = '\0'; }
    int fd = open(dir, O_RDONLY | O_DIRECTORY);
    // a filesystem that cannot sync a directory (some network ones: EINVAL) keeps what rename gives
    if (fd < 0 || (fsync(fd) != 0 && errno != EINVAL && errno != ENOTSUP)) {
        llm8_die("cannot sync directory '%s' after %s '%s': %s", dir, done, path, strerror(errno));
    }
    close(fd);
}

// makes the finished temp file durable and moves it over `path` in one step, the directory
// synced after (checkpoint_sync_dir_of_)
static inline void checkpoint_commit_tmp_(FILE* fp, const char* tmp_path, const char* path) {
    if (fflush(fp) != 0 || fsync(fileno(fp)) != 0) {
        llm8_die("cannot flush '%s' to disk: %s", tmp_path, strerror(errno));
    }
    fcloseCheck(fp);
    if (rename(tmp_path, path) != 0) {
        llm8_die("cannot rename '%s' to '%s': %s", tmp_path, path, strerror(errno));
    }
    checkpoint_sync_dir_of_(path, "writing");
}

// marks step complete; call once every file of the step (all ranks) is written
static inline void checkpoint_write_done(const char* dir, int step) {
    char path[CHECKPOINT_PATH_MAX], tmp_path[CHECKPOINT_PATH_MAX];
    checkpoint_done_path(path, sizeof(path), dir, step);
    FILE* fp = checkpoint_open_tmp_(path, tmp_path);
    checkpoint_commit_tmp_(fp, tmp_path, path);
}

// the step of a checkpoint file's name, or -1: DONE_XXXXXXXX, model_XXXXXXXX.bin and
// state_XXXXXXXX_RRRRR.bin, each also with a .tmp suffix (a write cut off); marker_only: DONE_XXXXXXXX
// itself. Exact names only: other files in -o (a model_00000100.bin.bak) are never a step's
static inline int checkpoint_name_step_(const char* name, int marker_only) {
    const char* prefixes[3] = {"DONE_", "model_", "state_"};
    const char* suffixes[3] = {"", ".bin", "_#####.bin"};  // '#': a digit
    for (int i = 0; i < (marker_only ? 1 : 3); i++) {
        size_t length = strlen(prefixes[i]);
        if (strncmp(name, prefixes[i], length) != 0) { continue; }
        int step = 0;
        const char* p = name + length;
        for (int digits = 0; digits < 8; digits++, p++) {
            if (*p < '0' || *p > '9') { return -1; }
            step = step * 10 + (*p - '0');
        }
        for (const char* s = suffixes[i]; *s; s++, p++) {
            if (*s == '#' ? (*p < '0' || *p > '9') : *p != *s) { return -1; }
        }
        return (strcmp(p, "") == 0 || (!marker_only && strcmp(p, ".tmp") == 0)) ? step : -1;
    }
    return -1;
}

// the distinct steps in dir with a DONE marker (complete checkpoints; marker_only) or with any
// checkpoint file, newest first, in a malloc'd array (NULL when there are none; also when dir
// does not exist); count receives how many
// opens dir for listing; NULL only when it does not exist. Any other failure (no read permission,
// an I/O error, a stale network handle) dies: read as "no checkpoints", -y 1 started over and
// wrote the new run's files over the old run's
static inline DIR* checkpoint_open_dir_(const char* dir) {
    DIR* d = opendir(dir);
    if (d == NULL && errno != ENOENT) { llm8_die("cannot list checkpoint dir '%s': %s", dir, strerror(errno)); }
    return d;
}

// the next entry of dir, NULL at its end; a failed read dies as checkpoint_open_dir_ does
static inline struct dirent* checkpoint_next_entry_(DIR* d, const char* dir) {
    errno = 0;
    struct dirent* entry = readdir(d);
    if (entry == NULL && errno != 0) { llm8_die("cannot list checkpoint dir '%s': %s", dir, strerror(errno)); }
    return entry;
}

static inline int* checkpoint_steps_(const char* dir, int marker_only, int* count) {
    *count = 0;
    DIR* d = checkpoint_open_dir_(dir);
    if (d == NULL) { return NULL; }
    int* steps = NULL;
    int capacity = 0;
    struct dirent* entry;
    while ((entry = checkpoint_next_entry_(d, dir)) != NULL) {
        int step = checkpoint_name_step_(entry->d_name, marker_only);
        if (step < 0) { continue; }
        int seen = 0;
        for (int i = 0; i < *count && !seen; i++) { seen = steps[i] == step; }
        if (seen) { continue; }
        if (*count == capacity) {
            capacity = capacity > 0 ? 2 * capacity : 16;
            steps = (int*)realloc(steps, (size_t)capacity * sizeof(int));
            if (steps == NULL) { llm8_die("out of host memory listing the checkpoints in '%s'", dir); }
        }
        int at = (*count)++;  // insertion, newest first
        while (at > 0 && steps[at - 1] < step) { steps[at] = steps[at - 1]; at--; }
        steps[at] = step;
    }
    closedir(d);
    return steps;
}

static inline int* checkpoint_complete_steps(const char* dir, int* count) { return checkpoint_steps_(dir, 1, count); }

// the newest step in dir with a DONE marker, or -1 (also when dir does not exist)
static inline int checkpoint_find_latest(const char* dir) {
    int count;
    int* steps = checkpoint_complete_steps(dir, &count);
    int latest = count > 0 ? steps[0] : -1;
    free(steps);
    return latest;
}

/*
-y 1's step: the newest complete checkpoint in dir, or -1, and then a line saying the run starts
from scratch, naming the newest step whose files lack their DONE marker if there is one (its
write was cut off, or its marker lost: a user who knows every file of it complete can restore
the marker; this run would remove that step's files when it writes the step itself).
*/
static inline int checkpoint_resume_step(const char* dir) {
    int latest = checkpoint_find_latest(dir);
    if (latest >= 0) { return latest; }
    int count;
    int* steps = checkpoint_steps_(dir, 0, &count);
    if (count > 0) {
        printf("-y 1: no complete checkpoint in %s (step %d's files have no DONE_%08d: a write cut off?), starting "
               "from scratch\n", dir, steps[0], steps[0]);
    } else {
        printf("-y 1: no complete checkpoint in %s, starting from scratch\n", dir);
    }
    free(steps);
    return -1;
}

// deletes every file of a step: the DONE marker first, its removal synced to disk (so the
// step stops counting as complete before any of its files goes, even across a power cut),
// then the model file and all ranks' state files, leftover .tmp files (the marker's too)
// included
static inline void checkpoint_remove(const char* dir, int step) {
    char path[CHECKPOINT_PATH_MAX];
    checkpoint_done_path(path, sizeof(path), dir, step);
    if (remove(path) == 0) {
        checkpoint_sync_dir_of_(path, "removing");
    } else if (errno != ENOENT) {
        llm8_die("cannot remove '%s': %s", path, strerror(errno));
    }
    DIR* d = checkpoint_open_dir_(dir);
    if (d == NULL) { return; }
    struct dirent* entry;
    while ((entry = checkpoint_next_entry_(d, dir)) != NULL) {
        const char* name = entry->d_name;
        if (checkpoint_name_step_(name, 0) != step) { continue; }
        path_in_dir(path, sizeof(path), dir, name);
        if (remove(path) != 0) { llm8_die("cannot remove checkpoint file '%s': %s", path, strerror(errno)); }
    }
    closedir(d);
}

/*
A run that starts over (-y 0) in a dir that already holds complete checkpoints would mix two
runs there: its main.log would replace the old run's while the old checkpoints stay (a later
-y 1 would resume the old run onto the new log), and with -n, -nk would count the old run's
later steps as the newest and remove the new run's checkpoints as they are written. Refused
with one line naming the newest, -n or not (an evaluation, -x 0, of a checkpoint writes its log
to another -o) (dir NULL: no -o).
*/
static inline void checkpoint_check_fresh_dir(const char* dir, int resume) {
    if (dir == NULL || resume) { return; }
    int latest = checkpoint_find_latest(dir);
    if (latest >= 0) {
        llm8_die("-o %s already holds the checkpoints of a run (the newest: step %d): -y 1 resumes it; to start over, "
                 "give another -o or remove them", dir, latest);
    }
}

/*
-o's checks at startup, before any step runs (dir NULL: no -o; nothing to check):
- it exists (created as mkdir -p) and can be written and listed (ensure_writable_dir);
- its longest checkpoint file name (a state file's .tmp) fits CHECKPOINT_PATH_MAX: found only at
  the first save, a long -o cost every step before it;
- rank 0 holds an exclusive lock on <dir>/.llm8.lock while it runs: two runs in one -o (a job
  started twice, a requeue while the old one still runs) would write the same .tmp files and
  mark a mix of both complete. A filesystem without locks (some network ones) gets a note;
- a fresh run does not mix its checkpoints with another's (checkpoint_check_fresh_dir).
*/
#define CHECKPOINT_LOCK_NAME ".llm8.lock"
static inline void checkpoint_claim_dir(const char* dir, int process_rank, int resume) {
    if (dir == NULL) { return; }
    const char* longest_name = "/state_00000000_00000.bin.tmp";
    if (strlen(dir) + strlen(longest_name) >= CHECKPOINT_PATH_MAX) {
        llm8_die("-o %s: %zu characters, too long for its checkpoint files (at most %zu)", dir, strlen(dir),
                 CHECKPOINT_PATH_MAX - 1 - strlen(longest_name));
    }
    ensure_writable_dir(dir);
    if (process_rank == 0) {
        char lock_path[CHECKPOINT_PATH_MAX];
        path_in_dir(lock_path, sizeof(lock_path), dir, CHECKPOINT_LOCK_NAME);
        int fd = open(lock_path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);  // held open, so locked, until exit
        if (fd < 0) { llm8_die("-o %s: cannot open '%s': %s", dir, lock_path, strerror(errno)); }
        if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
            if (errno == EWOULDBLOCK) {
                llm8_die("-o %s is in use by another run ('%s' is locked): two runs in one -o would mix their "
                         "checkpoints; wait for it to end or give another -o", dir, lock_path);
            }
            printf("note: -o %s: cannot lock '%s' (%s): nothing stops a second run from using this -o\n", dir,
                   lock_path, strerror(errno));
            close(fd);
        }
    }
    checkpoint_check_fresh_dir(dir, resume);
}

/*
-nk / -nm: keeps the newest `keep` complete checkpoints in dir and, of the older ones, the major
ones (a step that is a multiple of major_every > 0); removes the rest (checkpoint_remove). keep
0 keeps everything. Looks at what is on disk, so checkpoints of irregular steps (the last
step, an earlier run's other -n) count like the others. Also removes the files of incomplete
steps older than the newest complete one: a checkpoint or a removal cut off half way by a
killed run, which no later run would write over (at d48 one is about 20 GB).
*/
static inline void checkpoint_keep_newest(const char* dir, int keep, int major_every) {
    if (keep <= 0) { return; }
    int count;
    int* steps = checkpoint_complete_steps(dir, &count);
    for (int i = keep; i < count; i++) {
        if (major_every > 0 && steps[i] % major_every == 0) { continue; }
        checkpoint_remove(dir, steps[i]);
    }
    int newest_complete = count > 0 ? steps[0] : -1;
    free(steps);
    int* any = checkpoint_steps_(dir, 0, &count);
    for (int i = 0; i < count; i++) {
        char done[CHECKPOINT_PATH_MAX];
        checkpoint_done_path(done, sizeof(done), dir, any[i]);
        if (any[i] >= newest_complete || access(done, F_OK) == 0) { continue; }
        if (errno != ENOENT) { llm8_die("cannot check '%s': %s", done, strerror(errno)); }
        checkpoint_remove(dir, any[i]);
    }
    free(any);
}

// opens a checkpoint file for reading, checks its header magic, returns the header and size
static inline FILE* checkpoint_open_read_(const char* path, const char* kind, int32_t magic,
                                          int32_t header[CHECKPOINT_HEADER_INTS], long* file_bytes) {
    FILE* fp = fopenCheck(path, "rb");
    *file_bytes = file_size_bytes(fp);
    if (*file_bytes < (long)CHECKPOINT_HEADER_BYTES) {
        llm8_die("%s file '%s' is %ld bytes, shorter than its %zu-byte header", kind, path, *file_bytes,
                 CHECKPOINT_HEADER_BYTES);
    }
    freadCheck(header, sizeof(int32_t), CHECKPOINT_HEADER_INTS, fp);
    if (header[0] != magic) {
        llm8_die("%s file '%s' has magic %d, expected %d", kind, path, header[0], magic);
    }
    return fp;
}

// ----------------------------------------------------------------------------
// model files

static inline size_t model_file_bytes_per_param_(int version) {
    return version == MODEL_VERSION_BF16 ? sizeof(uint16_t) : sizeof(float);
}

// reads and checks the header and length of an open model file
static inline FILE* model_file_open_(const char* path, GPT2Config* cfg, int* version) {
    int32_t header[CHECKPOINT_HEADER_INTS];
    long file_bytes;
    FILE* fp = checkpoint_open_read_(path, "model", MODEL_FILE_MAGIC, header, &file_bytes);
    if (header[1] != MODEL_VERSION_FP32 && header[1] != MODEL_VERSION_BF16) {
        llm8_die("model file '%s' has version %d, expected %d (fp32) or %d (bf16)", path, header[1],
                 MODEL_VERSION_FP32, MODEL_VERSION_BF16);
    }
    *version = header[1];
    cfg->max_seq_len = header[2];
    cfg->vocab_size = header[3];
    cfg->num_layers = header[4];
    cfg->num_heads = header[5];
    cfg->channels = header[6];
    cfg->padded_vocab_size = header[7];
    char source[CHECKPOINT_PATH_MAX + 16];
    snprintf(source, sizeof(source), "model file '%s'", path);
    gpt2_config_validate(cfg, source);
    long expected = (long)(CHECKPOINT_HEADER_BYTES + gpt2_num_parameters(cfg) * model_file_bytes_per_param_(*version));
    if (file_bytes != expected) {
        llm8_die("model file '%s' is %ld bytes but its header (L=%d NH=%d C=%d maxT=%d Vp=%d, version %d) needs %ld",
                 path, file_bytes, cfg->num_layers, cfg->num_heads, cfg->channels, cfg->max_seq_len,
                 cfg->padded_vocab_size, *version, expected);
    }
    return fp;
}

static inline void model_file_read_header(const char* path, GPT2Config* cfg, int* version) {
    FILE* fp = model_file_open_(path, cfg, version);
    fcloseCheck(fp);
}

// a NaN or Inf weight makes every forward non-finite: every step would be skipped and the run end with nothing
// trained, so a model file holding one (corrupt, or saved from a run that diverged) dies naming the tensor
static inline void model_file_check_finite_(const char* path, const GPT2Config* cfg, const float* params) {
    size_t sizes[NUM_PARAMETER_TENSORS];
    gpt2_param_sizes(cfg, sizes);
    size_t begin = 0;
    for (int t = 0; t < NUM_PARAMETER_TENSORS; t++) {
        for (size_t i = 0; i < sizes[t]; i++) {
            if (!isfinite(params[begin + i])) {
                llm8_die("model file '%s': element %zu of %s is %g, expected a finite number", path, i,
                         PARAM_TENSOR_NAMES[t], params[begin + i]);
            }
        }
        begin += sizes[t];
    }
}

// params holds gpt2_num_parameters(cfg) floats; bf16 files are widened exactly
static inline void model_file_read_params(const char* path, const GPT2Config* cfg, float* params) {
    GPT2Config file_cfg;
    int version;
    FILE* fp = model_file_open_(path, &file_cfg, &version);
    if (memcmp(&file_cfg, cfg, sizeof(GPT2Config)) != 0) {
        llm8_die("model file '%s' holds a different shape than the one asked for (L=%d NH=%d C=%d maxT=%d V=%d Vp=%d)",
                 path, cfg->num_layers, cfg->num_heads, cfg->channels, cfg->max_seq_len, cfg->vocab_size,
                 cfg->padded_vocab_size);
    }
    size_t n = gpt2_num_parameters(cfg);
    if (version == MODEL_VERSION_FP32) {
        freadCheck(params, sizeof(float), n, fp);
    } else {
        uint16_t* chunk = (uint16_t*)mallocCheck(CHECKPOINT_CHUNK_ELEMS * sizeof(uint16_t));
        for (size_t start = 0; start < n; start += CHECKPOINT_CHUNK_ELEMS) {
            size_t count = (n - start < CHECKPOINT_CHUNK_ELEMS) ? n - start : CHECKPOINT_CHUNK_ELEMS;
            freadCheck(chunk, sizeof(uint16_t), count, fp);
            for (size_t i = 0; i < count; i++) { params[start + i] = bf16_bits_to_float(chunk[i]); }
        }
        free(chunk);
    }
    fcloseCheck(fp);
    model_file_check_finite_(path, cfg, params);
}

// version 3 writes fp32; version 5 rounds to bf16 (nearest even), as llm.c's bf16 files
static inline void model_file_write(const char* path, const GPT2Config* cfg, const float* params, int version) {
    if (version != MODEL_VERSION_FP32 && version != MODEL_VERSION_BF16) {
        llm8_die("model file '%s': cannot write version %d (expected %d or %d)", path, version,
                 MODEL_VERSION_FP32, MODEL_VERSION_BF16);
    }
    int32_t header[CHECKPOINT_HEADER_INTS];
    memset(header, 0, sizeof(header));
    header[0] = MODEL_FILE_MAGIC;
    header[1] = version;
    header[2] = cfg->max_seq_len;
    header[3] = cfg->vocab_size;
    header[4] = cfg->num_layers;
    header[5] = cfg->num_heads;
    header[6] = cfg->channels;
    header[7] = cfg->padded_vocab_size;
    char tmp_path[CHECKPOINT_PATH_MAX];
    FILE* fp = checkpoint_open_tmp_(path, tmp_path);
    fwriteCheck(header, sizeof(int32_t), CHECKPOINT_HEADER_INTS, fp);
    size_t n = gpt2_num_parameters(cfg);
    if (version == MODEL_VERSION_FP32) {
        fwriteCheck(params, sizeof(float), n, fp);
    } else {
        uint16_t* chunk = (uint16_t*)mallocCheck(CHECKPOINT_CHUNK_ELEMS * sizeof(uint16_t));
        for (size_t start = 0; start < n; start += CHECKPOINT_CHUNK_ELEMS) {
            size_t count = (n - start < CHECKPOINT_CHUNK_ELEMS) ? n - start : CHECKPOINT_CHUNK_ELEMS;
            for (size_t i = 0; i < count; i++) { chunk[i] = float_to_bf16_bits(params[start + i]); }
            fwriteCheck(chunk, sizeof(uint16_t), count, fp);
        }
        free(chunk);
    }
    checkpoint_commit_tmp_(fp, tmp_path, path);
}

// ----------------------------------------------------------------------------
// state files

typedef struct {
    int step;
    uint64_t rng_state;             // the trainer's stochastic-rounding seed state
    uint64_t rng_state_last_update;
    int total_batch_size;           // tokens per optimizer step (-d resolved); read: 0 when the file does not record it
    int data_reshaped;              // read: the file's B or T is not the loader's, which was left at its start
} TrainState;

// one llm8 addition to the state file (version 2); tag: up to 15 ASCII characters
typedef struct {
    const char* tag;
    void* data;
    size_t bytes;
    int optional;  // a reader accepts a file without it, and leaves data as the caller set it
} StateSection;

// this rank's optimizer state, and what else the run keeps
typedef struct {
    size_t shard_num_parameters;
    float* m;                 // fp32 AdamW moments; both NULL when the optimizer keeps them in sections
    float* v;
    float* master_weights;    // NULL without fp32 master weights
    const StateSection* sections;
    int num_sections;
} StateBuffers;

static inline int state_buffers_fp32_moments_(const StateBuffers* buffers, const char* path) {
    if ((buffers->m == NULL) != (buffers->v == NULL)) {
        llm8_die("state file '%s': m and v must both be given or both be NULL", path);
    }
    return buffers->m != NULL;
}

static inline void state_section_tag_(char tag[STATE_SECTION_TAG_BYTES], const char* name, const char* path) {
    size_t length = strlen(name);
    if (length == 0 || length >= STATE_SECTION_TAG_BYTES) {
        llm8_die("state file '%s': section tag '%s' must be 1..%d characters", path, name, STATE_SECTION_TAG_BYTES - 1);
    }
    memset(tag, 0, STATE_SECTION_TAG_BYTES);
    memcpy(tag, name, length);
}

static inline void state_file_write(const char* path, const TrainState* state, const StateBuffers* buffers,
                                    const DataLoader* loader) {
    int fp32_moments = state_buffers_fp32_moments_(buffers, path);
    // several ranks' files are version 2 too: llm.c cuts a rank's state otherwise, and refuses version 2
    int version = (fp32_moments && buffers->num_sections == 0 && loader->num_processes == 1) ? STATE_VERSION_LLMC
                                                                                               : STATE_VERSION_SECTIONS;
    int32_t header[CHECKPOINT_HEADER_INTS];
    memset(header, 0, sizeof(header));
    header[0] = STATE_FILE_MAGIC;
    header[1] = version;
    header[2] = loader->num_processes;
    header[3] = loader->process_rank;
    header[4] = buffers->master_weights != NULL;
    header[5] = loader->should_shuffle;
    header[STATE_SLOT_MOMENTS_IN_SECTIONS] = !fp32_moments;
    header[STATE_SLOT_MICRO_BATCH] = (int32_t)loader->B;
    header[STATE_SLOT_SEQ_LEN] = (int32_t)loader->T;
    header[STATE_SLOT_LAYOUT] = STATE_LAYOUT_LLM8_WINDOWS;
    header[10] = state->step;
    header[STATE_SLOT_TOTAL_BATCH] = state->total_batch_size;
    uint64_t u64_fields[4] = { state->rng_state, state->rng_state_last_update,
                               (uint64_t)loader->current_shard_idx, (uint64_t)loader->current_sample_idx };
    memcpy(&header[20], &u64_fields[0], 2 * sizeof(uint64_t));
    memcpy(&header[30], &u64_fields[2], 2 * sizeof(uint64_t));
    header[STATE_SLOT_NUM_SECTIONS] = buffers->num_sections;
    uint64_t shard_parameters = buffers->shard_num_parameters;
    memcpy(&header[STATE_SLOT_SHARD_PARAMETERS], &shard_parameters, sizeof(shard_parameters));

    char tmp_path[CHECKPOINT_PATH_MAX];
    FILE* fp = checkpoint_open_tmp_(path, tmp_path);
    fwriteCheck(header, sizeof(int32_t), CHECKPOINT_HEADER_INTS, fp);
    size_t n = buffers->shard_num_parameters;
    if (fp32_moments) {
        fwriteCheck(buffers->m, sizeof(float), n, fp);
        fwriteCheck(buffers->v, sizeof(float), n, fp);
    }
    if (buffers->master_weights != NULL) { fwriteCheck(buffers->master_weights, sizeof(float), n, fp); }
    dataloader_write_state(loader, fp);
    for (int i = 0; i < buffers->num_sections; i++) {
        char tag[STATE_SECTION_TAG_BYTES];
        state_section_tag_(tag, buffers->sections[i].tag, path);
        uint64_t bytes = buffers->sections[i].bytes;
        fwriteCheck(tag, 1, STATE_SECTION_TAG_BYTES, fp);
        fwriteCheck(&bytes, sizeof(bytes), 1, fp);
        fwriteCheck(buffers->sections[i].data, 1, buffers->sections[i].bytes, fp);
    }
    checkpoint_commit_tmp_(fp, tmp_path, path);
}

// how a state file's section and the run's disagree
typedef enum { SECTION_ONLY_IN_FILE, SECTION_ONLY_IN_RUN, SECTION_OTHER_SIZE } StateSectionMismatch;

// which flag a state section's tag belongs to, for the errors of a resume with other flags
static inline const char* state_section_flag_hint_(const char* tag, StateSectionMismatch mismatch) {
    if (strncmp(tag, "fp8", 3) == 0) {
        return mismatch == SECTION_ONLY_IN_FILE ? "written by a -p fp8 run? resume with the same -p and FP8 flags, on the "
                                                  "trainer that wrote it: its FP8 scaling state is that trainer's"
             : mismatch == SECTION_ONLY_IN_RUN ? "written by a -p bf16 run? resume with -p bf16"
             : "written with other FP8 linears or passes? resume with the same -f8 and -f8p";
    }
    if (strncmp(tag, "adamw8", 6) == 0) { return "written with other -opt or -qs? resume with the same -opt and -qs"; }
    if (strcmp(tag, "outlier_windows") == 0) { return "written with -sl or -sg? resume with them"; }
    return "different precision or optimizer flags?";
}

static inline void state_section_check_size_(const char* path, const char* tag, uint64_t file_bytes, size_t run_bytes) {
    if (file_bytes != run_bytes) {
        llm8_die("state file '%s': section '%s' is %llu bytes, this run expects %zu (%s)", path, tag,
                 (unsigned long long)file_bytes, run_bytes, state_section_flag_hint_(tag, SECTION_OTHER_SIZE));
    }
}

// dies naming the first section the run keeps that is not optional and not among the file's
// (found[j]: run section j was in the file)
static inline void state_file_check_required_(const char* path, const StateSection* sections, int num_sections,
                                              const int* found) {
    for (int j = 0; j < num_sections; j++) {
        if (!sections[j].optional && !found[j]) {
            llm8_die("state file '%s' has no section '%s', which this run keeps (%s)", path, sections[j].tag,
                     state_section_flag_hint_(sections[j].tag, SECTION_ONLY_IN_RUN));
        }
    }
}

// the index of the run's section a file's section `tag` fills; dies when the run keeps none so named
static inline int state_sections_find_(const StateSection* sections, int num_sections, const char* tag, const char* path) {
    for (int j = 0; j < num_sections; j++) {
        if (strcmp(sections[j].tag, tag) == 0) { return j; }
    }
    llm8_die("state file '%s' has a section '%s' this run does not keep (%s)", path, tag,
             state_section_flag_hint_(tag, SECTION_ONLY_IN_FILE));
    return -1;
}

// reads the tagged sections at the file position into the buffers' sections, matched by tag
static inline void state_file_read_sections_(FILE* fp, const char* path, long file_bytes, int num_sections,
                                             const StateBuffers* buffers) {
    if (buffers->num_sections > STATE_FILE_MAX_SECTIONS) {
        llm8_die("state file '%s': this run keeps %d sections, at most %d", path, buffers->num_sections, STATE_FILE_MAX_SECTIONS);
    }
    int found[STATE_FILE_MAX_SECTIONS] = {0};
    for (int i = 0; i < num_sections; i++) {
        char tag[STATE_SECTION_TAG_BYTES];
        uint64_t bytes;
        if (file_bytes - ftell(fp) < (long)(STATE_SECTION_TAG_BYTES + sizeof(bytes))) {
            llm8_die("state file '%s': truncated in section %d of %d", path, i, num_sections);
        }
        freadCheck(tag, 1, STATE_SECTION_TAG_BYTES, fp);
        freadCheck(&bytes, sizeof(bytes), 1, fp);
        tag[STATE_SECTION_TAG_BYTES - 1] = '\0';
        int j = state_sections_find_(buffers->sections, buffers->num_sections, tag, path);
        if (found[j]) { llm8_die("state file '%s' has section '%s' twice", path, tag); }
        found[j] = 1;
        const StateSection* match = &buffers->sections[j];
        state_section_check_size_(path, tag, bytes, match->bytes);
        if ((uint64_t)(file_bytes - ftell(fp)) < bytes) {
            llm8_die("state file '%s': section '%s' is truncated", path, tag);
        }
        freadCheck(match->data, 1, match->bytes, fp);
    }
    state_file_check_required_(path, buffers->sections, buffers->num_sections, found);
}

// ----------------------------------------------------------------------------
// a state file's map, for readers that take pieces of several files (state_reshard.h)

typedef struct {
    char tag[STATE_SECTION_TAG_BYTES];  // NUL-terminated
    long offset;                        // of the section's bytes in the file
    uint64_t bytes;
} StateSectionPlace;

typedef struct {
    int version;
    int num_processes;
    int process_rank;
    int has_master;
    int should_shuffle;
    int fp32_moments;                   // the body holds fp32 m and v (version 1, or header [6] = 0)
    int step;
    int micro_batch, seq_len;           // the writer's B and T (0: not recorded)
    int total_batch_size;               // the writer's tokens per step (0: not recorded)
    int llm8_windows;                   // header [9]: rank r holds the flat window [r S, (r + 1) S) (else llm.c's cut)
    int num_sections;
    uint64_t shard_num_parameters;      // header [42-43]: the writer's parameters per body array (0: not recorded)
    long m_offset, v_offset;            // fp32_moments: shard_num_parameters floats each
    long master_offset;                 // has_master: shard_num_parameters floats
    StateSectionPlace sections[STATE_FILE_MAX_SECTIONS];
} StateFileIndex;

// the header's fields (the offsets stay 0); dies on a version this reader does not know
static inline void state_file_decode_header_(const int32_t header[CHECKPOINT_HEADER_INTS], const char* path,
                                             StateFileIndex* index) {
    memset(index, 0, sizeof(*index));
    index->version = header[1];
    if (index->version != STATE_VERSION_LLMC && index->version != STATE_VERSION_SECTIONS) {
        llm8_die("state file '%s' has version %d, expected %d or %d", path, index->version, STATE_VERSION_LLMC,
                 STATE_VERSION_SECTIONS);
    }
    // flags are 0 or 1 (slots 6 and 9 are llm8's, 6 read in version 2 only): any other value is corruption
    int flag_slots[4] = {4, 5, STATE_SLOT_LAYOUT, STATE_SLOT_MOMENTS_IN_SECTIONS};
    for (int i = 0; i < (index->version == STATE_VERSION_LLMC ? 3 : 4); i++) {
        if (header[flag_slots[i]] != 0 && header[flag_slots[i]] != 1) {
            llm8_die("state file '%s' has %d in header slot %d, expected 0 or 1", path, header[flag_slots[i]], flag_slots[i]);
        }
    }
    index->num_processes = header[2];
    index->process_rank = header[3];
    index->has_master = header[4];
    index->should_shuffle = header[5];
    index->fp32_moments = index->version == STATE_VERSION_LLMC || header[STATE_SLOT_MOMENTS_IN_SECTIONS] == 0;
    index->step = header[10];
    index->micro_batch = header[STATE_SLOT_MICRO_BATCH];
    index->seq_len = header[STATE_SLOT_SEQ_LEN];
    index->total_batch_size = header[STATE_SLOT_TOTAL_BATCH];
    // llm8's mark, or what llm.c never writes (older llm8 files): version 2, or B and T
    index->llm8_windows = header[STATE_SLOT_LAYOUT] == STATE_LAYOUT_LLM8_WINDOWS ||
                          index->version == STATE_VERSION_SECTIONS || index->micro_batch != 0;
    if (index->micro_batch < 0 || index->seq_len < 0 || (index->micro_batch == 0) != (index->seq_len == 0)) {
        llm8_die("state file '%s' has B=%d, T=%d in header slots %d and %d, expected both positive or both 0", path,
                 index->micro_batch, index->seq_len, STATE_SLOT_MICRO_BATCH, STATE_SLOT_SEQ_LEN);
    }
    long long micro_step_tokens = (long long)index->micro_batch * index->seq_len * index->num_processes;
    if (index->total_batch_size < 0 ||
        (index->total_batch_size > 0 && (micro_step_tokens <= 0 || index->total_batch_size % micro_step_tokens != 0))) {
        llm8_die("state file '%s' has %d in header slot %d, expected its total batch in tokens, a multiple of B*T*processes "
                 "= %d*%d*%d (or 0: not recorded)", path, index->total_batch_size, STATE_SLOT_TOTAL_BATCH,
                 index->micro_batch, index->seq_len, index->num_processes);
    }
    index->num_sections = index->version == STATE_VERSION_LLMC ? 0 : header[STATE_SLOT_NUM_SECTIONS];
    memcpy(&index->shard_num_parameters, &header[STATE_SLOT_SHARD_PARAMETERS], sizeof(index->shard_num_parameters));
    if (index->num_sections < 0 || index->num_sections > STATE_FILE_MAX_SECTIONS) {
        llm8_die("state file '%s' claims %d sections, expected 0..%d", path, index->num_sections, STATE_FILE_MAX_SECTIONS);
    }
}

/*
A state file's parameters per body array (llm8 records them; llm.c's files, and llm8's before it,
do not) against what this run reads: a state of another model would otherwise pass as long as it
is larger, and its shuffle trailer and sections be read from inside its arrays.
*/
static inline void state_file_check_parameters_(const char* path, const StateFileIndex* index, size_t expected) {
    if (index->shard_num_parameters != 0 && index->shard_num_parameters != (uint64_t)expected) {
        llm8_die("state file '%s' holds %llu parameters per rank, this run %zu: a state of another model?", path,
                 (unsigned long long)index->shard_num_parameters, expected);
    }
}

// a state file's master weights against this run's (-w)
static inline void state_file_check_master(const char* path, int file_has_master, int run_has_master) {
    if (file_has_master != run_has_master) {
        llm8_die("state file '%s' was written with use_master_weights=%d, this run has %d (resume it with -w %d)", path,
                 file_has_master, run_has_master, file_has_master);
    }
}

static inline void state_file_read_header(const char* path, StateFileIndex* index) {
    int32_t header[CHECKPOINT_HEADER_INTS];
    long file_bytes;
    FILE* fp = checkpoint_open_read_(path, "state", STATE_FILE_MAGIC, header, &file_bytes);
    fcloseCheck(fp);
    state_file_decode_header_(header, path, index);
}

/*
The header and where everything is, for a file whose body arrays hold shard_num_parameters
floats each: the body, the shuffle trailer (skipped), every section's tag, place and size.
The walk must end exactly at the end of the file; a truncated or overlong file dies naming it.
*/
static inline void state_file_index(const char* path, size_t shard_num_parameters, StateFileIndex* index) {
    int32_t header[CHECKPOINT_HEADER_INTS];
    long file_bytes;
    FILE* fp = checkpoint_open_read_(path, "state", STATE_FILE_MAGIC, header, &file_bytes);
    state_file_decode_header_(header, path, index);
    state_file_check_parameters_(path, index, shard_num_parameters);
    long array_bytes = (long)(shard_num_parameters * sizeof(float));
    long at = (long)CHECKPOINT_HEADER_BYTES;
    index->m_offset = index->v_offset = index->master_offset = -1;  // an array the file lacks: a seek there fails
    if (index->fp32_moments) {
        index->m_offset = at;
        index->v_offset = at + array_bytes;
        at += 2 * array_bytes;
    }
    if (index->has_master) {
        index->master_offset = at;
        at += array_bytes;
    }
    if (file_bytes < at) {
        llm8_die("state file '%s' is %ld bytes, expected at least %ld for %zu parameters per rank", path, file_bytes, at,
                 shard_num_parameters);
    }
    fseekCheck(fp, at, SEEK_SET);
    if (index->should_shuffle) { dataloader_skip_state(fp, path); }
    for (int i = 0; i < index->num_sections; i++) {
        StateSectionPlace* place = &index->sections[i];
        if (file_bytes - ftell(fp) < (long)(STATE_SECTION_TAG_BYTES + sizeof(place->bytes))) {
            llm8_die("state file '%s': truncated in section %d of %d", path, i, index->num_sections);
        }
        freadCheck(place->tag, 1, STATE_SECTION_TAG_BYTES, fp);
        freadCheck(&place->bytes, sizeof(place->bytes), 1, fp);
        place->tag[STATE_SECTION_TAG_BYTES - 1] = '\0';
        place->offset = ftell(fp);
        if ((uint64_t)(file_bytes - place->offset) < place->bytes) {
            llm8_die("state file '%s': section '%s' is truncated", path, place->tag);
        }
        fseekCheck(fp, (long)place->bytes, SEEK_CUR);
    }
    long end = ftell(fp);
    if (end != file_bytes) {
        llm8_die("state file '%s' has %ld unexpected bytes after its contents", path, file_bytes - end);
    }
    fcloseCheck(fp);
}

// the section tagged `tag` in an indexed file, or NULL
static inline const StateSectionPlace* state_file_find_section(const StateFileIndex* index, const char* tag) {
    for (int i = 0; i < index->num_sections; i++) {
        if (strcmp(index->sections[i].tag, tag) == 0) { return &index->sections[i]; }
    }
    return NULL;
}

/*
Restores a run: fills state and the buffers, and puts the loader at the saved position (with
its shuffle state). The file must have been written by a run with the same ranks, shuffle
flag, master-weights use and sections; anything else is a one-line error naming the file.
A file of another B or T (header [7], [8]) holds a position in samples of another size: the
loader is left at its start and state->data_reshaped set, for the caller to replay it
(train_state_read).
*/
static inline void state_file_read(const char* path, TrainState* state, const StateBuffers* buffers, DataLoader* loader) {
    int32_t header[CHECKPOINT_HEADER_INTS];
    long file_bytes;
    FILE* fp = checkpoint_open_read_(path, "state", STATE_FILE_MAGIC, header, &file_bytes);
    StateFileIndex fields;
    state_file_decode_header_(header, path, &fields);
    if (header[2] != loader->num_processes || header[3] != loader->process_rank) {
        llm8_die("state file '%s' is rank %d of %d processes, this process is rank %d of %d", path, header[3], header[2],
                 loader->process_rank, loader->num_processes);
    }
    if (header[2] > 1 && !fields.llm8_windows) {  // train_state_read_checkpoint reads those (state_reshard.h)
        llm8_die("state file '%s' cuts the optimizer state as llm.c's ranks do, not as llm8's: read it through "
                 "train_state_read_checkpoint", path);
    }
    state_file_check_parameters_(path, &fields, buffers->shard_num_parameters);
    state_file_check_master(path, header[4], buffers->master_weights != NULL);
    if (header[5] != loader->should_shuffle) {
        llm8_die("state file '%s' was written with shuffling=%d, this run has %d", path, header[5], loader->should_shuffle);
    }
    int fp32_moments = state_buffers_fp32_moments_(buffers, path);
    int file_fp32_moments = fields.fp32_moments;
    if (file_fp32_moments != fp32_moments) {
        llm8_die("state file '%s' %s fp32 AdamW moments, this run %s (different optimizer flag?)", path,
                 file_fp32_moments ? "has" : "has no", fp32_moments ? "needs them" : "keeps 8-bit states");
    }
    int num_sections = fields.num_sections;
    size_t n = buffers->shard_num_parameters;
    size_t num_arrays = (fp32_moments ? 2 : 0) + (buffers->master_weights != NULL ? 1 : 0);
    long body_bytes = (long)(CHECKPOINT_HEADER_BYTES + num_arrays * n * sizeof(float));
    if (file_bytes < body_bytes || (!loader->should_shuffle && num_sections == 0 && file_bytes != body_bytes)) {
        llm8_die("state file '%s' is %ld bytes, expected %s%ld for %zu parameters per rank", path, file_bytes,
                 (loader->should_shuffle || num_sections > 0) ? "at least " : "", body_bytes, n);
    }
    uint64_t u64_fields[4];
    memcpy(&u64_fields[0], &header[20], 2 * sizeof(uint64_t));
    memcpy(&u64_fields[2], &header[30], 2 * sizeof(uint64_t));
    if (u64_fields[2] >= loader->num_shards) {
        llm8_die("state file '%s' is at shard %llu, but only %zu shards match the data pattern", path,
                 (unsigned long long)u64_fields[2], loader->num_shards);
    }
    state->step = header[10];
    state->total_batch_size = header[STATE_SLOT_TOTAL_BATCH];
    state->rng_state = u64_fields[0];
    state->rng_state_last_update = u64_fields[1];
    if (fp32_moments) {
        freadCheck(buffers->m, sizeof(float), n, fp);
        freadCheck(buffers->v, sizeof(float), n, fp);
    }
    if (buffers->master_weights != NULL) { freadCheck(buffers->master_weights, sizeof(float), n, fp); }
    state->data_reshaped = fields.micro_batch != 0 && ((size_t)fields.micro_batch != loader->B || (size_t)fields.seq_len != loader->T);
    if (!state->data_reshaped) { dataloader_read_state(loader, fp, path); }
    else if (loader->should_shuffle) { dataloader_skip_state(fp, path); }
    state_file_read_sections_(fp, path, file_bytes, num_sections, buffers);
    long end = ftell(fp);
    if (end != file_bytes) {
        llm8_die("state file '%s' has %ld unexpected bytes after its contents", path, file_bytes - end);
    }
    fcloseCheck(fp);
    if (!state->data_reshaped) { dataloader_resume(loader, (size_t)u64_fields[2], (size_t)u64_fields[3], path); }
}

#endif // LLMC_CHECKPOINT_H
