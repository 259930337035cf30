// x86 SIMD dot products for the 256-element super-block types against Q8_K activations
// (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS, Q8_K), bit-identical to the scalar reference.
//
// Each super-block's integer part (isum = sum over sub-blocks of scale * sum(q*q8), and for
// Q2_K/Q4_K/Q5_K mins = sum_g bsums[g]*m(g)) is computed exactly with integer SIMD; the float part
// then follows quant.h. Per-lane types (Q4_K, Q5_K, Q6_K; llama.cpp's x86 order): the 8 int32
// lanes of isum (lane l = elements with (n % 32) / 4 == l) fuse with the scale into 8 float lanes,
// mins as kMinMode says. Others: super-block b fuses into lane b % 8; eight super-blocks at a time
// fill one __m256 (hsum_8x8 gathers their sums), leftovers go to their lanes in scalar, reduce8.
// Q4_K and Q6_K, the decode hot path, have their own loops at the end (same integers, same float
// steps as the per-lane path). Q6_K's -32 offset is taken off per lane from the activation's
// 16-value sums (q6k_offset_lanes), as ggml's AVX2 kernel does.
// Included only by kernels_avx2.cpp / kernels_avx512.cpp (see simd_x86.h).
#pragma once

#include "simd_x86.h"

namespace moesh::simd {
namespace {

// Per-type policy: isum(w, y) -> 8 int32 partial sums of the exact integer part; scale(w, y) the
// f32 factor; types with mins also give min_scale(w, y) and their mins as kMinMode says.
// kMinMode (per-lane types only): 0 no mins; 1 mins in 4 float lanes (Q4_K); 2 mins in one
// scalar (Q5_K); 3 mins in the 8 main lanes, fused before the block's products (Q2_K) --
// llama.cpp's x86 vec_dot does exactly this.
template <class P>
float dot_superblocks(int64_t n, const void* vw, const void* vy) {
  const auto* w = static_cast<const typename P::BW*>(vw);
  const auto* y = static_cast<const BlockQ8_K*>(vy);
  const int64_t nb = n / kQKK;
  __m256 acc = _mm256_setzero_ps();
  if constexpr (P::kPerLane) {
    __m128 acc_m = _mm_setzero_ps();
    float summs = 0.0f;
    for (int64_t b = 0; b < nb; ++b) {
      if constexpr (P::kMinMode == 3) {
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(P::mins8(w[b], y[b])), _mm256_set1_ps(-P::min_scale(w[b], y[b])), acc);
      }
      acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(P::isum(w[b], y[b])), _mm256_set1_ps(P::scale(w[b], y[b])), acc);
      if constexpr (P::kMinMode == 1) {
        acc_m = _mm_fmadd_ps(_mm_cvtepi32_ps(P::mins4(w[b], y[b])), _mm_set1_ps(-P::min_scale(w[b], y[b])), acc_m);
      } else if constexpr (P::kMinMode == 2) {
        summs = std::fmaf(static_cast<float>(hsum_i32(P::mins4(w[b], y[b]))), -P::min_scale(w[b], y[b]), summs);
      }
    }
    if constexpr (P::kMinMode == 1) {
      acc_m = _mm_add_ps(acc_m, _mm_movehl_ps(acc_m, acc_m));
      acc_m = _mm_add_ss(acc_m, _mm_movehdup_ps(acc_m));
      return reduce8(acc) + _mm_cvtss_f32(acc_m);
    }
    return reduce8(acc) + summs;
  }
  int64_t b = 0;
  for (; b + 8 <= nb; b += 8) {
    __m256i s[8];
    alignas(32) float sc[8];
    for (int k = 0; k < 8; ++k) {
      s[k] = P::isum(w[b + k], y[b + k]);
      sc[k] = P::scale(w[b + k], y[b + k]);
    }
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(hsum_8x8(s)), _mm256_load_ps(sc), acc);
  }
  alignas(32) float a[8];
  _mm256_store_ps(a, acc);
  for (; b < nb; ++b) {
    float& l = a[b & 7];
    l = std::fmaf(static_cast<float>(hsum_i32(P::isum(w[b], y[b]))), P::scale(w[b], y[b]), l);
  }
  return reduce8(_mm256_load_ps(a));
}

using quant::ref::unpack_k4_scales;

// The 4 int32 lanes m(2i)*sum32(2i) + m(2i+1)*sum32(2i+1) for eight u8 mins packed in a u64.
inline __m128i k4_mins4(uint64_t m, const BlockQ8_K& y) {
  const __m128i m16 = _mm_cvtepu8_epi16(_mm_cvtsi64_si128(static_cast<long long>(m)));
  const __m128i bs = _mm_hadd_epi16(loadu128(y.bsums), loadu128(y.bsums + 8));  // pairs: |.| <= 4064
  return _mm_madd_epi16(bs, m16);
}

// sum_g bsums[g] * m[g/2] for eight u8 mins packed in a u64.
inline int k4_mins(uint64_t m, const BlockQ8_K& y) {
  return hsum_i32(k4_mins4(m, y));
}

// 32 unsigned values (<= 63) x 32 activations, times one scale broadcast as int16.
inline __m256i scaled_u8s8(__m256i q, const int8_t* y, __m256i scale16) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(q, loadu256(y)), scale16);
}

struct PolicyQ4_K {
  using BW = BlockQ4_K;
  static constexpr bool kPerLane = true;
  static constexpr int kMinMode = 1;
  static __m256i isum(const BW& w, const BlockQ8_K& y) {
    uint64_t sc, m;
    unpack_k4_scales(w.scales, &sc, &m);
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    __m256i acc = _mm256_setzero_si256();
    for (int c = 0; c < 4; ++c) {
      const __m256i q = loadu256(w.qs + 32 * c);
      const __m256i s_lo = _mm256_set1_epi16(static_cast<int16_t>((sc >> (16 * c)) & 0xFF));
      const __m256i s_hi = _mm256_set1_epi16(static_cast<int16_t>((sc >> (16 * c + 8)) & 0xFF));
      acc = _mm256_add_epi32(acc, scaled_u8s8(_mm256_and_si256(q, m4), y.qs + 64 * c, s_lo));
      acc = _mm256_add_epi32(acc, scaled_u8s8(_mm256_and_si256(_mm256_srli_epi16(q, 4), m4), y.qs + 64 * c + 32, s_hi));
    }
    return acc;
  }
  static int mins(const BW& w, const BlockQ8_K& y) {
    uint64_t sc, m;
    unpack_k4_scales(w.scales, &sc, &m);
    return k4_mins(m, y);
  }
  static __m128i mins4(const BW& w, const BlockQ8_K& y) {
    uint64_t sc, m;
    unpack_k4_scales(w.scales, &sc, &m);
    return k4_mins4(m, y);
  }
  static float scale(const BW& w, const BlockQ8_K& y) { return h2f(w.d) * y.d; }
  static float min_scale(const BW& w, const BlockQ8_K& y) { return h2f(w.dmin) * y.d; }
};

struct PolicyQ5_K {
  using BW = BlockQ5_K;
  static constexpr bool kPerLane = true;
  static constexpr int kMinMode = 2;
  static __m256i isum(const BW& w, const BlockQ8_K& y) {
    uint64_t sc, m;
    unpack_k4_scales(w.scales, &sc, &m);
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    const __m256i bit4 = _mm256_set1_epi8(0x10);
    const __m256i qh = loadu256(w.qh);
    __m256i acc = _mm256_setzero_si256();
    for (int c = 0; c < 4; ++c) {
      const __m256i q = loadu256(w.qs + 32 * c);
      // bit 2c of qh[l] -> 16 for the low nibble, bit 2c+1 -> 16 for the high nibble.
      const __m256i h_lo = _mm256_and_si256(_mm256_slli_epi16(_mm256_srli_epi16(qh, 2 * c), 4), bit4);
      const __m256i h_hi = _mm256_and_si256(_mm256_slli_epi16(_mm256_srli_epi16(qh, 2 * c + 1), 4), bit4);
      const __m256i q_lo = _mm256_or_si256(_mm256_and_si256(q, m4), h_lo);
      const __m256i q_hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 4), m4), h_hi);
      const __m256i s_lo = _mm256_set1_epi16(static_cast<int16_t>((sc >> (16 * c)) & 0xFF));
      const __m256i s_hi = _mm256_set1_epi16(static_cast<int16_t>((sc >> (16 * c + 8)) & 0xFF));
      acc = _mm256_add_epi32(acc, scaled_u8s8(q_lo, y.qs + 64 * c, s_lo));
      acc = _mm256_add_epi32(acc, scaled_u8s8(q_hi, y.qs + 64 * c + 32, s_hi));
    }
    return acc;
  }
  static int mins(const BW& w, const BlockQ8_K& y) {
    uint64_t sc, m;
    unpack_k4_scales(w.scales, &sc, &m);
    return k4_mins(m, y);
  }
  static __m128i mins4(const BW& w, const BlockQ8_K& y) {
    uint64_t sc, m;
    unpack_k4_scales(w.scales, &sc, &m);
    return k4_mins4(m, y);
  }
  static float scale(const BW& w, const BlockQ8_K& y) { return h2f(w.d) * y.d; }
  static float min_scale(const BW& w, const BlockQ8_K& y) { return h2f(w.dmin) * y.d; }
};

// Scale vector for a 32-element run whose first 16 values use s0 and last 16 use s1: maddubs
// leaves elements 0..15 in the low 128-bit lane and 16..31 in the high one.
inline __m256i scale_pair16(int s0, int s1) {
  return _mm256_set_m128i(_mm_set1_epi16(static_cast<int16_t>(s1)), _mm_set1_epi16(static_cast<int16_t>(s0)));
}

// The Q2_K / Q3_K / IQ4_XS super-block as 8 chunks of 32 values (chunk k = elements 32k..32k+31,
// bytes for chunk_dot) and each chunk's int16 scales (first 16 values | last 16); the 8 int32
// lanes are sum_k madd(chunk_dot(q[k], y chunk k), s[k]). The row tiles unpack a block once for
// many tokens.
struct KChunks {
  __m256i q[8];
  __m256i s[8];
};
template <class P>
inline __m256i kchunks_isum(const KChunks& c, const BlockQ8_K& y) {
  __m256i acc = _mm256_setzero_si256();
#pragma GCC unroll 8
  for (int k = 0; k < 8; ++k) {
    acc = _mm256_add_epi32(acc, _mm256_madd_epi16(P::chunk_dot(c.q[k], loadu256(y.qs + 32 * k)), c.s[k]));
  }
  return acc;
}

struct PolicyQ3_K {
  using BW = BlockQ3_K;
  static constexpr bool kPerLane = true;
  static constexpr int kMinMode = 0;
  // v = q2 + 4*hbit in 0..7 (unsigned); the value is v - 4: (v - 4).y = v.y - 4.y, both exact.
  static __m256i chunk_dot(__m256i v, __m256i yv) {
    return _mm256_sub_epi16(_mm256_maddubs_epi16(v, yv), _mm256_maddubs_epi16(_mm256_set1_epi8(4), yv));
  }
  static void chunks(const BW& w, KChunks* c) {
    // Sixteen 6-bit scale codes (docs/background/quant-formats.md §3), four per u32.
    uint32_t w0, w1, w2;
    std::memcpy(&w0, w.scales, 4);
    std::memcpy(&w1, w.scales + 4, 4);
    std::memcpy(&w2, w.scales + 8, 4);
    uint32_t sv[4];
    sv[0] = (w0 & 0x0f0f0f0fu) | ((w2 & 0x03030303u) << 4);
    sv[1] = (w1 & 0x0f0f0f0fu) | (((w2 >> 2) & 0x03030303u) << 4);
    sv[2] = ((w0 >> 4) & 0x0f0f0f0fu) | (((w2 >> 4) & 0x03030303u) << 4);
    sv[3] = ((w1 >> 4) & 0x0f0f0f0fu) | (((w2 >> 6) & 0x03030303u) << 4);
    uint8_t S[16];
    std::memcpy(S, sv, 16);
    const __m256i m3 = _mm256_set1_epi8(3);
    const __m256i hm = loadu256(w.hmask);
    for (int h = 0; h < 2; ++h) {
      const __m256i qs = loadu256(w.qs + 32 * h);
      for (int j = 0; j < 4; ++j) {
        const int bit = 4 * h + j;
        const __m256i q2 = _mm256_and_si256(_mm256_srli_epi16(qs, 2 * j), m3);
        const __m256i hb = _mm256_and_si256(_mm256_srli_epi16(hm, bit), _mm256_set1_epi8(1));
        const int s = 8 * h + 2 * j;
        c->q[4 * h + j] = _mm256_or_si256(q2, _mm256_slli_epi16(hb, 2));
        c->s[4 * h + j] = scale_pair16(S[s] - 32, S[s + 1] - 32);
      }
    }
  }
  static __m256i isum(const BW& w, const BlockQ8_K& y) {
    KChunks c;
    chunks(w, &c);
    return kchunks_isum<PolicyQ3_K>(c, y);
  }
  static float scale(const BW& w, const BlockQ8_K& y) { return h2f(w.d) * y.d; }
};

struct PolicyQ2_K {
  using BW = BlockQ2_K;
  static constexpr bool kPerLane = true;
  static constexpr int kMinMode = 3;
  static __m256i chunk_dot(__m256i q, __m256i yv) { return _mm256_maddubs_epi16(q, yv); }  // q in 0..3
  static void chunks(const BW& w, KChunks* c) {
    const __m256i m3 = _mm256_set1_epi8(3);
    for (int h = 0; h < 2; ++h) {
      const __m256i qs = loadu256(w.qs + 32 * h);
      for (int j = 0; j < 4; ++j) {
        const int s = 8 * h + 2 * j;
        c->q[4 * h + j] = _mm256_and_si256(_mm256_srli_epi16(qs, 2 * j), m3);
        c->s[4 * h + j] = scale_pair16(w.scales[s] & 15, w.scales[s + 1] & 15);
      }
    }
  }
  static __m256i isum(const BW& w, const BlockQ8_K& y) {
    KChunks c;
    chunks(w, &c);
    return kchunks_isum<PolicyQ2_K>(c, y);
  }
  // Lane l: m[2l] * bsums[2l] + m[2l+1] * bsums[2l+1] (the 4-bit mins, |.| <= 2 * 15 * 2032).
  static __m256i mins8(const BW& w, const BlockQ8_K& y) {
    const __m128i m = _mm_srli_epi16(_mm_and_si128(loadu128(w.scales), _mm_set1_epi8(static_cast<char>(0xF0))), 4);
    return _mm256_madd_epi16(_mm256_cvtepu8_epi16(m), loadu256(y.bsums));
  }
  static float scale(const BW& w, const BlockQ8_K& y) { return y.d * h2f(w.d); }
  static float min_scale(const BW& w, const BlockQ8_K& y) { return y.d * h2f(w.dmin); }
};

struct PolicyIQ4_XS {
  using BW = BlockIQ4_XS;
  static constexpr bool kPerLane = true;
  static constexpr int kMinMode = 0;
  // Signed codebook values: |q| x sign(y, q), exact in int16.
  static __m256i chunk_dot(__m256i q, __m256i yv) {
    return _mm256_maddubs_epi16(_mm256_sign_epi8(q, q), _mm256_sign_epi8(yv, q));
  }
  static void chunks(const BW& w, KChunks* c) {
    const __m256i table = _mm256_broadcastsi128_si256(loadu128(k_values_iq4nl));
    for (int ib = 0; ib < 8; ++ib) {
      const int ls = ((w.scales_l[ib / 2] >> (4 * (ib % 2))) & 15) | (((w.scales_h >> (2 * ib)) & 3) << 4);
      c->q[ib] = _mm256_shuffle_epi8(table, unpack_nibbles16(w.qs + 16 * ib));
      c->s[ib] = _mm256_set1_epi16(static_cast<int16_t>(ls - 32));
    }
  }
  static __m256i isum(const BW& w, const BlockQ8_K& y) {
    KChunks c;
    chunks(w, &c);
    return kchunks_isum<PolicyIQ4_XS>(c, y);
  }
  static float scale(const BW& w, const BlockQ8_K& y) { return h2f(w.d) * y.d; }
};

struct PolicyQ8_K {
  using BW = BlockQ8_K;
  static constexpr bool kPerLane = false;
  static constexpr int kMinMode = 0;
  // Widen to int16 first: Q8_K weights may hold -128, which the sign trick cannot take.
  static __m256i isum(const BW& w, const BlockQ8_K& y) {
    __m256i acc = _mm256_setzero_si256();
    for (int k = 0; k < 16; ++k) {
      const __m256i a = _mm256_cvtepi8_epi16(loadu128(w.qs + 16 * k));
      const __m256i b = _mm256_cvtepi8_epi16(loadu128(y.qs + 16 * k));
      acc = _mm256_add_epi32(acc, _mm256_madd_epi16(a, b));
    }
    return acc;
  }
  static float scale(const BW& w, const BlockQ8_K& y) { return w.d * y.d; }
};

// ---- Dedicated Q4_K / Q6_K loops (the decode hot path: matvec streams their weights from DRAM).
// Same integers and the same float steps as the per-lane path of dot_superblocks above; they only
// do less work per super-block: scales unpacked once and broadcast by one in-lane shuffle each
// (not a scalar extract + broadcast per 32 elements), loops fully unrolled (GCC -O2 otherwise
// keeps them rolled and spills the Q6_K quants to the stack), and the weights prefetched ahead.

// How far ahead (bytes) the weight stream is prefetched: ~5-7 super-blocks, enough to hide DRAM
// latency at one thread (512 and 1024 both beat none by 10-20% on Zen 3; 1024 was a bit better).
constexpr int kKQuantPrefetch = 1024;
// Q4_K goes further ahead (~14 of its 144-byte blocks): against 1024, 2048 raised the batch-1
// mean weight GB/s in each of four A/B runs on Zen 3 (bench_kernels, expert shapes), by
// 0.3-7% at 1 thread and 0.5-8% at 2 -- small next to the run-to-run noise of a single shape,
// but never a loss on the mean. 1536, 3072 and 4096 did no better. (Reading two rows per call to
// share the activation loads was 20-40% slower: it splits the one sequential weight stream of a
// task's contiguous rows into two, which the hardware prefetcher follows much worse.)
constexpr int kQ4KPrefetch = 2048;

// Prefetches kLines lines 64 bytes apart, kDist bytes past p. With kLines * 64 >= the
// block size, consecutive blocks leave no line untouched. A prefetch never faults, so running past
// the end of the weights is harmless.
template <int kLines, int kDist = kKQuantPrefetch>
inline void prefetch_ahead(const void* p) {
  const char* c = static_cast<const char*>(p) + kDist;
#pragma GCC unroll 4
  for (int i = 0; i < kLines; ++i) _mm_prefetch(c + 64 * i, _MM_HINT_T0);
}

// Shuffle control that broadcasts int16 element k (0..7) of each 128-bit lane to its lane.
inline __m256i bcast16_ctrl(int k) {
  return _mm256_set1_epi16(static_cast<int16_t>((2 * k) | ((2 * k + 1) << 8)));
}

float vec_dot_q4_k(int64_t n, const void* vw, const void* vy) {
  const auto* w = static_cast<const BlockQ4_K*>(vw);
  const auto* y = static_cast<const BlockQ8_K*>(vy);
  const int64_t nb = n / kQKK;
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  __m256 acc = _mm256_setzero_ps();
  __m128 acc_m = _mm_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const BlockQ4_K& x = w[b];
    const BlockQ8_K& q8 = y[b];
    prefetch_ahead<3, kQ4KPrefetch>(&x);  // 144-byte blocks
    uint64_t sc, m;
    unpack_k4_scales(x.scales, &sc, &m);
    // Eight u8 scales as int16 in both 128-bit lanes; chunk j's scale is element j.
    const __m256i sc16 = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(static_cast<long long>(sc))));
    // q <= 15, |y| <= 127: maddubs pairs <= 3810, times a scale <= 63 -- all exact.
    __m256i s_lo = _mm256_setzero_si256();
    __m256i s_hi = _mm256_setzero_si256();
#pragma GCC unroll 4
    for (int c = 0; c < 4; ++c) {
      const __m256i q = loadu256(x.qs + 32 * c);
      const __m256i p_lo = _mm256_maddubs_epi16(_mm256_and_si256(q, m4), loadu256(q8.qs + 64 * c));
      const __m256i p_hi =
          _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(q, 4), m4), loadu256(q8.qs + 64 * c + 32));
      s_lo = _mm256_add_epi32(s_lo, _mm256_madd_epi16(p_lo, _mm256_shuffle_epi8(sc16, bcast16_ctrl(2 * c))));
      s_hi = _mm256_add_epi32(s_hi, _mm256_madd_epi16(p_hi, _mm256_shuffle_epi8(sc16, bcast16_ctrl(2 * c + 1))));
    }
    const float d = h2f(x.d) * q8.d;
    const float dmin = h2f(x.dmin) * q8.d;
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(s_lo, s_hi)), _mm256_set1_ps(d), acc);
    acc_m = _mm_fmadd_ps(_mm_cvtepi32_ps(k4_mins4(m, q8)), _mm_set1_ps(-dmin), acc_m);
  }
  acc_m = _mm_add_ps(acc_m, _mm_movehl_ps(acc_m, acc_m));
  acc_m = _mm_add_ss(acc_m, _mm_movehdup_ps(acc_m));
  return reduce8(acc) + _mm_cvtss_f32(acc_m);
}

// The -32 offset of a Q6_K super-block as ggml's x86 kernel takes it off (quant.h): int32 lane l
// = 32 * (bsums[2l] * scale[2l] + bsums[2l+1] * scale[2l+1]), the products summed with unsigned
// 6-bit values minus this give the canonical lanes. |lane| <= 32 * 2 * 2032 * 128, exact.
inline __m256i q6k_offset_lanes(const BlockQ6_K& x, const BlockQ8_K& y) {
  return _mm256_slli_epi32(_mm256_madd_epi16(loadu256(y.bsums), _mm256_cvtepi8_epi16(loadu128(x.scales))), 5);
}

float vec_dot_q6_k(int64_t n, const void* vw, const void* vy) {
  const auto* w = static_cast<const BlockQ6_K*>(vw);
  const auto* y = static_cast<const BlockQ8_K*>(vy);
  const int64_t nb = n / kQKK;
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  const __m256i m30 = _mm256_set1_epi8(0x30);
  // Even scales to the low 8 bytes, odd ones to the high 8: after widening, 32-element chunk k
  // (first 16 elements scale 2k, last 16 scale 2k+1) finds its pair at int16 element k of each lane.
  const __m128i even_odd = _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const BlockQ6_K& x = w[b];
    const BlockQ8_K& q8 = y[b];
    prefetch_ahead<4>(&x);  // 210-byte blocks
    const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(loadu128(x.scales), even_odd));
    __m256i s_a = _mm256_setzero_si256();
    __m256i s_b = _mm256_setzero_si256();
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {
      const __m256i l0 = loadu256(x.ql + 64 * h);
      const __m256i l1 = loadu256(x.ql + 64 * h + 32);
      const __m256i hb = loadu256(x.qh + 32 * h);
      const int8_t* yq = q8.qs + 128 * h;
      __m256i q[4];
      q[0] = _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_and_si256(_mm256_slli_epi16(hb, 4), m30));
      q[1] = _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_and_si256(_mm256_slli_epi16(hb, 2), m30));
      q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4), _mm256_and_si256(hb, m30));
      q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                             _mm256_and_si256(_mm256_srli_epi16(hb, 2), m30));
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) {
        // Unsigned q (0..63) times y: maddubs pairs <= 2*63*127, exact in int16.
        const __m256i p = _mm256_maddubs_epi16(q[j], loadu256(yq + 32 * j));
        const __m256i t = _mm256_madd_epi16(p, _mm256_shuffle_epi8(sc16, bcast16_ctrl(4 * h + j)));
        if (j % 2 == 0) {
          s_a = _mm256_add_epi32(s_a, t);
        } else {
          s_b = _mm256_add_epi32(s_b, t);
        }
      }
    }
    const __m256i lanes = _mm256_sub_epi32(_mm256_add_epi32(s_a, s_b), q6k_offset_lanes(x, q8));
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(lanes), _mm256_set1_ps(h2f(x.d) * q8.d), acc);
  }
  return reduce8(acc);
}

float vec_dot_q2_k(int64_t n, const void* w, const void* y) {
  return dot_superblocks<PolicyQ2_K>(n, w, y);
}
float vec_dot_q3_k(int64_t n, const void* w, const void* y) {
  return dot_superblocks<PolicyQ3_K>(n, w, y);
}
float vec_dot_q5_k(int64_t n, const void* w, const void* y) {
  return dot_superblocks<PolicyQ5_K>(n, w, y);
}
float vec_dot_iq4_xs(int64_t n, const void* w, const void* y) {
  return dot_superblocks<PolicyIQ4_XS>(n, w, y);
}
float vec_dot_q8_k(int64_t n, const void* w, const void* y) {
  return dot_superblocks<PolicyQ8_K>(n, w, y);
}

}  // namespace
}  // namespace moesh::simd
