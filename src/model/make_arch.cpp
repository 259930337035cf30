// make-model support from the architecture registry (include/moesh/model/make_arch.h).
#include "moesh/model/make_arch.h"

#include "model/arch.h"

namespace moesh {

namespace {

// Records what an arch's bind functions take. Required tensors are recorded and answered with a
// placeholder view of the asked shape (F32, which every check accepts); optional ones are left out,
// as a model of that architecture may lack them.
class RecordingBinder final : public detail::TensorBinder {
 public:
  std::vector<ArchTensorSpec> tensors;
  int layer = -1;

  Result<TensorView> take(const std::string& name, std::vector<int64_t> ne, bool required) override {
    if (!required) return TensorView{};
    tensors.push_back({name, ne, layer});
    TensorView v;
    v.name = name;
    v.type = GgmlType::F32;
    v.n_dims = static_cast<int>(ne.size());
    for (size_t i = 0; i < 4; ++i) v.ne[i] = i < ne.size() ? ne[i] : 1;
    v.set_contiguous_strides();
    static const float kZero[16] = {};
    v.data = reinterpret_cast<const uint8_t*>(kZero);  // never read beyond what bind checks
    return v;
  }
};

}  // namespace

std::vector<std::string> makeable_architectures() {
  std::vector<std::string> out;
  for (const ArchDef* a : all_archs()) {
    if (a->make_defaults != nullptr && a->write_hparams != nullptr) out.emplace_back(a->name);
  }
  return out;
}

Result<HParams> arch_make_defaults(std::string_view arch) {
  const ArchDef* a = find_arch(arch);
  if (a == nullptr || a->make_defaults == nullptr) {
    return make_error(StatusCode::kNotFound, "make-model cannot write architecture '{}' through the registry", arch);
  }
  HParams hp = a->make_defaults();
  // The shape every model of the archs/ reference set shares (reference README §3).
  if (hp.n_vocab == 0) hp.n_vocab = 512;
  if (hp.n_ctx_train == 0) hp.n_ctx_train = 256;
  if (hp.n_embd == 0) hp.n_embd = 256;
  hp.arch = a;
  hp.arch_name = std::string(arch);
  return hp;
}

Result<ArchMakePlan> arch_make_plan(const HParams& hp) {
  if (hp.arch == nullptr || hp.arch->write_hparams == nullptr) {
    return make_error(StatusCode::kInvalidArgument, "architecture '{}' has no make-model support", hp.arch_name);
  }
  ArchMakePlan plan;
  hp.arch->write_hparams(hp, &plan.kvs);
  // Read the keys back exactly as a loader would: the derived settings (which tensors exist,
  // their widths, which blocks are dense) come from the arch's own read_hparams.
  gguf::Writer w;
  w.set("general.architecture", gguf::Value::str(hp.arch_name));
  for (const auto& [k, v] : plan.kvs) w.set(k, v);
  MOESH_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, w.write_bytes());
  MOESH_ASSIGN_OR_RETURN(std::unique_ptr<gguf::File> f, gguf::File::from_bytes(std::move(bytes)));
  MOESH_ASSIGN_OR_RETURN(plan.hp, load_hparams(*f));
  const HParams& h = plan.hp;

  RecordingBinder b;
  MOESH_RETURN_IF_ERROR(b.take("token_embd.weight", {h.n_embd, h.n_vocab}, true).status());
  MOESH_RETURN_IF_ERROR(b.take("output_norm.weight", {h.n_embd}, true).status());
  MOESH_RETURN_IF_ERROR(b.take("output.weight", {h.n_embd, h.n_vocab}, true).status());
  HParams scratch = h;
  if (h.arch->bind_globals != nullptr) MOESH_RETURN_IF_ERROR(h.arch->bind_globals(b, &scratch));
  for (int il = 0; il < h.n_layer; ++il) {
    b.layer = il;
    LayerWeights lw;
    MOESH_RETURN_IF_ERROR(h.arch->bind_layer(b, h, il, &lw));
  }
  for (int k = 0; k < h.n_nextn && h.arch->bind_nextn != nullptr; ++k) {
    b.layer = static_cast<int>(h.n_layer) + k;
    NextnWeights nw;
    MOESH_RETURN_IF_ERROR(h.arch->bind_nextn(b, h, b.layer, &nw));
  }
  plan.tensors = std::move(b.tensors);
  return plan;
}

}  // namespace moesh
