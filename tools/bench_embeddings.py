#!/usr/bin/env python3
"""tools/bench_embeddings.py - embedding throughput of `shardlm serve` (a benchmark, never a test):
all-MiniLM-L6-v2 (tools/fetch_minilm.sh) served with --http, driven through /v1/embeddings by the
official openai package, one input per request (a retrieval service embedding its users' queries),
by 1 and by 8 concurrent clients; prints inputs/s and tokens/s for SQuAD questions (short) and
SQuAD paragraphs cut to 256 tokens (long). With 8 clients the server's passes hold the inputs of
several requests (docs/embeddings.md); shardlm_embedding_passes_total says how many passes ran.

usage: tools/bench_embeddings.py [--shardlm build/cli/shardlm] [--model .cache/minilm]
                                 [--threads 2] [--inputs 96] [--clients 1,8]
"""
import argparse
import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import openai
import tokenizers

root = Path(__file__).resolve().parent.parent


def start(shardlm, model, threads):
    p = subprocess.Popen([shardlm, "serve", "--model", str(model), "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0",
                          "--threads", str(threads)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                         env=dict(os.environ, OMP_NUM_THREADS=str(threads)))
    port = None
    for line in p.stdout:
        if line.startswith("shardlm: http listening on"):
            port = int(line.split(":")[-1].split()[0])
        if line.startswith("shardlm: ready"):
            break
    if port is None:
        p.kill()
        sys.exit("the server did not start")
    return p, f"http://127.0.0.1:{port}"


def passes(base):
    text = urllib.request.urlopen(base + "/metrics", timeout=30).read().decode()
    m = re.search(r"^shardlm_embedding_passes_total (\S+)$", text, re.M)
    return float(m.group(1)) if m else float("nan")


def run(oa, model, inputs, clients):
    """Every input as its own request, spread over `clients` threads; (seconds, tokens)."""
    tokens = [0] * clients

    def client(k):
        for x in inputs[k::clients]:
            tokens[k] += oa.embeddings.create(model=model, input=[x]).usage.prompt_tokens

    threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    t = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return time.perf_counter() - t, sum(tokens)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shardlm", default=str(root / "build/cli/shardlm"))
    ap.add_argument("--model", default=str(root / ".cache/minilm"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--inputs", type=int, default=96)
    ap.add_argument("--clients", default="1,8")
    a = ap.parse_args()
    assets = Path(os.environ.get("SHARDLM_ASSETS", root.parent / "shared/assets"))
    squad = json.loads((assets / "datasets/squad-v1.1-dev-subset.json").read_text())["data"]
    paras = [p["context"] for art in squad for p in art["paragraphs"]][:a.inputs]
    questions = [q["question"] for art in squad for p in art["paragraphs"] for q in p["qas"]][:a.inputs]
    hf = tokenizers.Tokenizer.from_file(str(Path(a.model) / "tokenizer.json"))
    hf.no_truncation()
    cut = [(i[:255] + i[-1:]) if len(i) > 256 else i for i in (hf.encode(p).ids for p in paras)]
    proc, base = start(a.shardlm, a.model, a.threads)
    try:
        oa = openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0, timeout=600)
        model = Path(a.model).name
        oa.embeddings.create(model=model, input=questions[:4])  # warm up
        print("| inputs | clients | inputs/s | tokens/s | inputs per pass |")
        print("| --- | --- | --- | --- | --- |")
        for name, inputs in (("questions", questions), ("paragraphs (256 tokens)", cut)):
            for clients in (int(c) for c in a.clients.split(",")):
                p0 = passes(base)
                dt, tokens = run(oa, model, inputs, clients)
                n_passes = passes(base) - p0
                print(f"| {len(inputs)} {name} | {clients} | {len(inputs) / dt:.1f} | {tokens / dt:.0f} | "
                      f"{len(inputs) / n_passes:.2f} |", flush=True)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


if __name__ == "__main__":
    main()
