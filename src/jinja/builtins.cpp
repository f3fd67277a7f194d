#include "jinja/builtins.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "util/error.h"
#include "util/utf8.h"

namespace depcache::jinja {
namespace {

[[noreturn]] void type_error(const std::string& what) { fail(ErrorKind::InvalidInput, "{}", what); }

[[noreturn]] void undefined_error(const Value& v) { fail(ErrorKind::InvalidInput, "{}", v.undefined_why()); }

const Str& need_str(const Value& v, std::string_view what) {
  if (v.is_undefined()) undefined_error(v);
  if (!v.is_string()) type_error(fmt::format("{} needs a string, not a {}", what, v.type_name()));
  return v.as_str();
}

int64_t need_int(const Value& v, std::string_view what) {
  if (v.is_undefined()) undefined_error(v);
  if (!v.is_int() && !v.is_bool())
    type_error(fmt::format("{} needs an integer, not a {}", what, v.type_name()));
  return v.as_int();
}

// Byte offsets of each character's start, then the string's size.
std::vector<size_t> char_offsets(std::string_view s) {
  std::vector<size_t> out;
  for (size_t i = 0; i < s.size();) {
    out.push_back(i);
    utf8_next(s, i);
  }
  out.push_back(s.size());
  return out;
}

// Python's str.isspace() characters.
bool is_py_space(uint32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

// str.strip/lstrip/rstrip: of whitespace, or of the characters of `chars`.
Str strip(const Str& s, const Value& chars, bool left, bool right) {
  std::vector<uint32_t> set;
  const bool ws = chars.is_none() || chars.is_undefined();
  if (!ws) {
    const std::string& c = need_str(chars, "strip").s;
    for (size_t i = 0; i < c.size();) set.push_back(utf8_next(c, i));
  }
  const auto strippable = [&](uint32_t c) {
    return ws ? is_py_space(c) : std::find(set.begin(), set.end(), c) != set.end();
  };
  const std::vector<size_t> off = char_offsets(s.s);
  size_t b = 0, e = off.size() - 1;
  const auto at = [&](size_t k) {
    size_t i = off[k];
    return utf8_next(s.s, i);
  };
  if (left)
    while (b < e && strippable(at(b))) ++b;
  if (right)
    while (e > b && strippable(at(e - 1))) --e;
  return s.sub(off[b], off[e]);
}

// str.split(sep=None, maxsplit=-1) and rsplit.
List split(const Str& s, const Value& sep, int64_t maxsplit, bool from_right) {
  List out;
  if (sep.is_none() || sep.is_undefined()) {
    // Runs of whitespace separate; none at the ends.
    const std::vector<size_t> off = char_offsets(s.s);
    std::vector<std::pair<size_t, size_t>> words;
    size_t k = 0;
    const size_t n = off.size() - 1;
    const auto space_at = [&](size_t j) {
      size_t i = off[j];
      return is_py_space(utf8_next(s.s, i));
    };
    while (k < n) {
      while (k < n && space_at(k)) ++k;
      if (k == n) break;
      size_t e = k;
      while (e < n && !space_at(e)) ++e;
      words.emplace_back(k, e);
      k = e;
    }
    if (maxsplit >= 0 && static_cast<int64_t>(words.size()) > maxsplit + 1) {
      if (!from_right) {
        // The remainder keeps its trailing whitespace, as Python's does.
        const Str rest = s.sub(off[words[static_cast<size_t>(maxsplit)].first], s.s.size());
        for (int64_t i = 0; i < maxsplit; ++i) {
          const auto [b, e] = words[static_cast<size_t>(i)];
          out.push_back(Value::str(s.sub(off[b], off[e])));
        }
        out.push_back(Value::str(rest));
        return out;
      }
      const size_t first_kept = words.size() - static_cast<size_t>(maxsplit);
      out.push_back(Value::str(s.sub(0, off[words[first_kept - 1].second])));
      for (size_t i = first_kept; i < words.size(); ++i)
        out.push_back(Value::str(s.sub(off[words[i].first], off[words[i].second])));
      return out;
    }
    for (const auto& [b, e] : words) out.push_back(Value::str(s.sub(off[b], off[e])));
    return out;
  }
  const std::string& d = need_str(sep, "split").s;
  if (d.empty()) type_error("split: empty separator");
  std::vector<size_t> cuts;  // positions of separators used
  if (!from_right) {
    for (size_t p = s.s.find(d); p != std::string::npos; p = s.s.find(d, p + d.size())) {
      if (maxsplit >= 0 && static_cast<int64_t>(cuts.size()) >= maxsplit) break;
      cuts.push_back(p);
    }
  } else {
    size_t end = s.s.size();
    while (end >= d.size()) {
      if (maxsplit >= 0 && static_cast<int64_t>(cuts.size()) >= maxsplit) break;
      const size_t p = s.s.rfind(d, end - d.size());
      if (p == std::string::npos) break;
      cuts.push_back(p);
      end = p;
    }
    std::reverse(cuts.begin(), cuts.end());
  }
  size_t b = 0;
  for (const size_t p : cuts) {
    out.push_back(Value::str(s.sub(b, p)));
    b = p + d.size();
  }
  out.push_back(Value::str(s.sub(b, s.s.size())));
  return out;
}

Str replace(const Str& s, const std::string& from, const Str& to, int64_t count) {
  Str out;
  size_t b = 0;
  int64_t n = 0;
  if (from.empty()) {  // Python inserts `to` between characters
    const std::vector<size_t> off = char_offsets(s.s);
    for (size_t k = 0; k + 1 < off.size(); ++k) {
      if (count < 0 || n < count) {
        out.append(to);
        ++n;
      }
      out.append(s.sub(off[k], off[k + 1]));
    }
    if (count < 0 || n < count) out.append(to);
    return out;
  }
  for (size_t p = s.s.find(from); p != std::string::npos && (count < 0 || n < count);
       p = s.s.find(from, b), ++n) {
    out.append(s.sub(b, p));
    out.append(to);
    b = p + from.size();
  }
  out.append(s.sub(b, s.s.size()));
  return out;
}

std::string ascii_case(std::string s, bool upper) {
  // ASCII letters change case; other characters are kept as they are.
  for (char& c : s)
    c = static_cast<char>(upper ? std::toupper(static_cast<unsigned char>(c))
                                : std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string title_case(const std::string& s) {
  std::string out;
  bool prev_letter = false;
  for (const char c : s) {
    const bool letter = std::isalpha(static_cast<unsigned char>(c)) != 0;
    out += static_cast<char>(letter ? (prev_letter ? std::tolower(static_cast<unsigned char>(c))
                                                   : std::toupper(static_cast<unsigned char>(c)))
                                    : c);
    prev_letter = letter || (static_cast<unsigned char>(c) >= 0x80);
  }
  return out;
}

bool starts_or_ends(const std::string& s, const Value& what, bool starts) {
  const auto one = [&](const Value& v) {
    const std::string& p = need_str(v, starts ? "startswith" : "endswith").s;
    return starts ? s.starts_with(p) : s.ends_with(p);
  };
  if (what.is_list()) return std::any_of(what.as_list().begin(), what.as_list().end(), one);
  return one(what);
}

struct Method : Callable {
  Value self;
  std::string method;
  Method(Value s, std::string m) : self(std::move(s)), method(std::move(m)) {}
  std::string name() const override { return method; }
  Value call(Args& a) const override;
};

List split_lines(const Str& s, bool keep_ends) {
  List out;
  size_t b = 0;
  for (size_t i = 0; i < s.s.size(); ++i) {
    const char c = s.s[i];
    if (c != '\n' && c != '\r') continue;
    size_t e = i + 1;
    if (c == '\r' && e < s.s.size() && s.s[e] == '\n') ++e;
    out.push_back(Value::str(s.sub(b, keep_ends ? e : i)));
    b = e;
    i = e - 1;
  }
  if (b < s.s.size()) out.push_back(Value::str(s.sub(b, s.s.size())));
  return out;
}

// str.find/rfind/index/rindex (a character position) and str.count.
Value str_search(const Str& s, const std::string& m, Args& a) {
  a.check(1, {});
  if (a.pos.empty()) type_error(m + "() takes one argument");
  const std::string& sub = need_str(a.pos[0], m).s;
  if (m == "count") {
    if (sub.empty()) return Value::integer(static_cast<int64_t>(char_count(s.s)) + 1);
    int64_t n = 0;
    for (size_t p = s.s.find(sub); p != std::string::npos; p = s.s.find(sub, p + sub.size())) ++n;
    return Value::integer(n);
  }
  const size_t p = m[0] == 'r' ? s.s.rfind(sub) : s.s.find(sub);
  if (p == std::string::npos) {
    if (m == "index" || m == "rindex") type_error("substring not found");
    return Value::integer(-1);
  }
  return Value::integer(static_cast<int64_t>(char_count(s.s.substr(0, p))));
}

Value str_join(const Str& s, const std::string&, Args& a) {
  a.check(1, {});
  if (a.pos.empty()) type_error("join() takes one argument");
  Str out;
  bool first = true;
  for (const Value& v : iterate(a.pos[0])) {
    if (!first) out.append(s);
    first = false;
    out.append(need_str(v, "join"));
  }
  return Value::str(std::move(out));
}

// str.isdigit, isalpha, isalnum and isspace: false for an empty string, else
// whether every byte is of the class.
Value str_is_class(const Str& s, const std::string& m, Args&) {
  const auto all = [&](auto pred) {
    if (s.s.empty()) return Value::boolean(false);
    return Value::boolean(std::all_of(s.s.begin(), s.s.end(),
                                      [&](char c) { return pred(static_cast<unsigned char>(c)) != 0; }));
  };
  if (m == "isdigit") return all([](unsigned char c) { return std::isdigit(c); });
  if (m == "isalpha") return all([](unsigned char c) { return std::isalpha(c); });
  if (m == "isalnum") return all([](unsigned char c) { return std::isalnum(c); });
  return all([](unsigned char c) { return std::isspace(c); });
}

using StrMethodFn = Value (*)(const Str& s, const std::string& m, Args& a);

// Each string method under its names: the one list both is_method and
// Method::call read.
const std::vector<std::pair<std::vector<std::string_view>, StrMethodFn>>& str_method_table() {
  static const std::vector<std::pair<std::vector<std::string_view>, StrMethodFn>> table = {
      {{"strip", "lstrip", "rstrip"},
       [](const Str& s, const std::string& m, Args& a) {
         a.check(1, {"chars"});
         return Value::str(strip(s, a.get(0, "chars", Value::none()), m != "rstrip", m != "lstrip"));
       }},
      {{"split", "rsplit"},
       [](const Str& s, const std::string& m, Args& a) {
         a.check(2, {"sep", "maxsplit"});
         const Value& ms = a.get(1, "maxsplit", Value::integer(-1));
         return Value::list(split(s, a.get(0, "sep", Value::none()), need_int(ms, m), m == "rsplit"));
       }},
      {{"splitlines"},
       [](const Str& s, const std::string&, Args& a) {
         a.check(1, {"keepends"});
         return Value::list(split_lines(s, a.get(0, "keepends", Value::boolean(false)).truthy()));
       }},
      {{"startswith", "endswith"},
       [](const Str& s, const std::string& m, Args& a) {
         a.check(1, {});
         if (a.pos.empty()) type_error(m + "() takes one argument");
         return Value::boolean(starts_or_ends(s.s, a.pos[0], m == "startswith"));
       }},
      {{"replace"},
       [](const Str& s, const std::string& m, Args& a) {
         a.check(3, {});
         if (a.pos.size() < 2) type_error("replace() takes two or three arguments");
         const int64_t count = a.pos.size() > 2 ? need_int(a.pos[2], m) : -1;
         return Value::str(replace(s, need_str(a.pos[0], m).s, need_str(a.pos[1], m), count));
       }},
      {{"upper", "lower"},
       [](const Str& s, const std::string& m, Args&) {
         return Value::str(Str::derived(ascii_case(s.s, m == "upper"), !s.marks.empty()));
       }},
      {{"title"},
       [](const Str& s, const std::string&, Args&) {
         return Value::str(Str::derived(title_case(s.s), !s.marks.empty()));
       }},
      {{"capitalize"},
       [](const Str& s, const std::string&, Args&) {
         std::string out = ascii_case(s.s, false);
         if (!out.empty()) out[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(out[0])));
         return Value::str(Str::derived(std::move(out), !s.marks.empty()));
       }},
      {{"find", "rfind", "index", "rindex", "count"}, str_search},
      {{"join"}, str_join},
      {{"format"},
       [](const Str& s, const std::string&, Args& a) {
         bool marked = !s.marks.empty();
         for (const Value& v : a.pos) marked = marked || has_marks(v);
         for (const auto& [k, v] : a.kw) marked = marked || has_marks(v);
         return Value::str(Str::derived(python_format(s.s, a), marked));
       }},
      {{"isdigit", "isalpha", "isalnum", "isspace"}, str_is_class},
      {{"isupper"},
       [](const Str& s, const std::string&, Args&) {
         return Value::boolean(s.s != ascii_case(s.s, false) && s.s == ascii_case(s.s, true));
       }},
      {{"islower"},
       [](const Str& s, const std::string&, Args&) {
         return Value::boolean(s.s != ascii_case(s.s, true) && s.s == ascii_case(s.s, false));
       }},
  };
  return table;
}

StrMethodFn find_str_method(std::string_view name) {
  for (const auto& [names, fn] : str_method_table())
    if (std::find(names.begin(), names.end(), name) != names.end()) return fn;
  return nullptr;
}

Value str_method(const Str& s, const std::string& m, Args& a) {
  const StrMethodFn fn = find_str_method(m);
  if (!fn) type_error(fmt::format("'str' object has no attribute '{}'", m));
  return fn(s, m, a);
}

Value Method::call(Args& a) const {
  a.what = method;
  if (self.is_string()) return str_method(self.as_str(), method, a);
  if (self.is_dict()) {
    const Dict& d = self.as_dict();
    if (method == "get") {
      a.check(2, {});
      if (a.pos.empty()) type_error("get() takes one or two arguments");
      const Value* v = d.find(a.pos[0]);
      return v ? *v : a.pos.size() > 1 ? a.pos[1] : Value::none();
    }
    List out;
    for (const auto& [k, v] : d.items) {
      if (method == "keys") out.push_back(k);
      if (method == "values") out.push_back(v);
      if (method == "items") out.push_back(Value::tuple({k, v}));
    }
    return Value::list(std::move(out));
  }
  if (self.is_list()) {
    const List& l = self.as_list();
    a.check(1, {});
    if (a.pos.empty()) type_error(method + "() takes one argument");
    int64_t n = 0;
    for (size_t i = 0; i < l.size(); ++i)
      if (equal(l[i], a.pos[0])) {
        if (method == "index") return Value::integer(static_cast<int64_t>(i));
        ++n;
      }
    if (method == "index") type_error("the value is not in the list");
    return Value::integer(n);
  }
  type_error("a method call on a " + self.type_name());
}

bool is_method(const Value& obj, const std::string& name) {
  static const std::vector<std::string> kDict = {"get", "keys", "values", "items"};
  static const std::vector<std::string> kList = {"index", "count"};
  const auto in = [&](const std::vector<std::string>& v) {
    return std::find(v.begin(), v.end(), name) != v.end();
  };
  if (obj.is_string()) return find_str_method(name) != nullptr;
  if (obj.is_dict() && !obj.as_dict().is_namespace) return in(kDict);
  if (obj.is_list()) return in(kList);
  return false;
}

// Python's index normalisation: negative counts from the end.
std::optional<size_t> list_index(int64_t i, size_t n) {
  if (i < 0) i += static_cast<int64_t>(n);
  if (i < 0 || i >= static_cast<int64_t>(n)) return std::nullopt;
  return static_cast<size_t>(i);
}

}  // namespace

size_t char_count(std::string_view s) { return char_offsets(s).size() - 1; }

Value get_attr(const Value& obj, const std::string& name) {
  if (obj.is_undefined()) undefined_error(obj);
  if (name.starts_with("_")) type_error("access to the attribute '" + name + "' is unsafe");
  if (is_method(obj, name)) return Value::function(std::make_shared<Method>(obj, name));
  if (obj.is_dict()) {
    const Value* v = obj.as_dict().find(name);
    if (v) return *v;
  }
  return Value::undefined(fmt::format("'{}' has no attribute '{}'", obj.type_name(), name));
}

Value get_item(const Value& obj, const Value& key) {
  if (obj.is_undefined()) undefined_error(obj);
  if (obj.is_dict()) {
    if (const Value* v = obj.as_dict().find(key)) return *v;
  } else if (obj.is_list() && (key.is_int() || key.is_bool())) {
    if (auto i = list_index(key.as_int(), obj.as_list().size())) return obj.as_list()[*i];
  } else if (obj.is_string() && (key.is_int() || key.is_bool())) {
    const std::vector<size_t> off = char_offsets(obj.as_str().s);
    if (auto i = list_index(key.as_int(), off.size() - 1))
      return Value::str(obj.as_str().sub(off[*i], off[*i + 1]));
  }
  if (key.is_string()) return get_attr(obj, key.as_str().s);
  return Value::undefined(fmt::format("'{}' has no item {}", obj.type_name(), key.repr()));
}

Value get_slice(const Value& obj, const Value& start, const Value& stop, const Value& step) {
  if (obj.is_undefined()) undefined_error(obj);
  const auto opt = [](const Value& v, const char* what) -> std::optional<int64_t> {
    if (v.is_none() || v.is_undefined()) return std::nullopt;
    return need_int(v, what);
  };
  const int64_t st = opt(step, "a slice step").value_or(1);
  if (st == 0) type_error("a slice step cannot be zero");
  std::vector<size_t> off;
  int64_t n = 0;
  if (obj.is_list()) {
    n = static_cast<int64_t>(obj.as_list().size());
  } else if (obj.is_string()) {
    off = char_offsets(obj.as_str().s);
    n = static_cast<int64_t>(off.size()) - 1;
  } else {
    type_error("a " + obj.type_name() + " cannot be sliced");
  }
  // Python's slice.indices().
  const auto clamp = [&](std::optional<int64_t> v, int64_t def) {
    if (!v) return def;
    int64_t x = *v;
    if (x < 0) x += n;
    if (st > 0) return std::clamp<int64_t>(x, 0, n);
    return std::clamp<int64_t>(x, -1, n - 1);
  };
  const int64_t b = clamp(opt(start, "a slice start"), st > 0 ? 0 : n - 1);
  const int64_t e = clamp(opt(stop, "a slice stop"), st > 0 ? n : -1);
  if (obj.is_string() && st == 1) {
    return Value::str(
        obj.as_str().sub(off[static_cast<size_t>(b)], off[static_cast<size_t>(std::max(b, e))]));
  }
  List items;
  Str s;
  for (int64_t i = b; st > 0 ? i < e : i > e;) {
    const auto k = static_cast<size_t>(i);
    if (obj.is_list())
      items.push_back(obj.as_list()[k]);
    else
      s.append(obj.as_str().sub(off[k], off[k + 1]));
    if (__builtin_add_overflow(i, st, &i)) break;  // past 64 bits is past the end
  }
  return obj.is_list() ? Value::list(std::move(items)) : Value::str(std::move(s));
}

List iterate(const Value& v) {
  if (v.is_undefined()) return {};
  if (v.is_list()) return v.as_list();
  if (v.is_dict() && !v.as_dict().is_namespace) {
    List out;
    for (const auto& [k, x] : v.as_dict().items) out.push_back(k);
    return out;
  }
  if (v.is_string()) {
    List out;
    const std::vector<size_t> off = char_offsets(v.as_str().s);
    for (size_t k = 0; k + 1 < off.size(); ++k) out.push_back(Value::str(v.as_str().sub(off[k], off[k + 1])));
    return out;
  }
  type_error("'" + v.type_name() + "' object is not iterable");
}

}  // namespace depcache::jinja
