#!/usr/bin/env python3
"""Speculative decoding of structured-output (grammar-constrained) requests (issue 29;
docs/speculative.md "Structured outputs"). Target: stories260K. Servers: without speculation; with
prompt lookup (--speculative ngram: drafts not masked, rejected where the grammar forbids them);
with the target as its own draft model (its drafts masked by the grammar, so every one should be
accepted); with stories260K cut to 2 layers as the draft (masked, mostly rejected).

Every server but the first runs with SHARDLM_SPEC_CHECK_GRAMMAR=1: after each verification the
engine compares the sequence's grammar matcher (advanced over the drafts while they were made,
rolled back, then advanced by the tokens taken) with a matcher that was only ever fed the output's
tokens, a never-drafted run's: the same mask of allowed tokens, can_end and is_done, else the
request fails with an INTERNAL error naming the difference. So the matcher state after rejections
is checked at every verified step, not assumed.

Checks: greedy token ids of each (prompt, constraint) equal the server without speculation, one
request at a time and 8 at once; every finished JSON output validates with `jsonschema`, every
regex output fully matches Python's `re`; each speculative server verified drafts of the
constrained requests (the counters), with some rejected for prompt lookup and the 2-layer draft,
and at least 95 % accepted with the target as its own draft (which would fall if the drafts were
not masked at the matcher's advanced state). Sampled constrained requests (temperature 1, the
regex, 960 samples of 5 tokens per server, disjoint seeds) with the two draft models: per
position a chi-square homogeneity test against the server without speculation, p > 0.001 / 10
(Bonferroni over 2 arms x 5 positions); the target as its own draft has at least 99 % of its
sampled drafts accepted (its q equals p, masks included, but for f32 rounding), the 2-layer draft some accepted and some rejected: the
general rule (verify_sampled) with the grammar's mask on both p and q keeps the target's
distribution.

  test_speculative_grammar.py --shardlm BUILD/cli/shardlm --model BUILD/golden/stories260K
SKIP (77) without the model, numpy, jsonschema or the Python client.
"""
import argparse
import concurrent.futures as cf
import json
import os
import re
import sys
import tempfile
from pathlib import Path

SKIP = 77
sys.dont_write_bytecode = True
sys.path.insert(0, str(Path(__file__).resolve().parent))
try:
    import jsonschema
    import numpy  # noqa: F401
except ImportError as e:
    print(f"SKIP: a test dependency cannot be imported ({e}); run tools/install_deps.sh")
    sys.exit(SKIP)
import test_server as TS  # noqa: E402
from checks import Checks  # noqa: E402
from test_speculative_draft import MAX_TOKENS, N, REQUESTS, draft_copy, samples, stats  # noqa: E402
from test_speculative_sampling import chi2_position  # noqa: E402

check = Checks()

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 40},
                                           "friends": {"type": "array", "items": {"type": "string", "maxLength": 12},
                                                       "maxItems": 4}},
          "required": ["name", "friends"], "additionalProperties": False}
REGEX = "(the (dog|cat|ball) (was|is) (big|red|happy)\\. ){2,3}"
PROMPTS = ["Once upon a time", "The little dog", "Lily and Ben went to the park", "Tom had a red ball. Tom had a red"]
CASES = [(p, kind) for p in PROMPTS for kind in ("json", "regex")]


def ask(srv, case):
    prompt, kind = case
    kw = dict(json_schema=SCHEMA) if kind == "json" else dict(regex=REGEX)
    import grpc
    with srv.client(timeout=120) as c:
        try:
            g = c.generate(prompt, max_tokens=160, temperature=0, **kw)
        except grpc.RpcError as e:  # e.g. INTERNAL from SHARDLM_SPEC_CHECK_GRAMMAR
            return (), "", f"{e.code()}: {e.details()}"
        comp = g.completions[0]
        return tuple(comp.token_ids), g.text, str(comp.finish_reason)


def run_all(srv):
    solo = [ask(srv, k) for k in CASES]
    with cf.ThreadPoolExecutor(8) as ex:
        together = list(ex.map(lambda k: ask(srv, k), CASES))
    return solo, together


def valid(kind, text):
    if kind == "regex":
        return re.fullmatch(REGEX, text) is not None
    try:
        jsonschema.validate(json.loads(text), SCHEMA)
        return True
    except Exception:  # noqa: BLE001
        return False


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shardlm", required=True)
    ap.add_argument("--model", required=True)
    a = ap.parse_args()
    if not os.path.isdir(a.model):
        print(f"SKIP: no model at {a.model}")
        return SKIP
    tmp = Path(tempfile.mkdtemp(prefix="shardlm-spec-grammar-"))
    small = tmp / "stories260K-2layers"
    draft_copy(Path(a.model), small, 2)
    env = dict(os.environ, SHARDLM_SPEC_CHECK_GRAMMAR="1", SHARDLM_SPEC_PRIOR="0")  # every sequence drafts
    hot = dict(temperature=1.0, regex=REGEX)
    spec = ["--spec-draft", "4", "--spec-max-batch", "64", "--max-seqs", "64"]  # n = 16 samples at once draft too
    arms = {"prompt lookup": ["--speculative", "ngram", *spec],
            "the target as draft": ["--draft-model", a.model, *spec],
            "the 2-layer draft": ["--draft-model", str(small), *spec]}
    out = {}
    try:
        with TS.Server(a.shardlm, Path(a.model), "--max-seqs", "64", name="grammar-off") as srv:
            base = run_all(srv)
            off = samples(srv, hot, 7000)
        for j, (name, args) in enumerate(arms.items()):
            with TS.Server(a.shardlm, Path(a.model), *args, name=f"grammar-spec-{j}", env=env) as srv:
                out[name] = (run_all(srv), stats(srv))
                on = samples(srv, hot, 8000 + 1000 * j) if "draft" in name else None  # drafts masked, sampled
                out[name] += (on, stats(srv))
    finally:
        TS.kill_all()
    n_done = 0
    for (prompt, kind), (ids, text, why) in zip(CASES, base[0]):
        if why == "stop":
            n_done += 1
            check(valid(kind, text), f"without speculation, {kind} for {prompt!r}: a valid output ({text[:60]!r})")
    check(n_done >= len(CASES) // 2, f"{n_done} of {len(CASES)} constrained outputs finished within 160 tokens")
    alpha = 0.001 / (2 * MAX_TOKENS)
    for name, ((solo, together), st, on, st_on) in out.items():
        for label, got, ref in (("one at a time", solo, base[0]), ("8 at once", together, base[1])):
            same = sum(g[0] == r[0] for g, r in zip(got, ref))
            bad = [g[2] for g in got if g[2] not in ("stop", "length")]
            check(same == len(CASES) and not bad, f"{name}, {label}: constrained greedy tokens equal without "
                  f"speculation ({same} of {len(CASES)}; errors: {bad})")
        rate = st.spec_accepted_tokens / max(1, st.spec_draft_tokens)
        msg = f"{name}: {st.spec_draft_tokens} drafts verified, {st.spec_accepted_tokens} accepted ({100 * rate:.1f} %)"
        if name == "the target as draft":
            check(st.spec_draft_tokens > 0 and rate >= 0.95, msg + " (>= 95 %: the drafts are masked)")
        else:
            check(0 < st.spec_accepted_tokens < st.spec_draft_tokens, msg + " (some accepted, some rejected)")
        if on is None:  # prompt lookup drafts nothing in 5 tokens; test_speculative_sampling samples it
            continue
        check(len(off) == len(on) == REQUESTS * N, f"{name}, sampled: {len(off)} and {len(on)} samples")
        for pos in range(MAX_TOKENS):
            p, cats = chi2_position(off, on, pos)
            check(p is not None and p > alpha, f"{name}, temperature 1 with the regex: token {pos + 1} distribution "
                  f"without vs with speculation: chi-square p = {p} over {cats} categories (> {alpha:.2g})")
        ver, acc = st_on.spec_draft_tokens - st.spec_draft_tokens, st_on.spec_accepted_tokens - st.spec_accepted_tokens
        msg = f"{name}, sampled constrained requests: {ver} drafts verified, {acc} accepted"
        if name == "the target as draft":  # q = p, masks and all (but for f32 rounding): all accepted
            check(ver > 0 and acc >= 0.99 * ver, msg + " (>= 99 %)")
        else:
            check(0 < acc < ver, msg + " (some accepted, some rejected)")
    return check.summary()


if __name__ == "__main__":
    sys.exit(main())
