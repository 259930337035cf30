// The combiner: one layer's routed output from expert results wherever they were computed.
//
// EXACT   — every (token, rank) slot's raw expert output y; out = w0*y0, then out = out + wr*yr in
//           router rank order: rank_sum_step, the LocalExecutor's float operations, which is what
//           makes exact remote execution bit-identical to local for any placement.
// PARTIAL — each worker returns one Σ w·y per token; the backbone's own pairs are summed first
//           (rank order), then each worker's partial is added in worker order — a fixed order
//           whatever the routing or arrival order. Lossy (other association); `moesh gate`.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "moesh/moe/executor.h"
#include "moesh/tensor/threadpool.h"

namespace moesh {

// slot_rows[t*k + r] points at the raw output of slot (t, r), n_embd floats. out: [n_tokens][n_embd].
// Rank-prefix sums (optional, per token): prefix_rows[t] non-null is w0*y0 + ... + wj*yj summed
// in rank order with these same operations (a worker that held ranks 0..j of token t and answered
// its EXACT request summed: the bits the sum would have here after rank j), prefix_len[t] = j+1;
// the sum goes on from rank j+1 with slot_rows, so the result is unchanged.
void combine_exact(const RoutingPlan& plan, std::span<const float* const> slot_rows, int64_t n_embd, float* out,
                   ThreadPool* pool, std::span<const float* const> prefix_rows = {},
                   std::span<const uint8_t> prefix_len = {});

// One worker's partial sums: rows[j] belongs to batch token tokens[j].
struct PartialRows {
  std::span<const int32_t> tokens;
  const float* rows = nullptr;
};
// local_slots: the slots the backbone computed, ylocal[i] the raw output of local_slots[i].
// workers: in worker order. Every token must be covered by at least one source. `seen` is
// reusable scratch.
void combine_partial(const RoutingPlan& plan, std::span<const int32_t> local_slots, const float* ylocal,
                     std::span<const PartialRows> workers, int64_t n_embd, float* out, std::vector<uint8_t>* seen);

}  // namespace moesh
