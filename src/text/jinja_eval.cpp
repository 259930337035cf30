// The Jinja evaluator: statements, expressions, scopes, macros and loops, and the public
// Template API that turns thrown errors into Status values.
//
// Scopes follow what Jinja2 compiles to: a for loop's body gets a fresh scope per iteration
// (a `set` inside it is gone at the next iteration and after the loop, reads fall through to the
// enclosing scope), `if` opens none, a macro call gets a scope over the one it was defined in.
// namespace() objects are the way out of a loop, as in Jinja2.
#include <fmt/format.h>

#include <unordered_map>

#include "text/jinja_internal.h"

namespace moesh::jinja {

struct Interpreter::Scope {
  std::shared_ptr<Scope> parent;
  std::unordered_map<std::string, Value> vars;

  const Value* lookup(const std::string& name) const {
    for (const Scope* s = this; s != nullptr; s = s->parent.get()) {
      auto it = s->vars.find(name);
      if (it != s->vars.end()) return &it->second;
    }
    return nullptr;
  }
};

namespace {
std::shared_ptr<Interpreter::Scope> child_of(const std::shared_ptr<Interpreter::Scope>& parent) {
  auto s = std::make_shared<Interpreter::Scope>();
  s->parent = parent;
  return s;
}

// Methods the sandbox lets a template call on a dict (the mutating ones only when not immutable).
bool is_dict_method(const std::string& n) {
  return n == "items" || n == "keys" || n == "values" || n == "get" || n == "update" || n == "pop" ||
         n == "setdefault" || n == "copy";
}
}  // namespace

// ---- attribute / item access ------------------------------------------------------------------

Value get_attr(const Interpreter& in, const Value& obj, const std::string& name) {
  switch (obj.kind()) {
    case Value::Kind::kUndefined:
      fail_undefined(obj);
    case Value::Kind::kDict: {
      const auto& d = obj.as_dict();
      if (!d.is_namespace && is_dict_method(name)) return get_method(in, obj, name);
      if (const Value* v = d.find(Value(name))) return *v;
      return Value::undefined(
          fmt::format("'{}' has no attribute '{}'", d.is_namespace ? "Namespace" : "dict object", name));
    }
    case Value::Kind::kString:
    case Value::Kind::kList: {
      Value m = get_method(in, obj, name);
      if (!m.is_undefined()) return m;
      break;
    }
    default:
      break;
  }
  return Value::undefined(fmt::format("'{}' has no attribute '{}'",
                                      obj.is_none() ? "None" : std::string(obj.type_name()) + " object", name));
}

Value get_item(const Interpreter& in, const Value& obj, const Value& key) {
  switch (obj.kind()) {
    case Value::Kind::kUndefined:
      fail_undefined(obj);
    case Value::Kind::kDict:
      if (const Value* v = obj.as_dict().find(key)) return *v;
      break;
    case Value::Kind::kList:
    case Value::Kind::kString:
      if (key.is_int() || key.is_bool()) {
        int64_t i = key.is_bool() ? key.as_bool() : key.as_int();
        if (obj.is_list()) {
          const auto& items = obj.as_list().items;
          if (i < 0) i += static_cast<int64_t>(items.size());
          if (i >= 0 && i < static_cast<int64_t>(items.size())) return items[static_cast<size_t>(i)];
        } else {
          const auto off = codepoint_offsets(obj.as_string());
          const int64_t n = static_cast<int64_t>(off.size()) - 1;
          if (i < 0) i += n;
          if (i >= 0 && i < n) return Value(obj.as_string().substr(off[i], off[i + 1] - off[i]));
        }
        return Value::undefined(fmt::format("{} index out of range", obj.is_list() ? "list" : "string"));
      }
      break;
    default:
      break;
  }
  if (key.is_string()) return get_attr(in, obj, key.as_string());
  return Value::undefined(fmt::format("'{}' has no attribute {}",
                                      obj.is_none() ? "None" : std::string(obj.type_name()) + " object", key.repr()));
}

Value call_value(const Value& fn, const CallArgs& args) {
  if (fn.is_undefined()) fail_undefined(fn);
  if (!fn.is_function()) fail(fmt::format("'{}' object is not callable", fn.type_name()));
  Result<Value> r = fn.as_function().fn(args);
  if (!r.is_ok()) fail(r.status().message(), kNoPos, r.status().code());
  return std::move(r).value();
}

// ---- expressions ------------------------------------------------------------------------------

Value Interpreter::eval(const Expr& e, const std::shared_ptr<Scope>& scope) {
  try {
    return eval_inner(e, scope);
  } catch (Error& err) {
    if (err.pos == kNoPos) err.pos = e.pos;
    throw;
  }
}

CallArgs Interpreter::eval_args(const Expr& e, const std::shared_ptr<Scope>& scope, size_t first) {
  CallArgs a;
  for (size_t i = first; i < e.args.size(); ++i) a.positional.push_back(eval(*e.args[i], scope));
  for (const auto& kv : e.kwargs) a.named.emplace_back(kv.first, eval(*kv.second, scope));
  return a;
}

namespace {
bool args_tainted(const CallArgs& a) {
  for (const Value& v : a.positional)
    if (deep_tainted(v)) return true;
  for (const auto& kv : a.named)
    if (deep_tainted(kv.second)) return true;
  return false;
}

// A builtin (filter, method, global, operator) that was given tainted input taints what it made.
Value taint_if(Value r, bool inputs_tainted) {
  if (inputs_tainted) taint_new_strings(r);
  return r;
}

// A filter block's chain ({% filter a | b %}, {% set x | a %}) down to its empty subject slot.
Value apply_filter_chain(Interpreter& in, const Expr& f, Value subject,
                         const std::function<CallArgs(const Expr&)>& args_of) {
  if (f.args[0]) subject = apply_filter_chain(in, *f.args[0], std::move(subject), args_of);
  try {
    CallArgs args = args_of(f);
    Value r = apply_filter(in, f.name, subject, args);
    if (deep_tainted(subject) || args_tainted(args)) taint_new_strings(r);
    return r;
  } catch (Error& err) {
    if (err.pos == kNoPos) err.pos = f.pos;
    throw;
  }
}
}  // namespace

Value Interpreter::eval_inner(const Expr& e, const std::shared_ptr<Scope>& scope) {
  switch (e.kind) {
    case ExprKind::kLiteral:
      return e.literal;
    case ExprKind::kName: {
      if (const Value* v = scope->lookup(e.name)) return *v;
      return Value::undefined(fmt::format("'{}' is undefined", e.name));
    }
    case ExprKind::kList:
    case ExprKind::kTuple: {
      std::vector<Value> items;
      for (const auto& a : e.args) items.push_back(eval(*a, scope));
      return e.kind == ExprKind::kList ? Value::list(std::move(items)) : Value::tuple(std::move(items));
    }
    case ExprKind::kDict: {
      Value d = Value::dict();
      for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
        Value k = eval(*e.args[i], scope);
        if (k.is_list() || k.is_dict() || k.is_undefined())
          fail(fmt::format("unhashable type: '{}'", k.type_name()), e.args[i]->pos);
        d.as_dict().set(std::move(k), eval(*e.args[i + 1], scope));
      }
      return d;
    }
    case ExprKind::kGetAttr: {
      // A method bound to tainted data carries the taint to its call's result.
      Value obj = eval(*e.args[0], scope);
      Value r = get_attr(*this, obj, e.name);
      const bool tainted = r.is_function() && deep_tainted(obj);
      return taint_if(std::move(r), tainted);
    }
    case ExprKind::kGetItem: {
      // Stored items keep their own taint; a character of a string or a bound method is new.
      Value obj = eval(*e.args[0], scope);
      Value r = get_item(*this, obj, eval(*e.args[1], scope));
      const bool tainted = (obj.is_string() || r.is_function()) && deep_tainted(obj);
      return taint_if(std::move(r), tainted);
    }
    case ExprKind::kSlice: {
      Value obj = eval(*e.args[0], scope);
      Value parts[3];
      for (int i = 0; i < 3; ++i)
        if (e.args[1 + i]) parts[i] = eval(*e.args[1 + i], scope);
      if (obj.is_undefined()) fail_undefined(obj);
      if (obj.is_list()) {
        const auto& items = obj.as_list().items;
        std::vector<Value> out;
        for (int64_t i : slice_indices(static_cast<int64_t>(items.size()), parts[0], parts[1], parts[2]))
          out.push_back(items[static_cast<size_t>(i)]);
        return obj.as_list().is_tuple ? Value::tuple(std::move(out)) : Value::list(std::move(out));
      }
      if (obj.is_string()) {
        const std::string& s = obj.as_string();
        const auto off = codepoint_offsets(s);
        std::string out;
        for (int64_t i : slice_indices(static_cast<int64_t>(off.size()) - 1, parts[0], parts[1], parts[2]))
          out.append(s, off[i], off[i + 1] - off[i]);
        return taint_if(Value(std::move(out)), obj.tainted());
      }
      return Value::undefined(fmt::format("'{}' object is not subscriptable", obj.type_name()));
    }
    case ExprKind::kCall: {
      Value fn = eval(*e.args[0], scope);
      CallArgs args = eval_args(e, scope, 1);
      if (++depth_ > options().max_call_depth) fail("maximum call depth exceeded");
      Value r = call_value(fn, args);
      --depth_;
      // A macro's output already carries exact ranges (its body was rendered like the template's).
      const bool macro = fn.is_function() && fn.as_function().is_macro;
      return taint_if(std::move(r), !macro && (fn.tainted() || args_tainted(args)));
    }
    case ExprKind::kFilter: {
      Value subject = e.args[0] ? eval(*e.args[0], scope) : Value();
      CallArgs args = eval_args(e, scope, 1);
      Value r = apply_filter(*this, e.name, subject, args);
      return taint_if(std::move(r), deep_tainted(subject) || args_tainted(args));
    }
    case ExprKind::kTest: {
      Value subject = eval(*e.args[0], scope);
      const bool r = apply_test(*this, e.name, subject, eval_args(e, scope, 1));
      return Value(r != e.negated);
    }
    case ExprKind::kUnary: {
      Value v = eval(*e.args[0], scope);
      if (e.name == "not") return Value(!v.truthy());
      if (v.is_undefined()) fail_undefined(v);
      if (v.is_int() || v.is_bool()) {
        const int64_t i = v.is_bool() ? v.as_bool() : v.as_int();
        return Value(e.name == "-" ? -i : i);
      }
      if (v.is_float()) return Value(e.name == "-" ? -v.as_float() : v.as_float());
      fail(fmt::format("bad operand type for unary {}: '{}'", e.name, v.type_name()));
    }
    case ExprKind::kBinary: {
      Value a = eval(*e.args[0], scope);
      Value b = eval(*e.args[1], scope);
      // ~ and string + keep exact ranges (py_binary); %, * and list + make new values.
      Value r = py_binary(e.name, a, b);
      if (e.name == "~" || (e.name == "+" && r.is_string())) return r;
      return taint_if(std::move(r), deep_tainted(a) || deep_tainted(b));
    }
    case ExprKind::kAnd: {
      Value a = eval(*e.args[0], scope);
      return a.truthy() ? eval(*e.args[1], scope) : a;
    }
    case ExprKind::kOr: {
      Value a = eval(*e.args[0], scope);
      return a.truthy() ? a : eval(*e.args[1], scope);
    }
    case ExprKind::kCompare: {
      Value left = eval(*e.args[0], scope);
      for (size_t i = 0; i < e.ops.size(); ++i) {
        Value right = eval(*e.args[i + 1], scope);
        const std::string& op = e.ops[i];
        bool ok;
        if (op == "==") {
          ok = left == right;
        } else if (op == "!=") {
          ok = !(left == right);
        } else if (op == "in") {
          ok = py_contains(right, left);
        } else if (op == "notin") {
          ok = !py_contains(right, left);
        } else {
          const int c = py_compare(left, right, op.c_str());
          ok = op == "<" ? c < 0 : op == "<=" ? c <= 0 : op == ">" ? c > 0 : c >= 0;
        }
        if (!ok) return Value(false);
        left = std::move(right);
      }
      return Value(true);
    }
    case ExprKind::kCond: {
      if (eval(*e.args[1], scope).truthy()) return eval(*e.args[0], scope);
      if (e.args[2]) return eval(*e.args[2], scope);
      return Value::undefined("the inline if-expression evaluated to false and no else section was defined");
    }
  }
  fail("unknown expression");
}

// ---- statements -------------------------------------------------------------------------------

void Interpreter::append(Output& out, std::string_view text) const {
  if (out.text.size() + text.size() > options().max_output_bytes) {
    fail(fmt::format("output exceeds {} bytes", options().max_output_bytes), kNoPos, StatusCode::kOutOfRange);
  }
  out.text.append(text);
}

void Interpreter::append_value(Output& out, const Value& v) const {
  const std::string text = v.str();
  const size_t at = out.text.size();
  append(out, text);
  append_tainted(out.tainted, text_taint(v, text.size()), at);
}

namespace {
Value output_value(Output&& o) {
  Value v(std::move(o.text));
  v.set_taint_ranges(std::move(o.tainted));
  return v;
}
}  // namespace

void Interpreter::assign(const Expr& target, const Value& v, const std::shared_ptr<Scope>& scope) {
  switch (target.kind) {
    case ExprKind::kName:
      scope->vars[target.name] = v;
      return;
    case ExprKind::kGetAttr: {
      const std::string& ns_name = target.args[0]->name;
      const Value* ns = scope->lookup(ns_name);
      if (ns == nullptr || !ns->is_dict() || !ns->as_dict().is_namespace) {
        fail("cannot assign attribute on non-namespace object", target.pos);
      }
      ns->as_dict().set(Value(target.name), v);
      return;
    }
    case ExprKind::kTuple: {
      std::vector<Value> items = py_iterate(v);
      const size_t n = target.args.size();
      if (items.size() > n) fail(fmt::format("too many values to unpack (expected {})", n), target.pos);
      if (items.size() < n)
        fail(fmt::format("not enough values to unpack (expected {}, got {})", n, items.size()), target.pos);
      for (size_t i = 0; i < n; ++i) assign(*target.args[i], items[i], scope);
      return;
    }
    default:
      fail("cannot assign to this expression", target.pos);
  }
}

Value Interpreter::make_macro(const Stmt& s, const std::shared_ptr<Scope>& scope, const Stmt* caller_of) {
  const std::string name = caller_of != nullptr ? "caller" : s.text;
  // The macro usually lives in the scope it closes over; a strong reference would be a cycle that
  // never frees. The interpreter keeps the scope alive until the render ends instead.
  macro_scopes_.push_back(scope);
  std::weak_ptr<Scope> weak_scope = scope;
  auto alive = alive_;
  return Value::function(
      name,
      [this, &s, weak_scope, name, alive](const CallArgs& args) -> Result<Value> {
        auto scope = weak_scope.lock();
        if (!*alive || !scope) {
          return make_error(StatusCode::kInvalidArgument, "macro '{}' called after its template finished", name);
        }
        auto local = child_of(scope);
        if (args.positional.size() > s.params.size()) {
          fail(fmt::format("macro '{}' takes not more than {} argument(s)", name, s.params.size()));
        }
        std::vector<bool> set(s.params.size(), false);
        for (size_t i = 0; i < args.positional.size(); ++i) {
          local->vars[s.params[i].first] = args.positional[i];
          set[i] = true;
        }
        for (const auto& kv : args.named) {
          size_t i = 0;
          while (i < s.params.size() && s.params[i].first != kv.first) ++i;
          if (i == s.params.size()) {
            if (kv.first == "caller") {
              local->vars["caller"] = kv.second;
              continue;
            }
            fail(fmt::format("macro '{}' takes no keyword argument '{}'", name, kv.first));
          }
          if (set[i]) fail(fmt::format("macro '{}' got multiple values for argument '{}'", name, kv.first));
          local->vars[kv.first] = kv.second;
          set[i] = true;
        }
        for (size_t i = 0; i < s.params.size(); ++i) {
          if (set[i]) continue;
          local->vars[s.params[i].first] =
              s.params[i].second ? eval(*s.params[i].second, local)
                                 : Value::undefined(fmt::format("parameter '{}' was not provided", s.params[i].first));
        }
        Output out;
        exec_body(s.body, local, out);
        return output_value(std::move(out));
      },
      /*is_macro=*/true);
}

Interpreter::Flow Interpreter::exec_body(const Body& body, const std::shared_ptr<Scope>& scope, Output& out) {
  for (const auto& s : body) {
    const Flow f = exec(*s, scope, out);
    if (f != Flow::kNormal) return f;
  }
  return Flow::kNormal;
}

Interpreter::Flow Interpreter::exec(const Stmt& s, const std::shared_ptr<Scope>& scope, Output& out) {
  switch (s.kind) {
    case StmtKind::kText:
      append(out, s.text);
      break;
    case StmtKind::kOutput:
      append_value(out, eval(*s.expr, scope));
      break;
    case StmtKind::kIf:
      for (const auto& [cond, body] : s.branches) {
        if (!cond || eval(*cond, scope).truthy()) return exec_body(body, scope, out);
      }
      break;
    case StmtKind::kFor:
      exec_for(s, scope, out);
      break;
    case StmtKind::kSet:
      assign(*s.target, eval(*s.expr, scope), scope);
      break;
    case StmtKind::kSetBlock:
    case StmtKind::kFilterBlock: {
      Output text;
      const Flow f = exec_body(s.body, scope, text);
      Value v = output_value(std::move(text));
      if (s.expr)
        v = apply_filter_chain(*this, *s.expr, std::move(v), [&](const Expr& f) { return eval_args(f, scope, 1); });
      if (s.kind == StmtKind::kSetBlock) {
        assign(*s.target, v, scope);
      } else {
        append_value(out, v);
      }
      if (f != Flow::kNormal) return f;
      break;
    }
    case StmtKind::kMacro:
      scope->vars[s.text] = make_macro(s, scope, nullptr);
      break;
    case StmtKind::kCallBlock: {
      const Expr& call = *s.expr;
      Value fn = eval(*call.args[0], scope);
      CallArgs args = eval_args(call, scope, 1);
      args.named.emplace_back("caller", make_macro(s, scope, &s));
      if (++depth_ > options().max_call_depth) fail("maximum call depth exceeded", s.pos);
      try {
        Value r = call_value(fn, args);
        const bool macro = fn.is_function() && fn.as_function().is_macro;
        append_value(out, taint_if(std::move(r), !macro && (fn.tainted() || args_tainted(args))));
      } catch (Error& err) {
        if (err.pos == kNoPos) err.pos = s.pos;
        throw;
      }
      --depth_;
      break;
    }
    case StmtKind::kBreak:
      return Flow::kBreak;
    case StmtKind::kContinue:
      return Flow::kContinue;
  }
  return Flow::kNormal;
}

void Interpreter::exec_for(const Stmt& s, const std::shared_ptr<Scope>& scope, Output& out) {
  Value iterable = eval(*s.expr, scope);
  std::vector<Value> items;
  try {
    items = py_iterate(iterable);
  } catch (Error& err) {
    if (err.pos == kNoPos) err.pos = s.expr->pos;
    throw;
  }
  if (iterable.is_string() && iterable.tainted()) {
    for (Value& c : items) c.taint_whole();  // the characters of a tainted string
  }
  if (s.cond) {
    std::vector<Value> kept;
    for (auto& item : items) {
      auto tmp = child_of(scope);
      assign(*s.target, item, tmp);
      if (eval(*s.cond, tmp).truthy()) kept.push_back(std::move(item));
    }
    items = std::move(kept);
  }
  const int64_t n = static_cast<int64_t>(items.size());
  if (n == 0) {
    exec_body(s.else_body, scope, out);
    return;
  }
  for (int64_t i = 0; i < n; ++i) {
    auto local = child_of(scope);
    Value loop = Value::dict();
    loop.set("index", Value(i + 1));
    loop.set("index0", Value(i));
    loop.set("revindex", Value(n - i));
    loop.set("revindex0", Value(n - i - 1));
    loop.set("first", Value(i == 0));
    loop.set("last", Value(i == n - 1));
    loop.set("length", Value(n));
    loop.set("depth", Value(1));
    loop.set("depth0", Value(0));
    loop.set("previtem", i > 0 ? items[i - 1] : Value::undefined("there is no previous item"));
    loop.set("nextitem", i + 1 < n ? items[i + 1] : Value::undefined("there is no next item"));
    loop.set("cycle", Value::function("loop.cycle", [i](const CallArgs& a) -> Result<Value> {
               if (a.positional.empty()) return make_error(StatusCode::kInvalidArgument, "no items for cycling given");
               return a.positional[static_cast<size_t>(i) % a.positional.size()];
             }));
    local->vars["loop"] = loop;
    assign(*s.target, items[i], local);
    const Flow f = exec_body(s.body, local, out);
    if (f == Flow::kBreak) break;
  }
}

Output Interpreter::render(const Value& context) {
  auto globals = std::make_shared<Scope>();
  const Value g = make_globals(options());
  for (const auto& kv : g.as_dict().items) globals->vars[kv.first.as_string()] = kv.second;
  auto top = child_of(globals);
  if (context.is_dict()) {
    for (const auto& kv : context.as_dict().items) {
      if (kv.first.is_string()) top->vars[kv.first.as_string()] = kv.second;
    }
  }
  Output out;
  exec_body(impl_.body, top, out);
  return out;
}

Interpreter::~Interpreter() {
  *alive_ = false;
}

// ---- public API -------------------------------------------------------------------------------

Result<Template> Template::parse(std::string_view source, const Options& options) {
  auto impl = std::make_shared<Impl>();
  impl->source = std::string(source);
  impl->options = options;
  try {
    parse_template(*impl);
  } catch (const Error& e) {
    return make_error(e.code, "jinja syntax error at {}: {}", position_text(impl->source, e.pos), e.msg);
  } catch (const std::exception& e) {
    return make_error(StatusCode::kInternal, "jinja parse: {}", e.what());
  }
  return Template(std::move(impl));
}

Result<std::string> Template::render(const Value& context) const {
  MOESH_ASSIGN_OR_RETURN(Rendered r, render_tracked(context));
  return std::move(r.text);
}

Result<Template::Rendered> Template::render_tracked(const Value& context) const {
  if (!context.is_dict() && !context.is_undefined() && !context.is_none()) {
    return make_error(StatusCode::kInvalidArgument, "jinja render: the context must be a dict, not {}",
                      context.type_name());
  }
  try {
    Interpreter in(*impl_);
    Output out = in.render(context);
    return Rendered{std::move(out.text), std::move(out.tainted)};
  } catch (const Error& e) {
    if (e.raised) {
      return make_error(e.code, "template raised an exception at {}: {}", position_text(impl_->source, e.pos), e.msg);
    }
    return make_error(e.code, "template error at {}: {}", position_text(impl_->source, e.pos), e.msg);
  } catch (const std::exception& e) {
    return make_error(StatusCode::kInternal, "jinja render: {}", e.what());
  }
}

}  // namespace moesh::jinja
