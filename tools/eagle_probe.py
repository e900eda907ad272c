#!/usr/bin/env python3
"""tools/eagle_probe.py - would an EAGLE-style draft head pay for SmolLM2 on this CPU? (issue 29)

An offline probe, before any engine work: it trains an EAGLE-1 head (Li et al. 2024) on a target's
own hidden states and replays greedy chain drafting with it, so the acceptance such a head reaches
with the data and compute of one session is known before shardlm serves one.

  python3 tools/eagle_probe.py features --target DIR --data A.jsonl[,B.jsonl] --out F.npz
  python3 tools/eagle_probe.py train --target DIR --features F.npz --map MAP.json --out H.npz [--epochs N]
  python3 tools/eagle_probe.py eval --target DIR --features F.npz --map MAP.json --head H.npz [--k 5]
  python3 tools/eagle_probe.py export --target DIR --head H.npz --out HEAD.safetensors
  python3 tools/eagle_probe.py map --features F.npz --n 8192 --keep 2,106 --out MAP.json

A Gemma 3 GGUF (the default model) is a target too: `--target FILE.gguf [--adapter DIR]` (the
served adapter merged; tests/reference/gemma3_ref.py reads and dequantizes the file), and
`features` then needs `--shardlm BIN` (a server of the file tokenizes the conversations, rendered
as shardlm's gemma template renders them) and runs a JAX Gemma 3 forward written for this tool;
`map` makes its token map from the features (no tokenizer.json to count with). The head is the
same Llama-style layer, reading the embeddings times sqrt(d) as shardlm serves it.

- `features`: the target (a Hugging Face Llama directory in f32, e.g. `shardlm convert gguf --dtype
  f32` of the served GGUF as tools/distill_draft.sh writes it; rope_style "pairs" honoured) run by a
  JAX forward written for this tool over each conversation of the chat JSONL (tools/distill_data.py's
  target answers), rendered by the directory's chat template (jinja2) and tokenized by Hugging Face
  `tokenizers`. Kept per token: the final hidden state after the final norm (f16) and the target's
  greedy token; answer tokens are marked. The last 5 % of each file is held out (not independent:
  the recipe's SQuAD questions come several to a passage, so most held-out ones share a passage
  with training ones; docs/speculative.md measures the served head on unseen prompts instead).
- `train`: the EAGLE-1 head: h = fc([embed(x_i), f_{i-1}]) (2d -> d, bias), one decoder layer
  (attention without its input norm, as EAGLE's first layer, then the MLP block), no final norm; the
  frozen LM head (the target's tied embeddings, restricted to the token map's rows) reads h. Loss at
  every position (prompt and answer): smooth-L1 of h against f_i plus 0.1 x cross-entropy against
  the target's own distribution softmax(head(f_i)) over the map, features given uniform noise.
  AdamW, cosine schedule; the layer starts as the target's last layer, its output projections
  damped. `--unroll` adds a second draft from the head's own output (EAGLE-3's training-time
  test, two steps); `--init H.npz` starts from a trained head.
- `eval`: on the held-out conversations, at every answer position the chain a served head would
  draft (input the token just emitted with the target's feature before it; then its own outputs),
  K tokens, compared with the target's greedy tokens; prints the acceptance by depth and the
  decode ratio a chain with the adaptive length would give under a cost model (a verification row
  c of a plain step, a draft token e of one), as tools/spec_replay.py costs its replays. `--oracle`
  drafts with the target's own features instead, a check of the indexing (acceptance then equals
  the features' agreement with the recorded answers times the map's coverage).

- `export`: the head as an EAGLE-1 safetensors file (EAGLE's names: fc.weight, fc.bias,
  layers.0.self_attn.*, layers.0.post_attention_layernorm.weight, layers.0.mlp.*; F32; metadata
  rope_style from the target's config) that `shardlm serve --speculative eagle --draft-model
  HEAD.safetensors [--spec-token-map MAP.json]` serves on the same model.

Figures and how they were measured: docs/speculative.md, "An EAGLE head, probed offline".

A probe and a benchmark, never a test; JAX on the CPU.
"""
import argparse
import json
import math
import sys
import time

import os

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from train_compare import read_safetensors  # noqa: E402  (name -> float32 array; BF16 widened)


def load_gemma(path, adapter):
    """A Gemma 3 GGUF (e.g. the default model) as tests/reference/gemma3_ref.py dequantizes it, a PEFT
    adapter merged when given (its with_lora): cfg with the keys the head's code reads (the head's
    rotary at the global layers' base, in halves as GGUF's Gemma is) and the Gemma settings under
    "gemma"; t as load_target's, plus the QK and sandwich norms and the embedding scale sqrt(d)."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "reference"))
    import gemma3_ref as G
    m = G.Model(path)
    if adapter:
        m = G.with_lora(m, adapter)
    c = m.config
    if c["head_dim_v"] != c["head_dim"]:
        raise SystemExit(f"{path}: value width {c['head_dim_v']} differs from the key width {c['head_dim']}")
    cfg = dict(hidden_size=c["n_embd"], num_attention_heads=c["n_head"], num_key_value_heads=c["n_kv"],
               head_dim=c["head_dim"], intermediate_size=c["n_ff"], num_hidden_layers=c["n_layer"],
               rms_norm_eps=c["eps"], rope_theta=c["rope_base_global"], rope_style="halves", gemma=c)
    def stack(k):
        return np.stack([np.asarray(w[k], np.float32) for w in m.layers])
    t = dict(embed=m.tok_embd, escale=math.sqrt(c["n_embd"]), norm=m.output_norm,
             head=m.output if m.output is not None else m.tok_embd, bos=m.bos,
             turn=(m.tokens.index("<start_of_turn>"), m.tokens.index("<end_of_turn>")),
             wq=stack("wq"), wk=stack("wk"), wv=stack("wv"), wo=stack("wo"), ln1=stack("attn_norm"),
             ln2=stack("ffn_norm"), gate=stack("gate"), up=stack("up"), down=stack("down"), qn=stack("q_norm"),
             kn=stack("k_norm"), pa=stack("post_attention_norm"), pf=stack("post_ffw_norm"))
    return cfg, t


def load_target(path, adapter=None):
    """A Hugging Face Llama directory (f32), or a Gemma 3 GGUF file (load_gemma)."""
    if path.endswith(".gguf"):
        return load_gemma(path, adapter)
    if adapter:
        raise SystemExit("--adapter: only beside a Gemma 3 GGUF target")
    cfg = json.load(open(f"{path}/config.json"))
    w = read_safetensors(f"{path}/model.safetensors")
    L = cfg["num_hidden_layers"]
    def stack(name):
        return np.stack([w[f"model.layers.{i}.{name}"] for i in range(L)]).astype(np.float32)
    t = dict(
        embed=w["model.embed_tokens.weight"].astype(np.float32),
        norm=w["model.norm.weight"].astype(np.float32),
        wq=stack("self_attn.q_proj.weight"), wk=stack("self_attn.k_proj.weight"),
        wv=stack("self_attn.v_proj.weight"), wo=stack("self_attn.o_proj.weight"),
        ln1=stack("input_layernorm.weight"), ln2=stack("post_attention_layernorm.weight"),
        gate=stack("mlp.gate_proj.weight"), up=stack("mlp.up_proj.weight"), down=stack("mlp.down_proj.weight"))
    head = w.get("lm_head.weight")
    t["head"] = t["embed"] if head is None else head.astype(np.float32)
    t["escale"] = 1.0
    return cfg, t


def embed_in(t):
    """The embeddings as the target's first layer reads them, which the head reads too (Gemma's
    times sqrt(d), as shardlm serves the head: engine/serving/draft.c)."""
    return t["embed"] * np.float32(t["escale"]) if t["escale"] != 1.0 else t["embed"]


def rope_tables(cfg, T):
    hd = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    inv = cfg["rope_theta"] ** (-np.arange(0, hd, 2, dtype=np.float64) / hd)
    ang = np.arange(T, dtype=np.float64)[:, None] * inv[None, :]
    return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)


def rope(x, cos, sin, pairs, xp):
    """x (..., T, H, hd); cos / sin (T, hd/2). "pairs": adjacent pairs rotate (GGUF's order);
    otherwise the two halves (Hugging Face's rotate_half)."""
    c, s = cos[:, None, :], sin[:, None, :]
    if pairs:
        a, b = x[..., 0::2], x[..., 1::2]
        ra, rb = a * c - b * s, a * s + b * c
        return xp.stack([ra, rb], axis=-1).reshape(x.shape)
    h = x.shape[-1] // 2
    a, b = x[..., :h], x[..., h:]
    return xp.concatenate([a * c - b * s, a * s + b * c], axis=-1)


def rms(x, w, eps, xp):
    return x * (1.0 / xp.sqrt(xp.mean(x * x, axis=-1, keepdims=True) + eps)) * w


def project(x, p, cos, sin, cfg, xp):
    """x (..., T, d) -> q (..., T, H, hd), k and v (..., T, KV, hd), q and k rotated at the rows'
    positions (cos / sin (T, hd/2)); p holds wq, wk, wv."""
    H, KV = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim") or cfg["hidden_size"] // H
    pairs = cfg.get("rope_style") == "pairs"
    sh = x.shape[:-1]
    q = rope((x @ p["wq"].T).reshape(*sh, H, hd), cos, sin, pairs, xp)
    k = rope((x @ p["wk"].T).reshape(*sh, KV, hd), cos, sin, pairs, xp)
    return q, k, (x @ p["wv"].T).reshape(*sh, KV, hd)


def attend(q, k, v, mask, xp):
    """q (..., Tq, H, hd) over k, v (..., Tk, KV, hd) where mask (broadcast to (..., H, Tq, Tk))
    allows -> (..., Tq, H hd): grouped-query softmax attention."""
    H, hd = q.shape[-2], q.shape[-1]
    k = xp.repeat(k, H // k.shape[-2], axis=-2)
    v = xp.repeat(v, H // v.shape[-2], axis=-2)
    s = xp.einsum("...qhd,...khd->...hqk", q, k) / math.sqrt(hd)
    s = xp.where(mask, s, -1e30)
    w = xp.exp(s - s.max(axis=-1, keepdims=True))
    w = w / w.sum(axis=-1, keepdims=True)
    o = xp.einsum("...hqk,...khd->...qhd", w, v)
    return o.reshape(*o.shape[:-2], H * hd)


def mlp(h, gate, up, down, xp):
    g = h @ gate.T
    return ((g / (1.0 + xp.exp(-g))) * (h @ up.T)) @ down.T


def render(tpl, tok, messages):
    text = tpl.render(messages=messages, add_generation_prompt=False)
    prompt = tpl.render(messages=messages[:-1], add_generation_prompt=True)
    ids = tok.encode(text, add_special_tokens=False).ids
    n_prompt = len(tok.encode(prompt, add_special_tokens=False).ids)
    return ids, n_prompt


def gelu_tanh(x, xp):
    return 0.5 * x * (1.0 + xp.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x)))


def gemma_forward(cfg, t):
    """A jitted JAX forward of a Gemma 3 target (load_gemma) written for this tool from
    tests/reference/gemma3_ref.py's description (llama.cpp's gemma3 graph): ids (T,) -> the final
    hidden states after the final norm (T, d). Embeddings times sqrt(d); per layer the QK norms
    per head, rotary in halves at base 1e6 on every sixth (global) layer and 10,000 on the others,
    which see only the last `window` positions; sandwich norms; GeGLU (tanh)."""
    import jax
    import jax.numpy as jnp
    c = cfg["gemma"]
    eps, H, KV, hd = c["eps"], c["n_head"], c["n_kv"], c["head_dim"]
    L = c["n_layer"]
    keys = ("wq", "wk", "wv", "wo", "ln1", "ln2", "gate", "up", "down", "qn", "kn", "pa", "pf")
    layers = {k: jnp.asarray(t[k]) for k in keys}
    layers["glob"] = jnp.asarray([(i + 1) % 6 == 0 for i in range(L)])
    embed, norm = jnp.asarray(t["embed"]), jnp.asarray(t["norm"])
    qmul = c["q_scale"] * math.sqrt(hd)  # attend() divides by sqrt(hd)

    @jax.jit
    def forward(ids):
        T = ids.shape[0]
        cg, sg = rope_tables(dict(cfg, rope_theta=c["rope_base_global"]), T)
        cl, sl = rope_tables(dict(cfg, rope_theta=c["rope_base_local"]), T)
        pos = jnp.arange(T)
        causal = pos[None, :] <= pos[:, None]
        local = causal & (pos[:, None] - pos[None, :] < c["window"])
        x = embed[ids] * t["escale"]

        def body(x, lw):
            g = lw["glob"]
            cos, sin = jnp.where(g, cg, cl), jnp.where(g, sg, sl)
            mask = jnp.where(g, causal, local)[None]
            h = rms(x, lw["ln1"], eps, jnp)
            q = rms((h @ lw["wq"].T).reshape(T, H, hd), lw["qn"], eps, jnp)
            k = rms((h @ lw["wk"].T).reshape(T, KV, hd), lw["kn"], eps, jnp)
            v = (h @ lw["wv"].T).reshape(T, KV, hd)
            q, k = rope(q, cos, sin, False, jnp) * qmul, rope(k, cos, sin, False, jnp)
            x = x + rms(attend(q, k, v, mask, jnp) @ lw["wo"].T, lw["pa"], eps, jnp)
            h = rms(x, lw["ln2"], eps, jnp)
            m = (gelu_tanh(h @ lw["gate"].T, jnp) * (h @ lw["up"].T)) @ lw["down"].T
            return x + rms(m, lw["pf"], eps, jnp), None
        x, _ = jax.lax.scan(body, x, layers)
        return rms(x, norm, eps, jnp)
    return forward


def gemma_render(client, t, messages):
    """ids of a (user, assistant) conversation as shardlm's hand-written gemma template renders it
    (engine/text/chat_template.c apply_gemma: each text piece tokenized on its own, here by the
    served tokenizer through the Tokenize call), the answer closed by <end_of_turn>; and the
    prompt's length."""
    start, end = t["turn"]
    enc = lambda s: client.tokenize(s, add_bos=False)  # noqa: E731
    (u, ans) = messages
    ids = [t["bos"], start] + enc("user\n" + u["content"]) + [end] + enc("\n") + [start] + enc("model\n")
    return ids + enc(ans["content"]) + [end], len(ids)


def conversations(a, render_one):
    """(ids, n_prompt) of every kept conversation of --data's files (render_one(messages)), whether
    it is held out (the last 5 % of its file) and its file's index."""
    seqs, held, src = [], [], []
    for fi, path in enumerate(a.data.split(",")):
        rows = [json.loads(l) for l in open(path) if l.strip()]
        cut = len(rows) - max(1, len(rows) // 20)
        keep = [i for i in range(len(rows)) if i >= cut or (a.skip <= i and (not a.limit or i < a.limit))]
        for i in keep:
            ids, n_prompt = render_one(rows[i]["messages"])
            seqs.append((ids[: a.max_len], n_prompt))
            held.append(i >= cut)
            src.append(fi)
    return seqs, held, src


def write_features(a, d, seqs, held, src, run):
    """Runs run(padded ids, i) -> (features (T, d), the target's greedy token after each row, or
    None where not computed) over every conversation and writes --out: features (f16), greedy
    tokens (-1 where not computed), ids, answer marks, conversation starts, held-out marks and
    files. Prints how often the greedy token equals the recorded answer token."""
    import jax.numpy as jnp
    total = sum(len(s) for s, _ in seqs)
    feats = np.zeros((total, d), np.float16)
    greedy = np.full(total, -1, np.int32)
    ids_all = np.zeros(total, np.int32)
    answer = np.zeros(total, bool)
    starts = np.zeros(len(seqs) + 1, np.int64)
    t0, agree, n_chk = time.time(), 0, 0
    for i, (ids, n_prompt) in enumerate(seqs):
        n, o = len(ids), starts[i]
        Tp = -(-n // 128) * 128
        f, g = run(jnp.asarray(np.array(ids + [0] * (Tp - n), np.int32)), i)
        feats[o:o + n] = np.asarray(f[:n]).astype(np.float16)
        ids_all[o:o + n] = ids
        answer[o + n_prompt:o + n] = True
        if g is not None:
            greedy[o:o + n] = np.asarray(g[:n])
            # the target's greedy token after position j is ids[j + 1] on its own answers
            agree += int(np.sum(greedy[o + n_prompt - 1:o + n - 1] == ids_all[o + n_prompt:o + n]))
            n_chk += n - n_prompt
        starts[i + 1] = o + n
        if i % 100 == 0 or i == len(seqs) - 1:
            print(f"features: {i + 1}/{len(seqs)} sequences, {starts[i + 1]} tokens, {time.time() - t0:.0f} s; "
                  f"f32 forward's greedy = recorded answer token at {agree}/{n_chk}", flush=True)
    np.savez(a.out, feats=feats, greedy=greedy, ids=ids_all, answer=answer, starts=starts,
             held=np.array(held, bool), src=np.array(src, np.int32))


def cmd_features(a):
    import jax
    import jax.numpy as jnp
    cfg, t = load_target(a.target, a.adapter)
    if "gemma" in cfg:
        return gemma_features(a, cfg, t)
    import jinja2
    from tokenizers import Tokenizer
    tc = json.load(open(f"{a.target}/tokenizer_config.json"))
    tpl = jinja2.Environment().from_string(tc["chat_template"])
    tok = Tokenizer.from_file(f"{a.target}/tokenizer.json")
    seqs, held, src = conversations(a, lambda msgs: render(tpl, tok, msgs))
    eps = cfg["rms_norm_eps"]
    layers = {k: jnp.asarray(t[k]) for k in ("wq", "wk", "wv", "wo", "ln1", "ln2", "gate", "up", "down")}
    embed, norm, head = jnp.asarray(t["embed"]), jnp.asarray(t["norm"]), jnp.asarray(t["head"])

    @jax.jit
    def forward(ids):
        T = ids.shape[0]
        cos, sin = rope_tables(cfg, T)
        mask = jnp.tril(jnp.ones((T, T), bool))[None, None]
        x = embed[ids][None]
        def body(x, lw):
            h = rms(x, lw["ln1"], eps, jnp)
            x = x + attend(*project(h, lw, cos, sin, cfg, jnp), mask, jnp) @ lw["wo"].T
            x = x + mlp(rms(x, lw["ln2"], eps, jnp), lw["gate"], lw["up"], lw["down"], jnp)
            return x, None
        x, _ = jax.lax.scan(body, x, layers)
        f = rms(x[0], norm, eps, jnp)
        return f, jnp.argmax(f @ head.T, axis=-1)

    write_features(a, cfg["hidden_size"], seqs, held, src, lambda ids, i: forward(ids))


def gemma_features(a, cfg, t):
    """features for a Gemma 3 GGUF target: conversations rendered by shardlm's gemma template
    (gemma_render, through a shardlm server of the GGUF started for its tokenizer: --shardlm),
    run by gemma_forward. The target's greedy tokens (an argmax over its 262,144-row head) are
    computed for the first --check conversations only, as the check of the forward."""
    import jax.numpy as jnp
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "server"))
    import test_server as TS
    from pathlib import Path
    try:
        with TS.Server(a.shardlm, Path(a.target), "--threads", "1", name="eagle-probe-tok") as srv, \
                srv.client(timeout=60) as client:
            seqs, held, src = conversations(a, lambda msgs: gemma_render(client, t, msgs))
    finally:
        TS.kill_all()
    forward = gemma_forward(cfg, t)
    head = jnp.asarray(t["head"])

    def run(ids, i):
        f = forward(ids)
        return f, jnp.argmax(f @ head.T, axis=-1) if i < a.check else None
    write_features(a, cfg["hidden_size"], seqs, held, src, run)


def head_params(cfg, t, seed):
    d = cfg["hidden_size"]
    rng = np.random.default_rng(seed)
    p = {k: t[k][-1].copy() for k in ("wq", "wk", "wv", "wo", "ln2", "gate", "up", "down")}
    # the target's last layer reads its residual stream, not normalised features: damp its
    # outputs so that the head starts near h = f_prev rather than far off the features' scale
    p["wo"] *= 0.05
    p["down"] *= 0.05
    p["fc_w"] = (rng.standard_normal((d, 2 * d)) * 0.02).astype(np.float32)
    p["fc_w"][:, d:] += np.eye(d, dtype=np.float32)  # start by passing the feature through
    p["fc_b"] = np.zeros(d, np.float32)
    return p


def head_forward(p, emb, f_prev, cfg, xp, cos, sin, mask, prior=None):
    """emb, f_prev (B, T, d) -> h (B, T, d) and its fc output: fc, attention (no input norm), MLP
    block. cos / sin: the rows' positions. prior: (x, cos, sin) of an earlier pass whose rows this
    pass's row i also sees, rows 0 .. i of it, as a drafted token sees the real ones before it
    (mask then covers this pass's own rows)."""
    x = xp.concatenate([emb, f_prev], axis=-1) @ p["fc_w"].T + p["fc_b"]
    q, k, v = project(x, p, cos, sin, cfg, xp)
    if prior is not None:
        _, k0, v0 = project(prior[0], p, prior[1], prior[2], cfg, xp)
        T = x.shape[1]
        k, v = xp.concatenate([k0, k], axis=1), xp.concatenate([v0, v], axis=1)
        mask = xp.concatenate([xp.tril(xp.ones((T, T), bool))[None, None], mask], axis=-1)
    y = x + attend(q, k, v, mask, xp) @ p["wo"].T
    return y + mlp(rms(y, p["ln2"], cfg["rms_norm_eps"], xp), p["gate"], p["up"], p["down"], xp), x


def load_features(spec):
    """The features files of spec (comma-separated: written by `features` over different data),
    as one: their rows concatenated, conversation starts offset."""
    parts = [dict(np.load(f)) for f in spec.split(",")]
    if len(parts) == 1:
        return parts[0]
    D = {k: np.concatenate([p[k] for p in parts]) for k in ("feats", "greedy", "ids", "answer", "held", "src")}
    starts, o = [np.zeros(1, np.int64)], 0
    for p in parts:
        starts.append(p["starts"][1:] + o)
        o += int(p["starts"][-1])
    D["starts"] = np.concatenate(starts)
    return D


def windows(D, held, T):
    """(start, length) windows of at most T+1 tokens over the chosen conversations."""
    out = []
    for s in np.nonzero(D["held"] == held)[0]:
        a, b = int(D["starts"][s]), int(D["starts"][s + 1])
        for w in range(a, b - 2, T):
            out.append((w, min(T + 1, b - w)))
    return out


def cmd_train(a):
    import jax
    import jax.numpy as jnp
    import optax
    cfg, t = load_target(a.target, a.adapter)
    D = load_features(a.features)
    tmap = np.array(json.load(open(a.map)), np.int32)
    head = jnp.asarray(t["head"][tmap])
    embed = embed_in(t)
    T, B = a.seq, a.batch
    cos, sin = rope_tables(cfg, T)
    mask = jnp.tril(jnp.ones((T, T), bool))[None, None]
    frms = float(np.sqrt(np.mean(D["feats"][:200000].astype(np.float32) ** 2)))
    print(f"train: feature rms {frms:.3f}, noise +-{a.noise * frms:.3f}", flush=True)
    W = windows(D, False, T)
    steps = a.epochs * (len(W) // B)
    init = dict(np.load(a.init)) if a.init else head_params(cfg, t, a.seed)
    p = {k: jnp.asarray(v) for k, v in init.items()}
    sched = optax.warmup_cosine_decay_schedule(0.0, a.lr, max(1, steps // 20), steps, a.lr * 0.1)
    opt = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(sched, weight_decay=0.0))
    st = opt.init(p)

    cos2, sin2 = rope_tables(cfg, T + 1)
    eye = jnp.eye(T, dtype=bool)[None, None]

    def terms(h, f_next, m):
        v = optax.huber_loss(h, f_next, delta=1.0).mean(axis=-1)
        lp = jax.nn.log_softmax(h @ head.T, axis=-1)
        q = jax.nn.softmax(f_next @ head.T, axis=-1)
        ce = -(q * lp).sum(axis=-1)
        acc = (jnp.argmax(lp, -1) == jnp.argmax(q, -1))
        n = jnp.maximum(m.sum(), 1.0)
        return ((v + a.p_weight * ce) * m).sum() / n, ((v * m).sum() / n, (ce * m).sum() / n, (acc * m).sum() / n)

    def loss_fn(p, emb, f_prev, f_next, m, key):
        f_in = f_prev + jax.random.uniform(key, f_prev.shape, minval=-1.0, maxval=1.0) * (a.noise * frms)
        h, x = head_forward(p, emb, f_in, cfg, jnp, cos, sin, mask)
        l, aux = terms(h, f_next, m)
        if a.unroll:
            # the second draft of a chain: row i reads x_{i+2} with the head's own h_i (not the
            # target's feature), at position i + 1, seeing the real rows 0 .. i and itself
            sh = lambda z: jnp.concatenate([z[:, 1:], jnp.zeros_like(z[:, :1])], axis=1)
            h2, _ = head_forward(p, sh(emb), h, cfg, jnp, cos2[1:], sin2[1:], eye, prior=(x, cos, sin))
            l2, aux2 = terms(h2, sh(f_next), sh(m))
            return l + l2, aux + aux2
        return l, aux

    @jax.jit
    def step(p, st, emb, f_prev, f_next, m, key):
        (l, aux), g = jax.value_and_grad(loss_fn, has_aux=True)(p, emb, f_prev, f_next, m, key)
        u, st = opt.update(g, st, p)
        return optax.apply_updates(p, u), st, l, aux

    def batch(ws):
        emb = np.zeros((B, T, embed.shape[1]), np.float32)
        fp = np.zeros_like(emb)
        fn = np.zeros_like(emb)
        m = np.zeros((B, T), np.float32)
        for j, (w, n) in enumerate(ws):
            # position i of the window: input x_{i+1} with f_i, target f_{i+1}
            emb[j, :n - 1] = embed[D["ids"][w + 1:w + n]]
            fp[j, :n - 1] = D["feats"][w:w + n - 1]
            fn[j, :n - 1] = D["feats"][w + 1:w + n]
            m[j, :n - 1] = 1.0
        return emb, fp, fn, m

    rng, key = np.random.default_rng(a.seed), jax.random.PRNGKey(a.seed)
    t0, k = time.time(), 0
    for ep in range(a.epochs):
        order = rng.permutation(len(W))
        for b in range(len(W) // B):
            key, sub = jax.random.split(key)
            p, st, l, aux = step(p, st, *batch([W[i] for i in order[b * B:(b + 1) * B]]), sub)
            k += 1
            if k % a.log == 0 or k == steps:
                two = f", second draft top-1 {float(aux[5]):.3f}" if a.unroll else ""
                print(f"train: step {k}/{steps} epoch {ep + 1} loss {float(l):.4f} (feature {float(aux[0]):.4f}, "
                      f"ce {float(aux[1]):.3f}, top-1 {float(aux[2]):.3f}{two}) {time.time() - t0:.0f} s", flush=True)
        np.savez(a.out, **{k2: np.asarray(v) for k2, v in p.items()})
    print(f"train: {steps} steps in {time.time() - t0:.0f} s -> {a.out}")


def chain_step(p, cfg, x, pos, K, V, cos, sin):
    """The head's layer in NumPy for the replay: x (n, d) at positions pos attending to the cached
    K, V (m, KV, hd), then to themselves causally -> (h, their k, their v)."""
    q, k, v = project(x, p, cos[pos], sin[pos], cfg, np)
    n = len(pos)
    mask = np.concatenate([np.ones((n, len(K)), bool), np.tril(np.ones((n, n), bool))], axis=1)
    x = x + attend(q, np.concatenate([K, k]), np.concatenate([V, v]), mask, np) @ p["wo"].T
    return x + mlp(rms(x, p["ln2"], cfg["rms_norm_eps"], np), p["gate"], p["up"], p["down"], np), k, v


def cmd_eval(a):
    cfg, t = load_target(a.target, a.adapter)
    D = load_features(a.features)
    tmap = np.array(json.load(open(a.map)), np.int32)
    head = t["head"][tmap]
    embed = embed_in(t)
    p = dict(np.load(a.head))
    cos, sin = rope_tables(cfg, 8192)
    K = a.k
    runs = {}
    depth_ok, depth_n = np.zeros(K), np.zeros(K)
    n_first = 0
    for s in np.nonzero(D["held"])[0]:
        a0, b0 = int(D["starts"][s]), int(D["starts"][s + 1])
        ids, f = D["ids"][a0:b0], D["feats"][a0:b0].astype(np.float32)
        ans = np.nonzero(D["answer"][a0:b0])[0]
        if len(ans) < 2:
            continue
        # teacher-forced draft rows: position i has input (x_i, f_{i-1}), i >= 1
        x = np.concatenate([embed[ids[1:]], f[:-1]], axis=1) @ p["fc_w"].T + p["fc_b"]
        pos = np.arange(1, len(ids))
        _, Kc, Vc = project(x, p, cos[pos], sin[pos], cfg, np)  # the cache after real tokens (row r: position r + 1)
        acc = []
        # at answer position j+1 (the token x_{j+1} just emitted), draft x_{j+2}.. with the cache of 1..j
        for j1 in ans[:-1]:
            j = j1 - 1
            h_prev, tok, run = f[j], ids[j1], 0
            Kp, Vp = Kc[:j], Vc[:j]
            for d in range(min(K, len(ids) - 1 - j1)):
                xin = np.concatenate([embed[tok], h_prev])[None] @ p["fc_w"].T + p["fc_b"]
                h, k, v = chain_step(p, cfg, xin, np.array([j1 + d]), Kp, Vp, cos, sin)
                if a.oracle:  # the target's own feature in place of the head's: checks the indexing
                    h = f[j1 + d][None]
                Kp, Vp = np.concatenate([Kp, k]), np.concatenate([Vp, v])
                tok = int(tmap[np.argmax(h[0] @ head.T)])
                h_prev = h[0]
                depth_n[d] += 1
                if tok != ids[j1 + d + 1]:
                    break
                depth_ok[d] += 1
                run += 1
            acc.append(run)
        n_first += 1
        runs.setdefault(f"file {int(D['src'][s])}", []).append(acc)
    print(f"eval: {n_first} held-out conversations, K = {K}")
    for d in range(K):
        print(f"  depth {d + 1}: {int(depth_ok[d])}/{int(depth_n[d])} accepted given the ones before "
              f"({depth_ok[d] / max(1, depth_n[d]):.3f})")
    for name, rr in runs.items():
        if not rr:
            continue
        for k in range(1, K + 1):
            for c, e in [(c, float(e)) for e in a.e.split(",") for c in (0.125, 0.25)]:
                toks = steps = cost = 0
                for acc in rr:
                    i = 0
                    while i < len(acc):
                        r = min(acc[i], k)
                        toks += r + 1
                        steps += 1
                        cost += 1 + c * k + e * k
                        i += r + 1
                print(f"  {name}: K {k} c {c} e {e}: {toks / steps:.2f} tokens a step, ratio {toks / cost:.2f}x")


# the probe's head parameters -> EAGLE-1's tensor names (export)
EXPORT_NAMES = {"fc_w": "fc.weight", "fc_b": "fc.bias", "wq": "layers.0.self_attn.q_proj.weight",
                "wk": "layers.0.self_attn.k_proj.weight", "wv": "layers.0.self_attn.v_proj.weight",
                "wo": "layers.0.self_attn.o_proj.weight", "ln2": "layers.0.post_attention_layernorm.weight",
                "gate": "layers.0.mlp.gate_proj.weight", "up": "layers.0.mlp.up_proj.weight",
                "down": "layers.0.mlp.down_proj.weight"}


def cmd_export(a):
    from make_draft import write_safetensors
    cfg = {"rope_style": "halves"} if a.target.endswith(".gguf") else json.load(open(f"{a.target}/config.json"))
    p = dict(np.load(a.head))
    write_safetensors(a.out, {EXPORT_NAMES[k]: v for k, v in p.items()},
                      {"rope_style": cfg.get("rope_style", "halves"), "format": "eagle-1"})
    print(f"export: {len(p)} tensors -> {a.out}")


def cmd_map(a):
    """The token map of a features file (for targets without a Hugging Face tokenizer.json, where
    tools/draft_token_map.py needs one): the --n ids most frequent among the training
    conversations' answer tokens (then their prompts' tokens, when the answers hold fewer distinct
    ones), and the given --keep ids (BOS, the end of turn) always."""
    D = load_features(a.features)
    train = np.zeros(len(D["ids"]), bool)
    for s in np.nonzero(~D["held"])[0]:
        train[int(D["starts"][s]):int(D["starts"][s + 1])] = True
    ans = D["ids"][train & D["answer"]]
    keep = [int(x) for x in a.keep.split(",") if x]
    order = []
    # the answers' tokens by frequency, then (when they are fewer than --n) the prompts' too
    for pool in (ans, D["ids"][train]):
        counts = np.bincount(pool)
        seen = set(keep) | set(order)
        order += [int(i) for i in np.argsort(-counts, kind="stable") if counts[i] > 0 and int(i) not in seen]
    ids = sorted(keep + order[: a.n - len(keep)])
    json.dump(ids, open(a.out, "w"))
    covered = int(np.isin(ans, ids).sum())
    print(f"map: {len(ids)} ids cover {covered}/{len(ans)} training answer tokens ({covered / max(1, len(ans)):.3f}) "
          f"-> {a.out}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("features")
    f.add_argument("--target", required=True)
    f.add_argument("--data", required=True)
    f.add_argument("--out", required=True)
    f.add_argument("--limit", type=int, default=0, help="keep the training conversations before this index of each file (0: all); the held-out 5 %% always kept")
    f.add_argument("--skip", type=int, default=0, help="leave out the first this many training conversations of each file")
    f.add_argument("--max-len", type=int, default=1024)
    f.add_argument("--shardlm", help="a Gemma 3 GGUF target: the shardlm binary whose server tokenizes")
    f.add_argument("--check", type=int, default=20, help="a Gemma 3 GGUF target: conversations whose greedy tokens are checked")
    tr, ev = sub.add_parser("train"), sub.add_parser("eval")
    for p in (f, tr, ev):
        p.add_argument("--adapter", help="a PEFT LoRA adapter merged into a Gemma 3 GGUF target (the served adapter)")
    for p in (tr, ev):
        for name in ("--target", "--map"):
            p.add_argument(name, required=True)
        p.add_argument("--features", required=True, help="features files (comma-separated: read as one)")
    tr.add_argument("--out", required=True)
    tr.add_argument("--epochs", type=int, default=4)
    tr.add_argument("--seq", type=int, default=256)
    tr.add_argument("--batch", type=int, default=8)
    tr.add_argument("--lr", type=float, default=6e-4)
    tr.add_argument("--noise", type=float, default=0.05, help="uniform feature noise, a fraction of their rms")
    tr.add_argument("--p-weight", type=float, default=0.1)
    tr.add_argument("--seed", type=int, default=0)
    tr.add_argument("--log", type=int, default=20)
    tr.add_argument("--init", help="a head (train's --out) to start from instead of the target's last layer")
    tr.add_argument("--unroll", action="store_true",
                    help="also train the second draft of a chain on the head's own first output (EAGLE-3's training-time test, two steps)")
    ev.add_argument("--head", required=True)
    ev.add_argument("--k", type=int, default=5)
    ev.add_argument("--e", default="0.08,0.15", help="a draft token's costs to try, fractions of a plain step")
    ev.add_argument("--oracle", action="store_true", help="draft with the target's own features (a check)")
    mp = sub.add_parser("map")
    mp.add_argument("--features", required=True)
    mp.add_argument("--n", type=int, default=8192)
    mp.add_argument("--keep", default="", help="ids always kept, comma-separated (BOS, end of turn)")
    mp.add_argument("--out", required=True)
    ex = sub.add_parser("export")
    for name in ("--target", "--head", "--out"):
        ex.add_argument(name, required=True)
    a = ap.parse_args()
    {"features": cmd_features, "train": cmd_train, "eval": cmd_eval, "map": cmd_map, "export": cmd_export}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
