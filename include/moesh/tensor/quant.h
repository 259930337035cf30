// Quantized block formats (bit-compatible with ggml, see docs/background/quant-formats.md) and
// their scalar reference routines: dequantize, quantize, and the dot product of a weight row
// with an activation row in the weight's `vec_dot_type`.
//
// THE CANONICAL ORDER (determinism contract). Every implementation of a dot product (scalar
// here, AVX2, AVX-512, NEON) must produce the same bits as the reference below, so a backbone
// and a worker on different CPUs agree exactly:
//
//  * Per-lane block types (llama.cpp's x86 AVX2/AVX-512 vec_dot and tinyBLAS order, so our
//    activation-quantized matmuls reproduce llama.cpp's CPU bits): 8 float lanes; for each
//    block, int32 lane l is the exact sum over the elements n with (n % 32) / 4 == l (for
//    K-quants times each element's sub-block scale), and acc[l] = fmaf((float)lane[l], d, acc[l]):
//      Q8_0/Q4_0/Q5_0/IQ4_NL x Q8_0 : d = dx*dy (per 32-element block)
//      Q4_1/Q5_1 x Q8_1             : d = dx*dy, unsigned values; mins = fmaf(mx, sy, mins) per
//                                     block in order; result reduce8(acc) + mins
//      Q3_K x Q8_K                  : d = dx*dy8, 16-element scales (sc-32), values q-4..3
//      IQ4_XS x Q8_K                : d = dx*dy8, 32-element scales (ls-32), values T[q]
//      Q2_K x Q8_K                  : d = dx*dy8, 16-element scales; but first, per super-block,
//                                     acc[l] = fmaf((float)mins[l], -(dy8*dminx), acc[l]) with
//                                     mins[l] = m(2l)*bsums[2l] + m(2l+1)*bsums[2l+1]
//      MXFP4 x Q8_0                 : d = dy*E(e), values F[q]; blocks in pairs, the even one into
//                                     acc, the odd one into acc2 (ggml's x86 vec_dot); result
//                                     reduce8(acc + acc2), then an odd last block b:
//                                     fmaf(d_b, (float)isum_b, result)
//      Q6_K x Q8_K                  : d = dx*dy8 (per super-block), 16-element scales, value the
//                                     unsigned q (0..63); then lane[l] -= 32*(bsums[2l]*sc[2l] +
//                                     bsums[2l+1]*sc[2l+1]) (the -32 offset from the activation's
//                                     sums, as ggml's AVX2 kernel since llama.cpp PR 22345)
//      Q4_K/Q5_K x Q8_K             : d = dx*dy8; plus mins, per super-block, as 4 int lanes
//                                     mlane[i] = m(2i)*s(2i) + m(2i+1)*s(2i+1) with
//                                     s(k) = bsums[2k]+bsums[2k+1] and dm = -(dminx*dy8):
//                                     Q4_K: accm[i] = fmaf((float)mlane[i], dm, accm[i]), result
//                                       reduce8(acc) + ((accm0+accm2) + (accm1+accm3));
//                                     Q5_K: summs = fmaf((float)(sum of mlane), dm, summs),
//                                       result reduce8(acc) + summs.
//  * Other block types: for each block b (32-element block for legacy types, 256-element
//    super-block for K-quants) the integer part is an exact int32 sum; the float part is then
//    accumulated into 8 lanes, lane = b % 8, with fused multiply-adds, in this order per type:
//      Q8_K x Q8_K (and Q8_1 x Q8_1 : per-lane as Q8_0)
//                                   : acc = fmaf((float)isum, dx*dy, acc)
//    (products like dx*dy are single f32 multiplies of the f32-converted scales), then
//      result = ((acc0+acc4) + (acc2+acc6)) + ((acc1+acc5) + (acc3+acc7))     -- `reduce8`
//  * F32/F16/BF16 (activations converted to the weight's type, then both widened to f32):
//    32 lanes, element i -> lane i % 32, acc[l] = fmaf(w_i, x_i, acc[l]); then halving tree:
//    for h in 16,8,4,2,1: acc[l] += acc[l+h] for l < h; result acc[0].       -- `reduce32`
//  * Activation quantizers (from_float), per row, independent of other rows:
//      Q8_0: amax = max|x|; d = amax/127; id = amax ? 127/amax : 0; q = round-half-even(x*id);
//            stored d = f16(d).
//      Q8_1: as Q8_0 plus s = f16(d * sum q) (d the f32 value).
//      Q8_K: max = signed value of largest |x| (first wins); amax==0 -> all zero; else
//            iscale = -127/max, q = min(127, round-half-even(iscale*x)), d = 1/iscale,
//            bsums[g] = sum of q over group g of 16.
//      F16/BF16: round-to-nearest-even conversions (fp16.h).
#pragma once

#include <cstddef>
#include <cstdint>

#include "moesh/tensor/types.h"

namespace moesh::quant {

constexpr int kQK = 32;    // legacy block
constexpr int kQKK = 256;  // K-quant super-block

#pragma pack(push, 1)
struct BlockQ4_0 {
  uint16_t d;
  uint8_t qs[16];
};
struct BlockQ4_1 {
  uint16_t d;
  uint16_t m;
  uint8_t qs[16];
};
struct BlockQ5_0 {
  uint16_t d;
  uint8_t qh[4];
  uint8_t qs[16];
};
struct BlockQ5_1 {
  uint16_t d;
  uint16_t m;
  uint8_t qh[4];
  uint8_t qs[16];
};
struct BlockQ8_0 {
  uint16_t d;
  int8_t qs[32];
};
struct BlockQ8_1 {
  uint16_t d;
  uint16_t s;
  int8_t qs[32];
};
struct BlockIQ4_NL {
  uint16_t d;
  uint8_t qs[16];
};
struct BlockMXFP4 {
  uint8_t e;
  uint8_t qs[16];
};
struct BlockQ2_K {
  uint8_t scales[16];
  uint8_t qs[64];
  uint16_t d;
  uint16_t dmin;
};
struct BlockQ3_K {
  uint8_t hmask[32];
  uint8_t qs[64];
  uint8_t scales[12];
  uint16_t d;
};
struct BlockQ4_K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[12];
  uint8_t qs[128];
};
struct BlockQ5_K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[12];
  uint8_t qh[32];
  uint8_t qs[128];
};
struct BlockQ6_K {
  uint8_t ql[128];
  uint8_t qh[64];
  int8_t scales[16];
  uint16_t d;
};
struct BlockQ8_K {
  float d;
  int8_t qs[256];
  int16_t bsums[16];
};
struct BlockIQ4_XS {
  uint16_t d;
  uint16_t scales_h;
  uint8_t scales_l[4];
  uint8_t qs[128];
};
#pragma pack(pop)

static_assert(sizeof(BlockQ4_0) == 18);
static_assert(sizeof(BlockQ4_1) == 20);
static_assert(sizeof(BlockQ5_0) == 22);
static_assert(sizeof(BlockQ5_1) == 24);
static_assert(sizeof(BlockQ8_0) == 34);
static_assert(sizeof(BlockQ8_1) == 36);
static_assert(sizeof(BlockIQ4_NL) == 18);
static_assert(sizeof(BlockMXFP4) == 17);
static_assert(sizeof(BlockQ2_K) == 84);
static_assert(sizeof(BlockQ3_K) == 110);
static_assert(sizeof(BlockQ4_K) == 144);
static_assert(sizeof(BlockQ5_K) == 176);
static_assert(sizeof(BlockQ6_K) == 210);
static_assert(sizeof(BlockQ8_K) == 292);
static_assert(sizeof(BlockIQ4_XS) == 136);

// kvalues_iq4nl and kvalues_mxfp4 (E2M1 doubled), see docs/background/quant-formats.md §2.
extern const int8_t k_values_iq4nl[16];
extern const int8_t k_values_mxfp4[16];
// E8M0 scale halved: 2^(e-128) built as a float bit pattern (ggml_e8m0_to_fp32_half).
float e8m0_to_fp32_half(uint8_t e);

// The activation format a weight type's dot product consumes (docs/background/quant-formats.md §5).
// F32->F32, F16->F16, BF16->BF16, legacy/MXFP4/IQ4_NL->Q8_0, Q4_1/Q5_1->Q8_1, K/IQ4_XS->Q8_K.
GgmlType vec_dot_type(GgmlType weight_type);

// True for types we can dequantize and dot (the list in the engine issue, plus Q8_1, IQ4_*).
bool type_is_supported(GgmlType t);

// ---- scalar reference routines (the definition every optimized path is tested against) ----
// n is a multiple of the type's block size. Return false for an unsupported type.

// dst[0..n) = values of the n elements at src.
bool dequantize_row_ref(GgmlType t, const void* src, float* dst, int64_t n);
// Quantizes n floats into blocks of type t (weights or activations; for Q8_0/Q8_1/Q8_K/F16/BF16
// this is exactly the canonical activation quantizer above).
bool quantize_row_ref(GgmlType t, const float* src, void* dst, int64_t n);
// Dot product of a weight row of type t with an activation row already in vec_dot_type(t),
// in the canonical order above.
float vec_dot_ref(GgmlType t, int64_t n, const void* w, const void* x);

}  // namespace moesh::quant
