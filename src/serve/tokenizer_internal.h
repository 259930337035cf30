// Internals shared by the tokenizer translation units (tokenizer*.cpp); not a public API.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <queue>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "moesh/status.h"
#include "moesh/tokenizer.h"

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

namespace moesh {

struct Tokenizer::Impl {
  VocabKind kind = VocabKind::kNone;
  PreTokenizer pre = PreTokenizer::kDefault;
  std::vector<std::string> text;
  std::vector<float> scores;
  std::vector<TokenType> types;
  std::unordered_map<std::string, int32_t> text_to_id;
  // BPE: merge "left right" -> rank. Byte-level symbols never contain a raw space, so the
  // joined string identifies the pair.
  std::unordered_map<std::string, int32_t> merge_rank;
  int32_t bos = -1, eos = -1, eot = -1, eom = -1, unk = -1, pad = -1;
  bool add_bos = false, add_eos = false;
  bool add_space_prefix = false;  // SPM
  bool ignore_merges = false;     // BPE llama3 family: a piece that is a token is emitted whole
  // Tokens matched literally before pre-tokenization, longest text first.
  std::vector<int32_t> special_by_length;
  std::vector<uint8_t> eog;
  std::array<int32_t, 256> byte_token{};  // SPM <0xXX> ids, -1 when missing
  std::unique_ptr<tok::RegexSplitter> splitter;

  int32_t find(std::string_view s) const {
    auto it = text_to_id.find(std::string(s));
    return it == text_to_id.end() ? -1 : it->second;
  }
  // Encoders for one run of plain text (no special tokens inside). Append to `out`.
  Status bpe_encode(std::string_view text, std::vector<int32_t>& out) const;
  void spm_encode(std::string_view text, std::vector<int32_t>& out) const;
  std::string piece(int32_t id, bool special) const;
};

// The merge loop shared by BPE (lowest merge rank first) and SPM (highest score first): symbols
// form a doubly linked list over a contiguous string; the best queued bigram whose two symbols
// are unchanged (len check) is merged, then its new neighbours are offered via try_add(l, r).
// Symbol needs prev/next/len; Bigram needs left/right/len; Order ranks bigrams.
template <typename Symbol, typename Bigram, typename Order, typename TryAdd>
void merge_symbols(std::vector<Symbol>& syms, std::priority_queue<Bigram, std::vector<Bigram>, Order>& queue,
                   TryAdd&& try_add) {
  for (int i = 0; i + 1 < static_cast<int>(syms.size()); ++i) try_add(i, i + 1);
  while (!queue.empty()) {
    const Bigram b = queue.top();
    queue.pop();
    Symbol& l = syms[b.left];
    Symbol& r = syms[b.right];
    if (l.len == 0 || r.len == 0 || l.len + r.len != b.len) continue;  // stale entry
    // The left symbol absorbs the right one; symbols are contiguous, so only lengths change.
    l.len += r.len;
    r.len = 0;
    l.next = r.next;
    if (r.next >= 0) syms[r.next].prev = b.left;
    try_add(l.prev, b.left);
    try_add(b.left, l.next);
  }
}

}  // namespace moesh
