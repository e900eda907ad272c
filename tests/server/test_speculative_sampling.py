#!/usr/bin/env python3
"""Speculative decoding keeps the sampled distribution (issue 29; docs/speculative.md): stories260K
served without and with `--speculative ngram`, a repetitive prompt that makes prompt-lookup drafts
frequent, many seeded samples of the first tokens under three sets of sampling controls
(temperature; top-k / top-p / min-p; penalties, logit bias and log-probabilities).

1. Distribution: the two servers sample with DISJOINT seed sets, and for each generated position a
   chi-square test of homogeneity (scipy.stats.chi2_contingency; categories expected fewer than 5
   times pooled into one) must give p > 0.001. With 3 controls x 5 positions = 15 tests, the chance
   that a correct implementation fails one is below 1.5 % (Bonferroni), and the seeds are fixed, so
   the outcome is deterministic.
2. The random stream: the same seeds give the same tokens with and without speculation
   (take_drafted samples each row with the uniform a plain step would draw), and the same
   log-probabilities bit for bit. Both servers run with --batch-invariant: without it a row's f32
   logits differ in the last bits with the number of rows in a step (a verification step holds
   more), and a seed whose uniform falls on a near-tie took another token about once in 10,000
   samples (1,599 of 1,600 once in six runs, 2026-11-28).
3. Not vacuous: the speculative server's GetServerStats must show drafts verified, some accepted
   and some rejected, for the sampled requests.

  test_speculative_sampling.py --shardlm BUILD/cli/shardlm --model BUILD/golden/stories260K
SKIP (77) without the model, the Python client or scipy. About 20 s on 2 cores.
"""
import argparse
import concurrent.futures as cf
import os
import sys
from collections import Counter
from pathlib import Path

SKIP = 77
sys.dont_write_bytecode = True
sys.path.insert(0, str(Path(__file__).resolve().parent))
import test_server as TS  # noqa: E402
from checks import Checks  # noqa: E402

check = Checks()

PROMPT = "Tom had a red ball. Tom had a red ball. Tom had a red ball. Tom had a red ball. Tom had a"
MAX_TOKENS = 5          # positions compared
N = 16                  # samples per request (the n > 1 path: forked sequences draft too)
REQUESTS = 100          # per arm and control: 1600 samples
ALPHA = 0.001
CONTROLS = {
    "temperature": dict(temperature=1.0),
    "top-k/p, min-p": dict(temperature=0.9, top_k=12, top_p=0.92, min_p=0.02),
    "penalties, bias, logprobs": dict(temperature=1.1, repetition_penalty=1.2, presence_penalty=0.4,
                                      frequency_penalty=0.3, logit_bias={13: -2.0, 29: 1.5}, logprobs=2),
}


def samples(srv, kw, seed0):
    """REQUESTS requests of N samples, seeds seed0, seed0 + 1, ...: a list of (token ids, logprobs)."""
    def one(i):
        with srv.client(timeout=120) as c:
            g = c.generate(PROMPT, max_tokens=MAX_TOKENS, n=N, seed=seed0 + i, **kw)
            comps = g.completions or []
            return [(tuple(x.token_ids), x.logprobs) for x in comps]
    with cf.ThreadPoolExecutor(4) as ex:
        return [s for r in ex.map(one, range(REQUESTS)) for s in r]


def chi2_position(a, b, pos):
    """p-value of the chi-square homogeneity test of the token at `pos` in samples a and b."""
    from scipy.stats import chi2_contingency
    ca = Counter(t[pos] for t, _ in a if len(t) > pos)
    cb = Counter(t[pos] for t, _ in b if len(t) > pos)
    na, nb = sum(ca.values()), sum(cb.values())
    if na < 50 or nb < 50:
        return None, 0
    rows_a, rows_b, other_a, other_b = [], [], 0, 0
    for tok in sorted(set(ca) | set(cb)):
        exp_min = min(na, nb) * (ca[tok] + cb[tok]) / (na + nb)
        if exp_min >= 5:
            rows_a.append(ca[tok])
            rows_b.append(cb[tok])
        else:
            other_a += ca[tok]
            other_b += cb[tok]
    if other_a + other_b:
        rows_a.append(other_a)
        rows_b.append(other_b)
    if len(rows_a) < 2:
        return 1.0, len(rows_a)
    return chi2_contingency([rows_a, rows_b])[1], len(rows_a)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shardlm", required=True)
    ap.add_argument("--model", required=True)
    a = ap.parse_args()
    if not os.path.isdir(a.model):
        print(f"SKIP: no model at {a.model}")
        return SKIP
    try:
        import scipy.stats  # noqa: F401
    except ImportError:
        print("SKIP: no scipy")
        return SKIP
    runs = {}
    try:
        for spec in (False, True):
            args = ["--speculative", "ngram", "--spec-draft", "4", "--spec-max-batch", "64"] if spec else []
            args.append("--batch-invariant")
            with TS.Server(a.shardlm, Path(a.model), *args, "--max-seqs", "64",
                           name="spec-sampling" + ("-on" if spec else "-off")) as srv:
                out = {}
                for k, (name, kw) in enumerate(CONTROLS.items()):
                    # distribution arm: seeds disjoint between the servers; stream arm: the same seeds
                    out[name] = (samples(srv, kw, 1000 * (k + 1) + (500 if spec else 0)),
                                 samples(srv, kw, 100000 + 1000 * k))
                with srv.client(timeout=60) as c:
                    out["stats"] = c.server_stats()
                runs[spec] = out
    finally:
        TS.kill_all()

    off, on = runs[False], runs[True]
    for name in CONTROLS:
        (d0, s0), (d1, s1) = off[name], on[name]
        check(len(d0) == len(d1) == REQUESTS * N, f"{name}: {len(d0)} and {len(d1)} samples")
        for pos in range(MAX_TOKENS):
            p, cats = chi2_position(d0, d1, pos)
            if p is None:
                print(f"note {name}: position {pos}: too few samples reach it")
                continue
            check(p > ALPHA, f"{name}: token {pos + 1} distribution, without vs with speculation: chi-square "
                  f"p = {p:.4g} over {cats} categories (> {ALPHA})")
        same = sum(x[0] == y[0] for x, y in zip(s0, s1))
        check(same == len(s0), f"{name}: the same seeds give the same tokens with speculation ({same} of {len(s0)})")
        if name.startswith("penalties"):
            # The target's log-probabilities: bit-identical under --batch-invariant (a verification
            # step's rows are computed as a plain step's).
            worst = max(abs(a.logprob - b.logprob) for x, y in zip(s0, s1) for a, b in zip(x[1], y[1]))
            n_lp = sum(len(x[1]) == len(x[0]) and all(len(e.top) == 2 for e in x[1]) for x in s1)
            check(worst == 0 and n_lp == len(s1), f"{name}: the target's log-probabilities with speculation "
                  f"(largest difference {worst:.2g}; {n_lp} of {len(s1)} samples with one per token and top 2)")
    st = on["stats"]
    check(st.spec_draft_tokens > 0 and 0 < st.spec_accepted_tokens < st.spec_draft_tokens,
          f"speculation ran on sampled requests: {st.spec_draft_tokens} drafts verified, "
          f"{st.spec_accepted_tokens} accepted ({100.0 * st.spec_accepted_tokens / max(1, st.spec_draft_tokens):.1f} %)")
    check(off["stats"].spec_draft_tokens == 0, "no drafts without --speculative")
    return check.summary()


if __name__ == "__main__":
    sys.exit(main())
