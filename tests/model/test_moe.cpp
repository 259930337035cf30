// MoE routing, routing plans and the LocalExecutor on generated data (fixed seeds):
//  * group-limited sigmoid routing obeys its definition (kept groups, top-k inside, unbiased
//    weights normalised and scaled) and the groups really change choices;
//  * ties go to the lower expert id; the weight-sum floor applies;
//  * make_plan's grouping invariants and its rejection of bad ids;
//  * LocalExecutor == expert_ffn per token summed in rank order, bit for bit, for any thread
//    count and whether tokens come in one batch or one at a time.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <set>

#include "moesh/gguf/gguf.h"
#include "moesh/model/make_arch.h"
#include "moesh/model/model.h"
#include "moesh/moe/executor.h"
#include "moesh/moe/routing.h"
#include "moesh/tensor/quant.h"
#include "moesh/text/chat.h"

namespace moesh {
namespace {

std::vector<float> randn(size_t n, float sd, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, sd);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

TEST(Routing, GroupLimitedSigmoidFollowsTheDefinition) {
  RouterConfig rc;
  rc.gating = GatingFunc::kSigmoid;
  rc.n_expert = 16;
  rc.k = 4;
  rc.n_group = 4;
  rc.n_group_used = 2;
  rc.norm_w = true;
  rc.w_scale = 2.5f;
  const std::vector<float> bias = randn(16, 0.3f, 7);
  rc.sel_bias = bias.data();
  ASSERT_TRUE(rc.validate().is_ok());
  const int T = 200;
  const std::vector<float> logits = randn(T * 16, 1.5f, 11);
  std::vector<int32_t> ids(T * 4);
  std::vector<float> w(T * 4), scratch;
  route(rc, logits.data(), T, ids.data(), w.data(), &scratch);

  int differs_from_ungrouped = 0;
  for (int t = 0; t < T; ++t) {
    float p[16], sel[16];
    for (int e = 0; e < 16; ++e) {
      p[e] = 1.0f / (1.0f + std::exp(-logits[t * 16 + e]));
      sel[e] = p[e] + bias[e];
    }
    float gs[4];
    for (int g = 0; g < 4; ++g) {
      std::vector<float> s(sel + 4 * g, sel + 4 * g + 4);
      std::sort(s.begin(), s.end(), std::greater<>());
      gs[g] = s[0] + s[1];
    }
    std::vector<int> order = {0, 1, 2, 3};
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return gs[a] > gs[b]; });
    const std::set<int> kept = {order[0], order[1]};
    std::set<int32_t> chosen(ids.begin() + t * 4, ids.begin() + t * 4 + 4);
    ASSERT_EQ(chosen.size(), 4u);
    float min_chosen = INFINITY, max_other = -INFINITY;
    for (int e = 0; e < 16; ++e) {
      if (!kept.count(e / 4)) {
        EXPECT_FALSE(chosen.count(e)) << "token " << t << " expert " << e << " in a dropped group";
        continue;
      }
      if (chosen.count(e))
        min_chosen = std::min(min_chosen, sel[e]);
      else
        max_other = std::max(max_other, sel[e]);
    }
    EXPECT_GE(min_chosen, max_other);
    // Rank order: descending selection score.
    for (int j = 0; j + 1 < 4; ++j) EXPECT_GE(sel[ids[t * 4 + j]], sel[ids[t * 4 + j + 1]]);
    // Weights: unbiased probs, normalised, times 2.5.
    double sum = 0;
    for (int j = 0; j < 4; ++j) sum += p[ids[t * 4 + j]];
    for (int j = 0; j < 4; ++j) {
      EXPECT_NEAR(w[t * 4 + j], p[ids[t * 4 + j]] / sum * 2.5, 1e-5);
    }
    // Would plain top-4 have chosen differently?
    std::vector<int> all(16);
    for (int e = 0; e < 16; ++e) all[e] = e;
    std::partial_sort(all.begin(), all.begin() + 4, all.end(), [&](int a, int b) { return sel[a] > sel[b]; });
    if (std::set<int32_t>(all.begin(), all.begin() + 4) != chosen) ++differs_from_ungrouped;
  }
  EXPECT_GT(differs_from_ungrouped, 10) << "test data never exercises the group limit";
}

TEST(Routing, TiesGoToLowerIdsAndSoftmaxRenormalises) {
  RouterConfig rc;
  rc.n_expert = 8;
  rc.k = 3;
  rc.norm_w = true;
  std::vector<float> logits(8, 0.25f), w(3), scratch;
  std::vector<int32_t> ids(3);
  route(rc, logits.data(), 1, ids.data(), w.data(), &scratch);
  EXPECT_EQ(ids, (std::vector<int32_t>{0, 1, 2}));
  for (float x : w) EXPECT_NEAR(x, 1.0f / 3.0f, 1e-6);
  // Softmax + renormalisation == softmax over the k best logits.
  logits = {0.1f, 2.0f, -1.0f, 1.5f, 0.7f, 3.0f, -0.3f, 0.0f};
  route(rc, logits.data(), 1, ids.data(), w.data(), &scratch);
  EXPECT_EQ(ids, (std::vector<int32_t>{5, 1, 3}));
  const double z = std::exp(3.0) + std::exp(2.0) + std::exp(1.5);
  EXPECT_NEAR(w[0], std::exp(3.0) / z, 1e-6);
  EXPECT_NEAR(w[2], std::exp(1.5) / z, 1e-6);
}

TEST(Routing, WeightSumFloor) {
  RouterConfig rc;
  rc.gating = GatingFunc::kSigmoid;
  rc.n_expert = 4;
  rc.k = 2;
  rc.norm_w = true;
  std::vector<float> logits = {-30.0f, -31.0f, -32.0f, -33.0f}, w(2), scratch;
  std::vector<int32_t> ids(2);
  route(rc, logits.data(), 1, ids.data(), w.data(), &scratch);
  EXPECT_EQ(ids, (std::vector<int32_t>{0, 1}));
  const float p0 = 1.0f / (1.0f + std::exp(30.0f));
  EXPECT_FLOAT_EQ(w[0], p0 / kMoeWeightSumFloor);  // the sum (~1e-13) is below the floor
  EXPECT_LT(w[0] + w[1], 1e-6f);
}

TEST(Routing, ConfigValidation) {
  RouterConfig rc;
  rc.n_expert = 16;
  rc.k = 4;
  rc.n_group = 3;  // 16 % 3 != 0
  rc.n_group_used = 1;
  EXPECT_FALSE(rc.validate().is_ok());
  rc.n_group = 4;
  rc.n_group_used = 1;  // 4 experts kept, k = 4: fine
  EXPECT_TRUE(rc.validate().is_ok());
  rc.k = 5;  // more than the kept experts
  EXPECT_FALSE(rc.validate().is_ok());
}

TEST(Plan, GroupsSlotsByExpert) {
  const std::vector<int32_t> ids = {3, 1, 1, 0, 3, 2};  // 3 tokens, k = 2
  const std::vector<float> w = {0.6f, 0.4f, 0.7f, 0.3f, 0.5f, 0.5f};
  RoutingPlan plan;
  ASSERT_TRUE(make_plan(4, ids.data(), w.data(), 3, 2, 8, &plan).is_ok());
  EXPECT_EQ(plan.experts, (std::vector<int32_t>{0, 1, 2, 3}));
  EXPECT_EQ(plan.offsets, (std::vector<int32_t>{0, 1, 3, 4, 6}));
  EXPECT_EQ(plan.slots, (std::vector<int32_t>{3, 1, 2, 5, 0, 4}));
  for (size_t a = 0; a < plan.experts.size(); ++a) {
    for (int32_t p = plan.offsets[a]; p < plan.offsets[a + 1]; ++p) {
      EXPECT_EQ(ids[plan.slots[p]], plan.experts[a]);
    }
  }
  const std::vector<int32_t> dup = {1, 1};
  EXPECT_FALSE(make_plan(0, dup.data(), w.data(), 1, 2, 8, &plan).is_ok());
  const std::vector<int32_t> bad = {1, 9};
  EXPECT_FALSE(make_plan(0, bad.data(), w.data(), 1, 2, 8, &plan).is_ok());
}

// Stacked Q8_0 expert tensors of random weights.
struct Experts {
  std::vector<uint8_t> gate_b, up_b, down_b;
  ExpertWeights w;
  Experts(int64_t d, int64_t f, int64_t n_exp, GgmlType down_type, uint64_t seed) {
    auto make = [&](std::vector<uint8_t>& buf, TensorView& v, const char* name, GgmlType t, int64_t k, int64_t m,
                    uint64_t s) {
      const std::vector<float> x = randn(static_cast<size_t>(k * m * n_exp), 0.05f, s);
      const size_t rb = type_row_bytes(t, k);
      buf.resize(rb * m * n_exp);
      for (int64_t r = 0; r < m * n_exp; ++r) {
        ASSERT_TRUE(quant::quantize_row_ref(t, x.data() + r * k, buf.data() + r * rb, k));
      }
      v.name = name;
      v.type = t;
      v.n_dims = 3;
      v.ne[0] = k;
      v.ne[1] = m;
      v.ne[2] = n_exp;
      v.set_contiguous_strides();
      v.data = buf.data();
    };
    make(gate_b, w.gate, "gate", GgmlType::Q8_0, d, f, seed);
    make(up_b, w.up, "up", GgmlType::Q8_0, d, f, seed + 1);
    make(down_b, w.down, "down", down_type, f, d, seed + 2);
  }
};

TEST(LocalExecutor, EqualsExpertFfnSummedInRankOrder) {
  const int64_t d = 256, f = 512, n_exp = 8, T = 7;
  const int k = 3;
  Experts ex(d, f, n_exp, GgmlType::Q4_K, 99);
  ASSERT_TRUE(ex.w.validate().is_ok());
  const std::vector<float> x = randn(T * d, 1.0f, 5);
  // Routing: deterministic but varied ids.
  std::vector<int32_t> ids(T * k);
  std::vector<float> wt(T * k);
  std::mt19937 rng(3);
  for (int64_t t = 0; t < T; ++t) {
    std::vector<int32_t> perm(n_exp);
    for (int e = 0; e < n_exp; ++e) perm[e] = e;
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int r = 0; r < k; ++r) {
      ids[t * k + r] = perm[r];
      wt[t * k + r] = 0.2f + 0.1f * static_cast<float>(r + t % 3);
    }
  }
  // Reference: one token at a time, one expert at a time, summed in rank order.
  QuantizedRows xq;
  quantize_rows(quant::vec_dot_type(GgmlType::Q8_0), x.data(), T, d, &xq, nullptr);
  ExpertScratch es;
  std::vector<float> ref(T * d), y(d);
  for (int64_t t = 0; t < T; ++t) {
    const int32_t row = static_cast<int32_t>(t);
    for (int r = 0; r < k; ++r) {
      expert_ffn(ex.w, ids[t * k + r], xq, x.data(), &row, 1, y.data(), d, &es, nullptr);
      for (int64_t i = 0; i < d; ++i) {
        ref[t * d + i] = r == 0 ? y[i] * wt[t * k] : ref[t * d + i] + y[i] * wt[t * k + r];
      }
    }
  }
  double mag = 0;
  for (float v : ref) mag = std::max(mag, static_cast<double>(std::fabs(v)));
  ASSERT_GT(mag, 1e-3) << "degenerate expert outputs";

  for (int n_threads : {1, 2, 3}) {
    ThreadPool pool(n_threads);
    LocalExecutor le({ex.w}, &pool);
    RoutingPlan plan;
    ASSERT_TRUE(make_plan(0, ids.data(), wt.data(), T, k, n_exp, &plan).is_ok());
    const Ticket tk = le.submit(0, x.data(), T, plan);
    auto out = le.wait(tk);
    ASSERT_TRUE(out.is_ok()) << out.status().to_string();
    ASSERT_EQ(out->size(), static_cast<size_t>(T * d));
    EXPECT_EQ(std::memcmp(out->data(), ref.data(), ref.size() * sizeof(float)), 0) << n_threads << " threads";
    // One token per submit gives the same bits.
    for (int64_t t = 0; t < T; ++t) {
      RoutingPlan p1;
      ASSERT_TRUE(make_plan(0, &ids[t * k], &wt[t * k], 1, k, n_exp, &p1).is_ok());
      auto o1 = le.wait(le.submit(0, x.data() + t * d, 1, p1));
      ASSERT_TRUE(o1.is_ok());
      EXPECT_EQ(std::memcmp(o1->data(), ref.data() + t * d, d * sizeof(float)), 0) << "token " << t;
    }
  }
  ThreadPool pool(1);
  LocalExecutor le({ex.w}, &pool);
  EXPECT_FALSE(le.wait(12345).is_ok());  // unknown ticket
}

// A file of an architecture this build does not run is refused at load, naming it and listing
// what the registry has.
TEST(HParams, UnsupportedArchitectureIsNamed) {
  gguf::Writer w;
  w.set("general.architecture", gguf::Value::str("falcon-h1"));
  w.set("falcon-h1.vocab_size", gguf::Value::u32(64));
  auto f = gguf::File::from_bytes(std::move(*w.write_bytes()));
  ASSERT_TRUE(f.is_ok()) << f.status().to_string();
  auto hp = load_hparams(**f);
  ASSERT_FALSE(hp.is_ok());
  EXPECT_EQ(hp.status().code(), StatusCode::kUnsupported);
  EXPECT_NE(hp.status().message().find("architecture 'falcon-h1' is not supported"), std::string::npos)
      << hp.status().message();
  for (const std::string& a : supported_architectures()) {
    EXPECT_NE(hp.status().message().find(a), std::string::npos) << a << " not listed: " << hp.status().message();
  }
  EXPECT_EQ(supported_architectures().size(), 13u);
}

TEST(HParams, MissingKeysAreNamed) {
  gguf::Writer w;
  w.set("general.architecture", gguf::Value::str("qwen3moe"));
  w.set("qwen3moe.vocab_size", gguf::Value::u32(64));
  w.set("qwen3moe.context_length", gguf::Value::u32(128));
  w.set("qwen3moe.embedding_length", gguf::Value::u32(64));
  w.set("qwen3moe.block_count", gguf::Value::u32(1));
  w.set("qwen3moe.attention.head_count", gguf::Value::u32(2));
  w.set("qwen3moe.attention.layer_norm_rms_epsilon", gguf::Value::f32(1e-6f));
  auto bytes = w.write_bytes();
  ASSERT_TRUE(bytes.is_ok());
  auto f = gguf::File::from_bytes(std::move(*bytes));
  ASSERT_TRUE(f.is_ok()) << f.status().to_string();
  auto hp = load_hparams(**f);
  ASSERT_FALSE(hp.is_ok());
  EXPECT_EQ(hp.status().message(), "qwen3moe.expert_count missing");

  w.set("qwen3moe.expert_count", gguf::Value::u32(8));
  w.set("qwen3moe.expert_used_count", gguf::Value::u32(2));
  w.set("qwen3moe.expert_feed_forward_length", gguf::Value::u32(32));
  auto f2 = gguf::File::from_bytes(std::move(*w.write_bytes()));
  ASSERT_TRUE(f2.is_ok());
  auto hp2 = load_hparams(**f2);
  ASSERT_TRUE(hp2.is_ok()) << hp2.status().to_string();
  EXPECT_EQ(hp2->head_dim_k, 32);  // default n_embd / n_head
  EXPECT_EQ(hp2->rope.mode, RopeMode::kNeox);
  EXPECT_FLOAT_EQ(hp2->rope.freq_base, 10000.0f);
  EXPECT_TRUE(hp2->norm_w);
  EXPECT_FLOAT_EQ(hp2->kq_scale, 1.0f / std::sqrt(32.0f));
}

TEST(HParams, DeepseekYarnScales) {
  // The reference deepseek2-s settings: factor 4, yarn_log_multiplier 0.1, key_length_mla 96.
  gguf::Writer w;
  const std::pair<const char*, uint32_t> ints[] = {{"vocab_size", 64},
                                                   {"context_length", 256},
                                                   {"embedding_length", 64},
                                                   {"block_count", 2},
                                                   {"attention.head_count", 4},
                                                   {"attention.head_count_kv", 1},
                                                   {"rope.dimension_count", 32},
                                                   {"feed_forward_length", 128},
                                                   {"expert_count", 16},
                                                   {"expert_used_count", 4},
                                                   {"leading_dense_block_count", 1},
                                                   {"attention.q_lora_rank", 64},
                                                   {"attention.kv_lora_rank", 64},
                                                   {"attention.key_length_mla", 96},
                                                   {"attention.value_length_mla", 64},
                                                   {"expert_feed_forward_length", 64},
                                                   {"expert_shared_count", 1},
                                                   {"expert_gating_func", 2},
                                                   {"expert_group_count", 4},
                                                   {"expert_group_used_count", 2},
                                                   {"rope.scaling.original_context_length", 64}};
  w.set("general.architecture", gguf::Value::str("deepseek2"));
  for (auto [k, v] : ints) w.set(std::string("deepseek2.") + k, gguf::Value::u32(v));
  w.set("deepseek2.attention.layer_norm_rms_epsilon", gguf::Value::f32(1e-6f));
  w.set("deepseek2.expert_weights_scale", gguf::Value::f32(2.5f));
  w.set("deepseek2.expert_weights_norm", gguf::Value::boolean(true));
  w.set("deepseek2.rope.scaling.type", gguf::Value::str("yarn"));
  w.set("deepseek2.rope.scaling.factor", gguf::Value::f32(4.0f));
  w.set("deepseek2.rope.scaling.yarn_log_multiplier", gguf::Value::f32(0.1f));
  auto f = gguf::File::from_bytes(std::move(*w.write_bytes()));
  ASSERT_TRUE(f.is_ok());
  auto hp = load_hparams(**f);
  ASSERT_TRUE(hp.is_ok()) << hp.status().to_string();
  EXPECT_FLOAT_EQ(hp->rope.freq_scale, 0.25f);
  EXPECT_FLOAT_EQ(hp->rope.ext_factor, 1.0f);
  EXPECT_EQ(hp->rope.n_ctx_orig, 64);
  // cos/sin not magnitude-scaled: attn_factor * (1 + 0.1 ln 4) == 1
  EXPECT_NEAR(hp->rope.attn_factor * (1.0f + 0.1f * std::log(4.0f)), 1.0f, 1e-6);
  const double mscale = 1.0 + 0.1 * std::log(4.0);
  EXPECT_NEAR(hp->kq_scale, mscale * mscale / std::sqrt(96.0), 1e-6);
  EXPECT_EQ(hp->head_dim_k, 64 + 32);
  EXPECT_EQ(hp->gating, GatingFunc::kSigmoid);
  EXPECT_EQ(hp->n_group, 4);
}

}  // namespace
}  // namespace moesh

namespace moesh {
namespace {

// An architecture with one chat template family names it (used when a file has no
// tokenizer.chat_template), and the name is one the chat module knows.
TEST(HParams, ChatFamilyOfTheArchitecture) {
  const std::map<std::string, std::string> want = {{"gpt-oss", "harmony"},  {"glm4moe", "glm4"},
                                                   {"llama4", "llama4"},    {"qwen3next", "chatml"},
                                                   {"qwen35moe", "chatml"}, {"minimax-m2", ""}};
  for (const auto& [arch, fam] : want) {
    auto hp = arch_make_defaults(arch);
    ASSERT_TRUE(hp.is_ok()) << arch;
    EXPECT_EQ(std::string(chat_family_of(*hp)), fam) << arch;
    if (!fam.empty()) {
      EXPECT_TRUE(chat_format_from_name(fam).is_ok()) << fam;
    }
  }
  EXPECT_TRUE(chat_family_of(HParams{}).empty());
}

}  // namespace
}  // namespace moesh
