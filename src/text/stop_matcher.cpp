// StopMatcher (see include/moesh/text/stop_matcher.h).
//
// The result must not depend on how the text was split into chunks. Two rules give that:
//  - text is released only when no suffix of it can still grow into a stop string, so a match is
//    always found whole inside the held-back part;
//  - the match that wins is the one that *ends* first (ties: the longest, i.e. the one that starts
//    first), which is what a byte-by-byte stream would see first. "Starts first" would differ:
//    with stops "abcd" and "bc", byte-by-byte streaming completes "bc" before "abcd" exists.
#include "moesh/text/stop_matcher.h"

#include <algorithm>

#include "moesh/text/tokenizer.h"

namespace moesh {

StopMatcher::StopMatcher(std::vector<std::string> stops) {
  for (auto& s : stops) {
    if (!s.empty()) stops_.push_back(std::move(s));  // an empty stop would match everywhere
  }
}

std::string StopMatcher::push(std::string_view chunk) {
  if (stopped_) return {};
  held_ += chunk;
  // The earliest end position at which some stop string completes.
  for (size_t end = 1; end <= held_.size(); ++end) {
    const std::string* best = nullptr;
    for (const auto& s : stops_) {
      if (s.size() > end || held_.compare(end - s.size(), s.size(), s) != 0) continue;
      if (!best || s.size() > best->size()) best = &s;
    }
    if (best) {
      std::string out = held_.substr(0, end - best->size());
      stopped_ = true;
      matched_ = *best;
      held_.clear();
      return out;
    }
  }
  // Hold back the longest suffix that is a proper prefix of a stop string.
  size_t hold = 0;
  for (const auto& s : stops_) {
    const size_t max_k = std::min(s.size() - 1, held_.size());
    for (size_t k = max_k; k > hold; --k) {
      if (held_.compare(held_.size() - k, k, s, 0, k) == 0) {
        hold = k;
        break;
      }
    }
  }
  // Released text ends on a character boundary; the unfinished character waits with the rest.
  const size_t release = utf8_complete_prefix(std::string_view(held_).substr(0, held_.size() - hold));
  std::string out = held_.substr(0, release);
  held_.erase(0, release);
  return out;
}

std::string StopMatcher::flush() {
  if (stopped_) return {};
  std::string out;
  out.swap(held_);
  return out;
}

}  // namespace moesh
