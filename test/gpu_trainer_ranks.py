"""
The multi-GPU trainer on one GPU (make gpucheck; NCCL 2.30+ with NCCL_MULTI_RANK_GPU_ENABLE=1
runs two ranks on one device): ./train_gpt2_fp8 with -pn 2 against -pn 1 on the same global
batches, a 2-rank resume, and a killed rank.

- Trajectories: 2 ranks x -b 4 read exactly the sequences 1 rank x -b 8 reads (a sample is
  N*B*T tokens, rank r takes its r-th B*T), so the losses agree within bf16/FP8 rounding:
  the gradient average over ranks and the sharded optimizer are the only differences.
  ZeRO-3 (2 ranks -z 3 against 1 rank): the per-layer gathers must give the same weights, as
  FP8 codes, as bf16 (a bf16 run), and each in its format (FP8 qkv and fc, bf16 attproj and
  fcproj).
- Traffic: the `comm |` line counts the payload of the collectives the first step issued;
  the FP8 run gathers exactly d6's 12 L C^2 matmul weight elements as 1-byte codes (half
  their bf16 bytes), and the rest in bf16; ZeRO-3 gathers them again in every forward and
  backward (2 micro-steps: 4 times), and a bf16 ZeRO-3 run twice those bytes as bf16 on top
  of the same bf16 rest. The block recipe (-fr block) gathers them as FP8 too,
  after one all-reduce of every 128x128 block's amax (12 L (C / 128)^2 uint32).
- Replicas: every 2-rank run checks with -pc 1 that, after every weight gather, both ranks
  hold the same gathered weights bit for bit (llmc/replica_check.cuh).
- Stream order (cudasim only): some of those 2-rank runs again with CUDASIM_STREAM_ORDER=
  newest-first, bit for bit the same losses: the forward waits for each stage of the weight
  gather it reads (and ZeRO-3 for each layer gather), however late the gather runs.
- Resume: 8 steps with a checkpoint at 4, then -y 1: steps 5..8 print the same losses, with
  -fw current, -fw delayed, and ZeRO-3 in FP8 and in bf16.
- Resume with another number of ranks (1 -> 2 and 2 -> 1, -b so the global batch stays): the
  optimizer state resharded and the loader replayed, steps 5..8 within the 2-rank vs 1-rank
  tolerance of the uninterrupted run.
- Twin batches (a shard of one repeated sample): 2 ranks train the 1-rank model bit for bit,
  losses and model file, in bf16, FP8 (-fw delayed, block) and FP8 ZeRO-3, and 3 ranks with
  -pa fp32 under ZeRO-3: a gather or a scale wrong alike on every rank shows here, where -pc
  cannot see it. A checkpoint of 1 rank resumed
  on 2, and of 2 on 1, goes on bit for bit.
- mpirun (scripts/launch_one_node.sh -m mpi): 2 ranks that take their rank from MPI train the
  1-rank model bit for bit on twin batches (a SKIP line without mpirun or an MPI build).
- A killed rank: the survivor exits non-zero within -pt seconds with the error line naming
  its rank and the collective.
Sections (arguments, in this order by default): trajectories (with traffic and stream order),
resume, reshard, twins, mpirun, killed; a device call cut off at its limit goes on with the rest.
Not collected by pytest (the CPU suite): run by test/run_gpu_tests.sh after the test binaries,
and by make simcheck against the cudasim build of the trainer (LLM8_TRAINER names it; make
test runs the killed section so, from test/test_sim_trainer.py): there
test/sim_model.py's 2-layer, C = 128, 997-token model and T = 64 stand in for d6 at T = 256.
"""
import ctypes
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time


from dev_modules import load_dev_bench_module
import sim_model

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAINER = os.environ.get("LLM8_TRAINER", os.path.join(ROOT, "train_gpt2_fp8"))
ON_CUDASIM = "LLM8_TRAINER" in os.environ and "/sim/" in os.environ["LLM8_TRAINER"]
# RUN_LIMIT_S: the wall time one multi-rank run may take before its ranks are killed (a hang
# outside a collective, which -pt does not see, must not take the whole device call)
if ON_CUDASIM:  # test/sim_model.py's model
    LAYERS, CHANNELS, VOCAB, SEQ_LEN, RANK_TIMEOUT_S = sim_model.LAYERS, sim_model.CHANNELS, sim_model.VOCAB, 64, 300
    RUN_LIMIT_S = 1800
else:
    LAYERS, CHANNELS, VOCAB, SEQ_LEN, RANK_TIMEOUT_S = 6, 384, 50257, 256, 60
    RUN_LIMIT_S = 240
FAILURES = []
bench = load_dev_bench_module("bench")
parse_traffic = bench.parse_traffic  # the `comm |` line, as the benchmark reads it


def check(condition, message):
    print(("ok   " if condition else "FAIL ") + message, flush=True)
    if not condition:
        FAILURES.append(message)


def rank_commands(ranks, args, workdir, timeout_s=RANK_TIMEOUT_S):
    """the command lines of `ranks` processes of the trainer (fs id exchange in workdir)"""
    return [[str(c) for c in [TRAINER] + list(args) + ["-pn", ranks, "-pr", r, "-pg", 1, "-pi", "fs", "-pf", workdir,
                                                        "-pt", timeout_s]] for r in range(ranks)]


RANK_ENV = dict(os.environ, NCCL_MULTI_RANK_GPU_ENABLE="1")


def launch(ranks, args, workdir, timeout_s=RANK_TIMEOUT_S, env=RANK_ENV):
    """starts `ranks` processes of the trainer; returns the Popen list (for a test that signals one)"""
    return [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env)
            for cmd in rank_commands(ranks, args, workdir, timeout_s)]


def run(ranks, args, workdir, env=RANK_ENV):
    """one multi-rank run to its end, or killed after RUN_LIMIT_S (bench.py's run_programs); returns
    (exit codes, rank 0's stdout)"""
    results = bench.run_programs(rank_commands(ranks, args, workdir), RUN_LIMIT_S, env)
    if any(code is None for code, _, _ in results):
        check(False, f"{ranks}-rank run {' '.join(str(a) for a in args[:12])} ...: still running after {RUN_LIMIT_S} s, killed")
    for r, (code, out, err) in enumerate(results):
        if code != 0:
            print(f"rank {r} of {ranks} failed ({code}):\n{out[-2000:]}\n{err[-2000:]}", flush=True)
    return [-1 if code is None else code for code, _, _ in results], results[0][1]


losses = sim_model.step_losses


ZERO3_FP8 = "fp8 delayed adamw8 ZeRO-3 (2 ranks -z 3 vs 1 rank -z 1)"
ZERO3_BF16 = "bf16 adamw ZeRO-3 (2 ranks -z 3 vs 1 rank -z 1)"
ZERO3_MIXED = "fp8 qkv,fc ZeRO-3 (FP8 and bf16 layer gathers)"


TWO_RANKS_ONE_GPU_MIN_NCCL = 23000  # NCCL_VERSION(2, 30, 0): the first that honours NCCL_MULTI_RANK_GPU_ENABLE=1


def trainer_nccl_version():
    """(version code, path) of the libnccl.so.2 the trainer loads here (ldd, same environment), or (None, why)"""
    try:
        listing = subprocess.run(["ldd", TRAINER], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired) as error:
        return None, f"ldd failed: {error}"
    found = re.search(r"libnccl\.so\.2 => (\S+)", listing)
    if found is None:
        return None, "ldd shows no libnccl.so.2"
    version = ctypes.c_int(0)
    try:
        ctypes.CDLL(found.group(1)).ncclGetVersion(ctypes.byref(version))
    except OSError as error:
        return None, f"cannot load {found.group(1)}: {error}"
    return version.value, found.group(1)


def old_nccl_verdict(version, where, env):
    """what an NCCL too old for two ranks on one GPU makes of the run: prints why and gives the exit status, 1 (a green
    make gpucheck includes the 2-rank tests) unless LLM8_ALLOW_NO_TWO_RANKS=1 lets it pass without them (0)"""
    why = (f"the trainer loads NCCL {version} from {where}, older than 2.30, the first that allows two ranks on one GPU "
           "(NCCL_MULTI_RANK_GPU_ENABLE=1); pip install 'nvidia-nccl-cu13>=2.30' and rebuild (the Makefile takes the newer "
           "of pip's and $CUDA_HOME's NCCL)")
    if env.get("LLM8_ALLOW_NO_TWO_RANKS") == "1":
        print(f"SKIP gpu_trainer_ranks: {why}; LLM8_ALLOW_NO_TWO_RANKS=1 lets this run pass without them", flush=True)
        return 0
    print(f"FAIL gpu_trainer_ranks: {why}, or set LLM8_ALLOW_NO_TWO_RANKS=1 to pass without the 2-rank tests", flush=True)
    return 1


# the runs' shared setting: the scratch directory, the model, the flags every trajectory run takes
class Setup:
    def __init__(self):
        self.tmp = tempfile.mkdtemp(prefix="llm8_ranks_")
        sim_model.write_shard(os.path.join(self.tmp, "r_train_000001.bin"), 400_000, 1, VOCAB)
        self.model = "d6"
        if ON_CUDASIM:
            self.model = os.path.join(self.tmp, "model.bin")
            sim_model.write_model(self.model)
        self.micro_steps = 2  # -d = 2 ranks x -b 4 x T x 2
        self.common = ["-e", self.model, "-t", SEQ_LEN, "-x", 8, "-v", 0, "-s", 0, "-l", 1e-3, "-sh", 0,
                       "-i", os.path.join(self.tmp, "r_train_*.bin"), "-j", "", "-d", 2 * 4 * SEQ_LEN * self.micro_steps]


# the trajectory configurations: (name, flags, relative loss tolerance of 2 ranks against 1)
CONFIGS = [("bf16 adamw", ["-p", "bf16"], 1e-2), ("fp8 delayed adamw", ["-p", "fp8"], 2e-2),
           ("fp8 delayed adamw8", ["-p", "fp8", "-opt", "adamw8"], 2e-2), ("fp8 -f8p fwd (bf16 weight gather)", ["-p", "fp8", "-f8p", "fwd"], 2e-2),
           ("bf16 adamw, fp32 gradient reduce", ["-p", "bf16", "-pa", "fp32"], 1e-2),
           ("fp8 -fw delayed adamw8 (codes from the optimizer pass)", ["-p", "fp8", "-fw", "delayed", "-opt", "adamw8"], 2e-2),
           ("fp8 block adamw8 (FP8 gather, block amax all-reduce)", ["-p", "fp8", "-fr", "block", "-opt", "adamw8"], 2e-2),
           (ZERO3_FP8, ["-p", "fp8", "-opt", "adamw8"], 2e-2),
           (ZERO3_BF16, ["-p", "bf16"], 1e-2),
           (ZERO3_MIXED, ["-p", "fp8", "-f8", "qkv,fc,lm_head"], 2e-2)]


def trajectories(setup):
    """2 ranks against 1 on the same global batches, -pc 1, the startup lines, the traffic per collective"""
    tmp, common, micro_steps = setup.tmp, setup.common, setup.micro_steps
    two_rank_only = {name: ["-z", 3] for name in (ZERO3_FP8, ZERO3_BF16, ZERO3_MIXED)}
    # cudasim only: these 2-rank runs again with the streams' work run newest first, so whatever the weight gather's
    # stages (or ZeRO-3's layer gathers) send runs as late as the waits on it allow: a read that does not wait for
    # its stage gets the previous step's weights and other bits
    newest_first = {"bf16 adamw", "fp8 delayed adamw", "fp8 -fw delayed adamw8 (codes from the optimizer pass)",
                    "fp8 block adamw8 (FP8 gather, block amax all-reduce)", ZERO3_FP8} if ON_CUDASIM else set()
    two_rank_traffic = {}
    for name, extra, tolerance in CONFIGS:
        codes1, out1 = run(1, common + extra + ["-b", 8], tmp)
        codes2, out2 = run(2, common + extra + two_rank_only.get(name, []) + ["-b", 4, "-pc", 1], tmp)
        if name in newest_first:
            codes3, out3 = run(2, common + extra + two_rank_only.get(name, []) + ["-b", 4], tmp,
                               dict(RANK_ENV, CUDASIM_STREAM_ORDER="newest-first"))
            check(codes3 == [0, 0] and len(losses(out3)) == 8 and losses(out3) == losses(out2),
                  f"{name}: 2 ranks with the streams run newest first give the same losses, bit for bit")
        two_rank_traffic[name] = parse_traffic(out2)
        one, two = losses(out1), losses(out2)
        check(codes1 == [0] and codes2 == [0, 0], f"{name}: 1-rank and 2-rank runs exit 0")
        check(len(one) == 8 and sorted(one) == sorted(two), f"{name}: both print 8 steps")
        if len(one) == 8 and sorted(one) == sorted(two):
            worst = max(abs(one[s] - two[s]) / abs(one[s]) for s in one)
            check(worst < tolerance, f"{name}: 2-rank losses within {tolerance:g} of 1-rank (worst {worst:.2e})")
        checked = re.findall(r"^replicas \| after (\d+) steps: \d+ regions .* bitwise identical on 2 ranks$", out2, re.M)
        check(checked == [str(u) for u in range(9)], f"{name}: -pc 1 finds the ranks' gathered weights identical at every step")
        stage = 3 if name in two_rank_only else 1
        check(f"zero | ZeRO-{stage} over 2 ranks" in out2, f"{name}: the startup line reports ZeRO-{stage}")
        if stage == 3 and not ON_CUDASIM:  # cudasim's model is smaller than one 2 MiB mapping granule: nothing to save
            saved = re.search(r"saves ([\d.]+) MiB per GPU at least, ([\d.]+) at most", out2)
            check(saved is not None and 0 < float(saved.group(1)) <= float(saved.group(2)),
                  f"{name}: the zero3 line reports the least and the most memory a rank saves")
        if "-pa" in extra:
            check(re.search(r"gradients reduced per step: [\d.]+ MB fp32 \(fp32 scratch", out2),
                  f"{name}: the startup line reports the fp32 reduce and its scratch")
        if "fp8 delayed adamw" == name:
            gathered = re.search(r"weights gathered per step: ([\d.]+) MB as FP8 \+ ([\d.]+) MB as bf16 \(all bf16: ([\d.]+) MB\)", out2)
            check(gathered is not None and float(gathered.group(1)) > 0, f"{name}: matmul weights gathered as FP8")

    matmul_elements = 12 * LAYERS * CHANNELS ** 2
    fp8, bf16 = two_rank_traffic.get("fp8 delayed adamw", {}), two_rank_traffic.get("bf16 adamw", {})
    check(fp8.get("FP8 weight gather") == matmul_elements,
          f"traffic: the FP8 run gathers {matmul_elements} matmul weight bytes as FP8 (got {fp8})")
    check(fp8.get("FP8 weight amax all-reduce") == 4 * 4 * LAYERS,
          f"traffic: one uint32 amax per block linear weight all-reduced, {4 * 4 * LAYERS} bytes (got {fp8})")
    check(bf16.get("FP8 weight gather", -1) == 0 and bf16.get("bf16 weight gather", 0) >= 2 * matmul_elements,
          f"traffic: the bf16 run gathers everything in bf16, matmul weights at 2 bytes (got {bf16})")
    check(fp8.get("gradient reduce", -1) == bf16.get("gradient reduce", 1),
          "traffic: gradients travel in bf16 in both runs")
    block = two_rank_traffic.get("fp8 block adamw8 (FP8 gather, block amax all-reduce)", {})
    block_amaxes = 12 * LAYERS * (CHANNELS // 128) ** 2
    check(block.get("FP8 weight gather") == matmul_elements
          and block.get("FP8 weight amax all-reduce") == 4 * block_amaxes,
          f"traffic: the block recipe gathers {matmul_elements} FP8 bytes after a {4 * block_amaxes}-byte block amax all-reduce (got {block})")
    zero3 = two_rank_traffic.get(ZERO3_FP8, {})
    check(zero3.get("FP8 weight gather") == 2 * micro_steps * matmul_elements,
          f"traffic: ZeRO-3 gathers the matmul weights as FP8 in every forward and backward (got {zero3})")
    zero3_bf16 = two_rank_traffic.get(ZERO3_BF16, {})
    layer_bf16 = zero3_bf16.get("bf16 weight gather", -1e9) - zero3.get("bf16 weight gather", 1e9)  # less the same bf16 rest
    check(zero3_bf16.get("FP8 weight gather", -1) == 0 and layer_bf16 == 2 * 2 * micro_steps * matmul_elements,
          f"traffic: bf16 ZeRO-3 gathers the matmul weights at 2 bytes in every forward and backward, twice FP8's "
          f"(got {zero3_bf16}, FP8 ZeRO-3 {zero3})")
    zero3_mixed = two_rank_traffic.get(ZERO3_MIXED, {})
    fp8_part = 7 * LAYERS * CHANNELS ** 2  # qkv 3 C^2 + fc 4 C^2 per layer as FP8, attproj and fcproj as bf16
    layer_mixed = zero3_mixed.get("bf16 weight gather", -1e9) - zero3.get("bf16 weight gather", 1e9)
    check(zero3_mixed.get("FP8 weight gather") == 2 * micro_steps * fp8_part
          and layer_mixed == 2 * 2 * micro_steps * (matmul_elements - fp8_part),
          f"traffic: ZeRO-3 with FP8 qkv and fc gathers those as FP8 and attproj and fcproj as bf16 (got {zero3_mixed})")


def resume(setup):
    """8 steps with a checkpoint at 4, then -y 1 on 2 ranks: steps 5..8 bitwise"""
    tmp, common = setup.tmp, setup.common
    # -fw delayed: each rank rebuilds its codes with the saved scale, then they are gathered; -fg delayed: each rank's
    # output-gradient histories come back seeded, so the one-pass cast goes on; ZeRO-3: the model file from the
    # owners' pieces, the codes cast into the owned buffers
    for precision, fp8_scaling, stage in (("fp8", ["-fw", "current"], 1), ("fp8", ["-fw", "delayed", "-fg", "delayed"], 1),
                                          ("fp8", ["-fw", "current"], 3), ("bf16", ["-fw", "current"], 3)):
        weights = " ".join(fp8_scaling[1:])  # the labels below: "current", or "delayed -fg delayed"
        out_dir = os.path.join(tmp, f"ckpt_{precision}_{'_'.join(fp8_scaling[1::2])}_z{stage}")
        args = common + ["-p", precision] + fp8_scaling + ["-z", stage, "-opt", "adamw8", "-b", 4, "-o", out_dir, "-n", 4]
        codes, straight = run(2, args, tmp)
        check(codes == [0, 0], f"resume -p {precision} -fw {weights} -z {stage}: the straight 2-rank run exits 0")
        for step in (4, 8):
            for r in range(2):
                check(os.path.exists(os.path.join(out_dir, f"state_{step:08d}_{r:05d}.bin")),
                      f"resume -p {precision} -fw {weights} -z {stage}: state file of rank {r} at step {step}")
        if codes != [0, 0]:
            continue
        os.remove(os.path.join(out_dir, "DONE_00000008"))
        codes, resumed = run(2, args + ["-y", 1], tmp)
        a, b = losses(straight), losses(resumed)
        check(codes == [0, 0] and sorted(b) == [5, 6, 7, 8], f"resume -p {precision} -fw {weights} -z {stage}: the resumed run continues at step 5")
        check(all(a.get(s) == b.get(s) for s in (5, 6, 7, 8)),
              f"resume -p {precision} -fw {weights} -z {stage}: steps 5..8 bitwise equal to the uninterrupted run")


def reshard(setup):
    """a checkpoint of 1 rank resumed on 2 and of 2 on 1, the same global batch: within the trajectory tolerance"""
    tmp, common = setup.tmp, setup.common
    tolerance = {name: tol for name, _, tol in CONFIGS}["fp8 delayed adamw8"]
    for first, second in ((1, 2), (2, 1)):
        name = f"reshard {first} -> {second} ranks"
        reshard_dir = os.path.join(tmp, f"ckpt_{first}_to_{second}")
        reshard_args = common + ["-p", "fp8", "-opt", "adamw8", "-o", reshard_dir, "-n", 4]
        codes, straight = run(first, reshard_args + ["-b", 8 // first], tmp)
        check(codes == [0] * first, f"{name}: the uninterrupted {first}-rank run exits 0")
        if codes != [0] * first:
            continue
        os.remove(os.path.join(reshard_dir, "DONE_00000008"))
        codes, resumed = run(second, reshard_args + ["-b", 8 // second, "-y", 1], tmp)
        a, b = losses(straight), losses(resumed)
        check(codes == [0] * second and sorted(b) == [5, 6, 7, 8], f"{name}: the resumed run continues at step 5")
        check(f"resumed a checkpoint of {first} rank{'s' if first > 1 else ''}" in resumed,
              f"{name}: the resumed run says it resharded")
        check("tokens per step (-d)" not in resumed, f"{name}: the same -d, no note of another batch")
        if sorted(b) == [5, 6, 7, 8] and all(step in a for step in b):
            worst = max(abs(a[step] - b[step]) / abs(a[step]) for step in b)
            check(worst < tolerance, f"{name}: steps 5..8 within {tolerance:g} of the uninterrupted run (worst {worst:.2e})")


def twin_flags(setup):
    """the flags of a twin-batch run at -b 4, on a shard whose every sample is the same B*T tokens (written once): each
    of N ranks computes what 1 rank does and the average over ranks is exact (x + x halved), so ZeRO must train the
    1-rank model bit for bit (no clipping: the global norm sums the ranks' partial sums, its last bit may differ from
    one sum)"""
    shard = os.path.join(setup.tmp, "twin_train_000001.bin")
    if not os.path.exists(shard):
        sim_model.write_shard(shard, 400_000, 4, VOCAB, period=4 * SEQ_LEN)
    return ["-e", setup.model, "-t", SEQ_LEN, "-v", 0, "-s", 0, "-l", 1e-3, "-sh", 0, "-gc", 0, "-i", shard, "-j", "",
            "-b", 4, "-n", 4]


def twins(setup):
    """twin batches: 2 ranks train the 1-rank model bit for bit, and reshard resumes go on bit for bit"""
    tmp = setup.tmp
    twin_common = twin_flags(setup)
    # 3 ranks with -pa fp32 (3x and 3x / 3 are exact in fp32) cut the replicated tensors between owners, which
    # 2 ranks do not at d6; their mean loss may round in its last bit, so it is compared to 1e-6
    for ranks, name, extra, rank_extra in ((2, "bf16", ["-p", "bf16"], []),
                                           (2, "fp8 -fw delayed adamw8", ["-p", "fp8", "-fw", "delayed", "-opt", "adamw8"], []),
                                           (2, "fp8 block adamw8", ["-p", "fp8", "-fr", "block", "-opt", "adamw8"], []),
                                           (2, "fp8 lm_head -fw delayed", ["-p", "fp8", "-f8", "all", "-fw", "delayed"], []),
                                           (2, "fp8 partial -f8p fwd", ["-p", "fp8", "-f8p", "fwd"], []),
                                           (2, "fp8 ZeRO-3 adamw8", ["-p", "fp8", "-opt", "adamw8"], ["-z", 3]),
                                           (3, "fp8 ZeRO-3 adamw8 -pa fp32", ["-p", "fp8", "-opt", "adamw8", "-pa", "fp32"], ["-z", 3])):
        dirs = [os.path.join(tmp, f"twin_{ranks}_{name.replace(' ', '_')}_{n}") for n in (1, ranks)]
        codes1, out1 = run(1, twin_common + extra + ["-x", 4, "-d", 4 * SEQ_LEN, "-o", dirs[0]], tmp)
        codes_n, out_n = run(ranks, twin_common + extra + rank_extra + ["-x", 4, "-d", ranks * 4 * SEQ_LEN, "-o", dirs[1]], tmp)
        models = [os.path.join(d, "model_00000004.bin") for d in dirs]
        same_model = all(os.path.exists(m) for m in models) and open(models[0], "rb").read() == open(models[1], "rb").read()
        one, many = losses(out1), losses(out_n)
        same_losses = len(one) == 4 and sorted(one) == sorted(many) and \
            all(abs(one[s] - many[s]) <= (0 if ranks == 2 else 1e-6 * abs(one[s])) for s in one)
        check(codes1 == [0] and codes_n == [0] * ranks and same_losses and same_model,
              f"twin batches, {name}: {ranks} ranks train the 1-rank model bit for bit (losses and model file)")
    # and a checkpoint of 1 rank resumed on 2 (of 2 on 1) goes on bit for bit: the resharded state changes no bit
    for first, second in ((1, 2), (2, 1)):
        name = f"twin batches, reshard {first} -> {second} ranks"
        out_dir = os.path.join(tmp, f"twin_reshard_{first}_{second}")
        args = twin_common + ["-x", 8, "-p", "fp8", "-opt", "adamw8", "-fw", "delayed", "-o", out_dir]
        codes, straight = run(first, args + ["-d", first * 4 * SEQ_LEN], tmp)
        model_file = os.path.join(out_dir, "model_00000008.bin")
        if codes != [0] * first or not os.path.exists(model_file):
            check(False, f"{name}: the uninterrupted {first}-rank run exits 0 and writes its step-8 model")
            continue
        straight_model = open(model_file, "rb").read()
        os.remove(os.path.join(out_dir, "DONE_00000008"))
        codes, resumed = run(second, args + ["-d", second * 4 * SEQ_LEN, "-y", 1], tmp)
        a, b = losses(straight), losses(resumed)
        check(codes == [0] * second and sorted(b) == [5, 6, 7, 8] and all(a.get(s) == b[s] for s in b)
              and open(model_file, "rb").read() == straight_model,
              f"{name}: steps 5..8 and the step-8 model bit for bit those of the uninterrupted run")
        note = (f"note: {out_dir}/state_00000004_00000.bin was written by a run of {first * 4 * SEQ_LEN} tokens per step "
                f"(-d); this run's are {second * 4 * SEQ_LEN}: " +
                (f"-d {first * 4 * SEQ_LEN} trains on with the checkpoint's" if first > second else
                 f"the checkpoint's are not a multiple of this run's B*T*processes, {second * 4 * SEQ_LEN}"))
        check(note in resumed, f"{name}: -d moved with the ranks: the resumed run notes the checkpoint's batch")


def mpirun_launch(setup):
    """mpirun's launch, as llm.c users start several GPUs: scripts/launch_one_node.sh -m mpi -n 2 gives the trainer no
    rank flags (rank, count and GPU from MPI, the NCCL id by MPI's broadcast); on twin batches the 2 ranks train the 1-rank
    model bit for bit. A SKIP line where mpirun or the trainer's MPI is missing (the Makefile links OpenMPI where it
    finds it)"""
    if shutil.which("mpirun") is None:
        print("SKIP mpirun: no mpirun on PATH", flush=True)
        return
    if "libmpi" not in subprocess.run(["ldd", TRAINER], capture_output=True, text=True).stdout:
        print(f"SKIP mpirun: {TRAINER} is built without MPI", flush=True)
        return
    dirs = [os.path.join(setup.tmp, f"mpirun_twin_{n}") for n in (1, 2)]
    flags = twin_flags(setup) + ["-p", "fp8", "-opt", "adamw8", "-x", 4]
    codes1, out1 = run(1, flags + ["-d", 4 * SEQ_LEN, "-o", dirs[0]], setup.tmp)
    launcher = ["bash", os.path.join(ROOT, "scripts", "launch_one_node.sh"), "-m", "mpi", "-n", "2", "--", TRAINER]
    env = dict(RANK_ENV, CUDA_VISIBLE_DEVICES=os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0],
               OMPI_MCA_rmaps_base_oversubscribe="1")  # the 2 ranks share the first GPU, and may outnumber the cores
    ((code, out, err),) = bench.run_programs([launcher + [str(a) for a in flags + ["-d", 2 * 4 * SEQ_LEN, "-o", dirs[1],
                                                                                  "-pt", RANK_TIMEOUT_S]]], RUN_LIMIT_S, env)
    if code != 0:
        print(f"mpirun failed ({code}):\n{out[-2000:]}\n{err[-2000:]}", flush=True)
    models = [os.path.join(d, "model_00000004.bin") for d in dirs]
    same_model = all(os.path.exists(m) for m in models) and open(models[0], "rb").read() == open(models[1], "rb").read()
    one, two = losses(out1), losses(out or "")
    check(codes1 == [0] and code == 0 and "ZeRO-1 over 2 ranks (-pi mpi)" in (out or "") and len(one) == 4 and one == two
          and same_model, "mpirun -np 2 (launch_one_node.sh -m mpi), FP8 adamw8 on twin batches: ranks from MPI, the "
                          "1-rank model bit for bit (losses and model file)")


def killed_rank(setup):
    """a killed rank: the survivor exits within -pt with one line naming its rank and the collective. Under cudasim
    also with each stream's queue bounded at 4 (CUDASIM_LAUNCH_QUEUE, as a GPU's launch queue is bounded): by timing the
    survivor either meets the dead peer in an NCCL call of its own (cudasim's nonblocking calls run the collective at
    once), whose error ends it, or blocks inside a launch behind the dead peer's collective, where no wait of its own
    has a deadline and its watchdog thread ends it (without the watchdog such a run hung past 120 s). Either is the one
    NCCL line within -pt; test_multi_gpu checks the watchdog itself deterministically"""
    killed_rank_run(setup, "killed rank", RANK_ENV, "error: rank 0 of 2: NCCL")
    if ON_CUDASIM:
        killed_rank_run(setup, "killed rank, launch queue of 4", dict(RANK_ENV, CUDASIM_LAUNCH_QUEUE="4"),
                        "error: rank 0 of 2: NCCL")


def killed_rank_run(setup, name, env, expected_error):
    tmp, common = setup.tmp, setup.common
    kill_timeout_s = 20
    procs = launch(2, common + ["-b", 4, "-x", 100000], tmp, timeout_s=kill_timeout_s, env=env)
    # rank 0 must reach its first step within RUN_LIMIT_S; the watchdog ends a hang before it
    watchdog = threading.Timer(RUN_LIMIT_S, lambda: [p.kill() for p in procs])
    watchdog.start()
    line = procs[0].stdout.readline()
    while line and not line.startswith("step"):
        line = procs[0].stdout.readline()
    watchdog.cancel()
    check(line.startswith("step"), f"{name}: rank 0 reaches its first step within {RUN_LIMIT_S} s")
    procs[1].send_signal(signal.SIGKILL)
    start = time.time()
    try:
        _, err = procs[0].communicate(timeout=120)
        elapsed = time.time() - start
        check(procs[0].returncode != 0 and expected_error in err,
              f"{name}: rank 0 exits with the line {expected_error!r} (exit {procs[0].returncode}: {err.strip()[-300:]!r})")
        check(elapsed < 3 * kill_timeout_s, f"{name}: rank 0 exited {elapsed:.0f} s after the kill (-pt {kill_timeout_s})")
    except subprocess.TimeoutExpired:
        procs[0].kill()
        check(False, f"{name}: rank 0 still running 120 s after its peer died")



SECTIONS = {"trajectories": trajectories, "resume": resume, "reshard": reshard, "twins": twins, "mpirun": mpirun_launch,
            "killed": killed_rank}


def main():
    bench.kill_running_groups_on_sigterm()  # a timeout around the stage takes the ranks' process groups too
    chosen = sys.argv[1:] or list(SECTIONS)
    unknown = [name for name in chosen if name not in SECTIONS]
    if unknown:
        sys.exit(f"error: gpu_trainer_ranks.py: unknown section {unknown[0]!r} (expected some of: {' '.join(SECTIONS)})")
    if not os.path.exists(TRAINER):
        sys.exit(f"error: build {TRAINER} first (make train_gpt2_fp8, or make simcheck for the cudasim build)")
    if not ON_CUDASIM:  # every 2-rank run below puts both ranks on GPU 0 (-pg 1)
        version, where = trainer_nccl_version()
        print(f"NCCL runtime {version} ({where})", flush=True)
        if version is not None and version < TWO_RANKS_ONE_GPU_MIN_NCCL:
            sys.exit(old_nccl_verdict(version, where, os.environ))
    setup = Setup()
    for name in chosen:
        print(f"== {name}", flush=True)
        SECTIONS[name](setup)
    print(f"gpu_trainer_ranks: {len(FAILURES)} failed", flush=True)
    sys.exit(1 if FAILURES else 0)


if __name__ == "__main__":
    main()
