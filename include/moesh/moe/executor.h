// The dispatch point of the MoE block: routing plan, expert FFN definition, and the
// asynchronous ExpertExecutor interface (docs/ARCHITECTURE.md "The dispatch point").
//
// After routing, the model builds a RoutingPlan (per token: k expert ids in router rank order and
// their final mixing weights) and hands it to an ExpertExecutor:
//
//   Ticket t = executor.submit(layer, x, n_tokens, plan);   // returns at once
//   ... shared experts / other local work ...
//   Result<std::span<const float>> routed = executor.wait(t);   // [n_tokens][n_embd]
//
// The routed sum of token i is formed in RANK ORDER: out = w_0*y_0; out += w_1*y_1; ... with
// y_r = expert_ffn(ids[i][r], x_i) in f32. Every executor (LocalExecutor here, RemoteExecutor in
// src/remote in EXACT mode) uses this order through rank_sum_step, so remote exact execution gives
// the local bits for any placement and batch.
//
// expert_ffn() is the reference definition of a routed expert (one expert at a time). The
// LocalExecutor and the worker process both compute with run_expert_groups
// (moesh/moe/expert_stages.h), which schedules many experts at once yet computes every output
// element as the same single dot product, so its bits are expert_ffn()'s.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "moesh/tensor/ops.h"
#include "moesh/tensor/tensor.h"
#include "moesh/tensor/threadpool.h"
#include "moesh/util/status.h"

namespace moesh {

// Activation of the gated expert FFN. kSilu: h = silu(g) * u; kSwigluOai (gpt-oss):
// g' = min(g, 7), u' = clamp(u, -7, 7), h = g' * sigmoid(1.702 g') * (u' + 1). kSitu (kimi-k3):
// h = b·tanh(g/b)·sigmoid(g) · l·tanh(u/l) with b = ExpertFfn::situ_beta, l = situ_linear_beta.
enum class ExpertActivation { kSilu = 0, kSwigluOai, kSitu, kCOUNT };
const char* expert_activation_name(ExpertActivation a);  // "silu" | "swiglu-oai" | "situ"

// The definition of a routed expert FFN, fixed by the architecture: the backbone and every worker
// must compute the same function, so it travels in the swarm handshake (wire HELLO v4).
struct ExpertFfn {
  ExpertActivation act = ExpertActivation::kSilu;
  bool biases = false;  // gate/up/down have per-expert bias vectors (gpt-oss)
  // The mixing weight multiplies the expert's INPUT and the outputs are summed unweighted
  // (llama4). The backbone applies it before dispatch (moe_begin), so executors and workers see
  // ordinary rows with weight 1; it is part of the definition so both ends agree on it.
  bool input_scaled = false;
  // Per block (step35's swiglu_clamp_exp, indexed by block): a limit L > 0 clamps kSilu as
  // h = min(silu(g), L) * clamp(u, -L, L); 0 or a block past the end: plain. The values come
  // from the model file on both ends (its metadata is part of the model identity).
  std::vector<float> swiglu_limit;
  // kSitu's two constants (activation.situ_beta / situ_linear_beta of the model file).
  float situ_beta = 0.0f, situ_linear_beta = 0.0f;

  float swiglu_limit_of(int64_t layer) const {
    return layer >= 0 && layer < static_cast<int64_t>(swiglu_limit.size()) ? swiglu_limit[static_cast<size_t>(layer)]
                                                                           : 0.0f;
  }
  bool has_swiglu_limits() const;  // some block has a limit > 0

  bool operator==(const ExpertFfn&) const = default;
  // "silu", "swiglu-oai+bias", "silu, weight on input", "silu, clamped per layer"
  std::string describe() const;
};

// A layer's stacked routed-expert tensors. gate/up: ne = [n_embd, n_ff_exp, n_expert];
// down: ne = [n_ff_exp, n_embd, n_expert]. Expert e is the slab TensorView::expert(e).
// Optional biases (ExpertFfn::biases): gate_b/up_b ne = [n_ff_exp, n_expert], down_b
// ne = [n_embd, n_expert], F32; expert e's bias is row e.
struct ExpertWeights {
  TensorView gate, up, down;
  TensorView gate_b, up_b, down_b;
  ExpertActivation act = ExpertActivation::kSilu;
  float swiglu_limit = 0.0f;                        // this layer's ExpertFfn::swiglu_limit_of (> 0: clamped kSilu)
  float situ_beta = 0.0f, situ_linear_beta = 0.0f;  // kSitu's constants (ExpertFfn)

  bool has_biases() const { return gate_b.valid(); }

  bool valid() const { return gate.valid() && up.valid() && down.valid(); }
  int64_t n_embd() const { return gate.ne[0]; }
  int64_t n_ff() const { return gate.ne[1]; }
  int64_t n_expert() const { return gate.ne[2]; }
  // Checks shapes and that the types are computable; the message names the offending tensor.
  Status validate() const;
};

// Reusable buffers for expert_ffn (grown on demand, never shrunk: no per-token heap churn).
struct ExpertScratch {
  QuantizedRows xq_up;  // x re-quantized for `up` when its vec_dot_type differs from gate's
  QuantizedRows hq;     // h rows quantized for `down`
  std::vector<float> g, u, h;
};

// The routed expert FFN for expert `e`: y[j] = down_e( act(gate_e x, up_e x) ) for the n_sel token
// rows rows[j] of `xq` (x quantized to vec_dot_type(w.gate.type), one row per token; quantize each
// token once and reuse it across experts). y has row stride ldy >= n_embd. Raw output: the caller
// applies the mixing weight. `x_f32` (the same rows in f32) is used only when `up` needs a
// different activation type than `gate`. pool may be null.
void expert_ffn(const ExpertWeights& w, int64_t e, const QuantizedRows& xq, const float* x_f32, const int32_t* rows,
                int64_t n_sel, float* y, size_t ldy, ExpertScratch* s, ThreadPool* pool);

// One step of the rank-order weighted sum — THE arithmetic of the routed sum, shared by the
// local executor, the remote executor's exact combine and the worker's partial sums, so they
// cannot drift apart: the first term (rank 0) is o = y*w, every later one o = o + y*w (two
// roundings, never fused: the project builds with -ffp-contract=off).
inline void rank_sum_step(float* o, const float* y, float w, int64_t n, bool first) {
  if (first) {
    for (int64_t d = 0; d < n; ++d) o[d] = y[d] * w;
  } else {
    for (int64_t d = 0; d < n; ++d) o[d] = o[d] + y[d] * w;
  }
}

// Which tokens each expert must compute, derived from per-token routing decisions.
// Invariants: ids/weights are [n_tokens][k] in router rank order; experts[] is ascending and
// unique; slots[offsets[a] .. offsets[a+1]) are the (token*k + rank) slots routed to experts[a],
// ascending by token.
struct RoutingPlan {
  int layer = 0;
  int64_t n_tokens = 0;
  int k = 0;
  std::vector<int32_t> ids;      // [n_tokens][k]
  std::vector<float> weights;    // [n_tokens][k]
  std::vector<int32_t> experts;  // experts with at least one token
  std::vector<int32_t> offsets;  // experts.size() + 1
  std::vector<int32_t> slots;    // n_tokens * k
  std::vector<int32_t> work;     // make_plan's reusable counting buffer

  int64_t n_active() const { return static_cast<int64_t>(experts.size()); }
};

// Fills `plan` (reusing its buffers) from ids/weights [n_tokens][k]. Rejects an id outside
// [0, n_expert) or an expert used twice by one token.
Status make_plan(int layer, const int32_t* ids, const float* weights, int64_t n_tokens, int k, int64_t n_expert,
                 RoutingPlan* plan);

// Handle of one submitted MoE dispatch.
using Ticket = uint64_t;

class ExpertExecutor {
 public:
  virtual ~ExpertExecutor() = default;
  // Starts computing the routed sum for `plan` over x[n_tokens][n_embd]. Returns at once; errors
  // are reported by wait(). x and plan must stay valid and unchanged until wait(ticket) returns.
  virtual Ticket submit(int layer, const float* x, int64_t n_tokens, const RoutingPlan& plan) = 0;
  // Blocks until the ticket's routed sum [n_tokens][n_embd] is ready. The span points into
  // executor-owned memory that stays valid until the next submit() on this executor.
  virtual Result<std::span<const float>> wait(Ticket t) = 0;
  // The pool for expert work this executor does in-process (the Context hands over its own when
  // it is created, so every executor's local share uses the context's threads). Default: unused.
  virtual void set_pool(ThreadPool* pool) { (void)pool; }
  // True when submit() sends the work elsewhere (workers over a network) and returns before it
  // is done, so the caller gains by computing something else — another micro-batch — before
  // wait(). Several tickets may be pending at once on every executor; only these overlap them.
  virtual bool overlaps_submits() const { return false; }
  // Called by the owner when it has nothing to run (no ticket pending), about once a second:
  // an executor with remote parts takes in workers that came back or joined. Default: nothing.
  virtual void maintain() {}
};

// Another context's executor, borrowed by a second context in the same thread of control: the
// work is forwarded, the pool stays the owner's (set_pool is the owner's to call, and a borrower
// dying must not take the owner's pool away). A span run here on a backbone (SpanClient) sends
// its blocks' routed experts to the backbone's workers this way, not to weights it may not hold.
class BorrowedExecutor final : public ExpertExecutor {
 public:
  explicit BorrowedExecutor(std::shared_ptr<ExpertExecutor> owner) : owner_(std::move(owner)) {}
  Ticket submit(int layer, const float* x, int64_t n_tokens, const RoutingPlan& plan) override {
    return owner_->submit(layer, x, n_tokens, plan);
  }
  Result<std::span<const float>> wait(Ticket t) override { return owner_->wait(t); }
  bool overlaps_submits() const override { return owner_->overlaps_submits(); }

 private:
  std::shared_ptr<ExpertExecutor> owner_;
};

// Runs every routed expert in this process on the compute pool. `layers[l]` are the stacked
// expert tensors of layer l (invalid for dense layers). Parallel over (expert, output-row chunk),
// each output element computed by one dot product, so results do not depend on thread count.
class LocalExecutor final : public ExpertExecutor {
 public:
  LocalExecutor(std::vector<ExpertWeights> layers, ThreadPool* pool);
  ~LocalExecutor() override;
  void set_pool(ThreadPool* pool) override;
  Ticket submit(int layer, const float* x, int64_t n_tokens, const RoutingPlan& plan) override;
  Result<std::span<const float>> wait(Ticket t) override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace moesh
