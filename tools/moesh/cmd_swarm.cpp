// `moesh swarm status`: the gateway's registry of workers. `moesh swarm ledger`: reads the work
// ledgers of a gateway and its workers over HTTP and, with --check, verifies that both sides of
// every worker's account agree. `moesh swarm plan`: which role each peer should take (span or
// expert holder) and the step time that predicts (docs/swarm.md). `moesh swarm move`: a planned
// span move on a running gateway.
#include <httplib.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "command.h"
#include "http_cli.h"
#include "moesh/model/span.h"
#include "moesh/serve/ledger.h"
#include "moesh/swarm/swarm.h"
#include "plan_cli.h"

namespace moesh::cli {
namespace {

struct SwarmArgs {
  std::vector<std::string> urls;
  bool check = false;
  bool json = false;
  int timeout_s = 10;
  // swarm move: a move or resplit warms the new peers first, and a peer may first load the blocks
  // (SPAN_HOLD: from its model file, or a slice fetched from the gateway; the gateway waits up
  // to 10 minutes for that).
  int move_timeout_s = 900;
  std::vector<std::string> add_span_peers;  // swarm move --span-peer
  std::vector<std::string> lanes;           // swarm move --lane F-L@HOST:PORT
  std::vector<std::string> drop_lanes;      // swarm move --drop-lane F-L@HOST:PORT
  std::vector<std::string> move;            // swarm move: FIRST-LAST@HOST:PORT | FIRST-LAST@here, each span
  bool resplit = false;                     // swarm move: new span edges (implied by several --span)
  std::string admin_key;                    // swarm move: the gateway's --admin-key
  std::vector<std::string> add_workers;     // swarm move --worker HOST:PORT: workers the gateway takes in
  std::vector<std::string> give_experts;    // swarm move --experts SPEC@WORKER
  std::vector<std::string> drop_experts;    // swarm move --drop-experts SPEC@WORKER
};

Result<nlohmann::json> get_json(const std::string& url, const std::string& path, int timeout_s) {
  httplib::Client cli(base_url(url));
  cli.set_connection_timeout(timeout_s, 0);
  cli.set_read_timeout(timeout_s, 0);
  auto res = cli.Get(path);
  if (!res)
    return make_error(StatusCode::kUnavailable, "{}{}: {}", base_url(url), path, httplib::to_string(res.error()));
  if (res->status != 200)
    return make_error(StatusCode::kUnavailable, "{}{}: HTTP {}", base_url(url), path, res->status);
  try {
    return nlohmann::json::parse(res->body);
  } catch (const std::exception& e) {
    return make_error(StatusCode::kCorrupt, "{}{}: not JSON ({})", base_url(url), path, e.what());
  }
}

int run_ledger(const SwarmArgs& a) {
  auto fail = [](const Status& s) {
    std::fprintf(stderr, "moesh swarm ledger: error: %s\n", s.to_string().c_str());
    return 1;
  };
  std::vector<serve::LedgerDoc> docs;
  nlohmann::json all = nlohmann::json::array();
  for (const std::string& u : a.urls) {
    auto j = get_json(u, "/swarm/ledger", a.timeout_s);
    if (!j) return fail(j.status());
    auto d = serve::parse_ledger(*j);
    if (!d) return fail(d.status().with_context(base_url(u)));
    docs.push_back(std::move(*d));
    all.push_back(std::move(*j));
  }
  if (!a.check) {
    std::printf("%s\n", (a.urls.size() == 1 ? all[0] : all).dump(2).c_str());
    return 0;
  }
  if (docs.size() < 2)
    return fail(make_error(StatusCode::kInvalidArgument, "--check needs a gateway URL and at least one worker URL"));
  auto checks = serve::check_ledgers(docs[0], std::vector<serve::LedgerDoc>(docs.begin() + 1, docs.end()));
  if (!checks) return fail(checks.status());
  std::printf("%s", serve::render_ledger_checks(*checks).c_str());
  for (const serve::LedgerCheck& c : *checks)
    if (!c.agrees()) return 1;
  return 0;
}

int run_status(const SwarmArgs& a) {
  auto fail = [](const Status& s) {
    std::fprintf(stderr, "moesh swarm status: error: %s\n", s.to_string().c_str());
    return 1;
  };
  auto j = get_json(a.urls[0], "/swarm/status", a.timeout_s);
  if (!j) return fail(j.status());
  if (a.json) {
    std::printf("%s\n", j->dump(2).c_str());
  } else {
    std::printf("%s", serve::render_swarm_status(*j).c_str());
  }
  return 0;
}

// The file the peers' commands start from: the model given, except that a backbone slice
// (`moesh slice --backbone`: no routed experts) cannot feed a span peer or an expert worker, so
// they are told to use the full file it was cut from.
std::string peer_model_file(const std::string& model) {
  if (model.empty()) return "MODEL.gguf";
  auto f = gguf::File::open(model);
  if (f && swarm::slice_kind(**f) == swarm::kKindBackbone) return "FULL_MODEL.gguf";
  return model;
}

// The commands that start the peers and the backbone for a plan.
std::string plan_commands(const PlanSetup& s, const SwarmPlan& p, const std::string& model) {
  const std::string mf = peer_model_file(model);
  std::string out, backbone = "moesh run -m " + (model.empty() ? std::string("MODEL.gguf") : model);
  for (size_t i = 0; i < s.peers.size(); ++i) {
    const PeerRole& r = p.roles[i];
    const std::string addr = s.peers[i].addr.empty() ? "HOST:PORT" : s.peers[i].addr;
    if (r.kind == RoleKind::kSpan) {
      const bool lane = r.lane_of >= 0;
      out += fmt::format("  {}: moesh span -m {} --layers {}-{} --listen {}{}\n", s.peers[i].peer.name, mf, r.first,
                         r.last, addr,
                         lane ? "   (lane of " + s.peers[static_cast<size_t>(r.lane_of)].peer.name + ")" : "");
      backbone += fmt::format(" --span{} {}-{}@{}", lane ? "-lane" : "", r.first, r.last, addr);
    } else if (r.kind == RoleKind::kExperts) {
      out += fmt::format("  {}: moesh worker -m {} --experts '{}' --listen {}\n", s.peers[i].peer.name, mf,
                         format_expert_spec(held_experts(r), s.model.n_expert), addr);
      backbone += " --worker " + addr;
    }
  }
  // Standbys after every primary: the backbone tries a span's peers in the order named. A replica
  // is one more worker holding the same experts; being farther, it gets pairs only when the
  // primary fails.
  for (const Standby& sb : p.standbys) {
    const auto& peer = s.peers[static_cast<size_t>(sb.peer)];
    const std::string addr = peer.addr.empty() ? "HOST:PORT" : peer.addr;
    const std::string& primary = s.peers[static_cast<size_t>(sb.primary)].peer.name;
    if (sb.replica()) {
      out += fmt::format("  {}: moesh worker -m {} --experts '{}' --listen {}   (replica of {})\n", peer.peer.name, mf,
                         format_expert_spec(sb.experts, s.model.n_expert), addr, primary);
      backbone += " --worker " + addr;
    } else {
      out += fmt::format("  {}: moesh span -m {} --layers {}-{} --listen {}   (standby for {})\n", peer.peer.name, mf,
                         sb.first, sb.last, addr, primary);
      backbone += fmt::format(" --span {}-{}@{}", sb.first, sb.last, addr);
    }
  }
  if (!p.backbone_experts.empty()) {
    backbone += fmt::format(" --local-experts-mb {}", (s.opts.local_experts_bytes >> 20));
  }
  return out + "  backbone: " + backbone + "\n";
}

// Re-planning: what changes from a previous plan's roles to the new plan's, per peer, and the
// slice each new role needs (cut with `moesh slice`; it carries the model identity, which the
// backbone checks in the peer's HELLO before using it).
// `join`: the --status gateway's --accept-workers address (HOST:PORT), where a new expert peer or
// replica can dial in and be taken into the placement between calls; empty: it does not accept.
// `shape`: the model's, so expert roles that change on a live worker also get the live commands
// that copy what it lacks and let go of the replicas it is no longer to hold (`swarm move
// --experts` / `--drop-experts`); null: not given.
nlohmann::json plan_moves(const nlohmann::json& old_plan, const nlohmann::json& new_plan, const std::string& model,
                          const std::string& gateway, const std::string& join, const swarm::ModelShape* shape) {
  std::map<std::string, std::pair<std::string, std::string>> before, after;
  auto what = [](const nlohmann::json& r) -> std::string {
    if (r.contains("layers")) return r["layers"];
    if (r.contains("experts")) return r["experts"];
    return "-";
  };
  if (old_plan.contains("roles") && old_plan["roles"].is_array())
    for (const auto& r : old_plan["roles"])
      if (r.contains("peer") && r.contains("role")) before[r["peer"]] = {r["role"], what(r)};
  std::map<std::string, std::string> addr;
  for (const auto& r : new_plan["roles"]) {
    after[r["peer"]] = {r["role"], what(r)};
    if (r.contains("addr")) addr[r["peer"]] = r["addr"];
  }
  const std::string mf = peer_model_file(model);
  nlohmann::json moves = nlohmann::json::array();
  for (const auto& [peer, role] : after) {
    auto it = before.find(peer);
    const std::pair<std::string, std::string> was =
        it == before.end() ? std::pair<std::string, std::string>{"absent", "-"} : it->second;
    if (was == role) continue;
    nlohmann::json mv{{"peer", peer}, {"from", was.first + " " + was.second}, {"to", role.first + " " + role.second}};
    if (role.first == "span" || role.first == "standby" || role.first == "lane") {
      mv["slice"] = fmt::format("moesh slice -m {} --layers {} -o {}-span.gguf", mf, role.second, peer);
      // Or the peer fetches the slice from the gateway itself (cut there, checked by hash).
      mv["fetch"] = fmt::format("moesh span --fetch {} --admin-key KEY --layers {} --listen {}",
                                gateway.empty() ? "http://GATEWAY:PORT" : gateway, role.second,
                                addr.count(peer) ? addr[peer] : "HOST:PORT");
      // A span the gateway already runs (the same blocks in the old plan) goes over live once the
      // peer runs `moesh span` on the slice; new span edges need the backbone restarted.
      bool live = false;
      if (role.first == "standby") {
        moves.push_back(mv);
        continue;
      }
      if (role.first == "lane") {  // a lane is added live once the peer runs the layers
        mv["switch"] = fmt::format("moesh swarm move {} --lane {}@{} --admin-key KEY",
                                   gateway.empty() ? "http://GATEWAY:PORT" : gateway, role.second,
                                   addr.count(peer) ? addr[peer] : "HOST:PORT");
        moves.push_back(mv);
        continue;
      }
      for (const auto& [p2, r2] : before) live |= r2.first == "span" && r2.second == role.second;
      if (live)
        mv["switch"] = fmt::format("moesh swarm move {} --span {}@{} --admin-key KEY",
                                   gateway.empty() ? "http://GATEWAY:PORT" : gateway, role.second,
                                   addr.count(peer) ? addr[peer] : "HOST:PORT");
    }
    // A live worker whose experts change: copies of what it lacks and its replicas of what it is
    // no longer to hold, while it runs (it needs --replica-dir; its own file's experts stay).
    const bool held = was.first == "experts" || was.first == "replica";
    const bool holds = role.first == "experts" || role.first == "replica";
    // (Not for a peer made a span peer, lane or standby: its blocks are loaded first, and the
    // gateway's own re-plan lets its replicas go after.)
    const bool plain = holds || role.first == "idle";
    if (shape != nullptr && plain && (held || holds) && it != before.end() && addr.count(peer)) {
      auto old_set = held ? swarm::parse_expert_spec(was.second, *shape) : Result<swarm::ExpertSet>(swarm::ExpertSet{});
      auto new_set =
          holds ? swarm::parse_expert_spec(role.second, *shape) : Result<swarm::ExpertSet>(swarm::ExpertSet{});
      if (old_set && new_set) {
        auto minus = [](const swarm::ExpertSet& x, const swarm::ExpertSet& y) {
          std::vector<wire::ExpertRange> out;
          for (const wire::ExpertRange& r : x.ranges)
            for (uint32_t k = 0; k < r.count; ++k)
              if (!y.holds(r.layer, r.first + k)) out.push_back({r.layer, r.first + k, 1});
          return swarm::canonicalize(std::move(out));
        };
        const swarm::ExpertSet give = minus(*new_set, *old_set), drop = minus(*old_set, *new_set);
        const std::string gw = gateway.empty() ? "http://GATEWAY:PORT" : gateway;
        std::string cmd;
        if (!give.empty()) cmd += fmt::format(" --experts '{}@{}'", give.to_string(), addr[peer]);
        if (!drop.empty()) cmd += fmt::format(" --drop-experts '{}@{}'", drop.to_string(), addr[peer]);
        if (!give.empty() && !drop.empty()) {
          mv["copies"] = fmt::format(
              "moesh swarm move {} --experts '{}@{}' --admin-key KEY; moesh swarm move {} "
              "--drop-experts '{}@{}' --admin-key KEY",
              gw, give.to_string(), addr[peer], gw, drop.to_string(), addr[peer]);
        } else if (!cmd.empty()) {
          mv["copies"] = fmt::format("moesh swarm move {}{} --admin-key KEY", gw, cmd);
        }
      }
    }
    if (role.first == "experts" || role.first == "replica") {
      mv["slice"] = fmt::format("moesh slice -m {} --experts '{}' -o {}-experts.gguf", mf, role.second, peer);
      // Live where the gateway accepts workers: the peer dials in and is added between calls. A
      // name the gateway knows keeps its experts (it may only add to them), so a peer whose
      // experts change joins under a new name; the old process is stopped once it has joined
      // (its pairs then go to the other holders).
      const bool renamed = it != before.end() && (was.first == "experts" || was.first == "replica");
      if (!join.empty()) {
        mv["join"] = fmt::format("moesh worker -m {} --experts '{}' --join {} --name {}", mf, role.second, join,
                                 renamed ? peer + "-2" : peer);
      }
      // Or the peer listens and the gateway dials it (admin): taken in between calls. A peer whose
      // experts change runs the new worker on another port; the old one is stopped afterwards.
      std::string where = addr.count(peer) ? addr[peer] : "HOST:PORT";
      if (renamed) where = where.substr(0, where.rfind(':')) + ":NEW_PORT";
      mv["switch"] = fmt::format("moesh swarm move {} --worker {} --admin-key KEY",
                                 gateway.empty() ? "http://GATEWAY:PORT" : gateway, where);
    }
    moves.push_back(mv);
  }
  for (const auto& [peer, role] : before)
    if (!after.count(peer) && role.first != "idle")
      moves.push_back({{"peer", peer}, {"from", role.first + " " + role.second}, {"to", "gone"}});
  return moves;
}

// Re-planning with new span edges. The backbone's span runner covers the old plan's spans and
// the blocks it runs as spans itself (the old plan's "here": `--span F-L@here`). Where the new
// plan's spans lie within those blocks, the gateway takes them live (`swarm move` with the whole
// list, the covered blocks no new span takes as `@here` spans: a resplit); otherwise it needs the
// backbone restarted with the new --span list. Null: the edges are the same.
nlohmann::json plan_resplit(const nlohmann::json& old_plan, const nlohmann::json& new_plan,
                            const std::string& gateway) {
  const SpanListChange c = span_list_change(old_plan, new_plan);
  if (c.same) return nullptr;
  nlohmann::json out;
  if (c.live) {
    std::string cmd = "moesh swarm move " + (gateway.empty() ? std::string("http://GATEWAY:PORT") : gateway);
    for (const SpanListEntry& x : c.list)
      cmd += fmt::format(" --span {}-{}@{}", x.first, x.last, x.to.empty() ? std::string("HOST:PORT") : x.to);
    out["live"] = true;
    out["command"] = cmd + (c.list.size() == 1 ? " --resplit" : "") + " --admin-key KEY";
  } else {
    out["live"] = false;
    out["why"] =
        "the new spans cover blocks the backbone runs as its own blocks, not as spans (it keeps no inputs for "
        "them): restart the backbone with the new --span list, or with its blocks as --span F-L@here so later "
        "re-plans move them live";
  }
  return out;
}

int run_plan(const PlanCliArgs& a) {
  auto fail = [](const Status& s) {
    std::fprintf(stderr, "moesh swarm plan: error: %s\n", s.to_string().c_str());
    return s.code() == StatusCode::kInvalidArgument ? 2 : 1;
  };
  if (a.from == "live" && a.status_url.empty())
    return fail(make_error(StatusCode::kInvalidArgument, "--from live needs --status URL (the gateway)"));
  PlanCliArgs args = a;
  std::string join;  // the gateway's --accept-workers address, when it has one
  if (!a.status_url.empty()) {
    auto st = get_json(a.status_url, "/swarm/status", 10);
    if (!st) return fail(st.status().with_context("--status"));
    if (st->contains("accepting") && (*st)["accepting"].is_number_integer()) {
      // The gateway's host as --status names it: "http://HOST:PORT/..." or "http://[V6]:PORT".
      const size_t scheme = a.status_url.find("://");
      std::string host = a.status_url.substr(scheme == std::string::npos ? 0 : scheme + 3);
      host = host.substr(0, host.find('/'));
      const size_t colon = host.rfind(':'), bracket = host.rfind(']');
      if (colon != std::string::npos && (bracket == std::string::npos || colon > bracket)) host.resize(colon);
      join = fmt::format("{}:{}", host, (*st)["accepting"].get<int>());
    }
    auto live = peers_from_status(*st);
    if (!live) return fail(live.status().with_context("--status " + a.status_url));
    std::fprintf(stderr, "moesh swarm plan: %zu worker(s) up at %s\n", live->size(), a.status_url.c_str());
    args.live_peers = std::move(*live);
    if (a.activations.empty()) {  // the gateway's own expert activation counts
      auto dash = get_json(a.status_url, "/swarm/dashboard.json", 10);
      if (!dash) return fail(dash.status().with_context("--status (its activation counts)"));
      args.live_activations = std::move(*dash);
    }
  }
  auto setup = resolve_plan_setup(args);
  if (!setup) return fail(setup.status());
  if (setup->measured_speeds > 0) {
    std::string speeds;
    for (const CliPeer& p : setup->peers)
      if (p.peer.speed != 1) speeds += fmt::format(" {}={:.2f}", p.peer.name, p.peer.speed);
    std::fprintf(stderr, "moesh swarm plan: %d peer(s) priced at their measured compute speed%s%s\n",
                 setup->measured_speeds, speeds.empty() ? " (all alike)" : ":", speeds.c_str());
  }
  if (setup->peers.empty())
    return fail(make_error(StatusCode::kInvalidArgument, "no --peer given (nor a --status gateway with workers up)"));
  auto plan = plan_for_layout(*setup, a.layout);
  if (!plan) return fail(plan.status());
  if (a.layout == "plan" && !a.no_load_replicas) {
    Status lr = add_load_replicas(setup->model, setup->plan_peers, setup->opts, &*plan);
    if (!lr.is_ok()) return fail(lr);
  }
  if (a.layout == "plan" && !a.no_lanes) {
    Status ln = add_span_lanes(setup->model, setup->plan_peers, setup->opts, &*plan);
    if (!ln.is_ok()) return fail(ln);
  }
  if (!a.no_standby) {
    Status sb = add_standbys(setup->model, setup->plan_peers, setup->opts, &*plan);
    if (!sb.is_ok()) return fail(sb);
  }
  auto experts = plan_all_experts(setup->model, setup->plan_peers, setup->opts);
  auto spans = plan_all_spans(setup->model, setup->plan_peers, setup->opts);
  const PlanModel& m = setup->model;
  nlohmann::json moves, resplit;
  if (!a.from.empty()) {
    nlohmann::json old_plan;
    if (a.from == "live") {
      // The gateway's live layout, as its dashboard's re-plan reports it (serve/dashboard.h).
      auto dash = get_json(a.status_url, "/swarm/dashboard.json", 10);
      if (!dash) return fail(dash.status().with_context("--from live"));
      const nlohmann::json* r = nullptr;
      if (dash->contains("plan") && (*dash)["plan"].is_object() && (*dash)["plan"].contains("replan"))
        r = &(*dash)["plan"]["replan"];
      if (r == nullptr || !r->is_object() || !r->contains("live") || !(*r)["live"].contains("roles")) {
        const std::string why = r != nullptr && r->is_object() && r->contains("error")
                                    ? (*r)["error"].get<std::string>()
                                    : "it runs span peers or no workers (save a plan's --json and give that)";
        return fail(
            make_error(StatusCode::kInvalidArgument, "--from live: {} reports no live layout: {}", a.status_url, why));
      }
      old_plan = (*r)["live"];
    } else {
      std::ifstream in(a.from);
      if (!in.is_open()) return fail(make_error(StatusCode::kInvalidArgument, "--from {}: cannot open it", a.from));
      old_plan = nlohmann::json::parse(in, nullptr, false);
    }
    if (old_plan.is_discarded() || !old_plan.is_object() || !old_plan.contains("roles"))
      return fail(make_error(StatusCode::kInvalidArgument, "--from {}: not a plan (moesh swarm plan --json)", a.from));
    // The model's expert shape, for the live copy / drop commands.
    swarm::ModelShape shape;
    shape.n_layer = static_cast<uint32_t>(m.n_layer());
    shape.n_expert = static_cast<uint32_t>(m.n_expert);
    for (int l = 0; l < m.n_layer(); ++l)
      if (m.layers[static_cast<size_t>(l)].moe) shape.moe_layers.push_back(static_cast<uint32_t>(l));
    moves = plan_moves(old_plan, plan_to_json(*setup, *plan), a.model, a.status_url, join, &shape);
    resplit = plan_resplit(old_plan, plan_to_json(*setup, *plan), a.status_url);
  }
  if (a.json) {
    nlohmann::json j = plan_to_json(*setup, *plan);
    if (!a.from.empty()) j["moves"] = moves;
    if (!resplit.is_null()) j["resplit"] = resplit;
    j["layout"] = a.layout;
    j["compare"] = nlohmann::json::object();
    if (experts) j["compare"]["experts"] = {{"step_ms", experts->step_s * 1e3}, {"trips", experts->trips_per_step}};
    if (spans) j["compare"]["spans"] = {{"step_ms", spans->step_s * 1e3}, {"trips", spans->trips_per_step}};
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::printf("model %s: %d layers, %d experts top-%d; %.3f ns per byte (%s); %d token(s) per step\n", m.name.c_str(),
              m.n_layer(), m.n_expert, m.n_expert_used, setup->seconds_per_byte * 1e9,
              setup->calibrated
                  ? (setup->calibration.dense_only ? "measured here, of the backbone's dense parts" : "measured here")
                  : (a.seconds_per_byte > 0 ? "given" : "default"),
              setup->opts.tokens_per_step);
  if (setup->calibrated)
    std::printf(
        "measured here: a step of 1 row %.3f ms, of %d rows %.3f ms: each more row adds %.2f of one (--row-share)\n",
        setup->calibration.one_row_s * 1e3, setup->calibration.batch, setup->calibration.batch_s * 1e3,
        setup->calibration.row_share);
  if (m.row_share != 1.0 && setup->opts.tokens_per_step > 1)
    std::printf("a step's %d rows cost %.2f rows' compute on a span peer or the backbone (row share %.2f)\n",
                setup->opts.tokens_per_step, m.rows_cost(setup->opts.tokens_per_step), m.row_share);
  const ActivationInfo& act = setup->activations;
  if (act.source.empty())
    std::printf("activations: uniform (every expert %d/%d of the tokens)\n", m.n_expert_used, m.n_expert);
  else
    std::printf("activations: counted, %llu token(s) over %d layer(s), from %s\n",
                static_cast<unsigned long long>(act.tokens), act.layers, act.source.c_str());
  std::printf("layout: %s\n%s", a.layout.c_str(), render_plan(m, setup->plan_peers, *plan).c_str());
  auto line = [](const char* what, const Result<SwarmPlan>& p) {
    if (p)
      std::printf("  %-26s %9.1f ms per step %8.2f tokens/s %6.2f trips\n", what, p->step_s * 1e3, p->tokens_per_s,
                  p->trips_per_step);
    else
      std::printf("  %-26s does not fit (%s)\n", what, p.status().message().c_str());
  };
  std::printf("compared with:\n");
  line("experts on every peer", experts);
  line("equal spans (Petals-style)", spans);
  std::printf("commands:\n%s", plan_commands(*setup, *plan, a.model).c_str());
  if (!a.from.empty()) {
    std::printf("moves from %s:%s\n", a.from.c_str(), moves.empty() ? " none" : "");
    for (const auto& mv : moves) {
      std::printf("  %s: %s -> %s\n", std::string(mv["peer"]).c_str(), std::string(mv["from"]).c_str(),
                  std::string(mv["to"]).c_str());
      if (mv.contains("slice"))
        std::printf("    transfer: %s (it carries the model identity the backbone checks at the handshake)\n",
                    std::string(mv["slice"]).c_str());
      if (mv.contains("fetch"))
        std::printf("    or, on the peer: %s (the gateway cuts the slice; checked by hash)\n",
                    std::string(mv["fetch"]).c_str());
      if (mv.contains("switch") && std::string(mv["to"]).rfind("lane", 0) == 0)
        std::printf("    switch: %s (once the peer runs `moesh span` on the layers: it takes a share of new streams)\n",
                    std::string(mv["switch"]).c_str());
      else if (mv.contains("switch") && std::string(mv["to"]).rfind("span", 0) == 0)
        std::printf("    switch: %s (where the gateway runs that span already: moved live, its inputs replayed)\n",
                    std::string(mv["switch"]).c_str());
      else if (mv.contains("switch"))
        std::printf(
            "    switch: %s (once the peer runs `moesh worker` on the slice: dialled and taken in between "
            "calls; a peer's old worker is stopped after)\n",
            std::string(mv["switch"]).c_str());
      if (mv.contains("copies"))
        std::printf("    or live, on a worker keeping replicas (--replica-dir): %s\n",
                    std::string(mv["copies"]).c_str());
      if (mv.contains("join"))
        std::printf("    join: %s (the gateway takes it in between calls; stop an old process of the peer after)\n",
                    std::string(mv["join"]).c_str());
    }
    if (!resplit.is_null() && resplit["live"]) {
      std::printf("new span edges, live once the span peers run: %s\n", std::string(resplit["command"]).c_str());
    } else if (!resplit.is_null()) {
      std::printf("new span edges: %s\n", std::string(resplit["why"]).c_str());
    }
  }
  return 0;
}

// POSTs {"address": X} to `route` of the gateway for each X; `ok` is the status that means done,
// `said` what to print for X (without --json).
int post_addresses(const SwarmArgs& a, const std::vector<std::string>& addresses, const std::string& route, int ok,
                   const std::function<std::string(const std::string&)>& said) {
  httplib::Client cli(base_url(a.urls.at(0)));
  cli.set_connection_timeout(a.timeout_s, 0);
  cli.set_read_timeout(a.timeout_s, 0);
  httplib::Headers h;
  if (!a.admin_key.empty()) h.emplace("Authorization", "Bearer " + a.admin_key);
  for (const std::string& x : addresses) {
    auto res = cli.Post(route, h, nlohmann::json{{"address", x}}.dump(), "application/json");
    if (!res) {
      std::fprintf(stderr, "moesh swarm move: error: %s%s: %s\n", base_url(a.urls[0]).c_str(), route.c_str(),
                   httplib::to_string(res.error()).c_str());
      return 1;
    }
    if (res->status != ok) {
      std::fprintf(stderr, "moesh swarm move: error: HTTP %d: %s\n", res->status, api_error_message(res->body).c_str());
      return 1;
    }
    std::printf("%s\n", a.json ? res->body.c_str() : said(x).c_str());
  }
  return 0;
}

// `moesh swarm move URL --worker HOST:PORT`: the gateway dials the worker and takes it in between
// calls (POST /swarm/workers/add; it answers at once, the worker shows in `swarm status`).
int run_add_workers(const SwarmArgs& a) {
  return post_addresses(a, a.add_workers, "/swarm/workers/add", 202, [&](const std::string& w) {
    return fmt::format("dialling {} (it joins between calls: moesh swarm status {})", w, a.urls[0]);
  });
}

// `moesh swarm move URL --span-peer HOST:PORT`: the gateway learns of a span peer (POST
// /swarm/spans/add), listed idle until a re-plan gives it blocks.
int run_add_span_peers(const SwarmArgs& a) {
  return post_addresses(a, a.add_span_peers, "/swarm/spans/add", 200, [](const std::string& p) {
    return fmt::format("span peer {} known to the gateway, idle until a re-plan gives it blocks", p);
  });
}

// `moesh swarm move URL --lane 12-23@HOST:PORT` (or --drop-lane): a lane of a span added to a
// running gateway, or let go of (POST /swarm/spans/lane), one after the other.
int run_lanes(const SwarmArgs& a) {
  const bool add = !a.lanes.empty();
  httplib::Client cli(base_url(a.urls.at(0)));
  cli.set_connection_timeout(std::min(a.move_timeout_s, 10), 0);
  cli.set_read_timeout(a.move_timeout_s, 0);
  httplib::Headers h;
  if (!a.admin_key.empty()) h.emplace("Authorization", "Bearer " + a.admin_key);
  for (const std::string& l : add ? a.lanes : a.drop_lanes) {
    const size_t at = l.find('@');
    if (at == std::string::npos || at == 0 || at + 1 == l.size()) {
      std::fprintf(stderr, "moesh swarm move: error: --%s must be FIRST-LAST@HOST:PORT, not '%s'\n",
                   add ? "lane" : "drop-lane", l.c_str());
      return 2;
    }
    const nlohmann::json body = {{"layers", l.substr(0, at)}, {add ? "to" : "drop", l.substr(at + 1)}};
    auto res = cli.Post("/swarm/spans/lane", h, body.dump(), "application/json");
    if (!res) {
      std::fprintf(stderr, "moesh swarm move: error: %s/swarm/spans/lane: %s\n", base_url(a.urls[0]).c_str(),
                   httplib::to_string(res.error()).c_str());
      return 1;
    }
    if (res->status != 200) {
      std::fprintf(stderr, "moesh swarm move: error: HTTP %d: %s\n", res->status, api_error_message(res->body).c_str());
      return 1;
    }
    const nlohmann::json j = nlohmann::json::parse(res->body, nullptr, false);
    if (a.json) {
      std::printf("%s\n", j.dump(2).c_str());
      continue;
    }
    if (j.is_object() && j.contains("spans") && j["spans"].is_array()) {
      for (const auto& sp : j["spans"]) std::printf("span %s\n", sp.get<std::string>().c_str());
    }
  }
  return 0;
}

// `moesh swarm move URL --experts SPEC@WORKER` (or --drop-experts): copies of experts given to a
// worker, or its replicas of them let go of (POST /swarm/workers/experts). The gateway carries them
// out between calls; `swarm status` shows the outcome.
int run_experts(const SwarmArgs& a) {
  const bool give = !a.give_experts.empty();
  httplib::Client cli(base_url(a.urls.at(0)));
  cli.set_connection_timeout(a.timeout_s, 0);
  cli.set_read_timeout(a.timeout_s, 0);
  httplib::Headers h;
  if (!a.admin_key.empty()) h.emplace("Authorization", "Bearer " + a.admin_key);
  for (const std::string& x : give ? a.give_experts : a.drop_experts) {
    const size_t at = x.rfind('@');
    if (at == std::string::npos || at == 0 || at + 1 == x.size()) {
      std::fprintf(stderr, "moesh swarm move: error: --%s must be SPEC@WORKER (e.g. 0-3:0-7@10.0.0.5:9000), not '%s'\n",
                   give ? "experts" : "drop-experts", x.c_str());
      return 2;
    }
    const nlohmann::json body = {{"worker", x.substr(at + 1)}, {give ? "give" : "drop", x.substr(0, at)}};
    auto res = cli.Post("/swarm/workers/experts", h, body.dump(), "application/json");
    if (!res) {
      std::fprintf(stderr, "moesh swarm move: error: %s/swarm/workers/experts: %s\n", base_url(a.urls[0]).c_str(),
                   httplib::to_string(res.error()).c_str());
      return 1;
    }
    if (res->status != 202) {
      std::fprintf(stderr, "moesh swarm move: error: HTTP %d: %s\n", res->status, api_error_message(res->body).c_str());
      return 1;
    }
    if (a.json)
      std::printf("%s\n", res->body.c_str());
    else
      std::printf("%s %s %s (between calls: moesh swarm status %s)\n", give ? "giving" : "letting go of",
                  x.substr(0, at).c_str(),
                  give ? ("to " + x.substr(at + 1)).c_str() : ("on " + x.substr(at + 1)).c_str(), a.urls[0].c_str());
  }
  return 0;
}

// `moesh swarm move URL --span 12-23@HOST:PORT --admin-key KEY`: a planned span move on a running
// gateway (POST /swarm/spans/move; docs/serve.md#moving-a-span); several --span: a resplit.
int run_move(const SwarmArgs& a) {
  const int kinds = !a.move.empty() + !a.add_workers.empty() + !a.add_span_peers.empty() + !a.lanes.empty() +
                    !a.drop_lanes.empty() + !a.give_experts.empty() + !a.drop_experts.empty();
  if (kinds != 1) {
    std::fprintf(stderr,
                 "moesh swarm move: error: give one of --span (span moves), --worker (workers to take in), "
                 "--span-peer (span peers to make known), --lane and --drop-lane (span lanes), --experts and "
                 "--drop-experts (expert copies)\n");
    return 2;
  }
  if (!a.give_experts.empty() || !a.drop_experts.empty()) return run_experts(a);
  if (!a.add_workers.empty()) return run_add_workers(a);
  if (!a.add_span_peers.empty()) return run_add_span_peers(a);
  if (!a.lanes.empty() || !a.drop_lanes.empty()) return run_lanes(a);
  for (const std::string& sp : a.move) {
    const size_t at = sp.find('@');
    if (at == std::string::npos || at == 0 || at + 1 == sp.size()) {
      std::fprintf(stderr,
                   "moesh swarm move: error: --span must be FIRST-LAST@HOST:PORT or FIRST-LAST@here, not '%s'\n",
                   sp.c_str());
      return 2;
    }
  }
  // One span to another runner: a move. Several (or --resplit): the whole new span list.
  const bool resplit = a.resplit || a.move.size() > 1;
  const std::string route = resplit ? "/swarm/spans/resplit" : "/swarm/spans/move";
  nlohmann::json body;
  if (resplit) {
    body["spans"] = a.move;
  } else {
    const size_t at = a.move[0].find('@');
    body = {{"layers", a.move[0].substr(0, at)}, {"to", a.move[0].substr(at + 1)}};
  }
  httplib::Client cli(base_url(a.urls.at(0)));
  cli.set_connection_timeout(std::min(a.move_timeout_s, 10), 0);
  cli.set_read_timeout(a.move_timeout_s, 0);
  httplib::Headers h;
  if (!a.admin_key.empty()) h.emplace("Authorization", "Bearer " + a.admin_key);
  auto res = cli.Post(route, h, body.dump(), "application/json");
  if (!res) {
    std::fprintf(stderr, "moesh swarm move: error: %s%s: %s\n", base_url(a.urls[0]).c_str(), route.c_str(),
                 httplib::to_string(res.error()).c_str());
    return 1;
  }
  const nlohmann::json j = nlohmann::json::parse(res->body, nullptr, false);
  if (res->status != 200) {
    std::fprintf(stderr, "moesh swarm move: error: HTTP %d: %s\n", res->status, api_error_message(res->body).c_str());
    return 1;
  }
  if (a.json) {
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  if (j.is_object() && j.contains("spans")) {
    for (const auto& sp : j["spans"]) std::printf("span %s\n", std::string(sp).c_str());
  }
  return 0;
}

const CommandRegistrar kRegisterSwarm{Command{
    "swarm", "Inspect a running swarm (status, ledger) or plan one (plan)", [](CLI::App* sub) -> std::function<int()> {
      auto a = std::make_shared<SwarmArgs>();
      auto which = std::make_shared<std::string>();
      sub->require_subcommand(1);
      CLI::App* led = sub->add_subcommand(
          "ledger", "Print the work ledger of each URL (a gateway's or a worker's --metrics port) as JSON");
      led->add_option("urls", a->urls, "http://HOST:PORT of `moesh serve` or of a worker's --metrics")->required();
      led->add_flag("--check", a->check,
                    "First URL is the gateway, the rest its workers: compare both sides' counts, exit 1 if any "
                    "differ");
      led->add_option("--timeout", a->timeout_s, "Seconds to wait for each URL");
      led->callback([which] { *which = "ledger"; });
      CLI::App* st = sub->add_subcommand(
          "status",
          "The gateway's registry: each worker's path (direct/joined/relay), state, experts, RTT, last heartbeat");
      st->add_option("url", a->urls, "http://HOST:PORT of `moesh serve`")->required()->expected(1);
      st->add_flag("--json", a->json, "Print the JSON document instead of the table");
      st->add_option("--timeout", a->timeout_s, "Seconds to wait");
      st->callback([which] { *which = "status"; });
      CLI::App* mv = sub->add_subcommand(
          "move",
          "Move a span of a running gateway to another span peer (or onto the gateway), give it new span edges, "
          "or have it take in a new worker, while it serves");
      mv->add_option("url", a->urls, "http://HOST:PORT of `moesh serve` (started with --admin-key)")
          ->required()
          ->expected(1);
      mv->add_option("--span", a->move,
                     "FIRST-LAST@HOST:PORT (a `moesh span` peer running those blocks) or FIRST-LAST@here; "
                     "repeated: the gateway's new span list (new edges within the blocks its spans cover)");
      mv->add_option("--worker", a->add_workers,
                     "HOST:PORT of a `moesh worker` (a new expert peer or replica) the gateway dials and takes in "
                     "between calls (repeatable)");
      mv->add_option("--span-peer", a->add_span_peers,
                     "HOST:PORT of a `moesh span` peer the gateway learns of, listed idle until a re-plan (or "
                     "--auto-replan) gives it blocks, which it then loads (repeatable)");
      mv->add_option("--lane", a->lanes,
                     "FIRST-LAST@HOST:PORT: that span peer runs span FIRST-LAST beside its runner, for a share of "
                     "the sequences (new ones go where the fewest are; it loads the blocks if it can; repeatable)");
      mv->add_option("--drop-lane", a->drop_lanes,
                     "FIRST-LAST@HOST:PORT: let that lane of span FIRST-LAST go (its sequences are replayed on the "
                     "span's runner; repeatable)");
      mv->add_option("--experts", a->give_experts,
                     "SPEC@WORKER: copies of those experts (e.g. 0-3:0-7,5:*) given to that worker (its address, "
                     "name or label; it needs --replica-dir), from the gateway or a holder, hash-checked; "
                     "repeatable");
      mv->add_option("--drop-experts", a->drop_experts,
                     "SPEC@WORKER: that worker lets go of its replicas of those experts (never an expert's last "
                     "holder, never its own file's); repeatable");
      mv->add_flag("--resplit", a->resplit,
                   "Take the --span list as the new span list even when it is one span (e.g. two spans merged)");
      mv->add_option("--admin-key", a->admin_key, "The gateway's --admin-key");
      mv->add_flag("--json", a->json, "Print the gateway's answer as JSON");
      mv->add_option("--timeout", a->move_timeout_s,
                     "Seconds to wait (a move or resplit has the new peers load the blocks if they can, then warms "
                     "them with every sequence's inputs)")
          ->capture_default_str();
      mv->callback([which] { *which = "move"; });
      auto pa = std::make_shared<PlanCliArgs>();
      CLI::App* pl = sub->add_subcommand(
          "plan", "Which role each peer takes (span peer or expert holder) and the predicted step time");
      add_plan_options(pl, pa.get(), false);
      pl->callback([which] { *which = "plan"; });
      return [a, pa, which]() -> int {
        if (*which == "plan") return run_plan(*pa);
        if (*which == "ledger") return run_ledger(*a);
        if (*which == "status") return run_status(*a);
        if (*which == "move") return run_move(*a);
        return 2;
      };
    }}};

}  // namespace
}  // namespace moesh::cli
