# zero: one GNU Makefile. Objects go to build/ (build-san/ with SAN=1).
#   make            libraries and binaries          make test     every test, ends "N passed, N failed"
#   make run        the demo job (see README)       make bench    benchmarks (not part of make test)
#   make asan       tests under ASan + UBSan        make fuzz     libFuzzer on the manifest parser
#   make deps       install missing system packages (apt-get on Debian)
# Options: SAN=1 (sanitizers), WERROR=1 (-Werror, as CI), FUZZ_SECONDS=N.

CC      ?= cc
SAN     ?= 0
WERROR  ?= 0
BUILD   := $(if $(filter 1,$(SAN)),build-san,build)
CFLAGS  ?= -O2 -g
CFLAGS  += -std=c11 -D_GNU_SOURCE -Wall -Wextra -Wshadow -pthread -MMD -MP
ifeq ($(WERROR),1)
  CFLAGS += -Werror
endif
ifeq ($(SAN),1)
  CFLAGS  += -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined -O1
  LDFLAGS += -fsanitize=address,undefined
endif
# Link flags are read from pkg-config when the link runs (after `deps` installed what was missing).
LIBS = $$(pkg-config --libs jansson libcrypto libarchive 2>/dev/null || \
          echo -ljansson -lcrypto -larchive) -laio -lpthread -lm

# ------------------------------------------------------------------ dependencies
# Debian package that provides each dependency; `deps` installs the missing ones.
DEPS_CHECK = \
  command -v pkg-config >/dev/null 2>&1 || missing="$$missing pkg-config"; \
  pkg-config --exists jansson 2>/dev/null || missing="$$missing libjansson-dev"; \
  pkg-config --exists libcrypto 2>/dev/null || missing="$$missing libssl-dev"; \
  pkg-config --exists libarchive 2>/dev/null || missing="$$missing libarchive-dev"; \
  printf '\#include <libaio.h>\nint main(void){io_context_t c=0;return io_setup(1,&c);}\n' | \
    $(CC) -x c - -laio -o /dev/null >/dev/null 2>&1 || missing="$$missing libaio-dev";

.PHONY: all deps test asan stress bench run fuzz clean
all: $(BUILD)/libzck.a $(BUILD)/libzfmt.a $(BUILD)/zckpt $(BUILD)/zck-demo

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
	         "(Debian names; on Fedora: jansson-devel openssl-devel libaio-devel)" >&2; exit 1; \
	  fi; \
	fi

# ------------------------------------------------------------------ libraries
# Each folder may include its own headers and those below it: ckpt <- formats <- cli.
CKPT_SRC := $(wildcard ckpt/*.c)
CKPT_OBJ := $(CKPT_SRC:%.c=$(BUILD)/%.o)
FMT_SRC  := $(wildcard formats/*.c)
FMT_OBJ  := $(FMT_SRC:%.c=$(BUILD)/%.o)
CLI_COMMON := $(BUILD)/cli/common.o

$(BUILD)/ckpt/%.o: ckpt/%.c | deps
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Ickpt -c $< -o $@

$(BUILD)/formats/%.o: formats/%.c | deps
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Iformats -Ickpt -c $< -o $@

$(BUILD)/%.o: %.c | deps
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Iformats -Ickpt -Icli -c $< -o $@

$(BUILD)/libzck.a: $(CKPT_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/libzfmt.a: $(FMT_OBJ)
	@rm -f $@
	ar rcs $@ $^

# ------------------------------------------------------------------ programs
$(BUILD)/zckpt: $(BUILD)/cli/zckpt.o $(CLI_COMMON) $(BUILD)/libzfmt.a $(BUILD)/libzck.a
	$(CC) $(LDFLAGS) -o $@ $^ $(LIBS)

$(BUILD)/zck-demo: $(BUILD)/cli/ckpt_demo.o $(BUILD)/libzfmt.a $(BUILD)/libzck.a
	$(CC) $(LDFLAGS) -o $@ $^ $(LIBS)

RUN_DIR ?= runs/demo
run: $(BUILD)/zck-demo $(BUILD)/zckpt
	$(BUILD)/zck-demo --run-dir $(RUN_DIR)
	$(BUILD)/zckpt ls $(RUN_DIR)

# ------------------------------------------------------------------ tests
TEST_SRC := $(wildcard tests/*.c) tests/fuzz/fuzz_manifest.c
TEST_OBJ := $(TEST_SRC:%.c=$(BUILD)/%.o)

$(BUILD)/zt: $(TEST_OBJ) $(BUILD)/libzfmt.a $(BUILD)/libzck.a
	$(CC) $(LDFLAGS) -o $@ $^ $(LIBS)

# the CLI tests run the real zckpt binary (ZT_ZCKPT)
test: $(BUILD)/zt $(BUILD)/zckpt
	ZT_ROOT=$(CURDIR) ZT_ZCKPT=$(CURDIR)/$(BUILD)/zckpt $(BUILD)/zt

asan:
	$(MAKE) SAN=1 test

# long campaigns: 400 SIGKILL rounds, and libFuzzer when clang can build it
stress: $(BUILD)/zt $(BUILD)/zckpt
	ZT_STRESS=1 ZT_ROOT=$(CURDIR) ZT_ZCKPT=$(CURDIR)/$(BUILD)/zckpt $(BUILD)/zt

# ------------------------------------------------------------------ fuzzing and benchmarks
FUZZ_SECONDS ?= 60
fuzz: | deps
	@mkdir -p build/fuzz
	clang -g -O1 -fsanitize=fuzzer,address -D_GNU_SOURCE -Ickpt tests/fuzz/fuzz_manifest.c \
	  $(CKPT_SRC) -o build/fuzz/fuzz_manifest $(LIBS)
	@mkdir -p build/fuzz/corpus && cp tests/fuzz/corpus/manifest/* build/fuzz/corpus/
	build/fuzz/fuzz_manifest -max_total_time=$(FUZZ_SECONDS) -max_len=65536 build/fuzz/corpus

$(BUILD)/bench_ckpt: $(BUILD)/tests/bench/bench_ckpt.o $(BUILD)/libzck.a
	$(CC) $(LDFLAGS) -o $@ $^ $(LIBS)

$(BUILD)/mkckpt: $(BUILD)/tests/bench/mkckpt.o $(BUILD)/libzck.a
	$(CC) $(LDFLAGS) -o $@ $^ $(LIBS)

bench: $(BUILD)/bench_ckpt $(BUILD)/mkckpt $(BUILD)/zckpt
	BENCH_BIN=$(BUILD)/bench_ckpt tests/bench/run.sh
	ZCKPT=$(BUILD)/zckpt MKCKPT=$(BUILD)/mkckpt tests/bench/zckpt_bench.sh

clean:
	rm -rf build build-san

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
