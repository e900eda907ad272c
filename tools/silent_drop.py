#!/usr/bin/env python3
"""tools/silent_drop.py - a client whose network vanishes without a FIN or a reset (a host or a
NAT gone), against a journaled server (docs/reliability.md, defect 20): two network namespaces
joined by a veth pair, the server in one, a streaming client in the other; after a few messages
the client's end of the link goes down, so that nothing it sends or receives gets through and
the server hears nothing. Measured: how long the server takes to see the client gone (gRPC:
keepalive pings every 20 s, 10 s to answer; HTTP: TCP_USER_TIMEOUT 60 s of unacknowledged
data), then the link comes back and the client reattaches by its token / Last-Event-ID and must
get the rest of the answer (token counts per sample complete, each message once).

  python3 tools/silent_drop.py --shardlm build/cli/shardlm --model .cache/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf [--http]

Needs root (ip netns). Minutes, not a test: a run is recorded in docs/reliability.md."""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NS_S, NS_C, ADDR_S, ADDR_C = "sdrop-s", "sdrop-c", "10.79.0.1", "10.79.0.2"

CLIENT = r'''
import json, sys, time
sys.path.insert(0, sys.argv[1])
mode, target, state = sys.argv[2], sys.argv[3], sys.argv[4]
def save(d):
    open(state + ".tmp", "w").write(json.dumps(d)); __import__("os").replace(state + ".tmp", state)
if mode == "grpc":
    import grpc
    from shardlm_client import pb, pb_grpc as pbg, sampling_params
    st = pbg.TextGenerationStub(grpc.insecure_channel(target))
    req = pb.GenerateRequest(prompt="Once upon a time", sampling=sampling_params(max_tokens=400, temperature=1.0, seed=5, ignore_eos=True))
    resume = json.loads(sys.argv[5]) if len(sys.argv) > 5 else None
    md = [("shardlm-resume-token", resume["token"]), ("shardlm-resume-from", str(resume["tokens"]))] if resume else []
    call = st.GenerateStream(pb.GenerateRequest() if resume else req, metadata=md, timeout=300)
    token = resume["token"] if resume else dict(call.initial_metadata()).get("shardlm-resume-token")
    n, msgs, final = (resume["tokens"] if resume else 0), 0, False
    try:
        for m in call:
            n += len(m.token_ids); msgs += 1; final |= m.finish_reason != 0
            save(dict(token=token, tokens=n, msgs=msgs, final=final))
        save(dict(token=token, tokens=n, msgs=msgs, final=final, code="OK"))
    except grpc.RpcError as e:
        save(dict(token=token, tokens=n, msgs=msgs, final=final, code=str(e.code())))
else:
    import http.client
    host, port = target.split(":")
    body = dict(prompt="Once upon a time", max_tokens=400, temperature=1.0, seed=5, ignore_eos=True, stream=True)
    resume = json.loads(sys.argv[5]) if len(sys.argv) > 5 else None
    h = {"Content-Type": "application/json"}
    if resume: h["Last-Event-ID"] = resume["last_id"]
    c = http.client.HTTPConnection(host, int(port), timeout=300)
    c.request("POST", "/v1/completions", json.dumps(body), h)
    r = c.getresponse()
    n, msgs, last_id, done = (resume["tokens"] if resume else 0), 0, (resume or {}).get("last_id"), False
    code = r.status
    try:
        while True:
            line = r.readline()
            if not line: break
            line = line.decode().rstrip("\n")
            if line.startswith("id: "): last_id = line[4:]
            elif line == "data: [DONE]": done = True; break
            elif line.startswith("data: "):
                msgs += 1
                save(dict(last_id=last_id, tokens=n, msgs=msgs, code=code))
    except OSError as e:
        code = str(e)
    save(dict(last_id=last_id, tokens=n, msgs=msgs, code=code, done=done))
'''


def sh(*cmd, check=True):
    return subprocess.run(cmd, check=check, capture_output=True, text=True)


def setup():
    teardown()
    sh("ip", "netns", "add", NS_S)
    sh("ip", "netns", "add", NS_C)
    sh("ip", "link", "add", "sdrop0", "type", "veth", "peer", "name", "sdrop1")
    sh("ip", "link", "set", "sdrop0", "netns", NS_S)
    sh("ip", "link", "set", "sdrop1", "netns", NS_C)
    for ns, dev, addr in ((NS_S, "sdrop0", ADDR_S), (NS_C, "sdrop1", ADDR_C)):
        sh("ip", "-n", ns, "link", "set", "lo", "up")
        sh("ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", dev)
        sh("ip", "-n", ns, "link", "set", dev, "up")


def teardown():
    for ns in (NS_S, NS_C):
        pids = sh("ip", "netns", "pids", ns, check=False).stdout.split()
        for p in pids:
            subprocess.run(["kill", "-9", p], capture_output=True)
        sh("ip", "netns", "del", ns, check=False)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shardlm", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--http", action="store_true")
    a = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("silent_drop: needs root (ip netns)")
    work = Path(tempfile.mkdtemp(prefix="shardlm-silent-drop-"))
    site = os.environ.get("SHARDLM_PY_CLIENT", str(ROOT / "clients/python"))
    (work / "client.py").write_text(CLIENT)
    setup()
    try:
        log = open(work / "server.log", "w")
        srv = subprocess.Popen(["ip", "netns", "exec", NS_S, a.shardlm, "serve", "--model", a.model, "--journal",
                                str(work / "journal"), "--listen", f"{ADDR_S}:50051", "--http", f"{ADDR_S}:8000"],
                               stdout=log, stderr=subprocess.STDOUT)
        end = time.time() + 120
        while "ready" not in (work / "server.log").read_text() and time.time() < end:
            time.sleep(0.2)
        mode, target = ("http", f"{ADDR_S}:8000") if a.http else ("grpc", f"{ADDR_S}:50051")
        state = work / "state.json"
        cli = subprocess.Popen(["ip", "netns", "exec", NS_C, sys.executable, str(work / "client.py"), site, mode, target,
                                str(state)], stdout=subprocess.DEVNULL, stderr=open(work / "client.err", "w"))
        while (not state.exists() or json.loads(state.read_text()).get("msgs", 0) < 3) and time.time() < end:
            time.sleep(0.05)
        before = json.loads(state.read_text())
        sh("ip", "-n", NS_C, "link", "set", "sdrop1", "down")
        cli.kill()  # (its kernel state stays: the server hears nothing, as from a host gone)
        t0 = time.time()
        print(f"{mode}: link down after {before['msgs']} messages", flush=True)
        seen = None
        while time.time() - t0 < 180:
            text = (work / "server.log").read_text()
            if "its client went away" in text or "client went away" in text:
                seen = time.time() - t0
                break
            time.sleep(0.2)
        print(f"{mode}: the server saw the client gone after {seen:.1f} s" if seen is not None
              else f"{mode}: the server did not see the client gone within 180 s", flush=True)
        sh("ip", "-n", NS_C, "link", "set", "sdrop1", "up")
        time.sleep(1.0)
        state2 = work / "state2.json"
        r = subprocess.run(["ip", "netns", "exec", NS_C, sys.executable, str(work / "client.py"), site, mode, target,
                            str(state2), json.dumps(before)], capture_output=True, text=True, timeout=300)
        after = json.loads(state2.read_text()) if state2.exists() else {}
        print(f"{mode}: reattached: {after} {r.stderr[-300:]}", flush=True)
        srv.terminate()
        srv.wait(timeout=60)
        ok = seen is not None and (after.get("code") == "OK" and after.get("tokens") == 400 and after.get("final")
                                   if mode == "grpc" else after.get("done") and after.get("code") == 200)
        print("PASS" if ok else "FAIL")
        return 0 if ok else 1
    finally:
        teardown()


if __name__ == "__main__":
    sys.exit(main())
