#!/usr/bin/env python3
"""clients/python/examples/qa.py - question answering: context + question in, a short greedy
answer out, with the log-probability of every answer token and the top alternatives, and a
confidence score (the mean token log-probability) for ranking answers.

    pip install ./clients/python    # once (or PYTHONPATH=clients/python from a checkout)
    python3 clients/python/examples/qa.py --server 127.0.0.1:50051 \
        --context "Lily had a red ball. She gave it to Tom." --question "Who got the ball?"
"""
import argparse
import math
import sys

from shardlm_client import Client


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--server", default="127.0.0.1:50051")
    ap.add_argument("--context", required=True)
    ap.add_argument("--question", required=True)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--top", type=int, default=3, help="alternatives shown per token")
    ap.add_argument("--api-key")
    args = ap.parse_args()
    prompt = f"{args.context}\nQuestion: {args.question}\nAnswer:"
    with Client(args.server, api_key=args.api_key, timeout=60) as client:
        g = client.generate(prompt, max_tokens=args.max_tokens, temperature=0, stop=["\n"], logprobs=args.top)
    print(f"answer: {g.text.strip()!r}  ({g.finish_reason}, {g.completion_tokens} tokens)")
    for e in g.logprobs:
        alts = ", ".join(f"{t.piece!r} {math.exp(t.logprob):.2f}" for t in e.top)
        print(f"  {e.piece!r:>14} p={math.exp(e.logprob):.3f}   top: {alts}")
    if g.logprobs:
        mean = sum(e.logprob for e in g.logprobs) / len(g.logprobs)
        print(f"confidence (mean log p): {mean:.3f}  (perplexity {math.exp(-mean):.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
