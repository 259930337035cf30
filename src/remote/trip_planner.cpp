// RTT-aware choice of local experts. See include/moesh/remote/trip_planner.h.
#include "moesh/remote/trip_planner.h"

#include <algorithm>
#include <numeric>

namespace moesh {

namespace {

double layer_latency(const TripProblem& pb, int l, const std::vector<std::vector<bool>>& local) {
  // Workers by cost, slowest first: the slowest needed one sets the layer's latency.
  std::vector<std::pair<double, double>> need;  // (cost, P(needed))
  for (const TripWorker& w : pb.workers) {
    if (static_cast<size_t>(l) >= w.experts.size()) continue;
    double none = 1.0;
    for (const int32_t e : w.experts[static_cast<size_t>(l)]) {
      if (!local.empty() && local[static_cast<size_t>(l)][static_cast<size_t>(e)]) continue;
      none *= 1.0 - pb.p[static_cast<size_t>(l)][static_cast<size_t>(e)];
    }
    if (none < 1.0) need.emplace_back(w.rtt_s + w.compute_s, 1.0 - none);
  }
  if (pb.local_cost_s > 0 && !local.empty()) {  // the chosen ones' holder is a trip too
    double none = 1.0;
    for (int e = 0; e < pb.n_expert; ++e)
      if (local[static_cast<size_t>(l)][static_cast<size_t>(e)])
        none *= 1.0 - pb.p[static_cast<size_t>(l)][static_cast<size_t>(e)];
    if (none < 1.0) need.emplace_back(pb.local_cost_s, 1.0 - none);
  }
  std::sort(need.begin(), need.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  double e = 0, none_slower = 1.0;
  for (const auto& [cost, pn] : need) {
    e += cost * pn * none_slower;
    none_slower *= 1.0 - pn;
  }
  return e;
}

Status check(const TripProblem& pb) {
  if (pb.n_layer <= 0 || pb.n_expert <= 0 || pb.p.size() != static_cast<size_t>(pb.n_layer) ||
      pb.bytes.size() != static_cast<size_t>(pb.n_layer)) {
    return make_error(StatusCode::kInvalidArgument, "trip planner: inconsistent shapes");
  }
  if (!(pb.local_cost_s >= 0)) return make_error(StatusCode::kInvalidArgument, "trip planner: local cost < 0");
  for (int l = 0; l < pb.n_layer; ++l) {
    if (pb.p[l].size() != static_cast<size_t>(pb.n_expert) || pb.bytes[l].size() != static_cast<size_t>(pb.n_expert)) {
      return make_error(StatusCode::kInvalidArgument, "trip planner: layer {} has the wrong number of experts", l);
    }
    for (double v : pb.p[l]) {
      if (!(v >= 0.0 && v <= 1.0)) {
        return make_error(StatusCode::kInvalidArgument, "trip planner: layer {} probability {} outside [0, 1]", l, v);
      }
    }
  }
  for (const TripWorker& w : pb.workers) {
    for (const auto& ids : w.experts) {
      for (const int32_t e : ids) {
        if (e < 0 || e >= pb.n_expert)
          return make_error(StatusCode::kInvalidArgument, "trip planner: bad expert {}", e);
      }
    }
  }
  return Status::ok();
}

}  // namespace

double expected_trip_latency(const TripProblem& pb, const std::vector<std::vector<bool>>& local) {
  double total = 0;
  for (int l = 0; l < pb.n_layer; ++l) total += layer_latency(pb, l, local);
  return total;
}

Result<TripPlan> plan_local_experts(const TripProblem& pb) {
  MOESH_RETURN_IF_ERROR(check(pb));
  // Candidates: experts some worker holds (keeping one locally can remove a trip).
  std::vector<std::pair<int, int>> cand;
  for (int l = 0; l < pb.n_layer; ++l) {
    std::vector<bool> held(static_cast<size_t>(pb.n_expert), false);
    for (const TripWorker& w : pb.workers) {
      if (static_cast<size_t>(l) < w.experts.size()) {
        for (const int32_t e : w.experts[static_cast<size_t>(l)]) held[static_cast<size_t>(e)] = true;
      }
    }
    for (int e = 0; e < pb.n_expert; ++e) {
      if (held[static_cast<size_t>(e)] && pb.bytes[l][e] <= pb.budget_bytes) cand.emplace_back(l, e);
    }
  }
  TripPlan best;
  best.local.assign(static_cast<size_t>(pb.n_layer), std::vector<bool>(static_cast<size_t>(pb.n_expert), false));
  best.expected_latency_s = expected_trip_latency(pb, best.local);
  if (cand.size() <= static_cast<size_t>(kExhaustiveMaxCandidates)) {
    // Exact: every subset within the budget.
    const uint32_t n = static_cast<uint32_t>(cand.size());
    auto local = best.local;
    for (uint32_t mask = 1; mask < (1u << n); ++mask) {
      uint64_t bytes = 0;
      for (uint32_t i = 0; i < n; ++i) {
        if (mask >> i & 1u) bytes += pb.bytes[cand[i].first][cand[i].second];
      }
      if (bytes > pb.budget_bytes) continue;
      for (uint32_t i = 0; i < n; ++i) local[cand[i].first][cand[i].second] = (mask >> i & 1u) != 0;
      const double lat = expected_trip_latency(pb, local);
      if (lat < best.expected_latency_s - 1e-15) {
        best.expected_latency_s = lat;
        best.local = local;
        best.bytes = bytes;
      }
    }
    return best;
  }
  // Greedy by latency saved per byte over single experts and whole-layer bundles. Every move
  // stays within one layer and the objective is a sum over layers, so a move is judged by its
  // layer's latency alone (O(workers x experts) per move, not the whole model's).
  auto& local = best.local;
  std::vector<double> layer_cost(static_cast<size_t>(pb.n_layer));
  for (int l = 0; l < pb.n_layer; ++l) layer_cost[static_cast<size_t>(l)] = layer_latency(pb, l, local);
  while (true) {
    double best_gain = 0;
    std::vector<std::pair<int, int>> move;
    uint64_t move_bytes = 0;
    auto consider = [&](const std::vector<std::pair<int, int>>& m) {
      uint64_t b = 0;
      for (const auto& [l, e] : m) b += pb.bytes[l][e];
      if (m.empty() || best.bytes + b > pb.budget_bytes) return;
      const int layer = m.front().first;
      for (const auto& [l, e] : m) local[l][e] = true;
      const double gain = (layer_cost[static_cast<size_t>(layer)] - layer_latency(pb, layer, local)) /
                          static_cast<double>(std::max<uint64_t>(b, 1));
      for (const auto& [l, e] : m) local[l][e] = false;
      if (gain > best_gain) {
        best_gain = gain;
        move = m;
        move_bytes = b;
      }
    };
    for (const auto& c : cand) {
      if (!local[c.first][c.second]) consider({c});
    }
    for (int l = 0; l < pb.n_layer; ++l) {
      std::vector<std::pair<int, int>> bundle;
      for (const auto& c : cand) {
        if (c.first == l && !local[c.first][c.second]) bundle.push_back(c);
      }
      if (bundle.size() > 1) consider(bundle);
    }
    if (move.empty()) break;
    for (const auto& [l, e] : move) local[l][e] = true;
    best.bytes += move_bytes;
    const int moved = move.front().first;
    layer_cost[static_cast<size_t>(moved)] = layer_latency(pb, moved, local);
    best.expected_latency_s = 0;
    for (const double c : layer_cost) best.expected_latency_s += c;
  }
  return best;
}

}  // namespace moesh
