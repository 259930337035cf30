// LocalExperts: what the backbone can compute itself. See include/moesh/remote/local_experts.h.
#include "moesh/remote/local_experts.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "moesh/swarm/swarm.h"

namespace moesh {

namespace {

const char* const kWeightName[3] = {"ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"};

std::string stacked_name(int layer, int which) {
  return fmt::format("blk.{}.{}.weight", layer, kWeightName[which]);
}

}  // namespace

LocalExperts::LocalExperts(const Model& model) : model_(model), n_expert_(model.hparams().n_expert) {
  act_ = model.hparams().expert_ffn.act;
  const std::vector<ExpertWeights> file = model.expert_weights();
  layers_.resize(file.size());
  for (size_t l = 0; l < file.size(); ++l) {
    Layer& L = layers_[l];
    L.slot.assign(static_cast<size_t>(n_expert_), -1);
    if (!model.layers[l].is_moe) continue;
    if (file[l].valid()) {
      L.mapped = true;
      L.view = file[l];
      for (int64_t e = 0; e < n_expert_; ++e) L.slot[static_cast<size_t>(e)] = static_cast<int32_t>(e);
      continue;
    }
    // A backbone slice: the model's slab hashes (to check received copies against) and, when
    // recorded, the stacked tensors' layout (to know what a copy would cost before fetching it).
    for (int w = 0; w < 3; ++w) {
      const std::string name = stacked_name(static_cast<int>(l), w);
      auto h = swarm::expert_slab_hashes(model.file(), name);
      if (h.is_ok()) L.hashes[w] = std::move(*h);
      auto layout = swarm::expert_tensor_layout(model.file(), name);
      if (layout.is_ok()) {
        L.layout_bytes += type_row_bytes(layout->type, static_cast<int64_t>(layout->ne0)) * layout->ne1;
      } else {
        L.layout_bytes = 0;
        break;
      }
    }
  }
}

int32_t LocalExperts::slot(int layer, int expert) const {
  if (layer < 0 || layer >= n_layer() || expert < 0 || expert >= n_expert_) return -1;
  return layers_[static_cast<size_t>(layer)].slot[static_cast<size_t>(expert)];
}

uint64_t LocalExperts::slab_bytes(int layer) const {
  if (layer < 0 || layer >= n_layer()) return 0;
  const Layer& L = layers_[static_cast<size_t>(layer)];
  if (L.mapped) {
    return expert_slab_bytes(L.view.gate) + expert_slab_bytes(L.view.up) + expert_slab_bytes(L.view.down);
  }
  if (!L.ids.empty()) {
    uint64_t b = 0;
    for (const wire::SlabTensor& t : L.shape) b += type_row_bytes(t.type, static_cast<int64_t>(t.ne0)) * t.ne1;
    return b;
  }
  return L.layout_bytes;
}

std::vector<ExpertWeights> LocalExperts::weights() const {
  std::vector<ExpertWeights> out(layers_.size());
  for (size_t l = 0; l < layers_.size(); ++l) out[l] = layers_[l].view;
  return out;
}

uint64_t LocalExperts::received_bytes() const {
  uint64_t b = 0;
  for (const Layer& L : layers_) {
    if (!L.mapped) b += L.buf[0].size() + L.buf[1].size() + L.buf[2].size();
  }
  return b;
}

Status LocalExperts::add(int layer, int expert, const wire::SlabMsg& slab) {
  if (layer < 0 || layer >= n_layer() || expert < 0 || expert >= n_expert_ ||
      !model_.layers[static_cast<size_t>(layer)].is_moe) {
    return make_error(StatusCode::kInvalidArgument, "local experts: no routed expert {} at layer {}", expert, layer);
  }
  Layer& L = layers_[static_cast<size_t>(layer)];
  if (L.mapped) return make_error(StatusCode::kInvalidArgument, "layer {}: the backbone maps its experts", layer);
  if (has(layer, expert)) return Status::ok();
  for (int w = 0; w < 3; ++w) {
    const wire::SlabTensor& t = slab.tensors[static_cast<size_t>(w)];
    const std::string name = stacked_name(layer, w);
    if (L.hashes[w].size() != static_cast<size_t>(n_expert_)) {
      return make_error(StatusCode::kUnsupported,
                        "{}: the backbone's file has no slab hashes for it, so a received copy cannot be checked",
                        name);
    }
    const uint64_t want = L.hashes[w][static_cast<size_t>(expert)];
    const uint64_t got = swarm::slab_hash(t.bytes.data(), t.bytes.size());
    if (got != want) {
      return make_error(StatusCode::kCorrupt,
                        "{} expert {}: received slab hashes to {:016x}, the model's is {:016x} (not the model's "
                        "weights)",
                        name, expert, got, want);
    }
    if (!L.ids.empty()) {
      const wire::SlabTensor& s = L.shape[static_cast<size_t>(w)];
      if (s.type != t.type || s.ne0 != t.ne0 || s.ne1 != t.ne1) {
        return make_error(StatusCode::kCorrupt, "{} expert {}: type or shape differs from the layer's other experts",
                          name, expert);
      }
    }
  }
  if (L.ids.empty()) {
    for (int w = 0; w < 3; ++w) {
      L.shape[static_cast<size_t>(w)] = slab.tensors[static_cast<size_t>(w)];
      L.shape[static_cast<size_t>(w)].bytes.clear();
    }
  }
  for (int w = 0; w < 3; ++w) {
    const std::vector<uint8_t>& b = slab.tensors[static_cast<size_t>(w)].bytes;
    L.buf[w].insert(L.buf[w].end(), b.begin(), b.end());
  }
  L.slot[static_cast<size_t>(expert)] = static_cast<int32_t>(L.ids.size());
  L.ids.push_back(expert);
  rebuild_view(L);
  return Status::ok();
}

void LocalExperts::retain(int layer, const std::vector<bool>& keep) {
  if (layer < 0 || layer >= n_layer()) return;
  Layer& L = layers_[static_cast<size_t>(layer)];
  if (L.mapped || L.ids.empty()) return;
  std::array<std::vector<uint8_t>, 3> buf;
  std::vector<int32_t> ids;
  for (size_t s = 0; s < L.ids.size(); ++s) {
    const int32_t e = L.ids[s];
    L.slot[static_cast<size_t>(e)] = -1;
    if (static_cast<size_t>(e) >= keep.size() || !keep[static_cast<size_t>(e)]) continue;
    for (int w = 0; w < 3; ++w) {
      const size_t n = L.buf[w].size() / L.ids.size();
      buf[w].insert(buf[w].end(), L.buf[w].begin() + static_cast<std::ptrdiff_t>(s * n),
                    L.buf[w].begin() + static_cast<std::ptrdiff_t>((s + 1) * n));
    }
    L.slot[static_cast<size_t>(e)] = static_cast<int32_t>(ids.size());
    ids.push_back(e);
  }
  L.buf = std::move(buf);
  L.ids = std::move(ids);
  rebuild_view(L);
}

void LocalExperts::rebuild_view(Layer& L) {
  L.view = ExpertWeights{};
  if (L.ids.empty()) return;
  TensorView* views[3] = {&L.view.gate, &L.view.up, &L.view.down};
  for (int w = 0; w < 3; ++w) {
    const wire::SlabTensor& s = L.shape[static_cast<size_t>(w)];
    TensorView& v = *views[w];
    v.name = fmt::format("received {}", kWeightName[w]);
    v.type = s.type;
    v.n_dims = 3;
    v.ne[0] = static_cast<int64_t>(s.ne0);
    v.ne[1] = static_cast<int64_t>(s.ne1);
    v.ne[2] = static_cast<int64_t>(L.ids.size());
    v.ne[3] = 1;
    v.set_contiguous_strides();
    v.data = L.buf[w].data();
  }
  L.view.act = act_;
  L.view.swiglu_limit = model_.hparams().expert_ffn.swiglu_limit_of(static_cast<int64_t>(&L - layers_.data()));
  L.view.situ_beta = model_.hparams().expert_ffn.situ_beta;
  L.view.situ_linear_beta = model_.hparams().expert_ffn.situ_linear_beta;
  // Expert biases (the backbone file keeps them; they are tiny): the same rows, compacted by slot.
  const size_t l = static_cast<size_t>(&L - layers_.data());
  const ExpertWeights& model_w = model_.layers[l].experts;
  if (model_w.has_biases()) {
    const TensorView* src[3] = {&model_w.gate_b, &model_w.up_b, &model_w.down_b};
    TensorView* dst[3] = {&L.view.gate_b, &L.view.up_b, &L.view.down_b};
    for (int w = 0; w < 3; ++w) {
      const int64_t n = src[w]->ne[0];
      L.bias[w].resize(static_cast<size_t>(n) * L.ids.size());
      for (size_t i = 0; i < L.ids.size(); ++i) {
        const float* row = reinterpret_cast<const float*>(src[w]->data + static_cast<size_t>(L.ids[i]) * src[w]->nb[1]);
        std::copy_n(row, n, L.bias[w].data() + i * static_cast<size_t>(n));
      }
      TensorView& v = *dst[w];
      v.name = fmt::format("received {} bias", kWeightName[w]);
      v.type = GgmlType::F32;
      v.n_dims = 2;
      v.ne[0] = n;
      v.ne[1] = static_cast<int64_t>(L.ids.size());
      v.ne[2] = v.ne[3] = 1;
      v.set_contiguous_strides();
      v.data = reinterpret_cast<const uint8_t*>(L.bias[w].data());
    }
  }
}

}  // namespace moesh
