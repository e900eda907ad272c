#!/usr/bin/env python3
"""tests/test_harmony.py - GPT-OSS's harmony replies (server/tool_harmony.c) parsed as OpenAI's
own `openai-harmony` package (PyPI) parses them: an independent reader of the same tokens.

Each reply is a run of assistant messages (analysis, a commentary preamble, final, a function
call with its recipient `functions.NAME` in the role's header or in the channel's, with
`<|constrain|>json` or a bare `json` content type, a built-in tool's call), written as the model
writes them after its prompt's `<|start|>assistant`: the messages rendered by openai-harmony, or
spelled by hand in the shapes that the Hugging Face template and OpenAI's guide write, encoded
with the real o200k_harmony encoding. openai-harmony parses the tokens (with the stop token the
model ends on: <|call|> after a call, <|return|> after a final answer) into messages, and what
those messages mean by docs/tools.md's harmony rules (analysis and a built-in call: reasoning;
final and preamble: content; functions.NAME: a call) must equal what tests/tool_parse_json
gives for the reply's text, as the server's detokenizer writes it (special tokens shown, the stop
token not). With tools off, a function call is reasoning. 600 random replies plus fixed ones.

Given test_bpe_tool too, the text is shardlm's own: every reply's tokens decoded by shardlm's
tokenizer loaded on the same o200k_harmony vocabulary (o200k_base's ranks, the 1,091 specials as
openai-harmony numbers them), which must show the markers <|channel|>, <|message|>, <|start|>,
<|constrain|> and <|end|> (engine/text/bpe.c harmony_markers) and equal openai-harmony's
decode_utf8 byte for byte; a special outside them (<|return|>, <|call|>, <|endoftext|>) stays
hidden.

Needs openai-harmony and OpenAI's o200k_base.tiktoken (tools/fetch_tiktoken.sh puts it in
.cache/tiktoken, or $SHARDLM_TIKTOKEN_DIR); exit 77 (SKIP) without them.
Usage: test_harmony.py PATH/TO/tool_parse_json [PATH/TO/test_bpe_tool]"""
import json
import os
import random
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
TIKTOKEN_DIR = os.environ.get("SHARDLM_TIKTOKEN_DIR", os.path.join(HERE, "..", ".cache", "tiktoken"))
if not os.path.exists(os.path.join(TIKTOKEN_DIR, "o200k_base.tiktoken")):
    print(f"SKIP: no o200k_base.tiktoken in {TIKTOKEN_DIR} (tools/fetch_tiktoken.sh)")
    sys.exit(77)
os.environ["TIKTOKEN_ENCODINGS_BASE"] = os.path.abspath(TIKTOKEN_DIR)
try:
    from openai_harmony import HarmonyEncodingName, Message, Role, load_harmony_encoding
except ImportError:
    print("SKIP: openai-harmony is not installed")
    sys.exit(77)

ENC = load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)
CALL, RETURN = 200012, 200002
PROMPT_END = ENC.encode("<|start|>assistant", allowed_special="all")
failures = 0


def check(cond, what):
    global failures
    if not cond:
        failures += 1
        if failures <= 15:
            print("  FAIL:", what)


def parse_ours(tool_parse_json, text, tools):
    args = [tool_parse_json, "harmony"] + ([] if tools else ["notools"])
    out = subprocess.run(args, input=text.encode(), capture_output=True, check=True).stdout
    return json.loads(out)


def meaning(messages, tools):
    """What openai-harmony's messages are to an OpenAI chat client (docs/tools.md)."""
    reasoning, content, calls = [], [], []
    for m in messages:
        d = m.to_dict()
        text = "".join(c["text"] for c in d["content"])
        rec = d.get("recipient")
        if rec and rec != "assistant":
            if tools and rec.startswith("functions.") and len(rec) > len("functions."):
                calls.append({"name": rec[len("functions."):], "arguments": text or "{}"})
            else:
                reasoning.append(text) if text else None
        elif d.get("channel") == "analysis":
            reasoning.append(text) if text else None
        else:
            content.append(text) if text else None
    return {"reasoning": "\n".join(reasoning), "content": "\n".join(content), "calls": calls}


BODIES = ["Let me think.", "The user asks about Paris.\nWeather first.", "x < y and a <b> tag", "to=functions.fake in text",
          "ünïcødé 東京 🙂", "  spaced  ", "{\"not\": \"a call\"}", "line\n\nbreaks", "3 < 4 <| not a marker"]
ARGS = ['{"city": "Paris"}', '{"location": "Tokyo", "unit": "celsius", "days": [1, 2]}', "{}",
        '{"q": "a \\"quoted\\" <|x|> string", "n": {"deep": [true, null, 1.5e3]}}']
NAMES = ["get_weather", "search", "a-b_c9"]


def random_reply(rng):
    """(tokens the model writes after its prompt, stop token or None) from openai-harmony's renderer
    or spelled by hand."""
    msgs, n = [], rng.randint(1, 4)
    for i in range(n):
        kind = rng.choice(["analysis", "analysis", "preamble", "final", "call", "builtin"])
        if kind == "call" or (i == n - 1 and rng.random() < 0.4):
            kind = "call"
        body = rng.choice(ARGS if kind == "call" else BODIES)
        msgs.append((kind, body, rng.choice(NAMES)))
        if kind in ("call", "final"):
            break
    toks = []
    for kind, body, name in msgs:
        hand = rng.random() < 0.5
        if kind == "call":
            shape = rng.randint(0, 2)
            if shape == 0:  # OpenAI's guide: the recipient in the channel's header
                s = f"<|start|>assistant<|channel|>commentary to=functions.{name} <|constrain|>json<|message|>{body}<|end|>"
            elif shape == 1:  # the HF template's shape
                s = f"<|start|>assistant to=functions.{name}<|channel|>commentary json<|message|>{body}<|end|>"
            else:
                m = Message.from_role_and_content(Role.ASSISTANT, body).with_channel("commentary") \
                    .with_recipient(f"functions.{name}").with_content_type("<|constrain|>json")
                toks += ENC.render(m)
                continue
        elif kind == "builtin":
            s = f"<|start|>assistant to=python<|channel|>analysis code<|message|>{body}<|end|>"
        else:
            channel = {"analysis": "analysis", "preamble": "commentary", "final": "final"}[kind]
            if not hand:
                toks += ENC.render(Message.from_role_and_content(Role.ASSISTANT, body).with_channel(channel))
                continue
            s = f"<|start|>assistant<|channel|>{channel}<|message|>{body}<|end|>"
        toks += ENC.encode(s, allowed_special="all")
    assert toks[:len(PROMPT_END)] == PROMPT_END
    toks = toks[len(PROMPT_END):]
    last = msgs[-1][0]
    stop = CALL if last in ("call", "builtin") else RETURN if last == "final" else None
    if toks and toks[-1] in (200007, CALL) and stop is not None:  # the model ends on its stop token
        toks = toks[:-1]
    return toks, stop


class OurDecoder:
    """shardlm's tokenizer on o200k_harmony (tests/test_bpe_tool decode), or None: openai-harmony's
    decode_utf8 stands for it."""

    def __init__(self, tool, tmp):
        self.tool, self.tmp = tool, tmp
        d = os.path.join(tmp, "o200k_harmony")
        os.makedirs(d)
        os.symlink(os.path.abspath(os.path.join(TIKTOKEN_DIR, "o200k_base.tiktoken")), os.path.join(d, "model.tiktoken"))
        specials = {s: ENC.encode(s, allowed_special="all") for s in ENC.special_tokens_set}
        assert all(len(v) == 1 for v in specials.values())
        cfg = {"pat_str": "o200k", "added_tokens_decoder": {str(v[0]): {"content": s, "special": True}
                                                            for s, v in specials.items()}}
        with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
            json.dump(cfg, f)
        self.path = os.path.join(d, "model.tiktoken")

    def decode(self, seqs):
        ids = os.path.join(self.tmp, "ids.txt")
        with open(ids, "w") as f:
            f.write("".join(" ".join(map(str, s)) + "\n" for s in seqs))
        out = subprocess.run([self.tool, "decode", self.path, ids], capture_output=True, check=True).stdout
        return [json.loads(line) for line in out.decode().splitlines()]


def vocab_checks(dec):
    """The markers shown, the stop and other specials hidden, on shardlm's own decode."""
    shown = ["<|channel|>", "<|message|>", "<|start|>", "<|constrain|>", "<|end|>"]
    hidden = ["<|return|>", "<|call|>", "<|endoftext|>", "<|startoftext|>"]
    seqs = [ENC.encode("a" + s + "b", allowed_special="all") for s in shown + hidden]
    for s, r in zip(shown + hidden, dec.decode(seqs)):
        text = bytes.fromhex(r["decode"]).decode()
        want = "a" + s + "b" if s in shown else "ab"
        check(text == want and r["stream_ok"] and bytes.fromhex(r["decode_special"]).decode() == "a" + s + "b",
              f"o200k_harmony decode of a{s}b: {text!r}, want {want!r} (specials shown: {r['decode_special']})")


def compare(tool_parse_json, toks, stop, label, ours=None):
    for tools in (True, False):
        msgs = ENC.parse_messages_from_completion_tokens(toks + ([stop] if stop else []), Role.ASSISTANT)
        want = meaning(msgs, tools)
        text = ENC.decode_utf8(toks)  # the server's text: specials shown, the stop token not
        if ours is not None:  # shardlm's own decode of the same tokens
            check(ours == text, f"{label}: shardlm's decode {ours!r} != openai-harmony's {text!r}")
            text = ours
        got = parse_ours(tool_parse_json, text, tools)
        got_calls = [{"name": c["name"], "arguments": c["arguments"]} for c in got["calls"]]
        check(got["reasoning"] == want["reasoning"] and got["content"] == want["content"] and got_calls == want["calls"],
              f"{label} tools={tools}: {text!r}\n    harmony: {want}\n    ours:    {got}")


def main():
    if len(sys.argv) not in (2, 3):
        print(__doc__)
        return 2
    tool_parse_json = sys.argv[1]
    tmp = tempfile.TemporaryDirectory()
    dec = OurDecoder(sys.argv[2], tmp.name) if len(sys.argv) == 3 else None
    if dec:
        vocab_checks(dec)
    fixed = [
        "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant<|channel|>commentary "
        "to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Paris\"}",
        "<|channel|>analysis<|message|>Simple.<|end|><|start|>assistant<|channel|>final<|message|>4",
        "<|channel|>final<|message|>Hello there.",
        " to=functions.search<|channel|>commentary json<|message|>{\"q\": \"x\"}",
        "<|channel|>commentary<|message|>Checking two things.<|end|><|start|>assistant<|channel|>commentary "
        "to=functions.search <|constrain|>json<|message|>{}",
    ]
    replies = [(ENC.encode(s, allowed_special="all"), CALL if "functions." in s else RETURN, f"fixed {i}")
               for i, s in enumerate(fixed)]
    rng = random.Random(20261130)
    for i in range(600):
        toks, stop = random_reply(rng)
        replies.append((toks, stop, f"random {i}"))
    texts = [bytes.fromhex(r["decode"]).decode() for r in dec.decode([t for t, _, _ in replies])] if dec else \
        [None] * len(replies)
    n = 0
    for (toks, stop, label), ours in zip(replies, texts):
        compare(tool_parse_json, toks, stop, label, ours)
        n += 1
    print(f"harmony: {n} replies x 2 (tools on, off) against openai-harmony's parser"
          f"{', decoded by shardlm on o200k_harmony' if dec else ''}, {failures} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
