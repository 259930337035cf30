// Small helpers shared by the tensor/quant tests: quantize/dequantize whole rows, seeded data,
// error and spread statistics.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "moesh/tensor/quant.h"
#include "moesh/tensor/types.h"

namespace moesh::quant {

using Bytes = std::vector<uint8_t>;

inline Bytes quantize(GgmlType t, const std::vector<float>& x) {
  Bytes q(type_row_bytes(t, static_cast<int64_t>(x.size())), 0);
  EXPECT_TRUE(quantize_row_ref(t, x.data(), q.data(), static_cast<int64_t>(x.size()))) << type_name(t);
  return q;
}

inline std::vector<float> dequantize(GgmlType t, const Bytes& q, size_t n) {
  std::vector<float> y(n, NAN);
  EXPECT_TRUE(dequantize_row_ref(t, q.data(), y.data(), static_cast<int64_t>(n))) << type_name(t);
  return y;
}

inline std::vector<float> gaussian(uint32_t seed, size_t n, float std = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, std);
  std::vector<float> x(n);
  for (auto& v : x) v = nd(rng);
  return x;
}

inline double rel_rmse(const std::vector<float>& x, const std::vector<float>& y) {
  double num = 0, den = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    num += (static_cast<double>(x[i]) - y[i]) * (static_cast<double>(x[i]) - y[i]);
    den += static_cast<double>(x[i]) * x[i];
  }
  return std::sqrt(num / den);
}

inline double stddev(const std::vector<float>& x) {
  double s = 0, s2 = 0;
  for (float v : x) {
    s += v;
    s2 += static_cast<double>(v) * v;
  }
  const double m = s / static_cast<double>(x.size());
  return std::sqrt(std::max(0.0, s2 / static_cast<double>(x.size()) - m * m));
}

}  // namespace moesh::quant
