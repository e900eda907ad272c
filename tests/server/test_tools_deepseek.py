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
  (sentencepiece); tool_choice auto is answered; `required` and a named function take the generic
  format (constrained JSON): the replies are calls that parse, of the named function; `strict:
  true` is a 400 naming DeepSeek's format (its own calls are parsed, not constrained).
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
    f = work / ("r1" if r1 else "v31")
    f.write_bytes("\x1e".join(replies).encode("utf-8"))
    out = subprocess.run([tool_stream, "--parse-deepseek", str(f)], capture_output=True, text=True, timeout=60)
    check(out.returncode == 0, "the DeepSeek parser runs on %d replies rendered by %s" % (len(replies), path.name))
    got = [[l.split("\t", 1) for l in block.strip("\n").split("\n") if l] for block in out.stdout.split("--\n")[:-1]]
    for calls, back in zip(CALLS, got):
        ok = len(calls) == len(back) and all(c["name"] == b[0] and c["arguments"] == json.loads(b[1])
                                             for c, b in zip(calls, back))
        check(ok, "rendered by %s and parsed back: %s -> %s" % (path.name, json.dumps(calls)[:80], back))
    check(len(got) == len(CALLS), "%d of %d renderings parsed (%s)" % (len(got), len(CALLS), path.name))


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
        # required and named: the generic format (its JSON reply constrained), whose calls always parse.
        ping = {"type": "function", "function": {"name": "ping", "parameters": {
            "type": "object", "properties": {}, "additionalProperties": False}}}
        for choice, what in (("required", "tool_choice required"),
                             ({"type": "function", "function": {"name": "ping"}}, "a named function")):
            r = c.chat.completions.create(model="stories260K", messages=msgs, tools=[ping], tool_choice=choice,
                                          parallel_tool_calls=False, max_tokens=60, temperature=0)
            tc = r.choices[0].message.tool_calls or []
            ok = r.choices[0].finish_reason == "tool_calls" and tc and all(
                t.function.name == "ping" and json.loads(t.function.arguments) == {} for t in tc)
            check(ok, f"{what}: calls in the generic format that parse ({r.choices[0].finish_reason}, "
                      f"{[(t.function.name, t.function.arguments) for t in tc]})")
        try:
            c.chat.completions.create(model="stories260K", messages=msgs, max_tokens=4,
                                      tools=[{"type": "function", "function": dict(TOOLS[0]["function"], strict=True)}])
            check(False, "strict: true on DeepSeek's format is refused")
        except openai.BadRequestError as e:
            check("DeepSeek" in str(e), f"strict: true: a 400 naming DeepSeek's format: {str(e)[:110]}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shardlm", required=True)
    ap.add_argument("--tool-stream", required=True)
    ap.add_argument("--model", required=True)
    a = ap.parse_args()
    if not (Path(a.model) / "tokenizer.model").exists():
        print(f"SKIP: no stories260K model at {a.model}")
        return SKIP
    work = Path(tempfile.mkdtemp(prefix="shardlm-deepseek-"))
    try:
        round_trip(V31, a.tool_stream, work, r1=False)
        round_trip(R1, a.tool_stream, work, r1=True)
        serve(a, work)
    except Exception as e:  # noqa: BLE001 - reported with the server logs
        check(False, f"{e}")
        for log in sorted(TS.LOG_DIR.glob("*.log")):
            print(f"--- {log.name} (last lines)\n" + "\n".join(log.read_text().splitlines()[-15:]))
    finally:
        TS.kill_all()
    return check.summary()


if __name__ == "__main__":
    sys.exit(main())
