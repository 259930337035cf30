// Helpers shared by the model-running commands (logits, run, bench).
#pragma once

#include <CLI/CLI.hpp>
#include <charconv>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "moesh/model/model.h"
#include "moesh/swarm/swarm.h"

namespace moesh::cli {

// "1,2, 3" -> {1, 2, 3}; rejects empty lists and anything that is not a non-negative integer.
inline Result<std::vector<int32_t>> parse_token_list(std::string_view s) {
  std::vector<int32_t> out;
  size_t i = 0;
  while (i <= s.size()) {
    size_t j = s.find(',', i);
    if (j == std::string_view::npos) j = s.size();
    std::string_view item = s.substr(i, j - i);
    while (!item.empty() && item.front() == ' ') item.remove_prefix(1);
    while (!item.empty() && item.back() == ' ') item.remove_suffix(1);
    int32_t v = -1;
    auto [p, ec] = std::from_chars(item.data(), item.data() + item.size(), v);
    if (item.empty() || ec != std::errc() || p != item.data() + item.size() || v < 0) {
      return make_error(StatusCode::kInvalidArgument, "--tokens: '{}' is not a token id", std::string(item));
    }
    out.push_back(v);
    i = j + 1;
  }
  return out;
}

// Loads a model, printing the error and returning null on failure. A backbone or span slice has
// its non-expert tensors checked against their hashes first (a damaged slice is refused; one cut
// before the hashes existed runs with a warning).
inline std::unique_ptr<Model> load_model_or_report(const std::string& path, bool dequant_f32, const char* cmd,
                                                   LoadOptions::Memory memory = LoadOptions::Memory::kAuto) {
  LoadOptions o;
  o.dequant_f32 = dequant_f32;
  o.memory = memory;
  auto m = Model::load(path, o);
  if (!m) {
    std::fprintf(stderr, "moesh %s: error: %s\n", cmd, m.status().to_string().c_str());
    return nullptr;
  }
  int n_checked = 0;
  const Status v = swarm::verify_slice_tensors((*m)->file(), &n_checked);
  if (v.code() == StatusCode::kNotFound) {
    std::fprintf(stderr, "moesh %s: warning: %s\n", cmd, v.message().c_str());
  } else if (!v.is_ok()) {
    std::fprintf(stderr, "moesh %s: error: %s\n", cmd, v.to_string().c_str());
    return nullptr;
  } else if (n_checked > 0) {
    std::fprintf(stderr, "moesh %s: %s slice: %d tensors match their hashes\n", cmd,
                 swarm::slice_kind((*m)->file()).c_str(), n_checked);
  }
  return std::move(*m);
}

// --poll-us (worker, span and backbone commands): busy-poll for what the process waits for
// (`waited`: "the next request", "a worker's reply") before sleeping (net::TcpOptions::poll_us).
inline void add_poll_flag(CLI::App* sub, int* poll_us, const std::string& waited) {
  sub->add_option("--poll-us", *poll_us,
                  "Busy-poll for " + waited +
                      " this many microseconds before sleeping: saves the wake-up (50-100 us per trip on a VM) at "
                      "the cost of a spinning CPU; for processes with a core to spare (docs/PERFORMANCE.md)")
      ->check(CLI::Range(0, 1000000))
      ->capture_default_str();
}

// --mmap / --no-mmap (llama.cpp's names) set LoadOptions::memory; neither: auto (read into
// huge-page memory when the file takes at most half of the available memory, else map).
inline void add_memory_flags(CLI::App* sub, LoadOptions::Memory* m) {
  CLI::Option* map = sub->add_flag_callback(
      "--mmap", [m] { *m = LoadOptions::Memory::kMap; },
      "Map the model file (instant start, pages shared and reclaimable; slower decode)");
  CLI::Option* mem = sub->add_flag_callback(
      "--no-mmap", [m] { *m = LoadOptions::Memory::kMemory; },
      "Read the model into huge-page memory (faster decode; default when it takes <= half the free memory)");
  map->excludes(mem);
}

// Where a worker's (or span peer's) expert slabs live, by --mmap / --no-mmap: auto copies them
// into huge-page memory when they take at most half the free memory (ExpertStore::
// load_into_memory: faster expert calls), else they stay mapped and are pre-faulted. A copy that
// cannot be had falls back to the mapping with a warning, or fails with --no-mmap. False: failed
// (said on stderr).
inline bool place_slabs(swarm::ExpertStore* store, LoadOptions::Memory m, const char* cmd) {
  if (choose_file_load(m, store->slab_bytes()) == gguf::FileLoad::kMemory) {
    Status st = store->load_into_memory();
    if (st.is_ok()) return true;
    std::fprintf(stderr, "moesh %s: %s: %s\n", cmd, m == LoadOptions::Memory::kMemory ? "error" : "warning",
                 st.to_string().c_str());
    if (m == LoadOptions::Memory::kMemory) return false;
  }
  store->prefault();
  return true;
}

// The chat template to use: --chat-template when given, else the file's own; a file without one
// gets its architecture's family (e.g. glm4 for glm4moe), said on stderr so it is no surprise.
inline std::string chat_template_spec(const Model& model, const std::string& flag, const char* cmd) {
  if (!flag.empty() || model.file().has("tokenizer.chat_template")) return flag;
  const std::string_view fam = chat_family_of(model.hparams());
  if (fam.empty()) return flag;
  std::fprintf(stderr, "moesh %s: the model has no chat template; using the '%.*s' family of its architecture (%s)\n",
               cmd, static_cast<int>(fam.size()), fam.data(), model.hparams().arch_name.c_str());
  return std::string(fam);
}

}  // namespace moesh::cli
