// Building blocks of the expert FFN shared by expert_ffn() and LocalExecutor. Both compose
// them so that every output element is one dot product of the same rows, which is why the
// executor's cross-expert scheduling gives the bits of expert_ffn() run one expert at a time.
#pragma once

#include <cstdint>

#include "moesh/executor.h"
#include "moesh/tensor.h"

namespace moesh {

// Rows [r0, r1) of a 2-D weight view, as a 2-D view (a slice of the output dimension).
TensorView weight_rows(const TensorView& w, int64_t r0, int64_t r1);

// h = act(g, u) over n elements.
void expert_activation(ExpertActivation act, const float* g, const float* u, float* h, int64_t n);

}  // namespace moesh
