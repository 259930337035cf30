// Shared blocks of the forward pass (see layers.h).
#include <algorithm>
#include <cmath>

#include "model/arch.h"
#include "moesh/tensor/fma_clones.h"
#include "moesh/tensor/fp16.h"
#include "moesh/tensor/kernels.h"
#include "moesh/tensor/quant.h"

namespace moesh::detail {

void rms_norm_rows(const float* x, const TensorView& w, float* y, int64_t n_rows, int64_t n, float eps) {
  const float* wd = w.valid() ? f32(w) : nullptr;
  for (int64_t i = 0; i < n_rows; ++i) rms_norm(x + i * n, wd, y + i * n, n, eps);
}

void layer_norm_rows(const float* x, const TensorView& w, const TensorView& b, float* y, int64_t n_rows, int64_t n,
                     float eps) {
  const float* wd = w.valid() ? f32(w) : nullptr;
  const float* bd = b.valid() ? f32(b) : nullptr;
  for (int64_t i = 0; i < n_rows; ++i) {
    const float* xi = x + i * n;
    float* yi = y + i * n;
    double sum = 0.0;
    for (int64_t j = 0; j < n; ++j) sum += static_cast<double>(xi[j]);
    const float mean = static_cast<float>(sum / static_cast<double>(n));
    double sum2 = 0.0;
    for (int64_t j = 0; j < n; ++j) {
      const float v = xi[j] - mean;
      yi[j] = v;
      sum2 += static_cast<double>(v * v);
    }
    const float scale = 1.0f / std::sqrt(static_cast<float>(sum2 / static_cast<double>(n)) + eps);
    for (int64_t j = 0; j < n; ++j) yi[j] = yi[j] * scale;
    // Weight and bias as separate ops (ggml_mul, ggml_add), as llama.cpp's build_norm applies them.
    if (wd != nullptr) {
      for (int64_t j = 0; j < n; ++j) yi[j] = yi[j] * wd[j];
    }
    if (bd != nullptr) {
      for (int64_t j = 0; j < n; ++j) yi[j] = yi[j] + bd[j];
    }
  }
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

// KQ[c] = K_c . q as llama.cpp computes it without flash attention: mul_mat(K, Q) with the
// permuted (non-contiguous) Q of a batch goes to ggml_vec_dot_f32, which on AVX-512 keeps 64
// lanes (element i -> lane i % 64, fused multiply-add), reduces them by a halving tree (32, 16,
// then _mm512_reduce_add_ps: 8, 4, 2, 1) and adds the n % 64 leftovers one by one (contracted
// to fma by the compiler). The kernel table's attention scores are that order for every ISA
// (tested bit for bit against the scalar reference); one call = one cell.
float dot_f32_ggml(const float* k, const float* q, int64_t n) {
  float out = 0.0f;
  kernels().attn.scores({.k = k, .q = q, .dk = n, .c1 = 1, .out = &out});
  return out;
}

namespace {

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

// One query row of ggml's CPU flash attention (ggml_compute_forward_flash_attn_ext_f16_one_chunk)
// with F16 K and V: Q converted to F16; s = ggml_vec_dot_f16 (F32 fused multiply-adds in 4
// accumulators of 8 lanes, pairwise reduced) * scale; online softmax whose V accumulator is F16
// (ggml_vec_scale_f16 / ggml_vec_mad_f16 round every update); out = VKQ * (1/S). scratch: dk + dv
// floats.
MOESH_FMA_CLONES void fa_f16_row(const float* q, const float* k, const float* v, size_t stride, int64_t n_vis,
                                 int64_t dk, int64_t dv, float scale, float* scratch, float* out) {
  auto r16 = [](float x) { return fp16_to_fp32(fp32_to_fp16(x)); };
  float* q16 = scratch;
  float* acc = scratch + dk;  // the F16 accumulator, held as F16-representable floats
  for (int64_t i = 0; i < dk; ++i) q16[i] = r16(q[i]);
  std::fill(acc, acc + dv, 0.0f);
  float S = 0.0f, M = -INFINITY;
  for (int64_t c = 0; c < n_vis; ++c) {
    const float* kc = k + c * stride;
    float lanes[4][8] = {};
    const int64_t np = dk & ~static_cast<int64_t>(31);
    for (int64_t i = 0; i < np; i += 32) {
      for (int j = 0; j < 4; ++j) {
        for (int l = 0; l < 8; ++l) lanes[j][l] = std::fmaf(kc[i + j * 8 + l], q16[i + j * 8 + l], lanes[j][l]);
      }
    }
    for (int l = 0; l < 8; ++l) {
      lanes[0][l] += lanes[2][l];
      lanes[1][l] += lanes[3][l];
    }
    for (int l = 0; l < 8; ++l) lanes[0][l] += lanes[1][l];
    float t0[4];
    for (int l = 0; l < 4; ++l) t0[l] = lanes[0][l] + lanes[0][l + 4];
    double sum = static_cast<double>((t0[0] + t0[1]) + (t0[2] + t0[3]));
    for (int64_t i = np; i < dk; ++i) sum += static_cast<double>(kc[i] * q16[i]);
    const float s = static_cast<float>(sum) * scale;
    const float Mold = M;
    float ms = 1.0f, vs = 1.0f;
    if (s > M) {
      M = s;
      ms = std::exp(Mold - M);
      for (int64_t d = 0; d < dv; ++d) acc[d] = r16(acc[d] * ms);
    } else {
      vs = std::exp(s - M);
    }
    const float* vc = v + c * stride;
    for (int64_t d = 0; d < dv; ++d) acc[d] = r16(std::fmaf(vc[d], vs, acc[d]));
    S = S * ms + vs;
  }
  const float inv = S == 0.0f ? 0.0f : 1.0f / S;
  for (int64_t d = 0; d < dv; ++d) out[d] = acc[d] * inv;
}

}  // namespace

void attention_core(Fwd& f, int il, const float* q, int64_t n_head, int64_t n_head_kv, int64_t dk, int64_t dv,
                    float kq_scale, float* o, const AttnCoreOpts& opts) {
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
    k0[t] = f.kv.k(b.seq[t], state_layer(f, il), 0);
    v0[t] = f.kv.v(b.seq[t], state_layer(f, il), 0);
    max_cells = std::max(max_cells, n_cells[t]);
  }
  const int64_t n_pad = padded16(max_cells);
  const int n_threads = f.pool != nullptr ? f.pool->n_threads() : 1;
  const size_t stride = f.kv.cell_stride();
  const int64_t group = n_head / n_head_kv;
  const AttnKernels& ak = kernels().attn;
  // Per thread: a score row per head of a KV group, then each head's KQV lanes.
  const int64_t per_thread = group * (n_pad + 16 * dv);
  float* scores_all = grow(f.s.scores, static_cast<size_t>(n_threads * per_thread));

  auto body = [&](int64_t i0, int64_t i1, int thread) {
    float* sc = scores_all + static_cast<size_t>(thread) * per_thread;
    if (opts.fa_f16) {
      for (int64_t item = i0; item < i1; ++item) {
        const int64_t t = item / n_head, h = item % n_head;
        const int64_t g = h / group;
        const int64_t* cp = cell_pos[t];
        int64_t n_vis = 0;
        while (n_vis < n_cells[t] && cp[n_vis] <= b.pos[t]) ++n_vis;
        fa_f16_row(q + (t * n_head + h) * dk, k0[t] + g * dk, v0[t] + g * dv, stride, n_vis, dk, dv, kq_scale, sc,
                   o + (t * n_head + h) * dv);
      }
      return;
    }
    float* lanes = sc + group * n_pad;  // per head of the group: [16][dv] KQV accumulators (lane-major)
    // Dense attention takes the heads of a KV group in this range together: their scores in one
    // kernel call (each key row read once for all of them), their KQV over the same chunk of V
    // rows while it is in cache. Sparse masks go one head at a time. Either way every score is
    // the same dot and every KQV lane sees its cells in the same order, so the bits do not depend
    // on the grouping (nor on how the heads were split between threads).
    const bool dense = opts.block_keep == nullptr && opts.cell_keep == nullptr;
    for (int64_t item = i0; item < i1;) {
      const int64_t t = item / n_head, h = item % n_head;
      const int64_t g = h / group;
      // heads h .. h + nh - 1, all of KV group g
      const int64_t nh = dense ? std::min(group - h % group, i1 - item) : 1;
      const float* qh = q + (t * n_head + h) * dk;
      const int64_t pos = b.pos[t];
      // Causal mask: the cells of this sequence at positions <= pos (a prefix: positions grow).
      const int64_t* cp = cell_pos[t];
      int64_t n_vis = 0;
      while (n_vis < n_cells[t] && cp[n_vis] <= pos) ++n_vis;
      // Sliding window: cells before pos - window + 1 are masked (-inf, probability 0). The row
      // still starts at a multiple of 16 so softmax's 16-groups line up with llama.cpp's full
      // row; groups that are wholly masked add exactly 0 and are skipped.
      int64_t min_pos = 0;
      if (opts.window > 0) min_pos = pos - opts.window + 1;
      if (opts.chunk > 0) min_pos = std::max(min_pos, pos / opts.chunk * opts.chunk);
      int64_t c0 = 0;
      while (c0 < n_vis && cp[c0] < min_pos) ++c0;
      const int64_t base = c0 & ~static_cast<int64_t>(15);
      const int64_t n_row = padded16(n_vis);
      AttnScores as{.k = k0[t] + g * dk,
                    .k_stride = stride,
                    .q = qh,
                    .q_stride = static_cast<size_t>(dk),
                    .nq = static_cast<int>(nh),
                    .dk = dk,
                    .scale = kq_scale,
                    .out = sc,
                    .out_stride = static_cast<size_t>(n_pad)};
      for (int64_t j = 0; j < nh; ++j) {
        std::fill(sc + j * n_pad + base, sc + j * n_pad + c0, -INFINITY);
        std::fill(sc + j * n_pad + n_vis, sc + j * n_pad + n_row, -INFINITY);
      }
      // Scores over runs of visible cells (all of [c0, n_vis) when dense); masked cells -inf.
      auto score_run = [&](int64_t r0, int64_t r1) {
        as.c0 = r0;
        as.c1 = r1;
        ak.scores(as);
      };
      if (opts.block_keep != nullptr) {
        // Block-sparse (MSA): cells of blocks the query's group did not take are masked.
        const uint8_t* keep = opts.block_keep + (t * n_head_kv + g) * opts.keep_stride;
        for (int64_t c = c0; c < n_vis;) {
          int64_t e = c;
          const bool kept = keep[cp[c] / opts.block_size] != 0;
          while (e < n_vis && (keep[cp[e] / opts.block_size] != 0) == kept) ++e;
          if (kept) {
            score_run(c, e);
          } else {
            std::fill(sc + c, sc + e, -INFINITY);
          }
          c = e;
        }
      } else if (opts.cell_keep != nullptr) {
        // Token-sparse (glm-dsa): only the cells the lightning indexer kept; masked cells get
        // probability 0 and add exactly nothing to the KQV lanes.
        std::fill(sc + c0, sc + n_vis, -INFINITY);
        const int32_t* keep = opts.cell_keep + t * opts.cell_keep_stride;
        const int32_t n_keep = opts.cell_n_keep[t];
        for (int32_t j = 0; j < n_keep;) {
          int32_t e = j + 1;
          while (e < n_keep && keep[e] == keep[e - 1] + 1) ++e;
          score_run(std::max<int64_t>(keep[j], c0), std::min<int64_t>(keep[e - 1] + 1, n_vis));
          j = e;
        }
      } else {
        score_run(c0, n_vis);
      }
      for (int64_t j = 0; j < nh; ++j) {
        softmax(sc + j * n_pad + base, n_row - base, opts.sinks != nullptr ? opts.sinks + h + j : nullptr);
      }
      // KQV = mul_mat(V^T, P): tinyBLAS (F32, AVX-512) gives each output 16 lanes over the cells
      // (cell c -> lane c % 16, fused multiply-add in cell order) and a halving-tree sum. The
      // masked cells have p = 0 and add nothing. The group's heads go in one call, so the kernel
      // can read each chunk of V rows once for all of them.
      std::fill(lanes, lanes + nh * 16 * dv, 0.0f);
      ak.kqv({.lanes = lanes,
              .lanes_stride = static_cast<size_t>(16 * dv),
              .v = v0[t] + g * dv,
              .v_stride = stride,
              .p = sc,
              .p_stride = static_cast<size_t>(n_pad),
              .nh = static_cast<int>(nh),
              .c0 = c0,
              .c1 = n_vis,
              .dv = dv});
      for (int64_t j = 0; j < nh; ++j) kqv_reduce(lanes + j * 16 * dv, dv, o + (t * n_head + h + j) * dv);
      item += nh;
    }
  };
  const int64_t n_items = b.n * n_head;
  if (f.pool != nullptr) {
    // Causal rows cost as many cells as their position: a contiguous split of a prompt's rows
    // gave one of two threads 3/4 of the work. Threads take one token's heads at a time,
    // latest (longest) tokens first, so the pieces left at the end are the short ones. With
    // few tokens (decode) a token's heads are split too, else one thread would read a long
    // context alone: into whole KV groups where that still leaves two pieces per thread.
    // Wrapped by reference so the std::function stays in its small buffer (no allocation).
    int64_t piece = n_head;
    if (b.n < 2 * n_threads) {
      piece = std::clamp<int64_t>(n_items / (2 * n_threads), 1, n_head);
      if (piece >= group) piece = piece / group * group;
    }
    f.pool->parallel_for_dynamic(
        n_items, [&body, n_items](int64_t a, int64_t c, int th) { body(n_items - c, n_items - a, th); }, piece);
  } else {
    body(0, n_items, 0);
  }
}

void attention_gqa(Fwd& f, int il, const LayerWeights& lw, const float* xn, float* out) {
  const HParams& hp = f.hp;
  const int64_t T = f.batch.n;
  const int64_t n_head = hp.n_head_of(il), n_kv = hp.n_head_kv;
  const int64_t dk = hp.head_dim_k, dv = hp.head_dim_v;
  // Sliding-window blocks may have their own RoPE (step35: another base, the whole head).
  const RopeParams& rope_p = lw.swa && hp.rope_swa_own ? hp.rope_swa : hp.rope;
  const int64_t q_width = n_head * dk * (hp.q_gated ? 2 : 1);
  float* qp = grow(f.s.qa, static_cast<size_t>(T * q_width));
  float* k = grow(f.s.k, static_cast<size_t>(T * n_kv * dk));
  float* v = grow(f.s.v, static_cast<size_t>(T * n_kv * dv));
  project(f, xn, T, hp.n_embd, {{&lw.wq, qp}, {&lw.wk, k}, {&lw.wv, v}});
  // Biases are separate adds after the matmuls (ggml_add), as in llama.cpp.
  auto add_bias = [T](float* y, const TensorView& b, int64_t n) {
    if (!b.valid()) return;
    const float* bd = f32(b);
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t i = 0; i < n; ++i) y[t * n + i] = y[t * n + i] + bd[i];
    }
  };
  add_bias(qp, lw.bq, q_width);
  add_bias(k, lw.bk, n_kv * dk);
  add_bias(v, lw.bv, n_kv * dv);

  // A gated query (qwen3next) holds [query | gate] per head: split into q and the gate.
  float* q = qp;
  float* gate = nullptr;
  if (hp.q_gated) {
    q = grow(f.s.q, static_cast<size_t>(T * n_head * dk));
    gate = grow(f.s.o2, static_cast<size_t>(T * n_head * dk));
    for (int64_t r = 0; r < T * n_head; ++r) {
      std::copy_n(qp + r * 2 * dk, dk, q + r * dk);
      std::copy_n(qp + r * 2 * dk + dk, dk, gate + r * dk);
    }
  }

  const int nh = static_cast<int>(n_head), nkv = static_cast<int>(n_kv), idk = static_cast<int>(dk);
  for (int64_t t = 0; t < T; ++t) {
    float* qt = q + t * n_head * dk;
    float* kt = k + t * n_kv * dk;
    switch (hp.qk_norm) {
      case QkNorm::kPerHead:  // qwen3moe, glm4moe, qwen3next: per head, before RoPE
        rms_norm_rows(qt, lw.q_norm, qt, n_head, dk, hp.rms_eps);
        rms_norm_rows(kt, lw.k_norm, kt, n_kv, dk, hp.rms_eps);
        break;
      case QkNorm::kFull:  // minimax-m2: over the whole projection, before the head split
        rms_norm_rows(qt, lw.q_norm, qt, 1, n_head * dk, hp.rms_eps);
        rms_norm_rows(kt, lw.k_norm, kt, 1, n_kv * dk, hp.rms_eps);
        break;
      default:
        break;
    }
    if (lw.rope) {
      rope(qt, nh, idk, static_cast<size_t>(dk), f.batch.pos[t], rope_p);
      rope(kt, nkv, idk, static_cast<size_t>(dk), f.batch.pos[t], rope_p);
      if (hp.qk_norm == QkNorm::kUnweighted) {  // llama4: after RoPE, no weight, RoPE layers only
        rms_norm_rows(qt, TensorView{}, qt, n_head, dk, hp.rms_eps);
        rms_norm_rows(kt, TensorView{}, kt, n_kv, dk, hp.rms_eps);
      }
    } else if (hp.attn_temp_scale > 0.0f) {
      // llama4 NoPE layers: Q *= 1 + s * ln(floor((pos + 1) / floor_scale) + 1) (1 below floor_scale).
      const float scale =
          1.0f +
          hp.attn_temp_scale * std::log(std::floor(static_cast<float>(f.batch.pos[t] + 1) / hp.attn_temp_floor) + 1.0f);
      for (int64_t i = 0; i < n_head * dk; ++i) qt[i] = qt[i] * scale;
    }
    const int64_t cell = f.batch.cell[t];
    float* vt = v + t * n_kv * dv;
    if (lw.kv_f16) {
      for (int64_t i = 0; i < n_kv * dk; ++i) kt[i] = fp16_to_fp32(fp32_to_fp16(kt[i]));
      for (int64_t i = 0; i < n_kv * dv; ++i) vt[i] = fp16_to_fp32(fp32_to_fp16(vt[i]));
    }
    std::copy_n(kt, n_kv * dk, f.kv.k(f.batch.seq[t], state_layer(f, il), cell));
    std::copy_n(vt, n_kv * dv, f.kv.v(f.batch.seq[t], state_layer(f, il), cell));
  }
  float* o = grow(f.s.o, static_cast<size_t>(T * n_head * dv));
  AttnCoreOpts opts;
  if (lw.swa) (hp.swa_chunked ? opts.chunk : opts.window) = hp.n_swa;
  opts.sinks = lw.sinks.valid() ? f32(lw.sinks) : nullptr;
  if (lw.msa_q.valid()) msa_select(f, il, lw, xn, &opts);  // minimax-m3: block-sparse
  // Reference mode only (LoadOptions::llama_fa_batches): llama.cpp's kernel for short batches.
  opts.fa_f16 = lw.kv_f16 && f.model.options().llama_fa_batches && T < 64;
  attention_core(f, il, q, n_head, n_kv, dk, dv, hp.kq_scale, o, opts);
  if (gate != nullptr) {
    for (int64_t i = 0; i < T * n_head * dv; ++i) o[i] = o[i] * sigmoid(gate[i]);
  }
  if (lw.head_gate.valid()) {
    // One gate per head (step35): o_h *= sigmoid(attn_gate_h · x), x the attn-normed input
    // (llama.cpp: mul_mat, ggml_sigmoid, a broadcast ggml_mul).
    float* hg = grow(f.s.tmp, static_cast<size_t>(T * n_head));
    project(f, xn, T, hp.n_embd, {{&lw.head_gate, hg}});
    for (int64_t r = 0; r < T * n_head; ++r) {
      const float g = sigmoid(hg[r]);
      for (int64_t d = 0; d < dv; ++d) o[r * dv + d] = o[r * dv + d] * g;
    }
  }
  project(f, o, T, n_head * dv, {{&lw.wo, out}});
  add_bias(out, lw.bo, hp.n_embd);
}

void dense_ffn(Fwd& f, const TensorView& gate, const TensorView& up, const TensorView& down, const float* x, float* out,
               float limit, ExpertActivation act) {
  const int64_t T = f.batch.n;
  const int64_t n_ff = gate.ne[1];
  const size_t n = static_cast<size_t>(T * n_ff);
  float* g = grow(f.s.ffn_g, n);
  float* u = grow(f.s.ffn_u, n);
  float* h = grow(f.s.ffn_h, n);
  project(f, x, T, gate.ne[0], {{&gate, g}, {&up, u}});
  if (act == ExpertActivation::kSwigluOai) {
    swiglu_oai(g, u, h, static_cast<int64_t>(n));
  } else if (act == ExpertActivation::kSitu) {
    situ(g, u, h, static_cast<int64_t>(n), f.hp.expert_ffn.situ_beta, f.hp.expert_ffn.situ_linear_beta);
  } else if (limit > 0.0f) {
    swiglu_limited(g, u, h, static_cast<int64_t>(n), limit);
  } else {
    swiglu(g, u, h, static_cast<int64_t>(n));
  }
  project(f, h, T, n_ff, {{&down, out}});
}

namespace {

// One router logit as llama.cpp computes it for a batch on x86 (AVX-512, the reference
// machine): mul_mat(ffn_gate_inp, x) with F32 weights and F32 activations is taken by
// llamafile's tinyBLAS (ggml-cpu/llamafile/sgemm.cpp, tinyBLAS::gemm_bloc, KN = 16 floats per
// __m512): element i -> lane i % 16, fused multiply-add in element order, then
// _mm512_reduce_add_ps, a halving tree (8, 4, 2, 1). Requires n % 16 == 0.
MOESH_FMA_CLONES MOESH_VECTORIZE float router_dot16(const float* w, const float* x, int64_t n) {
  float acc[16] = {};
  for (int64_t i = 0; i < n; i += 16) {
    for (int l = 0; l < 16; ++l) acc[l] = std::fmaf(w[i + l], x[i + l], acc[l]);
  }
  for (int h = 8; h >= 1; h /= 2) {
    for (int l = 0; l < h; ++l) acc[l] += acc[l + h];
  }
  return acc[0];
}

// Router logits [T][n_expert]. moesh's canonical F32 dot (32 lanes, quant.h) differs from
// tinyBLAS in the last bit for about 2/3 of the logits, so the mixing weights differed by an ulp
// and the residual stream by ulps at nearly every token; Q8_0/Q8_K activation quantization
// hides that until one value sits on a rounding boundary, and from there the logits drift
// (~1e-2, at that and every later position). tinyBLAS takes the matmul when n_embd % 16 == 0
// and n_expert % 4 == 0 (else ggml's vec_dot_f32: the 64-lane order of dot_f32_ggml). llama.cpp uses
// vec_dot_f32 for a single token too; we keep the batch order for every T, so a token's
// routing does not depend on its batch (decode == batch bit for bit).
void router_logits(Fwd& f, const TensorView& router, const float* xn, int64_t T, int64_t n_embd, float* logits) {
  if (router.type != GgmlType::F32) {
    project(f, xn, T, n_embd, {{&router, logits}});
    return;
  }
  const int64_t n_expert = router.ne[1];
  const bool tinyblas = n_embd % 16 == 0 && n_expert % 4 == 0;
  auto body = [&](int64_t i0, int64_t i1, int) {
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t t = i / n_expert, e = i % n_expert;
      const float* w = reinterpret_cast<const float*>(router.row(e));
      logits[i] = tinyblas ? router_dot16(w, xn + t * n_embd, n_embd) : dot_f32_ggml(w, xn + t * n_embd, n_embd);
    }
  };
  if (f.pool != nullptr) {
    f.pool->parallel_for(
        T * n_expert, [&body](int64_t a, int64_t c, int th) { body(a, c, th); }, n_expert);
  } else {
    body(0, T * n_expert, 0);
  }
}

}  // namespace

Status moe_begin(Fwd& f, int il, const LayerWeights& lw, const float* xn, MoeCall* call) {
  const HParams& hp = f.hp;
  const int64_t T = f.batch.n;
  const int64_t n_embd = hp.n_embd;
  const int k = static_cast<int>(hp.n_expert_used);

  // 1. router logits in f32 (the router is never quantized, so neither is its input), + bias
  float* logits = grow(f.s.router_logits, static_cast<size_t>(T * hp.n_expert));
  router_logits(f, lw.router, xn, T, n_embd, logits);
  if (lw.router_b.valid()) {
    const float* b = f32(lw.router_b);
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t e = 0; e < hp.n_expert; ++e) logits[t * hp.n_expert + e] = logits[t * hp.n_expert + e] + b[e];
    }
  }

  // 2-9. gating, selection bias, groups, top-k, weights
  const RouterConfig rc = hp.router_config(lw.exp_probs_b.valid() ? f32(lw.exp_probs_b) : nullptr);
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

  // Latent MoE: the experts take z = ffn_routed_down · x (the router read x).
  const float* x_exp = xn;
  const int64_t dx = hp.n_embd_exp();
  call->latent = nullptr;
  if (lw.ffn_routed_down.valid()) {
    float* z = grow(f.s.moe_z, static_cast<size_t>(T * dx));
    project(f, xn, T, n_embd, {{&lw.ffn_routed_down, z}});
    x_exp = z;
    call->latent = &lw;
  }

  // THE DISPATCH POINT: routed experts go to the executor; shared experts run meanwhile.
  call->input_scaled = hp.expert_ffn.input_scaled;
  if (call->input_scaled) {
    // llama4: the weight multiplies the expert's input and the outputs are summed unweighted.
    // Each (token, rank) becomes its own row w·x with one expert of weight 1, so executors and
    // workers run ordinary rows; moe_end sums a token's k rows in rank order.
    float* xs = grow(f.s.moe_x, static_cast<size_t>(T * k * dx));
    for (int64_t t = 0; t < T; ++t) {
      for (int j = 0; j < k; ++j) {
        float* row = xs + (t * k + j) * dx;
        const float wj = w[t * k + j];
        for (int64_t d = 0; d < dx; ++d) row[d] = x_exp[t * dx + d] * wj;
      }
    }
    float* ones = grow(f.s.moe_ones, static_cast<size_t>(T * k));
    std::fill(ones, ones + T * k, 1.0f);
    MOESH_RETURN_IF_ERROR(make_plan(il, ids, ones, T * k, 1, hp.n_expert, &f.s.plan));
    call->ticket = f.executor.submit(il, xs, T * k, f.s.plan);
  } else {
    MOESH_RETURN_IF_ERROR(make_plan(il, ids, w, T, k, hp.n_expert, &f.s.plan));
    call->ticket = f.executor.submit(il, x_exp, T, f.s.plan);
  }
  call->pending = true;
  call->k = k;
  call->has_shexp = lw.gate_shexp.valid();
  if (call->has_shexp) {
    float* shexp = grow(f.s.shexp, static_cast<size_t>(T * n_embd));
    dense_ffn(f, lw.gate_shexp, lw.up_shexp, lw.down_shexp, xn, shexp, lw.swiglu_limit, lw.ffn_act);
    if (lw.shexp_gate.valid()) {
      // qwen3next / qwen35moe: shexp *= sigmoid(ffn_gate_inp_shexp · x), one scalar per token.
      TensorView g = lw.shexp_gate;  // [n_embd] used as an [n_embd, 1] matrix
      g.ne[1] = 1;
      g.n_dims = 2;
      g.set_contiguous_strides();
      float* gl = grow(f.s.shexp_gl, static_cast<size_t>(T));
      // An F32 matrix of one row: llama.cpp takes ggml_vec_dot_f32 (tinyBLAS needs rows % 4 == 0).
      router_logits(f, g, xn, T, n_embd, gl);
      for (int64_t t = 0; t < T; ++t) {
        const float sg = sigmoid(gl[t]);
        for (int64_t d = 0; d < n_embd; ++d) shexp[t * n_embd + d] = shexp[t * n_embd + d] * sg;
      }
    }
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
  const int64_t rows = call->input_scaled ? T * call->k : T;
  const int64_t dx = f.hp.n_embd_exp();
  if (static_cast<int64_t>(routed->size()) != rows * dx) {
    return make_error(StatusCode::kInternal, "layer {}: executor returned {} floats, expected {}", il, routed->size(),
                      rows * dx);
  }
  const float* r = routed->data();
  if (call->input_scaled) {
    // Σ_j expert_j(w_j x) in rank order (weight 1: the same adds as llama.cpp's moe_out chain).
    float* sum = grow(f.s.moe_sum, static_cast<size_t>(T * dx));
    for (int64_t t = 0; t < T; ++t) {
      for (int j = 0; j < call->k; ++j) {
        rank_sum_step(sum + t * dx, r + (t * call->k + j) * dx, 1.0f, dx, j == 0);
      }
    }
    r = sum;
  }
  if (call->latent != nullptr) {
    // Latent MoE: back to n_embd through the norm and the up-projection (the backbone's own).
    const LayerWeights& lw = *call->latent;
    float* zn = grow(f.s.moe_zn, static_cast<size_t>(T * dx));
    rms_norm_rows(r, lw.ffn_routed_norm, zn, T, dx, f.hp.rms_eps);
    float* up = grow(f.s.moe_up, static_cast<size_t>(T * n_embd));
    project(f, zn, T, dx, {{&lw.ffn_routed_up, up}});
    r = up;
  }
  // MoE output first, then the shared expert (llama.cpp: moe_out + shexp).
  if (has_shexp) {
    for (int64_t i = 0; i < T * n_embd; ++i) out[i] = r[i] + shexp[i];
  } else {
    std::copy_n(r, T * n_embd, out);
  }
  return Status::ok();
}

void residual_mix(Fwd& f, int64_t n_ckpt, const float* cur, const TensorView& w, float* out) {
  const int64_t T = f.batch.n, D = f.hp.n_embd;
  if (n_ckpt <= 0) {
    if (out != cur) std::copy_n(cur, T * D, out);
    return;
  }
  const float* wd = f32(w);
  const float* stack = f.s.res_stack.data();
  float* sc = grow(f.s.res_scores, static_cast<size_t>(n_ckpt + 1 + D));
  float* tmp = sc + n_ckpt + 1;
  // σ = Σ_d rmsnorm(x)_d · w_d: ggml_rms_norm, ggml_mul, then ggml_sum_rows (a double sum).
  auto score = [&](const float* x) {
    rms_norm(x, nullptr, tmp, D, f.hp.rms_eps);
    double s = 0.0;
    for (int64_t d = 0; d < D; ++d) s += static_cast<double>(tmp[d] * wd[d]);
    return static_cast<float>(s);
  };
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t i = 0; i < n_ckpt; ++i) sc[i] = score(stack + (i * T + t) * D);
    sc[n_ckpt] = score(cur + t * D);
    softmax(sc, n_ckpt + 1);
    const float p_cur = sc[n_ckpt];
    // ggml_dsv4_hc_pre (fused multiply-adds over the checkpoints), then + cur·π_cur (ggml_mul, ggml_add).
    for (int64_t d = 0; d < D; ++d) {
      float s = 0.0f;
      for (int64_t i = 0; i < n_ckpt; ++i) s = std::fmaf(stack[(i * T + t) * D + d], sc[i], s);
      out[t * D + d] = s + cur[t * D + d] * p_cur;
    }
  }
}

void pack_span_rows(Fwd& f, const float* h, int64_t il, float* rows) {
  const HParams& hp = f.hp;
  const int64_t T = f.batch.n, D = hp.n_embd, n_ckpt = hp.residual_ckpts_before(il), W = hp.span_row_width(il);
  const float* stack = f.s.res_stack.data();
  const bool sel = hp.carries_selection(il);
  const int64_t K = hp.indexer_top_k;
  for (int64_t t = 0; t < T; ++t) {
    float* row = rows + t * W;
    std::copy_n(h + t * D, D, row);
    for (int64_t c = 0; c < n_ckpt; ++c) std::copy_n(stack + (c * T + t) * D, D, row + (1 + c) * D);
    if (!sel) continue;
    float* out = row + (1 + n_ckpt) * D;
    const int32_t n = f.s.dsa_n_keep[static_cast<size_t>(t)];
    const int32_t* keep = f.s.dsa_keep.data() + t * K;
    const int64_t* cp = f.kv.positions(f.batch.seq[t]);
    out[0] = static_cast<float>(n);
    for (int64_t j = 0; j < K; ++j) out[1 + j] = j < n ? static_cast<float>(cp[keep[j]]) : -1.0f;
  }
}

Status unpack_span_rows(Fwd& f, const float* rows, int64_t il, float* h) {
  const HParams& hp = f.hp;
  const int64_t T = f.batch.n, D = hp.n_embd, n_ckpt = hp.residual_ckpts_before(il), W = hp.span_row_width(il);
  float* stack = n_ckpt > 0 ? grow(f.s.res_stack, static_cast<size_t>(n_ckpt * T * D)) : nullptr;
  const bool sel = hp.carries_selection(il);
  const int64_t K = hp.indexer_top_k;
  int32_t* keep = sel ? grow(f.s.dsa_keep, static_cast<size_t>(T * K)) : nullptr;
  int32_t* n_keep = sel ? grow(f.s.dsa_n_keep, static_cast<size_t>(T)) : nullptr;
  for (int64_t t = 0; t < T; ++t) {
    const float* row = rows + t * W;
    std::copy_n(row, D, h + t * D);
    for (int64_t c = 0; c < n_ckpt; ++c) std::copy_n(row + (1 + c) * D, D, stack + (c * T + t) * D);
    if (!sel) continue;
    const float* in = row + (1 + n_ckpt) * D;
    const int32_t seq = f.batch.seq[t];
    const int64_t* cp = f.kv.positions(seq);
    const int64_t* end = cp + f.kv.seq_len(seq);
    const float nf = in[0];
    if (!(nf >= 0.0f && nf <= static_cast<float>(K)) || nf != std::floor(nf)) {
      return make_error(StatusCode::kCorrupt,
                        "span rows into block {}: token {} carries an indexer selection of {} cells "
                        "(0-{} allowed)",
                        il, t, nf, K);
    }
    const int32_t n = static_cast<int32_t>(nf);
    n_keep[t] = n;
    int32_t prev = -1;
    for (int32_t j = 0; j < n; ++j) {
      // Positions are exact in a float up to 2^24 (contexts of 16M tokens); anything else is refused
      // before the conversion.
      const float pf = in[1 + j];
      const bool whole = pf >= 0.0f && pf < 16777216.0f && pf == std::floor(pf);
      const int64_t p = whole ? static_cast<int64_t>(pf) : -1;
      const int64_t* it = whole ? std::lower_bound(cp, end, p) : end;
      if (it == end || *it != p || p > f.batch.pos[t] || static_cast<int32_t>(it - cp) <= prev) {
        return make_error(StatusCode::kCorrupt,
                          "span rows into block {}: token {} (position {}) selects position {}, which "
                          "sequence {} does not hold before it, or not in ascending order",
                          il, t, f.batch.pos[t], pf, seq);
      }
      prev = static_cast<int32_t>(it - cp);
      keep[t * K + j] = prev;
    }
  }
  return Status::ok();
}

Status block_begin(Fwd& f, int il, const LayerWeights& lw, const BlockBufs& b, MoeCall* call) {
  const int64_t D = f.hp.n_embd;
  const size_t n_act = static_cast<size_t>(f.batch.n * D);
  if (const int64_t B = f.hp.attn_res_block; B > 0) {
    // Cross-layer residual attention (layers.h): ffn_out serves as the mixes' buffer until the FFN.
    residual_mix(f, (il + B - 1) / B, b.h, lw.attn_res_score, b.ffn_out);
    rms_norm_rows(b.ffn_out, lw.attn_norm, b.xn, f.batch.n, D, f.hp.rms_eps);
    const bool bank = il % B == 0;
    if (bank) {
      float* stack = grow(f.s.res_stack, static_cast<size_t>((il / B + 1) * n_act));
      std::copy_n(b.h, n_act, stack + (il / B) * n_act);
    }
    f.hp.arch->mixer(f, il, lw, b.xn, b.attn_out);
    if (bank) {
      std::copy_n(b.attn_out, n_act, b.h);
    } else {
      for (size_t i = 0; i < n_act; ++i) b.h[i] = b.h[i] + b.attn_out[i];
    }
    residual_mix(f, il / B + 1, b.h, lw.ffn_res_score, b.ffn_out);
    rms_norm_rows(b.ffn_out, lw.ffn_norm, b.xn, f.batch.n, D, f.hp.rms_eps);
  } else {
    rms_norm_rows(b.h, lw.attn_norm, b.xn, f.batch.n, D, f.hp.rms_eps);
    f.hp.arch->mixer(f, il, lw, b.xn, b.attn_out);
    for (size_t i = 0; i < n_act; ++i) b.h[i] = b.attn_out[i] + b.h[i];
    rms_norm_rows(b.h, lw.ffn_norm, b.xn, f.batch.n, D, f.hp.rms_eps);
  }
  if (lw.is_moe) return moe_begin(f, il, lw, b.xn, call);
  dense_ffn(f, lw.ffn_gate, lw.ffn_up, lw.ffn_down, b.xn, b.ffn_out, lw.swiglu_limit, lw.ffn_act);
  return Status::ok();
}

Status block_end(Fwd& f, int il, const LayerWeights& lw, const BlockBufs& b, MoeCall* call) {
  if (lw.is_moe) MOESH_RETURN_IF_ERROR(moe_end(f, il, call, b.ffn_out));
  const int64_t D = f.hp.n_embd;
  const size_t n_act = static_cast<size_t>(f.batch.n * D);
  for (size_t i = 0; i < n_act; ++i) b.h[i] = b.ffn_out[i] + b.h[i];
  if (f.observer != nullptr) f.observer->on_layer_out(il, f.batch.n, D, b.h);
  return Status::ok();
}

Status moe_ffn(Fwd& f, int il, const LayerWeights& lw, const float* xn, float* out) {
  MoeCall call;
  MOESH_RETURN_IF_ERROR(moe_begin(f, il, lw, xn, &call));
  return moe_end(f, il, &call, out);
}

}  // namespace moesh::detail
