#!/usr/bin/env python3
"""tools/draft_token_map.py - the token map of a draft model (issue 29; `shardlm serve --draft-model
D --spec-token-map FILE`): the N token ids seen most often in chat data, as a JSON array. The draft's
LM head then computes only those rows (FR-Spec's frequency-ranked head, SGLang's
--speculative-token-map): SmolLM2's 49,152 x 576 head is two thirds of a 4-layer draft's weights,
and a draft token's cost is mostly that head.

  python3 tools/draft_token_map.py --tokenizer DIR/tokenizer.json|DIR/tokenizer.model
      --data FILE.jsonl[,FILE.jsonl] --n 8192 --out FILE.json [--config DIR/config.json]
      [--keep 1,2,106] [--answers-first]

Counts every message's content (prompts and answers) of the chat JSONL files (shardlm train's
{"messages": [...]} format: tools/distill_data.py's answers with their prompts), tokenized by
Hugging Face `tokenizers` (or `sentencepiece` for a tokenizer.model, as Gemma's), and keeps the N
most frequent ids (ties to the lower id; with --answers-first every id of an assistant turn
first, by frequency, then the prompts': what an EAGLE head for the model's own answers needs,
`shardlm train --eagle-head --spec-token-map`); --keep's ids, the BOS and
EOS ids of --config and the tokenizer's special tokens are always kept, and a few more frequent
ids make the count a multiple of 8 (the CPU packs a block head's rows eight at a time). Prints
the share of all counted tokens and of the answers' (the assistant turns: what a draft proposes)
that the map covers.
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
    ap.add_argument("--keep", default="", help="ids always kept, comma-separated (an end-of-turn token)")
    ap.add_argument("--answers-first", action="store_true", help="every id of the assistant turns first")
    a = ap.parse_args()
    if a.tokenizer.endswith(".model"):  # SentencePiece (Gemma)
        import sentencepiece

        sp = sentencepiece.SentencePieceProcessor(model_file=a.tokenizer)
        vocab = sp.get_piece_size()
        encode = sp.encode
        special = set()
    else:
        tok = Tokenizer.from_file(a.tokenizer)
        vocab = tok.get_vocab_size(with_added_tokens=True)
        encode = lambda text: tok.encode(text, add_special_tokens=False).ids  # noqa: E731
        special = set(tok.get_added_tokens_decoder()) if hasattr(tok, "get_added_tokens_decoder") else set()
    if not 0 < a.n <= vocab:
        sys.exit(f"draft_token_map: --n must be in [1, {vocab}], got {a.n}")
    counts, answers = collections.Counter(), collections.Counter()
    for path in a.data.split(","):
        for line in open(path, encoding="utf-8"):
            for m in json.loads(line)["messages"]:
                ids = encode(m["content"])
                counts.update(ids)
                if m["role"] == "assistant":
                    answers.update(ids)
    keep = special | {int(x) for x in a.keep.split(",") if x.strip()}
    if a.config:
        cfg = json.load(open(a.config))
        for k in ("bos_token_id", "eos_token_id"):
            v = cfg.get(k)
            keep.update(v if isinstance(v, list) else [v] if v is not None else [])
    keep = {int(t) for t in keep if 0 <= int(t) < vocab}
    ranked = sorted(counts, key=lambda t: (-counts[t], t))
    if a.answers_first:
        ranked = sorted(answers, key=lambda t: (-answers[t], t)) + [t for t in ranked if t not in answers]
    ids = sorted(keep)
    for t in ranked:
        if len(ids) >= a.n:
            break
        if t not in keep:
            ids.append(t)
    ids = set(ids[: a.n]) | keep
    for t in ranked:  # a multiple of 8 ids where there are enough: the CPU packs a block head 8 rows at a time
        if len(ids) % 8 == 0:
            break
        ids.add(t)
    ids = sorted(ids)
    def share(c):
        return 100 * sum(c[t] for t in ids) / max(1, sum(c.values()))
    with open(a.out, "w") as f:
        json.dump(ids, f)
    print(f"draft_token_map: {len(ids)} of {vocab} ids to {a.out}; they cover {share(counts):.2f}% of the "
          f"{sum(counts.values())} tokens counted ({len(counts)} distinct) and {share(answers):.2f}% of the "
          f"{sum(answers.values())} in assistant turns")


if __name__ == "__main__":
    main()
