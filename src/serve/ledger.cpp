// The work ledger's JSON form and the two-sided check (serve/ledger.h).
#include "moesh/serve/ledger.h"

#include <fmt/format.h>

namespace moesh::serve {
namespace {

// Every counted field, by name, in one place: the JSON writer, the parser and the check use it.
struct CountField {
  const char* name;
  uint64_t swarm::LedgerEntry::*member;
};
constexpr CountField kCounts[] = {
    {"requests", &swarm::LedgerEntry::requests},
    {"dispatches", &swarm::LedgerEntry::dispatches},
    {"pairs", &swarm::LedgerEntry::pairs},
    {"tokens", &swarm::LedgerEntry::tokens},
    {"dispatch_bytes", &swarm::LedgerEntry::dispatch_bytes},
    {"combine_bytes", &swarm::LedgerEntry::combine_bytes},
    {"errors", &swarm::LedgerEntry::errors},
    {"fetches", &swarm::LedgerEntry::fetches},
    {"fetch_bytes", &swarm::LedgerEntry::fetch_bytes},
    {"verified", &swarm::LedgerEntry::verified},
    {"mismatches", &swarm::LedgerEntry::mismatches},
};

const CountField* count_field(std::string_view name) {
  for (const CountField& f : kCounts)
    if (name == f.name) return &f;
  return nullptr;
}

}  // namespace

nlohmann::json ledger_json(std::string_view role, std::string_view name, const std::vector<swarm::LedgerEntry>& peers) {
  nlohmann::json j;
  j["role"] = role;
  j["name"] = name;
  j["peers"] = nlohmann::json::array();
  for (const swarm::LedgerEntry& e : peers) {
    nlohmann::json p;
    p["peer"] = e.peer;
    p["address"] = e.address;
    for (const CountField& f : kCounts) p[f.name] = e.*f.member;
    p["compute_seconds"] = e.compute_seconds;
    p["connected_seconds"] = e.connected_seconds;
    p["connected"] = e.connected;
    j["peers"].push_back(std::move(p));
  }
  return j;
}

Result<LedgerDoc> parse_ledger(const nlohmann::json& j) {
  auto bad = [](const std::string& what) {
    return make_error(StatusCode::kInvalidArgument, "ledger document: {}", what);
  };
  if (!j.is_object()) return bad("not a JSON object");
  LedgerDoc d;
  if (!j.contains("role") || !j["role"].is_string()) return bad("\"role\" missing or not a string");
  if (!j.contains("name") || !j["name"].is_string()) return bad("\"name\" missing or not a string");
  if (!j.contains("peers") || !j["peers"].is_array()) return bad("\"peers\" missing or not an array");
  d.role = j["role"].get<std::string>();
  d.name = j["name"].get<std::string>();
  for (size_t i = 0; i < j["peers"].size(); ++i) {
    const nlohmann::json& p = j["peers"][i];
    if (!p.is_object() || !p.contains("peer") || !p["peer"].is_string())
      return bad(fmt::format("peers[{}] has no \"peer\" name", i));
    swarm::LedgerEntry e;
    e.peer = p["peer"].get<std::string>();
    if (p.contains("address") && p["address"].is_string()) e.address = p["address"].get<std::string>();
    for (const CountField& f : kCounts) {
      if (!p.contains(f.name)) continue;
      if (!p[f.name].is_number_unsigned()) return bad(fmt::format("peers[{}].{} is not a count", i, f.name));
      e.*f.member = p[f.name].get<uint64_t>();
    }
    if (p.contains("compute_seconds") && p["compute_seconds"].is_number())
      e.compute_seconds = p["compute_seconds"].get<double>();
    if (p.contains("connected_seconds") && p["connected_seconds"].is_number())
      e.connected_seconds = p["connected_seconds"].get<double>();
    if (p.contains("connected") && p["connected"].is_boolean()) e.connected = p["connected"].get<bool>();
    d.peers.push_back(std::move(e));
  }
  return d;
}

namespace {
nlohmann::json paths_json(const WorkerStatus& w) {
  nlohmann::json a = nlohmann::json::array();
  for (const WorkerStatus::Path& p : w.paths)
    a.push_back({{"address", p.address}, {"ok", p.ok}, {"rtt_ms", p.rtt_ms}, {"error", p.error}, {"used", p.used}});
  return a;
}
// {"other worker's label": ms, ...}: what this worker measured to each (PROBE).
nlohmann::json peer_rtts_json(const WorkerStatus& w) {
  nlohmann::json o = nlohmann::json::object();
  for (const auto& [label, ms] : w.peer_rtt_ms) o[label] = ms;
  return o;
}
}  // namespace

nlohmann::json swarm_status_json(const RemoteExecutor* remote, const SpanClient* spans) {
  nlohmann::json j;
  j["backbone"] = remote != nullptr ? remote->options().name : "backbone";
  j["workers"] = nlohmann::json::array();
  j["joins"] = nlohmann::json::array();
  j["accepting"] = nullptr;
  j["refused_joins"] = 0;
  j["last_refusal"] = "";
  j["spans"] = nlohmann::json::array();
  if (spans != nullptr) {
    // One entry per span peer: what it runs (state up, here, lane or idle) and its machine.
    auto entry = [](const SpanPeerView& v, const char* state, bool runs) {
      nlohmann::json e{{"layers", runs ? fmt::format("{}-{}", v.span.first, v.span.last) : std::string()},
                       {"label", v.label},
                       {"state", state},
                       {"chosen_here", v.chosen_here},
                       {"address", v.address},
                       {"warmup_rtt_ms", v.warmup_rtt_ms},
                       {"min_trip_ms", v.min_trip_seconds * 1e3},
                       {"trips", v.trips},
                       {"compute_seconds", v.compute_seconds},
                       {"compute_steps", v.compute_steps},
                       {"compute_rows", v.compute_rows},
                       {"slab_bytes", v.slab_bytes},
                       {"mem_total_bytes", v.mem_total_bytes},
                       {"mem_available_bytes", v.mem_available_bytes},
                       {"offer_bytes", v.offer_bytes},
                       {"replica_budget_bytes", v.replica_budget_bytes}};
      if (std::string(state) == "lane") e["sequences"] = v.sequences;
      return e;
    };
    for (const SpanPeerView& v : spans->peers_view()) j["spans"].push_back(entry(v, v.local ? "here" : "up", true));
    // Lanes: more peers running a span's blocks, each for its share of the sequences.
    for (const SpanPeerView& v : spans->lanes_view()) j["spans"].push_back(entry(v, "lane", true));
    // Span peers known but running none of these spans: what a re-plan may give blocks to.
    for (const SpanPeerView& v : spans->idle_view()) j["spans"].push_back(entry(v, "idle", false));
  }
  if (remote == nullptr) return j;
  for (const WorkerStatus& w : remote->worker_status()) {
    j["workers"].push_back({{"index", w.index},
                            {"label", w.label},
                            {"name", w.name},
                            {"path", worker_path_name(w.path)},
                            {"address", w.address},
                            {"state", w.state},
                            {"experts", w.experts},
                            {"n_experts", w.n_experts},
                            {"warmup_rtt_ms", w.warmup_rtt_ms},
                            {"min_latency_ms", w.min_latency_ms},
                            {"recent_trip_ms", w.recent_trip_ms},
                            {"mean_latency_ms", w.mean_latency_ms},
                            {"last_heard_s", w.last_heard_s},
                            {"requests", w.requests},
                            {"errors", w.errors},
                            {"rejoins", w.rejoins},
                            {"failovers", w.failovers},
                            {"compute_seconds", w.compute_seconds},
                            {"compute_pairs", w.compute_pairs},
                            {"threads", w.threads},
                            {"cores", w.cores},
                            {"slab_bytes", w.slab_bytes},
                            {"replica_bytes", w.replica_bytes},
                            {"replica_budget_bytes", w.replica_budget_bytes},
                            {"rss_bytes", w.rss_bytes},
                            {"mem_total_bytes", w.mem_total_bytes},
                            {"mem_available_bytes", w.mem_available_bytes},
                            {"offer_bytes", w.offer_bytes},
                            {"loads_blocks", w.loads_blocks},
                            {"peer_rtt_ms", peer_rtts_json(w)},
                            {"paths", paths_json(w)}});
  }
  // Experts asked of workers (a re-plan, POST /swarm/workers/experts): copies and replicas let go of.
  const ExpertRequestReport er = remote->expert_requests();
  j["expert_requests"] = {{"requests", er.requests}, {"done", er.done},   {"failed", er.failed},
                          {"pending", er.pending},   {"copies", er.sent}, {"copied_bytes", er.sent_bytes},
                          {"dropped", er.dropped},   {"kept", er.kept},   {"last_error", er.last_error}};
  // Dialled workers that have not answered since start-up (re-dialled in the background).
  j["late"] = nlohmann::json::array();
  for (const RemoteExecutor::LateWorker& l : remote->late_workers())
    j["late"].push_back({{"address", l.address}, {"last_error", l.last_error}, {"attempts", l.attempts}});
  if (const std::shared_ptr<WorkerRegistry>& reg = remote->options().registry) {
    j["accepting"] = reg->port();
    const auto now = std::chrono::steady_clock::now();
    for (const JoinRecord& r : reg->records()) {
      j["joins"].push_back({{"name", r.name},
                            {"address", r.address},
                            {"experts", r.experts},
                            {"joins", r.joins},
                            {"held", r.held},
                            {"warmup_rtt_ms", r.warmup_rtt_ms},
                            {"since_join_s", std::chrono::duration<double>(now - r.last_join).count()}});
    }
    j["refused_joins"] = reg->refused();
    j["last_refusal"] = reg->last_refusal();
  }
  return j;
}

std::string render_swarm_status(const nlohmann::json& j) {
  auto num = [](const nlohmann::json& v, const char* k) {
    return v.contains(k) && v[k].is_number() ? v[k].get<double>() : 0.0;
  };
  auto str = [](const nlohmann::json& v, const char* k) {
    return v.contains(k) && v[k].is_string() ? v[k].get<std::string>() : std::string();
  };
  // ", machine T GiB (F GiB free), offers O MiB" from a peer's INFO figures (parts it did not report left out).
  auto machine_memory = [&](const nlohmann::json& v) {
    const double total = num(v, "mem_total_bytes"), offer = num(v, "offer_bytes");
    std::string m;
    if (total > 0)
      m = fmt::format(", machine {:.1f} GiB ({:.1f} GiB free)", total / 1073741824.0,
                      num(v, "mem_available_bytes") / 1073741824.0);
    if (offer > 0) m += fmt::format(", offers {:.1f} MiB", offer / 1048576.0);
    return m;
  };
  std::string s = fmt::format("backbone '{}'", str(j, "backbone"));
  s += j.contains("accepting") && j["accepting"].is_number()
           ? fmt::format(", accepting workers on port {}\n", j["accepting"].get<int>())
           : std::string(", not accepting joins\n");
  s += fmt::format("{:<3} {:<24} {:<7} {:<8} {:>7} {:>9} {:>9} {:>8} {:>9} {:>7}  {}\n", "#", "worker", "path", "state",
                   "experts", "rtt ms", "min ms", "heard s", "requests", "errors", "address");
  if (j.contains("workers") && j["workers"].is_array()) {
    for (const nlohmann::json& w : j["workers"]) {
      const double heard = num(w, "last_heard_s");
      s += fmt::format("{:<3} {:<24} {:<7} {:<8} {:>7} {:>9.3f} {:>9.3f} {:>8} {:>9} {:>7}  {}\n",
                       static_cast<int>(num(w, "index")), str(w, "name"), str(w, "path"), str(w, "state"),
                       static_cast<uint64_t>(num(w, "n_experts")), num(w, "warmup_rtt_ms"), num(w, "min_latency_ms"),
                       heard < 0 ? std::string("-") : fmt::format("{:.1f}", heard),
                       static_cast<uint64_t>(num(w, "requests")), static_cast<uint64_t>(num(w, "errors")),
                       str(w, "address"));
    }
  }
  if (j.contains("late") && j["late"].is_array()) {
    for (const nlohmann::json& l : j["late"])
      s += fmt::format("not answering since start-up: {} ({} tries; last: {})\n", str(l, "address"),
                       static_cast<uint64_t>(num(l, "attempts")), str(l, "last_error"));
  }
  if (j.contains("expert_requests") && j["expert_requests"].is_object() && num(j["expert_requests"], "requests") > 0) {
    const nlohmann::json& e = j["expert_requests"];
    s += fmt::format(
        "expert requests: {} done, {} failed, {} pending; {} copies ({:.2f} MiB), {} replicas let go of, {} "
        "kept{}\n",
        static_cast<uint64_t>(num(e, "done")), static_cast<uint64_t>(num(e, "failed")),
        static_cast<uint64_t>(num(e, "pending")), static_cast<uint64_t>(num(e, "copies")),
        num(e, "copied_bytes") / 1048576.0, static_cast<uint64_t>(num(e, "dropped")),
        static_cast<uint64_t>(num(e, "kept")),
        str(e, "last_error").empty() ? "" : " (last error: " + str(e, "last_error") + ")");
  }
  // What each worker offers (its INFO_REPLY): threads, memory, room for replicas.
  if (j.contains("workers") && j["workers"].is_array()) {
    for (const nlohmann::json& w : j["workers"]) {
      if (num(w, "threads") <= 0) continue;
      const double budget = num(w, "replica_budget_bytes");
      const std::string memory = machine_memory(w);
      s += fmt::format("capacity of {}: {} threads ({} cores), {:.1f} MiB of experts, rss {:.1f} MiB{}, {}\n",
                       str(w, "name"), static_cast<uint64_t>(num(w, "threads")), static_cast<uint64_t>(num(w, "cores")),
                       num(w, "slab_bytes") / 1048576.0, num(w, "rss_bytes") / 1048576.0, memory,
                       budget > 0 ? fmt::format("replicas {:.1f} of {:.1f} MiB", num(w, "replica_bytes") / 1048576.0,
                                                budget / 1048576.0)
                                  : std::string("keeps no replicas"));
    }
  }
  // Span peers: the blocks each runs, where, and its machine.
  if (j.contains("spans") && j["spans"].is_array()) {
    for (const nlohmann::json& v : j["spans"]) {
      const std::string memory = machine_memory(v);
      if (str(v, "state") == "idle") {
        s += fmt::format(
            "span peer {}: idle (runs none of these spans; a re-plan may give it blocks), warm-up rtt "
            "{:.3f} ms{}\n",
            str(v, "label"), num(v, "warmup_rtt_ms"), memory);
        continue;
      }
      if (str(v, "state") == "lane") {
        s += fmt::format(
            "span {} lane on {}: {} sequences, warm-up rtt {:.3f} ms, fastest trip {:.3f} ms over {} "
            "trips{}\n",
            str(v, "layers"), str(v, "label"), static_cast<uint64_t>(num(v, "sequences")), num(v, "warmup_rtt_ms"),
            num(v, "min_trip_ms"), static_cast<uint64_t>(num(v, "trips")), memory);
        continue;
      }
      s += str(v, "state") == "here"
               ? fmt::format("span {}: run by the backbone ({})\n", str(v, "layers"),
                             v.value("chosen_here", false) ? "named or moved here" : "its peers are down")
               : fmt::format(
                     "span {} on {}: warm-up rtt {:.3f} ms, fastest trip {:.3f} ms over {} trips, {:.1f} MiB "
                     "of experts{}\n",
                     str(v, "layers"), str(v, "label"), num(v, "warmup_rtt_ms"), num(v, "min_trip_ms"),
                     static_cast<uint64_t>(num(v, "trips")), num(v, "slab_bytes") / 1048576.0, memory);
    }
  }
  // Workers with several paths: what each measured.
  if (j.contains("workers") && j["workers"].is_array()) {
    for (const nlohmann::json& w : j["workers"]) {
      if (!w.contains("paths") || !w["paths"].is_array() || w["paths"].empty()) continue;
      s += fmt::format("paths of {}:\n", str(w, "name"));
      for (const nlohmann::json& p : w["paths"]) {
        const bool ok = p.contains("ok") && p["ok"].is_boolean() && p["ok"].get<bool>();
        const bool used = p.contains("used") && p["used"].is_boolean() && p["used"].get<bool>();
        s += fmt::format("  {:<40} {}{}\n", str(p, "address"),
                         ok ? fmt::format("rtt {:.3f} ms", num(p, "rtt_ms")) : "unreachable: " + str(p, "error"),
                         used ? "  (used)" : "");
      }
    }
  }
  if (j.contains("joins") && j["joins"].is_array() && !j["joins"].empty()) {
    s += "joins:\n";
    for (const nlohmann::json& r : j["joins"]) {
      s += fmt::format(
          "  {:<24} from {:<22} {} join(s), last {:.1f} s ago{}\n", str(r, "name"), str(r, "address"),
          static_cast<uint64_t>(num(r, "joins")), num(r, "since_join_s"),
          r.contains("held") && r["held"].is_boolean() && r["held"].get<bool>() ? ", waiting to be taken" : "");
    }
  }
  if (num(j, "refused_joins") > 0)
    s += fmt::format("refused joins: {} (last: {})\n", static_cast<uint64_t>(num(j, "refused_joins")),
                     str(j, "last_refusal"));
  return s;
}

bool LedgerCheck::agrees() const {
  if (!found_on_backbone || !found_on_worker) return false;
  for (const Field& f : fields)
    if (f.backbone != f.worker) return false;
  return true;
}

Result<std::vector<LedgerCheck>> check_ledgers(const LedgerDoc& backbone, const std::vector<LedgerDoc>& workers) {
  if (backbone.role != "backbone")
    return make_error(StatusCode::kInvalidArgument, "the first ledger is a {}'s ('{}'), not a backbone's",
                      backbone.role, backbone.name);
  std::vector<LedgerCheck> out;
  for (const LedgerDoc& w : workers) {
    if (w.role != "worker")
      return make_error(StatusCode::kInvalidArgument, "ledger of '{}' is a {}'s, not a worker's", w.name, w.role);
    LedgerCheck& c = out.emplace_back();
    c.worker = w.name;
    const swarm::LedgerEntry* b = nullptr;
    const swarm::LedgerEntry* x = nullptr;
    for (const swarm::LedgerEntry& e : backbone.peers)
      if (e.peer == w.name) b = &e;
    for (const swarm::LedgerEntry& e : w.peers)
      if (e.peer == backbone.name) x = &e;
    c.found_on_backbone = b != nullptr;
    c.found_on_worker = x != nullptr;
    for (const char* name : kAgreeFields) {
      const CountField* f = count_field(name);
      c.fields.push_back({name, b ? b->*f->member : 0, x ? x->*f->member : 0});
    }
  }
  return out;
}

std::string render_ledger_checks(const std::vector<LedgerCheck>& checks) {
  std::string s = fmt::format("{:<28} {:<15} {:>14} {:>14}  {}\n", "worker", "field", "backbone", "worker", "");
  int differ = 0;
  for (const LedgerCheck& c : checks) {
    if (!c.found_on_backbone || !c.found_on_worker) {
      ++differ;
      s += fmt::format("{:<28} {}\n", c.worker,
                       !c.found_on_backbone ? "the backbone has no entry for this worker"
                                            : "this worker has no entry for the backbone");
      continue;
    }
    for (const LedgerCheck::Field& f : c.fields) {
      const bool same = f.backbone == f.worker;
      differ += same ? 0 : 1;
      s += fmt::format("{:<28} {:<15} {:>14} {:>14}  {}\n", c.worker, f.name, f.backbone, f.worker,
                       same ? "=" : "DIFFER");
    }
  }
  s += differ == 0 ? std::string("ledger: AGREE\n") : fmt::format("ledger: DIFFER ({} fields)\n", differ);
  return s;
}

}  // namespace moesh::serve
