#include "moesh/tensor/types.h"

#include <array>
#include <cctype>
#include <string>

namespace moesh {
namespace {

constexpr TypeTraits k_unknown{"unknown", 0, 0, false, false};

constexpr std::array<TypeTraits, static_cast<size_t>(GgmlType::kCOUNT)> make_table() {
  std::array<TypeTraits, static_cast<size_t>(GgmlType::kCOUNT)> t{};
  for (auto& e : t) e = k_unknown;
  auto set = [&](GgmlType id, const char* name, int64_t bs, size_t bb, bool q) {
    t[static_cast<size_t>(id)] = TypeTraits{name, bs, bb, q, true};
  };
  set(GgmlType::F32, "F32", 1, 4, false);
  set(GgmlType::F16, "F16", 1, 2, false);
  set(GgmlType::Q4_0, "Q4_0", 32, 18, true);
  set(GgmlType::Q4_1, "Q4_1", 32, 20, true);
  set(GgmlType::Q5_0, "Q5_0", 32, 22, true);
  set(GgmlType::Q5_1, "Q5_1", 32, 24, true);
  set(GgmlType::Q8_0, "Q8_0", 32, 34, true);
  set(GgmlType::Q8_1, "Q8_1", 32, 36, true);
  set(GgmlType::Q2_K, "Q2_K", 256, 84, true);
  set(GgmlType::Q3_K, "Q3_K", 256, 110, true);
  set(GgmlType::Q4_K, "Q4_K", 256, 144, true);
  set(GgmlType::Q5_K, "Q5_K", 256, 176, true);
  set(GgmlType::Q6_K, "Q6_K", 256, 210, true);
  set(GgmlType::Q8_K, "Q8_K", 256, 292, true);
  set(GgmlType::IQ4_NL, "IQ4_NL", 32, 18, true);
  set(GgmlType::IQ4_XS, "IQ4_XS", 256, 136, true);
  set(GgmlType::I8, "I8", 1, 1, false);
  set(GgmlType::I16, "I16", 1, 2, false);
  set(GgmlType::I32, "I32", 1, 4, false);
  set(GgmlType::I64, "I64", 1, 8, false);
  set(GgmlType::F64, "F64", 1, 8, false);
  set(GgmlType::BF16, "BF16", 1, 2, false);
  set(GgmlType::MXFP4, "MXFP4", 32, 17, true);
  return t;
}

constexpr auto k_table = make_table();

}  // namespace

const TypeTraits& type_traits(uint32_t id) {
  if (id >= k_table.size()) return k_unknown;
  return k_table[id];
}

bool type_from_name(std::string_view name, GgmlType* out) {
  std::string up;
  for (char c : name) up.push_back(static_cast<char>(std::toupper(static_cast<unsigned char>(c))));
  for (size_t i = 0; i < k_table.size(); ++i) {
    if (k_table[i].is_known && up == k_table[i].name) {
      *out = static_cast<GgmlType>(i);
      return true;
    }
  }
  return false;
}

}  // namespace moesh
