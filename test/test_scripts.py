"""
The run scripts (scripts/run_gpt2_<size>_<precision>.sh), scripts/compare_bf16_fp8.sh and
dev/gpu_session.sh's parity stage (which drives it on the GPU),
run end to end with the CPU trainer (LLM8_TRAINER=./train_gpt2cpu, which shares the GPU
trainer's flag table) on the tiny model: every flag a script passes must parse and pass its
range check (the test's flags come last and only shrink the run: model, data, batch, steps),
an FP8 script must train in FP8, and the comparison must train bf16 and each FP8 recipe asked
for, then write the PNG and one table row per run. The comparison's own checks (the settings a
run directory records, the extra arguments it refuses, the table at the last shared val step, a
failed plot) run it with a stand-in trainer that writes main.jsonl at once (FAKE_TRAINER).

scripts/quickstart.sh, the README's first command, runs whole in a checkout of links to this
one (its own dev/data, where the corpus goes, and its own root, where the logs go), so it
changes nothing here: without a GPU it trains the tiny model with train_gpt2cpu; with one
(a stub nvidia-smi and make) it runs its d12 command line on the cudasim trainer, shrunk the
same way.
"""
import glob
import os
import re
import subprocess
import sys
import tarfile

import pytest

from test_trainer_cli import data, random_tokens, small_vocab_model, write_shard  # noqa: F401 (data: the fixture, a small train/val split)
from fuzz_inputs import write_tokenizer
from test_bench_main import fake_tool

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


@pytest.mark.parametrize("script, hint", [
    ("run_gpt2_124M_fp8.sh", "python3 dev/data/fineweb.py --version 10B"),
    ("run_gpt2_350M_bf16.sh", "python3 dev/data/fineweb.py --version 100B"),
    ("run_gpt2_1558M_bf16.sh", "python3 dev/data/fineweb.py --type edu --version 100B"),
])
def test_run_script_without_its_data_says_how_to_make_it_before_building(script, hint, data, tmp_path):
    """a run script whose shards (or HellaSwag file, -h 1) are not there stops with one line naming the command that
    makes them, before make builds the trainer (minutes in a fresh checkout) only for the trainer to refuse them"""
    stubs = tmp_path / "bin"
    stubs.mkdir()
    (stubs / "make").write_text('#!/bin/sh\necho "$@" >> "%s"\nexit 1\n' % (tmp_path / "make.log"))
    (stubs / "make").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "LLM8_TRAINER"}
    env.update(PATH="%s:%s" % (stubs, os.environ["PATH"]), OUT_DIR=str(tmp_path / "run"))
    for args, named in [([], "no train shards match -i"),
                        (["-i", str(data / "d_train_*.bin")], "-h 1 needs dev/data/hellaswag/hellaswag_val.bin")]:
        if named.startswith("-h") and os.path.exists(os.path.join(ROOT, "dev", "data", "hellaswag", "hellaswag_val.bin")):
            continue   # this checkout has HellaSwag's file
        result = subprocess.run(["bash", os.path.join(ROOT, "scripts", script)] + args, capture_output=True, text=True,
                                timeout=60, cwd=ROOT, env=env)
        errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
        assert result.returncode == 1 and len(errors) == 1 and named in errors[0], result.stderr
        assert (hint if not args else "python3 dev/data/hellaswag.py") in errors[0], errors
        assert not (tmp_path / "make.log").exists()
        assert not (tmp_path / "run").exists()


def test_compare_trains_bf16_and_each_recipe(data, tmp_path):
    """-n 2 over 4 steps: checkpoints at steps 2 and 4, of which the script's -nk 1 keeps only the newest (a d12
    checkpoint is about 1.7 GB: keeping every one filled a 64 GB disk), and a rerun resumes from it"""
    out, model = tmp_path / "cmp", str(small_vocab_model(data))
    result = run_script("compare_bf16_fp8.sh",
                        ["-b", 2, "-t", 32, "-i", data / "d_train_*.bin", "-j", data / "d_val_*.bin", "-v", 2,
                         "-m", 2, "-n", 2],
                        {"MODEL": model, "STEPS": "4", "WARMUP": "1", "RECIPES": "delayed block+lm_head", "OUT": str(out)})
    assert result.returncode == 0, result.stderr[-2000:]
    fp8_runs = re.findall(r"^precision fp8 emulated, recipe (\w+),(.*)\| optimizer", result.stdout, re.M)
    assert [recipe for recipe, _ in fp8_runs] == ["delayed", "block"], result.stdout[-3000:]
    assert ["lm_head=fwd,dgrad,wgrad" in passes for _, passes in fp8_runs] == [False, True], fp8_runs  # +lm_head: -f8 all
    table = result.stdout.split("| run | step | val loss |")[-1]
    rows = re.findall(r"^\| (bf16|fp8_\w+) \| 4 \| ([\d.]+) \|", table, re.M)
    assert [r for r, _ in rows] == ["bf16", "fp8_delayed", "fp8_block_lm_head"], result.stdout[-2000:]
    assert (out / "loss.png").stat().st_size > 0
    for run, _ in rows:
        checkpoints = sorted(name for name in os.listdir(out / run) if re.match(r"(model|state|DONE)_", name))
        assert checkpoints == ["DONE_00000004", "model_00000004.bin", "state_00000004_00000.bin"], (run, checkpoints)

    # run again on the same OUT: every run is complete (checkpointed at its last step), so each resumes
    # there and the table is the same
    again = run_script("compare_bf16_fp8.sh",
                       ["-b", 2, "-t", 32, "-i", data / "d_train_*.bin", "-j", data / "d_val_*.bin", "-v", 2,
                        "-m", 2, "-n", 2],
                       {"MODEL": model, "STEPS": "4", "WARMUP": "1", "RECIPES": "delayed block+lm_head", "OUT": str(out)})
    assert again.returncode == 0, again.stderr[-2000:]
    assert again.stdout.count("resumed from") == 3, again.stdout[-3000:]
    assert re.findall(r"^\| (bf16|fp8_\w+) \| 4 \| ([\d.]+) \|", again.stdout.split("| run | step |")[-1], re.M) == rows


def test_compare_trains_each_optimizer(data, tmp_path):
    """OPTIMIZERS="adamw adamw8": every precision with both optimizers; adamw8 rows set against their fp32 AdamW run.
    No -u: the script's warmup is a tenth of a run shorter than 2000 steps (its 200 failed any run under 200 steps)"""
    out = tmp_path / "cmp"
    result = run_script("compare_bf16_fp8.sh",
                        ["-b", 2, "-t", 32, "-i", data / "d_train_*.bin", "-j", data / "d_val_*.bin", "-v", 2,
                         "-m", 2, "-n", 0],
                        {"MODEL": str(small_vocab_model(data)), "STEPS": "4", "RECIPES": "delayed", "OPTIMIZERS": "adamw adamw8", "OUT": str(out)})
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
        "error: RECIPES: 'fast' is not an FP8 recipe (expected delayed, current or block, optionally followed by "
        "+lm_head, +fg_delayed or +fg_pow2, and +fc_codes, in any order, each at most once)"]


def test_compare_fg_delayed_option_in_any_order(data, tmp_path):
    """+fg_delayed passes -fg delayed; the run name puts _lm_head before _fg_delayed whatever the order written,
    so a second call with the options the other way round resumes the same (finished) run with the same flags"""
    out = tmp_path / "cmp"
    args = ["-b", 2, "-t", 32, "-i", data / "d_train_*.bin", "-j", data / "d_val_*.bin", "-v", 2, "-m", 2, "-n", 2]
    env = {"MODEL": str(small_vocab_model(data)), "STEPS": "2", "WARMUP": "1", "OUT": str(out)}
    result = run_script("compare_bf16_fp8.sh", args, dict(env, RECIPES="delayed+fg_delayed delayed+fg_delayed+lm_head"))
    assert result.returncode == 0, result.stderr[-2000:]
    rows = re.findall(r"^\| (\w+) \| 2 \|", (out / "summary.md").read_text(), re.M)
    assert rows == ["bf16", "fp8_delayed_fg_delayed", "fp8_delayed_lm_head_fg_delayed"], result.stdout[-2000:]
    # the trainer's startup lines, one per FP8 run in run order: both -fg delayed, the second -f8 all too
    fp8_runs = re.findall(r"^precision fp8 emulated, recipe delayed, weights \w+, gradients (\w+), passes (.*)\| optimizer",
                          result.stdout, re.M)
    assert [grads for grads, _ in fp8_runs] == ["delayed", "delayed"], result.stdout[-3000:]
    assert ["lm_head=fwd,dgrad,wgrad" in passes for _, passes in fp8_runs] == [False, True], fp8_runs

    # the trainer refuses to resume a run with other FP8 flags, so this resume also shows the flags are the same
    again = run_script("compare_bf16_fp8.sh", args, dict(env, RECIPES="delayed+lm_head+fg_delayed"))
    assert again.returncode == 0, again.stderr[-2000:]
    assert again.stdout.count("resumed from") == 2, again.stdout[-3000:]  # bf16 and fp8_delayed_lm_head_fg_delayed
    assert re.findall(r"^\| (\w+) \| 2 \|", (out / "summary.md").read_text(), re.M) == [
        "bf16", "fp8_delayed_lm_head_fg_delayed"]


def test_compare_fg_pow2_option(data, tmp_path):
    """+fg_pow2 passes -fg pow2 (the trainer's startup line says so) and names the run _fg_pow2, after _lm_head
    whatever the order written"""
    out = tmp_path / "cmp"
    args = ["-b", 2, "-t", 32, "-i", data / "d_train_*.bin", "-j", data / "d_val_*.bin", "-v", 2, "-m", 2, "-n", 2]
    result = run_script("compare_bf16_fp8.sh", args, {"MODEL": str(small_vocab_model(data)), "STEPS": "2", "WARMUP": "1", "OUT": str(out),
                                                      "RECIPES": "current+fg_pow2+lm_head delayed+fg_pow2"})
    assert result.returncode == 0, result.stderr[-2000:]
    rows = re.findall(r"^\| (\w+) \| 2 \|", (out / "summary.md").read_text(), re.M)
    assert rows == ["bf16", "fp8_current_lm_head_fg_pow2", "fp8_delayed_fg_pow2"], result.stdout[-2000:]
    fp8_runs = re.findall(r"^precision fp8 emulated, recipe (\w+), weights \w+, gradients (\w+), passes (.*)\| optimizer",
                          result.stdout, re.M)
    assert [(recipe, grads) for recipe, grads, _ in fp8_runs] == [("current", "pow2"), ("delayed", "pow2")], \
        result.stdout[-3000:]
    assert ["lm_head=fwd,dgrad,wgrad" in passes for _, _, passes in fp8_runs] == [True, False], fp8_runs


def compare_refusal(item, tmp_path):
    """compare_bf16_fp8.sh with RECIPES "delayed ITEM": refused (exit 2) before any run (no OUT); its stderr lines"""
    result = run_script("compare_bf16_fp8.sh", [], {"RECIPES": f"delayed {item}", "OUT": str(tmp_path / "cmp")})
    assert result.returncode == 2 and not (tmp_path / "cmp").exists()
    return result.stderr.strip().splitlines()


@pytest.mark.parametrize("item,reason", [
    ("delayed+fp4", "unknown option '+fp4'"),
    ("current+fg_delayed+lm_head+fg_delayed", "option '+fg_delayed' given twice"),
    ("delayed+fg_pow2+fg_pow2", "option '+fg_pow2' given twice"),
    ("delayed+fg_pow3", "unknown option '+fg_pow3'"),
    ("delayed+", "unknown option '+'"),
])
def test_compare_refuses_a_bad_recipe_option(item, reason, tmp_path):
    assert compare_refusal(item, tmp_path) == [
        f"error: RECIPES: '{item}': {reason} (accepted: +lm_head, +fg_delayed or +fg_pow2, and +fc_codes, in any order, "
        "each at most once)"]


@pytest.mark.parametrize("item,grads", [("block+fg_delayed", "delayed"), ("block+fg_delayed+lm_head", "delayed"),
                                        ("block+fg_pow2", "pow2"), ("block+lm_head+fg_pow2", "pow2")])
def test_compare_refuses_block_with_fg_delayed_or_pow2(item, grads, tmp_path):
    """the trainer refuses -fg delayed and -fg pow2 with -fr block: the script says so before any run"""
    assert compare_refusal(item, tmp_path) == [
        f"error: RECIPES: '{item}': the trainer refuses -fg {grads} with -fr block (its 1x128 gradient tiles are "
        f"cast in one pass already); use +fg_{grads} with delayed or current"]


@pytest.mark.parametrize("item,recipe", [("current+fc_codes", "current"), ("block+lm_head+fc_codes", "block")])
def test_compare_refuses_fc_codes_but_with_delayed(item, recipe, tmp_path):
    """the trainer refuses -fe 1 with -fr current and block: the script says so before any run"""
    assert compare_refusal(item, tmp_path) == [
        f"error: RECIPES: '{item}': the trainer refuses -fe 1 with -fr {recipe} (fc's GEMM writes the codes under a scale "
        "known before it runs, the delayed recipe's); use +fc_codes with delayed"]


@pytest.mark.parametrize("item", ["delayed+fg_delayed+fg_pow2", "current+fg_pow2+lm_head+fg_delayed",
                                  "block+fg_pow2+fg_delayed"])
def test_compare_refuses_fg_delayed_with_fg_pow2(item, tmp_path):
    """+fg_delayed and +fg_pow2 are the same flag (-fg) with two values: one item takes one of them, said in one line
    before any run (the block recipe's refusal of either comes after)"""
    assert compare_refusal(item, tmp_path) == [
        f"error: RECIPES: '{item}': +fg_delayed and +fg_pow2 both set -fg (one -fg per run): give one of them"]


@pytest.mark.parametrize("args", [["--help"], ["-b", 2, "-h"], ["-h", 1, "--help"]], ids=["--help", "-h", "hellaswag"])
def test_compare_help_prints_its_usage_and_runs_nothing(args, tmp_path):
    """-h/--help among the arguments (not the trainer's -h 1) prints the usage and the script's comment and exits 0,
    running nothing and making no OUT; before, --help went to every run's trainer, which failed after its own usage"""
    out = tmp_path / "cmp"
    result = run_script("compare_bf16_fp8.sh", args, {"OUT": str(out), "MODEL": "tiny", "STEPS": "2"})
    assert result.returncode == 0 and result.stderr == "", result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("usage: [MODEL=d12] [STEPS=2000] [RECIPES=delayed]"), lines[:3]
    assert "Trains the same model in bf16 and in FP8 (once per FP8 scaling recipe asked for), on the" in lines
    assert not out.exists() and "train_gpt2cpu |" not in result.stdout


@pytest.mark.parametrize("script", ["run_gpt2_124M_bf16.sh", "compare_bf16_fp8.sh"])
def test_a_trainer_that_is_not_there_is_one_line(script, tmp_path):
    """LLM8_TRAINER, a relative path taken from where the script starts, names no executable: one line naming it,
    before anything is built or run, not bash's "No such file" from deep in the script"""
    env = dict(os.environ, LLM8_TRAINER="./train_gpt2cpu")  # none in tmp_path
    result = subprocess.run(["bash", os.path.join(ROOT, "scripts", script)], capture_output=True, text=True,
                            timeout=60, cwd=tmp_path, env=env)
    assert result.returncode == 1 and result.stdout == "", (result.stdout, result.stderr)
    assert result.stderr.splitlines() == [f"error: {script}: LLM8_TRAINER={tmp_path}/./train_gpt2cpu is not an executable "
                                          "file (build it first; a relative path is taken from the directory the script "
                                          "starts in)"], result.stderr


def test_every_shell_script_is_executable():
    """the docs run them as `scripts/NAME.sh` (compare_bf16_fp8.sh was mode 644: Permission denied): every script
    under scripts/ with a #! line is executable, in the checkout and in git's index (what a clone gets); a file
    without one is sourced by the others (run_common.sh) and says so on its first line"""
    in_git = subprocess.run(["git", "rev-parse", "--is-inside-work-tree"], capture_output=True, text=True,
                            cwd=ROOT).returncode == 0
    scripts = sorted(glob.glob(os.path.join(ROOT, "scripts", "*.sh")))
    assert "compare_bf16_fp8.sh" in map(os.path.basename, scripts)
    for path in scripts:
        name = os.path.relpath(path, ROOT)
        with open(path) as f:
            first = f.readline()
        if not first.startswith("#!"):
            assert first.startswith("# Sourced by "), f"{name}: no #! line, and its first line does not say what sources it"
            continue
        assert os.access(path, os.X_OK), f"{name} is not executable (chmod +x {name})"
        if in_git:
            staged = subprocess.run(["git", "ls-files", "-s", "--", name], capture_output=True, text=True, cwd=ROOT).stdout
            assert not staged or staged.startswith("100755 "), \
                f"{name} is not executable in git's index (git update-index --chmod=+x {name}): {staged.strip()}"


FAKE_TRAINER = '''
"""a stand-in trainer for compare_bf16_fp8.sh's own logic (no training): parses its flags as the trainer does
(pairs, the later wins), appends each call to -o's calls.log, and writes main.jsonl as the trainer does: train
records (tok_per_s) for steps 0 to -x minus 1, val losses every -v steps and at the last, up to step
$FAKE_STOP_<run name> where it is set (a run cut off there), null (non-finite) from step $FAKE_NAN_<run name> on"""
import json, os, sys
flags = dict(zip(sys.argv[1::2], sys.argv[2::2]))
out, steps, every = flags["-o"], int(flags["-x"]), int(flags["-v"])
run = os.path.basename(out)
os.makedirs(out, exist_ok=True)
with open(os.path.join(out, "calls.log"), "a") as f:
    f.write(" ".join(sys.argv[1:]) + "\\n")
last = int(os.environ.get("FAKE_STOP_" + run, steps))
nan_from = int(os.environ.get("FAKE_NAN_" + run, steps + 1))
offset = 0.01 * len(run)
with open(os.path.join(out, "main.jsonl"), "w") as f:
    for s in range(last + 1):
        if s < steps:
            f.write(json.dumps({"step": s, "type": "train", "loss": 5.0, "tok_per_s": 1000.0 + offset}) + "\\n")
        if s % every == 0 or s == steps:
            loss = round(6.0 - 0.1 * s + offset, 4) if s < nan_from else None
            f.write(json.dumps({"step": s, "type": "val", "loss": loss}) + "\\n")
'''


def fake_compare(tmp_path, args, env_extra, out="cmp"):
    """compare_bf16_fp8.sh (MODEL=tiny STEPS=4 OUT=tmp_path/out RECIPES=delayed unless env_extra says otherwise) with
    the stand-in trainer: seconds, no training"""
    trainer = tmp_path / "fake_trainer.py"
    if not trainer.exists():
        trainer.write_text(f"#!{sys.executable}" + FAKE_TRAINER)
        trainer.chmod(0o755)
    env = dict(os.environ, LLM8_TRAINER=str(trainer), PYTHON=sys.executable, MODEL="tiny", STEPS="4",
               OUT=str(tmp_path / out))
    env.update(env_extra)
    return subprocess.run(["bash", os.path.join(ROOT, "scripts", "compare_bf16_fp8.sh")] + [str(a) for a in args],
                          capture_output=True, text=True, timeout=120, cwd=ROOT, env=env)


def calls(run_dir):
    return (run_dir / "calls.log").read_text().splitlines()


def no_matplotlib(tmp_path):
    """a PYTHONPATH entry on which `import matplotlib` fails, as in a Python without it (scripts/plot.py then ends at
    once: a test not about the PNG saves the second it takes to draw)"""
    path = tmp_path / "no_matplotlib"
    path.mkdir(exist_ok=True)
    (path / "matplotlib.py").write_text("raise ImportError(\"No module named 'matplotlib'\")\n")
    return str(path)


def test_compare_on_several_gpus(tmp_path):
    """NUM_GPUS=2: every run is started through LLM8_LAUNCHER (here a stand-in that logs its arguments and runs the
    trainer once) with -n 2, the table's header says the GPUs, each run directory records NUM_GPUS with its settings
    (a rerun on 1 GPU is refused: -b is per GPU, so the steps would change size), and a NUM_GPUS that is not a count
    is refused before anything runs"""
    launcher = tmp_path / "launcher.sh"
    launcher.write_text("#!/bin/bash\n"
                        "echo \"$LLM8_LAUNCH_COMMAND $*\" >> \"$(dirname \"$0\")/launches.log\"\n"
                        "while [[ \"$1\" != -- ]]; do shift; done; shift\n"
                        "exec \"$@\"\n")
    launcher.chmod(0o755)
    env = {"PYTHONPATH": no_matplotlib(tmp_path), "NUM_GPUS": "2", "LLM8_LAUNCHER": str(launcher)}
    result = fake_compare(tmp_path, ["-v", 2], env)
    assert result.returncode == 0, result.stderr[-2000:]
    launches = (tmp_path / "launches.log").read_text().splitlines()
    assert len(launches) == 2 and all(re.match(r"trainer -n 2 -- \S+fake_trainer.py -e tiny -p ", line) for line in launches), \
        launches
    out = tmp_path / "cmp"
    assert "at B=16 T=1024 on 2 GPUs (tok/s: all of them)" in (out / "summary.md").read_text()
    assert (out / "bf16" / "compare_settings.txt").read_text().endswith(" -v 2 NUM_GPUS=2\n")
    again = fake_compare(tmp_path, ["-v", 2], {"PYTHONPATH": no_matplotlib(tmp_path)})
    assert again.returncode == 2 and "holds a run with other settings" in again.stderr and "NUM_GPUS=2' there" in \
        again.stderr, again.stderr
    for value in ("0", "two", "-1"):
        bad = fake_compare(tmp_path, [], {"NUM_GPUS": value, "OUT": str(tmp_path / "bad")})
        assert bad.returncode == 2 and bad.stderr.splitlines() == [
            f"error: scripts/compare_bf16_fp8.sh: NUM_GPUS='{value}': expected a number of GPUs, 1 or more"], bad.stderr
        assert not (tmp_path / "bad").exists()


def test_compare_refuses_a_run_made_with_other_settings(tmp_path):
    """a second compare into the same OUT with another STEPS, WARMUP or extra argument would resume the old runs
    (-y 1) with the new settings: each run directory records its settings, and a mismatch is refused in one line
    before any run trains; the same settings resume; a run with no record (an older script's) is refused too"""
    out = tmp_path / "cmp"
    first = fake_compare(tmp_path, ["-v", 2], {"PYTHONPATH": no_matplotlib(tmp_path)})
    assert first.returncode == 0, first.stderr
    own = "-e tiny {} -x 4 -b 16 -t 1024 -l 0.0006 -u 0 -q 0.0 -c 0.1 -v 100 -s 0 -v 2"
    assert (out / "bf16" / "compare_settings.txt").read_text() == own.format("-p bf16 -opt adamw") + "\n"
    assert (out / "fp8_delayed" / "compare_settings.txt").read_text() == \
        own.format("-p fp8 -fr delayed -opt adamw") + "\n"
    assert calls(out / "bf16") == [own.format("-p bf16 -opt adamw").replace(" -v 2", "") + f" -n 500 -nk 1 -o {out}/bf16 -y 1 -v 2"]
    for args, env, new in [([], {"STEPS": "8"}, own.replace("-x 4", "-x 8")),
                           ([], {"WARMUP": "1"}, own.replace("-u 0", "-u 1")),
                           (["-l", "0.001"], {}, own + " -l 0.001")]:
        result = fake_compare(tmp_path, ["-v", 2] + args, dict(env, PYTHONPATH=no_matplotlib(tmp_path)))
        assert result.returncode == 2, (args, env, result.stdout[-2000:])
        assert result.stderr.splitlines() == [
            f"error: scripts/compare_bf16_fp8.sh: {out}/bf16 holds a run with other settings: "
            f"'{own.format('-p bf16 -opt adamw')}' there, '{new.format('-p bf16 -opt adamw')}' now (resuming it would go "
            f"on with the new ones); give a new OUT, or remove {out}/bf16 {out}/fp8_delayed to train them afresh"], (args, env)
        assert len(calls(out / "bf16")) == 1 and len(calls(out / "fp8_delayed")) == 1, "a run trained"
    again = fake_compare(tmp_path, ["-v", 2], {"PYTHONPATH": no_matplotlib(tmp_path)})
    assert again.returncode == 0, again.stderr
    assert len(calls(out / "bf16")) == 2 and len(calls(out / "fp8_delayed")) == 2
    # how many checkpoints are kept (-n, -nk) does not define a run: another resumes it
    kept = fake_compare(tmp_path, ["-v", 2, "-nk", 3], {"PYTHONPATH": no_matplotlib(tmp_path)})
    assert kept.returncode == 0, kept.stderr
    assert len(calls(out / "bf16")) == 3 and calls(out / "bf16")[-1].endswith("-y 1 -v 2 -nk 3")
    (out / "fp8_delayed" / "compare_settings.txt").unlink()
    result = fake_compare(tmp_path, ["-v", 2], {"PYTHONPATH": no_matplotlib(tmp_path)})
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1, result.stderr
    assert result.stderr.startswith(f"error: scripts/compare_bf16_fp8.sh: {out}/fp8_delayed holds a run but no "
                                    "compare_settings.txt saying its settings"), result.stderr
    assert result.stderr.endswith(f"; give a new OUT, or remove {out}/fp8_delayed to train it afresh\n"), result.stderr
    assert len(calls(out / "bf16")) == 3, "a run trained before the check of every run"


@pytest.mark.parametrize("flag,value,use", [
    ("-p", "fp8", "set RECIPES instead"), ("-fr", "current", "set RECIPES instead"),
    ("-f8", "all", "add +lm_head to a RECIPES item instead"),
    ("-fg", "delayed", "add +fg_delayed or +fg_pow2 to a RECIPES item instead"),
    ("-fw", "delayed", "compare -fw delayed with two runs of the trainer instead"),
    ("-opt", "adamw8", "set OPTIMIZERS instead"), ("-e", "d6", "set MODEL=d6 instead"),
    ("-x", "8", "set STEPS=8 instead"), ("-u", "3", "set WARMUP=3 instead"), ("-o", "elsewhere", "set OUT=elsewhere instead"),
    ("-y", "0", "give a new OUT to start afresh instead"),
])
def test_compare_refuses_extra_arguments_it_sets_itself(flag, value, use, tmp_path):
    """extra arguments come after the script's own flags, so `-fg delayed` there made the row fp8_delayed_fg_pow2 a
    -fg delayed run: those the script sets are refused in one line that names the variable to use instead, before
    any run; -b, -t and -d go through"""
    result = fake_compare(tmp_path, ["-b", 2, "-t", 64, flag, value, "-d", 256], {})
    assert result.returncode == 2 and not (tmp_path / "cmp").exists(), result.stdout[-2000:]
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        f"error: scripts/compare_bf16_fp8.sh: extra argument '{flag} {value}': the script sets {flag} "), lines
    assert f"would override it silently: {use}" in lines[0], lines
    assert lines[0].endswith(" (its variables: MODEL STEPS WARMUP OUT RECIPES OPTIMIZERS)"), lines


def test_compare_refuses_no_val_losses_before_training(tmp_path):
    """-v 0 leaves the table nothing to compare: refused in one line before any run trains (no OUT made)"""
    out = tmp_path / "cmp"
    result = run_script("compare_bf16_fp8.sh", ["-v", 0], {"OUT": str(out)})
    assert result.returncode == 2 and not out.exists(), (result.stdout[-2000:], result.stderr)
    assert result.stderr.splitlines() == ["error: scripts/compare_bf16_fp8.sh: extra argument '-v 0': the table compares the "
                                          "runs' val losses, and -v 0 evaluates none; give -v N > 0 (the script's default: "
                                          "-v 100)"], result.stderr


def test_compare_writes_the_table_first_at_the_last_shared_val_step(tmp_path):
    """fp8_delayed cut off at step 4 of 8 (val every 2): the table compares both runs at step 4 and names it, with the
    B, T and -d of the tok/s; without matplotlib the table is still written and the missing PNG is one warning line;
    runs that share no val step after step 0 are one error line and a failed compare"""
    env = {"STEPS": "8", "FAKE_STOP_fp8_delayed": "4", "PYTHONPATH": no_matplotlib(tmp_path)}
    out = tmp_path / "cmp"
    result = fake_compare(tmp_path, ["-v", 2, "-b", 2, "-t", 64, "-d", 256], env)
    assert result.returncode == 0, result.stderr
    assert result.stderr.splitlines() == [
        f"warning: scripts/compare_bf16_fp8.sh: no {out}/loss.png, scripts/plot.py failed (exit 1): error: "
        f"scripts/plot.py needs matplotlib, which {sys.executable} cannot import: bash scripts/setup_python.sh (or pip "
        "install matplotlib)"]
    table = (out / "summary.md").read_text()
    assert table in result.stdout and result.stdout.endswith(f"wrote {out}/summary.md\n"), result.stdout
    assert table.startswith("val loss at step 4, the last val step all 2 runs share; tok/s: the median over train "
                            "steps 10 and later, at B=2 T=64 -d 256\n"), table
    assert re.findall(r"^\| (\w+) \| (\d+) \| ([\d.]+) \|", table, re.M) == [("bf16", "4", "5.64"),
                                                                        ("fp8_delayed", "4", "5.71")], table

    # -v 100: val at step 0 and the last only, which fp8_delayed never reached
    result = fake_compare(tmp_path, ["-b", 2, "-t", 64], env, out="cmp2")
    assert result.returncode == 1 and not (tmp_path / "cmp2" / "summary.md").exists(), result.stdout[-2000:]
    assert result.stderr.splitlines() == [
        f"error: {tmp_path / 'cmp2'}: the runs share no val step after step 0, so no val loss to compare (val steps of "
        "each run: bf16: 0 8; fp8_delayed: 0)"]


def test_compare_with_a_diverged_run_writes_the_table_and_fails(tmp_path):
    """a run whose val loss went nan (the stand-in's FAKE_NAN_fp8_delayed: null from that step on): summary.md is
    written with nan in its row, the loss PNG still drawn (where it diverged), and the compare exits 1 naming the run"""
    env = {"STEPS": "8", "FAKE_NAN_fp8_delayed": "4"}
    out = tmp_path / "cmp"
    result = fake_compare(tmp_path, ["-v", 2, "-b", 2, "-t", 64], env)
    assert result.returncode == 1, result.stdout[-2000:]
    table = (out / "summary.md").read_text()
    assert re.findall(r"^\| (\w+) \| (\d+) \| ([\w.]+) \|", table, re.M) == [("bf16", "8", "5.24"),
                                                                         ("fp8_delayed", "8", "nan")], table
    assert (out / "loss.png").exists() and result.stdout.endswith(f"wrote {out}/summary.md and {out}/loss.png\n")
    assert f"error: {out}: the val loss of fp8_delayed is not finite at the compared step: diverged" in result.stderr


def test_gpu_session_parity_stage_dry_run(data, tmp_path):
    """dev/gpu_session.sh parity (a device call) with the CPU trainer on a small model: the five sets of
    runs train, the later ones resume the first's finished runs, and the logs a call returns are there"""
    logs = tmp_path / "logs"
    env = dict(os.environ, OUT=str(logs), PARITY_TRAINER=CPU, PARITY_MODEL=str(small_vocab_model(data)), PARITY_STEPS="4",
               PARITY_TRAIN=str(data / "d_train_*.bin"), PARITY_VAL=str(data / "d_val_*.bin"),
               PARITY_OUT=str(tmp_path / "parity"), PARITY_ARGS="-b 2 -t 32 -v 2 -m 2 -n 4", WARMUP="1")
    result = subprocess.run(["bash", os.path.join(ROOT, "dev", "gpu_session.sh"), "parity"], capture_output=True,
                            text=True, timeout=600, cwd=ROOT, env=env)
    assert result.returncode == 0, (result.stdout[-2000:], result.stderr[-2000:])
    optimizers = (logs / "summary_optimizers.md").read_text()
    assert re.findall(r"^\| (\w+) \| 4 \|", optimizers, re.M) == ["bf16", "bf16_adamw8", "fp8_delayed", "fp8_delayed_adamw8"]
    lm_head = (logs / "summary_lm_head.md").read_text()
    assert re.findall(r"^\| (\w+) \| 4 \|", lm_head, re.M) == ["bf16", "fp8_delayed", "fp8_delayed_lm_head"]
    fg_delayed = (logs / "summary_fg_delayed.md").read_text()
    assert re.findall(r"^\| (\w+) \| 4 \|", fg_delayed, re.M) == ["bf16", "fp8_delayed", "fp8_delayed_fg_delayed",
                                                                "fp8_delayed_fg_pow2"]
    parity_log = (logs / "parity.log").read_text()
    fastest = (logs / "summary_fastest.md").read_text()
    assert re.findall(r"^\| (\w+) \| 4 \|", fastest, re.M) == ["bf16", "fp8_delayed", "fp8_delayed_lm_head_fg_delayed"]
    fc_codes = (logs / "summary_fc_codes.md").read_text()
    assert re.findall(r"^\| (\w+) \| 4 \|", fc_codes, re.M) == ["bf16", "fp8_delayed", "fp8_delayed_fc_codes"]
    assert "note: -fe 1 has no effect in train_gpt2cpu" in parity_log  # +fc_codes passed -fe 1 (-r 0), which the CPU notes
    assert parity_log.count("resumed from") == 8, parity_log[-3000:]  # bf16 and fp8_delayed, in each later set
    # the sets in order, the -fg delayed and -fg pow2 runs late (a session cut off short of them loses little):
    # fg_delayed's two, then fastest's resumed fp8_delayed and its own run, then fc_codes's resumed one and its own
    trained = re.findall(r"^precision fp8 emulated, recipe delayed, weights \w+, gradients (\w+)", parity_log, re.M)
    assert trained[-6:] == ["delayed", "pow2", "current", "delayed", "current", "current"] \
        and set(trained[:-6]) == {"current"}, trained
    # every run's main.log and every set's plot in one archive: a device call returns at most 8 files, and the
    # device's build adds build.log to these
    assert len(os.listdir(logs)) <= 7, sorted(os.listdir(logs))
    with tarfile.open(logs / "parity_main_logs.tar.gz") as archive:
        plots = [f"./loss_{name}.png" for name in ("fastest", "fc_codes", "fg_delayed", "lm_head", "optimizers")]
        assert sorted(archive.getnames()) == [f"./{run}/main.log" for run in ("bf16", "bf16_adamw8", "fp8_delayed", "fp8_delayed_adamw8",
                                                                               "fp8_delayed_fc_codes",
                                                                               "fp8_delayed_fg_delayed", "fp8_delayed_fg_pow2",
                                                                               "fp8_delayed_lm_head",
                                                                               "fp8_delayed_lm_head_fg_delayed")] + plots
        assert all(archive.getmember(plot).size > 0 for plot in plots)


def test_gpu_session_parity_stage_runs_the_sets_named(data, tmp_path):
    """parity SETS: only those sets (one fits a device call with the build): lm_head alone trains bf16, FP8
    delayed and FP8 delayed with an FP8 lm_head, nothing else; a misspelt set stops it before any run"""
    logs = tmp_path / "logs"
    env = dict(os.environ, OUT=str(logs), PARITY_TRAINER=CPU, PARITY_MODEL=str(small_vocab_model(data)), PARITY_STEPS="2",
               PARITY_TRAIN=str(data / "d_train_*.bin"), PARITY_VAL=str(data / "d_val_*.bin"),
               PARITY_OUT=str(tmp_path / "parity"), PARITY_ARGS="-b 2 -t 32 -v 2 -m 2", WARMUP="1")
    session = ["bash", os.path.join(ROOT, "dev", "gpu_session.sh"), "parity"]
    result = subprocess.run(session + ["lm_head"], capture_output=True, text=True, timeout=600, cwd=ROOT, env=env)
    assert result.returncode == 0, (result.stdout[-2000:], result.stderr[-2000:])
    assert sorted(os.listdir(logs)) == ["parity.log", "parity_main_logs.tar.gz", "summary_lm_head.md"]
    assert sorted(os.listdir(tmp_path / "parity")) == ["bf16", "fp8_delayed", "fp8_delayed_lm_head", "loss.png",
                                                       "loss_lm_head.png", "summary.md"]
    result = subprocess.run(session + ["lm_head", "fg-delayed"], capture_output=True, text=True, timeout=60, cwd=ROOT, env=env)
    assert result.returncode == 2 and result.stderr.strip().splitlines() == [
        "error: dev/gpu_session.sh: parity set 'fg-delayed' (expected some of: optimizers lm_head fg_delayed fastest fc_codes)"]


def test_gpu_session_parity_stage_needs_the_corpus(tmp_path):
    env = dict(os.environ, OUT=str(tmp_path / "logs"), PARITY_TRAINER=CPU, PARITY_TRAIN=str(tmp_path / "none_*.bin"))
    result = subprocess.run(["bash", os.path.join(ROOT, "dev", "gpu_session.sh"), "parity"], capture_output=True,
                            text=True, timeout=60, cwd=ROOT, env=env)
    assert result.returncode == 1 and result.stderr.count("\n") == 1, result.stderr
    assert "parity needs the offline corpus" in result.stderr and "carry dev/data/offline" in result.stderr


def linked_checkout(where):
    """a checkout at `where` whose entries are links to this one's, but for scripts/quickstart.sh's outputs: the
    offline corpus (dev/data/offline, here made small: the shards and the decode table prepare_default.sh finds
    already there) and the logs it writes at the root"""
    where.mkdir()
    for name in os.listdir(ROOT):
        if name not in (".git", "dev"):
            os.symlink(os.path.join(ROOT, name), where / name)
    (where / "dev" / "data").mkdir(parents=True)
    for name in os.listdir(os.path.join(ROOT, "dev")):
        if name != "data":
            os.symlink(os.path.join(ROOT, "dev", name), where / "dev" / name)
    for name in os.listdir(os.path.join(ROOT, "dev", "data")):
        if name != "offline":
            os.symlink(os.path.join(ROOT, "dev", "data", name), where / "dev" / "data" / name)
    corpus = where / "dev" / "data" / "offline"
    corpus.mkdir()
    write_shard(corpus / "offline_train_000001.bin", random_tokens(20000, 1))
    write_shard(corpus / "offline_val_000000.bin", random_tokens(5000, 2))
    write_tokenizer(corpus / "gpt2_tokenizer.bin", vocab=50257)
    return where


def run_quickstart(checkout, args, gpu):
    """scripts/quickstart.sh ARGS in `checkout`, with nvidia-smi listing a GPU or none (a stub first on PATH); with
    one, make is a stub too (the GPU build is not this test's: make test compiles it)"""
    stubs = checkout.parent / "stubs"
    stubs.mkdir(exist_ok=True)
    for name, body in [("nvidia-smi", "exit 0" if gpu else "exit 9")] + ([("make", 'echo "make $*"')] if gpu else []):
        fake_tool(stubs, name, body)
    env = dict(os.environ, PATH=f"{stubs}{os.pathsep}{os.environ['PATH']}")
    return subprocess.run(["bash", str(checkout / "scripts" / "quickstart.sh")] + [str(a) for a in args],
                          capture_output=True, text=True, timeout=300, cwd=checkout.parent, env=env)


def test_quickstart_without_a_gpu_trains_the_tiny_model_on_the_cpu(tmp_path):
    checkout = linked_checkout(tmp_path / "checkout")
    result = run_quickstart(checkout, ["-x", 2], gpu=False)
    assert result.returncode == 0, (result.stdout[-2000:], result.stderr[-2000:])
    assert "offline data already prepared in dev/data/offline" in result.stdout, result.stdout[-2000:]
    assert "no NVIDIA GPU found (nvidia-smi lists none): training a tiny model on the CPU" in result.stdout
    assert re.findall(r"^step\s+(\d+)/2 ", result.stdout, re.M) == ["1", "2"], result.stdout[-2000:]
    assert (checkout / "log_tiny_cpu" / "main.log").read_text().startswith("s:"), "no main.log in log_tiny_cpu/"


def test_quickstart_without_a_gpu_resumes_when_run_again(tmp_path):
    """a second quickstart on the CPU resumes the first one's run from its newest checkpoint (-y 1), its main.log
    continued, not replaced"""
    checkout = linked_checkout(tmp_path / "checkout")
    first = run_quickstart(checkout, ["-x", 2, "-n", 1], gpu=False)
    assert first.returncode == 0, (first.stdout[-2000:], first.stderr[-2000:])
    log_first = (checkout / "log_tiny_cpu" / "main.log").read_text()
    second = run_quickstart(checkout, ["-x", 3, "-n", 1], gpu=False)
    assert second.returncode == 0, (second.stdout[-2000:], second.stderr[-2000:])
    assert "resumed from log_tiny_cpu/model_00000002.bin at step 2" in second.stdout, second.stdout[-2000:]
    assert re.findall(r"^step\s+(\d+)/3 ", second.stdout, re.M) == ["3"], second.stdout[-2000:]
    log_second = (checkout / "log_tiny_cpu" / "main.log").read_text()
    assert log_second.startswith(log_first) and "s:3 " in log_second[len(log_first):], log_second


def test_quickstart_with_a_gpu_runs_its_d12_command_line(tmp_path):
    """every flag of the GPU branch's d12 run parses and trains on the GPU trainer (cudasim's), the test's flags
    last and only shrinking it: model, batch, sequence, total batch, steps, val batches, samples"""
    sim_trainer = os.path.join(ROOT, "build", "sim", "train_gpt2_fp8")
    if not os.path.exists(sim_trainer):
        pytest.fail(f"{sim_trainer} is not built (make build/sim/train_gpt2_fp8)")
    checkout = linked_checkout(tmp_path / "checkout")
    if os.path.lexists(checkout / "train_gpt2_fp8"):
        os.remove(checkout / "train_gpt2_fp8")
    os.symlink(sim_trainer, checkout / "train_gpt2_fp8")
    result = run_quickstart(checkout, ["-e", "tiny", "-b", 2, "-t", 32, "-d", 64, "-x", 2, "-m", 2, "-s", 0], gpu=True)
    assert result.returncode == 0, (result.stdout[-2000:], result.stderr[-2000:])
    assert result.stdout.count("make -j2 train_gpt2_fp8\n") == 1 and "no NVIDIA GPU" not in result.stdout, result.stdout[-2000:]
    assert re.search(r"^train \| precision bf16 \| B=2 T=32 \| total batch 64 tokens", result.stdout, re.M), result.stdout[:3000]
    assert re.findall(r"^step\s+(\d+)/2 ", result.stdout, re.M) == ["1", "2"], result.stdout[-2000:]
    assert (checkout / "log_d12_bf16" / "main.log").exists()
