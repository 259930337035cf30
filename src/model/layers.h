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
  QuantizedRows xq[3];                       // one per distinct vec_dot_type
  std::vector<float> out_rows;               // normed rows for the output head
  std::vector<float> hidden;                 // every token's normed row (Context::set_keep_hidden)
  std::vector<float> moe_z, moe_zn, moe_up;  // latent MoE: the dispatched latent, the normed sum, back up
  std::vector<float> res_stack;              // residual-attention checkpoints [n_ckpt][T][n_embd]
  std::vector<float> span_rows;              // rows crossing a span boundary (span_row_width wide)
  std::vector<float> res_scores;
  std::vector<float> msa_q, msa_scores;  // MSA indexer queries, per-thread block scores
  std::vector<int32_t> msa_order;        // per-thread block order
  std::vector<uint8_t> msa_keep;         // [T][n_head_kv][n_blocks] taken blocks
  // Lightning indexer (layers_indexer.cpp): queries, keys, head weights, per-thread scores, and
  // the batch's selection, [T][indexer_top_k] cells with a count per token (read again by the
  // blocks that reuse it).
  std::vector<float> idx_q, idx_k, idx_w, idx_scores;
  std::vector<int32_t> dsa_keep, dsa_n_keep;
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
// single attention scores, small F32 matmuls, the DeltaNet recurrence. It is one cell of the
// kernel table's AttnScores (tensor/kernels.h), so every ISA gives the same bits.
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
  // Block-sparse attention (MSA): a query of token t in KV group g sees only cells whose block
  // (pos / block_size) has block_keep[(t * n_head_kv + g) * keep_stride + block] != 0.
  const uint8_t* block_keep = nullptr;
  int64_t block_size = 0, keep_stride = 0;
  // llama.cpp's CPU flash attention over an F16 cache, one query row at a time (its one_chunk
  // kernel): Q rounded to F16, F16 dot products, online softmax with an F16 V accumulator. The
  // cache must hold F16-representable K/V (LayerWeights::kv_f16).
  bool fa_f16 = false;
  // Token-sparse attention (glm-dsa): token t sees only the cell_n_keep[t] cells
  // cell_keep[t * cell_keep_stride ...] (ascending, all visible); the others are masked (-inf).
  const int32_t* cell_keep = nullptr;
  const int32_t* cell_n_keep = nullptr;
  int64_t cell_keep_stride = 0;
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
// down(min(silu(gate x), limit) * clamp(up x, -limit, limit)) (step35, LayerWeights::swiglu_limit);
// act kSwigluOai: gpt-oss's swiglu-oai instead (minimax-m3, LayerWeights::ffn_act); kSitu: situ with
// hp.expert_ffn's constants (kimi-k3).
void dense_ffn(Fwd& f, const TensorView& gate, const TensorView& up, const TensorView& down, const float* x, float* out,
               float limit = 0.0f, ExpertActivation act = ExpertActivation::kSilu);

// The MoE FFN of docs/background/moe-architectures.md §1 for every architecture: router (f32), routing, plan,
// executor submit, shared experts while it runs, wait, out = routed (+ shared).
// Latent MoE (lw.ffn_routed_down bound, kimi-k3): the router reads x, the executor gets
// z = ffn_routed_down · x (hp.n_embd_exp() wide: what goes on the wire), and the routed sum m comes
// back as ffn_routed_up · (rmsnorm(m) ⊙ ffn_routed_norm).
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
  const LayerWeights* latent = nullptr;  // latent MoE: the layer whose norm and up-projection follow
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
// With cross-layer residual attention (hp.attn_res_block = B > 0, kimi-k3) h is the running
// stream p and f.s.res_stack the checkpoints: the mixer reads attn_norm(mix(p, attn_res_score));
// a block il % B == 0 banks p and restarts it from the mixer's output (p = out), others add;
// the FFN reads ffn_norm(mix(p, ffn_res_score)). The checkpoints of a block are those of the
// same call's earlier blocks, so a batch runs every block from 0 (no spans).
Status block_begin(Fwd& f, int il, const LayerWeights& lw, const BlockBufs& b, MoeCall* call);
Status block_end(Fwd& f, int il, const LayerWeights& lw, const BlockBufs& b, MoeCall* call);

// The residual-attention mix of the reference README §7.4 over the first n_ckpt checkpoints of
// f.s.res_stack and the stream cur [T][n_embd]: per token, scores σ_i = Σ(rmsnorm(c_i) ⊙ w) (no
// norm weight; the sum in double, ggml_sum_rows) and σ_cur likewise, π = softmax, out = Σ π_i c_i
// (fused, in checkpoint order) + π_cur·cur. n_ckpt = 0: out = cur. out may be cur.
void residual_mix(Fwd& f, int64_t n_ckpt, const float* cur, const TensorView& w, float* out);
// The checkpoints the output head's mix reads (after the last block).
inline int64_t residual_ckpts_at_end(const HParams& hp) {
  return hp.residual_ckpts_before(hp.n_layer);
}
// Span rows entering block il (HParams::span_row_width(il)) <-> the stream h [T][n_embd], the
// residual-attention checkpoints banked before il (f.s.res_stack [n_ckpt][T][n_embd]) and, where a
// block from il on reuses an earlier indexer selection, the batch's selection (f.s.dsa_keep):
// per token [h | c_0 | ... | c_{n_ckpt-1} | n_keep | positions of the kept cells, top_k slots].
// Positions, not cell indices, cross: each side maps them to its own cells of the sequence (the
// same positions, as every span holds the same tokens). unpack rejects rows whose selection is not
// a valid one for the batch (a count out of range, a position the sequence does not hold or the
// token cannot see, not ascending) with a message naming the token.
void pack_span_rows(Fwd& f, const float* h, int64_t il, float* rows);
Status unpack_span_rows(Fwd& f, const float* rows, int64_t il, float* h);

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

// MiniMax sparse attention (layers_msa.cpp; minimax-m3). bind_msa binds a block's indexer
// (indexer.q_proj, k_proj, q_norm, k_norm). msa_select runs it inside attention_gqa, after the
// batch's K/V are in the cache: iq = rope(rmsnorm(q_proj x)) per indexer head, ik =
// rope(rmsnorm(k_proj x)) stored after the K heads of the cache row (hp.kv_k_width), then per
// token and KV group the taken blocks (msa_take_blocks) into opts->block_keep.
Status bind_msa(TensorBinder& b, const HParams& hp, int il, LayerWeights* lw);
void msa_select(Fwd& f, int il, const LayerWeights& lw, const float* xn, AttnCoreOpts* opts);
// One query's block selection, as llama.cpp's msa_block_mask_op: bs[b] the block scores of
// blocks 0..n_blk-1 (max of iq . ik over the block's visible cells, <= -1e30 for a block with
// none), the `local` blocks ending at block `cur` forced (+1e30), then the top_k by score, ties
// broken as std::partial_sort (libstdc++'s heap select) breaks them there; blocks without a
// visible cell that are not forced are never taken. keep[b] = 1 for the taken blocks (n_blk
// entries written); order: n_blk ints of scratch.
void msa_take_blocks(float* bs, int64_t n_blk, int64_t cur, int64_t local, int64_t top_k, int32_t* order,
                     uint8_t* keep);

// MLA attention (layers_mla.cpp; deepseek2, glm-dsa): its tensors (attn_norm, attn_q_a /
// attn_q_a_norm / attn_q_b or attn_q, attn_kv_a_mqa, attn_kv_a_norm, attn_k_b, attn_v_b,
// attn_output) and the mixer; blocks with an indexer source (hp.indexer_source) attend only to
// the cells their lightning indexer keeps.
Status bind_mla(TensorBinder& b, const HParams& hp, int il, LayerWeights* lw);
void attention_mla(Fwd& f, int il, const LayerWeights& lw, const float* xn, float* out);

// y[i] = layernorm(x[i]) * w + b for n_rows rows of width n (ggml_norm: mean and variance summed
// in double); w, b may be invalid (no weight / no bias).
void layer_norm_rows(const float* x, const TensorView& w, const TensorView& b, float* y, int64_t n_rows, int64_t n,
                     float eps);

// The lightning indexer of DeepSeek-style sparse attention (layers_indexer.cpp; glm-dsa):
// bind_indexer binds blk.il.indexer.* where block il computes its own selection;
// lightning_indexer writes the batch's indexer keys into the cache (the K row after [c | k_pe])
// and keeps, per token, the indexer_top_k visible cells of highest score (f.s.dsa_keep).
Status bind_indexer(TensorBinder& b, const HParams& hp, int il, LayerWeights* lw);
void lightning_indexer(Fwd& f, int il, const LayerWeights& lw, const float* xn, const float* qr);
// The indices of the k largest of v[0..n) (0 < k <= n) as llama.cpp's CPU top_k picks them:
// libstdc++'s std::partial_sort heap selection over 0..n-1 with "v[a] > v[b]", so equal values
// resolve the same way; written out here so the choice does not depend on the standard library.
// out[0..k) in heap order.
void top_k_heap_select(const float* v, int32_t n, int32_t k, int32_t* out);

// Gated DeltaNet, the recurrent mixer of hybrid blocks (layers_deltanet.cpp; qwen3next,
// qwen35moe): its tensors (attn_norm, attn_qkv, attn_gate, ssm_*) and the mixer, which reads
// and advances each sequence's recurrent state (f.rec) token by token.
Status bind_deltanet(TensorBinder& b, const HParams& hp, int il, LayerWeights* lw);
void attention_deltanet(Fwd& f, int il, const LayerWeights& lw, const float* xn, float* out);

// KDA (Kimi Delta Attention, kimi-k3; layers_deltanet.cpp): the same recurrence with a decay per
// key channel, separate q/k/v projections each with its own causal convolution, and a full-rank
// sigmoid output gate; the same per-sequence state layout (conv window [q|k|v], then the heads).
Status bind_kda(TensorBinder& b, const HParams& hp, int il, LayerWeights* lw);
void attention_kda(Fwd& f, int il, const LayerWeights& lw, const float* xn, float* out);

}  // namespace detail
}  // namespace moesh
