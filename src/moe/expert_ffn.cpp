// The routed expert FFN, one expert at a time: the reference definition whose bits the grouped
// schedule (expert_groups.cpp, used by LocalExecutor and workers) reproduces; ExpertWeights
// validation. The routing plan is built in routing_plan.cpp.
#include <algorithm>
#include <cmath>

#include "moesh/moe/executor.h"
#include "moesh/moe/expert_stages.h"
#include "moesh/tensor/quant.h"

namespace moesh {

Status ExpertWeights::validate() const {
  if (!valid()) return make_error(StatusCode::kInvalidArgument, "expert tensors missing");
  const TensorView* ts[3] = {&gate, &up, &down};
  for (const TensorView* t : ts) {
    if (t->n_dims != 3) {
      return make_error(StatusCode::kCorrupt, "tensor '{}' has {} dims, expected 3", t->name, t->n_dims);
    }
    if (!quant::type_is_supported(t->type)) {
      return make_error(StatusCode::kUnsupported, "tensor '{}' has unsupported type {}", t->name, type_name(t->type));
    }
  }
  const int64_t e = gate.ne[2], d = gate.ne[0], f = gate.ne[1];
  if (up.ne[0] != d || up.ne[1] != f || up.ne[2] != e || down.ne[0] != f || down.ne[1] != d || down.ne[2] != e) {
    return make_error(StatusCode::kCorrupt, "expert tensors '{}' [{},{},{}], '{}' [{},{},{}], '{}' [{},{},{}] disagree",
                      gate.name, gate.ne[0], gate.ne[1], gate.ne[2], up.name, up.ne[0], up.ne[1], up.ne[2], down.name,
                      down.ne[0], down.ne[1], down.ne[2]);
  }
  if (gate_b.valid() || up_b.valid() || down_b.valid()) {
    const TensorView* bs[3] = {&gate_b, &up_b, &down_b};
    const int64_t want[3] = {f, f, d};
    for (int i = 0; i < 3; ++i) {
      const TensorView* b = bs[i];
      if (!b->valid())
        return make_error(StatusCode::kCorrupt, "expert biases incomplete (one of gate/up/down missing)");
      if (b->type != GgmlType::F32 || b->ne[0] != want[i] || b->ne[1] != e || b->ne[2] != 1) {
        return make_error(StatusCode::kCorrupt, "expert bias '{}' must be F32 [{}, {}], is {} [{}, {}, {}]", b->name,
                          want[i], e, type_name(b->type), b->ne[0], b->ne[1], b->ne[2]);
      }
    }
  }
  return Status::ok();
}

const char* expert_activation_name(ExpertActivation a) {
  switch (a) {
    case ExpertActivation::kSilu:
      return "silu";
    case ExpertActivation::kSwigluOai:
      return "swiglu-oai";
    case ExpertActivation::kSitu:
      return "situ";
    default:
      return "?";
  }
}

bool ExpertFfn::has_swiglu_limits() const {
  return std::any_of(swiglu_limit.begin(), swiglu_limit.end(), [](float l) { return l > 0.0f; });
}

std::string ExpertFfn::describe() const {
  std::string s = expert_activation_name(act);
  if (act == ExpertActivation::kSitu) s += fmt::format(" (beta {}, linear beta {})", situ_beta, situ_linear_beta);
  if (biases) s += "+bias";
  if (input_scaled) s += ", weight on input";
  if (has_swiglu_limits()) s += ", clamped per layer";
  return s;
}

TensorView weight_rows(const TensorView& w, int64_t r0, int64_t r1) {
  TensorView v = w;
  v.ne[1] = r1 - r0;
  v.data = w.data + static_cast<size_t>(r0) * w.nb[1];
  v.nb[2] = v.nb[1] * static_cast<size_t>(v.ne[1]);
  v.nb[3] = v.nb[2];
  return v;
}

void add_expert_bias(const TensorView& b, int64_t e, int64_t r0, int64_t r1, float* y, int64_t ld, int64_t n_rows) {
  const float* be = reinterpret_cast<const float*>(b.data + static_cast<size_t>(e) * b.nb[1]);
  for (int64_t j = 0; j < n_rows; ++j) {
    float* yj = y + j * ld;
    for (int64_t r = r0; r < r1; ++r) yj[r] = yj[r] + be[r];
  }
}

void expert_activation(ExpertActivation act, const float* g, const float* u, float* h, int64_t n, float limit,
                       float situ_beta, float situ_linear_beta) {
  switch (act) {
    case ExpertActivation::kSilu:
      if (limit > 0.0f) {
        swiglu_limited(g, u, h, n, limit);
      } else {
        swiglu(g, u, h, n);
      }
      break;
    case ExpertActivation::kSwigluOai:
      swiglu_oai(g, u, h, n);
      break;
    case ExpertActivation::kSitu:
      situ(g, u, h, n, situ_beta, situ_linear_beta);
      break;
    default:
      break;
  }
}

void expert_ffn(const ExpertWeights& w, int64_t e, const QuantizedRows& xq, const float* x_f32, const int32_t* rows,
                int64_t n_sel, float* y, size_t ldy, ExpertScratch* s, ThreadPool* pool) {
  if (n_sel <= 0) return;
  const int64_t n_ff = w.n_ff();
  const int64_t n_embd = w.n_embd();
  const size_t n = static_cast<size_t>(n_sel * n_ff);
  if (s->g.size() < n) {
    s->g.resize(n);
    s->u.resize(n);
    s->h.resize(n);
  }
  const TensorView gate = w.gate.expert(e), up = w.up.expert(e), down = w.down.expert(e);

  matmul_q_rows(gate, xq, rows, n_sel, s->g.data(), static_cast<size_t>(n_ff), pool);
  if (quant::vec_dot_type(up.type) == xq.type) {
    matmul_q_rows(up, xq, rows, n_sel, s->u.data(), static_cast<size_t>(n_ff), pool);
  } else {
    // `up` consumes another activation format: quantize the selected rows for it.
    std::vector<float>& gathered = s->h;
    if (gathered.size() < static_cast<size_t>(n_sel * n_embd)) gathered.resize(n_sel * n_embd);
    for (int64_t j = 0; j < n_sel; ++j) {
      std::copy_n(x_f32 + rows[j] * n_embd, n_embd, gathered.data() + j * n_embd);
    }
    quantize_rows(quant::vec_dot_type(up.type), gathered.data(), n_sel, n_embd, &s->xq_up, pool);
    matmul_q(up, s->xq_up, s->u.data(), static_cast<size_t>(n_ff), pool);
  }
  if (w.has_biases()) {  // separate adds after each matmul (ggml_add_id), as llama.cpp
    add_expert_bias(w.gate_b, e, 0, n_ff, s->g.data(), n_ff, n_sel);
    add_expert_bias(w.up_b, e, 0, n_ff, s->u.data(), n_ff, n_sel);
  }
  for (int64_t j = 0; j < n_sel; ++j) {
    expert_activation(w.act, s->g.data() + j * n_ff, s->u.data() + j * n_ff, s->h.data() + j * n_ff, n_ff,
                      w.swiglu_limit, w.situ_beta, w.situ_linear_beta);
  }
  quantize_rows(quant::vec_dot_type(down.type), s->h.data(), n_sel, n_ff, &s->hq, pool);
  matmul_q(down, s->hq, y, ldy, pool);
  if (w.has_biases()) add_expert_bias(w.down_b, e, 0, n_embd, y, static_cast<int64_t>(ldy), n_sel);
}

}  // namespace moesh
