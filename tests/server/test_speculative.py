#!/usr/bin/env python3
"""Prompt-lookup speculative decoding (issue 29, `shardlm serve --speculative ngram`): greedy output
byte-identical to a server without speculation, over stories260K (SentencePiece, f32) and
SmolLM2-135M-Instruct (byte-level BPE, a GGUF served as quantized blocks) when its file is there:
one request at a time and 16 at once (the drafts verified inside the continuous batch; SmolLM2's
blocks one at a time only: see compare), with
stop strings and max_tokens that end a sample in the middle of accepted drafts, beside sampled
and penalised requests whose seeded output must not change either, and at tp 2 under mpirun.
GetServerStats must show drafts verified and accepted (the test fails if speculation never ran).
per_request: the request fields (gRPC speculative / speculative_n_max, HTTP speculative /
speculative.n_max), their refusals by name, and the adaptive rule's backoffs.
The sampled distribution itself: test_speculative_sampling.py.

  test_speculative.py --shardlm BUILD/cli/shardlm --model DIR [--gguf SMOLLM2.gguf]
SKIP (77) without the model or the Python client.
"""
import argparse
import concurrent.futures as cf
import os
import re
import shutil
import sys
from pathlib import Path

SKIP = 77
sys.dont_write_bytecode = True
sys.path.insert(0, str(Path(__file__).resolve().parent))
import test_server as TS  # noqa: E402
from checks import Checks  # noqa: E402

check = Checks()


PROMPTS = ["Once upon a time", "The little dog", "Lily and Ben went to the park", "Tom had a red ball. Tom had a red",
           "She said: I like the cat. The cat said: I like", "One day, a girl named Sue", "The sun was hot and the sky",
           "Bob and his mom went to the store to buy"]


def answers(srv, chat, n_parallel, prompts=PROMPTS, max_tokens=60):
    """16 requests over the prompts, greedy, as (text, finish) pairs; n_parallel requests in flight
    at once (test_speculative_corpus.py too)."""
    def one(i):
        p = prompts[i % len(prompts)]
        kw = dict(max_tokens=max_tokens + 17 * (i % 5), temperature=0)
        if i % 3 == 1:
            kw["stop"] = [" the "]  # a stop string that lands in the middle of drafted text
        with srv.client(timeout=120) as c:
            g = c.chat([{"role": "user", "content": p}], **kw) if chat else c.generate(p, **kw)
            return g.text, g.finish_reason
    with cf.ThreadPoolExecutor(n_parallel) as ex:
        return list(ex.map(one, range(16)))


def others(srv, chat, prompt=PROMPTS[0]):
    """Sampled and penalised requests beside the greedy ones (they draft too, and each row's token
    is sampled with the uniform a plain step draws): their output with a seed must not change."""
    out = []
    with srv.client(timeout=120) as c:
        for kw in (dict(temperature=0.8, seed=5), dict(temperature=0, repetition_penalty=1.3),
                   dict(temperature=0, presence_penalty=0.5)):
            p = [{"role": "user", "content": prompt}]
            g = c.chat(p, max_tokens=40, **kw) if chat else c.generate(prompt, max_tokens=40, **kw)
            out.append(g.text)
    return out


def compare(a, model, name, chat, launcher=(), extra=(), batch=True, draft=4, tight=False):
    """batch False: a model whose logits depend on how many rows a step holds (a GGUF's blocks: under
    32 rows int8 products, from 32 on dequantized ones, docs/quantization.md) is compared one request
    at a time only, where a step holds its one row plus its drafts (under 32). draft: --spec-draft;
    at 8 a verification brings 9 rows, which with SmolLM2's 3 query heads per KV head (27 query
    vectors) or stories260K's 2 (18) is what the CPU attention would take through its tiles (from
    16) were the rows not marked as verifying (kernels/cpu/attention.c: another rounding, and 6 of
    24 SQuAD answers changed at 6 drafts before the mark)."""
    runs = {}
    for spec in (False, True):
        args = list(extra) + (["--speculative", "ngram", "--spec-draft", str(draft), "--spec-max-batch", "16"] if spec else [])
        with TS.Server(a.shardlm, Path(model), *args, name=name + ("-spec" if spec else ""), launcher=launcher) as srv:
            seq, par, oth = answers(srv, chat, 1), answers(srv, chat, 16), others(srv, chat)
            with srv.client(timeout=60) as c:
                st = c.server_stats()
            runs[spec] = (seq, par, oth, st)
    (s0, p0, o0, _), (s1, p1, o1, st) = runs[False], runs[True]
    check(s0 == s1, f"{name}: 16 greedy requests one at a time: identical with speculation "
          f"({sum(x == y for x, y in zip(s0, s1))} of 16 equal)")
    if batch:
        check(p0 == p1, f"{name}: 16 greedy requests at once: identical with speculation "
              f"({sum(x == y for x, y in zip(p0, p1))} of 16 equal)")
        check(s0 == p0, f"{name}: batch invariance without speculation (one at a time = 16 at once)")
    else:
        print(f"note {name}: not batch-invariant without speculation either ({sum(x == y for x, y in zip(s0, p0))} "
              f"of 16 equal at 16 at once): compared one at a time only")
    check(o0 == o1, f"{name}: sampled and penalised requests unchanged with speculation")
    if tight:
        check(st.preemptions > 0, f"{name}: the pool is tight ({st.preemptions} preemptions with speculation)")
    check(st.spec_draft_tokens > 0 and 0 < st.spec_accepted_tokens <= st.spec_draft_tokens,
          f"{name}: speculation ran: {st.spec_draft_tokens} draft tokens, {st.spec_accepted_tokens} accepted")
    check((st.spec_lookup_draft_tokens, st.spec_lookup_accepted_tokens) == (st.spec_draft_tokens,
                                                                          st.spec_accepted_tokens),
          f"{name}: every draft counted as prompt lookup's ({st.spec_lookup_draft_tokens} drafted, "
          f"{st.spec_lookup_accepted_tokens} accepted)")


def per_request(a):
    """The per-request fields and the adaptive rule: speculative "off" (gRPC) and "speculative":
    "off" / "speculative.n_max": 0 (HTTP) never draft; speculative_n_max caps a step's drafts; an
    unknown value is refused naming the field; long sampled outputs back some sequences off
    (spec_backoffs); the greedy output of an opted-out request equals the drafting one's."""
    import grpc
    import json
    import urllib.error
    import urllib.request
    prompt = "Tom had a red ball. Tom had a red ball. Tom had a red ball. Tom had a red"
    args = ["--speculative", "ngram", "--spec-draft", "4", "--spec-max-batch", "16"]
    with TS.Server(a.shardlm, Path(a.model), *args, name="spec-per-request", http=True) as srv:
        with srv.client(timeout=120) as c:
            def drafted():
                return c.server_stats().spec_draft_tokens
            d0 = drafted()
            g_off = c.generate(prompt, max_tokens=60, temperature=0, speculative="off")
            d1 = drafted()
            check(d1 == d0, f"speculative off: no drafts ({d1 - d0})")
            g_on = c.generate(prompt, max_tokens=60, temperature=0, speculative="auto")
            d2 = drafted()
            check(d2 > d1, f"speculative auto: drafts ({d2 - d1})")
            check(g_on.text == g_off.text, "greedy output equal with and without the request's speculation")
            c.generate(prompt, max_tokens=60, temperature=0, speculative_n_max=1)
            d3 = drafted()
            check(0 < d3 - d2 <= 59, f"speculative_n_max 1: at most one draft per step ({d3 - d2} for 60 tokens)")
            try:
                c.generate(prompt, max_tokens=4, speculative="sometimes")
                check(False, "speculative 'sometimes' refused")
            except grpc.RpcError as e:
                check(e.code() == grpc.StatusCode.INVALID_ARGUMENT and "sampling.speculative" in e.details(),
                      f"speculative 'sometimes' refused naming the field: {e.code().name} {e.details()}")
            try:
                c.generate(prompt, max_tokens=4, speculative_n_max=99)
                check(False, "speculative_n_max 99 refused")
            except grpc.RpcError as e:
                check(e.code() == grpc.StatusCode.INVALID_ARGUMENT and "speculative_n_max" in e.details(),
                      f"speculative_n_max 99 refused naming the field: {e.details()}")

            def post(body):
                req = urllib.request.Request(srv.base + "/v1/completions", data=json.dumps(body).encode(),
                                             headers={"Content-Type": "application/json"}, method="POST")
                try:
                    with urllib.request.urlopen(req, timeout=60) as r:
                        return r.status, json.loads(r.read())
                except urllib.error.HTTPError as e:
                    return e.code, json.loads(e.read() or b"{}")
            base = {"model": "stories260K", "prompt": prompt, "max_tokens": 40, "temperature": 0}
            for extra in ({"speculative": "off"}, {"speculative.n_max": 0}):
                before = drafted()
                code, _ = post(dict(base, **extra))
                check(code == 200 and drafted() == before, f"HTTP {extra}: answered, no drafts")
            before = drafted()
            code, _ = post(dict(base, speculative="auto"))
            check(code == 200 and drafted() > before, "HTTP speculative auto: drafts")
            code, _ = post(dict(base, **{"speculative.p_min": 0.5}))  # a draft model's; prompt lookup drafts on
            check(code == 200, f"HTTP speculative.p_min 0.5: answered ({code})")
            for extra, name in (({"speculative": "maybe"}, "speculative"), ({"speculative": True}, "speculative"),
                                ({"speculative.n_max": -2}, "speculative.n_max"),
                                ({"speculative.p_min": 1.5}, "speculative.p_min"),
                                ({"speculative.p_min": "high"}, "speculative.p_min")):
                code, body = post(dict(base, **extra))
                msg = json.dumps(body)
                check(code == 400 and name in msg, f"HTTP {extra} refused naming the field: {code} {msg[:160]}")

            # The adaptive rule: sampled continuations of a repetitive prompt are often rejected;
            # some sequences must back off (at least SPEC_WINDOW drafts below 1/4 accepted).
            st0 = c.server_stats()
            with cf.ThreadPoolExecutor(8) as ex:
                list(ex.map(lambda i: c.generate(prompt, max_tokens=200, temperature=1.5, seed=i, ignore_eos=True),
                            range(16)))
            st1 = c.server_stats()
            drafts, acc = st1.spec_draft_tokens - st0.spec_draft_tokens, st1.spec_accepted_tokens - st0.spec_accepted_tokens
            check(st1.spec_backoffs > st0.spec_backoffs,
                  f"adaptive rule: {st1.spec_backoffs - st0.spec_backoffs} backoffs over 16 sampled outputs "
                  f"({drafts} drafts, {acc} accepted)")
        code, text = 0, ""
        try:
            with urllib.request.urlopen(srv.base + "/metrics", timeout=30) as r:
                code, text = r.status, r.read().decode()
        except urllib.error.URLError as e:
            text = str(e)
        check("shardlm_spec_decode_num_backoffs_total" in text, "/metrics has the backoff counter")
        look = re.search(r"^shardlm_spec_decode_num_lookup_draft_tokens_total(?:\{[^}]*\})? (\S+)$", text, re.M)
        check(look is not None and float(look.group(1)) == st1.spec_lookup_draft_tokens > 0,
              f"/metrics counts prompt lookup's drafts as GetServerStats does ({look and look.group(1)} against "
              f"{st1.spec_lookup_draft_tokens})")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shardlm", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--gguf", default=None)
    a = ap.parse_args()
    if not os.path.isdir(a.model):
        print(f"SKIP: no model at {a.model}")
        return SKIP
    try:
        per_request(a)
        compare(a, a.model, "stories260K", chat=False)
        compare(a, a.model, "stories260K, 8 drafts", chat=False, draft=8)
        # Steps of 48 rows (before, no logits rows were left for drafts: speculation silently never
        # ran) over a pool of 40 four-token blocks, less than 16 answers at once need: drafts
        # ride on the blocks there are and never preempt (test_scheduler.c), the answers unchanged.
        compare(a, a.model, "stories260K, 48-row steps, a tight pool", chat=False,
                extra=["--max-seqs", "16", "--max-batch-tokens", "48", "--block-tokens", "4", "--kv-cache-blocks", "40"], tight=True)
        if shutil.which("mpirun"):
            os.environ.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                              OMPI_MCA_rmaps_base_oversubscribe="1", OMPI_MCA_btl_vader_single_copy_mechanism="none")
            compare(a, a.model, "stories260K tp 2", chat=False, launcher=["mpirun", "--oversubscribe", "-n", "2"],
                    extra=["--tp", "2"])
        else:
            print("SKIP tp 2: no mpirun")
        if a.gguf and os.path.exists(a.gguf):
            compare(a, a.gguf, "SmolLM2 chat", chat=True, batch=False)
            compare(a, a.gguf, "SmolLM2 chat, 8 drafts", chat=True, batch=False, draft=8)
        else:
            print("SKIP SmolLM2: no GGUF (tools/fetch_smollm2.sh)")
    finally:
        TS.kill_all()
    return check.summary()


if __name__ == "__main__":
    sys.exit(main())
