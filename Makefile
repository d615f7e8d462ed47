# llm8 build. `make train_gpt2_fp8` (GPU trainer), `make train_gpt2cpu` (CPU trainer),
# `make test` (CPU tests, the GPU tests under cudasim, compile every CUDA target; what CI
# runs), `make simcheck` (all of make gpucheck's tests under cudasim), `make gpucheck`
# (GPU tests + short benchmark, on an H100/H200), `make bench`, `make env` (GPU machine facts).

CC ?= gcc
PYTHON ?= python3
# -O3: GCC vectorizes the CPU reference's fp32 loops (the matmul backward's) only at -O3, its -O2
# cost model refusing loops that need a scalar tail; no -ffast-math, so every result stays IEEE
# and bitwise what -O2 gives (the CPU tests pass unchanged either way)
# FORMAT_CHECK, in every compile: a call of llm8_die or another printf-like function (declared with
# a format attribute) whose arguments do not match its format stops the build; a warning would let
# a bad-input error print garbage or crash where it should print its one line
FORMAT_CHECK = -Werror=format
CFLAGS = -std=gnu11 -O3 -Wall -Wextra $(FORMAT_CHECK) -I.
BUILD = build

# ---- CUDA toolkit ---------------------------------------------------------------------
# The toolkit is one: nvcc and the CUDA_HOME it sits in, where cuDNN, NCCL and the runpath are looked for.
# nvcc is the NVCC given, else llm.c's choice, the one on PATH, else the environment's $CUDA_HOME/bin/nvcc,
# else /usr/local/cuda's. An exported CUDA_HOME of another toolkit than PATH's nvcc is passed over (it would
# send the build to that release's headers and libraries); CUDA_HOME on make's command line picks its nvcc
CUDA_HOME_ENV_NVCC := $(if $(CUDA_HOME),$(wildcard $(CUDA_HOME)/bin/nvcc))
ifeq ($(origin CUDA_HOME),command line)
  NVCC ?= $(CUDA_HOME)/bin/nvcc
else
  NVCC ?= $(or $(shell command -v nvcc 2>/dev/null),$(CUDA_HOME_ENV_NVCC),/usr/local/cuda/bin/nvcc)
  CUDA_HOME := $(patsubst %/bin/nvcc,%,$(NVCC))
endif
GPU_ARCH ?= sm_90a
NVCC_COMMON_FLAGS = -O3 -std=c++17 -I. -Xcompiler -Wall,$(FORMAT_CHECK) --expt-relaxed-constexpr
# The trainer: machine code for GPU_ARCH, and the PTX nvcc's -arch shorthand adds beside it
# (for sm_90a, compute_90's and compute_90a's: a newer GPU's driver can compile compute_90's).
NVCC_FLAGS = $(NVCC_COMMON_FLAGS) -arch=$(GPU_ARCH)
# The GPU tests and benchmarks: machine code alone. They run on the GPU they were built for, and
# the PTX was a quarter of each compile (train_gpt2_fp8.cu: 45 s with it, 33 s without, on CI's
# kind of machine), time make test spends on every one of them.
NVCC_DEV_FLAGS = $(NVCC_COMMON_FLAGS) -gencode arch=$(subst sm_,compute_,$(GPU_ARCH)),code=$(GPU_ARCH)
NVCC_LDFLAGS = -lcublasLt -lcublas -ldl -Xlinker -rpath,$(CUDA_HOME)/lib64

# ---- cuDNN and its frontend headers: $(CUDA_HOME), Python's site-packages, or the system's --
# Python's site-packages: the environment's, and the user's where Python reads it (pip installs there,
# --user or by itself, when the environment's is not writable: a system Python run by a user)
PY_SITE := $(shell $(PYTHON) -c "import site, sysconfig; p = sysconfig.get_paths(); \
    print(' '.join(dict.fromkeys([p['purelib'], p['platlib']] + ([site.getusersitepackages()] if site.ENABLE_USER_SITE else []))))" 2>/dev/null)
# the system's: where distribution packages put them (NVIDIA's apt and rpm repositories, the nvidia/cuda
# images: /usr/include/cudnn.h and nccl.h, the libraries in the multiarch directory or lib64)
SYSTEM_INCLUDE ?= /usr/include
SYSTEM_LIB_DIRS ?= /usr/lib/x86_64-linux-gnu /usr/lib/aarch64-linux-gnu /usr/lib64 /usr/lib
system_lib_dir = $(patsubst %/$(1),%,$(firstword $(wildcard $(addsuffix /$(1),$(SYSTEM_LIB_DIRS)))))
CUDNN_PIP := $(firstword $(wildcard $(addsuffix /nvidia/cudnn,$(PY_SITE))))
CUDNN_SYSTEM_LIB := $(if $(wildcard $(SYSTEM_INCLUDE)/cudnn.h),$(call system_lib_dir,libcudnn.so.9))
ifneq ($(wildcard $(CUDA_HOME)/include/cudnn.h),)
  CUDNN_INCLUDE ?= $(CUDA_HOME)/include
  CUDNN_LIB ?= $(CUDA_HOME)/lib64
else ifneq ($(CUDNN_PIP),)
  CUDNN_INCLUDE ?= $(CUDNN_PIP)/include
  CUDNN_LIB ?= $(CUDNN_PIP)/lib
else ifneq ($(CUDNN_SYSTEM_LIB),)
  CUDNN_INCLUDE ?= $(SYSTEM_INCLUDE)
  CUDNN_LIB ?= $(CUDNN_SYSTEM_LIB)
endif
CUDNN_FRONTEND_PATH ?= $(firstword $(patsubst %/cudnn_frontend.h,%,$(wildcard \
    $(addsuffix /include/cudnn_frontend.h,$(PY_SITE)) $(BUILD)/site/include/cudnn_frontend.h \
    $(HOME)/cudnn-frontend/include/cudnn_frontend.h ./cudnn-frontend/include/cudnn_frontend.h)))

ifeq ($(NO_CUDNN),1)
  ATTENTION_OBJS =
  ATTENTION_FLAGS = -DLLM8_NO_CUDNN
  ATTENTION_LIBS =
else
  ATTENTION_OBJS = $(BUILD)/cudnn_att.o
  ATTENTION_FLAGS = -I$(CUDNN_INCLUDE)
  # pip's nvidia-cudnn-cu13 ships only libcudnn.so.9 (no libcudnn.so link), so name the file;
  # the frontend runtime-compiles some engines (nvrtc)
  ATTENTION_LIBS = -L$(CUDNN_LIB) -Xlinker -rpath,$(CUDNN_LIB) -l:libcudnn.so.9 -lnvrtc
endif

# ---- NCCL (multi-GPU): $(CUDA_HOME), pip's nvidia-nccl-cu13 in site-packages or the system's
# (libnccl-dev), the newest (MAJOR*10000+MINOR*100+PATCH from nccl.h; on a tie in that order): only
# 2.30+ lets two ranks share one GPU (NCCL_MULTI_RANK_GPU_ENABLE=1, what the one-GPU multi-rank tests
# need), and a machine may hold an older NCCL in /usr/local/cuda or /usr beside pip's
NCCL_PIP := $(firstword $(wildcard $(addsuffix /nvidia/nccl,$(PY_SITE))))
nccl_version = $(if $(wildcard $(1)/nccl.h),$(shell awk '/define NCCL_MAJOR /{a=$$3} /define NCCL_MINOR /{b=$$3} \
    /define NCCL_PATCH /{c=$$3} END{print a*10000+b*100+c}' $(1)/nccl.h),0)
NCCL_CUDA_VERSION := $(call nccl_version,$(CUDA_HOME)/include)
NCCL_PIP_VERSION := $(if $(NCCL_PIP),$(call nccl_version,$(NCCL_PIP)/include),0)
NCCL_SYSTEM_LIB := $(call system_lib_dir,libnccl.so.2)
NCCL_SYSTEM_VERSION := $(if $(NCCL_SYSTEM_LIB),$(call nccl_version,$(SYSTEM_INCLUDE)),0)
NCCL_FROM := $(shell printf '%s\n' "cuda $(NCCL_CUDA_VERSION)" "pip $(NCCL_PIP_VERSION)" "system $(NCCL_SYSTEM_VERSION)" | \
    awk '$$2 > best {best = $$2; from = $$1} END {print from}')
ifeq ($(NCCL_FROM),pip)
  NCCL_INCLUDE ?= $(NCCL_PIP)/include
  NCCL_LIB ?= $(NCCL_PIP)/lib
else ifeq ($(NCCL_FROM),cuda)
  NCCL_INCLUDE ?= $(CUDA_HOME)/include
  NCCL_LIB ?= $(CUDA_HOME)/lib64
else ifeq ($(NCCL_FROM),system)
  NCCL_INCLUDE ?= $(SYSTEM_INCLUDE)
  NCCL_LIB ?= $(NCCL_SYSTEM_LIB)
endif
# NCCL_FLAGS goes first among the -I flags and NCCL_LIBS before the other libraries: cuDNN's
# directory or $(CUDA_HOME)'s may hold another nccl.h and libnccl.so.2, and the first -I, the first
# -L and the first runpath entry decide which is compiled against, linked and loaded
# (LD_LIBRARY_PATH, searched before the runpath, can still override the last: test_multi_gpu
# prints the runtime and header versions). pip ships only libnccl.so.2 (no libnccl.so), so name it.
NCCL_FLAGS = -I$(NCCL_INCLUDE)
NCCL_LIBS = -L$(NCCL_LIB) -Xlinker -rpath,$(NCCL_LIB) -l:libnccl.so.2

# ---- OpenMPI (optional: -pi mpi); without it -pi fs|tcp still launch multi-GPU runs -------
OPENMPI_DIR ?= /usr/lib/x86_64-linux-gnu/openmpi
ifeq ($(NO_USE_MPI),1)
  MPI_FLAGS =
  MPI_LIBS =
else ifneq ($(wildcard $(OPENMPI_DIR)/include/mpi.h),)
  MPI_FLAGS = -DUSE_MPI -I$(OPENMPI_DIR)/include
  # -Xlinker twice, not nvcc's -Xlinker -rpath,DIR: g++ (the cudasim trainer below) passes that on whole
  MPI_LIBS = -L$(OPENMPI_DIR)/lib -Xlinker -rpath -Xlinker $(OPENMPI_DIR)/lib -lmpi
endif

.PHONY: all test test-build test-binaries test-sim test-python compile-cuda cuda-objects test-sanitizers simcheck gpucheck gpu-tests gpucheck-tests gpucheck-ranks bench env \
        clean check-cuda check-cudnn check-nccl train_gpt2cu train_gpt2fp32cu train_gpt2fp8 train_gpt2

all: train_gpt2_fp8 train_gpt2cpu

# llm.c's trainer targets (and the FP8 name they suggest), which its users type: one line naming
# llm8's, not make's "No rule to make target"
train_gpt2cu train_gpt2fp32cu train_gpt2fp8:
	@echo "error: make $@: llm8's GPU trainer is train_gpt2_fp8 (make train_gpt2_fp8; -p bf16 trains as llm.c's train_gpt2cu)" >&2; exit 2
train_gpt2:
	@echo "error: make $@: llm8's CPU trainer is train_gpt2cpu (make train_gpt2cpu)" >&2; exit 2

# CUDA 13 is what llm8 is built and tested with: cuBLASLt's 128-block FP8 scale modes (the block
# recipe) and CUDA 13's runtime API; an older nvcc would fail deep inside a header instead
NVCC_RELEASE = $(shell "$(NVCC)" --version 2>/dev/null | sed -n 's/.*release \([0-9][0-9]*\)\.\([0-9][0-9]*\).*/\1.\2/p')
# where check-cuda looked for nvcc: the NVCC given, CUDA_HOME's on make's command line, or PATH, CUDA_HOME's
# bin and /usr/local/cuda/bin
NVCC_LOOKED = $(if $(filter environment command line,$(origin NVCC)),NVCC=$(NVCC) is no executable,$(if \
    $(filter command line,$(origin CUDA_HOME)),CUDA_HOME=$(CUDA_HOME) has no bin/nvcc,looked on PATH$(comma) \
    in CUDA_HOME's bin and in /usr/local/cuda/bin))
comma := ,
check-cuda:
	@test -x "$(NVCC)" || { echo "error: nvcc not found ($(NVCC_LOOKED)); install the CUDA 13 toolkit or set NVCC=/path/to/nvcc" >&2; exit 1; }
	@test "$$(echo "$(NVCC_RELEASE)" | cut -d. -f1)" -ge 13 2>/dev/null || { echo "error: $(NVCC) --version reports $(if $(NVCC_RELEASE),CUDA $(NVCC_RELEASE),no CUDA release); llm8 needs the CUDA 13 toolkit (set NVCC=/path/to/cuda-13/bin/nvcc)" >&2; exit 1; }

# each names where it looked, what to install, and the variables that point it elsewhere; a variable given
# that points where the header is not is named as such, instead of the compiler's "No such file" later
NCCL_LOOKED = $(strip $(CUDA_HOME)/include $(addsuffix /nvidia/nccl/include,$(PY_SITE)) $(SYSTEM_INCLUDE)) (the last with libnccl.so.2 in one of $(SYSTEM_LIB_DIRS))
check-nccl:
	@test -n "$(NCCL_INCLUDE)" || { echo "error: NCCL not found: no nccl.h in $(NCCL_LOOKED); install NCCL 2 (pip install nvidia-nccl-cu13, or apt-get install libnccl-dev) or set NCCL_INCLUDE and NCCL_LIB" >&2; exit 1; }
	@test -f "$(NCCL_INCLUDE)/nccl.h" || { echo "error: NCCL_INCLUDE=$(NCCL_INCLUDE) holds no nccl.h; set NCCL_INCLUDE to the directory of nccl.h (and NCCL_LIB to that of libnccl.so.2)" >&2; exit 1; }

CUDNN_LOOKED = $(strip $(CUDA_HOME)/include $(addsuffix /nvidia/cudnn/include,$(PY_SITE)) $(SYSTEM_INCLUDE)) (the last with libcudnn.so.9 in one of $(SYSTEM_LIB_DIRS))
check-cudnn:
ifneq ($(NO_CUDNN),1)
	@test -n "$(CUDNN_INCLUDE)" || { echo "error: cuDNN not found: no cudnn.h in $(CUDNN_LOOKED); install cuDNN 9 (pip install nvidia-cudnn-cu13), set CUDNN_INCLUDE and CUDNN_LIB, or build with NO_CUDNN=1 (export NO_CUDNN=1 for scripts/quickstart.sh and the run scripts, which run make themselves)" >&2; exit 1; }
	@test -f "$(CUDNN_INCLUDE)/cudnn.h" || { echo "error: CUDNN_INCLUDE=$(CUDNN_INCLUDE) holds no cudnn.h; set CUDNN_INCLUDE to the directory of cudnn.h (and CUDNN_LIB to that of libcudnn.so.9), or build with NO_CUDNN=1" >&2; exit 1; }
	@test -n "$(CUDNN_FRONTEND_PATH)" || { echo "error: cuDNN frontend headers (cudnn_frontend.h) not found in $(strip $(addsuffix /include,$(PY_SITE)) $(BUILD)/site/include $(HOME)/cudnn-frontend/include ./cudnn-frontend/include); run: $(PYTHON) -m pip install --no-deps nvidia-cudnn-frontend (or set CUDNN_FRONTEND_PATH, or build with NO_CUDNN=1)" >&2; exit 1; }
	@test -f "$(CUDNN_FRONTEND_PATH)/cudnn_frontend.h" || { echo "error: CUDNN_FRONTEND_PATH=$(CUDNN_FRONTEND_PATH) holds no cudnn_frontend.h; set it to the frontend's include directory (e.g. ~/cudnn-frontend/include), or build with NO_CUDNN=1" >&2; exit 1; }
endif

$(BUILD):
	@mkdir -p $(BUILD)

$(BUILD)/cudnn_att.o: llmc/cudnn_att.cpp llmc/cudnn_att.h llmc/utils.h | $(BUILD) check-cuda check-cudnn
	$(NVCC) $(NVCC_FLAGS) -I$(CUDNN_INCLUDE) -I$(CUDNN_FRONTEND_PATH) -c $< -o $@

LLMC_HEADERS = $(wildcard llmc/*.h llmc/*.cuh)

# The trainer and the GPU tests compile to objects and link apart: their compiles then run
# beside cudnn_att.o's (the frontend's headers make it the longest compile by far: 145 s on CI's
# machine, 46 s the trainer's), not after it, which a device call's fixed budget feels. The
# objects of a NO_CUDNN=1 build go to a folder of their own, and the binaries depend on a stamp
# of the flavour last linked, so that switching either way relinks them.
# OpenMP: the random init's normals (llmc/rand.h) on every core (d48: 1.56 billion of them).
CUDA_OBJ = $(BUILD)/obj$(if $(filter 1,$(NO_CUDNN)),-nocudnn)
CUDA_FLAVOR = $(BUILD)/flavor-$(if $(filter 1,$(NO_CUDNN)),nocudnn,cudnn)
$(CUDA_FLAVOR):
	@mkdir -p $(@D) && rm -f $(BUILD)/flavor-* && touch $@
CUDA_PROGRAM_EXTRA_FLAGS = -Xcompiler -fopenmp $(NCCL_FLAGS) $(ATTENTION_FLAGS) $(MPI_FLAGS)
CUDA_PROGRAM_LIBS = $(ATTENTION_OBJS) $(NCCL_LIBS) $(NVCC_LDFLAGS) $(ATTENTION_LIBS) $(MPI_LIBS) -lgomp

$(CUDA_OBJ)/train_gpt2_fp8.o: train_gpt2_fp8.cu $(LLMC_HEADERS) | check-cuda check-cudnn check-nccl
	@mkdir -p $(@D)
	$(NVCC) $(NVCC_FLAGS) $(CUDA_PROGRAM_EXTRA_FLAGS) -c $< -o $@

train_gpt2_fp8: $(CUDA_OBJ)/train_gpt2_fp8.o $(ATTENTION_OBJS) $(CUDA_FLAVOR)
	$(NVCC) $(NVCC_FLAGS) $< $(CUDA_PROGRAM_LIBS) -o $@

# the per-GEMM FP8 vs bf16 benchmark (dev/bench/bench_gemm.cu): cuBLASLt only, no cuDNN
bench_gemm: dev/bench/bench_gemm.cu $(LLMC_HEADERS) | check-cuda
	$(NVCC) $(NVCC_DEV_FLAGS) $< $(NVCC_LDFLAGS) -o $@

# which FP8-output GELU epilogues the GPU's cuBLASLt has (dev/bench/probe_epilogues.cu): asks, does not time
probe_epilogues: dev/bench/probe_epilogues.cu $(LLMC_HEADERS) | check-cuda
	$(NVCC) $(NVCC_DEV_FLAGS) $< $(NVCC_LDFLAGS) -o $@

# the FP8 tile cast's parts timed apart at d12's shapes (dev/bench/bench_casts.cu): what bounds it
bench_casts: dev/bench/bench_casts.cu $(LLMC_HEADERS) | check-cuda
	$(NVCC) $(NVCC_DEV_FLAGS) $< $(NVCC_LDFLAGS) -o $@

# adamw8's block step built for its common path alone, machine code only (dev/bench/sass_path.py
# counts the instructions it executes; test/test_sass_path.py holds it to a budget)
$(BUILD)/adamw8_sass_probe.cubin: dev/bench/adamw8_sass_probe.cu $(LLMC_HEADERS) | check-cuda
	@mkdir -p $(BUILD)
	$(NVCC) $(NVCC_DEV_FLAGS) -cubin $< -o $@

FMAD_PTX = $(BUILD)/ptx/train_gpt2_fp8.fmad-true.ptx $(BUILD)/ptx/train_gpt2_fp8.fmad-false.ptx
# the trainer's kernels as PTX with nvcc's FMA contraction on (-fmad=true, the build's default)
# and off: test/test_fma_contraction.py finds the kernels whose arithmetic contraction changes
$(BUILD)/ptx/train_gpt2_fp8.fmad-%.ptx: train_gpt2_fp8.cu $(LLMC_HEADERS) | check-cuda check-nccl
	@mkdir -p $(@D)
	$(NVCC) $(NVCC_COMMON_FLAGS) $(CUDA_PROGRAM_EXTRA_FLAGS) -arch=$(GPU_ARCH) -fmad=$* -ptx $< -o $@

train_gpt2cpu: test/train_gpt2cpu.c $(LLMC_HEADERS) test/gpt2_ref.h
	$(CC) $(CFLAGS) -fopenmp $< -lm -o $@

# ---- tests ------------------------------------------------------------------------------
CPU_TESTS = $(patsubst test/%.c,$(BUILD)/%,$(wildcard test/test_*.c))
CPU_CXX_TESTS = $(patsubst test/%.cpp,$(BUILD)/%,$(wildcard test/test_*.cpp))
GPU_TESTS = $(patsubst test/%.cu,$(BUILD)/%,$(wildcard test/test_*.cu))

$(BUILD)/test_%: test/test_%.c $(LLMC_HEADERS) $(wildcard test/*.h) | $(BUILD)
	$(CC) $(CFLAGS) -fopenmp $< -lm -ldl -o $@

# a stand-in for the driver's NVML (test/fake_nvml.c), loaded by test_gpu_monitor and the -lg trainer tests
$(BUILD)/libfake_nvml.so: test/fake_nvml.c | $(BUILD)
	$(CC) $(CFLAGS) -shared -fPIC $< -o $@
$(BUILD)/test_gpu_monitor: $(BUILD)/libfake_nvml.so

# GPU tests include the CPU reference, which parallelizes with OpenMP
# C++ CPU tests: they include CUDA's host-side headers (cuda_fp8.h) but need neither nvcc nor a GPU
$(BUILD)/test_%: test/test_%.cpp $(LLMC_HEADERS) $(wildcard test/*.h) | $(BUILD) check-cuda
	$(CXX) -std=c++17 -O2 -Wall -Wextra $(FORMAT_CHECK) -I. -I$(CUDA_HOME)/include $< -lm -o $@

GPU_TEST_OBJS = $(patsubst $(BUILD)/%,$(CUDA_OBJ)/%.o,$(GPU_TESTS))
$(GPU_TEST_OBJS): $(CUDA_OBJ)/%.o: test/%.cu $(LLMC_HEADERS) $(wildcard test/*.h test/*.cuh) train_gpt2_fp8.cu | check-cuda check-cudnn check-nccl
	@mkdir -p $(@D)
	$(NVCC) $(NVCC_DEV_FLAGS) $(CUDA_PROGRAM_EXTRA_FLAGS) -c $< -o $@

$(GPU_TESTS): $(BUILD)/%: $(CUDA_OBJ)/%.o $(ATTENTION_OBJS) $(CUDA_FLAVOR)
	$(NVCC) $(NVCC_DEV_FLAGS) $< $(CUDA_PROGRAM_LIBS) -o $@

# what compiles without cudnn_att.o: dev/gpu_session.sh builds these beside it
cuda-objects: $(CUDA_OBJ)/train_gpt2_fp8.o $(GPU_TEST_OBJS) bench_gemm probe_epilogues bench_casts

# ---- cudasim: the CUDA tests and the trainer run on the CPU (test/cudasim/cudasim.h) -------
# translate.py rewrites the launches; g++ compiles with cudasim.h force-included; the
# cudasim_*.cpp files emulate the CUDA runtime, cuBLASLt, NCCL and the driver's VMM calls.
SIM = $(BUILD)/sim
SIM_CXX = $(CXX) -std=c++17 -O2 $(FORMAT_CHECK) -fopenmp -I$(NCCL_INCLUDE) -I$(CUDA_HOME)/include -I$(SIM) -I. \
    -include test/cudasim/cudasim.h -DLLM8_NO_CUDNN
SIM_INPUTS = $(LLMC_HEADERS) $(wildcard test/*.h test/*.cuh test/test_*.cu test/cudasim/test_*.cu) train_gpt2_fp8.cu \
    dev/bench/probe_epilogues.cu dev/bench/bench_casts.cu
SIM_RUNTIME = $(patsubst test/cudasim/%.cpp,$(SIM)/%.o,$(wildcard test/cudasim/cudasim_*.cpp))
SIM_TESTS = $(patsubst test/%.cu,$(SIM)/%,$(wildcard test/test_*.cu)) \
    $(patsubst test/cudasim/%.cu,$(SIM)/%,$(wildcard test/cudasim/test_*.cu))

$(SIM)/.translated: $(SIM_INPUTS) test/cudasim/translate.py | check-cuda check-nccl
	@mkdir -p $(SIM)
	$(PYTHON) test/cudasim/translate.py $(SIM) $(SIM_INPUTS)
	@touch $@

# The emulated cuBLASLt's dot products (cudasim_cublaslt.cpp) in 256-bit vectors where this
# machine has AVX2 (the tests run where they build): the same operations in the same order, so
# the same bits (no -mfma, so no fused multiply-adds). The trainer's 5 steps at the tests' size
# took 3.64 s instead of 3.99 (user time, the best of 3 each).
SIM_VECTOR_FLAGS := $(if $(shell grep -qw avx2 /proc/cpuinfo 2>/dev/null && echo yes),-mavx2)
$(SIM)/cudasim_cublaslt.o: SIM_OBJECT_FLAGS = $(SIM_VECTOR_FLAGS)
$(SIM)/cudasim_%.o: test/cudasim/cudasim_%.cpp test/cudasim/cudasim.h | $(SIM)/.translated
	$(SIM_CXX) $(SIM_OBJECT_FLAGS) -Wall -Wextra -c $< -o $@

$(SIM)/test_%: $(SIM)/.translated $(SIM_RUNTIME)
	$(SIM_CXX) -x c++ $(SIM)/test/test_$*.cu -x none $(SIM_RUNTIME) -lm -ldl -o $@

# cudasim's own tests (what only the emulation can show, e.g. a missing stream dependency)
$(SIM)/test_cudasim_%: $(SIM)/.translated $(SIM_RUNTIME)
	$(SIM_CXX) -x c++ $(SIM)/test/cudasim/test_cudasim_$*.cu -x none $(SIM_RUNTIME) -lm -o $@

# with OpenMPI where the GPU trainer has it, so that mpirun's launch (-pi mpi) runs under
# cudasim too (test_sim_trainer.py)
$(SIM)/train_gpt2_fp8: $(SIM)/.translated $(SIM_RUNTIME)
	$(SIM_CXX) $(MPI_FLAGS) -x c++ $(SIM)/train_gpt2_fp8.cu -x none $(SIM_RUNTIME) $(MPI_LIBS) -lm -ldl -o $@

# the probe's own code (descriptors, the table, the run of each accepted case) against cudasim's cuBLASLt
$(SIM)/probe_epilogues: $(SIM)/.translated $(SIM_RUNTIME)
	$(SIM_CXX) -x c++ $(SIM)/dev/bench/probe_epilogues.cu -x none $(SIM_RUNTIME) -lm -ldl -o $@

# its harness (shapes, timing, the table) on small shapes under cudasim (test_bench_casts.py)
$(SIM)/bench_casts: $(SIM)/.translated $(SIM_RUNTIME)
	$(SIM_CXX) -x c++ $(SIM)/dev/bench/bench_casts.cu -x none $(SIM_RUNTIME) -lm -ldl -o $@

# the GPU test binaries under cudasim (part of make test: a few minutes on 2 cores)
test-sim: $(SIM_TESTS)
	@RUNNER_NAME="cudasim tests" bash test/run_cpu_tests.sh $(SIM_TESTS)

# everything make gpucheck runs, under cudasim, on smaller models, minus speed (streams
# are ordered, not concurrent: test/cudasim/cudasim.h says what it checks and what not); the
# multi-rank trainer runs take longer than CI's budget, so only simcheck has them all (make
# test runs their killed-rank section: test/test_sim_trainer.py)
simcheck: test-sim $(SIM)/train_gpt2_fp8
	LLM8_TRAINER=$(SIM)/train_gpt2_fp8 $(PYTHON) test/gpu_trainer_ranks.py

# every binary first, one build per core (nvcc and g++ use one core each), so a build break fails
# fast; then the CPU and cudasim test binaries, and pytest last, so the last line is its summary
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
test:
	$(MAKE) -j$(JOBS) test-build
	$(MAKE) test-binaries
	$(MAKE) test-python

# the CPU and cudasim test binaries in one lane a core (run_cpu_tests.sh's TEST_JOBS), each on
# one OpenMP thread as pytest's workers are: with OpenMP's default threads, two binaries of two
# threads each on two cores spun on each other's barriers (384 s, against 294). cudasim's
# test_gpt2 goes first: on CI's 2 cores it takes one lane all the while and the rest fill the
# other (test_gpt2 206 s of the 220, in a fresh clone of 0880b9b). The CPU tests beside the
# cudasim ones, a lane each, took 363 s (when test_gpt2 took 290).
test-binaries: $(CPU_TESTS) $(CPU_CXX_TESTS) $(SIM_TESTS)
	@OMP_NUM_THREADS=1 TEST_JOBS=$(JOBS) RUNNER_NAME="cpu and cudasim tests" bash test/run_cpu_tests.sh \
	    $(SIM)/test_gpt2 $(CPU_TESTS) $(CPU_CXX_TESTS) $(filter-out $(SIM)/test_gpt2,$(SIM_TESTS))

test-build: compile-cuda $(CPU_TESTS) $(CPU_CXX_TESTS) train_gpt2cpu $(SIM_TESTS) $(SIM)/train_gpt2_fp8 $(SIM)/probe_epilogues $(SIM)/bench_casts $(BUILD)/libfake_nvml.so

# pytest spreads the tests over one worker per core where pytest-xdist 3.2+ is installed
# (scripts/setup_python.sh installs it), each worker's trainers on one OpenMP thread: two
# workers of two threads each on two cores spin on each other's barriers. An idle worker
# takes tests queued for the other (worksteal): the slow ones would otherwise end the run
# on one core. On a machine like CI's (2 cores), the same tests took 10.7 and 11.9 min this
# way, 12.4 and 11.7 with xdist's default queues, 14.9 with OpenMP's default threads and 17.7
# on one worker (the commit messages of 1466685 and 3456434 have the later figures)
# The 15 slowest tests are listed before pytest's summary: CI's budget is 30 minutes in all, so
# a log shows where the time goes.
PYTEST_XDIST = $(shell $(PYTHON) -c 'import sys, xdist; sys.exit(tuple(map(int, xdist.__version__.split(".")[:2])) < (3, 2))' 2>/dev/null && echo yes)
PYTEST_RUN = $(if $(and $(PYTEST_XDIST),$(filter-out 1,$(JOBS))),OMP_NUM_THREADS=1 $(PYTHON) -m pytest -n $(JOBS) --dist worksteal,$(PYTHON) -m pytest)
test-python: train_gpt2cpu train_gpt2_fp8 bench_gemm probe_epilogues bench_casts $(BUILD)/adamw8_sass_probe.cubin $(FMAD_PTX) $(SIM)/train_gpt2_fp8 $(SIM)/probe_epilogues $(SIM)/bench_casts $(SIM)/test_multi_gpu $(BUILD)/libfake_nvml.so
	$(PYTEST_RUN) -q --durations=15 test

compile-cuda: train_gpt2_fp8 bench_gemm probe_epilogues bench_casts $(BUILD)/adamw8_sass_probe.cubin $(FMAD_PTX) $(GPU_TESTS)

# the C tests built with AddressSanitizer and UBSan, and the cudasim tests with UBSan, into
# $(BUILD)/sanitize: what the -O3 builds run past silently (a read past a buffer, a use after
# free, a memcpy from NULL, a shift or an overflow with undefined behaviour) stops the test
# with a report, and the death tests' one-line checks fail on any report. Not in make test: it
# takes several minutes more. Leaks are not checked (a death test exits through llm8_die with
# its buffers allocated), and cudasim's tests get no ASan: its fibers switch stacks by hand,
# which ASan mistakes for overflows.
SANITIZE = $(BUILD)/sanitize
SANITIZE_CFLAGS = -std=gnu11 -O1 -g -Wall -Wextra $(FORMAT_CHECK) -I. -fsanitize=address,undefined -fno-omit-frame-pointer \
    -fno-sanitize-recover=undefined
SANITIZE_SIM_CXX = $(CXX) -fsanitize=undefined -fno-sanitize-recover=undefined -g
SANITIZE_CPU_TESTS = $(patsubst $(BUILD)/%,$(SANITIZE)/%,$(CPU_TESTS))
SANITIZE_SIM_TESTS = $(patsubst $(BUILD)/%,$(SANITIZE)/%,$(SIM_TESTS))
test-sanitizers:
	$(MAKE) BUILD=$(SANITIZE) CFLAGS="$(SANITIZE_CFLAGS)" $(SANITIZE_CPU_TESTS) $(SANITIZE)/libfake_nvml.so
	$(MAKE) BUILD=$(SANITIZE) CXX="$(SANITIZE_SIM_CXX)" $(SANITIZE_SIM_TESTS)
	@ASAN_OPTIONS=detect_leaks=0 UBSAN_OPTIONS=print_stacktrace=1 RUNNER_NAME="sanitized cpu tests" \
	    bash test/run_cpu_tests.sh $(SANITIZE_CPU_TESTS)
	@UBSAN_OPTIONS=print_stacktrace=1 RUNNER_NAME="sanitized cudasim tests" bash test/run_cpu_tests.sh $(SANITIZE_SIM_TESTS)

# on a GPU: the test binaries, the multi-rank trainer runs, the short benchmark; the first two
# are also targets of their own
gpucheck: gpucheck-tests gpucheck-ranks
	$(MAKE) bench BENCH_ARGS="--quick"

gpu-tests: $(GPU_TESTS)

gpucheck-tests: $(GPU_TESTS)
	@bash test/run_gpu_tests.sh $(GPU_TESTS)

gpucheck-ranks: train_gpt2_fp8
	@PYTHON=$(PYTHON) bash test/run_gpu_tests.sh --ranks $(RANKS_SECTIONS)

bench: train_gpt2_fp8 bench_gemm
	$(PYTHON) dev/bench/bench.py $(BENCH_ARGS)

env:
	@LLM8_TOOLKIT="NVCC=$(NVCC) CUDA_HOME=$(CUDA_HOME) CUDNN_INCLUDE=$(CUDNN_INCLUDE) CUDNN_LIB=$(CUDNN_LIB) CUDNN_FRONTEND_PATH=$(CUDNN_FRONTEND_PATH)" \
	LLM8_NCCL="$(NCCL_INCLUDE) (nccl.h version codes, MAJOR*10000+MINOR*100+PATCH, 0 = none: $(CUDA_HOME)/include $(NCCL_CUDA_VERSION), pip's $(NCCL_PIP_VERSION), $(SYSTEM_INCLUDE) $(NCCL_SYSTEM_VERSION))" \
	    bash dev/gpu_env.sh

clean:
	rm -rf $(BUILD) train_gpt2_fp8 train_gpt2cpu bench_gemm probe_epilogues bench_casts
