// `moesh inspect` end to end: runs the built binary on reference files and on a corrupt file.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>

#include "gguf/gguf_test_util.h"
#include "moesh/gguf/gguf.h"
#include "util/run_moesh.h"

namespace moesh::gguf {
namespace {

using test::run_moesh;
using test::RunResult;

// Whitespace-separated fields of every output line that contains `needle`.
std::vector<std::vector<std::string>> lines_with(const std::string& out, const std::string& needle) {
  std::vector<std::vector<std::string>> rows;
  std::istringstream in(out);
  std::string line;
  while (std::getline(in, line)) {
    if (line.find(needle) == std::string::npos) continue;
    std::istringstream ls(line);
    std::vector<std::string> fields;
    for (std::string w; ls >> w;) fields.push_back(w);
    rows.push_back(std::move(fields));
  }
  return rows;
}

std::string reference(const std::string& name) {
  return (std::filesystem::path(MOESH_REFERENCE_DIR) / name).string();
}

#define REQUIRE_REFERENCE(name)                                                           \
  if (!std::filesystem::exists(reference(name))) {                                        \
    GTEST_SKIP() << "SKIPPED: ../shared/reference not found (" << reference(name) << ")"; \
  }

TEST(InspectCli, TextOutputOfQwen3MoeQ8) {
  REQUIRE_REFERENCE("qwen3moe-s.Q8_0.gguf");
  const RunResult r = run_moesh("inspect '" + reference("qwen3moe-s.Q8_0.gguf") + "'");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("  version      3\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("  file size    4342304 (4.14 MiB)\n"), std::string::npos);
  EXPECT_NE(r.out.find("  tensors      27\n"), std::string::npos);
  EXPECT_NE(r.out.find("qwen3moe.expert_count"), std::string::npos);
  EXPECT_NE(r.out.find("\"qwen3moe\""), std::string::npos);
  // ffn_gate_exps is Q8_0 [256, 256, 8]: row = 256/32*34 = 272 bytes, slab = 272*256 = 69632,
  // all 8 experts = 557056 bytes; three such tensors per layer.
  using Row = std::vector<std::string>;
  const auto gate = lines_with(r.out, "ffn_gate_exps.weight  Q8_0");
  // Two tensor-table rows; one expert-table row, since layers 0 and 1 agree (merged as "0-1").
  ASSERT_EQ(gate.size(), 3u) << r.out;
  EXPECT_EQ(gate[2], (Row{"0-1", "ffn_gate_exps.weight", "Q8_0", "8", "69632", "557056"}));
  const auto totals = lines_with(r.out, "(layer total)");
  ASSERT_EQ(totals.size(), 1u);
  EXPECT_EQ(totals[0], (Row{"0-1", "(layer", "total)", "208896", "1671168"}));
  // 2 layers x 3 tensors x 557056; the rest (attention, norms, routers, embeddings) is backbone.
  const auto experts = lines_with(r.out, "expert bytes");
  ASSERT_EQ(experts.size(), 1u);
  EXPECT_EQ(experts[0][2], "3342336");
  const auto backbone = lines_with(r.out, "backbone bytes");
  ASSERT_EQ(backbone.size(), 1u);
  EXPECT_EQ(backbone[0][2], "997376");
}

TEST(InspectCli, JsonOutputIsConsistent) {
  REQUIRE_REFERENCE("deepseek2-s.Q4_K_M.gguf");
  const RunResult r = run_moesh("inspect --json '" + reference("deepseek2-s.Q4_K_M.gguf") + "'");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["version"], 3);
  EXPECT_EQ(j["tensor_count"], 52);
  EXPECT_EQ(j["tensors"].size(), 52u);
  uint64_t sum = 0;
  for (const auto& t : j["tensors"]) sum += t["n_bytes"].get<uint64_t>();
  EXPECT_EQ(j["experts"]["expert_bytes"].get<uint64_t>() + j["experts"]["backbone_bytes"].get<uint64_t>(), sum);
  // Layer 0 is dense; layers 1 and 2 are MoE with 16 experts in 3 stacked tensors each.
  ASSERT_EQ(j["experts"]["layers"].size(), 2u);
  EXPECT_EQ(j["experts"]["layers"][0]["layer"], 1);
  for (const auto& l : j["experts"]["layers"]) {
    ASSERT_EQ(l["tensors"].size(), 3u);
    for (const auto& t : l["tensors"]) {
      EXPECT_EQ(t["n_expert"], 16);
      EXPECT_EQ(t["slab_bytes"].get<uint64_t>() * 16, t["total_bytes"].get<uint64_t>());
    }
  }
  bool found = false;
  for (const auto& kv : j["metadata"]) {
    if (kv["key"] == "deepseek2.expert_weights_scale") {
      EXPECT_EQ(kv["type"], "FLOAT32");
      EXPECT_EQ(kv["value"].get<double>(), 2.5);
      found = true;
    }
  }
  EXPECT_TRUE(found);
}

TEST(InspectCli, VocabArraysAbbreviatedUnlessAllKv) {
  REQUIRE_REFERENCE("vocab/ggml-vocab-llama-spm.gguf");
  const std::string path = reference("vocab/ggml-vocab-llama-spm.gguf");
  const RunResult brief = run_moesh("inspect '" + path + "'");
  ASSERT_EQ(brief.exit_code, 0) << brief.err;
  EXPECT_NE(brief.out.find("[32000 x STRING] [\"<unk>\", \"<s>\", \"</s>\""), std::string::npos) << brief.out;
  EXPECT_NE(brief.out.find(", ... ]"), std::string::npos);
  EXPECT_NE(brief.out.find("tensors: none"), std::string::npos);
  const RunResult full = run_moesh("inspect --all-kv '" + path + "'");
  ASSERT_EQ(full.exit_code, 0);
  EXPECT_GT(full.out.size(), brief.out.size() + 100000);
  // The last token of the vocabulary is only printed in full mode.
  const RunResult j = run_moesh("inspect --json --all-kv '" + path + "'");
  const auto js = nlohmann::json::parse(j.out);
  for (const auto& kv : js["metadata"]) {
    if (kv["key"] == "tokenizer.ggml.tokens") {
      EXPECT_EQ(kv["value"]["count"], 32000);
      EXPECT_EQ(kv["value"]["items"].size(), 32000u);
      EXPECT_EQ(kv["value"]["truncated"], false);
    }
  }
}

TEST(InspectCli, MalformedFileExitsOneWithMessage) {
  Writer w;
  w.set("general.architecture", Value::str("x"));
  std::vector<uint8_t> d = testing::random_bytes(64, 5);
  ASSERT_TRUE(w.add_tensor("t.weight", GgmlType::F32, {16}, d.data()).is_ok());
  auto bytes = w.write_bytes();
  ASSERT_TRUE(bytes.is_ok());
  bytes->resize(bytes->size() - 10);  // cut into the tensor data
  const auto path =
      std::filesystem::temp_directory_path() / ("moesh_inspect_bad_" + std::to_string(::getpid()) + ".gguf");
  {
    FILE* f = std::fopen(path.c_str(), "wb");
    ASSERT_NE(f, nullptr);
    std::fwrite(bytes->data(), 1, bytes->size(), f);
    std::fclose(f);
  }
  const RunResult r = run_moesh("inspect '" + path.string() + "'");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("corrupt"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("tensor 0 ('t.weight'): data ["), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("past end of file"), std::string::npos) << r.err;
  std::filesystem::remove(path);

  const RunResult missing = run_moesh("inspect /nonexistent/x.gguf");
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_NE(missing.err.find("not found"), std::string::npos) << missing.err;
}

}  // namespace
}  // namespace moesh::gguf
