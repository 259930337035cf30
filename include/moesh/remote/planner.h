// The planner: which holder computes each (token, rank) pair of one layer's routing plan.
//
// Policy, in order:
//   - a pair goes to a live worker holding its expert; when several do (replicas), to the one
//     with the fewest of this token's pairs so far (ties: the lowest index), so a token's experts
//     spread evenly over replicas. The choice depends only on the token's own routing, never on
//     the other tokens of the batch, so partial sums are batch-invariant;
//   - among replicas only the NEAR ones compete: with measured per-worker trip costs
//     (set_worker_costs: RTT + compute), holders costing more than near_factor x the cheapest live
//     holder get no pairs while a near one is live, so a replica on a near worker takes a layer
//     off a far one (the far trip is not made at all); without costs every holder is near;
//   - with `prefer_local`, an expert the backbone has a copy of is computed locally even when a
//     worker holds it; set_computed_locally does the same for a chosen set (the hot experts kept
//     within --local-experts-mb, trip_planner.h);
//   - a pair whose every worker holder is excluded (failed, evicted) falls back to the backbone's
//     copy; with neither it is an error naming the layer and experts.
// The planner knows nothing of sockets or models, so a failed request's pairs can be re-planned
// onto other holders (reassign) without touching the model code.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "moesh/moe/executor.h"
#include "moesh/remote/placement.h"
#include "moesh/util/status.h"

namespace moesh {

struct PlannerPolicy {
  bool prefer_local = false;
  // Replicas costing at most near_factor x the cheapest live holder + near_slack_s share the load
  // (the slack keeps LAN-scale noise in measured RTTs from unbalancing equal replicas).
  double near_factor = 1.25;
  double near_slack_s = 0.002;
};

class Planner {
 public:
  Planner() = default;
  explicit Planner(Placement placement, PlannerPolicy policy = {});

  const Placement& placement() const { return placement_; }
  // Replaces the placement (workers joined, left, or took replicas); exclusions are kept.
  void set_placement(Placement placement);
  const PlannerPolicy& policy() const { return policy_; }

  // An excluded worker gets no pairs until it is included again.
  void set_excluded(int worker, bool excluded);
  bool excluded(int worker) const;
  // Per worker (by index) the cost of a trip in seconds; empty: unknown, every holder is near.
  void set_worker_costs(std::vector<double> costs);
  const std::vector<double>& worker_costs() const { return costs_; }
  // [layer * n_expert + expert] != 0: the backbone computes this expert when it has a copy, even
  // though a worker holds it. Empty: none.
  void set_computed_locally(std::vector<uint8_t> mask);
  bool computed_locally(int layer, int expert) const {
    const size_t i =
        static_cast<size_t>(layer) * static_cast<size_t>(placement_.n_expert()) + static_cast<size_t>(expert);
    return i < local_mask_.size() && local_mask_[i] != 0;
  }

  // who[t*k + r] := worker index or Placement::kLocal for every slot of `plan`. kInvalidArgument
  // for a bad layer or expert id; kUnavailable naming the experts with no live holder.
  Status assign(int layer, const RoutingPlan& plan, std::vector<int32_t>* who) const;

  // Re-plans the slots `who` gives to `failed` onto other live holders (or the backbone's copy),
  // as if `failed` were excluded; every other slot keeps its holder. kUnavailable naming the
  // experts that have no other holder (who is then unchanged).
  Status reassign(int layer, const RoutingPlan& plan, int failed, std::vector<int32_t>* who) const;

 private:
  // The holder of expert e for a token whose pairs so far are counted in tok_pairs; kNone if none.
  int choose(int layer, int32_t e, int skip, const std::vector<int>& tok_pairs) const;
  Status no_holder_error(int layer, std::vector<int> experts) const;

  Placement placement_;
  PlannerPolicy policy_;
  std::vector<uint8_t> excluded_;
  std::vector<double> costs_;
  std::vector<uint8_t> local_mask_;
  mutable std::vector<int> tok_pairs_;  // scratch: pairs of the current token per worker
};

}  // namespace moesh
