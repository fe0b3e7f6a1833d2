# Makefile - qsa_runtime.  Needs make, a C compiler and a POSIX shell; nothing from CUDA.
#
#   make                  kernels.cu.inc, tests/test_qsa, tools, examples/chat, models/tiny
#   make test             build and run the test binary (GPU groups skip themselves without a GPU)
#   make bench            build tools/bench and print how to run it (docs/PERFORMANCE.md; needs a GPU)
#   make tools/libkernel_trace.so   the kernel timeline tracer (CUPTI; CUDA_HOME, default /usr/local/cuda)
#   make tools/copy_patterns        the expert copies' microbenchmark (nvcc, sm_90; docs/PERFORMANCE.md)
#   make tools/decode_chain         batch 1's projection chain as launches and as one persistent kernel (nvcc, sm_90)
#   make test-asan        the cpu group under AddressSanitizer + UBSan
#   make compile-check    the header as C99/C11 (gcc, clang) and C++17 (g++, clang++), -pedantic;
#                         QSA_STATIC in two TUs; QSA_NO_CUDA; with poisoned CUDA headers
#   make check-kernels    fail when the committed kernels.cu.inc is not kernels.cu's embedding
#   make nvrtc-check      compile the kernels with an NVRTC (QSA_NVRTC_LIB=/path/libnvrtc.so.X);
#                         NVRTC_ARCH=compute_70 insists on a target (default: the runtime's choice)
#   make fuzz             libFuzzer harnesses in tests/fuzz/, FUZZ_SECONDS (default 30) each
#   make clean
#
# Variables: CC, CXX, CLANG, CLANGXX, CFLAGS (default -O2 -g), LDFLAGS, CUDA_HOME.

CC ?= cc
CXX ?= c++
CLANG ?= clang
CLANGXX ?= clang++
CFLAGS ?= -O2 -g
WARN := -Wall -Wextra -Werror
STD := -std=c11
LDLIBS := -lm -ldl -lpthread
FUZZ_SECONDS ?= 30
NVRTC_ARCH ?=

# Everything that includes the header depends on all of it.
HDRS := qsa_runtime.h kernels.cu.inc
TEST_SRCS := $(wildcard tests/*.c tests/*.h)
TOOLS := $(patsubst %.c,%,$(wildcard tools/tokenize.c tools/logits.c tools/replay.c tools/make_tiny_model.c tools/bench.c tools/long_context.c))
EXAMPLES := $(patsubst %.c,%,$(wildcard examples/chat.c examples/batch.c examples/tp_launch.c))
TINY := $(if $(wildcard tools/make_tiny_model.c),models/tiny/config.json)
FUZZERS := $(patsubst tests/fuzz/%.c,%,$(wildcard tests/fuzz/fuzz_json.c tests/fuzz/fuzz_safetensors.c tests/fuzz/fuzz_tokenizer.c tests/fuzz/fuzz_model.c tests/fuzz/fuzz_sched.c tests/fuzz/fuzz_replay.c))

.PHONY: all test test-asan compile-check check-kernels nvrtc-check fuzz analyze clean bench
.DELETE_ON_ERROR:

all: kernels.cu.inc tests/test_qsa $(TOOLS) $(EXAMPLES) $(TINY)

# ---- kernels: kernels.cu -> kernels.cu.inc (committed; CI checks it is fresh) ----
kernels.cu.inc: kernels.cu tools/embed_kernels.sh
	sh tools/embed_kernels.sh kernels.cu > $@.tmp
	mv $@.tmp $@

check-kernels:
	@mkdir -p build
	sh tools/embed_kernels.sh kernels.cu > build/kernels.cu.inc.fresh
	@if cmp -s build/kernels.cu.inc.fresh kernels.cu.inc; then \
	  echo "check-kernels: kernels.cu.inc matches kernels.cu"; \
	else \
	  echo "check-kernels: kernels.cu.inc is stale: run make and commit it" >&2; \
	  diff build/kernels.cu.inc.fresh kernels.cu.inc | head -20 >&2; exit 1; \
	fi

# ---- the test binary ----
tests/test_qsa: $(TEST_SRCS) $(HDRS)
	$(CC) $(STD) $(WARN) $(CFLAGS) $(LDFLAGS) -o $@ tests/test_qsa.c $(LDLIBS)

test: tests/test_qsa $(TINY) $(EXAMPLES) $(TOOLS)
	./tests/test_qsa

ASAN_FLAGS := -O1 -g -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
tests/test_qsa_asan: $(TEST_SRCS) $(HDRS)
	$(CC) $(STD) $(WARN) $(ASAN_FLAGS) $(LDFLAGS) -o $@ tests/test_qsa.c $(LDLIBS)

test-asan: tests/test_qsa_asan $(TINY) $(EXAMPLES) $(TOOLS)
	ASAN_OPTIONS=abort_on_error=0:detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 ./tests/test_qsa_asan --group cpu

# ---- tools, examples, the built-in tiny model ----
$(TOOLS): tools/%: tools/%.c examples/cli.h $(HDRS)
	$(CC) $(STD) $(WARN) $(CFLAGS) $(LDFLAGS) -o $@ $< $(LDLIBS)

$(EXAMPLES): examples/%: examples/%.c examples/cli.h $(HDRS)
	$(CC) $(STD) $(WARN) $(CFLAGS) $(LDFLAGS) -o $@ $< $(LDLIBS)

# the CUPTI injection library of tools/kernel_trace.c (not part of `all`: it needs the toolkit's CUPTI)
CUDA_HOME ?= /usr/local/cuda
tools/libkernel_trace.so: tools/kernel_trace.c
	$(CC) $(STD) $(WARN) $(CFLAGS) -shared -fPIC -o $@ $< -I$(CUDA_HOME)/include -L$(CUDA_HOME)/lib64 -L$(CUDA_HOME)/lib -lcupti

# the expert copies' microbenchmark (not part of `all`: it needs nvcc and an sm_90 device to run)
tools/copy_patterns: tools/copy_patterns.cu
	$(CUDA_HOME)/bin/nvcc -O3 -std=c++17 -arch=sm_90 -o $@ $< -lcuda

# batch 1's chain of dependent projections, launches against one persistent kernel (not part of `all`: nvcc, sm_90)
tools/decode_chain: tools/decode_chain.cu
	$(CUDA_HOME)/bin/nvcc -O3 -std=c++17 -arch=sm_90 -o $@ $<

bench: tools/bench
	@echo "tools/bench built.  On a GPU machine (one call, < 10 minutes on an H200; docs/PERFORMANCE.md):"
	@echo "  tools/bench --quick                        # smoke run on a small model with the same layer pattern"
	@echo "  tools/bench --out build/bench.json         # the real Qwen3.8-Flash-Next shape, synthetic weights"
	@echo "  tools/bench --help                         # options (--batches, --no-long, --graphs, --config FILE, ...)"

models/tiny/config.json: tools/make_tiny_model
	mkdir -p models/tiny
	tools/make_tiny_model models/tiny

# ---- compile checks (no CUDA anywhere: poisoned headers prove nothing includes them) ----
CHECK_WARN := -Wall -Wextra -Werror -pedantic
STATIC_WARN ?= $(if $(shell grep -q 'define QSA_IMPL static QSA__UNUSED' qsa_runtime.h && echo y),,-Wno-unused-function)
CCD := build/compile-check
CC_SRC := tests/compile_check
compile-check: kernels.cu.inc
	@mkdir -p $(CCD)
	@echo "== C99 / C11 with gcc and clang, C++17 with g++ and clang++ (-pedantic -Werror)"
	$(CC) -std=c99 $(CHECK_WARN) -c $(CC_SRC)/impl.c -o $(CCD)/impl-gcc-c99.o
	$(CC) -std=c11 $(CHECK_WARN) -c $(CC_SRC)/impl.c -o $(CCD)/impl-gcc-c11.o
	$(CLANG) -std=c99 $(CHECK_WARN) -c $(CC_SRC)/impl.c -o $(CCD)/impl-clang-c99.o
	$(CLANG) -std=c11 $(CHECK_WARN) -c $(CC_SRC)/impl.c -o $(CCD)/impl-clang-c11.o
	$(CXX) -std=c++17 $(CHECK_WARN) -x c++ -c $(CC_SRC)/impl.c -o $(CCD)/impl-gxx.o
	$(CLANGXX) -std=c++17 $(CHECK_WARN) -x c++ -c $(CC_SRC)/impl.c -o $(CCD)/impl-clangxx.o
	$(CC) -std=c11 $(CHECK_WARN) -DQSA_DEBUG -c $(CC_SRC)/impl.c -o $(CCD)/impl-debug.o
	@echo "== a user TU (declarations only) linked with each implementation, and run"
	$(CC) -std=c99 $(CHECK_WARN) -c $(CC_SRC)/user.c -o $(CCD)/user-c.o
	$(CXX) -std=c++17 $(CHECK_WARN) -x c++ -c $(CC_SRC)/user.c -o $(CCD)/user-cxx.o
	$(CC) -o $(CCD)/prog-gcc $(CCD)/user-c.o $(CCD)/impl-gcc-c99.o $(LDLIBS)
	$(CLANG) -o $(CCD)/prog-clang $(CCD)/user-c.o $(CCD)/impl-clang-c11.o $(LDLIBS)
	$(CXX) -o $(CCD)/prog-gxx $(CCD)/user-cxx.o $(CCD)/impl-gxx.o $(LDLIBS)
	$(CCD)/prog-gcc && $(CCD)/prog-clang && $(CCD)/prog-gxx
	@echo "== QSA_STATIC: two private copies in one program"
	@# STATIC_WARN: -Wno-unused-function until QSA_IMPL carries QSA__UNUSED under QSA_STATIC
	$(CC) -std=c11 $(CHECK_WARN) $(STATIC_WARN) -o $(CCD)/static-gcc $(CC_SRC)/static_a.c $(CC_SRC)/static_b.c $(LDLIBS)
	$(CXX) -std=c++17 $(CHECK_WARN) $(STATIC_WARN) -x c++ -o $(CCD)/static-gxx $(CC_SRC)/static_a.c $(CC_SRC)/static_b.c $(LDLIBS)
	$(CCD)/static-gcc && $(CCD)/static-gxx
	@echo "== QSA_NO_CUDA"
	$(CC) -std=c99 $(CHECK_WARN) -DQSA_NO_CUDA -c $(CC_SRC)/impl.c -o $(CCD)/impl-nocuda.o
	$(CXX) -std=c++17 $(CHECK_WARN) -DQSA_NO_CUDA -x c++ -c $(CC_SRC)/impl.c -o $(CCD)/impl-nocuda-cxx.o
	$(CC) -o $(CCD)/prog-nocuda $(CCD)/user-c.o $(CCD)/impl-nocuda.o $(LDLIBS)
	$(CCD)/prog-nocuda
	@$(CC) -E $(CC_SRC)/impl.c | grep -q 'cuInit' || { echo "control: cuInit not found in the normal build" >&2; exit 1; }
	@if $(CC) -E -DQSA_NO_CUDA $(CC_SRC)/impl.c | grep -q 'cuInit\|nvrtcCompileProgram\|ncclAllReduce'; then \
	  echo "QSA_NO_CUDA build still contains the CUDA section" >&2; exit 1; fi
	@echo "== poisoned cuda.h / nvrtc.h / nccl.h first on the include path"
	@if $(CC) -I$(CC_SRC)/poison -fsyntax-only $(CC_SRC)/poison_control.c 2>/dev/null; then \
	  echo "the poisoned headers do not fire" >&2; exit 1; fi
	$(CC) -std=c11 $(CHECK_WARN) -I$(CC_SRC)/poison -c $(CC_SRC)/impl.c -o $(CCD)/impl-poison.o
	$(CXX) -std=c++17 $(CHECK_WARN) -I$(CC_SRC)/poison -x c++ -c $(CC_SRC)/impl.c -o $(CCD)/impl-poison-cxx.o
	@echo "compile-check: ok"

# ---- NVRTC compile check of every kernel (no GPU needed) ----
build/nvrtc_check: $(CC_SRC)/nvrtc_check.c tests/kernel_entries.h $(HDRS)
	@mkdir -p build
	$(CC) $(STD) $(WARN) $(CFLAGS) -o $@ $< $(LDLIBS)

nvrtc-check: build/nvrtc_check
	./build/nvrtc_check $(NVRTC_ARCH)

# ---- clang's static analyzer over the implementation, the header's functions included (its path notes:
# ANALYZE_FLAGS='-Xclang -analyzer-output=text'); docs/DESIGN.md names the findings known to be false ----
ANALYZE_FLAGS ?=
analyze: kernels.cu.inc
	@mkdir -p build
	$(CLANG) $(STD) --analyze -Xclang -analyzer-opt-analyze-headers $(ANALYZE_FLAGS) -o build/analyze.plist $(CC_SRC)/impl.c

# ---- fuzzing (clang + libFuzzer); a harness whose .c is missing is skipped ----
FUZZ_FLAGS := -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined
fuzz: $(TINY)
	@mkdir -p build/fuzz
	@if [ -z "$(FUZZERS)" ]; then echo "fuzz: no harness in tests/fuzz/ (fuzz_json.c, fuzz_safetensors.c, fuzz_tokenizer.c, fuzz_model.c, fuzz_sched.c, fuzz_replay.c)"; fi
	@set -e; for f in $(FUZZERS); do \
	  echo "== $$f ($(FUZZ_SECONDS) s)"; \
	  $(CLANG) $(STD) $(WARN) $(FUZZ_FLAGS) -o build/fuzz/$$f tests/fuzz/$$f.c $(LDLIBS); \
	  mkdir -p build/fuzz/corpus_$$f; \
	  seeds=""; for d in tests/fuzz/corpus_$$f tests/fuzz/corpus/$$f; do [ -d $$d ] && seeds="$$seeds $$d"; done; \
	  dict=""; [ -f tests/fuzz/$$f.dict ] && dict="-dict=tests/fuzz/$$f.dict"; \
	  ./build/fuzz/$$f -max_total_time=$(FUZZ_SECONDS) -print_final_stats=1 $$dict build/fuzz/corpus_$$f $$seeds; \
	done

clean:
	rm -rf build models/tiny tests/test_qsa tests/test_qsa_asan $(TOOLS) $(EXAMPLES) kernels.cu.inc.tmp tools/libkernel_trace.so tools/copy_patterns tools/decode_chain

# ---- an NVRTC 11.8 archive small enough to carry to a GPU machine (tools/gpu_tests.sh) ----
.PHONY: nvrtc118-archive
nvrtc118-archive: build/nvrtc-sm70.tar.xz
build/nvrtc-sm70.tar.xz:
	[ -f .nvrtc-sm70/libnvrtc.so.11.2 ] || bash ../shared/tools/get-nvrtc-sm70.sh .nvrtc-sm70
	mkdir -p build
	tar -cJf $@ .nvrtc-sm70
