// MoE routing (docs/background/moe-architectures.md §1 steps 2-9), per token and independent of other tokens.
#include "moesh/moe/routing.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "moesh/tensor/ops.h"

namespace moesh {

const char* gating_func_name(GatingFunc g) {
  switch (g) {
    case GatingFunc::kSoftmax:
      return "softmax";
    case GatingFunc::kSigmoid:
      return "sigmoid";
    case GatingFunc::kSoftmaxWeight:
      return "softmax_weight";
  }
  return "?";
}

Status RouterConfig::validate() const {
  if (n_expert <= 0) return make_error(StatusCode::kInvalidArgument, "n_expert {} must be positive", n_expert);
  if (k <= 0 || k > n_expert) {
    return make_error(StatusCode::kInvalidArgument, "k = {} must be in [1, n_expert = {}]", k, n_expert);
  }
  if (gating != GatingFunc::kSoftmax && gating != GatingFunc::kSigmoid && gating != GatingFunc::kSoftmaxWeight) {
    return make_error(StatusCode::kInvalidArgument, "unknown gating function {}", static_cast<int>(gating));
  }
  if (n_group > 1) {
    if (n_group > 256) {
      return make_error(StatusCode::kInvalidArgument, "n_group {} exceeds 256", n_group);
    }
    if (n_expert % n_group != 0) {
      return make_error(StatusCode::kInvalidArgument, "n_expert {} is not a multiple of n_group {}", n_expert, n_group);
    }
    if (n_group_used <= 0 || n_group_used > n_group) {
      return make_error(StatusCode::kInvalidArgument, "n_group_used {} must be in [1, n_group = {}]", n_group_used,
                        n_group);
    }
    const int per_group = n_expert / n_group;
    if (per_group < 2) {
      return make_error(StatusCode::kInvalidArgument, "group-limited routing needs >= 2 experts per group (have {})",
                        per_group);
    }
    if (k > n_group_used * per_group) {
      return make_error(StatusCode::kInvalidArgument, "k = {} exceeds the {} experts of {} kept groups", k,
                        n_group_used * per_group, n_group_used);
    }
  }
  return Status::ok();
}

void route(const RouterConfig& cfg, const float* logits, int64_t n_tokens, int32_t* ids, float* weights,
           std::vector<float>* scratch) {
  const int ne = cfg.n_expert;
  const int k = cfg.k;
  const bool grouped = cfg.n_group > 1;
  const size_t need = static_cast<size_t>(2 * ne + cfg.n_group + 1);
  if (scratch->size() < need) scratch->resize(need);
  float* probs = scratch->data();
  float* sel = probs + ne;
  float* group_score = sel + ne;
  int32_t group_idx[256];  // n_group is small (DeepSeek-V3: 8)
  const float neg_inf = -std::numeric_limits<float>::infinity();

  for (int64_t t = 0; t < n_tokens; ++t) {
    const float* lg = logits + t * ne;
    int32_t* id = ids + t * k;
    float* w = weights + t * k;

    // 2. gating over the full expert set
    switch (cfg.gating) {
      case GatingFunc::kSoftmax:
        std::copy(lg, lg + ne, probs);
        softmax(probs, ne);
        break;
      case GatingFunc::kSigmoid:
        for (int e = 0; e < ne; ++e) probs[e] = sigmoid(lg[e]);
        break;
      case GatingFunc::kSoftmaxWeight:
        std::copy(lg, lg + ne, probs);
        break;
    }
    // 3. selection bias: chooses, never weighs
    if (cfg.select_on_logits) {
      std::copy(lg, lg + ne, sel);  // llama4: top-k of the raw logits, sigmoid only weighs
    } else if (cfg.sel_bias != nullptr) {
      for (int e = 0; e < ne; ++e) sel[e] = probs[e] + cfg.sel_bias[e];
    } else {
      std::copy(probs, probs + ne, sel);
    }
    // 4. group-limited routing: group score = sum of its two best selection scores
    if (grouped) {
      const int per = ne / cfg.n_group;
      for (int g = 0; g < cfg.n_group; ++g) {
        const float* s = sel + g * per;
        float b1 = neg_inf, b2 = neg_inf;
        for (int j = 0; j < per; ++j) {
          if (s[j] > b1) {
            b2 = b1;
            b1 = s[j];
          } else if (s[j] > b2) {
            b2 = s[j];
          }
        }
        group_score[g] = b1 + b2;
      }
      top_k(group_score, cfg.n_group, cfg.n_group_used, group_idx);
      for (int g = 0; g < cfg.n_group; ++g) {
        bool kept = false;
        for (int j = 0; j < cfg.n_group_used; ++j) kept = kept || group_idx[j] == g;
        if (!kept) std::fill(sel + g * per, sel + (g + 1) * per, neg_inf);
      }
    }
    // 5. top-k by selection score (ties -> lower id)
    top_k(sel, ne, k, id);
    // 6. weights from the unbiased probabilities
    for (int j = 0; j < k; ++j) w[j] = probs[id[j]];
    // 7. softmax over the k selected (gpt-oss style)
    if (cfg.gating == GatingFunc::kSoftmaxWeight) softmax(w, k);
    // 8. renormalise: ggml sums the row in double, clamps, then divides in f32
    if (cfg.norm_w) {
      double sum = 0.0;
      for (int j = 0; j < k; ++j) sum += w[j];
      const float s = std::max(static_cast<float>(sum), kMoeWeightSumFloor);
      for (int j = 0; j < k; ++j) w[j] = w[j] / s;
    }
    // 9. scale
    if (cfg.w_scale != 0.0f && cfg.w_scale != 1.0f) {
      for (int j = 0; j < k; ++j) w[j] = w[j] * cfg.w_scale;
    }
  }
}

namespace {

// Largest and second-largest of s[0..n) (n >= 2 for groups; -inf when absent).
void best_two(const float* s, int n, float* b1, float* b2) {
  *b1 = -std::numeric_limits<float>::infinity();
  *b2 = *b1;
  for (int j = 0; j < n; ++j) {
    if (s[j] > *b1) {
      *b2 = *b1;
      *b1 = s[j];
    } else if (s[j] > *b2) {
      *b2 = s[j];
    }
  }
}

}  // namespace

void routing_margins(const RouterConfig& cfg, const float* logits, int64_t n_tokens, float* margins,
                     std::vector<float>* scratch) {
  const int ne = cfg.n_expert;
  const int k = cfg.k;
  const bool grouped = cfg.n_group > 1;
  const int ng = grouped ? cfg.n_group : 1;
  const size_t need = static_cast<size_t>(ne + ng);
  if (scratch->size() < need) scratch->resize(need);
  float* sel = scratch->data();
  float* group_score = sel + ne;
  int32_t group_idx[256];
  std::vector<int32_t> ids(static_cast<size_t>(k));  // once per call (per layer), not per token
  const float inf = std::numeric_limits<float>::infinity();

  for (int64_t t = 0; t < n_tokens; ++t) {
    const float* lg = logits + t * ne;
    // Selection scores in the space the README measures margins in.
    if (cfg.gating == GatingFunc::kSigmoid && !cfg.select_on_logits) {
      for (int e = 0; e < ne; ++e) sel[e] = sigmoid(lg[e]);
    } else {
      std::copy(lg, lg + ne, sel);
    }
    if (cfg.sel_bias != nullptr) {
      for (int e = 0; e < ne; ++e) sel[e] += cfg.sel_bias[e];
    }
    float margin = inf;
    if (grouped) {
      const int per = ne / ng;
      for (int g = 0; g < ng; ++g) {
        float b1, b2;
        best_two(sel + g * per, per, &b1, &b2);
        group_score[g] = b1 + b2;
      }
      top_k(group_score, ng, cfg.n_group_used, group_idx);
      float best_dropped = -inf;
      for (int g = 0; g < ng; ++g) {
        bool kept = false;
        for (int j = 0; j < cfg.n_group_used; ++j) kept = kept || group_idx[j] == g;
        if (!kept) {
          best_dropped = std::max(best_dropped, group_score[g]);
          std::fill(sel + g * per, sel + (g + 1) * per, -inf);  // not allowed
        }
      }
      if (cfg.n_group_used < ng) margin = group_score[group_idx[cfg.n_group_used - 1]] - best_dropped;
    }
    // top_k puts the chosen in descending order: ids[k-1] is the weakest chosen.
    top_k(sel, ne, k, ids.data());
    const float weakest = sel[ids[k - 1]];
    for (int j = 0; j < k; ++j) sel[ids[j]] = -inf;
    float best_other = -inf;
    for (int e = 0; e < ne; ++e) best_other = std::max(best_other, sel[e]);
    if (best_other > -inf) margin = std::min(margin, weakest - best_other);
    margins[t] = margin;
  }
}

}  // namespace moesh
