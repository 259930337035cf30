// Token sampling from one row of logits (docs/run.md lists the options). Stop strings are text:
// moesh/text/stop_matcher.h.
//
// Order of the chain (llama.cpp's default order for the samplers we expose):
//   penalties (repetition, presence, frequency over the last `penalty_last_n` tokens)
//   -> greedy when temp <= 0
//   -> top-k -> top-p -> min-p -> temperature -> seeded draw.
//
// Greedy picks the first maximum (lowest id on exact ties) of the penalised logits. The draw uses
// std::mt19937_64 seeded with `seed`, so a run is reproducible for a given seed and logits: the
// same request gives the same tokens whether it runs alone or batched with others.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "moesh/util/status.h"

namespace moesh {

struct SamplingParams {
  float temp = 0.0f;   // <= 0: greedy
  int top_k = 0;       // <= 0: off
  float top_p = 1.0f;  // >= 1: off
  float min_p = 0.0f;  // <= 0: off; keeps tokens with p >= min_p * p_max
  // Penalties over the last penalty_last_n tokens of the history (prompt + generated); 0: off,
  // -1: the whole history. repeat_penalty (llama.cpp/CTRL style): a seen token's logit is divided
  // by it when positive, multiplied when negative; 1 = off. presence: -= presence_penalty once per
  // seen token; frequency: -= frequency_penalty * count (OpenAI semantics).
  float repeat_penalty = 1.0f;
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  int penalty_last_n = 64;
  uint64_t seed = 0;

  // kInvalidArgument naming the field when a value is out of its range (temp < 0, top_p outside
  // (0, 1], min_p outside [0, 1], repeat_penalty <= 0, penalties outside [-2, 2],
  // penalty_last_n < -1).
  Status validate() const;
};

class Sampler {
 public:
  explicit Sampler(const SamplingParams& p);
  // Picks a token id from logits[0..n_vocab). `history` is the sequence so far (prompt then
  // generated tokens, oldest first) for the penalties; the logits themselves are not modified.
  int32_t sample(const float* logits, int64_t n_vocab, std::span<const int32_t> history = {});

  const SamplingParams& params() const { return p_; }

 private:
  struct Cand {
    int32_t id;
    float logit;
  };
  SamplingParams p_;
  std::mt19937_64 rng_;
  std::vector<Cand> cand_;  // reused across calls
  std::vector<double> prob_;
  std::vector<float> pen_;  // penalised copy of the logits (only when a penalty is on)
};

// Index of the first maximum.
int32_t argmax(const float* x, int64_t n);

}  // namespace moesh
