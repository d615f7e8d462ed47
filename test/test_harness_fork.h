/*
test_harness_fork.h: testing that bad input ends the process with one clear line, and
scratch directories for tests that write files.

Why: the contract for bad input (DESIGN.md section 8) is "exit non-zero with one line
`error: ...` naming the file/flag/value". That can only be observed from outside the
process, so CHECK_DIES runs the statement in a forked child with stderr captured through a
pipe (stdout discarded), waits for it with a time limit (a hang counts as a failure), and
checks the exit status and the captured text. Include after test_harness.h.
*/
#ifndef TEST_HARNESS_FORK_H
#define TEST_HARNESS_FORK_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <fcntl.h>
#include <dirent.h>
#include <signal.h>
#include <sys/wait.h>
#include "test_harness.h"

#define CHILD_TIME_LIMIT_S 60
#define CHILD_STDERR_MAX 8192

typedef struct {
    pid_t pid;
    int stderr_pipe[2];
} ChildRun;

// forks; returns 1 in the child (stderr into the pipe, stdout to /dev/null), 0 in the parent
static inline int child_run_begin(ChildRun* run) {
    fflush(stdout);
    fflush(stderr);
    if (pipe(run->stderr_pipe) != 0) { perror("pipe"); exit(2); }
    run->pid = fork();
    if (run->pid < 0) { perror("fork"); exit(2); }
    if (run->pid == 0) {
        close(run->stderr_pipe[0]);
        dup2(run->stderr_pipe[1], STDERR_FILENO);
        close(run->stderr_pipe[1]);
        int devnull = open("/dev/null", O_WRONLY);
        if (devnull >= 0) { dup2(devnull, STDOUT_FILENO); close(devnull); }
        alarm(CHILD_TIME_LIMIT_S);
        return 1;
    }
    close(run->stderr_pipe[1]);
    return 0;
}

// parent side: the child's stderr (at most CHILD_STDERR_MAX bytes, into text[CHILD_STDERR_MAX + 1],
// NUL-terminated) once it has ended; returns its wait status, *length the bytes read
static inline int child_run_collect(ChildRun* run, char* text, size_t* length) {
    *length = 0;
    ssize_t got;
    while (*length < CHILD_STDERR_MAX && (got = read(run->stderr_pipe[0], text + *length, CHILD_STDERR_MAX - *length)) > 0) {
        *length += (size_t)got;
    }
    text[*length] = '\0';
    close(run->stderr_pipe[0]);
    int status = 0;
    waitpid(run->pid, &status, 0);
    return status;
}

// parent side: collects the child's stderr and checks the one-line error contract
static inline void child_run_check_dies(ChildRun* run, const char* what, const char* must_contain) {
    char text[CHILD_STDERR_MAX + 1];
    size_t length;
    int status = child_run_collect(run, text, &length);
    int exited = WIFEXITED(status);
    CHECK(exited, "%s: child did not exit normally (signal %d; a crash or a hang)", what,
          WIFSIGNALED(status) ? WTERMSIG(status) : 0);
    if (!exited) { return; }
    CHECK(WEXITSTATUS(status) != 0, "%s: exit status 0, expected an error", what);
    int newlines = 0;
    for (size_t i = 0; i < length; i++) { newlines += text[i] == '\n'; }
    CHECK(newlines == 1 && length > 0 && text[length - 1] == '\n', "%s: stderr is not exactly one line: [%s]", what, text);
    CHECK(strncmp(text, "error: ", 7) == 0, "%s: stderr does not start with 'error: ': [%s]", what, text);
    CHECK(strstr(text, must_contain) != NULL, "%s: stderr does not mention '%s': [%s]", what, must_contain, text);
}

// runs `statement` in a child and checks it exits non-zero with one `error:` line containing must_contain
#define CHECK_DIES(what, must_contain, statement) do { \
    ChildRun _run; \
    if (child_run_begin(&_run)) { statement; _exit(0); } \
    child_run_check_dies(&_run, what, must_contain); \
} while (0)

// runs `statement` in a child and checks it returns (exit status 0)
#define CHECK_LIVES(what, statement) do { \
    ChildRun _run; \
    if (child_run_begin(&_run)) { statement; _exit(0); } \
    char _text[CHILD_STDERR_MAX + 1]; \
    size_t _length; \
    int _status = child_run_collect(&_run, _text, &_length); \
    CHECK(WIFEXITED(_status) && WEXITSTATUS(_status) == 0, "%s: died: [%s]", what, _text); \
} while (0)

// in a child of CHECK_DIES or CHECK_LIVES: runs `statement` as user nobody where the test runs as root (root
// reads, writes and lists anything, so a check of permissions needs another user)
#define AS_NOBODY(statement) do { if (geteuid() == 0 && setuid(65534) != 0) { _exit(3); } statement; } while (0)

// runs `statement` with stdout sent to a temporary file, then puts what it printed into text (a char
// array, NUL-terminated, cut to its size)
#define STDOUT_OF(text, statement) do { \
    fflush(stdout); \
    int _saved = dup(STDOUT_FILENO); \
    FILE* _printed = tmpfile(); \
    if (_saved < 0 || _printed == NULL) { perror("STDOUT_OF"); exit(2); } \
    dup2(fileno(_printed), STDOUT_FILENO); \
    statement; \
    fflush(stdout); \
    dup2(_saved, STDOUT_FILENO); \
    close(_saved); \
    rewind(_printed); \
    size_t _got = fread(text, 1, sizeof(text) - 1, _printed); \
    text[_got] = '\0'; \
    fclose(_printed); \
} while (0)

// ----------------------------------------------------------------------------
// scratch directories (files, and folders of them: make_llmc_files.py's checkpoint dirs)

static inline void test_make_temp_dir(char* out, size_t out_size) {
    snprintf(out, out_size, "/tmp/llm8_test_XXXXXX");
    if (mkdtemp(out) == NULL) { perror("mkdtemp"); exit(2); }
}

static inline void test_remove_dir(const char* dir) {
    DIR* d = opendir(dir);
    if (d == NULL) { return; }
    struct dirent* entry;
    char path[4096];
    while ((entry = readdir(d)) != NULL) {
        if (strcmp(entry->d_name, ".") == 0 || strcmp(entry->d_name, "..") == 0) { continue; }
        int length = snprintf(path, sizeof(path), "%s/%s", dir, entry->d_name);
        if (length < 0 || (size_t)length >= sizeof(path)) { continue; }
        if (unlink(path) != 0) { test_remove_dir(path); }  // a folder
    }
    closedir(d);
    rmdir(dir);
}

// writes files laid out exactly as llm.c writes them (test/make_llmc_files.py) into
// <dir>/llmc, whose path goes to py_dir; returns 1 on success (a failed CHECK otherwise)
static inline int test_make_llmc_files(const char* dir, char* py_dir, size_t py_dir_size) {
    snprintf(py_dir, py_dir_size, "%s/llmc", dir);
    char command[1024];
    snprintf(command, sizeof(command), "python3 test/make_llmc_files.py %s", py_dir);
    int status = system(command);
    CHECK(status == 0, "'%s' failed (run from the repository root; needs python3 with numpy)", command);
    return status == 0;
}

#endif // TEST_HARNESS_FORK_H
