// Kernel table selection: CPUID decides which per-ISA tables exist; MOESH_ISA can force one.
#include "moesh/tensor/kernels.h"

#include <spdlog/spdlog.h>

#if defined(__clang__) && (defined(__x86_64__) || defined(__i386__))
#include <cpuid.h>
#endif
#if defined(MOESH_ARM64)
#include <asm/hwcap.h>
#include <sys/auxv.h>
#endif
#include <cstdlib>
#include <cstring>
#include <mutex>

namespace moesh {

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::kScalar:
      return "scalar";
    case Isa::kAvx2:
      return "avx2";
    case Isa::kAvx512:
      return "avx512";
    case Isa::kNeon:
      return "neon";
    case Isa::kNeonDot:
      return "neondot";
    case Isa::kCOUNT:
      break;
  }
  return "unknown";
}

#if defined(MOESH_X86)
namespace {
// F16C from CPUID leaf 1 (ECX bit 29): clang 14's __builtin_cpu_supports does not know "f16c".
bool cpu_has_f16c() {
#if defined(__clang__)
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid(1, &a, &b, &c, &d) != 0 && (c & (1u << 29)) != 0;
#else
  return __builtin_cpu_supports("f16c");
#endif
}
}  // namespace
#endif

bool cpu_has(Isa isa) {
  switch (isa) {
    case Isa::kScalar:
      return true;
#if defined(MOESH_X86)
    case Isa::kAvx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && cpu_has_f16c() &&
             __builtin_cpu_supports("bmi2");
    case Isa::kAvx512:
      return cpu_has(Isa::kAvx2) && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
             __builtin_cpu_supports("avx512vnni");
#endif
#if defined(MOESH_ARM64)
    case Isa::kNeon:
      return true;  // ASIMD is part of the aarch64 base architecture
    case Isa::kNeonDot:
      return (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) != 0;
#endif
    default:
      return false;
  }
}

bool avx512_enabled() {
  if (!cpu_has(Isa::kAvx512)) return false;
  const char* en = std::getenv("MOESH_ENABLE_AVX512");
  const char* isa = std::getenv("MOESH_ISA");
  if (isa != nullptr && std::strcmp(isa, "avx512") == 0) return true;
  return en == nullptr || std::strcmp(en, "0") != 0;
}

namespace {

struct Tables {
  KernelTable t[static_cast<int>(Isa::kCOUNT)];
  bool present[static_cast<int>(Isa::kCOUNT)] = {};
  Isa best = Isa::kScalar;
};

const Tables& tables() {
  static const Tables tabs = [] {
    Tables r;
    auto& s = r.t[static_cast<int>(Isa::kScalar)];
    s.isa = Isa::kScalar;
    fill_kernels_scalar(&s);
    r.present[static_cast<int>(Isa::kScalar)] = true;
#if defined(MOESH_X86)
    if (cpu_has(Isa::kAvx2)) {
      auto& a = r.t[static_cast<int>(Isa::kAvx2)];
      a = s;
      a.isa = Isa::kAvx2;
      fill_kernels_avx2(&a);
      r.present[static_cast<int>(Isa::kAvx2)] = true;
      r.best = Isa::kAvx2;
    }
    // The AVX-512 table (bit-identical to AVX2 and scalar: test_kernels_simd, run on Zen 5
    // hardware since 2026-12-04) is the default where the CPU has it; MOESH_ENABLE_AVX512=0
    // leaves it out.
    if (avx512_enabled()) {
      auto& a = r.t[static_cast<int>(Isa::kAvx512)];
      a = r.t[static_cast<int>(Isa::kAvx2)];
      a.isa = Isa::kAvx512;
      fill_kernels_avx512(&a);
      r.present[static_cast<int>(Isa::kAvx512)] = true;
      r.best = Isa::kAvx512;
    }
#endif
#if defined(MOESH_ARM64)
    for (Isa isa : {Isa::kNeon, Isa::kNeonDot}) {
      if (!cpu_has(isa)) continue;
      auto& a = r.t[static_cast<int>(isa)];
      a = s;
      a.isa = isa;
      (isa == Isa::kNeon ? fill_kernels_neon : fill_kernels_neon_dot)(&a);
      r.present[static_cast<int>(isa)] = true;
      r.best = isa;
    }
#endif
    if (const char* env = std::getenv("MOESH_ISA")) {
      bool found = false;
      for (int i = 0; i < static_cast<int>(Isa::kCOUNT); ++i) {
        if (std::strcmp(env, isa_name(static_cast<Isa>(i))) == 0) {
          found = true;
          if (r.present[i]) {
            r.best = static_cast<Isa>(i);
          } else {
            spdlog::warn("MOESH_ISA={} not supported by this CPU; using {}", env, isa_name(r.best));
          }
        }
      }
      if (!found) spdlog::warn("MOESH_ISA={} unknown (scalar|avx2|avx512|neon|neondot)", env);
    }
    return r;
  }();
  return tabs;
}

}  // namespace

const KernelTable& kernels() {
  const Tables& t = tables();
  return t.t[static_cast<int>(t.best)];
}

const KernelTable* kernels_for(Isa isa) {
  const Tables& t = tables();
  const int i = static_cast<int>(isa);
  if (i < 0 || i >= static_cast<int>(Isa::kCOUNT) || !t.present[i]) return nullptr;
  return &t.t[i];
}

}  // namespace moesh
