// Internal pieces of make_model shared by its translation units (not a public API).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "moesh/gguf.h"
#include "moesh/make_model.h"

namespace moesh::detail {

// Tensor names, shapes, init and types in file order (offsets/n_bytes filled). Assumes the
// structural checks of MakeModelSpec::validate passed; block-size checks are done on its result.
std::vector<PlannedTensor> make_model_layout(const MakeModelSpec& spec);

// Metadata in the order llama.cpp's tools write it.
std::vector<std::pair<std::string, gguf::Value>> make_model_kvs(const MakeModelSpec& spec);

// Checks only the spec's own fields (counts, divisibility, arch rules), not tensor block sizes.
Status validate_spec_fields(const MakeModelSpec& spec);

}  // namespace moesh::detail
