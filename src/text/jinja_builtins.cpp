// Jinja builtins: filters, tests, the methods of str/list/dict a sandboxed template may call, and
// the globals (range, namespace, dict, raise_exception, strftime_now, joiner). Each follows the
// Jinja2 3.1 / Python function of the same name; HF's `tojson` replaces Jinja's own.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <ctime>
#include <set>

#include "text/jinja_internal.h"

namespace moesh::jinja {

namespace {

// ---- argument helpers -------------------------------------------------------------------------

// Argument i (positional) or `name` (keyword), else `def`.
Value arg(const CallArgs& a, size_t i, const char* name, Value def = Value()) {
  if (i < a.positional.size()) return a.positional[i];
  for (const auto& kv : a.named)
    if (kv.first == name) return kv.second;
  return def;
}

bool has_arg(const CallArgs& a, size_t i, const char* name) {
  if (i < a.positional.size()) return true;
  for (const auto& kv : a.named)
    if (kv.first == name) return true;
  return false;
}

int64_t int_arg(const Value& v, const char* what) {
  if (v.is_int()) return v.as_int();
  if (v.is_bool()) return v.as_bool() ? 1 : 0;
  if (v.is_undefined()) fail_undefined(v);
  fail(fmt::format("{} must be an integer, not {}", what, v.type_name()));
}

std::string str_arg(const Value& v, const char* what) {
  if (v.is_string()) return v.as_string();
  if (v.is_undefined()) fail_undefined(v);
  fail(fmt::format("{} must be str, not {}", what, v.type_name()));
}

// ---- string helpers ---------------------------------------------------------------------------

char ascii_upper(char c) {
  return c >= 'a' && c <= 'z' ? static_cast<char>(c - 32) : c;
}
char ascii_lower(char c) {
  return c >= 'A' && c <= 'Z' ? static_cast<char>(c + 32) : c;
}
bool ascii_alpha(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

std::string upper(std::string s) {
  for (char& c : s) c = ascii_upper(c);
  return s;
}
std::string lower(std::string s) {
  for (char& c : s) c = ascii_lower(c);
  return s;
}
std::string capitalize(const std::string& s) {
  std::string out = lower(s);
  if (!out.empty()) out[0] = ascii_upper(out[0]);
  return out;
}
// Python str.title(): a letter after a non-letter is upper-cased, others lower-cased.
std::string py_title(const std::string& s) {
  std::string out = s;
  bool prev_cased = false;
  for (char& c : out) {
    if (ascii_alpha(c)) {
      c = prev_cased ? ascii_lower(c) : ascii_upper(c);
      prev_cased = true;
    } else {
      prev_cased = (static_cast<unsigned char>(c) >= 0x80) && prev_cased;
    }
  }
  return out;
}
// Jinja's title filter: each run between [-\s({[<] separators gets its first char upper-cased.
std::string jinja_title(const std::string& s) {
  std::string out;
  bool at_start = true;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    size_t n = 1;
    const bool sep = std::strchr("-({[<", c) != nullptr || (c != 0 && is_py_space(s, i, &n));
    if (sep) {
      out.append(s, i, n);
      i += n - 1;
      at_start = true;
      continue;
    }
    out += at_start ? ascii_upper(c) : ascii_lower(c);
    at_start = false;
  }
  return out;
}

// Python str.strip/lstrip/rstrip with an optional set of characters (code points).
std::string py_strip(const std::string& s, const Value& chars, bool left, bool right) {
  const auto off = codepoint_offsets(s);
  const size_t n = off.size() - 1;
  std::set<std::string> set;
  const bool ws = chars.is_none() || chars.is_undefined();
  if (!ws) {
    const std::string c = str_arg(chars, "strip arg");
    const auto co = codepoint_offsets(c);
    for (size_t i = 0; i + 1 < co.size(); ++i) set.insert(c.substr(co[i], co[i + 1] - co[i]));
  }
  auto strip_at = [&](size_t i) {
    if (ws) {
      size_t len;
      return is_py_space(s, off[i], &len);
    }
    return set.count(s.substr(off[i], off[i + 1] - off[i])) > 0;
  };
  size_t a = 0, b = n;
  if (left)
    while (a < b && strip_at(a)) ++a;
  if (right)
    while (b > a && strip_at(b - 1)) --b;
  return s.substr(off[a], off[b] - off[a]);
}

std::vector<Value> py_split(const std::string& s, const Value& sep_v, int64_t maxsplit, bool from_right) {
  std::vector<std::string> parts;
  if (sep_v.is_none() || sep_v.is_undefined()) {
    // Runs of whitespace; empty strings never appear.
    std::vector<std::pair<size_t, size_t>> words;
    size_t i = 0;
    while (i < s.size()) {
      size_t len;
      if (is_py_space(s, i, &len)) {
        i += len;
        continue;
      }
      size_t j = i;
      while (j < s.size() && !is_py_space(s, j, &len)) j += len == 0 ? 1 : codepoint_offsets(s.substr(j, 4))[1];
      words.emplace_back(i, j);
      i = j;
    }
    if (maxsplit < 0 || static_cast<size_t>(maxsplit) + 1 >= words.size()) {
      for (const auto& w : words) parts.push_back(s.substr(w.first, w.second - w.first));
    } else if (!from_right) {
      for (int64_t k = 0; k < maxsplit; ++k)
        parts.push_back(s.substr(words[k].first, words[k].second - words[k].first));
      parts.push_back(py_strip(s.substr(words[maxsplit].first), Value::none(), false, true));
    } else {
      const size_t first = words.size() - static_cast<size_t>(maxsplit);
      parts.push_back(py_strip(s.substr(0, words[first - 1].second), Value::none(), true, false));
      for (size_t k = first; k < words.size(); ++k)
        parts.push_back(s.substr(words[k].first, words[k].second - words[k].first));
    }
  } else {
    const std::string sep = str_arg(sep_v, "separator");
    if (sep.empty()) fail("empty separator");
    if (!from_right) {
      size_t start = 0;
      int64_t n = 0;
      while (maxsplit < 0 || n < maxsplit) {
        const size_t p = s.find(sep, start);
        if (p == std::string::npos) break;
        parts.push_back(s.substr(start, p - start));
        start = p + sep.size();
        ++n;
      }
      parts.push_back(s.substr(start));
    } else {
      size_t end = s.size();
      int64_t n = 0;
      std::vector<std::string> rev;
      while (maxsplit < 0 || n < maxsplit) {
        if (end < sep.size()) break;
        const size_t p = s.rfind(sep, end - sep.size());
        if (p == std::string::npos) break;
        rev.push_back(s.substr(p + sep.size(), end - p - sep.size()));
        end = p;
        ++n;
      }
      rev.push_back(s.substr(0, end));
      parts.assign(rev.rbegin(), rev.rend());
    }
  }
  std::vector<Value> out;
  for (auto& p : parts) out.emplace_back(std::move(p));
  return out;
}

std::string py_replace(const std::string& s, const std::string& from, const std::string& to, int64_t count) {
  std::string out;
  if (from.empty()) {
    // Python inserts `to` between every code point (and at both ends).
    const auto off = codepoint_offsets(s);
    int64_t n = 0;
    for (size_t i = 0; i + 1 < off.size(); ++i) {
      if (count < 0 || n < count) {
        out += to;
        ++n;
      }
      out.append(s, off[i], off[i + 1] - off[i]);
    }
    if (count < 0 || n < count) out += to;
    return out;
  }
  size_t start = 0;
  int64_t n = 0;
  while (count < 0 || n < count) {
    const size_t p = s.find(from, start);
    if (p == std::string::npos) break;
    out.append(s, start, p - start);
    out += to;
    start = p + from.size();
    ++n;
  }
  out.append(s, start);
  return out;
}

int64_t cp_index(const std::string& s, size_t byte_pos) {
  return static_cast<int64_t>(codepoint_count(std::string_view(s).substr(0, byte_pos)));
}

std::string escape_html(const std::string& s) {
  std::string out;
  for (const char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

// str.format with {} / {0} / {name} fields (no format specs or conversions).
std::string py_str_format(const std::string& f, const CallArgs& a) {
  std::string out;
  size_t auto_idx = 0;
  for (size_t i = 0; i < f.size(); ++i) {
    const char c = f[i];
    if (c == '{' && i + 1 < f.size() && f[i + 1] == '{') {
      out += '{';
      ++i;
    } else if (c == '}' && i + 1 < f.size() && f[i + 1] == '}') {
      out += '}';
      ++i;
    } else if (c == '{') {
      const size_t close = f.find('}', i);
      if (close == std::string::npos) fail("Single '{' encountered in format string");
      const std::string field = f.substr(i + 1, close - i - 1);
      if (field.find_first_of(":!.[") != std::string::npos) {
        fail("format specs in str.format are not supported", kNoPos, StatusCode::kUnsupported);
      }
      Value v;
      if (field.empty() || std::all_of(field.begin(), field.end(), [](char d) { return d >= '0' && d <= '9'; })) {
        const size_t idx = field.empty() ? auto_idx++ : std::stoul(field);
        if (idx >= a.positional.size())
          fail(fmt::format("Replacement index {} out of range for positional args tuple", idx));
        v = a.positional[idx];
      } else {
        bool found = false;
        for (const auto& kv : a.named)
          if (kv.first == field) {
            v = kv.second;
            found = true;
          }
        if (!found) fail(fmt::format("'{}'", field));
      }
      out += v.str();
      i = close;
    } else if (c == '}') {
      fail("Single '}' encountered in format string");
    } else {
      out += c;
    }
  }
  return out;
}

// ---- attribute paths (map/selectattr/sort/groupby "a.b.0") ------------------------------------

Value attribute_path(const Interpreter& in, const Value& item, const std::string& path) {
  Value cur = item;
  size_t start = 0;
  while (true) {
    const size_t dot = path.find('.', start);
    const std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    bool numeric = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
    cur = numeric ? get_item(in, cur, Value(static_cast<int64_t>(std::stoll(part)))) : get_item(in, cur, Value(part));
    if (dot == std::string::npos) return cur;
    start = dot + 1;
  }
}

// Sort key: the item (or its attribute), lower-cased when a string and not case-sensitive.
Value sort_key(const Interpreter& in, const Value& item, const Value& attribute, bool case_sensitive) {
  Value k = attribute.is_string() ? attribute_path(in, item, attribute.as_string())
            : attribute.is_int()  ? get_item(in, item, attribute)
                                  : item;
  if (!case_sensitive && k.is_string()) return Value(lower(k.as_string()));
  return k;
}

void sort_values(std::vector<Value>& v, const std::function<Value(const Value&)>& key, bool reverse) {
  std::vector<std::pair<Value, Value>> keyed;
  for (auto& x : v) keyed.emplace_back(key(x), x);
  std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& a, const auto& b) {
    return reverse ? py_compare(b.first, a.first) < 0 : py_compare(a.first, b.first) < 0;
  });
  for (size_t i = 0; i < v.size(); ++i) v[i] = keyed[i].second;
}

Value to_int(const Value& v, const Value& def, int64_t base) {
  if (v.is_undefined()) fail_undefined(v);
  if (v.is_int()) return v;
  if (v.is_bool()) return Value(static_cast<int64_t>(v.as_bool()));
  if (v.is_float()) {
    if (std::isnan(v.as_float()) || std::isinf(v.as_float())) return def;
    return Value(static_cast<int64_t>(v.as_float()));
  }
  if (v.is_string()) {
    std::string s = py_strip(v.as_string(), Value::none(), true, true);
    s.erase(std::remove(s.begin(), s.end(), '_'), s.end());
    if (!s.empty()) {
      char* end = nullptr;
      errno = 0;
      const long long r = std::strtoll(s.c_str(), &end, static_cast<int>(base));
      if (errno == 0 && end != nullptr && *end == '\0') return Value(static_cast<int64_t>(r));
      const double d = std::strtod(s.c_str(), &end);
      if (end != nullptr && *end == '\0' && std::isfinite(d)) return Value(static_cast<int64_t>(d));
    }
  }
  return def;
}

Value to_float(const Value& v, const Value& def) {
  if (v.is_undefined()) fail_undefined(v);
  if (v.is_number()) return Value(v.to_double());
  if (v.is_string()) {
    std::string s = py_strip(v.as_string(), Value::none(), true, true);
    s.erase(std::remove(s.begin(), s.end(), '_'), s.end());
    char* end = nullptr;
    const double d = std::strtod(s.c_str(), &end);
    if (!s.empty() && end != nullptr && *end == '\0') return Value(d);
  }
  return def;
}

bool islower_or_upper(const std::string& s, bool want_lower) {
  bool cased = false;
  for (const char c : s) {
    if (c >= 'a' && c <= 'z') {
      if (!want_lower) return false;
      cased = true;
    } else if (c >= 'A' && c <= 'Z') {
      if (want_lower) return false;
      cased = true;
    }
  }
  return cased;
}

// Splits "a\nb\r\nc" the way str.splitlines() does (without keepends).
std::vector<std::string> splitlines(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (c == '\n' || c == '\r' || c == '\v' || c == '\f' || c == '\x1c' || c == '\x1d' || c == '\x1e') {
      out.push_back(s.substr(start, i - start));
      if (c == '\r' && i + 1 < s.size() && s[i + 1] == '\n') ++i;
      start = i + 1;
    }
  }
  if (start < s.size()) out.push_back(s.substr(start));
  return out;
}

bool known_filter(const std::string& n);

}  // namespace

// ---- tests ------------------------------------------------------------------------------------

namespace {
const char* const kTests[] = {
    "defined",  "undefined", "none",    "string",      "number",  "integer", "float",    "mapping",
    "iterable", "sequence",  "boolean", "true",        "false",   "odd",     "even",     "divisibleby",
    "eq",       "equalto",   "==",      "ne",          "!=",      "lt",      "lessthan", "<",
    "le",       "<=",        "gt",      "greaterthan", ">",       "ge",      ">=",       "in",
    "callable", "sameas",    "lower",   "upper",       "escaped", "filter",  "test"};
}  // namespace

bool has_test(const std::string& name) {
  for (const char* t : kTests)
    if (name == t) return true;
  return false;
}

bool apply_test(Interpreter& in, const std::string& n, const Value& v, const CallArgs& a) {
  using K = Value::Kind;
  if (n == "defined") return !v.is_undefined();
  if (n == "undefined") return v.is_undefined();
  if (n == "none") return v.is_none();
  if (n == "string") return v.is_string();
  if (n == "number") return v.is_number();
  if (n == "integer") return v.is_int();
  if (n == "float") return v.is_float();
  if (n == "boolean") return v.is_bool();
  if (n == "true") return v.is_bool() && v.as_bool();
  if (n == "false") return v.is_bool() && !v.as_bool();
  if (n == "mapping") return v.is_dict() && !v.as_dict().is_namespace;
  if (n == "iterable" || n == "sequence") {
    return v.is_string() || v.is_list() || v.is_undefined() || (v.is_dict() && !v.as_dict().is_namespace);
  }
  if (n == "callable") return v.is_function();
  if (n == "odd" || n == "even") {
    const Value r = py_binary("%", v, Value(2));
    return (r == Value(1)) == (n == "odd");
  }
  if (n == "divisibleby") return py_binary("%", v, arg(a, 0, "num")) == Value(0);
  const Value other = arg(a, 0, "b");
  if (n == "eq" || n == "equalto" || n == "==") return v == other;
  if (n == "ne" || n == "!=") return !(v == other);
  if (n == "lt" || n == "lessthan" || n == "<") return py_compare(v, other, "<") < 0;
  if (n == "le" || n == "<=") return py_compare(v, other, "<=") <= 0;
  if (n == "gt" || n == "greaterthan" || n == ">") return py_compare(v, other, ">") > 0;
  if (n == "ge" || n == ">=") return py_compare(v, other, ">=") >= 0;
  if (n == "in") return py_contains(arg(a, 0, "seq"), v);
  if (n == "sameas") {
    if (v.kind() != other.kind()) return false;
    if (v.is_list()) return &v.as_list() == &other.as_list();
    if (v.is_dict()) return &v.as_dict() == &other.as_dict();
    if (v.kind() == K::kString || v.kind() == K::kFloat) return false;  // distinct objects in general
    return v == other;
  }
  if (n == "lower") return islower_or_upper(v.str(), true);
  if (n == "upper") return islower_or_upper(v.str(), false);
  if (n == "escaped") return false;
  if (n == "filter") return v.is_string() && known_filter(v.as_string());
  if (n == "test") return v.is_string() && has_test(v.as_string());
  fail(fmt::format("no test named '{}'", n), kNoPos, StatusCode::kUnsupported);
}

// ---- filters ----------------------------------------------------------------------------------

namespace {
const char* const kFilters[] = {
    "trim",  "length",  "count",    "lower",  "upper",   "title",      "capitalize",  "replace",   "join",
    "first", "last",    "list",     "items",  "default", "d",          "tojson",      "string",    "int",
    "float", "abs",     "round",    "unique", "map",     "selectattr", "rejectattr",  "select",    "reject",
    "sort",  "reverse", "dictsort", "indent", "safe",    "e",          "escape",      "wordcount", "batch",
    "max",   "min",     "sum",      "format", "attr",    "center",     "forceescape", "truncate"};

bool known_filter(const std::string& n) {
  for (const char* f : kFilters)
    if (n == f) return true;
  return false;
}

std::vector<Value> select_items(Interpreter& in, const Value& seq, const CallArgs& a, bool by_attr, bool want) {
  std::vector<Value> out;
  const size_t first_test_arg = by_attr ? 1 : 0;
  const std::string attr = by_attr ? str_arg(arg(a, 0, "attr"), "attribute") : "";
  const bool has_test_name = a.positional.size() > first_test_arg;
  const std::string test = has_test_name ? str_arg(a.positional[first_test_arg], "test name") : "";
  if (has_test_name && !has_test(test)) fail(fmt::format("no test named '{}'", test), kNoPos, StatusCode::kUnsupported);
  CallArgs test_args;
  for (size_t i = first_test_arg + 1; i < a.positional.size(); ++i) test_args.positional.push_back(a.positional[i]);
  for (const auto& item : py_iterate(seq)) {
    const Value v = by_attr ? attribute_path(in, item, attr) : item;
    const bool ok = has_test_name ? apply_test(in, test, v, test_args) : v.truthy();
    if (ok == want) out.push_back(item);
  }
  return out;
}
}  // namespace

Value apply_filter(Interpreter& in, const std::string& n, const Value& v, const CallArgs& a) {
  if (n == "trim") return Value(py_strip(v.str(), arg(a, 0, "chars", Value::none()), true, true));
  if (n == "length" || n == "count") return Value(py_len(v));
  if (n == "lower") return Value(lower(v.str()));
  if (n == "upper") return Value(upper(v.str()));
  if (n == "title") return Value(jinja_title(v.str()));
  if (n == "capitalize") return Value(capitalize(v.str()));
  if (n == "replace") {
    const Value count = arg(a, 2, "count", Value::none());
    return Value(py_replace(v.str(), arg(a, 0, "old").str(), arg(a, 1, "new").str(),
                            count.is_none() ? -1 : int_arg(count, "count")));
  }
  if (n == "join") {
    const std::string sep = arg(a, 0, "d", Value("")).str();
    const Value attribute = arg(a, 1, "attribute", Value::none());
    std::string out;
    bool first = true;
    for (const auto& item : py_iterate(v)) {
      if (!first) out += sep;
      first = false;
      out += (attribute.is_none() ? item : attribute_path(in, item, attribute.str())).str();
    }
    return Value(std::move(out));
  }
  if (n == "first" || n == "last") {
    auto items = py_iterate(v);
    if (items.empty()) return Value::undefined(fmt::format("No {} item, sequence was empty.", n));
    return n == "first" ? items.front() : items.back();
  }
  if (n == "list") return Value::list(py_iterate(v));
  if (n == "items") {
    if (v.is_undefined()) return Value::list();
    if (!v.is_dict() || v.as_dict().is_namespace) fail("Can only get item pairs from a mapping.");
    std::vector<Value> out;
    for (const auto& kv : v.as_dict().items) out.push_back(Value::tuple({kv.first, kv.second}));
    return Value::list(std::move(out));
  }
  if (n == "default" || n == "d") {
    const bool boolean = arg(a, 1, "boolean", Value(false)).truthy();
    if (v.is_undefined() || (boolean && !v.truthy())) return arg(a, 0, "default_value", Value(""));
    return v;
  }
  if (n == "tojson") {
    JsonOptions o;
    o.ensure_ascii = arg(a, 0, "ensure_ascii", Value(false)).truthy();
    const Value indent = arg(a, 1, "indent", Value::none());
    if (!indent.is_none()) o.indent = static_cast<int>(int_arg(indent, "indent"));
    const Value seps = arg(a, 2, "separators", Value::none());
    if (!seps.is_none()) {
      if (!seps.is_list() || seps.as_list().items.size() != 2) fail("separators must be a (item, key) pair");
      o.separators.emplace(str_arg(seps.as_list().items[0], "separator"),
                           str_arg(seps.as_list().items[1], "separator"));
    }
    o.sort_keys = arg(a, 3, "sort_keys", Value(false)).truthy();
    auto r = to_json(v, o);
    if (!r.is_ok()) fail(r.status().message());
    return Value(std::move(*r));
  }
  if (n == "string") return Value(v.str());
  if (n == "int") return to_int(v, arg(a, 0, "default", Value(0)), int_arg(arg(a, 1, "base", Value(10)), "base"));
  if (n == "float") return to_float(v, arg(a, 0, "default", Value(0.0)));
  if (n == "abs") {
    if (v.is_int() || v.is_bool())
      return Value(static_cast<int64_t>(std::llabs(v.is_bool() ? v.as_bool() : v.as_int())));
    if (v.is_float()) return Value(std::fabs(v.as_float()));
    fail(fmt::format("bad operand type for abs(): '{}'", v.type_name()));
  }
  if (n == "round") {
    const int64_t precision = int_arg(arg(a, 0, "precision", Value(0)), "precision");
    const std::string method = arg(a, 1, "method", Value("common")).str();
    if (method != "common" && method != "ceil" && method != "floor") fail("method must be common, ceil or floor");
    if (v.is_undefined()) fail_undefined(v);
    if (!v.is_number()) fail(fmt::format("type {} doesn't define __round__ method", v.type_name()));
    if (method == "common" && !v.is_float()) return Value(v.is_bool() ? int64_t{v.as_bool()} : v.as_int());
    if (method == "common" && precision >= 0 && precision < 300) {
      // Python's round() rounds the exact binary value to a decimal (2.675 → 2.67, 2.5 → 2.0),
      // which is what a correctly rounded fixed-point print does.
      return Value(std::strtod(fmt::format("{:.{}f}", v.to_double(), precision).c_str(), nullptr));
    }
    const double scale = std::pow(10.0, static_cast<double>(precision));
    const double x = v.to_double() * scale;
    const double r = method == "ceil" ? std::ceil(x) : method == "floor" ? std::floor(x) : std::nearbyint(x);
    return Value(r / scale);
  }
  if (n == "unique") {
    const bool cs = arg(a, 0, "case_sensitive", Value(false)).truthy();
    const Value attribute = arg(a, 1, "attribute", Value::none());
    std::vector<Value> out, seen;
    for (const auto& item : py_iterate(v)) {
      const Value k = sort_key(in, item, attribute, cs);
      if (std::find(seen.begin(), seen.end(), k) != seen.end()) continue;
      seen.push_back(k);
      out.push_back(item);
    }
    return Value::list(std::move(out));
  }
  if (n == "map") {
    std::vector<Value> out;
    if (has_arg(a, 99, "attribute")) {
      const std::string attr = str_arg(arg(a, 99, "attribute"), "attribute");
      const Value def = arg(a, 99, "default");
      for (const auto& item : py_iterate(v)) {
        Value x = attribute_path(in, item, attr);
        out.push_back(x.is_undefined() && has_arg(a, 99, "default") ? def : x);
      }
    } else {
      if (a.positional.empty()) fail("map requires a filter argument");
      const std::string filter = str_arg(a.positional[0], "filter name");
      CallArgs fa;
      fa.positional.assign(a.positional.begin() + 1, a.positional.end());
      fa.named = a.named;
      for (const auto& item : py_iterate(v)) out.push_back(apply_filter(in, filter, item, fa));
    }
    return Value::list(std::move(out));
  }
  if (n == "selectattr") return Value::list(select_items(in, v, a, true, true));
  if (n == "rejectattr") return Value::list(select_items(in, v, a, true, false));
  if (n == "select") return Value::list(select_items(in, v, a, false, true));
  if (n == "reject") return Value::list(select_items(in, v, a, false, false));
  if (n == "sort") {
    const bool reverse = arg(a, 0, "reverse", Value(false)).truthy();
    const bool cs = arg(a, 1, "case_sensitive", Value(false)).truthy();
    const Value attribute = arg(a, 2, "attribute", Value::none());
    std::vector<Value> items = py_iterate(v);
    sort_values(
        items, [&](const Value& x) { return sort_key(in, x, attribute, cs); }, reverse);
    return Value::list(std::move(items));
  }
  if (n == "reverse") {
    if (v.is_string()) {
      const auto off = codepoint_offsets(v.as_string());
      std::string out;
      for (size_t i = off.size() - 1; i > 0; --i) out.append(v.as_string(), off[i - 1], off[i] - off[i - 1]);
      return Value(std::move(out));
    }
    std::vector<Value> items = py_iterate(v);
    std::reverse(items.begin(), items.end());
    return Value::list(std::move(items));
  }
  if (n == "dictsort") {
    if (v.is_undefined()) fail_undefined(v);
    if (!v.is_dict()) fail(fmt::format("'{}' object has no attribute 'items'", v.type_name()));
    const bool cs = arg(a, 0, "case_sensitive", Value(false)).truthy();
    const std::string by = arg(a, 1, "by", Value("key")).str();
    const bool reverse = arg(a, 2, "reverse", Value(false)).truthy();
    if (by != "key" && by != "value") fail("You can only sort by either \"key\" or \"value\"");
    std::vector<Value> items;
    for (const auto& kv : v.as_dict().items) items.push_back(Value::tuple({kv.first, kv.second}));
    sort_values(
        items, [&](const Value& x) { return sort_key(in, x.as_list().items[by == "key" ? 0 : 1], Value::none(), cs); },
        reverse);
    return Value::list(std::move(items));
  }
  if (n == "indent") {
    const Value w = arg(a, 0, "width", Value(4));
    const std::string ind = w.is_string()
                                ? w.as_string()
                                : std::string(static_cast<size_t>(std::max<int64_t>(0, int_arg(w, "width"))), ' ');
    const bool first = arg(a, 1, "first", Value(false)).truthy();
    const bool blank = arg(a, 2, "blank", Value(false)).truthy();
    const std::vector<std::string> lines = splitlines(v.str() + "\n");
    std::string rv;
    if (blank) {
      for (size_t i = 0; i < lines.size(); ++i) rv += (i ? "\n" + ind : "") + lines[i];
    } else {
      rv = lines.empty() ? "" : lines[0];
      for (size_t i = 1; i < lines.size(); ++i) rv += "\n" + (lines[i].empty() ? lines[i] : ind + lines[i]);
    }
    return Value(first ? ind + rv : rv);
  }
  if (n == "safe") return v.is_string() ? v : Value(v.str());
  if (n == "e" || n == "escape" || n == "forceescape") return Value(escape_html(v.str()));
  if (n == "wordcount") {
    // re.findall(r"\w+"): letters and digits of the common scripts; symbols and emoji are not.
    const std::string s = v.str();
    const auto off = codepoint_offsets(s);
    int64_t count = 0;
    bool in_word = false;
    for (size_t i = 0; i + 1 < off.size(); ++i) {
      uint32_t cp = static_cast<unsigned char>(s[off[i]]);
      if (off[i + 1] - off[i] > 1) {
        cp &= 0xFF >> (off[i + 1] - off[i] + 1);
        for (size_t k = off[i] + 1; k < off[i + 1]; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[k]) & 0x3F);
      }
      const bool w = (cp < 0x80 && (std::isalnum(static_cast<int>(cp)) || cp == '_')) ||
                     (cp >= 0xC0 && cp <= 0x24F && cp != 0xD7 && cp != 0xF7) || (cp >= 0x370 && cp <= 0x1FFF) ||
                     (cp >= 0x3040 && cp <= 0x9FFF) || (cp >= 0xAC00 && cp <= 0xD7AF) || cp == 0xAA || cp == 0xB5 ||
                     cp == 0xBA || (cp >= 0xB2 && cp <= 0xB3) || cp == 0xB9 || (cp >= 0xBC && cp <= 0xBE);
      if (w && !in_word) ++count;
      in_word = w;
    }
    return Value(count);
  }
  if (n == "batch") {
    const int64_t size = int_arg(arg(a, 0, "linecount"), "linecount");
    if (size <= 0) fail("batch size must be positive");
    const bool fill = has_arg(a, 1, "fill_with");
    const Value fill_with = arg(a, 1, "fill_with");
    std::vector<Value> out, cur;
    for (const auto& item : py_iterate(v)) {
      cur.push_back(item);
      if (static_cast<int64_t>(cur.size()) == size) {
        out.push_back(Value::list(std::move(cur)));
        cur.clear();
      }
    }
    if (!cur.empty()) {
      if (fill)
        while (static_cast<int64_t>(cur.size()) < size) cur.push_back(fill_with);
      out.push_back(Value::list(std::move(cur)));
    }
    return Value::list(std::move(out));
  }
  if (n == "max" || n == "min") {
    const bool cs = arg(a, 0, "case_sensitive", Value(false)).truthy();
    const Value attribute = arg(a, 1, "attribute", Value::none());
    auto items = py_iterate(v);
    if (items.empty()) return Value::undefined(fmt::format("No aggregated item, sequence was empty."));
    size_t best = 0;
    for (size_t i = 1; i < items.size(); ++i) {
      const int c = py_compare(sort_key(in, items[i], attribute, cs), sort_key(in, items[best], attribute, cs));
      if (n == "max" ? c > 0 : c < 0) best = i;
    }
    return items[best];
  }
  if (n == "sum") {
    const Value attribute = arg(a, 0, "attribute", Value::none());
    Value total = arg(a, 1, "start", Value(0));
    for (const auto& item : py_iterate(v)) {
      total = py_binary("+", total, attribute.is_none() ? item : attribute_path(in, item, attribute.str()));
    }
    return total;
  }
  if (n == "format") {
    if (!a.named.empty() && !a.positional.empty())
      fail("can't handle positional and keyword arguments at the same time");
    if (!a.named.empty()) fail("format with keyword arguments is not supported", kNoPos, StatusCode::kUnsupported);
    return Value(py_percent_format(v.str(), Value::tuple(a.positional)));
  }
  if (n == "attr") {
    // Python getattr only: a dict's keys are not attributes (only its methods are).
    const std::string name = str_arg(arg(a, 0, "name"), "attribute name");
    if (v.is_undefined()) return v;
    Value m = get_method(in, v, name);
    return m.is_undefined() ? Value::undefined(fmt::format("'{}' has no attribute '{}'", v.type_name(), name)) : m;
  }
  if (n == "center") {
    const int64_t width = int_arg(arg(a, 0, "width", Value(80)), "width");
    const std::string s = v.str();
    const int64_t len = static_cast<int64_t>(codepoint_count(s));
    if (width <= len) return Value(s);
    const int64_t pad = width - len;
    const int64_t left = pad / 2 + (pad & width & 1);
    return Value(std::string(static_cast<size_t>(left), ' ') + s + std::string(static_cast<size_t>(pad - left), ' '));
  }
  if (n == "truncate") fail("the truncate filter is not supported", kNoPos, StatusCode::kUnsupported);
  fail(fmt::format("no filter named '{}'", n), kNoPos, StatusCode::kUnsupported);
}

// ---- methods ----------------------------------------------------------------------------------

namespace {
bool is_mutating(const Value& obj, const std::string& n) {
  if (obj.is_list()) {
    return n == "append" || n == "extend" || n == "insert" || n == "pop" || n == "remove" || n == "reverse" ||
           n == "sort" || n == "clear";
  }
  if (obj.is_dict()) return n == "update" || n == "pop" || n == "setdefault" || n == "clear" || n == "popitem";
  return false;
}

bool prefix_match(const std::string& s, const Value& p, bool start) {
  auto one = [&](const Value& x) {
    const std::string t = str_arg(x, start ? "startswith arg" : "endswith arg");
    if (t.size() > s.size()) return false;
    return start ? s.compare(0, t.size(), t) == 0 : s.compare(s.size() - t.size(), t.size(), t) == 0;
  };
  if (p.is_list() && p.as_list().is_tuple) {
    for (const auto& x : p.as_list().items)
      if (one(x)) return true;
    return false;
  }
  if (!p.is_string()) {
    if (p.is_undefined()) fail_undefined(p);
    fail(fmt::format("{} first arg must be str or a tuple of str, not {}", start ? "startswith" : "endswith",
                     p.type_name()));
  }
  return one(p);
}

Value string_method(const std::string& s, const std::string& n, const CallArgs& a) {
  if (n == "strip") return Value(py_strip(s, arg(a, 0, "chars", Value::none()), true, true));
  if (n == "lstrip") return Value(py_strip(s, arg(a, 0, "chars", Value::none()), true, false));
  if (n == "rstrip") return Value(py_strip(s, arg(a, 0, "chars", Value::none()), false, true));
  if (n == "split" || n == "rsplit") {
    return Value::list(py_split(s, arg(a, 0, "sep", Value::none()),
                                int_arg(arg(a, 1, "maxsplit", Value(-1)), "maxsplit"), n == "rsplit"));
  }
  if (n == "splitlines") {
    std::vector<Value> out;
    for (auto& l : splitlines(s)) out.emplace_back(std::move(l));
    return Value::list(std::move(out));
  }
  if (n == "startswith") return Value(prefix_match(s, arg(a, 0, "prefix"), true));
  if (n == "endswith") return Value(prefix_match(s, arg(a, 0, "suffix"), false));
  if (n == "replace") {
    return Value(py_replace(s, str_arg(arg(a, 0, "old"), "replace arg"), str_arg(arg(a, 1, "new"), "replace arg"),
                            int_arg(arg(a, 2, "count", Value(-1)), "count")));
  }
  if (n == "upper") return Value(upper(s));
  if (n == "lower") return Value(lower(s));
  if (n == "title") return Value(py_title(s));
  if (n == "capitalize") return Value(capitalize(s));
  if (n == "find" || n == "rfind" || n == "index" || n == "rindex") {
    const std::string sub = str_arg(arg(a, 0, "sub"), "substring");
    const size_t p = n[0] == 'r' ? s.rfind(sub) : s.find(sub);
    if (p == std::string::npos) {
      if (n == "index" || n == "rindex") fail("substring not found");
      return Value(-1);
    }
    return Value(cp_index(s, p));
  }
  if (n == "count") {
    const std::string sub = str_arg(arg(a, 0, "sub"), "substring");
    if (sub.empty()) return Value(static_cast<int64_t>(codepoint_count(s) + 1));
    int64_t c = 0;
    for (size_t p = s.find(sub); p != std::string::npos; p = s.find(sub, p + sub.size())) ++c;
    return Value(c);
  }
  if (n == "join") {
    std::string out;
    bool first = true;
    for (const auto& item : py_iterate(arg(a, 0, "iterable"))) {
      if (!item.is_string()) fail(fmt::format("sequence item: expected str instance, {} found", item.type_name()));
      if (!first) out += s;
      first = false;
      out += item.as_string();
    }
    return Value(std::move(out));
  }
  if (n == "removeprefix" || n == "removesuffix") {
    const std::string t = str_arg(arg(a, 0, "affix"), "affix");
    if (n == "removeprefix" && s.compare(0, t.size(), t) == 0) return Value(s.substr(t.size()));
    if (n == "removesuffix" && !t.empty() && s.size() >= t.size() && s.compare(s.size() - t.size(), t.size(), t) == 0)
      return Value(s.substr(0, s.size() - t.size()));
    return Value(s);
  }
  if (n == "isdigit" || n == "isalpha" || n == "isalnum" || n == "isspace") {
    if (s.empty()) return Value(false);
    for (size_t i = 0; i < s.size(); ++i) {
      const auto c = static_cast<unsigned char>(s[i]);
      size_t len;
      const bool ok = n == "isdigit"   ? std::isdigit(c) != 0
                      : n == "isalpha" ? std::isalpha(c) != 0
                      : n == "isalnum" ? std::isalnum(c) != 0
                                       : is_py_space(s, i, &len);
      if (!ok) return Value(false);
    }
    return Value(true);
  }
  if (n == "islower") return Value(islower_or_upper(s, true));
  if (n == "isupper") return Value(islower_or_upper(s, false));
  if (n == "format") return Value(py_str_format(s, a));
  fail(fmt::format("'str' object has no attribute '{}'", n));
}

const char* const kStringMethods[] = {"strip",      "lstrip",       "rstrip",       "split",   "rsplit",  "splitlines",
                                      "startswith", "endswith",     "replace",      "upper",   "lower",   "title",
                                      "capitalize", "find",         "rfind",        "index",   "rindex",  "count",
                                      "join",       "removeprefix", "removesuffix", "isdigit", "isalpha", "isalnum",
                                      "isspace",    "islower",      "isupper",      "format"};
}  // namespace

Value get_method(const Interpreter& in, const Value& obj, const std::string& n) {
  if (is_mutating(obj, n) && in.options().immutable) {
    fail(fmt::format("access to attribute '{}' of '{}' object is unsafe.", n, obj.type_name()));
  }
  const std::string qualified = std::string(obj.type_name()) + "." + n;
  if (obj.is_string()) {
    bool known = false;
    for (const char* m : kStringMethods) known = known || n == m;
    if (!known) return Value::undefined();
    const std::string s = obj.as_string();
    return Value::function(qualified, [s, n](const CallArgs& a) -> Result<Value> { return string_method(s, n, a); });
  }
  if (obj.is_list()) {
    const bool is_tuple = obj.as_list().is_tuple;
    if (n == "index" || n == "count") {
      return Value::function(qualified, [obj, n](const CallArgs& a) -> Result<Value> {
        const Value x = arg(a, 0, "value");
        const auto& items = obj.as_list().items;
        int64_t c = 0;
        for (size_t i = 0; i < items.size(); ++i) {
          if (!(items[i] == x)) continue;
          if (n == "index") return Value(static_cast<int64_t>(i));
          ++c;
        }
        if (n == "index") fail(fmt::format("{} is not in list", x.repr()));
        return Value(c);
      });
    }
    if (is_tuple) return Value::undefined();
    if (n == "append" || n == "extend" || n == "insert" || n == "pop" || n == "remove" || n == "reverse" ||
        n == "clear") {
      return Value::function(qualified, [obj, n](const CallArgs& a) -> Result<Value> {
        auto& items = obj.as_list().items;
        if (n == "append") {
          items.push_back(arg(a, 0, "object"));
        } else if (n == "extend") {
          for (auto& x : py_iterate(arg(a, 0, "iterable"))) items.push_back(x);
        } else if (n == "insert") {
          int64_t i = int_arg(arg(a, 0, "index"), "index");
          const int64_t size = static_cast<int64_t>(items.size());
          if (i < 0) i = std::max<int64_t>(0, i + size);
          items.insert(items.begin() + std::min(i, size), arg(a, 1, "object"));
        } else if (n == "pop") {
          if (items.empty()) fail("pop from empty list");
          int64_t i = int_arg(arg(a, 0, "index", Value(-1)), "index");
          const int64_t size = static_cast<int64_t>(items.size());
          if (i < 0) i += size;
          if (i < 0 || i >= size) fail("pop index out of range");
          Value r = items[static_cast<size_t>(i)];
          items.erase(items.begin() + i);
          return r;
        } else if (n == "remove") {
          auto it = std::find(items.begin(), items.end(), arg(a, 0, "value"));
          if (it == items.end()) fail("list.remove(x): x not in list");
          items.erase(it);
        } else if (n == "reverse") {
          std::reverse(items.begin(), items.end());
        } else {
          items.clear();
        }
        return Value::none();
      });
    }
    return Value::undefined();
  }
  if (obj.is_dict() && !obj.as_dict().is_namespace) {
    if (n == "items" || n == "keys" || n == "values") {
      return Value::function(qualified, [obj, n](const CallArgs&) -> Result<Value> {
        std::vector<Value> out;
        for (const auto& kv : obj.as_dict().items) {
          out.push_back(n == "items" ? Value::tuple({kv.first, kv.second}) : n == "keys" ? kv.first : kv.second);
        }
        return Value::list(std::move(out));
      });
    }
    if (n == "get") {
      return Value::function(qualified, [obj](const CallArgs& a) -> Result<Value> {
        const Value* v = obj.as_dict().find(arg(a, 0, "key"));
        return v != nullptr ? *v : arg(a, 1, "default", Value::none());
      });
    }
    if (n == "copy") {
      return Value::function(qualified, [obj](const CallArgs&) -> Result<Value> {
        Value d = Value::dict();
        d.as_dict().items = obj.as_dict().items;
        return d;
      });
    }
    if (n == "update" || n == "pop" || n == "setdefault" || n == "clear") {
      return Value::function(qualified, [obj, n](const CallArgs& a) -> Result<Value> {
        auto& d = obj.as_dict();
        if (n == "update") {
          const Value other = arg(a, 0, "other", Value::dict());
          if (other.is_dict())
            for (const auto& kv : other.as_dict().items) d.set(kv.first, kv.second);
          for (const auto& kv : a.named) d.set(Value(kv.first), kv.second);
        } else if (n == "pop") {
          const Value key = arg(a, 0, "key");
          for (size_t i = 0; i < d.items.size(); ++i) {
            if (d.items[i].first == key) {
              Value r = d.items[i].second;
              d.items.erase(d.items.begin() + static_cast<std::ptrdiff_t>(i));
              return r;
            }
          }
          if (a.positional.size() > 1) return a.positional[1];
          fail(key.repr());
        } else if (n == "setdefault") {
          const Value key = arg(a, 0, "key");
          if (const Value* v = d.find(key)) return *v;
          d.set(key, arg(a, 1, "default", Value::none()));
          return arg(a, 1, "default", Value::none());
        } else {
          d.items.clear();
        }
        return Value::none();
      });
    }
  }
  return Value::undefined();
}

// ---- globals ----------------------------------------------------------------------------------

Value make_globals(const Options& options) {
  Value g = Value::dict();
  g.set("range", Value::function("range", [](const CallArgs& a) -> Result<Value> {
          if (a.positional.empty() || a.positional.size() > 3) fail("range expected 1 to 3 integer arguments");
          int64_t start = 0, stop, step = 1;
          if (a.positional.size() == 1) {
            stop = int_arg(a.positional[0], "range argument");
          } else {
            start = int_arg(a.positional[0], "range argument");
            stop = int_arg(a.positional[1], "range argument");
            if (a.positional.size() == 3) step = int_arg(a.positional[2], "range argument");
          }
          if (step == 0) fail("range() arg 3 must not be zero");
          std::vector<Value> out;
          for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
            if (out.size() >= 100000) {
              fail("Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
            }
            out.emplace_back(i);
          }
          return Value::list(std::move(out));
        }));
  auto make_dict = [](const CallArgs& a, bool ns) {
    Value d = Value::dict();
    d.as_dict().is_namespace = ns;
    if (!a.positional.empty()) {
      const Value& src = a.positional[0];
      if (src.is_dict()) {
        for (const auto& kv : src.as_dict().items) d.as_dict().set(kv.first, kv.second);
      } else {
        for (const auto& pair : py_iterate(src)) {
          const auto items = py_iterate(pair);
          if (items.size() != 2) fail("dictionary update sequence element has wrong length");
          d.as_dict().set(items[0], items[1]);
        }
      }
    }
    for (const auto& kv : a.named) d.as_dict().set(Value(kv.first), kv.second);
    return d;
  };
  g.set("namespace",
        Value::function("namespace", [make_dict](const CallArgs& a) -> Result<Value> { return make_dict(a, true); }));
  g.set("dict",
        Value::function("dict", [make_dict](const CallArgs& a) -> Result<Value> { return make_dict(a, false); }));
  g.set("raise_exception", Value::function("raise_exception", [](const CallArgs& a) -> Result<Value> {
          throw Error{StatusCode::kInvalidArgument, arg(a, 0, "message").str(), kNoPos, true};
        }));
  const std::optional<std::tm> now = options.now;
  g.set("strftime_now", Value::function("strftime_now", [now](const CallArgs& a) -> Result<Value> {
          const std::string f = str_arg(arg(a, 0, "format"), "format");
          std::tm tm{};
          if (now) {
            tm = *now;
          } else {
            const std::time_t t = std::time(nullptr);
            localtime_r(&t, &tm);
          }
          char buf[512];
          const size_t len = std::strftime(buf, sizeof(buf), f.c_str(), &tm);
          if (len == 0 && !f.empty()) fail("strftime_now: format too long or empty result");
          return Value(std::string(buf, len));
        }));
  g.set("joiner", Value::function("joiner", [](const CallArgs& a) -> Result<Value> {
          const std::string sep = arg(a, 0, "sep", Value(", ")).str();
          auto used = std::make_shared<bool>(false);
          return Value::function("joiner", [sep, used](const CallArgs&) -> Result<Value> {
            if (!*used) {
              *used = true;
              return Value("");
            }
            return Value(sep);
          });
        }));
  return g;
}

}  // namespace moesh::jinja
