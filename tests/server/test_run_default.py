#!/usr/bin/env python3
"""`make run`'s script (tools/run_default.sh) serves with prompt lookup speculation on, and
SPECULATIVE=off serves without it: the same greedy text either way, drafts verified (GetServerStats)
with it and none without; a bad SPECULATIVE value is a usage error (exit 2) naming the variable.
Run on stories260K (MODEL=stories260K, from the shared assets: no download), on free ports.

  test_run_default.py --build BUILD/cli [--assets ASSETS (default $SHARDLM_ASSETS, else ../shared/assets)]
SKIP (77) without the assets or the Python client.
"""
import argparse
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

SKIP = 77
sys.dont_write_bytecode = True
HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
import test_server as TS  # noqa: E402
from checks import Checks  # noqa: E402

check = Checks()
PROMPT = "Once upon a time, Lily and Ben went to the park. Lily and Ben"


def serve(a, speculative):
    """Runs the script until it says ready; returns (process, gRPC port, its stdout lines so far)."""
    env = dict(os.environ, MODEL="stories260K", LISTEN="127.0.0.1:0", HTTP="127.0.0.1:0", SHARDLM_LOG="info")
    if speculative is not None:
        env["SPECULATIVE"] = speculative
    log = open(TS.LOG_DIR / f"run_default-{speculative}.log", "w")
    proc = subprocess.Popen(["bash", "tools/run_default.sh", a.build, a.assets], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=log, text=True, start_new_session=True)
    TS.SERVERS.append(proc)
    lines, seen = queue.Queue(), []
    threading.Thread(target=lambda: [lines.put(x.strip()) for x in proc.stdout], daemon=True).start()
    port, deadline = None, time.time() + 120  # (the first run converts stories260K)
    while time.time() < deadline:
        try:
            line = lines.get(timeout=0.2)
        except queue.Empty:
            if proc.poll() is not None:
                break
            continue
        seen.append(line)
        if line.startswith("shardlm: listening on"):
            port = int(line.split(":")[-1].split()[0])
        if line.startswith("shardlm: ready"):
            return proc, port, seen
    raise RuntimeError(f"run_default.sh did not start (SPECULATIVE={speculative}): {seen[-5:]}")


def run(a, speculative):
    proc, port, seen = serve(a, speculative)
    try:
        with TS.Client(f"127.0.0.1:{port}", timeout=60) as c:
            texts = [c.generate(PROMPT, max_tokens=80, temperature=0).text for _ in range(2)]
            st = c.server_stats()
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    return texts, st, seen


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("--assets", default=os.environ.get("SHARDLM_ASSETS", str(ROOT.parent / "shared/assets")))
    a = ap.parse_args()
    if not (Path(a.assets) / "stories260K" / "stories260K.bin").exists():
        print(f"SKIP: no stories260K in {a.assets}")
        return SKIP
    try:
        on, st_on, seen_on = run(a, None)
        off, st_off, seen_off = run(a, "off")
    finally:
        TS.kill_all()
    check(any(x.startswith("Prompt lookup speculation is on") for x in seen_on),
          "make run's script says prompt lookup speculation is on")
    check(st_on.spec_draft_tokens > 0 and st_on.spec_accepted_tokens > 0,
          f"served with prompt lookup by default: {st_on.spec_draft_tokens} drafted, {st_on.spec_accepted_tokens} accepted")
    check(st_off.spec_draft_tokens == 0 and not any(x.startswith("Prompt lookup") for x in seen_off),
          f"SPECULATIVE=off: no drafts ({st_off.spec_draft_tokens})")
    check(on == off and len(on[0]) > 0, f"the same greedy text with and without it ({on[0][:60]!r}...)")
    bad = subprocess.run(["bash", "tools/run_default.sh", a.build, a.assets], cwd=ROOT, capture_output=True, text=True,
                         env=dict(os.environ, MODEL="stories260K", SPECULATIVE="eagle"), timeout=30)
    check(bad.returncode == 2 and "SPECULATIVE must be ngram (default) or off" in bad.stderr,
          f"SPECULATIVE=eagle is refused by name (exit {bad.returncode}: {bad.stderr.strip()[:80]!r})")
    return check.summary()


if __name__ == "__main__":
    sys.exit(main())
