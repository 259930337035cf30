// LocalExecutor: every routed expert computed in this process.
//
// Work is scheduled across experts at once instead of expert by expert, so batch-1 decode
// (k experts x 3 matvecs) costs three pool synchronisations per layer rather than 3k:
//   A. gate/up: items = (active expert, chunk of n_ff rows), each a serial matmul_q_rows over
//      that expert's tokens;
//   B. activation + quantization of h, per (token, expert) slot, in one job;
//   C. down: items = (active expert, chunk of n_embd rows);
//   D. combine per token in router rank order: out = w0*y0; out += w1*y1; ...
// Every output element is one vec_dot over a whole row, exactly as in expert_ffn(), so the
// result does not depend on thread count, chunking or the other tokens in the batch.
#include <algorithm>
#include <numeric>

#include "moe/expert_stages.h"
#include "moesh/executor.h"
#include "moesh/kernels.h"
#include "moesh/quant.h"

namespace moesh {

struct LocalExecutor::Impl {
  std::vector<ExpertWeights> layers;
  ThreadPool* pool = nullptr;

  struct Job {
    Ticket ticket = 0;
    bool pending = false;
    int layer = 0;
    const float* x = nullptr;
    int64_t n_tokens = 0;
    const RoutingPlan* plan = nullptr;
    std::vector<float> out;  // [n_tokens][n_embd]
  };
  std::vector<Job> jobs;
  Ticket next_ticket = 1;

  // Buffers reused across layers and steps.
  QuantizedRows xq, xq_up, hq;
  std::vector<float> g, u, h, y;
  std::vector<int32_t> tok_of_pos, pos_of_slot, iota;

  Status run(Job& job);
};

LocalExecutor::LocalExecutor(std::vector<ExpertWeights> layers, ThreadPool* pool)
    : impl_(std::make_unique<Impl>()) {
  impl_->layers = std::move(layers);
  impl_->pool = pool;
}

LocalExecutor::~LocalExecutor() = default;

Ticket LocalExecutor::submit(int layer, const float* x, int64_t n_tokens, const RoutingPlan& plan) {
  Impl& m = *impl_;
  Impl::Job* job = nullptr;
  for (auto& j : m.jobs) {
    if (!j.pending) { job = &j; break; }
  }
  if (job == nullptr) job = &m.jobs.emplace_back();
  job->ticket = m.next_ticket++;
  job->pending = true;
  job->layer = layer;
  job->x = x;
  job->n_tokens = n_tokens;
  job->plan = &plan;
  return job->ticket;
}

Result<std::span<const float>> LocalExecutor::wait(Ticket t) {
  for (auto& j : impl_->jobs) {
    if (j.pending && j.ticket == t) {
      j.pending = false;
      MOESH_RETURN_IF_ERROR(impl_->run(j));
      return std::span<const float>(j.out.data(), j.out.size());
    }
  }
  return make_error(StatusCode::kInvalidArgument, "local executor: unknown ticket {}", t);
}

namespace {

// Splits each active expert's `n_rows` output rows into chunks so that all threads get work.
int64_t chunks_per_expert(int64_t n_rows, int64_t n_active, int n_threads) {
  const int64_t want = (4 * static_cast<int64_t>(n_threads) + n_active - 1) / n_active;
  return std::clamp<int64_t>(want, 1, std::max<int64_t>(1, n_rows / 16));
}

// The pool takes a std::function; wrapping `fn` by reference keeps it in the small-object
// buffer, so no heap allocation per call.
template <typename F>
void run_items(ThreadPool* pool, int64_t n, const F& fn) {
  auto body = [&fn](int64_t a, int64_t b, int) {
    for (int64_t i = a; i < b; ++i) fn(i);
  };
  if (pool != nullptr) pool->parallel_for(n, body);
  else body(0, n, 0);
}

}  // namespace

Status LocalExecutor::Impl::run(Job& job) {
  if (job.layer < 0 || job.layer >= static_cast<int>(layers.size()) || !layers[job.layer].valid()) {
    return make_error(StatusCode::kInvalidArgument, "local executor: layer {} has no experts", job.layer);
  }
  const ExpertWeights& w = layers[job.layer];
  const RoutingPlan& plan = *job.plan;
  const int64_t n_tok = job.n_tokens;
  const int64_t n_embd = w.n_embd();
  const int64_t n_ff = w.n_ff();
  const int k = plan.k;
  if (plan.n_tokens != n_tok) {
    return make_error(StatusCode::kInvalidArgument, "local executor: plan has {} tokens, x has {}",
                      plan.n_tokens, n_tok);
  }
  for (int32_t e : plan.experts) {
    if (e < 0 || e >= w.n_expert()) {
      return make_error(StatusCode::kOutOfRange, "local executor: expert {} not in layer {}", e, job.layer);
    }
  }
  const int64_t n_slots = n_tok * k;
  const int64_t n_active = plan.n_active();
  const int n_threads = pool != nullptr ? pool->n_threads() : 1;
  job.out.resize(static_cast<size_t>(n_tok * n_embd));
  if (n_tok == 0) return Status::ok();

  // Position p in plan order (grouped by expert) <-> slot (token*k + rank).
  tok_of_pos.resize(n_slots);
  pos_of_slot.resize(n_slots);
  for (int64_t p = 0; p < n_slots; ++p) {
    tok_of_pos[p] = plan.slots[p] / k;
    pos_of_slot[plan.slots[p]] = static_cast<int32_t>(p);
  }
  if (static_cast<int64_t>(iota.size()) < n_slots) {
    iota.resize(n_slots);
    std::iota(iota.begin(), iota.end(), 0);
  }
  const size_t gsz = static_cast<size_t>(n_slots * n_ff);
  if (g.size() < gsz) { g.resize(gsz); u.resize(gsz); h.resize(gsz); }
  if (y.size() < static_cast<size_t>(n_slots * n_embd)) y.resize(n_slots * n_embd);

  // Each token's input row is quantized once and reused by every expert it is routed to.
  const GgmlType gate_vdt = quant::vec_dot_type(w.gate.type);
  const GgmlType up_vdt = quant::vec_dot_type(w.up.type);
  quantize_rows(gate_vdt, job.x, n_tok, n_embd, &xq, pool);
  if (up_vdt != gate_vdt) quantize_rows(up_vdt, job.x, n_tok, n_embd, &xq_up, pool);
  const QuantizedRows& xq_for_up = up_vdt == gate_vdt ? xq : xq_up;

  // A. gate and up
  const int64_t ca = chunks_per_expert(n_ff, n_active, n_threads);
  const int64_t rows_a = (n_ff + ca - 1) / ca;
  run_items(pool, n_active * ca, [&](int64_t item) {
    const int64_t a = item / ca;
    const int64_t r0 = (item % ca) * rows_a;
    const int64_t r1 = std::min(n_ff, r0 + rows_a);
    if (r0 >= r1) return;
    const int64_t e = plan.experts[a];
    const int64_t p0 = plan.offsets[a], n_sel = plan.offsets[a + 1] - p0;
    matmul_q_rows(weight_rows(w.gate.expert(e), r0, r1), xq, tok_of_pos.data() + p0, n_sel,
                  g.data() + p0 * n_ff + r0, static_cast<size_t>(n_ff), nullptr);
    matmul_q_rows(weight_rows(w.up.expert(e), r0, r1), xq_for_up, tok_of_pos.data() + p0, n_sel,
                  u.data() + p0 * n_ff + r0, static_cast<size_t>(n_ff), nullptr);
  });
  // B. activation, then each h row quantized for down, in the same pool job (one slot's row is
  // a few microseconds of work: a separate quantize pass would cost a pool round trip more).
  const GgmlType down_vdt = quant::vec_dot_type(w.down.type);
  const FromFloatFn down_from_float = kernels()[down_vdt].from_float;
  hq.type = down_vdt;
  hq.n_cols = n_ff;
  hq.n_rows = n_slots;
  hq.row_bytes = type_row_bytes(down_vdt, n_ff);
  hq.data.resize(hq.row_bytes * static_cast<size_t>(n_slots));
  run_items(pool, n_slots, [&](int64_t p) {
    float* hp = h.data() + p * n_ff;
    expert_activation(w.act, g.data() + p * n_ff, u.data() + p * n_ff, hp, n_ff);
    down_from_float(hp, hq.data.data() + static_cast<size_t>(p) * hq.row_bytes, n_ff);
  });
  // C. down
  const int64_t cc = chunks_per_expert(n_embd, n_active, n_threads);
  const int64_t rows_c = (n_embd + cc - 1) / cc;
  run_items(pool, n_active * cc, [&](int64_t item) {
    const int64_t a = item / cc;
    const int64_t r0 = (item % cc) * rows_c;
    const int64_t r1 = std::min(n_embd, r0 + rows_c);
    if (r0 >= r1) return;
    const int64_t e = plan.experts[a];
    const int64_t p0 = plan.offsets[a], n_sel = plan.offsets[a + 1] - p0;
    matmul_q_rows(weight_rows(w.down.expert(e), r0, r1), hq, iota.data() + p0, n_sel,
                  y.data() + p0 * n_embd + r0, static_cast<size_t>(n_embd), nullptr);
  });
  // D. weighted sum in router rank order
  run_items(pool, n_tok, [&](int64_t t) {
    float* o = job.out.data() + t * n_embd;
    const float* wt = plan.weights.data() + t * k;
    for (int r = 0; r < k; ++r) {
      const float* yr = y.data() + static_cast<int64_t>(pos_of_slot[t * k + r]) * n_embd;
      rank_sum_step(o, yr, wt[r], n_embd, r == 0);
    }
  });
  return Status::ok();
}

}  // namespace moesh
