// aarch64 NEON kernel table (base ASIMD: every aarch64 CPU). The kernels are in simd_neon.h,
// shared with the SDOT table of kernels_neon_dot.cpp.
#include "moesh/tensor/kernels.h"
#include "simd_neon.h"

namespace moesh {

void fill_kernels_neon(KernelTable* t) {
  neon::fill_neon(t);
}

}  // namespace moesh
