// make_model for the architectures of the model registry (MakeArch::kRegistry): the spec's
// shape fields go into the arch's own reference-sized HParams, and the arch file describes the
// keys and the tensor table (include/moesh/model/make_arch.h).
#include <algorithm>
#include <utility>

#include "make_model/make_model_internal.h"
#include "moesh/model/make_arch.h"

namespace moesh {

namespace {

// Seeds of the archs/ reference models (reference README §3), so make-model's defaults draw
// other weights than the reference files yet are as reproducible.
uint64_t registry_seed(std::string_view arch) {
  if (arch == "gpt-oss") return 5101;
  if (arch == "glm4moe") return 5102;
  if (arch == "llama4") return 5103;
  if (arch == "minimax-m2") return 5104;
  if (arch == "qwen35moe") return 5105;
  if (arch == "qwen3next") return 5106;
  if (arch == "step35") return 5201;
  if (arch == "glm-dsa") return 5202;
  if (arch == "kimi-k3") return 5203;
  if (arch == "minimax-m3") return 5204;
  return 5100;
}

}  // namespace

std::vector<std::string> make_arch_names() {
  std::vector<std::string> out = {"qwen3moe", "llama", "deepseek2"};
  for (const std::string& a : makeable_architectures()) out.push_back(a);
  return out;
}

std::string MakeModelSpec::arch_name() const {
  return arch == MakeArch::kRegistry ? registry_arch : make_arch_name(arch);
}

bool MakeModelSpec::defaults_for_name(std::string_view name, MakeModelSpec* out) {
  MakeArch a;
  if (make_arch_from_name(name, &a)) {
    *out = defaults_for(a);
    return true;
  }
  auto hp = arch_make_defaults(name);
  if (!hp) return false;
  MakeModelSpec s;
  s.arch = MakeArch::kRegistry;
  s.registry_arch = std::string(name);
  s.seed = registry_seed(name);
  s.n_vocab = hp->n_vocab, s.n_ctx = hp->n_ctx_train, s.n_embd = hp->n_embd, s.n_layer = hp->n_layer;
  s.n_head = hp->n_head, s.n_head_kv = hp->n_head_kv, s.head_dim = hp->head_dim_k;
  s.n_expert = hp->n_expert, s.n_expert_used = hp->n_expert_used, s.n_ff_exp = hp->n_ff_exp;
  s.n_ff = hp->n_ff > 0 ? hp->n_ff : hp->n_ff_exp;
  s.n_expert_shared = hp->n_expert_shared, s.n_leading_dense = hp->n_leading_dense;
  s.rope_base = hp->rope.freq_base, s.rms_eps = hp->rms_eps;
  *out = std::move(s);
  return true;
}

namespace detail {

Result<ArchMakePlan> registry_make_plan(const MakeModelSpec& s) {
  MOESH_ASSIGN_OR_RETURN(HParams hp, arch_make_defaults(s.registry_arch));
  hp.n_vocab = s.n_vocab, hp.n_ctx_train = s.n_ctx, hp.n_embd = s.n_embd, hp.n_layer = s.n_layer;
  hp.n_head = s.n_head, hp.n_head_kv = s.n_head_kv;
  // The rotary part keeps its share of the head (partial RoPE stays partial).
  const int64_t rot = hp.head_dim_k > 0 ? hp.n_rot * s.head_dim / hp.head_dim_k : s.head_dim;
  hp.head_dim_k = hp.head_dim_v = s.head_dim;
  hp.n_rot = rot;
  hp.n_expert = s.n_expert, hp.n_expert_used = s.n_expert_used, hp.n_ff_exp = s.n_ff_exp;
  if (hp.n_ff > 0) hp.n_ff = s.n_ff;
  if (hp.n_expert_shared > 0) hp.n_expert_shared = s.n_expert_shared;
  if (hp.n_leading_dense > 0) hp.n_leading_dense = std::min(s.n_leading_dense, s.n_layer);
  hp.rope.freq_base = s.rope_base, hp.rms_eps = s.rms_eps;
  auto plan = arch_make_plan(hp);
  if (!plan) return plan.status().with_context("make-model --arch " + s.registry_arch);
  return plan;
}

}  // namespace detail
}  // namespace moesh
