// Token sampling from one row of logits (sampling-and-tokenizers.md §4, the subset `moesh run`
// exposes): top-k -> top-p -> temperature -> seeded draw; greedy when temp <= 0.
//
// Greedy picks the first maximum (lowest id on exact ties). The draw uses std::mt19937_64 seeded
// with `seed`, so a run is reproducible for a given seed and logits.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

namespace moesh {

struct SamplingParams {
  float temp = 0.0f;   // <= 0: greedy
  int top_k = 0;       // <= 0: off
  float top_p = 1.0f;  // >= 1: off
  uint64_t seed = 0;
};

class Sampler {
 public:
  explicit Sampler(const SamplingParams& p);
  // Picks a token id from logits[0..n_vocab).
  int32_t sample(const float* logits, int64_t n_vocab);

 private:
  struct Cand {
    int32_t id;
    float logit;
  };
  SamplingParams p_;
  std::mt19937_64 rng_;
  std::vector<Cand> cand_;  // reused across calls
  std::vector<double> prob_;
};

// Index of the first maximum.
int32_t argmax(const float* x, int64_t n);

}  // namespace moesh
