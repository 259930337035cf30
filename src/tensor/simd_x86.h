// Shared x86 SIMD building blocks for the AVX2 and AVX-512 kernel files.
//
// Included only by kernels_avx2.cpp and kernels_avx512.cpp, each compiled with its own -m flags.
// Everything lives in an anonymous namespace, so the two compiled copies never meet at link time
// (no ODR clash between an AVX2 and an AVX-512 build of the same inline function).
//
// The one ISA-dependent primitive is `dot_u8s8` (u8 x s8 products summed into int32 lanes):
// AVX2 uses maddubs+madd, AVX-512 VNNI uses dpbusd. Both are exact for our operands (a pair of
// products never exceeds int16: |u| <= 128, |s| <= 127), so both give the same integers and the
// float part that follows is shared code — the AVX-512 table inherits the AVX2 numerics by
// construction.
//
// Operand contract: activation int8 values lie in [-127, 127] (the canonical quantizers never
// produce -128). The sign trick used for signed weights relies on it.
#pragma once

#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "moesh/tensor/fp16.h"
#include "moesh/tensor/kernels.h"
#include "moesh/tensor/quant.h"
#include "tensor/quant_impl.h"

namespace moesh::simd {
namespace {

using namespace moesh::quant;

inline __m256i loadu256(const void* p) {
  return _mm256_loadu_si256(static_cast<const __m256i*>(p));
}
inline __m128i loadu128(const void* p) {
  return _mm_loadu_si128(static_cast<const __m128i*>(p));
}

// F16C conversion: exact for every non-NaN half (NaN payloads may differ from fp16_to_fp32).
inline float h2f(uint16_t h) {
  return _cvtsh_ss(h);
}

inline float e8m0_half(uint8_t e) {
  const uint32_t bits = e < 2 ? (0x00200000u << e) : (static_cast<uint32_t>(e) - 1u) << 23;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// u8 x s8 -> 8 int32 lanes, lane k = sum of products of bytes 4k..4k+3.
inline __m256i dot_u8s8(__m256i u, __m256i s) {
#if defined(MOESH_SIMD_VNNI)
  return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
#else
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
#endif
}

// Signed weights q (|q| <= 128) times activations y: the sign trick moves q's sign onto y.
inline __m256i dot_s8s8(__m256i q, __m256i y) {
  return dot_u8s8(_mm256_sign_epi8(q, q), _mm256_sign_epi8(y, q));
}

inline int hsum_i32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
  return _mm_cvtsi128_si32(s);
}

inline int hsum_i32(__m128i s) {
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
  return _mm_cvtsi128_si32(s);
}

// Lane k of the result = sum of the 8 int32 lanes of v[k] (integer, so any order is exact).
inline __m256i hsum_8x8(const __m256i* v) {
  const __m256i a = _mm256_hadd_epi32(v[0], v[1]);
  const __m256i b = _mm256_hadd_epi32(v[2], v[3]);
  const __m256i c = _mm256_hadd_epi32(v[4], v[5]);
  const __m256i d = _mm256_hadd_epi32(v[6], v[7]);
  const __m256i ab = _mm256_hadd_epi32(a, b);  // [v0..v3 low halves | v0..v3 high halves]
  const __m256i cd = _mm256_hadd_epi32(c, d);
  return _mm256_add_epi32(_mm256_permute2x128_si256(ab, cd, 0x20), _mm256_permute2x128_si256(ab, cd, 0x31));
}

inline float hmax_ps(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}

// The canonical reduce8 of quant.h: ((a0+a4)+(a2+a6)) + ((a1+a5)+(a3+a7)).
inline float reduce8(__m256 a) {
  __m128 t = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));  // a_l + a_{l+4}
  t = _mm_add_ps(t, _mm_movehl_ps(t, t));                                         // t_l + t_{l+2}
  t = _mm_add_ss(t, _mm_movehdup_ps(t));                                          // t_0 + t_1
  return _mm_cvtss_f32(t);
}

// The canonical reduce32 on lanes held as a[0..7], a[8..15], a[16..23], a[24..31].
inline float reduce32(__m256 a0, __m256 a1, __m256 a2, __m256 a3) {
  a0 = _mm256_add_ps(a0, a2);  // h = 16
  a1 = _mm256_add_ps(a1, a3);
  a0 = _mm256_add_ps(a0, a1);  // h = 8
  return reduce8(a0);          // h = 4, 2, 1 are exactly reduce8's steps
}

// 16 bytes of packed nibbles -> 32 bytes [low nibbles | high nibbles] (element order of every
// legacy 32-block: low nibble of byte j is element j, high nibble is element j+16).
inline __m256i unpack_nibbles16(const uint8_t* qs) {
  const __m128i q = loadu128(qs);
  const __m256i v = _mm256_set_m128i(_mm_srli_epi16(q, 4), q);
  return _mm256_and_si256(v, _mm256_set1_epi8(0x0F));
}

// Byte j = 0xFF if bit j of `bits` is set, else 0 (j = 0..31).
inline __m256i bits_to_bytes(uint32_t bits) {
  const __m256i shuf =
      _mm256_setr_epi64x(0x0000000000000000, 0x0101010101010101, 0x0202020202020202, 0x0303030303030303);
  const __m256i mask = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201ull));
  const __m256i v = _mm256_and_si256(_mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(bits)), shuf), mask);
  return _mm256_cmpeq_epi8(v, mask);
}

// Packs 4x8 int32 (values fit in int8) into 32 bytes in element order.
inline __m256i pack_i32x32_to_i8(__m256i i0, __m256i i1, __m256i i2, __m256i i3) {
  const __m256i a = _mm256_packs_epi32(i0, i1);
  const __m256i b = _mm256_packs_epi32(i2, i3);
  const __m256i c = _mm256_packs_epi16(a, b);
  return _mm256_permutevar8x32_epi32(c, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

inline __m256 abs_ps(__m256 v) {
  return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), v);
}

}  // namespace
}  // namespace moesh::simd
