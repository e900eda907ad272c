#!/usr/bin/env python3
"""Kimi-K2's tool-call format (server/tool_format.h TOOL_FORMAT_KIMI, docs/tools.md) against its
template as llama.cpp ships it (models/templates/Kimi-K2-Instruct.jinja in the llama-cpp-python
sdist that `make test` fetches into .cache/llama.cpp; SKIP without it):
- Parsing: assistant messages with tool calls of every argument kind (tool_cases.CALLS) rendered
  by Python jinja2 with the template (`functions.NAME:INDEX<|tool_call_argument_begin|>ARGS`, the
  index counted across the conversation) and parsed back by shardlm's parser
  (test_tool_stream --parse-kimi): the same names, arguments equal as JSON.
- The grammar (server/http_tools.c's schema, printed by test_tool_stream --deepseek-schema ... 1
  INDEX, decided by test_grammar): each one-call rendering (arguments in the engine's compact JSON)
  is complete under the required schema and, after <|tool_calls_section_begin|>, the lazy one; a
  call after an earlier call and its result (INDEX 1 in the rendering) is complete under INDEX 1
  and not under 0; mutations are not (an undeclared function, a required key missing, a call not
  closed, the section not ended, two calls in one-call mode); under parallel_tool_calls the template's
  renderings of several calls are complete (each numbered one more, required and lazy), the same
  index twice or a count from the wrong start is not.
- Serving (SmolLM2's GGUF behind the template, SKIP without it): the template read as kimi; a
  required call parses and validates (jsonschema); the streamed call equals the unary one; a
  history with calls is a 400 naming list.append (the template appends to a namespace's list, which
  shardlm's Jinja refuses as transformers' immutable sandbox does); under llama.cpp's other Kimi-K2
  template (moonshotai-Kimi-K2.jinja: calls numbered within each message, no append) a required
  call after a call and its result validates and the history's prompt has jinja2's tokens.

  test_tools_kimi.py --shardlm BUILD/cli/shardlm --tool-stream BUILD/tests/test_tool_stream
                     --test-grammar BUILD/tests/test_grammar --gguf SMOLLM2_GGUF
"""
import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

SKIP = 77
HERE = Path(__file__).resolve().parent
TESTS = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(TESTS))
try:
    import jsonschema
    import openai
    import test_jinja  # noqa: E402  (exits 77 without jinja2)
except ImportError as e:
    print(f"SKIP: a test dependency cannot be imported ({e}); run tools/install_deps.sh")
    sys.exit(SKIP)
import test_server as TS  # noqa: E402
from checks import Checks  # noqa: E402
import tool_cases as TC  # noqa: E402
from tool_cases import CALLS  # noqa: E402

check = Checks()
TEMPLATES = TS.ROOT / ".cache/llama.cpp/llama_cpp_python-0.3.36/vendor/llama.cpp/models/templates"
TEMPLATE = TEMPLATES / "Kimi-K2-Instruct.jinja"  # calls numbered across the conversation
PER_MESSAGE = TEMPLATES / "moonshotai-Kimi-K2.jinja"  # numbered within each message; no list.append
SECTION, CALL = "<|tool_calls_section_begin|>", "<|tool_call_begin|>"
CALL_END, SECTION_END = "<|tool_call_end|>", "<|tool_calls_section_end|>"
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"], "additionalProperties": False}}}
DECLARED = [WEATHER] + [{"type": "function", "function": {"name": n, "parameters": {"type": "object"}}}
                        for n in sorted({c["name"] for calls in CALLS for c in calls} - {"get_weather"})]


def env(compact, path=TEMPLATE):
    e = test_jinja.make_env()
    # The template appends to and pops from a namespace's list, which llama.cpp's minja allows and
    # transformers' immutable sandbox refuses: jinja2's mutable sandbox rules here.
    e.is_safe_attribute = lambda obj, attr, value: not attr.startswith("_")
    if compact:  # the engine's spelling (docs/grammar.md: compact JSON)
        e.filters["tojson"] = lambda x, **kw: json.dumps(x, ensure_ascii=False, separators=(",", ":"))
    return e.from_string(path.read_text())


def tool_calls(calls):
    return [{"id": f"call_{i}", "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
            for i, c in enumerate(calls)]


def last_reply(text):
    """The last assistant turn's reply: from its section marker to its <|im_end|>."""
    at = text.rindex(SECTION)
    return text[at:text.index("<|im_end|>", at)]


def render(t, history, calls):
    msgs = history + [{"role": "user", "content": "go"}, {"role": "assistant", "content": "",
                                                          "tool_calls": tool_calls(calls)}]
    return last_reply(t.render(messages=msgs, tools=DECLARED, add_generation_prompt=False))


def round_trip(a, work):
    t = env(False)
    replies = [render(t, [], calls) for calls in CALLS]
    rc, got = TC.parse_back(a.tool_stream, "--parse-kimi", work / "kimi", replies)
    check(rc == 0 and len(got) == len(CALLS), f"the Kimi parser reads {len(got)} of {len(CALLS)} renderings")
    for calls, back in zip(CALLS, got):
        check(TC.same_calls(calls, back), f"rendered by Kimi-K2's template and parsed back: {json.dumps(calls)[:80]} -> {back}")


def grammar_oracle(a, work):
    t = env(True)

    def schema(index, lazy=0, only="", parallel=0):
        out = subprocess.run([a.tool_stream, "--deepseek-schema", json.dumps(DECLARED), only, str(parallel), "0",
                              str(lazy), "1", str(index)], capture_output=True, text=True, timeout=60)
        f = work / f"kimi-{index}-{lazy}-{only}-{parallel}.json"
        f.write_text(out.stdout)
        return f

    def decide(f, texts):
        return TC.decide(a.test_grammar, "json_schema", f, texts)
    ones = [calls for calls in CALLS if len(calls) == 1]
    replies = [render(t, [], calls) for calls in ones]
    after = len(SECTION + CALL)
    got = decide(schema(0), [r[after:] for r in replies])
    check(got == ["complete"] * len(replies), f"Kimi: the template's {len(replies)} one-call renderings are complete "
          f"under the required schema: {got}")
    got = decide(schema(0, lazy=1), [r[len(SECTION):] for r in replies])
    check(got == ["complete"] * len(replies), f"Kimi: what follows each rendering's {SECTION} is complete under the "
          f"lazy schema (auto): {got}")
    # A call after an earlier call and its result: the template numbers it 1.
    first = [{"role": "user", "content": "weather?"},
             {"role": "assistant", "content": "", "tool_calls": tool_calls(CALLS[0])},
             {"role": "tool", "tool_call_id": "call_0", "content": "21 C"}]
    second = render(t, first, ones[1])
    got = decide(schema(1), [second[after:]]) + decide(schema(0), [second[after:]])
    check(got == ["complete", "reject"], f"Kimi: the second call of a conversation (functions.NAME:1) is complete "
          f"under index 1 and not under 0: {got}")
    one = replies[0][after:]
    bad = {"an undeclared function": one.replace("get_weather", "get_wether"),
           "a required key missing": render(t, [], [{"name": "get_weather", "arguments": {"city": "P"}}])[after:],
           "a call not closed": one[: one.index(CALL_END)],
           "the section not ended": one[: one.index(SECTION_END)],
           "two calls": render(t, [], CALLS[3])[after:]}
    got = decide(schema(0), list(bad.values()))
    check(all(g != "complete" for g in got), f"Kimi: mutated replies are not complete: {dict(zip(bad, got))}")
    # Parallel calls: each numbered one more than the one before it (the template's counter), as
    # the template renders them; the same index twice, or a count that starts wrong, is not.
    many = [calls for calls in CALLS if len(calls) > 1]
    texts = [render(t, [], calls)[after:] for calls in many]
    got = decide(schema(0, parallel=1), texts) + decide(schema(0, lazy=1, parallel=1), [CALL + x for x in texts])
    check(len(many) >= 1 and got == ["complete"] * (2 * len(many)), f"Kimi: the template's {len(many)} renderings of "
          f"parallel calls are complete under the parallel schema, required and lazy: {got}")
    two = texts[0]
    same = two.replace(":1" + "<|tool_call_argument_begin|>", ":0" + "<|tool_call_argument_begin|>", 1)
    got = decide(schema(0, parallel=1), [same]) + decide(schema(1, parallel=1), [two])
    check(same != two and got == ["reject", "reject"], f"Kimi: parallel calls numbered 0, 0, or from 0 where the "
          f"conversation's next is 1, are not complete: {got}")


def serve(a):
    if not a.gguf or not Path(a.gguf).exists():
        print(f"SKIP: Kimi served: no SmolLM2 GGUF at {a.gguf} (tools/fetch_smollm2.sh)")
        return
    params = {x["function"]["name"]: x["function"]["parameters"] for x in DECLARED}
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]

    def valid(choice, what):
        tc = choice.message.tool_calls or []
        ok = choice.finish_reason == "tool_calls" and len(tc) == 1
        for x in tc:
            try:
                jsonschema.validate(json.loads(x.function.arguments), params[x.function.name])
            except Exception:  # noqa: BLE001 - any failure is the check's
                ok = False
        check(ok, f"{what}: {choice.finish_reason}, {[(x.function.name, x.function.arguments) for x in tc]}")
        return tc

    def history_of(r, tc):
        return ask + [r.choices[0].message.model_dump(exclude_none=True),
                      {"role": "tool", "tool_call_id": tc[0].id, "content": "21 C"},
                      {"role": "user", "content": "And in Rome?"}]
    with TS.Server(a.shardlm, Path(a.gguf), "--chat-template", str(TEMPLATE), "--no-prefix-caching", name="kimi",
                   http=True) as srv:
        check(" tool calls in the kimi format" in srv.log_path.read_text(), "the server reads Kimi-K2's template as kimi")
        c = openai.OpenAI(base_url=f"http://127.0.0.1:{srv.http_port}/v1", api_key="none", timeout=120)
        mid = c.models.list().data[0].id
        r = c.chat.completions.create(model=mid, messages=ask, tools=[WEATHER], tool_choice="required",
                                      parallel_tool_calls=False,
                                      max_tokens=120, temperature=0)
        tc = valid(r.choices[0], "a required call")
        stream = c.chat.completions.create(model=mid, messages=ask, tools=[WEATHER], tool_choice="required",
                                           parallel_tool_calls=False,
                                           max_tokens=120, temperature=0, stream=True)
        got = TC.streamed_calls(stream)
        check(got == [(x.function.name, x.function.arguments) for x in tc],
              f"the streamed call equals the unary one: {got}")
        # Parallel calls (each numbered one more by the grammar): every whole call validates
        # (SmolLM2 may repeat calls up to max_tokens: the whole ones are kept).
        r = c.chat.completions.create(model=mid, messages=ask, tools=[WEATHER], tool_choice="required",
                                      max_tokens=120, temperature=0)
        ch, ok = r.choices[0], r.choices[0].finish_reason in ("tool_calls", "length")
        for x in ch.message.tool_calls or []:
            try:
                jsonschema.validate(json.loads(x.function.arguments), params[x.function.name])
            except Exception:  # noqa: BLE001 - any failure is the check's
                ok = False
        check(ok and len(ch.message.tool_calls or []) >= 1, f"parallel calls: {ch.finish_reason}, "
              f"{[(x.function.name, x.function.arguments) for x in ch.message.tool_calls or []]}")
        # This template appends to a list for a history with calls; shardlm's Jinja, like
        # transformers' immutable sandbox, refuses that: a 400 naming it.
        if tc:
            try:
                c.chat.completions.create(model=mid, messages=history_of(r, tc), tools=[WEATHER], max_tokens=4)
                check(False, "a history with calls under Kimi-K2-Instruct's template (list.append) is refused")
            except openai.BadRequestError as e:
                check("append" in str(e), f"a history with calls under its list.append: 400 naming it ({str(e)[:100]})")
    if not PER_MESSAGE.exists():
        print(f"SKIP: no {PER_MESSAGE}")
        return
    with TS.Server(a.shardlm, Path(a.gguf), "--chat-template", str(PER_MESSAGE), "--no-prefix-caching", name="kimi-pm",
                   http=True) as srv:
        c = openai.OpenAI(base_url=f"http://127.0.0.1:{srv.http_port}/v1", api_key="none", timeout=120)
        mid = c.models.list().data[0].id
        r = c.chat.completions.create(model=mid, messages=ask, tools=[WEATHER], tool_choice="required",
                                      parallel_tool_calls=False,
                                      max_tokens=120, temperature=0)
        tc = valid(r.choices[0], "moonshotai-Kimi-K2.jinja: a required call")
        if tc:
            history = history_of(r, tc)
            r2 = c.chat.completions.create(model=mid, messages=history, tools=[WEATHER], tool_choice="required",
                                           parallel_tool_calls=False,
                                           max_tokens=120, temperature=0)
            valid(r2.choices[0], "moonshotai-Kimi-K2.jinja: a required call after a call and its result")
            msgs = json.loads(json.dumps(history))
            for m in msgs:
                for x in m.get("tool_calls") or []:
                    x["function"]["arguments"] = json.loads(x["function"]["arguments"])
            prompt = env(False, PER_MESSAGE).render(messages=msgs, tools=[WEATHER], add_generation_prompt=True)
            comp = c.completions.create(model=mid, prompt=prompt, max_tokens=1, temperature=0)
            # (under auto: a required call's prompt ends with the markers the server writes after it)
            r3 = c.chat.completions.create(model=mid, messages=history, tools=[WEATHER], max_tokens=1, temperature=0)
            check(r3.usage.prompt_tokens == comp.usage.prompt_tokens,
                  f"the history's prompt has jinja2's tokens ({r3.usage.prompt_tokens} vs {comp.usage.prompt_tokens})")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shardlm", required=True)
    ap.add_argument("--tool-stream", required=True)
    ap.add_argument("--test-grammar", required=True)
    ap.add_argument("--gguf")
    a = ap.parse_args()
    if not TEMPLATE.exists():
        print(f"SKIP: no Kimi-K2 template at {TEMPLATE} (tools/fetch_llamacpp_sdist.sh)")
        return SKIP
    work = Path(tempfile.mkdtemp(prefix="shardlm-kimi-"))
    try:
        round_trip(a, work)
        grammar_oracle(a, work)
        serve(a)
    except Exception as e:  # noqa: BLE001 - reported with the server logs
        check(False, f"{type(e).__name__}: {e}")
        TS.show_logs()
    finally:
        TS.kill_all()
    return check.summary()


if __name__ == "__main__":
    sys.exit(main())
