// Registers the shared x86 SIMD kernels (simd_x86_*.h) into a KernelTable. Included by
// kernels_avx2.cpp and kernels_avx512.cpp; the AVX-512 file then overrides a few entries.
#pragma once

#include "simd_x86_act.h"
#include "simd_x86_attn.h"
#include "simd_x86_kquant.h"
#include "simd_x86_legacy.h"
#include "simd_x86_tile.h"

namespace moesh::simd {
namespace {

inline void fill_x86_common(KernelTable* t) {
  auto at = [t](GgmlType type) -> TypeKernels& { return t->type[static_cast<int>(type)]; };

  at(GgmlType::Q8_0).from_float = from_float_q8_0;
  at(GgmlType::Q8_1).from_float = from_float_q8_1;
  at(GgmlType::Q8_K).from_float = from_float_q8_k;
  at(GgmlType::F16).from_float = from_float_f16;
  at(GgmlType::BF16).from_float = from_float_bf16;

  at(GgmlType::F16).to_float = to_float_f16;
  at(GgmlType::BF16).to_float = to_float_bf16;
  at(GgmlType::Q8_0).to_float = to_float_q8_0;

  at(GgmlType::F32).vec_dot = vec_dot_f32;
  at(GgmlType::F16).vec_dot = vec_dot_f16;
  at(GgmlType::BF16).vec_dot = vec_dot_bf16;

  at(GgmlType::Q8_0).vec_dot = vec_dot_q8_0;
  at(GgmlType::Q4_0).vec_dot = vec_dot_q4_0;
  at(GgmlType::Q5_0).vec_dot = vec_dot_q5_0;
  at(GgmlType::IQ4_NL).vec_dot = vec_dot_iq4_nl;
  at(GgmlType::MXFP4).vec_dot = vec_dot_mxfp4;
  at(GgmlType::Q4_1).vec_dot = vec_dot_q4_1;
  at(GgmlType::Q5_1).vec_dot = vec_dot_q5_1;

  at(GgmlType::Q2_K).vec_dot = vec_dot_q2_k;
  at(GgmlType::Q3_K).vec_dot = vec_dot_q3_k;
  at(GgmlType::Q4_K).vec_dot = vec_dot_q4_k;
  at(GgmlType::Q5_K).vec_dot = vec_dot_q5_k;
  at(GgmlType::Q6_K).vec_dot = vec_dot_q6_k;
  at(GgmlType::IQ4_XS).vec_dot = vec_dot_iq4_xs;
  at(GgmlType::Q8_K).vec_dot = vec_dot_q8_k;

  t->attn = AttnKernels{attn_scores_avx2, attn_kqv_avx2, softmax_avx2};

  fill_tiles(t);
}

}  // namespace
}  // namespace moesh::simd
