#!/usr/bin/env python3
"""tests/server/test_models_lru.py --shardlm BIN - which models a server of several keeps loaded
(`shardlm serve --models-max N`, `--sleep-idle-seconds S`, issue 32), and the gRPC methods and
/metrics series of each model.

The models: stories260K (converted from the assets), the same weights under a second id (a
directory link: "stories-twin") and a tiny random Llama (tools/make_random_model.py: another
width and vocabulary). Checked:
- --models-max 2 of three: the first two load at start, the third is listed, not loaded; each
  request for a model not loaded unloads the least recently used one (the order checked over
  three loads, through HTTP and through gRPC Generate, whose load runs off the gRPC loop), and a
  reloaded model answers a greedy request token for token as before its unload;
- a request naming a --lora adapter of a model not loaded loads that model (/v1/models lists the
  adapter under it, not loaded, before);
- a model with a request running is not unloaded even when it is the least recently used: the
  next one goes; with --models-max 1 and its one model busy, a request for another is 503 (HTTP)
  / UNAVAILABLE (gRPC) naming --models-max, and served once the busy model is idle;
- requests (HTTP and gRPC at once) for a model while it loads wait and get its answer, while the
  gRPC loop answers other calls at once ($SHARDLM_TEST_MODEL_LOAD_DELAY_S slows the load);
- GetModelInfo / Tokenize / Detokenize / GetServerStats by `model`: each model's own (its id,
  width, vocabulary), an unloaded model loaded for it, an unknown one NOT_FOUND; LoadAdapter /
  UnloadAdapter by `model` (the adapter in that model only, its name routing there); the CLI's
  `shardlm stats --model` and `shardlm adapters list --model`;
- 18 concurrent requests over the three models, two loaded at a time: each answered by the model
  it named (equal to its greedy reference) or refused 503 naming --models-max, then retried; /metrics has
  shardlm_model_loaded and the engine series per model (label `model`), agreeing with /v1/models;
- --sleep-idle-seconds 1: idle models unloaded (/v1/models loaded false, the process's RSS down
  by at least half the weights' bytes), then loaded again by the next request, with the same
  greedy answer; a model whose requests run longer than that stays loaded, and sleeps after;
- bad values of both flags, and either with --journal, refused at start by name.
Prints SKIP (exit 77) without the stories260K assets, numpy, prometheus_client, the openai package
(test_models.py, whose random adapter it borrows), grpcio or the installed client. Loopback only; bounded waits.
"""
import concurrent.futures
import json
import os
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

sys.dont_write_bytecode = True
HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(HERE))
import test_server as TS  # noqa: E402  (the server harness and shardlm_client; SKIPs without grpcio)
import stories_main as SM  # noqa: E402  (the mains on stories260K)
from test_models import write_random_adapter  # noqa: E402  (a random PEFT adapter of a Llama)

grpc, pb = TS.grpc, TS.pb
check, expect_error, Failure = TS.check, TS.expect_error, TS.Failure
try:
    import numpy  # noqa: F401  (make_random_model.py needs it)
    from prometheus_client.parser import text_string_to_metric_families
except ImportError as e:
    print(f"SKIP: needs numpy and prometheus_client ({e})")
    sys.exit(TS.SKIP)

A, T, B = "stories260K", "stories-twin", "tiny-random"  # T: A's weights under another id
GREEDY = dict(max_tokens=24, temperature=0)
# Long enough to still run while the test loads other models (stories260K: thousands of tokens
# a second; three of these are several seconds of work on one thread).
LONG = dict(max_tokens=480, ignore_eos=True, temperature=0, n=16)


def post(base, path, body, timeout=120):
    return SM.post_json(base, path, body, timeout)


def complete(srv, model, prompt="Once upon a time"):
    code, o = post(srv.base, "/v1/completions", dict(model=model, prompt=prompt, **GREEDY))
    check(code == 200 and o["model"] == model, f"completion for {model}: {code} {o}")
    return o["choices"][0]["text"]


def loaded(srv):
    """{id: loaded} of the served models (adapters left out)."""
    with urllib.request.urlopen(srv.base + "/v1/models", timeout=30) as r:
        return {m["id"]: m["loaded"] for m in json.loads(r.read())["data"] if m["parent"] is None}


def metrics(srv):
    with urllib.request.urlopen(srv.base + "/metrics", timeout=30) as r:
        text = r.read().decode()
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def rss_kib(pid):
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise Failure("no VmRSS in /proc/PID/status")


class Busy:
    """STREAMS LONG gRPC streams on a model, run in the background; started() once the first token of
    each came (the model is pinned from then until they end). Four (64 sequences: the default
    --max-seqs, so none waits for its first token), to outlast two refused requests by far."""
    STREAMS = 4

    def __init__(self, srv, model):
        self.srv, self.model = srv, model
        self.first = threading.Barrier(self.STREAMS + 1)
        self.done = threading.Event()
        self.tokens = []
        self.pool = concurrent.futures.ThreadPoolExecutor(self.STREAMS)
        self.futs = [self.pool.submit(self._one) for _ in range(self.STREAMS)]

    def _one(self):
        with self.srv.client() as c:
            n, told = 0, False
            for ch in c.generate_stream("Once", adapter=self.model, **LONG):
                n += len(ch.token_ids)
                if not told:
                    told = True
                    self.first.wait(timeout=60)
            return n

    def started(self):
        self.first.wait(timeout=60)
        return self

    def finish(self):
        self.tokens = [f.result(timeout=120) for f in self.futs]
        self.done.set()
        self.pool.shutdown()
        return self.tokens


def expect_refused(env, args, words, name):
    SM.expect_refused(env.shardlm, args, words, name)


def group_lru(env, dirs):
    with TS.Server(env.shardlm, dirs[A], "--model", str(dirs[B]), "--model", str(dirs[T]), "--models-max", "2",
                   http=True, name="lru") as srv:
        check(loaded(srv) == {A: True, B: True, T: False}, f"at start: the first two loaded: {loaded(srv)}")
        ref_a = complete(srv, A)  # A used: B is now the least recently used
        with srv.client() as c:
            ref_a_ids = c.generate("Once upon a time", adapter=A, **GREEDY).token_ids
        check(complete(srv, T) == ref_a, "the twin (the same weights) answers as the first")
        check(loaded(srv) == {A: True, B: False, T: True}, f"T loaded, B (least recently used) out: {loaded(srv)}")
        with srv.client() as c:  # gRPC: the load runs on the loader thread, the call comes back after
            ids_b = c.generate("Once upon a time", adapter=B, **GREEDY).token_ids
            check(len(ids_b) > 0, "B answers over gRPC after its load")
        check(loaded(srv) == {A: False, B: True, T: True}, f"B loaded, A (least recently used) out: {loaded(srv)}")
        check(complete(srv, A) == ref_a, "A reloaded answers as before its unload (HTTP)")
        check(loaded(srv) == {A: True, B: True, T: False}, f"A loaded, T out: {loaded(srv)}")
        with srv.client() as c:
            check(c.generate("Once upon a time", adapter=A, **GREEDY).token_ids == ref_a_ids,
                  "A reloaded answers as before its unload (gRPC token ids)")

        # A busy model stays, though it is the least recently used: B goes.
        busy = Busy(srv, A).started()
        complete(srv, B)  # B used after A: A is the least recently used, but pinned
        complete(srv, T)
        still_running = not busy.done.is_set() and not all(f.done() for f in busy.futs)
        check(loaded(srv) == {A: True, B: False, T: True}, f"busy A kept, B unloaded: {loaded(srv)}")
        tokens = busy.finish()
        check(still_running, "A's streams ran until T had loaded (the test's timing)")
        check(tokens == [LONG["n"] * LONG["max_tokens"]] * Busy.STREAMS, f"A's streams complete: {tokens}")

        # Per-model methods: an unloaded model (B) is loaded for them.
        with srv.client() as c:
            info_b = c.model_info(model=B)
            check(info_b.model_id == B and info_b.d_model == 128, f"GetModelInfo(B): {info_b.model_id} {info_b.d_model}")
            check(loaded(srv)[B], "GetModelInfo loaded B")
            info_a = c.model_info(model=A)
            check(info_a.model_id == A and info_a.d_model == 64, f"GetModelInfo(A): {info_a.model_id} {info_a.d_model}")
            check(c.model_info().model_id == A, "GetModelInfo without a model: the first")
            text = "Once upon a time"
            ids = {m: c.tokenize(text, model=m) for m in (A, B)}
            check(ids[A] != ids[B], f"each model's tokenizer: {ids}")
            for m in (A, B):
                check(c.detokenize(ids[m], model=m).strip() == text, f"Detokenize(Tokenize) by {m}")
            check(c.server_stats(model=B).kv_blocks_total > 0, "GetServerStats(B)")
            expect_error(lambda: c.model_info(model="no-such"), grpc.StatusCode.NOT_FOUND, "no-such")
            expect_error(lambda: c.tokenize("x", model="no-such"), grpc.StatusCode.NOT_FOUND, "no-such")

        # The CLI client: `shardlm stats --model` asks about that model.
        for mid, width in ((B, 128), (A, 64)):
            p = subprocess.run([env.shardlm, "stats", "--server", srv.target, "--model", mid], capture_output=True,
                               text=True, timeout=60)
            check(p.returncode == 0 and f"id: {mid};" in p.stdout and f"d_model {width}," in p.stdout,
                  f"shardlm stats --model {mid}: {p.returncode} {p.stdout} {p.stderr}")

        # LoadAdapter / UnloadAdapter by model: the adapter lands in B's engine only, and routes to B.
        with srv.client() as c:
            c.load_adapter("b-run", str(dirs["work"] / "blora"), model=B)
            check("b-run" in c.model_info(model=B).adapters, "LoadAdapter(model=B): B lists it")
            check("b-run" not in c.model_info(model=A).adapters, "LoadAdapter(model=B): A does not")
            check(c.model_info(model="b-run").model_id == B, "an adapter's name routes to its model")
            expect_error(lambda: c.unload_adapter("b-run", model=A), grpc.StatusCode.NOT_FOUND, "b-run")
            p = subprocess.run([env.shardlm, "adapters", "list", "--server", srv.target, "--model", B],
                               capture_output=True, text=True, timeout=60)
            check(p.returncode == 0 and p.stdout.split() == ["b-run"], f"shardlm adapters list --model B: {p.stdout}")
            c.unload_adapter("b-run", model=B)
            check("b-run" not in c.model_info(model=B).adapters, "UnloadAdapter(model=B)")

        # /metrics: a series per model, agreeing with /v1/models.
        m, state = metrics(srv), loaded(srv)
        for mid, up in state.items():
            check(m.get(("shardlm_model_loaded", (("model", mid),))) == (1.0 if up else 0.0),
                  f"shardlm_model_loaded{{model={mid}}} vs /v1/models {up}")
        gen = {mid: m.get(("shardlm_generation_tokens_total", (("model", mid),))) for mid in state}
        check(all(v is not None for v in gen.values()), f"generation tokens per model: {gen}")
        check(gen[A] >= LONG["n"] * LONG["max_tokens"] * Busy.STREAMS, f"A's generated tokens counted: {gen}")

        # Concurrent requests over the three models, two loaded at a time: each answered by the model
        # it named (A and its twin alike), or refused 503 naming --models-max (then retried).
        ref = {A: ref_a, T: ref_a, B: complete(srv, B)}

        def until_served(model):
            for _ in range(200):
                code, o = post(srv.base, "/v1/completions", dict(model=model, prompt="Once upon a time", **GREEDY))
                if code == 200:
                    return o["model"], o["choices"][0]["text"]
                check(code == 503 and "--models-max 2" in json.dumps(o), f"{model}: {code} {o}")
                time.sleep(0.05)
            raise Failure(f"{model}: refused 200 times")

        order = [A, B, T] * 6
        with concurrent.futures.ThreadPoolExecutor(6) as pool:
            answers = list(pool.map(until_served, order))
        for model, (named, text) in zip(order, answers):
            check(named == model and text == ref[model], f"{model}: answered by {named}: {text!r}")


def group_busy_cap(env, dirs):
    with TS.Server(env.shardlm, dirs[A], "--model", str(dirs[B]), "--lora", f"bl={dirs['work'] / 'blora'}",
                   "--models-max", "1", http=True, name="cap1") as srv:
        check(loaded(srv) == {A: True, B: False}, f"--models-max 1: {loaded(srv)}")
        with urllib.request.urlopen(srv.base + "/v1/models", timeout=30) as r:
            bl = [m for m in json.loads(r.read())["data"] if m["id"] == "bl"]
        check(len(bl) == 1 and bl[0]["parent"] == B and bl[0]["loaded"] is False,
              f"B's --lora adapter listed, not loaded, while B is not: {bl}")
        # A request naming the adapter of a model not loaded loads that model.
        code, o = post(srv.base, "/v1/completions", dict(model="bl", prompt="Once", **GREEDY))
        check(code == 200 and o["model"] == "bl" and loaded(srv) == {A: False, B: True},
              f"the adapter's model loaded for it: {code} {o} {loaded(srv)}")
        complete(srv, A)
        busy = Busy(srv, A).started()
        code, o = post(srv.base, "/v1/completions", dict(model=B, prompt="Once", **GREEDY))
        msg = json.dumps(o)
        with srv.client() as c:
            e = expect_error(lambda: c.generate("Once", adapter=B, **GREEDY), grpc.StatusCode.UNAVAILABLE,
                             "--models-max 1")
        still_running = not all(f.done() for f in busy.futs)
        busy.finish()
        check(still_running, "A's streams ran until both refusals (the test's timing)")
        check(code == 503 and "--models-max 1" in msg and B in msg, f"B while A is busy: {code} {msg}")
        check(B in e.details(), f"the gRPC refusal names B: {e.details()}")
        complete(srv, B)  # A idle now: it goes
        check(loaded(srv) == {A: False, B: True}, f"after A's requests: {loaded(srv)}")


def group_load_wait(env, dirs):
    """Requests that arrive while their model loads (a 1.5 s test delay before each on-demand load)
    wait for it, over both fronts, and all get the model's answer; meanwhile the gRPC loop answers
    other calls at once (the load runs on the loader thread)."""
    env_delay = dict(os.environ, SHARDLM_TEST_MODEL_LOAD_DELAY_S="1.5")
    with TS.Server(env.shardlm, dirs[A], "--model", str(dirs[B]), "--models-max", "1", http=True, env=env_delay,
                   name="loadwait") as srv:
        check(loaded(srv) == {A: True, B: False}, f"--models-max 1: {loaded(srv)}")

        def grpc_b(_):
            with srv.client() as c:
                return ("grpc", tuple(c.generate("Once upon a time", adapter=B, **GREEDY).token_ids))

        def http_b(_):
            return ("http", complete(srv, B))

        t0 = time.time()
        with concurrent.futures.ThreadPoolExecutor(6) as pool:
            futs = [pool.submit(grpc_b if i % 2 else http_b, i) for i in range(6)]
            time.sleep(0.4)  # the load has begun (its delay runs)
            with srv.client() as c:
                t1 = time.time()
                expect_error(lambda: c.cancel("no-such-request"), grpc.StatusCode.NOT_FOUND, "no-such-request")
                quick = time.time() - t1
            answers = [f.result(timeout=120) for f in futs]
        took = time.time() - t0
        check(took >= 1.5, f"the answers came after the load's delay ({took:.2f} s)")
        check(quick < 1.0, f"a call during the load was answered in {quick:.2f} s: the gRPC loop waited")
        by_front = {}
        for front, a in answers:
            by_front.setdefault(front, set()).add(a)
        check(all(len(v) == 1 for v in by_front.values()) and len(by_front) == 2,
              f"every request answered, the same on each front: {by_front}")
        check(by_front["http"] == {complete(srv, B)}, "the answers are B's")
        check(loaded(srv) == {A: False, B: True}, f"B loaded, A out: {loaded(srv)}")


def group_sleep(env, dirs):
    with TS.Server(env.shardlm, dirs[A], "--model", str(dirs[B]), "--sleep-idle-seconds", "1", http=True,
                   name="sleep") as srv:
        ref = complete(srv, A)
        rss_up = rss_kib(srv.proc.pid)
        # The models loaded when RSS was read (B, idle since the start, may already sleep: then
        # only A's weights can come back; counting B's too made this check fail now and then).
        up = [m for m, on in loaded(srv).items() if on]
        TS.wait_until(lambda: loaded(srv) == {A: False, B: False}, "both models asleep", timeout=20)
        rss_down = rss_kib(srv.proc.pid)
        weights = sum(f.stat().st_size for m in up for f in dirs[m].glob("*.safetensors")) // 1024
        check(A in up and rss_up - rss_down >= weights // 2,
              f"RSS {rss_up} KiB with {up} loaded, {rss_down} KiB asleep: less than half the {weights} KiB of "
              f"weights freed")
        m = metrics(srv)
        check(m.get(("shardlm_model_loaded", (("model", A),))) == 0.0, "metrics: A not loaded")
        check(complete(srv, A) == ref, "A woken answers as before its sleep")
        check(loaded(srv)[A], "A loaded again")
        with srv.client() as c:
            check(c.model_info(model=B).model_id == B, "GetModelInfo wakes B")
        check(loaded(srv)[B], "B loaded again")

        # A model with requests running does not sleep, however long they run.
        busy = Busy(srv, A).started()
        time.sleep(1.6)
        awake = loaded(srv)[A]
        still_running = not all(f.done() for f in busy.futs)
        busy.finish()
        check(still_running, "A's streams ran past the idle time (the test's timing)")
        check(awake, "A stayed loaded while its requests ran past --sleep-idle-seconds")
        TS.wait_until(lambda: not loaded(srv)[A], "A asleep after its requests", timeout=20)


def body(work, env):
    dirs = {A: work / A, B: work / B, T: work / T, "work": work}
    TS.convert_stories260k(env.shardlm, env.src, dirs[A])
    subprocess.run([sys.executable, str(ROOT / "tools/make_random_model.py"), "--out", str(dirs[B]), "--preset", "tiny",
                    "--dtype", "f32", "--seed", "5"], check=True, capture_output=True, timeout=120)
    os.symlink(dirs[A], dirs[T])
    write_random_adapter(work / "blora", dirs[B])
    group_lru(env, dirs)
    group_busy_cap(env, dirs)
    group_load_wait(env, dirs)
    group_sleep(env, dirs)
    for v in ("0", "17", "x"):
        expect_refused(env, ["--model", str(dirs[A]), "--models-max", v], ["--models-max", "[1, 16]", f"'{v}'"],
                       f"--models-max {v}")
    for v in ("0", "-1", "soon", "inf"):
        expect_refused(env, ["--model", str(dirs[A]), "--sleep-idle-seconds", v], ["--sleep-idle-seconds", f"'{v}'"],
                       f"--sleep-idle-seconds {v}")
    expect_refused(env, ["--model", str(dirs[A]), "--http", "127.0.0.1:0", "--journal", str(work / "j"),
                         "--sleep-idle-seconds", "5"], ["--journal", "--sleep-idle-seconds"], "with a journal")


def main():
    return SM.stories_main("models_lru", "shardlm-models-lru-", body)


if __name__ == "__main__":
    sys.exit(main())
