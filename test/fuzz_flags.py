"""
fuzz_flags.py: random combinations of the GPU trainer's flags and model shapes, under cudasim,
against what must hold for every one of them.

Why: the trainer's options multiply (precision, scaling recipe, weight and gradient scaling,
which linears and passes run in FP8, fc's GEMM writing fcproj's codes, optimizer, master weights,
recompute, GELU fusion, ZeRO stage, rank count, gradient reduce, schedule), and test_sim_trainer.py checks a hand-picked
dozen of the combinations. This driver draws them at random, with a random model (1-3 layers,
1-3 heads of 64 or 128, vocabularies that are and are not multiples of 128), batch shape and
gradient accumulation, and checks each drawn run (build/sim/train_gpt2_fp8 on the twin-batch
shard: every sample the same B*T tokens, so the rank count changes no bit):
- it trains 4 steps with finite losses, or stops at startup with exactly one error line
  (REFUSED: a combination the trainer declines, which the report lists for a reader to judge);
- its first loss is train_gpt2cpu's fp32 loss within bf16's (3e-3) or FP8's (3e-2) precision;
- resumed from its step-2 checkpoint it repeats steps 3 and 4 bit for bit, model file included;
- N = 2 or 3 ranks (ZeRO-1 or -3; 3 with -pa fp32) train the 1-rank model bit for bit, the
  model file included (losses within 1e-6 for 3 ranks, whose mean may round), with cudasim
  running the streams' work newest first;
- that N-rank run's step-2 checkpoint resumed on 1 rank repeats the 1-rank steps 3 and 4.
Anything else is a BUG: a crash or hang, several error lines, a non-finite loss, a mismatch.

Usage: python3 test/fuzz_flags.py [--seed N] [--count N] [-v]
test/test_fuzz_flags.py runs two fixed seeds under pytest (make test). A seed takes 10 to 60 s.
"""
import argparse
import os
import random
import shutil
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dev_modules import load_dev_bench_module  # noqa: E402
import sim_model  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIM = os.path.join(ROOT, "build", "sim", "train_gpt2_fp8")
CPU = os.path.join(ROOT, "train_gpt2cpu")
RUN_LIMIT_S = 900
LINEARS = ["qkv", "attproj", "fc", "fcproj", "lm_head"]
PASSES = ["fwd", "dgrad", "wgrad"]
bench = load_dev_bench_module("bench")  # run_programs: the ranks side by side, killed at a limit


def draw(rng):
    """(model shape, (B, T, micro-steps per step), flags, ranks, extra flags of the N-rank run)"""
    heads, head_size = rng.choice([1, 2, 3]), rng.choice([64, 128])
    model = dict(layers=rng.choice([1, 2, 3]), heads=heads, channels=heads * head_size, vocab=rng.choice([997, 1000, 2048]))
    B, T = rng.choice([(4, 64), (2, 128), (8, 32)])
    f = {"-p": rng.choice(["bf16", "fp8", "fp8", "fp8"])}
    if f["-p"] == "fp8":
        f["-fr"] = rng.choice(["delayed", "current", "block"])
        r = rng.random()
        if r < 0.3:
            f["-f8"] = "all"
        elif r < 0.6:
            f["-f8"] = ",".join(rng.sample(LINEARS, rng.randint(1, 5)))
        if rng.random() < 0.3:
            items = rng.sample(PASSES, rng.randint(1, 3))
            if rng.random() < 0.5:
                items.append(rng.choice(LINEARS[:4]) + "." + rng.choice(PASSES))
            f["-f8p"] = ",".join(items)
        if f["-fr"] != "block":  # -fw delayed needs every pass in FP8 (now and then drawn anyway: the refusal)
            f["-fw"] = rng.choice(["current", "delayed"]) if "-f8p" not in f or rng.random() < 0.1 else "current"
            f["-fg"] = rng.choice(["current", "delayed", "pow2"])
        f["-fh"], f["-fm"] = rng.choice([1, 2, 16]), rng.choice([0, 0, 1, 3])
    f["-opt"] = rng.choice(["adamw", "adamw8"])
    if f["-opt"] == "adamw8":
        f["-qs"] = rng.choice(["default", "all", "none"])
    f["-w"], f["-r"], f["-ge"] = rng.choice([0, 1]), rng.choice([0, 1, 2]), rng.choice([0, 1, 2])
    f["-c"], f["-k"], f["-u"], f["-q"] = rng.choice([0, 0.1]), rng.choice(["cosine", "linear", "constant", "wsd"]), \
        rng.choice([0, 2]), rng.choice([1, 0.1])
    ranks = rng.choice([2, 2, 3])
    zero3 = f.get("-fw") != "delayed" and "-f8p" not in f  # what -z 3 takes (now and then drawn anyway)
    rank_flags = ["-z", 3 if (zero3 or rng.random() < 0.1) and rng.random() < 0.5 else 1] \
        + (["-pa", "fp32"] if ranks == 3 else [])
    accumulation = rng.choice([1, 1, 2])  # micro-steps per step
    if f.get("-fr") == "delayed" and rng.random() < 0.3:  # -fe 1 needs -r 0 and fcproj all FP8 (else the refusal)
        f["-fe"] = 1  # drawn last: the draws above are those of the seeds before -fe existed
        if rng.random() < 0.7:
            f["-r"] = 0
    return model, (B, T, accumulation), [str(a) for kv in f.items() for a in kv], ranks, [str(a) for a in rank_flags]


class Case:
    """one drawn combination's files (model, twin shard) and runs, in its own directory"""

    def __init__(self, seed, workdir):
        self.seed, self.dir = seed, os.path.join(workdir, f"seed{seed}")
        shutil.rmtree(self.dir, ignore_errors=True)
        os.makedirs(self.dir)
        self.model, (self.B, self.T, self.accumulation), self.flags, self.ranks, self.rank_flags = \
            draw(random.Random(seed))
        self.model_path = os.path.join(self.dir, "model.bin")
        sim_model.write_model(self.model_path, max_t=128, seed=seed, **self.model)
        self.shard = os.path.join(self.dir, "twin_train_000000.bin")
        sim_model.write_shard(self.shard, 20_000, seed, vocab=self.model["vocab"], period=self.B * self.T)

    def describe(self):
        m = self.model
        return (f"seed {self.seed}: L={m['layers']} NH={m['heads']} C={m['channels']} V={m['vocab']} B={self.B} T={self.T} "
                f"x{self.accumulation} {' '.join(self.flags)} | {self.ranks} ranks {' '.join(self.rank_flags)}")

    def args(self, ranks, out, extra=()):
        return ["-e", self.model_path, "-i", self.shard, "-j", "", "-b", self.B, "-t", self.T,
                "-d", ranks * self.B * self.T * self.accumulation,
                "-x", 4, "-n", 2, "-l", 3e-3, "-v", 0, "-s", 0, "-sh", 0, "-gc", 0, "-o", os.path.join(self.dir, out)] \
            + self.flags + list(extra)

    def run(self, ranks, out, extra=(), stream_order=""):
        """(exit codes, rank 0's stdout + stderr, every rank's stderr lines)"""
        fs = os.path.join(self.dir, f"ids_{out}")
        os.makedirs(fs, exist_ok=True)
        args = [str(a) for a in self.args(ranks, out, extra)]
        if ranks > 1:
            cmds = [[SIM] + args + ["-pn", str(ranks), "-pr", str(r), "-pg", "1", "-pt", "300", "-pi", "fs", "-pf", fs]
                    for r in range(ranks)]
        else:
            cmds = [[SIM] + args]
        env = dict(os.environ, NCCL_MULTI_RANK_GPU_ENABLE="1", CUDASIM_STREAM_ORDER=stream_order)
        results = bench.run_programs(cmds, RUN_LIMIT_S, env)
        codes = [code for code, _, _ in results]
        return codes, results[0][1] + results[0][2], [err.strip().splitlines() for _, _, err in results]

    def model_bytes(self, out, step=4):
        with open(os.path.join(self.dir, out, f"model_{step:08d}.bin"), "rb") as f:
            return f.read()

    def drop_last_checkpoint(self, out):
        os.remove(os.path.join(self.dir, out, "DONE_00000004"))


def refusal(codes, errors):
    """the error line every rank stopped with, one line each and the same on all (a combination refused at startup is
    every rank's decision), or None"""
    if any(code in (0, None) for code in codes) or any(lines != errors[0] for lines in errors) or len(errors[0]) != 1:
        return None
    return errors[0][0] if errors[0][0].startswith("error: ") else None


def check(case):
    """(verdict, what): OK, REFUSED (the error line) or BUG (what went wrong; the case's files are kept)"""
    codes, one, errors = case.run(1, "one")
    if codes != [0]:
        refused = refusal(codes, errors)
        return ("REFUSED", refused) if refused else ("BUG", f"1 rank: exit {codes}: {one[-1500:]}")
    straight = sim_model.step_losses(one)
    if sorted(straight) != [1, 2, 3, 4] or not np.all(np.isfinite(list(straight.values()))):
        return "BUG", f"1 rank: losses {straight}"
    model_one = case.model_bytes("one")

    cpu = subprocess.run([str(a) for a in [CPU] + case.args(1, "cpu")[:-len(case.flags)] + ["-x", 1, "-n", 0]],
                         capture_output=True, text=True, timeout=RUN_LIMIT_S, cwd=case.dir)
    reference = sim_model.step_losses(cpu.stdout)
    tolerance = 3e-3 if case.flags[1] == "bf16" else 3e-2
    if cpu.returncode != 0 or 1 not in reference:
        return "BUG", f"train_gpt2cpu: exit {cpu.returncode}: {cpu.stderr[-800:]}"
    if abs(straight[1] - reference[1]) > tolerance * abs(reference[1]):
        return "BUG", f"step 1 loss {straight[1]} vs train_gpt2cpu's {reference[1]} (rel {tolerance})"

    case.drop_last_checkpoint("one")
    codes, resumed, _ = case.run(1, "one", ["-y", 1])
    again = sim_model.step_losses(resumed)
    if codes != [0] or sorted(again) != [3, 4] or any(again[s] != straight[s] for s in again):
        return "BUG", f"resume: exit {codes}, losses {again} vs {straight}: {resumed[-1000:]}"
    if case.model_bytes("one") != model_one:
        return "BUG", "resume: the step-4 model file differs"

    codes, many, errors = case.run(case.ranks, "many", case.rank_flags, "newest-first")
    if codes != [0] * case.ranks:
        refused = refusal(codes, errors)
        return ("REFUSED", f"{case.ranks} ranks: {refused}") if refused else \
            ("BUG", f"{case.ranks} ranks: exit {codes}: {many[-1500:]}")
    twin = sim_model.step_losses(many)
    exact = case.ranks == 2
    if sorted(twin) != [1, 2, 3, 4] or any(abs(twin[s] - straight[s]) > (0 if exact else 1e-6 * abs(straight[s]))
                                          for s in straight):
        return "BUG", f"{case.ranks} ranks: losses {twin} vs 1 rank's {straight}"
    if case.model_bytes("many") != model_one:
        return "BUG", f"{case.ranks} ranks: the step-4 model file differs from 1 rank's"

    case.drop_last_checkpoint("many")
    codes, resumed, _ = case.run(1, "many", ["-y", 1])
    again = sim_model.step_losses(resumed)
    if codes != [0] or sorted(again) != [3, 4] or \
            any(abs(again[s] - straight[s]) > (0 if exact else 1e-6 * abs(straight[s])) for s in again):
        return "BUG", f"{case.ranks} ranks resumed on 1: exit {codes}, losses {again} vs {straight}: {resumed[-1000:]}"
    shutil.rmtree(case.dir, ignore_errors=True)
    return "OK", ""


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=0, help="first seed")
    parser.add_argument("--count", type=int, default=20, help="number of seeds")
    parser.add_argument("-v", action="store_true", help="print every case, not only refusals and bugs")
    a = parser.parse_args()
    for binary in (SIM, CPU):
        if not os.path.exists(binary):
            sys.exit(f"error: {binary} is not built (make build/sim/train_gpt2_fp8 train_gpt2cpu)")
    verdicts = {"OK": 0, "REFUSED": 0, "BUG": 0}
    with tempfile.TemporaryDirectory(prefix="llm8_fuzz_flags_") as workdir:
        for seed in range(a.seed, a.seed + a.count):
            case = Case(seed, workdir)
            verdict, what = check(case)
            verdicts[verdict] += 1
            if a.v or verdict != "OK":
                print(f"{verdict} {case.describe()}" + (f"\n    {what}" if what else ""), flush=True)
    print(f"{a.count} seeds: {verdicts['OK']} OK, {verdicts['REFUSED']} refused, {verdicts['BUG']} bugs")
    sys.exit(1 if verdicts["BUG"] else 0)


if __name__ == "__main__":
    main()
