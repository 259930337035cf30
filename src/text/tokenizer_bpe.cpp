// Byte-level BPE encoding of one run of plain text (llama.cpp `gpt2` vocabularies).
#include <queue>
#include <string>
#include <vector>

#include "text/tokenizer_internal.h"

namespace moesh {
namespace {

struct Symbol {
  int prev, next;
  size_t off, len;  // byte range in the byte-unicode string of the piece
};

struct Bigram {
  int left, right;
  int32_t rank;
  size_t len;  // left.len + right.len when queued; a different sum means the entry is stale
};

// Lowest rank first; among equal ranks the leftmost pair.
struct BigramOrder {
  bool operator()(const Bigram& a, const Bigram& b) const {
    return a.rank > b.rank || (a.rank == b.rank && a.left > b.left);
  }
};

}  // namespace

Status Tokenizer::Impl::bpe_encode(std::string_view text, std::vector<int32_t>& out) const {
  // Like llama.cpp, invalid UTF-8 becomes U+FFFD before the regexes see it.
  std::string clean;
  if (!utf8_is_valid(text)) {
    clean = utf8_sanitize(text);
    text = clean;
  }
  std::vector<std::string_view> pieces;
  MOESH_RETURN_IF_ERROR(splitter->split(text, pieces));

  std::string word, key;
  std::vector<Symbol> syms;
  for (std::string_view piece : pieces) {
    word.clear();
    syms.clear();
    for (char c : piece) {
      const std::string& u = tok::byte_to_unicode(static_cast<uint8_t>(c));
      const int i = static_cast<int>(syms.size());
      syms.push_back({i - 1, i + 1, word.size(), u.size()});
      word += u;
    }
    if (syms.empty()) continue;
    syms.back().next = -1;
    if (ignore_merges) {
      if (int32_t id = find(word); id >= 0) {
        out.push_back(id);
        continue;
      }
    }
    std::priority_queue<Bigram, std::vector<Bigram>, BigramOrder> queue;
    auto try_add = [&](int l, int r) {
      if (l < 0 || r < 0) return;
      key.assign(word, syms[l].off, syms[l].len);
      key.push_back(' ');
      key.append(word, syms[r].off, syms[r].len);
      auto it = merge_rank.find(key);
      if (it == merge_rank.end()) return;
      queue.push({l, r, it->second, syms[l].len + syms[r].len});
    };
    merge_symbols(syms, queue, try_add);
    for (int i = 0; i >= 0; i = syms[i].next) {
      std::string_view s(word.data() + syms[i].off, syms[i].len);
      if (int32_t id = find(s); id >= 0) {
        out.push_back(id);
        continue;
      }
      // A symbol without a token: fall back to single-character tokens, as llama.cpp does.
      size_t j = 0;
      while (j < s.size()) {
        const size_t n = std::min(s.size() - j, tok::utf8_len_from_lead(static_cast<uint8_t>(s[j])));
        if (int32_t id = find(s.substr(j, n)); id >= 0)
          out.push_back(id);
        else if (unk >= 0)
          out.push_back(unk);
        j += n;
      }
    }
  }
  return Status::ok();
}

}  // namespace moesh
