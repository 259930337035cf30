// The worker's DISPATCH computation in-process: EXACT rows are bit-identical to expert_ffn run
// one (token, expert) at a time, PARTIAL/F32 is bit-identical to the local executor's routed sum,
// and bad requests are refused with the right error code. Hidden rows that arrive in the slab's
// activation format (Q8 for Q8_0, Q8K for Q8_K) give the bits of f32 rows computed locally.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>

#include "moesh/model/model.h"
#include "moesh/tensor/quant.h"
#include "swarm/swarm_test_util.h"
#include "swarm/worker_internal.h"

namespace moesh::swarm {
namespace {

using testing::random_rows;
using testing::small_model;

struct Routed {
  std::vector<int32_t> ids;    // [n_tok][k] rank order
  std::vector<float> weights;  // [n_tok][k]
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

wire::DispatchMsg make_dispatch(uint32_t layer, const std::vector<float>& x, int n_tok, int n_embd, const Routed& r,
                                int k, wire::CombineMode mode, wire::WireDType hidden = wire::WireDType::kF32) {
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
  m.hidden = *wire::encode_rows(hidden, x.data(), n_tok, n_embd);
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
    auto exact = detail::compute_dispatch(
        **store, make_dispatch(layer, x, n_tok, n_embd, r, k, wire::CombineMode::kExact), &scratch, &pool);
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
          ASSERT_EQ(std::memcmp(&got, &ref[d], 4), 0) << "layer " << layer << " token " << t << " rank " << j << " col "
                                                      << d << ": " << got << " vs " << ref[d];
          n_nonzero += ref[d] != 0.0f;
        }
      }
    }
    EXPECT_GT(n_nonzero, n_tok * k * n_embd * 9 / 10);

    // PARTIAL/F32 with all k ranks here equals the local executor's routed sum, bit for bit.
    auto partial = detail::compute_dispatch(
        **store, make_dispatch(layer, x, n_tok, n_embd, r, k, wire::CombineMode::kPartial), &scratch, &pool);
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

// A qwen3moe model whose experts are k-quants: n_embd and n_ff_exp 256, so gate/up are Q4_K and
// down Q4_K/Q6_K (make-model's Q4_K_M rule).
std::string kquant_model() {
  static const std::string path = [] {
    MakeModelSpec s = MakeModelSpec::defaults_for(MakeArch::kQwen3Moe);
    s.type = MakeFileType::kQ4_K_M;
    s.seed = 41;
    s.n_vocab = 64;
    s.vocab = MakeVocab::kNone;
    s.n_embd = 256;
    s.n_head = 2;
    s.n_head_kv = 1;
    s.head_dim = 32;
    s.n_expert = 8;
    s.n_expert_used = 2;
    s.n_ff_exp = 256;
    s.n_ff = 256;
    s.n_layer = 2;
    const std::string p = testing::temp_dir() + "/kquant-256.gguf";
    Status st = make_model(s, p);
    EXPECT_TRUE(st.is_ok()) << st.to_string();
    return p;
  }();
  return path;
}

// EXACT rows of `hidden`-encoded x against expert_ffn on the f32 rows quantized locally; returns
// the number of values that differ (bitwise) and checks the data is not degenerate.
size_t count_diffs_vs_local(const ExpertStore& store, const std::vector<ExpertWeights>& layers, uint32_t layer,
                            const std::vector<float>& x, int n_tok, int n_embd, const Routed& r, int k,
                            wire::WireDType hidden) {
  detail::ComputeScratch scratch;
  auto out = detail::compute_dispatch(
      store, make_dispatch(layer, x, n_tok, n_embd, r, k, wire::CombineMode::kExact, hidden), &scratch, nullptr);
  EXPECT_TRUE(out.ok) << out.text;
  if (!out.ok) return SIZE_MAX;
  const std::vector<float> y = rows_of(out.combine);
  const ExpertWeights& w = layers[layer];
  QuantizedRows xq;
  ExpertScratch es;
  std::vector<float> ref(n_embd);
  size_t diffs = 0, nonzero = 0;
  for (int t = 0; t < n_tok; ++t) {
    quantize_rows(quant::vec_dot_type(w.gate.type), x.data() + t * n_embd, 1, n_embd, &xq, nullptr);
    const int32_t row0 = 0;
    for (int j = 0; j < k; ++j) {
      expert_ffn(w, r.ids[t * k + j], xq, x.data() + t * n_embd, &row0, 1, ref.data(), n_embd, &es, nullptr);
      for (int d = 0; d < n_embd; ++d) {
        diffs += std::memcmp(&y[(t * k + j) * n_embd + d], &ref[d], 4) != 0;
        nonzero += ref[d] != 0.0f;
      }
    }
  }
  EXPECT_GT(nonzero, size_t(n_tok * k * n_embd) * 9 / 10);
  return diffs;
}

TEST(WorkerComputeWire, Q8KHiddenOnKQuantExpertsIsTheLocalBits) {
  const std::string path = kquant_model();
  auto model = Model::load(path);
  ASSERT_TRUE(model.is_ok()) << model.status().to_string();
  auto store = ExpertStore::open(testing::open_gguf(path), ExpertSet{});
  ASSERT_TRUE(store.is_ok()) << store.status().to_string();
  const std::vector<ExpertWeights> layers = (*model)->expert_weights();
  ASSERT_EQ(layers[0].gate.type, GgmlType::Q4_K);
  ASSERT_EQ(layers[0].up.type, GgmlType::Q4_K);
  bool saw_q6k = false;
  for (const ExpertWeights& w : layers) saw_q6k |= w.down.type == GgmlType::Q6_K;
  EXPECT_TRUE(saw_q6k) << "the Q4_K_M rule should give some layer Q6_K down projections";
  // The worker announces Q8K for both layers.
  const std::vector<uint8_t> act = detail::layer_activation_dtypes(**store);
  ASSERT_EQ(act.size(), 2u);
  EXPECT_EQ(act[0], static_cast<uint8_t>(wire::WireDType::kQ8K));
  EXPECT_EQ(act[1], static_cast<uint8_t>(wire::WireDType::kQ8K));
  const int n_tok = 6, k = 3, n_embd = 256;
  for (uint32_t layer = 0; layer < 2; ++layer) {
    SCOPED_TRACE(::testing::Message() << "layer " << layer);
    std::vector<float> x = random_rows(300 + layer, n_tok, n_embd);
    x[5] = 0.5f * (x[4] + x[6]);
    std::fill(x.begin() + n_embd, x.begin() + n_embd + 16, 0.f);  // a token with a zero bsum group
    const Routed r = random_routing(400 + layer, n_tok, k, 8);
    // Q8K: no re-quantization, the local bits.
    EXPECT_EQ(count_diffs_vs_local(**store, layers, layer, x, n_tok, n_embd, r, k, wire::WireDType::kQ8K), 0u);
    // Q8 blocks re-quantized to Q8_K are not (this is what Q8K fixes), so the check can fail.
    EXPECT_GT(count_diffs_vs_local(**store, layers, layer, x, n_tok, n_embd, r, k, wire::WireDType::kQ8), 0u);
    // The QuantizedRows built from the wire are byte for byte quantize_rows of the f32 rows.
    auto wr = wire::encode_rows(wire::WireDType::kQ8K, x.data(), n_tok, n_embd);
    ASSERT_TRUE(wr.is_ok());
    QuantizedRows from_wire, local;
    ASSERT_TRUE(detail::quantized_from_wire(*wr, GgmlType::Q8_K, &from_wire));
    quantize_rows(GgmlType::Q8_K, x.data(), n_tok, n_embd, &local, nullptr);
    ASSERT_EQ(from_wire.data.size(), local.data.size());
    EXPECT_EQ(from_wire.row_bytes, local.row_bytes);
    EXPECT_EQ(std::memcmp(from_wire.data.data(), local.data.data(), local.data.size()), 0);
    // Not the slab's format: decode and quantize as before.
    EXPECT_FALSE(detail::quantized_from_wire(*wr, GgmlType::Q8_0, &from_wire));
  }
}

TEST(WorkerComputeWire, Q8HiddenOnQ8_0ExpertsIsTheLocalBits) {
  const std::string path = small_model(MakeArch::kQwen3Moe, MakeFileType::kQ8_0, 31);
  auto model = Model::load(path);
  ASSERT_TRUE(model.is_ok()) << model.status().to_string();
  auto store = ExpertStore::open(testing::open_gguf(path), ExpertSet{});
  ASSERT_TRUE(store.is_ok()) << store.status().to_string();
  const std::vector<ExpertWeights> layers = (*model)->expert_weights();
  const std::vector<uint8_t> act = detail::layer_activation_dtypes(**store);
  ASSERT_EQ(act.size(), 2u);
  EXPECT_EQ(act[0], static_cast<uint8_t>(wire::WireDType::kQ8));
  const int n_tok = 4, k = 2, n_embd = 64;
  const std::vector<float> x = random_rows(500, n_tok, n_embd);
  const Routed r = random_routing(501, n_tok, k, 8);
  EXPECT_EQ(count_diffs_vs_local(**store, layers, 1, x, n_tok, n_embd, r, k, wire::WireDType::kQ8), 0u);
  // An F32-weight model takes no INT8 format: nothing is announced.
  auto f32store =
      ExpertStore::open(testing::open_gguf(small_model(MakeArch::kQwen3Moe, MakeFileType::kF32, 31)), ExpertSet{});
  ASSERT_TRUE(f32store.is_ok());
  for (uint8_t a : detail::layer_activation_dtypes(**f32store)) EXPECT_EQ(a, wire::kNoActDType);
}

// load_into_memory: the held slabs (and bias rows) copied into one huge-page region serve the
// same bits as the mapping, for a full model with held runs that start mid-stack, an expert
// slice, k-quant experts and gpt-oss's biased experts; nothing else changes (held set, slab
// bytes, unheld experts refused).
void expect_memory_store_gives_mapped_bits(const std::string& path, const std::string& spec, int n_embd) {
  SCOPED_TRACE(path + " held " + spec);
  auto open = [&] {
    auto file = gguf::File::open(path);
    EXPECT_TRUE(file.is_ok());
    auto shape = model_shape(**file);
    EXPECT_TRUE(shape.is_ok());
    ExpertSet held;
    if (!spec.empty()) held = *parse_expert_spec(spec, *shape);
    auto st = ExpertStore::open(std::move(*file), held);
    EXPECT_TRUE(st.is_ok()) << st.status().to_string();
    return std::move(*st);
  };
  std::unique_ptr<ExpertStore> mapped = open(), copied = open();
  ASSERT_TRUE(copied->load_into_memory().is_ok());
  ASSERT_TRUE(copied->in_memory());
  EXPECT_FALSE(mapped->in_memory());
  EXPECT_TRUE(copied->load_into_memory().is_ok());  // twice is a no-op
  EXPECT_EQ(copied->held().to_string(), mapped->held().to_string());
  EXPECT_EQ(copied->slab_bytes(), mapped->slab_bytes());
  const uint8_t* file0 = copied->file().base();
  const uint8_t* file1 = file0 + copied->file().size();
  const ModelShape& shape = mapped->shape();
  detail::ComputeScratch scratch;
  int n_layers_checked = 0;
  for (const wire::ExpertRange& range : mapped->held().ranges) {
    // One token per held expert of the range (k = 1), so every slab is read.
    const int n_tok = static_cast<int>(range.count);
    Routed r;
    for (uint32_t e = range.first; e < range.first + range.count; ++e) {
      r.ids.push_back(static_cast<int32_t>(e));
      r.weights.push_back(0.75f);
    }
    const std::vector<float> x = random_rows(900 + range.layer, n_tok, n_embd);
    const wire::DispatchMsg m = make_dispatch(range.layer, x, n_tok, n_embd, r, 1, wire::CombineMode::kExact);
    auto a = detail::compute_dispatch(*mapped, m, &scratch, nullptr);
    auto b = detail::compute_dispatch(*copied, m, &scratch, nullptr);
    ASSERT_TRUE(a.ok) << a.text;
    ASSERT_TRUE(b.ok) << b.text;
    ASSERT_EQ(a.combine.rows.bytes.size(), b.combine.rows.bytes.size());
    EXPECT_EQ(std::memcmp(a.combine.rows.bytes.data(), b.combine.rows.bytes.data(), a.combine.rows.bytes.size()), 0)
        << "layer " << range.layer;
    for (uint32_t e = range.first; e < range.first + range.count; ++e) {
      const ExpertStore::Slot slot = copied->find(range.layer, e);
      ASSERT_NE(slot.weights, nullptr);
      for (const TensorView* t : {&slot.weights->gate, &slot.weights->up, &slot.weights->down, &slot.weights->gate_b}) {
        if (t->valid()) EXPECT_TRUE(t->data < file0 || t->data >= file1) << t->name << " still points into the file";
      }
    }
    ++n_layers_checked;
  }
  EXPECT_GT(n_layers_checked, 0);
  // An expert not held stays refused.
  for (uint32_t l : shape.moe_layers) {
    for (uint32_t e = 0; e < shape.n_expert; ++e) {
      if (mapped->held().holds(l, e)) continue;
      EXPECT_EQ(copied->find(l, e).weights, nullptr);
      const std::vector<float> x = random_rows(1, 1, n_embd);
      Routed r{{static_cast<int32_t>(e)}, {1.0f}};
      auto out = detail::compute_dispatch(*copied, make_dispatch(l, x, 1, n_embd, r, 1, wire::CombineMode::kExact),
                                          &scratch, nullptr);
      EXPECT_FALSE(out.ok);
      EXPECT_EQ(out.error, wire::WireError::kNotHeld);
      return;
    }
  }
}

TEST(ExpertStoreMemory, CopiedSlabsGiveTheMappedBits) {
  const std::string q8 = small_model(MakeArch::kQwen3Moe, MakeFileType::kQ8_0, 31);
  expect_memory_store_gives_mapped_bits(q8, "", 64);
  expect_memory_store_gives_mapped_bits(q8, "0:1-2,0:5,1:3-7", 64);
  expect_memory_store_gives_mapped_bits(small_model(MakeArch::kDeepseek2, MakeFileType::kQ8_0, 31), "*:2-5", 64);
  expect_memory_store_gives_mapped_bits(kquant_model(), "*:1-6", 256);
  const std::string slice = testing::temp_dir() + "/mem-slice.gguf";
  {
    auto full = gguf::File::open(q8);
    ASSERT_TRUE(full.is_ok());
    auto shape = model_shape(**full);
    ASSERT_TRUE(write_expert_slice(**full, *parse_expert_spec("0:2-6,1:0-3", *shape), slice).is_ok());
  }
  expect_memory_store_gives_mapped_bits(slice, "", 64);
  expect_memory_store_gives_mapped_bits(slice, "0:3-4", 64);
  const std::string gptoss = std::string(MOESH_REFERENCE_DIR) + "/archs/gptoss-a.MXFP4_MOE.gguf";
  if (!std::filesystem::exists(gptoss)) GTEST_SKIP() << "SKIPPED: " << gptoss << " absent (biased experts)";
  auto f = gguf::File::open(gptoss);
  ASSERT_TRUE(f.is_ok());
  const int n_embd = static_cast<int>(model_shape(**f)->n_embd);
  expect_memory_store_gives_mapped_bits(gptoss, "0:2-5,1:7", n_embd);
}

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
  auto out =
      detail::compute_dispatch(**store, make_dispatch(1, x, 2, 64, r, 2, wire::CombineMode::kExact), &scratch, nullptr);
  ASSERT_FALSE(out.ok);
  EXPECT_EQ(out.error, wire::WireError::kNotHeld);
  EXPECT_NE(out.text.find("layer 1 expert 5"), std::string::npos) << out.text;
  // Layer 0 is dense in deepseek2: nothing to compute there.
  Routed r0{{1, 2, 0, 3}, {0.6f, 0.4f, 0.7f, 0.3f}};
  out = detail::compute_dispatch(**store, make_dispatch(0, x, 2, 64, r0, 2, wire::CombineMode::kExact), &scratch,
                                 nullptr);
  ASSERT_FALSE(out.ok);
  EXPECT_EQ(out.error, wire::WireError::kNotHeld);
  // Wrong hidden width.
  const std::vector<float> x32 = random_rows(1, 2, 32);
  out = detail::compute_dispatch(**store, make_dispatch(1, x32, 2, 32, r0, 2, wire::CombineMode::kExact), &scratch,
                                 nullptr);
  ASSERT_FALSE(out.ok);
  EXPECT_EQ(out.error, wire::WireError::kModelMismatch);
  // The held ones work, and the result is not degenerate.
  out = detail::compute_dispatch(**store, make_dispatch(2, x, 2, 64, r0, 2, wire::CombineMode::kPartial), &scratch,
                                 nullptr);
  ASSERT_TRUE(out.ok) << out.text;
  const std::vector<float> y = rows_of(out.combine);
  double norm = 0;
  for (float v : y) norm += double(v) * v;
  EXPECT_GT(norm, 1e-6);
}

// Federation: requests of several backbones for one layer computed in one pass give each its own
// bits (exact and partial, different return dtypes and token counts, overlapping experts), and an
// invalid request in the batch fails alone.
TEST_P(WorkerCompute, BatchedRequestsGetTheirSoloBits) {
  const std::string path = small_model(MakeArch::kQwen3Moe, GetParam(), 31);
  auto file = gguf::File::open(path);
  ASSERT_TRUE(file.is_ok());
  auto shape = model_shape(**file);
  auto held = parse_expert_spec("*:0-5", *shape);
  auto store = ExpertStore::open(std::move(*file), *held);
  ASSERT_TRUE(store.is_ok()) << store.status().to_string();
  ThreadPool pool(2);
  const int n_embd = 64, k = 2;
  const uint32_t layer = 1;
  struct Case {
    int n_tok;
    wire::CombineMode mode;
    wire::WireDType ret;
  };
  const Case cases[] = {{3, wire::CombineMode::kExact, wire::WireDType::kF32},
                        {1, wire::CombineMode::kPartial, wire::WireDType::kF32},
                        {7, wire::CombineMode::kPartial, wire::WireDType::kF16},
                        {2, wire::CombineMode::kExact, wire::WireDType::kBF16}};
  std::vector<wire::DispatchMsg> reqs;
  for (size_t i = 0; i < std::size(cases); ++i) {
    const std::vector<float> x = random_rows(300 + i, cases[i].n_tok, n_embd);
    const Routed r = random_routing(400 + i, cases[i].n_tok, k, 6);  // experts 0-5: all held
    reqs.push_back(make_dispatch(layer, x, cases[i].n_tok, n_embd, r, k, cases[i].mode));
    reqs.back().return_dtype = cases[i].ret;
    reqs.back().request_id = 10 + i;
  }
  // One request names an unheld expert: it fails, the others are computed.
  wire::DispatchMsg bad = reqs[0];
  bad.request_id = 99;
  bad.pairs[1].expert = 7;
  detail::ComputeScratch solo_scratch, batch_scratch;
  std::vector<detail::ComputeOutcome> solo;
  for (const auto& q : reqs) solo.push_back(detail::compute_dispatch(**store, q, &solo_scratch, &pool));
  std::vector<const wire::DispatchMsg*> ptrs = {&reqs[0], &reqs[1], &bad, &reqs[2], &reqs[3]};
  ASSERT_TRUE(detail::can_batch(reqs[0], reqs[3]));
  const std::vector<detail::ComputeOutcome> got = detail::compute_batch(**store, ptrs, &batch_scratch, &pool);
  ASSERT_EQ(got.size(), ptrs.size());
  EXPECT_FALSE(got[2].ok);
  EXPECT_EQ(got[2].error, wire::WireError::kNotHeld);
  const size_t map[] = {0, 1, 3, 4};
  for (size_t i = 0; i < reqs.size(); ++i) {
    const detail::ComputeOutcome& b = got[map[i]];
    ASSERT_TRUE(solo[i].ok) << solo[i].text;
    ASSERT_TRUE(b.ok) << b.text;
    EXPECT_EQ(b.combine.request_id, reqs[i].request_id);
    EXPECT_EQ(b.combine.mode, reqs[i].mode);
    EXPECT_EQ(b.combine.rows.dtype, cases[i].ret);
    EXPECT_EQ(b.combine.rows.n_rows, solo[i].combine.rows.n_rows);
    EXPECT_EQ(b.combine.rows.bytes, solo[i].combine.rows.bytes) << "request " << i;
  }
  // A different layer does not batch.
  wire::DispatchMsg other = reqs[0];
  other.layer = 0;
  EXPECT_FALSE(detail::can_batch(reqs[0], other));
}

}  // namespace
}  // namespace moesh::swarm
