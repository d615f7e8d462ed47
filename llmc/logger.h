/*
logger.h: the training log, written by rank 0 into the run's log dir.

Why it is shaped this way:
- main.log keeps llm.c's line format exactly ("s:%d trl:%.4f lr:%.6f norm:%.2f",
  "s:%d tel:%.4f", "s:%d eval:%.4f"), so llm.c's notebooks and plotting read our runs.
- main.jsonl beside it carries one JSON object per event with what llm.c's format has no
  room for (step time, throughput, MFU, skipped steps). Non-finite numbers are written as
  null, since JSON has no NaN: a skipped step's NaN loss stays machine-readable.
- Files stay open and each line is flushed, so a killed run loses nothing already logged.
  A fresh run truncates both files; a resumed run appends.
*/
#ifndef LLMC_LOGGER_H
#define LLMC_LOGGER_H

#include <stdio.h>
#include <math.h>
#include "utils.h"

typedef struct {
    FILE* log_file;    // main.log, NULL when not logging
    FILE* jsonl_file;  // main.jsonl
} Logger;

// log_dir NULL: no logging. Only process_rank 0 writes. resume: append instead of truncate.
static inline void logger_init(Logger* logger, const char* log_dir, int process_rank, int resume) {
    logger->log_file = NULL;
    logger->jsonl_file = NULL;
    if (log_dir == NULL || process_rank != 0) { return; }
    ensure_writable_dir(log_dir);
    char path[4096];
    const char* mode = resume ? "a" : "w";
    snprintf(path, sizeof(path), "%s/main.log", log_dir);
    logger->log_file = fopenCheck(path, mode);
    snprintf(path, sizeof(path), "%s/main.jsonl", log_dir);
    logger->jsonl_file = fopenCheck(path, mode);
}

// a JSON number, or null for NaN and infinities
static inline void logger_json_number_(FILE* fp, const char* key, double value) {
    if (isfinite(value)) { fprintf(fp, ",\"%s\":%.9g", key, value); }
    else { fprintf(fp, ",\"%s\":null", key); }
}

static inline void logger_flush_(Logger* logger) {
    fflush(logger->log_file);
    fflush(logger->jsonl_file);
}

static inline void logger_log_train(Logger* logger, int step, float loss, float lr, float grad_norm,
                                    float ms, float tok_per_s, float mfu, int skipped) {
    if (logger->log_file == NULL) { return; }
    fprintf(logger->log_file, "s:%d trl:%.4f lr:%.6f norm:%.2f\n", step, loss, lr, grad_norm);
    fprintf(logger->jsonl_file, "{\"step\":%d,\"type\":\"train\"", step);
    logger_json_number_(logger->jsonl_file, "loss", loss);
    logger_json_number_(logger->jsonl_file, "lr", lr);
    logger_json_number_(logger->jsonl_file, "norm", grad_norm);
    logger_json_number_(logger->jsonl_file, "ms", ms);
    logger_json_number_(logger->jsonl_file, "tok_per_s", tok_per_s);
    logger_json_number_(logger->jsonl_file, "mfu", mfu);
    fprintf(logger->jsonl_file, ",\"skipped\":%d}\n", skipped ? 1 : 0);
    logger_flush_(logger);
}

static inline void logger_log_val(Logger* logger, int step, float val_loss) {
    if (logger->log_file == NULL) { return; }
    fprintf(logger->log_file, "s:%d tel:%.4f\n", step, val_loss);
    fprintf(logger->jsonl_file, "{\"step\":%d,\"type\":\"val\"", step);
    logger_json_number_(logger->jsonl_file, "loss", val_loss);
    fprintf(logger->jsonl_file, "}\n");
    logger_flush_(logger);
}

static inline void logger_log_eval(Logger* logger, int step, float acc) {
    if (logger->log_file == NULL) { return; }
    fprintf(logger->log_file, "s:%d eval:%.4f\n", step, acc);
    fprintf(logger->jsonl_file, "{\"step\":%d,\"type\":\"eval\"", step);
    logger_json_number_(logger->jsonl_file, "hellaswag_acc", acc);
    fprintf(logger->jsonl_file, "}\n");
    logger_flush_(logger);
}

static inline void logger_free(Logger* logger) {
    if (logger->log_file != NULL) { fcloseCheck(logger->log_file); }
    if (logger->jsonl_file != NULL) { fcloseCheck(logger->jsonl_file); }
    logger->log_file = NULL;
    logger->jsonl_file = NULL;
}

#endif // LLMC_LOGGER_H
