#include "moesh/tensor/tensor.h"

#include <cassert>

namespace moesh {

void TensorView::set_contiguous_strides() {
  nb[0] = type_block_bytes(type);
  nb[1] = type_row_bytes(type, ne[0]);
  nb[2] = nb[1] * static_cast<size_t>(ne[1]);
  nb[3] = nb[2] * static_cast<size_t>(ne[2]);
}

TensorView TensorView::expert(int64_t e) const {
  assert(n_dims == 3 && e >= 0 && e < ne[2]);
  TensorView v = *this;
  v.n_dims = 2;
  v.ne[2] = 1;
  v.data = data + expert_slab_offset(*this, e);
  v.nb[3] = v.nb[2];
  return v;
}

TensorView TensorView::expert_range(int64_t e0, int64_t n) const {
  assert(n_dims == 3 && e0 >= 0 && n >= 0 && e0 + n <= ne[2]);
  TensorView v = *this;
  v.ne[2] = n;
  v.data = data + expert_slab_offset(*this, e0);
  v.nb[3] = v.nb[2] * static_cast<size_t>(n);
  return v;
}

}  // namespace moesh
