// Shared helpers for the make_model tests: the reference manifest and per-arch cases.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "moesh/make_model/make_model.h"

namespace moesh::test {

struct ArchCase {
  MakeArch arch;
  const char* ref_model;  // key in manifest.json "models"
};
inline constexpr ArchCase kArchCases[] = {
    {MakeArch::kQwen3Moe, "qwen3moe-s"},
    {MakeArch::kLlama, "mixtral-s"},
    {MakeArch::kDeepseek2, "deepseek2-s"},
};
inline constexpr MakeFileType kFileTypes[] = {MakeFileType::kF32, MakeFileType::kF16, MakeFileType::kQ8_0,
                                              MakeFileType::kQ4_K_M};

std::string reference_dir();
// manifest.json with key order preserved; nullopt when the reference folder is absent.
const std::optional<nlohmann::ordered_json>& reference_manifest();
// The manifest "files" entry that a generated file of type t should match: F32 for f32 and
// f16 (the converter layout), Q8_0, Q4_K_M.
const char* manifest_file_key(MakeFileType t);

}  // namespace moesh::test
