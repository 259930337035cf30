// MiniMax sparse attention (MSA, minimax-m3): the block indexer and the per-group block selection
// that attention_gqa hands to attention_core (layers.h).
//
// Per token t and KV group g (one indexer head per group):
//   iq_g(t) = rope(rmsnorm(q_proj x)_g ⊙ q_norm),  ik(j) = rope(rmsnorm(k_proj x_j) ⊙ k_norm)
//   B(b)    = max over the cells j of block b = ⌊pos_j / block⌋ with pos_j <= pos_t of iq_g(t) · ik(j)
// (unscaled); the `local` most recent blocks are always taken, the best others fill top_k; the
// query heads of group g attend causally to the cells of the taken blocks only. ik is cached:
// it sits after the K heads in the cache row (HParams::kv_k_width), so it is rolled back, copied
// and kept by span peers with the K/V it belongs to. Each (token, group) is computed alone over
// the cache in cell order, so a token's selection is the same in a batch and one at a time.
#include <algorithm>
#include <cfloat>
#include <cmath>

#include "model/arch.h"
#include "moesh/tensor/kernels.h"

namespace moesh::detail {

Status bind_msa(TensorBinder& b, const HParams& hp, int il, LayerWeights* lw) {
  const int64_t d = hp.n_embd, D = hp.msa.head_dim;
  MOESH_ASSIGN_OR_RETURN(lw->msa_q, b.take(blk(il, "indexer.q_proj.weight"), {d, hp.msa.n_head * D}));
  MOESH_ASSIGN_OR_RETURN(lw->msa_k, b.take(blk(il, "indexer.k_proj.weight"), {d, D}));
  MOESH_ASSIGN_OR_RETURN(lw->msa_q_norm, b.take(blk(il, "indexer.q_norm.weight"), {D}));
  MOESH_ASSIGN_OR_RETURN(lw->msa_k_norm, b.take(blk(il, "indexer.k_norm.weight"), {D}));
  for (const TensorView* t : {&lw->msa_q_norm, &lw->msa_k_norm}) MOESH_RETURN_IF_ERROR(require_f32(*t));
  return Status::ok();
}

void msa_take_blocks(float* bs, int64_t n_blk, int64_t cur, int64_t local, int64_t top_k, int32_t* order,
                     uint8_t* keep) {
  // llama.cpp: rank = score + (forced ? 1e30 : 0); a block is selectable when it has a visible
  // cell (score above -1e30) or is forced. keep: 0 not selectable, 2 selectable, 3 taken.
  for (int64_t b = 0; b < n_blk; ++b) {
    const bool forced = b <= cur && b > cur - local;
    keep[b] = (!(bs[b] <= -1e30f) || forced) ? 2 : 0;
    bs[b] = bs[b] + (forced ? 1e30f : 0.0f);
    order[b] = static_cast<int32_t>(b);
  }
  const int64_t k = std::min(top_k, n_blk);
  // The same algorithm as llama.cpp's (std::partial_sort: libstdc++'s heap select), so exact
  // ties of block scores resolve the same way there and here.
  std::partial_sort(order, order + k, order + n_blk, [bs](int32_t a, int32_t b) { return bs[a] > bs[b]; });
  for (int64_t i = 0; i < k; ++i) {
    if (keep[order[i]] == 0) break;  // sorted descending: fewer selectable blocks than top_k
    keep[order[i]] = 3;
  }
  for (int64_t b = 0; b < n_blk; ++b) keep[b] = keep[b] == 3 ? 1 : 0;
}

void msa_select(Fwd& f, int il, const LayerWeights& lw, const float* xn, AttnCoreOpts* opts) {
  const HParams& hp = f.hp;
  const Batch& bt = f.batch;
  const int64_t T = bt.n;
  const int64_t Hi = hp.msa.n_head, D = hp.msa.head_dim, blk = hp.msa.block;
  const int64_t k_off = hp.n_head_kv * hp.head_dim_k;  // ik follows the K heads in the cache row
  const int64_t layer = state_layer(f, il);

  // 1. iq [T][Hi][D] and ik [T][D] (F32 indexer projections), per-head RMSNorm, RoPE.
  float* iq = grow(f.s.msa_q, static_cast<size_t>(T * (Hi + 1) * D));
  float* ik = iq + T * Hi * D;
  project(f, xn, T, hp.n_embd, {{&lw.msa_q, iq}, {&lw.msa_k, ik}});
  for (int64_t t = 0; t < T; ++t) {
    float* qt = iq + t * Hi * D;
    float* kt = ik + t * D;
    rms_norm_rows(qt, lw.msa_q_norm, qt, Hi, D, hp.rms_eps);
    rms_norm_rows(kt, lw.msa_k_norm, kt, 1, D, hp.rms_eps);
    rope(qt, static_cast<int>(Hi), static_cast<int>(D), static_cast<size_t>(D), bt.pos[t], hp.rope);
    rope(kt, 1, static_cast<int>(D), static_cast<size_t>(D), bt.pos[t], hp.rope);
    std::copy_n(kt, D, f.kv.k(bt.seq[t], layer, bt.cell[t]) + k_off);
  }

  // 2. Per (token, group): block scores over the token's visible cells, then the selection.
  int64_t n_blk_max = 1;
  for (int64_t t = 0; t < T; ++t) n_blk_max = std::max(n_blk_max, bt.pos[t] / blk + 1);
  const int n_threads = f.pool != nullptr ? f.pool->n_threads() : 1;
  // Per thread: block scores per head, then one chunk of cell scores per head.
  constexpr int64_t kChunk = 256;
  const int64_t per_thread = Hi * (n_blk_max + kChunk);
  float* scores_all = grow(f.s.msa_scores, static_cast<size_t>(n_threads * per_thread));
  int32_t* order_all = grow(f.s.msa_order, static_cast<size_t>(n_threads * n_blk_max));
  uint8_t* keep_all = grow(f.s.msa_keep, static_cast<size_t>(T * Hi * n_blk_max));
  const size_t stride = f.kv.cell_stride();
  const AttnKernels& ak = kernels().attn;

  // Items are (token, head); a thread's run of heads of one token is scored in one kernel call
  // per chunk of cells (each key row read once for all of them). A block's score is the max of
  // its cells' (max is exact, so the grouping does not matter).
  auto body = [&](int64_t i0, int64_t i1, int thread) {
    float* bs_all = scores_all + static_cast<size_t>(thread) * per_thread;
    float* cs = bs_all + Hi * n_blk_max;
    int32_t* order = order_all + static_cast<size_t>(thread) * n_blk_max;
    for (int64_t item = i0; item < i1;) {
      const int64_t t = item / Hi, g0 = item % Hi;
      const int64_t g1 = std::min(Hi, g0 + (i1 - item));
      const int64_t pos = bt.pos[t];
      const int64_t n_blk = pos / blk + 1;  // blocks up to the token's own
      const int64_t n_cells = f.kv.seq_len(bt.seq[t]);
      const int64_t* cp = f.kv.positions(bt.seq[t]);
      int64_t n_vis = 0;
      while (n_vis < n_cells && cp[n_vis] <= pos) ++n_vis;
      for (int64_t g = g0; g < g1; ++g) {
        std::fill(bs_all + g * n_blk_max, bs_all + g * n_blk_max + n_blk, -FLT_MAX);  // ggml's max-pool identity
      }
      const float* k0 = f.kv.k(bt.seq[t], layer, 0) + k_off;
      for (int64_t ch = 0; ch < n_vis; ch += kChunk) {
        const int64_t n = std::min(kChunk, n_vis - ch);
        ak.scores({.k = k0 + ch * stride,
                   .k_stride = stride,
                   .q = iq + (t * Hi + g0) * D,
                   .q_stride = static_cast<size_t>(D),
                   .nq = static_cast<int>(g1 - g0),
                   .dk = D,
                   .c1 = n,
                   .out = cs,
                   .out_stride = kChunk});
        for (int64_t g = g0; g < g1; ++g) {
          const float* sg = cs + (g - g0) * kChunk;
          float* bs = bs_all + g * n_blk_max;
          for (int64_t c = 0; c < n; ++c) {
            float& m = bs[cp[ch + c] / blk];
            m = std::max(m, sg[c]);
          }
        }
      }
      for (int64_t g = g0; g < g1; ++g) {
        uint8_t* keep = keep_all + (t * Hi + g) * n_blk_max;
        msa_take_blocks(bs_all + g * n_blk_max, n_blk, pos / blk, hp.msa.local, hp.msa.top_k, order, keep);
        std::fill(keep + n_blk, keep + n_blk_max, 0);
      }
      item += g1 - g0;
    }
  };
  const int64_t n_items = T * Hi;
  if (f.pool != nullptr) {
    f.pool->parallel_for(n_items, [&body](int64_t a, int64_t c, int th) { body(a, c, th); });
  } else {
    body(0, n_items, 0);
  }
  opts->block_keep = keep_all;
  opts->block_size = blk;
  opts->keep_stride = n_blk_max;
}

}  // namespace moesh::detail
