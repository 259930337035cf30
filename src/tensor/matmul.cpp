// matmul: y[n][m] = vec_dot(K, W row m, quantized x row n) for every (n, m).
//
// Determinism: each output element is exactly one vec_dot (or the bit-identical vec_dot_tile)
// over the whole row, and every activation row is quantized on its own, so the result does not
// depend on the thread count, the chunking or which other tokens share the batch.
//
// Work layout: the output is cut into tasks of k_rows_per_task weight rows x k_tokens_per_task
// tokens, numbered row-block-major; the task list is cut into a few contiguous chunks per
// thread, which threads take in turn. For decode (1 token) a chunk is a run of contiguous
// weight rows, so each core streams its own part of the matrix. For batches, a task's 16 weight rows
// (64 KiB of Q4_K at K=7168, 224 KiB of F16) stay in L2 while all its tokens go past them, and
// the kernel's vec_dot_tile (when it has one) reuses each unpacked weight block across tokens;
// types with a tile take 64 rows per task (see k_tile_rows_per_task).
#include <algorithm>
#include <atomic>
#include <cassert>
#include <cstring>

#include "moesh/tensor/kernels.h"
#include "moesh/tensor/ops.h"
#include "moesh/tensor/quant.h"

namespace moesh {
namespace {

constexpr int64_t k_rows_per_task = 16;
// With a tile kernel, batches take 64 rows per task: a tile call prepares its activations once
// (the VNNI Q8_0 tile repacks them, ~16 % of its time at 16 rows per call) and 64 rows of the
// tiled types stay well inside L2 (Q8_0 K=2048: 136 KiB).
constexpr int64_t k_tile_rows_per_task = 64;
constexpr int64_t k_tokens_per_task = 64;
// Below this many tokens the tile kernels' per-call weight unpacking does not pay off: measured
// with the AVX2 tiles (bench_kernels, CPU time, Q4_K 2048x7168), one token took 1.9 ms through
// the tile against 1.1 ms through vec_dot, while 64 tokens took 51 ms against 66 ms.
constexpr int64_t k_tile_min_tokens = 4;
// Chunks per thread for the dynamic schedule of run_plans (see there).
constexpr int k_chunks_per_thread = 4;

void run(ThreadPool* pool, int64_t n, int64_t grain, const std::function<void(int64_t, int64_t, int)>& fn) {
  if (pool != nullptr) {
    pool->parallel_for(n, fn, grain);
  } else if (n > 0) {
    fn(0, n, 0);
  }
}

// One weight matrix's share of a (possibly fused) matmul: its tasks are numbered
// row-block-major, n_tb token blocks per row block.
struct Plan {
  const TensorView* w;
  const uint8_t* x;
  size_t x_stride;
  int64_t n_tok;
  float* y;
  size_t ldy;
  int64_t n_tb;
  int64_t n_tasks;
  int64_t rows_per_task;
};

Plan make_plan(const TensorView& w, const uint8_t* x, size_t x_stride, int64_t n_tok, float* y, size_t ldy) {
  const int64_t m = w.ne[1];
  const bool tiled = kernels()[w.type].vec_dot_tile != nullptr && n_tok >= k_tile_min_tokens;
  const int64_t rows = tiled ? k_tile_rows_per_task : k_rows_per_task;
  const int64_t n_rb = (m + rows - 1) / rows;
  const int64_t n_tb = (n_tok + k_tokens_per_task - 1) / k_tokens_per_task;
  const int64_t n_tasks = n_tok > 0 && m > 0 ? n_rb * n_tb : 0;
  return Plan{&w, x, x_stride, n_tok, y, ldy, n_tb, n_tasks, rows};
}

// Runs task t of plan p: nr weight rows x nc tokens.
void run_task(const Plan& p, int64_t t) {
  const TensorView& w = *p.w;
  const int64_t k = w.ne[0];
  const int64_t m = w.ne[1];
  const TypeKernels& tk = kernels()[w.type];
  assert(tk.vec_dot != nullptr);
  const VecDotFn vec_dot = tk.vec_dot;
  const VecDotTileFn tile = tk.vec_dot_tile;
  const size_t w_stride = w.nb[1];
  const int64_t r0 = (t / p.n_tb) * p.rows_per_task;
  const int64_t c0 = (t % p.n_tb) * k_tokens_per_task;
  const int64_t nr = std::min(p.rows_per_task, m - r0);
  const int64_t nc = std::min(k_tokens_per_task, p.n_tok - c0);
  const uint8_t* wr = w.data + static_cast<size_t>(r0) * w_stride;
  const uint8_t* xc = p.x + static_cast<size_t>(c0) * p.x_stride;
  float* yc = p.y + static_cast<size_t>(c0) * p.ldy + r0;
  if (tile != nullptr && nc >= k_tile_min_tokens) {
    tile(k, wr, w_stride, static_cast<int>(nr), xc, p.x_stride, static_cast<int>(nc), yc, p.ldy);
    return;
  }
  // Tokens outer, rows inner: the task's weight rows are reused from cache for each token.
  for (int64_t c = 0; c < nc; ++c) {
    const uint8_t* xr = xc + static_cast<size_t>(c) * p.x_stride;
    float* yr = yc + static_cast<size_t>(c) * p.ldy;
    if (tk.vec_dot_rows != nullptr) {
      tk.vec_dot_rows(k, wr, w_stride, static_cast<int>(nr), xr, yr);
      continue;
    }
    for (int64_t r = 0; r < nr; ++r) {
      yr[r] = vec_dot(k, wr + static_cast<size_t>(r) * w_stride, xr);
    }
  }
}

// Runs the tasks of all plans as one parallel_for: the task lists are concatenated, so each
// thread gets one contiguous run that may cross from one matrix into the next. Fusing the
// projections that read the same input (q/k/v, gate/up) saves a pool round trip per matrix,
// which is a visible share of a batch-1 decode step.
void run_plans(const Plan* plans, int n_plans, ThreadPool* pool) {
  int64_t total = 0;
  for (int i = 0; i < n_plans; ++i) total += plans[i].n_tasks;
  if (total <= 0) return;
  auto run_range = [&](int64_t t0, int64_t t1) {
    int i = 0;
    int64_t base = 0;  // first global task number of plan i
    while (t0 >= base + plans[i].n_tasks) base += plans[i++].n_tasks;
    for (int64_t t = t0; t < t1; ++t) {
      while (t >= base + plans[i].n_tasks) base += plans[i++].n_tasks;
      run_task(plans[i], t - base);
    }
  };
  const int n_threads = pool != nullptr ? pool->n_threads() : 1;
  if (n_threads <= 1 || total == 1) {
    run_range(0, total);
    return;
  }
  // Dynamic chunks: the task range is cut into k_chunks_per_thread contiguous chunks per thread
  // and threads take the next free chunk. A thread that wakes late or is preempted (2 vCPUs
  // shared with other jobs) then costs a chunk, not half the matmul. Which thread runs a task
  // never changes its result: each output element is one vec_dot.
  const int64_t n_chunks = std::min<int64_t>(total, int64_t{k_chunks_per_thread} * n_threads);
  std::atomic<int64_t> next{0};
  pool->parallel_for(n_threads, [&](int64_t, int64_t, int) {
    for (;;) {
      const int64_t c = next.fetch_add(1, std::memory_order_relaxed);
      if (c >= n_chunks) return;
      run_range(c * total / n_chunks, (c + 1) * total / n_chunks);
    }
  });
}

// y rows are ldy floats apart; x rows (already in vec_dot_type) are x_stride bytes apart.
void matmul_impl(const TensorView& w, const uint8_t* x, size_t x_stride, int64_t n_tok, float* y, size_t ldy,
                 ThreadPool* pool) {
  const Plan p = make_plan(w, x, x_stride, n_tok, y, ldy);
  run_plans(&p, 1, pool);
}

// Per-calling-thread scratch for quantized activations, so steady-state matmuls do not allocate.
QuantizedRows& scratch_rows() {
  thread_local QuantizedRows rows;
  return rows;
}

}  // namespace

void quantize_rows(GgmlType type, const float* x, int64_t n_rows, int64_t k, QuantizedRows* out, ThreadPool* pool) {
  const FromFloatFn from_float = kernels()[type].from_float;
  assert(from_float != nullptr && k % type_block_size(type) == 0);
  out->type = type;
  out->n_cols = k;
  out->n_rows = n_rows;
  out->row_bytes = type_row_bytes(type, k);
  out->data.resize(out->row_bytes * static_cast<size_t>(std::max<int64_t>(0, n_rows)));
  uint8_t* dst = out->data.data();
  const size_t rb = out->row_bytes;
  // Quantizing a row costs about as much as one or two vec_dots: only batches are worth
  // spreading over threads.
  run(pool, n_rows, 4, [&](int64_t r0, int64_t r1, int) {
    for (int64_t r = r0; r < r1; ++r) {
      from_float(x + static_cast<size_t>(r) * static_cast<size_t>(k), dst + static_cast<size_t>(r) * rb, k);
    }
  });
}

void matmul(const TensorView& w, const float* x, int64_t n_rows, float* y, ThreadPool* pool) {
  matmul(w, x, n_rows, y, static_cast<size_t>(w.ne[1]), pool);
}

void matmul(const TensorView& w, const float* x, int64_t n_rows, float* y, size_t ldy, ThreadPool* pool) {
  const int64_t k = w.ne[0];
  const GgmlType vt = quant::vec_dot_type(w.type);
  if (vt == GgmlType::F32) {
    // F32 activations are already in the dot type: no copy.
    matmul_impl(w, reinterpret_cast<const uint8_t*>(x), static_cast<size_t>(k) * sizeof(float), n_rows, y, ldy, pool);
    return;
  }
  QuantizedRows& xq = scratch_rows();
  quantize_rows(vt, x, n_rows, k, &xq, pool);
  matmul_q(w, xq, y, ldy, pool);
}

void matmul_q(const TensorView& w, const QuantizedRows& xq, float* y, size_t ldy, ThreadPool* pool) {
  assert(xq.type == quant::vec_dot_type(w.type) && xq.n_cols == w.ne[0]);
  assert(ldy >= static_cast<size_t>(w.ne[1]));
  matmul_impl(w, xq.data.data(), xq.row_bytes, xq.n_rows, y, ldy, pool);
}

void matmul_q_multi(std::span<const MatmulQ> jobs, ThreadPool* pool) {
  constexpr int k_max = 8;
  assert(jobs.size() <= static_cast<size_t>(k_max));
  Plan plans[k_max];
  int n = 0;
  for (const MatmulQ& j : jobs) {
    assert(j.xq->type == quant::vec_dot_type(j.w->type) && j.xq->n_cols == j.w->ne[0]);
    const size_t ldy = j.ldy != 0 ? j.ldy : static_cast<size_t>(j.w->ne[1]);
    assert(ldy >= static_cast<size_t>(j.w->ne[1]));
    plans[n++] = make_plan(*j.w, j.xq->data.data(), j.xq->row_bytes, j.xq->n_rows, j.y, ldy);
  }
  run_plans(plans, n, pool);
}

void matmul_q_rows(const TensorView& w, const QuantizedRows& xq, const int32_t* rows, int64_t n_sel, float* y,
                   size_t ldy, ThreadPool* pool) {
  assert(xq.type == quant::vec_dot_type(w.type) && xq.n_cols == w.ne[0]);
  if (n_sel <= 0) return;
  // Gather the selected rows so the kernel sees a plain strided batch (tiles need one stride).
  // A gathered row holds the same bytes, so results equal the full matmul's rows.
  thread_local std::vector<uint8_t> gathered;
  const size_t rb = xq.row_bytes;
  gathered.resize(rb * static_cast<size_t>(n_sel));
  for (int64_t j = 0; j < n_sel; ++j) {
    assert(rows[j] >= 0 && rows[j] < xq.n_rows);
    std::memcpy(gathered.data() + static_cast<size_t>(j) * rb, xq.row(rows[j]), rb);
  }
  matmul_impl(w, gathered.data(), rb, n_sel, y, ldy, pool);
}

void get_row_f32(const TensorView& w, int64_t i, float* out) {
  const int64_t k = w.ne[0];
  const uint8_t* src = w.data + static_cast<size_t>(i) * w.nb[1];
  if (w.type == GgmlType::F32) {
    std::memcpy(out, src, static_cast<size_t>(k) * sizeof(float));
    return;
  }
  const ToFloatFn to_float = kernels()[w.type].to_float;
  if (to_float != nullptr) {
    to_float(src, out, k);
  } else {
    const bool ok = quant::dequantize_row_ref(w.type, src, out, k);
    assert(ok);
    (void)ok;
  }
}

}  // namespace moesh
