#!/usr/bin/env python3
"""tools/draft_token_map.py - the token map of a draft model (issue 29; `shardlm serve --draft-model
D --spec-token-map FILE`): the N token ids seen most often in chat data, as a JSON array. The draft's
LM head then computes only those rows (FR-Spec's frequency-ranked head, SGLang's
--speculative-token-map): SmolLM2's 49,152 x 576 head is two thirds of a 4-layer draft's weights,
and a draft token's cost is mostly that head.

  python3 tools/draft_token_map.py --tokenizer DIR/tokenizer.json --data FILE.jsonl[,FILE.jsonl] --n 8192
      --out FILE.json [--config DIR/config.json]

Counts every message's content of the chat JSONL files (shardlm train's {"messages": [...]} format:
tools/distill_data.py's answers with their prompts), tokenized by Hugging Face `tokenizers`, and keeps
the N most frequent ids (ties to the lower id); the BOS and EOS ids of --config and the tokenizer's
special tokens are always kept. Prints the share of the counted tokens the map covers.
"""
import argparse
import collections
import json
import sys

from tokenizers import Tokenizer


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokenizer", required=True, help="a Hugging Face tokenizer.json")
    ap.add_argument("--data", required=True, help="chat JSONL files, comma-separated")
    ap.add_argument("--n", type=int, default=8192)
    ap.add_argument("--out", required=True)
    ap.add_argument("--config", help="config.json whose bos_token_id / eos_token_id are always kept")
    a = ap.parse_args()
    tok = Tokenizer.from_file(a.tokenizer)
    vocab = tok.get_vocab_size(with_added_tokens=True)
    if not 0 < a.n <= vocab:
        sys.exit(f"draft_token_map: --n must be in [1, {vocab}], got {a.n}")
    counts = collections.Counter()
    for path in a.data.split(","):
        for line in open(path, encoding="utf-8"):
            for m in json.loads(line)["messages"]:
                counts.update(tok.encode(m["content"], add_special_tokens=False).ids)
    keep = set(tok.get_added_tokens_decoder()) if hasattr(tok, "get_added_tokens_decoder") else set()
    if a.config:
        cfg = json.load(open(a.config))
        for k in ("bos_token_id", "eos_token_id"):
            v = cfg.get(k)
            keep.update(v if isinstance(v, list) else [v] if v is not None else [])
    keep = {int(t) for t in keep if 0 <= int(t) < vocab}
    ranked = sorted(counts, key=lambda t: (-counts[t], t))
    ids = sorted(keep)
    for t in ranked:
        if len(ids) >= a.n:
            break
        if t not in keep:
            ids.append(t)
    ids = sorted(set(ids[: a.n]) | keep)
    total = sum(counts.values())
    covered = sum(counts[t] for t in ids)
    with open(a.out, "w") as f:
        json.dump(ids, f)
    print(f"draft_token_map: {len(ids)} of {vocab} ids to {a.out}; they cover {100 * covered / max(total, 1):.2f}% "
          f"of the {total} tokens counted ({len(counts)} distinct)")


if __name__ == "__main__":
    main()
