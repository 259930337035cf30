// Placement: who holds each (layer, expert), built from the expert ranges workers announce in
// their HELLOs and the backbone's own expert weights.
#include "moesh/remote/placement.h"

#include <fmt/format.h>

#include <algorithm>

namespace moesh {

std::string format_id_ranges(const std::vector<int>& ids) {
  std::string s;
  for (size_t i = 0; i < ids.size();) {
    size_t j = i;
    while (j + 1 < ids.size() && ids[j + 1] == ids[j] + 1) ++j;
    if (!s.empty()) s += ",";
    s += j == i ? std::to_string(ids[i]) : fmt::format("{}-{}", ids[i], ids[j]);
    i = j + 1;
  }
  return s;
}

Placement::Placement(int n_layer, int n_expert)
    : n_layer_(n_layer),
      n_expert_(n_expert),
      holders_(static_cast<size_t>(n_layer) * static_cast<size_t>(n_expert)),
      local_(holders_.size(), 0) {}

void Placement::add_holder(int layer, int expert, int worker) {
  if (worker < 0) return;
  std::vector<int32_t>& h = holders_[at(layer, expert)];
  auto it = std::lower_bound(h.begin(), h.end(), worker);
  if (it == h.end() || *it != worker) h.insert(it, worker);
  n_workers_ = std::max(n_workers_, worker + 1);
}

void Placement::remove_holder(int layer, int expert, int worker) {
  std::vector<int32_t>& h = holders_[at(layer, expert)];
  auto it = std::lower_bound(h.begin(), h.end(), worker);
  if (it != h.end() && *it == worker) h.erase(it);
}

int Placement::owner(int layer, int expert) const {
  const size_t i = at(layer, expert);
  if (!holders_[i].empty()) return holders_[i].front();
  return local_[i] ? kLocal : kNone;
}

int64_t Placement::count(int owner) const {
  int64_t n = 0;
  for (int l = 0; l < n_layer_; ++l) {
    for (int e = 0; e < n_expert_; ++e) n += this->owner(l, e) == owner;
  }
  return n;
}

int64_t Placement::count_replicas(int worker) const {
  int64_t n = 0;
  for (const std::vector<int32_t>& h : holders_) {
    n += h.size() > 1 && h.front() != worker && std::binary_search(h.begin() + 1, h.end(), worker);
  }
  return n;
}

std::string Placement::describe(int owner) const {
  // One entry per run of consecutive layers with the same owned experts, so a 48-layer model
  // where a worker holds experts 0-31 everywhere reads "layers 0-47: experts 0-31".
  std::string s;
  std::string run_ids;
  int run_first = -1, run_last = -1;
  auto flush = [&] {
    if (run_first < 0) return;
    if (!s.empty()) s += "; ";
    s += run_first == run_last ? fmt::format("layer {}: experts {}", run_first, run_ids)
                               : fmt::format("layers {}-{}: experts {}", run_first, run_last, run_ids);
    run_first = -1;
  };
  std::vector<int> ids;
  for (int l = 0; l < n_layer_; ++l) {
    ids.clear();
    for (int e = 0; e < n_expert_; ++e) {
      if (this->owner(l, e) == owner) ids.push_back(e);
    }
    if (ids.empty()) {
      flush();
      continue;
    }
    std::string r = format_id_ranges(ids);
    if (run_first >= 0 && run_last == l - 1 && r == run_ids) {
      run_last = l;
      continue;
    }
    flush();
    run_first = run_last = l;
    run_ids = std::move(r);
  }
  flush();
  return s.empty() ? "nothing" : s;
}

Result<Placement> build_placement(const PlacementInput& in) {
  const size_t n_pairs = static_cast<size_t>(std::max(in.n_layer, 0)) * static_cast<size_t>(std::max(in.n_expert, 0));
  if (in.n_layer <= 0 || in.n_expert <= 0 || static_cast<int>(in.moe_layer.size()) != in.n_layer ||
      static_cast<int>(in.local_layer.size()) != in.n_layer ||
      (!in.local_expert.empty() && in.local_expert.size() != n_pairs) ||
      in.worker_names.size() != in.worker_experts.size()) {
    return make_error(StatusCode::kInvalidArgument, "placement: inconsistent input shape");
  }
  if (in.worker_experts.size() > 32000) {
    return make_error(StatusCode::kOutOfRange, "placement: {} workers is too many", in.worker_experts.size());
  }
  Placement p(in.n_layer, in.n_expert);
  for (int l = 0; l < in.n_layer; ++l) {
    if (!in.moe_layer[l]) continue;
    for (int e = 0; e < in.n_expert; ++e) {
      const bool one = !in.local_expert.empty() && in.local_expert[static_cast<size_t>(l) * in.n_expert + e];
      p.set_local_copy(l, e, in.local_layer[l] || one);
    }
  }
  for (size_t wi = 0; wi < in.worker_experts.size(); ++wi) {
    for (const wire::ExpertRange& r : in.worker_experts[wi]) {
      const uint64_t end = uint64_t{r.first} + r.count;
      if (r.layer >= static_cast<uint32_t>(in.n_layer) || r.count == 0 || end > static_cast<uint64_t>(in.n_expert)) {
        return make_error(StatusCode::kInvalidArgument,
                          "worker {} announces layer {} experts [{}, {}) outside the model ({} layers x {} experts)",
                          in.worker_names[wi], r.layer, r.first, end, in.n_layer, in.n_expert);
      }
      if (!in.moe_layer[r.layer]) {
        return make_error(StatusCode::kInvalidArgument, "worker {} announces experts of layer {}, which is dense",
                          in.worker_names[wi], r.layer);
      }
      for (uint64_t e = r.first; e < end; ++e) {
        p.add_holder(static_cast<int>(r.layer), static_cast<int>(e), static_cast<int>(wi));
      }
    }
  }
  // Every routed expert of every MoE layer needs someone who can compute it.
  std::string missing;
  int64_t n_missing = 0;
  std::vector<int> ids;
  for (int l = 0; l < in.n_layer; ++l) {
    if (!in.moe_layer[l]) continue;
    ids.clear();
    for (int e = 0; e < in.n_expert; ++e) {
      if (p.owner(l, e) == Placement::kNone) ids.push_back(e);
    }
    if (ids.empty()) continue;
    n_missing += static_cast<int64_t>(ids.size());
    if (!missing.empty()) missing += "; ";
    missing += fmt::format("layer {}: experts {}", l, format_id_ranges(ids));
  }
  if (n_missing > 0) {
    return make_error(StatusCode::kNotFound,
                      "{} routed expert(s) are held by no worker and the backbone has no weights for them: {}",
                      n_missing, missing);
  }
  return p;
}

}  // namespace moesh
