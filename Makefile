# zero: one GNU Makefile. Objects go to build/ (build-san/ with SAN=1).
#   make            libraries and binaries          make test     every test, ends "N passed, N failed"
#   make run        train the tiny GPT (README)     make bench    benchmarks (not part of make test)
#   make asan       tests under ASan + UBSan        make fuzz     libFuzzer on every parser
#   make tsan       the threaded tests under ThreadSanitizer (objects in build-tsan/)
#   make deps       install missing system packages (apt-get on Debian); bench-deps: the bench tools
#   make test-deps  install the packages only the tests use (Chromium), best effort
#   make arch       redraw the include graph in docs/ARCHITECTURE.md, then check the architecture:
#                   forbidden includes (tests/arch/deps.py), circles between objects (cycles.sh),
#                   functions over 150 lines (longfn.sh); known offenders in tests/arch/allow.txt.
#                   make test runs the same checks (test arch_checks).
# Options: SAN=1 (sanitizers), TSAN=1 (ThreadSanitizer), WERROR=1 (-Werror, as CI),
#          FUZZ_SECONDS=N (make fuzz: seconds in all, split between the targets).

CC      ?= cc
SAN     ?= 0
TSAN    ?= 0
WERROR  ?= 0
BUILD   := $(if $(filter 1,$(SAN)),build-san,$(if $(filter 1,$(TSAN)),build-tsan,build))
CFLAGS  ?= -O2 -g
CFLAGS  += -std=c11 -D_GNU_SOURCE -Wall -Wextra -Wshadow -pthread -MMD -MP
ifeq ($(WERROR),1)
  CFLAGS += -Werror
endif
ifeq ($(SAN),1)
  CFLAGS  += -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined -O1
  LDFLAGS += -fsanitize=address,undefined
endif
# TSan: no target_clones (their ifunc resolvers run at load, before the TSan runtime is up, and
# crash); the baseline copy gives the same bits (core/model/fastmath.h)
ifeq ($(TSAN),1)
  CFLAGS  += -fsanitize=thread -fno-omit-frame-pointer -O1 -DZR_VEC_CLONES=
  LDFLAGS += -fsanitize=thread
endif
# Link flags are read from pkg-config when the link runs (after `deps` installed what was missing).
LIBS = $$(pkg-config --libs jansson libcrypto libarchive libpcre2-8 2>/dev/null || \
          echo -ljansson -lcrypto -larchive -lpcre2-8) -laio -lpthread -lm
# the engine's BLAS (OpenBLAS), read when the compile or link runs
BLAS_CFLAGS = $$(pkg-config --cflags openblas 2>/dev/null)
BLAS_LIBS   = $$(pkg-config --libs openblas 2>/dev/null || echo -lopenblas)

# ------------------------------------------------------------------ dependencies
# Debian package that provides each dependency; `deps` installs the missing ones.
DEPS_CHECK = \
  command -v pkg-config >/dev/null 2>&1 || missing="$$missing pkg-config"; \
  pkg-config --exists jansson 2>/dev/null || missing="$$missing libjansson-dev"; \
  pkg-config --exists libcrypto 2>/dev/null || missing="$$missing libssl-dev"; \
  pkg-config --exists libarchive 2>/dev/null || missing="$$missing libarchive-dev"; \
  pkg-config --exists libpcre2-8 2>/dev/null || missing="$$missing libpcre2-dev"; \
  pkg-config --exists openblas 2>/dev/null || missing="$$missing libopenblas-dev"; \
  pkg-config --exists ompi-c 2>/dev/null || missing="$$missing libopenmpi-dev"; \
  command -v mpirun >/dev/null 2>&1 || missing="$$missing openmpi-bin"; \
  printf '\#include <libaio.h>\nint main(void){io_context_t c=0;return io_setup(1,&c);}\n' | \
    $(CC) -x c - -laio -o /dev/null >/dev/null 2>&1 || missing="$$missing libaio-dev";

.PHONY: all deps test-deps test asan tsan tsan-run stress bench bench-deps run fuzz clean arch oracle-venv
all: $(BUILD)/libzck.a $(BUILD)/libzfmt.a $(BUILD)/libzr.a $(BUILD)/zckpt $(BUILD)/zrun \
     $(BUILD)/zgen $(BUILD)/ztok

deps:
	@missing=""; $(DEPS_CHECK) \
	if [ -n "$$missing" ]; then \
	  if command -v apt-get >/dev/null 2>&1; then \
	    sudo=""; [ "$$(id -u)" = 0 ] || sudo=sudo; \
	    echo "[deps] installing:$$missing"; \
	    $$sudo apt-get update -q >/dev/null && \
	    DEBIAN_FRONTEND=noninteractive $$sudo apt-get install -y -q $$missing >/dev/null || \
	      { echo "[deps] error: apt-get install$$missing failed" >&2; exit 1; }; \
	  else \
	    echo "[deps] error: missing dependencies; install the packages providing:$$missing" \
	         "(Debian names; on Fedora: jansson-devel openssl-devel libaio-devel libarchive-devel openblas-devel openmpi-devel pcre2-devel)" >&2; exit 1; \
	  fi; \
	fi

# The packages only the tests use, installed by `make test` (not by `deps`, so that `make` and
# `make run` stay lean): Chromium, which renders the training plot's SVG in a real browser (test
# plot_renders_in_chromium). Best effort: where it cannot be installed (no apt-get, no sudo
# without a password, no network) one line says so and that test skips.
TEST_DEPS_CHECK = \
  command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || \
    command -v google-chrome >/dev/null 2>&1 || missing="$$missing chromium";

test-deps:
	@missing=""; $(TEST_DEPS_CHECK) \
	if [ -n "$$missing" ]; then \
	  sudo=""; [ "$$(id -u)" = 0 ] || sudo="sudo -n"; \
	  if command -v apt-get >/dev/null 2>&1; then \
	    echo "[test-deps] installing:$$missing"; \
	    $$sudo apt-get update -q >/dev/null 2>&1; \
	    DEBIAN_FRONTEND=noninteractive timeout 900 $$sudo apt-get install -y -q $$missing \
	      >/dev/null 2>&1 || \
	      echo "[test-deps] warning: apt-get install$$missing failed: the tests that need it skip"; \
	  else \
	    echo "[test-deps] warning: no apt-get to install$$missing: the tests that need it skip"; \
	  fi; \
	fi

# ------------------------------------------------------------------ libraries
# Each folder compiles with the include paths of what it may use, so a wrong include fails the
# build (docs/ARCHITECTURE.md section 2 draws the graph; tests/arch/deps.py checks it):
#   ckpt <- formats;  ckpt <- core/model, core/dist;  core/device <- model, dist;
#   core/zero <- device, model, dist;  core/train <- everything in core;  cli -> public headers.
CKPT_SRC := $(wildcard ckpt/*.c)
CKPT_OBJ := $(CKPT_SRC:%.c=$(BUILD)/%.o)
FMT_SRC  := $(wildcard formats/*.c)
FMT_OBJ  := $(FMT_SRC:%.c=$(BUILD)/%.o)
CORE_DIRS := model dist device zero train
# core/device/hostsim.c is test scaffolding and core/dist/comm_mpi.c the MPI backend: each its
# own loadable shared object (below), not in libzr
CORE_SRC := $(filter-out core/device/hostsim.c core/dist/comm_mpi.c,$(foreach d,$(CORE_DIRS),$(wildcard core/$(d)/*.c)))
CORE_OBJ := $(CORE_SRC:%.c=$(BUILD)/%.o)
CLI_COMMON := $(BUILD)/cli/common.o $(BUILD)/cli/opts.o
INC_ckpt   := -Ickpt
INC_formats := -Iformats -Ickpt
INC_model  := -Icore/model -Ickpt
INC_dist   := -Icore/dist -Ickpt
INC_device := -Icore/device -Icore/model -Icore/dist -Ickpt
INC_zero   := -Icore/zero -Icore/device -Icore/model -Icore/dist -Ickpt
INC_train  := -Icore/train -Icore/zero -Icore/device -Icore/model -Icore/dist -Ickpt
INC_cuda   := -Icore/device/cuda -Icore/device -Icore/model -Ickpt
# the tests reach internal headers of every folder; cli/ only the public ones
INC_tests  := -Itests -Icli -Iformats -Icore $(foreach d,$(CORE_DIRS),-Icore/$(d)) -Ickpt
INC_cli    := -Icli -Iformats -Icore -Ickpt

$(BUILD)/ckpt/%.o: ckpt/%.c | deps
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(INC_ckpt) -c $< -o $@

$(BUILD)/formats/%.o: formats/%.c | deps
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(INC_formats) -c $< -o $@

# the engine's loops must vectorize: -O3 (GCC 12 does not vectorize loops of unknown length at
# -O2) and no errno from sqrtf; sanitizer builds keep their -O1
CORE_OPT := $(if $(filter 1,$(SAN) $(TSAN)),,-O3) -fno-math-errno
$(BUILD)/core/%.o: core/%.c | deps
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(CORE_OPT) $(BLAS_CFLAGS) $(INC_$(firstword $(subst /, ,$*))) -c $< -o $@

$(BUILD)/cli/%.o: cli/%.c | deps
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(INC_cli) -c $< -o $@

$(BUILD)/tests/%.o: tests/%.c | deps
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(INC_tests) -c $< -o $@

$(BUILD)/libzck.a: $(CKPT_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/libzfmt.a: $(FMT_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/libzr.a: $(CORE_OBJ)
	@rm -f $@
	ar rcs $@ $^

# the architecture (docs/ARCHITECTURE.md section 2): redraw the include graph, then run the three
# checks, each to the end, failing when any failed
ARCH_ALLOW := tests/arch/allow.txt
arch: $(BUILD)/libzck.a $(BUILD)/libzfmt.a $(BUILD)/libzr.a
	@rc=0; \
	python3 tests/arch/deps.py --write --allow $(ARCH_ALLOW) || rc=1; \
	sh tests/arch/cycles.sh --allow $(ARCH_ALLOW) $(BUILD) || rc=1; \
	sh tests/arch/longfn.sh --allow $(ARCH_ALLOW) || rc=1; \
	exit $$rc

# ------------------------------------------------------------------ programs
# zckpt links the engine too (`zckpt audit` applies zr_train's checks and the dry run's
# memory plan); it never loads the CUDA backend
$(BUILD)/zckpt: $(BUILD)/cli/zckpt.o $(CLI_COMMON) $(BUILD)/libzfmt.a $(BUILD)/libzr.a \
                $(BUILD)/libzck.a
	$(CC) $(LDFLAGS) -o $@ $^ $(LIBS) $(BLAS_LIBS)

# ztok: the tokenizer (formats/tokenizer.c and friends); no engine
$(BUILD)/ztok: $(BUILD)/cli/ztok.o $(CLI_COMMON) $(BUILD)/libzfmt.a $(BUILD)/libzck.a
	$(CC) $(LDFLAGS) -o $@ $^ $(LIBS)

# -rdynamic: a device backend loaded at run time may take the engine's functions from the
# program (the host simulation does)
$(BUILD)/zrun: $(BUILD)/cli/zrun.o $(CLI_COMMON) $(BUILD)/libzr.a $(BUILD)/libzfmt.a \
               $(BUILD)/libzck.a
	$(CC) $(LDFLAGS) -rdynamic -o $@ $^ $(LIBS) $(BLAS_LIBS)

# zgen: sampling from a checkpoint (the generator of core/, the reader of ckpt/, the run's
# tokenizer through formats/)
$(BUILD)/zgen: $(BUILD)/cli/zgen.o $(CLI_COMMON) $(BUILD)/libzr.a $(BUILD)/libzfmt.a \
               $(BUILD)/libzck.a
	$(CC) $(LDFLAGS) -o $@ $^ $(LIBS) $(BLAS_LIBS)

# The host simulation of a device (ZR_CUDA_LIB=hostsim): a loadable backend for the tests, built
# next to zrun and zt, linked into neither; its undefined zr_* symbols resolve against the
# program that loads it.
$(BUILD)/libzr_hostsim.so: core/device/hostsim.c | deps
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(CORE_OPT) $(INC_device) -fPIC -fvisibility=hidden -shared $< -o $@
all test: $(BUILD)/libzr_hostsim.so

# The MPI backend of the communicator (core/dist/comm_mpi.c, docs/RUNNING.md): a shared object
# next to zrun, loaded (dlopen) only when the ranks come from mpirun or srun, so libzr and the
# programs never link libmpi. Open MPI's flags from pkg-config when the compile runs (after
# deps installed it).
MPI_CFLAGS = $$(pkg-config --cflags ompi-c)
MPI_LIBS   = $$(pkg-config --libs ompi-c)
$(BUILD)/libzr_mpi.so: core/dist/comm_mpi.c core/dist/comm_be.h | deps
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(CORE_OPT) $(INC_dist) $(MPI_CFLAGS) -fPIC -fvisibility=hidden -shared \
	  $< -o $@ $(MPI_LIBS)
all test: $(BUILD)/libzr_mpi.so

# The main job: train the tiny GPT-2 on the built-in corpus on 2 CPU ranks with ZeRO stage 3 and
# checkpoints (resumes when run again), then list and verify what was saved.
RUN_DIR ?= runs/default
RUN_STEPS ?= 200
run: $(BUILD)/zrun $(BUILD)/zckpt
	$(BUILD)/zrun --nproc 2 --zero 3 --threads 1 --ckpt-dir $(RUN_DIR) --steps $(RUN_STEPS) \
	  --save-every 50 --keep-last 3 --log-json $(RUN_DIR)/train.jsonl
	$(BUILD)/zckpt ls $(RUN_DIR)
	$(BUILD)/zckpt verify $(RUN_DIR)

# ------------------------------------------------------------------ CUDA backend (optional)
# build/libzr_cuda.so (core/device/cuda/*.cu), loaded at run time by core/device/device.c through dlopen:
# libzr, zrun and the tests never link CUDA and run anywhere. Built when nvcc is found (on the
# PATH, else /usr/local/cuda/bin/nvcc; `make NVCC=` builds without it): sm_90 code (H100/H200)
# and compute_90 PTX that newer GPUs compile at load. Always in build/ (nvcc objects take no
# sanitizers); a SAN=1 build copies it next to its own binaries. NCCL comes from the CUDA tree,
# /usr/include, /usr/local/include or $(NCCL_HOME); without nccl.h the communicator reports
# "built without NCCL".
LIBS += -ldl
NVCC ?= $(shell command -v nvcc 2>/dev/null || \
          { test -x /usr/local/cuda/bin/nvcc && echo /usr/local/cuda/bin/nvcc; })
NVCC := $(strip $(NVCC))
ifneq ($(NVCC),)
CUDA_HOME   ?= $(patsubst %/bin/,%,$(dir $(realpath $(NVCC))))
CUDA_LIBDIR := $(firstword $(wildcard $(CUDA_HOME)/lib64 $(CUDA_HOME)/lib) $(CUDA_HOME)/lib64)
NCCL_H      := $(firstword $(wildcard $(if $(NCCL_HOME),$(NCCL_HOME)/include/nccl.h) \
                 $(CUDA_HOME)/include/nccl.h /usr/include/nccl.h /usr/local/include/nccl.h))
NCCL_FLAGS  := $(if $(NCCL_H),$(patsubst %,-I%,$(filter-out /usr/include/ $(CUDA_HOME)/include/,\
                 $(dir $(NCCL_H)))),-DZR_NO_NCCL)
comma       := ,
NCCL_LIBS   := $(if $(NCCL_H),$(if $(NCCL_HOME),-L$(NCCL_HOME)/lib -Xlinker -rpath$(comma)$(NCCL_HOME)/lib) -lnccl)
NVCC_FLAGS  := -O3 -std=c++17 -gencode arch=compute_90,code=sm_90 \
               -gencode arch=compute_90,code=compute_90 -Xcompiler -fPIC,-fvisibility=hidden,-Wall \
               $(if $(filter 1,$(WERROR)),-Werror all-warnings -Xcompiler -Werror) \
               $(INC_cuda) $(NCCL_FLAGS)
CUDA_SRC := $(wildcard core/device/cuda/*.cu)
CUDA_OBJ := $(CUDA_SRC:%.cu=build/cuda-obj/%.o)

build/cuda-obj/%.o: %.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCC_FLAGS) -MMD -MP -c $< -o $@

build/libzr_cuda.so: $(CUDA_OBJ) core/device/cuda/exports.map
	$(NVCC) -shared -cudart shared -o $@ $(CUDA_OBJ) -L$(CUDA_LIBDIR) -lcublasLt -lcublas \
	  $(NCCL_LIBS) -lcudart -Xlinker -rpath,$(CUDA_LIBDIR) \
	  -Xlinker --version-script=core/device/cuda/exports.map

all test: $(BUILD)/libzr_cuda.so
ifneq ($(BUILD),build)
$(BUILD)/libzr_cuda.so: build/libzr_cuda.so
	@mkdir -p $(BUILD)
	cp $< $@
-include $(wildcard build/cuda-obj/core/device/cuda/*.d)
endif
endif

# the GPU test programs (tests/gpu/run.sh, bench.sh; test_device runs gpu_kernels when a GPU is
# present): plain C, reaching CUDA only through the loader, so they build everywhere
$(BUILD)/gpu_kernels: $(BUILD)/tests/gpu/kernels.o $(BUILD)/libzr.a $(BUILD)/libzck.a
	$(CC) $(LDFLAGS) -rdynamic -o $@ $^ $(LIBS) $(BLAS_LIBS)

$(BUILD)/gpu_bench: $(BUILD)/tests/gpu/bench.o $(BUILD)/libzr.a $(BUILD)/libzck.a
	$(CC) $(LDFLAGS) -rdynamic -o $@ $^ $(LIBS) $(BLAS_LIBS)

test: $(BUILD)/gpu_kernels $(BUILD)/gpu_bench
# test_device asserts that the backend was built when there is an nvcc ("": built without)
test: export ZT_NVCC := $(NVCC)

# ------------------------------------------------------------------ tests
TEST_SRC := $(wildcard tests/*.c) $(wildcard tests/fuzz/*.c)
TEST_OBJ := $(TEST_SRC:%.c=$(BUILD)/%.o)

$(BUILD)/zt: $(TEST_OBJ) $(BUILD)/cli/common.o $(BUILD)/libzr.a $(BUILD)/libzfmt.a $(BUILD)/libzck.a
	$(CC) $(LDFLAGS) -rdynamic -o $@ $^ $(LIBS) $(BLAS_LIBS)

# The oracles from outside (tests that compare with the reference Python libraries): a venv in
# build/venv with Hugging Face `tokenizers` (tests/tok/oracle.py), `transformers`, `safetensors`
# and numpy, and openai-whisper without its dependencies for the GPT-2 ranks it ships; then, as a
# second step with its own marker, torch (PyPI's wheel, used on the CPU) for the HF oracles of
# tests/formats/hf_torch.py, so that a failed torch install leaves the others working (those
# tests then skip). Each marker holds the pins it was made with: a step runs when its marker is
# missing or names other pins, so moving a pin updates an existing venv. A failed torch install
# of the same pin is remembered in .oracle-torch-failed (remove it to try again); pip's output
# is kept in .oracle-log and .oracle-torch-log. ZT_VENV=DIR (a ready venv with these packages)
# makes both steps do nothing and the tests use DIR instead.
ORACLE_VENV := build/venv
# Pinned to the versions the oracle tests were checked against (a new release can change a
# reference's numbers or its file layout; move the pins deliberately, with `make test`).
ORACLE_PKGS := tokenizers==0.23.3 transformers==5.25.0 safetensors==0.8.0 numpy==2.4.6
ORACLE_WHISPER := openai-whisper==20250625
ORACLE_TORCH := torch==2.15.0
# DeepSpeed for the foreign-checkpoint oracles (tests/formats/foreign_ckpt.py): its CPU path,
# no ops built (DS_BUILD_OPS=0), a third step with its own marker after torch's
ORACLE_DEEPSPEED := deepspeed==0.19.8
ORACLE_TORCH_TIMEOUT ?= 1200
oracle-venv:
	@if [ -n "$$ZT_VENV" ]; then echo "oracle-venv: the tests use ZT_VENV=$$ZT_VENV"; exit 0; fi; \
	v=$(ORACLE_VENV); \
	if ! grep -qxF '$(ORACLE_PKGS) $(ORACLE_WHISPER)' $$v/.oracle-ready 2>/dev/null; then \
	  rm -f $$v/.oracle-ready; \
	  { test -x $$v/bin/python || python3 -m venv $$v; } >/dev/null 2>&1 && \
	  timeout 600 $$v/bin/pip install -q $(ORACLE_PKGS) > $$v/.oracle-log 2>&1 && \
	  { timeout 300 $$v/bin/pip install -q --no-deps $(ORACLE_WHISPER) >> $$v/.oracle-log 2>&1 || \
	    true; } && echo '$(ORACLE_PKGS) $(ORACLE_WHISPER)' > $$v/.oracle-ready || \
	  echo "oracle-venv: no venv with $(ORACLE_PKGS) (PyPI not reachable, or a pin that does" \
	       "not install on this Python? see $$v/.oracle-log): oracle tests will skip"; \
	fi; \
	if [ -f $$v/.oracle-ready ] && ! grep -qxF '$(ORACLE_TORCH)' $$v/.oracle-torch 2>/dev/null && \
	   ! grep -qxF '$(ORACLE_TORCH)' $$v/.oracle-torch-failed 2>/dev/null; then \
	  rm -f $$v/.oracle-torch $$v/.oracle-torch-failed; \
	  echo "oracle-venv: installing $(ORACLE_TORCH) into $$v (about 5 GB, a few minutes)"; \
	  timeout $(ORACLE_TORCH_TIMEOUT) $$v/bin/pip install -q $(ORACLE_TORCH) \
	    > $$v/.oracle-torch-log 2>&1 && \
	  $$v/bin/python -c 'import torch; torch.zeros(1)' >> $$v/.oracle-torch-log 2>&1 && \
	  echo '$(ORACLE_TORCH)' > $$v/.oracle-torch || { echo '$(ORACLE_TORCH)' > $$v/.oracle-torch-failed; \
	  echo "oracle-venv: torch did not install (see $$v/.oracle-torch-log): the torch oracles will skip"; }; \
	fi; \
	if [ -f $$v/.oracle-torch ] && ! grep -qxF '$(ORACLE_DEEPSPEED)' $$v/.oracle-deepspeed 2>/dev/null && \
	   ! grep -qxF '$(ORACLE_DEEPSPEED)' $$v/.oracle-deepspeed-failed 2>/dev/null; then \
	  rm -f $$v/.oracle-deepspeed $$v/.oracle-deepspeed-failed; \
	  echo "oracle-venv: installing $(ORACLE_DEEPSPEED) into $$v (CPU only, no ops built)"; \
	  DS_BUILD_OPS=0 timeout 900 $$v/bin/pip install -q $(ORACLE_DEEPSPEED) \
	    > $$v/.oracle-deepspeed-log 2>&1 && \
	  DS_ACCELERATOR=cpu $$v/bin/python -c 'import deepspeed' >> $$v/.oracle-deepspeed-log 2>&1 && \
	  echo '$(ORACLE_DEEPSPEED)' > $$v/.oracle-deepspeed || { echo '$(ORACLE_DEEPSPEED)' > \
	  $$v/.oracle-deepspeed-failed; echo "oracle-venv: deepspeed did not install (see" \
	  "$$v/.oracle-deepspeed-log): the DeepSpeed oracles will skip"; }; \
	fi

# the CLI tests run the real zckpt, zrun, zgen and ztok binaries (ZT_ZCKPT, ZT_ZRUN, ZT_ZGEN,
# ZT_ZTOK)
test: $(BUILD)/zt $(BUILD)/zckpt $(BUILD)/zrun $(BUILD)/zgen $(BUILD)/ztok oracle-venv test-deps
	ZT_ROOT=$(CURDIR) ZT_ZCKPT=$(CURDIR)/$(BUILD)/zckpt ZT_ZRUN=$(CURDIR)/$(BUILD)/zrun \
	  ZT_ZGEN=$(CURDIR)/$(BUILD)/zgen ZT_ZTOK=$(CURDIR)/$(BUILD)/ztok $(BUILD)/zt

asan:
	$(MAKE) SAN=1 test

# long campaigns: the suite with ZT_STRESS=1 (400 SIGKILL rounds during saves, 30 restarts,
# 20 ranks killed mid-step), then libFuzzer for 10 minutes when clang can build it
STRESS_FUZZ_SECONDS ?= 600
stress: $(BUILD)/zt $(BUILD)/zckpt $(BUILD)/zrun $(BUILD)/zgen $(BUILD)/ztok oracle-venv
	ZT_STRESS=1 ZT_ROOT=$(CURDIR) ZT_ZCKPT=$(CURDIR)/$(BUILD)/zckpt \
	  ZT_ZRUN=$(CURDIR)/$(BUILD)/zrun ZT_ZGEN=$(CURDIR)/$(BUILD)/zgen \
	  ZT_ZTOK=$(CURDIR)/$(BUILD)/ztok $(BUILD)/zt
	@if command -v clang >/dev/null 2>&1; then $(MAKE) fuzz FUZZ_SECONDS=$(STRESS_FUZZ_SECONDS); \
	else echo "skip: make fuzz needs clang with libFuzzer"; fi

# ------------------------------------------------------------------ ThreadSanitizer
# The tests whose threads share memory, built with TSan in build-tsan/ (-O1 -g): the model's
# thread pool (sumsq, AdamW, threads 2; every forward and backward kernel at 1-3 threads on
# random shapes and against the double references), the ZeRO engine's comm thread at stages 2 and 3 over
# the shm communicator, the asynchronous saver, ckpt's hashing and reshard pools, the
# verification thread of an export, the TCP communicator. OpenBLAS's own threads stay off
# (TSan does not see their synchronization). tests/tsan.supp holds what TSan cannot judge.
TSAN_TESTS ?= engine_sumsq_and_adamw_threads model_threads_agree_on_random_shapes model_grad_check \
  llama_grad_check train_resume_is_bit_exact_with_two_threads \
  zero_stages_agree_across_worlds restart_sigkill_during_async_saves_keeps_latest_sound \
  roundtrip_many_worlds reshard_roundtrip_is_byte_identical corrupt_several_problems_all_reported \
  formats_safetensors_export comm_every_op_every_world_exact_bits comm_tcp_every_op_exact_bits \
  dev_engine_stages_match_cpu recompute_model_gradients_bit_equal_at_1_to_3_threads \
  formats_import_parallel_ranks_same_bytes verify_each_hands_every_element_once
tsan:
	$(MAKE) TSAN=1 tsan-run
tsan-run: $(BUILD)/zt $(BUILD)/zckpt $(BUILD)/zrun $(BUILD)/libzr_hostsim.so
	OPENBLAS_NUM_THREADS=1 \
	TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$(CURDIR)/tests/tsan.supp" \
	ZT_ROOT=$(CURDIR) ZT_ZCKPT=$(CURDIR)/$(BUILD)/zckpt ZT_ZRUN=$(CURDIR)/$(BUILD)/zrun \
	  $(BUILD)/zt $(TSAN_TESTS)

# ------------------------------------------------------------------ fuzzing
# One libFuzzer binary per tests/fuzz/fuzz_<target>.c (clang, -fsanitize=fuzzer,address), each
# run on a copy of its seed corpus tests/fuzz/corpus/<target>/ for FUZZ_SECONDS split between
# the targets (at least 1 s each). A crash leaves its input in build/fuzz/<target>-crash-*.
# make test replays the same corpora through the same entry points (tests/test_fuzz.c). One
# input that runs longer than FUZZ_INPUT_TIMEOUT seconds is a finding too (libFuzzer's
# "timeout", its input kept like a crash's): a parser that slow on at most 128 KiB hangs a tool.
FUZZ_SECONDS ?= 60
FUZZ_INPUT_TIMEOUT ?= 60
FUZZ_CC      ?= clang
FUZZ_DIR     := build/fuzz
FUZZ_TARGETS := $(patsubst tests/fuzz/fuzz_%.c,%,$(wildcard tests/fuzz/fuzz_*.c))
FUZZ_CFLAGS  := -g -O1 -std=c11 -D_GNU_SOURCE -pthread -fno-omit-frame-pointer -MMD -MP \
                -fsanitize=fuzzer-no-link,address -DZFUZZ_LIBFUZZER
# what the targets reach: ckpt/, formats/, the model's config and data, the training section
FUZZ_LIB_SRC := $(CKPT_SRC) $(FMT_SRC) $(wildcard core/model/*.c) core/train/section.c
FUZZ_LIB_OBJ := $(FUZZ_LIB_SRC:%.c=$(FUZZ_DIR)/obj/%.o)

$(FUZZ_DIR)/obj/%.o: %.c | deps
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) $(BLAS_CFLAGS) $(INC_tests) -c $< -o $@

.PRECIOUS: $(FUZZ_DIR)/obj/%.o
$(FUZZ_DIR)/libdeps.a: $(FUZZ_LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(FUZZ_DIR)/fuzz_%: $(FUZZ_DIR)/obj/tests/fuzz/fuzz_%.o $(FUZZ_DIR)/obj/tests/fuzz/fuzzutil.o \
                    $(FUZZ_DIR)/libdeps.a
	$(FUZZ_CC) -fsanitize=fuzzer,address -o $@ $^ $(LIBS) $(BLAS_LIBS)

fuzz: $(FUZZ_TARGETS:%=$(FUZZ_DIR)/fuzz_%)
	@n=$(words $(FUZZ_TARGETS)); s=$$(( $(FUZZ_SECONDS) / n )); [ $$s -ge 1 ] || s=1; \
	for t in $(FUZZ_TARGETS); do \
	  rm -rf $(FUZZ_DIR)/corpus/$$t && mkdir -p $(FUZZ_DIR)/corpus/$$t && \
	  cp tests/fuzz/corpus/$$t/* $(FUZZ_DIR)/corpus/$$t/ || exit 1; \
	  if ! $(FUZZ_DIR)/fuzz_$$t -max_total_time=$$s -timeout=$(FUZZ_INPUT_TIMEOUT) -max_len=131072 -print_final_stats=1 \
	       -artifact_prefix=$(FUZZ_DIR)/$$t- $(FUZZ_DIR)/corpus/$$t >$(FUZZ_DIR)/$$t.log 2>&1; then \
	    tail -n 40 $(FUZZ_DIR)/$$t.log; echo "[fuzz] $$t: FAILED"; exit 1; \
	  fi; \
	  echo "[fuzz] $$t: $$s s, $$(grep -o 'stat::number_of_executed_units: *[0-9]*' \
	    $(FUZZ_DIR)/$$t.log | grep -o '[0-9]*$$' || echo '?') runs, no crash"; \
	done

# ------------------------------------------------------------------ benchmarks
$(BUILD)/bench_ckpt: $(BUILD)/tests/bench/bench_ckpt.o $(BUILD)/libzck.a
	$(CC) $(LDFLAGS) -o $@ $^ $(LIBS)

$(BUILD)/mkckpt: $(BUILD)/tests/bench/mkckpt.o $(BUILD)/libzck.a
	$(CC) $(LDFLAGS) -o $@ $^ $(LIBS)

# the swapper's bandwidth (zck_swap); offload_bench.sh runs it
$(BUILD)/swap_bench: $(BUILD)/tests/bench/swap_bench.o $(BUILD)/libzck.a
	$(CC) $(LDFLAGS) -o $@ $^ $(LIBS)
bench: $(BUILD)/swap_bench

# the benchmarks' tools (fio; openssl and GNU time, also used by the scripts), installed when
# missing as `deps` installs the build's
BENCH_DEPS_CHECK = \
  command -v fio >/dev/null 2>&1 || missing="$$missing fio"; \
  command -v openssl >/dev/null 2>&1 || missing="$$missing openssl"; \
  [ -x /usr/bin/time ] || missing="$$missing time";
bench-deps:
	@missing=""; $(BENCH_DEPS_CHECK) \
	if [ -n "$$missing" ]; then \
	  if command -v apt-get >/dev/null 2>&1; then \
	    sudo=""; [ "$$(id -u)" = 0 ] || sudo=sudo; \
	    echo "[bench-deps] installing:$$missing"; \
	    $$sudo apt-get update -q >/dev/null && \
	    DEBIAN_FRONTEND=noninteractive $$sudo apt-get install -y -q $$missing >/dev/null || \
	      { echo "[bench-deps] error: apt-get install$$missing failed" >&2; exit 1; }; \
	  else \
	    echo "[bench-deps] error: missing benchmark tools; install the packages:$$missing" >&2; \
	    exit 1; \
	  fi; \
	fi

# the shm communicator at world 2 against memcpy (256 MiB); zero_bench.sh runs it
$(BUILD)/comm_bench: $(BUILD)/tests/bench/comm_bench.o $(BUILD)/libzr.a $(BUILD)/libzck.a
	$(CC) $(LDFLAGS) -o $@ $^ $(LIBS)
bench: $(BUILD)/comm_bench

# every communicator backend at W ranks (shm, the TCP star, MPI); mpi_bench.sh runs it
$(BUILD)/comm_world_bench: $(BUILD)/tests/bench/comm_world_bench.o $(BUILD)/libzr.a $(BUILD)/libzck.a
	$(CC) $(LDFLAGS) -o $@ $^ $(LIBS)
bench: $(BUILD)/comm_world_bench $(BUILD)/libzr_mpi.so

bench: bench-deps $(BUILD)/bench_ckpt $(BUILD)/mkckpt $(BUILD)/zckpt $(BUILD)/zrun
	BENCH_BIN=$(BUILD)/bench_ckpt tests/bench/run.sh
	ZCKPT=$(BUILD)/zckpt MKCKPT=$(BUILD)/mkckpt tests/bench/zckpt_bench.sh
	tests/bench/train_bench.sh
	tests/bench/zero_bench.sh
	tests/bench/offload_bench.sh
	tests/bench/save_bench.sh
	ZCKPT=$(BUILD)/zckpt ZRUN=$(BUILD)/zrun tests/bench/ckpt_io.sh
	ZRUN=$(BUILD)/zrun tests/bench/tcp_bench.sh
	BENCH=$(BUILD)/comm_world_bench ZRUN=$(BUILD)/zrun tests/bench/mpi_bench.sh

clean:
	rm -rf build build-san build-tsan

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
