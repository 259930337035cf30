// The serving scheduler: continuous batching over a fixed set of slots with a prefix cache.
//
// What it is for: `moesh serve` turns HTTP requests into GenerationRequests (token ids, sampling,
// stops) and submits them here. One scheduler thread owns the Context and runs steps:
//
//   each step = ONE Context::decode_batch() holding, for every active slot, its next token
//               (decode) or its next prompt chunk (prefill), up to max_batch_tokens in all
//
// so each MoE layer costs one executor call — one dispatch round trip to the workers — for all
// streams together. Requests waiting in the queue join at the next step when a slot is free;
// finished or cancelled ones leave after the step that finished them.
//
// Slots and the prefix cache: slot i is KV sequence i. A slot remembers the tokens its cells
// hold after a request ends. A new request goes to the free slot sharing the longest prefix
// with its prompt (a conversation returns to the slot holding its history); the slot keeps the
// shared cells and only the rest of the prompt is computed (cached_tokens in the usage). When a
// busy slot holds a longer shared prefix than any free one, its cells are copied
// (SequenceState::copy). Because every row's bits are independent of the batch (determinism
// contract), cached, chunked and batched runs give the same tokens as a request run alone.
//
// Events: the sink is called on the scheduler thread after each step with the new text (valid
// UTF-8, never part of a stop string), then once with done = true and the finish reason and
// usage (the last step's text rides on that done event). Every accepted request gets exactly one
// done event, whatever ends it. A sink returning false (client gone) cancels the request and
// frees its slot at once; its done event (kCancelled) still follows, so the caller can clean up.
// Sinks may call submit(), cancel() and stats() (no lock is held while a sink runs); a cancel()
// from a sink takes effect before the next step. An end-of-generation token is left out of text
// and tokens (it still counts as a completion token); a stop string is left out of the text
// (tokens carries every other sampled token, including those that spelled the stop string).
//
// Errors: a failed forward pass (e.g. a remote worker died) ends every request that had tokens
// in that step with kError and the Status; their KV was rolled back by decode_batch, other
// requests keep running and the scheduler keeps serving.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "moesh/model/model.h"
#include "moesh/model/sampling.h"
#include "moesh/model/speculative.h"
#include "moesh/moe/executor.h"
#include "moesh/text/tokenizer.h"
#include "moesh/util/status.h"

namespace moesh {

// Constrained decoding (response_format): which tokens may come next. A request's constraint
// is used from the scheduler thread only, one call sequence per generated token: allowed(), then
// accept() with the token sampled among them.
class TokenConstraint {
 public:
  virtual ~TokenConstraint() = default;
  // allowed[t] = 1 for every token id t (allowed.size() == n_vocab) that keeps the output
  // valid; end-of-generation tokens only where the output is complete. kInvalidArgument when
  // nothing may follow (a grammar that cannot continue: the request fails with that error).
  virtual Status allowed(std::vector<uint8_t>& allowed) = 0;
  // The token chosen; kInvalidArgument when allowed() did not allow it (a scripted token).
  virtual Status accept(int32_t token) = 0;
};

// One generated token's log-probability under the model (log-softmax of the raw logits, before
// temperature, penalties and constraints) and the most likely alternatives, most likely first.
struct TokenLogprob {
  int32_t token = -1;
  float logprob = 0;
  std::vector<std::pair<int32_t, float>> top;
};

struct GenerationRequest {
  std::vector<int32_t> prompt;  // token ids, BOS/template already applied; non-empty
  int32_t max_tokens = 16;      // generated tokens at most (>= 1)
  SamplingParams sampling;
  std::vector<std::string> stop;  // stop strings (not included in the output)
  bool ignore_eos = false;        // keep going past end-of-generation tokens
  // Speculative decoding for this request (with the scheduler's draft source): -1 = the
  // scheduler's draft_max, 0 = off, N = at most N drafts per step. The output is the same either
  // way; drafts only change how many tokens a step carries.
  int draft_max = -1;
  // Test hook: the first generated tokens are these, in order, instead of what the sampler picks
  // (the model still runs every step; sampling resumes after them). `moesh serve --test-hooks`
  // sets it from a request's moesh_scripted_output, so API tests get a known output.
  std::vector<int32_t> scripted_tokens;
  // -1: no log-probabilities; 0..kMaxTopLogprobs: each token's TokenLogprob with this many
  // alternatives (GenerationEvent::logprobs).
  int top_logprobs = -1;
  // Null: unconstrained. Otherwise only tokens it allows are sampled; drafting is off for the
  // request (each draft would need the grammar state of the position before it).
  std::shared_ptr<TokenConstraint> constraint;
  // Text renders control tokens too (gpt-oss's harmony markers, which the chat output parser
  // reads); end-of-generation tokens still end the text without appearing in it.
  bool render_special = false;
};
inline constexpr int kMaxTopLogprobs = 20;

enum class FinishReason { kNone, kStop, kLength, kCancelled, kError };
const char* finish_reason_name(FinishReason r);  // "stop", "length", "cancelled", "error"

struct Usage {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  int64_t cached_tokens = 0;          // prompt tokens whose KV came from the prefix cache
  int64_t draft_tokens = 0;           // drafted tokens verified (speculative decoding)
  int64_t accepted_draft_tokens = 0;  // of which kept (each saved a forward pass)
};

struct GenerationEvent {
  uint64_t request_id = 0;
  std::string text;                    // new text since the last event (may be empty)
  std::vector<int32_t> tokens;         // tokens generated since the last event
  std::vector<TokenLogprob> logprobs;  // one per entry of `tokens` when the request asked (top_logprobs >= 0)
  bool done = false;
  FinishReason finish = FinishReason::kNone;
  Status error;  // set when finish == kError
  Usage usage;   // running counts; final when done
};

// Called on the scheduler thread; return false to cancel (the client went away).
using EventSink = std::function<bool(const GenerationEvent&)>;

struct SchedulerOptions {
  int n_slots = 4;                           // --parallel: sequences decoded together
  int64_t n_ctx = 0;                         // cells per slot; <= 0: the model's context length
  int n_threads = 0;                         // Context thread pool; <= 0: all cores
  std::shared_ptr<ExpertExecutor> executor;  // null: local experts
  int64_t max_batch_tokens = 256;            // tokens per forward pass (decode tokens first, then prefill);
                                             // must be >= n_slots so every stream fits in each step
  int max_queue = 256;                       // waiting requests beyond this are refused (kUnavailable)
  // Speculative decoding: a draft source name (make_draft_source: "ngram") or "" for none, and
  // the most drafts one request verifies per step. Drafts ride in the same forward pass as every
  // other stream's tokens; how many is chosen per request and step by the cost model
  // (choose_draft_length) from the measured step time per batch size and the request's own
  // acceptance. Tokens are the same as without drafting (one sampler call per emitted token).
  std::string draft;
  int draft_max = 16;
  // false: verify every draft the source proposes (up to draft_max) instead of letting the cost
  // model choose how many (tests that must exercise acceptance whatever the machine's timing).
  bool adaptive_drafts = true;
  // A draft source given directly (tests, embedders); overrides `draft`. Called on the scheduler
  // thread only.
  std::shared_ptr<DraftSource> draft_source;
  // Two micro-batches per step with remote workers (ContextParams::micro_batching).
  MicroBatching micro_batching = MicroBatching::kAuto;
  // Hybrid models: where each slot's recurrent state keeps checkpoints (ContextParams). The
  // prefix cache reuses a slot's tokens up to its nearest checkpoint; the rest is prefilled.
  CheckpointPolicy checkpoints = {};
  // Blocks run on span peers (ContextParams::spans); null: all here.
  std::shared_ptr<SpanRunner> spans;
};

// Counters since create(). requests_submitted counts accepted requests; each one ends as exactly
// one of finished (stop / length), cancelled or failed. requests_rejected counts submit() errors.
struct SchedulerStats {
  uint64_t requests_submitted = 0, requests_finished = 0, requests_cancelled = 0, requests_failed = 0,
           requests_rejected = 0;
  uint64_t prompt_tokens = 0, cached_prompt_tokens = 0, generated_tokens = 0;
  uint64_t steps = 0, batch_tokens = 0;                  // forward passes and the tokens they carried
  uint64_t max_batch_seen = 0;                           // largest number of sequences in one step
  uint64_t batch_sequences = 0;                          // sum over steps of the sequences in each
  uint64_t draft_tokens = 0, accepted_draft_tokens = 0;  // speculative decoding
  uint64_t split_steps = 0;                              // steps run as two micro-batches
  int active = 0, queued = 0, n_slots = 0;
  double busy_seconds = 0;  // time spent inside decode_batch
};

class Scheduler {
 public:
  // Starts the scheduler thread. `model` and `tokenizer` must outlive it; tokenizer may be null
  // (then events carry tokens only, stop strings are refused and EOG tokens are not detected).
  // kInvalidArgument for unusable options (n_slots < 1, max_batch_tokens < n_slots, ...).
  static Result<std::unique_ptr<Scheduler>> create(const Model& model, const Tokenizer* tokenizer,
                                                   const SchedulerOptions& opts);
  ~Scheduler();  // shutdown()

  // Checks the request (empty prompt, max_tokens < 1, bad sampling values, empty stop strings
  // or stop strings without a tokenizer -> kInvalidArgument; ids out of range, prompt +
  // max_tokens beyond n_ctx -> kOutOfRange; each with a message a client can read; full queue
  // or after shutdown -> kUnavailable) and queues it. Returns the request id (never 0).
  Result<uint64_t> submit(GenerationRequest req, EventSink sink);
  // Cancels a queued or running request (its sink gets a final kCancelled event). Unknown ids
  // are ignored.
  void cancel(uint64_t request_id);
  // Stops accepting, cancels everything and joins the thread. Idempotent. Called from a sink it
  // only stops the scheduler (the thread cannot join itself); the destructor joins.
  void shutdown();

  SchedulerStats stats() const;
  const SchedulerOptions& options() const;
  int64_t n_ctx() const;  // cells per slot

  struct Impl;

 private:
  explicit Scheduler(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace moesh
