#!/usr/bin/env python3
"""Sampled rows drawn from the device's top candidates (forward_batch.top_k; the default on CUDA,
forced on the CPU here by SHARDLM_DEVICE_SAMPLING=1): a sampled request with no penalty, logit
bias, banned ids, constraint or log-probabilities takes its token from its row's 64 largest logits
(1 <= top_k < 64), or from them and the row's mass (top_p and / or min_p without top_k; a top_p
nucleus past them drawn on the device, op_logit_draw's top_p rows; the whole row fetched where
none of these can decide: min_p with a nucleus past the 64), or plain temperature sampling's draw made on the device
(op_logit_draw; the whole row fetched where the draw lands too near its token's edge), a logit
bias, banned ids (min_tokens) and penalties edited into the row on the device first
(op_logit_edit), a structured output's mask after them (op_logit_mask), log-probabilities from the
candidates and the row's normaliser (op_logit_lse), and must take the very token, and give the very
log-probabilities, the host takes from the whole row. The forced server also runs its decode steps from
graphs at one rank (SHARDLM_GRAPHS=1, the CPU's recording mirror of CUDA graphs; its log must say so,
refuse none, and, with requests sent all at once, count steps padded to a bucket's graph), the plain one
op by op: a GPU's default against the host's path. A server with the path and one without get the same requests (seeded; llama.cpp's
defaults top_k 40 / top_p 0.95 / min_p 0.05, a low temperature, top_k 63, top_p alone, min_p
alone, a nucleus wider than 64 tokens, plain temperature hot and cool, penalties, a logit bias,
min_tokens, greedy with penalties, n = 3 after its first token, a JSON schema, a regex (greedy), a
choice, log-probabilities (sampled, greedy, plain temperature); beside them rows that take the
whole row: top_k 64, log-probabilities with a penalty;
greedy rows), one at a time and all at once in mixed
steps (both servers batch-invariant, SHARDLM_BATCH_INVARIANT=1, so that a row's logits do not
depend on the rows beside it); every output must be equal (log-probabilities exactly one at a time,
within 1e-4 all at once), and the forced server's log must
say that a row drew from the
top candidates, that one was fetched whole, that a nucleus past them was drawn on the device, that a plain temperature row was drawn on the device
with the exact tolerance (its weights the host's bits), that edits and masks were made there; the plain
server's none of it. At one
rank, at tp 2 (mpirun; skipped without it) with draws taken only 0.05 inside their token
(SHARDLM_TEST_DRAW_TOL: many fetched, the random state rewound), a tiny random model served in
bf16 as on a GPU (SHARDLM_TEST_SERVE_DTYPE: its logits edited in an f32 copy), and SmolLM2 (a
49,152-token vocabulary).

  test_device_sampling.py --shardlm BUILD/cli/shardlm --model DIR [--gguf SMOLLM2.gguf]
SKIP (77) without the model or the Python client.
"""
import argparse
import concurrent.futures as cf
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

SKIP = 77
ROOT = Path(__file__).resolve().parents[2]
sys.dont_write_bytecode = True
sys.path.insert(0, str(Path(__file__).resolve().parent))
import test_server as TS  # noqa: E402
from checks import Checks  # noqa: E402

check = Checks()
MARKS = {"top": "drew from the device's top 64 logits",
         "fetched": "nucleus reached past the device's top 64 logits",
         "drawn": "a plain temperature row was drawn on the device",
         "nucleus drawn": "a top_p nucleus reaching past the device's top",
         "draw fetched": "a plain temperature draw on the device landed within",
         "exact": "its weights are the host's bits",
         "edits": "banned ids or penalties were applied on the device",
         "masks": "a constraint's mask was applied on the device",
         "logprobs": "log-probabilities from the device's top",
         "graphs": "decode steps run from graphs",
         "graph refused": "cannot run from a graph"}

PROMPTS = ["Once upon a time", "The little dog", "Lily and Ben went to the park", "One day, a girl named Sue",
           "Tom found a box", "The cat sat on"]
# (name, sampling, whether the top candidates serve it)
CASES = [("top_k 40", dict(temperature=0.9, top_k=40), True),
         ("llama.cpp's defaults", dict(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05), True),
         ("top_k 5, hot", dict(temperature=1.5, top_k=5), True),
         ("low temperature", dict(temperature=0.05, top_k=40), True),
         ("fewer within the floor", dict(temperature=0.3, top_k=60), True),
         ("top_k 63", dict(temperature=1.0, top_k=63, top_p=0.9), True),
         ("top_k 64", dict(temperature=1.0, top_k=64), False),
         ("top_p alone", dict(temperature=0.8, top_p=0.9), True),
         ("min_p alone", dict(temperature=0.9, min_p=0.1), True),
         ("top_p and min_p", dict(temperature=1.0, top_p=0.95, min_p=0.05), True),
         ("min_p alone, hot (fetched past the 64)", dict(temperature=2.0, min_p=0.01), True),
         ("a nucleus past the 64", dict(temperature=1.5, top_p=0.999), True),
         ("plain temperature", dict(temperature=1.0), True),
         ("plain, hot", dict(temperature=1.7), True),
         ("plain, cool", dict(temperature=0.5), True),
         ("penalised", dict(temperature=0.8, top_k=40, presence_penalty=0.5), True),
         ("repetition penalty, plain", dict(temperature=1.0, repetition_penalty=1.3), True),
         ("frequency and presence, top_p", dict(temperature=0.9, top_p=0.9, frequency_penalty=0.8,
                                                presence_penalty=-0.3), True),
         ("logit bias", dict(temperature=0.8, top_k=40, logit_bias={5: 3.0, 17: -2.5, 100: 4.0, 261: -100.0}), True),
         ("min_tokens", dict(temperature=0.9, min_tokens=20, stop_token_ids=[13]), True),
         ("logit bias, a nucleus past the 64", dict(temperature=1.5, top_p=0.999, logit_bias={5: 8.0, 261: -100.0}),
          True),
         ("greedy, penalised", dict(temperature=0, repetition_penalty=1.5, frequency_penalty=0.5), True),
         ("n 3", dict(temperature=0.9, top_p=0.95, n=3), True),
         ("json schema, top_p", dict(temperature=0.9, top_p=0.95, json_schema={
             "type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
             "required": ["name", "age"]}), True),
         ("regex, greedy", dict(temperature=0, regex="[a-z ]{5,30}\\."), True),
         ("choice, plain temperature", dict(temperature=1.0, choice=["yes", "no", "maybe not"]), True),
         ("logprobs", dict(temperature=0.8, top_k=40, logprobs=2), True),
         ("logprobs, greedy", dict(temperature=0, logprobs=5), True),
         ("logprobs, plain temperature", dict(temperature=1.2, logprobs=0), True),
         ("logprobs, penalised", dict(temperature=0.8, top_p=0.9, presence_penalty=0.5, logprobs=1), False),
         ("greedy", dict(temperature=0), False)]


def run(srv, max_tokens, parallel):
    """Every case over every prompt, seeded, as {(case, prompt): text}; parallel: all at once."""
    jobs = [(name, kw, p, seed) for seed, (name, kw, _) in enumerate(CASES) for p in PROMPTS]

    def one(job):
        name, kw, p, seed = job
        with srv.client(timeout=120) as c:
            g = c.generate(p, max_tokens=max_tokens, seed=100 + seed, **kw)
        text = " | ".join(x.text for x in g.completions) if len(g.completions) > 1 else g.text
        lps = [(t.token_id, t.logprob, [(u.token_id, u.logprob) for u in t.top]) for t in g.logprobs]
        return (name, p), (text, lps) if lps else text

    with cf.ThreadPoolExecutor(len(jobs) if parallel else 1) as ex:
        return dict(ex.map(one, jobs))


def same(a, b, exact):
    """Two answers equal: text and token ids, log-probabilities exactly or within 1e-4."""
    if exact or isinstance(a, str) or isinstance(b, str):
        return a == b
    (ta, la), (tb, lb) = a, b
    close = lambda x, y: abs(x - y) <= 1e-4  # noqa: E731
    return ta == tb and len(la) == len(lb) and all(
        i == j and close(x, y) and [u for u, _ in tx] == [u for u, _ in ty] and all(close(p, q) for (_, p), (_, q) in
                                                                                     zip(tx, ty))
        for (i, x, tx), (j, y, ty) in zip(la, lb))


def compare(a, model, name, launcher=(), extra=(), max_tokens=48, parallel=True, draw_tol=None, dtype=None):
    runs, said = {}, {}
    for forced in (False, True):
        env = dict(os.environ)
        env.pop("SHARDLM_DEVICE_SAMPLING", None)
        env.pop("SHARDLM_TEST_DRAW_TOL", None)
        env.pop("SHARDLM_TEST_SERVE_DTYPE", None)
        if dtype:
            env["SHARDLM_TEST_SERVE_DTYPE"] = dtype
        # the two servers batch the requests sent all at once differently: batch-invariant products keep
        # a row's logits from depending on its neighbours (without it a sampled token deep in a text
        # flipped once in a few runs: a last bit of a logit moved a draw across its token's edge)
        env["SHARDLM_BATCH_INVARIANT"] = "1"
        # the forced server as on a GPU: its decode steps from graphs too (the CPU's recording mirror, one
        # rank: engine/model/step_graph.c), the plain one op by op
        env["SHARDLM_GRAPHS"] = "1" if forced else "0"
        if forced:
            env["SHARDLM_DEVICE_SAMPLING"] = "1"
            if draw_tol:
                env["SHARDLM_TEST_DRAW_TOL"] = str(draw_tol)
        with TS.Server(a.shardlm, Path(model), *extra, name=f"{name}-{'top' if forced else 'rows'}", env=env,
                       launcher=launcher) as srv:
            runs[forced] = [run(srv, max_tokens, False)] + ([run(srv, max_tokens, True)] if parallel else [])
            log = srv.log_path
        text = Path(log).read_text(errors="replace")
        said[forced] = {k: mark in text for k, mark in MARKS.items()}
        # the model's last line on the graphs (model_free): steps padded to a bucket's graph (six requests
        # at once make steps of 6, 5, 3 ... sequences, run from graphs of 8 and 4)
        padded = re.search(r"steps replayed \((\d+) padded\)", text)
        said[forced]["padded"] = bool(padded and int(padded.group(1)) > 0)
    for k, what in enumerate(["one at a time", "all at once"][:len(runs[True])]):
        plain, top = runs[False][k], runs[True][k]
        for case, _, served in CASES:
            # all at once, the steps' batches differ between the servers, and with them the logits' last
            # bits: log-probabilities are then compared within 1e-4, one at a time exactly
            diff = [p for p in PROMPTS if not same(plain[(case, p)], top[(case, p)], exact=k == 0)]
            check(not diff, f"{name}: {case} ({'top candidates' if served else 'whole rows'}), {what}: the same "
                            f"text with and without the device's top candidates ({len(PROMPTS) - len(diff)} of "
                            f"{len(PROMPTS)} equal)")
            if diff:
                print(f"  {diff[0]!r}:\n    rows: {plain[(case, diff[0])]!r}\n    top:  {top[(case, diff[0])]!r}")
        distinct = len({str(runs[True][k][(CASES[0][0], p)]) for p in PROMPTS})
        check(distinct > 1, f"{name}: sampled outputs differ between prompts ({distinct} distinct), {what}")
    # (taken only 0.05 inside their token, draw_tol, a nucleus's cut is rarely that far from top_p)
    want = {"top": True, "fetched": True, "drawn": True, "nucleus drawn": not draw_tol, "draw fetched": bool(draw_tol), "exact": not draw_tol,
            "edits": True, "masks": True, "logprobs": True, "graphs": not launcher,
            "padded": not launcher and parallel}
    got = {k: said[True][k] for k in want if want[k] or k == "exact"}
    check(all(got[k] == want[k] for k in got) and not said[True]["graph refused"] and not any(said[False].values()),
          f"{name}: the forced server's log says {', '.join(k for k in want if want[k])} ({got}), no graph "
          f"refused ({said[True]['graph refused']}); the plain "
          f"server's none ({[k for k, v in said[False].items() if v]})")


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
        compare(a, a.model, "stories260K")
        if shutil.which("mpirun"):
            compare(a, a.model, "stories260K tp 2", launcher=("mpirun", "--oversubscribe", "-n", "2"), extra=("--tp", "2"),
                    draw_tol=0.05)
        else:
            print("note: no mpirun: tp 2 not run")
        # bf16 activations and logits, as on a GPU (SHARDLM_TEST_SERVE_DTYPE): edited in an f32 copy on the
        # device, the fetched rows read from it
        tiny = Path(tempfile.mkdtemp(prefix="shardlm-devsamp-bf16-"))
        try:
            subprocess.run([sys.executable, str(ROOT / "tools/make_random_model.py"), "--out", str(tiny), "--preset",
                            "tiny", "--dtype", "bf16", "--seed", "3"], check=True, capture_output=True, timeout=120)
            compare(a, tiny, "tiny bf16", max_tokens=24, parallel=False, dtype="bf16")
        finally:
            shutil.rmtree(tiny, ignore_errors=True)
        if a.gguf and os.path.exists(a.gguf):
            # SmolLM2's blocks depend on a step's rows (test_speculative.py compare): one at a time
            compare(a, a.gguf, "smollm2", max_tokens=24, parallel=False)
        else:
            print(f"note: no SmolLM2 GGUF at {a.gguf}: a 49,152-token vocabulary not run")
    finally:
        TS.kill_all()
    return check.summary()


if __name__ == "__main__":
    sys.exit(main())
