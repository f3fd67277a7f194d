#include "jinja/value.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>

#include "util/error.h"
#include "util/utf8.h"

namespace depcache::jinja {

Str Str::sub(size_t begin, size_t end) const {
  Str out{s.substr(begin, end - begin), {}};
  for (auto [b, e] : marks) {
    b = std::max(b, begin);
    e = std::min(e, end);
    if (b < e) out.marks.emplace_back(b - begin, e - begin);
  }
  return out;
}

void check_string_size(size_t n) {
  if (n > kMaxStringBytes) fail(ErrorKind::LimitExceeded, "a string would exceed {} bytes", kMaxStringBytes);
}

namespace {
thread_local ValueBudget* current_budget = nullptr;
}  // namespace

ValueBudget::ValueBudget(size_t bytes, size_t max_string)
    : limit_(bytes), max_string_(max_string), outer_(current_budget) {
  current_budget = this;
}
ValueBudget::~ValueBudget() { current_budget = outer_; }

void ValueBudget::charge_string(size_t bytes) {
  if (const ValueBudget* b = current_budget; b && bytes > b->max_string_)
    fail(ErrorKind::LimitExceeded, "a string exceeds {} bytes", b->max_string_);
  charge(bytes);
}

void ValueBudget::charge(size_t bytes) {
  ensure_room(bytes);
  if (ValueBudget* b = current_budget) b->spent_ += bytes;
}

void ValueBudget::ensure_room(size_t bytes) {
  const ValueBudget* b = current_budget;
  if (b && bytes > b->limit_ - std::min(b->spent_, b->limit_))
    fail(ErrorKind::LimitExceeded, "the template made more than {} MiB of values", b->limit_ >> 20);
}

namespace {
[[noreturn]] void int_overflow(std::string_view what) {
  fail(ErrorKind::LimitExceeded, "{}: integers past 64 bits are not supported", what);
}
}  // namespace

int64_t int_add(int64_t a, int64_t b) {
  int64_t r = 0;
  if (__builtin_add_overflow(a, b, &r)) int_overflow("+");
  return r;
}

int64_t int_sub(int64_t a, int64_t b) {
  int64_t r = 0;
  if (__builtin_sub_overflow(a, b, &r)) int_overflow("-");
  return r;
}

int64_t int_mul(int64_t a, int64_t b) {
  int64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r)) int_overflow("*");
  return r;
}

int64_t int_pow(int64_t base, int64_t exp) {
  if (base == 0) return exp == 0 ? 1 : 0;
  if (base == 1) return 1;
  if (base == -1) return exp % 2 ? -1 : 1;
  // |base| >= 2 overflows within 63 steps, so the loop is short.
  int64_t r = 1;
  for (int64_t i = 0; i < exp; ++i)
    if (__builtin_mul_overflow(r, base, &r)) int_overflow("**");
  return r;
}

int64_t int_from_float(double x) {
  if (std::isnan(x)) fail(ErrorKind::InvalidInput, "cannot convert float NaN to integer");
  // Both bounds are exact doubles (2^63), and no double lies strictly between -2^63 - 1 and -2^63.
  if (!(x < 9223372036854775808.0 && x >= -9223372036854775808.0)) int_overflow("int()");
  return static_cast<int64_t>(x);
}

void Str::append(const Str& other) {
  check_string_size(s.size() + other.s.size());
  const size_t base = s.size();
  s += other.s;
  for (auto [b, e] : other.marks) add_mark(base + b, base + e);
}

void Str::add_mark(size_t begin, size_t end) {
  if (!marks.empty() && marks.back().second == begin)
    marks.back().second = end;  // one range across the join
  else
    marks.emplace_back(begin, end);
}

Str Str::repeated(size_t n) const {
  Str out;
  if (n == 0 || s.empty()) return out;
  check_string_size(s.size() * n);
  out.s.reserve(s.size() * n);
  out.append(*this);
  // Each round appends a prefix of what is built (at most all of it), so a
  // 60 MB repetition of one character is 26 copies, not 60M appends.
  for (size_t have = 1; have < n;) {
    const size_t copies = std::min(have, n - have);
    const size_t len = copies * s.size(), base = out.s.size();
    out.s.append(out.s, 0, len);
    // Appending may extend the last mark; the copy reads the marks as they were.
    const size_t old_count = out.marks.size();
    const auto old_last = old_count ? out.marks.back() : std::pair<size_t, size_t>{};
    for (size_t i = 0; i < old_count; ++i) {
      const auto [b, e] = i + 1 == old_count ? old_last : out.marks[i];
      if (b >= len) break;
      out.add_mark(base + b, base + std::min(e, len));
    }
    have += copies;
  }
  return out;
}

Str Str::derived(std::string s, bool marked) {
  Str out{std::move(s), {}};
  if (marked && !out.s.empty()) out.marks.emplace_back(0, out.s.size());
  return out;
}

const Value* Dict::find(std::string_view key) const {
  for (const auto& [k, v] : items)
    if (k.is_string() && k.as_str().s == key) return &v;
  return nullptr;
}

const Value* Dict::find(const Value& key) const {
  if (key.is_string()) return find(std::string_view(key.as_str().s));
  for (const auto& [k, v] : items)
    if (equal(k, key)) return &v;
  return nullptr;
}

// String keys (nearly every key a template uses) are compared as bytes and
// their Value made only when new: a loop variable is a 12-key dict built per
// iteration, and the generic comparison made that most of a render's time.
void Dict::set(std::string key, Value v) {
  for (auto& [k, old] : items)
    if (k.is_string() && k.as_str().s == key) {
      old = std::move(v);
      return;
    }
  ValueBudget::charge(2 * sizeof(Value));
  items.emplace_back(Value::string(std::move(key)), std::move(v));
}

void Dict::set(Value key, Value v) {
  if (key.is_string()) {
    const std::string& s = key.as_str().s;
    for (auto& [k, old] : items)
      if (k.is_string() && k.as_str().s == s) {
        old = std::move(v);
        return;
      }
  } else {
    for (auto& [k, old] : items)
      if (equal(k, key)) {
        old = std::move(v);
        return;
      }
  }
  ValueBudget::charge(2 * sizeof(Value));
  items.emplace_back(std::move(key), std::move(v));
}

Value Args::get(size_t i, std::string_view name, const Value& def) const {
  if (i < pos.size()) return pos[i];
  for (const auto& [k, v] : kw)
    if (k == name) return v;
  return def;
}

void Args::check(size_t n, std::initializer_list<std::string_view> names) const {
  if (pos.size() > n)
    fail(ErrorKind::InvalidInput, "{}() takes at most {} arguments ({} given)", what, n, pos.size());
  for (const auto& [k, v] : kw)
    if (std::find(names.begin(), names.end(), k) == names.end())
      fail(ErrorKind::InvalidInput, "{}() got an unexpected keyword argument '{}'", what, k);
}

Value Value::marked(std::string s) { return str(Str::derived(std::move(s), true)); }

void Value::wrong_type(const char* what) const {
  fail(ErrorKind::InvalidInput, "{} is expected, not a {}", what, type_name());
}

int64_t Value::as_int() const {
  if (is_bool()) return as_bool() ? 1 : 0;
  return *get<int64_t>("an integer");
}

double Value::as_float() const {
  if (is_float()) return std::get<double>(d_);
  if (!is_int() && !is_bool()) wrong_type("a number");
  return static_cast<double>(as_int());
}

bool Value::truthy() const {
  struct {
    bool operator()(const Undefined&) const { return false; }
    bool operator()(std::nullptr_t) const { return false; }
    bool operator()(bool b) const { return b; }
    bool operator()(int64_t i) const { return i != 0; }
    bool operator()(double f) const { return f != 0; }
    bool operator()(const std::shared_ptr<const Str>& s) const { return !s->s.empty(); }
    bool operator()(const std::shared_ptr<const List>& l) const { return !l->empty(); }
    bool operator()(const std::shared_ptr<Dict>& d) const { return d->is_namespace || !d->items.empty(); }
    bool operator()(const std::shared_ptr<const Callable>&) const { return true; }
  } visit;
  return std::visit(visit, d_);
}

std::string Value::type_name() const {
  struct {
    std::string operator()(const Undefined&) const { return "Undefined"; }
    std::string operator()(std::nullptr_t) const { return "NoneType"; }
    std::string operator()(bool) const { return "bool"; }
    std::string operator()(int64_t) const { return "int"; }
    std::string operator()(double) const { return "float"; }
    std::string operator()(const std::shared_ptr<const Str>&) const { return "str"; }
    std::string operator()(const std::shared_ptr<const List>&) const { return "list"; }
    std::string operator()(const std::shared_ptr<Dict>& d) const {
      return d->is_namespace ? "Namespace" : "dict";
    }
    std::string operator()(const std::shared_ptr<const Callable>&) const { return "function"; }
  } visit;
  return std::visit(visit, d_);
}

namespace {

// Python's repr() of a float: the shortest digits that read back, in fixed
// notation for exponents in [-4, 16), else scientific with a two-digit exponent.
std::string float_repr(double f) {
  if (std::isnan(f)) return "nan";
  if (std::isinf(f)) return f < 0 ? "-inf" : "inf";
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, f, std::chars_format::scientific);
  const std::string sci(buf, r.ptr);  // [-]d[.ddd]e±XX
  const size_t e_pos = sci.find('e');
  const int exp = std::stoi(sci.substr(e_pos + 1));
  const bool neg = sci[0] == '-';
  std::string digits;
  for (size_t i = neg ? 1 : 0; i < e_pos; ++i)
    if (sci[i] != '.') digits += sci[i];
  std::string out = neg ? "-" : "";
  if (exp >= -4 && exp < 16) {
    if (exp < 0) {
      out += "0.";
      out.append(static_cast<size_t>(-exp - 1), '0');
      out += digits;
    } else if (static_cast<size_t>(exp) + 1 >= digits.size()) {
      out += digits + std::string(static_cast<size_t>(exp) + 1 - digits.size(), '0') + ".0";
    } else {
      out.append(digits, 0, static_cast<size_t>(exp) + 1);
      out += '.';
      out.append(digits, static_cast<size_t>(exp) + 1);
    }
    return out;
  }
  out += digits[0];
  if (digits.size() > 1) {
    out += '.';
    out.append(digits, 1);
  }
  return out + fmt::format("e{}{:02d}", exp < 0 ? '-' : '+', std::abs(exp));
}

std::string string_repr(const std::string& s) {
  const bool has_single = s.find('\'') != std::string::npos;
  const char q = has_single && s.find('"') == std::string::npos ? '"' : '\'';
  std::string out(1, q);
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (ch == q || ch == '\\') {
      out += '\\';
      out += ch;
    } else if (ch == '\n') {
      out += "\\n";
    } else if (ch == '\r') {
      out += "\\r";
    } else if (ch == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7f) {
      out += fmt::format("\\x{:02x}", c);
    } else {
      out += ch;
    }
  }
  return out + q;
}

void json_string(std::string& out, std::string_view s, bool ascii) {
  out += '"';
  for (size_t i = 0; i < s.size();) {
    const char ch = s[i];
    const auto c = static_cast<unsigned char>(ch);
    if (c >= 0x80 && ascii) {
      const uint32_t cp = utf8_next(s, i);
      if (cp >= 0x10000) {
        const uint32_t v = cp - 0x10000;
        out += fmt::format("\\u{:04x}\\u{:04x}", 0xD800 + (v >> 10), 0xDC00 + (v & 0x3ff));
      } else {
        out += fmt::format("\\u{:04x}", cp);
      }
      continue;
    }
    ++i;
    switch (ch) {
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
        if (c < 0x20)
          out += fmt::format("\\u{:04x}", c);
        else
          out += ch;
    }
  }
  out += '"';
}

void json_value(std::string& out, const Value& v, int indent, int depth, bool ascii) {
  if (depth > 256) fail(ErrorKind::InvalidInput, "tojson: the value nests deeper than 256 levels");
  check_string_size(out.size());
  const auto newline = [&](int d) {
    if (indent < 0) return;
    out += '\n';
    out.append(static_cast<size_t>(indent) * static_cast<size_t>(d), ' ');
  };
  const char* sep = indent < 0 ? ", " : ",";
  if (v.is_undefined()) fail(ErrorKind::InvalidInput, "tojson: {}", v.undefined_why());
  if (v.is_none()) {
    out += "null";
  } else if (v.is_bool()) {
    out += v.as_bool() ? "true" : "false";
  } else if (v.is_int()) {
    out += std::to_string(v.as_int());
  } else if (v.is_float()) {
    const double f = v.as_float();
    out += std::isnan(f) ? "NaN" : std::isinf(f) ? (f < 0 ? "-Infinity" : "Infinity") : float_repr(f);
  } else if (v.is_string()) {
    json_string(out, v.as_str().s, ascii);
  } else if (v.is_list()) {
    const List& l = v.as_list();
    if (l.empty()) {
      out += "[]";
      return;
    }
    out += '[';
    for (size_t i = 0; i < l.size(); ++i) {
      if (i) out += sep;
      newline(depth + 1);
      json_value(out, l[i], indent, depth + 1, ascii);
    }
    newline(depth);
    out += ']';
  } else if (v.is_dict()) {
    const Dict& d = v.as_dict();
    if (d.is_namespace) fail(ErrorKind::InvalidInput, "tojson: a Namespace is not JSON serializable");
    if (d.items.empty()) {
      out += "{}";
      return;
    }
    out += '{';
    for (size_t i = 0; i < d.items.size(); ++i) {
      if (i) out += sep;
      newline(depth + 1);
      const Value& k = d.items[i].first;
      // json.dumps writes keys as strings: numbers as Python prints them.
      json_string(out,
                  k.is_string() ? k.as_str().s
                  : k.is_none() ? "null"
                  : k.is_bool() ? (k.as_bool() ? "true" : "false")
                                : k.to_str().s,
                  ascii);
      out += ": ";
      json_value(out, d.items[i].second, indent, depth + 1, ascii);
    }
    newline(depth);
    out += '}';
  } else {
    fail(ErrorKind::InvalidInput, "tojson: a {} is not JSON serializable", v.type_name());
  }
}

void repr_into(std::string& out, const Value& v, int depth) {
  if (depth > 256) fail(ErrorKind::InvalidInput, "a value nests deeper than 256 levels");
  check_string_size(out.size());
  if (v.is_string()) {
    out += string_repr(v.as_str().s);
  } else if (v.is_list()) {
    const List& l = v.as_list();
    out += l.tuple ? '(' : '[';
    for (size_t i = 0; i < l.size(); ++i) {
      if (i) out += ", ";
      repr_into(out, l[i], depth + 1);
    }
    if (l.tuple && l.size() == 1) out += ',';
    out += l.tuple ? ')' : ']';
  } else if (v.is_dict() && !v.as_dict().is_namespace) {
    out += '{';
    const Dict& d = v.as_dict();
    for (size_t i = 0; i < d.items.size(); ++i) {
      if (i) out += ", ";
      repr_into(out, d.items[i].first, depth + 1);
      out += ": ";
      repr_into(out, d.items[i].second, depth + 1);
    }
    out += '}';
  } else if (v.is_undefined()) {
    out += "Undefined";
  } else {
    out += v.to_str().s;
  }
}

}  // namespace

Str Value::to_str() const {
  if (is_string()) return as_str();
  if (is_undefined()) return {};
  if (is_none()) return {"None", {}};
  if (is_bool()) return {as_bool() ? "True" : "False", {}};
  if (is_int()) return {std::to_string(as_int()), {}};
  if (is_float()) return {float_repr(as_float()), {}};
  if (is_callable()) return {fmt::format("<function {}>", as_callable().name()), {}};
  if (is_dict() && as_dict().is_namespace) return {"<Namespace>", {}};
  return Str::derived(repr(), has_marks(*this));
}

std::string Value::repr() const {
  std::string out;
  repr_into(out, *this, 0);
  return out;
}

std::string Value::to_json(int indent) const {
  std::string out;
  json_value(out, *this, indent, 0, false);
  return out;
}

bool has_marks(const Value& v) {
  if (v.is_string()) return !v.as_str().marks.empty();
  if (v.is_list()) return std::any_of(v.as_list().begin(), v.as_list().end(), has_marks);
  if (v.is_dict())
    return std::any_of(v.as_dict().items.begin(), v.as_dict().items.end(),
                       [](const auto& kv) { return has_marks(kv.second); });
  return false;
}

bool equal(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.as_float() == b.as_float();
    return a.as_int() == b.as_int();
  }
  if (a.is_string() && b.is_string()) return a.as_str().s == b.as_str().s;
  if (a.is_undefined() || b.is_undefined()) return a.is_undefined() && b.is_undefined();
  if (a.is_none() || b.is_none()) return a.is_none() && b.is_none();
  if (a.is_list() && b.is_list()) {
    const List &x = a.as_list(), &y = b.as_list();
    if (x.size() != y.size() || x.tuple != y.tuple) return false;
    for (size_t i = 0; i < x.size(); ++i)
      if (!equal(x[i], y[i])) return false;
    return true;
  }
  if (a.is_dict() && b.is_dict()) {
    const Dict &x = a.as_dict(), &y = b.as_dict();
    if (x.is_namespace || y.is_namespace) return &x == &y;
    if (x.items.size() != y.items.size()) return false;
    for (const auto& [k, v] : x.items) {
      const Value* w = y.find(k);
      if (!w || !equal(v, *w)) return false;
    }
    return true;
  }
  if (a.is_callable() && b.is_callable()) return &a.as_callable() == &b.as_callable();
  return false;
}

bool less(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.as_float() < b.as_float();
    return a.as_int() < b.as_int();
  }
  if (a.is_string() && b.is_string()) return a.as_str().s < b.as_str().s;  // UTF-8 keeps code point order
  if (a.is_list() && b.is_list()) {
    const List &x = a.as_list(), &y = b.as_list();
    for (size_t i = 0; i < std::min(x.size(), y.size()); ++i) {
      if (less(x[i], y[i])) return true;
      if (less(y[i], x[i])) return false;
    }
    return x.size() < y.size();
  }
  fail(ErrorKind::InvalidInput, "'<' is not supported between a {} and a {}", a.type_name(), b.type_name());
}

}  // namespace depcache::jinja
