// Scheduler: admission with the prefix cache, and one batched step (scheduler thread only).
//
// A step packs, in this order,
//   1. one decode token per generating slot (its last sampled token), so streams keep flowing,
//   2. prompt chunks of prefilling slots, oldest request first, until max_batch_tokens,
// into ONE Context::decode_batch. Logits are asked for the decode tokens and for the last prompt
// token of a chunk that completes its prompt; each such row is sampled with the request's own
// Sampler. Every row's bits are independent of the rest of the batch, so the tokens a request
// gets do not depend on what ran next to it, on chunking or on cached prefixes.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>

#include "serve/scheduler_internal.h"

namespace moesh {

bool Scheduler::Impl::has_free_slot() const {
  return std::any_of(slots.begin(), slots.end(), [](const SchedSlot& s) { return !s.job; });
}

int Scheduler::Impl::n_active() const {
  return static_cast<int>(
      std::count_if(slots.begin(), slots.end(), [](const SchedSlot& s) { return s.job != nullptr; }));
}

// Picks the slot for `job` and how many of its prompt tokens are already in KV.
//
// At most prompt.size() - 1 tokens are reused: the last prompt token must be computed to get
// the logits of the first generated token. Among free slots the longest shared prefix wins,
// ties going to the least recently used (keeps the other caches alive longest). When a busy
// slot shares more, its cells are copied into the least recently used free slot.
void Scheduler::Impl::admit(std::unique_ptr<SchedJob> job) {
  const std::vector<int32_t>& prompt = job->req.prompt;
  const size_t cap = prompt.size() - 1;
  SequenceState& state = ctx->state();

  int best = -1, lru = -1, donor = -1;
  size_t best_len = 0, donor_len = 0;
  for (int i = 0; i < static_cast<int>(slots.size()); ++i) {
    const SchedSlot& s = slots[i];
    // Only where the state can be cut exactly: anywhere for KV cells, at a checkpoint for a
    // recurrent state (the tokens after it are computed again, as prompt).
    const size_t len =
        static_cast<size_t>(state.restorable(i, static_cast<int64_t>(std::min(common_prefix(s.cells, prompt), cap))));
    if (s.job) {
      if (len > donor_len) donor = i, donor_len = len;
      continue;
    }
    if (lru < 0 || s.last_used < slots[lru].last_used) lru = i;
    if (best < 0 || len > best_len || (len == best_len && s.last_used < slots[best].last_used)) {
      best = i;
      best_len = len;
    }
  }
  // admit() is only called with a free slot.
  int target = best;
  size_t reuse = best_len;
  if (donor >= 0 && donor_len > best_len) {
    Status st = state.copy(donor, lru, static_cast<int64_t>(donor_len));
    if (st.is_ok()) {
      target = lru;
      reuse = donor_len;
      slots[lru].cells.assign(slots[donor].cells.begin(),
                              slots[donor].cells.begin() + static_cast<ptrdiff_t>(donor_len));
      if (draft) draft->forget(lru);  // its draft state was of the slot's old cells
    } else {
      // Cannot happen while `cells` mirrors the cache; fall back to the free slot's own prefix.
      spdlog::warn("scheduler: prefix copy from slot {} failed: {}", donor, st.to_string());
    }
  }

  SchedSlot& slot = slots[target];
  if (Status st = state.truncate(target, static_cast<int64_t>(reuse)); !st.is_ok()) {
    // Cannot happen (reuse is restorable); start the prompt from scratch rather than guess.
    spdlog::warn("scheduler: reusing {} cached tokens of slot {} failed: {}", reuse, target, st.to_string());
    reuse = 0;
    (void)state.truncate(target, 0);
  }
  slot.cells.resize(reuse);
  slot.last_used = ++tick;
  job->slot = target;
  job->n_prompt_fed = static_cast<int64_t>(reuse);
  job->usage.cached_tokens = static_cast<int64_t>(reuse);
  {
    std::lock_guard<std::mutex> lk(mu);
    ++stats.active;
    stats.prompt_tokens += prompt.size();
    stats.cached_prompt_tokens += reuse;
  }
  slot.job = std::move(job);
}

namespace {

// Text after the stop matcher (when the request has stop strings).
void add_text(SchedJob& j, const std::string& piece) {
  if (!j.stop) {
    j.out_text += piece;
    return;
  }
  j.out_text += j.stop->push(piece);
  if (j.stop->stopped()) j.finish = FinishReason::kStop;
}

// End of generation without a stop match: release what the decoder and matcher held back.
void flush_text(SchedJob& j) {
  if (j.decoder) add_text(j, j.decoder->flush());
  if (j.stop && !j.stop->stopped()) j.out_text += j.stop->flush();
}

// Log-softmax of the raw row at `t`, and the `top` most likely tokens (ties: lower id first).
// Accumulated in double in index order, so the values do not depend on anything but the row.
TokenLogprob token_logprob(const float* lg, int64_t n_vocab, int32_t t, int top) {
  float mx = -INFINITY;
  for (int64_t v = 0; v < n_vocab; ++v) mx = std::max(mx, lg[v]);
  double sum = 0;
  for (int64_t v = 0; v < n_vocab; ++v) sum += std::exp(static_cast<double>(lg[v]) - mx);
  const double log_z = static_cast<double>(mx) + std::log(sum);
  TokenLogprob out;
  out.token = t;
  out.logprob = static_cast<float>(static_cast<double>(lg[t]) - log_z);
  if (top > 0) {
    std::vector<int32_t> ids(static_cast<size_t>(n_vocab));
    for (int64_t v = 0; v < n_vocab; ++v) ids[static_cast<size_t>(v)] = static_cast<int32_t>(v);
    const auto k = static_cast<size_t>(std::min<int64_t>(top, n_vocab));
    std::partial_sort(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(k), ids.end(),
                      [&](int32_t a, int32_t b) { return lg[a] > lg[b] || (lg[a] == lg[b] && a < b); });
    for (size_t q = 0; q < k; ++q) {
      out.top.emplace_back(ids[q], static_cast<float>(static_cast<double>(lg[ids[q]]) - log_z));
    }
  }
  return out;
}

}  // namespace

// One slot's share of the step's batch.
struct StepPart {
  int slot;
  int64_t n;    // tokens in the batch
  bool logits;  // its last token asks for logits (a token is sampled)
  bool decode;  // a generated token plus j.drafts (else a prompt chunk)
};

void Scheduler::Impl::step() {
  KvCache& kv = ctx->kv();
  batch.clear();
  std::vector<StepPart> parts;

  // 1. Decode tokens (and drafts). The cost model judges each request's drafts against a pass
  // carrying every generating slot's token plus the drafts chosen so far.
  int64_t n_base = 0;
  for (const SchedSlot& s : slots) n_base += s.job && !s.job->prefilling() ? 1 : 0;
  for (int i = 0; i < static_cast<int>(slots.size()); ++i) {
    SchedSlot& s = slots[i];
    if (!s.job || s.job->prefilling()) continue;
    if (kv.seq_len(i) >= n_ctx) {
      // submit() keeps prompt + max_tokens within n_ctx, so this is only a safety net.
      finish_job(std::move(s.job), FinishReason::kLength);
      continue;
    }
    SchedJob& j = *s.job;
    // Speculative decoding: drafts ride along; each position's logits are sampled in order below.
    j.drafts.clear();
    const int want = j.req.constraint ? 0 : j.req.draft_max < 0 ? opts.draft_max : j.req.draft_max;
    if (draft && want > 0) {
      const int64_t cap = std::min<int64_t>({want, j.req.max_tokens - j.n_generated - 1, n_ctx - kv.seq_len(i) - 1,
                                             opts.max_batch_tokens - static_cast<int64_t>(batch.size()) - 1});
      // Asked for no more than the cost model would verify (a model head pays per draft).
      const int ask = cap <= 0 ? 0
                      : opts.adaptive_drafts
                          ? choose_draft_length(step_times, j.acceptance, static_cast<int>(cap), n_base)
                          : static_cast<int>(cap);
      if (ask > 0) draft->propose(i, j.history, ask, &j.drafts);
      const int n_prop = std::min(ask, static_cast<int>(j.drafts.size()));
      const int k = opts.adaptive_drafts ? choose_draft_length(step_times, j.acceptance, n_prop, n_base) : n_prop;
      j.drafts.resize(static_cast<size_t>(k));
      n_base += k;
    }
    batch.push_back({i, j.next_token, true});
    for (const int32_t d : j.drafts) batch.push_back({i, d, true});
    parts.push_back({i, 1 + static_cast<int64_t>(j.drafts.size()), true, true});
  }
  // 2. Prompt chunks, oldest request first.
  std::vector<int> pre;
  for (int i = 0; i < static_cast<int>(slots.size()); ++i) {
    if (slots[i].job && slots[i].job->prefilling()) pre.push_back(i);
  }
  std::sort(pre.begin(), pre.end(), [&](int a, int b) { return slots[a].job->id < slots[b].job->id; });
  int64_t budget = opts.max_batch_tokens - static_cast<int64_t>(batch.size());
  for (int i : pre) {
    if (budget <= 0) break;
    SchedJob& j = *slots[i].job;
    const int64_t n_prompt = static_cast<int64_t>(j.req.prompt.size());
    const int64_t n = std::min(n_prompt - j.n_prompt_fed, budget);
    const bool last = j.n_prompt_fed + n == n_prompt;
    for (int64_t k = 0; k < n; ++k) {
      batch.push_back({i, j.req.prompt[j.n_prompt_fed + k], last && k == n - 1});
    }
    parts.push_back({i, n, last, false});
    budget -= n;
  }
  if (batch.empty()) return;

  const int64_t n_vocab = model.hparams().n_vocab;
  int64_t n_rows = 0;
  for (const StepPart& p : parts) n_rows += p.decode ? p.n : (p.logits ? 1 : 0);
  logits.resize(static_cast<size_t>(n_rows * n_vocab));

  const auto t0 = std::chrono::steady_clock::now();
  Status st = ctx->decode_batch(batch, logits.data());
  const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  {
    std::lock_guard<std::mutex> lk(mu);
    ++stats.steps;
    stats.batch_tokens += batch.size();
    stats.max_batch_seen = std::max<uint64_t>(stats.max_batch_seen, parts.size());
    stats.batch_sequences += parts.size();
    stats.busy_seconds += dt;
    stats.split_steps = ctx->micro_batch_stats().steps_split;
  }
  if (st.is_ok()) step_times.record(static_cast<int64_t>(batch.size()), dt);

  if (!st.is_ok()) {
    // decode_batch rolled every sequence back, so each slot's `cells` still mirrors its KV.
    const Status err = st.with_context("forward pass failed");
    spdlog::warn("scheduler: {}; failing {} request(s)", err.to_string(), parts.size());
    for (const StepPart& p : parts) finish_job(std::move(slots[p.slot].job), FinishReason::kError, err);
    return;
  }

  // Record the new cells and sample. Logits rows come in batch order: one per prompt chunk that
  // ends its prompt, 1 + drafts per decode part.
  uint64_t n_sampled = 0, n_drafted = 0, n_kept = 0;
  SequenceState& state = ctx->state();
  std::vector<std::pair<int, Status>> rewind_failed;
  int64_t row = 0;
  // Samples one row for the job and handles the token; false when the job finished.
  auto emit = [&](SchedJob& j, const float* lg) {
    const float* row_logits = lg;
    if (j.req.constraint) {
      // Refused tokens get -inf, so every sampler setting picks among the allowed ones.
      allowed.assign(static_cast<size_t>(n_vocab), 0);
      if (Status cs = j.req.constraint->allowed(allowed); !cs.is_ok()) {
        j.finish = FinishReason::kError;
        j.error = cs.with_context("response_format");
        return false;
      }
      masked.assign(lg, lg + n_vocab);
      for (int64_t v = 0; v < n_vocab; ++v) {
        if (allowed[static_cast<size_t>(v)] == 0) masked[static_cast<size_t>(v)] = -INFINITY;
      }
      row_logits = masked.data();
    }
    int32_t t = j.sampler.sample(row_logits, n_vocab, j.history);
    if (static_cast<size_t>(j.n_generated) < j.req.scripted_tokens.size()) t = j.req.scripted_tokens[j.n_generated];
    if (j.req.constraint) {
      if (Status cs = j.req.constraint->accept(t); !cs.is_ok()) {
        j.finish = FinishReason::kError;
        j.error = cs.with_context("response_format");
        return false;
      }
    }
    if (j.req.top_logprobs >= 0) j.out_logprobs.push_back(token_logprob(lg, n_vocab, t, j.req.top_logprobs));
    ++n_sampled;
    j.history.push_back(t);
    ++j.n_generated;
    ++j.usage.completion_tokens;
    j.next_token = t;
    if (tok != nullptr && !j.req.ignore_eos && tok->is_eog(t)) {
      j.finish = FinishReason::kStop;
      if (j.req.top_logprobs >= 0) j.out_logprobs.pop_back();  // like the token, left out of the output
      flush_text(j);
      return false;
    }
    j.out_tokens.push_back(t);
    if (j.decoder) add_text(j, j.decoder->push(t));
    if (j.finish != FinishReason::kNone) return false;  // a stop string completed
    if (j.n_generated >= j.req.max_tokens) {
      flush_text(j);
      // A stop string can complete only in the flushed bytes; it still counts as a stop.
      j.finish = j.stop && j.stop->stopped() ? FinishReason::kStop : FinishReason::kLength;
      return false;
    }
    return true;
  };
  // A draft source that drafts from hidden states (the NextN head) gets each part's kept
  // positions: rows from the batch offset, each with the token that followed it. Copied first:
  // a rewind that recomputes kept tokens runs a forward pass, which would overwrite the rows of
  // the parts after it.
  const bool report = draft && draft->needs_hidden();
  std::vector<float> hidden;
  if (report) hidden.assign(ctx->hidden().begin(), ctx->hidden().end());
  const int64_t D = model.hparams().n_embd;
  std::vector<int32_t> next;
  auto report_hidden = [&](int slot, int64_t first, int64_t b0, int64_t n) {
    if (!report || n <= 0 || static_cast<int64_t>(hidden.size()) < (b0 + n) * D) return;
    draft->on_hidden(slot, first, n, hidden.data() + b0 * D, next.data());
  };
  int64_t b0 = 0;  // the part's first row in the batch
  for (const StepPart& p : parts) {
    SchedSlot& s = slots[p.slot];
    SchedJob& j = *s.job;
    const int64_t c0 = static_cast<int64_t>(s.cells.size());
    if (!p.decode) {
      const auto first = j.req.prompt.begin() + j.n_prompt_fed;
      s.cells.insert(s.cells.end(), first, first + p.n);
      j.n_prompt_fed += p.n;
      if (p.logits) {
        emit(j, logits.data() + row * n_vocab);
        ++row;
      }
      if (report) {
        // Each prompt position is followed by the next prompt token, the last one by the first
        // generated token (or, mid-prompt, by the next chunk's first token).
        next.assign(first + 1, first + p.n);
        next.push_back(p.logits ? j.history.back() : j.req.prompt[static_cast<size_t>(j.n_prompt_fed)]);
        report_hidden(p.slot, c0, b0, p.n);
      }
      b0 += p.n;
      continue;
    }
    // next_token, then the drafts: a draft is kept while it equals what its position samples;
    // the first token that differs is emitted as the next token and the later drafts' cells go.
    s.cells.push_back(j.next_token);
    const int64_t k = p.n - 1;
    for (int64_t q = 0; q <= k; ++q) {
      const bool go_on = emit(j, logits.data() + (row + q) * n_vocab);
      if (q == k) break;
      const bool kept = j.next_token == j.drafts[static_cast<size_t>(q)];
      j.acceptance.record(static_cast<int>(q) + 1, kept);
      ++n_drafted;
      ++j.usage.draft_tokens;
      if (!kept || !go_on) break;
      ++n_kept;
      ++j.usage.accepted_draft_tokens;
      s.cells.push_back(j.drafts[static_cast<size_t>(q)]);  // its K/V from this pass stays
    }
    // The kept positions, each followed by the token its logits emitted; before the rewind,
    // which may run a forward pass of its own.
    if (report) {
      const int64_t m = static_cast<int64_t>(s.cells.size()) - c0;
      next.assign(j.history.end() - m, j.history.end());
      report_hidden(p.slot, c0, b0, m);
    }
    b0 += p.n;
    // Drafts not checked (the job finished first) count as verified-and-dropped too. A state
    // that cannot be cut there (recurrent layers past their checkpoints) recomputes the kept
    // tokens; if that fails the request fails, and `cells` follows what the state kept.
    if (Status rw = ctx->rewind(p.slot, static_cast<int64_t>(s.cells.size()), s.cells); !rw.is_ok()) {
      s.cells.resize(static_cast<size_t>(std::min<int64_t>(state.seq_len(p.slot), s.cells.size())));
      rewind_failed.emplace_back(p.slot, rw.with_context("dropping rejected drafts failed"));
    }
    row += p.n;
  }
  for (auto& [slot, err] : rewind_failed) {
    spdlog::warn("scheduler: {}", err.to_string());
    if (slots[slot].job) finish_job(std::move(slots[slot].job), FinishReason::kError, err);
  }
  {
    std::lock_guard<std::mutex> lk(mu);
    stats.draft_tokens += n_drafted;
    stats.accepted_draft_tokens += n_kept;
    stats.generated_tokens += n_sampled;
  }

  // Events, after all bookkeeping: a sink may call back into the scheduler.
  for (const StepPart& p : parts) {
    if (!p.logits) continue;
    SchedSlot& s = slots[p.slot];
    if (!s.job) continue;
    if (s.job->finish != FinishReason::kNone) {
      const FinishReason why = s.job->finish;
      Status err = s.job->error;
      finish_job(std::move(s.job), why, std::move(err));
    } else if (!send_progress(*s.job)) {
      finish_job(std::move(s.job), FinishReason::kCancelled);
    }
  }
}

}  // namespace moesh
