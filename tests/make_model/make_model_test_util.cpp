#include "make_model/make_model_test_util.h"

#include <filesystem>
#include <fstream>

namespace moesh::test {

std::string reference_dir() {
  return MOESH_REFERENCE_DIR;
}

const std::optional<nlohmann::ordered_json>& reference_manifest() {
  static const std::optional<nlohmann::ordered_json> m = []() -> std::optional<nlohmann::ordered_json> {
    const std::string path = reference_dir() + "/manifest.json";
    if (!std::filesystem::exists(path)) return std::nullopt;
    std::ifstream in(path);
    return nlohmann::ordered_json::parse(in);
  }();
  return m;
}

const char* manifest_file_key(MakeFileType t) {
  switch (t) {
    case MakeFileType::kQ8_0:
      return "Q8_0";
    case MakeFileType::kQ4_K_M:
      return "Q4_K_M";
    default:
      return "F32";
  }
}

}  // namespace moesh::test
