#pragma once
// The values a chat template computes with, as Python's Jinja2 has them:
// undefined, none, booleans, integers, floats, strings, lists, dicts and
// callables, printed and compared the way Python prints and compares them.
// A string keeps which of its bytes came from a client's message (`marks`),
// through concatenation, slicing and trimming, so that the rendered prompt
// can tokenize those bytes as text and never as control markers.
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

namespace depcache::jinja {

// Ascending, disjoint [begin, end) byte ranges.
using Marks = std::vector<std::pair<size_t, size_t>>;

// No string a template builds grows past this (LimitExceeded): a template
// is a file's content, and must not exhaust memory.
inline constexpr size_t kMaxStringBytes = size_t{256} << 20;
// Throws LimitExceeded when a string under construction passes kMaxStringBytes.
void check_string_size(size_t n);

// What the render on this thread may still make, in bytes of values (strings,
// lists, mappings): each new one is charged as it is made, and the one that
// passes the budget throws LimitExceeded. Outside a render nothing is
// charged (the values a caller builds to pass in).
class ValueBudget {
 public:
  // This thread's budget until destroyed; no one string may pass
  // max_string either (checked first: the string is the cause).
  ValueBudget(size_t bytes, size_t max_string);
  ~ValueBudget();
  ValueBudget(const ValueBudget&) = delete;
  ValueBudget& operator=(const ValueBudget&) = delete;
  size_t spent() const { return spent_; }
  static void charge(size_t bytes);
  static void charge_string(size_t bytes);
  // Throws as charge(bytes) would, charging nothing: checked before a value
  // is built whose size is known, so it is refused before its memory and
  // time are spent (it is charged as made).
  static void ensure_room(size_t bytes);

 private:
  size_t limit_, max_string_, spent_ = 0;
  ValueBudget* outer_;
};

// Python's integers are unbounded and ours are 64-bit: a result that does
// not fit is refused (LimitExceeded), never wrapped.
int64_t int_add(int64_t a, int64_t b);
int64_t int_sub(int64_t a, int64_t b);
int64_t int_mul(int64_t a, int64_t b);
int64_t int_pow(int64_t base, int64_t exp);  // exp >= 0
// Python's int(x) of a float: truncated toward zero; NaN, an infinity or a
// value past 64 bits is refused.
int64_t int_from_float(double x);

struct Str {
  std::string s;
  Marks marks;
  // The bytes [begin, end), with the marks that fall in them.
  Str sub(size_t begin, size_t end) const;
  void append(const Str& other);
  // This string n times over, built by doubling (log n copies).
  Str repeated(size_t n) const;
  // All marked when any input was: what an operation that rewrites the
  // bytes (replace, upper, tojson) makes of client text.
  static Str derived(std::string s, bool marked);

 private:
  // A mark on [begin, end), joined to the last one when they touch.
  void add_mark(size_t begin, size_t end);
};

class Value;
// A Python list, or a tuple (printed in parentheses, never equal to a list).
struct List : std::vector<Value> {
  using std::vector<Value>::vector;
  bool tuple = false;
};
struct Dict {
  std::vector<std::pair<Value, Value>> items;  // insertion order, as Python keeps it
  bool is_namespace = false;                   // namespace(): attributes may be assigned
  const Value* find(std::string_view key) const;
  const Value* find(const Value& key) const;
  void set(std::string key, Value v);
  void set(Value key, Value v);
};

// A call's arguments: positional, then keyword ones.
struct Args {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
  std::string what;  // the function or filter called, for errors
  // Positional argument i, or the keyword argument `name`; `def` when neither.
  // A copy (values share their contents), so a temporary `def` is safe.
  Value get(size_t i, std::string_view name, const Value& def) const;
  // Throws InvalidInput when more than n positional arguments, or a keyword
  // argument not in `names`, were given.
  void check(size_t n, std::initializer_list<std::string_view> names) const;
};

// A function value: a builtin (range, namespace, a bound string method) or
// a macro.
struct Callable {
  virtual ~Callable() = default;
  virtual Value call(Args& args) const = 0;
  virtual std::string name() const = 0;
};

struct Undefined {
  std::string why;  // the error when it is used: "'x' is undefined", "list object has no element 3"
};

class Value {
 public:
  // Strings are shared, so a value copied into many places costs one copy.
  using Data =
      std::variant<Undefined, std::nullptr_t, bool, int64_t, double, std::shared_ptr<const Str>,
                   std::shared_ptr<const List>, std::shared_ptr<Dict>, std::shared_ptr<const Callable>>;
  Value() : d_(Undefined{}) {}
  Value(Data d) : d_(std::move(d)) {}
  static Value undefined(std::string why) { return Value(Undefined{std::move(why)}); }
  static Value undefined_name(const std::string& name) { return undefined("'" + name + "' is undefined"); }
  static Value none() { return Value(nullptr); }
  static Value boolean(bool b) { return Value(b); }
  static Value integer(int64_t i) { return Value(i); }
  static Value number(double f) { return Value(f); }
  static Value string(std::string s) { return str(Str{std::move(s), {}}); }
  static Value marked(std::string s);  // a client's text
  // New strings, lists and mappings are charged to the render's ValueBudget.
  static Value str(Str s) {
    ValueBudget::charge_string(s.s.size());
    ValueBudget::charge(s.marks.size() * sizeof(Marks::value_type));
    return Value(std::make_shared<const Str>(std::move(s)));
  }
  static Value list(List l) {
    ValueBudget::charge(l.size() * sizeof(Value));
    return Value(std::make_shared<const List>(std::move(l)));
  }
  static Value tuple(List l) {
    l.tuple = true;
    return list(std::move(l));
  }
  static Value dict(Dict d) {
    ValueBudget::charge(d.items.size() * 2 * sizeof(Value));
    return Value(std::make_shared<Dict>(std::move(d)));
  }
  static Value function(std::shared_ptr<const Callable> f) { return Value(std::move(f)); }

  bool is_undefined() const { return std::holds_alternative<Undefined>(d_); }
  bool is_none() const { return std::holds_alternative<std::nullptr_t>(d_); }
  bool is_bool() const { return std::holds_alternative<bool>(d_); }
  bool is_int() const { return std::holds_alternative<int64_t>(d_); }
  bool is_float() const { return std::holds_alternative<double>(d_); }
  bool is_number() const { return is_int() || is_float() || is_bool(); }
  bool is_string() const { return std::holds_alternative<std::shared_ptr<const Str>>(d_); }
  bool is_list() const { return std::holds_alternative<std::shared_ptr<const List>>(d_); }
  bool is_dict() const { return std::holds_alternative<std::shared_ptr<Dict>>(d_); }
  bool is_callable() const { return std::holds_alternative<std::shared_ptr<const Callable>>(d_); }

  // The accessors throw InvalidInput ("an integer is expected, not a str")
  // for a value of another type: a template's arguments are unchecked input.
  bool as_bool() const { return *get<bool>("a boolean"); }
  int64_t as_int() const;   // ints and booleans
  double as_float() const;  // any number
  const Str& as_str() const { return **get<std::shared_ptr<const Str>>("a string"); }
  const List& as_list() const { return **get<std::shared_ptr<const List>>("a list"); }
  Dict& as_dict() const { return **get<std::shared_ptr<Dict>>("a mapping"); }
  const Callable& as_callable() const { return **get<std::shared_ptr<const Callable>>("a function"); }
  const std::string& undefined_why() const { return get<Undefined>("undefined")->why; }
  const Data& data() const { return d_; }

  // Python's truth value; an undefined value is false.
  bool truthy() const;
  // Python's type name, for errors.
  std::string type_name() const;
  // What `{{ v }}` prints (Python's str(); an undefined value prints nothing).
  Str to_str() const;
  // Python's repr() (strings quoted), as inside a printed list.
  std::string repr() const;
  // json.dumps(v, indent, ensure_ascii=False): Python's separators ", " and ": ".
  std::string to_json(int indent = -1) const;

 private:
  template <typename T>
  const T* get(const char* what) const {
    if (const T* p = std::get_if<T>(&d_)) return p;
    wrong_type(what);
  }
  [[noreturn]] void wrong_type(const char* what) const;

  Data d_;
};

// Whether any string in the value holds a client's text.
bool has_marks(const Value& v);

// Python's ==: numbers across int/float/bool, lists and dicts by content.
bool equal(const Value& a, const Value& b);
// Python's <; throws InvalidInput for types Python does not order.
bool less(const Value& a, const Value& b);

}  // namespace depcache::jinja
