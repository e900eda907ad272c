#!/usr/bin/env python3
"""tests/test_tool_builtin.py - Llama 3.1's tool calls (the llama3 format, server/tool_stream.c)
parsed back from what the Llama 3.1 chat template writes for them, rendered by Python's jinja2:
a round trip with an independent writer. For each call (a built-in tool's `name.call(k="v")`
after <|python_tag|>, and a custom function's `{"name": ..., "parameters": ...}`), jinja2 renders
an assistant turn holding it; the text between the assistant header and <|eom_id|> / <|eot_id|>
is the reply the model would write. tests/tool_parse_json parses it (with <|python_tag|> as
text, and without it, as a detokenizer that drops the control token gives it) and must give the
call back: the same name, arguments equal as JSON, no content. Text replies that only look like
calls (`brave_search is ...`, `f.call(...)` without the tag, a cut call) stay text.

The template below is the assistant-call branch of Llama 3.1 Instruct's published chat template
(tokenizer_config.json of meta-llama/Llama-3.1-8B-Instruct), copied as it is but for the
surrounding system and user parts, which play no role here.
Usage: test_tool_builtin.py PATH/TO/tool_parse_json   (exit 77 when jinja2 is not installed)."""
import json
import subprocess
import sys

try:
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment
except ImportError:
    print("SKIP: jinja2 is not installed")
    sys.exit(77)

TEMPLATE = r"""{%- for message in messages %}
    {%- if 'tool_calls' in message %}
        {%- set tool_call = message.tool_calls[0].function %}
        {%- if builtin_tools is defined and tool_call.name in builtin_tools %}
            {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}
            {{- "<|python_tag|>" + tool_call.name + ".call(" }}
            {%- for arg_name, arg_val in tool_call.arguments | items %}
                {{- arg_name + '="' + arg_val + '"' }}
                {%- if not loop.last %}
                    {{- ", " }}
                {%- endif %}
                {%- endfor %}
            {{- ")" }}
        {%- else  %}
            {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}
            {{- '{"name": "' + tool_call.name + '", ' }}
            {{- '"parameters": ' }}
            {{- tool_call.arguments | tojson }}
            {{- "}" }}
        {%- endif %}
        {%- if builtin_tools is defined %}
            {#- This means we're in ipython mode #}
            {{- "<|eom_id|>" }}
        {%- else %}
            {{- "<|eot_id|>" }}
        {%- endif %}
    {%- endif %}
{%- endfor %}"""

HEADER, TAG = "<|start_header_id|>assistant<|end_header_id|>\n\n", "<|python_tag|>"
BUILTIN = ["brave_search", "wolfram_alpha"]
CALLS = [("brave_search", {"query": "weather in Paris today"}),
         ("wolfram_alpha", {"query": "integral of x^2 from 0 to 3"}),
         ("brave_search", {"query": "shardlm", "count": "5"}),
         ("get_weather", {"city": "Paris", "unit": "celsius"}),
         ("get_weather", {"city": "São Paulo", "days": [1, 2], "opts": {"x": None, "y": True}})]
TEXTS = ["brave_search is a web search tool.", "f.call(a=1)", "brave_searcher.call(query=\"x\")",
         TAG + "brave_search.call(query=\"cut", "It is sunny."]

failures = 0


def check(ok, what):
    global failures
    print(("PASS " if ok else "FAIL ") + what)
    failures += not ok


def parse(exe, reply):
    out = subprocess.run([exe, "llama3"], input=reply.encode(), capture_output=True, check=True)
    return json.loads(out.stdout)


def main():
    exe = sys.argv[1]
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = lambda x, indent=None: json.dumps(x, ensure_ascii=False, indent=indent)
    tpl = env.from_string(TEMPLATE)
    for name, args in CALLS:
        msg = {"role": "assistant", "tool_calls": [{"type": "function", "function": {"name": name, "arguments": args}}]}
        text = tpl.render(messages=[msg], builtin_tools=BUILTIN)
        check(text.startswith(HEADER) and text.endswith("<|eom_id|>"), f"jinja2 renders the turn ({text!r:.80})")
        reply = text[len(HEADER):-len("<|eom_id|>")]
        forms = [reply] + ([reply[len(TAG):]] if reply.startswith(TAG) else [])
        for r in forms:
            got = parse(exe, r)
            calls = got["calls"]
            ok = (len(calls) == 1 and calls[0]["name"] == name and calls[0]["complete"]
                  and json.loads(calls[0]["arguments"]) == args and got["content"] == "")
            check(ok, f"{r!r:.70} -> the call {name} {args} ({calls}, content {got['content']!r})")
    for t in TEXTS:
        got = parse(exe, t)
        check(not got["calls"] and got["content"] == t.strip(), f"{t!r} stays text ({got})")
    print("FAILED" if failures else "all passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
