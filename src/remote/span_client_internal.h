// SpanClient's per-span runner (span_client.h), shared by span_client.cpp and span_resplit.cpp.
#pragma once

#include <chrono>
#include <future>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "moesh/remote/span_client.h"
#include "moesh/swarm/span_host.h"

namespace moesh {

// More resends than this for one step means the peer and the log disagree for good.
inline constexpr int kSpanMaxResends = 3;

// One sequence of a step: its cells before it and its rows in the batch.
struct SpanClient::Part {
  int32_t seq;
  int64_t n_before;
  std::vector<int64_t> rows;  // batch rows, in order
};

// The new rows of a step's parts (a template: SpanClient::Part is private to the class).
template <class P>
int64_t rows_of(const std::vector<P>& parts) {
  int64_t n = 0;
  for (const P& p : parts) n += static_cast<int64_t>(p.rows.size());
  return n;
}

// A replacement loading a failed span's blocks in the background (SpanOptions::failover_load_wait)
// while the span runs elsewhere: the load finishes on its own thread, and the step path switches
// to the peer once `done` is ready and ok. Destroying it shuts the link so the load gives up.
struct SpanPendingLoad {
  std::unique_ptr<WorkerLink> link;
  WorkerAddress address;
  bool idle = false;    // one of the idle span peers (not named for the span)
  bool loaded = false;  // it had to load them (written by the load, read once `done` is ready)
  std::future<Status> done;
  ~SpanPendingLoad() {
    if (link) link->shut_down();
    if (done.valid()) done.wait();
  }
};

// One answered trip into a peer's view (under view_mu_): its time, and the compute its peer
// reported for the rows the step ran.
void note_trip(SpanPeerView* v, double seconds, const wire::SpanStepMsg& m, const wire::SpanResultMsg& res);

// A lane of a span (SpanClient::add_lane): another peer running the same blocks for its share of
// the sequences, beside the span's runner. What it holds per sequence, as Runner::has.
struct SpanLane {
  int id = 0;  // >= 1, never reused within a span (Runner::lane_of refers to it)
  WorkerAddress addr;
  std::unique_ptr<WorkerLink> link;
  std::map<int32_t, int64_t> has;
  std::string label;
  SpanPeerView view;    // written under view_mu_ only
  bool loaded = false;  // it loaded the blocks at this backbone's word (let go of them when dropped)
};

// One span: the peers that may run it, the one in use (or the local host once all failed), and
// what that runner is known to hold per sequence (cells whose inputs match the log).
struct SpanClient::Runner {
  SpanTarget target;
  size_t next_peer = 0;  // the next peer to try on failure
  std::unique_ptr<WorkerLink> link;
  std::unique_ptr<swarm::SpanHost> local;
  std::map<int32_t, int64_t> has;
  std::string label;
  SpanPeerView view;   // what peers_view() reports: written under view_mu_ only
  size_t current = 0;  // index into target.peers of the peer in use; peers.size(): here
  std::chrono::steady_clock::time_point last_retry{};
  double star_seconds = 0;  // kAuto: moving average of clean single-stream trips (span_client.h)
  int star_samples = 0;
  double compute_seconds = 0;  // kAuto: moving average of the peer's compute of those steps
  int compute_samples = 0;
  // Not chained to from the span before it until then: a hop to it failed while it answered the
  // backbone (a path between the two peers that does not work), so chaining would only break again.
  std::chrono::steady_clock::time_point no_chain_until{};
  bool moved_here = false;                   // move(.., "here"): stays here (no retry_preferred) until moved again
  std::unique_ptr<SpanPendingLoad> pending;  // a replacement still loading the blocks (fail_over)
  // Lanes (add_lane): each sequence runs on one of them or on the runner above (0), chosen when
  // its request starts (the fewest sequences first) and kept while it runs, since its state lives
  // there; a failed lane's sequences go back to the runner, replayed from the log.
  std::vector<std::unique_ptr<SpanLane>> lanes;
  std::map<int32_t, int> lane_of;  // sequence -> lane id (absent or 0: the runner)
  // Sequences whose place is settled for their request (star_lanes); a cut or a prefix copy
  // (a new request in the slot, a rollback) unplaces one, so it may go where fewer run.
  std::set<int32_t> placed;
  int next_lane_id = 1;
  SpanLane* lane(int id) {
    for (auto& l : lanes)
      if (l->id == id) return l.get();
    return nullptr;
  }
};

// Has a peer that loads spans (kFeatureSpanLoad) hold blocks sp (SPAN_HOLD), waiting until it
// does or `timeout` passes; *loaded: it had to load them. Nothing else may read the link meanwhile.
Status load_span_on_peer(WorkerLink& link, const LayerSpan& sp, std::chrono::milliseconds timeout, bool* loaded);

}  // namespace moesh
