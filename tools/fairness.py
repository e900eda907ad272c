#!/usr/bin/env python3
"""tools/fairness.py - issue 18, defect 8: one client's queued samples against another client's
short request, under each scheduling policy. Prints client B's time to first token (and to its
last) with client A's backlog in the queue, and A's own throughput, for every policy asked.

For each policy, `shardlm serve --scheduling-policy P --threads 1 [--serve-args ...]` is
started on stories260K (as tools/soak.py: converted from $SHARDLM_ASSETS, else
../shared/assets; --model DIR for another), then:
  - client A (its own gRPC connection) submits --a-requests unary Generate calls of n = --a-n
    samples each (320 of 1 by default), max_tokens --a-tokens, random sampling
    (temperature 1, so that samples end at different lengths, as real ones do; --ignore-eos
    makes them all as long);
  - once the server reports A's samples running and waiting (GetServerStats), client B (another
    connection) sends --b-requests short streamed requests (max_tokens 4, greedy), the k-th
    k x --b-gap seconds later (each on its own thread, so they do not wait for each other); the
    time from each call to its first token and to its end is recorded;
  - A's calls are left to finish; the whole is repeated --trials times on the same server, which
    is then stopped. Printed: B's times by start offset (the median over the trials), A's
    tokens per second, and the server's preemptions. Under `priority`, B's requests carry
    priority -1 (A's 0).
Without a server of a policy (an older binary), the run says so. Not a pass/fail test: exit 0
after printing, 77 (skipped) without grpcio or the model. Figures: docs/reliability.md.

  python3 tools/fairness.py --shardlm build/cli/shardlm [--policies fcfs,fair]
"""
import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import soak  # noqa: E402  (Server, find_model, the stubs; exits 77 without grpcio)
from soak import grpc, pb, pb_grpc  # noqa: E402


def a_call(stub, i, args, done):
    """One of A's unary calls (a future: no thread each); its tokens and end time go to done."""
    req = pb.GenerateRequest(request_id=f"a-{i}", prompt="Once upon a time",
                             sampling=pb.SamplingParams(max_tokens=args.a_tokens, n=args.a_n, temperature=1.0,
                                                        seed=i, ignore_eos=args.ignore_eos))
    fut = stub.Generate.future(req, timeout=600)

    def finished(f):
        try:
            r = f.result()
            done.append((sum(len(c.token_ids) for c in r.completions), time.monotonic()))
        except grpc.RpcError as e:
            print(f"  A call {i}: {e.code().name} {e.details()}")
            done.append((0, time.monotonic()))
    fut.add_done_callback(finished)
    return fut


def b_call(stub, i, priority=0):
    t0 = time.monotonic()
    first = None
    req = pb.GenerateRequest(request_id=f"b-{i}", prompt="The little dog", priority=priority,
                             sampling=pb.SamplingParams(max_tokens=4, temperature=0.0))
    for ch in stub.GenerateStream(req, timeout=600):
        if first is None and len(ch.token_ids):
            first = time.monotonic() - t0
    return first, time.monotonic() - t0


def run_policy(args, model, policy, work):
    extra = ["--scheduling-policy", policy, *args.serve_args.split()]
    server = soak.Server(args.shardlm, model, extra, work / f"server-{policy}.log")
    try:
        ch_a = grpc.insecure_channel(server.target, options=soak.CHANNEL_OPTIONS)
        ch_b = grpc.insecure_channel(server.target, options=soak.CHANNEL_OPTIONS)
        ch_c = grpc.insecure_channel(server.target, options=soak.CHANNEL_OPTIONS)
        stub_a, stub_b, control = (pb_grpc.TextGenerationStub(c) for c in (ch_a, ch_b, ch_c))
        b_call(stub_b, -1)  # warm-up: the connection and the first step
        ttft = [[] for _ in range(args.b_requests)]
        total = [[] for _ in range(args.b_requests)]
        a_rate, backlogs = [], []
        for trial in range(args.trials):
            done = []
            t_start = time.monotonic()
            futs = [a_call(stub_a, trial * 1000 + i, args, done) for i in range(args.a_requests)]
            want = args.a_requests * args.a_n
            end = time.monotonic() + 30
            while time.monotonic() < end:  # A's samples all in the engine (running or waiting)
                s = control.GetServerStats(pb.GetServerStatsRequest(), timeout=10)
                if s.running + s.waiting >= want:
                    break
                time.sleep(0.005)
            backlogs.append((s.running, s.waiting))
            t0 = time.monotonic()

            def b_at(k):
                time.sleep(max(0.0, t0 + k * args.b_gap - time.monotonic()))
                f, t = b_call(stub_b, trial * 1000 + k, -1 if policy == "priority" else 0)
                ttft[k].append(f)
                total[k].append(t)
            bs = [threading.Thread(target=b_at, args=(k,), daemon=True) for k in range(args.b_requests)]
            for t in bs:
                t.start()
            for t in bs:
                t.join(timeout=600)
            for f in futs:
                f.exception(timeout=600)
            time.sleep(0.05)  # the done callbacks
            a_tokens = sum(x[0] for x in done)
            a_rate.append(a_tokens / (max(x[1] for x in done) - t_start))
        s = control.GetServerStats(pb.GetServerStatsRequest(), timeout=10)
        for c in (ch_a, ch_b, ch_c):
            c.close()
        return {"policy": policy, "backlog": backlogs, "ttft": ttft, "total": total, "a_rate": a_rate,
                "preemptions": s.preemptions}
    finally:
        server.terminate()
        server.kill()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shardlm", required=True)
    ap.add_argument("--model")
    ap.add_argument("--policies", default="fcfs,fair")
    ap.add_argument("--a-requests", type=int, default=320)
    ap.add_argument("--a-n", type=int, default=1)
    ap.add_argument("--a-tokens", type=int, default=200)
    ap.add_argument("--ignore-eos", action="store_true")
    ap.add_argument("--b-requests", type=int, default=4)
    ap.add_argument("--b-gap", type=float, default=1.0)
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--serve-args", default="", help="more `shardlm serve` arguments")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="shardlm-fair-") as tmp:
        work = Path(tmp)
        model = soak.find_model(args, work)
        if model is None:
            print("SKIP: stories260K not found (set SHARDLM_ASSETS or --model)")
            return soak.SKIP
        print(f"A: {args.a_requests} unary requests of n = {args.a_n} ({args.a_requests * args.a_n} samples), "
              f"max_tokens {args.a_tokens}{', ignore_eos' if args.ignore_eos else ''}; "
              f"B: {args.b_requests} requests of 4 tokens, {args.b_gap} s apart; {args.trials} trials")
        for policy in args.policies.split(","):
            r = run_policy(args, model, policy, work)
            print(f"{policy}: backlog when B starts (running + waiting): "
                  + ", ".join(f"{a} + {b}" for a, b in r["backlog"]) + f"; server preemptions {r['preemptions']}")
            for k in range(args.b_requests):
                print(f"  B at +{k * args.b_gap:.1f} s: time to first token median "
                      f"{statistics.median(r['ttft'][k]):.3f} s (" + ", ".join(f"{x:.3f}" for x in r["ttft"][k])
                      + f"), to its end {statistics.median(r['total'][k]):.3f} s")
            print("  A: " + ", ".join(f"{x:.0f}" for x in r["a_rate"]) + " tokens/s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
