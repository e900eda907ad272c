# The two commands a newcomer runs; everything else lives in CMake.
#   make run   - install what is missing, build, and run shardlm on the default model
#   make test  - install what is missing, build (plain and sanitizer builds), run every test
BUILD    ?= build
ASAN     ?= build-asan
JOBS     ?= $(shell nproc)
ASSETS   ?= $(if $(SHARDLM_ASSETS),$(SHARDLM_ASSETS),$(CURDIR)/../shared/assets)

.PHONY: all deps build build-asan test test-fast run bench clean

all: build

deps:
	bash tools/install_deps.sh

build: deps
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo
	cmake --build $(BUILD) -j $(JOBS)

build-asan: deps
	cmake -S . -B $(ASAN) -DCMAKE_BUILD_TYPE=Debug -DSHARDLM_SANITIZE=ON -DSHARDLM_CUDA=OFF
	cmake --build $(ASAN) -j $(JOBS)

# The whole suite: every test of the main build, then the unit tests under ASan + UBSan.
test: build build-asan
	cd $(BUILD) && SHARDLM_ASSETS=$(ASSETS) ctest --output-on-failure -j $(JOBS)
	cd $(ASAN) && SHARDLM_ASSETS=$(ASSETS) ctest --output-on-failure -L unit -j $(JOBS)

run: build
	bash tools/run_default.sh $(BUILD) "$(ASSETS)"

bench: build
	$(BUILD)/tests/bench_ops

clean:
	rm -rf $(BUILD) $(ASAN)
