// Speculative decoding: more tokens per forward pass, so a step over a WAN costs one round trip
// per MoE layer for 1 + n_draft tokens instead of one.
//
// A DraftSource proposes how the sequence may continue: prompt lookup / n-grams, or the model's
// own NextN/MTP head (NextnDraft). The decoder feeds the next token plus the drafts in
// ONE forward pass, samples each position's logits in order — exactly one Sampler call per
// emitted token, with the same logits bits and history as plain decoding (batch == incremental)
// — accepts drafts while they equal what was sampled, emits the first token that differs, and
// truncates the rejected drafts' KV cells. So the output is the plain decoding output, token for
// token, for greedy AND for seeded sampling (the RNG is consumed identically), not just the same
// distribution.
//
// How many drafts to verify is decided per step by a cost model: it measures the step time for
// each number of tokens fed and the acceptance rate of each draft position, and picks the draft
// length with the best expected tokens per second, 0 (plain decoding) when drafting would lose.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "moesh/model/model.h"
#include "moesh/model/sampling.h"
#include "moesh/util/status.h"

namespace moesh {

class DraftSource {
 public:
  virtual ~DraftSource() = default;
  // Appends up to max_tokens proposed continuations of sequence `seq`, whose `history` is
  // prompt + every token emitted so far (oldest first), to *out (cleared first). Proposing
  // nothing is always allowed; a proposal never changes the output, only the step's length.
  virtual void propose(int32_t seq, std::span<const int32_t> history, int max_tokens, std::vector<int32_t>* out) = 0;
  virtual std::string name() const = 0;

  // Sources that draft from the model's own hidden states (a NextN/MTP head) return true: the
  // decoder then keeps the final hidden states (Context::set_keep_hidden) and reports every
  // position it keeps, in order, through on_hidden.
  virtual bool needs_hidden() const { return false; }
  // Positions first..first+n-1 of `seq` are now part of the sequence: rows [n][n_embd] are their
  // final normed hidden states (output_norm(h), what the output head reads), next[n] the token
  // that followed each. Reporting positions before the end of what was reported replaces them
  // (a slot reused for a prompt with the same prefix); a gap (cells copied from elsewhere)
  // restarts the source's state of `seq` there.
  virtual void on_hidden(int32_t seq, int64_t first, int64_t n, const float* rows, const int32_t* next) {}
  // The sequence's cells were dropped or replaced wholesale: forget what was reported.
  virtual void forget(int32_t seq) {}
};

// Prompt lookup: the longest suffix of the history of n_max..n_min tokens that occurred earlier
// in the history is matched against its most recent earlier occurrence, and the tokens that
// followed it there are proposed, continuing periodically past the end of the history (a match d
// tokens back predicts text of period d) (llama.cpp's "ngram" / prompt-lookup family). Quoting, code
// editing and repetitive text draft well; novel text proposes nothing, which costs nothing.
class NgramDraft final : public DraftSource {
 public:
  explicit NgramDraft(int n_min = 1, int n_max = 4);
  void propose(int32_t seq, std::span<const int32_t> history, int max_tokens, std::vector<int32_t>* out) override;
  std::string name() const override { return "ngram"; }

 private:
  int n_min_, n_max_;
};

// The model's own NextN/MTP head (src/model/nextn.cpp; glm4moe): a block after the decoder that
// predicts the token after next from the next token's embedding and the decoder's final hidden
// state, run on the backbone with its own cache of slots (one per position the decoder kept)
// and its own copy of that block's experts. It drafts up to `max_depth` tokens per step by feeding
// its output back; the temporary slots of those drafts are cut after proposing. Proposals are
// the head's argmax (the decoder's sampler still decides every token).
class NextnDraft final : public DraftSource {
 public:
  // `model` must hold a runnable NextN block (make_draft_source checks); `pool` runs it and
  // must outlive this source; n_ctx: cells per sequence (<= 0: the model's training context).
  NextnDraft(const Model& model, ThreadPool* pool, int64_t n_ctx, int max_depth);
  ~NextnDraft() override;
  void propose(int32_t seq, std::span<const int32_t> history, int max_tokens, std::vector<int32_t>* out) override;
  std::string name() const override { return "nextn"; }
  bool needs_hidden() const override { return true; }
  void on_hidden(int32_t seq, int64_t first, int64_t n, const float* rows, const int32_t* next) override;
  void forget(int32_t seq) override;

  struct Stats {
    int64_t runs = 0;      // head forward passes that produced a draft
    int64_t failures = 0;  // passes that failed (no draft that step; the output is unaffected)
  };
  const Stats& stats() const { return stats_; }
  const Status& last_error() const { return last_error_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  Stats stats_;
  Status last_error_ = Status::ok();
};

// What a model-based draft source runs on.
struct DraftEnv {
  const Model* model = nullptr;
  ThreadPool* pool = nullptr;  // must outlive the source
  int64_t n_ctx = 0;
  int nextn_depth = 3;  // most drafts per step of the NextN head
};
// "ngram" -> NgramDraft; "nextn" (alias "mtp") -> NextnDraft for env.model, kUnsupported naming
// why when the model has no runnable NextN block; kInvalidArgument naming the known sources
// otherwise.
Result<std::unique_ptr<DraftSource>> make_draft_source(const std::string& name, const DraftEnv& env = {});

// The cost model's parts, shared by SpeculativeDecoder (one sequence) and the serving scheduler
// (many sequences in one forward pass).
//
// Step time by tokens fed: the measured mean for that count, else a least-squares line through
// the measured means, else (one count measured) that count's time — drafts assumed free, so they
// get tried. Never less than a smaller count's measured mean: a pass with more tokens does not
// get cheaper, and on a busy machine a noisy sample must not make drafts look free.
class StepTimeModel {
 public:
  void record(int64_t n_tokens, double seconds);
  bool empty() const { return n_points_ == 0; }
  int points() const { return n_points_; }  // distinct token counts measured
  bool measured(int64_t n_tokens) const;
  double predict(int64_t n_tokens) const;

 private:
  static constexpr int64_t kMaxTracked = 1024;  // larger batches share the last bucket
  double fitted(size_t bucket) const;           // the mean or the line, without the floor
  std::vector<double> sum_ = std::vector<double>(kMaxTracked + 1, 0.0);
  std::vector<int64_t> n_ = std::vector<int64_t>(kMaxTracked + 1, 0);
  int n_points_ = 0;
};

// How often draft position i (1-based) was kept when it was checked (all before it kept), with a
// prior of one half, so an untried position counts as a coin flip.
class DraftAcceptance {
 public:
  void record(int position, bool kept);
  double keep(int position) const;

 private:
  std::vector<int64_t> fed_, kept_;
};

// The draft length k in [0, cap] with the best expected tokens per second for a forward pass
// that already carries n_base tokens emitting about one token each:
//   maximise (n_base - 1 + E_k) / t(n_base + k),  E_k = 1 + sum_{i<=k} prod_{j<=i} keep(j).
// Fewer than two pass sizes measured: 1 when nothing or only n_base is measured (learn what one
// more token costs, cheaply), 0 when only another size is (measure the baseline first).
int choose_draft_length(const StepTimeModel& t, const DraftAcceptance& a, int cap, int64_t n_base);

struct SpeculativeParams {
  int draft_max = 16;    // most drafts verified in one step
  bool adaptive = true;  // false: always verify what the source proposes (up to draft_max)
  // What a pass of n tokens is taken to cost, in seconds, instead of its measured time (null:
  // measured). For tests of the cost model's decisions, which must not depend on how busy the
  // machine is.
  std::function<double(int64_t n_tokens)> step_cost;
};

struct SpeculativeStats {
  int64_t steps = 0;        // forward passes after the prompt
  int64_t emitted = 0;      // tokens emitted by step()
  int64_t drafted = 0;      // draft tokens fed to the model
  int64_t accepted = 0;     // draft tokens that matched and were kept
  double step_seconds = 0;  // time in the forward passes of step()
};

// Generates one sequence of a Context with optional drafting (draft may be null: plain decoding
// through the same code path).
class SpeculativeDecoder {
 public:
  SpeculativeDecoder(Context* ctx, int32_t seq, Sampler* sampler, DraftSource* draft, SpeculativeParams p = {});

  // Feeds the prompt (the sequence's cells continue from what it holds) and emits the first
  // token, which *first receives.
  Status start(std::span<const int32_t> prompt, int32_t* first);
  // Emits 1..1+draft tokens into *out (cleared first), at most max_new (>= 1). The tokens are
  // what plain decoding would have produced next. After an error the sequence holds exactly the
  // cells it had before the call.
  Status step(int max_new, std::vector<int32_t>* out);

  // History: prompt + emitted tokens. The last emitted token is not in the KV cache yet.
  const std::vector<int32_t>& history() const { return history_; }
  const SpeculativeStats& stats() const { return stats_; }
  // The draft length the cost model would choose now (for tests and `--timing`).
  int planned_draft() const;

 private:
  // Gives a draft source that needs them the hidden states of positions first..first+n-1 (rows
  // of the last decode, in feed order), each followed by next[j].
  void report_hidden(int64_t first, int64_t n, const int32_t* next);

  Context* ctx_;
  int32_t seq_;
  Sampler* sampler_;
  DraftSource* draft_;
  SpeculativeParams p_;
  std::vector<int32_t> history_;
  std::vector<int32_t> feed_, proposal_;
  std::vector<float> logits_;
  SpeculativeStats stats_;
  StepTimeModel times_;
  DraftAcceptance acceptance_;
  int64_t since_probe_ = 0;
};

}  // namespace moesh
