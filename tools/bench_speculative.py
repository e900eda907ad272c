#!/usr/bin/env python3
"""tools/bench_speculative.py - prompt-lookup speculative decoding against none, same run, same
file: SQuAD held-out questions through gRPC Chat with the passage in the prompt (the answers copy
spans of it), greedy, one request at a time (batch 1) and 16 at once, on a server started
without and then with `--speculative ngram`. Prints decode tokens/s of each (completion tokens
over the time after the first token, summed over the requests), their ratio, the acceptance rate
from GetServerStats, whether every answer is identical, and the CPU model. With --draft-model,
each DIR given is also run as `--speculative draft --draft-model DIR` (a draft model: for
example one shardlm trained, tools/distill_draft.sh). With --open, everyday requests without a
passage instead (OPEN_PROMPTS: nothing in the prompt to copy, so prompt lookup finds little; the
issue's "prompts where nothing matches", where speculation must cost no more than 3 %). Not a test.

  python3 tools/bench_speculative.py --shardlm build/cli/shardlm --model FILE.gguf|DIR
      [--squad .cache/chat-data/squad_eval.json] [--questions 24] [--max-tokens 64] [--threads 2]
      [--spec-draft 4] [--spec-p-min P[,P2...]] [--spec-ngram-min M[,M2...]] [--spec-max-batch N] [--llama-lookup .cache/llama.cpp/build/bin/llama-lookup] [--draft-model DIR ...]
      [--token-map MAP.json] [--eagle HEAD.safetensors[@MAP.json] ...] [--lookup-first] [--llama-server .cache/llama.cpp/build-srv/bin/llama-server] [--llama-speculative .cache/llama.cpp/build-ex/bin/llama-speculative-simple
      --llama-draft DRAFT.gguf]
      [--batches 1,16] [--open] [--rounds N] [--only NAME,...] [--serve-arg=ARG ...] [--temperature T] [--json-schema TEXT]
      [--generate] [--spec-corpus FILE] [--spec-corpus-learn N [--warm]]
      [--ranks N --serve-arg=--tp --serve-arg=2]

llama.cpp's example programs (llama-lookup, llama-speculative-simple) are built by
`ONLY=examples tools/bench_vs_llamacpp.sh` into .cache/llama.cpp/build-ex.
"""
import argparse
import concurrent.futures as cf
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "server"))
import test_server as TS  # noqa: E402


# Everyday requests with nothing to copy from (--open).
OPEN_PROMPTS = [
    "Write a short poem about the sea at night.", "Give me three tips for sleeping better.",
    "What should I cook for dinner tonight? Suggest something quick.", "Explain why the sky is blue.",
    "Tell me a joke about computers.", "How do I start learning to play the guitar?",
    "Describe your ideal weekend.", "What are the benefits of walking every day?",
    "Suggest a name for a small bakery.", "Why do cats purr?", "How can I be more productive at work?",
    "Write a thank-you note to a teacher.", "What is the difference between weather and climate?",
    "Give me an idea for a birthday present for my brother.", "How do plants make their food?",
    "Plan a one-day trip to a city you like.", "What makes a good friend?", "Explain what a budget is.",
    "Write two sentences about autumn.", "How do I keep my houseplants alive?",
    "Why is exercise good for the brain?", "Invent a new ice cream flavour and describe it.",
    "What are some polite ways to say no?", "How does a rainbow form?",
]


def run(srv, prompts, max_tokens, parallel, temperature=0.0, json_schema=None):
    """-> (answers, completion tokens, decode seconds summed over requests); sampled requests (a
    temperature above 0) are seeded by their index, the same seeds for every server; with
    json_schema every answer is constrained to it (structured outputs)."""
    def one(i):
        p, kw = prompts[i], dict(temperature=temperature, seed=1000 + i) if temperature else dict(temperature=0)
        if json_schema:
            kw["json_schema"] = json_schema
        with srv.client(timeout=600) as c:
            t0, first, n, text = time.perf_counter(), None, 0, []
            for ev in c.chat_stream([{"role": "user", "content": p}], max_tokens=max_tokens, **kw):
                if ev.text or ev.token_ids:
                    if first is None:
                        first = time.perf_counter()
                    n += len(ev.token_ids)
                    text.append(ev.text)
            end = time.perf_counter()
            return "".join(text), n, end - (first or t0)
    with cf.ThreadPoolExecutor(parallel) as ex:
        res = list(ex.map(one, range(len(prompts))))
    return [r[0] for r in res], sum(r[1] for r in res), sum(r[2] for r in res)


def gguf_template(model):
    """The GGUF's own chat template as a jinja2 template."""
    import gguf
    import jinja2
    field = gguf.GGUFReader(model).fields["tokenizer.chat_template"]
    return jinja2.Environment().from_string(bytes(field.parts[field.data[0]]).decode())


def squad_prompts(path, n):
    """n held-out SQuAD prompts spread over the file (tools/prepare_chat_data.py's squad_eval.json)."""
    qs = json.load(open(path))
    return [q["prompt"] for q in qs[::max(1, len(qs) // n)][:n]]


def llama_lookup(binary, model, prompts, max_tokens, threads, draft, extra=()):
    """llama.cpp's prompt lookup (llama-lookup) or draft-model speculation (llama-speculative-simple,
    extra = ("-md", DRAFT, "--spec-type", "draft-simple")) at batch 1: (answers, decoded tokens, decode
    seconds, drafted, accepted).
    Both print the same summary ("decoded N tokens in T seconds", n_drafted, n_accept)."""
    template = gguf_template(model)
    answers, n, t, drafted, accepted = [], 0, 0.0, 0, 0
    for p in prompts:
        with tempfile.NamedTemporaryFile("w", suffix=".txt") as f:
            f.write(template.render(messages=[{"role": "user", "content": p}], add_generation_prompt=True))
            f.flush()
            r = subprocess.run([binary, "-m", model, "-f", f.name, "-n", str(max_tokens), "--temp", "0", "-t",
                                str(threads), "--spec-draft-n-max", str(draft), *extra], capture_output=True, text=True,
                               timeout=300)
        m = re.search(r"decoded\s+(\d+) tokens in\s+([0-9.]+) seconds", r.stderr)
        if r.returncode or not m:
            raise RuntimeError(f"{binary} failed ({r.returncode}): {r.stderr[-2000:]}")
        n, t = n + int(m.group(1)), t + float(m.group(2))
        drafted += int((re.search(r"n_drafted\s+=\s+(\d+)", r.stderr) or [0, 0])[1])
        accepted += int((re.search(r"n_accept\s+=\s+(\d+)", r.stderr) or [0, 0])[1])
        answers.append(r.stdout)
    return answers, n, t, drafted, accepted


def llama_server(binary, model, prompts, max_tokens, threads, extra=()):
    """llama.cpp's llama-server on the same file (one slot, its own chat template), the prompts
    one at a time through /v1/chat/completions, greedy: (answers, decoded tokens, decode seconds,
    drafted, accepted) from each response's "timings"; extra: its speculative flags."""
    import socket
    import urllib.request
    with socket.socket() as sk:
        sk.bind(("127.0.0.1", 0))
        port = sk.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    log = tempfile.TemporaryFile()
    proc = subprocess.Popen([binary, "-m", model, "--host", "127.0.0.1", "--port", str(port), "-t", str(threads),
                             "-np", "1", "-c", "8192", *extra], stdout=log, stderr=subprocess.STDOUT)
    try:
        for _ in range(600):  # up to 120 s to load
            if proc.poll() is not None:
                break
            try:
                with urllib.request.urlopen(url + "/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.2)
        if proc.poll() is not None:
            log.seek(0)
            raise RuntimeError(f"{binary} exited ({proc.returncode}): {log.read()[-2000:].decode(errors='replace')}")
        answers, n, t, drafted, accepted = [], 0, 0.0, 0, 0
        for p in prompts:
            body = json.dumps({"messages": [{"role": "user", "content": p}], "max_tokens": max_tokens,
                               "temperature": 0}).encode()
            req = urllib.request.Request(url + "/v1/chat/completions", body, {"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=600) as r:
                res = json.load(r)
            tm = res["timings"]
            n, t = n + tm["predicted_n"], t + tm["predicted_ms"] / 1000.0
            drafted, accepted = drafted + tm.get("draft_n", 0), accepted + tm.get("draft_n_accepted", 0)
            answers.append(res["choices"][0]["message"]["content"])
        return answers, n, t, drafted, accepted
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def generate_runs(a, prompts):
    """--generate: `shardlm generate` (one process a prompt, the prompt rendered by the GGUF's chat
    template, greedy) without and with `--speculative ngram`, a.rounds rounds alternating; prints
    each round's decode tok/s (generate's own figure, summed over the prompts) and the best
    rounds' ratio, and whether every output is identical."""
    template = gguf_template(a.model)
    texts = [template.render(messages=[{"role": "user", "content": p}], add_generation_prompt=True) for p in prompts]
    res = {}
    for _ in range(a.rounds):
        for mode, flags in (("none", []), ("ngram", ["--speculative", "ngram", "--spec-draft", str(a.spec_draft)])):
            n, t, drafted, accepted, outs = 0, 0.0, 0, 0, []
            for text in texts:
                r = subprocess.run([a.shardlm, "generate", "--model", a.model, "--prompt", text, "--no-bos", "--max-tokens",
                                    str(a.max_tokens), "--threads", str(a.threads), *flags], capture_output=True,
                                   text=True, timeout=600)
                m = re.search(r"generated (\d+) tokens, decode ([0-9.]+) tok/s", r.stderr)
                if r.returncode or not m:
                    raise RuntimeError(f"shardlm generate failed ({r.returncode}): {r.stderr[-2000:]}")
                if int(m.group(1)) > 1:
                    n, t = n + int(m.group(1)) - 1, t + (int(m.group(1)) - 1) / float(m.group(2))
                v = re.search(r"(\d+) drafts verified, (\d+) accepted", r.stderr)
                if v:
                    drafted, accepted = drafted + int(v.group(1)), accepted + int(v.group(2))
                outs.append(r.stdout)
            res.setdefault(mode, []).append((n / t, drafted, accepted, outs))
            print(f"generate, {mode}: {n} decode tokens, {n / t:.1f} tok/s" +
                  (f"; {drafted} drafts verified, {accepted} accepted" if flags else ""))
    best = {mode: max(r[0] for r in v) for mode, v in res.items()}
    same = sum(x == y for x, y in zip(res["none"][0][3], res["ngram"][0][3]))
    print(f"generate, best rounds: {best['none']:.1f} tok/s without, {best['ngram']:.1f} with prompt lookup: "
          f"{best['ngram'] / best['none']:.2f}x; {same} of {len(texts)} outputs identical")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shardlm", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--squad", default=str(ROOT / ".cache" / "chat-data" / "squad_eval.json"))
    ap.add_argument("--questions", type=int, default=24)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--spec-draft", type=int, default=4)
    ap.add_argument("--only", help="run only the speculative servers whose names start with one of these "
                    "(comma-separated: ngram, eagle, draft, ngram + eagle, ...) beside the one without")
    ap.add_argument("--spec-ngram-min", default=None, help="the servers with prompt lookup take --spec-ngram-min M "
                    "(the shortest match; 2 by default); M1,M2,...: prompt lookup alone is also run with each "
                    "further M")
    ap.add_argument("--spec-p-min", default=None, help="the servers with a draft model or EAGLE head take "
                    "--spec-p-min P (prompt lookup alone does not); P1,P2,...: each of them is also run with each "
                    "further P")
    ap.add_argument("--spec-max-batch", type=int, default=None, help="the server's --spec-max-batch (default: its own)")
    ap.add_argument("--llama-server", help="llama.cpp's llama-server, run on the same file and questions at batch 1 "
                    "without and with its prompt lookup (--spec-type ngram-simple), --rounds times")
    ap.add_argument("--llama-lookup", help="llama.cpp's llama-lookup, run on the same file and questions")
    ap.add_argument("--draft-model", action="append", default=[], help="also speculate with this draft model")
    ap.add_argument("--token-map", help="also run each --draft-model with --spec-token-map FILE (and every --eagle "
                    "head with it)")
    ap.add_argument("--eagle", action="append", default=[], help="also speculate with this EAGLE head "
                    "(--speculative eagle --draft-model HEAD.safetensors: shardlm train --eagle-head); "
                    "HEAD@MAP.json: with that token map in place of --token-map's")
    ap.add_argument("--lookup-first", action="store_true", help="also run every --draft-model and --eagle head "
                    "with --spec-ngram 3: prompt lookup first, the draft where nothing matches")
    ap.add_argument("--no-prior", action="store_true", help="SHARDLM_SPEC_PRIOR=0 for the speculative servers: "
                    "every sequence drafts (a weak draft's acceptance measured on every request, not backed off)")
    ap.add_argument("--llama-speculative", help="llama.cpp's llama-speculative-simple, run with --llama-draft as its "
                    "draft (-md) on the same file and questions")
    ap.add_argument("--llama-draft", help="the draft GGUF of --llama-speculative (tools/draft_gguf.py); its "
                    "--speculative draft run is added to shardlm's configurations")
    ap.add_argument("--serve-arg", action="append", default=[],
                    help="one more argument for every server (repeat: --serve-arg=--no-prefix-caching)")
    ap.add_argument("--spec-corpus", help="a corpus of the model's own answers (tools/distill_data.py's JSONL): "
                    "adds the servers 'ngram + corpus' (prompt lookup, then the corpus) and, with --eagle and "
                    "--lookup-first, 'ngram + corpus + eagle'")
    ap.add_argument("--spec-corpus-learn", type=int, help="adds the servers 'ngram + learn' (prompt lookup, then "
                    "the corpus the server learns from its own answers: --spec-corpus-learn N) and, with --spec-corpus, "
                    "'ngram + corpus + learn'")
    ap.add_argument("--warm", action="store_true", help="every server answers every prompt once, unmeasured, before "
                    "the measured runs (requests asked before, a FAQ workload: what --spec-corpus-learn learns; every "
                    "server alike, so that the prefix cache's hits are the same)")
    ap.add_argument("--spec-corpus-p-min", help="the corpus's --spec-corpus-p-min (comma-separated: one server each)")
    ap.add_argument("--temperature", type=float, default=0.0, help="sample at this temperature (seeded per "
                    "request) instead of greedy decoding: answers then differ between servers, speeds compare")
    ap.add_argument("--ranks", type=int, default=1, help="run every server under mpirun -n RANKS (with "
                    "--serve-arg=--tp / --pp giving the layout; OMPI_ALLOW_RUN_AS_ROOT as a root user needs it)")
    ap.add_argument("--rounds", type=int, default=1, help="start every server this many times, alternating, and "
                    "keep each one's fastest round (this VM's speed moves between servers; default 1)")
    ap.add_argument("--batches", default="1,16", help="requests at once, comma-separated (default 1,16)")
    ap.add_argument("--open", action="store_true", help="everyday requests without a passage (OPEN_PROMPTS)")
    ap.add_argument("--chat-prompts", help="a chat JSONL: the first user turns of its last --questions lines are the "
                    "requests (held-out conversations, e.g. of the data a --spec-corpus was distilled from)")
    ap.add_argument("--generate", action="store_true", help="`shardlm generate` instead of a server: without and with "
                    "--speculative ngram, one process a prompt (a GGUF with a chat template)")
    ap.add_argument("--json-schema", help="constrain every answer to this JSON schema (its text), as a structured-"
                    "output request does: e.g. '{\"type\": \"object\", \"properties\": {\"answer\": {\"type\": "
                    "\"string\"}}, \"required\": [\"answer\"]}'")
    a = ap.parse_args()
    if a.chat_prompts:
        lines = open(a.chat_prompts).read().splitlines()[-a.questions:]
        prompts, what = [json.loads(x)["messages"][0]["content"] for x in lines], f"chat requests of {a.chat_prompts}"
    elif a.open:
        prompts, what = OPEN_PROMPTS[: a.questions], "everyday requests without a passage"
    else:
        prompts, what = squad_prompts(a.squad, a.questions), "SQuAD held-out questions"
    how = f"temperature {a.temperature} (seeded)" if a.temperature else "greedy"
    if a.json_schema:
        how += f", every answer constrained to the JSON schema {a.json_schema}"
    print(f"CPU: {TS.cpu_name()}; model {a.model}; {len(prompts)} {what}, {how}, "
          f"{a.max_tokens} tokens at most, --threads {a.threads}")
    if a.generate:
        return generate_runs(a, prompts)
    out = {}
    batches = [int(b) for b in a.batches.split(",")]
    spec = ["--spec-draft", str(a.spec_draft)]
    if a.spec_max_batch is not None:
        spec += ["--spec-max-batch", str(a.spec_max_batch)]
    lookup_spec = list(spec)  # prompt lookup's flags (no --spec-p-min: a draft's or head's)
    mins = [int(m) for m in a.spec_ngram_min.split(",")] if a.spec_ngram_min else []
    look = ["--spec-ngram-min", str(mins[0])] if mins else []
    configs = [("none", []), ("ngram", ["--speculative", "ngram", *spec, *look])]
    configs += [(f"ngram, matches down to {m}", ["--speculative", "ngram", *spec, "--spec-ngram-min", str(m)])
                for m in mins[1:]]
    p_mins = a.spec_p_min.split(",") if a.spec_p_min else []
    if p_mins:  # a draft's or head's threshold: not prompt lookup's
        spec = [*spec, "--spec-p-min", p_mins[0]]
    if a.llama_speculative and not a.llama_draft:
        ap.error("--llama-speculative needs --llama-draft FILE.gguf")
    if a.llama_draft and a.llama_draft not in a.draft_model:
        a.draft_model.append(a.llama_draft)
    configs += [("draft " + d, ["--speculative", "draft", "--draft-model", d, *spec]) for d in a.draft_model]
    if a.token_map:
        configs += [(f"draft {d} + map", ["--speculative", "draft", "--draft-model", d, "--spec-token-map", a.token_map,
                                          *spec]) for d in a.draft_model]
    def head_of(h):  # HEAD or HEAD@MAP: a head with its own token map in place of --token-map's
        path, _, own = h.partition("@")
        m = own or a.token_map
        return ["--draft-model", path, *(["--spec-token-map", m] if m else [])]
    configs += [("eagle " + h, ["--speculative", "eagle", *head_of(h), *spec]) for h in a.eagle]
    if a.lookup_first:
        configs += [(f"ngram + draft {d}", ["--speculative", "draft", "--draft-model", d, "--spec-ngram", "3", *look,
                                            *spec]) for d in a.draft_model]
        configs += [(f"ngram + eagle {h}", ["--speculative", "eagle", *head_of(h), "--spec-ngram", "3", *look, *spec])
                    for h in a.eagle]
    if a.spec_corpus:
        cps = a.spec_corpus_p_min.split(",") if a.spec_corpus_p_min else [None]
        for cp in cps:
            cflags = ["--spec-corpus", a.spec_corpus, *(["--spec-corpus-p-min", cp] if cp else [])]
            tag = f" (p_min {cp})" if cp else ""
            configs += [(f"ngram + corpus{tag}", ["--speculative", "ngram", *cflags, *lookup_spec, *look])]
            if a.lookup_first:
                configs += [(f"ngram + corpus{tag} + eagle {h}", ["--speculative", "eagle", *head_of(h), "--spec-ngram",
                                                                 "3", *look, *cflags, *spec]) for h in a.eagle]
    if a.spec_corpus_learn:
        lflags = ["--spec-corpus-learn", str(a.spec_corpus_learn)]
        configs += [("ngram + learn", ["--speculative", "ngram", *lflags, *lookup_spec, *look])]
        if a.spec_corpus:
            configs += [("ngram + corpus + learn", ["--speculative", "ngram", "--spec-corpus", a.spec_corpus, *lflags,
                                                    *lookup_spec, *look])]
    for p in p_mins[1:]:  # each draft or head server again with each further threshold
        configs += [(f"{name}, p_min {p}", [*flags[:-1], p]) for name, flags in configs
                    if flags[-2:] == ["--spec-p-min", p_mins[0]]]
    if a.only:  # the server without speculation always runs: every ratio is to it
        keep = [k.strip() for k in a.only.split(",")]
        configs = [c for c in configs if c[0] == "none" or any(c[0].startswith(k) for k in keep)]
    speeds = {}  # (name, batch) -> tok/s of each round
    try:
        for rnd in range(a.rounds):
            for name, flags in configs:
                env = dict(os.environ, SHARDLM_SPEC_PRIOR="0") if a.no_prior and flags else None
                launcher = ("mpirun", "--oversubscribe", "-n", str(a.ranks)) if a.ranks > 1 else ()
                with TS.Server(a.shardlm, Path(a.model), "--threads", str(a.threads), *a.serve_arg, *flags,
                               name="bench-spec", env=env, launcher=launcher) as srv:
                    if a.warm:  # every server: the same prefix-cache hits before the measured runs
                        run(srv, prompts, a.max_tokens, 1, a.temperature, a.json_schema)  # learned, not measured
                    for parallel in batches:
                        r = run(srv, prompts, a.max_tokens, parallel, a.temperature, a.json_schema)
                        speeds.setdefault((name, parallel), []).append(r[1] / r[2])
                        if (name, parallel) not in out or r[1] / r[2] > out[(name, parallel)][1] / out[(name, parallel)][2]:
                            out[(name, parallel)] = r
                    with srv.client(timeout=60) as c:
                        st = c.server_stats()
                    if flags:
                        rate = st.spec_accepted_tokens / st.spec_draft_tokens if st.spec_draft_tokens else 0.0
                        look = st.spec_lookup_draft_tokens
                        share = (f"; prompt lookup drafted {look}, accepted {st.spec_lookup_accepted_tokens} "
                                 f"({100 * st.spec_lookup_accepted_tokens / look:.1f}%)"
                                 if look and look < st.spec_draft_tokens else "")
                        corpus = st.spec_corpus_draft_tokens
                        if corpus:
                            share += (f"; the corpus drafted {corpus}, accepted {st.spec_corpus_accepted_tokens} "
                                      f"({100 * st.spec_corpus_accepted_tokens / corpus:.1f}%)")
                        print(f"{name}: {st.spec_draft_tokens} draft tokens, {st.spec_accepted_tokens} accepted "
                              f"({100 * rate:.1f}%){share}")
    finally:
        TS.kill_all()
    if a.rounds > 1:
        for (name, parallel), v in speeds.items():
            print(f"{name}, batch {parallel}: rounds " + " / ".join(f"{x:.1f}" for x in v) + " tok/s (the best kept)")
        # This VM's speed moves between minutes: each round's ratio to the same round's server
        # without speculation (started just before) is steadier than the best of each.
        for (name, parallel), v in speeds.items():
            if name != "none":
                r = sorted(x / y for x, y in zip(v, speeds[("none", parallel)]))
                print(f"{name}, batch {parallel}: ratio to the same round's server without speculation " +
                      " / ".join(f"{x:.2f}x" for x in r) + f", median {statistics.median(r):.2f}x")
    for name, _ in configs[1:]:
        for parallel in batches:
            (a0, n0, t0), (a1, n1, t1) = out[("none", parallel)], out[(name, parallel)]
            same = sum(x == y for x, y in zip(a0, a1))
            print(f"{name}, batch {parallel:2d}: decode {n0 / t0:8.1f} tok/s without, {n1 / t1:8.1f} tok/s with "
                  f"speculation: {(n1 / t1) / (n0 / t0):.2f}x; {same} of {len(a0)} answers identical")
    if a.llama_lookup:
        b0, m0, u0, _, _ = llama_lookup(a.llama_lookup, a.model, prompts, a.max_tokens, a.threads, 0)
        b1, m1, u1, d1, k1 = llama_lookup(a.llama_lookup, a.model, prompts, a.max_tokens, a.threads, a.spec_draft)
        same = sum(x == y for x, y in zip(b0, b1))
        (a0, n0, t0), (a1, n1, t1) = out[("none", 1)], out[("ngram", 1)]
        print(f"llama.cpp llama-lookup, batch 1: decode {m0 / u0:8.1f} tok/s without ({m0} tokens), {m1 / u1:8.1f} "
              f"tok/s with --spec-draft-n-max {a.spec_draft} ({m1} tokens): {(m1 / u1) / (m0 / u0):.2f}x; "
              f"{d1} drafted, {k1} accepted ({100 * k1 / max(d1, 1):.1f}%); {same} of {len(b0)} answers identical")
        print(f"shardlm / llama.cpp at batch 1: without speculation {(n0 / t0) / (m0 / u0):.2f}x, with "
              f"{(n1 / t1) / (m1 / u1):.2f}x")
    if a.llama_server and 1 in batches:
        # llama-server's prompt lookup (ngram-simple: a match of --spec-ngram 3 tokens, --spec-draft
        # tokens drafted, as shardlm's here), a.rounds rounds alternating with it plain.
        flags = ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "3", "--spec-ngram-simple-size-m",
                 str(a.spec_draft)]
        rounds = []
        for _ in range(a.rounds):
            b0, m0, u0, _, _ = llama_server(a.llama_server, a.model, prompts, a.max_tokens, a.threads)
            b1, m1, u1, d1, k1 = llama_server(a.llama_server, a.model, prompts, a.max_tokens, a.threads, flags)
            rounds.append((m0 / u0, m1 / u1))
            same = sum(x == y for x, y in zip(b0, b1))
            print(f"llama-server, batch 1: decode {m0 / u0:8.1f} tok/s without, {m1 / u1:8.1f} tok/s with "
                  f"{' '.join(flags)}: {(m1 / u1) / (m0 / u0):.2f}x; {d1} drafted, {k1} accepted "
                  f"({100 * k1 / max(d1, 1):.1f}%); {same} of {len(b0)} answers identical")
        r = [y / x for x, y in rounds]
        print("llama-server, batch 1: ratios " + " / ".join(f"{x:.2f}x" for x in sorted(r)) +
              f", median {statistics.median(r):.2f}x; without speculation median "
              f"{statistics.median(x for x, _ in rounds):.1f} tok/s against shardlm's "
              f"{statistics.median(speeds[('none', 1)]):.1f}")
    if a.llama_speculative and 1 in batches:
        # Its own baseline: llama-speculative-simple refuses a draft length of 0 (an assertion),
        # so the decode without speculation is llama-lookup's at --spec-draft-n-max 0 when given.
        b1, m1, u1, d1, k1 = llama_lookup(a.llama_speculative, a.model, prompts, a.max_tokens, a.threads,
                                          a.spec_draft, ("-md", a.llama_draft, "--spec-type", "draft-simple"))
        (a0, n0, t0), (a1, n1, t1) = out[("none", 1)], out[("draft " + a.llama_draft, 1)]
        print(f"llama.cpp llama-speculative-simple -md {a.llama_draft}, batch 1: decode {m1 / u1:8.1f} tok/s with "
              f"--spec-draft-n-max {a.spec_draft} ({m1} tokens), {d1} drafted, {k1} accepted "
              f"({100 * k1 / max(d1, 1):.1f}%)")
        if a.llama_lookup:  # (the two programs print their answers differently: not compared)
            print(f"  against llama-lookup without drafts ({m0 / u0:.1f} tok/s): {(m1 / u1) / (m0 / u0):.2f}x")
        print(f"shardlm / llama.cpp at batch 1 with the same draft: {(n1 / t1) / (m1 / u1):.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
