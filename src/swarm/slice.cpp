// Slice files (docs/slice.md): an expert slice holds some experts' slabs for a worker; a backbone
// slice holds everything except the routed experts. Both keep the model's metadata (so
// load_hparams works on them) and record the full model's identity. Both carry an XXH3-64 per
// expert slab, so whoever holds a slice can check slabs it gets from elsewhere.
#include <fmt/format.h>
#include <xxhash.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "moesh/swarm/swarm.h"

namespace moesh::swarm {

namespace {

constexpr const char* kExpTensors[3] = {"ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight"};

constexpr const char* kExpBiases[3] = {"ffn_gate_exps.bias", "ffn_up_exps.bias", "ffn_down_exps.bias"};

// The stacked routed-expert weights (the per-expert biases are tiny and stay in a backbone slice).
bool is_routed_expert_tensor(std::string_view name) {
  return name.find("_exps.") != std::string_view::npos && !name.ends_with(".bias");
}

// A tensor of block >= n_layer: a NextN/MTP block after the decoder. Its experts stay in a backbone
// slice, since the draft head runs on the backbone (a draft over the WAN would cost the trips it
// is there to save).
bool after_decoder(std::string_view name, uint32_t n_layer) {
  if (!name.starts_with("blk.")) return false;
  name.remove_prefix(4);
  uint32_t il = 0;
  size_t i = 0;
  for (; i < name.size() && name[i] >= '0' && name[i] <= '9'; ++i) il = il * 10 + static_cast<uint32_t>(name[i] - '0');
  return i > 0 && i < name.size() && name[i] == '.' && il >= n_layer;
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

// XXH3-64 of each expert slab of a stacked [ne0, ne1, n_expert] tensor, in stacking order.
std::vector<uint64_t> hash_slabs(const TensorView& v) {
  std::vector<uint64_t> out(static_cast<size_t>(v.ne[2]));
  for (int64_t e = 0; e < v.ne[2]; ++e)
    out[static_cast<size_t>(e)] = slab_hash(v.data + expert_slab_offset(v, e), expert_slab_bytes(v));
  return out;
}

gguf::Value u64_array(const std::vector<uint64_t>& xs) {
  std::vector<gguf::Value> items;
  items.reserve(xs.size());
  for (uint64_t x : xs) items.push_back(gguf::Value::u64(x));
  return gguf::Value::array(gguf::ValueType::UINT64, std::move(items));
}

}  // namespace

std::string slice_tensor_name(const std::string& base, uint32_t first, uint32_t last) {
  return fmt::format("{}@{}-{}", base, first, last);
}

uint64_t slab_hash(const uint8_t* data, size_t n_bytes) {
  return XXH3_64bits(data, n_bytes);
}

wire::SlabMsg slab_of(const ExpertWeights& w, int64_t index, uint32_t layer, uint32_t expert,
                      const std::array<uint64_t, 3>* hashes) {
  wire::SlabMsg m;
  m.layer = layer;
  m.expert = expert;
  const TensorView* views[3] = {&w.gate, &w.up, &w.down};
  for (int t = 0; t < 3; ++t) {
    const TensorView& v = *views[t];
    const uint8_t* data = v.data + expert_slab_offset(v, index);
    const size_t n = expert_slab_bytes(v);
    wire::SlabTensor& st = m.tensors[static_cast<size_t>(t)];
    st.type = v.type;
    st.ne0 = static_cast<uint64_t>(v.ne[0]);
    st.ne1 = static_cast<uint64_t>(v.ne[1]);
    st.hash = hashes != nullptr ? (*hashes)[static_cast<size_t>(t)] : slab_hash(data, n);
    st.bytes.assign(data, data + n);
  }
  return m;
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
  // The model's slab hashes and layout of every stacked expert tensor (as a backbone slice keeps
  // them): what a worker checks an expert it is sent (STORE) against. A source slice cut before
  // these were recorded cannot pass them on.
  for (uint32_t l : store->shape().moe_layers) {
    for (const char* t : kExpTensors) {
      const std::string name = fmt::format("blk.{}.{}", l, t);
      auto hashes = expert_slab_hashes(model, name);
      auto layout = expert_tensor_layout(model, name);
      if (!hashes || !layout) continue;
      w.set(kKeyHashPrefix + name, u64_array(*hashes));
      w.set(kKeyLayoutPrefix + name,
            u64_array({static_cast<uint64_t>(layout->type), layout->ne0, layout->ne1, layout->ne2}));
    }
  }
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
    // Per-expert biases (gpt-oss): the range's rows [ne0, count] in F32, hashed per row.
    if (s0.weights->has_biases()) {
      for (int t = 0; t < 3; ++t) {
        auto pick = [t](const ExpertWeights* ew) -> const TensorView& {
          return t == 0 ? ew->gate_b : t == 1 ? ew->up_b : ew->down_b;
        };
        const int64_t n = pick(s0.weights).ne[0];
        std::vector<uint8_t> buf(static_cast<size_t>(n) * sizeof(float) * r.count);
        std::vector<gguf::Value> hashes;
        for (uint32_t i = 0; i < r.count; ++i) {
          const ExpertStore::Slot s = store->find(r.layer, r.first + i);
          const TensorView& v = pick(s.weights);
          const uint8_t* p = v.data + static_cast<size_t>(s.index) * v.nb[1];
          std::copy_n(p, n * sizeof(float), buf.data() + static_cast<size_t>(n) * sizeof(float) * i);
          hashes.push_back(gguf::Value::u64(slab_hash(p, n * sizeof(float))));
        }
        const std::string name =
            slice_tensor_name(fmt::format("blk.{}.{}", r.layer, kExpBiases[t]), r.first, r.first + r.count - 1);
        MOESH_RETURN_IF_ERROR(w.add_tensor_copy(name, GgmlType::F32, {n, int64_t{r.count}}, buf.data()));
        w.set(kKeyHashPrefix + name, gguf::Value::array(gguf::ValueType::UINT64, std::move(hashes)));
      }
    }
  }
  return w.write_file(out);
}

Status check_slab_for_model(const gguf::File& f, const wire::SlabMsg& slab) {
  MOESH_ASSIGN_OR_RETURN(ModelShape shape, model_shape(f));
  if (!shape.is_moe(slab.layer) || slab.expert >= shape.n_expert)
    return make_error(StatusCode::kCorrupt, "layer {} expert {} is not a routed expert of the model", slab.layer,
                      slab.expert);
  if (shape.expert_ffn.biases)
    return make_error(StatusCode::kUnsupported,
                      "the model's experts have bias rows, which a STORE does not carry: replicas of them cannot be "
                      "sent over the wire");
  for (int t = 0; t < 3; ++t) {
    const wire::SlabTensor& st = slab.tensors[static_cast<size_t>(t)];
    const std::string name = fmt::format("blk.{}.{}", slab.layer, kExpTensors[t]);
    MOESH_ASSIGN_OR_RETURN(ExpertTensorLayout layout, expert_tensor_layout(f, name));
    if (st.type != layout.type || st.ne0 != layout.ne0 || st.ne1 != layout.ne1) {
      return make_error(StatusCode::kCorrupt, "{} expert {}: slab is {} [{} x {}], the model's is {} [{} x {}]", name,
                        slab.expert, type_name(st.type), st.ne0, st.ne1, type_name(layout.type), layout.ne0,
                        layout.ne1);
    }
    MOESH_ASSIGN_OR_RETURN(std::vector<uint64_t> hashes, expert_slab_hashes(f, name));
    if (slab.expert >= hashes.size())
      return make_error(StatusCode::kCorrupt, "{}: {} hashes, no expert {}", name, hashes.size(), slab.expert);
    const uint64_t got = slab_hash(st.bytes.data(), st.bytes.size());
    if (got != hashes[slab.expert]) {
      return make_error(StatusCode::kCorrupt,
                        "{} expert {}: slab hashes to {:016x}, the model's is {:016x} (not the model's weights)", name,
                        slab.expert, got, hashes[slab.expert]);
    }
  }
  return Status::ok();
}

Status write_replica_slice(const gguf::File& f, const wire::SlabMsg& slab, const std::string& out) {
  MOESH_RETURN_IF_ERROR(check_slab_for_model(f, slab));
  MOESH_ASSIGN_OR_RETURN(ModelShape shape, model_shape(f));
  gguf::Writer w;
  MOESH_RETURN_IF_ERROR(start_slice(f, kKindExperts, shape, &w));
  w.set(kKeyExperts, gguf::Value::str(fmt::format("{}:{}", slab.layer, slab.expert)));
  for (int t = 0; t < 3; ++t) {
    const wire::SlabTensor& st = slab.tensors[static_cast<size_t>(t)];
    const std::string name =
        slice_tensor_name(fmt::format("blk.{}.{}", slab.layer, kExpTensors[t]), slab.expert, slab.expert);
    const std::vector<int64_t> ne = {static_cast<int64_t>(st.ne0), static_cast<int64_t>(st.ne1), 1};
    MOESH_RETURN_IF_ERROR(w.add_tensor_copy(name, st.type, ne, st.bytes.data()));
    w.set(kKeyHashPrefix + name, u64_array({slab_hash(st.bytes.data(), st.bytes.size())}));
  }
  const std::string tmp = out + ".partial";
  MOESH_RETURN_IF_ERROR(w.write_file(tmp));
  if (std::rename(tmp.c_str(), out.c_str()) != 0) {
    const int err = errno;
    std::remove(tmp.c_str());
    return make_error(StatusCode::kIoError, "renaming {} to {}: {}", tmp, out, std::strerror(err));
  }
  return Status::ok();
}

Status write_backbone_slice(const gguf::File& model, const std::string& out) {
  if (slice_kind(model) == kKindExperts) {
    return make_error(StatusCode::kInvalidArgument, "{} is an expert slice, not a model", model.path());
  }
  MOESH_ASSIGN_OR_RETURN(ModelShape shape, model_shape(model));
  gguf::Writer w;
  MOESH_RETURN_IF_ERROR(start_slice(model, kKindBackbone, shape, &w));
  // A backbone slice of a backbone slice has no expert data to hash: keep the source's hashes.
  if (slice_kind(model) == kKindBackbone) {
    for (const auto& [k, v] : model.kvs())
      if (k.starts_with(kKeyHashPrefix) || k.starts_with(kKeyLayoutPrefix)) w.set(k, v);
  }
  for (const auto& t : model.tensors()) {
    if (is_routed_expert_tensor(t.name) && !after_decoder(t.name, shape.n_layer)) {
      // The slabs stay out, their hashes go in: a backbone on this slice can then verify an
      // expert it receives (wire SLAB) without trusting the worker that sent it. This reads
      // every expert slab once.
      if (t.n_dims == 3) {
        w.set(kKeyHashPrefix + t.name, u64_array(hash_slabs(model.view(t))));
        w.set(kKeyLayoutPrefix + t.name, u64_array({static_cast<uint64_t>(t.type), static_cast<uint64_t>(t.ne[0]),
                                                    static_cast<uint64_t>(t.ne[1]), static_cast<uint64_t>(t.ne[2])}));
      }
      continue;
    }
    const TensorView v = model.view(t);
    w.set(kKeyTensorHashPrefix + t.name, gguf::Value::u64(slab_hash(v.data, t.n_bytes)));
    std::vector<int64_t> ne(v.ne, v.ne + t.n_dims);
    MOESH_RETURN_IF_ERROR(w.add_tensor(t.name, t.type, ne, v.data));  // zero-copy from the map
  }
  return w.write_file(out);
}

Status write_span_slice(const gguf::File& model, int first, int last, const std::string& out) {
  const std::string kind = slice_kind(model);
  if (!kind.empty()) {
    return make_error(StatusCode::kInvalidArgument, "{} is a {} slice; cut a span from the full model", model.path(),
                      kind);
  }
  MOESH_ASSIGN_OR_RETURN(ModelShape shape, model_shape(model));
  if (first < 0 || last < first || static_cast<uint32_t>(last) >= shape.n_layer) {
    return make_error(StatusCode::kInvalidArgument, "blocks {}-{} are not within the model's 0-{}", first, last,
                      shape.n_layer - 1);
  }
  gguf::Writer w;
  MOESH_RETURN_IF_ERROR(start_slice(model, kKindSpan, shape, &w));
  w.set(kKeySpan, gguf::Value::i32_array({first, last}));
  for (const auto& t : model.tensors()) {
    std::string_view name = t.name;
    bool keep = false;
    if (name.starts_with("blk.")) {
      uint32_t il = 0;
      size_t i = 4;
      for (; i < name.size() && name[i] >= '0' && name[i] <= '9'; ++i) il = il * 10 + (name[i] - '0');
      keep = i > 4 && static_cast<int>(il) >= first && static_cast<int>(il) <= last;
    } else {
      // The embedding and the output head are the backbone's; the rest (norms, rope factors)
      // is small and some blocks read it.
      keep = name != "token_embd.weight" && name != "output.weight";
    }
    if (!keep) continue;
    const TensorView v = model.view(t);
    if (is_routed_expert_tensor(t.name) && t.n_dims == 3) {
      // As every slice: the slab hashes, so the span peer's experts are checked when mapped.
      w.set(kKeyHashPrefix + t.name, u64_array(hash_slabs(v)));
      w.set(kKeyLayoutPrefix + t.name, u64_array({static_cast<uint64_t>(t.type), static_cast<uint64_t>(t.ne[0]),
                                                  static_cast<uint64_t>(t.ne[1]), static_cast<uint64_t>(t.ne[2])}));
    } else {
      w.set(kKeyTensorHashPrefix + t.name, gguf::Value::u64(slab_hash(v.data, t.n_bytes)));
    }
    std::vector<int64_t> ne(v.ne, v.ne + t.n_dims);
    MOESH_RETURN_IF_ERROR(w.add_tensor(t.name, t.type, ne, v.data));
  }
  return w.write_file(out);
}

Status verify_slice_tensors(const gguf::File& f, int* n_checked) {
  if (n_checked != nullptr) *n_checked = 0;
  const std::string kind = slice_kind(f);
  if (kind != kKindBackbone && kind != kKindSpan) return Status::ok();
  bool any = false;
  for (const auto& [k, v] : f.kvs()) {
    if (k.starts_with(kKeyTensorHashPrefix)) {
      any = true;
      break;
    }
  }
  if (!any) {
    return make_error(StatusCode::kNotFound,
                      "{}: this {} slice has no tensor hashes (cut by an older moesh); its attention and router "
                      "weights are not verified — re-cut it with moesh slice to add them",
                      f.path(), kind);
  }
  int n = 0;
  for (const auto& t : f.tensors()) {
    if (is_routed_expert_tensor(t.name) && t.n_dims == 3) continue;  // per-slab hashes (ExpertStore)
    const std::string key = kKeyTensorHashPrefix + t.name;
    if (!f.has(key)) {
      return make_error(StatusCode::kCorrupt, "{}: tensor '{}' has no {} entry; the slice is damaged", f.path(), t.name,
                        key);
    }
    MOESH_ASSIGN_OR_RETURN(uint64_t want, f.get<uint64_t>(key));
    const uint64_t got = slab_hash(f.view(t).data, t.n_bytes);
    if (got != want) {
      return make_error(StatusCode::kCorrupt,
                        "{}: tensor '{}' fails its hash (stored {:016x}, computed {:016x}); the slice is damaged",
                        f.path(), t.name, want, got);
    }
    ++n;
  }
  if (n_checked != nullptr) *n_checked = n;
  return Status::ok();
}

Result<std::vector<uint64_t>> expert_slab_hashes(const gguf::File& f, const std::string& tensor_name) {
  const std::string key = kKeyHashPrefix + tensor_name;
  const gguf::TensorInfo* ti = f.find_tensor(tensor_name);
  if (ti != nullptr && ti->n_dims != 3) {
    return make_error(StatusCode::kInvalidArgument, "{}: tensor '{}' has {} dimensions, not a stacked expert tensor",
                      f.path(), tensor_name, ti->n_dims);
  }
  if (f.has(key)) {
    MOESH_ASSIGN_OR_RETURN(std::vector<uint64_t> hashes, f.get<std::vector<uint64_t>>(key));
    // One hash per expert: the tensor's stacking depth, or the model's expert count when the
    // tensor itself is not in the file (a backbone slice).
    int64_t want = 0;
    if (ti != nullptr) {
      want = ti->ne[2];
    } else {
      MOESH_ASSIGN_OR_RETURN(ModelShape shape, model_shape(f));
      want = shape.n_expert;
    }
    if (static_cast<int64_t>(hashes.size()) != want) {
      return make_error(StatusCode::kCorrupt, "{}: {} has {} hashes for {} experts", f.path(), key, hashes.size(),
                        want);
    }
    return hashes;
  }
  if (ti == nullptr) {
    return make_error(StatusCode::kNotFound, "{} holds neither tensor '{}' nor its slab hashes ('{}'){}", f.path(),
                      tensor_name, key,
                      slice_kind(f) == kKindBackbone ? "; rewrite the backbone slice with this moesh to add them" : "");
  }
  return hash_slabs(f.view(*ti));
}

Result<ExpertTensorLayout> expert_tensor_layout(const gguf::File& f, const std::string& tensor_name) {
  ExpertTensorLayout l;
  if (const gguf::TensorInfo* ti = f.find_tensor(tensor_name); ti != nullptr) {
    if (ti->n_dims != 3) {
      return make_error(StatusCode::kInvalidArgument, "{}: tensor '{}' is not a stacked expert tensor", f.path(),
                        tensor_name);
    }
    l.type = ti->type;
    l.ne0 = static_cast<uint64_t>(ti->ne[0]);
    l.ne1 = static_cast<uint64_t>(ti->ne[1]);
    l.ne2 = static_cast<uint64_t>(ti->ne[2]);
    return l;
  }
  const std::string key = kKeyLayoutPrefix + tensor_name;
  if (!f.has(key))
    return make_error(StatusCode::kNotFound, "{}: no tensor '{}' and no '{}'", f.path(), tensor_name, key);
  MOESH_ASSIGN_OR_RETURN(std::vector<uint64_t> v, f.get<std::vector<uint64_t>>(key));
  if (v.size() != 4 || !type_is_known(static_cast<uint32_t>(v[0])) || v[1] == 0 || v[2] == 0 || v[3] == 0 ||
      v[1] > UINT32_MAX || v[2] > UINT32_MAX || v[3] > 65536 ||
      v[1] % static_cast<uint64_t>(type_block_size(static_cast<GgmlType>(v[0]))) != 0) {
    return make_error(StatusCode::kCorrupt, "{}: {} is not [type, ne0, ne1, experts] of a valid tensor", f.path(), key);
  }
  l.type = static_cast<GgmlType>(v[0]);
  l.ne0 = v[1];
  l.ne1 = v[2];
  l.ne2 = v[3];
  return l;
}

Result<std::string> file_hash_hex(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return make_error(StatusCode::kIoError, "cannot open {}: {}", path, std::strerror(errno));
  XXH3_state_t* st = XXH3_createState();
  XXH3_128bits_reset(st);
  std::vector<uint8_t> buf(size_t{1} << 20);
  size_t n = 0;
  while ((n = std::fread(buf.data(), 1, buf.size(), f)) > 0) XXH3_128bits_update(st, buf.data(), n);
  const bool bad = std::ferror(f) != 0;
  std::fclose(f);
  const XXH128_hash_t h = XXH3_128bits_digest(st);
  XXH3_freeState(st);
  if (bad) return make_error(StatusCode::kIoError, "cannot read {}", path);
  return fmt::format("{:016x}{:016x}", h.high64, h.low64);
}

}  // namespace moesh::swarm
