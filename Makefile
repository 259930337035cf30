# moesh: thin wrapper over CMake + CTest. `make demo` and `make test` work on a fresh Debian 12.
BUILD      ?= build
BUILD_SAN  ?= build-sanitize
BUILD_FUZZ ?= build-fuzz
FUZZ_SECONDS ?= 30
JOBS       ?= $(shell nproc)
CMAKE_ARGS ?=

.PHONY: all build deps test test-sanitize fuzz demo bench format format-check clean

all: build

deps:
	@./scripts/install-deps.sh

$(BUILD)/CMakeCache.txt:
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_ARGS)

build: deps $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j $(JOBS)

test: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS) $(CTEST_ARGS)

# ASan+UBSan over the labels that exercise kernels, parsers and the model code.
test-sanitize: deps
	cmake -S . -B $(BUILD_SAN) -DCMAKE_BUILD_TYPE=Debug -DMOESH_SANITIZE=ON -DMOESH_BUILD_BENCH=OFF
	cmake --build $(BUILD_SAN) -j $(JOBS)
	cd $(BUILD_SAN) && ctest --output-on-failure -j $(JOBS) -L 'unit|ops|model' $(CTEST_ARGS)

# libFuzzer (clang, ASan+UBSan) on the wire frames, GGUF images and HTTP request bodies, FUZZ_SECONDS each, from the
# corpus in tests/fuzz/corpus (new inputs go to a temporary directory; a crash fails).
fuzz: deps
	CC=clang CXX=clang++ cmake -S . -B $(BUILD_FUZZ) -DCMAKE_BUILD_TYPE=Debug -DMOESH_SANITIZE=ON -DMOESH_FUZZ=ON -DMOESH_BUILD_BENCH=OFF
	cmake --build $(BUILD_FUZZ) -j $(JOBS) --target fuzz_wire fuzz_gguf fuzz_http
	./scripts/fuzz.sh $(BUILD_FUZZ) $(FUZZ_SECONDS)

demo: build
	./scripts/demo.sh $(BUILD)

bench: build
	./scripts/bench-kernels.sh $(BUILD)

format:
	git ls-files '*.h' '*.cpp' | xargs clang-format -i

format-check: deps
	./scripts/check-format.sh

clean:
	rm -rf $(BUILD) $(BUILD_SAN) $(BUILD_FUZZ)
