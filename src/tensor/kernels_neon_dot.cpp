// aarch64 NEON + dot-product (SDOT, Armv8.2 FEAT_DotProd) kernel table. Compiled with +dotprod
// and used only when HWCAP_ASIMDDP says the CPU has it. SDOT gives the same exact int32 lane sums
// as the base table's widening multiplies, so the float part (shared code) and the bits are the
// same.
#define MOESH_NEON_DOTPROD 1
#include "moesh/tensor/kernels.h"
#include "simd_neon.h"

namespace moesh {

void fill_kernels_neon_dot(KernelTable* t) {
  neon::fill_neon(t);
}

}  // namespace moesh
