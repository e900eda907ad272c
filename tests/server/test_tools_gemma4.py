#!/usr/bin/env python3
"""Gemma 4's tool calls (the gemma4 format: docs/tools.md), `<|tool_call>call:NAME{KEY:VALUE,...}<tool_call|>`,
its values in its template's notation (a string between `<|"|>` marks, an object with bare keys, a
list, a number, true / false, null or Python's None as Jinja writes it), calls back to back.
- Parsing, against the template itself: assistant turns with tool calls of every argument kind
  (tool_cases.CALLS: strings with quotes, newlines and non-ASCII, numbers, booleans, null, nested
  objects and lists, parallel calls) rendered by Python jinja2 with Google's published Gemma 4
  template and llama.cpp's interleaved-thinking variant of it (tests/data/chat_templates, from
  llama.cpp's models/templates), the reply part of each
  parsed by shardlm's parser (test_tool_stream --parse-gemma4): the same calls (names equal,
  arguments equal as JSON; a string "42" stays a string: the marks say so).
- The grammar (server/http_tools_glm.c gemma4_grammar, printed by test_tool_stream --gemma4-grammar,
  decided by the grammar engine through test_grammar check): the template's renderings complete
  (required, and what follows the first <|tool_call> under the lazy grammar of tool_choice auto),
  mutations not (test_tools_xml.grammar_oracle's); a string holding the closing tag `<tool_call|>`
  both parses back and completes.
- Served (SmolLM2-135M-Instruct's GGUF behind Gemma 4's template; the official `openai` package,
  gRPC Chat): the server reads the template as the gemma4 format; the prompt with tools and a
  history with a call and its result render as jinja2's; tool_choice required, a named function
  and parallel calls: sampled replies are calls that parse, of the declared (named) function with
  its declared keys and value types; streamed calls equal the unary ones; a key the format cannot
  write back and strict: true refused by name (test_tools_xml.served). With enable_thinking, its
  thought channel (`<|channel>thought\\n ... <channel|>`) is the reasoning: a regex-forced thought and
  answer split, unary and streamed; required calls after an optional thought conform.
SKIP (77) without openai or jinja2; the served part SKIPs without the GGUF.

  test_tools_gemma4.py --shardlm BUILD/cli/shardlm --tool-stream BUILD/tests/test_tool_stream
                       --test-grammar BUILD/tests/test_grammar --gguf .cache/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
"""
import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

SKIP = 77
sys.dont_write_bytecode = True
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
try:
    import openai
    import test_tools_xml as X  # noqa: E402  (exits 77 without jinja2 or openai)
except ImportError as e:
    print(f"SKIP: a test dependency cannot be imported ({e}); run tools/install_deps.sh")
    sys.exit(SKIP)
import test_server as TS  # noqa: E402

GEMMA4 = X.TEMPLATES / "google-gemma-4-31B-it.jinja"
INTERLEAVED = X.TEMPLATES / "google-gemma-4-31B-it-interleaved.jinja"  # (llama.cpp's variant)
# Its assistant turn: after `<|turn>model\n`, calls end with `<|tool_response>` (the template's, when
# no result follows in the same turn; the interleaved variant ends the turn, `<turn|>`); the marker
# of a call and its end.
X.FORMATS[GEMMA4] = ("gemma4", "<|turn>model\n", "<|tool_response>", "<|tool_call>", "<tool_call|>")
X.FORMATS[INTERLEAVED] = ("gemma4", "<|turn>model\n", "<turn|>", "<|tool_call>", "<tool_call|>")
# A key the format cannot write back (a bare key ends at ':'), what the 400s name.
X.REFUSALS[GEMMA4] = ("a:b", "gemma4", "Gemma 4's")


def thinking(srv, oa, mid):
    """Gemma 4's thought channel (`<|channel>thought\\n ... <channel|>`, written when the request's
    chat_template_kwargs turn enable_thinking on) is the reasoning: a reply forced by a regex into a
    thought and an answer comes back as reasoning_content and content, unary and streamed; a required
    call may think first (an opening constraint: the thought free, then the grammar's call)."""
    check = X.check
    check("reasoning split from <|channel>thought" in srv.log_path.read_text(),
          "Gemma 4: its thought channel is read as the reasoning")
    on = {"chat_template_kwargs": {"enable_thinking": True}}
    rx = r"<\|channel>thought\n[a-z ]{4,30}<channel\|>[A-Za-z ]{4,30}"
    kw = dict(model=mid, messages=X.ASK, max_tokens=60, temperature=0, extra_body=dict(on, structured_outputs={"regex": rx}))
    m = oa.chat.completions.create(**kw).choices[0].message
    rc = (m.model_extra or {}).get("reasoning_content")
    check(isinstance(rc, str) and rc and m.content and "channel" not in rc + m.content,
          f"Gemma 4, thinking on: a thought then an answer split ({rc!r} / {m.content!r})")
    _, _, _, s_rc, s_content = X.stream_calls(oa.chat.completions.create(stream=True, **kw))
    check(s_rc == rc and s_content == m.content, f"Gemma 4: streamed reasoning / content equal unary ({s_rc!r}, {s_content!r})")
    bad = []
    for seed in range(4):
        ch = oa.chat.completions.create(model=mid, messages=X.ASK, tools=X.TYPED, tool_choice="required",
                                        parallel_tool_calls=False, max_tokens=200, temperature=1.0, seed=seed,
                                        extra_body=on).choices[0]
        tcs = ch.message.tool_calls or []
        if ch.finish_reason != "tool_calls" or len(tcs) != 1 or not X.conforms(tcs[0], X.TYPED):
            bad.append((seed, ch.finish_reason, [(t.function.name, t.function.arguments) for t in tcs]))
    check(not bad, "Gemma 4, thinking on, tool_choice required: 4 sampled replies, each one call with the declared "
          "keys and value types" + ("" if not bad else f": {bad[:2]}"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shardlm", required=True)
    ap.add_argument("--tool-stream", required=True)
    ap.add_argument("--test-grammar", required=True)
    ap.add_argument("--gguf", required=True)
    a = ap.parse_args()
    check = X.check
    work = Path(tempfile.mkdtemp(prefix="shardlm-gemma4-tools-"))
    try:
        for t in (GEMMA4, INTERLEAVED):
            out = X.TC.subprocess.run([a.tool_stream, "--detect", str(t)], capture_output=True, text=True, timeout=60)
            check(out.stdout.split("\t")[1:2] == ["gemma4"], f"{t.name} is read as the gemma4 format: {out.stdout!r}")
            X.round_trip(t, a.tool_stream, work)
            X.grammar_oracle(t, a.tool_stream, a.test_grammar, work)
        # A string may hold the call's closing tag: the parser reads it as the string's, and the
        # grammar lets it stand there.
        tagged = [{"name": "b", "arguments": {"y": "a <tool_call|> b <|tool_call>call:x{} <"}}]
        reply = X.rendered_reply(GEMMA4, tagged)
        rc, back = X.TC.parse_back(a.tool_stream, "--parse-gemma4", work / "tagged.txt", [reply])
        check(rc == 0 and back and X.TC.same_calls(tagged, back[0]), f"a string holding <tool_call|> parses back: {back}")
        path = work / "tagged.gbnf"
        path.write_text(X.TC.subprocess.run([a.tool_stream, "--gemma4-grammar", X.json.dumps(X.DECLARED), "", "1", "0"],
                                            capture_output=True, text=True, timeout=60).stdout)
        got = X.TC.decide(a.test_grammar, "ebnf", path, [reply])
        check(got == ["complete"], f"the grammar completes it: {got}")
        if not os.path.exists(a.gguf):
            print(f"SKIP: served: no SmolLM2 GGUF at {a.gguf} (tools/fetch_smollm2.sh)")
            return check.summary()
        mid = Path(a.gguf).name
        with TS.Server(a.shardlm, Path(a.gguf), "--chat-template", str(GEMMA4), "--no-prefix-caching",
                       name="tools-gemma4", http=True) as srv:
            check("tool calls in the gemma4 format" in srv.log_path.read_text(), "Gemma 4: read as the gemma4 format")
            oa = openai.OpenAI(base_url=srv.base + "/v1", api_key="none", max_retries=0, timeout=300)
            X.served(srv, oa, mid, GEMMA4, "Gemma 4", False)
            thinking(srv, oa, mid)
    except Exception as e:  # noqa: BLE001 - reported with the server logs
        check(False, f"{e}")
        TS.show_logs()
    finally:
        TS.kill_all()
        shutil.rmtree(work, ignore_errors=True)
    return check.summary()


if __name__ == "__main__":
    sys.exit(main())
