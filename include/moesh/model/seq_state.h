// Per-sequence state behind one interface: KV cells (attention layers), recurrent state (linear
// attention layers: gated DeltaNet), or both (hybrid models such as qwen3next).
//
// What every caller needs from a sequence's state is the same three things — its length, cutting
// it back (speculative decoding drops rejected drafts, a failed step is undone) and copying a
// prefix of it to another sequence (the server's prefix cache). KV cells can be cut anywhere. A
// recurrent state cannot: it is one running summary of every token, so it can only go back to a
// copy taken at that length (a checkpoint). `restorable()` tells a caller where a cut is exact;
// Context::rewind() cuts at the nearest checkpoint and recomputes the rest, so rollback and
// prefix reuse are exact for every model.
#pragma once

#include <cstdint>
#include <map>
#include <vector>

#include "moesh/util/status.h"

namespace moesh {

class SequenceState {
 public:
  virtual ~SequenceState() = default;
  // Tokens held by `seq` (0 for an unknown sequence).
  virtual int64_t seq_len(int32_t seq) const = 0;
  // The largest m <= n (and <= seq_len) at which `seq` can be cut or copied exactly. KV cells:
  // min(n, seq_len); a recurrent state: its nearest checkpoint (0, the empty state, always is).
  virtual int64_t restorable(int32_t seq, int64_t n) const = 0;
  // Keeps the first n_keep tokens. kOutOfRange (nothing changed, the message names the nearest
  // restorable length) when n_keep < seq_len is not restorable; n_keep >= seq_len is a no-op.
  virtual Status truncate(int32_t seq, int64_t n_keep) = 0;
  // Makes `dst` hold the first n tokens of `src`, replacing what dst held. kOutOfRange when src
  // holds fewer or n is not restorable, kInvalidArgument when src == dst.
  virtual Status copy(int32_t src, int32_t dst, int64_t n) = 0;
  virtual void remove(int32_t seq) = 0;
  virtual void clear() = 0;
};

// Where a recurrent state keeps checkpoints. A checkpoint is a full copy of a sequence's state
// (every recurrent layer), so their number is a memory/speed trade: cutting back to a length
// without one costs a recomputation of the tokens since the checkpoint before it.
struct CheckpointPolicy {
  // A step keeps the state at its end and after each of its tokens that asks for logits (the
  // points where speculative decoding may cut: rejecting drafts is then a copy, not a
  // recomputation), at most this many of the latter per sequence and step.
  int step_tokens = 32;
  // Inside long steps (prompt chunks) the state is also kept at every length that is a multiple
  // of this (0: never), so a later prompt that shares a long prefix (a system prompt) can start
  // from it.
  int every = 256;
  // Older checkpoints kept per sequence beyond the last step's; when there are more, the one
  // whose removal leaves the smallest gap goes, so the survivors stay spread over the sequence
  // (prefix reuse at many lengths).
  int max_older = 8;
};

// Recurrent state of every sequence: per recurrent layer `width` floats (the layer decides what
// they hold; DeltaNet: its convolution window and its per-head state matrices), plus
// checkpoints. Invariant: a sequence always has a checkpoint at its current length (the empty
// state counts), so a failed step is undone by a copy.
class RecurrentState final : public SequenceState {
 public:
  RecurrentState(int64_t n_layer, int64_t width, CheckpointPolicy policy = {});

  int64_t n_layer() const { return n_layer_; }
  int64_t width() const { return width_; }
  const CheckpointPolicy& policy() const { return policy_; }
  void set_policy(const CheckpointPolicy& p) { policy_ = p; }

  int64_t seq_len(int32_t seq) const override;
  int64_t restorable(int32_t seq, int64_t n) const override;
  Status truncate(int32_t seq, int64_t n_keep) override;
  Status copy(int32_t src, int32_t dst, int64_t n) override;
  void remove(int32_t seq) override;
  void clear() override;

  // Lengths at which `seq` has a checkpoint, ascending (0 is implicit and not listed).
  std::vector<int64_t> checkpoints(int32_t seq) const;
  // Floats held in checkpoints over all sequences (memory accounting).
  size_t checkpoint_floats() const;

  // ---- the step protocol (Context::decode_batch) ----
  // `seq` is about to take n_new tokens; creates it (empty state) when unknown. `cut_after`
  // (n_new flags, or null) marks the tokens after which a cut is likely (logits asked): the
  // state is kept there (policy.step_tokens of them at most) and at the step's end.
  void begin_step(int32_t seq, int64_t n_new, const uint8_t* cut_after = nullptr);
  // The live state of recurrent layer `layer` of `seq` (width floats); between begin and end of a step.
  float* live(int32_t seq, int64_t layer);
  // Layer `layer` has just taken the token that makes `seq` hold n_after tokens: copies the
  // layer's live state into that length's checkpoint if the policy keeps one there.
  void after_token(int32_t seq, int64_t layer, int64_t n_after);
  // The step is done: its checkpoints join the sequence's and the length advances.
  void commit_step(int32_t seq);
  // The step failed: the live state returns to the step's start.
  void abort_step(int32_t seq);

 private:
  struct Checkpoint {
    int64_t len = 0;
    std::vector<float> data;  // [layer][width]
  };
  struct Seq {
    int64_t len = 0;
    std::vector<float> live;          // [layer][width]
    std::vector<Checkpoint> cps;      // ascending len; all <= len
    std::vector<Checkpoint> pending;  // this step's, ascending len
    int64_t step_base = -1;           // len at begin_step, -1 outside a step
    // Buffers of dropped checkpoints, reused by the next steps' (a decode step keeps one or
    // more checkpoints of n_layer x width floats: no allocation per step once warm).
    std::vector<std::vector<float>> spare;
  };
  std::vector<float> take_buffer(Seq& s) const;
  void give_buffer(Seq& s, std::vector<float>&& v) const;
  Seq* find(int32_t seq);
  const Seq* find(int32_t seq) const;
  const Checkpoint* checkpoint_at(const Seq& s, int64_t len) const;
  void restore(Seq& s, int64_t len);  // live := checkpoint at len (zeros at 0)
  void prune(Seq& s, int64_t protect_from);

  int64_t n_layer_, width_;
  CheckpointPolicy policy_;
  std::map<int32_t, Seq> seqs_;
};

class KvCache;

// Told of every cut, copy and removal of a context's sequence state outside a step (speculative
// rollback, the server's prefix cache, finished requests): whoever keeps a share of that state
// elsewhere (a span runner's inputs, span.h) follows along. Steps themselves are not reported.
class StateListener {
 public:
  virtual ~StateListener() = default;
  virtual void on_truncate(int32_t seq, int64_t n_keep) {}
  virtual void on_copy(int32_t src, int32_t dst, int64_t n) {}
  virtual void on_remove(int32_t seq) {}
  virtual void on_clear() {}
};

// A context's whole per-sequence state: its KV cells and, for models with recurrent layers, its
// recurrent state, cut and copied together (a cut is exact where both allow it).
class ContextState final : public SequenceState {
 public:
  ContextState(KvCache* kv, RecurrentState* rec) : kv_(kv), rec_(rec) {}

  int64_t seq_len(int32_t seq) const override;
  int64_t restorable(int32_t seq, int64_t n) const override;
  Status truncate(int32_t seq, int64_t n_keep) override;
  Status copy(int32_t src, int32_t dst, int64_t n) override;
  void remove(int32_t seq) override;
  void clear() override;
  // Null: nobody listens. Called after each successful change.
  void set_listener(StateListener* l) { listener_ = l; }

 private:
  KvCache* kv_;
  RecurrentState* rec_;  // null: attention only
  StateListener* listener_ = nullptr;
};

}  // namespace moesh
