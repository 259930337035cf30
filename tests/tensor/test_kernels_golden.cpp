// Cross-architecture bit identity: every kernel table this build has (scalar everywhere, AVX2 /
// AVX-512 on x86; on aarch64 the scalar table) must reproduce fixed 64-bit hashes of its results,
// recorded once on x86-64. test_kernels_simd proves the SIMD tables equal the scalar one on the
// same machine; this test is what carries that guarantee to another architecture (the aarch64
// cross build runs it under qemu-user): a worker on ARM returns the bits an x86 worker returns.
//
// Per weight type: the reference quantizer's bytes (weights), the table's activation quantizer
// (from_float of vec_dot_type), every vec_dot of 8 weight rows x 3 activation rows, to_float of the
// weight rows, and matmul_q (tiles, thread pool) over the same rows. Per op: the expert FFN
// activations, RMSNorm, softmax and RoPE on fixed rows.
//
// The data are built from integers alone (splitmix64, sums of uniform integers times powers of
// two), so no libm or <random> distribution can make the inputs differ between machines.
// A deliberate change of the canonical order changes the hashes: rerun with
// MOESH_GOLDEN_PRINT=1 on x86-64 and paste the printed table below.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "moesh/tensor/kernels.h"
#include "moesh/tensor/ops.h"
#include "moesh/tensor/quant.h"
#include "moesh/tensor/threadpool.h"
#include "moesh/tensor/types.h"

namespace moesh {
namespace {

// FNV-1a over bytes.
struct Hash {
  uint64_t h = 0xcbf29ce484222325ull;
  void add(const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 0x100000001b3ull;
  }
  void add(const std::vector<float>& v) { add(v.data(), v.size() * sizeof(float)); }
  void add(float f) { add(&f, sizeof f); }
};

uint64_t splitmix64(uint64_t* s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Bell-shaped values exactly representable in f32: a sum of four uniform integers in
// [-4096, 4096], scaled by 2^-12 * `scale_pow2`; every 61st element an outlier (x8), every 97th 0.
std::vector<float> int_data(uint64_t seed, size_t n, float scale_pow2) {
  uint64_t s = seed;
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) {
    int32_t acc = 0;
    for (int k = 0; k < 4; ++k) acc += static_cast<int32_t>(splitmix64(&s) % 8193) - 4096;
    float x = static_cast<float>(acc) * (1.0f / 4096.0f) * scale_pow2;
    if (i % 61 == 7) x *= 8.0f;
    if (i % 97 == 3) x = 0.0f;
    v[i] = x;
  }
  return v;
}

const GgmlType k_weight_types[] = {GgmlType::F32,    GgmlType::F16,  GgmlType::BF16, GgmlType::Q8_0,   GgmlType::Q4_0,
                                   GgmlType::Q4_1,   GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::IQ4_NL, GgmlType::MXFP4,
                                   GgmlType::Q2_K,   GgmlType::Q3_K, GgmlType::Q4_K, GgmlType::Q5_K,   GgmlType::Q6_K,
                                   GgmlType::IQ4_XS, GgmlType::Q8_K};

constexpr int64_t k_n = 512;  // two K-quant super-blocks
constexpr int k_rows = 8;     // weight rows
constexpr int k_cols = 3;     // activation rows

// The hash of everything one table computes for weight type t.
uint64_t type_hash(const KernelTable& kt, GgmlType t, ThreadPool* pool) {
  Hash h;
  const size_t w_row = type_row_bytes(t, k_n);
  std::vector<uint8_t> wq(w_row * k_rows);
  for (int r = 0; r < k_rows; ++r) {
    const auto w = int_data(1000 + 17 * static_cast<uint64_t>(t) + r, k_n, r % 3 == 2 ? 1.0f / 64.0f : 1.0f);
    EXPECT_TRUE(quant::quantize_row_ref(t, w.data(), wq.data() + r * w_row, k_n)) << type_name(t);
  }
  h.add(wq.data(), wq.size());

  const GgmlType at = quant::vec_dot_type(t);
  const TypeKernels& ak = kt[at];
  const TypeKernels& wk = kt[t];
  EXPECT_NE(ak.from_float, nullptr) << type_name(at);
  EXPECT_NE(wk.vec_dot, nullptr) << type_name(t);
  EXPECT_NE(wk.to_float, nullptr) << type_name(t);
  if (ak.from_float == nullptr || wk.vec_dot == nullptr || wk.to_float == nullptr) return 0;
  const size_t x_row = type_row_bytes(at, k_n);
  std::vector<float> xf(static_cast<size_t>(k_cols * k_n));
  std::vector<uint8_t> xq(x_row * k_cols);
  for (int c = 0; c < k_cols; ++c) {
    const auto x = int_data(5000 + 31 * static_cast<uint64_t>(t) + c, k_n, c == 1 ? 4.0f : 1.0f);
    std::memcpy(xf.data() + c * k_n, x.data(), k_n * sizeof(float));
    ak.from_float(x.data(), xq.data() + c * x_row, k_n);
  }
  h.add(xq.data(), xq.size());

  std::vector<float> dots(static_cast<size_t>(k_rows * k_cols));
  for (int c = 0; c < k_cols; ++c) {
    for (int r = 0; r < k_rows; ++r)
      dots[c * k_rows + r] = wk.vec_dot(k_n, wq.data() + r * w_row, xq.data() + c * x_row);
  }
  h.add(dots);

  std::vector<float> back(static_cast<size_t>(k_rows * k_n));
  for (int r = 0; r < k_rows; ++r) wk.to_float(wq.data() + r * w_row, back.data() + r * k_n, k_n);
  h.add(back);

  // matmul_q goes through the current table (kernels()), tiles and the pool; it must give the
  // same bits as the loop above — checked here rather than hashed, so the hash stays per table.
  if (&kt == &kernels()) {
    TensorView v;
    v.type = t;
    v.n_dims = 2;
    v.ne[0] = k_n;
    v.ne[1] = k_rows;
    v.set_contiguous_strides();
    v.data = wq.data();
    QuantizedRows qr;
    quantize_rows(at, xf.data(), k_cols, k_n, &qr, pool);
    std::vector<float> y(static_cast<size_t>(k_rows * k_cols));
    matmul_q(v, qr, y.data(), k_rows, pool);
    EXPECT_EQ(std::memcmp(y.data(), dots.data(), y.size() * sizeof(float)), 0) << type_name(t) << ": matmul_q";
  }
  return h.h;
}

// The ops a worker (expert FFN activations) and a backbone (norm, softmax, RoPE) run on f32 rows.
uint64_t op_hash(const std::string& op) {
  const int64_t n = 200;  // 12 groups of 16 and a tail of 8 (softmax's two paths)
  const auto g = int_data(77, n, 2.0f);
  const auto u = int_data(78, n, 1.0f);
  std::vector<float> y(n);
  Hash h;
  if (op == "swiglu") {
    swiglu(g.data(), u.data(), y.data(), n);
  } else if (op == "swiglu_limited") {
    swiglu_limited(g.data(), u.data(), y.data(), n, 3.5f);
  } else if (op == "swiglu_oai") {
    swiglu_oai(g.data(), u.data(), y.data(), n);
  } else if (op == "silu") {
    for (int64_t i = 0; i < n; ++i) y[i] = silu(g[i]);
  } else if (op == "sigmoid") {
    for (int64_t i = 0; i < n; ++i) y[i] = sigmoid(g[i]);
  } else if (op == "gelu") {
    for (int64_t i = 0; i < n; ++i) y[i] = gelu(g[i]);
  } else if (op == "rms_norm") {
    rms_norm(g.data(), u.data(), y.data(), n, 1e-6f);
  } else if (op == "softmax") {
    y = g;
    softmax(y.data(), n);
  } else if (op == "rope") {
    y = g;
    RopeParams p;
    p.mode = RopeMode::kNeox;
    p.n_rot = 40;
    p.freq_base = 1000000.0f;
    rope(y.data(), 4, 50, 50, 1234, p);
  } else {
    ADD_FAILURE() << "unknown op " << op;
  }
  h.add(y);
  return h.h;
}

struct Golden {
  const char* name;
  uint64_t hash;
};

// Recorded on x86-64 (scalar and AVX2 tables agree), GCC 12, Debian 12 glibc 2.36.
const Golden k_golden_types[] = {
    {"F32", 0x95747998bc3e0612ull},    {"F16", 0xe9eee1c77d7879acull},  {"BF16", 0x680a49c5b06568e1ull},
    {"Q8_0", 0x99b3dda4e0b1f22bull},   {"Q4_0", 0xff93b98b0401e1c0ull}, {"Q4_1", 0xf329452474a3c5d8ull},
    {"Q5_0", 0x3a88cfabfb09271full},   {"Q5_1", 0x148d7e52cc5a55c6ull}, {"IQ4_NL", 0x1944a510131e53e7ull},
    {"MXFP4", 0x253e9471810e9273ull},  {"Q2_K", 0x7ee25c2cfb7c2482ull}, {"Q3_K", 0x66a1ddfe2a71effdull},
    {"Q4_K", 0x262f02b2c02d6fbaull},   {"Q5_K", 0xcfaea5041eec14b7ull}, {"Q6_K", 0xb52428ccd93a24d9ull},
    {"IQ4_XS", 0xb5f08f968442a775ull}, {"Q8_K", 0x7a31be65cc30a075ull},
};
const Golden k_golden_ops[] = {
    {"swiglu", 0xeff87791bc45db69ull},     {"swiglu_limited", 0xac43ee3d297d7f90ull},
    {"swiglu_oai", 0x5ba4b27b4adbf181ull}, {"silu", 0x95b67a26c3d30c67ull},
    {"sigmoid", 0x51ed831317f639a3ull},    {"gelu", 0x5137cff1af8122d6ull},
    {"rms_norm", 0x81cbc72cae7ca49dull},   {"softmax", 0xf57efae6de63b8d2ull},
    {"rope", 0x8b64f0d5967db305ull},
};

bool print_mode() {
  const char* e = std::getenv("MOESH_GOLDEN_PRINT");
  return e != nullptr && std::strcmp(e, "0") != 0;
}

uint64_t golden(const Golden* table, size_t n, const std::string& name, bool* found) {
  for (size_t i = 0; i < n; ++i) {
    if (name == table[i].name) {
      *found = true;
      return table[i].hash;
    }
  }
  *found = false;
  return 0;
}

TEST(KernelsGolden, InputsAreExactAndNotDegenerate) {
  const auto v = int_data(1, 4096, 1.0f);
  int zeros = 0, big = 0;
  for (float x : v) {
    zeros += x == 0.0f;
    big += std::fabs(x) > 2.0f;
    // Exact: a multiple of 2^-12 below 2^17.
    EXPECT_EQ(x * 4096.0f, std::trunc(x * 4096.0f));
  }
  EXPECT_LT(zeros, 100);
  EXPECT_GT(big, 20);
}

TEST(KernelsGolden, EveryTableMatchesTheRecordedHashes) {
  ThreadPool pool(2);
  const bool print = print_mode();
  int checked_tables = 0;
  for (int i = 0; i < static_cast<int>(Isa::kCOUNT); ++i) {
    const KernelTable* kt = kernels_for(static_cast<Isa>(i));
    if (kt == nullptr) continue;
    ++checked_tables;
    SCOPED_TRACE(isa_name(static_cast<Isa>(i)));
    for (GgmlType t : k_weight_types) {
      const uint64_t got = type_hash(*kt, t, &pool);
      if (print) {
        std::printf("    {\"%s\", 0x%016llxull},  // %s\n", type_name(t), static_cast<unsigned long long>(got),
                    isa_name(static_cast<Isa>(i)));
        std::fflush(stdout);
        continue;
      }
      bool found = false;
      const uint64_t want = golden(k_golden_types, std::size(k_golden_types), type_name(t), &found);
      ASSERT_TRUE(found) << type_name(t) << " has no recorded hash";
      EXPECT_EQ(got, want) << type_name(t) << " on " << isa_name(static_cast<Isa>(i))
                           << " differs from the x86-64 recording";
    }
  }
  EXPECT_GE(checked_tables, 1);
}

TEST(KernelsGolden, OpsMatchTheRecordedHashes) {
  const bool print = print_mode();
  for (const char* op :
       {"swiglu", "swiglu_limited", "swiglu_oai", "silu", "sigmoid", "gelu", "rms_norm", "softmax", "rope"}) {
    const uint64_t got = op_hash(op);
    if (print) {
      std::printf("    {\"%s\", 0x%016llxull},\n", op, static_cast<unsigned long long>(got));
      continue;
    }
    bool found = false;
    const uint64_t want = golden(k_golden_ops, std::size(k_golden_ops), op, &found);
    ASSERT_TRUE(found) << op << " has no recorded hash";
    EXPECT_EQ(got, want) << op << " differs from the x86-64 recording";
  }
}

}  // namespace
}  // namespace moesh
