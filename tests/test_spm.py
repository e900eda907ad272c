#!/usr/bin/env python3
"""engine/text/spm.c (SentencePiece's BPE model without libsentencepiece) against the two
SentencePiece implementations no one here wrote: libsentencepiece 0.1.97, which shardlm still links
(SHARDLM_SENTENCEPIECE=lib makes tokenizer.cc load every model with it), and the `sentencepiece`
Python package. tests/test_bpe_tool runs the same corpus through both loads of each model; every
line (the ids, the decoded text, the streaming detokenizer's agreement, with and without special
tokens shown) must be equal, and so must the decoding of random id sequences. For the valid UTF-8
texts without control-piece strings the Python package's ids must equal them as well.

Models: Llama 2's and stories260K's tokenizer.model (shared assets), llama.cpp's
ggml-vocab-llama-spm.gguf (tests/data), Gemma 3's GGUF vocabulary (.cache/gemma3-270m, where
tools/fetch_default_model.sh puts it; left out with a note when absent), and BPE models the test
trains with the Python package to reach what those do not: remove_extra_whitespaces,
treat_whitespace_as_suffix, escape_whitespaces off, user-defined symbols, no byte fallback (runs
of unknown characters), unused pieces (split back by the merges that made them), a custom
unk_surface. A Unigram model and a model with a duplicate piece must go to libsentencepiece (the
second refused with its message). Corpus: Shakespeare, SQuAD passages, random Unicode (CJK, emoji,
combining marks, U+2581, U+FFFD), malformed UTF-8 (truncated, overlong, surrogates, past
U+10FFFF, lone continuation bytes, NUL), whitespace runs, control-piece strings, 30 KB texts.

  test_spm.py TEST_BPE_TOOL
SKIP (77) without the shared assets or the sentencepiece package.
"""
import json
import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path

SKIP = 77
HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
ASSETS = Path(os.environ.get("SHARDLM_ASSETS", ROOT.parent / "shared" / "assets"))
try:
    import sentencepiece as spm
    from sentencepiece import sentencepiece_model_pb2 as pb
except ImportError as e:
    print(f"SKIP: {e}; run tools/install_deps.sh")
    sys.exit(SKIP)

failures = 0


def check(cond, msg):
    global failures
    if not cond:
        failures += 1
        if failures <= 30:
            print("  FAIL:", msg)
    return cond


def tool(exe, *args, lib=False):
    env = dict(os.environ)
    env.pop("SHARDLM_SENTENCEPIECE", None)
    if lib:
        env["SHARDLM_SENTENCEPIECE"] = "lib"
    return subprocess.run([exe, *map(str, args)], capture_output=True, env=env, timeout=600)


def corpus(rng):
    """Byte strings: the texts every model encodes."""
    texts = []
    shakespeare = (ASSETS / "datasets" / "tinyshakespeare.txt").read_bytes()
    for _ in range(250):
        at, n = rng.randrange(len(shakespeare) - 2000), rng.choice([1, 5, 20, 80, 400, 1500])
        texts.append(shakespeare[at:at + n])
    texts.append(shakespeare[:30000])
    squad = json.loads((ASSETS / "datasets" / "squad-v1.1-dev-subset.json").read_text())
    for art in squad["data"][:8]:
        for para in art["paragraphs"][:6]:
            texts.append(para["context"].encode())
            texts += [q["question"].encode() for q in para["qas"][:2]]
    pool = (list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789") * 3 +
            list(" \t\n.,;:!?'\"()[]{}<>/\\-_=+*&^%$#@~`|") * 2 +
            ["  ", "   ", "\u2581", "\u2581\u2581", "\ufffd", "\u00e9", "e\u0301", "\u00df", "\u0130", "\u4e2d", "\u6587",
             "\u65e5\u672c\u8a9e", "\ud55c\uad6d\uc5b4", "\u0627\u0644\u0639\u0631\u0628\u064a\u0629", "\u0928\u092e\u0938\u094d\u0924\u0947",
             "\U0001F600", "\U0001F468\u200d\U0001F469\u200d\U0001F467", "\U0001F1EB\U0001F1F7", "\u200b", "\u00a0", "\u3000",
             "\x00", "\x01", "\x7f", "\r\n", "\U0010FFFF", "\U00020000"])
    for _ in range(400):
        texts.append("".join(rng.choice(pool) for _ in range(rng.randrange(1, 60))).encode())
    bad = [b"\x80", b"\xbf", b"\xc0\x80", b"\xc1\xbf", b"\xe0\x80\x80", b"\xed\xa0\x80", b"\xed\xbf\xbf", b"\xf4\x90\x80\x80",
           b"\xf8\x88\x80\x80\x80", b"\xff", b"\xfe", b"\xe2\x96", b"\xe2", b"\xf0\x9f\x98", b"\xc3", b"\x00"]
    for _ in range(300):
        parts = [rng.choice(bad) if rng.random() < 0.4 else rng.choice(pool).encode() for _ in range(rng.randrange(1, 30))]
        texts.append(b"".join(parts))
    for _ in range(100):
        texts.append(bytes(rng.randrange(256) for _ in range(rng.randrange(1, 50))))
    texts += [b"", b" ", b"   ", b"\n", b" a", b"a ", b"  a  b  ", b"\t \t", b"a" * 3000, b" " * 500, b"\xe2\x96\x81" * 40,
              b"<s>", b"</s>", b"<unk>", b"<pad>", b"<0x41>", b"<0x0A>x", b"hello<s>world</s>", b"<unk><unk>",
              b"<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n", b"<unused5><unused17>", b"<mask>", b"<bos>",
              b"<tag>", b"a<tag>b", b"abab", b" ab  ab ", b"<0x41><0x42>"]
    return texts


def write_corpus(path, texts):
    with open(path, "wb") as f:
        for t in texts:
            f.write(b"%d\n" % len(t) + t + b"\n")


def random_ids(rng, n_vocab, lengths=300):
    lines = []
    for _ in range(lengths):
        n = rng.randrange(1, 40)
        ids = [rng.randrange(min(n_vocab, 300)) if rng.random() < 0.4 else rng.randrange(n_vocab) for _ in range(n)]
        lines.append(" ".join(map(str, ids)))
    return "\n".join(lines) + "\n"


def load_line(exe, path, lib):
    p = tool(exe, "load", path, lib=lib)
    return p.stdout.decode(errors="replace").strip()


def compare(exe, name, path, texts, tmp, reference=None, rng=None):
    """Own against lib over texts and random ids; reference (a Python SentencePieceProcessor)
    over the plain valid texts."""
    own_kind, lib_kind = load_line(exe, path, False), load_line(exe, path, True)
    if not check(own_kind.endswith("kind=sentencepiece-bpe") and lib_kind.endswith("kind=libsentencepiece"),
                 f"{name}: loads as {own_kind!r} / {lib_kind!r}"):
        return
    check(own_kind.rsplit(" kind=", 1)[0] == lib_kind.rsplit(" kind=", 1)[0], f"{name}: {own_kind!r} vs {lib_kind!r}")
    n_vocab = int(own_kind.split("vocab=")[1].split()[0])
    cpath = Path(tmp) / f"{name}.corpus"
    write_corpus(cpath, texts)
    before = failures
    outs = [tool(exe, "encode", path, cpath, lib=lib) for lib in (False, True)]
    if not check(all(o.returncode == 0 for o in outs), f"{name}: encode exited {[o.returncode for o in outs]}: "
                 f"{outs[0].stderr[-300:]!r} {outs[1].stderr[-300:]!r}"):
        return
    own, lib = (o.stdout.decode().splitlines() for o in outs)
    check(len(own) == len(lib) == len(texts), f"{name}: {len(own)} / {len(lib)} lines for {len(texts)} texts")
    same = sum(a == b for a, b in zip(own, lib))
    for i, (a, b) in enumerate(zip(own, lib)):
        check(a == b, f"{name}: text {i} {texts[i][:60]!r}: own {a[:200]} lib {b[:200]}")
    n_tokens = sum(len(json.loads(a)["ids"]) for a in own if a.startswith("{"))
    ipath = Path(tmp) / f"{name}.ids"
    ipath.write_text(random_ids(rng, n_vocab))
    douts = [tool(exe, "decode", path, ipath, lib=lib) for lib in (False, True)]
    dsame = sum(a == b for a, b in zip(*(o.stdout.decode().splitlines() for o in douts)))
    check(douts[0].returncode == 0 and douts[0].stdout == douts[1].stdout and dsame == 300,
          f"{name}: random-id decodes differ ({dsame} of 300 equal)")
    ref_n = ref_same = 0
    if reference is not None:
        specials = [reference.id_to_piece(i) for i in range(reference.get_piece_size())
                    if reference.is_control(i) or reference.is_unknown(i)]
        for t, a in zip(texts, own):
            try:
                s = t.decode("utf-8")
            except UnicodeDecodeError:
                continue
            if any(sp in s for sp in specials) or not a.startswith("{"):
                continue
            ref_n += 1
            want = reference.encode(s)
            got = json.loads(a)["ids"]
            ref_same += got == want
            check(got == want, f"{name}: python sentencepiece differs on {s[:60]!r}: {got[:20]} vs {want[:20]}")
    status = "PASS" if failures == before else "FAIL"
    print(f"{status} {name}: {same}/{len(texts)} texts ({n_tokens} ids) and {dsame}/300 random id sequences equal "
          f"to libsentencepiece; {ref_same}/{ref_n} valid texts equal to the sentencepiece package")


def train(tmp, name, **opts):
    text = (ASSETS / "datasets" / "tinyshakespeare.txt").read_text()[:200000]
    inp = Path(tmp) / "train.txt"
    if not inp.exists():
        inp.write_text(text + "\n" + "caf\u00e9 na\u00efve \u4e2d\u6587 \U0001F600\n" * 20)
    prefix = str(Path(tmp) / name)
    spm.SentencePieceTrainer.train(input=str(inp), model_prefix=prefix, vocab_size=opts.pop("vocab_size", 700),
                                   normalization_rule_name="identity", minloglevel=2, **opts)
    return Path(prefix + ".model")


def edit(path, out, fn):
    m = pb.ModelProto()
    m.ParseFromString(path.read_bytes())
    fn(m)
    out.write_bytes(m.SerializeToString())
    return out


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    exe = sys.argv[1]
    if not (ASSETS / "llama2-tokenizer" / "tokenizer.model").exists():
        print(f"SKIP: no shared assets at {ASSETS}")
        return SKIP
    rng = random.Random(20261202)
    texts = corpus(rng)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for name, path in (("llama2", ASSETS / "llama2-tokenizer" / "tokenizer.model"),
                           ("stories260K", ASSETS / "stories260K" / "tok512.model")):
            compare(exe, name, path, texts, tmp, spm.SentencePieceProcessor(model_file=str(path)), rng)
        compare(exe, "ggml-vocab-llama-spm", HERE / "data" / "ggml-vocab" / "ggml-vocab-llama-spm.gguf", texts, tmp, None, rng)
        gemma = ROOT / ".cache" / "gemma3-270m" / "gemma-3-270m-q4_k_m.gguf"
        if gemma.exists():
            proto = tool(exe, "json", gemma).stdout
            ref = spm.SentencePieceProcessor(model_proto=proto)
            compare(exe, "gemma3", gemma, texts, tmp, ref, rng)
        else:
            print(f"note: {gemma} absent (tools/fetch_default_model.sh .cache/gemma3-270m): Gemma's vocabulary not compared")

        # Trained models for the options the real ones do not use.
        user = "<tag>,ab,\u2581\u2581,\u00e9,  "
        a = train(tmp, "a", model_type="bpe", add_dummy_prefix=True, remove_extra_whitespaces=True, byte_fallback=False,
                  user_defined_symbols=user)
        compare(exe, "trained-a (extra spaces removed, user symbols, no byte fallback)", a, texts, tmp,
                spm.SentencePieceProcessor(model_file=str(a)), rng)
        b = train(tmp, "b", model_type="bpe", add_dummy_prefix=True, remove_extra_whitespaces=False, byte_fallback=True,
                  treat_whitespace_as_suffix=True)
        compare(exe, "trained-b (whitespace as suffix, byte fallback)", b, texts, tmp,
                spm.SentencePieceProcessor(model_file=str(b)), rng)

        def unused(m):
            k = 0
            for p in m.pieces:
                if p.type == pb.ModelProto.SentencePiece.NORMAL and len(p.piece) >= 2 and k < 60:
                    p.type = pb.ModelProto.SentencePiece.UNUSED
                    k += 1
            m.trainer_spec.unk_surface = "<?>"
            m.normalizer_spec.escape_whitespaces = False
            m.normalizer_spec.add_dummy_prefix = False

        c = edit(a, tmp / "c.model", unused)
        compare(exe, "trained-c (60 unused pieces, unk_surface, spaces not escaped)", c, texts, tmp,
                spm.SentencePieceProcessor(model_file=str(c)), rng)

        u = train(tmp, "u", model_type="unigram")
        check(load_line(exe, u, False).endswith("kind=libsentencepiece"), f"unigram: {load_line(exe, u, False)}")

        def dup(m):
            m.pieces[10].piece = m.pieces[11].piece

        d = edit(a, tmp / "d.model", dup)
        out = load_line(exe, d, False)
        check(out.startswith("ERROR") and "already defined" in out, f"duplicate piece: {out}")
        print(f"{'PASS' if failures == 0 else 'FAIL'} other models: a Unigram model loads with libsentencepiece, "
              f"a duplicate piece is refused with its message")
    print(f"{'FAIL' if failures else 'PASS'}: {failures} failed checks")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
