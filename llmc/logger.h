/*
logger.h: the training log, written by rank 0 into the run's log dir.

Why it is shaped this way:
- main.log keeps llm.c's line format exactly ("s:%d trl:%.4f lr:%.6f norm:%.2f",
  "s:%d tel:%.4f", "s:%d eval:%.4f"), so llm.c's notebooks and plotting read our runs.
- main.jsonl beside it carries one JSON object per event with what llm.c's format has no
  room for (step time, throughput, MFU, skipped steps). Non-finite numbers are written as
  null, since JSON has no NaN: a skipped step's NaN loss stays machine-readable.
- Files stay open and each line is flushed, so a killed run loses nothing already logged.
  A fresh run truncates both files; a resumed run appends (after ending a line a kill or a
  full disk cut short). A line that cannot be written ends the run with an error naming the
  file: a log with lines missing is not a record of the run.
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
    path_in_dir(path, sizeof(path), log_dir, "main.log");
    logger->log_file = open_line_log(path, resume);
    path_in_dir(path, sizeof(path), log_dir, "main.jsonl");
    logger->jsonl_file = open_line_log(path, resume);
}

// a JSON number, or null for NaN and infinities (JSON has no NaN); also the numerics log's
static inline void json_number(FILE* fp, const char* key, double value) {
    if (isfinite(value)) { fprintf(fp, ",\"%s\":%.9g", key, value); }
    else { fprintf(fp, ",\"%s\":null", key); }
}

// a line that cannot be written ends the run: a log missing its lines is not a record of the run
static inline void logger_flush_(Logger* logger) {
    fflushCheck(logger->log_file);
    fflushCheck(logger->jsonl_file);
}

static inline void logger_log_train(Logger* logger, int step, float loss, float lr, float grad_norm,
                                    float ms, float tok_per_s, float mfu, int skipped) {
    if (logger->log_file == NULL) { return; }
    fprintf(logger->log_file, "s:%d trl:%.4f lr:%.6f norm:%.2f\n", step, loss, lr, grad_norm);
    fprintf(logger->jsonl_file, "{\"step\":%d,\"type\":\"train\"", step);
    json_number(logger->jsonl_file, "loss", loss);
    json_number(logger->jsonl_file, "lr", lr);
    json_number(logger->jsonl_file, "norm", grad_norm);
    json_number(logger->jsonl_file, "ms", ms);
    json_number(logger->jsonl_file, "tok_per_s", tok_per_s);
    json_number(logger->jsonl_file, "mfu", mfu);
    fprintf(logger->jsonl_file, ",\"skipped\":%d}\n", skipped ? 1 : 0);
    logger_flush_(logger);
}

static inline void logger_log_val(Logger* logger, int step, float val_loss) {
    if (logger->log_file == NULL) { return; }
    fprintf(logger->log_file, "s:%d tel:%.4f\n", step, val_loss);
    fprintf(logger->jsonl_file, "{\"step\":%d,\"type\":\"val\"", step);
    json_number(logger->jsonl_file, "loss", val_loss);
    fprintf(logger->jsonl_file, "}\n");
    logger_flush_(logger);
}

static inline void logger_log_eval(Logger* logger, int step, float acc) {
    if (logger->log_file == NULL) { return; }
    fprintf(logger->log_file, "s:%d eval:%.4f\n", step, acc);
    fprintf(logger->jsonl_file, "{\"step\":%d,\"type\":\"eval\"", step);
    json_number(logger->jsonl_file, "hellaswag_acc", acc);
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
