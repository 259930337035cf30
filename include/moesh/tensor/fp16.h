// Half-precision conversions. fp16->fp32 is exact; fp32->fp16 is IEEE round-to-nearest-even
// (subnormals kept, overflow to inf, NaN -> 0x7E00|sign); bf16 as in docs/background/quant-formats.md §1.
// Scalar and bit-exact with F16C's _cvtss_sh(x, 0), so every ISA agrees.
#pragma once

#include <cstdint>
#include <cstring>

namespace moesh {

float fp16_to_fp32(uint16_t h);
uint16_t fp32_to_fp16(float f);

inline float bf16_to_fp32(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint16_t fp32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

}  // namespace moesh
