// Exhaustive and randomized checks of the fp16/bf16 conversions (fp16.h) against slow,
// obviously-correct references built from exact double arithmetic.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "moesh/tensor/fp16.h"

namespace moesh {
namespace {

float bits_to_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint32_t float_to_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// Value of a half from its fields, in double (exact).
double half_value(uint16_t h) {
  const int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
  double v;
  if (e == 0) {
    v = std::ldexp(static_cast<double>(m), -24);
  } else if (e == 31) {
    v = m == 0 ? INFINITY : NAN;
  } else {
    v = std::ldexp(static_cast<double>(1024 + m), e - 25);
  }
  return s ? -v : v;
}

// Slow RNE fp32 -> fp16: find the neighbouring finite halves by bisection over the (monotonic)
// positive codes, then compare with their exact midpoint; 65520 and above round to inf.
uint16_t slow_fp32_to_fp16(float f) {
  const uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  if (std::isnan(f)) return sign | 0x7e00;
  const double a = std::fabs(static_cast<double>(f));
  if (a >= 65520.0) return sign | 0x7c00;
  uint16_t lo = 0, hi = 0x7bff;  // largest code with value <= a
  if (a >= half_value(0x7bff)) {
    lo = 0x7bff;
  } else {
    while (hi - lo > 1) {
      const uint16_t mid = static_cast<uint16_t>((lo + hi) / 2);
      (half_value(mid) <= a ? lo : hi) = mid;
    }
    if (half_value(hi) <= a) lo = hi;
  }
  if (half_value(lo) == a) return sign | lo;
  const uint16_t up = static_cast<uint16_t>(lo + 1);           // 0x7c00 (inf) only above 65504, handled
  const double mid = (half_value(lo) + half_value(up)) / 2.0;  // exact: both have <= 12 bits
  uint16_t r;
  if (a < mid) {
    r = lo;
  } else if (a > mid) {
    r = up;
  } else {
    r = (lo & 1) ? up : lo;
  }
  return sign | r;
}

// Slow RNE fp32 -> bf16 via the exact midpoint between the truncated value and the next one.
uint16_t slow_fp32_to_bf16(float f) {
  const uint32_t u = float_to_bits(f);
  if (std::isnan(f)) return static_cast<uint16_t>((u >> 16) | 0x40);
  const uint32_t sign = u & 0x80000000u;
  const uint32_t abs = u & 0x7fffffffu;
  if (abs == 0x7f800000u) return static_cast<uint16_t>(u >> 16);  // inf stays inf
  const uint32_t lo = abs & 0xffff0000u;
  const uint32_t hi = lo + 0x10000u;
  const double a = bits_to_float(abs);
  const double vlo = bits_to_float(lo);
  const double vhi = hi == 0x7f800000u ? std::ldexp(1.0, 128) : static_cast<double>(bits_to_float(hi));
  const double mid = (vlo + vhi) / 2.0;
  uint32_t r;
  if (a < mid) {
    r = lo;
  } else if (a > mid) {
    r = hi;
  } else {
    r = ((lo >> 16) & 1) ? hi : lo;
  }
  return static_cast<uint16_t>((sign | r) >> 16);
}

TEST(Fp16, AllHalvesWidenExactlyAndRoundTrip) {
  int n_nan = 0, n_sub = 0;
  for (uint32_t h = 0; h < 65536; ++h) {
    const auto hh = static_cast<uint16_t>(h);
    const float f = fp16_to_fp32(hh);
    const double v = half_value(hh);
    if (std::isnan(v)) {
      ++n_nan;
      ASSERT_TRUE(std::isnan(f)) << std::hex << h;
      ASSERT_EQ(std::signbit(f), (h & 0x8000) != 0) << std::hex << h;
      ASSERT_EQ(fp32_to_fp16(f), (h & 0x8000) | 0x7e00) << std::hex << h;  // canonical quiet NaN
      continue;
    }
    if (((h >> 10) & 31) == 0 && (h & 1023) != 0) ++n_sub;
    ASSERT_EQ(static_cast<double>(f), v) << std::hex << h;
    ASSERT_EQ(std::signbit(f), (h & 0x8000) != 0) << std::hex << h;
    ASSERT_EQ(fp32_to_fp16(f), hh) << std::hex << h;
  }
  EXPECT_EQ(n_nan, 2 * 1023);
  EXPECT_EQ(n_sub, 2 * 1023);
}

TEST(Fp16, KnownValues) {
  EXPECT_EQ(fp32_to_fp16(1.0f), 0x3c00);
  EXPECT_EQ(fp32_to_fp16(-2.0f), 0xc000);
  EXPECT_EQ(fp32_to_fp16(0.1f), 0x2e66);
  EXPECT_EQ(fp32_to_fp16(65504.0f), 0x7bff);
  EXPECT_EQ(fp32_to_fp16(65519.99f), 0x7bff);
  EXPECT_EQ(fp32_to_fp16(65520.0f), 0x7c00);  // tie between 65504 and "65536" -> even (inf)
  EXPECT_EQ(fp32_to_fp16(-1e10f), 0xfc00);
  EXPECT_EQ(fp32_to_fp16(INFINITY), 0x7c00);
  EXPECT_EQ(fp32_to_fp16(-INFINITY), 0xfc00);
  EXPECT_EQ(fp32_to_fp16(std::ldexp(1.0f, -14)), 0x0400);  // smallest normal
  EXPECT_EQ(fp32_to_fp16(std::ldexp(1.0f, -24)), 0x0001);  // smallest subnormal
  EXPECT_EQ(fp32_to_fp16(std::ldexp(1.0f, -25)), 0x0000);  // tie -> even (zero)
  EXPECT_EQ(fp32_to_fp16(std::ldexp(1.5f, -25)), 0x0001);
  EXPECT_EQ(fp32_to_fp16(std::ldexp(3.0f, -25)), 0x0002);  // 1.5 units: tie -> even (2)
  EXPECT_EQ(fp32_to_fp16(-0.0f), 0x8000);
  EXPECT_EQ(fp32_to_fp16(1e-30f), 0x0000);
  EXPECT_EQ(fp32_to_fp16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);  // tie -> even
  EXPECT_EQ(fp32_to_fp16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);
  EXPECT_EQ(fp32_to_fp16(-NAN) & 0x7fff, 0x7e00);
  EXPECT_EQ(fp16_to_fp32(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(fp16_to_fp32(0x03ff), std::ldexp(1023.0f, -24));
  EXPECT_TRUE(std::isinf(fp16_to_fp32(0xfc00)) && fp16_to_fp32(0xfc00) < 0);
}

TEST(Fp16, RandomFloatsMatchSlowRne) {
  std::mt19937 rng(1234);
  int n_checked = 0, n_ties = 0, n_sub = 0, n_inf = 0;
  // Uniform bit patterns (all magnitudes), values in the half range, and exact ties.
  for (int i = 0; i < 300000; ++i) {
    float f;
    if (i % 3 == 0) {
      f = bits_to_float(rng());
    } else if (i % 3 == 1) {
      std::uniform_real_distribution<float> e(-26.0f, 16.5f);
      f = std::exp2(e(rng)) * ((rng() & 1) ? -1.0f : 1.0f);
    } else {
      // Midpoint between a half and its successor (or a point 1 float ulp away from it).
      const uint16_t h = static_cast<uint16_t>(rng() % 0x7bff);
      float m = static_cast<float>((half_value(h) + half_value(h + 1)) / 2.0);
      const int wiggle = static_cast<int>(rng() % 3) - 1;
      if (wiggle != 0) m = bits_to_float(float_to_bits(m) + wiggle);
      if (wiggle == 0) ++n_ties;
      f = (rng() & 1) ? -m : m;
    }
    const uint16_t want = slow_fp32_to_fp16(f);
    ASSERT_EQ(fp32_to_fp16(f), want) << "f=" << f << " bits=" << std::hex << float_to_bits(f);
    ++n_checked;
    if ((want & 0x7c00) == 0 && (want & 0x3ff) != 0) ++n_sub;
    if ((want & 0x7fff) == 0x7c00) ++n_inf;
  }
  EXPECT_EQ(n_checked, 300000);
  EXPECT_GT(n_ties, 30000);
  EXPECT_GT(n_sub, 1000);
  EXPECT_GT(n_inf, 1000);
}

TEST(Bf16, AllBf16RoundTrip) {
  int n_nan = 0;
  for (uint32_t h = 0; h < 65536; ++h) {
    const auto hh = static_cast<uint16_t>(h);
    const float f = bf16_to_fp32(hh);
    EXPECT_EQ(float_to_bits(f), h << 16);
    if (std::isnan(f)) {
      ++n_nan;
      ASSERT_EQ(fp32_to_bf16(f), hh | 0x40) << std::hex << h;  // quieted, payload kept
      continue;
    }
    ASSERT_EQ(fp32_to_bf16(f), hh) << std::hex << h;
  }
  EXPECT_EQ(n_nan, 2 * 127);
}

TEST(Bf16, RandomFloatsMatchSlowRne) {
  std::mt19937 rng(99);
  int n_ties = 0, n_inf = 0;
  for (int i = 0; i < 300000; ++i) {
    uint32_t u = rng();
    if (i % 2 == 0) {
      u = (u & 0xffff0000u) | 0x8000u;  // exact tie
      ++n_ties;
    }
    if (i % 97 == 0) u = 0x7f7f8000u | (rng() & 0x7fffu) | (rng() & 0x80000000u);  // near max
    const float f = bits_to_float(u);
    const uint16_t want = slow_fp32_to_bf16(f);
    ASSERT_EQ(fp32_to_bf16(f), want) << std::hex << u;
    if ((want & 0x7fff) == 0x7f80) ++n_inf;
  }
  EXPECT_GT(n_ties, 100000);
  EXPECT_GT(n_inf, 100);
  EXPECT_EQ(fp32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(fp32_to_bf16(bits_to_float(0x3f808000u)), 0x3f80);  // tie -> even
  EXPECT_EQ(fp32_to_bf16(bits_to_float(0x3f818000u)), 0x3f82);  // tie -> even (up)
  EXPECT_EQ(fp32_to_bf16(bits_to_float(0x00008001u)), 0x0001);  // subnormals are kept
}

}  // namespace
}  // namespace moesh
