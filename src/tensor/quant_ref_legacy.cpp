// Scalar reference for plain float rows (F32/F16/BF16) and the 32-element block formats
// (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1, IQ4_NL, MXFP4): dequantize, quantize, dot product.
// Layouts: docs/background/quant-formats.md §1–2; dot-product float order: the canonical order in quant.h.
#include <algorithm>
#include <cmath>
#include <limits>

#include "tensor/quant_impl.h"

namespace moesh::quant::ref {

// ---------------------------------------------------------------- F32 / F16 / BF16

void to_float_f32(const void* x, float* y, int64_t n) {
  std::memcpy(y, x, static_cast<size_t>(n) * 4);
}
void from_float_f32(const float* x, void* y, int64_t n) {
  std::memcpy(y, x, static_cast<size_t>(n) * 4);
}

void to_float_f16(const void* x, float* y, int64_t n) {
  const auto* h = static_cast<const uint16_t*>(x);
  for (int64_t i = 0; i < n; ++i) y[i] = fp16_to_fp32(h[i]);
}
void from_float_f16(const float* x, void* y, int64_t n) {
  auto* h = static_cast<uint16_t*>(y);
  for (int64_t i = 0; i < n; ++i) h[i] = fp32_to_fp16(x[i]);
}

void to_float_bf16(const void* x, float* y, int64_t n) {
  const auto* h = static_cast<const uint16_t*>(x);
  for (int64_t i = 0; i < n; ++i) y[i] = bf16_to_fp32(h[i]);
}
void from_float_bf16(const float* x, void* y, int64_t n) {
  auto* h = static_cast<uint16_t*>(y);
  for (int64_t i = 0; i < n; ++i) h[i] = fp32_to_bf16(x[i]);
}

namespace {

// 32 lanes (element i -> lane i % 32), fmaf, halving reduction: the F32/F16/BF16 canonical order.
template <typename LoadW, typename LoadX>
float dot_lanes32(int64_t n, LoadW load_w, LoadX load_x) {
  float acc[32] = {};
  for (int64_t i = 0; i < n; ++i) acc[i % 32] = std::fmaf(load_w(i), load_x(i), acc[i % 32]);
  return reduce32(acc);
}

}  // namespace

float vec_dot_f32(int64_t n, const void* w, const void* x) {
  const auto* a = static_cast<const float*>(w);
  const auto* b = static_cast<const float*>(x);
  return dot_lanes32(
      n, [a](int64_t i) { return a[i]; }, [b](int64_t i) { return b[i]; });
}

float vec_dot_f16(int64_t n, const void* w, const void* x) {
  const auto* a = static_cast<const uint16_t*>(w);
  const auto* b = static_cast<const uint16_t*>(x);
  return dot_lanes32(
      n, [a](int64_t i) { return fp16_to_fp32(a[i]); }, [b](int64_t i) { return fp16_to_fp32(b[i]); });
}

float vec_dot_bf16(int64_t n, const void* w, const void* x) {
  const auto* a = static_cast<const uint16_t*>(w);
  const auto* b = static_cast<const uint16_t*>(x);
  return dot_lanes32(
      n, [a](int64_t i) { return bf16_to_fp32(a[i]); }, [b](int64_t i) { return bf16_to_fp32(b[i]); });
}

namespace {

// max |x| over a block, and the signed value that has it (first one wins a tie).
struct AbsMax {
  float amax = 0.0f;
  float max = 0.0f;
};
AbsMax abs_max(const float* x, int n) {
  AbsMax r;
  for (int j = 0; j < n; ++j) {
    const float ax = std::fabs(x[j]);
    if (ax > r.amax) {
      r.amax = ax;
      r.max = x[j];
    }
  }
  return r;
}

void min_max(const float* x, int n, float* mn, float* mx) {
  *mn = std::numeric_limits<float>::infinity();
  *mx = -std::numeric_limits<float>::infinity();
  for (int j = 0; j < n; ++j) {
    *mn = std::min(*mn, x[j]);
    *mx = std::max(*mx, x[j]);
  }
}

// Element j of a 32-block sits in the low nibble of byte j (j < 16) or the high nibble of byte
// j-16; q5 types keep bit 4 of element j in bit j of the little-endian u32 qh.
inline int nibble(const uint8_t* qs, int j) {
  return j < 16 ? (qs[j] & 15) : (qs[j - 16] >> 4);
}
inline void put_nibble(uint8_t* qs, int j, int v) {
  if (j < 16) {
    qs[j] = static_cast<uint8_t>((qs[j] & 0xF0) | (v & 15));
  } else {
    qs[j - 16] = static_cast<uint8_t>((qs[j - 16] & 0x0F) | ((v & 15) << 4));
  }
}
inline uint32_t load_u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);  // little-endian hosts only (the engine targets x86-64/arm64 LE)
  return v;
}
inline void store_u32(uint8_t* p, uint32_t v) {
  std::memcpy(p, &v, 4);
}

// The symmetric "largest magnitude maps to the most negative code" rule of Q4_0/Q5_0: d = max/-half,
// q = clamp(round(x/d) + half, 0, 2*half-1), quantized with the stored (f16) d so that a
// dequantized block requantizes to the same bytes.
template <typename B>
void quantize_sym(const float* x, B* y, int64_t n, int half, uint8_t* (*qh_of)(B&)) {
  for (int64_t b = 0; b < n / kQK; ++b, x += kQK) {
    B& blk = y[b];
    std::memset(&blk, 0, sizeof(B));
    const AbsMax am = abs_max(x, kQK);
    blk.d = fp32_to_fp16(am.max / static_cast<float>(-half));
    const float d = h2f(blk.d);
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    uint32_t qh = 0;
    for (int j = 0; j < kQK; ++j) {
      const int q = nearest_int_clamped(x[j] * id + static_cast<float>(half), 0, 2 * half - 1);
      put_nibble(blk.qs, j, q);
      qh |= static_cast<uint32_t>(q >> 4) << j;
    }
    if (qh_of != nullptr) store_u32(qh_of(blk), qh);
  }
}

// The asymmetric min/max rule of Q4_1/Q5_1: m = min, d = (max-min)/levels.
template <typename B>
void quantize_minmax(const float* x, B* y, int64_t n, int levels, uint8_t* (*qh_of)(B&)) {
  for (int64_t b = 0; b < n / kQK; ++b, x += kQK) {
    B& blk = y[b];
    std::memset(&blk, 0, sizeof(B));
    float mn, mx;
    min_max(x, kQK, &mn, &mx);
    blk.d = fp32_to_fp16((mx - mn) / static_cast<float>(levels));
    blk.m = fp32_to_fp16(mn);
    const float d = h2f(blk.d);
    const float m = h2f(blk.m);
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    uint32_t qh = 0;
    for (int j = 0; j < kQK; ++j) {
      const int q = nearest_int_clamped((x[j] - m) * id, 0, levels);
      put_nibble(blk.qs, j, q);
      qh |= static_cast<uint32_t>(q >> 4) << j;
    }
    if (qh_of != nullptr) store_u32(qh_of(blk), qh);
  }
}

uint8_t* qh_q5_0(BlockQ5_0& b) {
  return b.qh;
}
uint8_t* qh_q5_1(BlockQ5_1& b) {
  return b.qh;
}

// Q8_0 and Q8_1 share the canonical activation quantizer; returns the f32 d and sum of q.
float quantize_q8_block(const float* x, uint16_t* d_out, int8_t* qs, int32_t* sum_q) {
  const AbsMax am = abs_max(x, kQK);
  const float d = am.amax / 127.0f;
  const float id = am.amax != 0.0f ? 127.0f / am.amax : 0.0f;
  int32_t s = 0;
  for (int j = 0; j < kQK; ++j) {
    const int q = nearest_int_clamped(x[j] * id, -127, 127);
    qs[j] = static_cast<int8_t>(q);
    s += q;
  }
  *d_out = fp32_to_fp16(d);
  *sum_q = s;
  return d;
}

}  // namespace

// ---------------------------------------------------------------- Q4_0

void to_float_q4_0(const void* x, float* y, int64_t n) {
  const auto* b = static_cast<const BlockQ4_0*>(x);
  for (int64_t i = 0; i < n / kQK; ++i, y += kQK) {
    const float d = h2f(b[i].d);
    for (int j = 0; j < kQK; ++j) y[j] = d * static_cast<float>(nibble(b[i].qs, j) - 8);
  }
}
void from_float_q4_0(const float* x, void* y, int64_t n) {
  quantize_sym<BlockQ4_0>(x, static_cast<BlockQ4_0*>(y), n, 8, nullptr);
}
float vec_dot_q4_0(int64_t n, const void* vw, const void* vx) {
  const auto* w = static_cast<const BlockQ4_0*>(vw);
  const auto* x = static_cast<const BlockQ8_0*>(vx);
  float acc[8] = {};
  for (int64_t b = 0; b < n / kQK; ++b) {
    int32_t lane[8] = {};
    for (int j = 0; j < kQK; ++j) lane[j / 4] += (nibble(w[b].qs, j) - 8) * x[b].qs[j];
    fma_lanes(acc, lane, h2f(w[b].d) * h2f(x[b].d));
  }
  return reduce8(acc);
}

// ---------------------------------------------------------------- Q4_1

void to_float_q4_1(const void* x, float* y, int64_t n) {
  const auto* b = static_cast<const BlockQ4_1*>(x);
  for (int64_t i = 0; i < n / kQK; ++i, y += kQK) {
    const float d = h2f(b[i].d);
    const float m = h2f(b[i].m);
    for (int j = 0; j < kQK; ++j) y[j] = d * static_cast<float>(nibble(b[i].qs, j)) + m;
  }
}
void from_float_q4_1(const float* x, void* y, int64_t n) {
  quantize_minmax<BlockQ4_1>(x, static_cast<BlockQ4_1*>(y), n, 15, nullptr);
}
float vec_dot_q4_1(int64_t n, const void* vw, const void* vx) {
  const auto* w = static_cast<const BlockQ4_1*>(vw);
  const auto* x = static_cast<const BlockQ8_1*>(vx);
  // ggml's x86 order (quant.h): per-lane products fused with dx*dy, the mins summed on the side.
  float acc[8] = {};
  float mins = 0.0f;
  for (int64_t b = 0; b < n / kQK; ++b) {
    int32_t lane[8] = {};
    for (int j = 0; j < kQK; ++j) lane[j / 4] += nibble(w[b].qs, j) * x[b].qs[j];
    mins = std::fmaf(h2f(w[b].m), h2f(x[b].s), mins);
    fma_lanes(acc, lane, h2f(w[b].d) * h2f(x[b].d));
  }
  return reduce8(acc) + mins;
}

// ---------------------------------------------------------------- Q5_0

void to_float_q5_0(const void* x, float* y, int64_t n) {
  const auto* b = static_cast<const BlockQ5_0*>(x);
  for (int64_t i = 0; i < n / kQK; ++i, y += kQK) {
    const float d = h2f(b[i].d);
    const uint32_t qh = load_u32(b[i].qh);
    for (int j = 0; j < kQK; ++j) {
      const int q = nibble(b[i].qs, j) | static_cast<int>(((qh >> j) & 1u) << 4);
      y[j] = d * static_cast<float>(q - 16);
    }
  }
}
void from_float_q5_0(const float* x, void* y, int64_t n) {
  quantize_sym<BlockQ5_0>(x, static_cast<BlockQ5_0*>(y), n, 16, qh_q5_0);
}
float vec_dot_q5_0(int64_t n, const void* vw, const void* vx) {
  const auto* w = static_cast<const BlockQ5_0*>(vw);
  const auto* x = static_cast<const BlockQ8_0*>(vx);
  float acc[8] = {};
  for (int64_t b = 0; b < n / kQK; ++b) {
    const uint32_t qh = load_u32(w[b].qh);
    int32_t lane[8] = {};
    for (int j = 0; j < kQK; ++j) {
      const int q = nibble(w[b].qs, j) | static_cast<int>(((qh >> j) & 1u) << 4);
      lane[j / 4] += (q - 16) * x[b].qs[j];
    }
    fma_lanes(acc, lane, h2f(w[b].d) * h2f(x[b].d));
  }
  return reduce8(acc);
}

// ---------------------------------------------------------------- Q5_1

void to_float_q5_1(const void* x, float* y, int64_t n) {
  const auto* b = static_cast<const BlockQ5_1*>(x);
  for (int64_t i = 0; i < n / kQK; ++i, y += kQK) {
    const float d = h2f(b[i].d);
    const float m = h2f(b[i].m);
    const uint32_t qh = load_u32(b[i].qh);
    for (int j = 0; j < kQK; ++j) {
      const int q = nibble(b[i].qs, j) | static_cast<int>(((qh >> j) & 1u) << 4);
      y[j] = d * static_cast<float>(q) + m;
    }
  }
}
void from_float_q5_1(const float* x, void* y, int64_t n) {
  quantize_minmax<BlockQ5_1>(x, static_cast<BlockQ5_1*>(y), n, 31, qh_q5_1);
}
float vec_dot_q5_1(int64_t n, const void* vw, const void* vx) {
  const auto* w = static_cast<const BlockQ5_1*>(vw);
  const auto* x = static_cast<const BlockQ8_1*>(vx);
  // As Q4_1 (ggml's x86 order).
  float acc[8] = {};
  float mins = 0.0f;
  for (int64_t b = 0; b < n / kQK; ++b) {
    const uint32_t qh = load_u32(w[b].qh);
    int32_t lane[8] = {};
    for (int j = 0; j < kQK; ++j) {
      const int q = nibble(w[b].qs, j) | static_cast<int>(((qh >> j) & 1u) << 4);
      lane[j / 4] += q * x[b].qs[j];
    }
    mins = std::fmaf(h2f(w[b].m), h2f(x[b].s), mins);
    fma_lanes(acc, lane, h2f(w[b].d) * h2f(x[b].d));
  }
  return reduce8(acc) + mins;
}

// ---------------------------------------------------------------- Q8_0 / Q8_1

void to_float_q8_0(const void* x, float* y, int64_t n) {
  const auto* b = static_cast<const BlockQ8_0*>(x);
  for (int64_t i = 0; i < n / kQK; ++i, y += kQK) {
    const float d = h2f(b[i].d);
    for (int j = 0; j < kQK; ++j) y[j] = d * static_cast<float>(b[i].qs[j]);
  }
}
void from_float_q8_0(const float* x, void* y, int64_t n) {
  auto* b = static_cast<BlockQ8_0*>(y);
  for (int64_t i = 0; i < n / kQK; ++i, x += kQK) {
    int32_t sum_q;
    quantize_q8_block(x, &b[i].d, b[i].qs, &sum_q);
  }
}
float vec_dot_q8_0(int64_t n, const void* vw, const void* vx) {
  const auto* w = static_cast<const BlockQ8_0*>(vw);
  const auto* x = static_cast<const BlockQ8_0*>(vx);
  float acc[8] = {};
  for (int64_t b = 0; b < n / kQK; ++b) {
    int32_t lane[8] = {};
    for (int j = 0; j < kQK; ++j) lane[j / 4] += w[b].qs[j] * x[b].qs[j];
    fma_lanes(acc, lane, h2f(w[b].d) * h2f(x[b].d));
  }
  return reduce8(acc);
}

void to_float_q8_1(const void* x, float* y, int64_t n) {
  const auto* b = static_cast<const BlockQ8_1*>(x);
  for (int64_t i = 0; i < n / kQK; ++i, y += kQK) {
    const float d = h2f(b[i].d);
    for (int j = 0; j < kQK; ++j) y[j] = d * static_cast<float>(b[i].qs[j]);
  }
}
void from_float_q8_1(const float* x, void* y, int64_t n) {
  auto* b = static_cast<BlockQ8_1*>(y);
  for (int64_t i = 0; i < n / kQK; ++i, x += kQK) {
    int32_t sum_q;
    const float d = quantize_q8_block(x, &b[i].d, b[i].qs, &sum_q);
    b[i].s = fp32_to_fp16(d * static_cast<float>(sum_q));
  }
}
// Q8_1 is an activation format; as a "weight" it pairs with itself like Q8_0 x Q8_0 (the s field
// is not needed), so every supported type has a dot product.
float vec_dot_q8_1(int64_t n, const void* vw, const void* vx) {
  const auto* w = static_cast<const BlockQ8_1*>(vw);
  const auto* x = static_cast<const BlockQ8_1*>(vx);
  float acc[8] = {};
  for (int64_t b = 0; b < n / kQK; ++b) {
    int32_t lane[8] = {};
    for (int j = 0; j < kQK; ++j) lane[j / 4] += w[b].qs[j] * x[b].qs[j];
    fma_lanes(acc, lane, h2f(w[b].d) * h2f(x[b].d));
  }
  return reduce8(acc);
}

// ---------------------------------------------------------------- IQ4_NL

int iq4_nearest_index(float v) {
  int best = 0;
  float best_err = std::fabs(v - static_cast<float>(k_values_iq4nl[0]));
  for (int k = 1; k < 16; ++k) {
    const float e = std::fabs(v - static_cast<float>(k_values_iq4nl[k]));
    if (e < best_err) {
      best_err = e;
      best = k;
    }
  }
  return best;
}

float iq4_fit_scale(const float* x, int n) {
  const AbsMax am = abs_max(x, n);
  if (am.amax == 0.0f) return 0.0f;
  // Candidates map the largest-magnitude value onto grid points near either end (-127 or +113),
  // then each assignment gets its least-squares scale; the best squared error wins.
  float best_s = am.max / -127.0f;
  double best_err = std::numeric_limits<double>::infinity();
  for (int k = -6; k <= 14; ++k) {
    for (int end = 0; end < 2; ++end) {
      const float target = end == 0 ? -127.0f + 4.0f * static_cast<float>(k) : 113.0f - 4.0f * static_cast<float>(k);
      const float s0 = am.max / target;
      const float is0 = 1.0f / s0;
      double sxt = 0, stt = 0;
      int idx[256];
      for (int j = 0; j < n; ++j) {
        idx[j] = iq4_nearest_index(x[j] * is0);
        const double t = k_values_iq4nl[idx[j]];
        sxt += static_cast<double>(x[j]) * t;
        stt += t * t;
      }
      if (stt <= 0) continue;
      const float s = static_cast<float>(sxt / stt);
      double err = 0;
      for (int j = 0; j < n; ++j) {
        const double e = static_cast<double>(s) * k_values_iq4nl[idx[j]] - x[j];
        err += e * e;
      }
      if (err < best_err) {
        best_err = err;
        best_s = s;
      }
    }
  }
  return best_s;
}

void to_float_iq4_nl(const void* x, float* y, int64_t n) {
  const auto* b = static_cast<const BlockIQ4_NL*>(x);
  for (int64_t i = 0; i < n / kQK; ++i, y += kQK) {
    const float d = h2f(b[i].d);
    for (int j = 0; j < kQK; ++j) y[j] = d * static_cast<float>(k_values_iq4nl[nibble(b[i].qs, j)]);
  }
}
void from_float_iq4_nl(const float* x, void* y, int64_t n) {
  auto* b = static_cast<BlockIQ4_NL*>(y);
  for (int64_t i = 0; i < n / kQK; ++i, x += kQK) {
    std::memset(&b[i], 0, sizeof(b[i]));
    b[i].d = fp32_to_fp16(iq4_fit_scale(x, kQK));
    const float d = h2f(b[i].d);
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    for (int j = 0; j < kQK; ++j) put_nibble(b[i].qs, j, iq4_nearest_index(x[j] * id));
  }
}
float vec_dot_iq4_nl(int64_t n, const void* vw, const void* vx) {
  const auto* w = static_cast<const BlockIQ4_NL*>(vw);
  const auto* x = static_cast<const BlockQ8_0*>(vx);
  float acc[8] = {};
  for (int64_t b = 0; b < n / kQK; ++b) {
    int32_t lane[8] = {};
    for (int j = 0; j < kQK; ++j) lane[j / 4] += k_values_iq4nl[nibble(w[b].qs, j)] * x[b].qs[j];
    fma_lanes(acc, lane, h2f(w[b].d) * h2f(x[b].d));
  }
  return reduce8(acc);
}

// ---------------------------------------------------------------- MXFP4

namespace {

// Nearest doubled-E2M1 code to v (v already divided by the half scale E(e)); 0 for zero.
int mxfp4_nearest_index(float v) {
  int best = 0;
  float best_err = std::fabs(v);
  for (int k = 1; k < 16; ++k) {
    const float e = std::fabs(v - static_cast<float>(k_values_mxfp4[k]));
    if (e < best_err) {
      best_err = e;
      best = k;
    }
  }
  return best;
}

}  // namespace

void to_float_mxfp4(const void* x, float* y, int64_t n) {
  const auto* b = static_cast<const BlockMXFP4*>(x);
  for (int64_t i = 0; i < n / kQK; ++i, y += kQK) {
    const float d = e8m0_to_fp32_half(b[i].e);
    for (int j = 0; j < kQK; ++j) y[j] = d * static_cast<float>(k_values_mxfp4[nibble(b[i].qs, j)]);
  }
}
void from_float_mxfp4(const float* x, void* y, int64_t n) {
  auto* b = static_cast<BlockMXFP4*>(y);
  for (int64_t i = 0; i < n / kQK; ++i, x += kQK) {
    std::memset(&b[i], 0, sizeof(b[i]));
    const AbsMax am = abs_max(x, kQK);
    if (am.amax == 0.0f || !std::isfinite(am.amax)) continue;  // e = 0, all codes 0 -> zeros
    // amax = f * 2^ex with f in [0.5, 1); the largest code (12 * E(e) = 6 * 2^(e-127)) should
    // sit near amax, i.e. e - 127 ~ ex - 3. Try the neighbours and keep the best squared error.
    int ex;
    std::frexp(am.amax, &ex);
    int best_e = 0;
    double best_err = std::numeric_limits<double>::infinity();
    for (int e = ex + 127 - 4; e <= ex + 127 - 1; ++e) {
      if (e < 1 || e > 254) continue;
      const float d = e8m0_to_fp32_half(static_cast<uint8_t>(e));
      double err = 0;
      for (int j = 0; j < kQK; ++j) {
        const int q = mxfp4_nearest_index(x[j] / d);
        const double r = static_cast<double>(d) * k_values_mxfp4[q] - x[j];
        err += r * r;
      }
      if (err < best_err) {
        best_err = err;
        best_e = e;
      }
    }
    b[i].e = static_cast<uint8_t>(best_e);
    const float d = e8m0_to_fp32_half(b[i].e);
    for (int j = 0; j < kQK; ++j) put_nibble(b[i].qs, j, mxfp4_nearest_index(x[j] / d));
  }
}
float vec_dot_mxfp4(int64_t n, const void* vw, const void* vx) {
  const auto* w = static_cast<const BlockMXFP4*>(vw);
  const auto* x = static_cast<const BlockQ8_0*>(vx);
  const int64_t nb = n / kQK;
  // ggml's x86 order (quant.h): blocks in pairs, the even one into acc[0], the odd one into
  // acc[1], 8 lanes each; the two are added lane by lane before reduce8; an odd last block is
  // fused into the sum after that.
  float acc[2][8] = {};
  int64_t b = 0;
  for (; b + 1 < nb; b += 2) {
    for (int k = 0; k < 2; ++k) {
      int32_t lane[8] = {};
      for (int j = 0; j < kQK; ++j) lane[j / 4] += k_values_mxfp4[nibble(w[b + k].qs, j)] * x[b + k].qs[j];
      fma_lanes(acc[k], lane, h2f(x[b + k].d) * e8m0_to_fp32_half(w[b + k].e));
    }
  }
  float both[8];
  for (int l = 0; l < 8; ++l) both[l] = acc[0][l] + acc[1][l];
  float sum = reduce8(both);
  if (b < nb) {
    int32_t isum = 0;
    for (int j = 0; j < kQK; ++j) isum += k_values_mxfp4[nibble(w[b].qs, j)] * x[b].qs[j];
    sum = std::fmaf(h2f(x[b].d) * e8m0_to_fp32_half(w[b].e), static_cast<float>(isum), sum);
  }
  return sum;
}

}  // namespace moesh::quant::ref
