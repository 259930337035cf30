// Jinja lexer and parser: template source → syntax tree (jinja_internal.h).
//
// The lexer follows jinja2/lexer.py: newlines normalised to "\n" and one trailing newline dropped,
// `{%-`/`-%}` strip all whitespace on that side, lstrip_blocks strips spaces before `{%`/`{#` that
// start a line, trim_blocks drops the newline after `%}`/`#}`, `+` turns both off for one tag, and
// an end tag inside open brackets is an operator (`{{ {'a': {'b': 1}} }}`). The parser follows
// jinja2/parser.py's precedence: filters and tests bind tighter than arithmetic.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstdlib>
#include <cstring>

#include "text/jinja_internal.h"

namespace moesh::jinja {

void fail(std::string msg, size_t pos, StatusCode code) {
  throw Error{code, std::move(msg), pos, false};
}

std::string position_text(std::string_view source, size_t pos) {
  if (pos == kNoPos) return "template";
  if (pos > source.size()) pos = source.size();
  size_t line = 1, col = 1;
  for (size_t i = 0; i < pos; ++i) {
    if (source[i] == '\n') {
      ++line;
      col = 1;
    } else if ((static_cast<unsigned char>(source[i]) & 0xC0) != 0x80) {
      ++col;
    }
  }
  return fmt::format("line {}:{}", line, col);
}

namespace {

enum class Tok { kData, kVarBegin, kVarEnd, kBlockBegin, kBlockEnd, kName, kString, kInt, kFloat, kOp, kEof };

struct Token {
  Tok type;
  std::string value;  // data text, name, decoded string, operator, number text
  size_t pos;
};

bool is_ws(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}
bool is_name_start(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || (static_cast<unsigned char>(c) >= 0x80);
}
bool is_digit(char c) {
  return c >= '0' && c <= '9';
}

std::string rstrip_ws(std::string_view s) {
  size_t n = s.size();
  while (n > 0 && is_ws(s[n - 1])) --n;
  return std::string(s.substr(0, n));
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

// Python's "unicode-escape" decoding of a string literal body (what Jinja does to literals).
std::string decode_string(std::string_view s, size_t pos) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '\\' || i + 1 >= s.size()) {
      out += s[i];
      continue;
    }
    const char c = s[++i];
    auto hex = [&](int n) -> uint32_t {
      uint32_t v = 0;
      for (int k = 1; k <= n; ++k) {
        if (i + k >= s.size()) fail("truncated escape in string literal", pos);
        const char h = s[i + k];
        v <<= 4;
        if (h >= '0' && h <= '9')
          v |= h - '0';
        else if (h >= 'a' && h <= 'f')
          v |= h - 'a' + 10;
        else if (h >= 'A' && h <= 'F')
          v |= h - 'A' + 10;
        else
          fail("invalid escape in string literal", pos);
      }
      i += n;
      return v;
    };
    switch (c) {
      case 'n':
        out += '\n';
        break;
      case 't':
        out += '\t';
        break;
      case 'r':
        out += '\r';
        break;
      case '\\':
        out += '\\';
        break;
      case '\'':
        out += '\'';
        break;
      case '"':
        out += '"';
        break;
      case 'a':
        out += '\a';
        break;
      case 'b':
        out += '\b';
        break;
      case 'f':
        out += '\f';
        break;
      case 'v':
        out += '\v';
        break;
      case '\n':
        break;  // line continuation
      case 'x':
        append_utf8(out, hex(2));
        break;
      case 'u':
        append_utf8(out, hex(4));
        break;
      case 'U':
        append_utf8(out, hex(8));
        break;
      default:
        if (c >= '0' && c <= '7') {
          uint32_t v = c - '0';
          for (int k = 0; k < 2 && i + 1 < s.size() && s[i + 1] >= '0' && s[i + 1] <= '7'; ++k)
            v = v * 8 + (s[++i] - '0');
          append_utf8(out, v);
        } else {
          out += '\\';
          out += c;
        }
    }
  }
  return out;
}

class Lexer {
 public:
  Lexer(const std::string& src, const Options& opt) : src_(src), opt_(opt) {}

  std::vector<Token> run() {
    size_t pos = 0;
    bool line_starting = true;
    while (pos < src_.size()) {
      size_t p = pos;
      char kind = 0;
      while (true) {
        p = src_.find('{', p);
        if (p == std::string::npos || p + 1 >= src_.size()) break;
        const char k = src_[p + 1];
        if (k == '{' || k == '%' || k == '#') {
          kind = k;
          break;
        }
        ++p;
      }
      if (kind == 0) {
        emit(Tok::kData, src_.substr(pos), pos);
        break;
      }
      size_t after = p + 2;
      char sign = 0;
      if (after < src_.size() && (src_[after] == '-' || src_[after] == '+')) sign = src_[after++];
      std::string text = src_.substr(pos, p - pos);
      if (sign == '-') {
        text = rstrip_ws(text);
      } else if (sign != '+' && opt_.lstrip_blocks && kind != '{') {
        const size_t nl = text.rfind('\n');
        const size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
        if (l_pos > 0 || line_starting) {
          bool all_ws = l_pos < text.size();
          for (size_t i = l_pos; i < text.size(); ++i) all_ws = all_ws && is_ws(text[i]);
          if (all_ws) text.resize(l_pos);
        }
      }
      if (!text.empty()) emit(Tok::kData, text, pos);
      if (kind == '#') {
        pos = lex_comment(p, after);
      } else if (kind == '%' && is_raw(after)) {
        pos = lex_raw(p, after);
      } else {
        pos = lex_tag(kind, p, after);
      }
      line_starting = pos > 0 && src_[pos - 1] == '\n';
    }
    toks_.push_back({Tok::kEof, "", src_.size()});
    return std::move(toks_);
  }

 private:
  void emit(Tok t, std::string v, size_t pos) { toks_.push_back({t, std::move(v), pos}); }

  // After an end tag: "-" strips following whitespace, trim_blocks one newline (blocks/comments).
  size_t after_end(size_t pos, char sign, bool block_like) {
    if (sign == '-') {
      while (pos < src_.size() && is_ws(src_[pos])) ++pos;
    } else if (sign != '+' && block_like && opt_.trim_blocks && pos < src_.size() && src_[pos] == '\n') {
      ++pos;
    }
    return pos;
  }

  size_t lex_comment(size_t start, size_t pos) {
    const size_t q = src_.find("#}", pos);
    if (q == std::string::npos) fail("missing end of comment tag", start);
    char sign = 0;
    if (q > pos && (src_[q - 1] == '-' || src_[q - 1] == '+')) sign = src_[q - 1];
    return after_end(q + 2, sign, true);
  }

  bool is_raw(size_t pos) const {
    while (pos < src_.size() && is_ws(src_[pos])) ++pos;
    if (src_.compare(pos, 3, "raw") != 0) return false;
    pos += 3;
    if (pos < src_.size() && (is_name_start(src_[pos]) || is_digit(src_[pos]))) return false;
    while (pos < src_.size() && is_ws(src_[pos])) ++pos;
    return src_.compare(pos, 2, "%}") == 0 || src_.compare(pos, 3, "-%}") == 0;
  }

  size_t lex_raw(size_t start, size_t pos) {
    pos = src_.find("raw", pos) + 3;
    while (is_ws(src_[pos])) ++pos;
    if (src_[pos] == '-') {
      pos += 3;
      while (pos < src_.size() && is_ws(src_[pos])) ++pos;
    } else {
      pos += 2;
    }
    // Find "{%[-+]? endraw [-+]?%}".
    size_t scan = pos;
    while (true) {
      const size_t q = src_.find("{%", scan);
      if (q == std::string::npos) fail("missing end of raw directive", start);
      size_t r = q + 2;
      char sign = 0;
      if (r < src_.size() && (src_[r] == '-' || src_[r] == '+')) sign = src_[r++];
      while (r < src_.size() && is_ws(src_[r])) ++r;
      if (src_.compare(r, 6, "endraw") != 0) {
        scan = q + 2;
        continue;
      }
      r += 6;
      while (r < src_.size() && is_ws(src_[r])) ++r;
      char end_sign = 0;
      if (r < src_.size() && (src_[r] == '-' || src_[r] == '+')) end_sign = src_[r++];
      if (src_.compare(r, 2, "%}") != 0) {
        scan = q + 2;
        continue;
      }
      std::string text = src_.substr(pos, q - pos);
      if (sign == '-') {
        text = rstrip_ws(text);
      } else if (sign != '+' && opt_.lstrip_blocks) {
        const size_t nl = text.rfind('\n');
        if (nl != std::string::npos) {
          bool all_ws = nl + 1 < text.size();
          for (size_t i = nl + 1; i < text.size(); ++i) all_ws = all_ws && is_ws(text[i]);
          if (all_ws) text.resize(nl + 1);
        }
      }
      if (!text.empty()) emit(Tok::kData, text, pos);
      return after_end(r + 2, end_sign, true);
    }
  }

  size_t lex_tag(char kind, size_t start, size_t pos) {
    emit(kind == '{' ? Tok::kVarBegin : Tok::kBlockBegin, "", start);
    std::vector<char> brackets;
    while (true) {
      while (pos < src_.size() && is_ws(src_[pos])) ++pos;
      if (pos >= src_.size())
        fail(kind == '{' ? "unexpected end of template, expected '}}'" : "unexpected end of template, expected '%}'",
             start);
      if (brackets.empty()) {
        const char* end = kind == '{' ? "}}" : "%}";
        char sign = 0;
        size_t q = pos;
        if (src_[q] == '-' || (src_[q] == '+' && kind == '%')) sign = src_[q++];
        if (src_.compare(q, 2, end) == 0) {
          emit(kind == '{' ? Tok::kVarEnd : Tok::kBlockEnd, "", pos);
          return after_end(q + 2, sign, kind == '%');
        }
      }
      const char c = src_[pos];
      const size_t tok_start = pos;
      if (c == '\'' || c == '"') {
        size_t q = pos + 1;
        while (q < src_.size() && src_[q] != c) q += src_[q] == '\\' ? 2 : 1;
        if (q >= src_.size()) fail("unexpected end of string literal", pos);
        emit(Tok::kString, decode_string(std::string_view(src_).substr(pos + 1, q - pos - 1), pos), pos);
        pos = q + 1;
      } else if (is_digit(c)) {
        pos = lex_number(pos);
      } else if (is_name_start(c)) {
        while (pos < src_.size() && (is_name_start(src_[pos]) || is_digit(src_[pos]))) ++pos;
        emit(Tok::kName, src_.substr(tok_start, pos - tok_start), tok_start);
      } else {
        static const char* const kOps2[] = {"//", "**", "==", "!=", ">=", "<="};
        std::string op;
        for (const char* o : kOps2) {
          if (src_.compare(pos, 2, o) == 0) op = o;
        }
        if (op.empty()) {
          if (std::strchr("+-/*%~[](){}<>=.:|,;", c) == nullptr) fail(fmt::format("unexpected char '{}'", c), pos);
          op = std::string(1, c);
        }
        if (op == "(" || op == "[" || op == "{") {
          brackets.push_back(op == "(" ? ')' : op == "[" ? ']' : '}');
        } else if (op == ")" || op == "]" || op == "}") {
          if (brackets.empty()) fail(fmt::format("unexpected '{}'", op), pos);
          if (brackets.back() != op[0]) fail(fmt::format("unexpected '{}', expected '{}'", op, brackets.back()), pos);
          brackets.pop_back();
        }
        pos += op.size();
        emit(Tok::kOp, op, tok_start);
      }
    }
  }

  // Integers (decimal, 0x, 0o, 0b, underscores) and floats (1.5, 1e3, 1.5e-3).
  size_t lex_number(size_t pos) {
    const size_t start = pos;
    auto digits = [&](auto ok) {
      while (pos < src_.size() && (ok(src_[pos]) || (src_[pos] == '_' && pos + 1 < src_.size() && ok(src_[pos + 1]))))
        ++pos;
    };
    auto dec = [](char c) { return is_digit(c); };
    if (src_[pos] == '0' && pos + 1 < src_.size() && std::strchr("xXoObB", src_[pos + 1]) != nullptr) {
      const char base = static_cast<char>(std::tolower(src_[pos + 1]));
      pos += 2;
      digits([&](char c) {
        return base == 'x'   ? std::isxdigit(static_cast<unsigned char>(c)) != 0
               : base == 'o' ? (c >= '0' && c <= '7')
                             : (c == '0' || c == '1');
      });
      std::string t;
      for (size_t i = start + 2; i < pos; ++i)
        if (src_[i] != '_') t += src_[i];
      emit(Tok::kInt, std::to_string(std::strtoll(t.c_str(), nullptr, base == 'x' ? 16 : base == 'o' ? 8 : 2)), start);
      return pos;
    }
    digits(dec);
    bool is_float = false;
    if (pos + 1 < src_.size() && src_[pos] == '.' && is_digit(src_[pos + 1])) {
      is_float = true;
      ++pos;
      digits(dec);
    }
    if (pos < src_.size() && (src_[pos] == 'e' || src_[pos] == 'E')) {
      size_t q = pos + 1;
      if (q < src_.size() && (src_[q] == '+' || src_[q] == '-')) ++q;
      if (q < src_.size() && is_digit(src_[q])) {
        is_float = true;
        pos = q;
        digits(dec);
      }
    }
    std::string t;
    for (size_t i = start; i < pos; ++i)
      if (src_[i] != '_') t += src_[i];
    emit(is_float ? Tok::kFloat : Tok::kInt, t, start);
    return pos;
  }

  const std::string& src_;
  const Options& opt_;
  std::vector<Token> toks_;
};

// ---- parser ---------------------------------------------------------------------------------

ExprPtr make_expr(ExprKind k, size_t pos) {
  auto e = std::make_unique<Expr>();
  e->kind = k;
  e->pos = pos;
  return e;
}

class Parser {
 public:
  explicit Parser(std::vector<Token> toks) : toks_(std::move(toks)) {}

  Body parse_all() {
    std::vector<std::string> none;
    Body body = parse_body(none);
    if (cur().type != Tok::kEof) fail("unexpected token", cur().pos);
    return body;
  }

 private:
  const Token& cur() const { return toks_[i_]; }
  const Token& peek(size_t n = 1) const { return toks_[std::min(i_ + n, toks_.size() - 1)]; }
  Token next() { return toks_[i_ < toks_.size() - 1 ? i_++ : i_]; }
  bool is_op(const char* op) const { return cur().type == Tok::kOp && cur().value == op; }
  bool is_name(const char* n) const { return cur().type == Tok::kName && cur().value == n; }
  bool skip_op(const char* op) {
    if (!is_op(op)) return false;
    ++i_;
    return true;
  }
  bool skip_name(const char* n) {
    if (!is_name(n)) return false;
    ++i_;
    return true;
  }
  static std::string describe(const Token& t) {
    switch (t.type) {
      case Tok::kEof:
        return "end of template";
      case Tok::kBlockEnd:
        return "end of statement block";
      case Tok::kVarEnd:
        return "end of print statement";
      case Tok::kData:
        return "template data";
      case Tok::kString:
        return "string";
      default:
        return "'" + t.value + "'";
    }
  }
  void expect_op(const char* op) {
    if (!skip_op(op)) fail(fmt::format("expected '{}', got {}", op, describe(cur())), cur().pos);
  }
  std::string expect_name() {
    if (cur().type != Tok::kName) fail(fmt::format("expected a name, got {}", describe(cur())), cur().pos);
    return next().value;
  }
  void expect_block_end() {
    if (cur().type != Tok::kBlockEnd)
      fail(fmt::format("expected end of statement block, got {}", describe(cur())), cur().pos);
    ++i_;
  }

  // Statements up to (not consuming) a block whose first name is in `ends`.
  Body parse_body(const std::vector<std::string>& ends) {
    Body body;
    while (true) {
      const Token& t = cur();
      if (t.type == Tok::kEof) {
        if (!ends.empty())
          fail(fmt::format("unexpected end of template, expected '{}'", fmt::join(ends, "' or '")), t.pos);
        return body;
      }
      if (t.type == Tok::kData) {
        auto s = std::make_unique<Stmt>();
        s->kind = StmtKind::kText;
        s->pos = t.pos;
        s->text = t.value;
        body.push_back(std::move(s));
        ++i_;
      } else if (t.type == Tok::kVarBegin) {
        ++i_;
        auto s = std::make_unique<Stmt>();
        s->kind = StmtKind::kOutput;
        s->pos = cur().pos;
        s->expr = parse_tuple(true);
        if (cur().type != Tok::kVarEnd)
          fail(fmt::format("expected end of print statement, got {}", describe(cur())), cur().pos);
        ++i_;
        body.push_back(std::move(s));
      } else if (t.type == Tok::kBlockBegin) {
        const Token& kw = peek();
        if (kw.type == Tok::kName) {
          for (const auto& e : ends)
            if (kw.value == e) return body;
        }
        ++i_;
        body.push_back(parse_statement());
      } else {
        fail("unexpected token " + describe(t), t.pos);
      }
    }
  }

  std::unique_ptr<Stmt> parse_statement() {
    const Token kw = cur();
    if (kw.type != Tok::kName) fail("tag name expected", kw.pos);
    ++i_;
    auto s = std::make_unique<Stmt>();
    s->pos = kw.pos;
    const std::string& k = kw.value;
    if (k == "if") {
      s->kind = StmtKind::kIf;
      ExprPtr cond = parse_expression(true);
      expect_block_end();
      while (true) {
        Body b = parse_body({"elif", "else", "endif"});
        s->branches.emplace_back(std::move(cond), std::move(b));
        ++i_;  // block begin
        const std::string w = next().value;
        if (w == "elif") {
          cond = parse_expression(true);
          expect_block_end();
        } else if (w == "else") {
          expect_block_end();
          s->branches.emplace_back(nullptr, parse_body({"endif"}));
          i_ += 2;
          expect_block_end();
          break;
        } else {
          expect_block_end();
          break;
        }
      }
    } else if (k == "for") {
      s->kind = StmtKind::kFor;
      s->target = parse_assign_target();
      if (!skip_name("in")) fail(fmt::format("expected 'in', got {}", describe(cur())), cur().pos);
      s->expr = parse_tuple(false);
      if (skip_name("if")) s->cond = parse_expression(true);
      if (is_name("recursive")) fail("recursive loops are not supported", cur().pos, StatusCode::kUnsupported);
      expect_block_end();
      s->body = parse_body({"endfor", "else"});
      ++i_;
      if (next().value == "else") {
        expect_block_end();
        s->else_body = parse_body({"endfor"});
        i_ += 2;
      }
      expect_block_end();
    } else if (k == "set") {
      s->target = parse_assign_target();
      if (skip_op("=")) {
        s->kind = StmtKind::kSet;
        s->expr = parse_tuple(true);
        expect_block_end();
      } else {
        s->kind = StmtKind::kSetBlock;
        if (is_op("|")) s->expr = parse_filters(nullptr);
        expect_block_end();
        s->body = parse_body({"endset"});
        i_ += 2;
        expect_block_end();
      }
    } else if (k == "macro") {
      s->kind = StmtKind::kMacro;
      s->text = expect_name();
      parse_params(*s);
      expect_block_end();
      s->body = parse_body({"endmacro"});
      i_ += 2;
      if (cur().type == Tok::kName) ++i_;  // {% endmacro name %}
      expect_block_end();
    } else if (k == "call") {
      s->kind = StmtKind::kCallBlock;
      if (is_op("(")) parse_params(*s);
      s->expr = parse_expression(true);
      if (s->expr->kind != ExprKind::kCall) fail("expected a call after 'call'", s->expr->pos);
      expect_block_end();
      s->body = parse_body({"endcall"});
      i_ += 2;
      expect_block_end();
    } else if (k == "filter") {
      s->kind = StmtKind::kFilterBlock;
      s->expr = parse_filters(nullptr, /*first_without_pipe=*/true);
      expect_block_end();
      s->body = parse_body({"endfilter"});
      i_ += 2;
      expect_block_end();
    } else if (k == "generation") {
      // transformers' AssistantTracker block: renders its body (it only records offsets).
      s->kind = StmtKind::kIf;
      expect_block_end();
      auto lit = make_expr(ExprKind::kLiteral, kw.pos);
      lit->literal = Value(true);
      s->branches.emplace_back(std::move(lit), parse_body({"endgeneration"}));
      i_ += 2;
      expect_block_end();
    } else if (k == "break" || k == "continue") {
      s->kind = k == "break" ? StmtKind::kBreak : StmtKind::kContinue;
      expect_block_end();
    } else if (k == "endif" || k == "endfor" || k == "endset" || k == "endmacro" || k == "else" || k == "elif" ||
               k == "endcall" || k == "endfilter" || k == "endgeneration") {
      fail(fmt::format("unexpected '{}'", k), kw.pos);
    } else {
      fail(fmt::format("unknown tag '{}'", k), kw.pos, StatusCode::kUnsupported);
    }
    return s;
  }

  void parse_params(Stmt& s) {
    expect_op("(");
    while (!is_op(")")) {
      if (!s.params.empty()) expect_op(",");
      if (is_op(")")) break;
      std::string name = expect_name();
      ExprPtr def;
      if (skip_op("=")) def = parse_expression(true);
      s.params.emplace_back(std::move(name), std::move(def));
    }
    expect_op(")");
  }

  // name | name.attr | a, b (tuple of names)
  ExprPtr parse_assign_target() {
    const size_t pos = cur().pos;
    auto one = [&]() {
      const size_t p = cur().pos;
      auto e = make_expr(ExprKind::kName, p);
      e->name = expect_name();
      if (skip_op(".")) {
        auto a = make_expr(ExprKind::kGetAttr, p);
        a->name = expect_name();
        a->args.push_back(std::move(e));
        return a;
      }
      return e;
    };
    bool paren = skip_op("(");
    ExprPtr first = one();
    if (!is_op(",")) {
      if (paren) expect_op(")");
      return first;
    }
    auto t = make_expr(ExprKind::kTuple, pos);
    t->args.push_back(std::move(first));
    while (skip_op(",")) {
      if (cur().type != Tok::kName) break;
      t->args.push_back(one());
    }
    if (paren) expect_op(")");
    return t;
  }

  // expr, expr, ... → tuple (Jinja's parse_tuple); a single expression stays itself.
  ExprPtr parse_tuple(bool with_condexpr) {
    const size_t pos = cur().pos;
    ExprPtr first = parse_expression(with_condexpr);
    if (!is_op(",")) return first;
    auto t = make_expr(ExprKind::kTuple, pos);
    t->args.push_back(std::move(first));
    while (skip_op(",")) {
      if (tuple_end()) break;
      t->args.push_back(parse_expression(with_condexpr));
    }
    return t;
  }
  bool tuple_end() const {
    return cur().type == Tok::kVarEnd || cur().type == Tok::kBlockEnd || cur().type == Tok::kEof || is_op(")") ||
           is_name("if") || is_name("in") || is_name("recursive");
  }

  ExprPtr parse_expression(bool with_condexpr) {
    ExprPtr e = parse_or();
    if (!with_condexpr) return e;
    while (is_name("if")) {
      const size_t pos = cur().pos;
      ++i_;
      auto c = make_expr(ExprKind::kCond, pos);
      ExprPtr cond = parse_or();
      ExprPtr other;
      if (skip_name("else")) other = parse_expression(true);
      c->args.push_back(std::move(e));
      c->args.push_back(std::move(cond));
      c->args.push_back(std::move(other));
      e = std::move(c);
    }
    return e;
  }

  ExprPtr binary(ExprKind k, std::string op, ExprPtr a, ExprPtr b, size_t pos) {
    auto e = make_expr(k, pos);
    e->name = std::move(op);
    e->args.push_back(std::move(a));
    e->args.push_back(std::move(b));
    return e;
  }

  ExprPtr parse_or() {
    ExprPtr e = parse_and();
    while (is_name("or")) {
      const size_t pos = next().pos;
      e = binary(ExprKind::kOr, "or", std::move(e), parse_and(), pos);
    }
    return e;
  }
  ExprPtr parse_and() {
    ExprPtr e = parse_not();
    while (is_name("and")) {
      const size_t pos = next().pos;
      e = binary(ExprKind::kAnd, "and", std::move(e), parse_not(), pos);
    }
    return e;
  }
  ExprPtr parse_not() {
    if (is_name("not")) {
      const size_t pos = next().pos;
      auto e = make_expr(ExprKind::kUnary, pos);
      e->name = "not";
      e->args.push_back(parse_not());
      return e;
    }
    return parse_compare();
  }
  ExprPtr parse_compare() {
    const size_t pos = cur().pos;
    ExprPtr first = parse_math1();
    ExprPtr cmp;
    while (true) {
      std::string op;
      if (cur().type == Tok::kOp && (cur().value == "==" || cur().value == "!=" || cur().value == "<" ||
                                     cur().value == ">" || cur().value == "<=" || cur().value == ">=")) {
        op = next().value;
      } else if (is_name("in")) {
        ++i_;
        op = "in";
      } else if (is_name("not") && peek().type == Tok::kName && peek().value == "in") {
        i_ += 2;
        op = "notin";
      } else {
        break;
      }
      if (!cmp) {
        cmp = make_expr(ExprKind::kCompare, pos);
        cmp->args.push_back(std::move(first));
      }
      cmp->ops.push_back(op);
      cmp->args.push_back(parse_math1());
    }
    return cmp ? std::move(cmp) : std::move(first);
  }
  ExprPtr parse_math1() {
    ExprPtr e = parse_concat();
    while (is_op("+") || is_op("-")) {
      const Token t = next();
      e = binary(ExprKind::kBinary, t.value, std::move(e), parse_concat(), t.pos);
    }
    return e;
  }
  ExprPtr parse_concat() {
    ExprPtr e = parse_math2();
    while (is_op("~")) {
      const Token t = next();
      e = binary(ExprKind::kBinary, "~", std::move(e), parse_math2(), t.pos);
    }
    return e;
  }
  ExprPtr parse_math2() {
    ExprPtr e = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const Token t = next();
      e = binary(ExprKind::kBinary, t.value, std::move(e), parse_pow(), t.pos);
    }
    return e;
  }
  ExprPtr parse_pow() {
    ExprPtr e = parse_unary(true);
    while (is_op("**")) {
      const Token t = next();
      e = binary(ExprKind::kBinary, "**", std::move(e), parse_unary(true), t.pos);
    }
    return e;
  }
  ExprPtr parse_unary(bool with_filter) {
    ExprPtr e;
    if (is_op("-") || is_op("+")) {
      const Token t = next();
      e = make_expr(ExprKind::kUnary, t.pos);
      e->name = t.value;
      e->args.push_back(parse_unary(false));
    } else {
      e = parse_primary();
    }
    e = parse_postfix(std::move(e));
    if (with_filter) e = parse_filter_expr(std::move(e));
    return e;
  }

  ExprPtr parse_primary() {
    const Token t = cur();
    switch (t.type) {
      case Tok::kName: {
        ++i_;
        auto e = make_expr(ExprKind::kLiteral, t.pos);
        if (t.value == "true" || t.value == "True") {
          e->literal = Value(true);
        } else if (t.value == "false" || t.value == "False") {
          e->literal = Value(false);
        } else if (t.value == "none" || t.value == "None") {
          e->literal = Value::none();
        } else {
          e->kind = ExprKind::kName;
          e->name = t.value;
        }
        return e;
      }
      case Tok::kString: {
        ++i_;
        std::string s = t.value;
        while (cur().type == Tok::kString) s += next().value;  // adjacent literals concatenate
        auto e = make_expr(ExprKind::kLiteral, t.pos);
        e->literal = Value(std::move(s));
        return e;
      }
      case Tok::kInt: {
        ++i_;
        auto e = make_expr(ExprKind::kLiteral, t.pos);
        errno = 0;
        const long long v = std::strtoll(t.value.c_str(), nullptr, 10);
        if (errno == ERANGE) fail("integer literal out of range", t.pos, StatusCode::kUnsupported);
        e->literal = Value(static_cast<int64_t>(v));
        return e;
      }
      case Tok::kFloat: {
        ++i_;
        auto e = make_expr(ExprKind::kLiteral, t.pos);
        e->literal = Value(std::strtod(t.value.c_str(), nullptr));
        return e;
      }
      case Tok::kOp:
        if (t.value == "(") {
          ++i_;
          if (skip_op(")")) return make_expr(ExprKind::kTuple, t.pos);
          ExprPtr e = parse_expression(true);
          if (is_op(",")) {
            auto tup = make_expr(ExprKind::kTuple, t.pos);
            tup->args.push_back(std::move(e));
            while (skip_op(",")) {
              if (is_op(")")) break;
              tup->args.push_back(parse_expression(true));
            }
            e = std::move(tup);
          }
          expect_op(")");
          return e;
        }
        if (t.value == "[") {
          ++i_;
          auto e = make_expr(ExprKind::kList, t.pos);
          while (!is_op("]")) {
            if (!e->args.empty()) expect_op(",");
            if (is_op("]")) break;
            e->args.push_back(parse_expression(true));
          }
          expect_op("]");
          return e;
        }
        if (t.value == "{") {
          ++i_;
          auto e = make_expr(ExprKind::kDict, t.pos);
          while (!is_op("}")) {
            if (!e->args.empty()) expect_op(",");
            if (is_op("}")) break;
            e->args.push_back(parse_expression(true));
            expect_op(":");
            e->args.push_back(parse_expression(true));
          }
          expect_op("}");
          return e;
        }
        break;
      default:
        break;
    }
    fail(fmt::format("unexpected {}", describe(t)), t.pos);
  }

  ExprPtr parse_postfix(ExprPtr e) {
    while (true) {
      if (is_op(".")) {
        const Token dot = next();
        const Token t = next();
        if (t.type == Tok::kName) {
          auto a = make_expr(ExprKind::kGetAttr, dot.pos);
          a->name = t.value;
          a->args.push_back(std::move(e));
          e = std::move(a);
        } else if (t.type == Tok::kInt) {
          auto a = make_expr(ExprKind::kGetItem, dot.pos);
          auto k = make_expr(ExprKind::kLiteral, t.pos);
          k->literal = Value(static_cast<int64_t>(std::strtoll(t.value.c_str(), nullptr, 10)));
          a->args.push_back(std::move(e));
          a->args.push_back(std::move(k));
          e = std::move(a);
        } else {
          fail("expected a name after '.'", t.pos);
        }
      } else if (is_op("[")) {
        e = parse_subscript(std::move(e));
      } else if (is_op("(")) {
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr obj) {
    const size_t pos = next().pos;
    // [a], [a:b], [a:b:c], [:], [::-1]
    ExprPtr parts[3];
    bool is_slice = false;
    if (!is_op(":")) parts[0] = parse_expression(true);
    if (skip_op(":")) {
      is_slice = true;
      if (!is_op("]") && !is_op(":")) parts[1] = parse_expression(true);
      if (skip_op(":")) {
        if (!is_op("]")) parts[2] = parse_expression(true);
      }
    } else if (is_op(",")) {
      auto t = make_expr(ExprKind::kTuple, parts[0]->pos);
      t->args.push_back(std::move(parts[0]));
      while (skip_op(",")) {
        if (is_op("]")) break;
        t->args.push_back(parse_expression(true));
      }
      parts[0] = std::move(t);
    }
    expect_op("]");
    auto e = make_expr(is_slice ? ExprKind::kSlice : ExprKind::kGetItem, pos);
    e->args.push_back(std::move(obj));
    if (is_slice) {
      for (auto& p : parts) e->args.push_back(std::move(p));
    } else {
      e->args.push_back(std::move(parts[0]));
    }
    return e;
  }

  // Arguments into e->args (after whatever is already there) and e->kwargs.
  void parse_call_args(Expr& e) {
    expect_op("(");
    bool first = true;
    while (!is_op(")")) {
      if (!first) expect_op(",");
      first = false;
      if (is_op(")")) break;
      if (is_op("*") || is_op("**"))
        fail("*args and **kwargs in calls are not supported", cur().pos, StatusCode::kUnsupported);
      if (cur().type == Tok::kName && peek().type == Tok::kOp && peek().value == "=") {
        std::string name = next().value;
        ++i_;
        e.kwargs.emplace_back(std::move(name), parse_expression(true));
      } else {
        if (!e.kwargs.empty()) fail("positional argument follows keyword argument", cur().pos);
        e.args.push_back(parse_expression(true));
      }
    }
    expect_op(")");
  }

  ExprPtr parse_call(ExprPtr fn) {
    auto e = make_expr(ExprKind::kCall, cur().pos);
    e->args.push_back(std::move(fn));
    parse_call_args(*e);
    return e;
  }

  ExprPtr parse_filter_expr(ExprPtr e) {
    while (true) {
      if (is_op("|")) {
        e = parse_filters(std::move(e));
      } else if (is_name("is")) {
        e = parse_test(std::move(e));
      } else if (is_op("(")) {
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }

  // | f | g(args) ... (a filter block's `{% filter upper %}` has no leading pipe).
  ExprPtr parse_filters(ExprPtr subject, bool first_without_pipe = false) {
    bool first = true;
    while ((first && first_without_pipe) || is_op("|")) {
      if (!(first && first_without_pipe)) ++i_;
      first = false;
      const size_t pos = cur().pos;
      std::string name = expect_name();
      while (skip_op(".")) name += "." + expect_name();
      auto f = make_expr(ExprKind::kFilter, pos);
      f->name = std::move(name);
      f->args.push_back(std::move(subject));
      if (is_op("(")) parse_call_args(*f);
      subject = std::move(f);
    }
    return subject;
  }

  ExprPtr parse_test(ExprPtr subject) {
    const size_t pos = next().pos;  // "is"
    auto t = make_expr(ExprKind::kTest, pos);
    t->negated = skip_name("not");
    std::string name = expect_name();
    while (skip_op(".")) name += "." + expect_name();
    t->name = std::move(name);
    t->args.push_back(std::move(subject));
    if (is_op("(")) {
      parse_call_args(*t);
    } else if ((cur().type == Tok::kName || cur().type == Tok::kString || cur().type == Tok::kInt ||
                cur().type == Tok::kFloat || is_op("(") || is_op("[") || is_op("{")) &&
               !is_name("else") && !is_name("or") && !is_name("and")) {
      if (is_name("is")) fail("you cannot chain multiple tests with is", cur().pos);
      t->args.push_back(parse_postfix(parse_primary()));
    }
    return t;
  }

  std::vector<Token> toks_;
  size_t i_ = 0;
};

}  // namespace

void parse_template(Template::Impl& impl) {
  // Newlines normalised as jinja2's lexer does (the whole source, string literals included).
  std::string src;
  src.reserve(impl.source.size());
  for (size_t i = 0; i < impl.source.size(); ++i) {
    const char c = impl.source[i];
    if (c == '\r') {
      src += '\n';
      if (i + 1 < impl.source.size() && impl.source[i + 1] == '\n') ++i;
    } else {
      src += c;
    }
  }
  if (!impl.options.keep_trailing_newline && !src.empty() && src.back() == '\n') src.pop_back();
  impl.source = std::move(src);
  Lexer lexer(impl.source, impl.options);
  Parser parser(lexer.run());
  impl.body = parser.parse_all();
}

}  // namespace moesh::jinja
