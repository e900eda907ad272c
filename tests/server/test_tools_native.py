#!/usr/bin/env python3
"""Tool calling in the models' own formats and reasoning (issue 28): `shardlm serve --http` with
SmolLM2-135M-Instruct (its vocabulary has ChatML's special tokens) and real chat templates of
models with tools (`--chat-template tests/data/chat_templates/X.jinja`), driven by the official
openai package.

- Qwen 2.5 (Hermes <tool_call> format): the prompt the server renders with `tools`, assistant
  `tool_calls` and `tool` messages is checked against Python jinja2 configured as transformers'
  apply_chat_template (tests/test_jinja.py's environment): a greedy chat answer equals the greedy
  /v1/completions answer to the jinja2-rendered text, token for token, with the same prompt
  length. tool_choice required / named / parallel_tool_calls false: every call validates with
  `jsonschema`; parallel calls (the default) are the template's closed calls one after another;
  streamed calls arrive in several chunks (header, then argument fragments) and
  assemble to the unary answer.
- Mistral Small 3.1 ([TOOL_CALLS]), Phi-4-mini (<|tool_call|>), Llama 3.1 (a bare JSON call,
  results in ipython turns) and Granite 3.3 (<|tool_call|> and a JSON list): a required call, and
  the tool-result loop renders (Mistral's template needs 9-character ids; Llama 3.1's prompts, with
  tools and with a call and its result, equal jinja2's; Granite's template never writes tool_calls:
  the history's call goes into the content as the model writes it, the prompt equal to jinja2's
  rendering of that; parallel calls in one list validate), Nemotron Nano v2 (<TOOLCALL>[...]</TOOLCALL>:
  required, streamed, parallel, the history with a call and its result as jinja2's) and Command R7B
  (<|START_ACTION|> and a
  list of tool_call_id / tool_name / parameters: required, named, parallel and streamed calls, the
  history with a call and its result as jinja2 renders it), functionary v3.1 (<function=NAME>{...}
  </function>: the prompts with tools and with a call and its result as jinja2's, its tools' JSON
  escaped as jinja2's Markup does; required, named, parallel and streamed calls).
- Qwen 3 (reasoning): a reply forced by a regex to hold <think>...</think> is split into
  reasoning_content and content, unary and streamed (delta.reasoning_content);
  chat_template_kwargs {"enable_thinking": false} reaches the template (the prompt as jinja2
  renders it).
- Bad requests: 400 naming the field.

  test_tools_native.py --shardlm BUILD/cli/shardlm --gguf .cache/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
SKIP (77) without the GGUF, openai, jsonschema or jinja2.
"""
import argparse
import json
import os
import sys
from datetime import datetime
from pathlib import Path

SKIP = 77
sys.dont_write_bytecode = True
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
try:
    import jsonschema
    import openai
    import test_jinja  # noqa: E402  (jinja2 as transformers configures it; exits 77 without jinja2)
except ImportError as e:
    print(f"SKIP: a test dependency cannot be imported ({e}); run tools/install_deps.sh")
    sys.exit(SKIP)
import test_server as TS  # noqa: E402
import tools_grpc as TG  # noqa: E402
from checks import Checks  # noqa: E402

check = Checks()
TEMPLATES = HERE.parent / "data" / "chat_templates"

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 32},
                                                    "unit": {"enum": ["celsius", "fahrenheit"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "The local time in a time zone",
    "parameters": {"type": "object", "properties": {"zone": {"type": "string", "maxLength": 32}},
                   "required": ["zone"], "additionalProperties": False}}}
TOOLS = [WEATHER, TIME]
PARAMS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def calls_valid(calls, names=None):
    if not calls:
        return False
    for c in calls:
        if c.type != "function" or c.function.name not in (names or PARAMS) or not c.id:
            return False
        try:
            jsonschema.validate(json.loads(c.function.arguments), PARAMS[c.function.name])
        except Exception as e:  # noqa: BLE001
            print(f"  {c.function.name}({c.function.arguments}): {e}")
            return False
    return True


def py_prompt(template_file, messages, tools=None, **kwargs):
    """The prompt transformers' apply_chat_template renders (tool-call arguments as objects)."""
    env = test_jinja.make_env()
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    t = env.from_string(template_file.read_text())
    msgs = []
    for m in messages:
        m = json.loads(json.dumps(m))
        for c in m.get("tool_calls") or []:
            if isinstance(c["function"].get("arguments"), str):
                c["function"]["arguments"] = json.loads(c["function"]["arguments"])
        msgs.append(m)
    return t.render(messages=msgs, tools=tools, documents=None, add_generation_prompt=True,
                    bos_token="<|im_start|>", eos_token="<|im_end|>", **kwargs)


def stream_calls(stream):
    """(calls as [(name, arguments)], finish, chunks carrying tool_calls, reasoning, content)."""
    got, finish, n_chunks, reasoning, content = {}, None, 0, "", ""
    for ch in stream:
        for c in ch.choices:
            finish = c.finish_reason or finish
            reasoning += getattr(c.delta, "reasoning_content", None) or (c.delta.model_extra or {}).get(
                "reasoning_content") or ""
            content += c.delta.content or ""
            if c.delta.tool_calls:
                n_chunks += 1
            for tc in c.delta.tool_calls or []:
                e = got.setdefault(tc.index, {"name": "", "arguments": ""})
                e["name"] += (tc.function.name or "") if tc.function else ""
                e["arguments"] += (tc.function.arguments or "") if tc.function else ""
    return [(e["name"], e["arguments"]) for _, e in sorted(got.items())], finish, n_chunks, reasoning, content


def expect_400(fn, word):
    try:
        fn()
        check(False, f"refused naming {word!r}")
    except openai.BadRequestError as e:
        check(word in str(e), f"400 naming {word!r}: {str(e)[:140]}")


def qwen25(a, mid, oa, tmpl):
    def ask(messages, **kw):
        kw.setdefault("max_tokens", 60)
        kw.setdefault("temperature", 0)
        return oa.chat.completions.create(model=mid, messages=messages, tools=TOOLS, **kw)

    # The rendered prompt equals jinja2's: greedy chat == greedy completion of jinja2's text.
    call = {"id": "call_abc123def", "type": "function",
            "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris", "unit": "celsius"})}}
    history = ASK + [{"role": "assistant", "tool_calls": [call]},
                     {"role": "tool", "tool_call_id": call["id"], "content": "{\"temperature\": 21}"}]
    for name, msgs in (("first turn", ASK), ("after a tool result", history)):
        chat = ask(msgs, tool_choice="auto", max_tokens=24)
        comp = oa.completions.create(model=mid, prompt=py_prompt(tmpl, msgs, TOOLS), max_tokens=24, temperature=0)
        m = chat.choices[0].message
        as_text = m.content or ""
        if m.tool_calls:  # the completion's raw text holds the call; compare the parts
            as_text = None
        check(chat.usage.prompt_tokens == comp.usage.prompt_tokens
              and (as_text is None or comp.choices[0].text.strip() == as_text),
              f"{name}: the prompt with tools renders as jinja2 does ({chat.usage.prompt_tokens} vs "
              f"{comp.usage.prompt_tokens} tokens; {as_text!r:.60} vs {comp.choices[0].text!r:.60})")
    r = ask(ASK, tool_choice="required", parallel_tool_calls=False)
    m = r.choices[0].message
    check(r.choices[0].finish_reason == "tool_calls" and m.content is None and calls_valid(m.tool_calls),
          f"hermes: required -> {[(c.function.name, c.function.arguments) for c in m.tool_calls or []]}")
    # Parallel calls (the default): after a call's JSON the grammar takes the template's
    # "\n</tool_call>\n<tool_call>\n" and another call, or the end. SmolLM2 greedy goes on calling
    # until max_tokens: every call but one cut by it validates, and the raw reply is the template's.
    r = ask(ASK, tool_choice="required", max_tokens=100, logprobs=True)
    m, fin = r.choices[0].message, r.choices[0].finish_reason
    whole = (m.tool_calls or []) if fin == "tool_calls" else (m.tool_calls or [])[:-1]
    raw = "".join(t.token for t in r.choices[0].logprobs.content)
    check(len(m.tool_calls or []) >= 2 and calls_valid(whole) and fin in ("tool_calls", "length")
          and "}\n</tool_call>\n<tool_call>\n{" in raw,
          f"hermes: parallel calls -> {fin} {[(c.function.name, c.function.arguments) for c in m.tool_calls or []]}")
    r = ask(ASK, tool_choice={"type": "function", "function": {"name": "get_time"}}, temperature=1.0, seed=4, n=2,
            parallel_tool_calls=False)
    check(all(c.finish_reason == "tool_calls" and calls_valid(c.message.tool_calls, ["get_time"]) for c in r.choices),
          "hermes: named get_time, n=2 sampled")
    r = ask(ASK, tool_choice="required", parallel_tool_calls=False)
    check(len(r.choices[0].message.tool_calls or []) == 1, "hermes: parallel_tool_calls false -> one call")
    u = ask(ASK, tool_choice="required", max_tokens=100).choices[0]
    calls, finish, n_chunks, _, _ = stream_calls(ask(ASK, tool_choice="required", max_tokens=100, stream=True))
    check(finish == u.finish_reason and calls == [(c.function.name, c.function.arguments) for c in u.message.tool_calls or []]
          and len(calls) >= 2 and n_chunks >= 2,
          f"hermes: {len(calls)} streamed calls equal unary ({finish}), in {n_chunks} chunks")
    r = ask(history, tool_choice="auto")
    m = r.choices[0].message
    check((m.tool_calls and calls_valid(m.tool_calls)) or isinstance(m.content, str),
          f"hermes: the tool loop's answer (auto) -> {m.content!r:.80}")
    # Bad requests.
    expect_400(lambda: ask(ASK, extra_body={"chat_template_kwargs": [1]}), "chat_template_kwargs")
    expect_400(lambda: ask(ASK, extra_body={"chat_template_kwargs": {"tools": []}}), "chat_template_kwargs.tools")
    expect_400(lambda: ask(ASK, reasoning_effort="low"), "reasoning_effort")
    expect_400(lambda: ask(ASK + [{"role": "assistant", "tool_calls": [{"id": "x", "type": "function",
                                                                        "function": {"name": "f", "arguments": "{"}}]}]),
               "tool_calls[0]")


def grpc_hermes(srv, mid, oa):
    """The gRPC Chat RPCs with tools (hermes): each answer equals the HTTP answer to the same
    conversation and seed; a streamed call assembles to the unary one; bad fields are refused."""
    call = {"id": "call_abc123def", "type": "function",
            "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris", "unit": "celsius"})}}
    history = ASK + [{"role": "assistant", "content": None, "tool_calls": [call]},
                     {"role": "tool", "tool_call_id": call["id"], "content": "{\"temperature\": 21}"}]
    named = {"type": "function", "function": {"name": "get_time"}}
    cases = [("required", ASK, dict(tool_choice="required", parallel_tool_calls=False)),
             ("required, parallel", ASK, dict(tool_choice="required")),
             ("auto after a tool result", history, dict(tool_choice="auto")),
             ("auto", ASK, dict(tool_choice="auto")),
             ("named, sampled", ASK, dict(tool_choice=named, temperature=1.0, seed=4)),
             ("parallel_tool_calls false", ASK, dict(tool_choice="required", parallel_tool_calls=False))]
    with srv.client() as c:
        for name, msgs, kw in cases:
            kw = dict(dict(max_tokens=60, temperature=0), **kw)
            h = oa.chat.completions.create(model=mid, messages=msgs, tools=TOOLS, **kw)
            g = c.chat(msgs, tools=TOOLS, **kw)
            want = TG.http_parts(h.choices[0].message, h.choices[0].finish_reason)
            check(TG.grpc_parts(g) == want, f"gRPC hermes {name}: equals HTTP {want} (gRPC {TG.grpc_parts(g)})")
            if name == "required":
                check(want[2] and calls_valid(h.choices[0].message.tool_calls) and g.text.startswith("{")
                      and all(t.id.startswith("call_") for t in g.tool_calls), f"gRPC hermes required: a valid call")
                got, n = TG.grpc_stream_parts(c.chat_stream(msgs, tools=TOOLS, **kw))
                check(got == TG.grpc_parts(g) and n >= 2, f"gRPC hermes: streamed call equals unary, in {n} chunks")
        TG.expect_grpc_invalid(check, lambda: c.chat(ASK, tools=TOOLS, tool_choice="sometimes", max_tokens=4),
                               "tool_choice")
        TG.expect_grpc_invalid(check, lambda: c.chat(ASK, tools=TOOLS, chat_template_kwargs="[1]", max_tokens=4),
                               "chat_template_kwargs")
        TG.expect_grpc_invalid(check, lambda: c.chat(ASK, chat_template_kwargs={"tools": []}, max_tokens=4),
                               "chat_template_kwargs.tools")
        TG.expect_grpc_invalid(check, lambda: c.chat(ASK, tools=TOOLS, tool_choice=named | {"function": {"name": "nope"}},
                                                     max_tokens=4), "nope")
        TG.expect_grpc_invalid(check, lambda: c.chat(ASK + [{"role": "tool", "content": "x"}], max_tokens=4),
                               "tool_call_id")
        TG.expect_grpc_invalid(check, lambda: c.chat(ASK, tools=[dict(WEATHER, function=dict(
            WEATHER["function"], parameters="{not json"))], max_tokens=4), "parameters")
        TG.expect_grpc_invalid(check, lambda: c.chat(ASK, tools=TOOLS, json_object=True, max_tokens=4), "tools")


def other_format(mid, oa, label, tmpl):
    def ask(messages, **kw):
        kw = dict(dict(max_tokens=60, temperature=0), **kw)
        return oa.chat.completions.create(model=mid, messages=messages, tools=TOOLS, **kw)

    def same_prompt(reply, messages, what):  # the server's prompt has jinja2's length
        comp = oa.completions.create(model=mid, prompt=py_prompt(tmpl, messages, TOOLS), max_tokens=1, temperature=0)
        check(reply.usage.prompt_tokens == comp.usage.prompt_tokens,
              f"{what} renders as jinja2's ({reply.usage.prompt_tokens} vs {comp.usage.prompt_tokens})")

    def parallel_list(max_tokens):  # parallel calls in one list, n 3 sampled: each list validates
        rp = ask(ASK, tool_choice="required", n=3, temperature=1.0, seed=3, max_tokens=max_tokens)
        check(all(c.finish_reason in ("tool_calls", "length") for c in rp.choices) and
              all(calls_valid(c.message.tool_calls) for c in rp.choices if c.finish_reason == "tool_calls"),
              f"{label}: parallel calls (a list), n 3: {[len(c.message.tool_calls or []) for c in rp.choices]}")

    if label == "llama3":  # the prompt with tools renders as jinja2's (Llama 3.1: tools in the first user turn)
        same_prompt(ask(ASK, tool_choice="auto", max_tokens=1), ASK, "llama3: the prompt with tools")

    r = ask(ASK, tool_choice="required", parallel_tool_calls=False)
    m = r.choices[0].message
    check(r.choices[0].finish_reason == "tool_calls" and calls_valid(m.tool_calls),
          f"{label}: required -> {[(c.function.name, c.function.arguments) for c in m.tool_calls or []]}")
    if m.tool_calls:
        check(label != "mistral" or all(len(c.id) == 9 and c.id.isalnum() for c in m.tool_calls),
              f"{label}: call ids {[c.id for c in m.tool_calls]}")
        history = ASK + [m.model_dump(exclude_none=True)] + [
            {"role": "tool", "tool_call_id": c.id, "content": "{\"temperature\": 21}"} for c in m.tool_calls]
        r = ask(history, tool_choice="auto")
        check(r.choices[0].finish_reason in ("stop", "length", "tool_calls"), f"{label}: the tool loop renders and answers")
        if label == "granite":  # its template never writes tool_calls: the server writes them into the
            # assistant's content as the template's system text asks the model to (<|tool_call|> and a
            # JSON list), in the engine's compact JSON
            as_text = [dict({k: v for k, v in x.items() if k != "tool_calls"}, content=(x.get("content") or "")
                            + "<|tool_call|>" + json.dumps([{"name": c["function"]["name"],
                                                              "arguments": json.loads(c["function"]["arguments"])}
                                                             for c in x["tool_calls"]], separators=(",", ":")))
                       if x.get("tool_calls") else x for x in history]
            same_prompt(r, as_text, "granite: the history with a call (into the content) and its result")
            parallel_list(120)
        if label == "command-r7b":  # the call (its <|START_ACTION|> list) and its result render as jinja2's
            same_prompt(r, history, "command-r7b: the history with a call and its result")
            parallel_list(160)
            # One call (greedy may otherwise repeat it until max_tokens, and where the CPU's rounding
            # makes its zone long, 60 tokens cut the first: an AVX2-only AMD Zen 3), room for its 32
            # characters: whole, named, and the reply ends after it.
            named = ask(ASK, tool_choice={"type": "function", "function": {"name": "get_time"}}, parallel_tool_calls=False,
                        max_tokens=120)
            nc = named.choices[0].message.tool_calls or []
            check(named.choices[0].finish_reason == "tool_calls" and len(nc) == 1 and calls_valid(nc) and
                  nc[0].function.name == "get_time", f"command-r7b: a named call -> {nc}")
            got, finish, _, _, _ = stream_calls(oa.chat.completions.create(
                model=mid, messages=ASK, tools=TOOLS, tool_choice="required", parallel_tool_calls=False, max_tokens=60,
                temperature=0, stream=True))
            want = [(c.function.name, c.function.arguments) for c in m.tool_calls]
            check(got == want and finish == "tool_calls", f"command-r7b: the streamed call equals the unary one "
                  f"({got} vs {want})")
        if label == "llama3":  # the call and its result (an ipython turn) render as jinja2's
            same_prompt(r, history, "llama3: the history with a call and its result")
        if label == "functionary":  # <function=NAME>{...}</function>: the history, named, parallel, streamed
            same_prompt(ask(ASK, tool_choice="auto", max_tokens=1), ASK, "functionary: the prompt with tools")
            same_prompt(r, history, "functionary: the history with a call and its result")
            # One call (greedy may otherwise repeat it until max_tokens, and where the CPU's rounding
            # makes its zone long, 60 tokens cut the first: an AVX2-only AMD Zen 3), room for its 32
            # characters: whole, named, and the reply ends after it.
            named = ask(ASK, tool_choice={"type": "function", "function": {"name": "get_time"}}, parallel_tool_calls=False,
                        max_tokens=120)
            nc = named.choices[0].message.tool_calls or []
            check(named.choices[0].finish_reason == "tool_calls" and len(nc) == 1 and calls_valid(nc) and
                  nc[0].function.name == "get_time", f"functionary: a named call -> {nc}")
            rp = ask(ASK, tool_choice="required", n=3, temperature=1.0, seed=3, max_tokens=120)
            check(all(c.finish_reason in ("tool_calls", "length") and c.message.tool_calls and
                      calls_valid(c.message.tool_calls) for c in rp.choices),
                  f"functionary: parallel calls, n 3: {[len(c.message.tool_calls or []) for c in rp.choices]}")
            got, finish, _, _, _ = stream_calls(oa.chat.completions.create(
                model=mid, messages=ASK, tools=TOOLS, tool_choice="required", parallel_tool_calls=False, max_tokens=60,
                temperature=0, stream=True))
            want = [(c.function.name, c.function.arguments) for c in m.tool_calls]
            check(got == want and finish == "tool_calls", f"functionary: the streamed call equals the unary one "
                  f"({got} vs {want})")


def qwen3(mid, oa, tmpl):
    rx = "<think>[a-z ]{4,30}</think>[A-Za-z ]{4,30}"
    kw = dict(model=mid, messages=ASK, max_tokens=40, temperature=0, extra_body={"structured_outputs": {"regex": rx}})
    r = oa.chat.completions.create(**kw)
    m = r.choices[0].message
    reasoning = (m.model_extra or {}).get("reasoning_content")
    check(isinstance(reasoning, str) and reasoning and m.content and "<think>" not in m.content
          and "</think>" not in (m.content or ""), f"qwen3: reasoning {reasoning!r} / content {m.content!r}")
    _, finish, _, s_reasoning, s_content = stream_calls(oa.chat.completions.create(stream=True, **kw))
    check(s_reasoning == reasoning and s_content == m.content,
          f"qwen3: streamed reasoning_content / content equal unary ({s_reasoning!r}, {s_content!r})")
    # enable_thinking reaches the template: the prompt jinja2 renders with it.
    for think in (True, False):
        chat = oa.chat.completions.create(model=mid, messages=ASK, max_tokens=16, temperature=0,
                                          extra_body={"chat_template_kwargs": {"enable_thinking": think}})
        comp = oa.completions.create(model=mid, prompt=py_prompt(tmpl, ASK, enable_thinking=think), max_tokens=16,
                                     temperature=0)
        check(chat.usage.prompt_tokens == comp.usage.prompt_tokens and chat.choices[0].message.content.strip()
              == comp.choices[0].text.strip(), f"qwen3: enable_thinking {think}: {chat.usage.prompt_tokens} prompt tokens, jinja2's "
              f"{comp.usage.prompt_tokens}")


def qwen3_required(mid, oa, tmpl):
    """tool_choice required under a reasoning template: the model may think first (the marker is
    the grammar's to write, not the prompt's, docs/tools.md). The prompt is jinja2's with the tools
    and nothing after it; every reply that ends with a call has valid calls, reasoning or not; one
    without a call was cut by max_tokens inside its reasoning. With enable_thinking false (the
    template closes an empty <think> block itself) the call comes at once. (One call each:
    parallel_tool_calls false; parallel calls are qwen25's.)"""
    comp = oa.completions.create(model=mid, prompt=py_prompt(tmpl, ASK, tools=TOOLS), max_tokens=1, temperature=0)
    r = oa.chat.completions.create(model=mid, messages=ASK, tools=TOOLS, tool_choice="required", max_tokens=150,
                                   temperature=1.0, seed=3, n=8, parallel_tool_calls=False)
    check(r.usage.prompt_tokens == comp.usage.prompt_tokens,
          f"qwen3 required: the prompt is jinja2's with nothing added ({r.usage.prompt_tokens} vs {comp.usage.prompt_tokens})")
    called = thought = 0
    for ch in r.choices:
        m = ch.message
        reasoning = (m.model_extra or {}).get("reasoning_content")
        if ch.finish_reason == "tool_calls":
            called += 1
            thought += bool(reasoning)
            check(calls_valid(m.tool_calls) and not m.content, f"qwen3 required: sample {ch.index} calls validly "
                  f"(reasoning {reasoning!r})")
        else:
            check(ch.finish_reason == "length" and reasoning and not m.tool_calls and not m.content,
                  f"qwen3 required: sample {ch.index} without a call was cut inside its reasoning "
                  f"({ch.finish_reason}, {reasoning!r}, {m.content!r})")
    print(f"  qwen3 required, 8 samples: {called} called ({thought} after reasoning)")
    check(called >= 1, "qwen3 required: some sample calls")
    r = oa.chat.completions.create(model=mid, messages=ASK, tools=TOOLS, tool_choice="required", max_tokens=150,
                                   temperature=0, parallel_tool_calls=False,
                                   extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    m = r.choices[0].message
    check(r.choices[0].finish_reason == "tool_calls" and calls_valid(m.tool_calls)
          and not (m.model_extra or {}).get("reasoning_content"),
          f"qwen3 required, enable_thinking false: a call at once ({r.choices[0].finish_reason}, {m.tool_calls})")


def nemotron(mid, oa, tmpl):
    """Nemotron Nano v2 (<TOOLCALL>[...]</TOOLCALL>, Mistral's list between its markers): its
    template reads /no_think from the system message (the prompt then closes an empty <think>). A
    required call validates, the streamed call equals it, parallel calls (n 3 sampled) validate,
    and the history with the call and its result renders as jinja2's."""
    msgs = [{"role": "system", "content": "/no_think"}] + ASK
    kw = dict(model=mid, messages=msgs, tools=TOOLS, max_tokens=80, temperature=0)
    r = oa.chat.completions.create(tool_choice="required", parallel_tool_calls=False, **kw)
    m = r.choices[0].message
    check(r.choices[0].finish_reason == "tool_calls" and calls_valid(m.tool_calls),
          f"nemotron: required -> {[(c.function.name, c.function.arguments) for c in m.tool_calls or []]}")
    got, finish, _, _, _ = stream_calls(oa.chat.completions.create(stream=True, tool_choice="required",
                                                                   parallel_tool_calls=False, **kw))
    want = [(c.function.name, c.function.arguments) for c in m.tool_calls or []]
    check(want and got == want and finish == "tool_calls", f"nemotron: the streamed call equals the unary one ({got})")
    rp = oa.chat.completions.create(**dict(kw, tool_choice="required", n=3, temperature=1.0, seed=3, max_tokens=160))
    check(all(c.finish_reason in ("tool_calls", "length") for c in rp.choices) and
          all(calls_valid(c.message.tool_calls) for c in rp.choices if c.finish_reason == "tool_calls"),
          f"nemotron: parallel calls (a list), n 3: {[len(c.message.tool_calls or []) for c in rp.choices]}")
    if m.tool_calls:
        history = msgs + [m.model_dump(exclude_none=True)] + [
            {"role": "tool", "tool_call_id": c.id, "content": "{\"temperature\": 21}"} for c in m.tool_calls]
        r = oa.chat.completions.create(**dict(kw, messages=history, max_tokens=1))
        comp = oa.completions.create(model=mid, prompt=py_prompt(tmpl, history, TOOLS), max_tokens=1, temperature=0)
        check(r.usage.prompt_tokens == comp.usage.prompt_tokens, f"nemotron: the history with a call and its result "
              f"renders as jinja2's ({r.usage.prompt_tokens} vs {comp.usage.prompt_tokens})")


def grpc_qwen3(srv, mid, oa):
    """Reasoning over gRPC: the regex-forced <think> reply splits as HTTP's does, unary and
    streamed; chat_template_kwargs reaches the template (the same prompt length as HTTP's)."""
    rx = "<think>[a-z ]{4,30}</think>[A-Za-z ]{4,30}"
    h = oa.chat.completions.create(model=mid, messages=ASK, max_tokens=40, temperature=0,
                                   extra_body={"structured_outputs": {"regex": rx}})
    want = TG.http_parts(h.choices[0].message, h.choices[0].finish_reason)
    with srv.client() as c:
        g = c.chat(ASK, max_tokens=40, temperature=0, regex=rx)
        check(TG.grpc_parts(g) == want and want[1], f"gRPC qwen3: reasoning equals HTTP's {want}")
        got, _ = TG.grpc_stream_parts(c.chat_stream(ASK, max_tokens=40, temperature=0, regex=rx))
        check(got == want, f"gRPC qwen3: streamed reasoning and content equal HTTP's ({got})")
        for think in (True, False):
            kw = {"chat_template_kwargs": {"enable_thinking": think}}
            h = oa.chat.completions.create(model=mid, messages=ASK, max_tokens=8, temperature=0, extra_body=kw)
            g = c.chat(ASK, max_tokens=8, temperature=0, **kw)
            check(g.prompt_tokens == h.usage.prompt_tokens
                  and TG.grpc_parts(g) == TG.http_parts(h.choices[0].message, h.choices[0].finish_reason),
                  f"gRPC qwen3: enable_thinking {think}: {g.prompt_tokens} prompt tokens, HTTP {h.usage.prompt_tokens}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shardlm", required=True)
    ap.add_argument("--gguf", required=True)
    a = ap.parse_args()
    if not os.path.exists(a.gguf):
        print(f"SKIP: no SmolLM2 GGUF at {a.gguf} (tools/fetch_smollm2.sh)")
        return SKIP
    mid = Path(a.gguf).name
    runs = [("qwen2.5-instruct.jinja", "hermes"),
            ("mistralai-Mistral-Small-3.1-24B-Instruct-2503.jinja", "mistral"),
            ("microsoft-Phi-4-mini-instruct.jinja", "phi4"),
            ("meta-llama-Llama-3.1-8B-Instruct.jinja", "llama3"),
            ("ibm-granite-granite-3.3-2B-Instruct.jinja", "granite"),
            ("CohereForAI-c4ai-command-r7b-12-2024-tool_use.jinja", "command-r7b"),
            ("NVIDIA-Nemotron-Nano-v2.jinja", "nemotron"),
            ("meetkai-functionary-medium-v3.1.jinja", "functionary"),
            ("qwen3-final-assistant.jinja", "qwen3")]
    try:
        for file, label in runs:
            tmpl = TEMPLATES / file
            # No prefix caching: a greedy answer to a prompt is then computed the same way each time
            # (a prompt whose prefix came from the cache may flip a near tie).
            with TS.Server(a.shardlm, Path(a.gguf), "--chat-template", str(tmpl), "--no-prefix-caching",
                           name=f"tools-{label}", http=True) as srv:
                log = srv.log_path.read_text()
                fmt = "hermes" if label == "qwen3" else label
                check(f"tool calls in the {fmt} format" in log, f"{file}: detected as {fmt}")
                oa = openai.OpenAI(base_url=srv.base + "/v1", api_key="none", max_retries=0, timeout=300)
                if label == "hermes":
                    qwen25(a, mid, oa, tmpl)
                    grpc_hermes(srv, mid, oa)
                elif label == "nemotron":
                    check("reasoning split from <think>" in log, "nemotron: reasoning detected")
                    nemotron(mid, oa, tmpl)
                elif label == "qwen3":
                    check("reasoning split from <think>" in log, "qwen3: reasoning detected")
                    qwen3(mid, oa, tmpl)
                    qwen3_required(mid, oa, tmpl)
                    grpc_qwen3(srv, mid, oa)
                else:
                    other_format(mid, oa, label, tmpl)
    finally:
        for p in TS.SERVERS:
            if p.poll() is None:
                p.kill()
    return check.summary()


if __name__ == "__main__":
    sys.exit(main())
