// The determinism contract (docs/ARCHITECTURE.md) for matmul and the per-row ops: results are
// bit-identical whatever the thread count, whatever other tokens share the batch and wherever
// in the batch a token sits, and a routed subset of rows equals those rows of the full matmul.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <set>
#include <vector>

#include "moesh/tensor/kernels.h"
#include "moesh/tensor/ops.h"
#include "moesh/tensor/quant.h"
#include "moesh/tensor/threadpool.h"

namespace moesh {
namespace {

std::vector<float> randn(size_t n, std::mt19937& rng, float scale = 1.0f) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

bool same_bits(const float* a, const float* b, size_t n) {
  return std::memcmp(a, b, n * sizeof(float)) == 0;
}

struct Weights {
  std::vector<uint8_t> bytes;
  TensorView view;
};

// Random weights quantized by the reference quantizer; asserts they are not degenerate.
Weights make_weights(GgmlType t, int64_t k, int64_t m, uint32_t seed) {
  std::mt19937 rng(seed);
  auto f = randn(static_cast<size_t>(k * m), rng, 0.05f);
  Weights w;
  const size_t rb = type_row_bytes(t, k);
  w.bytes.resize(rb * m);
  for (int64_t r = 0; r < m; ++r) {
    EXPECT_TRUE(quant::quantize_row_ref(t, f.data() + r * k, w.bytes.data() + r * rb, k)) << type_name(t);
  }
  std::vector<float> back(k);
  std::set<float> distinct;
  EXPECT_TRUE(quant::dequantize_row_ref(t, w.bytes.data(), back.data(), k));
  distinct.insert(back.begin(), back.end());
  EXPECT_GT(distinct.size(), 8u) << type_name(t) << " weights are degenerate";
  w.view.type = t;
  w.view.n_dims = 2;
  w.view.ne[0] = k;
  w.view.ne[1] = m;
  w.view.set_contiguous_strides();
  w.view.data = w.bytes.data();
  return w;
}

class Determinism : public ::testing::TestWithParam<GgmlType> {
 protected:
  // K spans several K-quant super-blocks; M is not a multiple of the 16-row task height.
  static constexpr int64_t k_k = 1024;
  static constexpr int64_t k_m = 83;
};

TEST_P(Determinism, ThreadCountDoesNotChangeBits) {
  const GgmlType t = GetParam();
  Weights w = make_weights(t, k_k, k_m, 7 + static_cast<uint32_t>(t));
  std::mt19937 rng(99);
  for (int64_t n : {1, 3, 37, 100}) {
    auto x = randn(static_cast<size_t>(n * k_k), rng);
    std::vector<float> y1(n * k_m);
    matmul(w.view, x.data(), n, y1.data(), nullptr);
    std::set<float> distinct(y1.begin(), y1.end());
    ASSERT_GT(distinct.size(), y1.size() / 2);
    for (int nt : {1, 2, 3, 4}) {
      ThreadPool pool(nt);
      std::vector<float> y(n * k_m);
      matmul(w.view, x.data(), n, y.data(), &pool);
      EXPECT_TRUE(same_bits(y.data(), y1.data(), y.size())) << type_name(t) << " n " << n << " threads " << nt;
    }
  }
}

TEST_P(Determinism, BatchCompositionAndPositionDoNotChangeBits) {
  const GgmlType t = GetParam();
  Weights w = make_weights(t, k_k, k_m, 17 + static_cast<uint32_t>(t));
  std::mt19937 rng(1234);
  auto target = randn(k_k, rng);
  std::vector<float> single(k_m);
  ThreadPool pool(2);
  matmul(w.view, target.data(), 1, single.data(), &pool);
  for (int64_t n = 1; n <= 64; ++n) {
    auto x = randn(static_cast<size_t>(n * k_k), rng);
    const int64_t pos = std::uniform_int_distribution<int64_t>(0, n - 1)(rng);
    std::copy(target.begin(), target.end(), x.begin() + pos * k_k);
    std::vector<float> y(n * k_m);
    matmul(w.view, x.data(), n, y.data(), &pool);
    ASSERT_TRUE(same_bits(y.data() + pos * k_m, single.data(), k_m))
        << type_name(t) << " batch " << n << " position " << pos;
    if (n > 1) {
      // Another row of the batch differs from the target's output (the batch is real).
      const int64_t other = (pos + 1) % n;
      EXPECT_FALSE(same_bits(y.data() + other * k_m, single.data(), k_m));
    }
  }
}

TEST_P(Determinism, RowSubsetEqualsFullMatmulRows) {
  const GgmlType t = GetParam();
  Weights w = make_weights(t, k_k, k_m, 27 + static_cast<uint32_t>(t));
  std::mt19937 rng(555);
  const int64_t n = 50;
  auto x = randn(static_cast<size_t>(n * k_k), rng);
  ThreadPool pool(3);
  QuantizedRows xq;
  quantize_rows(quant::vec_dot_type(t), x.data(), n, k_k, &xq, &pool);
  std::vector<float> full(n * k_m);
  matmul_q(w.view, xq, full.data(), k_m, &pool);
  // matmul (quantizing itself) and matmul_q agree.
  std::vector<float> direct(n * k_m);
  matmul(w.view, x.data(), n, direct.data(), &pool);
  EXPECT_TRUE(same_bits(full.data(), direct.data(), full.size()));
  // Routed subsets in scrambled order, with repeats, into a strided output.
  const std::vector<int32_t> rows = {49, 3, 3, 17, 0, 28, 41, 12, 7, 33, 22, 48};
  const size_t ldy = k_m + 11;
  std::vector<float> sub(rows.size() * ldy);
  for (int64_t len : {int64_t{1}, int64_t{2}, int64_t{5}, static_cast<int64_t>(rows.size())}) {
    std::fill(sub.begin(), sub.end(), 0.0f);
    matmul_q_rows(w.view, xq, rows.data(), len, sub.data(), ldy, &pool);
    for (int64_t j = 0; j < len; ++j) {
      EXPECT_TRUE(same_bits(sub.data() + j * ldy, full.data() + rows[j] * k_m, k_m))
          << type_name(t) << " subset row " << j << " (token " << rows[j] << ")";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Types, Determinism,
                         ::testing::Values(GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::Q8_0, GgmlType::MXFP4,
                                           GgmlType::F16, GgmlType::F32),
                         [](const auto& info) { return std::string(type_name(info.param)); });

TEST(DeterminismOps, QuantizeRowsIsRowLocal) {
  std::mt19937 rng(77);
  for (GgmlType vt : {GgmlType::Q8_0, GgmlType::Q8_K, GgmlType::F16}) {
    auto x = randn(20 * 512, rng);
    QuantizedRows all, one;
    ThreadPool pool(2);
    quantize_rows(vt, x.data(), 20, 512, &all, &pool);
    for (int64_t r = 0; r < 20; ++r) {
      quantize_rows(vt, x.data() + r * 512, 1, 512, &one, nullptr);
      EXPECT_EQ(0, std::memcmp(one.row(0), all.row(r), all.row_bytes)) << type_name(vt);
    }
  }
}

TEST(DeterminismOps, RmsNormAndRopeAreRowLocal) {
  std::mt19937 rng(31);
  const int n_heads = 4, head_dim = 64;
  const int64_t width = n_heads * head_dim;
  auto target = randn(width, rng);
  auto w = randn(width, rng);
  RopeParams p;
  p.mode = RopeMode::kNeox;
  p.n_rot = 64;
  p.freq_base = 1e6f;
  p.freq_scale = 0.5f;
  p.ext_factor = 1.0f;
  p.n_ctx_orig = 2048;
  auto apply = [&](float* row, int64_t pos) {
    rms_norm(row, w.data(), row, width, 1e-6f);
    rope(row, n_heads, head_dim, head_dim, pos, p);
  };
  std::vector<float> single = target;
  apply(single.data(), 300);
  ASSERT_FALSE(same_bits(single.data(), target.data(), width));
  // One head alone gives the same bits as that head inside a multi-head row.
  std::vector<float> normed = target;
  rms_norm(normed.data(), w.data(), normed.data(), width, 1e-6f);
  for (int h = 0; h < n_heads; ++h) {
    std::vector<float> head(normed.begin() + h * head_dim, normed.begin() + (h + 1) * head_dim);
    rope(head.data(), 1, head_dim, head_dim, 300, p);
    EXPECT_TRUE(same_bits(head.data(), single.data() + h * head_dim, head_dim)) << "head " << h;
  }
  for (int64_t n : {2, 7, 33}) {
    auto batch = randn(static_cast<size_t>(n * width), rng);
    const int64_t at = n / 2;
    std::copy(target.begin(), target.end(), batch.begin() + at * width);
    ThreadPool pool(2);
    pool.parallel_for(n, [&](int64_t b, int64_t e, int) {
      for (int64_t r = b; r < e; ++r) apply(batch.data() + r * width, r == at ? 300 : r);
    });
    EXPECT_TRUE(same_bits(batch.data() + at * width, single.data(), width)) << "batch " << n;
  }
}

}  // namespace
}  // namespace moesh
