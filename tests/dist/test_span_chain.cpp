// Chained spans through real `moesh span` processes on 127.0.0.1 (docs/span.md "Chained
// spans"): the backbone sends a step to the first of several adjacent spans' peers only, each peer
// passes its rows on to the next, and the backbone collects every span's result with SPAN_AWAIT.
// The bits must equal all-local (and star) in every case — prompts, token by token, several
// sequences per step, speculative rollback, prefix copies, every architecture — and the structure
// must be what the chain promises: one head trip per step plus one await per later span, rows
// passed peer to peer (each peer's own count), and a chain that breaks (a killed peer, a peer that
// does not chain) finished star-style with failover and replay, the output unchanged.
#include <gtest/gtest.h>
#include <signal.h>

#include <filesystem>
#include <regex>

#include "dist/span_test_util.h"
#include "util/run_moesh.h"

namespace moesh::test {
namespace {

// What a span peer says it did when it stops (SIGTERM): "chained: R received from a peer, P
// passed on (F failed), A awaits".
struct ChainCounts {
  int received = -1, passed = -1, failed = -1, awaits = -1;
};
ChainCounts stop_and_count(WorkerProcess& p) {
  ::kill(p.pid(), SIGTERM);
  const std::regex re(R"(chained: (\d+) received from a peer, (\d+) passed on \((\d+) failed\), (\d+) awaits)");
  for (int i = 0; i < 200; ++i) {
    std::smatch mt;
    const std::string out = p.output();
    if (std::regex_search(out, mt, re)) {
      return {std::stoi(mt[1]), std::stoi(mt[2]), std::stoi(mt[3]), std::stoi(mt[4])};
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ADD_FAILURE() << "no chain counts in the span peer's output:\n" << p.output();
  return {};
}

// Three adjacent spans covering every block: a prompt then 6 tokens, chained and star; both give
// the all-local bits. Chained, each pass is one head trip plus two awaits, every span step is
// completed inside the chain, and the rows went peer to peer: the first peer passed on 7 steps,
// the second received and passed on 7, the last received 7.
TEST(SpanChain, ThreeChainedPeersGiveTheLocalBitsInOneHeadTripPerStep) {
  const std::string path = six_block_model();
  auto model = Model::load(path);
  ASSERT_TRUE(model.is_ok()) << model.status().to_string();
  const Model& m = **model;
  auto a = spawn_span(path, "0-1");
  auto b = spawn_span(path, "2-3");
  auto c = spawn_span(path, "4-5");
  ASSERT_TRUE(a.is_ok() && b.is_ok() && c.is_ok());
  const std::vector<int32_t> prompt = test_tokens(path, m.hparams().n_vocab, 10);
  Context local = make_ctx(m, nullptr);
  const std::vector<float> want = greedy_rows(local, prompt, 6);

  auto chained = connect_spans(m, {target(0, 1, {a->get()}), target(2, 3, {b->get()}), target(4, 5, {c->get()})},
                               /*fallback=*/false, SpanChainMode::kOn);
  ASSERT_NE(chained, nullptr);
  Context ctx = make_ctx(m, chained);
  EXPECT_TRUE(same_bits(greedy_rows(ctx, prompt, 6), want));
  const SpanStats s = chained->stats();
  EXPECT_EQ(s.steps, 21u);  // 7 passes x 3 spans
  EXPECT_EQ(s.chains, 7u);
  EXPECT_EQ(s.chained_steps, 21u);
  EXPECT_EQ(s.awaits, 14u);
  EXPECT_EQ(s.trips, 21u);  // 7 head trips + 14 awaits
  EXPECT_EQ(s.chain_breaks, 0u);
  EXPECT_EQ(s.resends, 0u);
  EXPECT_EQ(s.replayed_rows, 0u);
  EXPECT_EQ(s.failovers, 0u);

  // The same peers star-style: the same bits, no chain (their sequences are the backbone's own
  // again: a new SpanClient starts new sequences from cell 0).
  auto star = connect_spans(m, {target(0, 1, {a->get()}), target(2, 3, {b->get()}), target(4, 5, {c->get()})},
                            /*fallback=*/false, SpanChainMode::kOff);
  ASSERT_NE(star, nullptr);
  Context sctx = make_ctx(m, star);
  EXPECT_TRUE(same_bits(greedy_rows(sctx, prompt, 6, /*seq=*/3), want));
  EXPECT_EQ(star->stats().chains, 0u);
  EXPECT_EQ(star->stats().trips, 21u);

  const ChainCounts ca = stop_and_count(**a), cb = stop_and_count(**b), cc = stop_and_count(**c);
  EXPECT_EQ(ca.received, 0);
  EXPECT_EQ(ca.passed, 7);
  EXPECT_EQ(cb.received, 7);
  EXPECT_EQ(cb.passed, 7);
  EXPECT_EQ(cb.awaits, 7);
  EXPECT_EQ(cc.received, 7);
  EXPECT_EQ(cc.passed, 0);
  EXPECT_EQ(cc.awaits, 7);
  EXPECT_EQ(ca.failed + cb.failed + cc.failed, 0);
}

// Several sequences of different lengths in one chained step, speculative decoding (every draft
// rejected: a rollback on every span each step; every draft kept), and a prefix copy: all equal
// to all-local, and the rollbacks do not stop the chain (a peer holding more cells than the step
// starts from cuts back, as star-style).
TEST(SpanChain, SequencesDraftsAndPrefixCopiesStayExactAcrossAChain) {
  const std::string path = six_block_model();
  auto model = Model::load(path);
  ASSERT_TRUE(model.is_ok());
  const Model& m = **model;
  const int64_t V = m.hparams().n_vocab;
  auto a = spawn_span(path, "1-2");
  auto b = spawn_span(path, "3-4");
  ASSERT_TRUE(a.is_ok() && b.is_ok());
  // The log in its file: rollbacks cut spilled chunks, prefix copies share them.
  auto spans = connect_spans(m, {target(1, 2, {a->get()}), target(3, 4, {b->get()})}, /*fallback=*/false,
                             SpanChainMode::kOn, /*spill_log=*/true);
  ASSERT_NE(spans, nullptr);
  Context ctx = make_ctx(m, spans);
  Context local = make_ctx(m, nullptr);
  const std::vector<std::vector<int32_t>> prompts = {{5, 6, 7}, {40, 41, 42, 43, 44}, {9}};
  for (int32_t s = 0; s < 3; ++s) {
    std::vector<float> lg(prompts[s].size() * V), lg2(prompts[s].size() * V);
    ASSERT_TRUE(ctx.decode(s, prompts[s].data(), static_cast<int64_t>(prompts[s].size()), lg.data()).is_ok());
    ASSERT_TRUE(local.decode(s, prompts[s].data(), static_cast<int64_t>(prompts[s].size()), lg2.data()).is_ok());
    EXPECT_TRUE(same_bits(lg, lg2)) << "prompt of sequence " << s;
  }
  for (int step = 0; step < 2; ++step) {
    std::vector<Context::BatchToken> batch = {
        {0, 11 + step, true}, {1, 12 + step, true}, {2, 13 + step, false}, {2, 14 + step, true}};
    std::vector<float> lg(3 * V), lg2(3 * V);
    ASSERT_TRUE(ctx.decode_batch(batch, lg.data()).is_ok());
    ASSERT_TRUE(local.decode_batch(batch, lg2.data()).is_ok());
    EXPECT_TRUE(same_bits(lg, lg2)) << "step " << step;
  }
  // A prefix copy on the backbone: the peers find it by its chain, inside the chain too.
  ASSERT_TRUE(ctx.state().copy(1, 7, 4).is_ok());
  ASSERT_TRUE(local.state().copy(1, 7, 4).is_ok());
  const std::vector<int32_t> tail = {70, 71};
  std::vector<float> t1(2 * V), t2(2 * V);
  ASSERT_TRUE(ctx.decode(7, tail.data(), 2, t1.data()).is_ok());
  ASSERT_TRUE(local.decode(7, tail.data(), 2, t2.data()).is_ok());
  EXPECT_TRUE(same_bits(t1, t2));
  const SpanStats mid = spans->stats();
  EXPECT_EQ(mid.chains, 3u + 2u + 1u);  // every pass chained: 3 prompts, 2 mixed steps, the copy's tail
  EXPECT_EQ(mid.chain_breaks, 0u);
  EXPECT_EQ(mid.replayed_rows, 0u);

  const std::vector<int32_t> prompt = test_tokens(path, static_cast<int32_t>(V), 8);
  const int n = 10;
  Context plain_ctx = make_ctx(m, nullptr);
  const std::vector<int32_t> truth = speculative_greedy(plain_ctx, prompt, n, nullptr);
  for (bool wrong : {true, false}) {
    FixedDraft draft(truth, prompt.size(), static_cast<int32_t>(V), wrong);
    Context sctx = make_ctx(m, spans);
    EXPECT_EQ(speculative_greedy(sctx, prompt, n, &draft), truth) << draft.name();
  }
  const SpanStats s = spans->stats();
  EXPECT_EQ(s.chains * 2, s.steps) << "every pass ran both spans as one chain";
  EXPECT_EQ(s.chain_breaks, 0u);
  EXPECT_EQ(s.failovers, 0u);
  const RowStoreStats ls = spans->log_stats();
  EXPECT_GT(ls.spilled_chunks, 10u);
  EXPECT_GT(ls.read_back_chunks, 0u);  // rejected drafts cut chunks that were in the file
  EXPECT_TRUE(ls.spill_error.empty()) << ls.spill_error;
}

// A peer in the middle of the chain killed mid-generation: its predecessor cannot pass its rows
// on (or the backbone's await fails), the chain is finished star-style, the span fails over to
// its replacement with its inputs replayed, and later steps chain through the replacement. Then
// the last peer dies with no replacement: its blocks run here and the chain shrinks to the peers
// left. The output equals all-local throughout.
TEST(SpanChain, AKilledPeerBreaksTheChainAndIsReplacedWithTheSameOutput) {
  const std::string path = six_block_model();
  auto model = Model::load(path);
  ASSERT_TRUE(model.is_ok());
  const Model& m = **model;
  const int64_t V = m.hparams().n_vocab;
  auto a = spawn_span(path, "0-1");
  auto b = spawn_span(path, "2-3");
  auto b2 = spawn_span(path, "2-3");
  auto c = spawn_span(path, "4-5");
  ASSERT_TRUE(a.is_ok() && b.is_ok() && b2.is_ok() && c.is_ok());
  auto spans =
      connect_spans(m, {target(0, 1, {a->get()}), target(2, 3, {b->get(), b2->get()}), target(4, 5, {c->get()})},
                    /*fallback=*/true, SpanChainMode::kOn, /*spill_log=*/true);  // replays read from the file
  ASSERT_NE(spans, nullptr);
  Context ctx = make_ctx(m, spans);
  Context local = make_ctx(m, nullptr);
  const std::vector<int32_t> prompt = {8, 16, 32, 64, 128, 3};
  std::vector<float> x(prompt.size() * V), y(prompt.size() * V);
  ASSERT_TRUE(ctx.decode(0, prompt.data(), 6, x.data()).is_ok());
  ASSERT_TRUE(local.decode(0, prompt.data(), 6, y.data()).is_ok());
  ASSERT_TRUE(same_bits(x, y));
  int32_t t = 1;
  uint64_t chains_at_kill = 0;
  for (int i = 0; i < 12; ++i) {
    if (i == 3) {
      (*b)->kill_now();  // the middle peer dies
      chains_at_kill = spans->stats().chains;
    }
    if (i == 8) (*c)->kill_now();  // the last one, with no replacement
    ASSERT_NO_FATAL_FAILURE(step_both(ctx, local, &t, i));
  }
  const SpanStats s = spans->stats();
  EXPECT_EQ(s.failovers, 2u);     // 2-3 to its replacement, 4-5 to this process
  EXPECT_GE(s.chain_breaks, 2u);  // once per death
  EXPECT_EQ(s.local_steps, 4u);   // tokens 8..11 of span 4-5 ran here
  EXPECT_GT(s.chains, chains_at_kill + 3) << "the replacement chains again";
  EXPECT_NE(spans->where(1).find((*b2)->address().to_string()), std::string::npos) << spans->where(1);
  EXPECT_EQ(spans->where(2), "4-5 here");
  // The replacement got the 6 + 3 cells before it (replayed once), this process the 6 + 8.
  EXPECT_EQ(s.replayed_rows, 9u + 14u);
  EXPECT_EQ(spans->log_stats().read_back_chunks, 4u + 7u);  // their full chunks, from the log's file
  EXPECT_EQ(spans->log_stats().memory_bytes, 0u);
}

// A peer started with --no-chain does not offer the feature: the backbone keeps star trips for
// the spans around it, with the same bits. `moesh run --span-chain on` prints the all-local
// tokens and the chain counts; a bad mode is refused.
TEST(SpanChain, APeerThatDoesNotChainGetsStarTripsAndTheCliReportsChains) {
  const std::string path = six_block_model();
  auto model = Model::load(path);
  ASSERT_TRUE(model.is_ok());
  const Model& m = **model;
  auto a = spawn_span(path, "1-2");
  auto b = spawn_span(path, "3-5", {"--no-chain"});
  ASSERT_TRUE(a.is_ok() && b.is_ok());
  auto spans =
      connect_spans(m, {target(1, 2, {a->get()}), target(3, 5, {b->get()})}, /*fallback=*/false, SpanChainMode::kOn);
  ASSERT_NE(spans, nullptr);
  const std::vector<int32_t> prompt = {4, 5, 6, 7};
  Context ctx = make_ctx(m, spans);
  Context local = make_ctx(m, nullptr);
  EXPECT_TRUE(same_bits(greedy_rows(ctx, prompt, 3), greedy_rows(local, prompt, 3)));
  EXPECT_EQ(spans->stats().chains, 0u);
  EXPECT_EQ(spans->stats().trips, 8u);  // 4 passes x 2 spans, star

  auto c = spawn_span(path, "3-5");
  ASSERT_TRUE(c.is_ok());
  const std::string common = "run -m " + quoted(path) + " --tokens 5,6,7,8 -n 8 -t 1 --json";
  RunResult plain = run_moesh(common);
  RunResult chained = run_moesh(common + " --span 1-2@" + (*a)->address().to_string() + " --span 3-5@" +
                                (*c)->address().to_string() + " --span-chain on");
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  ASSERT_EQ(chained.exit_code, 0) << chained.err;
  auto pj = nlohmann::json::parse(plain.out, nullptr, false);
  auto cj = nlohmann::json::parse(chained.out, nullptr, false);
  ASSERT_FALSE(pj.is_discarded()) << plain.out;
  ASSERT_FALSE(cj.is_discarded()) << chained.out;
  EXPECT_EQ(pj["tokens"], cj["tokens"]);
  EXPECT_EQ(cj["spans"]["chains"], 8);  // 8 passes, each one chain of both spans
  EXPECT_EQ(cj["spans"]["awaits"], 8);
  EXPECT_EQ(cj["spans"]["trips"], 16);
  EXPECT_EQ(cj["spans"]["chain_breaks"], 0);
  RunResult bad = run_moesh(common + " --span 1-2@" + (*a)->address().to_string() + " --span-chain sometimes");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.err.find("--span-chain 'sometimes' is not off, on or auto"), std::string::npos) << bad.err;
}

// Every architecture of the reference set with its blocks from the first MoE block on cut into
// two adjacent spans (where both halves hold a MoE block): batch and incremental logits and
// speculative greedy through the chain equal all-local.
TEST(SpanChain, EveryArchitectureIsExactThroughAChain) {
  const std::vector<std::string> files = {
      "qwen3moe-s.Q8_0.gguf",        "mixtral-s.Q8_0.gguf",         "deepseek2-s.Q8_0.gguf",
      "archs/glm4moe-a.Q8_0.gguf",   "archs/gptoss-a.Q8_0.gguf",    "archs/llama4-a.Q8_0.gguf",
      "archs/minimaxm2-a.Q8_0.gguf", "archs/qwen35moe-a.Q8_0.gguf", "archs/qwen3next-a.Q8_0.gguf",
      "archs2/step35-a.Q8_0.gguf",   "archs2/glmdsa-a.Q8_0.gguf",   "archs2/minimaxm3-a.Q8_0.gguf",
      "archs2/kimik3-a.Q8_0.gguf"};
  if (!std::filesystem::exists(reference_path(files[0]))) GTEST_SKIP() << "no reference set at " << MOESH_REFERENCE_DIR;
  int chained_archs = 0;
  for (const std::string& f : files) {
    SCOPED_TRACE(f);
    const std::string path = reference_path(f);
    auto model = Model::load(path);
    ASSERT_TRUE(model.is_ok()) << model.status().to_string();
    const Model& m = **model;
    const int n_layer = static_cast<int>(m.hparams().n_layer);
    std::vector<int> moe;
    for (int l = 0; l < n_layer; ++l) {
      if (m.layers[static_cast<size_t>(l)].is_moe) moe.push_back(l);
    }
    if (moe.size() < 2) continue;  // one span at most: nothing to chain
    // glm-dsa: the first span starts at block 1, which reuses block 0's indexer selection (it
    // crosses with the rows).
    const int first = moe.front(), split = moe[moe.size() / 2];
    auto p1 = spawn_span(path, std::to_string(first) + "-" + std::to_string(split - 1));
    auto p2 = spawn_span(path, std::to_string(split) + "-" + std::to_string(n_layer - 1));
    ASSERT_TRUE(p1.is_ok() && p2.is_ok());
    auto spans = connect_spans(m, {target(first, split - 1, {p1->get()}), target(split, n_layer - 1, {p2->get()})},
                               /*fallback=*/false, SpanChainMode::kOn);
    ASSERT_NE(spans, nullptr);
    const std::vector<int32_t> prompt = test_tokens(path, m.hparams().n_vocab, 8);
    Context local = make_ctx(m, nullptr);
    Context ctx = make_ctx(m, spans);
    EXPECT_TRUE(same_bits(greedy_rows(ctx, prompt, 4), greedy_rows(local, prompt, 4)));
    const int n = 8;
    Context plain_ctx = make_ctx(m, nullptr);
    const std::vector<int32_t> truth = speculative_greedy(plain_ctx, prompt, n, nullptr);
    for (bool wrong : {true, false}) {
      FixedDraft draft(truth, prompt.size(), static_cast<int32_t>(m.hparams().n_vocab), wrong);
      Context sctx = make_ctx(m, spans);
      EXPECT_EQ(speculative_greedy(sctx, prompt, n, &draft), truth) << draft.name();
    }
    const SpanStats s = spans->stats();
    EXPECT_GT(s.chains, 0u);
    EXPECT_EQ(s.failovers, 0u);
    ++chained_archs;
  }
  EXPECT_GE(chained_archs, 5) << "too few reference models have two MoE blocks after block 0";
}

}  // namespace
}  // namespace moesh::test
