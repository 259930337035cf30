// FanOut: one reader thread per worker link files replies as they arrive; gather() takes them
// in arrival order. See include/moesh/remote/fanout.h.
#include "moesh/remote/fanout.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>

namespace moesh {

namespace {
// How often an idle reader looks at the stop flag (a close() wakes it at once anyway).
constexpr std::chrono::milliseconds kReaderSlice{500};
}  // namespace

FanOut::FanOut(std::vector<std::unique_ptr<WorkerLink>> links) : links_(std::move(links)) {
  // One link: gather() reads it itself (no reader thread, so a reply wakes the waiting thread
  // directly instead of a reader that then wakes it). Several: a reader each, for arrival order.
  // A joined worker's link is read all the time, also between calls: the worker's heartbeat
  // PINGs are answered by the reader (RequestMux::pump).
  const bool joined = links_.size() == 1 && links_[0]->address.path != WorkerPath::kDirect;
  inline_ = links_.size() == 1 && !joined && std::getenv("MOESH_FANOUT_READERS") == nullptr;
  if (inline_) return;
  readers_.resize(links_.size());
  for (size_t w = 0; w < links_.size(); ++w) start_reader(w);
}

void FanOut::start_reader(size_t w) {
  // The mux pointer, not the index: links_ may grow (add) while a reader starts.
  readers_[w] = std::thread([this, mux = links_[w]->mux.get()] { read_loop(mux); });
}

void FanOut::add(std::unique_ptr<WorkerLink> link) {
  if (inline_) {  // one link read by gather() until now: from here on every link has a reader
    inline_ = false;
    readers_.resize(1);
    start_reader(0);
  }
  links_.push_back(std::move(link));
  readers_.resize(links_.size());
  start_reader(links_.size() - 1);
}

bool FanOut::next_completion(net::CompletionQueue::Entry* e, net::Deadline deadline) {
  if (!inline_) return done_.pop(e, deadline);
  for (;;) {
    if (done_.pop(e, net::Clock::now())) return true;
    if (net::Clock::now() >= deadline) return false;
    // Reads and files one frame; a failed connection fails its pending requests (they complete).
    if (!links_[0]->mux->pump(deadline).is_ok()) return done_.pop(e, deadline);
  }
}

FanOut::~FanOut() {
  stopping_.store(true);
  // GOODBYE and close: a reader blocked in recv_frame returns at once. The links (and the
  // connections the readers use) are destroyed only after the readers are joined.
  for (auto& l : links_) l->shut_down();
  for (auto& t : readers_) t.join();
}

void FanOut::read_loop(net::RequestMux* mux) {
  while (!stopping_.load(std::memory_order_relaxed)) {
    if (!mux->pump(net::deadline_in(kReaderSlice)).is_ok()) return;  // failed: every wait learns it
  }
}

Status FanOut::start(size_t w, uint64_t request_id, std::span<const uint8_t> frame, net::Deadline deadline) {
  Status st = links_[w]->mux->start(request_id, frame, deadline, &done_, w);
  if (st.is_ok()) live_.push_back(Outstanding{w, request_id});
  return st;
}

void FanOut::replace(size_t w, std::unique_ptr<WorkerLink> link) {
  links_[w]->shut_down();  // a reader blocked on the old connection returns at once
  if (!inline_) readers_[w].join();
  // Completions the old link filed for requests nobody waits for any more go with it.
  live_.erase(std::remove_if(live_.begin(), live_.end(), [w](const Outstanding& o) { return o.worker == w; }),
              live_.end());
  early_.erase(std::remove_if(early_.begin(), early_.end(), [w](const auto& e) { return e.tag == w; }), early_.end());
  link->mux->skip_request_ids_to(links_[w]->mux->next_request_id());
  links_[w] = std::move(link);
  if (!inline_) start_reader(w);
}

bool FanOut::forget(size_t w, uint64_t request_id) {
  for (size_t i = 0; i < live_.size(); ++i) {
    if (live_[i].worker == w && live_[i].request_id == request_id) {
      live_[i] = live_.back();
      live_.pop_back();
      return true;
    }
  }
  return false;
}

void FanOut::cancel(size_t w, uint64_t request_id) {
  forget(w, request_id);
  links_[w]->mux->cancel(request_id);
}

void FanOut::gather(std::span<const Outstanding> reqs, net::Deadline deadline,
                    const std::function<void(Reply&&)>& on_reply) {
  answered_.assign(reqs.size(), 0);
  size_t left = reqs.size();
  auto index_of = [&](const net::CompletionQueue::Entry& e) {
    size_t i = 0;
    while (i < reqs.size() && (answered_[i] || reqs[i].worker != e.tag || reqs[i].request_id != e.request_id)) ++i;
    return i;
  };
  // Completions another gather took out of the queue first (they arrived earliest).
  std::vector<net::CompletionQueue::Entry> mine;
  for (size_t j = 0; j < early_.size();) {
    if (index_of(early_[j]) < reqs.size()) {
      mine.push_back(early_[j]);
      early_[j] = early_.back();
      early_.pop_back();
    } else {
      ++j;
    }
  }
  std::sort(mine.begin(), mine.end(), [](const auto& a, const auto& b) { return a.at < b.at; });
  size_t next_mine = 0;
  net::CompletionQueue::Entry e;
  while (left > 0 && (next_mine < mine.size() || next_completion(&e, deadline))) {
    if (next_mine < mine.size()) e = mine[next_mine++];
    const size_t i = index_of(e);
    if (i == reqs.size()) {
      // Another call's request still in flight: keep it for that call's gather. Otherwise a
      // cancelled request of an earlier call: dropped.
      bool live = false;
      for (const Outstanding& o : live_) live = live || (o.worker == e.tag && o.request_id == e.request_id);
      if (live) early_.push_back(e);
      continue;
    }
    answered_[i] = 1;
    forget(reqs[i].worker, reqs[i].request_id);
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
    cancel(reqs[i].worker, reqs[i].request_id);
    Reply r;
    r.index = i;
    r.frame = make_error(StatusCode::kTimeout, "request {} on {}: no reply before its deadline", reqs[i].request_id,
                         links_[reqs[i].worker]->conn->describe());
    r.arrived = net::Clock::now();
    on_reply(std::move(r));
  }
}

}  // namespace moesh
