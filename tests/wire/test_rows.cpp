// Row codecs: exactness of F32, RNE of F16/BF16, the Q8 block rule (and its identity with the
// canonical Q8_0 activation quantizer), padding, and the non-finite policy.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "moesh/fp16.h"
#include "moesh/quant.h"
#include "moesh/wire.h"

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

}  // namespace
}  // namespace moesh::wire
