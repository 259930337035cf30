// The backbone's connections to workers: dial (socket policy from netstack.md), HELLO handshake,
// warm-up PING, and an orderly GOODBYE when the link is dropped.
#include "moesh/remote.h"
#include "moesh/swarm.h"

namespace moesh {

Result<wire::Hello> backbone_hello(const Model& model, const RemoteOptions& opts) {
  auto id = swarm::model_identity(model.file());
  if (!id) return id.status().with_context("model identity");
  auto shape = swarm::model_shape(model.file());
  if (!shape) return shape.status().with_context("model shape");
  return swarm::make_hello(wire::PeerRole::kBackbone, *id, *shape, swarm::ExpertSet{}, opts.name);
}

WorkerLink::~WorkerLink() {
  if (conn) {
    wire::GoodbyeMsg g;
    g.text = "backbone closing";
    auto f = wire::encode_goodbye(g);
    if (f.is_ok()) (void)conn->send_frame(*f, net::deadline_in(std::chrono::milliseconds(200)));
    conn->close();
  }
}

Result<std::unique_ptr<WorkerLink>> connect_worker(const WorkerAddress& addr, const wire::Hello& local,
                                                   const RemoteOptions& opts) {
  const std::string where = "worker " + addr.to_string();
  const net::Deadline deadline = net::deadline_in(opts.connect_timeout);
  auto stream = net::tcp_connect(addr.host, addr.port, opts.tcp, deadline);
  if (!stream) return stream.status().with_context(where + ": connect");
  auto link = std::make_unique<WorkerLink>();
  link->address = addr;
  link->label = addr.to_string();
  link->conn = net::make_stream_connection(std::move(*stream));
  auto session = net::handshake(*link->conn, local, /*initiator=*/true, deadline);
  if (!session) {
    link->conn->close();
    link->conn.reset();
    return session.status().with_context(where + ": handshake");
  }
  link->session = std::move(*session);
  const wire::Hello& peer = link->session.peer;
  if (!peer.name.empty()) link->label = addr.to_string() + " (" + peer.name + ")";
  if (peer.role != wire::PeerRole::kWorker) {
    return make_error(StatusCode::kInvalidArgument, "{} is not a worker (role {})", link->label,
                      static_cast<int>(peer.role));
  }
  // "q8" hidden falls back to Q8 where the worker does not speak Q8K, so Q8 is what must be common.
  for (const wire::WireDType dt : {opts.hidden_wire, opts.return_wire}) {
    if ((link->session.dtypes & (1u << static_cast<int>(dt))) == 0) {
      return make_error(StatusCode::kUnsupported, "{} does not speak wire dtype {}", link->label,
                        wire::wire_dtype_name(dt));
    }
  }
  if ((link->session.modes & (1u << static_cast<int>(opts.combine))) == 0) {
    return make_error(StatusCode::kUnsupported, "{} does not support combine mode {}", link->label,
                      wire::combine_mode_name(opts.combine));
  }
  link->limits.max_frame_bytes = local.max_frame_bytes;
  link->limits.n_layer = local.n_layer;
  link->limits.n_expert = local.n_expert;
  link->limits.max_n_embd = std::max<uint32_t>(local.n_embd, 1);
  link->mux = std::make_unique<net::RequestMux>(link->conn.get());
  // Warm-up: opens the congestion window before the first real layer (netstack.md finding 3)
  // and proves the worker answers requests, not just HELLO.
  auto rtt = net::ping(*link->mux, opts.warmup_pad_bytes, opts.warmup_pad_bytes, deadline);
  if (!rtt) return rtt.status().with_context(link->label + ": warm-up ping");
  link->warmup_rtt = *rtt;
  return link;
}

}  // namespace moesh
