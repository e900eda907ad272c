#!/usr/bin/env python3
"""Streams that survive a restart (issue 33, docs/reliability.md): `serve --journal DIR` on
stories260K under --batch-invariant. Groups:
  restart    streamed chat and completions requests (n 1 and 2, logprobs, a stop string) and
             unary ones with an Idempotency-Key are killed (SIGKILL) mid-way, twice; after each
             restart every client reconnects (Last-Event-ID / Idempotency-Key) and what it
             assembles from all its connections equals the answer of an uninterrupted server:
             the same text, tokens and finish reasons, no chunk twice, none missing; a delivered
             answer is not offered again (404)
  dp2        the same at --dp 2 under mpirun (rank 0 SIGKILLed, mpirun ends the job, a new job
             resumes): resumed samples may land on the other replica, so the RNG state and the
             generated tokens cross the router's messages
  drain      SIGTERM with a short --drain-timeout: journaled streams are cut without [DONE] and
             finish after the restart
  torn       a journal whose last record a kill cut short: dropped with a warning, the rest resumed
  client     the Python client's shardlm_client.resume (stream and request) against a server
             SIGKILLed and restarted on the same port mid-answer: the chunks it yields equal the
             uninterrupted answer's, without the caller doing anything
  errors     Last-Event-ID / Idempotency-Key without --journal (400 naming it), on count_tokens,
             malformed, unknown (404), an Idempotency-Key or Last-Event-ID naming a request that
             runs on another connection (409); an unusable directory (exit 1);
             --journal-retain: an answer nobody fetched is forgotten
  endwindow  an answer handed over just before a SIGKILL is fetched whole after the restart
             (its END is journaled --journal-end-delay later), once
Reference answers come from a server that is never interrupted; no expected text is written here.

  test_journal.py --shardlm BUILD/cli/shardlm [GROUP...]
"""
import http.client
import json
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

SKIP = 77
sys.dont_write_bytecode = True
sys.path.insert(0, str(Path(__file__).resolve().parent))
try:
    import openai  # noqa: F401  (the harness imports the gRPC client; openai is the suite's marker)
except ImportError as e:
    print(f"SKIP: a test dependency cannot be imported ({e}); run tools/install_deps.sh")
    sys.exit(SKIP)
import test_server as TS  # noqa: E402
import stories_main as SM  # noqa: E402  (the mains on stories260K)
import journal_file as JF  # noqa: E402
from checks import Checks  # noqa: E402
from tcp_proxy import Proxy  # noqa: E402

check = Checks()
FLAGS = ("--batch-invariant", "--max-seqs", "16")
STORY = "Once upon a time, there was a little girl named Lily. She"
# (path, body): long sampled answers, so that a kill lands mid-way.
STREAMS = [
    ("/v1/chat/completions", dict(messages=[{"role": "user", "content": STORY}], max_tokens=400, temperature=0.9,
                                  top_p=0.95, seed=5, stream=True, stream_options={"include_usage": True})),
    ("/v1/completions", dict(prompt=STORY, max_tokens=400, temperature=1.0, seed=6, n=2, stream=True)),
    ("/v1/completions", dict(prompt="Tom had a red ball", max_tokens=400, temperature=0.8, seed=7, logprobs=2,
                             stream=True)),
    ("/v1/completions", dict(prompt="The cat sat", max_tokens=400, temperature=1.0, seed=8, stop=["dog"],
                             stream=True)),
    ("/v1/chat/completions", dict(messages=[{"role": "user", "content": "A big dog ran"}], max_tokens=400,
                                  temperature=1.0, seed=9, n=2, stream=True)),
]
UNARY = [
    ("/v1/completions", dict(prompt="Mom said to Lily", max_tokens=400, temperature=0.9, seed=10, n=2)),
    ("/v1/chat/completions", dict(messages=[{"role": "user", "content": "The bird flew"}], max_tokens=400,
                                  temperature=0.9, seed=11)),
]


def server(shardlm, model, *extra, name, env=None):
    return TS.Server(shardlm, model, *FLAGS, *extra, name=name, http=True, env=env)


def kill9(srv):
    srv.proc.send_signal(signal.SIGKILL)
    srv.proc.wait(timeout=20)
    srv.log.close()


def post_quietly(*args):
    """post() in a thread whose server is killed under it: the cut is expected."""
    try:
        post(*args)
    except (OSError, http.client.HTTPException):
        pass


def post(port, path, body, headers=None, timeout=60):
    """(status, headers, body text) of a unary POST."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        c.request("POST", path, json.dumps(body), {"Content-Type": "application/json", **(headers or {})})
        r = c.getresponse()
        return r.status, dict(r.getheaders()), r.read().decode()
    finally:
        c.close()


def get(port, path):
    """(status, headers, body text) of a GET."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        c.request("GET", path)
        r = c.getresponse()
        return r.status, dict(r.getheaders()), r.read().decode()
    finally:
        c.close()


class Stream:
    """One streamed request's client: its chunks over every connection, the last SSE id."""

    def __init__(self, path, body, headers=None):
        self.path, self.body, self.headers = path, body, dict(headers or {})
        self.chunks, self.last_id, self.done, self.statuses, self.resumed_at = [], None, False, [], []
        self.progress = threading.Event()

    def read(self, port, stop_after=None):
        """Reads one connection until the stream's end, a cut or stop_after chunks (then keeps
        the socket open: the server is about to be killed); resumes from last_id when set."""
        headers = {"Content-Type": "application/json", **self.headers}
        if self.last_id:
            headers["Last-Event-ID"] = self.last_id
            self.resumed_at.append(self.last_id.split(";", 1)[-1])
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        try:
            c.request("POST", self.path, json.dumps(self.body), headers)
            r = c.getresponse()
            self.statuses.append(r.status)
            if r.status != 200:
                self.error = r.read().decode()
                return
            got = 0
            self.start()
            while True:
                line = r.readline()
                if not line.endswith(b"\n"):
                    return  # cut (a line the cut left unfinished is not a line)
                got += self.take(line.decode().rstrip("\n"))
                if self.done:
                    return
                if stop_after and got >= stop_after:
                    self.progress.set()
                    while r.readline():  # until the kill closes it
                        pass
                    return
        except (OSError, http.client.HTTPException):
            return
        finally:
            self.progress.set()
            c.close()

    def start(self):
        """A new connection: no id pending."""
        self.pending_id = None

    def take(self, line):
        """One line of OpenAI's SSE: 1 when it completed a chunk (which the last id names)."""
        if line.startswith("id: "):
            self.pending_id = line[4:]
        elif line == "data: [DONE]":
            self.done = True
        elif line.startswith("data: "):
            self.chunks.append(json.loads(line[6:]))
            self.last_id = self.pending_id or self.last_id
            return 1
        return 0


def assemble(chunks):
    """Per choice index: the text, the tokens (logprobs) and the finish reason; usage chunks."""
    out, usage = {}, []
    for ch in chunks:
        if ch.get("usage"):
            usage.append(ch["usage"])
        for c in ch.get("choices", []):
            o = out.setdefault(c["index"], {"text": "", "tokens": [], "finish": None, "role": 0})
            d = c.get("delta")
            if d is not None:
                o["text"] += d.get("content") or ""
                o["role"] += "role" in d
            else:
                o["text"] += c.get("text") or ""
            lp = c.get("logprobs")
            if lp and lp.get("tokens"):
                o["tokens"] += lp["tokens"]
            if c.get("finish_reason"):
                o["finish"] = c["finish_reason"]
    return out, usage


def first_difference(got, want, stream):
    """Where assembled answers first differ (for a failure's message): the choice, the offset, both
    texts around it and the SSE ids the client resumed from; "" when they are equal."""
    for k in sorted(set(got) | set(want)):
        a, b = got.get(k, {}).get("text", ""), want.get(k, {}).get("text", "")
        if a != b:
            at = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            return (f" (choice {k}: first difference at {at} of {len(a)} / {len(b)} characters: "
                    f"{a[max(0, at - 40):at + 40]!r} vs {b[max(0, at - 40):at + 40]!r}; finish "
                    f"{got.get(k, {}).get('finish')} / {want.get(k, {}).get('finish')}; resumed at {stream.resumed_at})")
    return ""


def unary_view(text):
    j = json.loads(text)
    return {c["index"]: (c.get("text") if "text" in c else c["message"]["content"], c["finish_reason"])
            for c in j["choices"]}, j["usage"]


def references(shardlm, model, work, streams=STREAMS):
    """Every request answered by an uninterrupted journaled server."""
    with server(shardlm, model, "--journal", str(work / "ref-journal"), name="ref") as srv:
        ref_streams = []
        for path, body in streams:
            s = Stream(path, body)
            s.read(srv.http_port)
            check(s.done, f"reference stream {path} seed {body['seed']} ends with [DONE]")
            ref_streams.append(assemble(s.chunks))
        ref_unary = []
        for path, body in UNARY:
            code, _, text = post(srv.http_port, path, body)
            check(code == 200, f"reference unary {path}: {code}")
            ref_unary.append(unary_view(text))
    return ref_streams, ref_unary


def journal_open_keys(path):
    """The keys of the journal file's requests that have an ACCEPT and no END (server/journal.c's
    records: u32 length, u32 check, payload; an ACCEPT's key after its 40-byte head, an END's after
    its type; strings are a u64 length and the bytes)."""
    accepted, ended = [], set()
    for _, payload in JF.journal_records(path.read_bytes()):
        kind = JF.record_type(payload)
        if kind in (1, 3):
            at = 40 if kind == 1 else 8
            n = struct.unpack_from("<Q", payload, at)[0]
            (accepted.append if kind == 1 else ended.add)(payload[at + 8:at + 8 + n].decode())
    return [k for k in accepted if k not in ended]


def group_restart(shardlm, model, work):
    ref_streams, ref_unary = references(shardlm, model, work)
    journal = work / "journal"
    srv = server(shardlm, model, "--journal", str(journal), name="first")
    streams = [Stream(p, b) for p, b in STREAMS]
    threads = [threading.Thread(target=s.read, args=(srv.http_port, 6)) for s in streams]
    keys = [f"unary-{i}-{os.getpid()}" for i in range(len(UNARY))]
    unary_threads = [threading.Thread(target=post_quietly, args=(srv.http_port, p, b, {"Idempotency-Key": k}))
                     for (p, b), k in zip(UNARY, keys)]
    for t in threads + unary_threads:
        t.start()
    for s in streams:
        s.progress.wait(timeout=60)
    time.sleep(0.05)
    kill9(srv)
    for t in threads + unary_threads:
        t.join(timeout=30)
    check(all(not s.done and s.last_id for s in streams), "every stream was cut mid-way, after some chunks")
    for restart in (1, 2):
        srv = server(shardlm, model, "--journal", str(journal), name=f"restart{restart}")
        log = srv.log_path.read_text()
        check("open request(s) to resume" in log, f"restart {restart}: the journal's open requests are found")
        # The first restart is killed again while the clients read; the second runs to the end.
        stop_after = 5 if restart == 1 else None
        threads = [threading.Thread(target=s.read, args=(srv.http_port, stop_after)) for s in streams if not s.done]
        for t in threads:
            t.start()
        if restart == 1:
            for s in streams:
                s.progress.clear()
            for s in streams:
                if not s.done:
                    s.progress.wait(timeout=60)
            kill9(srv)
            for t in threads:
                t.join(timeout=30)
            ended_before_kill = [s for s in streams if s.done]
            continue
        for t in threads:
            t.join(timeout=120)
        for i, (s, ref) in enumerate(zip(streams, ref_streams)):
            got, usage = assemble(s.chunks)
            want, want_usage = ref
            what = f"stream {i} ({STREAMS[i][0]}, n {STREAMS[i][1].get('n', 1)})"
            check(s.done and all(code == 200 for code in s.statuses),
                  f"{what}: ends with [DONE] over {len(s.statuses)} connections ({s.statuses})")
            check({k: v["text"] for k, v in got.items()} == {k: v["text"] for k, v in want.items()},
                  f"{what}: the text assembled across two kills equals the uninterrupted answer"
                  + first_difference(got, want, s))
            check({k: v["finish"] for k, v in got.items()} == {k: v["finish"] for k, v in want.items()},
                  f"{what}: finish reasons {[v['finish'] for v in got.values()]}")
            check(all(v["role"] == 1 for v in got.values()) or "text" in str(s.chunks[0]["choices"][0]),
                  f"{what}: each chat choice's role delta came exactly once")
            if STREAMS[i][1].get("logprobs"):
                check({k: v["tokens"] for k, v in got.items()} == {k: v["tokens"] for k, v in want.items()},
                      f"{what}: the logprobs' tokens equal the uninterrupted answer's (none twice, none missing)")
            if want_usage:
                check(usage == want_usage, f"{what}: the usage chunk once, equal ({usage} vs {want_usage})")
        for i, ((path, body), key) in enumerate(zip(UNARY, keys)):
            code, _, text = post(srv.http_port, path, body, {"Idempotency-Key": key})
            check(code == 200 and unary_view(text)[0] == ref_unary[i][0],
                  f"unary {i} ({path}) fetched by its Idempotency-Key after two kills equals the uninterrupted answer")
            check(code == 200 and json.loads(text)["id"] == key, f"unary {i}: its id is the Idempotency-Key")
        # Delivered: a second fetch of the same stream is a 404 (its journal entry ended).
        code, _, text = post(srv.http_port, streams[0].path, streams[0].body, {"Last-Event-ID": streams[0].last_id})
        check(code == 404 and "no journaled request" in text, f"a delivered stream is not offered again: {code} {text[:120]}")
        srv.stop()
    # After a clean stop nothing is left to resume.
    with server(shardlm, model, "--journal", str(journal), name="after") as srv:
        # A stream that ended while the first restart ran was delivered within the END's delay
        # (the grace a delivered answer stays reattachable) before that restart's SIGKILL: the
        # server cannot know its client got it, so it waits journaled for a reattach; nothing
        # else may be left (which streams end there depends on the machine's speed).
        allowed = {x.last_id.split(";")[0] for x in ended_before_kill}
        left = journal_open_keys(journal / "journal")
        log = srv.log_path.read_text()
        check(set(left) <= allowed and f"{len(left)} open request(s)" in log,
              f"every delivered request left the journal (open: {left}; ended before the second kill: {sorted(allowed)})")


def group_drain(shardlm, model, work):
    journal = work / "journal-drain"
    _, body = STREAMS[0]
    with server(shardlm, model, name="drain-ref") as srv:
        ref = Stream(STREAMS[0][0], dict(body, max_tokens=400))
        ref.read(srv.http_port)
    srv = server(shardlm, model, "--journal", str(journal), "--drain-timeout", "0", name="drain", env=TS.slow_steps())
    s = Stream(STREAMS[0][0], dict(body, max_tokens=400))
    t = threading.Thread(target=s.read, args=(srv.http_port,))
    t.start()
    while len(s.chunks) < 5 and t.is_alive():
        time.sleep(0.002)
    srv.terminate()
    t.join(timeout=30)
    code = srv.stop()
    check(code == 0 and not s.done and s.last_id, f"the drain cut the journaled stream without [DONE] (exit {code})")
    with server(shardlm, model, "--journal", str(journal), name="drain-restart") as srv2:
        s.read(srv2.http_port)
        if os.environ.get("JOURNAL_DEBUG"):
            print(srv.log_path.read_text()[-3000:], srv2.log_path.read_text()[-3000:], s.chunks[-3:])
    got, want = assemble(s.chunks)[0], assemble(ref.chunks)[0]
    check(s.done and got == want, "after the restart the drained stream finishes with the uninterrupted answer"
          + ("" if got == want else f" (statuses {s.statuses}, done {s.done}; got {[(k, v['finish'], v['role'], len(v['text'])) for k, v in got.items()]}, want {[(k, v['finish'], v['role'], len(v['text'])) for k, v in want.items()]})"))


def group_torn(shardlm, model, work):
    journal = work / "journal-torn"
    srv = server(shardlm, model, "--journal", str(journal), name="torn")
    s = Stream(STREAMS[2][0], dict(STREAMS[2][1], max_tokens=450))
    t = threading.Thread(target=s.read, args=(srv.http_port, 6))
    t.start()
    s.progress.wait(timeout=60)
    kill9(srv)
    t.join(timeout=30)
    with open(journal / "journal", "ab") as f:
        f.write(b"\x40\x00\x00\x00\x12\x34")  # a record's head with no body: a cut write
    with server(shardlm, model, "--journal", str(journal), name="torn-restart") as srv2:
        log = srv2.log_path.read_text()
        check("incomplete record" in log and "1 open request(s)" in log,
              "a cut last record is dropped with a warning; the request before it is resumed")
        s.read(srv2.http_port)
    check(s.done, "the request before the cut record finishes")


def live_key(port):
    """An Idempotency-Key sent again while its first request runs (its stream open, unread) is
    409, not a second request under the same id; so is a Last-Event-ID naming a running
    first-run request (404 would say it does not exist). Once the first has ended, the key makes a
    new request."""
    body = dict(prompt="The cat sat", max_tokens=300, temperature=1.0, seed=3, stream=True)
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        c.request("POST", "/v1/completions", json.dumps(body),
                  {"Content-Type": "application/json", "Idempotency-Key": "dup-1"})
        r = c.getresponse()
        first = r.readline().decode()  # its first SSE line: the request runs
        check(r.status == 200 and first.startswith("id: dup-1;"), f"a keyed stream starts: {r.status} {first[:60]!r}")
        code, _, text = post(port, "/v1/completions", body, {"Idempotency-Key": "dup-1"})
        check(code == 409 and "dup-1" in text and "running" in text,
              f"the same Idempotency-Key while its request runs: {code} {text[:200]}")
        code, _, text = post(port, "/v1/completions", body, {"Last-Event-ID": "dup-1;-"})
        check(code == 409 and "dup-1" in text, f"a Last-Event-ID naming a running first-run request: {code} {text[:200]}")
        rest = r.read().decode()
        check(rest.rstrip().endswith("data: [DONE]"), "the first connection gets its whole stream")
    finally:
        c.close()
    for _ in range(100):  # the first request is freed once its connection is done with it
        code, _, text = post(port, "/v1/completions", dict(body, stream=False, max_tokens=4), {"Idempotency-Key": "dup-1"})
        if code != 409:
            break
        time.sleep(0.05)
    check(code == 200 and json.loads(text)["id"] == "dup-1", f"the key after its request ended: a new request: {code} {text[:160]}")


def server_ids(port):
    """Journaled server ids are KIND-BOOT-R with 64 random bits R: no client can name another's
    request by counting (a server without API keys has one owner for every client: it could read
    any answer within the grace) nor take the next ids as its keys (409 for the requests that gave
    none); an Idempotency-Key of 100 bytes is the id whole (ids were cut at 47 bytes: the answer
    then named another id, and a reattach by the key found nothing)."""
    body = dict(prompt="a", max_tokens=2)
    ids = [json.loads(post(port, "/v1/completions", body)[2])["id"] for _ in range(3)]
    heads, tails = zip(*(i.rsplit("-", 1) for i in ids))
    check(len(set(heads)) == 1 and all(re.fullmatch("[0-9a-f]{16}", t) for t in tails) and len(set(tails)) == 3,
          f"server ids end in 64 random bits: {ids}")
    key = "k" * 64 + "-" + "0123456789" * 3 + "abcde"
    code, _, first = post(port, "/v1/completions", dict(body, seed=5), {"Idempotency-Key": key})
    check(code == 200 and len(key) == 100 and json.loads(first)["id"] == key, f"a 100-byte Idempotency-Key is the id: {code}")
    code, _, again = post(port, "/v1/completions", dict(body, seed=99), {"Idempotency-Key": key})
    check(code == 200 and again == first, f"sent again within the grace, the key fetches that answer: {code}")
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}]
    code, _, text = post(port, "/v1/chat/completions", dict(messages=[{"role": "user", "content": "a"}], tools=tools,
                                                             tool_choice="required", max_tokens=40),
                         {"Idempotency-Key": key[:-1] + "t"})
    calls = json.loads(text)["choices"][0]["message"].get("tool_calls") or [{}] if code == 200 else [{}]
    check(calls[0].get("id") == f"call_{key[:-1]}t_0_0",
          f"a tool call's id holds the whole 100-byte key (the buffers were 96 bytes): {code} {calls[0].get('id')}")


def group_errors(shardlm, model, work):
    with TS.Server(shardlm, model, name="nojournal", http=True) as srv:
        code, _, text = post(srv.http_port, "/v1/completions", dict(prompt="a", max_tokens=2),
                             {"Last-Event-ID": "cmpl-1;-"})
        check(code == 400 and "Last-Event-ID" in text and "--journal" in text, f"Last-Event-ID without a journal: {code} {text[:160]}")
        code, _, text = post(srv.http_port, "/v1/completions", dict(prompt="a", max_tokens=2), {"Idempotency-Key": "k1"})
        check(code == 400 and "Idempotency-Key" in text, f"Idempotency-Key without a journal: {code}")
    # (ENDs at once: the requests delivered before the kill below are not reopened by the restart.)
    # (--journal-detach-grace 0: a request whose connection ended is forgotten at once, as
    # live_key's last check needs: group detach checks the grace.)
    with server(shardlm, model, "--journal", str(work / "j-err"), "--journal-retain", "0.5", "--journal-end-delay", "0",
                "--journal-detach-grace", "0", name="errors") as srv:
        p = srv.http_port
        code, _, text = post(p, "/v1/messages/count_tokens", dict(model="x", messages=[{"role": "user", "content": "a"}]),
                             {"Last-Event-ID": "k;-", "anthropic-version": "2023-06-01"})
        check(code == 400 and "only on /v1/chat/completions" in text,
              f"Last-Event-ID on /v1/messages/count_tokens: {code} {text[:160]}")
        for bad in ("no-semicolon", "bad key;-", ";-", "x" * 101 + ";-"):
            code, _, text = post(p, "/v1/completions", dict(prompt="a", max_tokens=2), {"Last-Event-ID": bad})
            check(code == 400 and "Last-Event-ID" in text, f"malformed Last-Event-ID {bad[:20]!r}: {code}")
        code, _, text = post(p, "/v1/completions", dict(prompt="a", max_tokens=2), {"Last-Event-ID": "cmpl-none;-"})
        check(code == 404 and "no journaled request" in text, f"an unknown Last-Event-ID: {code}")
        live_key(p)
        # A request left undelivered over a restart is forgotten after --journal-retain.
        left = Stream("/v1/completions", dict(prompt="a", max_tokens=400, seed=1, temperature=1.0, stream=True))
        th = threading.Thread(target=left.read, args=(p, 3))
        th.start()
        left.progress.wait(timeout=60)
        kill9(srv)
        th.join(timeout=30)
        srv.proc = subprocess.Popen(["true"])  # the harness's exit check: nothing left to stop
        srv.proc.wait()
        key = left.last_id.split(";")[0]
    with server(shardlm, model, "--journal", str(work / "j-err"), "--journal-retain", "0.5", name="retain") as srv:
        check("1 open request(s)" in srv.log_path.read_text(), "the cut stream is resumed after the restart")
        time.sleep(2.0)
        code, _, text = post(srv.http_port, "/v1/completions", dict(prompt="a"), {"Last-Event-ID": key + ";-"})
        check(code == 404, f"an answer nobody fetched within --journal-retain is forgotten: {code} {text[:120]}")
        check("nobody came for its answer" in srv.log_path.read_text(), "the forgetting is logged")
        server_ids(srv.http_port)  # (the default grace: keys held after their answers)
    (work / "afile").write_text("x")
    r = subprocess.run([shardlm, "serve", "--model", str(model), "--http", "127.0.0.1:0", "--listen", "127.0.0.1:0",
                        "--journal", str(work / "afile")], capture_output=True, text=True, timeout=60)
    check(r.returncode == 1 and "afile" in r.stderr, f"an unusable journal directory: exit {r.returncode} {r.stderr[-160:]}")


def split_chunks(resume):
    """HTTP's chunked transfer encoding may cut an SSE line anywhere (libmicrohttpd sends each
    16 KB the stream hands it as one chunk): resume.stream reads lines across chunk boundaries
    (it once read the raw socket, chunk sizes and all, and a line cut in two failed to parse)."""
    import http.server
    chunks = [{"id": "x", "choices": [{"index": 0, "text": "word " * k, "finish_reason": None}]} for k in range(1, 40)]
    wire = "".join(f"id: x;{k}\ndata: {json.dumps(c)}\n\n" for k, c in enumerate(chunks)) + "data: [DONE]\n\n"

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            data, at = wire.encode(), 0
            for size in [7, 33, 1, 250, 4096] * 100:  # boundaries inside lines, ids and JSON
                piece = data[at:at + size]
                if not piece:
                    break
                self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                at += size
            self.wfile.write(b"0\r\n\r\n")

        def log_message(self, *a):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        got = list(resume.stream(f"http://127.0.0.1:{httpd.server_address[1]}", "/v1/completions", {"stream": True},
                                 retry_for=5))
    finally:
        httpd.shutdown()
    check(got == chunks, f"resume.stream across chunk boundaries inside lines: {len(got)} of {len(chunks)} chunks, equal")


def group_client(shardlm, model, work):
    from shardlm_client import resume
    split_chunks(resume)
    path, body = STREAMS[1]
    upath, ubody = UNARY[0]
    with server(shardlm, model, "--journal", str(work / "journal-client-ref"), name="client-ref") as srv:
        want = assemble(list(resume.stream(srv.base, path, body)))[0]
        want_unary = unary_view(post(srv.http_port, upath, ubody)[2])[0]
    sock = __import__("socket").socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    journal = work / "journal-client"
    srv = server(shardlm, model, "--journal", str(journal), "--http", f"127.0.0.1:{port}", name="client-0")
    base = f"http://127.0.0.1:{port}"
    got, unary, errors = [], {}, []

    def consume():
        try:
            for chunk in resume.stream(base, path, body, retry_for=60):
                got.append(chunk)
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    def fetch():
        try:
            unary["answer"] = resume.request(base, upath, ubody, retry_for=60)
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=consume), threading.Thread(target=fetch)]
    for t in threads:
        t.start()
    for restart in (1, 2):
        end = time.time() + 60
        while len(got) < 5 * restart and time.time() < end:
            time.sleep(0.002)
        kill9(srv)
        srv = server(shardlm, model, "--journal", str(journal), "--http", f"127.0.0.1:{port}", name=f"client-{restart}")
    for t in threads:
        t.join(timeout=120)
    srv.stop()
    check(not errors, f"resume.stream and resume.request went on by themselves across two SIGKILLs ({errors})")
    check(assemble(got)[0] == want, "resume.stream yields the uninterrupted answer's chunks, once each")
    check("answer" in unary and unary_view(json.dumps(unary["answer"]))[0] == want_unary,
          "resume.request returns the uninterrupted unary answer")
    # A cut connection, the server up (--journal-detach-grace): through a TCP proxy whose
    # connections are cut after 3 chunks, resume.stream reconnects by itself (a 409 while the
    # server still sees the old connection is waited out).
    with server(shardlm, model, "--journal", str(work / "journal-client-cut"), name="client-cut") as srv:
        proxy = Proxy(srv.http_port)
        got = []
        for chunk in resume.stream(f"http://{proxy.target}", path, body, retry_for=30):
            got.append(chunk)
            if len(got) == 3:
                proxy.cut()
        proxy.close()
        check(assemble(got)[0] == want and "a client reattached" in srv.log_path.read_text(),
              "resume.stream across a cut connection (the server up) yields the uninterrupted chunks, once each")


def rank0_of(srv):
    for pid in subprocess.run(["pgrep", "-P", str(srv.proc.pid)], capture_output=True, text=True).stdout.split():
        try:
            if b"OMPI_COMM_WORLD_RANK=0" in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                return int(pid)
        except OSError:
            pass
    return None


def group_dp2(shardlm, model, work):
    if not shutil.which("mpirun"):
        print("SKIP dp2: no mpirun")
        return
    ref_streams, _ = references(shardlm, model, work, STREAMS[:3])
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    launcher = ["mpirun", "--oversubscribe", "--bind-to", "none", "-n", "2"]
    journal = work / "journal-dp2"

    def start(name):
        return TS.Server(shardlm, model, *FLAGS, "--dp", "2", "--journal", str(journal), name=name, http=True, env=env,
                         launcher=launcher)

    srv = start("dp2-0")
    streams = [Stream(p, b) for p, b in STREAMS[:3]]
    threads = [threading.Thread(target=s.read, args=(srv.http_port, 6)) for s in streams]
    for t in threads:
        t.start()
    for s in streams:
        s.progress.wait(timeout=60)
    rank0 = rank0_of(srv)
    check(rank0 is not None, "dp2: found rank 0 among mpirun's children")
    os.kill(rank0, signal.SIGKILL)
    srv.proc.wait(timeout=60)  # Open MPI ends the job when a rank dies
    srv.log.close()
    for t in threads:
        t.join(timeout=30)
    with start("dp2-1") as srv:
        srv.signal_pid = rank0_of(srv)
        threads = [threading.Thread(target=s.read, args=(srv.http_port,)) for s in streams if not s.done]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        for i, (s, ref) in enumerate(zip(streams, ref_streams)):
            got = assemble(s.chunks)[0]
            check(s.done and {k: (v["text"], v["finish"]) for k, v in got.items()}
                  == {k: (v["text"], v["finish"]) for k, v in ref[0].items()},
                  f"dp2: stream {i} resumed by a new --dp 2 job equals the one-rank uninterrupted answer"
                  + ("" if s.done and {k: v["text"] for k, v in got.items()} == {k: v["text"] for k, v in ref[0].items()}
                     else f" (done {s.done}, statuses {s.statuses}, got {[(k, v['finish'], len(v['text'])) for k, v in got.items()]}, "
                          f"want {[(k, v['finish'], len(v['text'])) for k, v in ref[0].items()]}; last chunks {s.chunks[-2:]})"))


def group_endwindow(shardlm, model, work):
    """The END window: a unary answer handed to its client just before a SIGKILL is still there
    after the restart (its END is journaled --journal-end-delay later), so a client that did not
    read it all fetches it whole by its Idempotency-Key. (With the delay at 0 the outcome is a
    race: the END may or may not be written before the kill.)"""
    body = dict(prompt="Mom said to Lily", max_tokens=60, temperature=0.9, seed=10)
    journal = work / "j-end"
    with server(shardlm, model, "--journal", str(journal), "--journal-end-delay", "60", name="end") as srv:
        code, _, first = post(srv.http_port, "/v1/completions", body, {"Idempotency-Key": "won-1"})
        check(code == 200, f"the answer before the kill: {code}")
        kill9(srv)
        srv.proc = subprocess.Popen(["true"])  # the harness's exit check: nothing left to stop
        srv.proc.wait()
    with server(shardlm, model, "--journal", str(journal), name="end-restart") as srv:
        check("1 open request(s)" in srv.log_path.read_text(), "the delivered request is reopened by the restart")
        code, _, again = post(srv.http_port, "/v1/completions", dict(body, seed=99), {"Idempotency-Key": "won-1"})
        check(code == 200 and unary_view(again)[0] == unary_view(first)[0] and json.loads(again)["id"] == "won-1",
              f"fetched by its Idempotency-Key after the kill, the answer is the one handed over before it: {code}")
        for _ in range(100):  # the resumed request is freed once its connection is done with it
            code, _, third = post(srv.http_port, "/v1/completions", dict(body, seed=99), {"Idempotency-Key": "won-1"})
            if code != 409:
                break
            time.sleep(0.05)
        check(code == 200 and unary_view(third)[0] != unary_view(first)[0],
              f"once fetched it is delivered: the key makes a new request (seed 99): {code}")


GROUPS = {"restart": group_restart, "client": group_client, "dp2": group_dp2, "drain": group_drain, "torn": group_torn,
          "errors": group_errors, "endwindow": group_endwindow}


def main():
    return SM.stories_groups_main("shardlm-journal-", GROUPS, check, lambda g, sh, model, work, a: GROUPS[g](sh, model, work))


if __name__ == "__main__":
    sys.exit(main())
