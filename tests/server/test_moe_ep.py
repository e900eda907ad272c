#!/usr/bin/env python3
"""tests/server/test_moe_ep.py - expert parallelism in serving (`shardlm serve --ep`,
engine/model/moe_ep.c) against one rank, on a real server under mpirun:

  A random Mixtral (tests/reference/make_models.py, 8 experts, top 2, stories260K's tok512
  tokenizer) is served at one rank, at ep 2 (mpirun -n 2), at ep 2 x pp 2 and at dp 2 x ep 2 (two
  replicas of an ep-2 group; mpirun -n 4), and at ep 2 x tp 2 (attention tensor-parallel inside the
  group: tokens and load equal, logprobs within 1e-4). Each
  server runs the same greedy requests one after another with logprobs (5 alternatives) and
  prompt logprobs: the tokens and every logprob are equal to the one-rank server's, float for
  float (the dispatch and combine keep one rank's order of operations: moe_ep.c); then the same
  prompts at once (threads; the engine batches them, so a step's token slices hold several
  sequences) with seeded sampling: the same tokens. At ep 2 the per-expert load of /metrics equals
  the one-rank server's (every ep rank routes every token).

Usage: SHARDLM_PY_CLIENT=BUILD/clients/python/site-packages test_moe_ep.py --shardlm BUILD/cli/shardlm
Exit 0 when every check passed, 1 on a failure, 77 (SKIP) without mpirun, the stories260K
tokenizer, numpy, prometheus_client or the gRPC client. Every server is killed at the end."""
import argparse
import os
import shutil
import sys
import tempfile
import threading
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
SKIP = 77
sys.dont_write_bytecode = True
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "tests" / "reference"))

import test_moe_metrics as MET  # noqa: E402  (SKIPs itself without numpy or prometheus_client)
import test_server as TS  # noqa: E402
import make_models as MM  # noqa: E402

PROMPTS = MET.PROMPTS
MAX_TOKENS = [10, 12, 8]


def check(cond, what):
    if not cond:
        raise TS.Failure(what)


def run(shardlm, model, name, extra=(), launcher=(), env=None):
    """Greedy requests with logprobs one by one, then sampled ones at once; the load."""
    with TS.Server(shardlm, model, *extra, name=name, http=True, launcher=launcher, env=env) as srv:
        seq = []
        with srv.client(timeout=120) as c:
            for p, n in zip(PROMPTS, MAX_TOKENS):
                g = c.generate(prompt_token_ids=p, max_tokens=n, temperature=0, ignore_eos=True, logprobs=5,
                               prompt_logprobs=3)
                check(len(g.token_ids) == n, f"{name}: {len(g.token_ids)} tokens generated, {n} asked")
                lps = [(e.token_id, e.logprob, [(a.token_id, a.logprob) for a in e.top]) for e in g.logprobs]
                plps = [(e.token_id, e.logprob) for e in g.prompt_logprobs]
                seq.append((list(g.token_ids), lps, plps))
        together = [None] * len(PROMPTS)

        def one(i):
            with srv.client(timeout=120) as c:
                g = c.generate(prompt_token_ids=PROMPTS[i], max_tokens=MAX_TOKENS[i], temperature=0.8, seed=7 + i,
                               ignore_eos=True)
                together[i] = list(g.token_ids)
        threads = [threading.Thread(target=one, args=(i,)) for i in range(len(PROMPTS))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=180)
        check(all(x is not None for x in together), f"{name}: a concurrent request did not finish")
        return seq, together, MET.expert_load(srv)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shardlm", required=True)
    args = ap.parse_args()
    assets = Path(os.environ.get("SHARDLM_ASSETS", ROOT.parent / "shared/assets"))
    tok = assets / "stories260K" / "tok512.model"
    if not tok.exists():
        print(f"SKIP: no stories260K tokenizer under {assets} (set SHARDLM_ASSETS)")
        return SKIP
    if not shutil.which("mpirun"):
        print("SKIP: no mpirun")
        return SKIP
    work = Path(tempfile.mkdtemp(prefix="shardlm-moe-ep-"))
    failed = 0
    try:
        cfg = MM.moe_config("mixtral", "f32")
        MM.write_checkpoint(str(work / "mixtral"), cfg, MM.init_llama(cfg, 5), "f32", 1)
        shutil.copy(tok, work / "mixtral" / "tokenizer.model")
        menv = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
        try:
            one, one_t, one_load = run(args.shardlm, work / "mixtral", "moe-one-rank")
            for label, extra, n in (("ep 2", ("--ep", "2"), 2), ("ep 2 x pp 2", ("--ep", "2", "--pp", "2"), 4),
                                    ("dp 2 x ep 2", ("--ep", "2", "--dp", "2"), 4)):
                seq, tog, load = run(args.shardlm, work / "mixtral", "moe-" + label.replace(" ", ""), extra,
                                     ["mpirun", "--oversubscribe", "-n", str(n)], menv)
                for i, (a, b) in enumerate(zip(one, seq)):
                    check(a[0] == b[0], f"{label}: prompt {i}: tokens {b[0]} differ from one rank's {a[0]}")
                    check(a[1] == b[1], f"{label}: prompt {i}: logprobs {b[1]} differ from one rank's {a[1]}")
                    check(a[2] == b[2], f"{label}: prompt {i}: prompt logprobs differ from one rank's")
                check(tog == one_t, f"{label}: concurrent sampled tokens {tog} differ from one rank's {one_t}")
                if label == "ep 2":
                    check(load == one_load, f"{label}: expert load {load} differs from one rank's {one_load}")
                print(f"PASS {label}: {sum(len(x[0]) for x in seq)} greedy tokens and their logprobs equal to one "
                      f"rank's, float for float; {sum(len(x) for x in tog)} concurrent sampled tokens equal"
                      + ("; the per-expert load equal" if label == "ep 2" else ""))
            # ep 2 x tp 2: attention's partial sums are added over tp as at tp 2, so the logprobs are
            # one rank's to rounding, not to the bit; the tokens and the routing are the same.
            label = "ep 2 x tp 2"
            seq, tog, load = run(args.shardlm, work / "mixtral", "moe-ep2xtp2", ("--ep", "2", "--tp", "2"),
                                 ["mpirun", "--oversubscribe", "-n", "4"], menv)
            worst = 0.0
            for i, (a, b) in enumerate(zip(one, seq)):
                check(a[0] == b[0], f"{label}: prompt {i}: tokens {b[0]} differ from one rank's {a[0]}")
                pairs = [(x[1], y[1]) for x, y in zip(a[1], b[1])] + [(x[1], y[1]) for x, y in zip(a[2], b[2])]
                pairs += [(u[1], v[1]) for x, y in zip(a[1], b[1]) for u, v in zip(x[2], y[2])]
                check(len(a[1]) == len(b[1]) and len(a[2]) == len(b[2]), f"{label}: prompt {i}: logprob counts differ")
                worst = max([worst] + [abs(x - y) for x, y in pairs if x is not None and y is not None])
            check(worst < 1e-4, f"{label}: logprobs {worst:.2e} from one rank's (tolerance 1e-4)")
            check(tog == one_t, f"{label}: concurrent sampled tokens {tog} differ from one rank's {one_t}")
            check(load == one_load, f"{label}: expert load {load} differs from one rank's {one_load}")
            print(f"PASS {label}: {sum(len(x[0]) for x in seq)} greedy tokens equal to one rank's, their logprobs "
                  f"within {worst:.1e}; {sum(len(x) for x in tog)} concurrent sampled tokens equal; the per-expert "
                  "load equal")
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
