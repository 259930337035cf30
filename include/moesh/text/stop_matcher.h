// Stop strings in streamed text (OpenAI `stop`, `moesh run --stop`). Text, not sampling: it works
// on the decoded bytes a tokenizer's StreamDecoder produces.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace moesh {

// Finds stop strings in streamed text without ever emitting a part of a stop string.
//
// push() takes the next chunk of generated text and returns what may be shown now: text that can
// no longer be the start of a stop string. When a stop string completes, the text before it is
// returned, stopped() becomes true and everything after is dropped. flush() releases what was
// held back (at the end of generation without a stop). Matching is on bytes, so a stop string
// split across tokens or across UTF-8 characters is still found; held-back text always ends on a
// UTF-8 character boundary when released.
class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops);
  std::string push(std::string_view chunk);
  std::string flush();
  bool stopped() const { return stopped_; }
  // The stop string that matched ("" before a match).
  const std::string& matched() const { return matched_; }

 private:
  std::vector<std::string> stops_;
  std::string held_;
  bool stopped_ = false;
  std::string matched_;
};

}  // namespace moesh
