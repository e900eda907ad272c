#!/usr/bin/env python3
"""`shardlm route` (server/proxy.h, issue 33): one HTTP address over separate `serve` jobs, each a
journaled stories260K replica under --batch-invariant. Groups:
  basic      answers through the router equal the replica's own (unary and streamed, seeded);
             both replicas get requests; a replica's 400 and 404 come back as they were; the
             router's /health and /metrics; a body over --max-body-bytes is 413; an
             Idempotency-Key goes to the same replica again
  failover   a body over the replicas' limit: their 413, relayed, no replica marked down; then
             a replica SIGKILLed under 4 clients looping on unary requests: not one request
             fails (the requests it held are sent to the live one), it is marked down; started
             again on the same port, it is up and gets requests again
  resume     journaled streams through the router, the replica of some of them SIGKILLed
             mid-way: while it is down their reconnections (Last-Event-ID) get 503 with
             Retry-After, not 404 (the others go on from the live replica); once it runs again
             on its journal, every stream assembled across its connections equals an
             uninterrupted server's answer
  down       no replica: 503 no_replica with Retry-After, the router's /health 503
  drain      SIGTERM to the router under a stream: the stream ends whole, the router exits 0
  nodes      (run by tests/test_router_nodes.sh inside node 0 of two network namespaces, the
             "nodes" of tests/netns_nodes.sh; not in the default list) one replica a node, each a
             job of 2 ranks at tp 2 (dp 2 x tp 2 over separate jobs), the router in node 0: unary
             clients and journaled streams through the router while node 1 is lost (every
             process of its namespace SIGKILLed): no unary call fails, the streams it held
             resume once node 1's replica runs again on its journal, and every stream equals
             its answer through the router before the loss; the time until the router saw the
             loss is printed
  grpc       gRPC has no router: the clients balance a target of several replicas themselves
             ("A:P,B:P"): the Python client under 4 threads looping on Generate while one replica
             is SIGKILLed: not one call fails, seeded answers equal one replica's own; the C
             client (`shardlm complete --server A:P,B:P`) answers with one replica down; a
             journaled stream (SmolLM2's GGUF, SKIP without it) whose replica is SIGKILLed
             mid-answer and restarted on its journal: the Python and the C client reattach (each
             replica in turn) and the text is the uninterrupted one
Reference answers come from a replica asked directly; no expected text is written here.

  test_router.py --shardlm BUILD/cli/shardlm [GROUP...]
"""
import http.client
import json
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.dont_write_bytecode = True
sys.path.insert(0, str(Path(__file__).resolve().parent))
try:
    import openai  # noqa: F401  (the suite's marker of installed test dependencies)
except ImportError as e:
    print(f"SKIP: a test dependency cannot be imported ({e}); run tools/install_deps.sh")
    sys.exit(77)
import test_server as TS  # noqa: E402
import stories_main as SM  # noqa: E402
import test_journal as TJ  # noqa: E402  (its stream client, assembler and unary helpers)
from checks import Checks  # noqa: E402

check = Checks()
FLAGS = ("--batch-invariant", "--max-seqs", "16", "--http-max-connections-per-address", "0")
PROMPTS = ["Once upon a time", "Tom had a red ball", "The cat sat", "A big dog ran", "Lily went to the park",
           "The sun was hot", "Mom said to Lily", "The bird flew"]


def unary(prompt, seed):
    return ("/v1/completions", dict(prompt=prompt, max_tokens=24, temperature=0.9, seed=seed))


class Router:
    """`shardlm route` over the given replicas (ports on 127.0.0.1, or HOST:PORT strings) on a
    free port of 127.0.0.1 (self.port)."""

    def __init__(self, shardlm, ports, *extra, name="router"):
        self.log_path = TS.LOG_DIR / f"{name}-{len(TS.SERVERS)}.log"
        self.log = open(self.log_path, "w")
        args = [shardlm, "route", "--listen", "127.0.0.1:0", "--probe-interval", "0.2", "--connect-timeout", "1"]
        for p in ports:
            args += ["--replica", p if isinstance(p, str) else f"127.0.0.1:{p}"]
        self.proc = subprocess.Popen([*args, *extra], stdout=subprocess.PIPE, stderr=self.log, text=True,
                                     env=dict(TS.os.environ, SHARDLM_LOG="info"))
        TS.SERVERS.append(self.proc)
        lines = queue.Queue()
        threading.Thread(target=lambda: [lines.put(x.strip()) for x in self.proc.stdout], daemon=True).start()
        self.port, deadline = None, time.time() + 20
        while time.time() < deadline:
            try:
                line = lines.get(timeout=0.2)
            except queue.Empty:
                if self.proc.poll() is not None:
                    break
                continue
            if line.startswith("shardlm: route listening on"):
                self.port = int(line.split(":")[-1])
            if line == "shardlm: ready":
                break
        if self.port is None:
            raise RuntimeError(f"the router did not start; log:\n{self.log_path.read_text()}")

    def metrics(self):
        """{(name, replica or None): value} of the router's /metrics."""
        _, _, text = TJ.get(self.port, "/metrics")
        out = {}
        for line in text.splitlines():
            if line.startswith("#") or not line.strip():
                continue
            name, value = line.rsplit(" ", 1)
            replica = name.split('replica="')[1].rstrip('"}') if "{" in name else None
            out[(name.split("{")[0], replica)] = float(value)
        return out

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        return self.proc.returncode


def loop_clients(n, call, calls=None):
    """n threads, each calling call(k, i) for i = 0, 1, ... until the returned event is set (or
    calls results are in); each result goes to the returned list with its time: (time, result).
    Returns (results, stop, threads)."""
    results, stop = [], threading.Event()

    def run(k):
        i = 0
        while not stop.is_set() and (calls is None or len(results) < calls):
            results.append((time.time(), call(k, i)))  # (list.append is atomic)
            i += 1
    threads = [threading.Thread(target=run, args=(k,)) for k in range(n)]
    for t in threads:
        t.start()
    return results, stop, threads


def post_unary(port, k, i):
    """One seeded completion of client k's i-th turn: (status or -1, the body's start)."""
    try:
        code, _, text = TJ.post(port, *unary(PROMPTS[(k + i) % len(PROMPTS)], 100 * k + i))
    except (OSError, http.client.HTTPException) as e:
        code, text = -1, repr(e)
    return code, text[:160]


def replica(shardlm, model, work, name, port=0):
    return TS.Server(shardlm, model, *FLAGS, "--journal", str(work / f"journal-{name}"), name=name, http=True,
                     http_listen=f"127.0.0.1:{port}")


def wait_for(what, cond, timeout=15):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if cond():
            return True
        time.sleep(0.05)
    check(False, f"{what} within {timeout} s")
    return False


def group_basic(shardlm, model, work):
    a, b = replica(shardlm, model, work, "a"), replica(shardlm, model, work, "b")
    r = Router(shardlm, [a.http_port, b.http_port], "--max-body-bytes", "64K")
    code, _, text = TJ.get(r.port, "/health")
    check(code == 200 and json.loads(text)["replicas_up"] == 2, f"the router's /health: {code} {text}")
    reqs = [unary(p, 20 + i) for i, p in enumerate(PROMPTS)]
    want = [TJ.post(a.http_port, p, body) for p, body in reqs]
    got = [None] * len(reqs)

    def ask(i):
        got[i] = TJ.post(r.port, *reqs[i])
    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(reqs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    same = all(g and g[0] == 200 and TJ.unary_view(g[2])[0] == TJ.unary_view(w[2])[0] for g, w in zip(got, want))
    check(same, f"{len(reqs)} seeded completions through the router equal the replica's own answers")
    m = r.metrics()
    relayed = [m[("shardlm_router_replica_relayed_total", f"127.0.0.1:{p}")] for p in (a.http_port, b.http_port)]
    check(all(x >= 1 for x in relayed) and sum(relayed) == len(reqs),
          f"both replicas answered through the router (relayed {relayed} of {len(reqs)})")
    check(m[("shardlm_router_replica_up", f"127.0.0.1:{a.http_port}")] == 1, "/metrics: the replica is up")
    # Streamed: the same chunks' text as asked directly.
    path, body = TJ.STREAMS[0]
    direct, routed = TJ.Stream(path, body), TJ.Stream(path, body)
    direct.read(a.http_port)
    routed.read(r.port)
    check(routed.done and TJ.assemble(routed.chunks)[0] == TJ.assemble(direct.chunks)[0],
          f"a streamed chat through the router equals the replica's own ({len(routed.chunks)} chunks)")
    # A replica's errors come back as they were.
    bad = ("/v1/completions", dict(prompt="x", max_tokens=-5))
    want_bad, got_bad = TJ.post(a.http_port, *bad), TJ.post(r.port, *bad)
    check(got_bad[0] == 400 and got_bad[2] == want_bad[2], f"a 400 relayed as the replica gave it: {got_bad[2][:120]}")
    code, _, text = TJ.get(r.port, "/v1/nothing")
    check(code == 404 and text == TJ.get(a.http_port, "/v1/nothing")[2], f"an unknown route: the replicas' 404 ({code})")
    code, _, text = TJ.get(r.port, "/v1/models")
    check(code == 200 and json.loads(text)["data"], f"GET /v1/models through the router: {code}")
    code, _, text = TJ.post(r.port, "/v1/completions", dict(prompt="x" * 70000, max_tokens=1))
    check(code == 413 and "max-body-bytes" in text, f"a body over --max-body-bytes 64K: {code} {text[:100]}")
    # An Idempotency-Key: the same answer, from the same replica, twice.
    before = r.metrics()
    key = f"router-idem-{TS.os.getpid()}"
    first = TJ.post(r.port, *unary("The sun was hot", 3), {"Idempotency-Key": key})
    second = TJ.post(r.port, *unary("The sun was hot", 3), {"Idempotency-Key": key})
    after = r.metrics()
    moved = [after[("shardlm_router_replica_relayed_total", f"127.0.0.1:{p}")] -
             before[("shardlm_router_replica_relayed_total", f"127.0.0.1:{p}")] for p in (a.http_port, b.http_port)]
    check(first[0] == 200 and second[0] == 200 and json.loads(first[2])["id"] == key and
          TJ.unary_view(first[2]) == TJ.unary_view(second[2]), "an Idempotency-Key's second request gets the same answer")
    check(sorted(moved) == [0, 2], f"both requests of one Idempotency-Key went to one replica ({moved})")
    check(r.stop() == 0, "the router exits 0 on SIGTERM")
    a.stop()
    b.stop()


def group_failover(shardlm, model, work):
    a, b = replica(shardlm, model, work, "fa"), replica(shardlm, model, work, "fb")
    b_port = b.http_port
    r = Router(shardlm, [a.http_port, b_port])
    # A replica refusing a body on its declared length (413, then it closes without reading it):
    # its answer is relayed, and it is not taken for a lost replica.
    code, _, text = TJ.post(r.port, "/v1/completions", dict(prompt="x" * (5 << 20), max_tokens=1))
    m = r.metrics()
    check(code == 413 and "max-message-bytes" in text and m[("shardlm_router_retries_total", None)] == 0,
          f"a body over the replicas' --max-message-bytes: their 413, no retry ({code} {text[:100]})")
    results, stop, threads = loop_clients(4, lambda k, i: post_unary(r.port, k, i))
    time.sleep(1.5)
    b.proc.send_signal(signal.SIGKILL)
    b.proc.wait(timeout=20)
    killed_at = time.time()
    b.log.close()
    wait_for("the killed replica marked down in /metrics",
             lambda: r.metrics()[("shardlm_router_replica_up", f"127.0.0.1:{b_port}")] == 0)
    time.sleep(1.5)
    b = replica(shardlm, model, work, "fb", port=b_port)
    wait_for("the restarted replica marked up",
             lambda: r.metrics()[("shardlm_router_replica_up", f"127.0.0.1:{b_port}")] == 1)
    relayed = r.metrics()[("shardlm_router_replica_relayed_total", f"127.0.0.1:{b_port}")]
    time.sleep(1.5)
    stop.set()
    for t in threads:
        t.join(timeout=60)
    bad = [x for x in results if x[1][0] != 200]
    after = [x for x in results if x[0] > killed_at]
    check(len(results) > 20 and len(after) > 10 and not bad,
          f"{len(results)} unary requests ({len(after)} after the kill), none failed: {bad[:3]}")
    m = r.metrics()
    check(m[("shardlm_router_replica_relayed_total", f"127.0.0.1:{b_port}")] > relayed,
          "the restarted replica gets requests again")
    check(m[("shardlm_router_replica_failures_total", f"127.0.0.1:{b_port}")] >= 1 and
          m[("shardlm_router_retries_total", None)] >= 1, "the loss is counted (failures, retries)")
    r.stop()
    a.stop()
    b.stop()


def same_answer(got, want):
    """Assembled streams (TJ.assemble) equal: text and finish per choice, the usage but for its
    cached tokens (a prefix-cache hit differs by where the request ran)."""
    def usage(u):
        return [{k: v for k, v in x.items() if k != "prompt_tokens_details"} for x in u]
    return ({k: (v["text"], v["finish"]) for k, v in got[0].items()} ==
            {k: (v["text"], v["finish"]) for k, v in want[0].items()} and usage(got[1]) == usage(want[1]))


def hold_streams(port):
    """TJ.STREAMS started through port, each read 6 chunks and then held open (the replica is about
    to be killed): (streams, reader threads)."""
    streams = [TJ.Stream(p, body) for p, body in TJ.STREAMS]
    threads = [threading.Thread(target=s.read, args=(port, 6)) for s in streams]
    for t in threads:
        t.start()
    for s in streams:
        s.progress.wait(timeout=60)
    return streams, threads


def finish_streams(streams, port):
    """Each stream reconnected (read_until_done) until it ends; the refused tries' statuses."""
    refused = []
    readers = [threading.Thread(target=read_until_done, args=(s, port, refused)) for s in streams]
    for t in readers:
        t.start()
    for t in readers:
        t.join(timeout=120)
    return refused


def read_until_done(s, port, seen, timeout=90):
    """Reconnects s (Last-Event-ID) until its stream ends; the statuses of refused tries go to
    seen."""
    deadline = time.time() + timeout
    while not s.done and time.time() < deadline:
        n = len(s.statuses)
        s.read(port)
        if len(s.statuses) > n and s.statuses[-1] != 200:
            seen.append((s.statuses[-1], getattr(s, "error", "")[:200]))
            time.sleep(0.2)


def group_resume(shardlm, model, work):
    ref_streams, _ = TJ.references(shardlm, model, work)
    a, b = replica(shardlm, model, work, "ra"), replica(shardlm, model, work, "rb")
    b_port, b_journal = b.http_port, work / "journal-rb"
    r = Router(shardlm, [a.http_port, b_port])
    # The streams B answered: its relayed count over their start (a stream B finished before the
    # kill is no longer in flight, yet its journal, and so its reconnection, is B's).
    before = r.metrics()[("shardlm_router_replica_relayed_total", f"127.0.0.1:{b_port}")]
    streams, threads = hold_streams(r.port)
    on_b = r.metrics()[("shardlm_router_replica_relayed_total", f"127.0.0.1:{b_port}")] - before
    TJ.kill9(b)
    for t in threads:
        t.join(timeout=60)
    # A stream may end within its first 6 chunks (seed 8's stop string "dog" did, on a Xeon whose
    # sampled text differs from the AMD VMs'): it counts as the replica's (its journal is there)
    # but was not in flight, so at least one of the killed replica's streams must not have ended.
    ended = [s.done for s in streams]
    check(on_b >= 1 and on_b < len(streams) and not all(ended),
          f"the killed replica answered {on_b:.0f} of {len(streams)} streams (each read 6 chunks, then held; "
          f"{sum(ended)} ended before)")
    # While it is down: the streams it held cannot be resumed yet (503 and Retry-After, not 404);
    # the others resume on the live replica.
    seen = []
    for s in streams:
        s.read(r.port)
        seen.append(s.statuses[-1])
    check(seen.count(503) == on_b and seen.count(200) == len(streams) - on_b,
          f"reconnections while the replica is down: 503 for its {on_b:.0f} stream(s), 200 for the rest ({seen})")
    check(any(code == 503 and not e for code, e in zip(seen, ended)),
          f"the killed replica held a stream in flight (503s {seen}, ended before the kill {ended})")
    b = TS.Server(shardlm, model, *FLAGS, "--journal", str(b_journal), name="rb2", http=True,
                  http_listen=f"127.0.0.1:{b_port}")
    refused = finish_streams(streams, r.port)
    for i, (s, ref) in enumerate(zip(streams, ref_streams)):
        check(s.done and same_answer(TJ.assemble(s.chunks), ref),
              f"stream {i} ({TJ.STREAMS[i][0]}) through the router, across {len(s.statuses)} connections "
              f"({s.statuses}), equals the uninterrupted answer")
    check(all(code == 503 for code, _ in refused), f"reconnections refused after the restart: only 503s ({refused[:3]})")
    r.stop()
    a.stop()
    b.stop()


def group_down(shardlm, model, work):
    a = replica(shardlm, model, work, "da")
    port = a.http_port
    a.stop()
    r = Router(shardlm, [port])
    code, headers, text = TJ.post(r.port, *unary("x", 1))
    check(code == 503 and headers.get("Retry-After") == "1" and "no_replica" in text,
          f"no replica reachable: 503 with Retry-After ({code} {text[:120]})")
    code, _, text = TJ.get(r.port, "/health")
    check(code == 503 and json.loads(text)["replicas_up"] == 0, f"the router's /health with no replica: {code}")
    r.stop()


def group_drain(shardlm, model, work):
    a = replica(shardlm, model, work, "dr")
    r = Router(shardlm, [a.http_port], "--drain-timeout", "30")
    path, body = TJ.STREAMS[0]
    s = TJ.Stream(path, body)
    t = threading.Thread(target=s.read, args=(r.port,))
    t.start()
    wait_for("the stream's first chunk", lambda: s.chunks)
    r.proc.send_signal(signal.SIGTERM)
    t.join(timeout=60)
    check(s.done and TJ.assemble(s.chunks)[0][0]["finish"], f"a stream under SIGTERM ends whole ({len(s.chunks)} chunks)")
    check(r.stop() == 0, "the router exits 0 after the drain")
    a.stop()


SMOLLM2 = TS.ROOT / ".cache/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def journaled_streams(shardlm, work):
    """A journaled stream over two replicas (SmolLM2's GGUF: slow enough that a kill lands
    mid-answer) whose replica is SIGKILLed after some chunks and started again on its journal (the
    same port): the Python client, then the C client (`shardlm complete --stream`), reattach by the
    token on each replica in turn (NOT_FOUND from the other) and get the uninterrupted text."""
    if not SMOLLM2.exists():
        print(f"SKIP: journaled streams over replicas: no {SMOLLM2} (tools/fetch_smollm2.sh)")
        return
    import shardlm_client as SC
    ports = [TS.free_port(), TS.free_port()]

    def journaled(i, name):
        return TS.Server(shardlm, SMOLLM2, "--batch-invariant", "--journal", str(work / f"journal-g{i}"), "--listen",
                         f"127.0.0.1:{ports[i]}", name=name)

    def holder(js, before):
        return next(k for k in range(2) if js[k].client().server_stats().requests_submitted > before[k])
    js = [journaled(0, "gj0"), journaled(1, "gj1")]
    story = dict(max_tokens=160, temperature=0.9, seed=11)
    want = "".join(ch.text for ch in js[0].client().generate_stream(TJ.STORY, **story))
    before = [x.client().server_stats().requests_submitted for x in js]
    pair = SC.Client(f"127.0.0.1:{ports[0]},127.0.0.1:{ports[1]}")
    stream, got, restarted, held, starter = pair.generate_stream(TJ.STORY, **story), [], [], None, None
    for ch in stream:
        got.append(ch.text)
        if len(got) == 3:
            held = holder(js, before)
            js[held].proc.send_signal(signal.SIGKILL)
            js[held].proc.wait(timeout=20)
            js[held].log.close()
            starter = threading.Thread(target=lambda: restarted.append(journaled(held, f"gj{held}-again")), daemon=True)
            starter.start()
    # The stream can end while the restart's constructor still waits for its health check; how
    # many chunks the catch-up came in depends on how far the restarted replica got before the
    # client came back, so the reattach is read from the restarted replica's log.
    if starter:
        starter.join(timeout=120)
    reattached = bool(restarted) and "a gRPC client reattached" in restarted[0].log_path.read_text()
    check(reattached and "".join(got) == want,
          f"Python client: a journaled stream over two replicas, its replica ({held}) SIGKILLed after 3 chunks and "
          f"started again on its journal: reattached (the restarted replica's log: {reattached}), the text equals "
          f"the uninterrupted answer ({len(got)} chunks)")
    pair.close()
    js[held] = restarted[0]
    before = [x.client().server_stats().requests_submitted for x in js]
    cli = subprocess.Popen([shardlm, "complete", "--stream", "--server", f"127.0.0.1:{ports[0]},127.0.0.1:{ports[1]}",
                            "--prompt", TJ.STORY, "--max-tokens", "160", "--temperature", "0.9", "--seed", "11"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=0)
    head = cli.stdout.read(len(TJ.STORY) + 8)
    held = holder(js, before)
    js[held].proc.send_signal(signal.SIGKILL)
    js[held].proc.wait(timeout=20)
    js[held].log.close()
    js[held] = journaled(held, f"gj{held}-c")
    rest, err = cli.communicate(timeout=120)
    text = (head + rest).decode()
    reattached = "a gRPC client reattached" in js[held].log_path.read_text()
    check(cli.returncode == 0 and reattached and text.strip() == (TJ.STORY + want).strip(),
          f"C client: the same, its stream's replica ({held}) SIGKILLed and started again: exit {cli.returncode}, "
          f"reattached (the log: {reattached}), the text equals the uninterrupted answer ({err.decode().strip()[-120:]})")
    for x in js:
        x.stop()


def group_grpc(shardlm, model, work):
    import shardlm_client as SC
    import grpc
    a, b = TS.Server(shardlm, model, *FLAGS, name="ga"), TS.Server(shardlm, model, *FLAGS, name="gb")
    want = {seed: a.client().generate(PROMPTS[seed % len(PROMPTS)], max_tokens=24, temperature=0.9, seed=seed).text
            for seed in range(8)}
    both = SC.Client(f"{a.target},{b.target}")
    def call(k, i):
        seed = (k + i) % 8
        try:
            got = both.generate(PROMPTS[seed % len(PROMPTS)], max_tokens=24, temperature=0.9, seed=seed).text
            return "OK" if got == want[seed] else f"different text for seed {seed}"
        except grpc.RpcError as e:
            return str(e.code())
    results, stop, threads = loop_clients(4, call)
    time.sleep(1.5)
    b.proc.send_signal(signal.SIGKILL)
    b.proc.wait(timeout=20)
    b.log.close()
    killed_at = time.time()
    time.sleep(2.0)
    stop.set()
    for t in threads:
        t.join(timeout=60)
    bad = [x for x in results if x[1] != "OK"]
    after = [x for x in results if x[0] > killed_at]
    check(len(results) > 20 and len(after) > 10 and not bad,
          f"Python client over two replicas: {len(results)} Generate calls ({len(after)} after one replica's "
          f"SIGKILL), none failed or differed: {bad[:3]}")
    both.close()
    journaled_streams(shardlm, work)
    out = subprocess.run([shardlm, "complete", "--server", f"{b.target},{a.target}", "--prompt", PROMPTS[1],
                          "--max-tokens", "24", "--temperature", "0.9", "--seed", "1"],
                         capture_output=True, text=True, timeout=60)
    check(out.returncode == 0 and want[1].strip() in out.stdout,
          f"`shardlm complete --server DOWN,UP` answers from the live replica (exit {out.returncode}, "
          f"{out.stdout.strip()[:100]!r} vs {want[1].strip()[:60]!r})")
    a.stop()


def group_nodes(shardlm, model, work):
    nodes = TS.os.environ.get("SHARDLM_ROUTER_NODES", "").split()
    if len(nodes) != 2:
        check(False, "the nodes group runs under tests/test_router_nodes.sh (SHARDLM_ROUTER_NODES names two nodes)")
        return
    calls = int(TS.os.environ.get("SHARDLM_ROUTER_CALLS", "400"))
    concurrency = int(TS.os.environ.get("SHARDLM_ROUTER_CONCURRENCY", "8"))
    addrs = ["10.78.0.1:8000", "10.78.0.2:8000"]

    def start(i, name):
        launcher = (["ip", "netns", "exec", nodes[1]] if i else []) + ["mpirun", "-n", "2", "-x", "OMP_NUM_THREADS"]
        return TS.Server(shardlm, model, *FLAGS, "--tp", "2", "--rank-timeout", "2", "--journal",
                         str(work / f"journal-node{i}"), name=name, http=True, http_listen=addrs[i], launcher=launcher)
    reps = [start(0, "node0"), start(1, "node1")]
    r = Router(shardlm, addrs)
    ref_streams = []
    for path, body in TJ.STREAMS:  # through the router before the loss: one replica's own (tp 2 both)
        s = TJ.Stream(path, body)
        s.read(r.port)
        check(s.done, f"reference stream {path} seed {body['seed']} through the router ends with [DONE]")
        ref_streams.append(TJ.assemble(s.chunks))
    before = r.metrics()[("shardlm_router_replica_relayed_total", addrs[1])]
    streams, readers = hold_streams(r.port)
    on_1 = r.metrics()[("shardlm_router_replica_relayed_total", addrs[1])] - before  # the streams node 1 answered
    results, stop, threads = loop_clients(concurrency, lambda k, i: post_unary(r.port, k, i), calls=calls)
    wait_for("a third of the calls", lambda: len(results) >= calls // 3, timeout=300)
    pids = subprocess.run(["ip", "netns", "pids", nodes[1]], capture_output=True, text=True).stdout.split()
    subprocess.run(["kill", "-9", *pids])
    killed_at = time.time()
    wait_for("node 1's replica marked down", lambda: r.metrics()[("shardlm_router_replica_up", addrs[1])] == 0)
    seen_down = time.time() - killed_at
    reps[1].proc.wait(timeout=20)
    reps[1].log.close()
    for t in readers:
        t.join(timeout=60)
    wait_for("two thirds of the calls", lambda: len(results) >= 2 * calls // 3, timeout=300)
    restart_at = time.time()
    reps[1] = start(1, "node1-again")
    wait_for("node 1's replica marked up again", lambda: r.metrics()[("shardlm_router_replica_up", addrs[1])] == 1)
    up_after = time.time() - restart_at
    refused = finish_streams(streams, r.port)
    for t in threads:
        t.join(timeout=300)
    stop.set()
    bad = [x for x in results if x[1][0] != 200]
    after = [x for x in results if x[0] > killed_at]
    check(on_1 >= 1, f"node 1's replica held {on_1:.0f} of the {len(streams)} streams when it was lost")
    m = r.metrics()
    print(f"{len(results)} calls at concurrency {concurrency}; node 1 lost with {on_1:.0f} stream(s) on it: the router "
          f"saw it after {seen_down:.2f} s; {m[('shardlm_router_retries_total', None)]:.0f} request(s) sent on to "
          f"another replica in all; its replica, started again, was marked up {up_after:.1f} s after its start")
    check(len(results) >= calls and len(after) > 10 and not bad,
          f"{len(results)} unary calls through the router across two nodes ({len(after)} after node 1 was lost), "
          f"none failed: {bad[:3]}")
    for i, (s, ref) in enumerate(zip(streams, ref_streams)):
        check(s.done and same_answer(TJ.assemble(s.chunks), ref),
              f"stream {i} ({TJ.STREAMS[i][0]}) across the node's loss, {len(s.statuses)} connections ({s.statuses}), "
              f"equals the answer before the loss")
    check(m[("shardlm_router_replica_relayed_total", addrs[1])] >= 1, "node 1's replica answers again after its restart")
    r.stop()
    for x in reps:
        x.stop()


GROUPS = {"basic": group_basic, "failover": group_failover, "resume": group_resume, "down": group_down,
          "drain": group_drain, "grpc": group_grpc}
DEFAULT = [g for g in GROUPS if g != "nodes"]

if __name__ == "__main__":
    GROUPS["nodes"] = group_nodes
    sys.exit(SM.stories_groups_main("shardlm-router-", DEFAULT, check,
                                    lambda g, shardlm, model, work, a: GROUPS[g](shardlm, model, work)))
