#!/usr/bin/env python3
"""Speculative decoding with LoRA adapters (issue 29: "works with ... LoRA adapters";
docs/speculative.md). Target: stories260K served with two adapters written by this test (random A
and B, so that each changes the output: a1 on every projection at rank 4, a2 on q and v at rank 2);
requests name a1, a2 or none. The drafts never see an adapter (prompt lookup reads tokens; a draft
model and an EAGLE head are models of their own), while the target verifies every row under its
request's adapter, so a draft made for the base is rejected where the adapter changes the next token.

Greedy: every (prompt, adapter) pair's tokens equal the server's without speculation, one request
at a time and all 24 at once (the three adapters mixed in every step: stories260K's f32 rows and
the adapters' products do not depend on the batch), with prompt lookup, with the base model as its
own draft, and with an EAGLE head (test_speculative_eagle's, random); each speculative server must
have verified drafts and accepted some, and with the base as draft have rejected some (the adapters'
tokens). The adapters must change the output (else nothing here would test them).

  test_speculative_lora.py --shardlm BUILD/cli/shardlm --model BUILD/golden/stories260K
SKIP (77) without the model, numpy or the Python client.
"""
import argparse
import concurrent.futures as cf
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
sys.path.insert(0, str(HERE.parents[1] / "tools"))
import test_server as TS  # noqa: E402
from checks import Checks  # noqa: E402

check = Checks()
PROMPTS = ["Once upon a time", "The little dog", "Lily and Ben went to the park", "Tom had a red ball. Tom had a red",
           "One day, a girl named Sue", "The sun was hot and the sky", "Bob and his mom went to the store to buy",
           "The cat sat on the"]
ADAPTERS = [None, "a1", "a2"]
ALL = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def greedy(srv, n_parallel):
    """{(prompt index, adapter): token ids} over every prompt and adapter."""
    jobs = [(i, ad) for ad in ADAPTERS for i in range(len(PROMPTS))]

    def one(job):
        i, ad = job
        kw = dict(max_tokens=40 + 7 * (i % 4), temperature=0)
        if ad:
            kw["adapter"] = ad
        with srv.client(timeout=120) as c:
            return job, tuple(c.generate(PROMPTS[i], **kw).token_ids)
    with cf.ThreadPoolExecutor(n_parallel) as ex:
        return dict(ex.map(one, jobs))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shardlm", required=True)
    ap.add_argument("--model", required=True)
    a = ap.parse_args()
    if not os.path.isdir(a.model):
        print(f"SKIP: no model at {a.model}")
        return SKIP
    try:
        import numpy as np
    except ImportError:
        print("SKIP: no numpy")
        return SKIP
    from make_draft import write_safetensors
    from test_speculative_eagle import make_head
    from test_models import write_random_adapter
    tmp = Path(tempfile.mkdtemp(prefix="shardlm-spec-lora-"))
    cfg = json.loads((Path(a.model) / "config.json").read_text())
    write_random_adapter(tmp / "a1", Path(a.model), rank=4, alpha=8, seed=11, modules=ALL, scale=0.3)
    write_random_adapter(tmp / "a2", Path(a.model), rank=2, alpha=4, seed=12, scale=0.3)
    write_safetensors(tmp / "head.safetensors", make_head(np, cfg), {"rope_style": "halves", "format": "eagle-1"})
    lora = ["--lora", f"a1={tmp / 'a1'}", "--lora", f"a2={tmp / 'a2'}", "--max-seqs", "32"]
    spec = ["--spec-draft", "4", "--spec-max-batch", "32"]
    modes = [("prompt lookup", ["--speculative", "ngram"]), ("the base as its own draft", ["--draft-model", a.model]),
             ("an EAGLE head", ["--speculative", "eagle", "--draft-model", str(tmp / "head.safetensors")])]
    runs = []
    try:
        with TS.Server(a.shardlm, Path(a.model), *lora, name="spec-lora-off") as srv:
            base = (greedy(srv, 1), greedy(srv, 24))
        for k, (name, flags) in enumerate(modes):
            with TS.Server(a.shardlm, Path(a.model), *lora, *flags, *spec, name=f"spec-lora{k}",
                           env=dict(os.environ, SHARDLM_SPEC_PRIOR="0")) as srv:
                got = (greedy(srv, 1), greedy(srv, 24))
                with srv.client(timeout=60) as c:
                    st = c.server_stats()
            runs.append((name, got, st))
        # A learned corpus keeps each adapter's answers to it (the scope is the owner and the adapter):
        # a1's answer never drafts for a2 or the base; a1's repeat is drafted from it.
        learn = ["--speculative", "ngram", "--spec-corpus-learn", "1000000"]
        with TS.Server(a.shardlm, Path(a.model), *lora, *learn, *spec, name="spec-lora-learn") as srv, \
                srv.client(timeout=60) as c:
            def corpus_drafts(adapter):
                before = c.server_stats().spec_corpus_draft_tokens
                kw = dict(adapter=adapter) if adapter else {}
                c.generate(PROMPTS[4], max_tokens=60, temperature=0, **kw)
                return c.server_stats().spec_corpus_draft_tokens - before
            scoped = [corpus_drafts(ad) for ad in ("a1", "a2", None, "a1")]
    finally:
        TS.kill_all()
    n = len(PROMPTS)
    changed = {ad: sum(base[0][(i, ad)] != base[0][(i, None)] for i in range(n)) for ad in ("a1", "a2")}
    check(all(v >= n // 2 for v in changed.values()),
          f"the adapters change the output: a1 on {changed['a1']}, a2 on {changed['a2']} of {n} prompts (>= {n // 2})")
    same = sum(base[0][k] == base[1][k] for k in base[0])
    check(same == len(base[0]), f"without speculation: 24 at once equal one at a time ({same} of {len(base[0])})")
    check(scoped[:3] == [0, 0, 0] and scoped[3] > 20,
          f"a learned corpus by adapter: a1's answer drafts for a1's repeat ({scoped[3]} corpus drafts), never for a2 or "
          f"the base ({scoped[1]}, {scoped[2]})")
    for name, got, st in runs:
        for b, label in enumerate(("one at a time", "24 at once")):
            bad = [k for k in base[0] if got[b][k] != base[0][k]]
            check(not bad, f"{name}, {label}: greedy tokens of every (prompt, adapter) equal to the server without "
                  f"speculation ({len(base[0]) - len(bad)} of {len(base[0])}; differing: {bad[:4]})")
        msg = f"{name}: {st.spec_draft_tokens} drafts verified, {st.spec_accepted_tokens} accepted"
        if name.startswith("the base"):
            check(0 < st.spec_accepted_tokens < st.spec_draft_tokens, msg + " (some accepted, some rejected)")
        else:
            check(st.spec_draft_tokens > 0 and st.spec_accepted_tokens > 0, msg + " (some accepted)")
    return check.summary()


if __name__ == "__main__":
    sys.exit(main())
