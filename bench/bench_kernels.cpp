// Kernel benchmarks: quantized matvec/matmul at MoE expert shapes, streamed from DRAM, next to a
// read-bandwidth probe of the same machine so results read as a fraction of what memory gives.
//
//   kern/<type>/<gate|down>/K<k>xM<m>/b<batch>/t<threads>  one matmul_q per iteration; weights
//       cycle through copies of one matrix filling > 300 MB (like distinct experts), so every
//       iteration streams its weights from DRAM, not from the 32+ MB of cache. Activations are
//       quantized once outside the loop (MoE reuses them across experts). Counters: W_Bps =
//       weight bytes streamed per second, FLOPS = 2*K*M*batch per second.
//   mem/read_sum/t<threads>   sums a 1 GiB buffer of uint64 (best-case streaming read).
//   pool/dispatch/t2          one empty parallel_for (wake + join cost; MOESH_POOL_SPIN_US).
//   attn/<scores|kqv>/ctx<n>/t1  one KV group (8 query heads, dk = dv = 128) over n cells of a
//       layer cached as Qwen3-30B-A3B's is (4 KV heads: a cell's rows 1024 floats apart), the
//       kernel table's AttnScores / AttnKqv; Cells_ps = cells per second (x 8 heads).
//
// Before timing, every kern/* result is checked bit for bit against the scalar kernel table on
// a sample of rows (all tokens); a mismatch aborts the run. scripts/bench-kernels.sh runs a
// filtered set and prints a markdown table.
#include <benchmark/benchmark.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <bit>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "moesh/tensor/kernels.h"
#include "moesh/tensor/ops.h"
#include "moesh/tensor/quant.h"
#include "moesh/tensor/threadpool.h"
#include "moesh/util/huge_pages.h"

namespace moesh {
namespace {

constexpr size_t k_stream_bytes = 320ull << 20;  // weight pool per benchmark: > 300 MB
constexpr size_t k_mem_bytes = 1ull << 30;       // bandwidth probe buffer

ThreadPool& pool_of(int n) {
  static ThreadPool p1(1), p2(2);
  return n == 1 ? p1 : p2;
}

// ---------------------------------------------------------------- weights

// Copies of one quantized matrix back to back; rebuilt only when type or shape changes.
struct WeightPool {
  GgmlType type = GgmlType::F32;
  int64_t k = 0, m = 0;
  size_t mat_bytes = 0;
  int64_t n_copies = 0;
  std::vector<uint8_t> data;

  TensorView view(int64_t i) const {
    TensorView v;
    v.type = type;
    v.n_dims = 2;
    v.ne[0] = k;
    v.ne[1] = m;
    v.set_contiguous_strides();
    v.data = data.data() + static_cast<size_t>(i) * mat_bytes;
    return v;
  }
};

WeightPool& weight_pool(GgmlType t, int64_t k, int64_t m) {
  static WeightPool wp;
  if (wp.type == t && wp.k == k && wp.m == m && !wp.data.empty()) return wp;
  wp.type = t;
  wp.k = k;
  wp.m = m;
  wp.mat_bytes = type_row_bytes(t, k) * static_cast<size_t>(m);
  wp.n_copies = static_cast<int64_t>((k_stream_bytes + wp.mat_bytes - 1) / wp.mat_bytes);
  wp.data.assign(wp.mat_bytes * static_cast<size_t>(wp.n_copies), 0);
  std::mt19937 rng(static_cast<uint32_t>(k * 31 + m * 7 + static_cast<int>(t)));
  std::normal_distribution<float> nd(0.0f, 0.02f);
  std::vector<float> row(static_cast<size_t>(k));
  const size_t rb = type_row_bytes(t, k);
  // 64 distinct quantized rows, repeated down the matrix: set-up stays fast (the reference
  // quantizer is slow) and the bytes streamed are the same.
  const int64_t n_distinct = std::min<int64_t>(m, 64);
  for (int64_t r = 0; r < n_distinct; ++r) {
    for (auto& v : row) v = nd(rng);
    if (!quant::quantize_row_ref(t, row.data(), wp.data.data() + static_cast<size_t>(r) * rb, k)) {
      std::fprintf(stderr, "quantize_row_ref(%s) failed\n", type_name(t));
      std::abort();
    }
  }
  for (int64_t r = n_distinct; r < m; ++r) {
    std::memcpy(wp.data.data() + static_cast<size_t>(r) * rb, wp.data.data() + static_cast<size_t>(r % n_distinct) * rb,
                rb);
  }
  for (int64_t c = 1; c < wp.n_copies; ++c) {
    std::memcpy(wp.data.data() + static_cast<size_t>(c) * wp.mat_bytes, wp.data.data(), wp.mat_bytes);
  }
  return wp;
}

// Aborts unless matmul_q on `w` equals the scalar table on a sample of rows, for every token.
void check_against_scalar(const TensorView& w, const QuantizedRows& xq, const std::vector<float>& x,
                          const std::vector<float>& y) {
  const KernelTable* scalar = kernels_for(Isa::kScalar);
  const GgmlType vt = quant::vec_dot_type(w.type);
  const int64_t k = w.ne[0], m = w.ne[1];
  std::vector<uint8_t> xs(type_row_bytes(vt, k));
  // ~100 rows spread over the matrix, including the last (partial task) rows.
  std::vector<int64_t> rows;
  for (int64_t r = 0; r < m; r += std::max<int64_t>(1, m / 97)) rows.push_back(r);
  if (rows.back() != m - 1) rows.push_back(m - 1);
  for (int64_t c = 0; c < xq.n_rows; ++c) {
    (*scalar)[vt].from_float(x.data() + c * k, xs.data(), k);
    if (std::memcmp(xs.data(), xq.row(c), xs.size()) != 0) {
      std::fprintf(stderr, "activation quantization of %s differs from scalar (token %lld)\n", type_name(vt),
                   static_cast<long long>(c));
      std::abort();
    }
    for (int64_t r : rows) {
      const float ref = (*scalar)[w.type].vec_dot(k, w.row(r), xs.data());
      const float got = y[static_cast<size_t>(c * m + r)];
      if (std::bit_cast<uint32_t>(ref) != std::bit_cast<uint32_t>(got)) {
        std::fprintf(stderr, "MISMATCH %s K=%lld M=%lld token %lld row %lld: %.9g vs scalar %.9g\n", type_name(w.type),
                     static_cast<long long>(k), static_cast<long long>(m), static_cast<long long>(c),
                     static_cast<long long>(r), got, ref);
        std::abort();
      }
    }
  }
}

void bm_kern(benchmark::State& state, GgmlType t, int64_t k, int64_t m, int64_t batch, int threads) {
  WeightPool& wp = weight_pool(t, k, m);
  ThreadPool& pool = pool_of(threads);
  std::mt19937 rng(42);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(batch * k));
  for (auto& v : x) v = nd(rng);
  QuantizedRows xq;
  quantize_rows(quant::vec_dot_type(t), x.data(), batch, k, &xq, &pool);
  std::vector<float> y(static_cast<size_t>(batch * m));
  matmul_q(wp.view(0), xq, y.data(), static_cast<size_t>(m), &pool);
  // The framework calls this function several times while it sizes the run: check once.
  static std::set<std::string> checked;
  const std::string key = std::string(type_name(t)) + "/" + std::to_string(k) + "/" + std::to_string(m) + "/" +
                          std::to_string(batch) + "/" + std::to_string(threads);
  if (checked.insert(key).second) check_against_scalar(wp.view(0), xq, x, y);

  int64_t i = 0;
  for (auto _ : state) {
    matmul_q(wp.view(i), xq, y.data(), static_cast<size_t>(m), &pool);
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
    if (++i == wp.n_copies) i = 0;
  }
  const double bytes = static_cast<double>(wp.mat_bytes);
  state.counters["W_Bps"] =
      benchmark::Counter(bytes, benchmark::Counter::kIsIterationInvariantRate, benchmark::Counter::kIs1000);
  state.counters["FLOPS"] =
      benchmark::Counter(2.0 * static_cast<double>(k * m * batch), benchmark::Counter::kIsIterationInvariantRate,
                         benchmark::Counter::kIs1000);
  state.counters["bytes"] = bytes;
}

// ---------------------------------------------------------------- memory bandwidth

const std::vector<uint64_t>& mem_buffer() {
  static const std::vector<uint64_t> buf = [] {
    std::vector<uint64_t> b(k_mem_bytes / sizeof(uint64_t));
    for (size_t i = 0; i < b.size(); ++i) b[i] = i * 0x9E3779B97F4A7C15ull;
    return b;
  }();
  return buf;
}

// Eight independent accumulators so the adds never limit the load stream.
uint64_t read_sum_generic(const uint64_t* p, size_t n) {
  uint64_t a[8] = {};
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int l = 0; l < 8; ++l) a[l] += p[i + l];
  }
  for (; i < n; ++i) a[0] += p[i];
  uint64_t s = 0;
  for (uint64_t v : a) s += v;
  return s;
}

#if defined(__x86_64__)
// 32-byte loads, four accumulators: the widest loads the matvec kernels use too, so the probe
// is not slower than the code it is the yardstick for.
__attribute__((target("avx2"))) uint64_t read_sum_avx2(const uint64_t* p, size_t n) {
  __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    a0 = _mm256_add_epi64(a0, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i)));
    a1 = _mm256_add_epi64(a1, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i + 4)));
    a2 = _mm256_add_epi64(a2, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i + 8)));
    a3 = _mm256_add_epi64(a3, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i + 12)));
  }
  alignas(32) uint64_t lanes[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes),
                     _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3)));
  return lanes[0] + lanes[1] + lanes[2] + lanes[3] + read_sum_generic(p + i, n - i);
}
#endif

uint64_t read_sum(const uint64_t* p, size_t n) {
#if defined(__x86_64__)
  static const bool avx2 = __builtin_cpu_supports("avx2");
  if (avx2) return read_sum_avx2(p, n);
#endif
  return read_sum_generic(p, n);
}

void bm_mem(benchmark::State& state, int threads) {
  const auto& buf = mem_buffer();
  ThreadPool& pool = pool_of(threads);
  std::vector<uint64_t> part(static_cast<size_t>(threads) * 8);  // 64 bytes apart: no sharing
  for (auto _ : state) {
    pool.parallel_for(threads, [&](int64_t b, int64_t e, int) {
      for (int64_t t = b; t < e; ++t) {
        const size_t n = buf.size() / static_cast<size_t>(threads);
        part[static_cast<size_t>(t) * 8] = read_sum(buf.data() + static_cast<size_t>(t) * n, n);
      }
    });
    benchmark::DoNotOptimize(part.data());
  }
  state.counters["W_Bps"] = benchmark::Counter(
      static_cast<double>(k_mem_bytes), benchmark::Counter::kIsIterationInvariantRate, benchmark::Counter::kIs1000);
  state.counters["bytes"] = static_cast<double>(k_mem_bytes);
}

// One thread, vec_dot over a 256 KiB set of weight rows that stays in L2: what the kernel
// computes per second with no DRAM traffic at all. If this is not well above the one-thread
// DRAM bandwidth, the streaming matvec is compute-bound, not memory-bound.
void bm_hot(benchmark::State& state, GgmlType t, int64_t k) {
  const size_t rb = type_row_bytes(t, k);
  const int64_t n_rows = std::max<int64_t>(1, static_cast<int64_t>((256u << 10) / rb));
  WeightPool& wp = weight_pool(t, k, n_rows);
  const GgmlType vt = quant::vec_dot_type(t);
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(k));
  for (auto& v : x) v = nd(rng);
  std::vector<uint8_t> xq(type_row_bytes(vt, k));
  kernels()[vt].from_float(x.data(), xq.data(), k);
  const VecDotFn dot = kernels()[t].vec_dot;
  float sink = 0;
  for (auto _ : state) {
    for (int64_t r = 0; r < n_rows; ++r) sink += dot(k, wp.data.data() + static_cast<size_t>(r) * rb, xq.data());
    benchmark::DoNotOptimize(sink);
  }
  state.counters["W_Bps"] =
      benchmark::Counter(static_cast<double>(rb * static_cast<size_t>(n_rows)),
                         benchmark::Counter::kIsIterationInvariantRate, benchmark::Counter::kIs1000);
}

void bm_attn(benchmark::State& state, bool kqv, int64_t n_ctx) {
  constexpr int64_t kDim = 128, kGroup = 8, kStride = 4 * 2 * kDim;
  std::mt19937 rng(9);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float, HugePageAllocator<float>> cache(static_cast<size_t>(n_ctx * kStride));
  std::vector<float> q(kGroup * kDim), p(kGroup * n_ctx);
  for (auto& v : cache) v = nd(rng);
  for (auto& v : q) v = nd(rng);
  for (auto& v : p) v = std::fabs(nd(rng)) / static_cast<float>(n_ctx);
  std::vector<float> out(kqv ? kGroup * 16 * kDim : kGroup * n_ctx), ref(out.size());
  AttnScores as;
  as.k = cache.data();
  as.k_stride = kStride;
  as.q = q.data();
  as.q_stride = kDim;
  as.nq = kGroup;
  as.dk = kDim;
  as.c0 = 0;
  as.c1 = n_ctx;
  as.scale = 0.088f;
  as.out_stride = static_cast<size_t>(n_ctx);
  AttnKqv av;
  av.lanes_stride = 16 * kDim;
  av.v = cache.data() + kDim;
  av.v_stride = kStride;
  av.p = p.data();
  av.p_stride = static_cast<size_t>(n_ctx);
  av.nh = kGroup;
  av.c0 = 0;
  av.c1 = n_ctx;
  av.dv = kDim;
  auto run = [&](const KernelTable& t, float* o) {
    if (kqv) {
      std::fill(o, o + out.size(), 0.0f);
      av.lanes = o;
      t.attn.kqv(av);
    } else {
      as.out = o;
      t.attn.scores(as);
    }
  };
  run(*kernels_for(Isa::kScalar), ref.data());
  run(kernels(), out.data());
  if (std::memcmp(ref.data(), out.data(), out.size() * sizeof(float)) != 0) {
    state.SkipWithError("attention kernel differs from the scalar table");
    return;
  }
  for (auto _ : state) {
    run(kernels(), out.data());
    benchmark::DoNotOptimize(out.data());
  }
  state.counters["Cells_ps"] = benchmark::Counter(
      static_cast<double>(n_ctx), benchmark::Counter::kIsIterationInvariantRate, benchmark::Counter::kIs1000);
}

void bm_pool_dispatch(benchmark::State& state) {
  ThreadPool& pool = pool_of(2);
  std::vector<int64_t> sink(16);
  for (auto _ : state) {
    pool.parallel_for(2, [&](int64_t b, int64_t, int tid) { sink[static_cast<size_t>(tid) * 8] += b; });
  }
  benchmark::DoNotOptimize(sink.data());
}

// ---------------------------------------------------------------- context

std::string cpu_model() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("model name", 0) == 0) {
      auto p = line.find(':');
      if (p != std::string::npos) return line.substr(p + 2);
    }
  }
  return "unknown";
}

std::string git_commit() {
  if (const char* env = std::getenv("MOESH_GIT_COMMIT")) return env;
  std::string out;
  if (FILE* p = popen("git rev-parse --short HEAD 2>/dev/null", "r")) {
    char buf[64];
    while (std::fgets(buf, sizeof buf, p)) out += buf;
    pclose(p);
  }
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
  return out.empty() ? "unknown" : out;
}

void register_all() {
  const GgmlType types[] = {GgmlType::Q4_K,   GgmlType::Q5_K, GgmlType::Q6_K,  GgmlType::Q2_K, GgmlType::Q3_K,
                            GgmlType::IQ4_XS, GgmlType::Q8_0, GgmlType::MXFP4, GgmlType::F16};
  const int64_t embds[] = {2048, 4096, 7168};
  const int64_t ffns[] = {768, 1536, 2048};
  const int64_t batches[] = {1, 8, 64};
  for (GgmlType t : types) {
    for (int64_t e : embds) {
      for (int64_t f : ffns) {
        for (int proj = 0; proj < 2; ++proj) {
          // gate/up: K = n_embd, M = ffn; down: K = ffn, M = n_embd.
          const int64_t k = proj == 0 ? e : f;
          const int64_t m = proj == 0 ? f : e;
          for (int64_t b : batches) {
            for (int th : {1, 2}) {
              const std::string name = std::string("kern/") + type_name(t) + (proj == 0 ? "/gate/" : "/down/") + "K" +
                                       std::to_string(k) + "xM" + std::to_string(m) + "/b" + std::to_string(b) + "/t" +
                                       std::to_string(th);
              benchmark::RegisterBenchmark(name.c_str(), bm_kern, t, k, m, b, th)
                  ->Unit(benchmark::kMicrosecond)
                  ->UseRealTime();
            }
          }
        }
      }
    }
  }
  for (int th : {1, 2}) {
    benchmark::RegisterBenchmark(("mem/read_sum/t" + std::to_string(th)).c_str(), bm_mem, th)
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime();
  }
  benchmark::RegisterBenchmark("pool/dispatch/t2", bm_pool_dispatch)->UseRealTime();
  for (int64_t n : {512, 4096, 32768}) {
    for (bool kqv : {false, true}) {
      benchmark::RegisterBenchmark(
          (std::string("attn/") + (kqv ? "kqv" : "scores") + "/ctx" + std::to_string(n) + "/t1").c_str(), bm_attn, kqv,
          n)
          ->Unit(benchmark::kMicrosecond)
          ->UseRealTime();
    }
  }
  for (GgmlType t : types) {
    benchmark::RegisterBenchmark((std::string("hot/") + type_name(t) + "/K2048/t1").c_str(), bm_hot, t, int64_t{2048})
        ->Unit(benchmark::kMicrosecond)
        ->UseRealTime();
  }
}

}  // namespace
}  // namespace moesh

int main(int argc, char** argv) {
  using namespace moesh;
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::AddCustomContext("moesh_commit", git_commit());
  benchmark::AddCustomContext("cpu_model", cpu_model());
  benchmark::AddCustomContext("moesh_isa", isa_name(kernels().isa));
  const char* spin = std::getenv("MOESH_POOL_SPIN_US");
  benchmark::AddCustomContext("pool_spin_us", spin ? spin : "default");
  std::fprintf(stderr, "moesh bench_kernels: commit %s | cpu %s | isa %s | threads 1,2 | hw threads %u\n",
               git_commit().c_str(), cpu_model().c_str(), isa_name(kernels().isa), std::thread::hardware_concurrency());
  register_all();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
