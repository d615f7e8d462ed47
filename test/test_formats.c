/*
test_formats.c: model, state and tokenizer files, checkpoint atomicity and the logger; the
file helpers, flag parsers and model config of llmc/utils.h and llmc/gpt2_config.h.

Files written by test/make_llmc_files.py (numpy, llm.c's layout, independent of our C) are
read and compared with the values the script documents, and our writers must reproduce
those files byte for byte. Our own files round-trip bit for bit. Every bad input ends the
process with one `error:` line naming the file (test_harness_fork.h).
Run from the repository root: build/test_formats
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>
#include "test/test_harness.h"
#include "test/test_harness_fork.h"
#include "llmc/utils.h"
#include "llmc/gpt2_config.h"
#include "llmc/dataloader.h"
#include "llmc/checkpoint.h"
#include "llmc/tokenizer.h"
#include "llmc/logger.h"
#include "llmc/train_config.h"
#include "llmc/train_state.h"

// the shapes make_llmc_files.py uses
#define PY_STATE_NUM_PARAMS 100
#define PY_STATE_B 2
#define PY_STATE_T 8
#define PY_SHUFFLE_BATCHES (123 * 6)  // state_v1_shuffle.bin: step 123 of 6 micro-batches

static char g_dir[256];     // scratch dir for our files
static char g_py_dir[512];  // files from make_llmc_files.py

static const char* in_dir(const char* dir, const char* name) {
    static char paths[8][1024];
    static int next = 0;
    char* path = paths[next];
    next = (next + 1) % 8;
    snprintf(path, 1024, "%s/%s", dir, name);
    return path;
}

static unsigned char* read_all(const char* path, size_t* length) {
    FILE* fp = fopenCheck(path, "rb");
    long n = file_size_bytes(fp);
    unsigned char* bytes = (unsigned char*)mallocCheck((size_t)n + 1);
    freadCheck(bytes, 1, (size_t)n, fp);
    fcloseCheck(fp);
    *length = (size_t)n;
    return bytes;
}

static void write_all(const char* path, const void* bytes, size_t length) {
    FILE* fp = fopenCheck(path, "wb");
    fwriteCheck(bytes, 1, length, fp);
    fcloseCheck(fp);
}

static int files_identical(const char* a, const char* b) {
    size_t na, nb;
    unsigned char* x = read_all(a, &na);
    unsigned char* y = read_all(b, &nb);
    int same = na == nb && memcmp(x, y, na) == 0;
    free(x);
    free(y);
    return same;
}

// our state file against llm.c's: the same bytes, but for the B and T and the layout mark ours
// keeps in header slots 7 to 9 and the parameter count in 42-43, which llm.c leaves 0 and never reads
static int state_file_is_llmc_plus_llm8_slots(const char* ours, const char* llmc, int B, int T, uint64_t shard_parameters) {
    size_t na, nb;
    unsigned char* x = read_all(ours, &na);
    unsigned char* y = read_all(llmc, &nb);
    int32_t llm8_slots[3] = {B, T, STATE_LAYOUT_LLM8_WINDOWS}, zeros[3] = {0, 0, 0};
    uint64_t no_count = 0;
    int same = na == nb && na >= CHECKPOINT_HEADER_BYTES && STATE_SLOT_SEQ_LEN == STATE_SLOT_MICRO_BATCH + 1 &&
               STATE_SLOT_LAYOUT == STATE_SLOT_SEQ_LEN + 1 && memcmp(x + 4 * STATE_SLOT_MICRO_BATCH, llm8_slots, 12) == 0 &&
               memcmp(y + 4 * STATE_SLOT_MICRO_BATCH, zeros, 12) == 0 &&
               memcmp(x + 4 * STATE_SLOT_SHARD_PARAMETERS, &shard_parameters, 8) == 0 &&
               memcmp(y + 4 * STATE_SLOT_SHARD_PARAMETERS, &no_count, 8) == 0;
    if (same) {
        memcpy(x + 4 * STATE_SLOT_MICRO_BATCH, zeros, 12);
        memcpy(x + 4 * STATE_SLOT_SHARD_PARAMETERS, &no_count, 8);
        same = memcmp(x, y, na) == 0;
    }
    free(x);
    free(y);
    return same;
}

// a copy of `src` with `length` bytes, and int32 header slot `slot` set to `value` (slot < 0: unchanged)
static const char* write_variant(const char* src, const char* name, size_t length, int slot, int32_t value) {
    size_t n;
    unsigned char* bytes = read_all(src, &n);
    bytes = (unsigned char*)realloc(bytes, length > n ? length : n);
    if (length > n) { memset(bytes + n, 0, length - n); }
    if (slot >= 0) { memcpy(bytes + 4 * slot, &value, 4); }
    const char* path = in_dir(g_dir, name);
    write_all(path, bytes, length);
    free(bytes);
    return path;
}

static size_t file_length(const char* path) {
    size_t n;
    free(read_all(path, &n));
    return n;
}

static GPT2Config py_config(void) { return gpt2_config_make(2, 2, 16, 8, 60); }

// ----------------------------------------------------------------------------
// model files

static void test_model_files_from_llmc(void) {
    GPT2Config cfg;
    int version = 0;
    model_file_read_header(in_dir(g_py_dir, "model_v3.bin"), &cfg, &version);
    GPT2Config want = py_config();
    CHECK(version == 3, "model_v3.bin: version %d", version);
    CHECK(memcmp(&cfg, &want, sizeof(cfg)) == 0, "model_v3.bin: config L=%d NH=%d C=%d maxT=%d V=%d Vp=%d",
          cfg.num_layers, cfg.num_heads, cfg.channels, cfg.max_seq_len, cfg.vocab_size, cfg.padded_vocab_size);
    size_t n = gpt2_num_parameters(&cfg);
    size_t expected_bytes;
    float* expected = (float*)read_all(in_dir(g_py_dir, "expected_params_f32.bin"), &expected_bytes);
    CHECK(expected_bytes == n * sizeof(float), "expected_params_f32.bin has %zu bytes, %zu params", expected_bytes, n);
    float* params = (float*)mallocCheck(n * sizeof(float));
    model_file_read_params(in_dir(g_py_dir, "model_v3.bin"), &cfg, params);
    CHECK(memcmp(params, expected, n * sizeof(float)) == 0, "model_v3.bin params differ from numpy's");

    model_file_read_header(in_dir(g_py_dir, "model_v5.bin"), &cfg, &version);
    CHECK(version == 5 && memcmp(&cfg, &want, sizeof(cfg)) == 0, "model_v5.bin: version %d or config wrong", version);
    size_t bf16_bytes;
    float* expected_bf16 = (float*)read_all(in_dir(g_py_dir, "expected_params_bf16.bin"), &bf16_bytes);
    model_file_read_params(in_dir(g_py_dir, "model_v5.bin"), &cfg, params);
    CHECK(memcmp(params, expected_bf16, n * sizeof(float)) == 0, "model_v5.bin params differ from numpy's bf16");
    CHECK(params[0] == 1.0f && params[1] == 1.0f + 4.0f / 256.0f, "bf16 ties: %.9g %.9g", params[0], params[1]);

    // our writer reproduces llm.c's files byte for byte from the same values
    model_file_write(in_dir(g_dir, "ours_v3.bin"), &cfg, expected, 3);
    model_file_write(in_dir(g_dir, "ours_v5.bin"), &cfg, expected, 5);
    CHECK(files_identical(in_dir(g_dir, "ours_v3.bin"), in_dir(g_py_dir, "model_v3.bin")), "our v3 file != llm.c layout");
    CHECK(files_identical(in_dir(g_dir, "ours_v5.bin"), in_dir(g_py_dir, "model_v5.bin")), "our v5 file != llm.c layout");
    free(params);
    free(expected);
    free(expected_bf16);
}

static void test_model_round_trip(void) {
    GPT2Config cfg = gpt2_config_make(3, 4, 32, 16, 200);
    size_t n = gpt2_num_parameters(&cfg);
    float* params = (float*)mallocCheck(n * sizeof(float));
    float* back = (float*)mallocCheck(n * sizeof(float));
    gpt2_init_params_random(params, &cfg, 7);
    params[n - 1] = -0.0f;  // signs and odd values survive
    params[n - 2] = 3.0e-40f;

    const char* path3 = in_dir(g_dir, "rt_v3.bin");
    model_file_write(path3, &cfg, params, 3);
    CHECK(!file_exists(in_dir(g_dir, "rt_v3.bin.tmp")), "model write left its .tmp behind");
    CHECK(file_length(path3) == 1024 + n * 4, "v3 length %zu", file_length(path3));
    size_t raw_n;
    int32_t* raw = (int32_t*)read_all(path3, &raw_n);
    int32_t want_header[8] = {20240326, 3, 16, 200, 3, 4, 32, 256};
    CHECK(memcmp(raw, want_header, sizeof(want_header)) == 0, "v3 header slots 0..7 not llm.c's");
    int rest_zero = 1;
    for (int i = 8; i < 256; i++) { rest_zero &= raw[i] == 0; }
    CHECK(rest_zero, "v3 header slots 8..255 not zero");
    free(raw);
    GPT2Config got;
    int version;
    model_file_read_header(path3, &got, &version);
    CHECK(version == 3 && memcmp(&got, &cfg, sizeof(cfg)) == 0, "v3 header round trip");
    model_file_read_params(path3, &cfg, back);
    CHECK(memcmp(back, params, n * sizeof(float)) == 0, "v3 params not bit-exact");

    const char* path5 = in_dir(g_dir, "rt_v5.bin");
    model_file_write(path5, &cfg, params, 5);
    CHECK(file_length(path5) == 1024 + n * 2, "v5 length %zu", file_length(path5));
    model_file_read_header(path5, &got, &version);
    CHECK(version == 5, "v5 version %d", version);
    model_file_read_params(path5, &cfg, back);
    size_t mismatches = 0;
    for (size_t i = 0; i < n; i++) {
        float want = bf16_bits_to_float(float_to_bf16_bits(params[i]));
        mismatches += memcmp(&want, &back[i], 4) != 0;
    }
    CHECK(mismatches == 0, "v5: %zu params differ from their bf16 rounding", mismatches);
    // bf16 values are fixed points of the round trip: writing them again gives the same file
    model_file_write(in_dir(g_dir, "rt_v5_again.bin"), &cfg, back, 5);
    CHECK(files_identical(path5, in_dir(g_dir, "rt_v5_again.bin")), "v5 -> read -> v5 is not byte-identical");
    free(params);
    free(back);
}

// the descriptors -e takes: llm8's names and llm.c's explicit gpt2:dN form of the same models
static void test_model_descriptors(void) {
    const char* names[] = {"d6", "d12", "d24", "d36", "d48", "d60", "d72", "d84"};
    for (int i = 0; i < 8; i++) {
        char explicit_name[16];
        snprintf(explicit_name, sizeof(explicit_name), "gpt2:%s", names[i]);
        GPT2Config plain = gpt2_config_from_descriptor(names[i]), llmc = gpt2_config_from_descriptor(explicit_name);
        CHECK(memcmp(&plain, &llmc, sizeof(plain)) == 0 && plain.num_layers == atoi(names[i] + 1),
              "%s: %d layers, %s: %d", explicit_name, llmc.num_layers, names[i], plain.num_layers);
    }
    GPT2Config d48 = gpt2_config_from_descriptor("gpt2:d48");
    CHECK(d48.channels == 1600 && d48.num_heads == 25 && d48.padded_vocab_size == 50304, "gpt2:d48: C %d, NH %d, Vp %d",
          d48.channels, d48.num_heads, d48.padded_vocab_size);
    CHECK_DIES("descriptor: a depth llm8 does not build", "'gpt2:d13'", gpt2_config_from_descriptor("gpt2:d13"));
    CHECK_DIES("descriptor: gpt2: before a non-depth", "'gpt2:tiny'", gpt2_config_from_descriptor("gpt2:tiny"));
    // llm.c's GPT-3 descriptors: its depth and head size for N channels, T 2048 (train_gpt2.cu's table)
    const struct { const char* name; int L, C, head_size; } gpt3[] = {
        {"gpt3:c384", 6, 384, 64}, {"gpt3:c768", 12, 768, 64}, {"gpt3:c1024", 24, 1024, 64}, {"gpt3:c1536", 24, 1536, 96},
        {"gpt3:c2048", 24, 2048, 128}, {"gpt3:c2560", 32, 2560, 80}, {"gpt3:c4096", 32, 4096, 128},
        {"gpt3:c12288", 96, 12288, 128}};
    for (int i = 0; i < 8; i++) {
        GPT2Config c = gpt2_config_from_descriptor(gpt3[i].name);
        CHECK(c.num_layers == gpt3[i].L && c.channels == gpt3[i].C && c.num_heads * gpt3[i].head_size == c.channels &&
              c.max_seq_len == 2048 && c.vocab_size == 50257 && c.padded_vocab_size == 50304,
              "%s: L %d NH %d C %d maxT %d V %d Vp %d", gpt3[i].name, c.num_layers, c.num_heads, c.channels, c.max_seq_len,
              c.vocab_size, c.padded_vocab_size);
    }
    GPT2Config gpt3_small = gpt2_config_from_descriptor("gpt3:c768");  // llm.c's run_gpt3_125M.sh model
    CHECK(gpt2_num_parameters(&gpt3_small) == 124475904 + (size_t)1024 * 768, "gpt3:c768 has %zu parameters, d12's and "
          "1024 more wpe rows", gpt2_num_parameters(&gpt3_small));
    CHECK_DIES("descriptor: llm.c's gpt3:c5140 (no whole number of 128-wide heads)", "'gpt3:c5140'",
               gpt2_config_from_descriptor("gpt3:c5140"));
    CHECK_DIES("descriptor: a GPT-3 width llm.c does not build", "'gpt3:c1000'", gpt2_config_from_descriptor("gpt3:c1000"));
    CHECK_DIES("descriptor: gpt3: with a depth", "'gpt3:d12'", gpt2_config_from_descriptor("gpt3:d12"));
}

static void test_model_bad_inputs(void) {
    GPT2Config cfg;
    int version;
    const char* good = in_dir(g_py_dir, "model_v3.bin");
    size_t n = file_length(good);
    const char* missing = in_dir(g_dir, "no_such_model.bin");
    CHECK_DIES("model: missing file", missing, model_file_read_header(missing, &cfg, &version));
    const char* magic = write_variant(good, "model_magic.bin", n, 0, 20240327);
    CHECK_DIES("model: wrong magic", magic, model_file_read_header(magic, &cfg, &version));
    const char* ver = write_variant(good, "model_version.bin", n, 1, 4);
    CHECK_DIES("model: wrong version", ver, model_file_read_header(ver, &cfg, &version));
    const char* truncated = write_variant(good, "model_truncated.bin", n - 1, -1, 0);
    CHECK_DIES("model: truncated", truncated, model_file_read_header(truncated, &cfg, &version));
    const char* longer = write_variant(good, "model_longer.bin", n + 4, -1, 0);
    CHECK_DIES("model: extra bytes", longer, model_file_read_header(longer, &cfg, &version));
    const char* shape = write_variant(good, "model_shape.bin", n, 5, 3);  // NH=3 does not divide C=16
    CHECK_DIES("model: bad shape", shape, model_file_read_header(shape, &cfg, &version));
    const char* header_len = write_variant(good, "model_header_len.bin", 1000, -1, 0);
    CHECK_DIES("model: shorter than header", header_len, model_file_read_header(header_len, &cfg, &version));
    const char* layers = write_variant(good, "model_layers.bin", n, 4, 3);  // L=3: length no longer matches
    CHECK_DIES("model: header/length mismatch", layers, model_file_read_header(layers, &cfg, &version));
    {   // a dropped shape comparison: the file's V differs from 61 but its Vp, and so its parameter count, is the
        // same; with room for every parameter, only the comparison can stop the read. (The path is made afresh:
        // in_dir's 8 rotating buffers have reused `good`'s by now, for model_layers.bin.)
        GPT2Config other = gpt2_config_make(2, 2, 16, 8, 61);
        float* room = (float*)mallocCheck(gpt2_num_parameters(&other) * sizeof(float));
        CHECK_DIES("model: read with another V (same parameter count)", "holds a different shape",
                   model_file_read_params(in_dir(g_py_dir, "model_v3.bin"), &other, room));
        free(room);
    }
    float params[1] = {0};
    const char* out = in_dir(g_dir, "bad_version_out.bin");
    GPT2Config small = gpt2_config_make(1, 1, 1, 1, 1);
    CHECK_DIES("model: write version 4", out, model_file_write(out, &small, params, 4));
}

// ----------------------------------------------------------------------------
// state files

static void fill_arrays(float* m, float* v, float* master, size_t n) {
    for (size_t i = 0; i < n; i++) {
        m[i] = (float)i * 0.5f;
        v[i] = (float)i * 0.25f + 1.0f;
        master[i] = -(float)i / 8.0f;
    }
}

static void py_loader_init(DataLoader* loader, int shuffle) {
    dataloader_init(loader, in_dir(g_py_dir, "data_train_*.bin"), PY_STATE_B, PY_STATE_T, 0, 1, shuffle, 50257);
}

static void test_state_from_llmc(void) {
    size_t n = PY_STATE_NUM_PARAMS;
    float m[PY_STATE_NUM_PARAMS], v[PY_STATE_NUM_PARAMS], master[PY_STATE_NUM_PARAMS];
    float want_m[PY_STATE_NUM_PARAMS], want_v[PY_STATE_NUM_PARAMS], want_master[PY_STATE_NUM_PARAMS];
    fill_arrays(want_m, want_v, want_master, n);

    // no shuffle, master weights
    DataLoader loader;
    py_loader_init(&loader, 0);
    TrainState state;
    memset(&state, 0, sizeof(state));
    StateBuffers buffers = {n, m, v, master, NULL, 0};
    state_file_read(in_dir(g_py_dir, "state_v1.bin"), &state, &buffers, &loader);
    CHECK(state.step == 123, "state_v1 step %d", state.step);
    CHECK(state.rng_state == 0x1122334455667788ull && state.rng_state_last_update == 987654321ull,
          "state_v1 rng fields %llx %llu", (unsigned long long)state.rng_state,
          (unsigned long long)state.rng_state_last_update);
    CHECK(memcmp(m, want_m, sizeof(m)) == 0 && memcmp(v, want_v, sizeof(v)) == 0 &&
          memcmp(master, want_master, sizeof(master)) == 0, "state_v1 m/v/master differ");
    CHECK(loader.current_shard_idx == 1 && loader.current_sample_idx == 2, "state_v1 position %zu %zu",
          loader.current_shard_idx, loader.current_sample_idx);
    dataloader_next_batch(&loader);
    // shard 1 token i = (i*31 + 1000 + 7) % 50000; sample 2 starts at token 2*B*T
    size_t start = 2 * PY_STATE_B * PY_STATE_T;
    CHECK(loader.inputs[0] == (int)(((start) * 31 + 1007) % 50000) &&
          loader.targets[PY_STATE_B * PY_STATE_T - 1] == (int)(((start + 16) * 31 + 1007) % 50000),
          "state_v1 resumed batch is not shard 1 sample 2");
    // our writer, from the same state, reproduces the file byte for byte
    dataloader_resume(&loader, 1, 2, "test_state.bin");
    state_file_write(in_dir(g_dir, "ours_state_v1.bin"), &state, &buffers, &loader);
    CHECK(state_file_is_llmc_plus_llm8_slots(in_dir(g_dir, "ours_state_v1.bin"), in_dir(g_py_dir, "state_v1.bin"),
                                             PY_STATE_B, PY_STATE_T, n),
          "our v1 state file != llm.c layout (but for header slots 7 to 9 and 42-43: B, T, the layout mark, the parameters)");
    dataloader_free(&loader);

    // shuffled, no master weights: llm.c's loader after PY_SHUFFLE_BATCHES batches, its trailer from
    // make_llmc_files.py's model of llm.c's loader; read, it must be llm8's own loader after as many
    py_loader_init(&loader, 1);
    char shuffle_path[1024];  // (in_dir's paths are reused after 8 calls)
    snprintf(shuffle_path, sizeof(shuffle_path), "%s", in_dir(g_py_dir, "state_v1_shuffle.bin"));
    StateBuffers shuffled = {n, m, v, NULL, NULL, 0};
    memset(&state, 0, sizeof(state));
    state_file_read(shuffle_path, &state, &shuffled, &loader);
    CHECK(state.step == 123 && !state.data_reshaped && memcmp(m, want_m, sizeof(m)) == 0 &&
          memcmp(v, want_v, sizeof(v)) == 0, "state_v1_shuffle: step %d, reshaped %d, or m/v differ", state.step,
          state.data_reshaped);
    DataLoader ran;
    py_loader_init(&ran, 1);
    for (int b = 0; b < PY_SHUFFLE_BATCHES; b++) { dataloader_next_batch(&ran); }
    CHECK(loader.current_shard_idx == ran.current_shard_idx && loader.current_sample_idx == ran.current_sample_idx &&
          loader.loaded_shard == ran.loaded_shard, "shuffle trailer: position shard %zu sample %zu (file %d), llm8's "
          "loader after %d batches is at %zu %zu (file %d)", loader.current_shard_idx, loader.current_sample_idx,
          loader.loaded_shard, PY_SHUFFLE_BATCHES, ran.current_shard_idx, ran.current_sample_idx, ran.loaded_shard);
    CHECK(memcmp(loader.shard_indices, ran.shard_indices, ran.num_shards * sizeof(int)) == 0 &&
          loader.num_intra_shard_indices == ran.num_intra_shard_indices &&
          memcmp(loader.intra_shard_indices, ran.intra_shard_indices, ran.num_intra_shard_indices * sizeof(int)) == 0,
          "shuffle trailer: shard or sample order is not llm8's loader's after %d batches", PY_SHUFFLE_BATCHES);
    CHECK(memcmp(loader.shuffle_rng.state, ran.shuffle_rng.state, sizeof(ran.shuffle_rng.state)) == 0 &&
          loader.shuffle_rng.index == ran.shuffle_rng.index, "shuffle trailer: rng state (index %u, llm8's loader's %u)",
          loader.shuffle_rng.index, ran.shuffle_rng.index);
    size_t trailer_samples = loader.num_intra_shard_indices;
    // the next batch is llm.c's next (make_llmc_files.py wrote its B*T + 1 tokens), and llm8's loader's
    uint16_t next_tokens[PY_STATE_B * PY_STATE_T + 1];
    FILE* next_fp = fopenCheck(in_dir(g_py_dir, "state_v1_shuffle_next.bin"), "rb");
    freadCheck(next_tokens, sizeof(uint16_t), PY_STATE_B * PY_STATE_T + 1, next_fp);
    fcloseCheck(next_fp);
    dataloader_next_batch(&loader);
    dataloader_next_batch(&ran);
    int llmcs_next = 1;
    for (int i = 0; i < PY_STATE_B * PY_STATE_T; i++) {
        llmcs_next = llmcs_next && loader.inputs[i] == next_tokens[i] && loader.targets[i] == next_tokens[i + 1];
    }
    CHECK(llmcs_next, "shuffled resume: the next batch is not llm.c's (first input %d, llm.c's %d)", loader.inputs[0],
          next_tokens[0]);
    CHECK(memcmp(loader.inputs, ran.inputs, sizeof(int) * PY_STATE_B * PY_STATE_T) == 0,
          "shuffled resume: the next batch is not llm8's loader's after %d batches", PY_SHUFFLE_BATCHES);
    dataloader_free(&ran);
    // llm.c's freshly seeded generator (left_ 1, next_ 0) twists on its next draw
    size_t rng_offset = 1024 + 2 * n * 4 + 8 + 2 * 4 + 8 + trailer_samples * 4;
    write_variant(shuffle_path, "fresh_rng_a.bin", file_length(shuffle_path), (int)(rng_offset + 8) / 4, 1);
    const char* fresh = write_variant(in_dir(g_dir, "fresh_rng_a.bin"), "fresh_rng.bin",
                                      file_length(in_dir(g_dir, "fresh_rng_a.bin")), (int)(rng_offset + 12) / 4, 0);
    DataLoader fresh_loader;
    py_loader_init(&fresh_loader, 1);
    state_file_read(fresh, &state, &shuffled, &fresh_loader);
    CHECK(fresh_loader.shuffle_rng.index == MT19937_N, "llm.c's fresh rng state must map to index N, got %u",
          fresh_loader.shuffle_rng.index);
    dataloader_free(&fresh_loader);
    // llm.c never sets the generator's seed_ (its bytes are whatever its stack held): not read
    const char* seeded = write_variant(shuffle_path, "junk_seed.bin", file_length(shuffle_path), (int)rng_offset / 4,
                                       0x5eed5eed);
    DataLoader seeded_loader, again;
    py_loader_init(&seeded_loader, 1);
    py_loader_init(&again, 1);
    state_file_read(seeded, &state, &shuffled, &seeded_loader);
    state_file_read(shuffle_path, &state, &shuffled, &again);
    CHECK(memcmp(&seeded_loader.shuffle_rng, &again.shuffle_rng, sizeof(again.shuffle_rng)) == 0,
          "llm.c's unset seed_ changed the generator read");
    dataloader_free(&seeded_loader);
    // the state as read, written again, is the same file
    state_file_write(in_dir(g_dir, "ours_state_shuffle.bin"), &state, &shuffled, &again);
    CHECK(state_file_is_llmc_plus_llm8_slots(in_dir(g_dir, "ours_state_shuffle.bin"), shuffle_path, PY_STATE_B, PY_STATE_T,
                                             n),
          "our shuffled v1 state file != llm.c layout (but for header slots 7 to 9 and 42-43: B, T, the layout mark, "
          "the parameters)");
    dataloader_free(&again);
    dataloader_free(&loader);

    // a file of another B (or T): its position counts samples of another size, so the loader stays at its
    // start for the caller to replay (train_state_read); the rest is read as ever
    DataLoader wider;
    dataloader_init(&wider, in_dir(g_py_dir, "data_train_*.bin"), 2 * PY_STATE_B, PY_STATE_T, 0, 1, 1, 50257);
    int32_t shard_order[2] = {wider.shard_indices[0], wider.shard_indices[1]};
    memset(&state, 0, sizeof(state));
    state_file_read(in_dir(g_dir, "ours_state_shuffle.bin"), &state, &shuffled, &wider);
    CHECK(state.data_reshaped && state.step == 123 && wider.current_shard_idx == 0 && wider.current_sample_idx == 0 &&
          wider.shard_indices[0] == shard_order[0] && wider.shard_indices[1] == shard_order[1],
          "B=%d file read with B=%d: reshaped %d, step %d, position %zu %zu", PY_STATE_B, 2 * PY_STATE_B,
          state.data_reshaped, state.step, wider.current_shard_idx, wider.current_sample_idx);
    CHECK(memcmp(m, want_m, sizeof(m)) == 0 && memcmp(v, want_v, sizeof(v)) == 0, "B=%d file read with B=%d: m/v differ",
          PY_STATE_B, 2 * PY_STATE_B);
    dataloader_free(&wider);
    const char* half_shape = write_variant(in_dir(g_dir, "ours_state_shuffle.bin"), "state_half_shape.bin",
                                           file_length(in_dir(g_dir, "ours_state_shuffle.bin")), STATE_SLOT_SEQ_LEN, 0);
    py_loader_init(&loader, 1);
    CHECK_DIES("state: B without T", "header slots 7 and 8", state_file_read(half_shape, &state, &shuffled, &loader));
    dataloader_free(&loader);

    // slot 11, llm8's: the writer's tokens per step, a multiple of its B*T*processes (0 in llm.c's files: not recorded)
    const int32_t batches[3] = {3 * PY_STATE_B * PY_STATE_T, -PY_STATE_B * PY_STATE_T, PY_STATE_B * PY_STATE_T + 1};
    for (int k = 0; k < 3; k++) {
        const char* with_batch = write_variant(in_dir(g_dir, "ours_state_shuffle.bin"), "state_total_batch.bin",
                                               file_length(in_dir(g_dir, "ours_state_shuffle.bin")),
                                               STATE_SLOT_TOTAL_BATCH, batches[k]);
        py_loader_init(&loader, 1);
        memset(&state, 0, sizeof(state));
        if (k == 0) {
            state_file_read(with_batch, &state, &shuffled, &loader);
            CHECK(state.total_batch_size == batches[0], "slot 11: total batch %d read as %d", batches[0],
                  state.total_batch_size);
        } else {
            CHECK_DIES("state: slot 11 not a multiple of B*T", "in header slot 11, expected its total batch in tokens, a "
                       "multiple of B*T*processes = 2*8*1", state_file_read(with_batch, &state, &shuffled, &loader));
        }
        dataloader_free(&loader);
    }
}

static void test_state_round_trip(void) {
    size_t n = 1000;
    float* m = (float*)mallocCheck(3 * n * sizeof(float));
    float* v = m + n;
    float* master = v + n;
    float* back = (float*)mallocCheck(3 * n * sizeof(float));
    mt19937_state rng;
    manual_seed(&rng, 5);
    normal_(m, 3 * n, 0.0f, 1.0f, &rng);
    TrainState state = {4567, 0xdeadbeefcafef00dull, 4566, 5 * PY_STATE_B * PY_STATE_T, 0};
    StateBuffers with_master = {n, m, v, master, NULL, 0};
    StateBuffers without_master = {n, m, v, NULL, NULL, 0};
    StateBuffers into_with = {n, back, back + n, back + 2 * n, NULL, 0};
    StateBuffers into_without = {n, back, back + n, NULL, NULL, 0};

    for (int shuffle = 0; shuffle <= 1; shuffle++) {
        for (int use_master = 0; use_master <= 1; use_master++) {
            DataLoader loader;
            py_loader_init(&loader, shuffle);
            for (int i = 0; i < 70; i++) { dataloader_next_batch(&loader); }  // into the second shard
            const char* path = in_dir(g_dir, "rt_state.bin");
            state_file_write(path, &state, use_master ? &with_master : &without_master, &loader);
            size_t raw_n;
            int32_t* raw = (int32_t*)read_all(path, &raw_n);
            uint64_t u64[4];
            memcpy(u64, &raw[20], 16);
            memcpy(u64 + 2, &raw[30], 16);
            CHECK(raw[0] == 20240527 && raw[1] == 1 && raw[2] == 1 && raw[3] == 0 && raw[4] == use_master &&
                  raw[5] == shuffle && raw[10] == 4567 && raw[STATE_SLOT_TOTAL_BATCH] == state.total_batch_size,
                  "state header slots (shuffle %d master %d)", shuffle, use_master);
            CHECK(u64[0] == state.rng_state && u64[1] == 4566 && u64[2] == loader.current_shard_idx &&
                  u64[3] == loader.current_sample_idx, "state header uint64 slots");
            size_t trailer = shuffle ? 8 + 2 * 4 + 8 + loader.num_intra_shard_indices * 4 + 2520 : 0;
            CHECK(raw_n == 1024 + (2 + use_master) * n * 4 + trailer, "state length %zu (shuffle %d master %d)",
                  raw_n, shuffle, use_master);
            free(raw);

            DataLoader resumed;
            py_loader_init(&resumed, shuffle);
            TrainState got;
            memset(back, 0, 3 * n * sizeof(float));
            state_file_read(path, &got, use_master ? &into_with : &into_without, &resumed);
            CHECK(got.step == state.step && got.rng_state == state.rng_state &&
                  got.rng_state_last_update == state.rng_state_last_update &&
                  got.total_batch_size == state.total_batch_size, "state fields round trip");
            CHECK(memcmp(back, m, (2 + use_master) * n * sizeof(float)) == 0, "state arrays not bit-exact");
            int same = 1;
            for (int i = 0; i < 150; i++) {  // past the end of the epoch
                dataloader_next_batch(&loader);
                dataloader_next_batch(&resumed);
                same &= memcmp(loader.inputs, resumed.inputs, PY_STATE_B * PY_STATE_T * sizeof(int)) == 0;
            }
            CHECK(same, "resumed loader diverges (shuffle %d)", shuffle);
            dataloader_free(&loader);
            dataloader_free(&resumed);
        }
    }
    free(m);
    free(back);
}

static void test_state_sections(void) {
    size_t n = 64;
    float m[64], v[64], master[64], back[3][64];
    fill_arrays(m, v, master, n);
    float amax_history[16 * 4];
    uint8_t quantized[256];
    for (int i = 0; i < 64; i++) { amax_history[i] = (float)i * 1.5f; }
    for (int i = 0; i < 256; i++) { quantized[i] = (uint8_t)(255 - i); }
    StateSection sections[2] = {{"fp8_amax_hist", amax_history, sizeof(amax_history), 0},
                                {"adamw8_m", quantized, sizeof(quantized), 0}};
    DataLoader loader;
    py_loader_init(&loader, 1);
    TrainState state = {9, 1, 2, 0, 0};
    StateBuffers buffers = {n, m, v, master, sections, 2};
    const char* path = in_dir(g_dir, "sections.bin");
    state_file_write(path, &state, &buffers, &loader);
    size_t raw_n;
    int32_t* raw = (int32_t*)read_all(path, &raw_n);
    CHECK(raw[1] == 2 && raw[40] == 2 && raw[6] == 0, "sections: version %d count %d", raw[1], raw[40]);
    free(raw);

    float amax_back[64];
    uint8_t quantized_back[256];
    StateSection into[2] = {{"adamw8_m", quantized_back, sizeof(quantized_back), 0},  // order does not matter
                            {"fp8_amax_hist", amax_back, sizeof(amax_back), 0}};
    StateBuffers into_buffers = {n, back[0], back[1], back[2], into, 2};
    DataLoader resumed;
    py_loader_init(&resumed, 1);
    TrainState got;
    state_file_read(path, &got, &into_buffers, &resumed);
    CHECK(memcmp(amax_back, amax_history, sizeof(amax_back)) == 0 && memcmp(quantized_back, quantized, 256) == 0,
          "sections do not round-trip");
    CHECK(memcmp(back[2], master, sizeof(master)) == 0 && got.step == 9, "v2 body does not round-trip");

    // 8-bit optimizer: no fp32 moments in the body
    StateBuffers no_moments = {n, NULL, NULL, master, sections, 2};
    const char* path8 = in_dir(g_dir, "sections8.bin");
    state_file_write(path8, &state, &no_moments, &loader);
    CHECK(file_length(path8) + 2 * n * 4 == file_length(path), "moments-in-sections file still has m and v");
    StateBuffers into8 = {n, NULL, NULL, back[2], into, 2};
    state_file_read(path8, &got, &into8, &resumed);
    CHECK(memcmp(back[2], master, sizeof(master)) == 0, "v2 without moments does not round-trip");

    // a section count out of range, in either reader (a negative one read as none before)
    for (int bad_count = -1; bad_count <= STATE_FILE_MAX_SECTIONS + 1; bad_count += STATE_FILE_MAX_SECTIONS + 2) {
        const char* counted = write_variant(path, "sections_count.bin", file_length(path), STATE_SLOT_NUM_SECTIONS, bad_count);
        char expected[64];
        snprintf(expected, sizeof(expected), "claims %d sections", bad_count);
        CHECK_DIES("state: section count out of range (state_file_read)", expected,
                   state_file_read(counted, &got, &into_buffers, &resumed));
        StateFileIndex index;
        CHECK_DIES("state: section count out of range (state_file_index)", expected, state_file_index(counted, n, &index));
    }

    // another model's state (a parameter count other than this run's in slots 42-43), in either reader: refused
    // by the count before its trailer and sections are looked for inside its arrays
    {
        char expected[96];
        snprintf(expected, sizeof(expected), "holds %zu parameters per rank, this run %zu", (size_t)n, (size_t)n - 1);
        StateBuffers smaller = into_buffers;
        smaller.shard_num_parameters = n - 1;
        CHECK_DIES("state: another model's (state_file_read)", expected, state_file_read(path, &got, &smaller, &resumed));
        StateFileIndex index;
        CHECK_DIES("state: another model's (state_file_index)", expected, state_file_index(path, n - 1, &index));
    }

    StateSection wrong_tag[2] = {{"adamw8_m", quantized_back, 256, 0}, {"fp8_scales", amax_back, sizeof(amax_back), 0}};
    StateBuffers wrong_tag_buffers = {n, back[0], back[1], back[2], wrong_tag, 2};
    CHECK_DIES("state: unknown section", "fp8_amax_hist", state_file_read(path, &got, &wrong_tag_buffers, &resumed));
    StateSection wrong_size[2] = {{"adamw8_m", quantized_back, 128, 0}, {"fp8_amax_hist", amax_back, sizeof(amax_back), 0}};
    StateBuffers wrong_size_buffers = {n, back[0], back[1], back[2], wrong_size, 2};
    CHECK_DIES("state: section size", "is 256 bytes", state_file_read(path, &got, &wrong_size_buffers, &resumed));
    StateBuffers no_sections = {n, back[0], back[1], back[2], NULL, 0};
    CHECK_DIES("state: sections not kept", path, state_file_read(path, &got, &no_sections, &resumed));
    CHECK_DIES("state: moments expected", path8, state_file_read(path8, &got, &into_buffers, &resumed));

    // an optional section (e.g. the -sl/-sg windows): read when the file has it, left as set when not;
    // a missing required one is named
    uint8_t extra[32], extra_back[32];
    for (int i = 0; i < 32; i++) { extra[i] = (uint8_t)(7 * i + 1); }
    memset(extra_back, 0xAB, sizeof(extra_back));
    StateSection with_optional[3] = {{"adamw8_m", quantized_back, sizeof(quantized_back), 0},
                                     {"fp8_amax_hist", amax_back, sizeof(amax_back), 0},
                                     {"opt_extra", extra_back, sizeof(extra_back), 1}};
    StateBuffers optional_buffers = {n, back[0], back[1], back[2], with_optional, 3};
    state_file_read(path, &got, &optional_buffers, &resumed);
    uint8_t untouched[32];
    memset(untouched, 0xAB, sizeof(untouched));
    CHECK(memcmp(extra_back, untouched, sizeof(untouched)) == 0 && memcmp(amax_back, amax_history, sizeof(amax_back)) == 0,
          "a file without the optional section: the section was written to, or the others not read");
    StateSection three[3] = {sections[0], sections[1], {"opt_extra", extra, sizeof(extra), 1}};
    StateBuffers three_buffers = {n, m, v, master, three, 3};
    const char* path3 = in_dir(g_dir, "sections3.bin");
    state_file_write(path3, &state, &three_buffers, &loader);
    state_file_read(path3, &got, &optional_buffers, &resumed);
    CHECK(memcmp(extra_back, extra, sizeof(extra)) == 0, "the optional section does not round-trip");
    CHECK_DIES("state: an optional section the run does not keep", "opt_extra", state_file_read(path3, &got, &into_buffers, &resumed));
    StateSection required_extra[3] = {with_optional[0], with_optional[1], {"opt_extra", extra_back, sizeof(extra_back), 0}};
    StateBuffers required_buffers = {n, back[0], back[1], back[2], required_extra, 3};
    CHECK_DIES("state: a required section missing", "no section 'opt_extra'", state_file_read(path, &got, &required_buffers, &resumed));
    StateSection swapped[3] = {{"adamw8_m", quantized_back, sizeof(quantized_back), 1},
                               {"fp8_amax_hist", amax_back, sizeof(amax_back), 0},
                               {"opt_extra", extra_back, sizeof(extra_back), 0}};
    StateBuffers swapped_buffers = {n, back[0], back[1], back[2], swapped, 3};
    CHECK_DIES("state: as many sections as required, one of them missing", "no section 'opt_extra'",
               state_file_read(path, &got, &swapped_buffers, &resumed));
    dataloader_free(&loader);
    dataloader_free(&resumed);
}

static void test_state_bad_inputs(void) {
    size_t n = PY_STATE_NUM_PARAMS;
    float m[PY_STATE_NUM_PARAMS], v[PY_STATE_NUM_PARAMS], master[PY_STATE_NUM_PARAMS];
    StateBuffers buffers = {n, m, v, master, NULL, 0};
    StateBuffers no_master = {n, m, v, NULL, NULL, 0};
    DataLoader loader;
    py_loader_init(&loader, 0);
    TrainState state;
    const char* good = in_dir(g_py_dir, "state_v1.bin");
    size_t length = file_length(good);
    const char* missing = in_dir(g_dir, "no_such_state.bin");
    CHECK_DIES("state: missing file", missing, state_file_read(missing, &state, &buffers, &loader));
    const char* magic = write_variant(good, "state_magic.bin", length, 0, 20240326);
    CHECK_DIES("state: wrong magic", magic, state_file_read(magic, &state, &buffers, &loader));
    const char* ver = write_variant(good, "state_version.bin", length, 1, 3);
    CHECK_DIES("state: wrong version", ver, state_file_read(ver, &state, &buffers, &loader));
    const char* truncated = write_variant(good, "state_truncated.bin", length - 4, -1, 0);
    CHECK_DIES("state: truncated", truncated, state_file_read(truncated, &state, &buffers, &loader));
    const char* longer = write_variant(good, "state_longer.bin", length + 4, -1, 0);
    CHECK_DIES("state: trailing bytes", longer, state_file_read(longer, &state, &buffers, &loader));
    const char* rank = write_variant(good, "state_rank.bin", length, 3, 1);
    CHECK_DIES("state: other rank", rank, state_file_read(rank, &state, &buffers, &loader));
    CHECK_DIES("state: master weights mismatch", good, state_file_read(good, &state, &no_master, &loader));
    const char* position = write_variant(good, "state_position.bin", length, 30, 2);  // shard 2 of 2
    CHECK_DIES("state: shard index out of range", position, state_file_read(position, &state, &buffers, &loader));
    const char* sample = write_variant(good, "state_sample.bin", length, 32, 1000);  // shard 1 has 48 samples
    CHECK_DIES("state: sample index out of range", "sample index 1000", state_file_read(sample, &state, &buffers, &loader));
    CHECK_DIES("state: shuffle mismatch", "shuffling", state_file_read(in_dir(g_py_dir, "state_v1_shuffle.bin"), &state,
                                                                      &no_master, &loader));
    dataloader_free(&loader);

    DataLoader shuffled;
    py_loader_init(&shuffled, 1);
    const char* good_shuffle = in_dir(g_py_dir, "state_v1_shuffle.bin");
    size_t shuffle_length = file_length(good_shuffle);
    CHECK_DIES("state: shuffle flag mismatch", good, state_file_read(good, &state, &buffers, &shuffled));
    const char* shuffle_longer = write_variant(good_shuffle, "state_shuffle_longer.bin", shuffle_length + 4, -1, 0);
    CHECK_DIES("state: trailing bytes after trailer", shuffle_longer,
               state_file_read(shuffle_longer, &state, &no_master, &shuffled));
    const char* cut = write_variant(good_shuffle, "state_cut_trailer.bin", shuffle_length - 100, -1, 0);
    CHECK_DIES("state: truncated trailer", cut, state_file_read(cut, &state, &no_master, &shuffled));
    size_t body = 1024 + 2 * n * 4;
    const char* order = write_variant(good_shuffle, "state_bad_order.bin", shuffle_length, (int)((body + 8) / 4), 7);
    CHECK_DIES("state: shard order out of range", order, state_file_read(order, &state, &no_master, &shuffled));
    dataloader_free(&shuffled);
}

// ----------------------------------------------------------------------------
// tokenizer

static void test_tokenizer(void) {
    Tokenizer tokenizer;
    tokenizer_init(&tokenizer, in_dir(g_py_dir, "tokenizer.bin"));
    CHECK(tokenizer.init_ok == 1 && tokenizer.vocab_size == 260 && tokenizer.eot_token == 259,
          "tokenizer header: ok %d V %u eot %u", tokenizer.init_ok, tokenizer.vocab_size, tokenizer.eot_token);
    int bytes_ok = 1;
    for (uint32_t i = 1; i < 256; i++) {
        const char* piece = tokenizer_decode(&tokenizer, i);
        bytes_ok &= piece != NULL && (unsigned char)piece[0] == i && piece[1] == '\0';
    }
    CHECK(bytes_ok, "single-byte tokens do not decode to themselves");
    CHECK(strcmp(tokenizer_decode(&tokenizer, 256), "hello") == 0, "token 256");
    CHECK(strcmp(tokenizer_decode(&tokenizer, 257), " world") == 0, "token 257");
    CHECK(strcmp(tokenizer_decode(&tokenizer, 258), "\xe2\x82") == 0, "token 258");
    CHECK(strcmp(tokenizer_decode(&tokenizer, 259), "<|endoftext|>") == 0, "token 259 (eot)");
    CHECK(tokenizer_decode(&tokenizer, 260) == NULL, "out-of-range token must decode to NULL");
    tokenizer_free(&tokenizer);

    // missing file: a warning, decoding off, no exit
    tokenizer_init(&tokenizer, in_dir(g_dir, "no_such_tokenizer.bin"));
    CHECK(tokenizer.init_ok == 0 && tokenizer_decode(&tokenizer, 5) == NULL, "missing tokenizer must leave init_ok 0");
    safe_printf(tokenizer_decode(&tokenizer, 5));  // NULL: prints nothing, must not crash

    const char* good = in_dir(g_py_dir, "tokenizer.bin");
    size_t length = file_length(good);
    const char* magic = write_variant(good, "tok_magic.bin", length, 0, 1);
    CHECK_DIES("tokenizer: wrong magic", magic, tokenizer_init(&tokenizer, magic));
    const char* ver = write_variant(good, "tok_version.bin", length, 1, 3);
    CHECK_DIES("tokenizer: wrong version", ver, tokenizer_init(&tokenizer, ver));
    const char* v1_small = write_variant(good, "tok_v1_small.bin", length, 1, 1);
    CHECK_DIES("tokenizer: version 1 with a vocab other than GPT-2's", v1_small, tokenizer_init(&tokenizer, v1_small));
    const char* truncated = write_variant(good, "tok_truncated.bin", length - 3, -1, 0);
    CHECK_DIES("tokenizer: truncated", truncated, tokenizer_init(&tokenizer, truncated));
    const char* longer = write_variant(good, "tok_longer.bin", length + 2, -1, 0);
    CHECK_DIES("tokenizer: trailing bytes", longer, tokenizer_init(&tokenizer, longer));
    const char* vocab = write_variant(good, "tok_vocab.bin", length, 2, 300);
    CHECK_DIES("tokenizer: vocab size vs length", vocab, tokenizer_init(&tokenizer, vocab));
}

// the tokenizer file the GPU trainer decodes samples with: -tk (which must exist), else the gpt2_tokenizer.bin
// beside the -i shards (a folder without wildcards), else ./gpt2_tokenizer.bin as in llm.c, else none
static void test_tokenizer_lookup(void) {
    char shards[512], bare[512], cwd_dir[512], saved_cwd[4096], path[4096], pattern[1200];
    snprintf(shards, sizeof(shards), "%s/with_tokenizer", g_dir);
    snprintf(bare, sizeof(bare), "%s/without_tokenizer", g_dir);
    snprintf(cwd_dir, sizeof(cwd_dir), "%s/run_here", g_dir);
    CHECK(mkdir(shards, 0755) == 0 && mkdir(bare, 0755) == 0 && mkdir(cwd_dir, 0755) == 0, "tokenizer lookup: folders");
    fcloseCheck(fopenCheck(in_dir(shards, "gpt2_tokenizer.bin"), "wb"));
    CHECK(getcwd(saved_cwd, sizeof(saved_cwd)) != NULL && chdir(cwd_dir) == 0, "tokenizer lookup: chdir");
    TrainConfig c = train_config_defaults();
    CHECK(c.tokenizer_path[0] == '\0', "-tk's default is the lookup (\"\"), not a path");

    snprintf(pattern, sizeof(pattern), "%s/d_train_*.bin", shards);
    c.train_data_pattern = pattern;
    train_config_tokenizer_path(&c, path, sizeof(path));
    CHECK(strcmp(path, in_dir(shards, "gpt2_tokenizer.bin")) == 0, "beside the shards: got '%s'", path);

    snprintf(pattern, sizeof(pattern), "%s/d_train_*.bin", bare);
    train_config_tokenizer_path(&c, path, sizeof(path));
    CHECK(strcmp(path, "") == 0, "no tokenizer beside the shards nor here: got '%s'", path);
    fcloseCheck(fopenCheck("gpt2_tokenizer.bin", "wb"));
    train_config_tokenizer_path(&c, path, sizeof(path));
    CHECK(strcmp(path, "gpt2_tokenizer.bin") == 0, "llm.c's ./gpt2_tokenizer.bin: got '%s'", path);
    snprintf(pattern, sizeof(pattern), "%s/with_token*/d_train_*.bin", g_dir);  // a wildcard folder names no one folder
    train_config_tokenizer_path(&c, path, sizeof(path));
    CHECK(strcmp(path, "gpt2_tokenizer.bin") == 0, "a wildcard in the shards' folder: got '%s'", path);
    // beside the shards in a buffer it fills exactly, and in one a byte short: the name cut to fit is not looked
    // up, even where a file of that name exists
    snprintf(pattern, sizeof(pattern), "%s/d_train_*.bin", shards);
    const char* beside = in_dir(shards, "gpt2_tokenizer.bin");
    size_t fits = strlen(beside) + 1;
    train_config_tokenizer_path(&c, path, fits);
    CHECK(strcmp(path, beside) == 0, "beside the shards, in %zu bytes: got '%s'", fits, path);
    fcloseCheck(fopenCheck(in_dir(shards, "gpt2_tokenizer.bi"), "wb"));
    train_config_tokenizer_path(&c, path, fits - 1);
    CHECK(strcmp(path, "gpt2_tokenizer.bin") == 0, "beside the shards, in %zu bytes (one short): got '%s'", fits - 1, path);
    CHECK(remove(in_dir(shards, "gpt2_tokenizer.bi")) == 0, "tokenizer lookup: remove the cut name's file");
    c.train_data_pattern = "d_train_*.bin";  // shards in the current folder
    train_config_tokenizer_path(&c, path, sizeof(path));
    CHECK(strcmp(path, "gpt2_tokenizer.bin") == 0, "shards in the current folder: got '%s'", path);

    c.tokenizer_path = in_dir(shards, "gpt2_tokenizer.bin");
    train_config_tokenizer_path(&c, path, sizeof(path));
    CHECK(strcmp(path, c.tokenizer_path) == 0, "-tk: got '%s'", path);
    c.tokenizer_path = in_dir(bare, "gpt2_tokenizer.bin");
    CHECK_DIES("-tk naming a missing file", "flag -tk", train_config_tokenizer_path(&c, path, sizeof(path)));
    CHECK(remove("gpt2_tokenizer.bin") == 0 && chdir(saved_cwd) == 0, "tokenizer lookup: back to the start folder");
}

// llm.c's version-1 tokenizer file (no end-of-text id in the header): GPT-2's 50257 tokens, the last the EOT
static void test_version_1_tokenizer(void) {
    const char* path = in_dir(g_dir, "tok_v1.bin");
    FILE* fp = fopenCheck(path, "wb");
    int32_t header[TOKENIZER_HEADER_INTS];
    memset(header, 0, sizeof(header));
    header[0] = TOKENIZER_MAGIC;
    header[1] = 1;
    header[2] = TOKENIZER_V1_VOCAB;
    fwriteCheck(header, sizeof(header), 1, fp);
    for (int i = 0; i < TOKENIZER_V1_VOCAB; i++) {
        char piece[16];
        unsigned char n = (unsigned char)snprintf(piece, sizeof(piece), "<%d>", i);
        fwriteCheck(&n, 1, 1, fp);
        fwriteCheck(piece, 1, n, fp);
    }
    fcloseCheck(fp);
    Tokenizer tokenizer;
    tokenizer_init(&tokenizer, path);
    CHECK(tokenizer.init_ok && tokenizer.vocab_size == 50257 && tokenizer.eot_token == 50256,
          "version-1 tokenizer: init_ok %d, vocab %u, eot %u", tokenizer.init_ok, tokenizer.vocab_size, tokenizer.eot_token);
    CHECK(tokenizer.init_ok && strcmp(tokenizer_decode(&tokenizer, 50256), "<50256>") == 0, "version-1 tokenizer: last token");
    tokenizer_free(&tokenizer);
}

static void test_safe_printf(void) {
    char text[64];
    STDOUT_OF(text, {
        safe_printf("ab");
        safe_printf("\x01");
        safe_printf("\n");
        safe_printf("\xe2");
        safe_printf(NULL);
        safe_printf("");
        safe_printf("x");
    });
    CHECK(strcmp(text, "ab\nx") == 0, "safe_printf printed [%s]", text);
}

// ----------------------------------------------------------------------------
// checkpoint atomicity and paths

static void touch(const char* path) { write_all(path, "", 0); }

// -nk / -nm: the newest `keep` complete checkpoints stay, and the older major ones; incomplete ones are not counted
static void test_checkpoint_keep_newest(void) {
    char dir[300];
    snprintf(dir, sizeof(dir), "%s", in_dir(g_dir, "keep_newest"));
    ensure_writable_dir(dir);
    const int steps[] = {1, 2, 3, 4, 5, 6, 7, 9, 12, 13};  // irregular, as a last step or another -n makes them
    const int num_steps = (int)(sizeof(steps) / sizeof(steps[0]));
    char name[64];
    for (int i = 0; i < num_steps; i++) {
        snprintf(name, sizeof(name), "model_%08d.bin", steps[i]);
        touch(in_dir(dir, name));
        snprintf(name, sizeof(name), "state_%08d_00000.bin", steps[i]);
        touch(in_dir(dir, name));
        checkpoint_write_done(dir, steps[i]);
    }
    touch(in_dir(dir, "model_00000014.bin"));  // step 14: not complete
    // debris of killed runs, older than the newest complete step: a checkpoint cut off before
    // its marker (10), one whose removal was cut off after its marker went (11), a marker's .tmp (8)
    touch(in_dir(dir, "model_00000010.bin"));
    touch(in_dir(dir, "state_00000010_00001.bin.tmp"));
    touch(in_dir(dir, "state_00000011_00000.bin"));
    touch(in_dir(dir, "DONE_00000008.tmp"));
    // a user's files beside the checkpoints, named like them but not theirs: never removed
    const char* foreign[] = {"model_00000005.bin.bak", "model_00000005_export.safetensors", "state_00000012.json",
                             "state_00000002_0001.bin", "DONE_00000002.old"};
    for (int i = 0; i < 5; i++) { touch(in_dir(dir, foreign[i])); }
    int count;
    int* listed = checkpoint_complete_steps(dir, &count);
    int newest_first = count == num_steps;
    for (int i = 0; newest_first && i < count; i++) { newest_first = listed[i] == steps[num_steps - 1 - i]; }
    CHECK(newest_first, "checkpoint_complete_steps: %d steps, not the %d complete ones newest first", count, num_steps);
    free(listed);
    checkpoint_keep_newest(dir, 0, 0);
    free(checkpoint_complete_steps(dir, &count));
    CHECK(count == num_steps, "keep 0 removed checkpoints (%d left)", count);
    checkpoint_keep_newest(dir, 3, 4);  // the newest 3 (13, 12, 9) and the older majors: 4 (8 was never written)
    for (int i = 0; i < num_steps; i++) {
        int kept = steps[i] >= 9 || steps[i] % 4 == 0;
        snprintf(name, sizeof(name), "model_%08d.bin", steps[i]);
        int model = file_exists(in_dir(dir, name));
        snprintf(name, sizeof(name), "state_%08d_00000.bin", steps[i]);
        int state = file_exists(in_dir(dir, name));
        snprintf(name, sizeof(name), "DONE_%08d", steps[i]);
        int done = file_exists(in_dir(dir, name));
        CHECK(model == kept && state == kept && done == kept, "-nk 3 -nm 4: step %d has model %d state %d DONE %d, "
              "expected %s", steps[i], model, state, done, kept ? "all" : "none");
    }
    CHECK(file_exists(in_dir(dir, "model_00000014.bin")), "an incomplete checkpoint newer than the newest complete one "
          "(being written) was removed");
    const char* debris[] = {"model_00000010.bin", "state_00000010_00001.bin.tmp", "state_00000011_00000.bin",
                            "DONE_00000008.tmp"};
    for (int i = 0; i < 4; i++) {
        CHECK(!file_exists(in_dir(dir, debris[i])), "-nk 3: '%s' of an older incomplete step was left", debris[i]);
    }
    for (int i = 0; i < 5; i++) {
        CHECK(file_exists(in_dir(dir, foreign[i])), "-nk 3: '%s', not a checkpoint file, was removed", foreign[i]);
    }
    checkpoint_keep_newest(dir, 1, 0);
    listed = checkpoint_complete_steps(dir, &count);
    CHECK(count == 1 && listed[0] == 13, "-nk 1: %d left", count);
    free(listed);
}

static void test_checkpoint_paths_and_latest(void) {
    char path[CHECKPOINT_PATH_MAX];
    checkpoint_model_path(path, sizeof(path), "out", 1500);
    CHECK(strcmp(path, "out/model_00001500.bin") == 0, "model path %s", path);
    checkpoint_state_path(path, sizeof(path), "out", 1500, 3);
    CHECK(strcmp(path, "out/state_00001500_00003.bin") == 0, "state path %s", path);
    checkpoint_done_path(path, sizeof(path), "out", 1500);
    CHECK(strcmp(path, "out/DONE_00001500") == 0, "done path %s", path);
    char tiny[8];
    volatile size_t tiny_size = sizeof(tiny);  // opaque to the compiler, which would warn of the truncation tested here
    CHECK_DIES("checkpoint: path too long", "out", checkpoint_model_path(tiny, tiny_size, "out", 1));

    char dir[256];
    test_make_temp_dir(dir, sizeof(dir));
    CHECK(checkpoint_find_latest(dir) == -1, "empty dir must give -1");
    CHECK(checkpoint_find_latest(in_dir(dir, "missing_subdir")) == -1, "missing dir must give -1");

    GPT2Config cfg = gpt2_config_make(1, 1, 4, 4, 8);
    size_t n = gpt2_num_parameters(&cfg);
    float* params = (float*)mallocCheck(n * sizeof(float));
    float* back = (float*)mallocCheck(n * sizeof(float));
    for (size_t i = 0; i < n; i++) { params[i] = (float)i; }
    for (int step = 10; step <= 20; step += 10) {
        checkpoint_model_path(path, sizeof(path), dir, step);
        model_file_write(path, &cfg, params, 3);
        checkpoint_write_done(dir, step);
    }
    CHECK(checkpoint_find_latest(dir) == 20, "latest of 10, 20: %d", checkpoint_find_latest(dir));
    CHECK(!file_exists(in_dir(dir, "DONE_00000020.tmp")), "DONE write left its .tmp behind");
    // step 30: files complete but no DONE yet; step 40: killed while writing (only .tmp files)
    checkpoint_model_path(path, sizeof(path), dir, 30);
    model_file_write(path, &cfg, params, 3);
    touch(in_dir(dir, "model_00000040.bin.tmp"));
    touch(in_dir(dir, "DONE_00000040.tmp"));
    touch(in_dir(dir, "DONE_0000005"));       // not 8 digits
    touch(in_dir(dir, "DONE_00000060x"));     // trailing junk
    touch(in_dir(dir, "xDONE_00000070"));
    touch(in_dir(dir, "DONE_9999999x"));      // not all digits
    CHECK(checkpoint_find_latest(dir) == 20, "latest must ignore steps without a DONE marker: %d",
          checkpoint_find_latest(dir));
    checkpoint_write_done(dir, 30);
    CHECK(checkpoint_find_latest(dir) == 30, "latest after DONE 30: %d", checkpoint_find_latest(dir));

    // removing a step deletes its marker, model, every rank's state and leftovers, nothing else
    touch(in_dir(dir, "state_00000030_00000.bin"));
    touch(in_dir(dir, "state_00000030_00001.bin"));
    touch(in_dir(dir, "state_00000030_00001.bin.tmp"));
    touch(in_dir(dir, "state_00000300_00000.bin"));
    touch(in_dir(dir, "state_00000030_00009.bin"));  // every rank digit, 9 too
    checkpoint_remove(dir, 30);
    CHECK(checkpoint_find_latest(dir) == 20, "after removing 30 the latest is 20: %d", checkpoint_find_latest(dir));
    CHECK(!file_exists(in_dir(dir, "model_00000030.bin")) && !file_exists(in_dir(dir, "state_00000030_00000.bin")) &&
          !file_exists(in_dir(dir, "state_00000030_00001.bin")) && !file_exists(in_dir(dir, "state_00000030_00001.bin.tmp")) &&
          !file_exists(in_dir(dir, "state_00000030_00009.bin")), "checkpoint_remove left files of step 30");
    CHECK(file_exists(in_dir(dir, "state_00000300_00000.bin")) && file_exists(in_dir(dir, "model_00000020.bin")) &&
          file_exists(in_dir(dir, "DONE_00000020")), "checkpoint_remove removed files of other steps");
    checkpoint_remove(dir, 30);  // removing again is harmless
    checkpoint_remove(in_dir(dir, "no_such_subdir"), 30);  // and so is a dir that is not there
    // a marker that cannot be removed (here a directory with a file in it) stops the removal before any file of
    // the step goes, naming it: its files would otherwise go while it still calls the step complete
    char marker[512];
    checkpoint_done_path(marker, sizeof(marker), dir, 50);
    ensure_writable_dir(marker);
    touch(in_dir(marker, "inside"));
    touch(in_dir(dir, "model_00000050.bin"));
    CHECK_DIES("checkpoint: a marker that cannot be removed", "cannot remove '", checkpoint_remove(dir, 50));
    CHECK(file_exists(in_dir(dir, "model_00000050.bin")), "the step's model file went while its marker stayed");
    remove(in_dir(marker, "inside"));
    rmdir(marker);
    remove(in_dir(dir, "model_00000050.bin"));

    // one dir, one run: starting over (-y 0) is refused where complete checkpoints are, whether
    // or not it writes more (its main.log would replace theirs); resuming or no -o is not
    CHECK_DIES("checkpoint: -y 0 into a dir with checkpoints", "the newest: step 20", checkpoint_check_fresh_dir(dir, 0));
    CHECK_DIES("checkpoint: -y 0 into a dir with checkpoints (what to do)", "-y 1 resumes it",
               checkpoint_check_fresh_dir(dir, 0));
    checkpoint_check_fresh_dir(dir, 1);
    checkpoint_check_fresh_dir(NULL, 0);
    checkpoint_check_fresh_dir(in_dir(dir, "missing_subdir"), 0);

    // a writer killed half way leaves the previous complete file readable
    checkpoint_model_path(path, sizeof(path), dir, 20);
    char tmp[CHECKPOINT_PATH_MAX + 8];
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    write_all(tmp, "partial", 7);
    model_file_read_params(path, &cfg, back);
    CHECK(memcmp(back, params, n * sizeof(float)) == 0, "stale .tmp must not affect the complete file");
    // rewriting replaces the file and consumes the stale .tmp
    params[0] = 42.0f;
    model_file_write(path, &cfg, params, 3);
    model_file_read_params(path, &cfg, back);
    CHECK(back[0] == 42.0f && !file_exists(tmp), "rewrite did not replace the file atomically");
    free(params);
    free(back);
    test_remove_dir(dir);
}

// -o at startup: too long a path, a second run in the same dir, a dir that cannot be listed
static void test_checkpoint_claim_dir(void) {
    char dir[256];
    test_make_temp_dir(dir, sizeof(dir));
    char long_dir[CHECKPOINT_PATH_MAX];
    memset(long_dir, 'a', sizeof(long_dir) - 1);
    long_dir[0] = '/';
    long_dir[CHECKPOINT_PATH_MAX - 29] = '\0';  // 4067 characters, and the state file's .tmp name: 4096
    checkpoint_claim_dir(NULL, 0, 0);
    CHECK_DIES("-o too long for its checkpoint files", "too long for its checkpoint files (at most 4066)",
               checkpoint_claim_dir(long_dir, 0, 0));

    char run_dir[512];
    snprintf(run_dir, sizeof(run_dir), "%s/run", dir);
    checkpoint_claim_dir(run_dir, 0, 0);  // creates it, and holds its lock until this process ends
    CHECK(file_exists(in_dir(run_dir, CHECKPOINT_LOCK_NAME)), "no lock file in -o");
    CHECK_DIES("a second run in the same -o", "is in use by another run", checkpoint_claim_dir(run_dir, 0, 1));
    CHECK_DIES("a second run in the same -o (named)", CHECKPOINT_LOCK_NAME "' is locked", checkpoint_claim_dir(run_dir, 0, 0));
    checkpoint_claim_dir(run_dir, 1, 1);  // rank 1 of the same run takes no lock
    // a lock file that cannot be opened (a directory of that name): one line, not a run without a lock
    char lock_dir[512];
    snprintf(lock_dir, sizeof(lock_dir), "%s/lockdir", dir);
    ensure_writable_dir(in_dir(lock_dir, CHECKPOINT_LOCK_NAME));
    CHECK_DIES("-o whose lock file cannot be opened", "cannot open '", checkpoint_claim_dir(lock_dir, 0, 0));

    // a dir that cannot be listed is not an empty one: -y 1 would start over in it (root reads
    // any dir, so the check drops to nobody, where it can)
    char closed_dir[512];
    snprintf(closed_dir, sizeof(closed_dir), "%s/closed", dir);
    ensure_writable_dir(closed_dir);
    CHECK(chmod(dir, 0711) == 0 && chmod(closed_dir, 0333) == 0, "chmod of the test dirs");
    CHECK_DIES("checkpoints of a dir that cannot be listed", "cannot list checkpoint dir",
               AS_NOBODY(checkpoint_find_latest(closed_dir)));
    CHECK_DIES("removing a step of a dir that cannot be listed", "cannot list checkpoint dir",
               AS_NOBODY(checkpoint_remove(closed_dir, 3)));
    CHECK_DIES("-o that cannot be listed", "cannot be listed (it needs read and search permission)",
               AS_NOBODY(checkpoint_claim_dir(closed_dir, 0, 1)));
    CHECK(chmod(closed_dir, 0755) == 0 && chmod(dir, 0700) == 0, "chmod back");
    test_remove_dir(closed_dir);
    test_remove_dir(run_dir);
    test_remove_dir(dir);
}

// ----------------------------------------------------------------------------
// utils.h's file helpers name the file in every failure

// the parent's copy of a file whose failure a CHECK_DIES child has shown: closed without the error
// its unwritten buffer gives (the child reported it), and its slot freed
static void discard_file(FILE* fp) {
    llm8_untrack_file(fp);
    fclose(fp);
}

static void test_file_errors_name_the_file(void) {
    const char* path = in_dir(g_dir, "short_file.bin");
    write_all(path, "0123456789", 10);
    char buffer[64];
    FILE* fp = fopenCheck(path, "rb");
    freadCheck(buffer, 1, 4, fp);
    CHECK_DIES("read past the end names the file", "short_file.bin': unexpected end of file", freadCheck(buffer, 1, 20, fp));
    fcloseCheck(fp);
    fp = fopenCheck(path, "rb");  // the closed file's slot is free again, and the name is the new one's
    CHECK_DIES("seek before the start names the file", "in '", fseekCheck(fp, -5, SEEK_SET));
    CHECK_DIES("seek before the start names the file (which)", "short_file.bin", fseekCheck(fp, -5, SEEK_SET));
    fcloseCheck(fp);
    FILE* full = fopenCheck("/dev/full", "wb");  // a write the disk refuses, seen at the flush of the close
    fwriteCheck(buffer, 1, sizeof(buffer), full);
    CHECK_DIES("a failed close names the file", "cannot close '/dev/full'", fcloseCheck(full));
    discard_file(full);
    full = fopenCheck("/dev/full", "wb");  // the logs flush each line: the flush must see the failure
    fputs("s:1 trl:5.0000\n", full);
    CHECK_DIES("a failed flush names the file", "cannot write '/dev/full'", fflushCheck(full));
    discard_file(full);
    char too_long[64];
    volatile size_t too_long_size = sizeof(too_long);  // opaque to the compiler, which would warn of the truncation tested here
    CHECK_DIES("a path longer than its buffer", "is longer than 63 characters",
               path_in_dir(too_long, too_long_size, "/a/dir/of/forty/characters/or/so/xxxxxx", "numerics.jsonl.and.more."));
    CHECK_DIES("a directory is not a file to read", "a directory, not a regular file", fopenCheck(g_dir, "rb"));
    FILE* untracked = tmpfile();
    CHECK_DIES("a file fopenCheck did not open", "an untracked file", freadCheck(buffer, 1, 1, untracked));
    fclose(untracked);
}

// ----------------------------------------------------------------------------
// logger

static char* read_text(const char* path) {
    size_t n;
    char* text = (char*)read_all(path, &n);
    text[n] = '\0';
    return text;
}

// a run that logs one val loss into dir (resume: appending), and the main.log it leaves
static char* log_one_val(const char* dir, int resume, int step, float val_loss) {
    Logger logger;
    logger_init(&logger, dir, 0, resume);
    logger_log_val(&logger, step, val_loss);
    logger_free(&logger);
    return read_text(in_dir(dir, "main.log"));
}

static void test_logger(void) {
    char dir[256];
    test_make_temp_dir(dir, sizeof(dir));
    Logger logger;
    logger_init(&logger, dir, 0, 0);
    logger_log_train(&logger, 0, 10.98766f, 6e-5f, 3.14159f, 120.5f, 250000.0f, 0.381f, 0);
    logger_log_val(&logger, 0, 10.5f);
    logger_log_train(&logger, 1, NAN, 1.2e-4f, INFINITY, 99.0f, 300000.0f, 0.4f, 1);
    logger_log_eval(&logger, 1, 0.2875f);
    // lines are flushed as they are written, before logger_free
    char* log = read_text(in_dir(dir, "main.log"));
    const char* want_log =
        "s:0 trl:10.9877 lr:0.000060 norm:3.14\n"
        "s:0 tel:10.5000\n"
        "s:1 trl:nan lr:0.000120 norm:inf\n"
        "s:1 eval:0.2875\n";
    CHECK(strcmp(log, want_log) == 0, "main.log is\n%s", log);
    free(log);
    char* jsonl = read_text(in_dir(dir, "main.jsonl"));
    char want_jsonl[2048];
    snprintf(want_jsonl, sizeof(want_jsonl),
             "{\"step\":0,\"type\":\"train\",\"loss\":%.9g,\"lr\":%.9g,\"norm\":%.9g,\"ms\":120.5,\"tok_per_s\":250000,"
             "\"mfu\":%.9g,\"skipped\":0}\n"
             "{\"step\":0,\"type\":\"val\",\"loss\":10.5}\n"
             "{\"step\":1,\"type\":\"train\",\"loss\":null,\"lr\":%.9g,\"norm\":null,\"ms\":99,\"tok_per_s\":300000,"
             "\"mfu\":%.9g,\"skipped\":1}\n"
             "{\"step\":1,\"type\":\"eval\",\"hellaswag_acc\":%.9g}\n",
             (double)10.98766f, (double)6e-5f, (double)3.14159f, (double)0.381f, (double)1.2e-4f, (double)0.4f,
             (double)0.2875f);
    CHECK(strcmp(jsonl, want_jsonl) == 0, "main.jsonl is\n%s\nexpected\n%s", jsonl, want_jsonl);
    free(jsonl);
    logger_free(&logger);

    // resume appends, a fresh run truncates
    log = log_one_val(dir, 1, 2, 9.0f);
    CHECK(strstr(log, "s:0 tel:10.5000\n") != NULL && strstr(log, "s:2 tel:9.0000\n") != NULL, "resume must append");
    free(log);
    log = log_one_val(dir, 0, 3, 8.0f);
    CHECK(strcmp(log, "s:3 tel:8.0000\n") == 0, "fresh run must truncate: [%s]", log);
    free(log);

    // a resumed run ends a line a kill or a full disk cut short before it appends its own
    write_all(in_dir(dir, "main.log"), "s:3 tel:8.0000\ns:4 trl:7.5", 26);
    log = log_one_val(dir, 1, 5, 7.0f);
    CHECK(strcmp(log, "s:3 tel:8.0000\ns:4 trl:7.5\ns:5 tel:7.0000\n") == 0, "resume after a torn line: [%s]", log);
    free(log);

    // a line the disk refuses ends the run naming the log (glibc drops a failed flush's buffer,
    // so the close after it would report nothing)
    char full_dir[256];
    test_make_temp_dir(full_dir, sizeof(full_dir));
    CHECK(symlink("/dev/full", in_dir(full_dir, "main.log")) == 0, "symlink main.log to /dev/full");
    CHECK_DIES("main.log on a full disk", "main.log': No space left on device", {
        logger_init(&logger, full_dir, 0, 0);
        logger_log_val(&logger, 1, 7.0f);
    });
    test_remove_dir(full_dir);

    // other ranks and no log dir write nothing
    char dir2[256];
    test_make_temp_dir(dir2, sizeof(dir2));
    logger_init(&logger, dir2, 1, 0);
    logger_log_val(&logger, 0, 1.0f);
    logger_free(&logger);
    CHECK(!file_exists(in_dir(dir2, "main.log")) && !file_exists(in_dir(dir2, "main.jsonl")), "rank 1 wrote a log");
    logger_init(&logger, NULL, 0, 0);
    logger_log_train(&logger, 0, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 0);
    logger_free(&logger);
    CHECK(logger.log_file == NULL, "NULL log dir must not log");
    test_remove_dir(dir2);
    test_remove_dir(dir);
}

// ----------------------------------------------------------------------------
// edges the tests above do not reach (found by mutation testing); each comment names what it catches

static void test_checkpoint_edges(void) {
    // a model file holding a NaN dies naming the tensor. Catches a dropped finite check on read
    {
        GPT2Config cfg = gpt2_config_make(1, 1, 4, 4, 8);
        size_t n = gpt2_num_parameters(&cfg);
        float* params = (float*)mallocCheck(n * sizeof(float));
        for (size_t i = 0; i < n; i++) { params[i] = 0.01f * (float)i; }
        params[3] = NAN;
        const char* nan_path = in_dir(g_dir, "model_nan.bin");
        model_file_write(nan_path, &cfg, params, 3);
        CHECK_DIES("model: a NaN weight", "element 3 of wte is nan, expected a finite number",
                   model_file_read_params(in_dir(g_dir, "model_nan.bin"), &cfg, params));
        free(params);
    }
    // a bf16 model of more than one chunk (CHECKPOINT_CHUNK_ELEMS) of parameters round-trips. Catches a
    // chunk count off by one (every chunk but the last one element short)
    {
        GPT2Config cfg = gpt2_config_make(1, 1, 64, 8, 17000);
        size_t n = gpt2_num_parameters(&cfg);
        CHECK(n > CHECKPOINT_CHUNK_ELEMS, "the big model has %zu parameters, not more than a chunk", n);
        float* params = (float*)mallocCheck(n * sizeof(float));
        float* back = (float*)mallocCheck(n * sizeof(float));
        for (size_t i = 0; i < n; i++) { params[i] = (float)(i % 256) - 128.0f; }  // integers below 256: exact in bf16
        const char* big = in_dir(g_dir, "model_big_v5.bin");
        model_file_write(big, &cfg, params, 5);
        model_file_read_params(in_dir(g_dir, "model_big_v5.bin"), &cfg, back);
        CHECK(memcmp(params, back, n * sizeof(float)) == 0, "a bf16 model of %zu parameters does not round-trip", n);
        free(params);
        free(back);
    }
    // a path exactly as long as the buffer (no room for its NUL) is refused. Catches the bound off by one
    {
        char path[32];
        checkpoint_model_path(path, sizeof(path), "o", 1);  // "o/model_00000001.bin": 20 characters
        volatile size_t exact = strlen(path);
        char out[32];
        CHECK_DIES("checkpoint: path one byte too long", "longer than", checkpoint_model_path(out, exact, "o", 1));
    }
    // -y 1 in a dir holding only an incomplete step starts from scratch. Catches resuming a step without DONE
    {
        char dir[256];
        test_make_temp_dir(dir, sizeof(dir));
        char path[CHECKPOINT_PATH_MAX];
        checkpoint_model_path(path, sizeof(path), dir, 40);
        write_all(path, (const unsigned char*)"x", 1);
        CHECK(checkpoint_resume_step(dir) == -1, "-y 1 with only step 40's files (no DONE) must start from scratch");
        test_remove_dir(dir);
    }

    size_t n = PY_STATE_NUM_PARAMS;
    float m[PY_STATE_NUM_PARAMS], v[PY_STATE_NUM_PARAMS], master[PY_STATE_NUM_PARAMS];
    fill_arrays(m, v, master, n);
    TrainState state = {7, 1, 2, 0, 0}, got;
    StateBuffers buffers = {n, m, v, master, NULL, 0};
    StateBuffers no_master = {n, m, v, NULL, NULL, 0};
    DataLoader loader;
    py_loader_init(&loader, 0);
    // one rank of two writes version 2 even with fp32 moments and no sections (llm.c cuts a rank's state
    // otherwise). Catches version 1 for a multi-rank file
    {
        DataLoader rank1;
        dataloader_init(&rank1, in_dir(g_py_dir, "data_train_*.bin"), PY_STATE_B, PY_STATE_T, 1, 2, 0, 50257);
        const char* two = in_dir(g_dir, "state_rank1_of_2.bin");
        state_file_write(two, &state, &no_master, &rank1);
        StateFileIndex index;
        state_file_read_header(in_dir(g_dir, "state_rank1_of_2.bin"), &index);
        CHECK(index.version == STATE_VERSION_SECTIONS, "rank 1 of 2's state file has version %d, expected 2", index.version);
        dataloader_free(&rank1);
    }
    const char* plain = in_dir(g_dir, "state_plain.bin");
    state_file_write(plain, &state, &buffers, &loader);
    size_t plain_length = file_length(in_dir(g_dir, "state_plain.bin"));
    // each error names its own cause, not the later one a missing check falls through to
    {
        // catches a dropped exact-length check for a file without trailer or sections
        const char* longer = write_variant(in_dir(g_dir, "state_plain.bin"), "state_plain_longer.bin", plain_length + 4, -1, 0);
        CHECK_DIES("state: 4 bytes past the body (message)", "for 100 parameters per rank",
                   state_file_read(longer, &got, &buffers, &loader));
        // catches a dropped master-weights check
        CHECK_DIES("state: master weights mismatch (message)", "use_master_weights=1",
                   state_file_read(in_dir(g_dir, "state_plain.bin"), &got, &no_master, &loader));
        // catches slot 6 (moments in sections) left unchecked in version 2 files
        const char* sections_path = in_dir(g_dir, "sections.bin");  // test_state_sections' version 2 file
        const char* slot6 = write_variant(sections_path, "state_slot6.bin", file_length(sections_path), 6, 2);
        StateFileIndex index;
        CHECK_DIES("state: slot 6 neither 0 nor 1", "has 2 in header slot 6", state_file_read_header(slot6, &index));
        // 64 sections is the most a file may claim: the header alone reads. Catches the bound off by one
        const char* max_sections = write_variant(in_dir(g_dir, "sections.bin"), "state_64_sections.bin",
                                                 file_length(in_dir(g_dir, "sections.bin")), STATE_SLOT_NUM_SECTIONS,
                                                 STATE_FILE_MAX_SECTIONS);
        CHECK_LIVES("state: a header claiming 64 sections", state_file_read_header(max_sections, &index));
    }
    // a file of the same B but another T is a reshaped one: its position counts other samples. Catches T ignored
    {
        DataLoader shorter;
        dataloader_init(&shorter, in_dir(g_py_dir, "data_train_*.bin"), PY_STATE_B, PY_STATE_T / 2, 0, 1, 0, 50257);
        for (int i = 0; i < 30; i++) { dataloader_next_batch(&loader); }
        state_file_write(in_dir(g_dir, "state_moved.bin"), &state, &buffers, &loader);
        memset(&got, 0, sizeof(got));
        state_file_read(in_dir(g_dir, "state_moved.bin"), &got, &buffers, &shorter);
        CHECK(got.data_reshaped && shorter.current_shard_idx == 0 && shorter.current_sample_idx == 0,
              "T=%d file read with T=%d: reshaped %d, position %zu %zu", PY_STATE_T, PY_STATE_T / 2, got.data_reshaped,
              shorter.current_shard_idx, shorter.current_sample_idx);
        dataloader_free(&shorter);
    }
    dataloader_free(&loader);

    // sections: one twice, one truncated, the moments' absence named
    {
        DataLoader shuffled;
        py_loader_init(&shuffled, 1);
        uint8_t extra[32], extra_back[32];
        memset(extra, 5, sizeof(extra));
        StateSection twice[2] = {{"opt_extra", extra, sizeof(extra), 1}, {"opt_extra", extra, sizeof(extra), 1}};
        StateBuffers twice_buffers = {n, m, v, master, twice, 2};
        state_file_write(in_dir(g_dir, "state_twice.bin"), &state, &twice_buffers, &shuffled);
        StateSection once[1] = {{"opt_extra", extra_back, sizeof(extra_back), 1}};
        StateBuffers once_buffers = {n, m, v, master, once, 1};
        // catches a dropped duplicate-section check (the optional section would be read twice, silently)
        CHECK_DIES("state: a section twice", "has section 'opt_extra' twice",
                   state_file_read(in_dir(g_dir, "state_twice.bin"), &got, &once_buffers, &shuffled));
        StateBuffers one_section = {n, m, v, master, twice, 1};
        state_file_write(in_dir(g_dir, "state_once.bin"), &state, &one_section, &shuffled);
        const char* cut = write_variant(in_dir(g_dir, "state_once.bin"), "state_section_cut.bin",
                                        file_length(in_dir(g_dir, "state_once.bin")) - 4, -1, 0);
        // catches a dropped section-truncation check (the read would fail with a generic end of file)
        CHECK_DIES("state: a section cut short", "section 'opt_extra' is truncated",
                   state_file_read(cut, &got, &once_buffers, &shuffled));
        // catches a dropped fp32-moments check: a file without them read by a run that needs them
        StateBuffers no_moments = {n, NULL, NULL, master, twice, 1};
        state_file_write(in_dir(g_dir, "state_no_moments.bin"), &state, &no_moments, &shuffled);
        CHECK_DIES("state: moments expected (message)", "has no fp32 AdamW moments",
                   state_file_read(in_dir(g_dir, "state_no_moments.bin"), &got, &once_buffers, &shuffled));
        // catches a dropped end-of-file check in state_file_index (the map would ignore trailing garbage)
        const char* index_longer = write_variant(in_dir(g_dir, "state_once.bin"), "state_index_longer.bin",
                                                 file_length(in_dir(g_dir, "state_once.bin")) + 4, -1, 0);
        StateFileIndex index;
        CHECK_DIES("state index: trailing bytes", "has 4 unexpected bytes", state_file_index(index_longer, n, &index));
        dataloader_free(&shuffled);
    }
    // a shuffled file of another B leaves the loader's shuffle state a fresh loader's, for the caller's replay
    // (dataloader_seek_batches draws from it). Catches the file's trailer read into the loader anyway
    {
        DataLoader writer, wider, fresh;
        py_loader_init(&writer, 1);
        for (int i = 0; i < 70; i++) { dataloader_next_batch(&writer); }  // into the next epoch: the rng has moved
        state_file_write(in_dir(g_dir, "state_shuffled_moved.bin"), &state, &buffers, &writer);
        dataloader_init(&wider, in_dir(g_py_dir, "data_train_*.bin"), 2 * PY_STATE_B, PY_STATE_T, 0, 1, 1, 50257);
        dataloader_init(&fresh, in_dir(g_py_dir, "data_train_*.bin"), 2 * PY_STATE_B, PY_STATE_T, 0, 1, 1, 50257);
        state_file_read(in_dir(g_dir, "state_shuffled_moved.bin"), &got, &buffers, &wider);
        CHECK(got.data_reshaped && memcmp(&wider.shuffle_rng, &fresh.shuffle_rng, sizeof(fresh.shuffle_rng)) == 0 &&
              wider.num_intra_shard_indices == fresh.num_intra_shard_indices &&
              memcmp(wider.intra_shard_indices, fresh.intra_shard_indices,
                     fresh.num_intra_shard_indices * sizeof(int)) == 0,
              "a reshaped shuffled file changed the loader's shuffle state (reshaped %d)", got.data_reshaped);
        dataloader_free(&writer);
        dataloader_free(&wider);
        dataloader_free(&fresh);
    }
}

// ----------------------------------------------------------------------------
// edges of the tokenizer, the logger, the file helpers and the model config (found by mutation testing)

// a tokenizer file in g_dir: header magic, version, vocab and end-of-text id as given, then `count` pieces
static void write_tokenizer(const char* path, int32_t version, int32_t vocab, int32_t eot, const char* const* pieces,
                            int count) {
    int32_t header[TOKENIZER_HEADER_INTS] = {TOKENIZER_MAGIC, version, vocab, eot};
    FILE* fp = fopenCheck(path, "wb");
    fwriteCheck(header, sizeof(header), 1, fp);
    for (int i = 0; i < count; i++) {
        unsigned char n = (unsigned char)strlen(pieces[i]);
        fwriteCheck(&n, 1, 1, fp);
        fwriteCheck(pieces[i], 1, n, fp);
    }
    fcloseCheck(fp);
}

// a tokenizer file of three pieces with this header that tokenizer_init refuses, naming `cause`
static void check_tokenizer_refused(const char* what, int32_t version, int32_t vocab, int32_t eot, const char* const* pieces,
                                    const char* cause) {
    char path[1024];
    snprintf(path, sizeof(path), "%s/tok_refused.bin", g_dir);
    write_tokenizer(path, version, vocab, eot, pieces, 3);
    Tokenizer tokenizer;
    CHECK_DIES(what, cause, tokenizer_init(&tokenizer, path));
}

static void test_tokenizer_edges(void) {
    const char* abc[] = {"a", "bc", "<|eot|>"};
    const char* empty_middle[] = {"a", "", "c"};
    char good[1024];
    snprintf(good, sizeof(good), "%s/tok_abc.bin", g_dir);
    write_tokenizer(good, 2, 3, 0, abc, 3);
    Tokenizer tokenizer;
    tokenizer_init(&tokenizer, good);  // the end-of-text id is the header's, wherever it sits in the table
    CHECK(tokenizer.init_ok && tokenizer.eot_token == 0 && strcmp(tokenizer_decode(&tokenizer, 1), "bc") == 0,
          "a tokenizer whose end-of-text id is 0: init_ok %d, eot %u", tokenizer.init_ok, tokenizer.eot_token);
    tokenizer_free(&tokenizer);
    CHECK(tokenizer_decode(&tokenizer, 1) == NULL, "a freed tokenizer still decodes");

    check_tokenizer_refused("tokenizer: end-of-text id = vocab size", 2, 3, 3, abc, "end-of-text token 3 are invalid");
    check_tokenizer_refused("tokenizer: negative end-of-text id", 2, 3, -1, abc, "end-of-text token -1 are invalid");
    check_tokenizer_refused("tokenizer: version 0", 0, 3, 2, abc, "has version 0");
    check_tokenizer_refused("tokenizer: version 1 of another vocab (why)", 1, 3, 2, abc, "must be GPT-2's, 50257 tokens");
    check_tokenizer_refused("tokenizer: an empty piece", 2, 3, 2, empty_middle, "token 1 is missing, empty or truncated");

    size_t length = file_length(good);
    struct { const char* what; size_t length; const char* cause; } cuts[] = {
        {"tokenizer: last piece one byte short", length - 1, "token 2 is missing, empty or truncated"},
        {"tokenizer: two trailing bytes (counted)", length + 2, "2 unexpected bytes after its 3 tokens"},
        {"tokenizer: cut inside its header", 1023, "is 1023 bytes, shorter than its 1024-byte header"},
        {"tokenizer: its header alone", 1024, "token 0 is missing"},
    };
    for (int i = 0; i < 4; i++) {
        char cut[1024];
        snprintf(cut, sizeof(cut), "%s", write_variant(good, "tok_cut.bin", cuts[i].length, -1, 0));
        CHECK_DIES(cuts[i].what, cuts[i].cause, tokenizer_init(&tokenizer, cut));
    }

    // a missing file's init clears the struct it is given, so freeing it after is safe
    memset(&tokenizer, 0xff, sizeof(tokenizer));
    char text[512];
    STDOUT_OF(text, tokenizer_init(&tokenizer, in_dir(g_dir, "no_such_tokenizer.bin")));
    CHECK_LIVES("freeing the tokenizer of a missing file", tokenizer_free(&tokenizer));
    // no file given (-tk "" and none found): a note, not a file "not found"
    STDOUT_OF(text, tokenizer_init(&tokenizer, ""));
    CHECK(!tokenizer.init_ok && strncmp(text, "note: no tokenizer file", 23) == 0, "tokenizer_init(\"\") printed [%s]", text);
    // a file that exists but cannot be read is an error, not a missing file (as nobody: root reads any file)
    char dir[256];
    test_make_temp_dir(dir, sizeof(dir));
    char unreadable[512];
    snprintf(unreadable, sizeof(unreadable), "%s/tok_unreadable.bin", dir);
    write_tokenizer(unreadable, 2, 3, 0, abc, 3);
    CHECK(chmod(dir, 0711) == 0 && chmod(unreadable, 0) == 0, "chmod of the unreadable tokenizer");
    CHECK_DIES("an unreadable tokenizer file", "Permission denied", AS_NOBODY(tokenizer_init(&tokenizer, unreadable)));
    test_remove_dir(dir);
}

// each line reaches its file as it is logged (the train line too, before any other); a resumed run appends to
// main.jsonl as to main.log, right after the last line (no blank one); logger_free leaves no file to close
// twice; without a dir every kind of line is a no-op; a main.log that is a FIFO (a reader streaming the log) is
// appended to on resume without being opened to read first, which would wait for a writer that never comes
static void test_logger_lines_and_resume(void) {
    char dir[256];
    test_make_temp_dir(dir, sizeof(dir));
    Logger logger;
    logger_init(&logger, dir, 0, 0);
    logger_log_train(&logger, 0, 10.5f, 6e-5f, 3.25f, 120.5f, 250000.0f, 0.25f, 0);
    char train_jsonl[256];
    snprintf(train_jsonl, sizeof(train_jsonl), "{\"step\":0,\"type\":\"train\",\"loss\":10.5,\"lr\":%.9g,\"norm\":3.25,"
             "\"ms\":120.5,\"tok_per_s\":250000,\"mfu\":0.25,\"skipped\":0}\n", (double)6e-5f);
    char* log = read_text(in_dir(dir, "main.log"));
    char* jsonl = read_text(in_dir(dir, "main.jsonl"));
    CHECK(strcmp(log, "s:0 trl:10.5000 lr:0.000060 norm:3.25\n") == 0 && strcmp(jsonl, train_jsonl) == 0,
          "a train line before any other is not in the files: [%s] [%s]", log, jsonl);
    free(log);
    free(jsonl);
    logger_free(&logger);
    CHECK(logger.log_file == NULL && logger.jsonl_file == NULL, "logger_free left its files set");
    logger_free(&logger);  // nothing left to close

    logger_init(&logger, dir, 0, 1);
    logger_log_val(&logger, 1, 9.5f);
    logger_free(&logger);
    log = read_text(in_dir(dir, "main.log"));
    jsonl = read_text(in_dir(dir, "main.jsonl"));
    char want_jsonl[512];
    snprintf(want_jsonl, sizeof(want_jsonl), "%s{\"step\":1,\"type\":\"val\",\"loss\":9.5}\n", train_jsonl);
    CHECK(strcmp(log, "s:0 trl:10.5000 lr:0.000060 norm:3.25\ns:1 tel:9.5000\n") == 0 && strcmp(jsonl, want_jsonl) == 0,
          "resume: main.log [%s], main.jsonl [%s]", log, jsonl);
    free(log);
    free(jsonl);

    CHECK_LIVES("a logger without a dir", {
        Logger none;
        logger_init(&none, NULL, 0, 0);
        logger_log_train(&none, 0, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 0);
        logger_log_val(&none, 0, 1.0f);
        logger_log_eval(&none, 0, 0.5f);
        logger_free(&none);
    });

    char fifo_dir[256];
    test_make_temp_dir(fifo_dir, sizeof(fifo_dir));
    const char* fifo = in_dir(fifo_dir, "main.log");
    int reader = mkfifo(fifo, 0644) == 0 ? open(fifo, O_RDONLY | O_NONBLOCK) : -1;
    CHECK(reader >= 0, "a FIFO with a reader as main.log");
    CHECK_LIVES("resume onto a main.log FIFO", {
        Logger streamed;
        logger_init(&streamed, fifo_dir, 0, 1);
        logger_log_val(&streamed, 1, 2.0f);
        logger_free(&streamed);
    });
    if (reader >= 0) { close(reader); }
    test_remove_dir(fifo_dir);
    test_remove_dir(dir);
}

// a path whose file fopenCheck opened, as an error about that file names it (CHECK_DIES: a read past its end)
static void check_read_error_names(FILE* fp, const char* what, const char* name) {
    char byte[2];
    CHECK_DIES(what, name, freadCheck(byte, 1, 2, fp));
}

// a file of one byte at `path`
static void write_one_byte(const char* path) { write_all(path, "x", 1); }

// a file of one byte at a path of exactly `length` characters: g_dir, folders of 200 characters, a file name
static void make_long_path(char* out, size_t length) {
    size_t n = strlen(g_dir);
    memcpy(out, g_dir, n + 1);
    while (length - n - 1 > 255) {
        out[n] = '/';
        memset(out + n + 1, 'd', 200);
        n += 201;
        out[n] = '\0';
        mkdir(out, 0755);
    }
    out[n] = '/';
    memset(out + n + 1, 'f', length - n - 1);
    out[length] = '\0';
    write_one_byte(out);
}

static void test_file_helper_edges(void) {
    char path[1024], other[1024], buffer[8];
    snprintf(path, sizeof(path), "%s/helper_a.bin", g_dir);
    snprintf(other, sizeof(other), "%s/helper_b.bin", g_dir);
    write_one_byte(path);
    write_one_byte(other);
    CHECK_DIES("open to write where no folder is", "to write: No such file or directory",
               fopenCheck(in_dir(g_dir, "no_folder/out.bin"), "wb"));
    CHECK_DIES("a device is not a file to read", "a special file, not a regular file", fopenCheck("/dev/null", "rb"));

    FILE* writing = fopenCheck(path, "wb");  // a read of a stream open to write fails without an end of file
    CHECK_DIES("a read the stream refuses", "cannot read '", freadCheck(buffer, 1, 1, writing));
    fcloseCheck(writing);
    write_one_byte(path);
    FILE* reading = fopenCheck(path, "rb");
    CHECK_DIES("a write the stream refuses", "cannot write '", fwriteCheck(buffer, 1, 4, reading));
    fcloseCheck(reading);
    // an unbuffered write the disk refused, with nothing left for the flush to write
    FILE* full = fopenCheck("/dev/full", "wb");
    setvbuf(full, NULL, _IONBF, 0);
    fputs("s:1 trl:5.0000\n", full);
    CHECK_DIES("a flush after a failed unbuffered write", "'/dev/full': an earlier write failed", fflushCheck(full));
    discard_file(full);

    // a FILE* that a plain fclose left tracked, reused by the next fopenCheck, takes the new name, and closing it
    // frees every slot that held it: once with the stale slot the first free one, once after a free one
    int open_before = llm8_open_file_count();
    for (int free_slot_before = 0; free_slot_before < 2; free_slot_before++) {
        FILE* kept = free_slot_before ? fopenCheck(path, "rb") : NULL;
        FILE* first = fopenCheck(path, "rb");
        uintptr_t first_address = (uintptr_t)first;  // compared, not used, once closed
        if (kept != NULL) { fcloseCheck(kept); }
        fclose(first);
        FILE* second = fopenCheck(other, "rb");  // glibc hands out the FILE freed last
        int reused = (uintptr_t)second == first_address;
        if (reused) { check_read_error_names(second, "a reused FILE* takes its new name", "helper_b.bin"); }
        fcloseCheck(second);
        if (!reused) { llm8_untrack_file((FILE*)first_address); }  // the stale slot, where `second` came elsewhere
        CHECK(llm8_open_file_count() == open_before, "a reused FILE* (free slot before: %d): %d tracked, %d before",
              free_slot_before, llm8_open_file_count(), open_before);
    }

    // sixteen files open at once are each named
    FILE* open_files[16];
    for (int i = 0; i < 16; i++) { open_files[i] = fopenCheck(i % 2 ? other : path, "rb"); }
    check_read_error_names(open_files[15], "the 16th file open at once", "helper_b.bin");
    for (int i = 0; i < 16; i++) { fcloseCheck(open_files[i]); }

    // paths past a tracking slot's 1023 characters are named by their end; one of exactly 1023, whole
    const size_t lengths[2] = {1023, 1300};
    for (int i = 0; i < 2; i++) {
        char file[1400];
        make_long_path(file, lengths[i]);
        FILE* fp = fopenCheck(file, "rb");
        check_read_error_names(fp, lengths[i] == 1023 ? "a path of 1023 characters" : "a path of 1300 characters",
                               file + lengths[i] - 1023);
        fcloseCheck(fp);
        remove(file);
    }

    // -o: an empty path, one of 4096 characters (no room for its NUL), a file, a dir no one may write
    CHECK_DIES("an empty -o", "expected a path of 1 to 4095 characters", ensure_writable_dir(""));
    char* long_dir = (char*)mallocCheck(4097);
    memset(long_dir, 'a', 4096);
    long_dir[0] = '/';
    long_dir[4096] = '\0';
    CHECK_DIES("-o of 4096 characters", "expected a path of 1 to 4095 characters", ensure_writable_dir(long_dir));
    free(long_dir);
    CHECK_DIES("-o naming a file", "exists and is not a directory", ensure_writable_dir(path));
    CHECK_DIES("-o where no one may write", "'/proc' is not writable", ensure_writable_dir("/proc"));
    ensure_writable_dir(g_dir);
    glob_t probes;  // the probe is named by host and pid (ranks probe one shared -o at once): none may be left
    int found = glob(in_dir(g_dir, ".llm8_write_probe*"), 0, NULL, &probes) == 0 ? (int)probes.gl_pathc : 0;
    CHECK(found == 0, "ensure_writable_dir left %d probe files in -o", found);
    globfree(&probes);
    remove(path);
    remove(other);
}

// llm8_die writes its line in one write, so ranks that die together, sharing one stderr, cannot interleave
// their lines: with a SOCK_SEQPACKET socket as stderr, where each write is one record, the first record
// is the whole line
static void test_error_line_is_one_write(void) {
    int sockets[2];
    CHECK(socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sockets) == 0, "socketpair");
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        close(sockets[0]);
        dup2(sockets[1], STDERR_FILENO);
        llm8_die("a line of %d words", 5);
    }
    close(sockets[1]);
    char first[256];
    ssize_t got = recv(sockets[0], first, sizeof(first) - 1, 0);
    first[got > 0 ? got : 0] = '\0';
    waitpid(pid, NULL, 0);
    close(sockets[0]);
    CHECK(strcmp(first, "error: a line of 5 words\n") == 0, "the first write of llm8_die's line: [%s]", first);
}

#define CHECK_PARSES(what, expression, want) \
    CHECK_LIVES(what, { if ((expression) != (want)) { fprintf(stderr, "parsed another value\n"); _exit(1); } })

// the flag parsers: each end of the range accepted, decimal only, errno left by an earlier call ignored, and
// every kind of bad text refused as such
static void test_flag_parsers(void) {
    CHECK_PARSES("integer: the range's low end", parse_long_flag("-x", "0", 0, 100), 0);
    CHECK_PARSES("integer: the range's high end", parse_long_flag("-x", "100", 0, 100), 100);
    CHECK_PARSES("integer: decimal, not octal", parse_long_flag("-x", "010", 0, 100), 10);
    CHECK_PARSES("integer: errno from before", (errno = ERANGE, parse_long_flag("-x", "5", 0, 100)), 5);
    CHECK_DIES("integer: past long's range", "'99999999999999999999' is not an integer",
               parse_long_flag("-x", "99999999999999999999", 0, 100));
    CHECK_DIES("integer: empty", "'' is not an integer", parse_long_flag("-x", "", 0, 100));
    CHECK_DIES("integer: trailing text", "'12x' is not an integer", parse_long_flag("-x", "12x", 0, 100));
    CHECK_DIES("integer: above the range", "101 is out of range (expected 0..100)", parse_long_flag("-x", "101", 0, 100));
    CHECK_PARSES("number: the range's low end", parse_float_flag("-q", "0", 0.0, 1.0), 0.0f);
    CHECK_PARSES("number: the range's high end", parse_float_flag("-q", "1", 0.0, 1.0), 1.0f);
    CHECK_PARSES("number: errno from before", (errno = ERANGE, parse_float_flag("-q", "0.5", 0.0, 1.0)), 0.5f);
    CHECK_DIES("number: NaN", "'nan' is not a number", parse_float_flag("-q", "nan", 0.0, 1.0));
    CHECK_DIES("number: past double's range", "'1e999' is not a number", parse_float_flag("-q", "1e999", 0.0, 1.0));
    CHECK_DIES("number: trailing text", "'0.5x' is not a number", parse_float_flag("-q", "0.5x", 0.0, 1.0));
}

// the descriptors' shapes are GPT-2's; Vp rounds V up to a multiple of 128, V itself when it is one; the shape
// checks' edges; llm.c's tensor names in its order, and the tensors it decays
static void test_model_config_edges(void) {
    const struct { const char* name; int L, NH, C; } shapes[] = {
        {"tiny", 2, 2, 128}, {"d6", 6, 6, 384}, {"d12", 12, 12, 768}, {"d24", 24, 16, 1024}, {"d36", 36, 20, 1280},
        {"d48", 48, 25, 1600}, {"d60", 60, 30, 1920}, {"d72", 72, 30, 2880}, {"d84", 84, 36, 3456}};
    for (int i = 0; i < 9; i++) {
        GPT2Config c = gpt2_config_from_descriptor(shapes[i].name);
        CHECK(c.num_layers == shapes[i].L && c.num_heads == shapes[i].NH && c.channels == shapes[i].C &&
              c.max_seq_len == 1024 && c.vocab_size == 50257 && c.padded_vocab_size == 50304,
              "%s: L %d NH %d C %d maxT %d V %d Vp %d", shapes[i].name, c.num_layers, c.num_heads, c.channels, c.max_seq_len,
              c.vocab_size, c.padded_vocab_size);
    }
    GPT2Config d12 = gpt2_config_from_descriptor("d12");
    CHECK(gpt2_num_parameters(&d12) == 124475904, "d12 has %zu parameters, llm.c's 124475904", gpt2_num_parameters(&d12));
    CHECK_DIES("descriptor: gpt2 and another separator", "'gpt2-d12'", gpt2_config_from_descriptor("gpt2-d12"));
    CHECK_DIES("descriptor: a preset's name and more", "'d120'", gpt2_config_from_descriptor("d120"));
    CHECK(gpt2_config_make(1, 1, 8, 8, 256).padded_vocab_size == 256 && gpt2_config_make(1, 1, 8, 8, 257).padded_vocab_size == 384,
          "Vp of V=256 and V=257: %d and %d", gpt2_config_make(1, 1, 8, 8, 256).padded_vocab_size,
          gpt2_config_make(1, 1, 8, 8, 257).padded_vocab_size);

    GPT2Config no_layers = gpt2_config_make(0, 1, 8, 8, 16), no_vocab = gpt2_config_make(1, 1, 8, 8, 0);
    GPT2Config no_context = gpt2_config_make(1, 1, 8, 0, 16), exact = gpt2_config_make(1, 1, 8, 8, 128);
    GPT2Config short_padding = gpt2_config_make(1, 1, 8, 8, 128);
    short_padding.padded_vocab_size = 100;
    CHECK_DIES("shape: no layers", "invalid model shape L=0", gpt2_config_validate(&no_layers, "test"));
    CHECK_DIES("shape: no vocab", "V=0 (all must be positive)", gpt2_config_validate(&no_vocab, "test"));
    CHECK_DIES("shape: no context", "maxT=0 V=16 (all must be positive)", gpt2_config_validate(&no_context, "test"));
    GPT2Config no_heads = gpt2_config_make(1, 0, 8, 8, 16), no_channels = gpt2_config_make(1, 1, 0, 8, 16);
    CHECK_DIES("shape: no heads", "NH=0 C=8 maxT=8 V=16 (all must be positive)", gpt2_config_validate(&no_heads, "test"));
    CHECK_DIES("shape: no channels", "NH=1 C=0 maxT=8 V=16 (all must be positive)", gpt2_config_validate(&no_channels, "test"));
    CHECK_DIES("shape: Vp below V", "padded vocab Vp=100 is smaller than vocab V=128", gpt2_config_validate(&short_padding, "test"));
    CHECK_LIVES("shape: Vp = V", gpt2_config_validate(&exact, "test"));
    // past the bounds, one at a time (each would wrap, or nearly, the parameter count of a corrupt header), and at them
    GPT2Config huge[4];
    for (int k = 0; k < 4; k++) { huge[k] = gpt2_config_make(1, 1, 8, 8, 128); }
    huge[0].num_layers = GPT2_MAX_LAYERS + 1;
    huge[1].channels = GPT2_MAX_CHANNELS * 2;
    huge[2].max_seq_len = GPT2_MAX_SEQ_LEN + 1;
    huge[3].padded_vocab_size = GPT2_MAX_PADDED_VOCAB + 128;
    for (int k = 0; k < 4; k++) {
        CHECK_DIES("shape: past the bounds", "is past what llm8 reads", gpt2_config_validate(&huge[k], "test"));
    }
    GPT2Config largest = gpt2_config_make(GPT2_MAX_LAYERS, 1, GPT2_MAX_CHANNELS, GPT2_MAX_SEQ_LEN, 50257);
    largest.padded_vocab_size = GPT2_MAX_PADDED_VOCAB;
    CHECK_LIVES("shape: at the bounds", gpt2_config_validate(&largest, "test"));
    CHECK(gpt2_num_parameters(&largest) < ((size_t)1 << 53), "the largest shape's %zu parameters", gpt2_num_parameters(&largest));

    const char* llmc_names[NUM_PARAMETER_TENSORS] = {"wte", "wpe", "ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb",
                                                     "ln2w", "ln2b", "fcw", "fcb", "fcprojw", "fcprojb", "lnfw", "lnfb"};
    int names_ok = 1, decay_ok = 1;
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        names_ok &= strcmp(PARAM_TENSOR_NAMES[i], llmc_names[i]) == 0;
        int two_d = i == PARAM_WTE || i == PARAM_WPE || i == PARAM_QKVW || i == PARAM_ATTPROJW || i == PARAM_FCW || i == PARAM_FCPROJW;
        decay_ok &= gpt2_param_is_decayed(i) == two_d;
    }
    CHECK(names_ok, "the tensor names are not llm.c's, in its order");
    CHECK(decay_ok, "the decayed tensors are not llm.c's (wte, wpe and the four matmul weights)");
}

// ----------------------------------------------------------------------------
// the command line (llmc/train_config.h), parsed as the trainers parse it

// args: the flags and values after the program's name, NULL-terminated
static TrainConfig parse_config(const char* const* args) {
    char* argv[64];
    int argc = 1;
    argv[0] = (char*)"train";
    while (args[argc - 1] != NULL && argc < 63) { argv[argc] = (char*)args[argc - 1]; argc++; }
    TrainConfig c = train_config_defaults();
    train_config_parse(&c, argc, argv);
    return c;
}
#define PARSE(...) parse_config((const char* const[]){__VA_ARGS__, NULL})

// flags whose values in a and b differ, by their text (at most one name is kept, in *which)
static int config_flags_differing(const TrainConfig* a, const TrainConfig* b, const char** which) {
    int count = 0;
    for (int i = 0; i < NUM_TRAIN_FLAGS; i++) {
        char x[4200], y[4200];
        flag_value_to_text(&TRAIN_FLAGS[i], a, x, sizeof(x));
        flag_value_to_text(&TRAIN_FLAGS[i], b, y, sizeof(y));
        if (strcmp(x, y) != 0) { count++; *which = TRAIN_FLAGS[i].name; }
    }
    return count;
}

// every number flag: both ends of its range land in its own field and no other, one step past either is refused
// naming the flag; every choice flag: each choice lands in its field, a near miss of one is refused
static void test_config_flag_values(void) {
    const TrainConfig base = PARSE("-o", "out", "-pn", "4096");  // -y 1, -n and -pr 4095 need these
    for (int i = 0; i < NUM_TRAIN_FLAGS; i++) {
        const FlagSpec* f = &TRAIN_FLAGS[i];
        if (f->kind == FLAG_INT || f->kind == FLAG_FLOAT) {
            for (int end = 0; end < 2; end++) {
                double value = end == 0 ? f->lo : f->hi;
                double step = f->kind == FLAG_INT ? 1.0 : (value == 0.0 ? 1e-3 : value * 1e-3);
                double past = end == 0 ? value - step : value + step;
                char text[64], outside[64], shown[64];
                snprintf(text, sizeof(text), f->kind == FLAG_INT ? "%.0f" : "%.9g", value);
                snprintf(outside, sizeof(outside), f->kind == FLAG_INT ? "%.0f" : "%.9g", past);
                snprintf(shown, sizeof(shown), f->kind == FLAG_INT ? "%.0f" : "%g", past);  // as the parsers print it
                TrainConfig c = PARSE("-o", "out", "-pn", "4096", f->name, text);
                const char* got = (const char*)&c + f->offset;
                int stored = f->kind == FLAG_INT ? *(const int*)got == (int)value : *(const float*)got == (float)value;
                const char* other = f->name;
                int differing = config_flags_differing(&base, &c, &other);
                CHECK(stored && (differing == 0 || (differing == 1 && strcmp(other, f->name) == 0)),
                      "%s %s: not stored in its own field alone (%d flags differ, e.g. %s)", f->name, text, differing, other);
                char what[128], fragment[128];
                snprintf(what, sizeof(what), "%s %s", f->name, outside);
                snprintf(fragment, sizeof(fragment), "flag %s: %s is out of range", f->name, shown);
                CHECK_DIES(what, fragment, PARSE(f->name, outside));
            }
        } else if (f->kind == FLAG_CHOICE) {
            char choices[256];
            snprintf(choices, sizeof(choices), "%s", f->choices);
            for (char* choice = strtok(choices, " "); choice != NULL; choice = strtok(NULL, " ")) {
                TrainConfig c = PARSE(f->name, choice);
                CHECK(strcmp(*(const char* const*)((const char*)&c + f->offset), choice) == 0, "%s %s: not stored", f->name,
                      choice);
                size_t n = strlen(choice);
                char shorter[64], longer[64], changed[64];
                snprintf(shorter, sizeof(shorter), "%.*s", (int)n - 1, choice);
                snprintf(longer, sizeof(longer), "%sx", choice);
                snprintf(changed, sizeof(changed), "%.*s#", (int)n - 1, choice);
                const char* misses[3] = {shorter, longer, changed};
                char listed[280];  // the choices between spaces, to skip a miss that is another choice (adamw of adamw8)
                snprintf(listed, sizeof(listed), " %s ", f->choices);
                for (int m = 0; m < 3; m++) {
                    char what[128], word[80];
                    snprintf(word, sizeof(word), " %s ", misses[m]);
                    if (strstr(listed, word) != NULL) { continue; }
                    snprintf(what, sizeof(what), "%s '%s'", f->name, misses[m]);
                    CHECK_DIES(what, "is not one of", PARSE(f->name, misses[m]));
                }
            }
        }
    }
}

// the parse's own refusals, and --help wherever it stands
static void test_config_parse_errors(void) {
    CHECK_DIES("a flag without its value", "flag -b needs a value", PARSE("-x", "1", "-b"));
    CHECK_DIES("an unknown flag", "unknown flag '-bogus'", PARSE("-bogus", "1"));
    CHECK_DIES("a value without its flag", "'shard_2.bin' is not a flag", PARSE("-i", "shard_1.bin", "shard_2.bin"));
    CHECK_DIES("-m 0", "flag -m 0", PARSE("-m", "0"));
    CHECK_DIES("-y 1 without -o", "flag -y 1 needs an output dir", PARSE("-y", "1"));
    CHECK_DIES("-n without -o", "flag -n 5 needs an output dir", PARSE("-n", "5"));
    CHECK_LIVES("-n 0 without -o", PARSE("-n", "0"));
    CHECK_DIES("-pr at -pn", "flag -pr 1: rank must be below -pn 1", PARSE("-pr", "1"));
    CHECK_LIVES("-pr below -pn", PARSE("-pn", "2", "-pr", "1"));
    char most_ranks[16], last_rank[16];  // the last rank of the most processes -pn takes
    for (int k = 0; k < NUM_TRAIN_FLAGS; k++) {
        if (strcmp(TRAIN_FLAGS[k].name, "-pn") == 0) {
            snprintf(most_ranks, sizeof(most_ranks), "%.0f", TRAIN_FLAGS[k].hi);
            snprintf(last_rank, sizeof(last_rank), "%.0f", TRAIN_FLAGS[k].hi - 1);
        }
    }
    CHECK_LIVES("-pr the last rank of the largest -pn", PARSE("-pn", most_ranks, "-pr", last_rank));
    CHECK_DIES("a bad -f8 under -p bf16", "flag -f8: 'mlp'", PARSE("-f8", "mlp"));
    CHECK_LIVES("--help after a bad value", PARSE("-b", "0", "--help"));
    CHECK_LIVES("-help", PARSE("-x", "1", "-help"));
}

// --help: one line per flag in the table's order, with the default it is given, its range or choices
static void test_config_usage(void) {
    TrainConfig defaults = train_config_defaults();
    defaults.model = "tiny";
    char text[32768];
    STDOUT_OF(text, train_config_print_usage(stdout, "prog", &defaults));
    const char* lines[] = {
        "Usage: prog [flags]   (flags take one value each, as in llm.c)\n",
        "\n  -i   train data shard glob (default \"dev/data/offline/offline_train_*.bin\")\n",
        "model_*.bin checkpoint (default \"tiny\")\n",
        "\n  -p   matmul precision (the -f flags below apply to fp8; train_gpt2cpu: bf16 trains its fp32 model, fp8 emulates "
        "the FP8 casts in it) (default \"bf16\"; one of: bf16 fp8)\n",
        "\n  -b   micro-batch size per GPU (sequences) (default 4; range 1..65536)\n",
        "\n  -l   peak learning rate (default 0.0003; range 0..10)\n",
        "(default -1; >= -1)\n  -v   ",
        "(default 0; >= 0)\n  --help  print this and exit\n",
    };
    for (int i = 0; i < (int)(sizeof(lines) / sizeof(lines[0])); i++) {
        CHECK(strstr(text, lines[i]) != NULL, "--help lacks [%s]", lines[i]);
    }
    CHECK(strstr(text, "[no effect") == NULL, "--help marks a flag without effect where the program names none");
    // a program's flags_without_effect: marked with its name (the path's last part), and no other flag
    TrainConfig marking = defaults;
    marking.flags_without_effect = "-at -b";
    char marked[32768];
    STDOUT_OF(marked, train_config_print_usage(stdout, "./dir/prog", &marking));
    CHECK(strstr(marked, "\n  -b   micro-batch size per GPU (sequences) [no effect in prog] (default 4; range 1..65536)\n")
          != NULL, "--help does not mark -b [%.300s]", strstr(marked, "\n  -b ") ? strstr(marked, "\n  -b ") : "");
    int marks = 0;
    for (const char* m = strstr(marked, "[no effect in prog]"); m != NULL; m = strstr(m + 1, "[no effect in prog]")) { marks++; }
    CHECK(marks == 2, "--help marks %d flags, expected -at and -b", marks);
    const char* at = text;
    for (int i = 0; i < NUM_TRAIN_FLAGS && at != NULL; i++) {
        char start[16];
        snprintf(start, sizeof(start), "\n  %-4s ", TRAIN_FLAGS[i].name);
        at = strstr(at, start);
        const char* line_end = at == NULL ? NULL : strchr(at + 1, '\n');
        const char* shown = at == NULL ? NULL : strstr(at + 1, "(default ");
        CHECK(line_end != NULL && shown != NULL && shown < line_end, "--help: no line for %s after the one before, with its "
              "default", TRAIN_FLAGS[i].name);
    }
}

// the FP8 settings take -fh, -fm and -fn as given (-fh and -fm at their defaults where the recipe reads neither) and
// are on under -p fp8 alone; -fw delayed, refused, names the first block linear left a bf16 GEMM
static void test_config_fp8_settings(void) {
    TrainConfig c = PARSE("-p", "fp8", "-fh", "7", "-fm", "3", "-fn", "9");
    Fp8Settings s = train_config_fp8_settings(&c);
    CHECK(s.enabled && s.history_len == 7 && s.margin == 3 && s.numerics_every == 9,
          "-p fp8 -fh 7 -fm 3 -fn 9: enabled %d, history %d, margin %d, numerics every %d", s.enabled, s.history_len,
          s.margin, s.numerics_every);
    c = PARSE("-p", "fp8", "-fr", "block", "-fh", "7", "-fm", "3");
    s = train_config_fp8_settings(&c);
    CHECK(s.history_len == FP8_AMAX_HISTORY_DEFAULT && s.margin == 0,
          "-fr block -fh 7 -fm 3 (neither read): history %d, margin %d, not the defaults", s.history_len, s.margin);
    c = PARSE("-p", "fp8", "-fr", "current", "-fh", "7", "-fm", "3");
    s = train_config_fp8_settings(&c);
    CHECK(s.history_len == FP8_AMAX_HISTORY_DEFAULT && s.margin == 3,
          "-fr current -fh 7 -fm 3 (-fh not read): history %d, margin %d", s.history_len, s.margin);
    c = PARSE("-p", "fp8", "-fr", "current", "-fg", "delayed", "-fh", "7");
    s = train_config_fp8_settings(&c);
    CHECK(s.history_len == 7, "-fr current -fg delayed -fh 7 (the gradients' history): history %d", s.history_len);
    c = PARSE("-p", "bf16");
    CHECK(!train_config_fp8_settings(&c).enabled, "-p bf16: FP8 enabled");
    CHECK_DIES("-fw delayed with qkv's wgrad in bf16", "leaves qkv a bf16 GEMM",
               PARSE("-p", "fp8", "-fw", "delayed", "-f8p", "fwd,dgrad,attproj.wgrad"));
    CHECK_DIES("-fw delayed with fc's dgrad in bf16", "leaves fc a bf16 GEMM",
               PARSE("-p", "fp8", "-fw", "delayed", "-f8", "fc,fcproj", "-f8p", "fwd,wgrad,fcproj.dgrad"));
}

// args parsed, then -z checked against them with `ranks` processes
static void check_zero_stage_of(const char* const* args, int ranks) {
    TrainConfig c = parse_config(args);
    Fp8Settings s = train_config_fp8_settings(&c);
    train_config_check_zero_stage(&c, &s, ranks);
}
#define ZERO_STAGE(ranks, ...) check_zero_stage_of((const char* const[]){__VA_ARGS__, NULL}, ranks)

// -z against the number of GPUs and the FP8 settings (the CPU trainer, one process, never gets here)
static void test_config_zero_stage(void) {
    CHECK_DIES("-z 2", "flag -z 2", ZERO_STAGE(2, "-z", "2"));
    CHECK_DIES("-z 2 on one GPU", "flag -z 2", ZERO_STAGE(1, "-z", "2"));
    CHECK_DIES("-z 0 with 2 GPUs", "flag -z 0: with 2 GPUs", ZERO_STAGE(2, "-z", "0"));
    CHECK_LIVES("-z 0 on one GPU", ZERO_STAGE(1, "-z", "0"));
    CHECK_LIVES("-z 1 with 2 GPUs", ZERO_STAGE(2, "-z", "1"));
    CHECK_DIES("-z 3 on one GPU", "with one GPU use -z 1", ZERO_STAGE(1, "-z", "3"));
    CHECK_LIVES("-z 3 bf16", ZERO_STAGE(2, "-z", "3", "-f8p", "fwd", "-fr", "block"));  // bf16 ignores the FP8 flags
    CHECK_LIVES("-z 3 fp8", ZERO_STAGE(2, "-z", "3", "-p", "fp8"));
    CHECK_LIVES("-z 3 fp8, a linear in bf16", ZERO_STAGE(2, "-z", "3", "-p", "fp8", "-f8", "qkv"));
    CHECK_DIES("-z 3 fp8, fc partly in FP8", "runs fc partly in each",
               ZERO_STAGE(2, "-z", "3", "-p", "fp8", "-f8", "qkv,fc", "-f8p", "fwd,dgrad,qkv.wgrad"));
    // lm_head is no block linear: its weight is never sharded
    CHECK_LIVES("-z 3 fp8, lm_head alone, partly", ZERO_STAGE(2, "-z", "3", "-p", "fp8", "-f8", "lm_head", "-f8p", "fwd",
                                                              "-fr", "block"));
    CHECK_DIES("-z 3 -fr block", "flag -z 3 with -fr block", ZERO_STAGE(3, "-z", "3", "-p", "fp8", "-fr", "block"));
    CHECK_DIES("-z 3 -fw delayed", "flag -z 3 needs -fw current", ZERO_STAGE(2, "-z", "3", "-p", "fp8", "-fw", "delayed"));
}

// -t against the model, the batch in tokens across the processes, and the micro-steps it takes
static void test_config_batch(void) {
    GPT2Config model = gpt2_config_make(1, 1, 8, 64, 128), long_model = gpt2_config_make(1, 1, 8, 1048576, 128);
    TrainConfig c = PARSE("-b", "2", "-t", "64", "-d", "768");
    CHECK(train_config_check_batch(&c, &model, 3) == 2, "-b 2 -t 64 -d 768, 3 processes: %d micro-steps, expected 2",
          train_config_check_batch(&c, &model, 3));
    c = PARSE("-b", "2", "-t", "32");
    CHECK(train_config_check_batch(&c, &model, 3) == 1 && c.total_batch_size == 192, "-d -1: %d tokens, expected 2*32*3",
          c.total_batch_size);
    CHECK_DIES("-t above the model's", "flag -t 65", { c = PARSE("-t", "65"); train_config_check_batch(&c, &model, 1); });
    CHECK_DIES("-d not a multiple", "flag -d 64: total batch must be a positive multiple of B*T*processes = 2*32*3",
               { c = PARSE("-b", "2", "-t", "32", "-d", "64"); train_config_check_batch(&c, &model, 3); });
    CHECK_DIES("2^31 tokens a micro-step", "2147483648 tokens per micro-step",
               { c = PARSE("-b", "1024", "-t", "1048576"); train_config_check_batch(&c, &long_model, 2); });
    CHECK_LIVES("2^30 tokens a micro-step", { c = PARSE("-b", "1024", "-t", "1048576"); train_config_check_batch(&c, &long_model, 1); });
}

// -y 1's note: an -e model file of another shape than the checkpoint is named with its shape; one of the same shape,
// or one that does not exist, gets no note
static void test_config_resumed_model_note(void) {
    GPT2Config file_shape = py_config(), tiny = gpt2_config_from_descriptor("tiny");
    TrainConfig c = train_config_defaults();
    c.model = in_dir(g_py_dir, "model_v3.bin");
    char text[1024], want[1024];
    STDOUT_OF(text, train_config_note_resumed_model(&c, &tiny, "ckpt.bin"));
    snprintf(want, sizeof(want), "note: -y 1 resumes ckpt.bin (L=2 NH=2 C=128); -e %s (L=2 NH=2 C=16) is not used\n", c.model);
    CHECK(strcmp(text, want) == 0, "-e a model file of another shape: [%s]", text);
    STDOUT_OF(text, train_config_note_resumed_model(&c, &file_shape, "ckpt.bin"));
    CHECK(text[0] == '\0', "-e a model file of the checkpoint's shape: [%s]", text);
    c.model = in_dir(g_dir, "no_such_model.bin");
    STDOUT_OF(text, train_config_note_resumed_model(&c, &tiny, "ckpt.bin"));
    CHECK(text[0] == '\0', "-e a model file that does not exist: [%s]", text);
}

// train_state.h: up to TRAIN_STATE_MAX_EXTRA_SECTIONS extra sections; the llm.c RNG state a state file carries
// (llm.c's starting 13371337 at step 0, in both of its slots, another at every step and rank)
static void test_train_state_write_fields(void) {
    StateSection extra[TRAIN_STATE_MAX_EXTRA_SECTIONS + 1], sections[TRAIN_STATE_MAX_EXTRA_SECTIONS + ADAMW8_NUM_SECTIONS];
    memset(extra, 0, sizeof(extra));
    CHECK(train_state_copy_extra_sections(sections, extra, TRAIN_STATE_MAX_EXTRA_SECTIONS, "test") ==
          TRAIN_STATE_MAX_EXTRA_SECTIONS, "the most extra sections not taken");
    CHECK_DIES("one extra section too many", "test: 9 extra sections, expected 0..8",
               train_state_copy_extra_sections(sections, extra, TRAIN_STATE_MAX_EXTRA_SECTIONS + 1, "test"));
    CHECK_DIES("-1 extra sections", "test: -1 extra sections", train_state_copy_extra_sections(sections, extra, -1, "test"));

    GPT2Config cfg = py_config();
    Adamw8Layout layout;
    adamw8_layout_init(&layout, &cfg, ADAMW8_SELECT_NONE);
    float* moments = (float*)mallocCheck(2 * layout.num_parameters * sizeof(float));
    memset(moments, 0, 2 * layout.num_parameters * sizeof(float));
    uint64_t seen[3][2];
    const int steps[3] = {0, 1, 0}, ranks[3] = {0, 0, 1};
    for (int k = 0; k < 3; k++) {
        DataLoader loader;
        py_loader_init(&loader, 0);
        loader.num_processes = 2;
        loader.process_rank = ranks[k];
        const char* path = in_dir(g_dir, "rng_state.bin");
        train_state_write(path, steps[k], 0, &loader, &layout, 0, moments, moments + layout.num_parameters, NULL, NULL, NULL, 0);
        size_t length;
        int32_t* raw = (int32_t*)read_all(path, &length);
        memcpy(seen[k], &raw[20], sizeof(seen[k]));
        free(raw);
        dataloader_free(&loader);
    }
    CHECK(seen[0][0] == 13371337ull && seen[0][1] == 13371337ull, "step 0 rank 0: rng state %llu, %llu",
          (unsigned long long)seen[0][0], (unsigned long long)seen[0][1]);
    CHECK(seen[1][0] != seen[0][0] && seen[1][1] == seen[1][0], "step 1: rng state %llu, %llu",
          (unsigned long long)seen[1][0], (unsigned long long)seen[1][1]);
    CHECK(seen[2][0] != seen[0][0] && seen[2][1] == seen[2][0], "rank 1: rng state %llu, %llu",
          (unsigned long long)seen[2][0], (unsigned long long)seen[2][1]);
    free(moments);
}

// every value train_state_check_values_ checks: NaN, Inf and (v, absmaxes) -1 at the last index refused, naming the
// file, the array and the index; -1 where it may be negative taken
static void test_train_state_values(void) {
    enum { N = 6, BLOCKS = 3, FP32 = 4 };
    float m[N], v[N], master[N], m_absmax[BLOCKS], v_absmax[BLOCKS], m32[FP32], v32[FP32];
    Adamw8Layout layout;
    memset(&layout, 0, sizeof(layout));
    layout.num_parameters = N;
    layout.num_blocks = BLOCKS;
    layout.num_fp32 = FP32;
    const struct { const char* what; float* array; int count; int fp32; int non_negative; } arrays[] = {
        {"AdamW m of parameter", m, N, 1, 0}, {"AdamW v of parameter", v, N, 1, 1},
        {"adamw8 m absmax of block", m_absmax, BLOCKS, 0, 1}, {"adamw8 v absmax of block", v_absmax, BLOCKS, 0, 1},
        {"adamw8 32-bit m of element", m32, FP32, 0, 0}, {"adamw8 32-bit v of element", v32, FP32, 0, 1},
        {"master weight of parameter", master, N, 0, 0}, {"master weight of parameter", master, N, 1, 0}};
    const float bad[3] = {NAN, INFINITY, -1.0f};
    for (int a = 0; a < (int)(sizeof(arrays) / sizeof(arrays[0])); a++) {
        for (int b = 0; b < 3; b++) {
            float* all[7] = {m, v, master, m_absmax, v_absmax, m32, v32};
            const int counts[7] = {N, N, N, BLOCKS, BLOCKS, FP32, FP32};
            for (int k = 0; k < 7; k++) { for (int i = 0; i < counts[k]; i++) { all[k][i] = 0.5f; } }
            arrays[a].array[arrays[a].count - 1] = bad[b];
            TrainStateFileForm form;
            memset(&form, 0, sizeof(form));
            form.fp32 = arrays[a].fp32;
            form.m = m;
            form.v = v;
            form.states.m_absmax = m_absmax;
            form.states.v_absmax = v_absmax;
            form.states.m32 = m32;
            form.states.v32 = v32;
            char what[128], fragment[192];
            snprintf(what, sizeof(what), "%s %g (%s file)", arrays[a].what, bad[b], form.fp32 ? "fp32" : "8-bit");
            snprintf(fragment, sizeof(fragment), "state file 'f': %s %d of this rank's window is %g", arrays[a].what,
                     arrays[a].count - 1, bad[b]);
            if (b == 2 && !arrays[a].non_negative) {
                CHECK_LIVES(what, train_state_check_values_(&form, &layout, master, "state file 'f'"));
            } else {
                CHECK_DIES(what, fragment, train_state_check_values_(&form, &layout, master, "state file 'f'"));
            }
        }
    }
}

// an adamw8 state file of cfg's model (step 3) with the 8-bit states of -qs `written`, read back under -qs `read`;
// with_master: fp32 master weights too, and a shuffled loader; widened >= 0: that tensor's width in the file's
// adamw8.bits section set to 32 first; cut_after_bits: the file truncated where its adamw8.bits section ends
static void adamw8_state_write_read(const GPT2Config* cfg, Adamw8Selection written, Adamw8Selection read, int with_master,
                                    int widened, int cut_after_bits) {
    Adamw8Layout layout, read_layout;
    adamw8_layout_init(&layout, cfg, written);
    adamw8_layout_init(&read_layout, cfg, read);
    size_t n = layout.num_parameters;
    Adamw8States states, into;
    adamw8_states_alloc_host(&states, &layout);
    adamw8_states_alloc_host(&into, &read_layout);
    float* arrays = (float*)mallocCheck(3 * n * sizeof(float));  // master, m, v
    memset(arrays, 0, 3 * n * sizeof(float));
    float* master = with_master ? arrays : NULL;
    DataLoader loader;
    py_loader_init(&loader, with_master);
    const char* path = in_dir(g_dir, "adamw8_state.bin");
    train_state_write(path, 3, 0, &loader, &layout, 1, NULL, NULL, &states, master, NULL, 0);
    if (widened >= 0 || cut_after_bits) {
        StateFileIndex index;
        state_file_index(path, n, &index);
        const StateSectionPlace* bits = state_file_find_section(&index, "adamw8.bits");
        CHECK(bits != NULL, "no adamw8.bits section in %s", path);
        if (bits != NULL && cut_after_bits) {
            CHECK(truncate(path, bits->offset + (long)bits->bytes) == 0, "cutting %s after its adamw8.bits section", path);
        } else if (bits != NULL) {
            int32_t width = 32;
            FILE* fp = fopenCheck(path, "r+b");
            fseekCheck(fp, bits->offset + widened * (long)sizeof(width), SEEK_SET);
            fwriteCheck(&width, sizeof(width), 1, fp);
            fcloseCheck(fp);
        }
    }
    train_state_read(path, 3, 1, &loader, cfg, 1, read, 0, n, arrays + n, arrays + 2 * n, &into, master, NULL, 0);
    dataloader_free(&loader);
    adamw8_states_free_host(&states);
    adamw8_states_free_host(&into);
    free(arrays);
}

// 8-bit states kept for another -qs's tensors are refused naming it, also past master weights and a shuffle state,
// also -qs none's, and also in a file cut right where its adamw8.bits section ends (the section is whole, so it is
// read); a width no -qs keeps is refused naming the tensor
static void test_train_state_selection(void) {
    GPT2Config small = py_config(), wide = gpt2_config_make(1, 1, 64, 8, 60);  // C = 64: -qs default keeps qkvw 8-bit
    CHECK_LIVES("-qs all read under -qs all", adamw8_state_write_read(&small, ADAMW8_SELECT_ALL, ADAMW8_SELECT_ALL, 1, -1, 0));
    CHECK_DIES("-qs all's states with master weights, read under -qs default", "tensors of -qs all, this run has -qs default",
               adamw8_state_write_read(&small, ADAMW8_SELECT_ALL, ADAMW8_SELECT_DEFAULT, 1, -1, 0));
    CHECK_DIES("-qs none's states read under -qs all", "tensors of -qs none, this run has -qs all",
               adamw8_state_write_read(&wide, ADAMW8_SELECT_NONE, ADAMW8_SELECT_ALL, 0, -1, 0));
    CHECK_DIES("-qs all's states cut after adamw8.bits, read under -qs default", "tensors of -qs all, this run has -qs default",
               adamw8_state_write_read(&small, ADAMW8_SELECT_ALL, ADAMW8_SELECT_DEFAULT, 0, -1, 1));
    CHECK_DIES("wte's states widened to 32 bits", "keeps 32-bit AdamW states for wte, this run keeps 8-bit",
               adamw8_state_write_read(&small, ADAMW8_SELECT_ALL, ADAMW8_SELECT_ALL, 0, PARAM_WTE, 0));
}

// fp8_recipe.h's names of the values a state file may hold (any number: one no flag gives is "invalid"), each name
// read back as its flag reads it, and -fw refusing -fg's third choice
static void test_fp8_recipe_value_names(void) {
    for (int recipe = -1; recipe <= 3; recipe++) {
        const char* name = fp8_model_recipe_name(recipe);
        if (recipe < 0 || recipe > FP8_MODEL_BLOCK) {
            CHECK(strcmp(name, "invalid") == 0, "recipe %d: name '%s', expected invalid", recipe, name);
        } else {
            CHECK(fp8_model_recipe_from_name(name) == recipe, "recipe %d: '%s' reads back as another", recipe, name);
        }
    }
    const char* const flags[2] = {"-fw", "-fg"};
    const int choices[2] = {FP8_WEIGHT_SCALING_CHOICES, FP8_GRAD_SCALING_CHOICES};
    for (int f = 0; f < 2; f++) {
        for (int choice = -1; choice <= choices[f]; choice++) {
            const char* name = fp8_scaling_choice_name(choice, choices[f]);
            if (choice < 0 || choice == choices[f]) {
                CHECK(strcmp(name, "invalid") == 0, "%s %d: name '%s', expected invalid", flags[f], choice, name);
            } else {
                CHECK(fp8_scaling_choice_from_name(flags[f], name, choices[f]) == choice, "%s %d: '%s' reads back as "
                      "another", flags[f], choice, name);
            }
        }
    }
    CHECK_DIES("-fw pow2", "flag -fw: 'pow2' is not one of current, delayed\n",  // the whole list: pow2 is -fg's alone
               fp8_scaling_choice_from_name("-fw", "pow2", FP8_WEIGHT_SCALING_CHOICES));
    CHECK_DIES("-fg lazy", "flag -fg: 'lazy' is not one of current, delayed, pow2",
               fp8_scaling_choice_from_name("-fg", "lazy", FP8_GRAD_SCALING_CHOICES));
}

// the startup line's and the state file errors' text of the lists: every FP8 linear's passes, lm_head's too, "none"
// when none is; a list cut to its buffer writes nothing past it
static void test_fp8_recipe_list_text(void) {
    const int passes[NUM_LINEAR_KINDS] = {FP8_ALL_PASSES, 0, FP8_FWD | FP8_WGRAD, 0, FP8_DGRAD};
    char text[256];
    fp8_passes_text(text, sizeof(text), passes);
    CHECK(strcmp(text, "qkv=fwd,dgrad,wgrad fc=fwd,wgrad lm_head=dgrad") == 0, "passes text '%s'", text);
    const int none[NUM_LINEAR_KINDS] = {0, 0, 0, 0, 0};
    fp8_passes_text(text, sizeof(text), none);
    CHECK(strcmp(text, "none") == 0, "no FP8 linear: passes text '%s'", text);
    for (size_t n = 1; n <= 8; n++) {
        memset(text, '#', sizeof(text));
        fp8_names_from_bits(text, n, (1 << NUM_LINEAR_KINDS) - 1, LINEAR_KIND_NAMES, NUM_LINEAR_KINDS);
        CHECK(strncmp(text, "qkv,attproj", n - 1) == 0 && text[n - 1] == '\0' && text[n] == '#',
              "names cut to %zu bytes: '%.*s', or written past them", n, (int)n, text);
    }
}

// -f8p refusals the lists' own tests leave: an item repeated after another item, and a word only starting as all
static void test_fp8_recipe_pass_list_edges(void) {
    CHECK_DIES("-f8p dgrad repeated after fwd", "flag -f8p: 'dgrad' is listed twice", PARSE("-p", "fp8", "-f8p", "fwd,dgrad,dgrad"));
    CHECK_DIES("-f8p fc.fwd repeated after wgrad", "flag -f8p: 'fc.fwd' is listed twice",
               PARSE("-p", "fp8", "-f8p", "dgrad,fc.fwd,wgrad,fc.fwd"));
    CHECK_DIES("-f8p allx", "flag -f8p: 'allx' in 'allx' is not a pass", PARSE("-p", "fp8", "-f8p", "allx"));
}

// the refusals name the bad part of an item followed by others, and the lists to choose from
static void test_fp8_recipe_list_errors_name_the_lists(void) {
    CHECK_DIES("-f8p fc.bogus before fwd", "flag -f8p: 'fc.bogus' in 'fc.bogus,fwd': 'bogus' is not a pass (one of fwd,dgrad,wgrad)",
               PARSE("-p", "fp8", "-f8p", "fc.bogus,fwd"));
    CHECK_DIES("-f8p qkv.fwd with -f8 fc", "is for qkv, which -f8 does not list (-f8 fc):",
               PARSE("-p", "fp8", "-f8", "fc", "-f8p", "qkv.fwd"));
    CHECK_DIES("-f8 mlp", "flag -f8: 'mlp' in 'mlp' is not one of qkv,attproj,fc,fcproj,lm_head (a comma list, or all)",
               PARSE("-p", "fp8", "-f8", "mlp"));
    CHECK_DIES("-f8 qkv,,fc", "flag -f8: '' in 'qkv,,fc'", PARSE("-p", "fp8", "-f8", "qkv,,fc"));
}

// -fw delayed where lm_head alone runs some GEMMs in bf16: its weight is cast after the update in any case, so the
// optimizer pass still casts the FP8 block linears' (qkv's here; attproj's runs in bf16) and the flags pass
static void test_fp8_recipe_partial_lm_head(void) {
    const char* const args[] = {"-p", "fp8", "-fw", "delayed", "-f8", "qkv,lm_head", "-f8p",
                                "qkv.fwd,qkv.dgrad,qkv.wgrad,lm_head.fwd", NULL};
    CHECK_LIVES("-fw delayed, lm_head's backward in bf16", parse_config(args));
    const int passes[NUM_LINEAR_KINDS] = {FP8_ALL_PASSES, 0, 0, 0, FP8_FWD};
    for (int kind = 0; kind < NUM_LINEAR_KINDS; kind++) {
        CHECK(fp8_weight_cast_in_update(passes, kind) == (kind == LINEAR_QKV), "%s's weight cast in the update: %d",
              LINEAR_KIND_NAMES[kind], fp8_weight_cast_in_update(passes, kind));
    }
}

// the levels of -r from which the backward recomputes each linear's input (train_gpt2_fp8.cu, fp8_model.cuh): GELU's
// output (fcproj's) from 1, the layernorms' (qkv's, fc's) and attproj's from 2, lm_head's at no level -r takes
static void test_fp8_recipe_recompute_levels(void) {
    const FlagSpec* r = NULL;
    for (int k = 0; k < NUM_TRAIN_FLAGS; k++) {
        if (strcmp(TRAIN_FLAGS[k].name, "-r") == 0) { r = &TRAIN_FLAGS[k]; }
    }
    CHECK(r != NULL, "no -r flag");
    if (r == NULL) { return; }
    for (int level = (int)r->lo; level <= (int)r->hi; level++) {
        for (int kind = 0; kind < NUM_LINEAR_KINDS; kind++) {
            int expected = kind == LINEAR_LM_HEAD ? 0 : level >= (kind == LINEAR_FCPROJ ? 1 : 2);
            CHECK((level >= linear_input_recompute_level(kind)) == expected, "-r %d: %s's input recomputed %d, expected %d",
                  level, LINEAR_KIND_NAMES[kind], !expected, expected);
        }
    }
}

// the scaling state recipes fp8_model.cuh gives each -fr's activations and each -fg's output gradients: lm_head's
// under every -fg the current formula (updated with the bound fp8_dlogits_amax_bound before each use)
static void test_fp8_recipe_state_recipes(void) {
    const Fp8Recipe activations[3] = {FP8_RECIPE_DELAYED, FP8_RECIPE_CURRENT, FP8_RECIPE_CURRENT};  // delayed, current, block
    for (int recipe = 0; recipe < 3; recipe++) {
        TrainConfig c = PARSE("-p", "fp8", "-fr", FP8_MODEL_RECIPE_NAMES[recipe]);
        Fp8Settings s = train_config_fp8_settings(&c);
        CHECK(fp8_activation_recipe(&s) == activations[recipe], "-fr %s: activations' recipe %d, expected %d",
              FP8_MODEL_RECIPE_NAMES[recipe], (int)fp8_activation_recipe(&s), (int)activations[recipe]);
    }
    const Fp8Recipe gradients[FP8_GRAD_SCALING_CHOICES] = {FP8_RECIPE_CURRENT, FP8_RECIPE_DELAYED, FP8_RECIPE_CURRENT_POW2};
    for (int choice = 0; choice < FP8_GRAD_SCALING_CHOICES; choice++) {
        TrainConfig c = PARSE("-p", "fp8", "-fg", FP8_SCALING_CHOICE_NAMES[choice]);
        Fp8Settings s = train_config_fp8_settings(&c);
        for (int kind = 0; kind < NUM_LINEAR_KINDS; kind++) {
            Fp8Recipe expected = kind == LINEAR_LM_HEAD ? FP8_RECIPE_CURRENT : gradients[choice];
            CHECK(fp8_gradient_recipe(s.grad_scaling, kind) == expected, "-fg %s: %s's dy recipe %d, expected %d",
                  FP8_SCALING_CHOICE_NAMES[choice], LINEAR_KIND_NAMES[kind], (int)fp8_gradient_recipe(s.grad_scaling, kind),
                  (int)expected);
        }
    }
}

// lm_head's output gradient (softmax - onehot(target)) * dloss lies within fp8_dlogits_amax_bound(dloss), and comes
// within 1% of it where the target's probability is near 0: a bound no looser than it must be
static void test_fp8_recipe_dlogits_bound(void) {
    const float logits[8] = {0.5f, 1.0f, -2.0f, 3.0f, 0.0f, 2.5f, -1.0f, -30.0f};
    const float dloss = 0.25f;
    float bound = fp8_dlogits_amax_bound(dloss);
    for (int target = 3; target <= 7; target += 4) {  // the likeliest token, then one of probability ~1e-15
        float max = 0.0f, sum = 0.0f, amax = 0.0f;
        for (int i = 0; i < 8; i++) { max = fmaxf(max, logits[i]); }
        for (int i = 0; i < 8; i++) { sum += expf(logits[i] - max); }
        for (int i = 0; i < 8; i++) { amax = fmaxf(amax, fabsf((expf(logits[i] - max) / sum - (i == target)) * dloss)); }
        CHECK(amax <= bound && (target != 7 || amax > 0.99f * bound), "target %d, dloss %g: |dlogit| up to %g, bound %g",
              target, dloss, amax, bound);
    }
}

// ---- checkpoint boundaries the tests above do not reach (found by boundary-mutation testing) ----

// -y 1 in a dir with no checkpoint file at all (a first run's -o) starts from scratch. Catches the newest
// incomplete step read from an empty list
static void test_resume_in_an_empty_dir(void) {
    char dir[256], text[1024];
    test_make_temp_dir(dir, sizeof(dir));
    int step = 0;
    STDOUT_OF(text, step = checkpoint_resume_step(dir));
    CHECK(step == -1 && strstr(text, "no complete checkpoint in") && strstr(text, "starting from scratch") &&
          !strstr(text, "DONE_"), "-y 1 in an empty dir: step %d, [%s]", step, text);
    test_remove_dir(dir);
}

// a path whose .tmp name is exactly CHECKPOINT_PATH_MAX long (no room for its NUL) is refused before any
// file is opened. Catches the bound off by one (a truncated .tm name, which no cleanup would find)
static void test_tmp_path_length_bound(void) {
    char path[CHECKPOINT_PATH_MAX];
    memset(path, 'a', sizeof(path));
    path[0] = '/';
    path[CHECKPOINT_PATH_MAX - 4] = '\0';  // 4092 characters, and ".tmp": 4096
    GPT2Config cfg = gpt2_config_make(1, 1, 4, 4, 8);
    float* params = (float*)mallocCheck(gpt2_num_parameters(&cfg) * sizeof(float));
    memset(params, 0, gpt2_num_parameters(&cfg) * sizeof(float));
    CHECK_DIES("checkpoint: .tmp path one byte too long", "is too long", model_file_write(path, &cfg, params, 3));
    free(params);
}

// a state file at shard index == the shard count is refused by the state reader itself, whose message says
// the glob matches fewer shards. Catches its bound off by one (left to dataloader_resume's, which a file of
// another B or T never reaches)
static void test_state_shard_index_bound(void) {
    size_t n = PY_STATE_NUM_PARAMS;
    float m[PY_STATE_NUM_PARAMS], v[PY_STATE_NUM_PARAMS], master[PY_STATE_NUM_PARAMS];
    StateBuffers buffers = {n, m, v, master, NULL, 0};
    DataLoader loader;
    py_loader_init(&loader, 0);
    TrainState state;
    const char* good = in_dir(g_py_dir, "state_v1.bin");
    const char* position = write_variant(good, "state_shard_count.bin", file_length(good), 30, 2);  // 2 shards
    CHECK_DIES("state: shard index == shard count", "is at shard 2, but only 2 shards match",
               state_file_read(position, &state, &buffers, &loader));
    dataloader_free(&loader);
}

// -nk in a dir with no complete checkpoint (none yet, or a dir not there) removes nothing and lives.
// Catches the newest complete step read from an empty list
static void test_keep_newest_without_a_complete_checkpoint(void) {
    char dir[256];
    test_make_temp_dir(dir, sizeof(dir));
    touch(in_dir(dir, "model_00000005.bin"));  // an incomplete step: newer than no complete one, so kept
    CHECK_LIVES("-nk 1 with no complete checkpoint", checkpoint_keep_newest(dir, 1, 0));
    CHECK_LIVES("-nk 1 with no dir", checkpoint_keep_newest(in_dir(dir, "missing_subdir"), 1, 0));
    CHECK(file_exists(in_dir(dir, "model_00000005.bin")), "-nk 1 removed the only (incomplete) step");
    test_remove_dir(dir);
}

// a section tag takes at most 15 characters (16 bytes with its NUL): 15 round-trip, 16 are refused at write.
// Catches the bound off by one (a 16-character tag written without its NUL, read back as another tag)
static void test_section_tag_length(void) {
    size_t n = 4;
    float m[4] = {1, 2, 3, 4}, v[4] = {5, 6, 7, 8};
    uint8_t extra[8] = {1, 2, 3, 4, 5, 6, 7, 8}, back[8] = {0};
    DataLoader loader;
    py_loader_init(&loader, 0);
    TrainState state = {3, 1, 2, 0, 0}, got;
    StateSection longest = {"abcdefghijklmno", extra, sizeof(extra), 0};
    StateSection longest_back = {"abcdefghijklmno", back, sizeof(back), 0};
    StateBuffers buffers = {n, m, v, NULL, &longest, 1}, into = {n, m, v, NULL, &longest_back, 1};
    state_file_write(in_dir(g_dir, "state_tag15.bin"), &state, &buffers, &loader);
    state_file_read(in_dir(g_dir, "state_tag15.bin"), &got, &into, &loader);
    CHECK(memcmp(back, extra, sizeof(extra)) == 0, "a section of a 15-character tag does not round-trip");
    StateSection too_long = {"abcdefghijklmnop", extra, sizeof(extra), 0};
    StateBuffers too_long_buffers = {n, m, v, NULL, &too_long, 1};
    CHECK_DIES("state: a 16-character section tag", "must be 1..15 characters",
               state_file_write(in_dir(g_dir, "state_tag16.bin"), &state, &too_long_buffers, &loader));
    dataloader_free(&loader);
}

// a run may keep STATE_FILE_MAX_SECTIONS sections: a file of that many round-trips. Catches the run's bound
// off by one
static void test_most_sections(void) {
    size_t n = 4;
    float m[4] = {1, 2, 3, 4}, v[4] = {5, 6, 7, 8};
    uint8_t values[STATE_FILE_MAX_SECTIONS], back[STATE_FILE_MAX_SECTIONS];
    char tags[STATE_FILE_MAX_SECTIONS][STATE_SECTION_TAG_BYTES];
    StateSection written[STATE_FILE_MAX_SECTIONS], read[STATE_FILE_MAX_SECTIONS];
    for (int i = 0; i < STATE_FILE_MAX_SECTIONS; i++) {
        snprintf(tags[i], sizeof(tags[i]), "s%d", i);
        values[i] = (uint8_t)(i + 1);
        back[i] = 0;
        written[i] = (StateSection){tags[i], &values[i], 1, 0};
        read[i] = (StateSection){tags[i], &back[i], 1, 0};
    }
    DataLoader loader;
    py_loader_init(&loader, 0);
    TrainState state = {3, 1, 2, 0, 0}, got;
    StateBuffers writer = {n, m, v, NULL, written, STATE_FILE_MAX_SECTIONS};
    StateBuffers reader = {n, m, v, NULL, read, STATE_FILE_MAX_SECTIONS};
    state_file_write(in_dir(g_dir, "state_max_sections.bin"), &state, &writer, &loader);
    state_file_read(in_dir(g_dir, "state_max_sections.bin"), &got, &reader, &loader);
    CHECK(memcmp(back, values, sizeof(values)) == 0, "a state of %d sections does not round-trip", STATE_FILE_MAX_SECTIONS);
    dataloader_free(&loader);
}

// a section mismatch names the flag its tag belongs to, for each kind of mismatch. Catches a hint's tag test
// or mismatch test inverted (test_sim_trainer.py sees two of them, through the trainer)
static void test_section_mismatch_hints(void) {
    size_t n = 4;
    float m[4] = {1, 2, 3, 4}, v[4] = {5, 6, 7, 8};
    uint8_t a[8] = {0}, b[8] = {0}, c[8] = {0};
    DataLoader loader;
    py_loader_init(&loader, 0);
    TrainState state = {3, 1, 2, 0, 0}, got;
    StateSection written[2] = {{"fp8_amax", a, 8, 0}, {"adamw8_m", b, 8, 0}};
    StateBuffers writer = {n, m, v, NULL, written, 2};
    const char* path = in_dir(g_dir, "state_hints.bin");
    state_file_write(path, &state, &writer, &loader);
    struct { const char* what; StateSection run[3]; int count; const char* hint; } cases[] = {
        {"fp8 section only in the file", {{"adamw8_m", b, 8, 0}}, 1, "written by a -p fp8 run?"},
        {"fp8 section only in the run", {{"fp8_amax", a, 8, 0}, {"adamw8_m", b, 8, 0}, {"fp8_other", c, 8, 0}}, 3,
         "written by a -p bf16 run?"},
        {"fp8 section of another size", {{"fp8_amax", a, 4, 0}, {"adamw8_m", b, 8, 0}}, 2, "other FP8 linears or passes?"},
        {"adamw8 section of another size", {{"fp8_amax", a, 8, 0}, {"adamw8_m", b, 4, 0}}, 2, "other -opt or -qs?"},
        {"outlier windows only in the run", {{"fp8_amax", a, 8, 0}, {"adamw8_m", b, 8, 0}, {"outlier_windows", c, 8, 0}},
         3, "written with -sl or -sg?"},
        {"another section only in the run", {{"fp8_amax", a, 8, 0}, {"adamw8_m", b, 8, 0}, {"opt_other", c, 8, 0}}, 3,
         "different precision or optimizer flags?"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        StateBuffers run = {n, m, v, NULL, cases[i].run, cases[i].count};
        CHECK_DIES(cases[i].what, cases[i].hint, state_file_read(path, &got, &run, &loader));
    }
    dataloader_free(&loader);
}

static void test_checkpoint_boundaries(void) {
    test_resume_in_an_empty_dir();
    test_tmp_path_length_bound();
    test_state_shard_index_bound();
    test_keep_newest_without_a_complete_checkpoint();
    test_section_tag_length();
    test_most_sections();
    test_section_mismatch_hints();
}

int main(void) {
    test_make_temp_dir(g_dir, sizeof(g_dir));
    if (!test_make_llmc_files(g_dir, g_py_dir, sizeof(g_py_dir))) { return test_summary("test_formats"); }

    test_model_files_from_llmc();
    test_model_round_trip();
    test_model_descriptors();
    test_model_bad_inputs();
    test_state_from_llmc();
    test_state_round_trip();
    test_state_sections();
    test_state_bad_inputs();
    test_tokenizer();
    test_tokenizer_lookup();
    test_version_1_tokenizer();
    test_safe_printf();
    test_checkpoint_paths_and_latest();
    test_checkpoint_keep_newest();
    test_checkpoint_claim_dir();
    test_file_errors_name_the_file();
    test_logger();
    test_checkpoint_edges();
    test_checkpoint_boundaries();
    test_tokenizer_edges();
    test_logger_lines_and_resume();
    test_file_helper_edges();
    test_flag_parsers();
    test_model_config_edges();
    test_error_line_is_one_write();
    test_config_flag_values();
    test_config_parse_errors();
    test_config_usage();
    test_config_fp8_settings();
    test_config_zero_stage();
    test_config_batch();
    test_config_resumed_model_note();
    test_train_state_write_fields();
    test_train_state_values();
    test_train_state_selection();
    test_fp8_recipe_value_names();
    test_fp8_recipe_list_text();
    test_fp8_recipe_pass_list_edges();
    test_fp8_recipe_list_errors_name_the_lists();
    test_fp8_recipe_partial_lm_head();
    test_fp8_recipe_recompute_levels();
    test_fp8_recipe_state_recipes();
    test_fp8_recipe_dlogits_bound();

    test_remove_dir(g_py_dir);
    test_remove_dir(g_dir);
    CHECK(llm8_open_file_count() == 0, "%d files opened by fopenCheck are not closed by fcloseCheck", llm8_open_file_count());
    return test_summary("test_formats");
}
