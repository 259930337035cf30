// KV cache in F32 with per-sequence cells.
//
// Each sequence owns its cells in append order, each cell holding the token's position and, per
// layer, its K row (k_width floats) and V row (v_width floats). Attention of a query of sequence s
// at position p reads the cells of s with pos <= p in cell order — the same order whether the
// tokens arrived in one batch or one at a time, so prefill and decode give the same bits.
// Sequences can be added and removed independently, and rolled back (rejected drafts) by
// truncation (a SequenceState that can be cut anywhere). Layers are the model's attention
// layers only (hybrid models' recurrent layers hold no cells). Layout per sequence and layer:
// [cell][k_width | v_width], grown on demand. Keeping a layer's cells together (rather than
// [cell][layer]) is what lets attention stream them: with every layer in between, each cell of
// a long context was a separate page (one TLB miss and a prefetcher stop per cell and head).
#pragma once

#include <cstdint>
#include <map>
#include <vector>

#include "moesh/model/seq_state.h"
#include "moesh/util/huge_pages.h"
#include "moesh/util/status.h"

namespace moesh {

class KvCache final : public SequenceState {
 public:
  // n_ctx: most cells one sequence may hold.
  KvCache(int64_t n_layer, int64_t k_width, int64_t v_width, int64_t n_ctx);

  int64_t n_layer() const { return n_layer_; }
  int64_t k_width() const { return k_width_; }
  int64_t v_width() const { return v_width_; }
  int64_t n_ctx() const { return n_ctx_; }

  // Cells currently held by `seq` (0 for an unknown sequence).
  int64_t seq_len(int32_t seq) const override;
  // KV cells can be cut anywhere: min(n, seq_len).
  int64_t restorable(int32_t seq, int64_t n) const override;
  // Position of the last cell of `seq`, or -1 when empty.
  int64_t seq_pos_max(int32_t seq) const;
  // Appends n cells at the given positions (must be > seq_pos_max and increasing) and returns the
  // index of the first; kOutOfRange when the sequence would exceed n_ctx.
  Result<int64_t> append(int32_t seq, const int64_t* positions, int64_t n);
  // Keeps the first n_keep cells of `seq` (rollback); always ok.
  Status truncate(int32_t seq, int64_t n_keep) override;
  void remove(int32_t seq) override;
  // Makes `dst` hold a copy of the first n cells of `src` (positions and K/V rows), replacing
  // whatever dst held: a shared prompt prefix computed once serves another sequence.
  // kOutOfRange when src holds fewer than n cells; kInvalidArgument when src == dst.
  Status copy(int32_t src, int32_t dst, int64_t n) override;
  void clear() override;

  // Row accessors; valid until the next append() on the same sequence.
  float* k(int32_t seq, int64_t layer, int64_t cell);
  float* v(int32_t seq, int64_t layer, int64_t cell);
  const int64_t* positions(int32_t seq) const;
  // Distance in floats between the K (or V) rows of consecutive cells of one layer.
  size_t cell_stride() const { return static_cast<size_t>(k_width_ + v_width_); }

 private:
  struct Seq {
    std::vector<int64_t> pos;
    std::vector<std::vector<float, HugePageAllocator<float>>> layers;  // per layer: [cell][k_width + v_width]
  };
  Seq* find(int32_t seq);
  const Seq* find(int32_t seq) const;

  int64_t n_layer_, k_width_, v_width_, n_ctx_;
  std::map<int32_t, Seq> seqs_;
};

}  // namespace moesh
