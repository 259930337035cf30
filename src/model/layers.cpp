// Shared blocks of the forward pass (see layers.h).
#include "model/layers.h"

#include <algorithm>
#include <cmath>

#include "moesh/quant.h"

namespace moesh::detail {

void rms_norm_rows(const float* x, const TensorView& w, float* y, int64_t n_rows, int64_t n,
                   float eps) {
  const float* wd = w.valid() ? f32(w) : nullptr;
  for (int64_t i = 0; i < n_rows; ++i) rms_norm(x + i * n, wd, y + i * n, n, eps);
}

void project(Fwd& f, const float* x, int64_t n_rows, int64_t k, std::initializer_list<Proj> outs) {
  GgmlType have[3];
  int n_have = 0;
  for (const Proj& p : outs) {
    const GgmlType t = quant::vec_dot_type(p.w->type);
    int slot = -1;
    for (int i = 0; i < n_have; ++i) {
      if (have[i] == t) slot = i;
    }
    if (slot < 0) {
      slot = n_have++;
      have[slot] = t;
      quantize_rows(t, x, n_rows, k, &f.s.xq[slot], f.pool);
    }
    const size_t ldy = p.ldy != 0 ? p.ldy : static_cast<size_t>(p.w->ne[1]);
    matmul_q(*p.w, f.s.xq[slot], p.y, ldy, f.pool);
  }
}

namespace {

// Dot product with 8 interleaved f32 lanes and a fixed reduction tree: deterministic, and
// written so the compiler can keep the lanes in one vector register.
float dot_f32(const float* a, const float* b, int64_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int j = 0; j < 8; ++j) acc[j] += a[i + j] * b[i + j];
  }
  for (int j = 0; i < n; ++i, ++j) acc[j] += a[i] * b[i];
  return ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
}

}  // namespace

void attention_core(Fwd& f, int il, const float* q, int64_t n_head, int64_t n_head_kv, int64_t dk,
                    int64_t dv, float kq_scale, float* o) {
  const Batch& b = f.batch;
  const int64_t n_cells = f.kv.seq_len(b.seq);
  const int64_t* cell_pos = f.kv.positions(b.seq);
  const int n_threads = f.pool != nullptr ? f.pool->n_threads() : 1;
  float* scores_all = grow(f.s.scores, static_cast<size_t>(n_threads * n_cells));
  const float* k0 = f.kv.k(b.seq, il, 0);
  const float* v0 = f.kv.v(b.seq, il, 0);
  const size_t stride = f.kv.cell_stride();
  const int64_t group = n_head / n_head_kv;

  auto body = [&](int64_t i0, int64_t i1, int thread) {
    float* sc = scores_all + static_cast<size_t>(thread) * n_cells;
    for (int64_t item = i0; item < i1; ++item) {
      const int64_t t = item / n_head, h = item % n_head;
      const int64_t g = h / group;
      const float* qh = q + (t * n_head + h) * dk;
      const int64_t pos = b.pos[t];
      // Causal mask: the cells of this sequence at positions <= pos (a prefix: positions grow).
      int64_t n_vis = 0;
      while (n_vis < n_cells && cell_pos[n_vis] <= pos) ++n_vis;
      for (int64_t c = 0; c < n_vis; ++c) {
        sc[c] = dot_f32(k0 + c * stride + g * dk, qh, dk) * kq_scale;
      }
      softmax(sc, n_vis);
      float* oh = o + (t * n_head + h) * dv;
      std::fill(oh, oh + dv, 0.0f);
      for (int64_t c = 0; c < n_vis; ++c) {
        const float p = sc[c];
        const float* vc = v0 + c * stride + g * dv;
        for (int64_t d = 0; d < dv; ++d) oh[d] += p * vc[d];
      }
    }
  };
  const int64_t n_items = b.n * n_head;
  if (f.pool != nullptr) {
    // Wrapped by reference so the std::function stays in its small buffer (no allocation).
    f.pool->parallel_for(n_items, [&body](int64_t a, int64_t c, int th) { body(a, c, th); });
  } else {
    body(0, n_items, 0);
  }
}

void attention_gqa(Fwd& f, int il, const LayerWeights& lw, const float* xn, float* out) {
  const HParams& hp = f.hp;
  const int64_t T = f.batch.n;
  const int64_t n_head = hp.n_head, n_kv = hp.n_head_kv;
  const int64_t dk = hp.head_dim_k, dv = hp.head_dim_v;
  float* q = grow(f.s.q, static_cast<size_t>(T * n_head * dk));
  float* k = grow(f.s.k, static_cast<size_t>(T * n_kv * dk));
  float* v = grow(f.s.v, static_cast<size_t>(T * n_kv * dv));
  project(f, xn, T, hp.n_embd, {{&lw.wq, q}, {&lw.wk, k}, {&lw.wv, v}});

  for (int64_t t = 0; t < T; ++t) {
    float* qt = q + t * n_head * dk;
    float* kt = k + t * n_kv * dk;
    // qwen3moe: per-head RMSNorm of Q and K before RoPE.
    if (lw.q_norm.valid()) rms_norm_rows(qt, lw.q_norm, qt, n_head, dk, hp.rms_eps);
    if (lw.k_norm.valid()) rms_norm_rows(kt, lw.k_norm, kt, n_kv, dk, hp.rms_eps);
    rope(qt, static_cast<int>(n_head), static_cast<int>(dk), static_cast<size_t>(dk), f.batch.pos[t], hp.rope);
    rope(kt, static_cast<int>(n_kv), static_cast<int>(dk), static_cast<size_t>(dk), f.batch.pos[t], hp.rope);
    const int64_t cell = f.batch.first_cell + t;
    std::copy_n(kt, n_kv * dk, f.kv.k(f.batch.seq, il, cell));
    std::copy_n(v + t * n_kv * dv, n_kv * dv, f.kv.v(f.batch.seq, il, cell));
  }
  float* o = grow(f.s.o, static_cast<size_t>(T * n_head * dv));
  attention_core(f, il, q, n_head, n_kv, dk, dv, hp.kq_scale, o);
  project(f, o, T, n_head * dv, {{&lw.wo, out}});
}

void dense_ffn(Fwd& f, const TensorView& gate, const TensorView& up, const TensorView& down,
               const float* x, float* out) {
  const int64_t T = f.batch.n;
  const int64_t n_ff = gate.ne[1];
  const size_t n = static_cast<size_t>(T * n_ff);
  float* g = grow(f.s.ffn_g, n);
  float* u = grow(f.s.ffn_u, n);
  float* h = grow(f.s.ffn_h, n);
  project(f, x, T, gate.ne[0], {{&gate, g}, {&up, u}});
  swiglu(g, u, h, static_cast<int64_t>(n));
  project(f, h, T, n_ff, {{&down, out}});
}

Status moe_ffn(Fwd& f, int il, const LayerWeights& lw, const float* xn, float* out) {
  const HParams& hp = f.hp;
  const int64_t T = f.batch.n;
  const int64_t n_embd = hp.n_embd;
  const int k = static_cast<int>(hp.n_expert_used);

  // 1. router logits in f32 (the router is never quantized, so neither is its input)
  float* logits = grow(f.s.router_logits, static_cast<size_t>(T * hp.n_expert));
  project(f, xn, T, n_embd, {{&lw.router, logits}});

  // 2-9. gating, selection bias, groups, top-k, weights
  RouterConfig rc;
  rc.gating = hp.gating;
  rc.n_expert = static_cast<int>(hp.n_expert);
  rc.k = k;
  rc.sel_bias = lw.exp_probs_b.valid() ? f32(lw.exp_probs_b) : nullptr;
  rc.n_group = static_cast<int>(hp.n_group);
  rc.n_group_used = static_cast<int>(hp.n_group_used);
  rc.norm_w = hp.norm_w;
  rc.w_scale = hp.w_scale;
  int32_t* ids = grow(f.s.moe_ids, static_cast<size_t>(T * k));
  float* w = grow(f.s.moe_w, static_cast<size_t>(T * k));
  route(rc, logits, T, ids, w, &f.s.route_scratch);
  if (f.observer != nullptr) f.observer->on_routing(il, T, k, ids, w);

  // THE DISPATCH POINT: routed experts go to the executor; shared experts run meanwhile.
  MOESH_RETURN_IF_ERROR(make_plan(il, ids, w, T, k, hp.n_expert, &f.s.plan));
  const Ticket ticket = f.executor.submit(il, xn, T, f.s.plan);
  const bool has_shexp = lw.gate_shexp.valid();
  float* shexp = nullptr;
  if (has_shexp) {
    shexp = grow(f.s.shexp, static_cast<size_t>(T * n_embd));
    dense_ffn(f, lw.gate_shexp, lw.up_shexp, lw.down_shexp, xn, shexp);
  }
  auto routed = f.executor.wait(ticket);
  if (!routed) return routed.status().with_context(fmt::format("layer {} experts", il));
  if (static_cast<int64_t>(routed->size()) != T * n_embd) {
    return make_error(StatusCode::kInternal, "layer {}: executor returned {} floats, expected {}",
                      il, routed->size(), T * n_embd);
  }
  const float* r = routed->data();
  // MoE output first, then the shared expert (llama.cpp: moe_out + shexp).
  if (has_shexp) {
    for (int64_t i = 0; i < T * n_embd; ++i) out[i] = r[i] + shexp[i];
  } else {
    std::copy_n(r, T * n_embd, out);
  }
  return Status::ok();
}

}  // namespace moesh::detail
