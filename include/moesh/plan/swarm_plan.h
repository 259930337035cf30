// The swarm planner: which role each peer takes — a span peer hosting a run of whole layers, an
// expert peer holding routed experts of the layers the backbone runs, or nothing — so that the
// expected time of one decode step is smallest.
//
// The cost model (docs/swarm.md#plan), per step of T tokens (streams x (1 + drafts)), with
// R(T) = 1 + row_share x (T - 1) the rows' compute (PlanModel::rows_cost; T when row_share is 1):
//   span peer s over layers f..l:  RTT_s + 2 x message + wire(T rows each way)
//                                  + sum_{f..l} (dense_l + k x expert_l) x R(T) / speed_s
//   backbone MoE layer l:          dense_l x R(T) / speed_b + E[max over the holders it needs of
//                                  (RTT_w + 2 x message + wire + its pairs x expert_l / speed_w)]
//                                  (the backbone's own copies are a holder with RTT 0; a holder is
//                                  needed with probability 1 - prod_e (1 - p_le)^T)
//   backbone dense layer l:        dense_l x R(T) / speed_b
// and the step costs the sum. Spans are sent in turn from the backbone (a star) unless two
// adjacent spans can chain (docs/span.md "Chained spans": the first peer passes its rows straight
// to the next): when the RTT between their peers is known (PlanOptions::peer_rtt_s), the pair
// costs ½RTT(q, p) instead of ½RTT_q + ½RTT_p (the return to the backbone and the next send),
// where that is less — so a run of chained spans costs ½RTT_first + Σ ½RTT(hop) + ½RTT_last plus
// their compute.
// The search: each peer is idle, one span (a contiguous run of layers that fits its memory; dense
// blocks only are allowed, their peer serving no experts) or an expert holder; the backbone runs the layers no span
// covers, and their routed experts fill the backbone's --local-experts budget first and then the expert peers, nearest
// first, a whole layer at a time where it fits. Every split of peers into span and expert roles is tried (up to
// PlanOptions::exhaustive_peers peers; above that, for k = 0..16, the k peers with the most memory are span candidates
// in that order, each used or left idle, the rest expert peers) and, for each, a dynamic programme over the layers
// places the spans exactly. With the layers of each kind alike in size (true of every architecture here) that is the
// optimum of the model above — tests compare it with brute force.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "moesh/util/status.h"

namespace moesh {

namespace gguf {
class File;
}

// Costs when nothing is measured, from bench/wan/headline.sh on this machine type (2-core EPYC,
// 1 thread, Q8_0): a decode reads 0.17-0.30 ns per weight byte (--calibrate), and one message
// through this code and the emulated network costs 78-106 us (docs/PERFORMANCE.md, C16).
inline constexpr double kDefaultSecondsPerByte = 0.25e-9;
inline constexpr double kDefaultMessageSeconds = 100e-6;

// The compute costs a running gateway prices its plan card and re-plan with (`moesh serve
// --seconds-per-byte S --row-share R`, e.g. the figures `moesh swarm plan --calibrate` measured on
// a peer's machine): the defaults unless given.
struct PlanCosts {
  double seconds_per_byte = kDefaultSecondsPerByte;
  double row_share = 1.0;  // PlanModel::row_share
  bool operator==(const PlanCosts&) const = default;
};

struct PlanLayer {
  bool moe = true;
  uint64_t dense_bytes = 0;   // attention, norms, router, shared experts (a dense layer: its FFN)
  uint64_t expert_bytes = 0;  // one routed expert (0 for a dense layer)
  uint64_t state_bytes = 0;   // KV cells or recurrent state of the contexts served
  double dense_s = 0;         // per token at speed 1
  double expert_s = 0;        // per (token, expert) pair at speed 1
};

struct PlanModel {
  std::string name;
  int n_expert = 0, n_expert_used = 0;
  std::vector<PlanLayer> layers;
  uint64_t global_bytes = 0;  // embeddings and head: always on the backbone
  uint64_t hidden_bytes = 0;  // one token's hidden state on the wire
  double global_s = 0;        // per token: embedding lookup and head, on the backbone
  // Span boundaries b = 0..n_layer (b: before layer b). row_bytes[b]: one token's row crossing it,
  // wider than hidden_bytes where the model carries more across (kimi-k3's residual checkpoints,
  // glm-dsa's reused indexer selection). Empty: hidden_bytes everywhere.
  std::vector<uint64_t> row_bytes;
  // [layer][expert] share of tokens routed there; empty: every expert k/n.
  std::vector<std::vector<double>> p;
  // Of one row's compute, the share each more row of the same step adds: 1 prices a step's compute
  // linear in its rows; below 1, a batch reads a layer's weights once for all of its rows (decode
  // is memory-bound). `swarm plan --calibrate` measures it (a batch step against a one-row step);
  // `--row-share` gives it. It prices span peers' and the backbone's compute (dense parts, a span's
  // whole blocks, embeddings and head); an expert holder's pairs stay linear (mostly distinct
  // experts: distinct weights).
  double row_share = 1.0;
  // Compute of n rows of one step, in units of one row's: n up to one row, then 1 + row_share (n - 1).
  double rows_cost(double n) const { return n <= 1 ? n : 1 + row_share * (n - 1); }

  double p_at(int layer, int expert) const {
    if (p.empty()) return n_expert > 0 ? static_cast<double>(n_expert_used) / n_expert : 0.0;
    return p[static_cast<size_t>(layer)][static_cast<size_t>(expert)];
  }
  int n_layer() const { return static_cast<int>(layers.size()); }
  uint64_t row_bytes_at(int b) const {
    return static_cast<size_t>(b) < row_bytes.size() ? row_bytes[static_cast<size_t>(b)] : hidden_bytes;
  }
};

// The shape and byte sizes of a GGUF model (tensor names blk.N.*, stacked *_exps experts); costs
// are set from `seconds_per_byte` (decode is memory-bound: a token reads every dense byte and k
// experts per layer), state from n_ctx and the attention keys, span boundaries (row widths, where
// a span may split) from the architecture's hyper-parameters where moesh knows the architecture.
// A model without routed experts is kInvalidArgument.
Result<PlanModel> plan_model_from_gguf(const gguf::File& f, int n_ctx, double seconds_per_byte);
// Bytes one decode token reads (globals' head, dense parts, k experts per MoE layer): what
// seconds_per_byte is measured against.
uint64_t plan_bytes_per_token(const PlanModel& m);

struct PlanPeer {
  std::string name;
  uint64_t memory_bytes = 0;  // what it may hold of the model (weights and state)
  double rtt_s = 0;           // round trip to the backbone
  double speed = 1;           // compute relative to the model's costs (2 = twice as fast)
  double rate_bps = 0;        // link rate, bits per second; 0 = unlimited
};

struct PlanOptions {
  uint64_t backbone_memory_bytes = UINT64_MAX;  // globals, dense parts and state of its layers
  uint64_t local_experts_bytes = 0;             // routed experts it may keep (--local-experts-mb)
  double backbone_speed = 1;
  int tokens_per_step = 1;       // rows per step: streams x (1 + draft tokens)
  int streams = 0;               // sequences per step (0: tokens_per_step): what span lanes can split
  double accepted_per_step = 0;  // tokens a step yields (0: tokens_per_step)
  double message_s = 0;          // fixed cost of one message (framing, syscalls, wake-up)
  bool spans = true;             // span roles allowed
  bool experts = true;           // expert roles allowed
  int exhaustive_peers = 6;      // every span/expert split up to this many peers
  // Round trips between peers, seconds: [i][j] for peers i, j in the order given (symmetric;
  // < 0: unknown). Empty: none known. Where known, adjacent spans are priced as a chain.
  std::vector<std::vector<double>> peer_rtt_s;
  bool chain_spans = true;  // false: price every span as a star trip from the backbone
  // add_standbys: at most this many standbys (replicas) per span (expert) peer, from idle peers.
  // A second one keeps the span off the backbone through two failures; idle peers do nothing else.
  int standbys_per_primary = 1;
};

// What chaining span peer p right after span peer q saves per step: ½RTT_q + ½RTT_p - ½RTT(q, p),
// one message, and one of the two links' wire time (q -> p replaces q -> backbone -> p); 0 when
// their RTT is unknown, chaining is off, or the chain would not be faster. `boundary`: the layer
// p's span begins at (the rows crossing there are what q passes on).
double chain_saving(const PlanModel& m, const std::vector<PlanPeer>& peers, const PlanOptions& o, int q, int p,
                    int boundary);

enum class RoleKind { kIdle, kSpan, kExperts };
const char* role_name(RoleKind k);

struct ExpertSlice {
  int layer = 0, first = 0, last = 0;  // experts first..last of one layer
  bool operator==(const ExpertSlice&) const = default;
};

struct PeerRole {
  RoleKind kind = RoleKind::kIdle;
  int first = -1, last = -1;         // kSpan: its layers
  std::vector<ExpertSlice> experts;  // kExperts: what it holds
  // kExperts: copies of experts another expert peer holds (add_load_replicas): near holders of an
  // expert share its pairs (the backbone spreads a token's pairs over them), so a hot expert's
  // compute is split. A peer with copies only has an empty `experts`.
  std::vector<ExpertSlice> copies;
  uint64_t bytes = 0;      // memory it uses
  double trip_s = 0;       // predicted cost of one trip to it (one token)
  int chained_after = -1;  // kSpan: the peer whose span it follows in a chain (-1: none)
  // kSpan: a lane of that peer's span (add_span_lanes; `--span-lane`): the same layers, run at the
  // same time for a share of the streams. -1: the span's own peer (layer_host names it).
  int lane_of = -1;
};

// A standby for a peer of the plan, from the peers it leaves idle; it serves only when its
// primary fails:
//  - for a span peer, it holds the same layers and the backbone names it after the primary
//    (`--span F-L@PRIMARY --span F-L@STANDBY`), so the span fails over to it (its inputs replayed:
//    docs/span.md) instead of onto the backbone;
//  - for an expert peer, it is a replica: a worker holding the same experts (`moesh worker
//    --experts SPEC`, one more `--worker`), so the primary's pairs fail over to it instead of onto
//    the backbone's own copies — which a backbone started from its slice does not have. While
//    the primary is up the replica, being farther, gets no pairs (remote/planner.h).
struct Standby {
  int peer = -1;                     // the idle peer that holds it
  int primary = -1;                  // the peer it stands in for
  int first = -1, last = -1;         // a span's layers (-1: an expert peer's replica)
  std::vector<ExpertSlice> experts;  // a replica's experts (the primary's); empty for a span
  double failover_step_s = 0;        // predicted step with the primary gone and the standby serving
  // ... with the backbone doing the primary's work instead; < 0: that does not fit the backbone's
  // memory (the swarm would stop at the primary's failure).
  double fallback_step_s = -1;
  bool replica() const { return first < 0; }
};

struct SwarmPlan {
  std::vector<PeerRole> roles;                // per peer, in the order given
  std::vector<ExpertSlice> backbone_experts;  // routed experts the backbone keeps
  std::vector<int> layer_host;                // per layer: -1 the backbone, else the span peer
  uint64_t backbone_bytes = 0;
  double step_s = 0;              // predicted time of one step
  double tokens_per_s = 0;        // accepted_per_step / step_s
  double trips_per_step = 0;      // expected network waits: one per span, one per layer needing a peer
  std::vector<double> layer_s;    // per layer (a span's whole cost on its first layer)
  std::vector<Standby> standbys;  // add_standbys
};

// Standbys for the plan's span and expert peers from the peers it leaves idle (the step time does
// not change: they serve only when a primary fails). Per primary, its failure is priced both ways
// — the standby serving (evaluate_plan with the roles swapped) and the backbone doing the work
// itself (which needs the span's weights, or the expert peer's experts, in the backbone's memory).
// Primaries whose failure would stop the swarm go first, then the largest gain; each gets the idle
// peer that fits and fails over fastest, and only where that beats the backbone's own fallback.
// In rounds: every primary its first standby, then (PlanOptions::standbys_per_primary > 1, idle
// peers left) its second, and so on; one primary per idle peer. A primary's standbys are listed
// in the order the backbone tries them (the first round's first).
Status add_standbys(const PlanModel& m, const std::vector<PlanPeer>& peers, const PlanOptions& o, SwarmPlan* plan);

// Load-sharing replicas (not for failover: for the step time), from any expert or idle peer with
// memory left: with activation counts (m.p), the hottest experts of the backbone's MoE layers are
// copied, one at a time, to the peer whose copy lowers the predicted step most (by at least 0.5 %):
// the near holders of an expert share its pairs (remote/planner.h: holders within 1.25x the
// cheapest's cost + 2 ms), so a skewed layer's hot expert stops making its holder the slowest of
// the step when many tokens route to it. Priced by evaluate_plan (a copied expert's pairs are split
// evenly over its near holders). Uniform activations (m.p empty): nothing to gain over the fill,
// nothing added. At most max_copies copies.
Status add_load_replicas(const PlanModel& m, const std::vector<PlanPeer>& peers, const PlanOptions& o, SwarmPlan* plan,
                         int max_copies = 64);
// Span lanes (throughput for many streams), from the peers the plan leaves idle: a span whose
// peer's compute of T rows is a large part of the step gets another peer running the same layers
// at the same time; the runtime gives each sequence to the holder with the fewest, so each of a
// span's n holders computes its streams' rows (the busiest ceil(S / n) of the S streams) and the
// span costs the slowest holder's trip (a span with lanes is not chained). One at a time, the lane
// that lowers the predicted step most (by at least 0.5 %), while idle peers that fit a span's
// layers are left (the nearest four per span are priced). Nothing for one stream per step.
Status add_span_lanes(const PlanModel& m, const std::vector<PlanPeer>& peers, const PlanOptions& o, SwarmPlan* plan,
                      int max_lanes = 16);
// What a peer's role holds: its experts and its copies, merged into ranges per layer.
std::vector<ExpertSlice> held_experts(const PeerRole& r);

// The best plan, or kOutOfRange when no assignment holds every layer (memory), naming
// how much is missing; kInvalidArgument for an inconsistent model or options.
Result<SwarmPlan> plan_swarm(const PlanModel& m, const std::vector<PlanPeer>& peers, const PlanOptions& o);

// Fills step_s, tokens_per_s, trips_per_step, layer_s, bytes and trip_s of a plan whose roles,
// layer_host and expert slices are set (the cost model above); kInvalidArgument if it is not a
// valid plan (an expert nobody holds, a span beyond a peer's memory, a role it cannot have).
Status evaluate_plan(const PlanModel& m, const std::vector<PlanPeer>& peers, const PlanOptions& o, SwarmPlan* plan);

// The plan with these roles (kinds[i] per peer; ranges[i] = its layers when it is a span), the
// backbone's layers' experts filled as plan_swarm fills them (its budget, then the expert peers
// nearest first). kOutOfRange when that does not hold everything. Tests compare plan_swarm
// with the best of these over every role assignment (brute force).
Result<SwarmPlan> plan_with_roles(const PlanModel& m, const std::vector<PlanPeer>& peers, const PlanOptions& o,
                                  const std::vector<RoleKind>& kinds, const std::vector<std::pair<int, int>>& ranges);

// The fixed plans the headline compares against: every expert peer holding an equal share of
// every layer's experts ("experts"), or the layers cut into as many equal spans as peers
// ("spans", Petals-style; when that does not fit, equal spans over the fewest of the first peers
// that fit, the rest idle). kOutOfRange when they do not fit.
Result<SwarmPlan> plan_all_experts(const PlanModel& m, const std::vector<PlanPeer>& peers, const PlanOptions& o);
Result<SwarmPlan> plan_all_spans(const PlanModel& m, const std::vector<PlanPeer>& peers, const PlanOptions& o);

// "3-5:*,6:0-63" for `moesh worker --experts` (whole layers merged).
std::string format_expert_spec(const std::vector<ExpertSlice>& s, int n_expert);

// The human table `moesh swarm plan` prints.
std::string render_plan(const PlanModel& m, const std::vector<PlanPeer>& peers, const SwarmPlan& plan);

}  // namespace moesh
