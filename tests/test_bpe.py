#!/usr/bin/env python3
"""tests/test_bpe.py - shardlm's byte-level BPE (engine/text/bpe.c behind tokenizer.h) against the
Hugging Face `tokenizers` package, on SmolLM2-135M-Instruct's real vocabulary (49,152 pieces,
48,900 merges; tools/fetch_smollm2.sh puts the GGUF in .cache/smollm2/).

From the GGUF's tokens, merges and token types (read by a GGUF header reader of its own) this
script writes tokenizer.json files itself, independently of shardlm's own GGUF export: SmolLM2's own pre-tokenizer (Digits +
ByteLevel, as its Hugging Face tokenizer.json has it), and the same vocabulary behind the Llama 3
and Qwen 2 Split regexes (Qwen 2's with its NFC normalizer, Llama 3's with ignore_merges). Each is
loaded by Hugging Face and by shardlm (through a model directory, tokenizer_load_for_model), and
the GGUF itself by shardlm (tokenizer.ggml.pre = smollm). Checked, with 0 mismatches allowed:
ids of every corpus text, decodes (skip_special_tokens True and False), the exact round trip of texts without
special tokens, random id sequences decoded (lossy UTF-8 replacement), the streaming
detokenizer against whole decodes, tokenizer_min_tokens never above the true count; invalid
UTF-8 encodes without a crash and decodes as Python's errors="replace"; malformed tokenizer.json
files fail with a message naming the file and the field.

usage: test_bpe.py PATH/TO/test_bpe_tool   (exit 77: SKIP when the GGUF or `tokenizers` is missing)
"""
import json
import os
import random
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
GGUF = os.environ.get("SHARDLM_SMOLLM2",
                      os.path.join(HERE, "..", ".cache", "smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"))

GPT2_RE = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
LLAMA3_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
             r"\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
            r"\s*[\r\n]+|\s+(?!\S)|\s+")

failures = 0


def check(cond, what):
    global failures
    if not cond:
        failures += 1
        if failures <= 20:
            print("  FAIL:", what)
    return cond


def gguf_vocab(path):
    """tokenizer.ggml.tokens, .merges and .token_type read straight from the GGUF header (a reader
    of the file format written for this test, independent of shardlm's gguf.c; gguf-py's takes
    seconds on 100,000 strings)."""
    import struct
    with open(path, "rb") as f:
        data = f.read(64 << 20)
    scalar = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
    at = 0

    def take(fmt):
        nonlocal at
        v = struct.unpack_from("<" + fmt, data, at)
        at += struct.calcsize("<" + fmt)
        return v[0]

    def string():
        nonlocal at
        n = take("Q")
        at += n
        return data[at - n:at].decode("utf-8")

    def value(t):
        if t == 8:
            return string()
        if t == 9:
            et, n = take("I"), take("Q")
            return [value(et) for _ in range(n)]
        return take(scalar[t])

    if data[:4] != b"GGUF" or struct.unpack_from("<I", data, 4)[0] < 2:
        raise ValueError("%s: not a GGUF v2/v3 file" % path)
    at = 8
    take("Q")
    kv = {}
    for _ in range(take("Q")):
        key = string()
        kv[key] = value(take("I"))
    return kv["tokenizer.ggml.tokens"], kv["tokenizer.ggml.merges"], kv["tokenizer.ggml.token_type"]


def tokenizer_json(tokens, merges, types, pre, normalizer=None, ignore_merges=False, added_flags=None, more_added=(),
                   post=None):
    added = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True}
             for i, (t, ty) in enumerate(zip(tokens, types)) if ty == 3]
    for a in added:
        a.update((added_flags or {}).get(a["content"], {}))
    # Tokens past the model's vocabulary (as tokenizer.add_tokens makes them).
    added += [{"id": len(tokens) + k, "content": c, "single_word": False, "lstrip": False, "rstrip": False,
               "special": False} | flags for k, (c, flags) in enumerate(more_added)]
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": normalizer,
        "pre_tokenizer": pre,
        "post_processor": post,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                  "ignore_merges": ignore_merges,
                  "vocab": {t: i for i, t in enumerate(tokens)}, "merges": merges},
    }


def split(regex):
    return {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": False}


BYTE_LEVEL_NO_REGEX = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}
VARIANTS = {
    # SmolLM2's own tokenizer.json pre-tokenizer.
    "smollm": dict(pre={"type": "Sequence", "pretokenizers": [
        {"type": "Digits", "individual_digits": True},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}]}),
    "llama3": dict(pre={"type": "Sequence", "pretokenizers": [split(LLAMA3_RE), BYTE_LEVEL_NO_REGEX]},
                   ignore_merges=True),
    "qwen2": dict(pre={"type": "Sequence", "pretokenizers": [split(QWEN2_RE), BYTE_LEVEL_NO_REGEX]},
                  normalizer={"type": "NFC"}),
    # Added-token flags: lstrip, rstrip, single_word, and plain (non-special) added tokens.
    "added_flags": dict(pre=BYTE_LEVEL_NO_REGEX | {"use_regex": True}, added_flags={
        "<|im_start|>": {"lstrip": True}, "<|im_end|>": {"rstrip": True},
        "<|endoftext|>": {"lstrip": True, "rstrip": True, "special": False},
        "<repo_name>": {"single_word": True}, "<filename>": {"special": False}}),
    "gpt2_prefix": dict(pre={"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}),
    # `normalized` added tokens, matched on the NFC text with their content in NFC, after the
    # others are matched on the raw text ("<a>q" before "zq<a" in "zq<a>q"); flags on both passes.
    # (None of the contents is a piece of the vocabulary, else Hugging Face renumbers them.)
    "normalized_added": dict(pre={"type": "Sequence", "pretokenizers": [split(QWEN2_RE), BYTE_LEVEL_NO_REGEX]},
                             normalizer={"type": "NFC"}, more_added=[
                                 ("cafe\u0301", {"normalized": True}), ("hello world", {"normalized": True}),
                                 ("zq<a", {"normalized": True}), ("<a>q", {"normalized": False}),
                                 ("<nl>", {"normalized": True, "lstrip": True, "rstrip": True}),
                                 ("\u212b!", {"normalized": True, "single_word": True})]),
    # Post-processors' tokens with add_special_tokens: an EOS after the text (as Qwen3-Embedding
    # has it), a BOS and two after, RoBERTa's <s> $A </s>, Llama 3's BOS in a Sequence.
    "post_eos": dict(pre=BYTE_LEVEL_NO_REGEX | {"use_regex": True}, post={
        "type": "TemplateProcessing", "single": [{"Sequence": {"id": "A", "type_id": 0}},
                                                 {"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}}],
        "pair": [], "special_tokens": {"<|endoftext|>": {"id": "<|endoftext|>", "ids": [0], "tokens": ["<|endoftext|>"]}}}),
    "post_both": dict(pre=BYTE_LEVEL_NO_REGEX | {"use_regex": True}, post={
        "type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<|im_start|>", "type_id": 0}},
                                                 {"Sequence": {"id": "A", "type_id": 0}},
                                                 {"SpecialToken": {"id": "<|im_end|>", "type_id": 0}},
                                                 {"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}}],
        "pair": [], "special_tokens": {t: {"id": t, "ids": [i], "tokens": [t]} for t, i in (
            ("<|im_start|>", 1), ("<|im_end|>", 2), ("<|endoftext|>", 0))}}),
    "post_roberta": dict(pre=BYTE_LEVEL_NO_REGEX | {"use_regex": True}, post={
        "type": "RobertaProcessing", "sep": ["<|im_end|>", 2], "cls": ["<|im_start|>", 1], "trim_offsets": True,
        "add_prefix_space": False}),
    "post_sequence": dict(pre=BYTE_LEVEL_NO_REGEX | {"use_regex": True}, post={
        "type": "Sequence", "processors": [
            {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
            {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<|im_start|>", "type_id": 0}},
                                                      {"Sequence": {"id": "A", "type_id": 0}}],
             "pair": [], "special_tokens": {"<|im_start|>": {"id": "<|im_start|>", "ids": [1], "tokens": ["<|im_start|>"]}}}]}),
}


def corpus(special):
    texts = [
        "", " ", "a", "Hello world", "Hello, world! How's it going? I'm fine; they'll see, we've won, you'd know.",
        "DON'T SHOUT, IT'S LOUD. THEY'LL HEAR. WE'VE 'S 'T",
        "The quick brown fox jumps over the lazy dog.\n\nSecond paragraph.\tTabbed\ttext.\r\nWindows line.",
        "    four leading spaces", "trailing spaces    ", "   ", "\n\n\n", "\t\t \n \t", " \n  \n   x",
        "1234567890 3.14159 1,000,000 2024-11-28 0x1F 1e-9 ١٢٣ ४५६ ⅻ ½",
        "def f(x):\n    return x ** 2  # square\n\nfor i in range(10):\n\tprint(f(i))\n",
        "#include <stdio.h>\nint main(void) { printf(\"%d\\n\", 42); return 0; }\n",
        "SELECT * FROM users WHERE id = 7 AND name LIKE '%o%';",
        "日本語のテキストです。東京は大きい都市です。", "中文文本，包含标点符号。你好世界！", "한국어 텍스트입니다.",
        "Русский текст: Съешь же ещё этих мягких французских булок.", "العربية: مرحبا بالعالم، كيف حالك؟",
        "हिन्दी पाठ: नमस्ते दुनिया।", "Ελληνικά: Γειά σου Κόσμε", "עברית: שלום עולם", "ไทย: สวัสดีชาวโลก",
        "emoji: 😀😃😄 👩‍👩‍👧‍👦 🇫🇷 ❤️ 👍🏽 🏳️‍🌈", "Zalgo: Z̷̢͎a̸l̵g̶o̷", "café naïve résumé coöperate",
        "cafe\u0301 e\u0301 A\u030a \u212b \u1e9b\u0323 (decomposed, for NFC)",
        "control: \x00\x01\x02\x07\x08\x0b\x0c\x1b[31mred\x1b[0m\x7f\u0085\u00a0\u2028\u2029\u200b\ufeff",
        "mixed\u3000ideographic space and\u2003em space", "ſ long s 'ſ 'K (Kelvin sign)",
        "a" * 300, " " * 257 + "x", "ab" * 500, "😀" * 100, "\n" * 50 + "end",
        "URL: https://example.com/path?query=1&x=%20#frag email: someone@example.org",
        "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
        "<|endoftext|><|endoftext|> <|im_end|>x<|im_start|> < |im_start|> <|im_start",
        "a  <|im_start|>  b \n<|im_end|> \n c\t<|endoftext|>\t d <filename>x.py <repo_name> x<repo_name>y",
        "\u3000<|im_start|>\u00a0<|im_end|>\u2003 <|endoftext|>\n\n",
        "zq<a>q xzq<a>qx <a>q zq<a zq<azq<a cafe\u0301 café CAFÉ hello world hello  world Hello world",
        " <nl>x  <nl>\t<nl>  y<nl> \u212b! A\u030a! x\u212b! \u00c5!",
    ]
    texts += [s for s in special]
    texts += ["before" + s + "after" for s in special[:8]]
    rng = random.Random(26)
    pool = list("abcXYZ019 \t\n.,;'\"!?-_()[]{}<>|/\\@#$%^&*~`") + list("éüßçøñ日本中文한국ру́ــ🙂👍🏽\u0301\u00a0\u3000") + \
        ["'s", "'LL", "  ", "\r\n", "<|im_start|>", "<|im_end|>", "<|endoftext|>", "123", "٣", "ⅷ"]
    for _ in range(300):
        texts.append("".join(rng.choice(pool) for _ in range(rng.randint(1, 60))))
    words = ("the of and to in is was for on that with as by at from it an be this which or are "
             "tokenizer merges regex whitespace byte level unicode").split()
    for _ in range(40):
        texts.append(" ".join(rng.choice(words) for _ in range(rng.randint(20, 200))))
    # Long words: many merges in one pre-token (the merge heap's worst case).
    texts.append("".join(rng.choice("abcdefghijklmnop") for _ in range(20000)))
    texts.append("".join(rng.choice("日本中文") for _ in range(3000)))
    texts.append("\t \n" * 3000)
    return texts


def write_corpus(path, texts_bytes):
    with open(path, "wb") as f:
        for t in texts_bytes:
            f.write(b"%d\n" % len(t) + t + b"\n")


def run_tool(tool, *args):
    p = subprocess.run([tool, *args], capture_output=True, timeout=300)
    if p.returncode < 0 or p.returncode > 1 or b"Sanitizer" in p.stderr:
        check(False, "%s %s: exit %d, stderr %s" % (os.path.basename(tool), " ".join(args), p.returncode,
                                                     p.stderr.decode(errors="replace")[-500:]))
    return p


def shardlm_encode(tool, path, texts_bytes, tmp, mode="encode"):
    cpath = os.path.join(tmp, "corpus.txt")
    write_corpus(cpath, texts_bytes)
    p = run_tool(tool, mode, path, cpath)
    out = [json.loads(line) for line in p.stdout.decode().splitlines()]
    check(len(out) == len(texts_bytes), "%s: %d results for %d texts" % (path, len(out), len(texts_bytes)))
    return out


def compare(name, tool, path, hf, texts, special_strings, tmp, add_special=False):
    global failures
    before = failures
    res = shardlm_encode(tool, path, [t.encode() for t in texts], tmp, "encode_special" if add_special else "encode")
    mism = 0
    for text, r in zip(texts, res):
        want = hf.encode(text, add_special_tokens=add_special).ids
        if "error" in r:
            check(False, "%s: %r: %s" % (name, text[:60], r["error"]))
            continue
        if r["ids"] != want:
            mism += 1
            check(False, "%s: ids of %r\n    shardlm %s\n    hf      %s" % (name, text[:80], r["ids"][:40], want[:40]))
            continue
        dec = bytes.fromhex(r["decode"]).decode("utf-8")
        check(dec == hf.decode(want, skip_special_tokens=True),
              "%s: decode of %r: %r vs %r" % (name, text[:60], dec[:60], hf.decode(want, skip_special_tokens=True)[:60]))
        if not any(s in text for s in special_strings) and not name.startswith(("qwen2", "gpt2_prefix", "added_flags",
                                                                                   "normalized_added", "post_")):
            check(dec == text, "%s: round trip of %r gave %r" % (name, text[:60], dec[:60]))
        check(r["stream_ok"], "%s: streaming detokenizer differs from decode for %r" % (name, text[:60]))
        check_shown(r, hf, want, "%s: %r" % (name, text[:60]))
        check(r["min_tokens"] <= len(want), "%s: min_tokens %d > %d for %r" % (name, r["min_tokens"], len(want), text[:60]))
    print("%s %s%s: %d texts, %d mismatched ids" % ("PASS" if failures == before else "FAIL", name,
                                                  " (add_special_tokens)" if add_special else "", len(texts), mism))


def check_shown(r, hf, ids, what):
    """The decode with special tokens shown is HF's decode(skip_special_tokens=False), streamed too."""
    want = hf.decode(ids, skip_special_tokens=False)
    got = bytes.fromhex(r["decode_special"]).decode("utf-8")
    check(got == want, "%s: decode with specials shown %r vs %r" % (what, got[:80], want[:80]))
    check(r["stream_special_ok"], "%s: streaming with specials shown differs from decode" % what)


def decode_random(tool, path, hf, n_vocab, tmp):
    """Random id sequences (byte pieces that split characters, specials) decode as HF does."""
    global failures
    before = failures
    rng = random.Random(7)
    seqs = [[rng.randrange(n_vocab) for _ in range(rng.randint(1, 30))] for _ in range(200)]
    # Runs of single-byte pieces, continuation bytes and lead bytes mixed (incomplete characters).
    byte_ids = [hf.token_to_id(c) for c in ("Ã", "¤", "ð", "Ł", "ĺ", "¢", "a", "Ġ")]
    seqs += [[rng.choice(byte_ids) for _ in range(rng.randint(1, 12))] for _ in range(200)]
    seqs += [[0, 1, 2] + s for s in seqs[:20]]
    # Special ids mid-sequence, between the bytes of a character too.
    specials = [i for i, a in hf.get_added_tokens_decoder().items() if a.special]
    for s in seqs[200:300]:
        s = list(s)
        for _ in range(rng.randint(1, 3) if specials else 0):
            s.insert(rng.randint(0, len(s)), rng.choice(specials))
        seqs.append(s)


    ipath = os.path.join(tmp, "ids.txt")
    with open(ipath, "w") as f:
        for s in seqs:
            f.write(" ".join(map(str, s)) + "\n")
    p = run_tool(tool, "decode", path, ipath)
    lines = p.stdout.decode().splitlines()
    check(len(lines) == len(seqs), "decode: %d lines for %d sequences" % (len(lines), len(seqs)))
    for s, line in zip(seqs, lines):
        r = json.loads(line)
        got = bytes.fromhex(r["decode"]).decode("utf-8")
        check(got == hf.decode(s, skip_special_tokens=True), "decode %s: %r vs %r" % (s, got, hf.decode(s, skip_special_tokens=True)))
        check(r["stream_ok"], "decode %s: streaming differs" % s)
        check_shown(r, hf, s, "decode %s" % s)
    print("%s random id sequences: %d decoded as HF does (special tokens skipped and shown), streaming equal" % ("PASS" if failures == before else "FAIL", len(seqs)))


def invalid_utf8(tool, path, tokens, tmp):
    """Bytes without a piece of their own (SmolLM2 has none for 0xC0, 0xC1, 0xF5..0xFF, which
    valid UTF-8 never holds) are dropped, as Hugging Face's BPE and llama.cpp drop them."""
    global failures
    vocab = set(tokens)
    # Map bytes to their byte-level characters the GPT-2 way.
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    have = {b for b, c in zip(bs, cs) if chr(c) in vocab}
    before = failures
    rng = random.Random(11)
    texts = [b"\xff", b"\xc3", b"abc\xe2\x82", b"\xe2\x82abc", b"\xed\xa0\x80 surrogate", b"\xf4\x90\x80\x80",
             b"\xc0\xaf overlong", b"ok \xf0\x9f\x98 broken emoji \xf0\x9f\x98\x80", b"\x80\x80\x80",
             b"<|im_start|>\xfe\xff<|im_end|>"]
    texts += [bytes(rng.randrange(256) for _ in range(rng.randint(1, 80))) for _ in range(200)]
    res = shardlm_encode(tool, path, texts, tmp)
    for t, r in zip(texts, res):
        if not check("error" not in r, "invalid UTF-8 %r: %s" % (t[:40], r.get("error"))):
            continue
        want = bytes(c for c in t if c in have).decode("utf-8", errors="replace")
        if b"<|" not in t:
            check(bytes.fromhex(r["decode"]).decode("utf-8") == want, "invalid UTF-8 %r: decode is not the lossy text" % t[:40])
        check(r["stream_ok"], "invalid UTF-8 %r: streaming differs" % t[:40])
        check(r["min_tokens"] <= len(r["ids"]), "invalid UTF-8 %r: min_tokens above the count" % t[:40])
    print("%s invalid UTF-8: %d texts encoded, decodes are the lossy texts" % ("PASS" if failures == before else "FAIL", len(texts)))


def bad_files(tool, good, tmp):
    global failures
    before = failures
    cases = {
        "not_json": (b"{ this is not json", "tokenizer.json"),
        "array": (b"[1, 2, 3]", "not a JSON object"),
        "no_model": (b"{}", "model"),
        "vocab_type": (json.dumps({**good, "model": {**good["model"], "vocab": [1, 2]}}).encode(), "model.vocab"),
        "vocab_id_type": (json.dumps({**good, "model": {**good["model"], "vocab": {"a": "x"}}}).encode(), "model.vocab"),
        "vocab_absurd": (json.dumps({**good, "model": {**good["model"], "vocab": {"a": 4e9}}}).encode(), "model.vocab"),
        "merge_unknown": (json.dumps({**good, "model": {**good["model"], "merges": ["Ġ t", "zzqq9 xx7"]}}).encode(),
                          "model.merges[1]"),
        "merge_shape": (json.dumps({**good, "model": {**good["model"], "merges": [["a"]]}}).encode(), "model.merges[0]"),
        "merges_type": (json.dumps({**good, "model": {**good["model"], "merges": 3}}).encode(), "model.merges"),
        "added_type": (json.dumps({**good, "added_tokens": [{"id": "x", "content": 1}]}).encode(), "added_tokens[0]"),
        "added_absurd": (json.dumps({**good, "added_tokens": [{"id": 1 << 40, "content": "x"}]}).encode(), "added_tokens[0]"),
        "added_flag": (json.dumps({**good, "added_tokens": [{"id": 1, "content": "x", "special": "yes"}]}).encode(),
                       "special"),
        "bad_regex": (json.dumps({**good, "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            split("(unclosed"), BYTE_LEVEL_NO_REGEX]}}).encode(), "regex"),
        "split_behavior": (json.dumps({**good, "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "a"},
                                                                 "behavior": "Sideways"}}).encode(), "behavior"),
        "model type": (json.dumps({**good, "model": {"type": "CharLevel", "vocab": {}}}).encode(), "model.type"),
        "no_byte_level": (json.dumps({**good, "pre_tokenizer": None}).encode(), "ByteLevel"),
        "normalizer": (json.dumps({**good, "normalizer": {"type": "Lowercase"}}).encode(), "normalizer"),
        "decoder": (json.dumps({**good, "decoder": {"type": "WordPiece"}}).encode(), "decoder"),
        "empty_vocab": (json.dumps({**good, "added_tokens": [], "model": {**good["model"], "vocab": {}, "merges": []}}).encode(),
                        "model.vocab"),
        "truncated": (json.dumps(good).encode()[:5000], "tokenizer.json"),
    }
    for name, (data, field) in cases.items():
        d = os.path.join(tmp, "bad_" + name)
        os.makedirs(d, exist_ok=True)
        path = os.path.join(d, "tokenizer.json")
        with open(path, "wb") as f:
            f.write(data)
        p = run_tool(tool, "load", d)
        out = p.stdout.decode(errors="replace")
        check(p.returncode == 1 and out.startswith("ERROR") and path in out and field in out,
              "bad file %s: exit %d, %r (want an error naming %s and %r)" % (name, p.returncode, out.strip()[:300], path, field))
    print("%s malformed tokenizer.json: %d files refused with the file and field named" %
          ("PASS" if failures == before else "FAIL", len(cases)))


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    tool = sys.argv[1]
    try:
        import tokenizers  # noqa: F401
    except ImportError as e:
        print("SKIP: %s (pip install tokenizers)" % e)
        return 77
    if not os.path.exists(GGUF):
        print("SKIP: %s is missing (tools/fetch_smollm2.sh .cache/smollm2)" % GGUF)
        return 77
    from tokenizers import Tokenizer
    tokens, merges, types = gguf_vocab(GGUF)
    special = [t for t, ty in zip(tokens, types) if ty == 3]
    texts = corpus(special)
    with tempfile.TemporaryDirectory() as tmp:
        hfs = {}
        for name, v in VARIANTS.items():
            tj = tokenizer_json(tokens, merges, types, **v)
            d = os.path.join(tmp, name)
            os.makedirs(d)
            with open(os.path.join(d, "tokenizer.json"), "w") as f:
                json.dump(tj, f, ensure_ascii=False)
            hfs[name] = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
            compare(name, tool, d, hfs[name], texts, special, tmp)
            if name.startswith("post_"):
                compare(name, tool, d, hfs[name], texts, special, tmp, add_special=True)
            if name == "smollm":
                good = tj
        # The GGUF itself: shardlm's export (tokenizer.ggml.pre = smollm) against HF's SmolLM2 form.
        compare("gguf(smollm)", tool, GGUF, hfs["smollm"], texts, special, tmp)
        decode_random(tool, GGUF, hfs["smollm"], len(tokens), tmp)
        invalid_utf8(tool, GGUF, tokens, tmp)
        bad_files(tool, good, tmp)
    print("%s test_bpe: %d failed checks" % ("PASS" if failures == 0 else "FAIL", failures))
    return 0 if failures == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
