#!/usr/bin/env python3
"""tests/server/test_finetune.py - `serve --fine-tuning DIR`: OpenAI's /v1/files and
/v1/fine_tuning/jobs (server/http_finetune.c) through the official openai package, on stories260K.

- files: upload (multipart, by the client), list, retrieve, content (the same bytes), delete;
- a job: queued -> succeeded, its events (the trainer's steps, the loss falling on a repeated
  example), trained_tokens; its adapter is the one `shardlm train` writes with the same data, seed
  and hyperparameters (the reference: the command users run; within 1e-4 of the weights' scale:
  in the server's process the last bits differ, 1.8e-6 at most seen, cause not found), the served
  fine_tuned_model answers as a server given that adapter with --lora answers (greedy);
- a job cancelled while it trains ends cancelled, and its adapter is not served;
- a restart (SIGTERM, then the same --fine-tuning DIR) keeps the files and jobs, serves the
  adapters of jobs that succeeded, and resumes a job that was running from its last checkpoint
  (its adapter then equals one `shardlm train` run straight);
- with API keys files, jobs and the adapters jobs make are the key's: another key lists none and
  gets 404 (gRPC: NOT_FOUND) for each
  (retrieve, content, delete, a job on the file, the job, its events, cancel), also after a
  restart whose key file lists the keys in another order;
- owners on disk (server/auth.c): DIR/owner.salt (mode 0600) and index.json's owners salted
  PBKDF2 hashes, never the unsalted FNV ones of versions before; an index whose owners are that
  legacy form (rewritten here) is still the keys' after the restart, and written again at once
  with the salted owners; a --journal DIR without owner.salt gets the same salt; a --journal DIR
  whose owner.salt differs stops the server, naming both files;
- bad input: a file that is not JSONL (the line named), another purpose, an upload over
  --fine-tuning-max-file-mb (413), unknown model / file / job (404), unknown and out-of-range
  hyperparameters, method dpo, a JSONL the trainer refuses (the job fails with its message), and
  the routes on a server without --fine-tuning (404).
Usage: test_finetune.py --shardlm BIN (SHARDLM_ASSETS: the stories260K checkpoint)."""
import json
import os
import re
import stat
import struct
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import test_server as TS  # noqa: E402  (the server harness; SKIPs without grpcio)
import grpc  # noqa: E402
import stories_main as SM  # noqa: E402  (the mains on stories260K)
from owners import legacy_owner_of, owner_of  # noqa: E402

check = TS.check
try:
    import numpy
    import openai
except ImportError as e:
    print(f"SKIP: needs numpy and openai ({e})")
    sys.exit(TS.SKIP)

EXAMPLE = {"messages": [{"role": "user", "content": "Tell me about Lily."},
                        {"role": "assistant", "content": "Lily had a red ball. She liked to play with it every day."}]}
HYPER = {"n_epochs": 3, "batch_size": 2, "learning_rate_multiplier": 20}
RESUME_EPOCHS = 40  # long enough to be running when the server stops


def train_cli(env, model, data, out, epochs):
    """`shardlm train` with a job's settings (HYPER, seed 7, rank 8, sequences of 512)."""
    subprocess.run([env.shardlm, "train", "--model", str(model), "--data", str(data), "--out", str(out),
                    "--lora-rank", "8", "--lr", str(2e-4 * HYPER["learning_rate_multiplier"]), "--epochs",
                    str(epochs), "--global-batch-size", str(HYPER["batch_size"]), "--seq-length", "512",
                    "--seed", "7", "--threads", "1"], check=True, capture_output=True, timeout=300,
                   env=dict(os.environ, OMP_NUM_THREADS="1"))  # as TS.Server runs the server


def tensors(path):
    """The tensors of a safetensors file (F32), by name."""
    b = path.read_bytes()
    n = struct.unpack("<Q", b[:8])[0]
    head = json.loads(b[8:8 + n])
    return {k: numpy.frombuffer(b[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]], dtype="<f4")
            for k, v in head.items() if k != "__metadata__"}


def same_adapter(want_dir, got_dir, what):
    """Checks that the adapter in got_dir equals want_dir's, tensor by tensor, to 1e-4 of its largest weight."""
    want = tensors(want_dir / "adapter_model.safetensors")
    got = tensors(got_dir / "adapter_model.safetensors")
    worst = max(float(numpy.abs(want[k] - got[k]).max()) for k in want) if want.keys() == got.keys() else 1e9
    scale = max(float(numpy.abs(w).max()) for w in want.values())
    check(worst <= 1e-4 * scale, f"{what}: {len(got)} tensors, max |diff| {worst:.2e} (|w| up to {scale:.2e})")


def status_of(fn):
    """The HTTP status of the openai call fn raises (0: none raised) and its message."""
    try:
        fn()
    except openai.APIStatusError as e:
        return e.status_code, str(e)
    return 0, ""


def wait_job(oa, job_id, states, timeout=120):
    deadline = time.time() + timeout
    while time.time() < deadline:
        j = oa.fine_tuning.jobs.retrieve(job_id)
        if j.status in states:
            return j
        time.sleep(0.2)
    raise TS.Failure(f"job {job_id} did not reach {states} in {timeout} s (status {j.status})")


def greedy(oa, model):
    r = oa.chat.completions.create(model=model, messages=EXAMPLE["messages"][:1], max_tokens=24, temperature=0)
    return r.choices[0].message.content


def body(work, env):
    model = work / "stories260K"
    TS.convert_stories260k(env.shardlm, env.src, model)
    data = work / "train.jsonl"
    data.write_text("".join(json.dumps(EXAMPLE) + "\n" for _ in range(24)))
    ft = ["--fine-tuning", str(work / "ft"), "--fine-tuning-max-file-mb", "1"]
    with TS.Server(env.shardlm, model, *ft, http=True, name="finetune") as srv:
        oa = openai.OpenAI(base_url=srv.base + "/v1", api_key="none", max_retries=0, timeout=60)
        # Files.
        f = oa.files.create(file=data.open("rb"), purpose="fine-tune")
        check(f.id.startswith("file-") and f.bytes == data.stat().st_size and f.filename == "train.jsonl",
              f"upload: {f}")
        check([x.id for x in oa.files.list().data] == [f.id], "files.list holds the upload")
        check(oa.files.retrieve(f.id).bytes == f.bytes, "files.retrieve")
        check(oa.files.content(f.id).content == data.read_bytes(), "files.content: the same bytes")
        spare = oa.files.create(file=("spare.jsonl", b'{"text": "x"}\n'), purpose="fine-tune")
        check(oa.files.delete(spare.id).deleted, "files.delete")
        code, msg = status_of(lambda: oa.files.retrieve(spare.id))
        check(code == 404, f"a deleted file is gone: {code} {msg}")
        # A deleted file's slot serves the next upload: 300 uploads and deletions (more than the
        # 256 files kept at once), then one more upload.
        cycled = 0
        for _ in range(300):
            x = oa.files.create(file=("cycle.jsonl", b'{"text": "x"}\n'), purpose="fine-tune")
            cycled += oa.files.delete(x.id).deleted
        last = oa.files.create(file=("last.jsonl", b'{"text": "x"}\n'), purpose="fine-tune")
        check(cycled == 300 and {y.id for y in oa.files.list().data} == {f.id, last.id},
              f"300 uploads and deletions, then one more: {cycled} deleted, the files listed are the two kept")
        oa.files.delete(last.id)

        # A job, against `shardlm train` with the same settings.
        j = oa.fine_tuning.jobs.create(model="stories260K", training_file=f.id, hyperparameters=HYPER, suffix="lily",
                                       seed=7)
        check(j.status in ("queued", "running") and j.fine_tuned_model is None, f"created: {j.status}")
        j = wait_job(oa, j.id, ("succeeded", "failed", "cancelled"))
        check(j.status == "succeeded" and j.fine_tuned_model == f"ft-lily-{j.id[6:]}" and j.trained_tokens > 0,
              f"the job succeeded: {j.status} {j.error} {j.fine_tuned_model} {j.trained_tokens}")
        check([x.id for x in oa.fine_tuning.jobs.list().data] == [j.id], "jobs.list")
        events = oa.fine_tuning.jobs.list_events(j.id, limit=100).data
        steps = [e.data["train_loss"] for e in reversed(events) if e.type == "metrics"]
        check(len(steps) >= 3 and steps[-1] < steps[0] * 0.9,
              f"events: one per step, the loss falling on the repeated example: {steps}")
        check(events[0].message.startswith("The job has successfully completed"), f"newest event: {events[0].message}")
        # Paging (after, limit): pages of 7 events put end to end give the whole listing once.
        pages, after = [], None
        while True:
            page = oa.fine_tuning.jobs.list_events(j.id, limit=7, **({"after": after} if after else {}))
            pages += [e.id for e in page.data]
            check(len(page.data) <= 7, f"a page holds at most limit events: {len(page.data)}")
            if not page.has_more or len(pages) > len(events):
                break
            after = page.data[-1].id
        check(pages == [e.id for e in events], f"events paged by 7: {len(pages)} ids against {len(events)}")
        check(len(oa.fine_tuning.jobs.list_events(j.id).data) == min(20, len(events)), "events: 20 by default")
        only = oa.fine_tuning.jobs.list(limit=1)
        check([x.id for x in only.data] == [j.id] and not only.has_more, "jobs.list(limit=1)")
        check(oa.files.list(purpose="assistants").data == [] and
              [x.id for x in oa.files.list(order="asc", limit=1).data] == [f.id], "files.list: purpose, order, limit")
        for path, word in ((f"/v1/files/{f.id}?expand=1", "expand"), ("/v1/fine_tuning/jobs?metadata=x", "metadata"),
                           (f"/v1/fine_tuning/jobs/{j.id}/events?after=ftevent-none", "ftevent-none"),
                           ("/v1/files?limit=0", "limit")):
            try:
                with urllib.request.urlopen(srv.base + path, timeout=30) as r:
                    code, body = r.status, r.read().decode()
            except urllib.error.HTTPError as e:
                code, body = e.code, e.read().decode()
            check(code in (400, 501) and word in body, f"GET {path}: refused naming {word!r}: {code} {body[:200]}")
        served = greedy(oa, j.fine_tuned_model)
        base = greedy(oa, "stories260K")
        check(served != base, f"the fine-tuned model answers otherwise than the base: {served!r} / {base!r}")

        ref = work / "ref-adapter"
        train_cli(env, model, data, ref, HYPER["n_epochs"])
        same_adapter(ref, work / "ft" / "jobs" / j.id / "adapter",
                     "the job's adapter equals `shardlm train`'s with the same data, seed and hyperparameters")

        # Cancel while it trains: many epochs, cancelled once running.
        big = oa.fine_tuning.jobs.create(model="stories260K", training_file=f.id,
                                         hyperparameters={"n_epochs": 50, "batch_size": 1})
        wait_job(oa, big.id, ("running",))
        time.sleep(0.3)
        oa.fine_tuning.jobs.cancel(big.id)
        big = wait_job(oa, big.id, ("cancelled", "succeeded", "failed"))
        check(big.status == "cancelled" and big.fine_tuned_model is None, f"cancelled: {big.status}")
        code, msg = status_of(lambda: greedy(oa, f"ft-shardlm-{big.id[6:]}"))
        check(code == 404, f"a cancelled job's adapter is not served: {code} {msg}")
        code, msg = status_of(lambda: oa.fine_tuning.jobs.cancel(big.id))
        check(code == 409 and "already cancelled" in msg, f"cancelling it again: {code} {msg}")

        # Bad input.
        bad = [
            (lambda: oa.files.create(file=("x.jsonl", b'{"text": "a"}\nnot json\n'), purpose="fine-tune"), 400,
             "line 2"),
            (lambda: oa.files.create(file=("x.jsonl", b'{"text": "a"}\n'), purpose="assistants"), 400, "assistants"),
            (lambda: oa.files.create(file=("big.jsonl", b'{"text": "' + b"a" * (1 << 20) + b'"}\n'),
                                     purpose="fine-tune"), 413, "fine-tuning-max-file-mb"),
            # A job's creation is a request, not an upload: --max-message-bytes (4 MiB), not the upload limit.
            (lambda: oa.fine_tuning.jobs.create(model="stories260K", training_file=f.id, suffix="a" * (5 << 20)), 413,
             "max-message-bytes"),
            (lambda: oa.fine_tuning.jobs.create(model="nope", training_file=f.id), 404, "nope"),
            (lambda: oa.fine_tuning.jobs.create(model="stories260K", training_file="file-0"), 404, "file-0"),
            (lambda: oa.fine_tuning.jobs.create(model="stories260K", training_file=f.id,
                                                hyperparameters={"warmup": 3}), 400, "warmup"),
            (lambda: oa.fine_tuning.jobs.create(model="stories260K", training_file=f.id,
                                                hyperparameters={"n_epochs": 0}), 400, "n_epochs"),
            (lambda: oa.fine_tuning.jobs.create(model="stories260K", training_file=f.id,
                                                method={"type": "dpo"}), 400, "dpo"),
            (lambda: oa.fine_tuning.jobs.create(model="stories260K", training_file=f.id,
                                                method={"type": "supervised", "dpo": {}}), 400, "method.dpo"),
            (lambda: oa.fine_tuning.jobs.create(model="stories260K", training_file=f.id, method={
                "type": "supervised", "supervised": {"hyperparameters": {}, "beta": 1}}), 400, "method.supervised.beta"),
            (lambda: oa.fine_tuning.jobs.create(model="stories260K", training_file=f.id, suffix="a:b"), 400, "suffix"),
            (lambda: oa.fine_tuning.jobs.retrieve("ftjob-0"), 404, "ftjob-0"),
        ]
        for k, (fn, want, word) in enumerate(bad):
            code, msg = status_of(fn)
            check(code == want and word in msg, f"bad input {k}: want {want} naming '{word}', got {code} {msg}")
        # Two file parts in one upload: refused by name (the last one no longer silently wins).
        parts = b"".join(b'--XyZ\r\nContent-Disposition: form-data; name="file"; filename="%s.jsonl"\r\n'
                         b'Content-Type: application/jsonl\r\n\r\n{"text": "x"}\n\r\n' % n for n in (b"a", b"b"))
        parts += b'--XyZ\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nfine-tune\r\n--XyZ--\r\n'
        req = urllib.request.Request(srv.base + "/v1/files", data=parts,
                                     headers={"Content-Type": "multipart/form-data; boundary=XyZ"})
        try:
            urllib.request.urlopen(req, timeout=30)
            code, msg = 200, ""
        except urllib.error.HTTPError as e:
            code, msg = e.code, e.read().decode()
        check(code == 400 and "'file' appears twice" in msg, f"two file parts: {code} {msg[:120]}")
        odd = oa.files.create(file=("odd.jsonl", b'{"question": "what?"}\n' * 4), purpose="fine-tune")
        failed = oa.fine_tuning.jobs.create(model="stories260K", training_file=odd.id)
        failed = wait_job(oa, failed.id, ("failed", "succeeded", "cancelled"))
        check(failed.status == "failed" and failed.error and "line 1" in failed.error.message,
              f"a JSONL the trainer refuses: the job fails naming the line: {failed.status} {failed.error}")

        # A job running when the server stops (SIGTERM) resumes after a restart.
        long = oa.fine_tuning.jobs.create(model="stories260K", training_file=f.id, seed=7,
                                          hyperparameters={**HYPER, "n_epochs": RESUME_EPOCHS})
        wait_job(oa, long.id, ("running",))
        time.sleep(1.0)
        jobs_before = sorted(x.id for x in oa.fine_tuning.jobs.list().data)

    with TS.Server(env.shardlm, model, *ft, http=True, name="finetune-again") as srv:
        oa = openai.OpenAI(base_url=srv.base + "/v1", api_key="none", max_retries=0, timeout=60)
        check(sorted(x.id for x in oa.files.list().data) == sorted([f.id, odd.id]), "a restart keeps the uploads")
        check(sorted(x.id for x in oa.fine_tuning.jobs.list().data) == jobs_before, "a restart keeps the jobs")
        again = oa.fine_tuning.jobs.retrieve(j.id)
        check(again.status == "succeeded" and greedy(oa, j.fine_tuned_model) == served,
              "a job that succeeded before the restart is served again, answering as before")
        long = wait_job(oa, long.id, ("succeeded", "failed", "cancelled"), timeout=240)
        messages = [e.message for e in oa.fine_tuning.jobs.list_events(long.id, limit=100).data]
        check(long.status == "succeeded" and any("resumes from its last checkpoint" in m for m in messages),
              f"the interrupted job resumed and succeeded: {long.status} {long.error} {messages[:4]}")
        check(oa.fine_tuning.jobs.retrieve(big.id).status == "cancelled", "a cancelled job stays cancelled")
        ref_long = work / "ref-long"
        train_cli(env, model, data, ref_long, RESUME_EPOCHS)
        same_adapter(ref_long, work / "ft" / "jobs" / long.id / "adapter",
                     "stopped, restarted and resumed, the adapter equals one `shardlm train` run straight")

    with TS.Server(env.shardlm, model, "--lora", f"lily={work / 'ft' / 'jobs' / j.id / 'adapter'}", http=True, name="lora") as srv:
        oa = openai.OpenAI(base_url=srv.base + "/v1", api_key="none", max_retries=0, timeout=60)
        check(greedy(oa, "lily") == served, "--lora with the job's adapter answers as fine_tuned_model did")
        codes = []
        for payload in (None, b'{"model": "stories260K", "training_file": "file-0"}'):  # a GET, a POST with a body
            req = urllib.request.Request(srv.base + "/v1/fine_tuning/jobs", data=payload,
                                         headers={"Content-Type": "application/json"})
            try:
                urllib.request.urlopen(req, timeout=30)
                codes.append(200)
            except urllib.error.HTTPError as e:
                codes.append(e.code)
        check(codes == [404, 404], f"without --fine-tuning the routes are 404, with a body too (not 413): {codes}")

    # With API keys, files and jobs are the key's: another key neither sees nor touches them, and
    # a restart whose key file lists the keys in another order keeps them the owner's.
    keys = work / "keys"
    keys.write_text("key-alpha\nkey-beta\n")
    ft2 = ["--fine-tuning", str(work / "ft-keys"), "--api-key-file", str(keys)]
    with TS.Server(env.shardlm, model, *ft2, http=True, name="finetune-keys") as srv:
        a = openai.OpenAI(base_url=srv.base + "/v1", api_key="key-alpha", max_retries=0, timeout=60)
        b = openai.OpenAI(base_url=srv.base + "/v1", api_key="key-beta", max_retries=0, timeout=60)
        fa = a.files.create(file=data.open("rb"), purpose="fine-tune")
        ja = a.fine_tuning.jobs.create(model="stories260K", training_file=fa.id, hyperparameters=HYPER)
        check([x.id for x in b.files.list().data] == [] and [x.id for x in b.fine_tuning.jobs.list().data] == [],
              "another key lists none of them")
        codes = [status_of(f)[0] for f in (lambda: b.files.retrieve(fa.id), lambda: b.files.content(fa.id),
                                           lambda: b.files.delete(fa.id), lambda: b.fine_tuning.jobs.retrieve(ja.id),
                                           lambda: b.fine_tuning.jobs.cancel(ja.id),
                                           lambda: b.fine_tuning.jobs.list_events(ja.id),
                                           lambda: b.fine_tuning.jobs.create(model="stories260K", training_file=fa.id))]
        check(codes == [404] * 7, f"another key's retrieve, content, delete, job retrieve, cancel, events, and a job "
              f"on the file: all 404 ({codes})")
        check([x.id for x in a.files.list().data] == [fa.id] and a.files.content(fa.id).content == data.read_bytes(),
              "the owner still has its file, whole")
        # The adapter a job makes is its key's too: another key's model lists, chat, completions
        # and gRPC (Generate, GetModelInfo) do not see it, as an adapter that does not exist.
        ft_model = wait_job(a, ja.id, ("succeeded",)).fine_tuned_model
        listed = {k: [m.id for m in c.models.list().data] for k, c in (("a", a), ("b", b))}
        check(ft_model in listed["a"] and ft_model not in listed["b"],
              f"/v1/models: the owner's key lists {ft_model}, another's does not ({listed['b']})")
        check(isinstance(greedy(a, ft_model), str), "the owner's key chats with its fine-tuned adapter")
        codes = [status_of(f)[0] for f in (lambda: greedy(b, ft_model), lambda: b.completions.create(
            model=ft_model, prompt="Once", max_tokens=2), lambda: b.chat.completions.create(
            model="no-such-adapter", messages=[{"role": "user", "content": "x"}], max_tokens=2))]
        check(codes == [404] * 3, f"another key naming it: 404 as for an adapter that does not exist ({codes})")
        with srv.client(api_key="key-beta") as gb, srv.client(api_key="key-alpha") as ga:
            def grpc_code(c, adapter):
                try:
                    c.generate("Once", adapter=adapter, max_tokens=2)
                    return "OK", ""
                except grpc.RpcError as e:
                    return e.code().name, e.details().replace(adapter, "NAME")
            hidden, unknown = grpc_code(gb, ft_model), grpc_code(gb, "no-such")
            check(grpc_code(ga, ft_model)[0] == "OK" and hidden[0] == "NOT_FOUND" and hidden == unknown,
                  f"gRPC Generate: the owner's key runs it, another's gets NOT_FOUND word for word as for no such "
                  f"adapter (nothing counts the hidden one): {hidden} / {unknown}")
            check(ft_model in ga.model_info().adapters and ft_model not in gb.model_info().adapters,
                  "gRPC GetModelInfo lists it to its owner's key only")

            def unload_code(c, adapter):
                try:
                    c.unload_adapter(adapter)
                    return "OK", ""
                except grpc.RpcError as e:
                    return e.code().name, e.details().replace(adapter, "NAME")
            hidden, unknown = unload_code(gb, ft_model), unload_code(gb, "no-such")
            check(hidden[0] == "NOT_FOUND" and hidden == unknown and grpc_code(ga, ft_model)[0] == "OK",
                  f"gRPC UnloadAdapter: another key's is NOT_FOUND word for word as for no such adapter, and the "
                  f"owner's key still runs it: {hidden} / {unknown}")
    # The owners on disk are salted; then the index is rewritten as a version before owner.salt
    # wrote it (the legacy owner of key-alpha), which the restart must upgrade, not lose.
    ft_dir, journal = work / "ft-keys", work / "ft-keys-journal"
    salt = ft_dir / "owner.salt"
    mode = stat.S_IMODE(salt.stat().st_mode) if salt.exists() else None
    check(mode == 0o600 and re.fullmatch(r"[0-9a-f]{32}\n", salt.read_text()) is not None,
          f"the fine-tuning directory holds owner.salt, mode 0600, 32 hex digits (mode {mode and oct(mode)})")
    index = (ft_dir / "index.json").read_text()
    alpha, legacy = owner_of("key-alpha", ft_dir), legacy_owner_of("key-alpha")
    check(index.count(alpha) == 2 and legacy not in index and legacy_owner_of("key-beta") not in index,
          "index.json holds the salted owner of the file and the job, not the unsalted FNV one")
    (ft_dir / "index.json").write_text(index.replace(alpha, legacy))
    keys.write_text("key-beta\nkey-alpha\n")
    with TS.Server(env.shardlm, model, *ft2, "--journal", str(journal), http=True, name="finetune-keys-again") as srv:
        a = openai.OpenAI(base_url=srv.base + "/v1", api_key="key-alpha", max_retries=0, timeout=60)
        b = openai.OpenAI(base_url=srv.base + "/v1", api_key="key-beta", max_retries=0, timeout=60)
        check([x.id for x in a.files.list().data] == [fa.id] and [x.id for x in b.files.list().data] == [] and
              [x.id for x in a.fine_tuning.jobs.list().data] == [ja.id] and b.fine_tuning.jobs.list().data == [],
              "after a restart with the key file reordered and the legacy owners in the index the files and jobs "
              "are still the owner's")
        index = (ft_dir / "index.json").read_text()
        check(index.count(alpha) == 2 and legacy not in index, "the index is written again at once, upgraded")
        check((journal / "owner.salt").read_text() == salt.read_text(),
              "a --journal DIR without owner.salt gets the installation's salt")
    (journal / "owner.salt").write_text("00" * 16 + "\n")
    SM.expect_refused(env.shardlm, ["--model", str(model), "--http", "127.0.0.1:0", *ft2, "--journal", str(journal)],
                      [str(salt), str(journal / "owner.salt"), "different owner salts"], "owner salts that differ")


def main():
    return SM.stories_main("finetune", "shardlm-finetune-", body)


if __name__ == "__main__":
    sys.exit(main())
