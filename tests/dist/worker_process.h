// Real `moesh worker` child processes for the dist tests: spawned with --listen 127.0.0.1:0,
// the port parsed from the "listening on HOST:PORT" line, and always killed and reaped when the
// handle goes away (SIGTERM, then SIGKILL after a timeout). PR_SET_PDEATHSIG makes sure a
// crashed test leaves no worker behind.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "moesh/remote/remote.h"
#include "moesh/util/status.h"

namespace moesh::test {

class WorkerProcess {
 public:
  // Starts MOESH_BIN_DIR/moesh worker -m model --experts spec --listen 127.0.0.1:0 -t threads
  // and waits (up to `startup`) for it to print its port.
  // `extra`: more worker arguments (e.g. {"--swarm-key", FILE}).
  static Result<std::unique_ptr<WorkerProcess>> spawn(
      const std::string& model, const std::string& spec, int threads = 1,
      std::chrono::milliseconds startup = std::chrono::milliseconds(20000), std::vector<std::string> extra = {});
  // Any moesh command that prints "listening on HOST:PORT" (e.g. {"span", "-m", M, "--layers",
  // "2-4", "--listen", "127.0.0.1:0"}): `label` names it in errors.
  static Result<std::unique_ptr<WorkerProcess>> spawn_command(
      std::vector<std::string> args, const std::string& label,
      std::chrono::milliseconds startup = std::chrono::milliseconds(20000));
  // Any program that prints "listening on HOST:PORT": argv[0] is its path (e.g. {"qemu-aarch64",
  // "-L", "/usr/aarch64-linux-gnu", "build-aarch64/bin/moesh", "worker", ...}). pid() is that
  // program's (under qemu-user: the emulator's, which is the guest's process).
  static Result<std::unique_ptr<WorkerProcess>> spawn_program(
      std::vector<std::string> argv, const std::string& label,
      std::chrono::milliseconds startup = std::chrono::milliseconds(20000));
  ~WorkerProcess();
  WorkerProcess(const WorkerProcess&) = delete;
  WorkerProcess& operator=(const WorkerProcess&) = delete;

  uint16_t port() const { return port_; }
  pid_t pid() const { return pid_; }
  WorkerAddress address() const { return WorkerAddress{"127.0.0.1", port_}; }
  const std::string& spec() const { return spec_; }
  // Everything the worker printed on stdout so far.
  std::string output() const;

  // SIGKILL and reap (idempotent).
  void kill_now();
  // SIGSTOP / SIGCONT: a worker that is alive (its socket stays open) but never answers.
  void pause();
  void resume();

 private:
  WorkerProcess() = default;
  void stop(std::chrono::milliseconds grace);
  pid_t pid_ = -1;
  int out_fd_ = -1;
  uint16_t port_ = 0;
  std::string spec_;
  std::thread drain_;  // keeps reading stdout so the worker never blocks on a full pipe
  mutable std::mutex mu_;
  std::string out_;
};

}  // namespace moesh::test
