// What `moesh make-model --arch A` needs from the architecture registry for the architectures
// whose file defines make_defaults / write_hparams (src/model/arch.h): the reference-sized
// hyper-parameters, the metadata keys that describe them, and the tensor table — the SAME table
// the loader binds (the arch's bind functions run against a recording binder), so a written model
// always loads.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "moesh/gguf/gguf.h"
#include "moesh/model/model.h"

namespace moesh {

struct ArchTensorSpec {
  std::string name;
  std::vector<int64_t> ne;  // ne0 first
  int layer = -1;           // block index, -1 for global tensors
};

struct ArchMakePlan {
  std::vector<std::pair<std::string, gguf::Value>> kvs;  // "<arch>.*" keys, converter order
  std::vector<ArchTensorSpec> tensors;                   // binding order: globals, then per block
  HParams hp;                                            // as load_hparams reads the keys back
};

// Architectures make-model can write through the registry.
std::vector<std::string> makeable_architectures();
// The reference-sized model of `arch` (kNotFound when it has none). Fields the caller changes
// (n_embd, n_layer, heads, experts, widths, rope base, rms eps) are then described by arch_make_plan.
Result<HParams> arch_make_defaults(std::string_view arch);
// The keys describing `hp` and every tensor the loader will bind for them.
Result<ArchMakePlan> arch_make_plan(const HParams& hp);

}  // namespace moesh
