#!/usr/bin/env python3
"""functionary v3.1's tool calls (the functionary format: docs/tools.md), `<function=NAME>{...}</function>`
back to back, against meetkai's published template itself (tests/data/chat_templates, from llama.cpp's
models/templates; Llama 3.1's headers):
- Parsing: assistant turns with tool calls of every argument kind (tool_cases.CALLS) rendered by
  Python jinja2 with the template; the reply part of each, parsed by shardlm's parser
  (test_tool_stream --parse-functionary), gives back the same calls (names equal, arguments equal
  as JSON).
- The grammar (server/http_tools.c functionary_schema, printed by test_tool_stream
  --functionary-schema, decided by the grammar engine through test_grammar check json_schema)
  against the template's own renderings (their arguments in the engine's compact JSON), after the
  `<function=` a required call's prompt ends with (and the lazy trigger of auto): complete with
  parallel calls; one call complete without its `</function>` (the reply's end closes it); mutated
  replies not: an undeclared function, an enum value not in it, a required key missing, an
  undeclared key, a tag inside a string; three calls not under parallel_tool_calls false, another
  function's call not under a named one.
(Served behind the template: tests/server/test_tools_native.py.)
SKIP (77) without jinja2.

  test_tools_functionary.py --tool-stream BUILD/tests/test_tool_stream --test-grammar BUILD/tests/test_grammar
"""
import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

SKIP = 77
sys.dont_write_bytecode = True
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
import test_jinja  # noqa: E402  (exits 77 without jinja2)
import tool_cases as TC  # noqa: E402
from checks import Checks  # noqa: E402
from test_tools_deepseek import DECLARED  # noqa: E402  (CALLS' functions, get_weather strict)
from tool_cases import CALLS  # noqa: E402

check = Checks()
TEMPLATE = HERE.parent / "data" / "chat_templates" / "meetkai-functionary-medium-v3.1.jinja"
TURN, END = "<|start_header_id|>assistant<|end_header_id|>\n\n", "<|eom_id|>"


def rendered(calls, compact=False):
    """The assistant turn the template (jinja2) writes for calls, up to its <|eom_id|>; compact: the
    arguments in the engine's JSON (no whitespace), as a constrained reply writes them."""
    env = test_jinja.make_env()
    if compact:
        env.filters["tojson"] = lambda x, **kw: json.dumps(x, ensure_ascii=False, separators=(",", ":"))
    msgs = [{"role": "user", "content": "go"},
            {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": c} for c in calls]}]
    text = env.from_string(TEMPLATE.read_text()).render(messages=msgs, tools=None, add_generation_prompt=False,
                                                        bos_token="<s>", eos_token="<|eot_id|>")
    reply = text[text.rindex(TURN) + len(TURN):]
    return reply[:reply.index(END)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tool-stream", required=True)
    ap.add_argument("--test-grammar", required=True)
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="shardlm-functionary-"))
    try:
        out = subprocess.run([a.tool_stream, "--detect", str(TEMPLATE)], capture_output=True, text=True, timeout=60)
        check(out.stdout.split("\t")[1:2] == ["functionary"], f"the template is read as the functionary format: {out.stdout!r}")
        replies = [rendered(calls) for calls in CALLS]
        rc, got = TC.parse_back(a.tool_stream, "--parse-functionary", work / "replies.txt", replies)
        check(rc == 0 and len(got) == len(replies), f"the parser runs on {len(replies)} rendered replies")
        for calls, back in zip(CALLS, got):
            check(TC.same_calls(calls, back), f"rendered and parsed back: {json.dumps(calls)[:90]} -> {back}")

        def schema(only, parallel):
            f = work / f"schema-{only}-{parallel}.json"
            f.write_text(subprocess.run([a.tool_stream, "--functionary-schema", json.dumps(DECLARED), only, str(parallel)],
                                        capture_output=True, text=True, timeout=60).stdout)
            return f

        def decide(f, texts):
            return TC.decide(a.test_grammar, "json_schema", f, texts)
        opener = "<function="
        compact = [rendered(calls, True)[len(opener):] for calls in CALLS]
        got = decide(schema("", 1), compact)
        check(got == ["complete"] * len(compact), f"the template's {len(compact)} renderings (after {opener}) are "
              f"complete under the parallel schema: {got}")
        one = compact[0]
        single = one[:-len("</function>")]
        got = decide(schema("", 0), [single, one, compact[3]])
        check(got[0] == "complete" and got[2] != "complete",
              f"one call: complete without its </function> (the reply's end closes it), three calls not: {got}")
        bad = {"an undeclared function": one.replace("get_weather", "get_wether"),
               "an enum value not in it": one.replace("celsius", "kelvin"),
               "a required key missing": rendered([{"name": "get_weather", "arguments": {"city": "Paris"}}], True)[len(opener):],
               "an undeclared key": rendered([{"name": "get_weather", "arguments": {"city": "P", "unit": "celsius", "x": 1}}],
                                             True)[len(opener):],
               "a tag inside a string": rendered([{"name": "search", "arguments": {"q": "a"}}], True)[len(opener):].replace(
                   '"a"', '"</function>"')}
        got = decide(schema("", 1), list(bad.values()))
        check(all(g != "complete" for g in got), f"mutated replies are not complete: {dict(zip(bad, got))}")
        got = decide(schema("search", 1), [one, compact[1]])
        check(got[0] != "complete" and got[1] == "complete",
              f"a named function (search): get_weather's call is not complete, search's is: {got}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return check.summary()


if __name__ == "__main__":
    sys.exit(main())
