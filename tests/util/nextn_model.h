// A glm4moe test model whose NextN head knows the model (tests of the NextN draft source).
//
// The decoder is a bigram map: every block's attention output and FFN down projections are zero,
// so h = embed(t) after every block and the next token is f(t) = argmax output·norm(embed(t)).
// The head is set up to compute the same map one token ahead: eh_proj = [I | 0] passes the next
// token's normed embedding through, the block adds zero, shared_head_norm = output_norm. So its
// drafts are right — if the head pairs each hidden state with the token that FOLLOWED it, feeds
// its drafts back in order and keeps its state in step with the decoder; pairing a hidden state
// with its own token would draft f(t) where f(f(t)) comes, and be rejected.
#pragma once

#include <algorithm>
#include <string>
#include <vector>

#include "moesh/gguf/gguf.h"
#include "moesh/make_model/make_model.h"

namespace moesh::test {

// Writes that model (F32, n_ctx 256, ids only) to `path`, using `scratch` for make-model's file.
inline Status write_nextn_bigram_model(const std::string& scratch, const std::string& path) {
  MakeModelSpec spec;
  if (!MakeModelSpec::defaults_for_name("glm4moe", &spec)) {
    return make_error(StatusCode::kInternal, "make-model has no glm4moe");
  }
  spec.type = MakeFileType::kF32;
  spec.n_ctx = 256;
  spec.vocab = MakeVocab::kNone;
  MOESH_RETURN_IF_ERROR(make_model(spec, scratch));
  MOESH_ASSIGN_OR_RETURN(std::unique_ptr<gguf::File> src, gguf::File::open(scratch));
  gguf::Writer w;
  for (const auto& [k, v] : src->kvs()) w.set(k, v);
  const int64_t D = spec.n_embd;
  const gguf::TensorInfo* on = src->find_tensor("output_norm.weight");
  if (on == nullptr) return make_error(StatusCode::kNotFound, "no output_norm.weight");
  const float* out_norm = reinterpret_cast<const float*>(src->view(*on).data);
  for (const auto& t : src->tensors()) {
    const TensorView v = src->view(t);
    if (v.type != GgmlType::F32) return make_error(StatusCode::kInternal, "{} is not F32", t.name);
    const std::string& n = t.name;
    const float* f = reinterpret_cast<const float*>(v.data);
    std::vector<float> data(f, f + v.n_elements());
    if (n.ends_with("attn_output.weight") || n.ends_with("ffn_down.weight") || n.ends_with("ffn_down_exps.weight") ||
        n.ends_with("ffn_down_shexp.weight")) {
      std::fill(data.begin(), data.end(), 0.0f);
    } else if (n.ends_with("nextn.eh_proj.weight")) {  // rows of 2D inputs, one per output j: input j
      std::fill(data.begin(), data.end(), 0.0f);
      for (int64_t j = 0; j < D; ++j) data[static_cast<size_t>(j * 2 * D + j)] = 1.0f;
    } else if (n.ends_with("nextn.enorm.weight")) {
      std::fill(data.begin(), data.end(), 1.0f);
    } else if (n.ends_with("nextn.shared_head_norm.weight")) {
      std::copy(out_norm, out_norm + D, data.begin());
    }
    MOESH_RETURN_IF_ERROR(w.add_tensor_copy(n, t.type, std::vector<int64_t>(v.ne, v.ne + t.n_dims), data.data()));
  }
  return w.write_file(path);
}

}  // namespace moesh::test
