#!/usr/bin/env python3
"""A SentencePiece tokenizer.model with the model's own Jinja chat template (engine/text/tokenizer.cc
encodes control pieces' strings as their ids, so the rendered template is encoded whole, as for
tokenizer.json): tests/jinja_render --train (engine/text/jinja_train.c: shardlm's Jinja, then
tokenizer_encode) against a reference from libraries no one here wrote: Python jinja2 (configured
as transformers does, test_jinja.make_env) renders each turn, the text is split at the strings of
the model's control and unknown pieces (as Hugging Face's tokenizers split added tokens), and the
`sentencepiece` package encodes every text between them on its own (transformers' legacy Llama
behaviour). Ids and loss flags must be equal for Llama 2's tokenizer.model (shared assets) with the
llama-2-chat, mistral-instruct and zephyr templates over test_jinja_train's conversations plus
one whose contents hold "<s>" and "</s>"; and tests/test_bpe_tool must report that the model
encodes special tokens (what `serve` and `train` check before they take the model's template).

  test_sp_chat.py JINJA_RENDER TEST_BPE_TOOL
SKIP (77) without the shared assets, jinja2 or sentencepiece.
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
ASSETS = Path(os.environ.get("SHARDLM_ASSETS", HERE.parent.parent / "shared" / "assets"))
MODEL = ASSETS / "llama2-tokenizer" / "tokenizer.model"
try:
    import sentencepiece
    from test_jinja import make_env
    from test_jinja_train import CONVERSATIONS, reference
except (ImportError, SystemExit) as e:
    print(f"SKIP: {e}; run tools/install_deps.sh")
    sys.exit(SKIP)


class SpWithSpecials:
    """encode(text).ids as Hugging Face's tokenizers would for a SentencePiece model whose control
    and unknown pieces are special added tokens: those strings (leftmost, then longest) become
    their ids, every text between them is encoded by sentencepiece on its own."""

    def __init__(self, path):
        self.sp = sentencepiece.SentencePieceProcessor(model_file=str(path))
        self.special = {self.sp.id_to_piece(i): i for i in range(self.sp.get_piece_size())
                        if self.sp.is_control(i) or self.sp.is_unknown(i)}

    def encode(self, text, add_special_tokens=False):
        ids, seg, i = [], 0, 0
        while i <= len(text):
            hit = max((s for s in self.special if text.startswith(s, i)), key=len, default=None) if i < len(text) else None
            if hit is None and i < len(text):
                i += 1
                continue
            if i > seg:
                ids += self.sp.encode(text[seg:i])
            if hit is None:
                break
            ids.append(self.special[hit])
            i = seg = i + len(hit)

        class Encoding:
            pass
        e = Encoding()
        e.ids = ids
        return e


def main():
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    render_bin, tool = sys.argv[1:]
    if not MODEL.exists():
        print(f"SKIP: {MODEL} not found (set SHARDLM_ASSETS)")
        return SKIP
    env = make_env()
    tok = SpWithSpecials(MODEL)
    failed = passed = 0
    load = subprocess.run([tool, "load", str(MODEL)], capture_output=True, text=True).stdout
    ok = load.startswith("OK ") and "special=1" in load
    print(f"{'PASS' if ok else 'FAIL'} tokenizer.model encodes special tokens: {load.strip()}")
    passed += ok
    failed += not ok
    convs = CONVERSATIONS + [[{"role": "user", "content": "Say <s> and </s>, then <unk>."},
                              {"role": "assistant", "content": "<s></s> said </s>"}]]
    with tempfile.TemporaryDirectory() as tmp:
        for name in ("llama-2-chat", "mistral-instruct", "zephyr"):
            src = (HERE / "data" / "chat_templates" / f"{name}.jinja").read_text()
            tpl = Path(tmp) / "t.jinja"
            tpl.write_text(src)
            cases, refs = [], []
            for conv in convs:
                if name != "zephyr" and conv[0]["role"] == "system":
                    conv = conv[1:]
                cases.append({"messages": conv, "bos_token": "<s>", "eos_token": "</s>"})
                refs.append(reference(env, src, tok, conv, "<s>", "</s>"))
            (Path(tmp) / "cases.json").write_text(json.dumps(cases))
            out = subprocess.run([render_bin, "--train", str(tpl), str(MODEL), f"{tmp}/cases.json"], capture_output=True,
                                 text=True)
            if out.returncode != 0:
                print(f"FAIL {name}: jinja_render --train: {out.stderr}")
                failed += 1
                continue
            for case, (full, ids, loss), got in zip(cases, refs, json.loads(out.stdout)):
                ok = got["ok"] and got["ids"] == ids and got["loss"] == loss and sum(loss) > 0 and (1 in ids or 2 in ids)
                print(f"{'PASS' if ok else 'FAIL'} {name}: {len(case['messages'])} messages, {len(ids)} ids, "
                      f"{sum(loss)} with loss{'' if got['ok'] else ': ' + got['error']}")
                if not ok and got["ok"]:
                    print(f"  want {ids[:40]}\n  got  {got['ids'][:40]}")
                passed += ok
                failed += not ok
    print(f"{passed} passed, {failed} failed")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
