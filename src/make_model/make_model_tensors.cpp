// make_model layout: which tensors a model has (names, ne, init), which type each gets, the
// order they are written in, and the metadata. Facts from docs/background/gguf-format.md §5-6,
// docs/background/quant-formats.md §8 and the reference manifest.
#include <algorithm>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "make_model/make_model_internal.h"
#include "moesh/make_model/make_model.h"
#include "moesh/tensor/quant.h"

namespace moesh {
namespace {

// Reference README: "std 0.5 token_embd, 0.04 attention/dense, 0.05 experts, 0.15 router,
// 0.08 output, 0.05 exp_probs_b, norms 1 + 0.1 N".
constexpr WeightInit kInitEmbd{0.0f, 0.5f};
constexpr WeightInit kInitOutput{0.0f, 0.08f};
constexpr WeightInit kInitNorm{1.0f, 0.1f};
constexpr WeightInit kInitAttn{0.0f, 0.04f};
constexpr WeightInit kInitDense{0.0f, 0.04f};
constexpr WeightInit kInitExpert{0.0f, 0.05f};
constexpr WeightInit kInitRouter{0.0f, 0.15f};
constexpr WeightInit kInitProbsBias{0.0f, 0.05f};

bool contains(const std::string& s, const char* sub) {
  return s.find(sub) != std::string::npos;
}
bool ends_with(const std::string& s, std::string_view suf) {
  return s.size() >= suf.size() && s.compare(s.size() - suf.size(), suf.size(), suf) == 0;
}

// llama-quantize's use_more_bits: the first and last eighth of the layers and every third
// layer in between get the bigger type.
bool more_bits(int64_t i, int64_t n) {
  return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2;
}

int parse_block_index(const std::string& name) {
  int i = -1;
  if (std::sscanf(name.c_str(), "blk.%d.", &i) != 1) return -1;
  return i;
}

class LayoutBuilder {
 public:
  explicit LayoutBuilder(const MakeModelSpec& s) : spec_(s) {}

  void add(const std::string& name, std::vector<int64_t> ne, WeightInit init, int layer, bool is_expert = false) {
    PlannedTensor t;
    t.name = name;
    t.n_dims = static_cast<int>(ne.size());
    for (size_t i = 0; i < ne.size(); ++i) t.ne[i] = ne[i];
    t.init = init;
    t.layer = layer;
    t.is_expert = is_expert;
    out_.push_back(std::move(t));
  }
  void add_blk(int il, const char* suffix, std::vector<int64_t> ne, WeightInit init, bool is_expert = false) {
    add("blk." + std::to_string(il) + "." + suffix, std::move(ne), init, il, is_expert);
  }

  std::vector<PlannedTensor> take() { return std::move(out_); }
  const MakeModelSpec& spec() const { return spec_; }

 private:
  const MakeModelSpec& spec_;
  std::vector<PlannedTensor> out_;
};

void add_moe_ffn(LayoutBuilder& b, int il) {
  const auto& s = b.spec();
  b.add_blk(il, "ffn_gate_inp.weight", {s.n_embd, s.n_expert}, kInitRouter);
  b.add_blk(il, "ffn_gate_exps.weight", {s.n_embd, s.n_ff_exp, s.n_expert}, kInitExpert, true);
  b.add_blk(il, "ffn_up_exps.weight", {s.n_embd, s.n_ff_exp, s.n_expert}, kInitExpert, true);
  b.add_blk(il, "ffn_down_exps.weight", {s.n_ff_exp, s.n_embd, s.n_expert}, kInitExpert, true);
}

// Generator order of the reference F32 files (= converter order): globals, then per block
// norms/attention/FFN as below.
void layout_qwen3moe(LayoutBuilder& b) {
  const auto& s = b.spec();
  for (int il = 0; il < s.n_layer; ++il) {
    b.add_blk(il, "attn_norm.weight", {s.n_embd}, kInitNorm);
    b.add_blk(il, "attn_q.weight", {s.n_embd, s.n_head * s.head_dim}, kInitAttn);
    b.add_blk(il, "attn_k.weight", {s.n_embd, s.n_head_kv * s.head_dim}, kInitAttn);
    b.add_blk(il, "attn_v.weight", {s.n_embd, s.n_head_kv * s.head_dim}, kInitAttn);
    b.add_blk(il, "attn_output.weight", {s.n_head * s.head_dim, s.n_embd}, kInitAttn);
    b.add_blk(il, "attn_q_norm.weight", {s.head_dim}, kInitNorm);
    b.add_blk(il, "attn_k_norm.weight", {s.head_dim}, kInitNorm);
    b.add_blk(il, "ffn_norm.weight", {s.n_embd}, kInitNorm);
    add_moe_ffn(b, il);
  }
}

void layout_llama(LayoutBuilder& b) {
  const auto& s = b.spec();
  for (int il = 0; il < s.n_layer; ++il) {
    b.add_blk(il, "attn_norm.weight", {s.n_embd}, kInitNorm);
    b.add_blk(il, "attn_q.weight", {s.n_embd, s.n_head * s.head_dim}, kInitAttn);
    b.add_blk(il, "attn_k.weight", {s.n_embd, s.n_head_kv * s.head_dim}, kInitAttn);
    b.add_blk(il, "attn_v.weight", {s.n_embd, s.n_head_kv * s.head_dim}, kInitAttn);
    b.add_blk(il, "attn_output.weight", {s.n_head * s.head_dim, s.n_embd}, kInitAttn);
    b.add_blk(il, "ffn_norm.weight", {s.n_embd}, kInitNorm);
    add_moe_ffn(b, il);
  }
}

void layout_deepseek2(LayoutBuilder& b) {
  const auto& s = b.spec();
  const int64_t d_qk = s.qk_nope + s.qk_rope;
  const int64_t n_ff_sh = s.n_ff_exp * s.n_expert_shared;
  for (int il = 0; il < s.n_layer; ++il) {
    b.add_blk(il, "attn_norm.weight", {s.n_embd}, kInitNorm);
    b.add_blk(il, "attn_q_a_norm.weight", {s.q_lora_rank}, kInitNorm);
    b.add_blk(il, "attn_kv_a_norm.weight", {s.kv_lora_rank}, kInitNorm);
    b.add_blk(il, "attn_q_a.weight", {s.n_embd, s.q_lora_rank}, kInitAttn);
    b.add_blk(il, "attn_q_b.weight", {s.q_lora_rank, s.n_head * d_qk}, kInitAttn);
    b.add_blk(il, "attn_kv_a_mqa.weight", {s.n_embd, s.kv_lora_rank + s.qk_rope}, kInitAttn);
    b.add_blk(il, "attn_k_b.weight", {s.qk_nope, s.kv_lora_rank, s.n_head}, kInitAttn);
    b.add_blk(il, "attn_v_b.weight", {s.kv_lora_rank, s.v_head, s.n_head}, kInitAttn);
    b.add_blk(il, "attn_output.weight", {s.n_head * s.v_head, s.n_embd}, kInitAttn);
    b.add_blk(il, "ffn_norm.weight", {s.n_embd}, kInitNorm);
    if (il < s.n_leading_dense) {
      b.add_blk(il, "ffn_gate.weight", {s.n_embd, s.n_ff}, kInitDense);
      b.add_blk(il, "ffn_up.weight", {s.n_embd, s.n_ff}, kInitDense);
      b.add_blk(il, "ffn_down.weight", {s.n_ff, s.n_embd}, kInitDense);
      continue;
    }
    add_moe_ffn(b, il);
    // The selection bias exists in sigmoid-gated (DeepSeek-V3) models only.
    if (s.gating_func == 2) b.add_blk(il, "exp_probs_b.bias", {s.n_expert}, kInitProbsBias);
    if (s.n_expert_shared > 0) {
      b.add_blk(il, "ffn_gate_shexp.weight", {s.n_embd, n_ff_sh}, kInitExpert);
      b.add_blk(il, "ffn_up_shexp.weight", {s.n_embd, n_ff_sh}, kInitExpert);
      b.add_blk(il, "ffn_down_shexp.weight", {n_ff_sh, s.n_embd}, kInitExpert);
    }
  }
}

// llama.cpp's loader keeps weights in a map ordered by (block index, name) with global tensors
// (index -1) first; llama-quantize writes them in that order.
void sort_like_llama_quantize(std::vector<PlannedTensor>& ts) {
  std::stable_sort(ts.begin(), ts.end(), [](const PlannedTensor& a, const PlannedTensor& b) {
    if (a.layer != b.layer) return a.layer < b.layer;
    return a.name < b.name;
  });
}

using Kvs = std::vector<std::pair<std::string, gguf::Value>>;

void put(Kvs& kvs, const std::string& key, gguf::Value v) {
  kvs.emplace_back(key, std::move(v));
}
gguf::Value u32(int64_t x) {
  return gguf::Value::u32(static_cast<uint32_t>(x));
}

}  // namespace

GgmlType make_model_tensor_type(MakeFileType ftype, const std::string& name, int n_dims, const int64_t ne[4],
                                int64_t n_layer, int64_t n_expert, int i_attn_v, int n_attn_v) {
  // llama-quantize's filter: only 2-D/3-D "...weight" tensors, never norms, routers, the
  // DeltaNet / KDA convolutions (ssm_conv1d, kimi-k3's ssm_conv1d_{q,k,v}) or MSA's indexer
  // projections (minimax-m3 indexer.q_proj / k_proj).
  const bool quantize = n_dims >= 2 && ends_with(name, "weight") && !contains(name, "_norm.weight") &&
                        !contains(name, "ffn_gate_inp.weight") && !contains(name, "ssm_conv1d") &&
                        !contains(name, "indexer.q_proj.") && !contains(name, "indexer.k_proj.");
  if (!quantize) return GgmlType::F32;
  switch (ftype) {
    case MakeFileType::kF32:
      return GgmlType::F32;
    case MakeFileType::kF16:
      return GgmlType::F16;
    case MakeFileType::kQ8_0:
      return GgmlType::Q8_0;
    case MakeFileType::kQ4_K_M:
      break;
    case MakeFileType::kCOUNT:
      return GgmlType::F32;
  }

  GgmlType t = GgmlType::Q4_K;
  if (name == "output.weight") {
    t = (ne[0] % quant::kQKK != 0) ? GgmlType::Q8_0 : GgmlType::Q6_K;
  } else if (contains(name, "attn_v.weight") || contains(name, "attn_qkv.weight")) {
    // llama-quantize treats a fused QKV like attn_v (category_is_attn_v): its branch for
    // ATTENTION_QKV alone is never reached.
    if (more_bits(i_attn_v, n_attn_v)) t = GgmlType::Q6_K;
    // "for the 8-expert model, bumping this to Q8_0 trades just ~128MB"
    if (n_expert == 8) t = GgmlType::Q8_0;
  } else if (contains(name, "attn_k.weight")) {
    if (n_expert == 8) t = GgmlType::Q8_0;
  } else if (contains(name, "ffn_down")) {
    // MoE models: the layer comes from the name (experts are not in layer order upstream).
    const int il = parse_block_index(name);
    if (il >= 0 && more_bits(il, n_layer)) t = GgmlType::Q6_K;
  } else if (contains(name, "attn_output.weight")) {
    if (n_expert == 8) t = GgmlType::Q5_K;
  }

  // Rows that are not whole K-quant super-blocks fall back to a 32-block type, then to F16.
  if (ne[0] % type_block_size(t) != 0) {
    switch (t) {
      case GgmlType::Q4_K:
        t = GgmlType::Q5_0;
        break;
      case GgmlType::Q5_K:
        t = GgmlType::Q5_1;
        break;
      case GgmlType::Q6_K:
        t = GgmlType::Q8_0;
        break;
      default:
        break;
    }
    if (ne[0] % type_block_size(t) != 0) t = GgmlType::F16;
  }
  return t;
}

// The arch file's own tensor table (the loader's), with the reference generator's stds by role.
WeightInit registry_init(const std::string& arch, const std::string& name) {
  if (name == "token_embd.weight") return kInitEmbd;
  if (name == "output.weight") return kInitOutput;
  if (contains(name, "norm.weight")) return kInitNorm;
  if (contains(name, "attn_sinks")) return {0.0f, 1.0f};
  if (arch == "kimi-k3") {                     // reference README §3: KDA's decay inputs and the residual scores
    const bool a = ends_with(name, ".ssm_a");  // -exp(A_log) = -U(1, 4); dt bias U(-1.5, -0.5)
    if (a || contains(name, "ssm_dt.bias")) {
      WeightInit w;
      w.dist = WeightInit::Dist::kUniform;
      w.lo = a ? -4.0f : -1.5f, w.hi = a ? -1.0f : -0.5f;
      return w;
    }
    if (contains(name, "ssm_f_b")) return {0.0f, 0.1f};
    if (contains(name, "res_score")) return {0.0f, 0.08f};
  }
  // Gated DeltaNet (reference README §3): ssm_a holds -exp(A_log) = -U(1, 16); dt bias is
  // softplus^-1 of U(0.001, 0.1); the convolution 0.3; beta/alpha projections 0.1.
  if (ends_with(name, ".ssm_a")) {
    WeightInit w;
    w.dist = WeightInit::Dist::kUniform, w.lo = -16.0f, w.hi = -1.0f;
    return w;
  }
  if (contains(name, "ssm_dt.bias")) {
    WeightInit w;
    w.dist = WeightInit::Dist::kSoftplusInverse, w.lo = 0.001f, w.hi = 0.1f;
    return w;
  }
  if (contains(name, "ssm_conv1d")) return {0.0f, 0.3f};
  if (contains(name, "ssm_ba") || contains(name, "ssm_alpha") || contains(name, "ssm_beta")) return {0.0f, 0.1f};
  if (contains(name, "exp_probs_b")) return kInitProbsBias;
  if (contains(name, "ffn_gate_inp.bias")) return {0.0f, 0.1f};
  if (ends_with(name, ".bias")) return {0.0f, 0.02f};
  if (contains(name, "ffn_gate_inp")) return kInitRouter;  // router and shared-expert gate
  if (arch == "gpt-oss") {  // reference README §3: the +-7 clamp must really be exercised
    if (contains(name, "ffn_gate_exps") || contains(name, "ffn_up_exps")) return {0.0f, 0.3f};
    if (contains(name, "ffn_down_exps")) return {0.0f, 0.015f};
  }
  if (contains(name, "_exps.") || contains(name, "_shexp.")) return kInitExpert;
  if (contains(name, "ffn_")) return kInitDense;
  return kInitAttn;
}

void layout_registry(LayoutBuilder& b) {
  const MakeModelSpec& s = b.spec();
  auto plan = detail::registry_make_plan(s);
  if (!plan) return;  // validate() reported it
  for (const ArchTensorSpec& t : plan->tensors) {
    if (s.tied_embeddings && t.name == "output.weight") continue;
    b.add(t.name, t.ne, registry_init(s.registry_arch, t.name), t.layer,
          t.ne.size() == 3 && contains(t.name, "_exps."));
  }
}

namespace detail {

std::vector<PlannedTensor> make_model_layout(const MakeModelSpec& s) {
  LayoutBuilder b(s);
  if (s.arch == MakeArch::kRegistry) {
    layout_registry(b);
  } else {
    b.add("token_embd.weight", {s.n_embd, s.n_vocab}, kInitEmbd, -1);
    b.add("output_norm.weight", {s.n_embd}, kInitNorm, -1);
    if (!s.tied_embeddings) b.add("output.weight", {s.n_embd, s.n_vocab}, kInitOutput, -1);
  }
  switch (s.arch) {
    case MakeArch::kQwen3Moe:
      layout_qwen3moe(b);
      break;
    case MakeArch::kLlama:
      layout_llama(b);
      break;
    case MakeArch::kDeepseek2:
      layout_deepseek2(b);
      break;
    case MakeArch::kRegistry:
    case MakeArch::kCOUNT:
      break;
  }
  std::vector<PlannedTensor> ts = b.take();

  const bool quantized = s.type == MakeFileType::kQ8_0 || s.type == MakeFileType::kQ4_K_M;
  if (quantized) sort_like_llama_quantize(ts);

  // attn_v counter in processing (= file) order, as llama-quantize counts it.
  int n_attn_v = 0;
  auto attn_v_like = [](const std::string& n) {
    return contains(n, "attn_v.weight") || contains(n, "attn_qkv.weight");
  };
  for (const auto& t : ts) n_attn_v += attn_v_like(t.name) ? 1 : 0;
  int i_attn_v = 0;
  uint64_t off = 0;
  // llama-quantize's layer count is block_count: NextN blocks after the decoder included.
  int64_t n_blocks = s.n_layer;
  for (const auto& t : ts) n_blocks = std::max<int64_t>(n_blocks, t.layer + 1);
  for (auto& t : ts) {
    const bool is_v = attn_v_like(t.name);
    t.type = make_model_tensor_type(s.type, t.name, t.n_dims, t.ne, n_blocks, s.n_expert, i_attn_v, n_attn_v);
    if (is_v) ++i_attn_v;
    const int64_t bs = type_block_size(t.type);
    t.n_bytes = (t.ne[0] % bs == 0) ? type_row_bytes(t.type, t.ne[0]) * uint64_t(t.n_rows()) : 0;
    t.offset = off;
    off += (t.n_bytes + kMakeModelAlignment - 1) / kMakeModelAlignment * kMakeModelAlignment;
  }
  return ts;
}

std::vector<std::pair<std::string, gguf::Value>> make_model_kvs(const MakeModelSpec& s) {
  const std::string a = s.arch_name();
  const bool quantized = s.type == MakeFileType::kQ8_0 || s.type == MakeFileType::kQ4_K_M;
  Kvs kvs;
  put(kvs, "general.architecture", gguf::Value::str(a));
  put(kvs, "general.name", gguf::Value::str(s.name.empty() ? "moesh-random-" + a : s.name));
  put(kvs, "general.description",
      gguf::Value::str("random-weight MoE test model written by moesh make-model (seed " + std::to_string(s.seed) +
                       "; not a real model)"));
  // Converters write file_type early; llama-quantize re-adds it at the end (below).
  if (!quantized) put(kvs, "general.file_type", u32(make_file_type_ftype(s.type)));

  if (s.arch == MakeArch::kRegistry) {
    // The arch file's own keys (the inverse of its read_hparams), then the tokenizer.
    if (auto plan = registry_make_plan(s); plan.is_ok()) {
      for (auto& [k, v] : plan->kvs) put(kvs, k, v);
    }
    if (s.vocab == MakeVocab::kNone) put(kvs, "tokenizer.ggml.model", gguf::Value::str("no_vocab"));
    if (s.vocab == MakeVocab::kBpe) append_make_vocab_kvs(s, kvs);
    if (quantized) {
      put(kvs, "general.quantization_version", gguf::Value::u32(2));
      put(kvs, "general.file_type", u32(make_file_type_ftype(s.type)));
    }
    return kvs;
  }
  put(kvs, a + ".vocab_size", u32(s.n_vocab));
  put(kvs, a + ".context_length", u32(s.n_ctx));
  put(kvs, a + ".embedding_length", u32(s.n_embd));
  put(kvs, a + ".block_count", u32(s.n_layer));
  put(kvs, a + ".attention.head_count", u32(s.n_head));
  switch (s.arch) {
    case MakeArch::kQwen3Moe:
      put(kvs, a + ".attention.head_count_kv", u32(s.n_head_kv));
      put(kvs, a + ".attention.key_length", u32(s.head_dim));
      put(kvs, a + ".attention.value_length", u32(s.head_dim));
      break;
    case MakeArch::kLlama:
      put(kvs, a + ".attention.head_count_kv", u32(s.n_head_kv));
      // llama.cpp defaults key/value length to n_embd/n_head; only write them when different.
      if (s.head_dim * s.n_head != s.n_embd) {
        put(kvs, a + ".attention.key_length", u32(s.head_dim));
        put(kvs, a + ".attention.value_length", u32(s.head_dim));
      }
      put(kvs, a + ".rope.dimension_count", u32(s.head_dim));
      // Mixtral's expert width lives in feed_forward_length.
      put(kvs, a + ".feed_forward_length", u32(s.n_ff_exp));
      break;
    case MakeArch::kRegistry:
      break;
    case MakeArch::kDeepseek2:
      // MLA as the converter writes it: one latent KV head of kv_lora + rope dims.
      put(kvs, a + ".attention.head_count_kv", u32(1));
      put(kvs, a + ".attention.key_length", u32(s.kv_lora_rank + s.qk_rope));
      put(kvs, a + ".attention.value_length", u32(s.kv_lora_rank));
      put(kvs, a + ".rope.dimension_count", u32(s.qk_rope));
      put(kvs, a + ".feed_forward_length", u32(s.n_ff));
      break;
    case MakeArch::kCOUNT:
      break;
  }
  put(kvs, a + ".rope.freq_base", gguf::Value::f32(s.rope_base));
  put(kvs, a + ".attention.layer_norm_rms_epsilon", gguf::Value::f32(s.rms_eps));
  put(kvs, a + ".expert_count", u32(s.n_expert));
  put(kvs, a + ".expert_used_count", u32(s.n_expert_used));
  // The reference files (no vocabulary) have the model key here; a converter writes a real
  // tokenizer after all the arch keys (below).
  if (s.vocab == MakeVocab::kNone) put(kvs, "tokenizer.ggml.model", gguf::Value::str("no_vocab"));
  if (s.arch == MakeArch::kQwen3Moe) {
    put(kvs, a + ".expert_feed_forward_length", u32(s.n_ff_exp));
  } else if (s.arch == MakeArch::kDeepseek2) {
    put(kvs, a + ".leading_dense_block_count", u32(s.n_leading_dense));
    put(kvs, a + ".attention.q_lora_rank", u32(s.q_lora_rank));
    put(kvs, a + ".attention.kv_lora_rank", u32(s.kv_lora_rank));
    put(kvs, a + ".attention.key_length_mla", u32(s.qk_nope + s.qk_rope));
    put(kvs, a + ".attention.value_length_mla", u32(s.v_head));
    put(kvs, a + ".expert_feed_forward_length", u32(s.n_ff_exp));
    put(kvs, a + ".expert_shared_count", u32(s.n_expert_shared));
    put(kvs, a + ".expert_weights_scale", gguf::Value::f32(s.expert_weights_scale));
    put(kvs, a + ".expert_weights_norm", gguf::Value::boolean(s.expert_weights_norm));
    put(kvs, a + ".expert_gating_func", gguf::Value::u32(s.gating_func));
    put(kvs, a + ".expert_group_count", u32(s.n_group));
    put(kvs, a + ".expert_group_used_count", u32(s.n_group_used));
    if (s.yarn_factor > 1.0f) {
      put(kvs, a + ".rope.scaling.type", gguf::Value::str("yarn"));
      put(kvs, a + ".rope.scaling.factor", gguf::Value::f32(s.yarn_factor));
      put(kvs, a + ".rope.scaling.original_context_length", u32(s.yarn_orig_ctx));
      put(kvs, a + ".rope.scaling.yarn_log_multiplier", gguf::Value::f32(s.yarn_log_mul));
    }
  }
  if (s.vocab == MakeVocab::kBpe) append_make_vocab_kvs(s, kvs);
  if (quantized) {
    put(kvs, "general.quantization_version", gguf::Value::u32(2));
    put(kvs, "general.file_type", u32(make_file_type_ftype(s.type)));
  }
  return kvs;
}

}  // namespace detail

uint64_t ModelPlan::expert_bytes(int layer) const {
  uint64_t sum = 0;
  for (const auto& t : tensors) {
    if (t.layer == layer && t.is_expert) sum += t.n_bytes;
  }
  return sum;
}

}  // namespace moesh
