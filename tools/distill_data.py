#!/usr/bin/env python3
"""tools/distill_data.py - a draft model's training data from the target's own outputs (issue 29,
sequence-level distillation): the user turns of chat examples (by default the SQuAD training
questions of tools/prepare_chat_data.py's train.jsonl: answers that copy spans of a passage, the
held-out articles never among them) answered greedily by the target model served by shardlm, and
written back in `shardlm train`'s chat format with the target's answers as the assistant turns.

  python3 tools/distill_data.py --shardlm build/cli/shardlm --model FILE.gguf|DIR --out FILE.jsonl
      [--data .cache/chat-data/train.jsonl] [--prefix "Answer the question from the passage"]
      [--n 400] [--skip 0] [--max-tokens 64] [--threads 2] [--parallel 16] [--serve-arg=ARG ...]

--serve-arg passes one more argument to `shardlm serve` (repeat it), e.g. the default chat
model's adapter: --serve-arg=--lora --serve-arg=gemma-3-270m-chat=models/gemma-3-270m-chat
--serve-arg=--default-adapter --serve-arg=gemma-3-270m-chat --serve-arg=--chat-template
--serve-arg=gemma.

Prints how many answers were written, their tokens and the time. Not a test.
"""
import argparse
import concurrent.futures as cf
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "server"))
import test_server as TS  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shardlm", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--data", default=str(ROOT / ".cache" / "chat-data" / "train.jsonl"))
    ap.add_argument("--prefix", default="Answer the question from the passage",
                    help="keep the examples whose first user turn starts with this ('' keeps all)")
    ap.add_argument("--n", type=int, default=400)
    ap.add_argument("--skip", type=int, default=0, help="pass over the first SKIP matching examples (more data after an earlier run)")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--parallel", type=int, default=16)
    ap.add_argument("--serve-arg", action="append", default=[], help="one more argument to shardlm serve (repeat)")
    a = ap.parse_args()
    prompts, seen = [], 0
    for line in open(a.data):
        msgs = json.loads(line)["messages"]
        if msgs and msgs[0]["role"] == "user" and msgs[0]["content"].startswith(a.prefix):
            seen += 1
            if seen > a.skip:
                prompts.append(msgs[0]["content"])
        if len(prompts) == a.n:
            break

    def one(srv, p):
        with srv.client(timeout=600) as c:
            text, n = [], 0
            for ev in c.chat_stream([{"role": "user", "content": p}], max_tokens=a.max_tokens, temperature=0):
                text.append(ev.text)
                n += len(ev.token_ids)
            return "".join(text).strip(), n

    t0 = time.perf_counter()
    try:
        with TS.Server(a.shardlm, Path(a.model), "--threads", str(a.threads), *a.serve_arg, name="distill") as srv:
            with cf.ThreadPoolExecutor(a.parallel) as ex:
                answers = list(ex.map(lambda p: one(srv, p), prompts))
    finally:
        TS.kill_all()
    with open(a.out, "w") as f:
        for p, (ans, _) in zip(prompts, answers):
            if ans:
                f.write(json.dumps({"messages": [{"role": "user", "content": p},
                                                 {"role": "assistant", "content": ans}]}) + "\n")
    kept = sum(1 for ans, _ in answers if ans)
    print("distill_data: %d of %d answers written to %s (%d tokens generated) in %.0f s by %s"
          % (kept, len(prompts), a.out, sum(n for _, n in answers), time.perf_counter() - t0, a.model))
    return 0


if __name__ == "__main__":
    sys.exit(main())
