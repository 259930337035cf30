// SIMD kernel tables (AVX2, AVX-512) against the scalar reference table, in the style of
// llama.cpp's test-backend-ops: every supported weight type x every ISA x many row lengths x
// several seeded data sets.
//
// Tolerance per type: 0 for all — bit equality (memcmp of the float result / output bytes).
// The canonical order in quant.h fixes every float operation, so there is nothing to tolerate:
//
//   type                       vec_dot   to_float   from_float (as activation type)
//   F32, F16, BF16             0 (bits)  0 (bits)   0 (bytes, incl. exact RNE ties)
//   Q8_0, Q8_1, Q8_K           0 (bits)  0 (bits)   0 (bytes, incl. exact .5 ties)
//   Q4_0 Q4_1 Q5_0 Q5_1        0 (bits)  0 (bits)   -
//   IQ4_NL MXFP4               0 (bits)  0 (bits)   -
//   Q2_K Q3_K Q4_K Q5_K Q6_K   0 (bits)  0 (bits)   -
//   IQ4_XS                     0 (bits)  0 (bits)   -
//
// Out of contract (not tested): NaN payloads (F16C keeps them, the reference canonicalises) and
// activation int8 values of -128 (the quantizers never produce them).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "moesh/tensor/fp16.h"
#include "moesh/tensor/kernels.h"
#include "moesh/tensor/quant.h"
#include "moesh/tensor/types.h"

namespace moesh {
namespace {

const GgmlType k_weight_types[] = {GgmlType::F32,    GgmlType::F16,  GgmlType::BF16, GgmlType::Q8_0,   GgmlType::Q4_0,
                                   GgmlType::Q4_1,   GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::IQ4_NL, GgmlType::MXFP4,
                                   GgmlType::Q2_K,   GgmlType::Q3_K, GgmlType::Q4_K, GgmlType::Q5_K,   GgmlType::Q6_K,
                                   GgmlType::IQ4_XS, GgmlType::Q8_K};

const GgmlType k_act_types[] = {GgmlType::F32,  GgmlType::F16,  GgmlType::BF16,
                                GgmlType::Q8_0, GgmlType::Q8_1, GgmlType::Q8_K};

enum class Dist { kNormal, kUniform, kOutliers, kZeros, kTies };
const Dist k_dists[] = {Dist::kNormal, Dist::kUniform, Dist::kOutliers, Dist::kZeros, Dist::kTies};
const char* dist_name(Dist d) {
  switch (d) {
    case Dist::kNormal:
      return "normal";
    case Dist::kUniform:
      return "uniform";
    case Dist::kOutliers:
      return "outliers";
    case Dist::kZeros:
      return "zeros";
    case Dist::kTies:
      return "ties";
  }
  return "?";
}

// Row lengths for block size bs: every multiple from 1 to 20 blocks, plus model-sized rows.
std::vector<int64_t> lengths_for(int64_t bs) {
  std::vector<int64_t> out;
  const int64_t max_small = bs == 1 ? 80 : 20;
  for (int64_t k = 1; k <= max_small; ++k) out.push_back(k * bs);
  for (int64_t n : {768, 2048, 2880, 4096, 7168}) {
    if (n % bs == 0) out.push_back(n);
  }
  return out;
}

uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// Floats of one distribution. kTies builds values whose quantization lands exactly on .5
// (Q8_0/Q8_K: each 32-block holds +-127*2^e so the scale is a power of two, the rest k+0.5 in
// the same units) and exact midpoints between adjacent f16 / bf16 values.
std::vector<float> make_floats(Dist dist, int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<float> x(static_cast<size_t>(n));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> uni(-2.0f, 2.0f);
  switch (dist) {
    case Dist::kNormal:
      for (auto& v : x) v = normal(rng);
      break;
    case Dist::kUniform:
      for (auto& v : x) v = uni(rng);
      break;
    case Dist::kOutliers:
      for (auto& v : x) v = normal(rng) * (rng() % 61 == 0 ? 300.0f : 0.05f);
      break;
    case Dist::kZeros:
      for (auto& v : x) v = (rng() % 97 == 0) ? -0.0f : 0.0f;
      break;
    case Dist::kTies: {
      std::uniform_int_distribution<int> q(-127, 126);
      for (int64_t i = 0; i < n; ++i) {
        const int64_t blk = i / 32;
        const float unit = std::ldexp(1.0f, static_cast<int>(blk % 7) - 3);
        switch (rng() % 4) {
          case 0:
          case 1:  // an exact .5 tie in quantized units
            x[i] = (static_cast<float>(q(rng)) + 0.5f) * unit;
            break;
          case 2: {  // midpoint of two adjacent f16 values (RNE tie for F16)
            const uint16_t h = static_cast<uint16_t>(rng() % 0x4000);  // incl. subnormals
            const float a = fp16_to_fp32(h), b = fp16_to_fp32(static_cast<uint16_t>(h + 1));
            x[i] = ((a + b) * 0.5f) * ((rng() & 1) ? -1.0f : 1.0f);
            break;
          }
          default: {  // midpoint of two adjacent bf16 values
            const uint32_t u = ((0x3C00u + rng() % 0x0400u) << 16) | 0x8000u;
            float f;
            std::memcpy(&f, &u, 4);
            x[i] = f;
          }
        }
        // The block scale: amax = 127 units, with a sign picked per block; at (block % 5 == 0)
        // the amax appears twice with opposite signs (Q8_K's first-occurrence rule).
        if (i % 32 == 31) {
          const int64_t b0 = i - 31;
          x[b0 + (blk * 7) % 32] = ((blk & 1) ? -127.0f : 127.0f) * unit;
          if (blk % 5 == 0) x[b0 + (blk * 7 + 11) % 32] = ((blk & 1) ? 127.0f : -127.0f) * unit;
        }
      }
      // Q8_K uses 256-blocks; make the largest |x| a tie between signs in some of them too.
      for (int64_t s = 0; s + 256 <= n; s += 256) {
        if ((s / 256) % 2 == 0) {
          x[s + 5] = -300.0f;
          x[s + 200] = 300.0f;
        }
      }
      break;
    }
  }
  return x;
}

// Random weight blocks: random bytes everywhere, then sane values in the float scale fields
// (random f16 scale bytes would include inf/NaN and make every result non-finite).
std::vector<uint8_t> make_weights(GgmlType t, int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  const size_t bytes = type_row_bytes(t, n);
  std::vector<uint8_t> w(bytes);
  if (t == GgmlType::F32 || t == GgmlType::F16 || t == GgmlType::BF16) {
    const auto x = make_floats(Dist::kNormal, n, seed ^ 0x5a5a);
    for (int64_t i = 0; i < n; ++i) {
      if (t == GgmlType::F32) {
        std::memcpy(w.data() + 4 * i, &x[i], 4);
      } else {
        const uint16_t h = t == GgmlType::F16 ? fp32_to_fp16(x[i]) : fp32_to_bf16(x[i]);
        std::memcpy(w.data() + 2 * i, &h, 2);
      }
    }
    return w;
  }
  for (auto& b : w) b = static_cast<uint8_t>(rng());
  std::uniform_real_distribution<float> sc(0.001f, 0.05f);
  auto put_f16 = [&](uint8_t* p, bool allow_neg) {
    float v = sc(rng);
    if (allow_neg && (rng() & 3) == 0) v = -v;
    const uint16_t h = fp32_to_fp16(v);
    std::memcpy(p, &h, 2);
  };
  const size_t bb = type_block_bytes(t);
  for (size_t off = 0; off < bytes; off += bb) {
    uint8_t* b = w.data() + off;
    switch (t) {
      case GgmlType::Q4_0:
      case GgmlType::Q5_0:
      case GgmlType::Q8_0:
      case GgmlType::IQ4_NL:
      case GgmlType::IQ4_XS:
        put_f16(b, true);
        break;
      case GgmlType::Q4_1:
      case GgmlType::Q5_1:
      case GgmlType::Q4_K:
      case GgmlType::Q5_K:
        put_f16(b, false);
        put_f16(b + 2, true);
        break;
      case GgmlType::MXFP4:
        b[0] = static_cast<uint8_t>(rng() % 8 == 0 ? rng() % 3 : 118 + rng() % 18);  // incl. e = 0, 1, 2
        break;
      case GgmlType::Q2_K:
        put_f16(b + 80, false);
        put_f16(b + 82, false);
        break;
      case GgmlType::Q3_K:
        put_f16(b + 108, true);
        break;
      case GgmlType::Q6_K:
        put_f16(b + 208, true);
        break;
      case GgmlType::Q8_K: {
        const float d = sc(rng);
        std::memcpy(b, &d, 4);
        break;
      }
      default:
        break;
    }
  }
  return w;
}

// Quantizes activations for weight type t with the *scalar* table (the input both sides see).
std::vector<uint8_t> quantize_act(const KernelTable& k, GgmlType act, const std::vector<float>& x) {
  std::vector<uint8_t> out(type_row_bytes(act, static_cast<int64_t>(x.size())));
  if (act == GgmlType::F32) {
    std::memcpy(out.data(), x.data(), out.size());
  } else {
    k[act].from_float(x.data(), out.data(), static_cast<int64_t>(x.size()));
  }
  return out;
}

const KernelTable* table_or_skip(Isa isa) {
  if (!cpu_has(isa)) return nullptr;
  if (isa == Isa::kAvx512 && !avx512_enabled()) {
    std::printf(
        "\n*** avx512 is supported by this CPU but DISABLED (MOESH_ENABLE_AVX512=0): its kernels "
        "were NOT tested here ***\n");
    return nullptr;
  }
  const KernelTable* t = kernels_for(isa);
  EXPECT_NE(t, nullptr) << isa_name(isa) << " supported by CPU but no table";
  return t;
}

#define REQUIRE_ISA(isa, tab)                                                                    \
  const KernelTable* tab = table_or_skip(isa);                                                   \
  if (tab == nullptr) {                                                                          \
    GTEST_SKIP() << "\n*** " << isa_name(isa) << " NOT SUPPORTED BY THIS CPU: its kernels were " \
                 << "NOT tested here. Run this test on a CPU with " << isa_name(isa) << " ***";  \
  }

// ---------------------------------------------------------------- tests

// The SIMD tables must actually specialise the hot types (else the tests compare scalar to
// scalar and prove nothing).
void check_specialised(Isa isa) {
  const KernelTable& s = *kernels_for(Isa::kScalar);
  const KernelTable& v = *kernels_for(isa);
  for (GgmlType t : k_weight_types) {
    EXPECT_NE(v[t].vec_dot, s[t].vec_dot) << isa_name(isa) << " " << type_name(t);
  }
  for (GgmlType t : {GgmlType::Q8_0, GgmlType::Q8_1, GgmlType::Q8_K, GgmlType::F16, GgmlType::BF16}) {
    EXPECT_NE(v[t].from_float, s[t].from_float) << isa_name(isa) << " " << type_name(t);
  }
}

void check_from_float(Isa isa) {
  const KernelTable& s = *kernels_for(Isa::kScalar);
  const KernelTable& v = *kernels_for(isa);
  int n_checked = 0;
  for (GgmlType act : k_act_types) {
    if (act == GgmlType::F32) continue;
    const int64_t bs = type_block_size(act);
    for (Dist dist : k_dists) {
      for (int64_t n : lengths_for(bs == 1 ? 1 : bs)) {
        for (uint32_t seed : {1u, 2u}) {
          const auto x = make_floats(dist, n, seed * 1000 + static_cast<uint32_t>(n));
          std::vector<uint8_t> a(type_row_bytes(act, n)), b(a.size());
          s[act].from_float(x.data(), a.data(), n);
          v[act].from_float(x.data(), b.data(), n);
          ASSERT_EQ(std::memcmp(a.data(), b.data(), a.size()), 0)
              << isa_name(isa) << " from_float " << type_name(act) << " n=" << n << " " << dist_name(dist);
          ++n_checked;
        }
      }
    }
  }
  EXPECT_GT(n_checked, 500);
}

// Non-finite and tiny activations (a NaN from a broken upstream layer, an overflow to inf,
// subnormals, signed zeros) quantize to the reference's bytes too: the contract has no "finite
// inputs only" clause.
void check_from_float_special(Isa isa) {
  const KernelTable& s = *kernels_for(Isa::kScalar);
  const KernelTable& v = *kernels_for(isa);
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float specials[] = {nan, -nan, inf, -inf, 0.0f, -0.0f, 1e-40f, -1e-45f, 65504.0f, 65520.0f, 3.4e38f, 1.0f};
  for (GgmlType act : k_act_types) {
    if (act == GgmlType::F32) continue;
    const int64_t n = 512;
    for (uint32_t seed = 0; seed < 24; ++seed) {
      auto x = make_floats(Dist::kNormal, n, 4242u + seed);
      // Sprinkle specials: a few per row, at seed-dependent places (some blocks all special).
      for (int64_t j = 0; j < n; ++j) {
        const uint32_t h = (static_cast<uint32_t>(j) * 2654435761u) ^ (seed * 40503u);
        if (h % 7 == 0 || (seed % 4 == 0 && j < 32)) x[j] = specials[(h >> 8) % std::size(specials)];
      }
      std::vector<uint8_t> a(type_row_bytes(act, n)), b(a.size());
      s[act].from_float(x.data(), a.data(), n);
      v[act].from_float(x.data(), b.data(), n);
      ASSERT_EQ(std::memcmp(a.data(), b.data(), a.size()), 0)
          << isa_name(isa) << " from_float " << type_name(act) << " with NaN/inf/subnormals, seed " << seed;
    }
  }
}

// The tie data set must really produce ties, or the test above proves nothing about rounding.
TEST(KernelsSimdData, TieDataHitsExactHalves) {
  const auto x = make_floats(Dist::kTies, 4096, 7);
  int q8_ties = 0, f16_ties = 0;
  for (int64_t b = 0; b < 4096 / 32; ++b) {
    float amax = 0;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[32 * b + j]));
    const float id = 127.0f / amax;
    for (int j = 0; j < 32; ++j) {
      const float v = x[32 * b + j] * id;
      if (v - std::floor(v) == 0.5f) ++q8_ties;
    }
  }
  for (float f : x) {
    const uint16_t h = fp32_to_fp16(f);
    const float a = fp16_to_fp32(h);
    const float nb = fp16_to_fp32(static_cast<uint16_t>(f > a ? h + 1 : h - 1));
    if (f != a && (f - a) == (nb - f)) ++f16_ties;
  }
  EXPECT_GT(q8_ties, 1000);
  EXPECT_GT(f16_ties, 200);
}

void check_vec_dot(Isa isa) {
  const KernelTable& s = *kernels_for(Isa::kScalar);
  const KernelTable& v = *kernels_for(isa);
  for (GgmlType t : k_weight_types) {
    const GgmlType act = quant::vec_dot_type(t);
    const int64_t bs = std::max<int64_t>(type_block_size(t), type_block_size(act));
    std::set<uint32_t> distinct;
    int n_nonzero = 0, n_checked = 0;
    for (int64_t n : lengths_for(bs)) {
      for (Dist dist : k_dists) {
        for (uint32_t seed : {11u, 12u}) {
          const uint32_t sd = seed * 7919u + static_cast<uint32_t>(n) * 31u + static_cast<uint32_t>(dist);
          const auto w = make_weights(t, n, sd);
          const auto xq = quantize_act(s, act, make_floats(dist, n, sd + 1));
          const float ref = s[t].vec_dot(n, w.data(), xq.data());
          const float got = v[t].vec_dot(n, w.data(), xq.data());
          ASSERT_EQ(f32_bits(ref), f32_bits(got))
              << isa_name(isa) << " vec_dot " << type_name(t) << " n=" << n << " " << dist_name(dist)
              << " seed=" << seed << " ref=" << ref << " got=" << got;
          ASSERT_TRUE(std::isfinite(ref)) << type_name(t) << " n=" << n;
          ++n_checked;
          if (ref != 0.0f) ++n_nonzero;
          distinct.insert(f32_bits(ref));
        }
      }
    }
    // Not degenerate: most results are non-zero and they vary (zeros dataset is 1 in 5).
    EXPECT_GT(n_nonzero, n_checked / 2) << type_name(t);
    EXPECT_GT(distinct.size(), static_cast<size_t>(n_checked / 2)) << type_name(t);
  }
}

void check_to_float(Isa isa) {
  const KernelTable& s = *kernels_for(Isa::kScalar);
  const KernelTable& v = *kernels_for(isa);
  int n_specialised = 0;
  for (GgmlType t : k_weight_types) {
    if (v[t].to_float == nullptr || v[t].to_float == s[t].to_float) continue;
    ++n_specialised;
    for (int64_t n : lengths_for(type_block_size(t))) {
      const auto w = make_weights(t, n, static_cast<uint32_t>(n) * 13u);
      std::vector<float> a(static_cast<size_t>(n)), b(a.size());
      s[t].to_float(w.data(), a.data(), n);
      v[t].to_float(w.data(), b.data(), n);
      ASSERT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0)
          << isa_name(isa) << " to_float " << type_name(t) << " n=" << n;
    }
  }
  EXPECT_GE(n_specialised, 2);
}

// vec_dot_tile (where a table has one) == per-element vec_dot, for several tile shapes.
void check_tiles(Isa isa) {
  const KernelTable& v = *kernels_for(isa);
  int n_tested = 0;
  for (GgmlType t : k_weight_types) {
    if (v[t].vec_dot_tile == nullptr) continue;
    const GgmlType act = quant::vec_dot_type(t);
    const int64_t bs = std::max<int64_t>(type_block_size(t), type_block_size(act));
    for (int64_t n : {bs, 3 * bs, 9 * bs, 17 * bs, int64_t{4096}}) {
      if (n % bs) continue;
      const int max_r = 5, max_c = 17;  // tokens: past two 8-token groups
      const size_t wrow = type_row_bytes(t, n), xrow = type_row_bytes(act, n);
      std::vector<uint8_t> w, x;
      for (int r = 0; r < max_r; ++r) {
        const auto wr = make_weights(t, n, 100u + r + static_cast<uint32_t>(n));
        w.insert(w.end(), wr.begin(), wr.end());
      }
      for (int c = 0; c < max_c; ++c) {
        const auto xr = quantize_act(*kernels_for(Isa::kScalar), act, make_floats(Dist::kNormal, n, 200u + c));
        x.insert(x.end(), xr.begin(), xr.end());
      }
      for (int nr = 1; nr <= max_r; ++nr) {
        for (int nc = 1; nc <= max_c; ++nc) {
          const size_t ldo = static_cast<size_t>(nr) + 1;
          std::vector<float> out(ldo * nc, -1.0f);
          v[t].vec_dot_tile(n, w.data(), wrow, nr, x.data(), xrow, nc, out.data(), ldo);
          for (int c = 0; c < nc; ++c) {
            for (int r = 0; r < nr; ++r) {
              const float e = v[t].vec_dot(n, w.data() + r * wrow, x.data() + c * xrow);
              ASSERT_EQ(f32_bits(e), f32_bits(out[c * ldo + r]))
                  << isa_name(isa) << " tile " << type_name(t) << " n=" << n << " " << nr << "x" << nc << " r=" << r
                  << " c=" << c;
            }
            EXPECT_EQ(out[c * ldo + nr], -1.0f) << "tile wrote outside its rows";
          }
          ++n_tested;
        }
      }
    }
  }
  if (isa == Isa::kAvx2) {
    EXPECT_GT(n_tested, 0) << "AVX2 table has no vec_dot_tile";
  }
}

// vec_dot_rows (where a table has one) == vec_dot per row, including the activation-side
// preparation it keeps between calls (a second activation row must not see the first's).
void check_rows(Isa isa) {
  const KernelTable& v = *kernels_for(isa);
  int n_types = 0;
  for (GgmlType t : k_weight_types) {
    if (v[t].vec_dot_rows == nullptr) continue;
    ++n_types;
    const GgmlType act = quant::vec_dot_type(t);
    const int64_t bs = std::max<int64_t>(type_block_size(t), type_block_size(act));
    for (int64_t n : {bs, 3 * bs, 9 * bs, 17 * bs, int64_t{4096}}) {
      if (n % bs) continue;
      const int max_r = 9;
      const size_t wrow = type_row_bytes(t, n), xrow = type_row_bytes(act, n);
      std::vector<uint8_t> w;
      for (int r = 0; r < max_r; ++r) {
        const auto wr = make_weights(t, n, 300u + r + static_cast<uint32_t>(n));
        w.insert(w.end(), wr.begin(), wr.end());
      }
      for (int c = 0; c < 2; ++c) {
        const auto x = quantize_act(*kernels_for(Isa::kScalar), act,
                                    make_floats(c == 0 ? Dist::kNormal : Dist::kOutliers, n, 400u + c));
        ASSERT_EQ(x.size(), xrow);
        for (int nr = 1; nr <= max_r; ++nr) {
          std::vector<float> out(static_cast<size_t>(nr) + 1, -1.0f);
          v[t].vec_dot_rows(n, w.data(), wrow, nr, x.data(), out.data());
          for (int r = 0; r < nr; ++r) {
            const float e = v[t].vec_dot(n, w.data() + r * wrow, x.data());
            ASSERT_EQ(f32_bits(e), f32_bits(out[r]))
                << isa_name(isa) << " rows " << type_name(t) << " n=" << n << " nr=" << nr << " r=" << r << " x" << c;
          }
          EXPECT_EQ(out[nr], -1.0f) << "rows wrote past its rows";
        }
      }
    }
  }
  if (isa == Isa::kAvx512) {
    EXPECT_GE(n_types, 3) << "the AVX-512 table has Q4_K, Q5_K and Q6_K rows kernels";
  }
}

// Attention scores and KQV lanes (kernels.h AttnScores / AttnKqv) against the scalar reference:
// head sizes with and without a dk % 64 tail, cell ranges that start and end anywhere in a
// 16-cell group, several queries, strided rows, and value classes where every rounding shows
// (wide exponents) or specials travel (inf, NaN compared as "both NaN").
void check_attn(Isa isa) {
  const AttnKernels& ref = kernels_for(Isa::kScalar)->attn;
  const AttnKernels& v = kernels_for(isa)->attn;
  if (isa == Isa::kAvx2 || isa == Isa::kAvx512) {
    EXPECT_NE(v.scores, ref.scores) << isa_name(isa);
    EXPECT_NE(v.kqv, ref.kqv) << isa_name(isa);
  }
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> expo(-30, 30);
  auto same = [](float a, float b) { return std::isnan(a) ? std::isnan(b) : f32_bits(a) == f32_bits(b); };
  int checked = 0;
  for (int64_t dk : {int64_t{1}, int64_t{48}, int64_t{64}, int64_t{72}, int64_t{128}, int64_t{192}, int64_t{576}}) {
    for (int dist = 0; dist < 3; ++dist) {
      const int64_t n_cells = 53;
      const size_t stride = static_cast<size_t>(dk + 5);  // rows not 64-byte aligned
      std::vector<float> k(n_cells * stride), q(4 * static_cast<size_t>(dk));
      auto draw = [&](size_t i) {
        if (dist == 1) return std::ldexp(normal(rng), expo(rng));
        if (dist == 2 && i % 97 == 13) return i % 2 ? std::numeric_limits<float>::infinity() : std::nanf("");
        return normal(rng);
      };
      for (size_t i = 0; i < k.size(); ++i) k[i] = draw(i);
      for (size_t i = 0; i < q.size(); ++i) q[i] = normal(rng);
      for (auto [c0, c1] :
           {std::pair<int64_t, int64_t>{0, 53}, {0, 1}, {3, 19}, {16, 32}, {17, 18}, {5, 5}, {31, 53}}) {
        for (int nq : {1, 3}) {
          const size_t ld = 64;
          std::vector<float> a(nq * ld, -7.0f), b(nq * ld, -7.0f);
          AttnScores s;
          s.k = k.data();
          s.k_stride = stride;
          s.q = q.data();
          s.q_stride = static_cast<size_t>(dk);
          s.nq = nq;
          s.dk = dk;
          s.c0 = c0;
          s.c1 = c1;
          s.scale = 0.0883883f;
          s.out = a.data();
          s.out_stride = ld;
          ref.scores(s);
          s.out = b.data();
          v.scores(s);
          for (size_t i = 0; i < a.size(); ++i) {
            ASSERT_TRUE(same(a[i], b[i]))
                << isa_name(isa) << " scores dk " << dk << " dist " << dist << " cells [" << c0 << "," << c1 << ") nq "
                << nq << " at " << i << ": " << a[i] << " vs " << b[i];
          }
          ++checked;
        }
      }
    }
  }
  for (int64_t dv : {int64_t{1}, int64_t{8}, int64_t{20}, int64_t{64}, int64_t{128}, int64_t{512}, int64_t{1100}}) {
    const int64_t n_cells = 300;
    const size_t stride = static_cast<size_t>(dv + 3);
    std::vector<float> vv(n_cells * stride), p(2 * n_cells);
    for (float& x : vv) x = std::ldexp(normal(rng), expo(rng) / 4);
    for (float& x : p) x = std::fabs(normal(rng)) / 16.0f;
    for (auto [c0, c1] :
         {std::pair<int64_t, int64_t>{0, 300}, {0, 1}, {3, 19}, {16, 48}, {17, 18}, {9, 9}, {33, 291}}) {
      for (int nh : {1, 2}) {
        std::vector<float> a(nh * 16 * dv), b;
        for (float& x : a) x = normal(rng);  // lanes carried over from an earlier call
        b = a;
        AttnKqv kq;
        kq.v = vv.data();
        kq.v_stride = stride;
        kq.p = p.data();
        kq.p_stride = static_cast<size_t>(n_cells);
        kq.nh = nh;
        kq.c0 = c0;
        kq.c1 = c1;
        kq.dv = dv;
        kq.lanes = a.data();
        kq.lanes_stride = static_cast<size_t>(16 * dv);
        ref.kqv(kq);
        kq.lanes = b.data();
        v.kqv(kq);
        for (size_t i = 0; i < a.size(); ++i) {
          ASSERT_EQ(f32_bits(a[i]), f32_bits(b[i]))
              << isa_name(isa) << " kqv dv " << dv << " nh " << nh << " cells [" << c0 << "," << c1 << ") at " << i;
        }
        ++checked;
      }
    }
  }
  // Softmax: rows with and without a 16-aligned tail, masked (-inf) cells, a sink, values far
  // apart (exp underflows to 0 and the out-of-range blend), and a NaN row compared as NaN.
  if (isa == Isa::kAvx2 || isa == Isa::kAvx512) {
    EXPECT_NE(v.softmax, ref.softmax) << isa_name(isa);
  }
  for (int64_t n : {int64_t{1}, int64_t{15}, int64_t{16}, int64_t{17}, int64_t{100}, int64_t{2055}}) {
    for (int dist = 0; dist < 4; ++dist) {
      std::vector<float> x(n);
      for (int64_t i = 0; i < n; ++i) {
        x[i] = normal(rng) * (dist == 2 ? 80.0f : 4.0f);
        if (dist == 1 && i % 5 == 0) x[i] = -INFINITY;
        if (dist == 3 && i == n / 2) x[i] = std::nanf("");
      }
      for (bool with_sink : {false, true}) {
        const float sink = 1.5f;
        std::vector<float> a = x, b = x;
        ref.softmax(a.data(), n, with_sink ? &sink : nullptr);
        v.softmax(b.data(), n, with_sink ? &sink : nullptr);
        for (int64_t i = 0; i < n; ++i) {
          ASSERT_TRUE(same(a[i], b[i])) << isa_name(isa) << " softmax n " << n << " dist " << dist << " sink "
                                        << with_sink << " at " << i << ": " << a[i] << " vs " << b[i];
        }
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 300);
}

// Eight tests per SIMD table; a table this CPU lacks is skipped loudly (REQUIRE_ISA).
#define MOESH_SIMD_TESTS(Suite, isa)    \
  TEST(Suite, Specialised) {            \
    REQUIRE_ISA(isa, t);                \
    check_specialised(isa);             \
  }                                     \
  TEST(Suite, FromFloatBitExact) {      \
    REQUIRE_ISA(isa, t);                \
    check_from_float(isa);              \
  }                                     \
  TEST(Suite, FromFloatSpecialValues) { \
    REQUIRE_ISA(isa, t);                \
    check_from_float_special(isa);      \
  }                                     \
  TEST(Suite, VecDotBitExact) {         \
    REQUIRE_ISA(isa, t);                \
    check_vec_dot(isa);                 \
  }                                     \
  TEST(Suite, ToFloatBitExact) {        \
    REQUIRE_ISA(isa, t);                \
    check_to_float(isa);                \
  }                                     \
  TEST(Suite, TileMatchesVecDot) {      \
    REQUIRE_ISA(isa, t);                \
    check_tiles(isa);                   \
  }                                     \
  TEST(Suite, RowsMatchVecDot) {        \
    REQUIRE_ISA(isa, t);                \
    check_rows(isa);                    \
  }                                     \
  TEST(Suite, AttentionBitExact) {      \
    REQUIRE_ISA(isa, t);                \
    check_attn(isa);                    \
  }

MOESH_SIMD_TESTS(KernelsSimdAvx2, Isa::kAvx2)
MOESH_SIMD_TESTS(KernelsSimdAvx512, Isa::kAvx512)
// aarch64: base ASIMD (every aarch64 CPU) and SDOT (Armv8.2 dotprod; qemu-user has it).
MOESH_SIMD_TESTS(KernelsSimdNeon, Isa::kNeon)
MOESH_SIMD_TESTS(KernelsSimdNeonDot, Isa::kNeonDot)

}  // namespace
}  // namespace moesh
