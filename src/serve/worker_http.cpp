// A worker's monitoring port (serve/worker_http.h) on cpp-httplib.
#include "moesh/serve/worker_http.h"

#include <fmt/format.h>
#include <httplib.h>

#include <thread>

#include "moesh/serve/ledger.h"
#include "serve/metrics.h"

namespace moesh::serve {

std::string render_worker_metrics(const swarm::Worker& worker) {
  std::string o;
  auto counter = [&o](const char* name, const char* help, uint64_t v) {
    o += fmt::format("# HELP {} {}\n# TYPE {} counter\n{} {}\n", name, help, name, name, v);
  };
  const swarm::WorkerStats& st = worker.stats();
  counter("moesh_worker_connections_total", "Backbone connections (accepted and dialled out)", st.connections.load());
  counter("moesh_worker_refused_total", "Connections refused in the handshake (model, swarm key)", st.refused.load());
  counter("moesh_worker_requests_total", "DISPATCH requests received", st.dispatches.load());
  counter("moesh_worker_fetch_requests_total", "FETCH requests received", st.fetches.load());
  counter("moesh_worker_compute_passes_total", "Compute passes (a DISPATCH, or a batch of several backbones' ones)",
          st.computes.load());
  counter("moesh_worker_batched_requests_total", "DISPATCHes computed in a pass together with others",
          st.batched.load());
  counter("moesh_worker_replicas_stored_total", "Replicas received (STORE answered with STORED)", st.stores.load());
  counter("moesh_worker_replicas_dropped_total", "Replicas let go of (UNSTORE answered with UNSTORED)",
          st.unstores.load());
  counter("moesh_worker_replica_refusals_total", "STOREs refused (budget, hashes, shape, disk)",
          st.store_refusals.load());
  o += fmt::format(
      "# HELP moesh_worker_replica_bytes Slab bytes of the replicas held\n"
      "# TYPE moesh_worker_replica_bytes gauge\nmoesh_worker_replica_bytes {}\n",
      st.replica_bytes.load());
  counter("moesh_worker_errors_total", "Requests answered with an ERROR", st.errors.load());
  counter("moesh_worker_joins_total", "Dial-out connections (--join) that completed the handshake", st.joins.load());
  counter("moesh_worker_join_failures_total", "Dial-outs (--join) that failed", st.join_failures.load());
  const std::vector<swarm::LedgerEntry> led = worker.ledger();
  auto per_backbone = [&](const char* name, const char* type, const char* help, auto value) {
    o += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
    for (const swarm::LedgerEntry& e : led)
      o += fmt::format("{}{{backbone=\"{}\"}} {}\n", name, escape_label(e.peer), value(e));
  };
  per_backbone("moesh_ledger_dispatches_total", "counter", "Dispatches answered with a COMBINE, per backbone",
               [](const swarm::LedgerEntry& e) { return e.dispatches; });
  per_backbone("moesh_ledger_pairs_total", "counter", "(token, expert) pairs computed, per backbone",
               [](const swarm::LedgerEntry& e) { return e.pairs; });
  per_backbone("moesh_ledger_dispatch_bytes_total", "counter", "DISPATCH bytes received, per backbone",
               [](const swarm::LedgerEntry& e) { return e.dispatch_bytes; });
  per_backbone("moesh_ledger_combine_bytes_total", "counter", "COMBINE bytes sent, per backbone",
               [](const swarm::LedgerEntry& e) { return e.combine_bytes; });
  per_backbone("moesh_ledger_compute_seconds_total", "counter", "Compute time of the dispatches, per backbone",
               [](const swarm::LedgerEntry& e) { return e.compute_seconds; });
  per_backbone("moesh_ledger_connected", "gauge", "1 while the backbone is connected",
               [](const swarm::LedgerEntry& e) { return e.connected ? 1 : 0; });
  return o;
}

struct WorkerHttp::Impl {
  const swarm::Worker* worker = nullptr;
  httplib::Server svr;
  std::thread thread;
  int port = 0;
};

WorkerHttp::WorkerHttp(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

WorkerHttp::~WorkerHttp() {
  impl_->svr.stop();
  if (impl_->thread.joinable()) impl_->thread.join();
}

int WorkerHttp::port() const {
  return impl_->port;
}

Result<std::unique_ptr<WorkerHttp>> WorkerHttp::start(const swarm::Worker* worker, const std::string& host, int port) {
  auto impl = std::make_unique<Impl>();
  Impl* m = impl.get();
  m->worker = worker;
  m->svr.set_read_timeout(10, 0);
  m->svr.set_write_timeout(10, 0);
  m->svr.Get("/health", [m](const httplib::Request&, httplib::Response& res) {
    nlohmann::json j = {{"status", "ok"}, {"role", "worker"}, {"name", m->worker->name()}};
    res.set_content(j.dump(), "application/json");
  });
  m->svr.Get("/metrics", [m](const httplib::Request&, httplib::Response& res) {
    res.set_content(render_worker_metrics(*m->worker), "text/plain; version=0.0.4");
  });
  m->svr.Get("/swarm/ledger", [m](const httplib::Request&, httplib::Response& res) {
    res.set_content(ledger_json("worker", m->worker->name(), m->worker->ledger()).dump(2), "application/json");
  });
  if (port == 0) {
    m->port = m->svr.bind_to_any_port(host);
    if (m->port <= 0) return make_error(StatusCode::kIoError, "metrics: cannot listen on {}: no free port", host);
  } else {
    if (port < 0 || port > 65535 || !m->svr.bind_to_port(host, port))
      return make_error(StatusCode::kIoError, "metrics: cannot listen on {}:{}", host, port);
    m->port = port;
  }
  m->thread = std::thread([m] { m->svr.listen_after_bind(); });
  return std::unique_ptr<WorkerHttp>(new WorkerHttp(std::move(impl)));
}

}  // namespace moesh::serve
