#!/usr/bin/env python3
"""tests/server/test_gpt_oss.py - a GPT-OSS model served end to end (issue 31): the random
GptOssForCausalLM of tests/reference/gpt_oss_ref.py (the golden's: sinks, windows, the biased router
and experts, the clamped SwiGLU, untruncated YaRN) with a harmony vocabulary of its own size (the
256 bytes, then <|startoftext|> <|endoftext|> <|return|> <|constrain|> <|channel|> <|start|> <|end|>
<|message|> <|call|> as special tokens; Hugging Face `tokenizers` loads it and agrees on a prompt) and
GPT-OSS's own chat template, behind `shardlm serve --http`, driven by the official openai package.
No real GPT-OSS fits this machine (20B); the model's words are noise, what is checked is the format.

- /v1/embeddings (last-token and mean pooling) within 1e-5 cosine distance of the float64
  reference's final hidden states (gpt_oss_ref.gpt_oss_forward hidden=True): sinks, windows and
  the experts in the embedding path too.
- End of turn (llama.cpp's harmony rule, server/server.c harmony_end_ids): the server logs
  <|return|>, <|call|> and <|endoftext|> as its end ids and not <|end|>; a reply pushed by
  logit_bias onto <|end|> runs to max_tokens (finish_reason length) with <|end|> shown in its text,
  one pushed onto <|return|> or <|call|> stops at once (finish_reason stop).
- The markers are text (engine/text/bpe.c harmony_markers): with tool_choice required the grammar
  writes `<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>` and arguments in the
  model's own special tokens, and the reply parses into a tool call of a declared function whose
  arguments validate with jsonschema (finish_reason tool_calls; the model pushed by logit_bias to
  close its analysis with <|end|>: the analysis is free, and this random model ends it with
  <|call|> otherwise); streamed equals unary.

  test_gpt_oss.py --shardlm BUILD/cli/shardlm
SKIP (77) without openai, jsonschema, tokenizers or numpy."""
import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

SKIP = 77
sys.dont_write_bytecode = True
HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "tests" / "reference"))
try:
    import jsonschema
    import numpy as np
    import openai
    import tokenizers
except ImportError as e:
    print(f"SKIP: a test dependency cannot be imported ({e}); run tools/install_deps.sh")
    sys.exit(SKIP)
import gpt_oss_ref  # noqa: E402
import make_models as MM  # noqa: E402
import test_server as TS  # noqa: E402
from checks import Checks  # noqa: E402

check = Checks()
TMPL = ROOT / "tests" / "data" / "chat_templates" / "openai-gpt-oss-120b.jinja"
SPECIALS = ["<|startoftext|>", "<|endoftext|>", "<|return|>", "<|constrain|>", "<|channel|>", "<|start|>", "<|end|>",
            "<|message|>", "<|call|>"]
ID = {s: 256 + i for i, s in enumerate(SPECIALS)}
# A free string in the arguments while the test pushes <|end|> with logit_bias: the grammar writes
# '<' in strings only as \u003c (x-shardlm-escape), so the marker cannot stand inside one, where the
# parser would end the message.
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather in Paris.",
                                            "parameters": {"type": "object", "properties": {
                                                "days": {"type": "integer", "minimum": 1, "maximum": 7},
                                                "unit": {"enum": ["c", "f"]},
                                                "city": {"type": "string", "maxLength": 12}},
                                                "required": ["days", "unit", "city"], "additionalProperties": False}}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def byte_unicode():
    """GPT-2's bytes -> printable characters (the ByteLevel pre-tokenizer's alphabet)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def write_tokenizer(d):
    """A byte-level BPE of the 256 bytes (no merges) and the harmony specials, as tokenizer.json,
    with GPT-OSS's template in tokenizer_config.json; checked by Hugging Face tokenizers."""
    bu = byte_unicode()
    tok = {"version": "1.0", "truncation": None, "padding": None,
           "added_tokens": [{"id": ID[s], "content": s, "single_word": False, "lstrip": False, "rstrip": False,
                             "normalized": False, "special": True} for s in SPECIALS],
           "normalizer": None,
           "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
           "post_processor": None,
           "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
           "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                     "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                     "vocab": {bu[b]: b for b in range(256)}, "merges": []}}
    (d / "tokenizer.json").write_text(json.dumps(tok))
    (d / "tokenizer_config.json").write_text(json.dumps({
        "chat_template": TMPL.read_text(), "bos_token": "<|startoftext|>", "eos_token": "<|return|>",
        "added_tokens_decoder": {str(ID[s]): {"content": s, "special": True} for s in SPECIALS}}))
    hf = tokenizers.Tokenizer.from_file(str(d / "tokenizer.json"))
    ids = hf.encode("<|start|>assistant<|channel|>final<|message|>Hi", add_special_tokens=False).ids
    want = [ID["<|start|>"]] + list(b"assistant") + [ID["<|channel|>"]] + list(b"final") + [ID["<|message|>"]] + list(b"Hi")
    return ids == want


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shardlm", required=True)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="shardlm-gpt-oss-"))
    try:
        model = work / "gpt_oss"
        MM.make("gpt_oss", str(model), seed=36)
        cfg = json.loads((model / "config.json").read_text())
        cfg.update(bos_token_id=ID["<|startoftext|>"], eos_token_id=ID["<|return|>"])  # as gpt-oss-20b's
        (model / "config.json").write_text(json.dumps(cfg))
        check(write_tokenizer(model), "Hugging Face tokenizers encodes a harmony prompt to the specials and bytes")
        with TS.Server(args.shardlm, model, name="gpt-oss", http=True) as srv:
            log = srv.log_path.read_text()
            ends = [line.split("token ")[1] for line in log.splitlines() if "harmony end of turn" in line]
            # (<|return|> is the EOS, which ends every sample already: not listed again)
            check(sorted(ends) == sorted(["%d %s" % (ID[s], s) for s in ("<|call|>", "<|endoftext|>")]),
                  f"end ids besides EOS (<|return|>): <|call|>, <|endoftext|>; never <|end|>: {ends}")
            check("harmony" in log, "the template's format is harmony")
            oa = openai.OpenAI(base_url=srv.base + "/v1", api_key="none", max_retries=0, timeout=300)

            def pushed(token, n=6):
                return oa.chat.completions.create(model="gpt_oss", messages=ASK, max_tokens=n, temperature=0,
                                                  logit_bias={str(ID[token]): 100})
            r = pushed("<|end|>")
            check(r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 6,
                  f"<|end|> does not end the reply: {r.choices[0].finish_reason}, {r.usage.completion_tokens} tokens")
            for stop in ("<|return|>", "<|call|>"):
                r = pushed(stop)
                check(r.choices[0].finish_reason == "stop" and r.usage.completion_tokens == 1,
                      f"{stop} ends the reply at once: {r.choices[0].finish_reason}, {r.usage.completion_tokens} tokens")
            r = oa.completions.create(model="gpt_oss", prompt="<|start|>assistant", max_tokens=4, temperature=0,
                                      logit_bias={str(ID["<|end|>"]): 100})
            check(r.choices[0].text == "<|end|>" * 4, f"<|end|> is shown in the text: {r.choices[0].text!r}")

            # The analysis is free (docs/tools.md: reasoning is never constrained), and left alone this
            # random model ends it with <|call|> before any call: pushed to close its analysis with
            # <|end|> (text, so the grammar sees it), the call follows.
            ref_cfg = gpt_oss_ref.gpt_oss_config("f32")
            ref_w = MM.round_weights(gpt_oss_ref.init_gpt_oss(ref_cfg, 36), "f32")  # what MM.make wrote
            seqs = [[ID["<|start|>"]] + list(b"user") + [ID["<|message|>"]] + list(b"Paris?"), [72, 105]]
            for pooling in ("last", "mean"):
                r = oa.embeddings.create(model="gpt_oss", input=seqs, extra_body={"pooling": pooling})
                worst = 0.0
                for d, s in zip(r.data, seqs):
                    h = gpt_oss_ref.gpt_oss_forward(ref_cfg, ref_w, s, hidden=True)
                    v = h[-1] if pooling == "last" else h.mean(0)
                    e = np.asarray(d.embedding)
                    worst = max(worst, 1.0 - float(e @ v) / (np.linalg.norm(e) * np.linalg.norm(v)))
                check(worst < 1e-5, f"/v1/embeddings, {pooling} pooling: within 1e-5 cosine distance of the float64 "
                      f"forward (worst {worst:.2e})")
            req = dict(model="gpt_oss", messages=ASK, tools=[WEATHER], tool_choice="required", max_tokens=200,
                       temperature=0, logit_bias={str(ID["<|end|>"]): 100})
            r = oa.chat.completions.create(**req)
            calls = r.choices[0].message.tool_calls or []
            ok = len(calls) >= 1 and all(c.function.name == "get_weather" for c in calls)
            for c in calls:
                try:
                    jsonschema.validate(json.loads(c.function.arguments), WEATHER["function"]["parameters"])
                except Exception as e:  # noqa: BLE001
                    ok = False
                    print(f"  {c.function.arguments}: {e}")
            ok = ok and all("<|" not in c.function.arguments for c in calls)
            check(ok and r.choices[0].finish_reason == "tool_calls",
                  f"tool_choice required: a valid get_weather call ({r.choices[0].finish_reason}, "
                  f"{[(c.function.name, c.function.arguments) for c in calls]}, content {r.choices[0].message.content!r})")
            args_stream, name = {}, {}
            for chunk in oa.chat.completions.create(**req, stream=True):
                for d in chunk.choices[0].delta.tool_calls or [] if chunk.choices else []:
                    name[d.index] = name.get(d.index, "") + (d.function.name or "")
                    args_stream[d.index] = args_stream.get(d.index, "") + (d.function.arguments or "")
            check([name[i] for i in sorted(name)] == [c.function.name for c in calls] and
                  [args_stream[i] for i in sorted(args_stream)] == [c.function.arguments for c in calls],
                  f"streamed calls equal unary: {name} {args_stream}")
        print(f"gpt-oss: {check.passed} passed, {check.failed} failed")
    finally:
        TS.kill_all()
        shutil.rmtree(work, ignore_errors=True)
    return 1 if check.failed else 0


if __name__ == "__main__":
    sys.exit(main())
