"""
dev/bench/ncu_profile.py without a GPU: the kernels it asks ncu for (read from llmc/), its reading of ncu's details
CSV (units, thousands separators, the counter both SpeedOfLight and MemoryWorkloadAnalysis name), the last step's
launches per kernel, and the whole script against a stand-in ncu that records how it was called and prints a
canned report.
"""
import glob
import gzip
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "dev", "bench", "ncu_profile.py")
sys.path.insert(0, os.path.join(ROOT, "dev", "bench"))
import ncu_profile  # noqa: E402

HEADER = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size",'
          '"Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"')
CAST = "void fp8_cast_transpose_kernel<__nv_bfloat16, GeluForward, TileSource<(int)2>>(Fp8CastOutput, const __nv_bfloat16 *, int)"
CLASSIFIER = "fused_classifier_kernel(__nv_bfloat16 *, float *, float, const int *, int, int, int, Fp8CastOutput)"


def launch_rows(launch, kernel, duration, unit, dram_pct, bandwidth_gbs, l2_hit):
    """one launch's rows as ncu --csv --page details writes them (a value with a thousands separator included)"""
    common = f'"{launch}","4242","train_gpt2_fp8","127.0.0.1","{kernel}","1","7","(512, 1, 1)","(396, 1, 1)","0","9.0"'
    metrics = [("GPU Speed Of Light Throughput", "Duration", unit, duration),
               ("GPU Speed Of Light Throughput", "DRAM Throughput", "%", dram_pct),
               ("GPU Speed Of Light Throughput", "Memory Throughput", "%", dram_pct + 1),
               ("GPU Speed Of Light Throughput", "Compute (SM) Throughput", "%", 40.0),
               ("Memory Workload Analysis", "Memory Throughput", "byte/second", f"{bandwidth_gbs * 1e9:,.0f}"),
               ("Memory Workload Analysis", "L2 Hit Rate", "%", l2_hit),
               ("Scheduler Statistics", "One or More Eligible", "%", 55.5),
               ("Occupancy", "Achieved Occupancy", "%", 70.25),
               ("Launch Statistics", "Registers Per Thread", "register/thread", 80)]
    return [f'{common},"{section}","{name}","{unit_}","{value}"' for section, name, unit_, value in metrics]


def details_csv():
    """two steps: the cast twice a step (step 1's launches slower), the classifier once a step"""
    lines = ["==PROF== Connected to process 4242", HEADER]
    launches = [(CAST, 900.0, 50.0), (CAST, 800.0, 52.0), (CLASSIFIER, 4.4, 80.0),
                (CAST, 400.0, 60.0), (CAST, 300.0, 70.0), (CLASSIFIER, 4.2, 81.0)]
    for i, (kernel, duration, dram) in enumerate(launches):
        unit = "msecond" if kernel == CLASSIFIER else "usecond"
        lines += launch_rows(i, kernel, duration, unit, dram, 2000.0 + 100 * i, 30.0 + i)
    return "\n".join(lines) + "\n"


def test_the_kernels_asked_for_are_llmc_s():
    """every __global__ kernel llmc/*.cuh defines, but the scaling state's bookkeeping kernels"""
    names = ncu_profile.kernel_names()
    assert {"fused_classifier_kernel", "fp8_cast_transpose_kernel", "layernorm_backward_kernel", "adamw8_update_kernel",
            "adamw_update_kernel", "gelu_forward_kernel"} <= set(names)
    assert "fp8_scaling_update_records_kernel" not in names and "fp8_cast_records_clear_kernel" not in names
    defined = set()
    for path in glob.glob(os.path.join(ROOT, "llmc", "*.cuh")):
        defined |= set(re.findall(r"__global__[^(]*?(\w+)\s*\(", re.sub(r"__launch_bounds__\([^)]*\)", "", open(path).read())))
    assert defined == set(names) | {n for n in defined if ncu_profile.BOOKKEEPING.search(n)}
    assert all(re.fullmatch(r"\w+", n) for n in names)


def test_short_names_keep_template_arguments():
    assert ncu_profile.short_name(CAST) == "fp8_cast_transpose_kernel<__nv_bfloat16, GeluForward, TileSource<(int)2>>"
    assert ncu_profile.short_name(CLASSIFIER) == "fused_classifier_kernel"


def test_rows_take_the_last_steps_launches():
    """per kernel: the last step's launches (the last half of two steps), their median duration (us) and sum (ms),
    each counter's median in the table's units; the most ms first"""
    rows = ncu_profile.kernel_rows(ncu_profile.parse_details(details_csv()), steps=2)
    assert [r["kernel"] for r in rows] == ["fused_classifier_kernel", CAST[5:CAST.index(">(") + 1]]
    classifier, cast = rows
    assert classifier["launches"] == 1 and classifier["median_us"] == pytest.approx(4200.0)
    assert classifier["ms_per_step"] == pytest.approx(4.2)
    assert cast["launches"] == 2 and cast["median_us"] == pytest.approx(350.0) and cast["ms_per_step"] == pytest.approx(0.7)
    assert cast["DRAM % of peak"] == pytest.approx(65.0)  # SpeedOfLight's, not its Memory Throughput %
    assert cast["memory GB/s"] == pytest.approx(2350.0)  # MemoryWorkloadAnalysis's bytes a second, launches 3 and 4
    assert cast["L2 hit %"] == pytest.approx(33.5)
    assert cast["issue % (a warp eligible)"] == pytest.approx(55.5) and cast["registers"] == 80
    table = ncu_profile.table(rows, "d12 fp8")
    assert "| `fused_classifier_kernel` | 1 | 4200.0 | 4.200 | 81 | 2500 | 35 | 40 | 56 | 70 | 80 |" in table
    # one step: every launch is the step's
    assert ncu_profile.kernel_rows(ncu_profile.parse_details(details_csv()), steps=1)[0]["launches"] == 2


def test_a_csv_without_ncus_header_is_refused():
    with pytest.raises(ncu_profile.CliError, match="no header with ID, Kernel Name"):
        ncu_profile.parse_details("==ERROR== something went wrong\n")


def stand_in_ncu(tmp_path):
    """ncu on a PATH directory: --export records its arguments and writes the report file; --import prints the CSV"""
    bin_dir = tmp_path / "ncu_bin"
    bin_dir.mkdir()
    (tmp_path / "details.csv").write_text(details_csv())
    (bin_dir / "ncu").write_text(f"""#!/bin/sh
case " $* " in
  *" --import "*) cat "{tmp_path}/details.csv" ;;
  *) printf "%s\\n" "$*" >> "{tmp_path}/ncu_args.txt"
     while [ "$1" != "--export" ]; do shift; done
     touch "$2.ncu-rep" ;;
esac
""")
    (bin_dir / "ncu").chmod(0o755)
    return bin_dir


def run_script(args, path):
    env = dict(os.environ, PATH=f"{path}:/usr/bin:/bin", CUDA_HOME="/nonexistent")
    return subprocess.run([sys.executable, SCRIPT] + args, capture_output=True, text=True, timeout=120, env=env)


@pytest.mark.skipif(not os.access(os.path.join(ROOT, "train_gpt2_fp8"), os.X_OK), reason="needs the built trainer")
def test_profiles_each_run_under_ncu(tmp_path):
    """both runs, FP8 first, each the trainer under ncu with the clocks left alone, llmc's kernels only and the
    five sections; profile.md holds a table per run, and each run's CSV comes back gzipped"""
    out = tmp_path / "out"
    result = run_script(["--out", str(out), "--steps", "2"], stand_in_ncu(tmp_path))
    assert result.returncode == 0, result.stderr
    calls = (tmp_path / "ncu_args.txt").read_text().splitlines()
    assert len(calls) == 2
    for call, run in zip(calls, ("fp8", "bf16")):
        args = call.split()
        assert args[:2] == ["--clock-control", "none"]
        assert [args[i + 1] for i, a in enumerate(args) if a == "--section"] == list(ncu_profile.SECTIONS)
        pattern = args[args.index("--kernel-name") + 1]
        # a name alone, or with its template arguments (whichever ncu's function base gives), and nothing longer
        regex = re.compile(pattern[len("regex:"):])
        assert pattern.startswith("regex:") and regex.match("fused_classifier_kernel")
        assert regex.match("fp8_cast_transpose_kernel<__nv_bfloat16, GeluForward>") and regex.match("adamw_update_kernel<4>")
        assert not regex.match("fused_classifier_kernel2") and not regex.match("fp8_scaling_update_records_kernel")
        assert not regex.match("sm90_xmma_gemm_e4m3bf16_e4m3f32_f32_tn_n_tilesize128x128x64")
        trainer = args[args.index("--force-overwrite") + 1 + 2 * len(ncu_profile.SECTIONS):]
        assert os.path.basename(trainer[0]) == "train_gpt2_fp8" and trainer[trainer.index("-p") + 1] == run
        assert trainer[trainer.index("-e") + 1:trainer.index("-e") + 5] == ["d12", "-b", "64", "-t"]
    md = (out / "profile.md").read_text()
    assert md.count("### d12 ") == 2 and "### d12 fp8, B=64 T=1024 -r 0, the last of 2 steps (6 launches profiled" in md
    assert md.count("| `fused_classifier_kernel` | 1 | 4200.0 | 4.200 |") == 2
    with gzip.open(out / "ncu_fp8.csv.gz", "rt") as f:
        assert f.read() == details_csv()


@pytest.mark.skipif(not os.access(os.path.join(ROOT, "train_gpt2_fp8"), os.X_OK), reason="needs the built trainer")
def test_a_csv_it_cannot_read_still_comes_back(tmp_path):
    """an ncu whose CSV lacks the expected columns: each run's line says so, the next run still goes, and the CSV comes
    back for a parser fix without the GPU"""
    bin_dir = stand_in_ncu(tmp_path)
    (tmp_path / "details.csv").write_text("==WARNING== another layout\n")
    out = tmp_path / "out"
    result = run_script(["--out", str(out)], bin_dir)
    assert result.returncode == 0, result.stderr
    md = (out / "profile.md").read_text()
    for run in ("fp8", "bf16"):
        assert (f"{run}: ncu's CSV has no header with ID, Kernel Name, Metric Name and Metric Value "
                f"(ncu_{run}.csv.gz holds what ncu printed)") in md
        with gzip.open(out / f"ncu_{run}.csv.gz", "rt") as f:
            assert f.read() == "==WARNING== another layout\n"


@pytest.mark.parametrize("args, message", [
    (["--runs", "fp16"], "--runs fp16: expected a comma list of fp8, bf16"),
    (["--steps", "0"], "--steps 0: expected 1..10"),
    (["--time-limit", "-1"], "--time-limit -1.0: expected seconds, or 0 for none"),
])
def test_bad_arguments_are_refused_in_one_line(tmp_path, args, message):
    result = run_script(args, stand_in_ncu(tmp_path))
    assert result.returncode == 2 and result.stderr.splitlines() == [f"error: ncu_profile.py: {message}"]


@pytest.mark.skipif(bool(glob.glob("/opt/nvidia/nsight-compute/*/ncu")), reason="this machine has Nsight Compute")
def test_without_ncu_it_says_so(tmp_path):
    (tmp_path / "empty").mkdir()
    result = run_script([], tmp_path / "empty")
    assert result.returncode == 2
    assert result.stderr.splitlines() == ["error: ncu_profile.py: ncu (Nsight Compute) not found on PATH, in $CUDA_HOME/bin "
                                          "or under /opt/nvidia/nsight-compute"]
