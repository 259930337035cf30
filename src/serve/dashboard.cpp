// The dashboard page and its data (dashboard.h).
#include "serve/dashboard.h"

#include <chrono>
#include <cmath>
#include <mutex>

#include "moesh/plan/live.h"
#include "moesh/plan/swarm_plan.h"
#include "moesh/serve/ledger.h"

namespace moesh::serve {

namespace {

// Replicas sharing pairs: within this x the nearest holder's cost + the slack (PlannerPolicy).
constexpr double kNearShare = 1.25;
constexpr double kNearShareSlack_s = 0.002;

// Each layer's experts by the worker (index into `ws`) or the backbone (Placement::kLocal) that
// computes them — `who(layer, expert)`, by default the placement's owner — as contiguous slices:
// `out(owner, slice)`.
template <typename Out, typename Who>
void placement_slices(const PlanModel& pm, const Placement& pl, const std::vector<int>& layer_host, Out out, Who who) {
  for (int l = 0; l < std::min(pm.n_layer(), pl.n_layer()); ++l) {
    if (!pm.layers[static_cast<size_t>(l)].moe || layer_host[static_cast<size_t>(l)] >= 0) continue;
    int run_owner = Placement::kNone, run_first = 0;
    auto flush = [&](int last) {
      if (run_owner != Placement::kNone) out(run_owner, ExpertSlice{l, run_first, last});
    };
    for (int e = 0; e < pl.n_expert(); ++e) {
      const int own = who(l, e);
      if (own != run_owner) {
        flush(e - 1);
        run_owner = own;
        run_first = e;
      }
    }
    flush(pl.n_expert() - 1);
  }
}
template <typename Out>
void placement_slices(const PlanModel& pm, const Placement& pl, const std::vector<int>& layer_host, Out out) {
  placement_slices(pm, pl, layer_host, out, [&](int l, int e) { return pl.owner(l, e); });
}

}  // namespace

nlohmann::json replan_json(const Model& model, const RemoteExecutor* remote, const nlohmann::json& status,
                           const nlohmann::json& heatmap, ReplanLoad load, bool spans_allowed) {
  auto pm = plan_model_from_gguf(model.file(), kReplanContext, load.costs.seconds_per_byte);
  if (!pm) return {{"error", pm.status().message()}};
  pm->row_share = load.costs.row_share;
  ActivationInfo act;  // none counted yet (or null): uniform, as apply_activations leaves it
  if (heatmap.is_object() && heatmap.contains("layers") && !heatmap["layers"].empty()) {
    if (Status st = apply_activations(heatmap, "this gateway", &*pm, &act); !st.is_ok())
      return {{"error", st.message()}};
  }
  auto live_peers = peers_from_status(status);
  if (!live_peers) return {{"error", live_peers.status().message()}};
  if (live_peers->empty()) return {{"error", "no worker or span peer is up"}};
  // Each peer at its measured compute speed: absolute when the costs were given for these
  // machines, else relative to the other peers (the default costs are only a guess).
  const int measured = apply_measured_speeds(*pm, &*live_peers, load.costs.seconds_per_byte != kDefaultSecondsPerByte);
  std::vector<PlanPeer> peers;
  for (const LivePeer& p : *live_peers) peers.push_back(p.peer);

  // The live layout over those peers: the blocks each span peer runs, what each up worker holds;
  // the experts of one that is not up are served by the backbone's own copies.
  const int L = pm->n_layer();
  SwarmPlan live;
  live.layer_host.assign(static_cast<size_t>(L), -1);
  live.roles.assign(peers.size(), PeerRole{});
  for (size_t i = 0; i < peers.size(); ++i) {
    const LivePeer& p = (*live_peers)[i];
    if (p.first < 0) continue;
    if (p.last >= L)
      return {{"error", fmt::format("span peer {} runs blocks {}-{} of {}", p.peer.name, p.first, p.last, L)}};
    live.roles[i].kind = RoleKind::kSpan;
    live.roles[i].first = p.first;
    live.roles[i].last = p.last;
    if (p.lane) continue;  // the span's own peer hosts the layers; its lanes are set below
    for (int l = p.first; l <= p.last; ++l) live.layer_host[static_cast<size_t>(l)] = static_cast<int>(i);
  }
  // Lanes: beside the peer that runs the same span.
  for (size_t i = 0; i < peers.size(); ++i) {
    const LivePeer& p = (*live_peers)[i];
    if (!p.lane || p.first < 0) continue;
    const int h = live.layer_host[static_cast<size_t>(p.first)];
    if (h < 0 || live.roles[static_cast<size_t>(h)].first != p.first ||
        live.roles[static_cast<size_t>(h)].last != p.last) {
      live.roles[i] = PeerRole{};  // a lane of a span that runs here (the cost model has no such lane)
      continue;
    }
    live.roles[i].lane_of = h;
  }
  uint64_t local_bytes = 0;
  auto local = [&](const ExpertSlice& sl) {
    live.backbone_experts.push_back(sl);
    local_bytes +=
        static_cast<uint64_t>(sl.last - sl.first + 1) * pm->layers[static_cast<size_t>(sl.layer)].expert_bytes;
  };
  if (remote != nullptr) {
    const std::vector<WorkerStatus> ws = remote->worker_status();
    std::vector<int> peer_of(ws.size(), -1);
    for (size_t w = 0; w < ws.size(); ++w) {
      const std::string name = ws[w].name.empty() ? ws[w].label : ws[w].name;
      for (size_t i = 0; i < peers.size(); ++i)
        if (ws[w].state == "up" && (*live_peers)[i].first < 0 && peers[i].name == name)
          peer_of[w] = static_cast<int>(i);
    }
    // Pairs go to the nearest live holder (remote/planner.h): a replica nearer than the owner
    // (a rebalance's, or one a re-plan gave) computes them; none up: the backbone.
    const Placement& pl = remote->placement();
    auto nearest = [&](int l, int e) {
      int best = Placement::kLocal;
      for (const int32_t w : pl.holders(l, e)) {
        const int i = static_cast<size_t>(w) < ws.size() ? peer_of[static_cast<size_t>(w)] : -1;
        if (i < 0) continue;
        if (best == Placement::kLocal ||
            peers[static_cast<size_t>(i)].rtt_s < peers[static_cast<size_t>(peer_of[static_cast<size_t>(best)])].rtt_s)
          best = w;
      }
      return best;
    };
    placement_slices(
        *pm, pl, live.layer_host,
        [&](int owner, const ExpertSlice& sl) {
          const int i = owner >= 0 && static_cast<size_t>(owner) < ws.size() ? peer_of[static_cast<size_t>(owner)] : -1;
          if (i < 0) return local(sl);
          live.roles[static_cast<size_t>(i)].kind = RoleKind::kExperts;
          live.roles[static_cast<size_t>(i)].experts.push_back(sl);
        },
        nearest);
    // The other up holders near the nearest share its pairs (the runtime's rule): their copies.
    for (int l = 0; l < std::min(L, pl.n_layer()); ++l) {
      if (!pm->layers[static_cast<size_t>(l)].moe || live.layer_host[static_cast<size_t>(l)] >= 0) continue;
      for (int e = 0; e < pl.n_expert(); ++e) {
        const int best = nearest(l, e);
        if (best < 0) continue;
        const double best_rtt = peers[static_cast<size_t>(peer_of[static_cast<size_t>(best)])].rtt_s;
        for (const int32_t w : pl.holders(l, e)) {
          const int i = static_cast<size_t>(w) < ws.size() ? peer_of[static_cast<size_t>(w)] : -1;
          if (w == best || i < 0 || peers[static_cast<size_t>(i)].rtt_s > kNearShare * best_rtt + kNearShareSlack_s)
            continue;
          live.roles[static_cast<size_t>(i)].kind = RoleKind::kExperts;
          live.roles[static_cast<size_t>(i)].copies.push_back({l, e, e});
        }
      }
    }
    for (PeerRole& r : live.roles) {
      if (r.copies.empty()) continue;
      PeerRole c;
      c.copies = r.copies;
      r.copies = held_experts(c);
    }
  } else {
    for (int l = 0; l < L; ++l)
      if (pm->layers[static_cast<size_t>(l)].moe && live.layer_host[static_cast<size_t>(l)] < 0)
        local({l, 0, pm->n_expert - 1});
  }

  // `moesh swarm plan -m MODEL --status URL` with these options reads the same inputs.
  PlanOptions o;
  o.local_experts_bytes = local_bytes;  // the backbone keeps what it holds now, no more
  o.tokens_per_step = std::max(1, load.tokens_per_step);
  o.streams = std::clamp(load.streams, 1, o.tokens_per_step);
  o.accepted_per_step = o.tokens_per_step;
  o.message_s = kDefaultMessageSeconds;
  o.peer_rtt_s = measured_peer_rtts(*live_peers);
  o.spans = spans_allowed;
  nlohmann::json j;
  // Costs other than the defaults are said too (`swarm plan` prices the defaults otherwise).
  std::string costs;
  if (load.costs.seconds_per_byte != kDefaultSecondsPerByte)
    costs += fmt::format(" --seconds-per-byte {}", load.costs.seconds_per_byte);
  if (load.costs.row_share != 1.0) costs += fmt::format(" --row-share {}", load.costs.row_share);
  j["args"] = fmt::format("--local-experts-mb {}B --streams {} --tokens-per-step {}{}{}", local_bytes, o.streams,
                          o.tokens_per_step, spans_allowed ? "" : " --no-spans", costs);
  j["activation_tokens"] = act.tokens;
  j["measured_speeds"] = measured;
  if (Status st = evaluate_plan(*pm, peers, o, &live); !st.is_ok()) {
    j["error"] = "the live layout: " + st.message();
    return j;
  }
  auto best = plan_swarm(*pm, peers, o);
  if (!best) {
    j["error"] = best.status().message();
    return j;
  }
  if (Status st = add_load_replicas(*pm, peers, o, &*best); !st.is_ok()) {
    j["error"] = st.message();
    return j;
  }
  if (Status st = add_span_lanes(*pm, peers, o, &*best); !st.is_ok()) {
    j["error"] = st.message();
    return j;
  }
  const double gain = live.step_s > 0 ? 1.0 - best->step_s / live.step_s : 0.0;
  j["live_step_ms"] = live.step_s * 1e3;
  j["predicted_step_ms"] = best->step_s * 1e3;
  j["trips_per_step"] = best->trips_per_step;
  j["gain"] = gain;
  j["replan"] = gain >= kReplanGain;
  nlohmann::json rows = nlohmann::json::array();
  for (size_t i = 0; i < peers.size(); ++i) {
    const PeerRole& r = best->roles[i];
    auto what_of = [&](const PeerRole& x) -> std::string {
      if (x.kind == RoleKind::kSpan)
        return fmt::format("layers {}-{}", x.first, x.last) +
               (x.lane_of >= 0 ? " (lane of " + peers[static_cast<size_t>(x.lane_of)].name + ")" : "");
      return x.kind == RoleKind::kExperts ? format_expert_spec(held_experts(x), pm->n_expert) : "";
    };
    const std::string what = what_of(r), now = what_of(live.roles[i]);
    rows.push_back({{"name", peers[i].name},
                    {"role", r.lane_of >= 0 ? "lane" : role_name(r.kind)},
                    {"what", what},
                    {"speed", peers[i].speed},
                    {"changes", r.kind != live.roles[i].kind || what != now}});
  }
  j["peers"] = rows;
  j["backbone_experts"] = format_expert_spec(best->backbone_experts, pm->n_expert);
  // The live layout as a plan document (`moesh swarm plan --json` roles), so `swarm plan --status
  // URL --from live` lists the moves from it without a saved plan.
  nlohmann::json live_roles = nlohmann::json::array();
  for (size_t i = 0; i < peers.size(); ++i) {
    nlohmann::json r{{"peer", peers[i].name}, {"role", role_name(live.roles[i].kind)}};
    if (live.roles[i].kind == RoleKind::kExperts)
      r["experts"] = format_expert_spec(held_experts(live.roles[i]), pm->n_expert);
    if (live.roles[i].kind == RoleKind::kSpan)
      r["layers"] = fmt::format("{}-{}", live.roles[i].first, live.roles[i].last);
    if (live.roles[i].lane_of >= 0) {
      r["role"] = "lane";
      r["lane_of"] = peers[static_cast<size_t>(live.roles[i].lane_of)].name;
    }
    if (!(*live_peers)[i].addr.empty()) r["addr"] = (*live_peers)[i].addr;
    if ((*live_peers)[i].span_peer) r["span_peer"] = true;
    live_roles.push_back(std::move(r));
  }
  // The blocks the backbone runs as spans itself ("F-L@here", or a span peer's fallback): a resplit
  // can hand them to peers live (swarm plan --from live prints it with them).
  nlohmann::json here = nlohmann::json::array();
  if (status.contains("spans") && status["spans"].is_array()) {
    for (const nlohmann::json& v : status["spans"]) {
      if (v.is_object() && v.value("state", "") == "here" && v.contains("layers") && v["layers"].is_string())
        here.push_back(v["layers"]);
    }
  }
  j["live"] = {{"roles", std::move(live_roles)}, {"here", std::move(here)}, {"predicted_step_ms", live.step_s * 1e3}};
  // The planner's layout as a plan document too: what `--auto-replan` carries out (its spans).
  nlohmann::json plan_roles = nlohmann::json::array();
  for (size_t i = 0; i < peers.size(); ++i) {
    const PeerRole& r = best->roles[i];
    nlohmann::json x{{"peer", peers[i].name}, {"role", role_name(r.kind)}};
    if (r.kind == RoleKind::kExperts) x["experts"] = format_expert_spec(held_experts(r), pm->n_expert);
    if (!r.copies.empty()) x["copies"] = format_expert_spec(r.copies, pm->n_expert);
    if (r.kind == RoleKind::kSpan) x["layers"] = fmt::format("{}-{}", r.first, r.last);
    if (r.lane_of >= 0) {
      x["role"] = "lane";
      x["lane_of"] = peers[static_cast<size_t>(r.lane_of)].name;
    }
    if (!(*live_peers)[i].addr.empty()) x["addr"] = (*live_peers)[i].addr;
    if ((*live_peers)[i].span_peer) x["span_peer"] = true;
    plan_roles.push_back(std::move(x));
  }
  j["plan"] = {{"roles", std::move(plan_roles)}, {"predicted_step_ms", best->step_s * 1e3}};
  return j;
}

nlohmann::json plan_card_json(const SchedulerStats& sched, const RemoteExecutor* remote, const Model* model,
                              const SpanClient* spans, const nlohmann::json* status_doc, const nlohmann::json* heatmap,
                              const PlanCosts& costs) {
  if (model == nullptr) return nullptr;
  auto pm = plan_model_from_gguf(model->file(), 0, costs.seconds_per_byte);
  if (!pm) return {{"error", pm.status().message()}};
  pm->row_share = costs.row_share;
  const int L = pm->n_layer();
  std::vector<PlanPeer> peers;
  SwarmPlan plan;
  plan.layer_host.assign(static_cast<size_t>(L), -1);
  nlohmann::json rows = nlohmann::json::array();
  if (spans != nullptr) {
    for (const SpanPeerView& v : spans->peers_view()) {
      if (v.span.first < 0 || v.span.last >= L) continue;
      // RTT: the fastest trip seen (the warm-up's padded PING rides TCP slow start), else the warm-up.
      const double rtt_s = v.local ? 0.0 : v.min_trip_seconds > 0 ? v.min_trip_seconds : v.warmup_rtt_ms * 1e-3;
      PlanPeer p{v.label, UINT64_MAX, rtt_s, 1.0, 0};
      PeerRole r;
      r.kind = RoleKind::kSpan;
      r.first = static_cast<int>(v.span.first);
      r.last = static_cast<int>(v.span.last);
      for (int l = r.first; l <= r.last; ++l) plan.layer_host[static_cast<size_t>(l)] = static_cast<int>(peers.size());
      rows.push_back({{"name", v.label},
                      {"role", "span"},
                      {"what", fmt::format("layers {}-{}", r.first, r.last)},
                      {"rtt_ms", p.rtt_s * 1e3},
                      {"measured_trip_ms", v.trips > 0 ? 1e3 * v.trip_seconds / static_cast<double>(v.trips) : 0.0}});
      peers.push_back(p);
      plan.roles.push_back(r);
    }
  }
  PlanOptions o;
  o.local_experts_bytes = UINT64_MAX;
  o.message_s = kDefaultMessageSeconds;
  o.tokens_per_step = sched.steps > 0
                          ? std::max(1, static_cast<int>(std::lround(static_cast<double>(sched.batch_tokens) /
                                                                     static_cast<double>(sched.steps))))
                          : 1;
  o.streams = sched.steps > 0 ? std::clamp(static_cast<int>(std::lround(static_cast<double>(sched.batch_sequences) /
                                                                        static_cast<double>(sched.steps))),
                                           1, o.tokens_per_step)
                              : 1;
  if (remote != nullptr) {
    const Placement& pl = remote->placement();
    const std::vector<WorkerStatus> ws = remote->worker_status();
    const size_t first_worker = peers.size();
    for (const WorkerStatus& w : ws) {
      const double rtt_ms = w.min_latency_ms > 0 ? w.min_latency_ms : w.warmup_rtt_ms;
      peers.push_back({w.name.empty() ? w.label : w.name, UINT64_MAX, rtt_ms * 1e-3, 1.0, 0});
      PeerRole r;
      r.kind = RoleKind::kExperts;
      plan.roles.push_back(r);
      rows.push_back({{"name", peers.back().name},
                      {"role", "experts"},
                      {"what", w.experts},
                      {"rtt_ms", rtt_ms},
                      {"measured_trip_ms", w.mean_latency_ms}});
    }
    placement_slices(*pm, pl, plan.layer_host, [&](int owner, const ExpertSlice& sl) {
      if (owner == Placement::kLocal)
        plan.backbone_experts.push_back(sl);
      else if (owner >= 0 && static_cast<size_t>(owner) < ws.size())
        plan.roles[first_worker + static_cast<size_t>(owner)].experts.push_back(sl);
    });
  } else {
    // No workers: the backbone holds every expert of its layers.
    for (int l = 0; l < L; ++l)
      if (pm->layers[static_cast<size_t>(l)].moe && plan.layer_host[static_cast<size_t>(l)] < 0)
        plan.backbone_experts.push_back({l, 0, pm->n_expert - 1});
  }
  for (size_t i = 0; i < plan.roles.size(); ++i)
    if (plan.roles[i].kind == RoleKind::kExperts && plan.roles[i].experts.empty()) plan.roles[i].kind = RoleKind::kIdle;
  nlohmann::json j;
  j["peers"] = rows;
  j["tokens_per_step"] = o.tokens_per_step;
  j["streams"] = o.streams;
  j["seconds_per_byte"] = costs.seconds_per_byte;
  j["row_share"] = costs.row_share;
  const double measured = sched.steps > 0 ? 1e3 * sched.busy_seconds / static_cast<double>(sched.steps) : 0.0;
  j["measured_step_ms"] = measured;
  if (Status st = evaluate_plan(*pm, peers, o, &plan); !st.is_ok()) {
    j["error"] = st.message();
    return j;
  }
  j["predicted_step_ms"] = plan.step_s * 1e3;
  j["trips_per_step"] = plan.trips_per_step;
  j["ratio"] = plan.step_s > 0 && measured > 0 ? measured / (plan.step_s * 1e3) : 0.0;
  // The re-plan: what the planner would choose for the workers and span peers up now.
  if (remote != nullptr || (spans != nullptr && !spans->peers_view().empty())) {
    const nlohmann::json status = status_doc != nullptr ? *status_doc : swarm_status_json(remote, spans);
    // The re-plan runs the whole planner (`moesh swarm plan --shape deepseek-v3` with 32 peers: 0.2 s
    // here, 128: 0.5 s) and the page polls once a second: it is kept while the swarm is the same —
    // the workers, their state, memory, RTTs and experts, the tokens per step — and, while requests
    // run, for at most kReplanRefreshSeconds, in which only the activation counts move. An idle gateway's counts
    // stand still, so its re-plan is always of the counts it shows.
    std::string key = fmt::format("{}|{}|{}|{}|{}", static_cast<const void*>(model), o.tokens_per_step, o.streams,
                                  costs.seconds_per_byte, costs.row_share);
    for (const char* list : {"workers", "spans"}) {
      if (!status.contains(list) || !status[list].is_array()) continue;
      for (const auto& w : status[list]) {
        for (const char* f :
             {"name", "label", "state", "experts", "layers", "address", "warmup_rtt_ms", "slab_bytes",
              "replica_budget_bytes", "mem_available_bytes", "offer_bytes", "peer_rtt_ms", "loads_blocks"})
          key += "|" + (w.contains(f) ? w[f].dump() : std::string());
        // Its measured compute per pair (worker) or step (span peer), in steps of about 19 %: a peer
        // that slows down or speeds up is priced anew (plan/live.h), jitter does not re-plan.
        const double took = w.value("compute_seconds", 0.0);
        const double n =
            static_cast<double>(w.value("compute_pairs", uint64_t{0}) + w.value("compute_steps", uint64_t{0}));
        key += took > 0 && n > 0 ? fmt::format("|{}", std::lround(4 * std::log2(took / n))) : std::string("|-");
      }
    }
    uint64_t counted = 0;
    if (heatmap != nullptr && heatmap->contains("layers"))
      for (const auto& l : (*heatmap)["layers"]) counted += l.value("tokens", uint64_t{0});
    static std::mutex mu;
    static std::string last_key;
    static uint64_t last_counted = 0;
    static std::chrono::steady_clock::time_point last_at;
    static nlohmann::json last;
    std::lock_guard<std::mutex> lock(mu);
    const auto now = std::chrono::steady_clock::now();
    const bool idle = sched.active == 0 && sched.queued == 0;
    if (key != last_key ||
        (counted != last_counted && (idle || now - last_at > std::chrono::duration<double>(kReplanRefreshSeconds)))) {
      last = replan_json(*model, remote, status, heatmap != nullptr ? *heatmap : nlohmann::json(),
                         ReplanLoad{o.tokens_per_step, o.streams, costs});
      last_key = std::move(key);
      last_counted = counted;
      last_at = now;
    }
    j["replan"] = last;
  }
  return j;
}

nlohmann::json dashboard_json(const SchedulerStats& sched, const RemoteExecutor* remote, double time_s,
                              const Model* model, const SpanClient* spans, const PlanCosts& costs) {
  nlohmann::json j;
  j["status"] = swarm_status_json(remote, spans);
  j["time_s"] = time_s;
  j["generated_tokens"] = sched.generated_tokens;
  j["requests_finished"] = sched.requests_finished;
  j["requests_failed"] = sched.requests_failed;
  j["layer_calls"] = 0;
  j["token_layers"] = 0;
  nlohmann::json layers = nlohmann::json::array();
  int64_t n_expert = 0;
  if (remote != nullptr) {
    const RemoteExecutor::Activations a = remote->activation_snapshot();
    j["layer_calls"] = a.layer_calls;
    j["token_layers"] = a.token_layers;
    n_expert = a.n_expert;
    for (size_t l = 0; l < a.tokens.size(); ++l) {
      if (a.tokens[l] == 0) continue;  // dense layers, or none routed yet
      nlohmann::json share = nlohmann::json::array();
      for (int64_t e = 0; e < n_expert; ++e) {
        share.push_back(static_cast<double>(a.pairs[l * static_cast<size_t>(n_expert) + static_cast<size_t>(e)]) /
                        static_cast<double>(a.tokens[l]));
      }
      layers.push_back({{"layer", l}, {"tokens", a.tokens[l]}, {"share", std::move(share)}});
    }
  }
  j["heatmap"] = {{"n_expert", n_expert}, {"layers", std::move(layers)}};
  j["plan"] = plan_card_json(sched, remote, model, spans, &j["status"], &j["heatmap"], costs);
  return j;
}

const char* dashboard_html() {
  return R"HTML(<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>moesh swarm</title>
<style>
 body{font:14px system-ui,sans-serif;margin:16px;background:#fafafa;color:#222}
 h1{font-size:20px;margin:0 0 8px} h2{font-size:15px;margin:14px 0 6px}
 .row{display:flex;gap:16px;flex-wrap:wrap} .card{background:#fff;border:1px solid #ddd;border-radius:6px;padding:10px}
 table{border-collapse:collapse} td,th{padding:2px 8px;text-align:right;border-bottom:1px solid #eee} th{background:#f3f3f3}
 td.l,th.l{text-align:left} .up{color:#1a7f37} .down{color:#c62828} .evicted{color:#6a1b9a}
 #heat td{padding:0;width:14px;height:14px;border:1px solid #fff}
 .kpi{font-size:22px;font-weight:600}
</style></head><body>
<h1>moesh swarm — backbone <span id="backbone">?</span></h1>
<div class="row">
 <div class="card"><div>tokens/s</div><div class="kpi" id="tps">–</div></div>
 <div class="card"><div>trips per token</div><div class="kpi" id="tpt">–</div></div>
 <div class="card"><div>generated tokens</div><div class="kpi" id="generated">0</div></div>
 <div class="card"><div>workers up</div><div class="kpi" id="nup">0</div></div>
 <div class="card"><div>updates</div><div class="kpi" id="updates">0</div></div>
</div>
<div class="row">
 <div class="card"><h2>Workers by RTT (solid: direct, dashed: relayed, dotted: joined)</h2><svg id="map" width="420" height="320"></svg></div>
 <div class="card"><h2>tokens/s and trips per token over time</h2><svg id="chart" width="460" height="320"></svg></div>
</div>
<div class="card"><h2>Workers</h2><table id="workers"><thead><tr><th>#</th><th class="l">name</th><th class="l">path</th>
<th class="l">state</th><th>experts</th><th>rtt ms</th><th>min ms</th><th>heard s</th><th>requests</th><th>errors</th><th>rejoins</th><th>threads</th><th>replicas MiB</th></tr></thead><tbody></tbody></table></div>
<div class="card"><h2>Plan: the live layout priced by the planner's cost model</h2>
<div>predicted <span class="kpi" id="plan_pred">–</span> ms per step, measured <span class="kpi" id="plan_meas">–</span> ms
(<span id="plan_ratio">–</span>×), <span id="plan_trips">–</span> trips per step, <span id="plan_tps">–</span> tokens per step
<span id="plan_err" class="down"></span></div>
<table id="plan"><thead><tr><th class="l">peer</th><th class="l">role</th><th class="l">holds</th><th>rtt ms</th><th>trip ms</th></tr></thead><tbody></tbody></table>
<div id="replan">re-plan: <span id="replan_text">–</span></div>
<div id="auto_replan" hidden>auto re-plan: <span id="auto_replan_text">–</span></div>
<table id="replan_peers"><thead><tr><th class="l">peer</th><th class="l">would be</th><th class="l">holding</th></tr></thead><tbody></tbody></table></div>
<div class="card"><h2>Expert activations (share of each layer's tokens)</h2><table id="heat"></table></div>
<script>
const hist = []; let updates = 0;
const el = id => document.getElementById(id);
const svgNS = 'http://www.w3.org/2000/svg';
function node(tag, attrs, text) {
  const n = document.createElementNS(svgNS, tag);
  for (const k in attrs) n.setAttribute(k, attrs[k]);
  if (text !== undefined) n.textContent = text;
  return n;
}
function drawMap(workers) {
  const svg = el('map'); svg.innerHTML = '';
  const cx = 210, cy = 160, rmax = 140;
  const rtts = workers.map(w => Math.max(w.min_latency_ms || w.warmup_rtt_ms || 0.01, 0.01));
  const lo = Math.log10(Math.min(...rtts, 0.1)), hi = Math.log10(Math.max(...rtts, 100));
  workers.forEach((w, i) => {
    const a = 2 * Math.PI * i / Math.max(workers.length, 1) - Math.PI / 2;
    const r = 30 + (rmax - 30) * (Math.log10(rtts[i]) - lo) / Math.max(hi - lo, 1e-9);
    const x = cx + r * Math.cos(a), y = cy + r * Math.sin(a);
    const dash = w.path === 'relay' ? '6,4' : w.path === 'joined' ? '2,3' : '';
    const color = w.state === 'up' ? '#1a7f37' : w.state === 'down' ? '#c62828' : '#6a1b9a';
    svg.appendChild(node('line', {x1: cx, y1: cy, x2: x, y2: y, stroke: color, 'stroke-width': 2, 'stroke-dasharray': dash}));
    svg.appendChild(node('circle', {cx: x, cy: y, r: 9, fill: color, 'data-worker': w.name}));
    svg.appendChild(node('text', {x: x + 12, y: y + 4, 'font-size': 12}, w.name + ' ' + rtts[i].toFixed(2) + ' ms'));
  });
  svg.appendChild(node('circle', {cx, cy, r: 14, fill: '#1565c0'}));
  svg.appendChild(node('text', {x: cx - 30, y: cy + 30, 'font-size': 12}, 'backbone'));
}
function drawChart() {
  const svg = el('chart'); svg.innerHTML = '';
  const W = 460, H = 320, pad = 30, pts = hist.slice(-120);
  if (pts.length < 2) return;
  const series = [['tps', '#1565c0'], ['tpt', '#ef6c00']];
  for (const [key, color] of series) {
    const max = Math.max(...pts.map(p => p[key]), 1e-9);
    const d = pts.map((p, i) => (i ? 'L' : 'M') + (pad + (W - 2 * pad) * i / (pts.length - 1)).toFixed(1) + ',' +
                                 (H - pad - (H - 2 * pad) * p[key] / max).toFixed(1)).join(' ');
    svg.appendChild(node('path', {d, fill: 'none', stroke: color, 'stroke-width': 2}));
    svg.appendChild(node('text', {x: pad, y: key === 'tps' ? 16 : 30, fill: color, 'font-size': 12},
                         key === 'tps' ? 'tokens/s (max ' + max.toFixed(1) + ')' : 'trips/token (max ' + max.toFixed(1) + ')'));
  }
}
function drawWorkers(workers) {
  const tb = el('workers').tBodies[0]; tb.innerHTML = '';
  for (const w of workers) {
    const tr = document.createElement('tr'); tr.className = 'worker'; tr.dataset.name = w.name;
    const cells = [w.index, w.name, w.path, w.state, w.n_experts, w.warmup_rtt_ms.toFixed(3), w.min_latency_ms.toFixed(3),
                   w.last_heard_s < 0 ? '–' : w.last_heard_s.toFixed(1), w.requests, w.errors, w.rejoins,
                   w.threads || '–', w.replica_budget_bytes ? (w.replica_bytes / 1048576).toFixed(1) + ' / ' +
                   (w.replica_budget_bytes / 1048576).toFixed(1) : '–'];
    cells.forEach((c, i) => { const td = document.createElement('td'); td.textContent = c;
      if (i >= 1 && i <= 3) td.className = 'l'; if (i === 3) td.classList.add(w.state); tr.appendChild(td); });
    tb.appendChild(tr);
  }
}
function drawPlan(p) {
  if (!p) return;
  el('plan_err').textContent = p.error ? 'cannot price: ' + p.error : '';
  el('plan_pred').textContent = p.predicted_step_ms !== undefined ? p.predicted_step_ms.toFixed(1) : '–';
  el('plan_meas').textContent = p.measured_step_ms ? p.measured_step_ms.toFixed(1) : '–';
  el('plan_ratio').textContent = p.ratio ? p.ratio.toFixed(2) : '–';
  el('plan_trips').textContent = p.trips_per_step !== undefined ? p.trips_per_step.toFixed(2) : '–';
  el('plan_tps').textContent = p.tokens_per_step;
  const tb = el('plan').tBodies[0]; tb.innerHTML = '';
  for (const r of p.peers || []) {
    const tr = document.createElement('tr'); tr.className = 'planpeer'; tr.dataset.name = r.name; tr.dataset.role = r.role;
    [r.name, r.role, r.what, r.rtt_ms.toFixed(2), r.measured_trip_ms.toFixed(2)].forEach((c, i) => {
      const td = document.createElement('td'); td.textContent = c; if (i < 3) td.className = 'l'; tr.appendChild(td); });
    tb.appendChild(tr);
  }
  document.body.dataset.planPredicted = p.predicted_step_ms !== undefined ? p.predicted_step_ms : '';
  // The planner's layout for the workers up now, priced with the same inputs as the live one.
  const r = p.replan, rb = el('replan_peers').tBodies[0]; rb.innerHTML = '';
  if (!r) { el('replan_text').textContent = 'needs expert workers or span peers (moesh swarm plan --status)'; return; }
  if (r.error) { el('replan_text').textContent = 'cannot plan: ' + r.error; return; }
  const pct = (100 * r.gain).toFixed(1);
  el('replan_text').textContent = r.predicted_step_ms.toFixed(1) + ' ms per step (warm-up RTTs and activation counts, as swarm plan --status) against ' + r.live_step_ms.toFixed(1) +
    ' ms for the live layout priced alike (' + pct + ' % faster) — ' + (r.replan
      ? 'worth the moves: moesh swarm plan -m MODEL --status URL ' + r.args + ' --from live prints them'
      : 'the live layout is close enough');
  el('replan').className = r.replan ? 'down' : 'up';
  document.body.dataset.replan = r.replan ? 'yes' : 'no';
  for (const q of r.peers || []) {
    if (!q.changes) continue;
    const tr = document.createElement('tr'); tr.className = 'replanpeer'; tr.dataset.name = q.name;
    [q.name, q.role, q.what].forEach(c => { const td = document.createElement('td'); td.textContent = c; td.className = 'l'; tr.appendChild(td); });
    rb.appendChild(tr);
  }
}
// `serve --auto-replan`: what the gateway did with its re-plan, or why not.
function drawAuto(a) {
  el('auto_replan').hidden = !a;
  if (!a) return;
  el('auto_replan_text').textContent = 'every ' + a.every_s + ' s: ' + a.applied + ' carried out, ' + a.failed +
    ' failed' + (a.last ? ' (last: ' + a.last.from + ' -> ' + a.last.to + (a.last.lanes ? '; ' + a.last.lanes : '') +
    (a.last.experts ? '; experts to ' + a.last.experts : '') + ')' : '') + ' — ' + (a.last_why || 'no check yet');
  document.body.dataset.autoReplans = a.applied;
}
function drawHeat(h) {
  const t = el('heat'); t.innerHTML = '';
  for (const L of h.layers) {
    const tr = document.createElement('tr');
    const th = document.createElement('th'); th.textContent = 'L' + L.layer; tr.appendChild(th);
    const max = Math.max(...L.share, 1e-9);
    L.share.forEach((s, e) => { const td = document.createElement('td');
      td.style.background = 'rgba(198,40,40,' + (s / max).toFixed(3) + ')'; td.title = 'layer ' + L.layer + ' expert ' + e + ': ' + (100 * s).toFixed(1) + '%';
      tr.appendChild(td); });
    t.appendChild(tr);
  }
}
async function update() {
  try {
    const r = await fetch('/swarm/dashboard.json', {cache: 'no-store'});
    const j = await r.json();
    const last = hist[hist.length - 1];
    const p = {t: j.time_s, gen: j.generated_tokens, calls: j.layer_calls, tps: 0, tpt: 0};
    if (last && p.t > last.t) {
      p.tps = (p.gen - last.gen) / (p.t - last.t);
      p.tpt = p.gen > last.gen ? (p.calls - last.calls) / (p.gen - last.gen) : (last.tpt || 0);
    }
    hist.push(p);
    el('backbone').textContent = j.status.backbone;
    el('generated').textContent = j.generated_tokens;
    el('tps').textContent = p.tps.toFixed(1);
    el('tpt').textContent = p.tpt.toFixed(2);
    el('nup').textContent = j.status.workers.filter(w => w.state === 'up').length + ' / ' + j.status.workers.length;
    drawMap(j.status.workers); drawWorkers(j.status.workers); drawHeat(j.heatmap); drawPlan(j.plan); drawAuto(j.auto_replan); drawChart();
    updates += 1; el('updates').textContent = updates; document.body.dataset.updates = updates;
    // For tests and scrapers: the first and latest generated-token counts this page saw.
    if (document.body.dataset.genFirst === undefined) document.body.dataset.genFirst = j.generated_tokens;
    document.body.dataset.genLast = j.generated_tokens;
  } catch (e) { document.body.dataset.error = String(e); }
}
update(); setInterval(update, 1000);
</script></body></html>
)HTML";
}

}  // namespace moesh::serve
