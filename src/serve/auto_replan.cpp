// The gateway's own re-plan, carried out (auto_replan.h).
#include "serve/auto_replan.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdio>
#include <map>

#include "moesh/plan/live.h"
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
  const nlohmann::json& plan = replan["plan"];
  // The peers that can be given blocks, by name: span peers in use now or idle, and workers on the
  // full model (marked span_peer too); a worker on an expert slice runs none.
  std::map<std::string, std::string> span_peers;  // name -> addr
  for (const auto& r : objects_of(live, "roles")) {
    const bool span_peer = r.contains("span_peer") && r["span_peer"].is_boolean() && r["span_peer"].get<bool>();
    if (str(r, "role") == "span" || span_peer) span_peers[str(r, "peer")] = str(r, "addr");
  }
  const SpanListChange c = span_list_change(live, plan);
  if (!c.same && !c.live) {
    d.why =
        "the plan's spans take blocks the backbone runs as its own: restart it with them as --span F-L@here to let "
        "re-plans move them";
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
  if (list.empty()) {
    d.why = "the plan keeps no spans: the gain is in the experts (--rebalance moves those)";
    return d;
  }
  for (const SpanListEntry& e : list) {
    if (e.to == "here") continue;
    if (span_peers.count(e.peer) == 0) {
      d.why = fmt::format(
          "the plan gives blocks {}-{} to {}, which is not a span peer and cannot load blocks (a worker on an expert "
          "slice): not applied",
          e.first, e.last, e.peer);
      return d;
    }
    if (e.to.empty()) {
      d.why = fmt::format("the plan gives blocks {}-{} to {}, whose address the gateway does not know (it joined)",
                          e.first, e.last, e.peer);
      return d;
    }
  }
  std::vector<std::string> now;
  for (const auto& r : objects_of(live, "roles"))
    if (str(r, "role") == "span") now.push_back(str(r, "layers") + "@" + str(r, "addr"));
  for (const std::string& h : strings_of(live, "here")) now.push_back(h + "@here");
  for (const SpanListEntry& e : list) d.spans.push_back(fmt::format("{}-{}@{}", e.first, e.last, e.to));
  std::vector<std::string> a = now, b = d.spans;
  std::sort(a.begin(), a.end());
  std::sort(b.begin(), b.end());
  if (a == b) {
    d.spans.clear();
    d.why = "the spans are the plan's already: the gain is in the experts (--rebalance moves those)";
    return d;
  }
  d.apply = true;
  return d;
}

AutoReplanner::AutoReplanner(Scheduler* scheduler, RemoteExecutor* remote, const Model* model, SpanClient* spans,
                             std::chrono::milliseconds every)
    : scheduler_(scheduler), remote_(remote), model_(model), spans_(spans), every_(every) {
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

void AutoReplanner::check() {
  checks_.fetch_add(1);
  const nlohmann::json dash = dashboard_json(scheduler_->stats(), remote_, 0, model_, spans_);
  const nlohmann::json replan = dash.contains("plan") && dash["plan"].is_object() && dash["plan"].contains("replan")
                                    ? dash["plan"]["replan"]
                                    : nlohmann::json();
  AutoReplanDecision d = decide_auto_replan(replan);
  const auto now = std::chrono::steady_clock::now();
  if (d.apply) {
    std::lock_guard<std::mutex> lk(mu_);
    auto sorted = [](std::vector<std::string> v) {
      std::sort(v.begin(), v.end());
      return v;
    };
    const bool applied_before = applied_.load() > 0;
    if (d.spans == failed_spans_ && now - failed_at_ < std::chrono::duration<double>(kRetryFailedSeconds)) {
      d.apply = false;
      d.why = "the plan's layout failed less than 10 minutes ago: " + last_.value("error", std::string());
    } else if (applied_before && now - applied_at_ < std::chrono::duration<double>(kAutoReplanDwellSeconds)) {
      d.apply = false;
      d.why = fmt::format("a re-plan was carried out {:.0f} s ago: the next waits {:.0f} s",
                          std::chrono::duration<double>(now - applied_at_).count(), kAutoReplanDwellSeconds);
    } else if (applied_before && sorted(d.spans) == before_spans_ &&
               now - applied_at_ < std::chrono::duration<double>(kRetryFailedSeconds)) {
      d.apply = false;
      d.why = "the plan would undo the re-plan carried out less than 10 minutes ago";
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
  std::string from;
  for (const std::string& w : spans_->where_all()) from += (from.empty() ? "" : ", ") + w;
  // The layout now, as placements (what undoing this re-plan would resplit to).
  std::vector<std::string> before;
  for (const SpanPeerView& v : spans_->peers_view())
    before.push_back(fmt::format("{}-{}@{}", v.span.first, v.span.last, v.local ? std::string("here") : v.address));
  std::sort(before.begin(), before.end());
  std::string to;
  for (const std::string& s : d.spans) to += (to.empty() ? "" : ", ") + s;
  spdlog::info("auto re-plan: {:.0f} % faster predicted: spans {} -> {}", 100 * d.gain, from, to);
  const Status st = spans_->resplit(want);
  std::lock_guard<std::mutex> lk(mu_);
  last_ = {{"from", from}, {"to", to}, {"gain", d.gain}, {"ok", st.is_ok()}};
  last_at_ = std::chrono::steady_clock::now();
  if (st.is_ok()) {
    applied_.fetch_add(1);
    applied_at_ = last_at_;
    before_spans_ = std::move(before);
    last_why_ = "applied";
  } else {
    failed_.fetch_add(1);
    last_["error"] = st.message();
    last_why_ = "the resplit failed: " + st.message();
    failed_spans_ = d.spans;
    failed_at_ = last_at_;
    spdlog::warn("auto re-plan: {}", st.to_string());
  }
}

nlohmann::json AutoReplanner::status() const {
  std::lock_guard<std::mutex> lk(mu_);
  nlohmann::json j{{"every_s", every_.count() / 1000.0},
                   {"checks", checks_.load()},
                   {"applied", applied_.load()},
                   {"failed", failed_.load()},
                   {"last_why", last_why_}};
  if (!last_.is_null()) {
    j["last"] = last_;
    j["last"]["seconds_ago"] = std::chrono::duration<double>(std::chrono::steady_clock::now() - last_at_).count();
  }
  return j;
}

}  // namespace moesh::serve
