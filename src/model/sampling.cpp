// Sampler (see include/moesh/sampling.h).
#include "moesh/sampling.h"

#include <algorithm>
#include <cmath>

namespace moesh {

int32_t argmax(const float* x, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i) {
    if (x[i] > x[best]) best = i;
  }
  return static_cast<int32_t>(best);
}

Sampler::Sampler(const SamplingParams& p) : p_(p), rng_(p.seed) {}

int32_t Sampler::sample(const float* logits, int64_t n_vocab) {
  if (p_.temp <= 0.0f || n_vocab <= 1) return argmax(logits, n_vocab);

  cand_.resize(static_cast<size_t>(n_vocab));
  for (int64_t i = 0; i < n_vocab; ++i) cand_[i] = {static_cast<int32_t>(i), logits[i]};
  // Descending by logit, ties by id, so the candidate order is reproducible.
  auto before = [](const Cand& a, const Cand& b) {
    return a.logit != b.logit ? a.logit > b.logit : a.id < b.id;
  };
  size_t n = cand_.size();
  if (p_.top_k > 0 && static_cast<size_t>(p_.top_k) < n) {
    std::partial_sort(cand_.begin(), cand_.begin() + p_.top_k, cand_.end(), before);
    n = static_cast<size_t>(p_.top_k);
  } else {
    std::sort(cand_.begin(), cand_.end(), before);
  }
  // top-p over the softmax of the remaining candidates (temperature is applied after).
  if (p_.top_p < 1.0f) {
    const float mx = cand_[0].logit;
    float sum = 0.0f;
    for (size_t i = 0; i < n; ++i) sum += std::exp(cand_[i].logit - mx);
    float cum = 0.0f;
    for (size_t i = 0; i < n; ++i) {
      cum += std::exp(cand_[i].logit - mx) / sum;
      if (cum >= p_.top_p) {
        n = i + 1;
        break;
      }
    }
  }
  // Temperature, then a draw in candidate order with the probabilities summed in double.
  prob_.resize(n);
  const float mx = cand_[0].logit / p_.temp;
  double sum = 0.0;
  for (size_t i = 0; i < n; ++i) {
    prob_[i] = std::exp(cand_[i].logit / p_.temp - mx);
    sum += prob_[i];
  }
  const double u = std::uniform_real_distribution<double>(0.0, 1.0)(rng_) * sum;
  double cum = 0.0;
  for (size_t i = 0; i < n; ++i) {
    cum += prob_[i];
    if (cum >= u) return cand_[i].id;
  }
  return cand_[n - 1].id;
}

}  // namespace moesh
