// Runs the built `moesh` CLI as a subprocess (tests of the commands themselves): stdout and stderr
// captured separately, the exit code decoded.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <string>

namespace moesh::test {

struct RunResult {
  int exit_code = -1;
  std::string out, err;
};

// A path as one shell word (test paths hold no single quote).
inline std::string quoted(const std::string& s) {
  return "'" + s + "'";
}

// `args` is appended to the binary path as shell text (quote paths with quoted()).
inline RunResult run_moesh(const std::string& args) {
  static std::atomic<int> counter{0};
  const std::string err_path =
      (std::filesystem::temp_directory_path() /
       ("moesh_cli_err_" + std::to_string(::getpid()) + "_" + std::to_string(counter.fetch_add(1))))
          .string();
  const std::string cmd = std::string("'") + MOESH_BIN_DIR + "/moesh' " + args + " 2>'" + err_path + "'";
  RunResult r;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  const int status = ::pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  if (FILE* e = std::fopen(err_path.c_str(), "r")) {
    while ((n = std::fread(buf.data(), 1, buf.size(), e)) > 0) r.err.append(buf.data(), n);
    std::fclose(e);
  }
  std::remove(err_path.c_str());
  return r;
}

}  // namespace moesh::test
