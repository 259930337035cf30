// jinja::Value and the Python semantics of its operations: str()/repr(), ==, ordering,
// arithmetic, `in`, iteration, len(), slicing and json.dumps.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "text/jinja_internal.h"

namespace moesh::jinja {

// ---- construction and access ----------------------------------------------------------------

Value Value::list(std::vector<Value> items) {
  auto l = std::make_shared<List>();
  l->items = std::move(items);
  return Value(Storage(std::move(l)));
}

Value Value::tuple(std::vector<Value> items) {
  auto l = std::make_shared<List>();
  l->items = std::move(items);
  l->is_tuple = true;
  return Value(Storage(std::move(l)));
}

Value Value::dict() {
  return Value(Storage(std::make_shared<Dict>()));
}

Value Value::function(std::string name, NativeFunction fn, bool is_macro) {
  return Value(Storage(std::make_shared<Function>(Function{std::move(name), std::move(fn), is_macro})));
}

// ---- taint ----------------------------------------------------------------------------------

namespace {
// Non-strings are tainted whole: their taint_ points here.
const std::shared_ptr<const std::vector<TextRange>>& whole_flag() {
  static const auto flag = std::make_shared<const std::vector<TextRange>>();
  return flag;
}
// Containers nest at most this deep in a walk; deeper (or cyclic, which only a mutable
// environment can build) is treated as tainted, the safe side.
constexpr int kMaxTaintDepth = 64;

bool deep_tainted_at(const Value& v, int depth) {
  if (v.tainted()) return true;
  if (!v.is_list() && !v.is_dict()) return false;
  if (depth >= kMaxTaintDepth) return true;
  if (v.is_list()) {
    for (const Value& x : v.as_list().items)
      if (deep_tainted_at(x, depth + 1)) return true;
    return false;
  }
  for (const auto& kv : v.as_dict().items)
    if (deep_tainted_at(kv.first, depth + 1) || deep_tainted_at(kv.second, depth + 1)) return true;
  return false;
}

// only_new: leave strings that already carry ranges alone (they are existing values with exact
// ranges); else every string becomes tainted whole.
void mark_strings(Value& v, bool only_new, int depth) {
  if (depth >= kMaxTaintDepth) return;
  if (v.is_string() || v.is_function()) {
    if (!only_new || !v.tainted()) v.taint_whole();
  } else if (v.is_list()) {
    for (Value& x : v.as_list().items) mark_strings(x, only_new, depth + 1);
  } else if (v.is_dict()) {
    for (auto& kv : v.as_dict().items) {
      mark_strings(kv.first, only_new, depth + 1);
      mark_strings(kv.second, only_new, depth + 1);
    }
  }
}
}  // namespace

const std::vector<TextRange>& Value::taint_ranges() const {
  static const std::vector<TextRange> none;
  return taint_ && is_string() ? *taint_ : none;
}

void Value::set_taint_ranges(std::vector<TextRange> ranges) {
  if (!is_string()) return;
  const size_t n = as_string().size();
  std::sort(ranges.begin(), ranges.end(), [](const TextRange& a, const TextRange& b) { return a.begin < b.begin; });
  std::vector<TextRange> merged;
  for (TextRange r : ranges) {
    r.end = std::min(r.end, n);
    if (r.begin >= r.end) continue;
    if (!merged.empty() && r.begin <= merged.back().end) {
      merged.back().end = std::max(merged.back().end, r.end);
    } else {
      merged.push_back(r);
    }
  }
  if (merged.empty()) {
    taint_.reset();
  } else {
    taint_ = std::make_shared<const std::vector<TextRange>>(std::move(merged));
  }
}

void Value::taint_whole() {
  if (is_string()) {
    set_taint_ranges({TextRange{0, as_string().size()}});
  } else {
    taint_ = whole_flag();
  }
}

void taint_strings(Value& v) {
  mark_strings(v, /*only_new=*/false, 0);
}

bool deep_tainted(const Value& v) {
  return deep_tainted_at(v, 0);
}

void taint_new_strings(Value& v) {
  mark_strings(v, /*only_new=*/true, 0);
}

void append_tainted(std::vector<TextRange>& dst, const std::vector<TextRange>& src, size_t offset) {
  for (const TextRange& r : src) {
    const TextRange s{r.begin + offset, r.end + offset};
    if (s.begin >= s.end) continue;
    if (!dst.empty() && dst.back().end == s.begin) {
      dst.back().end = s.end;
    } else {
      dst.push_back(s);
    }
  }
}

std::vector<TextRange> text_taint(const Value& v, size_t text_len) {
  if (v.is_string()) return v.taint_ranges();
  if (text_len > 0 && deep_tainted(v)) return {TextRange{0, text_len}};
  return {};
}

namespace {
template <typename J>
Value value_from_json(const J& j) {
  switch (j.type()) {
    case nlohmann::json::value_t::null:
      return Value::none();
    case nlohmann::json::value_t::boolean:
      return Value(j.template get<bool>());
    case nlohmann::json::value_t::number_integer:
      return Value(j.template get<int64_t>());
    case nlohmann::json::value_t::number_unsigned:
      return Value(static_cast<int64_t>(j.template get<uint64_t>()));
    case nlohmann::json::value_t::number_float:
      return Value(j.template get<double>());
    case nlohmann::json::value_t::string:
      return Value(j.template get<std::string>());
    case nlohmann::json::value_t::array: {
      std::vector<Value> items;
      items.reserve(j.size());
      for (const auto& x : j) items.push_back(value_from_json(x));
      return Value::list(std::move(items));
    }
    case nlohmann::json::value_t::object: {
      Value d = Value::dict();
      for (auto it = j.begin(); it != j.end(); ++it)
        d.as_dict().items.emplace_back(Value(it.key()), value_from_json(it.value()));
      return d;
    }
    default:
      return Value::none();  // binary / discarded: not produced by a JSON parse
  }
}
}  // namespace

Value Value::from_json(const nlohmann::ordered_json& j) {
  return value_from_json(j);
}
Value Value::from_json(const nlohmann::json& j) {
  return value_from_json(j);
}

const Value* Value::Dict::find(const Value& key) const {
  for (const auto& kv : items)
    if (kv.first == key) return &kv.second;
  return nullptr;
}
Value* Value::Dict::find(const Value& key) {
  for (auto& kv : items)
    if (kv.first == key) return &kv.second;
  return nullptr;
}
void Value::Dict::set(Value key, Value value) {
  if (Value* v = find(key)) {
    *v = std::move(value);
  } else {
    items.emplace_back(std::move(key), std::move(value));
  }
}

double Value::to_double() const {
  if (is_int()) return static_cast<double>(as_int());
  if (is_bool()) return as_bool() ? 1.0 : 0.0;
  return as_float();
}

Value& Value::set(std::string key, Value value) {
  as_dict().set(Value(std::move(key)), std::move(value));
  return *this;
}

Value& Value::push_back(Value value) {
  as_list().items.push_back(std::move(value));
  return *this;
}

bool Value::truthy() const {
  switch (kind()) {
    case Kind::kUndefined:
    case Kind::kNone:
      return false;
    case Kind::kBool:
      return as_bool();
    case Kind::kInt:
      return as_int() != 0;
    case Kind::kFloat:
      return as_float() != 0.0;
    case Kind::kString:
      return !as_string().empty();
    case Kind::kList:
      return !as_list().items.empty();
    case Kind::kDict:
      return as_dict().is_namespace || !as_dict().items.empty();
    case Kind::kFunction:
      return true;
  }
  return false;
}

const char* Value::type_name() const {
  switch (kind()) {
    case Kind::kUndefined:
      return "Undefined";
    case Kind::kNone:
      return "NoneType";
    case Kind::kBool:
      return "bool";
    case Kind::kInt:
      return "int";
    case Kind::kFloat:
      return "float";
    case Kind::kString:
      return "str";
    case Kind::kList:
      return as_list().is_tuple ? "tuple" : "list";
    case Kind::kDict:
      return as_dict().is_namespace ? "Namespace" : "dict";
    case Kind::kFunction:
      return "function";
  }
  return "?";
}

std::string py_float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  // fmt's shortest round-trip form matches Python's repr digits; Python switches to exponent
  // notation at 1e16 and below 1e-4, and always shows a fraction or exponent.
  std::string s = fmt::format("{}", d);
  const double a = std::fabs(d);
  if (a != 0.0 && (a >= 1e16 || a < 1e-4)) {
    if (s.find('e') == std::string::npos) {
      s = fmt::format("{:e}", d);  // rare: fmt chose fixed where Python uses an exponent
    }
  }
  if (s.find_first_of(".en") == std::string::npos) s += ".0";
  return s;
}

// Code points Python's str.isprintable() rejects (escaped by repr), beyond ASCII controls.
bool py_unprintable(uint32_t cp) {
  return (cp >= 0x7F && cp <= 0xA0) || cp == 0xAD || (cp >= 0x2000 && cp <= 0x200F) || (cp >= 0x2028 && cp <= 0x202F) ||
         (cp >= 0x205F && cp <= 0x206F) || cp == 0x3000 || cp == 0xFEFF || (cp >= 0xE000 && cp <= 0xF8FF) ||
         cp == 0x1680;
}

namespace {
// Decodes the code point at s[i] (invalid bytes decode as themselves).
uint32_t decode_cp(std::string_view s, size_t i, size_t* len) {
  const auto b = static_cast<unsigned char>(s[i]);
  size_t n = b < 0x80 ? 1 : (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : (b >> 3) == 30 ? 4 : 1;
  if (i + n > s.size()) n = 1;
  uint32_t cp = n == 1 ? b : n == 2 ? (b & 0x1F) : n == 3 ? (b & 0x0F) : (b & 0x07);
  for (size_t k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
  *len = n;
  return cp;
}
}  // namespace

std::string py_string_repr(std::string_view s) {
  const bool has_single = s.find('\'') != std::string_view::npos;
  const bool has_double = s.find('"') != std::string_view::npos;
  const char q = has_single && !has_double ? '"' : '\'';
  std::string out(1, q);
  for (size_t i = 0; i < s.size();) {
    size_t n;
    const uint32_t cp = decode_cp(s, i, &n);
    if (cp == '\\') {
      out += "\\\\";
    } else if (cp == static_cast<uint32_t>(q)) {
      out += '\\';
      out += q;
    } else if (cp == '\n') {
      out += "\\n";
    } else if (cp == '\r') {
      out += "\\r";
    } else if (cp == '\t') {
      out += "\\t";
    } else if (cp < 0x20 || py_unprintable(cp)) {
      out += cp <= 0xFF ? fmt::format("\\x{:02x}", cp) : fmt::format("\\u{:04x}", cp);
    } else {
      out.append(s.substr(i, n));
    }
    i += n;
  }
  out += q;
  return out;
}

namespace {
std::string seq_repr(const Value& v) {
  const auto& l = v.as_list();
  std::string out = l.is_tuple ? "(" : "[";
  for (size_t i = 0; i < l.items.size(); ++i) {
    if (i) out += ", ";
    out += l.items[i].repr();
  }
  if (l.is_tuple && l.items.size() == 1) out += ",";
  out += l.is_tuple ? ")" : "]";
  return out;
}
}  // namespace

std::string Value::str() const {
  switch (kind()) {
    case Kind::kUndefined:
      return "";
    case Kind::kNone:
      return "None";
    case Kind::kBool:
      return as_bool() ? "True" : "False";
    case Kind::kInt:
      return std::to_string(as_int());
    case Kind::kFloat:
      return py_float_repr(as_float());
    case Kind::kString:
      return as_string();
    case Kind::kList:
      return seq_repr(*this);
    case Kind::kDict: {
      const auto& d = as_dict();
      if (d.is_namespace) return "<Namespace>";
      std::string out = "{";
      for (size_t i = 0; i < d.items.size(); ++i) {
        if (i) out += ", ";
        out += d.items[i].first.repr() + ": " + d.items[i].second.repr();
      }
      return out + "}";
    }
    case Kind::kFunction:
      return "<function " + as_function().name + ">";
  }
  return "";
}

std::string Value::repr() const {
  if (is_string()) return py_string_repr(as_string());
  if (is_undefined()) return "Undefined";
  return str();
}

bool operator==(const Value& a, const Value& b) {
  using K = Value::Kind;
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.to_double() == b.to_double();
    const int64_t x = a.is_bool() ? a.as_bool() : a.as_int();
    const int64_t y = b.is_bool() ? b.as_bool() : b.as_int();
    return x == y;
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case K::kUndefined:
    case K::kNone:
      return true;
    case K::kString:
      return a.as_string() == b.as_string();
    case K::kList: {
      const auto& x = a.as_list();
      const auto& y = b.as_list();
      if (&x == &y) return true;
      if (x.is_tuple != y.is_tuple || x.items.size() != y.items.size()) return false;
      for (size_t i = 0; i < x.items.size(); ++i)
        if (!(x.items[i] == y.items[i])) return false;
      return true;
    }
    case K::kDict: {
      const auto& x = a.as_dict();
      const auto& y = b.as_dict();
      if (&x == &y) return true;
      if (x.is_namespace || y.is_namespace || x.items.size() != y.items.size()) return false;
      for (const auto& kv : x.items) {
        const Value* o = y.find(kv.first);
        if (o == nullptr || !(*o == kv.second)) return false;
      }
      return true;
    }
    case K::kFunction:
      return &a.as_function() == &b.as_function();
    default:
      return false;
  }
}

// ---- strings ----------------------------------------------------------------------------------

std::vector<size_t> codepoint_offsets(std::string_view s) {
  std::vector<size_t> out;
  out.reserve(s.size() + 1);
  for (size_t i = 0; i < s.size();) {
    size_t n;
    decode_cp(s, i, &n);
    out.push_back(i);
    i += n;
  }
  out.push_back(s.size());
  return out;
}

size_t codepoint_count(std::string_view s) {
  size_t n = 0;
  for (size_t i = 0; i < s.size();) {
    size_t len;
    decode_cp(s, i, &len);
    i += len;
    ++n;
  }
  return n;
}

bool is_py_space(std::string_view s, size_t pos, size_t* len) {
  const uint32_t cp = decode_cp(s, pos, len);
  return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

// ---- errors -----------------------------------------------------------------------------------

void fail_undefined(const Value& v) {
  const std::string& hint = v.undefined_hint();
  fail(hint.empty() ? "value is undefined" : hint);
}

namespace {
[[noreturn]] void fail_operands(const std::string& op, const Value& a, const Value& b) {
  if (a.is_undefined()) fail_undefined(a);
  if (b.is_undefined()) fail_undefined(b);
  if (op == "+" && (a.is_string() || a.is_list()) && a.kind() != b.kind()) {
    fail(fmt::format("can only concatenate {} (not \"{}\") to {}", a.type_name(), b.type_name(), a.type_name()));
  }
  fail(fmt::format("unsupported operand type(s) for {}: '{}' and '{}'", op, a.type_name(), b.type_name()));
}

int64_t int_of(const Value& v) {
  return v.is_bool() ? (v.as_bool() ? 1 : 0) : v.as_int();
}
bool is_intlike(const Value& v) {
  return v.is_int() || v.is_bool();
}
}  // namespace

// ---- operators --------------------------------------------------------------------------------

int py_compare(const Value& a, const Value& b, const char* op) {
  if (a.is_number() && b.is_number()) {
    if (is_intlike(a) && is_intlike(b)) return int_of(a) < int_of(b) ? -1 : int_of(a) > int_of(b) ? 1 : 0;
    const double x = a.to_double(), y = b.to_double();
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (a.is_string() && b.is_string()) {
    const int c = a.as_string().compare(b.as_string());
    return c < 0 ? -1 : c > 0 ? 1 : 0;
  }
  if (a.is_list() && b.is_list() && a.as_list().is_tuple == b.as_list().is_tuple) {
    const auto& x = a.as_list().items;
    const auto& y = b.as_list().items;
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (x[i] == y[i]) continue;
      return py_compare(x[i], y[i], op);
    }
    return x.size() < y.size() ? -1 : x.size() > y.size() ? 1 : 0;
  }
  if (a.is_undefined()) fail_undefined(a);
  if (b.is_undefined()) fail_undefined(b);
  fail(fmt::format("'{}' not supported between instances of '{}' and '{}'", op, a.type_name(), b.type_name()));
}

namespace {
Value repeat(const Value& seq, int64_t n) {
  if (seq.is_string()) {
    std::string out;
    for (int64_t i = 0; i < n; ++i) out += seq.as_string();
    return Value(std::move(out));
  }
  std::vector<Value> out;
  for (int64_t i = 0; i < n; ++i) out.insert(out.end(), seq.as_list().items.begin(), seq.as_list().items.end());
  return seq.as_list().is_tuple ? Value::tuple(std::move(out)) : Value::list(std::move(out));
}
}  // namespace

Value py_binary(const std::string& op, const Value& a, const Value& b) {
  if (op == "~" || (op == "+" && a.is_string() && b.is_string())) {
    // Concatenation keeps each side's tainted ranges exactly.
    std::string sa = a.str(), sb = b.str();
    std::vector<TextRange> ranges = text_taint(a, sa.size());
    append_tainted(ranges, text_taint(b, sb.size()), sa.size());
    Value r(sa + sb);
    r.set_taint_ranges(std::move(ranges));
    return r;
  }
  const bool nums = a.is_number() && b.is_number();
  const bool ints = nums && is_intlike(a) && is_intlike(b);
  if (op == "+") {
    if (ints) return Value(int_of(a) + int_of(b));
    if (nums) return Value(a.to_double() + b.to_double());
    if (a.is_string() && b.is_string()) return Value(a.as_string() + b.as_string());
    if (a.is_list() && b.is_list() && a.as_list().is_tuple == b.as_list().is_tuple) {
      std::vector<Value> out = a.as_list().items;
      out.insert(out.end(), b.as_list().items.begin(), b.as_list().items.end());
      return a.as_list().is_tuple ? Value::tuple(std::move(out)) : Value::list(std::move(out));
    }
  } else if (op == "-") {
    if (ints) return Value(int_of(a) - int_of(b));
    if (nums) return Value(a.to_double() - b.to_double());
  } else if (op == "*") {
    if (ints) return Value(int_of(a) * int_of(b));
    if (nums) return Value(a.to_double() * b.to_double());
    if ((a.is_string() || a.is_list()) && is_intlike(b)) return repeat(a, int_of(b));
    if ((b.is_string() || b.is_list()) && is_intlike(a)) return repeat(b, int_of(a));
  } else if (op == "/") {
    if (nums) {
      if (b.to_double() == 0.0) fail("division by zero");
      return Value(a.to_double() / b.to_double());
    }
  } else if (op == "//") {
    if (ints) {
      if (int_of(b) == 0) fail("integer division or modulo by zero");
      const int64_t x = int_of(a), y = int_of(b);
      int64_t q = x / y;
      if ((x % y != 0) && ((x < 0) != (y < 0))) --q;
      return Value(q);
    }
    if (nums) {
      if (b.to_double() == 0.0) fail("float floor division by zero");
      return Value(std::floor(a.to_double() / b.to_double()));
    }
  } else if (op == "%") {
    if (a.is_string()) return Value(py_percent_format(a.as_string(), b));
    if (ints) {
      if (int_of(b) == 0) fail("integer division or modulo by zero");
      const int64_t x = int_of(a), y = int_of(b);
      int64_t r = x % y;
      if (r != 0 && ((r < 0) != (y < 0))) r += y;
      return Value(r);
    }
    if (nums) {
      const double y = b.to_double();
      if (y == 0.0) fail("float modulo");
      double r = std::fmod(a.to_double(), y);
      if (r != 0.0 && ((r < 0) != (y < 0))) r += y;
      return Value(r);
    }
  } else if (op == "**") {
    if (ints && int_of(b) >= 0) {
      int64_t r = 1, base = int_of(a);
      for (int64_t e = int_of(b); e > 0; e >>= 1) {
        if (e & 1) r *= base;
        base *= base;
      }
      return Value(r);
    }
    if (nums) return Value(std::pow(a.to_double(), b.to_double()));
  }
  fail_operands(op, a, b);
}

bool py_contains(const Value& container, const Value& item) {
  switch (container.kind()) {
    case Value::Kind::kString:
      if (!item.is_string()) {
        if (item.is_undefined()) fail_undefined(item);
        fail(fmt::format("'in <string>' requires string as left operand, not {}", item.type_name()));
      }
      return container.as_string().find(item.as_string()) != std::string::npos;
    case Value::Kind::kList:
      for (const auto& x : container.as_list().items)
        if (x == item) return true;
      return false;
    case Value::Kind::kDict:
      if (container.as_dict().is_namespace) break;
      return container.as_dict().find(item) != nullptr;
    case Value::Kind::kUndefined:
      return false;
    default:
      break;
  }
  fail(fmt::format("argument of type '{}' is not iterable", container.type_name()));
}

std::vector<Value> py_iterate(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kList:
      return v.as_list().items;
    case Value::Kind::kDict: {
      if (v.as_dict().is_namespace) break;
      std::vector<Value> keys;
      for (const auto& kv : v.as_dict().items) keys.push_back(kv.first);
      return keys;
    }
    case Value::Kind::kString: {
      const std::string& s = v.as_string();
      const auto off = codepoint_offsets(s);
      std::vector<Value> out;
      for (size_t i = 0; i + 1 < off.size(); ++i) out.emplace_back(s.substr(off[i], off[i + 1] - off[i]));
      return out;
    }
    case Value::Kind::kUndefined:
      return {};
    default:
      break;
  }
  fail(fmt::format("'{}' object is not iterable", v.type_name()));
}

int64_t py_len(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kString:
      return static_cast<int64_t>(codepoint_count(v.as_string()));
    case Value::Kind::kList:
      return static_cast<int64_t>(v.as_list().items.size());
    case Value::Kind::kDict:
      if (v.as_dict().is_namespace) break;
      return static_cast<int64_t>(v.as_dict().items.size());
    case Value::Kind::kUndefined:
      return 0;
    default:
      break;
  }
  fail(fmt::format("object of type '{}' has no len()", v.type_name()));
}

std::vector<int64_t> slice_indices(int64_t n, const Value& start, const Value& stop, const Value& step) {
  auto as_index = [](const Value& v, const char* what) -> std::optional<int64_t> {
    if (v.is_none() || v.is_undefined()) return std::nullopt;
    if (!is_intlike(v)) fail(fmt::format("slice {} must be an integer or None, not {}", what, v.type_name()));
    return int_of(v);
  };
  const int64_t st = as_index(step, "step").value_or(1);
  if (st == 0) fail("slice step cannot be zero");
  auto adjust = [&](std::optional<int64_t> x, int64_t def) {
    if (!x) return def;
    int64_t i = *x;
    if (i < 0) {
      i += n;
      if (i < 0) i = st < 0 ? -1 : 0;
    } else if (i >= n) {
      i = st < 0 ? n - 1 : n;
    }
    return i;
  };
  const int64_t lo = adjust(as_index(start, "start"), st < 0 ? n - 1 : 0);
  const int64_t hi = adjust(as_index(stop, "stop"), st < 0 ? -1 : n);
  std::vector<int64_t> out;
  if (st > 0) {
    for (int64_t i = lo; i < hi; i += st) out.push_back(i);
  } else {
    for (int64_t i = lo; i > hi; i += st) out.push_back(i);
  }
  return out;
}

std::string py_percent_format(const std::string& f, const Value& args) {
  std::vector<Value> list;
  if (args.is_list() && args.as_list().is_tuple) {
    list = args.as_list().items;
  } else {
    list.push_back(args);
  }
  std::string out;
  size_t next = 0;
  for (size_t i = 0; i < f.size(); ++i) {
    if (f[i] != '%') {
      out += f[i];
      continue;
    }
    if (++i >= f.size()) fail("incomplete format");
    std::string spec;
    while (i < f.size() && std::strchr("-+ #0123456789.", f[i]) != nullptr) spec += f[i++];
    if (i >= f.size()) fail("incomplete format");
    const char c = f[i];
    if (c == '%') {
      out += '%';
      continue;
    }
    if (next >= list.size()) fail("not enough arguments for format string");
    const Value& v = list[next++];
    switch (c) {
      case 's':
        out += fmt::format(
            fmt::runtime("{:" + std::string(spec.find('-') == 0 ? "<" + spec.substr(1) : ">" + spec) + "}"), v.str());
        break;
      case 'r':
        out += v.repr();
        break;
      case 'd':
      case 'i':
        if (!v.is_number()) fail(fmt::format("%{} format: a real number is required, not {}", c, v.type_name()));
        out += std::to_string(v.is_float() ? static_cast<int64_t>(v.as_float()) : int_of(v));
        break;
      case 'f':
      case 'x':
      case 'X':
      case 'e':
      case 'g':
        if (!v.is_number()) fail(fmt::format("must be real number, not {}", v.type_name()));
        if (c == 'x' || c == 'X') {
          out += fmt::format(fmt::runtime("{:" + spec + c + "}"),
                             int_of(v.is_float() ? Value(static_cast<int64_t>(v.as_float())) : v));
        } else {
          out += fmt::format(fmt::runtime("{:" + (spec.empty() && c == 'f' ? std::string(".6") : spec) + c + "}"),
                             v.to_double());
        }
        break;
      default:
        fail(fmt::format("unsupported format character '{}'", c));
    }
  }
  if (next < list.size()) fail("not all arguments converted during string formatting");
  return out;
}

// ---- json.dumps -------------------------------------------------------------------------------

namespace {
void json_string(std::string& out, std::string_view s, bool ensure_ascii) {
  out += '"';
  for (size_t i = 0; i < s.size(); ++i) {
    const char ch = s[i];
    const auto c = static_cast<unsigned char>(ch);
    if (ensure_ascii && c >= 0x80) {
      size_t n;
      uint32_t cp = decode_cp(s, i, &n);
      i += n - 1;
      if (cp >= 0x10000) {
        cp -= 0x10000;
        out += fmt::format("\\u{:04x}\\u{:04x}", 0xD800 + (cp >> 10), 0xDC00 + (cp & 0x3FF));
      } else {
        out += fmt::format("\\u{:04x}", cp);
      }
      continue;
    }
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (c < 0x20) {
          out += fmt::format("\\u{:04x}", c);
        } else {
          out += ch;
        }
    }
  }
  out += '"';
}

std::string json_float(double d) {
  if (std::isnan(d)) return "NaN";
  if (std::isinf(d)) return d > 0 ? "Infinity" : "-Infinity";
  return py_float_repr(d);
}

struct JsonWriter {
  const JsonOptions& opt;
  std::string item_sep, key_sep;
  std::string out;

  void newline(int level) {
    out += '\n';
    out.append(static_cast<size_t>(opt.indent) * level, ' ');
  }

  std::string key_text(const Value& k) {
    switch (k.kind()) {
      case Value::Kind::kString:
        return k.as_string();
      case Value::Kind::kInt:
        return std::to_string(k.as_int());
      case Value::Kind::kFloat:
        return json_float(k.as_float());
      case Value::Kind::kBool:
        return k.as_bool() ? "true" : "false";
      case Value::Kind::kNone:
        return "null";
      default:
        fail(fmt::format("keys must be str, int, float, bool or None, not {}", k.type_name()));
    }
  }

  void write(const Value& v, int level) {
    if (level > 512) fail("maximum recursion depth exceeded in tojson");
    switch (v.kind()) {
      case Value::Kind::kNone:
        out += "null";
        return;
      case Value::Kind::kBool:
        out += v.as_bool() ? "true" : "false";
        return;
      case Value::Kind::kInt:
        out += std::to_string(v.as_int());
        return;
      case Value::Kind::kFloat:
        out += json_float(v.as_float());
        return;
      case Value::Kind::kString:
        json_string(out, v.as_string(), opt.ensure_ascii);
        return;
      case Value::Kind::kList: {
        const auto& items = v.as_list().items;
        if (items.empty()) {
          out += "[]";
          return;
        }
        out += '[';
        for (size_t i = 0; i < items.size(); ++i) {
          if (i) out += item_sep;
          if (opt.indent >= 0) newline(level + 1);
          write(items[i], level + 1);
        }
        if (opt.indent >= 0) newline(level);
        out += ']';
        return;
      }
      case Value::Kind::kDict: {
        const auto& d = v.as_dict();
        if (d.is_namespace) break;
        if (d.items.empty()) {
          out += "{}";
          return;
        }
        std::vector<std::pair<std::string, const Value*>> items;
        for (const auto& kv : d.items) items.emplace_back(key_text(kv.first), &kv.second);
        if (opt.sort_keys) {
          std::stable_sort(items.begin(), items.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
        }
        out += '{';
        for (size_t i = 0; i < items.size(); ++i) {
          if (i) out += item_sep;
          if (opt.indent >= 0) newline(level + 1);
          json_string(out, items[i].first, opt.ensure_ascii);
          out += key_sep;
          write(*items[i].second, level + 1);
        }
        if (opt.indent >= 0) newline(level);
        out += '}';
        return;
      }
      default:
        break;
    }
    fail(fmt::format("Object of type {} is not JSON serializable", v.type_name()));
  }
};
}  // namespace

Result<std::string> to_json(const Value& value, const JsonOptions& options) {
  JsonWriter w{options, options.indent >= 0 ? "," : ", ", ": ", {}};
  if (options.separators) {
    w.item_sep = options.separators->first;
    w.key_sep = options.separators->second;
  }
  try {
    w.write(value, 0);
  } catch (const Error& e) {
    return Status(StatusCode::kInvalidArgument, e.msg);
  }
  return std::move(w.out);
}

}  // namespace moesh::jinja
