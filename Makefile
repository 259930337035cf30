# moesh: thin wrapper over CMake + CTest. `make demo` and `make test` work on a fresh Debian 12.
BUILD      ?= build
BUILD_SAN  ?= build-sanitize-clang
BUILD_FUZZ ?= build-fuzz
BUILD_ARM  ?= build-aarch64
FUZZ_SECONDS ?= 30
JOBS       ?= $(shell nproc)
CMAKE_ARGS ?=

.PHONY: all build deps test test-sanitize fuzz demo bench format format-check clean deps-cross-aarch64 cross-aarch64 test-aarch64

all: build

deps:
	@./scripts/install-deps.sh

$(BUILD)/CMakeCache.txt:
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_ARGS)

build: deps $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j $(JOBS)

# With a cross build present (make cross-aarch64), `make test` also brings it up to date first, so
# test_aarch64_worker never runs a stale aarch64 worker, and then runs its ops tests under qemu.
test: build
	@if [ -f $(BUILD_ARM)/CMakeCache.txt ]; then cmake --build $(BUILD_ARM) -j $(JOBS) --target $(ARM_TARGETS); fi
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS) $(CTEST_ARGS)
	@if [ -f $(BUILD_ARM)/CMakeCache.txt ]; then cd $(BUILD_ARM) && ctest --output-on-failure -j $(JOBS) -L ops; fi

# ASan+UBSan over the labels that exercise kernels, parsers and the model code.
# clang, not gcc: its -O0 ASan/UBSan build of check-targets takes 463 s here against gcc's ~790 s,
# and the tests then ~330 s against ~210 s — 14.5 min against 16.7 in all. (The Release build and
# its tests stay gcc, so both compilers see the code.)
test-sanitize: deps
	CC=clang CXX=clang++ cmake -S . -B $(BUILD_SAN) -DCMAKE_BUILD_TYPE=Debug -DMOESH_SANITIZE=ON -DMOESH_BUILD_BENCH=OFF
	cmake --build $(BUILD_SAN) -j $(JOBS) --target check-targets
	cd $(BUILD_SAN) && ctest --output-on-failure -j $(JOBS) -L 'unit|ops|model' $(CTEST_ARGS)

# libFuzzer (clang, ASan+UBSan) on the wire frames, GGUF images, HTTP request bodies and JSON Schemas, FUZZ_SECONDS each, from the
# corpus in tests/fuzz/corpus (new inputs go to a temporary directory; a crash fails).
fuzz: deps
	CC=clang CXX=clang++ cmake -S . -B $(BUILD_FUZZ) -DCMAKE_BUILD_TYPE=Debug -DMOESH_SANITIZE=ON -DMOESH_FUZZ=ON -DMOESH_BUILD_BENCH=OFF
	cmake --build $(BUILD_FUZZ) -j $(JOBS) --target fuzz_wire fuzz_gguf fuzz_http fuzz_json
	./scripts/fuzz.sh $(BUILD_FUZZ) $(FUZZ_SECONDS)

# aarch64 (ARM boards, phones) cross build with Debian's g++-aarch64-linux-gnu and multiarch arm64
# libraries (docs/arm.md): the moesh binary and the ops tests, which ctest runs under qemu-user.
ARM_TARGETS ?= moesh test_fp16 test_quant test_kernels_simd test_kernels_golden test_ggml_vectors test_ops test_determinism

deps-cross-aarch64:
	@./scripts/install-cross-aarch64.sh

$(BUILD_ARM)/CMakeCache.txt:
	cmake -S . -B $(BUILD_ARM) -DCMAKE_TOOLCHAIN_FILE=cmake/toolchain-aarch64.cmake -DCMAKE_BUILD_TYPE=Release -DMOESH_BUILD_BENCH=OFF

cross-aarch64: deps-cross-aarch64 $(BUILD_ARM)/CMakeCache.txt
	cmake --build $(BUILD_ARM) -j $(JOBS) --target $(ARM_TARGETS)

# The aarch64 ops tests under qemu, then an x86 backbone against the aarch64 worker under qemu.
test-aarch64: cross-aarch64 build
	cd $(BUILD_ARM) && ctest --output-on-failure -j $(JOBS) -L ops $(CTEST_ARGS)
	cmake --build $(BUILD) -j $(JOBS) --target test_aarch64_worker
	cd $(BUILD) && ctest --output-on-failure -R '^test_aarch64_worker$$' $(CTEST_ARGS)

demo: build
	./scripts/demo.sh $(BUILD)

bench: build
	./scripts/bench-kernels.sh $(BUILD)

format:
	git ls-files '*.h' '*.cpp' | xargs clang-format -i

format-check: deps
	./scripts/check-format.sh

clean:
	rm -rf $(BUILD) $(BUILD_SAN) $(BUILD_FUZZ) $(BUILD_ARM)
