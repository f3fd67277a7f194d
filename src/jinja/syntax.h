#pragma once
// A chat template's syntax tree: Jinja2's statements (if, for, set, macro,
// call, filter, break/continue) and expressions, read with the settings chat
// templates are written for (trim_blocks, lstrip_blocks, `-`/`+` whitespace
// control). A construct outside that subset is refused by name.
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "jinja/value.h"

namespace depcache::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind {
    Literal,  // value
    Name,     // name
    List,     // items
    Tuple,    // items
    Dict,     // items: key, value, key, value...
    Attr,     // items[0].name
    Item,     // items[0][items[1]]
    Slice,    // items[0][items[1]:items[2]:items[3]], absent parts null
    Call,     // items[0](items[1..], kwargs)
    Filter,   // items[0] | name(items[1..], kwargs); items[0] null inside a filter block
    Test,     // items[0] is [not] name(items[1..])
    Unary,    // name ("-", "+", "not") items[0]
    Binary,   // items[0] name items[1]: arithmetic, comparison, in, not in, ~
    And,
    Or,
    Cond,  // items[1] if items[0] else items[2] (null: undefined)
  };
  Kind kind;
  int line = 0;
  Value value;
  std::string name;
  bool negated = false;  // `is not`
  std::vector<ExprPtr> items;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
};

struct Node;
using NodePtr = std::unique_ptr<Node>;
using Body = std::vector<NodePtr>;

// Where a `set` or a `for` stores: a name, or a namespace's attribute.
struct Target {
  std::string name;
  std::string attr;  // set ns.attr = ...
};

struct Node {
  enum class Kind {
    Text,         // text
    Output,       // {{ expr }}
    If,           // branches (a null condition: else)
    For,          // for targets in expr [if cond]: body [else: else_body]
    Set,          // set targets = expr
    SetBlock,     // set targets: body
    Macro,        // macro name(params): body
    CallBlock,    // call[(params)] expr: body, as `caller`
    FilterBlock,  // filter expr (a filter chain on null): body
    Break,
    Continue,
  };
  Kind kind;
  int line = 0;
  std::string text;
  ExprPtr expr;
  ExprPtr cond;
  std::vector<std::pair<ExprPtr, Body>> branches;
  std::vector<Target> targets;
  std::string name;
  std::vector<std::pair<std::string, ExprPtr>> params;  // a macro's, null: no default
  Body body, else_body;
};

// Reads a template; throws InvalidInput naming the line and what is wrong
// or unsupported.
Body parse_template(std::string_view source);

}  // namespace depcache::jinja
