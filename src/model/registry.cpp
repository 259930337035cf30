// The architecture registry (arch.h): every ArchDef this build runs. Adding an architecture is
// its file (arch_<name>.cpp) plus its line here.
#include "model/arch.h"

namespace moesh {

extern const ArchDef kArchQwen3Moe;
extern const ArchDef kArchLlama;
extern const ArchDef kArchDeepseek2;
extern const ArchDef kArchGptOss;
extern const ArchDef kArchGlm4Moe;
extern const ArchDef kArchLlama4;
extern const ArchDef kArchMinimaxM2;
extern const ArchDef kArchQwen3Next;
extern const ArchDef kArchQwen35Moe;
extern const ArchDef kArchStep35;
extern const ArchDef kArchMinimaxM3;
extern const ArchDef kArchGlmDsa;
extern const ArchDef kArchKimiK3;

const std::vector<const ArchDef*>& all_archs() {
  static const std::vector<const ArchDef*> archs = {
      &kArchQwen3Moe,  &kArchLlama,     &kArchDeepseek2, &kArchGptOss,    &kArchGlm4Moe, &kArchLlama4, &kArchMinimaxM2,
      &kArchQwen3Next, &kArchQwen35Moe, &kArchStep35,    &kArchMinimaxM3, &kArchGlmDsa,  &kArchKimiK3,
  };
  return archs;
}

const ArchDef* find_arch(std::string_view name) {
  for (const ArchDef* a : all_archs()) {
    if (a->name == name) return a;
  }
  return nullptr;
}

std::vector<std::string> nextn_architectures() {
  std::vector<std::string> out;
  for (const ArchDef* a : all_archs()) {
    if (a->bind_nextn != nullptr) out.emplace_back(a->name);
  }
  return out;
}

void put_u32(KvList* kvs, const HParams& hp, const char* key, int64_t v) {
  kvs->emplace_back(hp.arch_name + "." + key, gguf::Value::u32(static_cast<uint32_t>(v)));
}
void put_f32(KvList* kvs, const HParams& hp, const char* key, float v) {
  kvs->emplace_back(hp.arch_name + "." + key, gguf::Value::f32(v));
}
void put_bool(KvList* kvs, const HParams& hp, const char* key, bool v) {
  kvs->emplace_back(hp.arch_name + "." + key, gguf::Value::boolean(v));
}

void write_common_head(const HParams& hp, KvList* kvs) {
  put_u32(kvs, hp, "vocab_size", hp.n_vocab);
  put_u32(kvs, hp, "context_length", hp.n_ctx_train);
  put_u32(kvs, hp, "embedding_length", hp.n_embd);
  put_u32(kvs, hp, "block_count", hp.n_layer + hp.n_nextn);  // the NextN blocks follow the decoder
  put_u32(kvs, hp, "attention.head_count", hp.n_head);
}

void write_gqa_keys(const HParams& hp, KvList* kvs, bool lengths, bool rope_dims) {
  put_u32(kvs, hp, "attention.head_count_kv", hp.n_head_kv);
  if (lengths) {
    put_u32(kvs, hp, "attention.key_length", hp.head_dim_k);
    put_u32(kvs, hp, "attention.value_length", hp.head_dim_v);
  }
  if (rope_dims) put_u32(kvs, hp, "rope.dimension_count", hp.n_rot);
  put_f32(kvs, hp, "rope.freq_base", hp.rope.freq_base);
  put_f32(kvs, hp, "attention.layer_norm_rms_epsilon", hp.rms_eps);
}

}  // namespace moesh
