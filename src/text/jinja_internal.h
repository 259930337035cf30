// Internals of the Jinja interpreter (include/moesh/text/jinja.h): the syntax tree the parser
// builds, the error the evaluator throws, and the Python-semantics helpers the files share.
//
// Inside the interpreter a failure is thrown as jinja::Error and caught at Template::render /
// Template::parse, which return it as a Status: nearly every operation of a dynamically typed
// evaluator can fail, and threading a Result through each one would bury the semantics. No
// exception leaves the public API.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "moesh/text/jinja.h"

namespace moesh::jinja {

// A template error at a byte offset of the (newline-normalised) source; kNoPos: position not
// known yet (the evaluator adds the position of the expression being evaluated).
constexpr size_t kNoPos = static_cast<size_t>(-1);
struct Error {
  StatusCode code = StatusCode::kInvalidArgument;
  std::string msg;
  size_t pos = kNoPos;
  bool raised = false;  // from raise_exception(): reported with the template's own message
};
[[noreturn]] void fail(std::string msg, size_t pos = kNoPos, StatusCode code = StatusCode::kInvalidArgument);

// ---- syntax tree ----------------------------------------------------------------------------

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

enum class ExprKind {
  kLiteral,  // literal
  kName,     // name
  kList,     // args
  kTuple,    // args
  kDict,     // args: key, value, key, value...
  kGetAttr,  // args[0].name
  kGetItem,  // args[0][args[1]]
  kSlice,    // args[0][args[1]:args[2]:args[3]] (null parts omitted)
  kCall,     // args[0](args[1..], kwargs)
  kFilter,   // args[0] | name(args[1..], kwargs); args[0] null in a filter block
  kTest,     // args[0] is [not] name(args[1..], kwargs)
  kUnary,    // name: "-", "+", "not"
  kBinary,   // name: "+", "-", "*", "/", "//", "%", "**", "~"
  kAnd,      // args[0] and args[1]
  kOr,       // args[0] or args[1]
  kCompare,  // args[0] ops[0] args[1] ops[1] args[2] ... (Python chaining)
  kCond,     // args[0] if args[1] else args[2] (args[2] null: undefined)
};

struct Expr {
  ExprKind kind;
  size_t pos = 0;
  std::string name;
  Value literal;
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  std::vector<std::string> ops;
  bool negated = false;
};

struct Stmt;
using Body = std::vector<std::unique_ptr<Stmt>>;

enum class StmtKind {
  kText,         // text
  kOutput,       // {{ expr }}
  kIf,           // branches (cond null: else)
  kFor,          // for target in expr [if cond] body [else else_body]
  kSet,          // set target = expr
  kSetBlock,     // set target %}body{% endset (expr: optional filter applied to the body)
  kMacro,        // macro name(params) body
  kCallBlock,    // call(params) expr %}body{% endcall: body is `caller`
  kFilterBlock,  // filter expr %}body{% endfilter
  kBreak,
  kContinue,
};

struct Stmt {
  StmtKind kind;
  size_t pos = 0;
  std::string text;  // kText; macro name
  ExprPtr target, expr, cond;
  Body body, else_body;
  std::vector<std::pair<ExprPtr, Body>> branches;
  std::vector<std::pair<std::string, ExprPtr>> params;  // macro/caller parameters and defaults
};

}  // namespace moesh::jinja

namespace moesh::jinja {

struct Template::Impl {
  std::string source;  // newline-normalised, for line:column
  Options options;
  Body body;
};

// Parses a template (lexer and parser, jinja_parse.cpp). Throws Error.
void parse_template(Template::Impl& impl);

// "line 3:14" of a byte offset in the source.
std::string position_text(std::string_view source, size_t pos);

// ---- Python semantics (jinja_value.cpp) -----------------------------------------------------

// UTF-8 code point boundaries: offsets of each code point's first byte, plus s.size() at the end.
std::vector<size_t> codepoint_offsets(std::string_view s);
size_t codepoint_count(std::string_view s);
bool is_py_space(std::string_view s, size_t pos, size_t* len);  // Python str.isspace() at a code point
std::string py_float_repr(double d);
std::string py_string_repr(std::string_view s);
// Python slice indices of a sequence of n items (PySlice_AdjustIndices); returns the indices.
std::vector<int64_t> slice_indices(int64_t n, const Value& start, const Value& stop, const Value& step);
// <, <=, >, >= (TypeError between unordered types): negative, zero or positive.
int py_compare(const Value& a, const Value& b, const char* op = "<");
// Python's `a op b` for + - * / // % ** and Jinja's ~.
Value py_binary(const std::string& op, const Value& a, const Value& b);
// `item in container`.
bool py_contains(const Value& container, const Value& item);
// Python iteration: list items, dict keys, string code points; undefined is empty. TypeError else.
std::vector<Value> py_iterate(const Value& v);
// len(): TypeError for numbers, none, functions.
int64_t py_len(const Value& v);
// Undefined used where a value is needed (arithmetic, attribute of undefined...): UndefinedError.
[[noreturn]] void fail_undefined(const Value& v);
// "a" % args (printf-style formatting with %s %r %d %i %f %x %%).
std::string py_percent_format(const std::string& fmt, const Value& args);

// ---- taint (jinja_value.cpp) ----------------------------------------------------------------

// Taints whole every string in `v` (recursively) that carries no ranges yet, and flags functions:
// the result of a builtin that was given tainted input.
void taint_new_strings(Value& v);
// Appends `src` shifted by `offset` to `dst`, merging touching ranges.
void append_tainted(std::vector<TextRange>& dst, const std::vector<TextRange>& src, size_t offset);
// The tainted ranges of `v`'s printed text (str(), text_len bytes): a string's own ranges; any
// other value all of it when it holds a tainted string.
std::vector<TextRange> text_taint(const Value& v, size_t text_len);

// ---- builtins (jinja_builtins.cpp) ----------------------------------------------------------

class Interpreter;
// Applies a filter; throws Error (kUnsupported for an unknown filter).
Value apply_filter(Interpreter& in, const std::string& name, const Value& subject, const CallArgs& args);
// Runs a test (`is name`); throws Error (kUnsupported for an unknown test).
bool apply_test(Interpreter& in, const std::string& name, const Value& subject, const CallArgs& args);
bool has_test(const std::string& name);
// A bound method of a string, list or dict (s.strip, d.items, ...); undefined when there is none.
Value get_method(const Interpreter& in, const Value& object, const std::string& name);
// The globals every template sees (range, namespace, dict, raise_exception, strftime_now, ...).
Value make_globals(const Options& options);

// Calls a callable value (function, macro or bound method); throws Error.
Value call_value(const Value& fn, const CallArgs& args);
// Attribute access the way the sandbox does it: obj.name (dict key, method, loop variables).
Value get_attr(const Interpreter& in, const Value& obj, const std::string& name);
// obj[key] (key lookup first, then attribute).
Value get_item(const Interpreter& in, const Value& obj, const Value& key);

// Rendered text with the byte ranges that came from tainted strings.
struct Output {
  std::string text;
  std::vector<TextRange> tainted;
};

// The evaluator (jinja_eval.cpp); builtins call back into it for filters that take tests.
class Interpreter {
 public:
  struct Scope;
  explicit Interpreter(const Template::Impl& impl) : impl_(impl) {}
  ~Interpreter();
  Interpreter(const Interpreter&) = delete;
  Interpreter& operator=(const Interpreter&) = delete;
  const Options& options() const { return impl_.options; }
  Output render(const Value& context);  // throws Error

 private:
  enum class Flow { kNormal, kBreak, kContinue };
  Flow exec_body(const Body& body, const std::shared_ptr<Scope>& scope, Output& out);
  Flow exec(const Stmt& s, const std::shared_ptr<Scope>& scope, Output& out);
  void exec_for(const Stmt& s, const std::shared_ptr<Scope>& scope, Output& out);
  Value eval(const Expr& e, const std::shared_ptr<Scope>& scope);
  Value eval_inner(const Expr& e, const std::shared_ptr<Scope>& scope);
  CallArgs eval_args(const Expr& e, const std::shared_ptr<Scope>& scope, size_t first);
  void assign(const Expr& target, const Value& v, const std::shared_ptr<Scope>& scope);
  Value make_macro(const Stmt& s, const std::shared_ptr<Scope>& scope, const Stmt* caller_of);
  void append(Output& out, std::string_view text) const;  // template text
  void append_value(Output& out, const Value& v) const;   // {{ v }}: its text and taint

  const Template::Impl& impl_;
  int depth_ = 0;
  // Macros are values that call back into this interpreter; one kept past the render (a list
  // it was appended to) finds this false and fails instead of touching a dead interpreter.
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
  std::vector<std::shared_ptr<Scope>> macro_scopes_;  // scopes macros close over (weakly), kept until the end
};

}  // namespace moesh::jinja
