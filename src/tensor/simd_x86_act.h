// x86 SIMD activation converters (from_float), row wideners (to_float) and the F32/F16/BF16
// dot products, bit-identical to the scalar reference (canonical order in quant.h).
// Included only by kernels_avx2.cpp / kernels_avx512.cpp (see simd_x86.h).
#pragma once

#include "simd_x86.h"

namespace moesh::simd {
namespace {

// ---------------------------------------------------------------- from_float

// RNE of v clamped to [lo, hi], NaN -> lo: the reference's nearest_int_clamped, so non-finite
// activations (NaN, x*0 for x = inf) give the reference's bytes, not cvtps's INT_MIN.
inline __m256i nearest_clamped(__m256 v, float lo, float hi) {
  const __m256 r = _mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256 l = _mm256_blendv_ps(_mm256_set1_ps(lo), r, _mm256_cmp_ps(r, _mm256_set1_ps(lo), _CMP_GE_OQ));
  return _mm256_cvtps_epi32(_mm256_min_ps(l, _mm256_set1_ps(hi)));
}

// Q8_0 block: amax, d = amax/127 (stored f16), id = 127/amax, q = RNE(x*id).
// Writes qs/d, leaves the int32 q in q[4] and returns the unrounded f32 d (Q8_1 needs both).
inline float quantize_q8_0_block(const float* x, uint16_t* d_out, int8_t* qs, __m256i q[4]) {
  __m256 v[4];
  __m256 vmax = _mm256_setzero_ps();
  for (int k = 0; k < 4; ++k) {
    v[k] = _mm256_loadu_ps(x + 8 * k);
    vmax = _mm256_max_ps(abs_ps(v[k]), vmax);
  }
  const float amax = hmax_ps(vmax);
  const float d = amax / 127.0f;
  const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
  *d_out = _cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT);
  const __m256 vid = _mm256_set1_ps(id);
  for (int k = 0; k < 4; ++k) q[k] = nearest_clamped(_mm256_mul_ps(v[k], vid), -127.0f, 127.0f);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(qs), pack_i32x32_to_i8(q[0], q[1], q[2], q[3]));
  return d;
}

void from_float_q8_0(const float* x, void* vy, int64_t n) {
  auto* y = static_cast<BlockQ8_0*>(vy);
  __m256i q[4];
  for (int64_t b = 0; b < n / kQK; ++b) quantize_q8_0_block(x + b * kQK, &y[b].d, y[b].qs, q);
}

void from_float_q8_1(const float* x, void* vy, int64_t n) {
  auto* y = static_cast<BlockQ8_1*>(vy);
  __m256i q[4];
  for (int64_t b = 0; b < n / kQK; ++b) {
    // s = f16(d * sum q) with the unrounded f32 d.
    const float d = quantize_q8_0_block(x + b * kQK, &y[b].d, y[b].qs, q);
    const int sum = hsum_i32(_mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3])));
    y[b].s = _cvtss_sh(d * static_cast<float>(sum), _MM_FROUND_TO_NEAREST_INT);
  }
}

void from_float_q8_k(const float* x, void* vy, int64_t n) {
  auto* y = static_cast<BlockQ8_K*>(vy);
  for (int64_t b = 0; b < n / kQKK; ++b, x += kQKK) {
    __m256 vmax = _mm256_setzero_ps();
    for (int k = 0; k < 32; ++k) vmax = _mm256_max_ps(abs_ps(_mm256_loadu_ps(x + 8 * k)), vmax);
    const float amax = hmax_ps(vmax);
    if (amax == 0.0f) {
      std::memset(&y[b], 0, sizeof(BlockQ8_K));
      continue;
    }
    // The signed value of the first element whose |x| is the maximum (strict '>' in the scan).
    float max = 0.0f;
    const __m256 vam = _mm256_set1_ps(amax);
    for (int k = 0; k < 32; ++k) {
      const int m = _mm256_movemask_ps(_mm256_cmp_ps(abs_ps(_mm256_loadu_ps(x + 8 * k)), vam, _CMP_EQ_OQ));
      if (m != 0) {
        max = x[8 * k + __builtin_ctz(static_cast<unsigned>(m))];
        break;
      }
    }
    const float iscale = -127.0f / max;
    const __m256 vis = _mm256_set1_ps(iscale);
    for (int c = 0; c < 8; ++c) {  // 32 values = two bsum groups per step
      __m256i q[4];
      for (int k = 0; k < 4; ++k)
        q[k] = nearest_clamped(_mm256_mul_ps(_mm256_loadu_ps(x + 32 * c + 8 * k), vis), -128.0f, 127.0f);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(y[b].qs + 32 * c), pack_i32x32_to_i8(q[0], q[1], q[2], q[3]));
      y[b].bsums[2 * c] = static_cast<int16_t>(hsum_i32(_mm256_add_epi32(q[0], q[1])));
      y[b].bsums[2 * c + 1] = static_cast<int16_t>(hsum_i32(_mm256_add_epi32(q[2], q[3])));
    }
    y[b].d = 1.0f / iscale;
  }
}

void from_float_f16(const float* x, void* vy, int64_t n) {
  auto* y = static_cast<uint16_t*>(vy);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    if (_mm256_movemask_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)) != 0) {
      // F16C keeps NaN payload bits; the reference canonicalises NaN to 0x7E00|sign.
      for (int k = 0; k < 8; ++k) y[i + k] = fp32_to_fp16(x[i + k]);
      continue;
    }
    _mm_storeu_si128(reinterpret_cast<__m128i*>(y + i), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
  }
  for (; i < n; ++i) y[i] = fp32_to_fp16(x[i]);
}

void from_float_bf16(const float* x, void* vy, int64_t n) {
  auto* y = static_cast<uint16_t*>(vy);
  int64_t i = 0;
  const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff);
  const __m256i inf = _mm256_set1_epi32(0x7f800000);
  const __m256i one = _mm256_set1_epi32(1);
  const __m256i bias = _mm256_set1_epi32(0x7fff);
  for (; i + 16 <= n; i += 16) {
    __m256i r[2];
    for (int k = 0; k < 2; ++k) {
      const __m256i u = _mm256_castps_si256(_mm256_loadu_ps(x + i + 8 * k));
      const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, abs_mask), inf);
      const __m256i rounded = _mm256_srli_epi32(
          _mm256_add_epi32(_mm256_add_epi32(u, bias), _mm256_and_si256(_mm256_srli_epi32(u, 16), one)), 16);
      const __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
      r[k] = _mm256_blendv_epi8(rounded, quiet, nan);
    }
    const __m256i p = _mm256_permute4x64_epi64(_mm256_packus_epi32(r[0], r[1]), 0xD8);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + i), p);
  }
  for (; i < n; ++i) y[i] = fp32_to_bf16(x[i]);
}

// ---------------------------------------------------------------- to_float

void to_float_f16(const void* vx, float* y, int64_t n) {
  const auto* x = static_cast<const uint16_t*>(vx);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_cvtph_ps(loadu128(x + i)));
  for (; i < n; ++i) y[i] = fp16_to_fp32(x[i]);
}

void to_float_bf16(const void* vx, float* y, int64_t n) {
  const auto* x = static_cast<const uint16_t*>(vx);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i w = _mm256_slli_epi32(_mm256_cvtepu16_epi32(loadu128(x + i)), 16);
    _mm256_storeu_ps(y + i, _mm256_castsi256_ps(w));
  }
  for (; i < n; ++i) y[i] = bf16_to_fp32(x[i]);
}

// x[j] = d * q[j]: one f32 multiply per element, as the reference.
void to_float_q8_0(const void* vx, float* y, int64_t n) {
  const auto* x = static_cast<const BlockQ8_0*>(vx);
  for (int64_t b = 0; b < n / kQK; ++b) {
    const __m256 d = _mm256_set1_ps(h2f(x[b].d));
    for (int k = 0; k < 4; ++k) {
      const __m256i q = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(x[b].qs + 8 * k)));
      _mm256_storeu_ps(y + b * kQK + 8 * k, _mm256_mul_ps(d, _mm256_cvtepi32_ps(q)));
    }
  }
}

// ---------------------------------------------------------------- F32 / F16 / BF16 dots
// 32 lanes (element i -> lane i % 32) held as four __m256; tail elements go to their lane in
// scalar; then the canonical halving reduce32.

// BF16 -> f32: the 16 bits become the high half of the float (exact).
inline __m256 widen_bf16_8(const uint16_t* p) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(loadu128(p)), 16));
}

// ---- F32 / F16 / BF16: one weight row x NC tokens (vec_dot is NC = 1; NC <= 2: 8 accumulators
// and the 4 widened weight vectors fill AVX2's 16 registers). Each 32-element weight chunk is
// widened once for the NC tokens.
struct Row8F32 {
  const float* p;
  __m256 operator()(int64_t i) const { return _mm256_loadu_ps(p + i); }
  float at(int64_t i) const { return p[i]; }
};
struct Row8F16 {
  const uint16_t* p;
  __m256 operator()(int64_t i) const { return _mm256_cvtph_ps(loadu128(p + i)); }
  float at(int64_t i) const { return h2f(p[i]); }
};
struct Row8BF16 {
  const uint16_t* p;
  __m256 operator()(int64_t i) const { return widen_bf16_8(p + i); }
  float at(int64_t i) const { return bf16_to_fp32(p[i]); }
};

template <class Row, int NC>
inline void lanes_row_tile(int64_t n, const Row& w, const Row* x, float* out, size_t ldo) {
  __m256 acc[NC][4];
#pragma GCC unroll 2
  for (int j = 0; j < NC; ++j) {
#pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) acc[j][k] = _mm256_setzero_ps();
  }
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    __m256 wv[4];
#pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) wv[k] = w(i + 8 * k);
#pragma GCC unroll 2
    for (int j = 0; j < NC; ++j) {
#pragma GCC unroll 4
      for (int k = 0; k < 4; ++k) acc[j][k] = _mm256_fmadd_ps(wv[k], x[j](i + 8 * k), acc[j][k]);
    }
  }
  for (int j = 0; j < NC; ++j) {
    if (i < n) {
      alignas(32) float a[32];
      for (int k = 0; k < 4; ++k) _mm256_store_ps(a + 8 * k, acc[j][k]);
      for (int l = 0; l < static_cast<int>(n - i); ++l) a[l] = std::fmaf(w.at(i + l), x[j].at(i + l), a[l]);
      for (int k = 0; k < 4; ++k) acc[j][k] = _mm256_load_ps(a + 8 * k);
    }
    out[static_cast<size_t>(j) * ldo] = reduce32(acc[j][0], acc[j][1], acc[j][2], acc[j][3]);
  }
}

template <class Row, class E>
float dot_lanes(int64_t n, const void* w, const void* x) {
  const Row xr{static_cast<const E*>(x)};
  float out;
  lanes_row_tile<Row, 1>(n, Row{static_cast<const E*>(w)}, &xr, &out, 0);
  return out;
}
float vec_dot_f32(int64_t n, const void* w, const void* x) {
  return dot_lanes<Row8F32, float>(n, w, x);
}
float vec_dot_f16(int64_t n, const void* w, const void* x) {
  return dot_lanes<Row8F16, uint16_t>(n, w, x);
}
float vec_dot_bf16(int64_t n, const void* w, const void* x) {
  return dot_lanes<Row8BF16, uint16_t>(n, w, x);
}

// W and the activations are both E (F32, F16 or BF16: the type's own vec_dot_type).
template <class Row, class E>
void tile_lanes(int64_t n, const void* vw, size_t w_stride, int nr, const void* vx, size_t x_stride, int nc, float* out,
                size_t ldo) {
  for (int c0 = 0; c0 < nc; c0 += 2) {
    const Row x[2] = {
        Row{reinterpret_cast<const E*>(static_cast<const uint8_t*>(vx) + c0 * x_stride)},
        Row{reinterpret_cast<const E*>(static_cast<const uint8_t*>(vx) + (c0 + 1 < nc ? c0 + 1 : c0) * x_stride)}};
    for (int r = 0; r < nr; ++r) {
      const Row w{reinterpret_cast<const E*>(static_cast<const uint8_t*>(vw) + r * w_stride)};
      float* o = out + static_cast<size_t>(c0) * ldo + r;
      if (c0 + 1 < nc) {
        lanes_row_tile<Row, 2>(n, w, x, o, ldo);
      } else {
        lanes_row_tile<Row, 1>(n, w, x, o, ldo);
      }
    }
  }
}

}  // namespace
}  // namespace moesh::simd
