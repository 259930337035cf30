// A Jinja2 interpreter for chat templates: runs the `tokenizer.chat_template` source a GGUF carries
// instead of re-implementing each template family in C++.
//
// It covers the subset of Jinja2 that real chat templates use, with Jinja2's (Python's) semantics,
// as Hugging Face transformers renders them in `apply_chat_template`:
//   ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
// plus its globals `raise_exception(msg)` and `strftime_now(fmt)` and its `tojson` filter
// (json.dumps with ensure_ascii=False: ", " / ": " separators, insertion order, optional indent).
//
//   statements   {{ }} {% %} {# #}, whitespace control (-/+), if/elif/else, for (with `if` filter,
//                `else`, loop.*, break/continue), set (also `ns.attr` and block set), macro,
//                call, filter blocks, raw, generation (HF's no-op block)
//   expressions  literals, lists, tuples, dicts, attribute/subscript/slice access, arithmetic,
//                ~, comparisons, and/or/not, in, `is` tests, `a if c else b`, filters, calls,
//                string/dict/list methods, range, namespace, dict
//
// Values follow Python: dicts keep insertion order, lists and dicts are shared by reference,
// a missing attribute or key is *undefined* (renders as "", is falsy, fails when used as a
// number or indexed further), and mixing types the way Python refuses ("a" + 1) is an error.
// Strings are UTF-8; length, indexing and slicing count code points. Case mapping (upper, lower,
// title, capitalize) changes ASCII letters only.
//
// Taint (what makes chat rendering injection-safe): a string may carry the byte ranges of its text
// that came from untrusted input (mark the input with taint_strings()). `~`, string `+`, output
// and macro bodies keep the ranges exact; any other operation that makes a new string from a
// tainted value (a filter, a method, slicing, `%`, `*`, iterating a string) taints the whole new
// string, and strings inside a container a builtin returns from tainted inputs are tainted whole
// too. Template::render_tracked() returns the output with its tainted ranges. The rule errs one
// way only: template text may end up tainted (then tokenized as plain text), input text never
// ends up untainted.
//
// Errors: every failure is a Status naming the template position as line:column — a syntax error
// (kInvalidArgument), an unknown filter/test/statement (kUnsupported), a runtime type error or a
// template's `raise_exception("...")` (kInvalidArgument, the message quoted). No exception leaves
// this API.
#pragma once

#include <cstdint>
#include <ctime>
#include <functional>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "moesh/util/status.h"

namespace moesh::jinja {

class Value;

// Bytes [begin, end) of a string.
struct TextRange {
  size_t begin = 0;
  size_t end = 0;
  friend bool operator==(const TextRange& a, const TextRange& b) { return a.begin == b.begin && a.end == b.end; }
};

// Arguments of a call from a template: f(a, b, key=c).
struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> named;
};

// A function a template can call (globals, methods, macros). An error Status becomes a template
// error at the call's position.
using NativeFunction = std::function<Result<Value>(const CallArgs&)>;

// A JSON-like dynamic value with Python semantics. Copying a list, dict or function copies a
// reference (as assignment does in Python); strings, numbers and undefined copy by value.
class Value {
 public:
  enum class Kind : uint8_t { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict, kFunction };

  struct List {
    std::vector<Value> items;
    bool is_tuple = false;  // renders as (a, b); immutable
  };
  // Insertion-ordered mapping. Keys are strings in practice (JSON) but may be any hashable value
  // a template writes ({1: "a"}); lookup compares keys with Python equality (1 == 1.0 == True).
  struct Dict {
    std::vector<std::pair<Value, Value>> items;
    bool is_namespace = false;  // namespace(): the one object `{% set ns.x = ... %}` may change
    const Value* find(const Value& key) const;
    Value* find(const Value& key);
    void set(Value key, Value value);  // replaces in place or appends
  };
  struct Function {
    std::string name;
    NativeFunction fn;
    bool is_macro = false;  // a template's macro (or caller): its result carries exact taint ranges
  };
  struct Undefined {
    std::string hint;  // why it is undefined, for the error when it is used ("'dict object' has no attribute 'x'")
  };

  Value() = default;                                 // undefined
  Value(bool b) : v_(b) {}                           // NOLINT: implicit like a Python literal
  Value(int v) : v_(static_cast<int64_t>(v)) {}      // NOLINT
  Value(int64_t v) : v_(v) {}                        // NOLINT
  Value(double v) : v_(v) {}                         // NOLINT
  Value(std::string s) : v_(std::move(s)) {}         // NOLINT
  Value(std::string_view s) : v_(std::string(s)) {}  // NOLINT
  Value(const char* s) : v_(std::string(s)) {}       // NOLINT

  static Value undefined(std::string hint = {}) { return Value(Undefined{std::move(hint)}); }
  static Value none() { return Value(nullptr); }
  static Value list(std::vector<Value> items = {});
  static Value tuple(std::vector<Value> items);
  static Value dict();
  static Value function(std::string name, NativeFunction fn, bool is_macro = false);
  // JSON null/bool/number/string/array/object → none/bool/int or float/string/list/dict, in the
  // json's key order. Parse requests with ordered_json: nlohmann::json sorts object keys, so a
  // template's `tools | tojson` would no longer match what transformers writes.
  static Value from_json(const nlohmann::ordered_json& j);
  static Value from_json(const nlohmann::json& j);

  Kind kind() const { return static_cast<Kind>(v_.index()); }
  bool is_undefined() const { return kind() == Kind::kUndefined; }
  bool is_none() const { return kind() == Kind::kNone; }
  bool is_bool() const { return kind() == Kind::kBool; }
  bool is_int() const { return kind() == Kind::kInt; }
  bool is_float() const { return kind() == Kind::kFloat; }
  bool is_number() const { return is_int() || is_float() || is_bool(); }
  bool is_string() const { return kind() == Kind::kString; }
  bool is_list() const { return kind() == Kind::kList; }
  bool is_dict() const { return kind() == Kind::kDict; }
  bool is_function() const { return kind() == Kind::kFunction; }

  // Accessors; calling one on the wrong kind is a bug (asserts).
  bool as_bool() const { return std::get<bool>(v_); }
  int64_t as_int() const { return std::get<int64_t>(v_); }
  double as_float() const { return std::get<double>(v_); }
  const std::string& as_string() const { return std::get<std::string>(v_); }
  List& as_list() const { return *std::get<std::shared_ptr<List>>(v_); }
  Dict& as_dict() const { return *std::get<std::shared_ptr<Dict>>(v_); }
  const Function& as_function() const { return *std::get<std::shared_ptr<Function>>(v_); }
  const std::string& undefined_hint() const { return std::get<Undefined>(v_).hint; }
  // Numeric value of an int, float or bool.
  double to_double() const;

  // Dict convenience: sets a key (a dict only).
  Value& set(std::string key, Value value);
  // List convenience: appends (a list only).
  Value& push_back(Value value);

  bool truthy() const;            // Python bool(): empty/zero/none/undefined are false
  std::string str() const;        // Python str(): what {{ value }} prints ("None", "True", "1.5", "['a', 1]")
  std::string repr() const;       // Python repr() ("'a'" for a string)
  const char* type_name() const;  // Python's type name ("str", "int", "dict", "NoneType", ...)

  // Taint (see the top of this file). A string's ranges are sorted, disjoint, non-empty and
  // within the string; other kinds are tainted as a whole or not at all.
  bool tainted() const { return taint_ != nullptr; }
  const std::vector<TextRange>& taint_ranges() const;    // empty when untainted (or not a string)
  void set_taint_ranges(std::vector<TextRange> ranges);  // a string: sorts and merges; empty clears
  void taint_whole();                                    // a string: all its bytes (none if empty); others: flagged
  void clear_taint() { taint_.reset(); }

  // Python ==: numbers compare by value across int/float/bool, lists and dicts by content.
  friend bool operator==(const Value& a, const Value& b);

 private:
  using Storage = std::variant<Undefined, std::nullptr_t, bool, int64_t, double, std::string, std::shared_ptr<List>,
                               std::shared_ptr<Dict>, std::shared_ptr<Function>>;
  explicit Value(Storage v) : v_(std::move(v)) {}
  explicit Value(Undefined u) : v_(std::move(u)) {}
  explicit Value(std::nullptr_t) : v_(nullptr) {}
  Storage v_;
  std::shared_ptr<const std::vector<TextRange>> taint_;
};

// Marks every string in `v` (list items, dict keys and values, recursively) tainted as a whole:
// what a caller does to the untrusted parts of a context before rendering.
void taint_strings(Value& v);
// True when `v` is a tainted string or holds one (recursively).
bool deep_tainted(const Value& v);

// json.dumps(value, ensure_ascii=False, indent=indent, separators=..., sort_keys=...) as Python
// writes it: what HF's `tojson` filter returns. indent < 0 means None (one line, ", " and ": ");
// indent >= 0 puts one item per line with "," and ": ". Undefined and functions are errors.
struct JsonOptions {
  int indent = -1;
  std::optional<std::pair<std::string, std::string>> separators;  // (item, key) separators
  bool sort_keys = false;
  bool ensure_ascii = false;  // true: non-ASCII as \uXXXX escapes (UTF-16 surrogate pairs)
};
Result<std::string> to_json(const Value& value, const JsonOptions& options = {});

// Environment settings. The defaults are HF transformers'.
struct Options {
  bool trim_blocks = true;             // drop the first newline after a block or comment tag
  bool lstrip_blocks = true;           // drop spaces/tabs before a block or comment tag at the start of a line
  bool keep_trailing_newline = false;  // Jinja2 drops one trailing newline of the source by default
  // The ImmutableSandboxedEnvironment refuses methods that change a list or dict (list.append,
  // dict.update, ...); false allows list.append/extend/pop/insert and dict.update/pop/setdefault.
  bool immutable = true;
  // What strftime_now() formats; empty: the local time when it is called.
  std::optional<std::tm> now;
  // Limits that keep a hostile template from running forever or exhausting memory.
  size_t max_output_bytes = size_t{64} << 20;
  int max_call_depth = 256;
};

// A parsed template. Parsing checks the syntax; rendering runs it over a context (a dict whose keys
// are the template's variables: messages, tools, add_generation_prompt, bos_token, ...).
class Template {
 public:
  static Result<Template> parse(std::string_view source, const Options& options = {});
  Result<std::string> render(const Value& context) const;
  // The same rendering plus the byte ranges of the output that came from tainted strings
  // (sorted, disjoint, non-empty). render() returns rendered.text of this.
  struct Rendered {
    std::string text;
    std::vector<TextRange> tainted;
  };
  Result<Rendered> render_tracked(const Value& context) const;

  struct Impl;  // the parsed program (src/text/jinja_internal.h)

 private:
  explicit Template(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
};

}  // namespace moesh::jinja
