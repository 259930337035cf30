// moesh CLI entry point: dispatches to the registered subcommands.
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdio>

#include "command.h"
#include "moesh/util/process.h"

namespace moesh::cli {
std::vector<Command>& registry() {
  static std::vector<Command> r;
  return r;
}
}  // namespace moesh::cli

int main(int argc, char** argv) {
  using namespace moesh::cli;
  moesh::keep_freed_memory();  // no page faults on every trip's buffers (util/process.h)
  CLI::App app{"moesh: Mixture-of-Experts inference across a swarm of machines"};
  app.require_subcommand(1);
  bool verbose = false;
  app.add_flag("-v,--verbose", verbose, "Verbose logging");

  auto& cmds = registry();
  std::sort(cmds.begin(), cmds.end(), [](const Command& a, const Command& b) { return a.name < b.name; });
  std::vector<std::pair<CLI::App*, std::function<int()>>> runners;
  for (auto& c : cmds) {
    CLI::App* sub = app.add_subcommand(c.name, c.help);
    runners.emplace_back(sub, c.setup(sub));
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help / --version exit 0; every usage error exits 2 (CLI11's own codes are 100+), as
    // scripts and the docs expect ("2 = bad arguments").
    const int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }
  // Log lines go to stderr: stdout carries results (--json, generated text) that scripts parse.
  spdlog::set_default_logger(spdlog::stderr_color_mt("moesh"));
  spdlog::set_level(verbose ? spdlog::level::debug : spdlog::level::info);
  spdlog::set_pattern("[%H:%M:%S.%e] %^%l%$ %v");
  for (auto& [sub, run] : runners) {
    if (sub->parsed()) {
      try {
        return run();
      } catch (const std::exception& e) {
        std::fprintf(stderr, "moesh %s: error: %s\n", sub->get_name().c_str(), e.what());
        return 1;
      }
    }
  }
  return 1;
}
