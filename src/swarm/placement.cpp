// Placement: which owner (a worker, the backbone, nobody) computes each (layer, expert), built
// from the expert ranges workers announce in their HELLOs. Also worker address parsing, since
// both come from the same CLI flags (--worker, --workers FILE).
#include <charconv>
#include <fstream>

#include "moesh/remote.h"

namespace moesh {

// ---- addresses -------------------------------------------------------------------------------

std::string WorkerAddress::to_string() const {
  if (host.find(':') != std::string::npos) return fmt::format("[{}]:{}", host, port);
  return fmt::format("{}:{}", host, port);
}

Result<WorkerAddress> parse_worker_address(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
  std::string_view host, port;
  if (!s.empty() && s.front() == '[') {
    const size_t close = s.find(']');
    if (close == std::string_view::npos || close + 1 >= s.size() || s[close + 1] != ':') {
      return make_error(StatusCode::kInvalidArgument, "worker address '{}': expected [v6addr]:port",
                        std::string(s));
    }
    host = s.substr(1, close - 1);
    port = s.substr(close + 2);
  } else {
    const size_t colon = s.rfind(':');
    if (colon == std::string_view::npos || s.find(':') != colon) {
      return make_error(StatusCode::kInvalidArgument, "worker address '{}': expected HOST:PORT",
                        std::string(s));
    }
    host = s.substr(0, colon);
    port = s.substr(colon + 1);
  }
  unsigned v = 0;
  auto [p, ec] = std::from_chars(port.data(), port.data() + port.size(), v);
  if (host.empty() || port.empty() || ec != std::errc() || p != port.data() + port.size() || v == 0 ||
      v > 65535) {
    return make_error(StatusCode::kInvalidArgument,
                      "worker address '{}': need a host and a port in 1..65535", std::string(s));
  }
  return WorkerAddress{std::string(host), static_cast<uint16_t>(v)};
}

Result<std::vector<WorkerAddress>> read_workers_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) return make_error(StatusCode::kIoError, "cannot read workers file '{}'", path);
  std::vector<WorkerAddress> out;
  std::string line;
  for (int lineno = 1; std::getline(in, line); ++lineno) {
    std::string_view v(line);
    if (const size_t hash = v.find('#'); hash != std::string_view::npos) v = v.substr(0, hash);
    while (!v.empty() && (v.back() == ' ' || v.back() == '\t' || v.back() == '\r')) v.remove_suffix(1);
    while (!v.empty() && (v.front() == ' ' || v.front() == '\t')) v.remove_prefix(1);
    if (v.empty()) continue;
    auto a = parse_worker_address(v);
    if (!a) return a.status().with_context(fmt::format("{}:{}", path, lineno));
    out.push_back(*a);
  }
  if (out.empty()) return make_error(StatusCode::kInvalidArgument, "workers file '{}' lists no workers", path);
  return out;
}

// ---- placement -------------------------------------------------------------------------------

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

int64_t Placement::count(int owner) const {
  int64_t n = 0;
  for (int16_t o : owner_) n += o == owner;
  return n;
}

int64_t Placement::count_replicas(int worker) const {
  if (worker < 0 || worker >= 64) return 0;
  int64_t n = 0;
  for (size_t i = 0; i < owner_.size(); ++i) n += ((holders_[i] >> worker) & 1) != 0 && owner_[i] != worker;
  return n;
}

std::string Placement::describe(int owner) const {
  std::string s;
  std::vector<int> ids;
  for (int l = 0; l < n_layer_; ++l) {
    ids.clear();
    for (int e = 0; e < n_expert_; ++e) {
      if (this->owner(l, e) == owner) ids.push_back(e);
    }
    if (ids.empty()) continue;
    if (!s.empty()) s += "; ";
    s += fmt::format("layer {}: experts {}", l, format_id_ranges(ids));
  }
  return s.empty() ? "nothing" : s;
}

Result<Placement> build_placement(const PlacementInput& in) {
  if (in.n_layer <= 0 || in.n_expert <= 0 || static_cast<int>(in.moe_layer.size()) != in.n_layer ||
      static_cast<int>(in.local_layer.size()) != in.n_layer ||
      in.worker_names.size() != in.worker_experts.size()) {
    return make_error(StatusCode::kInvalidArgument, "placement: inconsistent input shape");
  }
  if (in.worker_experts.size() > 32000) {
    return make_error(StatusCode::kOutOfRange, "placement: {} workers is too many", in.worker_experts.size());
  }
  Placement p(in.n_layer, in.n_expert);
  for (int l = 0; l < in.n_layer; ++l) {
    if (!in.moe_layer[l]) continue;
    for (int e = 0; e < in.n_expert; ++e) p.set_owner(l, e, in.local_layer[l] ? Placement::kLocal : Placement::kNone);
  }
  // Walk the workers last to first so the first worker holding an expert ends up owning it.
  for (size_t wi = in.worker_experts.size(); wi-- > 0;) {
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
        p.set_owner(static_cast<int>(r.layer), static_cast<int>(e), static_cast<int>(wi));
        p.add_holder(static_cast<int>(r.layer), static_cast<int>(e), static_cast<int>(wi));
      }
    }
  }
  // Every routed expert of every MoE layer needs an owner.
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
