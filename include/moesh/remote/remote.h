// RemoteExecutor: the ExpertExecutor that sends routed-expert work to `moesh worker` processes
// (docs/PROTOCOL.md). It is assembled from parts with their own headers and tests:
//   placement.h — who holds each (layer, expert): any number of workers, a backbone copy;
//   planner.h   — who computes each (token, rank) pair: replica balance, local copies,
//                 excluded holders, re-planning a failed request's pairs;
//   link.h      — one worker connection from a Dialer (TCP, loopback, fault injection), HELLO,
//                 warm-up PING, GOODBYE;
//   fanout.h    — requests to every involved worker in flight at once, replies in arrival order;
//   combiner.h  — exact rank-order sum or partial sums, sharing rank_sum_step with local.
//
// Start-up (connect): dial every worker, HELLO (protocol version and model identity must match;
// a mismatch names the worker), one padded PING to open the congestion window, then the
// placement from the expert ranges the workers announced (an expert held by nobody, and not by
// the backbone either, fails start-up with a message listing them).
//
// Per MoE layer: submit() plans the pairs, sends one DISPATCH to every involved worker at once
// (star fan-out: one round trip per layer whatever the number of workers) and returns; wait()
// computes the backbone's own share, gathers every COMBINE with a per-request deadline, in
// arrival order, and combines (combiner.h). A worker error, timeout or disconnect: its pairs go
// to the other holders (replicas, the backbone's copies) in a second trip of the same call
// (RemoteOptions::failover), and the worker is left out until it answers a re-dial; only when
// no other holder has some of its experts does the layer fail, with a Status naming the failed
// workers, the layer, the request ids and the experts. Nothing waits past its deadline.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "moesh/model/model.h"
#include "moesh/moe/executor.h"
#include "moesh/remote/address.h"
#include "moesh/remote/link.h"
#include "moesh/remote/placement.h"
#include "moesh/remote/planner.h"
#include "moesh/remote/registry.h"
#include "moesh/swarm/swarm.h"
#include "moesh/util/status.h"
#include "moesh/wire/wire.h"

namespace moesh {

// How the hot experts kept on the backbone (RemoteOptions::local_experts_bytes) are chosen.
enum class LocalExpertPolicy {
  kTripAware = 0,  // trip_planner.h: minimise the expected per-token trip latency (whole layers can win)
  kHottest,        // the most activated experts per byte, wherever they are (load only, EPLB-like)
};

struct RemoteOptions {
  // Dtype of the hidden rows sent (DISPATCH). kQ8 means "the INT8 block format the worker's
  // gate dot products consume": per (worker, layer), Q8K where the worker's HELLO says that
  // layer takes Q8_K activations (k-quant weights) and it speaks Q8K, Q8 otherwise — exact for
  // Q8_0- and Q8_K-activation weights. kQ8K sends Q8K everywhere.
  wire::WireDType hidden_wire = wire::WireDType::kF32;
  // Dtype of the expert results returned (COMBINE). kQ8 stays 32-value blocks (smaller error).
  wire::WireDType return_wire = wire::WireDType::kF32;
  wire::CombineMode combine = wire::CombineMode::kExact;
  // EXACT with f32 returns: a request whose every token carries ranks 0..j of that token (one
  // worker holding all of a token's experts, or its first ones) asks for one rank-order sum per
  // token (PARTIAL on the wire) and the combine goes on from it: the same float operations in the
  // same order, so the same bits, with 1 row back instead of j+1 (64 KiB -> 8 KiB per decode
  // token of a 2048-wide top-8 model). false: raw rows always (environment MOESH_EXACT_ROWS=1).
  bool exact_prefix_sums = true;
  std::chrono::milliseconds timeout{10000};         // per request (dispatch -> combine)
  std::chrono::milliseconds connect_timeout{5000};  // connect + handshake + warm-up, per worker
  net::TcpOptions tcp;                              // congestion control, buffers, NODELAY
  uint32_t warmup_pad_bytes = 100 * 1024;           // warm-up PING padding each way
  std::string name = "backbone";                    // announced in HELLO
  Dialer dialer;                                    // empty: TCP with `tcp`
  PlannerPolicy planner;
  // Hot experts (--local-experts-mb): the backbone counts expert activations per layer and, once
  // hot_plan_after_tokens tokens have passed the first MoE layer (and every
  // hot_replan_every_tokens after that), computes the chosen experts itself, at most this many
  // bytes of them: mapped from its own file, or received from a worker (FETCH) and checked
  // against the model's slab hashes. 0: off.
  uint64_t local_experts_bytes = 0;
  LocalExpertPolicy local_policy = LocalExpertPolicy::kTripAware;
  int64_t hot_plan_after_tokens = 32;
  int64_t hot_replan_every_tokens = 1024;
  // Trip cost per worker (seconds) to plan with instead of the measured ones (one per worker;
  // empty: measure). For links whose cost is known, and for tests that must not depend on timing.
  // A worker that joins later (registry) is given the cheapest of these.
  std::vector<double> worker_costs;
  // Failover: the pairs of a worker that fails mid-call (error, timeout, disconnect, a COMBINE
  // that fails its checks) are re-planned onto the other holders — replicas, else the
  // backbone's own copies — and computed within the same call, so the layer's result (exact
  // mode: its bits) is what it would have been; the call fails only when some of those experts
  // have no other holder, naming them. The worker is then left out and re-dialled in the
  // background after rejoin_backoff (doubling up to rejoin_backoff_max); it rejoins when its
  // handshake succeeds and it announces the same experts. false: a failure fails the call.
  bool failover = true;
  // Lying-worker detection: this fraction of worker requests is recomputed on the backbone (when
  // it holds every expert of the request) and compared — exact mode with exact rows: bit for bit;
  // otherwise within the wire's tolerance (verify_tolerance x the row's largest magnitude). A
  // mismatch evicts the worker for good (no rejoin), its pairs of that call go to the other
  // holders, and it is logged and counted. 0: off. Seeded: the same run verifies the same calls.
  double verify_rate = 0;
  uint64_t verify_seed = 1;
  double verify_tolerance = 0;  // <= 0: by the wire dtypes (0 for exact rows, 0.1 for lossy hidden rows)
  // Swarm key: every worker must prove it holds it, and this backbone proves it too (net/auth.h).
  std::shared_ptr<const net::SwarmKey> swarm_key;
  std::chrono::milliseconds rejoin_backoff{1000};
  std::chrono::milliseconds rejoin_backoff_max{30000};
  // Workers that dial in (registry.h, --accept-workers): "join://NAME" addresses are taken from
  // it, and between calls the executor adopts workers that joined since (a new name is added to
  // the placement; a known name's fresh connection replaces its old one, and brings it back if
  // it was down). Null: none.
  std::shared_ptr<WorkerRegistry> registry;
  // TLS to every worker (dialled, joined or relayed), accepting only these certificate
  // fingerprints (`--tls-pin`, net/tls.h). Null: plain TCP.
  std::shared_ptr<const net::TlsPins> tls_pins;
  // Replicas of hot experts on workers (`--replicate-hot N`): at each hot-expert plan (the same
  // schedule as local_experts_bytes: after hot_plan_after_tokens, then every
  // hot_replan_every_tokens) the N most activated experts that fewer than two live workers hold
  // are sent (STORE) to the nearest worker that offers replicas and lacks them — the backbone's
  // own copy, or one FETCHed from a holder and checked against the model's slab hashes. The worker
  // checks them again, maps them from its disk and becomes a holder: a second place to send those
  // pairs when the first fails or straggles. 0: off.
  int replicate_hot = 0;
  // Live re-placement of experts (`--rebalance N`): on the same schedule, the nearest live worker
  // that keeps replicas (then the next) takes the experts whose move to it saves the most expected
  // trip latency per byte within its replica room — whole layers where they fit, so a layer can stop
  // needing a far worker at all (trip_planner.h, the target's own trip cost). They are copied as
  // replicate_hot copies (STORE, checked by hash on both ends) before any pair is routed there;
  // pairs go to the nearest live holder. So a worker that joins nearer, or one that slows down,
  // changes where experts are served while the backbone runs. At most N experts per plan; 0: off.
  int rebalance = 0;
  // Path policy while connected: a worker reached over a later path of "A|B" (e.g. relayed,
  // because A did not answer) has the earlier paths tried again this often, and is moved to the
  // first that works between calls (exact bits either way). 0: only at connect and re-dial.
  std::chrono::milliseconds path_recheck{30000};

  // The link options these imply (dtypes and mode the workers must speak).
  LinkOptions link_options() const;
};

// The HELLO a backbone sends for `model` (identity hash, shape, the dtypes and modes it speaks).
Result<wire::Hello> backbone_hello(const Model& model, const RemoteOptions& opts);

// ---- the executor --------------------------------------------------------------------------------

// Wire traffic as counted from the frames actually sent and received (header included).
struct RemoteTraffic {
  uint64_t dispatch_frames = 0, dispatch_bytes = 0;
  uint64_t combine_frames = 0, combine_bytes = 0;
  uint64_t layer_calls = 0;          // submit() calls that involved at least one worker
  uint64_t token_layers = 0;         // Σ over those calls of n_tokens
  uint64_t remote_pairs = 0;         // (token, expert) pairs sent to workers
  uint64_t local_pairs = 0;          // pairs computed by the backbone
  uint64_t prefix_sum_requests = 0;  // EXACT requests answered as rank-prefix sums (exact_prefix_sums)
  // Most DISPATCHes of one layer call outstanding at the same time (sent, no COMBINE taken yet):
  // with star fan-out every involved worker's request is in flight together.
  uint64_t max_in_flight = 0;
  // Layer calls submitted while another call of this executor was still pending (two
  // micro-batches: one half's trip out while the other half's is).
  uint64_t overlapped_calls = 0;
  // Hiding the trip (layer calls with at least one DISPATCH): trip = first DISPATCH sent -> last
  // COMBINE in; local = the backbone's own work meanwhile (the model's shared experts and dense
  // work between submit() and wait(), then the backbone's share of the routed experts); hidden =
  // the part of the trip that local work covered, min(local, trip) per call.
  double trip_seconds = 0, local_seconds = 0, hidden_seconds = 0;
};

// What the hot-expert choice did (RemoteOptions::local_experts_bytes).
struct HotExpertReport {
  uint64_t plans = 0;        // times the set was chosen
  int64_t experts = 0;       // experts the backbone computes by choice (beyond those only it has)
  int layers_all_local = 0;  // MoE layers whose routed experts are all computed here: no trip
  uint64_t bytes = 0;        // their weights
  uint64_t budget_bytes = 0;
  uint64_t fetched = 0, fetched_bytes = 0;  // copies received from workers (all plans)
  uint64_t fetch_failures = 0;              // refused, failed or not the model's weights
  std::string last_fetch_error;
  // Expected trip latency per token from the activations counted (trip_planner.h), with no hot
  // experts and with the chosen ones.
  double predicted_s_none = 0, predicted_s_chosen = 0;
  // Replicas on workers (RemoteOptions::replicate_hot), over all plans.
  uint64_t replica_plans = 0;
  uint64_t replicas_sent = 0, replica_bytes_sent = 0;  // STOREs answered with STORED
  uint64_t replica_failures = 0;                       // FETCH, check or STORE failed, or the worker was full
  std::string last_replica_error;
  // Moves nearer (RemoteOptions::rebalance), over all plans; the predicted trip latency per token
  // (trip_planner.h) before and after the latest plan that moved experts (before any moved: the
  // first plan's prediction, both equal).
  uint64_t rebalance_plans = 0;
  uint64_t rebalanced = 0, rebalanced_bytes = 0;
  uint64_t rebalance_failures = 0;
  std::string last_rebalance_error;
  double rebalance_predicted_s_before = 0, rebalance_predicted_s_after = 0;
};

// Experts given to workers by request (RemoteExecutor::request_experts: the gateway's re-plan).
struct ExpertRequestReport {
  uint64_t requests = 0;              // asked for
  uint64_t done = 0;                  // carried out: every expert asked for is on its worker now
  uint64_t failed = 0;                // not carried out (worker gone, keeps no replicas, full, a copy failed)
  uint64_t pending = 0;               // waiting for the next forward pass (or for their worker to answer)
  uint64_t sent = 0, sent_bytes = 0;  // copies STOREd on workers for them
  // drop_experts: replicas workers let go of (UNSTORE), and experts kept because no other live
  // worker (nor the backbone) holds them, or because they are the worker's own file's.
  uint64_t dropped = 0, kept = 0;
  std::string last_error;
};

// Per-worker counters for monitoring (`moesh serve` /metrics). Unlike RemoteTraffic they may be
// read from any thread while the executor runs.
struct WorkerTraffic {
  // Upper bounds (seconds) of the DISPATCH -> COMBINE latency histogram buckets.
  static constexpr std::array<double, 12> kLatencyBounds = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
                                                            0.05,   0.1,   0.25,   0.5,   1.0,  5.0};
  std::string label;      // "host:port (name)"
  uint64_t requests = 0;  // DISPATCH frames sent
  uint64_t errors = 0;    // requests that failed (send error, timeout, bad COMBINE)
  uint64_t bytes_sent = 0, bytes_received = 0;
  // latency_counts[i]: requests with latency <= kLatencyBounds[i] and above the previous bound;
  // the last entry counts those above every bound (not cumulative).
  std::array<uint64_t, kLatencyBounds.size() + 1> latency_counts{};
  double latency_sum_seconds = 0;
  // Σ of the compute time each worker reports in its COMBINEs: latency - compute is what the
  // network, framing and wake-ups cost.
  double compute_sum_seconds = 0;
  bool down = false;        // failed and left out (failover), being re-dialled
  bool evicted = false;     // returned results that failed verification: never used again
  uint64_t verified = 0;    // requests recomputed by the backbone and compared (verify_rate)
  uint64_t mismatches = 0;  // of which differed
  uint64_t failovers = 0;   // times its pairs of a call went to other holders
  uint64_t rejoins = 0;     // times it came back after being down
  uint64_t probes = 0;      // small PINGs answered while it had never had a trip (check_stragglers)
  // For the work ledger (swarm::LedgerEntry): the worker's HELLO name, requests answered with a
  // valid COMBINE and the pairs and token rows in them, expert copies fetched (SLAB bytes), and
  // the time it was up (planned with) so far.
  std::string name;
  uint64_t completed = 0, pairs = 0, tokens = 0;
  uint64_t fetches = 0, fetch_bytes = 0;
  double up_seconds = 0;
  std::chrono::steady_clock::time_point up_since{};  // when it last came up (meaningless while down)
};

// One worker as `moesh swarm status` and the dashboard show it (RemoteExecutor::worker_status).
struct WorkerStatus {
  size_t index = 0;
  std::string label, name;
  WorkerPath path = WorkerPath::kDirect;  // how it is reached
  std::string address;                    // "host:port", "join://NAME", "relay://..."
  std::string state;                      // "up", "down" (being re-dialled / waiting to rejoin), "evicted"
  std::string experts;                    // canonical spec it announced
  uint64_t n_experts = 0;
  double warmup_rtt_ms = 0;    // at connect
  double min_latency_ms = 0;   // fastest DISPATCH -> COMBINE seen (0: none yet)
  double recent_trip_ms = 0;   // median of its last 16 trips (0: fewer than 8 yet): what it costs now
  double mean_latency_ms = 0;  // mean of all requests
  double last_heard_s = -1;    // seconds since its connection last delivered a frame (-1: never)
  uint64_t requests = 0, errors = 0, rejoins = 0, failovers = 0;
  // The compute time its COMBINEs reported, and the (token, expert) pairs they answered: its
  // measured compute speed, which re-plans price it at (plan/live.h: measured_speeds).
  double compute_seconds = 0;
  uint64_t compute_pairs = 0;
  // With alternative paths ("A|B"): what each measured at the last connect, and which is used.
  struct Path {
    std::string address;
    bool ok = false;
    double rtt_ms = 0;
    std::string error;
    bool used = false;
  };
  std::vector<Path> paths;
  // Capacity (the worker's INFO_REPLY at connect; replica use updated by each STORED).
  uint32_t threads = 0, cores = 0;
  uint64_t slab_bytes = 0, replica_bytes = 0, replica_budget_bytes = 0, rss_bytes = 0;
  // Its round trips to other workers (WorkerLink::peer_rtt_ms): per worker label, ms.
  std::vector<std::pair<std::string, double>> peer_rtt_ms;
  // Its machine's memory at connect and what it offers (`moesh worker --offer-mb`); 0: unknown.
  uint64_t mem_total_bytes = 0, mem_available_bytes = 0, offer_bytes = 0;
  // It may be given whole blocks (kFeatureSpanLoad: a worker on the full model, or a span peer):
  // a re-plan can make it a span peer.
  bool loads_blocks = false;
};

class RemoteExecutor final : public ExpertExecutor {
 public:
  // Connects to every worker (in order; worker i is index i in the placement) and builds the
  // placement over `model`'s layers. `model` must outlive the executor. The backbone's own
  // expert weights (model.expert_weights()) serve experts no worker holds (or, with
  // PlannerPolicy::prefer_local, every expert it has).
  static Result<std::unique_ptr<RemoteExecutor>> connect(const Model& model, const std::vector<WorkerAddress>& workers,
                                                         const RemoteOptions& opts);
  ~RemoteExecutor() override;

  // The pool for the backbone's share of expert work (normally the Context's). Null: serial.
  void set_pool(ThreadPool* pool) override;

  Ticket submit(int layer, const float* x, int64_t n_tokens, const RoutingPlan& plan) override;
  Result<std::span<const float>> wait(Ticket t) override;
  bool overlaps_submits() const override { return true; }
  // Between calls when idle: re-dials that are due, workers that joined (RemoteOptions::registry).
  void maintain() override;

  const Placement& placement() const;
  // Replaces the placement (same model shape; worker indices < n_workers()); later calls plan
  // with it. Exclusions are kept.
  Status set_placement(Placement placement);
  // An excluded worker gets no pairs (its experts go to replicas or the backbone's copies) until
  // included again; a layer that then has no holder for a routed expert fails, naming it.
  void set_excluded(size_t worker, bool excluded);
  // Trip cost per worker in seconds, by which replicas are judged near or far (planner.h). Set
  // from the warm-up RTTs at connect and from measured trip latencies at each hot-expert plan.
  void set_worker_costs(std::vector<double> costs);
  const Planner& planner() const;
  size_t n_workers() const;
  const WorkerLink& worker(size_t i) const;
  const RemoteOptions& options() const;
  // The hidden dtype a DISPATCH of `layer` to worker `w` uses (RemoteOptions::hidden_wire).
  wire::WireDType hidden_dtype(size_t w, int layer) const;
  // True when the hidden rows every worker gets are exactly what its dot products would compute
  // from the f32 rows locally: F32, or an INT8 dtype equal to each worker-owned MoE layer's
  // activation format. With an F32 return and EXACT combine the logits are then bit-identical.
  bool hidden_is_exact() const;
  // Multi-line summary: each worker's label, warm-up RTT and experts; the local share.
  std::string describe() const;

  RemoteTraffic traffic() const;
  void reset_traffic();
  // One entry per worker, in connection order; thread-safe.
  std::vector<WorkerTraffic> worker_traffic() const;
  // The backbone's side of the work ledger, one entry per worker (thread-safe).
  std::vector<swarm::LedgerEntry> ledger() const;
  // The registry view of every worker (thread-safe).
  std::vector<WorkerStatus> worker_status() const;
  // The workers whose requests failed in the last wait() (ascending), whether or not failover
  // then saved the call.
  const std::vector<size_t>& last_failed_workers() const;
  // Failover so far: worker failures, calls saved by re-planning, pairs recomputed elsewhere,
  // workers that rejoined; and whether each worker is down now (left out, being re-dialled).
  struct FailoverStats {
    uint64_t failures = 0, saved_calls = 0, replanned_pairs = 0, rejoins = 0;
    // NOT_HELD naming an expert a worker was sent (another backbone had it let go of a replica):
    // that expert left its holders, the worker stayed up for its others.
    uint64_t lacking = 0;
    uint64_t path_switches = 0;  // links moved to a preferred path while up (RemoteOptions::path_recheck)
    uint64_t verified = 0, unverifiable = 0, mismatches = 0, evictions = 0;  // verify_rate
  };
  FailoverStats failover_stats() const;
  bool worker_down(size_t w) const;
  // Starts the re-dials (and preferred-path tries, RemoteOptions::path_recheck) that are due and
  // takes in those that finished (normally done at the start of a call). `wait` (tests): re-dials
  // every down worker and tries every preferred path now, and waits for the outcome.
  // Never with a call pending.
  void poll_rejoins(bool wait = false);
  // Dialled workers that did not answer at connect and are re-dialled in the background (with
  // failover on, the backbone starts without them when another worker answered and every expert
  // still has a holder); each leaves this list when it answers and joins.
  struct LateWorker {
    std::string address;
    std::string last_error;
    uint64_t attempts = 0;
  };
  std::vector<LateWorker> late_workers() const;
  // Asks the executor to dial `address` and take the worker in (a new expert peer or replica: the
  // gateway's POST /swarm/workers/add). Any thread: the dial runs between calls like a late
  // worker's — listed in late_workers() until it answers, retried with the rejoin backoff — and
  // the worker joins with the experts it announces. An address already dialled or pending is
  // kInvalidArgument.
  Status dial_worker(const WorkerAddress& address);
  // Asks for the experts `ranges` to be held by the worker `worker` (its name, label or dialled
  // address): each one it lacks is copied to it as a replica (STORE: the backbone's own copy or
  // one FETCHed from a holder, checked against the model's slab hashes here and there), and it
  // becomes a holder; pairs go to the nearest live holder, as always (exact either way). What a
  // re-plan that gives a peer experts needs. Any thread: carried out between calls, like a hot
  // plan; a worker being dialled (dial_worker) is waited for, for kExpertRequestWaitCalls calls.
  // The worker must keep replicas (`--replica-dir`, feature STORE). Outcome: expert_requests().
  void request_experts(const std::string& worker, std::vector<wire::ExpertRange> ranges);
  static constexpr int kExpertRequestWaitCalls = 256;
  // The other way: `worker` lets go of its replicas of these experts (UNSTORE: unmapped, its file
  // deleted, its replica budget free for others), so a re-plan that moves experts elsewhere does not
  // leave them taking memory. Between calls, like request_experts: each expert first leaves the
  // placement (no pair goes to it after), then the worker is told. Never the last holder: an expert
  // no other live worker holds and the backbone has no copy of is kept (counted in `kept`), as is
  // one that is the worker's own file's (it refuses: only replicas go). Outcome: expert_requests().
  void drop_experts(const std::string& worker, std::vector<wire::ExpertRange> ranges);
  ExpertRequestReport expert_requests() const;

  // The counts below as a copy any thread may take while the executor runs (the dashboard),
  // with the MoE-layer calls that involved a worker and the Σ of their tokens.
  struct Activations {
    std::vector<uint64_t> pairs;   // [layer * n_expert + expert]
    std::vector<uint64_t> tokens;  // per layer
    int64_t n_expert = 0;
    uint64_t layer_calls = 0, token_layers = 0;
  };
  Activations activation_snapshot() const;
  // Expert activations counted so far: [layer * n_expert + expert] routed (token, expert) pairs,
  // and per layer the tokens routed.
  const std::vector<uint64_t>& activation_counts() const;
  const std::vector<uint64_t>& routed_tokens() const;
  // Chooses the hot experts now from the counts (normally automatic, see RemoteOptions); must
  // not be called with a submit() pending. Fetch failures are reported in the HotExpertReport,
  // not as an error: those experts simply stay remote.
  Status plan_local_experts_now();
  HotExpertReport hot_experts() const;

  struct Impl;

 private:
  explicit RemoteExecutor(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace moesh
