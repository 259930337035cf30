// glm-dsa's sparse attention (src/model/layers_indexer.cpp, arch_glm_dsa.cpp): the top-k choice
// among equal scores is llama.cpp's (its CPU top_k: std::partial_sort), the indexer types decide
// which blocks compute and which reuse a selection, spans do not cut between them, and the
// selection really drops context (a copy of the reference file whose top_k covers the whole
// context gives the same bits while every cell is kept anyway, other logits from there on).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <numeric>
#include <random>
#include <set>

#include "model/layers.h"
#include "moesh/gguf/gguf.h"
#include "moesh/model/model.h"
#include "reference.h"

namespace moesh {
namespace {

std::string ref_path() {
  return testing::reference_dir() + "/archs2/glmdsa-a.Q8_0.gguf";
}

std::filesystem::path tmp_dir() {
  const auto dir = std::filesystem::temp_directory_path() / ("moesh-glmdsa-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  return dir;
}

// The reference file with some keys replaced.
std::string with_keys(const std::string& name, const std::vector<std::pair<std::string, gguf::Value>>& keys) {
  auto src = gguf::File::open(ref_path());
  EXPECT_TRUE(src.is_ok());
  gguf::Writer w;
  for (const auto& [k, v] : (*src)->kvs()) w.set(k, v);
  for (const auto& [k, v] : keys) w.set(k, v);
  for (const auto& t : (*src)->tensors()) {
    const TensorView v = (*src)->view(t);
    EXPECT_TRUE(w.add_tensor(t.name, t.type, std::vector<int64_t>(v.ne, v.ne + t.n_dims), v.data).is_ok());
  }
  const std::string path = (tmp_dir() / name).string();
  EXPECT_TRUE(w.write_file(path).is_ok());
  return path;
}

std::vector<float> logits_of(const Model& m, const std::vector<int32_t>& toks) {
  Context ctx(m, ContextParams{2, 256, nullptr});
  std::vector<float> lg(toks.size() * static_cast<size_t>(m.hparams().n_vocab));
  Status st = ctx.decode(0, toks.data(), static_cast<int64_t>(toks.size()), lg.data());
  EXPECT_TRUE(st.is_ok()) << st.to_string();
  return lg;
}

#if defined(__GLIBCXX__)
// llama.cpp's CPU top_k is std::partial_sort over the indices 0..n-1 with "v[a] > v[b]"; with
// libstdc++ (its Linux builds) equal values resolve by the heap's order, which
// top_k_heap_select writes out. Values drawn from a few levels, so ties straddle the k-th place.
TEST(TopKHeapSelect, PicksWhatStdPartialSortPicks) {
  std::mt19937 rng(6102);
  int boundary_ties = 0, not_lowest_index = 0;
  for (int trial = 0; trial < 4000; ++trial) {
    const int32_t n = 1 + static_cast<int32_t>(rng() % 80);
    const int32_t k = 1 + static_cast<int32_t>(rng() % n);
    const int levels = 1 + static_cast<int>(rng() % 5);
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) x = static_cast<float>(static_cast<int>(rng() % levels)) * 0.25f - 0.5f;
    std::vector<int32_t> idx(static_cast<size_t>(n));
    std::iota(idx.begin(), idx.end(), 0);
    std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int32_t a, int32_t b) { return v[a] > v[b]; });
    std::vector<int32_t> got(static_cast<size_t>(k));
    detail::top_k_heap_select(v.data(), n, k, got.data());
    const std::set<int32_t> want_set(idx.begin(), idx.begin() + k), got_set(got.begin(), got.end());
    ASSERT_EQ(got_set, want_set) << "trial " << trial << " n " << n << " k " << k;
    // Was the choice a real one (the k-th value also outside the set), and not simply the lowest
    // indices among the tied?
    if (k < n) {
      std::vector<float> sorted = v;
      std::sort(sorted.begin(), sorted.end(), std::greater<>());
      const float kth = sorted[static_cast<size_t>(k - 1)];
      if (sorted[static_cast<size_t>(k)] == kth) {
        ++boundary_ties;
        std::vector<int32_t> tied_in, tied_all;
        for (int32_t i = 0; i < n; ++i) {
          if (v[i] == kth) tied_all.push_back(i);
          if (v[i] == kth && got_set.count(i) != 0) tied_in.push_back(i);
        }
        if (!std::equal(tied_in.begin(), tied_in.end(), tied_all.begin())) ++not_lowest_index;
      }
    }
  }
  EXPECT_GT(boundary_ties, 1000);
  EXPECT_GT(not_lowest_index, 100) << "the ties never needed the heap's order: the test shows nothing";
}
#endif

TEST(GlmDsa, IndexerTypesSetTheSourcesAndTheSpanRows) {
  if (!std::filesystem::exists(ref_path())) GTEST_SKIP() << "reference set absent: " << ref_path();
  auto m = Model::load(ref_path());
  ASSERT_TRUE(m.is_ok()) << m.status().to_string();
  const HParams& hp = (*m)->hparams();
  EXPECT_EQ(hp.n_layer, 3);
  EXPECT_EQ(hp.indexer_source, (std::vector<int32_t>{0, 0, 2}));  // types [1, 0, 1]
  EXPECT_EQ(hp.indexer_source_of(3), -1);                         // the NextN block: dense
  EXPECT_EQ(hp.kv_k_width, 128 + 32 + 64);                        // [c | k_pe | indexer key]
  // Rows entering block 1 carry block 0's selection: a count and top_k = 6 positions.
  EXPECT_FALSE(hp.carries_selection(0));
  EXPECT_TRUE(hp.carries_selection(1));
  EXPECT_FALSE(hp.carries_selection(2));
  EXPECT_FALSE(hp.carries_selection(3));
  EXPECT_EQ(hp.span_row_width(0), 256);
  EXPECT_EQ(hp.span_row_width(1), 256 + 1 + 6);
  EXPECT_EQ(hp.span_row_width(2), 256);
  EXPECT_EQ(hp.max_span_row_width(), 263);
  EXPECT_TRUE(hp.span_rows_wide());
  EXPECT_TRUE((*m)->layers[0].idx_wq_b.valid());
  EXPECT_FALSE((*m)->layers[1].idx_wq_b.valid());
}

// Blocks 0 | 1-2 in two contexts (a backbone and a span peer that starts at the block reusing
// block 0's selection): the rows leaving block 2 are the bits of one context running 0-2, for a
// prompt longer than top_k (so the selection really drops cells) and then token by token. Rows
// whose carried selection is hostile are refused with the token named, and nothing is kept.
TEST(GlmDsa, ASpanStartingAtABlockThatReusesASelectionGetsItWithTheRows) {
  if (!std::filesystem::exists(ref_path())) GTEST_SKIP() << "reference set absent: " << ref_path();
  auto m = Model::load(ref_path());
  ASSERT_TRUE(m.is_ok()) << m.status().to_string();
  const Model& model = **m;
  const HParams& hp = model.hparams();
  const int64_t D = hp.n_embd, W1 = hp.span_row_width(1), W = hp.max_span_row_width();
  auto ctx_for = [&](int first, int last) {
    ContextParams cp{1, 64, nullptr};
    cp.layers = LayerSpan{first, last};
    return std::make_unique<Context>(model, cp);
  };
  auto whole = ctx_for(0, 2), front = ctx_for(0, 0), back = ctx_for(1, 2);
  const std::vector<int32_t> prompt = {5, 77, 300, 12, 9, 401, 250, 33, 18, 97, 123, 64};
  int64_t pos = 0;
  auto step = [&](const std::vector<int32_t>& toks) {
    const int64_t T = static_cast<int64_t>(toks.size());
    std::vector<Context::LayerToken> lt(static_cast<size_t>(T));
    std::vector<float> a(static_cast<size_t>(T * W)), b(static_cast<size_t>(T * W));
    // Rows are packed [T][width]: the embeddings enter block 0 at width span_row_width(0) = D.
    for (int64_t t = 0; t < T; ++t) {
      lt[static_cast<size_t>(t)] = {0, pos + t, false};
      get_row_f32(model.tok_embd, toks[static_cast<size_t>(t)], a.data() + t * D);
    }
    b = a;
    ASSERT_TRUE(whole->decode_layers(lt, 0, 2, b.data()).is_ok());
    ASSERT_TRUE(front->decode_layers(lt, 0, 0, a.data()).is_ok());
    // The selection crossed: each token keeps min(top_k, visible) positions.
    for (int64_t t = 0; t < T; ++t) {
      EXPECT_EQ(a[static_cast<size_t>(t * W1 + D)], static_cast<float>(std::min<int64_t>(6, pos + t + 1)));
    }
    ASSERT_TRUE(back->decode_layers(lt, 1, 2, a.data()).is_ok());
    EXPECT_EQ(std::memcmp(a.data(), b.data(), static_cast<size_t>(T * D) * sizeof(float)), 0) << "at " << pos;
    pos += T;
  };
  ASSERT_NO_FATAL_FAILURE(step(prompt));
  for (int32_t tok : {41, 7, 300}) ASSERT_NO_FATAL_FAILURE(step({tok}));

  // Hostile rows into block 1: a count above top_k, a position the sequence does not hold, one
  // in the token's future, one too large for any int, NaN. Each is refused naming the token; the
  // peer keeps no cell of it.
  std::vector<float> rows(static_cast<size_t>(W));
  get_row_f32(model.tok_embd, 3, rows.data());
  const std::vector<Context::LayerToken> one = {{0, pos, false}};
  const int64_t held = back->state().seq_len(0);
  const float second[] = {1.0f, 1000.0f, static_cast<float>(pos + 1), 1e30f, std::nanf("")};
  for (int bad = 0; bad < 5; ++bad) {
    std::vector<float> r = rows;
    r[static_cast<size_t>(D)] = bad == 0 ? 7.0f : 2.0f;
    r[static_cast<size_t>(D + 1)] = 0.0f;
    r[static_cast<size_t>(D + 2)] = second[bad];
    Status st = back->decode_layers(one, 1, 2, r.data());
    ASSERT_FALSE(st.is_ok()) << bad;
    EXPECT_NE(st.message().find("token 0"), std::string::npos) << st.to_string();
    EXPECT_EQ(back->state().seq_len(0), held) << bad;
  }
}

TEST(GlmDsa, BlocksWithoutAnEarlierIndexerAreRefused) {
  if (!std::filesystem::exists(ref_path())) GTEST_SKIP() << "reference set absent: " << ref_path();
  const std::string path =
      with_keys("types-010.gguf", {{"glm-dsa.attention.indexer.types", gguf::Value::i32_array({0, 1, 0})}});
  auto m = Model::load(path);
  ASSERT_FALSE(m.is_ok());
  EXPECT_NE(m.status().message().find("block 0 reuses"), std::string::npos) << m.status().to_string();
  const std::string bad =
      with_keys("types-2.gguf", {{"glm-dsa.attention.indexer.types", gguf::Value::i32_array({1, 2, 1})}});
  EXPECT_FALSE(Model::load(bad).is_ok());
}

// seq64 of the reference: with top_k = the context (every cell kept) positions 0-5 are the same
// bits (fewer than 6 cells visible: the sparse run keeps them all too), later ones differ.
TEST(GlmDsa, TheSelectionDropsContextFromTopKCellsOn) {
  if (!std::filesystem::exists(ref_path())) GTEST_SKIP() << "reference set absent: " << ref_path();
  const auto seqs =
      testing::parse_sequences(testing::load_json(testing::reference_dir() + "/archs2/glmdsa-a.Q8_0.logits.json"));
  ASSERT_EQ(seqs.size(), 2u);
  const std::vector<int32_t>& toks = seqs[1].tokens;
  auto sparse = Model::load(ref_path());
  auto dense = Model::load(with_keys("dense.gguf", {{"glm-dsa.attention.indexer.top_k", gguf::Value::u32(256)}}));
  ASSERT_TRUE(sparse.is_ok() && dense.is_ok());
  const int64_t V = (*sparse)->hparams().n_vocab;
  const std::vector<float> a = logits_of(**sparse, toks), b = logits_of(**dense, toks);
  int differing = 0;
  for (size_t t = 0; t < toks.size(); ++t) {
    const bool same = std::equal(a.begin() + static_cast<int64_t>(t) * V, a.begin() + static_cast<int64_t>(t + 1) * V,
                                 b.begin() + static_cast<int64_t>(t) * V);
    if (t < 6) {
      EXPECT_TRUE(same) << "position " << t;
    } else {
      differing += same ? 0 : 1;
    }
  }
  EXPECT_EQ(differing, static_cast<int>(toks.size()) - 6);
}

}  // namespace
}  // namespace moesh
