#!/usr/bin/env python3
"""The XML-like tool calls of Qwen3-Coder (also Qwen3.5's: docs/tools.md, the qwen3-coder format),
`<tool_call>\\n<function=NAME>\\n<parameter=K>\\nV\\n</parameter>\\n...</function>\\n</tool_call>`, and of
MiniMax-M2 (the minimax-m2 format), `<minimax:tool_call>\\n<invoke name="NAME">\\n<parameter
name="K">V</parameter>\\n...</invoke>\\n...</minimax:tool_call>`, and of DeepSeek V3.2 and V4 (the
deepseek-v3.2 and deepseek-v4 formats: MiniMax's shape in `<｜DSML｜...>` tags, each parameter with
`string="true|false"`, the block `function_calls` or `tool_calls`).
- Parsing, against the templates themselves: assistant turns with tool calls of every argument
  kind (tool_cases.CALLS: strings with quotes, newlines and non-ASCII, numbers, booleans, null,
  nested objects and lists, parallel calls) rendered by Python jinja2 with Qwen3-Coder's,
  Qwen3.5's, MiniMax-M2's and DeepSeek V3.2's and V4's published templates (tests/data/chat_templates);
  the reply part of each rendering, parsed by shardlm's parser (test_tool_stream --parse-qwen-xml /
  --parse-minimax / --parse-dsml / --parse-dsml-v4, with the tools' declared types)
  gives back the same calls: names equal, arguments equal as JSON (Python's True and None, as the
  templates write them, read back as a boolean and a null by the declared types; a declared
  string that looks like a number stays a string; DSML's string="true" keeps it a string even
  without the declared types).
- The grammar (server/http_tools_glm.c, printed by test_tool_stream --qwen-xml-grammar /
  --minimax-grammar, decided by the grammar engine through test_grammar check): the templates'
  renderings complete, mutations not.
- Served (SmolLM2-135M-Instruct's GGUF, whose vocabulary has ChatML's tokens, behind each
  template; the official `openai` package): the server reads both Qwen templates as the qwen3-coder
  format (Qwen3.5's with <think> reasoning), DeepSeek V3.2's as deepseek-v3.2; the prompt with
  tools and a history with a call and its result render as jinja2's (the same prompt length);
  tool_choice required, a named function and parallel calls: sampled replies are calls that parse,
  of the declared (named) function, with its declared keys and value types; a streamed reply's
  calls equal the unary one's; a key the format cannot write and strict: true refused by name.
  MiniMax-M2's template always opens <think> (SmolLM2 never closes it): served, only its prompts
  are checked (with tools, and a history with calls and their results); DeepSeek V4's (read as
  deepseek-v4): its prompts, and after each a greedy required call that conforms; a request's
  response_format (json_schema, json_object) reaches its prompt as jinja2 renders it.
SKIP (77) without the GGUF, openai or jinja2.

  test_tools_xml.py --shardlm BUILD/cli/shardlm --tool-stream BUILD/tests/test_tool_stream
                         --test-grammar BUILD/tests/test_grammar --gguf .cache/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
"""
import argparse
import json
import os
import re
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
    import test_jinja  # noqa: E402  (exits 77 without jinja2)
except ImportError as e:
    print(f"SKIP: a test dependency cannot be imported ({e}); run tools/install_deps.sh")
    sys.exit(SKIP)
import test_server as TS  # noqa: E402
import tools_grpc as TG  # noqa: E402
import tool_cases as TC  # noqa: E402
from checks import Checks  # noqa: E402
from test_tools_glm import DECLARED, TYPED, conforms  # noqa: E402
from test_tools_native import py_prompt, stream_calls  # noqa: E402
from tool_cases import CALLS  # noqa: E402

check = Checks()
TEMPLATES = HERE.parent / "data" / "chat_templates"
CODER, QWEN35, MINIMAX = (TEMPLATES / "Qwen3-Coder.jinja", TEMPLATES / "Qwen3.5-4B.jinja",
                          TEMPLATES / "MiniMax-M2.jinja")
DS32, DS4 = TEMPLATES / "deepseek-ai-DeepSeek-V3.2.jinja", TEMPLATES / "deepseek-ai-DeepSeek-V4.jinja"
SEED = TEMPLATES / "ByteDance-Seed-OSS.jinja"
DSML = "\uff5cDSML\uff5c"
DS_TURN = ("<\uff5cAssistant\uff5c>", "<\uff5cend\u2581of\u2581sentence\uff5c>")
# Per template: the parser's and the grammar's flags, its assistant turn's start and end, the marker
# of a block of calls and its end.
FORMATS = {CODER: ("qwen-xml", "<|im_start|>assistant\n", "<|im_end|>", "<tool_call>", "</tool_call>"),
           QWEN35: ("qwen-xml", "<|im_start|>assistant\n", "<|im_end|>", "<tool_call>", "</tool_call>"),
           MINIMAX: ("minimax", "]~b]ai\n", "[e~[", "<minimax:tool_call>", "</minimax:tool_call>"),
           DS32: ("dsml", *DS_TURN, f"<{DSML}function_calls>", f"</{DSML}function_calls>"),
           DS4: ("dsml-v4", *DS_TURN, f"<{DSML}tool_calls>", f"</{DSML}tool_calls>"),
           SEED: ("seed-oss", "<seed:bos>assistant", "<seed:eos>", "<seed:tool_call>", "</seed:tool_call>")}


def rendered_reply(template, calls):
    """The assistant turn the template (jinja2) writes for calls, after its start and any <think>
    block, up to its end."""
    _, start, end, _, _ = FORMATS[template]
    msgs = [{"role": "user", "content": "go"},
            {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": c} for c in calls]}]
    text = test_jinja.make_env().from_string(template.read_text()).render(messages=msgs, tools=DECLARED,
                                                                          add_generation_prompt=False)
    reply = text[text.rindex(start) + len(start):]
    reply = reply[:reply.rindex(end)]
    return reply.split("</think>", 1)[1] if "</think>" in reply else reply


def round_trip(template, tool_stream, work):
    b42 = [{"name": "b", "arguments": {"y": "42"}}]
    replies = [rendered_reply(template, calls) for calls in CALLS + [b42]]
    flag = "--parse-" + FORMATS[template][0]
    rc, got = TC.parse_back(tool_stream, flag, work / "xml_replies.txt", replies, DECLARED)
    check(rc == 0 and len(got) == len(replies), f"{template.name}: the parser runs on {len(replies)} rendered replies")
    for calls, back in zip(CALLS + [b42], got):
        check(TC.same_calls(calls, back), f"{template.name}: rendered and parsed back (declared types): "
              f"{json.dumps(calls)[:90]} -> {back}")
    # Without the declared types a value that is whole JSON is that JSON (llama.cpp's rule); DSML's
    # string="true" says it is a string, as Gemma 4's <|"|> marks do.
    rc, untyped = TC.parse_back(tool_stream, flag, work / "xml_replies.txt", replies[-1:])
    want = {"y": "42"} if template in (DS32, DS4) or FORMATS[template][0] == "gemma4" else {"y": 42}
    check(rc == 0 and untyped and untyped[0] and json.loads(untyped[0][0][1]) == want,
          f"{template.name}: without the declared types, \"42\" reads as {want}: {untyped}")


def seed_checks(tool_stream, test_grammar, work):
    """Seed-OSS writes a value through Jinja's `string` (a list or mapping as Python's repr, not
    JSON, so those do not come back as written): its renderings of the calls with scalar values
    parse back (declared types) and complete the grammar, required and lazily; mutations do not."""
    scalar = [c for c in CALLS if all(not isinstance(v, (list, dict)) for x in c for v in x["arguments"].values())]
    replies = [rendered_reply(SEED, c) for c in scalar]
    rc, got = TC.parse_back(tool_stream, "--parse-seed-oss", work / "seed_replies.txt", replies, DECLARED)
    check(rc == 0 and len(got) == len(scalar) and all(TC.same_calls(c, b) for c, b in zip(scalar, got)),
          f"Seed-OSS: {len(scalar)} renderings of calls parsed back: {got}")

    def grammar(parallel, lazy):
        out = TC.subprocess.run([tool_stream, "--seed-oss-grammar", json.dumps(DECLARED), "", str(parallel), str(lazy)],
                                capture_output=True, text=True, timeout=60)
        path = work / f"seed-{parallel}-{lazy}.gbnf"
        path.write_text(out.stdout)
        return path
    got = TC.decide(test_grammar, "ebnf", grammar(1, 0), replies)
    got += TC.decide(test_grammar, "ebnf", grammar(1, 1), [r[r.index("<seed:tool_call>") + 16:] for r in replies])
    check(got == ["complete"] * (2 * len(replies)), f"Seed-OSS: the grammar completes them, required and lazily: {got}")
    bad = [rendered_reply(SEED, [{"name": "get_wether", "arguments": {"city": "Paris"}}]),
           rendered_reply(SEED, [{"name": "get_weather", "arguments": {"unit": "celsius"}}]),
           replies[0][:replies[0].rindex("</seed:tool_call>")]]
    got = TC.decide(test_grammar, "ebnf", grammar(1, 0), bad)
    check(all(g != "complete" for g in got), f"Seed-OSS: an undeclared function, a required key missing, a call not "
          f"closed are not complete: {got}")


def grammar_oracle(template, tool_stream, test_grammar, work):
    """The grammar against the template's renderings: complete under the required grammar (and
    what follows the first <tool_call> under the lazy one); mutations not."""
    def grammar(only, parallel, lazy):
        out = TC.subprocess.run([tool_stream, f"--{FORMATS[template][0]}-grammar", json.dumps(DECLARED), only,
                                 str(parallel), str(lazy)], capture_output=True, text=True, timeout=60)
        path = work / f"xml-{only}-{parallel}-{lazy}.gbnf"
        path.write_text(out.stdout)
        return path

    def decide(path, texts):
        return TC.decide(test_grammar, "ebnf", path, texts)

    _, _, _, marker, block_end = FORMATS[template]
    replies = [rendered_reply(template, calls) for calls in CALLS]
    replies.append(rendered_reply(template, [{"name": "b", "arguments": {"y": "<p>a</p>\nline </paramete <<"}}]))
    got = decide(grammar("", 1, 0), replies)
    check(got == ["complete"] * len(replies), f"{template.name}: the grammar (required, parallel) completes the "
          f"template's {len(replies)} renderings: {got}")
    got = decide(grammar("", 1, 1), [r[r.index(marker) + len(marker):] for r in replies])
    check(got == ["complete"] * len(replies), f"{template.name}: the lazy grammar completes what follows each "
          f"rendering's first {marker}: {got}")
    one = replies[0]

    def weather(args, name="get_weather"):
        return rendered_reply(template, [{"name": name, "arguments": args}])
    bad = {"an undeclared key": weather({"city": "Paris", "units": "celsius"}),
           "an undeclared function": weather({"city": "Paris"}, "get_wether"),
           "an enum value not in it": weather({"city": "Paris", "unit": "kelvin"}),
           "a required key missing": rendered_reply(template, [{"name": "get_weather", "arguments": {"unit": "celsius"}}]),
           "an integer that is not one": rendered_reply(template, [{"name": "search", "arguments": {"query": "q", "limit": "5x"}}]),
           "a boolean that is not one": rendered_reply(template, [{"name": "search", "arguments": {"query": "q", "exact": "yes"}}]),
           "arguments for a function without any": rendered_reply(template, [{"name": "c", "arguments": {"x": 1}}]),
           "a call not closed": one[:one.rindex(block_end)]}
    got = decide(grammar("", 1, 0), list(bad.values()))
    check(all(g != "complete" for g in got), f"{template.name}: mutated renderings are not complete: {dict(zip(bad, got))}")
    if FORMATS[template][0] == "qwen-xml":
        # Under auto the grammar reads the marker that came (engine.h TRIGGER_READS_MARKER): a block
        # from its <tool_call>, or the calls bare, <function=...>...</function> (as llama.cpp reads
        # them), which the parser reads back as the same calls.
        def bare(r):
            return re.sub(r"<tool_call>\n(.*?)\n</tool_call>", r"\1", r[r.index(marker):], flags=re.S)
        bares = [bare(r) for r in replies]
        got = decide(grammar("", 1, 2), [r[r.index(marker):] for r in replies] + bares)
        check(got == ["complete"] * (2 * len(replies)), f"{template.name}: the auto grammar (two markers) completes "
              f"each rendering from its {marker} and its calls bare: {got}")
        got = decide(grammar("", 1, 2), [bare(v) for v in bad.values() if marker in v] + [bares[0][:-3]])
        check(all(g != "complete" for g in got), f"{template.name}: the auto grammar: mutated bare calls are not complete: {got}")
        got = decide(grammar("", 0, 2), [bares[0], bares[3]])
        check(got == ["complete", "reject"], f"{template.name}: the auto grammar, one call only: one bare call "
              f"complete, three not: {got}")
        rc, back = TC.parse_back(tool_stream, "--parse-qwen-xml", work / "bare_replies.txt", bares, DECLARED)
        check(rc == 0 and len(back) == len(CALLS) + 1 and
              all(TC.same_calls(c, b) for c, b in zip(CALLS, back)),
              f"{template.name}: the bare calls parse back to the rendered ones")
    got = decide(grammar("", 0, 0), [replies[0], replies[3]]) + decide(grammar("b", 1, 0), [replies[0], replies[3]])
    check(got == ["complete", "reject", "reject", "reject"],
          f"{template.name}: one call only: one call complete, three not; named b: neither: {got}")


ASK = [{"role": "user", "content": "Add one and twenty, please."}]


# Per served template: a key its format cannot write back, and what the 400s name (the key's format,
# strict's format).
REFUSALS = {CODER: ("a>b", "qwen3-coder", "Qwen3-Coder"), QWEN35: ("a>b", "qwen3-coder", "Qwen3-Coder"),
            DS32: ('say "x"', "deepseek-v3.2", "DSML"), SEED: ("a>b", "seed-oss", "Seed-OSS")}


def served(srv, oa, mid, template, label, thinking):
    kw = {"extra_body": {"chat_template_kwargs": {"enable_thinking": False}}} if thinking else {}

    def ask(**k):
        return oa.chat.completions.create(model=mid, messages=ASK, tools=TYPED, **dict(dict(kw, max_tokens=200), **k))

    # The prompt with tools is jinja2's (its length through /v1/completions of jinja2's text).
    r = ask(tool_choice="auto", max_tokens=1, temperature=0)
    comp = oa.completions.create(model=mid, prompt=py_prompt(template, ASK, TYPED, **({"enable_thinking": False}
                                                                                     if thinking else {})),
                                 max_tokens=1, temperature=0)
    check(r.usage.prompt_tokens == comp.usage.prompt_tokens,
          f"{label}: the prompt with tools renders as jinja2's ({r.usage.prompt_tokens} vs {comp.usage.prompt_tokens})")
    for choice, parallel in (("required", True), ("required", False), ({"type": "function", "function": {"name": "add"}}, True)):
        named = choice["function"]["name"] if isinstance(choice, dict) else None
        bad, n_calls = [], 0
        for seed in range(4):
            ch = ask(tool_choice=choice, parallel_tool_calls=parallel, temperature=1.0, seed=seed).choices[0]
            tcs = ch.message.tool_calls or []
            n_calls += len(tcs)
            # (SmolLM2 may repeat parallel calls to max_tokens: the whole ones are then kept)
            if (ch.finish_reason not in (("tool_calls", "length") if parallel else ("tool_calls",)) or not tcs
                    or (not parallel and len(tcs) != 1)
                    or any(not conforms(t, TYPED) or (named and t.function.name != named) for t in tcs)):
                bad.append((seed, ch.finish_reason, [(t.function.name, t.function.arguments) for t in tcs]))
        check(not bad, f"{label}: tool_choice {json.dumps(choice)[:50]}, parallel {parallel}: 4 sampled replies, "
              f"calls ({n_calls}) of {named or 'the declared tools'} with the declared keys and value types"
              + ("" if not bad else f": {bad[:2]}"))
    # auto: free text until the model writes <tool_call>, then held to the calls (a lazy grammar).
    r = ask(tool_choice="auto", temperature=1.0, seed=1, n=4)
    check(all(c.finish_reason in ("stop", "length", "tool_calls") for c in r.choices) and
          all(conforms(t, TYPED) for c in r.choices for t in c.message.tool_calls or []),
          f"{label}: tool_choice auto, n 4: answered, any calls conform "
          f"({[(c.finish_reason, len(c.message.tool_calls or [])) for c in r.choices]})")
    one = dict(tool_choice="required", parallel_tool_calls=False, temperature=1.0, seed=5)
    whole = ask(**one).choices[0].message.tool_calls or []
    got, finish, _, _, _ = stream_calls(ask(stream=True, **one))
    want = [(t.function.name, t.function.arguments) for t in whole]
    check(whole and got == want and finish == "tool_calls", f"{label}: the streamed calls equal the unary ones ({got})")
    # The tool loop: the history with the call and its result renders as jinja2's.
    m = ask(tool_choice="required", parallel_tool_calls=False, temperature=0).choices[0].message
    if m.tool_calls:
        history = ASK + [m.model_dump(exclude_none=True)] + [
            {"role": "tool", "tool_call_id": c.id, "content": "21"} for c in m.tool_calls]
        r = oa.chat.completions.create(model=mid, messages=history, tools=TYPED, max_tokens=1, temperature=0, **kw)
        comp = oa.completions.create(model=mid, prompt=py_prompt(template, history, TYPED, **(
            {"enable_thinking": False} if thinking else {})), max_tokens=1, temperature=0)
        check(r.usage.prompt_tokens == comp.usage.prompt_tokens, f"{label}: a history with a call and its result "
              f"renders as jinja2's ({r.usage.prompt_tokens} vs {comp.usage.prompt_tokens})")
    else:
        check(False, f"{label}: a greedy required call to build the history from")
    # A declared string that looks like a number (an enum of strings: the grammar writes one as
    # it is) comes back as a string, over HTTP and over gRPC Chat alike.
    codes = [{"type": "function", "function": {"name": "lookup", "parameters": {
        "type": "object", "properties": {"code": {"enum": ["42", "7"]}, "n": {"type": "integer", "enum": [3]}},
        "required": ["code", "n"]}}}]
    # (max_tokens: DSML's tags take SmolLM2 about 80 tokens for this call)
    kc = dict(dict(kw, max_tokens=160, temperature=0, tool_choice="required", parallel_tool_calls=False))
    h = oa.chat.completions.create(model=mid, messages=ASK, tools=codes, **kc)
    hc = h.choices[0].message.tool_calls or []
    check(len(hc) == 1 and json.loads(hc[0].function.arguments) in ({"code": "42", "n": 3}, {"code": "7", "n": 3}),
          f"{label}: a declared string enum value comes back a string, an integer an integer: "
          f"{[t.function.arguments for t in hc]}")
    with srv.client() as c:
        g = c.chat(ASK, tools=codes, **{k: v for k, v in kc.items() if k != "extra_body"},
                   **({"chat_template_kwargs": {"enable_thinking": False}} if thinking else {}))
        want = TG.http_parts(h.choices[0].message, h.choices[0].finish_reason)
        check(TG.grpc_parts(g) == want, f"{label}: gRPC Chat's call equals HTTP's ({TG.grpc_parts(g)} vs {want})")
    # A key the format cannot write back (Qwen's tag ends at '>', DSML's name at '"') is refused by name.
    key, fmt, strict_fmt = REFUSALS[template]
    try:
        oa.chat.completions.create(model=mid, messages=ASK, max_tokens=4, tools=[{"type": "function", "function": {
            "name": "f", "parameters": {"type": "object", "properties": {key: {"type": "string"}}}}}])
        check(False, f"{label}: the key {key!r} is refused")
    except openai.BadRequestError as e:
        check(key in str(e) and fmt in str(e), f"{label}: the key {key!r} is a 400: {str(e)[:140]}")
    strict = [{"type": "function", "function": dict(TYPED[0]["function"], strict=True)}]
    try:
        oa.chat.completions.create(model=mid, messages=ASK, tools=strict, max_tokens=4)
        check(False, f"{label}: strict: true is refused")
    except openai.BadRequestError as e:
        check("strict" in str(e) and strict_fmt in str(e), f"{label}: strict: true is a 400: {str(e)[:100]}")


def history_prompts(oa, mid, template, label):
    """A template's prompts: with tools, and a history with two calls and their results, as jinja2
    renders them (the same length through /v1/completions of jinja2's text). MiniMax-M2: the reply
    opens inside <think> (the template writes it); the others: a required call conforms."""
    call = [{"id": "call_1", "type": "function", "function": {"name": "add", "arguments": json.dumps({"a": 1, "b": "half"})}},
            {"id": "call_2", "type": "function", "function": {"name": "ping", "arguments": "{}"}}]
    history = ASK + [{"role": "assistant", "content": "", "tool_calls": call},
                     {"role": "tool", "tool_call_id": "call_1", "content": "21"},
                     {"role": "tool", "tool_call_id": "call_2", "content": "pong"}]
    for what, msgs in (("the prompt with tools", ASK), ("a history with two calls and their results", history)):
        r = oa.chat.completions.create(model=mid, messages=msgs, tools=TYPED, max_tokens=4, temperature=0)
        comp = oa.completions.create(model=mid, prompt=py_prompt(template, msgs, TYPED), max_tokens=1, temperature=0)
        check(r.usage.prompt_tokens == comp.usage.prompt_tokens,
              f"{label}: {what} renders as jinja2's ({r.usage.prompt_tokens} vs {comp.usage.prompt_tokens})")
        if template == MINIMAX:
            check(r.choices[0].message.content in (None, "") and (r.choices[0].message.model_extra or {}).get(
                "reasoning_content"), f"{label}: after {what} the reply is reasoning")
        else:
            ch = oa.chat.completions.create(model=mid, messages=msgs, tools=TYPED, max_tokens=200, temperature=0,
                                            tool_choice="required", parallel_tool_calls=False).choices[0]
            tcs = ch.message.tool_calls or []
            check(ch.finish_reason == "tool_calls" and len(tcs) == 1 and conforms(tcs[0], TYPED),
                  f"{label}: after {what} a required call conforms "
                  f"({ch.finish_reason}, {[(t.function.name, t.function.arguments) for t in tcs]})")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shardlm", required=True)
    ap.add_argument("--tool-stream", required=True)
    ap.add_argument("--test-grammar", required=True)
    ap.add_argument("--gguf", required=True)
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="shardlm-xml-tools-"))
    try:
        for template in (CODER, QWEN35, MINIMAX, DS32, DS4):
            round_trip(template, a.tool_stream, work)
            grammar_oracle(template, a.tool_stream, a.test_grammar, work)
        seed_checks(a.tool_stream, a.test_grammar, work)
        if not os.path.exists(a.gguf):
            print(f"SKIP: served: no SmolLM2 GGUF at {a.gguf} (tools/fetch_smollm2.sh)")
            return check.summary()
        mid = Path(a.gguf).name
        for template, label, thinking in ((CODER, "Qwen3-Coder", False), (QWEN35, "Qwen3.5", True),
                                          (DS32, "DeepSeek-V3.2", False), (SEED, "Seed-OSS", False)):
            fmt = REFUSALS[template][1]
            with TS.Server(a.shardlm, Path(a.gguf), "--chat-template", str(template), "--no-prefix-caching",
                           name=f"tools-{label}", http=True) as srv:
                log = srv.log_path.read_text()
                check(f"tool calls in the {fmt} format" in log and (not thinking or "reasoning split from <think>" in log),
                      f"{label}: read as the {fmt} format" + (" with <think> reasoning" if thinking else ""))
                oa = openai.OpenAI(base_url=srv.base + "/v1", api_key="none", max_retries=0, timeout=300)
                served(srv, oa, mid, template, label, thinking)
        with TS.Server(a.shardlm, Path(a.gguf), "--chat-template", str(MINIMAX), "--no-prefix-caching",
                       name="tools-minimax", http=True) as srv:
            log = srv.log_path.read_text()
            check("tool calls in the minimax-m2 format" in log and "reasoning split from <think>" in log,
                  "MiniMax-M2: read as the minimax-m2 format with <think> reasoning")
            oa = openai.OpenAI(base_url=srv.base + "/v1", api_key="none", max_retries=0, timeout=300)
            history_prompts(oa, mid, MINIMAX, "MiniMax-M2")
            try:
                oa.chat.completions.create(model=mid, messages=ASK, max_tokens=4, tools=[{"type": "function", "function": {
                    "name": "f", "parameters": {"type": "object", "properties": {"say \"x\"": {"type": "string"}}}}}])
                check(False, "MiniMax-M2: a key holding '\"' is refused")
            except openai.BadRequestError as e:
                check("minimax-m2" in str(e), f"MiniMax-M2: a key holding '\"' is a 400: {str(e)[:140]}")
            strict = [{"type": "function", "function": dict(TYPED[0]["function"], strict=True)}]
            try:
                oa.chat.completions.create(model=mid, messages=ASK, tools=strict, max_tokens=4)
                check(False, "MiniMax-M2: strict: true is refused")
            except openai.BadRequestError as e:
                check("strict" in str(e) and "MiniMax-M2's" in str(e), f"MiniMax-M2: strict: true is a 400: {str(e)[:100]}")
        # DeepSeek V4: V3.2's calls in another block, its own history (tool results in the user's
        # turn): the prompts and a required call
        with TS.Server(a.shardlm, Path(a.gguf), "--chat-template", str(DS4), "--no-prefix-caching",
                       name="tools-deepseek-v4", http=True) as srv:
            check("tool calls in the deepseek-v4 format" in srv.log_path.read_text(), "DeepSeek-V4: read as the deepseek-v4 format")
            oa = openai.OpenAI(base_url=srv.base + "/v1", api_key="none", max_retries=0, timeout=300)
            history_prompts(oa, mid, DS4, "DeepSeek-V4")
            # Its template writes the reply's schema into the system prompt (`response_format`, as
            # llama.cpp gives it): the request's JSON Schema, {"type": "object"} in JSON object mode.
            schema = {"type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"]}
            plain = oa.chat.completions.create(model=mid, messages=ASK, max_tokens=1, temperature=0).usage.prompt_tokens
            for rf, given in (({"type": "json_schema", "json_schema": {"name": "a", "schema": schema}}, schema),
                              ({"type": "json_object"}, {"type": "object"})):
                r = oa.chat.completions.create(model=mid, messages=ASK, response_format=rf, max_tokens=1, temperature=0)
                comp = oa.completions.create(model=mid, prompt=py_prompt(DS4, ASK, None, response_format=given),
                                             max_tokens=1, temperature=0)
                check(r.usage.prompt_tokens == comp.usage.prompt_tokens > plain,
                      f"DeepSeek-V4: response_format {rf['type']}: the prompt holds the schema as jinja2 writes it "
                      f"({r.usage.prompt_tokens} vs {comp.usage.prompt_tokens}; {plain} without)")
    except Exception as e:  # noqa: BLE001 - reported with the server logs
        check(False, f"{e}")
        TS.show_logs()
    finally:
        TS.kill_all()
        shutil.rmtree(work, ignore_errors=True)
    return check.summary()


if __name__ == "__main__":
    sys.exit(main())
