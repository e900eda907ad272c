#!/usr/bin/env python3
"""Training a mixture of experts against JAX + optax.

  python3 test_train_moe.py PATH/TO/test_train_grad PATH/TO/test_train_step

For small random Mixtral (8 experts, top 2, renormalised), Qwen 2 MoE (4 experts, top 2, not
renormalised, a shared expert behind a sigmoid gate) and Qwen 3 MoE (6 experts, top 3,
renormalised, per-head QK norm) checkpoints (tests/reference/make_models.py), the C drivers
(tests/test_train_grad.c: one micro-batch's forward and backward; tests/test_train_step.c:
whole AdamW steps) train with Megatron's load-balancing loss and router z-loss on; this file
recomputes everything with jax.grad of a float64 forward written here from the definitions
(moe.h): p = softmax(x W_r^T), each token's top k (a stable sort: the lower expert first on a
tie), weights p (renormalised over the k when the model says so), the chosen experts' SwiGLU
outputs summed with those weights, the shared expert times sigmoid(x g^T);
aux = E sum_e f_e P_e with f_e = tokens routed to e / (T k) (no gradient) and P_e the mean of
p over the tokens; z = mean_t logsumexp(z_t)^2. The objective of a micro-batch is
grad_scale x (summed cross-entropy) + aux_scale x sum over layers (aux_coeff aux + z_coeff z).
Checks: the routing (tokens per expert and layer) equals the reference's; the loss, the summed
aux and z losses within 1e-5 relative; every gradient tensor within 1e-4 (as
test_train_grad.py); the auxiliary losses' share of the router's gradient is far above that
tolerance (so that a backward that dropped them would fail); selective (mlp) and full
recomputation give the same gradients; two micro-batches accumulate to twice the gradients;
and (Mixtral, Qwen 2 MoE) 3 AdamW steps of 2 micro-batches with clipping match optax (losses,
gradient norms, every parameter within 1e-5), as test_train_step.py checks dense models.

Prints one line per check and "N passed, M failed"; exits 77 (SKIP) without jax/optax.
"""

import json
import math
import os
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "reference"))
sys.dont_write_bytecode = True

try:
    import jax
    import jax.numpy as jnp
    import optax
except ImportError:
    print("SKIP: train_moe: jax/optax are not installed (tools/install_deps.sh installs them)")
    sys.exit(77)

import glm_ref  # noqa: E402
import gpt_oss_ref  # noqa: E402
import make_models as MM  # noqa: E402
import test_train_grad as TG  # noqa: E402  (rmsnorm, silu, rotary, batches, the dump reader)
import test_train_step as TS  # noqa: E402  (the AdamW reference's settings)

N_PASS = 0
N_FAIL = 0
AUX, ZC = 0.05, 0.01  # moe_aux_loss_coeff, moe_z_loss_coeff: large enough to matter in the gradients


def check(ok, msg):
    global N_PASS, N_FAIL
    print(("PASS " if ok else "FAIL ") + msg, flush=True)
    if ok:
        N_PASS += 1
    else:
        N_FAIL += 1


def spec_of(cfg):
    E = cfg.get("num_local_experts") or cfg.get("num_experts") or cfg["n_routed_experts"]
    oss, glm = cfg["model_type"] == "gpt_oss", cfg["model_type"] == "glm4_moe"
    return {"gpt_oss": oss, "cfg": cfg, "o_bias": oss, "window": cfg.get("sliding_window") if oss else 0,
            "sliding": [t == "sliding_attention" for t in cfg.get("layer_types", [])],
            "limit": cfg.get("swiglu_limit"),
            "n_layers": cfg["num_hidden_layers"], "n_heads": cfg["num_attention_heads"],
            "n_kv": cfg["num_key_value_heads"], "head_dim": cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"],
            "eps": cfg["rms_norm_eps"], "theta": cfg["rope_theta"], "E": E, "k": cfg["num_experts_per_tok"],
            "norm": cfg["model_type"] in ("mixtral", "gpt_oss", "minimax_m2") or bool(cfg.get("norm_topk_prob")),
            "bias": cfg["model_type"] in ("qwen2_moe", "gpt_oss", "glm4_moe"), "qk_norm": cfg["model_type"] == "qwen3_moe",
            "shared": cfg["model_type"] == "qwen2_moe",
            # MiniMax-M2: q and k normed over the whole projection, rotary_dim of each head rotated, a
            # sigmoid router whose top k a per-expert bias (no gradient) selects
            "minimax": cfg["model_type"] == "minimax_m2", "rot": cfg.get("rotary_dim"),
            # GLM-4.5: MiniMax's router with group-limited choice and routed_scaling_factor, half of each
            # head rotated, dense first layers, a plain shared expert
            "glm": glm, "dense_first": cfg.get("first_k_dense_replace", 0) if glm else 0,
            "groups": cfg.get("n_group", 1) if glm else 1, "group_topk": cfg.get("topk_group", 1),
            "scale": cfg.get("routed_scaling_factor", 1.0) if glm else 1.0}


def moe_forward(P, spec, batch, aux_c, z_c, lora=None):
    """(summed cross-entropy, [aux per layer], [z per layer], [tokens per expert per layer],
    sum over layers of aux_c aux + z_c z). lora: adapters on the attention, x W^T + s (x A^T) B^T,
    as {"s": scale, "lora_A_q/0": ..., "lora_B_q/0": ...} (q, k, v, o)."""
    tok, tgt, pos, doc = batch["tokens"], batch["targets"], batch["positions"], batch["doc_id"]
    T = tok.shape[0]
    g = lambda k, l=-1: P["%s/%d" % (k, l)]  # noqa: E731
    nh, nkv, hd, E, K = spec["n_heads"], spec["n_kv"], spec["head_dim"], spec["E"], spec["k"]

    def lin(x, kind, l):  # x W^T, plus the adapter of (kind, l) when there is one
        y = x @ g(kind, l).T
        if lora is not None and "lora_A_%s/%d" % (kind, l) in lora:
            y = y + lora["s"] * ((x @ lora["lora_A_%s/%d" % (kind, l)].T) @ lora["lora_B_%s/%d" % (kind, l)].T)
        return y
    i_idx, j_idx = np.arange(T)[:, None], np.arange(T)[None, :]
    causal = (j_idx <= i_idx) & (doc[:, None] == doc[None, :])
    windowed = causal & (i_idx - j_idx < (spec["window"] or T))
    x = g("tok_embedding")[tok]
    auxs, zs, loads, extra = [], [], [], 0.0
    for l in range(spec["n_layers"]):
        xn = TG.rmsnorm(x, g("attn_norm", l), spec["eps"])
        q, k, v = lin(xn, "q", l), lin(xn, "k", l), lin(xn, "v", l)
        if spec["bias"]:
            q, k, v = q + g("q_bias", l), k + g("k_bias", l), v + g("v_bias", l)
        if spec["minimax"]:  # RMSNorm over the whole q and k projections
            q, k = TG.rmsnorm(q, g("q_norm", l), spec["eps"]), TG.rmsnorm(k, g("k_norm", l), spec["eps"])
        q, k, v = q.reshape(T, nh, hd), k.reshape(T, nkv, hd), v.reshape(T, nkv, hd)
        if spec["qk_norm"]:
            q, k = TG.rmsnorm(q, g("q_norm", l), spec["eps"]), TG.rmsnorm(k, g("k_norm", l), spec["eps"])
        rcfg = spec["cfg"] if spec["gpt_oss"] else None  # GPT-OSS: YaRN, its attention factor included
        if spec["minimax"] and spec["rot"]:  # the first rotary_dim features of each head
            rcfg = {"partial_rotary_factor": spec["rot"] / hd}
        if spec["glm"]:
            rcfg = {"partial_rotary_factor": spec["cfg"].get("partial_rotary_factor", 0.5)}
        q, k = TG.rope_halves(q, pos, spec["theta"], rcfg), TG.rope_halves(k, pos, spec["theta"], rcfg)
        rep = nh // nkv
        s = jnp.einsum("ihd,jhd->hij", q, jnp.repeat(k, rep, axis=1)) / math.sqrt(hd)
        mask = windowed if spec["gpt_oss"] and spec["sliding"][l] else causal  # GPT-OSS: windows on even layers
        s = jnp.where(mask[None], s, -jnp.inf)
        if spec["gpt_oss"]:  # the sink: one more column of each head's softmax, with no value
            sk = jnp.broadcast_to(g("sinks", l)[:, None, None], (nh, T, 1))
            p = jax.nn.softmax(jnp.concatenate([s, sk], axis=-1), axis=-1)[:, :, :T]
        else:
            p = jax.nn.softmax(s, axis=-1)
        o = lin(jnp.einsum("hij,jhd->ihd", p, jnp.repeat(v, rep, axis=1)).reshape(T, nh * hd), "o", l)
        x = x + (o + g("o_bias", l) if spec["o_bias"] else o)
        xn = TG.rmsnorm(x, g("mlp_norm", l), spec["eps"])
        if l < spec["dense_first"]:  # GLM-4.5's dense first layers: no router, no auxiliary losses
            x = x + (TG.silu(xn @ g("gate", l).T) * (xn @ g("up", l).T)) @ g("down", l).T
            loads.append(jnp.zeros(E))
            continue
        logits = xn @ g("router", l).T                                   # (T, E)
        if spec["gpt_oss"]:
            logits = logits + g("router_bias", l)
        if spec["minimax"] or spec["glm"]:  # sigmoid scores; the top k of score + the selection bias; aux over normalised scores
            prob = jax.nn.sigmoid(logits)
            choice = prob + jax.lax.stop_gradient(g("router_sel_bias", l))
            aux_p = prob / jnp.sum(prob, axis=-1, keepdims=True)
        else:
            prob = choice = aux_p = jax.nn.softmax(logits, axis=-1)
        if spec["groups"] > 1:  # DeepSeek-V3: the best groups (by their two best) eligible, the others' choice 0
            G, c = spec["groups"], jax.lax.stop_gradient(choice)
            best2 = jnp.sum(jnp.sort(c.reshape(T, G, E // G), axis=-1)[..., -2:], axis=-1)          # (T, G)
            kept = jnp.sum(jax.nn.one_hot(jnp.argsort(-best2, axis=-1, stable=True)[:, :spec["group_topk"]], G), axis=1)
            choice = jnp.where(jnp.repeat(kept, E // G, axis=1) > 0, c, 0.0)
        top = jnp.argsort(-jax.lax.stop_gradient(choice), axis=-1, stable=True)[:, :K]
        chosen = jnp.sum(jax.nn.one_hot(top, E), axis=1)                 # (T, E) 0/1
        w = prob * chosen
        if spec["norm"]:
            w = w / jnp.sum(w, axis=-1, keepdims=True)
        w = w * spec["scale"]  # routed_scaling_factor
        d = xn.shape[1]
        F = g("exp_gate", l).shape[0] // E  # every expert over every token, weighted (0 where not chosen)
        wg, wu = g("exp_gate", l).reshape(E, F, d), g("exp_up", l).reshape(E, F, d)
        gate, up = jnp.einsum("td,efd->tef", xn, wg), jnp.einsum("td,efd->tef", xn, wu)
        if spec["gpt_oss"]:  # biases, and the clamped SwiGLU: min(gate, L) sigmoid(1.702 .) (clip(up, -L, L) + 1)
            gate, up = gate + g("exp_gate_bias", l).reshape(E, F), up + g("exp_up_bias", l).reshape(E, F)
            lim = spec["limit"]
            gate, up = jnp.minimum(gate, lim), jnp.clip(up, -lim, lim)
            h = gate * jax.nn.sigmoid(1.702 * gate) * (up + 1.0)
        else:
            h = TG.silu(gate) * up
        y = jnp.einsum("tef,edf->ted", h, g("exp_down", l).reshape(E, d, F))
        if spec["gpt_oss"]:
            y = y + g("exp_down_bias", l).reshape(E, d)
        out = jnp.einsum("te,ted->td", w, y)
        if spec["shared"] or spec["glm"]:
            sh = (TG.silu(xn @ g("gate", l).T) * (xn @ g("up", l).T)) @ g("down", l).T
            out = out + (sh if spec["glm"] else jax.nn.sigmoid(xn @ g("shared_gate", l).T) * sh)
        x = x + out
        count = jax.lax.stop_gradient(jnp.sum(chosen, axis=0))          # tokens per expert
        aux = E * jnp.sum(count / (T * K) * jnp.mean(aux_p, axis=0))
        z = jnp.mean(jax.scipy.special.logsumexp(logits, axis=-1) ** 2)
        auxs.append(aux)
        zs.append(z)
        loads.append(count)
        extra = extra + aux_c * aux + z_c * z
    h = TG.rmsnorm(x, g("final_norm"), spec["eps"])
    lg = h @ g("lm_head").T
    lse = jax.scipy.special.logsumexp(lg, axis=-1)
    real = tgt >= 0
    tl = jnp.take_along_axis(lg, jnp.where(real, tgt, 0)[:, None], axis=1)[:, 0]
    return jnp.sum(jnp.where(real, lse - tl, 0.0)), auxs, zs, loads, extra


def run_grad(driver, mdir, bpath, prefix, repeat=1, env=None, extra=()):
    e = dict(os.environ, MOE_AUX_COEFF=repr(AUX), MOE_Z_COEFF=repr(ZC), MOE_AUX_SCALE="1.0")
    e.update(env or {})
    r = subprocess.run([driver, mdir, bpath, prefix, str(repeat), "cpu", *extra], capture_output=True, text=True, env=e)
    if r.returncode != 0:
        raise RuntimeError("driver failed: %s" % r.stderr[-2000:])
    meta = json.load(open(prefix + ".json"))
    return meta, *TG._read_dump(meta, prefix)


def worst_rel(grads, refs):
    gmax = max(np.max(np.abs(r)) for r in refs.values())
    worst, key = 0.0, ""
    for k, gc in grads.items():
        e = np.max(np.abs(gc - refs[k])) / max(np.max(np.abs(refs[k])), 1e-2 * gmax)
        if e > worst:
            worst, key = e, k
    return worst, key


def grad_checks(driver, tmp, flavor, mdir, cfg):
    spec = spec_of(cfg)
    batch = TG.make_batch(cfg["vocab_size"], seed=11)
    n_real = int(np.sum(batch["targets"] >= 0))
    grad_scale = 1.0 / n_real
    bpath = os.path.join(tmp, flavor + ".batch")
    TG.write_batch(bpath, batch, grad_scale)
    meta, params, grads = run_grad(driver, mdir, bpath, os.path.join(tmp, flavor + "_1"))
    jb = {k: jnp.asarray(v) for k, v in batch.items() if k != "doc_start"}
    P = {k: jnp.asarray(v) for k, v in params.items()}

    def objective(p, aux_c, z_c):
        ce, auxs, zs, loads, extra = moe_forward(p, spec, jb, aux_c, z_c)
        return grad_scale * ce + 1.0 * extra, (ce, auxs, zs, loads)

    vg = jax.jit(jax.value_and_grad(objective, has_aux=True))  # one compilation: the coefficients are traced
    (_, (ce, auxs, zs, loads)), jg = vg(P, AUX, ZC)
    load_ref = np.concatenate([np.asarray(x) for x in loads]).astype(np.int64)
    load_c = np.array(meta["moe_load"], dtype=np.int64)
    sparse = [l for l in range(spec["n_layers"]) if l >= spec["dense_first"]]
    check(np.array_equal(load_c, load_ref) and load_c.sum() == len(sparse) * spec["k"] * len(batch["tokens"]),
          "%s: tokens routed per expert and layer %s equal the reference's" % (flavor, load_c.tolist()))
    rel = abs(meta["loss_sum"] - float(ce)) / abs(float(ce))
    check(rel < 1e-5, "%s: loss %.8f, JAX %.8f (rel %.1e)" % (flavor, meta["loss_sum"], float(ce), rel))
    aux_ref, z_ref = float(sum(auxs)), float(sum(zs))
    arel, zrel = abs(meta["moe_aux"] - aux_ref) / aux_ref, abs(meta["moe_z"] - z_ref) / z_ref
    check(arel < 1e-5 and zrel < 1e-5, "%s: load-balancing loss %.8f (JAX %.8f), z-loss %.8f (JAX %.8f), summed over "
          "layers (rel %.1e, %.1e)" % (flavor, meta["moe_aux"], aux_ref, meta["moe_z"], z_ref, arel, zrel))
    refs = {k: np.asarray(jg[k]) for k in grads}
    worst, key = worst_rel(grads, refs)
    n_expert = sum(1 for k in grads if k.split("/")[0] in ("router", "exp_gate", "exp_up", "exp_down", "shared_gate"))
    if spec["gpt_oss"]:  # its own parameters all have gradients, checked with the rest
        own = ("sinks", "router_bias", "exp_gate_bias", "exp_up_bias", "exp_down_bias", "o_bias")
        have = sorted(k for k in grads if k.split("/")[0] in own)
        check(len(have) == len(own) * spec["n_layers"] and all(np.max(np.abs(refs[k])) > 0 for k in have),
              "%s: the sinks' and the biases' %d gradient tensors are there and not zero" % (flavor, len(have)))
    check(worst < 1e-4 and n_expert >= 4 * len(sparse),
          "%s: all %d gradient tensors (%d of the router and experts) within 1e-4 of JAX (worst %.1e, %s)"
          % (flavor, len(grads), n_expert, worst, key))
    # The auxiliary losses matter: without them the router's gradient is far from this one.
    _, jg0 = vg(P, 0.0, 0.0)
    share = max(np.max(np.abs(np.asarray(jg["router/%d" % l]) - np.asarray(jg0["router/%d" % l])))
                / np.max(np.abs(refs["router/%d" % l])) for l in sparse)
    check(share > 1e-2, "%s: the auxiliary losses move the router's gradient by %.1e of it (>> 1e-4)" % (flavor, share))
    # Recomputation: the experts' insides recomputed from the kept routing, or whole layers.
    for plan in ("mlp", "full"):
        _, _, gr = run_grad(driver, mdir, bpath, os.path.join(tmp, "%s_%s" % (flavor, plan)), env={"TRAIN_RECOMPUTE": plan})
        d = max(np.max(np.abs(gr[k] - grads[k])) / max(np.max(np.abs(grads[k])), 1e-30) for k in grads)
        check(d < 1e-6, "%s: recomputation %s gives the same gradients (rel %.1e)" % (flavor, plan, d))
    _, _, g2 = run_grad(driver, mdir, bpath, os.path.join(tmp, flavor + "_2"), repeat=2)
    acc = max(np.max(np.abs(g2[k] - 2 * grads[k])) / max(np.max(np.abs(grads[k])), 1e-30) for k in grads)
    check(acc < 1e-5, "%s: two micro-batches accumulate to twice the gradients (rel %.1e)" % (flavor, acc))
    return spec


def lora_check(driver, tmp, flavor, mdir, cfg, spec):
    """LoRA on a mixture's attention (q, k, v, o; the experts frozen with the rest of the base):
    every adapter's gradient against jax.grad of the same forward with the adapters beside the
    projections, the auxiliary losses included."""
    batch = TG.make_batch(cfg["vocab_size"], seed=11)
    grad_scale = 1.0 / int(np.sum(batch["targets"] >= 0))
    bpath = os.path.join(tmp, flavor + "_lora.batch")
    TG.write_batch(bpath, batch, grad_scale)
    meta, params, grads = run_grad(driver, mdir, bpath, os.path.join(tmp, flavor + "_lora"), env={"LORA_TARGETS": "q,k,v,o"},
                                   extra=("4", "8.0"))
    jb = {k: jnp.asarray(v) for k, v in batch.items() if k != "doc_start"}
    base = {k: jnp.asarray(v) for k, v in params.items() if not k.startswith("lora_")}
    ad = {k: jnp.asarray(v) for k, v in params.items() if k.startswith("lora_")}

    def objective(a):
        ce, _, _, _, extra = moe_forward(base, spec, jb, AUX, ZC, dict(a, s=meta["lora_scale"]))
        return grad_scale * ce + extra

    jg = jax.grad(objective)(ad)
    got = {k: v for k, v in grads.items() if k.startswith("lora_")}
    refs = {k: np.asarray(jg[k]) for k in got}
    worst, key = worst_rel(got, refs)
    n_expected = 2 * 4 * spec["n_layers"]  # A and B of q, k, v, o per layer
    check(len(got) == n_expected and worst < 1e-4 and all(np.max(np.abs(refs[k])) > 0 for k in got),
          "%s: LoRA on the attention (q, k, v, o), the experts frozen: %d adapter gradients within 1e-4 of JAX "
          "(worst %.1e, %s)" % (flavor, len(got), worst, key))


def step_checks(step_driver, tmp, flavor, mdir, cfg, spec):
    b1 = TG.make_batch(cfg["vocab_size"], seed=21, doc_lens=(9, 4, 6))
    b2 = TG.make_batch(cfg["vocab_size"], seed=22, doc_lens=(13, 2))
    paths = []
    for i, b in enumerate((b1, b2)):
        p = os.path.join(tmp, "%s_mb%d.batch" % (flavor, i))
        TG.write_batch(p, b, 1.0)
        paths.append(p)
    clip = 0.5
    prefix = os.path.join(tmp, flavor + "_steps")
    r = subprocess.run([step_driver, mdir, prefix, str(TS.STEPS), repr(TS.LR), repr(TS.WD), repr(clip), repr(TS.EPS)]
                       + paths, capture_output=True, text=True,
                       env=dict(os.environ, MOE_AUX_COEFF=repr(AUX), MOE_Z_COEFF=repr(ZC)))
    if r.returncode != 0:
        raise RuntimeError("step driver failed: %s" % r.stderr[-2000:])
    meta = json.load(open(prefix + ".json"))
    raw = open(prefix + ".bin", "rb").read()
    init, final = {}, {}
    for t in meta["tensors"]:
        n = int(np.prod(t["shape"]))
        key = "%s/%d" % (t["kind"], t["layer"])
        init[key] = np.frombuffer(raw, np.float32, n, t["initial_offset"]).reshape(t["shape"]).astype(np.float64)
        final[key] = np.frombuffer(raw, np.float32, n, t["final_offset"]).reshape(t["shape"]).astype(np.float64)
    n_targets = sum(int(np.sum(b["targets"] >= 0)) for b in (b1, b2))
    jbs = [{k: jnp.asarray(v) for k, v in b.items() if k != "doc_start"} for b in (b1, b2)]

    def objective(p):  # the mean per-token loss of the global batch + the auxiliary losses' mean over micro-batches
        outs = [moe_forward(p, spec, jb, AUX, ZC) for jb in jbs]
        return sum(o[0] for o in outs) / n_targets + sum(o[4] for o in outs) / len(outs), \
            sum(o[0] for o in outs) / n_targets

    params = {k: jnp.asarray(v) for k, v in init.items()}
    opt = optax.adamw(TS.LR, b1=0.9, b2=0.999, eps=TS.EPS, weight_decay=TS.WD, mask={k: v.ndim == 2 for k, v in params.items()})
    state = opt.init(params)
    losses, norms = [], []
    vg = jax.jit(jax.value_and_grad(objective, has_aux=True))
    for _ in range(TS.STEPS):
        (_, ce), g = vg(params)
        norm = float(jnp.sqrt(sum(jnp.sum(x * x) for x in jax.tree_util.tree_leaves(g))))
        coef = clip / (norm + 1e-6)
        if coef < 1.0:
            g = jax.tree_util.tree_map(lambda x: x * coef, g)
        updates, state = opt.update(g, state, params)
        params = optax.apply_updates(params, updates)
        losses.append(float(ce))
        norms.append(norm)
    lrel = max(abs(a - b) / abs(b) for a, b in zip(meta["losses"], losses))
    check(lrel < 1e-5, "%s: %d AdamW step losses %s match JAX (worst rel %.1e)"
          % (flavor, TS.STEPS, " ".join("%.5f" % x for x in meta["losses"]), lrel))
    nrel = max(abs(a - b) / b for a, b in zip(meta["grad_norms"], norms))
    check(nrel < 1e-4, "%s: gradient norms (the auxiliary losses' included) match (worst rel %.1e)" % (flavor, nrel))
    prel, pkey = TS.max_rel(final, {k: np.asarray(v) for k, v in params.items()})
    check(prel < 1e-5, "%s: every parameter after %d AdamW steps within 1e-5 of optax (worst %.1e, %s)"
          % (flavor, TS.STEPS, prel, pkey))
    moved, _ = TS.max_rel({k: final[k] for k in final if k.startswith("exp_")}, {k: init[k] for k in init if k.startswith("exp_")})
    check(moved > 1e-4, "%s: the experts' weights moved (rel %.1e)" % (flavor, moved))


def main():
    grad_driver, step_driver = sys.argv[1], sys.argv[2]
    with tempfile.TemporaryDirectory() as tmp:
        for flavor in ("mixtral", "qwen2_moe", "qwen3_moe", "minimax_m2", "gpt_oss", "glm4_moe"):
            mdir = os.path.join(tmp, flavor)
            if flavor == "gpt_oss":  # tests/reference/gpt_oss_ref.py: its config and weights, HF's layout
                cfg = gpt_oss_ref.gpt_oss_config("f32")
                MM.write_checkpoint(mdir, cfg, gpt_oss_ref.init_gpt_oss(cfg, 5), "f32", 1)
            elif flavor == "glm4_moe":  # tests/reference/glm_ref.py
                cfg = glm_ref.config("f32")
                MM.write_checkpoint(mdir, cfg, glm_ref.init(cfg, 5), "f32", 1)
            else:
                cfg = MM.moe_config(flavor, "f32")
                MM.write_checkpoint(mdir, cfg, MM.init_llama(cfg, 5), "f32", 1)
            spec = grad_checks(grad_driver, tmp, flavor, mdir, cfg)
            if flavor in ("mixtral", "minimax_m2"):
                lora_check(grad_driver, tmp, flavor, mdir, cfg, spec)
            if flavor not in ("qwen3_moe", "minimax_m2", "glm4_moe"):  # their steps add nothing the others do not cover (15 s each)
                step_checks(step_driver, tmp, flavor, mdir, cfg, spec)
    print("%d passed, %d failed" % (N_PASS, N_FAIL))
    return 1 if N_FAIL else 0


if __name__ == "__main__":
    sys.exit(main())
