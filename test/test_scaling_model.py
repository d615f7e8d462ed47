"""
Tests of dev/bench/scaling_model.py, the analytic model behind doc/scaling.md. The model's
layout arithmetic is checked against llmc/zero.h itself (compiled with the host C compiler),
so the Python re-derivation cannot drift from the trainer's; its cost model is checked
through properties that any correct model has (one GPU communicates nothing, FP8 codes are
half of bf16, the ring factor, more bandwidth is never slower), not through its own output.
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
    assert (z3["fp8"].gather_fp8.nbytes, z3["fp8"].gather_bf16.nbytes) == (0, rest)
    fp8 = sm.collectives(shape, "fp8", 1, 8)  # zero_comm.cuh: the matmul weights' codes, the rest in bf16
    assert (fp8.gather_fp8.nbytes, fp8.gather_bf16.nbytes) == (shape.matmul_elements, rest)
    # DESIGN.md's one ncclAllGather of S bytes of codes: half of bf16's all-gather of S elements
    whole, bf16 = sm.collectives(shape, "fp8", 1, 8, fp8_codes="whole"), sm.collectives(shape, "bf16", 1, 8)
    assert 2 * whole.gather_fp8.nbytes == bf16.gather_bf16.nbytes == 2 * 8 * sm.shard_size(shape.num_parameters, 8)
    assert bf16.gather_fp8.nbytes == 0
    assert fp8.amax_all_reduce == 4 * 4 * 12 and bf16.amax_all_reduce == 0


def test_link_factor_is_one_minus_the_smallest_owned_share():
    shape = sm.model_shape("d12")
    P = shape.num_parameters
    for n in (2, 8, 64):
        S = sm.shard_size(P, n)
        assert sm.busiest_rank_factor(shape, n, [(0, n * S)]) == pytest.approx((n - 1) / n)  # a ring all-gather
        assert sm.busiest_rank_factor(shape, n, [(0, S), (S, n * S)]) == pytest.approx((n - 1) / n)
        assert sm.busiest_rank_factor(shape, n, [(S // 4, S // 2)]) == 1.0  # one owner: everyone else receives it all
    S = sm.shard_size(P, 2)
    assert sm.busiest_rank_factor(shape, 2, [(S - 300, S + 100)]) == pytest.approx(0.75)
    # ranks 0 and 1 of 8 hold wte and wpe only, so the matmul weights' codes all cross their links
    assert sm.collectives(shape, "fp8", 1, 8).gather_fp8.factor == 1.0
    for model in ("d12", "d48"):
        for n in (2, 8, 64):
            for precision in sm.PRECISIONS:
                for zero_stage in sm.ZERO_STAGES:
                    c = sm.collectives(sm.model_shape(model), precision, zero_stage, n)
                    for one in (*c.grad_layers, c.grad_last, c.gather_fp8, c.gather_bf16, *c.zero3_layers):
                        assert one.nbytes == 0 or (n - 1) / n - 1e-12 <= one.factor <= 1.0


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


def test_zero3_stalls_when_links_are_slower_than_compute():
    shape, compute = sm.model_shape("d12"), target("d12", "fp8")
    c = sm.collectives(shape, "fp8", 3, 8)
    slow_net = sm.Network(intra_bw_gbs=0.1, intra_latency_us=0.0)
    after_update_ms = sm.collective_ms(slow_net, 8, c.gather_bf16.nbytes, c.gather_bf16.factor)
    slow = sm.estimate_step(shape, "fp8", 3, 8, compute, slow_net)
    per_layer_gathers_ms = 1e3 * 2 * sum(one.nbytes * one.factor for one in c.zero3_layers) / 0.1e9
    # the NCCL stream paces compute: at least the gathers' (forward and backward) excess over compute is waited for
    assert slow.exposed_gather_ms - after_update_ms > per_layer_gathers_ms - compute.ms_per_step > 0
    # every micro-step gathers again, so each extra micro-step adds at least that excess
    slow_accum = sm.estimate_step(shape, "fp8", 3, 8, compute, slow_net, grad_accum=3)
    assert slow_accum.exposed_gather_ms - slow.exposed_gather_ms > 2 * (per_layer_gathers_ms - compute.ms_per_step)
    fast = sm.estimate_step(shape, "fp8", 3, 8, compute, NO_LATENCY)
    first_layer_ms = 1e3 * c.zero3_layers[0].nbytes * c.zero3_layers[0].factor / 450e9
    fast_after_update_ms = sm.collective_ms(NO_LATENCY, 8, c.gather_bf16.nbytes, c.gather_bf16.factor)
    # fast links: only the first layer's gather (nothing to hide it behind) is waited for
    assert fast.exposed_gather_ms == pytest.approx(fast_after_update_ms + first_layer_ms)


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
    # the d12 FP8 ZeRO-1 row: 2 bytes per gradient, the matmul weights' codes, the rest in bf16
    assert [c.strip() for c in byte_rows[1][:7]] == ["d12", "fp8", "1", "14.2 x1.00", "78.8 x1.00", "84.9 x1.00", "79.1 x1.00"]
