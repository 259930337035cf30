// A worker's monitoring port (`moesh worker --metrics HOST:PORT`): GET /health, GET /metrics
// (Prometheus: the worker's counters and its ledger per backbone) and GET /swarm/ledger (the
// worker's side of the work ledger, serve/ledger.h). Read-only; it never touches the experts.
#pragma once

#include <memory>
#include <string>

#include "moesh/swarm/swarm.h"
#include "moesh/util/status.h"

namespace moesh::serve {

class WorkerHttp {
 public:
  // Binds host:port (0: any free port) and serves on a thread of its own until destruction.
  // `worker` must outlive it.
  static Result<std::unique_ptr<WorkerHttp>> start(const swarm::Worker* worker, const std::string& host, int port);
  ~WorkerHttp();
  WorkerHttp(const WorkerHttp&) = delete;
  WorkerHttp& operator=(const WorkerHttp&) = delete;
  int port() const;

  struct Impl;

 private:
  explicit WorkerHttp(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The worker's Prometheus exposition (unit-tested without a server).
std::string render_worker_metrics(const swarm::Worker& worker);

}  // namespace moesh::serve
