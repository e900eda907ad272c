#!/usr/bin/env python3
"""An EAGLE head beside a target whose layers are not Llama-style (issue 29; docs/speculative.md
"EAGLE heads"). The head's own layer is Llama-style whatever the target's are (RMS norms, SwiGLU,
full causal attention, rotary at the target's base); it borrows the target's embeddings (times
Gemma's sqrt(d), as the target's first layer reads them), its LM head (logits soft-capped as the
target's are) and its final hidden states. Target: the golden random Gemma 2 (Gemma's norms x (1 +
w), QK-less sandwich norms, GeGLU, every other layer windowed to 5 tokens, attention and final
soft-capping; tests/reference/families.py) with stories260K's tokenizer. The head is written as in
test_speculative_eagle.py (random, its fc fitted to the target's own greedy text so that drafts are
accepted and rejected).

1. Every proposal (SHARDLM_EAGLE_TRACE) against a float64 NumPy reference: the target's features
   from families.gemma2_forward (written from transformers' modeling_gemma2, never from shardlm),
   the head as test_speculative_eagle.Reference computes it: the same best token, its logit within
   a relative 1e-5; one rank, and tp 2 under mpirun (the head borrows a whole copy of the
   checkpoint's ends there). A head that inherited the target's layer kind (its GeGLU, windows,
   soft-capped scores), read the embeddings unscaled or skipped the final soft-cap would fail it.
2. Greedy tokens of 8 prompts, one at a time and 8 at once, equal to the server without
   speculation; drafts verified, some accepted, some rejected.
3. With prompt lookup first (--spec-ngram 2 beside the head): some drafts from lookup, the rest
   from the head, whose proposals after lookup's steps (its rows caught up over the tokens taken
   meanwhile) still equal the reference; greedy tokens unchanged.

  test_speculative_eagle_gemma.py --shardlm BUILD/cli/shardlm --golden BUILD/golden
SKIP (77) without the golden models, numpy or the Python client (and the tp 2 case without mpirun).
"""
import argparse
import json
import math
import os
import shutil
import sys
import tempfile
from pathlib import Path

SKIP = 77
sys.dont_write_bytecode = True
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parent / "reference"))
sys.path.insert(0, str(HERE.parents[1] / "tools"))
import test_server as TS  # noqa: E402
from checks import Checks  # noqa: E402
from test_speculative_eagle import PROMPTS, Reference, check_trace, fit_fc, greedy, make_head  # noqa: E402

check = Checks()


class GemmaReference(Reference):
    """Reference with a Gemma 2 target: its features from families.gemma2_forward, its embeddings
    scaled by sqrt(d), its logits soft-capped."""

    def __init__(self, np, model_dir, head):
        super().__init__(np, model_dir, head)
        self.escale = math.sqrt(self.cfg["hidden_size"])
        self.fcap = self.cfg.get("final_logit_softcapping") or 0.0

    def features(self, ids):
        import families
        return families.gemma2_forward(self.cfg, self.w, list(ids), hidden=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shardlm", required=True)
    ap.add_argument("--golden", required=True, help="the golden models' directory (gemma2, stories260K)")
    a = ap.parse_args()
    gold = Path(a.golden)
    if not (gold / "gemma2" / "model.safetensors").is_file() or not (gold / "stories260K" / "tokenizer.model").is_file():
        print(f"SKIP: no golden gemma2 or stories260K under {gold}")
        return SKIP
    try:
        import numpy as np
    except ImportError:
        print("SKIP: no numpy")
        return SKIP
    from make_draft import write_safetensors
    tmp = Path(tempfile.mkdtemp(prefix="shardlm-eagle-gemma-"))
    model = tmp / "gemma2"
    shutil.copytree(gold / "gemma2", model)
    shutil.copy(gold / "stories260K" / "tokenizer.model", model)
    cfg = json.loads((model / "config.json").read_text())
    assert cfg["model_type"] == "gemma2" and cfg["sliding_window"] < 40 and cfg["attn_logit_softcapping"]
    try:
        with TS.Server(a.shardlm, model, "--no-prefix-caching", name="eagle-gemma-off") as srv:
            base = (greedy(srv, 1), greedy(srv, 8))
    finally:
        TS.kill_all()
    head = fit_fc(np, GemmaReference(np, model, make_head(np, cfg)), make_head(np, cfg), [[1, *g] for g in base[0]])
    write_safetensors(tmp / "head.safetensors", head, {"rope_style": "halves", "format": "eagle-1"})
    ref = GemmaReference(np, model, head)
    eagle = ["--speculative", "eagle", "--draft-model", str(tmp / "head.safetensors"), "--spec-draft", "3",
             "--spec-max-batch", "64", "--max-seqs", "64", "--no-prefix-caching"]
    cases = [("one rank", [], None), ("one rank, prompt lookup first", ["--spec-ngram", "2"], None)]
    if shutil.which("mpirun"):
        cases.append(("tp 2", ["--tp", "2"], ("mpirun", "--oversubscribe", "-n", "2")))
    else:
        print("SKIP: tp 2 (no mpirun)")
    runs = []
    try:
        for k, (name, layout, launcher) in enumerate(cases):
            trace = tmp / f"trace{k}.txt"
            env = dict(os.environ, SHARDLM_SPEC_PRIOR="0", SHARDLM_EAGLE_TRACE=str(trace))
            with TS.Server(a.shardlm, model, *layout, *eagle, name=f"eagle-gemma{k}", env=env,
                           **({"launcher": launcher} if launcher else {})) as srv:
                got = (greedy(srv, 1), greedy(srv, 8))
                with srv.client(timeout=60) as c:
                    st = c.server_stats()
                log = srv.log_path.read_text()
            runs.append((name, got, st, trace, log))
    finally:
        TS.kill_all()
    for name, got, st, trace, log in runs:
        check("EAGLE head" in log and "Gemma2ForCausalLM" in log, f"{name}: the server loaded the head beside Gemma 2")
        same = sum(x == y for g, w in zip(got, base) for x, y in zip(g, w))
        check(got == base, f"{name}: greedy tokens equal to the server without speculation ({same} of "
              f"{2 * len(PROMPTS)})")
        check(st.spec_draft_tokens > 0 and 0 < st.spec_accepted_tokens < st.spec_draft_tokens,
              f"{name}: {st.spec_draft_tokens} drafts verified, {st.spec_accepted_tokens} accepted (some accepted, "
              "some rejected)")
        look = st.spec_lookup_draft_tokens
        if "lookup" in name:  # the head catches up over the tokens lookup's drafts gave: the trace shows it exact
            check(0 < look < st.spec_draft_tokens and 0 < st.spec_lookup_accepted_tokens <= look,
                  f"{name}: prompt lookup drafted {look} of the {st.spec_draft_tokens} drafts (some, not all), "
                  f"{st.spec_lookup_accepted_tokens} of them accepted")
        else:
            check(look == 0, f"{name}: no draft came from prompt lookup ({look})")
        check_trace(check, ref, f"Gemma 2, {name}", trace)
    return check.summary()


if __name__ == "__main__":
    sys.exit(main())
