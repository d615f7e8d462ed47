"""
The Makefile's toolchain checks (check-cuda, check-cudnn, check-nccl): a machine that lacks a
piece, or has a CUDA older than 13, gets one `error:` line naming what is missing and how to
supply it, and make stops before compiling anything. Each case runs make in the checkout with
the variable that would point at the piece overridden (NVCC, CUDNN_INCLUDE,
CUDNN_FRONTEND_PATH, NCCL_INCLUDE), so nothing on the machine has to be uninstalled; stand-in
nvcc scripts report an old or an unreadable release. Where the pieces are found: a CUDA_HOME and its
nvcc as one toolkit, pip's packages in the user's site-packages, the system's cuDNN and NCCL (stand-in
installs under tmp_path, the Makefile's PY_SITE, SYSTEM_INCLUDE and SYSTEM_LIB_DIRS pointed at them), and a
path given that holds no header named as such. Also how make test-python starts pytest:
one worker per core only where a pytest-xdist that can do it is installed, and `make env`, the
first command of a GPU session, here without a GPU.
"""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def make(*args, env=None):
    return subprocess.run(["make", "-s", "--no-print-directory", "-C", ROOT, *args],
                          capture_output=True, text=True, timeout=120,
                          env=None if env is None else {**os.environ, **env})


def error_lines(result):
    return [line for line in result.stderr.splitlines() if line.startswith("error:")]


def stand_in_nvcc(tmp_path, version_output):
    nvcc = tmp_path / "nvcc"
    nvcc.write_text("#!/bin/sh\necho '%s'\n" % version_output)
    nvcc.chmod(0o755)
    return str(nvcc)


def test_the_machines_toolchain_passes():
    result = make("check-cuda", "check-cudnn", "check-nccl")
    assert result.returncode == 0, result.stderr
    assert error_lines(result) == []


def test_make_env_prints_every_section_without_a_gpu():
    """`make env` (dev/gpu_env.sh) runs first in a GPU session's first call, whose output goes into
    doc/gpu-environment.md: it must get through every section on any machine (a missing nvidia-smi or NVML is a
    line of it, not the end), with the NCCL the Makefile picked and this nvcc's release"""
    result = make("env")
    assert result.returncode == 0, result.stderr[-2000:]
    output = result.stdout + result.stderr
    sections = [line[3:] for line in output.splitlines() if line.startswith("## ")]
    assert [s.split(" (")[0] for s in sections] == ["Machine", "GPU and driver", "NVML", "nvcc", "CUDA libraries",
                                                     "Python", "cuDNN version header", "NCCL and MPI"], output[-3000:]
    assert "release 13." in output and "NCCL the build uses: " in output and "the build's: NVCC=" in output, output[-3000:]
    assert "run this through make env to see it" not in output, output[-3000:]


@pytest.mark.parametrize("target,trainer", [("train_gpt2cu", "GPU trainer is train_gpt2_fp8"),
                                            ("train_gpt2fp32cu", "GPU trainer is train_gpt2_fp8"),
                                            ("train_gpt2fp8", "GPU trainer is train_gpt2_fp8"),
                                            ("train_gpt2", "CPU trainer is train_gpt2cpu")])
def test_llmc_trainer_targets_name_llm8s(target, trainer):
    """llm.c's users type its target names: each gets one line naming llm8's trainer, and a non-zero exit"""
    result = make(target)
    assert result.returncode != 0
    lines = error_lines(result)
    assert len(lines) == 1 and lines[0].startswith(f"error: make {target}: llm8's {trainer} "), result.stderr


def test_missing_nvcc(tmp_path):
    nvcc = tmp_path / "nowhere" / "nvcc"
    result = make("check-cuda", "NVCC=%s" % nvcc)
    assert result.returncode != 0
    assert error_lines(result) == ["error: nvcc not found (NVCC=%s is no executable); "
                                   "install the CUDA 13 toolkit or set NVCC=/path/to/nvcc" % nvcc]


def test_cuda_home_and_nvcc_name_one_toolkit(tmp_path):
    """nvcc and the CUDA_HOME where cuDNN, NCCL and the runpath are looked for come from one toolkit. PATH's nvcc
    comes first, as in llm.c, and takes its own CUDA_HOME over an exported one of another release (which would
    send the build to that release's headers and libraries); an exported CUDA_HOME's nvcc serves where PATH has
    none; CUDA_HOME on make's command line, and NVCC given, pick the toolkit"""
    old, new = tmp_path / "cuda-12.4", tmp_path / "cuda-13.0"
    for toolkit in (old, new):
        (toolkit / "bin").mkdir(parents=True)
    old_nvcc = stand_in_nvcc(old / "bin", "Cuda compilation tools, release 12.4, V12.4.131")
    new_nvcc = stand_in_nvcc(new / "bin", "Cuda compilation tools, release 13.0, V13.0.88")
    system_path = "/usr/bin:/bin"
    on_path = {"PATH": "%s:%s" % (new / "bin", system_path), "CUDA_HOME": str(old)}
    assert make_variable("NVCC", env=on_path) == new_nvcc
    assert make_variable("CUDA_HOME", env=on_path) == str(new)
    assert make("check-cuda", env=on_path).returncode == 0
    not_on_path = {"PATH": system_path, "CUDA_HOME": str(old)}
    assert make_variable("NVCC", env=not_on_path) == old_nvcc
    result = make("check-cuda", env=not_on_path)
    assert error_lines(result) == ["error: %s --version reports CUDA 12.4; llm8 needs the CUDA 13 toolkit "
                                   "(set NVCC=/path/to/cuda-13/bin/nvcc)" % old_nvcc]
    assert make_variable("NVCC", "CUDA_HOME=%s" % new, env=not_on_path) == new_nvcc
    assert make_variable("CUDA_HOME", "NVCC=%s" % new_nvcc, env=not_on_path) == str(new)
    result = make("check-cuda", "CUDA_HOME=%s" % (tmp_path / "nowhere"), env=not_on_path)
    assert error_lines(result) == ["error: nvcc not found (CUDA_HOME=%s has no bin/nvcc); install the CUDA 13 "
                                   "toolkit or set NVCC=/path/to/nvcc" % (tmp_path / "nowhere")]


@pytest.mark.parametrize("output, reported", [
    ("Cuda compilation tools, release 12.8, V12.8.93", "CUDA 12.8"),
    ("Cuda compilation tools, release 9.2, V9.2.148", "CUDA 9.2"),
    ("not an nvcc", "no CUDA release"),
])
def test_nvcc_older_than_cuda_13(tmp_path, output, reported):
    nvcc = stand_in_nvcc(tmp_path, output)
    result = make("check-cuda", "NVCC=" + nvcc)
    assert result.returncode != 0
    assert error_lines(result) == ["error: %s --version reports %s; llm8 needs the CUDA 13 toolkit "
                                   "(set NVCC=/path/to/cuda-13/bin/nvcc)" % (nvcc, reported)]


@pytest.mark.parametrize("release", ["13.0", "13.4", "14.1"])
def test_nvcc_13_and_later_pass(tmp_path, release):
    nvcc = stand_in_nvcc(tmp_path, "Cuda compilation tools, release %s, V%s.1" % (release, release))
    result = make("check-cuda", "NVCC=" + nvcc)
    assert result.returncode == 0, result.stderr


def test_old_nvcc_stops_the_trainer_build_before_compiling(tmp_path):
    # the stand-in records any call other than --version: none may come
    calls = tmp_path / "calls"
    nvcc = tmp_path / "nvcc"
    nvcc.write_text("#!/bin/sh\n[ \"$1\" = --version ] && { echo 'release 12.4, V12.4.131'; exit 0; }\n"
                    "echo \"$@\" >> %s\nexit 1\n" % calls)
    nvcc.chmod(0o755)
    result = make("train_gpt2_fp8", "NVCC=%s" % nvcc)
    assert result.returncode != 0
    assert len(error_lines(result)) == 1 and "reports CUDA 12.4" in error_lines(result)[0]
    assert not calls.exists()


@pytest.mark.parametrize("override, named", [
    ("CUDNN_INCLUDE=", "error: cuDNN not found: no cudnn.h in"),
    ("CUDNN_FRONTEND_PATH=", "error: cuDNN frontend headers (cudnn_frontend.h) not found"),
])
def test_missing_cudnn_names_the_package_and_no_cudnn(override, named):
    result = make("check-cudnn", override)
    assert result.returncode != 0
    lines = error_lines(result)
    assert len(lines) == 1 and lines[0].startswith(named) and "NO_CUDNN=1" in lines[0]
    assert make("check-cudnn", override, "NO_CUDNN=1").returncode == 0


@pytest.mark.parametrize("override, named", [
    ("CUDNN_INCLUDE=/nonexistent", "error: CUDNN_INCLUDE=/nonexistent holds no cudnn.h"),
    ("CUDNN_FRONTEND_PATH=/nonexistent", "error: CUDNN_FRONTEND_PATH=/nonexistent holds no cudnn_frontend.h"),
    ("NCCL_INCLUDE=/nonexistent", "error: NCCL_INCLUDE=/nonexistent holds no nccl.h"),
])
def test_a_path_given_that_holds_no_header_is_named(override, named):
    """a variable pointing where its header is not (a typo, a checkout's root instead of its include/) stops make
    with one line naming it, before the compiler's 'No such file or directory'"""
    result = make("check-cudnn", "check-nccl", override)
    assert result.returncode != 0
    lines = error_lines(result)
    assert len(lines) == 1 and lines[0].startswith(named), result.stderr


def fake_install(root, headers, libraries):
    """root/include with the headers (copies of this machine's where it has them) and root/lib with empty libraries"""
    (root / "include").mkdir(parents=True)
    (root / "lib").mkdir()
    for header in headers:
        (root / "include" / header).write_text('#define NCCL_MAJOR 2\n#define NCCL_MINOR 27\n#define NCCL_PATCH 3\n'
                                               if header == "nccl.h" else "/* stand-in */\n")
    for library in libraries:
        (root / "lib" / library).write_text("")


def test_cudnn_and_nccl_from_the_systems_paths(tmp_path):
    """cuDNN and NCCL where distribution packages put them (NVIDIA's apt/rpm repositories and the nvidia/cuda
    images: /usr/include, the libraries in /usr/lib/x86_64-linux-gnu or /usr/lib64) are found when neither the
    toolkit nor pip has them, as the compiler and linker would find them"""
    system = tmp_path / "usr"
    fake_install(system, ["cudnn.h", "nccl.h", "cudnn_frontend.h"], ["libcudnn.so.9", "libnccl.so.2"])
    (tmp_path / "cuda" / "include").mkdir(parents=True)
    args = ["CUDA_HOME=%s" % (tmp_path / "cuda"), "PY_SITE=", "SYSTEM_INCLUDE=%s" % (system / "include"),
            "SYSTEM_LIB_DIRS=%s %s" % (tmp_path / "nowhere", system / "lib"), "CUDNN_FRONTEND_PATH=%s" % (system / "include")]
    result = make("check-cudnn", "check-nccl", *args)
    assert result.returncode == 0, result.stderr
    assert make_variable("CUDNN_INCLUDE", *args) == str(system / "include")
    assert make_variable("CUDNN_LIB", *args) == str(system / "lib")
    assert make_variable("NCCL_INCLUDE", *args) == str(system / "include")
    assert make_variable("NCCL_LIB", *args) == str(system / "lib")
    # a header without its library is not an install: the check names every place it looked
    (system / "lib" / "libcudnn.so.9").unlink()
    result = make("check-cudnn", *args)
    lines = error_lines(result)
    assert len(lines) == 1 and lines[0].startswith("error: cuDNN not found: no cudnn.h in %s %s (the last with "
                                                   "libcudnn.so.9" % (tmp_path / "cuda" / "include", system / "include"))


def test_pip_packages_in_the_users_site_packages_are_found(tmp_path):
    """pip installs into the user's site-packages (~/.local) when the environment's is not writable, as for a
    system Python run by a user (scripts/setup_python.sh's pip install then lands there): the Makefile looks there
    too, for cuDNN, its frontend headers and NCCL"""
    user_base = tmp_path / "userbase"
    python = tmp_path / "python"
    python.write_text('#!/bin/sh\nPYTHONUSERBASE="%s" exec "%s" "$@"\n' % (user_base, sys.executable))
    python.chmod(0o755)
    import site
    if site.ENABLE_USER_SITE:   # this Python reads a user site-packages (not a venv's)
        user_site = subprocess.run([str(python), "-c", "import site; print(site.getusersitepackages())"],
                                   capture_output=True, text=True, check=True).stdout.strip()
        assert user_site in make_variable("PY_SITE", "PYTHON=%s" % python).split()
    user_site = tmp_path / "site-packages"
    fake_install(user_site / "nvidia" / "cudnn", ["cudnn.h"], ["libcudnn.so.9"])
    fake_install(user_site / "nvidia" / "nccl", ["nccl.h"], ["libnccl.so.2"])
    (user_site / "include").mkdir()
    (user_site / "include" / "cudnn_frontend.h").write_text("/* stand-in */\n")
    (tmp_path / "cuda" / "include").mkdir(parents=True)
    args = ["CUDA_HOME=%s" % (tmp_path / "cuda"), "PY_SITE=%s %s" % (tmp_path / "empty", user_site),
            "SYSTEM_LIB_DIRS=%s" % (tmp_path / "nowhere")]
    assert make("check-cudnn", "check-nccl", *args).returncode == 0
    assert make_variable("CUDNN_INCLUDE", *args) == str(user_site / "nvidia" / "cudnn" / "include")
    assert make_variable("CUDNN_FRONTEND_PATH", *args) == str(user_site / "include")
    assert make_variable("NCCL_INCLUDE", *args) == str(user_site / "nvidia" / "nccl" / "include")


def test_missing_nccl():
    result = make("check-nccl", "NCCL_INCLUDE=")
    assert result.returncode != 0
    lines = error_lines(result)
    assert len(lines) == 1 and lines[0].startswith("error: NCCL not found: no nccl.h in") and "nvidia-nccl-cu13" in lines[0]


def test_sanitizer_target_covers_every_test():
    # make test-sanitizers builds each C test with ASan and UBSan and each cudasim test with
    # UBSan (the Makefile says why not ASan there); -n prints the commands without running them,
    # -B all of them, also in a checkout where make test-sanitizers has built them already
    result = make("-B", "-n", "test-sanitizers")
    assert result.returncode == 0, result.stderr
    commands = result.stdout.splitlines()
    tests = sorted(name for name in os.listdir(os.path.join(ROOT, "test")) if name.startswith("test_"))
    sim_tests = sorted(name for name in os.listdir(os.path.join(ROOT, "test", "cudasim")) if name.startswith("test_"))
    for name in [n for n in tests if n.endswith(".c")]:
        built = [c for c in commands if "test/%s " % name in c and "-o build/sanitize/%s" % name[:-2] in c]
        assert len(built) == 1 and "-fsanitize=address,undefined" in built[0], name
    for name in [n for n in tests + sim_tests if n.endswith(".cu")]:
        built = [c for c in commands if c.endswith("-o build/sanitize/sim/%s" % name[:-3])]
        assert len(built) == 1 and "-fsanitize=undefined" in built[0], name
    runs = [c for c in commands if "test/run_cpu_tests.sh" in c]
    assert len(runs) == 2 and "ASAN_OPTIONS=detect_leaks=0" in result.stdout, runs


def test_make_test_runs_every_test_binary_in_lanes():
    """make test runs the CPU and cudasim test binaries through make test-binaries: all of them, one lane a core
    (JOBS), each on one OpenMP thread, cudasim's test_gpt2 (the longest) first; a test file added to test/ is run
    without a Makefile edit, and none is left out"""
    result = make("-n", "test", "JOBS=3")
    assert result.returncode == 0, result.stderr
    runs = [line for line in result.stdout.replace("\\\n", " ").splitlines() if "test/run_cpu_tests.sh" in line]
    assert len(runs) == 1 and runs[0].startswith("OMP_NUM_THREADS=1 TEST_JOBS=3 "), runs
    binaries = runs[0].split("test/run_cpu_tests.sh", 1)[1].split()
    expected = [f"build/{name.rsplit('.', 1)[0]}" for name in os.listdir(os.path.join(ROOT, "test"))
                if name.startswith("test_") and name.endswith((".c", ".cpp"))]
    expected += [f"build/sim/{name[:-3]}" for folder in ("test", "test/cudasim")
                 for name in os.listdir(os.path.join(ROOT, folder)) if name.startswith("test_") and name.endswith(".cu")]
    assert binaries[0] == "build/sim/test_gpt2" and sorted(binaries) == sorted(expected), binaries


def make_variable(name, *args, env=None):
    result = make("--eval", "print-variable-%: ; @echo $($*)", "print-variable-" + name, *args, env=env)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


@pytest.mark.parametrize("compiler, flags, suffix", [
    ("CC", "CFLAGS", ".c"),                      # the CPU trainer and the C tests
    ("CXX", "FORMAT_CHECK", ".cpp"),             # the C++ CPU tests (their rule adds -Wall -Wextra)
    ("NVCC", "NVCC_FLAGS", ".cu"),               # the trainer and the GPU tests, host side
    ("SIM_CXX", "", ".cpp"),                     # the cudasim builds
])
def test_a_format_that_does_not_match_its_arguments_stops_the_build(tmp_path, compiler, flags, suffix):
    """llm8_die is declared printf-like, and every compile makes a format mismatch an error (FORMAT_CHECK):
    an error message built from the wrong arguments would print garbage or crash instead of its one line"""
    command = make_variable(compiler) + " " + (make_variable(flags) if flags else "")
    for name, call, fails in [("matches", 'llm8_die("flag %s: %d", "-b", argc)', False),
                              ("mismatch", 'llm8_die("flag %s: %d", argc, "-b")', True)]:
        source = tmp_path / (name + suffix)
        # by its path in this checkout: SIM_CXX looks in build/sim first, where cudasim's copies are
        source.write_text('#include "%s"\nint main(int argc, char** argv) {\n'
                          '    (void)argv;\n    if (argc > 9) { %s; }\n    return 0;\n}\n'
                          % (os.path.join(ROOT, "llmc", "utils.h"), call))
        result = subprocess.run("%s -c %s -o %s" % (command, source, tmp_path / (name + ".o")),
                                shell=True, capture_output=True, text=True, timeout=120,
                                cwd=ROOT)  # the Makefile's paths (SIM_CXX's -include test/cudasim/cudasim.h) are the root's
        if fails:
            assert result.returncode != 0 and "format" in result.stderr, (command, result.stderr)
        else:
            assert result.returncode == 0, (command, result.stderr)


def stand_in_python(tmp_path, xdist_version):
    """this Python with a stand-in xdist module of the given version (None: no xdist at all) first on its path"""
    modules = tmp_path / "modules"
    (modules / "xdist").mkdir(parents=True)
    init = "raise ImportError('no xdist')\n" if xdist_version is None else "__version__ = '%s'\n" % xdist_version
    (modules / "xdist" / "__init__.py").write_text(init)
    python = tmp_path / "python"
    python.write_text('#!/bin/sh\nPYTHONPATH="%s" exec "%s" "$@"\n' % (modules, sys.executable))
    python.chmod(0o755)
    return str(python)


@pytest.mark.parametrize("xdist_version, jobs, workers", [
    ("3.8.0", "2", True),
    ("3.2", "16", True),
    ("3.1.0", "2", False),   # no worksteal before 3.2
    (None, "2", False),
    ("3.8.0", "1", False),
])
def test_pytest_runs_one_worker_per_core_where_xdist_can(tmp_path, xdist_version, jobs, workers):
    """make test-python: pytest-xdist 3.2+ and more than one job give one worker per job, each on one OpenMP thread,
    idle workers taking the others' queued tests; otherwise plain pytest, which needs nothing more. Either way the 15
    slowest tests are listed (CI's log shows where its 30 minutes go)"""
    python = stand_in_python(tmp_path, xdist_version)
    result = make("-n", "test-python", "PYTHON=" + python, "JOBS=" + jobs)
    assert result.returncode == 0, result.stderr
    command = result.stdout.strip().splitlines()[-1]
    if workers:
        assert command == "OMP_NUM_THREADS=1 %s -m pytest -n %s --dist worksteal -q --durations=15 test" % (python, jobs)
    else:
        assert command == "%s -m pytest -q --durations=15 test" % python
