"""
The multi-GPU launchers, without a GPU: scripts/launch_one_node.sh and scripts/slurm_gpt2.sbatch
run with stand-ins for the trainer (a bash script that records its pid, arguments and
environment, then exits, fails or hangs as told), for mpirun, nvidia-smi, and Slurm's srun,
scontrol and getent, on a PATH that holds nothing else (so a real mpirun or nvidia-smi on the
machine changes nothing).
- launch_one_node.sh -m fs: rank r gets exactly `FLAGS -pi fs -pf DIR -pn N -pr r -pg G`, N and G
  from -n and CUDA_VISIBLE_DEVICES (or nvidia-smi -L); DIR is new and empty per launch and gone
  after it; the first failing rank's status is the exit status and the other ranks are stopped
  at once (they would hang for 30 s); Ctrl-C (INT to the process group), TERM and HUP stop every
  rank, and a second signal kills ranks that ignore TERM; each refusal is one stderr line and
  exit 2 before any rank starts; a *.sh command runs once with NUM_GPUS, LLM8_LAUNCH_METHOD and
  LLM8_LAUNCHER, and a run script (run_common.sh) calls the launcher back for the ranks; -m mpi
  (and the default, when mpirun is on PATH) hands the command to mpirun.
- slurm_gpt2.sbatch run with bash: the run script runs once; each attempt is one srun step of
  SLURM_NTASKS tasks whose trainer gets its rank from SLURM_PROCID, -pn, -pg 0 (each its SLURM_LOCALID modulo the GPUs it sees),
  and -pi fs -pf (a fresh directory under llm8_nccl/<job id>/ in the checkout, removed after) or
  -pi tcp -ps <first node's IPv4>:<port>; its refusals are one line each.
- End to end: build/sim/train_gpt2_fp8 (cudasim) trains 2 steps as 2 ranks on one "GPU" through
  each launcher (skipped when that build is missing).
"""
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest

import sim_model

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAUNCH = os.path.join(ROOT, "scripts", "launch_one_node.sh")
SBATCH = os.path.join(ROOT, "scripts", "slurm_gpt2.sbatch")
SIM_TRAINER = os.path.join(ROOT, "build", "sim", "train_gpt2_fp8")
TOOLS = ("bash", "sh", "env", "basename", "dirname", "mktemp", "rm", "rmdir", "mkdir", "mv", "tr", "grep", "sleep",
         "cat", "head", "awk", "stat", "od", "ldd")
HANG_S = 30  # a hanging stand-in rank sleeps this long; every wait below is far shorter

# a trainer rank: records itself, then does what STUB_RANK_<its -pr> (else STUB_EVERY_RANK) says:
# "S N" sleep S seconds and exit N; "hang" sleep; "stubborn" sleep, ignoring TERM. With STUB_TRAINS=1, rank 0 first
# logs a train line into -o's main.log, as a run that trained a step (run_common.sh retries only such runs)
RANK_STUB = r"""#!/usr/bin/env bash
args=("$@")
rank=none; pf=""; out=""
for (( i = 0; i + 1 < $#; i++ )); do
    case "${args[i]}" in -pr) rank="${args[i+1]}" ;; -pf) pf="${args[i+1]}" ;; -o) out="${args[i+1]}" ;; esac
done
if [[ "${STUB_TRAINS:-}" == 1 && "$rank" == 0 && -n "$out" ]]; then
    mkdir -p "$out" && echo "s:0 trl:1.0000 lr:0.000600 norm:1.00" >> "$out/main.log"
fi
pf_state=none
if [[ -n "$pf" ]]; then
    if [[ -d "$pf" ]]; then shopt -s nullglob dotglob; entries=("$pf"/*); pf_state="dir ${#entries[@]}"; else pf_state=missing; fi
fi
{
    echo "pid=$$"
    echo "cwd=$(pwd)"
    echo "pf_state=$pf_state"
    echo "SLURM_PROCID=${SLURM_PROCID-unset}"
    printf 'arg=%s\n' "$@"
} > "$STUB_LOG/.rank.$$" && mv "$STUB_LOG/.rank.$$" "$STUB_LOG/rank.$rank.$$"
spec_var="STUB_RANK_$rank"
spec="${!spec_var:-${STUB_EVERY_RANK:-0 0}}"
case "$spec" in
    hang) exec sleep HANG_S ;;
    stubborn) trap '' TERM; exec sleep HANG_S ;;
    *) read -r seconds status <<< "$spec"; sleep "$seconds"; exit "$status" ;;
esac
""".replace("HANG_S", str(HANG_S))

RUN_SCRIPT_STUB = r"""#!/usr/bin/env bash
{
    echo "NUM_GPUS=${NUM_GPUS-unset}"
    echo "LLM8_LAUNCH_METHOD=${LLM8_LAUNCH_METHOD-unset}"
    echo "LLM8_LAUNCHER=${LLM8_LAUNCHER-unset}"
    printf 'arg=%s\n' "$@"
} > "$STUB_LOG/.runscript.$$" && mv "$STUB_LOG/.runscript.$$" "$STUB_LOG/runscript.$$"
"""

MPIRUN_STUB = r"""#!/usr/bin/env bash
{
    echo "OMPI_ALLOW_RUN_AS_ROOT=${OMPI_ALLOW_RUN_AS_ROOT-unset}"
    echo "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=${OMPI_ALLOW_RUN_AS_ROOT_CONFIRM-unset}"
    echo "OMPI_MCA_rmaps_base_oversubscribe=${OMPI_MCA_rmaps_base_oversubscribe-unset}"
    echo "PRTE_MCA_rmaps_default_mapping_policy=${PRTE_MCA_rmaps_default_mapping_policy-unset}"
    printf 'arg=%s\n' "$@"
} > "$STUB_LOG/.mpirun.$$" && mv "$STUB_LOG/.mpirun.$$" "$STUB_LOG/mpirun.$$"
"""

NVIDIA_SMI_STUB = r"""#!/usr/bin/env bash
[[ "$*" == -L ]] || exit 1
echo "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0)"
echo "GPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-1)"
echo "  MIG 3g.40gb     Device  0: (UUID: MIG-1)"
echo "GPU 2: NVIDIA H100 80GB HBM3 (UUID: GPU-2)"
"""

# srun: records its arguments, runs the command once per task as srun does (SLURM_PROCID etc. per
# task, in srun's working directory), exits with the highest task status
SRUN_STUB = r"""#!/usr/bin/env bash
printf 'arg=%s\n' "$@" > "$STUB_LOG/.srun.$$" && mv "$STUB_LOG/.srun.$$" "$STUB_LOG/srun.$$"
ntasks=""
while (( $# > 0 )); do
    case "$1" in
        --ntasks=*) ntasks="${1#--ntasks=}" ;;
        --cpus-per-task=*|--kill-on-bad-exit=1) ;;
        -*) echo "srun stub: unexpected option $1" >&2; exit 97 ;;
        *) break ;;
    esac
    shift
done
[[ -n "$ntasks" ]] || { echo "srun stub: no --ntasks" >&2; exit 97; }
per_node=$(( ntasks / ${SLURM_JOB_NUM_NODES:-1} ))
pids=()
for (( t = 0; t < ntasks; t++ )); do
    SLURM_PROCID=$t SLURM_LOCALID=$(( t % per_node )) SLURM_NODEID=$(( t / per_node )) SLURM_NTASKS=$ntasks \
        SLURM_STEP_NUM_TASKS=$ntasks "$@" &
    pids+=($!)
done
status=0
for p in "${pids[@]}"; do
    s=0; wait "$p" || s=$?
    if (( s > status )); then status=$s; fi
done
exit "$status"
"""

SCONTROL_STUB = r"""#!/usr/bin/env bash
echo "$*" >> "$STUB_LOG/scontrol.log"
[[ "$1 $2" == "show hostnames" ]] || exit 1
case "$3" in
    "gpu-node-[7-8]") printf 'gpu-node-7\ngpu-node-8\n' ;;
    "ghost-[1-2]") printf 'ghost-1\nghost-2\n' ;;
    *) exit 1 ;;
esac
"""

GETENT_STUB = r"""#!/usr/bin/env bash
[[ "$1" == ahostsv4 ]] || exit 1
case "$2" in
    gpu-node-7) [[ "${STUB_GETENT_LOOPBACK:-}" == first ]] && printf '127.0.1.1       STREAM gpu-node-7\n'
                [[ "${STUB_GETENT_LOOPBACK:-}" == only ]] && { printf '127.0.1.1       STREAM gpu-node-7\n'; exit 0; }
                printf '10.20.30.40     STREAM gpu-node-7\n10.20.30.40     DGRAM  \n10.20.30.40     RAW    \n' ;;
    gpu-node-8) printf '10.20.30.41     STREAM gpu-node-8\n' ;;
    *) exit 2 ;;
esac
"""

# a run script in the style of scripts/run_gpt2_*.sh that logs each time it starts
COUNTING_RUN_SCRIPT = r"""#!/usr/bin/env bash
set -euo pipefail
cd "$(dirname "$0")/.."
echo "NUM_GPUS=$NUM_GPUS LLM8_LAUNCHER=$LLM8_LAUNCHER args=$*" >> "$STUB_LOG/run_script.log"
source scripts/run_common.sh
run_gpt2 out_default -e model.bin -- "$@"
"""


def write_exe(path, text):
    path.write_text(text)
    path.chmod(0o755)
    return str(path)


def signals_as_in_a_terminal():
    """INT, TERM and HUP at their defaults in the launcher, as a command typed at a terminal gets them:
    pytest run as a background job of a script passes SIGINT on ignored, and under nohup SIGHUP, and
    bash cannot trap a signal ignored at its start, so the signal tests would measure how pytest was
    started, not the launcher (under nohup the HUP test failed: the launcher ignored HUP, as nohup asks)"""
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_DFL)


class Env:
    """stand-ins and a clean environment for one test"""

    def __init__(self, tmp_path):
        self.tmp = tmp_path
        self.log = tmp_path / "log"
        self.tmpdir = tmp_path / "tmpdir"  # the launcher's TMPDIR: where its id dirs go
        self.stubs = tmp_path / "stubs"
        tools = tmp_path / "tools"
        for d in (self.log, self.tmpdir, self.stubs, tools):
            d.mkdir()
        for tool in TOOLS:
            found = shutil.which(tool)
            assert found, f"{tool} not found"
            os.symlink(found, tools / tool)
        self.rank = write_exe(tmp_path / "rank_stub", RANK_STUB)
        self.run_script = write_exe(tmp_path / "run_stub.sh", RUN_SCRIPT_STUB)
        self.env = {k: v for k, v in os.environ.items()
                    if not k.startswith(("SLURM_", "LLM8_", "STUB_", "OMPI_", "PRTE_"))
                    and k not in ("CUDA_VISIBLE_DEVICES", "NCCL_MULTI_RANK_GPU_ENABLE", "NUM_GPUS", "OUT_DIR", "MODEL",
                                  "PRECISION", "RUN_SCRIPT")}
        self.env.update(PATH=f"{self.stubs}:{tools}", TMPDIR=str(self.tmpdir), STUB_LOG=str(self.log))

    def stub(self, name, text):
        write_exe(self.stubs / name, text)

    def records(self, kind="rank"):
        """[{key: value, 'args': [...]}] from the stand-ins of that kind, in file-name order"""
        out = []
        for name in sorted(os.listdir(self.log)):
            if name.startswith(kind + "."):
                rec = {"args": [], "file": name}
                for line in (self.log / name).read_text().splitlines():
                    key, value = line.split("=", 1)
                    if key == "arg":
                        rec["args"].append(value)
                    else:
                        rec[key] = value
                out.append(rec)
        return out

    def ranks(self):
        """{rank: record}; each rank at most once"""
        recs = self.records("rank")
        by_rank = {int(r["file"].split(".")[1]): r for r in recs}
        assert len(by_rank) == len(recs), [r["file"] for r in recs]
        return by_rank

    def popen(self, cmd, env_extra, cwd=None, preexec=signals_as_in_a_terminal):
        env = dict(self.env)
        for k, v in env_extra.items():
            if v is None:
                env.pop(k, None)
            else:
                env[k] = str(v)
        return subprocess.Popen([str(c) for c in cmd], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=env, cwd=cwd or self.tmp, start_new_session=True, preexec_fn=preexec)

    def finish(self, proc, timeout):
        """(returncode, stdout, stderr); a run past timeout is killed (its whole session) and fails the test"""
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_session(proc)
            out, err = proc.communicate()
            pytest.fail(f"still running after {timeout} s:\n{out[-2000:]}\n{err[-2000:]}")
        return proc.returncode, out, err

    def run(self, cmd, env_extra=(), timeout=20, cwd=None):
        proc = self.popen(cmd, dict(env_extra), cwd)
        try:
            return self.finish(proc, timeout)
        finally:
            kill_session(proc)

    def launch(self, args, cvd="0,1", timeout=20, **env_extra):
        """launch_one_node.sh ARGS with CUDA_VISIBLE_DEVICES=cvd (None: unset)"""
        return self.run(["bash", LAUNCH] + list(args), dict(env_extra, CUDA_VISIBLE_DEVICES=cvd), timeout)


def kill_session(proc):
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


def wait_for(condition, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


def fs_tail(pf, n, r, g):
    return ["-pi", "fs", "-pf", pf, "-pn", str(n), "-pr", str(r), "-pg", str(g)]


@pytest.fixture
def env(tmp_path):
    return Env(tmp_path)


# ---- launch_one_node.sh -m fs ------------------------------------------------------------------

@pytest.mark.parametrize("cvd,n_args,extra,ranks,pg", [
    ("0,1,2", [], {}, 3, 3),                                          # every visible GPU
    ("0,1,2,3", ["-n", "2"], {}, 2, 2),                               # fewer ranks than GPUs
    ("0,1", ["-n", "3"], {"NCCL_MULTI_RANK_GPU_ENABLE": 1}, 3, 2),    # 3 ranks share 2 GPUs
    (None, [], {}, 3, 3),                                             # no CUDA_VISIBLE_DEVICES: nvidia-smi -L's GPUs
], ids=["all-visible", "n-of-4", "shared-gpus", "nvidia-smi"])
def test_fs_ranks_get_their_flags_and_a_fresh_id_dir(env, cvd, n_args, extra, ranks, pg):
    if cvd is None:
        env.stub("nvidia-smi", NVIDIA_SMI_STUB)
    stale = env.tmpdir / "llm8_launch.stale"  # a crashed earlier launch's id dir
    stale.mkdir()
    (stale / "nccl_id").write_text("old")
    dirs = []
    for launch in range(2):
        for f in env.log.iterdir():
            f.unlink()
        rc, out, err = env.launch(n_args + ["-m", "fs", "--", env.rank, "-e", "model.bin", "-x", 2], cvd=cvd, **extra)
        assert rc == 0, err
        got = env.ranks()
        assert sorted(got) == list(range(ranks)), got
        pf = got[0]["args"][7]
        for r, rec in got.items():
            assert rec["args"] == ["-e", "model.bin", "-x", "2"] + fs_tail(pf, ranks, r, pg), rec
            assert rec["pf_state"] == "dir 0", rec  # there and empty when the ranks start
        assert os.path.dirname(pf) == str(env.tmpdir) and os.path.basename(pf).startswith("llm8_launch.")
        assert sorted(os.listdir(env.tmpdir)) == ["llm8_launch.stale"], "the id dir outlived the launch"
        dirs.append(pf)
    assert dirs[0] != dirs[1] and str(stale) not in dirs


@pytest.mark.parametrize("failing,status", [(2, 7), (0, 1)])
def test_first_failing_rank_sets_the_status_and_the_others_are_stopped(env, failing, status):
    start = time.monotonic()
    rc, out, err = env.launch(["-m", "fs", "--", env.rank], cvd="0,1,2,3", STUB_EVERY_RANK="hang",
                              **{f"STUB_RANK_{failing}": f"1 {status}"})
    elapsed = time.monotonic() - start
    assert rc == status, err
    assert elapsed < HANG_S / 3, f"the launcher waited out the hanging ranks ({elapsed:.1f} s)"
    got = env.ranks()
    assert sorted(got) == [0, 1, 2, 3]
    assert not [r for r, rec in got.items() if alive(int(rec["pid"]))], "ranks left running"
    lines = err.strip().splitlines()
    assert lines[0] == f"launch_one_node.sh: rank {failing} of 4 failed (exit status {status}); stopping the other ranks"
    assert lines[-1] == f"launch_one_node.sh: rank {failing} of 4 failed first (exit status {status})", err
    for r in set(range(4)) - {failing}:
        assert f"launch_one_node.sh: rank {r}: exit status 143 (stopped by launch_one_node.sh)" in lines, err
    assert os.listdir(env.tmpdir) == []


@pytest.mark.parametrize("sig", ["INT", "TERM", "HUP"])
def test_a_signal_stops_every_rank(env, sig):
    """INT as Ctrl-C sends it, to the whole foreground process group (the ranks, background jobs
    of a script, ignore it: the launcher must pass it on as TERM); TERM and HUP to the launcher only"""
    proc = env.popen(["bash", LAUNCH, "-m", "fs", "--", env.rank], {"CUDA_VISIBLE_DEVICES": "0,1,2",
                                                                    "STUB_EVERY_RANK": "hang"})
    try:
        assert wait_for(lambda: len(env.records()) == 3), "the ranks did not start"
        time.sleep(0.2)  # the launcher is in its wait loop
        signum = getattr(signal, "SIG" + sig)
        sent = time.monotonic()
        if sig == "INT":
            os.killpg(proc.pid, signum)
        else:
            proc.send_signal(signum)
        rc, out, err = env.finish(proc, timeout=15)
        assert time.monotonic() - sent < HANG_S / 3
    finally:
        kill_session(proc)
    assert rc == 128 + signum, err
    assert f"launch_one_node.sh: {sig}: stopping all 3 ranks (again to kill them)" in err.splitlines(), err
    assert not [r for r, rec in env.ranks().items() if alive(int(rec["pid"]))], "ranks left running"
    assert os.listdir(env.tmpdir) == []


def hup_ignored_as_under_nohup():
    signals_as_in_a_terminal()
    signal.signal(signal.SIGHUP, signal.SIG_IGN)


@pytest.mark.parametrize("stub,preexec,first", [
    ("stubborn", signals_as_in_a_terminal, signal.SIGTERM),
    ("hang", hup_ignored_as_under_nohup, signal.SIGHUP),
], ids=["a-second-signal-kills-ranks-that-ignore-term", "under-nohup-hup-is-ignored"])
def test_a_launch_that_goes_on_after_a_signal(env, stub, preexec, first):
    """ranks that ignore TERM outlive the first signal's TERM, and the second signal KILLs them; a launch
    started with HUP ignored (nohup) goes on after a HUP, the launcher and its ranks alike, as nohup
    asks (bash cannot trap it), and TERM stops it"""
    proc = env.popen(["bash", LAUNCH, "-n", 2, "-m", "fs", "--", env.rank], {"CUDA_VISIBLE_DEVICES": "0,1",
                                                                             "STUB_EVERY_RANK": stub},
                     preexec=preexec)
    try:
        assert wait_for(lambda: len(env.records()) == 2), "the ranks did not start"
        time.sleep(0.2)
        proc.send_signal(first)
        time.sleep(1.0)
        pids = [int(rec["pid"]) for rec in env.records()]
        assert proc.poll() is None and all(alive(p) for p in pids), f"{first.name} stopped the launch"
        proc.send_signal(signal.SIGTERM)
        rc, out, err = env.finish(proc, timeout=10)
    finally:
        kill_session(proc)
    assert rc == 128 + signal.SIGTERM, err
    assert err.splitlines()[0] == "launch_one_node.sh: TERM: stopping all 2 ranks (again to kill them)", err  # not HUP
    assert not [p for p in pids if alive(p)]
    assert os.listdir(env.tmpdir) == []


REFUSALS = [(["-m", "fs", "--", "RANK", "-x", 2, flag, "1"], "0,1", {}, f"the command sets {flag}, which this launcher")
            for flag in ("-pn", "-pr", "-pg", "-pi", "-pf", "-ps")] + [
    (["-n", value, "-m", "fs", "--", "RANK"], "0,1", {}, f"-n '{value}' is not a positive whole number of GPUs")
    for value in ("0", "-2", "two", "1.5", "", "02")] + [
    (["-n"], "0,1", {}, "-n needs a value"),
    (["-n", "3", "-m", "fs", "--", "RANK"], "0,1", {}, "-n 3 asks for more ranks than the 2 visible GPU(s) (set NCCL_MULTI_RANK_GPU_ENABLE=1"),
    (["-n", "3", "-m", "fs", "--", "RANK"], "0,1", {"NCCL_MULTI_RANK_GPU_ENABLE": "0"}, "asks for more ranks than the 2"),
    (["-x", "--", "RANK"], "0,1", {}, "unknown option '-x'"),
    ([], "0,1", {}, "no command given"),
    (["-n", "2", "-m", "fs", "--"], "0,1", {}, "no command given"),
    (["-m", "ssh", "--", "RANK"], "0,1", {}, "-m 'ssh' (or LLM8_LAUNCH_METHOD) is not mpi or fs"),
    (["--", "RANK"], "0,1", {"LLM8_LAUNCH_METHOD": "pmix"}, "-m 'pmix' (or LLM8_LAUNCH_METHOD) is not mpi or fs"),
    (["-m", "mpi", "--", "RANK"], "0,1", {}, "-m mpi: mpirun is not on PATH"),
    (["-m", "fs", "--", "RANK"], "", {}, "no GPU is visible"),
    (["-n", "2", "-m", "fs", "--", "RANK"], "", {"NCCL_MULTI_RANK_GPU_ENABLE": "1"}, "no GPU is visible"),
    (["-m", "fs", "--", "RANK"], None, {}, "cannot count the GPUs"),
]


@pytest.mark.parametrize("args,cvd,extra,message", REFUSALS, ids=[f"{i}-" + re.sub(r"\W+", "-", r[3][:28]).strip("-") for i, r in enumerate(REFUSALS)])
def test_refusals_are_one_line_and_start_nothing(env, args, cvd, extra, message):
    rc, out, err = env.launch([env.rank if a == "RANK" else a for a in args], cvd=cvd, **extra)
    assert rc == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("launch_one_node.sh: error: ") and message in lines[0], err
    assert out == "" and env.records() == [] and os.listdir(env.tmpdir) == []


@pytest.mark.parametrize("flag", ["-h", "--help"])
def test_help_prints_the_usage_and_starts_nothing(env, flag):
    rc, out, err = env.launch([flag, "--", env.rank], cvd="0,1")
    assert rc == 0 and err == "", err
    lines = out.splitlines()
    assert lines[0].startswith("launch_one_node.sh: run an llm8 training command")
    assert any(line.strip().startswith("-m mpi|fs") for line in lines) and not any("Why" in line for line in lines), out
    assert env.records() == [] and os.listdir(env.tmpdir) == []


@pytest.mark.parametrize("form", ["bash", "path"])
def test_a_run_script_runs_once_with_the_launch_settings(env, form):
    command = (["bash", env.run_script] if form == "bash" else [env.run_script]) + ["-x", "5", "-e", "d12"]
    rc, out, err = env.launch(["-n", "3", "-m", "fs", "--"] + command, cvd="0,1,2,3")
    assert rc == 0, err
    recs = env.records("runscript")
    assert len(recs) == 1, recs
    assert recs[0]["NUM_GPUS"] == "3" and recs[0]["LLM8_LAUNCH_METHOD"] == "fs"
    assert recs[0]["LLM8_LAUNCHER"] == LAUNCH and recs[0]["args"] == ["-x", "5", "-e", "d12"]
    assert env.records() == [] and os.listdir(env.tmpdir) == []


def test_run_common_calls_the_launcher_back_for_the_ranks(env, tmp_path):
    """the real scripts/run_gpt2_124M_bf16.sh, its trainer the stand-in (LLM8_TRAINER)"""
    out_dir = str(tmp_path / "out")
    rc, out, err = env.launch(["-n", "2", "-m", "fs", "--", "bash", os.path.join(ROOT, "scripts", "run_gpt2_124M_bf16.sh"),
                               "-x", "3"], cvd="0,1", LLM8_TRAINER=env.rank, OUT_DIR=out_dir)
    assert rc == 0, err
    got = env.ranks()
    assert sorted(got) == [0, 1]
    pf = got[0]["args"][-7]
    for r, rec in got.items():
        assert rec["args"][:4] == ["-p", "bf16", "-e", "d12"], rec
        assert rec["args"][-18:] == ["-o", out_dir, "-y", "1", "-z", "1", "-x", "3"] + fs_tail(pf, 2, r, 2), rec
        assert rec["cwd"] == ROOT
    assert os.listdir(env.tmpdir) == []


def test_a_trainer_named_sh_starts_on_every_rank_when_run_common_says_so(env, tmp_path):
    """a trainer wrapper named *.sh (LLM8_TRAINER=wrap.sh: env variables, nsys) that run_common.sh hands the launcher
    with LLM8_LAUNCH_COMMAND=trainer starts on both ranks with their flags; without it, as a command of the user's, it
    is taken for a run script and started once"""
    wrapper = write_exe(tmp_path / "wrap.sh", RANK_STUB)
    rc, out, err = env.launch(["-n", "2", "-m", "fs", "--", wrapper, "-x", "1"], cvd="0,1", LLM8_LAUNCH_COMMAND="trainer")
    assert rc == 0, err
    got = env.ranks()
    assert sorted(got) == [0, 1] and all("-pn" in rec["args"] for rec in got.values()), got


def test_run_script_started_elsewhere_takes_relative_env_paths_from_there(env, tmp_path):
    """run_gpt2_124M_fp8.sh started from another directory, OUT_DIR=myrun and LLM8_TRAINER=./bin/trainer.sh relative
    to it: the trainer (found there) runs in the checkout and writes to that directory's myrun, not the checkout's"""
    caller = tmp_path / "caller"
    (caller / "bin").mkdir(parents=True)
    write_exe(caller / "bin" / "trainer.sh", RANK_STUB)
    rc, out, err = env.run(["bash", os.path.join(ROOT, "scripts", "run_gpt2_124M_fp8.sh"), "-x", "1"],
                           {"OUT_DIR": "myrun", "LLM8_TRAINER": "./bin/trainer.sh"}, cwd=caller)
    assert rc == 0, err
    (rec,) = env.records("rank")
    assert rec["cwd"] == ROOT and rec["args"][-10:] == ["-o", str(caller / "myrun"), "-y", "1", "-z", "0", "-p", "fp8",
                                                         "-x", "1"], rec


# ---- launch_one_node.sh -m mpi ------------------------------------------------------------------

@pytest.mark.parametrize("method_args,extra,mpirun,expect", [
    (["-m", "mpi"], {}, True, "mpi"),
    ([], {}, True, "mpi"),                              # default: mpirun is on PATH
    ([], {}, False, "fs"),                              # default: it is not
    ([], {"LLM8_LAUNCH_METHOD": "fs"}, True, "fs"),
    (["-m", "fs"], {"LLM8_LAUNCH_METHOD": "mpi"}, True, "fs"),
], ids=["-m-mpi", "default-mpirun", "default-none", "env-fs", "flag-wins"])
def test_launch_method(env, method_args, extra, mpirun, expect):
    if mpirun:
        env.stub("mpirun", MPIRUN_STUB)
    rc, out, err = env.launch(["-n", "2"] + method_args + ["--", env.rank, "-x", "2"], cvd="0,1", **extra)
    assert rc == 0, err
    if expect == "mpi":
        recs = env.records("mpirun")
        assert [r["args"] for r in recs] == [["-np", "2", "--bind-to", "none", env.rank, "-x", "2"]]
        assert env.records() == []
    else:
        assert env.records("mpirun") == [] and sorted(env.ranks()) == [0, 1]


def test_launch_default_is_fs_for_a_program_built_without_mpi(env, tmp_path):
    """mpirun on PATH, but the command an ELF program that links no libmpi (a trainer built where the Makefile found no
    OpenMPI, in a container whose mpirun is another MPI's): under mpirun each copy would see a world of 1, so the
    default is fs, with a note; here the program is Python, which records the flags each rank got"""
    env.stub("mpirun", MPIRUN_STUB)
    ranks = tmp_path / "python_ranks"
    ranks.mkdir()
    code = ("import os, sys; a = sys.argv[1:]; "
            f"open(os.path.join({str(ranks)!r}, a[a.index('-pr') + 1]), 'w').write(' '.join(a))")
    rc, out, err = env.launch(["-n", "2", "--", sys.executable, "-c", code], cvd="0,1")
    assert rc == 0, err
    assert env.records("mpirun") == []
    assert sorted(os.listdir(ranks)) == ["0", "1"]
    assert all(re.fullmatch(r"-pi fs -pf \S+ -pn 2 -pr \d -pg 2", (ranks / r).read_text()) for r in ("0", "1"))
    assert f"note: mpirun is on PATH, but {sys.executable} was built without MPI" in err, err


@pytest.mark.parametrize("preset", [None, "0"], ids=["unset", "user-set"])
def test_mpirun_as_root_is_allowed_unless_the_user_said(env, preset):
    """OpenMPI's mpirun refuses root unless both variables are 1 (GPU containers often run as root): the launcher sets
    them for root, keeps a value the user set, and leaves them unset for anyone else"""
    env.stub("mpirun", MPIRUN_STUB)
    rc, out, err = env.launch(["-n", "2", "-m", "mpi", "--", env.rank], cvd="0,1", OMPI_ALLOW_RUN_AS_ROOT=preset)
    assert rc == 0, err
    (rec,) = env.records("mpirun")
    expected = (preset or "1") if os.geteuid() == 0 else (preset or "unset")
    assert rec["OMPI_ALLOW_RUN_AS_ROOT"] == expected, rec
    assert rec["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] == ("1" if os.geteuid() == 0 else "unset"), rec


@pytest.mark.parametrize("preset", [None, "package"], ids=["unset", "user-set"])
def test_mpirun_may_start_more_ranks_than_slots(env, preset):
    """OpenMPI counts slots (a Slurm allocation's tasks, else the cores) and refuses more ranks: the launcher allows
    oversubscription for OpenMPI 4 and 5 alike, keeping a mapping policy the user set"""
    env.stub("mpirun", MPIRUN_STUB)
    rc, out, err = env.launch(["-n", "2", "-m", "mpi", "--", env.rank], cvd="0,1",
                              PRTE_MCA_rmaps_default_mapping_policy=preset)
    assert rc == 0, err
    (rec,) = env.records("mpirun")
    assert rec["OMPI_MCA_rmaps_base_oversubscribe"] == "1", rec
    assert rec["PRTE_MCA_rmaps_default_mapping_policy"] == (preset or ":oversubscribe"), rec


def test_real_mpirun_starts_a_rank_per_gpu_in_a_one_task_slurm_allocation(env):
    """OpenMPI's own mpirun (not a stand-in) inside `salloc --gpus=3` (one task, so one slot): every rank starts,
    where plain `mpirun -np 3` stops at "not enough slots" (LLM8_REQUIRE_MPI=1 fails the test without OpenMPI)"""
    real = shutil.which("mpirun")
    ompi = real is not None and "Open MPI" in subprocess.run([real, "--version"], capture_output=True, text=True).stdout
    if not ompi:
        if os.environ.get("LLM8_REQUIRE_MPI") == "1":
            pytest.fail("LLM8_REQUIRE_MPI=1 but OpenMPI's mpirun is missing (apt-get install openmpi-bin)")
        pytest.skip("OpenMPI's mpirun is not installed")
    host = subprocess.run(["hostname"], capture_output=True, text=True).stdout.strip()
    allocation = dict(PATH=env.env["PATH"] + ":" + os.environ["PATH"],  # what mpirun starts (ssh, orted) as well
                      SLURM_JOB_ID=77, SLURM_JOBID=77, SLURM_NODELIST=host, SLURM_JOB_NODELIST=host, SLURM_NNODES=1,
                      SLURM_JOB_NUM_NODES=1, SLURM_NTASKS=1, SLURM_TASKS_PER_NODE=1, SLURM_JOB_CPUS_PER_NODE=1,
                      OMPI_ALLOW_RUN_AS_ROOT=1, OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1)
    plain = env.run([real, "-np", 3, "--bind-to", "none", env.rank], allocation, timeout=60)
    assert plain[0] != 0 and "not enough slots" in plain[1] + plain[2], plain  # the case this guards
    shutil.rmtree(env.log)
    env.log.mkdir()
    rc, out, err = env.launch(["-n", "3", "-m", "mpi", "--", env.rank], cvd="0,1,2", timeout=60, **allocation)
    assert rc == 0, err[-2000:]
    assert len(env.records("rank")) == 3, (out[-2000:], err[-2000:])


# ---- slurm_gpt2.sbatch ----------------------------------------------------------------------

@pytest.fixture
def slurm(env, tmp_path):
    """a checkout (the real scripts, linked) and a 2-node x 2-GPU job; returns (env, checkout, job env)"""
    checkout = tmp_path / "llm8"
    (checkout / "scripts").mkdir(parents=True)
    (checkout / "train_gpt2_fp8.cu").write_text("")
    for name in ("slurm_gpt2.sbatch", "run_common.sh", "script_help.sh", "enter_checkout.sh", "run_gpt2_124M_bf16.sh"):
        os.symlink(os.path.join(ROOT, "scripts", name), checkout / "scripts" / name)
    write_exe(checkout / "scripts" / "counting_run.sh", COUNTING_RUN_SCRIPT)
    for name, text in (("srun", SRUN_STUB), ("scontrol", SCONTROL_STUB), ("getent", GETENT_STUB)):
        env.stub(name, text)
    job = {"SLURM_JOB_ID": "4242", "SLURM_SUBMIT_DIR": str(checkout), "SLURM_NTASKS": "4", "SLURM_JOB_NUM_NODES": "2",
           "SLURM_GPUS_ON_NODE": "2", "SLURM_CPUS_PER_TASK": "3", "SLURM_JOB_NODELIST": "gpu-node-[7-8]",
           "LLM8_TRAINER": env.rank, "RUN_SCRIPT": "scripts/counting_run.sh", "OUT_DIR": str(tmp_path / "out")}
    return env, checkout, job


def sbatch(env, job, args=(), timeout=30, **extra):
    """bash slurm_gpt2.sbatch, from elsewhere than the checkout (as a job starts in the submit dir)"""
    return env.run(["bash", SBATCH] + list(args), dict(job, **extra), timeout=timeout, cwd=env.tmp)


def check_srun_steps(env, steps):
    recs = env.records("srun")
    assert len(recs) == steps, recs
    for rec in recs:
        assert rec["args"][:4] == ["--ntasks=4", "--cpus-per-task=3", "--kill-on-bad-exit=1", "bash"], rec
        assert rec["args"][6:8] == ["llm8-rank", env.rank], rec


def test_slurm_fs_runs_the_script_once_and_one_srun_step(slurm):
    env, checkout, job = slurm
    rc, out, err = sbatch(env, job, ["-x", "5"])
    assert rc == 0, err
    assert "slurm_gpt2.sbatch: job 4242: scripts/counting_run.sh on 4 GPUs (2 nodes), NCCL id by fs" in out
    runs = (env.log / "run_script.log").read_text().splitlines()
    assert runs == [f"NUM_GPUS=4 LLM8_LAUNCHER={checkout}/scripts/slurm_gpt2.sbatch args=-x 5"]
    check_srun_steps(env, 1)
    got = env.ranks()
    assert sorted(got) == [0, 1, 2, 3]
    pf = got[0]["args"][-7]
    assert os.path.dirname(pf) == str(checkout / "llm8_nccl" / "4242") and os.path.basename(pf).startswith("launch.")
    for r, rec in got.items():
        assert rec["args"] == ["-e", "model.bin", "-o", job["OUT_DIR"], "-y", "1", "-z", "1", "-x", "5",
                               "-pi", "fs", "-pf", pf, "-pn", "4", "-pr", str(r), "-pg", "0"], rec
        assert rec["SLURM_PROCID"] == str(r) and rec["pf_state"] == "dir 0" and rec["cwd"] == str(checkout)
    assert not (checkout / "llm8_nccl").exists(), "the id directories outlived the job"


@pytest.mark.parametrize("port,loopback", [(None, None), ("23456", None), (None, "first")],
                         ids=["default-port", "port", "loopback-listed-first"])
def test_slurm_tcp_serves_the_id_at_the_first_nodes_address(slurm, port, loopback):
    """the first node's first address that is not loopback (a Debian /etc/hosts lists 127.0.1.1 for the machine's own
    name first: rank 0 would listen where no other node reaches it)"""
    env, checkout, job = slurm
    rc, out, err = sbatch(env, job, LLM8_INIT="tcp", LLM8_TCP_PORT=port, STUB_GETENT_LOOPBACK=loopback)
    assert rc == 0, err
    assert (env.log / "scontrol.log").read_text().splitlines() == ["show hostnames gpu-node-[7-8]"]
    check_srun_steps(env, 1)
    got = env.ranks()
    assert sorted(got) == [0, 1, 2, 3]
    for r, rec in got.items():
        assert rec["args"][-10:] == ["-pi", "tcp", "-ps", f"10.20.30.40:{port or 12345}", "-pn", "4", "-pr", str(r),
                                     "-pg", "0"], rec
    assert not (checkout / "llm8_nccl").exists()


def test_slurm_the_default_run_script(slurm):
    env, checkout, job = slurm
    job.pop("RUN_SCRIPT")
    rc, out, err = sbatch(env, job, MODEL="124M", PRECISION="bf16")
    assert rc == 0, err
    assert "scripts/run_gpt2_124M_bf16.sh on 4 GPUs" in out
    check_srun_steps(env, 1)
    got = env.ranks()
    assert sorted(got) == [0, 1, 2, 3]
    for r, rec in got.items():
        assert rec["args"][:4] == ["-p", "bf16", "-e", "d12"] and rec["args"][-4:] == ["-pr", str(r), "-pg", "0"], rec


def test_slurm_a_failed_step_is_retried_as_new_steps_not_new_batch_runs(slurm):
    """rank 1 fails every time, after rank 0 trained a step: run_common.sh's 3 attempts are 3 srun steps, each with its
    own id dir"""
    env, checkout, job = slurm
    rc, out, err = sbatch(env, job, STUB_RANK_1="0 1", STUB_TRAINS="1")
    assert rc == 1, err
    assert len((env.log / "run_script.log").read_text().splitlines()) == 1
    assert "trainer failed with exit status 1 (attempt 3 of 3)" in err and err.startswith("counting_run.sh (-o "), err
    check_srun_steps(env, 3)
    recs = env.records()
    assert len(recs) == 12
    assert len({rec["args"][-7] for rec in recs}) == 3
    assert not (checkout / "llm8_nccl").exists()


@pytest.mark.parametrize("extra,message", [
    ({"SLURM_JOB_ID": None}, "not inside a Slurm job; submit it with: sbatch scripts/slurm_gpt2.sbatch"),
    ({"LLM8_INIT": "udp"}, "LLM8_INIT='udp' (expected fs or tcp)"),
    ({"LLM8_DIR": "/"}, "/ is not the llm8 checkout"),
    ({"RUN_SCRIPT": None, "MODEL": "999M"}, "run script 'scripts/run_gpt2_999M_fp8.sh' not found"),
    ({"LLM8_SLURM_ROLE": "ranks", "ARGS": ["-n", "2", "--", "TRAINER"]},
     "asked for 2 ranks but the job has SLURM_NTASKS=4 tasks"),
    ({"LLM8_SLURM_ROLE": "ranks", "ARGS": ["-n", "4", "TRAINER"]}, "launcher role: expected -n N -- COMMAND"),
    ({"LLM8_SLURM_ROLE": "ranks", "LLM8_INIT": "tcp", "SLURM_JOB_NODELIST": "ghost-[1-2]",
      "ARGS": ["-n", "4", "--", "TRAINER"]}, "LLM8_INIT=tcp: no IPv4 address but loopback (127.x) for the first node "
                                            "'ghost-1' (getent ahostsv4); use LLM8_INIT=fs"),
    ({"LLM8_SLURM_ROLE": "ranks", "LLM8_INIT": "tcp", "STUB_GETENT_LOOPBACK": "only",
      "ARGS": ["-n", "4", "--", "TRAINER"]}, "LLM8_INIT=tcp: no IPv4 address but loopback (127.x) for the first node "
                                            "'gpu-node-7'"),
], ids=["no-job", "init", "not-checkout", "no-run-script", "rank-count", "role-usage", "no-address", "loopback-only"])
def test_slurm_refusals_are_one_line(slurm, extra, message):
    env, checkout, job = slurm
    args = [env.rank if a == "TRAINER" else a for a in extra.pop("ARGS", [])]
    rc, out, err = sbatch(env, job, args, **extra)
    assert rc == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("slurm_gpt2.sbatch: error: ") and message in lines[0], err
    assert env.records("srun") == [] and env.records() == []


# ---- end to end: the cudasim trainer as 2 ranks ----------------------------------------------------

@pytest.fixture
def sim_data(tmp_path):
    if not os.path.exists(SIM_TRAINER):
        pytest.skip(f"{SIM_TRAINER} is not built (make build/sim/train_gpt2_fp8)")
    d = tmp_path / "data"
    d.mkdir()
    sim_model.write_run_files(d, 20_000)
    return d


def sim_flags(d, out):
    return ["-e", d / "model.bin", "-i", d / "s_train_*.bin", "-j", d / "s_val_*.bin", "-t", 64, "-b", 4, "-x", 2,
            "-v", 0, "-s", 0, "-o", out]


def check_two_rank_run(rc, out, err):
    assert rc == 0, err[-3000:]
    steps = re.findall(r"^step\s+(\d+)/2 \| loss (\S+) \|", out, re.M)
    assert [s for s, _ in steps] == ["1", "2"], out[-3000:]  # rank 0 prints them, once
    assert all(0 < float(loss) < 20 for _, loss in steps), steps
    assert re.search(r"^zero \| ZeRO-1 over 2 ranks \(-pi fs\)", out, re.M), out[:3000]


def test_sim_trainer_two_ranks_through_launch_one_node(env, sim_data, tmp_path):
    rc, out, err = env.launch(["-n", "2", "-m", "fs", "--", SIM_TRAINER] + sim_flags(sim_data, tmp_path / "out"),
                              cvd="0", timeout=240, NCCL_MULTI_RANK_GPU_ENABLE=1)
    check_two_rank_run(rc, out, err)
    assert os.listdir(env.tmpdir) == []


def test_sim_trainer_two_ranks_through_slurm(slurm, sim_data, tmp_path):
    """one node, one GPU, 2 tasks: the sbatch's flag order reaches the real trainer through srun"""
    env, checkout, job = slurm
    job.update(SLURM_NTASKS="2", SLURM_JOB_NUM_NODES="1", SLURM_GPUS_ON_NODE="1", LLM8_TRAINER=SIM_TRAINER,
               NCCL_MULTI_RANK_GPU_ENABLE="1")
    rc, out, err = sbatch(env, job, sim_flags(sim_data, tmp_path / "out"), timeout=240)
    check_two_rank_run(rc, out, err)
    check = env.records("srun")
    assert len(check) == 1 and check[0]["args"][0] == "--ntasks=2"
    assert not (checkout / "llm8_nccl").exists()


# ---- run_common.sh on its own: the micro-batch fit and the retries ---------------------------------

# logs its arguments; with STUB_TRAINS=1 the run trained a step first (a train line appended to -o's main.log), with
# STUB_TRAINS=rewrite it started over and wrote the same line again (main.log truncated: -y 1 found no checkpoint)
RUN_COMMON_STUB_LAUNCHER = r"""#!/usr/bin/env bash
echo "$*" >> "$STUB_LOG/launcher.log"
args=("$@")
for (( i = 0; i + 1 < $#; i++ )); do [[ "${args[i]}" == -o ]] && out="${args[i+1]}"; done
if [[ "${STUB_TRAINS:-}" == 1 ]]; then mkdir -p "$out" && echo "s:0 trl:1.0000 lr:0.000600 norm:1.00" >> "$out/main.log"; fi
if [[ "${STUB_TRAINS:-}" == rewrite ]]; then mkdir -p "$out" && echo "s:0 trl:1.0000 lr:0.000600 norm:1.00" > "$out/main.log"; fi
exit "${STUB_STATUS:-0}"
"""


def run_common(tmp_path, num_gpus, user_args=(), status=0, trains="1"):
    """run_gpt2 with llm.c's 124M batch flags, its launcher a stub that logs its arguments (and, trains, a step into
    main.log) and exits with `status`; returns (exit status, stderr, the launcher's argument lines)"""
    launcher = tmp_path / "launcher.sh"
    launcher.write_text(RUN_COMMON_STUB_LAUNCHER)
    script = ('source "$ROOT/scripts/run_common.sh"; '
              'run_gpt2 out_default -e d12 -b 64 -t 1024 -d 524288 -l 0.0006 -- "$@"')
    env = dict(os.environ, ROOT=ROOT, STUB_LOG=str(tmp_path), LLM8_LAUNCHER=str(launcher), LLM8_TRAINER="trainer",
               NUM_GPUS=str(num_gpus), STUB_STATUS=str(status), STUB_TRAINS=trains)
    r = subprocess.run(["bash", "-c", script, "run_stub.sh"] + list(user_args), env=env, capture_output=True, text=True,
                       timeout=30, cwd=tmp_path)
    log = tmp_path / "launcher.log"
    return r.returncode, r.stderr, log.read_text().splitlines() if log.exists() else []


def flag_value(line, flag):
    words = line.split()
    return [words[i + 1] for i in range(len(words) - 1) if words[i] == flag][-1]


@pytest.mark.parametrize("num_gpus,user_args,expected_b", [
    (8, [], "64"),              # llm.c's 8 GPUs: 64 x 1024 x 8 = -d, one micro-step
    (2, [], "64"),              # fewer: gradient accumulation
    (16, [], "32"),             # more: the per-GPU micro-batch shrinks, -d stays
    (64, [], "8"),
    (16, ["-b", "16"], "16"),   # the user's -b wins, untouched
], ids=["8", "2", "16", "64", "user-b"])
def test_run_common_fits_the_micro_batch_to_the_gpus(tmp_path, num_gpus, user_args, expected_b):
    rc, err, lines = run_common(tmp_path, num_gpus, user_args)
    assert rc == 0 and len(lines) == 1, err
    assert flag_value(lines[0], "-b") == expected_b and flag_value(lines[0], "-d") == "524288", lines[0]
    assert ("does not divide -d 524288" in err) == (expected_b not in ("64",) and not user_args), err


def test_run_common_watches_the_users_o(tmp_path):
    """-o among the user's flags (the last wins in the trainer): the retry watches that main.log, so a run that trained
    a step there and failed is resumed (it was taken for a failure before the first step, watched in the default)"""
    rc, err, lines = run_common(tmp_path, 2, ["-o", "user_out"], status=1, trains="1")
    assert rc == 1 and len(lines) == 3, (rc, err)
    assert "run_stub.sh (-o user_out): trainer failed with exit status 1 (attempt 3 of 3)" in err, err


@pytest.mark.parametrize("status,trains,attempts", [(1, "1", 3), (1, "rewrite", 3), (1, "0", 1), (130, "1", 1), (143, "1", 1)],
                         ids=["failure", "failure-after-starting-over", "failure-before-a-step", "sigint", "sigterm"])
def test_run_common_retries_failures_but_not_signals(tmp_path, status, trains, attempts):
    """a run that failed after training a step resumes up to 3 times; one that failed before its first step (a missing
    shard: it would fail alike again), or was stopped by Ctrl-C or kill (a launcher exits 130 or 143 after stopping its
    ranks), is not started again, and the status comes back"""
    rc, err, lines = run_common(tmp_path, 2, status=status, trains=trains)
    assert rc == status and len(lines) == attempts, (rc, err)
    assert ("not retried" in err) == (attempts == 1), err
    assert ("before its first step" in err) == (trains == "0"), err

