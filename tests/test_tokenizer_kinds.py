#!/usr/bin/env python3
"""tests/test_tokenizer_kinds.py - shardlm's tokenizer.json kinds other than byte-level BPE
(engine/text/wordpiece.c, unigram.c, bpe.c's character BPE, normalizer.c, text_decode.c) against
Hugging Face `tokenizers`, through tests/test_bpe_tool:

  wordpiece-minilm   all-MiniLM-L6-v2's real tokenizer.json (BERT uncased; tools/fetch_minilm.sh puts
                     it in .cache/minilm/; this part SKIPs without it), also with the [CLS] ... [SEP]
                     template (add_special_tokens)
  wordpiece-cased    a WordPiece trained here on tinyshakespeare (BertNormalizer without lowercase
                     or accent stripping, BertPreTokenizer, [CLS]/[SEP] by BertProcessing)
  spbpe-legacy       Llama 2's vocabulary as transformers writes its tokenizer.json (BPE with
                     byte_fallback, Prepend + Replace normalizers, Replace/ByteFallback/Fuse/Strip
                     decoder), built from the shared assets' tokenizer.model by this script
  spbpe-metaspace    the same vocabulary behind a Metaspace pre-tokenizer (prepend_scheme first) and
                     a Metaspace + ByteFallback decoder
  wordlevel          a WordLevel trained here (Whitespace pre-tokenizer, no normalizer, no decoder:
                     decode joins with spaces), and one with NFD + Lowercase + StripAccents,
                     WhitespaceSplit + Punctuation + Digits and a [CLS] $A [SEP] template
  unigram            a Unigram trained here (UnigramTrainer; NFKC + Lowercase, Metaspace), and the
                     same with byte_fallback and <0xNN> pieces added
  unigram-escapes    that Unigram behind Replace normalizers and a Split whose regexes use
                     Oniguruma's \\uHHHH escapes (which PCRE2 lacks), one escaped as a literal \\u
  unigram-mon        mon-tokenizer's real tokenizer.json (a released Unigram for Mon, Burmese and
                     English: byte_fallback, Replace regexes with \\uHHHH, NFC, Metaspace;
                     tools/fetch_mon_tokenizer.sh puts it in .cache/mon-tokenizer/; SKIPs without it)
For each: the ids of every corpus text (0 mismatches allowed), decode (skip_special_tokens True and False) of
those ids and of random id sequences, the streaming detokenizer against the decode (WordPiece's
cleanup included), the SentencePiece tokenizer.model itself with control ids shown against the
spbpe-legacy tokenizer.json, then malformed files refused with a message and no crash.

usage: test_tokenizer_kinds.py PATH/TO/test_bpe_tool   (exit 77: SKIP without `tokenizers` or the assets)
"""
import json
import os
import random
import struct
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
ASSETS = os.environ.get("SHARDLM_ASSETS", os.path.join(ROOT, "..", "shared", "assets"))
MINILM = os.path.join(ROOT, ".cache", "minilm", "tokenizer.json")
MON = os.path.join(ROOT, ".cache", "mon-tokenizer", "tokenizer.json")
failures = 0


def decode_lines(tool, path, seqs):
    """The tool's `decode PATH IDS` output lines (one JSON object each) for seqs, lists of ids."""
    with tempfile.NamedTemporaryFile("w", suffix=".ids", delete=False) as f:
        f.write("".join(" ".join(map(str, s)) + "\n" for s in seqs))
        name = f.name
    try:
        r = subprocess.run([tool, "decode", path, name], capture_output=True, text=True)
    finally:
        os.unlink(name)
    return r.stdout.splitlines()

def check(cond, what):
    global failures
    if not cond:
        failures += 1
        if failures <= 25:
            print("  FAIL:", what)
    return cond


def corpus_texts(shakespeare):
    rng = random.Random(7)
    texts = ["", " ", "  ", "Hello world", " Hello world", "Hello, World! I'm fine; don't ask.",
             "Héllo naïve café ÄPFEL über Führer", "İstanbul ΣΑΣ σας ß ǅ", "中文字符 and 日本語 テスト 한국어",
             "\tTabs\nnew\x00line\u200b zero\u00a0nbsp", "a" * 120, "unaffable [CLS] [SEP] [UNK] <s> </s> <unk>",
             "🦙.cpp emoji 😀👍🏽 👨‍👩‍👧", "3.14159 1,000,000 ٣٤٥ १२३", "ﬁ ﬂ ① ㈱ ｈａｌｆ", "e\u0301 a\u0308 n\u0303",
             "  leading and trailing  ", "line\r\nbreaks\n\n\nand\ttabs", "'quoted' \"double\" `back`", "x" * 3000,
             "\u2581already\u2581spaced", "<0x41> <0xZZ>", "don't I'll we've they're he's", "Ünïcödé"]
    lines = [l for l in shakespeare.split("\n") if l.strip()]
    for _ in range(120):
        k = rng.randrange(len(lines) - 4)
        texts.append("\n".join(lines[k:k + rng.randrange(1, 4)]))
    alphabet = "abcXYZ019 .,!?'\n\t\u00e9\u00df\u4e2d\u0416\u03a3\U0001F600\u0301\u2581\u3000"
    for _ in range(80):
        texts.append("".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 40))))
    return texts


def run_tool(tool, mode, path, texts):
    with tempfile.NamedTemporaryFile("wb", suffix=".corpus", delete=False) as f:
        for t in texts:
            b = t.encode("utf-8")
            f.write(b"%d\n" % len(b) + b + b"\n")
        name = f.name
    try:
        r = subprocess.run([tool, mode, path, name], capture_output=True, text=True)
    finally:
        os.unlink(name)
    if r.returncode != 0:
        return None, r.stdout + r.stderr
    return [json.loads(line) for line in r.stdout.splitlines()], ""


def check_shown(g, hf, ids, what):
    """The decode with special tokens shown is HF's decode(skip_special_tokens=False), streamed too."""
    want = hf.decode(ids, skip_special_tokens=False)
    got = bytes.fromhex(g["decode_special"]).decode("utf-8", "replace")
    check(got == want, "%s: decode with specials shown %r vs %r" % (what, got[:60], want[:60]))
    check(g.get("stream_special_ok"), "%s: streaming with specials shown differs from decode" % what)


def compare(tool, label, path, texts, special_too=False):
    import tokenizers
    hf = tokenizers.Tokenizer.from_file(path)
    hf.no_padding()
    hf.no_truncation()
    before = failures
    modes = [("encode", False)] + ([("encode_special", True)] if special_too else [])
    for mode, special in modes:
        got, err = run_tool(tool, mode, path, texts)
        if not check(got is not None, "%s: %s failed: %s" % (label, mode, err[:300])):
            return
        for t, g in zip(texts, got):
            want = hf.encode(t, add_special_tokens=special).ids
            check(g.get("ids") == want, "%s %s %r:\n    hf     %s\n    shardlm %s" % (label, mode, t[:50], want[:24], g.get("ids", g)[:24]))
            if "decode" in g:
                check(bytes.fromhex(g["decode"]).decode("utf-8") == hf.decode(want),
                      "%s decode %r: %r vs %r" % (label, t[:40], bytes.fromhex(g["decode"])[:60], hf.decode(want)[:60]))
                check(g.get("stream_ok"), "%s: streaming differs from decode for %r" % (label, t[:40]))
                check_shown(g, hf, want, "%s %r" % (label, t[:40]))
    # Random id sequences.
    rng = random.Random(11)
    n = hf.get_vocab_size()
    seqs = [[rng.randrange(n) for _ in range(rng.randrange(1, 30))] for _ in range(200)]
    specials = [i for i, a in hf.get_added_tokens_decoder().items() if a.special]
    for s in seqs[:100] if specials else []:
        for _ in range(rng.randint(1, 3)):
            s.insert(rng.randint(0, len(s)), rng.choice(specials))
    lines = decode_lines(tool, path, seqs)
    check(len(lines) == len(seqs), "%s: decode of random ids gave %d lines" % (label, len(lines)))
    for s, line in zip(seqs, lines):
        g = json.loads(line)
        check(bytes.fromhex(g["decode"]).decode("utf-8", "replace") == hf.decode(s),
              "%s random decode %s: %r vs %r" % (label, s[:8], bytes.fromhex(g["decode"])[:60], hf.decode(s)[:60]))
        check(g.get("stream_ok"), "%s: streaming differs from decode for ids %s" % (label, s[:8]))
        check_shown(g, hf, s, "%s random ids %s" % (label, s[:8]))
    print("%s %s: %d texts%s, 200 random id sequences" % ("PASS" if failures == before else "FAIL", label, len(texts),
                                                          " (with and without special tokens)" if special_too else ""))


def sp_pieces(path):
    """(piece, score, type) of a SentencePiece .model (a ModelProto read here: field 1 pieces)."""
    data = open(path, "rb").read()

    def varint(b, i):
        x = s = 0
        while True:
            c = b[i]
            i += 1
            x |= (c & 0x7f) << s
            s += 7
            if not c & 0x80:
                return x, i

    out, i = [], 0
    while i < len(data):
        tag, i = varint(data, i)
        if tag & 7 == 2:
            n, i = varint(data, i)
            body = data[i:i + n]
            i += n
            if tag >> 3 == 1:
                piece, score, typ, j = "", 0.0, 1, 0
                while j < len(body):
                    t2, j = varint(body, j)
                    if t2 & 7 == 2:
                        m, j = varint(body, j)
                        piece = body[j:j + m].decode("utf-8")
                        j += m
                    elif t2 & 7 == 5:
                        score = struct.unpack_from("<f", body, j)[0]
                        j += 4
                    else:
                        v, j = varint(body, j)
                        if t2 >> 3 == 3:
                            typ = v
                out.append((piece, score, typ))
        elif tag & 7 == 0:
            _, i = varint(data, i)
        elif tag & 7 == 5:
            i += 4
        else:
            i += 8
    return out


def llama_json(model_path, metaspace):
    """Llama 2's tokenizer.json as transformers' LlamaConverter writes it (merges: every split of a
    piece into two pieces, ordered by the merged piece's id, then the parts')."""
    pieces = sp_pieces(model_path)
    vocab = {p: i for i, (p, _, _) in enumerate(pieces)}
    merges = []
    for i, (p, _, typ) in enumerate(pieces):
        if typ != 1:
            continue
        local = [(p[:k], p[k:]) for k in range(1, len(p)) if p[:k] in vocab and p[k:] in vocab]
        merges += sorted(((vocab[a], vocab[b], i, a, b) for a, b in local), key=lambda m: (m[2], m[0], m[1]))
    merges.sort(key=lambda m: m[2])
    added = [{"id": i, "content": p, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
              "special": True} for i, (p, _, typ) in enumerate(pieces) if typ in (2, 3)]
    tj = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
          "post_processor": {"type": "TemplateProcessing",
                             "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
                             "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
                             "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}},
          "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>", "continuing_subword_prefix": None,
                    "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
                    "vocab": vocab, "merges": [[a, b] for _, _, _, a, b in merges]}}
    if metaspace:
        tj["normalizer"] = None
        tj["pre_tokenizer"] = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": False}
        tj["decoder"] = {"type": "Sequence", "decoders": [
            {"type": "ByteFallback"}, {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": False}]}
    else:
        tj["normalizer"] = {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": "\u2581"}, {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]}
        tj["pre_tokenizer"] = None
        tj["decoder"] = {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "}, {"type": "ByteFallback"}, {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}
    return tj


def sp_model_shown(tool, model_path, json_path, texts):
    """The SentencePiece model itself (tokenizer.model, not a tokenizer.json) with special tokens
    shown decodes as Hugging Face's decode(skip_special_tokens=False) of the tokenizer.json
    LlamaConverter writes for it (legacy: Replace, ByteFallback, Fuse, Strip): control and unknown
    pieces mid-sequence, between the bytes of a character, first and last."""
    import tokenizers
    hf = tokenizers.Tokenizer.from_file(json_path)
    before = failures
    rng = random.Random(12)
    specials = [i for i, a in hf.get_added_tokens_decoder().items() if a.special]
    byte_ids = [hf.token_to_id("<0x%02X>" % b) for b in (0xE2, 0x82, 0xAC, 0xC3, 0xA9, 0x41)]
    seqs = [hf.encode(t).ids for t in texts[:60]]
    seqs += [[rng.randrange(hf.get_vocab_size()) for _ in range(rng.randrange(1, 30))] for _ in range(100)]
    seqs += [[rng.choice(byte_ids + [29871, 13]) for _ in range(rng.randrange(1, 12))] for _ in range(100)]
    for s in seqs:
        for _ in range(rng.randint(1, 3)):
            s.insert(rng.randint(0, len(s)), rng.choice(specials))
    lines = decode_lines(tool, model_path, seqs)
    check(len(lines) == len(seqs), "sentencepiece shown: %d lines for %d sequences" % (len(lines), len(seqs)))
    value = {hf.token_to_id("<0x%02X>" % b): b for b in range(256)}
    compared = 0
    for s, line in zip(seqs, lines):
        # A run of byte pieces that is invalid UTF-8 but holds a valid character is where
        # SentencePiece and Hugging Face's ByteFallback differ with or without special tokens
        # (U+FFFD per invalid byte, resp. per byte of the run: docs/tokenizers.md): not compared.
        runs, run = [], b""
        for i in s + [-1]:
            if i in value:
                run += bytes([value[i]])
            else:
                runs.append(run)
                run = b""
        if any(r.decode("utf-8", "replace") not in (r.decode("utf-8", "ignore"), "\ufffd" * len(r)) for r in runs):
            continue
        compared += 1
        check_shown(json.loads(line), hf, s, "sentencepiece model ids %s" % s[:8])
    check(compared >= 150, "sentencepiece shown: only %d sequences compared" % compared)
    print("%s sentencepiece model: %d id sequences with control ids shown as HF's tokenizer.json decodes them" %
          ("PASS" if failures == before else "FAIL", compared))


def trained(kind, text, tmp):
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    if kind == "wordpiece":
        tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
        tok.normalizer = normalizers.BertNormalizer(lowercase=False, strip_accents=False)
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tok.decoder = decoders.WordPiece()
        tr = trainers.WordPieceTrainer(vocab_size=2000, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]"])
    elif kind == "wordlevel":
        # WordLevel as Hugging Face's quick tour builds it: Whitespace, no normalizer, no decoder
        # (decode joins the tokens with spaces).
        tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
        tok.pre_tokenizer = pre_tokenizers.Whitespace()
        tr = trainers.WordLevelTrainer(vocab_size=3000, special_tokens=["[UNK]", "[PAD]", "[CLS]", "[SEP]"])
    elif kind == "wordlevel-uncased":
        # Lowercased and accent-stripped words split on whitespace and punctuation, [CLS] $A [SEP].
        tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
        tok.normalizer = normalizers.Sequence([normalizers.NFD(), normalizers.Lowercase(), normalizers.StripAccents()])
        tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation(),
                                                     pre_tokenizers.Digits(individual_digits=True)])
        tr = trainers.WordLevelTrainer(vocab_size=2500, special_tokens=["<unk>", "<pad>", "[CLS]", "[SEP]"])
    else:
        tok = Tokenizer(models.Unigram())
        tok.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase()])
        tok.pre_tokenizer = pre_tokenizers.Metaspace()
        tok.decoder = decoders.Metaspace()
        tr = trainers.UnigramTrainer(vocab_size=1500, special_tokens=["<pad>", "</s>", "<unk>"], unk_token="<unk>")
    tok.train_from_iterator([text], trainer=tr)
    if kind == "wordlevel-uncased":
        tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", special_tokens=[
            ("[CLS]", tok.token_to_id("[CLS]")), ("[SEP]", tok.token_to_id("[SEP]"))])
    if kind == "wordpiece":
        tok.post_processor = processors.BertProcessing(("[SEP]", tok.token_to_id("[SEP]")), ("[CLS]", tok.token_to_id("[CLS]")))
    path = os.path.join(tmp, kind + ".json")
    tok.save(path)
    return path


def unigram_byte_fallback(path, tmp):
    tj = json.load(open(path))
    tj["model"]["byte_fallback"] = True
    low = min(s for _, s in tj["model"]["vocab"]) - 1
    tj["model"]["vocab"] += [["<0x%02X>" % b, low] for b in range(256)]
    tj["decoder"] = {"type": "Sequence", "decoders": [{"type": "ByteFallback"}, tj["decoder"]]}
    out = os.path.join(tmp, "unigram-bf.json")
    json.dump(tj, open(out, "w"))
    return out


def unigram_escapes(path, tmp):
    """The trained Unigram with regexes written as tokenizer.json files write them for Oniguruma:
    \\uHHHH escapes (in a class, alone, in a range) and an escaped backslash before a u, which
    stays a literal backslash and u."""
    tj = json.load(open(path))
    tj["normalizer"] = {"type": "Sequence", "normalizers": [
        {"type": "Replace", "pattern": {"Regex": "[\\u00AD\\u200B-\\u200D\\u2060\\uFEFF]"}, "content": ""},
        {"type": "Replace", "pattern": {"Regex": "\\u00e9|\\\\u0041"}, "content": "E"},
        {"type": "Replace", "pattern": {"Regex": "\\p{Zs}"}, "content": " "}, tj["normalizer"]]}
    tj["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [tj["pre_tokenizer"], {
        "type": "Split", "pattern": {"Regex": "\\u002C|[\\u0021-\\u0023]"}, "behavior": "Isolated", "invert": False}]}
    out = os.path.join(tmp, "unigram-escapes.json")
    json.dump(tj, open(out, "w"))
    return out


def with_added(path, tmp, label):
    """The tokenizer with added tokens as Hugging Face's add_tokens makes them: `normalized` ones
    (their content normalized, matched on the normalized text: with Prepend, Lowercase, NFKC, a
    Metaspace that prepends only at the text's start) and plain ones (matched on the raw text
    first), with lstrip/rstrip/single_word."""
    from tokenizers import AddedToken, Tokenizer
    tok = Tokenizer.from_file(path)
    tok.add_tokens([AddedToken("hello world", normalized=True), AddedToken("<tag>", normalized=False),
                    AddedToken("Foo", normalized=True, lstrip=True, rstrip=True), AddedToken("thee", normalized=True,
                                                                                             single_word=True),
                    AddedToken("lo wo", normalized=False)])
    out = os.path.join(tmp, label + "-added.json")
    tok.save(out)
    return out


ADDED_TEXTS = ["hello world", " hello world", "hello world hello  world Hello World HELLO WORLD", "xhello worldx",
               "<tag>hello world<tag> Foo  Foo\tx  Foo", "thee theeth thee, fthee", "ﬁhello ｈｅｌｌｏ ｗｏｒｌｄ",
               "hel<tag>lo wo rld hello wo", "Foo", " Foo ", "  hello world  "]

ESCAPE_TEXTS = ["soft\u00adhy\u00adphen zero\u200bwidth join\u200dner word\u2060joiner \ufeffbom", "caf\u00e9 \u00e9t\u00e9",
                "a\\u0041b \\u00e9 \\\\u0041 u0041 \\x{41}", "one, two!three\"four#five", "nb\u00a0sp em\u2003sp \u3000ideo"]


def sp_charsmap(model_bytes):
    """ModelProto.normalizer_spec (field 3).precompiled_charsmap (field 2), read here."""
    def fields(b):
        i = 0
        while i < len(b):
            key, i = varint(b, i)
            if key & 7 == 2:
                n, i = varint(b, i)
                yield key >> 3, b[i:i + n]
                i += n
            elif key & 7 == 0:
                _, i = varint(b, i)
            elif key & 7 == 5:
                i += 4
            else:
                i += 8

    def varint(b, i):
        x = sh = 0
        while True:
            c = b[i]
            i += 1
            x |= (c & 127) << sh
            sh += 7
            if c < 128:
                return x, i
    spec = [v for k, v in fields(model_bytes) if k == 3][0]
    return [v for k, v in fields(spec) if k == 2][0]


def unigram_precompiled(text, rule, tmp):
    """A Unigram tokenizer.json whose normalizer is Precompiled with the charsmap of SentencePiece's
    `rule` (nmt_nfkc, nmt_nfkc_cf), built with the sentencepiece trainer and tokenizers' own
    normalizers.Precompiled, as the T5/ALBERT/XLM-R converters write them (nmt_nfkc_cf followed
    by T5's Replace(Regex(" {2,}"), " "))."""
    import io
    import sentencepiece as spm
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(text.split("\n")), model_writer=buf, vocab_size=1000,
                                   model_type="unigram", normalization_rule_name=rule, minloglevel=2)
    proto = buf.getvalue()
    sp = spm.SentencePieceProcessor(model_proto=proto)
    vocab = [(sp.id_to_piece(i), sp.get_score(i)) for i in range(sp.get_piece_size())]
    tok = Tokenizer(models.Unigram(vocab, unk_id=sp.unk_id()))
    tok.normalizer = normalizers.Precompiled(sp_charsmap(proto))
    if rule == "nmt_nfkc_cf":  # T5's layout: the charsmap, then runs of spaces folded by a Regex Replace
        from tokenizers import Regex
        tok.normalizer = normalizers.Sequence([tok.normalizer, normalizers.Replace(Regex(" {2,}"), " ")])
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    path = os.path.join(tmp, "unigram-%s.json" % rule)
    tok.save(path)
    return path


# Texts that exercise a charsmap: compatibility characters, combining sequences (grapheme clusters
# of every length around the 6-byte rule), controls, spaces, emoji sequences.
# Mon and Burmese (the scripts mon-tokenizer was trained on): a Mon sentence, a Burmese one, digits.
MON_TEXTS = ["\u1000\u1060\u102c \u1019\u1014\u103a \u1018\u102c\u101e\u102c\u104a \u1015\u1039\u100d\u1032 \u1002\u1000\u1031\u102c\u1036 \u1041\u1042\u1043",
             "\u1019\u103c\u1014\u103a\u1019\u102c\u1018\u102c\u101e\u102c \u101e\u100a\u103a \u1041\u1049\u1044\u1048 \u1001\u102f\u1014\u103e\u1005\u103a\u104b",
             "Mon \u1019\u1014\u103a and English mixed, \u1050\u1051 \u105a\u105b\u105c \u1075\u1076 \u109e\u109f"]
PRECOMPILED_TEXTS = ["ﬁ ﬂ ① ㈱ ｈａｌｆ ＡＢＣ ｶﾀｶﾅ ™ … ¼ ㎏ ℌ ⅷ Ⅻ", "e\u0301 a\u0308 n\u0303 e\u0301\u0302 ｅ\u0301 ﬁ\u0301",
                     "\u1100\u1161\u11a8 한국어 ᄀᄁ", "\x01\x02\x7f\u0085\u200b\u200d\ufeff x\u00ad y", "\u00a0\u2002\u3000 spaces\u2028",
                     "👨‍👩‍👧 🇯🇵 👍🏽 ❤️ ﷺ ﻼ", "Ａ\u0308\u0301\u0302 ㍿ ㋀ ㏠", "İ ß ẞ Σ ς ǅ ﬀ", "a\u20dd \u0915\u094d\u0937 ক্ষ"]


def wordlevel_without_unk(tool, tmp):
    """A WordLevel whose unk_token is not in its vocabulary: a known word encodes, an unknown one
    is an error on both sides (Hugging Face raises MissingUnkToken), not a crash or a guess."""
    import tokenizers
    p = os.path.join(tmp, "wordlevel-nounk.json")
    json.dump({"version": "1.0", "added_tokens": [], "normalizer": None, "pre_tokenizer": {"type": "Whitespace"},
               "post_processor": None, "decoder": None,
               "model": {"type": "WordLevel", "vocab": {"to": 0, "be": 1, "or": 2, "not": 3}, "unk_token": "<unk>"}},
              open(p, "w"))
    hf = tokenizers.Tokenizer.from_file(p)
    got, err = run_tool(tool, "encode", p, ["to be or not to be", "to be, or not"])
    try:
        hf.encode("to be, or not")
        hf_raises = False
    except Exception:
        hf_raises = True
    ok = check(got is not None and got[0].get("ids") == hf.encode("to be or not to be").ids and "error" in got[1]
               and hf_raises, "wordlevel without unk: %r (hf raises: %s) %s" % (got, hf_raises, err[:200]))
    print("%s wordlevel without unk: a known text encodes, an unknown word is an error" % ("PASS" if ok else "FAIL"))


def malformed(tool, tmp, base):
    cases = {
        "model.type": lambda t: t["model"].update(type="CharLevel"),
        "WordLevel vocab": lambda t: t["model"].update(type="WordLevel", vocab=[["a", 0]]),
        "WordLevel id": lambda t: t["model"].update(type="WordLevel", vocab={"a": -1}),
        "Unigram vocab": lambda t: t["model"].update(type="Unigram", vocab={"a": 1}),
        "Unigram entry": lambda t: t["model"].update(type="Unigram", vocab=[["a"]]),
        "WordPiece unk": lambda t: t["model"].update(unk_token="[NOPE]"),
        "max chars": lambda t: t["model"].update(max_input_chars_per_word=-3),
        "normalizer": lambda t: t.update(normalizer={"type": "Precompiled", "precompiled_charsmap": "AAAA"}),
        "Replace regex": lambda t: t.update(normalizer={"type": "Replace", "pattern": {"Regex": "( +"}, "content": " "}),
        "Replace \\u short": lambda t: t.update(normalizer={"type": "Replace", "pattern": {"Regex": "\\u00A"}, "content": ""}),
        "Replace \\u class": lambda t: t.update(normalizer={"type": "Replace", "pattern": {"Regex": "[\\u00AD"}, "content": ""}),
        "pre": lambda t: t.update(pre_tokenizer={"type": "UnicodeScripts"}),
        "decoder": lambda t: t.update(decoder={"type": "CTC"}),
        "Strip": lambda t: t.update(decoder={"type": "Strip", "content": " ", "start": -1, "stop": 0}),
        "post": lambda t: t.update(post_processor={"type": "BertProcessing", "sep": ["[SEP]", 10 ** 9], "cls": ["[CLS]", 0]}),
        "metaspace": lambda t: t.update(pre_tokenizer={"type": "Metaspace", "replacement": "_", "prepend_scheme": "first"}),
        "prepend scheme": lambda t: t.update(pre_tokenizer={"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "x"}),
        "ByteLevel mixed": lambda t: t.update(pre_tokenizer={"type": "ByteLevel"}),
    }
    ok = 0
    for name, edit in cases.items():
        tj = json.load(open(base))
        edit(tj)
        p = os.path.join(tmp, "bad.json")
        json.dump(tj, open(p, "w"))
        r = subprocess.run([tool, "load", p], capture_output=True, text=True)
        ok += check(r.returncode == 1 and r.stdout.startswith("ERROR ") and "bad.json" in r.stdout,
                    "malformed %s: rc %d, %r" % (name, r.returncode, (r.stdout + r.stderr)[:200]))
    print("%s malformed: %d of %d refused with a message" % ("PASS" if ok == len(cases) else "FAIL", ok, len(cases)))


def main():
    tool = sys.argv[1]
    try:
        import tokenizers  # noqa: F401
    except ImportError:
        print("SKIP: the tokenizers package is not installed (pip install tokenizers)")
        return 77
    shakespeare_path = os.path.join(ASSETS, "datasets", "tinyshakespeare.txt")
    llama_model = os.path.join(ASSETS, "llama2-tokenizer", "tokenizer.model")
    if not os.path.exists(shakespeare_path) or not os.path.exists(llama_model):
        print("SKIP: shared assets not found (set SHARDLM_ASSETS)")
        return 77
    shakespeare = open(shakespeare_path, encoding="utf-8").read()
    texts = corpus_texts(shakespeare)
    with tempfile.TemporaryDirectory() as tmp:
        if os.path.exists(MINILM):
            compare(tool, "wordpiece-minilm", MINILM, texts, special_too=True)
        else:
            print("SKIP wordpiece-minilm: %s not found (tools/fetch_minilm.sh .cache/minilm)" % MINILM)
        wp = trained("wordpiece", shakespeare[:300000], tmp)
        compare(tool, "wordpiece-cased", wp, texts, special_too=True)
        for variant in ("legacy", "metaspace"):
            p = os.path.join(tmp, "llama-%s.json" % variant)
            json.dump(llama_json(llama_model, variant == "metaspace"), open(p, "w"))
            compare(tool, "spbpe-" + variant, p, texts, special_too=True)
            compare(tool, "spbpe-%s-added" % variant, with_added(p, tmp, variant), texts + ADDED_TEXTS, special_too=True)
            if variant == "legacy":
                sp_model_shown(tool, llama_model, p, texts)
        for kind in ("wordlevel", "wordlevel-uncased"):
            compare(tool, kind, trained(kind, shakespeare[:300000], tmp), texts, special_too=True)
        wordlevel_without_unk(tool, tmp)
        # Whitespace's \w and \s (Oniguruma's) on every code point Unicode 3.2 assigns, each between
        # two letters and beside a space: the word ids and unk ids fall where Hugging Face's do.
        import unicodedata
        cps = [c for c in range(1, 0x110000) if not 0xD800 <= c < 0xE000 and unicodedata.ucd_3_2_0.category(chr(c)) != "Cn"]
        classes = [" ".join("a%sa b%s" % (chr(c), chr(c)) for c in cps[i:i + 2000]) for i in range(0, len(cps), 2000)]
        compare(tool, "wordlevel-code-points", trained("wordlevel", shakespeare[:300000], tmp), classes)
        ug = trained("unigram", shakespeare[:300000], tmp)
        compare(tool, "unigram", ug, texts)
        compare(tool, "unigram-added", with_added(ug, tmp, "unigram"), texts + ADDED_TEXTS)
        compare(tool, "unigram-byte-fallback", unigram_byte_fallback(ug, tmp), texts)
        compare(tool, "unigram-escapes", unigram_escapes(ug, tmp), texts + ESCAPE_TEXTS)
        if os.path.exists(MON):
            compare(tool, "unigram-mon", MON, texts + ESCAPE_TEXTS + MON_TEXTS, special_too=True)
        else:
            print("SKIP unigram-mon: %s not found (tools/fetch_mon_tokenizer.sh .cache/mon-tokenizer)" % MON)
        try:
            import sentencepiece  # noqa: F401
            for rule in ("nmt_nfkc", "nmt_nfkc_cf"):
                compare(tool, "unigram-precompiled-" + rule, unigram_precompiled(shakespeare[:200000], rule, tmp),
                        texts + PRECOMPILED_TEXTS)
        except ImportError:
            print("SKIP unigram-precompiled: the sentencepiece package is not installed (pip install sentencepiece)")
        malformed(tool, tmp, wp)
    print("%d failures" % failures)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
