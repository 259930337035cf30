// SentencePiece-style (llama `llama` vocabularies) encoding of one run of plain text.
//
// The caller has already escaped spaces to U+2581 and added the prefix space. Characters start as
// symbols; the adjacent pair whose concatenation is the highest-scoring token merges first (the
// leftmost on ties). Characters that never became a token are emitted as <0xXX> byte tokens.
#include <queue>
#include <string>
#include <vector>

#include "text/tokenizer_internal.h"

namespace moesh {
namespace {

struct Symbol {
  int prev, next;
  size_t off, len;
};

struct Bigram {
  int left, right;
  float score;
  size_t len;
};

struct BigramOrder {
  bool operator()(const Bigram& a, const Bigram& b) const {
    return a.score < b.score || (a.score == b.score && a.left > b.left);
  }
};

}  // namespace

void Tokenizer::Impl::spm_encode(std::string_view text, std::vector<int32_t>& out) const {
  std::vector<Symbol> syms;
  for (size_t off = 0; off < text.size();) {
    // Invalid UTF-8 is not rejected here: a lead byte's implied length is taken as is, and the
    // byte fallback below reproduces the raw bytes exactly.
    const size_t n = std::min(text.size() - off, tok::utf8_len_from_lead(static_cast<uint8_t>(text[off])));
    const int i = static_cast<int>(syms.size());
    syms.push_back({i - 1, i + 1, off, n});
    off += n;
  }
  if (syms.empty()) return;
  syms.back().next = -1;

  std::priority_queue<Bigram, std::vector<Bigram>, BigramOrder> queue;
  auto try_add = [&](int l, int r) {
    if (l < 0 || r < 0) return;
    const int32_t id = find(text.substr(syms[l].off, syms[l].len + syms[r].len));
    if (id < 0) return;
    queue.push({l, r, scores[id], syms[l].len + syms[r].len});
  };
  merge_symbols(syms, queue, try_add);
  for (int i = 0; i >= 0; i = syms[i].next) {
    std::string_view s = text.substr(syms[i].off, syms[i].len);
    if (int32_t id = find(s); id >= 0) {
      out.push_back(id);
      continue;
    }
    // Only single characters can lack a token (a merge needs the merged text in the vocab).
    for (char c : s) {
      const int32_t id = byte_token[static_cast<uint8_t>(c)];
      if (id >= 0)
        out.push_back(id);
      else if (unk >= 0)
        out.push_back(unk);
    }
  }
}

}  // namespace moesh
