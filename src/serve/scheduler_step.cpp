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
  KvCache& kv = ctx->kv();

  int best = -1, lru = -1, donor = -1;
  size_t best_len = 0, donor_len = 0;
  for (int i = 0; i < static_cast<int>(slots.size()); ++i) {
    const SchedSlot& s = slots[i];
    const size_t len = std::min(common_prefix(s.cells, prompt), cap);
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
    Status st = kv.seq_copy(donor, lru, static_cast<int64_t>(donor_len));
    if (st.is_ok()) {
      target = lru;
      reuse = donor_len;
      slots[lru].cells.assign(slots[donor].cells.begin(),
                              slots[donor].cells.begin() + static_cast<ptrdiff_t>(donor_len));
    } else {
      // Cannot happen while `cells` mirrors the cache; fall back to the free slot's own prefix.
      spdlog::warn("scheduler: prefix copy from slot {} failed: {}", donor, st.to_string());
    }
  }

  SchedSlot& slot = slots[target];
  kv.seq_truncate(target, static_cast<int64_t>(reuse));
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

}  // namespace

// One slot's share of the step's batch.
struct StepPart {
  int slot;
  int64_t n;    // tokens in the batch
  bool logits;  // its last token asks for logits (a token is sampled)
  bool decode;  // a generated token (else a prompt chunk)
};

void Scheduler::Impl::step() {
  KvCache& kv = ctx->kv();
  batch.clear();
  std::vector<StepPart> parts;

  // 1. Decode tokens.
  for (int i = 0; i < static_cast<int>(slots.size()); ++i) {
    SchedSlot& s = slots[i];
    if (!s.job || s.job->prefilling()) continue;
    if (kv.seq_len(i) >= n_ctx) {
      // submit() keeps prompt + max_tokens within n_ctx, so this is only a safety net.
      finish_job(std::move(s.job), FinishReason::kLength);
      continue;
    }
    batch.push_back({i, s.job->next_token, true});
    parts.push_back({i, 1, true, true});
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
  for (const StepPart& p : parts) n_rows += p.logits ? 1 : 0;
  logits.resize(static_cast<size_t>(n_rows * n_vocab));

  const auto t0 = std::chrono::steady_clock::now();
  Status st = ctx->decode_batch(batch, logits.data());
  const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  {
    std::lock_guard<std::mutex> lk(mu);
    ++stats.steps;
    stats.batch_tokens += batch.size();
    stats.max_batch_seen = std::max<uint64_t>(stats.max_batch_seen, parts.size());
    stats.busy_seconds += dt;
  }

  if (!st.is_ok()) {
    // decode_batch rolled every sequence back, so each slot's `cells` still mirrors its KV.
    const Status err = st.with_context("forward pass failed");
    spdlog::warn("scheduler: {}; failing {} request(s)", err.to_string(), parts.size());
    for (const StepPart& p : parts) finish_job(std::move(slots[p.slot].job), FinishReason::kError, err);
    return;
  }

  // Record the new cells and sample. Logits rows come in batch order, one per part with logits.
  uint64_t n_sampled = 0;
  int64_t row = 0;
  for (const StepPart& p : parts) {
    SchedSlot& s = slots[p.slot];
    SchedJob& j = *s.job;
    if (p.decode) {
      s.cells.push_back(j.next_token);
    } else {
      const auto first = j.req.prompt.begin() + j.n_prompt_fed;
      s.cells.insert(s.cells.end(), first, first + p.n);
      j.n_prompt_fed += p.n;
    }
    if (!p.logits) continue;

    const int32_t t = j.sampler.sample(logits.data() + row * n_vocab, n_vocab, j.history);
    ++row;
    ++n_sampled;
    j.history.push_back(t);
    ++j.n_generated;
    ++j.usage.completion_tokens;
    if (tok != nullptr && !j.req.ignore_eos && tok->is_eog(t)) {
      j.finish = FinishReason::kStop;
      flush_text(j);
      continue;
    }
    j.out_tokens.push_back(t);
    if (j.decoder) add_text(j, j.decoder->push(t));
    if (j.finish != FinishReason::kNone) continue;  // a stop string completed
    if (j.n_generated >= j.req.max_tokens) {
      flush_text(j);
      // A stop string can complete only in the flushed bytes; it still counts as a stop.
      j.finish = j.stop && j.stop->stopped() ? FinishReason::kStop : FinishReason::kLength;
      continue;
    }
    j.next_token = t;
  }
  {
    std::lock_guard<std::mutex> lk(mu);
    stats.generated_tokens += n_sampled;
  }

  // Events, after all bookkeeping: a sink may call back into the scheduler.
  for (const StepPart& p : parts) {
    if (!p.logits) continue;
    SchedSlot& s = slots[p.slot];
    if (!s.job) continue;
    if (s.job->finish != FinishReason::kNone) {
      const FinishReason why = s.job->finish;
      finish_job(std::move(s.job), why);
    } else if (!send_progress(*s.job)) {
      finish_job(std::move(s.job), FinishReason::kCancelled);
    }
  }
}

}  // namespace moesh
