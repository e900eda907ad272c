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
- The grammar (server/http_tools_glm.c, printed by test_tool_stream --glm-grammar, decided by the
  grammar engine through test_grammar check): the template's own renderings complete, mutations
  of them not (grammar_oracle).
- /v1/chat/completions (the official `openai` package): `tools` with tool_choice auto is accepted
  (the calls are held to the grammar from `<tool_call>` on); `required` and a named function are
  constrained by it from the first byte: sampled replies of the random model, with and without
  parallel_tool_calls, are calls that parse, of the declared (named) function, with its declared
  keys and value types; a tool's `strict: true` is a 400 naming GLM's format (nested schemas are
  not enforced); without `tools` the chat is answered
  (prompt_tokens equal to the prompt jinja2 renders, encoded by the `sentencepiece` package), and
  its greedy reply equals /v1/completions' for the same ids.
SKIP (77) without openai, jinja2, sentencepiece or the shared assets.

  test_tools_glm.py --shardlm BUILD/cli/shardlm --tool-stream BUILD/tests/test_tool_stream
                    --test-grammar BUILD/tests/test_grammar
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
import tool_cases as TC  # noqa: E402
from tool_cases import CALLS  # noqa: E402

check = Checks()
TEMPLATE = TESTS / "data" / "chat_templates" / "zai-org-GLM-4.6.jinja"
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                           "required": ["city"]}}}]




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
    rc, got = TC.parse_back(tool_stream, "--parse-glm", work / "glm_replies.txt", replies)
    check(rc == 0, "the GLM parser runs on %d rendered replies" % len(replies))
    for calls, back, reply in zip(CALLS, got, replies):
        check(TC.same_calls(calls, back), "rendered by GLM-4.6's template and parsed back: %s -> %s" % (json.dumps(calls)[:90], back))


# The CALLS' functions declared with types (arrays and objects are free text to the grammar).
DECLARED = [{"type": "function", "function": {"name": n, "parameters": {"type": "object", "properties": p,
                                                                         "required": r}}} for n, p, r in [
    ("get_weather", {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}}, ["city"]),
    ("search", {"query": {"type": "string"}, "limit": {"type": "integer"}, "exact": {"type": "boolean"},
                "filters": {"type": "null"}}, ["query"]),
    ("plan", {"steps": {"type": "array"}, "meta": {"type": "object"}}, []),
    ("a", {"x": {"type": "number"}}, ["x"]), ("b", {"y": {"type": "string"}, "naïve \"q\"": {"enum": ["café", 1]}}, []),
    ("c", {}, []),
    ("unicode", {"text": {"type": "string"}, "path": {"type": "string"}}, ["text", "path"])]]


def rendered_reply(template, calls, reasoning=None):
    """The assistant turn GLM-4.6's template (jinja2) writes for calls, after <|assistant|>."""
    msgs = [{"role": "user", "content": "go"},
            {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": c} for c in calls]}]
    if reasoning:
        msgs[1]["reasoning_content"] = reasoning
    text = test_jinja.make_env().from_string(template).render(messages=msgs, tools=DECLARED, add_generation_prompt=False)
    return text[text.rindex("<|assistant|>") + len("<|assistant|>"):]


def grammar_oracle(template, tool_stream, test_grammar, work):
    """The grammar (server/http_tools_glm.c, printed by test_tool_stream --glm-grammar) against the
    template's own renderings (jinja2): every CALLS reply is complete under the required grammar,
    and what follows its first <tool_call> under the lazy one (tool_choice auto); mutated replies
    (an undeclared key or function, a value of the wrong type, a required key missing, a call that
    does not close) and, for one call or a named function, the replies that break them are not."""
    def grammar(only, parallel, lazy):
        out = subprocess.run([tool_stream, "--glm-grammar", json.dumps(DECLARED), only, str(parallel), str(lazy)],
                             capture_output=True, text=True, timeout=60)
        path = work / f"glm-{only}-{parallel}-{lazy}.gbnf"
        path.write_text(out.stdout)
        return path

    def decide(path, texts):
        return TC.decide(test_grammar, "ebnf", path, texts)

    replies = [rendered_reply(template, calls) for calls in CALLS]
    replies.append(rendered_reply(template, CALLS[0], "The user wants Paris.\nCheck <b>it</b> first."))
    replies.append(rendered_reply(template, [{"name": "b", "arguments": {"y": "<p>a</p> <</arg_valu <<"}}]))
    replies.append(rendered_reply(template, [{"name": "b", "arguments": {"naïve \"q\"": "café"}}]))
    req, lazy = grammar("", 1, 0), grammar("", 1, 1)
    got = decide(req, replies)
    check(got == ["complete"] * len(replies), "GLM's grammar (required, parallel): the template's %d renderings "
          "(one with reasoning before its call, one with '</' in a value, one with UTF-8 and quotes in a key and an enum) "
          "are complete: %s" % (len(replies), got))
    got = decide(lazy, [r[r.index("<tool_call>") + len("<tool_call>"):] for r in replies])
    check(got == ["complete"] * len(replies), "GLM's lazy grammar (auto): what follows each rendering's first "
          "<tool_call> is complete: %s" % got)
    one = replies[0]
    bad = {"an undeclared key": one.replace("<arg_key>unit</arg_key>", "<arg_key>units</arg_key>"),
           "an undeclared function": one.replace("get_weather", "get_wether"),
           "an enum value not in it": one.replace("celsius", "kelvin"),
           "a required key missing": rendered_reply(template, [{"name": "get_weather", "arguments": {"unit": "celsius"}}]),
           "an integer that is not one": rendered_reply(template, [{"name": "search", "arguments": {"query": "q", "limit": "5x"}}]),
           "a boolean that is not one": rendered_reply(template, [{"name": "search", "arguments": {"query": "q", "exact": "yes"}}]),
           "arguments for a function without any": rendered_reply(template, [{"name": "c", "arguments": {"x": 1}}]),
           "a call not closed": one[:one.rindex("</tool_call>")]}
    got = decide(req, list(bad.values()))
    check(all(g != "complete" for g in got), "mutated replies are not complete: %s" % dict(zip(bad, got)))
    parallel = replies[3]  # three calls
    got = decide(grammar("", 0, 0), [replies[0], parallel]) + decide(grammar("b", 1, 0), [replies[0], parallel])
    check(got == ["complete", "reject", "reject", "reject"],
          "one call only: one call complete, three not; named b: neither the weather call nor a, b, c: %s" % got)
    named = rendered_reply(template, [{"name": "b", "arguments": {"y": "w"}}, {"name": "b", "arguments": {}}])
    check(decide(grammar("b", 1, 0), [named]) == ["complete"], "named b: two calls of b are complete")


# The grammar lets a call follow reasoning (<think> ... </think>, free text): with "h" banned
# (stories260K's piece 415 and its byte token <0x68>, 107; "<think>" is < t h in k >) the random
# model cannot open it, and writes its call at once.
NO_THINK = {"415": -100, "107": -100}

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
                                          parallel_tool_calls=parallel, max_tokens=600, temperature=1.0, seed=seed,
                                          logit_bias=NO_THINK)
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
    # Streamed: the deltas of a required reply assemble to the unary reply of the same seed.
    kw = dict(model="glm", messages=msgs, tools=TYPED, tool_choice="required", max_tokens=600, temperature=1.0,
              seed=3, logit_bias=NO_THINK)
    whole = c.chat.completions.create(**kw).choices[0].message.tool_calls or []
    calls = {}
    for chunk in c.chat.completions.create(stream=True, **kw):
        for d in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            e = calls.setdefault(d.index, {"name": "", "arguments": ""})
            e["name"] += (d.function.name or "") if d.function else ""
            e["arguments"] += (d.function.arguments or "") if d.function else ""
    got = [(calls[k]["name"], json.loads(calls[k]["arguments"])) for k in sorted(calls)]
    check(whole and got == [(t.function.name, json.loads(t.function.arguments)) for t in whole],
          "streamed, a required reply's tool-call deltas assemble to the unary reply's calls: %s" % got)
    # Unbounded integers and numbers (a random model may write digits to max_tokens: only the
    # replies that end are checked, and most must end).
    num = [{"type": "function", "function": {"name": "count", "parameters": {
        "type": "object", "properties": {"n": {"type": "integer"}, "x": {"type": "number"}}, "required": ["n", "x"]}}}]
    ended, bad = 0, []
    for seed in range(8):
        r = c.chat.completions.create(model="glm", messages=msgs, tools=num, tool_choice="required",
                                      parallel_tool_calls=False, max_tokens=400, temperature=1.0, seed=seed,
                                      logit_bias=NO_THINK)
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
    ap.add_argument("--test-grammar", required=True)
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
        grammar_oracle(TEMPLATE.read_text(), a.tool_stream, a.test_grammar, work)
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
        TS.show_logs()
    finally:
        TS.kill_all()
        shutil.rmtree(work, ignore_errors=True)
    return check.summary()


if __name__ == "__main__":
    sys.exit(main())
