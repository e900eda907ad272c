#!/usr/bin/env python3
"""tests/test_gpt2_files.py - GPT-2's tokenizer files, vocab.json + merges.txt (engine/text/
gpt2_files.c), against Hugging Face `tokenizers` loading the same two files (BPE.from_file behind
the ByteLevel pre-tokenizer and decoder, as GPT2TokenizerFast does), through tests/test_bpe_tool.

The files are written here from SmolLM2's byte-level vocabulary and merges
(.cache/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf, tools/fetch_smollm2.sh; SKIP without it), with a
"#version" first line as GPT-2's merges.txt has, and loaded both as the vocab.json path and as a
model directory holding only them (tokenizer_load_for_model's last choice). test_bpe.py's corpus
(prose, code, eight scripts, emoji, whitespace runs, control characters, random mixtures) must
encode to the same ids and decode back; then malformed files are refused naming the file.

usage: test_gpt2_files.py PATH/TO/test_bpe_tool   (exit 77: SKIP without tokenizers or the GGUF)
"""
import json
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import test_bpe  # noqa: E402  (the GGUF reader, the corpus, the comparison)


def write_files(d, tokens, merges, types):
    os.makedirs(d, exist_ok=True)
    vocab = {t: i for i, (t, ty) in enumerate(zip(tokens, types)) if ty == 1}  # the BPE's own pieces
    with open(os.path.join(d, "vocab.json"), "w", encoding="utf-8") as f:
        json.dump(vocab, f, ensure_ascii=False)
    with open(os.path.join(d, "merges.txt"), "w", encoding="utf-8") as f:
        f.write("#version: 0.2\n" + "\n".join(merges) + "\n")
    return os.path.join(d, "vocab.json"), max(vocab.values()) + 1  # ids up to the largest (control ids left out)


def bad_files(tool, tmp):
    cases = {
        "not an object": ('["a"]', "a b\n", "vocab.json"),
        "a string id": ('{"a": "0"}', "a b\n", "vocab.json"),
        "a negative id": ('{"a": -1}', "a b\n", "vocab.json"),
        "a merge of one piece": ('{"a": 0, "b": 1, "ab": 2}', "#version: 0.2\nab\n", "merges.txt"),
        "a merge of three pieces": ('{"a": 0, "b": 1, "ab": 2}', "a b c\n", "merges.txt"),
        "a merge of an unknown piece": ('{"a": 0, "b": 1, "ab": 2}', "a z\n", "vocab.json"),
        "no merges.txt": ('{"a": 0}', None, "merges.txt"),
    }
    for what, (vocab, merges, named) in cases.items():
        d = os.path.join(tmp, "bad-" + what.replace(" ", "_"))
        os.makedirs(d)
        path = os.path.join(d, "vocab.json")
        with open(path, "w") as f:
            f.write(vocab)
        if merges is not None:
            with open(os.path.join(d, "merges.txt"), "w") as f:
                f.write(merges)
        p = test_bpe.run_tool(tool, "load", path)
        msg = p.stdout.decode(errors="replace")
        test_bpe.check(p.returncode == 1 and named in msg, "%s: not refused naming %s: %s" % (what, named, msg.strip()))


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    tool = sys.argv[1]
    try:
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    except ImportError as e:
        print("SKIP: %s (pip install tokenizers)" % e)
        return 77
    if not os.path.exists(test_bpe.GGUF):
        print("SKIP: %s is missing (tools/fetch_smollm2.sh .cache/smollm2)" % test_bpe.GGUF)
        return 77
    tokens, merges, types = test_bpe.gguf_vocab(test_bpe.GGUF)
    with tempfile.TemporaryDirectory() as tmp:
        path, n_vocab = write_files(os.path.join(tmp, "gpt2"), tokens, merges, types)
        hf = Tokenizer(models.BPE.from_file(path, os.path.join(tmp, "gpt2", "merges.txt")))
        hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        hf.decoder = decoders.ByteLevel()
        p = test_bpe.run_tool(tool, "load", path)
        test_bpe.check(p.stdout.decode().startswith("OK vocab=%d " % n_vocab), "load: %s" % p.stdout.decode().strip())
        texts = [t for t in test_bpe.corpus([]) if "\ufffd" not in t]
        test_bpe.compare("vocab.json", tool, path, hf, texts, [], tmp)
        test_bpe.compare("directory", tool, os.path.dirname(path), hf, texts[:50], [], tmp)
        bad_files(tool, tmp)
    print("failures:", test_bpe.failures)
    return 0 if test_bpe.failures == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
