// x86 SIMD dot products for the 32-element block types (Q8_0, Q4_0, Q5_0, IQ4_NL, MXFP4 against
// Q8_0 activations; Q4_1, Q5_1 against Q8_1), bit-identical to the scalar reference.
//
// Canonical order (quant.h):
//  * per-lane types (kPerLane: Q8_0, Q4_0, Q5_0, IQ4_NL — llama.cpp's x86 vec_dot and tinyBLAS
//    order): the block's 8 int32 partial sums (lane l = elements 4l..4l+3, exactly what
//    dot_u8s8 produces) are converted and fused with the block scale, one fma per block;
//  * the others: block b goes to float lane b % 8 with acc = fma(isum, scale, acc). Eight
//    consecutive blocks fill one __m256: their exact int32 sums are gathered into one vector
//    (hsum_8x8), converted, and fused into the accumulator in one instruction; the nb % 8
//    leftover blocks go to their lanes in scalar fmaf.
// Then the canonical reduce8. Included only by kernels_avx2.cpp / kernels_avx512.cpp.
#pragma once

#include "simd_x86.h"

namespace moesh::simd {
namespace {

// Per-type policy: BW/BY block types, isum(w, y) -> 8 int32 partial sums of the block's exact
// integer dot, scale(w, y) -> the f32 factor of that sum; kHasMin types also add
// fma(min(w), ysum(y)) after it (Q4_1/Q5_1).
template <class P>
float dot_blocks32(int64_t n, const void* vw, const void* vy) {
  const auto* w = static_cast<const typename P::BW*>(vw);
  const auto* y = static_cast<const typename P::BY*>(vy);
  const int64_t nb = n / kQK;
  const P p;
  __m256 acc = _mm256_setzero_ps();
  if constexpr (P::kPerLane) {
    for (int64_t b = 0; b < nb; ++b) {
      acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p.isum(w[b], y[b])), _mm256_set1_ps(P::scale(w[b], y[b])), acc);
    }
    return reduce8(acc);
  }
  int64_t b = 0;
  for (; b + 8 <= nb; b += 8) {
    __m256i s[8];
    alignas(32) float sc[8];
#pragma GCC unroll 8
    for (int k = 0; k < 8; ++k) {
      s[k] = p.isum(w[b + k], y[b + k]);
      sc[k] = P::scale(w[b + k], y[b + k]);
    }
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(hsum_8x8(s)), _mm256_load_ps(sc), acc);
    if constexpr (P::kHasMin) {
      alignas(32) float mw[8], sy[8];
      for (int k = 0; k < 8; ++k) {
        mw[k] = P::min(w[b + k]);
        sy[k] = P::ysum(y[b + k]);
      }
      acc = _mm256_fmadd_ps(_mm256_load_ps(mw), _mm256_load_ps(sy), acc);
    }
  }
  alignas(32) float a[8];
  _mm256_store_ps(a, acc);
  for (; b < nb; ++b) {
    float& l = a[b & 7];
    l = std::fmaf(static_cast<float>(hsum_i32(p.isum(w[b], y[b]))), P::scale(w[b], y[b]), l);
    if constexpr (P::kHasMin) l = std::fmaf(P::min(w[b]), P::ysum(y[b]), l);
  }
  return reduce8(_mm256_load_ps(a));
}

struct PolicyQ8_0 {
  using BW = BlockQ8_0;
  using BY = BlockQ8_0;
  static constexpr bool kPerLane = true;
  static constexpr bool kHasMin = false;
  __m256i prep(const BW& w) const { return loadu256(w.qs); }
  __m256i dot(__m256i q, const BY& y) const { return dot_s8s8(q, loadu256(y.qs)); }
  __m256i isum(const BW& w, const BY& y) const { return dot(prep(w), y); }
  static float scale(const BW& w, const BY& y) { return h2f(w.d) * h2f(y.d); }
};

struct PolicyQ4_0 {
  using BW = BlockQ4_0;
  using BY = BlockQ8_0;
  static constexpr bool kPerLane = true;
  static constexpr bool kHasMin = false;
  __m256i prep(const BW& w) const { return _mm256_sub_epi8(unpack_nibbles16(w.qs), _mm256_set1_epi8(8)); }
  __m256i dot(__m256i q, const BY& y) const { return dot_s8s8(q, loadu256(y.qs)); }
  __m256i isum(const BW& w, const BY& y) const { return dot(prep(w), y); }
  static float scale(const BW& w, const BY& y) { return h2f(w.d) * h2f(y.d); }
};

struct PolicyQ5_0 {
  using BW = BlockQ5_0;
  using BY = BlockQ8_0;
  static constexpr bool kPerLane = true;
  static constexpr bool kHasMin = false;
  __m256i isum(const BW& w, const BY& y) const {
    uint32_t qh;
    std::memcpy(&qh, w.qh, 4);
    const __m256i hi = _mm256_and_si256(bits_to_bytes(qh), _mm256_set1_epi8(0x10));
    const __m256i q = _mm256_sub_epi8(_mm256_or_si256(unpack_nibbles16(w.qs), hi), _mm256_set1_epi8(16));
    return dot_s8s8(q, loadu256(y.qs));
  }
  static float scale(const BW& w, const BY& y) { return h2f(w.d) * h2f(y.d); }
};

// Table-lookup types: 16 int8 codebook values broadcast to both lanes, indexed by pshufb.
struct PolicyIQ4_NL {
  using BW = BlockIQ4_NL;
  using BY = BlockQ8_0;
  static constexpr bool kPerLane = true;
  static constexpr bool kHasMin = false;
  __m256i table = _mm256_broadcastsi128_si256(loadu128(k_values_iq4nl));
  __m256i isum(const BW& w, const BY& y) const {
    return dot_s8s8(_mm256_shuffle_epi8(table, unpack_nibbles16(w.qs)), loadu256(y.qs));
  }
  static float scale(const BW& w, const BY& y) { return h2f(w.d) * h2f(y.d); }
};

struct PolicyMXFP4 {
  using BW = BlockMXFP4;
  using BY = BlockQ8_0;
  static constexpr bool kPerLane = false;
  static constexpr bool kHasMin = false;
  __m256i table = _mm256_broadcastsi128_si256(loadu128(k_values_mxfp4));
  __m256i isum(const BW& w, const BY& y) const {
    return dot_s8s8(_mm256_shuffle_epi8(table, unpack_nibbles16(w.qs)), loadu256(y.qs));
  }
  static float scale(const BW& w, const BY& y) { return h2f(y.d) * e8m0_half(w.e); }
};

struct PolicyQ4_1 {
  using BW = BlockQ4_1;
  using BY = BlockQ8_1;
  static constexpr bool kPerLane = false;
  static constexpr bool kHasMin = true;
  __m256i isum(const BW& w, const BY& y) const { return dot_u8s8(unpack_nibbles16(w.qs), loadu256(y.qs)); }
  static float scale(const BW& w, const BY& y) { return h2f(w.d) * h2f(y.d); }
  static float min(const BW& w) { return h2f(w.m); }
  static float ysum(const BY& y) { return h2f(y.s); }
};

struct PolicyQ5_1 {
  using BW = BlockQ5_1;
  using BY = BlockQ8_1;
  static constexpr bool kPerLane = false;
  static constexpr bool kHasMin = true;
  __m256i isum(const BW& w, const BY& y) const {
    uint32_t qh;
    std::memcpy(&qh, w.qh, 4);
    const __m256i hi = _mm256_and_si256(bits_to_bytes(qh), _mm256_set1_epi8(0x10));
    return dot_u8s8(_mm256_or_si256(unpack_nibbles16(w.qs), hi), loadu256(y.qs));
  }
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
float vec_dot_mxfp4(int64_t n, const void* w, const void* y) {
  return dot_blocks32<PolicyMXFP4>(n, w, y);
}
float vec_dot_q4_1(int64_t n, const void* w, const void* y) {
  return dot_blocks32<PolicyQ4_1>(n, w, y);
}
float vec_dot_q5_1(int64_t n, const void* w, const void* y) {
  return dot_blocks32<PolicyQ5_1>(n, w, y);
}

}  // namespace
}  // namespace moesh::simd
