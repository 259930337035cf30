// Options shared by `moesh swarm plan` and `moesh simulate`: the model (a GGUF file or a named
// shape), its measured costs, the peers, the backbone and the layout (docs/swarm.md#plan,
// docs/simulate.md).
#pragma once

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "model_cli.h"
#include "moesh/gguf/gguf.h"
#include "moesh/model/model.h"
#include "moesh/plan/live.h"
#include "moesh/plan/simulate.h"
#include "moesh/plan/swarm_plan.h"
#include "moesh/swarm/swarm.h"
#include "moesh/wan/spec.h"

namespace moesh::cli {

// A --peer, a generated peer or a live one (--status): the same fields (plan/live.h).
using CliPeer = LivePeer;

struct PlanCliArgs {
  std::string model, shape;
  int n_ctx = 4096;
  double seconds_per_byte = 0;  // 0: --calibrate or the default
  double row_share = 0;         // --row-share (0: --calibrate, else 1: linear)
  bool calibrate = false;
  int calibrate_threads = 1;
  std::vector<std::string> peer_specs;
  std::vector<std::string> peer_rtts;  // --peer-rtt A:B=20ms (a pair) or 20ms (every other pair)
  bool no_chain = false;
  bool no_spans = false;          // experts only (PlanOptions::spans false)
  bool no_load_replicas = false;  // no add_load_replicas
  bool no_lanes = false;          // no add_span_lanes
  bool no_standby = false;        // no standbys (spans) or replicas (expert peers) from idle peers (add_standbys)
  int standbys = 1;               // at most this many per span or expert peer (PlanOptions::standbys_per_primary)
  // Generated peers (simulate at scale): N peers of this memory, RTT lognormal around a median.
  int n_peers = 0;
  std::string peer_memory = "8GiB", rtt_median = "20ms";
  double rtt_sigma = 0, peer_speed = 1;
  std::string backbone_memory, local_experts = "0";
  double backbone_speed = 1;
  double message_us = kDefaultMessageSeconds * 1e6;
  int streams = 1, draft = 0;
  int tokens_per_step = 0;  // --tokens-per-step (0: streams x (1 + draft))
  double accept = 0;
  std::string layout = "plan";
  std::string from;                 // a previous plan's JSON: print the moves to the new one
  std::string status_url;           // --status: a running gateway whose workers become peers
  std::vector<CliPeer> live_peers;  // filled from --status by run_plan (a --peer of the same name wins)
  // --activations: a file with the gateway's counts (/swarm/dashboard.json or its heatmap), or
  // "uniform"; empty: the --status gateway's live counts where there is one, else uniform.
  std::string activations;
  nlohmann::json live_activations;  // filled from --status by run_plan (its /swarm/dashboard.json)
  bool json = false;
  uint64_t seed = 1;
};

inline void add_plan_options(CLI::App* sub, PlanCliArgs* a, bool simulate) {
  sub->add_option("-m,--model", a->model, "GGUF model: its layers, experts and byte sizes");
  sub->add_option("--shape", a->shape,
                  "A named model shape instead of a file: qwen3-30b-a3b, deepseek-v3, kimi-k2, glm-4.5");
  sub->add_option("-c,--ctx-size", a->n_ctx, "Cells of KV per sequence the peers must hold");
  sub->add_option("--seconds-per-byte", a->seconds_per_byte,
                  "Measured compute cost per weight byte read (default: --calibrate, else 0.25 ns)");
  sub->add_option("--row-share", a->row_share,
                  "Of one row's compute, what each more row of a step adds (a batch reads weights once; default: "
                  "--calibrate, else 1: linear)");
  sub->add_flag("--calibrate", a->calibrate,
                "Measure them: decode a few tokens of -m here, all local, one row a step and a batch a step");
  sub->add_option("--calibrate-threads", a->calibrate_threads, "Threads for --calibrate");
  sub->add_option("--peer", a->peer_specs, "NAME:mem=8GiB,rtt=20ms,speed=1,rate=100mbit[,addr=HOST:PORT] (repeatable)");
  sub->add_option("--peer-rtt", a->peer_rtts,
                  "Round trip between two peers, A:B=20ms (repeatable), or a bare 20ms for every pair not named: "
                  "adjacent spans on such peers are priced as a chain (docs/span.md#chained-spans)");
  sub->add_flag("--no-chain", a->no_chain, "Price every span as a star trip from the backbone (as --span-chain off)");
  sub->add_flag("--no-load-replicas", a->no_load_replicas,
                "No copies of hot experts on other near peers to share their pairs (by default, with activation "
                "counts, the plan adds those that make the step at least 0.5 % faster)");
  sub->add_flag("--no-lanes", a->no_lanes,
                "No span lanes (by default, with several streams per step, an idle peer that fits a span's layers "
                "may run them beside its peer for a share of the streams, where that makes the step at least 0.5 % "
                "faster)");
  sub->add_flag("--no-spans", a->no_spans,
                "Experts only: no peer is given a span (what a gateway running no spans can carry out)");
  sub->add_flag("--no-standby", a->no_standby,
                "Leave idle peers idle (by default one that fits a span or an expert peer's experts and fails over "
                "faster than the backbone would becomes its standby or replica)");
  sub->add_option("--standbys", a->standbys,
                  "Standbys (replicas) per span (expert) peer, from the idle peers: a second one keeps the work off "
                  "the backbone through two failures; the backbone tries them in the order listed")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  sub->add_option("--backbone-mem", a->backbone_memory,
                  "What the backbone may hold of the model (globals, dense parts, KV of its layers); default "
                  "unlimited");
  sub->add_option("--local-experts-mb", a->local_experts, "Routed experts the backbone may keep, MiB");
  sub->add_option("--backbone-speed", a->backbone_speed, "Backbone compute relative to the measured cost");
  sub->add_option("--message-us", a->message_us, "Fixed cost of one message, microseconds (measured: PERFORMANCE.md)");
  sub->add_option("--streams", a->streams, "Sequences per step");
  sub->add_option("--tokens-per-step", a->tokens_per_step,
                  "Rows per step when not streams x (1 + draft): a gateway's measured average, prompt chunks "
                  "included (its re-plan's args)");
  sub->add_option("--draft", a->draft, "Draft tokens per stream per step (speculative decoding)");
  sub->add_option("--accept", a->accept, "Chance each draft token is accepted, until the first rejection");
  sub->add_option("--layout", a->layout,
                  "plan (the planner's choice) | experts (every peer an equal share of "
                  "every layer) | spans (equal spans, Petals-style)");
  sub->add_flag("--json", a->json, "Print JSON");
  sub->add_option("--activations", a->activations,
                  "Expert activation counts to plan with: a saved /swarm/dashboard.json of a running gateway (or "
                  "its heatmap), or 'uniform'; default: the --status gateway's counts, else uniform");
  if (!simulate) {
    sub->add_option(
        "--from", a->from,
        "A previous plan (--json output), or 'live': the --status gateway's layout now; list what moves (roles, "
        "slices to transfer) to reach the new one");
    sub->add_option("--status", a->status_url,
                    "A running gateway (http://HOST:PORT): its workers that are up become peers with what it measured "
                    "— the warm-up round trip as RTT, memory = slab bytes + replica budget; a --peer of the same "
                    "name overrides one");
  }
  if (simulate) {
    sub->add_option("--peers", a->n_peers, "Generate N more peers (with --peer-memory, --rtt-median, --rtt-sigma)");
    sub->add_option("--peer-memory", a->peer_memory, "Memory of each generated peer");
    sub->add_option("--rtt-median", a->rtt_median, "Median RTT of the generated peers");
    sub->add_option("--rtt-sigma", a->rtt_sigma, "Log-normal sigma of their RTTs (0: all equal)");
    sub->add_option("--peer-speed", a->peer_speed, "Compute speed of the generated peers");
    sub->add_option("--seed", a->seed, "Seed of the generated RTTs and of the simulation");
  }
}

// "8GiB", "512MiB", "2GB", "1000000" (bytes).
inline Result<uint64_t> parse_bytes(std::string_view s) {
  size_t i = 0;
  while (i < s.size() && (std::isdigit(static_cast<unsigned char>(s[i])) || s[i] == '.')) ++i;
  if (i == 0) return make_error(StatusCode::kInvalidArgument, "'{}' is not a size (e.g. 8GiB)", s);
  double v = 0;
  try {
    v = std::stod(std::string(s.substr(0, i)));
  } catch (...) {
    return make_error(StatusCode::kInvalidArgument, "'{}' is not a size (e.g. 8GiB)", s);
  }
  const std::string_view u = s.substr(i);
  double mul = 1;
  if (u == "" || u == "B")
    mul = 1;
  else if (u == "KiB" || u == "K")
    mul = 1024.0;
  else if (u == "MiB" || u == "M")
    mul = 1024.0 * 1024;
  else if (u == "GiB" || u == "G")
    mul = 1024.0 * 1024 * 1024;
  else if (u == "TiB" || u == "T")
    mul = 1024.0 * 1024 * 1024 * 1024;
  else if (u == "KB")
    mul = 1e3;
  else if (u == "MB")
    mul = 1e6;
  else if (u == "GB")
    mul = 1e9;
  else if (u == "TB")
    mul = 1e12;
  else
    return make_error(StatusCode::kInvalidArgument, "'{}': unknown unit '{}' (B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)",
                      s, u);
  return static_cast<uint64_t>(v * mul);
}

inline Result<CliPeer> parse_plan_peer(std::string_view spec) {
  CliPeer out;
  const size_t colon = spec.find(':');
  out.peer.name = std::string(spec.substr(0, colon));
  if (out.peer.name.empty()) return make_error(StatusCode::kInvalidArgument, "--peer '{}': no name", spec);
  bool have_mem = false;
  std::string_view rest = colon == std::string_view::npos ? std::string_view{} : spec.substr(colon + 1);
  while (!rest.empty()) {
    const size_t comma = rest.find(',');
    const std::string_view kv = rest.substr(0, comma);
    rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
    const size_t eq = kv.find('=');
    if (eq == std::string_view::npos)
      return make_error(StatusCode::kInvalidArgument, "--peer '{}': '{}' is not KEY=VALUE", spec, kv);
    const std::string_view k = kv.substr(0, eq), v = kv.substr(eq + 1);
    if (k == "mem") {
      auto b = parse_bytes(v);
      if (!b) return b.status().with_context(fmt::format("--peer '{}'", spec));
      out.peer.memory_bytes = *b;
      have_mem = true;
    } else if (k == "rtt") {
      auto d = wan::parse_duration(v);
      if (!d) return d.status().with_context(fmt::format("--peer '{}'", spec));
      out.peer.rtt_s = static_cast<double>(d->count()) * 1e-9;
    } else if (k == "speed") {
      try {
        out.peer.speed = std::stod(std::string(v));
      } catch (...) {
        return make_error(StatusCode::kInvalidArgument, "--peer '{}': speed '{}' is not a number", spec, v);
      }
    } else if (k == "rate") {
      auto r = wan::parse_rate(v);
      if (!r) return r.status().with_context(fmt::format("--peer '{}'", spec));
      out.peer.rate_bps = *r;
    } else if (k == "addr") {
      out.addr = std::string(v);
    } else {
      return make_error(StatusCode::kInvalidArgument, "--peer '{}': unknown key '{}' (mem, rtt, speed, rate, addr)",
                        spec, k);
    }
  }
  if (!have_mem) return make_error(StatusCode::kInvalidArgument, "--peer '{}': mem= is required", spec);
  return out;
}

// --peer-rtt values into the planner's matrix: "A:B=20ms" sets one pair (both ways); a pair no
// value names takes the measured figure (`measured`, from live workers) where there is one, else
// a bare "20ms" when given. Errors name the value.
inline Status parse_peer_rtts(const std::vector<std::string>& values, const std::vector<PlanPeer>& peers,
                              std::vector<std::vector<double>>* out,
                              const std::vector<std::vector<double>>& measured = {}) {
  out->clear();
  if (values.empty()) {
    *out = measured;
    return Status::ok();
  }
  const size_t P = peers.size();
  out->assign(P, std::vector<double>(P, -1.0));
  std::vector<std::vector<bool>> named(P, std::vector<bool>(P, false));
  double fallback = -1;
  auto index = [&](std::string_view name) -> int {
    for (size_t i = 0; i < P; ++i)
      if (peers[i].name == name) return static_cast<int>(i);
    return -1;
  };
  for (const std::string& v : values) {
    const size_t eq = v.find('=');
    auto d = wan::parse_duration(eq == std::string::npos ? std::string_view(v) : std::string_view(v).substr(eq + 1));
    if (!d) return d.status().with_context(fmt::format("--peer-rtt '{}'", v));
    const double sec = static_cast<double>(d->count()) * 1e-9;
    if (eq == std::string::npos) {
      fallback = sec;
      continue;
    }
    const std::string_view pair = std::string_view(v).substr(0, eq);
    const size_t colon = pair.find(':');
    const int a = colon == std::string_view::npos ? -1 : index(pair.substr(0, colon));
    const int b = colon == std::string_view::npos ? -1 : index(pair.substr(colon + 1));
    if (a < 0 || b < 0 || a == b)
      return make_error(StatusCode::kInvalidArgument,
                        "--peer-rtt '{}': not A:B=DURATION with two different --peer names", v);
    (*out)[static_cast<size_t>(a)][static_cast<size_t>(b)] = (*out)[static_cast<size_t>(b)][static_cast<size_t>(a)] =
        sec;
    named[static_cast<size_t>(a)][static_cast<size_t>(b)] = named[static_cast<size_t>(b)][static_cast<size_t>(a)] =
        true;
  }
  for (size_t i = 0; i < P; ++i)
    for (size_t j = 0; j < P; ++j)
      if (i != j && !named[i][j]) (*out)[i][j] = !measured.empty() && measured[i][j] >= 0 ? measured[i][j] : fallback;
  return Status::ok();
}

// Decodes a few tokens of the model here, all local, and divides the time by the bytes a token
// reads: the cost per byte the plan's compute terms use. Then as many steps of `batch` sequences
// decoded together (one token each): what each more row of a step adds, as a share of one row's
// step (PlanModel::row_share; clamped to [0.05, 1]). A backbone slice (no routed experts: a
// gateway's file) times its dense parts alone, the routed sums standing in as zeros: its own cost
// per byte, which is what `moesh serve --calibrate` prices the backbone at.
struct Calibration {
  double seconds_per_byte = 0;
  double row_share = 1;
  double one_row_s = 0, batch_s = 0;  // a step of one row, of `batch` rows
  int batch = 0;
  bool dense_only = false;  // a backbone slice: the dense parts were timed
};

// The routed sums of a backbone slice's calibration: zeros (the time is the dense parts').
class ZeroExperts final : public ExpertExecutor {
 public:
  explicit ZeroExperts(int64_t n_embd) : n_embd_(n_embd) {}
  Ticket submit(int, const float*, int64_t n_tokens, const RoutingPlan&) override {
    out_.emplace_back(static_cast<size_t>(n_tokens * n_embd_), 0.0f);
    if (out_.size() > 8) out_.erase(out_.begin());  // several may be pending; none for long
    return next_++;
  }
  Result<std::span<const float>> wait(Ticket t) override {
    const uint64_t back = next_ - 1 - t;
    if (back >= out_.size()) return make_error(StatusCode::kInternal, "calibration: ticket {} is gone", t);
    const std::vector<float>& v = out_[out_.size() - 1 - back];
    return std::span<const float>(v.data(), v.size());
  }

 private:
  int64_t n_embd_;
  std::vector<std::vector<float>> out_;
  Ticket next_ = 0;
};

inline Result<Calibration> calibrate_costs(const std::string& path, int threads, const PlanModel& pm, int batch) {
  auto model = Model::load(path, LoadOptions{});
  if (!model) return model.status();
  ContextParams cp;
  cp.n_threads = threads;
  cp.n_ctx = 64;
  const bool dense_only = swarm::slice_kind((*model)->file()) == swarm::kKindBackbone;
  if (dense_only) cp.executor = std::make_shared<ZeroExperts>((*model)->hparams().n_embd);
  Context ctx(**model, cp);
  constexpr int kSteps = 16;
  Calibration c;
  c.batch = std::max(batch, 2);
  std::vector<Context::BatchToken> step;
  // One warm-up step, then kSteps timed, of `rows` sequences (one token each).
  auto time_steps = [&](int rows) -> Result<double> {
    ctx.state().clear();
    step.assign(static_cast<size_t>(rows), {});
    double total = 0;
    for (int i = 0; i <= kSteps; ++i) {
      for (int q = 0; q < rows; ++q) step[static_cast<size_t>(q)] = {q, 5 + (i * rows + q) % 64, false};
      const auto t0 = std::chrono::steady_clock::now();
      MOESH_RETURN_IF_ERROR(ctx.decode_batch(step, nullptr));
      if (i > 0) total += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    return total / kSteps;
  };
  MOESH_ASSIGN_OR_RETURN(c.one_row_s, time_steps(1));
  MOESH_ASSIGN_OR_RETURN(c.batch_s, time_steps(c.batch));
  uint64_t bytes = pm.global_bytes / 2;  // the embedding row is one read; the head is all of it
  for (const PlanLayer& L : pm.layers)
    bytes += L.dense_bytes + (L.moe && !dense_only ? L.expert_bytes * pm.n_expert_used : 0);
  c.dense_only = dense_only;
  c.seconds_per_byte = c.one_row_s / static_cast<double>(bytes);
  c.row_share = std::clamp((c.batch_s / c.one_row_s - 1.0) / (c.batch - 1), 0.05, 1.0);
  return c;
}

// Where the planner's activation shares came from (docs/swarm.md#activation-statistics).
// Everything the two commands need, resolved from the options.
struct PlanSetup {
  PlanModel model;
  ActivationInfo activations;
  std::vector<CliPeer> peers;
  std::vector<PlanPeer> plan_peers;
  PlanOptions opts;
  double seconds_per_byte = 0;
  bool calibrated = false;
  Calibration calibration;  // when calibrated
  int measured_speeds = 0;  // live peers priced at their measured compute speed
};

inline Result<PlanSetup> resolve_plan_setup(const PlanCliArgs& a) {
  PlanSetup s;
  if (a.model.empty() == a.shape.empty())
    return make_error(StatusCode::kInvalidArgument, "give exactly one of -m MODEL.gguf and --shape NAME");
  s.seconds_per_byte = a.seconds_per_byte > 0 ? a.seconds_per_byte : kDefaultSecondsPerByte;
  if (!a.model.empty()) {
    auto f = gguf::File::open(a.model);
    if (!f) return f.status();
    auto m = plan_model_from_gguf(**f, a.n_ctx, s.seconds_per_byte);
    if (!m) return m.status();
    s.model = std::move(*m);
    if (a.calibrate) {
      // The batch it is fitted at: the step's rows when that is several, else 8.
      const int rows = a.tokens_per_step > 0 ? a.tokens_per_step : a.streams * (1 + a.draft);
      auto cal = calibrate_costs(a.model, a.calibrate_threads, s.model, rows > 1 ? std::min(rows, 64) : 8);
      if (!cal) return cal.status().with_context("--calibrate");
      s.calibration = *cal;
      s.seconds_per_byte = a.seconds_per_byte > 0 ? a.seconds_per_byte : cal->seconds_per_byte;
      s.calibrated = true;
      auto again = plan_model_from_gguf(**f, a.n_ctx, s.seconds_per_byte);
      if (!again) return again.status();
      s.model = std::move(*again);
      s.model.row_share = cal->row_share;
    }
  } else {
    if (a.calibrate) return make_error(StatusCode::kInvalidArgument, "--calibrate needs -m (a shape has no weights)");
    auto m = plan_model_shape(a.shape, a.n_ctx, s.seconds_per_byte);
    if (!m) return m.status();
    s.model = std::move(*m);
  }
  if (a.row_share != 0) {
    if (!(a.row_share > 0 && a.row_share <= 2))
      return make_error(StatusCode::kInvalidArgument, "--row-share {}: must be in (0, 2] (1: linear)", a.row_share);
    s.model.row_share = a.row_share;
  }
  if (!a.activations.empty() && a.activations != "uniform") {
    std::ifstream in(a.activations);
    if (!in.is_open())
      return make_error(StatusCode::kInvalidArgument, "--activations {}: cannot open it", a.activations);
    const nlohmann::json doc = nlohmann::json::parse(in, nullptr, false);
    if (doc.is_discarded())
      return make_error(StatusCode::kInvalidArgument, "--activations {}: not JSON", a.activations);
    MOESH_RETURN_IF_ERROR(apply_activations(doc, a.activations, &s.model, &s.activations));
  } else if (a.activations.empty() && !a.live_activations.is_null()) {
    // A gateway that counted nothing (no request yet, or its span peers route every MoE block)
    // shows an empty heatmap: uniform, as its own re-plan takes it.
    const nlohmann::json& lv = a.live_activations;
    const nlohmann::json& h = lv.is_object() && lv.contains("heatmap") ? lv["heatmap"] : lv;
    if (!(h.is_object() && h.contains("layers") && h["layers"].is_array() && h["layers"].empty()))
      MOESH_RETURN_IF_ERROR(apply_activations(lv, a.status_url, &s.model, &s.activations));
  }
  for (const std::string& spec : a.peer_specs) {
    auto p = parse_plan_peer(spec);
    if (!p) return p.status();
    s.peers.push_back(std::move(*p));
  }
  // A gateway's peers at their measured compute speeds: absolute when this machine's costs are
  // measured or given, else relative to each other (plan/live.h).
  std::vector<CliPeer> live = a.live_peers;
  s.measured_speeds = apply_measured_speeds(s.model, &live, a.seconds_per_byte > 0 || s.calibrated);
  for (const CliPeer& lp : live) {
    bool named = false;
    for (const CliPeer& p : s.peers) named = named || p.peer.name == lp.peer.name;
    if (!named) s.peers.push_back(lp);
  }
  if (a.n_peers > 0) {
    auto mem = parse_bytes(a.peer_memory);
    if (!mem) return mem.status().with_context("--peer-memory");
    auto med = wan::parse_duration(a.rtt_median);
    if (!med) return med.status().with_context("--rtt-median");
    std::mt19937_64 rng(a.seed);
    std::lognormal_distribution<double> rtt(std::log(static_cast<double>(med->count()) * 1e-9), a.rtt_sigma);
    for (int i = 0; i < a.n_peers; ++i) {
      CliPeer p;
      p.peer = {fmt::format("g{}", i), *mem, a.rtt_sigma > 0 ? rtt(rng) : static_cast<double>(med->count()) * 1e-9,
                a.peer_speed, 0};
      s.peers.push_back(p);
    }
  }
  for (const CliPeer& p : s.peers) s.plan_peers.push_back(p.peer);
  MOESH_RETURN_IF_ERROR(parse_peer_rtts(a.peer_rtts, s.plan_peers, &s.opts.peer_rtt_s, measured_peer_rtts(s.peers)));
  s.opts.chain_spans = !a.no_chain;
  s.opts.spans = !a.no_spans;
  s.opts.standbys_per_primary = a.standbys;
  if (!a.backbone_memory.empty()) {
    auto b = parse_bytes(a.backbone_memory);
    if (!b) return b.status().with_context("--backbone-mem");
    s.opts.backbone_memory_bytes = *b;
  }
  auto le = parse_bytes(a.local_experts +
                        (a.local_experts.find_first_not_of("0123456789.") == std::string::npos ? "MiB" : ""));
  if (!le) return le.status().with_context("--local-experts-mb");
  s.opts.local_experts_bytes = *le;
  s.opts.backbone_speed = a.backbone_speed;
  s.opts.message_s = a.message_us * 1e-6;
  if (a.streams < 1 || a.draft < 0 || a.accept < 0 || a.accept > 1)
    return make_error(StatusCode::kInvalidArgument, "--streams >= 1, --draft >= 0, --accept in [0,1]");
  s.opts.tokens_per_step = a.streams * (1 + a.draft);
  s.opts.streams = a.streams;
  if (a.tokens_per_step > 0) {  // a gateway's measured average (its re-plan's args): prompt chunks count
    if (a.tokens_per_step < a.streams)
      return make_error(StatusCode::kInvalidArgument, "--tokens-per-step {} is below --streams {}", a.tokens_per_step,
                        a.streams);
    s.opts.tokens_per_step = a.tokens_per_step;
  }
  // Expected tokens a stream keeps per step: 1 + sum_{i=1..d} accept^i.
  double kept = 1;
  for (int i = 1; i <= a.draft; ++i) kept += std::pow(a.accept, i);
  s.opts.accepted_per_step = a.tokens_per_step > 0 ? a.tokens_per_step : a.streams * kept;
  return s;
}

inline Result<SwarmPlan> plan_for_layout(const PlanSetup& s, const std::string& layout) {
  if (layout == "plan") return plan_swarm(s.model, s.plan_peers, s.opts);
  if (layout == "experts") return plan_all_experts(s.model, s.plan_peers, s.opts);
  if (layout == "spans") return plan_all_spans(s.model, s.plan_peers, s.opts);
  return make_error(StatusCode::kInvalidArgument, "--layout '{}': plan, experts or spans", layout);
}

inline nlohmann::json plan_to_json(const PlanSetup& s, const SwarmPlan& p) {
  nlohmann::json roles = nlohmann::json::array();
  for (size_t i = 0; i < s.peers.size(); ++i) {
    const PeerRole& r = p.roles[i];
    nlohmann::json j{{"peer", s.peers[i].peer.name},
                     {"role", role_name(r.kind)},
                     {"bytes", r.bytes},
                     {"memory_bytes", s.peers[i].peer.memory_bytes},
                     {"rtt_ms", s.peers[i].peer.rtt_s * 1e3}};
    if (!s.peers[i].addr.empty()) j["addr"] = s.peers[i].addr;
    if (r.kind == RoleKind::kSpan) j["layers"] = fmt::format("{}-{}", r.first, r.last);
    if (r.kind == RoleKind::kSpan && r.chained_after >= 0)
      j["chained_after"] = s.peers[static_cast<size_t>(r.chained_after)].peer.name;
    if (r.kind == RoleKind::kSpan && r.lane_of >= 0) {
      j["role"] = "lane";
      j["lane_of"] = s.peers[static_cast<size_t>(r.lane_of)].peer.name;
    }
    if (r.kind == RoleKind::kExperts) j["experts"] = format_expert_spec(held_experts(r), s.model.n_expert);
    if (!r.copies.empty()) j["copies"] = format_expert_spec(r.copies, s.model.n_expert);
    for (const Standby& sb : p.standbys) {
      if (sb.peer != static_cast<int>(i)) continue;
      j["standby_for"] = s.peers[static_cast<size_t>(sb.primary)].peer.name;
      if (sb.replica()) {
        j["role"] = "replica";
        j["experts"] = format_expert_spec(sb.experts, s.model.n_expert);
        j["bytes"] = p.roles[static_cast<size_t>(sb.primary)].bytes;
      } else {
        j["role"] = "standby";
        j["layers"] = fmt::format("{}-{}", sb.first, sb.last);
      }
    }
    roles.push_back(j);
  }
  // What a span or expert peer's failure costs: its standby (replica) serving, or the backbone
  // doing the work itself.
  nlohmann::json standbys = nlohmann::json::array();
  for (const Standby& sb : p.standbys) {
    nlohmann::json j{{"peer", s.peers[static_cast<size_t>(sb.peer)].peer.name},
                     {"role", sb.replica() ? "replica" : "standby"},
                     {"standby_for", s.peers[static_cast<size_t>(sb.primary)].peer.name},
                     {"failover_step_ms", sb.failover_step_s * 1e3},
                     {"fallback_step_ms",
                      sb.fallback_step_s < 0 ? nlohmann::json(nullptr) : nlohmann::json(sb.fallback_step_s * 1e3)}};
    if (sb.replica())
      j["experts"] = format_expert_spec(sb.experts, s.model.n_expert);
    else
      j["layers"] = fmt::format("{}-{}", sb.first, sb.last);
    standbys.push_back(std::move(j));
  }
  // The peer-to-peer round trips the plan was priced with (--peer-rtt, or measured by live workers).
  nlohmann::json rtts = nlohmann::json::array();
  for (size_t i = 0; i < s.opts.peer_rtt_s.size(); ++i)
    for (size_t k = i + 1; k < s.opts.peer_rtt_s[i].size(); ++k)
      if (s.opts.peer_rtt_s[i][k] >= 0)
        rtts.push_back(
            {{"a", s.peers[i].peer.name}, {"b", s.peers[k].peer.name}, {"ms", s.opts.peer_rtt_s[i][k] * 1e3}});
  // The bytes a token's row takes across each span boundary.
  nlohmann::json row_bytes = nlohmann::json::array();
  for (int b = 0; b <= s.model.n_layer(); ++b) row_bytes.push_back(s.model.row_bytes_at(b));
  return nlohmann::json{
      {"model", s.model.name},
      {"span_row_bytes", row_bytes},
      {"peer_rtt_ms", rtts},
      {"n_layer", s.model.n_layer()},
      {"seconds_per_byte", s.seconds_per_byte},
      {"row_share", s.model.row_share},
      {"calibrated", s.calibrated},
      {"activations", s.activations.source.empty() ? nlohmann::json(nullptr)
                                                   : nlohmann::json{{"source", s.activations.source},
                                                                    {"layers", s.activations.layers},
                                                                    {"tokens", s.activations.tokens}}},
      {"tokens_per_step", s.opts.tokens_per_step},
      {"roles", roles},
      {"backbone_bytes", p.backbone_bytes},
      {"backbone_experts", format_expert_spec(p.backbone_experts, s.model.n_expert)},
      {"predicted_step_ms", p.step_s * 1e3},
      {"predicted_tokens_per_s", p.tokens_per_s},
      {"trips_per_step", p.trips_per_step},
      {"standbys", standbys}};
}

}  // namespace moesh::cli
