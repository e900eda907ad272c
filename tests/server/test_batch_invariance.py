#!/usr/bin/env python3
"""The determinism contract's batch axis on a GGUF model served from its blocks (docs/determinism.md):
SmolLM2-135M-Instruct Q4_1 under `shardlm serve --batch-invariant`. A seeded, sampled request is
answered alone, then again in the middle of 40 other requests that run beside it (decode steps
of 41 rows, where the block products would otherwise switch from int8 row products to
dequantized tiles, and f32 products from gemv to sgemm): the two answers must be the same text,
token for token (their log-probabilities too). The same run without the flag is reported, not
asserted (it may or may not differ on a given prompt). SKIP (77) without the GGUF or openai.

  test_batch_invariance.py --shardlm BUILD/cli/shardlm --gguf .cache/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
"""
import argparse
import os
import sys
import threading
from pathlib import Path

SKIP = 77
sys.dont_write_bytecode = True
sys.path.insert(0, str(Path(__file__).resolve().parent))
try:
    import openai
except ImportError as e:
    print(f"SKIP: a test dependency cannot be imported ({e}); run tools/install_deps.sh")
    sys.exit(SKIP)
import test_server as TS  # noqa: E402
from checks import Checks  # noqa: E402

check = Checks()
PROBE = dict(prompt="The history of the printing press begins", max_tokens=24, temperature=0.9, top_p=0.95,
             seed=7, logprobs=1)
OTHERS = ["Water boils when", "My favourite season is", "The train left the station and", "Cats like to",
          "In the year 1900,", "A good breakfast has", "The ocean is deep because", "Mathematics helps us"]


def run(oa, model, alone):
    """The probe's (text, log-probabilities): alone, or in the middle of 40 others."""
    if alone:
        r = oa.completions.create(model=model, **PROBE)
        return r.choices[0].text, r.choices[0].logprobs.token_logprobs
    out, errors = {}, []
    start = threading.Barrier(41)

    def other(i):
        try:
            start.wait()
            oa.completions.create(model=model, prompt=OTHERS[i % len(OTHERS)] + " " * (i % 3), max_tokens=32,
                                  temperature=1.0, seed=100 + i)
        except Exception as e:  # noqa: BLE001
            errors.append(repr(e))

    def probe():
        try:
            start.wait()
            r = oa.completions.create(model=model, **PROBE)
            out["r"] = (r.choices[0].text, r.choices[0].logprobs.token_logprobs)
        except Exception as e:  # noqa: BLE001
            errors.append(repr(e))
    threads = [threading.Thread(target=other, args=(i,)) for i in range(40)] + [threading.Thread(target=probe)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    check(not errors, f"the 41 requests in the batch were answered ({errors[:2]})")
    return out.get("r", (None, None))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shardlm", required=True)
    ap.add_argument("--gguf", required=True)
    a = ap.parse_args()
    if not os.path.exists(a.gguf):
        print(f"SKIP: no SmolLM2 GGUF at {a.gguf} (tools/fetch_smollm2.sh)")
        return SKIP
    model = Path(a.gguf).name
    results = {}
    for flag in (True, False):
        extra = ["--max-seqs", "64", "--no-prefix-caching"] + (["--batch-invariant"] if flag else [])
        with TS.Server(a.shardlm, Path(a.gguf), *extra, name="batch_inv" if flag else "batch_var", http=True) as srv:
            oa = openai.OpenAI(base_url=srv.base + "/v1", api_key="none", max_retries=0, timeout=300)
            alone = run(oa, model, True)
            crowd = run(oa, model, False)
            results[flag] = (alone, crowd)
    (a_txt, a_lp), (c_txt, c_lp) = results[True]
    check(a_txt is not None and a_txt == c_txt,
          f"--batch-invariant: the probe alone and inside 41 requests gives the same text ({a_txt!r} / {c_txt!r})")
    check(a_lp is not None and a_lp == c_lp,
          "--batch-invariant: and bit-identical log-probabilities for every token")
    (b_txt, b_lp), (d_txt, d_lp) = results[False]
    print(f"without --batch-invariant: text {'the same' if b_txt == d_txt else 'different'}, log-probabilities "
          f"{'identical' if b_lp == d_lp else 'different'} (reported, not asserted)")
    return check.summary()


if __name__ == "__main__":
    sys.exit(main())
