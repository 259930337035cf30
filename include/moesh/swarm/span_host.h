// The span peer's side of layer spans (model/span.h, docs/span.md): a model whose blocks
// first..last run here for backbones, each backbone's sequences keeping their share of the KV
// cache (or recurrent state) in this process.
//
// A SPAN_STEP names, per sequence, how many cells the peer must already hold and the hash chain
// of their inputs. Held cells whose chain matches are kept (cut back when the backbone rolled
// back: speculative decoding, a failed step); a sequence this peer never saw at that length but
// whose prefix another of the backbone's sequences holds is copied from it (the backbone's prefix
// cache, here too); otherwise the peer answers with the cells it does hold that match, and the
// backbone resends the step with the missing inputs replayed from its log. So a restarted or
// replacement peer, an evicted sequence, or a recurrent state cut between checkpoints all come
// back exactly, without the backbone restarting a request.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "moesh/model/model.h"
#include "moesh/util/status.h"
#include "moesh/wire/wire.h"

namespace moesh::swarm {

// The hash chain of a sequence's span inputs: chain(0) is all zero; chain(n+1) =
// XXH3-128(chain(n) | position | the row's f32 bytes), so equal chains mean equal inputs at
// equal positions for every cell, hence (deterministic kernels) equal state.
using SpanChain = std::array<uint8_t, 16>;
SpanChain span_chain_next(const SpanChain& prev, int64_t pos, const float* row, int64_t n_embd);

struct SpanHostOptions {
  LayerSpan span;
  int n_threads = 0;  // <= 0: all cores
  int64_t n_ctx = 0;  // cells per sequence; <= 0: the model's context length
  // Expert executor for the span's MoE blocks (e.g. remote expert peers near this one); null:
  // the model's own experts, computed here.
  std::shared_ptr<ExpertExecutor> executor;
  // Sequences kept over all backbones; beyond it the least recently stepped one is dropped (its
  // backbone replays it if it comes back).
  size_t max_seqs = 256;
  // Keeps the model alive as long as the host (a span loaded on a backbone's word, SpanHosts);
  // null: the caller keeps `model` alive.
  std::shared_ptr<const Model> model_owner;
};

struct SpanHostStats {
  std::atomic<uint64_t> steps{0};          // SPAN_STEPs computed
  std::atomic<uint64_t> rows{0};           // rows computed (replayed included)
  std::atomic<uint64_t> replayed_rows{0};  // of which replays of inputs this peer lacked
  std::atomic<uint64_t> needs{0};          // SPAN_STEPs answered with missing inputs
  std::atomic<uint64_t> prefix_copies{0};  // sequences started from another's matching prefix
  std::atomic<uint64_t> evictions{0};      // sequences dropped to stay within max_seqs
  std::atomic<uint64_t> errors{0};
};

class SpanHost {
 public:
  static Result<std::unique_ptr<SpanHost>> create(const Model& model, const SpanHostOptions& opts);
  ~SpanHost();

  const LayerSpan& span() const { return opts_.span; }
  const Model& model() const { return model_; }
  const SpanHostStats& stats() const { return stats_; }

  // One SPAN_STEP from backbone `peer` (its HELLO name keys its sequences): the SPAN_RESULT (rows,
  // or the missing inputs), or an error status naming the problem (wrong blocks, a position that
  // does not continue the sequence, context full).
  Result<wire::SpanResultMsg> step(const std::string& peer, const wire::SpanStepMsg& m);
  // Sequences held now (all backbones).
  size_t n_sequences() const;
  // Whether it holds a sequence of a backbone other than `peer` (SPAN_HOLD's drop refuses then).
  bool serves_other_than(const std::string& peer) const;
  // Computes on the backbone's pool (a span run in the backbone's own process; null: its own).
  void borrow_pool(ThreadPool* pool);

 private:
  SpanHost(const Model& model, const SpanHostOptions& opts);
  struct Seq {
    int32_t local = 0;
    std::vector<SpanChain> chain;  // chain[i]: after cell i
    uint64_t last_use = 0;
  };
  using Key = std::pair<std::string, int32_t>;
  // The cells of `s` (of `peer`) that can serve a step starting at `start` with `chain`: start
  // when they match, else fewer.
  int64_t usable(const Seq& s, uint64_t start, const SpanChain& chain) const;
  void evict(const std::vector<Key>& keep);

  const Model& model_;
  SpanHostOptions opts_;
  std::unique_ptr<Context> ctx_;
  mutable std::mutex mu_;
  std::map<Key, Seq> seqs_;
  int32_t next_local_ = 0;
  uint64_t clock_ = 0;
  SpanHostStats stats_;
};

// Loads the host of other blocks for a span peer (SPAN_HOLD kLoad): from its full model file, or
// from a slice fetched from its gateway (`moesh span --fetch`). Runs on a thread of its own; may
// take minutes (a download), so it must give up by itself on a stalled source.
using SpanLoader = std::function<Result<std::shared_ptr<SpanHost>>(const LayerSpan& span)>;

// What a span peer runs: its hosts keyed by blocks, and the loads a backbone asked for
// (docs/span.md#loading-blocks). A gateway that re-plans asks the peer to load the blocks its new
// layout gives it, waits until they are ready, then moves them there with one resplit, and
// finally asks the peer to let go of the blocks it no longer sends it. Steps of different hosts
// are computed one at a time: they share the cores.
class SpanHosts {
 public:
  // `initial` (may be null) is held from the start; `loader` empty: SPAN_HOLD kLoad is refused.
  // max_row_width: the model's widest span row (HParams::max_span_row_width), needed when initial
  // is null (an expert worker that may be given blocks: its connections' limits are set before
  // any host exists).
  SpanHosts(std::shared_ptr<SpanHost> initial, SpanLoader loader, int64_t max_row_width = 0);
  ~SpanHosts();  // waits for loads in progress (each gives up by itself)
  SpanHosts(const SpanHosts&) = delete;
  SpanHosts& operator=(const SpanHosts&) = delete;

  bool can_load() const { return static_cast<bool>(loader_); }
  // The widest span row of the model (every span of it): what SPAN_STEP decoding allows.
  int64_t max_row_width() const { return max_row_width_; }
  // The ready host of exactly `sp`, or null.
  std::shared_ptr<SpanHost> find(const LayerSpan& sp) const;
  // One SPAN_STEP (SpanHost::step) on the host of its blocks; kNotFound naming the blocks held
  // when there is none.
  Result<wire::SpanResultMsg> step(const std::string& peer, const wire::SpanStepMsg& m);
  // One SPAN_HOLD from backbone `peer`: what is held now (after starting a load or dropping), or an
  // error to send back (kUnsupported: this peer cannot load; kUnavailable: a drop of blocks it could
  // not load again, still loading, or holding another backbone's sequences; kNotFound: a drop of
  // blocks not held).
  Result<wire::SpanHeldMsg> hold(const std::string& peer, const wire::SpanHoldMsg& m);
  // Every span held, loading or failed, in block order (the body of SPAN_HELD).
  std::vector<wire::SpanHolding> list() const;
  // "0-3, 8-11 (loading)" for messages.
  std::string describe() const;

 private:
  struct Entry {
    std::shared_ptr<SpanHost> host;  // ready: non-null
    wire::SpanHeldState state = wire::SpanHeldState::kReady;
    std::string error;
  };
  using Key = std::pair<int, int>;  // first, last
  std::vector<wire::SpanHolding> list_locked() const;
  std::string describe_locked() const;

  SpanLoader loader_;
  int64_t max_row_width_ = 0;
  mutable std::mutex mu_;
  std::map<Key, Entry> spans_;
  struct Load {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;
  };
  std::vector<Load> loads_;  // finished ones are joined at the next load
  std::mutex compute_mu_;    // one step at a time over all hosts
};

}  // namespace moesh::swarm
