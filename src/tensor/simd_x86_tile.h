// x86 SIMD vec_dot_tile kernels (kernels.h): nr weight rows x nc activation rows in one pass,
// so each weight block is loaded and unpacked once per tile column group instead of once per
// output. Every output follows exactly the per-lane sequence of the matching vec_dot (same lane
// assignment, same fused ops, same reduce8), so tile == vec_dot bit for bit.
// Included only by kernels_avx2.cpp / kernels_avx512.cpp (see simd_x86.h).
#pragma once

#include <algorithm>

#include "simd_x86_kquant.h"
#include "simd_x86_legacy.h"

namespace moesh::simd {
namespace {

// ---- 32-element per-lane block types (Q8_0, Q4_0): one weight row x NC activation rows

// Each weight block is unpacked once (prep) and dotted with NC activation blocks; NC float
// accumulators stay in registers (a 4x4 grid of them would not fit AVX2's 16). Per output the
// float steps are vec_dot's per-lane ones: acc = fma(cvt(isum), dw*dy, acc) block by block.
template <class P, int NC>
inline void blocks32_row_tile(int64_t nb, const typename P::BW* w, const typename P::BY* const* y, float* out,
                              size_t ldo) {
  static_assert(P::kPerLane, "only per-lane block types have a row tile");
  const P p;
  __m256 acc[NC];
  for (int j = 0; j < NC; ++j) acc[j] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const __m256i q = p.prep(w[b]);
    const float dw = h2f(w[b].d);
    for (int j = 0; j < NC; ++j) {
      const typename P::BY& yb = y[j][b];
      acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p.dot(q, yb)), _mm256_set1_ps(dw * h2f(yb.d)), acc[j]);
    }
  }
  for (int j = 0; j < NC; ++j) out[static_cast<size_t>(j) * ldo] = reduce8(acc[j]);
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
    for (int j = 0; j < NC; ++j) isum[j] = _mm256_setzero_si256();
#pragma GCC unroll 4
    for (int c = 0; c < 4; ++c) {
      const __m256i q = loadu256(x.qs + 32 * c);
      const __m256i q_lo = _mm256_and_si256(q, m4);
      const __m256i q_hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
      const __m256i s_lo = _mm256_shuffle_epi8(sc16, bcast16_ctrl(2 * c));
      const __m256i s_hi = _mm256_shuffle_epi8(sc16, bcast16_ctrl(2 * c + 1));
      for (int j = 0; j < NC; ++j) {
        const int8_t* yq = y[j][b].qs + 64 * c;
        isum[j] =
            _mm256_add_epi32(isum[j], _mm256_add_epi32(scaled_u8s8(q_lo, yq, s_lo), scaled_u8s8(q_hi, yq + 32, s_hi)));
      }
    }
    const float dw = h2f(x.d), mw = h2f(x.dmin);
    for (int j = 0; j < NC; ++j) {
      const BlockQ8_K& q8 = y[j][b];
      acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[j]), _mm256_set1_ps(dw * q8.d), acc[j]);
      acc_m[j] = _mm_fmadd_ps(_mm_cvtepi32_ps(k4_mins4(m, q8)), _mm_set1_ps(-(mw * q8.d)), acc_m[j]);
    }
  }
  for (int j = 0; j < NC; ++j) {
    __m128 mm = _mm_add_ps(acc_m[j], _mm_movehl_ps(acc_m[j], acc_m[j]));
    mm = _mm_add_ss(mm, _mm_movehdup_ps(mm));
    out[static_cast<size_t>(j) * ldo] = reduce8(acc[j]) + _mm_cvtss_f32(mm);
  }
}

// ---- Q6_K: the same layout (one weight row x NC activation rows, registers only). Integer sums
// in any order are exact; the one float step per super-block is vec_dot_q6_k's.
template <int NC>
inline void q6k_row_tile(int64_t nb, const BlockQ6_K* w, const BlockQ8_K* const* y, float* out, size_t ldo) {
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  const __m256i m30 = _mm256_set1_epi8(0x30);
  const __m256i off = _mm256_set1_epi8(32);
  const __m128i even_odd = _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
  __m256 acc[NC];
  for (int j = 0; j < NC; ++j) acc[j] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const BlockQ6_K& x = w[b];
    const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(loadu128(x.scales), even_odd));
    __m256i isum[NC];
    for (int j = 0; j < NC; ++j) isum[j] = _mm256_setzero_si256();
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {
      const __m256i l0 = loadu256(x.ql + 64 * h);
      const __m256i l1 = loadu256(x.ql + 64 * h + 32);
      const __m256i hb = loadu256(x.qh + 32 * h);
      __m256i q[4];
      q[0] = _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_and_si256(_mm256_slli_epi16(hb, 4), m30));
      q[1] = _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_and_si256(_mm256_slli_epi16(hb, 2), m30));
      q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4), _mm256_and_si256(hb, m30));
      q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                             _mm256_and_si256(_mm256_srli_epi16(hb, 2), m30));
#pragma GCC unroll 4
      for (int k = 0; k < 4; ++k) {
        const __m256i s16 = _mm256_shuffle_epi8(sc16, bcast16_ctrl(4 * h + k));
        for (int j = 0; j < NC; ++j) {
          const __m256i yv = loadu256(y[j][b].qs + 128 * h + 32 * k);
          isum[j] = _mm256_add_epi32(isum[j], offset_u8s8(q[k], off, yv, s16));
        }
      }
    }
    const float dw = h2f(x.d);
    for (int j = 0; j < NC; ++j) {
      acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[j]), _mm256_set1_ps(dw * y[j][b].d), acc[j]);
    }
  }
  for (int j = 0; j < NC; ++j) out[static_cast<size_t>(j) * ldo] = reduce8(acc[j]);
}

// Rows x tokens in groups of up to 4 tokens, each row against the group through RowTile<NC>
// (BW weight blocks of kBlock values, BY activation blocks).
template <class BW, class BY, int kBlock, template <int> class RowTile>
void tile_rows(int64_t n, const void* vw, size_t w_stride, int nr, const void* vx, size_t x_stride, int nc, float* out,
               size_t ldo) {
  const int64_t nb = n / kBlock;
  constexpr int kNC = 4;
  for (int c0 = 0; c0 < nc; c0 += kNC) {
    const int cn = std::min(kNC, nc - c0);
    const BY* y[kNC];
    for (int j = 0; j < cn; ++j) {
      y[j] = reinterpret_cast<const BY*>(static_cast<const uint8_t*>(vx) + (c0 + j) * x_stride);
    }
    for (int r = 0; r < nr; ++r) {
      const auto* w = reinterpret_cast<const BW*>(static_cast<const uint8_t*>(vw) + r * w_stride);
      float* o = out + static_cast<size_t>(c0) * ldo + static_cast<size_t>(r);
      switch (cn) {
        case 4:
          RowTile<4>::run(nb, w, y, o, ldo);
          break;
        case 3:
          RowTile<3>::run(nb, w, y, o, ldo);
          break;
        case 2:
          RowTile<2>::run(nb, w, y, o, ldo);
          break;
        default:
          RowTile<1>::run(nb, w, y, o, ldo);
          break;
      }
    }
  }
}

template <int NC>
struct Q8_0RowTile {
  static void run(int64_t nb, const BlockQ8_0* w, const BlockQ8_0* const* y, float* o, size_t ldo) {
    blocks32_row_tile<PolicyQ8_0, NC>(nb, w, y, o, ldo);
  }
};
template <int NC>
struct Q4_0RowTile {
  static void run(int64_t nb, const BlockQ4_0* w, const BlockQ8_0* const* y, float* o, size_t ldo) {
    blocks32_row_tile<PolicyQ4_0, NC>(nb, w, y, o, ldo);
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

inline void fill_tiles(KernelTable* t) {
  t->type[static_cast<int>(GgmlType::Q8_0)].vec_dot_tile = tile_rows<BlockQ8_0, BlockQ8_0, kQK, Q8_0RowTile>;
  t->type[static_cast<int>(GgmlType::Q4_0)].vec_dot_tile = tile_rows<BlockQ4_0, BlockQ8_0, kQK, Q4_0RowTile>;
  t->type[static_cast<int>(GgmlType::Q4_K)].vec_dot_tile = tile_rows<BlockQ4_K, BlockQ8_K, kQKK, Q4KRowTile>;
  t->type[static_cast<int>(GgmlType::Q6_K)].vec_dot_tile = tile_rows<BlockQ6_K, BlockQ8_K, kQKK, Q6KRowTile>;
}

}  // namespace
}  // namespace moesh::simd
