// Sampler (see include/moesh/model/sampling.h).
#include "moesh/model/sampling.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <unordered_map>

namespace moesh {
namespace {

Status field_error(const char* field, const std::string& why) {
  return Status(StatusCode::kInvalidArgument, std::string("sampling: ") + field + " " + why);
}

}  // namespace

// Each check is written so that NaN fails it too (every comparison with NaN is false).
Status SamplingParams::validate() const {
  if (!(temp >= 0.0f) || std::isinf(temp)) return field_error("temp", "must be a finite value >= 0");
  if (!(top_p > 0.0f && top_p <= 1.0f)) return field_error("top_p", "must be in (0, 1]");
  if (!(min_p >= 0.0f && min_p <= 1.0f)) return field_error("min_p", "must be in [0, 1]");
  if (!(repeat_penalty > 0.0f) || std::isinf(repeat_penalty)) {
    return field_error("repeat_penalty", "must be a finite value > 0");
  }
  if (!(presence_penalty >= -2.0f && presence_penalty <= 2.0f)) {
    return field_error("presence_penalty", "must be in [-2, 2]");
  }
  if (!(frequency_penalty >= -2.0f && frequency_penalty <= 2.0f)) {
    return field_error("frequency_penalty", "must be in [-2, 2]");
  }
  if (penalty_last_n < -1) return field_error("penalty_last_n", "must be >= -1 (-1: whole history)");
  return Status::ok();
}

int32_t argmax(const float* x, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i) {
    if (x[i] > x[best]) best = i;
  }
  return static_cast<int32_t>(best);
}

Sampler::Sampler(const SamplingParams& p) : p_(p), rng_(p.seed) {}

int32_t Sampler::sample(const float* logits, int64_t n_vocab, std::span<const int32_t> history) {
  // Penalties (llama.cpp's penalties sampler): on a copy, so the caller's logits stay intact.
  const bool penalties_on = p_.repeat_penalty != 1.0f || p_.presence_penalty != 0.0f || p_.frequency_penalty != 0.0f;
  if (penalties_on && p_.penalty_last_n != 0 && !history.empty()) {
    size_t window = history.size();
    if (p_.penalty_last_n > 0) window = std::min(window, static_cast<size_t>(p_.penalty_last_n));
    std::unordered_map<int32_t, int> count;
    for (int32_t id : history.subspan(history.size() - window)) {
      if (id >= 0 && id < n_vocab) ++count[id];
    }
    pen_.assign(logits, logits + n_vocab);
    for (const auto& [id, c] : count) {
      float& l = pen_[static_cast<size_t>(id)];
      // Dividing a negative logit would raise it, so negative logits are multiplied instead.
      l = l <= 0.0f ? l * p_.repeat_penalty : l / p_.repeat_penalty;
      l -= static_cast<float>(c) * p_.frequency_penalty + p_.presence_penalty;
    }
    logits = pen_.data();
  }
  if (p_.temp <= 0.0f || n_vocab <= 1) return argmax(logits, n_vocab);

  cand_.resize(static_cast<size_t>(n_vocab));
  for (int64_t i = 0; i < n_vocab; ++i) cand_[i] = {static_cast<int32_t>(i), logits[i]};
  // Descending by logit, ties by id, so the candidate order is reproducible.
  auto before = [](const Cand& a, const Cand& b) { return a.logit != b.logit ? a.logit > b.logit : a.id < b.id; };
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
  // min-p: p_i >= min_p * p_max is logit_i >= max + ln(min_p); candidates are sorted, so the
  // survivors are a prefix, and the first (the maximum) always survives.
  if (p_.min_p > 0.0f) {
    const float min_logit = cand_[0].logit + std::log(p_.min_p);
    size_t keep = 1;
    while (keep < n && cand_[keep].logit >= min_logit) ++keep;
    n = keep;
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
