// Combiner: exact rank-order sums and partial sums. See include/moesh/remote/combiner.h.
#include "moesh/remote/combiner.h"

#include <algorithm>
#include <vector>

#include "moesh/moe/expert_stages.h"

namespace moesh {

void combine_exact(const RoutingPlan& plan, std::span<const float* const> slot_rows, int64_t n_embd, float* out,
                   ThreadPool* pool, std::span<const float* const> prefix_rows, std::span<const uint8_t> prefix_len) {
  const int k = plan.k;
  auto token = [&](int64_t t) {
    float* o = out + t * n_embd;
    const float* wt = plan.weights.data() + t * k;
    int rk = 0;
    if (!prefix_rows.empty() && prefix_rows[static_cast<size_t>(t)] != nullptr) {
      std::copy_n(prefix_rows[static_cast<size_t>(t)], n_embd, o);  // the sum through its ranks, as it stands here
      rk = prefix_len[static_cast<size_t>(t)];
    }
    // LocalExecutor's stage D, operation for operation: out = y0*w0; out = out + yr*wr.
    for (; rk < k; ++rk) rank_sum_step(o, slot_rows[static_cast<size_t>(t * k + rk)], wt[rk], n_embd, rk == 0);
  };
  run_items(plan.n_tokens > 1 ? pool : nullptr, plan.n_tokens, token);
}

void combine_partial(const RoutingPlan& plan, std::span<const int32_t> local_slots, const float* ylocal,
                     std::span<const PartialRows> workers, int64_t n_embd, float* out, std::vector<uint8_t>* seen) {
  const int k = plan.k;
  std::vector<uint8_t>& has = *seen;
  has.assign(static_cast<size_t>(plan.n_tokens), 0);
  for (size_t i = 0; i < local_slots.size(); ++i) {
    const int32_t s = local_slots[i];
    const int64_t t = s / k;
    rank_sum_step(out + t * n_embd, ylocal + static_cast<int64_t>(i) * n_embd, plan.weights[static_cast<size_t>(s)],
                  n_embd, !has[static_cast<size_t>(t)]);
    has[static_cast<size_t>(t)] = 1;
  }
  for (const PartialRows& w : workers) {
    for (size_t j = 0; j < w.tokens.size(); ++j) {
      const int64_t t = w.tokens[j];
      const float* p = w.rows + static_cast<int64_t>(j) * n_embd;
      float* o = out + t * n_embd;
      if (!has[static_cast<size_t>(t)]) {
        std::copy_n(p, n_embd, o);
        has[static_cast<size_t>(t)] = 1;
      } else {
        for (int64_t d = 0; d < n_embd; ++d) o[d] = o[d] + p[d];
      }
    }
  }
}

}  // namespace moesh
