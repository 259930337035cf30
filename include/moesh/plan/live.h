// Planning for a running swarm: the peers and expert activation counts a gateway reports
// (GET /swarm/status, GET /swarm/dashboard.json) as the planner's inputs. One reading of them,
// shared by `moesh swarm plan --status URL` and the gateway's own re-plan on its dashboard, so
// both price the same swarm the same way.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "moesh/plan/swarm_plan.h"
#include "moesh/util/status.h"

namespace moesh {

// A peer for the planner, with what a live one also reports.
struct LivePeer {
  PlanPeer peer;
  std::string addr;   // a worker the gateway dialled: HOST:PORT (empty: it joined, or a --peer)
  std::string label;  // its label at the gateway (what other workers' RTTs name it by)
  std::vector<std::pair<std::string, double>> measured_rtt_ms;  // its RTT to other labels (PROBE)
  double slowed_s = 0;        // added to its RTT: how much slower its recent trips are than its fastest
  int first = -1, last = -1;  // a span peer: the blocks it runs now (first < 0: an expert worker, or idle)
  bool span_peer = false;     // a `moesh span` peer (running a span now or idle) or a worker on the full model:
                              // it can be given blocks
  bool lane = false;          // first..last are a span it runs as a lane (beside the span's own peer)
  // Its compute as measured (the status's compute_* figures; 0: none): the seconds its COMBINEs
  // reported over the (token, expert) pairs they answered, and its SPAN_RESULTs' over the span
  // steps and the rows they ran (of the span first..last).
  double pair_seconds = 0;
  uint64_t pairs = 0;
  double step_seconds = 0;
  uint64_t steps = 0, rows = 0;
};

// What a live worker may hold, from its INFO_REPLY figures: what it offers (`moesh worker
// --offer-mb`) when it says; else what it holds plus half of its machine's free memory (the rule
// `--no-mmap` uses for itself), never less than what it holds plus its replica budget; from a
// worker that does not report its memory, that lower bound.
uint64_t live_peer_memory(uint64_t slab, uint64_t replica_budget, uint64_t available, uint64_t offer);

// The peers of a /swarm/status document: every worker that is up, named as the gateway names it,
// with its address when dialled directly, the warm-up round trip as RTT (the padded PING at
// connect: network only, no compute) plus, for one that slowed down, how much its recent trips
// (median of the last 16) exceed its fastest, and live_peer_memory as memory. kCorrupt without a
// workers array.
// Span peers ("spans", state "up": not run by the backbone itself; "idle": known, running none of
// its spans) follow, with their blocks and the same memory rule (slab: the routed experts of their
// blocks), their warm-up round trip as RTT. A worker that may be given blocks ("loads_blocks": on
// the full model) is a span_peer too, and a span entry at a worker's address is that worker (its
// blocks set on it), not a second peer.
Result<std::vector<LivePeer>> peers_from_status(const nlohmann::json& status);

// Measured compute speeds: each measured peer's PlanPeer::speed becomes what the model's costs
// predict for the compute it reported (its pairs, or its span steps of their rows) over what it
// took, so a slow machine (a phone) is priced slow and a fast one fast. Only from enough samples
// (kMinMeasuredPairs pairs, kMinMeasuredSteps span steps; the span figure when it has both); the
// others keep speed 1.
//  - `absolute`: the model's seconds_per_byte was measured or given for these machines, so the
//    ratio is the speed (clamped to [kMinSpeed, kMaxSpeed]).
//  - otherwise the costs are a default guess, and only the peers' speeds relative to each other
//    are known: each is its ratio over the median measured peer's, and one within kSameSpeed of
//    that median (host jitter) stays 1. A swarm of like machines is priced as before.
// Returns how many peers were priced from measurement.
constexpr uint64_t kMinMeasuredPairs = 32;
constexpr uint64_t kMinMeasuredSteps = 8;
constexpr double kMinSpeed = 1.0 / 64, kMaxSpeed = 64, kSameSpeed = 1.25;
int apply_measured_speeds(const PlanModel& m, std::vector<LivePeer>* peers, bool absolute);

// The peer-to-peer round trips live workers measured, seconds ([i][j]; -1: unknown): a pair
// measured both ways takes the smaller figure; empty when nothing is measured.
std::vector<std::vector<double>> measured_peer_rtts(const std::vector<LivePeer>& peers);

struct ActivationInfo {
  std::string source;   // empty: uniform
  int layers = 0;       // layers with counts
  uint64_t tokens = 0;  // tokens counted, over those layers
};

// A layer's shares are smoothed toward uniform by this many pseudo-tokens, so a layer that few
// tokens have passed does not look skewed by chance.
inline constexpr double kActivationPriorTokens = 16;

// Sets m->p from a gateway's activation counts: the heatmap of /swarm/dashboard.json ({"n_expert",
// "layers": [{"layer", "tokens", "share": [...]}]}), or the whole document holding it. Layers it
// does not count (span layers, dense layers, none routed yet) keep k/n per expert; with no layer
// counted m is left as it is. kInvalidArgument naming the field for a heatmap of another model
// or a malformed one.
Status apply_activations(const nlohmann::json& doc, const std::string& source, PlanModel* m, ActivationInfo* info);

// Re-planning with new span edges, live. A backbone's span runner covers its spans and the blocks
// it runs as spans itself ("here"); a resplit may move any edge within those blocks. From the live
// layout `old_plan` (a plan document: "roles" with role "span", "layers" and "addr", and "here":
// the F-L blocks run here as spans) to the spans of `new_plan`: the new spans, plus each run of
// covered blocks no new span takes as a span "here", in block order.
struct SpanListEntry {
  int first = 0, last = 0;
  std::string to;    // the role's "addr" ("" when the plan has none: a peer that joined), or "here"
  std::string peer;  // the role's "peer" name ("" for here)
};
struct SpanListChange {
  bool same = true;   // the span edges do not change (a peer may: that is a move)
  bool live = false;  // otherwise: the new spans lie within the covered blocks (a resplit does it)
  std::vector<SpanListEntry> list;
};
SpanListChange span_list_change(const nlohmann::json& old_plan, const nlohmann::json& new_plan);

}  // namespace moesh
