#!/usr/bin/env python3
"""An EAGLE head beside a sharded target (issue 29; docs/speculative.md "EAGLE heads"): tp 2, pp 2,
and pp 2 in two micro-batches, under mpirun. The head runs whole on the first rank, borrowing a
whole copy of the checkpoint's embeddings and LM head (that rank holds half the vocabulary at tp 2
and no LM head at pp 2); the target's final hidden states, which it reads, come from the last
stage (at pp 2 the last stage sends them to the first rank beside the logits); also tp 2 x pp 2
(4 ranks) and dp 2 (each replica's first rank loads its own head; tokens only). Target:
stories260K; the head written as in test_speculative_eagle.py (its fc fitted to the target's own
greedy text, so that drafts are accepted and rejected).

1. Every proposal (SHARDLM_EAGLE_TRACE) against the float64 NumPy reference of target and head
   (test_speculative_eagle.Reference): the same best token, its logit within a relative 1e-5; both
   kinds of rows present (a step's first draft, drafts after drafts). Features that were missing,
   another row's, or a shard's would fail it.
2. Greedy tokens of the 8 prompts, one at a time and 8 at once, equal to the server without
   speculation at tp 1 (stories260K's f32 rows do not depend on the batch); drafts verified, some
   accepted, some rejected. The micro-batched server runs with the prefix cache on, the prompts
   twice (the second round's prompts partly from the cache, their features kept beside the blocks).

  test_speculative_eagle_parallel.py --shardlm BUILD/cli/shardlm --model BUILD/golden/stories260K
SKIP (77) without the model, mpirun, numpy or the Python client.
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
sys.path.insert(0, str(HERE.parents[1] / "tools"))
import test_server as TS  # noqa: E402
from checks import Checks  # noqa: E402
from test_speculative_eagle import PROMPTS, check_trace, fitted_head, greedy  # noqa: E402

check = Checks()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shardlm", required=True)
    ap.add_argument("--model", required=True)
    a = ap.parse_args()
    if not os.path.isdir(a.model):
        print(f"SKIP: no model at {a.model}")
        return SKIP
    if not shutil.which("mpirun"):
        print("SKIP: no mpirun")
        return SKIP
    try:
        import numpy as np
    except ImportError:
        print("SKIP: no numpy")
        return SKIP
    tmp = Path(tempfile.mkdtemp(prefix="shardlm-eagle-par-"))
    base, head, ref = fitted_head(np, a.shardlm, a.model, tmp, name="eagle-par-off")
    eagle = ["--speculative", "eagle", "--draft-model", str(head), "--spec-draft", "3",
             "--spec-max-batch", "64", "--max-seqs", "64"]
    # (name, layout flags, ranks, prefix caching, rounds of 8 at once, traced); dp 2 is not traced
    # (two processes would append to one file)
    cases = [("tp 2", ["--tp", "2"], 2, False, 1, True), ("pp 2", ["--pp", "2"], 2, False, 1, True),
             ("pp 2, two micro-batches, prefix cache on", ["--pp", "2", "--pp-microbatches", "2"], 2, True, 2, True),
             ("tp 2 x pp 2", ["--tp", "2", "--pp", "2"], 4, False, 1, True),
             ("dp 2 (a head per replica)", ["--dp", "2"], 2, False, 1, False)]
    runs = []
    try:
        for k, (name, layout, ranks, prefix, rounds, traced) in enumerate(cases):
            trace = tmp / f"trace{k}.txt" if traced else None
            env = dict(os.environ, SHARDLM_SPEC_PRIOR="0", **({"SHARDLM_EAGLE_TRACE": str(trace)} if traced else {}))
            flags = [*layout, *eagle, *([] if prefix else ["--no-prefix-caching"])]
            launcher = ("mpirun", "--oversubscribe", "-n", str(ranks))
            with TS.Server(a.shardlm, Path(a.model), *flags, name=f"eagle-par{k}", launcher=launcher, env=env) as srv:
                got = [greedy(srv, 1)] + [greedy(srv, 8) for _ in range(rounds)]
                with srv.client(timeout=60) as c:
                    st = c.server_stats()
            runs.append((name, got, st, trace))
    finally:
        TS.kill_all()
    for name, got, st, trace in runs:
        want = [base[0]] + [base[1]] * (len(got) - 1)
        same = sum(x == y for g, w in zip(got, want) for x, y in zip(g, w))
        check(got == want, f"{name}: greedy tokens equal to tp 1 without speculation ({same} of "
              f"{len(PROMPTS) * len(got)})")
        check(st.spec_draft_tokens > 0 and 0 < st.spec_accepted_tokens < st.spec_draft_tokens,
              f"{name}: {st.spec_draft_tokens} drafts verified, {st.spec_accepted_tokens} accepted (some accepted, "
              "some rejected)")
        if "two micro-batches" in name:
            check(st.prefix_cache_hit_tokens > 0, f"{name}: {st.prefix_cache_hit_tokens} prompt tokens from the cache")
        if trace is not None:
            check_trace(check, ref, name, trace)
    return check.summary()


if __name__ == "__main__":
    sys.exit(main())
