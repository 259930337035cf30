// Small models for the swarm tests, generated once per process into a temp directory.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "moesh/make_model/make_model.h"

namespace moesh::swarm::testing {

inline std::string temp_dir() {
  static const std::string dir = [] {
    std::string tmpl = (std::filesystem::temp_directory_path() / "moesh-swarm-XXXXXX").string();
    const char* d = ::mkdtemp(tmpl.data());
    return std::string(d != nullptr ? d : "/tmp");
  }();
  return dir;
}

// A tiny model of `arch`, `type`, `seed` (cached per process). n_embd 64, 8 experts, 2..3 layers.
inline std::string small_model(MakeArch arch, MakeFileType type, uint64_t seed) {
  static std::map<std::string, std::string> cache;
  const std::string key =
      std::string(make_arch_name(arch)) + "-" + make_file_type_name(type) + "-" + std::to_string(seed);
  if (auto it = cache.find(key); it != cache.end()) return it->second;
  MakeModelSpec s = MakeModelSpec::defaults_for(arch);
  s.type = type;
  s.seed = seed;
  s.n_vocab = 64;
  s.vocab = MakeVocab::kNone;  // 64 ids is too small for the built-in BPE vocabulary
  s.n_embd = 64;
  s.n_head = 2;
  s.n_head_kv = 1;
  s.head_dim = 32;
  s.n_expert = 8;
  s.n_expert_used = 2;
  s.n_ff_exp = 64;
  s.n_ff = 64;
  if (arch == MakeArch::kDeepseek2) {
    s.n_layer = 3;  // layer 0 dense
    s.q_lora_rank = 32;
    s.kv_lora_rank = 32;
    s.qk_nope = 32;
    s.qk_rope = 32;
    s.v_head = 32;
    s.n_group = 2;
    s.n_group_used = 1;
  } else {
    s.n_layer = 2;
  }
  const std::string path = temp_dir() + "/" + key + ".gguf";
  Status st = make_model(s, path);
  EXPECT_TRUE(st.is_ok()) << st.to_string();
  cache[key] = path;
  return path;
}

// Opens a GGUF file (null, with a test failure, on error).
inline std::unique_ptr<gguf::File> open_gguf(const std::string& path) {
  auto f = gguf::File::open(path);
  EXPECT_TRUE(f.is_ok()) << f.status().to_string();
  return f.is_ok() ? std::move(*f) : nullptr;
}

// Deterministic hidden rows with values of a realistic scale; `tag` separates data sets.
inline std::vector<float> random_rows(uint64_t tag, size_t n_rows, size_t n_cols) {
  std::mt19937_64 rng(0x5157A8Du ^ (tag * 0x9E3779B97F4A7C15ull));
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(n_rows * n_cols);
  for (float& v : x) v = nd(rng);
  return x;
}

}  // namespace moesh::swarm::testing
