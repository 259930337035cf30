// Multi-sequence batches (Context::decode_batch, the base of continuous batching) against each
// sequence run alone, for every architecture, bit for bit:
//  * prompts of several sequences prefilled together (interleaved in the batch), then decode
//    steps with one token per sequence, equal the same sequences decoded one after the other;
//  * a step mixing a prompt chunk of one sequence with decode tokens of others;
//  * a failed step (token out of range, context overflow of one sequence) leaves every
//    sequence's cells as they were (lengths, and contents: continuing gives the same bits);
//  * SequenceState::copy of a prefix then continuing equals computing the whole sequence;
//  * cutting back to any length (Context::rewind) is exact, hybrids' recurrent state included.
#include <gtest/gtest.h>

#include <cctype>
#include <cstring>
#include <filesystem>
#include <map>
#include <random>

#include "moesh/make_model/make_model.h"
#include "moesh/model/model.h"
#include "moesh/model/sampling.h"

namespace moesh {
namespace {

std::string model_path(const std::string& arch) {
  static std::map<std::string, std::string> cache;
  auto it = cache.find(arch);
  if (it != cache.end()) return it->second;
  const auto dir = std::filesystem::temp_directory_path() / ("moesh-batch-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  MakeModelSpec s;
  EXPECT_TRUE(MakeModelSpec::defaults_for_name(arch, &s)) << arch;
  s.type = MakeFileType::kQ8_0;
  s.n_ctx = 128;
  const std::string path = (dir / (arch + ".gguf")).string();
  Status st = make_model(s, path);
  EXPECT_TRUE(st.is_ok()) << st.to_string();
  cache[arch] = path;
  return path;
}

std::vector<int32_t> random_tokens(int64_t n_vocab, size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> v(n);
  for (auto& t : v) t = static_cast<int32_t>(rng() % static_cast<uint64_t>(n_vocab));
  return v;
}

using Rows = std::vector<std::vector<float>>;

// Greedy generation of one sequence alone: the logits row after the prompt and after each step.
Rows run_alone(const Model& m, const std::vector<int32_t>& prompt, int steps, int threads) {
  const int64_t V = m.hparams().n_vocab;
  Context ctx(m, ContextParams{threads, 128, nullptr});
  Rows rows;
  std::vector<float> lg(static_cast<size_t>(V));
  EXPECT_TRUE(ctx.decode(5, prompt.data(), static_cast<int64_t>(prompt.size()), lg.data(), false).is_ok());
  rows.push_back(lg);
  for (int s = 0; s < steps; ++s) {
    const int32_t t = argmax(lg.data(), V);
    EXPECT_TRUE(ctx.decode(5, &t, 1, lg.data(), false).is_ok());
    rows.push_back(lg);
  }
  return rows;
}

class Batch : public ::testing::TestWithParam<std::string> {};

TEST_P(Batch, InterleavedSequencesEqualEachAlone) {
  auto m = Model::load(model_path(GetParam()));
  ASSERT_TRUE(m.is_ok()) << m.status().to_string();
  const Model& model = **m;
  const int64_t V = model.hparams().n_vocab;
  const std::vector<std::vector<int32_t>> prompts = {random_tokens(V, 7, 1), random_tokens(V, 3, 2),
                                                     random_tokens(V, 12, 3), random_tokens(V, 1, 4)};
  const int steps = 6;
  std::vector<Rows> alone;
  for (const auto& p : prompts) alone.push_back(run_alone(model, p, steps, 1));

  for (int threads : {1, 2}) {
    Context ctx(model, ContextParams{threads, 128, nullptr});
    // Prefill all prompts in one batch, tokens of different sequences interleaved round-robin.
    std::vector<Context::BatchToken> batch;
    std::vector<size_t> next(prompts.size(), 0);
    std::vector<int> row_of(prompts.size(), -1);
    for (bool any = true; any;) {
      any = false;
      for (size_t s = 0; s < prompts.size(); ++s) {
        if (next[s] == prompts[s].size()) continue;
        any = true;
        const bool last = next[s] + 1 == prompts[s].size();
        if (last)
          row_of[s] = static_cast<int>(std::count_if(batch.begin(), batch.end(), [](auto& b) { return b.logits; }));
        batch.push_back({static_cast<int32_t>(10 + s), prompts[s][next[s]++], last});
      }
    }
    std::vector<float> lg(prompts.size() * static_cast<size_t>(V));
    ASSERT_TRUE(ctx.decode_batch(batch, lg.data()).is_ok());
    std::vector<int32_t> last_tok(prompts.size());
    for (size_t s = 0; s < prompts.size(); ++s) {
      const float* row = lg.data() + static_cast<size_t>(row_of[s]) * V;
      EXPECT_EQ(0, std::memcmp(row, alone[s][0].data(), V * sizeof(float)))
          << "prefill logits of sequence " << s << " differ (threads " << threads << ")";
      last_tok[s] = argmax(row, V);
    }
    // Decode steps: one token per sequence, in reverse order for good measure.
    for (int step = 1; step <= steps; ++step) {
      batch.clear();
      for (size_t s = prompts.size(); s-- > 0;) batch.push_back({static_cast<int32_t>(10 + s), last_tok[s], true});
      ASSERT_TRUE(ctx.decode_batch(batch, lg.data()).is_ok());
      for (size_t j = 0; j < batch.size(); ++j) {
        const size_t s = prompts.size() - 1 - j;
        const float* row = lg.data() + j * V;
        EXPECT_EQ(0, std::memcmp(row, alone[s][step].data(), V * sizeof(float)))
            << "step " << step << " sequence " << s << " differs (threads " << threads << ")";
        last_tok[s] = argmax(row, V);
      }
    }
  }
}

TEST_P(Batch, PromptChunkMixedWithDecodeTokens) {
  auto m = Model::load(model_path(GetParam()));
  ASSERT_TRUE(m.is_ok()) << m.status().to_string();
  const Model& model = **m;
  const int64_t V = model.hparams().n_vocab;
  const auto a = random_tokens(V, 5, 11), b = random_tokens(V, 9, 12);
  const Rows a_alone = run_alone(model, a, 3, 2);
  const Rows b_alone = run_alone(model, b, 0, 2);

  Context ctx(model, ContextParams{2, 128, nullptr});
  std::vector<float> lg(2 * static_cast<size_t>(V));
  ASSERT_TRUE(ctx.decode(0, a.data(), 5, lg.data(), false).is_ok());
  int32_t ta = argmax(lg.data(), V);
  // Steps: a decodes one token while b's prompt arrives in chunks of 4, 4 and 1.
  size_t off = 0;
  for (int step = 1; step <= 3; ++step) {
    std::vector<Context::BatchToken> batch = {{0, ta, true}};
    const size_t n = std::min<size_t>(4, b.size() - off);
    for (size_t i = 0; i < n; ++i) batch.push_back({1, b[off + i], off + i + 1 == b.size()});
    off += n;
    ASSERT_TRUE(ctx.decode_batch(batch, lg.data()).is_ok());
    EXPECT_EQ(0, std::memcmp(lg.data(), a_alone[step].data(), V * sizeof(float))) << "step " << step;
    ta = argmax(lg.data(), V);
    if (off == b.size()) {
      EXPECT_EQ(0, std::memcmp(lg.data() + V, b_alone[0].data(), V * sizeof(float)))
          << "chunked prompt differs from the prompt in one batch";
    }
  }
  EXPECT_EQ(off, b.size());
}

TEST_P(Batch, FailedStepLeavesEverySequenceAsItWas) {
  auto m = Model::load(model_path(GetParam()));
  ASSERT_TRUE(m.is_ok()) << m.status().to_string();
  const Model& model = **m;
  const int64_t V = model.hparams().n_vocab;
  Context ctx(model, ContextParams{1, 16, nullptr});
  const auto a = random_tokens(V, 4, 21), b = random_tokens(V, 14, 22);
  ASSERT_TRUE(ctx.decode(0, a.data(), 4, nullptr).is_ok());
  ASSERT_TRUE(ctx.decode(1, b.data(), 14, nullptr).is_ok());
  // Bad token id: rejected before anything is touched.
  std::vector<Context::BatchToken> bad = {{0, 1, false}, {1, static_cast<int32_t>(V), false}};
  Status st = ctx.decode_batch(bad, nullptr);
  EXPECT_EQ(st.code(), StatusCode::kOutOfRange) << st.to_string();
  EXPECT_EQ(ctx.kv().seq_len(0), 4);
  EXPECT_EQ(ctx.kv().seq_len(1), 14);
  // Sequence 1 would overflow its 16 cells: sequence 0's append must be undone too.
  std::vector<Context::BatchToken> over = {{0, 1, false}, {0, 2, false}, {1, 3, false}, {1, 4, false}, {1, 5, false}};
  st = ctx.decode_batch(over, nullptr);
  EXPECT_EQ(st.code(), StatusCode::kOutOfRange) << st.to_string();
  EXPECT_EQ(ctx.kv().seq_len(0), 4);
  EXPECT_EQ(ctx.kv().seq_len(1), 14);
  // Logits asked for without a buffer.
  std::vector<Context::BatchToken> nobuf = {{0, 1, true}};
  EXPECT_EQ(ctx.decode_batch(nobuf, nullptr).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ctx.decode_batch(std::span<const Context::BatchToken>{}, nullptr).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ctx.kv().seq_len(0), 4);
  EXPECT_EQ(ctx.kv().seq_len(1), 14);

  // Not just the lengths: the cells' contents are as they were. Both sequences continue
  // bit-identically to a context that never saw the failed steps (sequence 1 up to its last cell).
  Context ref(model, ContextParams{1, 16, nullptr});
  ASSERT_TRUE(ref.decode(0, a.data(), 4, nullptr).is_ok());
  ASSERT_TRUE(ref.decode(1, b.data(), 14, nullptr).is_ok());
  const auto a_next = random_tokens(V, 3, 23), b_next = random_tokens(V, 2, 24);
  for (auto [seq, toks] : {std::pair{0, &a_next}, std::pair{1, &b_next}}) {
    const int64_t n = static_cast<int64_t>(toks->size());
    std::vector<float> got(static_cast<size_t>(n * V)), want(got.size());
    ASSERT_TRUE(ctx.decode(seq, toks->data(), n, got.data()).is_ok());
    ASSERT_TRUE(ref.decode(seq, toks->data(), n, want.data()).is_ok());
    EXPECT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * sizeof(float)))
        << "sequence " << seq << " continues differently after the failed steps";
  }
  EXPECT_EQ(ctx.kv().seq_len(1), 16);
}

TEST_P(Batch, CopiedPrefixContinuesLikeTheWholeSequence) {
  auto m = Model::load(model_path(GetParam()));
  ASSERT_TRUE(m.is_ok()) << m.status().to_string();
  const Model& model = **m;
  const int64_t V = model.hparams().n_vocab;
  auto full = random_tokens(V, 10, 31);
  const Rows whole = run_alone(model, full, 2, 1);

  Context ctx(model, ContextParams{1, 128, nullptr});
  // Sequence 3 holds a different continuation after a 6-token shared prefix.
  std::vector<int32_t> other(full.begin(), full.begin() + 6);
  other.push_back(static_cast<int32_t>((full[6] + 1) % V));
  // In two steps, so a recurrent state (hybrids) has a checkpoint at the shared prefix's end.
  ASSERT_TRUE(ctx.decode(3, other.data(), 6, nullptr).is_ok());
  ASSERT_TRUE(ctx.decode(3, other.data() + 6, 1, nullptr).is_ok());
  EXPECT_EQ(ctx.state().restorable(3, 6), 6);
  ASSERT_TRUE(ctx.state().copy(3, 8, 6).is_ok());
  EXPECT_EQ(ctx.kv().seq_len(8), 6);
  std::vector<float> lg(static_cast<size_t>(V));
  ASSERT_TRUE(ctx.decode(8, full.data() + 6, 4, lg.data(), false).is_ok());
  EXPECT_EQ(0, std::memcmp(lg.data(), whole[0].data(), V * sizeof(float)));
  // The source is untouched: its length, and its cells (it continues like sequence `other`
  // computed alone, bit for bit).
  EXPECT_EQ(ctx.kv().seq_len(3), 7);
  {
    std::vector<int32_t> other_cont = other;
    other_cont.push_back(full[7]);
    const Rows other_alone = run_alone(model, other_cont, 0, 1);
    ASSERT_TRUE(ctx.decode(3, &full[7], 1, lg.data(), false).is_ok());
    EXPECT_EQ(0, std::memcmp(lg.data(), other_alone[0].data(), V * sizeof(float)))
        << "the copy's source continues differently";
  }
  EXPECT_EQ(ctx.state().copy(3, 8, 9).code(), StatusCode::kOutOfRange);
  EXPECT_EQ(ctx.state().copy(3, 3, 1).code(), StatusCode::kInvalidArgument);
}

// Cutting a sequence back to any length is exact: KV cells are cut there; a recurrent state
// (hybrids) without a checkpoint there is refused by truncate() and rewound by Context::rewind(),
// which restores the nearest checkpoint and recomputes the tokens after it.
TEST_P(Batch, RewindToAnyLengthIsExact) {
  auto m = Model::load(model_path(GetParam()));
  ASSERT_TRUE(m.is_ok()) << m.status().to_string();
  const Model& model = **m;
  const int64_t V = model.hparams().n_vocab;
  const bool hybrid = model.hparams().n_rec_layer > 0;
  const auto full = random_tokens(V, 12, 41);
  std::vector<float> whole(static_cast<size_t>(12 * V));
  {
    Context ref(model, ContextParams{1, 128, nullptr});
    ASSERT_TRUE(ref.decode(0, full.data(), 12, whole.data()).is_ok());
  }
  Context ctx(model, ContextParams{1, 128, nullptr});
  ASSERT_TRUE(ctx.decode(0, full.data(), 12, nullptr).is_ok());  // one step, no logits inside
  // KV cells can be cut anywhere; a recurrent state only where it kept a checkpoint (its end).
  EXPECT_EQ(ctx.state().restorable(0, 7), hybrid ? 0 : 7);
  if (hybrid) {
    EXPECT_EQ(ctx.state().truncate(0, 7).code(), StatusCode::kOutOfRange);
    EXPECT_EQ(ctx.state().seq_len(0), 12) << "a refused cut changes nothing";
    // Recomputing needs the tokens.
    EXPECT_EQ(ctx.rewind(0, 7, std::span<const int32_t>(full.data(), 3)).code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(ctx.state().seq_len(0), 12);
  }
  ASSERT_TRUE(ctx.rewind(0, 7, full).is_ok());
  EXPECT_EQ(ctx.state().seq_len(0), 7);
  std::vector<float> tail(static_cast<size_t>(5 * V));
  ASSERT_TRUE(ctx.decode(0, full.data() + 7, 5, tail.data()).is_ok());
  EXPECT_EQ(0, std::memcmp(tail.data(), whole.data() + 7 * V, tail.size() * sizeof(float)))
      << "continuing after the rewind differs from computing the whole sequence";
  // Where a checkpoint exists (the step's end), a plain cut is exact as well.
  ASSERT_TRUE(ctx.decode(0, full.data(), 3, nullptr).is_ok());  // junk after position 12
  ASSERT_TRUE(ctx.state().truncate(0, 12).is_ok());
  EXPECT_EQ(ctx.state().seq_len(0), 12);
}

// Where the weights live (mapped file pages or a huge-page copy) changes nothing in the bits.
TEST_P(Batch, MappedAndInMemoryWeightsGiveTheSameBits) {
  LoadOptions map, mem;
  map.memory = LoadOptions::Memory::kMap;
  mem.memory = LoadOptions::Memory::kMemory;
  auto a = Model::load(model_path(GetParam()), map);
  auto b = Model::load(model_path(GetParam()), mem);
  ASSERT_TRUE(a.is_ok() && b.is_ok());
  EXPECT_FALSE((*a)->file().in_memory());
  EXPECT_TRUE((*b)->file().in_memory());
  const auto prompt = random_tokens((*a)->hparams().n_vocab, 9, 31);
  EXPECT_EQ(run_alone(**a, prompt, 3, 2), run_alone(**b, prompt, 3, 2));
}

TEST(WeightMemory, AutoReadsWhatFitsAndMapsWhatDoesNot) {
  EXPECT_EQ(choose_file_load(LoadOptions::Memory::kMap, 1), gguf::FileLoad::kMap);
  EXPECT_EQ(choose_file_load(LoadOptions::Memory::kMemory, uint64_t{1} << 62), gguf::FileLoad::kMemory);
  EXPECT_EQ(choose_file_load(LoadOptions::Memory::kAuto, uint64_t{1} << 62), gguf::FileLoad::kMap)
      << "a file larger than the machine's memory is mapped";
  EXPECT_EQ(choose_file_load(LoadOptions::Memory::kAuto, 4096), gguf::FileLoad::kMemory);
}

// Every architecture make-model writes (the three built-in ones and the registry's).
INSTANTIATE_TEST_SUITE_P(Archs, Batch, ::testing::ValuesIn(make_arch_names()), [](const auto& info) {
  std::string n = info.param;
  for (char& c : n) c = std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
  return n;
});

}  // namespace
}  // namespace moesh
