#include "jinja/syntax.h"

#include <fmt/format.h>

#include <cctype>
#include <charconv>
#include <cstdlib>

#include "jinja/builtins.h"
#include "util/error.h"
#include "util/utf8.h"

namespace depcache::jinja {
namespace {

// Deeper nesting than any template needs; bounds the parser's recursion.
constexpr int kMaxDepth = 200;

struct Token {
  enum class Kind { Name, String, Int, Float, Op, End };
  Kind kind;
  std::string text;
  int line;
};

// One piece of the template: text between tags, or a tag's tokens.
struct Segment {
  enum class Kind { Text, Var, Block };
  Kind kind;
  std::string text;
  std::vector<Token> tokens;
  int line;
};

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

[[noreturn]] void syntax_error(int line, const std::string& what) {
  fail(ErrorKind::InvalidInput, "chat template line {}: {}", line, what);
}

// Python's string escapes, as Jinja2 reads a string literal.
std::string unescape(std::string_view s, int line) {
  std::string out;
  const auto put_code_point = [&](uint32_t cp) {
    if (cp > 0x10FFFF) syntax_error(line, "a \\U escape beyond U+10FFFF");
    append_utf8(out, cp);
  };
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '\\' || i + 1 == s.size()) {
      out += s[i];
      continue;
    }
    const char e = s[++i];
    switch (e) {
      case 'n':
        out += '\n';
        break;
      case 't':
        out += '\t';
        break;
      case 'r':
        out += '\r';
        break;
      case '\\':
        out += '\\';
        break;
      case '\'':
        out += '\'';
        break;
      case '"':
        out += '"';
        break;
      case 'a':
        out += '\a';
        break;
      case 'b':
        out += '\b';
        break;
      case 'f':
        out += '\f';
        break;
      case 'v':
        out += '\v';
        break;
      case '0':
        out += '\0';
        break;
      case '\n':
        break;  // a line continuation
      case 'x':
      case 'u':
      case 'U': {
        const size_t n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
        uint32_t cp = 0;
        if (i + n >= s.size()) syntax_error(line, "a truncated \\x/\\u escape");
        const auto r = std::from_chars(s.data() + i + 1, s.data() + i + 1 + n, cp, 16);
        if (r.ptr != s.data() + i + 1 + n) syntax_error(line, "a malformed \\x/\\u escape");
        put_code_point(cp);
        i += n;
        break;
      }
      default:  // Python keeps an unknown escape as written
        out += '\\';
        out += e;
    }
  }
  return out;
}

class Lexer {
 public:
  explicit Lexer(std::string_view src) : src_(src) {}

  std::vector<Segment> run() {
    // Jinja2 drops one newline at the template's end (keep_trailing_newline off).
    if (src_.ends_with('\n')) src_.remove_suffix(1);
    std::vector<Segment> out;
    bool line_starting = true;  // the previous tag ended a line (for lstrip_blocks)
    bool strip_next = false;    // the previous tag ended with '-'
    while (pos_ < src_.size()) {
      size_t open = pos_;
      while (true) {
        open = src_.find('{', open);
        if (open == std::string_view::npos || open + 1 >= src_.size()) {
          open = std::string_view::npos;
          break;
        }
        const char c = src_[open + 1];
        if (c == '{' || c == '%' || c == '#') break;
        ++open;
      }
      std::string text(
          src_.substr(pos_, open == std::string_view::npos ? std::string_view::npos : open - pos_));
      if (strip_next) {
        size_t k = 0;
        while (k < text.size() && is_space(text[k])) ++k;
        text.erase(0, k);
      }
      if (open == std::string_view::npos) {
        push_text(out, std::move(text), line_);
        break;
      }
      const char type = src_[open + 1];
      const char control = open + 2 < src_.size() ? src_[open + 2] : '\0';
      if (control == '-') {
        while (!text.empty() && is_space(text.back())) text.pop_back();
      } else if (control != '+' && type != '{') {
        const size_t nl = text.rfind('\n');
        const size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
        if (l_pos > 0 || line_starting) {
          bool all_space = l_pos < text.size();
          for (size_t k = l_pos; k < text.size(); ++k) all_space = all_space && is_space(text[k]);
          if (all_space) text.erase(l_pos);
        }
      }
      push_text(out, std::move(text), line_);
      line_ += count_lines(src_.substr(pos_, open - pos_));
      pos_ = open + 2 + (control == '-' || control == '+' ? 1 : 0);
      const size_t tag_start = pos_;
      bool minus_end = false;
      if (type == '#') {
        const size_t close = src_.find("#}", pos_);
        if (close == std::string_view::npos) syntax_error(line_, "a comment is not closed");
        minus_end = close > pos_ && src_[close - 1] == '-';
        pos_ = close + 2;
      } else {
        Segment seg{type == '{' ? Segment::Kind::Var : Segment::Kind::Block, {}, {}, line_};
        minus_end = tokenize_tag(seg.tokens, type == '{' ? '}' : '%');
        out.push_back(std::move(seg));
      }
      line_ += count_lines(src_.substr(tag_start, pos_ - tag_start));
      strip_next = minus_end;
      const size_t before = pos_;
      if (!minus_end && type != '{' && pos_ < src_.size() && src_[pos_] == '\n') ++pos_;  // trim_blocks
      if (minus_end) {
        size_t k = pos_;
        while (k < src_.size() && is_space(src_[k])) ++k;
        line_starting = k > pos_ && src_[k - 1] == '\n';
      } else {
        line_starting = pos_ > before;
      }
      line_ += count_lines(src_.substr(before, pos_ - before));
    }
    return out;
  }

 private:
  static int count_lines(std::string_view s) {
    int n = 0;
    for (const char c : s) n += c == '\n';
    return n;
  }

  static void push_text(std::vector<Segment>& out, std::string text, int line) {
    if (!text.empty()) out.push_back(Segment{Segment::Kind::Text, std::move(text), {}, line});
  }

  // Tokens up to the tag's end ("}}" or "%}", braces balanced); leaves pos_
  // after it. Returns whether it ended with '-'.
  bool tokenize_tag(std::vector<Token>& out, char closer) {
    int depth = 0;
    int line = line_;
    while (true) {
      while (pos_ < src_.size() && is_space(src_[pos_])) line += src_[pos_++] == '\n';
      if (pos_ >= src_.size()) syntax_error(line_, "a tag is not closed");
      const std::string_view rest = src_.substr(pos_);
      if (depth == 0) {
        const char end[3] = {closer, '}', '\0'};
        if (rest.starts_with(end)) {
          pos_ += 2;
          out.push_back({Token::Kind::End, "", line});
          return false;
        }
        if (rest.size() >= 3 && rest[0] == '-' && rest.substr(1, 2) == end) {
          pos_ += 3;
          out.push_back({Token::Kind::End, "", line});
          return true;
        }
        if (rest.size() >= 3 && rest[0] == '+' && rest.substr(1, 2) == end)
          syntax_error(line, "'+' before a tag's end is not supported");
      }
      const char c = rest[0];
      if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        size_t n = 1;
        while (n < rest.size() && (std::isalnum(static_cast<unsigned char>(rest[n])) || rest[n] == '_')) ++n;
        out.push_back({Token::Kind::Name, std::string(rest.substr(0, n)), line});
        pos_ += n;
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        size_t n = 0;
        while (n < rest.size() && (std::isdigit(static_cast<unsigned char>(rest[n])) || rest[n] == '_')) ++n;
        bool is_float = false;
        if (n + 1 < rest.size() && rest[n] == '.' && std::isdigit(static_cast<unsigned char>(rest[n + 1]))) {
          is_float = true;
          ++n;
          while (n < rest.size() && std::isdigit(static_cast<unsigned char>(rest[n]))) ++n;
        }
        if (n < rest.size() && (rest[n] == 'e' || rest[n] == 'E')) {
          size_t k = n + 1;
          if (k < rest.size() && (rest[k] == '+' || rest[k] == '-')) ++k;
          if (k < rest.size() && std::isdigit(static_cast<unsigned char>(rest[k]))) {
            is_float = true;
            n = k;
            while (n < rest.size() && std::isdigit(static_cast<unsigned char>(rest[n]))) ++n;
          }
        }
        std::string num;
        for (const char d : rest.substr(0, n))
          if (d != '_') num += d;
        out.push_back({is_float ? Token::Kind::Float : Token::Kind::Int, num, line});
        pos_ += n;
      } else if (c == '\'' || c == '"') {
        size_t n = 1;
        while (n < rest.size() && rest[n] != c) n += rest[n] == '\\' ? 2 : 1;
        if (n >= rest.size()) syntax_error(line, "a string is not closed");
        out.push_back({Token::Kind::String, unescape(rest.substr(1, n - 1), line), line});
        line += count_lines(rest.substr(0, n));
        pos_ += n + 1;
      } else {
        static constexpr std::string_view kOps2[] = {"//", "**", "==", "!=", "<=", ">="};
        std::string op(1, c);
        for (const std::string_view o : kOps2)
          if (rest.starts_with(o)) op = std::string(o);
        if (op.size() == 1 && std::string_view("+-*/%~<>=()[]{},.:|").find(c) == std::string_view::npos)
          syntax_error(line, fmt::format("unexpected character '{}'", c));
        if (c == '(' || c == '[' || c == '{') ++depth;
        if ((c == ')' || c == ']' || c == '}') && depth > 0) --depth;
        out.push_back({Token::Kind::Op, op, line});
        pos_ += op.size();
      }
    }
  }

  std::string_view src_;
  size_t pos_ = 0;
  int line_ = 1;
};

class Parser {
 public:
  explicit Parser(std::vector<Segment> segs) : segs_(std::move(segs)) {}

  Body run() {
    Body body = parse_body({});
    if (seg_ < segs_.size()) syntax_error(segs_[seg_].line, "unexpected '" + tag_name(segs_[seg_]) + "'");
    return body;
  }

 private:
  static std::string tag_name(const Segment& s) {
    return s.tokens.empty() || s.tokens[0].kind != Token::Kind::Name ? "" : s.tokens[0].text;
  }

  // Statements up to a block tag named in `ends` (left unconsumed), or the end.
  Body parse_body(std::initializer_list<std::string_view> ends) {
    Body out;
    while (seg_ < segs_.size()) {
      Segment& s = segs_[seg_];
      if (s.kind == Segment::Kind::Text) {
        auto n = std::make_unique<Node>();
        n->kind = Node::Kind::Text;
        n->text = std::move(s.text);
        out.push_back(std::move(n));
        ++seg_;
        continue;
      }
      toks_ = &s.tokens;
      tok_ = 0;
      if (s.kind == Segment::Kind::Var) {
        ++seg_;
        auto n = std::make_unique<Node>();
        n->kind = Node::Kind::Output;
        n->line = s.line;
        n->expr = parse_expr();
        expect_end();
        out.push_back(std::move(n));
        continue;
      }
      const std::string name = tag_name(s);
      for (const std::string_view e : ends)
        if (name == e) return out;
      ++seg_;
      out.push_back(parse_statement(name, s.line));
    }
    if (ends.size() != 0) {
      std::string want;
      for (const std::string_view e : ends) want += (want.empty() ? "" : " or ") + std::string(e);
      syntax_error(segs_.empty() ? 1 : segs_.back().line, "the template ends before " + want);
    }
    return out;
  }

  // Moves to the block tag that parse_body stopped at and returns its name.
  std::string enter_block_tag() {
    Segment& s = segs_[seg_++];
    toks_ = &s.tokens;
    tok_ = 1;
    return tag_name(s);
  }

  NodePtr parse_statement(const std::string& name, int line) {
    if (++depth_ > kMaxDepth) syntax_error(line, "blocks nest too deeply");
    struct Leave {
      int& d;
      ~Leave() { --d; }
    } leave{depth_};
    tok_ = 1;
    auto n = std::make_unique<Node>();
    n->line = line;
    if (name == "if") {
      parse_if(*n);
    } else if (name == "for") {
      parse_for(*n, line);
    } else if (name == "set") {
      parse_set(*n);
    } else if (name == "macro") {
      n->kind = Node::Kind::Macro;
      n->name = expect_name_token();
      parse_params(n->params);
      expect_end();
      n->body = parse_body({"endmacro"});
      enter_block_tag();
      accept_name(n->name);
      expect_end();
    } else if (name == "call") {
      n->kind = Node::Kind::CallBlock;
      if (peek_op("(")) parse_params(n->params);
      n->expr = parse_expr();
      if (n->expr->kind != Expr::Kind::Call) syntax_error(line, "'call' needs a macro call");
      expect_end();
      n->body = parse_body({"endcall"});
      enter_block_tag();
      expect_end();
    } else if (name == "filter") {
      n->kind = Node::Kind::FilterBlock;
      n->expr = parse_filter_chain(nullptr, /*first_without_pipe=*/true);
      expect_end();
      n->body = parse_body({"endfilter"});
      enter_block_tag();
      expect_end();
    } else if (name == "generation") {
      // Transformers' marker of the assistant's text (for training masks):
      // its body renders as it is.
      n->kind = Node::Kind::If;
      expect_end();
      n->branches.emplace_back(nullptr, parse_body({"endgeneration"}));
      enter_block_tag();
      expect_end();
    } else if (name == "break" || name == "continue") {
      n->kind = name == "break" ? Node::Kind::Break : Node::Kind::Continue;
      expect_end();
    } else if (name.empty()) {
      syntax_error(line, "a block tag without a statement");
    } else {
      syntax_error(line, "the statement '" + name + "' is not supported");
    }
    return n;
  }

  // {% if %} ... {% elif %} ... {% else %} ... {% endif %}: one branch per condition.
  void parse_if(Node& n) {
    n.kind = Node::Kind::If;
    ExprPtr cond = parse_expr();
    expect_end();
    while (true) {
      Body body = parse_body({"elif", "else", "endif"});
      n.branches.emplace_back(std::move(cond), std::move(body));
      const std::string tag = enter_block_tag();
      if (tag == "endif") break;
      if (tag == "elif") {
        cond = parse_expr();
      } else {
        cond = nullptr;
        expect_end();
        n.branches.emplace_back(nullptr, parse_body({"endif"}));
        enter_block_tag();
        expect_end();
        break;
      }
      expect_end();
    }
    expect_end();
  }

  void parse_for(Node& n, int line) {
    n.kind = Node::Kind::For;
    n.targets = parse_targets(false);
    expect_name("in");
    n.expr = parse_expr(/*no_cond=*/true);
    if (accept_name("if")) n.cond = parse_expr(true);
    if (accept_name("recursive")) syntax_error(line, "recursive loops are not supported");
    expect_end();
    n.body = parse_body({"else", "endfor"});
    if (enter_block_tag() == "else") {
      expect_end();
      n.else_body = parse_body({"endfor"});
      enter_block_tag();
    }
    expect_end();
  }

  // {% set x = expr %}, or the block form {% set x %}...{% endset %}.
  void parse_set(Node& n) {
    n.targets = parse_targets(true);
    if (accept_op("=")) {
      n.kind = Node::Kind::Set;
      n.expr = parse_tuple_or_expr();
      expect_end();
    } else {
      n.kind = Node::Kind::SetBlock;
      if (accept_op("|")) n.expr = parse_filter_chain(nullptr, /*first_without_pipe=*/true);
      expect_end();
      n.body = parse_body({"endset"});
      enter_block_tag();
      expect_end();
    }
  }

  // `for` targets (names, perhaps in parentheses) or `set` targets (a name,
  // names, or namespace.attribute).
  std::vector<Target> parse_targets(bool allow_attr) {
    std::vector<Target> out;
    const bool paren = accept_op("(");
    do {
      Target t{expect_name_token(), {}};
      if (allow_attr && accept_op(".")) t.attr = expect_name_token();
      out.push_back(std::move(t));
    } while (accept_op(","));
    if (paren) expect_op(")");
    return out;
  }

  void parse_params(std::vector<std::pair<std::string, ExprPtr>>& params) {
    expect_op("(");
    while (!accept_op(")")) {
      if (!params.empty()) expect_op(",");
      if (accept_op(")")) break;
      std::string p = expect_name_token();
      ExprPtr def;
      if (accept_op("=")) def = parse_expr();
      params.emplace_back(std::move(p), std::move(def));
    }
  }

  // ---- tokens ----
  const Token& peek() const { return (*toks_)[tok_]; }
  int line() const { return peek().line; }
  bool peek_op(std::string_view op) const { return peek().kind == Token::Kind::Op && peek().text == op; }
  bool peek_name(std::string_view n) const { return peek().kind == Token::Kind::Name && peek().text == n; }
  bool accept_op(std::string_view op) {
    if (!peek_op(op)) return false;
    ++tok_;
    return true;
  }
  bool accept_name(std::string_view n) {
    if (!peek_name(n)) return false;
    ++tok_;
    return true;
  }
  [[noreturn]] void unexpected(const std::string& wanted) const {
    const Token& t = peek();
    syntax_error(t.line, fmt::format("expected {}, found {}", wanted,
                                     t.kind == Token::Kind::End ? "the tag's end" : "'" + t.text + "'"));
  }
  void expect_op(std::string_view op) {
    if (!accept_op(op)) unexpected("'" + std::string(op) + "'");
  }
  void expect_name(std::string_view n) {
    if (!accept_name(n)) unexpected("'" + std::string(n) + "'");
  }
  std::string expect_name_token() {
    if (peek().kind != Token::Kind::Name) unexpected("a name");
    return (*toks_)[tok_++].text;
  }
  void expect_end() {
    if (peek().kind != Token::Kind::End) unexpected("the tag's end");
  }

  // ---- expressions ----
  ExprPtr node(Expr::Kind k, int line_no) {
    auto e = std::make_unique<Expr>();
    e->kind = k;
    e->line = line_no;
    return e;
  }
  struct Depth {
    int& d;
    explicit Depth(int& depth, int line) : d(depth) {
      if (++d > kMaxDepth) syntax_error(line, "an expression nests too deeply");
    }
    ~Depth() { --d; }
  };

  // `a, b` as a tuple (a set's value), else one expression.
  ExprPtr parse_tuple_or_expr() {
    const int ln = line();
    ExprPtr first = parse_expr();
    if (!peek_op(",")) return first;
    auto t = node(Expr::Kind::Tuple, ln);
    t->items.push_back(std::move(first));
    while (accept_op(",")) {
      if (peek().kind == Token::Kind::End) break;
      t->items.push_back(parse_expr());
    }
    return t;
  }

  ExprPtr parse_expr(bool no_cond = false) {
    Depth d(depth_, line());
    ExprPtr e = parse_or();
    if (no_cond) return e;
    while (peek_name("if")) {
      const int ln = line();
      ++tok_;
      auto c = node(Expr::Kind::Cond, ln);
      c->items.push_back(parse_or());
      c->items.push_back(std::move(e));
      c->items.push_back(accept_name("else") ? parse_expr() : nullptr);
      e = std::move(c);
    }
    return e;
  }

  ExprPtr parse_or() {
    ExprPtr e = parse_and();
    while (peek_name("or")) {
      auto o = node(Expr::Kind::Or, line());
      ++tok_;
      o->items.push_back(std::move(e));
      o->items.push_back(parse_and());
      e = std::move(o);
    }
    return e;
  }

  ExprPtr parse_and() {
    ExprPtr e = parse_not();
    while (peek_name("and")) {
      auto a = node(Expr::Kind::And, line());
      ++tok_;
      a->items.push_back(std::move(e));
      a->items.push_back(parse_not());
      e = std::move(a);
    }
    return e;
  }

  ExprPtr parse_not() {
    if (peek_name("not")) {
      Depth d(depth_, line());
      auto n = node(Expr::Kind::Unary, line());
      ++tok_;
      n->name = "not";
      n->items.push_back(parse_not());
      return n;
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    ExprPtr e = parse_math1();
    while (true) {
      std::string op;
      const int ln = line();
      if (peek().kind == Token::Kind::Op &&
          (peek().text == "==" || peek().text == "!=" || peek().text == "<" || peek().text == "<=" ||
           peek().text == ">" || peek().text == ">=")) {
        op = peek().text;
        ++tok_;
      } else if (accept_name("in")) {
        op = "in";
      } else if (peek_name("not") && tok_ + 1 < toks_->size() &&
                 (*toks_)[tok_ + 1].kind == Token::Kind::Name && (*toks_)[tok_ + 1].text == "in") {
        tok_ += 2;
        op = "not in";
      } else {
        return e;
      }
      auto b = node(Expr::Kind::Binary, ln);
      b->name = op;
      b->items.push_back(std::move(e));
      b->items.push_back(parse_math1());
      e = std::move(b);
    }
  }

  ExprPtr binary(ExprPtr left, std::string op, ExprPtr right, int ln) {
    auto b = node(Expr::Kind::Binary, ln);
    b->name = std::move(op);
    b->items.push_back(std::move(left));
    b->items.push_back(std::move(right));
    return b;
  }

  // Jinja2's order: ~ binds loosest, then + -, then * / // %, then **.
  ExprPtr parse_math1() {
    ExprPtr e = parse_concat();
    while (peek_op("+") || peek_op("-")) {
      const std::string op = peek().text;
      const int ln = line();
      ++tok_;
      e = binary(std::move(e), op, parse_concat(), ln);
    }
    return e;
  }

  ExprPtr parse_concat() {
    ExprPtr e = parse_math2();
    while (peek_op("~")) {
      const int ln = line();
      ++tok_;
      e = binary(std::move(e), "~", parse_math2(), ln);
    }
    return e;
  }

  ExprPtr parse_math2() {
    ExprPtr e = parse_pow();
    while (peek_op("*") || peek_op("/") || peek_op("//") || peek_op("%")) {
      const std::string op = peek().text;
      const int ln = line();
      ++tok_;
      e = binary(std::move(e), op, parse_pow(), ln);
    }
    return e;
  }

  ExprPtr parse_pow() {
    ExprPtr e = parse_unary(true);
    while (peek_op("**")) {
      const int ln = line();
      ++tok_;
      e = binary(std::move(e), "**", parse_unary(true), ln);
    }
    return e;
  }

  ExprPtr parse_unary(bool with_filter) {
    Depth d(depth_, line());
    ExprPtr e;
    if (peek_op("-") || peek_op("+")) {
      e = node(Expr::Kind::Unary, line());
      e->name = peek().text;
      ++tok_;
      e->items.push_back(parse_unary(false));
    } else {
      e = parse_primary();
    }
    e = parse_postfix(std::move(e));
    if (with_filter) e = parse_filters_and_tests(std::move(e));
    return e;
  }

  ExprPtr parse_primary() {
    const Token& t = peek();
    const int ln = t.line;
    if (t.kind == Token::Kind::Name) {
      ++tok_;
      auto e = node(Expr::Kind::Literal, ln);
      if (t.text == "true" || t.text == "True") {
        e->value = Value::boolean(true);
      } else if (t.text == "false" || t.text == "False") {
        e->value = Value::boolean(false);
      } else if (t.text == "none" || t.text == "None") {
        e->value = Value::none();
      } else {
        e->kind = Expr::Kind::Name;
        e->name = t.text;
      }
      return e;
    }
    if (t.kind == Token::Kind::String) {
      std::string s;
      while (peek().kind == Token::Kind::String) s += (*toks_)[tok_++].text;  // adjacent strings join
      auto e = node(Expr::Kind::Literal, ln);
      e->value = Value::string(std::move(s));
      return e;
    }
    if (t.kind == Token::Kind::Int || t.kind == Token::Kind::Float) {
      ++tok_;
      auto e = node(Expr::Kind::Literal, ln);
      if (t.kind == Token::Kind::Int) {
        int64_t v = 0;
        const auto r = std::from_chars(t.text.data(), t.text.data() + t.text.size(), v);
        if (r.ec != std::errc()) syntax_error(ln, "the integer " + t.text + " is out of range");
        e->value = Value::integer(v);
      } else {
        e->value = Value::number(std::strtod(t.text.c_str(), nullptr));  // 1e999 is inf, as in Python
      }
      return e;
    }
    if (accept_op("(")) {
      if (accept_op(")")) return node(Expr::Kind::Tuple, ln);
      ExprPtr first = parse_expr();
      if (accept_op(")")) return first;
      auto tuple = node(Expr::Kind::Tuple, ln);
      tuple->items.push_back(std::move(first));
      while (accept_op(",")) {
        if (peek_op(")")) break;
        tuple->items.push_back(parse_expr());
      }
      expect_op(")");
      return tuple;
    }
    if (accept_op("[")) {
      auto list = node(Expr::Kind::List, ln);
      while (!accept_op("]")) {
        if (!list->items.empty()) expect_op(",");
        if (accept_op("]")) break;
        list->items.push_back(parse_expr());
      }
      return list;
    }
    if (accept_op("{")) {
      auto dict = node(Expr::Kind::Dict, ln);
      while (!accept_op("}")) {
        if (!dict->items.empty()) expect_op(",");
        if (accept_op("}")) break;
        dict->items.push_back(parse_expr());
        expect_op(":");
        dict->items.push_back(parse_expr());
      }
      return dict;
    }
    unexpected("an expression");
  }

  ExprPtr parse_postfix(ExprPtr e) {
    while (true) {
      const int ln = line();
      if (accept_op(".")) {
        auto a = node(Expr::Kind::Attr, ln);
        if (peek().kind == Token::Kind::Int) {  // x.0 reads item 0
          a->kind = Expr::Kind::Item;
          a->items.push_back(std::move(e));
          a->items.push_back(parse_primary());
        } else {
          a->name = expect_name_token();
          a->items.push_back(std::move(e));
        }
        e = std::move(a);
      } else if (accept_op("[")) {
        ExprPtr parts[3];
        bool slice = false;
        for (int k = 0; k < 3; ++k) {
          if (!peek_op(":") && !peek_op("]")) parts[k] = parse_expr();
          if (k < 2 && accept_op(":")) {
            slice = true;
            continue;
          }
          break;
        }
        expect_op("]");
        auto s = node(slice ? Expr::Kind::Slice : Expr::Kind::Item, ln);
        s->items.push_back(std::move(e));
        if (!slice && !parts[0]) syntax_error(ln, "an empty subscript");
        for (int k = 0; k < (slice ? 3 : 1); ++k) s->items.push_back(std::move(parts[k]));
        e = std::move(s);
      } else if (peek_op("(")) {
        auto c = node(Expr::Kind::Call, ln);
        c->items.push_back(std::move(e));
        parse_call_args(*c);
        e = std::move(c);
      } else {
        return e;
      }
    }
  }

  void parse_call_args(Expr& call) {
    expect_op("(");
    bool first = true;
    while (!accept_op(")")) {
      if (!first) expect_op(",");
      first = false;
      if (accept_op(")")) break;
      if (peek_op("*") || peek_op("**"))
        syntax_error(line(), "*args and **kwargs in calls are not supported");
      if (peek().kind == Token::Kind::Name && tok_ + 1 < toks_->size() &&
          (*toks_)[tok_ + 1].kind == Token::Kind::Op && (*toks_)[tok_ + 1].text == "=") {
        std::string k = (*toks_)[tok_].text;
        tok_ += 2;
        call.kwargs.emplace_back(std::move(k), parse_expr());
      } else {
        if (!call.kwargs.empty()) syntax_error(line(), "a positional argument after a keyword argument");
        call.items.push_back(parse_expr());
      }
    }
  }

  ExprPtr parse_filter(ExprPtr subject) {
    const int ln = line();
    std::string name = expect_name_token();
    while (accept_op(".")) name += "." + expect_name_token();
    if (!is_filter(name)) syntax_error(ln, "no filter named '" + name + "'");
    auto f = node(Expr::Kind::Filter, ln);
    f->name = std::move(name);
    f->items.push_back(std::move(subject));
    if (peek_op("(")) parse_call_args(*f);
    return f;
  }

  ExprPtr parse_filter_chain(ExprPtr subject, bool first_without_pipe = false) {
    ExprPtr e = std::move(subject);
    if (first_without_pipe) e = parse_filter(std::move(e));
    while (accept_op("|")) e = parse_filter(std::move(e));
    return e;
  }

  ExprPtr parse_filters_and_tests(ExprPtr e) {
    while (true) {
      if (accept_op("|")) {
        e = parse_filter(std::move(e));
      } else if (peek_name("is")) {
        const int ln = line();
        ++tok_;
        auto t = node(Expr::Kind::Test, ln);
        t->negated = accept_name("not");
        t->name = expect_name_token();
        if (!is_test(t->name)) syntax_error(ln, "no test named '" + t->name + "'");
        t->items.push_back(std::move(e));
        if (peek_op("(")) {
          parse_call_args(*t);
        } else if (peek().kind == Token::Kind::String || peek().kind == Token::Kind::Int ||
                   peek().kind == Token::Kind::Float || peek_op("[") || peek_op("{") ||
                   (peek().kind == Token::Kind::Name && !peek_name("and") && !peek_name("or") &&
                    !peek_name("else"))) {
          // `x is divisibleby 3`, `x is sameas none`: one argument without parentheses, as Jinja2 reads it
          if (peek_name("is")) syntax_error(line(), "tests cannot be chained with 'is'");
          t->items.push_back(parse_postfix(parse_primary()));
        }
        e = std::move(t);
      } else if (peek_op("(")) {
        auto c = node(Expr::Kind::Call, line());
        c->items.push_back(std::move(e));
        parse_call_args(*c);
        e = std::move(c);
      } else {
        return e;
      }
    }
  }

  std::vector<Segment> segs_;
  size_t seg_ = 0;
  std::vector<Token>* toks_ = nullptr;
  size_t tok_ = 0;
  int depth_ = 0;
};

}  // namespace

Body parse_template(std::string_view source) { return Parser(Lexer(source).run()).run(); }

}  // namespace depcache::jinja
