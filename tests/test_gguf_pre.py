#!/usr/bin/env python3
"""tests/test_gguf_pre.py - every GGUF `tokenizer.ggml.pre` type shardlm supports
(engine/formats/gguf_tokenizer.c's table of llama.cpp's pre-tokenizer regexes) against Hugging Face
`tokenizers`, and the refusal of the others.

llama.cpp's own test vectors check the types it ships vectors for (tests/test_vocab_vectors.py:
gpt-2, mpt, refact, starcoder here; deepseek-llm, deepseek-coder, falcon, qwen2, qwen35, llama-bpe,
command-r from llama-cpp-python's sdist). For the rest, this test takes GPT-2's vocabulary
(tests/data/ggml-vocab/ggml-vocab-gpt-2.gguf) with its tokenizer.ggml.pre replaced by each
supported name, turns it into the tokenizer.json shardlm builds from it (`test_bpe_tool json`: the
Split regexes of that type, ignore_merges, ByteLevel), loads that file in `tokenizers` (Oniguruma
regexes) and requires shardlm's ids (PCRE2) to equal Hugging Face's on test_tokenizer_kinds'
corpus plus llama.cpp's vector texts: 0 mismatches. The supported names are read from shardlm's
own refusal message ("supported: a|b|..."), so a row added to the table is checked without
editing this file. Then: types llama.cpp knows but shardlm refuses (gemma4, kimi-k2, superbpe,
roberta-bpe) and an unknown name are refused, naming the value, a reason and the supported list.
And llama.cpp's per-type BOS default when the GGUF has no tokenizer.ggml.add_bos_token: the
types whose branch of llama.cpp's src/llama-vocab.cpp (read from the sdist in .cache) sets
add_bos get the GGUF's BOS first, the others none.

usage: test_gguf_pre.py PATH/TO/test_bpe_tool   (exit 77: SKIP without `tokenizers`)
"""
import json
import os
import struct
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.dont_write_bytecode = True
VOCAB = os.path.join(HERE, "data", "ggml-vocab", "ggml-vocab-gpt-2.gguf")
ASSETS = os.environ.get("SHARDLM_ASSETS", os.path.join(HERE, "..", "..", "shared", "assets"))
SEP = "\n__ggml_vocab_test__\n"


def with_pre(src, name):
    """The GGUF bytes with tokenizer.ggml.pre's string value replaced (a vocabulary-only file: no
    tensor offsets to move)."""
    key = b"tokenizer.ggml.pre"
    i = src.find(struct.pack("<Q", len(key)) + key) + 8 + len(key)
    assert src[i:i + 4] == struct.pack("<I", 8), "tokenizer.ggml.pre is not a string"
    n = struct.unpack("<Q", src[i + 4:i + 12])[0]
    v = name.encode()
    return src[:i + 4] + struct.pack("<Q", len(v)) + v + src[i + 12 + n:]


def texts():
    out = []
    with open(VOCAB + ".inp", encoding="utf-8", newline="") as f:
        out += [t for t in f.read().split(SEP) if t]
    shakespeare = os.path.join(ASSETS, "datasets", "tinyshakespeare.txt")
    if os.path.exists(shakespeare):
        from test_tokenizer_kinds import corpus_texts
        out += corpus_texts(open(shakespeare, encoding="utf-8").read())
    # What the types' regexes single out: CJK, kana, Hangul, Bopomofo, fullwidth and CJK
    # punctuation, Indic and Arabic stops, long space runs, digit runs, cased words, chameleon's
    # sentinels and image tokens, contractions in both cases.
    out += ["中文字符 and 日本語のテキスト、カタカナ。한국어 텍스트 ㄱㄴ ㄅㄆ！…“quoted”‘x’—：；，",
            "ＡＢＣ ｆｕｌｌ（width）！ ２０２４年 १२३ । ۔ ، done.", " " * 600 + "x" + " " * 70 + "\n\n  \t y",
            "1234567 12,345,678.90 ٣٤٥٦ 000", "HTTPServer getHTTPResponse iPhone McDonald's ÉCOLE école Ǆemal",
            "<sentinel:12> IMGIMGABCZ IMGIMGAZ\t\n    four  two", "I'M YOU'RE we'LL They'Ve it'S",
            "naïve café\u0301 e\u0301 \u0915\u094d\u0937 ক্ষ ไทย", "line\r\nbreak\rcr\n\n\nend  \n"]
    return out


def run(tool, *args):
    return subprocess.run([tool, *args], capture_output=True, text=True)


def llamacpp_bos_rules():
    """From llama.cpp's own src/llama-vocab.cpp (the llama-cpp-python sdist that make test fetches):
    the gpt2 pre types whose branch sets add_bos = true, and those whose BOS id it clears; None
    without the source."""
    import glob
    import re
    paths = glob.glob(os.path.join(HERE, "..", ".cache", "llama.cpp", "llama_cpp_python-*", "vendor", "llama.cpp", "src",
                                   "llama-vocab.cpp"))
    if not paths:
        return None
    src = open(sorted(paths)[-1]).read()
    start = src.find('tokenizer_pre == "default"')
    end = src.find("unknown pre-tokenizer type", start)
    add_bos, no_bos = set(), set()
    for branch in src[start:end].split("} else if (")[0:]:
        names = re.findall(r'tokenizer_pre\s*==\s*"([^"]+)"', branch)
        body = branch.split(")", 1)[-1] if names else ""
        if "add_bos = true" in body:
            add_bos.update(names)
        if "special_bos_id = LLAMA_TOKEN_NULL" in body:
            no_bos.update(names)
    return add_bos, no_bos


def main():
    tool = sys.argv[1]
    try:
        import tokenizers
    except ImportError:
        print("SKIP: the tokenizers package is not installed (pip install tokenizers)")
        return 77
    src = open(VOCAB, "rb").read()
    corpus = texts()
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        def gguf(name):
            p = os.path.join(tmp, "v.gguf")
            open(p, "wb").write(with_pre(src, name))
            return p

        # The refusals, and the supported list they carry.
        refused = {"no-such-pre": "does not know it", "gemma4": "raw UTF-8", "kimi-k2": "code of its own",
                   "superbpe": "lookahead", "roberta-bpe": "[SEP]"}
        supported = None
        for name, why in refused.items():
            r = run(tool, "load", gguf(name))
            msg = r.stdout.strip()
            ok = r.returncode == 1 and ("'%s' is not supported" % name) in msg and why in msg and "supported: " in msg
            print("%s refused %s: %s" % ("PASS" if ok else "FAIL", name, msg[:160]))
            failures += not ok
            if "supported: " in msg:
                supported = msg.split("supported: ", 1)[1].split("|")
        if not supported or "default" not in supported or "qwen35" not in supported:
            print("FAIL: no supported list in the refusal (%s)" % supported)
            return 1
        # llama.cpp's per-type BOS (the GGUF has no tokenizer.ggml.add_bos_token): a BOS first for the
        # types llama.cpp adds one for, none for the others and for those whose BOS it clears.
        rules = llamacpp_bos_rules()
        if rules is None:
            print("SKIP per-type BOS: llama.cpp's src/llama-vocab.cpp is not in .cache/llama.cpp")
        else:
            add_bos, no_bos = rules
            wrong = []
            for name in supported:
                r = run(tool, "load", gguf(name))
                bos = r.stdout.split("bos=")[1].split()[0] if "bos=" in r.stdout else None
                want = "50256" if name in add_bos and name not in no_bos else "-1"
                if bos != want:
                    wrong.append((name, bos, want))
            ok = not wrong and {"llama-bpe", "tekken"} <= add_bos
            print("%s per-type BOS: %d types, %d of them with a BOS (llama.cpp's source: %s), wrong: %s" % (
                "PASS" if ok else "FAIL", len(supported), sum(n in add_bos and n not in no_bos for n in supported),
                "|".join(sorted(add_bos)), wrong))
            failures += not ok
        # One comparison per distinct tokenizer.json; every name must load.
        by_json = {}
        for name in supported:
            r = run(tool, "json", gguf(name))
            if r.returncode != 0:
                print("FAIL %s: %s" % (name, r.stdout.strip()[:200]))
                failures += 1
                continue
            tj = json.loads(r.stdout)
            tj.pop("shardlm", None)  # shardlm's special ids; convert gguf moves them to tokenizer_config.json
            key = json.dumps([tj["pre_tokenizer"], tj["model"].get("ignore_merges")], sort_keys=True)
            by_json.setdefault(key, (tj, []))[1].append(name)
        corpus_path = os.path.join(tmp, "corpus")
        with open(corpus_path, "wb") as f:
            for t in corpus:
                b = t.encode("utf-8")
                f.write(b"%d\n" % len(b) + b + b"\n")
        for tj, names in by_json.values():
            hf = tokenizers.Tokenizer.from_str(json.dumps(tj))
            r = run(tool, "encode", gguf(names[0]), corpus_path)
            got = [json.loads(line).get("ids") for line in r.stdout.splitlines()]
            bad = [i for i, t in enumerate(corpus) if i >= len(got) or got[i] != hf.encode(t, add_special_tokens=False).ids]
            steps = len(tj["pre_tokenizer"]["pretokenizers"]) - 1
            print("%s %s: %d texts, %d Split steps%s, %d mismatched" % (
                "PASS" if not bad and r.returncode == 0 else "FAIL", "|".join(names), len(corpus), steps,
                ", ignore_merges" if tj["model"].get("ignore_merges") else "", len(bad)))
            for i in bad[:3]:
                want = hf.encode(corpus[i], add_special_tokens=False).ids
                print("  text %r\n    hf      %s\n    shardlm %s" % (corpus[i][:60], want[:16], got[i][:16] if i < len(got) else None))
            failures += bool(bad) or r.returncode != 0
    print("%d failures" % failures)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
