#!/usr/bin/env python3
"""Speculative decoding with a draft model at tp 2 and pp 2 (issue 29; docs/speculative.md "Draft
models"). The draft runs on the first rank of the replica only, where the sampler runs; the other
ranks see its drafts only as rows of the step plan. Target: stories260K; draft: stories260K cut to
its first 2 layers (written by test_speculative_draft.draft_copy), so that drafts are both accepted
and rejected, at tp 2 and pp 2; and the target itself (every draft accepted) at pp 2. Greedy tokens of every prompt, one request at a time and 8 at once, must equal those
of the same model served without speculation at tp 1 (stories260K's f32 rows do not depend on the
rest of the batch); the server's counters must show drafts verified, some accepted and some
rejected. A draft with another vocabulary is still refused at tp 2, naming both sizes.

  test_speculative_draft_parallel.py --shardlm BUILD/cli/shardlm --model BUILD/golden/stories260K [--other-vocab GGUF]
SKIP (77) without the model, mpirun, numpy or the Python client.
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

SKIP = 77
sys.dont_write_bytecode = True
sys.path.insert(0, str(Path(__file__).resolve().parent))
import test_server as TS  # noqa: E402
from checks import Checks  # noqa: E402
from test_speculative_draft import PROMPTS, draft_copy, greedy, stats  # noqa: E402

check = Checks()
MPI = ("mpirun", "--oversubscribe", "-n", "2")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shardlm", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--other-vocab")
    a = ap.parse_args()
    if not os.path.isdir(a.model):
        print(f"SKIP: no model at {a.model}")
        return SKIP
    if not shutil.which("mpirun"):
        print("SKIP: no mpirun")
        return SKIP
    try:
        import numpy  # noqa: F401
    except ImportError:
        print("SKIP: no numpy")
        return SKIP
    tmp = Path(tempfile.mkdtemp(prefix="shardlm-draft-par-"))
    small = tmp / "stories260K-2layers"
    draft_copy(Path(a.model), small, 2)
    spec = ["--spec-draft", "4", "--spec-max-batch", "8", "--max-seqs", "16"]
    # (split, draft): the 2-layer draft (mostly rejected) at tp 2 and pp 2, the target itself
    # (always accepted: several drafts committed per step) at pp 2.
    cases = [("tp", "the 2-layer model", small), ("pp", "the 2-layer model", small), ("pp", "itself", Path(a.model))]
    runs = []
    try:
        with TS.Server(a.shardlm, Path(a.model), "--max-seqs", "16", name="par-off") as srv:
            base = (greedy(srv, 1), greedy(srv, 8))
        for split, dname, path in cases:
            with TS.Server(a.shardlm, Path(a.model), f"--{split}", "2", "--draft-model", str(path), *spec,
                           name=f"par-{split}", launcher=MPI) as srv:
                runs.append((split, dname, (greedy(srv, 1), greedy(srv, 8)), stats(srv)))
    finally:
        TS.kill_all()
    for split, dname, g, st in runs:
        same = sum(x == y for x, y in zip(base[0] + base[1], g[0] + g[1]))
        check(g == base, f"{split} 2 with {dname} as draft: greedy tokens equal to tp 1 without speculation "
              f"({same} of {2 * len(PROMPTS)})")
        msg = f"{split} 2, {dname}: {st.spec_draft_tokens} drafts verified, {st.spec_accepted_tokens} accepted"
        if dname == "itself":
            check(st.spec_draft_tokens > 0 and st.spec_accepted_tokens >= 0.95 * st.spec_draft_tokens, msg + " (>= 95 %)")
        else:
            check(0 < st.spec_accepted_tokens < st.spec_draft_tokens, msg + " (some accepted, some rejected)")
    if a.other_vocab and os.path.exists(a.other_vocab):
        p = subprocess.run([*MPI, a.shardlm, "serve", "--model", a.model, "--tp", "2", "--draft-model", a.other_vocab,
                            "--listen", "127.0.0.1:0", "--threads", "1"], capture_output=True, text=True, timeout=120)
        check(p.returncode != 0 and "vocabulary size differs" in p.stderr and "vocabulary 49152 vs 512" in p.stderr,
              f"tp 2: a draft with another vocabulary refused at start-up naming both sizes (rc {p.returncode}: "
              f"{[x for x in p.stderr.splitlines() if 'draft' in x][-1:]})")
    else:
        print("note: no --other-vocab model; the vocabulary refusal is not checked")
    return check.summary()


if __name__ == "__main__":
    sys.exit(main())
