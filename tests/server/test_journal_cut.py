#!/usr/bin/env python3
"""Calls cut before the server named their resume token (issue 33, docs/reliability.md): a
journaling server (`serve --journal`, stories260K under --batch-invariant) is SIGKILLed at a
chosen point of a gRPC call, held there by a test pause (SHARDLM_TEST_PAUSE_BEFORE_*_S, logged),
and restarted on the same port without it. Both clients, shardlm_client.Client (generate,
generate_stream) and the C client (`shardlm complete`, unary and --stream), with the request's
own request_id:
  headers  killed after the call's ACCEPT was journaled, before its headers (which carry the
           token) went out: the client reattaches by the request's own id and gets the
           uninterrupted answer; the restarted server's log shows the reattach
  accept   killed before the ACCEPT: the reattach by that id finds nothing (NOT_FOUND), the
           client sends the request again as new and gets the uninterrupted answer
  no server  a call with a request_id to a port where nothing listens fails at once (no guess)
  no id    a call without a request_id cut before its headers fails UNAVAILABLE (its client
           cannot name it; the server resumes it and keeps its answer for --journal-retain)
Before this, every such call failed UNAVAILABLE though the server resumed it (a flaky
server_journal_grpc: a SIGKILL between a unary call's ACCEPT and its headers).

  test_journal_cut.py --shardlm BUILD/cli/shardlm
"""
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.dont_write_bytecode = True
sys.path.insert(0, str(Path(__file__).resolve().parent))
import test_server as TS  # noqa: E402  (SKIPs by itself without grpcio or the client)
import stories_main as SM  # noqa: E402
from checks import Checks  # noqa: E402

grpc, Client = TS.grpc, TS.Client
check = Checks()
FLAGS = ("--batch-invariant", "--max-seqs", "16")
PROMPT = "Once upon a time, there was a little girl named Lily. She"
SAMPLING = dict(max_tokens=60, temperature=1.0, top_p=0.9, seed=11)
PAUSE = "30"


def start(shardlm, model, journal, port, name, pause=None):
    env = None
    if pause:
        import os
        env = dict(os.environ, **{pause: PAUSE})
    return TS.Server(shardlm, model, *FLAGS, "--journal", str(journal), "--listen", f"127.0.0.1:{port}",
                     name=name, env=env)


def wait_log(srv, words, timeout=30.0):
    end = time.time() + timeout
    while time.time() < end:
        if words in srv.log_path.read_text():
            return True
        time.sleep(0.01)
    return False


def kill9(srv):
    srv.proc.kill()
    srv.proc.wait(timeout=20)
    srv.log.close()


def c_complete(shardlm, port, rid, stream):
    args = [shardlm, "complete", "--server", f"127.0.0.1:{port}", "--prompt", PROMPT, "--max-tokens",
            str(SAMPLING["max_tokens"]), "--temperature", "1.0", "--top-p", "0.9", "--seed", str(SAMPLING["seed"])]
    if rid:
        args += ["--request-id", rid]
    if stream:
        args += ["--stream"]
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


# The four callers of one request: (name, start(port, rid) -> handle, finish(handle) -> answer).
def py_unary(port, rid):
    box = {}

    def run():
        with Client(f"127.0.0.1:{port}", resume_for=30) as c:
            try:
                box["a"] = c.generate(PROMPT, request_id=rid, **SAMPLING).text
            except grpc.RpcError as e:
                box["e"] = e
    t = threading.Thread(target=run)
    t.start()
    return t, box


def py_stream(port, rid):
    box = {}

    def run():
        with Client(f"127.0.0.1:{port}", resume_for=30) as c:
            try:
                box["a"] = "".join(ch.text for ch in c.generate_stream(PROMPT, request_id=rid, **SAMPLING))
            except grpc.RpcError as e:
                box["e"] = e
    t = threading.Thread(target=run)
    t.start()
    return t, box


def py_finish(h):
    t, box = h
    t.join(timeout=90)
    if "e" in box:
        return f"error {box['e'].code().name}: {box['e'].details()}"
    return box.get("a", "no answer")


def c_finish(p):
    out, err = p.communicate(timeout=90)
    return out.decode(errors="replace") if p.returncode == 0 else f"exit {p.returncode}: {err.decode()[-200:]}"


def callers(shardlm):
    return [("Client.generate", py_unary, py_finish),
            ("Client.generate_stream", py_stream, py_finish),
            ("shardlm complete", lambda port, rid: c_complete(shardlm, port, rid, False), c_finish),
            ("shardlm complete --stream", lambda port, rid: c_complete(shardlm, port, rid, True), c_finish)]


def body(shardlm, model, work):
    port = TS.free_port()
    with start(shardlm, model, work / "journal-ref", port, "cut-ref"):
        want = {name: fin(go(port, f"ref-{k}")) for k, (name, go, fin) in enumerate(callers(shardlm))}
    check(all(not w.startswith(("error", "exit", "no answer")) for w in want.values()), f"reference answers: {want}")
    for point, pause in (("headers", "SHARDLM_TEST_PAUSE_BEFORE_HEADERS_S"), ("accept", "SHARDLM_TEST_PAUSE_BEFORE_ACCEPT_S")):
        for k, (name, go, fin) in enumerate(callers(shardlm)):
            port, journal, rid = TS.free_port(), work / f"journal-{point}-{k}", f"cut-{point}-{k}"
            srv = start(shardlm, model, journal, port, f"cut-{point}-{k}", pause)
            h = go(port, rid)
            paused = wait_log(srv, f"req={rid}: {pause}")
            kill9(srv)
            with start(shardlm, model, journal, port, f"cut-{point}-{k}-restart") as srv2:
                got = fin(h)
                log = srv2.log_path.read_text()
            same = got == want[name]
            check(paused and same, f"{point}: {name} cut {'after the ACCEPT, before its headers' if point == 'headers' else 'before its ACCEPT'} "
                  f"gives the uninterrupted answer" + ("" if same else f": {got!r} vs {want[name]!r}"))
            if point == "headers":
                check("a gRPC client reattached" in log, f"{point}: {name} reattached by its own request_id")
            else:
                check("a gRPC client reattached" not in log and "0 open request(s)" in log,
                      f"{point}: {name} was not journaled, and went again as new")
    # A call that never reached a server (nothing listens) is not guessed at: its error at once.
    port = TS.free_port()
    t0 = time.time()
    got = py_finish(py_unary(port, "never-1"))
    p = c_complete(shardlm, port, "never-2", False)
    out = c_finish(p)
    took = time.time() - t0
    check(got.startswith("error UNAVAILABLE") and out.startswith("exit 1") and took < 10,
          f"no server: Client and shardlm complete with a request_id fail at once ({took:.1f} s): {got[:60]} / {out[:60]}")
    # Without a request_id the client cannot name the call: UNAVAILABLE, at once.
    port, journal = TS.free_port(), work / "journal-noid"
    srv = start(shardlm, model, journal, port, "cut-noid", "SHARDLM_TEST_PAUSE_BEFORE_HEADERS_S")
    h = py_unary(port, "")
    paused = wait_log(srv, ": SHARDLM_TEST_PAUSE_BEFORE_HEADERS_S")
    kill9(srv)
    got = py_finish(h)
    check(paused and got.startswith("error UNAVAILABLE"), f"no id: a call without a request_id cut before its headers: {got[:120]}")


def main():
    return SM.stories_groups_main("shardlm-journal-cut-", {"cut": None}, check,
                                  lambda g, shardlm, model, work, a: body(shardlm, model, work))


if __name__ == "__main__":
    sys.exit(main())
