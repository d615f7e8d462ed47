"""
Tests of dev/bench/scaling_model.py, the analytic model behind doc/scaling.md. The model's
layout arithmetic is checked against llmc/zero.h itself (compiled with the host C compiler),
so the Python re-derivation cannot drift from the trainer's; its cost model is checked
through properties that any correct model has (one GPU communicates nothing, FP8 codes are
half of bf16, the ring factor, more bandwidth is never slower) and against figures worked out
by hand here (d12's weight stages, the forward's waits for them), not through its own output.
"""
import json
import os
import shutil
import subprocess

import pytest

from dev_modules import load_dev_bench_module

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_model():
    return load_dev_bench_module("scaling_model")


sm = load_model()
NO_LATENCY = sm.Network(intra_latency_us=0.0, inter_latency_us=0.0)


def target(model, precision):
    return sm.compute_from_targets(1024)[(model, precision)]


def test_parameter_counts_match_gpt2():
    assert sm.model_shape("d12").num_parameters == 124_475_904
    assert sm.model_shape("d48").num_parameters == 1_557_686_400
    assert sm.model_shape("d12").padded_vocab == 50304


def test_shards_match_the_table_in_multi_gpu_md():
    # model, N, S, padding (doc/multi-gpu.md, "Shard layout")
    for model, n, size, padding in [("d12", 2, 62_237_952, 0), ("d12", 8, 15_559_680, 1_536),
                                    ("d48", 2, 778_843_392, 384), ("d48", 8, 194_711_040, 1_920)]:
        P = sm.model_shape(model).num_parameters
        assert sm.shard_size(P, n) == size
        assert n * size - P == padding


def test_chunks_match_multi_gpu_md():
    d12, d48 = sm.model_shape("d12"), sm.model_shape("d48")
    assert (d12.layer_chunk_elements, d12.last_chunk_elements) == (7_087_872, 39_421_440)
    assert (d48.layer_chunk_elements, d48.last_chunk_elements) == (30_740_800, 82_128_000)


ZERO_H_PROBE = r"""
#include "llmc/zero.h"
int main(void) {
    const char* models[] = {"d12", "d24", "d36", "d48"};
    const int ranks[] = {1, 2, 8, 64, 4096};
    for (int m = 0; m < 4; m++) {
        GPT2Config cfg = gpt2_config_from_descriptor(models[m]);
        for (int r = 0; r < 5; r++) {
            ZeroLayout z;
            zero_layout_init(&z, &cfg, ranks[r]);
            ZeroPiece* slices = (ZeroPiece*)mallocCheck((size_t)(4 * cfg.num_layers) * sizeof(ZeroPiece));
            int count = zero_fp8_weight_slices(&z, slices);
            size_t matmul = 0;
            for (int s = 0; s < count; s++) { matmul += slices[s].end - slices[s].begin; }
            free(slices);
            // the smallest share of the last layer's gradient chunk that one rank owns
            int chunk = cfg.num_layers - 1;
            size_t least = zero_chunk_elements(&z, chunk, 0);
            for (int k = 1; k < ranks[r]; k++) {
                size_t owned = zero_chunk_elements(&z, chunk, k);
                if (owned < least) { least = owned; }
            }
            printf("%s %d %zu %zu %zu %zu %zu %zu\n", models[m], ranks[r], z.num_parameters, z.shard_size,
                   zero_chunk_elements(&z, 0, -1), zero_chunk_elements(&z, cfg.num_layers, -1), matmul, least);
        }
    }
    return 0;
}
"""


def test_layout_equals_zero_h(tmp_path):
    cc = shutil.which(os.environ.get("CC", "gcc")) or shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler to build the llmc/zero.h probe")
    source, binary = tmp_path / "probe.c", tmp_path / "probe"
    source.write_text(ZERO_H_PROBE)
    subprocess.run([cc, "-std=gnu11", "-O1", "-I", ROOT, str(source), "-o", str(binary), "-lm"], check=True)
    lines = subprocess.run([str(binary)], check=True, capture_output=True, text=True).stdout.split("\n")
    rows = [line.split() for line in lines if line]
    assert len(rows) == 20
    for name, ranks, P, S, layer_chunk, last_chunk, matmul, least in rows:
        shape, n = sm.model_shape(name), int(ranks)
        assert (shape.num_parameters, sm.shard_size(shape.num_parameters, n)) == (int(P), int(S)), (name, ranks)
        assert (shape.layer_chunk_elements, shape.last_chunk_elements) == (int(layer_chunk), int(last_chunk))
        assert shape.matmul_elements == int(matmul)
        last_layer = sm.collectives(shape, "bf16", 1, n).grad_layers[-1]
        assert last_layer.factor == pytest.approx(1 - int(least) / int(layer_chunk)), (name, ranks)


def test_fp8_weight_gather_moves_half_the_bytes_of_bf16():
    shape = sm.model_shape("d12")
    rest = 2 * shape.bf16_rest_elements
    runs = {p: sm.estimate_step(shape, p, 3, 8, target("d12", "bf16"), NO_LATENCY) for p in sm.PRECISIONS}
    assert runs["bf16"].gather_bytes - rest == 2 * (runs["fp8"].gather_bytes - rest) > 0
    z3 = {p: sm.collectives(shape, p, 3, 8) for p in sm.PRECISIONS}
    assert [c.nbytes for c in z3["bf16"].zero3_layers] == [2 * c.nbytes for c in z3["fp8"].zero3_layers] \
        == [2 * shape.layer_matmul_elements] * 12
    assert z3["fp8"].weight_stage_bytes == z3["bf16"].weight_stage_bytes == rest  # ZeRO-3's stages: the bf16 rest
    fp8 = sm.collectives(shape, "fp8", 1, 8)  # zero_comm.cuh: the matmul weights' codes, the rest in bf16
    assert fp8.weight_stage_bytes == shape.matmul_elements + rest
    bf16 = sm.collectives(shape, "bf16", 1, 8)  # the same stages in bf16: every parameter, not the padding
    assert bf16.weight_stage_bytes == 2 * shape.num_parameters
    # DESIGN.md's one ncclAllGather of S bytes of codes per rank, then the rest: one stage before the encoder
    whole = sm.collectives(shape, "fp8", 1, 8, fp8_codes="whole")
    S = sm.shard_size(shape.num_parameters, 8)
    assert [[one.nbytes for one in stage] for stage in whole.weight_stages] == [[8 * S, rest]]
    assert fp8.amax_all_reduce == 4 * 4 * 12 and bf16.amax_all_reduce == 0


# d12 by hand (gpt2_config.h): C = 768, L = 12, Vp = 50304, maxT = 1024
C, L12, VP, MAXT = 768, 12, 50304, 1024
STAGE0_BYTES = 2 * (VP * C + MAXT * C)  # ZeRO-1's stage 0: wte, wpe in bf16, 78,839,808
LAYER_REST = 13 * C  # ln1w, ln1b, ln2w, ln2b (C each) and the biases qkvb (3 C), attprojb (C), fcb (4 C), fcprojb (C)
LNF_BYTES = 2 * 2 * C  # lnfw, lnfb in bf16: in the last layer's stage
P12 = 124_475_904


@pytest.mark.parametrize("precision, code_bytes", [("fp8", 1), ("bf16", 2)])
def test_weight_stages_of_d12_by_hand(precision, code_bytes):
    shape = sm.model_shape("d12")
    layer_bytes = code_bytes * 12 * C * C + 2 * LAYER_REST
    assert (STAGE0_BYTES, layer_bytes) == (78_839_808, 7_097_856 if precision == "fp8" else 14_175_744)
    last_bytes = layer_bytes + LNF_BYTES
    # N = 8, S = 15,559,680: ranks 0 and 1 hold wte only and ranks 3-6 none of wte, wpe, lnf:
    # every stage crosses their links whole
    eight = sm.collectives(shape, precision, 1, 8).weight_stages
    assert [[(one.nbytes, one.factor) for one in stage] for stage in eight] == \
        [[(STAGE0_BYTES, 1.0)]] + [[(layer_bytes, 1.0)]] * 11 + [[(last_bytes, 1.0)]]
    # N = 2, S = 62,237,952: rank 0 owns all of stage 0 (wte, wpe), rank 1 none of it
    two = sm.collectives(shape, precision, 1, 2).weight_stages
    assert len(two) == 13 and two[0][0].nbytes == STAGE0_BYTES and two[0][0].factor == 1.0
    # rank 0 owns each layer's ln1w, ln1b, qkvw and qkvb; layers 0 and 1's attprojw too (it starts at 60,699,648 + l C^2),
    # and 62,237,952 - 61,879,296 = 358,656 elements of layer 2's; rank 1 the rest
    rank0 = code_bytes * 3 * C * C + 2 * (2 * C + 3 * C)
    own = [rank0 + code_bytes * C * C] * 2 + [rank0 + code_bytes * 358_656] + [rank0] * 9
    assert [stage[0].nbytes for stage in two[1:]] == [layer_bytes] * 11 + [last_bytes]
    assert [stage[0].factor for stage in two[1:]] == pytest.approx(
        [1 - o / layer_bytes for o in own[:-1]] + [1 - own[-1] / last_bytes])  # rank 1 owns lnfw, lnfb too
    # ZeRO-3: one stage, the whole bf16 rest; rank 1 owns of it only attprojb, ln2w, ln2b, fcb, fcprojb (8 C a layer)
    # and lnfw, lnfb
    z3 = sm.collectives(shape, precision, 3, 2).weight_stages
    rest_elements = VP * C + MAXT * C + L12 * LAYER_REST + 2 * C
    assert len(z3) == 1 and len(z3[0]) == 1 and z3[0][0].nbytes == 2 * rest_elements
    assert z3[0][0].factor == pytest.approx(1 - (L12 * 8 * C + 2 * C) / rest_elements)


def test_link_factor_is_one_minus_the_smallest_owned_share():
    shape = sm.model_shape("d12")
    P = shape.num_parameters
    for n in (2, 8, 64):
        S = sm.shard_size(P, n)
        assert sm.busiest_rank_factor(shape, n, [(0, n * S, 1)]) == pytest.approx((n - 1) / n)  # a ring all-gather
        assert sm.busiest_rank_factor(shape, n, [(0, S, 2), (S, n * S, 2)]) == pytest.approx((n - 1) / n)
        assert sm.busiest_rank_factor(shape, n, [(S // 4, S // 2, 2)]) == 1.0  # one owner: everyone else receives it all
    S = sm.shard_size(P, 2)
    assert sm.busiest_rank_factor(shape, 2, [(S - 300, S + 100, 2)]) == pytest.approx(0.75)
    # bytes, not elements: rank 0's 100 one-byte codes against rank 1's 100 bf16 elements
    assert sm.busiest_rank_factor(shape, 2, [(S - 100, S, 1), (S, S + 100, 2)]) == pytest.approx(1 - 100 / 300)
    for model in ("d12", "d48"):
        for n in (2, 8, 64):
            for precision in sm.PRECISIONS:
                for zero_stage in sm.ZERO_STAGES:
                    for fp8_codes in sm.FP8_CODE_GATHERS:
                        c = sm.collectives(sm.model_shape(model), precision, zero_stage, n, fp8_codes=fp8_codes)
                        stages = [one for stage in c.weight_stages for one in stage]
                        for one in (*c.grad_layers, c.grad_last, *stages, *c.zero3_layers):
                            assert one.nbytes > 0 and (n - 1) / n - 1e-12 <= one.factor <= 1.0


def test_collective_time_and_bus_bandwidth():
    assert sm.collective_ms(NO_LATENCY, 8, 1e9, 0.5) == pytest.approx(1e3 * 0.5e9 / 450e9)
    assert sm.collective_ms(sm.Network(), 8, 0, 1.0) == pytest.approx(0.010)  # alpha on one node
    assert sm.collective_ms(sm.Network(), 16, 0, 1.0) == pytest.approx(0.020)  # alpha across nodes
    assert sm.all_reduce_factor(8) == pytest.approx(2 * 7 / 8)
    assert NO_LATENCY.bus_bandwidth(64) == 400e9  # 8 NICs x 50 GB/s under NVLink's 450
    assert sm.Network(nics_per_node=1).bus_bandwidth(64) == 50e9
    assert sm.Network(nics_per_node=1).bus_bandwidth(8) == 450e9


@pytest.mark.parametrize("model", ["d12", "d48"])
@pytest.mark.parametrize("precision", sm.PRECISIONS)
@pytest.mark.parametrize("zero_stage", sm.ZERO_STAGES)
def test_one_gpu_communicates_nothing(model, precision, zero_stage):
    compute = target(model, precision)
    est = sm.estimate_step(sm.model_shape(model), precision, zero_stage, 1, compute, sm.Network(), grad_accum=2)
    assert est.grad_bytes == est.gather_bytes == 0
    assert est.exposed_grad_ms == est.exposed_gather_ms == est.small_all_reduce_ms == 0
    assert est.step_ms == pytest.approx(2 * compute.ms_per_step)
    assert est.vs_linear == pytest.approx(1.0)


def test_gradient_bytes_and_only_the_tail_is_exposed():
    shape, compute = sm.model_shape("d48"), target("d48", "bf16")
    est = sm.estimate_step(shape, "bf16", 1, 8, compute, NO_LATENCY)
    assert est.grad_bytes == 2 * shape.num_parameters
    assert sm.estimate_step(shape, "bf16", 1, 8, compute, NO_LATENCY, grad_fp32=True).grad_bytes == 4 * shape.num_parameters
    c = sm.collectives(shape, "bf16", 1, 8)
    link_ms = [1e3 * one.nbytes * one.factor / 450e9 for one in (*c.grad_layers, c.grad_last)]
    # fast links: the per-layer reduces hide behind backward, layer 0's and the last chunk's do not
    assert est.exposed_grad_ms == pytest.approx(link_ms[0] + link_ms[-1])
    # slow links: the NCCL stream falls behind and nearly all of it is exposed
    slow = sm.Network(intra_bw_gbs=0.5, intra_latency_us=0.0)
    total_ms = sum(link_ms) * 450 / 0.5
    slow_est = sm.estimate_step(shape, "bf16", 1, 8, compute, slow)
    assert total_ms * 0.8 < slow_est.exposed_grad_ms < total_ms


def test_more_bandwidth_is_never_slower_and_more_gpus_give_more_tokens():
    for model in ("d12", "d48"):
        shape = sm.model_shape(model)
        for precision in sm.PRECISIONS:
            compute = target(model, precision)
            for zero_stage in sm.ZERO_STAGES:
                steps = [sm.estimate_step(shape, precision, zero_stage, 16, compute, sm.Network(intra_bw_gbs=bw, nic_bw_gbs=bw / 8)).step_ms
                         for bw in (5, 50, 450, 4500)]
                assert steps == sorted(steps, reverse=True) and steps[0] > steps[-1]
                tok_s = [sm.estimate_step(shape, precision, zero_stage, n, compute, sm.Network()).tok_per_s for n in (1, 8, 64)]
                assert tok_s == sorted(tok_s)
            zero1 = sm.estimate_step(shape, precision, 1, 8, compute, sm.Network())
            zero3 = sm.estimate_step(shape, precision, 3, 8, compute, sm.Network())
            assert zero3.gather_bytes > zero1.gather_bytes
        bf16 = sm.estimate_step(shape, "bf16", 1, 8, target(model, "bf16"), sm.Network())
        fp8 = sm.estimate_step(shape, "fp8", 1, 8, target(model, "fp8"), sm.Network())
        assert fp8.gather_bytes < bf16.gather_bytes and fp8.exposed_gather_ms < bf16.exposed_gather_ms


def d12_forward_layer_ms(micro_ms):
    """one layer's forward share of a d12 micro-step, by hand (assumption 2): 24 C^2 + 4 T C of the
    forward FLOPs per token, lm_head 2 Vp C, backward twice forward"""
    layer, head = 24 * C * C + 4 * MAXT * C, 2 * VP * C
    return micro_ms * layer / (3 * (L12 * layer + head))


def test_zero1_forward_waits_for_stage_0_and_layer_0s_stage_when_compute_hides_the_rest():
    for model, n, net in (("d48", 8, sm.Network()), ("d48", 64, sm.Network()), ("d12", 8, NO_LATENCY)):
        shape, compute = sm.model_shape(model), target(model, "fp8")
        stages = sm.collectives(shape, "fp8", 1, n).weight_stages
        stage_ms = [sm.collective_ms(net, n, stage[0].nbytes, stage[0].factor) for stage in stages]
        assert max(stage_ms[1:]) < sm.compute_split(shape, compute)[0]  # each later stage fits behind a layer's forward
        # the encoder (no time in the model) waits for stage 0, layer 0 for its own stage, issued right behind it
        for grad_accum in (1, 4):  # later micro-steps find everything gathered
            est = sm.estimate_step(shape, "fp8", 1, n, compute, net, grad_accum=grad_accum)
            assert est.exposed_gather_ms == pytest.approx(stage_ms[0] + stage_ms[1])
    # d48 on one node, by hand: 164,249,600 bytes of stage 0 (wte, wpe) and 30,761,600 of layer 0's
    # (49,152,000 codes, 20,800 bf16)
    est = sm.estimate_step(sm.model_shape("d48"), "fp8", 1, 8, target("d48", "fp8"), sm.Network())
    assert est.exposed_gather_ms == pytest.approx(2 * 0.010 + 1e3 * (164_249_600 + 30_761_600) / 450e9)


# d12 FP8 ZeRO-1 on one node, by hand: stage 0 and layer 0's stage (factor 1 at N = 8), 10 us each
D12_STAGE0_MS = 0.010 + 1e3 * STAGE0_BYTES / 450e9  # 0.1852 ms
D12_LAYER0_STAGE_MS = 0.010 + 1e3 * (12 * C * C + 2 * LAYER_REST) / 450e9  # 0.0258 ms
# the update of what follows wte and wpe, 1 - (Vp C + maxT C) / P of the optimizer's time, hides stage 0
D12_AFTER_WPE = 1 - (VP * C + MAXT * C) / P12  # 85,056,000 / 124,475,904 = 0.683


def d12_fp8_zero1_with_optimizer(optimizer_ms, zero_stage=1, fp8_codes="matmul"):
    compute = sm.Compute(65536, 121.25, optimizer_ms)
    return sm.estimate_step(sm.model_shape("d12"), "fp8", zero_stage, 8, compute, sm.Network(), fp8_codes=fp8_codes)


def test_zero1_stage_0_hides_behind_the_update_after_wpe():
    # 8 ms on one GPU: 1 ms on each of 8, 0.683 ms of it after wpe, more than stage 0 takes
    assert 8.0 / 8 * D12_AFTER_WPE > D12_STAGE0_MS
    est = d12_fp8_zero1_with_optimizer(8.0)
    assert est.exposed_gather_ms == pytest.approx(D12_LAYER0_STAGE_MS)  # layer 0's stage only, from the update's end
    assert est.compute_ms == pytest.approx(121.25 - 8.0 + 1.0)
    # ZeRO-3 and --fp8-codes whole gather after the whole update: the optimizer hides none of it
    for zero_stage, fp8_codes in ((3, "matmul"), (1, "whole")):
        with_update = d12_fp8_zero1_with_optimizer(8.0, zero_stage, fp8_codes)
        assert with_update.exposed_gather_ms == pytest.approx(d12_fp8_zero1_with_optimizer(0.0, zero_stage, fp8_codes).exposed_gather_ms)


def test_zero1_stage_0_runs_past_the_update_and_the_layer_stages_queue_behind_it():
    # 1.6 ms on one GPU: 0.2 ms on each of 8, 0.1367 ms of it after wpe, less than stage 0's 0.1852
    hidden_ms = 1.6 / 8 * D12_AFTER_WPE
    assert 0 < hidden_ms < D12_STAGE0_MS
    est = d12_fp8_zero1_with_optimizer(1.6)
    assert est.exposed_gather_ms == pytest.approx(D12_STAGE0_MS - hidden_ms + D12_LAYER0_STAGE_MS)


@pytest.mark.parametrize("bw_gbs", [1.0, 4.0])
def test_zero1_forward_stalls_on_stages_that_arrive_late(bw_gbs):
    shape, compute = sm.model_shape("d12"), target("d12", "fp8")
    net = sm.Network(intra_bw_gbs=bw_gbs, intra_latency_us=0.0)
    # N = 8: every stage crosses the busiest link whole (factor 1)
    stage0_ms, layer_ms = 1e3 * STAGE0_BYTES / (bw_gbs * 1e9), 1e3 * (12 * C * C + 2 * LAYER_REST) / (bw_gbs * 1e9)
    forward_ms = d12_forward_layer_ms(compute.ms_per_step)
    lnf_ms = 1e3 * LNF_BYTES / (bw_gbs * 1e9)  # the last layer's stage carries lnfw, lnfb too
    # layer l may start once stage 1 + l is in, at stage0 + (l + 1) layer_ms: at 1 GB/s every layer waits
    # (7.10 ms stages, 2.45 ms forwards), at 4 GB/s (1.77 ms) only layer 0 does
    expected = stage0_ms + layer_ms + (L12 - 2) * max(0.0, layer_ms - forward_ms) + max(0.0, layer_ms + lnf_ms - forward_ms)
    assert (layer_ms > forward_ms) == (bw_gbs == 1.0)
    est = sm.estimate_step(shape, "fp8", 1, 8, compute, net)
    assert est.exposed_gather_ms == pytest.approx(expected)


def test_zero3_layer_gathers_queue_behind_the_stages():
    shape, compute = sm.model_shape("d12"), target("d12", "fp8")
    net = sm.Network()  # 10 us per group: the bf16 rest is one stage, one alpha (rank 5 owns none of it: factor 1)
    fast = sm.estimate_step(shape, "fp8", 3, 8, compute, net)
    stages_ms = 0.010 + 1e3 * (STAGE0_BYTES + LNF_BYTES + L12 * 2 * LAYER_REST) / 450e9
    first_layer_ms = 0.010 + 1e3 * 12 * C * C / 450e9  # layer 0's FP8 codes, factor 1 at N = 8
    # layer 0's matmul weights start after every stage; the later layers' gathers hide behind compute
    assert fast.exposed_gather_ms == pytest.approx(stages_ms + first_layer_ms)
    c = sm.collectives(shape, "fp8", 3, 8)
    slow_net = sm.Network(intra_bw_gbs=0.1, intra_latency_us=0.0)
    stages_slow_ms = sum(sm.collective_ms(slow_net, 8, stage[0].nbytes, stage[0].factor) for stage in c.weight_stages)
    slow = sm.estimate_step(shape, "fp8", 3, 8, compute, slow_net)
    per_layer_gathers_ms = 1e3 * 2 * sum(one.nbytes * one.factor for one in c.zero3_layers) / 0.1e9
    # the NCCL stream paces compute: at least the stages and the gathers' (forward and backward) excess over compute
    assert slow.exposed_gather_ms - stages_slow_ms > per_layer_gathers_ms - compute.ms_per_step > 0
    # every micro-step gathers again, so each extra micro-step adds at least that excess
    slow_accum = sm.estimate_step(shape, "fp8", 3, 8, compute, slow_net, grad_accum=3)
    assert slow_accum.exposed_gather_ms - slow.exposed_gather_ms > 2 * (per_layer_gathers_ms - compute.ms_per_step)


def test_fp8_codes_whole_is_gathered_before_the_forward():
    shape, compute = sm.model_shape("d48"), target("d48", "fp8")
    S = sm.shard_size(shape.num_parameters, 8)
    rest = 2 * shape.bf16_rest_elements  # N = 8: some rank owns none of the rest (factor 1)
    blocking_ms = (0.010 + 1e3 * 8 * S * 7 / 8 / 450e9) + (0.010 + 1e3 * rest / 450e9)
    for grad_accum in (1, 3):
        whole = sm.estimate_step(shape, "fp8", 1, 8, compute, sm.Network(), grad_accum=grad_accum, fp8_codes="whole")
        assert whole.exposed_gather_ms == pytest.approx(blocking_ms)
    assert round(blocking_ms, 2) == 3.42  # doc/scaling.md's third table, as before the stages
    staged = sm.estimate_step(shape, "fp8", 1, 8, compute, sm.Network())
    assert staged.exposed_gather_ms < blocking_ms / 5
    # ZeRO-3 and bf16 gather no codes after the update: --fp8-codes does not apply to them
    for precision, zero_stage in (("fp8", 3), ("bf16", 1)):
        whole = sm.collectives(shape, precision, zero_stage, 8, fp8_codes="whole")
        assert whole == sm.collectives(shape, precision, zero_stage, 8)


def test_bench_json_is_read_like_bench_py_writes_it(tmp_path):
    records = [
        {"model": "d12", "precision": "bf16", "recipe": "-", "optimizer": "adamw", "B": 64, "T": 1024,
         "tok_per_s": 480000, "ms_per_step": 136.5, "optimizer_ms": 2.5, "device": "NVIDIA H100"},
        {"model": "d12", "precision": "fp8", "recipe": "current", "optimizer": "adamw", "B": 64, "T": 1024,
         "tok_per_s": 500000, "ms_per_step": 131.0, "optimizer_ms": 2.5},
        {"benchmark": "train", "model": "d12", "precision": "fp8", "recipe": "delayed", "optimizer": "adamw",
         "weight_scaling": "current", "lm_head": "bf16", "B": 64, "T": 1024, "tok_per_s": 560000, "ms_per_step": 117.0,
         "optimizer_ms": None},
        # the same run's other variants bench.py times: not the trainer's defaults, so not read
        {"benchmark": "train", "model": "d12", "precision": "fp8", "recipe": "delayed", "optimizer": "adamw",
         "weight_scaling": "delayed", "lm_head": "bf16", "B": 64, "T": 1024, "tok_per_s": 570000, "ms_per_step": 115.0},
        {"benchmark": "train", "model": "d12", "precision": "fp8", "recipe": "delayed", "optimizer": "adamw",
         "weight_scaling": "current", "lm_head": "fp8", "B": 64, "T": 1024, "tok_per_s": 600000, "ms_per_step": 109.0},
        {"model": "d12", "precision": "fp8", "recipe": "delayed", "optimizer": "adamw8", "error": "out of memory"},
        {"benchmark": "ranks", "model": "d12", "precision": "fp8", "ranks": 2, "B": 32, "T": 1024, "ms_per_step": 80.0},
        {"benchmark": "gemm", "record": "time", "model": "d12", "linear": "fc", "B": 64, "T": 1024, "pass": "fwd",
         "variant": "fp8", "ms": 0.5},
    ]
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(records))
    table = sm.compute_from_bench(str(path), "delayed", "adamw")
    assert set(table) == {("d12", "bf16"), ("d12", "fp8")}
    assert (table[("d12", "bf16")].tokens, table[("d12", "bf16")].micro_ms) == (65536, 134.0)
    assert (table[("d12", "fp8")].ms_per_step, table[("d12", "fp8")].optimizer_ms) == (117.0, 0.0)
    assert sm.compute_from_bench(str(path), "delayed", "adamw", "current", "fp8")[("d12", "fp8")].ms_per_step == 109.0
    assert sm.compute_from_bench(str(path), "delayed", "adamw", "delayed", "bf16")[("d12", "fp8")].ms_per_step == 115.0
    # two records that both match cannot be told apart: refused rather than the last one taken
    path.write_text(json.dumps(records + [dict(records[2], ms_per_step=118.0)]))
    with pytest.raises(sm.CliError, match="two records for d12 fp8"):
        sm.compute_from_bench(str(path), "delayed", "adamw")


def test_sharded_optimizer_is_credited():
    shape = sm.model_shape("d12")
    compute = sm.Compute(65536, 140.0, 8.0)
    est = sm.estimate_step(shape, "bf16", 1, 8, compute, NO_LATENCY)
    assert est.compute_ms == pytest.approx(132.0 + 1.0)


@pytest.mark.parametrize("argv, named", [
    (["--targets", "--gpus", "12"], "--gpus 12"),
    (["--targets", "--gpus", "0"], "--gpus"),
    (["--targets", "--intra-bw", "-5"], "--intra-bw"),
    (["--compute", "d12:bf17:65536:139"], "bf17"),
    (["--compute", "d12:bf16:65536"], "MODEL:PRECISION"),
    (["--compute", "d99:bf16:65536:139"], "d99"),
    (["--compute", "d12:bf16:65536:139"], "d12 fp8"),
    (["--bench", "/nonexistent/bench.json"], "/nonexistent/bench.json"),
    (["--gpus", "8"], "--targets"),
])
def test_bad_arguments_fail_with_one_line(argv, named, capsys):
    assert sm.main(argv) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert len(err.strip().splitlines()) == 1 and named in err and err.startswith("scaling_model.py: error:")


def test_cli_prints_a_step_table_and_a_bytes_table(capsys):
    assert sm.main(["--targets", "--models", "d12", "--gpus", "1", "8", "--zero", "1"]) == 0
    out = capsys.readouterr().out
    rows = [line.split("|")[1:-1] for line in out.splitlines() if line.startswith("| d12 ")]
    step_rows = [r for r in rows if len(r) == 14]
    byte_rows = [r for r in rows if len(r) == 9]
    assert len(step_rows) == 4 and len(byte_rows) == 2  # bf16 and fp8; 1 and 8 GPUs
    assert [c.strip() for c in step_rows[0][:8]] == ["d12", "bf16", "1", "1", "-", "0.0", "0.0", "139.44"]
    # the d12 FP8 ZeRO-1 row: 2 bytes per gradient; stage 0 (wte, wpe in bf16), each layer's stage (codes and bf16)
    assert [c.strip() for c in byte_rows[1]] == ["d12", "fp8", "1", "14.2 x1.00", "78.8 x1.00",
                                                 "78.8 x1.00", "7.1 x1.00", "-", "192"]


def test_cli_bytes_table_shows_the_whole_variant_as_one_stage(capsys):
    assert sm.main(["--targets", "--models", "d12", "--gpus", "2", "--precisions", "fp8", "--zero", "1", "3",
                    "--fp8-codes", "whole"]) == 0
    rows = [line.split("|")[1:-1] for line in capsys.readouterr().out.splitlines() if line.startswith("| d12 ")]
    byte_rows = [[c.strip() for c in r] for r in rows if len(r) == 9]
    # ZeRO-1: the codes' all-gather (2 S bytes, the ring's 1/2) and the bf16 rest, no layer stages; ZeRO-3 its own
    # one stage (the bf16 rest, of which rank 1 owns 0.2%) and layer gathers (of 12 C^2 codes, rank 0 owns qkvw's
    # 3 C^2, and attprojw's C^2 too in layers 0 and 1)
    assert byte_rows[0][5:7] == ["124.5 x0.50 + 79.1 x1.00", "-"]
    assert byte_rows[1][5:8] == ["79.1 x1.00", "-", "7.1 x0.67-0.75"]
