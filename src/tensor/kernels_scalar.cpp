// The scalar kernel table: every supported type points at its reference routine (quant_impl.h),
// so the scalar table *is* the canonical order and SIMD tables inherit it for types they skip.
#include "moesh/tensor/kernels.h"
#include "moesh/tensor/quant.h"
#include "tensor/quant_impl.h"

namespace moesh {

namespace {

// The formats activations are converted to before a dot product (docs/background/quant-formats.md §5).
bool is_activation_type(GgmlType t) {
  switch (t) {
    case GgmlType::F32:
    case GgmlType::F16:
    case GgmlType::BF16:
    case GgmlType::Q8_0:
    case GgmlType::Q8_1:
    case GgmlType::Q8_K:
      return true;
    default:
      return false;
  }
}

}  // namespace

void fill_kernels_scalar(KernelTable* t) {
  for (int i = 0; i < static_cast<int>(GgmlType::kCOUNT); ++i) {
    const auto type = static_cast<GgmlType>(i);
    const quant::ref::RefKernels& r = quant::ref::ref_kernels(type);
    TypeKernels& k = t->type[i];
    k = TypeKernels{};
    if (r.to_float == nullptr) continue;
    k.vec_dot = r.vec_dot;
    k.to_float = r.to_float;
    if (is_activation_type(type)) k.from_float = r.from_float;
  }
  t->attn = AttnKernels{quant::ref::attn_scores, quant::ref::attn_kqv, quant::ref::softmax};
}

}  // namespace moesh
