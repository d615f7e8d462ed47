/*
utils.h: fail-fast host helpers shared by the GPU trainer, the CPU reference and the tests.

Why: every bad input must end in ONE clear line naming the file, flag or value and what
was expected, then a non-zero exit (DESIGN.md section 8). Routing every file operation and
allocation through these helpers makes that the default instead of something each caller
has to remember. Plain C that also compiles as C++ (nvcc, g++), host only.
*/
#ifndef LLMC_UTILS_H
#define LLMC_UTILS_H

#include <stdio.h>
#include <stdlib.h>
#include <stdarg.h>
#include <string.h>
#include <errno.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

// print "error: <message>" as one line to stderr (llm8_die, and a death that must say why before
// a call that may block: multi_gpu.h's abort). The line goes out in one write: ranks that die
// together share mpirun's (or a terminal's) stderr, and stderr is unbuffered, so three writes a
// line (prefix, message, newline) came out interleaved as "error: error: ..."
static inline void llm8_print_error_v(const char* fmt, va_list args) {
    char line[8192];
    int prefix = snprintf(line, sizeof(line), "error: ");
    vsnprintf(line + prefix, sizeof(line) - prefix - 1, fmt, args);  // one byte kept for the newline
    size_t length = strlen(line);
    line[length] = '\n';
    fflush(stdout);
    fwrite(line, 1, length + 1, stderr);
}

__attribute__((format(printf, 1, 2))) static inline void llm8_print_error(const char* fmt, ...) {
    va_list args;
    va_start(args, fmt);
    llm8_print_error_v(fmt, args);
    va_end(args);
}

// the error line, then exit(1)
__attribute__((noreturn, format(printf, 1, 2))) static inline void llm8_die(const char* fmt, ...) {
    va_list args;
    va_start(args, fmt);
    llm8_print_error_v(fmt, args);
    va_end(args);
    exit(EXIT_FAILURE);
}

/*
The path of each file fopenCheck opened, until fcloseCheck closes it, so that a failed read,
write, seek or close names its file: "read failed (checkpoint.h:201)" left the user to guess
which of a run's files it was. A run has a handful open at once; past LLM8_TRACKED_FILES
the message says "an untracked file". Paths past the slot's length keep their end.
*/
#define LLM8_TRACKED_FILES 32
#define LLM8_TRACKED_PATH 1024
typedef struct {
    FILE* fp;
    char path[LLM8_TRACKED_PATH];
} Llm8OpenFile;
static Llm8OpenFile llm8_open_files[LLM8_TRACKED_FILES];

static inline void llm8_track_file(FILE* fp, const char* path) {
    Llm8OpenFile* slot = NULL;
    for (int i = 0; i < LLM8_TRACKED_FILES && slot == NULL; i++) {
        if (llm8_open_files[i].fp == NULL || llm8_open_files[i].fp == fp) { slot = &llm8_open_files[i]; }
    }
    if (slot == NULL) { return; }
    size_t length = strlen(path), keep = LLM8_TRACKED_PATH - 1;
    size_t start = length > keep ? length - keep : 0;
    slot->fp = fp;
    memcpy(slot->path, path + start, length - start);
    slot->path[length - start] = '\0';
}

static inline void llm8_untrack_file(FILE* fp) {
    for (int i = 0; i < LLM8_TRACKED_FILES; i++) {
        if (llm8_open_files[i].fp == fp) { llm8_open_files[i].fp = NULL; }
    }
}

static inline const char* llm8_file_name(FILE* fp) {
    for (int i = 0; i < LLM8_TRACKED_FILES; i++) {
        if (llm8_open_files[i].fp == fp) { return llm8_open_files[i].path; }
    }
    return "an untracked file";
}

// files fopenCheck opened that fcloseCheck has not closed: the tests hold every module to closing
// what it opens through fcloseCheck (a plain fclose leaves the slot, which then names no file, or
// a later file at the same address wrongly, in an error)
static inline int llm8_open_file_count(void) {
    int open = 0;
    for (int i = 0; i < LLM8_TRACKED_FILES; i++) { open += llm8_open_files[i].fp != NULL; }
    return open;
}

// opens path or dies naming it; for reading it must be a regular file (a directory opens, then
// reads as an error or as a size of 2^63 bytes)
static inline FILE* fopen_check(const char* path, const char* mode, const char* file, int line) {
    FILE* fp = fopen(path, mode);
    const char* what = (mode[0] == 'r') ? "read" : "write";
    if (fp == NULL) {
        llm8_die("cannot open '%s' to %s: %s (%s:%d)", path, what, strerror(errno), file, line);
    }
    struct stat st;
    if (mode[0] == 'r' && fstat(fileno(fp), &st) == 0 && !S_ISREG(st.st_mode)) {
        llm8_die("cannot open '%s' to read: %s, not a regular file (%s:%d)", path,
                 S_ISDIR(st.st_mode) ? "a directory" : "a special file", file, line);
    }
    llm8_track_file(fp, path);
    return fp;
}
#define fopenCheck(path, mode) fopen_check(path, mode, __FILE__, __LINE__)

// reads exactly nmemb items or dies naming the file
static inline void fread_check(void* ptr, size_t size, size_t nmemb, FILE* stream, const char* file, int line) {
    size_t got = fread(ptr, size, nmemb, stream);
    if (got != nmemb) {
        if (feof(stream)) {
            llm8_die("'%s': unexpected end of file: wanted %zu items of %zu bytes, got %zu (file truncated?) (%s:%d)",
                     llm8_file_name(stream), nmemb, size, got, file, line);
        }
        llm8_die("cannot read '%s': %s (%s:%d)", llm8_file_name(stream), strerror(errno), file, line);
    }
}
#define freadCheck(ptr, size, nmemb, stream) fread_check(ptr, size, nmemb, stream, __FILE__, __LINE__)

static inline void fwrite_check(const void* ptr, size_t size, size_t nmemb, FILE* stream, const char* file, int line) {
    size_t put = fwrite(ptr, size, nmemb, stream);
    if (put != nmemb) {
        llm8_die("cannot write '%s': stopped after %zu of %zu items: %s (disk full?) (%s:%d)", llm8_file_name(stream), put,
                 nmemb, strerror(errno), file, line);
    }
}
#define fwriteCheck(ptr, size, nmemb, stream) fwrite_check(ptr, size, nmemb, stream, __FILE__, __LINE__)

static inline void fclose_check(FILE* fp, const char* file, int line) {
    char path[LLM8_TRACKED_PATH];
    snprintf(path, sizeof(path), "%s", llm8_file_name(fp));
    llm8_untrack_file(fp);
    if (fclose(fp) != 0) {  // buffered writes land here: a full disk may show first at the close
        llm8_die("cannot close '%s': %s (%s:%d)", path, strerror(errno), file, line);
    }
}
#define fcloseCheck(fp) fclose_check(fp, __FILE__, __LINE__)

// flushes a file written as it goes (the logs), or dies naming it: glibc drops what a failed
// flush held, so the fclose after it reports nothing and a full disk went unnoticed (exit 0)
static inline void fflush_check(FILE* fp, const char* file, int line) {
    errno = 0;
    if (fflush(fp) != 0 || ferror(fp)) {
        llm8_die("cannot write '%s': %s (disk full?) (%s:%d)", llm8_file_name(fp),
                 errno != 0 ? strerror(errno) : "an earlier write failed", file, line);
    }
}
#define fflushCheck(fp) fflush_check(fp, __FILE__, __LINE__)

static inline void fseek_check(FILE* fp, long off, int whence, const char* file, int line) {
    if (fseek(fp, off, whence) != 0) {
        llm8_die("cannot seek to %ld in '%s': %s (%s:%d)", off, llm8_file_name(fp), strerror(errno), file, line);
    }
}
#define fseekCheck(fp, off, whence) fseek_check(fp, off, whence, __FILE__, __LINE__)

static inline void* malloc_check(size_t size, const char* file, int line) {
    void* ptr = malloc(size);
    if (ptr == NULL && size > 0) {
        llm8_die("host out of memory: could not allocate %.2f MiB (%s:%d)", size / 1048576.0, file, line);
    }
    return ptr;
}
#define mallocCheck(size) malloc_check(size, __FILE__, __LINE__)

// size of an open file in bytes; leaves the position at the start
static inline long file_size_bytes(FILE* fp) {
    fseekCheck(fp, 0, SEEK_END);
    long size = ftell(fp);
    fseekCheck(fp, 0, SEEK_SET);
    return size;
}

// out = dir/name, or dies naming both: a path cut short by snprintf would name another file
// (a long -o once made main.log and main.jsonl one file, two streams interleaved)
static inline void path_in_dir(char* out, size_t out_size, const char* dir, const char* name) {
    int n = snprintf(out, out_size, "%s/%s", dir, name);
    if (n < 0 || (size_t)n >= out_size) {
        llm8_die("path '%s/%s' is longer than %zu characters", dir, name, out_size - 1);
    }
}

/*
Opens a log written a line per record: truncated for a fresh run, appended to for a resumed one.
A last line cut short (a full disk, a kill during the write) is ended first, so the resumed run's
first record starts a line of its own instead of corrupting both.
*/
static inline FILE* open_line_log(const char* path, int append) {
    int torn = 0;
    struct stat st;
    if (append && stat(path, &st) == 0 && S_ISREG(st.st_mode)) {  // not a FIFO: opened to read, it would wait for a writer
        FILE* fp = fopen(path, "rb");
        if (fp != NULL) {
            torn = fseek(fp, -1, SEEK_END) == 0 && fgetc(fp) != '\n';
            fclose(fp);
        }
    }
    FILE* fp = fopenCheck(path, append ? "a" : "w");
    if (torn) {
        fputc('\n', fp);
        fflushCheck(fp);
    }
    return fp;
}

static inline int file_exists(const char* path) {
    struct stat st;
    return stat(path, &st) == 0;
}

// creates dir (and any missing parent, as mkdir -p) if missing, and checks we can write into it
static inline void ensure_writable_dir(const char* dir) {
    // each missing level is created, as mkdir -p does (-o runs/d12/fp8 on a fresh machine)
    char path[4096];
    if (strlen(dir) == 0 || strlen(dir) >= sizeof(path)) {
        llm8_die("output dir '%s': expected a path of 1 to %zu characters", dir, sizeof(path) - 1);
    }
    strcpy(path, dir);
    for (char* end = path + 1;; end++) {
        if (*end != '/' && *end != '\0') { continue; }
        char saved = *end;
        *end = '\0';
        struct stat st;
        if (stat(path, &st) != 0) {
            // EEXIST: another rank of the same run created it between the stat and here
            if (mkdir(path, 0755) != 0 && !(errno == EEXIST && stat(path, &st) == 0 && S_ISDIR(st.st_mode))) {
                llm8_die("cannot create output dir '%s': %s (creating '%s')", dir, strerror(errno), path);
            }
        } else if (!S_ISDIR(st.st_mode)) {
            llm8_die("cannot create output dir '%s': '%s' exists and is not a directory", dir, path);
        }
        *end = saved;
        if (saved == '\0') { break; }
    }
    // a resume lists the dir to find its checkpoints: one it cannot read would look empty
    if (access(dir, R_OK | X_OK) != 0) {
        llm8_die("output dir '%s' cannot be listed (it needs read and search permission): %s", dir, strerror(errno));
    }
    // a probe file of this process's own: the ranks of a run (64 of them over 8 nodes, on a shared
    // filesystem) probe the same -o at once, and one's remove must not race another's create
    char host[256] = "", name[320], probe[4096];
    if (gethostname(host, sizeof(host) - 1) != 0) { host[0] = '\0'; }
    snprintf(name, sizeof(name), ".llm8_write_probe.%s.%ld", host, (long)getpid());
    path_in_dir(probe, sizeof(probe), dir, name);
    FILE* fp = fopen(probe, "wb");
    if (fp == NULL) {
        llm8_die("output dir '%s' is not writable: %s", dir, strerror(errno));
    }
    fclose(fp);
    remove(probe);
}

// parse helpers for the CLI: each dies naming the flag and the expected range
static inline long parse_long_flag(const char* flag, const char* text, long lo, long hi) {
    char* end = NULL;
    errno = 0;
    long v = strtol(text, &end, 10);
    if (errno != 0 || end == text || *end != '\0') {
        llm8_die("flag %s: '%s' is not an integer (expected %ld..%ld)", flag, text, lo, hi);
    }
    if (v < lo || v > hi) {
        llm8_die("flag %s: %ld is out of range (expected %ld..%ld)", flag, v, lo, hi);
    }
    return v;
}

static inline float parse_float_flag(const char* flag, const char* text, double lo, double hi) {
    char* end = NULL;
    errno = 0;
    double v = strtod(text, &end);
    if (errno != 0 || end == text || *end != '\0' || v != v) {
        llm8_die("flag %s: '%s' is not a number (expected %g..%g)", flag, text, lo, hi);
    }
    if (v < lo || v > hi) {
        llm8_die("flag %s: %g is out of range (expected %g..%g)", flag, v, lo, hi);
    }
    return (float)v;
}

#endif // LLMC_UTILS_H
