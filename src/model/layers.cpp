// Shared blocks of the forward pass (see layers.h).
#include "model/layers.h"

#include <algorithm>
#include <cmath>

#include "moesh/tensor/fma_clones.h"
#include "moesh/tensor/quant.h"

namespace moesh::detail {

void rms_norm_rows(const float* x, const TensorView& w, float* y, int64_t n_rows, int64_t n, float eps) {
  const float* wd = w.valid() ? f32(w) : nullptr;
  for (int64_t i = 0; i < n_rows; ++i) rms_norm(x + i * n, wd, y + i * n, n, eps);
}

void project(Fwd& f, const float* x, int64_t n_rows, int64_t k, std::initializer_list<Proj> outs) {
  GgmlType have[3];
  int n_have = 0;
  MatmulQ jobs[3];
  int n_jobs = 0;
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
    jobs[n_jobs++] = MatmulQ{p.w, &f.s.xq[slot], p.y, p.ldy};
  }
  // All outputs in one pool job (decode: q/k/v cost one synchronisation, not three).
  matmul_q_multi(std::span<const MatmulQ>(jobs, static_cast<size_t>(n_jobs)), f.pool);
}

namespace {

// KQ[c] = K_c . q as llama.cpp computes it without flash attention: mul_mat(K, Q) with the
// permuted (non-contiguous) Q of a batch goes to ggml_vec_dot_f32, which on AVX-512 keeps 64
// lanes (element i -> lane i % 64, fused multiply-add), reduces them by a halving tree (32, 16,
// then _mm512_reduce_add_ps: 8, 4, 2, 1) and adds the n % 64 leftovers one by one (contracted
// to fma by the compiler).
MOESH_FMA_CLONES MOESH_VECTORIZE float kq_dot(const float* k, const float* q, int64_t n) {
  float acc[64] = {};
  const int64_t np = n & ~static_cast<int64_t>(63);
  for (int64_t i = 0; i < np; i += 64) {
    for (int l = 0; l < 64; ++l) acc[l] = std::fmaf(k[i + l], q[i + l], acc[l]);
  }
  for (int h = 32; h >= 1; h /= 2) {
    for (int l = 0; l < h; ++l) acc[l] += acc[l + h];
  }
  float sum = acc[0];
  for (int64_t i = np; i < n; ++i) sum = std::fmaf(k[i], q[i], sum);
  return sum;
}

// lanes[(c%16)*dv + d] += V[c][d] * p[c] over the visible cells, in cell order (see
// attention_core). Lane l of output d sees exactly the cells c = l mod 16, in order, as in
// llama.cpp's tinyBLAS kernel; storing the 16 lanes of an output dv floats apart (lane-major)
// rather than side by side makes each cell one contiguous, vectorisable row update.
MOESH_FMA_CLONES MOESH_VECTORIZE void kqv_accumulate(float* lanes, const float* v, size_t stride, const float* p,
                                                     int64_t n_vis, int64_t dv) {
  for (int64_t c = 0; c < n_vis; ++c) {
    const float pc = p[c];
    const float* vc = v + c * stride;
    float* lc = lanes + (c & 15) * dv;
    for (int64_t d = 0; d < dv; ++d) lc[d] = std::fmaf(vc[d], pc, lc[d]);
  }
}

// o[d] = the halving-tree sum of output d's 16 lanes (8, 4, 2, 1), as tinyBLAS reduces them.
MOESH_FMA_CLONES MOESH_VECTORIZE void kqv_reduce(float* lanes, int64_t dv, float* o) {
  for (int h = 8; h >= 1; h /= 2) {
    for (int l = 0; l < h; ++l) {
      float* a = lanes + l * dv;
      const float* b = lanes + (l + h) * dv;
      for (int64_t d = 0; d < dv; ++d) a[d] += b[d];
    }
  }
  std::copy_n(lanes, dv, o);
}

// The softmax row length llama.cpp uses: the KV window padded to whole 16-lane groups (the
// padding is masked, i.e. -inf -> probability 0), so the v_expf/expf split matches.
int64_t padded16(int64_t n) {
  return (n + 15) & ~static_cast<int64_t>(15);
}

}  // namespace

void attention_core(Fwd& f, int il, const float* q, int64_t n_head, int64_t n_head_kv, int64_t dk, int64_t dv,
                    float kq_scale, float* o) {
  const Batch& b = f.batch;
  // Per token: its sequence's cells (all of this step's cells are already appended).
  const size_t T = static_cast<size_t>(b.n);
  const float** k0 = grow(f.s.tok_k0, T);
  const float** v0 = grow(f.s.tok_v0, T);
  const int64_t** cell_pos = grow(f.s.tok_cell_pos, T);
  int64_t* n_cells = grow(f.s.tok_n_cells, T);
  int64_t max_cells = 0;
  for (size_t t = 0; t < T; ++t) {
    if (t > 0 && b.seq[t] == b.seq[t - 1]) {
      k0[t] = k0[t - 1], v0[t] = v0[t - 1], cell_pos[t] = cell_pos[t - 1], n_cells[t] = n_cells[t - 1];
      continue;
    }
    n_cells[t] = f.kv.seq_len(b.seq[t]);
    cell_pos[t] = f.kv.positions(b.seq[t]);
    k0[t] = f.kv.k(b.seq[t], il, 0);
    v0[t] = f.kv.v(b.seq[t], il, 0);
    max_cells = std::max(max_cells, n_cells[t]);
  }
  const int64_t n_pad = padded16(max_cells);
  const int n_threads = f.pool != nullptr ? f.pool->n_threads() : 1;
  float* scores_all = grow(f.s.scores, static_cast<size_t>(n_threads * (n_pad + 16 * dv)));
  const size_t stride = f.kv.cell_stride();
  const int64_t group = n_head / n_head_kv;

  auto body = [&](int64_t i0, int64_t i1, int thread) {
    float* sc = scores_all + static_cast<size_t>(thread) * (n_pad + 16 * dv);
    float* lanes = sc + n_pad;  // [16][dv] accumulators of the KQV product (lane-major)
    for (int64_t item = i0; item < i1; ++item) {
      const int64_t t = item / n_head, h = item % n_head;
      const int64_t g = h / group;
      const float* qh = q + (t * n_head + h) * dk;
      const int64_t pos = b.pos[t];
      // Causal mask: the cells of this sequence at positions <= pos (a prefix: positions grow).
      const int64_t* cp = cell_pos[t];
      int64_t n_vis = 0;
      while (n_vis < n_cells[t] && cp[n_vis] <= pos) ++n_vis;
      const float* kt = k0[t];
      for (int64_t c = 0; c < n_vis; ++c) {
        sc[c] = kq_dot(kt + c * stride + g * dk, qh, dk) * kq_scale;
      }
      const int64_t n_row = padded16(n_vis);
      std::fill(sc + n_vis, sc + n_row, -INFINITY);
      softmax(sc, n_row);
      // KQV = mul_mat(V^T, P): tinyBLAS (F32, AVX-512) gives each output 16 lanes over the cells
      // (cell c -> lane c % 16, fused multiply-add in cell order) and a halving-tree sum. The
      // masked cells have p = 0 and add nothing.
      std::fill(lanes, lanes + 16 * dv, 0.0f);
      kqv_accumulate(lanes, v0[t] + g * dv, stride, sc, n_vis, dv);
      kqv_reduce(lanes, dv, o + (t * n_head + h) * dv);
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
    const int64_t cell = f.batch.cell[t];
    std::copy_n(kt, n_kv * dk, f.kv.k(f.batch.seq[t], il, cell));
    std::copy_n(v + t * n_kv * dv, n_kv * dv, f.kv.v(f.batch.seq[t], il, cell));
  }
  float* o = grow(f.s.o, static_cast<size_t>(T * n_head * dv));
  attention_core(f, il, q, n_head, n_kv, dk, dv, hp.kq_scale, o);
  project(f, o, T, n_head * dv, {{&lw.wo, out}});
}

void dense_ffn(Fwd& f, const TensorView& gate, const TensorView& up, const TensorView& down, const float* x,
               float* out) {
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

Status moe_begin(Fwd& f, int il, const LayerWeights& lw, const float* xn, MoeCall* call) {
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
  if (f.observer != nullptr) {
    f.observer->on_routing(il, T, k, ids, w);
    // Margins cost a second pass over the logits; only observers (the gate, tests) want them.
    std::vector<float> margins(static_cast<size_t>(T)), scratch;
    routing_margins(rc, logits, T, margins.data(), &scratch);
    f.observer->on_routing_margins(il, T, margins.data());
  }

  // THE DISPATCH POINT: routed experts go to the executor; shared experts run meanwhile.
  MOESH_RETURN_IF_ERROR(make_plan(il, ids, w, T, k, hp.n_expert, &f.s.plan));
  call->ticket = f.executor.submit(il, xn, T, f.s.plan);
  call->pending = true;
  call->has_shexp = lw.gate_shexp.valid();
  if (call->has_shexp) {
    float* shexp = grow(f.s.shexp, static_cast<size_t>(T * n_embd));
    dense_ffn(f, lw.gate_shexp, lw.up_shexp, lw.down_shexp, xn, shexp);
  }
  return Status::ok();
}

Status moe_end(Fwd& f, int il, MoeCall* call, float* out) {
  const int64_t T = f.batch.n;
  const int64_t n_embd = f.hp.n_embd;
  const bool has_shexp = call->has_shexp;
  const float* shexp = f.s.shexp.data();
  call->pending = false;
  auto routed = f.executor.wait(call->ticket);
  if (!routed) return routed.status().with_context(fmt::format("layer {} experts", il));
  if (static_cast<int64_t>(routed->size()) != T * n_embd) {
    return make_error(StatusCode::kInternal, "layer {}: executor returned {} floats, expected {}", il, routed->size(),
                      T * n_embd);
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

Status moe_ffn(Fwd& f, int il, const LayerWeights& lw, const float* xn, float* out) {
  MoeCall call;
  MOESH_RETURN_IF_ERROR(moe_begin(f, il, lw, xn, &call));
  return moe_end(f, il, &call, out);
}

}  // namespace moesh::detail
