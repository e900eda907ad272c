#!/usr/bin/env python3
"""DeepSeek's tool-call format (server/tool_format.h TOOL_FORMAT_DEEPSEEK, docs/tools.md) against
the published templates themselves:
- Parsing: assistant messages with tool calls of every argument kind, rendered by Python jinja2 with
  DeepSeek-V3.1's template (`NAME<｜tool▁sep｜>ARGS`) and with DeepSeek-R1-Distill-Qwen-32B's
  (`function<｜tool▁sep｜>NAME` and fenced JSON); the reply part of each rendering, parsed by
  shardlm's parser (test_tool_stream --parse-deepseek), gives back the same calls: the same names,
  arguments equal as JSON.
- Serving (stories260K behind `serve --http --chat-template` V3.1's template, the official `openai`
  package): the server reads the template as the deepseek format; since the template never reads
  `tools`, the server writes them into the system message (after the client's own system text),
  so that the prompt has exactly the tokens of jinja2's rendering of that system message
  (sentencepiece); tool_choice auto is answered; `strict: true` is accepted.
- The grammar (server/http_tools.c's schema with DeepSeek's markers, printed by test_tool_stream
  --deepseek-schema, decided by test_grammar) against both templates' own renderings: complete
  under the required and the lazy (auto) schema, mutations not (grammar_oracle).
- Constrained calls (SmolLM2's GGUF behind V3.1's template, SKIP without it): required, named and
  parallel calls in DeepSeek's own format parse and their arguments validate (jsonschema), strict
  included; streamed equals unary.
SKIP (77) without openai, jinja2, sentencepiece or the stories260K golden model.

  test_tools_deepseek.py --shardlm BUILD/cli/shardlm --tool-stream BUILD/tests/test_tool_stream
                         --model BUILD/golden/stories260K
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

SKIP = 77
HERE = Path(__file__).resolve().parent
TESTS = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(TESTS))
try:
    import openai
    import sentencepiece as spm
    import test_jinja  # noqa: E402  (exits 77 without jinja2)
except ImportError as e:
    print(f"SKIP: a test dependency cannot be imported ({e}); run tools/install_deps.sh")
    sys.exit(SKIP)
import test_server as TS  # noqa: E402
from checks import Checks  # noqa: E402
import tool_cases as TC  # noqa: E402
from tool_cases import CALLS  # noqa: E402

check = Checks()
TEMPLATES = TESTS / "data" / "chat_templates"
V31 = TEMPLATES / "deepseek-ai-DeepSeek-V3.1.jinja"
R1 = TEMPLATES / "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja"
BAR, SP = "\uff5c", "\u2581"
ASSISTANT, EOS = f"<{BAR}Assistant{BAR}>", f"<{BAR}end{SP}of{SP}sentence{BAR}>"

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                           "required": ["city"]}}}]


def round_trip(path, tool_stream, work, r1):
    """Each CALLS entry rendered as an assistant turn by jinja2 with the template at path (R1's takes
    the arguments as a JSON string, V3.1's as an object it writes with tojson); the reply parsed back."""
    t = test_jinja.make_env().from_string(path.read_text())
    replies = []
    for calls in CALLS:
        tcs = [{"type": "function", "function": {"name": c["name"],
                                                 "arguments": json.dumps(c["arguments"]) if r1 else c["arguments"]}}
               for c in calls]
        msgs = [{"role": "user", "content": "go"}, {"role": "assistant", "content": "", "tool_calls": tcs}]
        text = t.render(messages=msgs, add_generation_prompt=False, bos_token="<s>", eos_token=EOS)
        # The one assistant turn: from its marker to its end of sentence (R1's template writes an
        # empty assistant turn after it).
        reply = text[text.index(ASSISTANT) + len(ASSISTANT):].replace("<think></think>", "", 1)
        replies.append(reply[: reply.index(EOS)] if EOS in reply else reply)
    rc, got = TC.parse_back(tool_stream, "--parse-deepseek", work / ("r1" if r1 else "v31"), replies)
    check(rc == 0, "the DeepSeek parser runs on %d replies rendered by %s" % (len(replies), path.name))
    for calls, back in zip(CALLS, got):
        check(TC.same_calls(calls, back), "rendered by %s and parsed back: %s -> %s" % (path.name, json.dumps(calls)[:80], back))
    check(len(got) == len(CALLS), "%d of %d renderings parsed (%s)" % (len(got), len(CALLS), path.name))


CALLS_BEGIN, CALL_BEGIN = f"<{BAR}tool{SP}calls{SP}begin{BAR}>", f"<{BAR}tool{SP}call{SP}begin{BAR}>"
CALL_END, CALLS_END = f"<{BAR}tool{SP}call{SP}end{BAR}>", f"<{BAR}tool{SP}calls{SP}end{BAR}>"
# Declared tools for the grammar: CALLS' functions with any arguments, and one strict function.
STRICT = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"], "additionalProperties": False}}}
DECLARED = [STRICT] + [{"type": "function", "function": {"name": n, "parameters": {"type": "object"}}}
                       for n in sorted({c["name"] for calls in CALLS for c in calls} - {"get_weather"})]


def grammar_oracle(path, tool_stream, test_grammar, work, r1):
    """The schema that constrains DeepSeek's calls (server/http_tools.c, printed by test_tool_stream
    --deepseek-schema, decided by test_grammar) against the template's own renderings (jinja2):
    every CALLS reply (its arguments in the engine's compact JSON), after the markers a required
    call's prompt ends with, is complete under the
    required schema with parallel calls, and after <｜tool▁calls▁begin｜> under the lazy one (auto);
    mutated replies are not complete: an undeclared function, an enum value not in it, a required
    key missing, an undeclared key, a call not closed, the list not ended, a marker inside a string,
    and with one call or a named function, the replies that break them."""
    # The arguments in the engine's spelling (docs/grammar.md: compact JSON, no whitespace): the
    # template's tojson (V3.1) and the string R1's takes written without spaces.
    env = test_jinja.make_env()
    env.filters["tojson"] = lambda x, **kw: json.dumps(x, ensure_ascii=False, separators=(",", ":"))
    t = env.from_string(path.read_text())

    def rendered(calls):
        tcs = [{"type": "function", "function": {
            "name": c["name"], "arguments": json.dumps(c["arguments"], ensure_ascii=False, separators=(",", ":")) if r1
            else c["arguments"]}} for c in calls]
        msgs = [{"role": "user", "content": "go"}, {"role": "assistant", "content": "", "tool_calls": tcs}]
        text = t.render(messages=msgs, add_generation_prompt=False, bos_token="<s>", eos_token=EOS)
        reply = text[text.index(CALLS_BEGIN):]
        return reply[: reply.index(EOS)] if EOS in reply else reply

    def schema(only, parallel, lazy):
        out = subprocess.run([tool_stream, "--deepseek-schema", json.dumps(DECLARED), only, str(parallel), str(int(r1)),
                              str(lazy)], capture_output=True, text=True, timeout=60)
        f = work / f"ds-{int(r1)}-{only}-{parallel}-{lazy}.json"
        f.write_text(out.stdout)
        return f

    def decide(f, texts):
        return TC.decide(test_grammar, "json_schema", f, texts)
    shape = "R1" if r1 else "V3.1"
    replies = [rendered(calls) for calls in CALLS]
    after = len(CALLS_BEGIN + CALL_BEGIN)
    got = decide(schema("", 1, 0), [r[after:] for r in replies])
    check(got == ["complete"] * len(replies), f"{shape}: the template's {len(replies)} renderings are complete under "
          f"the required schema (parallel calls): {got}")
    got = decide(schema("", 1, 1), [r[len(CALLS_BEGIN):] for r in replies])
    check(got == ["complete"] * len(replies), f"{shape}: what follows each rendering's {CALLS_BEGIN} is complete "
          f"under the lazy schema (auto): {got}")
    one = replies[0][after:]
    bad = {"an undeclared function": one.replace("get_weather", "get_wether"),
           "an enum value not in it": one.replace("celsius", "kelvin"),
           "a required key missing": rendered([{"name": "get_weather", "arguments": {"city": "Paris"}}])[after:],
           "an undeclared key": rendered([{"name": "get_weather", "arguments": {"city": "P", "unit": "celsius",
                                                                                  "x": 1}}])[after:],
           "a call not closed": one[: one.index(CALL_END)],
           "the list not ended": one[: one.index(CALLS_END)],
           "a marker inside a string": rendered([{"name": "search", "arguments": {"q": "a"}}])[after:].replace(
               '"a"', f'"{CALL_END}"')}
    got = decide(schema("", 1, 0), list(bad.values()))
    check(all(g != "complete" for g in got), f"{shape}: mutated replies are not complete: {dict(zip(bad, got))}")
    three = replies[3][after:]  # three calls
    got = decide(schema("", 0, 0), [three, one])
    check(got[0] != "complete" and got[1] == "complete",
          f"{shape}: parallel_tool_calls false: three calls are not complete, one is: {got}")
    got = decide(schema("search", 1, 0), [one, replies[1][after:]])
    check(got[0] != "complete" and got[1] == "complete",
          f"{shape}: a named function (search): get_weather's call is not complete, search's is: {got}")


def tools_text(functions):
    """What the server writes into the system message for V3.1's template (server/tool_format.c)."""
    b, e = f"<{BAR}tool{SP}call{SP}begin{BAR}>", f"<{BAR}tool{SP}call{SP}end{BAR}>"
    return ("You can call these tools (JSON Schema of each function's arguments):\n"
            + json.dumps(functions, separators=(",", ":"), ensure_ascii=False)
            + f"\n\nTo call tools, write exactly:\n<{BAR}tool{SP}calls{SP}begin{BAR}>{b}FUNCTION_NAME<{BAR}tool{SP}sep{BAR}>"
            + f"{{ARGUMENTS AS JSON}}{e}<{BAR}tool{SP}calls{SP}end{BAR}>\nwith one {b} ... {e} for each call.")


def serve(a, work):
    tok = Path(a.model) / "tokenizer.model"
    sp = spm.SentencePieceProcessor(model_file=str(tok))
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather?"}]
    sys_msgs = [{"role": "system", "content": "Be brief.\n\n" + tools_text([TOOLS[0]["function"]])}, msgs[1]]
    # The template opens with bos_token, which the server's tokenizer reads as the one BOS id.
    prompt = test_jinja.make_env().from_string(V31.read_text()).render(
        messages=sys_msgs, add_generation_prompt=True, bos_token="", eos_token="</s>")
    want = 1 + len(sp.encode(prompt))
    with TS.Server(a.shardlm, Path(a.model), "--chat-template", str(V31), "--no-prefix-caching", name="deepseek",
                   http=True) as srv:
        check(" tool calls in the deepseek format" in srv.log_path.read_text(),
              "the server reads DeepSeek-V3.1's template as the deepseek tool format")
        c = openai.OpenAI(base_url=f"http://127.0.0.1:{srv.http_port}/v1", api_key="none", timeout=60)
        r = c.chat.completions.create(model="stories260K", messages=msgs, tools=TOOLS, max_tokens=4, temperature=0)
        check(r.choices[0].finish_reason in ("stop", "length", "tool_calls") and r.usage.prompt_tokens == want,
              "tools with tool_choice auto: answered after a prompt of %d tokens, the tools written into the system "
              "message (jinja2 + sentencepiece: %d)" % (r.usage.prompt_tokens, want))
        try:
            c.chat.completions.create(model="stories260K", messages=msgs, max_tokens=4,
                                      tools=[{"type": "function", "function": dict(TOOLS[0]["function"], strict=True)}])
            check(True, "strict: true is accepted (the calls' arguments are held to the whole schema)")
        except openai.BadRequestError as e:
            check(False, f"strict: true is accepted: {str(e)[:110]}")


WEATHER = {"type": "function", "function": {"name": "get_weather", "strict": True, "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]},
                                     "days": {"type": "integer", "minimum": 1, "maximum": 5}},
    "required": ["city", "days"], "additionalProperties": False}}}
PING = {"type": "function", "function": {"name": "ping", "parameters": {"type": "object", "properties": {},
                                                                        "additionalProperties": False}}}


def serve_constrained(a):
    """Required, named and parallel calls in DeepSeek's own format, constrained, on SmolLM2 (its
    context holds the tools' system text and the markers' many byte tokens) behind V3.1's
    template: every reply is calls that parse (a reply in any other format would not: this
    template's parser reads only DeepSeek's markers) and whose arguments validate against the
    declared parameters (jsonschema), strict: true included; a streamed reply's calls equal the
    unary one's."""
    if not a.gguf or not Path(a.gguf).exists():
        print(f"SKIP: constrained DeepSeek calls: no SmolLM2 GGUF at {a.gguf} (tools/fetch_smollm2.sh)")
        return
    import jsonschema
    params = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER, PING)}
    with TS.Server(a.shardlm, Path(a.gguf), "--chat-template", str(V31), name="deepseek-smollm2", http=True) as srv:
        c = openai.OpenAI(base_url=f"http://127.0.0.1:{srv.http_port}/v1", api_key="none", timeout=120)
        model = c.models.list().data[0].id
        msgs = [{"role": "user", "content": "What is the weather in Paris for the next days?"}]

        def calls_of(choice, what, only=None, most=None):
            tc = choice.message.tool_calls or []
            ok = choice.finish_reason == "tool_calls" and tc and (most is None or len(tc) <= most)
            for t in tc:
                try:
                    jsonschema.validate(json.loads(t.function.arguments), params[t.function.name])
                except Exception:  # noqa: BLE001 - any failure is the check's
                    ok = False
                ok = ok and (only is None or t.function.name == only)
            check(ok, f"{what}: {choice.finish_reason}, calls {[(t.function.name, t.function.arguments) for t in tc]}")
            return [(t.function.name, t.function.arguments) for t in tc]
        for seed in range(3):
            r = c.chat.completions.create(model=model, messages=msgs, tools=[WEATHER, PING], tool_choice="required",
                                          parallel_tool_calls=False, max_tokens=300, temperature=1.0, seed=seed)
            unary = calls_of(r.choices[0], f"required, one call, seed {seed} (strict: true, an enum and bounds)", most=1)
        stream = c.chat.completions.create(model=model, messages=msgs, tools=[WEATHER, PING], tool_choice="required",
                                           parallel_tool_calls=False, max_tokens=300, temperature=1.0, seed=2,
                                           stream=True)
        got = TC.streamed_calls(stream)
        check(got == unary,
              f"the streamed reply's calls equal the unary one's: {got} vs {unary}")
        r = c.chat.completions.create(model=model, messages=msgs, tools=[WEATHER, PING],
                                      tool_choice={"type": "function", "function": {"name": "ping"}},
                                      parallel_tool_calls=False, max_tokens=300, temperature=1.0, seed=4)
        calls_of(r.choices[0], "a named function (ping)", only="ping")
        r = c.chat.completions.create(model=model, messages=msgs, tools=[WEATHER, PING], tool_choice="required",
                                      max_tokens=300, temperature=1.0, seed=5, n=3)
        for i, ch in enumerate(r.choices):
            if ch.finish_reason == "length":  # parallel calls may go on to the limit: the calls so far
                tc = ch.message.tool_calls or []
                check(all(json.loads(t.function.arguments) is not None for t in tc),
                      f"parallel calls, sample {i}: cut by max_tokens after {len(tc)} calls")
            else:
                calls_of(ch, f"parallel calls, sample {i}")



def no_switch(a):
    """R1-Distill's template splits <think> but reads no enable_thinking (the model always reasons):
    turning the reasoning off through Anthropic's thinking or the Responses API's effort none would
    not be honoured, so both are refused by name."""
    if not a.gguf or not Path(a.gguf).exists():
        print(f"SKIP: R1's template served: no SmolLM2 GGUF at {a.gguf} (tools/fetch_smollm2.sh)")
        return
    with TS.Server(a.shardlm, Path(a.gguf), "--chat-template", str(R1), name="deepseek-r1-smollm2", http=True) as srv:
        c = openai.OpenAI(base_url=f"http://127.0.0.1:{srv.http_port}/v1", api_key="none", timeout=120)
        model = c.models.list().data[0].id
        try:
            c.responses.create(model=model, input="x", max_output_tokens=4, reasoning={"effort": "none"})
            check(False, "R1: reasoning.effort none is refused")
        except openai.APIStatusError as e:
            check(e.status_code == 400 and "enable_thinking" in str(e), f"R1: reasoning.effort none is a 400 naming "
                  f"the template's missing switch ({str(e)[:120]})")
        body = json.dumps({"model": model, "max_tokens": 4, "messages": [{"role": "user", "content": "x"}],
                           "thinking": {"type": "disabled"}}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{srv.http_port}/v1/messages", data=body,
                                     headers={"content-type": "application/json", "anthropic-version": "2023-06-01"})
        try:
            urllib.request.urlopen(req, timeout=60)
            check(False, "R1: Anthropic's thinking disabled is refused")
        except urllib.error.HTTPError as e:
            text = e.read().decode()
            check(e.code == 400 and "thinking" in text and "enable_thinking" in text,
                  f"R1: Anthropic's thinking disabled is a 400 naming it ({text[:140]})")

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shardlm", required=True)
    ap.add_argument("--tool-stream", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--test-grammar", required=True)
    ap.add_argument("--gguf", help="SmolLM2-135M-Instruct's GGUF (the constrained calls)")
    a = ap.parse_args()
    if not (Path(a.model) / "tokenizer.model").exists():
        print(f"SKIP: no stories260K model at {a.model}")
        return SKIP
    work = Path(tempfile.mkdtemp(prefix="shardlm-deepseek-"))
    try:
        round_trip(V31, a.tool_stream, work, r1=False)
        round_trip(R1, a.tool_stream, work, r1=True)
        grammar_oracle(V31, a.tool_stream, a.test_grammar, work, r1=False)
        grammar_oracle(R1, a.tool_stream, a.test_grammar, work, r1=True)
        serve(a, work)
        serve_constrained(a)
        no_switch(a)
    except Exception as e:  # noqa: BLE001 - reported with the server logs
        check(False, f"{e}")
        TS.show_logs()
    finally:
        TS.kill_all()
    return check.summary()


if __name__ == "__main__":
    sys.exit(main())
