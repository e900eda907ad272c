#!/usr/bin/env python3
"""Streams that survive a restart, continued (issue 33, docs/reliability.md; the harness and the
first groups are test_journal.py's): `serve --journal DIR` on stories260K. Groups:
  detach     a dropped connection with the server up (--journal-detach-grace): a stream's client
             reconnects with its Last-Event-ID and gets the rest (the uninterrupted tokens), a
             unary one fetches its answer by its Idempotency-Key; one nobody comes back for is
             cancelled after the grace and forgotten (404)
  owners     with API keys: another key's Last-Event-ID is 404 and its Idempotency-Key 409 for a
             resumed request; its owner reattaches after a restart whose key file is reordered
  apis       the same for Anthropic's /v1/messages and OpenAI's /v1/responses: streams cut by a
             SIGKILL go on from their Last-Event-ID ("KEY;eN", the Nth event) and the events of
             all their connections equal an uninterrupted server's, one by one (ids aside); unary
             answers come by their Idempotency-Key; a response nobody came back for is in the
             store, ended, after the restart, and previous_response_id can name it; a key
             sent to another endpoint is refused naming its own
Reference answers come from a server that is never interrupted; no expected text is written here.

  test_journal_apis.py --shardlm BUILD/cli/shardlm [GROUP...]
"""
import http.client
import json
import os
import sys
import threading
import time
from pathlib import Path

sys.dont_write_bytecode = True
sys.path.insert(0, str(Path(__file__).resolve().parent))
# test_journal's harness (importing it SKIPs without the suite's packages)
from test_journal import (STORY, STREAMS, UNARY, Stream, assemble, check, get, kill9, post, post_quietly, server,  # noqa: E402
                          unary_view)
import stories_main as SM  # noqa: E402


def reset(c):
    """Closes connection c with a reset (SO_LINGER 0): the server sees the client gone at once,
    whatever the half-close rule says of a FIN soon after the request. The descriptor is closed
    itself: c.sock.close() would leave it open while a response still holds the socket (a reset
    only when the garbage collector gets to it)."""
    import socket
    import struct
    c.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    os.close(c.sock.detach())


def group_detach(shardlm, model, work):
    """A dropped connection, the server up (--journal-detach-grace): a journaled stream whose
    client went away runs on; the client reconnects with its Last-Event-ID and gets the rest,
    equal to the uninterrupted answer; a unary request's client gets its answer by its
    Idempotency-Key; a stream nobody comes back for is cancelled after the grace and forgotten."""
    path, body = STREAMS[2]  # logprobs: the tokens show that none is twice or missing
    upath, ubody = UNARY[1]
    with server(shardlm, model, "--journal", str(work / "j-detach"), "--journal-detach-grace", "3",
                name="detach") as srv:
        p = srv.http_port
        ref = Stream(path, body)
        ref.read(p)
        want = assemble(ref.chunks)[0]
        want_unary = unary_view(post(p, upath, ubody)[2])[0]
        s = Stream(path, body)
        c = http.client.HTTPConnection("127.0.0.1", p, timeout=60)
        c.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        r = c.getresponse()
        while len(s.chunks) < 3:  # three chunks, then the connection is reset
            line = r.readline().decode().rstrip("\n")
            if line.startswith("id: "):
                s.last_id = line[4:]
            elif line.startswith("data: "):
                s.chunks.append(json.loads(line[6:]))
        reset(c)
        check(len(s.chunks) == 3 and s.last_id, f"the stream's client got 3 chunks and went ({s.last_id})")
        time.sleep(0.5)
        s.read(p)
        got = assemble(s.chunks)[0]
        check(s.done and s.statuses == [200] and got[0]["tokens"] == want[0]["tokens"] and
              got[0]["text"] == want[0]["text"],
              f"reconnected with its Last-Event-ID, it gets the rest: the uninterrupted answer, no token twice or "
              f"missing ({len(got[0]['tokens'])} of {len(want[0]['tokens'])} tokens; {s.statuses} {getattr(s, 'error', '')[:160]})")
        c = http.client.HTTPConnection("127.0.0.1", p, timeout=60)
        c.request("POST", upath, json.dumps(ubody), {"Content-Type": "application/json", "Idempotency-Key": "det-u"})
        time.sleep(0.05)
        reset(c)
        for _ in range(50):  # 409 until the server has seen the reset (it polls every 100 ms)
            code, _, text = post(p, upath, ubody, {"Idempotency-Key": "det-u"})
            if code != 409:
                break
            time.sleep(0.1)
        check(code == 200 and unary_view(text)[0] == want_unary,
              f"a unary request whose connection dropped: its answer by its Idempotency-Key: {code} {text[:100]}")
        def http_requests():  # /metrics: every HTTP request counted, whatever its status
            text = get(p, "/metrics")[2]
            return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                       if line.startswith("shardlm_requests_total{") and 'api="http"' in line)
        counted = http_requests()
        left = Stream(path, dict(body, max_tokens=480, seed=31))
        c = http.client.HTTPConnection("127.0.0.1", p, timeout=60)
        c.request("POST", left.path, json.dumps(left.body), {"Content-Type": "application/json"})
        r = c.getresponse()
        left.last_id = r.readline().decode()[4:].rstrip("\n")
        reset(c)
        time.sleep(4.5)  # the grace (3 s) and a sweep
        code, _, text = post(p, left.path, left.body, {"Last-Event-ID": left.last_id})
        log = srv.log_path.read_text()
        check(code == 404 and "did not come back within 3 s" in log,
              f"a stream nobody came back for is forgotten after the grace: {code} {text[:150]}")
        # (the GET /metrics and the 404 just sent are not generation requests: not counted)
        check(http_requests() == counted + 1,
              f"that request is in /metrics once, counted when the sweep forgot it ({counted} -> {http_requests()})")
def group_detach_max(shardlm, model, work, gguf=None):
    """--journal-detach-max: past it a client that goes away ends its request (a client dropping
    connection after connection cannot leave unbounded work behind). It counts the requests still
    running: on SmolLM2's GGUF (slow enough) the first request that went (400 tokens) still runs when
    the second (40) goes; the first is reattached, the second is 404."""
    if not gguf or not Path(gguf).exists():
        print(f"SKIP detach_max: no GGUF at {gguf!r} (tools/fetch_smollm2.sh)")
        return
    path = "/v1/completions"
    body = dict(prompt=STORY, temperature=1.0, stream=True)
    with server(shardlm, gguf, "--journal", str(work / "j-detach-max"), "--journal-detach-max", "1",
                name="detach-max") as srv:
        p, ids = srv.http_port, []
        for seed, n in ((41, 400), (42, 40)):
            c = http.client.HTTPConnection("127.0.0.1", p, timeout=60)
            c.request("POST", path, json.dumps(dict(body, seed=seed, max_tokens=n)), {"Content-Type": "application/json"})
            ids.append(c.getresponse().readline().decode()[4:].rstrip("\n"))
            reset(c)
        end = time.time() + 30  # the server has seen the second go (at the latest when it ends)
        while f"req={ids[1].split(';')[0]}: its client went away" not in srv.log_path.read_text() and time.time() < end:
            time.sleep(0.05)
        kept = Stream(path, dict(body, seed=41, max_tokens=400))
        kept.last_id = ids[0]
        kept.read(p)
        code, _, text = post(p, path, dict(body, seed=42, max_tokens=40), {"Last-Event-ID": ids[1]})
        log = srv.log_path.read_text()
        check(kept.done and kept.statuses == [200] and code == 404 and "--journal-detach-max (1)" in log,
              f"--journal-detach-max 1: the first request that went is kept ({kept.statuses}), the second ended "
              f"at once ({code}), the log says why")
    # With two API keys a key's share is half of --journal-detach-max: key A dropping two requests
    # keeps its first and ends its second, and key B's dropped request still runs on (one key
    # cannot take every detached place from the others).
    keys = work / "detach-keys"
    keys.write_text("key-alpha\nkey-beta\n")
    A, B = {"Authorization": "Bearer key-alpha"}, {"Authorization": "Bearer key-beta"}
    with server(shardlm, gguf, "--journal", str(work / "j-detach-per-key"), "--journal-detach-max", "2",
                "--api-key-file", str(keys), name="detach-per-key") as srv:
        p, ids = srv.http_port, []
        for seed, who in ((51, A), (52, A), (53, B)):
            c = http.client.HTTPConnection("127.0.0.1", p, timeout=60)
            c.request("POST", path, json.dumps(dict(body, seed=seed, max_tokens=400)),
                      {"Content-Type": "application/json", **who})
            ids.append(c.getresponse().readline().decode()[4:].rstrip("\n"))
            reset(c)
            end = time.time() + 30
            while f"req={ids[-1].split(';')[0]}: its client went away" not in srv.log_path.read_text() and \
                    time.time() < end:
                time.sleep(0.05)
        log = srv.log_path.read_text()
        went = {i: next((line for line in log.splitlines() if f"req={i.split(';')[0]}: its client went away" in line), "")
                for i in ids}
        check("it runs on" in went[ids[0]] and "--journal-detach-max-per-key (1) of its API key's" in went[ids[1]] and
              "cancelled" in went[ids[1]] and "it runs on" in went[ids[2]],
              f"two keys, --journal-detach-max 2: A's first runs on, A's second is cancelled at its key's share, B's "
              f"runs on: {list(went.values())}")
        kept = Stream(path, dict(body, seed=53, max_tokens=400), B)
        kept.last_id = ids[2]
        kept.read(p)
        check(kept.done and kept.statuses == [200], f"B reattaches to its request: {kept.statuses}")


def group_owners(shardlm, model, work):
    """With API keys a journaled request belongs to its key: another key's Last-Event-ID finds
    nothing (404) and its Idempotency-Key cannot take the request's answer (409: the key is in
    use); its owner reattaches after a restart whose key file lists the keys in another order
    (the owner is the key's hash, not its line)."""
    keys = work / "owner-keys"
    keys.write_text("key-alpha\nkey-beta\n")
    A, B = {"Authorization": "Bearer key-alpha"}, {"Authorization": "Bearer key-beta"}
    journal = work / "j-owners"
    srv = server(shardlm, model, "--journal", str(journal), "--api-key-file", str(keys), name="owners")
    path, body = STREAMS[0]
    s = Stream(path, body, A)
    th = threading.Thread(target=s.read, args=(srv.http_port, 4))
    th.start()
    s.progress.wait(timeout=60)
    kill9(srv)
    th.join(timeout=30)
    check(s.last_id and not s.done, f"the owner's stream was cut mid-way ({s.last_id})")
    keys.write_text("key-beta\nkey-alpha\n")  # the same keys, their lines swapped
    with server(shardlm, model, "--journal", str(journal), "--api-key-file", str(keys), name="owners-restart") as srv:
        p = srv.http_port
        code, _, text = post(p, path, body, {"Last-Event-ID": s.last_id, **B})
        check(code == 404 and "no journaled request" in text, f"another key's Last-Event-ID: {code} {text[:120]}")
        key = s.last_id.split(";")[0]
        unary = {k: v for k, v in body.items() if k != "stream_options"}  # (only allowed with stream)
        code, _, text = post(p, path, dict(unary, stream=False), {"Idempotency-Key": key, **B})
        check(code == 409 and "choices" not in text, f"another key's Idempotency-Key: {code} {text[:120]}")
        s.read(p)
        check(s.done and s.statuses[-1] == 200, f"its owner reattaches after the restart (keys reordered): {s.statuses}")


ANTHROPIC = {"anthropic-version": "2023-06-01"}
# (path, body, headers) streamed through Anthropic's and the Responses API's events. Anthropic's
# API has no seed: greedy, so that the uninterrupted server's answer is the same one.
EVENT_STREAMS = [
    ("/v1/messages", dict(model="stories260K", max_tokens=300, temperature=0, stream=True,
                          messages=[{"role": "user", "content": STORY}]), ANTHROPIC),
    ("/v1/responses", dict(model="stories260K", max_output_tokens=300, temperature=0.9, seed=12, stream=True,
                           input="A big dog ran"), {}),
    ("/v1/responses", dict(model="stories260K", max_output_tokens=300, temperature=0.9, seed=13, stream=True,
                           input="The cat sat"), {}),  # its client never comes back
]
EVENT_UNARY = [
    ("/v1/messages", dict(model="stories260K", max_tokens=300, temperature=0, messages=[{"role": "user", "content": "Tom had"}]),
     ANTHROPIC),
    ("/v1/responses", dict(model="stories260K", max_output_tokens=300, temperature=0.9, seed=14, input="Mom said to Lily"), {}),
]
EVENT_ENDS = {"message_stop", "response.completed", "response.incomplete", "response.failed", "error"}


class EventStream(Stream):
    """An Anthropic or Responses stream's client: its (event, data) pairs over every connection."""

    def __init__(self, path, body, headers):
        super().__init__(path, body, headers)
        self.events = []

    def start(self):
        self.ev_id = self.name = self.data = None

    def take(self, line):
        """One line of an event stream: 1 when its blank line dispatched an event (an event a cut
        left without it is not one)."""
        if line.startswith("id: "):
            self.ev_id = line[4:]
        elif line.startswith("event: "):
            self.name = line[7:]
        elif line.startswith("data: "):
            self.data = json.loads(line[6:])
        elif line == "" and self.name:
            self.events.append((self.name, self.data))
            self.last_id = self.ev_id or self.last_id
            self.done = self.name in EVENT_ENDS
            self.start()
            return 1
        return 0


def normalized(events):
    """The events with what differs between two servers (ids, times, prefix-cache hits) made equal."""
    text = json.dumps(events)
    for name, data in events:
        if name == "message_start":
            text = text.replace(data["message"]["id"], "ID")
        if name == "response.created":
            text = text.replace(data["response"]["id"][5:], "ID")
    text = __import__("re").sub(r'"created_at": [0-9]+', '"created_at": 0', text)
    # Prefix-cache hits depend on what the server ran before, not on the answer.
    return json.loads(__import__("re").sub(r'"cached_tokens": [0-9]+', '"cached_tokens": 0', text))


def reply_text(path, text):
    j = json.loads(text)
    if path == "/v1/messages":
        return "".join(b.get("text", "") for b in j["content"]), j["stop_reason"]
    return "".join(p["text"] for it in j["output"] if it["type"] == "message" for p in it["content"]), j["status"]


def group_apis(shardlm, model, work):
    with server(shardlm, model, "--journal", str(work / "apis-ref"), name="apis-ref") as srv:
        ref = []
        for path, body, headers in EVENT_STREAMS:
            s = EventStream(path, body, headers)
            s.read(srv.http_port)
            check(s.done and len(s.events) > 12, f"reference {path} stream: {len(s.events)} events, ends")
            ref.append(normalized(s.events))
        ref_unary = [reply_text(p, post(srv.http_port, p, b, h)[2]) for p, b, h in EVENT_UNARY]
    journal = work / "apis-journal"
    srv = server(shardlm, model, "--journal", str(journal), name="apis-first")
    streams = [EventStream(*x) for x in EVENT_STREAMS]
    keys = [f"apis-{i}-{os.getpid()}" for i in range(len(EVENT_UNARY))]
    threads = [threading.Thread(target=s.read, args=(srv.http_port, 6)) for s in streams]
    threads += [threading.Thread(target=post_quietly, args=(srv.http_port, p, b, {"Idempotency-Key": k, **h}))
                for (p, b, h), k in zip(EVENT_UNARY, keys)]
    for t in threads:
        t.start()
    for s in streams:
        s.progress.wait(timeout=60)
    time.sleep(0.05)
    kill9(srv)
    for t in threads:
        t.join(timeout=30)
    check(all(not s.done and s.last_id and ";e" in s.last_id for s in streams),
          f"every stream was cut after some events (ids {[s.last_id for s in streams]})")
    with server(shardlm, model, "--journal", str(journal), name="apis-restart") as srv:
        p = srv.http_port
        code, _, text = post(p, "/v1/chat/completions", dict(messages=[{"role": "user", "content": "a"}]),
                             {"Idempotency-Key": keys[0]})
        check(code == 400 and "/v1/messages" in text, f"a /v1/messages key sent to /v1/chat/completions: {code} {text[:160]}")
        code, _, text = post(p, streams[0].path, streams[0].body, {"Last-Event-ID": streams[0].last_id + "9999", **ANTHROPIC})
        check(code == 400 and "not a position" in text, f"a Last-Event-ID past the stream's events: {code} {text[:160]}")
        for s, want in zip(streams[:2], ref[:2]):
            s.read(p)
            check(s.done and all(code == 200 for code in s.statuses),
                  f"{s.path}: ends over {len(s.statuses)} connections ({s.statuses})")
            check(normalized(s.events) == want,
                  f"{s.path}: the {len(s.events)} events of both connections equal the uninterrupted stream's "
                  f"{len(want)}, one by one")
        for (path, body, h), key, want in zip(EVENT_UNARY, keys, ref_unary):
            code, _, text = post(p, path, body, {"Idempotency-Key": key, **h})
            check(code == 200 and reply_text(path, text) == want,
                  f"unary {path} fetched by its Idempotency-Key after the kill equals the uninterrupted answer: {code}")
        # The response whose client never came back: completed in the store, and usable.
        rid = next(d["response"]["id"] for n, d in streams[2].events if n == "response.created")
        for _ in range(200):
            code, _, text = get(p, f"/v1/responses/{rid}")
            if code != 200 or json.loads(text)["status"] != "in_progress":
                break
            time.sleep(0.1)
        want_text = "".join(d["delta"] for n, d in ref[2] if n == "response.output_text.delta")
        want_status = ref[2][-1][1]["response"]["status"]
        check(code == 200 and reply_text("/v1/responses", text) == (want_text, want_status),
              f"a resumed response nobody reattached to is stored, ended, with the uninterrupted text and status: {code} "
              f"{reply_text('/v1/responses', text) if code == 200 else text[:200]} vs {want_text[:80]!r}")
        code, _, text = post(p, "/v1/responses", dict(model="stories260K", max_output_tokens=4, input="and then", previous_response_id=rid))
        check(code == 200, f"previous_response_id names it after the restart: {code} {text[:160]}")
        srv.stop()



GROUPS = {"apis": group_apis, "owners": group_owners, "detach": group_detach, "detach_max": group_detach_max}


def main():
    def run(g, shardlm, model, work, a):
        if g == "detach_max":
            GROUPS[g](shardlm, model, work, a.gguf)
        else:
            GROUPS[g](shardlm, model, work)
    return SM.stories_groups_main("shardlm-journal-apis-", GROUPS, check, run,
                                  [("--gguf", "SmolLM2-135M-Instruct.Q4_1.gguf (group detach_max)")])


if __name__ == "__main__":
    sys.exit(main())
