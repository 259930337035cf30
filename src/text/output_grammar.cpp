// OutputGrammar / OutputMatcher: see include/moesh/text/output_grammar.h.
#include "moesh/text/output_grammar.h"

#include <algorithm>
#include <utility>

namespace moesh {

int32_t OutputGrammar::add(Piece p) {
  pieces_.push_back(std::move(p));
  return static_cast<int32_t>(pieces_.size() - 1);
}

int32_t OutputGrammar::literal(std::string text) {
  Piece p;
  p.kind = Kind::kLiteral;
  p.text = std::move(text);
  return add(std::move(p));
}

int32_t OutputGrammar::until(std::string marker) {
  Piece p;
  p.kind = Kind::kUntil;
  p.text = std::move(marker);
  return add(std::move(p));
}

int32_t OutputGrammar::space(int max_bytes) {
  Piece p;
  p.kind = Kind::kSpace;
  p.max_bytes = max_bytes;
  return add(std::move(p));
}

int32_t OutputGrammar::json(std::shared_ptr<const JsonGrammar> g, std::string forbid) {
  Piece p;
  p.kind = Kind::kJson;
  p.json = std::move(g);
  p.text = std::move(forbid);
  return add(std::move(p));
}

void OutputGrammar::link(int32_t from, int32_t to) {
  pieces_[static_cast<size_t>(from)].next.push_back(to);
}

void OutputGrammar::start_at(int32_t piece) {
  starts_.push_back(piece);
}

namespace {

bool is_space(unsigned char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

// The longest prefix of `marker` that ends the text marker[0, k) + c (KMP's failure step, done
// naively: markers are a few dozen bytes).
int32_t advance_marker(const std::string& marker, int32_t k, unsigned char c) {
  if (static_cast<unsigned char>(marker[static_cast<size_t>(k)]) == c) return k + 1;
  std::string s = marker.substr(0, static_cast<size_t>(k));
  s.push_back(static_cast<char>(c));
  for (size_t j = std::min(s.size(), marker.size()); j > 0; --j) {
    if (s.compare(s.size() - j, j, marker, 0, j) == 0) return static_cast<int32_t>(j);
  }
  return 0;
}

}  // namespace

OutputMatcher::OutputMatcher(std::shared_ptr<const OutputGrammar> g) : g_(std::move(g)) {
  std::vector<int32_t> entered;
  for (int32_t s : g_->starts()) enter(s, &threads_, &entered);
}

// A thread at the beginning of `piece`. Pieces that may match nothing (a space run, an empty
// literal) are also left at once, so their successors start here too.
void OutputMatcher::enter(int32_t piece, std::vector<Thread>* out, std::vector<int32_t>* entered) const {
  if (std::find(entered->begin(), entered->end(), piece) != entered->end()) return;
  entered->push_back(piece);
  if (piece == OutputGrammar::kEnd) {
    out->push_back(Thread{});
    return;
  }
  const OutputGrammar::Piece& p = g_->pieces()[static_cast<size_t>(piece)];
  Thread t;
  t.piece = piece;
  if (p.kind == OutputGrammar::Kind::kJson) t.json = std::make_shared<JsonMatcher>(p.json);
  const bool empty_ok =
      p.kind == OutputGrammar::Kind::kSpace || (p.kind == OutputGrammar::Kind::kLiteral && p.text.empty());
  if (!(p.kind == OutputGrammar::Kind::kLiteral && p.text.empty())) out->push_back(std::move(t));
  if (empty_ok) {
    for (int32_t n : p.next) enter(n, out, entered);
  }
}

void OutputMatcher::leave(const Thread& t, std::vector<Thread>* out, std::vector<int32_t>* entered) const {
  for (int32_t n : g_->pieces()[static_cast<size_t>(t.piece)].next) enter(n, out, entered);
}

bool OutputMatcher::feed(unsigned char c) {
  std::vector<Thread> out;
  out.reserve(threads_.size() + 2);
  std::vector<int32_t> entered;  // pieces (re)started after this byte: each once
  auto keep = [&out](Thread t) {
    if (t.json == nullptr) {
      for (const Thread& o : out) {
        if (o.json == nullptr && o.piece == t.piece && o.pos == t.pos) return;
      }
    }
    out.push_back(std::move(t));
  };
  // Threads move out: a JSON matcher no copy shares is fed in place (a token's bytes after its
  // first copy), one still shared with a copy of this matcher is copied first.
  std::vector<Thread> cur = std::move(threads_);
  threads_.clear();
  for (Thread& t : cur) {
    if (t.piece == OutputGrammar::kEnd) continue;  // nothing may follow the end
    const OutputGrammar::Piece& p = g_->pieces()[static_cast<size_t>(t.piece)];
    switch (p.kind) {
      case OutputGrammar::Kind::kLiteral:
      case OutputGrammar::Kind::kUntil: {
        // A literal must take its next byte; free text takes any, tracking the marker's progress.
        const bool literal = p.kind == OutputGrammar::Kind::kLiteral;
        if (literal && static_cast<unsigned char>(p.text[static_cast<size_t>(t.pos)]) != c) break;
        Thread n = t;
        n.pos = literal ? t.pos + 1 : advance_marker(p.text, t.pos, c);
        if (static_cast<size_t>(n.pos) == p.text.size()) {
          leave(n, &out, &entered);
        } else {
          keep(std::move(n));
        }
        break;
      }
      case OutputGrammar::Kind::kSpace: {
        if (!is_space(c) || t.pos >= p.max_bytes) break;
        Thread n = t;
        ++n.pos;
        leave(n, &out, &entered);
        keep(std::move(n));
        break;
      }
      case OutputGrammar::Kind::kJson: {
        int32_t forbidden = 0;
        if (!p.text.empty()) {
          forbidden = advance_marker(p.text, t.pos, c);
          if (static_cast<size_t>(forbidden) == p.text.size()) break;
        }
        if (t.json.use_count() != 1) t.json = std::make_shared<JsonMatcher>(*t.json);
        if (!t.json->feed(c)) break;
        Thread n = std::move(t);
        n.pos = forbidden;
        if (n.json->complete()) leave(n, &out, &entered);
        keep(std::move(n));
        break;
      }
    }
  }
  threads_ = std::move(out);
  return !threads_.empty();  // refused: the matcher is spent
}

bool OutputMatcher::feed(std::string_view bytes) {
  for (unsigned char c : bytes) {
    if (!feed(c)) return false;
  }
  return true;
}

bool OutputMatcher::complete() const {
  for (const Thread& t : threads_) {
    if (t.piece == OutputGrammar::kEnd) return true;
  }
  return false;
}

}  // namespace moesh
