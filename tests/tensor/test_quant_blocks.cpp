// Hand-built blocks: bytes written field by field from docs/background/quant-formats.md, with the expected
// values worked out by hand (in the comments), so a layout or bit-order error cannot hide behind
// a quantizer and dequantizer that agree with each other.
#include <gtest/gtest.h>

#include <cstring>

#include "moesh/tensor/fp16.h"
#include "moesh/tensor/quant.h"
#include "tensor/quant_test_util.h"

namespace moesh::quant {
namespace {

template <typename B>
std::vector<float> deq(GgmlType t, const B& b) {
  const int64_t n = type_block_size(t);
  EXPECT_EQ(sizeof(B), type_block_bytes(t));
  std::vector<float> y(static_cast<size_t>(n), NAN);
  EXPECT_TRUE(dequantize_row_ref(t, &b, y.data(), n));
  return y;
}

constexpr uint16_t k_h1 = 0x3c00;    // 1.0
constexpr uint16_t k_h05 = 0x3800;   // 0.5
constexpr uint16_t k_h025 = 0x3400;  // 0.25
constexpr uint16_t k_h2 = 0x4000;    // 2.0
constexpr uint16_t k_hm1 = 0xbc00;   // -1.0

TEST(QuantBlocks, Legacy) {
  {
    BlockQ4_0 b{};
    b.d = k_h05;
    b.qs[0] = 0x1f;  // x[0] = 0.5*(15-8) = 3.5, x[16] = 0.5*(1-8) = -3.5
    b.qs[1] = 0x80;  // x[1] = 0.5*(0-8) = -4,  x[17] = 0.5*(8-8) = 0
    const auto y = deq(GgmlType::Q4_0, b);
    EXPECT_EQ(y[0], 3.5f);
    EXPECT_EQ(y[16], -3.5f);
    EXPECT_EQ(y[1], -4.0f);
    EXPECT_EQ(y[17], 0.0f);
    EXPECT_EQ(y[2], -4.0f);  // qs = 0 -> -8*d
  }
  {
    BlockQ4_1 b{};
    b.d = k_h05;
    b.m = k_hm1;
    b.qs[0] = 0x2a;  // x[0] = 0.5*10 - 1 = 4, x[16] = 0.5*2 - 1 = 0
    const auto y = deq(GgmlType::Q4_1, b);
    EXPECT_EQ(y[0], 4.0f);
    EXPECT_EQ(y[16], 0.0f);
    EXPECT_EQ(y[5], -1.0f);
  }
  {
    BlockQ5_0 b{};
    b.d = k_h1;
    const uint32_t qh = (1u << 0) | (1u << 16);
    std::memcpy(b.qh, &qh, 4);
    b.qs[0] = 0x21;  // x[0] = (1|16)-16 = 1, x[16] = (2|16)-16 = 2
    b.qs[1] = 0x03;  // x[1] = 3-16 = -13 (bit 1 clear)
    const auto y = deq(GgmlType::Q5_0, b);
    EXPECT_EQ(y[0], 1.0f);
    EXPECT_EQ(y[16], 2.0f);
    EXPECT_EQ(y[1], -13.0f);
    EXPECT_EQ(y[17], -16.0f);
  }
  {
    BlockQ5_1 b{};
    b.d = k_h2;
    b.m = k_h1;
    const uint32_t qh = 1u << 31;
    std::memcpy(b.qh, &qh, 4);
    b.qs[15] = 0xf0;  // x[31] = 2*(15|16) + 1 = 63; x[15] = 2*0 + 1 = 1
    const auto y = deq(GgmlType::Q5_1, b);
    EXPECT_EQ(y[31], 63.0f);
    EXPECT_EQ(y[15], 1.0f);
  }
  {
    BlockQ8_0 b{};
    b.d = k_h025;
    b.qs[5] = -7;  // -1.75
    b.qs[31] = 127;
    const auto y = deq(GgmlType::Q8_0, b);
    EXPECT_EQ(y[5], -1.75f);
    EXPECT_EQ(y[31], 31.75f);
  }
  {
    BlockIQ4_NL b{};
    b.d = k_h2;
    b.qs[0] = 0x0f;  // x[0] = 2*T[15] = 226, x[16] = 2*T[0] = -254
    b.qs[3] = 0x78;  // x[3] = 2*T[8] = 2, x[19] = 2*T[7] = -20
    const auto y = deq(GgmlType::IQ4_NL, b);
    EXPECT_EQ(y[0], 226.0f);
    EXPECT_EQ(y[16], -254.0f);
    EXPECT_EQ(y[3], 2.0f);
    EXPECT_EQ(y[19], -20.0f);
  }
  {
    BlockMXFP4 b{};
    b.e = 130;       // E = 2^(130-128) = 4
    b.qs[0] = 0x97;  // x[0] = 4*F[7] = 48, x[16] = 4*F[9] = -4
    b.qs[2] = 0xf5;  // x[2] = 4*F[5] = 24, x[18] = 4*F[15] = -48
    const auto y = deq(GgmlType::MXFP4, b);
    EXPECT_EQ(y[0], 48.0f);
    EXPECT_EQ(y[16], -4.0f);
    EXPECT_EQ(y[2], 24.0f);
    EXPECT_EQ(y[18], -48.0f);
    EXPECT_EQ(y[1], 0.0f);
    EXPECT_EQ(y[17], 0.0f);
  }
}

TEST(QuantBlocks, Q2_K) {
  BlockQ2_K b{};
  b.d = k_h1;
  b.dmin = k_h05;
  b.scales[3] = 0x52;   // group 3 (elements 48..63): sc = 2, m = 5
  b.scales[1] = 0x31;   // group 1 (16..31): sc = 1, m = 3
  b.qs[16] = 0x0c;      // element 48 = (h0, j1, l16): q = (qs[16]>>2)&3 = 3; element 16: q = 0
  b.qs[63] = 0x80;      // element 255 = (h1, j3, l31): q = 2, group 15 (scale 0, min 0)
  b.scales[15] = 0x24;  // sc = 4, m = 2
  const auto y = deq(GgmlType::Q2_K, b);
  EXPECT_EQ(y[48], 1.0f * 2 * 3 - 0.5f * 5);  // 3.5
  EXPECT_EQ(y[16], -1.5f);                    // 0 - 0.5*3
  EXPECT_EQ(y[255], 4.0f * 2 - 0.5f * 2);     // 7
  EXPECT_EQ(y[0], 0.0f);                      // group 0 all-zero scale and min
}

// Q3_K scale codes packed per the four cases of docs/background/quant-formats.md §3.
void pack_q3k_scales(const int code[16], uint8_t b[12]) {
  std::memset(b, 0, 12);
  for (int s = 0; s < 4; ++s) b[s] |= code[s] & 15, b[8 + s] |= (code[s] >> 4) << 0;
  for (int s = 4; s < 8; ++s) b[s] |= code[s] & 15, b[8 + s - 4] |= (code[s] >> 4) << 2;
  for (int s = 8; s < 12; ++s) b[s - 8] |= (code[s] & 15) << 4, b[8 + s - 8] |= (code[s] >> 4) << 4;
  for (int s = 12; s < 16; ++s) b[s - 8] |= (code[s] & 15) << 4, b[8 + s - 12] |= (code[s] >> 4) << 6;
}

TEST(QuantBlocks, Q3_K) {
  BlockQ3_K b{};
  b.d = k_h05;
  int code[16];
  for (int s = 0; s < 16; ++s) code[s] = (s * 13 + 5) % 64;  // distinct codes, all bit patterns
  pack_q3k_scales(code, b.scales);
  // q = 1 everywhere: low bits 01 in each 2-bit field, every hmask bit set (no -4).
  std::memset(b.qs, 0x55, sizeof(b.qs));
  std::memset(b.hmask, 0xff, sizeof(b.hmask));
  auto y = deq(GgmlType::Q3_K, b);
  for (int g = 0; g < 16; ++g) {
    for (int l = 0; l < 16; ++l) ASSERT_EQ(y[16 * g + l], 0.5f * (code[g] - 32)) << g << " " << l;
  }
  // Element 255 = (h1, j3, l31): q = (qs[63]>>6)&3 - (hmask[31] bit 7 ? 0 : 4).
  b.qs[63] = 0xc0 | (b.qs[63] & 0x3f);  // low bits 3
  b.hmask[31] &= 0x7f;                  // -> 3 - 4 = -1
  // Element 37 = (h0, j1, l5): qs[5] bits 2-3, hmask[5] bit 1.
  b.qs[5] &= ~0x0c;     // 0
  b.hmask[5] &= ~0x02;  // 0 - 4 = -4
  y = deq(GgmlType::Q3_K, b);
  EXPECT_EQ(y[255], 0.5f * (code[15] - 32) * -1.0f);
  EXPECT_EQ(y[37], 0.5f * (code[2] - 32) * -4.0f);
  EXPECT_EQ(y[36], 0.5f * (code[2] - 32));  // neighbours untouched
}

// Q4_K/Q5_K scale/min codes packed per get_scale_min_k4 (docs/background/quant-formats.md §3).
void pack_k4_scales(const int sc[8], const int m[8], uint8_t b[12]) {
  std::memset(b, 0, 12);
  for (int s = 0; s < 4; ++s) {
    b[s] = static_cast<uint8_t>((sc[s] & 63) | ((sc[s + 4] >> 4) << 6));
    b[s + 4] = static_cast<uint8_t>((m[s] & 63) | ((m[s + 4] >> 4) << 6));
    b[s + 8] = static_cast<uint8_t>((sc[s + 4] & 15) | ((m[s + 4] & 15) << 4));
  }
}

TEST(QuantBlocks, Q4_K) {
  BlockQ4_K b{};
  b.d = k_h1;
  b.dmin = k_h025;
  // Literal bytes for sub-blocks 1 and 5: sc1 = 3, m1 = 7; sc5 = 37 (0b10'0101), m5 = 18 (0b01'0010).
  b.scales[1] = 0x80 | 3;  // sc1 | (sc5>>4)<<6
  b.scales[5] = 0x40 | 7;  // m1  | (m5>>4)<<6
  b.scales[9] = 0x25;      // (sc5&15) | (m5&15)<<4 = 5 | 2<<4
  b.qs[0] = 0xa0;          // element 32 (chunk 0, high nibble -> sub 1): q = 10
  b.qs[64 + 3] = 0x70;     // element 163 (chunk 2, high nibble -> sub 5): q = 7
  auto y = deq(GgmlType::Q4_K, b);
  EXPECT_EQ(y[32], 3.0f * 10 - 0.25f * 7);    // 28.25
  EXPECT_EQ(y[163], 37.0f * 7 - 0.25f * 18);  // 254.5
  EXPECT_EQ(y[162], -0.25f * 18);             // q = 0 in sub 5
  EXPECT_EQ(y[0], 0.0f);                      // sub 0: zero scale and min
  // Every sub-block distinct: q = 1 everywhere gives d*sc - dmin*m.
  int sc[8], m[8];
  for (int s = 0; s < 8; ++s) sc[s] = (s * 23 + 11) % 64, m[s] = (s * 37 + 3) % 64;
  pack_k4_scales(sc, m, b.scales);
  std::memset(b.qs, 0x11, sizeof(b.qs));
  y = deq(GgmlType::Q4_K, b);
  for (int s = 0; s < 8; ++s) {
    for (int l = 0; l < 32; ++l) ASSERT_EQ(y[32 * s + l], 1.0f * sc[s] - 0.25f * m[s]) << s << " " << l;
  }
}

TEST(QuantBlocks, Q5_K) {
  BlockQ5_K b{};
  b.d = k_h1;
  b.dmin = k_h025;
  b.scales[1] = 0x80 | 3;
  b.scales[5] = 0x40 | 7;
  b.scales[9] = 0x25;
  b.qs[0] = 0xa0;
  b.qs[64 + 3] = 0x70;
  b.qh[3] = 1 << 5;  // element 163 = 64*2 + 32 + 3: high bit 2c+1 = 5 -> q = 7 + 16
  b.qh[0] = 1 << 1;  // element 32 = 64*0 + 32 + 0: bit 1 -> q = 10 + 16
  b.qh[4] = 1 << 4;  // element 132 = 64*2 + 4 (low nibble, bit 2c = 4) -> q = 16, sub 4
  const auto y = deq(GgmlType::Q5_K, b);
  EXPECT_EQ(y[163], 37.0f * 23 - 0.25f * 18);  // 846.5
  EXPECT_EQ(y[32], 3.0f * 26 - 0.25f * 7);     // 76.25
  // Sub 4: sc = (b[8]&15) | (b[0]>>6)<<4 = 0, m = (b[8]>>4) | (b[4]>>6)<<4 = 0.
  EXPECT_EQ(y[132], 0.0f);
  EXPECT_EQ(y[163 - 32], 0.0f);
}

TEST(QuantBlocks, Q6_K) {
  BlockQ6_K b{};
  b.d = k_h05;
  for (int i = 0; i < 16; ++i) b.scales[i] = static_cast<int8_t>(i - 8);
  // All codes 32 (q = 0): low nibble 0, high bits 2 -> qh bytes 0b10101010.
  std::memset(b.qh, 0xaa, sizeof(b.qh));
  // Element 212 = 128*1 + 20 + 64: L = ql+64, H = qh+32, value (L[20]>>4) | ((H[20]>>4)&3)<<4.
  b.ql[64 + 20] = 0xb0;                       // 11
  b.qh[32 + 20] = (0xaa & ~0x30) | (2 << 4);  // high bits 2 -> 11 + 32 - 32 = 11
  // Element 40 = 128*0 + 8 + 32: (L[40]&15) | ((H[8]>>2)&3)<<4.
  b.ql[40] = 0x05;
  b.qh[8] = (0xaa & ~0x0c) | (0 << 2);  // 5 - 32 = -27
  const auto y = deq(GgmlType::Q6_K, b);
  EXPECT_EQ(y[212], 0.5f * 5 * 11);   // scale index 212/16 = 13 -> 13-8 = 5: 27.5
  EXPECT_EQ(y[40], 0.5f * -6 * -27);  // scale index 2 -> -6: 81
  EXPECT_EQ(y[41], 0.0f);
  EXPECT_EQ(y[20 + 128], 0.0f);
}

TEST(QuantBlocks, Q8_KAndIQ4_XS) {
  BlockQ8_K k{};
  k.d = 0.125f;
  k.qs[100] = -100;
  const auto yk = deq(GgmlType::Q8_K, k);
  EXPECT_EQ(yk[100], -12.5f);
  EXPECT_EQ(yk[101], 0.0f);

  BlockIQ4_XS b{};
  b.d = k_h1;
  // Block 5: ls = ((scales_l[2]>>4)&15) | ((scales_h>>10)&3)<<4 = 9 | 2<<4 = 41 -> dl = 9.
  b.scales_l[2] = 0x90;
  b.scales_h = 2 << 10;
  b.qs[16 * 5 + 2] = 0x3c;  // x[162] = 9*T[12] = 477, x[178] = 9*T[3] = -585
  const auto y = deq(GgmlType::IQ4_XS, b);
  EXPECT_EQ(y[162], 477.0f);
  EXPECT_EQ(y[178], -585.0f);
  // Block 4 (low nibble of scales_l[2] = 0, high bits 0): dl = -32; q = 0 -> T[0] = -127.
  EXPECT_EQ(y[128], -32.0f * -127.0f);
}

// Dot products of hand-built blocks with a hand-built Q8_K row: the integer bookkeeping
// (bsums/min term, scale per sub-block) gives a value computable by hand.
TEST(QuantBlocks, Q4_KDotByHand) {
  BlockQ4_K w{};
  w.d = k_h1;
  w.dmin = k_h05;
  int sc[8] = {1, 2, 3, 4, 5, 6, 7, 8}, m[8] = {0, 0, 0, 0, 0, 0, 0, 2};
  pack_k4_scales(sc, m, w.scales);
  std::memset(w.qs, 0x11, sizeof(w.qs));  // q = 1 everywhere: x = sc_s - 0.5*m_s
  BlockQ8_K x{};
  x.d = 0.5f;
  for (int j = 0; j < 256; ++j) x.qs[j] = 1;
  for (int g = 0; g < 16; ++g) x.bsums[g] = 16;
  // sum_s 32*(sc_s - 0.5*m_s) * 0.5 = 16*(36) - 16*0.5*2 = 576 - 16 = 560
  EXPECT_EQ(vec_dot_ref(GgmlType::Q4_K, 256, &w, &x), 560.0f);
}

}  // namespace
}  // namespace moesh::quant
