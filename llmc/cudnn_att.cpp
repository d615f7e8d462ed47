/*
cudnn_att.cpp: the cuDNN flash-attention backend of llmc/attention.cuh (see cudnn_att.h
for the layouts and why this is its own translation unit).

Shape of the code: one cuDNN handle; one frontend graph per (B, T, NH, HS) and direction,
built the first time that shape is seen and kept in a map, because building a graph
(heuristics, plan compilation) costs milliseconds to seconds while executing one costs
microseconds. q, k and v are strided views into the fused qkv buffer (no copies), and
dq, dk, dv are written straight into the matching views of dqkv. Tensors are bound by fixed
uids, so executing a cached graph is a map of five pointers (forward) or nine (backward).

Determinism: the backward asks for cuDNN's deterministic algorithm unless the trainer's
-ad 0 says otherwise (cudnn_att_setup). On Hopper (cuDNN 9.19) that algorithm keeps dP in a
workspace of B*NH*T*T bf16 (1.5 GiB for d12 at B=64, T=1024: written and read back, about
0.7 ms of memory traffic a layer on an H200) instead of accumulating dQ with float atomics;
the 2026-11-26 H200 benchmark put the backward at 4.6 times its compute floor. The workspace
is allocated here, grown only when a new shape needs more.

Built with -DLLM8_NO_CUDNN this file is empty: attention.cuh then never calls it.
*/
#ifndef LLM8_NO_CUDNN

#include "llmc/cudnn_att.h"

#include <math.h>
#include <stdint.h>
#include <exception>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

// the frontend defines a static helper it does not always use; its warning is not ours
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"
#include <cudnn_frontend.h>
#pragma GCC diagnostic pop

#include "llmc/utils.h"

namespace fe = cudnn_frontend;

enum CudnnAttentionUid {
    UID_Q = 1, UID_K, UID_V, UID_O, UID_STATS, UID_DO, UID_DQ, UID_DK, UID_DV
};

typedef std::tuple<int, int, int, int> AttentionShape;  // B, T, NH, HS
typedef std::shared_ptr<fe::graph::Graph> GraphPtr;

static cudnnHandle_t cudnn_handle = NULL;
static bool cudnn_deterministic_backward = true;
static void* cudnn_workspace = NULL;
static size_t cudnn_workspace_bytes = 0;
static std::map<AttentionShape, GraphPtr> forward_graphs;
static std::map<AttentionShape, GraphPtr> backward_graphs;

// cuda_common.h's cudaCheck, again: that header holds device code, and nvcc compiles this .cpp as host C++
static void cudnn_att_check_cuda(cudaError_t err, const char* file, int line) {
    if (err != cudaSuccess) {
        llm8_die("CUDA error %s: %s (%s:%d)", cudaGetErrorName(err), cudaGetErrorString(err), file, line);
    }
}
#define cudaCheck(err) cudnn_att_check_cuda((err), __FILE__, __LINE__)

static void cudnn_att_check_cudnn(cudnnStatus_t status, const char* file, int line) {
    if (status != CUDNN_STATUS_SUCCESS) {
        llm8_die("cuDNN error %s (%s:%d)", cudnnGetErrorString(status), file, line);
    }
}
#define cudnnCheck(status) cudnn_att_check_cudnn((status), __FILE__, __LINE__)

// a frontend step that fails names the step and the shape: the usual cause is a shape or
// cuDNN version the fused kernels do not support, and the remedy is the fallback backend.
// The frontend's messages can span lines (heuristics append cuDNN's last error): joined
// into one, so the error stays a single line.
static void cudnn_att_die(const char* step, const AttentionShape& shape, const std::string& message) {
    std::string one_line;
    for (char ch : message) {
        if (ch == '\n' || ch == '\r') {
            if (!one_line.empty() && one_line.back() != ' ') { one_line += "; "; }
        } else {
            one_line += ch;
        }
    }
    llm8_die("cuDNN attention: %s failed for B=%d T=%d NH=%d HS=%d: %s "
             "(use the fallback attention backend, -at fallback, for this shape)",
             step, std::get<0>(shape), std::get<1>(shape), std::get<2>(shape), std::get<3>(shape),
             one_line.c_str());
}

static void cudnn_att_check_graph(fe::error_t result, const char* step, const AttentionShape& shape) {
    if (result.is_bad()) { cudnn_att_die(step, shape, result.get_message()); }
}

void cudnn_att_setup(bool deterministic_backward) {
    if (cudnn_handle != NULL) { llm8_die("cudnn_att_setup called twice without cudnn_att_teardown"); }
    // cuDNN's compatibility rule: a library of the same major and the same or a later minor
    // version than the headers the build used; anything else can fail in obscure ways later
    size_t runtime = cudnnGetVersion();
    if (runtime / 10000 != CUDNN_MAJOR || (runtime / 100) % 100 < CUDNN_MINOR) {
        llm8_die("cuDNN attention: built against cuDNN %d.%d.%d but the loaded libcudnn is %zu.%zu.%zu "
                 "(expected %d.%d or a later %d.x; check LD_LIBRARY_PATH, or rebuild)",
                 CUDNN_MAJOR, CUDNN_MINOR, CUDNN_PATCHLEVEL, runtime / 10000, (runtime / 100) % 100, runtime % 100,
                 CUDNN_MAJOR, CUDNN_MINOR, CUDNN_MAJOR);
    }
    cudnnCheck(cudnnCreate(&cudnn_handle));
    cudnn_deterministic_backward = deterministic_backward;
}

void cudnn_att_teardown(void) {
    forward_graphs.clear();
    backward_graphs.clear();
    if (cudnn_workspace != NULL) { cudaCheck(cudaFree(cudnn_workspace)); }
    cudnn_workspace = NULL;
    cudnn_workspace_bytes = 0;
    if (cudnn_handle != NULL) { cudnnCheck(cudnnDestroy(cudnn_handle)); }
    cudnn_handle = NULL;
}

static AttentionShape cudnn_att_shape(int B, int T, int NH, int C) {
    if (cudnn_handle == NULL) { llm8_die("cuDNN attention used before cudnn_att_setup"); }
    if (B <= 0 || T <= 0 || NH <= 0 || C <= 0 || C % NH != 0) {
        llm8_die("cuDNN attention: bad shape B=%d T=%d NH=%d C=%d (C must be a positive multiple of NH)", B, T, NH, C);
    }
    int HS = C / NH;
    if (!cudnn_att_head_size_supported(HS)) {
        llm8_die("cuDNN attention: head size C/NH = %d is not supported (expected a multiple of 8, at most 128)", HS);
    }
    return AttentionShape(B, T, NH, HS);
}

typedef std::shared_ptr<fe::graph::Tensor_attributes> TensorPtr;

typedef struct {
    std::vector<int64_t> dim;
    std::vector<int64_t> stride;
} TensorLayout;

// q, k, v (and dq, dk, dv) as [B][NH][T][HS] views into a [B][T][3][NH][HS] buffer
static TensorLayout qkv_layout(const AttentionShape& shape) {
    int64_t B = std::get<0>(shape), T = std::get<1>(shape), NH = std::get<2>(shape), HS = std::get<3>(shape);
    return TensorLayout{{B, NH, T, HS}, {T * 3 * NH * HS, HS, 3 * NH * HS, 1}};
}

// out and dout as [B][NH][T][HS] views into a [B][T][NH][HS] buffer
static TensorLayout out_layout(const AttentionShape& shape) {
    int64_t B = std::get<0>(shape), T = std::get<1>(shape), NH = std::get<2>(shape), HS = std::get<3>(shape);
    return TensorLayout{{B, NH, T, HS}, {T * NH * HS, HS, NH * HS, 1}};
}

// stats [B][NH][T] (one logsumexp per query row)
static TensorLayout stats_layout(const AttentionShape& shape) {
    int64_t B = std::get<0>(shape), T = std::get<1>(shape), NH = std::get<2>(shape);
    return TensorLayout{{B, NH, T, 1}, {NH * T, T, 1, 1}};
}

static TensorPtr graph_input(const GraphPtr& graph, const char* name, int uid, const TensorLayout& layout) {
    return graph->tensor(fe::graph::Tensor_attributes().set_name(name).set_uid(uid)
                         .set_dim(layout.dim).set_stride(layout.stride));
}

static void mark_output(const TensorPtr& tensor, int uid, const TensorLayout& layout) {
    tensor->set_output(true);
    tensor->set_uid(uid).set_dim(layout.dim).set_stride(layout.stride);
}

static float attention_scale(const AttentionShape& shape) {
    return 1.0f / sqrtf((float)std::get<3>(shape));
}

static GraphPtr new_attention_graph(void) {
    GraphPtr graph = std::make_shared<fe::graph::Graph>();
    graph->set_io_data_type(fe::DataType_t::BFLOAT16)
        .set_intermediate_data_type(fe::DataType_t::FLOAT)
        .set_compute_data_type(fe::DataType_t::FLOAT);
    return graph;
}

// validate, lower, pick a plan, compile it, and make sure the workspace can hold it
static void finish_attention_graph(const GraphPtr& graph, const AttentionShape& shape) {
    cudnn_att_check_graph(graph->validate(), "graph validation", shape);
    cudnn_att_check_graph(graph->build_operation_graph(cudnn_handle), "building the operation graph", shape);
    cudnn_att_check_graph(graph->create_execution_plans({fe::HeurMode_t::A}), "creating execution plans", shape);
    cudnn_att_check_graph(graph->check_support(), "support check", shape);
    cudnn_att_check_graph(graph->build_plans(), "building plans", shape);
    int64_t needed = 0;
    cudnn_att_check_graph(graph->get_workspace_size(needed), "workspace query", shape);
    if ((size_t)needed > cudnn_workspace_bytes) {
        // graphs already enqueued may still use the old workspace (cudaFree only "may" synchronize)
        if (cudnn_workspace != NULL) {
            cudaCheck(cudaDeviceSynchronize());
            cudaCheck(cudaFree(cudnn_workspace));
        }
        cudaError_t err = cudaMalloc(&cudnn_workspace, (size_t)needed);
        if (err == cudaErrorMemoryAllocation) {
            llm8_die("out of GPU memory: cuDNN attention needs a %.2f GiB workspace for B=%d T=%d NH=%d; "
                     "lower the batch size (-b) or use the fallback attention backend",
                     needed / 1073741824.0, std::get<0>(shape), std::get<1>(shape), std::get<2>(shape));
        }
        cudaCheck(err);
        cudnn_workspace_bytes = (size_t)needed;
    }
}

static GraphPtr forward_graph(const AttentionShape& shape) {
    auto cached = forward_graphs.find(shape);
    if (cached != forward_graphs.end()) { return cached->second; }
    GraphPtr graph = new_attention_graph();
    auto q = graph_input(graph, "q", UID_Q, qkv_layout(shape));
    auto k = graph_input(graph, "k", UID_K, qkv_layout(shape));
    auto v = graph_input(graph, "v", UID_V, qkv_layout(shape));
    auto options = fe::graph::SDPA_attributes().set_name("attention_forward")
        .set_generate_stats(true).set_causal_mask(true).set_attn_scale(attention_scale(shape));
    auto [o, stats] = graph->sdpa(q, k, v, options);
    mark_output(o, UID_O, out_layout(shape));
    mark_output(stats, UID_STATS, stats_layout(shape));
    stats->set_data_type(fe::DataType_t::FLOAT);
    finish_attention_graph(graph, shape);
    forward_graphs[shape] = graph;
    return graph;
}

static GraphPtr backward_graph(const AttentionShape& shape) {
    auto cached = backward_graphs.find(shape);
    if (cached != backward_graphs.end()) { return cached->second; }
    GraphPtr graph = new_attention_graph();
    auto q = graph_input(graph, "q", UID_Q, qkv_layout(shape));
    auto k = graph_input(graph, "k", UID_K, qkv_layout(shape));
    auto v = graph_input(graph, "v", UID_V, qkv_layout(shape));
    auto o = graph_input(graph, "o", UID_O, out_layout(shape));
    auto dout = graph_input(graph, "dout", UID_DO, out_layout(shape));
    auto stats = graph_input(graph, "stats", UID_STATS, stats_layout(shape));
    stats->set_data_type(fe::DataType_t::FLOAT);
    auto options = fe::graph::SDPA_backward_attributes().set_name("attention_backward")
        .set_causal_mask(true).set_attn_scale(attention_scale(shape)).set_deterministic_algorithm(cudnn_deterministic_backward);
    auto [dq, dk, dv] = graph->sdpa_backward(q, k, v, o, dout, stats, options);
    mark_output(dq, UID_DQ, qkv_layout(shape));
    mark_output(dk, UID_DK, qkv_layout(shape));
    mark_output(dv, UID_DV, qkv_layout(shape));
    finish_attention_graph(graph, shape);
    backward_graphs[shape] = graph;
    return graph;
}

static void execute_attention_graph(const GraphPtr& graph, std::unordered_map<int64_t, void*>& pointers,
                                    const AttentionShape& shape, cudaStream_t stream) {
    cudnnCheck(cudnnSetStream(cudnn_handle, stream));
    cudnn_att_check_graph(graph->execute(cudnn_handle, pointers, cudnn_workspace), "execution", shape);
}

void cudnn_att_forward(__nv_bfloat16* out, float* stats, const __nv_bfloat16* qkv,
                       int B, int T, int NH, int C, cudaStream_t stream) {
    AttentionShape shape = cudnn_att_shape(B, T, NH, C);
    try {  // the frontend reports through error_t, but its containers and json can still throw
        GraphPtr graph = forward_graph(shape);
        __nv_bfloat16* q = const_cast<__nv_bfloat16*>(qkv);
        std::unordered_map<int64_t, void*> pointers = {
            {UID_Q, q}, {UID_K, q + C}, {UID_V, q + 2 * C}, {UID_O, out}, {UID_STATS, stats}};
        execute_attention_graph(graph, pointers, shape, stream);
    } catch (const std::exception& e) {
        cudnn_att_die("the forward (exception)", shape, e.what());
    }
}

void cudnn_att_backward(__nv_bfloat16* dqkv, const __nv_bfloat16* dout, const __nv_bfloat16* qkv,
                        const __nv_bfloat16* out, const float* stats,
                        int B, int T, int NH, int C, cudaStream_t stream) {
    AttentionShape shape = cudnn_att_shape(B, T, NH, C);
    try {
        GraphPtr graph = backward_graph(shape);
        __nv_bfloat16* q = const_cast<__nv_bfloat16*>(qkv);
        std::unordered_map<int64_t, void*> pointers = {
            {UID_Q, q}, {UID_K, q + C}, {UID_V, q + 2 * C},
            {UID_O, const_cast<__nv_bfloat16*>(out)}, {UID_DO, const_cast<__nv_bfloat16*>(dout)},
            {UID_STATS, const_cast<float*>(stats)},
            {UID_DQ, dqkv}, {UID_DK, dqkv + C}, {UID_DV, dqkv + 2 * C}};
        execute_attention_graph(graph, pointers, shape, stream);
    } catch (const std::exception& e) {
        cudnn_att_die("the backward (exception)", shape, e.what());
    }
}

#endif // LLM8_NO_CUDNN
