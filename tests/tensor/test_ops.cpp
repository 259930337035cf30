// Ops against plain double-precision references written here, the thread pool's chunking, and
// matmul against (a) a double dot of dequantized weights and (b) the scalar kernel table, bit
// for bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstring>
#include <numbers>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "moesh/tensor/fp16.h"
#include "moesh/tensor/kernels.h"
#include "moesh/tensor/ops.h"
#include "moesh/tensor/quant.h"
#include "moesh/tensor/threadpool.h"

namespace moesh {
namespace {

std::vector<float> randn(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// Guards against tests that pass because the data is constant or zero.
// Quantized weights have few distinct values by nature (MXFP4: 16 codes x a few scales), so
// they pass a small min_distinct.
void expect_not_degenerate(const std::vector<float>& v, size_t min_distinct = 0) {
  std::set<float> distinct(v.begin(), v.end());
  if (min_distinct == 0) min_distinct = v.size() / 2;
  ASSERT_GT(distinct.size(), min_distinct) << "test data has too few distinct values";
  double ss = 0;
  for (float x : v) ss += static_cast<double>(x) * x;
  ASSERT_GT(ss, 0.0);
}

// ---------------------------------------------------------------- thread pool

TEST(ThreadPool, CoversEveryIndexExactlyOnceInContiguousChunks) {
  for (int nt : {1, 2, 3, 4, 7}) {
    ThreadPool pool(nt);
    EXPECT_EQ(pool.n_threads(), nt);
    for (int64_t n : {1, 2, 3, 5, 16, 17, 100, 1001}) {
      for (int64_t grain : {1, 4, 64}) {
        std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
        std::mutex mu;
        std::vector<std::pair<int64_t, int64_t>> chunks;
        std::set<int> tids;
        pool.parallel_for(
            n,
            [&](int64_t b, int64_t e, int tid) {
              for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i)]++;
              std::lock_guard<std::mutex> lock(mu);
              chunks.emplace_back(b, e);
              tids.insert(tid);
            },
            grain);
        for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[static_cast<size_t>(i)].load(), 1) << i;
        // One chunk per participating thread, distinct thread ids, near-equal lengths, and no
        // chunk below the grain unless the whole range is.
        EXPECT_EQ(chunks.size(), tids.size());
        const int64_t expect_chunks = std::min<int64_t>(nt, std::max<int64_t>(1, n / grain));
        EXPECT_EQ(static_cast<int64_t>(chunks.size()), expect_chunks) << n << " " << grain;
        int64_t mn = n, mx = 0;
        for (auto [b, e] : chunks) {
          mn = std::min(mn, e - b);
          mx = std::max(mx, e - b);
          if (n >= grain) {
            EXPECT_GE(e - b, grain);
          }
        }
        EXPECT_LE(mx - mn, 1);
        for (int t : tids) EXPECT_TRUE(t >= 0 && t < nt);
      }
    }
  }
}

// The dynamic schedule: every index once, pieces no longer than asked and aligned to it,
// thread ids in range; a thread that stalls does not hold its share (the other takes the rest).
TEST(ThreadPool, DynamicPiecesCoverEveryIndexOnceAndFlowToFreeThreads) {
  for (int nt : {1, 2, 3, 7}) {
    ThreadPool pool(nt);
    for (int64_t n : {1, 2, 5, 16, 17, 1001}) {
      for (int64_t piece : {1, 4, 64}) {
        std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
        std::atomic<bool> bad{false};
        pool.parallel_for_dynamic(
            n,
            [&](int64_t b, int64_t e, int tid) {
              if (e <= b || e - b > piece || b % piece != 0 || tid < 0 || tid >= nt) bad = true;
              for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i)]++;
            },
            piece);
        EXPECT_FALSE(bad.load()) << nt << " " << n << " " << piece;
        for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[static_cast<size_t>(i)].load(), 1) << i;
      }
    }
  }
  // Thread 0 (the caller) stalls in its first piece until the other thread has done at least
  // 90 of the 100: a contiguous split would have left 50 for the caller.
  ThreadPool pool(2);
  std::atomic<int> done_by_other{0};
  std::atomic<int> done_by_caller{0};
  const std::thread::id caller = std::this_thread::get_id();
  pool.parallel_for_dynamic(100, [&](int64_t b, int64_t e, int) {
    if (std::this_thread::get_id() == caller) {
      if (done_by_caller.fetch_add(1) == 0) {
        const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
        while (done_by_other.load() < 90 && std::chrono::steady_clock::now() < until) std::this_thread::yield();
      }
    } else {
      done_by_other += static_cast<int>(e - b);
    }
  });
  EXPECT_GE(done_by_other.load(), 90);
}

TEST(ThreadPool, NestedCallsRunSeriallyOnTheCaller) {
  ThreadPool pool(3);
  std::vector<std::atomic<int>> hits(300);
  pool.parallel_for(3, [&](int64_t b, int64_t e, int tid) {
    for (int64_t o = b; o < e; ++o) {
      const std::thread::id outer = std::this_thread::get_id();
      pool.parallel_for(100, [&](int64_t ib, int64_t ie, int itid) {
        EXPECT_EQ(std::this_thread::get_id(), outer);
        EXPECT_EQ(itid, tid);
        EXPECT_EQ(ib, 0);
        EXPECT_EQ(ie, 100);
        for (int64_t i = ib; i < ie; ++i) hits[static_cast<size_t>(o * 100 + i)]++;
      });
    }
  });
  for (auto& h : hits) EXPECT_EQ(h.load(), 1);
}

TEST(ThreadPool, ManyBackToBackJobsAndTwoOutsideCallers) {
  ThreadPool pool(2);
  std::atomic<int64_t> total{0};
  auto work = [&] {
    for (int rep = 0; rep < 2000; ++rep) {
      pool.parallel_for(10, [&](int64_t b, int64_t e, int) { total += e - b; });
    }
  };
  std::thread other(work);
  work();
  other.join();
  EXPECT_EQ(total.load(), 2 * 2000 * 10);
}

// ---------------------------------------------------------------- per-row ops

TEST(Ops, RmsNormMatchesDouble) {
  const int64_t n = 2048;
  auto x = randn(n, 1, 3.0f);
  auto w = randn(n, 2);
  expect_not_degenerate(x);
  double ss = 0;
  for (float v : x) ss += static_cast<double>(v) * v;
  const double inv = 1.0 / std::sqrt(ss / n + 1e-6);
  std::vector<float> y(n), yw(n);
  rms_norm(x.data(), nullptr, y.data(), n, 1e-6f);
  rms_norm(x.data(), w.data(), yw.data(), n, 1e-6f);
  for (int64_t i = 0; i < n; ++i) {
    EXPECT_NEAR(y[i], x[i] * inv, 2e-6 * std::fabs(x[i] * inv) + 1e-30);
    EXPECT_NEAR(yw[i], x[i] * inv * w[i], 3e-6 * std::fabs(x[i] * inv * w[i]) + 1e-30);
  }
  // In place gives the same bits.
  std::vector<float> z = x;
  rms_norm(z.data(), w.data(), z.data(), n, 1e-6f);
  EXPECT_EQ(0, std::memcmp(z.data(), yw.data(), n * sizeof(float)));
  // eps matters for tiny inputs: all-zero row -> zeros, not NaN.
  std::vector<float> zero(16, 0.0f), out(16, 1.0f);
  rms_norm(zero.data(), nullptr, out.data(), 16, 1e-5f);
  for (float v : out) EXPECT_EQ(v, 0.0f);
}

TEST(Ops, SoftmaxMatchesDouble) {
  for (int64_t n : {1, 7, 128, 1000}) {
    auto x = randn(n, 3 + n, 4.0f);
    x[0] = 80.0f;  // large values must not overflow (max is subtracted)
    std::vector<double> ref(n);
    double mx = -1e300, sum = 0;
    for (float v : x) mx = std::max(mx, static_cast<double>(v));
    for (int64_t i = 0; i < n; ++i) sum += ref[i] = std::exp(x[i] - mx);
    softmax(x.data(), n);
    double s = 0;
    for (int64_t i = 0; i < n; ++i) {
      EXPECT_NEAR(x[i], ref[i] / sum, 1e-6 * (ref[i] / sum) + 1e-30) << i;
      s += x[i];
    }
    EXPECT_NEAR(s, 1.0, 1e-5);
  }
}

TEST(Ops, ActivationsMatchDouble) {
  auto g = randn(4096, 5, 4.0f);
  auto u = randn(4096, 6, 4.0f);
  expect_not_degenerate(g);
  std::vector<float> y(g.size()), yo(g.size());
  swiglu(g.data(), u.data(), y.data(), static_cast<int64_t>(g.size()));
  swiglu_oai(g.data(), u.data(), yo.data(), static_cast<int64_t>(g.size()), 1.702f, 7.0f);
  int clamped = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    const double gd = g[i], ud = u[i];
    const double sig = 1.0 / (1.0 + std::exp(-gd));
    EXPECT_NEAR(silu(g[i]), gd * sig, 1e-6 * std::fabs(gd * sig) + 1e-37);
    EXPECT_NEAR(sigmoid(g[i]), sig, 1e-6 * sig);
    const double gl = 0.5 * gd * (1 + std::tanh(std::sqrt(2 / std::numbers::pi) * gd * (1 + 0.044715 * gd * gd)));
    EXPECT_NEAR(gelu(g[i]), gl, 2e-6 * std::fabs(gl) + 1e-7);
    EXPECT_NEAR(y[i], gd * sig * ud, 2e-6 * std::fabs(gd * sig * ud) + 1e-37);
    const double a = std::min(gd, 7.0), b = std::clamp(ud, -7.0, 7.0);
    if (gd > 7.0 || std::fabs(ud) > 7.0) ++clamped;
    const double ro = a / (1 + std::exp(-1.702 * a)) * (b + 1);
    EXPECT_NEAR(yo[i], ro, 2e-6 * std::fabs(ro) + 1e-6);
  }
  EXPECT_GT(clamped, 10) << "swiglu_oai limit never exercised";
}

// step35's clamped SwiGLU: min(silu(g), L) * clamp(u, -L, L), the gate clamped after SiLU and from
// above only; where nothing is clamped it is swiglu's bits.
TEST(Ops, SwigluLimitedClampsTheSiluAndTheUp) {
  auto g = randn(4096, 7, 4.0f);
  auto u = randn(4096, 8, 4.0f);
  std::vector<float> y(g.size()), yl(g.size());
  const float L = 1.5f;
  swiglu(g.data(), u.data(), y.data(), static_cast<int64_t>(g.size()));
  swiglu_limited(g.data(), u.data(), yl.data(), static_cast<int64_t>(g.size()), L);
  int n_gate = 0, n_up = 0, n_neg_gate = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    const float s = silu_v(g[i]);
    n_gate += s > L, n_up += std::fabs(u[i]) > L, n_neg_gate += s < -L;
    EXPECT_EQ(yl[i], std::min(s, L) * std::clamp(u[i], -L, L)) << i;
    if (s <= L && std::fabs(u[i]) <= L) EXPECT_EQ(yl[i], y[i]) << i;
  }
  EXPECT_GT(n_gate, 100);
  EXPECT_GT(n_up, 100);
  EXPECT_EQ(n_neg_gate, 0);  // silu >= -0.279: the lower gate bound never binds
}

// ---------------------------------------------------------------- RoPE

// Reference for one head. The angle follows the spec's f32 steps (theta_0 = pos, repeated f32
// multiplication by powf(base, -2/n_rot), f32 division by the freq factor, f32 YaRN ramp and mix), since
// those roundings are part of the definition and grow with pos; the correction dims,
// mscale, cos/sin and the rotation are computed independently in double.
std::vector<double> rope_ref(const std::vector<float>& x, int64_t pos, const RopeParams& p) {
  std::vector<double> y(x.begin(), x.end());
  const int np = p.n_rot / 2;
  const float ts = std::pow(p.freq_base, -2.0f / p.n_rot);
  double lo = 0, hi = 0, msc = p.attn_factor;
  if (p.ext_factor != 0) {
    auto dim = [&](double b) {
      return p.n_rot * std::log(p.n_ctx_orig / (2 * std::numbers::pi * b)) / (2 * std::log(double(p.freq_base)));
    };
    lo = std::max(0.0, std::floor(dim(p.beta_fast)));
    hi = std::min(double(p.n_rot - 1), std::ceil(dim(p.beta_slow)));
    msc *= 1 + 0.1 * std::log(1.0 / p.freq_scale);
  }
  float theta = static_cast<float>(pos);
  for (int i = 0; i < np; ++i) {
    const float te = p.freq_factors ? theta / p.freq_factors[i] : theta;
    const float ti = p.freq_scale * te;
    float t = ti;
    if (p.ext_factor != 0) {
      const float r = (float(i) - float(lo)) / std::max(0.001f, float(hi - lo));
      const float mix = (1.0f - std::clamp(r, 0.0f, 1.0f)) * p.ext_factor;
      t = std::fmaf(ti, 1.0f - mix, te * mix);  // fused, as ggml's compiled rope_yarn (ops.cpp rope)
    }
    const int i0 = p.mode == RopeMode::kNorm ? 2 * i : i;
    const int i1 = p.mode == RopeMode::kNorm ? 2 * i + 1 : i + np;
    const double c = std::cos(double(t)) * msc, s = std::sin(double(t)) * msc;
    y[i0] = x[i0] * c - x[i1] * s;
    y[i1] = x[i0] * s + x[i1] * c;
    theta *= ts;
  }
  return y;
}

void expect_rope_matches(const RopeParams& p, int head_dim, int64_t pos, uint32_t seed, double tol) {
  const int n_heads = 3;
  const size_t stride = head_dim + 5;  // padded heads: the gap must stay untouched
  auto x = randn(n_heads * stride, seed);
  auto y = x;
  rope(y.data(), n_heads, head_dim, stride, pos, p);
  for (int h = 0; h < n_heads; ++h) {
    std::vector<float> head(x.begin() + h * stride, x.begin() + h * stride + head_dim);
    auto ref = rope_ref(head, pos, p);
    for (int d = 0; d < head_dim; ++d) {
      EXPECT_NEAR(y[h * stride + d], ref[d], tol) << "head " << h << " dim " << d << " pos " << pos;
      if (d >= p.n_rot) {
        EXPECT_EQ(y[h * stride + d], x[h * stride + d]);  // pass-through
      }
    }
    for (size_t d = head_dim; d < stride; ++d) EXPECT_EQ(y[h * stride + d], x[h * stride + d]);
  }
}

TEST(Rope, PositionZeroIsIdentity) {
  for (RopeMode mode : {RopeMode::kNorm, RopeMode::kNeox}) {
    RopeParams p;
    p.mode = mode;
    p.n_rot = 64;
    auto x = randn(128, 7);
    auto y = x;
    rope(y.data(), 2, 64, 64, 0, p);
    EXPECT_EQ(0, std::memcmp(x.data(), y.data(), x.size() * sizeof(float)));
  }
}

TEST(Rope, NormAndNeoxMatchReferenceAndPreservePairNorms) {
  for (RopeMode mode : {RopeMode::kNorm, RopeMode::kNeox}) {
    for (int64_t pos : {1, 17, 1000, 30000}) {
      RopeParams p;
      p.mode = mode;
      p.n_rot = 64;
      p.freq_base = 10000.0f;
      expect_rope_matches(p, 64, pos, 11, 2e-6);
      p.n_rot = 32;  // partial rotation: dims 32..63 pass through
      p.freq_base = 1e6f;
      expect_rope_matches(p, 64, pos, 12, 2e-6);
    }
    // Rotation preserves the norm of each rotated pair.
    RopeParams p;
    p.mode = mode;
    p.n_rot = 128;
    auto x = randn(128, 13);
    auto y = x;
    rope(y.data(), 1, 128, 128, 4321, p);
    int moved = 0;
    for (int i = 0; i < 64; ++i) {
      const int a = mode == RopeMode::kNorm ? 2 * i : i, b = mode == RopeMode::kNorm ? 2 * i + 1 : i + 64;
      EXPECT_NEAR(std::hypot(y[a], y[b]), std::hypot(x[a], x[b]), 1e-5);
      moved += y[a] != x[a];
    }
    EXPECT_GT(moved, 60);
  }
}

TEST(Rope, HandCheckedAngles) {
  // pos 1, n_rot 4, base 100: theta = {1, 0.1}. NORM pairs (0,1),(2,3); NEOX pairs (0,2),(1,3).
  RopeParams p;
  p.n_rot = 4;
  p.freq_base = 100.0f;
  float x[4] = {1, 0, 1, 0};
  rope(x, 1, 4, 4, 1, p);
  EXPECT_NEAR(x[0], std::cos(1.0), 1e-6);
  EXPECT_NEAR(x[1], std::sin(1.0), 1e-6);
  EXPECT_NEAR(x[2], std::cos(0.1), 1e-6);
  EXPECT_NEAR(x[3], std::sin(0.1), 1e-6);
  p.mode = RopeMode::kNeox;
  float y[4] = {1, 1, 0, 0};
  rope(y, 1, 4, 4, 1, p);
  EXPECT_NEAR(y[0], std::cos(1.0), 1e-6);
  EXPECT_NEAR(y[2], std::sin(1.0), 1e-6);
  EXPECT_NEAR(y[1], std::cos(0.1), 1e-6);
  EXPECT_NEAR(y[3], std::sin(0.1), 1e-6);
}

TEST(Rope, FreqFactorsDivideTheta) {
  std::vector<float> ff(32);
  for (int i = 0; i < 32; ++i) ff[i] = 1.0f + 0.25f * i;
  RopeParams p;
  p.mode = RopeMode::kNeox;
  p.n_rot = 64;
  p.freq_factors = ff.data();
  expect_rope_matches(p, 64, 777, 21, 2e-6);
}

TEST(Rope, YarnExtFactorZeroIsLinearScaling) {
  // With ext_factor 0 the angle is freq_scale * theta and the magnitude attn_factor.
  RopeParams p;
  p.mode = RopeMode::kNeox;
  p.n_rot = 64;
  p.freq_scale = 0.25f;
  p.attn_factor = 1.0f;
  p.n_ctx_orig = 4096;
  expect_rope_matches(p, 64, 12345, 31, 2e-6);
  // Compared directly: pos 400 at scale 1/4 has the first pair's angle of pos 100 at scale 1.
  auto x = randn(64, 32);
  auto a = x, b = x;
  rope(a.data(), 1, 64, 64, 400, p);
  RopeParams q = p;
  q.freq_scale = 1.0f;
  rope(b.data(), 1, 64, 64, 100, q);
  EXPECT_FLOAT_EQ(a[0], b[0]);
  EXPECT_FLOAT_EQ(a[32], b[32]);
}

TEST(Rope, YarnRampAndMscale) {
  RopeParams p;
  p.mode = RopeMode::kNorm;
  p.n_rot = 128;
  p.freq_base = 10000.0f;
  p.freq_scale = 0.25f;
  p.ext_factor = 1.0f;
  p.attn_factor = 1.0f;
  p.n_ctx_orig = 4096;
  expect_rope_matches(p, 128, 9999, 41, 5e-6);
  // Hand check: D(32) = 128 ln(4096/(64 pi)) / (2 ln 1e4) = 20.94 -> lo 20; D(1) = 45.03 -> hi 46.
  // Pair 0 is pure extrapolation (angle pos), the last pair pure interpolation (angle s*theta),
  // both with magnitude mscale = 1 + 0.1 ln 4.
  const double msc = 1 + 0.1 * std::log(4.0);
  std::vector<float> x(128, 0.0f);
  for (int i = 0; i < 64; ++i) x[2 * i] = 1.0f;
  rope(x.data(), 1, 128, 128, 3, p);
  EXPECT_NEAR(x[0], msc * std::cos(3.0), 1e-5);
  EXPECT_NEAR(x[1], msc * std::sin(3.0), 1e-5);
  const double theta63 = 3.0 * std::pow(10000.0, -2.0 * 63 / 128);
  EXPECT_NEAR(x[126], msc * std::cos(0.25 * theta63), 1e-5);
  EXPECT_NEAR(x[127], msc * std::sin(0.25 * theta63), 1e-5);
  // attn_factor scales both.
  p.attn_factor = 0.5f;
  expect_rope_matches(p, 128, 500, 42, 5e-6);
}

// ---------------------------------------------------------------- top-k

TEST(Ops, TopKDescendingTiesByLowerIndex) {
  const float v[] = {0.5f, 2.0f, -1.0f, 2.0f, 0.5f, NAN, 3.0f, 0.5f};
  int32_t idx[6];
  top_k(v, 8, 6, idx);
  const int32_t expect[] = {6, 1, 3, 0, 4, 7};
  for (int i = 0; i < 6; ++i) EXPECT_EQ(idx[i], expect[i]) << i;
  // Random: compare with a full stable sort.
  auto r = randn(1000, 51);
  for (int i = 0; i < 1000; i += 10) r[i] = 0.25f;  // inject ties
  std::vector<int32_t> all(1000);
  for (int i = 0; i < 1000; ++i) all[i] = i;
  std::stable_sort(all.begin(), all.end(), [&](int a, int b) { return r[a] > r[b]; });
  std::vector<int32_t> got(40);
  top_k(r.data(), 1000, 40, got.data());
  for (int i = 0; i < 40; ++i) EXPECT_EQ(got[i], all[i]);
}

// ---------------------------------------------------------------- matmul

struct Weights {
  GgmlType type;
  int64_t k, m;
  std::vector<uint8_t> bytes;
  std::vector<float> deq;  // dequantized, [m][k]
  TensorView view() const {
    TensorView v;
    v.type = type;
    v.n_dims = 2;
    v.ne[0] = k;
    v.ne[1] = m;
    v.set_contiguous_strides();
    v.data = bytes.data();
    return v;
  }
};

Weights make_weights(GgmlType t, int64_t k, int64_t m, uint32_t seed) {
  Weights w{t, k, m, {}, {}};
  auto f = randn(static_cast<size_t>(k * m), seed, 0.05f);
  const size_t rb = type_row_bytes(t, k);
  w.bytes.resize(rb * m);
  w.deq.resize(static_cast<size_t>(k * m));
  for (int64_t r = 0; r < m; ++r) {
    EXPECT_TRUE(quant::quantize_row_ref(t, f.data() + r * k, w.bytes.data() + r * rb, k));
    EXPECT_TRUE(quant::dequantize_row_ref(t, w.bytes.data() + r * rb, w.deq.data() + r * k, k));
  }
  return w;
}

// Dequantizes one activation row in vec_dot_type (decoded by hand from the block layout).
std::vector<double> decode_act(GgmlType vt, const uint8_t* p, int64_t k) {
  std::vector<double> out(k);
  if (vt == GgmlType::F32) {
    for (int64_t i = 0; i < k; ++i) out[i] = reinterpret_cast<const float*>(p)[i];
  } else if (vt == GgmlType::F16) {
    for (int64_t i = 0; i < k; ++i) out[i] = fp16_to_fp32(reinterpret_cast<const uint16_t*>(p)[i]);
  } else if (vt == GgmlType::Q8_0) {
    auto* b = reinterpret_cast<const quant::BlockQ8_0*>(p);
    for (int64_t i = 0; i < k; ++i) out[i] = double(fp16_to_fp32(b[i / 32].d)) * b[i / 32].qs[i % 32];
  } else if (vt == GgmlType::Q8_K) {
    auto* b = reinterpret_cast<const quant::BlockQ8_K*>(p);
    for (int64_t i = 0; i < k; ++i) out[i] = double(b[i / 256].d) * b[i / 256].qs[i % 256];
  } else {
    ADD_FAILURE() << "unexpected activation type";
  }
  return out;
}

class MatmulTypes : public ::testing::TestWithParam<GgmlType> {};

TEST_P(MatmulTypes, MatchesDoubleDotOfDequantizedWeights) {
  const GgmlType t = GetParam();
  const GgmlType vt = quant::vec_dot_type(t);
  const int64_t k = 512, m = 37, n = 9;
  Weights w = make_weights(t, k, m, 100 + static_cast<uint32_t>(t));
  expect_not_degenerate(w.deq, 12);
  auto x = randn(static_cast<size_t>(n * k), 200);
  ThreadPool pool(2);
  const size_t ldy = m + 3;
  std::vector<float> y(n * ldy, -7.0f);
  matmul(w.view(), x.data(), n, y.data(), ldy, &pool);
  QuantizedRows xq;
  quantize_rows(vt, x.data(), n, k, &xq, nullptr);
  double worst_exact = 0, worst_orig = 0;
  for (int64_t c = 0; c < n; ++c) {
    auto xd = decode_act(vt, xq.row(c), k);
    for (int64_t r = 0; r < m; ++r) {
      double dq = 0, d0 = 0, mag = 0, qerr = 0;
      for (int64_t i = 0; i < k; ++i) {
        const double wv = w.deq[r * k + i];
        dq += wv * xd[i];
        d0 += wv * x[c * k + i];
        mag += std::fabs(wv * xd[i]);
        qerr += std::fabs(wv) * std::fabs(xd[i] - x[c * k + i]);
      }
      const double got = y[c * ldy + r];
      // (a) vs the dequantized activations: only f32 accumulation error, bounded by
      //     ~K * 2^-24 * sum|w x| (we allow 1e-5 relative to the magnitude sum).
      EXPECT_NEAR(got, dq, 1e-5 * mag + 1e-6) << type_name(t) << " r" << r << " c" << c;
      // (b) vs the original f32 activations: additionally the activation rounding error,
      //     at most sum |w_i| |xq_i - x_i|.
      EXPECT_NEAR(got, d0, qerr * 1.0001 + 1e-5 * mag + 1e-6);
      worst_exact = std::max(worst_exact, std::fabs(got - dq) / (mag + 1e-30));
      worst_orig = std::max(worst_orig, std::fabs(got - d0) / (mag + 1e-30));
    }
    // ldy padding untouched.
    for (size_t r = m; r < ldy; ++r) EXPECT_EQ(y[c * ldy + r], -7.0f);
  }
  RecordProperty("worst_rel_vs_dequant_acts", std::to_string(worst_exact));
  RecordProperty("worst_rel_vs_f32_acts", std::to_string(worst_orig));
}

TEST_P(MatmulTypes, BitEqualToScalarTable) {
  const GgmlType t = GetParam();
  const GgmlType vt = quant::vec_dot_type(t);
  const KernelTable* scalar = kernels_for(Isa::kScalar);
  ASSERT_NE(scalar, nullptr);
  const int64_t k = 768, m = 45;
  Weights w = make_weights(t, k, m, 300 + static_cast<uint32_t>(t));
  ThreadPool pool(2);
  for (int64_t n : {1, 5, 70}) {
    auto x = randn(static_cast<size_t>(n * k), 400 + n);
    std::vector<float> y(n * m);
    matmul(w.view(), x.data(), n, y.data(), &pool);
    const size_t arb = type_row_bytes(vt, k);
    std::vector<uint8_t> xs(arb);
    size_t distinct = 0;
    std::set<float> seen;
    for (int64_t c = 0; c < n; ++c) {
      (*scalar)[vt].from_float(x.data() + c * k, xs.data(), k);
      for (int64_t r = 0; r < m; ++r) {
        const float ref = (*scalar)[t].vec_dot(k, w.bytes.data() + r * w.view().nb[1], xs.data());
        ASSERT_EQ(std::bit_cast<uint32_t>(y[c * m + r]), std::bit_cast<uint32_t>(ref))
            << type_name(t) << " isa " << isa_name(kernels().isa) << " n " << n << " r " << r << " c " << c << ": "
            << y[c * m + r] << " vs " << ref;
        seen.insert(ref);
      }
    }
    distinct = seen.size();
    EXPECT_GT(distinct, static_cast<size_t>(n * m / 2));
  }
}

INSTANTIATE_TEST_SUITE_P(Types, MatmulTypes,
                         ::testing::Values(GgmlType::F32, GgmlType::F16, GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q6_K,
                                           GgmlType::MXFP4),
                         [](const auto& info) { return std::string(type_name(info.param)); });

TEST(Matmul, GetRowMatchesDequantize) {
  for (GgmlType t : {GgmlType::F32, GgmlType::F16, GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q6_K}) {
    Weights w = make_weights(t, 256, 5, 500);
    std::vector<float> row(256);
    for (int64_t r = 0; r < 5; ++r) {
      get_row_f32(w.view(), r, row.data());
      EXPECT_EQ(0, std::memcmp(row.data(), w.deq.data() + r * 256, 256 * sizeof(float))) << type_name(t);
    }
  }
}

// ggml's vector exp (through silu_v and softmax): within ~2 ulp of libm, not always equal, and
// the softmax keeps its ggml split (groups of 16 vector exp, tail expf, padding -inf -> 0).
TEST(Ops, VectorExpSiluAndSoftmaxGroups) {
  std::mt19937 rng(77);
  std::uniform_real_distribution<float> dist(-12.0f, 12.0f);
  int differ = 0;
  for (int i = 0; i < 4000; ++i) {
    const float x = dist(rng);
    const float a = silu(x), b = silu_v(x);
    EXPECT_NEAR(b, a, 4e-7f * std::fabs(a) + 1e-30f) << x;
    differ += a != b;
  }
  EXPECT_GT(differ, 0);  // the approximation is really in use
  EXPECT_EQ(silu_v(0.0f), 0.0f);
  EXPECT_EQ(silu_v(-200.0f), -0.0f);
  // 20 values + 12 padding cells: the padding gets exactly 0, the rest sums to ~1.
  std::vector<float> row(32, -INFINITY);
  for (int i = 0; i < 20; ++i) row[i] = dist(rng);
  std::vector<float> plain(row.begin(), row.begin() + 20);
  softmax(row.data(), 32);
  softmax(plain.data(), 20);  // 16 vector + 4 expf: a different split, values agree to ~ulps
  double sum = 0;
  for (int i = 0; i < 32; ++i) sum += row[i];
  EXPECT_NEAR(sum, 1.0, 1e-6);
  for (int i = 20; i < 32; ++i) EXPECT_EQ(row[i], 0.0f);
  for (int i = 0; i < 20; ++i) EXPECT_NEAR(row[i], plain[i], 1e-6f * plain[i] + 1e-12f);
  // Equal inputs: every group's exp(0) is exactly 1 -> exactly 1/n.
  std::vector<float> eq(48, 3.0f);
  softmax(eq.data(), 48);
  for (float v : eq) EXPECT_EQ(v, 1.0f / 48.0f);
}

// Golden bits from ggml itself (its CPU backend as of 2026-08, GCC 12 -O3, for x86 with AVX-512
// and with AVX2 + FMA + F16C), on inputs made of integers so every build sees the same floats.

// ggml_vec_dot_f32 as built for AVX-512 (the attention kernels' F32 dot on every ISA): 64 lanes,
// then the n % 64 leftovers as GCC compiles `sumf += x[i]*y[i]` — 8 rounded products at a time
// added in order, the last < 8 fused. n = 32 and 45 are all leftovers; 100 and 160 mix both.
TEST(Ops, F32DotFollowsGgmlAvx512Build) {
  float x[256], y[256];
  for (uint32_t i = 0; i < 256; ++i) {
    x[i] = static_cast<float>((i * 2654435761u >> 8) & 0xffffu) / 32768.0f - 1.0f;
    y[i] = static_cast<float>((i * 40503u + 12345u) & 0xffffu) / 16384.0f - 2.0f;
  }
  const std::pair<int64_t, uint32_t> golden[] = {{5, 0x3f03892fu},   {8, 0x3f1eb88au},   {13, 0x3f51436du},
                                                 {32, 0xbe91b6a3u},  {45, 0x40883ceau},  {64, 0x401afb85u},
                                                 {100, 0x40b40989u}, {160, 0x410b1b60u}, {199, 0x41543d2cu}};
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
    const KernelTable* kt = kernels_for(isa);
    if (kt == nullptr) continue;
    for (auto [n, bits] : golden) {
      float out = 0.0f;
      kt->attn.scores({.k = x, .q = y, .dk = n, .c1 = 1, .out = &out});
      EXPECT_EQ(std::bit_cast<uint32_t>(out), bits) << isa_name(isa) << " n=" << n << ": " << out;
    }
  }
}

// ggml_v_silu as built for AVX2 (kimi-k3's KDA convolutions): its exp differs from the AVX-512
// build's in the last bit for ~1 input in 8 (-50 and 2 here), and saturates the same way.
TEST(Ops, SiluAvx2FollowsGgmlAvx2Build) {
  const std::pair<float, uint32_t> golden[] = {
      {-200.0f, 0x80000000u}, {-100.0f, 0x80000000u}, {-90.0f, 0x80000000u}, {-88.5f, 0x82dd2ec3u},
      {-50.0f, 0x9e362a51u},  {-1.5f, 0xbe8c1a52u},   {-0.1f, 0xbd42918cu},  {0.0f, 0x00000000u},
      {0.3f, 0x3e307800u},    {2.0f, 0x3fe17becu},    {7.25f, 0x40e7d5dbu},  {40.0f, 0x42200000u},
      {87.0f, 0x42ae0000u},   {88.7f, 0x42b16666u},   {100.0f, 0x42c80000u}, {200.0f, 0x43480000u}};
  int differ_from_avx512 = 0;
  for (auto [x, bits] : golden) {
    EXPECT_EQ(std::bit_cast<uint32_t>(silu_v_avx2(x)), bits) << x;
    differ_from_avx512 += silu_v(x) != silu_v_avx2(x);
  }
  EXPECT_EQ(differ_from_avx512, 2);  // -50 and 2
}

}  // namespace
}  // namespace moesh
