// Planner: who computes each (token, rank) pair. See include/moesh/remote/planner.h.
#include "moesh/remote/planner.h"

#include <fmt/format.h>

#include <algorithm>

namespace moesh {

Planner::Planner(Placement placement, PlannerPolicy policy) : policy_(policy) {
  set_placement(std::move(placement));
}

void Planner::set_placement(Placement placement) {
  placement_ = std::move(placement);
  if (excluded_.size() < static_cast<size_t>(placement_.n_workers())) excluded_.resize(placement_.n_workers(), 0);
  tok_pairs_.assign(excluded_.size(), 0);
}

void Planner::set_excluded(int worker, bool excluded) {
  if (worker < 0) return;
  if (static_cast<size_t>(worker) >= excluded_.size()) {
    excluded_.resize(static_cast<size_t>(worker) + 1, 0);
    tok_pairs_.assign(excluded_.size(), 0);
  }
  excluded_[static_cast<size_t>(worker)] = excluded ? 1 : 0;
}

bool Planner::excluded(int worker) const {
  return worker >= 0 && static_cast<size_t>(worker) < excluded_.size() && excluded_[static_cast<size_t>(worker)] != 0;
}

void Planner::set_worker_costs(std::vector<double> costs) {
  costs_ = std::move(costs);
}

void Planner::set_computed_locally(std::vector<uint8_t> mask) {
  local_mask_ = std::move(mask);
}

int Planner::choose(int layer, int32_t e, int skip, const std::vector<int>& tok_pairs) const {
  if ((policy_.prefer_local || computed_locally(layer, e)) && placement_.local_copy(layer, e)) return Placement::kLocal;
  auto cost = [&](int32_t w) { return static_cast<size_t>(w) < costs_.size() ? costs_[static_cast<size_t>(w)] : 0.0; };
  double nearest = -1;
  for (const int32_t w : placement_.holders(layer, e)) {
    if (w == skip || excluded(w)) continue;
    if (nearest < 0 || cost(w) < nearest) nearest = cost(w);
  }
  int o = Placement::kNone;
  for (const int32_t w : placement_.holders(layer, e)) {
    if (w == skip || excluded(w)) continue;
    if (cost(w) > nearest * policy_.near_factor + policy_.near_slack_s)
      continue;  // a far replica: only when no near one lives
    // Fewest of this token's pairs so far; ties keep the lowest index (holders are ascending).
    if (o == Placement::kNone || tok_pairs[static_cast<size_t>(w)] < tok_pairs[static_cast<size_t>(o)]) o = w;
  }
  if (o == Placement::kNone && placement_.local_copy(layer, e)) return Placement::kLocal;
  return o;
}

Status Planner::no_holder_error(int layer, std::vector<int> experts) const {
  std::sort(experts.begin(), experts.end());
  experts.erase(std::unique(experts.begin(), experts.end()), experts.end());
  return make_error(StatusCode::kUnavailable,
                    "layer {}: no live holder for expert(s) {} (every worker holding them is excluded or failed, "
                    "and the backbone has no copy)",
                    layer, format_id_ranges(experts));
}

Status Planner::assign(int layer, const RoutingPlan& plan, std::vector<int32_t>* who) const {
  const int k = plan.k;
  const int64_t n_tok = plan.n_tokens;
  if (layer < 0 || layer >= placement_.n_layer() || k < 1 ||
      plan.ids.size() != static_cast<size_t>(n_tok) * static_cast<size_t>(k)) {
    return make_error(StatusCode::kInvalidArgument, "planner: bad layer {} or plan ({} tokens, k {})", layer, n_tok, k);
  }
  if (tok_pairs_.size() < excluded_.size()) tok_pairs_.assign(excluded_.size(), 0);
  who->resize(plan.ids.size());
  std::vector<int> missing;
  for (int64_t t = 0; t < n_tok; ++t) {
    for (int rk = 0; rk < k; ++rk) {
      const size_t s = static_cast<size_t>(t * k + rk);
      const int32_t e = plan.ids[s];
      if (e < 0 || e >= placement_.n_expert() || placement_.owner(layer, e) == Placement::kNone) {
        return make_error(StatusCode::kInvalidArgument,
                          "remote executor: layer {} expert {} has no owner (dense layer or bad id)", layer, e);
      }
      const int o = choose(layer, e, Placement::kNone, tok_pairs_);
      if (o == Placement::kNone) missing.push_back(e);
      (*who)[s] = o;
      if (o >= 0) ++tok_pairs_[static_cast<size_t>(o)];
    }
    for (int rk = 0; rk < k; ++rk) {
      const int o = (*who)[static_cast<size_t>(t * k + rk)];
      if (o >= 0) tok_pairs_[static_cast<size_t>(o)] = 0;
    }
  }
  if (!missing.empty()) return no_holder_error(layer, std::move(missing));
  return Status::ok();
}

Status Planner::reassign(int layer, const RoutingPlan& plan, int failed, std::vector<int32_t>* who) const {
  const int k = plan.k;
  const int64_t n_tok = plan.n_tokens;
  if (layer < 0 || layer >= placement_.n_layer() || k < 1 || who->size() != plan.ids.size() ||
      plan.ids.size() != static_cast<size_t>(n_tok) * static_cast<size_t>(k)) {
    return make_error(StatusCode::kInvalidArgument, "planner: bad reassign of layer {}", layer);
  }
  if (tok_pairs_.size() < excluded_.size()) tok_pairs_.assign(excluded_.size(), 0);
  std::vector<int32_t> out = *who;
  std::vector<int> missing;
  for (int64_t t = 0; t < n_tok; ++t) {
    // The token's surviving pairs count first, so the moved ones balance against them.
    for (int rk = 0; rk < k; ++rk) {
      const int o = out[static_cast<size_t>(t * k + rk)];
      if (o >= 0 && o != failed && static_cast<size_t>(o) < tok_pairs_.size()) ++tok_pairs_[static_cast<size_t>(o)];
    }
    for (int rk = 0; rk < k; ++rk) {
      const size_t s = static_cast<size_t>(t * k + rk);
      if (out[s] != failed) continue;
      const int o = choose(layer, plan.ids[s], failed, tok_pairs_);
      if (o == Placement::kNone) {
        missing.push_back(plan.ids[s]);
        continue;
      }
      out[s] = o;
      if (o >= 0) ++tok_pairs_[static_cast<size_t>(o)];
    }
    for (int rk = 0; rk < k; ++rk) {
      const int o = out[static_cast<size_t>(t * k + rk)];
      if (o >= 0 && static_cast<size_t>(o) < tok_pairs_.size()) tok_pairs_[static_cast<size_t>(o)] = 0;
    }
  }
  if (!missing.empty()) return no_holder_error(layer, std::move(missing));
  *who = std::move(out);
  return Status::ok();
}

}  // namespace moesh
