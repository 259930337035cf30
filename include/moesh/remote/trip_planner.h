// RTT-aware placement: which experts the backbone keeps locally, within a memory budget, to
// minimise the expected per-token latency of the remote trips.
//
// Per MoE layer a token waits for the slowest worker it needs: latency_l = max over the workers
// holding at least one of its (non-local) routed experts of (RTT_w + compute_w), and 0 when all
// of its experts are local (no trip at all). With measured activation probabilities p[l][e]
// (the share of tokens routing to expert e at layer l) and experts treated as independent draws,
//   P(w needed at l) = 1 - prod_{e held by w, not local} (1 - p[l][e])
//   E[latency_l]     = sum over workers w, slowest first, of cost_w * P(w needed) * prod_{slower w'} (1 - P(w' needed))
// and the objective is sum_l E[latency_l]. That is what plain load balancing (EPLB) ignores: a
// hot expert kept locally only helps if it removes a trip, so whole local layers can beat hot
// experts scattered over all layers — the objective is not additive and the planner searches for
// it: exhaustively when the candidates are few, else greedily over two kinds of move (one expert,
// or every remaining expert of a layer as a bundle) by latency saved per byte.
#pragma once

#include <cstdint>
#include <vector>

#include "moesh/util/status.h"

namespace moesh {

struct TripWorker {
  double rtt_s = 0;                           // measured round trip to the backbone
  double compute_s = 0;                       // per layer call
  std::vector<std::vector<int32_t>> experts;  // [layer]: expert ids it holds
};

struct TripProblem {
  int n_layer = 0, n_expert = 0;
  std::vector<std::vector<double>> p;  // [layer][expert] activation probability per token
  std::vector<TripWorker> workers;
  std::vector<std::vector<uint64_t>> bytes;  // [layer][expert] size of a local copy
  uint64_t budget_bytes = 0;                 // --local-experts-mb
  // What a trip to the chosen holder costs: 0 for the backbone's own copies (no trip); a
  // worker's RTT + compute when the chosen experts go to that worker instead (--rebalance), which
  // then counts as one more holder a token may need.
  double local_cost_s = 0;
};

struct TripPlan {
  std::vector<std::vector<bool>> local;  // [layer][expert]: chosen (kept here, or sent to the target)
  uint64_t bytes = 0;
  double expected_latency_s = 0;  // per token, sum over layers
};

// sum_l E[latency_l] for a choice of local experts ([layer][expert]; empty = none local).
double expected_trip_latency(const TripProblem& pb, const std::vector<std::vector<bool>>& local);

// The planner. kInvalidArgument for an inconsistent problem (shapes, probabilities outside [0,1]).
// Problems with at most kExhaustiveMaxCandidates (layer, expert) pairs are solved exactly.
inline constexpr int kExhaustiveMaxCandidates = 16;
Result<TripPlan> plan_local_experts(const TripProblem& pb);

}  // namespace moesh
