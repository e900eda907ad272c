#!/usr/bin/env python3
"""Special tokens shown per request (docs/server.md, docs/tokenizers.md): vLLM's
`skip_special_tokens: false` on /v1/completions and /v1/chat/completions, SamplingParams
`show_special_tokens` on gRPC, on stories260K (a SentencePiece vocabulary), which ends a greedy
story with BOS (llama2.c's separator) and goes on (ignore_eos), so that "<s>" is in the output. The reference is Hugging Face
`tokenizers`: the tokenizer.json transformers' LlamaConverter writes for tok512.model
(tests/test_tokenizer_kinds.py's llama_json) decoding the prompt's and the generated ids with
skip_special_tokens False, resp. True (the default, today's text), less the prompt's own text.
Checked: gRPC unary and streamed, HTTP completions and chat through the official openai client,
unary and streamed; the refusals: a non-boolean, false with a structured-output constraint or
tools (400 naming both fields; gRPC Generate and Chat: INVALID_ARGUMENT), and on /v1/responses and /v1/messages,
which do not take the field (refused by name).

  test_special_tokens.py --shardlm BUILD/cli/shardlm
"""
import json
import sys
from pathlib import Path

SKIP = 77
sys.dont_write_bytecode = True
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
try:
    import grpc
    import openai
    import tokenizers
except ImportError as e:
    print(f"SKIP: a test dependency cannot be imported ({e}); run tools/install_deps.sh")
    sys.exit(SKIP)
import test_server as TS  # noqa: E402
from stories_main import post_json, stories_main  # noqa: E402
from test_tokenizer_kinds import llama_json  # noqa: E402

check = TS.check
PROMPT = "Once upon a time"
N = 400  # greedy stories260K ends its first story (BOS) at token 341


def body(work, env):
    model = work / "stories260K"
    TS.convert_stories260k(env.shardlm, env.src, model)
    hf = tokenizers.Tokenizer.from_str(json.dumps(llama_json(str(env.src / "tok512.model"), False)))

    def reference(prompt_ids, ids, show):
        whole = hf.decode(prompt_ids + ids, skip_special_tokens=not show)
        head = hf.decode(prompt_ids, skip_special_tokens=not show)
        check(whole.startswith(head), f"HF's decode of the prompt {head!r} does not start its decode with the output")
        return whole[len(head):]

    with TS.Server(env.shardlm, model, "--chat-template", "llama2", name="special", http=True) as srv, \
            srv.client() as c:
        info = c.model_info()
        prompt_ids = c.tokenize(PROMPT)
        shown = c.generate(PROMPT, max_tokens=N, temperature=0, ignore_eos=True, show_special_tokens=True)
        plain = c.generate(PROMPT, max_tokens=N, temperature=0, ignore_eos=True)
        check(shown.token_ids == plain.token_ids, "showing special tokens changed the tokens")
        check(info.bos_id in shown.token_ids, f"no BOS in {N} greedy tokens: nothing to show")
        check("<s>" in shown.text and "<s>" not in plain.text, f"<s> shown only when asked: {shown.text!r}")
        want_shown = reference(prompt_ids, list(shown.token_ids), True)
        want_plain = reference(prompt_ids, list(plain.token_ids), False)
        check(shown.text == want_shown, f"gRPC shown: {shown.text!r}\n  vs HF {want_shown!r}")
        check(plain.text == want_plain, f"gRPC default: {plain.text!r}\n  vs HF {want_plain!r}")
        text, ids, _ = TS.collect(c.generate_stream(PROMPT, max_tokens=N, temperature=0, ignore_eos=True,
                                                    show_special_tokens=True))
        check(text == shown.text and ids == list(shown.token_ids), f"gRPC stream shown: {text!r}")
        # A stop token (as EOS) that ends the sample is not shown (vLLM's rule).
        ended = c.generate(PROMPT, max_tokens=N, temperature=0, stop_token_ids=[info.bos_id], show_special_tokens=True)
        check(ended.finish_reason == "stop" and "<s>" not in ended.text and shown.text.startswith(ended.text + "<s>"),
              f"the ending stop token shown: {ended.finish_reason} {ended.text[-40:]!r}")

        oa = openai.OpenAI(base_url=srv.base + "/v1", api_key="none", max_retries=0, timeout=60)
        extra = {"ignore_eos": True, "skip_special_tokens": False}
        u = oa.completions.create(model="stories260K", prompt=PROMPT, max_tokens=N, temperature=0, extra_body=extra)
        check(u.choices[0].text == shown.text, f"HTTP completions shown: {u.choices[0].text!r}")
        s = "".join(ch.choices[0].text for ch in oa.completions.create(
            model="stories260K", prompt=PROMPT, max_tokens=N, temperature=0, stream=True, extra_body=extra) if ch.choices)
        check(s == shown.text, f"HTTP completions streamed shown: {s!r}")
        d = oa.completions.create(model="stories260K", prompt=PROMPT, max_tokens=N, temperature=0,
                                  extra_body={"ignore_eos": True, "skip_special_tokens": True})
        check(d.choices[0].text == plain.text, f"HTTP completions with true: {d.choices[0].text!r}")
        # Chat: the same text as the gRPC Chat of the same messages shows.
        msgs = [{"role": "user", "content": "Tell me a story."}]
        ref = c.chat([("user", "Tell me a story.")], max_tokens=N, temperature=0, ignore_eos=True,
                     show_special_tokens=True)
        check("<s>" in ref.text, f"gRPC chat shown: {ref.text!r}")
        cu = oa.chat.completions.create(model="stories260K", messages=msgs, max_tokens=N, temperature=0,
                                        extra_body=extra)
        check(cu.choices[0].message.content == ref.text, f"HTTP chat shown: {cu.choices[0].message.content!r}")
        cs = "".join(ch.choices[0].delta.content or "" for ch in oa.chat.completions.create(
            model="stories260K", messages=msgs, max_tokens=N, temperature=0, stream=True, extra_body=extra)
            if ch.choices)
        check(cs == ref.text, f"HTTP chat streamed shown: {cs!r}")

        # Refusals, by name.
        def refused(path, req, *words):
            code, out = post_json(srv.base, path, req)
            msg = json.dumps(out)
            check(code == 400 and all(w in msg for w in words), f"{path} {req}: {code} {msg[:300]}")

        refused("/v1/completions", {"prompt": PROMPT, "skip_special_tokens": "no"}, "skip_special_tokens", "boolean")
        refused("/v1/completions", {"prompt": PROMPT, "skip_special_tokens": False, "response_format": {"type": "json_object"}},
                "skip_special_tokens", "structured-output")
        tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
        refused("/v1/chat/completions", {"messages": msgs, "skip_special_tokens": False, "tools": tools},
                "skip_special_tokens", "tools")
        code, _ = post_json(srv.base, "/v1/chat/completions", {"messages": msgs, "max_tokens": 4, "skip_special_tokens": False,
                                                                "tools": tools, "tool_choice": "none"})
        check(code == 200, f"tool_choice none with skip_special_tokens false: {code}")
        refused("/v1/responses", {"input": "hi", "skip_special_tokens": False}, "skip_special_tokens")
        refused("/v1/messages", {"max_tokens": 4, "messages": msgs, "skip_special_tokens": False}, "skip_special_tokens")
        TS.expect_error(lambda: c.generate(PROMPT, max_tokens=4, json_object=True, show_special_tokens=True),
                        grpc.StatusCode.INVALID_ARGUMENT, "sampling.show_special_tokens")
        e = TS.expect_error(lambda: c.chat([("user", "hi")], max_tokens=4, tools=tools, show_special_tokens=True),
                            grpc.StatusCode.INVALID_ARGUMENT, "sampling.show_special_tokens")
        check("tools" in e.details(), f"gRPC chat with tools: {e.details()}")


if __name__ == "__main__":
    sys.exit(stories_main("test_special_tokens", "shardlm-special-", body))
