// The span peer's links to the next spans' peers (chained spans, swarm/span_chain.h): `moesh span`
// hands one to its worker, which forwards the rows of chained steps through it.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "moesh/model/model.h"
#include "moesh/remote/link.h"
#include "moesh/swarm/span_chain.h"

namespace moesh {

struct SpanForwardOptions {
  LinkOptions link;  // the swarm key, congestion control and deadlines of this peer
  std::string name;  // HELLO name of this peer on the links it dials
  std::chrono::milliseconds send_timeout{10000};
  std::chrono::milliseconds redial_after{5000};  // after a failed dial, forwards there fail at once this long
};

class SpanForwardLinks final : public swarm::SpanForwarder {
 public:
  // `model`: this peer's file (a span slice or the full model); its identity is what the next
  // peer checks in the handshake.
  static Result<std::shared_ptr<SpanForwardLinks>> create(const Model& model, const SpanForwardOptions& opts);
  ~SpanForwardLinks() override;

  // Dials `address` the first time (and again, once, when its link has failed) and sends `m` on
  // it without waiting for an answer. The next peer must offer kFeatureSpanChain.
  Status forward(const std::string& address, wire::SpanStepMsg m) override;
  size_t n_links() const;

 private:
  SpanForwardLinks(wire::Hello hello, SpanForwardOptions opts) : hello_(std::move(hello)), opts_(std::move(opts)) {}
  Result<WorkerLink*> link_to(const std::string& address, bool fresh);

  wire::Hello hello_;
  SpanForwardOptions opts_;
  mutable std::mutex mu_;  // one forward at a time: a link is written by one thread
  std::map<std::string, std::unique_ptr<WorkerLink>> links_;
  // Addresses that could not be dialled, and until when a forward to them fails at once (so a
  // dead or unreachable next hop costs one connect deadline, not one per step).
  std::map<std::string, std::pair<std::chrono::steady_clock::time_point, Status>> unreachable_;
};

}  // namespace moesh
