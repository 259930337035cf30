// make-model --nextn-oracle: a model whose NextN/MTP head drafts exactly what the model generates,
// so benchmarks and tests can measure what drafting saves (round trips) with an accurate head,
// as a trained model's head would be most of the time. Not a language model.
//
// The decoder is a bigram map: every block's attention output and FFN down projections are zero,
// so h = embed(t) after every block and the next token is f(t) = argmax output · norm(embed(t)).
// The head computes the same map one token ahead: eh_proj = [I | 0] passes the next token's
// normed embedding through, its block adds zero, shared_head_norm = output_norm. So a head that
// pairs each hidden state with the token that FOLLOWED it and feeds its drafts back in order
// drafts every token right; one pairing a state with its own token drafts f(t) where f(f(t))
// comes.
#include <cstdio>
#include <filesystem>

#include "moesh/gguf/gguf.h"
#include "moesh/make_model/make_model.h"

namespace moesh {

Status make_nextn_oracle(const MakeModelSpec& spec_in, const std::string& out_path) {
  MakeModelSpec spec = spec_in;
  spec.type = MakeFileType::kF32;  // the pass-through must be exact
  MOESH_ASSIGN_OR_RETURN(ModelPlan plan, plan_model(spec));
  bool has_head = false;
  for (const PlannedTensor& t : plan.tensors) has_head |= t.name.ends_with("nextn.eh_proj.weight");
  if (!has_head) {
    return make_error(StatusCode::kInvalidArgument, "--nextn-oracle: a {} model has no NextN/MTP block (glm4moe has)",
                      spec.arch_name());
  }
  const std::string src_path = out_path + ".oracle-src";
  MOESH_RETURN_IF_ERROR(make_model(spec, src_path));
  struct Cleanup {
    std::string p;
    ~Cleanup() { std::remove(p.c_str()); }
  } cleanup{src_path};
  MOESH_ASSIGN_OR_RETURN(std::unique_ptr<gguf::File> src, gguf::File::open(src_path));
  gguf::Writer w;
  for (const auto& [k, v] : src->kvs()) w.set(k, v);
  w.set("general.description", gguf::Value::str("moesh make-model --nextn-oracle: bigram decoder, a NextN head "
                                                "that drafts it exactly (for measuring drafting, not a language "
                                                "model)"));
  const int64_t D = spec.n_embd;
  const gguf::TensorInfo* on = src->find_tensor("output_norm.weight");
  if (on == nullptr) return make_error(StatusCode::kInternal, "--nextn-oracle: no output_norm.weight");
  const float* out_norm = reinterpret_cast<const float*>(src->view(*on).data);
  for (const auto& t : src->tensors()) {
    const TensorView v = src->view(t);
    if (v.type != GgmlType::F32) return make_error(StatusCode::kInternal, "--nextn-oracle: {} is not F32", t.name);
    const std::string& n = t.name;
    const float* f = reinterpret_cast<const float*>(v.data);
    std::vector<float> data(f, f + v.n_elements());
    if (n.ends_with("attn_output.weight") || n.ends_with("ffn_down.weight") || n.ends_with("ffn_down_exps.weight") ||
        n.ends_with("ffn_down_shexp.weight")) {
      std::fill(data.begin(), data.end(), 0.0f);
    } else if (n.ends_with("nextn.eh_proj.weight")) {  // one row of 2D inputs per output j: input j
      std::fill(data.begin(), data.end(), 0.0f);
      for (int64_t j = 0; j < D; ++j) data[static_cast<size_t>(j * 2 * D + j)] = 1.0f;
    } else if (n.ends_with("nextn.enorm.weight")) {
      std::fill(data.begin(), data.end(), 1.0f);
    } else if (n.ends_with("nextn.shared_head_norm.weight")) {
      std::copy(out_norm, out_norm + D, data.begin());
    }
    MOESH_RETURN_IF_ERROR(w.add_tensor_copy(n, t.type, std::vector<int64_t>(v.ne, v.ne + t.n_dims), data.data()));
  }
  return w.write_file(out_path);
}

}  // namespace moesh
