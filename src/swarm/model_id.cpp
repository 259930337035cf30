// Model identity (XXH3-128 of metadata + tensor table) and the HELLO both roles send.
//
// The identity is a hash of a canonical serialization, not of the file bytes: the data section
// is excluded (hashing 100+ GB at start-up is not an option) and so is every `moesh.slice.*` key,
// so the value only depends on what makes two files "the same model". Slices store the full
// model's identity, because their own tensor tables differ.
#include <fmt/format.h>
#include <xxhash.h>

#include <cstring>

#include "moesh/model/model.h"
#include "moesh/swarm/swarm.h"

namespace moesh::swarm {

namespace {

class Hasher {
 public:
  Hasher() : st_(XXH3_createState()) { XXH3_128bits_reset(st_); }
  ~Hasher() { XXH3_freeState(st_); }
  Hasher(const Hasher&) = delete;
  Hasher& operator=(const Hasher&) = delete;

  void bytes(const void* p, size_t n) { XXH3_128bits_update(st_, p, n); }
  void u64(uint64_t v) {
    uint8_t b[8];
    for (int i = 0; i < 8; ++i) b[i] = static_cast<uint8_t>(v >> (8 * i));  // little-endian
    bytes(b, 8);
  }
  void str(std::string_view s) {
    u64(s.size());
    bytes(s.data(), s.size());
  }
  void value(const gguf::Value& v) {
    u64(static_cast<uint64_t>(v.type));
    if (const auto* x = std::get_if<uint64_t>(&v.v)) {
      u64(*x);
    } else if (const auto* x = std::get_if<int64_t>(&v.v)) {
      u64(static_cast<uint64_t>(*x));
    } else if (const auto* x = std::get_if<double>(&v.v)) {
      uint64_t bits;
      std::memcpy(&bits, x, 8);
      u64(bits);
    } else if (const auto* x = std::get_if<bool>(&v.v)) {
      u64(*x ? 1 : 0);
    } else if (const auto* x = std::get_if<std::string>(&v.v)) {
      str(*x);
    } else if (const auto* x = std::get_if<gguf::Array>(&v.v)) {
      u64(static_cast<uint64_t>(x->elem_type));
      u64(x->items.size());
      for (const auto& it : x->items) value(it);
    }
  }
  ModelIdentity digest() const {
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits_digest(st_));
    ModelIdentity id;
    std::memcpy(id.bytes.data(), c.digest, 16);
    return id;
  }

 private:
  XXH3_state_t* st_;
};

bool is_slice_key(std::string_view k) {
  return k.starts_with("moesh.slice.");
}

}  // namespace

std::string ModelIdentity::hex() const {
  std::string s;
  for (uint8_t b : bytes) s += fmt::format("{:02x}", b);
  return s;
}

Result<ModelIdentity> ModelIdentity::from_hex(std::string_view hex) {
  if (hex.size() != 32) {
    return make_error(StatusCode::kCorrupt, "model identity '{}' must be 32 hex digits", hex);
  }
  ModelIdentity id;
  for (size_t i = 0; i < 16; ++i) {
    uint8_t b = 0;
    for (size_t j = 0; j < 2; ++j) {
      const char c = hex[2 * i + j];
      int d;
      if (c >= '0' && c <= '9')
        d = c - '0';
      else if (c >= 'a' && c <= 'f')
        d = c - 'a' + 10;
      else
        return make_error(StatusCode::kCorrupt, "model identity '{}' is not lowercase hex", hex);
      b = static_cast<uint8_t>(b * 16 + d);
    }
    id.bytes[i] = b;
  }
  return id;
}

ModelIdentity compute_model_identity(const gguf::File& f) {
  Hasher h;
  h.str("moesh.model_id.v1");  // domain separation: a future scheme gets a different prefix
  uint64_t n_kv = 0;
  for (const auto& [k, v] : f.kvs()) n_kv += is_slice_key(k) ? 0 : 1;
  h.u64(n_kv);
  for (const auto& [k, v] : f.kvs()) {
    if (is_slice_key(k)) continue;
    h.str(k);
    h.value(v);
  }
  h.u64(f.tensors().size());
  for (const auto& t : f.tensors()) {
    h.str(t.name);
    h.u64(static_cast<uint64_t>(t.type));
    h.u64(static_cast<uint64_t>(t.n_dims));
    for (int i = 0; i < t.n_dims; ++i) h.u64(static_cast<uint64_t>(t.ne[i]));
  }
  return h.digest();
}

Result<ModelIdentity> model_identity(const gguf::File& f) {
  if (f.has(kKeyModelId)) {
    MOESH_ASSIGN_OR_RETURN(std::string hex, f.get<std::string>(kKeyModelId));
    auto id = ModelIdentity::from_hex(hex);
    if (!id) return id.status().with_context(fmt::format("{} in {}", kKeyModelId, f.path()));
    return id;
  }
  return compute_model_identity(f);
}

wire::Hello make_hello(wire::PeerRole role, const ModelIdentity& id, const ModelShape& shape, const ExpertSet& held,
                       std::string name) {
  wire::Hello h;
  h.role = role;
  h.model_id_bytes = 16;
  std::memcpy(h.model_id.data(), id.bytes.data(), 16);
  h.n_layer = shape.n_layer;
  h.n_expert = shape.n_expert;
  h.n_embd = shape.n_embd;
  h.dtypes = kAllDTypes;
  h.modes = kAllModes;
  // A backbone may send STORE and UNSTORE; a worker offers them only with a replica folder (it
  // adds the bits).
  h.features = wire::kFeatureFetch | wire::kFeatureInfo | wire::kFeatureProbe |
               (role == wire::PeerRole::kBackbone ? wire::kFeatureStore | wire::kFeatureUnstore | wire::kFeatureSpan |
                                                        wire::kFeatureSpanChain | wire::kFeatureSpanLoad
                                                  : 0u);
  h.expert_act = shape.expert_ffn.act == ExpertActivation::kSwigluOai ? wire::kExpertActSwigluOai
                 : shape.expert_ffn.act == ExpertActivation::kSitu    ? wire::kExpertActSitu
                                                                      : wire::kExpertActSilu;
  h.expert_flags = static_cast<uint8_t>((shape.expert_ffn.biases ? wire::kExpertFlagBiases : 0) |
                                        (shape.expert_ffn.input_scaled ? wire::kExpertFlagInputScaled : 0) |
                                        (shape.expert_ffn.has_swiglu_limits() ? wire::kExpertFlagSwigluLimit : 0));
  if (role == wire::PeerRole::kWorker) h.experts = held.ranges;
  if (name.size() > wire::kMaxNameBytes) name.resize(wire::kMaxNameBytes);
  h.name = std::move(name);
  return h;
}

Result<ExpertFfn> expert_ffn_of(const gguf::File& f) {
  // The architecture's own definition (its file in the model registry), never a guess here.
  auto hp = load_hparams(f);
  if (!hp) return hp.status();
  return hp->expert_ffn;
}

}  // namespace moesh::swarm
