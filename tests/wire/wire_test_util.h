// Shared builders for wire/net tests: messages whose payload encodes who made them (request id,
// layer, token, expert), so a misrouted or mixed-up row breaks an invariant the test checks.
#pragma once

#include <xxhash.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "moesh/wire/wire.h"

namespace moesh::wire::testing {

// Hidden value of (request, token, column): distinct per request and token, mixed signs and
// magnitudes so every dtype has real work to do.
inline float tagged_value(uint64_t request_id, uint32_t token, uint32_t col) {
  const float base = static_cast<float>(request_id % 97) + 0.25f * static_cast<float>(token % 13);
  const float wobble = static_cast<float>((col * 2654435761u) % 1000) / 1000.0f - 0.5f;
  return (col % 2 ? -1.f : 1.f) * (base + wobble);
}

// A DISPATCH with n_tokens tokens, each with k distinct experts (< n_expert) in increasing rank,
// ranks drawn from 0..(k+2) so gaps appear (other ranks live on other workers).
inline DispatchMsg make_dispatch(uint64_t request_id, uint32_t layer, uint32_t n_tokens, uint32_t n_embd, uint32_t k,
                                 WireDType dtype, CombineMode mode, WireDType rdtype, uint32_t n_expert = 64,
                                 uint64_t seed = 7) {
  std::mt19937_64 rng(seed ^ request_id);
  DispatchMsg m;
  m.request_id = request_id;
  m.layer = layer;
  m.deadline_ms = 250;
  m.mode = mode;
  m.return_dtype = rdtype;
  std::vector<float> x(size_t{n_tokens} * n_embd);
  for (uint32_t t = 0; t < n_tokens; ++t)
    for (uint32_t c = 0; c < n_embd; ++c) x[size_t{t} * n_embd + c] = tagged_value(request_id, t, c);
  m.hidden = encode_rows(dtype, x.data(), n_tokens, n_embd).value();
  std::vector<uint16_t> experts(n_expert);
  std::iota(experts.begin(), experts.end(), uint16_t{0});
  for (uint32_t t = 0; t < n_tokens; ++t) {
    std::shuffle(experts.begin(), experts.end(), rng);
    std::vector<uint8_t> ranks(k + 2);
    std::iota(ranks.begin(), ranks.end(), uint8_t{0});
    std::shuffle(ranks.begin(), ranks.end(), rng);
    ranks.resize(k);
    std::sort(ranks.begin(), ranks.end());
    m.pair_counts.push_back(static_cast<uint8_t>(k));
    for (uint32_t i = 0; i < k; ++i)
      m.pairs.push_back({experts[i], ranks[i], std::uniform_real_distribution<float>(0.01f, 1.f)(rng)});
  }
  return m;
}

// A COMBINE answering `req`, each row tagged with (request, layer, row index).
inline CombineMsg make_combine_for(const DispatchMsg& req) {
  CombineMsg c;
  c.request_id = req.request_id;
  c.layer = req.layer;
  c.n_tokens = req.n_tokens();
  c.mode = req.mode;
  c.compute_us = 1234;
  const uint32_t n_rows = req.n_result_rows();
  std::vector<float> y(size_t{n_rows} * req.n_embd());
  for (uint32_t r = 0; r < n_rows; ++r)
    for (uint32_t col = 0; col < req.n_embd(); ++col)
      y[size_t{r} * req.n_embd() + col] = tagged_value(req.request_id * 31 + req.layer, r, col);
  c.rows = encode_rows(req.return_dtype, y.data(), n_rows, req.n_embd()).value();
  return c;
}

// A SLAB for (layer, expert) with three small tensors of different block geometry: gate Q8_0
// [64 x 3], up Q4_K [256 x 2], down F32 [5 x 2]. Bytes are a pattern of (request, tensor, index),
// hashes are right.
inline SlabMsg make_slab(uint64_t request_id, uint32_t layer, uint32_t expert) {
  SlabMsg m;
  m.request_id = request_id;
  m.layer = layer;
  m.expert = expert;
  const GgmlType types[3] = {GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::F32};
  const uint64_t ne0[3] = {64, 256, 5}, ne1[3] = {3, 2, 2};
  for (int t = 0; t < 3; ++t) {
    SlabTensor& s = m.tensors[t];
    s.type = types[t];
    s.ne0 = ne0[t];
    s.ne1 = ne1[t];
    s.bytes.resize(type_row_bytes(s.type, static_cast<int64_t>(s.ne0)) * s.ne1);
    for (size_t i = 0; i < s.bytes.size(); ++i)
      s.bytes[i] = static_cast<uint8_t>((request_id * 131 + expert * 17 + t * 59 + i * 7) & 0xff);
    s.hash = XXH3_64bits(s.bytes.data(), s.bytes.size());
  }
  return m;
}

}  // namespace moesh::wire::testing
