#!/usr/bin/env python3
"""SmolLM2-135M-Instruct end to end: `shardlm serve --model FILE.gguf --http` (a llama
architecture GGUF with a byte-level BPE vocabulary and its own chat template), driven the way a
user would: the official openai package for /v1/chat/completions (unary and streamed) and
/v1/completions, the gRPC client for Tokenize and Chat. What is checked comes from elsewhere:
token ids from Hugging Face `tokenizers` loading the tokenizer.json that `shardlm convert gguf`
wrote (tokenizer_bpe compares the two in depth), and greedy answers that a 135M instruct model
gets right ("Paris"). SKIP (77) without the GGUF (tools/fetch_smollm2.sh), openai or grpcio.

  test_smollm2.py --shardlm BUILD/cli/shardlm --gguf .cache/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

SKIP = 77
sys.dont_write_bytecode = True
sys.path.insert(0, str(Path(__file__).resolve().parent))
try:
    import gguf  # noqa: F401
    import jinja2  # noqa: F401
    import openai
    import tokenizers
except ImportError as e:
    print(f"SKIP: a test dependency cannot be imported ({e}); run tools/install_deps.sh")
    sys.exit(SKIP)
import test_server as TS  # noqa: E402
from checks import Checks  # noqa: E402
from shardlm_client import Client  # noqa: E402

check = Checks()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shardlm", required=True)
    ap.add_argument("--gguf", required=True)
    a = ap.parse_args()
    if not os.path.exists(a.gguf):
        print(f"SKIP: no SmolLM2 GGUF at {a.gguf} (tools/fetch_smollm2.sh)")
        return SKIP
    work = Path(tempfile.mkdtemp(prefix="shardlm-smollm2-"))
    try:
        subprocess.run([a.shardlm, "convert", "gguf", "--gguf", a.gguf, "--out", str(work / "conv")], check=True,
                       capture_output=True)
        hf = tokenizers.Tokenizer.from_file(str(work / "conv" / "tokenizer.json"))
        with TS.Server(a.shardlm, Path(a.gguf), name="smollm2", http=True) as srv:
            oa = openai.OpenAI(base_url=srv.base + "/v1", api_key="none", max_retries=0, timeout=120)
            # The model's own chat template (the GGUF's tokenizer.chat_template, with its default
            # system prompt) rendered by Python jinja2 as transformers does and encoded by HF
            # tokenizers: the prompt the server must have built.
            q = [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}]
            import gguf
            from jinja2.sandbox import ImmutableSandboxedEnvironment
            src = gguf.GGUFReader(a.gguf).fields["tokenizer.chat_template"].contents()
            env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                extensions=["jinja2.ext.loopcontrols"])
            want_prompt = env.from_string(src).render(messages=q, add_generation_prompt=True,
                                                      bos_token="<|im_start|>", eos_token="<|im_end|>")
            want_ids = hf.encode(want_prompt, add_special_tokens=False).ids
            r = oa.chat.completions.create(model=Path(a.gguf).name, messages=q, max_tokens=40, temperature=0)
            text = r.choices[0].message.content
            check("Paris" in text and r.choices[0].finish_reason == "stop",
                  f"chat: 'What is the capital of France?' -> {text!r} ({r.choices[0].finish_reason})")
            check(r.usage.prompt_tokens == len(want_ids),
                  f"chat prompt = the model's Jinja template as jinja2 renders it ({r.usage.prompt_tokens} vs "
                  f"{len(want_ids)} tokens)")
            parts = [c.choices[0].delta.content or "" for c in oa.chat.completions.create(
                model=Path(a.gguf).name, messages=q, max_tokens=40, temperature=0, stream=True) if c.choices]
            check("".join(parts) == text, f"streamed chat equals unary ({len(parts)} chunks)")
            # Log-probabilities of a byte-level BPE vocabulary: each entry's bytes are the token's
            # bytes in the text (HF tokenizers' decode of its id), its token their text.
            lp = oa.chat.completions.create(model=Path(a.gguf).name, messages=q, max_tokens=40, temperature=0,
                                            logprobs=True, top_logprobs=2)
            ents = lp.choices[0].logprobs.content
            pieces = [bytes(e.bytes) for e in ents]

            def shown(p):  # the token's text, or vLLM's "bytes:\xNN" for part of a character
                try:
                    return p.decode()
                except UnicodeDecodeError:
                    return "bytes:" + "".join(f"\\x{x:02x}" for x in p)
            # (the end-of-turn token that stopped it is listed, as its piece's text: not content)
            rebuilt = b"".join(pieces).decode().removesuffix("<|im_end|>")
            check(rebuilt == lp.choices[0].message.content and
                  all(e.token == shown(p) for e, p in zip(ents, pieces)),
                  f"chat logprobs: the bytes rebuild the reply and each token is its text ({[e.token for e in ents[:6]]} ... {[e.token for e in ents[-3:]]} / {lp.choices[0].message.content[-20:]!r})")
            check(not any("\u0120" in e.token or "\u010a" in e.token for e in ents),
                  "no byte-level BPE piece (U+0120, U+010A) leaks into a logprobs token")
            # End of turn: <|endoftext|> (HF tokenizers' id for it) is not this GGUF's EOS
            # (<|im_end|>), but it ends a turn in chat as in llama.cpp; a logit bias forces it
            # first. A plain completion (no template) generates on past it.
            eot = hf.token_to_id("<|endoftext|>")
            forced = dict(model=Path(a.gguf).name, max_tokens=5, temperature=0, logit_bias={str(eot): 100})
            r = oa.chat.completions.create(messages=q, **forced)
            check(r.choices[0].finish_reason == "stop" and r.usage.completion_tokens == 1
                  and r.choices[0].message.content == "",
                  f"chat ends at the end-of-turn token {eot} ({r.choices[0].finish_reason}, "
                  f"{r.usage.completion_tokens} tokens)")
            c = oa.completions.create(prompt="Hi", **forced)
            check(c.choices[0].finish_reason == "length" and c.usage.completion_tokens == 5,
                  f"a completion is not a turn: {c.usage.completion_tokens} tokens ({c.choices[0].finish_reason})")
            c = oa.completions.create(model=Path(a.gguf).name, prompt="The capital of France is", max_tokens=8,
                                      temperature=0)
            check("Paris" in c.choices[0].text, f"completion: 'The capital of France is' -> {c.choices[0].text!r}")
            import json as _json
            import urllib.request
            models = _json.load(urllib.request.urlopen(srv.base + "/v1/models", timeout=30))["data"][0]
            check(models["architecture"] == "LlamaForCausalLM" and "Q4_1" in models["quantization"].split(",")
                  and models["max_model_len"] == 8192 and models["chat_template"] == "jinja (model)",
                  f"/v1/models: {models['architecture']}, {models['quantization']}, {models['max_model_len']}")
            with Client(srv.target) as g:
                info = g.model_info()
                check(info.quantization == models["quantization"] and info.architecture == "LlamaForCausalLM",
                      f"GetModelInfo: quantization {info.quantization!r}")
                s = "Héllo wörld! 日本語 and emoji 🙂, code: x += 1\n\ttabs"
                got = g.tokenize(s, add_bos=False)
                want = hf.encode(s, add_special_tokens=False).ids
                check(got == want, f"Tokenize equals Hugging Face tokenizers ({len(want)} ids)")
                ans = g.chat(q, max_tokens=40, temperature=0)
                check(g.tokenize(want_prompt, add_bos=False) == want_ids, "Tokenize of the rendered prompt equals HF")
                check(ans.text == text, f"gRPC Chat equals the HTTP chat: {ans.text!r}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
        for p in TS.SERVERS:
            if p.poll() is None:
                p.kill()
    return check.summary()


if __name__ == "__main__":
    sys.exit(main())
