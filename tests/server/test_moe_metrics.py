#!/usr/bin/env python3
"""tests/server/test_moe_metrics.py - a mixture of experts' per-expert load in /metrics
(`shardlm_moe_expert_tokens_total{layer, expert}`, engine/model/moe.c's serving counters) on a
real `shardlm serve --http 127.0.0.1:0`:

  one rank  a random Mixtral (tests/reference/make_models.py, 8 experts, top 2, stories260K's
            tok512 tokenizer) serves greedy requests given as token ids; the counters then equal,
            expert by expert and layer by layer, the routing of the float64 NumPy forward
            (make_models.llama_forward, its moe_mlp's top k: the lower index first on a tie) over
            every token the server ran (each prompt, and each generated token but the last), and
            each layer sums to tokens x k; a scrape before any request shows every counter at 0;
            GetServerStats.expert_load (gRPC) holds the same numbers.
  pp 2      the same model under mpirun at pp 2: rank 0's stage, layers 0 .. L/2 - 1 only,
            with the same counts as the one-rank run (skipped without mpirun).

Usage: SHARDLM_PY_CLIENT=BUILD/clients/python/site-packages test_moe_metrics.py --shardlm BUILD/cli/shardlm
Exit 0 when every check passed, 1 on a failure, 77 (SKIP) without the stories260K tokenizer,
numpy, prometheus_client or the gRPC client. Every server is killed at the end; every wait is
bounded."""
import argparse
import os
import shutil
import sys
import tempfile
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
SKIP = 77
sys.dont_write_bytecode = True
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "tests" / "reference"))

try:
    import numpy as np
    from prometheus_client.parser import text_string_to_metric_families
except ImportError as e:
    print(f"SKIP: a test dependency cannot be imported ({e}); run tools/install_deps.sh")
    sys.exit(SKIP)
import test_server as TS  # noqa: E402  (SKIPs itself without grpcio or the client)
import make_models as MM  # noqa: E402

PROMPTS = [[1, 45, 300, 12, 7, 99, 410, 3], [1, 200, 201, 202], [1, 17, 17, 17, 17, 17, 88, 500, 64, 2, 5, 9]]
MAX_TOKENS = [6, 9, 4]
NAME = "shardlm_moe_expert_tokens_total"


def check(cond, what):
    if not cond:
        raise TS.Failure(what)


def expert_load(srv):
    """{(layer, expert): tokens} from /metrics."""
    with urllib.request.urlopen(srv.base + "/metrics", timeout=30) as r:
        text = r.read().decode()
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == NAME:
                out[(int(s.labels["layer"]), int(s.labels["expert"]))] = int(s.value)
    return out


def reference_load(cfg, w, sequences):
    """The float64 forward's routing over each sequence: {(layer, expert): tokens}."""
    E, k = cfg["num_local_experts"], cfg["num_experts_per_tok"]
    load = {(l, e): 0 for l in range(cfg["num_hidden_layers"]) for e in range(E)}
    moe_mlp = MM.moe_mlp

    def counting(cfg_, w_, p, h):  # the same top k as moe_mlp: probability desc, lower index first
        z = h @ w_[p + "block_sparse_moe.gate.weight"].T
        z = np.exp(z - z.max(axis=-1, keepdims=True))
        prob = z / z.sum(axis=-1, keepdims=True)
        layer = int(p.split(".")[2])
        for t in range(h.shape[0]):
            for e in sorted(range(E), key=lambda e: (-prob[t, e], e))[:k]:
                load[(layer, e)] += 1
        return moe_mlp(cfg_, w_, p, h)
    MM.moe_mlp = counting
    try:
        for s in sequences:
            MM.llama_forward(cfg, w, s)
    finally:
        MM.moe_mlp = moe_mlp
    return load


def serve_and_count(shardlm, model, name, extra=(), launcher=(), env=None):
    """Starts a server, checks the zero scrape, runs PROMPTS greedily; returns (load, sequences)."""
    with TS.Server(shardlm, model, *extra, name=name, http=True, launcher=launcher, env=env) as srv:
        before = expert_load(srv)
        check(before and all(v == 0 for v in before.values()), f"{name}: the counters start at 0 ({before})")
        sequences = []
        with srv.client(timeout=120) as c:
            for p, n in zip(PROMPTS, MAX_TOKENS):
                g = c.generate(prompt_token_ids=p, max_tokens=n, temperature=0, ignore_eos=True)
                check(len(g.token_ids) == n, f"{name}: {len(g.token_ids)} tokens generated, {n} asked")
                sequences.append(p + g.token_ids[:-1])  # the last token is sampled, never run
            stats = c.server_stats()
        got = expert_load(srv)
        grpc = {(x.layer, e): n for x in stats.expert_load for e, n in enumerate(x.tokens)}
        check(grpc == got, f"{name}: GetServerStats.expert_load {grpc} differs from /metrics {got}")
        return got, sequences


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shardlm", required=True)
    args = ap.parse_args()
    assets = Path(os.environ.get("SHARDLM_ASSETS", ROOT.parent / "shared/assets"))
    tok = assets / "stories260K" / "tok512.model"
    if not tok.exists():
        print(f"SKIP: no stories260K tokenizer under {assets} (set SHARDLM_ASSETS)")
        return SKIP
    work = Path(tempfile.mkdtemp(prefix="shardlm-moe-metrics-"))
    failed = 0
    try:
        cfg = MM.moe_config("mixtral", "f32")
        w = MM.init_llama(cfg, 5)
        MM.write_checkpoint(str(work / "mixtral"), cfg, w, "f32", 1)
        shutil.copy(tok, work / "mixtral" / "tokenizer.model")
        w = MM.round_weights(w, "f32")  # the values the checkpoint holds
        L, E, k = cfg["num_hidden_layers"], cfg["num_local_experts"], cfg["num_experts_per_tok"]
        try:
            got, sequences = serve_and_count(args.shardlm, work / "mixtral", "moe-one-rank")
            want = reference_load(cfg, w, sequences)
            n_tokens = sum(len(s) for s in sequences)
            check(set(got) == set(want), f"one rank: labels {sorted(got)} are not layers 0..{L - 1} x experts 0..{E - 1}")
            for l in range(L):
                check(sum(got[(l, e)] for e in range(E)) == n_tokens * k,
                      f"one rank: layer {l} sums to {sum(got[(l, e)] for e in range(E))}, not {n_tokens} tokens x {k}")
            check(got == want, f"one rank: the counters {got} differ from the float64 forward's routing {want}")
            print(f"PASS one rank: {n_tokens} tokens x top {k} x {L} layers; load {[got[(0, e)] for e in range(E)]} "
                  "(layer 0) as the float64 forward routes them")
            if not shutil.which("mpirun"):
                print("SKIP pp 2: no mpirun")
            else:
                menv = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
                got2, seq2 = serve_and_count(args.shardlm, work / "mixtral", "moe-pp2", ("--pp", "2"),
                                             ["mpirun", "--oversubscribe", "-n", "2"], menv)
                check(seq2 == sequences, "pp 2: the tokens differ from the one-rank run's")
                first = {key: v for key, v in got.items() if key[0] < L // 2}
                check(got2 == first, f"pp 2: rank 0's layers {got2} differ from the one-rank counts {first}")
                print(f"PASS pp 2: rank 0's layers 0..{L // 2 - 1} with the one-rank counts")
        except Exception as e:  # noqa: BLE001 - reported with the server logs
            failed += 1
            print(f"FAIL {e}")
            TS.show_logs()
    finally:
        TS.kill_all()
        shutil.rmtree(work, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
