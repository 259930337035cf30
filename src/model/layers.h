// The layer library: the building blocks of the forward pass shared by every architecture file
// (arch_*.cpp, registered in arch.h): row-wise RMSNorm, projections that quantize a shared input
// once, the attention core over the KV cache, the GQA attention family (biases, Q/K norms, sinks,
// sliding window, NoPE, gated output), MLA, the dense SwiGLU FFN and THE MoE FFN (router -> plan
// -> executor -> + shared expert).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "moesh/model/model.h"
#include "moesh/moe/executor.h"

namespace moesh {

// Forward-pass buffers, grown on demand and reused across layers and steps.
struct Context::Scratch {
  std::vector<float> h, xn, attn_out, ffn_out;  // [T][n_embd]
  std::vector<float> q, k, v, o, o2, qa, tmp;   // attention projections
  std::vector<float> scores;                    // [n_threads][n_cells]
  std::vector<float> router_logits, route_scratch, moe_w, shexp;
  std::vector<float> moe_x, moe_ones, moe_sum, shexp_gl;  // input-scaled rows, gated shared expert
  std::vector<float> ffn_g, ffn_u, ffn_h;
  std::vector<int32_t> moe_ids;
  std::vector<int64_t> pos, cell;
  std::vector<int32_t> seq;
  std::vector<const float*> tok_k0, tok_v0;  // per token: its sequence's cell 0
  std::vector<const int64_t*> tok_cell_pos;
  std::vector<int64_t> tok_n_cells;
  RoutingPlan plan;
  QuantizedRows xq[3];          // one per distinct vec_dot_type
  std::vector<float> out_rows;  // normed rows for the output head
  std::vector<float> hidden;    // every token's normed row (Context::set_keep_hidden)
};

namespace detail {

template <typename T>
T* grow(std::vector<T>& v, size_t n) {
  if (v.size() < n) v.resize(n);
  return v.data();
}

// One batch of tokens, possibly of several sequences: per token its sequence, position and the
// cache cell (index within its sequence) that holds its K/V.
struct Batch {
  int64_t n = 0;
  const int32_t* seq = nullptr;
  const int64_t* pos = nullptr;
  const int64_t* cell = nullptr;
};

// Everything a layer function needs.
struct Fwd {
  const Model& model;
  const HParams& hp;
  ThreadPool* pool;
  KvCache& kv;
  RecurrentState* rec;  // null without recurrent layers
  Context::Scratch& s;
  ExpertExecutor& executor;
  ForwardObserver* observer;
  Batch batch;
  // A context that holds only some blocks' state (ContextParams::layers) keeps KV layers from
  // kv_base and recurrent layers from rec_base.
  int64_t kv_base = 0, rec_base = 0;
  // A backbone whose spans run some blocks elsewhere keeps state for the other blocks only: per
  // block, its layer in the KV cache or recurrent state (-1: a span's). Null: the rule above.
  const int32_t* slot_map = nullptr;
};

// Block il's layer in the KV cache (attention blocks) or in the recurrent state.
inline int64_t state_layer(const Fwd& f, int il) {
  if (f.slot_map != nullptr) return f.slot_map[il];
  return f.hp.state_slot[static_cast<size_t>(il)] - (f.hp.is_recurrent(il) ? f.rec_base : f.kv_base);
}

inline const float* f32(const TensorView& t) {
  return reinterpret_cast<const float*>(t.data);
}

// y[i] = rmsnorm(x[i]) * w for n_rows rows of width n.
void rms_norm_rows(const float* x, const TensorView& w, float* y, int64_t n_rows, int64_t n, float eps);

// One output of a projection: y[n_rows][w.ne[1]] with row stride ldy (0: w.ne[1]).
struct Proj {
  const TensorView* w;
  float* y;
  size_t ldy = 0;
};
// An F32 dot product in the order of llama.cpp's ggml_vec_dot_f32 on the reference machine
// (AVX-512: 64 lanes, fused multiply-adds, halving tree, leftovers one by one; layers.cpp):
// attention scores, small F32 matmuls, the DeltaNet recurrence.
float dot_f32_ggml(const float* x, const float* y, int64_t n);

// Runs several matmuls over the same input x[n_rows][k], quantizing x once per distinct
// vec_dot_type (the bits equal separate matmul() calls).
void project(Fwd& f, const float* x, int64_t n_rows, int64_t k, std::initializer_list<Proj> outs);

// Attention over the cache of layer `il` for the batch's queries.
// q: [T][n_head][dk] (head stride dk, token stride n_head*dk); K rows of dk and V rows of dv per
// KV head in the cache; o: [T][n_head][dv]. Query head h reads KV head h / (n_head / n_head_kv).
// Each (token, head) row is computed alone in a fixed order (cells in cache order), so a row's
// bits do not depend on the other rows of the batch.
struct AttnCoreOpts {
  int64_t window = 0;            // > 0: a query at position p sees cells with pos > p - window
  int64_t chunk = 0;             // > 0: ... and only cells of its own chunk (pos / chunk equal; llama4)
  const float* sinks = nullptr;  // [n_head] extra softmax logit per head (no value), or null
};
void attention_core(Fwd& f, int il, const float* q, int64_t n_head, int64_t n_head_kv, int64_t dk, int64_t dv,
                    float kq_scale, float* o, const AttnCoreOpts& opts = {});

// The GQA attention family: q/k/v projections (+ biases), Q/K norm per hp.qk_norm, RoPE unless
// the layer is NoPE (hp.rope_swa on swa layers when hp.rope_swa_own), the cache, attention
// (sliding window for swa layers, sinks when bound), the gated output of hp.q_gated or the
// head-wise gate lw.head_gate, the output projection (+ bias). Query heads: hp.n_head_of(il). Recurrent blocks of a
// hybrid (hp.is_recurrent) run attention_deltanet instead.
void attention_gqa(Fwd& f, int il, const LayerWeights& lw, const float* xn, float* out);

// Dense SwiGLU FFN: out = down(silu(gate x) * (up x)); limit > 0: the clamped SwiGLU
// down(min(silu(gate x), limit) * clamp(up x, -limit, limit)) (step35, LayerWeights::swiglu_limit).
void dense_ffn(Fwd& f, const TensorView& gate, const TensorView& up, const TensorView& down, const float* x, float* out,
               float limit = 0.0f);

// The MoE FFN of docs/background/moe-architectures.md §1 for every architecture: router (f32), routing, plan,
// executor submit, shared experts while it runs, wait, out = routed (+ shared).
Status moe_ffn(Fwd& f, int il, const LayerWeights& lw, const float* xn, float* out);
// The same in two halves, so the caller can run other work (another micro-batch) while the
// routed experts are out: moe_begin routes, submits and computes the shared experts; moe_end
// waits and writes out. xn and f.s must stay untouched in between.
struct MoeCall {
  Ticket ticket = 0;
  bool pending = false;
  bool has_shexp = false;
  bool input_scaled = false;  // k rows per token were submitted (ExpertFfn::input_scaled)
  int k = 0;
};
Status moe_begin(Fwd& f, int il, const LayerWeights& lw, const float* xn, MoeCall* call);
Status moe_end(Fwd& f, int il, MoeCall* call, float* out);

// One decoder block over f.batch, in two halves around the routed experts' trip (so another
// micro-batch can run in between): block_begin does h += mixer(attn_norm(h)), the pre-FFN norm,
// and the dense FFN or moe_begin; block_end waits for the experts (moe_end) and adds the FFN
// output to h (then reports h to f.observer). Buffers are [T][n_embd].
struct BlockBufs {
  float *h, *xn, *attn_out, *ffn_out;
};
Status block_begin(Fwd& f, int il, const LayerWeights& lw, const BlockBufs& b, MoeCall* call);
Status block_end(Fwd& f, int il, const LayerWeights& lw, const BlockBufs& b, MoeCall* call);

// ---- tensor binding (the arch files' tensor tables) ----

// Looks up tensors by name, checks their shape, and in dequant-f32 mode returns F32 copies.
class TensorBinder {
 public:
  virtual ~TensorBinder() = default;
  // `ne` lists the expected dims (ne0 first). Missing + !required gives an invalid view.
  virtual Result<TensorView> take(const std::string& name, std::vector<int64_t> ne, bool required = true) = 0;
};

// "blk.<il>." + name.
std::string blk(int il, const char* name);
// Shared by all: the FFN half of block il — `norm` (the pre-FFN norm's name: ffn_norm, or
// post_attention_norm), then the MoE tensors (router (+ bias), selection bias, stacked experts
// (+ biases), shared expert (+ its gate)) or the dense FFN.
// `need` names the MoE tensors the architecture always has (otherwise optional): "s" the
// selection bias exp_probs_b, "r" the router bias ffn_gate_inp.bias.
Status bind_ffn(TensorBinder& b, const HParams& hp, int il, bool moe, LayerWeights* lw,
                const char* norm = "ffn_norm.weight", const char* need = "");
// The GQA family's tensors of block il: attn_norm, attn_q/k/v/output (+ biases where `biases`
// names them: any of "qkvo"), per-head or full Q/K norms per hp.qk_norm, attn_sinks when `sinks`.
Status bind_gqa(TensorBinder& b, const HParams& hp, int il, LayerWeights* lw, const char* biases = "",
                bool sinks = false);

// kUnsupported naming the tensor when a bound (valid) view is not F32.
Status require_f32(const TensorView& t);

// rope_freqs.weight [n_rot/2] (F32, optional): per-pair RoPE frequency divisors (llama, llama4).
Status bind_rope_freqs(TensorBinder& b, HParams* hp);

// The DeepSeek-style NextN/MTP block il (ArchDef::bind_nextn): the architecture's own block
// tensors (bind_layer) plus blk.il.nextn.{eh_proj, enorm, hnorm, shared_head_norm} and the
// optional shared_head_head / embed_tokens (left invalid when absent: the model's output and
// token_embd stand in).
Status bind_nextn_block(TensorBinder& b, const HParams& hp, int il, NextnWeights* nw);

// MLA attention (layers_mla.cpp; deepseek2).
void attention_mla(Fwd& f, int il, const LayerWeights& lw, const float* xn, float* out);

// Gated DeltaNet, the recurrent mixer of hybrid blocks (layers_deltanet.cpp; qwen3next,
// qwen35moe): its tensors (attn_norm, attn_qkv, attn_gate, ssm_*) and the mixer, which reads
// and advances each sequence's recurrent state (f.rec) token by token.
Status bind_deltanet(TensorBinder& b, const HParams& hp, int il, LayerWeights* lw);
void attention_deltanet(Fwd& f, int il, const LayerWeights& lw, const float* xn, float* out);

}  // namespace detail
}  // namespace moesh
