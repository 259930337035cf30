// make_model spec validation, metadata/tensor layout against llama.cpp's reference files, and
// the Q4_K_M type recipe. No file I/O except reading the reference manifest.
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <set>
#include <string>

#include "make_model/make_model_test_util.h"
#include "moesh/make_model/make_model.h"
#include "moesh/model/model.h"

namespace moesh {
namespace {

using test::kArchCases;
using test::kFileTypes;

std::string validate_message(const MakeModelSpec& s) {
  const Status st = s.validate();
  EXPECT_FALSE(st.is_ok());
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  return st.message();
}

TEST(MakeModelSpec, DefaultsAndPresetValidate) {
  for (const auto& c : kArchCases) {
    for (MakeFileType t : kFileTypes) {
      MakeModelSpec s = MakeModelSpec::defaults_for(c.arch);
      s.type = t;
      EXPECT_TRUE(s.validate().is_ok()) << c.ref_model << " " << make_file_type_name(t) << ": "
                                        << s.validate().to_string();
    }
  }
  const MakeModelSpec perf = MakeModelSpec::perf_30b_a3b();
  EXPECT_TRUE(perf.validate().is_ok()) << perf.validate().to_string();
  EXPECT_EQ(perf.n_embd, 2048);
  EXPECT_EQ(perf.n_expert, 128);
  EXPECT_EQ(perf.n_expert_used, 8);
  EXPECT_EQ(perf.n_ff_exp, 768);
  EXPECT_EQ(perf.n_layer, 4);
  EXPECT_EQ(perf.n_vocab, 16384);
  EXPECT_EQ(perf.type, MakeFileType::kQ4_K_M);
}

TEST(MakeModelSpec, RejectsBadShapesWithClearErrors) {
  const MakeModelSpec q = MakeModelSpec::defaults_for(MakeArch::kQwen3Moe);
  {
    MakeModelSpec s = q;
    s.n_expert_used = 9;
    EXPECT_NE(validate_message(s).find("n_expert_used 9 is larger than n_expert 8"), std::string::npos);
  }
  {
    MakeModelSpec s = q;
    s.n_head_kv = 3;
    EXPECT_NE(validate_message(s).find("n_head_kv 3 must divide n_head 8"), std::string::npos);
  }
  {
    MakeModelSpec s = q;
    s.head_dim = 63;
    EXPECT_NE(validate_message(s).find("head_dim 63"), std::string::npos);
  }
  {
    MakeModelSpec s = q;
    s.n_layer = 0;
    EXPECT_NE(validate_message(s).find("n_layer"), std::string::npos);
  }
  {
    MakeModelSpec s = q;
    s.rms_eps = 0.0f;
    EXPECT_NE(validate_message(s).find("rms_eps"), std::string::npos);
  }
  {
    // 200 is fine for f32 and f16 (block size 1) but not for the quantized types.
    MakeModelSpec s = q;
    s.n_embd = 200;
    EXPECT_TRUE(s.validate().is_ok()) << s.validate().to_string();
    s.type = MakeFileType::kF16;
    EXPECT_TRUE(s.validate().is_ok());
    s.type = MakeFileType::kQ8_0;
    EXPECT_NE(validate_message(s).find("n_embd 200 is not a multiple of 32"), std::string::npos);
    s.type = MakeFileType::kQ4_K_M;
    EXPECT_NE(validate_message(s).find("n_embd 200 is not a multiple of 32"), std::string::npos);
  }
  {
    // A row length other than n_embd: attn_output rows are n_head * head_dim = 8 * 6.
    MakeModelSpec s = q;
    s.head_dim = 6;
    s.type = MakeFileType::kQ8_0;
    EXPECT_NE(validate_message(s).find("'blk.0.attn_output.weight' has rows of 48"), std::string::npos);
  }
  {
    MakeModelSpec s = q;
    s.n_ff_exp = 100;
    s.type = MakeFileType::kQ4_K_M;
    EXPECT_NE(validate_message(s).find("ffn_down_exps.weight' has rows of 100"), std::string::npos);
  }
  const MakeModelSpec ds = MakeModelSpec::defaults_for(MakeArch::kDeepseek2);
  {
    MakeModelSpec s = ds;
    s.n_group = 3;
    EXPECT_NE(validate_message(s).find("n_group 3 must divide n_expert 16"), std::string::npos);
  }
  {
    MakeModelSpec s = ds;
    s.n_expert_used = 9;  // 2 kept groups of 4 experts = 8 reachable
    EXPECT_NE(validate_message(s).find("exceeds the 8 experts in the 2 kept groups"), std::string::npos);
  }
  {
    MakeModelSpec s = ds;
    s.qk_nope = 40;
    s.type = MakeFileType::kQ8_0;
    EXPECT_NE(validate_message(s).find("attn_k_b.weight' has rows of 40"), std::string::npos);
  }
  {
    MakeModelSpec s = ds;
    s.n_leading_dense = 4;
    EXPECT_NE(validate_message(s).find("n_leading_dense 4"), std::string::npos);
  }
  {
    MakeModelSpec s = MakeModelSpec::defaults_for(MakeArch::kLlama);
    s.n_ff = 512;
    EXPECT_NE(validate_message(s).find("n_ff 512 and n_ff_exp 256 must be equal"), std::string::npos);
  }
  EXPECT_FALSE(plan_model([&] {
                 MakeModelSpec s = q;
                 s.n_expert = 0;
                 return s;
               }())
                   .is_ok());
}

TEST(MakeModelSpec, NamesRoundTrip) {
  for (int i = 0; i < static_cast<int>(MakeArch::kRegistry); ++i) {
    MakeArch a;
    ASSERT_TRUE(make_arch_from_name(make_arch_name(static_cast<MakeArch>(i)), &a));
    EXPECT_EQ(static_cast<int>(a), i);
  }
  MakeFileType t;
  ASSERT_TRUE(make_file_type_from_name("Q4_K_M", &t));
  EXPECT_EQ(t, MakeFileType::kQ4_K_M);
  EXPECT_FALSE(make_file_type_from_name("q4_k", &t));
  EXPECT_EQ(make_file_type_ftype(MakeFileType::kF32), 0u);
  EXPECT_EQ(make_file_type_ftype(MakeFileType::kF16), 1u);
  EXPECT_EQ(make_file_type_ftype(MakeFileType::kQ8_0), 7u);
  EXPECT_EQ(make_file_type_ftype(MakeFileType::kQ4_K_M), 15u);
}

// Every arch x type: same metadata keys in the same order, same tensor names, ne and order, and
// (f32/q8_0/q4_k_m) the same tensor types as the files llama.cpp's tools wrote.
TEST(MakeModelPlan, MatchesReferenceManifest) {
  const auto& manifest = test::reference_manifest();
  if (!manifest) {
    GTEST_SKIP() << "SKIPPED LOUDLY: no reference manifest at " << test::reference_dir()
                 << "/manifest.json; tensor/metadata layout is not checked against llama.cpp";
  }
  for (const auto& c : kArchCases) {
    for (MakeFileType type : kFileTypes) {
      SCOPED_TRACE(std::string(c.ref_model) + " " + make_file_type_name(type));
      MakeModelSpec spec = MakeModelSpec::defaults_for(c.arch);
      spec.type = type;
      spec.vocab = MakeVocab::kNone;  // the reference files have no vocabulary
      auto plan = plan_model(spec);
      ASSERT_TRUE(plan.is_ok()) << plan.status().to_string();
      const auto& ref = (*manifest)["models"][c.ref_model]["files"][test::manifest_file_key(type)];

      // Metadata keys and order. The F32 file's general.file_type is 0; ours says f16 for f16.
      std::vector<std::string> ref_keys, our_keys;
      for (const auto& [k, v] : ref["metadata"].items()) ref_keys.push_back(k);
      for (const auto& [k, v] : plan->kvs) our_keys.push_back(k);
      EXPECT_EQ(our_keys, ref_keys);

      const auto& ref_tensors = ref["tensors"];
      ASSERT_EQ(plan->tensors.size(), ref_tensors.size());
      for (size_t i = 0; i < plan->tensors.size(); ++i) {
        const PlannedTensor& t = plan->tensors[i];
        const auto& r = ref_tensors[i];
        EXPECT_EQ(t.name, r["name"].get<std::string>()) << "tensor #" << i;
        std::vector<int64_t> ne(t.ne, t.ne + t.n_dims);
        EXPECT_EQ(ne, r["ne"].get<std::vector<int64_t>>()) << t.name;
        std::string want = r["type"].get<std::string>();
        // f16 has no reference file: the converter writes matrices F16, 1-D tensors and routers F32.
        if (type == MakeFileType::kF16 && t.n_dims >= 2 && t.name.find("ffn_gate_inp") == std::string::npos) {
          want = "F16";
        }
        EXPECT_EQ(std::string(type_name(t.type)), want) << t.name;
      }
    }
  }
}

// The registry's architectures (make-model --arch gpt-oss | glm4moe | llama4 | minimax-m2 |
// qwen3next | qwen35moe):
// their keys and tensors (names, ne, types for Q8_0 and Q4_K_M) are those of llama.cpp's own
// files in archs/manifest.json (glm4moe's NextN block blk.3 included), and the written model
// loads and decodes. Left out of the comparison: llama4's rope_freqs (frequency divisors, not
// weights to draw).
TEST(MakeModelPlan, RegistryArchsMatchTheArchsManifest) {
  const std::string path = test::reference_dir() + "/archs/manifest.json";
  std::ifstream in(path);
  if (!in) GTEST_SKIP() << "SKIPPED LOUDLY: no " << path << "; registry make-model layouts not checked";
  const auto manifest = nlohmann::ordered_json::parse(in, nullptr, false);
  ASSERT_FALSE(manifest.is_discarded());
  // archs2/ (step35) has its own manifest; without it those architectures are not compared.
  std::ifstream in2(test::reference_dir() + "/archs2/manifest.json");
  const auto manifest2 = in2 ? nlohmann::ordered_json::parse(in2, nullptr, false)
                             : nlohmann::ordered_json(nlohmann::ordered_json::value_t::discarded);
  const std::map<std::string, std::string> ref_of = {{"gpt-oss", "gptoss-a"},       {"glm4moe", "glm4moe-a"},
                                                     {"llama4", "llama4-a"},        {"minimax-m2", "minimaxm2-a"},
                                                     {"qwen3next", "qwen3next-a"},  {"qwen35moe", "qwen35moe-a"},
                                                     {"step35", "step35-a"},        {"glm-dsa", "glmdsa-a"},
                                                     {"minimax-m3", "minimaxm3-a"}, {"kimi-k3", "kimik3-a"}};
  const std::set<std::string> in_archs2 = {"step35", "glm-dsa", "minimax-m3", "kimi-k3"};
  ASSERT_EQ(make_arch_names().size(), 3 + ref_of.size());
  for (const auto& [arch, ref_model] : ref_of) {
    const bool second = in_archs2.count(arch) != 0;
    if (second && manifest2.is_discarded()) continue;
    for (MakeFileType type : {MakeFileType::kQ8_0, MakeFileType::kQ4_K_M}) {
      const char* key = type == MakeFileType::kQ8_0 ? "Q8_0" : "Q4_K_M";
      const auto& files = (second ? manifest2 : manifest)["models"][ref_model]["files"];
      if (!files.contains(key)) continue;  // gpt-oss: MXFP4_MOE and Q8_0
      SCOPED_TRACE(arch + " " + key);
      MakeModelSpec spec;
      ASSERT_TRUE(MakeModelSpec::defaults_for_name(arch, &spec));
      EXPECT_EQ(spec.arch, MakeArch::kRegistry);
      spec.type = type;
      spec.vocab = MakeVocab::kNone;
      auto plan = plan_model(spec);
      ASSERT_TRUE(plan.is_ok()) << plan.status().to_string();
      const auto& ref = files[key];
      auto skipped = [&](const std::string& name) { return name == "rope_freqs.weight"; };
      std::map<std::string, std::string> ref_kv, our_kv;
      for (const auto& [k, v] : ref["metadata"].items()) {
        if (!k.starts_with("general.name") && !k.starts_with("general.description") && !skipped(k))
          ref_kv[k] = v.dump();
      }
      for (const auto& [k, v] : plan->kvs) {
        if (!k.starts_with("general.name") && !k.starts_with("general.description") && !skipped(k)) our_kv[k] = "";
      }
      std::set<std::string> ref_keys, our_keys;
      for (const auto& [k, v] : ref_kv) ref_keys.insert(k);
      for (const auto& [k, v] : our_kv) our_keys.insert(k);
      EXPECT_EQ(our_keys, ref_keys) << "metadata keys";
      std::map<std::string, std::pair<std::vector<int64_t>, std::string>> ref_t, our_t;
      for (const auto& t : ref["tensors"]) {
        const std::string n = t["name"].get<std::string>();
        if (!skipped(n)) ref_t[n] = {t["ne"].get<std::vector<int64_t>>(), t["type"].get<std::string>()};
      }
      for (const PlannedTensor& t : plan->tensors)
        our_t[t.name] = {std::vector<int64_t>(t.ne, t.ne + t.n_dims), type_name(t.type)};
      EXPECT_EQ(our_t.size(), ref_t.size());
      for (const auto& [n, v] : ref_t) {
        auto it = our_t.find(n);
        if (it == our_t.end()) {
          ADD_FAILURE() << "make-model does not write " << n;
          continue;
        }
        EXPECT_EQ(it->second.first, v.first) << n << " ne";
        EXPECT_EQ(it->second.second, v.second) << n << " type";
      }
    }
  }
}

TEST(MakeModelPlan, Q4KMRecipeRulesAndFallbacks) {
  const int64_t ne_256[4] = {256, 256, 1, 1};
  const int64_t ne_64[4] = {64, 256, 4, 1};
  const int64_t ne_288[4] = {288, 512, 1, 1};
  const int64_t ne_96[4] = {96, 256, 8, 1};
  const int64_t ne_160[4] = {160, 256, 1, 1};
  const int64_t ne_48[4] = {48, 256, 1, 1};
  const auto q4 = MakeFileType::kQ4_K_M;
  // Unquantized: 1-D, norms, routers, biases.
  EXPECT_EQ(make_model_tensor_type(q4, "blk.0.attn_norm.weight", 1, ne_256, 4, 8, 0, 4), GgmlType::F32);
  EXPECT_EQ(make_model_tensor_type(q4, "blk.0.ffn_gate_inp.weight", 2, ne_256, 4, 8, 0, 4), GgmlType::F32);
  EXPECT_EQ(make_model_tensor_type(q4, "blk.1.exp_probs_b.bias", 1, ne_256, 4, 8, 0, 4), GgmlType::F32);
  // n_expert == 8 bumps; other expert counts do not bump.
  EXPECT_EQ(make_model_tensor_type(q4, "blk.0.attn_k.weight", 2, ne_256, 4, 8, 0, 4), GgmlType::Q8_0);
  EXPECT_EQ(make_model_tensor_type(q4, "blk.0.attn_k.weight", 2, ne_256, 4, 16, 0, 4), GgmlType::Q4_K);
  EXPECT_EQ(make_model_tensor_type(q4, "blk.0.attn_output.weight", 2, ne_256, 4, 8, 0, 4), GgmlType::Q5_K);
  EXPECT_EQ(make_model_tensor_type(q4, "blk.0.attn_output.weight", 2, ne_256, 4, 128, 0, 4), GgmlType::Q4_K);
  EXPECT_EQ(make_model_tensor_type(q4, "blk.0.attn_v.weight", 2, ne_256, 4, 8, 0, 4), GgmlType::Q8_0);
  // more_bits over 4 layers: layers 2 and 3.
  for (int il = 0; il < 4; ++il) {
    const GgmlType want = il >= 2 ? GgmlType::Q6_K : GgmlType::Q4_K;
    const std::string v = "blk." + std::to_string(il) + ".attn_v.weight";
    const std::string d = "blk." + std::to_string(il) + ".ffn_down_exps.weight";
    EXPECT_EQ(make_model_tensor_type(q4, v, 2, ne_256, 4, 128, il, 4), want) << v;
    EXPECT_EQ(make_model_tensor_type(q4, d, 3, ne_256, 4, 128, 0, 4), want) << d;
  }
  // more_bits over 16 layers: i < 2, i >= 14, (i - 2) % 3 == 2.
  const std::set<int> more16 = {0, 1, 4, 7, 10, 13, 14, 15};
  for (int il = 0; il < 16; ++il) {
    const std::string d = "blk." + std::to_string(il) + ".ffn_down_shexp.weight";
    EXPECT_EQ(make_model_tensor_type(q4, d, 2, ne_256, 16, 64, 0, 0),
              more16.count(il) ? GgmlType::Q6_K : GgmlType::Q4_K)
        << d;
  }
  EXPECT_EQ(make_model_tensor_type(q4, "output.weight", 2, ne_256, 4, 8, 0, 4), GgmlType::Q6_K);
  EXPECT_EQ(make_model_tensor_type(q4, "token_embd.weight", 2, ne_256, 4, 8, 0, 4), GgmlType::Q4_K);
  // Fallbacks for rows that are not whole 256-blocks.
  EXPECT_EQ(make_model_tensor_type(q4, "blk.0.attn_k_b.weight", 3, ne_64, 4, 16, 0, 0), GgmlType::Q5_0);
  EXPECT_EQ(make_model_tensor_type(q4, "output.weight", 2, ne_288, 4, 16, 0, 0), GgmlType::Q8_0);
  EXPECT_EQ(make_model_tensor_type(q4, "blk.3.ffn_down_exps.weight", 3, ne_96, 4, 8, 0, 0), GgmlType::Q8_0);
  EXPECT_EQ(make_model_tensor_type(q4, "blk.0.attn_output.weight", 2, ne_160, 4, 8, 0, 4), GgmlType::Q5_1);
  EXPECT_EQ(make_model_tensor_type(q4, "blk.0.attn_q.weight", 2, ne_48, 4, 8, 0, 4), GgmlType::F16);
  // Other file types.
  EXPECT_EQ(make_model_tensor_type(MakeFileType::kQ8_0, "output.weight", 2, ne_256, 4, 8, 0, 4), GgmlType::Q8_0);
  EXPECT_EQ(make_model_tensor_type(MakeFileType::kF16, "blk.0.ffn_up_exps.weight", 3, ne_256, 4, 8, 0, 4),
            GgmlType::F16);
  EXPECT_EQ(make_model_tensor_type(MakeFileType::kF16, "blk.0.ffn_gate_inp.weight", 2, ne_256, 4, 8, 0, 4),
            GgmlType::F32);
}

// The perf preset must have the tensor types llama-quantize gave the perf model
// (../shared/perf/README.md §2) and, with our header, the same file size up to the header.
TEST(MakeModelPlan, PerfPresetMatchesPerfReadme) {
  auto plan = plan_model(MakeModelSpec::perf_30b_a3b());
  ASSERT_TRUE(plan.is_ok()) << plan.status().to_string();
  EXPECT_EQ(plan->tensors.size(), 51u);
  int n_checked = 0;
  for (const auto& t : plan->tensors) {
    std::string want = "Q4_K";
    if (t.n_dims == 1 || t.name.find("ffn_gate_inp") != std::string::npos)
      want = "F32";
    else if (t.name == "output.weight")
      want = "Q6_K";
    else if ((t.name.find("attn_v.weight") != std::string::npos || t.name.find("ffn_down_exps") != std::string::npos) &&
             t.layer >= 2)
      want = "Q6_K";
    EXPECT_EQ(std::string(type_name(t.type)), want) << t.name;
    ++n_checked;
  }
  EXPECT_EQ(n_checked, 51);
  // llama-quantize's file is 1,556,447,232 bytes; its header is a few KB.
  const uint64_t ref_file = 1556447232ull;
  ASSERT_LT(plan->data_bytes, ref_file);
  EXPECT_LT(ref_file - plan->data_bytes, 16384u) << "data bytes " << plan->data_bytes;
  // Per-layer experts: 3 tensors x 128 x 768 x 2048 values; layers 0-1 all Q4_K.
  const uint64_t q4k_slab = 768ull * 2048 / 256 * 144;
  EXPECT_EQ(plan->expert_bytes(0), 3 * 128 * q4k_slab);
  EXPECT_GT(plan->expert_bytes(3), plan->expert_bytes(0));  // Q6_K down projections
}

}  // namespace
}  // namespace moesh
