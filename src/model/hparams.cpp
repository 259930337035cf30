// Hyper-parameters from GGUF metadata: the keys every architecture shares, with llama.cpp's
// defaults, then the architecture's own (its ArchDef::read_hparams, arch_*.cpp), then the checks
// that hold for all (docs/background/moe-architectures.md §3-4, reference README §8).
#include <algorithm>
#include <cmath>
#include <string>

#include "model/arch.h"

namespace moesh {

namespace {

// RoPE base and scaling keys shared by every arch; sets freq_scale/ext_factor/n_ctx_orig.
Status read_rope(const KeyReader& kr, HParams* hp) {
  RopeParams& rp = hp->rope;
  HParams::RopeScaling* rs = &hp->rope_scaling;
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
// one (docs/background/moe-architectures.md §3, "attn_factor"). Archs with their own rule
// (deepseek2) set rope.attn_factor themselves.
float default_rope_attn_factor(const HParams::RopeScaling& rs) {
  if (!rs.yarn || rs.factor <= 1.0f) return rs.attn_factor_cfg;
  const float f = rs.factor;
  const float base = 1.0f + 0.1f * std::log(f);
  auto g = [f](float m) { return f <= 1.0f ? 1.0f : 0.1f * m * std::log(f) + 1.0f; };
  const float a = rs.log_mul == 0.0f ? g(1.0f) / base : g(1.0f) / g(rs.log_mul) / base;
  return a * rs.attn_factor_cfg;
}

// attention.head_count and head_count_kv: one number, or one per block (step35: the query
// heads differ per block). The KV cache has one width, so per-block KV head counts must agree.
Status read_head_counts(const KeyReader& kr, HParams* hp) {
  const gguf::Value* hc = kr.file().find(kr.full("attention.head_count"));
  if (hc != nullptr && hc->type == gguf::ValueType::ARRAY) {
    MOESH_ASSIGN_OR_RETURN(hp->n_head_layer, kr.file().get<std::vector<int64_t>>(kr.full("attention.head_count")));
    if (static_cast<int64_t>(hp->n_head_layer.size()) != hp->n_layer) {
      return make_error(StatusCode::kCorrupt, "{} has {} entries for {} = {}", kr.full("attention.head_count"),
                        hp->n_head_layer.size(), kr.full("block_count"), hp->n_layer);
    }
    hp->n_head = 0;
    for (int64_t h : hp->n_head_layer) {
      MOESH_RETURN_IF_ERROR(kr.positive("attention.head_count", h));
      hp->n_head = std::max(hp->n_head, h);
    }
  } else {
    MOESH_RETURN_IF_ERROR(kr.req<int64_t>("attention.head_count", &hp->n_head));
  }
  const gguf::Value* kv = kr.file().find(kr.full("attention.head_count_kv"));
  if (kv != nullptr && kv->type == gguf::ValueType::ARRAY) {
    MOESH_ASSIGN_OR_RETURN(std::vector<int64_t> v,
                           kr.file().get<std::vector<int64_t>>(kr.full("attention.head_count_kv")));
    // 0 marks a recurrent block (kimi-k3: its architecture reads the array again); the others agree.
    const auto nz = std::find_if(v.begin(), v.end(), [](int64_t x) { return x != 0; });
    if (nz == v.end() || std::any_of(v.begin(), v.end(), [&](int64_t x) { return x != 0 && x != *nz; })) {
      return make_error(StatusCode::kUnsupported, "{}: per-block KV head counts that differ are not supported",
                        kr.full("attention.head_count_kv"));
    }
    hp->n_head_kv = *nz;
  } else {
    MOESH_RETURN_IF_ERROR(kr.opt<int64_t>("attention.head_count_kv", &hp->n_head_kv, hp->n_head));
  }
  return Status::ok();
}

}  // namespace

Status read_moe_counts(const KeyReader& kr, HParams* hp, bool required) {
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

RouterConfig HParams::router_config(const float* sel_bias) const {
  RouterConfig rc;
  rc.gating = gating;
  rc.n_expert = static_cast<int>(n_expert);
  rc.k = static_cast<int>(n_expert_used);
  rc.sel_bias = sel_bias;
  rc.n_group = static_cast<int>(n_group);
  rc.n_group_used = static_cast<int>(n_group_used);
  rc.norm_w = norm_w;
  rc.w_scale = w_scale;
  rc.select_on_logits = select_on_logits;
  return rc;
}

std::string_view chat_family_of(const HParams& hp) {
  return hp.arch == nullptr ? std::string_view{} : hp.arch->chat_family;
}

std::vector<std::string> supported_architectures() {
  std::vector<std::string> out;
  for (const ArchDef* a : all_archs()) out.emplace_back(a->name);
  return out;
}

Result<HParams> load_hparams(const gguf::File& f) {
  if (!f.has("general.architecture")) {
    return make_error(StatusCode::kNotFound, "general.architecture missing");
  }
  MOESH_ASSIGN_OR_RETURN(std::string arch_str, f.get<std::string>("general.architecture"));
  const ArchDef* arch = find_arch(arch_str);
  if (arch == nullptr) {
    std::string known;
    for (const std::string& a : supported_architectures()) known += (known.empty() ? "" : ", ") + a;
    return make_error(StatusCode::kUnsupported, "architecture '{}' is not supported (this build runs: {})", arch_str,
                      known);
  }
  HParams hp;
  hp.arch = arch;
  hp.arch_name = arch_str;

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
  MOESH_RETURN_IF_ERROR(read_head_counts(kr, &hp));
  for (auto [k, v] : {std::pair{"vocab_size", hp.n_vocab},
                      {"context_length", hp.n_ctx_train},
                      {"embedding_length", hp.n_embd},
                      {"block_count", hp.n_layer},
                      {"attention.head_count", hp.n_head}}) {
    MOESH_RETURN_IF_ERROR(kr.positive(k, v));
  }
  MOESH_RETURN_IF_ERROR(kr.positive("attention.head_count_kv", hp.n_head_kv));
  for (int64_t il = 0; il < std::max<int64_t>(1, static_cast<int64_t>(hp.n_head_layer.size())); ++il) {
    if (hp.n_head_of(il) % hp.n_head_kv != 0) {
      return make_error(StatusCode::kCorrupt, "{} = {} is not a multiple of {} = {}", kr.full("attention.head_count"),
                        hp.n_head_of(il), kr.full("attention.head_count_kv"), hp.n_head_kv);
    }
  }
  MOESH_RETURN_IF_ERROR(kr.opt<int64_t>("attention.key_length", &hp.head_dim_k, hp.n_embd / hp.n_head));
  MOESH_RETURN_IF_ERROR(kr.opt<int64_t>("attention.value_length", &hp.head_dim_v, hp.head_dim_k));
  MOESH_RETURN_IF_ERROR(kr.req<float>("attention.layer_norm_rms_epsilon", &hp.rms_eps));
  MOESH_RETURN_IF_ERROR(kr.opt<int64_t>("feed_forward_length", &hp.n_ff, 0));
  MOESH_RETURN_IF_ERROR(read_rope(kr, &hp));

  // The architecture's own keys.
  MOESH_RETURN_IF_ERROR(arch->read_hparams(kr, &hp));

  MOESH_RETURN_IF_ERROR(kr.positive("rope.dimension_count", hp.n_rot));
  if (hp.n_rot % 2 != 0 || (hp.kv_k_width == 0 && hp.n_rot > hp.head_dim_k)) {
    return make_error(StatusCode::kCorrupt, "{} = {} must be even and <= head dim {}", kr.full("rope.dimension_count"),
                      hp.n_rot, hp.head_dim_k);
  }
  if (hp.n_expert > 0) MOESH_RETURN_IF_ERROR(kr.positive("expert_feed_forward_length", hp.n_ff_exp));
  hp.rope.n_rot = static_cast<int>(hp.n_rot);
  if (!hp.rope_attn_factor_set) hp.rope.attn_factor = default_rope_attn_factor(hp.rope_scaling);
  if (hp.kq_scale == 0.0f) hp.kq_scale = 1.0f / std::sqrt(static_cast<float>(hp.head_dim_k));
  if (hp.kv_k_width == 0) {  // the GQA cache: n_head_kv heads of K and V per cell
    hp.kv_k_width = hp.n_head_kv * hp.head_dim_k;
    hp.kv_v_width = hp.n_head_kv * hp.head_dim_v;
  }

  // Which layer of the KV cache or of the recurrent state each block uses.
  if (!hp.recurrent.empty() && static_cast<int64_t>(hp.recurrent.size()) != hp.n_layer) {
    return make_error(StatusCode::kInternal, "{}: recurrent-layer table has {} entries for {} blocks", arch_str,
                      hp.recurrent.size(), hp.n_layer);
  }
  hp.state_slot.assign(static_cast<size_t>(hp.n_layer), 0);
  hp.n_kv_layer = hp.n_rec_layer = 0;
  for (int64_t il = 0; il < hp.n_layer; ++il) {
    hp.state_slot[static_cast<size_t>(il)] =
        static_cast<int32_t>(hp.is_recurrent(il) ? hp.n_rec_layer++ : hp.n_kv_layer++);
  }

  if (hp.n_expert > 0) MOESH_RETURN_IF_ERROR(hp.router_config().validate().with_context(arch_str + " routing"));
  return hp;
}

}  // namespace moesh
