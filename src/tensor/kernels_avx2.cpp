// AVX2 (+FMA, F16C, BMI2) kernel table. The kernels themselves are in simd_x86_*.h, shared with
// the AVX-512 table; this file instantiates them for AVX2 (maddubs-based integer dots).
#include "moesh/tensor/kernels.h"
#include "simd_x86_fill.h"

namespace moesh {

void fill_kernels_avx2(KernelTable* t) {
  simd::fill_x86_common(t);
}

}  // namespace moesh
