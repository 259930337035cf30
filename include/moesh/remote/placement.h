// Placement: who holds each (layer, expert) — any number of workers (replicas) and/or a copy on
// the backbone — built from the expert ranges workers announce in their HELLOs. It says what is
// possible; the Planner (planner.h) decides, per token, who computes.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "moesh/util/status.h"
#include "moesh/wire/wire.h"

namespace moesh {

class Placement {
 public:
  static constexpr int kLocal = -1;  // the backbone computes it
  static constexpr int kNone = -2;   // nobody: a dense layer, or an expert nobody holds

  Placement() = default;
  Placement(int n_layer, int n_expert);

  int n_layer() const { return n_layer_; }
  int n_expert() const { return n_expert_; }
  // Number of worker indices the placement may name (1 + the largest holder seen).
  int n_workers() const { return n_workers_; }

  // Workers holding the expert, ascending and without duplicates. More than one = replicas.
  std::span<const int32_t> holders(int layer, int expert) const { return holders_[at(layer, expert)]; }
  void add_holder(int layer, int expert, int worker);
  // The worker no longer holds it (a replica it let go of); nothing when it was not a holder.
  void remove_holder(int layer, int expert, int worker);
  // The backbone has this expert's weights (its own file maps them).
  bool local_copy(int layer, int expert) const { return local_[at(layer, expert)] != 0; }
  void set_local_copy(int layer, int expert, bool on) { local_[at(layer, expert)] = on ? 1 : 0; }
  // The default computer of an expert: its first worker holder, else kLocal with a local copy,
  // else kNone.
  int owner(int layer, int expert) const;

  // (layer, expert) pairs whose owner() is `owner` (a worker index or kLocal).
  int64_t count(int owner) const;
  // Pairs worker w holds as a replica of another worker's (it is not their owner()).
  int64_t count_replicas(int worker) const;
  // The pairs owned by `owner`, layers with the same experts merged:
  // "layers 0-47: experts 0-31" or "layer 0: experts 0-7,9; layers 1-3: experts 0-63".
  std::string describe(int owner) const;

 private:
  size_t at(int layer, int expert) const {
    return static_cast<size_t>(layer) * static_cast<size_t>(n_expert_) + static_cast<size_t>(expert);
  }
  int n_layer_ = 0, n_expert_ = 0, n_workers_ = 0;
  std::vector<std::vector<int32_t>> holders_;
  std::vector<uint8_t> local_;
};

// What the placement is built from.
struct PlacementInput {
  int n_layer = 0;
  int n_expert = 0;
  std::vector<bool> moe_layer;    // [n_layer]: layer has routed experts
  std::vector<bool> local_layer;  // [n_layer]: the backbone holds all of this layer's experts
  // Optional, [n_layer * n_expert] (layer-major): the backbone holds this one expert. Combined
  // with local_layer by "or", so a backbone can hold single hot experts of a layer.
  std::vector<bool> local_expert;
  std::vector<std::vector<wire::ExpertRange>> worker_experts;  // per worker, from its HELLO
  std::vector<std::string> worker_names;                       // for messages
};

// Every holder is recorded; kNotFound listing the uncovered experts (layer by layer) if a MoE
// expert has neither a worker holder nor a local copy; kInvalidArgument if a worker announces a
// range outside the model or of a dense layer, or the input is inconsistent.
Result<Placement> build_placement(const PlacementInput& in);

// "a-b,c" for a sorted list of ids (used in messages).
std::string format_id_ranges(const std::vector<int>& ids);

}  // namespace moesh
