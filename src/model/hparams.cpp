// Hyper-parameters from GGUF metadata, per architecture, with llama.cpp's defaults
// (docs/background/moe-architectures.md §3-4, reference README §9 for which keys are required).
#include <cmath>
#include <string>

#include "moesh/model/model.h"

namespace moesh {

const char* arch_name(Arch a) {
  switch (a) {
    case Arch::kQwen3Moe:
      return "qwen3moe";
    case Arch::kLlama:
      return "llama";
    case Arch::kDeepseek2:
      return "deepseek2";
    default:
      return "?";
  }
}

namespace {

// Reads "<arch>.<key>" with a message that names the full key when it is missing.
class KeyReader {
 public:
  KeyReader(const gguf::File& f, std::string prefix) : f_(f), prefix_(std::move(prefix)) {}

  std::string full(const char* key) const { return prefix_ + "." + key; }
  bool has(const char* key) const { return f_.has(full(key)); }

  template <typename T>
  Status req(const char* key, T* out) const {
    const std::string k = full(key);
    if (!f_.has(k)) return make_error(StatusCode::kNotFound, "{} missing", k);
    auto r = f_.get<T>(k);
    if (!r) return r.status();
    *out = *r;
    return Status::ok();
  }
  template <typename T>
  Status opt(const char* key, T* out, T def) const {
    auto r = f_.get_or<T>(full(key), def);
    if (!r) return r.status();
    *out = *r;
    return Status::ok();
  }

 private:
  const gguf::File& f_;
  std::string prefix_;
};

// RoPE scaling keys shared by every arch; sets freq_scale/ext_factor/n_ctx_orig and returns the
// YaRN factor f (1 without scaling), the stored yarn_log_multiplier and the user attn_factor.
struct RopeScaling {
  float factor = 1.0f;
  float log_mul = 0.0f;
  float attn_factor_cfg = 1.0f;
  bool yarn = false;
};

Status read_rope(const KeyReader& kr, HParams* hp, RopeScaling* rs) {
  RopeParams& rp = hp->rope;
  MOESH_RETURN_IF_ERROR(kr.opt<float>("rope.freq_base", &rp.freq_base, 10000.0f));
  std::string type;
  MOESH_RETURN_IF_ERROR(kr.opt<std::string>("rope.scaling.type", &type, "none"));
  float factor = 0.0f;
  MOESH_RETURN_IF_ERROR(kr.opt<float>("rope.scaling.factor", &factor, 0.0f));
  if (type != "none" && type != "linear" && type != "yarn") {
    return make_error(StatusCode::kUnsupported, "{} '{}' is not supported", kr.full("rope.scaling.type"), type);
  }
  rs->factor = (type == "none" || factor <= 0.0f) ? 1.0f : factor;
  rs->yarn = type == "yarn";
  rp.freq_scale = 1.0f / rs->factor;
  rp.ext_factor = rs->yarn ? 1.0f : 0.0f;
  int64_t n_ctx_orig = 0;
  MOESH_RETURN_IF_ERROR(kr.opt<int64_t>("rope.scaling.original_context_length", &n_ctx_orig, hp->n_ctx_train));
  rp.n_ctx_orig = static_cast<int>(n_ctx_orig);
  MOESH_RETURN_IF_ERROR(kr.opt<float>("rope.scaling.yarn_log_multiplier", &rs->log_mul, 0.0f));
  MOESH_RETURN_IF_ERROR(kr.opt<float>("rope.scaling.attn_factor", &rs->attn_factor_cfg, 1.0f));
  rp.beta_fast = 32.0f;  // the GGUF yarn_beta_* keys are read only by other archs
  rp.beta_slow = 1.0f;
  return Status::ok();
}

// attn_factor passed to RoPE so that ggml's YaRN magnitude (1 + 0.1 ln f) becomes the intended
// one (docs/background/moe-architectures.md §3, "attn_factor"). deepseek2 cancels it fully (m = m_all).
float rope_attn_factor(Arch arch, const RopeScaling& rs) {
  if (!rs.yarn || rs.factor <= 1.0f) return rs.attn_factor_cfg;
  const float f = rs.factor;
  const float base = 1.0f + 0.1f * std::log(f);
  auto g = [f](float m) { return f <= 1.0f ? 1.0f : 0.1f * m * std::log(f) + 1.0f; };
  float a;
  if (rs.log_mul == 0.0f) {
    a = g(1.0f) / base;
  } else {
    const float m_all = arch == Arch::kDeepseek2 ? rs.log_mul / 0.1f : rs.log_mul;
    const float m = arch == Arch::kDeepseek2 ? m_all : 1.0f;
    a = g(m) / g(m_all) / base;
  }
  return a * rs.attn_factor_cfg;
}

Status read_moe_common(const KeyReader& kr, HParams* hp, bool required) {
  if (required) {
    MOESH_RETURN_IF_ERROR(kr.req<int64_t>("expert_count", &hp->n_expert));
    MOESH_RETURN_IF_ERROR(kr.req<int64_t>("expert_used_count", &hp->n_expert_used));
  } else {
    MOESH_RETURN_IF_ERROR(kr.opt<int64_t>("expert_count", &hp->n_expert, 0));
    MOESH_RETURN_IF_ERROR(kr.opt<int64_t>("expert_used_count", &hp->n_expert_used, 0));
  }
  if (hp->n_expert > 0 && (hp->n_expert_used <= 0 || hp->n_expert_used > hp->n_expert)) {
    return make_error(StatusCode::kCorrupt, "{} = {} must be in [1, {} = {}]", kr.full("expert_used_count"),
                      hp->n_expert_used, kr.full("expert_count"), hp->n_expert);
  }
  return Status::ok();
}

Status check_positive(const KeyReader& kr, const char* key, int64_t v) {
  if (v <= 0) return make_error(StatusCode::kCorrupt, "{} = {} must be positive", kr.full(key), v);
  return Status::ok();
}

}  // namespace

Result<HParams> load_hparams(const gguf::File& f) {
  if (!f.has("general.architecture")) {
    return make_error(StatusCode::kNotFound, "general.architecture missing");
  }
  MOESH_ASSIGN_OR_RETURN(std::string arch_str, f.get<std::string>("general.architecture"));
  HParams hp;
  if (arch_str == "qwen3moe")
    hp.arch = Arch::kQwen3Moe;
  else if (arch_str == "llama")
    hp.arch = Arch::kLlama;
  else if (arch_str == "deepseek2")
    hp.arch = Arch::kDeepseek2;
  else
    return make_error(StatusCode::kUnsupported, "architecture '{}' is not supported", arch_str);

  KeyReader kr(f, arch_str);
  // Vocabulary size: <arch>.vocab_size, else the token list's length.
  if (kr.has("vocab_size")) {
    MOESH_RETURN_IF_ERROR(kr.req<int64_t>("vocab_size", &hp.n_vocab));
  } else if (const gguf::Value* toks = f.find("tokenizer.ggml.tokens");
             toks != nullptr && toks->type == gguf::ValueType::ARRAY) {
    hp.n_vocab = static_cast<int64_t>(std::get<gguf::Array>(toks->v).items.size());
  } else {
    return make_error(StatusCode::kNotFound, "{} missing (and no tokenizer.ggml.tokens)", kr.full("vocab_size"));
  }
  MOESH_RETURN_IF_ERROR(kr.req<int64_t>("context_length", &hp.n_ctx_train));
  MOESH_RETURN_IF_ERROR(kr.req<int64_t>("embedding_length", &hp.n_embd));
  MOESH_RETURN_IF_ERROR(kr.req<int64_t>("block_count", &hp.n_layer));
  MOESH_RETURN_IF_ERROR(kr.req<int64_t>("attention.head_count", &hp.n_head));
  for (auto [k, v] : {std::pair{"vocab_size", hp.n_vocab},
                      {"context_length", hp.n_ctx_train},
                      {"embedding_length", hp.n_embd},
                      {"block_count", hp.n_layer},
                      {"attention.head_count", hp.n_head}}) {
    MOESH_RETURN_IF_ERROR(check_positive(kr, k, v));
  }
  MOESH_RETURN_IF_ERROR(kr.opt<int64_t>("attention.head_count_kv", &hp.n_head_kv, hp.n_head));
  MOESH_RETURN_IF_ERROR(check_positive(kr, "attention.head_count_kv", hp.n_head_kv));
  if (hp.n_head % hp.n_head_kv != 0) {
    return make_error(StatusCode::kCorrupt, "{} = {} is not a multiple of {} = {}", kr.full("attention.head_count"),
                      hp.n_head, kr.full("attention.head_count_kv"), hp.n_head_kv);
  }
  MOESH_RETURN_IF_ERROR(kr.opt<int64_t>("attention.key_length", &hp.head_dim_k, hp.n_embd / hp.n_head));
  MOESH_RETURN_IF_ERROR(kr.opt<int64_t>("attention.value_length", &hp.head_dim_v, hp.head_dim_k));
  MOESH_RETURN_IF_ERROR(kr.req<float>("attention.layer_norm_rms_epsilon", &hp.rms_eps));
  MOESH_RETURN_IF_ERROR(kr.opt<int64_t>("feed_forward_length", &hp.n_ff, 0));

  RopeScaling rs;
  MOESH_RETURN_IF_ERROR(read_rope(kr, &hp, &rs));

  switch (hp.arch) {
    case Arch::kQwen3Moe: {
      MOESH_RETURN_IF_ERROR(read_moe_common(kr, &hp, true));
      if (kr.has("expert_feed_forward_length") || hp.n_ff == 0) {
        MOESH_RETURN_IF_ERROR(kr.req<int64_t>("expert_feed_forward_length", &hp.n_ff_exp));
      } else {
        hp.n_ff_exp = hp.n_ff / hp.n_expert_used;
      }
      hp.n_rot = hp.head_dim_k;  // qwen3moe rotates the whole head (llama.cpp asserts it)
      hp.rope.mode = RopeMode::kNeox;
      hp.gating = GatingFunc::kSoftmax;
      hp.norm_w = true;  // always renormalised, whatever norm_topk_prob said
      break;
    }
    case Arch::kLlama: {
      MOESH_RETURN_IF_ERROR(read_moe_common(kr, &hp, false));
      MOESH_RETURN_IF_ERROR(kr.req<int64_t>("feed_forward_length", &hp.n_ff));
      hp.n_ff_exp = hp.n_ff;  // Mixtral: feed_forward_length is the expert width
      MOESH_RETURN_IF_ERROR(kr.opt<int64_t>("rope.dimension_count", &hp.n_rot, hp.head_dim_k));
      hp.rope.mode = RopeMode::kNorm;
      hp.gating = GatingFunc::kSoftmax;
      hp.norm_w = true;
      break;
    }
    case Arch::kDeepseek2: {
      MOESH_RETURN_IF_ERROR(read_moe_common(kr, &hp, true));
      MOESH_RETURN_IF_ERROR(kr.req<int64_t>("feed_forward_length", &hp.n_ff));
      MOESH_RETURN_IF_ERROR(kr.req<int64_t>("rope.dimension_count", &hp.n_rot));
      MOESH_RETURN_IF_ERROR(kr.req<int64_t>("leading_dense_block_count", &hp.n_leading_dense));
      MOESH_RETURN_IF_ERROR(kr.opt<int64_t>("attention.q_lora_rank", &hp.q_lora_rank, 0));
      MOESH_RETURN_IF_ERROR(kr.req<int64_t>("attention.kv_lora_rank", &hp.kv_lora_rank));
      MOESH_RETURN_IF_ERROR(kr.req<int64_t>("attention.key_length_mla", &hp.head_dim_qk_mla));
      MOESH_RETURN_IF_ERROR(kr.req<int64_t>("attention.value_length_mla", &hp.head_dim_v_mla));
      MOESH_RETURN_IF_ERROR(kr.req<int64_t>("expert_feed_forward_length", &hp.n_ff_exp));
      MOESH_RETURN_IF_ERROR(kr.req<int64_t>("expert_shared_count", &hp.n_expert_shared));
      MOESH_RETURN_IF_ERROR(kr.opt<float>("expert_weights_scale", &hp.w_scale, 0.0f));
      MOESH_RETURN_IF_ERROR(kr.opt<bool>("expert_weights_norm", &hp.norm_w, false));
      int gating = 0;
      MOESH_RETURN_IF_ERROR(kr.opt<int>("expert_gating_func", &gating, 0));
      if (gating == 0) gating = static_cast<int>(GatingFunc::kSoftmax);  // V2 files lack the key
      if (gating < 1 || gating > 3) {
        return make_error(StatusCode::kUnsupported, "{} = {} is not supported", kr.full("expert_gating_func"), gating);
      }
      hp.gating = static_cast<GatingFunc>(gating);
      MOESH_RETURN_IF_ERROR(kr.opt<int64_t>("expert_group_count", &hp.n_group, 0));
      if (hp.n_group > 1) {
        MOESH_RETURN_IF_ERROR(kr.req<int64_t>("expert_group_used_count", &hp.n_group_used));
      }
      // The attention works in the compressed space: one KV head of [c | k_pe], V = c.
      if (hp.n_rot <= 0 || hp.head_dim_qk_mla <= hp.n_rot || hp.kv_lora_rank <= 0 || hp.head_dim_v_mla <= 0 ||
          hp.n_rot % 2 != 0) {
        return make_error(StatusCode::kCorrupt,
                          "{}: inconsistent MLA sizes (rope {}, key_length_mla {}, kv_lora {}, "
                          "value_length_mla {})",
                          arch_str, hp.n_rot, hp.head_dim_qk_mla, hp.kv_lora_rank, hp.head_dim_v_mla);
      }
      hp.head_dim_k = hp.kv_lora_rank + hp.n_rot;
      hp.head_dim_v = hp.kv_lora_rank;
      hp.n_head_kv = 1;
      hp.rope.mode = RopeMode::kNorm;
      break;
    }
    default:
      break;
  }
  MOESH_RETURN_IF_ERROR(check_positive(kr, "rope.dimension_count", hp.n_rot));
  if (hp.n_rot % 2 != 0 || (hp.arch != Arch::kDeepseek2 && hp.n_rot > hp.head_dim_k)) {
    return make_error(StatusCode::kCorrupt, "{} = {} must be even and <= head dim {}", kr.full("rope.dimension_count"),
                      hp.n_rot, hp.head_dim_k);
  }
  if (hp.n_expert > 0) MOESH_RETURN_IF_ERROR(check_positive(kr, "expert_feed_forward_length", hp.n_ff_exp));
  hp.rope.n_rot = static_cast<int>(hp.n_rot);
  hp.rope.attn_factor = rope_attn_factor(hp.arch, rs);

  if (hp.arch == Arch::kDeepseek2) {
    // YaRN's magnitude goes into the score scale instead of cos/sin (README §7).
    const float mscale = rs.attn_factor_cfg * (1.0f + rs.log_mul * std::log(1.0f / hp.rope.freq_scale));
    hp.kq_scale = mscale * mscale / std::sqrt(static_cast<float>(hp.head_dim_qk_mla));
  } else {
    hp.kq_scale = 1.0f / std::sqrt(static_cast<float>(hp.head_dim_k));
  }

  if (hp.n_expert > 0) {
    RouterConfig rc;
    rc.gating = hp.gating;
    rc.n_expert = static_cast<int>(hp.n_expert);
    rc.k = static_cast<int>(hp.n_expert_used);
    rc.n_group = static_cast<int>(hp.n_group);
    rc.n_group_used = static_cast<int>(hp.n_group_used);
    rc.norm_w = hp.norm_w;
    rc.w_scale = hp.w_scale;
    MOESH_RETURN_IF_ERROR(rc.validate().with_context(arch_str + " routing"));
  }
  return hp;
}

}  // namespace moesh
