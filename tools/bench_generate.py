#!/usr/bin/env python3
"""tools/bench_generate.py - decode benchmark on a stories110M-shaped model (a benchmark, never
a test): writes a random llama2.c checkpoint (dim 768, 12 layers, 12 heads, hidden 2048,
vocab 32000, f32), imports it with `shardlm convert llama2c`, runs `shardlm generate`, and
prints decode tokens/s, the weight bytes read per token, the implied bandwidth, the ratio to
a memcpy bandwidth measured in the same run, and the generate process's peak RSS against the
weight size (the load must not double it).

usage: tools/bench_generate.py [--build build] [--tokens 128] [--threads 0] [--keep DIR]
"""
import argparse, os, re, struct, subprocess, sys, tempfile, time

import numpy as np

here = os.path.dirname(os.path.abspath(__file__))
root = os.path.dirname(here)


def write_llama2c(path, dim=768, hidden=2048, layers=12, heads=12, kv_heads=12, vocab=32000, seq=1024):
    rng = np.random.default_rng(0)
    hd = dim // heads
    with open(path, "wb") as f:
        f.write(struct.pack("7i", dim, hidden, layers, heads, kv_heads, vocab, seq))
        def w(*shape, scale=None):
            fan_in = shape[-1]
            a = rng.standard_normal(shape, dtype=np.float32) * np.float32(scale or fan_in ** -0.5)
            f.write(a.astype(np.float32).tobytes())
        w(vocab, dim, scale=1.0)
        f.write(np.ones((layers, dim), np.float32).tobytes())
        w(layers, dim, dim); w(layers, kv_heads * hd, dim); w(layers, kv_heads * hd, dim); w(layers, dim, dim)
        f.write(np.ones((layers, dim), np.float32).tobytes())
        w(layers, hidden, dim); w(layers, dim, hidden); w(layers, hidden, dim)
        f.write(np.ones(dim, np.float32).tobytes())
        f.write(np.zeros(seq * hd, np.float32).tobytes())  # freq_cis_real + imag, unused


def memcpy_gbps():
    a = np.ones(64 * 1024 * 1024, np.float32)  # 256 MiB
    b = np.empty_like(a)
    best = 0.0
    for _ in range(5):
        t = time.perf_counter(); np.copyto(b, a); dt = time.perf_counter() - t
        best = max(best, 2 * a.nbytes / dt / 1e9)  # read + write
    return best


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(root, "build"))
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--keep", default=None, help="reuse/keep the generated model here")
    a = ap.parse_args()
    shardlm = os.path.join(a.build, "cli", "shardlm")
    assets = os.environ.get("SHARDLM_ASSETS", os.path.join(root, "..", "shared", "assets"))
    tok = os.path.join(assets, "llama2-tokenizer", "tokenizer.model")
    if not os.path.exists(tok):
        print(f"SKIP: no tokenizer at {tok}"); return 0
    work = a.keep or tempfile.mkdtemp(prefix="shardlm-bench-")
    os.makedirs(work, exist_ok=True)
    ckpt, model = os.path.join(work, "stories110M_random.bin"), os.path.join(work, "hf")
    if not os.path.exists(os.path.join(model, "model.safetensors")):
        write_llama2c(ckpt)
        subprocess.run([shardlm, "convert", "llama2c", "--checkpoint", ckpt, "--tokenizer", tok, "--out", model], check=True)
    weight_bytes = os.path.getsize(os.path.join(model, "model.safetensors"))
    bw = memcpy_gbps()
    cmd = [shardlm, "generate", "--model", model, "--prompt", "Once upon a time", "--max-tokens", str(a.tokens),
           "--ignore-eos", "--threads", str(a.threads)]
    # wait4 gives this child's own peak RSS (RUSAGE_CHILDREN would include the converter).
    with tempfile.TemporaryFile("w+") as err:
        p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, text=True)
        _, status, ru = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)
        err.seek(0)
        stderr = err.read()
    if p.returncode != 0:
        print(stderr); return 1
    rss_kib = ru.ru_maxrss
    m = re.search(r"prefill ([\d.]+) tok/s; generated (\d+) tokens, decode ([\d.]+) tok/s \((\w+), (\d+) threads", stderr)
    prefill, gen, decode, dev, threads = float(m[1]), int(m[2]), float(m[3]), m[4], int(m[5])
    # Per decode token every weight is read once (the tied embedding table only as the LM head).
    implied = weight_bytes * decode / 1e9
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    print(f"machine: {cpu}, {os.cpu_count()} cores; backend {dev}, {threads} threads")
    print(f"model: stories110M shape (dim 768, 12 layers, 12 heads, vocab 32000), f32, {weight_bytes / 2**20:.0f} MiB of weights")
    print(f"prefill: {prefill:.1f} tok/s (prompt of a few tokens)")
    print(f"decode: {decode:.1f} tok/s over {gen} tokens")
    print(f"weight bytes read per decode token: {weight_bytes / 2**20:.0f} MiB -> {implied:.2f} GB/s")
    print(f"memcpy bandwidth (numpy copyto, 256 MiB, read+write, best of 5): {bw:.2f} GB/s")
    print(f"ratio decode bandwidth / memcpy bandwidth: {implied / bw:.2f}")
    print(f"peak RSS of generate: {rss_kib / 1024:.0f} MiB = {rss_kib * 1024 / weight_bytes:.2f} x the weights")
    return 0


if __name__ == "__main__":
    sys.exit(main())
