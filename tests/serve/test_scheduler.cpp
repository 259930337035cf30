// Scheduler tests on a tiny random qwen3moe written by make_model: concurrent greedy requests
// give exactly the tokens of a plain one-sequence decode loop, seeded sampling does not depend
// on batching, the prefix cache reuses cells (free and busy slots) without changing tokens,
// queueing, cancellation (queued, running, sink returning false), validation, a failing expert
// executor, and text/stop strings/EOG with a synthetic ASCII tokenizer. No timing assertions.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "moesh/gguf/gguf.h"
#include "moesh/make_model/make_model.h"
#include "moesh/model/model.h"
#include "moesh/serve/scheduler.h"
#include "moesh/text/tokenizer.h"
#include "util/nextn_model.h"

namespace moesh {
namespace {

constexpr int64_t kCtx = 256;
constexpr int32_t kEos = 511;  // the synthetic tokenizer's end-of-text token

// Writes the model of `s` into this process's temp dir and loads it.
std::unique_ptr<Model> made_model(const MakeModelSpec& s, const std::string& name) {
  const auto dir = std::filesystem::temp_directory_path() / ("moesh-sched-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  const std::string path = (dir / name).string();
  Status st = make_model(s, path);
  EXPECT_TRUE(st.is_ok()) << st.to_string();
  auto m = Model::load(path);
  EXPECT_TRUE(m.is_ok()) << m.status().to_string();
  return m.is_ok() ? std::move(*m) : nullptr;
}

const Model& tiny_model() {
  static std::unique_ptr<Model> model = [] {
    MakeModelSpec s = MakeModelSpec::defaults_for(MakeArch::kQwen3Moe);
    s.seed = 4242;
    s.n_embd = 128;
    s.n_head = 4;
    s.n_head_kv = 2;
    s.head_dim = 32;
    s.n_ff_exp = 128;
    s.n_ctx = kCtx;
    return made_model(s, "tiny.gguf");
  }();
  return *model;
}

std::vector<int32_t> random_prompt(uint64_t seed, size_t n) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int32_t> d(0, kEos - 1);
  std::vector<int32_t> p(n);
  for (auto& t : p) t = d(rng);
  return p;
}

// The reference: one sequence, plain Context::decode, argmax.
std::vector<int32_t> greedy_alone(const std::vector<int32_t>& prompt, int n, const Model& m = tiny_model()) {
  Context ctx(m, ContextParams{2, kCtx, nullptr});
  const int64_t V = m.hparams().n_vocab;
  std::vector<float> logits(V);
  std::vector<int32_t> out;
  Status st = ctx.decode(0, prompt.data(), static_cast<int64_t>(prompt.size()), logits.data(), false);
  EXPECT_TRUE(st.is_ok()) << st.to_string();
  for (int i = 0; i < n; ++i) {
    const int32_t t = argmax(logits.data(), V);
    out.push_back(t);
    if (i + 1 == n) break;
    st = ctx.decode(0, &t, 1, logits.data(), false);
    EXPECT_TRUE(st.is_ok()) << st.to_string();
  }
  return out;
}

// Everything a request's sink saw.
struct Outcome {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<int32_t> tokens;
  std::string text;
  int n_events = 0, n_done = 0;
  FinishReason finish = FinishReason::kNone;
  Status error;
  Usage usage;
  std::vector<TokenLogprob> logprobs;

  void wait_done() {
    std::unique_lock<std::mutex> lk(mu);
    // A generous bound so a scheduler bug fails the test instead of hanging it.
    ASSERT_TRUE(cv.wait_for(lk, std::chrono::minutes(5), [&] { return n_done > 0; }));
  }
  void wait_events(int n) {
    std::unique_lock<std::mutex> lk(mu);
    ASSERT_TRUE(cv.wait_for(lk, std::chrono::minutes(5), [&] { return n_events >= n; }));
  }
};

// A sink recording into `o`; `hook` runs after recording and decides the return value.
EventSink collect(std::shared_ptr<Outcome> o, std::function<bool(const GenerationEvent&)> hook = nullptr) {
  return [o, hook](const GenerationEvent& ev) {
    {
      std::lock_guard<std::mutex> lk(o->mu);
      o->tokens.insert(o->tokens.end(), ev.tokens.begin(), ev.tokens.end());
      o->logprobs.insert(o->logprobs.end(), ev.logprobs.begin(), ev.logprobs.end());
      o->text += ev.text;
      ++o->n_events;
      if (ev.done) {
        ++o->n_done;
        o->finish = ev.finish;
        o->error = ev.error;
      }
      o->usage = ev.usage;
    }
    o->cv.notify_all();
    return hook ? hook(ev) : true;
  };
}

GenerationRequest greedy_request(std::vector<int32_t> prompt, int max_tokens) {
  GenerationRequest r;
  r.prompt = std::move(prompt);
  r.max_tokens = max_tokens;
  return r;
}

SchedulerOptions opts(int n_slots, int64_t max_batch_tokens = 256) {
  SchedulerOptions o;
  o.n_slots = n_slots;
  o.max_batch_tokens = max_batch_tokens;
  return o;
}

std::unique_ptr<Scheduler> make_scheduler(SchedulerOptions o, const Tokenizer* tok = nullptr,
                                          const Model& model = tiny_model()) {
  if (o.n_threads == 0) o.n_threads = 2;
  auto s = Scheduler::create(model, tok, o);
  EXPECT_TRUE(s.is_ok()) << s.status().to_string();
  return s.is_ok() ? std::move(*s) : nullptr;
}

uint64_t submit_ok(Scheduler& s, GenerationRequest r, EventSink sink) {
  auto id = s.submit(std::move(r), std::move(sink));
  EXPECT_TRUE(id.is_ok()) << id.status().to_string();
  return id.is_ok() ? *id : 0;
}

// A one-shot gate: a sink blocks in wait() until the test thread calls open().
struct Gate {
  std::mutex mu;
  std::condition_variable cv;
  bool is_open = false;
  void open() {
    {
      std::lock_guard<std::mutex> lk(mu);
      is_open = true;
    }
    cv.notify_all();
  }
  void wait() {
    std::unique_lock<std::mutex> lk(mu);
    cv.wait(lk, [&] { return is_open; });
  }
};

// Only tokens with id % mod == rest; counts its calls. `fail_after` >= 0: allowed() fails then.
struct ModConstraint : TokenConstraint {
  int mod = 2, rest = 0, fail_after = -1, calls = 0;
  std::vector<int32_t> accepted;
  Status allowed(std::vector<uint8_t>& a) override {
    if (fail_after >= 0 && calls >= fail_after) {
      return make_error(StatusCode::kInvalidArgument, "nothing can follow");
    }
    ++calls;
    for (size_t t = 0; t < a.size(); ++t) a[t] = static_cast<int>(t) % mod == rest ? 1 : 0;
    return Status::ok();
  }
  Status accept(int32_t t) override {
    accepted.push_back(t);
    return t % mod == rest ? Status::ok() : make_error(StatusCode::kInvalidArgument, "refused");
  }
};

// Plain decode, recording each step's log-softmax and the argmax among tokens that `keep` allows.
struct Reference {
  std::vector<int32_t> tokens;
  std::vector<std::vector<double>> logsoftmax;
};
Reference reference_decode(const std::vector<int32_t>& prompt, int n, const std::function<bool(int32_t)>& keep) {
  const Model& m = tiny_model();
  Context ctx(m, ContextParams{2, kCtx, nullptr});
  const int64_t V = m.hparams().n_vocab;
  std::vector<float> logits(V);
  Reference r;
  Status st = ctx.decode(0, prompt.data(), static_cast<int64_t>(prompt.size()), logits.data(), false);
  EXPECT_TRUE(st.is_ok()) << st.to_string();
  for (int i = 0; i < n; ++i) {
    float mx = -INFINITY;
    for (float x : logits) mx = std::max(mx, x);
    double sum = 0;
    for (float x : logits) sum += std::exp(static_cast<double>(x) - mx);
    std::vector<double> ls(V);
    for (int64_t v = 0; v < V; ++v) ls[v] = static_cast<double>(logits[v]) - (mx + std::log(sum));
    r.logsoftmax.push_back(std::move(ls));
    int32_t best = -1;
    for (int32_t v = 0; v < V; ++v) {
      if (keep(v) && (best < 0 || logits[v] > logits[best])) best = v;
    }
    r.tokens.push_back(best);
    if (i + 1 == n) break;
    st = ctx.decode(0, &best, 1, logits.data(), false);
    EXPECT_TRUE(st.is_ok()) << st.to_string();
  }
  return r;
}

TEST(Scheduler, LogprobsFollowTheModelsDistribution) {
  auto s = make_scheduler(opts(2));
  const auto prompt = random_prompt(71, 9);
  const Reference ref = reference_decode(prompt, 6, [](int32_t) { return true; });
  GenerationRequest r = greedy_request(prompt, 6);
  r.top_logprobs = 3;
  auto o = std::make_shared<Outcome>();
  submit_ok(*s, r, collect(o));
  // A second stream in the same steps must not change the numbers (batch independence).
  auto other = std::make_shared<Outcome>();
  submit_ok(*s, greedy_request(random_prompt(72, 5), 6), collect(other));
  o->wait_done();
  other->wait_done();
  EXPECT_EQ(o->tokens, ref.tokens);
  ASSERT_EQ(o->logprobs.size(), o->tokens.size());
  for (size_t i = 0; i < o->logprobs.size(); ++i) {
    const TokenLogprob& lp = o->logprobs[i];
    EXPECT_EQ(lp.token, o->tokens[i]);
    EXPECT_NEAR(lp.logprob, ref.logsoftmax[i][static_cast<size_t>(lp.token)], 1e-6);
    ASSERT_EQ(lp.top.size(), 3u);
    EXPECT_EQ(lp.top[0].first, lp.token);  // greedy: the chosen token is the most likely
    EXPECT_GE(lp.top[0].second, lp.top[1].second);
    EXPECT_GE(lp.top[1].second, lp.top[2].second);
    for (const auto& [id, l] : lp.top) EXPECT_NEAR(l, ref.logsoftmax[i][static_cast<size_t>(id)], 1e-6);
  }
  EXPECT_TRUE(other->logprobs.empty());  // not asked

  GenerationRequest bad = greedy_request(prompt, 2);
  bad.top_logprobs = kMaxTopLogprobs + 1;
  EXPECT_FALSE(s->submit(bad, collect(std::make_shared<Outcome>())).is_ok());
}

TEST(Scheduler, ConstraintMasksEveryStepAndFailsCleanly) {
  SchedulerOptions o = opts(2);
  o.draft = "ngram";  // drafting is off for a constrained request
  o.adaptive_drafts = false;
  auto s = make_scheduler(o);
  const auto prompt = random_prompt(81, 12);
  const Reference ref = reference_decode(prompt, 8, [](int32_t t) { return t % 3 == 1; });
  auto c = std::make_shared<ModConstraint>();
  c->mod = 3;
  c->rest = 1;
  GenerationRequest r = greedy_request(prompt, 8);
  r.constraint = c;
  auto out = std::make_shared<Outcome>();
  submit_ok(*s, r, collect(out));
  out->wait_done();
  EXPECT_EQ(out->finish, FinishReason::kLength);
  EXPECT_EQ(out->tokens, ref.tokens);  // the argmax among allowed tokens, every step
  EXPECT_EQ(c->calls, 8);
  EXPECT_EQ(c->accepted, ref.tokens);
  EXPECT_EQ(out->usage.draft_tokens, 0);

  // A constraint that cannot continue fails the request with its reason; others go on.
  auto stuck = std::make_shared<ModConstraint>();
  stuck->fail_after = 3;
  GenerationRequest r2 = greedy_request(prompt, 8);
  r2.constraint = stuck;
  auto failed = std::make_shared<Outcome>();
  auto fine = std::make_shared<Outcome>();
  submit_ok(*s, r2, collect(failed));
  submit_ok(*s, greedy_request(prompt, 8), collect(fine));
  failed->wait_done();
  fine->wait_done();
  EXPECT_EQ(failed->finish, FinishReason::kError);
  EXPECT_NE(failed->error.message().find("nothing can follow"), std::string::npos) << failed->error.to_string();
  EXPECT_EQ(failed->tokens.size(), 3u);
  EXPECT_EQ(fine->finish, FinishReason::kLength);
  EXPECT_EQ(fine->tokens, greedy_alone(prompt, 8));
}

TEST(Scheduler, ConcurrentGreedyRequestsMatchPlainDecode) {
  // 7 requests over 3 slots: some queue; long prompts are chunked (max_batch_tokens 48).
  const std::vector<size_t> prompt_len = {5, 40, 90, 13, 1, 70, 22};
  const std::vector<int> max_tokens = {20, 12, 16, 30, 25, 8, 18};
  std::vector<std::vector<int32_t>> prompts, expected;
  std::set<int32_t> distinct;
  for (size_t i = 0; i < prompt_len.size(); ++i) {
    prompts.push_back(random_prompt(100 + i, prompt_len[i]));
    expected.push_back(greedy_alone(prompts[i], max_tokens[i]));
    distinct.insert(expected[i].begin(), expected[i].end());
  }
  ASSERT_GE(distinct.size(), 10u) << "degenerate model: greedy outputs barely vary";

  auto s = make_scheduler(opts(3, 48));
  ASSERT_TRUE(s);
  std::vector<std::shared_ptr<Outcome>> out;
  for (size_t i = 0; i < prompts.size(); ++i) {
    out.push_back(std::make_shared<Outcome>());
    submit_ok(*s, greedy_request(prompts[i], max_tokens[i]), collect(out[i]));
  }
  uint64_t total_prompt = 0, total_gen = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    out[i]->wait_done();
    EXPECT_EQ(out[i]->tokens, expected[i]) << "request " << i;
    EXPECT_EQ(out[i]->finish, FinishReason::kLength);
    EXPECT_EQ(out[i]->n_done, 1);
    EXPECT_EQ(out[i]->usage.prompt_tokens, static_cast<int64_t>(prompts[i].size()));
    EXPECT_EQ(out[i]->usage.completion_tokens, max_tokens[i]);
    total_prompt += prompts[i].size();
    total_gen += max_tokens[i];
  }
  const SchedulerStats st = s->stats();
  EXPECT_EQ(st.requests_submitted, 7u);
  EXPECT_EQ(st.requests_finished, 7u);
  EXPECT_EQ(st.generated_tokens, total_gen);
  EXPECT_EQ(st.prompt_tokens, total_prompt);
  EXPECT_EQ(st.active, 0);
  EXPECT_EQ(st.queued, 0);
  EXPECT_EQ(st.max_batch_seen, 3u);
  // Every computed token (prompt minus cache, generated minus each request's last) in a step.
  EXPECT_EQ(st.batch_tokens, total_prompt - st.cached_prompt_tokens + total_gen - 7);
  EXPECT_LT(st.steps * 2, st.batch_tokens) << "steps should carry several tokens each";
  std::printf(
      "[concurrency] %llu steps carried %llu tokens (%llu prompt, %llu generated), "
      "max %llu sequences per step\n",
      (unsigned long long)st.steps, (unsigned long long)st.batch_tokens, (unsigned long long)total_prompt,
      (unsigned long long)total_gen, (unsigned long long)st.max_batch_seen);
}

TEST(Scheduler, SeededSamplingIsTheSameAloneAndBatched) {
  std::vector<GenerationRequest> reqs;
  for (int i = 0; i < 3; ++i) {
    GenerationRequest r = greedy_request(random_prompt(200 + i, 10 + 7 * i), 24);
    r.sampling.temp = 0.9f;
    r.sampling.top_k = 40;
    r.sampling.top_p = 0.95f;
    r.sampling.seed = 7 + i;
    if (i == 2) r.sampling.presence_penalty = 0.5f;
    reqs.push_back(r);
  }
  reqs.push_back(reqs[0]);
  reqs.back().sampling.seed = 99;  // same prompt, other seed

  std::vector<std::vector<int32_t>> alone;
  for (const auto& r : reqs) {
    auto s = make_scheduler(opts(1));
    auto o = std::make_shared<Outcome>();
    submit_ok(*s, r, collect(o));
    o->wait_done();
    ASSERT_EQ(o->tokens.size(), 24u);
    alone.push_back(o->tokens);
  }
  EXPECT_NE(alone[0], alone[3]) << "seed has no effect";
  EXPECT_NE(alone[0], greedy_alone(reqs[0].prompt, 24)) << "sampling looks greedy";

  auto s = make_scheduler(opts(4, 16));
  std::vector<std::shared_ptr<Outcome>> out;
  for (const auto& r : reqs) {
    out.push_back(std::make_shared<Outcome>());
    submit_ok(*s, r, collect(out.back()));
  }
  for (size_t i = 0; i < reqs.size(); ++i) {
    out[i]->wait_done();
    EXPECT_EQ(out[i]->tokens, alone[i]) << "request " << i;
  }
  EXPECT_GT(s->stats().max_batch_seen, 1u);
}

TEST(Scheduler, PrefixCacheReusesAFreeSlot) {
  const std::vector<int32_t> a = random_prompt(300, 60);
  std::vector<int32_t> b(a.begin(), a.begin() + 50);
  for (int32_t t : random_prompt(301, 10)) b.push_back(t == a[50] ? (t + 1) % kEos : t);
  const auto cold_b = greedy_alone(b, 15);

  auto s = make_scheduler(opts(2));
  auto oa = std::make_shared<Outcome>(), ob = std::make_shared<Outcome>();
  submit_ok(*s, greedy_request(a, 10), collect(oa));
  oa->wait_done();
  EXPECT_EQ(oa->usage.cached_tokens, 0);
  submit_ok(*s, greedy_request(b, 15), collect(ob));
  ob->wait_done();
  EXPECT_EQ(ob->usage.cached_tokens, 50);
  EXPECT_EQ(ob->tokens, cold_b);
  EXPECT_EQ(s->stats().cached_prompt_tokens, 50u);

  // The same prompt again: everything but the last prompt token comes from the cache.
  auto oc = std::make_shared<Outcome>();
  submit_ok(*s, greedy_request(b, 15), collect(oc));
  oc->wait_done();
  EXPECT_EQ(oc->usage.cached_tokens, static_cast<int64_t>(b.size()) - 1);
  EXPECT_EQ(oc->tokens, cold_b);
}

TEST(Scheduler, ConversationReturnsToItsSlot) {
  auto s = make_scheduler(opts(3));
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::shared_ptr<Outcome>> out;
  for (int i = 0; i < 3; ++i) {  // one after another, so each slot ends up holding one of them
    prompts.push_back(random_prompt(400 + i, 20 + 5 * i));
    out.push_back(std::make_shared<Outcome>());
    submit_ok(*s, greedy_request(prompts[i], 12), collect(out[i]));
    out[i]->wait_done();
  }
  // Turn two of conversation 1: its history plus a new user message.
  std::vector<int32_t> turn2 = prompts[1];
  turn2.insert(turn2.end(), out[1]->tokens.begin(), out[1]->tokens.end());
  for (int32_t t : random_prompt(410, 6)) turn2.push_back(t);
  auto o = std::make_shared<Outcome>();
  submit_ok(*s, greedy_request(turn2, 10), collect(o));
  o->wait_done();
  // The slot holds the prompt and every generated token but the last (never fed back).
  EXPECT_EQ(o->usage.cached_tokens, static_cast<int64_t>(prompts[1].size() + 12 - 1));
  EXPECT_EQ(o->tokens, greedy_alone(turn2, 10));
}

TEST(Scheduler, PrefixIsCopiedFromABusySlot) {
  const std::vector<int32_t> a = random_prompt(500, 40);
  std::vector<int32_t> b(a.begin(), a.begin() + 30);
  for (int32_t t : random_prompt(501, 5)) b.push_back(t == a[30] ? (t + 1) % kEos : t);

  auto s = make_scheduler(opts(2));
  Scheduler* sp = s.get();
  auto oa = std::make_shared<Outcome>(), ob = std::make_shared<Outcome>();
  std::atomic<bool> submitted{false};
  // B is submitted from inside A's sink (a sink may call back), so A is busy when B arrives.
  submit_ok(*s, greedy_request(a, 30), collect(oa, [&](const GenerationEvent& ev) {
    if (!ev.done && !submitted.exchange(true)) {
      EXPECT_EQ(sp->stats().active, 1);
      submit_ok(*sp, greedy_request(b, 12), collect(ob));
    }
    return true;
  }));
  oa->wait_done();
  ob->wait_done();
  EXPECT_EQ(ob->usage.cached_tokens, 30);
  EXPECT_EQ(ob->tokens, greedy_alone(b, 12));
  EXPECT_EQ(oa->tokens, greedy_alone(a, 30));
}

TEST(Scheduler, CancelQueuedAndRunningRequests) {
  auto s = make_scheduler(opts(1));
  Gate gate;
  auto oa = std::make_shared<Outcome>(), ob = std::make_shared<Outcome>();
  const uint64_t ida =
      submit_ok(*s, greedy_request(random_prompt(600, 8), 200), collect(oa, [&](const GenerationEvent& ev) {
        if (!ev.done) gate.wait();
        return true;
      }));
  oa->wait_events(1);  // A is running and its sink is blocked
  const uint64_t idb = submit_ok(*s, greedy_request(random_prompt(601, 8), 5), collect(ob));
  EXPECT_EQ(s->stats().queued, 1);
  s->cancel(idb);
  s->cancel(ida);
  s->cancel(987654);  // unknown: ignored
  gate.open();
  oa->wait_done();
  ob->wait_done();
  EXPECT_EQ(oa->finish, FinishReason::kCancelled);
  EXPECT_EQ(oa->usage.completion_tokens, 1);  // the cancel lands before the next step
  EXPECT_EQ(ob->finish, FinishReason::kCancelled);
  EXPECT_EQ(ob->usage.completion_tokens, 0);
  EXPECT_EQ(ob->n_events, 1);

  // The slot is free again: a later request runs to the end.
  const auto p = random_prompt(602, 12);
  auto oc = std::make_shared<Outcome>();
  submit_ok(*s, greedy_request(p, 9), collect(oc));
  oc->wait_done();
  EXPECT_EQ(oc->finish, FinishReason::kLength);
  EXPECT_EQ(oc->tokens, greedy_alone(p, 9));
  const SchedulerStats st = s->stats();
  EXPECT_EQ(st.requests_cancelled, 2u);
  EXPECT_EQ(st.requests_finished, 1u);
  EXPECT_EQ(st.active, 0);
}

TEST(Scheduler, SinkReturningFalseCancels) {
  auto s = make_scheduler(opts(1));
  auto oa = std::make_shared<Outcome>();
  submit_ok(*s, greedy_request(random_prompt(700, 10), 50),
            collect(oa, [](const GenerationEvent& ev) { return ev.usage.completion_tokens < 3; }));
  oa->wait_done();
  EXPECT_EQ(oa->finish, FinishReason::kCancelled);
  EXPECT_EQ(oa->usage.completion_tokens, 3);
  EXPECT_EQ(oa->tokens.size(), 3u);
  EXPECT_EQ(oa->n_done, 1);

  const auto p = random_prompt(701, 6);
  auto ob = std::make_shared<Outcome>();
  submit_ok(*s, greedy_request(p, 7), collect(ob));
  ob->wait_done();
  EXPECT_EQ(ob->tokens, greedy_alone(p, 7));
  EXPECT_EQ(s->stats().requests_cancelled, 1u);
}

TEST(Scheduler, SubmitRejectsBadRequests) {
  SchedulerOptions o64 = opts(2);
  o64.n_ctx = 64;
  auto s = make_scheduler(o64);
  ASSERT_EQ(s->n_ctx(), 64);
  auto code = [&](GenerationRequest r) { return s->submit(std::move(r), nullptr).status().code(); };
  EXPECT_EQ(code(greedy_request({}, 4)), StatusCode::kInvalidArgument);
  EXPECT_EQ(code(greedy_request({1, 2}, 0)), StatusCode::kInvalidArgument);
  EXPECT_EQ(code(greedy_request({1, -1}, 4)), StatusCode::kOutOfRange);
  EXPECT_EQ(code(greedy_request({1, 512}, 4)), StatusCode::kOutOfRange);
  EXPECT_EQ(code(greedy_request(random_prompt(800, 60), 5)), StatusCode::kOutOfRange);
  EXPECT_EQ(code(greedy_request(random_prompt(800, 65), 1)), StatusCode::kOutOfRange);
  GenerationRequest bad_temp = greedy_request({1, 2}, 4);
  bad_temp.sampling.temp = -1.0f;
  EXPECT_EQ(code(bad_temp), StatusCode::kInvalidArgument);
  GenerationRequest stops = greedy_request({1, 2}, 4);
  stops.stop = {"x"};  // no tokenizer
  EXPECT_EQ(code(stops), StatusCode::kInvalidArgument);

  auto msg = s->submit(greedy_request(random_prompt(800, 60), 5), nullptr).status().message();
  EXPECT_NE(msg.find("exceeds the context of 64"), std::string::npos) << msg;
  msg = s->submit(greedy_request({3, 600}, 5), nullptr).status().message();
  EXPECT_NE(msg.find("600"), std::string::npos) << msg;

  // Exactly at the limit is fine.
  auto o = std::make_shared<Outcome>();
  submit_ok(*s, greedy_request(random_prompt(801, 60), 4), collect(o));
  o->wait_done();
  EXPECT_EQ(o->finish, FinishReason::kLength);
  EXPECT_EQ(o->tokens.size(), 4u);
  const SchedulerStats st = s->stats();
  EXPECT_EQ(st.requests_rejected, 10u);
  EXPECT_EQ(st.requests_submitted, 1u);

  EXPECT_FALSE(Scheduler::create(tiny_model(), nullptr, opts(0)).is_ok());
  EXPECT_FALSE(Scheduler::create(tiny_model(), nullptr, opts(8, 4)).is_ok());
}

TEST(Scheduler, FullQueueIsUnavailableAndShutdownCancelsAll) {
  SchedulerOptions oq = opts(1);
  oq.max_queue = 2;
  auto s = make_scheduler(oq);
  Gate gate;
  std::vector<std::shared_ptr<Outcome>> out;
  for (int i = 0; i < 3; ++i) out.push_back(std::make_shared<Outcome>());
  submit_ok(*s, greedy_request(random_prompt(900, 5), 100), collect(out[0], [&](const GenerationEvent& ev) {
    if (!ev.done) gate.wait();
    return true;
  }));
  out[0]->wait_events(1);
  submit_ok(*s, greedy_request(random_prompt(901, 5), 5), collect(out[1]));
  submit_ok(*s, greedy_request(random_prompt(902, 5), 5), collect(out[2]));
  auto full = s->submit(greedy_request(random_prompt(903, 5), 5), nullptr);
  EXPECT_EQ(full.status().code(), StatusCode::kUnavailable);
  SchedulerStats st = s->stats();
  EXPECT_EQ(st.queued, 2);
  EXPECT_EQ(st.active, 1);
  EXPECT_EQ(st.requests_rejected, 1u);

  // Shutdown from another thread while A's sink is blocked; once it stops accepting, let the
  // sink go.
  std::thread closer([&] { s->shutdown(); });
  for (;;) {
    auto r = s->submit(greedy_request({1}, 1), nullptr);
    ASSERT_FALSE(r.is_ok());
    if (r.status().message().find("shutting down") != std::string::npos) break;
    std::this_thread::yield();
  }
  gate.open();
  closer.join();
  for (auto& o : out) {
    o->wait_done();
    EXPECT_EQ(o->finish, FinishReason::kCancelled);
    EXPECT_EQ(o->n_done, 1);
  }
  EXPECT_EQ(s->submit(greedy_request({1}, 1), nullptr).status().code(), StatusCode::kUnavailable);
  s->shutdown();  // idempotent
  st = s->stats();
  EXPECT_EQ(st.requests_cancelled, 3u);
  EXPECT_EQ(st.active, 0);
  EXPECT_EQ(st.queued, 0);
}

TEST(Scheduler, ShutdownFromASinkCancelsEverything) {
  auto s = make_scheduler(opts(1));
  Scheduler* sp = s.get();
  auto oa = std::make_shared<Outcome>(), ob = std::make_shared<Outcome>();
  Gate b_queued;
  submit_ok(*s, greedy_request(random_prompt(950, 6), 50), collect(oa, [&](const GenerationEvent& ev) {
    if (!ev.done && ev.usage.completion_tokens == 2) {
      b_queued.wait();
      sp->shutdown();  // must not try to join its own thread
    }
    return true;
  }));
  oa->wait_events(2);
  submit_ok(*s, greedy_request(random_prompt(951, 6), 5), collect(ob));
  b_queued.open();
  oa->wait_done();
  ob->wait_done();
  EXPECT_EQ(oa->finish, FinishReason::kCancelled);
  EXPECT_EQ(oa->usage.completion_tokens, 2);
  EXPECT_EQ(ob->finish, FinishReason::kCancelled);
  EXPECT_EQ(s->submit(greedy_request({1}, 1), nullptr).status().code(), StatusCode::kUnavailable);
  s.reset();  // joins
}

// Forwards to a LocalExecutor; fails the next wait() once armed (a worker that died mid-step).
class FlakyExecutor final : public ExpertExecutor {
 public:
  explicit FlakyExecutor(const Model& m) : pool_(1), inner_(m.expert_weights(), &pool_) {}
  Ticket submit(int layer, const float* x, int64_t n, const RoutingPlan& plan) override {
    return inner_.submit(layer, x, n, plan);
  }
  Result<std::span<const float>> wait(Ticket t) override {
    auto r = inner_.wait(t);
    if (armed_.exchange(false)) {
      ++failures_;
      return make_error(StatusCode::kUnavailable, "worker 3 at 127.0.0.1:7001 went away");
    }
    return r;
  }
  void arm() { armed_ = true; }
  int failures() const { return failures_; }

 private:
  ThreadPool pool_;
  LocalExecutor inner_;
  std::atomic<bool> armed_{false};
  std::atomic<int> failures_{0};
};

TEST(Scheduler, ExecutorFailureFailsTheStepAndServingGoesOn) {
  auto ex = std::make_shared<FlakyExecutor>(tiny_model());
  SchedulerOptions oe = opts(2);
  oe.executor = ex;
  auto s = make_scheduler(oe);
  const auto pa = random_prompt(1000, 12), pb = random_prompt(1001, 9);
  auto oa = std::make_shared<Outcome>(), ob = std::make_shared<Outcome>();
  Gate b_queued;
  // A's first event holds the scheduler until B is queued, so both are running afterwards;
  // B's second token arms the failure for the next step, which carries both.
  submit_ok(*s, greedy_request(pa, 40), collect(oa, [&](const GenerationEvent& ev) {
    if (ev.usage.completion_tokens == 1) b_queued.wait();
    return true;
  }));
  oa->wait_events(1);
  submit_ok(*s, greedy_request(pb, 40), collect(ob, [&](const GenerationEvent& ev) {
    if (!ev.done && ev.usage.completion_tokens == 2) ex->arm();
    return true;
  }));
  b_queued.open();
  oa->wait_done();
  ob->wait_done();
  EXPECT_EQ(ex->failures(), 1);
  for (auto* o : {oa.get(), ob.get()}) {
    EXPECT_EQ(o->finish, FinishReason::kError);
    EXPECT_EQ(o->error.code(), StatusCode::kUnavailable);
    EXPECT_NE(o->error.message().find("worker 3"), std::string::npos) << o->error.message();
    EXPECT_LT(o->usage.completion_tokens, 40);
  }
  // Tokens before the failure were right.
  const auto ref_a = greedy_alone(pa, 40);
  ASSERT_LE(oa->tokens.size(), ref_a.size());
  EXPECT_TRUE(std::equal(oa->tokens.begin(), oa->tokens.end(), ref_a.begin()));
  EXPECT_EQ(s->stats().requests_failed, 2u);

  // Later requests succeed, including one reusing A's rolled-back cells.
  std::vector<int32_t> pa2 = pa;
  pa2.push_back(17);
  auto oc = std::make_shared<Outcome>(), od = std::make_shared<Outcome>();
  submit_ok(*s, greedy_request(pa2, 10), collect(oc));
  submit_ok(*s, greedy_request(random_prompt(1002, 7), 10), collect(od));
  oc->wait_done();
  od->wait_done();
  EXPECT_EQ(oc->finish, FinishReason::kLength);
  EXPECT_GE(oc->usage.cached_tokens, static_cast<int64_t>(pa.size()));
  EXPECT_EQ(oc->tokens, greedy_alone(pa2, 10));
  EXPECT_EQ(od->tokens, greedy_alone(random_prompt(1002, 7), 10));
  EXPECT_EQ(s->stats().requests_finished, 2u);
}

// ---- text, stop strings, EOG: a byte-level BPE vocabulary whose tokens are ASCII words ----

std::unique_ptr<Tokenizer> ascii_tokenizer(int32_t eos) {
  std::vector<std::string> tokens;
  std::vector<int32_t> types;
  for (int i = 0; i < 512; ++i) {
    if (i == kEos) {
      tokens.push_back("<ctl>");
      types.push_back(static_cast<int32_t>(TokenType::kControl));
    } else {
      tokens.push_back("\xC4\xA0w" + std::to_string(i));  // "Ġw<i>" decodes to " w<i>"
      types.push_back(static_cast<int32_t>(TokenType::kNormal));
    }
  }
  gguf::Writer w;
  w.set("general.architecture", gguf::Value::str("test"));
  w.set("tokenizer.ggml.model", gguf::Value::str("gpt2"));
  w.set("tokenizer.ggml.pre", gguf::Value::str("gpt-2"));
  w.set("tokenizer.ggml.tokens", gguf::Value::str_array(tokens));
  w.set("tokenizer.ggml.token_type", gguf::Value::i32_array(types));
  w.set("tokenizer.ggml.merges", gguf::Value::str_array({}));
  w.set("tokenizer.ggml.eos_token_id", gguf::Value::u32(static_cast<uint32_t>(eos)));
  auto bytes = w.write_bytes();
  EXPECT_TRUE(bytes.is_ok());
  auto f = gguf::File::from_bytes(std::move(*bytes));
  EXPECT_TRUE(f.is_ok()) << f.status().to_string();
  auto t = Tokenizer::from_gguf(**f);
  EXPECT_TRUE(t.is_ok()) << t.status().to_string();
  return t.is_ok() ? std::move(*t) : nullptr;
}

std::string text_of(const Tokenizer& tok, const std::vector<int32_t>& ids) {
  std::string s;
  for (int32_t id : ids) s += tok.token_to_piece(id);
  return s;
}

TEST(Scheduler, TextAndStopStrings) {
  auto tok = ascii_tokenizer(kEos);
  ASSERT_TRUE(tok);
  const auto prompt = random_prompt(1100, 16);
  const auto ref = greedy_alone(prompt, 30);
  ASSERT_EQ(std::count(ref.begin(), ref.end(), kEos), 0);
  const std::string full = text_of(*tok, ref);

  auto s = make_scheduler(opts(2), tok.get());
  auto plain = std::make_shared<Outcome>();
  submit_ok(*s, greedy_request(prompt, 30), collect(plain));
  plain->wait_done();
  EXPECT_EQ(plain->text, full);
  EXPECT_EQ(plain->tokens, ref);

  // A stop string spanning the boundary of tokens 5 and 6: the tail of piece 5 + head of 6.
  const std::string p5 = tok->token_to_piece(ref[5]), p6 = tok->token_to_piece(ref[6]);
  const std::string stop = p5.substr(2) + p6.substr(0, 3);
  const size_t at = full.find(stop);
  ASSERT_NE(at, std::string::npos);
  size_t n_needed = 0, len = 0;  // tokens until the stop string is complete
  while (len < at + stop.size()) len += tok->token_to_piece(ref[n_needed++]).size();
  GenerationRequest r = greedy_request(prompt, 30);
  r.stop = {"never-there", stop};
  auto o = std::make_shared<Outcome>();
  submit_ok(*s, r, collect(o));
  o->wait_done();
  EXPECT_EQ(o->finish, FinishReason::kStop);
  EXPECT_EQ(o->text, full.substr(0, at));
  EXPECT_EQ(o->usage.completion_tokens, static_cast<int64_t>(n_needed));
  EXPECT_EQ(o->text.find(stop), std::string::npos);
}

TEST(Scheduler, EndOfGenerationStopsUnlessIgnored) {
  const auto prompt = random_prompt(1200, 11);
  const auto ref = greedy_alone(prompt, 24);
  // Make the first token that appears for the first time at index >= 4 the EOS.
  size_t k = 4;
  while (k < ref.size() && std::find(ref.begin(), ref.begin() + k, ref[k]) != ref.begin() + k) ++k;
  ASSERT_LT(k, ref.size()) << "degenerate output";
  auto tok = ascii_tokenizer(ref[k]);
  ASSERT_TRUE(tok);
  ASSERT_TRUE(tok->is_eog(ref[k]));

  auto s = make_scheduler(opts(2), tok.get());
  auto o = std::make_shared<Outcome>(), oi = std::make_shared<Outcome>();
  submit_ok(*s, greedy_request(prompt, 24), collect(o));
  GenerationRequest ri = greedy_request(prompt, 24);
  ri.ignore_eos = true;
  submit_ok(*s, ri, collect(oi));
  o->wait_done();
  oi->wait_done();
  EXPECT_EQ(o->finish, FinishReason::kStop);
  EXPECT_EQ(o->tokens, std::vector<int32_t>(ref.begin(), ref.begin() + k));
  EXPECT_EQ(o->usage.completion_tokens, static_cast<int64_t>(k) + 1);  // EOG counts
  EXPECT_EQ(o->text, text_of(*tok, o->tokens));
  EXPECT_EQ(oi->finish, FinishReason::kLength);
  EXPECT_EQ(oi->tokens, ref);
}

}  // namespace
}  // namespace moesh

namespace moesh {
namespace {

// Proposes, for each request (told apart by its prompt), the known greedy continuation — or a
// wrong one — so the scheduler's accept and rollback paths run on purpose.
class KnownContinuation final : public DraftSource {
 public:
  KnownContinuation(std::vector<std::vector<int32_t>> prompts, std::vector<std::vector<int32_t>> outs, bool wrong)
      : prompts_(std::move(prompts)), outs_(std::move(outs)), wrong_(wrong) {}
  void propose(int32_t, std::span<const int32_t> h, int max_tokens, std::vector<int32_t>* out) override {
    out->clear();
    for (size_t r = 0; r < prompts_.size(); ++r) {
      const auto& p = prompts_[r];
      if (h.size() < p.size() || !std::equal(p.begin(), p.end(), h.begin())) continue;
      for (size_t i = h.size() - p.size(); i < outs_[r].size() && static_cast<int>(out->size()) < max_tokens; ++i) {
        const int32_t t = outs_[r][i];
        out->push_back(wrong_ ? (t == 0 ? 1 : t - 1) : t);
      }
      return;
    }
  }
  std::string name() const override { return "known"; }

 private:
  std::vector<std::vector<int32_t>> prompts_, outs_;
  bool wrong_;
};

TEST(SchedulerDraft, BatchedSpeculativeRequestsMatchPlainDecode) {
  const std::vector<size_t> prompt_len = {9, 30, 4};
  const std::vector<int> max_tokens = {24, 18, 30};
  std::vector<std::vector<int32_t>> prompts, expected;
  for (size_t i = 0; i < prompt_len.size(); ++i) {
    prompts.push_back(random_prompt(900 + i, prompt_len[i]));
    expected.push_back(greedy_alone(prompts.back(), max_tokens[i]));
  }
  for (const char* mode : {"right", "wrong", "ngram"}) {
    SCOPED_TRACE(mode);
    SchedulerOptions o = opts(3);
    o.draft_max = 6;
    // Every proposed draft is verified: acceptance does not depend on this machine's step times.
    o.adaptive_drafts = std::string(mode) == "ngram";
    if (std::string(mode) == "ngram") {
      o.draft = "ngram";
    } else {
      o.draft_source = std::make_shared<KnownContinuation>(prompts, expected, std::string(mode) == "wrong");
    }
    auto s = make_scheduler(o);
    ASSERT_NE(s, nullptr);
    std::vector<std::shared_ptr<Outcome>> outs;
    for (size_t i = 0; i < prompts.size(); ++i) {
      outs.push_back(std::make_shared<Outcome>());
      submit_ok(*s, greedy_request(prompts[i], max_tokens[i]), collect(outs.back()));
    }
    int64_t drafted = 0, kept = 0;
    for (size_t i = 0; i < outs.size(); ++i) {
      outs[i]->wait_done();
      EXPECT_EQ(outs[i]->tokens, expected[i]) << "request " << i;
      EXPECT_EQ(outs[i]->finish, FinishReason::kLength);
      EXPECT_EQ(outs[i]->usage.completion_tokens, max_tokens[i]);
      drafted += outs[i]->usage.draft_tokens;
      kept += outs[i]->usage.accepted_draft_tokens;
    }
    const SchedulerStats st = s->stats();
    EXPECT_EQ(st.draft_tokens, static_cast<uint64_t>(drafted));
    EXPECT_EQ(st.accepted_draft_tokens, static_cast<uint64_t>(kept));
    if (std::string(mode) == "right") {
      EXPECT_GT(kept, 0);
      EXPECT_EQ(kept, drafted);
      // Every step verifies up to 6 right drafts per request: 72 tokens in far fewer passes than
      // the ~30 of one token per request and step.
      EXPECT_LT(st.steps, 15u);
    }
    if (std::string(mode) == "wrong") {
      EXPECT_GT(drafted, 0);
      EXPECT_EQ(kept, 0);
    }
  }
}

// A hybrid (qwen3next: recurrent DeltaNet blocks + attention) behind the scheduler. Its slots'
// recurrent state can only be cut at checkpoints, so the prefix cache reuses up to the nearest
// one (here every 16 tokens, and each decode step's end) and prefills the rest; a conversation's
// next turn reuses all of it; rejected drafts are dropped exactly. Tokens always equal the
// sequence decoded alone.
const Model& tiny_hybrid() {
  static std::unique_ptr<Model> model = [] {
    MakeModelSpec s;
    EXPECT_TRUE(MakeModelSpec::defaults_for_name("qwen3next", &s));
    s.seed = 4343;
    s.n_ctx = kCtx;
    return made_model(s, "hybrid.gguf");
  }();
  return *model;
}

TEST(SchedulerHybrid, PrefixCacheConversationAndDraftsMatchPlainDecode) {
  const Model& hm = tiny_hybrid();
  ASSERT_GT(hm.hparams().n_rec_layer, 0);
  const std::vector<int32_t> a = random_prompt(1300, 60);
  std::vector<int32_t> b(a.begin(), a.begin() + 50);
  for (int32_t t : random_prompt(1301, 10)) b.push_back(t == a[50] ? (t + 1) % kEos : t);

  SchedulerOptions o = opts(2);
  o.checkpoints.every = 16;
  auto s = make_scheduler(o, nullptr, hm);
  ASSERT_NE(s, nullptr);
  auto oa = std::make_shared<Outcome>(), ob = std::make_shared<Outcome>();
  submit_ok(*s, greedy_request(a, 10), collect(oa));
  oa->wait_done();
  EXPECT_EQ(oa->tokens, greedy_alone(a, 10, hm));
  // 50 shared tokens, but the recurrent state has checkpoints at 16, 32, 48 and 60: 48 reused.
  submit_ok(*s, greedy_request(b, 15), collect(ob));
  ob->wait_done();
  EXPECT_EQ(ob->usage.cached_tokens, 48);
  EXPECT_EQ(ob->tokens, greedy_alone(b, 15, hm));

  // The conversation's next turn: its history (prompt + every generated token but the last,
  // which ends the last decode step and so has a checkpoint) is reused whole.
  std::vector<int32_t> turn2 = b;
  turn2.insert(turn2.end(), ob->tokens.begin(), ob->tokens.end());
  for (int32_t t : random_prompt(1302, 6)) turn2.push_back(t);
  auto oc = std::make_shared<Outcome>();
  submit_ok(*s, greedy_request(turn2, 10), collect(oc));
  oc->wait_done();
  EXPECT_EQ(oc->usage.cached_tokens, static_cast<int64_t>(b.size() + 15 - 1));
  EXPECT_EQ(oc->tokens, greedy_alone(turn2, 10, hm));

  // Speculative steps with always-wrong drafts: each step's kept token is cut back to exactly.
  const std::vector<std::vector<int32_t>> prompts = {random_prompt(1310, 9), random_prompt(1311, 20)};
  std::vector<std::vector<int32_t>> expected;
  for (const auto& p : prompts) expected.push_back(greedy_alone(p, 16, hm));
  for (const bool wrong : {false, true}) {
    SCOPED_TRACE(wrong ? "wrong drafts" : "right drafts");
    SchedulerOptions od = opts(2);
    od.draft_max = 5;
    od.adaptive_drafts = false;
    od.draft_source = std::make_shared<KnownContinuation>(prompts, expected, wrong);
    auto sd = make_scheduler(od, nullptr, hm);
    std::vector<std::shared_ptr<Outcome>> outs;
    for (const auto& p : prompts) {
      outs.push_back(std::make_shared<Outcome>());
      submit_ok(*sd, greedy_request(p, 16), collect(outs.back()));
    }
    for (size_t i = 0; i < outs.size(); ++i) {
      outs[i]->wait_done();
      EXPECT_EQ(outs[i]->tokens, expected[i]) << "request " << i;
      EXPECT_GT(outs[i]->usage.draft_tokens, 0);
      if (wrong) {
        EXPECT_EQ(outs[i]->usage.accepted_draft_tokens, 0);
      } else {
        EXPECT_EQ(outs[i]->usage.accepted_draft_tokens, outs[i]->usage.draft_tokens);
      }
    }
  }
}

}  // namespace
}  // namespace moesh

namespace moesh {
namespace {

// The model's own NextN head as the scheduler's draft source (glm4moe; the bigram model of
// util/nextn_model.h, whose head drafts what the model generates): concurrent requests, prompts
// fed in chunks across steps, a slot reused for a prompt sharing a prefix — each stream's tokens
// equal it decoded alone, and every draft is kept (the head got each slot's positions, in
// order, paired with the tokens that followed them).
TEST(SchedulerDraft, NextnHeadDraftsForEverySlot) {
  const auto dir = std::filesystem::temp_directory_path() / ("moesh-sched-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "bigram.gguf").string();
  ASSERT_TRUE(test::write_nextn_bigram_model(path).is_ok());
  auto loaded = Model::load(path);
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().to_string();
  const Model& m = **loaded;
  std::vector<std::vector<int32_t>> prompts = {random_prompt(1400, 9), random_prompt(1401, 40), random_prompt(1402, 5)};
  std::vector<int32_t> shared = prompts[1];  // the second wave reuses request 1's slot prefix
  shared.resize(30);
  for (int32_t t : random_prompt(1403, 7)) shared.push_back(t);
  SchedulerOptions o = opts(3, 24);  // 40 prompt tokens: two chunks
  o.draft = "nextn";
  o.draft_max = 3;
  o.adaptive_drafts = false;
  auto s = make_scheduler(o, nullptr, m);
  ASSERT_NE(s, nullptr);
  for (int wave = 0; wave < 2; ++wave) {
    SCOPED_TRACE(wave == 0 ? "three requests" : "prefix reuse");
    const std::vector<std::vector<int32_t>> ps = wave == 0 ? prompts : std::vector<std::vector<int32_t>>{shared};
    std::vector<std::shared_ptr<Outcome>> outs;
    for (const auto& p : ps) {
      outs.push_back(std::make_shared<Outcome>());
      submit_ok(*s, greedy_request(p, 20), collect(outs.back()));
    }
    for (size_t i = 0; i < outs.size(); ++i) {
      outs[i]->wait_done();
      EXPECT_EQ(outs[i]->tokens, greedy_alone(ps[i], 20, m)) << "request " << i;
      // Every step drafts its full share: 3 + 3 + 3 + 3 after the first token, then the 2 left.
      EXPECT_EQ(outs[i]->usage.draft_tokens, 14) << "request " << i;
      EXPECT_EQ(outs[i]->usage.accepted_draft_tokens, outs[i]->usage.draft_tokens) << "request " << i;
      if (wave == 1) {
        EXPECT_GT(outs[i]->usage.cached_tokens, 0);
      }
    }
  }
}

}  // namespace
}  // namespace moesh
