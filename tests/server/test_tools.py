#!/usr/bin/env python3
"""Tool calling end to end (issue 28): `shardlm serve --http` with SmolLM2-135M-Instruct, driven
by the official openai package as an agent backend drives it: the tool-calling loop (a call,
the tool's result fed back as a "tool" message, the final answer), unary and streamed, with
tool_choice required / a named function / auto / none and parallel_tool_calls false. What is
checked comes from elsewhere: every call's arguments validate with `jsonschema` against the
function's declared parameters and name a declared function; the SDK's own types parse every
response and chunk. Bad tool requests are 400 naming the field.

  test_tools.py --shardlm BUILD/cli/shardlm --gguf .cache/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
SKIP (77) without the GGUF, openai or jsonschema.
"""
import argparse
import json
import os
import sys
from pathlib import Path

SKIP = 77
sys.dont_write_bytecode = True
sys.path.insert(0, str(Path(__file__).resolve().parent))
try:
    import jsonschema  # noqa: F401  (test_tools_native.calls_valid validates with it)
    import openai
except ImportError as e:
    print(f"SKIP: a test dependency cannot be imported ({e}); run tools/install_deps.sh")
    sys.exit(SKIP)
import test_server as TS  # noqa: E402
import tools_grpc as TG  # noqa: E402
from checks import Checks  # noqa: E402
from test_tools_native import TOOLS, WEATHER, calls_valid  # noqa: E402  (the two functions, the call check)

check = Checks()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shardlm", required=True)
    ap.add_argument("--gguf", required=True)
    a = ap.parse_args()
    if not os.path.exists(a.gguf):
        print(f"SKIP: no SmolLM2 GGUF at {a.gguf} (tools/fetch_smollm2.sh)")
        return SKIP
    try:
        with TS.Server(a.shardlm, Path(a.gguf), name="tools", http=True) as srv:
            mid = Path(a.gguf).name
            oa = openai.OpenAI(base_url=srv.base + "/v1", api_key="none", max_retries=0, timeout=300)
            msgs = [{"role": "user", "content": "What is the weather in Paris?"}]

            def ask(messages, **kw):
                kw.setdefault("max_tokens", 120)
                kw.setdefault("temperature", 0)
                return oa.chat.completions.create(model=mid, messages=messages, tools=TOOLS, **kw)

            # The loop: required -> a valid call; its result goes back; then the answer.
            r = ask(msgs, tool_choice="required")
            m = r.choices[0].message
            check(r.choices[0].finish_reason == "tool_calls" and m.content is None and calls_valid(m.tool_calls),
                  f"tool_choice required -> {[(c.function.name, c.function.arguments) for c in m.tool_calls or []]}")
            if m.tool_calls:
                history = msgs + [m.model_dump(exclude_none=True)] + [
                    {"role": "tool", "tool_call_id": c.id, "content": json.dumps({"temperature": 21, "sky": "clear"})}
                    for c in m.tool_calls]
                # One call at most after the result (parallel_tool_calls false): SmolLM2 may answer
                # or call again, and calling on and on until max_tokens cut the last call (Zen 4).
                final = ask(history, tool_choice="auto", parallel_tool_calls=False)
                fm = final.choices[0].message
                check(final.choices[0].finish_reason in ("stop", "tool_calls")
                      and (isinstance(fm.content, str) and fm.content or calls_valid(fm.tool_calls)),
                      f"after the tool's result (auto) -> content {fm.content!r}, calls {fm.tool_calls and len(fm.tool_calls)}")
                final = ask(history, tool_choice="none")
                check(final.choices[0].finish_reason in ("stop", "length") and final.choices[0].message.tool_calls is None
                      and final.choices[0].message.content, f"tool_choice none -> {final.choices[0].message.content!r}")
            # A named function, sampled, several samples: each a valid call of that function only.
            # (one call each: with parallel calls a sampled reply may add calls up to max_tokens)
            r = ask(msgs, tool_choice={"type": "function", "function": {"name": "get_time"}}, temperature=1.0, seed=3,
                    n=3, parallel_tool_calls=False)
            check(all(c.finish_reason == "tool_calls" and calls_valid(c.message.tool_calls, ["get_time"])
                      for c in r.choices), f"named get_time, n=3 sampled: {[len(c.message.tool_calls or []) for c in r.choices]} calls")
            r = ask(msgs, tool_choice="required", parallel_tool_calls=False, temperature=1.0, seed=5)
            check(len(r.choices[0].message.tool_calls or []) == 1 and calls_valid(r.choices[0].message.tool_calls),
                  "parallel_tool_calls false -> exactly one call")
            # auto: either a valid call or content, never unparsed JSON.
            r = ask(msgs, tool_choice="auto")
            m = r.choices[0].message
            check((m.tool_calls and calls_valid(m.tool_calls) and r.choices[0].finish_reason == "tool_calls")
                  or (m.content and not m.content.lstrip().startswith("{")), f"auto -> {m.content!r} {m.tool_calls}")
            # Streaming: the calls arrive as deltas that the SDK assembles; the same as unary.
            unary = ask(msgs, tool_choice="required").choices[0].message.tool_calls
            got, finish = {}, None
            for ch in ask(msgs, tool_choice="required", stream=True):
                for c in ch.choices:
                    finish = c.finish_reason or finish
                    for tc in c.delta.tool_calls or []:
                        e = got.setdefault(tc.index, {"name": "", "arguments": ""})
                        e["name"] += tc.function.name or ""
                        e["arguments"] += tc.function.arguments or ""
            check(finish == "tool_calls" and [(e["name"], e["arguments"]) for _, e in sorted(got.items())]
                  == [(c.function.name, c.function.arguments) for c in unary or []],
                  f"streamed tool calls equal unary ({len(got)} calls)")
            # gRPC Chat / ChatStream (generic format): the same conversations give the HTTP answers.
            with srv.client() as gc:
                call = {"id": "call_1", "type": "function", "function": {
                    "name": "get_weather", "arguments": json.dumps({"city": "Paris", "unit": "celsius"})}}
                loop = msgs + [{"role": "assistant", "content": None, "tool_calls": [call]},
                               {"role": "tool", "tool_call_id": "call_1", "content": "{\"temperature\": 21}"}]
                for name, hist, kw in (("required", msgs, dict(tool_choice="required")),
                                       ("auto after a tool result", loop, dict(tool_choice="auto")),
                                       ("named, sampled n=2", msgs, dict(tool_choice={"type": "function", "function": {
                                           "name": "get_time"}}, temperature=1.0, seed=3, n=2))):
                    kw = dict(dict(max_tokens=120, temperature=0), **kw)
                    h = ask(hist, **kw)
                    g = gc.chat(hist, tools=TOOLS, **kw)
                    want = [TG.http_parts(c.message, c.finish_reason) for c in h.choices]
                    got = [TG.grpc_parts(c) for c in g.completions]
                    check(got == want, f"gRPC generic {name}: equals HTTP {want} (gRPC {got})")
                    if name == "required":
                        sgot, _ = TG.grpc_stream_parts(gc.chat_stream(hist, tools=TOOLS, **kw))
                        check(sgot == got[0] and calls_valid(h.choices[0].message.tool_calls),
                              f"gRPC generic: streamed equals unary ({sgot})")
                TG.expect_grpc_invalid(check, lambda: gc.chat(msgs, tools=[WEATHER, WEATHER], max_tokens=4), "twice")
                TG.expect_grpc_invalid(check, lambda: gc.chat(msgs, tool_choice="required", max_tokens=4), "tools")
            # Bad requests: 400 naming the field.
            bad = [(dict(tools=[{"type": "function", "function": {"name": "bad name!"}}]), "function.name"),
                   (dict(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "nope"}}), "nope"),
                   (dict(tools=[WEATHER, WEATHER]), "twice"),
                   (dict(tools=TOOLS, tool_choice="sometimes"), "tool_choice"),
                   (dict(tools=TOOLS, response_format={"type": "json_object"}), "tools"),
                   (dict(tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "nope"}}}],
                         tool_choice="required"), "nope"),
                   # Every field of a tool is read or refused by name.
                   (dict(tools=[{"type": "function", "function": {"name": "f", "examples": []}}]),
                    "tools[0].function.examples: unknown field"),
                   (dict(tools=[WEATHER, {"type": "function", "function": {"name": "f"}, "cache_control": {}}]),
                    "tools[1].cache_control: unknown field"),
                   (dict(tools=[{"type": "function", "function": {"name": "f", "strict": "yes"}}]),
                    "'tools[0].function.strict' must be a boolean")]
            for kw, word in bad:
                try:
                    oa.chat.completions.create(model=mid, messages=msgs, max_tokens=5, **kw)
                    check(False, f"refused: {kw}")
                except openai.BadRequestError as e:
                    check(word in str(e), f"400 naming {word!r}: {str(e)[:150]}")
            r = oa.chat.completions.create(model=mid, messages=msgs, max_tokens=120, temperature=0, tool_choice="required",
                                           parallel_tool_calls=False,
                                           tools=[{"type": "function", "function": {**WEATHER["function"], "strict": True}}])
            check(calls_valid(r.choices[0].message.tool_calls), "a function with strict true is accepted and followed")
            try:
                oa.chat.completions.create(model=mid, max_tokens=5, messages=msgs + [
                    {"role": "tool", "tool_call_id": 7, "content": "x"}])
                check(False, "a tool message without a string tool_call_id is refused")
            except openai.BadRequestError as e:
                check("tool_call_id" in str(e), f"400 naming tool_call_id: {str(e)[:120]}")
    finally:
        for p in TS.SERVERS:
            if p.poll() is None:
                p.kill()
    return check.summary()


if __name__ == "__main__":
    sys.exit(main())
