// MOESH_FMA_CLONES: compile a function twice — for x86-64-v3 (AVX2 + FMA) and for the baseline —
// and pick one at load time (GCC ifunc). Code that follows ggml's float order uses std::fmaf;
// in a baseline build that is a libm call per element, in the v3 clone it is one instruction
// and loops vectorise. A fused multiply-add is correctly rounded either way, so both clones give
// the same bits.
#pragma once

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_ADDRESS__)
#define MOESH_FMA_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define MOESH_FMA_CLONES
#endif

// MOESH_VECTORIZE: let GCC vectorise a loop of independent element updates (each element keeps
// its own fused multiply-add sequence, so vector and scalar code give the same bits). -O2 in
// GCC 12 only vectorises loops that need no run-time alias check or remainder loop.
#if defined(__GNUC__) && !defined(__clang__)
#define MOESH_VECTORIZE __attribute__((optimize("tree-vectorize", "vect-cost-model=dynamic")))
#else
#define MOESH_VECTORIZE
#endif
