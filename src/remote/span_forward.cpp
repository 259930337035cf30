// Links from a span peer to the next spans' peers (span_forward.h).
#include "moesh/remote/span_forward.h"

#include "moesh/remote/span_client.h"

namespace moesh {

Result<std::shared_ptr<SpanForwardLinks>> SpanForwardLinks::create(const Model& model, const SpanForwardOptions& opts) {
  MOESH_ASSIGN_OR_RETURN(wire::Hello hello, span_hello(model, opts.name));
  return std::shared_ptr<SpanForwardLinks>(new SpanForwardLinks(std::move(hello), opts));
}

SpanForwardLinks::~SpanForwardLinks() {
  std::lock_guard<std::mutex> lk(mu_);
  for (auto& [addr, link] : links_) link->shut_down();
}

size_t SpanForwardLinks::n_links() const {
  std::lock_guard<std::mutex> lk(mu_);
  return links_.size();
}

Result<WorkerLink*> SpanForwardLinks::link_to(const std::string& address, bool fresh) {
  auto it = links_.find(address);
  if (it != links_.end() && !fresh) {
    // Nothing is expected back on a forwarding link but ERRORs (discarded) and a GOODBYE or EOF
    // when the peer went away: read what is there, so a dead link is noticed before sending.
    net::RequestMux& mux = *it->second->mux;
    Status st = Status::ok();
    for (int i = 0; i < 8 && st.is_ok(); ++i) {
      const auto before = mux.last_received();
      st = mux.pump(net::deadline_in(std::chrono::milliseconds(0)));
      if (mux.last_received() == before) break;  // nothing more there
    }
    if (st.is_ok()) return it->second.get();
  }
  if (it != links_.end()) {
    it->second->shut_down();
    links_.erase(it);
  }
  const auto now = std::chrono::steady_clock::now();
  if (auto u = unreachable_.find(address); u != unreachable_.end()) {
    if (now < u->second.first) return u->second.second;
    unreachable_.erase(u);
  }
  MOESH_ASSIGN_OR_RETURN(WorkerAddress a, parse_worker_address(address));
  if (a.path != WorkerPath::kDirect || a.websocket || !a.alternatives.empty())
    return make_error(StatusCode::kInvalidArgument, "next hop '{}' is not a plain HOST:PORT", address);
  auto link = connect_worker(a, hello_, opts_.link);
  Status st = link ? Status::ok() : link.status();
  if (st.is_ok() && ((*link)->session.features & wire::kFeatureSpanChain) == 0)
    st = make_error(StatusCode::kUnsupported, "{} does not chain spans", (*link)->label);
  if (!st.is_ok()) {
    unreachable_[address] = {now + opts_.redial_after, st};
    return st;
  }
  WorkerLink* raw = link->get();
  links_[address] = std::move(*link);
  return raw;
}

Status SpanForwardLinks::forward(const std::string& address, wire::SpanStepMsg m) {
  std::lock_guard<std::mutex> lk(mu_);
  Status last = Status::ok();
  for (int attempt = 0; attempt < 2; ++attempt) {
    auto link = link_to(address, attempt > 0);
    if (!link) return link.status().with_context(address);
    m.request_id = (*link)->mux->next_request_id();
    auto frame = wire::encode_span_step(m);
    if (!frame) return frame.status();
    if (frame->size() - wire::kHeaderBytes > (*link)->session.max_send_bytes)
      return make_error(StatusCode::kOutOfRange, "{}: a forwarded SPAN_STEP of {} bytes exceeds its frame limit",
                        (*link)->label, frame->size());
    last = (*link)->conn->send_frame(*frame, net::deadline_in(opts_.send_timeout));
    if (last.is_ok()) return Status::ok();
  }
  return last.with_context(address);
}

}  // namespace moesh
