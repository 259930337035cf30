// run_expert_groups: stages A-C of the expert FFN for many experts in three pool jobs (see
// src/moe/expert_stages.h). Shared by LocalExecutor and the worker, so both schedule the same way
// and give expert_ffn()'s bits.
#include <algorithm>
#include <numeric>

#include "moesh/moe/expert_stages.h"
#include "moesh/tensor/kernels.h"
#include "moesh/tensor/quant.h"

namespace moesh {

namespace {

// Splits each active expert's `n_rows` output rows into chunks so that all threads get work.
int64_t chunks_per_expert(int64_t n_rows, int64_t n_active, int n_threads) {
  const int64_t want = (4 * static_cast<int64_t>(n_threads) + n_active - 1) / n_active;
  return std::clamp<int64_t>(want, 1, std::max<int64_t>(1, n_rows / 16));
}

}  // namespace

void run_expert_groups(std::span<const ExpertRef> refs, const int32_t* offsets, const int32_t* tok_of_pos,
                       const QuantizedRows& xq, const QuantizedRows& xq_up, float* y, ExpertGroupScratch* s,
                       ThreadPool* pool) {
  const int64_t n_active = static_cast<int64_t>(refs.size());
  if (n_active == 0) return;
  const ExpertWeights& w0 = *refs[0].w;
  const int64_t n_embd = w0.n_embd();
  const int64_t n_ff = w0.n_ff();
  const int64_t n_pos = offsets[n_active];
  const int n_threads = pool != nullptr ? pool->n_threads() : 1;
  if (static_cast<int64_t>(s->iota.size()) < n_pos) {
    s->iota.resize(static_cast<size_t>(n_pos));
    std::iota(s->iota.begin(), s->iota.end(), 0);
  }
  const size_t gsz = static_cast<size_t>(n_pos * n_ff);
  if (s->g.size() < gsz) {
    s->g.resize(gsz);
    s->u.resize(gsz);
    s->h.resize(gsz);
  }
  float* g = s->g.data();
  float* u = s->u.data();
  float* h = s->h.data();

  // A. gate and up: items = (active expert, chunk of n_ff rows)
  const int64_t ca = chunks_per_expert(n_ff, n_active, n_threads);
  const int64_t rows_a = (n_ff + ca - 1) / ca;
  run_items(pool, n_active * ca, [&](int64_t item) {
    const int64_t a = item / ca;
    const int64_t r0 = (item % ca) * rows_a;
    const int64_t r1 = std::min(n_ff, r0 + rows_a);
    if (r0 >= r1) return;
    const ExpertWeights& w = *refs[a].w;
    const int64_t e = refs[a].index;
    const int64_t p0 = offsets[a], n_sel = offsets[a + 1] - p0;
    matmul_q_rows(weight_rows(w.gate.expert(e), r0, r1), xq, tok_of_pos + p0, n_sel, g + p0 * n_ff + r0,
                  static_cast<size_t>(n_ff), nullptr);
    matmul_q_rows(weight_rows(w.up.expert(e), r0, r1), xq_up, tok_of_pos + p0, n_sel, u + p0 * n_ff + r0,
                  static_cast<size_t>(n_ff), nullptr);
    if (w.has_biases()) {
      add_expert_bias(w.gate_b, e, r0, r1, g + p0 * n_ff, n_ff, n_sel);
      add_expert_bias(w.up_b, e, r0, r1, u + p0 * n_ff, n_ff, n_sel);
    }
  });
  // B. activation, then each h row quantized for down, in the same pool job (one position's row
  // is a few microseconds of work: a separate quantize pass would cost a pool round trip more).
  const GgmlType down_vdt = quant::vec_dot_type(w0.down.type);
  const FromFloatFn down_from_float = kernels()[down_vdt].from_float;
  QuantizedRows& hq = s->hq;
  hq.type = down_vdt;
  hq.n_cols = n_ff;
  hq.n_rows = n_pos;
  hq.row_bytes = type_row_bytes(down_vdt, n_ff);
  hq.data.resize(hq.row_bytes * static_cast<size_t>(n_pos));
  run_items(pool, n_pos, [&](int64_t p) {
    float* hp = h + p * n_ff;
    expert_activation(w0.act, g + p * n_ff, u + p * n_ff, hp, n_ff, w0.swiglu_limit, w0.situ_beta, w0.situ_linear_beta);
    down_from_float(hp, hq.data.data() + static_cast<size_t>(p) * hq.row_bytes, n_ff);
  });
  // C. down: items = (active expert, chunk of n_embd rows)
  const int64_t cc = chunks_per_expert(n_embd, n_active, n_threads);
  const int64_t rows_c = (n_embd + cc - 1) / cc;
  run_items(pool, n_active * cc, [&](int64_t item) {
    const int64_t a = item / cc;
    const int64_t r0 = (item % cc) * rows_c;
    const int64_t r1 = std::min(n_embd, r0 + rows_c);
    if (r0 >= r1) return;
    const ExpertWeights& w = *refs[a].w;
    const int64_t e = refs[a].index;
    const int64_t p0 = offsets[a], n_sel = offsets[a + 1] - p0;
    matmul_q_rows(weight_rows(w.down.expert(e), r0, r1), hq, s->iota.data() + p0, n_sel, y + p0 * n_embd + r0,
                  static_cast<size_t>(n_embd), nullptr);
    if (w.has_biases()) add_expert_bias(w.down_b, e, r0, r1, y + p0 * n_embd, n_embd, n_sel);
  });
}

}  // namespace moesh
