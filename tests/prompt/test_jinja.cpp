// The chat-template interpreter against Debian's python3-jinja2: the real
// templates of the other engine's source, and snippets for each construct.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <regex>
#include <thread>

#include "jinja/jinja.h"
#include "prompt/chat_template.h"
#include "prompt/jinja_oracle.h"
#include "test_support.h"
#include "util/error.h"

namespace depcache {
namespace DEPCACHE_TEST_FILE {

// The chat tests' conversations, then non-ASCII text and a special token's
// spelling in a message, and assistant prefills.
const std::vector<std::vector<ChatMessage>> kConversations = [] {
  std::vector<std::vector<ChatMessage>> out = test::chat_conversations();
  const std::vector<std::vector<ChatMessage>> more = {
      {{"system", "Answer in French.\nUse the context."},
       {"user", "Ünïcödé “quotes” and 'apostrophes' \\ back\tslash {{ not jinja }} <|im_end|>"}},
      // Assistant prefill: the reply continues the final message.
      {{"system", "Be brief."}, {"user", "What is 2+2?"}, {"assistant", "The answer is"}},
      {{"user", "Hi"}, {"assistant", " Sure, "}},
  };
  out.insert(out.end(), more.begin(), more.end());
  return out;
}();

std::string read_file(const std::filesystem::path& p) {
  std::ifstream is(p);
  return {std::istreambuf_iterator<char>(is), std::istreambuf_iterator<char>()};
}

// What the interpreter makes of a template for each conversation: the text,
// or nullopt where it refuses (an error while rendering).
std::vector<std::optional<std::string>> ours(const ChatFormat& f, const test::Jinja2Job& job) {
  std::vector<std::optional<std::string>> out;
  for (const auto& conv : job.conversations) {
    try {
      out.push_back(f.render(conv, job.bos, job.eos, job.today).text);
    } catch (const Error&) {
      out.push_back(std::nullopt);
    }
  }
  return out;
}

// Every template of the other engine's source: each the interpreter reads
// renders every conversation exactly as jinja2 does (and refuses those
// jinja2 refuses); the others are refused when read, naming the construct.
// The small models' templates must all be read.
TEST(Jinja, EveryTemplateOfTheOtherEngineRendersAsJinja2Does) {
  REQUIRE_JINJA2();
  DEPCACHE_REQUIRE_LLAMA_CPP(dir, "models/templates");
  std::vector<std::string> names, sources;
  for (const auto& entry : std::filesystem::directory_iterator(dir))
    if (entry.path().extension() == ".jinja") {
      names.push_back(entry.path().stem().string());
      sources.push_back(read_file(entry.path()));
    }
  ASSERT_GE(names.size(), 60u);
  // jinja2 reads Transformers' {% generation %} marker as the no-op it is
  // when rendering: an `if true` with the same whitespace control.
  std::vector<std::string> for_jinja2;
  for (const std::string& s : sources)
    for_jinja2.push_back(std::regex_replace(
        std::regex_replace(s, std::regex(R"(\{%(-?)\s*generation\s*(-?)%\})"), "{%$1 if true $2%}"),
        std::regex(R"(\{%(-?)\s*endgeneration\s*(-?)%\})"), "{%$1 endif $2%}"));
  const test::Jinja2Job job{kConversations};
  const auto want = test::jinja2_render(for_jinja2, job);
  std::map<std::string, std::string> refused;
  int read = 0, identical = 0, both_refuse = 0;
  for (size_t t = 0; t < names.size(); ++t) {
    std::optional<ChatFormat> f;
    try {
      f = ChatFormat::from_jinja(sources[t]);
    } catch (const Error& e) {
      refused[names[t]] = e.what();
      continue;
    }
    ++read;
    ASSERT_TRUE(want[t]) << names[t] << ": read here but not by jinja2";
    const auto got = ours(*f, job);
    for (size_t c = 0; c < got.size(); ++c) {
      const auto& w = (*want[t])[c];
      if (!w) {
        EXPECT_FALSE(got[c]) << names[t] << ", conversation " << c << ": jinja2 refuses it, we render:\n"
                             << *got[c];
        both_refuse += !got[c];
        continue;
      }
      if (!got[c]) {
        std::string why;
        try {
          f->render(job.conversations[c], job.bos, job.eos, job.today);
        } catch (const Error& e) {
          why = e.what();
        }
        ADD_FAILURE() << names[t] << ", conversation " << c << ": jinja2 renders it, we refuse: " << why;
        continue;
      }
      EXPECT_EQ(*got[c], *w) << names[t] << ", conversation " << c;
      identical += *got[c] == *w;
    }
  }
  for (const auto& [name, why] : refused) std::printf("[check] refused %s: %s\n", name.c_str(), why.c_str());
  std::printf("[check] %d of %zu templates read; %d renders identical, %d refused by both; %zu refused\n",
              read, names.size(), identical, both_refuse, refused.size());
  for (const char* small :
       {"HuggingFaceTB-SmolLM3-3B", "ibm-granite-granite-3.3-2B-Instruct", "ibm-granite-granite-4.0",
        "google-gemma-4-31B-it", "mistralai-Ministral-3-14B-Reasoning-2512",
        "meta-llama-Llama-3.2-3B-Instruct", "Qwen-Qwen3-0.6B", "Qwen3.5-4B", "google-gemma-2-2b-it",
        "microsoft-Phi-3.5-mini-instruct", "mistralai-Mistral-Nemo-Instruct-2407",
        "Qwen-Qwen2.5-7B-Instruct"})
    EXPECT_FALSE(refused.contains(small)) << small << ": " << refused[small];
}

// A family continues an assistant's message through the template it writes
// into models, as jinja2 does with Transformers' continue_final_message.
TEST(Jinja, FamiliesContinueTheAssistantsMessageAsJinja2Does) {
  REQUIRE_JINJA2();
  const test::Jinja2Job job{
      {{{"system", "Be brief."}, {"user", "What is 2+2?"}, {"assistant", "The answer is"}},
       {{"user", "Hi"}, {"assistant", "Hello"}, {"user", "Again?"}, {"assistant", " Sure, "}}}};
  std::vector<std::string> templates;
  for (const std::string& name : chat_family_names())
    templates.push_back(chat_template_jinja(*chat_family_from_name(name)));
  const auto want = test::jinja2_render(templates, job);
  int same = 0;
  for (size_t i = 0; i < templates.size(); ++i) {
    const std::string name = chat_family_names()[i];
    const auto got = ours(ChatFormat(*chat_family_from_name(name)), job);
    for (size_t c = 0; c < got.size(); ++c) {
      ASSERT_TRUE((*want[i])[c]) << name;
      ASSERT_TRUE(got[c]) << name;
      EXPECT_EQ(*got[c], *(*want[i])[c]) << name << ", conversation " << c;
      same += *got[c] == *(*want[i])[c];
    }
  }
  std::printf("[check] %d family prefills identical\n", same);
}

// Each construct the interpreter implements, as jinja2 renders it (or
// refuses it) on a system + user conversation.
TEST(Jinja, ConstructsRenderAsJinja2Does) {
  REQUIRE_JINJA2();
  const std::vector<std::string> snippets = {
      // whitespace control: trim_blocks, lstrip_blocks, '-', '+', comments
      "  {% if true %}\n    a\n  {% endif %}\nb",
      "x  {%- if true -%}  y  {%- endif -%}  z",
      "  {%+ if true %}a{% endif %}\n  {# note #}\nc",
      "{{ 'a' }}\n{{- ' b ' -}}\n{{ 'c' }}\n",
      "{% for m in messages %}\n  {{ m.role }}\n{% endfor %}\n",
      "line\n    {%- set x = 1 %}\n    {{ x }}",
      // literals, operators, printing
      "{{ 1 + 2 * 3 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 2 ** 10 }} {{ 7 / 2 }} {{ 1.5 "
      "+ 1 }}",
      "{{ 'a' ~ 1 ~ none ~ true }} {{ 'ab' * 3 }} {{ [1, 2] + [3] }} {{ (1, 'x') }} {{ {'k': [1, 'v', none, "
      "false]} }}",
      "{{ 0.1 + 0.2 }} {{ 1e20 }} {{ 1.0e-5 }} {{ 3.0 }} {{ 10 / 4 }} {{ 2.5e16 }} {{ 123456789.125 }}",
      "{{ 1 < 2 < 3 }} {{ 'a' < 'b' }} {{ [1, 2] == [1, 2] }} {{ 1 == 1.0 }} {{ 'x' in 'xyz' }} {{ 3 not in "
      "[1, 2] }}",
      "{{ none or 'default' }} {{ 0 and 1 }} {{ not messages }} {{ 'yes' if messages else 'no' }} [{{ 'x' if "
      "false }}]",
      "{{ 'it\\'s' }} {{ \"say \\\"hi\\\"\" }} {{ 'tab\\there' }} {{ 'a' 'b' }} {{ '\\u00e9\\x41' }}",
      // strings and their methods
      "{% for m in messages %}{{ m.content.split(' ') | join('/') }}|{{ m.content.upper() }}|{{ "
      "m.content[:4] }}|"
      "{{ m.content[-3:] }}|{{ m.content[::2] }}|{{ m.content.startswith('Be') }}|{{ m.content.replace('e', "
      "'E', 1) }};"
      "{% endfor %}",
      "{{ '  a b  '.strip() }}|{{ 'xxaxx'.strip('x') }}|{{ '  a'.lstrip() }}|{{ 'a,b,,c'.split(',') }}|"
      "{{ ' a  b '.split() }}|{{ 'a b c'.split(' ', 1) }}|{{ 'a,b,c'.rsplit(',', 1) }}|{{ "
      "'l1\\nl2\\r\\nl3'.splitlines() }}",
      "{{ 'abc'.find('c') }} {{ 'abc'.find('z') }} {{ 'aXbXc'.count('X') }} {{ 'hello world'.title() }} "
      "{{ 'hELLO'.capitalize() }} {{ '-'.join(['a', 'b']) }} {{ '{} and {}'.format('x', 2) }} {{ "
      "'{0}{name}'.format(1, name='n') }}",
      "{{ 'Üb' | length }} {{ 'Üb'[0] }} {{ 'Üb'[::-1] }} {{ '%s=%d' % ('a', 3) }} {{ 'abc' | reverse }}",
      // filters
      "{{ messages | length }} {{ messages | map(attribute='role') | join(', ') }} {{ messages | first | "
      "tojson }}",
      "{{ messages | selectattr('role', 'equalto', 'user') | list | length }} "
      "{{ messages | rejectattr('role', 'eq', 'user') | map(attribute='content') | list }}",
      "{{ [3, 1, 2] | sort }} {{ ['b', 'A', 'c'] | sort }} {{ ['b', 'A'] | sort(case_sensitive=true) }} "
      "{{ [3, 1] | sort(reverse=true) }} {{ [1, 2, 2, 3, 1] | unique | list }} {{ [1, 5, 2] | max }} {{ [4, "
      "2] | min }}",
      "{{ undefined_thing | default('dflt') }} {{ '' | default('empty', true) }} {{ none | string }} {{ '42' "
      "| int + 1 }} "
      "{{ '2.5' | float }} {{ 'x' | int }} {{ 3.7 | int }} {{ -3 | abs }} {{ 2.567 | round(2) }} {{ [1, 2, "
      "3] | sum }}",
      "{{ {'b': 1, 'a': 2} | dictsort }} {{ {'b': 1, 'a': 2} | items | list }} {{ 'x' | list }} {{ [[1, 2]] "
      "| list }}",
      "{{ {'a': 'é', 'b': [1, 2.0, none, true], 'c': {}} | tojson }}|{{ [1, {'x': 'y'}] | tojson(indent=2) "
      "}}",
      "{{ '  pad  ' | trim }}|{{ 'xxyxx' | trim('x') }}|{{ 'A b' | lower }}|{{ 'a b' | upper }}|{{ 'a b' | "
      "title }}|"
      "{{ 'aaa' | replace('a', 'b', 2) }}|{{ 'one two' | wordcount }}|{{ '<a>' | e }}|{{ 'x' | safe }}",
      "{{ 'l1\\nl2\\n\\nl3' | indent(2) }}|{{ 'l1\\nl2' | indent(3, true) }}|{{ 'l1\\n\\nl2' | indent(2, "
      "blank=true) }}",
      "{{ [1, 2, 3, 4] | select('odd') | list }} {{ [1, 2, 3] | reject('even') | list }} {{ ['a', '', 'b'] | "
      "select | list }}"
      " {{ ['a', 'B'] | map('upper') | list }} {{ [[1, 2], [3, 4]] | map('first') | list }}",
      // tests
      "{{ messages is defined }} {{ nothing is defined }} {{ none is none }} {{ 1 is number }} {{ true is "
      "number }} "
      "{{ true is integer }} {{ 1.0 is float }} {{ 'a' is string }} {{ {} is mapping }} {{ [] is iterable }} "
      "{{ 'a' is sequence }} {{ 3 is odd }} {{ 4 is divisibleby 2 }} {{ 1 is sameas 1 }} {{ 'ab' is lower }} "
      "{{ 2 is in [1, 2] }} {{ none is not none }} {{ nothing is undefined }} {{ true is boolean }} {{ false "
      "is false }}",
      // statements
      "{% for m in messages %}{{ loop.index }}/{{ loop.index0 }}/{{ loop.revindex }}/{{ loop.length }}/"
      "{{ loop.first }}/{{ loop.last }}/{{ loop.previtem.role if loop.previtem is defined }}/{{ "
      "loop.cycle('a', 'b') }}/{{ loop.revindex0 }}/{{ loop.depth }}/{{ loop.depth0 }}/{{ loop.nextitem.role "
      "if loop.nextitem is defined }};"
      "{% endfor %}",
      "{% for m in messages if m.role == 'user' %}{{ loop.index }}:{{ m.content }}{% endfor %}"
      "{% for x in [] %}never{% else %}empty{% endfor %}",
      "{% for i in range(10) %}{% if i == 2 %}{% continue %}{% endif %}{% if i > 4 %}{% break %}{% endif "
      "%}{{ i }}"
      "{% endfor %} {{ range(5, 0, -2) | list }}",
      "{% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}={{ v }};{% endfor %}{% for a, b in [[1, 2], [3, 4]] "
      "%}{{ a + b }}{% endfor %}",
      "{% set x = 1 %}{% for i in [1, 2] %}{% set x = x + i %}{{ x }}{% endfor %}{{ x }}",
      "{% set ns = namespace(n=0, s='') %}{% for i in [1, 2, 3] %}{% set ns.n = ns.n + i %}{% set ns.s = "
      "ns.s ~ i %}"
      "{% endfor %}{{ ns.n }} {{ ns.s }}",
      "{% set a, b = 1, 2 %}{{ a }}{{ b }}{% set t = (3, 4) %}{{ t[1] }}{% set block %}  in {{ a }} {% "
      "endset %}[{{ block }}]"
      "{% set up | upper %}shout{% endset %}{{ up }}",
      "{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}{{ greet('a') }} {{ "
      "greet('b', '?') }} "
      "{{ greet(punct='.', name='c') }}",
      "{% macro outer() %}[{{ caller() }}]{% endmacro %}{% call outer() %}inside {{ messages | length }}{% "
      "endcall %}",
      "{% macro fact(n) %}{% if n <= 1 %}1{% else %}{{ n * fact(n - 1) | int }}{% endif %}{% endmacro %}{{ "
      "fact(5) }}",
      "{% filter upper %}shout {{ messages[1].content }}{% endfilter %}",
      "{% if messages[0].role == 'system' %}{{ messages[0]['content'] }}{% elif false %}no{% else %}none{% "
      "endif %}",
      "{{ messages[5] is defined }} {{ messages[0].nothing is defined }} {{ messages[-1].content }} {{ "
      "messages[0].get('role') }} "
      "{{ messages[0].get('x', 'dflt') }} {{ messages[0].keys() | list }} {{ (messages | last).values() | "
      "list }}",
      "{{ strftime_now('%Y-%m-%d %B %d') }} {{ date_string }} {{ bos_token }}{{ eos_token }} {{ "
      "add_generation_prompt }}",
      // 64-bit edges where Python's result still fits (found by fuzzing: these wrapped or were undefined)
      "{{ (-1) ** 65 }} {{ 1 ** 100 }} {{ 0 ** 0 }} {{ 2 ** 62 }} {{ (-9223372036854775807 - 1) % -1 }} "
      "{{ -9223372036854775807 // -1 }} {{ -(-9223372036854775807) }} {{ '%d' % 9007199254740993 }} "
      "{{ 'abcdef'[1::9223372036854775807] }} "
      "{{ range(9223372036854775800, 9223372036854775807, 5) | list }} "
      "[{{ '' * 9223372036854775807 }}] {{ (-9223372036854775807 - 1) is divisibleby -1 }} "
      "{{ -9223372036854775807 | abs }} {{ (1e999 - 1e999) | int }} {{ '9223372036854775807' | int }}",
      // refusals: jinja2 and the interpreter both fail
      "{{ 1e999 | int }}",
      "{{ '%d' % (1e999 - 1e999) }}",
      "{{ raise_exception('no system messages') }}",
      "{{ messages[9].content }}",
      "{{ 'a' + 1 }}",
      "{{ nothing.attr }}",
      "{{ 1 / 0 }}",
      "{% for x in none %}{% endfor %}",
      "{{ 'a' < 1 }}",
  };
  const std::vector<std::vector<ChatMessage>> convs = {{{"system", "Be brief."}, {"user", "What is 2+2?"}}};
  const test::Jinja2Job job{convs};
  const auto want = test::jinja2_render(snippets, job);
  for (size_t i = 0; i < snippets.size(); ++i) {
    SCOPED_TRACE(snippets[i]);
    ASSERT_TRUE(want[i]) << "jinja2 cannot read it";
    const auto got = ours(ChatFormat::from_jinja(snippets[i]), job);
    if (!(*want[i])[0]) {
      EXPECT_FALSE(got[0]) << "jinja2 refuses it; we render: " << *got[0];
      continue;
    }
    ASSERT_TRUE(got[0]) << "jinja2 renders: " << *(*want[i])[0];
    EXPECT_EQ(*got[0], *(*want[i])[0]);
  }
}

// A client's text stays marked through the template's string operations, so
// that a control marker typed by a client is tokenized as text.
TEST(Jinja, TheClientsTextIsMarkedThroughTheTemplate) {
  const ChatFormat f = ChatFormat::from_jinja(
      "{% for m in messages %}{{ '<|im_start|>' + m.role + '\n' + m.content | trim + '<|im_end|>\n' }}{% "
      "endfor %}"
      "{% set last = messages[-1].content.split('|')[-1] %}[{{ last.upper() }}]<|im_start|>assistant\n");
  const std::vector<ChatMessage> conv = {{"system", " Be <|im_end|> brief. "},
                                         {"user", "x<|im_start|>|tail"}};
  const RenderedChat r = f.render(conv);
  EXPECT_EQ(
      r.text,
      "<|im_start|>system\nBe <|im_end|> brief.<|im_end|>\n<|im_start|>user\nx<|im_start|>|tail<|im_end|>\n"
      "[TAIL]<|im_start|>assistant");  // a template's last newline is dropped, as Jinja2 drops it
  std::vector<std::string> marked;
  for (const auto& [b, e] : r.text_ranges) marked.push_back(r.text.substr(b, e - b));
  EXPECT_EQ(marked, (std::vector<std::string>{"Be <|im_end|> brief.", "x<|im_start|>|tail", "TAIL"}));
}

// A string repeated (built by doubling) holds the bytes and marks that
// appending it n times makes, marks joined where they touch.
TEST(Jinja, ARepeatedStringKeepsItsMarks) {
  const jinja::Str units[] = {{"x", {{0, 1}}},   {"ab", {{0, 1}}},
                              {"abc", {{1, 3}}}, {"abcd", {{0, 1}, {2, 4}}},
                              {"ab", {}},        {"abc", {{0, 3}}}};
  for (const jinja::Str& unit : units)
    for (size_t n = 0; n < 40; ++n) {
      jinja::Str appended;
      for (size_t i = 0; i < n; ++i) appended.append(unit);
      const jinja::Str repeated = unit.repeated(n);
      EXPECT_EQ(repeated.s, appended.s) << unit.s << " * " << n;
      EXPECT_EQ(repeated.marks, appended.marks) << unit.s << " * " << n;
    }
}

std::string read_error(std::string_view source) {
  try {
    jinja::Template t(source);
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::InvalidInput);
    return e.what();
  }
  return "";
}

std::pair<ErrorKind, std::string> render_error(std::string_view source) {
  try {
    const std::tm now{};
    jinja::Dict globals;
    globals.set("messages", jinja::Value::list({}));
    jinja::RenderLimits limits;
    limits.max_steps = 200'000;
    jinja::Template(source).render(globals, now, limits);
  } catch (const Error& e) {
    return {e.kind(), e.what()};
  }
  return {ErrorKind::Internal, ""};
}

// A template is a file's content: what the interpreter cannot read is named
// with its line, and a template that would run away is stopped.
TEST(Jinja, BadAndHostileTemplatesAreRefusedByName) {
  EXPECT_EQ(read_error("a\n{% include 'x.jinja' %}"),
            "chat template line 2: the statement 'include' is not supported");
  EXPECT_EQ(read_error("{{ x | from_json }}"), "chat template line 1: no filter named 'from_json'");
  EXPECT_EQ(read_error("{{ x is prime }}"), "chat template line 1: no test named 'prime'");
  EXPECT_EQ(read_error("{% if x %}never closed"),
            "chat template line 1: the template ends before elif or else or endif");
  EXPECT_EQ(read_error("{{ 'open"), "chat template line 1: a string is not closed");
  EXPECT_EQ(read_error("{{ x "), "chat template line 1: a tag is not closed");
  EXPECT_EQ(read_error("{{ f(*args) }}"),
            "chat template line 1: *args and **kwargs in calls are not supported");
  EXPECT_NE(
      read_error("{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}").find("too deeply"),
      std::string::npos);
  std::string deep_blocks;
  for (int i = 0; i < 300; ++i) deep_blocks += "{% if true %}";
  EXPECT_NE(read_error(deep_blocks).find("too deeply"), std::string::npos);
  EXPECT_EQ(read_error("{% endfor %}"), "chat template line 1: the statement 'endfor' is not supported");

  const auto [k1, e1] = render_error("{{ raise_exception('Only user and assistant roles') }}");
  EXPECT_EQ(k1, ErrorKind::InvalidInput);
  EXPECT_EQ(e1, "the chat template refuses the conversation: Only user and assistant roles");
  const auto [k2, e2] =
      render_error("{% for i in range(100000) %}{% for j in range(1000) %}{% endfor %}{% endfor %}");
  EXPECT_EQ(k2, ErrorKind::LimitExceeded) << e2;
  const auto [k3, e3] = render_error("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}");
  EXPECT_EQ(k3, ErrorKind::LimitExceeded) << e3;
  EXPECT_NE(e3.find("macro calls nest deeper than 64"), std::string::npos) << e3;
  const auto [k4, e4] = render_error("{{ 'x' * 1000000000000 }}");
  EXPECT_EQ(k4, ErrorKind::LimitExceeded) << e4;
  const auto [k5, e5] = render_error(
      "{% set ns = namespace(s='xxxxxxxxxxxxxxxx') %}{% for i in range(30) %}{% set ns.s = ns.s ~ ns.s %}{% "
      "endfor %}");
  EXPECT_EQ(k5, ErrorKind::LimitExceeded) << e5;
  EXPECT_NE(e5.find("a string exceeds 67108864 bytes"), std::string::npos) << e5;  // doubling: 16 << 30 bytes
  // Each value within its bounds, but together without end: the render's
  // budget of values made, and of time.
  const auto [k9, e9] = render_error(
      "{% set ns = namespace(l=[]) %}{% for i in range(20) %}"
      "{% set ns.l = ns.l + [('x' * 30000000) ~ i] %}{% endfor %}");
  EXPECT_EQ(k9, ErrorKind::LimitExceeded) << e9;
  EXPECT_NE(e9.find("made more than 256 MiB of values"), std::string::npos) << e9;
  const auto [k10, e10] = render_error(
      "{% set big = 'x' * 20000000 %}{% for i in range(100000) %}{% if 'y' in big %}{% endif %}{% endfor %}");
  EXPECT_EQ(k10, ErrorKind::LimitExceeded) << e10;
  EXPECT_NE(e10.find("ran longer than 2000 ms"), std::string::npos) << e10;
  // Found by fuzzing: an argument of the wrong type is an error, not a crash;
  // a namespace holding itself is freed (the sanitizer build checks leaks).
  const auto [k7, e7] = render_error("{{ [1] | tojson(indent='x') }}");
  EXPECT_EQ(e7, "chat template line 1: an integer is expected, not a str");
  EXPECT_EQ(render_error("{% set ns = namespace() %}{% set ns.me = ns %}{{ 'a b'.split(' ', 1) }}").second,
            "");
  EXPECT_EQ(render_error("{{ 1e999 }} {{ -1e999 }}").second, "");  // inf, as Python reads it
  EXPECT_NE(render_error("{{ '{99999999999999999999}'.format(1) }}").second.find("format: no argument"),
            std::string::npos);
  // Python's integers are unbounded: where its result passes 64 bits, ours
  // is refused by name (fuzzing found 5 ** 40 wrapping, undefined in C++).
  for (const char* big : {"{{ 7450580596923828125 * 5 }}", "{{ 5 ** 40 }}", "{{ 9223372036854775807 + 1 }}",
                          "{{ -9223372036854775807 - 2 }}", "{{ (-9223372036854775807 - 1) // -1 }}",
                          "{{ -(-9223372036854775807 - 1) }}", "{{ (-9223372036854775807 - 1) | abs }}",
                          "{{ [9223372036854775807, 1] | sum }}", "{{ 1e300 | int }}", "{{ '1e300' | int }}",
                          "{{ '%d' % 1e300 }}"}) {
    const auto [k, e] = render_error(big);
    EXPECT_EQ(k, ErrorKind::LimitExceeded) << big << ": " << e;
    EXPECT_NE(e.find("integers past 64 bits are not supported"), std::string::npos) << big << ": " << e;
  }
  const auto [k8, e8] = render_error("{{ 'x' | indent(9223372036854775807) }}");
  EXPECT_EQ(k8, ErrorKind::LimitExceeded) << e8;
  const auto [k6, e6] = render_error("\n\n{{ messages[0].content }}");
  EXPECT_EQ(k6, ErrorKind::InvalidInput);
  EXPECT_EQ(e6, "chat template line 3: 'list' has no item 0") << e6;
}

// The time budget counts the rendering thread's CPU time, not the wall
// clock: a render that waits (a function that sleeps 3 ms a call, as a
// thread descheduled on a busy machine would) runs past a 50 ms budget in
// wall time and completes, while one that computes is stopped (above).
TEST(Jinja, TheTimeBudgetCountsCpuTimeNotWaiting) {
  struct Sleep : jinja::Callable {
    std::string name() const override { return "sleep"; }
    jinja::Value call(jinja::Args&) const override {
      std::this_thread::sleep_for(std::chrono::milliseconds(3));
      return jinja::Value::string("");
    }
  };
  jinja::Dict globals;
  globals.set("sleep", jinja::Value::function(std::make_shared<Sleep>()));
  jinja::RenderLimits limits;
  limits.max_time = std::chrono::milliseconds(50);
  const std::tm now{};
  const auto start = std::chrono::steady_clock::now();
  const jinja::Str out =
      jinja::Template("{% for i in range(100) %}{{ sleep() }}{% endfor %}done").render(globals, now, limits);
  EXPECT_EQ(out.s, "done");
  EXPECT_GT(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(250));  // it did wait
}

}  // namespace DEPCACHE_TEST_FILE
}  // namespace depcache
