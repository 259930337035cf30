// The worker's DISPATCH computation in-process: EXACT rows are bit-identical to expert_ffn run
// one (token, expert) at a time, PARTIAL/F32 is bit-identical to the local executor's routed sum,
// and bad requests are refused with the right error code.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "moesh/model.h"
#include "moesh/quant.h"
#include "swarm/swarm_test_util.h"
#include "swarm/worker_internal.h"

namespace moesh::swarm {
namespace {

using testing::random_rows;
using testing::small_model;

struct Routed {
  std::vector<int32_t> ids;     // [n_tok][k] rank order
  std::vector<float> weights;   // [n_tok][k]
};

Routed random_routing(uint64_t seed, int n_tok, int k, int n_expert) {
  std::mt19937_64 rng(seed);
  Routed r;
  for (int t = 0; t < n_tok; ++t) {
    std::vector<int32_t> all(n_expert);
    for (int e = 0; e < n_expert; ++e) all[e] = e;
    std::shuffle(all.begin(), all.end(), rng);
    float sum = 0;
    std::vector<float> w(k);
    for (int j = 0; j < k; ++j) sum += (w[j] = std::uniform_real_distribution<float>(0.1f, 1.f)(rng));
    std::sort(w.rbegin(), w.rend());
    for (int j = 0; j < k; ++j) {
      r.ids.push_back(all[j]);
      r.weights.push_back(w[j] / sum);
    }
  }
  return r;
}

wire::DispatchMsg make_dispatch(uint32_t layer, const std::vector<float>& x, int n_tok, int n_embd,
                                const Routed& r, int k, wire::CombineMode mode) {
  wire::DispatchMsg m;
  m.request_id = 7;
  m.layer = layer;
  m.mode = mode;
  m.return_dtype = wire::WireDType::kF32;
  for (int t = 0; t < n_tok; ++t) {
    m.pair_counts.push_back(static_cast<uint8_t>(k));
    for (int j = 0; j < k; ++j) {
      m.pairs.push_back({static_cast<uint16_t>(r.ids[t * k + j]), static_cast<uint8_t>(j), r.weights[t * k + j]});
    }
  }
  m.hidden = *wire::encode_rows(wire::WireDType::kF32, x.data(), n_tok, n_embd);
  return m;
}

std::vector<float> rows_of(const wire::CombineMsg& c) {
  std::vector<float> out(size_t{c.rows.n_rows} * c.rows.n_cols);
  wire::decode_rows(c.rows, out.data());
  return out;
}

class WorkerCompute : public ::testing::TestWithParam<MakeFileType> {};

TEST_P(WorkerCompute, ExactAndPartialMatchLocalBits) {
  const std::string path = small_model(MakeArch::kQwen3Moe, GetParam(), 31);
  auto model = Model::load(path);
  ASSERT_TRUE(model.is_ok()) << model.status().to_string();
  auto store = ExpertStore::open(testing::open_gguf(path), ExpertSet{});
  ASSERT_TRUE(store.is_ok()) << store.status().to_string();
  ThreadPool pool(2);
  const int n_tok = 5, k = 3, n_embd = 64;
  const std::vector<ExpertWeights> layers = (*model)->expert_weights();
  detail::ComputeScratch scratch;
  for (uint32_t layer = 0; layer < 2; ++layer) {
    const std::vector<float> x = random_rows(100 + layer, n_tok, n_embd);
    const Routed r = random_routing(200 + layer, n_tok, k, 8);

    // EXACT: each (token, expert) row equals expert_ffn on that token alone.
    auto exact = detail::compute_dispatch(**store, make_dispatch(layer, x, n_tok, n_embd, r, k, wire::CombineMode::kExact),
                                          &scratch, &pool);
    ASSERT_TRUE(exact.ok) << exact.text;
    ASSERT_EQ(exact.combine.rows.n_rows, uint32_t(n_tok * k));
    const std::vector<float> y = rows_of(exact.combine);
    const ExpertWeights& w = layers[layer];
    QuantizedRows xq;
    ExpertScratch es;
    std::vector<float> ref(n_embd);
    int n_nonzero = 0;
    for (int t = 0; t < n_tok; ++t) {
      quantize_rows(quant::vec_dot_type(w.gate.type), x.data() + t * n_embd, 1, n_embd, &xq, nullptr);
      const int32_t row0 = 0;
      for (int j = 0; j < k; ++j) {
        expert_ffn(w, r.ids[t * k + j], xq, x.data() + t * n_embd, &row0, 1, ref.data(), n_embd, &es, nullptr);
        for (int d = 0; d < n_embd; ++d) {
          const float got = y[(t * k + j) * n_embd + d];
          ASSERT_EQ(std::memcmp(&got, &ref[d], 4), 0)
              << "layer " << layer << " token " << t << " rank " << j << " col " << d << ": " << got
              << " vs " << ref[d];
          n_nonzero += ref[d] != 0.0f;
        }
      }
    }
    EXPECT_GT(n_nonzero, n_tok * k * n_embd * 9 / 10);

    // PARTIAL/F32 with all k ranks here equals the local executor's routed sum, bit for bit.
    auto partial = detail::compute_dispatch(**store, make_dispatch(layer, x, n_tok, n_embd, r, k, wire::CombineMode::kPartial),
                                            &scratch, &pool);
    ASSERT_TRUE(partial.ok) << partial.text;
    ASSERT_EQ(partial.combine.rows.n_rows, uint32_t(n_tok));
    RoutingPlan plan;
    ASSERT_TRUE(make_plan(layer, r.ids.data(), r.weights.data(), n_tok, k, 8, &plan).is_ok());
    LocalExecutor local((*model)->expert_weights(), &pool);
    auto sum = local.wait(local.submit(layer, x.data(), n_tok, plan));
    ASSERT_TRUE(sum.is_ok()) << sum.status().to_string();
    const std::vector<float> got = rows_of(partial.combine);
    ASSERT_EQ(got.size(), sum->size());
    EXPECT_EQ(std::memcmp(got.data(), sum->data(), got.size() * 4), 0) << "layer " << layer;
    // ...and it is the weighted sum of the EXACT rows (sanity on the weights' use).
    for (int d = 0; d < n_embd; ++d) {
      float o = y[d] * r.weights[0];
      for (int j = 1; j < k; ++j) o = o + y[j * n_embd + d] * r.weights[j];
      ASSERT_EQ(o, got[d]);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Types, WorkerCompute, ::testing::Values(MakeFileType::kQ8_0, MakeFileType::kF32),
                         [](const auto& i) { return std::string(make_file_type_name(i.param)); });

TEST(WorkerComputeErrors, UnheldExpertWrongLayerAndWidth) {
  const std::string path = small_model(MakeArch::kDeepseek2, MakeFileType::kQ8_0, 31);
  auto file = gguf::File::open(path);
  auto shape = model_shape(**file);
  ASSERT_TRUE(shape.is_ok());
  auto held = parse_expert_spec("*:0-3", *shape);
  ASSERT_TRUE(held.is_ok());
  auto store = ExpertStore::open(std::move(*file), *held);
  ASSERT_TRUE(store.is_ok()) << store.status().to_string();
  detail::ComputeScratch scratch;
  const std::vector<float> x = random_rows(1, 2, 64);
  Routed r{{1, 5, 0, 2}, {0.6f, 0.4f, 0.7f, 0.3f}};
  auto out = detail::compute_dispatch(**store, make_dispatch(1, x, 2, 64, r, 2, wire::CombineMode::kExact),
                                      &scratch, nullptr);
  ASSERT_FALSE(out.ok);
  EXPECT_EQ(out.error, wire::WireError::kNotHeld);
  EXPECT_NE(out.text.find("layer 1 expert 5"), std::string::npos) << out.text;
  // Layer 0 is dense in deepseek2: nothing to compute there.
  Routed r0{{1, 2, 0, 3}, {0.6f, 0.4f, 0.7f, 0.3f}};
  out = detail::compute_dispatch(**store, make_dispatch(0, x, 2, 64, r0, 2, wire::CombineMode::kExact), &scratch, nullptr);
  ASSERT_FALSE(out.ok);
  EXPECT_EQ(out.error, wire::WireError::kNotHeld);
  // Wrong hidden width.
  const std::vector<float> x32 = random_rows(1, 2, 32);
  out = detail::compute_dispatch(**store, make_dispatch(1, x32, 2, 32, r0, 2, wire::CombineMode::kExact), &scratch, nullptr);
  ASSERT_FALSE(out.ok);
  EXPECT_EQ(out.error, wire::WireError::kModelMismatch);
  // The held ones work, and the result is not degenerate.
  out = detail::compute_dispatch(**store, make_dispatch(2, x, 2, 64, r0, 2, wire::CombineMode::kPartial), &scratch, nullptr);
  ASSERT_TRUE(out.ok) << out.text;
  const std::vector<float> y = rows_of(out.combine);
  double norm = 0;
  for (float v : y) norm += double(v) * v;
  EXPECT_GT(norm, 1e-6);
}

}  // namespace
}  // namespace moesh::swarm
