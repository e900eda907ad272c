#!/usr/bin/env python3
"""tools/bench_lora.py - throughput of adapters served without merging (issue 14; a benchmark,
never a test): one `shardlm serve` of a stories110M-shaped model (tools/bench_generate.py's random
checkpoint) with 4 random rank-R PEFT adapters on every projection, and 16 concurrent greedy
streams of T tokens each, (a) all on the base model, (b) spread over the 4 adapters (4 streams
each, interleaved so that a step's batch mixes them), (c) all on one adapter. Prints the
generated tokens/s of each, in the same run, and the ratios (b)/(a), (c)/(a): the goal is
(b)/(a) >= 0.8.

usage: tools/bench_lora.py [--build build] [--streams 16] [--tokens 64] [--rank 16] [--threads 0] [--keep DIR]
"""
import argparse
import json
import os
import struct
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

here = os.path.dirname(os.path.abspath(__file__))
root = os.path.dirname(here)
sys.path.insert(0, here)
sys.path.insert(0, os.path.join(root, "clients", "python"))
from bench_generate import write_llama2c  # noqa: E402

DIM, HIDDEN, LAYERS = 768, 2048, 12
MODULES = [("self_attn", "q_proj", DIM, DIM), ("self_attn", "k_proj", DIM, DIM), ("self_attn", "v_proj", DIM, DIM),
           ("self_attn", "o_proj", DIM, DIM), ("mlp", "gate_proj", DIM, HIDDEN), ("mlp", "up_proj", DIM, HIDDEN),
           ("mlp", "down_proj", HIDDEN, DIM)]


def write_adapter(path, rank, seed):
    """A PEFT adapter (adapter_config.json + adapter_model.safetensors, F32) with random A and B."""
    os.makedirs(path, exist_ok=True)
    rng = np.random.default_rng(seed)
    tensors = {}
    for layer in range(LAYERS):
        for block, module, d_in, d_out in MODULES:
            pre = f"base_model.model.model.layers.{layer}.{block}.{module}"
            tensors[f"{pre}.lora_A.weight"] = rng.standard_normal((rank, d_in), np.float32) * d_in ** -0.5
            tensors[f"{pre}.lora_B.weight"] = rng.standard_normal((d_out, rank), np.float32) * 0.01
    header, blobs, off = {}, [], 0
    for name, a in tensors.items():
        b = a.astype("<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(os.path.join(path, "adapter_model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))
    json.dump({"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank, "bias": "none", "use_rslora": False,
               "use_dora": False, "target_modules": [m for _, m, _, _ in MODULES]},
              open(os.path.join(path, "adapter_config.json"), "w"))


def run_streams(target, adapters, tokens):
    """One greedy stream per entry of adapters (None = the base), all at once; generated tokens/s."""
    from shardlm_client import Client
    done, errors = [0] * len(adapters), []

    def one(i, a):
        try:
            with Client(target, timeout=600) as c:
                kw = dict(max_tokens=tokens, temperature=0, ignore_eos=True)
                g = c.generate("Once upon a time", adapter=a, **kw) if a else c.generate("Once upon a time", **kw)
                done[i] = g.completion_tokens
        except Exception as e:  # noqa: BLE001 - reported
            errors.append(str(e))
    threads = [threading.Thread(target=one, args=(i, a)) for i, a in enumerate(adapters)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    dt = time.perf_counter() - t0
    if errors:
        raise RuntimeError(f"stream errors: {errors[:3]}")
    return sum(done) / dt


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", default=os.path.join(root, "build"))
    ap.add_argument("--streams", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--keep", default=None, help="reuse/keep the model and adapters here")
    a = ap.parse_args()
    shardlm = os.path.join(a.build, "cli", "shardlm")
    work = a.keep or tempfile.mkdtemp(prefix="shardlm-bench-lora-")
    model = os.path.join(work, "model")
    if not os.path.exists(os.path.join(model, "model.safetensors")):
        os.makedirs(work, exist_ok=True)
        ck, tok = os.path.join(work, "model.bin"), os.path.join(work, "tok.model")
        write_llama2c(ck)
        # A 32000-piece tokenizer: the llama2 one from the shared assets.
        assets = os.environ.get("SHARDLM_ASSETS", os.path.join(root, "..", "shared", "assets"))
        tok = os.path.join(assets, "llama2-tokenizer", "tokenizer.model")
        subprocess.run([shardlm, "convert", "llama2c", "--checkpoint", ck, "--tokenizer", tok, "--out", model],
                       check=True, capture_output=True)
        os.remove(ck)
    names = [f"ad{i}" for i in range(4)]
    for i, n in enumerate(names):
        if not os.path.exists(os.path.join(work, n, "adapter_config.json")):
            write_adapter(os.path.join(work, n), a.rank, seed=i)
    flags = [x for n in names for x in ("--lora", f"{n}={os.path.join(work, n)}")]
    proc = subprocess.Popen([shardlm, "serve", "--model", model, "--listen", "127.0.0.1:0", "--threads", str(a.threads),
                             "--max-seqs", str(max(a.streams, 16)), *flags],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        target = None
        for line in proc.stdout:
            if line.startswith("shardlm: listening on"):
                target = line.split()[-1]
            if line.startswith("shardlm: ready"):
                break
        if not target:
            raise RuntimeError("the server did not start")
        run_streams(target, [None] * 2, 8)  # warm-up
        base = run_streams(target, [None] * a.streams, a.tokens)
        mixed = run_streams(target, [names[i % 4] for i in range(a.streams)], a.tokens)
        one = run_streams(target, [names[0]] * a.streams, a.tokens)
        base2 = run_streams(target, [None] * a.streams, a.tokens)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    b = (base + base2) / 2
    print(f"stories110M shape, f32, {a.streams} streams x {a.tokens} tokens, rank {a.rank} adapters on q,k,v,o,gate,up,down")
    print(f"base only            {base:7.1f} tok/s, again at the end {base2:7.1f} tok/s")
    print(f"4 adapters, mixed    {mixed:7.1f} tok/s   ratio to base {mixed / b:.2f} (goal >= 0.8)")
    print(f"1 adapter            {one:7.1f} tok/s   ratio to base {one / b:.2f}")
    if not a.keep:
        subprocess.run(["rm", "-rf", work])
    return 0


if __name__ == "__main__":
    sys.exit(main())
