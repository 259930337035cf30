// MoE routing: from router logits to (expert ids, mixing weights) per token, following
// docs/background/moe-architectures.md §1 steps 2-9 exactly (llama.cpp build_moe_ffn).
//
//   probs = softmax(logits) | sigmoid(logits) | logits        (gating)
//   sel   = probs + sel_bias                                   (bias picks, never weighs)
//   group-limited: keep the n_group_used groups with the best (sum of 2 best sel), others -inf
//   ids   = top-k of sel, descending, ties -> lower expert id
//   w     = probs[ids]; softmax(w) for kSoftmaxWeight; w /= max(sum w, 6.103515625e-5) if norm;
//   w    *= scale if scale not in {0, 1}
#pragma once

#include <cstdint>
#include <vector>

#include "moesh/util/status.h"

namespace moesh {

// GGUF `expert_gating_func` values.
enum class GatingFunc : int { kSoftmax = 1, kSigmoid = 2, kSoftmaxWeight = 3 };
const char* gating_func_name(GatingFunc g);

struct RouterConfig {
  GatingFunc gating = GatingFunc::kSoftmax;
  int n_expert = 0;
  int k = 0;                        // experts per token
  const float* sel_bias = nullptr;  // exp_probs_b [n_expert] or null
  int n_group = 0;                  // <= 1: no group-limited routing
  int n_group_used = 0;
  bool norm_w = false;
  float w_scale = 0.0f;           // 0 or 1: no scaling
  bool select_on_logits = false;  // top-k of the raw logits, gating only for the weights (llama4)

  // n_expert divisible by n_group, k <= experts in kept groups, 1 <= k <= n_expert, ...
  Status validate() const;
};

// The norm floor llama.cpp clamps Σw to (the smallest normal f16).
constexpr float kMoeWeightSumFloor = 6.103515625e-5f;

// Per-token routing for logits[n_tokens][n_expert] -> ids/weights [n_tokens][k] (rank order).
// `scratch` is grown as needed (3 * n_expert floats). cfg must be valid.
void route(const RouterConfig& cfg, const float* logits, int64_t n_tokens, int32_t* ids, float* weights,
           std::vector<float>* scratch);

// Per-token routing margin: how far the router's decision is from flipping, in selection-score
// units (reference README §5, the definition the llama.cpp reference sequences were chosen by):
//   (smallest selection score among the chosen k) − (largest among experts allowed but not chosen)
// and, for group-limited routing, the minimum of that and the group margin (score of the last kept
// group − best dropped group; group score = sum of its two best expert scores). Selection scores:
// router logits for softmax / softmax_weight gating (log-softmax differs by a per-token constant),
// sigmoid(logit) + sel_bias for sigmoid gating (without bias: sigmoid(logit)). With k == n_expert
// and no groups nothing can flip: +inf. A small margin means a tiny perturbation of the hidden state
// (a lossy wire, another summation order) can swap an expert — `moesh gate` rejects such tokens.
// margins [n_tokens]; `scratch` is grown as needed. cfg must be valid.
void routing_margins(const RouterConfig& cfg, const float* logits, int64_t n_tokens, float* margins,
                     std::vector<float>* scratch);

}  // namespace moesh
