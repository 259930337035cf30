// Shared layer pieces whose speed paths must keep the reference order (model/layers.h):
// dot_f32_ggml (the kernel table's attention score, whichever ISA it runs on) gives the bits of
// ggml_vec_dot_f32's 64-lane order spelled out here for every length and value class, so
// attention scores do not depend on the CPU they run on.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "model/layers.h"

namespace moesh::detail {
namespace {

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

// ggml_vec_dot_f32 on AVX-512: element i -> lane i % 64 (fma), halving tree, then the leftovers
// as GCC compiles them: groups of 8 products rounded then added in order, the last < 8 by fma
// (golden bits from ggml itself: tests/tensor/test_ops.cpp F32DotFollowsGgmlAvx512Build).
float dot_64_lanes(const float* k, const float* q, int64_t n) {
  float acc[64] = {};
  const int64_t np = n & ~static_cast<int64_t>(63);
  for (int64_t i = 0; i < np; i += 64) {
    for (int l = 0; l < 64; ++l) acc[l] = std::fmaf(k[i + l], q[i + l], acc[l]);
  }
  for (int h = 32; h >= 1; h /= 2) {
    for (int l = 0; l < h; ++l) acc[l] += acc[l + h];
  }
  float sum = acc[0];
  int64_t i = np;
  for (; n - i >= 8; i += 8) {
    float p[8];
    for (int l = 0; l < 8; ++l) p[l] = k[i + l] * q[i + l];
    for (int l = 0; l < 8; ++l) sum += p[l];
  }
  for (; i < n; ++i) sum = std::fmaf(k[i], q[i], sum);
  return sum;
}

TEST(DotF32Ggml, IsGgmlsSixtyFourLaneOrder) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> wide(-30.0f, 30.0f);
  int checked = 0;
  for (int64_t n : {0, 1, 7, 63, 64, 65, 96, 127, 128, 129, 192, 256, 320, 576, 1000}) {
    for (int dist = 0; dist < 4; ++dist) {
      std::vector<float> k(static_cast<size_t>(n) + 1), q(static_cast<size_t>(n) + 1);
      for (int64_t i = 0; i < n; ++i) {
        switch (dist) {
          case 0:  // attention-like
            k[i] = normal(rng), q[i] = normal(rng);
            break;
          case 1:  // wide exponents: cancellation makes every rounding visible
            k[i] = std::ldexp(normal(rng), static_cast<int>(wide(rng))), q[i] = normal(rng);
            break;
          case 2:  // large, alternating sign
            k[i] = (i % 2 ? -1.0f : 1.0f) * 1e18f * (1.0f + normal(rng) * 1e-3f), q[i] = 1e18f;
            break;
          default:  // a NaN or inf somewhere
            k[i] = normal(rng), q[i] = i == n / 2 ? std::numeric_limits<float>::infinity() : normal(rng);
            break;
        }
      }
      // Unaligned starts too: the kernels use unaligned loads.
      for (int off = 0; off < 2 && off <= n; ++off) {
        const int64_t len = n - off;
        const float a = dot_64_lanes(k.data() + off, q.data() + off, len);
        const float b = dot_f32_ggml(k.data() + off, q.data() + off, len);
        if (std::isnan(a)) {
          EXPECT_TRUE(std::isnan(b)) << "n " << len << " dist " << dist;
        } else {
          EXPECT_EQ(bits(a), bits(b)) << "n " << len << " dist " << dist << ": " << a << " vs " << b;
        }
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 100);
}

}  // namespace
}  // namespace moesh::detail
