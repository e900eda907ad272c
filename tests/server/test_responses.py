#!/usr/bin/env python3
"""OpenAI's Responses API (issue 32): `shardlm serve --http` with SmolLM2-135M-Instruct and the
Qwen 2.5 template (Hermes tool calls), driven by the official openai package's
client.responses, beside client.chat.completions for the same conversation.

- A plain response, greedy and seeded-sampled: the same text and token counts as
  /v1/chat/completions; instructions as chat's system message.
- Streaming (responses.stream and stream=True): the official event order, sequence numbers that
  count up, text and final object equal to the unary reply.
- previous_response_id: the chained turn equals chat over the whole conversation.
- Tools: tool_choice required gives a function_call item whose arguments validate against the
  schema, streamed as function_call_arguments deltas; the function_call_output turn (chained, and
  as explicit input items) equals chat's tool turn.
- text.format json_schema (validated with jsonschema) and json_object.
- retrieve, delete, store false, another API key's responses unseen, cancel (of a running stream, and refused once completed).
- input_items (client.responses.input_items.list, pages by after/limit/order) and input_tokens
  (client.responses.input_tokens.count, equal to the response's usage.input_tokens).
- Qwen 3's template (reasoning): reasoning.effort none equals chat's enable_thinking false.
- --responses-store 2: the least recently used response is evicted (a read counts as a use).
- The output items sent back as input equal the chained turn.
- Bad input: unknown previous_response_id (404), unknown fields and unhonoured values refused by
  name (400), a wrong API key (401).

  test_responses.py --shardlm BUILD/cli/shardlm --gguf .cache/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
SKIP (77) without the GGUF, openai or jsonschema.
"""
import argparse
import json
import os
import sys
import tempfile
import threading
import urllib.error
import urllib.request
from pathlib import Path

SKIP = 77
sys.dont_write_bytecode = True
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
try:
    import jsonschema
    import openai
except ImportError as e:
    print(f"SKIP: a test dependency cannot be imported ({e}); run tools/install_deps.sh")
    sys.exit(SKIP)
if not hasattr(openai.OpenAI(api_key="x", base_url="http://127.0.0.1:1"), "responses"):
    print(f"SKIP: openai {openai.__version__} has no client.responses; run tools/install_deps.sh")
    sys.exit(SKIP)
import test_server as TS  # noqa: E402
from checks import Checks  # noqa: E402

check = Checks()
TEMPLATE = HERE.parent / "data" / "chat_templates" / "qwen2.5-instruct.jinja"
QWEN3 = HERE.parent / "data" / "chat_templates" / "qwen3-final-assistant.jinja"
KEY = "secret-resp"
KEY2 = "secret-other"
PARAMS = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 32},
                                           "unit": {"enum": ["celsius", "fahrenheit"]}},
          "required": ["city", "unit"], "additionalProperties": False}
TOOL = {"type": "function", "name": "get_weather", "description": "The current weather in a city", "parameters": PARAMS}
CHAT_TOOL = {"type": "function", "function": {"name": "get_weather", "description": "The current weather in a city",
                                              "parameters": PARAMS}}
ASK = "Tell me about Paris in one sentence."
ASK_MSG = [{"role": "user", "content": ASK}]


def same_as_chat(r, c, label):
    check(r.output_text == (c.choices[0].message.content or ""), f"{label}: text equals chat's: {r.output_text!r}")
    check(r.usage.input_tokens == c.usage.prompt_tokens and r.usage.output_tokens == c.usage.completion_tokens,
          f"{label}: usage equals chat's ({r.usage.input_tokens}, {r.usage.output_tokens})")


def plain(oa, mid):
    r = oa.responses.create(model=mid, input=ASK, max_output_tokens=24, temperature=0)
    c = oa.chat.completions.create(model=mid, messages=ASK_MSG, max_tokens=24, temperature=0)
    check(r.object == "response" and r.id.startswith("resp_") and r.status in ("completed", "incomplete"),
          f"response envelope ({r.status})")
    check(r.output and r.output[0].type == "message" and r.output[0].role == "assistant" and
          r.output[0].content[0].type == "output_text", "one assistant message with output_text")
    same_as_chat(r, c, "greedy")
    if c.choices[0].finish_reason == "length":
        check(r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens", "max_output_tokens: incomplete")
    # Seeded sampling: the same draw as chat's with the same seed.
    rs = oa.responses.create(model=mid, input=ASK, max_output_tokens=16, temperature=0.9, top_p=0.95,
                             extra_body={"seed": 1234})
    cs = oa.chat.completions.create(model=mid, messages=ASK_MSG, max_tokens=16, temperature=0.9, top_p=0.95, seed=1234)
    same_as_chat(rs, cs, "seeded")
    check(rs.temperature == 0.9 and rs.top_p == 0.95 and rs.max_output_tokens == 16, "sampling fields repeated")
    # instructions are chat's system message; metadata comes back.
    sys_text = "You are a terse assistant."
    ri = oa.responses.create(model=mid, instructions=sys_text, input=[{"role": "user", "content": ASK}],
                             max_output_tokens=16, temperature=0, metadata={"k": "v"})
    ci = oa.chat.completions.create(model=mid, max_tokens=16, temperature=0,
                                    messages=[{"role": "system", "content": sys_text}] + ASK_MSG)
    same_as_chat(ri, ci, "instructions")
    check(ri.instructions == sys_text and ri.metadata == {"k": "v"}, "instructions and metadata repeated")
    return r


def streams(oa, mid, unary):
    kinds, seqs, text = [], [], ""
    with oa.responses.stream(model=mid, input=ASK, max_output_tokens=24, temperature=0) as s:
        for ev in s:
            kinds.append(ev.type)
            seqs.append(ev.sequence_number)
            if ev.type == "response.output_text.delta":
                text += ev.delta
        final = s.get_final_response()
    head = ["response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
            "response.output_text.delta"]
    tail = ["response.output_text.done", "response.content_part.done", "response.output_item.done"]
    end = "response.completed" if unary.status == "completed" else "response.incomplete"
    body = [k for k in kinds if k != "response.output_text.delta"]
    check(kinds[:5] == head and body[-4:] == tail + [end], f"event order {kinds[:5]} .. {kinds[-4:]}")
    check(seqs == list(range(len(seqs))), "sequence_number counts up from 0")
    check(text == unary.output_text and final.output_text == unary.output_text, "streamed text equals the unary reply")
    check(final.usage.output_tokens == unary.usage.output_tokens and final.status == unary.status,
          f"final response: {final.status}, {final.usage.output_tokens} tokens")
    # stream=True: the raw events.
    evs = list(oa.responses.create(model=mid, input=ASK, max_output_tokens=8, temperature=0, stream=True))
    check(evs[0].type == "response.created" and evs[0].response.status == "in_progress" and
          evs[-1].type in ("response.completed", "response.incomplete"), "stream=True: created .. completed")
    done = [e for e in evs if e.type == "response.output_text.done"]
    check(len(done) == 1 and done[0].text == "".join(e.delta for e in evs if e.type == "response.output_text.delta")
          and done[0].text == evs[-1].response.output_text, "output_text.done holds the deltas")


def chained(oa, mid, srv):
    first = "My name is Ada. Say hello to me."
    r1 = oa.responses.create(model=mid, input=first, max_output_tokens=12, temperature=0)
    r2 = oa.responses.create(model=mid, previous_response_id=r1.id, input="What is my name?", max_output_tokens=12,
                             temperature=0)
    c2 = oa.chat.completions.create(model=mid, max_tokens=12, temperature=0, messages=[
        {"role": "user", "content": first}, {"role": "assistant", "content": r1.output_text},
        {"role": "user", "content": "What is my name?"}])
    same_as_chat(r2, c2, "previous_response_id")
    check(r2.previous_response_id == r1.id, "previous_response_id repeated")
    got = oa.responses.retrieve(r2.id)
    check(got.output_text == r2.output_text and got.status == r2.status and got.usage.input_tokens == r2.usage.input_tokens,
          "retrieve: the stored response")
    # Another key does not see it.
    other = openai.OpenAI(base_url=srv.base + "/v1", api_key=KEY2, max_retries=0, timeout=60)
    expect(lambda: other.responses.retrieve(r2.id), openai.NotFoundError, r2.id, "another key: not found")
    expect(lambda: other.responses.create(model=mid, previous_response_id=r2.id, input="x", max_output_tokens=2),
           openai.NotFoundError, r2.id, "another key: not a previous_response_id")
    # store false: answered, not stored.
    r3 = oa.responses.create(model=mid, input=first, max_output_tokens=4, temperature=0, store=False)
    expect(lambda: oa.responses.retrieve(r3.id), openai.NotFoundError, r3.id, "store false: not retrievable")
    # delete
    d = oa.delete(f"/responses/{r1.id}", cast_to=object)
    check(d == {"id": r1.id, "object": "response.deleted", "deleted": True}, f"delete: {d}")
    expect(lambda: oa.responses.retrieve(r1.id), openai.NotFoundError, r1.id, "deleted: not found")
    expect(lambda: oa.responses.create(model=mid, previous_response_id=r1.id, input="x", max_output_tokens=2),
           openai.NotFoundError, r1.id, "deleted: not a previous_response_id")
    # cancel of a completed response is refused.
    expect(lambda: oa.responses.cancel(r2.id), openai.ConflictError, "in progress", "cancel after completion")


def tools(oa, mid):
    ask = "What is the weather in Paris?"
    # One call each (parallel_tool_calls false): the round trip below answers it; parallel calls
    # are test_tools_native's.
    one = dict(parallel_tool_calls=False)
    r = oa.responses.create(model=mid, input=ask, tools=[TOOL], tool_choice="required", max_output_tokens=64,
                            temperature=0, **one)
    calls = [o for o in r.output if o.type == "function_call"]
    ok = bool(calls) and all(c.name == "get_weather" and c.call_id for c in calls)
    try:
        for c in calls:
            jsonschema.validate(json.loads(c.arguments), PARAMS)
    except Exception as e:  # noqa: BLE001
        print(f"  {e}")
        ok = False
    check(ok and r.status == "completed", f"tool_choice required: {[(c.name, c.arguments) for c in calls]}")
    c = oa.chat.completions.create(model=mid, messages=[{"role": "user", "content": ask}], tools=[CHAT_TOOL],
                                   tool_choice="required", max_tokens=64, temperature=0, **one)
    cc = c.choices[0].message.tool_calls or []
    check([x.function.arguments for x in cc] == [x.arguments for x in calls], "the calls equal chat's")
    named = oa.responses.create(model=mid, input=ask, tools=[TOOL], tool_choice={"type": "function", "name": "get_weather"},
                                max_output_tokens=64, temperature=0, **one)
    check([o.type for o in named.output] == ["function_call"], "tool_choice by name: one call")
    # Streamed: each call's argument deltas assemble to its .done arguments and to the unary call's
    # (the model may make several calls: one output item each).
    args, added, done = {}, None, {}
    with oa.responses.stream(model=mid, input=ask, tools=[TOOL], tool_choice="required", max_output_tokens=64,
                             temperature=0, **one) as s:
        for ev in s:
            if ev.type == "response.output_item.added" and ev.item.type == "function_call":
                added = ev.item
            if ev.type == "response.function_call_arguments.delta":
                args[ev.output_index] = args.get(ev.output_index, "") + ev.delta
            if ev.type == "response.function_call_arguments.done":
                done[ev.output_index] = ev.arguments
    streamed = [args[i] for i in sorted(args)]
    check(added is not None and added.name == "get_weather" and streamed == [done[i] for i in sorted(done)] ==
          [c.arguments for c in calls], f"streamed function calls: {args!r}")
    # The round trip: the call's output, chained and as explicit items, equals chat's tool turn.
    call = calls[0]
    out = [{"type": "function_call_output", "call_id": call.call_id, "output": "18 degrees, sunny"}]
    r2 = oa.responses.create(model=mid, previous_response_id=r.id, input=out, tools=[TOOL], max_output_tokens=24,
                             temperature=0)
    items = [{"role": "user", "content": ask},
             {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments}] + out
    r3 = oa.responses.create(model=mid, input=items, tools=[TOOL], max_output_tokens=24, temperature=0)
    # The client's usual loop: the previous output items sent back as they came.
    replay = [{"role": "user", "content": ask}] + [o.model_dump(exclude_none=True) for o in r.output] + out
    r4 = oa.responses.create(model=mid, input=replay, tools=[TOOL], max_output_tokens=24, temperature=0)
    check(r4.output_text == r2.output_text and r4.usage.input_tokens == r2.usage.input_tokens,
          "output items sent back as input equal the chained turn")
    c2 = oa.chat.completions.create(model=mid, tools=[CHAT_TOOL], max_tokens=24, temperature=0, messages=[
        {"role": "user", "content": ask},
        {"role": "assistant", "content": "", "tool_calls": [{"id": call.call_id, "type": "function", "function": {
            "name": call.name, "arguments": call.arguments}}]},
        {"role": "tool", "tool_call_id": call.call_id, "content": "18 degrees, sunny"}])
    check(c2.usage.prompt_tokens > 40, f"tool turn prompt: {c2.usage.prompt_tokens} tokens")
    check(r2.usage.input_tokens == r3.usage.input_tokens == c2.usage.prompt_tokens and
          r2.output_text == r3.output_text == (c2.choices[0].message.content or ""),
          f"function_call_output turn equals chat's: {r2.output_text!r}")


def formats(oa, mid):
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                               "country": {"enum": ["France", "Italy", "Spain"]}},
              "required": ["city", "country"], "additionalProperties": False}
    r = oa.responses.create(model=mid, input="Give the largest city of France as JSON.", max_output_tokens=48,
                            temperature=0, text={"format": {"type": "json_schema", "name": "city", "schema": schema,
                                                            "strict": True}})
    try:
        jsonschema.validate(json.loads(r.output_text), schema)
        valid = True
    except Exception as e:  # noqa: BLE001
        print(f"  {e}")
        valid = False
    check(valid and r.text.format.type == "json_schema", f"json_schema: {r.output_text!r}")
    j = oa.responses.create(model=mid, input="A JSON object about Paris.", max_output_tokens=32, temperature=0,
                            text={"format": {"type": "json_object"}})
    try:
        ok = j.status == "incomplete" or isinstance(json.loads(j.output_text), dict)
    except ValueError:
        ok = False
    check(ok, f"json_object: {j.output_text!r} ({j.status})")


def cancel(oa, mid):
    started, result = threading.Event(), {}

    def run():
        kinds = []
        with oa.responses.stream(model=mid, input="Count from 1 to 500, separated by commas.", max_output_tokens=600,
                                 temperature=0) as s:
            for ev in s:
                kinds.append(ev)
                if ev.type == "response.output_text.delta" and not started.is_set():
                    result["id"] = kinds[0].response.id
                    started.set()
        result["last"] = kinds[-1]

    t = threading.Thread(target=run)
    t.start()
    started.wait(60)
    got = oa.responses.cancel(result["id"]) if "id" in result else None
    t.join(60)
    last = result.get("last")
    check(got is not None and got.status == "cancelled" and got.output, f"cancel: {got and got.status}")
    check(last is not None and last.type == "response.failed" and last.response.status == "cancelled",
          f"the cancelled stream ends with response.failed ({last and last.type})")
    check(oa.responses.retrieve(result.get("id", "x")).status == "cancelled", "retrieve: cancelled")


def expect(fn, exc, needle, label):
    try:
        fn()
        check(False, f"{label}: accepted")
    except exc as e:
        body = e.body if isinstance(e.body, dict) else {}
        msg = body.get("message") or body.get("error", {}).get("message", "") if body else str(e)
        check(needle in (msg or ""), f"{label}: {e.status_code} naming {needle!r} ({msg})")


def raw(srv, method, path, body, timeout=60):
    """(status, JSON) of a request whose body is sent as these bytes."""
    req = urllib.request.Request(srv.base + path, data=body, method=method, headers={
        "Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as f:
            return f.status, json.loads(f.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def errors(srv, oa, mid):
    bad = openai.OpenAI(base_url=srv.base + "/v1", api_key="wrong", max_retries=0, timeout=60)
    expect(lambda: bad.responses.create(model=mid, input="hi", max_output_tokens=2), openai.AuthenticationError,
           "API key", "wrong key")
    expect(lambda: bad.responses.retrieve("resp_x"), openai.AuthenticationError, "API key", "wrong key on retrieve")
    expect(lambda: oa.responses.create(model=mid, input="hi", previous_response_id="resp_nope"), openai.NotFoundError,
           "resp_nope", "unknown previous_response_id")
    expect(lambda: oa.responses.retrieve("resp_nope"), openai.NotFoundError, "resp_nope", "unknown id")
    expect(lambda: oa.responses.create(model=mid, input=[{"role": "user", "content": "x"}] * 4097, max_output_tokens=2),
           openai.BadRequestError, "at most 4096 items", "4097 input items")
    expect(lambda: oa.responses.cancel("resp_nope"), openai.NotFoundError, "resp_nope", "cancel unknown id")
    expect(lambda: oa.responses.create(model=mid, input="hi", extra_body={"frobnicate": 1}), openai.BadRequestError,
           "frobnicate", "unknown field")
    expect(lambda: oa.responses.create(model=mid, input="hi", reasoning={"effort": "high"}), openai.BadRequestError,
           "reasoning.effort", "reasoning effort")
    expect(lambda: oa.responses.create(model=mid, input="hi", background=True), openai.BadRequestError,
           "background", "background")
    expect(lambda: oa.responses.create(model=mid, input=[{"role": "user", "content": [
        {"type": "input_image", "image_url": "http://x/y.png"}]}]), openai.BadRequestError, "input_image", "image part")
    expect(lambda: oa.responses.create(model=mid, input="hi", tools=[{"type": "web_search"}]), openai.BadRequestError,
           "tools[0].type", "a hosted tool")
    expect(lambda: oa.responses.create(model=mid, input=[]), openai.BadRequestError, "input", "empty input")
    expect(lambda: oa.responses.create(model=mid, input="hi", text={"format": {"type": "json_schema", "name": "x",
                                                                               "schema": {}, "extra": 1}}),
           openai.BadRequestError, "text.format.extra", "unknown field inside text.format")
    expect(lambda: oa.responses.create(model="nope", input="hi"), openai.NotFoundError, "nope", "unknown model")
    # One reading of the body: duplicate names, trailing bytes and NUL refused.
    for body, needle, label in ((b'{"input": "hi", "input": "ho"}', "twice", "duplicate member"),
                                (b'{"input": "hi"} {}', "after its JSON value", "trailing bytes"),
                                (b'{"input": "h\\u0000i"}', "input", "NUL")):
        code, j = raw(srv, "POST", "/v1/responses", body)
        msg = j.get("error", {}).get("message", "")
        check(code == 400 and needle in msg, f"{label}: {code} ({msg})")
    code, j = raw(srv, "GET", "/v1/responses/resp_x?stream=true", None)
    check(code == 400 and "stream" in j["error"]["message"], f"query parameter refused: {code} ({j['error']['message']})")
    code, j = raw(srv, "PUT", "/v1/responses/resp_x", None)
    check(code == 405, f"PUT on a response: {code}")


def text_of(item):
    return "".join(p.text for p in item.content)


def input_items(srv, oa, mid):
    """GET /v1/responses/{id}/input_items (client.responses.input_items.list, whose pages follow
    `after`) and POST /v1/responses/input_tokens (client.responses.input_tokens.count)."""
    given = [{"role": "system", "content": "Be brief."},
             {"role": "user", "content": [{"type": "input_text", "text": "Hello."}]},
             {"type": "message", "role": "user", "content": "Tell me about Paris.", "id": "msg_client_given"}]
    r1 = oa.responses.create(model=mid, input=given, max_output_tokens=4, temperature=0)
    r2 = oa.responses.create(model=mid, previous_response_id=r1.id, input="And Rome?", max_output_tokens=4, temperature=0)
    texts = ["Be brief.", "Hello.", "Tell me about Paris."]
    page = oa.responses.input_items.list(r1.id)
    check([text_of(i) for i in page.data] == texts[::-1] and page.has_more is False,
          f"input_items: the three input items, latest first by default ({[text_of(i) for i in page.data]})")
    ids = [i.id for i in page.data]
    check(ids[0] == "msg_client_given" and len(set(ids)) == 3 and all(i.startswith("msg_") for i in ids) and
          page.first_id == ids[0] and page.last_id == ids[-1],
          f"input_items: an id each (the client's kept), first_id and last_id ({ids})")
    check(all(i.type == "message" and i.content[0].type == "input_text" for i in page.data) and
          [i.role for i in page.data] == ["user", "user", "system"], "input_items: messages with input_text parts")
    # r2 was given r1's conversation: r1's inputs, r1's output, then its own input; two per page.
    asc = list(oa.responses.input_items.list(r2.id, order="asc", limit=2))
    check([i.id for i in asc[:3]] == ids[::-1] and asc[3].id == r1.output[0].id and asc[3].role == "assistant" and
          asc[3].content[0].type == "output_text" and text_of(asc[3]) == r1.output_text and
          text_of(asc[4]) == "And Rome?" and len(asc) == 5,
          f"input_items of a chained response, in pages of 2 (after): {len(asc)} items, r1's output 4th")
    first = oa.responses.input_items.list(r2.id, order="asc", limit=2)
    check(len(first.data) == 2 and first.has_more is True and first.last_id == asc[1].id, "a page of 2: has_more")
    desc = list(oa.responses.input_items.list(r2.id, limit=2))
    check([i.id for i in desc] == [i.id for i in asc][::-1], "order desc pages in reverse")
    lst = oa.responses.input_items.list
    for kw, needle, label in [({"limit": 0}, "limit", "limit 0"), ({"limit": 101}, "limit", "limit 101"),
                              ({"order": "sideways"}, "order", "order sideways"),
                              ({"after": "msg_nope"}, "msg_nope", "after an unknown item"),
                              ({"include": ["message.input_image.image_url"]}, "include", "include")]:
        expect(lambda: lst(r1.id, **kw), openai.BadRequestError, needle, f"input_items {label}")
    # An empty query key (`?=1`) is refused by name; it once spun the front's thread forever.
    st, body = raw(srv, "GET", f"/v1/responses/{r1.id}/input_items?=1", None, timeout=20)
    msg = body.get("error", {}).get("message", "")
    check(st == 400 and "query parameter ''" in msg, f"input_items?=1: {st} ({msg})")
    expect(lambda: lst("resp_nope"), openai.NotFoundError, "resp_nope", "input_items of an unknown id")
    other = openai.OpenAI(base_url=srv.base + "/v1", api_key=KEY2, max_retries=0, timeout=60)
    expect(lambda: other.responses.input_items.list(r1.id), openai.NotFoundError, r1.id, "input_items: another key")

    # input_tokens: the prompt tokens the response would have (its usage.input_tokens).
    count = oa.responses.input_tokens.count
    n = count(model=mid, input=given)
    check(n.object == "response.input_tokens" and n.input_tokens == r1.usage.input_tokens,
          f"input_tokens = usage.input_tokens ({n.input_tokens})")
    n2 = count(model=mid, previous_response_id=r1.id, input="And Rome?")
    check(n2.input_tokens == r2.usage.input_tokens, f"input_tokens with previous_response_id ({n2.input_tokens})")
    rt = oa.responses.create(model=mid, input=ASK, instructions="Answer as a pirate.", tools=[TOOL],
                             max_output_tokens=1, temperature=0)
    nt = count(model=mid, input=ASK, instructions="Answer as a pirate.", tools=[TOOL])
    check(nt.input_tokens == rt.usage.input_tokens and nt.input_tokens > n.input_tokens,
          f"input_tokens with instructions and tools ({nt.input_tokens})")
    expect(lambda: count(model=mid, input="hi", extra_body={"temperature": 0.5}), openai.BadRequestError, "temperature",
           "input_tokens: a sampling field refused")
    expect(lambda: count(model=mid, input="hi", conversation="conv_1"), openai.BadRequestError, "conversation",
           "input_tokens: conversation refused")
    expect(lambda: count(model=mid, input="hi", previous_response_id="resp_nope"), openai.NotFoundError, "resp_nope",
           "input_tokens: unknown previous_response_id")


def reasoning(oa, mid):
    """Qwen 3's template (a <think> split): effort none is the template's enable_thinking false."""
    r = oa.responses.create(model=mid, input=ASK, max_output_tokens=12, temperature=0, reasoning={"effort": "none"})
    off = oa.chat.completions.create(model=mid, messages=ASK_MSG, max_tokens=12, temperature=0,
                                     extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    on = oa.chat.completions.create(model=mid, messages=ASK_MSG, max_tokens=12, temperature=0,
                                    extra_body={"chat_template_kwargs": {"enable_thinking": True}})
    check(on.usage.prompt_tokens != off.usage.prompt_tokens, "qwen3: enable_thinking changes the prompt")
    check(r.usage.input_tokens == off.usage.prompt_tokens and r.reasoning.effort == "none",
          f"qwen3: effort none is enable_thinking false ({r.usage.input_tokens} prompt tokens)")
    expect(lambda: oa.responses.create(model=mid, input=ASK, reasoning={"effort": "low"}), openai.BadRequestError,
           "reasoning.effort", "qwen3: graded effort refused")
    expect(lambda: oa.responses.create(model=mid, input=ASK, reasoning={"summary": "auto"}), openai.BadRequestError,
           "reasoning.summary", "qwen3: summary refused")


def lru(oa, mid):
    """--responses-store 2: the least recently used response goes first (a read counts as a use)."""
    a, b = (oa.responses.create(model=mid, input=x, max_output_tokens=1, temperature=0) for x in ("a", "b"))
    oa.responses.retrieve(a.id)
    c = oa.responses.create(model=mid, input="c", max_output_tokens=1, temperature=0)
    check(oa.responses.retrieve(a.id).id == a.id and oa.responses.retrieve(c.id).id == c.id, "LRU: a (read) and c kept")
    expect(lambda: oa.responses.retrieve(b.id), openai.NotFoundError, b.id, "LRU: b evicted")


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
    keys.write_text(KEY + "\n" + KEY2 + "\n")
    try:
        with TS.Server(a.shardlm, Path(a.gguf), "--chat-template", str(TEMPLATE), "--no-prefix-caching",
                       "--api-key-file", str(keys), "--responses-store", "64", name="responses", http=True) as srv:
            oa = openai.OpenAI(base_url=srv.base + "/v1", api_key=KEY, max_retries=0, timeout=300)
            unary = plain(oa, mid)
            streams(oa, mid, unary)
            chained(oa, mid, srv)
            tools(oa, mid)
            formats(oa, mid)
            cancel(oa, mid)
            input_items(srv, oa, mid)
            errors(srv, oa, mid)
        with TS.Server(a.shardlm, Path(a.gguf), "--chat-template", str(QWEN3), "--no-prefix-caching",
                       "--responses-store", "2", name="responses-qwen3", http=True) as srv:
            oa = openai.OpenAI(base_url=srv.base + "/v1", api_key="none", max_retries=0, timeout=300)
            reasoning(oa, mid)
            lru(oa, mid)
    finally:
        for p in TS.SERVERS:
            if p.poll() is None:
                p.kill()
    return check.summary()


if __name__ == "__main__":
    sys.exit(main())
