"""tests/server/stories_main.py - the mains of the server test scripts that run on stories260K
(one body, or named groups), and their POST helper: shared by test_models, test_models_lru,
test_journal, test_journal_grpc and test_finetune, on test_server.py's harness."""
import argparse
import json
import os
import subprocess
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

import test_server as TS


def post_json(base, path, body, timeout=60):
    """(status, JSON) of a POST of body as JSON to base + path; an HTTP error's too."""
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def stories_source():
    """stories260K's directory under SHARDLM_ASSETS, or None (a SKIP line printed)."""
    assets = Path(os.environ.get("SHARDLM_ASSETS", TS.ROOT.parent / "shared/assets"))
    src = assets / "stories260K"
    if not (src / "stories260K.bin").exists():
        print(f"SKIP: stories260K not found under {assets} (set SHARDLM_ASSETS)")
        return None
    return src


def stories_groups_main(work_prefix, groups, check, run, options=()):
    """The main of a test script of named groups on stories260K (converted once into a fresh work
    directory): --shardlm BIN, each (flag, help) of options, then the groups to run (all by
    default); run(g, shardlm, model_dir, work, args) runs group g, whose exception is a failed
    check. SKIP without the model under SHARDLM_ASSETS. Returns check.summary()."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--shardlm", required=True)
    for flag, what in options:
        ap.add_argument(flag, help=what)
    ap.add_argument("groups", nargs="*")
    a = ap.parse_args()
    src = stories_source()
    if src is None:
        return TS.SKIP
    work = Path(tempfile.mkdtemp(prefix=work_prefix))
    try:
        TS.convert_stories260k(a.shardlm, src, work / "stories260K")
        for g in a.groups or groups:
            try:
                run(g, a.shardlm, work / "stories260K", work, a)
            except Exception as e:  # noqa: BLE001
                check(False, f"group {g}: {type(e).__name__}: {e}")
    finally:
        TS.kill_all()
        subprocess.run(["rm", "-rf", str(work)])
    return check.summary()


def stories_main(name, work_prefix, body):
    """The main of a test script on stories260K: --shardlm BIN; SKIP without the model under
    SHARDLM_ASSETS; else run_test with body(work, env), env.shardlm and env.src (the model's
    directory) set."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--shardlm", required=True)
    args = ap.parse_args()
    src = stories_source()
    if src is None:
        return TS.SKIP

    class Env:
        pass

    env = Env()
    env.shardlm, env.src = args.shardlm, src
    return TS.run_test(name, work_prefix, lambda work: body(work, env))


def expect_refused(shardlm, args, words, name):
    """`shardlm serve ARGS` refuses to start, its message naming each of words."""
    p = subprocess.run([shardlm, "serve", "--listen", "127.0.0.1:0", "--threads", "1", *args],
                       capture_output=True, text=True, timeout=60)
    TS.check(p.returncode != 0, f"{name}: the server started")
    for w in words:
        TS.check(w in p.stderr, f"{name}: '{w}' not in the message: {p.stderr[-400:]}")
