"""
Tests of dev/bench/floor_model.py, the per-region floor of a training step (doc/performance.md,
"The floor"). Its region names are checked against the trainer's profiler_mark calls, parsed
from train_gpt2_fp8.cu, so a renamed mark fails here; its FLOPs against the closed forms
(6 x tokens x matmul parameters, 7 B T^2 C L for causal attention); a few kernels' bytes against
counts made by hand from the kernels' sources at a small shape; the optimizer's traffic against
DESIGN.md section 4's persistent bytes per parameter; and its CLI's errors and --bench mode.
"""
import dataclasses
import itertools
import json
import re

import pytest

from bench_stubs import breakdown_text
from dev_modules import ROOT, load_dev_bench_module

fm = load_dev_bench_module("floor_model")
H100, H200 = fm.DEVICES["h100"], fm.DEVICES["h200"]
# marks only a multi-GPU step makes (the gradient reduce's wait, the weight all-gather)
MULTI_GPU_MARKS = {"gradient reduce (exposed)", "weight gather + fp8 weight casts"}
SMALL = dict(model="d12", B=1, T=128)  # N = 128 tokens, C = 768
N, C = 128, 768
VP = 50304  # d12's padded vocabulary


def trainer_marks():
    """every name profiler_mark is called with in the trainer (a ternary's names too)"""
    with open(f"{ROOT}/train_gpt2_fp8.cu") as f:
        source = f.read()
    calls = re.findall(r"profiler_mark\(([^;]*)\);", source)
    marks = {name for call in calls for name in re.findall(r'"([^"]+)"', call)}
    assert len(marks) > 20 and "adamw8" in marks, marks
    return marks


def all_runs(**shape):
    """one Run per combination of the flags the model distinguishes"""
    bf16 = [fm.Run(precision="bf16", optimizer=o, master=m, recompute=r, gelu_fusion=g, **shape)
            for o, m, r, g in itertools.product(fm.OPTIMIZERS, (True, False), (0, 1, 2), (0, 1, 2))]
    fp8 = [fm.Run(precision="fp8", recipe=rc, weight_scaling=w, lm_head=h, optimizer=o, master=m, recompute=r,
                  gelu_fusion=g, **shape)
           for rc, w, h, o, m, r, g in itertools.product(fm.RECIPES, fm.WEIGHT_SCALINGS, ("bf16", "fp8"), fm.OPTIMIZERS,
                                                         (True, False), (0, 1, 2), (1, 2))]
    fc_codes = [dataclasses.replace(run, fc_writes_codes=1) for run in fp8 if run.recipe == "delayed" and run.recompute == 0]
    return bf16 + fp8 + fc_codes


def kernels(region, prefix, **run):
    return [k for k in fm.step_kernels(fm.Run(**dict(SMALL, **run))) if k.region == region and k.what.startswith(prefix)]


def test_regions_are_the_trainers_marks_and_cover_a_one_gpu_step():
    marks = trainer_marks()
    produced = {k.region for run in all_runs(**SMALL) for k in fm.step_kernels(run)}
    assert produced <= marks, produced - marks
    assert marks - produced == MULTI_GPU_MARKS


def test_matrix_flops_follow_the_closed_forms():
    for model, (L, C_) in fm.scaling_model.PRESETS.items():
        Vp = fm.scaling_model.model_shape(model).padded_vocab
        B, T = 2, 64
        for run in (fm.Run(model=model, B=B, T=T), fm.Run(model=model, B=B, T=T, precision="fp8", lm_head="fp8"),
                    fm.Run(model=model, B=B, T=T, precision="fp8", recipe="block", recompute=1)):
            ks = fm.step_kernels(run)
            assert sum(k.flops for k in ks if k.kind == "gemm") == 6 * B * T * (L * 12 * C_ * C_ + Vp * C_)
            assert sum(k.flops for k in ks if k.kind == "attention") == 7 * B * T * T * C_ * L
            assert all((k.flops > 0) == (k.kind != "memory") for k in ks)


def test_fp8_lm_head_output_gradient_codes_come_from_the_classifier():
    for recipe in ("current", "delayed"):  # per tensor, any -fg: the classifier writes the codes, a transpose follows
        for grad_scaling in fm.GRAD_SCALINGS:
            passes = kernels("matmul lm_head bwd", "lm_head dy", precision="fp8", recipe=recipe, lm_head="fp8",
                             grad_scaling=grad_scaling)
            assert [k.what for k in passes] == ["lm_head dy^T: transpose of the codes the classifier wrote"], passes
            assert passes[0].bytes == N * VP * (1 + 1)  # codes read, codes^T written
            [classifier] = kernels("classifier", "softmax", precision="fp8", recipe=recipe, lm_head="fp8",
                                   grad_scaling=grad_scaling)
            [bf16] = kernels("classifier", "softmax", precision="bf16")
            assert bf16.bytes - classifier.bytes == N * VP * (2 - 1)  # a code written instead of a bf16 gradient
    # the block recipe's 1x128 tiles: the bf16 gradients in place, one tile pass reads them
    [tiles] = kernels("matmul lm_head bwd", "lm_head dy", precision="fp8", recipe="block", lm_head="fp8")
    assert tiles.what == "lm_head dy: 1x128 cast", tiles
    [classifier] = kernels("classifier", "softmax", precision="fp8", recipe="block", lm_head="fp8")
    assert classifier.bytes == kernels("classifier", "softmax", precision="bf16")[0].bytes


def test_fused_residual_layernorm_bytes_by_recipe():
    stats = N * 2 * 4  # mean and rstd, fp32
    # bf16: inp1, inp2 read, residual and normed written
    [ln] = kernels("residual+layernorm fwd", "residual + ln2", precision="bf16")[:1]
    assert ln.bytes == N * C * 8 + stats
    # delayed: the same pass writes x and x^T codes instead of the bf16 output
    [ln] = kernels("residual+layernorm fwd", "residual + ln2", precision="fp8", recipe="delayed")[:1]
    assert ln.bytes == N * C * (6 + 2) + stats
    # current: statistics and amax (no output), then the tile cast reads the residual sum again
    first, second = kernels("residual+layernorm fwd", "residual + ln2", precision="fp8", recipe="current")[:2]
    assert (first.bytes, second.bytes) == (N * C * 6 + stats, N * C * (2 + 2) + stats)
    # block: the same two passes, each code array with an fp32 scale per 128 codes
    _, second = kernels("residual+layernorm fwd", "residual + ln2", precision="fp8", recipe="block")[:2]
    assert second.bytes == N * C * (2 + 2 * (1 + 4 / 128)) + stats


def test_fc_output_gradient_pass_current_vs_block():
    n = N * 4 * C
    for recipe in ("current", "delayed"):  # gradients are cast with current scaling in both per-tensor recipes
        amax, cast = kernels("matmul fc bwd", "fc dy", precision="fp8", recipe=recipe)[:2]
        # dy, pre_gelu read, the product written, fp32 bias partials per 128 rows; then dy read again, 2 codes written
        assert (amax.bytes, cast.bytes) == (n * (6 + 4 / 128), n * (2 + 2))
    # one pass (block, or -fg delayed): dy and pre_gelu read, no product written (both GEMMs read codes)
    [one] = kernels("matmul fc bwd", "fc dy", precision="fp8", recipe="block")[:1]
    assert one.bytes == n * (4 + 2 * (1 + 4 / 128) + 4 / 128)
    [one] = kernels("matmul fc bwd", "fc dy", precision="fp8", recipe="delayed", grad_scaling="delayed")[:1]
    assert one.bytes == n * (4 + 2 + 4 / 128)
    # bf16: GELU backward (its own region) and the bias pass
    [gelu] = kernels("gelu bwd", "fc", precision="bf16")[:1]
    [bias] = kernels("matmul fc bwd", "fc bias", precision="bf16")[:1]
    assert (gelu.bytes, bias.bytes) == (n * 6, n * (2 + 4 / 128))


def test_gelu_backward_in_the_dgrad_epilogue():
    """-ge 2: fcproj's dgrad GEMM reads the pre-activation (2 bytes per element of its output) and fc's dy pass
    no longer reads it nor writes the product: bf16 loses its gelu bwd kernel, FP8's amax pass 4 of its bytes"""
    n = N * 4 * C
    for precision in ("bf16", "fp8"):
        plain = kernels("matmul fcproj bwd", "fcproj dgrad GEMM", precision=precision)
        fused = kernels("matmul fcproj bwd", "fcproj dgrad GEMM (DGELU", precision=precision, gelu_fusion=2)
        assert len(plain) == len(fused) == 12 and "DGELU" not in plain[0].what
        assert fused[0].bytes == plain[0].bytes + n * 2 and fused[0].flops == plain[0].flops
    assert kernels("gelu bwd", "", precision="bf16", gelu_fusion=2) == []
    amax, cast = kernels("matmul fc bwd", "fc dy", precision="fp8", recipe="current", gelu_fusion=2)[:2]
    assert (amax.bytes, cast.bytes) == (n * (2 + 4 / 128), n * (2 + 2))
    [one] = kernels("matmul fc bwd", "fc dy", precision="fp8", recipe="delayed", grad_scaling="delayed", gelu_fusion=2)[:1]
    assert one.bytes == n * (2 + 2 + 4 / 128)


def test_fc_gemm_writing_gelu_codes():
    """-fe 1: fc's forward GEMM writes the bf16 pre-activation and fcproj's x codes (3 bytes an element where -fe 0's
    GEMM writes 2), and a byte transpose makes x^T (1 byte read, 1 written) where the GELU cast read 2 and wrote 2;
    nothing else changes. Refused where the trainer refuses it: bf16, current or block, -r 1 or 2"""
    n = N * 4 * C
    found = [kernels("matmul fc fwd", "fc forward GEMM", precision="fp8"), kernels("gelu+fp8 cast fwd", "GELU", precision="fp8"),
             kernels("matmul fc+gelu fp8 codes fwd", "fc forward GEMM", precision="fp8", fc_writes_codes=1),
             kernels("fp8 transpose gelu out", "fcproj x^T", precision="fp8", fc_writes_codes=1)]
    assert [len(layers) for layers in found] == [12] * 4  # one a layer
    plain_gemm, cast, fused_gemm, transpose = (layers[0] for layers in found)
    assert (cast.bytes, transpose.bytes) == (n * 4, n * 2)
    assert fused_gemm.bytes == plain_gemm.bytes + n and fused_gemm.flops == plain_gemm.flops
    assert kernels("gelu+fp8 cast fwd", "", precision="fp8", fc_writes_codes=1) == []
    assert kernels("matmul fc fwd", "", precision="fp8", fc_writes_codes=1) == []
    plain = fm.Run(precision="fp8", **SMALL)
    fused = dataclasses.replace(plain, fc_writes_codes=1)
    others = lambda run: sorted((k.region, k.what, k.bytes) for k in fm.step_kernels(run)  # noqa: E731
                                if k.region not in ("matmul fc fwd", "gelu+fp8 cast fwd", "matmul fc+gelu fp8 codes fwd",
                                                    "fp8 transpose gelu out"))
    assert others(plain) == others(fused)
    for bad in (dict(precision="bf16"), dict(precision="fp8", recipe="current"), dict(precision="fp8", recipe="block"),
                dict(precision="fp8", recompute=1)):
        with pytest.raises(fm.CliError, match=r"^fc writes codes \(-fe 1\): needs FP8, the delayed recipe and -r 0"):
            fm.step_kernels(fm.Run(**dict(SMALL, fc_writes_codes=1, **bad)))


@pytest.mark.parametrize("recipe", fm.RECIPES)
@pytest.mark.parametrize("recompute", [0, 2])
def test_attproj_in_bf16(recipe, recompute):
    """-f8 qkv,fc,fcproj: attproj's GEMMs as a bf16 run's, no cast of the attention output (nor its -r 2 replay), no
    cast of attproj's output gradient (layernorm backward still sums its bias) and no weight cast of attprojw; every
    other kernel is the all-FP8 run's. A subset the model does not follow is refused in one line"""
    fp8 = fm.Run(model="d12", B=4, T=1024, precision="fp8", recipe=recipe, recompute=recompute)
    mixed = dataclasses.replace(fp8, fp8_block_linears="qkv,fc,fcproj")
    bf16 = fm.Run(model="d12", B=4, T=1024, recompute=recompute)
    attproj_regions = ("matmul attproj fwd", "matmul attproj bwd")
    in_region = lambda run, regions: [k for k in fm.step_kernels(run) if k.region in regions]  # noqa: E731
    assert in_region(mixed, attproj_regions) == in_region(bf16, attproj_regions)
    assert in_region(mixed, ("fp8 cast attention out", "fp8 cast attention out recompute")) == []
    assert [k.what for k in in_region(fp8, ("fp8 cast attention out",))] == ["attention output -> %s of attproj" % (
        "x" if recompute == 2 else "x, x^T")] * 12
    casts = [k.what for k in in_region(mixed, ("fp8 weight casts",))]
    assert len(casts) == 3 and not any("attprojw" in what for what in casts), casts
    others = lambda run: [k for k in fm.step_kernels(run) if k.region not in attproj_regions + (  # noqa: E731
        "fp8 cast attention out", "fp8 cast attention out recompute", "fp8 weight casts", "adamw")]
    assert others(mixed) == others(fp8)
    assert "-f8 qkv,fc,fcproj" in fm.run_label(mixed) and "-f8" not in fm.run_label(fp8)
    with pytest.raises(fm.CliError, match=r"^FP8 block linears 'qkv,attproj,fc': the model follows "):
        fm.step_kernels(dataclasses.replace(fp8, fp8_block_linears="qkv,attproj,fc"))


@pytest.mark.parametrize("recipe", ["delayed", "current"])
@pytest.mark.parametrize("gelu_fusion", [1, 2])
def test_pow2_gradient_scaling_is_delayeds_one_pass_where_no_layernorm_took_dys_amax(recipe, gelu_fusion):
    """-fg pow2 casts dy in one tile pass with the last use's scale (a prediction the floor takes to hold: the recast
    where dy's amax crossed a power of two is not modeled): qkv's and fc's dy passes are -fg delayed's, byte for byte.
    attproj's and fcproj's dy come with their amax and bias sums from layernorm backward (gpt2_layernorm_dinp_uses), as
    under -fg current, so their cast is current's, which reads no bias partials: the step moves delayed's bytes less
    those partials (fp32 per 128 rows, C columns, two linears a layer)"""
    L = 12

    def dy_passes(grad_scaling, linear):
        return [(k.what, k.bytes) for k in kernels(f"matmul {linear} bwd", f"{linear} dy", precision="fp8", recipe=recipe,
                                                   grad_scaling=grad_scaling, gelu_fusion=gelu_fusion)]
    for linear in ("qkv", "fc"):
        pow2, delayed = dy_passes("pow2", linear), dy_passes("delayed", linear)
        assert len(pow2) == len(delayed) == L and "pow2 (predicted scale) cast" in pow2[0][0], pow2[0]
        assert [b for _, b in pow2] == [b for _, b in delayed] and [w.replace("pow2 (predicted scale)", "delayed")
                                                                   for w, _ in pow2] == [w for w, _ in delayed]
    for linear in ("attproj", "fcproj"):
        assert dy_passes("pow2", linear) == dy_passes("current", linear)
        assert [w for w, _ in dy_passes("pow2", linear)] == [f"{linear} dy: cast to dy, dy^T (amax and bias from layernorm backward)"] * L

    def step(grad_scaling):
        return fm.step_kernels(fm.Run(**dict(SMALL, precision="fp8", recipe=recipe, grad_scaling=grad_scaling,
                                             gelu_fusion=gelu_fusion)))
    pow2, delayed = step("pow2"), step("delayed")
    assert {k.region for k in pow2} == {k.region for k in delayed}
    assert sum(k.bytes for k in pow2) == pytest.approx(sum(k.bytes for k in delayed) - L * 2 * N * C * 4 / 128, rel=1e-12)
    assert sum(k.flops for k in pow2) == sum(k.flops for k in delayed)
    # at d12 B=64: the partials' time at the bandwidth (the casts are memory-bound) under delayed's, below current's
    d12 = dict(model="d12", B=64, precision="fp8", recipe=recipe, gelu_fusion=gelu_fusion)
    floors = {g: fm.step_floor_ms(fm.Run(**d12, grad_scaling=g), H100) for g in fm.GRAD_SCALINGS}
    partials_ms = L * 2 * (64 * 1024) * C * 4 / 128 / H100.bandwidth * 1e3
    assert floors["delayed"] - floors["pow2"] == pytest.approx(partials_ms, rel=1e-6), floors
    assert floors["pow2"] < floors["current"], floors


def test_pow2_and_delayed_gradient_scaling_need_a_per_tensor_recipe(capsys):
    """the trainer refuses -fg delayed and -fg pow2 with -fr block (its 1x128 tiles are cast in one pass already):
    so does the model, in one line, and the run's label names the -fg it models"""
    for grad_scaling in ("delayed", "pow2"):
        with pytest.raises(fm.CliError, match=rf"^gradient scaling '{grad_scaling}' needs a per-tensor recipe \(the "
                                              rf"trainer refuses -fg {grad_scaling} with -fr block\)$"):
            fm.step_kernels(fm.Run(precision="fp8", recipe="block", grad_scaling=grad_scaling))
        assert fm.main(["--precision", "fp8", "--recipe", "block", "--grad-scaling", grad_scaling]) == 2
        out, err = capsys.readouterr()
        assert out == "" and err == f"floor_model.py: error: gradient scaling '{grad_scaling}' needs a per-tensor recipe " \
                                    f"(the trainer refuses -fg {grad_scaling} with -fr block)\n", err
        assert fm.main(["--precision", "fp8", "--grad-scaling", grad_scaling, "-b", "8"]) == 0
        assert f"**d12 fp8 delayed -fw current -fg {grad_scaling} adamw**, B=8 T=1024" in capsys.readouterr().out
    assert fm.main(["--precision", "fp8", "--grad-scaling", "pow3"]) == 2
    assert capsys.readouterr().err == \
        "floor_model.py: error: gradient scaling 'pow3': expected one of current, delayed, pow2\n"
    assert fm.main(["--precision", "fp8", "-b", "8"]) == 0  # -fg current, the default, is not named
    assert "**d12 fp8 delayed -fw current adamw**" in capsys.readouterr().out


@pytest.mark.parametrize("optimizer, master, persistent", [
    ("adamw", True, 16.0), ("adamw", False, 12.0),
    ("adamw8", True, 8 + 2 + 8 / 256), ("adamw8", False, 4 + 2 + 8 / 256),  # DESIGN.md section 4: 10.03, 6.03
])
def test_optimizer_traffic_from_the_persistent_bytes(optimizer, master, persistent):
    """persistent bytes per parameter = bf16 weight 2 + gradient 2 + the rest (states, master); the
    update reads the gradient, reads and writes the rest, and writes the bf16 weight (reads it too
    without a master). adamw8's figures hold for its 8-bit tensors (d12: the four matmul weights);
    the others keep AdamW's fp32 states"""
    def traffic(p):
        return 2 * (p - 4) + 2 + (2 if master else 4)

    shape = fm.scaling_model.model_shape("d12")
    eight_bit = shape.matmul_elements if optimizer == "adamw8" else 0
    adamw = 16.0 if master else 12.0
    expected = eight_bit * traffic(persistent) + (shape.num_parameters - eight_bit) * traffic(adamw)
    for precision, weight_scaling in (("bf16", "current"), ("fp8", "current"), ("fp8", "delayed")):
        [update] = kernels(optimizer, "", precision=precision, weight_scaling=weight_scaling, optimizer=optimizer,
                           master=master)
        codes = shape.matmul_elements if weight_scaling == "delayed" and precision == "fp8" else 0  # -fw delayed writes W
        assert update.bytes == pytest.approx(expected + codes, rel=1e-12)


def test_fp8_weight_casts_by_where_each_weight_is_cast():
    """the block linears' weights: -fw current reads the master once and writes W and W^T, -fw delayed only
    transposes the codes the update wrote (and the update writes them, with lm_head's not among them); lm_head's is
    cast after the update from the bf16 wte under either -fw, an amax pass and the cast (one read for the block
    recipe's tiles)"""
    shape = fm.scaling_model.model_shape("d12")
    wte = shape.tensor_sizes["wte"]
    for weight_scaling, recipe in (("current", "delayed"), ("delayed", "delayed"), ("current", "block")):
        run = dict(precision="fp8", recipe=recipe, weight_scaling=weight_scaling, lm_head="fp8")
        casts = {k.what: k.bytes for k in kernels("fp8 weight casts", "", **run)}
        reads = 1 if recipe == "block" else 2
        assert casts.pop(f"wte -> lm_head's W, W^T from bf16 ({reads} read{'s' if reads > 1 else ''})") == wte * (reads * 2 + 2)
        block = shape.matmul_elements * (2 if weight_scaling == "delayed" else 4 + 2)
        assert sum(casts.values()) == block, casts
        [with_head] = kernels("adamw", "", **run)
        [without_head] = kernels("adamw", "", **dict(run, lm_head="bf16"))
        assert with_head.bytes == without_head.bytes  # the update writes no lm_head codes


def test_fp8_gemms_move_fewer_bytes_and_floors_are_consistent():
    def gemms(run):
        return [k for k in fm.step_kernels(run) if k.kind == "gemm"]

    bf16 = gemms(fm.Run(gelu_fusion=0, **SMALL))  # fc's forward is then marked as in FP8
    for recipe in fm.RECIPES:
        fp8 = gemms(fm.Run(precision="fp8", recipe=recipe, lm_head="fp8", **SMALL))
        assert [(k.region, k.what) for k in bf16] == [(k.region, k.what) for k in fp8]
        assert all(f.bytes < b.bytes and f.rate == "fp8" and b.rate == "bf16" for b, f in zip(bf16, fp8))
    for run in all_runs(model="d24", B=4, T=1024):
        ks = fm.step_kernels(run)
        assert all(k.floor_s(H100) > 0 and k.floor_s(H200) <= k.floor_s(H100) for k in ks)
        assert fm.step_floor_ms(run, H200) <= fm.step_floor_ms(run, H100)
        regions = fm.region_floors(ks, H100)
        assert sum(ms for ms, _, _, _ in regions.values()) == pytest.approx(fm.step_floor_ms(run, H100))


def test_current_scaling_costs_more_than_delayed_and_recompute_adds_work():
    def floor(**run):
        return fm.step_floor_ms(fm.Run(**dict(dict(model="d12", B=64), **run)), H100)
    assert floor(precision="fp8", recipe="current") > floor(precision="fp8", recipe="delayed")
    assert floor(recompute=2) > floor(recompute=1) > floor(recompute=0)
    assert floor(precision="fp8", recompute=2) > floor(precision="fp8", recompute=1) > floor(precision="fp8")
    assert floor(precision="fp8", weight_scaling="delayed") < floor(precision="fp8", weight_scaling="current")


@pytest.mark.parametrize("recipe", fm.RECIPES)
def test_fp8_recompute_moves_the_x_t_writes_into_replays(recipe):
    """-r in an FP8 block: the forward's casts write no x^T of the recast linears, and the backward casts each again
    from what the forward cast it from (the bytes of x^T move, not grow): per layer and token, -r 1 reads fcproj's
    4C bf16 pre-activation once more, -r 2 also C bf16 each for qkv's, attproj's and fc's inputs and the two
    layernorms' mean and rstd. The regions where they are charged: -kt 1's "gelu recompute" (-r 1), "layernorm
    recompute" and "fp8 cast attention out recompute" (-r 2)"""
    L, C, N = 12, 768, 64 * 1024

    def kernels(r):
        return fm.step_kernels(fm.Run(model="d12", B=64, precision="fp8", recipe=recipe, recompute=r))
    moved = {r: sum(k.bytes for k in kernels(r)) for r in (0, 1, 2)}
    assert moved[1] - moved[0] == pytest.approx(L * N * 4 * C * 2)
    assert moved[2] - moved[1] == pytest.approx(L * N * (3 * C * 2 + 2 * 2 * 4))
    regions = {r: {k.region for k in kernels(r)} for r in (0, 1, 2)}
    assert regions[1] - regions[0] == {"gelu recompute"}
    assert regions[2] - regions[1] == {"layernorm recompute", "fp8 cast attention out recompute"}


def test_comparison_table_splits_gemms_attention_and_the_rest():
    runs = [fm.Run(), fm.Run(precision="fp8")]
    lines = fm.comparison_table(runs, H100).splitlines()
    assert lines[0] == "| run | B | floor ms | tok/s at most | GEMMs ms | attention ms | rest ms | ceiling over the first |"
    for line, run in zip(lines[2:], runs):
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert float(cells[2]) == pytest.approx(float(cells[4]) + float(cells[5]) + float(cells[6]), abs=0.02)
        assert float(cells[2]) == pytest.approx(fm.step_floor_ms(run, H100), abs=0.005)
    assert lines[2].endswith("| 1.000x |")


@pytest.mark.parametrize("argv", [
    ["--model", "d13"], ["--recipe", "fast"], ["--precision", "fp16"], ["-b", "0"], ["-b", "x"], ["-t", "2048"],
    ["-r", "3"], ["--gelu-fusion", "3"], ["--bf16-tflops", "0"], ["--bandwidth", "-1"], ["--device", "a100"], ["--bench", "/nonexistent.json"],
])
def test_cli_errors_are_one_line_and_exit_2(argv, capsys):
    assert fm.main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1 and err.startswith("floor_model.py: error: "), err


def test_cli_rejects_a_json_that_is_not_a_bench_file(tmp_path, capsys):
    for content in ("{}", "[1, 2]", "not json", json.dumps([{"benchmark": "gemm"}])):
        path = tmp_path / "bad.json"
        path.write_text(content)
        assert fm.main(["--bench", str(path)]) == 2
        assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_cli_tables(capsys):
    assert fm.main(["--model", "d12", "-b", "8", "--kernels", "3"]) == 0
    out = capsys.readouterr().out
    assert "**d12 bf16 adamw**, B=8 T=1024 -r 0: floor" in out and "**d12 fp8 delayed -fw current adamw**" in out
    assert out.count("Largest kernels of") == 2 and "| ceiling over the first |" in out
    assert fm.main(["--precision", "fp8", "--device", "h200", "--bandwidth", "2"]) == 0
    assert "on the H200 SXM (given ceilings)" in capsys.readouterr().out


def test_bench_mode_prints_measured_against_floor(tmp_path, capsys):
    measured = [("matmul lm_head bwd", 12.5), ("encoder fwd", 0.25), ("gradient reduce (exposed)", 0.01)]
    record = {"benchmark": "train", "model": "d12", "precision": "bf16", "recipe": "-", "optimizer": "adamw",
              "weight_scaling": "-", "lm_head": "-", "master_weights": True, "B": 64, "T": 1024, "recompute": 0,
              "ms_per_step": 150.0, "command": "./train_gpt2_fp8 -e d12", "kernel_breakdown": breakdown_text(measured)}
    failed = {"benchmark": "train", "model": "d48", "precision": "fp8", "error": "out of memory"}
    path = tmp_path / "bench.json"
    path.write_text(json.dumps([record, failed, {"benchmark": "gemm", "model": "d12"}]))
    assert fm.main(["--bench", str(path)]) == 0
    out = capsys.readouterr().out
    regions = fm.region_floors(fm.step_kernels(fm.run_from_record(record)), H100)
    for name, ms in measured[:2]:
        floor = regions[name][0]
        assert re.search(rf"^\| {re.escape(name)} \| .* \| {floor:.3f} \| {ms:.3f} \| {ms / floor:.2f}x \|$", out, re.M), name
    assert re.search(r"^\| classifier \| .* \| - \| - \|$", out, re.M)  # no measured row: the floor alone
    assert "Measured rows with no floor here: gradient reduce (exposed) 0.010 ms" in out  # a multi-GPU mark
    assert "measured 150.00 ms per step in all" in out and "d48" not in out


@pytest.mark.parametrize("gpu_name,key", [("NVIDIA H100 80GB HBM3", "h100"), ("NVIDIA H200", "h200"),
                                          ("NVIDIA H100 PCIe", "h100-pcie"), ("NVIDIA H100 NVL", "h100-nvl"),
                                          ("NVIDIA H200 NVL", "h200-nvl")])
def test_device_ceilings_by_gpu_name(gpu_name, key):
    """the PCIe and NVL cards get their own datasheet ceilings (an H100 PCIe had the SXM's 989 TFLOP/s and 3.35 TB/s),
    with the dense bf16 peak the trainer's MFU uses for the same name"""
    device = fm.device_for_gpu(gpu_name)
    assert device == fm.DEVICES[key]
    peaks = {"h100": 989e12, "h200": 989e12, "h100-pcie": 756e12, "h100-nvl": 835e12, "h200-nvl": 835e12}
    assert device.bf16_flops == peaks[key] and device.fp8_flops >= 2 * device.bf16_flops - 1e12
