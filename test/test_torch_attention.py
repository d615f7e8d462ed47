"""
dev/bench/torch_attention.py without a GPU: its FLOP yardstick (floor_model's), llm8's rows read from a committed
make bench JSON, its refusals, and its measuring loop end to end against a stand-in torch package whose kernels
advance a fake GPU clock by known times, so every figure of the table is known exactly.
"""
import json
import os
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "dev", "bench", "torch_attention.py")
BENCH_JSON = os.path.join(ROOT, "doc", "benchmarks", "2026-11-30-nvidia-h200-quick-d12.json")
sys.path.insert(0, os.path.join(ROOT, "dev", "bench"))
import torch_attention  # noqa: E402

# the stand-in: torch's names the script uses; each kernel call advances the clock that cuda.Event reads by a time
# per backend (flash 0.25 ms forward, 1.0 backward; cudnn 0.5 and 2.0) and layout (all of it where q, k and v are
# views into one qkv buffer, 7/8 where they are (B, T, NH, HS) tensors of their own, 3/4 where (B, NH, T, HS)), and
# the efficient backend turns every shape down with PyTorch's warnings (a header per backend, then its reasons),
# then "No available kernel"
FAKE_TORCH = {
    "torch/__init__.py": '''
        import contextlib, warnings
        __version__ = "9.9.9-fake"
        bfloat16 = "bfloat16"
        clock = [0.0]
        backend = [None]

        class Tensor:
            def __init__(self, shape, base=None):
                self.shape, self.base = tuple(shape), base
            def requires_grad_(self):
                return self
            def __getitem__(self, index):  # qkv[:, :, i]: the third dimension dropped, a view of qkv
                return Tensor(self.shape[:2] + self.shape[3:], base=self)
            def transpose(self, a, b):
                shape = list(self.shape)
                shape[a], shape[b] = shape[b], shape[a]
                return Tensor(shape, base=self.base if self.base is not None else self)

        def randn(*shape, device=None, dtype=None, generator=None):
            assert device == "cuda" and dtype == bfloat16 and generator is not None
            return Tensor(shape)

        class Generator:
            def __init__(self, device=None):
                assert device == "cuda"
            def manual_seed(self, seed):
                return self

        class _Event:
            def __init__(self, enable_timing=False):
                assert enable_timing
            def record(self):
                self.at = clock[0]
            def elapsed_time(self, end):
                return end.at - self.at

        class cuda:
            Event = _Event
            @staticmethod
            def is_available():
                return True
            @staticmethod
            def get_device_name():
                return "Fake H200"
            @staticmethod
            def synchronize():
                pass

        class backends:
            class cudnn:
                @staticmethod
                def version():
                    return 91900

        def run_kernel(direction, q):
            name = backend[0]
            if name == "EFFICIENT_ATTENTION":
                # as sdp_utils.cpp warns: a header per backend, then each of its reasons, each with its origin
                for message in ("Memory efficient kernel not used because:", "fake reason", "Flash attention kernel not used because:",
                                "Flash attention has been runtime disabled.", "CuDNN attention kernel not used because:",
                                "cuDNN attention has been runtime disabled."):
                    warnings.warn(message + " (Triggered internally at /pytorch/aten/src/ATen/native/transformers/cuda/sdp_utils.cpp:1.)")
                raise RuntimeError("No available kernel. Aborting execution.")
            ms = {"FLASH_ATTENTION": (0.25, 1.0), "CUDNN_ATTENTION": (0.5, 2.0)}[name][direction]
            # a view into qkv (5 dimensions), of a (B, T, NH, HS) tensor, or a (B, NH, T, HS) tensor
            layout = "bhtd" if q.base is None else "qkv" if len(q.base.shape) == 5 else "bthd"
            clock[0] += ms * {"qkv": 1.0, "bthd": 0.875, "bhtd": 0.75}[layout]

        class autograd:
            @staticmethod
            def grad(out, inputs, dout, retain_graph=False):
                assert retain_graph and len(inputs) == 3 and dout.shape == out.shape and out.q is inputs[0]
                run_kernel(1, inputs[0])
                return inputs
    ''',
    "torch/nn/__init__.py": "",
    "torch/nn/functional.py": '''
        import torch
        def scaled_dot_product_attention(q, k, v, is_causal=False):
            assert is_causal and q.shape == k.shape == v.shape
            assert q.shape[1] < q.shape[2]  # (B, NH, T, HS)
            bases = [t.base for t in (q, k, v)]
            # three tensors, or views of three tensors, or views of one qkv buffer
            assert bases == [None] * 3 or len({id(b) for b in bases}) == (1 if len(bases[0].shape) == 5 else 3)
            torch.run_kernel(0, q)
            out = torch.Tensor(q.shape)
            out.q = q
            return out
    ''',
    "torch/nn/attention.py": '''
        import contextlib, torch
        class SDPBackend:
            FLASH_ATTENTION = "FLASH_ATTENTION"
            CUDNN_ATTENTION = "CUDNN_ATTENTION"
            EFFICIENT_ATTENTION = "EFFICIENT_ATTENTION"
        @contextlib.contextmanager
        def sdpa_kernel(backends):
            torch.backend[0] = backends[0]
            yield
            torch.backend[0] = None
    ''',
}


def fake_torch(tmp_path):
    for path, text in FAKE_TORCH.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(textwrap.dedent(text))
    return str(tmp_path)


def run_script(args, pythonpath=None):
    env = dict(os.environ, PYTHONPATH=pythonpath) if pythonpath else dict(os.environ)
    return subprocess.run([sys.executable, SCRIPT] + args, capture_output=True, text=True, timeout=60, env=env)


def test_flops_are_the_floor_models():
    """one layer's causal attention FLOPs, floor_model's: 2 B T^2 C forward, 5 B T^2 C backward"""
    assert torch_attention.attention_flops("d12", 64, False) == 2 * 64 * 1024 ** 2 * 768
    assert torch_attention.attention_flops("d48", 16, True) == 5 * 16 * 1024 ** 2 * 1600
    assert torch_attention.tflops("d12", 64, False, 1.0) == pytest.approx(103.079215104)  # those FLOPs in 1 ms


def test_llm8_rows_come_from_the_bench_json():
    """the d12 bf16 default run's attention rows per layer, with -ad 1 and -ad 0 (2026-11-30's H200 report: 4.156 and
    14.767 ms a step over 12 layers; -ad 0: its own run); a model the file lacks has none"""
    rows = torch_attention.llm8_rows(BENCH_JSON, ["d12", "d48"])
    records = json.load(open(BENCH_JSON))
    ad0 = next(r for r in records if r.get("benchmark") == "train" and r["precision"] == "bf16"
               and r.get("attention_deterministic") == 0)
    assert [row[:3] for row in rows] == [("d12", 64, "llm8 cuDNN -ad 1 (2026-11-30, NVIDIA H200)"),
                                         ("d12", 64, "llm8 cuDNN -ad 0 (2026-11-30, NVIDIA H200)")]
    assert rows[0][3:] == pytest.approx((4.156 / 12, 14.767 / 12))
    assert rows[1][4] == pytest.approx(ad0["attention_backward_ms"] / 12)
    table = torch_attention.table([], rows)
    assert "| d12 | 64 | llm8 cuDNN -ad 1 (2026-11-30, NVIDIA H200) | qkv | 0.346 | 298 | 1.231 | 209 |" in table


@pytest.mark.parametrize("args, message", [
    (["--models", "d13"], "--models d13: expected a comma list of d12, d24, d36, d48"),
    (["--models", ""], "--models : expected a comma list of d12, d24, d36, d48"),
    (["--iters", "0"], "--iters 0: expected 1..1000"),
    (["--warmup", "101"], "--warmup 101: expected 0..100"),
    (["--bench", "/nonexistent/x.json"], "--bench /nonexistent/x.json: cannot read it as a make bench JSON"),
])
def test_bad_arguments_are_refused_in_one_line(args, message):
    result = run_script(args)
    assert result.returncode == 2 and result.stdout == ""
    [line] = result.stderr.splitlines()
    assert line.startswith("error: torch_attention.py: " + message), line


def test_without_torch_it_says_so(tmp_path):
    """a Python without PyTorch: one line, exit 2 (dev/gpu_session.sh first puts it in env.txt and summary.txt)"""
    (tmp_path / "torch.py").write_text("raise ImportError('No module named torch (stand-in)')\n")
    result = run_script(["--models", "d12"], pythonpath=str(tmp_path))
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "error: torch_attention.py: needs PyTorch 2.3 or later with CUDA (import failed: No module named torch (stand-in))"]


def test_measures_each_backend_and_layout(tmp_path):
    """against the stand-in torch: every (backend, layout) of each model timed, forward and backward apart, medians
    of the fake clock's exact kernel times; the backend that turns the shape down gets PyTorch's reason; the qkv
    layout's q, k and v are views of one buffer, the others' three tensors; --json holds the rows"""
    out = tmp_path / "rows.json"
    result = run_script(["--models", "d12,d48", "--iters", "4", "--warmup", "1", "--bench", BENCH_JSON,
                         "--json", str(out)], pythonpath=fake_torch(tmp_path))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "# Fake H200, PyTorch 9.9.9-fake, cuDNN 91900"
    rows = [line for line in lines if line.startswith("| d")]
    flash_fwd, flash_bwd = torch_attention.tflops("d12", 64, False, 0.25), torch_attention.tflops("d12", 64, True, 1.0)
    assert rows[0] == f"| d12 | 64 | torch flash | qkv | 0.250 | {flash_fwd:.0f} | 1.000 | {flash_bwd:.0f} |"
    assert rows[1] == (f"| d12 | 64 | torch flash | bthd | 0.219 | {flash_fwd / 0.875:.0f} | 0.875 | "
                       f"{flash_bwd / 0.875:.0f} |")
    assert rows[2] == (f"| d12 | 64 | torch flash | bhtd | 0.188 | {flash_fwd / 0.75:.0f} | 0.750 | "
                       f"{flash_bwd / 0.75:.0f} |")
    assert rows[3] == f"| d12 | 64 | torch cudnn | qkv | 0.500 | {flash_fwd / 2:.0f} | 2.000 | {flash_bwd / 2:.0f} |"
    assert rows[6] == "| d12 | 64 | torch efficient | qkv | n/a: fake reason; No available kernel. Aborting execution. | | | |"
    d48_fwd, d48_bwd = torch_attention.tflops("d48", 16, False, 0.25), torch_attention.tflops("d48", 16, True, 1.0)
    assert d48_bwd == pytest.approx(d48_fwd * 2.5 / 4)
    assert rows[9] == f"| d48 | 16 | torch flash | qkv | 0.250 | {d48_fwd:.0f} | 1.000 | {d48_bwd:.0f} |"
    assert len(rows) == 2 * 9 + 2 and rows[-2].startswith("| d12 | 64 | llm8 cuDNN -ad 1 (2026-11-30, NVIDIA H200) |")
    measured = json.load(open(out))
    assert [(m["model"], m["backend"], m["layout"]) for m in measured] == [
        (model, backend, layout) for model in ("d12", "d48") for backend in ("flash", "cudnn", "efficient")
        for layout in ("qkv", "bthd", "bhtd")]
    assert measured[0] == {"model": "d12", "B": 64, "T": 1024, "NH": 12, "HS": 64, "backend": "flash", "layout": "qkv",
                           "fwd_ms": 0.25, "bwd_ms": 1.0}
    assert measured[9]["NH"] == 25
