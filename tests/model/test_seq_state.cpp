// The per-sequence state interface (include/moesh/model/seq_state.h) at unit level: the
// recurrent state's checkpoints (where a step keeps them, restore on truncate / abort, copy,
// pruning that keeps them spread), and ContextState cutting KV cells and recurrent state
// together or not at all. The model-level contracts (rollback and prefix copy of a hybrid equal
// computing from scratch, bit for bit) are in test_batch.cpp and test_speculative.cpp.
#include <gtest/gtest.h>

#include <algorithm>

#include "moesh/model/kv_cache.h"
#include "moesh/model/seq_state.h"

namespace moesh {
namespace {

constexpr int64_t kLayers = 2, kWidth = 3;

// What a fake layer `l` holds after the sequence's token number n (1-based): distinct per (n, l).
float value(int64_t n, int64_t l, int64_t i) {
  return static_cast<float>(n * 100 + l * 10 + i);
}

// Runs one step of n_new tokens through both fake layers, token by token as a mixer does.
void step(RecurrentState& rs, int32_t seq, int64_t n_new, const std::vector<uint8_t>& cut_after = {}) {
  const int64_t base = rs.seq_len(seq);
  rs.begin_step(seq, n_new, cut_after.empty() ? nullptr : cut_after.data());
  for (int64_t l = 0; l < kLayers; ++l) {
    for (int64_t j = 0; j < n_new; ++j) {
      float* s = rs.live(seq, l);
      for (int64_t i = 0; i < kWidth; ++i) s[i] = value(base + j + 1, l, i);
      rs.after_token(seq, l, base + j + 1);
    }
  }
  rs.commit_step(seq);
}

void expect_live(RecurrentState& rs, int32_t seq, int64_t n) {
  for (int64_t l = 0; l < kLayers; ++l) {
    for (int64_t i = 0; i < kWidth; ++i) {
      EXPECT_EQ(rs.live(seq, l)[i], n == 0 ? 0.0f : value(n, l, i)) << "layer " << l << " float " << i;
    }
  }
}

TEST(RecurrentState, StepKeepsCheckpointsAtCutPointsAndItsEnd) {
  RecurrentState rs(kLayers, kWidth);
  EXPECT_EQ(rs.seq_len(0), 0);
  step(rs, 0, 5, {1, 0, 1, 0, 0});  // logits after tokens 1 and 3 (a speculative step), and the end
  EXPECT_EQ(rs.seq_len(0), 5);
  EXPECT_EQ(rs.checkpoints(0), (std::vector<int64_t>{1, 3, 5}));
  EXPECT_EQ(rs.restorable(0, 2), 1);
  EXPECT_EQ(rs.restorable(0, 4), 3);
  EXPECT_EQ(rs.restorable(0, 9), 5);
  EXPECT_EQ(rs.restorable(7, 3), 0);  // unknown sequence: only the empty state
  expect_live(rs, 0, 5);

  // No checkpoint at 4: refused, nothing changed, the message names the nearest one.
  Status st = rs.truncate(0, 4);
  EXPECT_EQ(st.code(), StatusCode::kOutOfRange);
  EXPECT_NE(st.message().find("nearest below: 3"), std::string::npos) << st.message();
  EXPECT_EQ(rs.seq_len(0), 5);
  expect_live(rs, 0, 5);
  // At a checkpoint: the state after token 3, and the later checkpoints are gone.
  ASSERT_TRUE(rs.truncate(0, 3).is_ok());
  EXPECT_EQ(rs.seq_len(0), 3);
  expect_live(rs, 0, 3);
  EXPECT_EQ(rs.checkpoints(0), (std::vector<int64_t>{1, 3}));
  // Back to nothing is always possible.
  ASSERT_TRUE(rs.truncate(0, 0).is_ok());
  expect_live(rs, 0, 0);
  EXPECT_TRUE(rs.checkpoints(0).empty());
}

TEST(RecurrentState, LongStepsKeepOnlyTheirEndAndThePolicyCapsCutPoints) {
  CheckpointPolicy p;
  p.step_tokens = 2;
  RecurrentState rs(kLayers, kWidth, p);
  step(rs, 0, 6, {1, 1, 1, 1, 1, 0});
  EXPECT_EQ(rs.checkpoints(0), (std::vector<int64_t>{1, 2, 6}));
  step(rs, 1, 6);  // a prompt chunk: no logits inside
  EXPECT_EQ(rs.checkpoints(1), (std::vector<int64_t>{6}));
  // Periodic checkpoints inside long steps (prefix reuse of long prompts).
  p.every = 4;
  rs.set_policy(p);
  step(rs, 2, 10);
  EXPECT_EQ(rs.checkpoints(2), (std::vector<int64_t>{4, 8, 10}));
  step(rs, 2, 7);  // lengths 11..17: 12 and 16
  EXPECT_EQ(rs.checkpoints(2), (std::vector<int64_t>{4, 8, 10, 12, 16, 17}));
}

TEST(RecurrentState, AbortedStepReturnsToItsStart) {
  RecurrentState rs(kLayers, kWidth);
  step(rs, 0, 2);
  rs.begin_step(0, 3, nullptr);
  for (int64_t l = 0; l < kLayers; ++l) std::fill(rs.live(0, l), rs.live(0, l) + kWidth, -1.0f);
  rs.abort_step(0);
  EXPECT_EQ(rs.seq_len(0), 2);
  expect_live(rs, 0, 2);
  EXPECT_EQ(rs.checkpoints(0), (std::vector<int64_t>{2}));
  // A new sequence's aborted first step leaves the empty state.
  rs.begin_step(4, 2, nullptr);
  std::fill(rs.live(4, 0), rs.live(4, 0) + kWidth, 5.0f);
  rs.abort_step(4);
  EXPECT_EQ(rs.seq_len(4), 0);
  expect_live(rs, 4, 0);
}

TEST(RecurrentState, CopyTakesACheckpointAndTheOnesBeforeIt) {
  RecurrentState rs(kLayers, kWidth);
  step(rs, 0, 2);
  step(rs, 0, 3);
  ASSERT_TRUE(rs.copy(0, 9, 2).is_ok());
  EXPECT_EQ(rs.seq_len(9), 2);
  expect_live(rs, 9, 2);
  EXPECT_EQ(rs.checkpoints(9), (std::vector<int64_t>{2}));
  EXPECT_EQ(rs.copy(0, 9, 4).code(), StatusCode::kOutOfRange);  // no checkpoint at 4
  EXPECT_EQ(rs.copy(0, 9, 6).code(), StatusCode::kOutOfRange);  // more than it holds
  EXPECT_EQ(rs.copy(0, 0, 2).code(), StatusCode::kInvalidArgument);
  expect_live(rs, 9, 2);  // the refused copies changed nothing
  // The source is untouched and both go on independently.
  step(rs, 9, 1);
  expect_live(rs, 0, 5);
  expect_live(rs, 9, 3);
}

TEST(RecurrentState, PruningKeepsTheLastStepAndSpreadsTheRest) {
  CheckpointPolicy p;
  p.max_older = 4;
  RecurrentState rs(kLayers, kWidth, p);
  for (int i = 0; i < 40; ++i) step(rs, 0, 1);  // 40 one-token decode steps
  const std::vector<int64_t> cps = rs.checkpoints(0);
  ASSERT_EQ(cps.size(), 4u + 2u) << "max_older + the last step's start and end";
  EXPECT_EQ(cps[cps.size() - 1], 40);
  EXPECT_EQ(cps[cps.size() - 2], 39);
  // Spread out: no two surviving older checkpoints closer than 4 tokens.
  for (size_t i = 1; i + 2 < cps.size(); ++i) EXPECT_GE(cps[i] - cps[i - 1], 4) << "at " << cps[i];
  EXPECT_EQ(rs.checkpoint_floats(), cps.size() * kLayers * kWidth);
}

TEST(ContextState, CutsKvAndRecurrentStateTogetherOrNotAtAll) {
  KvCache kv(1, 2, 2, 64);
  RecurrentState rs(kLayers, kWidth);
  ContextState cs(&kv, &rs);
  const int64_t pos[6] = {0, 1, 2, 3, 4, 5};
  ASSERT_TRUE(kv.append(0, pos, 6).is_ok());
  step(rs, 0, 6, {0, 0, 1, 0, 0, 0});
  EXPECT_EQ(cs.seq_len(0), 6);
  EXPECT_EQ(cs.restorable(0, 5), 3);  // KV could cut at 5; the recurrent state only at 3
  EXPECT_EQ(kv.restorable(0, 5), 5);
  EXPECT_EQ(cs.truncate(0, 5).code(), StatusCode::kOutOfRange);
  EXPECT_EQ(kv.seq_len(0), 6);
  EXPECT_EQ(rs.seq_len(0), 6);
  EXPECT_EQ(cs.copy(0, 1, 5).code(), StatusCode::kOutOfRange);
  EXPECT_EQ(cs.seq_len(1), 0);
  EXPECT_EQ(rs.seq_len(1), 0);
  ASSERT_TRUE(cs.copy(0, 1, 3).is_ok());
  EXPECT_EQ(kv.seq_len(1), 3);
  EXPECT_EQ(rs.seq_len(1), 3);
  ASSERT_TRUE(cs.truncate(0, 3).is_ok());
  EXPECT_EQ(kv.seq_len(0), 3);
  EXPECT_EQ(rs.seq_len(0), 3);
  cs.remove(1);
  EXPECT_EQ(kv.seq_len(1), 0);
  EXPECT_EQ(rs.seq_len(1), 0);
  // Attention only: cut anywhere.
  ContextState kv_only(&kv, nullptr);
  EXPECT_EQ(kv_only.restorable(0, 2), 2);
  ASSERT_TRUE(kv_only.truncate(0, 2).is_ok());
  EXPECT_EQ(kv.seq_len(0), 2);
}

}  // namespace
}  // namespace moesh
