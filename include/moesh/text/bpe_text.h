// Byte-level BPE text pieces shared by the tokenizer and the BPE trainer of make-model: UTF-8
// walking, GPT-2's byte <-> unicode alphabet, and the pre-tokenizer regex splitter (the
// fragments merges never cross).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "moesh/text/tokenizer.h"
#include "moesh/util/status.h"

namespace moesh::tok {

// ---- UTF-8 (tokenizer_utf8.cpp) ----
// Decodes one code point at s[i]; on success advances i and returns true. On an invalid or
// truncated sequence returns false and leaves i unchanged.
bool utf8_next(std::string_view s, size_t& i, uint32_t& cp);
void utf8_append(uint32_t cp, std::string& out);
// Byte length implied by a lead byte (1 for ASCII and for bytes that cannot lead a sequence).
size_t utf8_len_from_lead(uint8_t b);

// GPT-2 byte <-> unicode mapping: printable bytes stand for themselves, the others are shifted to
// U+0100.. so every byte has a visible, non-space character.
const std::string& byte_to_unicode(uint8_t b);
// -1 when `cp` is not the image of a byte.
int unicode_to_byte(uint32_t cp);

// ---- pre-tokenizer (tokenizer_pretok.cpp) ----
// The regex list of one family, compiled once. Splitting follows llama.cpp: the regexes apply in
// order, each one re-splitting every current fragment into its matches and the unmatched gaps.
class RegexSplitter {
 public:
  static Result<std::unique_ptr<RegexSplitter>> create(PreTokenizer family);
  ~RegexSplitter();
  RegexSplitter(const RegexSplitter&) = delete;
  RegexSplitter& operator=(const RegexSplitter&) = delete;
  // `text` must be valid UTF-8. Pieces are views into `text` and cover it exactly, in order.
  Status split(std::string_view text, std::vector<std::string_view>& pieces) const;
  size_t n_regexes() const { return codes_.size(); }

 private:
  RegexSplitter() = default;
  std::vector<void*> codes_;  // pcre2_code_8*, kept opaque so this header needs no pcre2.h
};

}  // namespace moesh::tok
