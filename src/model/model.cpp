// Model loading: hyper-parameters, then every tensor bound by name with its shape checked.
// In dequant-f32 mode each non-F32 weight is dequantized once into an owned F32 buffer.
#include <utility>

#include "model/layers.h"
#include "moesh/tensor/quant.h"

namespace moesh {

namespace {

class FileBinder final : public detail::TensorBinder {
 public:
  FileBinder(const gguf::File& f, bool dequant, std::vector<std::vector<float>>* owned)
      : f_(f), dequant_(dequant), owned_(owned) {
    // A backbone slice (`moesh slice --backbone`) has no routed-expert tensors: those experts
    // are served by workers (RemoteExecutor), so their absence is expected there.
    auto kind = f.get_or<std::string>("moesh.slice.kind", "");
    no_routed_experts_ = kind.is_ok() && *kind == "backbone";
  }

  Result<TensorView> take(const std::string& name, std::vector<int64_t> ne, bool required = true) override {
    const gguf::TensorInfo* info = f_.find_tensor(name);
    if (info == nullptr) {
      const bool routed = name.ends_with("_exps.weight");
      if (!required || (routed && no_routed_experts_)) return TensorView{};
      return make_error(StatusCode::kNotFound, "tensor '{}' missing", name);
    }
    bool ok = info->n_dims >= 1 && static_cast<size_t>(info->n_dims) <= 4;
    for (size_t i = 0; ok && i < 4; ++i) {
      const int64_t want = i < ne.size() ? ne[i] : 1;
      ok = info->ne[i] == want;
    }
    if (!ok) {
      std::string want, have;
      for (size_t i = 0; i < ne.size(); ++i) want += (i ? ", " : "") + std::to_string(ne[i]);
      for (int i = 0; i < info->n_dims; ++i) have += (i ? ", " : "") + std::to_string(info->ne[i]);
      return make_error(StatusCode::kCorrupt, "tensor '{}' has shape [{}], expected [{}]", name, have, want);
    }
    if (!quant::type_is_supported(info->type)) {
      return make_error(StatusCode::kUnsupported, "tensor '{}' has unsupported type {}", name, type_name(info->type));
    }
    TensorView v = f_.view(*info);
    if (!dequant_ || v.type == GgmlType::F32) return v;
    // Debug mode: the same weights in F32, so every matmul runs F32 x F32.
    std::vector<float>& buf = owned_->emplace_back(static_cast<size_t>(v.n_elements()));
    for (int64_t r = 0; r < v.n_rows(); ++r) {
      const int64_t i1 = r % v.ne[1], i2 = (r / v.ne[1]) % v.ne[2], i3 = r / (v.ne[1] * v.ne[2]);
      quant::dequantize_row_ref(v.type, v.row(i1, i2, i3), buf.data() + r * v.ne[0], v.ne[0]);
    }
    TensorView d = v;
    d.type = GgmlType::F32;
    d.data = reinterpret_cast<const uint8_t*>(buf.data());
    d.set_contiguous_strides();
    return d;
  }

 private:
  const gguf::File& f_;
  bool dequant_;
  bool no_routed_experts_ = false;
  std::vector<std::vector<float>>* owned_;
};

}  // namespace

namespace detail {

Status bind_ffn(TensorBinder& b, const HParams& hp, int il, bool moe, LayerWeights* lw) {
  const std::string p = "blk." + std::to_string(il) + ".";
  const int64_t d = hp.n_embd;
  MOESH_ASSIGN_OR_RETURN(lw->ffn_norm, b.take(p + "ffn_norm.weight", {d}));
  lw->is_moe = moe;
  if (!moe) {
    const int64_t f = hp.n_ff;
    MOESH_ASSIGN_OR_RETURN(lw->ffn_gate, b.take(p + "ffn_gate.weight", {d, f}));
    MOESH_ASSIGN_OR_RETURN(lw->ffn_up, b.take(p + "ffn_up.weight", {d, f}));
    MOESH_ASSIGN_OR_RETURN(lw->ffn_down, b.take(p + "ffn_down.weight", {f, d}));
    return Status::ok();
  }
  const int64_t e = hp.n_expert, fe = hp.n_ff_exp;
  MOESH_ASSIGN_OR_RETURN(lw->router, b.take(p + "ffn_gate_inp.weight", {d, e}));
  if (lw->router.type != GgmlType::F32) {
    return make_error(StatusCode::kUnsupported, "tensor '{}' is {}, the router must be F32", lw->router.name,
                      type_name(lw->router.type));
  }
  MOESH_ASSIGN_OR_RETURN(lw->exp_probs_b, b.take(p + "exp_probs_b.bias", {e}, false));
  if (lw->exp_probs_b.valid() && lw->exp_probs_b.type != GgmlType::F32) {
    return make_error(StatusCode::kUnsupported, "tensor '{}' must be F32", lw->exp_probs_b.name);
  }
  MOESH_ASSIGN_OR_RETURN(lw->experts.gate, b.take(p + "ffn_gate_exps.weight", {d, fe, e}));
  MOESH_ASSIGN_OR_RETURN(lw->experts.up, b.take(p + "ffn_up_exps.weight", {d, fe, e}));
  MOESH_ASSIGN_OR_RETURN(lw->experts.down, b.take(p + "ffn_down_exps.weight", {fe, d, e}));
  // All three absent = a backbone slice's layer (experts served remotely).
  const bool has_experts = lw->experts.gate.valid() || lw->experts.up.valid() || lw->experts.down.valid();
  if (has_experts) MOESH_RETURN_IF_ERROR(lw->experts.validate());
  if (hp.n_expert_shared > 0) {
    const int64_t fs = hp.n_ff_exp * hp.n_expert_shared;
    MOESH_ASSIGN_OR_RETURN(lw->gate_shexp, b.take(p + "ffn_gate_shexp.weight", {d, fs}));
    MOESH_ASSIGN_OR_RETURN(lw->up_shexp, b.take(p + "ffn_up_shexp.weight", {d, fs}));
    MOESH_ASSIGN_OR_RETURN(lw->down_shexp, b.take(p + "ffn_down_shexp.weight", {fs, d}));
  }
  return Status::ok();
}

}  // namespace detail

Model::~Model() = default;

Result<std::unique_ptr<Model>> Model::load(const std::string& path, const LoadOptions& opts) {
  auto f = gguf::File::open(path);
  if (!f) return f.status().with_context("loading " + path);
  auto m = from_file(std::move(*f), opts);
  if (!m) return m.status().with_context("loading " + path);
  return m;
}

Result<std::unique_ptr<Model>> Model::from_file(std::unique_ptr<gguf::File> file, const LoadOptions& opts) {
  std::unique_ptr<Model> m(new Model());
  m->file_ = std::move(file);
  m->opts_ = opts;
  MOESH_ASSIGN_OR_RETURN(m->hp_, load_hparams(*m->file_));
  MOESH_RETURN_IF_ERROR(m->bind_tensors());
  return m;
}

Status Model::bind_tensors() {
  FileBinder b(*file_, opts_.dequant_f32, &owned_);
  const HParams& hp = hp_;
  MOESH_ASSIGN_OR_RETURN(tok_embd, b.take("token_embd.weight", {hp.n_embd, hp.n_vocab}));
  MOESH_ASSIGN_OR_RETURN(output_norm, b.take("output_norm.weight", {hp.n_embd}));
  MOESH_ASSIGN_OR_RETURN(output, b.take("output.weight", {hp.n_embd, hp.n_vocab}, false));
  if (!output.valid()) output = tok_embd;  // tied embeddings
  if (output_norm.type != GgmlType::F32) {
    return make_error(StatusCode::kUnsupported, "tensor 'output_norm.weight' must be F32");
  }
  if (hp.arch == Arch::kLlama) {
    MOESH_ASSIGN_OR_RETURN(TensorView rf, b.take("rope_freqs.weight", {hp.n_rot / 2}, false));
    if (rf.valid()) {
      if (rf.type != GgmlType::F32) {
        return make_error(StatusCode::kUnsupported, "tensor 'rope_freqs.weight' must be F32");
      }
      hp_.rope.freq_factors = detail::f32(rf);
    }
  }
  layers.resize(static_cast<size_t>(hp.n_layer));
  for (int il = 0; il < hp.n_layer; ++il) {
    LayerWeights* lw = &layers[static_cast<size_t>(il)];
    Status st;
    switch (hp.arch) {
      case Arch::kQwen3Moe:
        st = detail::bind_layer_qwen3moe(b, hp, il, lw);
        break;
      case Arch::kLlama:
        st = detail::bind_layer_llama(b, hp, il, lw);
        break;
      case Arch::kDeepseek2:
        st = detail::bind_layer_deepseek2(b, hp, il, lw);
        break;
      default:
        st = make_error(StatusCode::kUnsupported, "architecture not supported");
    }
    MOESH_RETURN_IF_ERROR(st);
    // Norm weights are read as plain floats.
    for (const TensorView* t :
         {&lw->attn_norm, &lw->ffn_norm, &lw->q_norm, &lw->k_norm, &lw->q_a_norm, &lw->kv_a_norm}) {
      if (t->valid() && t->type != GgmlType::F32) {
        return make_error(StatusCode::kUnsupported, "tensor '{}' must be F32", t->name);
      }
    }
  }
  return Status::ok();
}

std::vector<ExpertWeights> Model::expert_weights() const {
  std::vector<ExpertWeights> out(layers.size());
  for (size_t i = 0; i < layers.size(); ++i) {
    if (layers[i].is_moe) out[i] = layers[i].experts;
  }
  return out;
}

}  // namespace moesh
