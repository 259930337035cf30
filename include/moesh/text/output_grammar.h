// Output shapes beyond one JSON value, for constrained decoding: a chat template family's
// tool-call syntax (literal markers around JSON), with alternatives (one per tool), repetition
// (parallel calls) and free text up to a marker (reasoning before the call).
//
// What it is for: `tool_choice: "required"` or a named function must give a call, not prose. The
// server builds an OutputGrammar for the template's call syntax (serve/tool_grammar) and masks
// every token that cannot continue it, as it does for response_format's JSON.
//
// An OutputGrammar is a small graph of pieces; OutputMatcher runs it as a set of threads (an NFA),
// so alternatives that begin alike (every tool's call starts `<tool_call>\n{"name": "`) are
// followed side by side until their bytes differ. Each JSON piece runs a JsonMatcher of its own.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "moesh/text/json_grammar.h"

namespace moesh {

class OutputGrammar {
 public:
  static constexpr int32_t kEnd = -1;  // as a successor: the output may end here
  // Pieces; each returns its index. A piece is left for any of its successors (link()).
  int32_t literal(std::string text);  // exactly these bytes
  int32_t until(std::string marker);  // any text, up to and including the first `marker`
  int32_t space(int max_bytes = 4);   // 0..max_bytes of ' ', '\t', '\n', '\r'
  // A JSON value; `forbid`: bytes it may not contain anywhere (a family's end-of-call marker
  // inside an argument string would end the call early for the parser).
  int32_t json(std::shared_ptr<const JsonGrammar> g, std::string forbid = "");
  void link(int32_t from, int32_t to);  // to = kEnd allowed
  void start_at(int32_t piece);         // an output may begin with this piece (several allowed)

  enum class Kind : uint8_t { kLiteral, kUntil, kSpace, kJson };
  struct Piece {
    Kind kind = Kind::kLiteral;
    std::string text;  // literal bytes / until marker / JSON: forbidden substring
    int max_bytes = 0;
    std::shared_ptr<const JsonGrammar> json;
    std::vector<int32_t> next;
  };
  const std::vector<Piece>& pieces() const { return pieces_; }
  const std::vector<int32_t>& starts() const { return starts_; }

 private:
  int32_t add(Piece p);
  std::vector<Piece> pieces_;
  std::vector<int32_t> starts_;
};

// Incremental byte matcher over an OutputGrammar (same contract as JsonMatcher: copyable, feed()
// all or nothing, complete() when the output may end).
class OutputMatcher {
 public:
  explicit OutputMatcher(std::shared_ptr<const OutputGrammar> g);
  bool feed(unsigned char c);
  bool feed(std::string_view bytes);
  bool complete() const;

 private:
  struct Thread {
    int32_t piece = OutputGrammar::kEnd;
    int32_t pos = 0;                    // literal / until / JSON's forbidden text: bytes matched; space: bytes taken
    std::shared_ptr<JsonMatcher> json;  // shared until this thread's copy changes (copy on write)
  };
  void enter(int32_t piece, std::vector<Thread>* out, std::vector<int32_t>* entered) const;
  void leave(const Thread& t, std::vector<Thread>* out, std::vector<int32_t>* entered) const;
  std::shared_ptr<const OutputGrammar> g_;
  std::vector<Thread> threads_;
};

}  // namespace moesh
