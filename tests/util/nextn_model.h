// The NextN oracle model for tests of the NextN draft source: make-model --nextn-oracle on
// glm4moe (src/make_model/make_model_oracle.cpp: a bigram decoder and a head that drafts it exactly).
#pragma once

#include <string>

#include "moesh/make_model/make_model.h"

namespace moesh::test {

// Writes that model (F32, n_ctx 256, ids only) to `path`.
inline Status write_nextn_bigram_model(const std::string& path) {
  MakeModelSpec spec;
  if (!MakeModelSpec::defaults_for_name("glm4moe", &spec)) {
    return make_error(StatusCode::kInternal, "make-model has no glm4moe");
  }
  spec.n_ctx = 256;
  spec.vocab = MakeVocab::kNone;
  return make_nextn_oracle(spec, path);
}

}  // namespace moesh::test
