// Scalar reference for the 256-element super-block formats (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K,
// IQ4_XS): dequantize, quantize, dot product with Q8_K activations.
// Layouts: docs/background/quant-formats.md §3; dot-product float order: the canonical order in quant.h.
//
// The weight quantizers are our own (not llama.cpp's bit patterns): per sub-block a small search
// over candidate scales, each refined by least squares, keeping the smallest squared error; then
// the sub-block scales are quantized relative to the super-block d (and dmin), and the values are
// requantized with the scales exactly as they will be dequantized.
#include <algorithm>
#include <cmath>
#include <limits>

#include "tensor/quant_impl.h"

namespace moesh::quant::ref {
namespace {

// Fits x[0..n) ≈ s*q - m with integer q in [0, nmax], s >= 0 and m >= 0 (the min is never above
// zero, as in ggml, so an all-positive block still reaches its small values). Returns s and m.
void fit_scale_min(const float* x, int n, int nmax, float* s_out, float* m_out) {
  float mn = 0.0f, mx = -std::numeric_limits<float>::infinity();
  for (int j = 0; j < n; ++j) {
    mn = std::min(mn, x[j]);
    mx = std::max(mx, x[j]);
  }
  if (!(mx > mn)) {  // constant block (<= 0): all q = 0, value = -m
    *s_out = 0.0f;
    *m_out = -mn;
    return;
  }
  float best_s = (mx - mn) / static_cast<float>(nmax);
  float best_b = mn;
  double best_err = std::numeric_limits<double>::infinity();
  int q[32];
  for (int k = -1; k <= 20; ++k) {
    // k == -1: the plain min/max grid; otherwise stretch the grid around nmax and refit.
    const float iscale = k < 0 ? static_cast<float>(nmax) / (mx - mn)
                               : (static_cast<float>(nmax) - 1.0f + 0.1f * static_cast<float>(k)) / (mx - mn);
    double sq = 0, sq2 = 0, sx = 0, sqx = 0;
    for (int j = 0; j < n; ++j) {
      q[j] = nearest_int_clamped(iscale * (x[j] - mn), 0, nmax);
      sq += q[j];
      sq2 += static_cast<double>(q[j]) * q[j];
      sx += x[j];
      sqx += static_cast<double>(q[j]) * x[j];
    }
    // Least squares for x ≈ s*q + b, with b clamped to <= 0.
    double s, b;
    const double det = n * sq2 - sq * sq;
    if (det > 0) {
      s = (n * sqx - sq * sx) / det;
      b = (sq2 * sx - sq * sqx) / det;
      if (b > 0) {
        b = 0;
        s = sqx / sq2;
      }
    } else {
      continue;
    }
    if (s < 0) continue;
    double err = 0;
    for (int j = 0; j < n; ++j) {
      const double e = s * q[j] + b - x[j];
      err += e * e;
    }
    if (err < best_err) {
      best_err = err;
      best_s = static_cast<float>(s);
      best_b = static_cast<float>(b);
    }
  }
  *s_out = best_s;
  *m_out = -best_b;
}

// Fits x[0..n) ≈ s*q with integer q in [-nneg, npos]; the sign of s is free, so the value of
// largest magnitude can use the longer (negative) side of the range. Returns 0 for all zeros.
float fit_scale_sym(const float* x, int n, int nneg, int npos) {
  float amax = 0.0f, max = 0.0f;
  for (int j = 0; j < n; ++j) {
    if (std::fabs(x[j]) > amax) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  }
  if (amax == 0.0f) return 0.0f;
  float best_s = max / static_cast<float>(-nneg);
  double best_err = std::numeric_limits<double>::infinity();
  for (int k = -8; k <= 8; ++k) {
    const float iscale =
        -(static_cast<float>(nneg) + 0.1f * static_cast<float>(nneg) * 0.25f * static_cast<float>(k)) / max;
    double sqx = 0, sq2 = 0;
    int q[32];
    for (int j = 0; j < n; ++j) {
      q[j] = nearest_int_clamped(iscale * x[j], -nneg, npos);
      sqx += static_cast<double>(q[j]) * x[j];
      sq2 += static_cast<double>(q[j]) * q[j];
    }
    if (sq2 <= 0) continue;
    const double s = sqx / sq2;
    double err = 0;
    for (int j = 0; j < n; ++j) {
      const double e = s * q[j] - x[j];
      err += e * e;
    }
    if (err < best_err) {
      best_err = err;
      best_s = static_cast<float>(s);
    }
  }
  return best_s;
}

// Quantizes sub-block scales v[0..n) (all >= 0) to codes in [0, cmax] relative to the stored
// f16 super-scale, which is returned (f16 bits).
uint16_t quantize_unsigned_scales(const float* v, int n, int cmax, int* code) {
  float vmax = 0.0f;
  for (int i = 0; i < n; ++i) vmax = std::max(vmax, v[i]);
  const uint16_t dh = fp32_to_fp16(vmax / static_cast<float>(cmax));
  const float d = h2f(dh);
  const float id = d > 0.0f ? 1.0f / d : 0.0f;
  for (int i = 0; i < n; ++i) code[i] = nearest_int_clamped(v[i] * id, 0, cmax);
  return dh;
}

// Signed sub-block scales to codes in [-cneg, cpos]: the largest-magnitude scale maps to -cneg.
uint16_t quantize_signed_scales(const float* v, int n, int cneg, int cpos, int* code) {
  float amax = 0.0f, max = 0.0f;
  for (int i = 0; i < n; ++i) {
    if (std::fabs(v[i]) > amax) {
      amax = std::fabs(v[i]);
      max = v[i];
    }
  }
  const uint16_t dh = fp32_to_fp16(max / static_cast<float>(-cneg));
  const float d = h2f(dh);
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  for (int i = 0; i < n; ++i) code[i] = nearest_int_clamped(v[i] * id, -cneg, cpos);
  return dh;
}

// Q4_K/Q5_K: 8 sub-blocks of 32 with 6-bit scale and min; fills d, dmin, scales[12] and q[256]
// (0..nmax, as dequantized with the stored scales).
void quantize_k_asym(const float* x, int nmax, uint16_t* d_out, uint16_t* dmin_out, uint8_t scales[12], int q[256]) {
  float s[8], m[8];
  for (int i = 0; i < 8; ++i) fit_scale_min(x + 32 * i, 32, nmax, &s[i], &m[i]);
  int sc[8], mc[8];
  *d_out = quantize_unsigned_scales(s, 8, 63, sc);
  *dmin_out = quantize_unsigned_scales(m, 8, 63, mc);
  std::memset(scales, 0, 12);
  for (int j = 0; j < 8; ++j) {
    if (j < 4) {
      scales[j] = static_cast<uint8_t>(sc[j]);
      scales[j + 4] = static_cast<uint8_t>(mc[j]);
    } else {
      scales[j + 4] = static_cast<uint8_t>((sc[j] & 15) | ((mc[j] & 15) << 4));
      scales[j - 4] |= static_cast<uint8_t>((sc[j] >> 4) << 6);
      scales[j] |= static_cast<uint8_t>((mc[j] >> 4) << 6);
    }
  }
  const float d = h2f(*d_out), dmin = h2f(*dmin_out);
  for (int j = 0; j < 8; ++j) {
    int scj, mj;
    get_scale_min_k4(j, scales, &scj, &mj);
    const float ds = d * static_cast<float>(scj);
    const float dm = dmin * static_cast<float>(mj);
    const float ids = ds != 0.0f ? 1.0f / ds : 0.0f;
    for (int l = 0; l < 32; ++l) q[32 * j + l] = nearest_int_clamped((x[32 * j + l] + dm) * ids, 0, nmax);
  }
}

// Q4_K/Q5_K dot-product core (llama.cpp's x86 order, quant.h): 4/5-bit values q[256] of one
// super-block against Q8_K. lane[l] collects sc * q * q8 of the elements with (n % 32) / 4 == l;
// the mins go to 4 lanes, lane i = m(2i) * sum32(2i) + m(2i+1) * sum32(2i+1), where sum32(s) is
// the Q8_K sum over sub-block s.
struct KAsymLanes {
  int32_t lane[8] = {};
  int32_t min_lane[4] = {};
};
KAsymLanes k_asym_lanes(const int q[256], const uint8_t scales[12], const BlockQ8_K& y) {
  KAsymLanes r;
  for (int s = 0; s < 8; ++s) {
    int sc, m;
    get_scale_min_k4(s, scales, &sc, &m);
    for (int l = 0; l < 32; ++l) r.lane[l / 4] += sc * q[32 * s + l] * y.qs[32 * s + l];
    r.min_lane[s / 2] += m * (y.bsums[2 * s] + y.bsums[2 * s + 1]);
  }
  return r;
}

// Q4_K element values (0..15) in natural order.
void unpack_q4_k(const BlockQ4_K& b, int q[256]) {
  for (int c = 0; c < 4; ++c) {
    for (int l = 0; l < 32; ++l) {
      q[64 * c + l] = b.qs[32 * c + l] & 15;
      q[64 * c + 32 + l] = b.qs[32 * c + l] >> 4;
    }
  }
}

void unpack_q5_k(const BlockQ5_K& b, int q[256]) {
  for (int c = 0; c < 4; ++c) {
    for (int l = 0; l < 32; ++l) {
      q[64 * c + l] = (b.qs[32 * c + l] & 15) | (((b.qh[l] >> (2 * c)) & 1) << 4);
      q[64 * c + 32 + l] = (b.qs[32 * c + l] >> 4) | (((b.qh[l] >> (2 * c + 1)) & 1) << 4);
    }
  }
}

// Q2_K values (0..3), Q3_K values (-4..3), Q6_K values (-32..31), natural order.
void unpack_q2_k(const BlockQ2_K& b, int q[256]) {
  for (int n = 0; n < 256; ++n) {
    const int h = n / 128, j = (n / 32) % 4, l = n % 32;
    q[n] = (b.qs[32 * h + l] >> (2 * j)) & 3;
  }
}

void unpack_q3_k(const BlockQ3_K& b, int q[256]) {
  for (int n = 0; n < 256; ++n) {
    const int h = n / 128, j = (n / 32) % 4, l = n % 32;
    const int lo = (b.qs[32 * h + l] >> (2 * j)) & 3;
    q[n] = lo - (((b.hmask[l] >> (4 * h + j)) & 1) ? 0 : 4);
  }
}

void unpack_q6_k(const BlockQ6_K& b, int q[256]) {
  for (int h = 0; h < 2; ++h) {
    const uint8_t* L = b.ql + 64 * h;
    const uint8_t* H = b.qh + 32 * h;
    for (int l = 0; l < 32; ++l) {
      q[128 * h + l] = ((L[l] & 15) | (((H[l] >> 0) & 3) << 4)) - 32;
      q[128 * h + l + 32] = ((L[l + 32] & 15) | (((H[l] >> 2) & 3) << 4)) - 32;
      q[128 * h + l + 64] = ((L[l] >> 4) | (((H[l] >> 4) & 3) << 4)) - 32;
      q[128 * h + l + 96] = ((L[l + 32] >> 4) | (((H[l] >> 6) & 3) << 4)) - 32;
    }
  }
}

// sum_i scale[i/16] * q[i] * y[i] in the 8 canonical lanes (quant.h): element i goes to lane (i % 32) / 4.
void lanes_by16(const int q[256], const int scale[16], const BlockQ8_K& y, int32_t lane[8]) {
  for (int l = 0; l < 8; ++l) lane[l] = 0;
  for (int i = 0; i < 256; ++i) lane[(i % 32) / 4] += scale[i / 16] * q[i] * y.qs[i];
}

}  // namespace

// ---------------------------------------------------------------- Q2_K

void to_float_q2_k(const void* x, float* y, int64_t n) {
  const auto* b = static_cast<const BlockQ2_K*>(x);
  int q[256];
  for (int64_t i = 0; i < n / kQKK; ++i, y += kQKK) {
    const float d = h2f(b[i].d), dmin = h2f(b[i].dmin);
    unpack_q2_k(b[i], q);
    for (int g = 0; g < 16; ++g) {
      const float dl = d * static_cast<float>(b[i].scales[g] & 15);
      const float ml = dmin * static_cast<float>(b[i].scales[g] >> 4);
      for (int l = 0; l < 16; ++l) y[16 * g + l] = dl * static_cast<float>(q[16 * g + l]) - ml;
    }
  }
}
void from_float_q2_k(const float* x, void* y, int64_t n) {
  auto* b = static_cast<BlockQ2_K*>(y);
  for (int64_t i = 0; i < n / kQKK; ++i, x += kQKK) {
    BlockQ2_K& blk = b[i];
    std::memset(&blk, 0, sizeof(blk));
    float s[16], m[16];
    for (int g = 0; g < 16; ++g) fit_scale_min(x + 16 * g, 16, 3, &s[g], &m[g]);
    int sc[16], mc[16];
    blk.d = quantize_unsigned_scales(s, 16, 15, sc);
    blk.dmin = quantize_unsigned_scales(m, 16, 15, mc);
    const float d = h2f(blk.d), dmin = h2f(blk.dmin);
    for (int g = 0; g < 16; ++g) {
      blk.scales[g] = static_cast<uint8_t>(sc[g] | (mc[g] << 4));
      const float dl = d * static_cast<float>(sc[g]);
      const float ml = dmin * static_cast<float>(mc[g]);
      const float idl = dl != 0.0f ? 1.0f / dl : 0.0f;
      for (int l = 0; l < 16; ++l) {
        const int nn = 16 * g + l;
        const int q = nearest_int_clamped((x[nn] + ml) * idl, 0, 3);
        const int h = nn / 128, j = (nn / 32) % 4, ll = nn % 32;
        blk.qs[32 * h + ll] |= static_cast<uint8_t>(q << (2 * j));
      }
    }
  }
}
float vec_dot_q2_k(int64_t n, const void* vw, const void* vx) {
  const auto* w = static_cast<const BlockQ2_K*>(vw);
  const auto* x = static_cast<const BlockQ8_K*>(vx);
  // ggml's x86 order (quant.h): per super-block the mins first, as 8 lanes
  // m[2l]*bsums[2l] + m[2l+1]*bsums[2l+1] times -(dy*dmin), then the 8 canonical lanes times dy*d.
  float acc[8] = {};
  int q[256], sc[16];
  for (int64_t b = 0; b < n / kQKK; ++b) {
    unpack_q2_k(w[b], q);
    int32_t mins[8] = {};
    for (int g = 0; g < 16; ++g) {
      sc[g] = w[b].scales[g] & 15;
      mins[g / 2] += x[b].bsums[g] * (w[b].scales[g] >> 4);
    }
    fma_lanes(acc, mins, -(x[b].d * h2f(w[b].dmin)));
    int32_t lane[8];
    lanes_by16(q, sc, x[b], lane);
    fma_lanes(acc, lane, x[b].d * h2f(w[b].d));
  }
  return reduce8(acc);
}

// ---------------------------------------------------------------- Q3_K

void to_float_q3_k(const void* x, float* y, int64_t n) {
  const auto* b = static_cast<const BlockQ3_K*>(x);
  int q[256], S[16];
  for (int64_t i = 0; i < n / kQKK; ++i, y += kQKK) {
    const float d = h2f(b[i].d);
    unpack_q3_k(b[i], q);
    unpack_q3k_scales(b[i].scales, S);
    for (int g = 0; g < 16; ++g) {
      const float dl = d * static_cast<float>(S[g] - 32);
      for (int l = 0; l < 16; ++l) y[16 * g + l] = dl * static_cast<float>(q[16 * g + l]);
    }
  }
}
void from_float_q3_k(const float* x, void* y, int64_t n) {
  auto* b = static_cast<BlockQ3_K*>(y);
  for (int64_t i = 0; i < n / kQKK; ++i, x += kQKK) {
    BlockQ3_K& blk = b[i];
    std::memset(&blk, 0, sizeof(blk));
    float s[16];
    for (int g = 0; g < 16; ++g) s[g] = fit_scale_sym(x + 16 * g, 16, 4, 3);
    int sc[16];
    blk.d = quantize_signed_scales(s, 16, 32, 31, sc);
    const float d = h2f(blk.d);
    for (int g = 0; g < 16; ++g) {
      const int u = sc[g] + 32;  // stored code 0..63
      blk.scales[g % 8] |= static_cast<uint8_t>((u & 15) << (4 * (g / 8)));
      blk.scales[8 + g % 4] |= static_cast<uint8_t>((u >> 4) << (2 * (g / 4)));
      const float dl = d * static_cast<float>(sc[g]);
      const float idl = dl != 0.0f ? 1.0f / dl : 0.0f;
      for (int l = 0; l < 16; ++l) {
        const int nn = 16 * g + l;
        const int v = nearest_int_clamped(x[nn] * idl, -4, 3) + 4;  // 0..7
        const int h = nn / 128, j = (nn / 32) % 4, ll = nn % 32;
        blk.qs[32 * h + ll] |= static_cast<uint8_t>((v & 3) << (2 * j));
        if (v & 4) blk.hmask[ll] |= static_cast<uint8_t>(1u << (4 * h + j));
      }
    }
  }
}
float vec_dot_q3_k(int64_t n, const void* vw, const void* vx) {
  const auto* w = static_cast<const BlockQ3_K*>(vw);
  const auto* x = static_cast<const BlockQ8_K*>(vx);
  float acc[8] = {};
  int q[256], S[16];
  for (int64_t b = 0; b < n / kQKK; ++b) {
    unpack_q3_k(w[b], q);
    unpack_q3k_scales(w[b].scales, S);
    for (int g = 0; g < 16; ++g) S[g] -= 32;
    int32_t lane[8];
    lanes_by16(q, S, x[b], lane);
    fma_lanes(acc, lane, h2f(w[b].d) * x[b].d);
  }
  return reduce8(acc);
}

// ---------------------------------------------------------------- Q4_K

void to_float_q4_k(const void* x, float* y, int64_t n) {
  const auto* b = static_cast<const BlockQ4_K*>(x);
  int q[256];
  for (int64_t i = 0; i < n / kQKK; ++i, y += kQKK) {
    const float d = h2f(b[i].d), dmin = h2f(b[i].dmin);
    unpack_q4_k(b[i], q);
    for (int s = 0; s < 8; ++s) {
      int sc, m;
      get_scale_min_k4(s, b[i].scales, &sc, &m);
      const float ds = d * static_cast<float>(sc);
      const float dm = dmin * static_cast<float>(m);
      for (int l = 0; l < 32; ++l) y[32 * s + l] = ds * static_cast<float>(q[32 * s + l]) - dm;
    }
  }
}
void from_float_q4_k(const float* x, void* y, int64_t n) {
  auto* b = static_cast<BlockQ4_K*>(y);
  int q[256];
  for (int64_t i = 0; i < n / kQKK; ++i, x += kQKK) {
    BlockQ4_K& blk = b[i];
    std::memset(&blk, 0, sizeof(blk));
    quantize_k_asym(x, 15, &blk.d, &blk.dmin, blk.scales, q);
    for (int c = 0; c < 4; ++c) {
      for (int l = 0; l < 32; ++l) {
        blk.qs[32 * c + l] = static_cast<uint8_t>(q[64 * c + l] | (q[64 * c + 32 + l] << 4));
      }
    }
  }
}
float vec_dot_q4_k(int64_t n, const void* vw, const void* vx) {
  const auto* w = static_cast<const BlockQ4_K*>(vw);
  const auto* x = static_cast<const BlockQ8_K*>(vx);
  float acc[8] = {};
  float acc_m[4] = {};
  int q[256];
  for (int64_t b = 0; b < n / kQKK; ++b) {
    unpack_q4_k(w[b], q);
    const KAsymLanes r = k_asym_lanes(q, w[b].scales, x[b]);
    fma_lanes(acc, r.lane, h2f(w[b].d) * x[b].d);
    const float dmin = -(h2f(w[b].dmin) * x[b].d);
    for (int i = 0; i < 4; ++i) acc_m[i] = std::fmaf(static_cast<float>(r.min_lane[i]), dmin, acc_m[i]);
  }
  return reduce8(acc) + ((acc_m[0] + acc_m[2]) + (acc_m[1] + acc_m[3]));
}

// ---------------------------------------------------------------- Q5_K

void to_float_q5_k(const void* x, float* y, int64_t n) {
  const auto* b = static_cast<const BlockQ5_K*>(x);
  int q[256];
  for (int64_t i = 0; i < n / kQKK; ++i, y += kQKK) {
    const float d = h2f(b[i].d), dmin = h2f(b[i].dmin);
    unpack_q5_k(b[i], q);
    for (int s = 0; s < 8; ++s) {
      int sc, m;
      get_scale_min_k4(s, b[i].scales, &sc, &m);
      const float ds = d * static_cast<float>(sc);
      const float dm = dmin * static_cast<float>(m);
      for (int l = 0; l < 32; ++l) y[32 * s + l] = ds * static_cast<float>(q[32 * s + l]) - dm;
    }
  }
}
void from_float_q5_k(const float* x, void* y, int64_t n) {
  auto* b = static_cast<BlockQ5_K*>(y);
  int q[256];
  for (int64_t i = 0; i < n / kQKK; ++i, x += kQKK) {
    BlockQ5_K& blk = b[i];
    std::memset(&blk, 0, sizeof(blk));
    quantize_k_asym(x, 31, &blk.d, &blk.dmin, blk.scales, q);
    for (int c = 0; c < 4; ++c) {
      for (int l = 0; l < 32; ++l) {
        const int lo = q[64 * c + l], hi = q[64 * c + 32 + l];
        blk.qs[32 * c + l] = static_cast<uint8_t>((lo & 15) | ((hi & 15) << 4));
        blk.qh[l] |= static_cast<uint8_t>(((lo >> 4) << (2 * c)) | ((hi >> 4) << (2 * c + 1)));
      }
    }
  }
}
float vec_dot_q5_k(int64_t n, const void* vw, const void* vx) {
  const auto* w = static_cast<const BlockQ5_K*>(vw);
  const auto* x = static_cast<const BlockQ8_K*>(vx);
  float acc[8] = {};
  float summs = 0.0f;
  int q[256];
  for (int64_t b = 0; b < n / kQKK; ++b) {
    unpack_q5_k(w[b], q);
    const KAsymLanes r = k_asym_lanes(q, w[b].scales, x[b]);
    fma_lanes(acc, r.lane, h2f(w[b].d) * x[b].d);
    const int32_t mins = (r.min_lane[0] + r.min_lane[1]) + (r.min_lane[2] + r.min_lane[3]);
    summs = std::fmaf(static_cast<float>(mins), -(h2f(w[b].dmin) * x[b].d), summs);
  }
  return reduce8(acc) + summs;
}

// ---------------------------------------------------------------- Q6_K

void to_float_q6_k(const void* x, float* y, int64_t n) {
  const auto* b = static_cast<const BlockQ6_K*>(x);
  int q[256];
  for (int64_t i = 0; i < n / kQKK; ++i, y += kQKK) {
    const float d = h2f(b[i].d);
    unpack_q6_k(b[i], q);
    for (int g = 0; g < 16; ++g) {
      const float dl = d * static_cast<float>(b[i].scales[g]);
      for (int l = 0; l < 16; ++l) y[16 * g + l] = dl * static_cast<float>(q[16 * g + l]);
    }
  }
}
void from_float_q6_k(const float* x, void* y, int64_t n) {
  auto* b = static_cast<BlockQ6_K*>(y);
  for (int64_t i = 0; i < n / kQKK; ++i, x += kQKK) {
    BlockQ6_K& blk = b[i];
    std::memset(&blk, 0, sizeof(blk));
    float s[16];
    for (int g = 0; g < 16; ++g) s[g] = fit_scale_sym(x + 16 * g, 16, 32, 31);
    int sc[16];
    blk.d = quantize_signed_scales(s, 16, 128, 127, sc);
    const float d = h2f(blk.d);
    int u[256];  // stored 6-bit codes, q + 32
    for (int g = 0; g < 16; ++g) {
      blk.scales[g] = static_cast<int8_t>(sc[g]);
      const float dl = d * static_cast<float>(sc[g]);
      const float idl = dl != 0.0f ? 1.0f / dl : 0.0f;
      for (int l = 0; l < 16; ++l) u[16 * g + l] = nearest_int_clamped(x[16 * g + l] * idl, -32, 31) + 32;
    }
    for (int h = 0; h < 2; ++h) {
      uint8_t* L = blk.ql + 64 * h;
      uint8_t* H = blk.qh + 32 * h;
      const int* v = u + 128 * h;
      for (int l = 0; l < 32; ++l) {
        L[l] = static_cast<uint8_t>((v[l] & 15) | ((v[l + 64] & 15) << 4));
        L[l + 32] = static_cast<uint8_t>((v[l + 32] & 15) | ((v[l + 96] & 15) << 4));
        H[l] = static_cast<uint8_t>((v[l] >> 4) | ((v[l + 32] >> 4) << 2) | ((v[l + 64] >> 4) << 4) |
                                    ((v[l + 96] >> 4) << 6));
      }
    }
  }
}
float vec_dot_q6_k(int64_t n, const void* vw, const void* vx) {
  const auto* w = static_cast<const BlockQ6_K*>(vw);
  const auto* x = static_cast<const BlockQ8_K*>(vx);
  float acc[8] = {};
  int q[256], sc[16];
  for (int64_t b = 0; b < n / kQKK; ++b) {
    unpack_q6_k(w[b], q);
    for (int g = 0; g < 16; ++g) sc[g] = w[b].scales[g];
    // ggml's order (x86 quants.c since llama.cpp PR 22345): the unsigned 6-bit values (q + 32)
    // times y go to lane (i % 32) / 4; the -32 offset is then taken off per lane from the
    // activation's 16-value sums, lane l holding groups 2l and 2l+1. Same integer total as
    // (q - 32) * y per element, other lanes, so other float roundings.
    int32_t lane[8] = {};
    for (int i = 0; i < 256; ++i) lane[(i % 32) / 4] += sc[i / 16] * (q[i] + 32) * x[b].qs[i];
    for (int l = 0; l < 8; ++l) {
      lane[l] -= 32 * (x[b].bsums[2 * l] * sc[2 * l] + x[b].bsums[2 * l + 1] * sc[2 * l + 1]);
    }
    fma_lanes(acc, lane, h2f(w[b].d) * x[b].d);
  }
  return reduce8(acc);
}

// ---------------------------------------------------------------- Q8_K

void to_float_q8_k(const void* x, float* y, int64_t n) {
  const auto* b = static_cast<const BlockQ8_K*>(x);
  for (int64_t i = 0; i < n / kQKK; ++i, y += kQKK) {
    for (int j = 0; j < kQKK; ++j) y[j] = b[i].d * static_cast<float>(b[i].qs[j]);
  }
}
void from_float_q8_k(const float* x, void* y, int64_t n) {
  auto* b = static_cast<BlockQ8_K*>(y);
  for (int64_t i = 0; i < n / kQKK; ++i, x += kQKK) {
    BlockQ8_K& blk = b[i];
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < kQKK; ++j) {
      const float ax = std::fabs(x[j]);
      if (ax > amax) {
        amax = ax;
        max = x[j];
      }
    }
    if (amax == 0.0f) {
      std::memset(&blk, 0, sizeof(blk));
      continue;
    }
    const float iscale = -127.0f / max;
    for (int j = 0; j < kQKK; ++j) {
      // The lower clamp never binds (|iscale*x| <= 127 up to rounding); it only keeps the cast
      // defined. The upper one is ggml's MIN(127, ...).
      blk.qs[j] = static_cast<int8_t>(nearest_int_clamped(iscale * x[j], -128, 127));
    }
    for (int g = 0; g < 16; ++g) {
      int32_t s = 0;
      for (int l = 0; l < 16; ++l) s += blk.qs[16 * g + l];
      blk.bsums[g] = static_cast<int16_t>(s);
    }
    blk.d = 1.0f / iscale;
  }
}
float vec_dot_q8_k(int64_t n, const void* vw, const void* vx) {
  const auto* w = static_cast<const BlockQ8_K*>(vw);
  const auto* x = static_cast<const BlockQ8_K*>(vx);
  float acc[8] = {};
  for (int64_t b = 0; b < n / kQKK; ++b) {
    int32_t isum = 0;
    for (int j = 0; j < kQKK; ++j) isum += w[b].qs[j] * x[b].qs[j];
    acc[b % 8] = std::fmaf(static_cast<float>(isum), w[b].d * x[b].d, acc[b % 8]);
  }
  return reduce8(acc);
}

// ---------------------------------------------------------------- IQ4_XS

void to_float_iq4_xs(const void* x, float* y, int64_t n) {
  const auto* b = static_cast<const BlockIQ4_XS*>(x);
  for (int64_t i = 0; i < n / kQKK; ++i, y += kQKK) {
    const float d = h2f(b[i].d);
    for (int ib = 0; ib < 8; ++ib) {
      const float dl = d * static_cast<float>(iq4xs_scale_code(b[i], ib) - 32);
      const uint8_t* qs = b[i].qs + 16 * ib;
      for (int j = 0; j < 16; ++j) {
        y[32 * ib + j] = dl * static_cast<float>(k_values_iq4nl[qs[j] & 15]);
        y[32 * ib + j + 16] = dl * static_cast<float>(k_values_iq4nl[qs[j] >> 4]);
      }
    }
  }
}
void from_float_iq4_xs(const float* x, void* y, int64_t n) {
  auto* b = static_cast<BlockIQ4_XS*>(y);
  for (int64_t i = 0; i < n / kQKK; ++i, x += kQKK) {
    BlockIQ4_XS& blk = b[i];
    std::memset(&blk, 0, sizeof(blk));
    float s[8];
    for (int ib = 0; ib < 8; ++ib) s[ib] = iq4_fit_scale(x + 32 * ib, 32);
    int sc[8];
    blk.d = quantize_signed_scales(s, 8, 32, 31, sc);
    const float d = h2f(blk.d);
    for (int ib = 0; ib < 8; ++ib) {
      const int u = sc[ib] + 32;
      blk.scales_l[ib / 2] |= static_cast<uint8_t>((u & 15) << (4 * (ib % 2)));
      blk.scales_h = static_cast<uint16_t>(blk.scales_h | ((u >> 4) << (2 * ib)));
      const float dl = d * static_cast<float>(sc[ib]);
      const float idl = dl != 0.0f ? 1.0f / dl : 0.0f;
      for (int j = 0; j < 16; ++j) {
        const int lo = iq4_nearest_index(x[32 * ib + j] * idl);
        const int hi = iq4_nearest_index(x[32 * ib + j + 16] * idl);
        blk.qs[16 * ib + j] = static_cast<uint8_t>(lo | (hi << 4));
      }
    }
  }
}
float vec_dot_iq4_xs(int64_t n, const void* vw, const void* vx) {
  const auto* w = static_cast<const BlockIQ4_XS*>(vw);
  const auto* x = static_cast<const BlockQ8_K*>(vx);
  float acc[8] = {};
  for (int64_t b = 0; b < n / kQKK; ++b) {
    // Sub-block ib holds elements 32ib + j (low nibble of qs[j]) and 32ib + 16 + j (high nibble).
    int32_t lane[8] = {};
    for (int ib = 0; ib < 8; ++ib) {
      const uint8_t* qs = w[b].qs + 16 * ib;
      const int8_t* q8 = x[b].qs + 32 * ib;
      const int ls = iq4xs_scale_code(w[b], ib) - 32;
      for (int j = 0; j < 16; ++j) {
        lane[j / 4] += ls * k_values_iq4nl[qs[j] & 15] * q8[j];
        lane[4 + j / 4] += ls * k_values_iq4nl[qs[j] >> 4] * q8[j + 16];
      }
    }
    fma_lanes(acc, lane, h2f(w[b].d) * x[b].d);
  }
  return reduce8(acc);
}

}  // namespace moesh::quant::ref
