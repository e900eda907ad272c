#!/usr/bin/env python3
"""clients/python/examples/chatbot.py - a terminal chatbot over ChatStream: keeps the
conversation, streams each reply as it is generated, Ctrl-C cancels the current reply (the
server frees the request) and a second Ctrl-C or an empty line ends the session.

    pip install ./clients/python    # once (or PYTHONPATH=clients/python from a checkout)
    python3 clients/python/examples/chatbot.py --server 127.0.0.1:50051
"""
import argparse
import sys

import grpc

from shardlm_client import Client


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--server", default="127.0.0.1:50051")
    ap.add_argument("--system", default="", help="system message")
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--api-key")
    args = ap.parse_args()
    history = [("system", args.system)] if args.system else []
    with Client(args.server, api_key=args.api_key) as client:
        info = client.model_info()
        print(f"[{info.architecture}, {info.n_layers} layers, template {info.chat_template}] empty line quits")
        while True:
            try:
                user = input("you> ").strip()
            except (EOFError, KeyboardInterrupt):
                print()
                return 0
            if not user:
                return 0
            history.append(("user", user))
            stream = client.chat_stream(history, max_tokens=args.max_tokens, temperature=args.temperature)
            reply = ""
            print("bot> ", end="", flush=True)
            try:
                for chunk in stream:
                    reply += chunk.text
                    print(chunk.text, end="", flush=True)
            except KeyboardInterrupt:
                stream.cancel()
                print(" [cancelled]", end="")
            except grpc.RpcError as e:
                if e.code() != grpc.StatusCode.CANCELLED:
                    print(f"\n[error {e.code().name}: {e.details()}]")
                    history.pop()
                    continue
            print()
            history.append(("assistant", reply.strip()))


if __name__ == "__main__":
    sys.exit(main())
