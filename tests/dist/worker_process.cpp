#include "dist/worker_process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <regex>

namespace moesh::test {

Result<std::unique_ptr<WorkerProcess>> WorkerProcess::spawn(const std::string& model, const std::string& spec,
                                                            int threads, std::chrono::milliseconds startup,
                                                            std::vector<std::string> extra) {
  const std::string th = std::to_string(threads);
  std::vector<std::string> args = {"worker",   "-m",          model,       "--experts", spec,
                                   "--listen", "127.0.0.1:0", "--threads", th};
  args.insert(args.end(), extra.begin(), extra.end());
  return spawn_command(std::move(args), spec, startup);
}

Result<std::unique_ptr<WorkerProcess>> WorkerProcess::spawn_command(std::vector<std::string> cmd_args,
                                                                    const std::string& spec,
                                                                    std::chrono::milliseconds startup) {
  const std::string bin = std::string(MOESH_BIN_DIR) + "/moesh";
  std::vector<std::string> args = {bin};
  args.insert(args.end(), cmd_args.begin(), cmd_args.end());
  return spawn_program(std::move(args), spec, startup);
}

Result<std::unique_ptr<WorkerProcess>> WorkerProcess::spawn_program(std::vector<std::string> args,
                                                                    const std::string& spec,
                                                                    std::chrono::milliseconds startup) {
  if (args.empty()) return make_error(StatusCode::kInvalidArgument, "spawn_program: no program");
  const std::string bin = args[0];
  if (access(bin.c_str(), X_OK) != 0) {
    return make_error(StatusCode::kNotFound, "worker binary {} not found (build the moesh target)", bin);
  }
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return make_error(StatusCode::kIoError, "pipe: {}", std::strerror(errno));
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) return make_error(StatusCode::kIoError, "fork: {}", std::strerror(errno));
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    dup2(fds[1], STDOUT_FILENO);
    std::vector<char*> argv;
    for (auto& s : args) argv.push_back(s.data());
    argv.push_back(nullptr);
    execv(bin.c_str(), argv.data());
    _exit(127);
  }
  close(fds[1]);
  std::unique_ptr<WorkerProcess> w(new WorkerProcess());
  w->pid_ = pid;
  w->out_fd_ = fds[0];
  w->spec_ = spec;
  // Read until the port line appears (or the child exits / the startup time passes).
  const auto deadline = std::chrono::steady_clock::now() + startup;
  const std::regex re(R"(listening on (\S+):(\d+))");
  std::string buf;
  while (true) {
    std::smatch m;
    if (std::regex_search(buf, m, re)) {
      w->port_ = static_cast<uint16_t>(std::stoi(m[2].str()));
      break;
    }
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      return make_error(StatusCode::kTimeout, "worker '{}' printed no port within {} ms; output: {}", spec,
                        startup.count(), buf);
    }
    pollfd p{w->out_fd_, POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
    char tmp[4096];
    const ssize_t n = read(w->out_fd_, tmp, sizeof tmp);
    if (n <= 0) {
      return make_error(StatusCode::kUnavailable, "worker '{}' exited before listening; output: {}", spec, buf);
    }
    buf.append(tmp, static_cast<size_t>(n));
  }
  w->out_ = buf;
  WorkerProcess* self = w.get();
  w->drain_ = std::thread([self] {
    char tmp[4096];
    while (true) {
      const ssize_t n = read(self->out_fd_, tmp, sizeof tmp);
      if (n <= 0) break;
      std::lock_guard<std::mutex> lk(self->mu_);
      if (self->out_.size() < (1u << 20)) self->out_.append(tmp, static_cast<size_t>(n));
    }
  });
  return w;
}

std::string WorkerProcess::output() const {
  std::lock_guard<std::mutex> lk(mu_);
  return out_;
}

void WorkerProcess::stop(std::chrono::milliseconds grace) {
  if (pid_ > 0) {
    kill(pid_, SIGCONT);
    kill(pid_, SIGTERM);
    const auto deadline = std::chrono::steady_clock::now() + grace;
    bool reaped = false;
    while (std::chrono::steady_clock::now() < deadline) {
      if (waitpid(pid_, nullptr, WNOHANG) == pid_) {
        reaped = true;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    if (!reaped) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    pid_ = -1;
  }
  // The pipe's write end died with the child, so the drain thread sees EOF.
  if (drain_.joinable()) drain_.join();
  if (out_fd_ >= 0) {
    close(out_fd_);
    out_fd_ = -1;
  }
}

void WorkerProcess::kill_now() {
  if (pid_ > 0) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
  stop(std::chrono::milliseconds(0));
}

void WorkerProcess::pause() {
  if (pid_ <= 0) return;
  kill(pid_, SIGSTOP);
  // kill() only queues the signal: on a busy machine the worker could still answer a request
  // sent right after. Wait until the kernel reports it stopped, so "paused" really means silent.
  int wst = 0;
  while (waitpid(pid_, &wst, WUNTRACED) == pid_) {
    if (WIFSTOPPED(wst)) break;
    if (WIFEXITED(wst) || WIFSIGNALED(wst)) {
      pid_ = -1;  // already reaped
      break;
    }
  }
}
void WorkerProcess::resume() {
  if (pid_ > 0) kill(pid_, SIGCONT);
}

WorkerProcess::~WorkerProcess() {
  stop(std::chrono::milliseconds(3000));
}

}  // namespace moesh::test
