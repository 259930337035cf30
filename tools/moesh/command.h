// Subcommand registry for the moesh CLI. Each tools/moesh/cmd_*.cpp registers itself with a
// static CommandRegistrar; main() builds the CLI11 app from the registry. Adding a command
// therefore never edits main.cpp.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <string>
#include <vector>

namespace moesh::cli {

struct Command {
  std::string name;
  std::string help;
  // Adds options to `sub` and returns the function that runs the command (exit code).
  std::function<std::function<int()>(CLI::App* sub)> setup;
};

std::vector<Command>& registry();

struct CommandRegistrar {
  explicit CommandRegistrar(Command c) { registry().push_back(std::move(c)); }
};

}  // namespace moesh::cli
