// Layer spans: blocks first..last of the forward pass run somewhere else (a span peer, docs/span.md).
//
// A pipeline (Petals-style) pays one trip per span and step instead of one per MoE layer, so a
// backbone can hand whole runs of blocks — attention, its share of the KV cache, router, shared
// and routed experts — to a peer that holds them. The forward pass (Context::decode_batch) stops
// at the first block of each span, hands the span's runner the rows entering it and continues
// with the rows leaving its last block. The runner keeps the span's inputs so a peer that lost
// state (a replacement, a restart, a copied prefix it never saw) is brought up to date by
// replaying them: the backbone never restarts a request. The peer side is
// Context::decode_layers.
#pragma once

#include <cstdint>
#include <vector>

#include "moesh/model/seq_state.h"
#include "moesh/util/status.h"

namespace moesh {

class ThreadPool;

struct LayerSpan {
  int first = 0, last = 0;  // blocks [first, last]
  bool operator==(const LayerSpan&) const = default;
};

// Parses "12-23" (or "7", a one-block span). kInvalidArgument naming the text.
Result<LayerSpan> parse_layer_span(const std::string& s);

// The tokens of one step as a span sees them, in batch order: sequence, position, and cell (the
// token's index within its sequence: the first token of a sequence in the step has cell ==
// the number of tokens the sequence held before it). `logits` (null: none) marks tokens whose
// logits the step asks for: where speculative decoding may cut the state afterwards.
struct SpanBatch {
  int64_t n = 0;
  const int32_t* seq = nullptr;
  const int64_t* pos = nullptr;
  const int64_t* cell = nullptr;
  const uint8_t* logits = nullptr;
};

// Runs the spans of a context (ContextParams::spans). Being a StateListener it hears of every
// cut, copy and removal of the backbone's sequence state, so it can keep its inputs in step.
class SpanRunner : public StateListener {
 public:
  // Disjoint and ascending.
  virtual const std::vector<LayerSpan>& spans() const = 0;
  // h [b.n][span_row_width(first)]: the rows entering span k's first block; on return the rows
  // leaving its last, [b.n][span_row_width(last + 1)] (HParams: n_embd, plus the checkpoints of
  // cross-layer residual attention; h has room for the widest).
  // On error h is unspecified and the step fails (the context rolls its cells back).
  virtual Status run(int k, const SpanBatch& b, float* h) = 0;
  // Span k and, where the runner can take them in the same trip, the spans right after it
  // (chained spans, docs/span.md): h enters span k's first block and, on return, leaves the last
  // block of span *k_last (>= k; the spans k..*k_last are adjacent). Default: span k alone.
  virtual Status run_from(int k, const SpanBatch& b, float* h, int* k_last) {
    *k_last = k;
    return run(k, b, h);
  }
  // A forward pass brackets its span calls with these (Context::decode_batch, SpanPass), so a
  // runner whose spans may change while it runs (SpanClient::resplit) changes them only between
  // passes. begin_pass returns the spans' generation: when it differs from the one a pass saw
  // last, the pass reads spans() again. The blocks the spans cover together never change (the
  // context keeps no state for them).
  virtual uint64_t begin_pass() { return 0; }
  virtual void end_pass() {}
  // The forward pass's pool (the context hands over its own when it is created, null when it
  // dies): spans a runner computes in this process borrow it (Context::borrow_pool) instead of
  // spinning a second pool on the same cores. Default: unused.
  virtual void set_pool(ThreadPool* pool) { (void)pool; }
};

// begin_pass / end_pass of one forward pass (no runner: nothing).
class SpanPass {
 public:
  explicit SpanPass(SpanRunner* r) : r_(r), generation_(r != nullptr ? r->begin_pass() : 0) {}
  ~SpanPass() {
    if (r_ != nullptr) r_->end_pass();
  }
  SpanPass(const SpanPass&) = delete;
  SpanPass& operator=(const SpanPass&) = delete;
  uint64_t generation() const { return generation_; }

 private:
  SpanRunner* r_;
  uint64_t generation_;
};

}  // namespace moesh
