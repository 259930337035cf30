// aarch64 NEON dot products for every weight type, bit-identical to the scalar reference.
//
// Included by kernels_neon.cpp (base ASIMD, which every aarch64 CPU has) and kernels_neon_dot.cpp
// (compiled with +dotprod, used only when HWCAP says the CPU has SDOT). Everything lives in an
// anonymous namespace, so the two compiled copies never meet at link time.
//
// Why the bits equal x86's: the canonical order (quant.h) splits each dot into an exact integer
// part and a float part. The one ISA-dependent primitive here is `dot_s8` (int8 x int8 products,
// four consecutive ones summed into each int32 lane): SDOT does it in one instruction, base NEON
// with widening multiplies and pairwise adds. Both are exact for any int8 operands, so they give
// the same integers as AVX2's maddubs+madd. The float part is the same sequence of IEEE
// operations as the reference: int32 -> f32 conversion (round to nearest), fused multiply-add
// (vfmaq_f32 == fmaf), and the canonical reduce8/reduce32 trees. Two float32x4 hold the eight
// canonical lanes (0..3 and 4..7); eight hold the 32 lanes of the F32/F16/BF16 dots.
//
// Lane layout of the per-lane types (Q8_0, Q4_0, Q5_0, IQ4_NL, Q4_K, Q5_K, Q6_K): lane l sums the
// elements with (i % 32) / 4 == l, so a 32-element run's first 16 bytes feed lanes 0..3 and its
// last 16 feed lanes 4..7. The other types put block b into float lane b % 8 (scalar fmaf: one
// per block, negligible next to the integer work).
#pragma once

#include <arm_neon.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "moesh/tensor/fp16.h"
#include "moesh/tensor/kernels.h"
#include "moesh/tensor/quant.h"
#include "tensor/quant_impl.h"

namespace moesh::neon {
namespace {

using namespace moesh::quant;
using quant::ref::h2f;

// acc lane i += sum of a[4i+k] * b[4i+k], k = 0..3 (exact for every int8 operand).
inline int32x4_t dot_s8(int32x4_t acc, int8x16_t a, int8x16_t b) {
#if defined(MOESH_NEON_DOTPROD)
  return vdotq_s32(acc, a, b);
#else
  const int16x8_t p0 = vmull_s8(vget_low_s8(a), vget_low_s8(b));  // |p| <= 16384: fits int16
  const int16x8_t p1 = vmull_high_s8(a, b);
  return vaddq_s32(acc, vpaddq_s32(vpaddlq_s16(p0), vpaddlq_s16(p1)));
#endif
}

inline int8x16_t load_s8(const void* p) {
  return vld1q_s8(static_cast<const int8_t*>(p));
}
inline uint8x16_t load_u8(const void* p) {
  return vld1q_u8(static_cast<const uint8_t*>(p));
}
inline int8x16_t as_s8(uint8x16_t v) {
  return vreinterpretq_s8_u8(v);
}

// The canonical reduce8 of quant.h on lanes a[0..3] | a[4..7]: ((a0+a4)+(a2+a6)) + ((a1+a5)+(a3+a7)).
inline float reduce8(float32x4_t lo, float32x4_t hi) {
  const float32x4_t t = vaddq_f32(lo, hi);                            // t_l = a_l + a_{l+4}
  const float32x2_t u = vadd_f32(vget_low_f32(t), vget_high_f32(t));  // u_l = t_l + t_{l+2}
  return vget_lane_f32(u, 0) + vget_lane_f32(u, 1);
}

inline float reduce8(const float a[8]) {
  return reduce8(vld1q_f32(a), vld1q_f32(a + 4));
}

// Elements 0..15 and 16..31 of a legacy 32-block's packed nibbles (low nibble of byte j is
// element j, high nibble element j + 16).
inline void unpack_nibbles16(const uint8_t* qs, uint8x16_t* lo, uint8x16_t* hi) {
  const uint8x16_t q = load_u8(qs);
  *lo = vandq_u8(q, vdupq_n_u8(0x0F));
  *hi = vshrq_n_u8(q, 4);
}

// Byte j = 0x10 if bit j of `bits` is set, else 0 (j = 0..15): Q5's fifth bit.
inline uint8x16_t bit4_of_bits16(uint32_t bits) {
  static const uint8_t kMask[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
  const uint8x16_t v = vcombine_u8(vdup_n_u8(static_cast<uint8_t>(bits)), vdup_n_u8(static_cast<uint8_t>(bits >> 8)));
  return vandq_u8(vtstq_u8(v, vld1q_u8(kMask)), vdupq_n_u8(0x10));
}

// ---------------------------------------------------------------- 32-element block types

// The int32 lane sums of one 32-element block whose weights are w_lo (elements 0..15) and w_hi
// (16..31) against activations y: lanes 0..3 in *lo, 4..7 in *hi.
inline void block_lanes(int8x16_t w_lo, int8x16_t w_hi, const int8_t* y, int32x4_t* lo, int32x4_t* hi) {
  *lo = dot_s8(vdupq_n_s32(0), w_lo, load_s8(y));
  *hi = dot_s8(vdupq_n_s32(0), w_hi, load_s8(y + 16));
}

// Per-lane block types: each block's 8 lane sums are converted and fused with its scale.
template <class P>
float dot_blocks32_per_lane(int64_t n, const void* vw, const void* vy) {
  const auto* w = static_cast<const typename P::BW*>(vw);
  const auto* y = static_cast<const BlockQ8_0*>(vy);
  const int64_t nb = n / kQK;
  const P p;
  float32x4_t acc0 = vdupq_n_f32(0.0f), acc1 = vdupq_n_f32(0.0f);
  for (int64_t b = 0; b < nb; ++b) {
    int8x16_t w_lo, w_hi;
    p.weights(w[b], &w_lo, &w_hi);
    int32x4_t lo, hi;
    block_lanes(w_lo, w_hi, y[b].qs, &lo, &hi);
    const float32x4_t s = vdupq_n_f32(h2f(w[b].d) * h2f(y[b].d));
    acc0 = vfmaq_f32(acc0, vcvtq_f32_s32(lo), s);
    acc1 = vfmaq_f32(acc1, vcvtq_f32_s32(hi), s);
  }
  return reduce8(acc0, acc1);
}

struct WeightsQ8_0 {
  using BW = BlockQ8_0;
  void weights(const BW& b, int8x16_t* lo, int8x16_t* hi) const {
    *lo = load_s8(b.qs);
    *hi = load_s8(b.qs + 16);
  }
};

struct WeightsQ4_0 {
  using BW = BlockQ4_0;
  void weights(const BW& b, int8x16_t* lo, int8x16_t* hi) const {
    uint8x16_t l, h;
    unpack_nibbles16(b.qs, &l, &h);
    *lo = vsubq_s8(as_s8(l), vdupq_n_s8(8));
    *hi = vsubq_s8(as_s8(h), vdupq_n_s8(8));
  }
};

struct WeightsQ5_0 {
  using BW = BlockQ5_0;
  void weights(const BW& b, int8x16_t* lo, int8x16_t* hi) const {
    uint32_t qh;
    std::memcpy(&qh, b.qh, 4);
    uint8x16_t l, h;
    unpack_nibbles16(b.qs, &l, &h);
    *lo = vsubq_s8(as_s8(vorrq_u8(l, bit4_of_bits16(qh))), vdupq_n_s8(16));
    *hi = vsubq_s8(as_s8(vorrq_u8(h, bit4_of_bits16(qh >> 16))), vdupq_n_s8(16));
  }
};

struct WeightsIQ4_NL {
  using BW = BlockIQ4_NL;
  int8x16_t table = vld1q_s8(k_values_iq4nl);
  void weights(const BW& b, int8x16_t* lo, int8x16_t* hi) const {
    uint8x16_t l, h;
    unpack_nibbles16(b.qs, &l, &h);
    *lo = vqtbl1q_s8(table, l);
    *hi = vqtbl1q_s8(table, h);
  }
};

inline int32_t hsum(int32x4_t v) {
  return vaddvq_s32(v);  // integer: any order is exact
}

// MXFP4 in ggml's x86 order (quant.h): per-lane blocks in pairs, even ones into (a0, a1), odd
// ones into (b0, b1), added lane by lane before reduce8; an odd last block fused after it.
float vec_dot_mxfp4(int64_t n, const void* vw, const void* vy) {
  const auto* w = static_cast<const BlockMXFP4*>(vw);
  const auto* y = static_cast<const BlockQ8_0*>(vy);
  const int8x16_t table = vld1q_s8(k_values_mxfp4);
  const int64_t nb = n / kQK;
  auto lanes = [&](int64_t b, int32x4_t* lo, int32x4_t* hi) {
    uint8x16_t l, h;
    unpack_nibbles16(w[b].qs, &l, &h);
    block_lanes(vqtbl1q_s8(table, l), vqtbl1q_s8(table, h), y[b].qs, lo, hi);
  };
  auto scale = [&](int64_t b) { return h2f(y[b].d) * e8m0_to_fp32_half(w[b].e); };
  float32x4_t a0 = vdupq_n_f32(0.0f), a1 = vdupq_n_f32(0.0f), b0 = vdupq_n_f32(0.0f), b1 = vdupq_n_f32(0.0f);
  int64_t b = 0;
  for (; b + 1 < nb; b += 2) {
    int32x4_t lo, hi;
    lanes(b, &lo, &hi);
    const float32x4_t s0 = vdupq_n_f32(scale(b));
    a0 = vfmaq_f32(a0, vcvtq_f32_s32(lo), s0);
    a1 = vfmaq_f32(a1, vcvtq_f32_s32(hi), s0);
    lanes(b + 1, &lo, &hi);
    const float32x4_t s1 = vdupq_n_f32(scale(b + 1));
    b0 = vfmaq_f32(b0, vcvtq_f32_s32(lo), s1);
    b1 = vfmaq_f32(b1, vcvtq_f32_s32(hi), s1);
  }
  float sum = reduce8(vaddq_f32(a0, b0), vaddq_f32(a1, b1));
  if (b < nb) {
    int32x4_t lo, hi;
    lanes(b, &lo, &hi);
    sum = std::fmaf(scale(b), static_cast<float>(hsum(vaddq_s32(lo, hi))), sum);
  }
  return sum;
}

// Q4_1 / Q5_1 in ggml's x86 order (quant.h): per-lane products fused with dx*dy, min*s summed
// on the side, added after reduce8.
template <class BW>
float dot_blocks32_min(int64_t n, const void* vw, const void* vy) {
  const auto* w = static_cast<const BW*>(vw);
  const auto* y = static_cast<const BlockQ8_1*>(vy);
  float32x4_t acc0 = vdupq_n_f32(0.0f), acc1 = vdupq_n_f32(0.0f);
  float mins = 0.0f;
  for (int64_t b = 0; b < n / kQK; ++b) {
    uint8x16_t l, h;
    unpack_nibbles16(w[b].qs, &l, &h);
    if constexpr (std::is_same_v<BW, BlockQ5_1>) {
      uint32_t qh;
      std::memcpy(&qh, w[b].qh, 4);
      l = vorrq_u8(l, bit4_of_bits16(qh));
      h = vorrq_u8(h, bit4_of_bits16(qh >> 16));
    }
    int32x4_t lo, hi;
    block_lanes(as_s8(l), as_s8(h), y[b].qs, &lo, &hi);  // weights <= 31: exact as int8
    mins = std::fmaf(h2f(w[b].m), h2f(y[b].s), mins);
    const float32x4_t s = vdupq_n_f32(h2f(w[b].d) * h2f(y[b].d));
    acc0 = vfmaq_f32(acc0, vcvtq_f32_s32(lo), s);
    acc1 = vfmaq_f32(acc1, vcvtq_f32_s32(hi), s);
  }
  return reduce8(acc0, acc1) + mins;
}

float vec_dot_q8_0(int64_t n, const void* w, const void* y) {
  return dot_blocks32_per_lane<WeightsQ8_0>(n, w, y);
}
float vec_dot_q4_0(int64_t n, const void* w, const void* y) {
  return dot_blocks32_per_lane<WeightsQ4_0>(n, w, y);
}
float vec_dot_q5_0(int64_t n, const void* w, const void* y) {
  return dot_blocks32_per_lane<WeightsQ5_0>(n, w, y);
}
float vec_dot_iq4_nl(int64_t n, const void* w, const void* y) {
  return dot_blocks32_per_lane<WeightsIQ4_NL>(n, w, y);
}
float vec_dot_q4_1(int64_t n, const void* w, const void* y) {
  return dot_blocks32_min<BlockQ4_1>(n, w, y);
}
float vec_dot_q5_1(int64_t n, const void* w, const void* y) {
  return dot_blocks32_min<BlockQ5_1>(n, w, y);
}

// ---------------------------------------------------------------- 256-element super-blocks

// 32 weights (two int8x16, elements 0..15 and 16..31) times y[0..31], the first 16 scaled by s0
// and the last 16 by s1, added to the lanes (lo: 0..3, hi: 4..7).
inline void scaled_run32(int8x16_t w0, int8x16_t w1, const int8_t* y, int32_t s0, int32_t s1, int32x4_t* lo,
                         int32x4_t* hi) {
  *lo = vmlaq_n_s32(*lo, dot_s8(vdupq_n_s32(0), w0, load_s8(y)), s0);
  *hi = vmlaq_n_s32(*hi, dot_s8(vdupq_n_s32(0), w1, load_s8(y + 16)), s1);
}

// The four int32 lanes m[2i]*pair(2i) + m[2i+1]*pair(2i+1), pair(s) = bsums[2s] + bsums[2s+1]:
// x86's k4_mins4 (eight u8 mins packed in a u64).
inline int32x4_t k4_mins4(uint64_t m, const BlockQ8_K& y) {
  const int16x8_t pairs = vpaddq_s16(vld1q_s16(y.bsums), vld1q_s16(y.bsums + 8));  // |.| <= 4064
  const int16x8_t m16 = vreinterpretq_s16_u16(vmovl_u8(vcreate_u8(m)));
  const int32x4_t p_lo = vmull_s16(vget_low_s16(pairs), vget_low_s16(m16));
  const int32x4_t p_hi = vmull_high_s16(pairs, m16);
  return vpaddq_s32(p_lo, p_hi);
}

inline int32_t byte_of(uint64_t v, int k) {
  return static_cast<int32_t>((v >> (8 * k)) & 0xFF);
}

// Q4_K/Q5_K: the 8 lane sums of sum_s sc[s] * dot(sub-block s). Q5_K passes its high bits.
template <bool kQ5>
inline void k4_lanes(const uint8_t* qs, const uint8_t* qh, uint64_t sc, const BlockQ8_K& y, int32x4_t* lo,
                     int32x4_t* hi) {
  const uint8x16_t m4 = vdupq_n_u8(0x0F);
  uint8x16_t h0 = vdupq_n_u8(0), h1 = vdupq_n_u8(0);
  if constexpr (kQ5) {
    h0 = load_u8(qh);
    h1 = load_u8(qh + 16);
  }
  *lo = vdupq_n_s32(0);
  *hi = vdupq_n_s32(0);
  for (int c = 0; c < 4; ++c) {
    const uint8x16_t q0 = load_u8(qs + 32 * c);
    const uint8x16_t q1 = load_u8(qs + 32 * c + 16);
    uint8x16_t a0 = vandq_u8(q0, m4), a1 = vandq_u8(q1, m4);
    uint8x16_t b0 = vshrq_n_u8(q0, 4), b1 = vshrq_n_u8(q1, 4);
    if constexpr (kQ5) {
      // bit 2c of qh[l] -> +16 for the low-nibble element, bit 2c+1 -> +16 for the high one.
      const int8x16_t sh_a = vdupq_n_s8(static_cast<int8_t>(4 - 2 * c));
      const int8x16_t sh_b = vdupq_n_s8(static_cast<int8_t>(3 - 2 * c));
      const uint8x16_t bit4 = vdupq_n_u8(0x10);
      a0 = vorrq_u8(a0, vandq_u8(vshlq_u8(h0, sh_a), bit4));
      a1 = vorrq_u8(a1, vandq_u8(vshlq_u8(h1, sh_a), bit4));
      b0 = vorrq_u8(b0, vandq_u8(vshlq_u8(h0, sh_b), bit4));
      b1 = vorrq_u8(b1, vandq_u8(vshlq_u8(h1, sh_b), bit4));
    }
    const int32_t s_a = byte_of(sc, 2 * c), s_b = byte_of(sc, 2 * c + 1);
    scaled_run32(as_s8(a0), as_s8(a1), y.qs + 64 * c, s_a, s_a, lo, hi);
    scaled_run32(as_s8(b0), as_s8(b1), y.qs + 64 * c + 32, s_b, s_b, lo, hi);
  }
}

// llama.cpp's x86 order, as the reference: Q4_K keeps its mins in four float lanes, Q5_K in one
// scalar.
template <bool kQ5>
float dot_k4(int64_t n, const void* vw, const void* vy) {
  using BW = std::conditional_t<kQ5, BlockQ5_K, BlockQ4_K>;
  const auto* w = static_cast<const BW*>(vw);
  const auto* y = static_cast<const BlockQ8_K*>(vy);
  float32x4_t acc0 = vdupq_n_f32(0.0f), acc1 = vdupq_n_f32(0.0f), acc_m = vdupq_n_f32(0.0f);
  float summs = 0.0f;
  for (int64_t b = 0; b < n / kQKK; ++b) {
    const BW& x = w[b];
    uint64_t sc, m;
    ref::unpack_k4_scales(x.scales, &sc, &m);
    int32x4_t lo, hi;
    if constexpr (kQ5) {
      k4_lanes<true>(x.qs, x.qh, sc, y[b], &lo, &hi);
    } else {
      k4_lanes<false>(x.qs, nullptr, sc, y[b], &lo, &hi);
    }
    const float d = h2f(x.d) * y[b].d;
    const float dmin = h2f(x.dmin) * y[b].d;
    acc0 = vfmaq_f32(acc0, vcvtq_f32_s32(lo), vdupq_n_f32(d));
    acc1 = vfmaq_f32(acc1, vcvtq_f32_s32(hi), vdupq_n_f32(d));
    const int32x4_t mins = k4_mins4(m, y[b]);
    if constexpr (kQ5) {
      summs = std::fmaf(static_cast<float>(hsum(mins)), -dmin, summs);
    } else {
      acc_m = vfmaq_f32(acc_m, vcvtq_f32_s32(mins), vdupq_n_f32(-dmin));
    }
  }
  if constexpr (kQ5) {
    return reduce8(acc0, acc1) + summs;
  } else {
    const float32x2_t u = vadd_f32(vget_low_f32(acc_m), vget_high_f32(acc_m));  // (m0+m2), (m1+m3)
    return reduce8(acc0, acc1) + (vget_lane_f32(u, 0) + vget_lane_f32(u, 1));
  }
}

float vec_dot_q4_k(int64_t n, const void* w, const void* y) {
  return dot_k4<false>(n, w, y);
}
float vec_dot_q5_k(int64_t n, const void* w, const void* y) {
  return dot_k4<true>(n, w, y);
}

float vec_dot_q6_k(int64_t n, const void* vw, const void* vy) {
  const auto* w = static_cast<const BlockQ6_K*>(vw);
  const auto* y = static_cast<const BlockQ8_K*>(vy);
  const uint8x16_t m4 = vdupq_n_u8(0x0F);
  const uint8x16_t m30 = vdupq_n_u8(0x30);
  float32x4_t acc0 = vdupq_n_f32(0.0f), acc1 = vdupq_n_f32(0.0f);
  for (int64_t b = 0; b < n / kQKK; ++b) {
    const BlockQ6_K& x = w[b];
    int32x4_t lo = vdupq_n_s32(0), hi = vdupq_n_s32(0);
    for (int h = 0; h < 2; ++h) {
      const int8_t* s = x.scales + 8 * h;
      const int8_t* yq = y[b].qs + 128 * h;
      for (int k = 0; k < 2; ++k) {  // bytes 16k..16k+15 of each 32-byte row
        const uint8x16_t l0 = load_u8(x.ql + 64 * h + 16 * k);
        const uint8x16_t l1 = load_u8(x.ql + 64 * h + 32 + 16 * k);
        const uint8x16_t hb = load_u8(x.qh + 32 * h + 16 * k);
        uint8x16_t q[4];
        q[0] = vorrq_u8(vandq_u8(l0, m4), vandq_u8(vshlq_n_u8(hb, 4), m30));
        q[1] = vorrq_u8(vandq_u8(l1, m4), vandq_u8(vshlq_n_u8(hb, 2), m30));
        q[2] = vorrq_u8(vshrq_n_u8(l0, 4), vandq_u8(hb, m30));
        q[3] = vorrq_u8(vshrq_n_u8(l1, 4), vandq_u8(vshrq_n_u8(hb, 2), m30));
        int32x4_t& lanes = k == 0 ? lo : hi;
        for (int j = 0; j < 4; ++j) {  // the unsigned values 0..63
          lanes = vmlaq_n_s32(lanes, dot_s8(vdupq_n_s32(0), as_s8(q[j]), load_s8(yq + 32 * j + 16 * k)), s[2 * j + k]);
        }
      }
    }
    // The -32 offset per lane from the 16-value sums (quant.h): lane l loses
    // 32 * (bsums[2l] * scale[2l] + bsums[2l+1] * scale[2l+1]).
    const int16x8_t sc_lo = vmovl_s8(vld1_s8(x.scales)), sc_hi = vmovl_s8(vld1_s8(x.scales + 8));
    const int16x8_t bs_lo = vld1q_s16(y[b].bsums), bs_hi = vld1q_s16(y[b].bsums + 8);
    const int32x4_t off_lo = vpaddq_s32(vmull_s16(vget_low_s16(bs_lo), vget_low_s16(sc_lo)),
                                        vmull_s16(vget_high_s16(bs_lo), vget_high_s16(sc_lo)));
    const int32x4_t off_hi = vpaddq_s32(vmull_s16(vget_low_s16(bs_hi), vget_low_s16(sc_hi)),
                                        vmull_s16(vget_high_s16(bs_hi), vget_high_s16(sc_hi)));
    lo = vsubq_s32(lo, vshlq_n_s32(off_lo, 5));
    hi = vsubq_s32(hi, vshlq_n_s32(off_hi, 5));
    const float32x4_t d = vdupq_n_f32(h2f(x.d) * y[b].d);
    acc0 = vfmaq_f32(acc0, vcvtq_f32_s32(lo), d);
    acc1 = vfmaq_f32(acc1, vcvtq_f32_s32(hi), d);
  }
  return reduce8(acc0, acc1);
}

// Q2_K, Q3_K, IQ4_XS: per-lane like Q6_K (ggml's x86 order, quant.h); Q8_K: super-block b fuses
// into float lane b % 8 (then reduce8).

float vec_dot_q2_k(int64_t n, const void* vw, const void* vy) {
  const auto* w = static_cast<const BlockQ2_K*>(vw);
  const auto* y = static_cast<const BlockQ8_K*>(vy);
  const uint8x16_t m3 = vdupq_n_u8(3);
  float32x4_t acc0 = vdupq_n_f32(0.0f), acc1 = vdupq_n_f32(0.0f);
  for (int64_t b = 0; b < n / kQKK; ++b) {
    const BlockQ2_K& x = w[b];
    // ggml's order (quant.h): the mins first, lane l = m[2l]*bsums[2l] + m[2l+1]*bsums[2l+1].
    const uint8x16_t m = vshrq_n_u8(load_u8(x.scales), 4);
    const int16x8_t m_lo = vreinterpretq_s16_u16(vmovl_u8(vget_low_u8(m)));
    const int16x8_t m_hi = vreinterpretq_s16_u16(vmovl_high_u8(m));
    const int16x8_t bs_lo = vld1q_s16(y[b].bsums), bs_hi = vld1q_s16(y[b].bsums + 8);
    const int32x4_t mins_lo =
        vpaddq_s32(vmull_s16(vget_low_s16(bs_lo), vget_low_s16(m_lo)), vmull_high_s16(bs_lo, m_lo));
    const int32x4_t mins_hi =
        vpaddq_s32(vmull_s16(vget_low_s16(bs_hi), vget_low_s16(m_hi)), vmull_high_s16(bs_hi, m_hi));
    const float32x4_t dmin = vdupq_n_f32(-(y[b].d * h2f(x.dmin)));
    acc0 = vfmaq_f32(acc0, vcvtq_f32_s32(mins_lo), dmin);
    acc1 = vfmaq_f32(acc1, vcvtq_f32_s32(mins_hi), dmin);
    int32x4_t lo = vdupq_n_s32(0), hi = vdupq_n_s32(0);
    for (int h = 0; h < 2; ++h) {
      const uint8x16_t qs0 = load_u8(x.qs + 32 * h);
      const uint8x16_t qs1 = load_u8(x.qs + 32 * h + 16);
      for (int j = 0; j < 4; ++j) {
        const int8x16_t sh = vdupq_n_s8(static_cast<int8_t>(-2 * j));
        const int s = 8 * h + 2 * j;
        scaled_run32(as_s8(vandq_u8(vshlq_u8(qs0, sh), m3)), as_s8(vandq_u8(vshlq_u8(qs1, sh), m3)),
                     y[b].qs + 128 * h + 32 * j, x.scales[s] & 15, x.scales[s + 1] & 15, &lo, &hi);
      }
    }
    const float32x4_t d = vdupq_n_f32(y[b].d * h2f(x.d));
    acc0 = vfmaq_f32(acc0, vcvtq_f32_s32(lo), d);
    acc1 = vfmaq_f32(acc1, vcvtq_f32_s32(hi), d);
  }
  return reduce8(acc0, acc1);
}

float vec_dot_q3_k(int64_t n, const void* vw, const void* vy) {
  const auto* w = static_cast<const BlockQ3_K*>(vw);
  const auto* y = static_cast<const BlockQ8_K*>(vy);
  const uint8x16_t m3 = vdupq_n_u8(3);
  const uint8x16_t one = vdupq_n_u8(1);
  const int8x16_t off = vdupq_n_s8(4);
  float32x4_t acc0 = vdupq_n_f32(0.0f), acc1 = vdupq_n_f32(0.0f);
  for (int64_t b = 0; b < n / kQKK; ++b) {
    const BlockQ3_K& x = w[b];
    int S[16];
    ref::unpack_q3k_scales(x.scales, S);
    const uint8x16_t hm0 = load_u8(x.hmask);
    const uint8x16_t hm1 = load_u8(x.hmask + 16);
    int32x4_t lo = vdupq_n_s32(0), hi = vdupq_n_s32(0);
    for (int h = 0; h < 2; ++h) {
      const uint8x16_t qs0 = load_u8(x.qs + 32 * h);
      const uint8x16_t qs1 = load_u8(x.qs + 32 * h + 16);
      for (int j = 0; j < 4; ++j) {
        const int8x16_t sh = vdupq_n_s8(static_cast<int8_t>(-2 * j));
        const int8x16_t shb = vdupq_n_s8(static_cast<int8_t>(-(4 * h + j)));
        // v = q2 + 4 * hbit in 0..7; the value is v - 4.
        const uint8x16_t v0 =
            vorrq_u8(vandq_u8(vshlq_u8(qs0, sh), m3), vshlq_n_u8(vandq_u8(vshlq_u8(hm0, shb), one), 2));
        const uint8x16_t v1 =
            vorrq_u8(vandq_u8(vshlq_u8(qs1, sh), m3), vshlq_n_u8(vandq_u8(vshlq_u8(hm1, shb), one), 2));
        const int s = 8 * h + 2 * j;
        scaled_run32(vsubq_s8(as_s8(v0), off), vsubq_s8(as_s8(v1), off), y[b].qs + 128 * h + 32 * j, S[s] - 32,
                     S[s + 1] - 32, &lo, &hi);
      }
    }
    const float32x4_t d = vdupq_n_f32(h2f(x.d) * y[b].d);
    acc0 = vfmaq_f32(acc0, vcvtq_f32_s32(lo), d);
    acc1 = vfmaq_f32(acc1, vcvtq_f32_s32(hi), d);
  }
  return reduce8(acc0, acc1);
}

float vec_dot_iq4_xs(int64_t n, const void* vw, const void* vy) {
  const auto* w = static_cast<const BlockIQ4_XS*>(vw);
  const auto* y = static_cast<const BlockQ8_K*>(vy);
  const int8x16_t table = vld1q_s8(k_values_iq4nl);
  float32x4_t acc0 = vdupq_n_f32(0.0f), acc1 = vdupq_n_f32(0.0f);
  for (int64_t b = 0; b < n / kQKK; ++b) {
    const BlockIQ4_XS& x = w[b];
    int32x4_t lo = vdupq_n_s32(0), hi = vdupq_n_s32(0);
    for (int ib = 0; ib < 8; ++ib) {
      uint8x16_t l, h;
      unpack_nibbles16(x.qs + 16 * ib, &l, &h);
      const int ls = ref::iq4xs_scale_code(x, ib) - 32;
      scaled_run32(vqtbl1q_s8(table, l), vqtbl1q_s8(table, h), y[b].qs + 32 * ib, ls, ls, &lo, &hi);
    }
    const float32x4_t d = vdupq_n_f32(h2f(x.d) * y[b].d);
    acc0 = vfmaq_f32(acc0, vcvtq_f32_s32(lo), d);
    acc1 = vfmaq_f32(acc1, vcvtq_f32_s32(hi), d);
  }
  return reduce8(acc0, acc1);
}

float vec_dot_q8_k(int64_t n, const void* vw, const void* vy) {
  const auto* w = static_cast<const BlockQ8_K*>(vw);
  const auto* y = static_cast<const BlockQ8_K*>(vy);
  float a[8] = {};
  for (int64_t b = 0; b < n / kQKK; ++b) {
    int32x4_t s = vdupq_n_s32(0);
    for (int k = 0; k < 16; ++k) s = dot_s8(s, load_s8(w[b].qs + 16 * k), load_s8(y[b].qs + 16 * k));
    float& acc = a[b & 7];
    acc = std::fmaf(static_cast<float>(hsum(s)), w[b].d * y[b].d, acc);
  }
  return reduce8(a);
}

// ---------------------------------------------------------------- F32 / F16 / BF16
// 32 lanes (element i -> lane i % 32) in eight float32x4; the tail goes to its lanes in scalar;
// then the canonical halving reduce32 (h = 16, 8 on vectors, then reduce8's steps).

template <class Load>
float dot_f32_lanes(int64_t n, const Load& load) {
  float32x4_t acc[8];
  for (auto& a : acc) a = vdupq_n_f32(0.0f);
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    for (int j = 0; j < 8; ++j) acc[j] = vfmaq_f32(acc[j], load.w(i + 4 * j), load.x(i + 4 * j));
  }
  if (i < n) {
    float a[32];
    for (int j = 0; j < 8; ++j) vst1q_f32(a + 4 * j, acc[j]);
    const int rem = static_cast<int>(n - i);
    for (int l = 0; l < rem; ++l) a[l] = std::fmaf(load.w1(i + l), load.x1(i + l), a[l]);
    for (int j = 0; j < 8; ++j) acc[j] = vld1q_f32(a + 4 * j);
  }
  for (int j = 0; j < 4; ++j) acc[j] = vaddq_f32(acc[j], acc[j + 4]);  // h = 16
  acc[0] = vaddq_f32(acc[0], acc[2]);                                  // h = 8
  acc[1] = vaddq_f32(acc[1], acc[3]);
  return reduce8(acc[0], acc[1]);
}

struct LoadF32 {
  const float* pw;
  const float* px;
  float32x4_t w(int64_t i) const { return vld1q_f32(pw + i); }
  float32x4_t x(int64_t i) const { return vld1q_f32(px + i); }
  float w1(int64_t i) const { return pw[i]; }
  float x1(int64_t i) const { return px[i]; }
};

// vcvt_f32_f16 is exact for every non-NaN half (as F16C on x86; NaN payloads may differ).
struct LoadF16 {
  const uint16_t* pw;
  const uint16_t* px;
  static float32x4_t widen(const uint16_t* p) { return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p))); }
  float32x4_t w(int64_t i) const { return widen(pw + i); }
  float32x4_t x(int64_t i) const { return widen(px + i); }
  float w1(int64_t i) const { return fp16_to_fp32(pw[i]); }
  float x1(int64_t i) const { return fp16_to_fp32(px[i]); }
};

struct LoadBF16 {
  const uint16_t* pw;
  const uint16_t* px;
  static float32x4_t widen(const uint16_t* p) { return vreinterpretq_f32_u32(vshll_n_u16(vld1_u16(p), 16)); }
  float32x4_t w(int64_t i) const { return widen(pw + i); }
  float32x4_t x(int64_t i) const { return widen(px + i); }
  float w1(int64_t i) const { return bf16_to_fp32(pw[i]); }
  float x1(int64_t i) const { return bf16_to_fp32(px[i]); }
};

float vec_dot_f32(int64_t n, const void* w, const void* x) {
  return dot_f32_lanes(n, LoadF32{static_cast<const float*>(w), static_cast<const float*>(x)});
}
float vec_dot_f16(int64_t n, const void* w, const void* x) {
  return dot_f32_lanes(n, LoadF16{static_cast<const uint16_t*>(w), static_cast<const uint16_t*>(x)});
}
float vec_dot_bf16(int64_t n, const void* w, const void* x) {
  return dot_f32_lanes(n, LoadBF16{static_cast<const uint16_t*>(w), static_cast<const uint16_t*>(x)});
}

// ---------------------------------------------------------------- activations (from_float)
// Same results as the reference quantizers (quant_ref_*.cpp), NaN and infinities included:
// vmaxnmq ignores NaN like the reference's `fabs(x) > amax` scan, and the rounding is the
// reference's nearest_int_clamped — round to nearest even (vrndnq), NaN to the lower bound, then
// the clamp — before an exact conversion.

// RNE of v clamped to [lo, hi], NaN -> lo (quant_impl.h nearest_int_clamped), as int32 lanes.
inline int32x4_t nearest_clamped(float32x4_t v, float lo, float hi) {
  const float32x4_t r = vrndnq_f32(v);
  const float32x4_t l = vbslq_f32(vcgeq_f32(r, vdupq_n_f32(lo)), r, vdupq_n_f32(lo));  // NaN fails >=
  return vcvtq_s32_f32(vminq_f32(l, vdupq_n_f32(hi)));
}

// Eight int32x4 (values in int8 range) -> 32 int8 in element order.
inline void store_i8x32(int8_t* out, const int32x4_t q[8]) {
  for (int k = 0; k < 2; ++k) {
    const int16x8_t a = vcombine_s16(vmovn_s32(q[4 * k]), vmovn_s32(q[4 * k + 1]));
    const int16x8_t b = vcombine_s16(vmovn_s32(q[4 * k + 2]), vmovn_s32(q[4 * k + 3]));
    vst1q_s8(out + 16 * k, vcombine_s8(vmovn_s16(a), vmovn_s16(b)));
  }
}

inline float abs_max(const float* x, int n) {
  float32x4_t m = vdupq_n_f32(0.0f);
  for (int j = 0; j < n; j += 4) m = vmaxnmq_f32(m, vabsq_f32(vld1q_f32(x + j)));
  return vmaxnmvq_f32(m);
}

// Q8_0 block: amax, d = amax/127 (stored f16), id = 127/amax, q = RNE(x*id) in [-127, 127].
// Returns the unrounded f32 d and the sum of the q (Q8_1 needs both).
inline float quantize_q8_0_block(const float* x, uint16_t* d_out, int8_t* qs, int32_t* sum_q) {
  const float amax = abs_max(x, kQK);
  const float d = amax / 127.0f;
  const float32x4_t id = vdupq_n_f32(amax != 0.0f ? 127.0f / amax : 0.0f);
  int32x4_t q[8];
  int32x4_t sum = vdupq_n_s32(0);
  for (int k = 0; k < 8; ++k) {
    q[k] = nearest_clamped(vmulq_f32(vld1q_f32(x + 4 * k), id), -127.0f, 127.0f);
    sum = vaddq_s32(sum, q[k]);
  }
  store_i8x32(qs, q);
  *d_out = fp32_to_fp16(d);
  *sum_q = vaddvq_s32(sum);
  return d;
}

void from_float_q8_0(const float* x, void* vy, int64_t n) {
  auto* y = static_cast<BlockQ8_0*>(vy);
  int32_t sum;
  for (int64_t b = 0; b < n / kQK; ++b) quantize_q8_0_block(x + b * kQK, &y[b].d, y[b].qs, &sum);
}

void from_float_q8_1(const float* x, void* vy, int64_t n) {
  auto* y = static_cast<BlockQ8_1*>(vy);
  for (int64_t b = 0; b < n / kQK; ++b) {
    int32_t sum;
    const float d = quantize_q8_0_block(x + b * kQK, &y[b].d, y[b].qs, &sum);
    y[b].s = fp32_to_fp16(d * static_cast<float>(sum));
  }
}

void from_float_q8_k(const float* x, void* vy, int64_t n) {
  auto* y = static_cast<BlockQ8_K*>(vy);
  for (int64_t b = 0; b < n / kQKK; ++b, x += kQKK) {
    const float amax = abs_max(x, kQKK);
    if (amax == 0.0f) {
      std::memset(&y[b], 0, sizeof(BlockQ8_K));
      continue;
    }
    // The signed value of the first element whose |x| is the maximum (the reference's strict '>').
    float max = 0.0f;
    const float32x4_t vam = vdupq_n_f32(amax);
    for (int k = 0; k < kQKK; k += 4) {
      if (vmaxvq_u32(vceqq_f32(vabsq_f32(vld1q_f32(x + k)), vam)) != 0) {
        int l = 0;
        while (std::fabs(x[k + l]) != amax) ++l;
        max = x[k + l];
        break;
      }
    }
    const float iscale = -127.0f / max;
    const float32x4_t vis = vdupq_n_f32(iscale);
    for (int c = 0; c < 8; ++c) {  // 32 values = two bsum groups per step
      int32x4_t q[8];
      for (int k = 0; k < 8; ++k)
        q[k] = nearest_clamped(vmulq_f32(vld1q_f32(x + 32 * c + 4 * k), vis), -128.0f, 127.0f);
      store_i8x32(y[b].qs + 32 * c, q);
      y[b].bsums[2 * c] = static_cast<int16_t>(vaddvq_s32(vaddq_s32(vaddq_s32(q[0], q[1]), vaddq_s32(q[2], q[3]))));
      y[b].bsums[2 * c + 1] = static_cast<int16_t>(vaddvq_s32(vaddq_s32(vaddq_s32(q[4], q[5]), vaddq_s32(q[6], q[7]))));
    }
    y[b].d = 1.0f / iscale;
  }
}

// F16: the hardware conversion rounds to nearest even like fp32_to_fp16; a vector holding a NaN
// goes through the reference, which canonicalises NaN to 0x7E00 | sign.
void from_float_f16(const float* x, void* vy, int64_t n) {
  auto* y = static_cast<uint16_t*>(vy);
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    const float32x4_t v = vld1q_f32(x + i);
    if (vminvq_u32(vceqq_f32(v, v)) == 0) {
      for (int k = 0; k < 4; ++k) y[i + k] = fp32_to_fp16(x[i + k]);
      continue;
    }
    vst1_u16(y + i, vreinterpret_u16_f16(vcvt_f16_f32(v)));
  }
  for (; i < n; ++i) y[i] = fp32_to_fp16(x[i]);
}

// BF16: round to nearest even on the bit pattern, NaN -> quiet NaN (fp32_to_bf16).
void from_float_bf16(const float* x, void* vy, int64_t n) {
  auto* y = static_cast<uint16_t*>(vy);
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    const uint32x4_t u = vreinterpretq_u32_f32(vld1q_f32(x + i));
    const uint32x4_t nan = vcgtq_u32(vandq_u32(u, vdupq_n_u32(0x7fffffffu)), vdupq_n_u32(0x7f800000u));
    const uint32x4_t bias = vaddq_u32(vdupq_n_u32(0x7fffu), vandq_u32(vshrq_n_u32(u, 16), vdupq_n_u32(1)));
    const uint32x4_t rounded = vshrq_n_u32(vaddq_u32(u, bias), 16);
    const uint32x4_t quiet = vorrq_u32(vshrq_n_u32(u, 16), vdupq_n_u32(0x40));
    vst1_u16(y + i, vmovn_u32(vbslq_u32(nan, quiet, rounded)));
  }
  for (; i < n; ++i) y[i] = fp32_to_bf16(x[i]);
}

// ---------------------------------------------------------------- to_float

void to_float_f16(const void* vx, float* y, int64_t n) {
  const auto* x = static_cast<const uint16_t*>(vx);
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) vst1q_f32(y + i, LoadF16::widen(x + i));
  for (; i < n; ++i) y[i] = fp16_to_fp32(x[i]);
}

void to_float_bf16(const void* vx, float* y, int64_t n) {
  const auto* x = static_cast<const uint16_t*>(vx);
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) vst1q_f32(y + i, LoadBF16::widen(x + i));
  for (; i < n; ++i) y[i] = bf16_to_fp32(x[i]);
}

// x[j] = d * q[j]: one f32 multiply per element, as the reference.
void to_float_q8_0(const void* vx, float* y, int64_t n) {
  const auto* x = static_cast<const BlockQ8_0*>(vx);
  for (int64_t b = 0; b < n / kQK; ++b) {
    const float32x4_t d = vdupq_n_f32(h2f(x[b].d));
    for (int h = 0; h < 2; ++h) {
      const int8x16_t q = load_s8(x[b].qs + 16 * h);
      const int16x8_t w[2] = {vmovl_s8(vget_low_s8(q)), vmovl_high_s8(q)};
      for (int k = 0; k < 2; ++k) {
        float* out = y + b * kQK + 16 * h + 8 * k;
        vst1q_f32(out, vmulq_f32(d, vcvtq_f32_s32(vmovl_s16(vget_low_s16(w[k])))));
        vst1q_f32(out + 4, vmulq_f32(d, vcvtq_f32_s32(vmovl_high_s16(w[k]))));
      }
    }
  }
}

// ---------------------------------------------------------------- the table

inline void fill_neon(KernelTable* t) {
  auto at = [t](GgmlType type) -> TypeKernels& { return t->type[static_cast<int>(type)]; };
  at(GgmlType::Q8_0).from_float = from_float_q8_0;
  at(GgmlType::Q8_1).from_float = from_float_q8_1;
  at(GgmlType::Q8_K).from_float = from_float_q8_k;
  at(GgmlType::F16).from_float = from_float_f16;
  at(GgmlType::BF16).from_float = from_float_bf16;
  at(GgmlType::F16).to_float = to_float_f16;
  at(GgmlType::BF16).to_float = to_float_bf16;
  at(GgmlType::Q8_0).to_float = to_float_q8_0;
  at(GgmlType::F32).vec_dot = vec_dot_f32;
  at(GgmlType::F16).vec_dot = vec_dot_f16;
  at(GgmlType::BF16).vec_dot = vec_dot_bf16;
  at(GgmlType::Q8_0).vec_dot = vec_dot_q8_0;
  at(GgmlType::Q4_0).vec_dot = vec_dot_q4_0;
  at(GgmlType::Q5_0).vec_dot = vec_dot_q5_0;
  at(GgmlType::IQ4_NL).vec_dot = vec_dot_iq4_nl;
  at(GgmlType::MXFP4).vec_dot = vec_dot_mxfp4;
  at(GgmlType::Q4_1).vec_dot = vec_dot_q4_1;
  at(GgmlType::Q5_1).vec_dot = vec_dot_q5_1;
  at(GgmlType::Q2_K).vec_dot = vec_dot_q2_k;
  at(GgmlType::Q3_K).vec_dot = vec_dot_q3_k;
  at(GgmlType::Q4_K).vec_dot = vec_dot_q4_k;
  at(GgmlType::Q5_K).vec_dot = vec_dot_q5_k;
  at(GgmlType::Q6_K).vec_dot = vec_dot_q6_k;
  at(GgmlType::IQ4_XS).vec_dot = vec_dot_iq4_xs;
  at(GgmlType::Q8_K).vec_dot = vec_dot_q8_k;
}

}  // namespace
}  // namespace moesh::neon
