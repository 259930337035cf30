// Row codecs: exactness of F32, RNE of F16/BF16, the Q8 block rule (and its identity with the
// canonical Q8_0 activation quantizer), Q8K (identity with the canonical Q8_K quantizer, bsums
// recomputed), padding, and the non-finite policy.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "moesh/tensor/fp16.h"
#include "moesh/tensor/ops.h"
#include "moesh/tensor/quant.h"
#include "moesh/wire/wire.h"

namespace moesh::wire {
namespace {

std::vector<float> random_rows(uint32_t n, uint64_t seed, float scale) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = nd(rng);
  return v;
}

void expect_not_degenerate(const std::vector<float>& v) {
  float lo = v[0], hi = v[0];
  for (float x : v) lo = std::min(lo, x), hi = std::max(hi, x);
  ASSERT_LT(lo, 0.f);
  ASSERT_GT(hi, 0.f);
  ASSERT_GT(hi - lo, 1e-3f);
}

TEST(WireRows, RowBytesPerDtype) {
  EXPECT_EQ(wire_row_bytes(WireDType::kF32, 3072), 12288u);
  EXPECT_EQ(wire_row_bytes(WireDType::kF16, 3072), 6144u);
  EXPECT_EQ(wire_row_bytes(WireDType::kBF16, 3072), 6144u);
  EXPECT_EQ(wire_row_bytes(WireDType::kQ8, 3072), 96u * 34u);
  EXPECT_EQ(wire_row_bytes(WireDType::kQ8, 40), 2u * 34u);  // short last block is padded
  EXPECT_EQ(wire_row_bytes(WireDType::kQ8, 1), 34u);
  EXPECT_EQ(wire_row_bytes(WireDType::kQ8K, 3072), 12u * 260u);
  EXPECT_EQ(wire_row_bytes(WireDType::kQ8K, 300), 2u * 260u);  // short last block is padded
  EXPECT_EQ(wire_row_bytes(WireDType::kQ8K, 1), 260u);
}

TEST(WireRows, F32IsBitExactIncludingSpecials) {
  std::vector<float> x = random_rows(3 * 100, 1, 3.f);
  expect_not_degenerate(x);
  x[5] = -0.f;
  x[6] = std::numeric_limits<float>::denorm_min();
  x[7] = std::numeric_limits<float>::infinity();
  x[8] = std::numeric_limits<float>::quiet_NaN();
  auto rows = encode_rows(WireDType::kF32, x.data(), 3, 100);
  ASSERT_TRUE(rows.is_ok());
  std::vector<float> y(x.size());
  decode_rows(*rows, y.data());
  EXPECT_EQ(std::memcmp(x.data(), y.data(), x.size() * 4), 0);
  EXPECT_EQ(check_rows_finite(*rows).code(), StatusCode::kCorrupt);
}

TEST(WireRows, F16AndBF16RoundToNearestEven) {
  const std::vector<float> x = random_rows(4 * 256, 2, 10.f);
  expect_not_degenerate(x);
  for (WireDType t : {WireDType::kF16, WireDType::kBF16}) {
    auto rows = encode_rows(t, x.data(), 4, 256);
    ASSERT_TRUE(rows.is_ok());
    ASSERT_TRUE(check_rows_finite(*rows).is_ok());
    std::vector<float> y(x.size());
    decode_rows(*rows, y.data());
    const float rel = t == WireDType::kF16 ? 1.f / 2048 : 1.f / 256;  // half an ulp
    for (size_t i = 0; i < x.size(); ++i) {
      const float want = t == WireDType::kF16 ? fp16_to_fp32(fp32_to_fp16(x[i])) : bf16_to_fp32(fp32_to_bf16(x[i]));
      ASSERT_EQ(y[i], want) << i;
      if (std::fabs(x[i]) > 1e-3f) {
        ASSERT_LE(std::fabs(y[i] - x[i]), rel * std::fabs(x[i]) * 1.0001f) << i;
      }
    }
  }
  // Ties go to the even neighbour: 1 + 2^-11 is halfway between 1 and 1 + 2^-10 in f16.
  const float ties[4] = {1.f + 0x1p-11f, 1.f + 3 * 0x1p-11f, 1.f + 0x1p-8f, 1.f + 3 * 0x1p-8f};
  auto h = encode_rows(WireDType::kF16, ties, 1, 2).value();
  auto b = encode_rows(WireDType::kBF16, ties + 2, 1, 2).value();
  float hy[2], by[2];
  decode_rows(h, hy);
  decode_rows(b, by);
  EXPECT_EQ(hy[0], 1.f);
  EXPECT_EQ(hy[1], 1.f + 0x1p-9f);
  EXPECT_EQ(by[0], 1.f);
  EXPECT_EQ(by[1], 1.f + 0x1p-6f);
}

TEST(WireRows, F16OverflowIsRefused) {
  std::vector<float> x(8, 1.f);
  x[3] = 70000.f;
  auto rows = encode_rows(WireDType::kF16, x.data(), 1, 8);
  ASSERT_FALSE(rows.is_ok());
  EXPECT_EQ(rows.status().code(), StatusCode::kOutOfRange);
  EXPECT_NE(rows.status().message().find("column 3"), std::string::npos);
  EXPECT_TRUE(encode_rows(WireDType::kBF16, x.data(), 1, 8).is_ok());  // bf16 has the range
}

TEST(WireRows, Q8BlockRuleByHand) {
  // amax = 127 -> d = 1, id = 1: q = round-half-even(x), so halves land on even integers.
  float x[32] = {};
  x[0] = 127.f;
  x[1] = 2.5f;
  x[2] = 3.5f;
  x[3] = -2.5f;
  x[4] = -0.4f;
  x[5] = 10.6f;
  uint8_t blk[34];
  q8_encode_row(x, 32, blk);
  uint16_t d;
  std::memcpy(&d, blk, 2);
  EXPECT_EQ(fp16_to_fp32(d), 1.f);
  const int8_t* q = reinterpret_cast<const int8_t*>(blk + 2);
  EXPECT_EQ(q[0], 127);
  EXPECT_EQ(q[1], 2);
  EXPECT_EQ(q[2], 4);
  EXPECT_EQ(q[3], -2);
  EXPECT_EQ(q[4], 0);
  EXPECT_EQ(q[5], 11);
  EXPECT_EQ(q[31], 0);
  // An all-zero block has d = 0 and decodes to zeros.
  float z[32] = {};
  q8_encode_row(z, 32, blk);
  std::memcpy(&d, blk, 2);
  EXPECT_EQ(d, 0);
  float back[32];
  q8_decode_row(blk, 32, back);
  for (float v : back) EXPECT_EQ(v, 0.f);
}

TEST(WireRows, Q8ErrorBoundAndPadding) {
  const uint32_t n = 3 * 32 + 8;  // 4 blocks, the last one short
  const std::vector<float> x = random_rows(2 * n, 3, 4.f);
  expect_not_degenerate(x);
  auto rows = encode_rows(WireDType::kQ8, x.data(), 2, n);
  ASSERT_TRUE(rows.is_ok());
  ASSERT_EQ(rows->bytes.size(), 2 * 4 * 34u);
  std::vector<float> y(x.size());
  decode_rows(*rows, y.data());
  for (uint32_t r = 0; r < 2; ++r)
    for (uint32_t b0 = 0; b0 < n; b0 += 32) {
      float amax = 0;
      for (uint32_t j = b0; j < std::min(n, b0 + 32); ++j) amax = std::max(amax, std::fabs(x[r * n + j]));
      // Half a quantization step plus the f16 rounding of the scale times |q| <= 127.
      const float bound = amax / 127.f * 0.5f + amax * 0x1p-11f + 1e-7f;
      for (uint32_t j = b0; j < std::min(n, b0 + 32); ++j)
        ASSERT_LE(std::fabs(y[r * n + j] - x[r * n + j]), bound) << r << " " << j;
    }
  // The padded tail of the last block is zero on the wire.
  const int8_t* last = reinterpret_cast<const int8_t*>(rows->bytes.data() + 3 * 34 + 2);
  for (int j = 8; j < 32; ++j) EXPECT_EQ(last[j], 0);
}

TEST(WireRows, Q8EqualsCanonicalQ8_0Quantizer) {
  // The worker may hand wire Q8 blocks straight to Q8_0 dot products; that is only exact if the
  // bytes equal what the backbone's own activation quantizer produces.
  const uint32_t n = 3072;
  std::vector<float> x = random_rows(n, 4, 2.f);
  expect_not_degenerate(x);
  x[17] = 0.5f * (x[16] + x[18]);
  auto rows = encode_rows(WireDType::kQ8, x.data(), 1, n);
  ASSERT_TRUE(rows.is_ok());
  std::vector<quant::BlockQ8_0> ref(n / 32);
  ASSERT_TRUE(quant::quantize_row_ref(GgmlType::Q8_0, x.data(), ref.data(), n));
  ASSERT_EQ(rows->bytes.size(), ref.size() * sizeof(quant::BlockQ8_0));
  EXPECT_EQ(std::memcmp(rows->bytes.data(), ref.data(), rows->bytes.size()), 0);
}

TEST(WireRows, NonFinitePolicy) {
  std::vector<float> x(64, 0.5f);
  x[40] = std::numeric_limits<float>::quiet_NaN();
  auto q8 = encode_rows(WireDType::kQ8, x.data(), 1, 64);
  ASSERT_FALSE(q8.is_ok());
  EXPECT_EQ(q8.status().code(), StatusCode::kInvalidArgument);
  for (WireDType t : {WireDType::kF32, WireDType::kF16, WireDType::kBF16}) {
    auto rows = encode_rows(t, x.data(), 2, 32);
    ASSERT_TRUE(rows.is_ok()) << wire_dtype_name(t);
    Status st = check_rows_finite(*rows);
    EXPECT_EQ(st.code(), StatusCode::kCorrupt) << wire_dtype_name(t);
    EXPECT_NE(st.message().find("row 1 column 8"), std::string::npos) << st.message();
  }
  // A Q8 row whose scale bits are inf is caught too.
  x[40] = 0.5f;
  auto ok = encode_rows(WireDType::kQ8, x.data(), 1, 64).value();
  ASSERT_TRUE(check_rows_finite(ok).is_ok());
  ok.bytes[34] = 0x00;
  ok.bytes[35] = 0x7c;
  EXPECT_EQ(check_rows_finite(ok).code(), StatusCode::kCorrupt);
}

// Rows that exercise the Q8_K rule: plain normals at several scales, all-zero rows and blocks,
// a block whose max |x| appears with both signs (the first one sets the sign of d), extreme
// magnitudes, denormals beside normal values, exact halves (round-half-even), a lone spike.
std::vector<std::vector<float>> q8k_test_rows(uint32_t n) {
  std::vector<std::vector<float>> rows;
  std::mt19937_64 rng(12345);
  for (int i = 0; i < 40; ++i) {
    const float scale = std::ldexp(1.f, (i % 13) * 4 - 24);  // 2^-24 .. 2^24
    std::vector<float> v = random_rows(n, 1000 + i, scale);
    rows.push_back(std::move(v));
  }
  rows.emplace_back(n, 0.f);  // all zero
  {
    std::vector<float> v = random_rows(n, 77, 1.f);
    std::fill(v.begin(), v.begin() + std::min<uint32_t>(n, 256), 0.f);  // a zero block
    if (n > 300) v[300] = -0.f;
    rows.push_back(std::move(v));
  }
  {
    std::vector<float> v = random_rows(n, 78, 1.f);
    v[3] = -9.f;  // first of two maxima: d must be negative-scaled by -9, not 9
    v[40] = 9.f;
    if (n > 256 + 10) v[256 + 10] = 9.f, v[256 + 11] = -9.f;
    rows.push_back(std::move(v));
  }
  {
    std::vector<float> v = random_rows(n, 79, 1.f);
    v[0] = 3.0e38f;  // near FLT_MAX
    v[1] = -1.0e-38f;
    if (n > 256 + 5) v[256 + 5] = std::numeric_limits<float>::denorm_min(), v[256 + 6] = 1e-30f;
    rows.push_back(std::move(v));
  }
  {
    // max 127 -> iscale -1 (for a negative max): q = round-half-even(-x), halves on evens.
    std::vector<float> v(n, 0.f);
    for (uint32_t j = 0; j < n; ++j) v[j] = static_cast<float>(static_cast<int>(j % 200) - 100) + 0.5f;
    for (uint32_t b = 0; b < n; b += 256) v[b] = -127.f;
    rows.push_back(std::move(v));
  }
  {
    std::vector<float> v(n, 1e-3f);
    v[n / 2] = 1e6f;  // a spike: the rest of its block quantizes to 0
    rows.push_back(std::move(v));
  }
  return rows;
}

TEST(WireRows, Q8KEqualsCanonicalQ8_KQuantizer) {
  // The worker hands Q8K blocks (bsums recomputed) straight to its Q8_K dot products; that is
  // only exact if d and q equal what the backbone's own quantizer gives, for every row.
  for (uint32_t n : {3072u, 256u, 300u, 64u}) {
    const uint32_t n_blocks = (n + 255) / 256;
    const auto rows = q8k_test_rows(n);
    size_t nonzero_q = 0, negative_d = 0;
    for (size_t r = 0; r < rows.size(); ++r) {
      const std::vector<float>& x = rows[r];
      auto wr = encode_rows(WireDType::kQ8K, x.data(), 1, n);
      ASSERT_TRUE(wr.is_ok()) << wr.status().to_string();
      ASSERT_EQ(wr->bytes.size(), n_blocks * 260u);
      ASSERT_TRUE(check_rows_finite(*wr).is_ok()) << "row " << r;
      // The canonical quantizers on the zero-padded row: the scalar reference and the kernel
      // table the backbone's matmuls use.
      std::vector<float> padded(n_blocks * 256, 0.f);
      std::copy(x.begin(), x.end(), padded.begin());
      std::vector<quant::BlockQ8_K> ref(n_blocks);
      ASSERT_TRUE(quant::quantize_row_ref(GgmlType::Q8_K, padded.data(), ref.data(), padded.size()));
      QuantizedRows kq;
      quantize_rows(GgmlType::Q8_K, padded.data(), 1, static_cast<int64_t>(padded.size()), &kq, nullptr);
      ASSERT_EQ(kq.data.size(), ref.size() * sizeof(quant::BlockQ8_K));
      ASSERT_EQ(std::memcmp(kq.data.data(), ref.data(), kq.data.size()), 0) << "n " << n << " row " << r;
      for (uint32_t b = 0; b < n_blocks; ++b) {
        const uint8_t* blk = wr->bytes.data() + 260 * b;
        ASSERT_EQ(std::memcmp(blk, &ref[b].d, 4), 0) << "n " << n << " row " << r << " block " << b;
        ASSERT_EQ(std::memcmp(blk + 4, ref[b].qs, 256), 0) << "n " << n << " row " << r << " block " << b;
        for (int j = 0; j < 256; ++j) nonzero_q += ref[b].qs[j] != 0;
        negative_d += ref[b].d < 0.f;
      }
      // The blocks rebuilt from the wire are the quantizer's, bsums included.
      std::vector<quant::BlockQ8_K> back(n_blocks);
      q8k_row_to_blocks(wr->bytes.data(), n, back.data());
      ASSERT_EQ(std::memcmp(back.data(), ref.data(), n_blocks * sizeof(quant::BlockQ8_K)), 0) << "row " << r;
      // Decoding is d*q, element by element.
      std::vector<float> y(n);
      decode_row(*wr, 0, y.data());
      for (uint32_t j = 0; j < n; ++j) {
        const quant::BlockQ8_K& blk = ref[j / 256];
        ASSERT_EQ(y[j], blk.d * static_cast<float>(blk.qs[j % 256])) << j;
      }
      // Padded values are zero on the wire.
      for (uint32_t j = n; j < n_blocks * 256; ++j) ASSERT_EQ(wr->bytes[260 * (j / 256) + 4 + j % 256], 0);
    }
    // Not degenerate: most values quantize to nonzero, and both signs of d occur.
    EXPECT_GT(nonzero_q, rows.size() * n / 2) << n;
    EXPECT_GT(negative_d, 0u) << n;
  }
}

TEST(WireRows, Q8KErrorBoundAndRoundHalfEven) {
  const uint32_t n = 512;
  const std::vector<float> x = random_rows(3 * n, 5, 2.f);
  expect_not_degenerate(x);
  auto rows = encode_rows(WireDType::kQ8K, x.data(), 3, n);
  ASSERT_TRUE(rows.is_ok());
  std::vector<float> y(x.size());
  decode_rows(*rows, y.data());
  for (uint32_t r = 0; r < 3; ++r)
    for (uint32_t b0 = 0; b0 < n; b0 += 256) {
      float amax = 0;
      for (uint32_t j = b0; j < b0 + 256; ++j) amax = std::max(amax, std::fabs(x[r * n + j]));
      // Half a step of amax/127 (the f32 scale adds only f32 rounding).
      const float bound = amax / 127.f * 0.5f * 1.0001f;
      for (uint32_t j = b0; j < b0 + 256; ++j) ASSERT_LE(std::fabs(y[r * n + j] - x[r * n + j]), bound);
    }
  // max = -127 -> iscale = 1: halves go to the even neighbour.
  std::vector<float> h(256, 0.f);
  h[0] = -127.f;
  h[1] = 2.5f;
  h[2] = 3.5f;
  h[3] = -2.5f;
  h[4] = 126.6f;
  uint8_t blk[260];
  q8k_encode_row(h.data(), 256, blk);
  float d;
  std::memcpy(&d, blk, 4);
  EXPECT_EQ(d, 1.f);
  const int8_t* q = reinterpret_cast<const int8_t*>(blk + 4);
  EXPECT_EQ(q[0], -127);
  EXPECT_EQ(q[1], 2);
  EXPECT_EQ(q[2], 4);
  EXPECT_EQ(q[3], -2);
  EXPECT_EQ(q[4], 127);
  EXPECT_EQ(q[5], 0);
}

TEST(WireRows, Q8KNonFinite) {
  std::vector<float> x(512, 0.5f);
  x[300] = std::numeric_limits<float>::infinity();
  auto bad = encode_rows(WireDType::kQ8K, x.data(), 1, 512);
  ASSERT_FALSE(bad.is_ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("column 300"), std::string::npos) << bad.status().message();
  x[300] = 0.25f;
  auto ok = encode_rows(WireDType::kQ8K, x.data(), 2, 256).value();
  ASSERT_TRUE(check_rows_finite(ok).is_ok());
  for (float v : {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                  std::numeric_limits<float>::quiet_NaN()}) {
    WireRows r = ok;
    std::memcpy(r.bytes.data() + 260, &v, 4);  // row 1's scale
    Status st = check_rows_finite(r);
    EXPECT_EQ(st.code(), StatusCode::kCorrupt);
    EXPECT_NE(st.message().find("q8k scale at row 1 block 0"), std::string::npos) << st.message();
  }
}

}  // namespace
}  // namespace moesh::wire
