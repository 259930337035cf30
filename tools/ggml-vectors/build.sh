#!/usr/bin/env bash
# Builds make_ggml_vectors against a ggml (or llama.cpp) source tree and writes the test vectors.
#   tools/ggml-vectors/build.sh GGML_SOURCE_DIR [OUT.bin]
# ggml is configured the way llama.cpp builds it for the reference host of ../shared/reference/archs2
# (x86-64 with AVX2, FMA, F16C, no AVX-512) with llamafile's tinyBLAS on, as llama.cpp enables it.
set -euo pipefail
src=${1:?usage: build.sh GGML_SOURCE_DIR [OUT.bin]}
here=$(cd "$(dirname "$0")" && pwd)
out=${2:-$here/../../tests/tensor/data/ggml_mul_mat.bin}
build=$(mktemp -d /tmp/ggml-vectors.XXXXXX)
trap 'rm -rf "$build"' EXIT
ggml_src=$src
[ -d "$src/ggml/src" ] && ggml_src=$src/ggml  # a llama.cpp tree
cmake -S "$ggml_src" -B "$build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=OFF \
  -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_AVX512=OFF \
  -DGGML_LLAMAFILE=ON -DGGML_OPENMP=OFF -DGGML_BUILD_TESTS=OFF -DGGML_BUILD_EXAMPLES=OFF >/dev/null
cmake --build "$build" -j "$(nproc)" --target ggml-cpu ggml-base >/dev/null
cc -O2 -std=c11 -I"$ggml_src/include" "$here/make_ggml_vectors.c" \
  "$build/src/libggml-cpu.a" "$build/src/libggml-base.a" -lstdc++ -lm -lpthread -o "$build/make_ggml_vectors"
"$build/make_ggml_vectors" "$out"
echo "wrote $out"
