// Scalar reference quantization (quant.h): round-trip error per type, requantization stability,
// dot products against a double-precision dot of the dequantized rows, hand-built blocks with
// values computed by hand from docs/background/quant-formats.md, the activation quantizers' exact rules, and
// dequantization of llama.cpp-written tensors from the reference models.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "moesh/gguf/gguf.h"
#include "moesh/tensor/fp16.h"
#include "moesh/tensor/kernels.h"
#include "moesh/tensor/quant.h"
#include "tensor/quant_impl.h"
#include "tensor/quant_test_util.h"

namespace moesh::quant {
namespace {

// Every supported type with its measured relative RMSE on N(0,1) data (bound set a little above
// the measurement), and the relative error allowed on a constant block.
struct TypeCase {
  GgmlType type;
  double rmse_bound;
  double const_tol;
};

const std::vector<TypeCase>& all_cases() {
  static const std::vector<TypeCase> cases = {
      {GgmlType::F32, 0.0, 0.0},      {GgmlType::F16, 2.5e-4, 5e-4},    // 2.1e-4
      {GgmlType::BF16, 1.9e-3, 4e-3}, {GgmlType::Q4_0, 0.093, 1e-3},    // 1.68e-3, 0.0857
      {GgmlType::Q4_1, 0.085, 1e-3},  {GgmlType::Q5_0, 0.046, 1e-3},    // 0.0785, 0.0420
      {GgmlType::Q5_1, 0.042, 1e-3},  {GgmlType::Q8_0, 0.006, 1e-3},    // 0.0378, 0.0053
      {GgmlType::Q8_1, 0.006, 1e-3},  {GgmlType::IQ4_NL, 0.080, 1e-3},  // 0.0053, 0.0725
      {GgmlType::MXFP4, 0.12, 0.1},   {GgmlType::Q2_K, 0.29, 2e-3},     // 0.1113, 0.2696
      {GgmlType::Q3_K, 0.155, 2e-3},  {GgmlType::Q4_K, 0.078, 2e-3},    // 0.1432, 0.0713
      {GgmlType::Q5_K, 0.039, 2e-3},  {GgmlType::Q6_K, 0.0185, 2e-3},   // 0.0356, 0.01675
      {GgmlType::Q8_K, 0.0075, 1e-3}, {GgmlType::IQ4_XS, 0.080, 2e-3},  // 0.0069, 0.0733
  };
  return cases;
}

constexpr size_t k_n = 256 * 40;  // 40 super-blocks / 320 legacy blocks: lanes wrap 5 times

TEST(QuantRef, SupportAndPairing) {
  for (const auto& c : all_cases()) {
    EXPECT_TRUE(type_is_supported(c.type)) << type_name(c.type);
    const GgmlType v = vec_dot_type(c.type);
    EXPECT_TRUE(type_is_supported(v));
    EXPECT_EQ(type_block_size(v), type_block_size(c.type)) << type_name(c.type);
  }
  EXPECT_EQ(vec_dot_type(GgmlType::Q4_K), GgmlType::Q8_K);
  EXPECT_EQ(vec_dot_type(GgmlType::IQ4_XS), GgmlType::Q8_K);
  EXPECT_EQ(vec_dot_type(GgmlType::Q5_0), GgmlType::Q8_0);
  EXPECT_EQ(vec_dot_type(GgmlType::MXFP4), GgmlType::Q8_0);
  EXPECT_EQ(vec_dot_type(GgmlType::Q5_1), GgmlType::Q8_1);
  EXPECT_EQ(vec_dot_type(GgmlType::F16), GgmlType::F16);
  EXPECT_FALSE(type_is_supported(GgmlType::I32));
  EXPECT_FALSE(type_is_supported(GgmlType::F64));
  float out[32];
  EXPECT_FALSE(dequantize_row_ref(GgmlType::I8, out, out, 32));
  EXPECT_FALSE(quantize_row_ref(GgmlType::Q4_K, out, out, 32));  // not a multiple of 256
  EXPECT_TRUE(std::isnan(vec_dot_ref(GgmlType::Q4_0, 31, out, out)));
}

TEST(QuantRef, ScalarKernelTableIsTheReference) {
  const KernelTable* t = kernels_for(Isa::kScalar);
  ASSERT_NE(t, nullptr);
  const std::set<GgmlType> act = {GgmlType::F32,  GgmlType::F16,  GgmlType::BF16,
                                  GgmlType::Q8_0, GgmlType::Q8_1, GgmlType::Q8_K};
  for (int i = 0; i < static_cast<int>(GgmlType::kCOUNT); ++i) {
    const auto type = static_cast<GgmlType>(i);
    const TypeKernels& k = (*t)[type];
    EXPECT_EQ(k.vec_dot_tile, nullptr) << i;
    if (!type_is_supported(type)) {
      EXPECT_TRUE(k.vec_dot == nullptr && k.to_float == nullptr && k.from_float == nullptr) << i;
      continue;
    }
    EXPECT_EQ(k.vec_dot, ref::ref_kernels(type).vec_dot) << type_name(type);
    EXPECT_EQ(k.to_float, ref::ref_kernels(type).to_float) << type_name(type);
    EXPECT_EQ(k.from_float != nullptr, act.count(type) == 1) << type_name(type);
    if (k.from_float != nullptr) {
      EXPECT_EQ(k.from_float, ref::ref_kernels(type).from_float) << type_name(type);
    }
  }
}

TEST(QuantRef, RoundTripErrorOnGaussian) {
  const auto x = gaussian(11, k_n);
  ASSERT_NEAR(stddev(x), 1.0, 0.03);  // the data is what we think it is
  for (const auto& c : all_cases()) {
    const Bytes q = quantize(c.type, x);
    const auto y = dequantize(c.type, q, x.size());
    const double e = rel_rmse(x, y);
    RecordProperty(std::string("rmse_") + type_name(c.type), std::to_string(e));
    std::printf("  %-7s rel RMSE %.5f (bound %.4f)\n", type_name(c.type), e, c.rmse_bound);
    EXPECT_LE(e, c.rmse_bound) << type_name(c.type);
    EXPECT_NEAR(stddev(y), 1.0, 0.1) << type_name(c.type);
    if (c.type != GgmlType::F32) {
      EXPECT_GT(e, 0.0) << type_name(c.type);  // it did quantize
    }
    // Scale invariance in the type's normal range: 1e-3 * x gives the same relative error.
    std::vector<float> xs(x.size());
    for (size_t i = 0; i < x.size(); ++i) xs[i] = x[i] * 1e-3f;
    const double es = rel_rmse(xs, dequantize(c.type, quantize(c.type, xs), xs.size()));
    EXPECT_LE(es, c.rmse_bound * 1.1 + 1e-6) << type_name(c.type);
  }
}

TEST(QuantRef, ZeroConstantAndOutlierBlocks) {
  for (const auto& c : all_cases()) {
    const size_t bs =
        static_cast<size_t>(type_block_size(c.type)) == 1 ? 32 : static_cast<size_t>(type_block_size(c.type));
    const size_t n = 256 * 4;
    auto x = gaussian(21, n);
    // Block 0 all zero, block 1 constant 0.7, block 2 constant -3, an outlier in block 3.
    std::fill(x.begin(), x.begin() + bs, 0.0f);
    std::fill(x.begin() + bs, x.begin() + 2 * bs, 0.7f);
    std::fill(x.begin() + 2 * bs, x.begin() + 3 * bs, -3.0f);
    x[3 * bs + 5] = 50.0f;
    const auto y = dequantize(c.type, quantize(c.type, x), n);
    for (size_t i = 0; i < n; ++i) ASSERT_TRUE(std::isfinite(y[i])) << type_name(c.type) << " " << i;
    for (size_t i = 0; i < bs; ++i) ASSERT_EQ(y[i], 0.0f) << type_name(c.type) << " zero block @" << i;
    for (size_t i = bs; i < 2 * bs; ++i) ASSERT_NEAR(y[i], 0.7f, 0.7 * c.const_tol) << type_name(c.type) << " @" << i;
    for (size_t i = 2 * bs; i < 3 * bs; ++i)
      ASSERT_NEAR(y[i], -3.0f, 3.0 * c.const_tol) << type_name(c.type) << " @" << i;
    EXPECT_NEAR(y[3 * bs + 5], 50.0f, 50.0 * std::max(0.02, c.const_tol)) << type_name(c.type) << " outlier";
    // The rest of the data (blocks past the outlier's) keeps the type's usual accuracy.
    const std::vector<float> tail_x(x.begin() + 4 * bs, x.end());
    const std::vector<float> tail_y(y.begin() + 4 * bs, y.end());
    if (!tail_x.empty()) {
      EXPECT_LE(rel_rmse(tail_x, tail_y), c.rmse_bound * 1.2 + 1e-6) << type_name(c.type);
    }
  }
}

// Quantizing what a dequantization produced: types whose quantizer reproduces its own grid give
// identical bytes; Q8_1 (s) and Q8_K (f32 d) recompute a float scale from the rounded values, so
// only their codes repeat exactly; the searching quantizers (K-quants, IQ4) land back on their
// grid up to a tiny drift.
TEST(QuantRef, RequantizationIsStable) {
  const auto x = gaussian(31, k_n);
  const std::set<GgmlType> exact = {GgmlType::F32,  GgmlType::F16,  GgmlType::BF16, GgmlType::Q4_0,
                                    GgmlType::Q5_0, GgmlType::Q8_0, GgmlType::MXFP4};
  for (const auto& c : all_cases()) {
    const Bytes q1 = quantize(c.type, x);
    const auto y1 = dequantize(c.type, q1, x.size());
    const Bytes q2 = quantize(c.type, y1);
    const auto y2 = dequantize(c.type, q2, x.size());
    const double drift = rel_rmse(y1, y2);
    std::printf("  %-7s requantization drift %.3g (first error %.5f)\n", type_name(c.type), drift, rel_rmse(x, y1));
    if (exact.count(c.type)) {
      EXPECT_EQ(q1, q2) << type_name(c.type);
    } else if (c.type == GgmlType::Q8_1 || c.type == GgmlType::Q8_K) {
      EXPECT_LE(drift, 1e-6) << type_name(c.type);
      const size_t bb = type_block_bytes(c.type), off = 4;  // qs follow d,s (Q8_1) / f32 d (Q8_K)
      for (size_t b = 0; b < q1.size() / bb; ++b) {         // the int8 codes are identical
        ASSERT_EQ(std::memcmp(q1.data() + b * bb + off, q2.data() + b * bb + off, type_block_size(c.type)), 0)
            << type_name(c.type) << " block " << b;
      }
    } else {
      EXPECT_LE(drift, 0.01 * rel_rmse(x, y1)) << type_name(c.type);  // measured: 0
    }
  }
}

// Dot products: vec_dot_ref against a double-precision dot of the dequantized rows. Q4_1/Q5_1
// use the activation's stored s = f16(d*sum q) for the min term, so the reference does too.
TEST(QuantRef, VecDotMatchesDequantizedDot) {
  const auto w = gaussian(41, k_n);
  auto x = gaussian(42, k_n);
  for (size_t i = 0; i < k_n; ++i) x[i] = 0.5f * w[i] + x[i];  // correlated: the dot is large
  for (const auto& c : all_cases()) {
    const GgmlType vt = vec_dot_type(c.type);
    const Bytes wq = quantize(c.type, w);
    const Bytes xq = quantize(vt, x);
    const auto wd = dequantize(c.type, wq, k_n);
    const auto xd = dequantize(vt, xq, k_n);
    double ref = 0, mag = 0;
    for (size_t i = 0; i < k_n; ++i) {
      ref += static_cast<double>(wd[i]) * xd[i];
      mag += std::fabs(static_cast<double>(wd[i]) * xd[i]);
    }
    if (vt == GgmlType::Q8_1) {
      const auto* xb = reinterpret_cast<const BlockQ8_1*>(xq.data());
      for (size_t b = 0; b < k_n / 32; ++b) {
        uint16_t mh;
        std::memcpy(&mh, wq.data() + b * type_block_bytes(c.type) + 2, 2);  // m follows d
        double xs = 0;
        for (int j = 0; j < 32; ++j) xs += xd[b * 32 + j];
        ref += static_cast<double>(fp16_to_fp32(mh)) * (fp16_to_fp32(xb[b].s) - xs);
      }
    }
    const float got = vec_dot_ref(c.type, static_cast<int64_t>(k_n), wq.data(), xq.data());
    ASSERT_GT(std::fabs(ref), 0.2 * mag) << type_name(c.type);  // non-degenerate
    EXPECT_NEAR(got, ref, 1e-5 * mag) << type_name(c.type) << " vs " << type_name(vt);
    // The scalar kernel table is the reference.
    const TypeKernels& k = kernels_for(Isa::kScalar)->type[static_cast<int>(c.type)];
    ASSERT_NE(k.vec_dot, nullptr) << type_name(c.type);
    EXPECT_EQ(k.vec_dot(static_cast<int64_t>(k_n), wq.data(), xq.data()), got) << type_name(c.type);
  }
}

// The canonical order, recomputed literally from quant.h for two types: bit equality.
TEST(QuantRef, CanonicalOrderBitExact) {
  const size_t n = 32 * 37;  // not a multiple of 8 blocks: uneven lanes
  const auto w = gaussian(51, n), x = gaussian(52, n);
  {
    const Bytes wq = quantize(GgmlType::Q8_0, w), xq = quantize(GgmlType::Q8_0, x);
    const auto* a = reinterpret_cast<const BlockQ8_0*>(wq.data());
    const auto* b = reinterpret_cast<const BlockQ8_0*>(xq.data());
    // Per block: int lane l = elements 4l..4l+3, fused with dx*dy into float lane l.
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (size_t i = 0; i < n / 32; ++i) {
      for (int l = 0; l < 8; ++l) {
        int isum = 0;
        for (int j = 4 * l; j < 4 * l + 4; ++j) isum += a[i].qs[j] * b[i].qs[j];
        acc[l] = std::fmaf(static_cast<float>(isum), fp16_to_fp32(a[i].d) * fp16_to_fp32(b[i].d), acc[l]);
      }
    }
    const float want = ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
    EXPECT_EQ(vec_dot_ref(GgmlType::Q8_0, static_cast<int64_t>(n), wq.data(), xq.data()), want);
    // The former block-per-lane order: the same value to rounding (a sanity check of `want`).
    float old_acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (size_t i = 0; i < n / 32; ++i) {
      int isum = 0;
      for (int j = 0; j < 32; ++j) isum += a[i].qs[j] * b[i].qs[j];
      old_acc[i % 8] = std::fmaf(static_cast<float>(isum), fp16_to_fp32(a[i].d) * fp16_to_fp32(b[i].d), old_acc[i % 8]);
    }
    const float old_want = ((old_acc[0] + old_acc[4]) + (old_acc[2] + old_acc[6])) +
                           ((old_acc[1] + old_acc[5]) + (old_acc[3] + old_acc[7]));
    EXPECT_NEAR(old_want, want, 1e-3 * std::fabs(want) + 1e-3);
  }
  {
    // Q4_K x Q8_K: 8 float lanes of sc * q * q8 by (n % 32) / 4, mins in 4 lanes, then
    // reduce8 + ((m0 + m2) + (m1 + m3)).
    const size_t nk = 256 * 5;
    const auto wk = gaussian(53, nk), xk = gaussian(54, nk);
    const Bytes wq = quantize(GgmlType::Q4_K, wk), xq = quantize(GgmlType::Q8_K, xk);
    const auto* a = reinterpret_cast<const BlockQ4_K*>(wq.data());
    const auto* b = reinterpret_cast<const BlockQ8_K*>(xq.data());
    float acc[8] = {}, acc_m[4] = {};
    for (size_t i = 0; i < nk / 256; ++i) {
      int lane[8] = {}, mlane[4] = {};
      for (int s = 0; s < 8; ++s) {
        const uint8_t* sc12 = a[i].scales;
        const int sc = s < 4 ? (sc12[s] & 63) : ((sc12[s + 4] & 15) | ((sc12[s - 4] >> 6) << 4));
        const int m = s < 4 ? (sc12[s + 4] & 63) : ((sc12[s + 4] >> 4) | ((sc12[s] >> 6) << 4));
        for (int l = 0; l < 32; ++l) {
          const int byte = a[i].qs[32 * (s / 2) + l];
          const int q = s % 2 == 0 ? (byte & 15) : (byte >> 4);
          lane[l / 4] += sc * q * b[i].qs[32 * s + l];
        }
        mlane[s / 2] += m * (b[i].bsums[2 * s] + b[i].bsums[2 * s + 1]);
      }
      const float d = b[i].d * fp16_to_fp32(a[i].d), dmin = -b[i].d * fp16_to_fp32(a[i].dmin);
      for (int l = 0; l < 8; ++l) acc[l] = std::fmaf(static_cast<float>(lane[l]), d, acc[l]);
      for (int l = 0; l < 4; ++l) acc_m[l] = std::fmaf(static_cast<float>(mlane[l]), dmin, acc_m[l]);
    }
    const float want = (((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]))) +
                       ((acc_m[0] + acc_m[2]) + (acc_m[1] + acc_m[3]));
    ASSERT_GT(std::fabs(want), 1.0f);
    EXPECT_EQ(vec_dot_ref(GgmlType::Q4_K, static_cast<int64_t>(nk), wq.data(), xq.data()), want);
  }
  {
    float acc[32] = {};
    for (size_t i = 0; i < n; ++i) acc[i % 32] = std::fmaf(w[i], x[i], acc[i % 32]);
    for (int h = 16; h >= 1; h /= 2)
      for (int l = 0; l < h; ++l) acc[l] += acc[l + h];
    EXPECT_EQ(vec_dot_ref(GgmlType::F32, static_cast<int64_t>(n), w.data(), x.data()), acc[0]);
    // A plain sequential double-free sum generally differs in the last bits; the order matters.
    float seq = 0;
    for (size_t i = 0; i < n; ++i) seq += w[i] * x[i];
    EXPECT_NEAR(seq, acc[0], 1e-3);
  }
}

// ---- activation quantizers: the exact rules of quant.h ----

TEST(QuantRef, Q8_0RoundsHalfToEvenWithId127OverAmax) {
  std::vector<float> x(64, 0.0f);
  x[0] = 127.0f;  // amax = 127 -> id = 1, d = 1
  x[1] = 2.5f, x[2] = 3.5f, x[3] = -2.5f, x[4] = -0.5f, x[5] = 0.5f, x[6] = 1.5f, x[7] = 2.4999998f;
  x[32] = -10.0f;  // block 1: amax 10, id = 12.7
  x[33] = 1.0f;
  const Bytes q = quantize(GgmlType::Q8_0, x);
  const auto* b = reinterpret_cast<const BlockQ8_0*>(q.data());
  EXPECT_EQ(fp16_to_fp32(b[0].d), 1.0f);
  const int want[8] = {127, 2, 4, -2, 0, 0, 2, 2};
  for (int j = 0; j < 8; ++j) EXPECT_EQ(b[0].qs[j], want[j]) << j;
  EXPECT_EQ(b[1].qs[0], -127);
  EXPECT_EQ(b[1].qs[1], 13);  // 12.7 -> 13
  EXPECT_EQ(b[1].d, fp32_to_fp16(10.0f / 127.0f));
  // Q8_1 adds s = f16(d * sum q) with the f32 d.
  const Bytes q1 = quantize(GgmlType::Q8_1, x);
  const auto* b1 = reinterpret_cast<const BlockQ8_1*>(q1.data());
  int sum1 = 0;
  for (int j = 0; j < 32; ++j) sum1 += b1[1].qs[j];
  EXPECT_EQ(sum1, -114);
  EXPECT_EQ(b1[1].s, fp32_to_fp16((10.0f / 127.0f) * -114.0f));
  EXPECT_EQ(std::memcmp(b1[0].qs, b[0].qs, 32), 0);
  // All-zero block: d = 0 and q = 0.
  const Bytes z = quantize(GgmlType::Q8_0, std::vector<float>(32, 0.0f));
  EXPECT_EQ(z, Bytes(34, 0));
}

TEST(QuantRef, Q8_KRulesAndBsums) {
  // First-wins signed max, RNE, min(127, .), d = 1/iscale.
  std::vector<float> x(512, 0.0f);
  x[3] = -127.0f;  // max = -127 -> iscale = 1
  x[7] = 127.0f;   // same |x|, later: does not win
  x[8] = 2.5f, x[9] = 3.5f, x[10] = -0.5f;
  const auto r = gaussian(61, 256, 2.0f);
  std::copy(r.begin(), r.end(), x.begin() + 256);
  Bytes q(2 * sizeof(BlockQ8_K), 0xAB);
  ASSERT_TRUE(quantize_row_ref(GgmlType::Q8_K, x.data(), q.data(), 512));
  const auto* b = reinterpret_cast<const BlockQ8_K*>(q.data());
  EXPECT_EQ(b[0].d, 1.0f);
  EXPECT_EQ(b[0].qs[3], -127);
  EXPECT_EQ(b[0].qs[7], 127);
  EXPECT_EQ(b[0].qs[8], 2);
  EXPECT_EQ(b[0].qs[9], 4);
  EXPECT_EQ(b[0].qs[10], 0);
  int n_distinct = 0;
  std::set<int> seen;
  for (int g = 0; g < 16; ++g) {
    for (int blk = 0; blk < 2; ++blk) {
      int s = 0;
      for (int l = 0; l < 16; ++l) s += b[blk].qs[16 * g + l];
      EXPECT_EQ(b[blk].bsums[g], s) << blk << " " << g;
    }
  }
  for (int j = 0; j < 256; ++j) seen.insert(b[1].qs[j]);
  n_distinct = static_cast<int>(seen.size());
  EXPECT_GT(n_distinct, 100);  // non-degenerate block
  float amax = 0, max = 0;
  for (float v : r)
    if (std::fabs(v) > amax) amax = std::fabs(v), max = v;
  EXPECT_EQ(b[1].d, 1.0f / (-127.0f / max));
  int nz = 0;
  for (int g = 0; g < 16; ++g) nz += b[1].bsums[g] != 0;
  EXPECT_GT(nz, 10);
  // An all-zero block is all zero, bsums included (the buffer held 0xAB garbage).
  std::vector<float> zero(256, 0.0f);
  Bytes zq(sizeof(BlockQ8_K), 0xAB);
  ASSERT_TRUE(quantize_row_ref(GgmlType::Q8_K, zero.data(), zq.data(), 256));
  EXPECT_EQ(zq, Bytes(sizeof(BlockQ8_K), 0));
  // Positive max: iscale negative, d negative, values still reconstruct.
  std::vector<float> p = gaussian(62, 256);
  p[100] = 9.0f;
  const Bytes pq = quantize(GgmlType::Q8_K, p);
  const auto* pb = reinterpret_cast<const BlockQ8_K*>(pq.data());
  EXPECT_LT(pb->d, 0.0f);
  EXPECT_EQ(pb->qs[100], -127);
  // amax = 9 sets the step (9/127): RMSE ~ 0.07/sqrt(12) on unit-variance data.
  EXPECT_LE(rel_rmse(p, dequantize(GgmlType::Q8_K, pq, 256)), 0.025);
}

TEST(QuantRef, E8m0HalfScale) {
  EXPECT_EQ(e8m0_to_fp32_half(128), 1.0f);
  EXPECT_EQ(e8m0_to_fp32_half(130), 4.0f);
  EXPECT_EQ(e8m0_to_fp32_half(127), 0.5f);
  EXPECT_EQ(e8m0_to_fp32_half(2), std::ldexp(1.0f, -126));
  EXPECT_EQ(e8m0_to_fp32_half(1), std::ldexp(1.0f, -127));
  EXPECT_EQ(e8m0_to_fp32_half(0), std::ldexp(1.0f, -128));
  EXPECT_EQ(e8m0_to_fp32_half(254), std::ldexp(1.0f, 126));
}

}  // namespace
}  // namespace moesh::quant
