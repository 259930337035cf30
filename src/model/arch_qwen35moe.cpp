// qwen35moe (Qwen3.5 MoE, e.g. Qwen3.5-122B-A10B): the qwen3next hybrid (arch_qwen3next.cpp)
// with three differences:
//   * DeltaNet value head h reads key head h % n_k ("tiled": llama.cpp's converter permutes every
//     value-head-indexed weight of Qwen3.5 into this order);
//   * beta and alpha come from two matrices, ssm_beta and ssm_alpha, in plain value-head order;
//   * full attention uses IMRoPE with rope.dimension_sections. For text every token's temporal,
//     height and width positions are its position, and then IMRoPE is NEOX RoPE on the first
//     rope.dimension_count dims (reference README §7.7) — which is what runs here.
#include "model/arch.h"

namespace moesh {

Status read_qwen3next_keys(const KeyReader& kr, HParams* hp);
void write_qwen3next_keys(const HParams& hp, KvList* kv);
Status bind_qwen3next_layer(detail::TensorBinder& b, const HParams& hp, int il, LayerWeights* lw);
HParams qwen3next_make_defaults();

namespace {

Status read_hparams(const KeyReader& kr, HParams* hp) {
  MOESH_RETURN_IF_ERROR(read_qwen3next_keys(kr, hp));
  hp->dnet.tiled = true;
  hp->dnet.split_ba = true;
  // rope.dimension_sections: required by llama.cpp; four section sizes in rotary pairs.
  const std::string key = kr.full("rope.dimension_sections");
  const gguf::Value* v = kr.file().find(key);
  if (v == nullptr) return make_error(StatusCode::kNotFound, "{} missing", key);
  if (v->type != gguf::ValueType::ARRAY) return make_error(StatusCode::kCorrupt, "{} must be an array", key);
  const auto& items = std::get<gguf::Array>(v->v).items;
  if (items.empty() || items.size() > 4) {
    return make_error(StatusCode::kCorrupt, "{} has {} entries, expected up to 4", key, items.size());
  }
  int64_t pairs = 0;
  for (const gguf::Value& it : items) {
    if (const auto* u = std::get_if<uint64_t>(&it.v)) {
      pairs += static_cast<int64_t>(*u);
    } else if (const auto* i = std::get_if<int64_t>(&it.v); i != nullptr && *i >= 0) {
      pairs += *i;
    } else {
      return make_error(StatusCode::kCorrupt, "{} must hold non-negative integers", key);
    }
  }
  if (pairs * 2 > hp->n_rot) {
    return make_error(StatusCode::kCorrupt, "{}: {} rotary pairs exceed {} = {}", key, pairs,
                      kr.full("rope.dimension_count"), hp->n_rot);
  }
  return Status::ok();
}

HParams make_defaults() {  // qwen35moe-a of the reference set: qwen3next-a's, except
  HParams hp = qwen3next_make_defaults();
  hp.n_head_kv = 2, hp.n_rot = 64, hp.n_expert_used = 4;
  hp.dnet.d_state = 64, hp.dnet.n_v_head = 4;  // d_inner stays 256
  hp.dnet.tiled = true, hp.dnet.split_ba = true;
  return hp;
}

void write_hparams(const HParams& hp, KvList* kv) {
  write_qwen3next_keys(hp, kv);
  // Text-only sections covering the rotary pairs: [11, 11, 10, 0] for 64 dims as in the reference.
  const int64_t pairs = hp.n_rot / 2;
  const int32_t a = static_cast<int32_t>((pairs + 2) / 3), b = a, c = static_cast<int32_t>(pairs) - a - b;
  kv->push_back({hp.arch_name + ".rope.dimension_sections", gguf::Value::i32_array({a, b, c, 0})});
}

}  // namespace

extern const ArchDef kArchQwen35Moe = {
    .name = "qwen35moe",
    .read_hparams = read_hparams,
    .bind_globals = nullptr,
    .bind_layer = bind_qwen3next_layer,
    .bind_nextn = nullptr,
    .mixer = hybrid_mixer,
    .make_defaults = make_defaults,
    .write_hparams = write_hparams,
    .chat_family = "chatml",
};

}  // namespace moesh
