// JSON Schema -> a byte-level matcher, and the token mask it allows (constrained decoding for
// response_format json_object / json_schema in `moesh serve`).
//
// What it is for: a model may only write tokens that keep its output a prefix of some JSON text
// matching the schema, and may only end (EOS) where the text is complete. So the output always
// parses and matches — whatever the weights, sampler or seed — unless max_tokens cuts it short.
//
// The schema subset (everything else is refused with the keyword's path, never ignored):
//  * type: object, array, string, number, integer, boolean, null, or a list of those;
//  * object: properties (written in the schema's order; a property not in `required` may be
//    left out), required, additionalProperties (false/true/a schema; without properties and with
//    additionalProperties absent, true or a schema: any keys); no other keys are written;
//  * array: items, minItems, maxItems; string: minLength, maxLength (code points);
//  * integer / number: minimum, maximum (digits that cannot reach the range are refused; a
//    number's final value is checked where it ends);
//  * enum, const (any JSON values, matched as their compact serialisation);
//  * anyOf / oneOf whose branches begin differently (e.g. string | null, object | array);
//  * $ref to #/$defs/NAME or #/definitions/NAME (recursion allowed);
//  * annotations that do not constrain: title, description, default, examples, $schema, $id,
//    $comment, strict, deprecated, readOnly, writeOnly.
// Values nest at most kMaxNesting deep.
// Whitespace between structural characters follows llama.cpp's json-schema `space` rule: none,
// one space, or one or two newlines followed by at most kMaxIndent spaces or tabs (pretty
// printing is fine, an endless or ragged run is not). Numbers have at most 18 integer and 18 fraction
// digits and two exponent digits (every value fits a double), so every generation under a
// bounded schema ends.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "moesh/text/tokenizer.h"
#include "moesh/util/status.h"

namespace moesh {

inline constexpr int kMaxIndent = 20;
// Objects and arrays nest at most this deep in a constrained output (a schema that allows any
// value could otherwise be driven into an ever deeper, ever costlier stack).
inline constexpr int kMaxNesting = 64;

struct JsonGrammar;  // compiled schema, immutable, shared by every matcher of it

// kUnsupported / kInvalidArgument naming the schema path ("schema.properties.age.pattern").
Result<std::shared_ptr<const JsonGrammar>> compile_json_schema(const nlohmann::ordered_json& schema);
// Any JSON object ({"type":"json_object"}).
std::shared_ptr<const JsonGrammar> json_object_grammar();

// Incremental byte matcher. Copyable (a small stack of frames): the mask feeds copies. After
// feed() refuses a byte the matcher is spent (discard it; keep the copy it came from).
class JsonMatcher {
 public:
  explicit JsonMatcher(std::shared_ptr<const JsonGrammar> g);
  bool feed(unsigned char c);
  bool feed(std::string_view bytes);  // all or nothing
  bool complete() const;              // a whole value matching the schema has been written

  struct Frame {
    uint8_t kind = 0;
    uint8_t phase = 0;
    int32_t node = 0;
    int32_t count = 0;  // string code points, array items, literal bytes matched, number digits
    int32_t aux = 0;    // object: next property; string: UTF-8 bytes pending / escape hex left
    uint64_t mask = 0;  // literal / key candidates still alive; object: properties written
    int64_t value = 0;  // integer part so far (bounds)
  };

 private:
  bool step(unsigned char c);
  bool push_value(int32_t node, unsigned char c);  // starts a value with its first byte
  bool close_value();                              // the top frame's value ended: pop, tell the parent
  bool take_ws(unsigned char c);                   // whitespace between tokens of an object/array
  std::shared_ptr<const JsonGrammar> g_;
  std::vector<Frame> stack_;
  int ws_run_ = 0;   // newlines, then indentation characters, of the current gap
  int ws_mode_ = 0;  // 0 none yet, 1 one space, 2 newlines, 3 indentation
  bool done_ = false;
};

// The tokens a matcher allows next, over one tokenizer's token bytes (built once per tokenizer).
class JsonTokenMask {
 public:
  // control_text: control tokens are allowed as their text (gpt-oss harmony's markers are control
  // tokens the model writes); otherwise they are never allowed as text.
  explicit JsonTokenMask(const Tokenizer& tok, bool control_text = false);
  // allowed[t] = 1 for each token whose bytes the matcher accepts; end-of-generation tokens when
  // the matcher is complete. Returns how many are allowed. Matcher: JsonMatcher or OutputMatcher
  // (copyable, feed(byte), feed(bytes), complete()).
  template <class Matcher>
  int64_t fill(const Matcher& m, std::vector<uint8_t>& allowed) const;
  const std::string& bytes(int32_t token) const { return pieces_[static_cast<size_t>(token)]; }
  bool is_eog(int32_t token) const { return eog_[static_cast<size_t>(token)] != 0; }

 private:
  std::vector<std::string> pieces_;  // "" for control tokens (never allowed as text)
  std::vector<uint8_t> eog_;
};

template <class Matcher>
int64_t JsonTokenMask::fill(const Matcher& m, std::vector<uint8_t>& allowed) const {
  const bool complete = m.complete();
  int64_t count = 0;
  // Most tokens fail on their first byte: decide the 256 first bytes once, copy the matcher
  // only for tokens whose first byte it takes.
  std::array<uint8_t, 256> first_ok{};
  for (int b = 0; b < 256; ++b) {
    Matcher c = m;
    first_ok[static_cast<size_t>(b)] = c.feed(static_cast<unsigned char>(b)) ? 1 : 0;
  }
  Matcher scratch = m;
  const size_t n = std::min(allowed.size(), pieces_.size());
  for (size_t t = 0; t < n; ++t) {
    uint8_t ok = 0;
    if (eog_[t] != 0) {
      ok = complete ? 1 : 0;
    } else if (!pieces_[t].empty() && first_ok[static_cast<unsigned char>(pieces_[t][0])] != 0) {
      scratch = m;
      ok = scratch.feed(pieces_[t]) ? 1 : 0;
    }
    allowed[t] = ok;
    count += ok;
  }
  return count;
}

}  // namespace moesh
