#pragma once
// Jinja2's filters, tests and Python's object access (attributes, items,
// slices, iteration, the string/dict/list methods a sandboxed template may
// call) on jinja values.
#include <optional>
#include <string_view>
#include <vector>

#include "jinja/value.h"

namespace depcache::jinja {

// `obj.name`: a dict's method, else its item; a namespace's attribute; a
// string's or list's method; otherwise undefined. Throws on an undefined obj.
Value get_attr(const Value& obj, const std::string& name);
// `obj[key]`: an item, else (for a string key) an attribute; otherwise undefined.
Value get_item(const Value& obj, const Value& key);
// `obj[start:stop:step]`, Python's slice of a list or string.
Value get_slice(const Value& obj, const Value& start, const Value& stop, const Value& step);
// What `for x in v` visits: a list's items, a dict's keys, a string's
// characters; nothing for undefined. Throws for other types.
List iterate(const Value& v);

// Filters and tests by name (the parser accepts only these names).
bool is_filter(std::string_view name);
bool is_test(std::string_view name);
Value apply_filter(std::string_view name, const Value& v, Args& args);
bool apply_test(std::string_view name, const Value& v, Args& args);

// Python's str.format with positional and keyword fields.
std::string python_format(std::string_view fmt, const Args& args);
// `fmt % args`, %s/%d/%r/%f style.
std::string percent_format(std::string_view fmt, const Value& args);

// The number of characters (code points) of a UTF-8 string.
size_t char_count(std::string_view s);

}  // namespace depcache::jinja
