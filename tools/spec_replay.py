#!/usr/bin/env python3
"""tools/spec_replay.py - how far prompt lookup can go on a workload, without the model: the greedy
outputs of SQuAD held-out questions (the prompts tools/bench_speculative.py sends, rendered by the
GGUF's own chat template with jinja2) are generated once by a plain server, with every prompt
token's id (prompt_logprobs 0), and prompt lookup is replayed offline. With greedy decoding a draft
is accepted exactly as far as it equals the recorded continuation, so any drafting rule can be
scored. A step that verifies d drafts costs 1 + c d plain steps (c: a verification row's cost in
plain steps; about 0.125 on the 2-core VMs of docs/speculative.md). Prints, per rule and draft
limit K (the adaptive length of conductor_speculate.c: +2 after a step that accepted every draft,
else -1), the speed-up at each c, the acceptance, and an oracle that copies from the best earlier
position. With --open N the requests are everyday ones instead (bench_speculative.py's OPEN_PROMPTS
and N held-out chat turns), and with --corpus FILE the replay is prompt lookup then serve
--spec-corpus's drafts (the Corpus class: the rule of engine/serving/spec_corpus.h) over a grid of
its n_min and p_min; --learn replays serve --spec-corpus-learn (each request's output joins the
corpus before the next request). Not a test.

  python3 tools/spec_replay.py --shardlm build/cli/shardlm --model FILE.gguf
      [--squad .cache/chat-data/squad_eval.json] [--questions 200] [--max-tokens 64] [--trace FILE.json]
      [--open N --held-out FILE.jsonl] [--corpus ANSWERS.jsonl [--corpus-end TEXT]] [--learn] [--serve-arg=ARG ...]
"""
import argparse
import bisect
import collections
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "server"))
import bench_speculative as BS  # noqa: E402  (beside this file)
import test_server as TS  # noqa: E402


def lookup(t, ngram, k, n_min=2, longest=False, cap=64):
    """Drafts for context t: conductor_speculate.c's lookup_draft (the last ngram down to n_min
    tokens, their latest earlier occurrence), or with longest the occurrence whose preceding
    tokens agree longest with t's."""
    n_tok = len(t)
    for n in range(ngram, n_min - 1, -1):
        if n_tok <= n:
            continue
        tail, best, best_len = t[n_tok - n:], -1, 0
        for at in range(n_tok - n - 1, -1, -1):
            if t[at:at + n] != tail:
                continue
            if not longest:
                best = at
                break
            ln = n
            while ln < cap and at - (ln - n) > 0 and t[at - (ln - n) - 1] == t[n_tok - ln - 1]:
                ln += 1
            if ln > best_len:
                best, best_len = at, ln
        if best >= 0 and t[best + n:best + n + k]:
            return t[best + n:best + n + k]
    return []


def replay(seqs, rule, limit, c):
    """-> (tokens per unit of cost, drafted, accepted) over every sequence."""
    tokens, steps, drafted, accepted = replay_counts(seqs, rule, limit)
    return tokens / (steps + c * drafted), drafted, accepted


def replay_counts(seqs, rule, limit):
    """-> (tokens, steps, drafted, accepted) over every sequence: a step costs 1 + c x its drafts."""
    tokens, steps, drafted, accepted = 0, 0, 0, 0
    for n_prompt, t in seqs:
        pos, length = n_prompt + 1, limit  # the first token comes from the prefill
        while pos < len(t):
            d = rule(t[:pos], length)
            a = 0
            while a < len(d) and pos + a < len(t) and d[a] == t[pos + a]:
                a += 1
            got = min(a + 1, len(t) - pos)
            tokens, steps, drafted, accepted = tokens + got, steps + 1, drafted + len(d), accepted + a
            if d:
                length = min(limit, length + 2) if a == len(d) else max(1, length - 1)
            pos += got
    return tokens, steps, drafted, accepted


def tree(t, k, rows, ngram=3, n_min=1):
    """A tree of drafts for context t: the continuations (up to k tokens) of every earlier
    occurrence of the last ngram down to n_min tokens, longest match first, latest first, merged
    into a trie of at most rows nodes (one verification row each). -> the set of its nodes (token
    tuples; a node's tokens are its path from the root)."""
    n_tok, nodes = len(t), set()
    for n in range(ngram, n_min - 1, -1):
        if n_tok <= n:
            continue
        tail = t[n_tok - n:]
        for at in range(n_tok - n - 1, -1, -1):
            if t[at:at + n] != tail:
                continue
            cont = tuple(t[at + n:at + n + k])
            for i in range(1, len(cont) + 1):
                if len(nodes) >= rows:
                    return nodes
                nodes.add(cont[:i])
    return nodes


def replay_tree(seqs, k, rows, c):
    """-> (tokens per unit of cost, rows verified, tokens accepted, steps) with tree drafts: a step
    verifies every node of the tree and keeps the longest path that equals the continuation."""
    tokens, cost, drafted, accepted, steps = 0, 0.0, 0, 0, 0
    for n_prompt, t in seqs:
        pos = n_prompt + 1
        while pos < len(t):
            nodes = tree(t[:pos], k, rows)
            a = 0
            while pos + a < len(t) and tuple(t[pos:pos + a + 1]) in nodes:
                a += 1
            got = min(a + 1, len(t) - pos)
            tokens, cost, drafted, accepted = tokens + got, cost + 1 + c * len(nodes), drafted + len(nodes), accepted + a
            pos, steps = pos + got, steps + 1
    return tokens / cost, drafted, accepted, steps


def oracle(seqs, limit):
    """Tokens per step when each step copies the longest span (at most limit) that any earlier
    position continues with, verification free."""
    tokens = steps = 0
    for n_prompt, t in seqs:
        pos = n_prompt + 1
        while pos < len(t):
            best = 0
            for at in range(pos):
                a = 0
                while a < limit and pos + a < len(t) and at + a < pos and t[at + a] == t[pos + a]:
                    a += 1
                best = max(best, a)
            got = min(best + 1, len(t) - pos)
            tokens, steps, pos = tokens + got, steps + 1, pos + got
    return tokens / steps


class Corpus:
    """serve --spec-corpus's rule (engine/serving/spec_corpus.h), written again over sorted tuples:
    the longest match of the context's last n >= n_min tokens (up to 32) whose occurrences go on,
    then the continuation most of them share while the share stays >= p_min."""
    SPAN = 64

    def __init__(self, texts):
        self.keys = sorted(k for t in texts for k in self.spans(t))
        self.n_tokens = len(self.keys)

    def spans(self, t):
        """The suffixes of one text, SPAN tokens at most (a text's end stops a comparison)."""
        t = list(t)
        return [tuple(t[i:i + self.SPAN]) for i in range(len(t)) if t[i] >= 0]

    def add(self, t):
        """One more text (serve --spec-corpus-learn: an answer after its prompt's last tokens)."""
        for k in self.spans(t):
            bisect.insort(self.keys, k)
        self.n_tokens = len(self.keys)

    def occurrences(self, pat):
        pat = tuple(pat)
        lo, hi = bisect.bisect_left(self.keys, pat), bisect.bisect_left(self.keys, pat + (1 << 40,))
        return [i for i in range(lo, hi) if len(self.keys[i]) > len(pat)]

    def matched(self, ctx, n_min=3):
        """n*: the longest match (up to 32) of ctx's last tokens whose occurrences go on; 0 if none."""
        best = 0
        for n in range(n_min, min(32, len(ctx)) + 1):
            if not self.occurrences(ctx[len(ctx) - n:]):
                break
            best = n
        return best

    def draft(self, ctx, k, n_min=3, p_min=0.1):
        best = None
        for n in range(n_min, min(32, len(ctx)) + 1):
            occ = self.occurrences(ctx[len(ctx) - n:])
            if not occ:
                break
            best = (n, occ)
        if not best:
            return []
        o, occ = best
        out, share = [], 1.0
        while len(out) < k and o < self.SPAN:
            c = collections.Counter(self.keys[i][o] for i in occ if len(self.keys[i]) > o)
            if not c:
                break
            tok, cnt = max(c.items(), key=lambda x: (x[1], -x[0]))
            share *= cnt / len(occ)
            if share < p_min:
                break
            out.append(tok)
            occ = [i for i in occ if len(self.keys[i]) > o and self.keys[i][o] == tok]
            o += 1
        return out


def corpus_texts(a):
    """--corpus's model turns, tokenized by a server as the engine reads them (each assistant
    turn's content encoded on its own, then --corpus-end's id), cached beside the trace."""
    cache = Path(a.trace + ".corpus.json") if a.trace else None
    if cache and cache.exists():
        return json.loads(cache.read_text())
    turns = [m["content"] for line in open(a.corpus) for m in json.loads(line)["messages"] if m["role"] == "assistant"]
    try:
        with TS.Server(a.shardlm, Path(a.model), *a.serve_arg, name="spec-replay") as srv, srv.client(timeout=600) as cl:
            end = cl.tokenize(a.corpus_end, add_bos=False)
            texts = [cl.tokenize(t, add_bos=False) + end for t in turns]
    finally:
        TS.kill_all()
    if cache:
        cache.write_text(json.dumps(texts))
    return texts


def generate(a, prompts):
    """[(prompt length, prompt ids + greedy output ids)] from a plain server."""
    seqs = []
    try:
        with TS.Server(a.shardlm, Path(a.model), *a.serve_arg, name="spec-replay") as srv, srv.client(timeout=600) as cl:
            for p in prompts:
                kw = dict(max_tokens=a.max_tokens, temperature=0, prompt_logprobs=0)
                # a GGUF without a chat template: the server's own (--chat-template) through Chat
                g = cl.generate(p, **kw) if a.rendered else cl.chat([{"role": "user", "content": p}], **kw)
                ids = [x.token_id for x in g.prompt_logprobs]
                seqs.append((len(ids), ids + list(g.token_ids)))
    finally:
        TS.kill_all()
    return seqs


LEARN_LEAD = 4  # engine/serving/spec_corpus.h SPEC_LEARN_LEAD
FIRST_MATCH = 24  # SPEC_CORPUS_FIRST_MATCH: a corpus match this long drafts before prompt lookup


def lookup_then_corpus(corpus, t, k, n_min=3, p_min=0.5):
    """conductor_speculate.c's order: the corpus where its match is FIRST_MATCH tokens or more, else
    prompt lookup, then the corpus where lookup finds nothing."""
    if not corpus.n_tokens:
        return lookup(t, 3, k)
    if corpus.matched(t, n_min) >= FIRST_MATCH:
        return corpus.draft(t, k, n_min, p_min) or lookup(t, 3, k)
    return lookup(t, 3, k) or corpus.draft(t, k, n_min, p_min)


def replay_learned(seqs, rule_of, limit):
    """replay_counts with serve --spec-corpus-learn: each request drafts from the corpus as it stands,
    then its output (after the prompt's last LEARN_LEAD tokens) joins it. rule_of(corpus) -> rule;
    the corpus is made by rule_of's owner and grows here."""
    corpus, rule = rule_of()
    total = [0, 0, 0, 0]
    for n_prompt, t in seqs:
        for i, x in enumerate(replay_counts([(n_prompt, t)], rule, limit)):
            total[i] += x
        corpus.add(list(t[n_prompt - LEARN_LEAD:]) + [-1])
    return tuple(total)


def replay_learn(a, seqs, texts):
    """Learning from the served answers (in the order served), with and without a given corpus."""
    n_out = sum(len(t) - n for n, t in seqs)
    print(f"{len(seqs)} requests in order, greedy: {n_out} generated tokens; given corpus: {len(texts)} texts")
    cs = (0.125, 0.25, 0.4)
    print("| drafter (n_min 3, p_min 0.5) | K | " + " | ".join(f"c = {c}" for c in cs) + " | drafted | acceptance |")
    print("| --- | --- | " + " | ".join("---" for _ in cs) + " | --- | --- |")

    def chain(given):
        def make():
            corpus = Corpus(texts if given else [])
            return corpus, lambda t, k: lookup_then_corpus(corpus, t, k)
        return make
    runs = [("prompt lookup", lambda: (Corpus([]), lambda t, k: lookup(t, 3, k)), False),
            ("lookup, then the corpus learned from the answers", chain(False), True)]
    if texts:
        runs += [("lookup, then the given corpus", chain(True), False),
                 ("lookup, then the given corpus and the learned", chain(True), True)]
    for name, make, learn in runs:
        for k in (3, 4):
            counts = replay_learned(seqs, make, k) if learn else replay_counts(seqs, make()[1], k)
            tokens, steps, drafted, accepted = counts
            print(f"| {name} | {k} | " + " | ".join(f"{tokens / (steps + c * drafted):.2f}x" for c in cs) +
                  f" | {drafted} | {100 * accepted / max(1, drafted):.0f} % |", flush=True)
    return 0


def replay_corpus(a, seqs, texts):
    """Prompt lookup alone against lookup then the corpus, over a grid of n_min and p_min."""
    corpus = Corpus(texts)
    n_out = sum(len(t) - n for n, t in seqs)
    print(f"{len(seqs)} requests, {a.max_tokens} tokens at most, greedy: {n_out} generated tokens; corpus: "
          f"{len(texts)} texts, {corpus.n_tokens} tokens from {a.corpus}; model {a.model}")
    cs = (0.125, 0.25, 0.4)
    print("| drafter | K | " + " | ".join(f"c = {c}" for c in cs) + " | drafted | acceptance |")
    print("| --- | --- | " + " | ".join("---" for _ in cs) + " | --- | --- |")

    def both(n_min, p_min):
        return lambda t, k: lookup_then_corpus(corpus, t, k, n_min, p_min)
    rules = [("prompt lookup", lambda t, k: lookup(t, 3, k))]
    rules += [(f"lookup, then the corpus (n_min {n}, p_min {p})", both(n, p))
              for n in (2, 3, 4) for p in (0.0, 0.1, 0.2, 0.3, 0.5)]
    rules += [("the corpus alone (n_min 3, p_min 0.1)", lambda t, k: corpus.draft(t, k, 3, 0.1))]
    for name, rule in rules:
        for k in (3, 4, 6):
            # the drafts do not depend on c: one pass, costed at each (tokens / (steps + c drafted))
            tokens, steps, drafted, accepted = replay_counts(seqs, rule, k)
            print(f"| {name} | {k} | " + " | ".join(f"{tokens / (steps + c * drafted):.2f}x" for c in cs) +
                  f" | {drafted} | {100 * accepted / max(1, drafted):.0f} % |", flush=True)
    return 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shardlm", required=True)
    ap.add_argument("--model", required=True, help="a GGUF (its chat template renders the prompts; without one, "
                    "the server's template through Chat)")
    ap.add_argument("--squad", default=str(ROOT / ".cache" / "chat-data" / "squad_eval.json"))
    ap.add_argument("--questions", type=int, default=200)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--serve-arg", action="append", default=[],
                    help="one more argument for the server (repeat: --serve-arg=--lora --serve-arg=NAME=DIR)")
    ap.add_argument("--open", type=int, default=None, metavar="N", help="everyday requests instead of SQuAD: "
                    "bench_speculative.py's OPEN_PROMPTS and the first user turns of the last N lines of --held-out")
    ap.add_argument("--held-out", default="", help="a chat JSONL whose conversations no corpus holds (--open)")
    ap.add_argument("--corpus", help="a chat JSONL of the model's own answers (tools/distill_data.py): replays "
                    "prompt lookup, then serve --spec-corpus's drafts where it finds nothing")
    ap.add_argument("--corpus-end", default="<end_of_turn>", help="the text of the end of a model turn (its id "
                    "ends every corpus text, as the chat template's training rendering does; default Gemma's)")
    ap.add_argument("--learn", action="store_true", help="replay serve --spec-corpus-learn: each request's output "
                    "joins the corpus (with --corpus: after the given one) before the next request")
    ap.add_argument("--trace", help="a JSON file: read the token sequences from it when it exists (no server), "
                    "else write them there after generating")
    a = ap.parse_args()
    try:
        template = BS.gguf_template(a.model)
    except KeyError:
        template = None
    a.rendered = template is not None
    if a.open is not None:
        held = [json.loads(x)["messages"][0]["content"] for x in open(a.held_out)][-a.open:] if a.open else []
        asked, what = list(BS.OPEN_PROMPTS) + held, "everyday requests"
    else:
        asked, what = BS.squad_prompts(a.squad, a.questions), "SQuAD held-out questions"
    prompts = [template.render(messages=[{"role": "user", "content": p}], add_generation_prompt=True) if template else p
               for p in asked]
    if a.trace and Path(a.trace).exists():
        seqs = [tuple(x) for x in json.loads(Path(a.trace).read_text())]
    else:
        seqs = generate(a, prompts)
        if a.trace:
            Path(a.trace).write_text(json.dumps(seqs))
    n_out = sum(len(t) - n for n, t in seqs)
    if a.learn:
        return replay_learn(a, seqs, corpus_texts(a) if a.corpus else [])
    if a.corpus:
        return replay_corpus(a, seqs, corpus_texts(a))
    print(f"{len(seqs)} {what}, {a.max_tokens} tokens at most, greedy: {n_out} generated tokens, "
          f"median prompt {sorted(n for n, _ in seqs)[len(seqs) // 2]} tokens; model {a.model}")
    rules = {"shardlm's (last 3 then 2 tokens, latest occurrence)": lambda t, k: lookup(t, 3, k),
             "longest agreeing context": lambda t, k: lookup(t, 3, k, longest=True),
             "down to the last 1 token": lambda t, k: lookup(t, 3, k, n_min=1)}
    print("| rule | K | c = 0.125 | c = 0.25 | c = 0 | acceptance |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name, rule in rules.items():
        for k in (2, 4, 8, 32):
            r = [replay(seqs, rule, k, c) for c in (0.125, 0.25, 0.0)]
            print(f"| {name} | {k} | {r[0][0]:.2f}x | {r[1][0]:.2f}x | {r[2][0]:.2f}x | "
                  f"{100 * r[0][2] / max(1, r[0][1]):.0f} % |")
    print("| tree drafter (every earlier occurrence of the last 3, 2, 1 tokens) | K | rows R | c = 0.125 | c = 0.25 | c = 0 "
          "| rows / step | tokens / step |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for k, rows in ((4, 4), (4, 8), (4, 16), (8, 8), (8, 16), (8, 32), (16, 32), (16, 64)):
        r = [replay_tree(seqs, k, rows, c) for c in (0.125, 0.25, 0.0)]
        _, drafted, accepted, steps = r[0]
        print(f"| tree | {k} | {rows} | {r[0][0]:.2f}x | {r[1][0]:.2f}x | {r[2][0]:.2f}x | "
              f"{drafted / steps:.1f} | {(accepted + steps) / steps:.2f} |")
    print(f"oracle (copies the best earlier span, verification free): K 4 {oracle(seqs, 4):.2f}x, "
          f"K 8 {oracle(seqs, 8):.2f}x")


if __name__ == "__main__":
    main()
