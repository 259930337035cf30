// x86 SIMD dot products for the 32-element block types (Q8_0, Q4_0, Q5_0, IQ4_NL, MXFP4 against
// Q8_0 activations; Q4_1, Q5_1 against Q8_1), bit-identical to the scalar reference.
//
// Canonical order (quant.h, llama.cpp's x86 vec_dot and tinyBLAS order): the block's 8 int32
// partial sums (lane l = elements 4l..4l+3, exactly what dot_u8s8 produces) are converted and
// fused with the block scale, one fma per block; Q4_1 and Q5_1 sum min*s in a float of their
// own (fmaf, block order), added after reduce8; MXFP4 (its own loop) puts even and odd blocks
// into two accumulators that are added before reduce8.
// Then the canonical reduce8. Included only by kernels_avx2.cpp / kernels_avx512.cpp.
#pragma once

#include "simd_x86.h"

namespace moesh::simd {
namespace {

// Per-type policy: BW/BY block types, isum(w, y) -> 8 int32 partial sums of the block's exact
// integer dot, scale(w, y) -> the f32 factor of that sum; kHasMin types (Q4_1/Q5_1) also sum
// fma(min(w), ysum(y)) on the side.
template <class P>
float dot_blocks32(int64_t n, const void* vw, const void* vy) {
  const auto* w = static_cast<const typename P::BW*>(vw);
  const auto* y = static_cast<const typename P::BY*>(vy);
  const int64_t nb = n / kQK;
  const P p;
  __m256 acc = _mm256_setzero_ps();
  float mins = 0.0f;
  for (int64_t b = 0; b < nb; ++b) {
    if constexpr (P::kHasMin) mins = std::fmaf(P::min(w[b]), P::ysum(y[b]), mins);
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p.isum(w[b], y[b])), _mm256_set1_ps(P::scale(w[b], y[b])), acc);
  }
  if constexpr (P::kHasMin) return reduce8(acc) + mins;
  return reduce8(acc);
}

struct PolicyQ8_0 {
  using BW = BlockQ8_0;
  using BY = BlockQ8_0;
  static constexpr bool kHasMin = false;
  __m256i prep(const BW& w) const { return loadu256(w.qs); }
  __m256i dot(__m256i q, const BY& y) const { return dot_s8s8(q, loadu256(y.qs)); }
  __m256i isum(const BW& w, const BY& y) const { return dot(prep(w), y); }
  static float scale(const BW& w, const BY& y) { return h2f(w.d) * h2f(y.d); }
};

struct PolicyQ4_0 {
  using BW = BlockQ4_0;
  using BY = BlockQ8_0;
  static constexpr bool kHasMin = false;
  __m256i prep(const BW& w) const { return _mm256_sub_epi8(unpack_nibbles16(w.qs), _mm256_set1_epi8(8)); }
  __m256i dot(__m256i q, const BY& y) const { return dot_s8s8(q, loadu256(y.qs)); }
  __m256i isum(const BW& w, const BY& y) const { return dot(prep(w), y); }
  static float scale(const BW& w, const BY& y) { return h2f(w.d) * h2f(y.d); }
};

struct PolicyQ5_0 {
  using BW = BlockQ5_0;
  using BY = BlockQ8_0;
  static constexpr bool kHasMin = false;
  __m256i prep(const BW& w) const {
    uint32_t qh;
    std::memcpy(&qh, w.qh, 4);
    const __m256i hi = _mm256_and_si256(bits_to_bytes(qh), _mm256_set1_epi8(0x10));
    return _mm256_sub_epi8(_mm256_or_si256(unpack_nibbles16(w.qs), hi), _mm256_set1_epi8(16));
  }
  __m256i dot(__m256i q, const BY& y) const { return dot_s8s8(q, loadu256(y.qs)); }
  __m256i isum(const BW& w, const BY& y) const { return dot(prep(w), y); }
  static float scale(const BW& w, const BY& y) { return h2f(w.d) * h2f(y.d); }
};

// Table-lookup types: 16 int8 codebook values broadcast to both lanes, indexed by pshufb.
struct PolicyIQ4_NL {
  using BW = BlockIQ4_NL;
  using BY = BlockQ8_0;
  static constexpr bool kHasMin = false;
  __m256i table = _mm256_broadcastsi128_si256(loadu128(k_values_iq4nl));
  __m256i prep(const BW& w) const { return _mm256_shuffle_epi8(table, unpack_nibbles16(w.qs)); }
  __m256i dot(__m256i q, const BY& y) const { return dot_s8s8(q, loadu256(y.qs)); }
  __m256i isum(const BW& w, const BY& y) const { return dot(prep(w), y); }
  static float scale(const BW& w, const BY& y) { return h2f(w.d) * h2f(y.d); }
};

struct PolicyMXFP4 {  // used by mxfp4_row_tile below (two accumulators), not dot_blocks32
  using BW = BlockMXFP4;
  using BY = BlockQ8_0;
  static constexpr bool kHasMin = false;
  __m256i table = _mm256_broadcastsi128_si256(loadu128(k_values_mxfp4));
  __m256i prep(const BW& w) const { return _mm256_shuffle_epi8(table, unpack_nibbles16(w.qs)); }
  __m256i dot(__m256i q, const BY& y) const { return dot_s8s8(q, loadu256(y.qs)); }
  __m256i isum(const BW& w, const BY& y) const { return dot(prep(w), y); }
  static float scale(const BW& w, const BY& y) { return h2f(y.d) * e8m0_half(w.e); }
};

struct PolicyQ4_1 {
  using BW = BlockQ4_1;
  using BY = BlockQ8_1;
  static constexpr bool kHasMin = true;
  __m256i prep(const BW& w) const { return unpack_nibbles16(w.qs); }
  __m256i dot(__m256i q, const BY& y) const { return dot_u8s8(q, loadu256(y.qs)); }
  __m256i isum(const BW& w, const BY& y) const { return dot(prep(w), y); }
  static float scale(const BW& w, const BY& y) { return h2f(w.d) * h2f(y.d); }
  static float min(const BW& w) { return h2f(w.m); }
  static float ysum(const BY& y) { return h2f(y.s); }
};

struct PolicyQ5_1 {
  using BW = BlockQ5_1;
  using BY = BlockQ8_1;
  static constexpr bool kHasMin = true;
  __m256i prep(const BW& w) const {
    uint32_t qh;
    std::memcpy(&qh, w.qh, 4);
    const __m256i hi = _mm256_and_si256(bits_to_bytes(qh), _mm256_set1_epi8(0x10));
    return _mm256_or_si256(unpack_nibbles16(w.qs), hi);
  }
  __m256i dot(__m256i q, const BY& y) const { return dot_u8s8(q, loadu256(y.qs)); }
  __m256i isum(const BW& w, const BY& y) const { return dot(prep(w), y); }
  static float scale(const BW& w, const BY& y) { return h2f(w.d) * h2f(y.d); }
  static float min(const BW& w) { return h2f(w.m); }
  static float ysum(const BY& y) { return h2f(y.s); }
};

float vec_dot_q8_0(int64_t n, const void* w, const void* y) {
  return dot_blocks32<PolicyQ8_0>(n, w, y);
}
float vec_dot_q4_0(int64_t n, const void* w, const void* y) {
  return dot_blocks32<PolicyQ4_0>(n, w, y);
}
float vec_dot_q5_0(int64_t n, const void* w, const void* y) {
  return dot_blocks32<PolicyQ5_0>(n, w, y);
}
float vec_dot_iq4_nl(int64_t n, const void* w, const void* y) {
  return dot_blocks32<PolicyIQ4_NL>(n, w, y);
}
// MXFP4 in ggml's x86 order (quant.h), one weight row x NC tokens (vec_dot is NC = 1): even and
// odd blocks in two accumulators per output, added before reduce8, an odd last block fused after it.
template <int NC>
inline void mxfp4_row_tile(int64_t nb, const BlockMXFP4* w, const BlockQ8_0* const* y, float* out, size_t ldo) {
  const PolicyMXFP4 p;
  __m256 acc0[NC], acc1[NC];
#pragma GCC unroll 8
  for (int j = 0; j < NC; ++j) acc0[j] = _mm256_setzero_ps(), acc1[j] = _mm256_setzero_ps();
  int64_t b = 0;
  for (; b + 1 < nb; b += 2) {
    const __m256i q0 = p.prep(w[b]), q1 = p.prep(w[b + 1]);
#pragma GCC unroll 8
    for (int j = 0; j < NC; ++j) {
      const BlockQ8_0& y0 = y[j][b];
      const BlockQ8_0& y1 = y[j][b + 1];
      acc0[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p.dot(q0, y0)), _mm256_set1_ps(p.scale(w[b], y0)), acc0[j]);
      acc1[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p.dot(q1, y1)), _mm256_set1_ps(p.scale(w[b + 1], y1)), acc1[j]);
    }
  }
  for (int j = 0; j < NC; ++j) {
    float sum = reduce8(_mm256_add_ps(acc0[j], acc1[j]));
    if (b < nb) sum = std::fmaf(p.scale(w[b], y[j][b]), static_cast<float>(hsum_i32(p.isum(w[b], y[j][b]))), sum);
    out[static_cast<size_t>(j) * ldo] = sum;
  }
}

float vec_dot_mxfp4(int64_t n, const void* vw, const void* vy) {
  const auto* y = static_cast<const BlockQ8_0*>(vy);
  float out;
  mxfp4_row_tile<1>(n / kQK, static_cast<const BlockMXFP4*>(vw), &y, &out, 0);
  return out;
}
float vec_dot_q4_1(int64_t n, const void* w, const void* y) {
  return dot_blocks32<PolicyQ4_1>(n, w, y);
}
float vec_dot_q5_1(int64_t n, const void* w, const void* y) {
  return dot_blocks32<PolicyQ5_1>(n, w, y);
}

}  // namespace
}  // namespace moesh::simd
