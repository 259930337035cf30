// The backbone's registry of workers that dial in (`moesh worker --join HOST:PORT` against a
// backbone started with `--accept-workers HOST:PORT`): such a worker needs no inbound port, so
// it can sit behind NAT or a firewall that only lets connections out.
//
// The registry listens, runs the same HELLO handshake, checks and warm-up as a dialled link
// (link.h), and holds each joined link under the worker's announced name until the executor takes
// it: at start-up (RemoteExecutor::connect with "join://NAME" addresses), when a down worker is
// re-dialled (which for a joined worker means waiting for it to join again), or between calls
// (RemoteExecutor adopts new names and fresh connections of known ones). A worker that reconnects
// keeps its name, and so its place in the placement and its ledger. A newer join under a name
// replaces a link still held for it. Refused joins (wrong model, missing or wrong swarm key, a
// name that is not valid) are logged and counted, nothing is registered.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "moesh/net/transport.h"
#include "moesh/remote/link.h"
#include "moesh/util/status.h"
#include "moesh/wire/wire.h"

namespace moesh {

struct RegistryOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 0;        // 0: any free port
  int max_handshakes = 32;  // joins being handshaken at once; more are refused at accept
};

// What the registry knows about one worker name.
struct JoinRecord {
  std::string name;
  std::string address;  // where its last connection came from ("host:port")
  std::string experts;  // canonical spec it announced
  uint64_t joins = 0;   // handshakes that succeeded under this name
  bool held = false;    // a joined link is waiting to be taken
  double warmup_rtt_ms = 0;
  std::chrono::steady_clock::time_point last_join;
};

class WorkerRegistry {
 public:
  // `hello`: the backbone's HELLO; `link`: checks, swarm key, warm-up, as for dialled workers.
  static Result<std::shared_ptr<WorkerRegistry>> listen(const wire::Hello& hello, const LinkOptions& link,
                                                        const RegistryOptions& opts);
  ~WorkerRegistry();  // close()
  WorkerRegistry(const WorkerRegistry&) = delete;
  WorkerRegistry& operator=(const WorkerRegistry&) = delete;

  uint16_t port() const;
  // Stops accepting and drops the held links (their workers re-dial); idempotent.
  void close();

  // The link of worker `name` that joined since the last take, waiting for it until the
  // deadline (kTimeout naming the worker).
  Result<std::unique_ptr<WorkerLink>> take(const std::string& name, net::Deadline deadline);
  // The same without waiting: null when none is held.
  std::unique_ptr<WorkerLink> take_if_ready(const std::string& name);
  // Names with a link held, in the order they joined.
  std::vector<std::string> held() const;
  // Waits until at least n links are held or the deadline passes; returns held().
  std::vector<std::string> wait_for(size_t n, net::Deadline deadline) const;
  std::vector<JoinRecord> records() const;  // in order of first join
  uint64_t refused() const;                 // joins refused in the handshake or its checks
  std::string last_refusal() const;

  struct Impl;

 private:
  explicit WorkerRegistry(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace moesh
