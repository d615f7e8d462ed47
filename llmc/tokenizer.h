/*
tokenizer.h: decode GPT-2 token ids to bytes, for printing samples during training.

Why it is shaped this way:
- Only decoding is needed in C (encoding happens once, in Python, when shards are made), so
  the file is llm.c's flat decode table: header of 256 int32 ([0] 20240328, [1] version 2,
  [2] vocab size, [3] end-of-text token), then per token a uint8 length and its bytes.
  llm.c's older version 1 has no [3]: as llm.c does, its vocab must be GPT-2's 50257 and
  the end-of-text token is 50256.
- Decoding is optional: a missing file prints one warning line and leaves init_ok = 0, and
  the trainer's samples print token ids instead of text. A file that exists but is wrong
  (magic, version, truncated, trailing bytes) is an error.
- The whole file is read once and the pieces are kept NUL-terminated in one block, so
  tokenizer_decode is a lookup.
*/
#ifndef LLMC_TOKENIZER_H
#define LLMC_TOKENIZER_H

#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <ctype.h>
#include "utils.h"

#define TOKENIZER_MAGIC 20240328
#define TOKENIZER_VERSION 2
#define TOKENIZER_V1_VOCAB 50257  // version 1 files: GPT-2's vocab, whose end-of-text token is the last
#define TOKENIZER_HEADER_INTS 256

typedef struct {
    uint32_t vocab_size;
    uint32_t eot_token;
    char** token_table;   // vocab_size NUL-terminated pieces, pointing into `pieces`
    char* pieces;
    int init_ok;
} Tokenizer;

static inline void tokenizer_init(Tokenizer* tokenizer, const char* path) {
    memset(tokenizer, 0, sizeof(*tokenizer));
    if (path[0] == '\0') {
        printf("note: no tokenizer file (-tk, or gpt2_tokenizer.bin beside the -i shards or in the current folder, as "
               "dev/data/ and llm.c write it): samples print token ids\n");
        return;
    }
    if (!file_exists(path)) {
        printf("warning: tokenizer file '%s' not found; samples will print token ids only "
               "(make it with dev/data/ or pass its path)\n", path);
        return;
    }
    FILE* fp = fopenCheck(path, "rb");
    long file_bytes = file_size_bytes(fp);
    long header_bytes = (long)(TOKENIZER_HEADER_INTS * sizeof(int32_t));
    if (file_bytes < header_bytes) {
        llm8_die("tokenizer file '%s' is %ld bytes, shorter than its %ld-byte header", path, file_bytes, header_bytes);
    }
    unsigned char* bytes = (unsigned char*)mallocCheck((size_t)file_bytes);
    freadCheck(bytes, 1, (size_t)file_bytes, fp);
    fcloseCheck(fp);
    int32_t header[TOKENIZER_HEADER_INTS];
    memcpy(header, bytes, sizeof(header));
    if (header[0] != TOKENIZER_MAGIC) {
        llm8_die("tokenizer file '%s' has magic %d, expected %d (not an llm.c tokenizer file)", path, header[0], TOKENIZER_MAGIC);
    }
    if (header[1] == 1) {
        if (header[2] != TOKENIZER_V1_VOCAB) {
            llm8_die("tokenizer file '%s' has version 1 and vocab size %d; a version-1 file (no end-of-text id) must be "
                     "GPT-2's, %d tokens", path, header[2], TOKENIZER_V1_VOCAB);
        }
        header[3] = TOKENIZER_V1_VOCAB - 1;
    } else if (header[1] != TOKENIZER_VERSION) {
        llm8_die("tokenizer file '%s' has version %d, expected %d (or llm.c's 1)", path, header[1], TOKENIZER_VERSION);
    }
    if (header[2] <= 0 || header[3] < 0 || header[3] >= header[2]) {
        llm8_die("tokenizer file '%s': vocab size %d / end-of-text token %d are invalid", path, header[2], header[3]);
    }
    tokenizer->vocab_size = (uint32_t)header[2];
    tokenizer->eot_token = (uint32_t)header[3];

    // walk the table once to check it, then lay the pieces out NUL-terminated
    size_t body_bytes = (size_t)(file_bytes - header_bytes);
    const unsigned char* body = bytes + header_bytes;
    size_t pos = 0;
    for (uint32_t i = 0; i < tokenizer->vocab_size; i++) {
        if (pos >= body_bytes || body[pos] == 0 || pos + 1 + body[pos] > body_bytes) {
            llm8_die("tokenizer file '%s': token %u is missing, empty or truncated (file too short for %u tokens)",
                     path, i, tokenizer->vocab_size);
        }
        pos += 1 + body[pos];
    }
    if (pos != body_bytes) {
        llm8_die("tokenizer file '%s': %zu unexpected bytes after its %u tokens", path, body_bytes - pos, tokenizer->vocab_size);
    }
    // each length byte becomes the NUL of the previous piece: same total size plus one
    tokenizer->pieces = (char*)mallocCheck(body_bytes + 1);
    tokenizer->token_table = (char**)mallocCheck(tokenizer->vocab_size * sizeof(char*));
    size_t in = 0, out = 0;
    for (uint32_t i = 0; i < tokenizer->vocab_size; i++) {
        size_t length = body[in];
        tokenizer->token_table[i] = tokenizer->pieces + out;
        memcpy(tokenizer->pieces + out, body + in + 1, length);
        tokenizer->pieces[out + length] = '\0';
        in += 1 + length;
        out += length + 1;
    }
    free(bytes);
    tokenizer->init_ok = 1;
}

// the bytes of `token`, or NULL when no tokenizer is loaded or the id is out of range
static inline const char* tokenizer_decode(const Tokenizer* tokenizer, uint32_t token) {
    if (!tokenizer->init_ok || token >= tokenizer->vocab_size) { return NULL; }
    return tokenizer->token_table[token];
}

// prints a decoded piece, skipping NULL and single raw bytes that are not printable text
// (GPT-2 pieces can be partial UTF-8 sequences or control bytes)
static inline void safe_printf(const char* piece) {
    if (piece == NULL || piece[0] == '\0') { return; }
    if (piece[1] == '\0') {
        unsigned char byte = (unsigned char)piece[0];
        if (!(isprint(byte) || isspace(byte))) { return; }
    }
    printf("%s", piece);
}

static inline void tokenizer_free(Tokenizer* tokenizer) {
    free(tokenizer->token_table);
    free(tokenizer->pieces);
    memset(tokenizer, 0, sizeof(*tokenizer));
}

#endif // LLMC_TOKENIZER_H
