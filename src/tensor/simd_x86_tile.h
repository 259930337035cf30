// x86 SIMD vec_dot_tile kernels (kernels.h): nr weight rows x nc activation rows in one pass,
// so each weight block is loaded and unpacked once per tile column group instead of once per
// output. Every output follows exactly the per-lane sequence of the matching vec_dot (same lane
// assignment, same fused ops, same reduce8), so tile == vec_dot bit for bit.
// Included only by kernels_avx2.cpp / kernels_avx512.cpp (see simd_x86.h).
#pragma once

#include <algorithm>
#include <type_traits>
#include <vector>

#include "simd_x86_kquant.h"
#include "simd_x86_legacy.h"

namespace moesh::simd {
namespace {

// ---- 32-element per-lane block types (Q8_0, Q4_0, Q5_0, IQ4_NL, Q4_1, Q5_1, MXFP4): one
// weight row x NC activation rows
//
// Each weight block is unpacked once (prep) and dotted with NC activation blocks; NC float
// accumulators stay in registers (a 4x4 grid of them would not fit AVX2's 16). Per output the
// float steps are vec_dot's per-lane ones: acc = fma(cvt(isum), scale, acc) block by block, and
// for Q4_1/Q5_1 the min terms in a float of their own.
template <class P, int NC>
inline void blocks32_row_tile(int64_t nb, const typename P::BW* w, const typename P::BY* const* y, float* out,
                              size_t ldo) {
  const P p;
  __m256 acc[NC];
  float mins[NC];
#pragma GCC unroll 8
  for (int j = 0; j < NC; ++j) acc[j] = _mm256_setzero_ps(), mins[j] = 0.0f;
  for (int64_t b = 0; b < nb; ++b) {
    const __m256i q = p.prep(w[b]);
#pragma GCC unroll 8
    for (int j = 0; j < NC; ++j) {
      const typename P::BY& yb = y[j][b];
      if constexpr (P::kHasMin) mins[j] = std::fmaf(P::min(w[b]), P::ysum(yb), mins[j]);
      acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p.dot(q, yb)), _mm256_set1_ps(P::scale(w[b], yb)), acc[j]);
    }
  }
  for (int j = 0; j < NC; ++j) {
    out[static_cast<size_t>(j) * ldo] = P::kHasMin ? reduce8(acc[j]) + mins[j] : reduce8(acc[j]);
  }
}

// The four 32-value chunks of half h of a Q6_K super-block as unsigned 6-bit bytes (0..63).
inline void q6k_unpack_half(const BlockQ6_K& x, int h, __m256i q[4]) {
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  const __m256i m30 = _mm256_set1_epi8(0x30);
  const __m256i l0 = loadu256(x.ql + 64 * h);
  const __m256i l1 = loadu256(x.ql + 64 * h + 32);
  const __m256i hb = loadu256(x.qh + 32 * h);
  q[0] = _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_and_si256(_mm256_slli_epi16(hb, 4), m30));
  q[1] = _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_and_si256(_mm256_slli_epi16(hb, 2), m30));
  q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4), _mm256_and_si256(hb, m30));
  q[3] =
      _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4), _mm256_and_si256(_mm256_srli_epi16(hb, 2), m30));
}

// The float steps of one Q4_K super-block for NC outputs, as vec_dot_q4_k does them: the 8
// integer lanes (lanes(j) for output j) times d*dy, the 4 min lanes times -dmin*dy.
template <int NC, class Lanes>
inline void q4k_block_float(const BlockQ4_K& x, uint64_t m, const BlockQ8_K* const* y, int64_t b, const Lanes& lanes,
                            __m256* acc, __m128* acc_m) {
  const float dw = h2f(x.d), mw = h2f(x.dmin);
#pragma GCC unroll 8
  for (int j = 0; j < NC; ++j) {
    const BlockQ8_K& q8 = y[j][b];
    acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(lanes(j)), _mm256_set1_ps(dw * q8.d), acc[j]);
    acc_m[j] = _mm_fmadd_ps(_mm_cvtepi32_ps(k4_mins4(m, q8)), _mm_set1_ps(-(mw * q8.d)), acc_m[j]);
  }
}

// The Q4_K tiles' last step per output: reduce8 of the scale lanes plus the 4 min lanes.
template <int NC>
inline void q4k_tile_store(const __m256* acc, const __m128* acc_m, float* out, size_t ldo) {
#pragma GCC unroll 8
  for (int j = 0; j < NC; ++j) {
    __m128 mm = _mm_add_ps(acc_m[j], _mm_movehl_ps(acc_m[j], acc_m[j]));
    mm = _mm_add_ss(mm, _mm_movehdup_ps(mm));
    out[static_cast<size_t>(j) * ldo] = reduce8(acc[j]) + _mm_cvtss_f32(mm);
  }
}

// ---- Q4_K: one weight row x NC activation rows, every accumulator in a register

// A 4x4 tile that unpacks a whole super-block first (8 quant + 8 scale vectors) and keeps a 4x4
// grid of float accumulators needs far more than AVX2's 16 registers and runs from the stack
// (that was the previous version: 2.4-3x slower in bench_kernels' batched Q4_K rows).
// Here each 64-value chunk is unpacked once and applied to NC activation rows before the next
// chunk, with NC int32 sums, NC float accumulators and NC 4-lane min accumulators live. The
// integer sums are exact whatever their order; the float steps per super-block are the same as
// vec_dot_q4_k's (one fma with d, one 4-lane fma with -dmin), so outputs match it bit for bit.
template <int NC>
inline void q4k_row_tile(int64_t nb, const BlockQ4_K* w, const BlockQ8_K* const* y, float* out, size_t ldo) {
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  __m256 acc[NC];
  __m128 acc_m[NC];
#pragma GCC unroll 4
  for (int j = 0; j < NC; ++j) {
    acc[j] = _mm256_setzero_ps();
    acc_m[j] = _mm_setzero_ps();
  }
  for (int64_t b = 0; b < nb; ++b) {
    const BlockQ4_K& x = w[b];
    uint64_t sc, m;
    unpack_k4_scales(x.scales, &sc, &m);
    const __m256i sc16 = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(static_cast<long long>(sc))));
    __m256i isum[NC];
#pragma GCC unroll 4
    for (int j = 0; j < NC; ++j) isum[j] = _mm256_setzero_si256();
#pragma GCC unroll 4
    for (int c = 0; c < 4; ++c) {
      const __m256i q = loadu256(x.qs + 32 * c);
      const __m256i q_lo = _mm256_and_si256(q, m4);
      const __m256i q_hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
      const __m256i s_lo = _mm256_shuffle_epi8(sc16, bcast16_ctrl(2 * c));
      const __m256i s_hi = _mm256_shuffle_epi8(sc16, bcast16_ctrl(2 * c + 1));
#pragma GCC unroll 4
      for (int j = 0; j < NC; ++j) {
        const int8_t* yq = y[j][b].qs + 64 * c;
        isum[j] =
            _mm256_add_epi32(isum[j], _mm256_add_epi32(scaled_u8s8(q_lo, yq, s_lo), scaled_u8s8(q_hi, yq + 32, s_hi)));
      }
    }
    q4k_block_float<NC>(
        x, m, y, b, [&](int j) { return isum[j]; }, acc, acc_m);
  }
  q4k_tile_store<NC>(acc, acc_m, out, ldo);
}

// ---- Q6_K: the same layout (one weight row x NC activation rows, registers only). Integer sums
// in any order are exact (unsigned values, the -32 offset taken off per lane by
// q6k_offset_lanes); the one float step per super-block is vec_dot_q6_k's.
template <int NC>
inline void q6k_row_tile(int64_t nb, const BlockQ6_K* w, const BlockQ8_K* const* y, float* out, size_t ldo) {
  const __m128i even_odd = _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
  __m256 acc[NC];
#pragma GCC unroll 4
  for (int j = 0; j < NC; ++j) acc[j] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const BlockQ6_K& x = w[b];
    const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(loadu128(x.scales), even_odd));
    __m256i isum[NC];
#pragma GCC unroll 4
    for (int j = 0; j < NC; ++j) isum[j] = _mm256_setzero_si256();
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {
      __m256i q[4];
      q6k_unpack_half(x, h, q);
#pragma GCC unroll 4
      for (int k = 0; k < 4; ++k) {
        const __m256i s16 = _mm256_shuffle_epi8(sc16, bcast16_ctrl(4 * h + k));
#pragma GCC unroll 4
        for (int j = 0; j < NC; ++j) {
          const __m256i yv = loadu256(y[j][b].qs + 128 * h + 32 * k);
          isum[j] = _mm256_add_epi32(isum[j], _mm256_madd_epi16(_mm256_maddubs_epi16(q[k], yv), s16));
        }
      }
    }
    const float dw = h2f(x.d);
#pragma GCC unroll 4
    for (int j = 0; j < NC; ++j) {
      const __m256i lanes = _mm256_sub_epi32(isum[j], q6k_offset_lanes(x, y[j][b]));
      acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(lanes), _mm256_set1_ps(dw * y[j][b].d), acc[j]);
    }
  }
#pragma GCC unroll 4
  for (int j = 0; j < NC; ++j) out[static_cast<size_t>(j) * ldo] = reduce8(acc[j]);
}

#if defined(__AVX512BW__)
// ---- AVX-512: the same Q4_K / Q6_K row tiles with 64-value chunks in one zmm
//
// A 64-value chunk of a super-block is [32 values | next 32 values] of the activation row,
// contiguous, so one zmm load takes it and one maddubs + one madd (scale per 32-value half)
// gives 16 int32 lanes: lanes 0-7 are exactly the ymm kernel's lanes for the first 32 values,
// lanes 8-15 those for the second 32. Folding the halves (an integer add, exact) leaves each of
// the 8 lanes with the same integer sum as vec_dot's, so the float steps that follow — the
// same as the ymm tile's — give the same bits. Half the integer instructions per value, and
// twice the tokens per weight unpack (8 accumulators, AVX-512 has 32 registers).
inline __m256i fold_halves(__m512i v) {
  return _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1));
}

// Shuffle control (per 128-bit lane) that broadcasts int16 element a to lanes 0-1 of the zmm
// and element b to lanes 2-3: the scales of a chunk's two 32-value halves.
inline __m512i bcast16_pair_ctrl(int a, int b) {
  const __m128i ca = _mm_set1_epi16(static_cast<int16_t>((2 * a) | ((2 * a + 1) << 8)));
  const __m128i cb = _mm_set1_epi16(static_cast<int16_t>((2 * b) | ((2 * b + 1) << 8)));
  return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set_m128i(ca, ca)), _mm256_set_m128i(cb, cb), 1);
}

template <int NC>
inline void q4k_row_tile_512(int64_t nb, const BlockQ4_K* w, const BlockQ8_K* const* y, float* out, size_t ldo) {
  const __m512i m4 = _mm512_set1_epi8(0x0F);
  __m256 acc[NC];
  __m128 acc_m[NC];
#pragma GCC unroll 8
  for (int j = 0; j < NC; ++j) {
    acc[j] = _mm256_setzero_ps();
    acc_m[j] = _mm_setzero_ps();
  }
  for (int64_t b = 0; b < nb; ++b) {
    const BlockQ4_K& x = w[b];
    uint64_t sc, m;
    unpack_k4_scales(x.scales, &sc, &m);
    const __m512i sc16 = _mm512_broadcast_i32x4(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(static_cast<long long>(sc))));
    __m512i isum[NC];
#pragma GCC unroll 8
    for (int j = 0; j < NC; ++j) isum[j] = _mm512_setzero_si512();
#pragma GCC unroll 4
    for (int c = 0; c < 4; ++c) {
      const __m256i q = loadu256(x.qs + 32 * c);
      const __m512i qq =
          _mm512_and_si512(_mm512_inserti64x4(_mm512_castsi256_si512(q), _mm256_srli_epi16(q, 4), 1), m4);
      const __m512i s = _mm512_shuffle_epi8(sc16, bcast16_pair_ctrl(2 * c, 2 * c + 1));
#pragma GCC unroll 8
      for (int j = 0; j < NC; ++j) {
        const __m512i yv = _mm512_loadu_si512(y[j][b].qs + 64 * c);
        isum[j] = _mm512_add_epi32(isum[j], _mm512_madd_epi16(_mm512_maddubs_epi16(qq, yv), s));
      }
    }
    q4k_block_float<NC>(
        x, m, y, b, [&](int j) { return fold_halves(isum[j]); }, acc, acc_m);
  }
  q4k_tile_store<NC>(acc, acc_m, out, ldo);
}

// Half h of a Q6_K super-block as two zmm of unsigned 6-bit values, [q[0] | q[1]] and
// [q[2] | q[3]] (values 128h..128h+63 and 128h+64..128h+127, contiguous in the activations), and
// their scales: the ymm kernel's s16 for chunk k is element 4h+k of each 128-bit lane of sc16.
struct Q6KHalf512 {
  __m512i qa, qb, sa, sb;
};
inline Q6KHalf512 q6k_half_512(const BlockQ6_K& x, int h, __m512i sc16) {
  __m256i q[4];
  q6k_unpack_half(x, h, q);
  return {_mm512_inserti64x4(_mm512_castsi256_si512(q[0]), q[1], 1),
          _mm512_inserti64x4(_mm512_castsi256_si512(q[2]), q[3], 1),
          _mm512_shuffle_epi8(sc16, bcast16_pair_ctrl(4 * h, 4 * h + 1)),
          _mm512_shuffle_epi8(sc16, bcast16_pair_ctrl(4 * h + 2, 4 * h + 3))};
}

// Q6_K: chunk k of half h is 32 values; values 64p..64p+63 of a half are chunks 2p, 2p+1,
// contiguous in the activations, so one zmm holds [q[2p] | q[2p+1]] and their four 16-value
// scales sit one per 128-bit lane (the ymm kernel's s16 for chunk 2p in lanes 0-1, 2p+1 in 2-3).
template <int NC>
inline void q6k_row_tile_512(int64_t nb, const BlockQ6_K* w, const BlockQ8_K* const* y, float* out, size_t ldo) {
  const __m128i even_odd = _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
  __m256 acc[NC];
#pragma GCC unroll 8
  for (int j = 0; j < NC; ++j) acc[j] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const BlockQ6_K& x = w[b];
    const __m256i sc16y = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(loadu128(x.scales), even_odd));
    const __m512i sc16 = _mm512_inserti64x4(_mm512_castsi256_si512(sc16y), sc16y, 1);
    __m512i isum[NC];
#pragma GCC unroll 8
    for (int j = 0; j < NC; ++j) isum[j] = _mm512_setzero_si512();
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {
      const auto [qa, qb, sa, sb] = q6k_half_512(x, h, sc16);
#pragma GCC unroll 8
      for (int j = 0; j < NC; ++j) {
        const __m512i ya = _mm512_loadu_si512(y[j][b].qs + 128 * h);
        const __m512i yb = _mm512_loadu_si512(y[j][b].qs + 128 * h + 64);
        const __m512i pa = _mm512_maddubs_epi16(qa, ya);
        const __m512i pb = _mm512_maddubs_epi16(qb, yb);
        isum[j] = _mm512_add_epi32(isum[j], _mm512_add_epi32(_mm512_madd_epi16(pa, sa), _mm512_madd_epi16(pb, sb)));
      }
    }
    const float dw = h2f(x.d);
#pragma GCC unroll 8
    for (int j = 0; j < NC; ++j) {
      const __m256i lanes = _mm256_sub_epi32(fold_halves(isum[j]), q6k_offset_lanes(x, y[j][b]));
      acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(lanes), _mm256_set1_ps(dw * y[j][b].d), acc[j]);
    }
  }
#pragma GCC unroll 8
  for (int j = 0; j < NC; ++j) out[static_cast<size_t>(j) * ldo] = reduce8(acc[j]);
}

// Batch-1 dots through the same zmm row tiles (one activation row): decode's matvecs get the
// halved integer work too. Same bits as vec_dot (the tile is tested against it).
float vec_dot_q4_k_512(int64_t n, const void* vw, const void* vy) {
  const auto* y = static_cast<const BlockQ8_K*>(vy);
  float out;
  q4k_row_tile_512<1>(n / kQKK, static_cast<const BlockQ4_K*>(vw), &y, &out, 0);
  return out;
}
float vec_dot_q6_k_512(int64_t n, const void* vw, const void* vy) {
  const auto* y = static_cast<const BlockQ8_K*>(vy);
  float out;
  q6k_row_tile_512<1>(n / kQKK, static_cast<const BlockQ6_K*>(vw), &y, &out, 0);
  return out;
}
#endif

#if defined(__AVX512VNNI__)
// ---- Q8_0 with VNNI: signed weights through dpbusd's unsigned operand
//
// dpbusd multiplies unsigned by signed bytes. With w + 128 (w XOR 0x80) as the unsigned side,
// each int32 lane gets sum4((w + 128) * y) = sum4(w * y) + 128 * sum4(y); starting the lane at
// -128 * sum4(y) (an activation-only value, computed once per tile call for all weight rows)
// leaves exactly sum4(w * y): vec_dot's integer lane, with no overflow (|lane| < 2^17). One
// integer instruction per 32 values and token instead of three (sign, dot, accumulate), and the
// per-block scale products dw * dy are one vector multiply for 8 tokens. The float steps per
// block (cvt, fma with dw * dy) and the final reduce8 are vec_dot_q8_0's, so the bits are too.
//
// The activations of a tile call are repacked once, block-major: for block b and token j one
// 64-byte line {32 quants, the 8 starting lanes}, so a weight block meets its 8 tokens in 8
// consecutive cache lines.
struct alignas(64) Q8_0Packed {
  int8_t qs[32];
  int32_t neg_sums[8];
};

// NR weight rows (1 to 3: each packed activation line is loaded once for all of them; 2 rows
// measured 2.25 ms, 3 rows 1.64 ms, 4 rows the same, for the b64 Q8_0 gate shape) x NC tokens.
template <int NR, int NC>
inline void q8_0_rows_tile_vnni(int64_t nb, const BlockQ8_0* const* w, const Q8_0Packed* y, const float* dy, float* out,
                                size_t ldo) {
  const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
  __m256 acc[NR][NC];
#pragma GCC unroll 3
  for (int i = 0; i < NR; ++i) {
#pragma GCC unroll 8
    for (int j = 0; j < NC; ++j) acc[i][j] = _mm256_setzero_ps();
  }
  alignas(32) float s[NR][8];
  for (int64_t b = 0; b < nb; ++b) {
    __m256i wx[NR];
    const __m256 dyb = _mm256_load_ps(dy + b * 8);
#pragma GCC unroll 3
    for (int i = 0; i < NR; ++i) {
      wx[i] = _mm256_xor_si256(loadu256(w[i][b].qs), flip);
      _mm256_store_ps(s[i], _mm256_mul_ps(_mm256_set1_ps(h2f(w[i][b].d)), dyb));
    }
    const Q8_0Packed* yb = y + b * 8;
#pragma GCC unroll 8
    for (int j = 0; j < NC; ++j) {
      const __m256i start = _mm256_load_si256(reinterpret_cast<const __m256i*>(yb[j].neg_sums));
      const __m256i q = _mm256_load_si256(reinterpret_cast<const __m256i*>(yb[j].qs));
#pragma GCC unroll 3
      for (int i = 0; i < NR; ++i) {
        const __m256i isum = _mm256_dpbusd_epi32(start, wx[i], q);
        acc[i][j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_broadcast_ss(&s[i][j]), acc[i][j]);
      }
    }
  }
#pragma GCC unroll 3
  for (int i = 0; i < NR; ++i) {
#pragma GCC unroll 8
    for (int j = 0; j < NC; ++j) out[static_cast<size_t>(j) * ldo + i] = reduce8(acc[i][j]);
  }
}

template <int NR, int Max>
inline void run_q8_0_tile_vnni(int cn, int64_t nb, const BlockQ8_0* const* w, const Q8_0Packed* y, const float* dy,
                               float* o, size_t ldo) {
  if constexpr (Max == 1) {
    q8_0_rows_tile_vnni<NR, 1>(nb, w, y, dy, o, ldo);
  } else if (cn == Max) {
    q8_0_rows_tile_vnni<NR, Max>(nb, w, y, dy, o, ldo);
  } else {
    run_q8_0_tile_vnni<NR, Max - 1>(cn, nb, w, y, dy, o, ldo);
  }
}

// Tokens c0..c0+cn of a tile call into the block-major layout above (8 token slots per block):
// their quants, the starting lanes -128 * sum4(y), and their scales as floats.
inline void pack_q8_0_tokens(const void* vx, size_t x_stride, int c0, int cn, int64_t nb, Q8_0Packed* packed,
                             float* dy) {
  const __m256i c128 = _mm256_set1_epi8(static_cast<char>(0x80));
  for (int j = 0; j < cn; ++j) {
    const auto* yj = reinterpret_cast<const BlockQ8_0*>(static_cast<const uint8_t*>(vx) + (c0 + j) * x_stride);
    for (int64_t b = 0; b < nb; ++b) {
      Q8_0Packed& p = packed[static_cast<size_t>(b * 8 + j)];
      const __m256i q = loadu256(yj[b].qs);
      const __m256i t = _mm256_dpbusd_epi32(_mm256_setzero_si256(), c128, q);
      _mm256_store_si256(reinterpret_cast<__m256i*>(p.qs), q);
      _mm256_store_si256(reinterpret_cast<__m256i*>(p.neg_sums), _mm256_sub_epi32(_mm256_setzero_si256(), t));
      dy[b * 8 + j] = h2f(yj[b].d);
    }
  }
}

// ---- MXFP4 with VNNI: the codebook values + 128 as dpbusd's unsigned operand (one pshufb from a
// shifted table) against the packed Q8_0 tokens above, so each lane starts at -128 * sum4(y) as
// for Q8_0 and ends at vec_dot_mxfp4's integer lane. The float steps are vec_dot_mxfp4's: even and
// odd blocks in two accumulators per output, added before reduce8, a lone last block fused after
// it; the scales dy * E(e) are one vector multiply for 8 tokens.
template <int NC>
inline void mxfp4_row_tile_vnni(int64_t nb, const BlockMXFP4* w, const Q8_0Packed* y, const float* dy, float* out,
                                size_t ldo) {
  const __m256i table = _mm256_broadcastsi128_si256(
      _mm_xor_si128(loadu128(k_values_mxfp4), _mm_set1_epi8(static_cast<char>(0x80))));  // value + 128
  __m256 acc0[NC], acc1[NC];
#pragma GCC unroll 8
  for (int j = 0; j < NC; ++j) acc0[j] = _mm256_setzero_ps(), acc1[j] = _mm256_setzero_ps();
  alignas(32) float s[2][8];
  int64_t b = 0;
  for (; b + 1 < nb; b += 2) {
    const __m256i w0 = _mm256_shuffle_epi8(table, unpack_nibbles16(w[b].qs));
    const __m256i w1 = _mm256_shuffle_epi8(table, unpack_nibbles16(w[b + 1].qs));
    _mm256_store_ps(s[0], _mm256_mul_ps(_mm256_load_ps(dy + b * 8), _mm256_set1_ps(e8m0_half(w[b].e))));
    _mm256_store_ps(s[1], _mm256_mul_ps(_mm256_load_ps(dy + b * 8 + 8), _mm256_set1_ps(e8m0_half(w[b + 1].e))));
    const Q8_0Packed* y0 = y + b * 8;
    const Q8_0Packed* y1 = y0 + 8;
#pragma GCC unroll 8
    for (int j = 0; j < NC; ++j) {
      const __m256i i0 = _mm256_dpbusd_epi32(_mm256_load_si256(reinterpret_cast<const __m256i*>(y0[j].neg_sums)), w0,
                                             _mm256_load_si256(reinterpret_cast<const __m256i*>(y0[j].qs)));
      const __m256i i1 = _mm256_dpbusd_epi32(_mm256_load_si256(reinterpret_cast<const __m256i*>(y1[j].neg_sums)), w1,
                                             _mm256_load_si256(reinterpret_cast<const __m256i*>(y1[j].qs)));
      acc0[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i0), _mm256_broadcast_ss(&s[0][j]), acc0[j]);
      acc1[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i1), _mm256_broadcast_ss(&s[1][j]), acc1[j]);
    }
  }
#pragma GCC unroll 8
  for (int j = 0; j < NC; ++j) {
    float sum = reduce8(_mm256_add_ps(acc0[j], acc1[j]));
    if (b < nb) {
      const Q8_0Packed& yl = y[b * 8 + j];
      const __m256i wl = _mm256_shuffle_epi8(table, unpack_nibbles16(w[b].qs));
      const __m256i il = _mm256_dpbusd_epi32(_mm256_load_si256(reinterpret_cast<const __m256i*>(yl.neg_sums)), wl,
                                             _mm256_load_si256(reinterpret_cast<const __m256i*>(yl.qs)));
      sum = std::fmaf(dy[b * 8 + j] * e8m0_half(w[b].e), static_cast<float>(hsum_i32(il)), sum);
    }
    out[static_cast<size_t>(j) * ldo] = sum;
  }
}

template <int Max>
inline void run_mxfp4_tile_vnni(int cn, int64_t nb, const BlockMXFP4* w, const Q8_0Packed* y, const float* dy, float* o,
                                size_t ldo) {
  if constexpr (Max == 1) {
    mxfp4_row_tile_vnni<1>(nb, w, y, dy, o, ldo);
  } else if (cn == Max) {
    mxfp4_row_tile_vnni<Max>(nb, w, y, dy, o, ldo);
  } else {
    run_mxfp4_tile_vnni<Max - 1>(cn, nb, w, y, dy, o, ldo);
  }
}

void tile_mxfp4_vnni(int64_t n, const void* vw, size_t w_stride, int nr, const void* vx, size_t x_stride, int nc,
                     float* out, size_t ldo) {
  constexpr int kNC = 8;
  const int64_t nb = n / kQK;
  thread_local std::vector<Q8_0Packed> packed;  // [block][8 tokens]
  thread_local std::vector<float> dy;           // [block][8 tokens], 32-aligned below
  packed.resize(static_cast<size_t>(kNC * nb));
  dy.resize(static_cast<size_t>(kNC * nb) + 8);
  float* dya = dy.data() + ((32 - reinterpret_cast<uintptr_t>(dy.data()) % 32) % 32) / sizeof(float);
  for (int c0 = 0; c0 < nc; c0 += kNC) {
    const int cn = std::min(kNC, nc - c0);
    pack_q8_0_tokens(vx, x_stride, c0, cn, nb, packed.data(), dya);
    for (int r = 0; r < nr; ++r) {
      const auto* w = reinterpret_cast<const BlockMXFP4*>(static_cast<const uint8_t*>(vw) + r * w_stride);
      run_mxfp4_tile_vnni<kNC>(cn, nb, w, packed.data(), dya, out + static_cast<size_t>(c0) * ldo + r, ldo);
    }
  }
}

void tile_q8_0_vnni(int64_t n, const void* vw, size_t w_stride, int nr, const void* vx, size_t x_stride, int nc,
                    float* out, size_t ldo) {
  constexpr int kNC = 8;
  const int64_t nb = n / kQK;
  thread_local std::vector<Q8_0Packed> packed;  // [block][8 tokens]
  thread_local std::vector<float> dy;           // [block][8 tokens]: the activation scales as floats
  packed.resize(static_cast<size_t>(kNC * nb));
  dy.resize(static_cast<size_t>(kNC * nb) + 8);
  float* dya = dy.data() + ((32 - reinterpret_cast<uintptr_t>(dy.data()) % 32) % 32) / sizeof(float);  // 32-aligned
  for (int c0 = 0; c0 < nc; c0 += kNC) {
    const int cn = std::min(kNC, nc - c0);
    pack_q8_0_tokens(vx, x_stride, c0, cn, nb, packed.data(), dya);
    for (int r = 0; r < nr; r += 3) {
      const BlockQ8_0* w[3];
      const int rn = std::min(3, nr - r);
      for (int i = 0; i < rn; ++i) {
        w[i] = reinterpret_cast<const BlockQ8_0*>(static_cast<const uint8_t*>(vw) + (r + i) * w_stride);
      }
      float* o = out + static_cast<size_t>(c0) * ldo + r;
      if (rn == 3) {
        run_q8_0_tile_vnni<3, kNC>(cn, nb, w, packed.data(), dya, o, ldo);
      } else if (rn == 2) {
        run_q8_0_tile_vnni<2, kNC>(cn, nb, w, packed.data(), dya, o, ldo);
      } else {
        run_q8_0_tile_vnni<1, kNC>(cn, nb, w, packed.data(), dya, o, ldo);
      }
    }
  }
}

// ---- Q4_K with VNNI: the float steps of 2 (scales) and 4 (mins) tokens per instruction
//
// In the row tile above, half the instructions per super-block and token are not the dot
// product: folding the halves, the scale product dw * dy and its broadcast, cvt and fma for the
// 8 scale lanes, then the hadd of the bsums, the mins' madd, dmin * dy, cvt and fma for the 4
// min lanes. Each lane's arithmetic is fixed by vec_dot, but not which register it sits in, so
// here two tokens' 8 scale lanes share one zmm and four tokens' 4 min lanes another: one cvt,
// one multiply and one fma serve two (four) tokens. The token-side values they need (dy laid
// out per lane, the bsums' pair sums) depend only on the activations and are prepared once per
// group of 8 tokens for all the weight rows of the call. The dot itself accumulates with
// dpwssd (madd and add in one instruction, the same int32 wrap-free sums).
// Per block: for token pairs p, [dy(2p) x8 | dy(2p+1) x8]; for token quads q, [-dy(4q+i) x4]
// and the 4 tokens' bsums pair sums (8 int16 each).
struct alignas(64) Q4KGroupPrep {
  __m512 d2[4];
  __m512 dq_neg[2];
  __m512i bs[2];
  __m256 d8_neg;  // [-dy(j)] for the 8 tokens (Q5_K's scalar mins)
};

inline void q4k_prepare_group(int64_t nb, const BlockQ8_K* const* y, int cn, Q4KGroupPrep* prep) {
  for (int64_t b = 0; b < nb; ++b) {
    alignas(64) float d[8] = {};
    alignas(64) int16_t bs[8][8] = {};
    for (int j = 0; j < cn; ++j) {
      const BlockQ8_K& q8 = y[j][b];
      d[j] = q8.d;
      _mm_store_si128(reinterpret_cast<__m128i*>(bs[j]), _mm_hadd_epi16(loadu128(q8.bsums), loadu128(q8.bsums + 8)));
    }
    Q4KGroupPrep& p = prep[b];
    for (int i = 0; i < 4; ++i) {
      p.d2[i] = _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_set1_ps(d[2 * i])), _mm256_set1_ps(d[2 * i + 1]), 1);
    }
    for (int i = 0; i < 2; ++i) {
      p.dq_neg[i] = _mm512_setr_ps(-d[4 * i], -d[4 * i], -d[4 * i], -d[4 * i], -d[4 * i + 1], -d[4 * i + 1],
                                   -d[4 * i + 1], -d[4 * i + 1], -d[4 * i + 2], -d[4 * i + 2], -d[4 * i + 2],
                                   -d[4 * i + 2], -d[4 * i + 3], -d[4 * i + 3], -d[4 * i + 3], -d[4 * i + 3]);
      p.bs[i] = _mm512_load_si512(bs[4 * i]);
    }
    p.d8_neg = _mm256_xor_ps(_mm256_load_ps(d), _mm256_set1_ps(-0.0f));  // exact negation, -0 kept
  }
}

// One weight row x NC (1..8) tokens of a prepared group, Q4_K or Q5_K (BW). Per token j the 8
// scale lanes are half j%2 of acc[j/2]; each gets exactly the fma sequence of vec_dot (dw * dy
// and -(dmin * dy) = dmin * -dy are the same roundings).
//  Q4_K: the 4 min lanes of token j are quarter j%4 of accm[j/4], as vec_dot_q4_k's 4-lane fma.
//  Q5_K: the 5-bit values are the nibbles with bit 2c (low half of chunk c) or 2c+1 (high half)
//    of qh as 16, both halves from one broadcast of qh shifted per half (srlv). vec_dot_q5_k sums
//    a token's mins in one float, summs = fma((float)hsum(mins4), -(dmin * dy), summs); here the
//    four int32 mins lanes of each token are summed in integers (exact in any order) and the
//    eight tokens' fmas are one ymm fma, lane j being token j's scalar sequence.
template <int NC, class BW>
inline void k45_group_tile_vnni(int64_t nb, const BW* w, const BlockQ8_K* const* y, const Q4KGroupPrep* prep,
                                float* out, size_t ldo) {
  constexpr bool kQ5 = std::is_same_v<BW, BlockQ5_K>;
  constexpr int NP = (NC + 1) / 2, NQ = (NC + 3) / 4;
  const __m512i m4 = _mm512_set1_epi8(0x0F);
  const __m512i bit4 = _mm512_set1_epi8(0x10);
  __m512 acc[NP], accm[NQ];
  __m256 summs = _mm256_setzero_ps();
#pragma GCC unroll 4
  for (int p = 0; p < NP; ++p) acc[p] = _mm512_setzero_ps();
#pragma GCC unroll 2
  for (int q = 0; q < NQ; ++q) accm[q] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const BW& x = w[b];
    uint64_t sc, m;
    unpack_k4_scales(x.scales, &sc, &m);
    const __m512i sc16 = _mm512_broadcast_i32x4(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(static_cast<long long>(sc))));
    __m512i qh = _mm512_setzero_si512();
    if constexpr (kQ5) qh = _mm512_broadcast_i64x4(loadu256(x.qh));
    __m512i isum[2 * NP];
#pragma GCC unroll 8
    for (int j = 0; j < 2 * NP; ++j) isum[j] = _mm512_setzero_si512();
#pragma GCC unroll 4
    for (int c = 0; c < 4; ++c) {
      const __m256i q = loadu256(x.qs + 32 * c);
      __m512i qq = _mm512_and_si512(_mm512_inserti64x4(_mm512_castsi256_si512(q), _mm256_srli_epi16(q, 4), 1), m4);
      if constexpr (kQ5) {
        const __m512i shift = _mm512_inserti64x4(_mm512_set1_epi16(static_cast<int16_t>(2 * c)),
                                                 _mm256_set1_epi16(static_cast<int16_t>(2 * c + 1)), 1);
        qq = _mm512_or_si512(qq, _mm512_and_si512(_mm512_slli_epi16(_mm512_srlv_epi16(qh, shift), 4), bit4));
      }
      const __m512i s = _mm512_shuffle_epi8(sc16, bcast16_pair_ctrl(2 * c, 2 * c + 1));
#pragma GCC unroll 8
      for (int j = 0; j < NC; ++j) {
        isum[j] = _mm512_dpwssd_epi32(isum[j], _mm512_maddubs_epi16(qq, _mm512_loadu_si512(y[j][b].qs + 64 * c)), s);
      }
    }
    const Q4KGroupPrep& pr = prep[b];
    const __m512 dw = _mm512_set1_ps(h2f(x.d));
#pragma GCC unroll 4
    for (int p = 0; p < NP; ++p) {
      // [A.lo + A.hi | B.lo + B.hi]: fold_halves of tokens 2p and 2p+1 side by side.
      const __m512i lo = _mm512_shuffle_i64x2(isum[2 * p], isum[2 * p + 1], 0x44);
      const __m512i hi = _mm512_shuffle_i64x2(isum[2 * p], isum[2 * p + 1], 0xEE);
      acc[p] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(lo, hi)), _mm512_mul_ps(dw, pr.d2[p]), acc[p]);
    }
    const __m512i m16 = _mm512_broadcast_i32x4(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(static_cast<long long>(m))));
    const __m512 mw = _mm512_set1_ps(h2f(x.dmin));
    if constexpr (kQ5) {
      // madd gives a token's 4 lanes in one 128-bit lane; two in-lane adds put their sum in every
      // position; lane 0 of each 128-bit lane of both quads makes the 8 tokens.
      const __m512i gather0 = _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 0, 0, 0, 0, 0, 0, 0, 0);
      __m512i t[2];
      for (int q = 0; q < 2; ++q) {
        t[q] = _mm512_madd_epi16(pr.bs[q], m16);
        t[q] = _mm512_add_epi32(t[q], _mm512_shuffle_epi32(t[q], _MM_PERM_BADC));
        t[q] = _mm512_add_epi32(t[q], _mm512_shuffle_epi32(t[q], _MM_PERM_CDAB));
      }
      const __m256i mins8 = _mm512_castsi512_si256(_mm512_permutex2var_epi32(t[0], gather0, t[1]));
      summs = _mm256_fmadd_ps(_mm256_cvtepi32_ps(mins8), _mm256_mul_ps(_mm512_castps512_ps256(mw), pr.d8_neg), summs);
    } else {
#pragma GCC unroll 2
      for (int q = 0; q < NQ; ++q) {
        accm[q] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_madd_epi16(pr.bs[q], m16)), _mm512_mul_ps(mw, pr.dq_neg[q]),
                                  accm[q]);
      }
    }
  }
  alignas(32) float sm[8];
  _mm256_store_ps(sm, summs);
#pragma GCC unroll 8
  for (int j = 0; j < NC; ++j) {
    const __m512 a = acc[j / 2];
    const float scaled = reduce8((j % 2 == 0) ? _mm512_castps512_ps256(a) : _mm512_extractf32x8_ps(a, 1));
    if constexpr (kQ5) {
      out[static_cast<size_t>(j) * ldo] = scaled + sm[j];
    } else {
      // Quarter j % 4 through memory: an extract needs an immediate, and unoptimised (Debug,
      // sanitizer) builds do not unroll this loop into constants.
      alignas(64) float quad[16];
      _mm512_store_ps(quad, accm[j / 4]);
      __m128 mm = _mm_load_ps(quad + 4 * (j % 4));
      mm = _mm_add_ps(mm, _mm_movehl_ps(mm, mm));
      mm = _mm_add_ss(mm, _mm_movehdup_ps(mm));
      out[static_cast<size_t>(j) * ldo] = scaled + _mm_cvtss_f32(mm);
    }
  }
}

// ---- Q6_K with VNNI
//
// The unsigned 6-bit values' products accumulate with vpdpwssd into lanes that start at minus
// the -32 offset (q6k_offset_lanes: the token's 16-value sums times the row's scales times -32,
// one madd per token and block, in the low half so that folding adds it once). The float steps
// are vectorised over token pairs as in the Q4_K group tile.
struct alignas(64) Q6KGroupPrep {
  __m512 d2[4];
};

inline void q6k_prepare_group(int64_t nb, const BlockQ8_K* const* y, int cn, Q6KGroupPrep* prep) {
  for (int64_t b = 0; b < nb; ++b) {
    alignas(64) float d[8] = {};
    for (int j = 0; j < cn; ++j) d[j] = y[j][b].d;
    for (int i = 0; i < 4; ++i) {
      prep[b].d2[i] =
          _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_set1_ps(d[2 * i])), _mm256_set1_ps(d[2 * i + 1]), 1);
    }
  }
}

// The row's scales times -32 as int16 (|s| <= 4096), for q6k_offset_start.
inline __m256i q6k_neg32_scales(__m128i sc8) {
  return _mm256_sub_epi16(_mm256_setzero_si256(), _mm256_slli_epi16(_mm256_cvtepi8_epi16(sc8), 5));
}
// A zmm of int32 lanes whose fold is minus q6k_offset_lanes: the start of a token's sums.
inline __m512i q6k_offset_start(const BlockQ8_K& y, __m256i neg32_scales) {
  return _mm512_zextsi256_si512(_mm256_madd_epi16(loadu256(y.bsums), neg32_scales));
}

template <int NC>
inline void q6k_group_tile_vnni(int64_t nb, const BlockQ6_K* w, const BlockQ8_K* const* y, const Q6KGroupPrep* prep,
                                float* out, size_t ldo) {
  constexpr int NP = (NC + 1) / 2;
  const __m128i even_odd = _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
  __m512 acc[NP];
#pragma GCC unroll 4
  for (int p = 0; p < NP; ++p) acc[p] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const BlockQ6_K& x = w[b];
    const __m128i sc8 = loadu128(x.scales);
    const __m256i sc16y = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(sc8, even_odd));
    const __m512i sc16 = _mm512_inserti64x4(_mm512_castsi256_si512(sc16y), sc16y, 1);
    const __m256i neg32 = q6k_neg32_scales(sc8);
    const Q6KGroupPrep& pr = prep[b];
    __m512i isum[2 * NP];
#pragma GCC unroll 8
    for (int j = 0; j < NC; ++j) isum[j] = q6k_offset_start(y[j][b], neg32);
    if constexpr (NC % 2 == 1) isum[NC] = _mm512_setzero_si512();
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {
      const auto [qa, qb, sa, sb] = q6k_half_512(x, h, sc16);
#pragma GCC unroll 8
      for (int j = 0; j < NC; ++j) {
        isum[j] = _mm512_dpwssd_epi32(isum[j], _mm512_maddubs_epi16(qa, _mm512_loadu_si512(y[j][b].qs + 128 * h)), sa);
        isum[j] =
            _mm512_dpwssd_epi32(isum[j], _mm512_maddubs_epi16(qb, _mm512_loadu_si512(y[j][b].qs + 128 * h + 64)), sb);
      }
    }
    const __m512 dw = _mm512_set1_ps(h2f(x.d));
#pragma GCC unroll 4
    for (int p = 0; p < NP; ++p) {
      const __m512i lo = _mm512_shuffle_i64x2(isum[2 * p], isum[2 * p + 1], 0x44);
      const __m512i hi = _mm512_shuffle_i64x2(isum[2 * p], isum[2 * p + 1], 0xEE);
      acc[p] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(lo, hi)), _mm512_mul_ps(dw, pr.d2[p]), acc[p]);
    }
  }
#pragma GCC unroll 8
  for (int j = 0; j < NC; ++j) {
    const __m512 a = acc[j / 2];
    out[static_cast<size_t>(j) * ldo] =
        reduce8((j % 2 == 0) ? _mm512_castps512_ps256(a) : _mm512_extractf32x8_ps(a, 1));
  }
}

// ---- Batch-1 rows (decode's matvecs) with VNNI
//
// One activation row against many weight rows: whatever depends only on the activation is
// prepared once per call. Q4_K: the activations are repacked so that one 64-byte load of the
// weights' nibbles serves two zmm (low nibbles = sub-blocks 4p and 4p+2, high = 4p+1 and 4p+3:
// each 32-value sub-block still fills one 256-bit half in order, so the folded lanes are
// vec_dot's), plus the bsums' pair sums. Q6_K: the lanes start at minus the -32 offset (as in
// the group tile) and the high bits are shifted per half with one variable shift. Float steps and
// reduction are vec_dot's.
struct alignas(64) Q4KRowPrep {
  __m512i y[4];  // [S0|S2], [S1|S3], [S4|S6], [S5|S7]: the block's 32-value sub-blocks
  __m128i bs;    // bsums pair sums
  float d;
};

// The activation side of the Q4_K / Q5_K rows kernels for one token.
inline void q4k_prepare_rows(int64_t nb, const BlockQ8_K* x, Q4KRowPrep* prep) {
  for (int64_t b = 0; b < nb; ++b) {
    Q4KRowPrep& p = prep[b];
    for (int i = 0; i < 4; ++i) {
      // y[i] = [S(a) | S(a + 2)] with a = 4 * (i / 2) + i % 2.
      const int a = 4 * (i / 2) + i % 2;
      p.y[i] =
          _mm512_inserti64x4(_mm512_castsi256_si512(loadu256(x[b].qs + 32 * a)), loadu256(x[b].qs + 32 * (a + 2)), 1);
    }
    p.bs = _mm_hadd_epi16(loadu128(x[b].bsums), loadu128(x[b].bsums + 8));
    p.d = x[b].d;
  }
}

// Q4_K / Q5_K rows (BW). Q5_K: the fifth bit per half by one variable shift of the broadcast qh
// (sub-block k takes bit k) and vec_dot_q5_k's scalar mins.
template <class BW>
void rows_k45_vnni(int64_t n, const void* vw, size_t w_stride, int nr, const void* vx, float* out) {
  constexpr bool kQ5 = std::is_same_v<BW, BlockQ5_K>;
  const int64_t nb = n / kQKK;
  const auto* x = static_cast<const BlockQ8_K*>(vx);
  thread_local std::vector<Q4KRowPrep> prep;
  prep.resize(static_cast<size_t>(nb));
  q4k_prepare_rows(nb, x, prep.data());
  const __m512i m4 = _mm512_set1_epi8(0x0F);
  const __m512i bit4 = _mm512_set1_epi8(0x10);
  const __m512i ctrl[4] = {bcast16_pair_ctrl(0, 2), bcast16_pair_ctrl(1, 3), bcast16_pair_ctrl(4, 6),
                           bcast16_pair_ctrl(5, 7)};
  // The sub-blocks of zmm i are those of ctrl[i]: [a | a + 2] with a = 4 * (i / 2) + i % 2.
  __m512i shift[4];
  for (int i = 0; i < 4; ++i) {
    const int a = 4 * (i / 2) + i % 2;
    shift[i] = _mm512_inserti64x4(_mm512_set1_epi16(static_cast<int16_t>(a)),
                                  _mm256_set1_epi16(static_cast<int16_t>(a + 2)), 1);
  }
  for (int r = 0; r < nr; ++r) {
    const auto* w = reinterpret_cast<const BW*>(static_cast<const uint8_t*>(vw) + r * w_stride);
    __m256 acc = _mm256_setzero_ps();
    __m128 acc_m = _mm_setzero_ps();
    float summs = 0.0f;
    for (int64_t b = 0; b < nb; ++b) {
      const BW& xw = w[b];
      const Q4KRowPrep& p = prep[static_cast<size_t>(b)];
      uint64_t sc, m;
      unpack_k4_scales(xw.scales, &sc, &m);
      const __m512i sc16 = _mm512_broadcast_i32x4(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(static_cast<long long>(sc))));
      __m512i qh = _mm512_setzero_si512();
      if constexpr (kQ5) qh = _mm512_broadcast_i64x4(loadu256(xw.qh));
      __m512i isum = _mm512_setzero_si512();
#pragma GCC unroll 2
      for (int h = 0; h < 2; ++h) {
        const __m512i q = _mm512_loadu_si512(xw.qs + 64 * h);
        const __m512i nib[2] = {_mm512_and_si512(q, m4), _mm512_and_si512(_mm512_srli_epi16(q, 4), m4)};
#pragma GCC unroll 2
        for (int k = 0; k < 2; ++k) {
          const int i = 2 * h + k;
          __m512i v = nib[k];
          if constexpr (kQ5) {
            v = _mm512_or_si512(v, _mm512_and_si512(_mm512_slli_epi16(_mm512_srlv_epi16(qh, shift[i]), 4), bit4));
          }
          isum = _mm512_dpwssd_epi32(isum, _mm512_maddubs_epi16(v, p.y[i]), _mm512_shuffle_epi8(sc16, ctrl[i]));
        }
      }
      acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(fold_halves(isum)), _mm256_set1_ps(h2f(xw.d) * p.d), acc);
      const __m128i mins4 = _mm_madd_epi16(p.bs, _mm_cvtepu8_epi16(_mm_cvtsi64_si128(static_cast<long long>(m))));
      if constexpr (kQ5) {
        summs = std::fmaf(static_cast<float>(hsum_i32(mins4)), -(h2f(xw.dmin) * p.d), summs);
      } else {
        acc_m = _mm_fmadd_ps(_mm_cvtepi32_ps(mins4), _mm_set1_ps(-(h2f(xw.dmin) * p.d)), acc_m);
      }
    }
    if constexpr (kQ5) {
      out[r] = reduce8(acc) + summs;
    } else {
      q4k_tile_store<1>(&acc, &acc_m, out + r, 0);
    }
  }
}

void rows_q6_k_vnni(int64_t n, const void* vw, size_t w_stride, int nr, const void* vx, float* out) {
  const int64_t nb = n / kQKK;
  const auto* x = static_cast<const BlockQ8_K*>(vx);
  const __m512i m4 = _mm512_set1_epi8(0x0F);
  const __m512i m30 = _mm512_set1_epi8(0x30);
  // Per 16-bit element: q[0] | q[1] take the high bits <<4 | <<2, q[2] | q[3] >>0 | >>2.
  const __m512i shl_a = _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(2), 1);
  const __m512i shr_b = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(2), 1);
  const __m128i even_odd = _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
  const __m512i ctrl[4] = {bcast16_pair_ctrl(0, 1), bcast16_pair_ctrl(2, 3), bcast16_pair_ctrl(4, 5),
                           bcast16_pair_ctrl(6, 7)};
  for (int r = 0; r < nr; ++r) {
    const auto* w = reinterpret_cast<const BlockQ6_K*>(static_cast<const uint8_t*>(vw) + r * w_stride);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
      const BlockQ6_K& xw = w[b];
      const __m128i sc8 = loadu128(xw.scales);
      const __m256i sc16y = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(sc8, even_odd));
      const __m512i sc16 = _mm512_inserti64x4(_mm512_castsi256_si512(sc16y), sc16y, 1);
      __m512i isum = q6k_offset_start(x[b], q6k_neg32_scales(sc8));
#pragma GCC unroll 2
      for (int h = 0; h < 2; ++h) {
        const __m512i l = _mm512_loadu_si512(xw.ql + 64 * h);
        const __m512i hb = _mm512_broadcast_i64x4(loadu256(xw.qh + 32 * h));
        const __m512i qa =
            _mm512_or_si512(_mm512_and_si512(l, m4), _mm512_and_si512(_mm512_sllv_epi16(hb, shl_a), m30));
        const __m512i qb = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l, 4), m4),
                                           _mm512_and_si512(_mm512_srlv_epi16(hb, shr_b), m30));
        isum = _mm512_dpwssd_epi32(isum, _mm512_maddubs_epi16(qa, _mm512_loadu_si512(x[b].qs + 128 * h)),
                                   _mm512_shuffle_epi8(sc16, ctrl[2 * h]));
        isum = _mm512_dpwssd_epi32(isum, _mm512_maddubs_epi16(qb, _mm512_loadu_si512(x[b].qs + 128 * h + 64)),
                                   _mm512_shuffle_epi8(sc16, ctrl[2 * h + 1]));
      }
      acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(fold_halves(isum)), _mm256_set1_ps(h2f(xw.d) * x[b].d), acc);
    }
    out[r] = reduce8(acc);
  }
}

// GroupTile<NC>::run for a run-time cn in [1, Max].
template <template <int> class GroupTile, int Max, class BW, class Prep>
inline void run_group_tile(int cn, int64_t nb, const BW* w, const BlockQ8_K* const* y, const Prep* prep, float* o,
                           size_t ldo) {
  if constexpr (Max == 1) {
    GroupTile<1>::run(nb, w, y, prep, o, ldo);
  } else if (cn == Max) {
    GroupTile<Max>::run(nb, w, y, prep, o, ldo);
  } else {
    run_group_tile<GroupTile, Max - 1>(cn, nb, w, y, prep, o, ldo);
  }
}

template <int NC>
struct Q4KGroupTile {
  static void run(int64_t nb, const BlockQ4_K* w, const BlockQ8_K* const* y, const Q4KGroupPrep* prep, float* o,
                  size_t ldo) {
    k45_group_tile_vnni<NC>(nb, w, y, prep, o, ldo);
  }
};
template <int NC>
struct Q5KGroupTile {
  static void run(int64_t nb, const BlockQ5_K* w, const BlockQ8_K* const* y, const Q4KGroupPrep* prep, float* o,
                  size_t ldo) {
    k45_group_tile_vnni<NC>(nb, w, y, prep, o, ldo);
  }
};
template <int NC>
struct Q6KGroupTile {
  static void run(int64_t nb, const BlockQ6_K* w, const BlockQ8_K* const* y, const Q6KGroupPrep* prep, float* o,
                  size_t ldo) {
    q6k_group_tile_vnni<NC>(nb, w, y, prep, o, ldo);
  }
};

// One tile call: token groups of 8, each prepared once (Prep) for all nr weight rows.
template <class BW, class Prep, void (*kPrepare)(int64_t, const BlockQ8_K* const*, int, Prep*),
          template <int> class GroupTile>
void tile_k_groups(int64_t n, const void* vw, size_t w_stride, int nr, const void* vx, size_t x_stride, int nc,
                   float* out, size_t ldo) {
  constexpr int kNC = 8;
  const int64_t nb = n / kQKK;
  thread_local std::vector<Prep> prep;
  prep.resize(static_cast<size_t>(nb));
  for (int c0 = 0; c0 < nc; c0 += kNC) {
    const int cn = std::min(kNC, nc - c0);
    const BlockQ8_K* y[kNC];
    for (int j = 0; j < cn; ++j) {
      y[j] = reinterpret_cast<const BlockQ8_K*>(static_cast<const uint8_t*>(vx) + (c0 + j) * x_stride);
    }
    kPrepare(nb, y, cn, prep.data());
    for (int r = 0; r < nr; ++r) {
      const auto* w = reinterpret_cast<const BW*>(static_cast<const uint8_t*>(vw) + r * w_stride);
      run_group_tile<GroupTile, kNC>(cn, nb, w, y, prep.data(), out + static_cast<size_t>(c0) * ldo + r, ldo);
    }
  }
}
#endif

// RowTile<NC>::run for a run-time cn in [1, Max].
template <template <int> class RowTile, int Max, class BW, class BY>
inline void run_row_tile(int cn, int64_t nb, const BW* w, const BY* const* y, float* o, size_t ldo) {
  if constexpr (Max == 1) {
    RowTile<1>::run(nb, w, y, o, ldo);
  } else {
    if (cn == Max) {
      RowTile<Max>::run(nb, w, y, o, ldo);
    } else {
      run_row_tile<RowTile, Max - 1>(cn, nb, w, y, o, ldo);
    }
  }
}

// Rows x tokens in groups of up to kNC tokens, each row against the group through RowTile<NC>
// (BW weight blocks of kBlock values, BY activation blocks).
template <class BW, class BY, int kBlock, template <int> class RowTile, int kNC = 4>
void tile_rows(int64_t n, const void* vw, size_t w_stride, int nr, const void* vx, size_t x_stride, int nc, float* out,
               size_t ldo) {
  const int64_t nb = n / kBlock;
  for (int c0 = 0; c0 < nc; c0 += kNC) {
    const int cn = std::min(kNC, nc - c0);
    const BY* y[kNC];
    for (int j = 0; j < cn; ++j) {
      y[j] = reinterpret_cast<const BY*>(static_cast<const uint8_t*>(vx) + (c0 + j) * x_stride);
    }
    for (int r = 0; r < nr; ++r) {
      const auto* w = reinterpret_cast<const BW*>(static_cast<const uint8_t*>(vw) + r * w_stride);
      float* o = out + static_cast<size_t>(c0) * ldo + static_cast<size_t>(r);
      run_row_tile<RowTile, kNC>(cn, nb, w, y, o, ldo);
    }
  }
}

// ---- Q2_K / Q3_K / IQ4_XS: one weight row x NC tokens. The super-block is unpacked once
// (KChunks: 8 chunks and their scales) for all NC tokens; per token the same int32 lanes as
// vec_dot (kchunks_isum) and vec_dot's float steps (Q2_K: its min lanes first).
template <class P, int NC>
inline void kchunks_row_tile(int64_t nb, const typename P::BW* w, const BlockQ8_K* const* y, float* out, size_t ldo) {
  __m256 acc[NC];
#pragma GCC unroll 8
  for (int j = 0; j < NC; ++j) acc[j] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    KChunks c;
    P::chunks(w[b], &c);
#pragma GCC unroll 8
    for (int j = 0; j < NC; ++j) {
      const BlockQ8_K& yb = y[j][b];
      if constexpr (P::kMinMode == 3) {
        acc[j] =
            _mm256_fmadd_ps(_mm256_cvtepi32_ps(P::mins8(w[b], yb)), _mm256_set1_ps(-P::min_scale(w[b], yb)), acc[j]);
      }
      acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(kchunks_isum<P>(c, yb)), _mm256_set1_ps(P::scale(w[b], yb)), acc[j]);
    }
  }
  for (int j = 0; j < NC; ++j) out[static_cast<size_t>(j) * ldo] = reduce8(acc[j]);
}
template <class P>
struct KChunksRowTile {
  template <int NC>
  struct Of {
    static void run(int64_t nb, const typename P::BW* w, const BlockQ8_K* const* y, float* o, size_t ldo) {
      kchunks_row_tile<P, NC>(nb, w, y, o, ldo);
    }
  };
};

// RowTile<NC> for a 32-element policy: Blocks32RowTile<P>::Of.
template <class P>
struct Blocks32RowTile {
  template <int NC>
  struct Of {
    static void run(int64_t nb, const typename P::BW* w, const typename P::BY* const* y, float* o, size_t ldo) {
      blocks32_row_tile<P, NC>(nb, w, y, o, ldo);
    }
  };
};
template <int NC>
struct MXFP4RowTile {
  static void run(int64_t nb, const BlockMXFP4* w, const BlockQ8_0* const* y, float* o, size_t ldo) {
    mxfp4_row_tile<NC>(nb, w, y, o, ldo);
  }
};
template <int NC>
struct Q4KRowTile {
  static void run(int64_t nb, const BlockQ4_K* w, const BlockQ8_K* const* y, float* o, size_t ldo) {
    q4k_row_tile<NC>(nb, w, y, o, ldo);
  }
};
template <int NC>
struct Q6KRowTile {
  static void run(int64_t nb, const BlockQ6_K* w, const BlockQ8_K* const* y, float* o, size_t ldo) {
    q6k_row_tile<NC>(nb, w, y, o, ldo);
  }
};
#if defined(__AVX512BW__)
template <int NC>
struct Q4KRowTile512 {
  static void run(int64_t nb, const BlockQ4_K* w, const BlockQ8_K* const* y, float* o, size_t ldo) {
    q4k_row_tile_512<NC>(nb, w, y, o, ldo);
  }
};
template <int NC>
struct Q6KRowTile512 {
  static void run(int64_t nb, const BlockQ6_K* w, const BlockQ8_K* const* y, float* o, size_t ldo) {
    q6k_row_tile_512<NC>(nb, w, y, o, ldo);
  }
};
#endif

inline void fill_tiles(KernelTable* t) {
#if defined(__AVX512VNNI__)
  t->type[static_cast<int>(GgmlType::Q8_0)].vec_dot_tile = tile_q8_0_vnni;
#else
  t->type[static_cast<int>(GgmlType::Q8_0)].vec_dot_tile =
      tile_rows<BlockQ8_0, BlockQ8_0, kQK, Blocks32RowTile<PolicyQ8_0>::Of>;
#endif
  t->type[static_cast<int>(GgmlType::Q4_0)].vec_dot_tile =
      tile_rows<BlockQ4_0, BlockQ8_0, kQK, Blocks32RowTile<PolicyQ4_0>::Of>;
  // AVX-512 builds have 32 vector registers: twice the activation rows per weight row.
#if defined(__AVX512F__)
  constexpr int kNC32 = 8;
#else
  constexpr int kNC32 = 4;
#endif
  t->type[static_cast<int>(GgmlType::Q5_0)].vec_dot_tile =
      tile_rows<BlockQ5_0, BlockQ8_0, kQK, Blocks32RowTile<PolicyQ5_0>::Of, kNC32>;
  t->type[static_cast<int>(GgmlType::IQ4_NL)].vec_dot_tile =
      tile_rows<BlockIQ4_NL, BlockQ8_0, kQK, Blocks32RowTile<PolicyIQ4_NL>::Of, kNC32>;
  t->type[static_cast<int>(GgmlType::Q4_1)].vec_dot_tile =
      tile_rows<BlockQ4_1, BlockQ8_1, kQK, Blocks32RowTile<PolicyQ4_1>::Of, kNC32>;
  t->type[static_cast<int>(GgmlType::Q5_1)].vec_dot_tile =
      tile_rows<BlockQ5_1, BlockQ8_1, kQK, Blocks32RowTile<PolicyQ5_1>::Of, kNC32>;
  t->type[static_cast<int>(GgmlType::F32)].vec_dot_tile = tile_lanes<Row8F32, float>;
  t->type[static_cast<int>(GgmlType::F16)].vec_dot_tile = tile_lanes<Row8F16, uint16_t>;
  t->type[static_cast<int>(GgmlType::BF16)].vec_dot_tile = tile_lanes<Row8BF16, uint16_t>;
  t->type[static_cast<int>(GgmlType::Q2_K)].vec_dot_tile =
      tile_rows<BlockQ2_K, BlockQ8_K, kQKK, KChunksRowTile<PolicyQ2_K>::Of, kNC32>;
  t->type[static_cast<int>(GgmlType::Q3_K)].vec_dot_tile =
      tile_rows<BlockQ3_K, BlockQ8_K, kQKK, KChunksRowTile<PolicyQ3_K>::Of, kNC32>;
  t->type[static_cast<int>(GgmlType::IQ4_XS)].vec_dot_tile =
      tile_rows<BlockIQ4_XS, BlockQ8_K, kQKK, KChunksRowTile<PolicyIQ4_XS>::Of, kNC32>;
#if defined(__AVX512VNNI__)
  t->type[static_cast<int>(GgmlType::MXFP4)].vec_dot_tile = tile_mxfp4_vnni;
#else
  t->type[static_cast<int>(GgmlType::MXFP4)].vec_dot_tile = tile_rows<BlockMXFP4, BlockQ8_0, kQK, MXFP4RowTile, kNC32>;
#endif
#if defined(__AVX512BW__)
  t->type[static_cast<int>(GgmlType::Q4_K)].vec_dot_tile = tile_rows<BlockQ4_K, BlockQ8_K, kQKK, Q4KRowTile512, 8>;
  t->type[static_cast<int>(GgmlType::Q6_K)].vec_dot_tile = tile_rows<BlockQ6_K, BlockQ8_K, kQKK, Q6KRowTile512, 8>;
  t->type[static_cast<int>(GgmlType::Q4_K)].vec_dot = vec_dot_q4_k_512;
#if defined(__AVX512VNNI__)
  t->type[static_cast<int>(GgmlType::Q4_K)].vec_dot_tile =
      tile_k_groups<BlockQ4_K, Q4KGroupPrep, q4k_prepare_group, Q4KGroupTile>;
  t->type[static_cast<int>(GgmlType::Q6_K)].vec_dot_tile =
      tile_k_groups<BlockQ6_K, Q6KGroupPrep, q6k_prepare_group, Q6KGroupTile>;
  t->type[static_cast<int>(GgmlType::Q5_K)].vec_dot_tile =
      tile_k_groups<BlockQ5_K, Q4KGroupPrep, q4k_prepare_group, Q5KGroupTile>;
  t->type[static_cast<int>(GgmlType::Q4_K)].vec_dot_rows = rows_k45_vnni<BlockQ4_K>;
  t->type[static_cast<int>(GgmlType::Q5_K)].vec_dot_rows = rows_k45_vnni<BlockQ5_K>;
  t->type[static_cast<int>(GgmlType::Q6_K)].vec_dot_rows = rows_q6_k_vnni;
#endif
  t->type[static_cast<int>(GgmlType::Q6_K)].vec_dot = vec_dot_q6_k_512;
#else
  t->type[static_cast<int>(GgmlType::Q4_K)].vec_dot_tile = tile_rows<BlockQ4_K, BlockQ8_K, kQKK, Q4KRowTile>;
  t->type[static_cast<int>(GgmlType::Q6_K)].vec_dot_tile = tile_rows<BlockQ6_K, BlockQ8_K, kQKK, Q6KRowTile>;
#endif
}

}  // namespace
}  // namespace moesh::simd
