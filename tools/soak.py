#!/usr/bin/env python3
"""tools/soak.py - a bounded soak of a real `shardlm serve` over gRPC (issue 18).

Issues --requests calls (default 10,000) at --concurrency (default 64) through a few gRPC
connections: Generate and Chat, unary and streamed, with random sampling parameters (temperature,
top_p, top_k, min_p, penalties, max_tokens, stop strings, seed, logprobs, n > 1 for some). About
20 % of the calls are cancelled by the client at a random moment (a timer, after a random number
of streamed chunks, or by Cancel(request_id) from another connection) and about 10 % carry a
deadline of a few milliseconds. Every final status is counted; then it checks:

  - no unexpected status: a plain call must end OK, a cancelled one OK or CANCELLED, a call with
    a short deadline OK or DEADLINE_EXCEEDED, and any of them RESOURCE_EXHAUSTED when --max-queue
    is among the server's arguments; an OK result must be whole (every sample has a finish reason
    and at most max_tokens tokens);
  - the server settles: nothing running or waiting, every request it accepted finished, every KV
    block free or in the prefix cache (GetServerStats), only the stats call itself open;
  - the server's RSS at the end is at most 5 % above its RSS after warm-up (/proc/PID/status
    VmRSS). Warm-up ends when 10 % of the calls finished and the KV pool has been used up once
    (its pages are only touched when a block is first written), else at half the calls; KV
    blocks first taken after the warm-up are then counted out of the growth;
  - its open file descriptors (/proc/PID/fd) at the end equal those at the start (the same
    connections open; about 5 % of the calls open and close a connection of their own, some
    closing it mid-call);
  - it still answers a plain request, and (when the script started it) exits 0 on SIGTERM.

It prints a table of calls by kind and status, the throughput, RSS and descriptors, and exits
1 when a check failed (0 when all passed, 77 when the model assets or grpcio are missing).

By default the script converts stories260K from $SHARDLM_ASSETS (else ../shared/assets next to
the checkout) and starts `shardlm serve --listen 127.0.0.1:0 --threads 1 SERVE_ARGS` itself;
--target HOST:PORT soaks a server that is already running instead (pass --server-pid for the RSS
and descriptor checks, which are skipped otherwise; the settle check then assumes nobody else
uses that server). ctest runs a short version as `soak_short` (tests/server/CMakeLists.txt),
with shardlm_client imported from the copy that the build installed ($SHARDLM_PY_CLIENT, set by
ctest to BUILD/clients/python/site-packages); without that variable, from the checkout.
Figures and commands: docs/reliability.md.

  tools/soak.py --shardlm build/cli/shardlm                        # 10,000 calls at 64
  tools/soak.py --shardlm build/cli/shardlm --requests 1500 --concurrency 24 --duration 60
"""
import argparse
import heapq
import itertools
import os
import queue
import random
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SKIP = 77
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")



sys.path.insert(0, str(Path(__file__).resolve().parent))
from client_import import import_client  # noqa: E402

try:
    import grpc
    import_client()
    from shardlm_client import Client, pb, pb_grpc
except ImportError as e:  # grpcio / protobuf missing
    print(f"SKIP: the Python gRPC client cannot be imported ({e}); run tools/install_deps.sh")
    sys.exit(SKIP)

PROMPTS = ["Once upon a time", "The little dog", "Lily and Ben went to the park.", "One day, a big bird",
           "There was a girl named Sue. She", "Tom liked to play with his red ball", "", "The sun was hot and"]
STOPS = [" the", ".", "\n", "Lily", " and", "!", "said", " b", "xyz-never"]
FINISH_OK = {1, 2, 3}  # length, stop, eos (protos: FinishReason)
RSS_GROWTH = 0.05      # allowed RSS growth from warm-up to the end
CANCEL_RPCS = Counter()  # statuses of the Cancel(request_id) calls: OK, or NOT_FOUND once the call ended


# ---- the plan: every call decided up front from --seed ----------------------------------------

def plan_call(rng, i, max_n, pool_tokens, block_tokens):
    """One call: method, streamed or not, its fate (plain / cancel / deadline) and its request
    fields. Every request fits the model's context (512 tokens for stories260K: prompts of at
    most about 250 tokens, max_tokens at most 256) and, with all its n samples, the KV pool of
    pool_tokens tokens, so that INVALID_ARGUMENT is never an expected answer."""
    method = rng.choice(("Generate", "Chat"))
    stream = rng.random() < 0.5
    r = rng.random()
    fate = "cancel" if r < 0.20 else "deadline" if r < 0.30 else "plain"
    # Shared long prefixes now and then, for the prefix cache (14 tokens a repeat; the prompts
    # below and a chat template's framing add at most about 45).
    prompt = rng.choice(PROMPTS)
    if rng.random() < 0.2:
        repeats = min(rng.randint(1, 15), max(0, (pool_tokens // 2 - 45) // 14))
        prompt = "Once upon a time, there was a little house. " * repeats + prompt
    prompt_max = 14 * prompt.count("little house") + 45
    s = {"max_tokens": max(1, min(256, 1 + int(rng.expovariate(1 / 40)), pool_tokens - prompt_max - block_tokens))}
    if rng.random() < 0.75:
        s["temperature"] = 0.0 if rng.random() < 0.3 else round(rng.uniform(0.1, 1.5), 3)
    if rng.random() < 0.4:
        s["top_p"] = round(rng.uniform(0.05, 1.0), 3)
    if rng.random() < 0.4:
        s["top_k"] = rng.randint(1, 512)
    if rng.random() < 0.15:
        s["min_p"] = round(rng.uniform(0.0, 0.3), 3)
    if rng.random() < 0.15:
        s["repetition_penalty"] = round(rng.uniform(0.8, 1.5), 3)
    if rng.random() < 0.1:
        s["presence_penalty"] = round(rng.uniform(-1, 1), 3)
        s["frequency_penalty"] = round(rng.uniform(-1, 1), 3)
    if rng.random() < 0.3:
        s["stop"] = rng.sample(STOPS, rng.randint(1, 3))
    if rng.random() < 0.5:
        s["seed"] = rng.randrange(1 << 63)
    if rng.random() < 0.1:
        s["logprobs"] = rng.randint(0, 5)
    if rng.random() < 0.1:
        s["ignore_eos"] = True
    if rng.random() < 0.05:
        s["min_tokens"] = rng.randint(0, s["max_tokens"])
    if max_n > 1 and rng.random() < 0.15:
        fits = pool_tokens // (prompt_max + s["max_tokens"] + block_tokens)
        s["n"] = max(1, min(rng.randint(2, max_n), fits))
    call = {"i": i, "method": method, "stream": stream, "fate": fate, "sampling": s,
            "request_id": f"soak-{i}"}
    if method == "Generate":
        call["prompt"] = prompt
    else:
        msgs = [("user", prompt or "Tell me a story")]
        if rng.random() < 0.3:
            msgs = [("system", "You tell short stories.")] + msgs
        call["messages"] = msgs
    if fate == "cancel":
        call["cancel"] = rng.choice(("timer", "timer", "chunks", "rpc", "close") if stream else ("timer", "timer", "rpc", "close"))
        # Mostly within a call's lifetime (tens to hundreds of ms here), some before it starts.
        call["cancel_after"] = rng.uniform(0, 0.005) if rng.random() < 0.2 else rng.uniform(0, 0.1)
        call["cancel_chunks"] = rng.randint(1, 8)
    elif fate == "deadline":
        call["deadline"] = rng.uniform(0.001, 0.020)
    # Connection churn: some calls open a connection of their own and close it afterwards (or,
    # for the cancel "close", at the cancel moment: the client goes away mid-call).
    call["fresh"] = call.get("cancel") == "close" or rng.random() < 0.05
    return call


def request_of(call):
    s = call["sampling"]
    if call["method"] == "Generate":
        return Client.generate_request(call["prompt"], request_id=call["request_id"], **s)
    return Client.chat_request(call["messages"], request_id=call["request_id"], **s)


# ---- cancelling at a moment: one timer thread for every call -----------------------------------

class Canceller:
    """Runs fn() at monotonic time t, for many (t, fn) at once, on one thread."""

    def __init__(self):
        self.heap, self.seq, self.cv, self.closed = [], itertools.count(), threading.Condition(), False
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def at(self, delay, fn):
        with self.cv:
            heapq.heappush(self.heap, (time.monotonic() + delay, next(self.seq), fn))
            self.cv.notify()

    def close(self):
        with self.cv:
            self.closed = True
            self.cv.notify()
        self.thread.join(timeout=10)

    def _run(self):
        while True:
            with self.cv:
                while not self.closed and (not self.heap or self.heap[0][0] > time.monotonic()):
                    self.cv.wait(None if not self.heap else max(0.0, self.heap[0][0] - time.monotonic()))
                if self.closed:
                    return
                _, _, fn = heapq.heappop(self.heap)
            try:
                fn()
            except Exception:  # noqa: BLE001 - a cancel that comes too late is not an error
                pass


# ---- running one call --------------------------------------------------------------------------

def check_unary(call, r):
    """'' when an OK unary result is whole, else what is wrong with it."""
    n, max_t = call["sampling"].get("n", 1), call["sampling"]["max_tokens"]
    if len(r.completions) != n:
        return f"{len(r.completions)} completions, asked {n}"
    for c in r.completions:
        if c.finish_reason not in FINISH_OK or len(c.token_ids) > max_t:
            return f"sample {c.index}: finish {c.finish_reason}, {len(c.token_ids)} tokens (max {max_t})"
    return ""


def check_stream(call, finishes, tokens):
    n, max_t = call["sampling"].get("n", 1), call["sampling"]["max_tokens"]
    if sorted(finishes) != list(range(n)):
        return f"finish reasons for samples {sorted(finishes)}, asked {n}"
    for k, f in finishes.items():
        if f not in FINISH_OK or tokens[k] > max_t:
            return f"sample {k}: finish {f}, {tokens[k]} tokens (max {max_t})"
    return ""


CHANNEL_OPTIONS = [("grpc.use_local_subchannel_pool", 1), ("grpc.max_receive_message_length", 64 << 20)]


def run_call(call, stub, cancel_stub, canceller, call_timeout, target):
    """Runs one call to its end, on stub or, for call["fresh"], on a connection of its own.
    Returns (status name, text): for OK, what is wrong with the result ('' when it is whole);
    otherwise the status message."""
    if not call["fresh"]:
        return run_on(call, stub, cancel_stub, canceller, call_timeout, None)
    channel = grpc.insecure_channel(target, options=CHANNEL_OPTIONS)
    try:
        return run_on(call, pb_grpc.TextGenerationStub(channel), cancel_stub, canceller, call_timeout, channel)
    finally:
        channel.close()


def run_on(call, stub, cancel_stub, canceller, call_timeout, channel):
    req = request_of(call)
    timeout = call.get("deadline", call_timeout)
    how = call.get("cancel")

    def cancel_rpc():  # Cancel(request_id) from the control connection; its own status is counted too
        try:
            cancel_stub.Cancel(pb.CancelRequest(request_id=call["request_id"]), timeout=10)
            CANCEL_RPCS["OK"] += 1
        except grpc.RpcError as e:
            CANCEL_RPCS[e.code().name] += 1
    by = {"rpc": cancel_rpc, "close": channel.close if channel else None}
    if not call["stream"]:
        fut = getattr(stub, call["method"]).future(req, timeout=timeout)
        if how:
            canceller.at(call["cancel_after"], by.get(how, fut.cancel))
        try:
            return "OK", check_unary(call, fut.result())
        except grpc.FutureCancelledError:
            return "CANCELLED", ""
        except grpc.RpcError as e:
            return e.code().name, e.details() or ""
    it = getattr(stub, call["method"] + "Stream")(req, timeout=timeout)
    if how in ("timer", "rpc", "close"):
        canceller.at(call["cancel_after"], by.get(how, it.cancel))
    finishes, tokens, chunks = {}, defaultdict(int), 0
    try:
        for ch in it:
            chunks += 1
            tokens[ch.index] += len(ch.token_ids)
            if ch.finish_reason:
                if ch.index in finishes:
                    return "OK", f"sample {ch.index} finished twice"
                finishes[ch.index] = ch.finish_reason
            if how == "chunks" and chunks == call["cancel_chunks"]:
                it.cancel()
        return "OK", check_stream(call, finishes, tokens)
    except grpc.RpcError as e:
        return e.code().name, e.details() or ""


def expected(call, status, max_queue):
    if status == "RESOURCE_EXHAUSTED" and max_queue:
        return True
    return status == "OK" or status == {"cancel": "CANCELLED", "deadline": "DEADLINE_EXCEEDED"}.get(call["fate"])


# ---- the server --------------------------------------------------------------------------------

class Server:
    """`shardlm serve` on 127.0.0.1:0 (the port read from its stdout), its stderr in a log file."""

    def __init__(self, shardlm, model, extra, log_path, launcher=()):
        self.log_path = log_path
        self.log = open(log_path, "w")
        env = dict(os.environ, OMP_NUM_THREADS="1", OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
        env.setdefault("SHARDLM_LOG", "warn")
        self.proc = subprocess.Popen([*launcher, shardlm, "serve", "--model", str(model), "--listen", "127.0.0.1:0",
                                      "--threads", "1", *extra], stdout=subprocess.PIPE, stderr=self.log, text=True,
                                     env=env)
        lines = queue.Queue()
        threading.Thread(target=lambda: [lines.put(x.strip()) for x in self.proc.stdout], daemon=True).start()
        self.port, ready, end = None, False, time.time() + 60
        while time.time() < end and not ready and self.proc.poll() is None:
            try:
                line = lines.get(timeout=0.2)
            except queue.Empty:
                continue
            if line.startswith("shardlm: listening on"):
                self.port = int(line.split(":")[-1].split()[0])
            ready = line.startswith("shardlm: ready")
        if not ready or self.port is None:
            self.kill()
            raise RuntimeError(f"the server did not start; log:\n{log_path.read_text()}")
        self.target, self.pid = f"127.0.0.1:{self.port}", self.proc.pid
        if launcher:  # mpirun: the checks and the SIGTERM go to rank 0, the serving process
            self.pid = rank_zero(self.proc.pid)

    def terminate(self, timeout=60):
        """SIGTERM (to rank 0 under mpirun, which then stops the other ranks; mpirun's own
        forwarding SIGKILLs them a second later), then the exit code (None when killed)."""
        os.kill(self.pid, signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            return None

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.log.close()


def rank_zero(mpirun_pid):
    """The child of mpirun that is world rank 0."""
    out = subprocess.run(["pgrep", "-P", str(mpirun_pid)], capture_output=True, text=True).stdout.split()
    for pid in out:
        try:
            if b"OMPI_COMM_WORLD_RANK=0" in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                return int(pid)
        except OSError:
            pass
    raise RuntimeError(f"no rank 0 among mpirun {mpirun_pid}'s children {out}")


def rss_kib(pid):
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS in /proc/{pid}/status")


def n_fds(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


def stats_settled(stats_stub):
    s = stats_stub.GetServerStats(pb.GetServerStatsRequest(), timeout=10)
    settled = s.running == 0 and s.waiting == 0 and s.requests_finished == s.requests_submitted and \
        s.kv_blocks_free + s.kv_blocks_cached == s.kv_blocks_total and s.active_calls <= 1
    return settled, s


def find_model(args, work):
    """The serving directory: --model as given when it holds config.json, else stories260K
    converted from --model or the assets into work/. None when the assets are missing."""
    src = Path(args.model) if args.model else \
        Path(os.environ.get("SHARDLM_ASSETS", ROOT.parent / "shared/assets")) / "stories260K"
    if (src / "config.json").exists():
        return src
    if not (src / "stories260K.bin").exists() or not (src / "tok512.model").exists():
        return None
    out = work / "stories260K"
    subprocess.run([args.shardlm, "convert", "llama2c", "--checkpoint", str(src / "stories260K.bin"), "--tokenizer",
                    str(src / "tok512.model"), "--out", str(out)], check=True, capture_output=True, timeout=120)
    return out


# ---- the soak ----------------------------------------------------------------------------------

def soak(args, target, pid, max_queue):
    rng = random.Random(args.seed)
    max_n = 4 if not max_queue else max(1, min(4, max_queue))
    # Distinct connections (a local subchannel pool per channel): calls spread over several
    # HTTP/2 connections, each open for the whole soak, so the server's descriptors stay put.
    n_channels = max(1, min(args.channels, args.concurrency))
    channels = [grpc.insecure_channel(target, options=CHANNEL_OPTIONS) for _ in range(n_channels + 1)]
    for ch in channels:
        grpc.channel_ready_future(ch).result(timeout=30)
    stubs = [pb_grpc.TextGenerationStub(ch) for ch in channels[:-1]]
    control = pb_grpc.TextGenerationStub(channels[-1])  # Cancel by id, stats, the final request
    info = control.GetModelInfo(pb.GetModelInfoRequest(), timeout=30)
    plan = [plan_call(rng, i, max_n, info.kv_blocks * info.kv_block_tokens, info.kv_block_tokens)
            for i in range(args.requests)]
    control.Generate(Client.generate_request("hi", max_tokens=2), timeout=30)
    stats0 = control.GetServerStats(pb.GetServerStatsRequest(), timeout=10)
    mem = {"start": (rss_kib(pid), n_fds(pid)) if pid else None}

    canceller = Canceller()
    results = [None] * len(plan)
    lock = threading.Lock()
    next_i, done = [0], [0]
    warm_at = max(1, len(plan) // 10)
    stop_issuing = threading.Event()
    t0 = time.monotonic()

    def worker():
        while not stop_issuing.is_set():
            with lock:
                i = next_i[0]
                if i >= len(plan):
                    return
                next_i[0] += 1
            t = time.monotonic()
            try:
                status, problem = run_call(plan[i], stubs[i % len(stubs)], control, canceller, args.call_timeout, target)
            except Exception as e:  # noqa: BLE001 - anything else is counted as unexpected
                status, problem = "EXCEPTION", repr(e)
            results[i] = (status, problem, time.monotonic() - t)
            if status == "RESOURCE_EXHAUSTED":  # a full queue: back off, as a client would
                time.sleep(random.uniform(0.01, 0.05))
            with lock:
                done[0] += 1
            if args.duration and time.monotonic() - t0 > args.duration:
                stop_issuing.set()

    rss_peak, pool = [0], {"min_free": None, "total": stats0.kv_blocks_total}

    def sampler():
        """Every 100 ms: the server's RSS (for the peak) and free KV blocks. Warm-up ends once 10 %
        of the calls finished and the KV pool has been used up once (at most 1 % of its blocks
        never taken), or at half the calls. The pool's pages are touched only when a block is
        first written, and prefix-cached blocks stay off the free list (a stack), so until then RSS
        grows by the pool's size (2048 blocks of 20 KiB for stories260K); the blocks never taken
        are exactly the fewest ever free."""
        while not all_done.is_set():
            try:
                rss = rss_kib(pid)
                free = control.GetServerStats(pb.GetServerStatsRequest(), timeout=10).kv_blocks_free
            except (OSError, RuntimeError, grpc.RpcError):
                return
            rss_peak[0] = max(rss_peak[0], rss)
            pool["min_free"] = free if pool["min_free"] is None else min(pool["min_free"], free)
            cycled = pool["min_free"] <= 0.01 * pool["total"]
            if "warm" not in mem and ((done[0] >= warm_at and cycled) or done[0] >= len(plan) // 2):
                mem["warm"] = (rss, n_fds(pid), done[0], "KV pool used up" if cycled else "half the calls",
                               pool["min_free"])
            all_done.wait(0.1)

    all_done = threading.Event()
    if pid:
        threading.Thread(target=sampler, daemon=True).start()
    threads = [threading.Thread(target=worker, daemon=True) for _ in range(args.concurrency)]
    for t in threads:
        t.start()
    hard_end = time.monotonic() + (args.duration or 0) + args.call_timeout + 3600 * (not args.duration)
    for t in threads:
        t.join(timeout=max(1, hard_end - time.monotonic()))
    hung = sum(t.is_alive() for t in threads)
    elapsed = time.monotonic() - t0
    all_done.set()
    canceller.close()
    block_kib = 2 * info.n_layers * info.kv_block_tokens * info.n_kv_heads * info.head_dim * \
        {"bf16": 2, "f16": 2}.get(info.dtype, 4) / 1024
    return dict(plan=plan, results=results, hung=hung, elapsed=elapsed, stats0=stats0, mem=mem,
                rss_peak=rss_peak[0], control=control, channels=channels, warm_at=warm_at, pool=pool,
                block_kib=block_kib)


def report(args, r, pid, max_queue, server):
    failures = []
    plan, results = r["plan"], r["results"]
    ran = [(c, x) for c, x in zip(plan, results) if x is not None]
    table = defaultdict(Counter)
    unexpected = []
    for c, (status, problem, _) in ran:
        kind = f"{c['method']}{'Stream' if c['stream'] else ''} {c['fate']}"
        table[kind][status] += 1
        table["all"][status] += 1
        if (status == "OK" and problem) or not expected(c, status, max_queue):
            unexpected.append((c, status, problem))
    statuses = sorted(table["all"], key=lambda s: (s != "OK", s))
    w = max(len(k) for k in table) + 2
    print(f"\n{'calls by kind':<{w}}" + "".join(f"{s:>20}" for s in statuses) + f"{'total':>8}")
    for kind in sorted(table, key=lambda k: (k == "all", k)):
        print(f"{kind:<{w}}" + "".join(f"{table[kind][s]:>20}" for s in statuses) + f"{sum(table[kind].values()):>8}")

    # Settle: the last cancels and deadlines may take an engine step or two to be seen.
    control = r["control"]
    end = time.time() + 30
    settled, st = stats_settled(control)
    while not settled and time.time() < end:
        time.sleep(0.1)
        settled, st = stats_settled(control)
    s0 = r["stats0"]
    tokens = st.generated_tokens - s0.generated_tokens
    lat = sorted(x[2] for _, x in ran if x[0] == "OK")
    p50 = lat[len(lat) // 2] if lat else 0
    p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))] if lat else 0
    print(f"\n{len(ran)} calls of {len(plan)} planned in {r['elapsed']:.1f} s: {len(ran) / r['elapsed']:.1f} calls/s, "
          f"{tokens} tokens generated ({tokens / r['elapsed']:.0f} tokens/s), OK latency p50 {p50 * 1000:.0f} ms, "
          f"p99 {p99 * 1000:.0f} ms")
    print(f"server: {st.requests_submitted - s0.requests_submitted} requests submitted, "
          f"{st.engine_steps - s0.engine_steps} engine steps, {st.preemptions - s0.preemptions} preemptions, "
          f"prefix cache hit rate {st.prefix_cache_hit_rate:.2f}")
    drafted = st.spec_draft_tokens - s0.spec_draft_tokens
    if drafted or args.expect_drafts:
        print(f"speculation: {drafted} draft tokens verified, {st.spec_accepted_tokens - s0.spec_accepted_tokens} accepted")
    if args.expect_drafts and drafted == 0:
        failures.append("--expect-drafts: no draft was verified")
    print(f"settled: running {st.running}, waiting {st.waiting}, finished {st.requests_finished} of "
          f"{st.requests_submitted}, KV blocks free {st.kv_blocks_free} + cached {st.kv_blocks_cached} of "
          f"{st.kv_blocks_total}, open calls {st.active_calls}")

    print(f"Cancel(request_id) calls: {dict(CANCEL_RPCS)}")
    if set(CANCEL_RPCS) - {"OK", "NOT_FOUND"}:
        failures.append(f"Cancel(request_id) answered {dict(CANCEL_RPCS)}")
    if r["hung"]:
        failures.append(f"{r['hung']} client threads still waiting on a call after the time limit")
    if unexpected:
        failures.append(f"{len(unexpected)} unexpected results")
        for c, status, problem in unexpected[:10]:
            print(f"  unexpected: {c['request_id']} {c['method']}{'Stream' if c['stream'] else ''} "
                  f"fate {c['fate']} -> {status} {problem} sampling {c['sampling']}")
    if not settled:
        failures.append("the server did not settle within 30 s (running/waiting calls, KV blocks held, or open calls)")

    mem = r["mem"]
    if pid:
        # Descriptors: the same connections are open at the start and at the end (the control one
        # and --channels); those of calls on a connection of their own close when the server sees
        # the client's FIN, which may take a moment after the last call.
        start, warm = mem["start"], mem.get("warm")
        end = time.time() + 10
        while n_fds(pid) != start[1] and time.time() < end:
            time.sleep(0.1)
        end_mem = (rss_kib(pid), n_fds(pid))
        print(f"open fds: start {start[1]}, after warm-up {warm[1] if warm else '-'}, end {end_mem[1]}")
        if end_mem[1] != start[1]:
            failures.append(f"open descriptors changed: {start[1]} at the start, {end_mem[1]} at the end")
        if warm is None:
            failures.append(f"fewer than {r['warm_at']} calls finished: no warm-up measurement")
        else:
            # Pool blocks first taken after the warm-up add their pages to RSS once: not a leak.
            # Counted out (an upper bound: two blocks share a page per layer) when the warm-up came
            # before the pool was used up.
            first_kib = (warm[4] - r["pool"]["min_free"]) * r["block_kib"]
            growth = (end_mem[0] - warm[0] - first_kib) / warm[0]
            print(f"RSS (MiB): start {start[0] / 1024:.1f}, after warm-up ({warm[2]} calls done, {warm[3]}) "
                  f"{warm[0] / 1024:.1f}, peak {r['rss_peak'] / 1024:.1f}, end {end_mem[0] / 1024:.1f}")
            print(f"KV blocks never taken (of {r['pool']['total']}, {r['block_kib']:.0f} KiB each): {warm[4]} at "
                  f"warm-up, {r['pool']['min_free']} at the end; RSS growth from warm-up less the "
                  f"{first_kib / 1024:.1f} MiB of blocks first taken since: {growth * 100:+.1f} %")
            if growth > RSS_GROWTH:
                failures.append(f"RSS grew {growth * 100:.1f} % after warm-up (limit {RSS_GROWTH * 100:.0f} %)")
    else:
        print("RSS and descriptors: not checked (--target without --server-pid)")

    try:
        g = control.Generate(Client.generate_request("Once upon a time", max_tokens=16, temperature=0), timeout=30)
        if not g.token_ids or g.finish_reason not in FINISH_OK:
            failures.append(f"the final request returned {len(g.token_ids)} tokens, finish {g.finish_reason}")
        print(f"final request: OK, {len(g.token_ids)} tokens")
    except grpc.RpcError as e:
        failures.append(f"the final request failed: {e.code().name} {e.details()}")
    for ch in r["channels"]:
        ch.close()
    if server:
        code = server.terminate()
        print(f"server exit after SIGTERM: {code}")
        if code != 0:
            failures.append(f"the server exited with {code} after SIGTERM")
    return failures


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--shardlm", default=str(ROOT / "build/cli/shardlm"), help="the shardlm executable")
    ap.add_argument("--target", help="HOST:PORT of a running server (default: start one on 127.0.0.1)")
    ap.add_argument("--server-pid", type=int, help="with --target: the server's pid, for the RSS and fd checks")
    ap.add_argument("--model", help="a serving directory, or the stories260K assets (default: $SHARDLM_ASSETS)")
    ap.add_argument("--serve-args", default="", help="extra arguments of shardlm serve, e.g. \"--max-queue 64\"")
    ap.add_argument("--launcher", default="", help="e.g. \"mpirun --oversubscribe -n 4\" with --serve-args "
                    "\"--dp 2 --tp 2\": the RSS and fd checks then read rank 0")
    ap.add_argument("--requests", type=int, default=10000)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--duration", type=float, default=0, help="stop issuing calls after this many seconds")
    ap.add_argument("--channels", type=int, default=8, help="gRPC connections the calls are spread over")
    ap.add_argument("--call-timeout", type=float, default=300, help="deadline of the calls without a short one")
    ap.add_argument("--max-queue", type=int, default=0,
                    help="the server's --max-queue (taken from --serve-args when there): RESOURCE_EXHAUSTED is\n"
                         "then expected, and n stays within it")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--expect-drafts", action="store_true", help="fail unless speculation verified drafts (a server "
                    "with --speculative among its arguments)")
    ap.add_argument("--keep-log", action="store_true", help="keep the server's log even when every check passed")
    args = ap.parse_args()
    serve_args = shlex.split(args.serve_args)
    if "--max-queue" in serve_args:
        args.max_queue = int(serve_args[serve_args.index("--max-queue") + 1])
    server, work = None, Path(tempfile.mkdtemp(prefix="shardlm-soak-"))
    failures = ["the soak did not run"]
    try:
        if args.target:
            target, pid = args.target, args.server_pid
        else:
            model = find_model(args, work)
            if model is None:
                print("SKIP: stories260K not found (set SHARDLM_ASSETS or --model)")
                return SKIP
            server = Server(args.shardlm, model, serve_args, work / "server.log", shlex.split(args.launcher))
            target, pid = server.target, server.pid
        print(f"soak: {args.requests} calls at concurrency {args.concurrency} on {target} (pid {pid}), seed {args.seed}"
              + (f", at most {args.duration:.0f} s of issuing" if args.duration else ""), flush=True)
        r = soak(args, target, pid, args.max_queue)
        failures = report(args, r, pid, args.max_queue, server)
    finally:
        if server:
            server.kill()
    for f in failures:
        print(f"FAIL: {f}")
    if server and (failures or args.keep_log):
        print(f"server log: {work / 'server.log'}")
    else:
        shutil.rmtree(work, ignore_errors=True)
    print("PASS" if not failures else f"{len(failures)} checks failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
