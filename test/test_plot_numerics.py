"""
scripts/plot_numerics.py on a synthetic numerics.jsonl in the trainer's format: it must draw
a PNG and name the tensor in trouble first, keep the later line of a step logged twice (a
resumed run), leave out a line cut short (with a note), and refuse a missing log or one with no
record with one error line.
"""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "scripts", "plot_numerics.py")


def record(step, tensor, saturated=0.0, flushed=0.0, amax=2.0):
    layer = int(tensor.split(".")[0][1:]) if tensor.startswith("L") else -1
    linear, operand = tensor.split(".")[-2], tensor.split(".")[-1]
    return {"step": step, "tensor": tensor, "layer": layer, "linear": linear, "operand": operand, "format": "e4m3",
            "amax": amax, "scale": 448.0 / amax if amax else None, "frac_saturated": saturated, "frac_flushed": flushed,
            "elements": 4096, "nonfinite": 0}


def write_log(path, records):
    with open(path, "w") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")


def run(*args):
    return subprocess.run([sys.executable, SCRIPT] + [str(a) for a in args], capture_output=True, text=True, timeout=120)


def synthetic_run(tmp_path):
    tensors = [f"L{l}.{lin}.{op}" for l in range(3) for lin in ("qkv", "attproj", "fc", "fcproj") for op in ("x", "w", "dy")]
    tensors.append("lm_head.x")
    records = []
    for step in range(100, 1100, 100):
        for t in tensors:
            saturated = 0.03 if t == "L2.fc.dy" and step >= 500 else 0.0
            flushed = 2e-3 if t == "L0.attproj.x" else 1e-6
            amax = None if t == "L1.qkv.x" and step == 300 else 2.0 + step / 1000
            records.append(record(step, t, saturated, flushed, amax))
    write_log(tmp_path / "numerics.jsonl", records)
    return tmp_path


def test_plot_names_the_tensor_in_trouble(tmp_path):
    run_dir = synthetic_run(tmp_path)
    result = run(run_dir)
    assert result.returncode == 0, result.stderr
    png = run_dir / "numerics.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    lines = result.stdout.splitlines()
    saturated = [l for l in lines if l.startswith("worst frac_saturated:")][0]
    flushed = [l for l in lines if l.startswith("worst frac_flushed:")][0]
    assert saturated.split(": ", 1)[1].startswith("L2.fc.dy 0.03 (step 500)"), saturated
    assert flushed.split(": ", 1)[1].startswith("L0.attproj.x 0.002"), flushed


def test_resumed_step_keeps_the_later_line(tmp_path):
    records = [record(100, "L0.fc.x", saturated=0.5), record(200, "L0.fc.x"), record(100, "L0.fc.x", saturated=0.0)]
    write_log(tmp_path / "numerics.jsonl", records)
    result = run(tmp_path / "numerics.jsonl", "--out", tmp_path / "n.png")
    assert result.returncode == 0, result.stderr
    assert "worst frac_saturated: none" in result.stdout
    assert (tmp_path / "n.png").exists()


def test_missing_log_is_one_error_line(tmp_path):
    result = run(tmp_path)
    assert result.returncode != 0
    assert result.stderr.strip().count("\n") == 0 and result.stderr.startswith("error: "), result.stderr
    assert "numerics.jsonl" in result.stderr


def test_a_torn_line_is_left_out_with_a_note(tmp_path):
    """a run killed while it wrote a step's records leaves a line cut short, which its resume ends with a newline:
    in the middle of the file for good. The plot leaves it out with a note naming its line and draws the rest (one
    error line stopped it, so that run could never be plotted again); a log with no record is one error line"""
    synthetic_run(tmp_path)
    text = (tmp_path / "numerics.jsonl").read_text()
    cut = text.index("\n", len(text) // 2) + 1
    torn = text[:cut] + text[cut:cut + 40] + "\n" + text[cut:]  # the torn line, then the resumed run's records
    (tmp_path / "numerics.jsonl").write_text(torn)
    line = text[:cut].count("\n") + 1
    result = run(tmp_path, "--out", tmp_path / "n.png")
    assert result.returncode == 0, result.stderr
    assert f"note: {tmp_path / 'numerics.jsonl'}: 1 line(s) are not numerics records and are left out (first: line " \
           f"{line}," in result.stdout, result.stdout
    assert result.stdout.splitlines()[1].startswith("worst frac_saturated: L2.fc.dy 0.03 (step 500)"), result.stdout
    assert (tmp_path / "n.png").exists()
    (tmp_path / "numerics.jsonl").write_text('{"step": 1, "tens\nnot json\n')
    result = run(tmp_path)
    assert result.returncode != 0 and result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith(f"error: {tmp_path / 'numerics.jsonl'} has no numerics records (line 1: "), result.stderr


def test_missing_matplotlib_is_one_error_line(tmp_path):
    """a Python without matplotlib (an `import matplotlib` that fails, first on PYTHONPATH): one error line naming how
    to install it, not a traceback"""
    synthetic_run(tmp_path)
    (tmp_path / "no_matplotlib").mkdir()
    (tmp_path / "no_matplotlib" / "matplotlib.py").write_text("raise ImportError(\"No module named 'matplotlib'\")\n")
    result = subprocess.run([sys.executable, SCRIPT, str(tmp_path)], capture_output=True, text=True, timeout=120,
                            env=dict(os.environ, PYTHONPATH=str(tmp_path / "no_matplotlib")))
    assert result.returncode == 1 and not (tmp_path / "numerics.png").exists()
    assert result.stderr.splitlines() == [
        f"error: scripts/plot_numerics.py needs matplotlib, which {sys.executable} cannot import: "
        "bash scripts/setup_python.sh (or pip install matplotlib)"]
