// JSON Schema subset -> node graph -> byte matcher (json_grammar.h).
#include "moesh/text/json_grammar.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <bitset>
#include <cctype>
#include <cmath>
#include <limits>
#include <map>

namespace moesh {

using ojson = nlohmann::ordered_json;

struct JsonGrammar {
  enum Kind : uint8_t { kObject, kArray, kString, kNumber, kInteger, kLiterals, kUnion, kRef };
  struct Node {
    Kind kind = kLiterals;
    // kObject: declared properties in order (key as its JSON text, value node) and which are
    // required; free_keys: any string keys whose values match `additional`.
    std::vector<std::pair<std::string, int32_t>> props;
    std::vector<bool> required;
    bool free_keys = false;
    int32_t additional = -1;
    // kArray
    int32_t items = -1;
    int64_t min_items = 0, max_items = std::numeric_limits<int64_t>::max();
    // kString
    int64_t min_len = 0, max_len = std::numeric_limits<int64_t>::max();
    // kNumber / kInteger
    double lo = -INFINITY, hi = INFINITY;
    // kLiterals: compact JSON texts
    std::vector<std::string> literals;
    // kUnion: branches with disjoint first bytes; kRef: the target (resolved after compiling)
    std::vector<int32_t> alts;
    int32_t target = -1;
    std::string ref;
    std::bitset<256> first;  // bytes a value of this node can start with
  };
  std::vector<Node> nodes;
  int32_t root = 0;

  const Node& at(int32_t i) const {
    const Node* n = &nodes[static_cast<size_t>(i)];
    while (n->kind == kRef) n = &nodes[static_cast<size_t>(n->target)];
    return *n;
  }
  int32_t resolve(int32_t i) const {
    while (nodes[static_cast<size_t>(i)].kind == kRef) i = nodes[static_cast<size_t>(i)].target;
    return i;
  }
};

namespace {

using G = JsonGrammar;
constexpr int kMaxDigits = 18;
constexpr size_t kMaxCandidates = 64;  // properties of one object / values of one enum

class Compiler {
 public:
  explicit Compiler(const ojson& root) : root_(root) {}

  Result<std::shared_ptr<const JsonGrammar>> run() {
    auto g = std::make_shared<JsonGrammar>();
    g_ = g.get();
    MOESH_ASSIGN_OR_RETURN(g->root, compile(root_, "schema", 0));
    // $refs: every target compiled once, then first-byte sets to a fixed point (recursion).
    // (Compiling a target may add more refs; the loop reaches them too.)
    for (size_t i = 0; i < g->nodes.size(); ++i) {
      if (g->nodes[i].kind != G::kRef || g->nodes[i].target >= 0) continue;
      MOESH_RETURN_IF_ERROR(resolve_ref(static_cast<int32_t>(i)));
    }
    for (size_t i = 0; i < g->nodes.size(); ++i) {
      size_t hop = i, n = 0;
      while (g->nodes[hop].kind == G::kRef && n++ <= g->nodes.size()) hop = static_cast<size_t>(g->nodes[hop].target);
      if (g->nodes[hop].kind == G::kRef) {
        return make_error(StatusCode::kInvalidArgument, "{}.$ref: '{}' only refers to itself", paths_[i],
                          g->nodes[i].ref);
      }
    }
    for (bool changed = true; changed;) {
      changed = false;
      for (G::Node& n : g->nodes) {
        std::bitset<256> f = n.first;
        if (n.kind == G::kRef) f |= g->nodes[static_cast<size_t>(n.target)].first;
        if (n.kind == G::kUnion)
          for (int32_t a : n.alts) f |= g->nodes[static_cast<size_t>(a)].first;
        if (f != n.first) {
          n.first = f;
          changed = true;
        }
      }
    }
    for (size_t i = 0; i < g->nodes.size(); ++i) {
      const G::Node& n = g->nodes[i];
      if (n.kind != G::kUnion) continue;
      std::bitset<256> seen;
      for (int32_t a : n.alts) {
        const auto& f = g->nodes[static_cast<size_t>(a)].first;
        if ((seen & f).any()) {
          return make_error(StatusCode::kUnsupported,
                            "{}: anyOf/oneOf/type branches that can begin with the same character are not supported "
                            "(e.g. two object schemas); each branch must start differently (object, array, string, "
                            "number, true/false, null)",
                            paths_[i]);
        }
        seen |= f;
      }
      if (seen.none()) return make_error(StatusCode::kInvalidArgument, "{}: no value can match", paths_[i]);
    }
    return std::shared_ptr<const JsonGrammar>(std::move(g));
  }

 private:
  int32_t add(G::Node n, const std::string& path) {
    g_->nodes.push_back(std::move(n));
    paths_.push_back(path);
    return static_cast<int32_t>(g_->nodes.size() - 1);
  }

  static std::bitset<256> bytes_of(std::string_view s) {
    std::bitset<256> b;
    for (unsigned char c : s) b.set(c);
    return b;
  }

  int32_t literals(std::vector<std::string> lits, const std::string& path) {
    G::Node n;
    n.kind = G::kLiterals;
    for (const std::string& l : lits) n.first.set(static_cast<unsigned char>(l[0]));
    n.literals = std::move(lits);
    return add(std::move(n), path);
  }

  Result<int32_t> any_value(const std::string& path) {
    if (any_ >= 0) return any_;
    G::Node u;
    u.kind = G::kUnion;
    any_ = add(u, path);
    G::Node obj;
    obj.kind = G::kObject;
    obj.free_keys = true;
    obj.additional = any_;
    obj.first.set('{');
    G::Node arr;
    arr.kind = G::kArray;
    arr.items = any_;
    arr.first.set('[');
    G::Node str;
    str.kind = G::kString;
    str.first.set('"');
    G::Node num;
    num.kind = G::kNumber;
    num.first = bytes_of("-0123456789");
    std::vector<int32_t> alts = {add(obj, path), add(arr, path), add(str, path), add(num, path),
                                 literals({"true", "false", "null"}, path)};
    g_->nodes[static_cast<size_t>(any_)].alts = std::move(alts);
    return any_;
  }

  Result<double> number_field(const ojson& s, const char* key, const std::string& path) {
    const ojson& v = s[key];
    if (!v.is_number()) return make_error(StatusCode::kInvalidArgument, "{}.{}: must be a number", path, key);
    return v.get<double>();
  }

  Result<int64_t> count_field(const ojson& s, const char* key, const std::string& path) {
    const ojson& v = s[key];
    if (!v.is_number_integer() || v.get<int64_t>() < 0) {
      return make_error(StatusCode::kInvalidArgument, "{}.{}: must be a non-negative integer", path, key);
    }
    return v.get<int64_t>();
  }

  Result<int32_t> typed(const std::string& type, const ojson& s, const std::string& path, int depth) {
    G::Node n;
    if (type == "null") return literals({"null"}, path);
    if (type == "boolean") return literals({"true", "false"}, path);
    if (type == "string") {
      n.kind = G::kString;
      n.first.set('"');
      if (s.contains("minLength")) {
        MOESH_ASSIGN_OR_RETURN(n.min_len, count_field(s, "minLength", path));
      }
      if (s.contains("maxLength")) {
        MOESH_ASSIGN_OR_RETURN(n.max_len, count_field(s, "maxLength", path));
      }
      if (n.min_len > n.max_len) return make_error(StatusCode::kInvalidArgument, "{}: minLength > maxLength", path);
      return add(std::move(n), path);
    }
    if (type == "number" || type == "integer") {
      n.kind = type == "integer" ? G::kInteger : G::kNumber;
      if (s.contains("minimum")) {
        MOESH_ASSIGN_OR_RETURN(n.lo, number_field(s, "minimum", path));
      }
      if (s.contains("maximum")) {
        MOESH_ASSIGN_OR_RETURN(n.hi, number_field(s, "maximum", path));
      }
      if (n.kind == G::kInteger) {
        n.lo = std::ceil(n.lo);
        n.hi = std::floor(n.hi);
      }
      if (n.lo > n.hi) return make_error(StatusCode::kInvalidArgument, "{}: minimum > maximum", path);
      if (n.lo < 0) n.first.set('-');
      for (char d = '0'; d <= '9'; ++d) n.first.set(static_cast<unsigned char>(d));
      return add(std::move(n), path);
    }
    if (type == "array") {
      n.kind = G::kArray;
      n.first.set('[');
      if (s.contains("minItems")) {
        MOESH_ASSIGN_OR_RETURN(n.min_items, count_field(s, "minItems", path));
      }
      if (s.contains("maxItems")) {
        MOESH_ASSIGN_OR_RETURN(n.max_items, count_field(s, "maxItems", path));
      }
      if (n.min_items > n.max_items) return make_error(StatusCode::kInvalidArgument, "{}: minItems > maxItems", path);
      if (s.contains("items")) {
        MOESH_ASSIGN_OR_RETURN(n.items, compile(s["items"], path + ".items", depth + 1));
      } else {
        MOESH_ASSIGN_OR_RETURN(n.items, any_value(path + ".items"));
      }
      return add(std::move(n), path);
    }
    if (type == "object") {
      n.kind = G::kObject;
      n.first.set('{');
      std::vector<std::string> req;
      if (s.contains("required")) {
        if (!s["required"].is_array()) {
          return make_error(StatusCode::kInvalidArgument, "{}.required: must be an array of names", path);
        }
        for (const ojson& r : s["required"]) {
          if (!r.is_string()) return make_error(StatusCode::kInvalidArgument, "{}.required: names are strings", path);
          req.push_back(r.get<std::string>());
        }
      }
      if (s.contains("properties")) {
        const ojson& props = s["properties"];
        if (!props.is_object()) return make_error(StatusCode::kInvalidArgument, "{}.properties: not an object", path);
        if (props.size() > kMaxCandidates) {
          return make_error(StatusCode::kUnsupported, "{}.properties: more than {} properties", path, kMaxCandidates);
        }
        for (auto it = props.begin(); it != props.end(); ++it) {
          MOESH_ASSIGN_OR_RETURN(int32_t v, compile(it.value(), path + ".properties." + it.key(), depth + 1));
          n.props.emplace_back(ojson(it.key()).dump(), v);
          n.required.push_back(std::find(req.begin(), req.end(), it.key()) != req.end());
        }
      }
      for (const std::string& r : req) {
        bool found = false;
        for (const auto& [k, v] : n.props) found = found || k == ojson(r).dump();
        if (!found) {
          return make_error(StatusCode::kUnsupported, "{}.required: '{}' has no entry in properties", path, r);
        }
      }
      const bool has_props = !n.props.empty();
      if (s.contains("additionalProperties")) {
        const ojson& ap = s["additionalProperties"];
        if (ap.is_boolean() && !ap.get<bool>()) {
          n.free_keys = false;
        } else if (has_props) {
          // Extra keys are allowed but never needed: only the declared ones are written.
          n.free_keys = false;
        } else {
          n.free_keys = true;
          if (ap.is_boolean()) {
            MOESH_ASSIGN_OR_RETURN(n.additional, any_value(path + ".additionalProperties"));
          } else {
            MOESH_ASSIGN_OR_RETURN(n.additional, compile(ap, path + ".additionalProperties", depth + 1));
          }
        }
      } else if (!has_props) {
        n.free_keys = true;
        MOESH_ASSIGN_OR_RETURN(n.additional, any_value(path));
      }
      return add(std::move(n), path);
    }
    return make_error(StatusCode::kUnsupported, "{}.type: '{}' is not a JSON Schema type", path, type);
  }

  Result<int32_t> compile(const ojson& s, const std::string& path, int depth) {
    if (depth > 64) return make_error(StatusCode::kUnsupported, "{}: schema nests deeper than 64", path);
    if (s.is_boolean()) {
      if (s.get<bool>()) return any_value(path);
      return make_error(StatusCode::kInvalidArgument, "{}: the schema false matches nothing", path);
    }
    if (!s.is_object()) return make_error(StatusCode::kInvalidArgument, "{}: a schema must be an object", path);
    static const char* const kIgnored[] = {"title",     "description", "default",    "examples",   "$schema",
                                           "$id",       "$comment",    "strict",     "deprecated", "readOnly",
                                           "writeOnly", "$defs",       "definitions"};
    static const char* const kUsed[] = {"type",      "properties", "required", "additionalProperties",
                                        "items",     "minItems",   "maxItems", "minLength",
                                        "maxLength", "minimum",    "maximum",  "enum",
                                        "const",     "anyOf",      "oneOf",    "$ref"};
    for (auto it = s.begin(); it != s.end(); ++it) {
      const std::string& k = it.key();
      bool known = false;
      for (const char* x : kIgnored) known = known || k == x;
      for (const char* x : kUsed) known = known || k == x;
      if (!known) {
        return make_error(StatusCode::kUnsupported,
                          "{}.{}: the keyword '{}' is not supported by constrained decoding (supported: type, "
                          "properties, required, additionalProperties, items, minItems, maxItems, minLength, "
                          "maxLength, minimum, maximum, enum, const, anyOf, oneOf, $ref)",
                          path, k, k);
      }
    }
    if (s.contains("$ref")) {
      if (!s["$ref"].is_string()) return make_error(StatusCode::kInvalidArgument, "{}.$ref: not a string", path);
      G::Node n;
      n.kind = G::kRef;
      n.ref = s["$ref"].get<std::string>();
      return add(std::move(n), path);
    }
    if (s.contains("const") || s.contains("enum")) {
      std::vector<std::string> lits;
      if (s.contains("const")) lits.push_back(s["const"].dump());
      if (s.contains("enum")) {
        if (!s["enum"].is_array() || s["enum"].empty()) {
          return make_error(StatusCode::kInvalidArgument, "{}.enum: must be a non-empty array", path);
        }
        if (s["enum"].size() > kMaxCandidates) {
          return make_error(StatusCode::kUnsupported, "{}.enum: more than {} values", path, kMaxCandidates);
        }
        for (const ojson& v : s["enum"]) lits.push_back(v.dump());
      }
      return literals(std::move(lits), path);
    }
    for (const char* key : {"anyOf", "oneOf"}) {
      if (!s.contains(key)) continue;
      const ojson& alts = s[key];
      if (!alts.is_array() || alts.empty()) {
        return make_error(StatusCode::kInvalidArgument, "{}.{}: must be a non-empty array", path, key);
      }
      G::Node u;
      u.kind = G::kUnion;
      for (size_t i = 0; i < alts.size(); ++i) {
        MOESH_ASSIGN_OR_RETURN(int32_t a, compile(alts[i], fmt::format("{}.{}[{}]", path, key, i), depth + 1));
        u.alts.push_back(a);
      }
      return add(std::move(u), path);
    }
    if (!s.contains("type")) return any_value(path);
    const ojson& t = s["type"];
    if (t.is_string()) return typed(t.get<std::string>(), s, path, depth);
    if (!t.is_array() || t.empty()) {
      return make_error(StatusCode::kInvalidArgument, "{}.type: a type name or a non-empty list of them", path);
    }
    G::Node u;
    u.kind = G::kUnion;
    for (const ojson& one : t) {
      if (!one.is_string()) return make_error(StatusCode::kInvalidArgument, "{}.type: names are strings", path);
      MOESH_ASSIGN_OR_RETURN(int32_t a, typed(one.get<std::string>(), s, path, depth));
      u.alts.push_back(a);
    }
    return add(std::move(u), path);
  }

  Status resolve_ref(int32_t i) {
    const std::string ref = g_->nodes[static_cast<size_t>(i)].ref;
    auto it = ref_nodes_.find(ref);
    if (it == ref_nodes_.end()) {
      std::string section, name;
      for (const char* prefix : {"#/$defs/", "#/definitions/"}) {
        const std::string p = prefix;
        if (ref.compare(0, p.size(), p) == 0) {
          section = p.substr(2, p.size() - 3);
          name = ref.substr(p.size());
        }
      }
      if (section.empty() || !root_.is_object() || !root_.contains(section) || !root_[section].is_object() ||
          !root_[section].contains(name)) {
        return make_error(StatusCode::kUnsupported, "{}.$ref: '{}' does not name #/$defs/NAME or #/definitions/NAME",
                          paths_[static_cast<size_t>(i)], ref);
      }
      MOESH_ASSIGN_OR_RETURN(int32_t target, compile(root_[section][name], "schema." + section + "." + name, 1));
      it = ref_nodes_.emplace(ref, target).first;
    }
    g_->nodes[static_cast<size_t>(i)].target = it->second;
    return Status::ok();
  }

  const ojson& root_;
  JsonGrammar* g_ = nullptr;
  std::vector<std::string> paths_;
  std::map<std::string, int32_t> ref_nodes_;
  int32_t any_ = -1;
};

// Frame kinds and phases.
enum FrameKind : uint8_t { kFObject, kFArray, kFString, kFNumber, kFLiteral };
// Object phases
enum : uint8_t { kObjOpen, kObjKey, kObjColon, kObjValue, kObjAfter, kObjComma };
// Array phases
enum : uint8_t { kArrOpen, kArrAfter, kArrComma };
// String phases
enum : uint8_t { kStrBody, kStrEscape, kStrHex };
// Number phases
enum : uint8_t { kNumMinus, kNumZero, kNumInt, kNumDot, kNumFrac, kNumExp, kNumExpSign, kNumExpDigits };

bool is_ws(unsigned char c) {
  return c == ' ' || c == '\n' || c == '\t' || c == '\r';
}

}  // namespace

Result<std::shared_ptr<const JsonGrammar>> compile_json_schema(const nlohmann::ordered_json& schema) {
  return Compiler(schema).run();
}

std::shared_ptr<const JsonGrammar> json_object_grammar() {
  static const std::shared_ptr<const JsonGrammar> g = [] {
    auto r = compile_json_schema(ojson{{"type", "object"}});
    return *r;
  }();
  return g;
}

JsonMatcher::JsonMatcher(std::shared_ptr<const JsonGrammar> g) : g_(std::move(g)) {
  stack_.reserve(16);
}

namespace {

// Whether an integer part |v| with `digits` digits (and sign) can still end inside [lo, hi]:
// the value may stop here or gain up to kMaxDigits - digits more digits (and, for numbers, a
// fraction below one unit of the last digit).
bool int_part_viable(double v, int digits, bool neg, double lo, double hi, bool fraction) {
  double scale = 1;
  for (int k = 0; digits + k <= kMaxDigits; ++k, scale *= 10) {
    double a = v * scale, b = v * scale + scale - (fraction ? 0 : 1);
    if (k == 0) b = fraction ? v + 1 : v;
    double s_lo = neg ? -b : a, s_hi = neg ? -a : b;
    if (s_hi >= lo && s_lo <= hi) return true;
    if (v == 0) break;  // "0" takes no more digits
  }
  return false;
}

}  // namespace

bool JsonMatcher::push_value(int32_t node_index, unsigned char c) {
  if (stack_.size() >= static_cast<size_t>(kMaxNesting)) return false;
  const int32_t ni = g_->resolve(node_index);
  const JsonGrammar::Node& n = g_->nodes[static_cast<size_t>(ni)];
  if (!n.first.test(c)) return false;
  Frame f;
  f.node = ni;
  switch (n.kind) {
    case JsonGrammar::kUnion:
      for (int32_t a : n.alts) {
        if (g_->at(a).first.test(c)) return push_value(a, c);
      }
      return false;
    case JsonGrammar::kObject:
      f.kind = kFObject;
      f.phase = kObjOpen;
      stack_.push_back(f);
      return true;
    case JsonGrammar::kArray:
      f.kind = kFArray;
      f.phase = kArrOpen;
      stack_.push_back(f);
      return true;
    case JsonGrammar::kString:
      f.kind = kFString;
      f.phase = kStrBody;
      stack_.push_back(f);
      return true;
    case JsonGrammar::kNumber:
    case JsonGrammar::kInteger: {
      const bool frac = n.kind == JsonGrammar::kNumber;
      f.kind = kFNumber;
      if (c == '-') {
        if (!int_part_viable(0, 0, true, n.lo, n.hi, frac) && !(n.lo <= -1)) return false;
        f.phase = kNumMinus;
        f.mask = 1;
      } else {
        const int d = c - '0';
        if (!int_part_viable(d, 1, false, n.lo, n.hi, frac)) return false;
        f.phase = d == 0 ? kNumZero : kNumInt;
        f.value = d;
        f.count = 1;
      }
      stack_.push_back(f);
      return true;
    }
    case JsonGrammar::kLiterals: {
      f.kind = kFLiteral;
      for (size_t i = 0; i < n.literals.size(); ++i) {
        if (static_cast<unsigned char>(n.literals[i][0]) == c) f.mask |= uint64_t{1} << i;
      }
      if (f.mask == 0) return false;
      f.count = 1;
      stack_.push_back(f);
      return true;
    }
    case JsonGrammar::kRef:
      break;
  }
  return false;
}

bool JsonMatcher::close_value() {
  stack_.pop_back();
  if (stack_.empty()) {
    done_ = true;
    return true;
  }
  Frame& p = stack_.back();
  if (p.kind == kFObject) {
    if (p.phase == kObjKey) {
      p.phase = kObjColon;  // a free key (a string value) ended
    } else {
      p.phase = kObjAfter;
      ++p.count;
    }
  } else if (p.kind == kFArray) {
    p.phase = kArrAfter;
    ++p.count;
  }
  return true;
}

namespace {

// Number frames: whether it may end here, and its value within the node's bounds.
bool number_can_end(const JsonMatcher::Frame& f, const JsonGrammar::Node& n) {
  if (f.phase != kNumZero && f.phase != kNumInt && f.phase != kNumFrac && f.phase != kNumExpDigits) return false;
  if (f.phase == kNumExpDigits) return std::isinf(n.lo) && std::isinf(n.hi);
  const double frac = f.phase == kNumFrac ? static_cast<double>(f.aux) / std::pow(10.0, f.count) : 0.0;
  double v = static_cast<double>(f.value) + frac;
  if (f.mask & 1) v = -v;
  return v >= n.lo && v <= n.hi;
}

}  // namespace

bool JsonMatcher::step(unsigned char c) {
  if (done_) return false;
  if (stack_.empty()) return push_value(g_->root, c);
  Frame& f = stack_.back();
  static const JsonGrammar::Node kKeyNode;  // free object keys: plain strings
  const JsonGrammar::Node& n = f.node >= 0 ? g_->nodes[static_cast<size_t>(f.node)] : kKeyNode;
  switch (f.kind) {
    case kFString: {
      if (f.phase == kStrEscape) {
        if (c == 'u') {
          f.phase = kStrHex;
          f.aux = 4;
          return true;
        }
        if (c != '"' && c != '\\' && c != '/' && c != 'b' && c != 'f' && c != 'n' && c != 'r' && c != 't') {
          return false;
        }
        f.phase = kStrBody;
        ++f.count;
        return true;
      }
      if (f.phase == kStrHex) {
        if (!std::isxdigit(c)) return false;
        // No surrogate halves (\uD800-\uDFFF): strict JSON parsers refuse unpaired ones.
        if (f.aux == 4 && (c == 'd' || c == 'D')) f.value = 1;
        if (f.aux == 3 && f.value == 1 &&
            std::string_view("89abcdefABCDEF").find(static_cast<char>(c)) != std::string_view::npos) {
          return false;
        }
        if (--f.aux == 0) {
          f.phase = kStrBody;
          f.value = 0;
          ++f.count;
        }
        return true;
      }
      // Body: UTF-8 continuation bytes in the range the lead byte allows (value = lo | hi << 8).
      if (f.aux > 0) {
        const int lo = static_cast<int>(f.value & 0xFF), hi = static_cast<int>(f.value >> 8);
        if (c < lo || c > hi) return false;
        --f.aux;
        f.value = 0x80 | (0xBF << 8);
        return true;
      }
      const int64_t max_len = n.max_len, min_len = n.min_len;
      if (c == '"') {
        if (f.count < min_len) return false;
        return close_value();
      }
      if (f.count >= max_len) return false;
      if (c == '\\') {
        f.phase = kStrEscape;
        return true;
      }
      if (c < 0x20 || c == 0x7F) return false;
      if (c < 0x80) {
        ++f.count;
        return true;
      }
      int lo = 0x80, hi = 0xBF, more = 0;
      if (c >= 0xC2 && c <= 0xDF) {
        more = 1;
      } else if (c >= 0xE0 && c <= 0xEF) {
        more = 2;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;
      } else if (c >= 0xF0 && c <= 0xF4) {
        more = 3;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
      } else {
        return false;
      }
      f.aux = more;
      f.value = lo | (hi << 8);
      ++f.count;
      return true;
    }
    case kFNumber: {
      const bool integer = n.kind == JsonGrammar::kInteger;
      const bool bounded = !std::isinf(n.lo) || !std::isinf(n.hi);
      const bool digit = c >= '0' && c <= '9';
      switch (f.phase) {
        case kNumMinus:
          if (!digit) return false;
          if (!int_part_viable(c - '0', 1, true, n.lo, n.hi, !integer)) return false;
          f.value = c - '0';
          f.count = 1;
          f.phase = c == '0' ? kNumZero : kNumInt;
          return true;
        case kNumInt:
          if (digit && f.count < kMaxDigits) {
            const int64_t v = f.value * 10 + (c - '0');
            if (!int_part_viable(static_cast<double>(v), f.count + 1, f.mask & 1, n.lo, n.hi, !integer)) return false;
            f.value = v;
            ++f.count;
            return true;
          }
          [[fallthrough]];
        case kNumZero:
          if (!integer && c == '.') {
            f.phase = kNumDot;
            f.count = 0;
            f.aux = 0;
            return true;
          }
          if (!integer && !bounded && (c == 'e' || c == 'E')) {
            f.phase = kNumExp;
            f.count = 0;
            return true;
          }
          break;
        case kNumDot:
        case kNumFrac:
          if (digit && f.count < kMaxDigits) {
            if (f.phase == kNumFrac && f.count >= 9 && bounded) break;  // fraction kept exact in aux
            f.phase = kNumFrac;
            if (f.count < 9) f.aux = f.aux * 10 + (c - '0');
            ++f.count;
            return true;
          }
          if (f.phase == kNumDot) return false;
          if (!bounded && (c == 'e' || c == 'E')) {
            f.phase = kNumExp;
            f.count = 0;
            return true;
          }
          break;
        case kNumExp:
          if (c == '+' || c == '-') {
            f.phase = kNumExpSign;
            return true;
          }
          [[fallthrough]];
        case kNumExpSign:
        case kNumExpDigits:
          if (digit && f.count < 2) {
            f.phase = kNumExpDigits;
            ++f.count;
            return true;
          }
          if (f.phase != kNumExpDigits) return false;
          break;
      }
      // Not part of the number: it ends here (if it can) and the byte goes to the parent.
      if (!number_can_end(f, n)) return false;
      close_value();
      if (done_) return false;  // a top-level value takes nothing after it
      return step(c);
    }
    case kFLiteral: {
      uint64_t alive = 0;
      bool ended = false;
      for (size_t i = 0; i < n.literals.size(); ++i) {
        if (!(f.mask >> i & 1)) continue;
        const std::string& l = n.literals[i];
        if (static_cast<size_t>(f.count) < l.size() && static_cast<unsigned char>(l[f.count]) == c) {
          alive |= uint64_t{1} << i;
        }
        if (static_cast<size_t>(f.count) == l.size()) ended = true;
      }
      if (alive != 0) {
        f.mask = alive;
        ++f.count;
        return true;
      }
      if (!ended) return false;
      close_value();
      if (done_) return false;
      return step(c);
    }
    case kFArray: {
      if (is_ws(c)) {
        if (!take_ws(c)) return false;
        return true;
      }
      ws_run_ = 0;
      ws_mode_ = 0;
      if (f.phase == kArrOpen || f.phase == kArrAfter) {
        if (c == ']' && f.count >= n.min_items) return close_value();
        if (f.phase == kArrAfter) {
          if (c != ',' || f.count >= n.max_items) return false;
          f.phase = kArrComma;
          return true;
        }
        if (f.count >= n.max_items) return false;
      }
      return push_value(n.items, c);
    }
    case kFObject: {
      if (f.phase == kObjKey && !n.free_keys) {
        // Declared keys: the candidates alive (mask) after `count` bytes of their JSON text.
        uint64_t alive = 0;
        int32_t ended = -1;
        for (size_t i = 0; i < n.props.size(); ++i) {
          if (!(f.mask >> i & 1)) continue;
          const std::string& k = n.props[i].first;
          if (static_cast<size_t>(f.count) < k.size() && static_cast<unsigned char>(k[f.count]) == c) {
            alive |= uint64_t{1} << i;
            if (static_cast<size_t>(f.count) + 1 == k.size()) ended = static_cast<int32_t>(i);
          }
        }
        if (alive == 0) return false;
        ++f.count;
        f.mask = alive;
        if (ended >= 0) {  // keys are quoted, so no key is a prefix of another
          f.phase = kObjColon;
          f.aux = ended + 1;
          f.value = ended;
        }
        return true;
      }
      if (is_ws(c)) {
        if (!take_ws(c)) return false;
        return true;
      }
      ws_run_ = 0;
      ws_mode_ = 0;
      // The declared properties from aux on that may come next: up to and including the first
      // required one.
      auto candidates = [&]() {
        uint64_t m = 0;
        for (size_t i = static_cast<size_t>(f.aux); i < n.props.size(); ++i) {
          m |= uint64_t{1} << i;
          if (n.required[i]) break;
        }
        return m;
      };
      auto all_required_written = [&]() {
        for (size_t i = static_cast<size_t>(f.aux); i < n.props.size(); ++i)
          if (n.required[i]) return false;
        return true;
      };
      switch (f.phase) {
        case kObjOpen:
        case kObjComma:
        case kObjAfter:
          if (f.phase != kObjComma && c == '}' && (n.free_keys || all_required_written())) return close_value();
          if (f.phase == kObjAfter) {
            if (c != ',') return false;
            if (!n.free_keys && candidates() == 0) return false;
            f.phase = kObjComma;
            return true;
          }
          if (c != '"') return false;
          if (n.free_keys) {
            f.phase = kObjKey;
            Frame key;
            key.kind = kFString;
            key.phase = kStrBody;
            key.node = -1;
            stack_.push_back(key);
            return true;
          }
          f.mask = candidates();
          if (f.mask == 0) return false;
          f.phase = kObjKey;
          f.count = 1;
          return true;
        case kObjColon:
          if (c != ':') return false;
          f.phase = kObjValue;
          return true;
        case kObjValue:
          return push_value(n.free_keys ? n.additional : n.props[static_cast<size_t>(f.value)].second, c);
        default:
          return false;
      }
    }
  }
  return false;
}

bool JsonMatcher::take_ws(unsigned char c) {
  // llama.cpp's json-schema `space` rule: nothing, one space, or one or two newlines then at
  // most kMaxIndent spaces / tabs.
  switch (ws_mode_) {
    case 0:
      if (c == ' ') {
        ws_mode_ = 1;
        return true;
      }
      if (c == '\n') {
        ws_mode_ = 2;
        ws_run_ = 1;
        return true;
      }
      return false;
    case 2:
      if (c == '\n' && ws_run_ < 2) {
        ++ws_run_;
        return true;
      }
      if (c == ' ' || c == '\t') {
        ws_mode_ = 3;
        ws_run_ = 1;
        return true;
      }
      return false;
    case 3:
      if ((c == ' ' || c == '\t') && ws_run_ < kMaxIndent) {
        ++ws_run_;
        return true;
      }
      return false;
    default:
      return false;
  }
}

bool JsonMatcher::feed(unsigned char c) {
  return step(c);
}

bool JsonMatcher::feed(std::string_view bytes) {
  for (unsigned char c : bytes) {
    if (!step(c)) return false;
  }
  return true;
}

bool JsonMatcher::complete() const {
  if (done_) return true;
  if (stack_.size() != 1) return false;
  const Frame& f = stack_.back();
  const JsonGrammar::Node& n = g_->nodes[static_cast<size_t>(f.node)];
  if (f.kind == kFNumber) return number_can_end(f, n);
  if (f.kind == kFLiteral) {
    for (size_t i = 0; i < n.literals.size(); ++i) {
      if ((f.mask >> i & 1) && static_cast<size_t>(f.count) == n.literals[i].size()) return true;
    }
  }
  return false;
}

JsonTokenMask::JsonTokenMask(const Tokenizer& tok, bool control_text) {
  const int32_t n = tok.n_vocab();
  pieces_.resize(static_cast<size_t>(n));
  eog_.assign(static_cast<size_t>(n), 0);
  for (int32_t t = 0; t < n; ++t) {
    eog_[static_cast<size_t>(t)] = tok.is_eog(t) ? 1 : 0;
    const TokenType type = tok.token_type(t);
    if (type == TokenType::kUnknown || type == TokenType::kUnused) continue;
    if (type == TokenType::kControl && !control_text) continue;
    pieces_[static_cast<size_t>(t)] = tok.token_to_piece(t, type == TokenType::kControl);
  }
}

}  // namespace moesh
