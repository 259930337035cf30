// make_plan: the RoutingPlan (which tokens each expert computes) from per-token routing
// decisions. Shared by every executor, so local and remote group tokens the same way.
#include <algorithm>

#include "moesh/moe/executor.h"

namespace moesh {

Status make_plan(int layer, const int32_t* ids, const float* weights, int64_t n_tokens, int k, int64_t n_expert,
                 RoutingPlan* plan) {
  if (k <= 0 || n_tokens < 0) {
    return make_error(StatusCode::kInvalidArgument, "plan: bad k {} or n_tokens {}", k, n_tokens);
  }
  const size_t n_slots = static_cast<size_t>(n_tokens) * static_cast<size_t>(k);
  plan->layer = layer;
  plan->n_tokens = n_tokens;
  plan->k = k;
  plan->ids.assign(ids, ids + n_slots);
  plan->weights.assign(weights, weights + n_slots);
  for (int64_t t = 0; t < n_tokens; ++t) {
    for (int r = 0; r < k; ++r) {
      const int32_t e = ids[t * k + r];
      if (e < 0 || e >= n_expert) {
        return make_error(StatusCode::kOutOfRange, "plan: token {} rank {} expert {} not in [0, {})", t, r, e,
                          n_expert);
      }
      for (int q = 0; q < r; ++q) {
        if (ids[t * k + q] == e) {
          return make_error(StatusCode::kInvalidArgument, "plan: token {} uses expert {} twice", t, e);
        }
      }
    }
  }
  // Counting sort of slots by expert; within an expert, slots stay in token order.
  // work = [start offsets (n_expert + 1) | cursors (n_expert)], reused across calls.
  std::vector<int32_t>& work = plan->work;
  work.assign(static_cast<size_t>(2 * n_expert + 1), 0);
  int32_t* start = work.data();
  int32_t* cursor = start + n_expert + 1;
  for (size_t s = 0; s < n_slots; ++s) start[ids[s] + 1]++;
  for (int64_t e = 0; e < n_expert; ++e) start[e + 1] += start[e];
  std::copy(start, start + n_expert, cursor);
  plan->slots.resize(n_slots);
  for (size_t s = 0; s < n_slots; ++s) plan->slots[static_cast<size_t>(cursor[ids[s]]++)] = static_cast<int32_t>(s);
  plan->experts.clear();
  plan->offsets.clear();
  for (int64_t e = 0; e < n_expert; ++e) {
    if (start[e + 1] > start[e]) {
      plan->experts.push_back(static_cast<int32_t>(e));
      plan->offsets.push_back(start[e]);
    }
  }
  plan->offsets.push_back(static_cast<int32_t>(n_slots));
  return Status::ok();
}

}  // namespace moesh
