// Scheduler internals shared by scheduler.cpp (public API, thread loop, cancellation) and
// scheduler_step.cpp (admission with the prefix cache, one batched step, sampling, events).
//
// Ownership: everything under `mu` (queue, cancel requests, counters) may be touched by any
// thread; slots, jobs in slots and the Context belong to the scheduler thread alone. Sinks run
// on the scheduler thread with `mu` released, so a sink may call back into the scheduler.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "moesh/serve/scheduler.h"
#include "moesh/text/stop_matcher.h"

namespace moesh {

// One accepted request, from submit() until its done event.
struct SchedJob {
  SchedJob(uint64_t id_, GenerationRequest req_, EventSink sink_)
      : id(id_), req(std::move(req_)), sink(std::move(sink_)), sampler(req.sampling) {}

  uint64_t id;
  GenerationRequest req;
  EventSink sink;
  Sampler sampler;
  std::optional<StreamDecoder> decoder;  // with a tokenizer
  std::optional<StopMatcher> stop;       // with stop strings

  int slot = -1;                 // the slot it runs in; -1 while queued
  std::vector<int32_t> history;  // prompt then generated tokens (the penalties' window)
  int64_t n_prompt_fed = 0;      // prompt tokens whose KV is in the slot (cached or computed)
  int32_t next_token = -1;       // sampled, fed to the model at the next step
  int64_t n_generated = 0;
  Usage usage;
  DraftAcceptance acceptance;   // this request's drafts (speculative decoding)
  std::vector<int32_t> drafts;  // fed this step after next_token

  // Output gathered during a step, sent after it.
  std::string out_text;
  std::vector<int32_t> out_tokens;
  std::vector<TokenLogprob> out_logprobs;  // with req.top_logprobs >= 0, one per out_tokens entry
  FinishReason finish = FinishReason::kNone;
  Status error;

  bool prefilling() const { return n_prompt_fed < static_cast<int64_t>(req.prompt.size()); }
};

// A KV sequence. `cells` mirrors the tokens whose K/V the sequence holds, in order, also after
// its request ended: that is the prefix cache.
struct SchedSlot {
  std::vector<int32_t> cells;
  uint64_t last_used = 0;  // admission tick of the last request (LRU among equal prefixes)
  std::unique_ptr<SchedJob> job;
};

struct Scheduler::Impl {
  Impl(const Model& m, const Tokenizer* t, const SchedulerOptions& o, int64_t n_ctx_);

  const Model& model;
  const Tokenizer* tok;
  SchedulerOptions opts;
  int64_t n_ctx;

  // --- shared state, under mu ---
  mutable std::mutex mu;
  std::condition_variable cv;
  bool stopping = false;
  std::deque<std::unique_ptr<SchedJob>> queue;
  std::vector<uint64_t> cancel_ids;
  uint64_t next_id = 1;
  SchedulerStats stats;

  std::mutex join_mu;  // serialises shutdown()'s join
  std::thread thread;

  // --- scheduler thread only ---
  std::unique_ptr<Context> ctx;
  std::vector<SchedSlot> slots;
  uint64_t tick = 0;
  std::vector<Context::BatchToken> batch;
  std::vector<float> logits;
  std::vector<float> masked;           // a logits row with the constraint's refused tokens at -inf
  std::vector<uint8_t> allowed;        // the constraint's mask
  std::shared_ptr<DraftSource> draft;  // null: no speculative decoding
  StepTimeModel step_times;            // by tokens per forward pass, for the draft cost model

  void run();  // the scheduler thread

  // scheduler.cpp
  void handle_cancels(std::vector<uint64_t> ids);
  void cancel_everything();
  // Sends the job's done event, updates the counters, frees its slot (if any).
  void finish_job(std::unique_ptr<SchedJob> job, FinishReason why, Status error = Status());
  // Sends the step's text/tokens of a running job; false when the sink wants it cancelled.
  bool send_progress(SchedJob& job);

  // scheduler_step.cpp
  void admit(std::unique_ptr<SchedJob> job);  // needs a free slot
  bool has_free_slot() const;
  int n_active() const;
  void step();
};

// Length of the common prefix of a and b.
size_t common_prefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b);

}  // namespace moesh
