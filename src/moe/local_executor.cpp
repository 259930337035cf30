// LocalExecutor: every routed expert computed in this process.
//
// Work is scheduled across experts at once instead of expert by expert, so batch-1 decode
// (k experts x 3 matvecs) costs three pool synchronisations per layer rather than 3k:
//   A-C (run_expert_groups, src/moe/expert_groups.cpp, shared with workers):
//   A. gate/up: items = (active expert, chunk of n_ff rows), each a serial matmul_q_rows over
//      that expert's tokens;
//   B. activation + quantization of h, per (token, expert) slot, in one job;
//   C. down: items = (active expert, chunk of n_embd rows);
//   D. combine per token in router rank order: out = w0*y0; out += w1*y1; ...
// Every output element is one vec_dot over a whole row, exactly as in expert_ffn(), so the
// result does not depend on thread count, chunking or the other tokens in the batch.
#include <algorithm>

#include "moesh/moe/executor.h"
#include "moesh/moe/expert_stages.h"
#include "moesh/tensor/kernels.h"
#include "moesh/tensor/quant.h"

namespace moesh {

struct LocalExecutor::Impl {
  std::vector<ExpertWeights> layers;
  ThreadPool* pool = nullptr;

  struct Job : SubmittedJob {
    std::vector<float> out;  // [n_tokens][n_embd]
  };
  std::vector<Job> jobs;
  Ticket next_ticket = 1;

  // Buffers reused across layers and steps.
  QuantizedRows xq, xq_up;
  std::vector<float> y;
  std::vector<int32_t> tok_of_pos, pos_of_slot;
  std::vector<ExpertRef> refs;
  ExpertGroupScratch groups;

  Status run(Job& job);
};

LocalExecutor::LocalExecutor(std::vector<ExpertWeights> layers, ThreadPool* pool) : impl_(std::make_unique<Impl>()) {
  impl_->layers = std::move(layers);
  impl_->pool = pool;
}

void LocalExecutor::set_pool(ThreadPool* pool) {
  impl_->pool = pool;
}

LocalExecutor::~LocalExecutor() = default;

Ticket LocalExecutor::submit(int layer, const float* x, int64_t n_tokens, const RoutingPlan& plan) {
  return start_job(impl_->jobs, &impl_->next_ticket, layer, x, n_tokens, plan).ticket;
}

Result<std::span<const float>> LocalExecutor::wait(Ticket t) {
  Impl::Job* job = finish_job(impl_->jobs, t);
  if (job == nullptr) return make_error(StatusCode::kInvalidArgument, "local executor: unknown ticket {}", t);
  MOESH_RETURN_IF_ERROR(impl_->run(*job));
  return std::span<const float>(job->out.data(), job->out.size());
}

Status LocalExecutor::Impl::run(Job& job) {
  if (job.layer < 0 || job.layer >= static_cast<int>(layers.size()) || !layers[job.layer].valid()) {
    return make_error(StatusCode::kInvalidArgument, "local executor: layer {} has no experts", job.layer);
  }
  const ExpertWeights& w = layers[job.layer];
  const RoutingPlan& plan = *job.plan;
  const int64_t n_tok = job.n_tokens;
  const int64_t n_embd = w.n_embd();
  const int k = plan.k;
  if (plan.n_tokens != n_tok) {
    return make_error(StatusCode::kInvalidArgument, "local executor: plan has {} tokens, x has {}", plan.n_tokens,
                      n_tok);
  }
  for (int32_t e : plan.experts) {
    if (e < 0 || e >= w.n_expert()) {
      return make_error(StatusCode::kOutOfRange, "local executor: expert {} not in layer {}", e, job.layer);
    }
  }
  const int64_t n_slots = n_tok * k;
  const int64_t n_active = plan.n_active();
  job.out.resize(static_cast<size_t>(n_tok * n_embd));
  if (n_tok == 0) return Status::ok();

  // Position p in plan order (grouped by expert) <-> slot (token*k + rank).
  tok_of_pos.resize(n_slots);
  pos_of_slot.resize(n_slots);
  for (int64_t p = 0; p < n_slots; ++p) {
    tok_of_pos[p] = plan.slots[p] / k;
    pos_of_slot[plan.slots[p]] = static_cast<int32_t>(p);
  }
  if (y.size() < static_cast<size_t>(n_slots * n_embd)) y.resize(n_slots * n_embd);

  // Each token's input row is quantized once and reused by every expert it is routed to.
  const GgmlType gate_vdt = quant::vec_dot_type(w.gate.type);
  const GgmlType up_vdt = quant::vec_dot_type(w.up.type);
  quantize_rows(gate_vdt, job.x, n_tok, n_embd, &xq, pool);
  if (up_vdt != gate_vdt) quantize_rows(up_vdt, job.x, n_tok, n_embd, &xq_up, pool);
  const QuantizedRows& xq_for_up = up_vdt == gate_vdt ? xq : xq_up;

  // A-C. gate/up, activation, down for every active expert at once
  refs.resize(static_cast<size_t>(n_active));
  for (int64_t a = 0; a < n_active; ++a) refs[a] = ExpertRef{&w, plan.experts[a]};
  run_expert_groups(refs, plan.offsets.data(), tok_of_pos.data(), xq, xq_for_up, y.data(), &groups, pool);
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
