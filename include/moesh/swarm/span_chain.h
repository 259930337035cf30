// Chained spans, the span peer's side (docs/span.md "Chained spans").
//
// A star step over n adjacent spans costs a round trip from the backbone to every span's peer.
// Chained, the backbone sends the step to the first span's peer only, naming the hops after it;
// each peer passes the rows leaving its span straight on to the next one (make_hop_step, sent by
// a SpanForwarder) and the backbone collects every span's result with SPAN_AWAIT, so a step
// costs ½RTT(backbone, first) + Σ ½RTT(peer, next) + ½RTT(last, backbone). Every peer still
// returns its rows to the backbone, which logs every span's inputs as before: replay, failover
// and the hash chains are unchanged, and a chain that breaks anywhere is finished star-style.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <tuple>

#include "moesh/net/transport.h"
#include "moesh/util/status.h"
#include "moesh/wire/wire.h"

namespace moesh::swarm {

// Sends a forwarded step to the next span's peer. `moesh span` hands the worker one from
// `remote` (SpanLinks: dials with this peer's swarm key, keeps the links); swarm may not link
// remote, hence the interface.
class SpanForwarder {
 public:
  virtual ~SpanForwarder() = default;
  // Sends `m` (its request id is set here) to the span peer at `address` (HOST:PORT) and returns
  // once it is on the wire: the peer answers the backbone that awaits the result, not this one.
  // Errors name the address.
  virtual Status forward(const std::string& address, wire::SpanStepMsg m) = 0;
};

// The step that the peer which ran `head` (a chained step) passes on to head.next[0]: the rows it
// returned (`result`, in head.return_dtype) decoded and re-encoded in head.hop_dtype — exactly
// what the backbone would have sent that peer star-style — with the hop's starts and chains, the
// rest of the hops, and `origin` (the backbone whose sequences these are). Request id 0: the
// forwarder sets it. kInvalidArgument when head has no next hop or result has no rows.
Result<wire::SpanStepMsg> make_hop_step(const wire::SpanStepMsg& head, const std::string& origin,
                                        const wire::SpanResultMsg& result);

// Results of forwarded steps and the backbone's SPAN_AWAITs for them, matched by (origin,
// chain id, first block): whichever comes first waits for the other. Awaits and results are
// bounded in time (the await's timeout; kResultKeep for an unclaimed result) and results in
// number (kMaxResults, the oldest dropped).
class SpanAwaits {
 public:
  static constexpr size_t kMaxResults = 256;
  static constexpr std::chrono::seconds kResultKeep{60};

  // An await from backbone `origin` on `conn`: answered at once when its result is here, else
  // when it arrives (deliver), or with ERROR TIMEOUT by sweep() after m.timeout_ms.
  void await(net::Connection* conn, const std::string& origin, const wire::SpanAwaitMsg& m);
  // The outcome of a forwarded step (the SPAN_RESULT, or why it failed): sent to its await, or
  // kept until one comes. Returns true when an await was waiting.
  bool deliver(const std::string& origin, uint64_t chain_id, uint32_t first, Result<wire::SpanResultMsg> r);
  // Answers conn's expired awaits with ERROR TIMEOUT and drops expired results.
  void sweep(net::Connection* conn);
  // conn is closing: its awaits are forgotten (nothing is sent on it after this returns).
  void drop(net::Connection* conn);
  size_t n_waiting() const;
  size_t n_results() const;

 private:
  using Key = std::tuple<std::string, uint64_t, uint32_t>;
  struct Waiting {
    net::Connection* conn = nullptr;
    uint64_t request_id = 0;
    net::Clock::time_point until;
  };
  struct Ready {
    Result<wire::SpanResultMsg> r = Status(StatusCode::kInternal, "empty");
    net::Clock::time_point until;
  };
  // Sends r (or its error) to w; mu_ held, so drop() cannot close the connection meanwhile.
  static void answer(const Waiting& w, const Result<wire::SpanResultMsg>& r);

  mutable std::mutex mu_;
  std::map<Key, Waiting> waiting_;
  std::map<Key, Ready> ready_;
};

}  // namespace moesh::swarm
