#!/usr/bin/env python3
"""The determinism contract's matrix (issue 33, docs/determinism.md): one seeded, sampled probe
request, answered under `--batch-invariant` on every axis the contract names, must give the same
tokens as the probe answered alone on a fresh server. Axes (one server each unless said):
  prefix_hit    the probe again on the same server: its prompt served from the prefix cache
  batch         the probe inside 12 other sampled requests
  constraint    the probe beside a request constrained by a JSON schema (same step)
  chunked       --max-batch-tokens 8: the probe's prompt prefilled in chunks of 8 rows
  threads       --threads 2 instead of 1
  speculation   --speculative ngram (prompt lookup drafts, verified by sampling)
  tp2           mpirun -n 2 serve --tp 2 (stories260K only: the GGUF's tp split is not built)
Without --batch-invariant the GGUF's probe must also give bit-identical log-probabilities whole, on
a prefix-cache hit and in chunks of 4 rows (prompt_rows: its products are row-invariant below the
AMX tiles' 96 rows, and attention's paths give the same bits).
Models: stories260K (f32, converted from the assets) and SmolLM2-135M-Instruct Q4_1 (GGUF served
as blocks; SKIPped with a message when .cache lacks it). Tokens are asserted; the log-probabilities'
largest difference to the reference is printed per axis (bit-identical where the rows were computed
the same way, a few 1e-6 where chunking changed the attention's path).

  test_determinism.py --shardlm BUILD/cli/shardlm [--gguf .cache/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf]
"""
import argparse
import os
import shutil
import sys
import tempfile
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
# A prompt of over two 16-token blocks, so that the second answer reuses cached blocks; n-grams
# that repeat, so that prompt lookup drafts.
PROMPT = ("Once upon a time, there was a little girl named Lily. Lily liked to play in the park. "
          "One day, Lily went to the park and")
PROBE = dict(prompt=PROMPT, max_tokens=24, temperature=0.9, top_p=0.95, seed=11, logprobs=1)
OTHERS = ["The cat sat", "Tom had a red ball", "The sun was hot and", "A big dog ran", "Mom said to Lily",
          "The bird flew over"]
SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"]}


def probe(oa, model, **change):
    r = oa.completions.create(model=model, **{**PROBE, **change})
    return r.choices[0].text, r.choices[0].logprobs.token_logprobs


def crowd(oa, model, n_others, constrained):
    """The probe answered while n_others sampled requests (and a constrained one) run."""
    out, errors = {}, []
    start = threading.Barrier(n_others + 1 + int(constrained))

    def other(i):
        try:
            start.wait()
            oa.completions.create(model=model, prompt=OTHERS[i % len(OTHERS)], max_tokens=28, temperature=1.0,
                                  seed=200 + i)
        except Exception as e:  # noqa: BLE001
            errors.append(repr(e))

    def json_one():
        try:
            start.wait()
            oa.completions.create(model=model, prompt="A person:", max_tokens=40, temperature=0.7, seed=3,
                                  extra_body={"response_format": {"type": "json_schema", "json_schema": {
                                      "name": "person", "schema": SCHEMA}}})
        except Exception as e:  # noqa: BLE001
            errors.append(repr(e))

    def the_probe():
        try:
            start.wait()
            out["r"] = probe(oa, model)
        except Exception as e:  # noqa: BLE001
            errors.append(repr(e))
    threads = [threading.Thread(target=other, args=(i,)) for i in range(n_others)] + [threading.Thread(target=the_probe)]
    if constrained:
        threads.append(threading.Thread(target=json_one))
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    check(not errors, f"the requests beside the probe were answered ({errors[:2]})")
    return out.get("r", (None, None))


def serve(shardlm, model, name, *extra, launcher=(), invariant=True):
    srv = TS.Server(shardlm, model, *(("--batch-invariant",) if invariant else ()), "--max-seqs", "16", *extra,
                    name=name, http=True, launcher=launcher)
    return srv, openai.OpenAI(base_url=srv.base + "/v1", api_key="none", max_retries=0, timeout=300)


def matrix(shardlm, model, name, tp2):
    served = Path(model).name
    results = {}
    srv, oa = serve(shardlm, model, f"{name}-ref")
    with srv:
        results["reference"] = probe(oa, served)
        results["prefix_hit"] = probe(oa, served)
    # The batch axes without the prefix cache: each probe computes its prompt as the reference did.
    srv, oa = serve(shardlm, model, f"{name}-batch", "--no-prefix-caching")
    with srv:
        results["batch"] = crowd(oa, served, 12, False)
        results["constraint"] = crowd(oa, served, 0, True)
    axes = [("chunked", ("--max-batch-tokens", "8", "--max-seqs", "8"), ()), ("threads", ("--threads", "2"), ()),
            ("speculation", ("--speculative", "ngram"), ())]
    if tp2:
        axes.append(("tp2", ("--tp", "2"), ("mpirun", "--oversubscribe", "-n", "2")))
    for axis, extra, launcher in axes:
        srv, oa = serve(shardlm, model, f"{name}-{axis}", *extra, launcher=launcher)
        with srv:
            results[axis] = probe(oa, served)
    ref_txt, ref_lp = results["reference"]
    check(ref_txt is not None and len(ref_lp) == PROBE["max_tokens"], f"{name}: the reference answer ({ref_txt!r})")
    for axis, (txt, lp) in results.items():
        if axis == "reference":
            continue
        same = txt == ref_txt
        diff = max((abs(a - b) for a, b in zip(lp, ref_lp)), default=float("nan")) if lp else float("nan")
        check(same, f"{name} {axis}: the same tokens as alone (largest log-probability difference {diff:.3g})"
              + ("" if same else f"; got {txt!r}, want {ref_txt!r}"))
        if axis in ("batch", "constraint"):  # --batch-invariant's own promise: the rows are computed alike
            first = next((i for i, (x, y) in enumerate(zip(lp or [], ref_lp)) if x != y), None)
            check(lp == ref_lp, f"{name} {axis}: bit-identical log-probabilities under --batch-invariant"
                  + ("" if first is None else f" (the first difference at token {first})"))


def prompt_rows(shardlm, model, name):
    """Without --batch-invariant, on a GGUF whose block products are the int8 row products at every
    row count below 96 (every CPU without AMX, and AMX ones below the tiles' 96 rows), a prompt's
    rows must not depend on how it was prefilled: whole, from the prefix cache, or in chunks of 8
    rows (4: attention's row path). Attention gave the rows of a chunk of 16 query vectors or more other bits than those of
    a shorter one until its two paths' key passes were aligned (2026-12-05)."""
    served = Path(model).name
    results = {}
    # About 60 tokens: the rows see more than one pass of 32 keys (within one pass the paths agreed
    # before too), fewer than the 96 rows from which AMX CPUs take the tiles for blocks.
    long_prompt = PROMPT + " saw a big red ball under a tree. She ran to get it, but a small dog got there first, and"
    srv, oa = serve(shardlm, model, f"{name}-plain", invariant=False)
    with srv:
        results["whole"] = probe(oa, served, prompt=long_prompt)
        results["prefix_hit"] = probe(oa, served, prompt=long_prompt)
    # Chunks of 4 rows: 12 query vectors (SmolLM2's 3 per KV head), below the tiles' 16, so these
    # rows take attention's row path where the whole prompt took the tiles.
    srv, oa = serve(shardlm, model, f"{name}-plain-chunked", "--max-batch-tokens", "4", "--max-seqs", "4",
                    invariant=False)
    with srv:
        results["chunked"] = probe(oa, served, prompt=long_prompt)
    ref_txt, ref_lp = results["whole"]
    for axis in ("prefix_hit", "chunked"):
        txt, lp = results[axis]
        first = next((i for i, (x, y) in enumerate(zip(lp or [], ref_lp or [])) if x != y), None)
        check(txt == ref_txt and lp == ref_lp and lp, f"{name} without --batch-invariant, {axis}: the same tokens and "
              f"bit-identical log-probabilities as the prompt prefilled whole"
              + ("" if first is None else f" (the first difference at token {first})"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shardlm", required=True)
    ap.add_argument("--gguf", default="")
    a = ap.parse_args()
    assets = Path(os.environ.get("SHARDLM_ASSETS", TS.ROOT.parent / "shared/assets"))
    src = assets / "stories260K"
    if not (src / "stories260K.bin").exists():
        print(f"SKIP: stories260K not found under {assets}")
        return SKIP
    work = Path(tempfile.mkdtemp(prefix="shardlm-determinism-"))
    try:
        TS.convert_stories260k(a.shardlm, src, work / "stories260K")
        os.environ.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
        os.environ.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        matrix(a.shardlm, work / "stories260K", "stories260K", tp2=shutil.which("mpirun") is not None)
        if a.gguf and os.path.exists(a.gguf):
            matrix(a.shardlm, Path(a.gguf), "smollm2-q4_1", tp2=False)
            prompt_rows(a.shardlm, Path(a.gguf), "smollm2-q4_1")
        else:
            print(f"SKIP smollm2-q4_1: no GGUF at {a.gguf!r} (tools/fetch_smollm2.sh)")
    finally:
        TS.kill_all()
        shutil.rmtree(work, ignore_errors=True)
    return check.summary()


if __name__ == "__main__":
    sys.exit(main())
