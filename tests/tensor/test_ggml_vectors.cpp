// llama.cpp agreement per weight type, independent of any model: tests/tensor/data/ggml_mul_mat.bin
// holds, for every quantized type moesh runs, ggml-quantized weights, activations, and what ggml's
// CPU backend computed for ggml_mul_mat on them (tools/ggml-vectors: built as llama.cpp builds it
// for an AVX2 host, tinyBLAS on). Every kernel table this build has (scalar, AVX2, AVX-512; NEON
// under qemu) and matmul (tiles, rows kernels, thread pool) must give those bits exactly: the
// quantized dots follow ggml's x86 summation orders (include/moesh/tensor/quant.h).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "moesh/tensor/kernels.h"
#include "moesh/tensor/ops.h"
#include "moesh/tensor/quant.h"
#include "moesh/tensor/tensor.h"
#include "moesh/tensor/threadpool.h"
#include "moesh/tensor/types.h"

namespace moesh {
namespace {

struct Case {
  GgmlType type;
  int64_t k, n, t;
  std::vector<uint8_t> w;  // n rows
  std::vector<float> x;    // t rows of k
  std::vector<float> y;    // t rows of n: ggml's result
};

std::vector<Case> load_cases(std::string* error) {
  const std::string path = std::string(MOESH_SOURCE_DIR) + "/tests/tensor/data/ggml_mul_mat.bin";
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) {
    *error = "cannot open " + path;
    return {};
  }
  std::vector<Case> cases;
  char magic[9];
  uint32_t n_cases = 0;
  bool ok = std::fread(magic, 1, 9, f) == 9 && std::memcmp(magic, "MOESHGGV1", 9) == 0 &&
            std::fread(&n_cases, 4, 1, f) == 1 && n_cases < 1000;
  for (uint32_t i = 0; ok && i < n_cases; ++i) {
    uint32_t h[4];
    ok = std::fread(h, 4, 4, f) == 4 && h[0] < static_cast<uint32_t>(GgmlType::kCOUNT) && h[1] <= 4096 && h[2] <= 64 &&
         h[3] <= 64;
    if (!ok) break;
    Case c{static_cast<GgmlType>(h[0]), h[1], h[2], h[3], {}, {}, {}};
    c.w.resize(type_row_bytes(c.type, c.k) * static_cast<size_t>(c.n));
    c.x.resize(static_cast<size_t>(c.k * c.t));
    c.y.resize(static_cast<size_t>(c.n * c.t));
    ok = std::fread(c.w.data(), 1, c.w.size(), f) == c.w.size() &&
         std::fread(c.x.data(), sizeof(float), c.x.size(), f) == c.x.size() &&
         std::fread(c.y.data(), sizeof(float), c.y.size(), f) == c.y.size();
    cases.push_back(std::move(c));
  }
  ok = ok && std::fgetc(f) == EOF;
  std::fclose(f);
  if (!ok) *error = path + " is truncated or malformed";
  return ok ? cases : std::vector<Case>{};
}

TEST(GgmlVectors, EveryTableGivesGgmlsBits) {
  std::string error;
  const std::vector<Case> cases = load_cases(&error);
  ASSERT_FALSE(cases.empty()) << error;
  int tables = 0;
  for (int i = 0; i < static_cast<int>(Isa::kCOUNT); ++i) {
    const KernelTable* kt = kernels_for(static_cast<Isa>(i));
    if (kt == nullptr) continue;
    ++tables;
    for (const Case& c : cases) {
      SCOPED_TRACE(std::string(isa_name(static_cast<Isa>(i))) + " " + type_name(c.type) + " K=" + std::to_string(c.k) +
                   " T=" + std::to_string(c.t));
      const GgmlType at = quant::vec_dot_type(c.type);
      const size_t w_row = type_row_bytes(c.type, c.k), x_row = type_row_bytes(at, c.k);
      std::vector<uint8_t> xq(x_row * static_cast<size_t>(c.t));
      int differ = 0;
      for (int64_t t = 0; t < c.t; ++t) {
        (*kt)[at].from_float(c.x.data() + t * c.k, xq.data() + t * x_row, c.k);
        for (int64_t r = 0; r < c.n; ++r) {
          const float got = (*kt)[c.type].vec_dot(c.k, c.w.data() + r * w_row, xq.data() + t * x_row);
          const float want = c.y[static_cast<size_t>(t * c.n + r)];
          differ += std::memcmp(&got, &want, sizeof got) != 0;
        }
      }
      EXPECT_EQ(differ, 0) << "of " << c.n * c.t << " outputs";
    }
  }
  EXPECT_GE(tables, 1);
}

// matmul (the active table, with its tiles and rows kernels, over a thread pool) gives the same.
TEST(GgmlVectors, MatmulGivesGgmlsBits) {
  std::string error;
  const std::vector<Case> cases = load_cases(&error);
  ASSERT_FALSE(cases.empty()) << error;
  ThreadPool pool(2);
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(type_name(c.type)) + " K=" + std::to_string(c.k) + " T=" + std::to_string(c.t));
    TensorView w;
    w.type = c.type;
    w.n_dims = 2;
    w.ne[0] = c.k;
    w.ne[1] = c.n;
    w.set_contiguous_strides();
    w.data = c.w.data();
    std::vector<float> y(c.y.size());
    matmul(w, c.x.data(), c.t, y.data(), &pool);
    EXPECT_EQ(std::memcmp(y.data(), c.y.data(), y.size() * sizeof(float)), 0);
  }
}

}  // namespace
}  // namespace moesh
