// UTF-8 helpers, the GPT-2 byte<->unicode table and the streaming decoder.
#include <array>
#include <string>

#include "text/tokenizer_internal.h"

namespace moesh::tok {
namespace {

bool is_cont(uint8_t b) {
  return (b & 0xC0) == 0x80;
}

// Valid range of the second byte after `lead` (excludes overlongs, surrogates, > U+10FFFF).
void second_byte_range(uint8_t lead, uint8_t& lo, uint8_t& hi) {
  lo = 0x80;
  hi = 0xBF;
  if (lead == 0xE0)
    lo = 0xA0;
  else if (lead == 0xED)
    hi = 0x9F;
  else if (lead == 0xF0)
    lo = 0x90;
  else if (lead == 0xF4)
    hi = 0x8F;
}

// Number of bytes at s[i..] that form a valid (possibly unfinished) prefix of one character;
// 0 when s[i] cannot start a character at all.
size_t valid_prefix_len(std::string_view s, size_t i) {
  const uint8_t lead = static_cast<uint8_t>(s[i]);
  const size_t need = utf8_len_from_lead(lead);
  if (lead < 0x80) return 1;
  if (lead < 0xC2 || lead > 0xF4) return 0;
  uint8_t lo, hi;
  second_byte_range(lead, lo, hi);
  size_t n = 1;
  while (n < need && i + n < s.size()) {
    const uint8_t b = static_cast<uint8_t>(s[i + n]);
    if (n == 1 ? (b < lo || b > hi) : !is_cont(b)) break;
    ++n;
  }
  return n;
}

}  // namespace

size_t utf8_len_from_lead(uint8_t b) {
  if (b < 0xC0) return 1;
  if (b < 0xE0) return 2;
  if (b < 0xF0) return 3;
  if (b < 0xF8) return 4;
  return 1;
}

bool utf8_next(std::string_view s, size_t& i, uint32_t& cp) {
  if (i >= s.size()) return false;
  const uint8_t lead = static_cast<uint8_t>(s[i]);
  if (lead < 0x80) {
    cp = lead;
    ++i;
    return true;
  }
  const size_t need = utf8_len_from_lead(lead);
  if (valid_prefix_len(s, i) != need || need == 1) return false;
  uint32_t c = lead & (0xFF >> (need + 1));
  for (size_t k = 1; k < need; ++k) c = (c << 6) | (static_cast<uint8_t>(s[i + k]) & 0x3F);
  cp = c;
  i += need;
  return true;
}

void utf8_append(uint32_t cp, std::string& out) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

namespace {

struct ByteTables {
  std::array<std::string, 256> to_unicode;
  std::array<int, 512> from_unicode;  // images are all < U+0200
  ByteTables() {
    from_unicode.fill(-1);
    int shifted = 0;
    for (int b = 0; b < 256; ++b) {
      // Printable Latin-1 bytes keep their code point; the rest (controls, space, DEL, NBSP,
      // soft hyphen) are moved past U+00FF in byte order.
      const bool keep = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      const uint32_t cp = keep ? static_cast<uint32_t>(b) : 256u + shifted++;
      utf8_append(cp, to_unicode[b]);
      from_unicode[cp] = b;
    }
  }
};

const ByteTables& byte_tables() {
  static const ByteTables t;
  return t;
}

}  // namespace

const std::string& byte_to_unicode(uint8_t b) {
  return byte_tables().to_unicode[b];
}

int unicode_to_byte(uint32_t cp) {
  return cp < 512 ? byte_tables().from_unicode[cp] : -1;
}

}  // namespace moesh::tok

namespace moesh {

size_t utf8_complete_prefix(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    uint32_t cp;
    size_t j = i;
    if (tok::utf8_next(s, j, cp)) {
      i = j;
      continue;
    }
    const size_t p = tok::valid_prefix_len(s, i);
    // An unfinished but still valid sequence running to the end: hold it back.
    if (p > 0 && i + p == s.size()) return i;
    i += p > 0 ? p : 1;  // invalid: it will never complete, so it is "complete" garbage
  }
  return s.size();
}

std::string utf8_sanitize(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    uint32_t cp;
    const size_t start = i;
    if (tok::utf8_next(s, i, cp)) {
      out.append(s.substr(start, i - start));
      continue;
    }
    // One U+FFFD per maximal invalid subpart (the Unicode-recommended substitution).
    const size_t p = tok::valid_prefix_len(s, i);
    i += p > 0 ? p : 1;
    out.append("\xEF\xBF\xBD");
  }
  return out;
}

bool utf8_is_valid(std::string_view s) {
  size_t i = 0;
  uint32_t cp;
  while (i < s.size()) {
    if (!tok::utf8_next(s, i, cp)) return false;
  }
  return true;
}

std::string StreamDecoder::push(int32_t id) {
  pending_ += tok_.token_to_piece(id, special_);
  const size_t n = utf8_complete_prefix(pending_);
  std::string out = utf8_sanitize(std::string_view(pending_).substr(0, n));
  pending_.erase(0, n);
  return out;
}

std::string StreamDecoder::flush() {
  std::string out = utf8_sanitize(pending_);
  pending_.clear();
  return out;
}

}  // namespace moesh
