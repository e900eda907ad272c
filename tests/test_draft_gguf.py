#!/usr/bin/env python3
"""tools/draft_gguf.py (issue 29: a draft shardlm trained, written as a GGUF of blocks): SmolLM2's
f32 conversion (the smollm2 fixture, "rope_style": "pairs") cut to 2 layers by tools/make_draft.py,
then

1. written as an f32 GGUF: `shardlm generate` gives the same greedy tokens from the GGUF as from the
   checkpoint directory (tensor names, shapes, the rotary order of q and k, the config keys);
2. the same cut in the Hugging Face rotary layout (q and k rows of each head split in halves: the
   test's own inverse of the pairs order, checked first by shardlm reading that directory to the
   same tokens) written by the tool's permutation gives the same tokens again;
3. written as Q8_0: accepted by `shardlm generate` as the draft of SmolLM2's GGUF (the tokenizer
   keys copied byte for byte: the draft check compares them), which drafts with it.

  test_draft_gguf.py SHARDLM SMOLLM2_DIR SMOLLM2.gguf
SKIP (77) without the fixture, the GGUF, numpy or gguf.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

SKIP = 77
HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.dont_write_bytecode = True
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE / "server"))
from checks import Checks  # noqa: E402

check = Checks()
PROMPT = "The capital of France is"


def run(*args):
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=300)


def generate(shardlm, model, *extra):
    p = run(shardlm, "generate", "--model", model, "--prompt", PROMPT, "--max-tokens", "16", "--threads", "2",
            "--ignore-eos", *extra)
    if p.returncode:
        print(p.stderr[-1500:])
    return p.returncode, p.stdout, p.stderr


def to_halves(w, n_head):
    """The inverse of llama.cpp's permute: rows of each head from pairs back to the halves order."""
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def main():
    if len(sys.argv) != 4:
        print(__doc__)
        return 2
    shardlm, src, gguf_path = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
    if not (src / "config.json").exists() or not os.path.exists(gguf_path):
        print(f"SKIP: no SmolLM2 fixture at {src} or GGUF at {gguf_path}")
        return SKIP
    try:
        import numpy  # noqa: F401
        import gguf  # noqa: F401
    except ImportError:
        print("SKIP: no numpy or gguf")
        return SKIP
    sys.path.insert(0, str(ROOT / "tools"))
    from make_draft import write_safetensors  # noqa: E402
    from train_compare import read_safetensors  # noqa: E402
    tmp = Path(tempfile.mkdtemp(prefix="shardlm-draft-gguf-"))
    try:
        cut = tmp / "cut2"
        p = run(sys.executable, ROOT / "tools" / "make_draft.py", "--target", src, "--out", cut, "--n-layers", "2")
        check(p.returncode == 0, f"make_draft: 2 layers of SmolLM2 ({p.stdout.strip()[-120:]})")
        rc, want, _ = generate(shardlm, cut)
        check(rc == 0 and len(want) > len(PROMPT), f"the cut's own text: {want[len(PROMPT):]!r}")

        f32 = tmp / "cut2.f32.gguf"
        p = run(sys.executable, ROOT / "tools" / "draft_gguf.py", "--model", cut, "--like", gguf_path, "--out", f32,
                "--type", "f32")
        rc, got, _ = generate(shardlm, f32)
        check(p.returncode == 0 and rc == 0 and got == want,
              f"the f32 GGUF generates the same tokens ({got[len(PROMPT):]!r})")

        halves = tmp / "cut2-halves"
        halves.mkdir()
        cfg = json.loads((cut / "config.json").read_text())
        check(cfg.get("rope_style") == "pairs", "the fixture's conversion is in the pairs order")
        del cfg["rope_style"]
        (halves / "config.json").write_text(json.dumps(cfg))
        for f in cut.iterdir():
            if f.name not in ("config.json", "model.safetensors"):
                shutil.copy(f, halves / f.name)
        w = read_safetensors(str(cut / "model.safetensors"))
        for name in w:
            if name.endswith("q_proj.weight"):
                w[name] = to_halves(w[name], cfg["num_attention_heads"])
            elif name.endswith("k_proj.weight"):
                w[name] = to_halves(w[name], cfg["num_key_value_heads"])
        write_safetensors(str(halves / "model.safetensors"), w)
        rc, got, _ = generate(shardlm, halves)
        check(rc == 0 and got == want, "the halves layout read by shardlm gives the same tokens (the test's inverse)")
        f32h = tmp / "cut2-halves.f32.gguf"
        p = run(sys.executable, ROOT / "tools" / "draft_gguf.py", "--model", halves, "--like", gguf_path, "--out",
                f32h, "--type", "f32")
        rc, got, _ = generate(shardlm, f32h)
        check(p.returncode == 0 and rc == 0 and got == want,
              "written from the halves layout (the tool's permutation): the same tokens")

        q8 = tmp / "cut2.q8_0.gguf"
        p = run(sys.executable, ROOT / "tools" / "draft_gguf.py", "--model", cut, "--like", gguf_path, "--out", q8)
        rc, out, err = generate(shardlm, gguf_path, "--draft-model", q8, "--spec-draft", "3")
        check(p.returncode == 0 and rc == 0 and "drafts verified" in err,
              f"the Q8_0 GGUF accepted as SmolLM2's draft: {[x for x in err.splitlines() if 'drafts' in x][-1:]}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return check.summary()


if __name__ == "__main__":
    sys.exit(main())
