// Jinja2's builtin filters and tests, and Python's string formatting.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "jinja/builtins.h"
#include "util/error.h"

namespace depcache::jinja {
namespace {

[[noreturn]] void filter_error(std::string_view filter, const std::string& what) {
  fail(ErrorKind::InvalidInput, "filter '{}': {}", filter, what);
}

const Value kNone = Value::none();

Value need_defined(const Value& v, std::string_view filter) {
  if (v.is_undefined()) fail(ErrorKind::InvalidInput, "{} (in filter '{}')", v.undefined_why(), filter);
  return v;
}

Value attribute_of(const Value& item, const Value& attribute) {
  if (attribute.is_int()) return get_item(item, attribute);
  // "a.b" walks attributes, as Jinja2's attribute getter does.
  Value v = item;
  const std::string& path = attribute.to_str().s;
  size_t b = 0;
  while (true) {
    const size_t dot = path.find('.', b);
    const std::string part = path.substr(b, dot == std::string::npos ? std::string::npos : dot - b);
    v = get_item(v, Value::string(part));
    if (dot == std::string::npos) return v;
    b = dot + 1;
  }
}

// Jinja2's sort key: strings compare case-insensitively unless asked.
Value sort_key(const Value& v, bool case_sensitive) {
  if (case_sensitive || !v.is_string()) return v;
  std::string s = v.as_str().s;
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return Value::string(std::move(s));
}

Args rest_args(const Args& a, size_t from, std::string what) {
  Args out;
  out.what = std::move(what);
  for (size_t i = from; i < a.pos.size(); ++i) out.pos.push_back(a.pos[i]);
  out.kw = a.kw;
  return out;
}

Value select(const Value& seq, Args& a, bool keep, bool by_attr, std::string_view filter) {
  List out;
  if (!seq.truthy()) return Value::list({});  // Jinja2 visits nothing of an empty or none sequence
  const size_t test_pos = by_attr ? 1 : 0;
  if (by_attr && a.pos.empty()) filter_error(filter, "needs an attribute");
  for (const Value& item : iterate(seq)) {
    const Value v = by_attr ? attribute_of(item, a.pos[0]) : item;
    bool ok;
    if (a.pos.size() > test_pos) {
      Args test_args = rest_args(a, test_pos + 1, "test");
      ok = apply_test(need_defined(a.pos[test_pos], filter).to_str().s, v, test_args);
    } else {
      ok = v.truthy();
    }
    if (ok == keep) out.push_back(item);
  }
  return Value::list(std::move(out));
}

Str indent(const Str& s, const Value& width, bool first, bool blank) {
  std::string ind;
  if (width.is_string()) {
    ind = width.as_str().s;
  } else {
    const auto n = static_cast<size_t>(std::max<int64_t>(0, width.as_int()));
    check_string_size(n);
    ind.assign(n, ' ');
  }
  std::vector<std::string> lines;
  const std::string text = s.s + "\n";
  size_t b = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] != '\n' && text[i] != '\r') continue;
    size_t e = i + 1;
    if (text[i] == '\r' && e < text.size() && text[e] == '\n') ++e;
    lines.push_back(text.substr(b, i - b));
    b = e;
    i = e - 1;
  }
  std::string out;
  check_string_size(text.size() + ind.size() * lines.size());
  if (first) out = ind;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (i) out += '\n';
    if (i && (blank || !lines[i].empty())) out += ind;
    out += lines[i];
  }
  return Str::derived(std::move(out), !s.marks.empty());
}

std::string html_escape(const std::string& s) {
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

// A mapping's (key, value) pairs, sorted by key or value.
Value dictsort_filter(std::string_view name, const Value& v, Args& a) {
  a.check(3, {"case_sensitive", "by", "reverse"});
  if (!v.is_dict()) filter_error(name, "needs a mapping, not a " + v.type_name());
  const bool cs = a.get(0, "case_sensitive", Value::boolean(false)).truthy();
  const std::string by = a.get(1, "by", Value::string("key")).to_str().s;
  const bool rev = a.get(2, "reverse", Value::boolean(false)).truthy();
  List out;
  for (const auto& [k, x] : v.as_dict().items) out.push_back(Value::tuple({k, x}));
  const size_t pos = by == "value" ? 1 : 0;
  std::stable_sort(out.begin(), out.end(), [&](const Value& x, const Value& y) {
    return less(sort_key(x.as_list()[pos], cs), sort_key(y.as_list()[pos], cs));
  });
  if (rev) std::reverse(out.begin(), out.end());
  return Value::list(std::move(out));
}

// Each item's attribute, or each item through a filter.
Value map_filter(std::string_view name, const Value& v, Args& a) {
  List out;
  if (!v.truthy()) return Value::list({});
  const Value& attr = a.get(99, "attribute", kNone);
  if (!attr.is_none()) {
    const Value& def = a.get(99, "default", kNone);
    for (const Value& item : iterate(v)) {
      Value x = attribute_of(item, attr);
      out.push_back(x.is_undefined() && !def.is_none() ? def : x);
    }
    return Value::list(std::move(out));
  }
  if (a.pos.empty()) filter_error(name, "needs a filter name or attribute=");
  const std::string f = a.pos[0].to_str().s;
  static const char* kMappable[] = {"upper",   "lower", "title",  "capitalize", "trim",    "string",
                                    "int",     "float", "length", "count",      "tojson",  "first",
                                    "last",    "list",  "abs",    "round",      "default", "d",
                                    "replace", "join",  "items",  "safe",       "escape",  "e"};
  if (std::find(std::begin(kMappable), std::end(kMappable), f) == std::end(kMappable))
    filter_error(name, "no filter named '" + f + "'");
  for (const Value& item : iterate(v)) {
    Args fa = rest_args(a, 1, f);
    out.push_back(apply_filter(f, item, fa));
  }
  return Value::list(std::move(out));
}

// sort, unique, min and max: one key (attribute, case folding) over the items.
Value sort_filter(std::string_view name, const Value& v, Args& a) {
  const bool is_sort = name == "sort";
  a.check(is_sort ? 3 : 2, {"reverse", "case_sensitive", "attribute"});
  const bool rev = is_sort && a.get(0, "reverse", Value::boolean(false)).truthy();
  const bool cs = a.get(is_sort ? 1 : 0, "case_sensitive", Value::boolean(false)).truthy();
  const Value& attr = a.get(is_sort ? 2 : 1, "attribute", kNone);
  List items = iterate(v);
  const auto key = [&](const Value& x) { return sort_key(attr.is_none() ? x : attribute_of(x, attr), cs); };
  if (name == "unique") {
    List out;
    for (const Value& x : items)
      if (std::none_of(out.begin(), out.end(), [&](const Value& y) { return equal(key(x), key(y)); }))
        out.push_back(x);
    return Value::list(std::move(out));
  }
  if (!is_sort) {
    if (items.empty()) return Value::undefined(fmt::format("{} of an empty sequence", name));
    const auto cmp = [&](const Value& x, const Value& y) { return less(key(x), key(y)); };
    return name == "min" ? *std::min_element(items.begin(), items.end(), cmp)
                         : *std::max_element(items.begin(), items.end(), cmp);
  }
  std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
    return rev ? less(key(y), key(x)) : less(key(x), key(y));
  });
  return Value::list(std::move(items));
}

// int and float: a number from a number or a string, else the default.
Value number_filter(std::string_view name, const Value& v, Args& a) {
  const bool is_int = name == "int";
  a.check(2, {"default", "base"});
  const Value def = a.get(0, "default", is_int ? Value::integer(0) : Value::number(0.0));
  // Jinja2 falls back to the default where Python's int() raises ValueError
  // (NaN); an infinity raises OverflowError, which it lets through.
  const auto to_int = [&](double f) { return std::isnan(f) ? def : Value::integer(int_from_float(f)); };
  if (v.is_int() || v.is_bool()) return is_int ? Value::integer(v.as_int()) : Value::number(v.as_float());
  if (v.is_number()) return is_int ? to_int(v.as_float()) : Value::number(v.as_float());
  if (!v.is_string()) return def;
  const std::string s = v.as_str().s;
  double parsed = 0;
  try {
    size_t used = 0;
    if (is_int) {
      const int64_t base = a.get(1, "base", Value::integer(10)).as_int();
      const long long i = std::stoll(s, &used, static_cast<int>(base));
      if (used == s.size()) return Value::integer(i);
    }
    const double f = std::stod(s, &used);
    if (used != s.size()) return def;
    parsed = f;
  } catch (const std::exception&) {
    return def;
  }
  return is_int ? to_int(parsed) : Value::number(parsed);
}
}  // namespace

namespace {

using FilterFn = Value (*)(std::string_view name, const Value& v, Args& a);

// Each filter under its names (Jinja2's aliases share one entry): the one
// list both the parser (is_filter) and the renderer read.
const std::vector<std::pair<std::vector<std::string_view>, FilterFn>>& filter_table() {
  static const std::vector<std::pair<std::vector<std::string_view>, FilterFn>> table = {
      {{"default", "d"},
       [](std::string_view, const Value& v, Args& a) -> Value {
         a.check(2, {"default_value", "boolean"});
         const bool boolean = a.get(1, "boolean", Value::boolean(false)).truthy();
         if (v.is_undefined() || (boolean && !v.truthy()))
           return a.get(0, "default_value", Value::string(""));
         return v;
       }},
      {{"length", "count"},
       [](std::string_view name, const Value& v, Args&) -> Value {
         if (v.is_undefined()) return Value::integer(0);
         if (v.is_string()) return Value::integer(static_cast<int64_t>(char_count(v.as_str().s)));
         if (v.is_list()) return Value::integer(static_cast<int64_t>(v.as_list().size()));
         if (v.is_dict() && !v.as_dict().is_namespace)
           return Value::integer(static_cast<int64_t>(v.as_dict().items.size()));
         filter_error(name, "a " + v.type_name() + " has no length");
       }},
      {{"tojson"},
       [](std::string_view name, const Value& v, Args& a) -> Value {
         a.check(1, {"indent", "ensure_ascii"});
         const Value& ind = a.get(0, "indent", kNone);
         if (a.get(1, "ensure_ascii", Value::boolean(false)).truthy())
           filter_error(name, "ensure_ascii=True is not supported");
         return Value::str(Str::derived(
             v.to_json(ind.is_none() ? -1 : static_cast<int>(std::clamp<int64_t>(ind.as_int(), 0, 64))),
             has_marks(v)));
       }},
      {{"trim"},
       [](std::string_view name, const Value& v, Args& a) -> Value {
         a.check(1, {"chars"});
         Args m;
         m.pos.push_back(a.get(0, "chars", kNone));
         return get_attr(Value::str(need_defined(v, name).to_str()), "strip").as_callable().call(m);
       }},
      {{"string"}, [](std::string_view, const Value& v, Args&) -> Value { return Value::str(v.to_str()); }},
      {{"upper", "lower", "title", "capitalize"},
       [](std::string_view name, const Value& v, Args&) -> Value {
         Args none;
         return get_attr(Value::str(need_defined(v, name).to_str()), std::string(name))
             .as_callable()
             .call(none);
       }},
      {{"replace"},
       [](std::string_view name, const Value& v, Args& a) -> Value {
         Args m;
         m.pos = a.pos;
         if (const Value& c = a.get(2, "count", kNone); !c.is_none() && a.pos.size() < 3) m.pos.push_back(c);
         return get_attr(Value::str(need_defined(v, name).to_str()), "replace").as_callable().call(m);
       }},
      {{"safe"}, [](std::string_view, const Value& v, Args&) -> Value { return v; }},
      {{"escape", "e"},
       [](std::string_view, const Value& v, Args&) -> Value {
         const Str s = v.to_str();
         return Value::str(Str::derived(html_escape(s.s), !s.marks.empty()));
       }},
      {{"first", "last"},
       [](std::string_view name, const Value& v, Args&) -> Value {
         const List items = iterate(need_defined(v, name));
         if (items.empty()) return Value::undefined(fmt::format("{} of an empty sequence", name));
         return name == "first" ? items.front() : items.back();
       }},
      {{"list"}, [](std::string_view, const Value& v, Args&) -> Value { return Value::list(iterate(v)); }},
      {{"items"},
       [](std::string_view name, const Value& v, Args&) -> Value {
         if (v.is_undefined()) return Value::list({});
         if (!v.is_dict() || v.as_dict().is_namespace)
           filter_error(name, "needs a mapping, not a " + v.type_name());
         List out;
         for (const auto& [k, x] : v.as_dict().items) out.push_back(Value::tuple({k, x}));
         return Value::list(std::move(out));
       }},
      {{"dictsort"}, dictsort_filter},
      {{"join"},
       [](std::string_view, const Value& v, Args& a) -> Value {
         a.check(2, {"d", "attribute"});
         const Value& attr = a.get(1, "attribute", kNone);
         const Str sep = a.get(0, "d", Value::string("")).to_str();
         Str out;
         bool first = true;
         for (const Value& item : iterate(v)) {
           if (!first) out.append(sep);
           first = false;
           out.append((attr.is_none() ? item : attribute_of(item, attr)).to_str());
         }
         return Value::str(std::move(out));
       }},
      {{"map"}, map_filter},
      {{"select"},
       [](std::string_view name, const Value& v, Args& a) -> Value {
         return select(v, a, true, false, name);
       }},
      {{"reject"},
       [](std::string_view name, const Value& v, Args& a) -> Value {
         return select(v, a, false, false, name);
       }},
      {{"selectattr"},
       [](std::string_view name, const Value& v, Args& a) -> Value {
         return select(v, a, true, true, name);
       }},
      {{"rejectattr"},
       [](std::string_view name, const Value& v, Args& a) -> Value {
         return select(v, a, false, true, name);
       }},
      {{"sort", "unique", "min", "max"}, sort_filter},
      {{"reverse"},
       [](std::string_view, const Value& v, Args&) -> Value {
         if (v.is_string()) {
           Str out;
           const List chars = iterate(v);
           for (auto it = chars.rbegin(); it != chars.rend(); ++it) out.append(it->as_str());
           return Value::str(std::move(out));
         }
         List items = iterate(v);
         std::reverse(items.begin(), items.end());
         return Value::list(std::move(items));
       }},
      {{"int", "float"}, number_filter},
      {{"abs"},
       [](std::string_view name, const Value& v, Args&) -> Value {
         if (v.is_int()) return Value::integer(v.as_int() < 0 ? int_sub(0, v.as_int()) : v.as_int());
         if (v.is_number()) return Value::number(std::fabs(v.as_float()));
         filter_error(name, "needs a number, not a " + v.type_name());
       }},
      {{"round"},
       [](std::string_view name, const Value& v, Args& a) -> Value {
         a.check(2, {"precision", "method"});
         if (!v.is_number()) filter_error(name, "needs a number, not a " + v.type_name());
         const int64_t p = a.get(0, "precision", Value::integer(0)).as_int();
         const std::string method = a.get(1, "method", Value::string("common")).to_str().s;
         const double scale = std::pow(10.0, static_cast<double>(std::clamp<int64_t>(p, -300, 300)));
         double x = v.as_float() * scale;
         x = method == "floor" ? std::floor(x) : method == "ceil" ? std::ceil(x) : std::round(x);
         return Value::number(x / scale);
       }},
      {{"sum"},
       [](std::string_view name, const Value& v, Args& a) -> Value {
         a.check(2, {"attribute", "start"});
         const Value& attr = a.get(0, "attribute", kNone);
         Value total = a.get(1, "start", Value::integer(0));
         for (const Value& item : iterate(v)) {
           const Value x = attr.is_none() ? item : attribute_of(item, attr);
           if (!x.is_number() || !total.is_number()) filter_error(name, "needs numbers");
           total = total.is_float() || x.is_float() ? Value::number(total.as_float() + x.as_float())
                                                    : Value::integer(int_add(total.as_int(), x.as_int()));
         }
         return total;
       }},
      {{"indent"},
       [](std::string_view name, const Value& v, Args& a) -> Value {
         a.check(3, {"width", "first", "blank"});
         return Value::str(indent(need_defined(v, name).to_str(), a.get(0, "width", Value::integer(4)),
                                  a.get(1, "first", Value::boolean(false)).truthy(),
                                  a.get(2, "blank", Value::boolean(false)).truthy()));
       }},
      {{"wordcount"},
       [](std::string_view, const Value& v, Args&) -> Value {
         Args none;
         return Value::integer(static_cast<int64_t>(
             get_attr(Value::str(v.to_str()), "split").as_callable().call(none).as_list().size()));
       }},
  };
  return table;
}

FilterFn find_filter(std::string_view name) {
  for (const auto& [names, fn] : filter_table())
    if (std::find(names.begin(), names.end(), name) != names.end()) return fn;
  return nullptr;
}

using TestFn = bool (*)(std::string_view name, const Value& v, Args& a);

const Value& test_arg(std::string_view test, const Args& a) {
  if (a.pos.empty()) fail(ErrorKind::InvalidInput, "test '{}' needs an argument", test);
  return a.pos[0];
}

bool test_in(std::string_view name, const Value& v, Args& a) {
  const Value& seq = test_arg(name, a);
  if (seq.is_string() && v.is_string()) return seq.as_str().s.find(v.as_str().s) != std::string::npos;
  for (const Value& x : iterate(seq))
    if (equal(x, v)) return true;
  return false;
}

bool test_sameas(std::string_view name, const Value& v, Args& a) {
  const Value& o = test_arg(name, a);
  if (v.is_none() || o.is_none()) return v.is_none() && o.is_none();
  if (v.is_bool() || o.is_bool()) return v.is_bool() && o.is_bool() && v.as_bool() == o.as_bool();
  if (v.data().index() != o.data().index()) return false;
  if (v.is_list()) return &v.as_list() == &o.as_list();
  if (v.is_dict()) return &v.as_dict() == &o.as_dict();
  return equal(v, o);  // numbers and strings: CPython shares equal constants
}

// Each test under its names: the one list both the parser (is_test) and the
// renderer read.
const std::vector<std::pair<std::vector<std::string_view>, TestFn>>& test_table() {
  static const std::vector<std::pair<std::vector<std::string_view>, TestFn>> table = {
      {{"defined"}, [](std::string_view, const Value& v, Args&) { return !v.is_undefined(); }},
      {{"undefined"}, [](std::string_view, const Value& v, Args&) { return v.is_undefined(); }},
      {{"none"}, [](std::string_view, const Value& v, Args&) { return v.is_none(); }},
      {{"boolean"}, [](std::string_view, const Value& v, Args&) { return v.is_bool(); }},
      {{"true"}, [](std::string_view, const Value& v, Args&) { return v.is_bool() && v.as_bool(); }},
      {{"false"}, [](std::string_view, const Value& v, Args&) { return v.is_bool() && !v.as_bool(); }},
      {{"integer"}, [](std::string_view, const Value& v, Args&) { return v.is_int(); }},
      {{"float"}, [](std::string_view, const Value& v, Args&) { return v.is_float(); }},
      {{"number"}, [](std::string_view, const Value& v, Args&) { return v.is_number(); }},
      {{"string"}, [](std::string_view, const Value& v, Args&) { return v.is_string(); }},
      {{"mapping"},
       [](std::string_view, const Value& v, Args&) { return v.is_dict() && !v.as_dict().is_namespace; }},
      {{"iterable", "sequence"},
       [](std::string_view, const Value& v, Args&) {
         return v.is_undefined() || v.is_string() || v.is_list() ||
                (v.is_dict() && !v.as_dict().is_namespace);
       }},
      {{"callable"}, [](std::string_view, const Value& v, Args&) { return v.is_callable(); }},
      {{"eq", "equalto"},
       [](std::string_view name, const Value& v, Args& a) { return equal(v, test_arg(name, a)); }},
      {{"ne"}, [](std::string_view name, const Value& v, Args& a) { return !equal(v, test_arg(name, a)); }},
      {{"lt"}, [](std::string_view name, const Value& v, Args& a) { return less(v, test_arg(name, a)); }},
      {{"le"}, [](std::string_view name, const Value& v, Args& a) { return !less(test_arg(name, a), v); }},
      {{"gt"}, [](std::string_view name, const Value& v, Args& a) { return less(test_arg(name, a), v); }},
      {{"ge"}, [](std::string_view name, const Value& v, Args& a) { return !less(v, test_arg(name, a)); }},
      {{"in"}, test_in},
      {{"odd", "even"},
       [](std::string_view name, const Value& v, Args&) {
         if (!v.is_int()) fail(ErrorKind::InvalidInput, "test '{}' needs an integer", name);
         return (v.as_int() % 2 != 0) == (name == "odd");
       }},
      {{"divisibleby"},
       [](std::string_view name, const Value& v, Args& a) {
         const Value& d = test_arg(name, a);
         if (!v.is_int() || !d.is_int() || d.as_int() == 0)
           fail(ErrorKind::InvalidInput, "test 'divisibleby' needs nonzero integers");
         return d.as_int() == -1 || v.as_int() % d.as_int() == 0;  // INT64_MIN % -1 is undefined in C++
       }},
      {{"sameas"}, test_sameas},
      {{"lower", "upper"},
       [](std::string_view name, const Value& v, Args&) {
         if (!v.is_string()) return false;
         Args none;
         return get_attr(v, name == "lower" ? "islower" : "isupper").as_callable().call(none).truthy();
       }},
  };
  return table;
}

TestFn find_test(std::string_view name) {
  for (const auto& [names, fn] : test_table())
    if (std::find(names.begin(), names.end(), name) != names.end()) return fn;
  return nullptr;
}

}  // namespace

bool is_filter(std::string_view name) { return find_filter(name) != nullptr; }

bool is_test(std::string_view name) { return find_test(name) != nullptr; }

Value apply_filter(std::string_view name, const Value& v, Args& a) {
  a.what = std::string(name);
  const FilterFn fn = find_filter(name);
  if (!fn) filter_error(name, "not implemented");
  return fn(name, v, a);
}

bool apply_test(std::string_view name, const Value& v, Args& a) {
  const TestFn fn = find_test(name);
  if (!fn) fail(ErrorKind::InvalidInput, "test '{}' is not implemented", name);
  return fn(name, v, a);
}

std::string python_format(std::string_view f, const Args& a) {
  std::string out;
  size_t auto_index = 0;
  for (size_t i = 0; i < f.size(); ++i) {
    const char c = f[i];
    if (c == '}') {
      if (i + 1 < f.size() && f[i + 1] == '}') ++i;
      out += '}';
      continue;
    }
    if (c != '{') {
      out += c;
      continue;
    }
    if (i + 1 < f.size() && f[i + 1] == '{') {
      out += '{';
      ++i;
      continue;
    }
    const size_t close = f.find('}', i);
    if (close == std::string_view::npos) fail(ErrorKind::InvalidInput, "format: a '{{' is not closed");
    std::string field(f.substr(i + 1, close - i - 1));
    i = close;
    bool repr = false;
    if (const size_t bang = field.find('!'); bang != std::string::npos) {
      repr = field.substr(bang + 1) == "r";
      field.erase(bang);
    }
    if (field.find(':') != std::string::npos)
      fail(ErrorKind::InvalidInput, "format: format specs are not supported");
    Value v;
    if (field.empty()) {
      if (auto_index >= a.pos.size()) fail(ErrorKind::InvalidInput, "format: too few arguments");
      v = a.pos[auto_index++];
    } else if (std::all_of(field.begin(), field.end(),
                           [](char d) { return std::isdigit(static_cast<unsigned char>(d)); })) {
      const size_t k = field.size() > 9 ? a.pos.size() : std::stoul(field);
      if (k >= a.pos.size()) fail(ErrorKind::InvalidInput, "format: no argument {}", k);
      v = a.pos[k];
    } else {
      const auto it =
          std::find_if(a.kw.begin(), a.kw.end(), [&](const auto& kv) { return kv.first == field; });
      if (it == a.kw.end()) fail(ErrorKind::InvalidInput, "format: no argument '{}'", field);
      v = it->second;
    }
    out += repr ? v.repr() : v.to_str().s;
    check_string_size(out.size());
  }
  return out;
}

std::string percent_format(std::string_view f, const Value& args) {
  const List list = args.is_list() ? args.as_list() : List{args};
  std::string out;
  size_t next = 0;
  for (size_t i = 0; i < f.size(); ++i) {
    if (f[i] != '%') {
      out += f[i];
      continue;
    }
    if (++i >= f.size()) fail(ErrorKind::InvalidInput, "'%' format: incomplete format");
    const char spec = f[i];
    if (spec == '%') {
      out += '%';
      continue;
    }
    if (next >= list.size()) fail(ErrorKind::InvalidInput, "'%' format: not enough arguments");
    const Value& v = list[next++];
    if (spec == 's') {
      out += v.to_str().s;
    } else if (spec == 'r') {
      out += v.repr();
    } else if (spec == 'd' || spec == 'i') {
      if (!v.is_number()) fail(ErrorKind::InvalidInput, "'%d' format: a number is required");
      out += std::to_string(v.is_float() ? int_from_float(v.as_float()) : v.as_int());
    } else {
      fail(ErrorKind::InvalidInput, "'%' format: '%{}' is not supported", spec);
    }
    check_string_size(out.size());
  }
  if (next < list.size()) fail(ErrorKind::InvalidInput, "'%' format: not all arguments converted");
  return out;
}

}  // namespace depcache::jinja
