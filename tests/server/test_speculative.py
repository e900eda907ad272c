#!/usr/bin/env python3
"""Prompt-lookup speculative decoding (issue 29, `shardlm serve --speculative ngram`): greedy output
byte-identical to a server without speculation, over stories260K (SentencePiece, f32) and
SmolLM2-135M-Instruct (byte-level BPE, a GGUF served as quantized blocks) when its file is there:
one request at a time and 16 at once (the drafts verified inside the continuous batch; SmolLM2's
blocks one at a time only: see compare), with
stop strings and max_tokens that end a sample in the middle of accepted drafts, beside sampled
and penalised requests that never draft, and at tp 2 under mpirun. GetServerStats must show
drafts verified and accepted (the test fails if speculation never ran).

  test_speculative.py --shardlm BUILD/cli/shardlm --model DIR [--gguf SMOLLM2.gguf]
SKIP (77) without the model or the Python client.
"""
import argparse
import concurrent.futures as cf
import os
import shutil
import sys
from pathlib import Path

SKIP = 77
sys.dont_write_bytecode = True
sys.path.insert(0, str(Path(__file__).resolve().parent))
import test_server as TS  # noqa: E402
from checks import Checks  # noqa: E402

check = Checks()


PROMPTS = ["Once upon a time", "The little dog", "Lily and Ben went to the park", "Tom had a red ball. Tom had a red",
           "She said: I like the cat. The cat said: I like", "One day, a girl named Sue", "The sun was hot and the sky",
           "Bob and his mom went to the store to buy"]


def answers(srv, chat, n_parallel):
    """Every prompt, greedy, as (text, finish) pairs; n_parallel requests in flight at once."""
    def one(i):
        p = PROMPTS[i % len(PROMPTS)]
        kw = dict(max_tokens=60 + 17 * (i % 5), temperature=0)
        if i % 3 == 1:
            kw["stop"] = [" the "]  # a stop string that lands in the middle of drafted text
        with srv.client(timeout=120) as c:
            g = c.chat([{"role": "user", "content": p}], **kw) if chat else c.generate(p, **kw)
            return g.text, g.finish_reason
    with cf.ThreadPoolExecutor(n_parallel) as ex:
        return list(ex.map(one, range(16)))


def others(srv, chat):
    """Requests that never draft (sampled, penalised) beside the greedy ones: their output with a
    seed must not change either."""
    out = []
    with srv.client(timeout=120) as c:
        for kw in (dict(temperature=0.8, seed=5), dict(temperature=0, repetition_penalty=1.3),
                   dict(temperature=0, presence_penalty=0.5)):
            p = [{"role": "user", "content": PROMPTS[0]}]
            g = c.chat(p, max_tokens=40, **kw) if chat else c.generate(PROMPTS[0], max_tokens=40, **kw)
            out.append(g.text)
    return out


def compare(a, model, name, chat, launcher=(), extra=(), batch=True):
    """batch False: a model whose logits depend on how many rows a step holds (a GGUF's blocks: under
    32 rows int8 products, from 32 on dequantized ones, docs/quantization.md) is compared one request
    at a time only, where a step holds its one row plus its drafts (under 32)."""
    runs = {}
    for spec in (False, True):
        args = list(extra) + (["--speculative", "ngram", "--spec-draft", "4", "--spec-max-batch", "16"] if spec else [])
        with TS.Server(a.shardlm, Path(model), *args, name=name + ("-spec" if spec else ""), launcher=launcher) as srv:
            seq, par, oth = answers(srv, chat, 1), answers(srv, chat, 16), others(srv, chat)
            with srv.client(timeout=60) as c:
                st = c.server_stats()
            runs[spec] = (seq, par, oth, st)
    (s0, p0, o0, _), (s1, p1, o1, st) = runs[False], runs[True]
    check(s0 == s1, f"{name}: 16 greedy requests one at a time: identical with speculation "
          f"({sum(x == y for x, y in zip(s0, s1))} of 16 equal)")
    if batch:
        check(p0 == p1, f"{name}: 16 greedy requests at once: identical with speculation "
              f"({sum(x == y for x, y in zip(p0, p1))} of 16 equal)")
        check(s0 == p0, f"{name}: batch invariance without speculation (one at a time = 16 at once)")
    else:
        print(f"note {name}: not batch-invariant without speculation either ({sum(x == y for x, y in zip(s0, p0))} "
              f"of 16 equal at 16 at once): compared one at a time only")
    check(o0 == o1, f"{name}: sampled and penalised requests unchanged (they never draft)")
    check(st.spec_draft_tokens > 0 and 0 < st.spec_accepted_tokens <= st.spec_draft_tokens,
          f"{name}: speculation ran: {st.spec_draft_tokens} draft tokens, {st.spec_accepted_tokens} accepted")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shardlm", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--gguf", default=None)
    a = ap.parse_args()
    if not os.path.isdir(a.model):
        print(f"SKIP: no model at {a.model}")
        return SKIP
    try:
        compare(a, a.model, "stories260K", chat=False)
        if shutil.which("mpirun"):
            os.environ.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                              OMPI_MCA_rmaps_base_oversubscribe="1", OMPI_MCA_btl_vader_single_copy_mechanism="none")
            compare(a, a.model, "stories260K tp 2", chat=False, launcher=["mpirun", "--oversubscribe", "-n", "2"],
                    extra=["--tp", "2"])
        else:
            print("SKIP tp 2: no mpirun")
        if a.gguf and os.path.exists(a.gguf):
            compare(a, a.gguf, "SmolLM2 chat", chat=True, batch=False)
        else:
            print("SKIP SmolLM2: no GGUF (tools/fetch_smollm2.sh)")
    finally:
        TS.kill_all()
    return check.summary()


if __name__ == "__main__":
    sys.exit(main())
