#!/usr/bin/env python3
"""gRPC streams that survive a restart (issue 33, docs/reliability.md): `serve --journal DIR` on
stories260K under --batch-invariant, driven by grpcio. Groups:
  restart    a GenerateStream (n 2), a ChatStream and a unary Generate are killed (SIGKILL) mid-way;
             after the restart each client reattaches with its resume token (metadata
             shardlm-resume-token, and shardlm-resume-from with the token ids it has per sample) and
             what it assembles from both calls equals an uninterrupted server's answer token for
             token, no message twice, none missing; a delivered request is NOT_FOUND afterwards;
             refusals: an unknown token (NOT_FOUND), a position the stream never had and the wrong
             method (INVALID_ARGUMENT), a request that another call reads (ABORTED)
  live       a token naming a first-run request still answered on its own call: ABORTED;
             the same request_id sent again while it runs: ALREADY_EXISTS; a token sent to a
             server without a journal: INVALID_ARGUMENT naming --journal
  deadline   a stream whose gRPC deadline passes while the server is down ends with
             DEADLINE_EXCEEDED when its client reattaches (and the log says why), never silently
  drain      SIGTERM with --drain-timeout 0 cuts a journaled stream with UNAVAILABLE (no END); the
             restart finishes it for the reattaching client with the uninterrupted answer
  owners     with API keys: another key's Cancel or reattach (resume token) of a running or a resumed
             request is NOT_FOUND; its owner reattaches after a restart whose key file is reordered;
             the journal directory holds owner.salt (mode 0600) and the journal the salted owner
             (PBKDF2, recomputed here), never the unsalted FNV one of versions before; a journal
             whose records carry that legacy owner (rewritten here) is still its key's after the
             restart, and the compacted journal then holds the salted owner
  client     shardlm_client.Client's generate_stream and generate against a server SIGKILLed twice
             and restarted on the same port (SmolLM2-135M's GGUF, --gguf: slow enough that both kills
             land mid-answer; SKIP without it): they go on by themselves (UNAVAILABLE, the token) and
             give the uninterrupted answer
  detach     --journal-detach-grace, the server up: a stream and a unary call whose client went
             away (cancelled) are reattached by their token and give the uninterrupted answers;
             shardlm_client.Client through a TCP proxy whose connections are cut goes on by itself;
             after the grace NOT_FOUND and the id free again; grace 0 ends the request at once;
             with SmolLM2's GGUF (slow enough) a request running at the grace's end is cancelled,
             its id taken again at once, and the journal reopens with nothing open
  sync       the ACCEPT's fdatasync off the gRPC loop: with each slowed by 2 s, a running stream and
             other calls go on during another call's sync; a call that gives up meanwhile never
             reaches the engine and its journal entry is ended
Reference answers come from a journaled server that is never interrupted; no expected text here.

  test_journal_grpc.py --shardlm BUILD/cli/shardlm [GROUP...]
"""
import os
import re
import signal
import stat
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

SKIP = 77
sys.dont_write_bytecode = True
sys.path.insert(0, str(Path(__file__).resolve().parent))
import test_server as TS  # noqa: E402  (SKIPs by itself without grpcio or the client)
import stories_main as SM  # noqa: E402  (the mains on stories260K)
from checks import Checks  # noqa: E402
import journal_file as JF  # noqa: E402
from owners import legacy_owner_of, owner_of  # noqa: E402
from tcp_proxy import Proxy  # noqa: E402

grpc, pb, pb_grpc, Client = TS.grpc, TS.pb, TS.pb_grpc, TS.Client
from shardlm_client import sampling_params  # noqa: E402
check = Checks()
FLAGS = ("--batch-invariant", "--max-seqs", "16")
STORY = "Once upon a time, there was a little girl named Lily. She"


def gen_req(rid="", **sampling):
    return pb.GenerateRequest(request_id=rid, prompt=STORY, sampling=sampling_params(**sampling))


def chat_req(rid="", **sampling):
    return pb.ChatRequest(request_id=rid, messages=[pb.ChatMessage(role="user", content="A big dog ran")],
                          sampling=sampling_params(**sampling))


# (method name, request): long sampled answers, so that a kill lands mid-way.
STREAMS = [
    ("GenerateStream", lambda: gen_req(max_tokens=400, temperature=1.0, top_p=0.95, seed=6, n=2)),
    ("ChatStream", lambda: chat_req(max_tokens=400, temperature=0.9, seed=9)),
]


def UNARY(rid):
    return gen_req(rid, max_tokens=450, temperature=0.9, seed=10, n=4)


def server(shardlm, model, *extra, name, env=None):
    return TS.Server(shardlm, model, *FLAGS, *extra, name=name, env=env)


def kill9(srv):
    srv.proc.send_signal(signal.SIGKILL)
    srv.proc.wait(timeout=20)
    srv.log.close()


def stub(srv):
    return pb_grpc.TextGenerationStub(grpc.insecure_channel(srv.target))


class Reader:
    """One streamed request's client over several calls: its messages, its resume token."""

    def __init__(self, method, req):
        self.method, self.req = method, req
        self.msgs, self.token, self.code, self.details = [], None, None, ""

    def state(self, n):
        counts, finals = [0] * n, [False] * n
        for m in self.msgs:
            counts[m.index] += len(m.token_ids)
            finals[m.index] |= m.finish_reason != 0
        return ",".join(f"{c}{'!' if f else ''}" for c, f in zip(counts, finals))

    def call(self, st, md=(), stop_after=None, req=None):
        """Reads one call: until its status, or stop_after messages (the call is returned, open)."""
        call = getattr(st, self.method)(self.req if req is None else req, metadata=list(md), timeout=120)
        got = 0
        try:
            if self.token is None:
                self.token = dict(call.initial_metadata() or ()).get("shardlm-resume-token")
            for m in call:
                self.msgs.append(m)
                got += 1
                if stop_after and got >= stop_after:
                    return call
            self.code = grpc.StatusCode.OK
        except grpc.RpcError as e:
            self.code, self.details = e.code(), e.details()
        return None

    def start(self, st):
        """Opens the call (every stream of a group runs before any is read: none ends before the kill)."""
        call = getattr(st, self.method)(self.req, timeout=120)
        self.token = dict(call.initial_metadata() or ()).get("shardlm-resume-token")
        return call

    def take(self, call, k):
        for m in call:
            self.msgs.append(m)
            if len(self.msgs) >= k:
                break
        return call

    def rest(self, call):
        """What a call left open by call(stop_after) still delivers before it breaks (nothing when
        call() saw its status already: None)."""
        if call is None:
            return
        try:
            for m in call:
                self.msgs.append(m)
            self.code = grpc.StatusCode.OK
        except grpc.RpcError as e:
            self.code, self.details = e.code(), e.details()

    def assemble(self):
        out = {}
        for m in self.msgs:
            o = out.setdefault(m.index, {"text": "", "ids": [], "finish": 0, "finals": 0})
            o["text"] += m.text
            o["ids"] += list(m.token_ids)
            if m.finish_reason:
                o["finish"] = m.finish_reason
                o["finals"] += 1
        return out


def unary_view(r):
    return [(c.index, c.text, list(c.token_ids), c.finish_reason) for c in r.completions]


def references(shardlm, model, work):
    with server(shardlm, model, "--journal", str(work / "ref-journal"), name="ref") as srv:
        st = stub(srv)
        refs = []
        for method, req in STREAMS:
            r = Reader(method, req())
            r.call(st)
            check(r.code == grpc.StatusCode.OK and r.token, f"reference {method}: OK with a resume token ({r.code})")
            refs.append(r.assemble())
        unary = unary_view(st.Generate(UNARY("u-ref"), timeout=60))
    return refs, unary


def group_restart(shardlm, model, work):
    refs, ref_unary = references(shardlm, model, work)
    journal = work / "journal"
    srv = server(shardlm, model, "--journal", str(journal), name="first")
    st = stub(srv)
    ufut = st.Generate.future(UNARY("u-1"), timeout=60)
    readers = [Reader(m, req()) for m, req in STREAMS]
    calls = [r.start(st) for r in readers]
    calls = [r.take(c, 4) for r, c in zip(readers, calls)]
    kill9(srv)
    for r, c in zip(readers, calls):
        r.rest(c)
    check(all(r.code == grpc.StatusCode.UNAVAILABLE and r.token and len(r.msgs) >= 4 for r in readers),
          f"every stream was cut mid-way after some messages ({[(r.code, len(r.msgs)) for r in readers]})")
    try:
        ufut.result()
        check(False, "the unary call was cut by the kill")
    except grpc.RpcError as e:
        utoken = dict(e.initial_metadata() or ()).get("shardlm-resume-token")
        check(e.code() == grpc.StatusCode.UNAVAILABLE and utoken == "u-1",
              f"the unary call was cut, its resume token (its request_id) in the metadata it had: {e.code()} {utoken}")
    with server(shardlm, model, "--journal", str(journal), name="restart") as srv:
        st = stub(srv)
        log = srv.log_path.read_text()
        check("open request(s) to resume" in log and "gRPC GenerateStream" in log, "the journaled gRPC calls are resumed")
        g = readers[0]
        # Refusals first: none of them may take the request or lose a token.
        bad = Reader(g.method, g.req)
        bad.call(st, [("shardlm-resume-token", g.token), ("shardlm-resume-from", "100000,0")])
        check(bad.code == grpc.StatusCode.INVALID_ARGUMENT and "shardlm-resume-from" in bad.details,
              f"a position the stream never had: {bad.code} {bad.details}")
        bad = Reader("GenerateStream", gen_req())
        bad.call(st, [("shardlm-resume-token", readers[1].token)])
        check(bad.code == grpc.StatusCode.INVALID_ARGUMENT and "ChatStream" in bad.details,
              f"the wrong method: {bad.code} {bad.details}")
        bad.call(st, [("shardlm-resume-token", "no-such-request")])
        check(bad.code == grpc.StatusCode.NOT_FOUND and "no journaled request" in bad.details,
              f"an unknown token: {bad.code} {bad.details}")
        bad = Reader(g.method, gen_req(max_tokens=3))
        bad.call(st, [("shardlm-resume-token", g.token)])
        check(bad.code == grpc.StatusCode.INVALID_ARGUMENT and "empty or the original" in bad.details,
              f"a different request message: {bad.code} {bad.details}")
        # One reader holds the first stream while a second tries it.
        holder = Reader(g.method, pb.GenerateRequest())
        hc = holder.call(st, [("shardlm-resume-token", g.token)], stop_after=1)
        other = Reader(g.method, g.req)
        other.call(st, [("shardlm-resume-token", g.token)])
        check(other.code == grpc.StatusCode.ABORTED and "another client" in other.details,
              f"a request another call reads: {other.code} {other.details}")
        other.call(st, [("shardlm-resume-token", g.token)])
        check(other.code == grpc.StatusCode.ABORTED, f"and again (the refusal took nothing): {other.code}")
        if hc:
            hc.cancel()
        time.sleep(0.3)  # the server sees the cancel: the request is free again (and runs on)
        for i, r in enumerate(readers):
            r.call(st, [("shardlm-resume-token", r.token), ("shardlm-resume-from", r.state(max(r.req.sampling.n, 1)))],
                   req=pb.GenerateRequest() if i == 0 else None)  # empty, or the original request
            got, want = r.assemble(), refs[i]
            what = f"{r.method} (n {max(r.req.sampling.n, 1)})"
            check(r.code == grpc.StatusCode.OK, f"{what}: the reattached call ends OK ({r.code} {r.details})")
            check({k: v["ids"] for k, v in got.items()} == {k: v["ids"] for k, v in want.items()},
                  f"{what}: the token ids over the kill equal the uninterrupted answer's, none twice, none missing")
            check({k: v["text"] for k, v in got.items()} == {k: v["text"] for k, v in want.items()},
                  f"{what}: the text over the kill equals the uninterrupted answer's")
            check({k: (v["finish"], v["finals"]) for k, v in got.items()}
                  == {k: (v["finish"], 1) for k, v in want.items()}, f"{what}: each sample's last message once")
        try:
            st.Generate(gen_req("u-1", max_tokens=2), timeout=60)
            check(False, "a new call under the id of a resumed request is refused")
        except grpc.RpcError as e:
            check(e.code() == grpc.StatusCode.ALREADY_EXISTS and "u-1" in e.details(),
                  f"a new call under the id of a resumed request: {e.code()} {e.details()}")
        try:
            ans = st.Generate(pb.GenerateRequest(), metadata=[("shardlm-resume-token", "u-1")], timeout=60)
            check(unary_view(ans) == ref_unary, "the unary Generate reattached by its token equals the uninterrupted answer")
        except grpc.RpcError as e:
            check(False, f"the unary Generate reattached by its token: {e.code()} {e.details()}")
        again = Reader(g.method, g.req)
        again.call(st, [("shardlm-resume-token", g.token)])
        check(again.code == grpc.StatusCode.NOT_FOUND, f"a delivered request is not offered again: {again.code}")
    with server(shardlm, model, "--journal", str(journal), name="after") as srv:
        check("0 open request(s)" in srv.log_path.read_text(), "every delivered request left the journal")


def group_live(shardlm, model, work):
    with server(shardlm, model, "--journal", str(work / "journal-live"), name="live") as srv:
        st = stub(srv)
        first = Reader("GenerateStream", gen_req("live-1", max_tokens=400, temperature=1.0, seed=3))
        fc = first.call(st, stop_after=1)
        other = Reader("GenerateStream", pb.GenerateRequest())
        other.call(st, [("shardlm-resume-token", "live-1")])
        check(other.code == grpc.StatusCode.ABORTED and "another client" in other.details,
              f"a token naming a first run answered on its own call: {other.code} {other.details}")
        dup = Reader("GenerateStream", gen_req("live-1", max_tokens=4))
        dup.call(st)
        check(dup.code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.ALREADY_EXISTS) and "live-1" in dup.details,
              f"the same request_id while it runs: {dup.code} {dup.details}")
        first.rest(fc)
        check(first.code == grpc.StatusCode.OK and first.token == "live-1", "the first call gets its whole answer")
        # Server ids end in 64 random bits: no client can name another's request by counting.
        ids = [st.Generate(gen_req(max_tokens=2), timeout=60).request_id for _ in range(3)]
        heads, tails = zip(*(i.rsplit("-", 1) for i in ids))
        check(len(set(heads)) == 1 and all(re.fullmatch("[0-9a-f]{16}", t) for t in tails) and len(set(tails)) == 3,
              f"server ids end in 64 random bits: {ids}")
    with server(shardlm, model, name="nojournal") as srv:
        r = Reader("GenerateStream", gen_req())
        r.call(stub(srv), [("shardlm-resume-token", "x")])
        check(r.code == grpc.StatusCode.INVALID_ARGUMENT and "--journal" in r.details,
              f"a token without a journal: {r.code} {r.details}")
        check(r.token is None, "a server without a journal names no resume token")
        r.call(stub(srv), [("shardlm-resume-from", "3")])
        check(r.code == grpc.StatusCode.INVALID_ARGUMENT and "shardlm-resume-token" in r.details,
              f"shardlm-resume-from without a token: {r.code} {r.details}")


def group_deadline(shardlm, model, work):
    journal = work / "journal-deadline"
    srv = server(shardlm, model, "--journal", str(journal), name="deadline")
    st = stub(srv)
    req = gen_req(max_tokens=450, temperature=1.0, seed=4, n=3)
    t0 = time.monotonic()
    call = st.GenerateStream(req, timeout=4.0)
    token = dict(call.initial_metadata() or ()).get("shardlm-resume-token")
    got = 0
    for _ in call:
        got += 1
        if got >= 2:
            break
    kill9(srv)
    time.sleep(max(0.0, 4.5 - (time.monotonic() - t0)))  # the deadline passes while it is down
    with server(shardlm, model, "--journal", str(journal), name="deadline-restart") as srv:
        r = Reader("GenerateStream", req)
        r.call(stub(srv), [("shardlm-resume-token", token)])
        check(r.code == grpc.StatusCode.DEADLINE_EXCEEDED,
              f"a deadline that passed during the outage ends the reattached call: {r.code} {r.details}")
        check(any(m.finish_reason == 5 for m in r.msgs), "its samples' last messages say deadline")
        check("deadline passed while the server was down" in srv.log_path.read_text(), "the log says why")


def group_cancel(shardlm, model, work):
    """Cancel of a resumed request no call is attached to: its samples end cancelled (journaled), a
    client that reattaches gets what was generated and CANCELLED; then it is forgotten."""
    journal = work / "journal-cancel"
    srv = server(shardlm, model, "--journal", str(journal), name="cancel")
    r = Reader("GenerateStream", gen_req("cx-1", max_tokens=450, temperature=1.0, seed=12, n=2))
    c = r.take(r.start(stub(srv)), 2)
    kill9(srv)
    r.rest(c)
    with server(shardlm, model, "--journal", str(journal), name="cancel-restart") as srv:
        st = stub(srv)
        ans = st.Cancel(pb.CancelRequest(request_id="cx-1"), timeout=30)
        check(ans.cancelled, "Cancel of a resumed request nobody reads says cancelled")
        try:
            st.Cancel(pb.CancelRequest(request_id="cx-2"), timeout=30)
            check(False, "Cancel of an unknown id is NOT_FOUND")
        except grpc.RpcError as e:
            check(e.code() == grpc.StatusCode.NOT_FOUND, f"Cancel of an unknown id: {e.code()}")
        r.call(st, [("shardlm-resume-token", "cx-1"), ("shardlm-resume-from", r.state(2))])
        finals = [m.finish_reason for m in r.msgs if m.finish_reason]
        check(r.code == grpc.StatusCode.CANCELLED and len(finals) == 2 and 4 in finals,
              f"the reattached client gets the rest, a sample cancelled, then CANCELLED: {r.code} {r.details} {finals}")
        n = sum(len(m.token_ids) for m in r.msgs)
        check(0 < n < 2 * 450, f"it was stopped mid-way ({n} tokens over both samples)")
        check("by Cancel" in srv.log_path.read_text(), "the log names the Cancel")
        try:
            st.Cancel(pb.CancelRequest(request_id="cx-1"), timeout=30)
            check(False, "a delivered, cancelled request is forgotten")
        except grpc.RpcError as e:
            check(e.code() == grpc.StatusCode.NOT_FOUND, f"Cancel after its answer was delivered: {e.code()}")


def journal_put_str(s):
    """kernels/base/codec.h put_str: u64 length, the bytes and a NUL, padded to 8 bytes."""
    b = s.encode() + b"\0"
    return struct.pack("<Q", len(s)) + b + b"\0" * (-len(b) % 8)


def journal_rewrite_owner(path, old, new):
    """Rewrites the owner (the last string of an ACCEPT record's payload: server/journal.c
    put_accept) old to new in every ACCEPT of the journal file, with the records' lengths and
    checks (FNV-1a 64 of the payload folded to 32 bits); returns how many it rewrote."""
    data, out, end, n = path.read_bytes(), b"", 0, 0
    for off, payload in JF.journal_records(data):
        end = off + 8 + struct.unpack_from("<I", data, off)[0]
        if JF.record_type(payload) == 1 and payload.endswith(journal_put_str(old)):
            payload = payload[:-len(journal_put_str(old))] + journal_put_str(new)
            n += 1
        h = 0xcbf29ce484222325
        for c in payload:
            h = ((h ^ c) * 0x100000001b3) & 0xffffffffffffffff
        out += struct.pack("<II", len(payload), (h ^ (h >> 32)) & 0xffffffff) + payload
    path.write_bytes(out + data[end:])
    return n


def group_owners(shardlm, model, work):
    """With API keys a request belongs to its key: another key's Cancel, or its reattaching call
    (resume token), finds nothing (NOT_FOUND), live or resumed; after a restart whose key file
    lists the keys in another order the owner still reattaches (the owner is the key's hash,
    not its line)."""
    keys = work / "owner-keys"
    keys.write_text("key-alpha\nkey-beta\n")
    journal = work / "journal-owners"
    A, B = [("authorization", "Bearer key-alpha")], [("authorization", "Bearer key-beta")]
    srv = server(shardlm, model, "--journal", str(journal), "--api-key-file", str(keys), name="owners")
    st = stub(srv)
    live = Reader("GenerateStream", gen_req("own-1", max_tokens=60, temperature=1.0, seed=21))
    call = live.call(st, A, stop_after=2)
    try:
        st.Cancel(pb.CancelRequest(request_id="own-1"), metadata=B, timeout=30)
        check(False, "another key's Cancel of a running request is NOT_FOUND")
    except grpc.RpcError as e:
        check(e.code() == grpc.StatusCode.NOT_FOUND, f"another key's Cancel of a running request: {e.code()}")
    live.rest(call)
    finals = [m.finish_reason for m in live.msgs if m.finish_reason]
    check(live.code == grpc.StatusCode.OK and finals and 4 not in finals,
          f"the owner's call runs to its end, not cancelled: {live.code} {live.details} {finals}")
    # Killed while own-2 runs: on a loaded machine stories260K can finish 450 tokens before the
    # second message is read, so the first message triggers the kill, and a call that was over
    # even so is tried again under a new id (at most three times).
    for attempt in range(3):
        rid = "own-2" if attempt == 0 else f"own-2-{attempt}"
        r = Reader("GenerateStream", gen_req(rid, max_tokens=450, temperature=1.0, seed=22))
        call = r.call(st, A, stop_after=1)
        if call is not None:
            break
    kill9(srv)
    r.rest(call)
    # The owners on disk: salted (owner.salt, 0600), never the unsalted hash anyone could test
    # guesses against; then the journal rewritten as a version before owner.salt wrote it.
    salt = journal / "owner.salt"
    mode = stat.S_IMODE(salt.stat().st_mode) if salt.exists() else None
    check(mode == 0o600 and re.fullmatch(r"[0-9a-f]{32}\n", salt.read_text()) is not None,
          f"the journal directory holds owner.salt, mode 0600, 32 hex digits (mode {mode and oct(mode)})")
    raw = (journal / "journal").read_bytes()
    legacy = {k: legacy_owner_of(k) for k in ("key-alpha", "key-beta")}
    check(owner_of("key-alpha", journal).encode() in raw and not any(o.encode() in raw for o in legacy.values()),
          "the journal holds the salted owner (PBKDF2 of the key and owner.salt), not the unsalted FNV one")
    n = journal_rewrite_owner(journal / "journal", owner_of("key-alpha", journal), legacy["key-alpha"])
    check(n >= 1, f"the journal's ACCEPT records rewritten with the legacy owner of key-alpha ({n})")
    keys.write_text("key-beta\nkey-alpha\n")  # the same keys, their lines swapped
    with server(shardlm, model, "--journal", str(journal), "--api-key-file", str(keys), name="owners-restart") as srv:
        st = stub(srv)
        other = Reader("GenerateStream", gen_req(rid, max_tokens=450, temperature=1.0, seed=22))
        other.call(st, B + [("shardlm-resume-token", rid)])
        check(other.code == grpc.StatusCode.NOT_FOUND and not other.msgs,
              f"another key's reattach to a resumed request: {other.code} {other.details[:120]}, {len(other.msgs)} messages")
        try:
            st.Cancel(pb.CancelRequest(request_id=rid), metadata=B, timeout=30)
            check(False, "another key's Cancel of a resumed request is NOT_FOUND")
        except grpc.RpcError as e:
            check(e.code() == grpc.StatusCode.NOT_FOUND, f"another key's Cancel of a resumed request: {e.code()}")
        n_before = len(r.msgs)
        r.call(st, A + [("shardlm-resume-token", rid), ("shardlm-resume-from", r.state(1))])
        check(r.code == grpc.StatusCode.OK and len(r.msgs) > n_before and r.msgs[-1].finish_reason,
              f"its owner reattaches after the restart (keys reordered, its journaled owner the legacy "
              f"one) and gets the rest: {r.code}")
        raw = (journal / "journal").read_bytes()
        check(legacy["key-alpha"].encode() not in raw and owner_of("key-alpha", journal).encode() in raw,
              "the journal compacted at the restart holds the upgraded owner, not the legacy one")


def group_drain(shardlm, model, work):
    method, mk = STREAMS[0]
    with server(shardlm, model, name="drain-ref") as srv:
        ref = Reader(method, mk())
        ref.call(stub(srv))
    journal = work / "journal-drain"
    srv = server(shardlm, model, "--journal", str(journal), "--drain-timeout", "0", name="drain", env=TS.slow_steps())
    r = Reader(method, mk())
    c = r.call(stub(srv), stop_after=3)
    srv.terminate()
    r.rest(c)
    code = srv.stop()
    check(code == 0 and r.code == grpc.StatusCode.UNAVAILABLE and "shardlm-resume-token" in r.details,
          f"the drain cut the journaled stream with UNAVAILABLE naming the token (exit {code}, {r.code} {r.details})")
    with server(shardlm, model, "--journal", str(journal), name="drain-restart") as srv:
        r.call(stub(srv), [("shardlm-resume-token", r.token), ("shardlm-resume-from", r.state(2))])
    got, want = r.assemble(), ref.assemble()
    check(r.code == grpc.StatusCode.OK and {k: (v["ids"], v["text"], v["finish"]) for k, v in got.items()}
          == {k: (v["ids"], v["text"], v["finish"]) for k, v in want.items()},
          f"after the restart the drained stream finishes with the uninterrupted answer ({r.code} {r.details})")


def journaled(journal, key):
    """Whether the ACCEPT of request key is in the journal directory (written before the engine
    sees the request, so a kill after it leaves the request to resume)."""
    return any(key.encode() in f.read_bytes() for f in journal.glob("*") if f.is_file())


def kill_twice(srv, shardlm, model, flags, name, progress, step, pending):
    """SIGKILLs srv twice, each time once progress() reached step more (and, the first time, once
    the unary call cu-1 is journaled), restarting it with the same flags (the same --listen: the
    clients' target); returns the last server, the restarts' logs and, for each kill, pending()
    then: which of the two calls (the stream, cu-1) their clients still lacked part of."""
    logs, cuts = [], []
    journal = Path(flags[flags.index("--journal") + 1])
    for restart in (1, 2):
        end = time.time() + 60
        while (progress() < step * restart or not journaled(journal, "cu-1")) and time.time() < end:
            time.sleep(0.002)
        # After a restart, the calls cut back before the next kill (the stream can reach its step
        # while the unary call still waits out its 100 ms between attempts).
        while logs and logs[-1].read_text().count("a gRPC client reattached") < sum(cuts[-1]) and time.time() < end:
            time.sleep(0.002)
        cuts.append(pending())
        kill9(srv)
        srv = server(shardlm, model, *flags, name=f"{name}-{restart}")
        logs.append(srv.log_path)
    return srv, logs, cuts


def check_reattached(logs, cuts, who):
    """After each restart every call cut mid-way (the stream, the unary cu-1) was resumed and
    reattached. The first kill cuts both by construction; at the second a loaded machine may have
    let the restarted server finish the stream before its client came back with the catch-up, and
    a call its client had whole needs no reattach."""
    check(all(cuts[0]), f"the first kill cut both calls mid-way ({cuts[0]})")
    for i, (path, cut) in enumerate(zip(logs, cuts)):
        log = path.read_text()
        n = log.count("a gRPC client reattached")
        check(n == sum(cut) and (not cut[1] or "req=cu-1 (gRPC Generate): resumed" in log),
              f"restart {i + 1}: the calls cut mid-way (stream, unary: {cut}) were reattached by {who} ({n} reattached)")


def group_client(shardlm, model, work, gguf=None):
    # A model slow enough here (SmolLM2-135M, about 30 tokens/s) that both kills land while the
    # answers are generated: stories260K finishes them before the client is back.
    if not gguf or not Path(gguf).exists():
        print(f"SKIP client: no GGUF at {gguf!r} (tools/fetch_smollm2.sh)")
        return
    model = gguf
    story = dict(max_tokens=120, temperature=1.0, top_p=0.95, seed=6, n=2)
    # The unary answer is the longer, so that it still runs at the second kill, which follows the
    # stream's progress (it once ended first on a loaded machine: its client came back late).
    unary_kw = dict(max_tokens=200, temperature=0.9, seed=10, n=2)
    with server(shardlm, model, "--journal", str(work / "journal-client-ref"), name="client-ref") as srv:
        with srv.client() as c:
            want = [(ch.index, ch.text, ch.token_ids) for ch in c.generate_stream(STORY, **story)]
            want_unary = c.generate(STORY, **unary_kw)
    port = TS.free_port()
    journal = work / "journal-client"
    flags = ("--journal", str(journal), "--listen", f"127.0.0.1:{port}")
    srv = server(shardlm, model, *flags, name="client-0")
    got, unary, errors = [], {}, []
    client = Client(f"127.0.0.1:{port}", resume_for=60)

    def consume():
        try:
            for ch in client.generate_stream(STORY, **story):
                got.append((ch.index, ch.text, ch.token_ids))
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    def fetch():
        try:
            unary["answer"] = client.generate(STORY, request_id="cu-1", **unary_kw)
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=consume), threading.Thread(target=fetch)]
    for t in threads:
        t.start()
    want_ids = sum(len(ids) for _, _, ids in want)
    srv, logs, cuts = kill_twice(srv, shardlm, model, flags, "client", lambda: len(got), 6,
                                 lambda: [sum(len(ids) for _, _, ids in list(got)) < want_ids, "answer" not in unary])
    for t in threads:
        t.join(timeout=120)
    srv.stop()
    check_reattached(logs, cuts, "the client")
    client.close()

    def per_sample(chunks):
        out = {}
        for i, text, ids in chunks:
            o = out.setdefault(i, ["", []])
            o[0] += text
            o[1] += ids
        return out

    check(not errors, f"Client.generate_stream and generate went on by themselves across two SIGKILLs ({errors})")
    check(per_sample(got) == per_sample(want), "the stream's chunks equal the uninterrupted answer's, once each")
    a = unary.get("answer")
    check(a is not None and [(x.index, x.text, x.token_ids) for x in a.completions]
          == [(x.index, x.text, x.token_ids) for x in want_unary.completions],
          "Client.generate returns the uninterrupted unary answer")


def group_cclient(shardlm, model, work, gguf=None):
    """The C client (clients/, through `shardlm complete`) reattaches by itself as Client does:
    a streamed and a unary completion across two SIGKILLs print what an uninterrupted server's
    do, byte for byte."""
    if not gguf or not Path(gguf).exists():
        print(f"SKIP cclient: no GGUF at {gguf!r} (tools/fetch_smollm2.sh)")
        return
    model = gguf
    sampling = ["--temperature", "1.0", "--top-p", "0.95", "--seed", "6"]

    def complete(port, *extra):
        return subprocess.Popen([shardlm, "complete", "--server", f"127.0.0.1:{port}", "--prompt", STORY, *sampling,
                                 *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    # The unary completion is the longer, so that it still runs at the second kill, which follows
    # the stream's progress (it once ended first on a loaded machine: its client came back late).
    stream, unary = ["--stream", "--max-tokens", "120"], ["--max-tokens", "240"]

    port = TS.free_port()
    with server(shardlm, model, "--journal", str(work / "journal-cclient-ref"), "--listen", f"127.0.0.1:{port}",
                name="cclient-ref"):
        want = [p.communicate(timeout=300)[0] for p in (complete(port, *stream), complete(port, *unary, "--request-id", "cr-1"))]
    port = TS.free_port()
    flags = ("--journal", str(work / "journal-cclient"), "--listen", f"127.0.0.1:{port}")
    srv = server(shardlm, model, *flags, name="cclient-0")
    procs = [complete(port, *stream), complete(port, *unary, "--request-id", "cu-1")]
    out = [bytearray(), bytearray()]

    def read(i):
        while chunk := os.read(procs[i].stdout.fileno(), 4096):
            out[i] += chunk

    readers = [threading.Thread(target=read, args=(i,)) for i in range(2)]
    for t in readers:
        t.start()
    srv, logs, cuts = kill_twice(srv, shardlm, model, flags, "cclient", lambda: len(out[0]) - len(STORY), 12,
                                 lambda: [len(out[i]) < len(want[i]) for i in range(2)])
    rcs = [p.wait(timeout=300) for p in procs]
    for t in readers:
        t.join(timeout=60)
    srv.stop()
    check_reattached(logs, cuts, "the C client")
    errs = [p.stderr.read().decode(errors="replace")[-300:] for p in procs]
    check(rcs == [0, 0], f"shardlm complete (streamed and unary) went on by itself across two SIGKILLs: {rcs} {errs}")
    for i, what in enumerate(("streamed", "unary")):
        same = bytes(out[i]) == want[i]
        check(same, f"the {what} completion equals the uninterrupted one ({len(out[i])} bytes)"
              + ("" if same else f": {bytes(out[i])!r} vs {want[i]!r}"))


def went(st, method, rid, seed, k, max_tokens=400, **more):
    """A stream of request rid whose client reads k messages and goes (cancels its call)."""
    r = Reader(method, gen_req(rid, max_tokens=max_tokens, temperature=1.0, seed=seed, **more))
    c = r.call(st, stop_after=k)
    c.cancel()
    r.rest(c)
    return r


def reattach_code(st, method, rid):
    """The status of a call that reattaches to rid from the start."""
    again = Reader(method, pb.GenerateRequest())
    again.call(st, [("shardlm-resume-token", rid)])
    return again.code


def group_detach(shardlm, model, work, gguf=None):
    """--journal-detach-grace on gRPC (default 30 s): a first run whose client goes away (its call
    cancelled, or its connection cut) runs on, and the client reattaches by its token, the server
    up, getting the uninterrupted answer; after the grace it is forgotten (and cancelled when it
    still ran: SmolLM2's GGUF, slow enough); with 0 a client that goes away cancels its request."""
    method, mk = STREAMS[0]
    with server(shardlm, model, "--journal", str(work / "journal-detach"), name="detach") as srv:
        st = stub(srv)
        ref = Reader(method, mk())
        ref.call(st)
        ref_unary = unary_view(st.Generate(UNARY("ud-ref"), timeout=60))
        r = Reader(method, mk())
        c = r.call(st, stop_after=3)
        c.cancel()
        r.rest(c)
        check(r.code == grpc.StatusCode.CANCELLED and len(r.msgs) == 3 and r.token,
              f"the first call went after 3 messages ({r.code}, {len(r.msgs)})")
        r.call(st, [("shardlm-resume-token", r.token), ("shardlm-resume-from", r.state(2))])
        got = {k: (v["ids"], v["text"], v["finish"], v["finals"]) for k, v in r.assemble().items()}
        want = {k: (v["ids"], v["text"], v["finish"], v["finals"]) for k, v in ref.assemble().items()}
        check(r.code == grpc.StatusCode.OK and got == want,
              f"its client reattached, the server up, and has the uninterrupted answer, each message once ({r.code})")
        fut = st.Generate.future(UNARY("ud-1"), timeout=60)
        # Accepted once its headers (the resume token) came, after the ACCEPT's sync: a client gone
        # during the sync runs on too (group sync), but a reattach before the sync ends would find
        # it still held by the call that went.
        check(dict(fut.initial_metadata() or ()).get("shardlm-resume-token") == "ud-1" and
              journaled(work / "journal-detach", "ud-1"), "the unary call's headers name its token")
        fut.cancel()
        try:
            ans = st.Generate(pb.GenerateRequest(), metadata=[("shardlm-resume-token", "ud-1")], timeout=60)
            check(unary_view(ans) == ref_unary, "a unary call that went is fetched whole by its token")
        except grpc.RpcError as e:
            check(False, f"a unary call that went, fetched by its token: {e.code()} {e.details()}")
        # A cut connection, through a proxy: shardlm_client.Client reattaches by itself.
        proxy = Proxy(int(srv.target.rsplit(":", 1)[1]))
        client = Client(proxy.target, resume_for=30)
        chunks = []
        for ch in client.generate_stream(STORY, max_tokens=400, temperature=1.0, top_p=0.95, seed=6, n=2):
            chunks.append((ch.index, ch.text, ch.token_ids))
            if len(chunks) == 3:
                proxy.cut()
        # Stream.cancel() of a journaled call cancels its request by its token too (the server
        # would keep a call that merely went for the grace).
        s = client.generate_stream(STORY, max_tokens=400, temperature=1.0, seed=7)
        rid = next(iter(s)).request_id
        s.cancel()
        # (The Cancel by token reached the server: "req=ID cancelled by Cancel", or, when the
        # 400 tokens were all written before it, "req=ID ... had already finished ... by Cancel".)
        by_cancel = re.compile(rf"req={re.escape(rid)}\b[^\n]* by Cancel")
        end = time.time() + 10
        while not by_cancel.search(srv.log_path.read_text()) and time.time() < end:
            time.sleep(0.05)
        check(by_cancel.search(srv.log_path.read_text()),
              "Client's Stream.cancel() of a journaled call cancels the request by its token")
        client.close()
        proxy.close()
        per = {}
        for i, text, ids in chunks:
            o = per.setdefault(i, ["", []])
            o[0] += text
            o[1] += ids
        check(per == {k: [v["text"], v["ids"]] for k, v in ref.assemble().items()},
              "Client across a cut connection (the server up) gives the uninterrupted answer, each chunk once")
        log = srv.log_path.read_text()
        check("its client went away" in log and log.count("a gRPC client reattached") == 3,
              "the log names the detached calls and the reattachments")
    with server(shardlm, model, "--journal", str(work / "journal-detach-1"), "--journal-detach-grace", "1",
                name="detach-grace") as srv:
        st = stub(srv)
        went(st, method, "dg-1", 31, 2)
        time.sleep(2.0)
        code = reattach_code(st, method, "dg-1")
        check(code == grpc.StatusCode.NOT_FOUND, f"after the grace the request is forgotten: {code}")
        check("did not come back within 1 s" in srv.log_path.read_text(), "the log says the grace passed")
        fresh = Reader(method, gen_req("dg-1", max_tokens=8))
        fresh.call(st)
        check(fresh.code == grpc.StatusCode.OK, f"its id is free again: {fresh.code} {fresh.details}")
    with server(shardlm, model, "--journal", str(work / "journal-detach-0"), "--journal-detach-grace", "0",
                name="detach-0") as srv:
        st = stub(srv)
        went(st, method, "d0-1", 32, 2)
        time.sleep(0.2)
        code = reattach_code(st, method, "d0-1")
        check(code == grpc.StatusCode.NOT_FOUND, f"with grace 0 a client that goes away ends it: {code}")
    if not gguf or not Path(gguf).exists():
        print(f"SKIP detach (cancel at the grace's end): no GGUF at {gguf!r} (tools/fetch_smollm2.sh)")
        return
    # --journal-detach-max counts the requests still running: SmolLM2's first (400 tokens) still runs
    # when the second (40) goes.
    with server(shardlm, gguf, "--journal", str(work / "journal-detach-max"), "--journal-detach-max", "1",
                name="detach-max") as srv:
        st = stub(srv)
        kept = went(st, method, "dm-41", 41, 1)
        gone = went(st, method, "dm-42", 42, 1, max_tokens=40)
        end = time.time() + 30  # the server has seen the second go
        while "req=dm-42: its client went away" not in srv.log_path.read_text() and time.time() < end:
            time.sleep(0.05)
        kept.call(st, [("shardlm-resume-token", "dm-41"), ("shardlm-resume-from", kept.state(1))])
        gone.call(st, [("shardlm-resume-token", "dm-42"), ("shardlm-resume-from", gone.state(1))])
        check(kept.code == grpc.StatusCode.OK and gone.code == grpc.StatusCode.NOT_FOUND and
              "--journal-detach-max (1)" in srv.log_path.read_text(),
              f"--journal-detach-max 1: the first call that went is kept ({kept.code}), the second's request ended "
              f"({gone.code}), the log says why")
    journal = work / "journal-detach-slow"
    # Its 400 tokens take 2 s at least on any CPU (each step slowed by 5 ms), whatever it samples.
    with server(shardlm, gguf, "--journal", str(journal), "--journal-detach-grace", "1", name="detach-slow",
                env={**os.environ, "SHARDLM_TEST_STEP_DELAY_MS": "5"}) as srv:
        st = stub(srv)
        went(st, method, "ds-1", 33, 2, ignore_eos=True)
        time.sleep(1.6)
        log = srv.log_path.read_text()
        check("req=ds-1: its client did not come back within 1 s (--journal-detach-grace): cancelled" in log,
              "a request still running when the grace ends is cancelled")
        fresh, end = Reader(method, gen_req("ds-1", max_tokens=4)), time.time() + 10
        while time.time() < end:  # ALREADY_EXISTS until the cancelled one's END is queued
            fresh.call(st)
            if fresh.code != grpc.StatusCode.ALREADY_EXISTS:
                break
            time.sleep(0.05)
        check(fresh.code == grpc.StatusCode.OK, f"then its id is free for a new request: {fresh.code} {fresh.details}")
    with server(shardlm, gguf, "--journal", str(journal), name="detach-slow-restart") as srv:
        log = srv.log_path.read_text()
        check("0 open request(s)" in log and "accepted again" not in log,
              "the journal reopens with nothing open: the cancelled request's END came before its id was taken again")


def group_sync(shardlm, model, work):
    """The ACCEPT's fdatasync runs on the loader's journal thread, not the gRPC loop: with each sync
    slowed by 2 s (SHARDLM_TEST_SYNC_DELAY_S), a running stream's messages keep coming and a
    GetModelInfo and a health check are answered while another Generate's ACCEPT syncs; that
    Generate then gives a server without a journal's tokens; one whose client gives up during its
    sync (its deadline) never reaches the engine; one whose client cancels during its sync runs on
    (--journal-detach-grace) and is fetched by its token, unless a Cancel of its id came (then it
    never reaches the engine); its id is in use meanwhile (a second Generate naming it: ALREADY_EXISTS);
    the journal reopens with nothing open."""
    delay = 2.0
    with server(shardlm, model, name="sync-plain") as srv:
        want = stub(srv).Generate(gen_req(max_tokens=8, temperature=0), timeout=30).token_ids
    journal = work / "journal-sync"
    env = {**os.environ, "SHARDLM_TEST_SYNC_DELAY_S": str(delay), "SHARDLM_TEST_STEP_DELAY_MS": "10"}
    with server(shardlm, model, "--journal", str(journal), name="sync", env=env) as srv, srv.client(timeout=30) as c:
        st = stub(srv)
        arrivals = []
        running = st.GenerateStream(gen_req("sync-a", max_tokens=400, ignore_eos=True, temperature=0))
        t0 = time.time()
        first = next(running)  # after its own ACCEPT's sync
        check(time.time() - t0 >= delay - 0.1 and first.token_ids, f"the first stream waits for its sync ({time.time() - t0:.2f} s)")
        reader = threading.Thread(target=lambda: [arrivals.append(time.time()) for _ in running])
        reader.start()
        got = {}
        gen = threading.Thread(target=lambda: got.update(b=(st.Generate(gen_req("sync-b", max_tokens=8, temperature=0),
                                                                       timeout=30).token_ids, time.time())))
        t1 = time.time()
        gen.start()
        time.sleep(0.3)
        t2 = time.time()
        c.model_info()
        TS.health_check(srv.target)
        answered = time.time() - t2
        gen.join(timeout=30)
        during = [t for t in arrivals if t1 + 0.2 < t < t1 + delay - 0.2]
        gaps = [b - a for a, b in zip(during, during[1:])]
        check(answered < delay - 0.8, f"GetModelInfo and a health check during another call's sync: {answered:.2f} s")
        check(len(during) >= 5 and max(gaps) < 0.5,
              f"a running stream's messages during another call's sync: {len(during)}, largest gap "
              f"{max(gaps or [0]):.2f} s")
        check(got.get("b", (None,))[0] == want and got["b"][1] - t1 >= delay - 0.1,
              f"the Generate after its sync: a plain server's tokens ({got.get('b')}, want {want})")
        before = c.server_stats().requests_submitted
        try:
            st.Generate(gen_req("sync-c", max_tokens=8), timeout=0.5)
            check(False, "a Generate whose client gave up during its sync: succeeded")
        except grpc.RpcError as e:
            check(e.code() == grpc.StatusCode.DEADLINE_EXCEEDED, f"a Generate whose client gave up: {e.code()}")
        time.sleep(delay)  # its sync ends; nothing is submitted
        check(c.server_stats().requests_submitted == before, "the Generate that gave up never reached the engine")
        # A client that goes away during its sync (a cancel, not its deadline): its request is on
        # disk, so with --journal-detach-grace (30 s by default) it runs on, and its client
        # reattaches by its token (the token is its request_id; the headers that name it never came).
        # sync-e's sync waits behind sync-d's: its client goes before it starts (the loader runs it anyway).
        futs = [st.Generate.future(gen_req(k, max_tokens=8, temperature=0), timeout=30) for k in ("sync-d", "sync-e")]
        end = time.time() + 10
        while not (journaled(journal, "sync-d") and journaled(journal, "sync-e")) and time.time() < end:
            time.sleep(0.02)
        for f in futs:
            f.cancel()
        time.sleep(2 * delay + 0.5)  # their syncs end; they reach the engine without their clients
        check(c.server_stats().requests_submitted == before + 2,
              "Generates whose clients went away during or before their syncs reached the engine")
        for k in ("sync-d", "sync-e"):
            try:
                ans = st.Generate(pb.GenerateRequest(), metadata=[("shardlm-resume-token", k)], timeout=30)
                check(list(ans.token_ids) == list(want), f"{k}'s client reattached: a plain server's tokens")
            except grpc.RpcError as e:
                check(False, f"{k}, whose client went away during its sync, fetched by its token: {e.code()} {e.details()}")
        # A Cancel of its id during its sync: the call ends CANCELLED and never reaches the engine
        # (the Cancel found nothing in the engine yet; before, the request ran on once synced).
        fut = st.Generate.future(gen_req("sync-f", max_tokens=8, temperature=0), timeout=30)
        end = time.time() + 10
        while not journaled(journal, "sync-f") and time.time() < end:
            time.sleep(0.02)
        # Its id is in use during its sync: a second Generate naming it is refused before its own ACCEPT.
        try:
            st.Generate(gen_req("sync-f", max_tokens=8, temperature=0), timeout=30)
            check(False, "a second Generate with the id of one in its sync: succeeded")
        except grpc.RpcError as e:
            check(e.code() == grpc.StatusCode.ALREADY_EXISTS,
                  f"a second Generate with the id of one in its sync: {e.code()} {e.details()}")
        st.Cancel(pb.CancelRequest(request_id="sync-f"), timeout=30)
        try:
            fut.result()
            check(False, "a Generate cancelled by Cancel during its sync: succeeded")
        except grpc.RpcError as e:
            check(e.code() == grpc.StatusCode.CANCELLED and "Cancel" in (e.details() or ""),
                  f"a Generate cancelled by Cancel during its sync: {e.code()} {e.details()}")
        check(c.server_stats().requests_submitted == before + 2, "the Generate cancelled by Cancel never reached the engine")
        # Its client gone first (as shardlm_client's Stream.cancel() may do), then a Cancel of its id:
        # cancelled, so it does not run on for a reattach.
        fut = st.Generate.future(gen_req("sync-g", max_tokens=8, temperature=0), timeout=30)
        end = time.time() + 10
        while not journaled(journal, "sync-g") and time.time() < end:
            time.sleep(0.02)
        fut.cancel()
        check(st.Cancel(pb.CancelRequest(request_id="sync-g"), timeout=30).cancelled,
              "Cancel of a Generate whose client went during its sync says cancelled")
        time.sleep(delay + 0.5)
        check(c.server_stats().requests_submitted == before + 2, "a Generate gone then cancelled never reached the engine")
        reader.join(timeout=60)
    with server(shardlm, model, "--journal", str(journal), name="sync-restart") as srv:
        log = srv.log_path.read_text()
        check("0 open request(s)" in log, "the journal reopens with nothing open (the call that gave up has its END)")


GROUPS = {"restart": group_restart, "live": group_live, "deadline": group_deadline, "cancel": group_cancel,
          "owners": group_owners,
          "drain": group_drain, "client": group_client, "cclient": group_cclient, "detach": group_detach,
          "sync": group_sync}


def main():
    def run(g, shardlm, model, work, a):
        if g in ("client", "cclient", "detach"):
            GROUPS[g](shardlm, model, work, a.gguf)
        else:
            GROUPS[g](shardlm, model, work)
    return SM.stories_groups_main("shardlm-journal-grpc-", GROUPS, check, run,
                                  [("--gguf", "SmolLM2-135M-Instruct.Q4_1.gguf (group client)")])


if __name__ == "__main__":
    sys.exit(main())
