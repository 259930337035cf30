// Dequantizing tensors that llama.cpp's llama-quantize wrote (the shared reference models):
// layouts are right if the values have the spread the generator drew them with, and if a
// tensor's Q4_K/Q5_K/Q6_K/Q5_0 version agrees with its Q8_0 version of the same F32 weights.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "moesh/gguf/gguf.h"
#include "moesh/tensor/quant.h"
#include "tensor/quant_test_util.h"

namespace moesh::quant {
namespace {

const std::string k_ref_dir = MOESH_REFERENCE_DIR;

// The generator's std per tensor (reference README §3); 0 = not a plain N(0, std) matrix.
double expected_std(const std::string& name) {
  auto has = [&](const char* s) { return name.find(s) != std::string::npos; };
  if (has("norm") || has("exp_probs_b")) return 0.0;
  if (name == "token_embd.weight") return 0.5;
  if (name == "output.weight") return 0.08;
  if (has("ffn_gate_inp")) return 0.15;
  if (has("_exps") || has("_shexp")) return 0.05;
  if (has("attn_") || has("ffn_")) return 0.04;
  return 0.0;
}

// The first rows of a tensor (at most ~4096 values), dequantized.
std::vector<float> first_rows(const gguf::File& f, const gguf::TensorInfo& info) {
  const TensorView v = f.view(info);
  const int64_t k = v.ne[0];
  const int64_t rows = std::min<int64_t>(v.n_rows(), std::max<int64_t>(1, 4096 / k));
  std::vector<float> out(static_cast<size_t>(rows * k));
  for (int64_t r = 0; r < rows; ++r) {
    // Rows are contiguous, so row r of the flattened [ne1*ne2*ne3] rows is at r*nb[1].
    EXPECT_TRUE(dequantize_row_ref(v.type, v.data + r * v.nb[1], out.data() + r * k, k)) << info.name;
  }
  return out;
}

std::unique_ptr<gguf::File> open_or_skip(const std::string& name) {
  const std::string path = k_ref_dir + "/" + name;
  if (!std::filesystem::exists(path)) return nullptr;
  auto f = gguf::File::open(path);
  EXPECT_TRUE(f.is_ok()) << f.status().to_string();
  if (!f.is_ok()) return nullptr;
  return std::move(f.value());
}

TEST(QuantReference, LlamaCppTensorsHaveTheDrawnSpread) {
  if (!std::filesystem::exists(k_ref_dir)) {
    GTEST_SKIP() << "reference dir " << k_ref_dir << " absent: llama.cpp layout check NOT run";
  }
  std::map<GgmlType, int> seen;
  for (const char* file :
       {"qwen3moe-s.Q4_K_M.gguf", "deepseek2-s.Q4_K_M.gguf", "mixtral-s.Q4_K_M.gguf", "qwen3moe-s.Q8_0.gguf"}) {
    auto f = open_or_skip(file);
    ASSERT_NE(f, nullptr) << file;
    for (const auto& info : f->tensors()) {
      const double want = expected_std(info.name);
      if (want == 0.0 || info.n_dims < 2) continue;
      ASSERT_TRUE(type_is_supported(info.type)) << info.name << " " << type_name(info.type);
      const auto y = first_rows(*f, info);
      double mean = 0;
      for (float v : y) {
        ASSERT_TRUE(std::isfinite(v)) << file << " " << info.name;
        mean += v;
      }
      mean /= static_cast<double>(y.size());
      const double sd = stddev(y);
      // >= 1024 samples: the std estimate is within ~5%; quantization adds a few % at most.
      EXPECT_NEAR(sd / want, 1.0, 0.12) << file << " " << info.name << " " << type_name(info.type);
      EXPECT_LT(std::fabs(mean), 0.15 * want) << file << " " << info.name;
      ++seen[info.type];
    }
  }
  for (GgmlType t : {GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::Q8_0, GgmlType::Q5_0, GgmlType::F32}) {
    EXPECT_GT(seen[t], 0) << "no " << type_name(t) << " tensor checked";
  }
}

// Same F32 weights, two quantizations by llama.cpp: the Q4_K_M file's tensor must agree with the
// Q8_0 file's (itself within ~0.4%) to the accuracy of its type. A layout error gives ~1.4.
// Also quantize the Q8_0 values with our own quantizer of that type: our error should be in the
// same range as llama.cpp's.
TEST(QuantReference, KQuantsAgreeWithQ8_0OfTheSameWeights) {
  if (!std::filesystem::exists(k_ref_dir)) {
    GTEST_SKIP() << "reference dir " << k_ref_dir << " absent: llama.cpp layout check NOT run";
  }
  const std::map<GgmlType, double> bound = {{GgmlType::Q4_K, 0.12},
                                            {GgmlType::Q5_K, 0.06},
                                            {GgmlType::Q6_K, 0.03},
                                            {GgmlType::Q8_0, 0.012},
                                            {GgmlType::Q5_0, 0.06}};
  int n_checked = 0;
  for (const char* model : {"qwen3moe-s", "deepseek2-s", "mixtral-s"}) {
    auto fk = open_or_skip(std::string(model) + ".Q4_K_M.gguf");
    auto f8 = open_or_skip(std::string(model) + ".Q8_0.gguf");
    ASSERT_TRUE(fk && f8) << model;
    for (const auto& info : fk->tensors()) {
      if (!bound.count(info.type)) continue;
      const gguf::TensorInfo* i8 = f8->find_tensor(info.name);
      ASSERT_NE(i8, nullptr) << info.name;
      ASSERT_EQ(i8->type, GgmlType::Q8_0) << info.name;
      const auto yk = first_rows(*fk, info);
      const auto y8 = first_rows(*f8, *i8);
      ASSERT_EQ(yk.size(), y8.size());
      const double e_llama = rel_rmse(y8, yk);
      EXPECT_LE(e_llama, bound.at(info.type)) << model << " " << info.name << " " << type_name(info.type);
      // Our quantizer on the same values (rows are a whole number of blocks).
      const double e_ours = rel_rmse(y8, dequantize(info.type, quantize(info.type, y8), y8.size()));
      std::printf("  %-12s %-28s %-5s llama.cpp %.4f  ours %.4f\n", model, info.name.c_str(), type_name(info.type),
                  e_llama, e_ours);
      if (info.type != GgmlType::Q8_0) {
        EXPECT_LE(e_ours, 1.25 * e_llama + 0.005) << info.name;
      }
      ++n_checked;
    }
  }
  EXPECT_GT(n_checked, 20);
}

}  // namespace
}  // namespace moesh::quant
