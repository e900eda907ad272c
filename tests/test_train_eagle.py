#!/usr/bin/env python3
"""An EAGLE head trained by shardlm (engine/train/eagle_train.c), against JAX + optax, then served.

  python3 test_train_eagle.py TEST_TRAIN_STEP SHARDLM GOLDEN_DIR

1. Steps (tests/test_train_step.c --eagle): for small random Llama and Gemma 3 targets (the ones
   of test_train_grad.py), 3 AdamW steps of a head over 2 micro-batches of packed documents with
   masked rows, clipped by the global norm. The reference, written for this test in float64 JAX:
   the target's forward gives its rows after the final norm, each row of a document reading the
   row before (zeros at the first, which carries no loss); the head's input is
   x = embed(t) W_e^T + f W_f^T + b (Gemma's embedding times sqrt(d)), then one Llama layer with
   no attention norm, no final norm, the target's own LM head, the cross-entropy against the
   data's next token; optax.adamw with weight decay on matrices. Checks: each step's loss within
   1e-5 relative, the gradient norms within 1e-4, every head parameter after the steps within
   1e-5; the target's weights bit for bit unchanged; the head's start (the target's last layer,
   o and down x 0.05, fc = [0 | I]); the written file holds the final weights under EAGLE's names;
   and with a token map (--spec-token-map: the LM head's rows of its ids, the targets outside it
   masked), with EAGLE-1's feature regression (--eagle-feature-loss: w x the mean smooth-L1 of
   the head's output against the model's own row), and with its noise on the features the head
   reads (--eagle-feature-noise: each row plus amount x its rms x u, u drawn here as
   eagle_train.c's noise_u draws it for each micro-batch, row and column), and unrolled
   (--eagle-unroll: a second pass per micro-batch whose row p reads the first pass's output row
   p - 1 under stop_gradient, its loss added), the same steps.
2. Served: stories260K (tests/golden_setup.sh), a head trained by `shardlm train --eagle-head` on
   stories the model sampled itself, then `shardlm generate --speculative eagle`: the greedy
   text equals the text without speculation, and at least 30 % of the drafts are accepted
   (42 % here; by hand, a head trained 30 steps on Shakespeare instead had 0 of 32 accepted);
   the frozen model's rows cached after the first epoch train the same head as its forward run
   every epoch; --eagle-init continues from the trained head's tensors; checkpoints
   (--save-interval, SIGTERM) resume bit for bit, the resume taking the run's settings (regression,
   noise, unroll) from the checkpoint and refusing other values. A head trained with --spec-token-map carries the
   map (int32 token_map): served without the flag it drafts as with it; a map given to the server
   replaces it; --eagle-init keeps it; a token_map descending or outside the vocabulary is refused.
3. Refusals: --eagle-ffn, --spec-token-map, --eagle-init, --eagle-feature-noise, --eagle-unroll without --eagle-head; --eagle-head with
   LoRA, bf16, --rank-timeout, or --eagle-init beside --resume; a token map that is not one, a head of other shapes to
   continue, --out the model.

Prints one line per check and "N passed, M failed"; exits 77 (SKIP) without jax/optax.
"""

import json
import math
import os
import re
import subprocess
import sys
import signal
import struct
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "reference"))
sys.dont_write_bytecode = True

try:
    import jax  # noqa: F401  (test_train_step's AdamW reference)
    import jax.numpy as jnp
    import optax  # noqa: F401
except ImportError:
    print("SKIP: train_eagle: jax/optax are not installed (tools/install_deps.sh installs them)")
    sys.exit(77)

import test_train_grad as TG  # noqa: E402  (its forward, models and batches)
import test_train_step as TS  # noqa: E402  (the AdamW reference and its settings, max_rel)

N_PASS = 0
N_FAIL = 0
STEPS, LR, WD, EPS, CLIP = TS.STEPS, TS.LR, TS.WD, TS.EPS, 0.5
max_rel = TS.max_rel
HEAD_KEYS = ("q", "k", "v", "o", "mlp_norm", "gate", "up", "down")


def check(ok, msg):
    global N_PASS, N_FAIL
    print(("PASS " if ok else "FAIL ") + msg, flush=True)
    if ok:
        N_PASS += 1
    else:
        N_FAIL += 1


NOISE_SEED = 77  # test_train_step.c's seed of the features' noise


def run_driver(driver, model_dir, prefix, ffn, batch_paths, token_map=None, feature_loss=0.0, noise=0.0, unroll=0):
    env = dict(os.environ, EAGLE_TOKEN_MAP=token_map or "", EAGLE_FEATURE_LOSS=repr(feature_loss),
               EAGLE_FEATURE_NOISE=repr(noise), EAGLE_UNROLL=str(unroll))
    r = subprocess.run([driver, "--eagle", model_dir, prefix, str(STEPS), repr(LR), repr(WD), repr(CLIP), repr(EPS),
                        str(ffn)] + batch_paths, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        raise RuntimeError("driver failed: %s" % r.stderr[-2000:])
    meta = json.load(open(prefix + ".json"))
    raw = open(prefix + ".bin", "rb").read()

    def read(t, key):
        n = int(np.prod(t["shape"]))
        return np.frombuffer(raw, np.float32, n, t[key]).reshape(t["shape"]).astype(np.float64)
    target = {"%s/%d" % (t["kind"], t["layer"]): read(t, "offset") for t in meta["target"]}
    after = {"%s/%d" % (t["kind"], t["layer"]): read(t, "after_offset") for t in meta["target"]}
    init = {t["name"]: read(t, "initial_offset") for t in meta["head"]}
    final = {t["name"]: read(t, "final_offset") for t in meta["head"]}
    return meta, target, after, init, final


def head_name(k, last):
    return "%s/%d" % (k, last)


def features(target, spec, batch):
    """The target's rows after its final norm, and the same shifted: row p reading row p - 1
    (zeros at position 0)."""
    jb = {k: jnp.asarray(v) for k, v in batch.items() if k != "doc_start"}
    h = np.asarray(TG.forward_loss({k: jnp.asarray(v) for k, v in target.items()}, spec, jb, hidden=True))
    f = np.zeros_like(h)
    pos = batch["positions"]
    for p in range(len(pos)):
        if pos[p] > 0:
            f[p] = h[p - 1]
    return h, f


def head_batch(batch, tmap=None):
    """The head's targets: none at a document's first row; with a token map, the target's index
    in it (none outside it)."""
    b = dict(batch)
    t = np.where(batch["positions"] > 0, batch["targets"], -1)
    if tmap is not None:
        row = {tok: i for i, tok in enumerate(tmap)}
        t = np.array([row.get(int(x), -1) if x >= 0 else -1 for x in t])
    b["targets"] = t
    return b


def noise_u(seed, call, rows, cols):
    """eagle_train.c's noise_u for every (row, column) of a micro-batch: a splitmix64 finalizer of
    the mix of (seed, micro-batch, row, column), as u in [-1, 1)."""
    u64 = np.uint64
    with np.errstate(over="ignore"):
        p = np.arange(rows, dtype=u64)[:, None]
        j = np.arange(cols, dtype=u64)[None, :]
        z = (np.full((1, 1), seed, u64) ^ (np.full((1, 1), call, u64) * u64(0x9E3779B97F4A7C15))
             ^ (p * u64(0xC2B2AE3D27D4EB4F)) ^ (j * u64(0x165667B19E3779F9)))
        z = (z ^ (z >> u64(30))) * u64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> u64(27))) * u64(0x94D049BB133111EB)
        z = z ^ (z >> u64(31))
    return (z >> u64(11)).astype(np.float64) / 2.0 ** 52 - 1.0


def noisy(f, amount, call):
    """The features a training micro-batch reads: each row plus amount x its rms x u."""
    rms = np.sqrt(np.mean(f * f, axis=1, keepdims=True))
    return f + amount * rms * noise_u(NOISE_SEED, call, f.shape[0], f.shape[1])


def smooth_l1(x):
    a = jnp.abs(x)
    return jnp.where(a < 1.0, 0.5 * x * x, a - 0.5)


def reference_steps(kind, cfg, spec, target, init, batches, last, tmap=None, feature_loss=0.0, noise=0.0, unroll=False):
    d = spec["d"]
    hspec = {"kind": "llama", "n_layers": 1, "d": d, "n_heads": spec["n_heads"], "n_kv": spec["n_kv"],
             "head_dim": spec["head_dim"], "scale": 1.0 / math.sqrt(spec["head_dim"]), "eps": spec["eps"],
             "theta": cfg["rope_theta"], "cfg": None, "tied": False, "no_attn_norm": True, "no_final_norm": True,
             "final_cap": spec.get("final_cap")}
    head_w = target["tok_embedding/-1"] if spec["tied"] else target["lm_head/-1"]
    if tmap is not None:  # the LM head's rows of the map's tokens
        head_w = head_w[np.asarray(tmap)]
    emb_scale = math.sqrt(d) if kind in ("gemma2", "gemma3") else 1.0
    prepared = []
    for b in batches:
        hb = head_batch(b, tmap)
        rows, shifted = features(target, spec, b)
        prepared.append(({k: jnp.asarray(v) for k, v in hb.items() if k != "doc_start"},
                         shifted, jnp.asarray(target["tok_embedding/-1"][b["tokens"]] * emb_scale),
                         jnp.asarray(rows), jnp.asarray(hb["targets"] >= 0), jnp.asarray(b["positions"] > 0)))
    n_targets = sum(int(np.sum(head_batch(b, tmap)["targets"] >= 0)) for b in batches)

    calls = [0]  # the micro-batches run so far: loss_fn runs once a step, in order

    def loss_fn(p):
        total = 0.0
        for jb, f, e, rows, real, inner in prepared:
            if noise:
                f = noisy(f, noise, calls[0])
            calls[0] += 1
            P = {"%s/0" % k: p[head_name(k, last)] for k in HEAD_KEYS}
            P["lm_head/-1"] = jnp.asarray(head_w)
            for step in range(2 if unroll else 1):
                x0 = e @ p["fc_emb"].T + p["fc_bias"] + jnp.asarray(f) @ p["fc_feat"].T
                total = total + TG.forward_loss(P, hspec, jb, x0=x0)
                h = TG.forward_loss(P, hspec, jb, x0=x0, hidden=True)
                if feature_loss:  # EAGLE-1's regression of the head's output on the model's own row
                    total = total + feature_loss * jnp.sum(jnp.where(real, jnp.mean(smooth_l1(h - rows), axis=1), 0.0))
                # --eagle-unroll: the next pass reads the head's own row p - 1, taken as given
                g = jax.lax.stop_gradient(h)
                f = jnp.where(inner[:, None], jnp.concatenate([jnp.zeros_like(g[:1]), g[:-1]], axis=0), 0.0)
        return total / n_targets

    return TS.adamw_steps(loss_fn, init, CLIP)


def steps_check(driver, tmp):
    for kind in ("llama", "gemma3"):
        mdir = os.path.join(tmp, kind)
        cfg = TG.write_model(kind, mdir)
        spec = TG.spec_of(kind, cfg)
        last = cfg["num_hidden_layers"] - 1
        b1 = TG.make_batch(cfg["vocab_size"], seed=31, doc_lens=(9, 4, 6))
        b2 = TG.make_batch(cfg["vocab_size"], seed=32, doc_lens=(13, 2))
        paths = []
        for i, b in enumerate((b1, b2)):
            p = os.path.join(tmp, "%s_mb%d.batch" % (kind, i))
            TG.write_batch(p, b, 1.0)
            paths.append(p)
        prefix = os.path.join(tmp, kind + "_eagle")
        meta, target, after, init, final = run_driver(driver, mdir, prefix, 0, paths)
        spec["tied"] = bool(meta["tied"])
        same = all(np.array_equal(target[k], after[k]) for k in target)
        check(same, "%s: the target's %d tensors are unchanged by the head's steps" % (kind, len(target)))
        start = [np.allclose(init[head_name(k, last)], target["%s/%d" % (k, last)] * (0.05 if k in ("o", "down") else 1),
                             rtol=1e-6, atol=0) for k in HEAD_KEYS]
        D = spec["d"]
        start.append(np.array_equal(init["fc_emb"], np.zeros((D, D))) and np.array_equal(init["fc_feat"], np.eye(D))
                     and not np.any(init["fc_bias"]))
        check(all(start), "%s: the head starts as the target's last layer (o, down x 0.05), fc = [0 | I]" % kind)
        losses, norms, ref = reference_steps(kind, cfg, spec, target, init, [b1, b2], last)
        lrel = max(abs(a - b) / abs(b) for a, b in zip(meta["losses"], losses))
        check(lrel < 1e-5, "%s: %d step losses %s match JAX (worst rel %.1e)"
              % (kind, STEPS, " ".join("%.5f" % x for x in meta["losses"]), lrel))
        nrel = max(abs(a - b) / b for a, b in zip(meta["grad_norms"], norms))
        check(nrel < 1e-4, "%s: gradient norms %s match (worst rel %.1e)"
              % (kind, " ".join("%.4f" % x for x in meta["grad_norms"]), nrel))
        prel, pkey = max_rel(final, ref)
        check(prel < 1e-5, "%s: every head parameter after %d AdamW steps within 1e-5 of optax (worst %.1e, %s)"
              % (kind, STEPS, prel, pkey))
        moved, mkey = max_rel(init, final)
        check(moved > 1e-4, "%s: the head moved (rel %.1e, %s)" % (kind, moved, mkey))
        st = TG.read_safetensors(prefix + ".safetensors")
        names = {"self_attn.q_proj": "q", "self_attn.k_proj": "k", "self_attn.v_proj": "v", "self_attn.o_proj": "o",
                 "mlp.gate_proj": "gate", "mlp.up_proj": "up", "mlp.down_proj": "down"}
        ok = np.array_equal(st["fc.weight"], np.concatenate([final["fc_emb"], final["fc_feat"]], axis=1))
        ok = ok and np.array_equal(st["fc.bias"], final["fc_bias"])
        ok = ok and np.array_equal(st["layers.0.post_attention_layernorm.weight"], final[head_name("mlp_norm", last)])
        for n, k in names.items():
            ok = ok and np.array_equal(st["layers.0.%s.weight" % n], final[head_name(k, last)])
        check(ok and len(st) == 10, "%s: the head's file holds the final weights under EAGLE's %d names" % (kind, len(st)))
        if kind != "llama":
            continue
        # A token map: the head's logits over 2 of every 3 ids (targets outside it carry no loss).
        tmap = [i for i in range(cfg["vocab_size"]) if i % 3]
        mpath = os.path.join(tmp, "map.json")
        with open(mpath, "w") as f:
            json.dump(tmap[::-1], f)  # any order: the rows follow the ids ascending
        meta, target, _, init, final = run_driver(driver, mdir, prefix + "_map", 0, paths, mpath)
        spec["tied"] = bool(meta["tied"])
        losses, norms, ref = reference_steps(kind, cfg, spec, target, init, [b1, b2], last, tmap)
        lrel = max(abs(a - b) / abs(b) for a, b in zip(meta["losses"], losses))
        prel, pkey = max_rel(final, ref)
        nrel = max(abs(a - b) / b for a, b in zip(meta["grad_norms"], norms))
        check(lrel < 1e-5 and nrel < 1e-4 and prel < 1e-5, "%s, token map of %d ids: losses %s, norms, parameters "
              "match JAX (rel %.1e, %.1e, %.1e)" % (kind, len(tmap), " ".join("%.5f" % x for x in meta["losses"]),
                                                   lrel, nrel, prel))
        carried = read_token_map(prefix + "_map.safetensors")
        check(carried is not None and carried.tolist() == tmap, "%s: the head's file carries its token map as int32 "
              "token_map, ascending (%s ids)" % (kind, None if carried is None else len(carried)))
        # EAGLE-1's feature regression beside the token loss (--eagle-feature-loss 10: the probe's 1 : 0.1).
        meta, target, _, init, final = run_driver(driver, mdir, prefix + "_feat", 0, paths, feature_loss=10.0)
        losses, norms, ref = reference_steps(kind, cfg, spec, target, init, [b1, b2], last, feature_loss=10.0)
        lrel = max(abs(a - b) / abs(b) for a, b in zip(meta["losses"], losses))
        prel, pkey = max_rel(final, ref)
        nrel = max(abs(a - b) / b for a, b in zip(meta["grad_norms"], norms))
        check(lrel < 1e-5 and nrel < 1e-4 and prel < 1e-5, "%s, feature regression at weight 10: losses %s, norms, "
              "parameters match JAX (rel %.1e, %.1e, %.1e)" % (kind, " ".join("%.5f" % x for x in meta["losses"]),
                                                              lrel, nrel, prel))
        # EAGLE-1's noise on the features (--eagle-feature-noise 0.2) with the regression: the same
        # steps with the noise drawn here; the noise-free reference must then differ.
        meta, target, _, init, final = run_driver(driver, mdir, prefix + "_noise", 0, paths, feature_loss=10.0,
                                                  noise=0.2)
        noisy_one = final
        losses, norms, ref = reference_steps(kind, cfg, spec, target, init, [b1, b2], last, feature_loss=10.0,
                                             noise=0.2)
        lrel = max(abs(a - b) / abs(b) for a, b in zip(meta["losses"], losses))
        prel, pkey = max_rel(final, ref)
        nrel = max(abs(a - b) / b for a, b in zip(meta["grad_norms"], norms))
        _, _, clean = reference_steps(kind, cfg, spec, target, init, [b1, b2], last, feature_loss=10.0)
        off, _ = max_rel(final, clean)
        check(lrel < 1e-5 and nrel < 1e-4 and prel < 1e-5 and off > 1e-3,
              "%s, feature noise 0.2: losses %s, norms, parameters match JAX with the same noise (rel %.1e, %.1e, "
              "%.1e; %.1e from the noise-free steps)" % (kind, " ".join("%.5f" % x for x in meta["losses"]), lrel,
                                                         nrel, prel, off))
        # --eagle-unroll with the regression and the noise: a second pass per micro-batch reading the first
        # pass's outputs (no gradient through them); the one-pass reference must then differ.
        meta, target, _, init, final = run_driver(driver, mdir, prefix + "_unroll", 0, paths, feature_loss=10.0,
                                                  noise=0.2, unroll=1)
        losses, norms, ref = reference_steps(kind, cfg, spec, target, init, [b1, b2], last, feature_loss=10.0,
                                             noise=0.2, unroll=True)
        lrel = max(abs(a - b) / abs(b) for a, b in zip(meta["losses"], losses))
        prel, pkey = max_rel(final, ref)
        nrel = max(abs(a - b) / b for a, b in zip(meta["grad_norms"], norms))
        off, _ = max_rel(final, noisy_one)
        check(lrel < 1e-5 and nrel < 1e-4 and prel < 1e-5 and off > 1e-3,
              "%s, unrolled (a second pass on the head's own outputs), regression and noise: losses %s, norms, "
              "parameters match JAX (rel %.1e, %.1e, %.1e; %.1e from one pass)"
              % (kind, " ".join("%.5f" % x for x in meta["losses"]), lrel, nrel, prel, off))


def run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, **kw)


def read_token_map(path):
    """The int32 token_map tensor of a head file (None when it has none)."""
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    t = json.loads(raw[8:8 + n]).get("token_map")
    if not t or t["dtype"] != "I32":
        return None
    a, b = t["data_offsets"]
    return np.frombuffer(raw[8 + n + a:8 + n + b], "<i4").reshape(t["shape"])


def with_token_map(src, dst, ids):
    """A copy of head file src whose token_map tensor is ids (int32), written as it is."""
    raw = open(src, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    head = json.loads(raw[8:8 + n])
    body = bytearray(raw[8 + n:])
    for k in [k for k in head if k == "token_map"]:
        del head[k]  # (its bytes stay, unreferenced)
    data = np.asarray(ids, "<i4").tobytes()
    head["token_map"] = {"dtype": "I32", "shape": [len(ids)], "data_offsets": [len(body), len(body) + len(data)]}
    body += data
    hj = json.dumps(head).encode()
    hj += b" " * ((-len(hj)) % 8)
    with open(dst, "wb") as f:
        f.write(struct.pack("<Q", len(hj)) + hj + bytes(body))


def token_map_check(shardlm, model, data, tmp):
    """A head trained with --spec-token-map carries the map (token_map): served without the flag it
    drafts as with it; a map given to the server replaces it; a head continued keeps it; a bad one
    is refused by name."""
    tmap = [i for i in range(512) if i % 4 != 3]
    mpath = os.path.join(tmp, "map384.json")
    with open(mpath, "w") as f:
        json.dump(tmap, f)
    out = os.path.join(tmp, "mapped")
    r = run([shardlm, "train", "--eagle-head", "--model", model, "--data", data, "--out", out, "--epochs", "2",
             "--seq-length", "128", "--micro-batch-size", "8", "--lr", "3e-3", "--spec-token-map", mpath,
             "--threads", "2"])
    head = os.path.join(out, "eagle_head.safetensors")
    carried = read_token_map(head) if r.returncode == 0 else None
    check(carried is not None and carried.tolist() == tmap, "train --eagle-head --spec-token-map: the head carries "
          "the map (%s ids; exit %d)" % (None if carried is None else len(carried), r.returncode))
    if carried is None:
        print(r.stderr[-1500:])
        return
    base = [shardlm, "generate", "--model", model, "--prompt", "Once upon a time", "--max-tokens", "80",
            "--threads", "1"]
    spec = base + ["--speculative", "eagle", "--draft-model", head, "--spec-draft", "2"]
    every = dict(os.environ, SHARDLM_SPEC_PRIOR="0")  # the counts compared: no time gate (timing varies)
    runs = [run(base), run(spec, env=every), run(spec + ["--spec-token-map", mpath], env=every)]
    counts = [re.search(r"(\d+) drafts verified, (\d+) accepted", x.stderr) for x in runs[1:]]
    ok = all(x.returncode == 0 for x in runs) and all(counts) and runs[1].stdout == runs[0].stdout == runs[2].stdout
    ok = ok and counts[0].groups() == counts[1].groups() and int(counts[0].group(1)) > 0
    check(ok and "head cut to the 384 tokens of %s (its token_map)" % head in runs[1].stderr,
          "served without --spec-token-map the head drafts over its own map as with the flag (%s drafts, %s "
          "accepted; the same greedy text)" % (counts[0] and counts[0].group(1), counts[0] and counts[0].group(2)))
    other = os.path.join(tmp, "map256.json")
    with open(other, "w") as f:
        json.dump(list(range(256)), f)
    r = run(spec + ["--spec-token-map", other])
    check(r.returncode == 0 and r.stdout == runs[0].stdout and "head cut to the 256 tokens of %s" % other in r.stderr,
          "a --spec-token-map given to the server replaces the head's own (256 ids; the same text)")
    cont = os.path.join(tmp, "mapped_more")
    r = run([shardlm, "train", "--eagle-head", "--model", model, "--data", data, "--out", cont, "--eagle-init", head,
             "--train-iters", "1", "--seq-length", "128", "--threads", "2"])
    kept = read_token_map(os.path.join(cont, "eagle_head.safetensors")) if r.returncode == 0 else None
    check(kept is not None and kept.tolist() == tmap, "--eagle-init from it without --spec-token-map: the head "
          "continued keeps its map (exit %d)" % r.returncode)
    for ids, why in (([5, 3, 9], "token_map entry 1 (3) is not above the one before it"),
                     ([1, 512], "token_map entry 1 (512) is outside the vocabulary")):
        bad = os.path.join(tmp, "bad_map.safetensors")
        with_token_map(head, bad, ids)
        r = run(base + ["--speculative", "eagle", "--draft-model", bad])
        check(r.returncode != 0 and why in r.stderr, "a head whose token_map is %s: refused (%s)"
              % (ids, r.stderr.strip().splitlines()[-1][-160:] if r.stderr.strip() else "no message"))


def served_check(shardlm, golden, tmp):
    model = os.path.join(golden, "stories260K")
    if not os.path.isdir(model):
        print("SKIP: served: no %s (tests/golden_setup.sh)" % model)
        return
    data = os.path.join(tmp, "own.jsonl")
    with open(data, "w") as f:  # the model's own sampled stories: what the head learns to predict
        for seed in range(1, 201):
            r = run([shardlm, "generate", "--model", model, "--max-tokens", "200", "--temperature", "0.9",
                     "--seed", str(seed), "--threads", "1"])
            if r.returncode != 0:
                check(False, "generate for the data: %s" % r.stderr[-500:])
                return
            f.write(json.dumps({"text": r.stdout}) + "\n")
    out = os.path.join(tmp, "head")
    r = run([shardlm, "train", "--eagle-head", "--model", model, "--data", data, "--out", out, "--epochs", "6",
             "--seq-length", "256", "--micro-batch-size", "4", "--lr", "3e-3", "--lr-warmup-iters", "10",
             "--log-interval", "20", "--split", "95,5", "--threads", "2"])
    head = os.path.join(out, "eagle_head.safetensors")
    wrote = r.returncode == 0 and os.path.exists(head)
    check(wrote, "shardlm train --eagle-head wrote %s" % head)
    if not wrote:
        print(r.stderr[-2000:])
        return
    rows = [json.loads(x) for x in open(os.path.join(out, "metrics.jsonl"))]
    losses = [x["loss"] for x in rows if "loss" in x]
    evals = [x["eval_loss"] for x in rows if "eval_loss" in x]
    check(len(losses) > 20 and np.mean(losses[-5:]) < 0.7 * np.mean(losses[:5]) and len(evals) == 1,
          "the head's training loss fell from %.3f to %.3f over %d iterations; held-out %.3f"
          % (np.mean(losses[:5]), np.mean(losses[-5:]), len(losses), evals[0] if evals else float("nan")))
    # --eagle-init: the head continued (one step at a negligible rate leaves it where it was).
    cont = os.path.join(tmp, "continued")
    rc = run([shardlm, "train", "--eagle-head", "--model", model, "--data", data, "--out", cont, "--eagle-init", head,
              "--train-iters", "1", "--seq-length", "128", "--lr", "1e-12", "--threads", "2"])
    h0 = TG.read_safetensors(head)
    h1 = TG.read_safetensors(os.path.join(cont, "eagle_head.safetensors")) if rc.returncode == 0 else {}
    crel = max((np.max(np.abs(h1[k] - h0[k])) / max(np.max(np.abs(h0[k])), 1e-30) for k in h0 if k in h1), default=1.0)
    check(rc.returncode == 0 and sorted(h1) == sorted(h0) and crel < 1e-6,
          "--eagle-init: a head continued from the trained one starts from its %d tensors (after one step at lr "
          "1e-12: rel %.1e)" % (len(h0), crel))
    # The frozen model's rows kept after the first epoch (the default) against recomputed every
    # epoch (SHARDLM_EAGLE_FEATURE_CACHE_MB=0): the same training, on 40 stories for 3 epochs.
    small = os.path.join(tmp, "own40.jsonl")
    with open(data) as f, open(small, "w") as g:
        g.writelines(f.readlines()[:40])
    runs = []
    for mb in ("8192", "0"):
        o = os.path.join(tmp, "cache" + mb)
        rc = run([shardlm, "train", "--eagle-head", "--model", model, "--data", small, "--out", o, "--epochs", "3",
                  "--seq-length", "128", "--micro-batch-size", "8", "--lr", "3e-3", "--threads", "2"],
                 env=dict(os.environ, SHARDLM_EAGLE_FEATURE_CACHE_MB=mb))
        m = re.search(r"ran (\d+) micro-batches; (\d+) read its rows from the cache", rc.stderr)
        runs.append((rc.returncode, [json.loads(x)["loss"] for x in open(os.path.join(o, "metrics.jsonl"))]
                     if rc.returncode == 0 else [], m.groups() if m else None,
                     TG.read_safetensors(os.path.join(o, "eagle_head.safetensors")) if rc.returncode == 0 else {}))
    (rc1, l1, n1, h1), (rc2, l2, n2, h2) = runs
    hrel = max((np.max(np.abs(h1[k] - h2[k])) / max(np.max(np.abs(h2[k])), 1e-30) for k in h2), default=1.0)
    check(rc1 == 0 and rc2 == 0 and l1 and len(l1) == len(l2) and max(abs(a - b) for a, b in zip(l1, l2)) < 1e-6
          and hrel < 1e-6 and n1 and n2 and int(n1[1]) > 0 and n2[1] == "0",
          "the cached features train the same head as the model run every epoch (%s against %s micro-batches "
          "from the cache; parameters rel %.1e)" % (n1 and n1[1], n2 and n2[1], hrel))
    resume_check(shardlm, model, small, tmp)
    token_map_check(shardlm, model, small, tmp)
    drafted = accepted = 0
    same = 0
    prompts = ("Once upon a time", "Tom and his dog", "The little girl", "One day, a bird")
    for prompt in prompts:
        base = [shardlm, "generate", "--model", model, "--prompt", prompt, "--max-tokens", "120", "--threads", "1"]
        plain = run(base)
        # the head's acceptance, not the time gate's choices (SHARDLM_SPEC_PRIOR=0: every step drafts)
        spec = run(base + ["--speculative", "eagle", "--draft-model", head, "--spec-draft", "2"],
                   env=dict(os.environ, SHARDLM_SPEC_PRIOR="0"))
        m = re.search(r"(\d+) drafts verified, (\d+) accepted", spec.stderr)
        if plain.returncode != 0 or spec.returncode != 0 or not m:
            check(False, "generate %r: %s %s" % (prompt, plain.stderr[-300:], spec.stderr[-300:]))
            return
        same += plain.stdout == spec.stdout
        drafted += int(m.group(1))
        accepted += int(m.group(2))
    check(same == len(prompts), "greedy text with the trained head = without speculation (%d of %d prompts)"
          % (same, len(prompts)))
    rate = accepted / max(drafted, 1)
    check(rate >= 0.3, "the trained head's drafts accepted: %d of %d (%.1f %%; at least 30 %% required)"
          % (accepted, drafted, 100 * rate))


def resume_check(shardlm, model, data, tmp):
    """Checkpoints: 400 iterations straight (--save-interval 100), resumed from the one at 200,
    and stopped by SIGTERM and resumed from --out: the same head and state, bit for bit (the
    feature noise and regression on, so the noise's stream must resume where it was)."""
    common = ["train", "--eagle-head", "--model", model, "--data", data, "--train-iters", "400", "--seq-length",
              "128", "--micro-batch-size", "2", "--lr", "3e-3", "--eagle-feature-loss", "10",
              "--eagle-feature-noise", "0.1", "--threads", "1", "--seed", "9"]
    files = ("eagle_head.safetensors", "train_state.safetensors")

    def same(a, b):
        return all(os.path.exists(os.path.join(a, f)) and os.path.exists(os.path.join(b, f))
                   and open(os.path.join(a, f), "rb").read() == open(os.path.join(b, f), "rb").read() for f in files)

    straight = os.path.join(tmp, "straight")
    r = run([shardlm] + common + ["--out", straight, "--save-interval", "100", "--keep-checkpoints", "0"])
    ck = os.path.join(straight, "checkpoints", "iter_0000200")
    check(r.returncode == 0 and all(os.path.exists(os.path.join(ck, f)) for f in files),
          "--save-interval 100: checkpoints of the head and its state (exit %d)" % r.returncode)
    resumed = os.path.join(tmp, "resumed")
    # (the settings left out: the checkpoint's, --eagle-feature-loss 10 and --eagle-feature-noise 0.1, go on)
    bare = [x for i, x in enumerate(common) if x not in ("--eagle-feature-loss", "--eagle-feature-noise")
            and common[i - 1] not in ("--eagle-feature-loss", "--eagle-feature-noise")]
    r = run([shardlm] + bare + ["--out", resumed, "--resume", ck])
    losses = [[json.loads(x)["loss"] for x in open(os.path.join(d, "metrics.jsonl")) if '"loss"' in x]
              for d in (straight, resumed)] if r.returncode == 0 else [[], []]
    check(r.returncode == 0 and same(straight, resumed) and losses[1] == losses[0][200:],
          "--resume at iteration 200 without the run's settings (taken from the checkpoint): the head and state "
          "after 400 equal the straight run's bit for bit, iterations 201-400 the same losses (exit %d)" % r.returncode)
    for extra, why in ((["--eagle-feature-loss", "5"], "the run trained with --eagle-feature-loss 10, 5 given"),
                       (["--eagle-unroll"], "the run trained without --eagle-unroll")):
        r = run([shardlm] + bare + extra + ["--out", os.path.join(tmp, "resumed_other"), "--resume", ck])
        check(r.returncode != 0 and why in r.stderr, "--resume with %s: refused (%s)"
              % (" ".join(extra), r.stderr.strip().splitlines()[-1][-150:] if r.stderr.strip() else "no message"))
    stopped = os.path.join(tmp, "stopped")
    p = subprocess.Popen([shardlm] + common + ["--out", stopped], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                         text=True)
    metrics = os.path.join(stopped, "metrics.jsonl")
    for _ in range(600):  # up to 60 s for the first iteration
        if p.poll() is not None or (os.path.exists(metrics) and open(metrics).read().count("\n") >= 2):
            break
        time.sleep(0.1)
    p.send_signal(signal.SIGTERM)
    try:
        err = p.communicate(timeout=120)[1]
    except subprocess.TimeoutExpired:
        p.kill()
        err = p.communicate()[1]
    m = re.search(r"stopped by a signal after iteration (\d+) of 400; checkpoint (\S+) written", err)
    check(p.returncode == 128 + signal.SIGTERM and m is not None,
          "SIGTERM: exit %d, %s" % (p.returncode, m.group(0) if m else err.strip()[-300:]))
    r = run([shardlm] + common + ["--out", stopped, "--resume", stopped])
    check(r.returncode == 0 and same(straight, stopped), "--resume OUT after the signal (iteration %s): the same head "
          "and state as the straight run, bit for bit (exit %d)" % (m.group(1) if m else "?", r.returncode))
    r = run([shardlm, "train", "--model", model, "--data", data, "--train-iters", "1", "--out",
             os.path.join(tmp, "wrong"), "--resume", straight])
    check(r.returncode != 0 and "an EAGLE head's checkpoint: continue it with --eagle-head" in r.stderr,
          "the model's own training refuses an EAGLE head's checkpoint by name")


def refusals_check(shardlm, golden, tmp):
    model = os.path.join(golden, "stories260K")
    if not os.path.isdir(model):
        return
    data = os.path.join(tmp, "tiny.txt")
    with open(data, "w") as f:
        f.write("Once upon a time there was a cat. " * 20)
    base = [shardlm, "train", "--model", model, "--data", data, "--train-iters", "1", "--seq-length", "32"]
    cases = [
        (["--eagle-ffn", "64", "--out", os.path.join(tmp, "r1")], "--eagle-ffn applies to --eagle-head"),
        (["--spec-token-map", data, "--out", os.path.join(tmp, "r0")], "--spec-token-map applies to --eagle-head"),
        (["--eagle-head", "--spec-token-map", data, "--out", os.path.join(tmp, "r4")], "not a JSON array"),
        (["--eagle-head", "--lora-rank", "4", "--out", os.path.join(tmp, "r2")], "--lora-rank"),
        (["--eagle-head", "--bf16", "--out", os.path.join(tmp, "r3")], "--bf16"),
        (["--eagle-head", "--rank-timeout", "5", "--out", os.path.join(tmp, "r8")],
         "--rank-timeout does not apply to --eagle-head"),
        (["--eagle-head", "--resume", os.path.join(tmp, "straight"), "--eagle-init", os.path.join(tmp, "x"), "--out",
          os.path.join(tmp, "r5")], "--eagle-init does not apply"),
        (["--eagle-init", data, "--out", os.path.join(tmp, "r6")], "--eagle-init applies to --eagle-head"),
        (["--eagle-feature-noise", "0.1", "--out", os.path.join(tmp, "r9")],
         "--eagle-feature-noise applies to --eagle-head"),
        (["--eagle-unroll", "--out", os.path.join(tmp, "r11")], "--eagle-unroll applies to --eagle-head"),
        (["--eagle-head", "--eagle-feature-noise", "-1", "--out", os.path.join(tmp, "r10")],
         "--eagle-feature-noise must be a number in [0, 10]"),
        (["--eagle-head", "--eagle-init", os.path.join(tmp, "gemma3_eagle.safetensors"), "--out",
          os.path.join(tmp, "r7")], "tensor fc.weight is F32 of 2 dimensions (48 x 96); the head needs float (64 x 128)"),
        (["--eagle-head", "--out", model], model.rstrip("/")),
    ]
    for extra, want in cases:
        r = run(base + extra)
        check(r.returncode != 0 and want in r.stderr, "refused: %s (exit %d: %s)"
              % (" ".join(extra[:2]), r.returncode, r.stderr.strip().splitlines()[-1][:160] if r.stderr.strip() else ""))


def main():
    driver, shardlm, golden = sys.argv[1], sys.argv[2], sys.argv[3]
    with tempfile.TemporaryDirectory() as tmp:
        steps_check(driver, tmp)
        served_check(shardlm, golden, tmp)
        refusals_check(shardlm, golden, tmp)
    print("%d passed, %d failed" % (N_PASS, N_FAIL))
    return 1 if N_FAIL else 0


if __name__ == "__main__":
    sys.exit(main())
