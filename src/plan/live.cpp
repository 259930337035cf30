// Planner inputs from a running gateway's reports (live.h).
#include "moesh/plan/live.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <set>

namespace moesh {

uint64_t live_peer_memory(uint64_t slab, uint64_t replica_budget, uint64_t available, uint64_t offer) {
  if (offer > 0) return offer;
  return slab + std::max(replica_budget, available / 2);
}

namespace {
Result<std::vector<LivePeer>> read_status_peers(const nlohmann::json& j);
}  // namespace

Result<std::vector<LivePeer>> peers_from_status(const nlohmann::json& j) {
  // A field of the wrong type (a string where a number goes) throws in nlohmann's value(): the
  // document is malformed, said as such rather than taking the process down.
  try {
    return read_status_peers(j);
  } catch (const nlohmann::json::exception& e) {
    return make_error(StatusCode::kCorrupt, "/swarm/status: a field has the wrong type ({})", e.what());
  }
}

namespace {
Result<std::vector<LivePeer>> read_status_peers(const nlohmann::json& j) {
  if (!j.is_object() || !j.contains("workers") || !j["workers"].is_array())
    return make_error(StatusCode::kCorrupt, "/swarm/status has no workers array");
  std::vector<LivePeer> out;
  for (const auto& w : j["workers"]) {
    if (!w.is_object() || w.value("state", "") != "up") continue;
    LivePeer p;
    p.peer.name = w.value("name", "");
    if (p.peer.name.empty()) p.peer.name = w.value("label", "");
    if (p.peer.name.empty()) continue;
    p.peer.memory_bytes =
        live_peer_memory(w.value("slab_bytes", uint64_t{0}), w.value("replica_budget_bytes", uint64_t{0}),
                         w.value("mem_available_bytes", uint64_t{0}), w.value("offer_bytes", uint64_t{0}));
    p.peer.rtt_s = std::max(0.0, w.value("warmup_rtt_ms", 0.0)) * 1e-3;
    // Slowed down: its recent trips cost more than its fastest did, by what its path or host
    // lost since; each trip to it costs that much more now.
    const double recent = w.value("recent_trip_ms", 0.0), fastest = w.value("min_latency_ms", 0.0);
    if (recent > 0 && fastest > 0 && recent > fastest) {
      p.slowed_s = (recent - fastest) * 1e-3;
      p.peer.rtt_s += p.slowed_s;
    }
    if (w.value("path", "") == "direct") p.addr = w.value("address", "");
    // A worker on the full model may be given blocks (it loads them from its file): a re-plan may
    // make it a span peer — where the gateway can dial it.
    p.span_peer = w.contains("loads_blocks") && w["loads_blocks"].is_boolean() && w["loads_blocks"].get<bool>();
    p.label = w.value("label", "");
    p.pair_seconds = std::max(0.0, w.value("compute_seconds", 0.0));
    p.pairs = w.value("compute_pairs", uint64_t{0});
    if (w.contains("peer_rtt_ms") && w["peer_rtt_ms"].is_object()) {
      for (const auto& [label, ms] : w["peer_rtt_ms"].items())
        if (ms.is_number() && ms.get<double>() >= 0) p.measured_rtt_ms.emplace_back(label, ms.get<double>());
    }
    out.push_back(std::move(p));
  }
  const size_t n_workers = out.size();
  if (j.contains("spans") && j["spans"].is_array()) {
    for (size_t i = 0; i < j["spans"].size(); ++i) {
      const auto& sp = j["spans"][i];
      const std::string state = sp.is_object() ? sp.value("state", "") : "";
      if (state != "up" && state != "idle" && state != "lane") continue;
      LivePeer p;
      p.span_peer = true;
      p.peer.name = p.label = sp.value("label", "");
      if (p.peer.name.empty()) continue;
      const std::string layers = sp.value("layers", "");
      char tail = 0;
      p.lane = state == "lane";
      if (state != "idle" &&
          (std::sscanf(layers.c_str(), "%d-%d%c", &p.first, &p.last, &tail) != 2 || p.first < 0 || p.last < p.first))
        return make_error(StatusCode::kCorrupt, "/swarm/status spans[{}].layers \"{}\" is not FIRST-LAST", i, layers);
      p.peer.memory_bytes =
          live_peer_memory(sp.value("slab_bytes", uint64_t{0}), sp.value("replica_budget_bytes", uint64_t{0}),
                           sp.value("mem_available_bytes", uint64_t{0}), sp.value("offer_bytes", uint64_t{0}));
      p.peer.rtt_s = std::max(0.0, sp.value("warmup_rtt_ms", 0.0)) * 1e-3;
      p.addr = sp.value("address", "");
      if (state != "idle") {
        p.step_seconds = std::max(0.0, sp.value("compute_seconds", 0.0));
        p.steps = sp.value("compute_steps", uint64_t{0});
        p.rows = sp.value("compute_rows", uint64_t{0});
      }
      // One machine, one peer: a worker that runs blocks now (a re-plan gave it some) is that
      // worker with a span; one idle as a span peer is the worker.
      const auto workers_end = out.begin() + static_cast<ptrdiff_t>(n_workers);
      auto same = std::find_if(out.begin(), workers_end,
                               [&](const LivePeer& x) { return !p.addr.empty() && x.addr == p.addr && x.first < 0; });
      if (same != workers_end) {
        same->span_peer = true;
        if (state != "idle") {
          same->first = p.first;
          same->last = p.last;
          same->lane = p.lane;
          same->step_seconds = p.step_seconds;
          same->steps = p.steps;
          same->rows = p.rows;
        }
        continue;
      }
      out.push_back(std::move(p));
    }
  }
  return out;
}
}  // namespace

int apply_measured_speeds(const PlanModel& m, std::vector<LivePeer>* peers, bool absolute) {
  // A (token, expert) pair at speed 1: the mean of the MoE layers' (a worker's pairs spread over them).
  double pair_s = 0;
  int moe = 0;
  for (const PlanLayer& L : m.layers) {
    if (!L.moe) continue;
    pair_s += L.expert_s;
    ++moe;
  }
  if (moe > 0) pair_s /= moe;
  std::vector<double> ratio(peers->size(), 0.0);  // predicted / measured (0: not measured)
  for (size_t i = 0; i < peers->size(); ++i) {
    const LivePeer& p = (*peers)[i];
    double predicted = 0, took = 0;
    if (p.steps >= kMinMeasuredSteps && p.first >= 0 && p.last < m.n_layer() && p.rows >= p.steps) {
      // One row of its span at speed 1; a step of n rows costs rows_cost(n), which is linear in n,
      // so the steps' sum is steps + row_share (rows - steps) rows' worth.
      double row_s = 0;
      for (int l = p.first; l <= p.last; ++l) {
        const PlanLayer& L = m.layers[static_cast<size_t>(l)];
        row_s += L.dense_s + (L.moe ? m.n_expert_used * L.expert_s : 0.0);
      }
      const double steps = static_cast<double>(p.steps), rows = static_cast<double>(p.rows);
      predicted = row_s * (steps + m.row_share * (rows - steps));
      took = p.step_seconds;
    } else if (p.pairs >= kMinMeasuredPairs && pair_s > 0) {
      predicted = pair_s * static_cast<double>(p.pairs);
      took = p.pair_seconds;
    }
    if (predicted > 0 && took > 0) ratio[i] = predicted / took;
  }
  std::vector<double> measured;
  for (const double r : ratio)
    if (r > 0) measured.push_back(r);
  if (measured.empty()) return 0;
  std::sort(measured.begin(), measured.end());
  const double median = measured[measured.size() / 2];
  for (size_t i = 0; i < peers->size(); ++i) {
    if (!(ratio[i] > 0)) continue;
    double speed = absolute ? ratio[i] : ratio[i] / median;
    if (!absolute && speed <= kSameSpeed && speed >= 1 / kSameSpeed) speed = 1;
    (*peers)[i].peer.speed = std::clamp(speed, kMinSpeed, kMaxSpeed);
  }
  return static_cast<int>(measured.size());
}

std::vector<std::vector<double>> measured_peer_rtts(const std::vector<LivePeer>& peers) {
  const size_t P = peers.size();
  std::vector<std::vector<double>> m(P, std::vector<double>(P, -1.0));
  bool any = false;
  for (size_t i = 0; i < P; ++i) {
    for (const auto& [label, ms] : peers[i].measured_rtt_ms) {
      for (size_t j = 0; j < P; ++j) {
        if (j == i || peers[j].label.empty() || peers[j].label != label) continue;
        const double s = ms * 1e-3;
        for (double* v : {&m[i][j], &m[j][i]}) *v = *v < 0 ? s : std::min(*v, s);
        any = true;
      }
    }
  }
  if (!any) m.clear();
  return m;
}

Status apply_activations(const nlohmann::json& doc, const std::string& source, PlanModel* m, ActivationInfo* info) {
  auto bad = [&](const std::string& why) {
    return make_error(StatusCode::kInvalidArgument, "activations {}: {}", source, why);
  };
  const nlohmann::json& h = doc.is_object() && doc.contains("heatmap") ? doc["heatmap"] : doc;
  if (!h.is_object() || !h.contains("n_expert") || !h["n_expert"].is_number_integer() || !h.contains("layers") ||
      !h["layers"].is_array())
    return bad("not a heatmap (expected {\"n_expert\": N, \"layers\": [...]}, as /swarm/dashboard.json has)");
  if (h["n_expert"].get<int64_t>() != m->n_expert)
    return bad(fmt::format("heatmap.n_expert is {}, model '{}' has {} experts", h["n_expert"].get<int64_t>(), m->name,
                           m->n_expert));
  const double uniform = static_cast<double>(m->n_expert_used) / m->n_expert;
  std::vector<std::vector<double>> p(static_cast<size_t>(m->n_layer()),
                                     std::vector<double>(static_cast<size_t>(m->n_expert), uniform));
  ActivationInfo got;
  got.source = source;
  std::vector<bool> seen(static_cast<size_t>(m->n_layer()), false);
  for (size_t i = 0; i < h["layers"].size(); ++i) {
    const nlohmann::json& L = h["layers"][i];
    const std::string at = fmt::format("heatmap.layers[{}]", i);
    if (!L.is_object() || !L.contains("layer") || !L["layer"].is_number_integer() || !L.contains("tokens") ||
        !L["tokens"].is_number_unsigned() || !L.contains("share") || !L["share"].is_array())
      return bad(at + " needs \"layer\", \"tokens\" and \"share\"");
    const int64_t l = L["layer"].get<int64_t>();
    if (l < 0 || l >= m->n_layer() || !m->layers[static_cast<size_t>(l)].moe)
      return bad(fmt::format("{}.layer {} is not a MoE layer of '{}'", at, l, m->name));
    if (seen[static_cast<size_t>(l)]) return bad(fmt::format("{}.layer {} is listed twice", at, l));
    seen[static_cast<size_t>(l)] = true;
    if (L["share"].size() != static_cast<size_t>(m->n_expert))
      return bad(fmt::format("{}.share has {} values, the model has {} experts", at, L["share"].size(), m->n_expert));
    const double t = static_cast<double>(L["tokens"].get<uint64_t>());
    for (int e = 0; e < m->n_expert; ++e) {
      const nlohmann::json& v = L["share"][static_cast<size_t>(e)];
      const double x = v.is_number() ? v.get<double>() : -1;
      if (!(x >= 0 && x <= 1)) return bad(fmt::format("{}.share[{}] is not a share in [0,1]", at, e));
      p[static_cast<size_t>(l)][static_cast<size_t>(e)] =
          (x * t + kActivationPriorTokens * uniform) / (t + kActivationPriorTokens);
    }
    got.layers += 1;
    got.tokens += L["tokens"].get<uint64_t>();
  }
  if (got.layers == 0) return Status::ok();  // nothing counted yet: uniform
  m->p = std::move(p);
  *info = got;
  return Status::ok();
}

SpanListChange span_list_change(const nlohmann::json& old_plan, const nlohmann::json& new_plan) {
  auto spans_of = [](const nlohmann::json& plan) {
    std::vector<SpanListEntry> out;
    if (!plan.is_object() || !plan.contains("roles") || !plan["roles"].is_array()) return out;
    for (const auto& r : plan["roles"]) {
      if (!r.is_object() || r.value("role", "") != "span" || !r.contains("layers") || !r["layers"].is_string())
        continue;
      int first = 0, last = 0;
      if (std::sscanf(r["layers"].get<std::string>().c_str(), "%d-%d", &first, &last) != 2 || first < 0 || last < first)
        continue;
      out.push_back({first, last, r.contains("addr") && r["addr"].is_string() ? r["addr"].get<std::string>() : "",
                     r.contains("peer") && r["peer"].is_string() ? r["peer"].get<std::string>() : ""});
    }
    std::sort(out.begin(), out.end(), [](const SpanListEntry& x, const SpanListEntry& y) { return x.first < y.first; });
    return out;
  };
  const std::vector<SpanListEntry> before = spans_of(old_plan), after = spans_of(new_plan);
  SpanListChange c;
  auto edges = [](const std::vector<SpanListEntry>& v) {
    std::vector<std::pair<int, int>> e;
    for (const SpanListEntry& x : v) e.emplace_back(x.first, x.last);
    return e;
  };
  if (edges(before) == edges(after)) return c;
  c.same = false;
  std::set<int> covered, taken;
  for (const SpanListEntry& x : before)
    for (int il = x.first; il <= x.last; ++il) covered.insert(il);
  if (old_plan.is_object() && old_plan.contains("here") && old_plan["here"].is_array()) {
    for (const auto& h : old_plan["here"]) {
      int first = 0, last = 0;
      if (!h.is_string() || std::sscanf(h.get<std::string>().c_str(), "%d-%d", &first, &last) != 2) continue;
      for (int il = first; il <= last && last - first < (1 << 20); ++il) covered.insert(il);
    }
  }
  for (const SpanListEntry& x : after)
    for (int il = x.first; il <= x.last; ++il) taken.insert(il);
  if (covered.empty() || !std::includes(covered.begin(), covered.end(), taken.begin(), taken.end())) return c;
  c.live = true;
  c.list = after;
  for (auto it = covered.begin(); it != covered.end();) {
    if (taken.count(*it) != 0) {
      ++it;
      continue;
    }
    SpanListEntry h{*it, *it, "here", ""};
    for (++it; it != covered.end() && *it == h.last + 1 && taken.count(*it) == 0; ++it) h.last = *it;
    c.list.push_back(h);
  }
  std::sort(c.list.begin(), c.list.end(),
            [](const SpanListEntry& x, const SpanListEntry& y) { return x.first < y.first; });
  return c;
}

}  // namespace moesh
