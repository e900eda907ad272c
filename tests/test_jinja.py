#!/usr/bin/env python3
"""tests/test_jinja.py - the Jinja interpreter (engine/text/jinja*.c) against Python's jinja2,
byte for byte. No expected value is written by hand: every case is rendered by jinja2 configured
as transformers' apply_chat_template configures it (ImmutableSandboxedEnvironment with
trim_blocks, lstrip_blocks, loopcontrols, transformers' tojson / raise_exception /
strftime_now, and its {% generation %} tag; plus llama.cpp's from_json filter, as json.loads) and by tests/jinja_render.c --batch, and the two
must agree: the same bytes where jinja2 renders, an error where jinja2 raises.

Cases: every template under tests/data/chat_templates/ with several conversations (with and
without a system prompt, multi-turn, tools with tool calls and tool results, reasoning, with and
without the generation prompt), some through the chat API (jinja_render_chat) too; language
cases (LANGUAGE below); and sandbox cases that only the C side can run (an endless loop, huge
output), which must fail with a limit error.

Usage: test_jinja.py PATH/TO/jinja_render   (exit 77 when jinja2 is not installed)."""
import json
import os
import subprocess
import sys
import tempfile
from datetime import datetime, timezone

try:
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment
except ImportError:
    print("SKIP: jinja2 is not installed")
    sys.exit(77)

HERE = os.path.dirname(os.path.abspath(__file__))
NOW = 1767225600 + 3600 * 13 + 60 * 7  # 2026-01-01 13:07 UTC, strftime_now's clock on both sides


class Generation(jinja2.ext.Extension):
    """transformers' {% generation %} tag without the mask tracking: renders its body."""
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


def make_env(trim_blocks=True, lstrip_blocks=True):
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.fromtimestamp(NOW, timezone.utc).strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=trim_blocks, lstrip_blocks=lstrip_blocks,
                                        extensions=[Generation, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.filters["from_json"] = json.loads  # llama.cpp's (DeepSeek V3.2's and V4's templates)
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


_ENVS = {}
_COMPILED = {}


def py_render(template, context, options):
    key = (options.get("trim_blocks", True), options.get("lstrip_blocks", True))
    if key not in _ENVS:
        _ENVS[key] = make_env(*key)
    try:
        if (key, template) not in _COMPILED:
            _COMPILED[(key, template)] = _ENVS[key].from_string(template)
        return True, _COMPILED[(key, template)].render(**context)
    except Exception as e:  # any jinja2 or Python error: the C side must fail too
        return False, f"{type(e).__name__}: {e}"


# ---- conversations for the model templates ----------------------------------------------------
TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Get the current weather in a city.",
        "parameters": {"type": "object", "properties": {
            "location": {"type": "string", "description": "The city, e.g. \"Paris\" or 'Köln' <b>"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["location"]}}},
    {"type": "function", "function": {
        "name": "search", "description": "Search the web.",
        "parameters": {"type": "object", "properties": {
            "query": {"type": "string"}, "max_results": {"type": "integer", "default": 5},
            "threshold": {"type": "number", "default": 0.5}}, "required": ["query"]},
        "return": {"type": "array"}}},
]
SYSTEM = {"role": "system", "content": "You are a helpful assistant.\nBe brief & precise."}
U1 = {"role": "user", "content": "Hello! What's 2+2?"}
A1 = {"role": "assistant", "content": "It is 4."}
U2 = {"role": "user", "content": "  Thanks — and in Français? ünïcödé 🙂\n"}
CALL = {"role": "assistant", "content": None, "tool_calls": [
    {"id": "call_abc123456", "type": "function",
     "function": {"name": "get_weather", "arguments": {"location": "Paris", "unit": "celsius"}}}]}
CALL_STR = {"role": "assistant", "content": "", "tool_calls": [
    {"id": "call_abc123456", "type": "function",
     "function": {"name": "get_weather", "arguments": "{\"location\": \"Paris\"}"}}]}
RESULT = {"role": "tool", "tool_call_id": "call_abc123456", "name": "get_weather",
          "content": "{\"temperature\": 21.5, \"unit\": \"celsius\"}"}
THINK = {"role": "assistant", "content": "<think>\nLet me add.\n</think>\n\nIt is 4.",
         "reasoning_content": "Let me add."}
U3 = {"role": "user", "content": "What's the weather in Paris?"}

CONVERSATIONS = {
    "user": [U1],
    "system_user": [SYSTEM, U1],
    "multi_turn": [SYSTEM, U1, A1, U2],
    "multi_turn_no_system": [U1, A1, U2],
    "ends_with_assistant": [U1, A1],
    "reasoning": [U1, THINK, U2],
    "tool_call": [SYSTEM, U3, CALL, RESULT],
    "tool_call_string_args": [U3, CALL_STR, RESULT, {"role": "assistant", "content": "21.5 °C."}, U2],
}


def chat_cases():
    cases = []
    names = sorted(f for f in os.listdir(os.path.join(HERE, "data", "chat_templates")) if f.endswith(".jinja"))
    for name in names:
        with open(os.path.join(HERE, "data", "chat_templates", name), encoding="utf-8") as f:
            template = f.read()
        for conv_name, messages in CONVERSATIONS.items():
            for agp in (True, False):
                for tools in ((None, TOOLS) if conv_name.startswith("tool") or conv_name == "user" else (None,)):
                    ctx = {"messages": messages, "add_generation_prompt": agp, "tools": tools,
                           "documents": None, "bos_token": "<s>", "eos_token": "</s>"}
                    label = f"{name} {conv_name} agp={agp} tools={tools is not None}"
                    cases.append((label, template, ctx, {}, "json"))
                    plain = all(set(m) == {"role", "content"} and m["role"] in ("system", "user", "assistant")
                                for m in messages)
                    if plain and tools is None:
                        cases.append((label + " (chat api)", template, ctx, {}, "chat"))
        # a context without the optional variables: templates must cope or fail alike
        cases.append((f"{name} bare", template, {"messages": [U1]}, {}, "json"))
    return cases


# ---- the language ---------------------------------------------------------------------------
L = [
    # literals, printing, escapes
    ("{{ 1 }} {{ -3 }} {{ 1.5 }} {{ 1e16 }} {{ 1.5e-5 }} {{ 0.1 + 0.2 }} {{ 3 / 2 }} {{ 4 / 2 }}", {}),
    ("{{ [1, 2.5, 'a', none, true, {'k': [1]}, (1,), (1, 2)] }}", {}),
    ("{{ \"it's\" }} {{ ['it\\'s', \"q\\\"\", 'a\\nb', 'tab\\t'] }}", {}),
    ("{{ 'a\\nb\\x41\\u00e9\\U0001F600\\q\\\\' }}|{{ \"\\101\" }}", {}),
    ("{{ 'a' 'b' \"c\" }}", {}),
    ("{{ none }} {{ true }} {{ False }} {{ None }}", {}),
    ("{{ x }}|{{ x.y is defined }}|{{ d.missing }}|{{ d['missing'] }}|{{ l[10] }}", {"d": {}, "l": [1]}),
    ("{{ x.y }}", {}),
    ("{{ none.x }}|{{ 3.x }}", {}),
    ("{{ x + 1 }}", {}),
    ("{{ x ~ 'a' }}{{ x | length }}{{ x | default('dflt') }}{{ '' | default('e', true) }}", {}),
    # arithmetic and comparison
    ("{{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 7 % -3 }} {{ 2 ** 10 }} {{ 2 ** -1 }} {{ 7.5 // 2 }} {{ -7.5 % 2 }}", {}),
    ("{{ 0 ** 0 }} {{ 0 ** 1000000000000000000 }} {{ 1 ** 1000000000000000000 }} {{ (-1) ** 1000000000000000001 }} "
     "{{ (-1) ** 1000000000000000000 }} {{ 2 ** 62 }} {{ (-2) ** 63 }}", {}),
    ("[{{ [] * 1000000000000000000 }}] [{{ '' * 1000000000000000000 }}] {{ 'ab' * 3 }} {{ [1, 2] * 2 }} "
     "[{{ 'x' * -5 }}] {{ [3] * 0 }} {{ x * 1000000000000000000 }}", {"x": []}),
    ("{{ [] * 101999970955999999799 }}", {}),
    ("{{ 'ab' * 3 }} {{ [1] * 3 }} {{ 3 * 'x' }} {{ [1] + [2] }} {{ 'a' + 'b' }} {{ 1 + 2.0 }} {{ true + 1 }}", {}),
    ("{{ 1 / 0 }}", {}),
    ("{{ 'a' + 1 }}", {}),
    ("{{ 1 == 1.0 }} {{ true == 1 }} {{ 'a' < 'b' }} {{ [1, 2] < [1, 3] }} {{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }} {{ none == none }}", {}),
    ("{{ 1 < 'a' }}", {}),
    ("{{ 'b' in 'abc' }} {{ 2 in [1, 2] }} {{ 'k' in {'k': 1} }} {{ 'z' not in 'abc' }} {{ 1 in x }}", {}),
    ("{{ 1 in none }}", {}),
    ("{{ not 1 }} {{ not '' }} {{ 1 and 'x' }} {{ 0 or 'y' }} {{ [] or {} }} {{ 'a' if 0 else 'b' }}|{{ 'a' if 0 }}|", {}),
    ("{{ -x|abs }} {{ - 2 ** 2 }} {{ 2 + 3 * 4 - 1 }} {{ (2 + 3) * 4 }} {{ 1 ~ 2 + 3 }}", {"x": -5}),
    ("{{ '%s-%d' % ('a', 3) }} {{ '%s!' % 'x' }} {{ '{} and {}'.format(1, 'b') }} {{ '{0}{0}'.format('z') }}", {}),
    # attribute and subscript access, slicing
    ("{{ d.a }} {{ d['a'] }} {{ d.b.c }} {{ l[0] }} {{ l[-1] }} {{ l.1 }} {{ s[1] }} {{ s[-1] }}",
     {"d": {"a": 1, "b": {"c": 2}}, "l": [1, 2, 3], "s": "héllo"}),
    ("{{ l[1:] }} {{ l[:-1] }} {{ l[::-1] }} {{ l[::2] }} {{ l[5:] }} {{ s[1:3] }} {{ s[::-1] }} {{ l[-2:] }} {{ l[1:2:0] if false }}",
     {"l": [1, 2, 3, 4], "s": "héllo"}),
    ("{{ l[::0] }}", {"l": [1]}),
    # whitespace control
    ("a  {{- ' b ' -}}  c\n  {%- if true %}  d  {% endif -%}\n  e", {}),
    ("{% for i in [1, 2] %}\n  {{ i }}\n{% endfor %}\n", {}),
    ("{% for i in [1, 2] %}\n  {{ i }}\n{% endfor %}\n", {}, {"trim_blocks": False, "lstrip_blocks": False}),
    ("  {% if true %}\n    x\n  {% endif %}\n  {#- c #}\n  {# c2 #}\ny\n", {}),
    ("  {% if true %}\n    x\n  {% endif %}\n  {# c2 #}\ny\n", {}, {"trim_blocks": False, "lstrip_blocks": False}),
    ("a\n  {%+ if true %}b{% endif +%}\nc", {}),
    ("{% raw %}{{ not evaluated }}{% endraw %} {%- raw -%}  {% x %}  {%- endraw %}", {}),
    ("line1\r\nline2\rline3\n\n", {}),
    ("{{ 'x' }}\n", {}),
    # statements
    ("{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}{% for k in d %}{{ k }}{% endfor %}", {"d": {"b": 1, "a": 2}}),
    ("{% for x in l %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}{{ loop.cycle('a', 'b') }}|{% endfor %}", {"l": "xyz"}),
    ("{% for x in l %}{{ loop.previtem }}-{{ loop.nextitem }},{% endfor %}", {"l": [1, 2, 3]}),
    ("{% for x in l if x is odd %}{{ x }}{{ loop.length }}{% else %}none{% endfor %}|{% for x in [] %}{% else %}empty{% endfor %}", {"l": [1, 2, 3, 5]}),
    ("{% for x in l %}{% if x == 3 %}{% break %}{% endif %}{% if x == 1 %}{% continue %}{% endif %}{{ x }}{% endfor %}", {"l": [1, 2, 3, 4]}),
    ("{% for x in 3 %}{% endfor %}", {}),
    ("{% for x in none %}{% endfor %}", {}),
    ("{% set x = 1 %}{% for i in [1, 2] %}{{ x }}{% set x = i * 10 %}{{ x }}{% endfor %}{{ x }}", {}),
    ("{% set ns = namespace(n=0, s='') %}{% for i in range(4) %}{% set ns.n = ns.n + i %}{% set ns.s = ns.s ~ i %}{% endfor %}{{ ns.n }} {{ ns.s }}", {}),
    ("{% set a, b = [1, 2] %}{{ a }}{{ b }}{% set c, d = 'xy' %}{{ c }}{{ d }}", {}),
    ("{% set a, b = [1] %}", {}),
    ("{% set x %}  block {{ 1 + 1 }} {% endset %}[{{ x }}]{% set y | upper | trim %} b {% endset %}[{{ y }}]", {}),
    ("{% if 0 %}a{% elif '' %}b{% elif [1] %}c{% else %}d{% endif %}{% if none %}{% else %}e{% endif %}", {}),
    ("{% macro m(a, b=2, c='x') %}{{ a }}{{ b }}{{ c }}{% endmacro %}{{ m(1) }}|{{ m(1, 3) }}|{{ m(1, c='z') }}|{{ m(a=5) }}", {}),
    ("{% macro m(a) %}{{ a }}{% endmacro %}{{ m(1, 2) }}", {}),
    ("{% macro fact(n) %}{% if n <= 1 %}1{% else %}{{ n * fact(n - 1)|int }}{% endif %}{% endmacro %}{{ fact(5) }}", {}),
    ("{% macro wrap(t) %}<{{ t }}>{{ caller() }}</{{ t }}>{% endmacro %}{% call wrap('b') %}inner {{ 1 }}{% endcall %}", {}),
    ("{% macro rows(l) %}{% for x in l %}{{ caller(x) }}{% endfor %}{% endmacro %}{% call(x) rows([1, 2]) %}[{{ x }}]{% endcall %}", {}),
    ("{% filter upper %}abc {{ 'd' }}{% endfilter %}|{% filter trim | title %}  hello world  {% endfilter %}", {}),
    ("{% generation %}gen {{ 1 }}{% endgeneration %}", {}),
    ("{{ raise_exception('custom failure') }}", {}),
    ("{% if x %}\n{{ raise_exception('at line 2') }}\n{% endif %}", {"x": True}),
    ("{{ strftime_now('%Y-%m-%d %H:%M %a %b %d') }}", {}),
    ("{{ range(3) | list }} {{ range(1, 7, 2) | list }} {{ range(5, 0, -2) | list }} {{ dict(a=1, b='x') }} {{ namespace(a=1).a }}", {}),
    ("{{ range(1000000) | length }}", {}),
    # tests
    ("{{ x is defined }} {{ x is undefined }} {{ none is none }} {{ 1 is number }} {{ 1.5 is float }} {{ 1 is integer }} {{ true is integer }} {{ true is boolean }} {{ true is true }} {{ 1 is true }} {{ false is false }}", {}),
    ("{{ 's' is string }} {{ {} is mapping }} {{ [] is iterable }} {{ 's' is sequence }} {{ 3 is odd }} {{ 4 is even }} {{ 9 is divisibleby 3 }} {{ 9 is divisibleby(4) }} {{ 1 is equalto 1 }} {{ 'a' is eq 'a' }} {{ 2 is gt 1 }} {{ 2 is in [1, 2] }} {{ 'abc' is lower }} {{ 'X' is upper }} {{ m is callable }} {{ x is not none }}", {"m": None}),
    ("{{ x is fooo }}", {}),
    # filters
    ("{{ '  a b  ' | trim }}|{{ 'xxaxx' | trim('x') }}|{{ 'Hello World' | lower }}|{{ 'hello' | upper }}|{{ 'hello wORLD-x (y)' | title }}|{{ 'hELLO' | capitalize }}", {}),
    ("{{ 'aXbXc' | replace('X', '-') }}|{{ 'aaa' | replace('a', 'b', 2) }}|{{ 'ab' | replace('', '.') }}", {}),
    ("{{ [3, 1, 2] | sort }} {{ ['b', 'A', 'c'] | sort }} {{ ['b', 'A'] | sort(case_sensitive=true) }} {{ [3, 1] | sort(reverse=true) }} {{ l | sort(attribute='n') }}", {"l": [{"n": 2}, {"n": 1}]}),
    ("{{ d | dictsort }} {{ d | dictsort(by='value') }} {{ d | dictsort(reverse=true) }}", {"d": {"b": 1, "a": 3, "C": 2}}),
    ("{{ [1, 2, 1, 'A', 'a'] | unique | list }} {{ [1, 2, 3] | reverse | list }} {{ 'abc' | reverse }} {{ [1, 2] | first }} {{ [1, 2] | last }} {{ 'xy' | first }} {{ [] | first }}", {}),
    ("{{ [1, 2, 3] | sum }} {{ [1.5, 2] | sum }} {{ l | sum(attribute='n') }} {{ [3, 1, 2] | min }} {{ [3, 1, 2] | max }} {{ ['b', 'A'] | max }} {{ l | max(attribute='n') }}", {"l": [{"n": 2}, {"n": 5}]}),
    ("{{ [1, 2, 3] | join }} {{ ['a', 'b'] | join(', ') }} {{ l | join('|', attribute='n') }} {{ l | map(attribute='n') | list }} {{ ['a', 'b'] | map('upper') | list }} {{ l | map(attribute='z', default=0) | list }}", {"l": [{"n": 2}, {"n": 5}]}),
    ("{{ l | selectattr('on') | list }} {{ l | rejectattr('on') | list }} {{ l | selectattr('n', 'equalto', 2) | list }} {{ l | selectattr('n', 'gt', 2) | map(attribute='n') | list }} {{ [1, 2, 3, 4] | select('odd') | list }} {{ [1, 2, 3] | reject('even') | list }} {{ l | selectattr('f.g') | list }}",
     {"l": [{"n": 2, "on": True}, {"n": 5, "on": False, "f": {"g": 1}}]}),
    ("{{ 'abc' | length }} {{ [1, 2] | count }} {{ {'a': 1} | length }} {{ 'héllo' | length }} {{ d | items | list }} {{ d | list }} {{ 'ab' | list }}", {"d": {"a": 1, "b": [2]}}),
    ("{{ '42' | int }} {{ '4.7' | int }} {{ 'x' | int }} {{ 'x' | int(7) }} {{ 3.9 | int }} {{ '2.5' | float }} {{ 3 | float }} {{ 'y' | float }} {{ -3 | abs }} {{ -2.5 | abs }}", {}),
    ("{{ 2.5 | round }} {{ 3.5 | round }} {{ 3.14159 | round(2) }} {{ 2.7 | round(method='floor') }} {{ 2.1 | round(0, 'ceil') }} {{ 3 | round }}", {}),
    ("{{ 1 | string }}{{ none | string }}{{ [1] | string }} {{ 'a<b>&\"c\\'' | e }} {{ '<x>' | safe }}", {}),
    # Markup (markupsafe): `+` escapes the plain side of a safe string and stays safe; `~`, join
    # and the filters give plain strings; escaping a Markup leaves it; Markup + a number is an error.
    ("{{ ('<' | safe) + '<' }}|{{ '<' + ('<' | safe) }}|{{ (('a' | safe) + '\"') + \"'&\" }}|{{ ('<' | safe) ~ '<' }}|"
     "{{ ('<' | e) + '<' }}|{{ ('<' | safe) | e }}|{{ (('<' | safe) + '<') | length }}|{{ ['<' | safe, '<'] | join('&') }}|"
     "{{ ('&' | safe) ~ ('&' | safe) + '<' }}|{{ (('a' | safe) + '<') == 'a&lt;' }}|{{ ((1 | safe) + '>') }}|{{ x | safe + y | tojson }}",
     {"x": "use: ", "y": {"k": "\"v\" <b>"}}),
    ("{% set m = '<' | safe %}{{ m + 1 }}", {}),
    ("{{ none | selectattr('type', 'equalto', 'x') | list | length }}{{ '' | select | list }}{{ [] | rejectattr('a') | list }}"
     "{{ none | reject('none') | list }}{{ none | selectattr | list }}", {}),
    ("{{ 'a\\nb\\n\\nc' | indent }}|{{ 'a\\nb' | indent(2, true) }}|{{ 'a\\n\\nb' | indent(2, blank=true) }}|{{ 'a\\nb' | indent('> ') }}", {}),
    ("{{ [1, 2, 3, 4, 5] | batch(2) | list }} {{ [1, 2, 3] | batch(2, 'x') | list }}", {}),
    ("{{ x | tojson }}", {"x": {"b": 1, "a": [1, 2.5, True, None, "é<>&'\"\\\n\t\u0001"], "c": {}, "d": [], "e": 1.0, "f": 1e20}}),
    ("{{ x | tojson(indent=2) }}|{{ x | tojson(indent=4, sort_keys=true) }}|{{ x | tojson(separators=(',', ':')) }}|{{ x | tojson(ensure_ascii=true) }}", {"x": {"b": [1, {"z": "ü🙂"}], "a": {}}}),
    ("{{ 'x' | tojson }} {{ 5 | tojson }} {{ none | tojson }} {{ (1, 2) | tojson }}", {}),
    ("{% set d = s | from_json %}{{ d.a[1] }} {{ d.b }} {{ d | tojson }} {{ '[1, 2.5]' | from_json | sum }}",
     {"s": "{\"a\": [1, \"x\u00e9\"], \"b\": null, \"c\": {\"d\": true}}"}),
    ("{{ 'not json' | from_json }}", {}),
    ("{{ y | tojson }}", {}),
    ("{{ x | nosuchfilter }}", {}),
    # methods
    ("{{ '  ab  '.strip() }}|{{ 'xxabxx'.strip('x') }}|{{ '  ab  '.lstrip() }}|{{ '  ab  '.rstrip() }}|{{ ' \\u00a0ab\\u3000'.strip() }}", {}),
    ("{{ 'a b  c'.split() }} {{ 'a,b,,c'.split(',') }} {{ 'a,b,c'.split(',', 1) }} {{ ' a b '.split(' ') }} {{ 'a b c'.split(none, 1) }}", {}),
    ("{{ 'abc'.startswith('ab') }} {{ 'abc'.endswith('bc') }} {{ 'abc'.startswith(('x', 'a')) }} {{ 'abc'.replace('b', 'B') }} {{ 'aXa'.upper() }} {{ 'AbC'.lower() }} {{ 'hello world'.title() }} {{ 'hELLO'.capitalize() }}", {}),
    ("{{ 'abcb'.find('b') }} {{ 'abc'.find('z') }} {{ 'abcb'.count('b') }} {{ '-'.join(['a', 'b']) }} {{ '12'.isdigit() }} {{ 'ab'.isalpha() }} {{ ' '.isspace() }}", {}),
    ("{{ d.get('a') }} {{ d.get('z') }} {{ d.get('z', 'dflt') }} {{ d.keys() | list }} {{ d.values() | list }} {{ d.items() | list }}", {"d": {"a": 1, "b": 2}}),
    ("{% set l = [1] %}{{ l.append(2) }}", {}),
    ("{% set d = {} %}{{ d.update({'a': 1}) }}", {}),
    ("{{ m.content.strip() }}", {"m": {"role": "user"}}),
    # syntax errors (with line numbers)
    ("{% if true %}\nunclosed", {}),
    ("line 1\n{{ 1 + }}", {}),
    ("{% endfor %}", {}),
    ("{% for x in l %}{% endif %}", {}),
    ("{{ 'unterminated }}", {}),
    ("{% break %}", {}),
    ("{% include 'other.html' %}", {}),
    ("{{ (((((1))))) }}{{ [[[[]]]] }}{{ {'a': {'b': {}}} }}", {}),
    ("{{ {'a': 1}['a'] }}{{ {'b': {'c': 2}}.b.c }}", {}),
]

LANGUAGE = [(f"lang {i}: {c[0][:50]!r}", c[0], c[1], c[2] if len(c) > 2 else {}, "json") for i, c in enumerate(L)]

# Only the C side: jinja2 would run these for minutes or forever. Each must fail with a limit.
LIMITS = [
    ("endless loop", "{% for i in range(100000) %}{% for j in range(100000) %}{{ '' }}{% endfor %}{% endfor %}", {"max_steps": 1000000}, "step limit"),
    ("huge output", "{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}", {"max_output": 1 << 20}, "output limit"),
    ("huge string", "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}", {"max_memory": 1 << 24}, "limit"),
    ("deep recursion", "{% macro r(n) %}{{ r(n + 1) }}{% endmacro %}{{ r(0) }}", {}, "recursion limit"),
    ("deep nesting", "{{ " + "(" * 500 + "1" + ")" * 500 + " }}", {}, "nested too deeply"),
]


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    cases = chat_cases() + LANGUAGE
    batch = []
    for label, template, ctx, options, api in cases:
        batch.append({"template": template, "context": json.dumps(ctx, ensure_ascii=False), "api": api,
                      "options": dict(options, now=NOW)})
    for label, template, options, _ in LIMITS:
        batch.append({"template": template, "context": "{}", "api": "json", "options": options})
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False, encoding="utf-8") as f:
        json.dump(batch, f, ensure_ascii=False)
        path = f.name
    try:
        proc = subprocess.run([sys.argv[1], "--batch", path], capture_output=True, timeout=60)
    finally:
        os.unlink(path)
    if proc.returncode != 0:
        print(proc.stderr.decode(errors="replace"))
        print(f"FAIL: jinja_render exited {proc.returncode}")
        return 1
    results = json.loads(proc.stdout.decode("utf-8"))
    failures = 0
    rendered = errors = 0
    for (label, template, ctx, options, api), got in zip(cases, results):
        ok, want = py_render(template, ctx, options)
        if ok and (not got["ok"] or got["out"] != want):
            failures += 1
            print(f"FAIL {label}\n  jinja2: {want!r}\n  C:      {got['out']!r} {got['error']}")
        elif not ok and got["ok"]:
            failures += 1
            print(f"FAIL {label}\n  jinja2 raised {want}\n  C rendered {got['out']!r}")
        elif ok:
            rendered += 1
        else:
            errors += 1
            if "line " not in got["error"]:
                failures += 1
                print(f"FAIL {label}: the error names no line: {got['error']}")
    for (label, _, _, expect), got in zip(LIMITS, results[len(cases):]):
        if got["ok"] or expect not in got["error"]:
            failures += 1
            print(f"FAIL {label}: expected an error with {expect!r}, got ok={got['ok']} {got['error']!r}")
    n_templates = len([f for f in os.listdir(os.path.join(HERE, "data", "chat_templates")) if f.endswith(".jinja")])
    print(f"jinja: {len(cases)} cases ({n_templates} model templates): {rendered} identical renders, "
          f"{errors} errors on both sides, {len(LIMITS)} sandbox limits, {failures} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
