"""Grammar-first tool calls under tool_choice "auto" (a lazy grammar; docs/tools.md), on
SmolLM2-135M-Instruct served with Qwen 2.5's template (the hermes format, <tool_call>):

- The unconstrained run: /v1/completions of the prompt Python jinja2 renders (tests/test_jinja.py's
  environment, as transformers' apply_chat_template) with tools and a history of one call (which
  the model imitates), n = 8 sampled with a seed, "resp" and "response" banned by logit_bias (the
  model's favourite is <tool_response>; so it writes <tool_call> instead). Some samples write
  "<tool_call>" and then JSON that does not parse or does not validate against the tool's
  parameters (checked here with json and jsonschema, not with the server's parser).
- The lazy run: the same conversation as a chat request with the tools and tool_choice "auto",
  same seed and n. Each sample's text is free until it writes the marker: byte for byte the
  completion's (content = the completion's text before the marker); from the marker on the call
  is constrained: every sample that wrote the marker returns a call that parses and validates
  with jsonschema, finish_reason "tool_calls".
- The two requests again at once (the free samples beside the constrained ones in one batch):
  each gives what it gave alone (--batch-invariant: otherwise the prefill of two long prompts
  at once rounds differently and sampled text may diverge, docs/determinism.md). Streamed, the lazy run's deltas assemble to its unary answer.
SKIP (77) without the GGUF, openai, jsonschema or jinja2.
"""
import argparse
import json
import os
import sys
import threading
from pathlib import Path

SKIP = 77
sys.dont_write_bytecode = True
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
try:
    import jsonschema
    import openai
    from gguf import GGUFReader
    import test_jinja  # noqa: F401,E402  (exits 77 without jinja2)
except ImportError as e:
    print(f"SKIP: a test dependency cannot be imported ({e}); run tools/install_deps.sh")
    sys.exit(SKIP)
import test_server as TS  # noqa: E402
from checks import Checks  # noqa: E402
from test_tools_native import ASK, PARAMS, TOOLS, py_prompt, stream_calls  # noqa: E402

check = Checks()
TEMPLATE = HERE.parent / "data" / "chat_templates" / "qwen2.5-instruct.jinja"
MARK = "<tool_call>"
N, SEED, MAX_TOKENS = 8, 7, 64
CALL = {"id": "call_abc123def", "type": "function",
        "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris", "unit": "celsius"})}}
CHAT = ASK + [{"role": "assistant", "tool_calls": [CALL]},
              {"role": "tool", "tool_call_id": CALL["id"], "content": "{\"temperature\": 21}"},
              {"role": "assistant", "content": "It is 21 degrees in Paris."},
              {"role": "user", "content": "What is the weather in London?"}]


def free_call_ok(text):
    """Whether the text after the first <tool_call> is one valid call (json + jsonschema)."""
    body = text[text.index(MARK) + len(MARK):]
    body = body.split("</tool_call>")[0].strip()
    try:
        c = json.loads(body)
        jsonschema.validate(c["arguments"], PARAMS[c["name"]])
        return True
    except Exception:  # noqa: BLE001  (any failure: malformed, unknown name, invalid arguments)
        return False


def banned_ids(gguf):
    """logit_bias banning SmolLM2's "resp" and "response" tokens (ids from the GGUF's vocabulary)."""
    f = GGUFReader(gguf).fields["tokenizer.ggml.tokens"]
    toks = [bytes(f.parts[i]).decode("utf-8", "replace") for i in f.data]
    return {str(toks.index(t)): -100 for t in ("resp", "response")}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shardlm", required=True)
    ap.add_argument("--gguf", required=True)
    a = ap.parse_args()
    if not os.path.exists(a.gguf):
        print(f"SKIP: no SmolLM2 GGUF at {a.gguf} (tools/fetch_smollm2.sh)")
        return SKIP
    mid = Path(a.gguf).name
    prompt = py_prompt(TEMPLATE, CHAT, TOOLS)
    bias = banned_ids(a.gguf)
    try:
        with TS.Server(a.shardlm, Path(a.gguf), "--chat-template", str(TEMPLATE), "--no-prefix-caching",
                       "--batch-invariant",
                       name="tools-lazy", http=True) as srv:
            oa = openai.OpenAI(base_url=srv.base + "/v1", api_key="none", max_retries=0, timeout=600)
            sample = dict(model=mid, n=N, seed=SEED, temperature=1.0, max_tokens=MAX_TOKENS, logit_bias=bias)

            def free():
                return [c.text for c in oa.completions.create(prompt=prompt, **sample).choices]

            def lazy(**kw):
                return oa.chat.completions.create(messages=CHAT, tools=TOOLS, tool_choice="auto",
                                                  parallel_tool_calls=False, **sample, **kw)

            texts = free()
            r = lazy()
            triggered = [i for i, t in enumerate(texts) if MARK in t]
            bad_free = [i for i in triggered if not free_call_ok(texts[i])]
            print(f"free run: {len(triggered)} of {N} samples write {MARK}, {len(bad_free)} of them a malformed "
                  f"or invalid call")
            check(len(bad_free) >= 1, f"the unconstrained run writes a malformed call ({bad_free})")
            for i, c in enumerate(r.choices):
                m = c.message
                if i in triggered:
                    before = texts[i][:texts[i].index(MARK)].strip()
                    ok = c.finish_reason == "tool_calls" and len(m.tool_calls or []) == 1
                    if ok:
                        tc = m.tool_calls[0]
                        try:
                            jsonschema.validate(json.loads(tc.function.arguments), PARAMS[tc.function.name])
                        except Exception as e:  # noqa: BLE001
                            print(f"  sample {i}: {tc.function.name}({tc.function.arguments}): {e}")
                            ok = False
                    ok = ok and (m.content or "").startswith(before)
                    check(ok, f"sample {i}: free {texts[i][:90]!r} -> lazy call "
                              f"{[(t.function.name, t.function.arguments) for t in m.tool_calls or []]}, content "
                              f"{(m.content or '')[:40]!r}")
                else:  # never triggered: the free text, byte for byte
                    check(not m.tool_calls and m.content == texts[i].strip() and c.finish_reason != "tool_calls",
                          f"sample {i}: no marker -> the completion's text ({m.content!r:.50} vs {texts[i].strip()!r:.50})")

            # Side by side: a free request and the lazy one in the same batches.
            got = {}
            threads = [threading.Thread(target=lambda: got.__setitem__("free", free())),
                       threading.Thread(target=lambda: got.__setitem__("lazy", lazy()))]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            diff = [i for i, (x, y) in enumerate(zip(got.get("free") or [], texts)) if x != y]
            check(got.get("free") == texts, f"batched beside the lazy request, the free samples are unchanged {diff}")
            same = got.get("lazy") and all(
                (x.message.content, [(t.function.name, t.function.arguments) for t in x.message.tool_calls or []])
                == (y.message.content, [(t.function.name, t.function.arguments) for t in y.message.tool_calls or []])
                for x, y in zip(got["lazy"].choices, r.choices))
            check(bool(same), "batched beside the free request, the lazy samples are unchanged")

            # Streamed (one sample): the deltas assemble to the unary answer.
            if triggered:
                one = dict(sample, n=1)
                kw = dict(messages=CHAT, tools=TOOLS, tool_choice="auto", parallel_tool_calls=False, **one)
                calls, finish, _, _, _ = stream_calls(oa.chat.completions.create(stream=True, **kw))
                r1 = oa.chat.completions.create(**kw)
                m = r1.choices[0].message
                check(calls == [(t.function.name, t.function.arguments) for t in m.tool_calls or []]
                      and finish == r1.choices[0].finish_reason,
                      f"streamed lazy answer equals the unary one ({calls} vs {finish})")
    finally:
        for p in TS.SERVERS:
            if p.poll() is None:
                p.kill()
    return check.summary()


if __name__ == "__main__":
    sys.exit(main())
