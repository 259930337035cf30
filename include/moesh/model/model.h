// A loaded MoE model (any architecture of the registry, src/model/arch.h) and the context that
// runs it.
//
// Model: hyper-parameters from GGUF metadata and zero-copy views of every weight (or, in the
// "dequant-f32" debug mode, owned F32 copies). Immutable after load; shareable across contexts.
// Context: per-sequence state (KV cells, recurrent state), thread pool, expert executor and
// scratch buffers; decode() runs a batch of tokens through the forward pass (src/model/context.cpp).
//
// Numerics follow llama.cpp (docs/background/moe-architectures.md, reference README §7): activations are
// quantized per row to the weight's vec_dot_type inside matmul, RMSNorm sums in double, the router
// runs in f32, the routed sum is formed in router rank order.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "moesh/gguf/gguf.h"
#include "moesh/model/kv_cache.h"
#include "moesh/model/seq_state.h"
#include "moesh/model/span.h"
#include "moesh/moe/executor.h"
#include "moesh/moe/routing.h"
#include "moesh/tensor/ops.h"
#include "moesh/tensor/tensor.h"
#include "moesh/tensor/threadpool.h"
#include "moesh/util/status.h"

namespace moesh {

struct ArchDef;  // src/model/arch.h: one per architecture

// Names of the architectures this build runs (the registry, in order).
std::vector<std::string> supported_architectures();
// The architectures whose NextN/MTP blocks run as a draft head (`--draft nextn`).
std::vector<std::string> nextn_architectures();

struct HParams;
// The chat template family of the model's architecture ("harmony", "glm4", "chatml", ...), for
// files without tokenizer.chat_template; empty when the architecture has no single family.
std::string_view chat_family_of(const HParams& hp);

// How the GQA family normalises Q and K before RoPE.
enum class QkNorm : uint8_t {
  kNone = 0,
  kPerHead,     // RMSNorm per head with weights attn_q_norm/attn_k_norm [head_dim] (qwen3moe, glm4moe)
  kFull,        // RMSNorm over the whole projection, weights [n_head*head_dim] (minimax-m2)
  kUnweighted,  // RMSNorm per head without weights, after RoPE (llama4's "L2 norm")
};

// Everything the forward pass needs from the metadata, with llama.cpp's defaults applied. The
// shared fields are read for every architecture (hparams.cpp); the rest by the arch's file.
struct HParams {
  const ArchDef* arch = nullptr;
  std::string arch_name;  // general.architecture
  int64_t n_vocab = 0;
  int64_t n_ctx_train = 0;
  int64_t n_embd = 0;
  int64_t n_layer = 0;
  int64_t n_head = 0;  // query heads (with per-block counts: the largest)
  int64_t n_head_kv = 0;
  // attention.head_count as a per-block array (step35; the NextN blocks included): block il's
  // query heads. Empty: n_head everywhere.
  std::vector<int64_t> n_head_layer;
  int64_t n_head_of(int64_t il) const {
    return il >= 0 && il < static_cast<int64_t>(n_head_layer.size()) ? n_head_layer[static_cast<size_t>(il)] : n_head;
  }
  int64_t head_dim_k = 0;  // per-head K/Q width as attention sees it (MLA: kv_lora + n_rot)
  int64_t head_dim_v = 0;  // per-head V width (MLA: kv_lora)
  int64_t n_rot = 0;
  float rms_eps = 1e-5f;
  int64_t n_ff = 0;  // dense FFN width (llama: expert width)

  // MoE
  int64_t n_expert = 0;
  int64_t n_expert_used = 0;
  int64_t n_ff_exp = 0;
  int64_t n_expert_shared = 0;
  int64_t n_ff_shexp = 0;  // shared expert width when given on its own (qwen3next); 0: n_ff_exp * n_expert_shared
  int64_t n_nextn = 0;     // NextN/MTP blocks stored after the n_layer decoder blocks: never in the forward pass
  int64_t n_leading_dense = 0;
  int64_t n_moe_layer_step = 0;  // MoE every n-th block (llama4 interleave_moe_layer_step)
  GatingFunc gating = GatingFunc::kSoftmax;
  bool norm_w = false;
  float w_scale = 0.0f;
  int64_t n_group = 0;
  int64_t n_group_used = 0;
  bool select_on_logits = false;  // top-k of raw router logits (llama4)

  // MLA (deepseek2)
  int64_t q_lora_rank = 0;
  int64_t kv_lora_rank = 0;
  int64_t head_dim_qk_mla = 0;  // nope + rope (key_length_mla)
  int64_t head_dim_v_mla = 0;   // value_length_mla

  // Latent MoE (kimi-k3 expert_latent_length): the routed experts run in this width — the backbone
  // projects x down (ffn_routed_down), dispatches the latent rows, then norms and projects the
  // routed sum back up. 0: experts take n_embd-wide rows.
  int64_t n_expert_latent = 0;
  int64_t n_embd_exp() const { return n_expert_latent > 0 ? n_expert_latent : n_embd; }
  // Cross-layer residual attention (kimi-k3 attn_res.block_size B > 0; layers.h residual_mix):
  // every B-th block banks its input as a checkpoint and restarts the stream; each mixer, FFN
  // and the output head read a softmax-weighted mix of the checkpoints and the stream.
  int64_t attn_res_block = 0;
  // The checkpoints banked by blocks 0..il-1 (every B-th block banks one), which blocks from il on
  // read; il = n_layer: those the output head reads.
  int64_t residual_ckpts_before(int64_t il) const {
    return attn_res_block > 0 && il > 0 ? (il + attn_res_block - 1) / attn_res_block : 0;
  }
  // The width of a hidden row entering block il from elsewhere (a span boundary): the stream, and
  // with cross-layer residual attention each checkpoint banked before il — [p | c_0 | c_1 | ...];
  // then, where a block from il on reuses an indexer selection made before il (glm-dsa), that
  // selection: [count | its positions, top_k floats] (layers.h pack_span_rows).
  int64_t span_row_width(int64_t il) const {
    return n_embd * (1 + residual_ckpts_before(il)) + (carries_selection(il) ? 1 + indexer_top_k : 0);
  }
  // The widest span row of the model (buffers that hold rows entering any block).
  int64_t max_span_row_width() const {
    int64_t w = 0;
    for (int64_t il = 0; il <= n_layer; ++il) w = w > span_row_width(il) ? w : span_row_width(il);
    return w;
  }
  // Whether span rows are ever wider than the stream (then they are packed, not the stream itself).
  bool span_rows_wide() const { return max_span_row_width() > n_embd; }
  // DeepSeek-style sparse attention (glm-dsa): the lightning indexer (layers_indexer.cpp) keeps,
  // per query token, the indexer_top_k cells of highest indexer score; MLA attends to those only.
  // indexer_source[il]: block il computes its own selection (== il), reuses the selection of an
  // earlier block (< il), or attends densely (-1; also every block beyond the array, e.g. NextN).
  int64_t n_indexer_head = 0, indexer_head_dim = 0, indexer_top_k = 0;
  std::vector<int32_t> indexer_source;
  int32_t indexer_source_of(int64_t il) const {
    return il >= 0 && il < static_cast<int64_t>(indexer_source.size()) ? indexer_source[static_cast<size_t>(il)] : -1;
  }
  // Whether a block from il on reuses the selection of a block before il: then rows entering il
  // from another place carry that selection (span_row_width). At most one is live at a time — a
  // block reuses the nearest earlier block with an indexer, whose selection is the batch's last.
  bool carries_selection(int64_t il) const {
    for (int64_t j = il; j < static_cast<int64_t>(indexer_source.size()); ++j) {
      if (indexer_source_of(j) >= 0 && indexer_source_of(j) < il) return true;
    }
    return false;
  }

  RopeParams rope;  // mode, n_rot, base, YaRN (freq_factors set by the loader)
  // Sliding-window blocks' own RoPE when rope_swa_own (step35: rope.freq_base_swa over the whole
  // head, no rope_freqs); otherwise they use `rope` like the others.
  bool rope_swa_own = false;
  RopeParams rope_swa;
  float kq_scale = 0.0f;  // attention score scale; 0 until set (default 1/sqrt(head_dim_k))
  // The rope.scaling.* keys as stored (RopeParams holds what the kernels use).
  struct RopeScaling {
    float factor = 1.0f;  // 1 without scaling
    float log_mul = 0.0f;
    float attn_factor_cfg = 1.0f;
    bool yarn = false;
  } rope_scaling;
  bool rope_attn_factor_set = false;  // the arch set rope.attn_factor itself

  // Attention variants of the GQA family (layers.h attention_gqa).
  QkNorm qk_norm = QkNorm::kNone;
  bool q_gated = false;            // attn_q emits [query | gate] per head; o *= sigmoid(gate) (qwen3next)
  int64_t n_swa = 0;               // layers marked swa: a query sees the last n_swa cells ...
  bool swa_chunked = false;        // ... or only its own chunk of n_swa positions (llama4: 8192)
  int64_t swa_period = 0;          // gpt-oss sliding_window_pattern: the last block of each period is full
  std::vector<uint8_t> swa_layer;  // per block (step35's sliding_window_pattern array): 1 = sliding window
  // Per block (step35 swiglu_clamp_shexp): the dense FFN's / shared expert's SwiGLU limit
  // (LayerWeights::swiglu_limit); the routed experts' limits are expert_ffn.swiglu_limit.
  std::vector<float> ffn_swiglu_limit;
  // MiniMax sparse attention (minimax-m3; layers_msa.cpp): blocks >= n_leading_dense run a
  // block indexer (one indexer head per KV group) and their query heads attend only to the
  // position blocks their group selected. n_head == 0: off.
  struct Msa {
    int64_t n_head = 0;    // attention.indexer.head_count (== n_head_kv)
    int64_t head_dim = 0;  // attention.indexer.key_length
    int64_t top_k = 0;     // attention.indexer.top_k: blocks taken per query and group
    int64_t block = 0;     // attention.indexer.block_size: positions per block
    int64_t local = 0;     // attention.indexer.local_blocks: most recent blocks always taken
  } msa;
  int64_t no_rope_step = 0;      // llama4: every n-th block is NoPE
  float attn_temp_scale = 0.0f;  // NoPE layers' query temperature (llama4: 0.1; 0 = off)
  float attn_temp_floor = 8192.0f;

  // Floats per cache cell and layer (set by the arch: GQA n_head_kv*head_dim, MLA latent).
  int64_t kv_k_width = 0, kv_v_width = 0;

  // Hybrid models: blocks whose token mixer is recurrent (gated DeltaNet) keep a recurrent
  // state instead of KV cells. Set by the arch (empty: every block attends); the loader derives
  // the slots: state_slot[il] is block il's layer in the KV cache or in the recurrent state.
  std::vector<uint8_t> recurrent;  // [n_layer]
  std::vector<int32_t> state_slot;
  int64_t n_kv_layer = 0, n_rec_layer = 0;
  int64_t rec_width = 0;  // floats of recurrent state per recurrent layer and sequence
  bool is_recurrent(int64_t il) const { return !recurrent.empty() && recurrent[static_cast<size_t>(il)] != 0; }

  // Gated DeltaNet (qwen3next, qwen35moe; ssm.* keys).
  struct DeltaNet {
    int64_t d_conv = 0;         // ssm.conv_kernel: taps of the causal convolution
    int64_t d_state = 0;        // ssm.state_size: head size of q, k and v
    int64_t n_k_head = 0;       // ssm.group_count: query/key heads
    int64_t n_v_head = 0;       // ssm.time_step_rank: value heads (each has its own state)
    int64_t d_inner = 0;        // ssm.inner_size = n_v_head * d_state
    bool tiled = false;         // value head h reads key head h % n_k_head (qwen35moe), else h / (n_v/n_k)
    bool split_ba = false;      // separate ssm_beta / ssm_alpha (qwen35moe), else one grouped ssm_ba
    int64_t attn_interval = 4;  // full_attention_interval: block il attends when (il + 1) % it == 0
    int64_t conv_channels() const { return 2 * n_k_head * d_state + d_inner; }
    // KDA (kimi-k3 kda.*): separate q/k/v projections and convolutions, a decay per key channel
    // g = gate_lower_bound * sigmoid(exp(A_log) * f) and a full-rank sigmoid output gate.
    bool kda = false;
    float gate_lower_bound = 0.0f;
  } dnet;

  // The routed expert FFN (activation, biases, input scaling): part of the model's identity,
  // the same definition on the backbone and on every worker (swarm HELLO).
  ExpertFfn expert_ffn;
  bool shexp_gated = false;  // shared expert scaled by sigmoid(ffn_gate_inp_shexp . x)

  int64_t head_dim_qk_nope() const { return head_dim_qk_mla - n_rot; }
  // The routing these settings describe (validated at load); `sel_bias` is a layer's selection
  // bias (exp_probs_b) or null.
  RouterConfig router_config(const float* sel_bias = nullptr) const;
};

// Reads and validates the hyper-parameters for the file's architecture. Missing required keys
// give kNotFound naming the key ("qwen3moe.expert_count missing").
Result<HParams> load_hparams(const gguf::File& f);

// Weights of one block. Views not used by the architecture stay invalid.
// Grouped by the piece of the layer library that reads them (layers.h), not by architecture:
// an architecture binds the pieces it uses, the others stay invalid.
struct LayerWeights {
  TensorView attn_norm;
  // GQA family (attention_gqa): projections, optional biases, Q/K norms, attention sinks
  TensorView wq, wk, wv, wo, q_norm, k_norm;
  TensorView bq, bk, bv, bo, sinks;
  bool rope = true;  // false: a NoPE layer (llama4)
  bool swa = false;  // sliding-window layer (hp.n_swa)
  // Attention reads K and V rounded to F16 (minimax-m3's dense blocks: llama.cpp's flash attention
  // casts the F32 cache to F16 there); the cache keeps the rounded rows.
  bool kv_f16 = false;
  TensorView head_gate;  // attn_gate [n_embd, n_head]: output of head h *= sigmoid(head_gate_h · x) (step35)
  TensorView out_gate;   // attn_gate [n_embd, n_head*v]: MLA output *= sigmoid(out_gate · x), elementwise (kimi-k3)
  // MiniMax sparse attention's block indexer (hp.msa; invalid in dense blocks): indexer.q_proj
  // [n_embd, msa.n_head * msa.head_dim], k_proj [n_embd, msa.head_dim], q_norm / k_norm [msa.head_dim]
  TensorView msa_q, msa_k, msa_q_norm, msa_k_norm;
  // MLA (deepseek2)
  TensorView wq_a, q_a_norm, wq_b, wkv_a_mqa, kv_a_norm, wk_b, wv_b;
  // Lightning indexer (glm-dsa blocks that compute their own selection): iq = idx_wq_b · qr,
  // ik = layernorm(idx_wk · x) ⊙ idx_k_norm + idx_k_norm_b, head weights idx_proj · x.
  TensorView idx_wq_b, idx_wk, idx_k_norm, idx_k_norm_b, idx_proj;
  TensorView ffn_norm;
  // dense FFN
  TensorView ffn_gate, ffn_up, ffn_down;
  // > 0: the dense FFN and the shared expert use the clamped SwiGLU min(silu(g), L) * clamp(u, ±L)
  // (step35 swiglu_clamp_shexp); the routed experts' limit is experts.swiglu_limit.
  float swiglu_limit = 0.0f;
  // The dense FFN's and the shared expert's activation (minimax-m3: kSwigluOai; routed experts:
  // experts.act).
  ExpertActivation ffn_act = ExpertActivation::kSilu;
  // MoE
  bool is_moe = false;
  TensorView router;       // ffn_gate_inp [n_embd, n_expert], F32
  TensorView router_b;     // ffn_gate_inp.bias [n_expert] or invalid (gpt-oss)
  TensorView exp_probs_b;  // [n_expert] or invalid
  ExpertWeights experts;
  TensorView gate_shexp, up_shexp, down_shexp;
  TensorView shexp_gate;  // ffn_gate_inp_shexp [n_embd] (hp.shexp_gated)
  // Gated DeltaNet (a recurrent block of a hybrid): fused q/k/v projection, output gate z,
  // beta/alpha (one grouped ssm_ba, or ssm_beta + ssm_alpha), convolution, decay and norm.
  TensorView wqkv, wqkv_gate, ssm_ba, ssm_beta, ssm_alpha, ssm_conv1d, ssm_dt_b, ssm_a, ssm_norm, ssm_out;
  // KDA (kimi-k3): q/k/v use wq/wk/wv and wo; per-projection convolutions, decay factors, output gate.
  TensorView ssm_conv_q, ssm_conv_k, ssm_conv_v, ssm_f_a, ssm_f_b, ssm_g;
  // Latent MoE (hp.n_expert_latent): x -> latent, the routed sum's norm, latent -> n_embd.
  TensorView ffn_routed_down, ffn_routed_norm, ffn_routed_up;
  // Cross-layer residual attention (hp.attn_res_block): the mix scores before mixer and FFN.
  TensorView attn_res_score, ffn_res_score;
};

struct LoadOptions {
  // Debug engine mode: dequantize every weight to F32 at load (matches *.dequant-f32.logits.json).
  bool dequant_f32 = false;
  // Reference mode (tests): reproduce which CPU flash-attention kernel llama.cpp picks per batch
  // in blocks whose K/V it casts to F16 (LayerWeights::kv_f16, minimax-m3's dense blocks): under
  // 64 tokens its one-row kernel, which rounds Q to F16 and accumulates V in F16
  // (AttnCoreOpts::fa_f16); from 64 its tiled F32 kernel, which moesh follows otherwise. Makes
  // a token's bits depend on its batch: never for serving.
  bool llama_fa_batches = false;
  // Where the weights live (gguf::FileLoad). kAuto reads the file into huge-page memory when it
  // takes at most half of the memory available now (decode streams every weight per token, and
  // 4 KiB file pages made it 1.4x slower), else maps it.
  enum class Memory { kAuto, kMap, kMemory };
  Memory memory = Memory::kAuto;
};
// The FileLoad that LoadOptions::memory means for a file of `file_bytes` on this machine now.
gguf::FileLoad choose_file_load(LoadOptions::Memory m, uint64_t file_bytes);

// A NextN/MTP block (DeepSeek-V3-style multi-token prediction; glm4moe files carry one after the
// decoder): a decoder block whose input mixes the next token's embedding with the decoder's final
// hidden state, and its own output head (src/model/nextn.cpp runs it as a draft source):
//   x = eh_proj · [ enorm(embed(t_{i+1})) | hnorm(h_i) ];  x = block(x);  logits = head(head_norm(x))
struct NextnWeights {
  LayerWeights block;                // blk.N.*: attention, norms, FFN (MoE) as the decoder's
  TensorView eh_proj, enorm, hnorm;  // blk.N.nextn.{eh_proj,enorm,hnorm}
  TensorView head_norm;              // blk.N.nextn.shared_head_norm
  TensorView head;                   // blk.N.nextn.shared_head_head, else the model's output
  TensorView embed;                  // blk.N.nextn.embed_tokens, else token_embd
};

class Model {
 public:
  static Result<std::unique_ptr<Model>> load(const std::string& path, const LoadOptions& opts = {});
  static Result<std::unique_ptr<Model>> from_file(std::unique_ptr<gguf::File> file, const LoadOptions& opts = {});
  ~Model();

  const HParams& hparams() const { return hp_; }
  const gguf::File& file() const { return *file_; }
  const LoadOptions& options() const { return opts_; }
  // The blocks this file holds: all of them, or a span slice's (`moesh slice --layers`), which
  // only a context restricted to them (ContextParams::layers) can run.
  const LayerSpan& blocks() const { return blocks_; }
  bool holds_all_blocks() const { return blocks_.first == 0 && blocks_.last == hp_.n_layer - 1; }

  TensorView tok_embd, output_norm, output;
  TensorView output_res_score;  // the output head's residual mix (hp.attn_res_block > 0), else invalid
  std::vector<LayerWeights> layers;
  // Stacked routed-expert views per layer (invalid for dense layers), for executors.
  std::vector<ExpertWeights> expert_weights() const;
  // The NextN/MTP blocks the architecture can run as a draft head (ArchDef::bind_nextn), bound
  // when the file has them; never part of the forward pass. A block that fails to bind leaves
  // `nextn` empty and says why in nextn_status (the model itself still loads: the block is only
  // ever a draft source).
  std::vector<NextnWeights> nextn;
  Status nextn_status = Status::ok();

 private:
  Model() = default;
  Status bind_tensors();
  Result<TensorView> take(const std::string& name, std::vector<int64_t> ne, bool required = true);

  HParams hp_;
  LoadOptions opts_;
  LayerSpan blocks_;
  std::unique_ptr<gguf::File> file_;
  std::vector<std::vector<float>> owned_;  // dequant-f32 copies
};

// Receives intermediate results during decode (tests, debugging). Default: ignore.
class ForwardObserver {
 public:
  virtual ~ForwardObserver() = default;
  // ids/weights [n_tokens][k] of MoE layer `layer`, in rank order.
  virtual void on_routing(int layer, int64_t n_tokens, int k, const int32_t* ids, const float* weights) {}
  // Routing margin of each token of MoE layer `layer` (routing_margins in routing.h), called
  // right after on_routing. Computed only while an observer is attached.
  virtual void on_routing_margins(int layer, int64_t n_tokens, const float* margins) {}
  // Sparse-attention selection margin of each token of a block that computes its own selection
  // (glm-dsa's lightning indexer: the top_k-th best indexer score minus the next best; +inf where
  // every visible cell is kept). Computed only while an observer is attached.
  virtual void on_selection_margins(int layer, int64_t n_tokens, const float* margins) {}
  // Residual stream after layer `layer`, [n_tokens][n_embd].
  virtual void on_layer_out(int layer, int64_t n_tokens, int64_t n_embd, const float* h) {}
};

// Two micro-batches (DeepSeek's dual micro-batch overlap): a step that carries several
// sequences runs as two halves of whole sequences, interleaved layer by layer, so while one
// half's routed experts are on the wire the backbone computes the other half's attention. Only
// with an executor whose submits overlap (remote workers). Every row's bits are the same either
// way (rows are batch-invariant), so it is purely a speed choice:
//   kOff  — never;  kOn — whenever a step has two or more sequences;
//   kAuto — measures step time both ways per batch size (log2 bucket of the sequence count) and
//           uses the faster, re-checking the other one every kAutoProbeEvery steps.
// Steps with an observer attached are never split (observers see whole-batch calls).
enum class MicroBatching { kOff = 0, kOn, kAuto };
inline constexpr int kAutoProbeEvery = 32;

struct MicroBatchStats {
  uint64_t steps_whole = 0;  // steps run as one batch (eligible or not)
  uint64_t steps_split = 0;  // steps run as two micro-batches
};

struct ContextParams {
  int n_threads = 0;  // <= 0: all cores
  int64_t n_ctx = 0;  // cells per sequence; <= 0: the model's context_length
  // Expert executor; null: a LocalExecutor over the model's experts on this context's pool.
  std::shared_ptr<ExpertExecutor> executor;
  MicroBatching micro_batching = MicroBatching::kAuto;
  CheckpointPolicy checkpoints = {};  // recurrent-state checkpoints (hybrid models only)
  // Blocks that run elsewhere (span peers, span.h); null: every block runs here. Steps of a
  // context with spans are never split into micro-batches, and observers see only the blocks
  // that run here.
  std::shared_ptr<SpanRunner> spans;
  // Only these blocks run here (a span peer: decode_layers within them), so only their KV cells
  // and recurrent state are kept. last < 0: every block (decode_batch needs that).
  LayerSpan layers{0, -1};
};

class Context {
 public:
  Context(const Model& model, const ContextParams& params);
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  // Runs n tokens of sequence `seq` at the positions following its cached cells. When `logits`
  // is non-null it receives n rows of n_vocab logits (all_logits) or one row for the last token.
  Status decode(int32_t seq, const int32_t* tokens, int64_t n, float* logits, bool all_logits = true);

  // One token of a multi-sequence batch (continuous batching).
  struct BatchToken {
    int32_t seq = 0;
    int32_t token = 0;
    bool logits = false;  // write this token's logits row
  };
  // Runs the tokens of several sequences in ONE forward pass, so each MoE layer makes one
  // executor call (one dispatch round trip) for all of them. A sequence's tokens must appear in
  // order; they continue that sequence's cells. `logits` receives one row of n_vocab per token
  // with logits=true, in batch order. Every row's bits equal what decode() gives for the same
  // sequence alone (batch-invariant kernels, attention per row). On error every sequence is
  // rolled back to its cells before the call.
  Status decode_batch(std::span<const BatchToken> batch, float* logits);

  // One token of a span step (the span peer's side of span.h).
  struct LayerToken {
    int32_t seq = 0;
    int64_t pos = 0;   // increasing within a sequence, above its cached positions
    bool cut = false;  // a cut after this token is likely (recurrent checkpoints)
  };
  // Runs blocks [first, last] only, for rows h [n][span_row_width(first)] that enter block `first`
  // (on return: the rows leaving block `last`, [n][span_row_width(last + 1)]; h must have room for
  // them — wider with cross-layer residual attention, which carries its checkpoints), appending each token to its
  // sequence's cells at the given position. No embedding, no output head. A token's bits are what decode_batch computes
  // for it in those blocks (the same block functions, batch-invariant). On error every sequence is rolled back to its
  // cells before the call.
  Status decode_layers(std::span<const LayerToken> toks, int first, int last, float* h);

  const Model& model() const { return model_; }
  // Every sequence's state (KV cells and, for hybrids, recurrent state): cut and copy here.
  SequenceState& state() { return state_; }
  // Cuts `seq` back to its first n_keep tokens, exactly: where the state cannot be cut there (a
  // recurrent state without a checkpoint at n_keep) it is cut at the nearest checkpoint below and
  // the tokens from there to n_keep are recomputed from `tokens` (the sequence's tokens, at least
  // n_keep of them; that recomputation is a forward pass, with its trips). n_keep >= seq_len: no-op.
  Status rewind(int32_t seq, int64_t n_keep, std::span<const int32_t> tokens);
  // The attention layers' cells (positions of every sequence; read by attention).
  KvCache& kv() { return kv_; }
  // The recurrent layers' state; null for a model without recurrent layers.
  RecurrentState* recurrent() { return rec_.get(); }
  ThreadPool& pool() { return *run_pool_; }
  // Computes on `pool` (another context's, used by one thread at a time with it; null: its own
  // again) while no decode runs. A span run in the backbone's process (SpanHost) borrows the
  // backbone context's pool: two pools spinning on the same cores cost 7-14 % of decode.
  void borrow_pool(ThreadPool* pool);
  void set_observer(ForwardObserver* obs) { observer_ = obs; }
  // When on, every decode keeps each token's final normed hidden state (output_norm(h), what the
  // output head reads) for hidden(): a model's own draft head (NextnDraft) drafts from them.
  void set_keep_hidden(bool on) { keep_hidden_ = on; }
  // [T][n_embd] rows of the last successful decode_batch, in batch order (empty unless
  // set_keep_hidden); valid until the next decode.
  std::span<const float> hidden() const;
  void set_micro_batching(MicroBatching m) { micro_batching_ = m; }
  MicroBatching micro_batching() const { return micro_batching_; }
  const MicroBatchStats& micro_batch_stats() const { return mb_stats_; }

  struct Scratch;  // forward-pass buffers (src/model/layers.h)

 private:
  // kAuto's measurements: per log2 bucket of the sequence count, mean step seconds of each way.
  struct MicroBatchPolicy {
    static constexpr int kBuckets = 8;
    double mean_s[kBuckets][2] = {};
    uint64_t n[kBuckets][2] = {};
    uint64_t decisions[kBuckets] = {};
    bool choose_split(int n_seq);
    void record(int n_seq, bool split, double seconds);
  };

  // A sequence's share of one step: the tokens it held before and the ones the step adds.
  struct SeqStep {
    int32_t seq;
    int64_t n_before, n_new = 0;
  };
  // Reserves the cells of the T tokens whose sequences are in scratch seq[]: positions continue
  // each sequence (given_pos null) or are given; fills scratch pos[] and cell[], the steps and
  // step_of[i] (token i's entry in steps), and begins the recurrent state's step (cut[i]: a cut
  // after token i is likely). On error nothing changed.
  Status map_spans();  // span_at_ from spans_->spans()
  Status reserve_cells(int64_t T, const int64_t* given_pos, const uint8_t* cut, std::vector<SeqStep>* steps,
                       std::vector<int32_t>* step_of);

  const Model& model_;
  std::unique_ptr<ThreadPool> pool_;
  ThreadPool* run_pool_ = nullptr;  // pool_, or a borrowed one (borrow_pool)
  KvCache kv_;
  std::unique_ptr<RecurrentState> rec_;
  ContextState state_;
  std::shared_ptr<ExpertExecutor> executor_;
  ForwardObserver* observer_ = nullptr;
  bool keep_hidden_ = false;
  int64_t n_hidden_ = 0;                         // rows of hidden() from the last decode
  std::unique_ptr<Scratch> scratch_, scratch2_;  // the second is the other micro-batch's
  MicroBatching micro_batching_ = MicroBatching::kAuto;
  MicroBatchPolicy mb_policy_;
  MicroBatchStats mb_stats_;
  std::shared_ptr<SpanRunner> spans_;
  std::vector<int> span_at_;            // [n_layer]: the span starting at block il, else -1
  uint64_t span_generation_ = 0;        // SpanRunner::begin_pass's, when span_at_ was mapped
  Status span_status_ = Status::ok();   // why the spans cannot be used (checked at decode)
  LayerSpan layers_{0, -1};             // ContextParams::layers, resolved
  int64_t kv_base_ = 0, rec_base_ = 0;  // the state slots of the first block of layers_
  std::vector<int32_t> slot_map_;       // with spans: per block, its state layer here (-1: a span's)
};

}  // namespace moesh
