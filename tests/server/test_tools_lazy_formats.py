"""Lazy tool-call grammars beyond the hermes marker (docs/tools.md, issue 28), on
SmolLM2-135M-Instruct with test templates (written here, not models' published files) and a
history the model imitates. Each part compares a free run (/v1/completions of the prompt Python
jinja2 renders, n samples, a seed) with the chat request (same seed and n), whose samples are
sampled exactly as the free ones until their trigger:

- llama3: a Llama 3.1-style template (tools, `ipython`, a call as the bare reply
  `{"name": ..., "parameters": ...}`). The free samples whose reply opens with `{` write calls
  json + jsonschema refuse; the chat's samples for them are calls that validate, the others the
  free text byte for byte (the trigger is anchored at the reply's start: a `{` later in the text
  triggers nothing). Served with --batch-invariant: a sample that ends early with its call
  changes the batch the others decode in, which must not change their text.
- reasoning: a hermes template that reasons (`<think>...</think>`, then `<tool_call>`), its
  generation prompt opening `<think>` (kwarg think=true) or not (the model opens it itself). The
  history's reasoning mentions `<tool_call>`; free samples that write the marker inside their
  reasoning keep that reasoning byte for byte in reasoning_content (no grammar there), and a
  marker after `</think>` gives a call that validates. response_format json_schema on the same
  template with an opened `<think>`: the reasoning is the free text up to `</think>`, byte for
  byte, and the content after it is JSON that validates.
- opening: response_format json_schema on the reasoning template with a generation prompt that
  does not open `<think>` (the model may open it itself): the first tokens are the schema's or
  `<think>`; samples that reason give reasoning_content and content after `</think>` that
  validates, the others content that validates from the first token. Greedy, the reasoning is
  the free greedy run's text after jinja2's prompt + `<think>`, byte for byte; streamed deltas
  assemble to the unary reply.
- markers: a Magistral-style template (`[THINK]` ... `[/THINK]`), replies forced by a regex
  (with `[THINK]` written by the model, or opened by the generation prompt): reasoning_content
  and content are the two parts of the reply's text (its tokens decoded by `tokenizers`' ByteLevel
  decoder), streamed deltas assemble to them; the chat prompt (reasoning_content in its history)
  has jinja2's token count. response_format json_schema with the model opening `[THINK]` itself:
  greedy, the reasoning is the free greedy run's after jinja2's prompt + `[THINK]`, then JSON
  that validates; sampled, every finished sample's content validates.
- special token: a copy of the GGUF whose unused token holds `<tool_call>` as one added token
  (the marker is then one vocabulary token, taken whole); logit_bias +100 on it makes every free
  sample write it at once and forever; under the lazy grammar the token triggers and the call
  that follows validates.
SKIP (77) without the GGUF, openai, jsonschema, jinja2, tokenizers or gguf.
"""
import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

SKIP = 77
sys.dont_write_bytecode = True
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
try:
    import jsonschema
    import numpy as np
    import openai
    import gguf
    import test_jinja  # noqa: F401,E402  (exits 77 without jinja2)
except ImportError as e:
    print(f"SKIP: a test dependency cannot be imported ({e}); run tools/install_deps.sh")
    sys.exit(SKIP)
import test_server as TS  # noqa: E402
from checks import Checks  # noqa: E402
from test_tools_native import ASK, PARAMS, TOOLS, py_prompt  # noqa: E402
from test_tools_lazy import banned_ids  # noqa: E402

check = Checks()
MAX_TOKENS = 64
CALL = {"id": "call_abc123def", "type": "function",
        "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris", "unit": "celsius"})}}
HISTORY = ASK + [{"role": "assistant", "tool_calls": [CALL]},
                 {"role": "tool", "tool_call_id": CALL["id"], "content": "{\"temperature\": 21}"},
                 {"role": "assistant", "content": "It is 21 degrees in Paris."},
                 {"role": "user", "content": "What is the weather in London?"}]

# A Llama 3.1-style template: tools in the system turn, a call written as the bare reply.
LLAMA3 = r"""{{- bos_token -}}
<|start_header_id|>system<|end_header_id|>

{% if tools is not none %}Environment: ipython
You have access to the following functions. To call one, respond with JSON in the format {"name": function name, "parameters": dictionary of argument name and its value}.

{% for t in tools %}{{ t | tojson }}

{% endfor %}{% endif %}<|eot_id|>
{%- for m in messages -%}
{%- if m.role == 'assistant' and m.tool_calls -%}
<|start_header_id|>assistant<|end_header_id|>

{"name": "{{ m.tool_calls[0].function.name }}", "parameters": {{ m.tool_calls[0].function.arguments | tojson }}}<|eot_id|>
{%- elif m.role == 'tool' -%}
<|start_header_id|>ipython<|end_header_id|>

{{ m.content }}<|eot_id|>
{%- else -%}
<|start_header_id|>{{ m.role }}<|end_header_id|>

{{ m.content | trim }}<|eot_id|>
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
<|start_header_id|>assistant<|end_header_id|>

{% endif -%}"""

# A ChatML template with tools (<tool_call>) that reasons: an assistant turn is
# <think>reasoning</think> then the reply; the generation prompt opens <think> when think is true.
THINK = r"""{%- if tools %}<|im_start|>system
You may call these tools:
{% for t in tools %}{{ t | tojson }}
{% endfor %}To call one write <tool_call>
{"name": <function-name>, "arguments": <args-json-object>}
</tool_call><|im_end|>
{% endif -%}
{%- for m in messages -%}
{%- if m.role == 'assistant' -%}
<|im_start|>assistant
<think>
{{ m.reasoning_content }}
</think>
{% if m.tool_calls %}<tool_call>
{"name": "{{ m.tool_calls[0].function.name }}", "arguments": {{ m.tool_calls[0].function.arguments | tojson }}}
</tool_call>{% else %}{{ m.content }}{% endif %}<|im_end|>
{% elif m.role == 'tool' -%}
<|im_start|>user
<tool_response>
{{ m.content }}
</tool_response><|im_end|>
{% else -%}
<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endif -%}
{%- endfor -%}
{%- if add_generation_prompt %}<|im_start|>assistant
{% if think %}<think>
{% endif %}{% endif -%}"""

MARK = "<tool_call>"
REASONED = [dict(HISTORY[1], reasoning_content="I call the tool: <tool_call> get_weather for Paris."),
            HISTORY[2], HISTORY[4]]
THINK_CHAT = ASK + REASONED
ANSWER = {"type": "object", "properties": {"city": {"type": "string"}, "degrees": {"type": "integer"}},
          "required": ["city", "degrees"], "additionalProperties": False}


def valid(obj, schema):
    try:
        jsonschema.validate(obj, schema)
        return True
    except Exception:  # noqa: BLE001
        return False


def one_valid_call(c):
    """Whether a chat choice is one call of a declared tool with valid arguments ("tool_calls")."""
    calls = c.message.tool_calls or []
    if c.finish_reason != "tool_calls" or len(calls) != 1 or calls[0].function.name not in PARAMS:
        return False
    try:
        return valid(json.loads(calls[0].function.arguments), PARAMS[calls[0].function.name])
    except ValueError:
        return False


def reasoning_of(m):
    return getattr(m, "reasoning_content", None) or (m.model_extra or {}).get("reasoning_content") or ""


def part_llama3(shardlm, gguf_path, tmp):
    tpl = tmp / "llama3-tools.jinja"
    tpl.write_text(LLAMA3)
    prompt = py_prompt(tpl, HISTORY, TOOLS)
    n, seed = 8, 3
    with TS.Server(shardlm, gguf_path, "--chat-template", str(tpl), "--no-prefix-caching", "--batch-invariant",
                   name="lazy-llama3",
                   http=True) as srv:
        oa = openai.OpenAI(base_url=srv.base + "/v1", api_key="none", max_retries=0, timeout=600)
        sample = dict(model=gguf_path.name, n=n, seed=seed, temperature=1.0, max_tokens=MAX_TOKENS)
        texts = [c.text for c in oa.completions.create(prompt=prompt, **sample).choices]
        r = oa.chat.completions.create(messages=HISTORY, tools=TOOLS, tool_choice="auto", **sample)
    opens = [i for i, t in enumerate(texts) if t.lstrip().startswith("{")]
    bad = []
    for i in opens:
        try:
            c = json.loads(texts[i])
            if not valid(c["parameters"], PARAMS[c["name"]]):
                bad.append(i)
        except Exception:  # noqa: BLE001
            bad.append(i)
    print(f"llama3: {len(opens)} of {n} free replies open with '{{', {len(bad)} of them not a valid call")
    check(len(bad) >= 1, f"llama3: the free run writes an invalid call {bad} ({[texts[i][:60] for i in opens]})")
    check(len(opens) < n, "llama3: some free reply is text (the trigger is anchored, not anywhere)")
    for i, c in enumerate(r.choices):
        if i in opens:
            check(one_valid_call(c) and not c.message.content,
                  f"llama3 sample {i}: free {texts[i][:60]!r} -> a valid call "
                  f"({[(t.function.name, t.function.arguments) for t in c.message.tool_calls or []]})")
        else:
            check(not c.message.tool_calls and c.message.content == texts[i].strip(),
                  f"llama3 sample {i}: text -> the free text ({c.message.content!r:.60} vs {texts[i].strip()!r:.60})")


def part_reasoning(shardlm, gguf_path, tmp):
    tpl = tmp / "think-tools.jinja"
    tpl.write_text(THINK)
    with TS.Server(shardlm, gguf_path, "--chat-template", str(tpl), "--no-prefix-caching", name="lazy-think",
                   http=True) as srv:
        oa = openai.OpenAI(base_url=srv.base + "/v1", api_key="none", max_retries=0, timeout=600)
        inside = after = opened = 0
        # Rounds of 16 samples (think on and off) until each kind below has shown up: which
        # samples write what depends on the CPU's rounding (an AMD Zen 4 VM had no marker after
        # </think> in seed 5's round where the Intel VMs did); at most three rounds.
        rounds = [(think, seed) for seed in (5, 6, 7) for think in (True, False)]
        for k, (think, seed) in enumerate(rounds):
            if k and k % 2 == 0 and inside and after and opened:
                break
            n = 8
            prompt = py_prompt(tpl, THINK_CHAT, TOOLS, think=think)
            sample = dict(model=gguf_path.name, n=n, seed=seed, temperature=1.0, max_tokens=MAX_TOKENS,
                          logit_bias=banned_ids(gguf_path))
            texts = [c.text for c in oa.completions.create(prompt=prompt, **sample).choices]
            r = oa.chat.completions.create(messages=THINK_CHAT, tools=TOOLS, tool_choice="auto",
                                           extra_body={"chat_template_kwargs": {"think": think}}, **sample)
            for i, c in enumerate(r.choices):
                t = texts[i] if think else texts[i].lstrip()
                if not think and not t.startswith("<think>"):
                    continue  # (no reasoning: the hermes case, tested in test_tools_lazy.py)
                opened += not think
                body = t if think else t[len("<think>"):]
                if "</think>" not in body:  # all reasoning: free, byte for byte
                    inside += MARK in body
                    check(reasoning_of(c.message) == body.strip() and not c.message.tool_calls,
                          f"think={think} sample {i}: unclosed reasoning kept free "
                          f"({reasoning_of(c.message)[:50]!r} vs {body.strip()[:50]!r})")
                    continue
                reason, reply = body.split("</think>", 1)
                inside += MARK in reason
                check(reasoning_of(c.message) == reason.strip(),
                      f"think={think} sample {i}: the reasoning is the free one, byte for byte "
                      f"({reasoning_of(c.message)[:50]!r} vs {reason.strip()[:50]!r})")
                if MARK in reply and c.finish_reason == "length":
                    # The marker came too late for the call to end within MAX_TOKENS (which sample
                    # does depends on the CPU's rounding): a cut call, neither valid nor invalid.
                    print(f"note think={think} sample {i}: a marker after </think>, the call cut at "
                          f"{MAX_TOKENS} tokens: not counted")
                elif MARK in reply:
                    after += 1
                    check(one_valid_call(c) and (c.message.content or "") == reply[:reply.index(MARK)].strip(),
                          f"think={think} sample {i}: a marker after </think> gives a valid call "
                          f"({[(t.function.name, t.function.arguments) for t in c.message.tool_calls or []]})")
                else:
                    check(c.message.content == reply.strip() and not c.message.tool_calls,
                          f"think={think} sample {i}: no marker after </think>: the free reply")
        print(f"reasoning: {inside} free samples write {MARK} inside their reasoning, {after} after it; "
              f"{opened} open <think> themselves")
        check(opened >= 1, "reasoning: some free sample opens <think> itself (think=false)")
        check(inside >= 1, "reasoning: some free sample writes the marker inside its reasoning")
        check(after >= 1, "reasoning: some free sample writes the marker after its reasoning")

        # response_format json_schema, the prompt opening <think>: constrained after </think> only.
        chat = [{"role": "user", "content": "Paris, 21 degrees, as JSON."},
                {"role": "assistant", "reasoning_content": "Two fields.", "content": '{"city": "Paris", "degrees": 21}'},
                {"role": "user", "content": "London, 18 degrees, as JSON."}]
        prompt = py_prompt(tpl, chat, None, think=True)
        n, seed = 8, 11
        sample = dict(model=gguf_path.name, n=n, seed=seed, temperature=1.0, max_tokens=MAX_TOKENS)
        texts = [c.text for c in oa.completions.create(prompt=prompt, **sample).choices]
        rf = {"type": "json_schema", "json_schema": {"name": "answer", "schema": ANSWER}}
        r = oa.chat.completions.create(messages=chat, response_format=rf,
                                       extra_body={"chat_template_kwargs": {"think": True}}, **sample)
        closed = 0
        for i, c in enumerate(r.choices):
            if "</think>" not in texts[i]:
                check(reasoning_of(c.message) == texts[i].strip(),
                      f"json_schema sample {i}: unclosed reasoning is the free text, byte for byte")
                continue
            closed += 1
            reason = texts[i].split("</think>", 1)[0]
            ok = reasoning_of(c.message) == reason.strip()
            try:
                ok = ok and (c.finish_reason != "stop" or valid(json.loads(c.message.content), ANSWER))
            except ValueError:
                ok = False
            check(ok, f"json_schema sample {i}: reasoning free ({reasoning_of(c.message)[:40]!r} vs "
                      f"{reason.strip()[:40]!r}), then valid JSON ({c.message.content!r:.80}, {c.finish_reason})")
        stops = sum(c.finish_reason == "stop" and "</think>" in texts[i] for i, c in enumerate(r.choices))
        print(f"json_schema after <think>: {closed} of {n} free samples close </think>, {stops} end their JSON")
        check(stops >= 1, "json_schema: some sample closes its reasoning and completes valid JSON")


def part_opening(shardlm, gguf_path, tmp):
    tpl = tmp / "think-tools.jinja"
    tpl.write_text(THINK)
    chat = [{"role": "user", "content": "Paris, 21 degrees, as JSON."},
            {"role": "assistant", "reasoning_content": "Two fields: the city and the degrees.",
             "content": '{"city": "Paris", "degrees": 21}'},
            {"role": "user", "content": "London, 18 degrees, as JSON."}]
    prompt = py_prompt(tpl, chat, None, think=False)
    check(not prompt.rstrip().endswith("<think>") and not prompt.rstrip().endswith("</think>"),
          "opening: jinja2's generation prompt neither opens nor closes <think>")
    rf = {"type": "json_schema", "json_schema": {"name": "answer", "schema": ANSWER}}
    kw = {"chat_template_kwargs": {"think": False}}
    with TS.Server(shardlm, gguf_path, "--chat-template", str(tpl), "--no-prefix-caching", name="lazy-open",
                   http=True) as srv:
        oa = openai.OpenAI(base_url=srv.base + "/v1", api_key="none", max_retries=0, timeout=600)
        n, seed = 8, 13
        sample = dict(model=gguf_path.name, n=n, seed=seed, temperature=1.0, max_tokens=96)
        r = oa.chat.completions.create(messages=chat, response_format=rf, extra_body=kw, logprobs=True, **sample)
        free = oa.completions.create(prompt=prompt, **dict(sample, n=1, temperature=0.0))
        check(r.usage.prompt_tokens == free.usage.prompt_tokens,
              f"opening: the chat prompt is jinja2's ({r.usage.prompt_tokens} vs {free.usage.prompt_tokens} tokens)")
        reasoned = valid_after = 0
        for i, c in enumerate(r.choices):
            why = reasoning_of(c.message)
            reasoned += bool(why)
            # (the sample's tokens as text: each logprobs entry's exact bytes)
            raw = b"".join(bytes(t.bytes) for t in c.logprobs.content).decode("utf-8", "replace")
            if raw.startswith("<think>") and "</think>" not in raw:  # it ended (or was cut) reasoning
                check(why == raw[len("<think>"):].replace("<|im_end|>", "").strip() and not c.message.content,
                      f"opening sample {i}: unclosed reasoning is all reasoning_content ({raw[:50]!r})")
                continue
            if c.finish_reason != "stop":
                check(c.finish_reason == "length", f"opening sample {i}: cut ({c.finish_reason})")
                continue
            try:
                ok = valid(json.loads(c.message.content), ANSWER)
            except (TypeError, ValueError):
                ok = False
            valid_after += ok and bool(why)
            check(ok, f"opening sample {i}: content valid under the schema (reasoning {why[:40]!r}, "
                      f"content {c.message.content!r:.80})")
        print(f"opening: {reasoned} of {n} samples open <think> themselves, {valid_after} of them end with "
              f"valid JSON")
        check(reasoned >= 1 and valid_after >= 1, "opening: some sample reasons, then writes valid JSON")

        # Greedy: the reasoning is sampled free: the free greedy run after jinja2's prompt + <think>.
        g = dict(model=gguf_path.name, temperature=0.0, max_tokens=96)
        rg = oa.chat.completions.create(messages=chat, response_format=rf, extra_body=kw, **g).choices[0]
        ref = oa.completions.create(prompt=prompt + "<think>", **g).choices[0].text
        if "</think>" in ref and reasoning_of(rg.message):
            check(reasoning_of(rg.message) == ref.split("</think>", 1)[0].strip(),
                  f"opening greedy: the reasoning is the free one, byte for byte ({reasoning_of(rg.message)[:50]!r} "
                  f"vs {ref.split('</think>', 1)[0].strip()[:50]!r})")
            check(rg.finish_reason == "stop" and valid(json.loads(rg.message.content), ANSWER),
                  f"opening greedy: then valid JSON ({rg.message.content!r:.80})")
        else:
            check(False, f"opening greedy: the model reasons and closes </think> ({ref[:60]!r}, "
                         f"{reasoning_of(rg.message)[:40]!r})")

        # Streamed: the deltas assemble to the unary reply.
        reason, content = "", ""
        for ch in oa.chat.completions.create(messages=chat, response_format=rf, extra_body=kw, stream=True, **g):
            d = ch.choices[0].delta if ch.choices else None
            if d is not None:
                reason += getattr(d, "reasoning_content", None) or (d.model_extra or {}).get("reasoning_content") or ""
                content += d.content or ""
        check(reason == reasoning_of(rg.message) and content == rg.message.content,
              f"opening: streamed deltas assemble to the unary reply ({reason[:30]!r}, {content[:40]!r})")


# A Magistral-style template (written here): reasoning between [THINK] and [/THINK], the
# generation prompt opening [THINK] when think is true.
MAGISTRAL = r"""{%- for m in messages -%}
{%- if m.role == 'user' -%}[INST]{{ m.content }}[/INST]
{%- elif m.role == 'assistant' -%}
{%- if m.reasoning_content %}[THINK]{{ m.reasoning_content }}[/THINK]{% endif %}{{ m.content }}<|im_end|>
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt and think %}[THINK]{% endif -%}"""


def part_markers(shardlm, gguf_path, tmp):
    """Template-specific reasoning markers: [THINK] ... [/THINK] split into reasoning_content."""
    tpl = tmp / "magistral.jinja"
    tpl.write_text(MAGISTRAL)
    chat = [{"role": "user", "content": "Say hi."},
            {"role": "assistant", "reasoning_content": "a greeting", "content": "Hi there."},
            {"role": "user", "content": "Say hello."}]
    cases = [(False, r"\[THINK\][a-z ]{4,24}\[/THINK\] ?[A-Z][a-z]{1,12}\."),
             (True, r"[a-z ]{4,24}\[/THINK\] ?[A-Z][a-z]{1,12}\.")]
    with TS.Server(shardlm, gguf_path, "--chat-template", str(tpl), "--no-prefix-caching", name="markers",
                   http=True) as srv:
        oa = openai.OpenAI(base_url=srv.base + "/v1", api_key="none", max_retries=0, timeout=600)
        for think, regex in cases:
            kw = {"chat_template_kwargs": {"think": think}, "structured_outputs": {"regex": regex}}
            g = dict(model=gguf_path.name, temperature=0.0, max_tokens=64, extra_body=kw)
            prompt = py_prompt(tpl, chat, None, think=think)
            free = oa.completions.create(prompt=prompt, model=gguf_path.name, max_tokens=1, temperature=0.0)
            r = oa.chat.completions.create(messages=chat, logprobs=True, **g)
            c = r.choices[0]
            check(r.usage.prompt_tokens == free.usage.prompt_tokens,
                  f"markers think={think}: the chat prompt is jinja2's ({r.usage.prompt_tokens} vs "
                  f"{free.usage.prompt_tokens} tokens)")
            raw = b"".join(bytes(t.bytes) for t in c.logprobs.content).decode("utf-8", "replace")
            body = raw if think else raw[len("[THINK]"):]
            reason, reply = body.split("[/THINK]", 1)
            check(raw.startswith("[THINK]") != think and reasoning_of(c.message) == reason.strip()
                  and c.message.content == reply.strip() and c.finish_reason == "stop",
                  f"markers think={think}: {raw!r} -> reasoning {reasoning_of(c.message)!r}, content "
                  f"{c.message.content!r}")
            reason_s, content_s = "", ""
            for ch in oa.chat.completions.create(messages=chat, stream=True, **g):
                d = ch.choices[0].delta if ch.choices else None
                if d is not None:
                    reason_s += getattr(d, "reasoning_content", None) or (d.model_extra or {}).get("reasoning_content") or ""
                    content_s += d.content or ""
            check(reason_s == reasoning_of(c.message) and content_s == c.message.content,
                  f"markers think={think}: streamed deltas assemble to the unary reply ({reason_s!r}, {content_s!r})")

        # response_format with these markers, the model opening [THINK] itself (an opening constraint).
        chat = [{"role": "user", "content": "Paris, 21 degrees, as JSON."},
                {"role": "assistant", "reasoning_content": "Two fields: the city and the degrees.",
                 "content": '{"city": "Paris", "degrees": 21}'},
                {"role": "user", "content": "London, 18 degrees, as JSON."}]
        rf = {"type": "json_schema", "json_schema": {"name": "answer", "schema": ANSWER}}
        kw = {"chat_template_kwargs": {"think": False}}
        prompt = py_prompt(tpl, chat, None, think=False)
        g = dict(model=gguf_path.name, temperature=0.0, max_tokens=96)
        rg = oa.chat.completions.create(messages=chat, response_format=rf, extra_body=kw, **g)
        free = oa.completions.create(prompt=prompt + "[THINK]", **g)
        plain = oa.completions.create(prompt=prompt, model=gguf_path.name, max_tokens=1, temperature=0.0)
        check(rg.usage.prompt_tokens == plain.usage.prompt_tokens,
              f"markers opening: the chat prompt (reasoning in its history) is jinja2's ({rg.usage.prompt_tokens} vs "
              f"{plain.usage.prompt_tokens} tokens)")
        ref, c = free.choices[0].text, rg.choices[0]
        ok = "[/THINK]" in ref and reasoning_of(c.message) == ref.split("[/THINK]", 1)[0].strip()
        try:
            ok = ok and c.finish_reason == "stop" and valid(json.loads(c.message.content), ANSWER)
        except (TypeError, ValueError):
            ok = False
        check(ok, f"markers opening, greedy: [THINK] opened by the model, the reasoning the free one byte for byte "
                  f"({reasoning_of(c.message)[:40]!r} vs {ref[:40]!r}), then valid JSON ({c.message.content!r:.60})")
        n = 6
        r = oa.chat.completions.create(messages=chat, response_format=rf, extra_body=kw, n=n, seed=5, temperature=1.0,
                                       model=gguf_path.name, max_tokens=96)
        done = [c for c in r.choices if c.finish_reason == "stop" and c.message.content]
        for i, c in enumerate(done):
            try:
                ok = valid(json.loads(c.message.content), ANSWER)
            except ValueError:
                ok = False
            check(ok, f"markers opening sample {i}: valid JSON ({reasoning_of(c.message)[:30]!r}, {c.message.content!r:.60})")
        reasoned = sum(bool(reasoning_of(c.message)) for c in done)
        print(f"markers opening: {len(done)} of {n} samples end with JSON, {reasoned} of them after [THINK]")
        check(reasoned >= 1, "markers opening: some sample reasons between [THINK] markers, then writes valid JSON")


def with_marker_token(src, dst):
    """A copy of the GGUF whose last merge's piece becomes <tool_call>, an added (user-defined)
    token (the merge dropped: no merge uses that piece); returns its id."""
    rd = gguf.GGUFReader(src)
    arch = rd.fields["general.architecture"]
    w = gguf.GGUFWriter(dst, bytes(arch.parts[arch.data[0]]).decode())
    strs = lambda f: [bytes(f.parts[i]).decode("utf-8") for i in f.data]  # noqa: E731
    toks, merges = strs(rd.fields["tokenizer.ggml.tokens"]), strs(rd.fields["tokenizer.ggml.merges"])
    types = [int(rd.fields["tokenizer.ggml.token_type"].parts[i][0]) for i in rd.fields["tokenizer.ggml.token_type"].data]
    tid = toks.index(merges.pop().replace(" ", ""))
    toks[tid], types[tid] = MARK, int(gguf.TokenType.USER_DEFINED)
    for f in rd.fields.values():
        if f.name.startswith("GGUF.") or f.name == "general.architecture":
            continue
        if f.name == "tokenizer.ggml.tokens":
            w.add_array(f.name, toks)
        elif f.name == "tokenizer.ggml.token_type":
            w.add_array(f.name, types)
        elif f.name == "tokenizer.ggml.merges":
            w.add_array(f.name, merges)
        else:
            vt = f.types[0]
            if vt == gguf.GGUFValueType.ARRAY:
                sub = f.types[1]
                vals = (strs(f) if sub == gguf.GGUFValueType.STRING
                        else [f.parts[i].tolist()[0] for i in f.data])
                w.add_array(f.name, vals)
            elif vt == gguf.GGUFValueType.STRING:
                w.add_string(f.name, bytes(f.parts[f.data[0]]).decode("utf-8"))
            else:
                w.add_key_value(f.name, f.parts[f.data[0]].tolist()[0], vt)
    for t in rd.tensors:
        w.add_tensor(t.name, np.asarray(t.data), raw_shape=t.data.shape, raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return tid


def part_special_token(shardlm, gguf_path, tmp):
    dst = tmp / gguf_path.name
    tid = with_marker_token(str(gguf_path), str(dst))
    tpl = tmp / "think-tools.jinja"  # (think false: a plain hermes template)
    tpl.write_text(THINK)
    n, seed = 4, 9
    prompt = py_prompt(tpl, THINK_CHAT, TOOLS, think=False)
    with TS.Server(shardlm, dst, "--chat-template", str(tpl), "--no-prefix-caching", name="lazy-token",
                   http=True) as srv:
        oa = openai.OpenAI(base_url=srv.base + "/v1", api_key="none", max_retries=0, timeout=600)
        sample = dict(model=dst.name, n=n, seed=seed, temperature=1.0, max_tokens=MAX_TOKENS,
                      logit_bias={str(tid): 100})
        free = oa.completions.create(prompt=prompt, logprobs=0, **sample).choices
        # One call each (parallel_tool_calls false): with the marker pushed by logit_bias a second
        # call would open after the first and be cut by max_tokens.
        r = oa.chat.completions.create(messages=THINK_CHAT, tools=TOOLS, tool_choice="auto", parallel_tool_calls=False,
                                       extra_body={"chat_template_kwargs": {"think": False}}, **sample)
    check(all(c.text.startswith(MARK * 3) for c in free),
          f"special token: the free run writes the one-token marker over and over ({free[0].text[:40]!r})")
    check(all(len(c.logprobs.tokens) == MAX_TOKENS and set(c.logprobs.tokens) == {MARK} for c in free),
          "special token: the marker is one token (the free run's tokens are all it)")
    for i, c in enumerate(r.choices):
        check(one_valid_call(c) and not c.message.content,
              f"special token sample {i}: the marker token triggers the grammar: a valid call "
              f"({[(t.function.name, t.function.arguments) for t in c.message.tool_calls or []]}, {c.finish_reason})")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shardlm", required=True)
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--only", default="")
    a = ap.parse_args()
    if not os.path.exists(a.gguf):
        print(f"SKIP: no SmolLM2 GGUF at {a.gguf} (tools/fetch_smollm2.sh)")
        return SKIP
    parts = {"llama3": part_llama3, "reasoning": part_reasoning, "token": part_special_token,
             "opening": part_opening, "markers": part_markers}
    try:
        with tempfile.TemporaryDirectory() as d:
            for name, fn in parts.items():
                if not a.only or name in a.only.split(","):
                    fn(a.shardlm, Path(a.gguf), Path(d))
    finally:
        for p in TS.SERVERS:
            if p.poll() is None:
                p.kill()
    return check.summary()


if __name__ == "__main__":
    sys.exit(main())
