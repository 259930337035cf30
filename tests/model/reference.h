// Helpers for the parity tests: the llama.cpp reference files (../shared/reference, README §5)
// and a forward-pass observer that records routing and hidden states.
#pragma once

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "moesh/model/model.h"

namespace moesh::testing {

inline std::string reference_dir() {
  return MOESH_REFERENCE_DIR;
}

// *.gguf files of the reference folder and of its archs/ and archs2/ subfolders (as
// "archs/<name>"), sorted (empty when the folder is absent).
inline std::vector<std::string> reference_models() {
  std::vector<std::string> out;
  std::error_code ec;
  if (!std::filesystem::is_directory(reference_dir(), ec)) return out;
  for (const char* sub : {"", "archs/", "archs2/"}) {
    const std::string dir = reference_dir() + "/" + sub;
    if (!std::filesystem::is_directory(dir, ec)) continue;
    for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
      if (e.path().extension() == ".gguf") out.push_back(sub + e.path().filename().string());
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

// The general.architecture of a reference file when this build does not run it yet (for a loud
// skip naming it), "" when it is supported or unreadable (then loading reports the error).
inline std::string unsupported_reference_arch(const std::string& file) {
  auto f = gguf::File::open(reference_dir() + "/" + file);
  if (!f) return "";
  auto arch = (*f)->get_or<std::string>("general.architecture", "");
  if (!arch.is_ok() || arch->empty()) return "";
  for (const std::string& a : supported_architectures()) {
    if (a == *arch) return "";
  }
  return *arch;
}

inline nlohmann::json load_json(const std::string& path) {
  std::ifstream in(path);
  if (!in) return nlohmann::json();
  return nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
}

struct RefSequence {
  std::string name;
  std::vector<int32_t> tokens;
  std::vector<int32_t> argmax;
  std::vector<std::vector<float>> logits;
  // routing[i]: one MoE layer: layer id, selected [T][k], weights [T][k], margin [T]
  struct Routing {
    int layer = 0;
    std::vector<std::vector<int32_t>> selected;
    std::vector<std::vector<float>> weights;
    std::vector<float> margin;
  };
  std::vector<Routing> routing;
  std::vector<std::vector<std::vector<float>>> hidden;  // [layer][T][n_embd] (seq16 only)
};

inline std::vector<RefSequence> parse_sequences(const nlohmann::json& j) {
  std::vector<RefSequence> out;
  if (!j.is_object() || !j.contains("sequences")) return out;
  for (const auto& s : j["sequences"]) {
    RefSequence r;
    r.name = s["name"].get<std::string>();
    r.tokens = s["tokens"].get<std::vector<int32_t>>();
    r.argmax = s["argmax"].get<std::vector<int32_t>>();
    r.logits = s["logits"].get<std::vector<std::vector<float>>>();
    for (const auto& rt : s["routing"]) {
      RefSequence::Routing x;
      x.layer = rt["layer"].get<int>();
      x.selected = rt["selected"].get<std::vector<std::vector<int32_t>>>();
      x.weights = rt["weights"].get<std::vector<std::vector<float>>>();
      x.margin = rt["margin"].get<std::vector<float>>();
      r.routing.push_back(std::move(x));
    }
    if (s.contains("hidden_states")) {
      for (const auto& hs : s["hidden_states"]) {
        r.hidden.push_back(hs["values"].get<std::vector<std::vector<float>>>());
      }
    }
    out.push_back(std::move(r));
  }
  return out;
}

// Records the routing of every MoE layer and the residual stream after every layer.
class RecordingObserver : public ForwardObserver {
 public:
  struct Routing {
    int layer;
    int k;
    std::vector<int32_t> ids;
    std::vector<float> weights;
  };
  std::vector<Routing> routing;
  std::vector<std::vector<float>> layer_out;  // [layer][T*n_embd]

  void on_routing(int layer, int64_t n_tokens, int k, const int32_t* ids, const float* w) override {
    routing.push_back(
        {layer, k, std::vector<int32_t>(ids, ids + n_tokens * k), std::vector<float>(w, w + n_tokens * k)});
  }
  void on_layer_out(int layer, int64_t n_tokens, int64_t n_embd, const float* h) override {
    if (static_cast<int>(layer_out.size()) <= layer) layer_out.resize(layer + 1);
    layer_out[layer].assign(h, h + n_tokens * n_embd);
  }
};

inline int32_t argmax_of(const float* x, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i) {
    if (x[i] > x[best]) best = i;
  }
  return static_cast<int32_t>(best);
}

inline double cosine(const float* a, const float* b, int64_t n) {
  double ab = 0, aa = 0, bb = 0;
  for (int64_t i = 0; i < n; ++i) {
    ab += static_cast<double>(a[i]) * b[i];
    aa += static_cast<double>(a[i]) * a[i];
    bb += static_cast<double>(b[i]) * b[i];
  }
  return ab / std::sqrt(aa * bb);
}

}  // namespace moesh::testing
