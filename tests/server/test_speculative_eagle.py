#!/usr/bin/env python3
"""EAGLE heads served (issue 29, `shardlm serve --speculative eagle --draft-model HEAD.safetensors`;
docs/speculative.md, engine/serving/draft.c). Target: stories260K. The head, written by this test
with seeded random weights in EAGLE-1's layout (fc.weight (d, 2d) with the feature half near the
identity, fc.bias, one decoder layer without its attention norm; no final norm), reads the target's
own final hidden states, which the engine captures from the target's forwards.

1. The head's arithmetic against a float64 NumPy reference written only for this test: with
   SHARDLM_EAGLE_TRACE the server writes, for every proposal, its sequence's tokens (how many are
   real, the rest drafts of this step) and the head's best next token and logit. The reference runs
   the target over the real tokens (float64), the head over positions 1 .. (teacher-forced: the
   target's feature of the position before), then the chain over the drafts (each reading the
   head's own output at the position before), and must give the same best token, and its logit
   within a relative 1e-5, for every traced proposal: one request at a time and 8 at once, at 3 drafts a step,
   prefix caching off; and again with the prefix cache on (4-token blocks, the prompts run three
   times: the features of cached rows are the ones kept beside their K/V), and under preemption
   (8 at once over a pool of 40 four-token blocks, about half what they need). Both kinds of
   rows must occur (the first draft of a step, and drafts after drafts).
2. Greedy: every prompt's tokens equal the server without speculation, one at a time and 8 at once,
   with and without the prefix cache; drafts verified, some accepted, some rejected.
3. Sampled (temperature 1): the head's q is a real distribution, verified with the general rule; per
   generated position (5) a chi-square homogeneity test against the server without speculation,
   960 samples each with disjoint seeds, p > 0.001 / 5 (test_speculative_draft.py's samples).
4. A Q8_0 head (SHARDLM_EAGLE_WEIGHTS=q8_0: what a block-quantized target gets on the CPU): greedy
   tokens equal; every proposal against the reference run with the engine's quantized weights
   (ggml's Q8_0 rounding, in NumPy): the best token in >= 95 % of them, the best logit within a
   relative 1e-2 at the median and 6e-2 at worst (the engine also rounds each product's input to
   int8; a matrix misplaced or misquantized is off by far more).
5. --spec-p-min P (P the median of the head's best-token probabilities by the reference): greedy
   tokens equal; no proposal below P drafted, some above it; a request's speculative_p_min 0 lifts
   it, speculative_p_min 1.5 is INVALID_ARGUMENT naming the field.
6. The time gate, beside prompt lookup and alone: a head that costs time and never drafts
   (--spec-p-min 1) proposes 16 times, then at one opportunity in 16 at most (and only while its
   probes cost under 1/64 of the time), where with the gate off (SHARDLM_SPEC_PRIOR=0) it proposes
   at every one (counted in the trace); the greedy answers unchanged.
7. Refusals at start-up, by name: a head without one of its tensors, with a tensor of the wrong
   shape, for rotary of the other style; a target that cannot carry one (GPT-2's learned
   positions, the golden random GPT-2); --speculative eagle without --draft-model, --spec-p-min
   without a draft or outside [0, 1] (usage errors).
   (Targets whose layers are not Llama-style, Gemma 2 and a mixture of experts, carry the same
   Llama-style head: test_speculative_eagle_targets.py.)

  test_speculative_eagle.py --shardlm BUILD/cli/shardlm --model BUILD/golden/stories260K
SKIP (77) without the model, numpy, scipy or the Python client.
"""
import argparse
import concurrent.futures as cf
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

SKIP = 77
sys.dont_write_bytecode = True
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parents[1] / "tools"))
import test_server as TS  # noqa: E402
from checks import Checks  # noqa: E402
from test_speculative_draft import MAX_TOKENS, N, REQUESTS, samples  # noqa: E402
from test_speculative_sampling import chi2_position  # noqa: E402

check = Checks()

PROMPTS = ["Once upon a time", "The little dog", "Lily and Ben went to the park", "Tom had a red ball. Tom had a red",
           "One day, a girl named Sue", "The sun was hot and the sky", "Bob and his mom went to the store to buy",
           "The cat sat on the"]


def make_head(np, cfg, seed=7):
    """Random EAGLE-1 tensors for cfg (HF config.json), float32: name -> array."""
    rng = np.random.default_rng(seed)
    d, F = cfg["hidden_size"], cfg["intermediate_size"]
    H, KV = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim") or d // H
    r = lambda *s, sc=0.2: (rng.standard_normal(s) * sc).astype(np.float32)  # noqa: E731
    fc = r(d, 2 * d, sc=0.1)
    fc[:, d:] += np.eye(d, dtype=np.float32)
    return {"fc.weight": fc, "fc.bias": r(d, sc=0.05),
            "layers.0.self_attn.q_proj.weight": r(H * hd, d), "layers.0.self_attn.k_proj.weight": r(KV * hd, d),
            "layers.0.self_attn.v_proj.weight": r(KV * hd, d), "layers.0.self_attn.o_proj.weight": r(d, H * hd),
            "layers.0.post_attention_layernorm.weight": (1.0 + r(d, sc=0.1)).astype(np.float32),
            "layers.0.mlp.gate_proj.weight": r(F, d), "layers.0.mlp.up_proj.weight": r(F, d),
            "layers.0.mlp.down_proj.weight": r(d, F)}


def fit_fc(np, ref, head, seqs):
    """head with its fc fitted by ridge least squares so that fc([embed(x_p), f_{p-1}]) predicts f_p
    over the target's own greedy sequences (a linear EAGLE head: drafts worth accepting, so that
    acceptance and what follows it are exercised), and its layer's outputs damped (x 0.05: still
    computed, and checked against the reference, but small beside the fitted map)."""
    X, Y = [], []
    for ids in seqs:
        f = ref.features(ids)
        X.append(np.concatenate([ref.emb(ids[1:]), f[:-1], np.ones((len(ids) - 1, 1))], axis=1))
        Y.append(f[1:])
    X, Y = np.concatenate(X), np.concatenate(Y)
    W = np.linalg.solve(X.T @ X + 1e-3 * np.eye(X.shape[1]), X.T @ Y)  # (2d + 1, d)
    d = Y.shape[1]
    out = dict(head)
    out["fc.weight"] = W[:2 * d].T.astype(np.float32)
    out["fc.bias"] = W[2 * d].astype(np.float32)
    for name in ("layers.0.self_attn.o_proj.weight", "layers.0.mlp.down_proj.weight"):
        out[name] = (head[name] * 0.05).astype(np.float32)
    return out


def fitted_head(np, shardlm, model, tmp, ref_cls=None, head_cfg=None, name="eagle-off"):
    """The greedy answers of a server without speculation on model (one at a time, 8 at once) and a
    random head of head_cfg (the model's config by default) whose fc is fitted to them (fit_fc),
    written to tmp / "head.safetensors": (answers, the head's path, its ref_cls reference)."""
    from make_draft import write_safetensors
    ref_cls = ref_cls or Reference
    cfg = head_cfg or json.loads((Path(model) / "config.json").read_text())
    try:
        with TS.Server(shardlm, Path(model), "--no-prefix-caching", name=name) as srv:
            base = (greedy(srv, 1), greedy(srv, 8))
    finally:
        TS.kill_all()
    head = fit_fc(np, ref_cls(np, model, make_head(np, cfg)), make_head(np, cfg), [[1, *g] for g in base[0]])
    path = Path(tmp) / "head.safetensors"
    write_safetensors(path, head, {"rope_style": "halves", "format": "eagle-1"})
    return base, path, ref_cls(np, model, head)


class Reference:
    """float64 NumPy: the target (a Hugging Face Llama directory, rotary "halves") and the head.
    The head's layer is Llama-style whatever the target's are; what it takes from the target are
    the embeddings (times escale: Gemma's sqrt(d)), the LM head (its logits soft-capped at fcap
    when the target's are) and the features, which a subclass computes for other targets."""

    def __init__(self, np, model_dir, head):
        from train_compare import read_safetensors
        self.np = np
        cfg = json.loads((Path(model_dir) / "config.json").read_text())
        assert cfg.get("rope_style", "halves") == "halves"
        w = {k: v.astype(np.float64) for k, v in read_safetensors(str(Path(model_dir) / "model.safetensors")).items()}
        self.w, self.cfg, self.L = w, cfg, cfg["num_hidden_layers"]
        self.H, self.KV = cfg["num_attention_heads"], cfg["num_key_value_heads"]
        self.hd = cfg.get("head_dim") or cfg["hidden_size"] // self.H
        self.eps = cfg["rms_norm_eps"]
        self.embed = w["model.embed_tokens.weight"]
        self.lm = w.get("lm_head.weight", self.embed)
        self.h = {k: v.astype(np.float64) for k, v in head.items()}
        self.escale, self.fcap = 1.0, 0.0

    def emb(self, ids):
        return self.escale * self.embed[ids]

    def rms(self, x, g):
        np = self.np
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps) * g

    def rope(self, x, pos):
        """x (T, heads, hd) rotated at positions pos, Hugging Face's rotate_half."""
        np = self.np
        inv = self.cfg["rope_theta"] ** (-np.arange(0, self.hd, 2, dtype=np.float64) / self.hd)
        ang = np.asarray(pos, np.float64)[:, None] * inv[None, :]
        c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
        a, b = x[..., : self.hd // 2], x[..., self.hd // 2:]
        return np.concatenate([a * c - b * s, a * s + b * c], axis=-1)

    def attention(self, xn, pos, wq, wk, wv, wo):
        """causal attention of rows xn (T, d) at positions pos over themselves."""
        np = self.np
        T = len(pos)
        q = self.rope((xn @ wq.T).reshape(T, self.H, self.hd), pos)
        k = self.rope((xn @ wk.T).reshape(T, self.KV, self.hd), pos)
        v = (xn @ wv.T).reshape(T, self.KV, self.hd)
        g = self.H // self.KV
        k, v = np.repeat(k, g, axis=1), np.repeat(v, g, axis=1)
        s = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(self.hd)
        s = np.where(np.tril(np.ones((T, T), bool))[None], s, -np.inf)
        p = np.exp(s - s.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        return np.einsum("hqk,khd->qhd", p, v).reshape(T, self.H * self.hd) @ wo.T

    def mlp(self, x, gate, up, down):
        g = x @ gate.T
        return (g / (1.0 + self.np.exp(-g)) * (x @ up.T)) @ down.T

    def features(self, ids):
        """the target's final hidden states (after the final norm) of ids."""
        w, np = self.w, self.np
        x = self.embed[ids]
        pos = np.arange(len(ids))
        for i in range(self.L):
            p = f"model.layers.{i}."
            x = x + self.attention(self.rms(x, w[p + "input_layernorm.weight"]), pos, w[p + "self_attn.q_proj.weight"],
                                   w[p + "self_attn.k_proj.weight"], w[p + "self_attn.v_proj.weight"],
                                   w[p + "self_attn.o_proj.weight"])
            x = x + self.mlp(self.rms(x, w[p + "post_attention_layernorm.weight"]), w[p + "mlp.gate_proj.weight"],
                             w[p + "mlp.up_proj.weight"], w[p + "mlp.down_proj.weight"])
        return self.rms(x, w["model.norm.weight"])

    def head_rows(self, x, pos):
        h = self.h
        y = x + self.attention(x, pos, h["layers.0.self_attn.q_proj.weight"], h["layers.0.self_attn.k_proj.weight"],
                               h["layers.0.self_attn.v_proj.weight"], h["layers.0.self_attn.o_proj.weight"])
        return y + self.mlp(self.rms(y, h["layers.0.post_attention_layernorm.weight"]), h["layers.0.mlp.gate_proj.weight"],
                            h["layers.0.mlp.up_proj.weight"], h["layers.0.mlp.down_proj.weight"])

    def propose(self, tokens, real):
        """The head's logits for the position after tokens (the first `real` of them real, the rest
        drafts): rows 1 .. real - 1 read the target's features, each later one the head's own output
        at the position before (computed row by row: a row's feature is the previous row's output)."""
        np, h = self.np, self.h
        f = self.features(tokens[:real])
        fc, fb = h["fc.weight"], h["fc.bias"]
        feats = [f[p - 1] for p in range(1, real)]
        out = None
        for n in range(real, len(tokens) + 1):  # rows 1 .. n-1, then the row of position n-1 decides
            ids = tokens[1:n]
            x = np.concatenate([self.emb(ids), np.array(feats[: n - 1])], axis=1) @ fc.T + fb
            out = self.head_rows(x, np.arange(1, n))
            if n < len(tokens):
                feats.append(out[-1])  # the drafted token at position n reads the head's output at n - 1
        lg = out[-1] @ self.lm.T
        return self.fcap * np.tanh(lg / self.fcap) if self.fcap else lg


def q8_0(np, w):
    """w (rows, k) as the engine's Q8_0 head holds it (ggml's quantize_row_q8_0, dequantized): per
    32 values d = max |x| / 127 (stored as f16), q = x / d rounded half away from zero."""
    b = w.astype(np.float32).reshape(-1, 32)
    d = (np.abs(b).max(axis=1) / np.float32(127)).astype(np.float32)
    inv = np.divide(np.float32(1), d, out=np.zeros_like(d), where=d != 0)
    v = b * inv[:, None]
    q = np.sign(v) * np.floor(np.abs(v) + 0.5)
    return (d.astype(np.float16).astype(np.float32)[:, None] * q).reshape(w.shape)


def quantized(np, head):
    """the head with every matrix whose rows are whole Q8_0 blocks as the engine quantizes it (fc's
    two halves each)."""
    out = {}
    for k, v in head.items():
        if v.ndim != 2:
            out[k] = v
        elif k == "fc.weight":
            d = v.shape[0]
            out[k] = np.concatenate([q8_0(np, v[:, :d]), q8_0(np, v[:, d:])], axis=1) if d % 32 == 0 else v
        else:
            out[k] = q8_0(np, v) if v.shape[1] % 32 == 0 else v
    return out


def parse_trace(path):
    rows = []
    for line in Path(path).read_text().splitlines():
        f = line.split()
        rows.append((int(f[1]), int(f[3]), float(f[5]), [int(t) for t in f[7].split(",")]))
    return rows


def check_trace(check, ref, name, path):
    """Every proposal of the trace at path against the reference ref: the same best token, its logit
    within a relative 1e-5; at least 100 proposals, 20 of them a step's first draft and 20 after
    drafts of the same step."""
    rows = parse_trace(path)
    bad, worst, chained = [], 0.0, 0
    for real, best, top, tokens in rows:
        lg = ref.propose(tokens, real)
        chained += len(tokens) > real
        worst = max(worst, abs(float(lg.max()) - top))
        if int(lg.argmax()) != best or abs(float(lg.max()) - top) > 1e-5 * max(1.0, abs(top)):
            bad.append((real, len(tokens), best, int(lg.argmax()), top, float(lg.max())))
    check(len(rows) >= 100 and chained >= 20 and len(rows) - chained >= 20,
          f"{name}: the trace holds {len(rows)} proposals, {chained} of them after drafts of the same step")
    check(not bad, f"{name}: every proposal's best token and logit equal the float64 reference ({len(rows)} "
          f"checked, largest logit difference {worst:.2e}, relative 1e-5 allowed; differing: {bad[:3]})")


def greedy(srv, n_parallel, **kw):
    def one(i):
        with srv.client(timeout=120) as c:
            g = c.generate(PROMPTS[i % len(PROMPTS)], max_tokens=40 + 7 * (i % 4), temperature=0, **kw)
            return tuple(g.completions[0].token_ids) if g.completions else g.text
    with cf.ThreadPoolExecutor(n_parallel) as ex:
        return list(ex.map(one, range(len(PROMPTS))))


def p_min(a, np, ref, eagle, every, base, trace, tmp):
    """--spec-p-min P, P the median of the head's best-token probabilities (the reference's softmax)
    over the proposals traced without it: the greedy answers unchanged; no proposal whose
    probability is below P is drafted (no proposal of the same step follows it with its token);
    some above it are; a request's speculative_p_min 0 lifts the server's P (proposals below it are
    drafted again); speculative_p_min 1.5 is refused naming the field."""
    import grpc

    def top(row):
        real, _, _, tokens = row
        lg = ref.propose(tokens, real)
        e = np.exp(lg - lg.max())
        return float(1.0 / e.sum())

    probs = sorted(top(r) for r in parse_trace(trace))
    P = probs[len(probs) // 2]
    path = tmp / "trace-p-min.txt"
    try:
        with TS.Server(a.shardlm, Path(a.model), "--no-prefix-caching", *eagle, "--spec-p-min", f"{P:.6f}",
                       name="eagle-p-min", env=dict(every, SHARDLM_EAGLE_TRACE=str(path))) as srv:
            answers = greedy(srv, 1)
            n_server = len(parse_trace(path))
            lifted = greedy(srv, 1, speculative_p_min=0.0)
            with srv.client(timeout=60) as c:
                for bad in (1.5, -1.0):  # (-1: the engine's "not given", never a client's value)
                    try:
                        c.generate(PROMPTS[0], max_tokens=4, speculative_p_min=bad)
                        check(False, f"speculative_p_min {bad} refused")
                    except grpc.RpcError as e:
                        check(e.code() == grpc.StatusCode.INVALID_ARGUMENT and "speculative_p_min" in e.details(),
                              f"speculative_p_min {bad} refused naming the field: {e.code().name} {e.details()}")
    finally:
        TS.kill_all()
    same = sum(u == v for u, v in zip(base[0], answers)) + sum(u == v for u, v in zip(base[0], lifted))
    check(same == 2 * len(PROMPTS), f"--spec-p-min {P:.3f}: {same} of {2 * len(PROMPTS)} greedy answers equal")
    rows = parse_trace(path)

    def split(part):
        keys = {(r[0], tuple(r[3])) for r in part}
        below, above = [], []
        for r in part:
            p, followed = top(r), (r[0], tuple(r[3]) + (r[1],)) in keys
            if p < P * (1 - 1e-3):
                below.append(followed)
            elif p > P * (1 + 1e-3):
                above.append(followed)
        return below, above
    below, above = split(rows[:n_server])
    check(len(below) >= 10 and not any(below) and sum(above) >= 5,
          f"--spec-p-min {P:.3f}: {len(below)} proposals below it, {sum(below)} of them drafted (0 allowed); "
          f"{sum(above)} of {len(above)} above it followed by a draft of the same step (>= 5)")
    below, _ = split(rows[n_server:])
    check(sum(below) >= 5, f"speculative_p_min 0 on that server: {sum(below)} of {len(below)} proposals below "
          f"{P:.3f} drafted (>= 5)")


def gate(a, eagle, base, tmp):
    """A head that costs time and saves none (--spec-p-min 1: its proposals never draft) is gated
    (conductor_speculate.c draft_gate), beside prompt lookup (--spec-ngram 3) and alone: after 16
    proposals it proposes at one opportunity in 16 at most, where the same requests with the gate off
    (SHARDLM_SPEC_PRIOR=0) propose at every one; the greedy answers are the same."""
    said = "the draft now proposes at one opportunity in 16"
    for where, lookup in (("beside prompt lookup", ["--spec-ngram", "3"]), ("alone", [])):
        counts, answers, logs = [], [], []
        for name, env in (("eagle-gate-off", dict(os.environ, SHARDLM_SPEC_PRIOR="0")),
                          ("eagle-gate", dict(os.environ))):
            path = tmp / f"trace-{name}-{len(lookup)}.txt"
            try:
                with TS.Server(a.shardlm, Path(a.model), "--no-prefix-caching", *eagle, *lookup, "--spec-p-min",
                               "1.0", name=name, env=dict(env, SHARDLM_EAGLE_TRACE=str(path))) as srv:
                    answers.append(greedy(srv, 1) + greedy(srv, 1))
                    logs.append(srv.log_path.read_text())
            finally:
                TS.kill_all()
            counts.append(len(parse_trace(path)) if path.exists() else 0)
        off, on = counts
        most = 16 + (off - 16 + 15) // 16 + 2
        check(off >= 64 and 16 <= on <= most, f"a head that never drafts, {where}: {on} proposals with the gate "
              f"against {off} without it (16, then one in 16 at most: {most})")
        check(said in logs[1] and said not in logs[0], f"{where}: the gated server's log says when it closes; the "
              "other's does not")
        same = sum(u == v for r in answers for u, v in zip(base[0] * 2, r))
        check(same == 4 * len(PROMPTS), f"{where}, gated and not: {same} of {4 * len(PROMPTS)} greedy answers equal")


def refuse(a, args, want, what):
    p = subprocess.run([a.shardlm, "serve", *args, "--listen", "127.0.0.1:0", "--threads", "1"], capture_output=True,
                       text=True, timeout=120)
    msg = [x for x in p.stderr.splitlines() if "eagle" in x.lower() or "draft" in x][-1:]
    check(p.returncode != 0 and all(w in p.stderr for w in want), f"{what}: refused at start-up naming {want} "
          f"(rc {p.returncode}: {msg})")


def refusals(a, head, tmp, cfg):
    import numpy as np
    from make_draft import write_safetensors
    bad = dict(head)
    del bad["layers.0.mlp.up_proj.weight"]
    write_safetensors(tmp / "missing.safetensors", bad)
    refuse(a, ["--model", a.model, "--speculative", "eagle", "--draft-model", str(tmp / "missing.safetensors")],
           ["--draft-model", "layers.0.mlp.up_proj.weight"], "a head without its up projection")
    bad = dict(head, **{"fc.weight": np.zeros((cfg["hidden_size"], cfg["hidden_size"]), np.float32)})
    write_safetensors(tmp / "shape.safetensors", bad)
    refuse(a, ["--model", a.model, "--speculative", "eagle", "--draft-model", str(tmp / "shape.safetensors")],
           ["fc.weight", "(64 x 64)", "(64 x 128)"], "a head whose fc is (d, d)")
    write_safetensors(tmp / "pairs.safetensors", head, {"rope_style": "pairs"})
    refuse(a, ["--model", a.model, "--speculative", "eagle", "--draft-model", str(tmp / "pairs.safetensors")],
           ["rotary in pairs", "halves"], "a head for the other rotary style")
    gpt2 = tmp / "gpt2"  # golden's GPT-2 (learned positions; the head's layer is rotary) with stories260K's tokenizer
    shutil.copytree(Path(a.model).parent / "gpt2", gpt2)
    shutil.copy(Path(a.model) / "tokenizer.model", gpt2)
    refuse(a, ["--model", str(gpt2), "--speculative", "eagle", "--draft-model", str(tmp / "head.safetensors")],
           ["--speculative eagle", "cannot carry an EAGLE head", "positions are learned"], "an EAGLE head on GPT-2")
    for args, want in ((["--speculative", "eagle"], "--speculative eagle needs --draft-model"),
                       (["--speculative", "ngram", "--spec-p-min", "0.5"], "--spec-p-min needs --draft-model"),
                       (["--speculative", "eagle", "--draft-model", str(tmp / "head.safetensors"), "--spec-p-min", "2"],
                        "--spec-p-min must be a number in [0, 1]")):
        p = subprocess.run([a.shardlm, "serve", "--model", a.model, *args, "--listen", "127.0.0.1:0"],
                           capture_output=True, text=True, timeout=60)
        check(p.returncode == 2 and want in p.stderr, f"{' '.join(args)}: usage error naming it (rc {p.returncode})")


def long_prompt(np, a, tmp):
    """SmolLM2 (a context of 8,192) with a random head of its shape (Q8_0 beside the GGUF): a
    prompt of more than 2,048 tokens still drafts (a slot held at most 2,048 tokens before the
    slots' context followed the models' within a K/V budget), with the answer of the server
    without speculation."""
    cfg = {"hidden_size": 576, "intermediate_size": 1536, "num_attention_heads": 9, "num_key_value_heads": 3}
    from make_draft import write_safetensors
    write_safetensors(tmp / "smol-head.safetensors", make_head(np, cfg), {"rope_style": "pairs", "format": "eagle-1"})
    text = " ".join(f"Item {i}: the {('red', 'green', 'blue')[i % 3]} box holds {i * 7 % 13} apples." for i in range(260))
    prompt = text + " Which item holds twelve apples? Answer:"
    answers = []
    try:
        for flags in ([], ["--speculative", "eagle", "--draft-model", str(tmp / "smol-head.safetensors"),
                           "--spec-draft", "2"]):
            with TS.Server(a.shardlm, Path(a.gguf), "--threads", "2", *flags, name="eagle-long",
                           env=dict(os.environ, SHARDLM_SPEC_PRIOR="0")) as srv:
                with srv.client(timeout=300) as c:
                    g = c.generate(prompt, max_tokens=12, temperature=0)
                    answers.append((tuple(g.token_ids), g.prompt_tokens))
                    st = c.server_stats()
                log = srv.log_path.read_text()
    finally:
        TS.kill_all()
    n_prompt = answers[0][1]
    check(n_prompt > 2048 and answers[0] == answers[1] and st.spec_draft_tokens > 0 and "slots of 8192 tokens" in log,
          f"SmolLM2, a prompt of {n_prompt} tokens: {st.spec_draft_tokens} drafts verified (the slots hold 8,192 tokens: "
          f"{'slots of 8192 tokens' in log}), the answer equal to the server without speculation "
          f"({answers[0] == answers[1]})")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shardlm", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--gguf", help="SmolLM2-135M-Instruct's GGUF: a prompt longer than 2,048 tokens")
    a = ap.parse_args()
    if not os.path.isdir(a.model):
        print(f"SKIP: no model at {a.model}")
        return SKIP
    try:
        import numpy as np
        import scipy.stats  # noqa: F401
    except ImportError:
        print("SKIP: no numpy or scipy")
        return SKIP
    from make_draft import write_safetensors
    tmp = Path(tempfile.mkdtemp(prefix="shardlm-eagle-"))
    cfg = json.loads((Path(a.model) / "config.json").read_text())
    head = make_head(np, cfg)
    write_safetensors(tmp / "head.safetensors", head, {"rope_style": "halves", "format": "eagle-1"})
    refusals(a, head, tmp, cfg)
    hot = dict(temperature=1.0)
    try:
        with TS.Server(a.shardlm, Path(a.model), "--no-prefix-caching", name="eagle-off") as srv:
            base = (greedy(srv, 1), greedy(srv, 8))
            off = samples(srv, hot, 1000)
    finally:
        TS.kill_all()
    head = fit_fc(np, Reference(np, a.model, head), head, [[1, *g] for g in base[0]])
    write_safetensors(tmp / "head.safetensors", head, {"rope_style": "halves", "format": "eagle-1"})
    trace, trace_q8, trace_pc = tmp / "trace.txt", tmp / "trace-q8.txt", tmp / "trace-prefix.txt"
    trace_pr = tmp / "trace-pressure.txt"
    eagle = ["--speculative", "eagle", "--draft-model", str(tmp / "head.safetensors"), "--spec-draft", "3",
             "--spec-max-batch", "64", "--max-seqs", "64"]
    every = dict(os.environ, SHARDLM_SPEC_PRIOR="0")
    try:
        with TS.Server(a.shardlm, Path(a.model), "--no-prefix-caching", *eagle, name="eagle-trace",
                       env=dict(every, SHARDLM_EAGLE_TRACE=str(trace))) as srv:
            traced = (greedy(srv, 1), greedy(srv, 8))
            with srv.client(timeout=60) as c:
                st = c.server_stats()
        with TS.Server(a.shardlm, Path(a.model), *eagle, name="eagle-prefix", env=every) as srv:
            cached = (greedy(srv, 1), greedy(srv, 8), greedy(srv, 8))
            with srv.client(timeout=60) as c:
                st2 = c.server_stats()
            on = samples(srv, hot, 5000)
            with srv.client(timeout=60) as c:
                st3 = c.server_stats()
        with TS.Server(a.shardlm, Path(a.model), "--block-tokens", "4", *eagle, name="eagle-prefix-trace",
                       env=dict(every, SHARDLM_EAGLE_TRACE=str(trace_pc))) as srv:
            warm = (greedy(srv, 1), greedy(srv, 8), greedy(srv, 8))
            with srv.client(timeout=60) as c:
                st_pc = c.server_stats()
        with TS.Server(a.shardlm, Path(a.model), "--block-tokens", "4", "--kv-cache-blocks", "40", *eagle,
                       name="eagle-pressure", env=dict(every, SHARDLM_EAGLE_TRACE=str(trace_pr))) as srv:
            pressed = (greedy(srv, 8), greedy(srv, 8))
            with srv.client(timeout=60) as c:
                st_pr = c.server_stats()
        with TS.Server(a.shardlm, Path(a.model), "--no-prefix-caching", *eagle, name="eagle-q8",
                       env=dict(every, SHARDLM_EAGLE_TRACE=str(trace_q8), SHARDLM_EAGLE_WEIGHTS="q8_0")) as srv:
            q8 = greedy(srv, 8)
    finally:
        TS.kill_all()
    for k, (name, g) in enumerate((("traced", traced), ("prefix cache on", cached[:2]))):
        for b, (x, y) in enumerate(zip(base, g)):
            same = sum(u == v for u, v in zip(x, y))
            check(same == len(PROMPTS), f"EAGLE ({name}), {(1, 8)[b]} at once: {same} of {len(PROMPTS)} greedy "
                  "answers equal to the server without speculation")
    same = sum(u == v for u, v in zip(base[1], cached[2]))
    check(same == len(PROMPTS), f"EAGLE, prefix cache warm, 8 at once: {same} of {len(PROMPTS)} answers equal")
    for name, s in (("traced", st), ("prefix cache on", st2)):
        check(s.spec_draft_tokens > 0 and 0 < s.spec_accepted_tokens < s.spec_draft_tokens,
              f"EAGLE ({name}): {s.spec_draft_tokens} drafts verified, {s.spec_accepted_tokens} accepted (some "
              "accepted, some rejected)")
    check(len(off) == len(on) == REQUESTS * N, f"sampled: {len(off)} and {len(on)} samples")
    for pos in range(MAX_TOKENS):
        p, cats = chi2_position(off, on, pos)
        check(p is not None and p > 0.001 / MAX_TOKENS, f"temperature 1: token {pos + 1} distribution without vs with "
              f"the EAGLE head: chi-square p = {p} over {cats} categories (> {0.001 / MAX_TOKENS:.2g})")
    ver, acc = st3.spec_draft_tokens - st2.spec_draft_tokens, st3.spec_accepted_tokens - st2.spec_accepted_tokens
    check(ver > 0 and 0 < acc < ver, f"sampled requests drafted by the head: {ver} drafts verified, {acc} accepted")
    ref = Reference(np, a.model, head)
    for name, path in (("prefix caching off", trace), ("prefix cache warm, 4-token blocks", trace_pc),
                       ("preempted (a pool of 40 blocks of 4 tokens)", trace_pr)):
        check_trace(check, ref, name, path)
    # A cached prefix's features are kept with its KV blocks: the proposals above read the same
    # features whether the target computed those rows for this request or for an earlier one.
    same = sum(u == v for u, v in zip(base[1], warm[2]))
    check(st_pc.prefix_cache_hit_tokens > 0 and same == len(PROMPTS),
          f"prefix cache warm (4-token blocks): {st_pc.prefix_cache_hit_tokens} prompt tokens from the cache, "
          f"{same} of {len(PROMPTS)} greedy answers equal")
    # Preemption: 8 at once need about twice the pool, so sequences are preempted, their blocks
    # taken by others (and their features overwritten), and recomputed when they resume.
    same = sum(u == v for r in pressed for u, v in zip(base[1], r))
    check(st_pr.preemptions > 0 and same == 2 * len(PROMPTS),
          f"under preemption ({st_pr.preemptions} preemptions): {same} of {2 * len(PROMPTS)} greedy answers equal")
    # The Q8_0 head (SHARDLM_EAGLE_WEIGHTS=q8_0; beside a block-quantized target on the CPU it is the
    # default): the reference with the engine's quantized weights; the engine also rounds each
    # product's input rows to int8, so the logits agree to about a percent, not to f32 precision.
    same = sum(u == v for u, v in zip(base[1], q8))
    check(same == len(PROMPTS), f"EAGLE with a Q8_0 head, 8 at once: {same} of {len(PROMPTS)} greedy answers equal")
    ref8 = Reference(np, a.model, quantized(np, head))
    rows8 = parse_trace(trace_q8)
    agree, rel = 0, []
    for real, best, top, tokens in rows8:
        lg = ref8.propose(tokens, real)
        agree += int(lg.argmax()) == best
        rel.append(abs(float(lg.max()) - top) / max(1.0, abs(top)))
    rel = sorted(rel) or [1.0]
    med, worst8 = rel[len(rel) // 2], rel[-1]
    check(len(rows8) >= 50 and agree >= 0.95 * len(rows8) and med < 1e-2 and worst8 < 6e-2,
          f"the Q8_0 head: {agree} of {len(rows8)} proposals' best token equal to the reference with the quantized "
          f"weights (>= 95 %), relative logit difference median {med:.1e} (< 1e-2), largest {worst8:.1e} (< 6e-2)")
    p_min(a, np, ref, eagle, every, base, trace, tmp)
    gate(a, eagle, base, tmp)
    if a.gguf and os.path.exists(a.gguf):
        long_prompt(np, a, tmp)
    else:
        print(f"SKIP: the long prompt on SmolLM2 (no GGUF at {a.gguf})")
    return check.summary()


if __name__ == "__main__":
    sys.exit(main())
