#!/usr/bin/env python3
"""The training rendering of chats with a model's own Jinja template (engine/text/jinja_train.c,
through tests/jinja_render.c --train) against a reference built from libraries no one here
wrote: Python jinja2 (configured as transformers does, test_jinja.make_env) renders each turn's
prompt A_k (the conversation before assistant message k, with the generation prompt) and the
conversation through it, B_k; Hugging Face `tokenizers` encodes the texts between the loss spans
and the spans B_k[len(A_k):]. Ids and loss flags must be equal, for SmolLM2-135M-Instruct's
template (from its GGUF) and the real models' templates of tests/data/chat_templates, over
conversations with and without a system prompt, one and two exchanges, and non-ASCII text.
Two checks do not depend on the algorithm: the loss tokens decode to each answer (in order),
and the whole sequence decodes to jinja2's rendering of the conversation. A template that
rewrites earlier turns must be refused with an error naming the message.

  test_jinja_train.py JINJA_RENDER SHARDLM GGUF
SKIP (77) without the GGUF (tools/fetch_smollm2.sh), jinja2, gguf or tokenizers.
"""
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

SKIP = 77
HERE = Path(__file__).resolve().parent
sys.dont_write_bytecode = True
sys.path.insert(0, str(HERE))
try:
    import gguf
    import tokenizers
    from test_jinja import make_env
except ImportError as e:
    print(f"SKIP: {e}; run tools/install_deps.sh")
    sys.exit(SKIP)

CONVERSATIONS = [
    [{"role": "user", "content": "What is 2 + 2?"}, {"role": "assistant", "content": "4."}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name a colour."},
     {"role": "assistant", "content": "Blue."}, {"role": "user", "content": "Another, in French?"},
     {"role": "assistant", "content": "Rouge — comme le vin. 🍷"}],
    [{"role": "user", "content": "Bonjour"}, {"role": "assistant", "content": " spaced answer\n with lines "},
     {"role": "user", "content": "and a last question without an answer"}],
]
# Templates whose conversations render as growing prefixes (checked below); DeepSeek-R1's drops
# an earlier answer's reasoning and must be refused for a two-exchange chat with reasoning.
TEMPLATES = ["chatml", "qwen2.5-instruct", "llama-3-instruct", "gemma-it", "phi-3", "zephyr", "mistral-instruct",
             "granite-3.0-instruct", "microsoft-Phi-4-mini-instruct", "llama-2-chat"]


def prefix(p, full):
    """How much of p is a prefix of full when the rest of p is whitespace (the template's own
    formatting after its last tag)."""
    k = len(p)
    while not full.startswith(p[:k]):
        assert p[k - 1] in " \t\r\n", "not a prefix"
        k -= 1
    return k


def reference(env, src, tok, conv, bos, eos):
    t = env.from_string(src)

    def render(msgs, agp):
        # tools=None as transformers' apply_chat_template passes it without tools (and the C side too)
        return t.render(messages=msgs, tools=None, add_generation_prompt=agp, bos_token=bos, eos_token=eos)

    full = render(conv, False)
    ids, loss, pos = [], [], 0
    for k, m in enumerate(conv):
        if m["role"] != "assistant":
            continue
        a, b = prefix(render(conv[:k], True), full), prefix(render(conv[:k + 1], False), full)
        assert pos <= a <= b, f"not prefix-stable at {k}"
        for text, flag in ((full[pos:a], 0), (full[a:b], 1)):
            if text:
                e = tok.encode(text, add_special_tokens=False).ids
                ids += e
                loss += [flag] * len(e)
        pos = b
    if full[pos:]:
        e = tok.encode(full[pos:], add_special_tokens=False).ids
        ids += e
        loss += [0] * len(e)
    return full, ids, loss


def main():
    if len(sys.argv) != 4:
        print(__doc__)
        return 2
    render_bin, shardlm, gguf_path = sys.argv[1:]
    if not os.path.exists(gguf_path):
        print(f"SKIP: no SmolLM2 GGUF at {gguf_path}")
        return SKIP
    env = make_env()
    failed = passed = 0
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([shardlm, "convert", "gguf", "--gguf", gguf_path, "--out", f"{tmp}/conv"], check=True,
                       capture_output=True)
        tj = f"{tmp}/conv/tokenizer.json"
        tok = tokenizers.Tokenizer.from_file(tj)
        own = gguf.GGUFReader(gguf_path).fields["tokenizer.chat_template"].contents()
        sources = [("SmolLM2 (GGUF)", own)] + [(n, (HERE / "data" / "chat_templates" / f"{n}.jinja").read_text())
                                               for n in TEMPLATES]
        for name, src in sources:
            tpl = Path(tmp) / "t.jinja"
            tpl.write_text(src)
            bos, eos = ("<|im_start|>", "<|im_end|>") if "SmolLM2" in name else ("<s>", "</s>")
            cases, refs = [], []
            for conv in CONVERSATIONS:
                if name in ("mistral-instruct", "llama-2-chat", "gemma-it") and conv[0]["role"] == "system":
                    conv = conv[1:]  # these raise on a system message, or fold it; kept simple
                cases.append({"messages": conv, "bos_token": bos, "eos_token": eos})
                try:
                    refs.append(reference(env, src, tok, conv, bos, eos))
                except AssertionError:  # the reference finds no growing prefixes: C must refuse
                    refs.append(None)
                except Exception as e:  # noqa: BLE001  jinja2 raises: C must raise too
                    refs.append(("raises", str(e)))
            (Path(tmp) / "cases.json").write_text(json.dumps(cases))
            out = subprocess.run([render_bin, "--train", str(tpl), tj, f"{tmp}/cases.json"], capture_output=True,
                                 text=True)
            if out.returncode != 0:
                print(f"FAIL {name}: jinja_render --train: {out.stderr}")
                failed += 1
                continue
            for case, ref, got in zip(cases, refs, json.loads(out.stdout)):
                if ref is None:
                    ok = not got["ok"] and "turn by turn" in got["error"]
                    print(f"{'PASS' if ok else 'FAIL'} {name}: {len(case['messages'])} messages: not rendered turn by "
                          f"turn (jinja2), refused: {got['error'][:100]}")
                    passed += ok
                    failed += not ok
                    continue
                if ref[0] == "raises":
                    ok = not got["ok"] and got["error"].startswith("jinja: line")
                    print(f"{'PASS' if ok else 'FAIL'} {name}: jinja2 raises ({ref[1][:60]}), so does C: {got['error'][:80]}")
                    passed += ok
                    failed += not ok
                    continue
                full, ids, loss = ref
                answers = [m["content"] for m in case["messages"] if m["role"] == "assistant"]
                spans = tok.decode([i for i, f in zip(got["ids"], got["loss"]) if f], skip_special_tokens=False)
                ok = (got["ok"] and got["ids"] == ids and got["loss"] == loss
                      and tok.decode(got["ids"], skip_special_tokens=False) == full
                      and all(a.strip() in spans for a in answers) and (sum(got["loss"]) > 0) == bool(answers))
                print(f"{'PASS' if ok else 'FAIL'} {name}: {len(case['messages'])} messages, {len(ids)} ids, "
                      f"{sum(loss)} with loss{'' if got['ok'] else ': ' + got['error']}")
                if not ok and got["ok"]:
                    print(f"  ids equal: {got['ids'] == ids}, loss equal: {got['loss'] == loss}")
                passed += ok
                failed += not ok
        # A template that rewrites an earlier answer (DeepSeek-R1 drops its reasoning) is refused
        # by name, not given a wrong mask.
        src = (HERE / "data" / "chat_templates" / "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja").read_text()
        tpl = Path(tmp) / "t.jinja"
        tpl.write_text(src)
        conv = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "<think>x</think>b"},
                {"role": "user", "content": "c"}, {"role": "assistant", "content": "d"}]
        (Path(tmp) / "cases.json").write_text(json.dumps([{"messages": conv, "bos_token": "<s>", "eos_token": "</s>"}]))
        got = json.loads(subprocess.run([render_bin, "--train", str(tpl), tj, f"{tmp}/cases.json"], capture_output=True,
                                        text=True).stdout)[0]
        ok = not got["ok"] and "messages[1]" in got["error"]
        print(f"{'PASS' if ok else 'FAIL'} a template that rewrites an earlier turn is refused: {got['error'][:120]}")
        passed += ok
        failed += not ok
    print(f"{passed} passed, {failed} failed")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
