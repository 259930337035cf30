// The backbone's side of layer spans (model/span.h, docs/span.md): blocks first..last of every
// step go to a span peer (`moesh span`) in one SPAN_STEP, and come back as the rows leaving the
// span — one trip per span and step, whatever the number of MoE layers inside it.
//
// Petals' rule for failures: the backbone keeps, per sequence and span, every input it sent
// (the log) and the hash chain over them. A peer that lacks inputs (a replacement, a restart, an
// evicted sequence, a recurrent state between checkpoints) says how much it holds, and the step is
// resent with the rest replayed from the log; a peer that fails is replaced by the next peer
// named for that span, and at last by this process itself (the blocks run here on the model's
// own weights), so the output is unchanged and no request restarts. Prefix-cache copies and
// rollbacks of the backbone's state are mirrored into the log (StateListener).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <vector>

#include "moesh/model/model.h"
#include "moesh/remote/link.h"
#include "moesh/util/row_log.h"
#include "moesh/util/status.h"
#include "moesh/wire/wire.h"

namespace moesh {

namespace swarm {
class SpanHost;
}

// The HELLO sent to span peers (by a backbone, or a span peer passing a chained step on): the
// model's identity and shape, no experts held.
Result<wire::Hello> span_hello(const Model& model, const std::string& name);

// One span and who may run it, in order of preference.
struct SpanTarget {
  LayerSpan span;
  std::vector<WorkerAddress> peers;
  // "F-L@here": the backbone runs the blocks itself, as a span (no peers). Why a span rather
  // than the backbone's own blocks: a span keeps its inputs, so a resplit can later hand these
  // blocks to a peer (and take span blocks back) live; the context keeps no state for them.
  bool here = false;
  // Lanes (`--span-lane F-L@HOST:PORT`): more peers running these blocks at the same time, each
  // for its share of the sequences (throughput for many streams: one trip per lane and step, all
  // in flight together). Not replacements: a lane that fails is dropped and its sequences go back
  // to the span's runner, replayed from the log.
  std::vector<WorkerAddress> lanes;
};

// Parses "12-23@HOST:PORT" (any WorkerAddress form after the @) or "12-23@here"; the same span
// given several times lists replacements, in order (merge_span_targets).
Result<SpanTarget> parse_span_target(const std::string& s);
// "12-23@HOST:PORT" as a lane of span 12-23 (a target with only `lanes` set).
Result<SpanTarget> parse_span_lane(const std::string& s);
// Targets with equal spans merged (peers and lanes appended in order), sorted by first block;
// overlapping different spans, a span both here and on peers, or lanes of a span no target runs:
// kInvalidArgument naming them.
Result<std::vector<SpanTarget>> merge_span_targets(std::vector<SpanTarget> targets);

// Chained spans (swarm/span_chain.h): adjacent spans whose peers all offer kFeatureSpanChain and
// are reached directly (plain HOST:PORT, no TLS pins) may take a step as one chain — the first
// peer passes its rows on to the next, the backbone collects every span's result with
// SPAN_AWAIT. kAuto chains where it measured faster than star trips (single-stream steps timed
// both ways, the loser probed now and then); kOn always chains where it can; kOff never.
enum class SpanChainMode : uint8_t { kOff, kOn, kAuto };
const char* span_chain_mode_name(SpanChainMode m);
Result<SpanChainMode> parse_span_chain_mode(const std::string& s);  // "off", "on", "auto"

struct SpanOptions {
  LinkOptions link;
  std::string name = "backbone";  // HELLO name: the peers key this backbone's sequences by it
  // Hidden rows both ways: f32 (bit-exact), f16 or bf16 (lossy: check with `moesh gate`). The
  // INT8 formats are not offered between spans: re-encoding a replayed row must give its bits.
  wire::WireDType hidden_wire = wire::WireDType::kF32;
  wire::WireDType return_wire = wire::WireDType::kF32;
  std::chrono::milliseconds timeout{30000};  // per trip (a long prompt chunk computes that long)
  // When every peer of a span fails, run its blocks here (this process holds the weights); false:
  // the step fails naming the span.
  bool local_fallback = true;
  int local_threads = 0;  // the local fallback's compute threads (<= 0: all cores)
  // The routed experts of spans run here (named here, moved here, a fallback): the backbone's own
  // executor (its workers), borrowed (BorrowedExecutor); null: the model's own expert weights,
  // which a backbone slice does not hold.
  std::shared_ptr<ExpertExecutor> here_executor;
  // After a span moved off a peer (failure), the peers named before its current one (the
  // failed primary first) are dialled again before a step at most this often, and the span goes
  // back to the first that answers (its inputs replayed as after any move). < 0: never.
  std::chrono::milliseconds retry_preferred{10000};
  SpanChainMode chain = SpanChainMode::kAuto;
  // The input log (every row sent to every span, for replays) keeps at most this many bytes of
  // rows in memory; older rows go to an unlinked file in log_dir ("": $TMPDIR, else /var/tmp),
  // read back only when a replay needs them (util/row_log.h).
  size_t log_memory_bytes = size_t{1} << 30;
  std::string log_dir;
  int64_t log_chunk_rows = 64;  // rows per chunk of the log: the unit moved to the file
  // A move or resplit to a peer that loads spans (kFeatureSpanLoad) asks it to load the blocks
  // first (SPAN_HOLD) and waits at most this long for them (a fetched slice may take minutes);
  // the blocks it no longer gets from this backbone are let go afterwards.
  std::chrono::milliseconds load_timeout{600000};
  // A span whose peer fails goes to a replacement: the peers named after it, then the idle span
  // peers this backbone knows (idle_view). One that loads spans is asked to load the blocks
  // (SPAN_HOLD) and waited for this long; when it is not ready by then and the span can run here
  // (local_fallback, or named here), the span runs here meanwhile and moves to that peer once it
  // holds them (its inputs replayed, as after any move). Without a fallback the wait is
  // load_timeout.
  std::chrono::milliseconds failover_load_wait{3000};
};

struct SpanStats {
  uint64_t steps = 0;          // span steps completed (one per span and forward pass)
  uint64_t trips = 0;          // SPAN_STEP round trips made (resends and failovers included)
  uint64_t resends = 0;        // trips repeated because the peer lacked inputs
  uint64_t replayed_rows = 0;  // logged inputs sent again
  uint64_t failovers = 0;      // switches to the next peer of a span (or to this process)
  uint64_t local_steps = 0;    // span steps run here
  uint64_t bytes_sent = 0, bytes_received = 0;
  uint64_t restored = 0;        // moves back to a preferred peer (retry_preferred)
  uint64_t chains = 0;          // chained trips: one head SPAN_STEP for several adjacent spans
  uint64_t chained_steps = 0;   // span steps completed inside a chain (counted in steps too)
  uint64_t awaits = 0;          // SPAN_AWAITs sent (counted in trips: one per span after the head)
  uint64_t chain_breaks = 0;    // chains finished star-style after a failure, a lack or a lost hop
  uint64_t moves = 0;           // planned moves (SpanClient::move) completed
  uint64_t move_rows = 0;       // logged inputs sent to warm the new runner of a move
  uint64_t resplits = 0;        // resplits (SpanClient::resplit) completed
  uint64_t loads = 0;           // spans a peer loaded at this backbone's word before a move or resplit
  uint64_t drops = 0;           // spans a peer let go of at this backbone's word after one
  uint64_t resplit_rows = 0;    // rows sent to warm the new runners of a resplit
  uint64_t failover_loads = 0;  // replacements that loaded a failed span's blocks (counted in loads)
  uint64_t idle_takeovers = 0;  // failed spans taken over by an idle span peer
  uint64_t lane_trips = 0;      // SPAN_STEP round trips to lanes (counted in trips)
  uint64_t lane_rows = 0;       // rows computed by lanes (new rows, not replays)
  uint64_t lane_failures = 0;   // lanes dropped because they failed (their sequences went back)
  uint64_t lanes_added = 0;     // add_lane (and --span-lane at start) that took
};

// One span of a resplit and where it runs: "HOST:PORT" (any WorkerAddress form) or "here".
struct SpanPlacement {
  LayerSpan span;
  std::string to;
};
// Parses "12-23@HOST:PORT" or "12-23@here".
Result<SpanPlacement> parse_span_placement(const std::string& s);

// What the backbone sees of one span now (the dashboard's plan card).
struct SpanPeerView {
  LayerSpan span;
  std::string label;            // the peer in use, or "here"
  bool local = false;           // runs on this process (fallback, or chosen_here)
  bool chosen_here = false;     // ... because it was named or moved here, not because peers are down
  double warmup_rtt_ms = 0;     // the link's warm-up round trip at connect
  uint64_t trips = 0;           // SPAN_STEP round trips to the current peer
  double trip_seconds = 0;      // their total time (network and the peer's compute)
  double min_trip_seconds = 0;  // the fastest of them (0: none yet)
  // The compute time its SPAN_RESULTs reported, the steps and the rows they ran: its measured
  // compute speed, which re-plans price it at (plan/live.h: measured_speeds).
  double compute_seconds = 0;
  uint64_t compute_steps = 0, compute_rows = 0;
  // What the peer said of its machine at connect (INFO_REPLY; 0: not reported): the routed-expert
  // bytes of its blocks, memory, and what it offers (`--offer-mb`), for re-plans.
  std::string address;
  uint64_t slab_bytes = 0, mem_total_bytes = 0, mem_available_bytes = 0, offer_bytes = 0, replica_budget_bytes = 0;
  uint64_t sequences = 0;  // lanes_view: the sequences the lane runs now
};

class SpanClient final : public SpanRunner {
 public:
  // Connects the first reachable peer of every span (each must offer kFeatureSpan for the same
  // model); a span none of whose peers answers runs here with local_fallback, else kUnavailable
  // naming the span and every peer's error.
  static Result<std::shared_ptr<SpanClient>> connect(const Model& model, std::vector<SpanTarget> targets,
                                                     const SpanOptions& opts);
  ~SpanClient() override;

  const std::vector<LayerSpan>& spans() const override { return spans_; }
  Status run(int k, const SpanBatch& b, float* h) override;
  Status run_from(int k, const SpanBatch& b, float* h, int* k_last) override;
  void on_truncate(int32_t seq, int64_t n_keep) override;
  void on_copy(int32_t src, int32_t dst, int64_t n) override;
  void on_remove(int32_t seq) override;
  void on_clear() override;

  // A planned move while running (re-planning, draining a peer; docs/span.md#moving-a-span): span
  // `sp` goes to `to` ("HOST:PORT" in any WorkerAddress form, or "here": this process, which needs
  // the blocks' weights in its file). The new runner is dialled (HELLO: the same model) and sent
  // every sequence's logged inputs first — one SPAN_STEP per sequence, which also proves it runs
  // exactly these blocks — and only then takes the span's steps; the old one is let go. The
  // output stays what it was (the replayed inputs are the logged bits). `to` goes first in the
  // span's peer list, the others stay as replacements. On failure nothing changes and the error
  // says why. The replay runs from a snapshot of the log while steps go on on the old runner;
  // what they add reaches the new one with its first step.
  Status move(const LayerSpan& sp, const std::string& to);

  // New span edges while running (re-planning: docs/span.md#resplitting-spans-while-running): the
  // spans become `want`, which must cover exactly the blocks the spans cover now (the backbone
  // keeps no state for those and runs the others itself) at edges the model may be cut at. A span
  // equal to a current one on the same runner stays as it is; every other one gets a new runner,
  // warmed first with every sequence's inputs: a span starting where an old one started replays
  // that span's log; one starting inside an old span is fed the rows leaving the new span before
  // it (the replay is a prefill of each new span, in block order), which become its log. Steps go
  // on on the old layout meanwhile; then, between two forward passes, what they added is fed
  // through the new spans the same way and the layout switches. Exact wires keep the bits (a
  // span's rows are computed by the same blocks on the same inputs). On failure nothing changes
  // and the error says why.
  Status resplit(const std::vector<SpanPlacement>& want);

  // A lane for span `sp` while running (throughput: Runner::lanes): the peer `to` (it loads the
  // blocks first where it can; the same model) takes new sequences from the next step on, the
  // fewest sequences first; the sequences already running stay where their state is.
  // kInvalidArgument when `to` runs that span already.
  Status add_lane(const LayerSpan& sp, const std::string& to);
  // The lane at `address` of span `sp` is let go (its sequences go back to the span's runner,
  // replayed from the log at their next step); kNotFound when there is none.
  Status drop_lane(const LayerSpan& sp, const std::string& address);
  // Every lane of every span now (span, peer, trips, sequences).
  std::vector<SpanPeerView> lanes_view() const;

  uint64_t begin_pass() override;
  void end_pass() override;
  // Spans run here (named here, moved here, a fallback) compute on the backbone context's pool.
  void set_pool(ThreadPool* pool) override;
  // Where each span runs now (where(k) for every k, taken at once).
  std::vector<std::string> where_all() const;

  SpanStats stats() const;
  std::vector<SpanPeerView> peers_view() const;
  // Span peers this backbone knows that run none of its spans now: added (add_idle, `POST
  // /swarm/spans/add`) or let go of by a move or resplit. What each reported when last connected
  // (span {-1, -1}), so a re-plan may give it blocks; a move or resplit to it dials it again (and it
  // loads them).
  std::vector<SpanPeerView> idle_view() const;
  // Dials a span peer to learn its round trip and memory, and keeps it as idle (the link closed).
  // kInvalidArgument when it runs one of the spans now; the dial's error otherwise.
  Status add_idle(const std::string& address);
  // Who runs span k now: "12-23 on 127.0.0.1:7001 (span-a)" or "12-23 here".
  std::string where(int k) const;
  // One line per span, for start-up output.
  std::string describe() const;
  // Bytes held by the input log (all sequences and spans), in memory and in its file.
  size_t log_bytes() const;
  RowStoreStats log_stats() const;

 private:
  struct Runner;  // one span: its peers, the live link or local host
  struct SeqLog {
    std::vector<RowLog> rows;                                 // [span]: a row of n_embd per cell
    std::vector<std::vector<std::array<uint8_t, 16>>> chain;  // [span][cell]
    std::vector<std::vector<int64_t>> pos;                    // [span][cell]
  };
  struct Part;  // one sequence of a step: its cells before it and its rows in the batch
  // A runner being made for a move or a resplit: dialled (or the local host), not yet in use.
  struct NewRunner {
    std::unique_ptr<WorkerLink> link;
    std::unique_ptr<swarm::SpanHost> local;
    WorkerAddress addr;
    std::string label;
    uint64_t next_id = 1;  // request ids of the local host
    // A local host fed while passes run beside (a move's replay, a resplit's phase 1) whose
    // experts go through the backbone's own executor: each of its steps waits for a gap between
    // passes (step_here), so the two never dispatch on that executor at once.
    bool between_passes = false;
    bool loaded = false;  // the peer loaded the blocks at this backbone's word (SPAN_HOLD)
  };
  // One sequence's inputs of a span: rows, positions and hash chain, cell by cell.
  struct LogView {
    const RowLog& rows;
    const std::vector<int64_t>& pos;
    const std::vector<std::array<uint8_t, 16>>& chain;
  };
  SpanClient(const Model& model, const SpanOptions& opts);
  // "12-23 on PEER + lane PEER2" or "12-23 here" (where(), where_all()).
  static std::string where_text(const Runner& r);
  // The runner of blocks sp on `to` ("here": a local host); a peer that loads spans is asked to
  // hold sp first, and waited for (opts_.load_timeout).
  Result<NewRunner> dial(const LayerSpan& sp, const std::string& to) const;
  // A peer's link no longer used for blocks sp after a move or resplit: a peer that loads spans is
  // asked to let go of them (best effort: it frees the memory for what it runs next), then the
  // link is closed, the peer kept as idle. True when the peer let go.
  bool let_go(const LayerSpan& sp, std::unique_ptr<WorkerLink> link);
  // The idle list without the peers that run a span now.
  void forget_running_idle();
  // Cells [from, n) of `in` to `nr` as new rows of blocks sp (the runner holds the cells before
  // `from` with matching inputs), in chunks; `out` (may be null) gets the rows leaving sp's last
  // block, [n - from][span_row_width(sp.last + 1)].
  // One step of a new runner's local host; with nr.between_passes, taken between two forward
  // passes (the pass lock held exclusively for that one message).
  Result<wire::SpanResultMsg> step_here(NewRunner& nr, const wire::SpanStepMsg& m);
  Status feed(NewRunner& nr, const LayerSpan& sp, int32_t seq, const LogView& in, int64_t from, std::vector<float>* out,
              SpanStats* counts);
  RowStoreStats log_stats_locked() const;
  std::shared_ptr<RowStore> make_log_store(int64_t row_floats, int64_t total_width) const;
  Status trip(int k, const wire::SpanStepMsg& m, wire::SpanResultMsg* out);
  // One SPAN_STEP round trip on a link (trip() for a peer; move() for a runner not yet in use).
  // Its bytes are counted into `counts`.
  Status link_trip(WorkerLink& link, const wire::SpanStepMsg& m, wire::SpanResultMsg* out, SpanStats* counts);
  // link_trip in two halves, so that several lanes' trips are in flight at once.
  Status start_trip(WorkerLink& link, const wire::SpanStepMsg& m, net::Deadline deadline, SpanStats* counts);
  Status finish_trip(WorkerLink& link, uint64_t id, net::Deadline deadline, wire::SpanResultMsg* out,
                     SpanStats* counts);
  // The warm-up of a move: a sequence's logged inputs of span k (a snapshot of its log: rows and
  // positions, at least one), all replayed but the last, which is sent as the step's one new row.
  Result<wire::SpanStepMsg> replay_message(int k, const RowLog& rows, const std::vector<int64_t>& pos, int32_t seq,
                                           uint64_t request_id) const;
  Status fail_over(int k, const Status& why);
  void retry_preferred(int k);  // adopt_loaded first
  void adopt_loaded(int k);
  // The step's sequences in order of appearance; each span's log cut back to where they start.
  Result<std::vector<Part>> begin_step(int k_first, int k_last, const SpanBatch& b);
  // Rows of the step in sequence-grouped order <-> batch order; rows as the hidden wire carries them.
  // W: the row width (HParams::span_row_width at the boundary).
  std::vector<float> gather(const std::vector<Part>& parts, const float* h, int64_t W) const;
  void scatter(const std::vector<Part>& parts, const std::vector<float>& rows, float* h, int64_t W) const;
  Status round_to_wire(std::vector<float>* rows, int64_t W) const;
  // Row widths entering and leaving span k: n_embd, plus the checkpoints of cross-layer residual
  // attention (kimi-k3) banked before the boundary.
  int64_t width_in(int k) const;
  int64_t width_out(int k) const;
  uint32_t span_row_limit() const;  // the decode limit of span links' rows
  // Lossy rows (f16/bf16) cannot cross an edge whose rows carry an indexer selection: its cell
  // positions must arrive exactly (f16 holds integers only up to 2048, bf16 up to 256).
  Status check_edge_wires(const std::vector<LayerSpan>& spans) const;
  // The view of span sp on a peer (link) or here (link null).
  static SpanPeerView view_of(const LayerSpan& sp, const std::string& label, const WorkerLink* link);
  // The step message for span k (replaying what a runner holding `has` lacks) from the grouped rows.
  Result<wire::SpanStepMsg> step_message(int k, const std::vector<Part>& parts, const SpanBatch& b,
                                         const std::vector<float>& rows, uint64_t* replayed,
                                         const std::map<int32_t, int64_t>& has, uint64_t request_id);
  // Span k's result accepted: its inputs logged, what its runner (or lane: `lane_has`) holds,
  // rows := its outputs.
  Status accept(int k, const std::vector<Part>& parts, const SpanBatch& b, const wire::SpanResultMsg& res,
                std::vector<float>* rows, std::map<int32_t, int64_t>* lane_has = nullptr);
  // One span star-style: resends with replay, failover; split over its lanes when it has some.
  // rows: its inputs in, its outputs out.
  Status star(int k, const std::vector<Part>& parts, const SpanBatch& b, std::vector<float>* rows);
  // star() on the span's runner only.
  Status star_one(int k, const std::vector<Part>& parts, const SpanBatch& b, std::vector<float>* rows);
  // star() over lanes: each sequence's part on its lane, every lane's trip in flight at once.
  Status star_lanes(int k, const std::vector<Part>& parts, const SpanBatch& b, std::vector<float>* rows);
  // A lane that failed (mu_ held): dropped, its sequences back on the span's runner.
  void drop_failed_lane(Runner& r, int id, const Status& why);
  // Spans k..e as one chain (finished star-style from where it breaks).
  Status chain(int k, int e, const std::vector<Part>& parts, const SpanBatch& b, std::vector<float>* rows);
  // The last span a chain from k may reach for this step (k: no chain).
  int chain_end(int k, const std::vector<Part>& parts, int64_t n_rows);

  const Model& model_;
  SpanOptions opts_;
  std::vector<LayerSpan> spans_;
  std::vector<std::unique_ptr<Runner>> runners_;
  mutable std::mutex mu_;
  std::mutex move_mu_;                      // one move() or resplit() at a time (their replays run without mu_)
  std::atomic<ThreadPool*> pool_{nullptr};  // set_pool: what local span hosts borrow
  // Forward passes hold it shared (begin_pass..end_pass); a resplit's switch holds it exclusively,
  // so spans_ and runners_ change only between passes. Order: move_mu_, pass_mu_, mu_.
  std::shared_mutex pass_mu_;
  std::mutex pass_gate_;        // the turnstile before pass_mu_ (begin_pass, resplit)
  uint64_t generation_ = 0;     // spans_' generation (changed under pass_mu_ and mu_)
  mutable std::mutex view_mu_;  // Runner::view, idle_
  std::vector<SpanPeerView> idle_;
  // Per span, the rows of every SeqLog (its input width); the memory budget shared in proportion.
  std::vector<std::shared_ptr<RowStore>> log_stores_;
  std::map<int32_t, SeqLog> logs_;
  SpanStats stats_;
  uint64_t next_chain_id_ = 0;  // random start: ids of a restarted backbone do not meet old ones
  // kAuto's measurements (single-stream steps only): per chain start k and end e, and per span.
  struct ChainTimes {
    double seconds = 0;  // moving average of the whole chain's trip
    int samples = 0;
    uint64_t decisions = 0;
  };
  std::map<std::pair<int, int>, ChainTimes> chain_times_;
};

}  // namespace moesh
