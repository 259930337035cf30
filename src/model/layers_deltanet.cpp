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
//
// KDA (kimi-k3) is the same recurrence (delta_rule_step) with a decay per key channel instead of
// per head: S ← diag(e^g) S, g = gate_lower_bound · σ(exp(A_log) · (ssm_f_b · ssm_f_a · x + dt_bias));
// q, k and v have their own projections and causal convolutions (one window of [q|k|v] channels),
// and the output gate is σ(ssm_g · x) (reference README §7.4).
//
// KDA's only reference (archs2/) was made on an AVX2 host, and ggml's F32 code differs between its
// AVX2 and AVX-512 builds: so KDA's dots, its convolutions and their SiLU follow the AVX2 build
// (dot_f32_avx2; conv_tap_sum_avx2: GCC leaves the taps unfused there; silu_v_avx2: ggml's vector
// exp differs in the last bit for ~1 input in 8), the gated DeltaNet's the AVX-512 build, as the
// rest of moesh. Either is the same on every host.
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

Status read_kda_keys(const KeyReader& kr, HParams* hp) {
  HParams::DeltaNet& dn = hp->dnet;
  dn.kda = true;
  MOESH_RETURN_IF_ERROR(kr.req<int64_t>("ssm.conv_kernel", &dn.d_conv));
  MOESH_RETURN_IF_ERROR(kr.req<int64_t>("kda.head_dim", &dn.d_state));
  MOESH_RETURN_IF_ERROR(kr.positive("ssm.conv_kernel", dn.d_conv));
  MOESH_RETURN_IF_ERROR(kr.positive("kda.head_dim", dn.d_state));
  if (dn.d_state > 512) {
    return make_error(StatusCode::kUnsupported, "{} = {}: heads wider than 512 are not supported",
                      kr.full("kda.head_dim"), dn.d_state);
  }
  if (!kr.has("kda.gate_lower_bound")) {
    // llama.cpp's other gate (kimi-linear's -exp(A_log)·softplus(f)) is not implemented.
    return make_error(StatusCode::kUnsupported, "{} missing: only the bounded KDA gate is supported",
                      kr.full("kda.gate_lower_bound"));
  }
  MOESH_RETURN_IF_ERROR(kr.req<float>("kda.gate_lower_bound", &dn.gate_lower_bound));
  dn.n_k_head = dn.n_v_head = hp->n_head;  // one state per head; q, k, v each n_head × head_dim
  dn.d_inner = hp->n_head * dn.d_state;
  // Per recurrent layer and sequence: the [q|k|v] convolution window, then one S×S matrix per head.
  hp->rec_width = dn.conv_channels() * (dn.d_conv - 1) + dn.n_v_head * dn.d_state * dn.d_state;
  return Status::ok();
}

void write_kda_keys(const HParams& hp, KvList* kvs) {
  put_u32(kvs, hp, "ssm.conv_kernel", hp.dnet.d_conv);
  put_u32(kvs, hp, "kda.head_dim", hp.dnet.d_state);
  put_f32(kvs, hp, "kda.gate_lower_bound", hp.dnet.gate_lower_bound);
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

// The same as ggml's AVX2 build compiles it (KDA): each tap's product rounded, then added in order.
float conv_tap_sum_avx2(const float* window, float x, const float* w, int64_t K) {
  float sum = 0.0f;
  for (int64_t i = 0; i + 1 < K; ++i) sum += window[i] * w[i];
  return sum + x * w[K - 1];
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

// The leftovers of the AVX2 ggml_vec_dot_f32 below (tensor/quant_impl.h dot_f32_ggml_tail has the
// AVX-512 ones): x[i..n) . y[i..n) added to s, 4 rounded products at a time added in order, then
// fused multiply-adds for the last < 4.
MOESH_FMA_CLONES float dot_f32_ggml_tail_avx2(const float* x, const float* y, int64_t i, int64_t n, float s) {
  for (; i + 4 <= n; i += 4) {
    float p[4];
    for (int l = 0; l < 4; ++l) p[l] = x[i + l] * y[i + l];
    for (int l = 0; l < 4; ++l) s += p[l];
  }
  for (; i < n; ++i) s = std::fmaf(x[i], y[i], s);
  return s;
}

// ggml_vec_dot_f32 as compiled for AVX2 (32 lanes in four 8-wide registers, fused multiply-adds;
// registers 0+2, 1+3, then 0+1; the 8 lanes as (l, l+4), then hadd twice; the leftovers as GCC
// vectorises them for AVX2: 4 products at a time added in order, then fused multiply-adds).
MOESH_FMA_CLONES MOESH_VECTORIZE float dot_f32_avx2(const float* x, const float* y, int64_t n) {
  float acc[32] = {};
  const int64_t np = n & ~static_cast<int64_t>(31);
  for (int64_t i = 0; i < np; i += 32) {
    for (int l = 0; l < 32; ++l) acc[l] = std::fmaf(x[i + l], y[i + l], acc[l]);
  }
  for (int l = 0; l < 16; ++l) acc[l] += acc[l + 16];
  for (int l = 0; l < 8; ++l) acc[l] += acc[l + 8];
  float t0[4];
  for (int l = 0; l < 4; ++l) t0[l] = acc[l] + acc[l + 4];
  const float r = (t0[0] + t0[1]) + (t0[2] + t0[3]);
  return dot_f32_ggml_tail_avx2(x, y, np, n, r);
}

// y[i] *= d[i] (a decay per key channel, KDA).
MOESH_FMA_CLONES MOESH_VECTORIZE void mul_rows(float* y, const float* d, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = y[i] * d[i];
}

// One token of the delta rule for one head. M holds Sᵀ row-major (row j is column j of S, over
// the S key channels): decay (a scalar, or one per key channel when decay_k is set), then
// S ← S + k (β (v − Sᵀk))ᵀ, o = Sᵀq · scale.
void delta_rule_step(float* M, const float* q, const float* k, const float* v, float beta, float decay,
                     const float* decay_k, int64_t S, float scale, float* o) {
  float delta[512];
  if (decay_k != nullptr) {
    for (int64_t j = 0; j < S; ++j) mul_rows(M + j * S, decay_k, S);
  } else {
    for (int64_t i = 0; i < S * S; ++i) M[i] = M[i] * decay;
  }
  auto dot = decay_k != nullptr ? dot_f32_avx2 : dot_f32_ggml;
  for (int64_t j = 0; j < S; ++j) delta[j] = (v[j] - dot(M + j * S, k, S)) * beta;
  for (int64_t j = 0; j < S; ++j) mad(M + j * S, k, delta[j], S);
  for (int64_t j = 0; j < S; ++j) o[j] = dot(M + j * S, q, S) * scale;
}

// The causal convolution of one token over C channels (window [C][K-1], slid by one), then SiLU;
// Avx2: in ggml's AVX2 build's float order (KDA, see the header). w(c) gives channel c's K taps.
template <bool Avx2 = false, typename Taps>
void conv_step(float* win_all, float* m, int64_t C, int64_t K, Taps w) {
  for (int64_t c = 0; c < C; ++c) {
    float* win = win_all + c * (K - 1);
    const float x = m[c];
    const float y = Avx2 ? conv_tap_sum_avx2(win, x, w(c), K) : conv_tap_sum(win, x, w(c), K);
    for (int64_t i = 0; i + 2 < K; ++i) win[i] = win[i + 1];
    if (K > 1) win[K - 2] = x;
    m[c] = y;
  }
  for (int64_t c = 0; c < C; ++c) m[c] = Avx2 ? silu_v_avx2(m[c]) : silu_v(m[c]);
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
    conv_step(conv, mt, C, K, [&](int64_t c) { return conv_w + c * K; });
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
      for (int64_t h = h0; h < h1; ++h) {
        const int64_t g = dn.tiled ? h % nk : h / r;
        delta_rule_step(mats + h * S * S, q + g * S, k + g * S, v + h * S, beta[h], std::exp(gam[h]), nullptr, S, scale,
                        ot + h * S);
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

Status bind_kda(TensorBinder& b, const HParams& hp, int il, LayerWeights* lw) {
  const HParams::DeltaNet& dn = hp.dnet;
  const int64_t d = hp.n_embd, H = dn.n_v_head, S = dn.d_state, di = dn.d_inner, K = dn.d_conv;
  MOESH_ASSIGN_OR_RETURN(lw->attn_norm, b.take(blk(il, "attn_norm.weight"), {d}));
  MOESH_ASSIGN_OR_RETURN(lw->wq, b.take(blk(il, "attn_q.weight"), {d, di}));
  MOESH_ASSIGN_OR_RETURN(lw->wk, b.take(blk(il, "attn_k.weight"), {d, di}));
  MOESH_ASSIGN_OR_RETURN(lw->wv, b.take(blk(il, "attn_v.weight"), {d, di}));
  MOESH_ASSIGN_OR_RETURN(lw->ssm_conv_q, b.take(blk(il, "ssm_conv1d_q.weight"), {K, 1, di}));
  MOESH_ASSIGN_OR_RETURN(lw->ssm_conv_k, b.take(blk(il, "ssm_conv1d_k.weight"), {K, 1, di}));
  MOESH_ASSIGN_OR_RETURN(lw->ssm_conv_v, b.take(blk(il, "ssm_conv1d_v.weight"), {K, 1, di}));
  MOESH_ASSIGN_OR_RETURN(lw->ssm_f_a, b.take(blk(il, "ssm_f_a.weight"), {d, S}));
  MOESH_ASSIGN_OR_RETURN(lw->ssm_f_b, b.take(blk(il, "ssm_f_b.weight"), {S, di}));
  MOESH_ASSIGN_OR_RETURN(lw->ssm_beta, b.take(blk(il, "ssm_beta.weight"), {d, H}));
  MOESH_ASSIGN_OR_RETURN(lw->ssm_a, b.take(blk(il, "ssm_a"), {H}));
  MOESH_ASSIGN_OR_RETURN(lw->ssm_dt_b, b.take(blk(il, "ssm_dt.bias"), {di}));
  MOESH_ASSIGN_OR_RETURN(lw->ssm_g, b.take(blk(il, "ssm_g.weight"), {d, di}));
  MOESH_ASSIGN_OR_RETURN(lw->ssm_norm, b.take(blk(il, "ssm_norm.weight"), {S}));
  MOESH_ASSIGN_OR_RETURN(lw->wo, b.take(blk(il, "attn_output.weight"), {di, d}));
  for (const TensorView* t :
       {&lw->ssm_conv_q, &lw->ssm_conv_k, &lw->ssm_conv_v, &lw->ssm_dt_b, &lw->ssm_a, &lw->ssm_norm}) {
    MOESH_RETURN_IF_ERROR(require_f32(*t));
  }
  return Status::ok();
}

void attention_kda(Fwd& f, int il, const LayerWeights& lw, const float* xn, float* out) {
  const HParams& hp = f.hp;
  const HParams::DeltaNet& dn = hp.dnet;
  const int64_t T = f.batch.n, D = hp.n_embd;
  const int64_t S = dn.d_state, H = dn.n_v_head, K = dn.d_conv, di = dn.d_inner;
  const int64_t C = 3 * di;  // [q | k | v] channels, as the state's window holds them
  const int64_t conv_floats = C * (K - 1);
  const int64_t layer = state_layer(f, il);

  // Projections: q, k, v side by side per token; the decay's low-rank input, β and the output gate.
  float* m = grow(f.s.qa, static_cast<size_t>(T * C));
  float* fa = grow(f.s.tmp, static_cast<size_t>(T * (S + H)));
  float* bt = fa + T * S;
  float* gate = grow(f.s.o2, static_cast<size_t>(T * di));
  float* gk = grow(f.s.k, static_cast<size_t>(T * di));
  const size_t ldm = static_cast<size_t>(C);
  project(f, xn, T, D, {{&lw.wq, m, ldm}, {&lw.wk, m + di, ldm}, {&lw.wv, m + 2 * di, ldm}});
  project(f, xn, T, D, {{&lw.ssm_f_a, fa}, {&lw.ssm_beta, bt}, {&lw.ssm_g, gate}});
  project(f, fa, T, S, {{&lw.ssm_f_b, gk}});
  // g = lower_bound · σ(−(f · ssm_a)) with ssm_a = −exp(A_log) (llama.cpp: add, mul, scale −1,
  // sigmoid, scale); the decay of key channel i is e^g.
  const float* dt_b = f32(lw.ssm_dt_b);
  const float* a = f32(lw.ssm_a);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t c = 0; c < di; ++c) {
      const float x = (gk[t * di + c] + dt_b[c]) * a[c / S];
      gk[t * di + c] = std::exp(sigmoid(-x) * dn.gate_lower_bound);
    }
  }
  const float* conv_w[3] = {f32(lw.ssm_conv_q), f32(lw.ssm_conv_k), f32(lw.ssm_conv_v)};
  const float scale = 1.0f / std::sqrt(static_cast<float>(S));
  float* o = grow(f.s.o, static_cast<size_t>(T * di));

  for (int64_t t = 0; t < T; ++t) {
    const int32_t seq = f.batch.seq[t];
    float* st = f.rec->live(seq, layer);  // [C][K-1] window, then [H][S][S]
    float* mats = st + conv_floats;
    float* mt = m + t * C;
    conv_step<true>(st, mt, C, K, [&](int64_t c) { return conv_w[c / di] + (c % di) * K; });
    float* q = mt;
    float* k = mt + di;
    const float* v = mt + 2 * di;
    for (int64_t h = 0; h < H; ++h) {
      l2_norm(q + h * S, S, hp.rms_eps);
      l2_norm(k + h * S, S, hp.rms_eps);
    }
    const float* dk = gk + t * di;
    float* ot = o + t * di;
    auto heads = [&](int64_t h0, int64_t h1, int) {
      for (int64_t h = h0; h < h1; ++h) {
        delta_rule_step(mats + h * S * S, q + h * S, k + h * S, v + h * S, sigmoid(bt[t * H + h]), 1.0f, dk + h * S, S,
                        scale, ot + h * S);
      }
    };
    if (f.pool != nullptr && H > 1 && S * S >= 4096) {
      f.pool->parallel_for(H, [&heads](int64_t a0, int64_t a1, int th) { heads(a0, a1, th); });
    } else {
      heads(0, H, 0);
    }
    f.rec->after_token(seq, layer, f.batch.cell[t] + 1);
  }

  // RMSNorm per head, the sigmoid output gate, then the output projection.
  rms_norm_rows(o, lw.ssm_norm, o, T * H, S, hp.rms_eps);
  for (int64_t i = 0; i < T * di; ++i) o[i] = o[i] * sigmoid(gate[i]);
  project(f, o, T, di, {{&lw.wo, out}});
}

}  // namespace detail
}  // namespace moesh
