// Scheduler: the public API (create, submit, cancel, shutdown, stats), the scheduler thread's
// loop and how requests end. Admission and the batched step are in scheduler_step.cpp.
//
// The loop, once per step:
//   take the pending cancel() ids and handle them (queued or running: done event, slot freed)
//   while a slot is free and requests wait: admit the oldest (prefix cache picks the slot)
//   run one step (one decode_batch for every active slot), send its events
// and sleeps on the condition variable while there is nothing to do.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <exception>

#include "serve/scheduler_internal.h"

namespace moesh {

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::kNone:
      return "none";
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kCancelled:
      return "cancelled";
    case FinishReason::kError:
      return "error";
  }
  return "unknown";
}

size_t common_prefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  const size_t n = std::min(a.size(), b.size());
  size_t i = 0;
  while (i < n && a[i] == b[i]) ++i;
  return i;
}

Scheduler::Impl::Impl(const Model& m, const Tokenizer* t, const SchedulerOptions& o, int64_t n_ctx_)
    : model(m), tok(t), opts(o), n_ctx(n_ctx_) {}

Result<std::unique_ptr<Scheduler>> Scheduler::create(const Model& model, const Tokenizer* tokenizer,
                                                     const SchedulerOptions& opts) {
  if (opts.n_slots < 1) {
    return make_error(StatusCode::kInvalidArgument, "scheduler: n_slots must be >= 1 (got {})", opts.n_slots);
  }
  if (opts.max_batch_tokens < opts.n_slots) {
    return make_error(StatusCode::kInvalidArgument,
                      "scheduler: max_batch_tokens {} is smaller than n_slots {} (every active "
                      "stream needs a token in each step)",
                      opts.max_batch_tokens, opts.n_slots);
  }
  if (opts.max_queue < 0) {
    return make_error(StatusCode::kInvalidArgument, "scheduler: max_queue must be >= 0 (got {})", opts.max_queue);
  }
  const int64_t n_ctx = opts.n_ctx > 0 ? opts.n_ctx : model.hparams().n_ctx_train;
  if (n_ctx < 2) {
    return make_error(StatusCode::kInvalidArgument, "scheduler: context of {} cells per slot is too small", n_ctx);
  }
  if (tokenizer != nullptr && tokenizer->n_vocab() > model.hparams().n_vocab) {
    return make_error(StatusCode::kInvalidArgument, "scheduler: tokenizer has {} tokens but the model only {}",
                      tokenizer->n_vocab(), model.hparams().n_vocab);
  }

  if (opts.draft_max < 0) {
    return make_error(StatusCode::kInvalidArgument, "scheduler: draft_max must be >= 0 (got {})", opts.draft_max);
  }
  auto impl = std::make_unique<Impl>(model, tokenizer, opts, n_ctx);
  impl->ctx = std::make_unique<Context>(
      model, ContextParams{opts.n_threads, n_ctx, opts.executor, opts.micro_batching, opts.checkpoints, opts.spans});
  std::shared_ptr<DraftSource> draft = opts.draft_source;
  if (!draft && !opts.draft.empty()) {
    // A model-based source (the NextN head) runs on the context's pool, between steps.
    auto d = make_draft_source(opts.draft, DraftEnv{&model, &impl->ctx->pool(), n_ctx});
    if (!d) return d.status().with_context("scheduler");
    draft = std::move(*d);
  }
  if (draft && draft->needs_hidden()) impl->ctx->set_keep_hidden(true);
  impl->draft = std::move(draft);
  impl->slots.resize(static_cast<size_t>(opts.n_slots));
  impl->stats.n_slots = opts.n_slots;
  Impl* raw = impl.get();
  impl->thread = std::thread([raw] { raw->run(); });
  return std::unique_ptr<Scheduler>(new Scheduler(std::move(impl)));
}

Scheduler::Scheduler(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Scheduler::~Scheduler() {
  shutdown();
}

const SchedulerOptions& Scheduler::options() const {
  return impl_->opts;
}
int64_t Scheduler::n_ctx() const {
  return impl_->n_ctx;
}

namespace {

// Why a request cannot run; ok when it can.
Status check_request(const GenerationRequest& r, const Model& model, const Tokenizer* tok, int64_t n_ctx) {
  if (r.prompt.empty()) return make_error(StatusCode::kInvalidArgument, "prompt is empty");
  if (r.max_tokens < 1) {
    return make_error(StatusCode::kInvalidArgument, "max_tokens must be >= 1 (got {})", r.max_tokens);
  }
  MOESH_RETURN_IF_ERROR(r.sampling.validate());
  if (r.top_logprobs < -1 || r.top_logprobs > kMaxTopLogprobs) {
    return make_error(StatusCode::kInvalidArgument, "top_logprobs must be within [0, {}] (got {})", kMaxTopLogprobs,
                      r.top_logprobs);
  }
  if (!r.stop.empty() && tok == nullptr) {
    return make_error(StatusCode::kInvalidArgument, "stop strings need a tokenizer (this model has none)");
  }
  for (size_t i = 0; i < r.stop.size(); ++i) {
    if (r.stop[i].empty()) {
      return make_error(StatusCode::kInvalidArgument, "stop string {} is empty", i);
    }
  }
  const int64_t n_vocab = model.hparams().n_vocab;
  for (size_t i = 0; i < r.prompt.size(); ++i) {
    if (r.prompt[i] < 0 || r.prompt[i] >= n_vocab) {
      return make_error(StatusCode::kOutOfRange, "prompt token {} at index {} is outside the vocabulary [0, {})",
                        r.prompt[i], i, n_vocab);
    }
  }
  const int64_t need = static_cast<int64_t>(r.prompt.size()) + r.max_tokens;
  if (need > n_ctx) {
    return make_error(StatusCode::kOutOfRange,
                      "prompt of {} tokens + max_tokens {} = {} exceeds the context of {} tokens", r.prompt.size(),
                      r.max_tokens, need, n_ctx);
  }
  return Status::ok();
}

// A sink that throws is treated like a client that went away.
bool call_sink(const EventSink& sink, const GenerationEvent& ev) {
  if (!sink) return true;
  try {
    return sink(ev);
  } catch (const std::exception& e) {
    spdlog::warn("scheduler: sink of request {} threw: {}", ev.request_id, e.what());
  } catch (...) {
    spdlog::warn("scheduler: sink of request {} threw", ev.request_id);
  }
  return false;
}

}  // namespace

Result<uint64_t> Scheduler::submit(GenerationRequest req, EventSink sink) {
  Impl& s = *impl_;
  Status st = check_request(req, s.model, s.tok, s.n_ctx);
  std::unique_ptr<SchedJob> job;
  if (st.is_ok()) {
    // Built before taking the lock: the decoder and stop matcher are per-request state.
    job = std::make_unique<SchedJob>(0, std::move(req), std::move(sink));
    if (s.tok != nullptr) job->decoder.emplace(*s.tok, job->req.render_special);
    if (!job->req.stop.empty()) job->stop.emplace(job->req.stop);
    job->history = job->req.prompt;
    job->usage.prompt_tokens = static_cast<int64_t>(job->req.prompt.size());
  }
  std::unique_lock<std::mutex> lk(s.mu);
  if (st.is_ok() && s.stopping) {
    st = make_error(StatusCode::kUnavailable, "the scheduler is shutting down");
  }
  if (st.is_ok() && s.queue.size() >= static_cast<size_t>(s.opts.max_queue)) {
    st = make_error(StatusCode::kUnavailable, "server busy: {} requests already waiting", s.queue.size());
  }
  if (!st.is_ok()) {
    ++s.stats.requests_rejected;
    return st;
  }
  const uint64_t id = s.next_id++;
  job->id = id;
  ++s.stats.requests_submitted;
  s.queue.push_back(std::move(job));
  lk.unlock();
  s.cv.notify_all();
  return id;
}

void Scheduler::cancel(uint64_t request_id) {
  {
    std::lock_guard<std::mutex> lk(impl_->mu);
    if (impl_->stopping) return;  // shutdown cancels everything anyway
    impl_->cancel_ids.push_back(request_id);
  }
  impl_->cv.notify_all();
}

void Scheduler::shutdown() {
  {
    std::lock_guard<std::mutex> lk(impl_->mu);
    impl_->stopping = true;
  }
  impl_->cv.notify_all();
  if (std::this_thread::get_id() == impl_->thread.get_id()) return;  // from a sink
  std::lock_guard<std::mutex> lk(impl_->join_mu);
  if (impl_->thread.joinable()) impl_->thread.join();
}

SchedulerStats Scheduler::stats() const {
  std::lock_guard<std::mutex> lk(impl_->mu);
  SchedulerStats out = impl_->stats;
  out.queued = static_cast<int>(impl_->queue.size());
  return out;
}

// ---- scheduler thread ----

void Scheduler::Impl::run() {
  for (;;) {
    std::vector<uint64_t> cancels;
    {
      std::unique_lock<std::mutex> lk(mu);
      const auto work = [&] { return stopping || !cancel_ids.empty() || !queue.empty() || n_active() > 0; };
      // Idle: about once a second the executor may look after its workers (re-dials, joins).
      while (!cv.wait_for(lk, std::chrono::seconds(1), work)) {
        if (!opts.executor) continue;
        lk.unlock();
        opts.executor->maintain();
        lk.lock();
      }
      if (stopping) break;
      cancels.swap(cancel_ids);
    }
    if (!cancels.empty()) handle_cancels(std::move(cancels));

    while (has_free_slot()) {
      std::unique_ptr<SchedJob> job;
      {
        std::lock_guard<std::mutex> lk(mu);
        if (queue.empty() || stopping) break;
        job = std::move(queue.front());
        queue.pop_front();
      }
      admit(std::move(job));
    }
    if (n_active() > 0) step();
  }
  cancel_everything();
}

void Scheduler::Impl::handle_cancels(std::vector<uint64_t> ids) {
  for (uint64_t id : ids) {
    std::unique_ptr<SchedJob> queued;
    {
      std::lock_guard<std::mutex> lk(mu);
      auto it =
          std::find_if(queue.begin(), queue.end(), [&](const std::unique_ptr<SchedJob>& j) { return j->id == id; });
      if (it != queue.end()) {
        queued = std::move(*it);
        queue.erase(it);
      }
    }
    if (queued) {
      finish_job(std::move(queued), FinishReason::kCancelled);
      continue;
    }
    for (SchedSlot& slot : slots) {
      if (slot.job && slot.job->id == id) {
        finish_job(std::move(slot.job), FinishReason::kCancelled);
        break;
      }
    }
  }
}

void Scheduler::Impl::cancel_everything() {
  std::deque<std::unique_ptr<SchedJob>> waiting;
  {
    std::lock_guard<std::mutex> lk(mu);
    waiting.swap(queue);
    cancel_ids.clear();
  }
  for (SchedSlot& slot : slots) {
    if (slot.job) finish_job(std::move(slot.job), FinishReason::kCancelled);
  }
  for (auto& job : waiting) finish_job(std::move(job), FinishReason::kCancelled);
}

void Scheduler::Impl::finish_job(std::unique_ptr<SchedJob> job, FinishReason why, Status error) {
  GenerationEvent ev;
  ev.request_id = job->id;
  ev.text = std::move(job->out_text);
  ev.tokens = std::move(job->out_tokens);
  ev.logprobs = std::move(job->out_logprobs);
  ev.done = true;
  ev.finish = why;
  ev.error = std::move(error);
  ev.usage = job->usage;
  {
    std::lock_guard<std::mutex> lk(mu);
    switch (why) {
      case FinishReason::kCancelled:
        ++stats.requests_cancelled;
        break;
      case FinishReason::kError:
        ++stats.requests_failed;
        break;
      default:
        ++stats.requests_finished;
        break;
    }
    if (job->slot >= 0) --stats.active;
  }
  // The slot is free from here on (the caller moved the job out of it); the sink's answer no
  // longer matters.
  (void)call_sink(job->sink, ev);
}

bool Scheduler::Impl::send_progress(SchedJob& job) {
  GenerationEvent ev;
  ev.request_id = job.id;
  ev.text = std::move(job.out_text);
  ev.tokens = std::move(job.out_tokens);
  ev.logprobs = std::move(job.out_logprobs);
  ev.usage = job.usage;
  job.out_text.clear();
  job.out_tokens.clear();
  job.out_logprobs.clear();
  return call_sink(job.sink, ev);
}

}  // namespace moesh
