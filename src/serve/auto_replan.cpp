// The gateway's own re-plan, carried out (auto_replan.h).
#include "serve/auto_replan.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdio>
#include <map>

#include "moesh/plan/live.h"
#include "moesh/swarm/swarm.h"
#include "serve/dashboard.h"

namespace moesh::serve {

namespace {

// doc[key] when it is an array, else an empty one; its objects only (a malformed document is
// read as far as it makes sense, never thrown on).
std::vector<nlohmann::json> objects_of(const nlohmann::json& doc, const char* key) {
  std::vector<nlohmann::json> out;
  if (!doc.is_object() || !doc.contains(key) || !doc[key].is_array()) return out;
  for (const auto& x : doc[key])
    if (x.is_object()) out.push_back(x);
  return out;
}

std::string str(const nlohmann::json& o, const char* key) {
  return o.is_object() && o.contains(key) && o[key].is_string() ? o[key].get<std::string>() : std::string();
}

std::vector<std::string> strings_of(const nlohmann::json& doc, const char* key) {
  std::vector<std::string> out;
  if (!doc.is_object() || !doc.contains(key) || !doc[key].is_array()) return out;
  for (const auto& x : doc[key])
    if (x.is_string()) out.push_back(x.get<std::string>());
  return out;
}

std::vector<std::string> sorted(std::vector<std::string> v) {
  std::sort(v.begin(), v.end());
  return v;
}

}  // namespace

AutoReplanDecision decide_auto_replan(const nlohmann::json& replan) {
  AutoReplanDecision d;
  if (!replan.is_object()) {
    d.why = "no re-plan yet";
    return d;
  }
  if (replan.contains("error")) {
    d.why = "no re-plan: " + replan["error"].dump();
    return d;
  }
  d.gain = replan.contains("gain") && replan["gain"].is_number() ? replan["gain"].get<double>() : 0.0;
  if (!replan.contains("replan") || !replan["replan"].is_boolean() || !replan["replan"].get<bool>()) {
    d.why = fmt::format("the plan is {:.1f} % faster than the live layout (moves from {:.0f} %)", 100 * d.gain,
                        100 * kReplanGain);
    return d;
  }
  if (!replan.contains("live") || !replan.contains("plan")) {
    d.why = "the re-plan names no layouts";
    return d;
  }
  const nlohmann::json& live = replan["live"];
  // A span and its lanes cost the same whichever of their peers is the span's own (the slowest
  // holder's trip): where the live span's peer is one of the plan's lanes of it, it stays the
  // span's peer and the plan's one becomes the lane, so the span does not move for nothing.
  nlohmann::json plan = replan["plan"];
  if (plan.contains("roles") && plan["roles"].is_array()) {
    std::map<std::string, std::string> live_span_peer;  // layers -> peer
    for (const auto& r : objects_of(live, "roles"))
      if (str(r, "role") == "span") live_span_peer[str(r, "layers")] = str(r, "peer");
    for (auto& r : plan["roles"]) {
      if (!r.is_object() || str(r, "role") != "lane") continue;
      auto it = live_span_peer.find(str(r, "layers"));
      if (it == live_span_peer.end() || it->second != str(r, "peer")) continue;
      const std::string own = str(r, "lane_of");
      for (auto& o : plan["roles"]) {
        if (!o.is_object() || str(o, "peer") != own || str(o, "role") != "span" || str(o, "layers") != str(r, "layers"))
          continue;
        o["role"] = "lane";
        o["lane_of"] = str(r, "peer");
        r["role"] = "span";
        r.erase("lane_of");
        for (auto& x : plan["roles"])  // its other lanes follow
          if (x.is_object() && str(x, "role") == "lane" && str(x, "lane_of") == own) x["lane_of"] = str(r, "peer");
        break;
      }
    }
  }
  // The peers that can be given blocks, by name: span peers in use now or idle, and workers on the
  // full model (marked span_peer too); a worker on an expert slice runs none.
  std::map<std::string, std::string> span_peers;  // name -> addr
  std::map<std::string, nlohmann::json> live_role;
  for (const auto& r : objects_of(live, "roles")) {
    const bool span_peer = r.contains("span_peer") && r["span_peer"].is_boolean() && r["span_peer"].get<bool>();
    if (str(r, "role") == "span" || span_peer) span_peers[str(r, "peer")] = str(r, "addr");
    live_role[str(r, "peer")] = r;
  }
  // The expert roles that change: what each such peer is to hold (carried out as copies of what it
  // lacks, and its replicas of what it is not to hold let go of). A live expert holder the plan
  // gives another role (or none) is to hold nothing.
  for (const auto& r : objects_of(plan, "roles")) {
    const bool holds = str(r, "role") == "experts" && !str(r, "experts").empty();
    auto it = live_role.find(str(r, "peer"));
    const bool held =
        it != live_role.end() && str(it->second, "role") == "experts" && !str(it->second, "experts").empty();
    if (!holds && !held) continue;
    if (holds && held && str(it->second, "experts") == str(r, "experts")) continue;
    d.experts.push_back({str(r, "peer"), str(r, "addr"), holds ? str(r, "experts") : std::string()});
  }
  const SpanListChange c = span_list_change(live, plan);
  if (!c.same && !c.live) {
    d.why =
        "the plan's spans take blocks the backbone runs as its own: restart it with them as --span F-L@here to let "
        "re-plans move them";
    d.experts.clear();
    return d;
  }
  // Same edges: the spans may still change peers (a resplit moves them too).
  std::vector<SpanListEntry> list = c.list;
  if (c.same) {
    list.clear();
    for (const auto& r : objects_of(plan, "roles")) {
      int first = 0, last = 0;
      if (str(r, "role") != "span" || std::sscanf(str(r, "layers").c_str(), "%d-%d", &first, &last) != 2) continue;
      list.push_back({first, last, str(r, "addr"), str(r, "peer")});
    }
    for (const std::string& h : strings_of(live, "here")) {
      int first = 0, last = 0;
      if (std::sscanf(h.c_str(), "%d-%d", &first, &last) == 2) list.push_back({first, last, "here", ""});
    }
    std::sort(list.begin(), list.end(),
              [](const SpanListEntry& x, const SpanListEntry& y) { return x.first < y.first; });
  }
  for (const SpanListEntry& e : list) {
    if (e.to == "here") continue;
    if (span_peers.count(e.peer) == 0) {
      d.why = fmt::format(
          "the plan gives blocks {}-{} to {}, which is not a span peer and cannot load blocks (a worker on an expert "
          "slice): not applied",
          e.first, e.last, e.peer);
      d.experts.clear();
      return d;
    }
    if (e.to.empty()) {
      d.why = fmt::format("the plan gives blocks {}-{} to {}, whose address the gateway does not know (it joined)",
                          e.first, e.last, e.peer);
      d.experts.clear();
      return d;
    }
  }
  // Lanes: the plan's that are not live are added, the live ones it lacks let go of. A lane goes
  // to a span peer with an address, like a span.
  auto lanes_of = [](const nlohmann::json& doc) {
    std::vector<AutoReplanLane> out;
    for (const auto& r : objects_of(doc, "roles"))
      if (str(r, "role") == "lane") out.push_back({str(r, "layers"), str(r, "peer"), str(r, "addr")});
    return out;
  };
  const std::vector<AutoReplanLane> live_lanes = lanes_of(live), plan_lanes = lanes_of(plan);
  for (const AutoReplanLane& l : plan_lanes) {
    if (std::find(live_lanes.begin(), live_lanes.end(), l) != live_lanes.end()) continue;
    if (span_peers.count(l.peer) == 0 || l.addr.empty()) {
      d.why = fmt::format("the plan makes {} a lane of blocks {}, and it {}: not applied", l.peer, l.layers,
                          l.addr.empty() ? "has no address the gateway knows" : "cannot load blocks");
      d.experts.clear();
      return d;
    }
    d.add_lanes.push_back(l);
  }
  for (const AutoReplanLane& l : live_lanes)
    if (std::find(plan_lanes.begin(), plan_lanes.end(), l) == plan_lanes.end()) d.drop_lanes.push_back(l);
  std::vector<std::string> now;
  for (const auto& r : objects_of(live, "roles"))
    if (str(r, "role") == "span") now.push_back(str(r, "layers") + "@" + str(r, "addr"));
  for (const std::string& h : strings_of(live, "here")) now.push_back(h + "@here");
  for (const SpanListEntry& e : list) d.spans.push_back(fmt::format("{}-{}@{}", e.first, e.last, e.to));
  std::vector<std::string> a = now, b = d.spans;
  std::sort(a.begin(), a.end());
  std::sort(b.begin(), b.end());
  if (a == b) d.spans.clear();  // the spans are the plan's already
  if (d.spans.empty() && d.experts.empty() && d.add_lanes.empty() && d.drop_lanes.empty()) {
    d.why = "the plan's roles are the live ones already (its gain is in where pairs go: --rebalance)";
    return d;
  }
  d.apply = true;
  return d;
}

AutoReplanner::AutoReplanner(Scheduler* scheduler, RemoteExecutor* remote, const Model* model, SpanClient* spans,
                             std::chrono::milliseconds every, PlanCosts costs)
    : scheduler_(scheduler), remote_(remote), model_(model), spans_(spans), every_(every), costs_(costs) {
  thread_ = std::thread([this] { loop(); });
}

AutoReplanner::~AutoReplanner() {
  stop();
}

void AutoReplanner::stop() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void AutoReplanner::loop() {
  std::unique_lock<std::mutex> lk(mu_);
  while (!stop_) {
    cv_.wait_for(lk, every_, [this] { return stop_; });
    if (stop_) break;
    lk.unlock();
    check();
    lk.lock();
  }
}

// An expert role of the plan, as the executor is asked to carry it out: the worker (its name,
// or the address to dial for a peer that is no worker yet) and the experts it lacks.
struct AutoReplanner::ExpertAsk {
  std::string worker;
  std::string dial;  // non-empty: dial it first (a span peer made an expert holder)
  std::vector<wire::ExpertRange> missing;
  std::vector<wire::ExpertRange> extra;  // held and not the plan's: let go of (replicas only)
  std::string text;                      // "PEER: SPEC" for the status
};

Result<std::vector<AutoReplanner::ExpertAsk>> AutoReplanner::expert_asks(
    const std::vector<AutoReplanExperts>& changes) const {
  std::vector<ExpertAsk> out;
  if (changes.empty()) return out;
  if (remote_ == nullptr)
    return make_error(StatusCode::kUnsupported,
                      "the plan gives peers experts and this gateway dispatches to no workers (start it with --worker "
                      "or --accept-workers)");
  MOESH_ASSIGN_OR_RETURN(swarm::ModelShape shape, swarm::model_shape(model_->file()));
  const std::vector<WorkerStatus> ws = remote_->worker_status();
  for (const AutoReplanExperts& c : changes) {
    swarm::ExpertSet want;
    if (!c.experts.empty()) {
      MOESH_ASSIGN_OR_RETURN(want, swarm::parse_expert_spec(c.experts, shape));
    }
    ExpertAsk a;
    a.text = c.peer + ": " + (c.experts.empty() ? std::string("none") : c.experts);
    swarm::ExpertSet held;
    const WorkerStatus* w = nullptr;
    for (const WorkerStatus& x : ws) {
      if (x.state != "up") continue;
      if ((!x.name.empty() && x.name == c.peer) || x.label == c.peer || (!c.addr.empty() && x.address == c.addr))
        w = &x;
    }
    if (w != nullptr) {
      a.worker = w->address;
      auto h = swarm::parse_expert_spec(w->experts, shape);
      if (h) held = std::move(*h);
    } else {
      if (c.experts.empty()) continue;  // to hold nothing, and holds nothing here
      if (c.addr.empty())
        return make_error(StatusCode::kUnavailable,
                          "the plan gives experts to {}, which is no worker of this gateway and has no address",
                          c.peer);
      a.worker = c.addr;
      a.dial = c.addr;
    }
    std::vector<wire::ExpertRange> missing, extra;
    for (const wire::ExpertRange& r : want.ranges)
      for (uint32_t k = 0; k < r.count; ++k)
        if (!held.holds(r.layer, r.first + k)) missing.push_back({r.layer, r.first + k, 1});
    // Only a worker that keeps replicas has any to let go of (the rest of what it holds is its own
    // file's, and stays).
    if (w != nullptr && w->replica_budget_bytes > 0)
      for (const wire::ExpertRange& r : held.ranges)
        for (uint32_t k = 0; k < r.count; ++k)
          if (!want.holds(r.layer, r.first + k)) extra.push_back({r.layer, r.first + k, 1});
    a.missing = swarm::canonicalize(std::move(missing)).ranges;
    a.extra = swarm::canonicalize(std::move(extra)).ranges;
    if (!a.extra.empty()) a.text += " (let go of " + swarm::canonicalize(a.extra).to_string() + ")";
    if (!a.missing.empty() || !a.extra.empty()) out.push_back(std::move(a));
  }
  return out;
}

void AutoReplanner::check() {
  checks_.fetch_add(1);
  const nlohmann::json dash = dashboard_json(scheduler_->stats(), remote_, 0, model_, spans_, costs_);
  nlohmann::json replan = dash.contains("plan") && dash["plan"].is_object() && dash["plan"].contains("replan")
                              ? dash["plan"]["replan"]
                              : nlohmann::json();
  // A gateway running no spans can carry out expert roles only: its re-plan is the planner's best
  // without spans (the dashboard still shows what spans would give).
  if (spans_ == nullptr && dash.contains("status") && dash.contains("heatmap")) {
    auto int_of = [&](const char* key) {
      return dash["plan"].is_object() && dash["plan"].contains(key) && dash["plan"][key].is_number_integer()
                 ? dash["plan"][key].get<int>()
                 : 1;
    };
    replan = replan_json(*model_, remote_, dash["status"], dash["heatmap"],
                         ReplanLoad{int_of("tokens_per_step"), int_of("streams"), costs_}, /*spans_allowed=*/false);
  }
  AutoReplanDecision d = decide_auto_replan(replan);
  std::vector<ExpertAsk> asks;
  if (d.apply) {
    auto got = expert_asks(d.experts);
    if (!got) {
      d.apply = false;
      d.why = got.status().message();
    } else {
      asks = std::move(*got);
      if (d.spans.empty() && asks.empty() && d.add_lanes.empty() && d.drop_lanes.empty()) {
        d.apply = false;
        d.why = "the experts the plan gives its peers are theirs already";
      }
    }
  }
  if (d.apply && (!d.spans.empty() || !d.add_lanes.empty() || !d.drop_lanes.empty()) && spans_ == nullptr) {
    d.apply = false;
    d.why = "the plan moves spans and this gateway runs none";
  }
  std::vector<std::string> key = d.spans;  // what this re-plan does, for the guards below
  for (const ExpertAsk& a : asks) key.push_back(a.text);
  for (const AutoReplanLane& l : d.add_lanes) key.push_back("lane " + l.layers + "@" + l.addr);
  for (const AutoReplanLane& l : d.drop_lanes) key.push_back("no lane " + l.layers + "@" + l.addr);
  std::sort(key.begin(), key.end());
  const auto now = std::chrono::steady_clock::now();
  if (d.apply) {
    std::lock_guard<std::mutex> lk(mu_);
    const bool applied_before = applied_.load() > 0;
    if (key == failed_key_ && now - failed_at_ < std::chrono::duration<double>(kRetryFailedSeconds)) {
      d.apply = false;
      d.why = "the plan's layout failed less than 10 minutes ago: " + last_.value("error", std::string());
    } else if (applied_before && now - applied_at_ < std::chrono::duration<double>(kAutoReplanDwellSeconds)) {
      d.apply = false;
      d.why = fmt::format("a re-plan was carried out {:.0f} s ago: the next waits {:.0f} s",
                          std::chrono::duration<double>(now - applied_at_).count(), kAutoReplanDwellSeconds);
    } else if (applied_before && !d.spans.empty() && sorted(d.spans) == before_spans_ &&
               now - applied_at_ < std::chrono::duration<double>(kRetryFailedSeconds)) {
      d.apply = false;
      d.why = "the plan would undo the re-plan carried out less than 10 minutes ago";
    } else if (key == applied_key_ && now - applied_at_ < std::chrono::duration<double>(kRetryFailedSeconds)) {
      // Copies asked for and not (yet) there: asked again only after 10 minutes.
      d.apply = false;
      d.why = "the plan's experts were asked for less than 10 minutes ago: " + experts_outcome();
    }
  }
  if (!d.apply) {
    std::lock_guard<std::mutex> lk(mu_);
    last_why_ = d.why;
    return;
  }
  std::vector<SpanPlacement> want;
  for (const std::string& s : d.spans) {
    auto p = parse_span_placement(s);
    if (!p) {
      std::lock_guard<std::mutex> lk(mu_);
      last_why_ = p.status().message();
      return;
    }
    want.push_back(*p);
  }
  std::string from, to, experts;
  std::vector<std::string> before;
  if (spans_ != nullptr) {
    for (const std::string& w : spans_->where_all()) from += (from.empty() ? "" : ", ") + w;
    // The layout now, as placements (what undoing this re-plan would resplit to).
    for (const SpanPeerView& v : spans_->peers_view())
      before.push_back(fmt::format("{}-{}@{}", v.span.first, v.span.last, v.local ? std::string("here") : v.address));
    std::sort(before.begin(), before.end());
  }
  for (const std::string& s : d.spans) to += (to.empty() ? "" : ", ") + s;
  std::string lanes;
  for (const AutoReplanLane& l : d.add_lanes)
    lanes += fmt::format("{}+ lane {}@{}", lanes.empty() ? "" : ", ", l.layers, l.addr);
  for (const AutoReplanLane& l : d.drop_lanes)
    lanes += fmt::format("{}- lane {}@{}", lanes.empty() ? "" : ", ", l.layers, l.addr);
  for (const ExpertAsk& a : asks) experts += (experts.empty() ? "" : "; ") + a.text;
  spdlog::info("auto re-plan: {:.0f} % faster predicted:{}{}{}", 100 * d.gain,
               d.spans.empty() ? "" : fmt::format(" spans {} -> {}", from, to),
               asks.empty() ? "" : fmt::format(" experts to {}", experts), lanes.empty() ? "" : " " + lanes);
  Status st = d.spans.empty() ? Status::ok() : spans_->resplit(want);
  // Lanes after the resplit (it let go of the lanes of the spans it changed): those the plan drops
  // first, so their peers are free for what it gives them.
  for (const AutoReplanLane& l : d.drop_lanes) {
    if (!st.is_ok()) break;
    auto sp = parse_layer_span(l.layers);
    if (!sp) {
      st = sp.status();
      break;
    }
    Status dropped = spans_->drop_lane(*sp, l.addr);
    if (!dropped.is_ok() && dropped.code() != StatusCode::kNotFound) st = dropped;  // NotFound: the resplit did
  }
  for (const AutoReplanLane& l : d.add_lanes) {
    if (!st.is_ok()) break;
    auto sp = parse_layer_span(l.layers);
    st = sp ? spans_->add_lane(*sp, l.addr) : sp.status();
  }
  // Then the experts: a peer that is no worker yet is dialled (a span peer made an expert holder:
  // the resplit let go of its blocks first), and each is sent the copies it lacks between calls.
  for (const ExpertAsk& a : asks) {
    if (!st.is_ok()) break;
    if (!a.dial.empty()) {
      auto addr = parse_worker_address(a.dial);
      if (!addr) {
        st = addr.status();
        break;
      }
      Status dialled = remote_->dial_worker(*addr);
      if (!dialled.is_ok() && dialled.code() != StatusCode::kInvalidArgument) st = dialled;  // else: dialled already
    }
    // Copies first, then what it is to let go of: the executor sends the drops before the copies
    // (they free replica budget) and tries those that were an expert's last holder again after.
    if (st.is_ok() && !a.missing.empty()) remote_->request_experts(a.worker, a.missing);
    if (st.is_ok() && !a.extra.empty()) remote_->drop_experts(a.worker, a.extra);
  }
  std::lock_guard<std::mutex> lk(mu_);
  last_ = {{"from", from}, {"to", to}, {"gain", d.gain}, {"ok", st.is_ok()}};
  if (!asks.empty()) last_["experts"] = experts;
  if (!lanes.empty()) last_["lanes"] = lanes;
  last_at_ = std::chrono::steady_clock::now();
  if (st.is_ok()) {
    applied_.fetch_add(1);
    applied_at_ = last_at_;
    if (!d.spans.empty()) before_spans_ = std::move(before);
    applied_key_ = key;
    last_why_ = "applied";
  } else {
    failed_.fetch_add(1);
    last_["error"] = st.message();
    last_why_ = "the re-plan failed: " + st.message();
    failed_key_ = key;
    failed_at_ = last_at_;
    spdlog::warn("auto re-plan: {}", st.to_string());
  }
}

std::string AutoReplanner::experts_outcome() const {
  if (remote_ == nullptr) return "no workers";
  const ExpertRequestReport r = remote_->expert_requests();
  return fmt::format("{} done, {} failed, {} pending{}", r.done, r.failed, r.pending,
                     r.last_error.empty() ? "" : " (last error: " + r.last_error + ")");
}

nlohmann::json AutoReplanner::status() const {
  std::lock_guard<std::mutex> lk(mu_);
  nlohmann::json j{{"every_s", every_.count() / 1000.0},
                   {"checks", checks_.load()},
                   {"applied", applied_.load()},
                   {"failed", failed_.load()},
                   {"last_why", last_why_}};
  if (remote_ != nullptr) {
    const ExpertRequestReport r = remote_->expert_requests();
    j["experts"] = {{"requests", r.requests}, {"done", r.done},   {"failed", r.failed},
                    {"pending", r.pending},   {"copies", r.sent}, {"copied_bytes", r.sent_bytes},
                    {"dropped", r.dropped},   {"kept", r.kept},   {"last_error", r.last_error}};
  }
  if (!last_.is_null()) {
    j["last"] = last_;
    j["last"]["seconds_ago"] = std::chrono::duration<double>(std::chrono::steady_clock::now() - last_at_).count();
  }
  return j;
}

}  // namespace moesh::serve
