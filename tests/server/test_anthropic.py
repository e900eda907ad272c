#!/usr/bin/env python3
"""Anthropic's Messages API (issue 32): `shardlm serve --http` with SmolLM2-135M-Instruct and the
Qwen 2.5 template (Hermes tool calls), driven by the official anthropic package, beside the
openai package on /v1/chat/completions for the same conversation.

- A plain message, greedy: the same text and prompt length as /v1/chat/completions.
- Streaming: the events in Anthropic's order, their text equal to the unary reply.
- A system prompt (string and text blocks); stop_sequences (stop_reason stop_sequence).
- Tools: tool_choice any and tool give tool_use blocks whose input validates against the schema
  (stop_reason tool_use), streamed as input_json_delta; a tool_result turn answers.
- count_tokens equal to the chat endpoint's prompt_tokens.
- Keys: x-api-key accepted, 401 authentication_error without.
- Bad requests: missing max_tokens, an unknown field, a bad role, thinking on a template
  without reasoning: 400 invalid_request_error naming the field.

  test_anthropic.py --shardlm BUILD/cli/shardlm --gguf .cache/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
SKIP (77) without the GGUF, anthropic, openai or jsonschema.
"""
import argparse
import json
import os
import sys
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

SKIP = 77
sys.dont_write_bytecode = True
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
try:
    import anthropic
    import jsonschema
    import openai
except ImportError as e:
    print(f"SKIP: a test dependency cannot be imported ({e}); run tools/install_deps.sh")
    sys.exit(SKIP)
import test_server as TS  # noqa: E402
from checks import Checks  # noqa: E402

check = Checks()
TEMPLATE = HERE.parent / "data" / "chat_templates" / "qwen2.5-instruct.jinja"
KEY = "secret-an"
WEATHER = {"name": "get_weather", "description": "The current weather in a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 32},
                                                             "unit": {"enum": ["celsius", "fahrenheit"]}},
                            "required": ["city", "unit"], "additionalProperties": False}}
# This anthropic release no longer lists temperature among create()'s arguments: sent as extra_body.
T0 = {"temperature": 0}
ASK = [{"role": "user", "content": "Tell me about Paris in one sentence."}]


def expect_400(fn, needle, label):
    try:
        fn()
        check(False, f"{label}: accepted")
    except anthropic.BadRequestError as e:
        body = e.body if isinstance(e.body, dict) else {}
        err = body.get("error", {})
        check(body.get("type") == "error" and err.get("type") == "invalid_request_error" and needle in err.get("message", ""),
              f"{label}: 400 invalid_request_error naming {needle!r} ({err.get('message')})")


def total_in(u):
    """Anthropic's input counts add up to the prompt: computed + read from the prefix cache + written."""
    return u.input_tokens + (u.cache_read_input_tokens or 0) + (u.cache_creation_input_tokens or 0)


def plain(an, oa, mid):
    m = an.messages.create(model=mid, max_tokens=24, messages=ASK, extra_body=T0)
    c = oa.chat.completions.create(model=mid, messages=ASK, max_tokens=24, temperature=0)
    text = m.content[0].text if m.content and m.content[0].type == "text" else None
    check(m.type == "message" and m.role == "assistant" and m.id.startswith("msg_"), "message envelope")
    check(text == c.choices[0].message.content, f"greedy text equals chat's: {text!r}")
    check(total_in(m.usage) == c.usage.prompt_tokens and m.usage.output_tokens == c.usage.completion_tokens,
          f"usage equals chat's ({m.usage.input_tokens} + {m.usage.cache_read_input_tokens} read, "
          f"{m.usage.output_tokens})")
    # (cache_read_input_tokens with the prefix cache on: test_http.py's cache_salt group.)
    check(m.stop_reason in ("end_turn", "max_tokens"), f"stop_reason {m.stop_reason}")
    if m.stop_reason == "max_tokens":
        check(m.usage.output_tokens == 24, "max_tokens: 24 tokens out")
    n = an.messages.count_tokens(model=mid, messages=ASK)
    check(n.input_tokens == c.usage.prompt_tokens, f"count_tokens {n.input_tokens} == {c.usage.prompt_tokens}")

    # Streaming: events in order, text equal to the unary reply.
    kinds, text_s = [], ""
    with an.messages.stream(model=mid, max_tokens=24, messages=ASK, extra_body=T0) as s:
        for ev in s:
            kinds.append(ev.type)
            if ev.type == "content_block_delta" and ev.delta.type == "text_delta":
                text_s += ev.delta.text
        final = s.get_final_message()
    raw = [k for k in kinds if k in ("message_start", "content_block_start", "content_block_delta",
                                      "content_block_stop", "message_delta", "message_stop")]
    check(raw[0] == "message_start" and raw[1] == "content_block_start" and raw[-3:] ==
          ["content_block_stop", "message_delta", "message_stop"], f"event order {raw[:3]}..{raw[-3:]}")
    check(text_s == text and final.content[0].text == text, "streamed text equals the unary reply")
    check(final.stop_reason == m.stop_reason and final.usage.output_tokens == m.usage.output_tokens,
          f"stream stop_reason {final.stop_reason}, usage {final.usage.output_tokens}")

    # System prompt: a string and text blocks give the same prompt as chat's system message.
    sys_text = "You are a terse assistant."
    ms = an.messages.create(model=mid, max_tokens=16, system=sys_text, messages=ASK, extra_body=T0)
    mb = an.messages.create(model=mid, max_tokens=16, system=[{"type": "text", "text": sys_text}], messages=ASK,
                            extra_body=T0)
    cs = oa.chat.completions.create(model=mid, max_tokens=16, temperature=0,
                                    messages=[{"role": "system", "content": sys_text}] + ASK)
    check(total_in(ms.usage) == cs.usage.prompt_tokens == total_in(mb.usage) and
          ms.content[0].text == cs.choices[0].message.content == mb.content[0].text, "system prompt as chat's")

    # stop_sequences: a word of the greedy reply ends it there.
    words = text.split()
    if len(words) >= 3:
        stop = " " + words[2]
        st = an.messages.create(model=mid, max_tokens=24, messages=ASK, extra_body=T0, stop_sequences=[stop])
        check(st.stop_reason == "stop_sequence" and st.stop_sequence == stop and text.startswith(st.content[0].text)
              and stop not in st.content[0].text, f"stop_sequences: {st.stop_reason} {st.content[0].text!r}")


def tools(an, mid):
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    uses_any = None
    # One call each (disable_parallel_tool_use): greedy may otherwise repeat the call until max_tokens
    # cuts one (which it does depends on the CPU's rounding; the cut is checked below).
    for choice in ({"type": "any", "disable_parallel_tool_use": True},
                   {"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True}):
        m = an.messages.create(model=mid, max_tokens=64, messages=ask, tools=[WEATHER], tool_choice=choice,
                               extra_body=T0)
        uses = [b for b in m.content if b.type == "tool_use"]
        ok = bool(uses) and all(u.name == "get_weather" and u.id.startswith("toolu_") for u in uses)
        try:
            for u in uses:
                jsonschema.validate(u.input, WEATHER["input_schema"])
        except Exception as e:  # noqa: BLE001
            print(f"  {e}")
            ok = False
        check(ok and len(uses) == 1 and m.stop_reason == "tool_use",
              f"tool_choice {choice['type']}: {[(u.name, u.input) for u in uses]}, {m.stop_reason}")
        uses_any = uses if uses_any is None else uses_any
    # Streamed: each tool_use block's input_json_delta fragments assemble to its unary input (the
    # model may make several calls: one block each).
    partial, start = {}, None
    with an.messages.stream(model=mid, max_tokens=64, messages=ask, tools=[WEATHER],
                            tool_choice={"type": "any", "disable_parallel_tool_use": True}, extra_body=T0) as s:
        for ev in s:
            if ev.type == "content_block_start" and ev.content_block.type == "tool_use":
                start = ev.content_block
                partial[ev.index] = ""
            if ev.type == "content_block_delta" and ev.delta.type == "input_json_delta":
                partial[ev.index] = partial.get(ev.index, "") + ev.delta.partial_json
        final = s.get_final_message()
    streamed = [json.loads(partial[i]) for i in sorted(partial)]
    check(start is not None and streamed == [u.input for u in uses_any] and final.stop_reason == "tool_use",
          f"streamed tool_use blocks: {partial!r}")
    # A call cut by max_tokens (20 tokens: past the forced '{"tool_calls":[{"name":"get_weather",...' that
    # opens its tool_use block, short of its required arguments): stop_reason max_tokens, not
    # tool_use, unary and streamed.
    cut = an.messages.create(model=mid, max_tokens=20, messages=ask, tools=[WEATHER], tool_choice={"type": "any"},
                             extra_body=T0)
    with an.messages.stream(model=mid, max_tokens=20, messages=ask, tools=[WEATHER], tool_choice={"type": "any"},
                            extra_body=T0) as s:
        cut_streamed = s.get_final_message()
    check([b.type for b in cut.content] == [b.type for b in cut_streamed.content] == ["tool_use"] and
          cut.stop_reason == cut_streamed.stop_reason == "max_tokens" and cut.usage.output_tokens == 20,
          f"a call cut by max_tokens: stop_reason {cut.stop_reason} / {cut_streamed.stop_reason}, {cut.content}")
    # The tool_result turn: the history renders and the model answers.
    u = uses[0]
    follow = ask + [{"role": "assistant", "content": [{"type": "tool_use", "id": u.id, "name": u.name, "input": u.input}]},
                    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": u.id,
                                                  "content": [{"type": "text", "text": "18 degrees, sunny"}]}]}]
    r = an.messages.create(model=mid, max_tokens=24, messages=follow, tools=[WEATHER], extra_body=T0)
    n = an.messages.count_tokens(model=mid, messages=follow, tools=[WEATHER])
    check(total_in(r.usage) == n.input_tokens and n.input_tokens > 40, f"tool_result turn: {n.input_tokens} tokens, "
          f"{r.stop_reason}, {[b.type for b in r.content]}")


def errors(srv, mid):
    no_key = anthropic.Anthropic(base_url=srv.base, api_key="wrong", max_retries=0, timeout=60)
    try:
        no_key.messages.create(model=mid, max_tokens=4, messages=ASK)
        check(False, "wrong key accepted")
    except anthropic.AuthenticationError as e:
        check(e.status_code == 401 and e.body["error"]["type"] == "authentication_error", "401 authentication_error")
    an = anthropic.Anthropic(base_url=srv.base, api_key=KEY, max_retries=0, timeout=60)
    # Bearer works as well (the same keys).
    oa = openai.OpenAI(base_url=srv.base + "/v1", api_key=KEY, max_retries=0)
    r = oa.post("/messages", body={"model": mid, "max_tokens": 2, "messages": ASK}, cast_to=object)
    check(r["type"] == "message", "Authorization: Bearer accepted on /v1/messages")
    expect_400(lambda: an.post("/v1/messages", body={"model": mid, "messages": ASK}, cast_to=object), "max_tokens",
               "missing max_tokens")
    expect_400(lambda: an.messages.create(model=mid, max_tokens=4, messages=ASK, extra_body={"frobnicate": 1}),
               "frobnicate", "unknown field")
    expect_400(lambda: an.messages.create(model=mid, max_tokens=4, messages=[{"role": "system", "content": "x"}]),
               "messages[0].role", "bad role")
    expect_400(lambda: an.messages.create(model=mid, max_tokens=4, messages=[{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}]}]),
        "image", "image block")
    expect_400(lambda: an.messages.create(model=mid, max_tokens=4, messages=ASK,
                                          thinking={"type": "enabled", "budget_tokens": 1024}),
               "thinking", "thinking without reasoning")
    # The body as bytes, read as every route reads it: a member twice (Python and JavaScript take
    # the last, cJSON the first) and bytes after the object refused by name; the text "\\u0000"
    # (an escaped backslash, not a NUL) accepted.
    def raw(body):
        req = urllib.request.Request(srv.base + "/v1/messages", data=body.encode(), method="POST", headers={
            "x-api-key": KEY, "content-type": "application/json", "anthropic-version": "2023-06-01"})
        try:
            with urllib.request.urlopen(req, timeout=60) as f:
                return f.status, json.loads(f.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())
    ask = json.dumps(ASK)
    for body, needle, label in [
            (f'{{"model": "{mid}", "max_tokens": 2, "max_tokens": 100000, "messages": {ask}}}', "'max_tokens' appears twice",
             "max_tokens twice"),
            (f'{{"model": "{mid}", "max_tokens": 2, "messages": {ask}}}garbage', "bytes after its JSON value",
             "bytes after the object")]:
        st, b = raw(body)
        msg = b.get("error", {}).get("message", "")
        check(st == 400 and needle in msg, f"raw body, {label}: {st} naming {needle!r} ({msg})")
    st, b = raw(json.dumps({"model": mid, "max_tokens": 2, "messages": [{"role": "user", "content": "say \\u0000"}]}))
    check(st == 200 and b.get("type") == "message", f"the text \\u0000 (no NUL) is accepted ({st})")
    try:
        an.messages.create(model="nope", max_tokens=4, messages=ASK)
        check(False, "unknown model accepted")
    except anthropic.NotFoundError as e:
        check(e.body["error"]["type"] == "not_found_error", "404 not_found_error")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shardlm", required=True)
    ap.add_argument("--gguf", required=True)
    a = ap.parse_args()
    if not os.path.exists(a.gguf):
        print(f"SKIP: no SmolLM2 GGUF at {a.gguf} (tools/fetch_smollm2.sh)")
        return SKIP
    mid = Path(a.gguf).name
    keys = Path(tempfile.mkdtemp()) / "keys"
    keys.write_text(KEY + "\n")
    try:
        with TS.Server(a.shardlm, Path(a.gguf), "--chat-template", str(TEMPLATE), "--no-prefix-caching",
                       "--api-key-file", str(keys), name="anthropic", http=True) as srv:
            an = anthropic.Anthropic(base_url=srv.base, api_key=KEY, max_retries=0, timeout=300)
            oa = openai.OpenAI(base_url=srv.base + "/v1", api_key=KEY, max_retries=0, timeout=300)
            plain(an, oa, mid)
            tools(an, mid)
            errors(srv, mid)
    finally:
        for p in TS.SERVERS:
            if p.poll() is None:
                p.kill()
    return check.summary()


if __name__ == "__main__":
    sys.exit(main())
