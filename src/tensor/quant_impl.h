// Private to src/tensor: the per-type scalar reference routines behind quant.h's dispatchers,
// and the small numeric helpers that the canonical order (quant.h) is written in.
//
// Every routine here has one of the three KernelTable signatures (kernels.h), so the scalar
// kernel table can point straight at them and SIMD files can fall back to them per type.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "moesh/tensor/fp16.h"
#include "moesh/tensor/kernels.h"
#include "moesh/tensor/quant.h"
#include "moesh/tensor/types.h"

namespace moesh::quant::ref {

// ---- attention (attn_ref.cpp): the scalar AttnKernels and the F32 dot they are made of.
float dot_f32_ggml(const float* k, const float* q, int64_t n);
void attn_scores(const AttnScores& a);
void attn_kqv(const AttnKqv& a);
void softmax(float* x, int64_t n, const float* sink);  // ops.cpp

// The leftovers of ggml_vec_dot_f32 after its vector loop: x[i..n) . y[i..n) added to s as the
// compiler builds ggml's `sumf += x[i]*y[i]`. GCC vectorises that loop with in-order adds: 8
// products at a time, rounded, then each added to the sum in turn (in ggml's AVX-512 build,
// which moesh follows: zmm, then a ymm epilogue; the AVX2 build groups 4, see layers_deltanet.cpp
// dot_f32_ggml_tail_avx2); the last < 8 elements are fused multiply-adds. Seen in ggml's compiled
// vec.cpp and in qwen3next-a.Q4_K_M, whose 32-wide delta-rule dots are all leftovers:
// bit-identical to llama.cpp only this way. Anonymous namespace: each kernel file keeps its own
// copy (simd_x86.h).
namespace {
inline float dot_f32_ggml_tail(const float* x, const float* y, int64_t i, int64_t n, float s) {
  for (; i + 8 <= n; i += 8) {
    float p[8];
    for (int l = 0; l < 8; ++l) p[l] = x[i + l] * y[i + l];
    for (int l = 0; l < 8; ++l) s += p[l];
  }
  for (; i < n; ++i) s = std::fmaf(x[i], y[i], s);
  return s;
}
}  // namespace

// ---- numeric helpers shared by the reference files ----

// Round to nearest, ties to even (under the default FP environment): adding 1.5*2^23 pushes every
// fraction bit out of the mantissa, so the add itself performs the RNE rounding (the idea behind
// ggml's `nearest_int`). Exact for |v| < 2^22; larger magnitudes are already integers (or
// inf/NaN) and pass through. Without -ffast-math the compiler may not fold the add/sub pair.
inline float round_half_even(float v) {
  if (!(std::fabs(v) < 4194304.0f)) return v;
  constexpr float k_magic = 12582912.0f;  // 1.5 * 2^23
  return (v + k_magic) - k_magic;
}

// RNE of v, clamped to [lo, hi] before the integer conversion (NaN -> lo), so no input can make
// the float->int cast undefined.
inline int nearest_int_clamped(float v, int lo, int hi) {
  const float r = round_half_even(v);
  if (!(r >= static_cast<float>(lo))) return lo;
  if (r > static_cast<float>(hi)) return hi;
  return static_cast<int>(r);
}

// The canonical 8-lane reduction of quant.h.
inline float reduce8(const float a[8]) {
  return ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]));
}

// The canonical 32-lane halving reduction of quant.h (modifies a).
inline float reduce32(float a[32]) {
  for (int h = 16; h >= 1; h /= 2) {
    for (int l = 0; l < h; ++l) a[l] += a[l + h];
  }
  return a[0];
}

inline float h2f(uint16_t h) {
  return fp16_to_fp32(h);
}

// The per-lane block step of quant.h (llama.cpp's x86 order): exact int32 lane sums (lane l =
// elements 4l..4l+3 of each 32-element group), each converted to f32 and fused with the block's
// scale into its own accumulator lane.
inline void fma_lanes(float acc[8], const int32_t lane[8], float scale) {
  for (int l = 0; l < 8; ++l) acc[l] = std::fmaf(static_cast<float>(lane[l]), scale, acc[l]);
}

// Q4_K/Q5_K 6-bit scale and min of sub-block s (get_scale_min_k4, docs/background/quant-formats.md §3).
inline void get_scale_min_k4(int s, const uint8_t* b, int* sc, int* m) {
  if (s < 4) {
    *sc = b[s] & 63;
    *m = b[s + 4] & 63;
  } else {
    *sc = (b[s + 4] & 15) | ((b[s - 4] >> 6) << 4);
    *m = (b[s + 4] >> 4) | ((b[s] >> 6) << 4);
  }
}

// Q4_K/Q5_K: eight 6-bit scales and mins from the 12 packed bytes (get_scale_min_k4), as
// {sc0..sc7} and {m0..m7} in two u64 each.
inline void unpack_k4_scales(const uint8_t* b12, uint64_t* sc, uint64_t* m) {
  uint32_t w0, w1, w2;
  std::memcpy(&w0, b12, 4);
  std::memcpy(&w1, b12 + 4, 4);
  std::memcpy(&w2, b12 + 8, 4);
  const uint32_t sc_lo = w0 & 0x3f3f3f3fu;
  const uint32_t m_lo = w1 & 0x3f3f3f3fu;
  const uint32_t sc_hi = (w2 & 0x0f0f0f0fu) | (((w0 >> 6) & 0x03030303u) << 4);
  const uint32_t m_hi = ((w2 >> 4) & 0x0f0f0f0fu) | (((w1 >> 6) & 0x03030303u) << 4);
  *sc = sc_lo | (static_cast<uint64_t>(sc_hi) << 32);
  *m = m_lo | (static_cast<uint64_t>(m_hi) << 32);
}

// Q3_K: the sixteen 6-bit scale codes (0..63, the stored value; the scale is code-32).
inline void unpack_q3k_scales(const uint8_t* b, int out[16]) {
  for (int s = 0; s < 16; ++s) {
    const int lo = (b[s % 8] >> (4 * (s / 8))) & 15;
    const int hi = (b[8 + s % 4] >> (2 * (s / 4))) & 3;
    out[s] = lo | (hi << 4);
  }
}

// IQ4_XS: the 6-bit scale code of 32-element block ib (scale = code-32).
inline int iq4xs_scale_code(const BlockIQ4_XS& b, int ib) {
  return ((b.scales_l[ib / 2] >> (4 * (ib % 2))) & 15) | (((b.scales_h >> (2 * ib)) & 3) << 4);
}

// ---- per-type routines (n is a multiple of the block size; checked by the dispatchers) ----
// to_float_X: dequantize; from_float_X: quantize (the canonical activation quantizer for the
// activation types); vec_dot_X: weight row of X times activation row of vec_dot_type(X).
#define MOESH_QUANT_REF_DECL(name)                            \
  void to_float_##name(const void* x, float* y, int64_t n);   \
  void from_float_##name(const float* x, void* y, int64_t n); \
  float vec_dot_##name(int64_t n, const void* w, const void* x);

MOESH_QUANT_REF_DECL(f32)
MOESH_QUANT_REF_DECL(f16)
MOESH_QUANT_REF_DECL(bf16)
MOESH_QUANT_REF_DECL(q4_0)
MOESH_QUANT_REF_DECL(q4_1)
MOESH_QUANT_REF_DECL(q5_0)
MOESH_QUANT_REF_DECL(q5_1)
MOESH_QUANT_REF_DECL(q8_0)
MOESH_QUANT_REF_DECL(q8_1)
MOESH_QUANT_REF_DECL(iq4_nl)
MOESH_QUANT_REF_DECL(mxfp4)
MOESH_QUANT_REF_DECL(q2_k)
MOESH_QUANT_REF_DECL(q3_k)
MOESH_QUANT_REF_DECL(q4_k)
MOESH_QUANT_REF_DECL(q5_k)
MOESH_QUANT_REF_DECL(q6_k)
MOESH_QUANT_REF_DECL(q8_k)
MOESH_QUANT_REF_DECL(iq4_xs)

#undef MOESH_QUANT_REF_DECL

// IQ4_NL/IQ4_XS share the non-uniform grid search: the scale s (sign included) that best fits
// n values to s*k_values_iq4nl[idx], minimising squared error. Returns 0 for an all-zero input.
float iq4_fit_scale(const float* x, int n);
// Index of the grid value nearest to v (first wins on a tie).
int iq4_nearest_index(float v);

// The reference routines of one type (null where the type lacks the operation).
struct RefKernels {
  ToFloatFn to_float = nullptr;
  FromFloatFn from_float = nullptr;
  VecDotFn vec_dot = nullptr;
};
const RefKernels& ref_kernels(GgmlType t);

}  // namespace moesh::quant::ref
