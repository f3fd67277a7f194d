// Runs a chat template's syntax tree: scopes as Jinja2 has them (a loop
// body and a macro call get their own; `set` in a loop does not leak out),
// Python's operators, macros and call blocks, and the sandbox's builtins.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <ctime>

#include "jinja/builtins.h"
#include "jinja/jinja.h"
#include "jinja/syntax.h"
#include "util/error.h"

namespace depcache::jinja {
namespace {

// The most items a list may hold; strings are bounded by the output limit.
constexpr size_t kMaxItems = 1'000'000;

// The template's own refusal (raise_exception), kept apart from errors in it.
struct Raised {
  std::string message;
};

struct Frame {
  Dict vars;
  std::shared_ptr<Frame> parent;
};

enum class Flow { Normal, Break, Continue };

class Renderer;

struct Builtin : Callable {
  std::string fn;
  Renderer* r;
  Builtin(std::string n, Renderer* rr) : fn(std::move(n)), r(rr) {}
  std::string name() const override { return fn; }
  Value call(Args& a) const override;
};

struct Macro : Callable {
  const Node* node;
  std::shared_ptr<Frame> closure;
  Renderer* r;
  Value caller;  // set for the macro a call block calls
  std::string name() const override { return node->name; }
  Value call(Args& a) const override;
};

// A call block's body, as `caller` inside the macro.
struct Caller : Callable {
  const Node* node;
  std::shared_ptr<Frame> closure;
  Renderer* r;
  std::string name() const override { return "caller"; }
  Value call(Args& a) const override;
};

// loop.cycle(a, b, ...)
struct Cycle : Callable {
  size_t index;
  std::string name() const override { return "cycle"; }
  Value call(Args& a) const override {
    if (a.pos.empty()) fail(ErrorKind::InvalidInput, "loop.cycle() needs at least one value");
    return a.pos[index % a.pos.size()];
  }
};

// CPU time of the calling thread. The render's time budget counts it, not
// the wall clock: a render descheduled on a busy machine is not charged for
// the time other work ran (under load the wall clock failed renders of
// built-in templates that take well under a millisecond of CPU).
std::chrono::nanoseconds thread_cpu_time() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return std::chrono::seconds(ts.tv_sec) + std::chrono::nanoseconds(ts.tv_nsec);
}

class Renderer {
 public:
  Renderer(const Dict& globals, const std::tm& now, const RenderLimits& limits)
      : globals_(globals), now_(now), limits_(limits), deadline_(thread_cpu_time() + limits.max_time) {}
  Renderer(const Renderer&) = delete;
  Renderer& operator=(const Renderer&) = delete;
  // A macro kept in the frame it closes over, or a namespace holding itself,
  // is a reference cycle; emptying those frames and namespaces frees them.
  ~Renderer() {
    for (const auto& f : closures_) f->vars.items.clear();
    for (const auto& ns : namespaces_) ns->items.clear();
  }

  Str run(const Body& body) {
    auto root = std::make_shared<Frame>();
    Str out;
    if (exec(body, root, out) != Flow::Normal)
      fail(ErrorKind::InvalidInput, "'break' or 'continue' outside a loop");
    return out;
  }

  int line() const { return line_; }

  Value call_builtin(const std::string& fn, Args& a) {
    a.what = fn;
    if (fn == "raise_exception") {
      throw Raised{a.pos.empty() ? "" : a.pos[0].to_str().s};
    }
    if (fn == "namespace" || fn == "dict") {
      Dict d;
      d.is_namespace = fn == "namespace";
      if (!a.pos.empty()) {
        if (a.pos.size() > 1 || !a.pos[0].is_dict())
          fail(ErrorKind::InvalidInput, "{}() takes a mapping or keywords", fn);
        d.items = a.pos[0].as_dict().items;
      }
      for (auto& [k, v] : a.kw) d.set(k, v);
      Value out = Value::dict(std::move(d));
      if (fn == "namespace") namespaces_.push_back(std::get<std::shared_ptr<Dict>>(out.data()));
      return out;
    }
    if (fn == "range") {
      a.check(3, {});
      if (a.pos.empty()) fail(ErrorKind::InvalidInput, "range() needs an argument");
      for (const Value& v : a.pos)
        if (!v.is_int() && !v.is_bool())
          fail(ErrorKind::InvalidInput, "range() needs integers, not a {}", v.type_name());
      const int64_t start = a.pos.size() > 1 ? a.pos[0].as_int() : 0;
      const int64_t stop = a.pos.size() > 1 ? a.pos[1].as_int() : a.pos[0].as_int();
      const int64_t step = a.pos.size() > 2 ? a.pos[2].as_int() : 1;
      if (step == 0) fail(ErrorKind::InvalidInput, "range() step must not be zero");
      List out;
      for (int64_t i = start; step > 0 ? i < stop : i > stop;) {
        step_();
        if (out.size() >= kMaxItems)
          fail(ErrorKind::LimitExceeded, "range() of more than {} numbers", kMaxItems);
        out.push_back(Value::integer(i));
        if (__builtin_add_overflow(i, step, &i)) break;  // past 64 bits is past stop
      }
      return Value::list(std::move(out));
    }
    if (fn == "strftime_now") {
      if (a.pos.empty() || !a.pos[0].is_string())
        fail(ErrorKind::InvalidInput, "strftime_now() needs a format string");
      char buf[256];
      const size_t n = std::strftime(buf, sizeof buf, a.pos[0].as_str().s.c_str(), &now_);
      return Value::string(std::string(buf, n));
    }
    fail(ErrorKind::InvalidInput, "'{}' is not callable", fn);
  }

  Value call_macro(const Macro& m, Args& a) {
    if (++call_depth_ > limits_.max_call_depth)
      fail(ErrorKind::LimitExceeded, "macro calls nest deeper than {}", limits_.max_call_depth);
    struct Leave {
      int& d;
      ~Leave() { --d; }
    } leave{call_depth_};
    auto frame = std::make_shared<Frame>();
    frame->parent = m.closure;
    const auto& params = m.node->params;
    if (a.pos.size() > params.size())
      fail(ErrorKind::InvalidInput, "macro '{}' takes {} arguments ({} given)", m.node->name, params.size(),
           a.pos.size());
    for (size_t i = 0; i < params.size(); ++i) {
      const std::string& pname = params[i].first;
      const ExprPtr& def = params[i].second;
      if (i < a.pos.size()) {
        frame->vars.set(pname, a.pos[i]);
        continue;
      }
      const auto kw =
          std::find_if(a.kw.begin(), a.kw.end(), [&](const auto& kv) { return kv.first == pname; });
      if (kw != a.kw.end())
        frame->vars.set(pname, kw->second);
      else
        frame->vars.set(pname, def ? eval(*def, frame) : Value::undefined_name(pname));
    }
    for (const auto& kv : a.kw)
      if (std::none_of(params.begin(), params.end(), [&](const auto& p) { return p.first == kv.first; }))
        fail(ErrorKind::InvalidInput, "macro '{}' takes no keyword argument '{}'", m.node->name, kv.first);
    if (!m.caller.is_undefined()) frame->vars.set("caller", m.caller);
    Str out;
    const int saved = line_;
    exec(m.node->body, frame, out);
    line_ = saved;
    return Value::str(std::move(out));
  }

  Value call_caller(const Caller& c, Args& a) {
    auto frame = std::make_shared<Frame>();
    frame->parent = c.closure;
    const auto& params = c.node->params;
    for (size_t i = 0; i < params.size(); ++i)
      frame->vars.set(params[i].first, i < a.pos.size()   ? a.pos[i]
                                       : params[i].second ? eval(*params[i].second, frame)
                                                          : Value::undefined_name(params[i].first));
    Str out;
    exec(c.node->body, frame, out);
    return Value::str(std::move(out));
  }

 private:
  void step_() {
    if (++steps_ > limits_.max_steps)
      fail(ErrorKind::LimitExceeded, "the template ran more than {} steps", limits_.max_steps);
    // The clock every few steps: one step is bounded by the size of the
    // values it works on.
    if (steps_ % 64 == 0 && thread_cpu_time() > deadline_)
      fail(ErrorKind::LimitExceeded, "the template ran longer than {} ms of CPU time",
           limits_.max_time.count());
  }

  void emit(Str& out, const Str& s) {
    if (out.s.size() + s.s.size() > limits_.max_output)
      fail(ErrorKind::LimitExceeded, "the template's output exceeds {} bytes", limits_.max_output);
    out.append(s);
  }

  Value lookup(const std::string& name, const std::shared_ptr<Frame>& frame) {
    for (const Frame* f = frame.get(); f; f = f->parent.get())
      if (const Value* v = f->vars.find(name)) return *v;
    if (const Value* v = globals_.find(name)) return *v;
    static const char* kBuiltins[] = {"raise_exception", "namespace", "dict", "range", "strftime_now"};
    for (const char* b : kBuiltins)
      if (name == b) return Value::function(std::make_shared<Builtin>(name, this));
    return Value::undefined_name(name);
  }

  void assign(const Target& t, Value v, const std::shared_ptr<Frame>& frame) {
    if (t.attr.empty()) {
      frame->vars.set(t.name, std::move(v));
      return;
    }
    const Value ns = lookup(t.name, frame);
    if (!ns.is_dict() || !ns.as_dict().is_namespace)
      fail(ErrorKind::InvalidInput, "cannot assign the attribute '{}' of '{}', which is not a namespace",
           t.attr, t.name);
    ns.as_dict().set(t.attr, std::move(v));
  }

  void assign_all(const std::vector<Target>& targets, Value v, const std::shared_ptr<Frame>& frame) {
    if (targets.size() == 1) {
      assign(targets[0], std::move(v), frame);
      return;
    }
    const List items = iterate(v);
    if (items.size() != targets.size())
      fail(ErrorKind::InvalidInput, "cannot unpack {} values into {} names", items.size(), targets.size());
    for (size_t i = 0; i < items.size(); ++i) assign(targets[i], items[i], frame);
  }

  Flow exec(const Body& body, const std::shared_ptr<Frame>& frame, Str& out) {
    for (const NodePtr& n : body) {
      step_();
      if (n->line) line_ = n->line;
      const Flow f = exec_node(*n, frame, out);
      if (f != Flow::Normal) return f;
    }
    return Flow::Normal;
  }

  Flow exec_node(const Node& n, const std::shared_ptr<Frame>& frame, Str& out) {
    switch (n.kind) {
      case Node::Kind::Text:
        emit(out, Str{n.text, {}});
        return Flow::Normal;
      case Node::Kind::Output:
        emit(out, eval(*n.expr, frame).to_str());
        return Flow::Normal;
      case Node::Kind::If:
        for (const auto& [cond, body] : n.branches)
          if (!cond || eval(*cond, frame).truthy()) return exec(body, frame, out);
        return Flow::Normal;
      case Node::Kind::For:
        exec_for(n, frame, out);
        return Flow::Normal;
      case Node::Kind::Set:
        assign_all(n.targets, eval(*n.expr, frame), frame);
        return Flow::Normal;
      case Node::Kind::SetBlock: {
        Str captured;
        const Flow f = exec(n.body, frame, captured);
        Value v = Value::str(std::move(captured));
        if (n.expr) v = apply_filters(*n.expr, v, frame);
        assign_all(n.targets, std::move(v), frame);
        return f;
      }
      case Node::Kind::Macro: {
        auto m = std::make_shared<Macro>();
        m->node = &n;
        m->closure = frame;
        m->r = this;
        closures_.push_back(frame);
        frame->vars.set(n.name, Value::function(std::move(m)));
        return Flow::Normal;
      }
      case Node::Kind::CallBlock: {
        auto c = std::make_shared<Caller>();
        c->node = &n;
        c->closure = frame;
        c->r = this;
        closures_.push_back(frame);
        const Expr& call = *n.expr;
        const Value callee = eval(*call.items[0], frame);
        if (!callee.is_callable()) fail(ErrorKind::InvalidInput, "'call' needs a macro");
        const auto* macro = dynamic_cast<const Macro*>(&callee.as_callable());
        if (!macro)
          fail(ErrorKind::InvalidInput, "'call' needs a macro, not '{}'", callee.as_callable().name());
        Macro with_caller = *macro;
        with_caller.caller = Value::function(std::move(c));
        Args a = eval_args(call, frame);
        emit(out, call_macro(with_caller, a).as_str());
        return Flow::Normal;
      }
      case Node::Kind::FilterBlock: {
        Str captured;
        const Flow f = exec(n.body, frame, captured);
        emit(out, apply_filters(*n.expr, Value::str(std::move(captured)), frame).to_str());
        return f;
      }
      case Node::Kind::Break:
        return Flow::Break;
      case Node::Kind::Continue:
        return Flow::Continue;
    }
    return Flow::Normal;
  }

  void exec_for(const Node& n, const std::shared_ptr<Frame>& frame, Str& out) {
    const Value seq = eval(*n.expr, frame);
    if (seq.is_none() || seq.is_number() || seq.is_callable() ||
        (seq.is_dict() && seq.as_dict().is_namespace))
      fail(ErrorKind::InvalidInput, "'{}' object is not iterable", seq.type_name());
    List items = iterate(seq);
    if (n.cond) {
      List kept;
      for (Value& item : items) {
        auto f = std::make_shared<Frame>();
        f->parent = frame;
        assign_all(n.targets, item, f);
        if (eval(*n.cond, f).truthy()) kept.push_back(std::move(item));
      }
      items = std::move(kept);
    }
    if (items.empty()) {
      exec(n.else_body, frame, out);
      return;
    }
    const auto len = static_cast<int64_t>(items.size());
    // `loop`'s keys are made once per loop; each iteration fills a copy in
    // place (building a 12-key dict by name per item was most of a render).
    enum Slot {
      kIndex,
      kIndex0,
      kRevindex,
      kRevindex0,
      kFirst,
      kLast,
      kLength,
      kDepth,
      kDepth0,
      kPrevitem,
      kNextitem,
      kCycle
    };
    Dict proto;
    for (const char* key : {"index", "index0", "revindex", "revindex0", "first", "last", "length", "depth",
                            "depth0", "previtem", "nextitem", "cycle"})
      proto.set(key, Value::none());
    proto.items[kLength].second = Value::integer(len);
    proto.items[kDepth].second = Value::integer(1);
    proto.items[kDepth0].second = Value::integer(0);
    for (int64_t i = 0; i < len; ++i) {
      step_();
      auto f = std::make_shared<Frame>();
      f->parent = frame;
      const auto k = static_cast<size_t>(i);
      Dict loop = proto;
      const auto put = [&loop](Slot slot, Value v) { loop.items[slot].second = std::move(v); };
      put(kIndex, Value::integer(i + 1));
      put(kIndex0, Value::integer(i));
      put(kRevindex, Value::integer(len - i));
      put(kRevindex0, Value::integer(len - i - 1));
      put(kFirst, Value::boolean(i == 0));
      put(kLast, Value::boolean(i == len - 1));
      put(kPrevitem, i > 0 ? items[k - 1] : Value::undefined("there is no previous item"));
      put(kNextitem, i + 1 < len ? items[k + 1] : Value::undefined("there is no next item"));
      auto cycle = std::make_shared<Cycle>();
      cycle->index = k;
      put(kCycle, Value::function(std::move(cycle)));
      f->vars.set("loop", Value::dict(std::move(loop)));
      assign_all(n.targets, items[k], f);
      if (exec(n.body, f, out) == Flow::Break) break;
    }
  }

  Args eval_args(const Expr& call, const std::shared_ptr<Frame>& frame) {
    Args a;
    for (size_t i = 1; i < call.items.size(); ++i) a.pos.push_back(eval(*call.items[i], frame));
    for (const auto& [k, e] : call.kwargs) a.kw.emplace_back(k, eval(*e, frame));
    return a;
  }

  // A filter chain on v (the subject of the innermost filter is null).
  Value apply_filters(const Expr& e, const Value& v, const std::shared_ptr<Frame>& frame) {
    const Value subject = e.items[0] ? apply_filters(*e.items[0], v, frame) : v;
    Args a = eval_args(e, frame);
    return apply_filter(e.name, subject, a);
  }

  Value arith(const std::string& op, const Value& x, const Value& y) {
    for (const Value* v : {&x, &y})
      if (v->is_undefined()) fail(ErrorKind::InvalidInput, "{}", v->undefined_why());
    if (op == "+") {
      if (x.is_string() && y.is_string()) {
        Str s = x.as_str();
        s.append(y.as_str());
        return Value::str(std::move(s));
      }
      if (x.is_list() && y.is_list()) {
        List l = x.as_list();
        l.insert(l.end(), y.as_list().begin(), y.as_list().end());
        return Value::list(std::move(l));
      }
    }
    if (op == "*" && (x.is_string() || x.is_list() || y.is_string() || y.is_list())) {
      const Value& seq = x.is_string() || x.is_list() ? x : y;
      const Value& count = &seq == &x ? y : x;
      if (!count.is_int() && !count.is_bool())
        fail(ErrorKind::InvalidInput, "can't multiply a sequence by a {}", count.type_name());
      const size_t unit = seq.is_string() ? seq.as_str().s.size() : seq.as_list().size();
      // An empty sequence repeated stays empty, however large the count.
      const int64_t n = unit ? std::max<int64_t>(0, count.as_int()) : 0;
      const size_t most = seq.is_string() ? limits_.max_output : kMaxItems;
      if (unit && static_cast<uint64_t>(n) > most / unit)
        fail(ErrorKind::LimitExceeded, "a repetition exceeds {} {}", most,
             seq.is_string() ? "bytes" : "items");
      // Refused before it is built when the render's budget cannot hold it.
      if (seq.is_string()) {
        const Str& s = seq.as_str();
        ValueBudget::ensure_room(n * (unit + s.marks.size() * sizeof(Marks::value_type)));
        return Value::str(s.repeated(n));
      }
      ValueBudget::ensure_room(n * unit * sizeof(Value));
      List l;
      l.reserve(n * unit);
      for (int64_t i = 0; i < n; ++i) l.insert(l.end(), seq.as_list().begin(), seq.as_list().end());
      return Value::list(std::move(l));
    }
    if (op == "%" && x.is_string()) {
      return Value::str(Str::derived(percent_format(x.as_str().s, y), has_marks(x) || has_marks(y)));
    }
    if (!x.is_number() || !y.is_number())
      fail(ErrorKind::InvalidInput, "unsupported operand types for {}: '{}' and '{}'", op, x.type_name(),
           y.type_name());
    const bool ints = !x.is_float() && !y.is_float();
    if (op == "/") {
      if (y.as_float() == 0) fail(ErrorKind::InvalidInput, "division by zero");
      return Value::number(x.as_float() / y.as_float());
    }
    if (ints) {
      const int64_t a = x.as_int(), b = y.as_int();
      if (op == "+") return Value::integer(int_add(a, b));
      if (op == "-") return Value::integer(int_sub(a, b));
      if (op == "*") return Value::integer(int_mul(a, b));
      if (op == "//" || op == "%") {
        if (b == 0) fail(ErrorKind::InvalidInput, "integer division or modulo by zero");
        // C++ leaves INT64_MIN / -1 undefined; Python's quotient is the negation.
        if (b == -1) return Value::integer(op == "//" ? int_sub(0, a) : 0);
        int64_t q = a / b, r = a % b;
        if (r != 0 && ((r < 0) != (b < 0))) {
          --q;
          r += b;
        }
        return Value::integer(op == "//" ? q : r);
      }
      if (op == "**" && b >= 0) return Value::integer(int_pow(a, b));
    }
    const double a = x.as_float(), b = y.as_float();
    if (op == "+") return Value::number(a + b);
    if (op == "-") return Value::number(a - b);
    if (op == "*") return Value::number(a * b);
    if (op == "**") return Value::number(std::pow(a, b));
    if (b == 0) fail(ErrorKind::InvalidInput, "float division or modulo by zero");
    if (op == "//") return Value::number(std::floor(a / b));
    return Value::number(a - b * std::floor(a / b));
  }

  bool contains(const Value& seq, const Value& item) {
    if (seq.is_string()) {
      if (!item.is_string())
        fail(ErrorKind::InvalidInput, "'in <string>' requires a string as left operand, not {}",
             item.type_name());
      return seq.as_str().s.find(item.as_str().s) != std::string::npos;
    }
    if (seq.is_dict() && !seq.as_dict().is_namespace) return seq.as_dict().find(item) != nullptr;
    if (seq.is_list() || seq.is_undefined()) {
      for (const Value& x : iterate(seq))
        if (equal(x, item)) return true;
      return false;
    }
    fail(ErrorKind::InvalidInput, "argument of type '{}' is not iterable", seq.type_name());
  }

  // Every value is bounded: strings by the output limit, lists by kMaxItems,
  // so that a template doubling a string in a loop stops early.
  Value eval(const Expr& e, const std::shared_ptr<Frame>& frame) {
    Value v = eval_unbounded(e, frame);
    if (v.is_string() && v.as_str().s.size() > limits_.max_output)
      fail(ErrorKind::LimitExceeded, "a string exceeds {} bytes", limits_.max_output);
    if (v.is_list() && v.as_list().size() > kMaxItems)
      fail(ErrorKind::LimitExceeded, "a list exceeds {} items", kMaxItems);
    return v;
  }

  Value eval_unbounded(const Expr& e, const std::shared_ptr<Frame>& frame) {
    switch (e.kind) {
      case Expr::Kind::Literal:
        return e.value;
      case Expr::Kind::Name:
        return lookup(e.name, frame);
      case Expr::Kind::List:
      case Expr::Kind::Tuple: {
        List l;
        for (const ExprPtr& x : e.items) l.push_back(eval(*x, frame));
        return e.kind == Expr::Kind::Tuple ? Value::tuple(std::move(l)) : Value::list(std::move(l));
      }
      case Expr::Kind::Dict:
        return eval_dict(e, frame);
      case Expr::Kind::Attr:
        return get_attr(eval(*e.items[0], frame), e.name);
      case Expr::Kind::Item:
        return get_item(eval(*e.items[0], frame), eval(*e.items[1], frame));
      case Expr::Kind::Slice: {
        const auto part = [&](size_t i) { return e.items[i] ? eval(*e.items[i], frame) : Value::none(); };
        return get_slice(eval(*e.items[0], frame), part(1), part(2), part(3));
      }
      case Expr::Kind::Call:
        return eval_call(e, frame);
      case Expr::Kind::Filter: {
        const Value subject = eval(*e.items[0], frame);
        Args a = eval_args(e, frame);
        return apply_filter(e.name, subject, a);
      }
      case Expr::Kind::Test: {
        const Value subject = eval(*e.items[0], frame);
        Args a = eval_args(e, frame);
        return Value::boolean(apply_test(e.name, subject, a) != e.negated);
      }
      case Expr::Kind::Unary:
        return unary(e.name, eval(*e.items[0], frame));
      case Expr::Kind::And: {
        Value x = eval(*e.items[0], frame);
        return x.truthy() ? eval(*e.items[1], frame) : x;
      }
      case Expr::Kind::Or: {
        Value x = eval(*e.items[0], frame);
        return x.truthy() ? x : eval(*e.items[1], frame);
      }
      case Expr::Kind::Cond:
        if (eval(*e.items[0], frame).truthy()) return eval(*e.items[1], frame);
        return e.items[2] ? eval(*e.items[2], frame)
                          : Value::undefined("the condition is false and there is no else");
      case Expr::Kind::Binary: {
        const Value x = eval(*e.items[0], frame);
        const Value y = eval(*e.items[1], frame);
        return binary(e.name, x, y);
      }
    }
    fail(ErrorKind::Internal, "unknown expression");
  }

  Value eval_dict(const Expr& e, const std::shared_ptr<Frame>& frame) {
    Dict d;
    for (size_t i = 0; i + 1 < e.items.size(); i += 2) {
      Value k = eval(*e.items[i], frame);
      if (k.is_list() || k.is_dict() || k.is_undefined())
        fail(ErrorKind::InvalidInput, "unhashable type: '{}'", k.type_name());
      d.set(std::move(k), eval(*e.items[i + 1], frame));
    }
    return Value::dict(std::move(d));
  }

  Value eval_call(const Expr& e, const std::shared_ptr<Frame>& frame) {
    const Value callee = eval(*e.items[0], frame);
    if (callee.is_undefined()) fail(ErrorKind::InvalidInput, "{}", callee.undefined_why());
    if (!callee.is_callable()) fail(ErrorKind::InvalidInput, "a {} is not callable", callee.type_name());
    Args a = eval_args(e, frame);
    step_();
    return callee.as_callable().call(a);
  }

  static Value unary(const std::string& op, const Value& v) {
    if (op == "not") return Value::boolean(!v.truthy());
    if (v.is_undefined()) fail(ErrorKind::InvalidInput, "{}", v.undefined_why());
    if (!v.is_number())
      fail(ErrorKind::InvalidInput, "bad operand type for unary {}: '{}'", op, v.type_name());
    if (op == "+") return v.is_float() ? v : Value::integer(v.as_int());
    return v.is_float() ? Value::number(-v.as_float()) : Value::integer(int_sub(0, v.as_int()));
  }

  // Concatenation and comparisons here; arithmetic in arith.
  Value binary(const std::string& op, const Value& x, const Value& y) {
    if (op == "~") {
      Str s = x.to_str();
      s.append(y.to_str());
      return Value::str(std::move(s));
    }
    if (op == "==") return Value::boolean(equal(x, y));
    if (op == "!=") return Value::boolean(!equal(x, y));
    if (op == "in") return Value::boolean(contains(y, x));
    if (op == "not in") return Value::boolean(!contains(y, x));
    if (op == "<" || op == ">" || op == "<=" || op == ">=") {
      for (const Value* v : {&x, &y})
        if (v->is_undefined()) fail(ErrorKind::InvalidInput, "{}", v->undefined_why());
      if (op == "<") return Value::boolean(less(x, y));
      if (op == ">") return Value::boolean(less(y, x));
      if (op == "<=") return Value::boolean(!less(y, x));
      return Value::boolean(!less(x, y));
    }
    return arith(op, x, y);
  }

  const Dict& globals_;
  std::tm now_;
  RenderLimits limits_;
  std::chrono::nanoseconds deadline_;  // of thread_cpu_time()
  size_t steps_ = 0;
  int call_depth_ = 0;
  int line_ = 1;
  std::vector<std::shared_ptr<Frame>> closures_;
  std::vector<std::shared_ptr<Dict>> namespaces_;
};

Value Builtin::call(Args& a) const { return r->call_builtin(fn, a); }
Value Macro::call(Args& a) const { return r->call_macro(*this, a); }
Value Caller::call(Args& a) const { return r->call_caller(*this, a); }

}  // namespace

struct Template::Impl {
  Body body;
};

Template::Template(std::string_view source) : impl_(std::make_unique<Impl>()) {
  impl_->body = parse_template(source);
}
Template::~Template() = default;
Template::Template(Template&&) noexcept = default;
Template& Template::operator=(Template&&) noexcept = default;

Str Template::render(const Dict& globals, const std::tm& now, const RenderLimits& limits) const {
  const ValueBudget budget(limits.max_value_bytes, limits.max_output);
  Renderer r(globals, now, limits);
  try {
    return r.run(impl_->body);
  } catch (const Raised& e) {
    fail(ErrorKind::InvalidInput, "the chat template refuses the conversation: {}", e.message);
  } catch (const Error& e) {
    throw Error(e.kind(), fmt::format("chat template line {}: {}", r.line(), e.what()));
  }
}

}  // namespace depcache::jinja
