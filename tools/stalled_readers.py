#!/usr/bin/env python3
"""tools/stalled_readers.py - issue 18, defect 9: what clients that stop reading their streams
cost the server. Starts `shardlm serve --threads 1` on stories260K (as tools/soak.py), runs
--streams GenerateStream calls that read every chunk as it comes (the warm-up: the KV pool and
allocator pages are touched once), then the same calls again from a client process (each call
on its own connection) that reads the first chunk of each and is then stopped (SIGSTOP): its
sockets are no longer read, as with a client that hangs or stops reading. The server generates
all their tokens (nothing pauses a sequence) and keeps what it cannot send. Prints the server's
RSS (VmRSS) before and once the engine has finished them, with the bound of docs/server.md
("Output buffering") for these requests; then the client is killed (its calls end CANCELLED)
and the RSS printed again. (A Python client that merely does not iterate a stream is not
enough: its gRPC library keeps reading the socket into its own memory.)
Not a pass/fail test: exit 0 after printing, 77 (skipped) without grpcio or the model.

  python3 tools/stalled_readers.py --shardlm build/cli/shardlm [--streams 20 --n 4 --logprobs 20]
"""
import argparse
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import soak  # noqa: E402
from soak import grpc, pb, pb_grpc  # noqa: E402


def request(args, i):
    s = pb.SamplingParams(max_tokens=args.max_tokens, n=args.n, temperature=1.0, seed=i, ignore_eos=True)
    if args.logprobs >= 0:
        s.logprobs = args.logprobs
    return pb.GenerateRequest(request_id=f"s-{i}", prompt="Once upon a time", sampling=s)


def settle(control, want_finished):
    end = time.time() + 300
    while time.time() < end:
        s = control.GetServerStats(pb.GetServerStatsRequest(), timeout=10)
        if s.requests_finished >= want_finished and s.running == 0 and s.waiting == 0:
            return s
        time.sleep(0.05)
    raise RuntimeError("the server did not finish the requests")


def client(args):
    """The stalled client (a child process): opens the streams, reads one chunk of each, says
    so, then waits to be stopped."""
    chans = [grpc.insecure_channel(args.client, options=soak.CHANNEL_OPTIONS) for _ in range(args.streams)]
    calls = [pb_grpc.TextGenerationStub(c).GenerateStream(request(args, 1000 + i), timeout=600)
             for i, c in enumerate(chans)]
    for c in calls:
        next(c)
    print("started", flush=True)
    time.sleep(600)
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shardlm", required=True)
    ap.add_argument("--model")
    ap.add_argument("--streams", type=int, default=20)
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=500)
    ap.add_argument("--logprobs", type=int, default=20, help="-1: none")
    ap.add_argument("--keep-log", help="copy the server's log here (SHARDLM_LOG=info names each call's end)")
    ap.add_argument("--client", help=argparse.SUPPRESS)  # the stalled client's mode: the target
    args = ap.parse_args()
    if args.client:
        return client(args)
    with tempfile.TemporaryDirectory(prefix="shardlm-stall-") as tmp:
        work = Path(tmp)
        model = soak.find_model(args, work)
        if model is None:
            print("SKIP: stories260K not found (set SHARDLM_ASSETS or --model)")
            return soak.SKIP
        server = soak.Server(args.shardlm, model, [], work / "server.log")
        try:
            control = pb_grpc.TextGenerationStub(grpc.insecure_channel(server.target, options=soak.CHANNEL_OPTIONS))
            chans = [grpc.insecure_channel(server.target, options=soak.CHANNEL_OPTIONS) for _ in range(args.streams)]
            stubs = [pb_grpc.TextGenerationStub(c) for c in chans]
            # Warm-up: the same requests, read to the end.
            calls = [stubs[i].GenerateStream(request(args, i), timeout=600) for i in range(args.streams)]
            sizes = [0] * args.streams

            def read(i):
                sizes[i] = sum(len(ch.text.encode()) for ch in calls[i])
            readers = [threading.Thread(target=read, args=(i,)) for i in range(args.streams)]
            for t in readers:
                t.start()
            for t in readers:
                t.join()
            text = sum(sizes)
            settle(control, args.streams)
            time.sleep(0.5)
            before = soak.rss_kib(server.pid)
            child = subprocess.Popen([sys.executable, __file__, "--client", server.target, "--shardlm", args.shardlm,
                                      "--streams", str(args.streams), "--n", str(args.n), "--max-tokens",
                                      str(args.max_tokens), "--logprobs", str(args.logprobs)],
                                     stdout=subprocess.PIPE, text=True)
            assert child.stdout.readline().strip() == "started"
            os.kill(child.pid, signal.SIGSTOP)
            s = settle(control, 2 * args.streams)
            time.sleep(0.5)
            after = soak.rss_kib(server.pid)
            child.kill()
            child.wait()
            settle(control, 2 * args.streams)
            end = time.time() + 30
            while time.time() < end and \
                    control.GetServerStats(pb.GetServerStatsRequest(), timeout=10).active_calls > 1:
                time.sleep(0.1)
            time.sleep(0.5)
            freed = soak.rss_kib(server.pid)
            k = max(args.logprobs, 0)
            per_token = 4 + (4 + 8 * k if args.logprobs >= 0 else 0)
            tokens = args.streams * args.n * args.max_tokens
            print(f"{args.streams} streams of n = {args.n}, {args.max_tokens} tokens each (ignore_eos), logprobs "
                  f"{args.logprobs}: {tokens} tokens, {text} bytes of text when read")
            print(f"server RSS before the stalled streams {before / 1024:.1f} MiB, after they finished "
                  f"{after / 1024:.1f} MiB: +{(after - before) / 1024:.1f} MiB "
                  f"({(after - before) * 1024 / args.streams / 1024:.0f} KiB a stream)")
            print(f"buffer bound (docs/server.md): tokens x ({per_token} B + text) = "
                  f"{tokens * per_token / 2**20:.1f} MiB + {text / 2**20:.2f} MiB of text, up to 2x for the "
                  f"doubling growth; generated tokens {s.generated_tokens}")
            print(f"after the client was killed (its calls ended): {freed / 1024:.1f} MiB")
            server.log.flush()
            ends = {}
            for line in (work / "server.log").read_text().splitlines():
                if " status=" in line and "req=s-" in line:
                    code = line.split(" status=")[1].split()[0]
                    ends[code] = ends.get(code, 0) + 1
            if args.keep_log:
                Path(args.keep_log).write_text((work / "server.log").read_text())
            print("calls' final statuses (server log): " + ", ".join(f"{k} {v}" for k, v in sorted(ends.items())))
            for c in chans:
                c.close()
        finally:
            server.terminate()
            server.kill()
    return 0


if __name__ == "__main__":
    sys.exit(main())
