// Options shared by every command that runs a model (logits, run, bench, gate) for remote
// expert dispatch: `--worker HOST:PORT` (repeatable), `--workers FILE`, `--wire`, `--combine`,
// `--timeout-ms`, `--congestion`. Without workers the model runs all-local as before.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "model_cli.h"
#include "moesh/remote/remote.h"
#include "moesh/remote/span_client.h"
#include "moesh/wan/host_tcp.h"

namespace moesh::cli {

struct SwarmArgs {
  std::vector<std::string> workers;  // --worker, repeatable
  std::string workers_file;          // --workers
  std::string wire = "f32";          // D (both directions) or HIDDEN,RETURN
  std::string combine = "exact";
  int timeout_ms = 10000;
  std::string congestion = "cubic";
  int poll_us = 0;
  std::string micro_batches = "auto";
  double local_experts_mb = 0;
  std::string local_experts_policy = "trip";
  std::string swarm_key;  // --swarm-key FILE
  double verify_rate = 0;
  std::string name = "backbone";        // --backbone-name: announced in HELLO, the workers' ledger key
  std::string accept_workers;           // --accept-workers HOST:PORT: workers dial in (moesh worker --join)
  int wait_workers = 1;                 // --wait-workers: joined workers to wait for at start-up
  int join_wait_ms = 60000;             // --join-wait-ms: how long
  std::vector<std::string> tls_pins;    // --tls-pin SHA256 (repeatable): TLS to every worker
  int replicate_hot = 0;                // --replicate-hot N
  int rebalance = 0;                    // --rebalance N
  std::vector<std::string> spans;       // --span FIRST-LAST@HOST:PORT (repeatable)
  std::vector<std::string> span_lanes;  // --span-lane FIRST-LAST@HOST:PORT (repeatable)
  std::string span_wire = "f32";        // --span-wire
  int span_timeout_ms = 60000;          // --span-timeout-ms
  bool no_span_fallback = false;        // --no-span-fallback
  int span_retry_ms = 10000;            // --span-retry-ms
  std::string span_chain = "auto";      // --span-chain
  int span_log_mb = 1024;               // --span-log-mb
  std::string span_log_dir;             // --span-log-dir

  bool enabled() const { return !workers.empty() || !workers_file.empty() || !accept_workers.empty(); }
};

inline Result<wire::WireDType> parse_wire_dtype(const std::string& s) {
  for (int i = 0; i < static_cast<int>(wire::WireDType::kCOUNT); ++i) {
    const auto t = static_cast<wire::WireDType>(i);
    if (s == wire::wire_dtype_name(t)) return t;
  }
  return make_error(StatusCode::kInvalidArgument, "--wire: '{}' is not f32|f16|bf16|q8|q8k", s);
}

// `--wire D` sets both directions, `--wire HIDDEN,RETURN` each (e.g. "q8,f16").
inline Result<std::pair<wire::WireDType, wire::WireDType>> parse_wire_pair(const std::string& s) {
  const size_t comma = s.find(',');
  if (comma == std::string::npos) {
    MOESH_ASSIGN_OR_RETURN(wire::WireDType t, parse_wire_dtype(s));
    return std::make_pair(t, t);
  }
  if (s.find(',', comma + 1) != std::string::npos)
    return make_error(StatusCode::kInvalidArgument, "--wire: '{}' has more than HIDDEN,RETURN", s);
  MOESH_ASSIGN_OR_RETURN(wire::WireDType h, parse_wire_dtype(s.substr(0, comma)));
  MOESH_ASSIGN_OR_RETURN(wire::WireDType r, parse_wire_dtype(s.substr(comma + 1)));
  return std::make_pair(h, r);
}

inline void add_swarm_options(CLI::App* sub, SwarmArgs* a) {
  sub->add_option("--worker", a->workers, "Worker HOST:PORT serving routed experts (repeatable)");
  sub->add_option("--workers", a->workers_file, "File with one worker HOST:PORT per line (# comments)");
  sub->add_option("--swarm-key", a->swarm_key,
                  "Swarm key file: every worker must prove it holds the same key, and so does this side (mutual "
                  "HMAC challenge in the handshake)");
  sub->add_option("--verify-rate", a->verify_rate,
                  "Recompute this fraction of worker results here (when this side holds the experts) and compare: "
                  "a worker whose results differ is evicted, its pairs recomputed; 0: off")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  sub->add_option("--accept-workers", a->accept_workers,
                  "HOST:PORT where workers dial in (moesh worker --join): no inbound port needed on their side; "
                  "workers that join later are added, reconnecting ones keep their place")
      ->capture_default_str();
  sub->add_option("--wait-workers", a->wait_workers,
                  "With --accept-workers: joined workers to wait for before starting (besides any --worker)")
      ->check(CLI::Range(0, 100000))
      ->capture_default_str();
  sub->add_option("--join-wait-ms", a->join_wait_ms, "With --accept-workers: how long to wait for them")
      ->check(CLI::Range(0, 24 * 3600 * 1000))
      ->capture_default_str();
  sub->add_option("--tls-pin", a->tls_pins,
                  "TLS to every worker, accepting only a certificate with this SHA-256 fingerprint (repeatable; "
                  "a worker prints its own at start-up)");
  sub->add_option("--backbone-name", a->name,
                  "Name this side announces to workers: the key of their ledger entry for it")
      ->capture_default_str();
  sub->add_option("--wire", a->wire,
                  "Wire dtype of hidden and result rows, D or HIDDEN,RETURN, each f32|f16|bf16|q8|q8k "
                  "(hidden q8: the INT8 blocks the worker's dot products take, Q8K for k-quants)")
      ->check(CLI::Validator(
          [](std::string& v) {
            auto p = parse_wire_pair(v);
            return p ? std::string() : p.status().message();
          },
          "D|HIDDEN,RETURN"))
      ->capture_default_str();
  sub->add_option("--combine", a->combine,
                  "exact: raw expert outputs, summed here in rank order (bit-exact with f32); "
                  "partial: one weighted sum per token and worker")
      ->check(CLI::IsMember({"exact", "partial"}))
      ->capture_default_str();
  sub->add_option("--timeout-ms", a->timeout_ms, "Deadline of each remote request")
      ->check(CLI::Range(1, 3600 * 1000))
      ->capture_default_str();
  sub->add_option("--congestion", a->congestion, "TCP congestion control set before connect ('' = system default)")
      ->capture_default_str();
  add_poll_flag(sub, &a->poll_us, "a worker's reply");
  sub->add_option("--micro-batches", a->micro_batches,
                  "Steps of several sequences as two halves whose trips overlap: off|on|auto (auto: whichever "
                  "measures faster)")
      ->check(CLI::IsMember({"off", "on", "auto"}))
      ->capture_default_str();
  sub->add_option("--local-experts-mb", a->local_experts_mb,
                  "Compute the hottest experts here, at most this many MiB of them, chosen from counted "
                  "activations (mapped from this file, or fetched from a worker and checked by hash); 0: off")
      ->check(CLI::Range(0.0, 1e9))
      ->capture_default_str();
  sub->add_option("--local-experts-policy", a->local_experts_policy,
                  "trip: minimise expected trip latency (whole local layers can win); hottest: most activated "
                  "experts per byte")
      ->check(CLI::IsMember({"trip", "hottest"}))
      ->capture_default_str();
  sub->add_option("--replicate-hot", a->replicate_hot,
                  "At each hot-expert plan, send up to N of the most activated experts that fewer than two "
                  "workers hold to a worker with --replica-dir (checked by hash on both ends); 0: off")
      ->check(CLI::Range(0, 1 << 20))
      ->capture_default_str();
  sub->add_option("--rebalance", a->rebalance,
                  "At each hot-expert plan, move up to N experts to nearer workers with --replica-dir where that "
                  "saves expected trip latency (whole layers first; copied and checked by hash before use); 0: off")
      ->check(CLI::Range(0, 1 << 20))
      ->capture_default_str();
  sub->add_option("--span", a->spans,
                  "Blocks FIRST-LAST run on a span peer (moesh span) at HOST:PORT: one trip per span and step "
                  "(repeatable; the same span again names a replacement, tried in order when one fails); "
                  "FIRST-LAST@here: blocks this process runs itself as a span, so a live resplit can move them");
  sub->add_option("--span-lane", a->span_lanes,
                  "Another span peer at HOST:PORT runs blocks FIRST-LAST (a --span) at the same time, for its share "
                  "of the sequences: many streams, one trip per lane and step, all in flight together (repeatable; "
                  "a lane that fails is dropped, its sequences replayed on the span's runner)");
  sub->add_option("--span-wire", a->span_wire, "Rows between spans: f32 (bit-exact), f16 or bf16")
      ->check(CLI::IsMember({"f32", "f16", "bf16"}))
      ->capture_default_str();
  sub->add_option("--span-timeout-ms", a->span_timeout_ms, "Deadline of each span trip")
      ->check(CLI::Range(1, 3600 * 1000))
      ->capture_default_str();
  sub->add_flag("--no-span-fallback", a->no_span_fallback,
                "Fail when every peer of a span fails, instead of running its blocks here");
  sub->add_option("--span-chain", a->span_chain,
                  "Adjacent spans as one chain, each peer passing its rows on to the next: auto (where it "
                  "measured faster than star trips), on, or off")
      ->capture_default_str();
  sub->add_option("--span-retry-ms", a->span_retry_ms,
                  "After a span moved off a failed peer, dial the peers named before its current one again at "
                  "most this often and go back to the first that answers (-1: never)")
      ->capture_default_str();
  sub->add_option("--span-log-mb", a->span_log_mb,
                  "Memory for the rows kept to replay a span's inputs to a replacement peer; older rows go to an "
                  "unlinked file in --span-log-dir")
      ->check(CLI::Range(0, 1 << 30))
      ->capture_default_str();
  sub->add_option("--span-log-dir", a->span_log_dir,
                  "Directory of the span input log's file (default: $TMPDIR, else /var/tmp)");
}

inline MicroBatching micro_batching_of(const SwarmArgs& a) {
  if (a.micro_batches == "off") return MicroBatching::kOff;
  if (a.micro_batches == "on") return MicroBatching::kOn;
  return MicroBatching::kAuto;
}

inline Result<wire::CombineMode> parse_combine_mode(const std::string& s) {
  if (s == "exact") return wire::CombineMode::kExact;
  if (s == "partial") return wire::CombineMode::kPartial;
  return make_error(StatusCode::kInvalidArgument, "--combine: '{}' is not exact|partial", s);
}

inline Result<RemoteOptions> remote_options(const SwarmArgs& a) {
  RemoteOptions o;
  MOESH_ASSIGN_OR_RETURN(auto dts, parse_wire_pair(a.wire));
  o.hidden_wire = dts.first;
  o.return_wire = dts.second;
  MOESH_ASSIGN_OR_RETURN(o.combine, parse_combine_mode(a.combine));
  o.timeout = std::chrono::milliseconds(a.timeout_ms);
  o.tcp.congestion = a.congestion;
  o.tcp.poll_us = a.poll_us;
  o.local_experts_bytes = static_cast<uint64_t>(a.local_experts_mb * 1024.0 * 1024.0);
  o.local_policy = a.local_experts_policy == "hottest" ? LocalExpertPolicy::kHottest : LocalExpertPolicy::kTripAware;
  o.replicate_hot = a.replicate_hot;
  o.rebalance = a.rebalance;
  if (!a.swarm_key.empty()) {
    MOESH_ASSIGN_OR_RETURN(o.swarm_key, net::SwarmKey::load(a.swarm_key));
  }
  o.verify_rate = a.verify_rate;
  o.name = a.name;
  if (!a.tls_pins.empty()) {
    MOESH_ASSIGN_OR_RETURN(net::TlsPins pins, net::TlsPins::parse(a.tls_pins));
    o.tls_pins = std::make_shared<const net::TlsPins>(std::move(pins));
  }
  return o;
}

inline Result<std::vector<WorkerAddress>> worker_addresses(const SwarmArgs& a) {
  std::vector<WorkerAddress> out;
  if (!a.workers_file.empty()) {
    MOESH_ASSIGN_OR_RETURN(out, read_workers_file(a.workers_file));
  }
  for (const std::string& w : a.workers) {
    MOESH_ASSIGN_OR_RETURN(WorkerAddress addr, parse_worker_address(w));
    out.push_back(addr);
  }
  return out;
}

// Connects to the workers named by `a` (if any) and stores the executor in *out (null when no
// workers are given). Prints the error and returns false on failure. The caller passes *out as
// ContextParams::executor; the Context hands the executor its thread pool itself.
inline bool open_remote_or_report(const Model& model, const SwarmArgs& a, const char* cmd,
                                  std::shared_ptr<RemoteExecutor>* out) {
  out->reset();
  if (!a.enabled()) return true;
  auto fail = [cmd](const Status& st) {
    std::fprintf(stderr, "moesh %s: error: %s\n", cmd, st.to_string().c_str());
    return false;
  };
  auto opts = remote_options(a);
  if (!opts) return fail(opts.status());
  // Host TCP settings that only the operator can change (docs/wan-emu.md): say so at start-up.
  for (const std::string& w : wan::check_host_tcp_settings(a.congestion)) {
    std::fprintf(stderr, "moesh %s: warning: %s\n", cmd, w.c_str());
  }
  auto addrs = worker_addresses(a);
  if (!addrs) return fail(addrs.status());
  if (!a.accept_workers.empty()) {
    auto where = parse_listen_address(a.accept_workers);
    if (!where)
      return fail(make_error(StatusCode::kInvalidArgument, "--accept-workers '{}' is not HOST:PORT (port 0: any)",
                             a.accept_workers));
    auto hello = backbone_hello(model, *opts);
    if (!hello) return fail(hello.status());
    RegistryOptions ro;
    ro.host = where->host;
    ro.port = where->port;
    auto reg = WorkerRegistry::listen(*hello, opts->link_options(), ro);
    if (!reg) return fail(reg.status());
    opts->registry = *reg;
    std::fprintf(stderr, "accepting workers on %s:%u (moesh worker --join); waiting for %d\n", ro.host.c_str(),
                 static_cast<unsigned>((*reg)->port()), a.wait_workers);
    const auto names = (*reg)->wait_for(static_cast<size_t>(std::max(a.wait_workers, 0)),
                                        net::deadline_in(std::chrono::milliseconds(a.join_wait_ms)));
    if (static_cast<int>(names.size()) < a.wait_workers) {
      std::string why = (*reg)->last_refusal();
      return fail(make_error(StatusCode::kTimeout, "{} of {} workers joined within {} ms{}", names.size(),
                             a.wait_workers, a.join_wait_ms, why.empty() ? "" : " (last refusal: " + why + ")"));
    }
    for (const std::string& n : names) {
      WorkerAddress j;
      j.path = WorkerPath::kJoined;
      j.name = n;
      addrs->push_back(j);
    }
  }
  auto exec = RemoteExecutor::connect(model, *addrs, *opts);
  if (!exec) return fail(exec.status());
  std::fprintf(stderr, "%s", (*exec)->describe().c_str());
  *out = std::shared_ptr<RemoteExecutor>(std::move(*exec));
  return true;
}

// Connects the span peers named by --span (if any) and stores the runner in *out (null when no
// spans are given). Prints the error and returns false on failure. The caller passes *out as
// ContextParams::spans.
// `experts`: the backbone's executor (its workers), which spans run here borrow; null: none.
inline bool open_spans_or_report(const Model& model, const SwarmArgs& a, const char* cmd, int n_threads,
                                 std::shared_ptr<SpanClient>* out, std::shared_ptr<ExpertExecutor> experts = nullptr) {
  out->reset();
  if (a.spans.empty()) return true;
  auto fail = [cmd](const Status& st) {
    std::fprintf(stderr, "moesh %s: error: %s\n", cmd, st.to_string().c_str());
    return false;
  };
  auto ro = remote_options(a);
  if (!ro) return fail(ro.status());
  std::vector<SpanTarget> targets;
  for (const std::string& s : a.spans) {
    auto t = parse_span_target(s);
    if (!t) return fail(t.status());
    targets.push_back(std::move(*t));
  }
  for (const std::string& s : a.span_lanes) {
    auto t = parse_span_lane(s);
    if (!t) return fail(t.status());
    targets.push_back(std::move(*t));
  }
  SpanOptions so;
  so.link = ro->link_options();
  so.name = a.name;
  auto wd = parse_wire_dtype(a.span_wire);
  if (!wd) return fail(wd.status());
  so.hidden_wire = so.return_wire = *wd;
  so.timeout = std::chrono::milliseconds(a.span_timeout_ms);
  so.local_fallback = !a.no_span_fallback;
  so.retry_preferred = std::chrono::milliseconds(a.span_retry_ms);
  auto chain = parse_span_chain_mode(a.span_chain);
  if (!chain) return fail(chain.status());
  so.chain = *chain;
  so.local_threads = n_threads;
  so.here_executor = std::move(experts);
  so.log_memory_bytes = static_cast<size_t>(a.span_log_mb) << 20;
  so.log_dir = a.span_log_dir;
  auto c = SpanClient::connect(model, std::move(targets), so);
  if (!c) return fail(c.status());
  std::fprintf(stderr, "%s", (*c)->describe().c_str());
  *out = std::move(*c);
  return true;
}

inline void print_span_stats(const SpanClient& c, std::FILE* f) {
  const SpanStats s = c.stats();
  std::fprintf(f,
               "spans: %llu span steps in %llu trips (%llu resends, %llu rows replayed), %llu failovers, %llu back on "
               "a preferred peer, %llu run here; %llu chained in %llu chains (%llu awaits, %llu broken); %.1f KiB "
               "sent, %.1f KiB received; input log %.1f KiB (%.1f KiB of rows in its file)\n",
               static_cast<unsigned long long>(s.steps), static_cast<unsigned long long>(s.trips),
               static_cast<unsigned long long>(s.resends), static_cast<unsigned long long>(s.replayed_rows),
               static_cast<unsigned long long>(s.failovers), static_cast<unsigned long long>(s.restored),
               static_cast<unsigned long long>(s.local_steps), static_cast<unsigned long long>(s.chained_steps),
               static_cast<unsigned long long>(s.chains), static_cast<unsigned long long>(s.awaits),
               static_cast<unsigned long long>(s.chain_breaks), s.bytes_sent / 1024.0, s.bytes_received / 1024.0,
               c.log_bytes() / 1024.0, c.log_stats().file_bytes / 1024.0);
  if (s.lanes_added > 0) {
    std::fprintf(f, "span lanes: %llu trips, %llu rows computed there, %llu failed\n",
                 static_cast<unsigned long long>(s.lane_trips), static_cast<unsigned long long>(s.lane_rows),
                 static_cast<unsigned long long>(s.lane_failures));
  }
  for (size_t k = 0; k < c.spans().size(); ++k) std::fprintf(f, "  span %s\n", c.where(static_cast<int>(k)).c_str());
}

}  // namespace moesh::cli
