// LocalExperts: the routed-expert weights the backbone can compute itself, per layer.
//
// A backbone on the full model maps every expert from its own file (nothing to copy). A backbone
// on a backbone slice (docs/slice.md) has none, but may receive single experts from workers
// (FETCH -> SLAB) to compute hot ones itself; each received slab is checked against the model's
// own slab hashes, which the backbone slice carries, so a worker cannot make the backbone compute
// with weights that are not the model's (the SLAB's own hash only guards the transfer). Received
// experts of a layer are kept in one compact stacked tensor per weight, so the LocalExecutor runs
// them like any stacked tensor; slot() maps an expert id to its index there.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <vector>

#include "moesh/model/model.h"
#include "moesh/moe/executor.h"
#include "moesh/util/status.h"
#include "moesh/wire/wire.h"

namespace moesh {

class LocalExperts {
 public:
  // The experts `model`'s file holds (every expert of each MoE layer of a full model; none for a
  // backbone slice). The model must outlive this.
  explicit LocalExperts(const Model& model);

  int n_layer() const { return static_cast<int>(layers_.size()); }
  bool has(int layer, int expert) const { return slot(layer, expert) >= 0; }
  // Index of the expert in weights()[layer], or -1.
  int32_t slot(int layer, int expert) const;
  // True when the layer's experts come from the file (all of them, nothing received).
  bool mapped(int layer) const { return layers_[static_cast<size_t>(layer)].mapped; }
  // Bytes of one expert's three slabs at `layer`: known for mapped layers, for layers a copy was
  // received for, and for layers whose backbone slice records the stacked tensors' layout; else 0.
  uint64_t slab_bytes(int layer) const;
  // Per layer the stacked weights to run (invalid where the backbone has none), for LocalExecutor.
  std::vector<ExpertWeights> weights() const;
  // Bytes of received copies held now.
  uint64_t received_bytes() const;

  // Adds a received expert. kCorrupt naming the tensor when a slab's hash is not the model's (or
  // its type/shape differs from the layer's others); kUnsupported when the backbone's file has no
  // hashes to check against; kInvalidArgument for a mapped layer (it needs nothing).
  Status add(int layer, int expert, const wire::SlabMsg& slab);
  // Drops every received expert of `layer` not in keep[expert] (mapped layers are untouched).
  void retain(int layer, const std::vector<bool>& keep);

 private:
  struct Layer {
    bool mapped = false;
    ExpertWeights view;                           // mapped: the file's; received: over `bufs`
    std::vector<int32_t> slot;                    // [n_expert]
    std::vector<int32_t> ids;                     // received: expert id of each slot
    std::array<std::vector<uint8_t>, 3> buf;      // received: gate, up, down slabs stacked by slot
    std::array<wire::SlabTensor, 3> shape;        // received: type and 2-D shape (bytes empty)
    std::array<std::vector<float>, 3> bias;       // received: the model's expert biases by slot (gpt-oss)
    std::array<std::vector<uint64_t>, 3> hashes;  // the model's slab hashes (empty: unknown)
    uint64_t layout_bytes = 0;                    // from the backbone slice's layout, if recorded
  };
  void rebuild_view(Layer& L);

  const Model& model_;
  int64_t n_expert_ = 0;
  ExpertActivation act_ = ExpertActivation::kSilu;
  std::vector<Layer> layers_;
};

}  // namespace moesh
