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

#include "moesh/text/bpe_text.h"
#include "moesh/text/tokenizer.h"
#include "moesh/util/status.h"

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
