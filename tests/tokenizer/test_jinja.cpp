// Jinja-subset engine: constructs checked against @huggingface/jinja (one node run for all cases),
// Python-only semantics checked against values Python's Jinja prints, and errors/limits.
#include <gtest/gtest.h>

#include "tokenizer/chat_template_test_util.h"
#include "tokenizer/jinja.h"

namespace mla::tokenizer::jinja {
namespace {

using J = nlohmann::ordered_json;

Result<std::string> render_json(const std::string& tpl, const J& ctx, RenderLimits limits = {}) {
  return render_string(tpl, Value::from_json(ctx), limits);
}

TEST(Jinja, MatchesReferenceOnConstructs) {
  const J ctx = J::parse(R"({"xs": [3, 1, 2], "d": {"b": 1, "a": "x"}, "s": "  Hello, World  ", "n": null,
      "msgs": [{"role": "user", "content": "hi"}, {"role": "tool", "content": "r"}, {"role": "user", "content": "yo"}],
      "u": "héllo wörld ✓"})");
  const std::vector<std::string> templates = {
      "a  {{- ' b ' -}}  c",
      "line1\n    {% if true %}\n  x\n    {% endif %}\nline2\n",
      "{# comment #}\n{%- for x in xs %}{{ loop.index }}/{{ loop.index0 }}/{{ loop.length }}{% if loop.first %}F{% endif %}{% if loop.last %}L{% endif %},{% endfor %}",
      "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}{% for k in d %}{{ k }}{% endfor %}",
      "{% for k, v in d|items %}{{ k }}{{ v }}{% endfor %}|{{ d|length }}|{{ xs|length }}|{{ s|length }}",
      "{% set ns = namespace(total=0, s='') %}{% for x in xs %}{% set ns.total = ns.total + x %}{% set ns.s = ns.s ~ x %}{% endfor %}{{ ns.total }} {{ ns.s }}",
      "{% set y = 1 %}{% for x in xs %}{% set y = x %}{% endfor %}{{ y }}",
      "{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}{{ greet('A') }} {{ greet('B', '?') }} {{ greet(name='C') }}",
      "{{ s.strip() }}|{{ s.lstrip() }}|{{ s.rstrip() }}|{{ s|trim }}|{{ 'T' if s.strip().startswith('Hello') else 'F' }}{{ 'T' if s.endswith('x') else 'F' }}",
      "{{ 'a,b,,c'.split(',') | join('-') }}|{{ 'a b  c'.split() | length }}|{{ 'xyx'.replace('x', 'Z') }}|{{ 'ab'|upper }}{{ 'CD'|lower }}",
      "{{ xs[::-1] | join(',') }}|{{ xs[1:] | join(',') }}|{{ u[1:4] }}|{{ u[::-1] }}|{{ xs[-1] }}|{{ u|length }}",
      "{{ 'a' ~ 1 ~ 'b' }}|{{ 'x' + 'y' }}|{{ 1 + 2 * 3 }}|{{ (1 + 2) * 3 }}|{{ 7 // 2 }}|{{ 2 ** 10 }}",
      "{{ 'yes' if xs else 'no' }}|{{ 'yes' if n else 'no' }}|{{ 1 if false }}|{{ 'T' if n is none else 'F' }}|{{ 'T' if m is defined else 'F' }}",
      "{% if 'ell' in s and 'zz' not in s %}in{% endif %}{% if 2 in xs %}two{% endif %}{% if 'a' in d %}key{% endif %}",
      "{{ d | tojson }}|{{ msgs[0] | tojson }}|{{ u | tojson }}|{{ xs | tojson(indent=2) }}|{{ d | tojson(indent=4) }}",
      "{{ msgs | selectattr('role', 'equalto', 'user') | map(attribute='content') | join(',') }}|{{ msgs | rejectattr('role', 'equalto', 'user') | list | length }}",
      "{{ 'T' if n | default('dflt') is none else 'F' }}|{{ missing | default('dflt') }}|{{ '' | default('e', true) }}|{{ xs | first }}{{ xs | last }}",
      "{% for m in msgs if m.role == 'user' %}{{ loop.index }}:{{ m.content }}{% if not loop.last %},{% endif %}{% else %}none{% endfor %}",
      "{% for x in [] %}x{% else %}empty{% endfor %}|{% for x in range(3) %}{{ x }}{% endfor %}|{% for x in range(1, 7, 2) %}{{ x }}{% endfor %}",
      "{% if xs is iterable and d is mapping and s is string and n is not string %}types{% endif %}{% if 1 is number %}num{% endif %}",
      "{% set parts %}captured {{ xs|length }}{% endset %}[{{ parts }}]",
      "{{ {'k': [1, {'z': 'q\"uote'}]} | tojson }}|{{ 'tab\\there' }}|{{ \"dq 'x'\" }}",
      "{%- for m in msgs -%}\n  <{{ m.role }}>\n{%- endfor %}\n",
      "{{ msgs[0]['content'] }}{{ msgs[1].content }}{{ d.get('a') }}{{ d.get('zz', 'dz') }}{{ d.keys() | list | length }}",
  };
  J request;
  request["cases"] = J::array();
  for (const std::string& t : templates) request["cases"].push_back(J{{"template", t}, {"context", ctx}});
  const auto ref = testing::run_reference(request);
  ASSERT_EQ(ref.size(), templates.size()) << "node / render_reference.mjs failed";
  for (size_t i = 0; i < templates.size(); ++i) {
    ASSERT_TRUE(ref[i].text.has_value()) << templates[i] << ": reference error " << ref[i].error;
    auto ours = render_json(templates[i], ctx);
    ASSERT_TRUE(ours.is_ok()) << templates[i] << ": " << ours.status().message();
    EXPECT_EQ(*ours, *ref[i].text) << "template: " << templates[i];
  }
}

// Where @huggingface/jinja departs from Python's Jinja (which transformers runs) we follow Python;
// the expected strings are what Python 3 / Jinja2 print.
TEST(Jinja, PythonSemantics) {
  EXPECT_EQ(render_json("{{ true }} {{ none }} {{ -7 % 3 }} {{ -7 // 2 }} {{ 1.0 }}", J::object()).value(), "True None 2 -4 1.0");
  EXPECT_EQ(render_json("{{ [1, 'a'] }} {{ {'k': none} }}", J::object()).value(), "[1, 'a'] {'k': None}");
  EXPECT_EQ(render_json("{{ x or 'fallback' }}|{{ 0 and 'no' }}", J::object()).value(), "fallback|0");
}

TEST(Jinja, ErrorsNameConstructAndPosition) {
  auto r = render_json("ok\n  {% include 'x' %}", J::object());
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("include"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("line 2"), std::string::npos) << r.status().message();
  r = render_json("{{ x | frobnicate }}", J::object());
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("frobnicate"), std::string::npos);
  r = render_json("{{ raise_exception('bad role') }}", J::object());
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("bad role"), std::string::npos);
  for (const char* bad : {"{% if x %}", "{{ x", "{{ 'unterminated }}", "{% for %}", "{{ (1 }}", "{% endif %}", "{{ ) }}", "{#"})
    EXPECT_FALSE(render_json(bad, J::object()).is_ok()) << bad;
}

TEST(Jinja, LimitsStopHostileTemplates) {
  RenderLimits small;
  small.max_output_bytes = 1 << 16;
  small.max_steps = 200000;
  // Output doubling, quadratic loops, unbounded macro recursion, self-referencing containers.
  EXPECT_FALSE(render_json("{% set ns = namespace(s='ab') %}{% for i in range(100) %}{% set ns.s = ns.s + ns.s %}{% endfor %}", J::object(), small).is_ok());
  EXPECT_FALSE(render_json("{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}", J::object(), small).is_ok());
  EXPECT_FALSE(render_json("{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}", J::object(), small).is_ok());
  EXPECT_FALSE(render_json("{% set l = [] %}{% set _ = l.append(l) %}{{ l }}", J::object(), small).is_ok());
  EXPECT_FALSE(render_json("{% set ns = namespace() %}{% set ns.me = ns %}", J::object(), small).is_ok());
  EXPECT_FALSE(render_json("{{ 'x' * 100000000 }}", J::object(), small).is_ok());
  std::string deep(5000, '(');
  EXPECT_FALSE(render_json("{{ " + deep + " }}", J::object(), small).is_ok());
  std::string chain = "{{ 1";
  for (int i = 0; i < 5000; ++i) chain += " + 1";
  EXPECT_FALSE(render_json(chain + " }}", J::object(), small).is_ok());
}

}  // namespace
}  // namespace mla::tokenizer::jinja
