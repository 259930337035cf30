// The lightning indexer of DeepSeek-style sparse attention (DSA; glm-dsa), per token t of a block
// that computes its own selection (shapes as ggml ne, i.e. [in, out]; Hi indexer heads of di):
//
//   iq   = idx_wq_b[q_lora, Hi*di] · qr          qr: the block's normed q_a (MLA)
//   ik   = layernorm(idx_wk[n_embd, di] · x) ⊙ k_norm + k_norm_b     (eps 0: llama.cpp reads none)
//   RoPE (NORM, the model's base) on the FIRST n_rot dims of every iq head and of ik ([rope | nope])
//   w    = idx_proj[n_embd, Hi] · x / sqrt(di · Hi)
//   score(t, c) = Σ_h relu(iq_h(t) · ik(c)) · w_h(t)     over the visible cells c (pos <= pos_t)
//   keep the top_k cells of highest score (all of them while fewer are visible)
//
// ik is cached per cell after the MLA latent ([c | k_pe | ik] is the K row), so every token's
// selection is computed against the cache the same way in a batch and one token at a time.
// llama.cpp first multiplies iq and ik by a Hadamard matrix; it is orthogonal, so the scores are
// the same up to rounding and it is left out. Blocks whose indexer type is 0 reuse the selection
// of the nearest earlier block with an indexer (hp.indexer_source), read from f.s.dsa_keep.
#include <algorithm>
#include <cmath>

#include "model/layers.h"
#include "moesh/tensor/kernels.h"

namespace moesh::detail {

Status bind_indexer(TensorBinder& b, const HParams& hp, int il, LayerWeights* lw) {
  if (hp.indexer_source_of(il) != il) return Status::ok();
  const int64_t d = hp.n_embd, Hi = hp.n_indexer_head, di = hp.indexer_head_dim;
  MOESH_ASSIGN_OR_RETURN(lw->idx_wq_b, b.take(blk(il, "indexer.attn_q_b.weight"), {hp.q_lora_rank, Hi * di}));
  MOESH_ASSIGN_OR_RETURN(lw->idx_wk, b.take(blk(il, "indexer.attn_k.weight"), {d, di}));
  MOESH_ASSIGN_OR_RETURN(lw->idx_k_norm, b.take(blk(il, "indexer.k_norm.weight"), {di}));
  MOESH_ASSIGN_OR_RETURN(lw->idx_k_norm_b, b.take(blk(il, "indexer.k_norm.bias"), {di}));
  MOESH_ASSIGN_OR_RETURN(lw->idx_proj, b.take(blk(il, "indexer.proj.weight"), {d, Hi}));
  MOESH_RETURN_IF_ERROR(require_f32(lw->idx_k_norm));
  return require_f32(lw->idx_k_norm_b);
}

namespace {

// libstdc++'s __adjust_heap / __push_heap with the comparison "less" = v[a] > v[b] (a min-heap of
// the values: the front is the smallest kept one).
void adjust_heap(int32_t* h, int32_t hole, int32_t len, int32_t value, const float* v) {
  const int32_t top = hole;
  int32_t child = hole;
  while (child < (len - 1) / 2) {
    child = 2 * (child + 1);
    if (v[h[child]] > v[h[child - 1]]) --child;
    h[hole] = h[child];
    hole = child;
  }
  if ((len & 1) == 0 && child == (len - 2) / 2) {
    child = 2 * (child + 1);
    h[hole] = h[child - 1];
    hole = child - 1;
  }
  int32_t parent = (hole - 1) / 2;
  while (hole > top && v[h[parent]] > v[value]) {
    h[hole] = h[parent];
    hole = parent;
    parent = (hole - 1) / 2;
  }
  h[hole] = value;
}

}  // namespace

void top_k_heap_select(const float* v, int32_t n, int32_t k, int32_t* out) {
  for (int32_t i = 0; i < k; ++i) out[i] = i;
  // make_heap over the first k (libstdc++ __make_heap).
  if (k >= 2) {
    for (int32_t parent = (k - 2) / 2;; --parent) {
      adjust_heap(out, parent, k, out[parent], v);
      if (parent == 0) break;
    }
  }
  // Each later index replaces the front only when strictly larger (__heap_select / __pop_heap).
  for (int32_t i = k; i < n; ++i) {
    if (v[i] > v[out[0]]) adjust_heap(out, 0, k, i, v);
  }
}

void lightning_indexer(Fwd& f, int il, const LayerWeights& lw, const float* xn, const float* qr) {
  const HParams& hp = f.hp;
  const int64_t T = f.batch.n, Hi = hp.n_indexer_head, di = hp.indexer_head_dim;
  const int64_t k_off = hp.kv_lora_rank + hp.n_rot;  // ik's place in the K row
  const int32_t top_k = static_cast<int32_t>(hp.indexer_top_k);
  float* iq = grow(f.s.idx_q, static_cast<size_t>(T * Hi * di));
  float* ik = grow(f.s.idx_k, static_cast<size_t>(T * di));
  float* w = grow(f.s.idx_w, static_cast<size_t>(T * Hi));
  project(f, qr, T, hp.q_lora_rank, {{&lw.idx_wq_b, iq}});
  project(f, xn, T, hp.n_embd, {{&lw.idx_wk, ik}, {&lw.idx_proj, w}});
  const float w_scale = 1.0f / std::sqrt(static_cast<float>(di * Hi));
  for (int64_t t = 0; t < T; ++t) {
    float* ikt = ik + t * di;
    layer_norm_rows(ikt, lw.idx_k_norm, lw.idx_k_norm_b, ikt, 1, di, 0.0f);
    rope(ikt, 1, static_cast<int>(di), static_cast<size_t>(di), f.batch.pos[t], hp.rope);
    rope(iq + t * Hi * di, static_cast<int>(Hi), static_cast<int>(di), static_cast<size_t>(di), f.batch.pos[t],
         hp.rope);
    for (int64_t h = 0; h < Hi; ++h) w[t * Hi + h] = w[t * Hi + h] * w_scale;
    std::copy_n(ikt, di, f.kv.k(f.batch.seq[t], state_layer(f, il), f.batch.cell[t]) + k_off);
  }

  // Per token: score every visible cell, keep the top_k (ascending cell order).
  int32_t* keep = grow(f.s.dsa_keep, static_cast<size_t>(T * top_k));
  int32_t* n_keep = grow(f.s.dsa_n_keep, static_cast<size_t>(T));
  const size_t stride = f.kv.cell_stride();
  int64_t max_cells = 0;
  for (int64_t t = 0; t < T; ++t) max_cells = std::max(max_cells, f.kv.seq_len(f.batch.seq[t]));
  const int n_threads = f.pool != nullptr ? f.pool->n_threads() : 1;
  // Per thread: the token's cell scores, then one chunk of per-head dots.
  constexpr int64_t kChunk = 128;
  const int64_t per_thread = max_cells + Hi * kChunk;
  float* scores_all = grow(f.s.idx_scores, static_cast<size_t>(n_threads * per_thread));
  const AttnKernels& ak = kernels().attn;
  // Margins only for observers (the gate's curation, tests): k-th best minus the next.
  std::vector<float> margins(f.observer != nullptr ? static_cast<size_t>(T) : 0, INFINITY);
  auto body = [&](int64_t t0, int64_t t1, int thread) {
    float* sc = scores_all + static_cast<size_t>(thread) * per_thread;
    float* dots = sc + max_cells;  // [Hi][kChunk]
    for (int64_t t = t0; t < t1; ++t) {
      const int32_t seq = f.batch.seq[t];
      const int64_t* cp = f.kv.positions(seq);
      const int64_t n_cells = f.kv.seq_len(seq);
      int32_t n_vis = 0;
      while (n_vis < n_cells && cp[n_vis] <= f.batch.pos[t]) ++n_vis;
      int32_t* kt = keep + t * top_k;
      if (n_vis <= top_k) {
        for (int32_t c = 0; c < n_vis; ++c) kt[c] = c;
        n_keep[t] = n_vis;
        continue;
      }
      const float* k0 = f.kv.k(seq, state_layer(f, il), 0) + k_off;
      const float* qt = iq + t * Hi * di;
      const float* wt = w + t * Hi;
      // All heads' dots for a chunk of cells in one kernel call (each key row read once for
      // all heads), then per cell the heads summed in double, in head order (ggml_sum_rows).
      for (int64_t ch = 0; ch < n_vis; ch += kChunk) {
        const int64_t n = std::min<int64_t>(kChunk, n_vis - ch);
        ak.scores({.k = k0 + ch * stride,
                   .k_stride = stride,
                   .q = qt,
                   .q_stride = static_cast<size_t>(di),
                   .nq = static_cast<int>(Hi),
                   .dk = di,
                   .c1 = n,
                   .out = dots,
                   .out_stride = kChunk});
        for (int64_t c = 0; c < n; ++c) {
          double s = 0.0;
          for (int64_t h = 0; h < Hi; ++h) s += static_cast<double>(std::max(dots[h * kChunk + c], 0.0f) * wt[h]);
          sc[ch + c] = static_cast<float>(s);
        }
      }
      top_k_heap_select(sc, n_vis, top_k, kt);
      std::sort(kt, kt + top_k);
      n_keep[t] = top_k;
      if (!margins.empty()) {
        float kth = INFINITY, next = -INFINITY;
        for (int32_t j = 0; j < top_k; ++j) kth = std::min(kth, sc[kt[j]]);
        for (int32_t c = 0, j = 0; c < n_vis; ++c) {
          if (j < top_k && kt[j] == c) {
            ++j;
          } else {
            next = std::max(next, sc[c]);
          }
        }
        margins[static_cast<size_t>(t)] = kth - next;
      }
    }
  };
  if (f.pool != nullptr) {
    f.pool->parallel_for(T, [&body](int64_t a, int64_t c, int th) { body(a, c, th); });
  } else {
    body(0, T, 0);
  }
  if (f.observer != nullptr) f.observer->on_selection_margins(il, T, margins.data());
}

}  // namespace moesh::detail
