// Gated DeltaNet: the recurrent token mixer of the qwen3next / qwen35moe hybrids (layers.h).
//
// Per token, with a per-sequence state of a causal-convolution window and one S×S matrix per
// value head (reference README §7.6):
//   m = wqkv·x = [q | k | v]   z = wqkv_gate·x   β = σ(b)   γ = softplus(a + dt_bias) · ssm_a
//   m ← silu(conv1d(m))        (each channel over its last d_conv inputs; zeros before the first)
//   q, k ← q/‖q‖, k/‖k‖         (per key head)
//   per value head h (key head g(h)):  S ← e^γ S;  S ← S + k (β (v − Sᵀk))ᵀ;  o = Sᵀq / √S
//   y = rmsnorm(o_h) ⊙ ssm_norm ⊙ silu(z_h)   out = ssm_out · y
//
// Tokens of a sequence are taken one at a time in order — the recurrence, as llama.cpp's fused
// gated_delta_net op does for a batch too — so a sequence's bits are the same whether its tokens
// arrive in one batch or one by one, next to other sequences or alone. The dot products and
// updates follow that op's compiled order on the reference machine (ggml_vec_dot_f32 = dot_f32_ggml,
// ggml_vec_mad_f32 = one fused multiply-add per element).
#include <cmath>

#include "model/arch.h"
#include "moesh/tensor/fma_clones.h"

namespace moesh {

Status read_deltanet_keys(const KeyReader& kr, HParams* hp) {
  HParams::DeltaNet& dn = hp->dnet;
  MOESH_RETURN_IF_ERROR(kr.req<int64_t>("ssm.conv_kernel", &dn.d_conv));
  MOESH_RETURN_IF_ERROR(kr.req<int64_t>("ssm.state_size", &dn.d_state));
  MOESH_RETURN_IF_ERROR(kr.req<int64_t>("ssm.group_count", &dn.n_k_head));
  MOESH_RETURN_IF_ERROR(kr.req<int64_t>("ssm.time_step_rank", &dn.n_v_head));
  MOESH_RETURN_IF_ERROR(kr.req<int64_t>("ssm.inner_size", &dn.d_inner));
  for (auto [k, v] : {std::pair{"ssm.conv_kernel", dn.d_conv},
                      {"ssm.state_size", dn.d_state},
                      {"ssm.group_count", dn.n_k_head},
                      {"ssm.time_step_rank", dn.n_v_head},
                      {"ssm.inner_size", dn.d_inner}}) {
    MOESH_RETURN_IF_ERROR(kr.positive(k, v));
  }
  if (dn.n_v_head % dn.n_k_head != 0) {
    return make_error(StatusCode::kCorrupt, "{} = {} is not a multiple of {} = {}", kr.full("ssm.time_step_rank"),
                      dn.n_v_head, kr.full("ssm.group_count"), dn.n_k_head);
  }
  if (dn.d_inner != dn.n_v_head * dn.d_state) {
    return make_error(StatusCode::kCorrupt, "{} = {} must be {} x {} = {}", kr.full("ssm.inner_size"), dn.d_inner,
                      kr.full("ssm.time_step_rank"), kr.full("ssm.state_size"), dn.n_v_head * dn.d_state);
  }
  if (dn.d_state > 512) {
    return make_error(StatusCode::kUnsupported, "{} = {}: heads wider than 512 are not supported",
                      kr.full("ssm.state_size"), dn.d_state);
  }
  MOESH_RETURN_IF_ERROR(kr.opt<int64_t>("full_attention_interval", &dn.attn_interval, 4));  // llama.cpp's default
  MOESH_RETURN_IF_ERROR(kr.positive("full_attention_interval", dn.attn_interval));
  const int64_t interval = dn.attn_interval;
  hp->recurrent.assign(static_cast<size_t>(hp->n_layer), 0);
  for (int64_t il = 0; il < hp->n_layer; ++il) hp->recurrent[static_cast<size_t>(il)] = (il + 1) % interval != 0;
  // Per recurrent layer and sequence: the convolution window, then one S×S matrix per value head.
  hp->rec_width = dn.conv_channels() * (dn.d_conv - 1) + dn.n_v_head * dn.d_state * dn.d_state;
  return Status::ok();
}

void write_deltanet_keys(const HParams& hp, KvList* kvs) {
  const HParams::DeltaNet& dn = hp.dnet;
  put_u32(kvs, hp, "ssm.conv_kernel", dn.d_conv);
  put_u32(kvs, hp, "ssm.state_size", dn.d_state);
  put_u32(kvs, hp, "ssm.group_count", dn.n_k_head);
  put_u32(kvs, hp, "ssm.time_step_rank", dn.n_v_head);
  put_u32(kvs, hp, "ssm.inner_size", dn.d_inner);
  put_u32(kvs, hp, "full_attention_interval", dn.attn_interval);
}

void hybrid_mixer(detail::Fwd& f, int il, const LayerWeights& lw, const float* xn, float* out) {
  if (f.hp.is_recurrent(il)) {
    detail::attention_deltanet(f, il, lw, xn, out);
  } else {
    detail::attention_gqa(f, il, lw, xn, out);
  }
}

namespace detail {

namespace {

// y[i] += x[i] * v, fused (ggml_vec_mad_f32).
MOESH_FMA_CLONES MOESH_VECTORIZE void mad(float* y, const float* x, float v, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = std::fmaf(x[i], v, y[i]);
}

// One channel of the causal convolution: taps 0..K-2 over the window, tap K-1 on the current
// input; ggml_ssm_conv's float sum in tap order (contracted to fma).
MOESH_FMA_CLONES float conv_tap_sum(const float* window, float x, const float* w, int64_t K) {
  float sum = 0.0f;
  for (int64_t i = 0; i + 1 < K; ++i) sum = std::fmaf(window[i], w[i], sum);
  return std::fmaf(x, w[K - 1], sum);
}

// ggml_l2_norm: x / max(‖x‖, eps), the sum of squares in double.
void l2_norm(float* x, int64_t n, float eps) {
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(x[i] * x[i]);
  const float scale = 1.0f / std::fmax(std::sqrt(static_cast<float>(sum)), eps);
  for (int64_t i = 0; i < n; ++i) x[i] = x[i] * scale;
}

// ggml's softplus unary op.
float softplus(float x) {
  return x > 20.0f ? x : std::log(1.0f + std::exp(x));
}

}  // namespace

Status bind_deltanet(TensorBinder& b, const HParams& hp, int il, LayerWeights* lw) {
  const HParams::DeltaNet& dn = hp.dnet;
  const int64_t d = hp.n_embd, nv = dn.n_v_head;
  MOESH_ASSIGN_OR_RETURN(lw->attn_norm, b.take(blk(il, "attn_norm.weight"), {d}));
  MOESH_ASSIGN_OR_RETURN(lw->wqkv, b.take(blk(il, "attn_qkv.weight"), {d, dn.conv_channels()}));
  MOESH_ASSIGN_OR_RETURN(lw->wqkv_gate, b.take(blk(il, "attn_gate.weight"), {d, dn.d_inner}));
  if (dn.split_ba) {
    MOESH_ASSIGN_OR_RETURN(lw->ssm_beta, b.take(blk(il, "ssm_beta.weight"), {d, nv}));
    MOESH_ASSIGN_OR_RETURN(lw->ssm_alpha, b.take(blk(il, "ssm_alpha.weight"), {d, nv}));
  } else {
    MOESH_ASSIGN_OR_RETURN(lw->ssm_ba, b.take(blk(il, "ssm_ba.weight"), {d, 2 * nv}));
  }
  MOESH_ASSIGN_OR_RETURN(lw->ssm_conv1d, b.take(blk(il, "ssm_conv1d.weight"), {dn.d_conv, dn.conv_channels()}));
  MOESH_ASSIGN_OR_RETURN(lw->ssm_dt_b, b.take(blk(il, "ssm_dt.bias"), {nv}));
  MOESH_ASSIGN_OR_RETURN(lw->ssm_a, b.take(blk(il, "ssm_a"), {nv}));
  MOESH_ASSIGN_OR_RETURN(lw->ssm_norm, b.take(blk(il, "ssm_norm.weight"), {dn.d_state}));
  MOESH_ASSIGN_OR_RETURN(lw->ssm_out, b.take(blk(il, "ssm_out.weight"), {dn.d_inner, d}));
  for (const TensorView* t : {&lw->ssm_conv1d, &lw->ssm_dt_b, &lw->ssm_a, &lw->ssm_norm}) {
    MOESH_RETURN_IF_ERROR(require_f32(*t));
  }
  return Status::ok();
}

void attention_deltanet(Fwd& f, int il, const LayerWeights& lw, const float* xn, float* out) {
  const HParams& hp = f.hp;
  const HParams::DeltaNet& dn = hp.dnet;
  const int64_t T = f.batch.n, D = hp.n_embd;
  const int64_t S = dn.d_state, nk = dn.n_k_head, nv = dn.n_v_head, K = dn.d_conv;
  const int64_t C = dn.conv_channels(), r = nv / nk;
  const int64_t conv_floats = C * (K - 1);
  const int64_t layer = state_layer(f, il);

  // Projections, x quantized once per weight type.
  float* m = grow(f.s.qa, static_cast<size_t>(T * C));
  float* z = grow(f.s.o2, static_cast<size_t>(T * dn.d_inner));
  float* ba = grow(f.s.tmp, static_cast<size_t>(T * 2 * nv));
  if (dn.split_ba) {
    project(f, xn, T, D, {{&lw.wqkv, m}, {&lw.wqkv_gate, z}, {&lw.ssm_beta, ba, static_cast<size_t>(2 * nv)}});
    project(f, xn, T, D, {{&lw.ssm_alpha, ba + nv, static_cast<size_t>(2 * nv)}});
  } else {
    project(f, xn, T, D, {{&lw.wqkv, m}, {&lw.wqkv_gate, z}, {&lw.ssm_ba, ba}});
  }
  const float* conv_w = f32(lw.ssm_conv1d);
  const float* dt_b = f32(lw.ssm_dt_b);
  const float* a_log = f32(lw.ssm_a);
  const float scale = 1.0f / std::sqrt(static_cast<float>(S));
  float* o = grow(f.s.o, static_cast<size_t>(T * dn.d_inner));
  float* beta = grow(f.s.k, static_cast<size_t>(2 * nv));
  float* gam = beta + nv;

  for (int64_t t = 0; t < T; ++t) {
    const int32_t seq = f.batch.seq[t];
    float* st = f.rec->live(seq, layer);  // [C][K-1] window, then [nv][S][S]
    float* conv = st;
    float* mats = st + conv_floats;

    // β and γ of each value head. ssm_ba groups them by key head: [β of its r value heads | α of them].
    const float* bat = ba + t * 2 * nv;
    for (int64_t h = 0; h < nv; ++h) {
      float bv, av;
      if (dn.split_ba) {
        bv = bat[h], av = bat[nv + h];
      } else {
        const int64_t g = h / r, i = h % r;
        bv = bat[g * 2 * r + i], av = bat[g * 2 * r + r + i];
      }
      beta[h] = sigmoid(bv);
      gam[h] = softplus(av + dt_b[h]) * a_log[h];
    }

    // Causal convolution over each channel's window, then SiLU; the window slides by one.
    float* mt = m + t * C;
    for (int64_t c = 0; c < C; ++c) {
      float* win = conv + c * (K - 1);
      const float x = mt[c];
      const float y = conv_tap_sum(win, x, conv_w + c * K, K);
      for (int64_t i = 0; i + 2 < K; ++i) win[i] = win[i + 1];
      if (K > 1) win[K - 2] = x;
      mt[c] = y;
    }
    for (int64_t c = 0; c < C; ++c) mt[c] = silu_v(mt[c]);
    float* q = mt;
    float* k = mt + nk * S;
    const float* v = mt + 2 * nk * S;
    for (int64_t g = 0; g < nk; ++g) {
      l2_norm(q + g * S, S, hp.rms_eps);
      l2_norm(k + g * S, S, hp.rms_eps);
    }

    // The delta rule per value head. M holds Sᵀ row-major: row j is column j of S.
    float* ot = o + t * dn.d_inner;
    auto heads = [&](int64_t h0, int64_t h1, int) {
      float delta[512];
      for (int64_t h = h0; h < h1; ++h) {
        const int64_t g = dn.tiled ? h % nk : h / r;
        const float* qh = q + g * S;
        const float* kh = k + g * S;
        const float* vh = v + h * S;
        float* M = mats + h * S * S;
        const float decay = std::exp(gam[h]);
        for (int64_t i = 0; i < S * S; ++i) M[i] = M[i] * decay;
        for (int64_t j = 0; j < S; ++j) delta[j] = (vh[j] - dot_f32_ggml(M + j * S, kh, S)) * beta[h];
        for (int64_t j = 0; j < S; ++j) mad(M + j * S, kh, delta[j], S);
        for (int64_t j = 0; j < S; ++j) ot[h * S + j] = dot_f32_ggml(M + j * S, qh, S) * scale;
      }
    };
    if (f.pool != nullptr && nv > 1 && S * S >= 4096) {
      f.pool->parallel_for(nv, [&heads](int64_t a, int64_t b, int th) { heads(a, b, th); });
    } else {
      heads(0, nv, 0);
    }
    f.rec->after_token(seq, layer, f.batch.cell[t] + 1);
  }

  // Gated RMSNorm per value head, then the output projection.
  rms_norm_rows(o, lw.ssm_norm, o, T * nv, S, hp.rms_eps);
  for (int64_t i = 0; i < T * dn.d_inner; ++i) o[i] = o[i] * silu_v(z[i]);
  project(f, o, T, dn.d_inner, {{&lw.ssm_out, out}});
}

}  // namespace detail
}  // namespace moesh
