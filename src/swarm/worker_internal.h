// The worker's per-DISPATCH computation, separate from its networking so tests can call it
// in-process and compare with expert_ffn / the local executor.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "moesh/moe/executor.h"
#include "moesh/moe/expert_stages.h"
#include "moesh/swarm/swarm.h"
#include "moesh/tensor/threadpool.h"
#include "moesh/wire/wire.h"

namespace moesh::swarm::detail {

// Reusable buffers of one compute thread (grown on demand).
struct ComputeScratch {
  std::vector<float> x;                  // decoded hidden rows [n_tokens][n_embd]
  std::map<GgmlType, QuantizedRows> xq;  // x quantized per gate vec_dot_type
  std::vector<float> y;                  // expert outputs in pair order [n_pairs][n_embd]
  std::vector<float> y_tmp;              // one expert's outputs, token order
  std::vector<float> partial;            // [n_tokens][n_embd]
  std::vector<float> y_grouped;          // outputs in group order [n_pairs][n_embd]
  std::vector<ExpertRef> refs;           // distinct experts of one slab range
  std::vector<int32_t> offsets, tok_of_pos, pair_of_pos;
  ExpertGroupScratch groups;
};

// The outcome of one DISPATCH: a COMBINE, or an ERROR code and text naming the problem.
struct ComputeOutcome {
  bool ok = false;
  wire::CombineMsg combine;
  wire::WireError error = wire::WireError::kInternal;
  std::string text;
};

// Validates the request against the store (layer/experts held, n_embd), computes every pair with
// expert_ffn (x quantized once per token per activation type) and builds the COMBINE: EXACT =
// raw f32 y per pair in pair order; PARTIAL = per token w0*y0, then + w_r*y_r in pair (= rank)
// order, exactly as LocalExecutor sums. Hidden rows already in a slab's activation format are
// used as they are (quantized_from_wire). Output rows are encoded in req.return_dtype.
// The HELLO activation table (wire::Hello::layer_act) of a store: per layer, kQ8 when the held
// gate and up slabs take Q8_0 activations, kQ8K when both take Q8_K, else wire::kNoActDType
// (also for unheld layers).
std::vector<uint8_t> layer_activation_dtypes(const ExpertStore& store);

// x quantized to `vdt` straight from the DISPATCH's wire blocks when they already are that
// format (Q8 for Q8_0, Q8K for Q8_K): the bits the sender's quantizer produced, no
// dequantize/re-quantize round. False when the wire dtype is not `vdt`'s format.
bool quantized_from_wire(const wire::WireRows& hidden, GgmlType vdt, QuantizedRows* out);

ComputeOutcome compute_dispatch(const ExpertStore& store, const wire::DispatchMsg& req, ComputeScratch* s,
                                ThreadPool* pool);

// Whether two requests can be computed as one: same layer and hidden-row format (the rows are
// stacked as they came off the wire).
bool can_batch(const wire::DispatchMsg& a, const wire::DispatchMsg& b);

// Several requests computed together (federation: backbones asking for the same layer's experts at
// the same time): their tokens stacked into one pass, so each expert's weights are read once for
// all of them. Outcome i is what compute_dispatch(reqs[i]) returns, bit for bit (a row's result
// does not depend on the rows beside it); an invalid request fails alone. Every request must
// can_batch() with the first valid one. compute_us is each request's share of the time, by pairs.
std::vector<ComputeOutcome> compute_batch(const ExpertStore& store, const std::vector<const wire::DispatchMsg*>& reqs,
                                          ComputeScratch* s, ThreadPool* pool);

}  // namespace moesh::swarm::detail
