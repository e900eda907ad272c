#!/usr/bin/env python3
"""tools/soak_restart.py - the restart soak of docs/reliability.md (issue 33): a journaled server
(`serve --journal`, stories260K, --batch-invariant) under CONCURRENCY streaming clients is killed
with SIGKILL every INTERVAL seconds and restarted on the same port, KILLS times; every client
reconnects (Last-Event-ID after its first chunk, else its Idempotency-Key) until it has [DONE].
Then every request is answered again by a server that is never killed, and each client's
assembled answer (text and finish reason per choice, over all its connections) must equal it:
nothing lost, nothing twice. Prints the counts; exit 1 on any difference or lost request.

  python3 tools/soak_restart.py --shardlm build/cli/shardlm [--concurrency 64] [--requests 512]
                                [--kills 5] [--interval 2.0] [--overhead] [--apis] [--grpc] [--cuts]
                                [--launcher CMD --serve-args ARGS [--kill-node NS]]
--apis: a quarter of the requests go to /v1/responses (seeded) and an eighth to Anthropic's
/v1/messages (greedy: that API has no seed); their streams are compared event by event (ids and
times aside) with a journaled server's that is never killed (a journaled stream's events are
formed one group per engine event, so the reference must be journaled too).
--overhead: no kills; the same requests with and without --journal, alternating three times,
and the best wall time of each (the journal's cost on this machine; one run, same binary).
--grpc: the same soak over gRPC (GenerateStream / ChatStream), each client a
shardlm_client.Client that reattaches by itself (resume token); a call cut before the server
named its token is sent again as new. Token ids, text and finish reasons per sample are compared.
--cuts: the server stays up and, KILLS times, every client connection is cut instead (the clients
reach it through a TCP proxy): --journal-detach-grace keeps their requests for them.
--launcher / --serve-args: a server of several ranks (e.g. "mpirun -n 4", "--dp 2 --tp 2"), also for
the reference; --kill-node NS: each kill is every process of network namespace NS (a node lost,
tools/soak_multinode.sh), the job must end by itself within --job-timeout, and the seconds from
the loss to the job's end and to the restarted job's readiness are printed. --hang-rank: each
kill is SIGSTOP to the job's rank 1 (a hung rank): rank 0 outlives it, notices within
--rank-timeout and fails every running request (the engine's failure, which a journaled request
must survive as it survives a kill), and the job ends by itself.
A benchmark-style run (minutes), not a test: `ctest -R server_journal` (and server_journal_grpc)
is the short version."""
import argparse
import json
import os
import random
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.dont_write_bytecode = True
sys.path.insert(0, str(ROOT / "tests/server"))
import test_server as TS  # noqa: E402
from tcp_proxy import Proxy  # noqa: E402
from test_journal import Stream, assemble  # noqa: E402
from test_journal_apis import ANTHROPIC, EventStream, normalized  # noqa: E402

PROMPTS = ["Once upon a time", "Tom had a red ball", "The cat sat", "A big dog ran", "Mom said to Lily",
           "The bird flew over", "Lily liked to play", "The sun was hot and"]


def requests(n, seed, apis=False):
    """(path, body, headers) of n streamed requests."""
    rnd = random.Random(seed)
    out = []
    for i in range(n):
        p = rnd.choice(PROMPTS)
        max_tokens, temperature = rnd.randint(40, 300), rnd.choice([0.8, 1.0])
        common = dict(max_tokens=max_tokens, temperature=temperature, seed=i, stream=True, n=rnd.choice([1, 1, 2]))
        kind = rnd.random()
        if apis and kind < 0.25:
            out.append(("/v1/responses", dict(model="stories260K", input=p, max_output_tokens=max_tokens,
                                              temperature=temperature, seed=i, stream=True), {}))
        elif apis and kind < 0.375:
            out.append(("/v1/messages", dict(model="stories260K", messages=[{"role": "user", "content": p}],
                                             max_tokens=max_tokens, temperature=0, stream=True), ANTHROPIC))
        elif rnd.random() < 0.5:
            out.append(("/v1/chat/completions", dict(common, messages=[{"role": "user", "content": p}]), {}))
        else:
            out.append(("/v1/completions", dict(common, prompt=p), {}))
    return out


def stream_of(path, body, headers):
    """The client of one request: OpenAI chunks, or Anthropic / Responses events."""
    return (EventStream if path in ("/v1/messages", "/v1/responses") else Stream)(path, body, headers)


def answer(st):
    """What must equal the uninterrupted answer: per choice text and finish reason, or the events."""
    if isinstance(st, EventStream):
        return normalized(st.events)
    return {k: (v["text"], v["finish"]) for k, v in assemble(st.chunks)[0].items()}


# --launcher / --serve-args: the soaked server's layout, and the never-killed reference's (sampled
# tokens may differ between layouts where two candidates nearly tie: docs/determinism.md).
LAYOUT = {"launcher": [], "serve_args": []}


def start(shardlm, model, journal, port, name, grpc_port=None):
    extra = ["--batch-invariant", "--max-seqs", "64", "--http", f"127.0.0.1:{port}"]
    if grpc_port:
        extra += ["--listen", f"127.0.0.1:{grpc_port}"]
    if journal:
        extra += ["--journal", str(journal)]
    return TS.Server(shardlm, model, *extra, *LAYOUT["serve_args"], name=name, launcher=LAYOUT["launcher"])


def run_until_done(st, port_box, key, deadline):
    """Reconnects st until its stream's end (or the deadline): by its Idempotency-Key until it has
    an event id (which the server prefers once sent), then by Last-Event-ID. A 404 is a lost
    request (st.lost)."""
    st.lost = None
    st.headers["Idempotency-Key"] = key
    while not st.done and time.time() < deadline:
        before = len(st.statuses)
        st.read(port_box[0])
        if st.done:
            return
        if len(st.statuses) > before and st.statuses[-1] == 404:
            st.lost = getattr(st, "error", "404")
            return
        time.sleep(0.05)


def start_workers(n, count, fn):
    """n threads that call fn(i) for i in range(count), each i once; started, not joined."""
    todo, lock = list(range(count)), threading.Lock()

    def worker():
        while True:
            with lock:
                if not todo:
                    return
                i = todo.pop(0)
            fn(i)

    threads = [threading.Thread(target=worker) for _ in range(n)]
    for t in threads:
        t.start()
    return threads


recovery = []  # (seconds from a node's loss to the job's end, to the restarted job's readiness)
outlived = []  # the losses that failed: the job did not end by itself within --job-timeout, or (--hang-rank) nothing was open


def print_recovery():
    if recovery:
        print("recovery after each loss (s): job ended " + ", ".join(f"{g:.1f}" for g, _ in recovery)
              + "; serving again " + ", ".join(f"{r:.1f}" for _, r in recovery))


def kill_loop(a, srv, threads, restart, t0, proxy=None):
    """SIGKILLs the server every a.interval seconds, a.kills times or until the threads end,
    restart(k) starting the next; joins the threads. Returns (the last server, kills). With proxy
    (--cuts) the server stays up and every connection through the proxy is cut instead."""
    kills = 0
    while kills < a.kills and any(t.is_alive() for t in threads):
        time.sleep(a.interval)
        if proxy:
            proxy.cut()
            kills += 1
            print(f"cut {kills} at {time.time() - t0:.1f} s", flush=True)
            continue
        t_kill = time.time()
        if a.kill_node or a.hang_rank:  # a node lost, or a rank hung: the job ends by itself
            if a.kill_node:  # every process of that namespace
                pids = subprocess.run(["ip", "netns", "pids", a.kill_node], capture_output=True, text=True).stdout.split()
                subprocess.run(["kill", "-9", *pids], capture_output=True)
            hung = None if a.kill_node else rank_pid(srv.proc.pid, 1)
            if hung:
                os.kill(hung, signal.SIGSTOP)
            elif not a.kill_node:
                print("FAIL: no rank 1 to stop", flush=True)
                outlived.append(kills + 1)
            try:
                srv.proc.wait(timeout=a.job_timeout)
            except subprocess.TimeoutExpired:
                print(f"FAIL: the job outlived {'the loss of node ' + a.kill_node if a.kill_node else 'its hung rank 1'} "
                      f"by {a.job_timeout} s", flush=True)
                outlived.append(kills + 1)
                srv.proc.kill()
                srv.proc.wait(timeout=30)
            if hung:  # (mpirun's SIGTERM does not reach a stopped process)
                subprocess.run(["kill", "-9", str(hung)], capture_output=True)
        else:
            srv.proc.send_signal(signal.SIGKILL)
            srv.proc.wait(timeout=30)
        t_gone = time.time()
        srv.log.close()
        kills += 1
        srv = restart(kills)
        t_ready = time.time()
        resumed = [ln for ln in srv.log_path.read_text().splitlines() if "open request(s) to resume" in ln]
        what = resumed[-1].split(': ', 2)[-1] if resumed else '?'
        if a.hang_rank and (not what.split()[0].isdigit() or what.startswith("0 ")):
            print("FAIL: nothing was open at the loss: the test did not test it", flush=True)
            outlived.append(kills)
        if a.kill_node or a.hang_rank:
            recovery.append((t_gone - t_kill, t_ready - t_kill))
            print(f"{'node ' + a.kill_node + ' lost' if a.kill_node else 'rank 1 hung'} at {t_kill - t0:.1f} s: the job ended after {t_gone - t_kill:.1f} s, "
                  f"the restarted job served after {t_ready - t_kill:.1f} s; {what}", flush=True)
        else:
            print(f"kill {kills} at {t_kill - t0:.1f} s: {what}", flush=True)
    for t in threads:
        t.join()
    return srv, kills


def rank_pid(launcher_pid, rank):
    """The pid of the given rank among the launcher's (mpirun's) children, or None."""
    for child in subprocess.run(["pgrep", "-P", str(launcher_pid)], capture_output=True, text=True).stdout.split():
        try:
            env = Path(f"/proc/{child}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"OMPI_COMM_WORLD_RANK={rank}".encode() in env:
            return int(child)
    return None


def run_all(port, reqs, concurrency, keyed):
    """Every request once at the given concurrency; the wall time."""
    clients = [stream_of(*r) for r in reqs]

    def one(i):
        if keyed:
            clients[i].headers["Idempotency-Key"] = f"ovh-{os.getpid()}-{time.time_ns()}-{i}"
        clients[i].read(port)

    t0 = time.time()
    for t in start_workers(concurrency, len(reqs), one):
        t.join()
    assert all(c.done for c in clients), "a request did not finish"
    return time.time() - t0


def overhead(a, model, work, reqs):
    best = {"journal": 1e9, "plain": 1e9}
    for rep in range(3):
        for kind in ("plain", "journal"):
            srv = start(a.shardlm, model, work / f"journal-ovh-{rep}" if kind == "journal" else None, TS.free_port(),
                        f"ovh-{kind}-{rep}")
            best[kind] = min(best[kind], run_all(srv.http_port, reqs, a.concurrency, kind == "journal"))
            srv.stop()
    cpu = TS.cpu_name()
    print(f"CPU: {cpu}, {os.cpu_count()} cores; {len(reqs)} streamed requests at concurrency {a.concurrency}")
    print(f"best of 3: without the journal {best['plain']:.2f} s, with --journal (fsync accept) {best['journal']:.2f} s, "
          f"ratio {best['journal'] / best['plain']:.3f}")
    return 0


def grpc_answer(client, path, body):
    """One request over gRPC, streamed: {sample: (token ids, text, finish)}."""
    kw = dict(max_tokens=body["max_tokens"], temperature=body["temperature"], seed=body["seed"], n=body["n"])
    it = (client.chat_stream([("user", body["messages"][0]["content"])], **kw) if "messages" in body
          else client.generate_stream(body["prompt"], **kw))
    out = {}
    for ch in it:
        o = out.setdefault(ch.index, [[], "", ""])
        o[0] += ch.token_ids
        o[1] += ch.text
        o[2] = ch.finish_reason or o[2]
    return {k: tuple(v[:2]) + (v[2],) for k, v in out.items()}


class ThreadClients:
    """One client per worker thread, made by make() on the thread's first get(); close() closes all."""

    def __init__(self, make):
        self.make, self.local, self.lock, self.all = make, threading.local(), threading.Lock(), []

    def get(self):
        if not hasattr(self.local, "client"):
            self.local.client = self.make()
            with self.lock:
                self.all.append(self.local.client)
        return self.local.client

    def close(self):
        for c in self.all:
            c.close()


def soak_grpc(a, model, work, reqs):
    from shardlm_client import Client as GrpcClient
    import grpc
    gport = TS.free_port()
    srv = start(a.shardlm, model, work / "journal", TS.free_port(), "grpc-soak-0", gport)
    proxy = Proxy(gport) if a.cuts else None
    target = proxy.target if proxy else f"127.0.0.1:{gport}"
    got, lost, again, lock = [None] * len(reqs), {}, [0], threading.Lock()
    clients = ThreadClients(lambda: GrpcClient(target, resume_for=120))

    def answer(i):
        end = time.time() + 600
        while got[i] is None and time.time() < end:
            try:
                got[i] = grpc_answer(clients.get(), *reqs[i][:2])
            except grpc.RpcError as e:
                # UNAVAILABLE before the server named a token (refused: it was down): send again.
                if e.code() != grpc.StatusCode.UNAVAILABLE:
                    lost[i] = f"{e.code()}: {e.details()}"
                    break
                with lock:
                    again[0] += 1
                time.sleep(0.1)

    t0 = time.time()
    threads = start_workers(a.concurrency, len(reqs), answer)
    srv, kills = kill_loop(a, srv, threads,
                           lambda k: start(a.shardlm, model, work / "journal", TS.free_port(), f"grpc-soak-{k}", gport), t0,
                           proxy)
    clients.close()
    elapsed = time.time() - t0
    srv.stop()
    reattached = sum(p.read_text().count("a gRPC client reattached") for p in TS.LOG_DIR.glob("grpc-soak-*.log"))
    ref_srv = start(a.shardlm, model, None, TS.free_port(), "grpc-reference", TS.free_port())
    refs, ref_clients = [None] * len(reqs), ThreadClients(lambda: GrpcClient(ref_srv.target, resume_for=0))

    def reference(i):
        refs[i] = grpc_answer(ref_clients.get(), *reqs[i][:2])

    for t in start_workers(a.concurrency, len(reqs), reference):
        t.join()
    ref_clients.close()
    ref_srv.stop()
    missing = [i for i in range(len(reqs)) if got[i] is None]
    diff = [i for i in range(len(reqs)) if got[i] is not None and got[i] != refs[i]]
    print(f"gRPC: requests {len(reqs)}, concurrency {a.concurrency}, {'cuts' if proxy else 'node losses' if a.kill_node else 'hung ranks' if a.hang_rank else 'SIGKILLs'} {kills}, "
          f"reattachments {reattached}, sent again (cut before their token) {again[0]}, {elapsed:.1f} s")
    print(f"lost {len(missing)}, different from the uninterrupted answer {len(diff)}")
    print_recovery()
    for i in (missing + diff)[:5]:
        print(f"  request {i}: {lost.get(i, '')} {reqs[i]}")
    return 0 if not missing and not diff and not outlived else 1


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shardlm", required=True)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--requests", type=int, default=512)
    ap.add_argument("--kills", type=int, default=5)
    ap.add_argument("--interval", type=float, default=2.0)
    ap.add_argument("--overhead", action="store_true")
    ap.add_argument("--grpc", action="store_true")
    ap.add_argument("--apis", action="store_true", help="Anthropic and Responses streams among the requests")
    ap.add_argument("--cuts", action="store_true",
                    help="the server stays up; every client connection is cut (through a TCP proxy) instead of a kill")
    ap.add_argument("--launcher", default="", help="e.g. \"mpirun -n 4\" with --serve-args \"--dp 2 --tp 2\": the ranks "
                    "of the soaked server and of the reference (never killed)")
    ap.add_argument("--serve-args", default="", help="more arguments of the soaked server's shardlm serve")
    ap.add_argument("--kill-node", default="", help="a network namespace (tools/soak_multinode.sh): each kill is every "
                    "process in it (a node lost) instead of SIGKILL to the server; the job must then end by itself")
    ap.add_argument("--hang-rank", action="store_true", help="with --launcher: each kill is SIGSTOP to rank 1 (a hung "
                    "rank) instead; rank 0 fails the requests and the job must end by itself")
    ap.add_argument("--job-timeout", type=float, default=60, help="with --kill-node or --hang-rank: how long the job may "
                    "outlive the loss")
    a = ap.parse_args()
    LAYOUT["launcher"], LAYOUT["serve_args"] = shlex.split(a.launcher), shlex.split(a.serve_args)
    if LAYOUT["launcher"] and not shutil.which(LAYOUT["launcher"][0]):
        print(f"SKIP: no {LAYOUT['launcher'][0]}")
        return 77
    assets = Path(os.environ.get("SHARDLM_ASSETS", ROOT.parent / "shared/assets"))
    work = Path(tempfile.mkdtemp(prefix="shardlm-soak-restart-"))
    try:
        model = work / "stories260K"
        TS.convert_stories260k(a.shardlm, assets / "stories260K", model)
        reqs = requests(a.requests, 1, a.apis)
        if a.overhead:
            return overhead(a, model, work, reqs)
        if a.grpc:
            if a.apis:
                sys.exit("soak_restart: --apis is HTTP's (gRPC has no Anthropic or Responses methods)")
            return soak_grpc(a, model, work, reqs)
        port = TS.free_port()
        srv = start(a.shardlm, model, work / "journal", port, "soak-0")
        proxy = Proxy(port) if a.cuts else None
        box = [int(proxy.target.rsplit(":", 1)[1]) if proxy else port]
        clients = [stream_of(*r) for r in reqs]
        deadline = time.time() + 1800
        t0 = time.time()
        threads = start_workers(a.concurrency, len(reqs),
                                lambda i: run_until_done(clients[i], box, f"soak-{os.getpid()}-{i}", deadline))
        srv, kills = kill_loop(a, srv, threads,
                               lambda k: start(a.shardlm, model, work / "journal", port, f"soak-{k}"), t0, proxy)
        elapsed = time.time() - t0
        srv.stop()
        # The uninterrupted answers (journaled with --apis: see above).
        ref_srv = start(a.shardlm, model, work / "ref-journal" if a.apis else None, TS.free_port(), "reference")
        refs = [stream_of(*r) for r in reqs]
        for t in start_workers(a.concurrency, len(reqs), lambda i: refs[i].read(ref_srv.http_port)):
            t.join()
        ref_srv.stop()
        lost = [i for i, c in enumerate(clients) if not c.done]
        diff = [i for i, (c, r) in enumerate(zip(clients, refs)) if c.done and answer(c) != answer(r)]
        reconnects = sum(len(c.statuses) - 1 for c in clients)
        tokens = sum(sum(len(v["text"]) for v in assemble(c.chunks)[0].values()) for c in clients
                     if not isinstance(c, EventStream))
        events = sum(len(c.events) for c in clients if isinstance(c, EventStream))
        print(f"requests {len(reqs)}, concurrency {a.concurrency}, {'cuts' if proxy else 'node losses' if a.kill_node else 'hung ranks' if a.hang_rank else 'SIGKILLs'} {kills}, "
              f"reconnections {reconnects}, "
              f"{elapsed:.1f} s, {tokens} text bytes received" + (f", {events} Anthropic / Responses events" if a.apis else ""))
        print(f"lost {len(lost)}, different from the uninterrupted answer {len(diff)}")
        print_recovery()
        for i in (lost + diff)[:5]:
            print(f"  request {i}: statuses {clients[i].statuses} lost={clients[i].lost} {reqs[i]}")
            if os.environ.get("SOAK_DEBUG"):
                got, want = answer(clients[i]), answer(refs[i])
                if isinstance(got, list):  # events: the first that differs
                    k = next((k for k, (x, y) in enumerate(zip(got, want)) if x != y), min(len(got), len(want)))
                    print(f"   {len(got)} events against {len(want)}; the first difference, event {k}:")
                    print("   got ", got[k:k + 2])
                    print("   want", want[k:k + 2])
                else:
                    print("   got ", got)
                    print("   want", want)
        return 0 if not lost and not diff and not outlived else 1
    finally:
        TS.kill_all()
        subprocess.run(["rm", "-rf", str(work)])


if __name__ == "__main__":
    sys.exit(main())
