// FanOut: one reader thread per worker link files replies as they arrive; gather() takes them
// in arrival order. See include/moesh/remote/fanout.h.
#include "moesh/remote/fanout.h"

#include <fmt/format.h>

#include <chrono>

namespace moesh {

namespace {
// How often an idle reader looks at the stop flag (a close() wakes it at once anyway).
constexpr std::chrono::milliseconds kReaderSlice{500};
}  // namespace

FanOut::FanOut(std::vector<std::unique_ptr<WorkerLink>> links) : links_(std::move(links)) {
  readers_.reserve(links_.size());
  for (size_t w = 0; w < links_.size(); ++w) readers_.emplace_back([this, w] { read_loop(w); });
}

FanOut::~FanOut() {
  stopping_.store(true);
  // GOODBYE and close: a reader blocked in recv_frame returns at once. The links (and the
  // connections the readers use) are destroyed only after the readers are joined.
  for (auto& l : links_) l->shut_down();
  for (auto& t : readers_) t.join();
}

void FanOut::read_loop(size_t w) {
  net::RequestMux& mux = *links_[w]->mux;
  while (!stopping_.load(std::memory_order_relaxed)) {
    if (!mux.pump(net::deadline_in(kReaderSlice)).is_ok()) return;  // failed: every wait learns it
  }
}

Status FanOut::start(size_t w, uint64_t request_id, std::span<const uint8_t> frame, net::Deadline deadline) {
  return links_[w]->mux->start(request_id, frame, deadline, &done_, w);
}

void FanOut::cancel(size_t w, uint64_t request_id) {
  links_[w]->mux->cancel(request_id);
}

void FanOut::gather(std::span<const Outstanding> reqs, net::Deadline deadline,
                    const std::function<void(Reply&&)>& on_reply) {
  answered_.assign(reqs.size(), 0);
  size_t left = reqs.size();
  net::CompletionQueue::Entry e;
  while (left > 0 && done_.pop(&e, deadline)) {
    size_t i = 0;
    while (i < reqs.size() && (answered_[i] || reqs[i].worker != e.tag || reqs[i].request_id != e.request_id)) ++i;
    if (i == reqs.size()) continue;  // a cancelled request of an earlier call
    answered_[i] = 1;
    --left;
    Reply r;
    r.index = i;
    // Filed already: wait() returns at once with the reply, the worker's ERROR, or the
    // connection's failure.
    r.frame = links_[reqs[i].worker]->mux->wait(reqs[i].request_id, deadline + std::chrono::hours(1));
    r.arrived = e.at;
    on_reply(std::move(r));
  }
  for (size_t i = 0; i < reqs.size(); ++i) {
    if (answered_[i]) continue;
    links_[reqs[i].worker]->mux->cancel(reqs[i].request_id);
    Reply r;
    r.index = i;
    r.frame = make_error(StatusCode::kTimeout, "request {} on {}: no reply before its deadline", reqs[i].request_id,
                         links_[reqs[i].worker]->conn->describe());
    r.arrived = net::Clock::now();
    on_reply(std::move(r));
  }
}

}  // namespace moesh
