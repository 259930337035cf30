// Sampler extras and stop strings: seeded reproducibility, penalties worked out by hand,
// the exact candidate sets of top-k / top-p / min-p (checked by drawing), validate() messages,
// and StopMatcher's independence from how the text is chunked.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>
#include <set>

#include "moesh/model/sampling.h"
#include "moesh/text/stop_matcher.h"
#include "moesh/text/tokenizer.h"

namespace moesh {
namespace {

std::vector<float> random_logits(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 2.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = d(rng);
  return v;
}

TEST(Sampling, ReproduciblePerSeed) {
  const auto logits = random_logits(200, 42);
  SamplingParams p;
  p.temp = 0.9f;
  p.top_k = 50;
  p.top_p = 0.95f;
  p.min_p = 0.01f;
  auto draw = [&](uint64_t seed) {
    p.seed = seed;
    Sampler s(p);
    std::vector<int32_t> out;
    for (int i = 0; i < 200; ++i) out.push_back(s.sample(logits.data(), 200));
    return out;
  };
  const auto a = draw(7), b = draw(7), c = draw(8);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  EXPECT_GT(std::set<int32_t>(a.begin(), a.end()).size(), 5u);  // really sampling, not greedy
}

TEST(Sampling, GreedyRepeatPenalty) {
  // id 0 leads by 0.1; a 1.2 repetition penalty divides it to 2.0 / 1.2 = 1.667 < 1.9.
  const std::vector<float> logits = {2.0f, 1.9f, -0.5f, 1.0f};
  const std::vector<float> copy = logits;
  SamplingParams p;
  p.repeat_penalty = 1.2f;
  Sampler s(p);
  EXPECT_EQ(s.sample(logits.data(), 4), 0);
  const std::vector<int32_t> hist = {3, 0};
  EXPECT_EQ(s.sample(logits.data(), 4, hist), 1);
  EXPECT_EQ(logits, copy);  // the caller's logits are untouched
  // A negative logit is multiplied (dividing would raise it): -0.5 * 5 = -2.5 < -0.6.
  const std::vector<float> neg = {-0.5f, -0.6f};
  SamplingParams p5;
  p5.repeat_penalty = 5.0f;
  Sampler s5(p5);
  EXPECT_EQ(s5.sample(neg.data(), 2), 0);
  const std::vector<int32_t> h0 = {0};
  EXPECT_EQ(s5.sample(neg.data(), 2, h0), 1);  // -2.5 < -0.6
}

TEST(Sampling, GreedyPresenceFrequencyAndWindow) {
  const std::vector<float> logits = {1.0f, 0.9f, 0.7f};
  SamplingParams pres;
  pres.presence_penalty = 0.2f;  // once per seen token: 1.0 - 0.2 = 0.8 < 0.9
  const std::vector<int32_t> once = {0}, thrice = {0, 0, 0};
  EXPECT_EQ(Sampler(pres).sample(logits.data(), 3, once), 1);
  EXPECT_EQ(Sampler(pres).sample(logits.data(), 3, thrice), 1);  // not per occurrence: 0.8 still
  SamplingParams freq;
  freq.frequency_penalty = 0.05f;  // per occurrence: 1 - 0.05 = 0.95 (wins), 1 - 0.15 = 0.85
  EXPECT_EQ(Sampler(freq).sample(logits.data(), 3, once), 0);
  EXPECT_EQ(Sampler(freq).sample(logits.data(), 3, thrice), 1);
  // Combined: 1.0 - 3*0.05 - 0.2 = 0.65 < 0.7 (id 2) < 0.9 (id 1), and id 1 is penalised too.
  SamplingParams both;
  both.frequency_penalty = 0.05f;
  both.presence_penalty = 0.2f;
  const std::vector<int32_t> h = {0, 1, 0, 0};  // id 1: 0.9 - 0.05 - 0.2 = 0.65; id 2: 0.7
  EXPECT_EQ(Sampler(both).sample(logits.data(), 3, h), 2);
  // The window: only the last penalty_last_n tokens count.
  SamplingParams win = pres;
  win.penalty_last_n = 2;
  const std::vector<int32_t> old = {0, 2, 2};
  EXPECT_EQ(Sampler(win).sample(logits.data(), 3, old), 0);  // id 0 is outside the window
  win.penalty_last_n = 3;
  EXPECT_EQ(Sampler(win).sample(logits.data(), 3, old), 1);
  win.penalty_last_n = -1;  // the whole history
  EXPECT_EQ(Sampler(win).sample(logits.data(), 3, old), 1);
  win.penalty_last_n = 0;  // off
  EXPECT_EQ(Sampler(win).sample(logits.data(), 3, old), 0);
  // Ids outside the vocabulary in the history are ignored, not a crash.
  const std::vector<int32_t> junk = {-5, 99, 0};
  EXPECT_EQ(Sampler(pres).sample(logits.data(), 3, junk), 1);
}

// Ten tokens with known probabilities, in a shuffled id order.
struct Dist {
  std::vector<float> logits;
  std::vector<int32_t> by_rank;  // ids from most to least probable
  std::vector<double> p;         // p of by_rank[i]
};

Dist make_dist() {
  Dist d;
  d.p = {0.4, 0.2, 0.15, 0.1, 0.05, 0.04, 0.03, 0.02, 0.006, 0.004};
  d.by_rank = {7, 2, 9, 0, 5, 1, 8, 3, 6, 4};
  d.logits.assign(10, 0.0f);
  for (size_t r = 0; r < 10; ++r) d.logits[static_cast<size_t>(d.by_rank[r])] = std::log(static_cast<float>(d.p[r]));
  return d;
}

// Draws many times and checks that exactly the top `n_allowed` ids appear, each with roughly its
// renormalised probability (at temperature 1).
void expect_candidates(const Dist& d, SamplingParams p, size_t n_allowed, bool check_freq = true) {
  p.seed = 1234;
  Sampler s(p);
  std::map<int32_t, int> hits;
  const int n = 6000;
  for (int i = 0; i < n; ++i) ++hits[s.sample(d.logits.data(), 10)];
  const std::set<int32_t> allowed(d.by_rank.begin(), d.by_rank.begin() + static_cast<long>(n_allowed));
  double mass = 0.0;
  for (size_t r = 0; r < n_allowed; ++r) mass += d.p[r];
  for (const auto& [id, c] : hits) EXPECT_TRUE(allowed.count(id)) << "id " << id << " drawn";
  for (size_t r = 0; r < n_allowed; ++r) {
    const int32_t id = d.by_rank[r];
    ASSERT_TRUE(hits.count(id)) << "allowed id " << id << " never drawn";
    if (check_freq) {
      EXPECT_NEAR(hits[id] / static_cast<double>(n), d.p[r] / mass, 0.03) << "id " << id;
    }
  }
}

TEST(Sampling, CandidateSets) {
  const Dist d = make_dist();
  SamplingParams base;
  base.temp = 1.0f;
  {
    SamplingParams p = base;
    p.top_k = 3;
    expect_candidates(d, p, 3);
  }
  {
    SamplingParams p = base;
    p.top_p = 0.7f;  // cumulative 0.4, 0.6, 0.75: the third reaches 0.7
    expect_candidates(d, p, 3);
  }
  {
    SamplingParams p = base;
    p.top_p = 0.88f;  // 0.85 after four, 0.90 after five
    expect_candidates(d, p, 5);
  }
  {
    SamplingParams p = base;
    p.min_p = 0.3f;  // p >= 0.12
    expect_candidates(d, p, 3);
  }
  {
    SamplingParams p = base;
    p.min_p = 0.2f;  // p >= 0.08
    expect_candidates(d, p, 4);
  }
  {
    // top-k 5 leaves mass 0.9; renormalised cumulative 0.444, 0.667, 0.833, 0.944: top-p 0.88
    // keeps four; then min-p 0.3 keeps p >= 0.12 of those, three.
    SamplingParams p = base;
    p.top_k = 5;
    p.top_p = 0.88f;
    expect_candidates(d, p, 4);
    p.min_p = 0.3f;
    expect_candidates(d, p, 3);
  }
  {
    // min-p acts before temperature: at T = 2 the 0.05 token would pass a 0.3 ratio
    // (sqrt(0.05 / 0.4) = 0.35), but the set is still the three computed at T = 1.
    SamplingParams p = base;
    p.temp = 2.0f;
    p.min_p = 0.3f;
    expect_candidates(d, p, 3, /*check_freq=*/false);
  }
}

TEST(Sampling, PenaltiesApplyBeforeSampling) {
  // With temp > 0 and top-k 1 the draw is the top candidate of the *penalised* logits.
  const std::vector<float> logits = {3.0f, 2.5f, 0.0f};
  SamplingParams p;
  p.temp = 0.7f;
  p.top_k = 1;
  p.repeat_penalty = 1.5f;  // 3.0 / 1.5 = 2.0 < 2.5
  Sampler s(p);
  const std::vector<int32_t> h = {0};
  for (int i = 0; i < 20; ++i) EXPECT_EQ(s.sample(logits.data(), 3, h), 1);
  EXPECT_EQ(s.sample(logits.data(), 3), 0);
}

TEST(Sampling, ValidateNamesTheField) {
  EXPECT_TRUE(SamplingParams{}.validate().is_ok());
  struct Case {
    const char* field;
    void (*set)(SamplingParams&);
  };
  const Case cases[] = {
      {"temp", [](SamplingParams& p) { p.temp = -0.1f; }},
      {"temp", [](SamplingParams& p) { p.temp = std::nanf(""); }},
      {"top_p", [](SamplingParams& p) { p.top_p = 0.0f; }},
      {"top_p", [](SamplingParams& p) { p.top_p = 1.5f; }},
      {"min_p", [](SamplingParams& p) { p.min_p = -0.01f; }},
      {"min_p", [](SamplingParams& p) { p.min_p = 1.01f; }},
      {"repeat_penalty", [](SamplingParams& p) { p.repeat_penalty = 0.0f; }},
      {"presence_penalty", [](SamplingParams& p) { p.presence_penalty = 2.5f; }},
      {"frequency_penalty", [](SamplingParams& p) { p.frequency_penalty = -3.0f; }},
      {"penalty_last_n", [](SamplingParams& p) { p.penalty_last_n = -2; }},
  };
  for (const auto& c : cases) {
    SamplingParams p;
    c.set(p);
    const Status st = p.validate();
    ASSERT_FALSE(st.is_ok()) << c.field;
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(st.message().find(c.field), std::string::npos) << st.message();
  }
  SamplingParams edge;  // the inclusive ends are valid
  edge.top_p = 1.0f;
  edge.min_p = 1.0f;
  edge.presence_penalty = -2.0f;
  edge.frequency_penalty = 2.0f;
  edge.penalty_last_n = -1;
  EXPECT_TRUE(edge.validate().is_ok());
}

// Feeds `text` to a matcher in the given chunks; returns everything released.
std::string run_chunks(const std::vector<std::string>& stops, const std::vector<std::string>& chunks, bool* stopped,
                       std::string* matched) {
  StopMatcher m(stops);
  std::string out;
  for (const auto& c : chunks) {
    const std::string r = m.push(c);
    EXPECT_TRUE(utf8_is_valid(r)) << "released text ends inside a character";
    out += r;
  }
  out += m.flush();
  *stopped = m.stopped();
  *matched = m.matched();
  return out;
}

void expect_all_chunkings(const std::vector<std::string>& stops, const std::string& text, const std::string& want,
                          const std::string& want_match) {
  bool stopped;
  std::string matched;
  // Whole, every two-way split, byte by byte, and random splits.
  std::vector<std::vector<std::string>> chunkings = {{text}};
  for (size_t i = 0; i <= text.size(); ++i) chunkings.push_back({text.substr(0, i), text.substr(i)});
  std::vector<std::string> bytes;
  for (char c : text) bytes.emplace_back(1, c);
  chunkings.push_back(bytes);
  std::mt19937 rng(99);
  for (int r = 0; r < 50; ++r) {
    std::vector<std::string> ch;
    for (size_t i = 0; i < text.size();) {
      const size_t n = std::min<size_t>(text.size() - i, 1 + rng() % 5);
      ch.push_back(text.substr(i, n));
      i += n;
    }
    chunkings.push_back(ch);
  }
  for (const auto& ch : chunkings) {
    EXPECT_EQ(run_chunks(stops, ch, &stopped, &matched), want) << "chunks: " << ch.size();
    EXPECT_EQ(stopped, !want_match.empty());
    EXPECT_EQ(matched, want_match);
  }
}

TEST(StopMatcher, SameOutputForEveryChunking) {
  expect_all_chunkings({"<|im_end|>"}, "Hello wörld ✓ <|im_e <|im_end|>tail", "Hello wörld ✓ <|im_e ", "<|im_end|>");
  expect_all_chunkings({"<|im_end|>", "\n\nUser:"}, "a\n\nUse b\n\nUser: c<|im_end|>", "a\n\nUse b", "\n\nUser:");
  expect_all_chunkings({"STOP"}, "no stop here, STO ST S", "no stop here, STO ST S", "");
  // Overlapping stops: the one that ends first wins (what a byte stream sees first).
  expect_all_chunkings({"abcd", "bc"}, "xxabcdyy", "xxa", "bc");
  // Same end: the longer one (which starts first).
  expect_all_chunkings({"cd", "bcd"}, "abcde", "a", "bcd");
  // A stop at the very start releases nothing.
  expect_all_chunkings({"END"}, "ENDabc", "", "END");
  // A stop made of a multi-byte character split across chunks.
  expect_all_chunkings({"→"}, "a→b", "a", "→");
}

TEST(StopMatcher, HoldsPartialStopUntilFlush) {
  StopMatcher m({"<|im_end|>", "###"});
  EXPECT_EQ(m.push("answer <|im_"), "answer ");
  EXPECT_EQ(m.push("en"), "");
  EXPECT_FALSE(m.stopped());
  EXPECT_EQ(m.flush(), "<|im_en");  // generation ended without the stop: release it
  EXPECT_FALSE(m.stopped());
  EXPECT_EQ(m.matched(), "");

  StopMatcher n({"<|im_end|>"});
  EXPECT_EQ(n.push("<|im"), "");
  EXPECT_EQ(n.push("x"), "<|imx");  // no longer a prefix: released at once
  EXPECT_EQ(n.push("#"), "#");
  // A partial UTF-8 character waits for its continuation byte.
  EXPECT_EQ(n.push("a\xc3"), "a");
  EXPECT_EQ(n.push("\xa9!"), "\xc3\xa9!");
  EXPECT_EQ(n.push("..<|im_end|> after"), "..");
  EXPECT_TRUE(n.stopped());
  EXPECT_EQ(n.push("more"), "");  // everything after the stop is dropped
  EXPECT_EQ(n.flush(), "");

  StopMatcher none({});  // no stops: a pass-through
  EXPECT_EQ(none.push("abc"), "abc");
  EXPECT_FALSE(none.stopped());
  StopMatcher empty_stop({""});  // an empty stop string is ignored rather than matching at once
  EXPECT_EQ(empty_stop.push("abc"), "abc");
}

}  // namespace
}  // namespace moesh
