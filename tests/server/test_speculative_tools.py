#!/usr/bin/env python3
"""Speculative decoding of tool-calling requests (issue 29 with issue 28's tools; docs/speculative.md
"Structured outputs"): SmolLM2-135M-Instruct with the hermes tools of test_tools_native.py over
gRPC Chat, greedy, on a server without speculation, with prompt lookup and with the model as its
own draft (every sequence drafting: SHARDLM_SPEC_PRIOR=0). tool_choice required and a named
function constrain the whole answer; auto is a lazy constraint, off until the model writes the
call's trigger, then on (drafts made before it are not masked; the target's rows are): the
token ids, the parsed content and tool calls and the finish reason of every case must equal the
server's without speculation, and both speculative servers must have verified drafts, the model
as its own draft nearly all accepted.

  test_speculative_tools.py --shardlm BUILD/cli/shardlm --gguf .cache/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
SKIP (77) without the GGUF, jsonschema or the Python client.
"""
import argparse
import os
import sys
from pathlib import Path

SKIP = 77
sys.dont_write_bytecode = True
sys.path.insert(0, str(Path(__file__).resolve().parent))
try:
    import jsonschema  # noqa: F401  (test_tools_native imports it)
except ImportError as e:
    print(f"SKIP: a test dependency cannot be imported ({e}); run tools/install_deps.sh")
    sys.exit(SKIP)
import test_server as TS  # noqa: E402
import tools_grpc as TG  # noqa: E402
from checks import Checks  # noqa: E402
from test_speculative_draft import stats  # noqa: E402
from test_tools_native import ASK, TOOLS  # noqa: E402

check = Checks()

CALL = {"id": "call_abc123def", "type": "function",
        "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\", \"unit\": \"celsius\"}"}}
HISTORY = ASK + [{"role": "assistant", "content": None, "tool_calls": [CALL]},
                 {"role": "tool", "tool_call_id": CALL["id"], "content": "{\"temperature\": 21}"}]
CASES = [("required", ASK, dict(tool_choice="required", parallel_tool_calls=False)),
         ("required, parallel", ASK, dict(tool_choice="required")),
         ("named", ASK, dict(tool_choice={"type": "function", "function": {"name": "get_time"}})),
         ("auto", ASK, dict(tool_choice="auto")),
         ("auto after a tool result", HISTORY, dict(tool_choice="auto")),
         ("auto, two cities", [{"role": "user", "content": "What is the weather in Paris and in Rome? Use the tools."}],
          dict(tool_choice="auto"))]


def answers(srv):
    out = []
    with srv.client(timeout=300) as c:
        for _, msgs, kw in CASES:
            g = c.chat(msgs, tools=TOOLS, max_tokens=80, temperature=0, **kw)
            out.append((tuple(g.token_ids), TG.grpc_parts(g)))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shardlm", required=True)
    ap.add_argument("--gguf", required=True)
    a = ap.parse_args()
    if not os.path.exists(a.gguf):
        print(f"SKIP: no SmolLM2 GGUF at {a.gguf} (tools/fetch_smollm2.sh)")
        return SKIP
    every = dict(os.environ, SHARDLM_SPEC_PRIOR="0")
    arms = {"prompt lookup": ["--speculative", "ngram"], "the model as its own draft": ["--draft-model", a.gguf]}
    runs = {}
    try:
        with TS.Server(a.shardlm, Path(a.gguf), "--threads", "2", name="tools-off") as srv:
            base = answers(srv)
        for j, (name, flags) in enumerate(arms.items()):
            with TS.Server(a.shardlm, Path(a.gguf), "--threads", "2", *flags, "--spec-draft", "4", name=f"tools-spec-{j}",
                           env=every) as srv:
                runs[name] = (answers(srv), stats(srv))
    finally:
        TS.kill_all()
    called = sum(bool(parts[2]) for _, parts in base)
    lazy = [parts for (case, _, kw), (_, parts) in zip(CASES, base) if kw["tool_choice"] == "auto"]
    check(called >= 3 and any(p[2] for p in lazy),
          f"without speculation: {called} of {len(CASES)} answers call a tool, "
          f"{sum(bool(p[2]) for p in lazy)} of them under tool_choice auto (the lazy constraint's trigger seen)")
    for name, (got, st) in runs.items():
        for (case, _, _), (ids0, parts0), (ids1, parts1) in zip(CASES, base, got):
            check(ids0 == ids1 and parts0 == parts1, f"{name}, {case}: the same {len(ids0)} tokens and parse "
                  f"({parts1[2] or repr(parts1[0][:40])}, {parts1[3]}) as without speculation")
        rate = st.spec_accepted_tokens / max(1, st.spec_draft_tokens)
        msg = f"{name}: {st.spec_draft_tokens} drafts verified, {st.spec_accepted_tokens} accepted ({100 * rate:.1f} %)"
        check(st.spec_draft_tokens > 0 and (rate >= 0.9 or name == "prompt lookup"), msg)
    return check.summary()


if __name__ == "__main__":
    sys.exit(main())
