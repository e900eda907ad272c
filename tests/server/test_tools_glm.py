#!/usr/bin/env python3
"""GLM-4.5 served end to end, and its tool-call format (docs/tools.md, docs/models.md):
`shardlm serve --http` on a random GLM-4.5 checkpoint (tests/reference/glm_ref.py: a dense first
layer, experts behind DeepSeek-V3's router, a plain shared expert) with stories260K's tokenizer and
GLM-4.6's published chat template (tests/data/chat_templates/zai-org-GLM-4.6.jinja).
- The server recognises the template's tool format ("glm", logged at start).
- Parsing, against the template itself: assistant messages with tool calls of every argument kind
  (strings with quotes, newlines and tabs, numbers, booleans, null, nested objects and lists,
  parallel calls) rendered by Python jinja2 with GLM-4.6's template; the reply part of each
  rendering, parsed by shardlm's GLM parser (test_tool_stream --parse-glm), gives back the same
  calls: the same names, arguments equal as JSON.
- /v1/chat/completions (the official `openai` package): `tools` with tool_choice auto is accepted
  (the calls are parsed, not constrained); `required` and a named function are constrained by GLM's
  grammar (server/http_tools_glm.c): sampled replies of the random model, with and without
  parallel_tool_calls, are calls that parse, of the declared (named) function, with its declared
  keys and value types; a tool's `strict: true` is a 400 naming GLM's format (nested schemas are
  not enforced); without `tools` the chat is answered
  (prompt_tokens equal to the prompt jinja2 renders, encoded by the `sentencepiece` package), and
  its greedy reply equals /v1/completions' for the same ids.
SKIP (77) without openai, jinja2, sentencepiece or the shared assets.

  test_tools_glm.py --shardlm BUILD/cli/shardlm --tool-stream BUILD/tests/test_tool_stream
"""
import argparse
import json
import os
import subprocess
import shutil
import sys
import tempfile
from pathlib import Path

SKIP = 77
HERE = Path(__file__).resolve().parent
TESTS = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(TESTS))
sys.path.insert(0, str(TESTS / "reference"))
try:
    import openai
    import sentencepiece as spm
    import test_jinja  # noqa: E402  (exits 77 without jinja2)
except ImportError as e:
    print(f"SKIP: a test dependency cannot be imported ({e}); run tools/install_deps.sh")
    sys.exit(SKIP)
import glm_ref  # noqa: E402
import make_models as MM  # noqa: E402
import test_server as TS  # noqa: E402
from checks import Checks  # noqa: E402

check = Checks()
TEMPLATE = TESTS / "data" / "chat_templates" / "zai-org-GLM-4.6.jinja"
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                           "required": ["city"]}}}]


# Calls of every argument kind, as OpenAI clients send them back in a history.
CALLS = [
    [{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}],
    [{"name": "search", "arguments": {"query": "say \"hi\"\n\tthen", "limit": 5, "exact": True, "filters": None}}],
    [{"name": "plan", "arguments": {"steps": [1, 2.5, -3e-2], "meta": {"a": {"b": [True, False]}, "c": "x"}}}],
    [{"name": "a", "arguments": {"x": 1}}, {"name": "b", "arguments": {"y": "two words"}}, {"name": "c", "arguments": {}}],
    [{"name": "unicode", "arguments": {"text": "caf\u00e9 \u2014 \U0001f600", "path": "C:\\dir\\f.txt"}}],
]


def round_trip(template, tool_stream, work):
    """Each CALLS entry rendered as an assistant turn by jinja2; the reply part parsed back."""
    env = test_jinja.make_env()
    t = env.from_string(template)
    replies = []
    for calls in CALLS:
        msgs = [{"role": "user", "content": "go"},
                {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": c} for c in calls]}]
        text = t.render(messages=msgs, tools=TOOLS, add_generation_prompt=False)
        reply = text[text.rindex("<|assistant|>") + len("<|assistant|>"):].replace("<think></think>", "", 1)
        replies.append(reply)
    path = work / "glm_replies.txt"
    path.write_bytes("\x1e".join(replies).encode("utf-8"))
    out = subprocess.run([tool_stream, "--parse-glm", str(path)], capture_output=True, text=True, timeout=60)
    check(out.returncode == 0, "the GLM parser runs on %d rendered replies" % len(replies))
    got = [[l.split("\t", 1) for l in block.strip("\n").split("\n") if l] for block in out.stdout.split("--\n")[:-1]]
    for calls, back, reply in zip(CALLS, got, replies):
        ok = len(calls) == len(back) and all(c["name"] == b[0] and c["arguments"] == json.loads(b[1])
                                             for c, b in zip(calls, back))
        check(ok, "rendered by GLM-4.6's template and parsed back: %s -> %s" % (json.dumps(calls)[:90], back))


# Tools whose values the grammar keeps short (numbers, booleans, enums): a random model's free
# text could run to max_tokens before it closes a string value.
TYPED = [{"type": "function", "function": {"name": "add", "parameters": {
             "type": "object", "properties": {"a": {"type": "integer", "enum": [1, 20, -3]},
                                              "b": {"enum": [0.5, "half", None, True]},
                                              "exact": {"type": "boolean"}}, "required": ["a", "b"]}}},
         {"type": "function", "function": {"name": "set_unit", "parameters": {
             "type": "object", "properties": {"unit": {"enum": ["celsius", "fahrenheit"]}, "none": {"type": "null"}},
             "required": ["unit"]}}},
         {"type": "function", "function": {"name": "ping", "parameters": {"type": "object", "properties": {}}}}]


def conforms(call, tools):
    """Whether a parsed call names one of tools, with only its declared keys, every required one,
    each value of its declared type (what the grammar promises)."""
    fn = next((t["function"] for t in tools if t["function"]["name"] == call.function.name), None)
    if fn is None:
        return False
    args = json.loads(call.function.arguments)
    props, req = fn["parameters"].get("properties", {}), fn["parameters"].get("required", [])
    kinds = {"integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
             "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
             "boolean": lambda v: isinstance(v, bool), "null": lambda v: v is None}
    for k, v in args.items():
        if k not in props:
            return False
        p = props[k]
        if "enum" in p and not any(v == e and type(v) is type(e) for e in p["enum"]) or \
                "type" in p and not kinds[p["type"]](v):
            return False
    return all(k in args for k in req)


def grammar_first(c, msgs):
    """tool_choice required and a named function under GLM's grammar (server/http_tools_glm.c):
    every reply is calls that parse, each of a declared function (the named one) with its
    declared keys and value types; one call without parallel_tool_calls."""
    for choice, parallel in (("required", True), ("required", False),
                             ({"type": "function", "function": {"name": "add"}}, True),
                             ({"type": "function", "function": {"name": "set_unit"}}, False)):
        named = choice["function"]["name"] if isinstance(choice, dict) else None
        bad, finishes, calls = [], [], 0
        for seed in range(6):
            r = c.chat.completions.create(model="glm", messages=msgs, tools=TYPED, tool_choice=choice,
                                          parallel_tool_calls=parallel, max_tokens=600, temperature=1.0, seed=seed)
            ch = r.choices[0]
            finishes.append(ch.finish_reason)
            tcs = ch.message.tool_calls or []
            calls += len(tcs)
            if (ch.finish_reason != "tool_calls" or not tcs or (not parallel and len(tcs) != 1)
                    or any(not conforms(t, TYPED) or (named and t.function.name != named) for t in tcs)):
                bad.append((seed, ch.finish_reason, [(t.function.name, t.function.arguments) for t in tcs],
                            (ch.message.content or "")[:80]))
        check(not bad, "tool_choice %s, parallel %s: 6 sampled replies, each calls (%d) of %s with the declared keys "
              "and value types (finish %s)%s" % (json.dumps(choice)[:50], parallel, calls, named or "the declared tools",
                                                 finishes, "" if not bad else f": {bad[:2]}"))
    # Unbounded integers and numbers (a random model may write digits to max_tokens: only the
    # replies that end are checked, and most must end).
    num = [{"type": "function", "function": {"name": "count", "parameters": {
        "type": "object", "properties": {"n": {"type": "integer"}, "x": {"type": "number"}}, "required": ["n", "x"]}}}]
    ended, bad = 0, []
    for seed in range(8):
        r = c.chat.completions.create(model="glm", messages=msgs, tools=num, tool_choice="required",
                                      parallel_tool_calls=False, max_tokens=400, temperature=1.0, seed=seed)
        ch = r.choices[0]
        if ch.finish_reason == "length":
            continue
        ended += 1
        tcs = ch.message.tool_calls or []
        if ch.finish_reason != "tool_calls" or len(tcs) != 1 or not conforms(tcs[0], num):
            bad.append((seed, ch.finish_reason, [(t.function.name, t.function.arguments) for t in tcs]))
    check(ended >= 4 and not bad, "integer and number values: %d of 8 replies ended, each one call with an integer n "
          "and a number x%s" % (ended, "" if not bad else f": {bad[:2]}"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shardlm", required=True)
    ap.add_argument("--tool-stream", required=True)
    a = ap.parse_args()
    assets = Path(os.environ.get("SHARDLM_ASSETS", TESTS.parent.parent / "shared/assets"))
    tok = assets / "stories260K" / "tok512.model"
    if not tok.exists():
        print(f"SKIP: no stories260K tokenizer under {assets}")
        return SKIP
    work = Path(tempfile.mkdtemp(prefix="shardlm-glm-"))
    try:
        cfg = glm_ref.config("f32")
        cfg["max_position_embeddings"] = 2048  # the tools' system text takes about 530 tokens
        MM.write_checkpoint(str(work / "glm"), cfg, glm_ref.init(cfg, 35), "f32", 1)
        shutil.copy(tok, work / "glm" / "tokenizer.model")
        round_trip(TEMPLATE.read_text(), a.tool_stream, work)
        msgs = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Once upon a time"}]
        env = test_jinja.make_env()
        prompt = env.from_string(TEMPLATE.read_text()).render(messages=msgs, add_generation_prompt=True,
                                                               bos_token="<s>", eos_token="</s>")
        sp = spm.SentencePieceProcessor(model_file=str(tok))
        want_prompt = len(sp.encode(prompt))
        with TS.Server(a.shardlm, work / "glm", "--chat-template", str(TEMPLATE), "--no-prefix-caching",
                       name="glm", http=True) as srv:
            log = srv.log_path.read_text()
            check(" tool calls in the glm format" in log, "the server reads GLM-4.6's template as the glm tool format")
            c = openai.OpenAI(base_url=f"http://127.0.0.1:{srv.http_port}/v1", api_key="none", timeout=60)
            r0 = c.chat.completions.create(model="glm", messages=msgs, tools=TOOLS, max_tokens=8, temperature=0)
            check(r0.choices[0].finish_reason in ("stop", "length", "tool_calls"),
                  "tools with tool_choice auto: answered (finish %s)" % r0.choices[0].finish_reason)
            strict = [{"type": "function", "function": dict(TOOLS[0]["function"], strict=True)}]
            try:
                c.chat.completions.create(model="glm", messages=msgs, tools=strict, max_tokens=8)
                check(False, "strict: true on GLM's format is refused")
            except openai.BadRequestError as e:
                check("strict" in str(e) and "GLM-4.5's" in str(e), "strict: true is a 400 (no constraint): %s" % str(e)[:100])
            grammar_first(c, msgs)
            r = c.chat.completions.create(model="glm", messages=msgs, max_tokens=8, temperature=0)
            check(r.usage.completion_tokens == 8 and r.usage.prompt_tokens == want_prompt,
                  "without tools: 8 tokens after a prompt of %d tokens (jinja2 + sentencepiece: %d)"
                  % (r.usage.prompt_tokens, want_prompt))
            hist = msgs + [{"role": "assistant", "content": "It is sunny."}, {"role": "user", "content": "And then?"}]
            r2 = c.chat.completions.create(model="glm", messages=hist, max_tokens=4, temperature=0)
            check(r2.usage.completion_tokens == 4, "a longer history is answered (%d tokens)" % r2.usage.completion_tokens)
            # The same prompt's ids through /v1/completions (a list of token ids): the same greedy text.
            ids = sp.encode(prompt)
            r3 = c.completions.create(model="glm", prompt=ids, max_tokens=8, temperature=0)
            check(r3.usage.prompt_tokens == len(ids) and r3.choices[0].text == r.choices[0].message.content,
                  "the chat's greedy reply %r is /v1/completions' for the same ids" % (r.choices[0].message.content or "")[:40])
    except Exception as e:  # noqa: BLE001 - reported with the server logs
        check(False, f"{e}")
        for log in sorted(TS.LOG_DIR.glob("*.log")):
            print(f"--- {log.name} (last lines)\n" + "\n".join(log.read_text().splitlines()[-15:]))
    finally:
        TS.kill_all()
        shutil.rmtree(work, ignore_errors=True)
    return check.summary()


if __name__ == "__main__":
    sys.exit(main())
