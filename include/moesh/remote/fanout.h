// The fan-out: requests to many workers in flight at once, replies taken in arrival order.
//
// With several links each has a reader thread that files replies as they arrive
// (RequestMux::pump) and reports them to one CompletionQueue, so gather() hands over each reply
// the moment it is in, with its true arrival time (with one link, gather() pumps it itself: one
// wake-up fewer per trip; MOESH_FANOUT_READERS=1 forces the reader): a slow worker does not delay the handling of a
// fast one, and each worker's latency is its own (gathering in worker order made a later worker's figure include the
// wait for earlier ones). A link whose connection fails fails its pending and later requests at once.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <thread>
#include <vector>

#include "moesh/net/transport.h"
#include "moesh/remote/link.h"

namespace moesh {

class FanOut {
 public:
  explicit FanOut(std::vector<std::unique_ptr<WorkerLink>> links);
  ~FanOut();  // GOODBYE to every worker, then the readers are joined
  FanOut(const FanOut&) = delete;
  FanOut& operator=(const FanOut&) = delete;

  size_t size() const { return links_.size(); }
  // Busy-poll for a reply this long before sleeping (net::TcpOptions::poll_us).
  void set_poll_us(int us) { done_.set_poll_us(us); }
  const WorkerLink& link(size_t w) const { return *links_.at(w); }

  uint64_t next_request_id(size_t w) { return links_[w]->mux->next_request_id(); }
  // Sends a request frame (its header carries request_id) to worker w.
  Status start(size_t w, uint64_t request_id, std::span<const uint8_t> frame, net::Deadline deadline);
  void cancel(size_t w, uint64_t request_id);
  // Puts a new link (a worker that came back) in place of worker w's, whose requests must all
  // be gathered or cancelled: the old link is shut down and its reader joined first.
  void replace(size_t w, std::unique_ptr<WorkerLink> link);
  // Adds a worker (index size() before the call), between calls (nothing may be in flight).
  void add(std::unique_ptr<WorkerLink> link);

  struct Outstanding {
    size_t worker = 0;
    uint64_t request_id = 0;
  };
  struct Reply {
    size_t index = 0;  // into the gathered list
    Result<wire::Frame> frame = Status(StatusCode::kInternal, "no reply");
    // When it arrived (TCP: the kernel's receive timestamp, so a reply read late by an inline
    // gather is not timed by the read), else when it was filed; the deadline for a timeout.
    net::Clock::time_point arrived;
  };
  // Hands every request of `reqs` to on_reply exactly once: replies in the order they arrived,
  // then a kTimeout for each one still unanswered at the deadline (those are cancelled, so a late
  // reply is discarded). Requests of several calls may be in flight together (two micro-batches):
  // a completion of a started request that is not in `reqs` is kept for the gather that asks for it.
  void gather(std::span<const Outstanding> reqs, net::Deadline deadline, const std::function<void(Reply&&)>& on_reply);

 private:
  void read_loop(net::RequestMux* mux);
  void start_reader(size_t w);
  bool next_completion(net::CompletionQueue::Entry* e, net::Deadline deadline);

  std::vector<std::unique_ptr<WorkerLink>> links_;
  net::CompletionQueue done_;
  std::atomic<bool> stopping_{false};
  bool inline_ = false;  // one link, read by gather() itself
  std::vector<std::thread> readers_;
  std::vector<uint8_t> answered_;  // gather's scratch
  // Started, neither gathered nor cancelled: (worker, request id). Only the executor's thread
  // touches these, so they need no lock.
  std::vector<Outstanding> live_;
  std::vector<net::CompletionQueue::Entry> early_;  // completions of live requests not yet gathered
  bool forget(size_t w, uint64_t request_id);       // removes from live_; false if it was not there
};

}  // namespace moesh
