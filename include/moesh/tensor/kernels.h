// Per-type kernel table, chosen at run time from CPUID (x86) or HWCAP (aarch64).
//
// Each ISA (scalar reference; AVX2, AVX-512 on x86-64; NEON, NEON+SDOT on aarch64) fills a
// KernelTable; entries an ISA does not specialise point at the scalar reference. Every entry must
// return the same bits as the scalar reference (the canonical order in quant.h) — tests/tensor
// compares them. MOESH_ISA=scalar|avx2|avx512|neon|neondot in the environment forces a table
// (for tests and benches).
#pragma once

#include <cstdint>

#include "moesh/tensor/types.h"

namespace moesh {

enum class Isa : int { kScalar = 0, kAvx2, kAvx512, kNeon, kNeonDot, kCOUNT };
const char* isa_name(Isa isa);

// float dot of one weight row (type T) with one activation row (vec_dot_type(T)), n elements.
using VecDotFn = float (*)(int64_t n, const void* w, const void* x);
// Converts n floats to an activation row (Q8_0, Q8_1, Q8_K, F16, BF16, F32).
using FromFloatFn = void (*)(const float* x, void* y, int64_t n);
// Widens n elements of a row to floats.
using ToFloatFn = void (*)(const void* x, float* y, int64_t n);
// Tile: out[c*ldo + r] = dot(w_row[r], x_row[c]) for r < nr, c < nc, rows given by base + stride.
// Must equal nr*nc calls of VecDotFn bit for bit (same per-element order); it exists so GEMM
// can reuse loaded activations/weights. May be null (the caller loops over vec_dot).
using VecDotTileFn = void (*)(int64_t n, const void* w, size_t w_stride, int nr, const void* x, size_t x_stride, int nc,
                              float* out, size_t ldo);
// Rows: out[r] = dot(w_row[r], x) for r < nr, one activation row (a batch-1 matvec). Must equal
// nr calls of VecDotFn bit for bit; it exists so the activation's preparation (repacking, sums)
// is paid once for many rows. May be null.
using VecDotRowsFn = void (*)(int64_t n, const void* w, size_t w_stride, int nr, const void* x, float* out);

struct TypeKernels {
  VecDotFn vec_dot = nullptr;
  VecDotTileFn vec_dot_tile = nullptr;
  VecDotRowsFn vec_dot_rows = nullptr;
  ToFloatFn to_float = nullptr;
  FromFloatFn from_float = nullptr;  // set for activation types
};

// ---- Attention over an F32 KV cache (model/layers.cpp attention_core), in llama.cpp's order.
//
// Scores: out[j * out_stride + c] = dot(K_c, q_j) * scale for cells c in [c0, c1) and queries
// j < nq, K_c at k + c * k_stride. The dot is ggml_vec_dot_f32's AVX-512 order, whatever the
// ISA: element i -> lane i % 64 (fused multiply-add), the lanes summed by a halving tree (32, 16,
// 8, 4, 2, 1), then the dk % 64 leftovers one by one by fused multiply-add. Several cells and
// queries per call let a SIMD kernel reuse each loaded key row and reduce 8 or 16 cells' lanes
// in one transposed tree (the same pairs added, so the same bits as one cell at a time).
struct AttnScores {
  const float* k = nullptr;
  size_t k_stride = 0;  // floats between consecutive cells' K rows
  const float* q = nullptr;
  size_t q_stride = 0;  // floats between query rows
  int nq = 1;
  int64_t dk = 0;
  int64_t c0 = 0, c1 = 0;
  float scale = 1.0f;
  float* out = nullptr;
  size_t out_stride = 0;  // floats between the score rows of consecutive queries
};
using AttnScoresFn = void (*)(const AttnScores& a);

// KQV lanes, for heads j < nh that share the V rows: lanes_j[(c % 16) * dv + d] =
// fma(V_c[d], p_j[c], lanes_j[(c % 16) * dv + d]) for cells c in [c0, c1) in increasing order,
// V_c at v + c * v_stride, lanes_j = lanes + j * lanes_stride, p_j = p + j * p_stride.
// llama.cpp's F32 tinyBLAS mul_mat(V^T, P) gives each output 16 lanes over the cells; the caller
// sums them by a halving tree. The lanes carry over between calls, so a long row may come in
// pieces. Taking a KV group's heads in one call lets a kernel copy a chunk of V rows into a
// compact buffer once for all of them (the cache rows of one layer are kilobytes apart, so read
// in place every 64-byte slice of a chunk lands in the same L1 set).
struct AttnKqv {
  float* lanes = nullptr;  // nh x [16][dv]
  size_t lanes_stride = 0;
  const float* v = nullptr;
  size_t v_stride = 0;
  const float* p = nullptr;  // p_j[c] for c in [c0, c1)
  size_t p_stride = 0;
  int nh = 1;
  int64_t c0 = 0, c1 = 0;
  int64_t dv = 0;
};
using AttnKqvFn = void (*)(const AttnKqv& a);

// Softmax of a row in place, ggml_vec_soft_max_f32's AVX-512 order (tensor/ops.h softmax: 16
// values at a time through ggml's vector exp, each group's halving-tree sum added to a double,
// the n % 16 tail with expf); sink: an extra logit with no value, or null.
using SoftmaxFn = void (*)(float* x, int64_t n, const float* sink);

struct AttnKernels {
  AttnScoresFn scores = nullptr;
  AttnKqvFn kqv = nullptr;
  SoftmaxFn softmax = nullptr;
};

struct KernelTable {
  Isa isa = Isa::kScalar;
  TypeKernels type[static_cast<int>(GgmlType::kCOUNT)];
  AttnKernels attn;
  const TypeKernels& operator[](GgmlType t) const { return type[static_cast<int>(t)]; }
};

// Best table for this CPU (or the one MOESH_ISA names, if the CPU supports it).
const KernelTable& kernels();
// A specific ISA's table, or nullptr if this CPU (or this build) lacks it.
const KernelTable* kernels_for(Isa isa);
// What the CPU supports (CPUID), independent of MOESH_ISA.
bool cpu_has(Isa isa);
// AVX-512 kernels are built into the tables when the CPU has them, unless MOESH_ENABLE_AVX512=0
// (MOESH_ISA=avx512 builds them regardless of that variable).
bool avx512_enabled();

// Implemented per ISA file; each fills `t` on top of an already-filled scalar table.
void fill_kernels_scalar(KernelTable* t);
void fill_kernels_avx2(KernelTable* t);      // src/tensor/kernels_avx2.cpp (x86 builds only)
void fill_kernels_avx512(KernelTable* t);    // src/tensor/kernels_avx512.cpp (x86 builds only)
void fill_kernels_neon(KernelTable* t);      // src/tensor/kernels_neon.cpp (aarch64 builds only)
void fill_kernels_neon_dot(KernelTable* t);  // src/tensor/kernels_neon_dot.cpp (aarch64 builds only)

}  // namespace moesh
