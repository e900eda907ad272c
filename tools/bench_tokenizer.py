#!/usr/bin/env python3
"""tools/bench_tokenizer.py BUILD_DIR [GGUF] - encode throughput of shardlm against Hugging Face
`tokenizers`, one thread each, the same tokenizer.json for both, the same corpus (this repository's
.md, .c, .h and .py files, one text per file), for two kinds:
  byte-level BPE      SmolLM2's vocabulary (from the GGUF), written as tests/test_bpe.py writes it
  SentencePiece-style Llama 2's vocabulary as transformers writes its tokenizer.json (BPE with
                      byte fallback, Prepend / Replace normalizers; tests/test_tokenizer_kinds.py's
                      llama_json, from SHARDLM_ASSETS' llama2-tokenizer/tokenizer.model)
Prints MB/s and the ratio per kind: a figure, never a verdict."""
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests"))
import test_bpe  # noqa: E402
import test_tokenizer_kinds as test_kinds  # noqa: E402  (llama_json)


def main():
    build = sys.argv[1]
    gguf_path = sys.argv[2] if len(sys.argv) > 2 else test_bpe.GGUF
    os.environ["RAYON_NUM_THREADS"] = "1"
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    from tokenizers import Tokenizer
    texts = []
    for d, _, files in os.walk(ROOT):
        if "/build" in d or "/.cache" in d or "/.git" in d:
            continue
        for f in sorted(files):
            if f.endswith((".md", ".c", ".h", ".py")):
                with open(os.path.join(d, f), "rb") as fh:
                    texts.append(fh.read())
    texts = [t for t in texts if t.decode("utf-8", "replace").encode() == t]
    n_bytes = sum(map(len, texts))
    tokens, merges, types = test_bpe.gguf_vocab(gguf_path)
    kinds = [("byte-level BPE (SmolLM2)", test_bpe.tokenizer_json(tokens, merges, types, **test_bpe.VARIANTS["smollm"]))]
    sp_model = os.path.join(test_kinds.ASSETS, "llama2-tokenizer", "tokenizer.model")
    if os.path.exists(sp_model):
        kinds.append(("SentencePiece-style BPE (Llama 2)", test_kinds.llama_json(sp_model, metaspace=False)))
    else:
        print("(no %s: the SentencePiece-style case is left out)" % sp_model)
    strs = [t.decode() for t in texts]
    for label, tj in kinds:
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "tokenizer.json")
            with open(path, "w") as f:
                json.dump(tj, f)
            hf = Tokenizer.from_file(path)
            best_hf = 1e9
            for _ in range(3):
                t0 = time.perf_counter()
                n_hf = sum(len(hf.encode(s, add_special_tokens=False).ids) for s in strs)
                best_hf = min(best_hf, time.perf_counter() - t0)
            cpath = os.path.join(tmp, "corpus.txt")
            test_bpe.write_corpus(cpath, texts)
            best_c = 1e9
            for _ in range(3):
                out = subprocess.run([os.path.join(build, "tests", "test_bpe_tool"), "bench", tmp, cpath, "1"],
                                     capture_output=True, check=True).stdout
                r = json.loads(out)
                best_c = min(best_c, r["seconds"])
        print("%s: corpus %d texts, %.2f MB, %d tokens (HF), %d tokens (shardlm)" %
              (label, len(texts), n_bytes / 1e6, n_hf, r["tokens"]))
        print("  HF tokenizers %s, 1 thread: %.2f MB/s" % (__import__("tokenizers").__version__, n_bytes / 1e6 / best_hf))
        print("  shardlm, 1 thread:          %.2f MB/s" % (n_bytes / 1e6 / best_c))
        print("  ratio shardlm / HF: %.2fx" % (best_hf / best_c))

if __name__ == "__main__":
    main()
