// Slice files (docs/slice.md): an expert slice holds some experts' slabs for a worker; a backbone
// slice holds everything except the routed experts. Both keep the model's metadata (so
// load_hparams works on them) and record the full model's identity.
#include <fmt/format.h>
#include <xxhash.h>

#include "moesh/swarm/swarm.h"

namespace moesh::swarm {

namespace {

constexpr const char* kExpTensors[3] = {"ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight"};

bool is_routed_expert_tensor(std::string_view name) {
  return name.find("_exps.") != std::string_view::npos;
}

// Copies the model's metadata (minus any moesh.slice.* keys of a previous slice) and adds the
// keys every slice carries.
Status start_slice(const gguf::File& model, const char* kind, const ModelShape& shape, gguf::Writer* w) {
  for (const auto& [k, v] : model.kvs()) {
    if (!k.starts_with("moesh.slice.")) w->set(k, v);
  }
  MOESH_ASSIGN_OR_RETURN(ModelIdentity id, model_identity(model));
  w->set(kKeyModelId, gguf::Value::str(id.hex()));
  w->set(kKeyKind, gguf::Value::str(kind));
  std::vector<int32_t> ls(shape.moe_layers.begin(), shape.moe_layers.end());
  w->set(kKeyMoeLayers, gguf::Value::i32_array(ls));
  return Status::ok();
}

}  // namespace

std::string slice_tensor_name(const std::string& base, uint32_t first, uint32_t last) {
  return fmt::format("{}@{}-{}", base, first, last);
}

uint64_t slab_hash(const uint8_t* data, size_t n_bytes) {
  return XXH3_64bits(data, n_bytes);
}

std::string slice_kind(const gguf::File& f) {
  auto k = f.get_or<std::string>(kKeyKind, "");
  return k ? *k : std::string();
}

Status write_expert_slice(const gguf::File& model, const ExpertSet& experts, const std::string& out) {
  if (!slice_kind(model).empty() && slice_kind(model) != kKindExperts) {
    return make_error(StatusCode::kInvalidArgument, "{} is a {} slice; it holds no experts", model.path(),
                      slice_kind(model));
  }
  if (experts.empty()) return make_error(StatusCode::kInvalidArgument, "no experts selected");
  // Open the source through an ExpertStore: it resolves where each slab lives (full model or an
  // existing slice) and verifies a source slice's hashes before they are copied.
  auto src_file = gguf::File::open(model.path());
  if (!src_file) return src_file.status();
  MOESH_ASSIGN_OR_RETURN(std::unique_ptr<ExpertStore> store, ExpertStore::open(std::move(*src_file), experts));
  gguf::Writer w;
  MOESH_RETURN_IF_ERROR(start_slice(model, kKindExperts, store->shape(), &w));
  w.set(kKeyExperts, gguf::Value::str(experts.to_string()));
  for (const auto& r : experts.ranges) {
    // A held range may straddle two source blocks (a slice cut from a slice): copy expert by
    // expert through the store, which is contiguous-per-expert in every source.
    const ExpertStore::Slot s0 = store->find(r.layer, r.first);
    const ExpertStore::Slot s1 = store->find(r.layer, r.first + r.count - 1);
    // Usually the range is one run of one source tensor and is written straight from the map;
    // a range straddling two source blocks (a slice cut from a slice) is gathered into a copy.
    const bool contiguous = s0.weights == s1.weights && s1.index - s0.index == r.count - 1;
    for (int t = 0; t < 3; ++t) {
      auto pick = [t](const ExpertWeights* ew) -> const TensorView& {
        return t == 0 ? ew->gate : t == 1 ? ew->up : ew->down;
      };
      const TensorView& sv = pick(s0.weights);
      const size_t slab = expert_slab_bytes(sv);
      std::vector<uint8_t> buf;
      if (!contiguous) buf.resize(slab * r.count);
      std::vector<gguf::Value> hashes;
      for (uint32_t i = 0; i < r.count; ++i) {
        const ExpertStore::Slot s = store->find(r.layer, r.first + i);
        const TensorView& v = pick(s.weights);
        const uint8_t* p = v.data + expert_slab_offset(v, s.index);
        if (!contiguous) std::copy_n(p, slab, buf.data() + slab * i);
        hashes.push_back(gguf::Value::u64(slab_hash(p, slab)));
      }
      const std::string base = fmt::format("blk.{}.{}", r.layer, kExpTensors[t]);
      const std::string name = slice_tensor_name(base, r.first, r.first + r.count - 1);
      const std::vector<int64_t> ne = {sv.ne[0], sv.ne[1], int64_t{r.count}};
      if (contiguous) {
        MOESH_RETURN_IF_ERROR(w.add_tensor(name, sv.type, ne, sv.data + expert_slab_offset(sv, s0.index)));
      } else {
        MOESH_RETURN_IF_ERROR(w.add_tensor_copy(name, sv.type, ne, buf.data()));
      }
      w.set(kKeyHashPrefix + name, gguf::Value::array(gguf::ValueType::UINT64, std::move(hashes)));
    }
  }
  return w.write_file(out);
}

Status write_backbone_slice(const gguf::File& model, const std::string& out) {
  if (slice_kind(model) == kKindExperts) {
    return make_error(StatusCode::kInvalidArgument, "{} is an expert slice, not a model", model.path());
  }
  MOESH_ASSIGN_OR_RETURN(ModelShape shape, model_shape(model));
  gguf::Writer w;
  MOESH_RETURN_IF_ERROR(start_slice(model, kKindBackbone, shape, &w));
  for (const auto& t : model.tensors()) {
    if (is_routed_expert_tensor(t.name)) continue;
    const TensorView v = model.view(t);
    std::vector<int64_t> ne(v.ne, v.ne + t.n_dims);
    MOESH_RETURN_IF_ERROR(w.add_tensor(t.name, t.type, ne, v.data));  // zero-copy from the map
  }
  return w.write_file(out);
}

}  // namespace moesh::swarm
