// Shared pieces of the dist tests: test models (make-model files in a temp folder, the
// reference files when present), running a model with a given executor, and comparing logits.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "moesh/make_model/make_model.h"
#include "moesh/model/model.h"
#include "moesh/model/sampling.h"
#include "moesh/remote/remote.h"
#include "moesh/swarm/swarm.h"

namespace moesh::test {

inline std::string temp_dir() {
  static const std::string dir = [] {
    auto p = std::filesystem::temp_directory_path() / ("moesh-dist-" + std::to_string(getpid()));
    std::filesystem::create_directories(p);
    return p.string();
  }();
  return dir;
}

// A make-model file of `spec`, written once per process under `name`.
inline std::string made_model(const std::string& name, const MakeModelSpec& spec) {
  static std::map<std::string, std::string> cache;
  auto it = cache.find(name);
  if (it != cache.end()) return it->second;
  const std::string path = temp_dir() + "/" + name + ".gguf";
  Status st = make_model(spec, path);
  EXPECT_TRUE(st.is_ok()) << st.to_string();
  cache[name] = path;
  return path;
}

// qwen3moe, F16 weights, 16 experts top-4: more experts than the reference models, so splits
// across workers and the backbone all get traffic.
inline std::string made_qwen3moe() {
  MakeModelSpec s = MakeModelSpec::defaults_for(MakeArch::kQwen3Moe);
  s.type = MakeFileType::kF16;
  s.seed = 77;
  s.n_expert = 16;
  s.n_expert_used = 4;
  s.n_embd = 128;
  s.n_ff_exp = 128;
  s.n_head = 4;
  s.head_dim = 32;
  return made_model("qwen3moe-e16", s);
}

inline std::string reference_path(const std::string& file) {
  return std::string(MOESH_REFERENCE_DIR) + "/" + file;
}

// The reference manifest's "seq16" for a reference file's model (routing margins are large, so
// lossy paths do not flip experts), else `n` seeded random ids.
inline std::vector<int32_t> test_tokens(const std::string& path, int64_t n_vocab, size_t n = 12) {
  std::ifstream in(std::string(MOESH_REFERENCE_DIR) + "/manifest.json");
  if (in) {
    auto j = nlohmann::json::parse(in, nullptr, false);
    const std::string file = std::filesystem::path(path).filename().string();
    if (j.is_object() && j.contains("models")) {
      for (auto& [name, m] : j["models"].items()) {
        if (file.rfind(name + ".", 0) == 0 && m.contains("sequences") && m["sequences"].contains("seq16")) {
          auto v = m["sequences"]["seq16"].get<std::vector<int32_t>>();
          if (v.size() > n) v.resize(n);
          return v;
        }
      }
    }
  }
  std::mt19937_64 rng(2024);
  std::uniform_int_distribution<int32_t> d(0, static_cast<int32_t>(n_vocab - 1));
  std::vector<int32_t> v(n);
  for (auto& t : v) t = d(rng);
  return v;
}

// Runs `tokens` (the first 2/3 as one batch, the rest one at a time) and returns every
// position's logits. The Context hands `exec` (if any) its thread pool.
inline Result<std::vector<float>> run_model(const Model& m, const std::vector<int32_t>& tokens,
                                            std::shared_ptr<ExpertExecutor> exec = nullptr) {
  ContextParams cp;
  cp.n_threads = 1;
  cp.n_ctx = static_cast<int64_t>(tokens.size());
  cp.executor = std::move(exec);
  Context ctx(m, cp);
  const int64_t T = static_cast<int64_t>(tokens.size());
  const int64_t V = m.hparams().n_vocab;
  std::vector<float> out(static_cast<size_t>(T * V));
  const int64_t n_pre = std::max<int64_t>(1, 2 * T / 3);
  MOESH_RETURN_IF_ERROR(ctx.decode(0, tokens.data(), n_pre, out.data()));
  for (int64_t t = n_pre; t < T; ++t) MOESH_RETURN_IF_ERROR(ctx.decode(0, &tokens[t], 1, out.data() + t * V));
  return out;
}

// The qwen3moe test model, a backbone slice of it (no experts: every pair goes to a worker),
// and the all-local logits of `n` test tokens, which every remote path must reproduce bit for bit.
struct SliceSetup {
  std::string path;
  std::unique_ptr<Model> model, backbone;
  std::vector<int32_t> toks;
  std::vector<float> local;
};
inline SliceSetup slice_setup(const std::string& tag, size_t n) {
  SliceSetup s;
  s.path = made_qwen3moe();
  auto model = Model::load(s.path);
  EXPECT_TRUE(model.is_ok()) << model.status().to_string();
  if (!model.is_ok()) return s;
  s.model = std::move(*model);
  const std::string bb = temp_dir() + "/qwen3moe-e16-backbone-" + tag + ".gguf";
  auto f = gguf::File::open(s.path);
  EXPECT_TRUE(f.is_ok() && swarm::write_backbone_slice(**f, bb).is_ok());
  auto backbone = Model::load(bb);
  EXPECT_TRUE(backbone.is_ok()) << backbone.status().to_string();
  if (!backbone.is_ok()) return s;
  s.backbone = std::move(*backbone);
  s.toks = test_tokens("", s.model->hparams().n_vocab, n);
  auto local = run_model(*s.model, s.toks);
  EXPECT_TRUE(local.is_ok());
  if (local.is_ok()) s.local = std::move(*local);
  return s;
}

// Runs the setup's tokens through every executor at the same time (one thread each) and checks
// each run gave the all-local bits; `what` names the path in failure messages.
inline void expect_concurrent_runs_exact(const SliceSetup& su,
                                         const std::vector<std::shared_ptr<ExpertExecutor>>& execs,
                                         const std::string& what) {
  std::vector<Result<std::vector<float>>> got(execs.size(), Status(StatusCode::kInternal, "not run"));
  std::vector<std::thread> threads;
  for (size_t i = 0; i < execs.size(); ++i)
    threads.emplace_back([&, i] { got[i] = run_model(*su.backbone, su.toks, execs[i]); });
  for (std::thread& t : threads) t.join();
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_TRUE(got[i].is_ok()) << what << ", executor " << i << ": " << got[i].status().to_string();
    ASSERT_EQ(got[i]->size(), su.local.size());
    EXPECT_EQ(std::memcmp(got[i]->data(), su.local.data(), got[i]->size() * sizeof(float)), 0)
        << what << ", executor " << i;
  }
}

inline double cosine(const float* a, const float* b, int64_t n) {
  double ab = 0, aa = 0, bb = 0;
  for (int64_t i = 0; i < n; ++i) {
    ab += double(a[i]) * b[i];
    aa += double(a[i]) * a[i];
    bb += double(b[i]) * b[i];
  }
  return ab / std::sqrt(aa * bb);
}

struct Agreement {
  double min_cosine = 1.0;
  double argmax_frac = 1.0;
  // The same over the positions whose reference top-1 beats its top-2 by more than the
  // tie margin: a lossy path may legitimately swap two logits that are (nearly) tied.
  double argmax_frac_clear = 1.0;
  double max_flip_margin = 0.0;  // largest reference top-1/top-2 gap at a flipped position
};

// Gap between the largest and second-largest value of a row.
inline double top2_margin(const float* x, int64_t n) {
  float a = -INFINITY, b = -INFINITY;
  for (int64_t i = 0; i < n; ++i) {
    if (x[i] > a) {
      b = a;
      a = x[i];
    } else if (x[i] > b) {
      b = x[i];
    }
  }
  return static_cast<double>(a) - b;
}

inline Agreement compare_logits(const std::vector<float>& ref, const std::vector<float>& b, int64_t V,
                                double tie_margin = 0.0) {
  Agreement g;
  const int64_t T = static_cast<int64_t>(ref.size()) / V;
  int64_t same = 0, clear = 0, clear_same = 0;
  for (int64_t t = 0; t < T; ++t) {
    const float* x = ref.data() + t * V;
    g.min_cosine = std::min(g.min_cosine, cosine(x, b.data() + t * V, V));
    const bool eq = argmax(x, V) == argmax(b.data() + t * V, V);
    const double m = top2_margin(x, V);
    same += eq;
    if (!eq) g.max_flip_margin = std::max(g.max_flip_margin, m);
    if (m > tie_margin) {
      ++clear;
      clear_same += eq;
    }
  }
  g.argmax_frac = static_cast<double>(same) / static_cast<double>(T);
  g.argmax_frac_clear = clear > 0 ? static_cast<double>(clear_same) / static_cast<double>(clear) : 1.0;
  return g;
}

// Logits must be finite and vary (a model that outputs constants would make every check pass).
inline void expect_not_degenerate(const std::vector<float>& lg, int64_t V) {
  double mean = 0;
  for (float x : lg) {
    ASSERT_TRUE(std::isfinite(x));
    mean += x;
  }
  mean /= static_cast<double>(lg.size());
  double var = 0;
  for (float x : lg) var += (x - mean) * (x - mean);
  var /= static_cast<double>(lg.size());
  EXPECT_GT(var, 1e-4) << "logits are (nearly) constant";
  // Different positions give different rows.
  EXPECT_NE(std::memcmp(lg.data(), lg.data() + V, static_cast<size_t>(V) * sizeof(float)), 0);
}

}  // namespace moesh::test
