#!/usr/bin/env python3
"""Whole training steps against JAX + optax.

  python3 test_train_step.py PATH/TO/test_train_step

For small random Llama, GPT-2 and Gemma 3 models (the ones of test_train_grad.py), the C
driver (tests/test_train_step.c) takes 3 optimizer steps, each accumulating the gradients of
2 micro-batches (packed documents, masked rows) scaled by the global batch's target tokens,
clipping by the global norm (Megatron's coefficient clip / (norm + 1e-6)) and an AdamW step
over the layout table (weight decay on matrices only). This file repeats the same steps with
jax.grad of test_train_grad.py's float64 forward and optax.adamw (masked weight decay).
Checks: each step's loss within 1e-5 relative, each step's gradient norm within 1e-4, and
every parameter after the 3 steps within 1e-5 (max-abs difference over the tensor's max-abs
value). Plus the gradient-accumulation invariance of the loss normalisation: the same two
micro-batches packed as one give the same update.

Prints one line per check and "N passed, M failed"; exits 77 (SKIP) without jax/optax.
"""

import json
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
    print("SKIP: train_step: jax/optax are not installed (tools/install_deps.sh installs them)")
    sys.exit(77)

import test_train_grad as TG  # noqa: E402  (its forward, models and batches)

N_PASS = 0
N_FAIL = 0
STEPS, LR, WD = 3, 3e-3, 0.1
# Adam divides by sqrt(v): an element whose gradient is f32 rounding noise (a key bias has an
# exactly zero gradient) moves by a full +-lr step in either implementation, in a random
# direction, and one whose gradient is a few eps has its f32 error amplified. eps = 1e-3 keeps
# those still while real gradients (1e-2 .. 10 here) are normalised as usual: the comparison
# measures the arithmetic (moments, bias correction, decay, clipping), not the noise.
EPS = 1e-3


def check(ok, msg):
    global N_PASS, N_FAIL
    print(("PASS " if ok else "FAIL ") + msg, flush=True)
    if ok:
        N_PASS += 1
    else:
        N_FAIL += 1


def run_driver(driver, model_dir, prefix, batches, clip):
    r = subprocess.run([driver, model_dir, prefix, str(STEPS), repr(LR), repr(WD), repr(clip), repr(EPS)] + batches,
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError("driver failed: %s" % r.stderr[-2000:])
    meta = json.load(open(prefix + ".json"))
    raw = open(prefix + ".bin", "rb").read()
    init, final = {}, {}
    for t in meta["tensors"]:
        n = int(np.prod(t["shape"]))
        key = "%s/%d" % (t["kind"], t["layer"])
        init[key] = np.frombuffer(raw, np.float32, n, t["initial_offset"]).reshape(t["shape"]).astype(np.float64)
        final[key] = np.frombuffer(raw, np.float32, n, t["final_offset"]).reshape(t["shape"]).astype(np.float64)
    return meta, init, final


def reference_steps(spec, init, batches, clip):
    """STEPS steps of Megatron-style clipping + optax.adamw on the sum over micro-batches."""
    n_targets = sum(int(np.sum(b["targets"] >= 0)) for b in batches)
    jbs = [{k: jnp.asarray(v) for k, v in b.items() if k != "doc_start"} for b in batches]

    def loss_fn(p):
        return sum(TG.forward_loss(p, spec, jb) for jb in jbs) / n_targets

    return adamw_steps(loss_fn, init, clip)


def adamw_steps(loss_fn, init, clip):
    """STEPS steps of Megatron-style clipping (clip / (norm + 1e-6)) and optax.adamw (weight decay
    on matrices) of loss_fn from init: the losses, the gradient norms and the final parameters."""
    params = {k: jnp.asarray(v) for k, v in init.items()}
    mask = {k: v.ndim == 2 for k, v in params.items()}
    opt = optax.adamw(LR, b1=0.9, b2=0.999, eps=EPS, weight_decay=WD, mask=mask)
    state = opt.init(params)
    losses, norms = [], []
    for _ in range(STEPS):
        loss, g = jax.value_and_grad(loss_fn)(params)
        norm = float(jnp.sqrt(sum(jnp.sum(x * x) for x in jax.tree_util.tree_leaves(g))))
        coef = clip / (norm + 1e-6) if clip > 0 else 1.0
        if coef < 1.0:
            g = jax.tree_util.tree_map(lambda x: x * coef, g)
        updates, state = opt.update(g, state, params)
        params = optax.apply_updates(params, updates)
        losses.append(float(loss))
        norms.append(norm)
    return losses, norms, {k: np.asarray(v) for k, v in params.items()}


def max_rel(a, b):
    worst, key = 0.0, ""
    for k in a:
        scale = max(np.max(np.abs(b[k])), 1e-30)
        e = np.max(np.abs(a[k] - b[k])) / scale
        if e > worst:
            worst, key = e, k
    return worst, key


def main():
    driver = sys.argv[1]
    with tempfile.TemporaryDirectory() as tmp:
        for kind in ("llama", "gpt2", "gemma3"):
            mdir = os.path.join(tmp, kind)
            cfg = TG.write_model(kind, mdir)
            spec = TG.spec_of(kind, cfg)
            b1 = TG.make_batch(cfg["vocab_size"], seed=21, doc_lens=(9, 4, 6))
            b2 = TG.make_batch(cfg["vocab_size"], seed=22, doc_lens=(13, 2))
            paths = []
            for i, b in enumerate((b1, b2)):
                p = os.path.join(tmp, "%s_mb%d.batch" % (kind, i))
                TG.write_batch(p, b, 1.0)
                paths.append(p)
            # The tight clip makes the clipping path run; a loose one leaves it out.
            for clip in (0.5, 0.0):
                meta, init, final = run_driver(driver, mdir, os.path.join(tmp, "%s_%g" % (kind, clip)), paths, clip)
                spec["tied"] = bool(meta["tied"])
                losses, norms, ref = reference_steps(spec, init, [b1, b2], clip)
                lrel = max(abs(a - b) / abs(b) for a, b in zip(meta["losses"], losses))
                check(lrel < 1e-5, "%s clip %g: %d step losses %s match JAX (worst rel %.1e)"
                      % (kind, clip, STEPS, " ".join("%.5f" % x for x in meta["losses"]), lrel))
                nrel = max(abs(a - b) / b for a, b in zip(meta["grad_norms"], norms))
                check(nrel < 1e-4, "%s clip %g: gradient norms match (worst rel %.1e)" % (kind, clip, nrel))
                prel, pkey = max_rel(final, ref)
                check(prel < 1e-5, "%s clip %g: every parameter after %d AdamW steps within 1e-5 of optax "
                      "(worst %.1e, %s)" % (kind, clip, STEPS, prel, pkey))
                moved, _ = max_rel(final, init)
                check(moved > 1e-4, "%s clip %g: the parameters moved (rel %.1e)" % (kind, clip, moved))
            # Accumulation invariance: both micro-batches packed into one micro-batch.
            both = {k: np.concatenate([b1[k], b2[k]]) for k in ("tokens", "targets", "positions")}
            both["doc_id"] = np.concatenate([b1["doc_id"], b2["doc_id"] + b1["doc_id"].max() + 1])
            both["doc_start"] = b1["doc_start"] + [len(b1["tokens"]) + x for x in b2["doc_start"][1:]]
            p = os.path.join(tmp, "%s_both.batch" % kind)
            TG.write_batch(p, both, 1.0)
            meta1, _, f1 = run_driver(driver, mdir, os.path.join(tmp, kind + "_one"), [p], 0.5)
            meta2, _, f2 = run_driver(driver, mdir, os.path.join(tmp, kind + "_two"), paths, 0.5)
            drel, dkey = max_rel(f1, f2)
            lrel = max(abs(a - b) / abs(b) for a, b in zip(meta1["losses"], meta2["losses"]))
            check(drel < 1e-5 and lrel < 1e-6, "%s: 1 micro-batch of both = 2 micro-batches (loss rel %.1e, "
                  "params rel %.1e)" % (kind, lrel, drel))
    print("%d passed, %d failed" % (N_PASS, N_FAIL))
    return 1 if N_FAIL else 0


if __name__ == "__main__":
    sys.exit(main())
