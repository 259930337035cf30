// Model loading: hyper-parameters, then every tensor bound by name with its shape checked.
// In dequant-f32 mode each non-F32 weight is dequantized once into an owned F32 buffer.
#include <sys/stat.h>

#include <cstdio>
#include <utility>

#include "model/arch.h"
#include "moesh/tensor/quant.h"
#include "moesh/util/process.h"

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
      const bool routed = name.ends_with("_exps.weight") || name.ends_with("_exps.bias");
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

std::string blk(int il, const char* name) {
  return "blk." + std::to_string(il) + "." + name;
}

Status require_f32(const TensorView& t) {
  if (t.valid() && t.type != GgmlType::F32) {
    return make_error(StatusCode::kUnsupported, "tensor '{}' is {}, must be F32", t.name, type_name(t.type));
  }
  return Status::ok();
}

Status bind_rope_freqs(TensorBinder& b, HParams* hp) {
  MOESH_ASSIGN_OR_RETURN(TensorView rf, b.take("rope_freqs.weight", {hp->n_rot / 2}, false));
  if (rf.valid()) {
    MOESH_RETURN_IF_ERROR(require_f32(rf));
    hp->rope.freq_factors = f32(rf);
  }
  return Status::ok();
}

Status bind_gqa(TensorBinder& b, const HParams& hp, int il, LayerWeights* lw, const char* biases, bool sinks) {
  const int64_t d = hp.n_embd, dk = hp.head_dim_k, dv = hp.head_dim_v;
  const int64_t H = hp.n_head_of(il), Hkv = hp.n_head_kv;
  const std::string bs = biases;
  // A gated query (qwen3next) emits [query | gate] per head: twice the width.
  const int64_t q_width = H * dk * (hp.q_gated ? 2 : 1);
  MOESH_ASSIGN_OR_RETURN(lw->attn_norm, b.take(blk(il, "attn_norm.weight"), {d}));
  MOESH_ASSIGN_OR_RETURN(lw->wq, b.take(blk(il, "attn_q.weight"), {d, q_width}));
  MOESH_ASSIGN_OR_RETURN(lw->wk, b.take(blk(il, "attn_k.weight"), {d, Hkv * dk}));
  MOESH_ASSIGN_OR_RETURN(lw->wv, b.take(blk(il, "attn_v.weight"), {d, Hkv * dv}));
  MOESH_ASSIGN_OR_RETURN(lw->wo, b.take(blk(il, "attn_output.weight"), {H * dv, d}));
  if (bs.find('q') != std::string::npos) {
    MOESH_ASSIGN_OR_RETURN(lw->bq, b.take(blk(il, "attn_q.bias"), {q_width}));
  }
  if (bs.find('k') != std::string::npos) {
    MOESH_ASSIGN_OR_RETURN(lw->bk, b.take(blk(il, "attn_k.bias"), {Hkv * dk}));
  }
  if (bs.find('v') != std::string::npos) {
    MOESH_ASSIGN_OR_RETURN(lw->bv, b.take(blk(il, "attn_v.bias"), {Hkv * dv}));
  }
  if (bs.find('o') != std::string::npos) {
    MOESH_ASSIGN_OR_RETURN(lw->bo, b.take(blk(il, "attn_output.bias"), {d}));
  }
  if (hp.qk_norm == QkNorm::kPerHead) {
    MOESH_ASSIGN_OR_RETURN(lw->q_norm, b.take(blk(il, "attn_q_norm.weight"), {dk}));
    MOESH_ASSIGN_OR_RETURN(lw->k_norm, b.take(blk(il, "attn_k_norm.weight"), {dk}));
  } else if (hp.qk_norm == QkNorm::kFull) {
    MOESH_ASSIGN_OR_RETURN(lw->q_norm, b.take(blk(il, "attn_q_norm.weight"), {H * dk}));
    MOESH_ASSIGN_OR_RETURN(lw->k_norm, b.take(blk(il, "attn_k_norm.weight"), {Hkv * dk}));
  }
  if (sinks) {
    MOESH_ASSIGN_OR_RETURN(lw->sinks, b.take(blk(il, "attn_sinks.weight"), {H}));
  }
  for (const TensorView* t : {&lw->bq, &lw->bk, &lw->bv, &lw->bo, &lw->sinks}) MOESH_RETURN_IF_ERROR(require_f32(*t));
  return Status::ok();
}

Status bind_ffn(TensorBinder& b, const HParams& hp, int il, bool moe, LayerWeights* lw, const char* norm,
                const char* need) {
  const std::string needs = need;
  const int64_t d = hp.n_embd;
  MOESH_ASSIGN_OR_RETURN(lw->ffn_norm, b.take(blk(il, norm), {d}));
  lw->is_moe = moe;
  if (!moe) {
    const int64_t f = hp.n_ff;
    MOESH_ASSIGN_OR_RETURN(lw->ffn_gate, b.take(blk(il, "ffn_gate.weight"), {d, f}));
    MOESH_ASSIGN_OR_RETURN(lw->ffn_up, b.take(blk(il, "ffn_up.weight"), {d, f}));
    MOESH_ASSIGN_OR_RETURN(lw->ffn_down, b.take(blk(il, "ffn_down.weight"), {f, d}));
    return Status::ok();
  }
  const int64_t e = hp.n_expert, fe = hp.n_ff_exp;
  MOESH_ASSIGN_OR_RETURN(lw->router, b.take(blk(il, "ffn_gate_inp.weight"), {d, e}));
  if (lw->router.type != GgmlType::F32) {
    return make_error(StatusCode::kUnsupported, "tensor '{}' is {}, the router must be F32", lw->router.name,
                      type_name(lw->router.type));
  }
  MOESH_ASSIGN_OR_RETURN(lw->router_b, b.take(blk(il, "ffn_gate_inp.bias"), {e}, needs.find('r') != std::string::npos));
  MOESH_ASSIGN_OR_RETURN(lw->exp_probs_b,
                         b.take(blk(il, "exp_probs_b.bias"), {e}, needs.find('s') != std::string::npos));
  const int64_t dx = hp.n_embd_exp();  // the experts' rows: n_embd, or the latent (kimi-k3)
  MOESH_ASSIGN_OR_RETURN(lw->experts.gate, b.take(blk(il, "ffn_gate_exps.weight"), {dx, fe, e}));
  MOESH_ASSIGN_OR_RETURN(lw->experts.up, b.take(blk(il, "ffn_up_exps.weight"), {dx, fe, e}));
  MOESH_ASSIGN_OR_RETURN(lw->experts.down, b.take(blk(il, "ffn_down_exps.weight"), {fe, dx, e}));
  if (hp.expert_ffn.biases) {
    MOESH_ASSIGN_OR_RETURN(lw->experts.gate_b, b.take(blk(il, "ffn_gate_exps.bias"), {fe, e}));
    MOESH_ASSIGN_OR_RETURN(lw->experts.up_b, b.take(blk(il, "ffn_up_exps.bias"), {fe, e}));
    MOESH_ASSIGN_OR_RETURN(lw->experts.down_b, b.take(blk(il, "ffn_down_exps.bias"), {dx, e}));
  }
  if (hp.n_expert_latent > 0) {  // latent MoE: the projections and the norm stay on the backbone
    MOESH_ASSIGN_OR_RETURN(lw->ffn_routed_down, b.take(blk(il, "ffn_routed_down.weight"), {d, dx}));
    MOESH_ASSIGN_OR_RETURN(lw->ffn_routed_norm, b.take(blk(il, "ffn_routed_norm.weight"), {dx}, false));
    MOESH_ASSIGN_OR_RETURN(lw->ffn_routed_up, b.take(blk(il, "ffn_routed_up.weight"), {dx, d}));
    MOESH_RETURN_IF_ERROR(require_f32(lw->ffn_routed_norm));
  }
  lw->experts.act = hp.expert_ffn.act;
  lw->experts.swiglu_limit = hp.expert_ffn.swiglu_limit_of(il);
  lw->experts.situ_beta = hp.expert_ffn.situ_beta, lw->experts.situ_linear_beta = hp.expert_ffn.situ_linear_beta;
  // All three absent = a backbone slice's layer (experts served remotely).
  const bool has_experts = lw->experts.gate.valid() || lw->experts.up.valid() || lw->experts.down.valid();
  if (has_experts) MOESH_RETURN_IF_ERROR(lw->experts.validate());
  if (hp.n_expert_shared > 0) {
    const int64_t fs = hp.n_ff_shexp > 0 ? hp.n_ff_shexp : hp.n_ff_exp * hp.n_expert_shared;
    MOESH_ASSIGN_OR_RETURN(lw->gate_shexp, b.take(blk(il, "ffn_gate_shexp.weight"), {d, fs}));
    MOESH_ASSIGN_OR_RETURN(lw->up_shexp, b.take(blk(il, "ffn_up_shexp.weight"), {d, fs}));
    MOESH_ASSIGN_OR_RETURN(lw->down_shexp, b.take(blk(il, "ffn_down_shexp.weight"), {fs, d}));
    if (hp.shexp_gated) {
      MOESH_ASSIGN_OR_RETURN(lw->shexp_gate, b.take(blk(il, "ffn_gate_inp_shexp.weight"), {d}));
    }
  }
  for (const TensorView* t : {&lw->router_b, &lw->exp_probs_b, &lw->shexp_gate}) MOESH_RETURN_IF_ERROR(require_f32(*t));
  return Status::ok();
}

Status bind_nextn_block(TensorBinder& b, const HParams& hp, int il, NextnWeights* nw) {
  const int64_t d = hp.n_embd;
  MOESH_RETURN_IF_ERROR(hp.arch->bind_layer(b, hp, il, &nw->block));
  MOESH_ASSIGN_OR_RETURN(nw->eh_proj, b.take(blk(il, "nextn.eh_proj.weight"), {2 * d, d}));
  MOESH_ASSIGN_OR_RETURN(nw->enorm, b.take(blk(il, "nextn.enorm.weight"), {d}));
  MOESH_ASSIGN_OR_RETURN(nw->hnorm, b.take(blk(il, "nextn.hnorm.weight"), {d}));
  MOESH_ASSIGN_OR_RETURN(nw->head_norm, b.take(blk(il, "nextn.shared_head_norm.weight"), {d}));
  MOESH_ASSIGN_OR_RETURN(nw->head, b.take(blk(il, "nextn.shared_head_head.weight"), {d, hp.n_vocab}, false));
  MOESH_ASSIGN_OR_RETURN(nw->embed, b.take(blk(il, "nextn.embed_tokens.weight"), {d, hp.n_vocab}, false));
  for (const TensorView* t : {&nw->enorm, &nw->hnorm, &nw->head_norm, &nw->block.attn_norm, &nw->block.ffn_norm,
                              &nw->block.q_norm, &nw->block.k_norm}) {
    MOESH_RETURN_IF_ERROR(require_f32(*t));
  }
  return Status::ok();
}

}  // namespace detail

Model::~Model() = default;

gguf::FileLoad choose_file_load(LoadOptions::Memory m, uint64_t file_bytes) {
  switch (m) {
    case LoadOptions::Memory::kMap:
      return gguf::FileLoad::kMap;
    case LoadOptions::Memory::kMemory:
      return gguf::FileLoad::kMemory;
    case LoadOptions::Memory::kAuto:
      break;
  }
  const uint64_t avail = system_memory().available_bytes;
  return avail > 0 && file_bytes <= avail / 2 ? gguf::FileLoad::kMemory : gguf::FileLoad::kMap;
}

Result<std::unique_ptr<Model>> Model::load(const std::string& path, const LoadOptions& opts) {
  struct stat st {};
  const uint64_t bytes = ::stat(path.c_str(), &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
  auto f = gguf::File::open(path, choose_file_load(opts.memory, bytes));
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
  // A span slice (`moesh slice --layers`) holds some blocks only, for a span peer; no
  // embedding or output head.
  blocks_ = {0, static_cast<int>(hp.n_layer) - 1};
  auto kind = file_->get_or<std::string>("moesh.slice.kind", "");
  const bool span_slice = kind.is_ok() && *kind == "span";
  if (span_slice) {
    auto sp = file_->get<std::vector<int32_t>>("moesh.slice.span");
    if (!sp) return sp.status().with_context("span slice");
    if (sp->size() != 2 || (*sp)[0] < 0 || (*sp)[1] < (*sp)[0] || (*sp)[1] >= hp.n_layer) {
      return make_error(StatusCode::kCorrupt, "moesh.slice.span is not two blocks FIRST <= LAST within 0-{}",
                        hp.n_layer - 1);
    }
    blocks_ = {(*sp)[0], (*sp)[1]};
  }
  MOESH_ASSIGN_OR_RETURN(tok_embd, b.take("token_embd.weight", {hp.n_embd, hp.n_vocab}, !span_slice));
  MOESH_ASSIGN_OR_RETURN(output_norm, b.take("output_norm.weight", {hp.n_embd}));
  MOESH_ASSIGN_OR_RETURN(output, b.take("output.weight", {hp.n_embd, hp.n_vocab}, false));
  if (!output.valid()) output = tok_embd;  // tied embeddings (or none: a span slice)
  if (hp.attn_res_block > 0) {
    MOESH_ASSIGN_OR_RETURN(output_res_score, b.take("output_res_score.weight", {hp.n_embd}, !span_slice));
    MOESH_RETURN_IF_ERROR(detail::require_f32(output_res_score));
  }
  if (output_norm.type != GgmlType::F32) {
    return make_error(StatusCode::kUnsupported, "tensor 'output_norm.weight' must be F32");
  }
  if (hp.arch->bind_globals != nullptr) MOESH_RETURN_IF_ERROR(hp.arch->bind_globals(b, &hp_));
  layers.resize(static_cast<size_t>(hp.n_layer));
  for (int il = blocks_.first; il <= blocks_.last; ++il) {
    LayerWeights* lw = &layers[static_cast<size_t>(il)];
    Status st = hp.arch->bind_layer(b, hp, il, lw);
    MOESH_RETURN_IF_ERROR(st);
    // Norm weights are read as plain floats.
    for (const TensorView* t :
         {&lw->attn_norm, &lw->ffn_norm, &lw->q_norm, &lw->k_norm, &lw->q_a_norm, &lw->kv_a_norm}) {
      if (t->valid() && t->type != GgmlType::F32) {
        return make_error(StatusCode::kUnsupported, "tensor '{}' must be F32", t->name);
      }
    }
  }
  // The NextN/MTP blocks, when the architecture runs them as a draft head: a block that does
  // not bind only takes the draft head away (nextn_status says why), never the model.
  if (hp.n_nextn > 0 && hp.arch->bind_nextn != nullptr && !span_slice) {
    for (int k = 0; k < hp.n_nextn; ++k) {
      const int il = static_cast<int>(hp.n_layer) + k;
      NextnWeights nw;
      Status st = hp.arch->bind_nextn(b, hp, il, &nw);
      if (!st.is_ok()) {
        nextn.clear();
        nextn_status = st.with_context(fmt::format("NextN block blk.{}", il));
        break;
      }
      if (!nw.head.valid()) nw.head = output;
      if (!nw.embed.valid()) nw.embed = tok_embd;
      nextn.push_back(nw);
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
