// TensorView: a zero-copy view of tensor data (usually inside a mapped GGUF file).
//
// Geometry follows ggml: ne[0] is the row length (fastest axis); nb[] are byte strides with
// nb[1] = row bytes, nb[i] = nb[i-1]*ne[i-1] for contiguous tensors. A stacked expert tensor
// `*_exps` has ne = [K, M, n_expert]; expert e is the contiguous slab at data + e*nb[2].
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "moesh/tensor/types.h"

namespace moesh {

struct TensorView {
  std::string name;
  GgmlType type = GgmlType::F32;
  int n_dims = 0;
  int64_t ne[4] = {1, 1, 1, 1};
  size_t nb[4] = {0, 0, 0, 0};
  const uint8_t* data = nullptr;

  bool valid() const { return data != nullptr; }
  int64_t n_elements() const { return ne[0] * ne[1] * ne[2] * ne[3]; }
  int64_t n_rows() const { return ne[1] * ne[2] * ne[3]; }
  size_t row_bytes() const { return type_row_bytes(type, ne[0]); }
  size_t n_bytes() const { return row_bytes() * static_cast<size_t>(n_rows()); }
  const uint8_t* row(int64_t i1, int64_t i2 = 0, int64_t i3 = 0) const {
    return data + i1 * nb[1] + i2 * nb[2] + i3 * nb[3];
  }

  // Fills nb[] for a contiguous tensor from type and ne[].
  void set_contiguous_strides();
  // Expert e of a stacked tensor as a 2-D view [ne0, ne1] (requires n_dims == 3).
  TensorView expert(int64_t e) const;
  // Experts [e0, e0+n) as a 3-D view.
  TensorView expert_range(int64_t e0, int64_t n) const;
};

// Byte offset of expert e's slab inside a stacked tensor, and the bytes of one slab.
inline size_t expert_slab_offset(const TensorView& t, int64_t e) {
  return static_cast<size_t>(e) * t.nb[2];
}
inline size_t expert_slab_bytes(const TensorView& t) {
  return t.nb[2];
}

}  // namespace moesh
