// One DISPATCH computed on the held slabs. The expert math is expert_ffn (the one definition of a
// routed expert) and the PARTIAL sum uses the local executor's operation order, so EXACT/F32
// results are the local bits and PARTIAL/F32 the local routed sum of this worker's ranks.
#include <fmt/format.h>

#include <chrono>
#include <cmath>

#include "moesh/tensor/quant.h"
#include "swarm/worker_internal.h"

namespace moesh::swarm::detail {

namespace {

ComputeOutcome fail(wire::WireError code, std::string text) {
  ComputeOutcome o;
  o.error = code;
  o.text = std::move(text);
  return o;
}

}  // namespace

std::vector<uint8_t> layer_activation_dtypes(const ExpertStore& store) {
  std::vector<uint8_t> act(store.shape().n_layer, wire::kNoActDType);
  for (const wire::ExpertRange& r : store.held().ranges) {
    if (r.layer >= act.size() || act[r.layer] != wire::kNoActDType) continue;
    const ExpertStore::Slot slot = store.find(r.layer, r.first);
    if (slot.weights == nullptr) continue;
    const GgmlType vdt = quant::vec_dot_type(slot.weights->gate.type);
    // gate and up share the input rows: one dtype can only be exact for both if they agree.
    if (vdt != quant::vec_dot_type(slot.weights->up.type)) continue;
    if (vdt == GgmlType::Q8_0)
      act[r.layer] = static_cast<uint8_t>(wire::WireDType::kQ8);
    else if (vdt == GgmlType::Q8_K)
      act[r.layer] = static_cast<uint8_t>(wire::WireDType::kQ8K);
  }
  return act;
}

bool quantized_from_wire(const wire::WireRows& hidden, GgmlType vdt, QuantizedRows* out) {
  const bool q8 = hidden.dtype == wire::WireDType::kQ8 && vdt == GgmlType::Q8_0;
  const bool q8k = hidden.dtype == wire::WireDType::kQ8K && vdt == GgmlType::Q8_K;
  // A padded tail block would hold values the weights have no column for; the model's n_embd
  // is a whole number of blocks for every type it can be quantized to, so this is a guard.
  if ((!q8 && !q8k) || hidden.n_cols % type_block_size(vdt) != 0) return false;
  out->type = vdt;
  out->n_cols = hidden.n_cols;
  out->n_rows = hidden.n_rows;
  out->row_bytes = type_row_bytes(vdt, hidden.n_cols);
  out->data.resize(out->row_bytes * hidden.n_rows);
  if (q8) {
    // block_q8_0 is the Q8 block byte for byte.
    std::copy(hidden.bytes.begin(), hidden.bytes.end(), out->data.begin());
    return true;
  }
  const size_t wire_row = wire::wire_row_bytes(hidden.dtype, hidden.n_cols);
  for (uint32_t r = 0; r < hidden.n_rows; ++r) {
    wire::q8k_row_to_blocks(hidden.bytes.data() + wire_row * r, hidden.n_cols, out->data.data() + out->row_bytes * r);
  }
  return true;
}

namespace {

// Checks one request against the store: kOk, or the failed outcome naming the problem.
bool validate(const ExpertStore& store, const wire::DispatchMsg& req, ComputeOutcome* bad) {
  if (req.n_embd() != store.shape().n_embd) {
    *bad = fail(wire::WireError::kModelMismatch,
                fmt::format("DISPATCH n_embd {} but the model has n_embd {}", req.n_embd(), store.shape().n_embd));
    return false;
  }
  if (!store.shape().is_moe(req.layer)) {
    *bad = fail(wire::WireError::kNotHeld, fmt::format("layer {} has no routed experts", req.layer));
    return false;
  }
  // A request naming any unheld expert computes nothing.
  for (const wire::ExpertPair& p : req.pairs) {
    if (store.find(req.layer, p.expert).weights == nullptr) {
      *bad = fail(wire::WireError::kNotHeld, fmt::format("layer {} expert {} is not held by this worker (it holds {})",
                                                         req.layer, p.expert, store.held().to_string()));
      return false;
    }
  }
  return true;
}

// Computes every pair of `req` (already validated) into s->y, in pair order.
void compute_pairs(const ExpertStore& store, const wire::DispatchMsg& req, ComputeScratch* s, ThreadPool* pool) {
  const uint32_t n_tok = req.n_tokens();
  const uint32_t n_embd = req.n_embd();
  const size_t n_pairs = req.pairs.size();
  std::vector<ExpertStore::Slot> slots(n_pairs);
  for (size_t p = 0; p < n_pairs; ++p) slots[p] = store.find(req.layer, req.pairs[p].expert);

  s->x.resize(size_t{n_tok} * n_embd);
  wire::decode_rows(req.hidden, s->x.data());
  for (auto& [type, q] : s->xq) q.n_rows = -1;  // mark stale
  // Each token's row is quantized once per activation type a slab needs — or taken as it came
  // when the wire already carries that format (then it is the backbone's own quantization).
  auto quantized = [&](GgmlType vdt) -> const QuantizedRows& {
    QuantizedRows& q = s->xq[vdt];
    if (q.n_rows != static_cast<int64_t>(n_tok) && !quantized_from_wire(req.hidden, vdt, &q)) {
      quantize_rows(vdt, s->x.data(), n_tok, n_embd, &q, pool);
    }
    return q;
  };

  // token of each pair
  std::vector<uint32_t> tok_of_pair(n_pairs);
  {
    size_t p = 0;
    for (uint32_t t = 0; t < n_tok; ++t) {
      for (uint8_t j = 0; j < req.pair_counts[t]; ++j) tok_of_pair[p++] = t;
    }
  }
  // The pairs of each held slab range (normally one per layer) go through run_expert_groups —
  // the LocalExecutor's schedule: three pool jobs for all experts instead of three per expert.
  // Groups are the distinct experts in order of first appearance, tokens ascending in each.
  s->y.resize(n_pairs * n_embd);
  std::vector<bool> done(n_pairs, false);
  for (size_t first = 0; first < n_pairs; ++first) {
    if (done[first]) continue;
    const ExpertWeights* w = slots[first].weights;
    s->refs.clear();
    s->offsets.assign(1, 0);
    s->tok_of_pos.clear();
    s->pair_of_pos.clear();
    for (size_t p = first; p < n_pairs; ++p) {
      if (done[p] || slots[p].weights != w) continue;
      s->refs.push_back(ExpertRef{w, slots[p].index});
      for (size_t q = p; q < n_pairs; ++q) {
        if (!done[q] && slots[q].weights == w && slots[q].index == slots[p].index) {
          done[q] = true;
          s->tok_of_pos.push_back(static_cast<int32_t>(tok_of_pair[q]));
          s->pair_of_pos.push_back(static_cast<int32_t>(q));
        }
      }
      s->offsets.push_back(static_cast<int32_t>(s->tok_of_pos.size()));
    }
    const QuantizedRows& xq = quantized(quant::vec_dot_type(w->gate.type));
    const QuantizedRows& xq_up = quantized(quant::vec_dot_type(w->up.type));
    const size_t n_pos = s->tok_of_pos.size();
    s->y_grouped.resize(n_pos * n_embd);
    run_expert_groups(s->refs, s->offsets.data(), s->tok_of_pos.data(), xq, xq_up, s->y_grouped.data(), &s->groups,
                      pool);
    for (size_t j = 0; j < n_pos; ++j) {
      std::copy_n(s->y_grouped.data() + j * n_embd, n_embd, s->y.data() + size_t(s->pair_of_pos[j]) * n_embd);
    }
  }
}

// The COMBINE of `req` from its expert outputs `y` ([n_pairs][n_embd], pair order).
ComputeOutcome finish(const wire::DispatchMsg& req, const float* y, uint32_t compute_us, ComputeScratch* s) {
  const uint32_t n_tok = req.n_tokens();
  const uint32_t n_embd = req.n_embd();
  const size_t n_pairs = req.pairs.size();
  for (size_t i = 0; i < n_pairs * n_embd; ++i) {
    if (!std::isfinite(y[i])) {
      return fail(wire::WireError::kNonFinite,
                  fmt::format("layer {} expert {} produced a non-finite value at column {}", req.layer,
                              req.pairs[i / n_embd].expert, i % n_embd));
    }
  }
  const float* rows_out = y;
  uint32_t n_rows = static_cast<uint32_t>(n_pairs);
  if (req.mode == wire::CombineMode::kPartial) {
    // The local executor's combine: o = y0*w0; o = o + y_r*w_r in rank order (pair order).
    s->partial.resize(size_t{n_tok} * n_embd);
    size_t p = 0;
    for (uint32_t t = 0; t < n_tok; ++t) {
      float* o = s->partial.data() + size_t{t} * n_embd;
      for (uint8_t j = 0; j < req.pair_counts[t]; ++j, ++p) {
        rank_sum_step(o, y + p * n_embd, req.pairs[p].weight, n_embd, j == 0);
      }
      for (uint32_t d = 0; d < n_embd; ++d) {
        if (!std::isfinite(o[d])) {
          return fail(wire::WireError::kNonFinite,
                      fmt::format("layer {}: weighted sum of token {} is non-finite at column {}", req.layer, t, d));
        }
      }
    }
    rows_out = s->partial.data();
    n_rows = n_tok;
  }
  auto enc = wire::encode_rows(req.return_dtype, rows_out, n_rows, n_embd);
  if (!enc) {
    return fail(wire::status_code_to_wire_error(enc.status().code()),
                fmt::format("cannot encode results as {}: {}", wire::wire_dtype_name(req.return_dtype),
                            enc.status().message()));
  }
  ComputeOutcome out;
  out.ok = true;
  out.combine.request_id = req.request_id;
  out.combine.layer = req.layer;
  out.combine.n_tokens = n_tok;
  out.combine.mode = req.mode;
  out.combine.rows = std::move(*enc);
  out.combine.compute_us = compute_us;
  return out;
}

uint32_t micros_since(std::chrono::steady_clock::time_point t0) {
  const auto us = std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t0).count();
  return static_cast<uint32_t>(std::min<int64_t>(us, UINT32_MAX));
}

}  // namespace

bool can_batch(const wire::DispatchMsg& a, const wire::DispatchMsg& b) {
  return a.layer == b.layer && a.hidden.dtype == b.hidden.dtype && a.hidden.n_cols == b.hidden.n_cols;
}

ComputeOutcome compute_dispatch(const ExpertStore& store, const wire::DispatchMsg& req, ComputeScratch* s,
                                ThreadPool* pool) {
  const auto t0 = std::chrono::steady_clock::now();
  ComputeOutcome bad;
  if (!validate(store, req, &bad)) return bad;
  compute_pairs(store, req, s, pool);
  return finish(req, s->y.data(), micros_since(t0), s);
}

std::vector<ComputeOutcome> compute_batch(const ExpertStore& store, const std::vector<const wire::DispatchMsg*>& reqs,
                                          ComputeScratch* s, ThreadPool* pool) {
  std::vector<ComputeOutcome> out(reqs.size());
  if (reqs.size() == 1) {
    out[0] = compute_dispatch(store, *reqs[0], s, pool);
    return out;
  }
  const auto t0 = std::chrono::steady_clock::now();
  // The valid requests, stacked: tokens of the first, then of the second, ...; their pairs in
  // the same order. Rows are computed independently of what else is in the batch (the kernels'
  // contract), so each request's slice of the outputs is the bits it would get alone.
  wire::DispatchMsg merged;
  std::vector<size_t> valid, first_pair;
  for (size_t i = 0; i < reqs.size(); ++i) {
    const wire::DispatchMsg& r = *reqs[i];
    if (!validate(store, r, &out[i])) continue;
    if (!valid.empty() && !can_batch(*reqs[valid[0]], r)) {
      out[i] = fail(wire::WireError::kInternal, "request batched with a different layer or hidden format");
      continue;
    }
    if (valid.empty()) {
      merged.layer = r.layer;
      merged.hidden.dtype = r.hidden.dtype;
      merged.hidden.n_cols = r.hidden.n_cols;
    }
    valid.push_back(i);
    first_pair.push_back(merged.pairs.size());
    merged.pair_counts.insert(merged.pair_counts.end(), r.pair_counts.begin(), r.pair_counts.end());
    merged.pairs.insert(merged.pairs.end(), r.pairs.begin(), r.pairs.end());
    merged.hidden.n_rows += r.hidden.n_rows;
    merged.hidden.bytes.insert(merged.hidden.bytes.end(), r.hidden.bytes.begin(), r.hidden.bytes.end());
  }
  if (valid.empty()) return out;
  compute_pairs(store, merged, s, pool);
  const uint32_t total_us = micros_since(t0);
  const size_t n_embd = merged.n_embd();
  // Each request is charged its share of the compute time, by pairs.
  const double per_pair = merged.pairs.empty() ? 0.0 : double(total_us) / double(merged.pairs.size());
  std::vector<float> y;  // finish() reuses s->partial, so each slice is read from here
  y.swap(s->y);
  for (size_t k = 0; k < valid.size(); ++k) {
    const wire::DispatchMsg& r = *reqs[valid[k]];
    const uint32_t us = static_cast<uint32_t>(per_pair * double(r.pairs.size()));
    out[valid[k]] = finish(r, y.data() + first_pair[k] * n_embd, us, s);
  }
  y.swap(s->y);
  return out;
}

}  // namespace moesh::swarm::detail
