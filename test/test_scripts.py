"""
The run scripts (scripts/run_gpt2_<size>_<precision>.sh) and scripts/compare_bf16_fp8.sh,
run end to end with the CPU trainer (LLM8_TRAINER=./train_gpt2cpu, which shares the GPU
trainer's flag table) on the tiny model: every flag a script passes must parse and pass its
range check (the test's flags come last and only shrink the run: model, data, batch, steps),
an FP8 script must train in FP8, and the comparison must train bf16 and each FP8 recipe asked
for, then write the PNG and one table row per run.
"""
import glob
import os
import re
import subprocess

import pytest

from test_trainer_cli import data  # noqa: F401 (the fixture: a small train/val split)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CPU = os.path.join(ROOT, "train_gpt2cpu")
RUN_SCRIPTS = sorted(os.path.basename(p) for p in glob.glob(os.path.join(ROOT, "scripts", "run_gpt2_*_*.sh")))


def run_script(script, args, env_extra, timeout=300):
    if not os.path.exists(CPU):
        pytest.fail(f"{CPU} is not built (make train_gpt2cpu)")
    env = dict(os.environ, LLM8_TRAINER=CPU, **env_extra)
    return subprocess.run(["bash", os.path.join(ROOT, "scripts", script)] + [str(a) for a in args],
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env)


def test_every_size_and_precision_has_a_script():
    assert RUN_SCRIPTS == [f"run_gpt2_{size}_{p}.sh" for size in ("124M", "1558M", "350M", "774M") for p in ("bf16", "fp8")]


@pytest.mark.parametrize("script", RUN_SCRIPTS)
def test_run_script_flags_parse_and_train(script, data, tmp_path):
    shrink = ["-e", "tiny", "-i", data / "d_train_*.bin", "-j", data / "d_val_*.bin", "-b", 2, "-t", 32, "-d", 64,
              "-x", 2, "-u", 1, "-h", 0, "-v", 0, "-m", 2]
    result = run_script(script, shrink, {"OUT_DIR": str(tmp_path / "run")})
    assert result.returncode == 0, result.stderr[-2000:]
    assert re.findall(r"^step\s+(\d+)/2 ", result.stdout, re.M) == ["1", "2"], result.stdout[-2000:]
    precision = re.search(r"^precision (\S+)", result.stdout, re.M)
    assert precision is not None and (precision.group(1) == "fp8") == script.endswith("_fp8.sh"), result.stdout[:500]


def test_compare_trains_bf16_and_each_recipe(data, tmp_path):
    out = tmp_path / "cmp"
    result = run_script("compare_bf16_fp8.sh",
                        ["-b", 2, "-t", 32, "-u", 1, "-i", data / "d_train_*.bin", "-j", data / "d_val_*.bin", "-v", 2,
                         "-m", 2, "-n", 0],
                        {"MODEL": "tiny", "STEPS": "4", "RECIPES": "delayed block", "OUT": str(out)})
    assert result.returncode == 0, result.stderr[-2000:]
    recipes = re.findall(r"^precision fp8 emulated, recipe (\w+)", result.stdout, re.M)
    assert recipes == ["delayed", "block"], result.stdout[-3000:]
    table = result.stdout.split("| run | step | final val loss |")[-1]
    rows = re.findall(r"^\| (bf16|fp8_\w+) \| 4 \| ([\d.]+) \|", table, re.M)
    assert [r for r, _ in rows] == ["bf16", "fp8_delayed", "fp8_block"], result.stdout[-2000:]
    assert (out / "loss.png").stat().st_size > 0


def test_compare_trains_each_optimizer(data, tmp_path):
    """OPTIMIZERS="adamw adamw8": every precision with both optimizers; adamw8 rows set against their fp32 AdamW run"""
    out = tmp_path / "cmp"
    result = run_script("compare_bf16_fp8.sh",
                        ["-b", 2, "-t", 32, "-u", 1, "-i", data / "d_train_*.bin", "-j", data / "d_val_*.bin", "-v", 2,
                         "-m", 2, "-n", 0],
                        {"MODEL": "tiny", "STEPS": "4", "RECIPES": "delayed", "OPTIMIZERS": "adamw adamw8", "OUT": str(out)})
    assert result.returncode == 0, result.stderr[-2000:]
    optimizers = re.findall(r"^precision .* \| optimizer (\w+)", result.stdout, re.M)
    assert optimizers == ["adamw", "adamw8", "adamw", "adamw8"], result.stdout[-3000:]
    table = (out / "summary.md").read_text()
    assert table in result.stdout
    rows = {r[0]: r for r in re.findall(r"^\| (\w+) \| 4 \| ([\d.]+) \| ([-+\d.%]+) \| ([-+\d.%]+) \|", table, re.M)}
    assert list(rows) == ["bf16", "bf16_adamw8", "fp8_delayed", "fp8_delayed_adamw8"], table
    assert rows["bf16"][2] == "+0.00%" and rows["bf16"][3] == "-" and rows["fp8_delayed"][3] == "-"
    for run, baseline in (("bf16_adamw8", "bf16"), ("fp8_delayed_adamw8", "fp8_delayed")):
        expected = 100 * (float(rows[run][1]) / float(rows[baseline][1]) - 1)
        assert rows[run][3] == f"{expected:+.2f}%", (run, table)


def test_compare_refuses_an_unknown_optimizer(tmp_path):
    result = run_script("compare_bf16_fp8.sh", [], {"OPTIMIZERS": "adamw sgd", "OUT": str(tmp_path / "cmp")})
    assert result.returncode != 0
    assert result.stderr.strip().splitlines() == ["error: OPTIMIZERS: 'sgd' is not an optimizer (expected adamw or adamw8)"]


def test_compare_refuses_an_unknown_recipe(tmp_path):
    result = run_script("compare_bf16_fp8.sh", [], {"RECIPES": "delayed fast", "OUT": str(tmp_path / "cmp")})
    assert result.returncode != 0
    assert result.stderr.strip().splitlines() == [
        "error: RECIPES: 'fast' is not an FP8 recipe (expected delayed, current or block)"]
