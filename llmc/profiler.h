/*
profiler.h: per-kernel time breakdown of a training step, from CUDA events.

Why: the benchmark must say where the time goes, so the next optimisation is obvious, and
the GPU machines have no Nsight Systems. The trainer calls profiler_mark(name) after each
launch; the time between two consecutive marks on the stream is charged to the later
mark's name. Events are recorded asynchronously, so the step is not serialized; the only
synchronization is at profiler_end_step. When disabled (the default), marks cost a branch.
*/
#ifndef LLMC_PROFILER_H
#define LLMC_PROFILER_H

#include <stdio.h>
#include <string.h>
#include <stdlib.h>
#include "cuda_common.h"

#define PROFILER_MAX_MARKS 8192
#define PROFILER_MAX_NAMES 64

typedef struct {
    int enabled;
    cudaStream_t stream;
    cudaEvent_t events[PROFILER_MAX_MARKS + 1];
    const char* mark_names[PROFILER_MAX_MARKS + 1];
    int num_marks;
    const char* names[PROFILER_MAX_NAMES];
    double total_ms[PROFILER_MAX_NAMES];
    long calls[PROFILER_MAX_NAMES];
    int num_names;
    int steps;
    int in_step;         // marks count only between profiler_begin_step and profiler_end_step
    long dropped_marks;  // marks past PROFILER_MAX_MARKS in a step: not recorded, the step's time after the last recorded one uncounted
} KernelProfiler;

static KernelProfiler g_profiler;

static void profiler_init(int enabled) {
    memset(&g_profiler, 0, sizeof(g_profiler));
    g_profiler.enabled = enabled;
    if (!enabled) { return; }
    for (int i = 0; i <= PROFILER_MAX_MARKS; i++) { cudaCheck(cudaEventCreate(&g_profiler.events[i])); }
}

static void profiler_begin_step(cudaStream_t stream) {
    if (!g_profiler.enabled) { return; }
    g_profiler.stream = stream;
    g_profiler.num_marks = 0;
    g_profiler.in_step = 1;
    cudaCheck(cudaEventRecord(g_profiler.events[0], stream));
}

// charges the stream time since the previous mark to `name` (a string literal)
static void profiler_mark(const char* name) {
    if (!g_profiler.enabled || !g_profiler.in_step) { return; }
    if (g_profiler.num_marks >= PROFILER_MAX_MARKS) { g_profiler.dropped_marks++; return; }
    int i = ++g_profiler.num_marks;
    g_profiler.mark_names[i] = name;
    cudaCheck(cudaEventRecord(g_profiler.events[i], g_profiler.stream));
}

static int profiler_name_slot(const char* name) {
    for (int i = 0; i < g_profiler.num_names; i++) {
        if (strcmp(g_profiler.names[i], name) == 0) { return i; }
    }
    if (g_profiler.num_names == PROFILER_MAX_NAMES) { return PROFILER_MAX_NAMES - 1; }
    g_profiler.names[g_profiler.num_names] = name;
    return g_profiler.num_names++;
}

// record = 0 discards the step (e.g. the first one, which includes one-time setup)
static void profiler_end_step(int record) {
    if (!g_profiler.enabled) { return; }
    g_profiler.in_step = 0;
    if (!record || g_profiler.num_marks == 0) { return; }
    cudaCheck(cudaEventSynchronize(g_profiler.events[g_profiler.num_marks]));
    for (int i = 1; i <= g_profiler.num_marks; i++) {
        float ms;
        cudaCheck(cudaEventElapsedTime(&ms, g_profiler.events[i - 1], g_profiler.events[i]));
        int slot = profiler_name_slot(g_profiler.mark_names[i]);
        g_profiler.total_ms[slot] += ms;
        g_profiler.calls[slot]++;
    }
    g_profiler.steps++;
}

// table sorted by time: name, ms per step, share, calls per step
static void profiler_print(FILE* out) {
    if (!g_profiler.enabled || g_profiler.steps == 0) { return; }
    int order[PROFILER_MAX_NAMES];
    double sum = 0.0;
    for (int i = 0; i < g_profiler.num_names; i++) { order[i] = i; sum += g_profiler.total_ms[i]; }
    for (int i = 0; i < g_profiler.num_names; i++) {
        for (int j = i + 1; j < g_profiler.num_names; j++) {
            if (g_profiler.total_ms[order[j]] > g_profiler.total_ms[order[i]]) { int t = order[i]; order[i] = order[j]; order[j] = t; }
        }
    }
    fprintf(out, "kernel breakdown over %d steps (ms per step):\n", g_profiler.steps);
    fprintf(out, "| kernel | ms/step | share | calls/step |\n|---|---|---|---|\n");
    for (int k = 0; k < g_profiler.num_names; k++) {
        int i = order[k];
        fprintf(out, "| %s | %.3f | %.1f%% | %ld |\n", g_profiler.names[i], g_profiler.total_ms[i] / g_profiler.steps,
                100.0 * g_profiler.total_ms[i] / sum, g_profiler.calls[i] / g_profiler.steps);
    }
    fprintf(out, "| total | %.3f | 100%% | |\n", sum / g_profiler.steps);
    if (g_profiler.dropped_marks > 0) {
        fprintf(out, "(%ld marks beyond %d per step were dropped: the breakdown ends early in those steps)\n",
                g_profiler.dropped_marks, PROFILER_MAX_MARKS);
    }
}

static void profiler_free(void) {
    if (!g_profiler.enabled) { return; }
    for (int i = 0; i <= PROFILER_MAX_MARKS; i++) { cudaCheck(cudaEventDestroy(g_profiler.events[i])); }
}

#endif // LLMC_PROFILER_H
