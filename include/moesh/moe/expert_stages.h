// Building blocks of the expert FFN shared by expert_ffn(), the LocalExecutor and the worker. All
// compose them so that every output element is one dot product of the same rows, which is why the
// executor's cross-expert scheduling gives the bits of expert_ffn() run one expert at a time.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "moesh/moe/executor.h"
#include "moesh/tensor/tensor.h"

namespace moesh {

// Rows [r0, r1) of a 2-D weight view, as a 2-D view (a slice of the output dimension).
TensorView weight_rows(const TensorView& w, int64_t r0, int64_t r1);

// y[j][r] += bias_e[r] for rows j < n_rows (stride ld), r in [r0, r1): the expert biases
// (ExpertWeights::gate_b/up_b/down_b, row e), added after the matmul as ggml_add_id does.
void add_expert_bias(const TensorView& b, int64_t e, int64_t r0, int64_t r1, float* y, int64_t ld, int64_t n_rows);
// h = act(g, u) over n elements; `limit` > 0 clamps kSilu (ExpertWeights::swiglu_limit).
void expert_activation(ExpertActivation act, const float* g, const float* u, float* h, int64_t n, float limit = 0.0f,
                       float situ_beta = 0.0f, float situ_linear_beta = 0.0f);

// What every executor records at submit(): the ticket and the dispatch's inputs (which must
// stay valid until wait()). Executors' job types derive from it and reuse finished jobs, so a
// decode step allocates nothing.
struct SubmittedJob {
  Ticket ticket = 0;
  bool pending = false;
  int layer = 0;
  const float* x = nullptr;
  int64_t n_tokens = 0;
  const RoutingPlan* plan = nullptr;
};

// A finished job of `jobs` (or a new one) made pending with the next ticket and these inputs.
template <class Job>
Job& start_job(std::vector<Job>& jobs, Ticket* next_ticket, int layer, const float* x, int64_t n_tokens,
               const RoutingPlan& plan) {
  Job* job = nullptr;
  for (auto& j : jobs) {
    if (!j.pending) {
      job = &j;
      break;
    }
  }
  if (job == nullptr) job = &jobs.emplace_back();
  job->ticket = (*next_ticket)++;
  job->pending = true;
  job->layer = layer;
  job->x = x;
  job->n_tokens = n_tokens;
  job->plan = &plan;
  return *job;
}

// The pending job holding ticket t, marked finished; null for an unknown ticket.
template <class Job>
Job* finish_job(std::vector<Job>& jobs, Ticket t) {
  for (auto& j : jobs) {
    if (j.pending && j.ticket == t) {
      j.pending = false;
      return &j;
    }
  }
  return nullptr;
}

// Runs fn(i) for i in [0, n) on the pool (serially without one). Items are taken dynamically,
// about 16 pieces per thread: experts carry different token counts, and a preempted vCPU must
// not hold half of a stage. The pool takes a std::function; wrapping `fn` by reference keeps it
// in the small-object buffer, so no heap allocation per call.
template <typename F>
void run_items(ThreadPool* pool, int64_t n, const F& fn) {
  auto body = [&fn](int64_t a, int64_t b, int) {
    for (int64_t i = a; i < b; ++i) fn(i);
  };
  if (pool != nullptr)
    pool->parallel_for_dynamic(n, body, std::max<int64_t>(1, n / (16 * int64_t{pool->n_threads()})));
  else
    body(0, n, 0);
}

// One expert of a layer: its stacked tensors and its index in them.
struct ExpertRef {
  const ExpertWeights* w = nullptr;
  int64_t index = 0;
};

// Buffers of run_expert_groups, reused across calls.
struct ExpertGroupScratch {
  QuantizedRows hq;
  std::vector<float> g, u, h;
  std::vector<int32_t> iota;
};

// Stages A-C of the expert FFN for several experts at once (the LocalExecutor's schedule, also
// used by workers): group a computes expert refs[a] for positions [offsets[a], offsets[a+1]);
// position p reads quantized input row tok_of_pos[p] of xq (xq_up for `up` when its activation
// type differs) and gets its raw output in y[p][n_embd]. Three pool jobs in all: gate/up over
// (expert, row chunk), activation + quantization per position, down over (expert, row chunk).
// Every output element is one vec_dot over a whole row, as in expert_ffn(), so the bits do not
// depend on thread count, chunking or grouping. All refs must share one ExpertWeights shape and
// tensor types (the experts of one layer).
void run_expert_groups(std::span<const ExpertRef> refs, const int32_t* offsets, const int32_t* tok_of_pos,
                       const QuantizedRows& xq, const QuantizedRows& xq_up, float* y, ExpertGroupScratch* s,
                       ThreadPool* pool);

}  // namespace moesh
