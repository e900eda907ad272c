#!/usr/bin/env python3
"""EAGLE heads beside targets whose layers are not Llama-style (issue 29; docs/speculative.md "EAGLE
heads"): the golden random Gemma 2 and Qwen 2 MoE, each with stories260K's tokenizer. The head's own
layer is Llama-style whatever the target's are (RMS norms, SwiGLU, full causal attention, rotary at
the target's base, no biases, a dense MLP of the head file's own size); it borrows the target's
embeddings (times Gemma's sqrt(d), as the target's first layer reads them), its LM head (logits
soft-capped as the target's are) and its final hidden states. Gemma 2: Gemma's norms x (1 + w),
sandwich norms, GeGLU, every other layer windowed to 5 tokens, attention and final soft-capping
(tests/reference/families.py). Qwen 2 MoE: top-2 of 4 routed experts and a gated shared expert,
q/k/v biases (tests/reference/make_models.py); its head's MLP has 96 rows, a size the target's
config names nowhere. Each head is written as in test_speculative_eagle.py (random, its fc fitted to
the target's own greedy text so that drafts are accepted and rejected).

1. Every proposal (SHARDLM_EAGLE_TRACE) against a float64 NumPy reference: the target's features
   from families.gemma2_forward or make_models.llama_forward (written from transformers' modeling
   files, never from shardlm), the head as test_speculative_eagle.Reference computes it: the same
   best token, its logit within a relative 1e-5; one rank, and tp 2 under mpirun (the head borrows a
   whole copy of the checkpoint's ends there; the MoE's experts are split over the two ranks). A
   head that inherited the target's layer kind (GeGLU, windows, soft-capped scores, experts,
   biases), read the embeddings unscaled or skipped the final soft-cap would fail it.
2. Greedy tokens of 8 prompts, one at a time and 8 at once, equal to the server without
   speculation; drafts verified, some accepted, some rejected.
3. Gemma 2 with prompt lookup first (--spec-ngram 2 beside the head): some drafts from lookup, the
   rest from the head, whose proposals after lookup's steps (its rows caught up over the tokens
   taken meanwhile) still equal the reference; greedy tokens unchanged.

  test_speculative_eagle_targets.py --shardlm BUILD/cli/shardlm --golden BUILD/golden
SKIP (77) without the golden models, numpy or the Python client (and the tp 2 cases without mpirun).
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
from test_speculative_eagle import PROMPTS, Reference, check_trace, fitted_head, greedy  # noqa: E402

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


class MoeReference(Reference):
    """Reference with a mixture-of-experts target (Qwen 2 MoE): its features from
    make_models.llama_forward (routed experts, the gated shared expert, q/k/v biases)."""

    def features(self, ids):
        import make_models
        return make_models.llama_forward(self.cfg, self.w, list(ids), hidden=True)


def target_dir(gold, tmp, name):
    """A copy of the golden model `name` with stories260K's tokenizer beside it."""
    model = tmp / name
    shutil.copytree(gold / name, model)
    shutil.copy(gold / "stories260K" / "tokenizer.model", model)
    return model


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shardlm", required=True)
    ap.add_argument("--golden", required=True, help="the golden models' directory (gemma2, qwen2_moe, stories260K)")
    a = ap.parse_args()
    gold = Path(a.golden)
    need = [gold / m / "model.safetensors" for m in ("gemma2", "qwen2_moe")] + [gold / "stories260K" / "tokenizer.model"]
    if not all(p.is_file() for p in need):
        print(f"SKIP: no golden gemma2, qwen2_moe or stories260K under {gold}")
        return SKIP
    try:
        import numpy as np
    except ImportError:
        print("SKIP: no numpy")
        return SKIP
    tmp = Path(tempfile.mkdtemp(prefix="shardlm-eagle-targets-"))
    mpi = ("mpirun", "--oversubscribe", "-n", "2") if shutil.which("mpirun") else None
    if not mpi:
        print("SKIP: the tp 2 cases (no mpirun)")
    runs = []
    for label, ref_cls, arch in (("Gemma 2", GemmaReference, "Gemma2ForCausalLM"),
                                 ("Qwen 2 MoE", MoeReference, "Qwen2MoeForCausalLM")):
        model = target_dir(gold, tmp, "gemma2" if ref_cls is GemmaReference else "qwen2_moe")
        cfg = json.loads((model / "config.json").read_text())
        if ref_cls is GemmaReference:
            assert cfg["model_type"] == "gemma2" and cfg["sliding_window"] < 40 and cfg["attn_logit_softcapping"]
            head_cfg = cfg
        else:
            assert cfg["model_type"] == "qwen2_moe" and cfg["num_experts"] > cfg["num_experts_per_tok"] > 1
            head_cfg = dict(cfg, intermediate_size=96)  # the head's own MLP size
        (tmp / label).mkdir()
        base, head, ref = fitted_head(np, a.shardlm, model, tmp / label, ref_cls, head_cfg, name="eagle-targets-off")
        eagle = ["--speculative", "eagle", "--draft-model", str(head), "--spec-draft", "3", "--spec-max-batch", "64",
                 "--max-seqs", "64", "--no-prefix-caching"]
        cases = [("one rank", [], None)]
        if ref_cls is GemmaReference:
            cases.append(("one rank, prompt lookup first", ["--spec-ngram", "2"], None))
        if mpi:
            cases.append(("tp 2", ["--tp", "2"], mpi))
        try:
            for k, (name, layout, launcher) in enumerate(cases):
                trace = tmp / label / f"trace{k}.txt"
                env = dict(os.environ, SHARDLM_SPEC_PRIOR="0", SHARDLM_EAGLE_TRACE=str(trace))
                with TS.Server(a.shardlm, model, *layout, *eagle, name=f"eagle-targets{k}", env=env,
                               **({"launcher": launcher} if launcher else {})) as srv:
                    got = (greedy(srv, 1), greedy(srv, 8))
                    with srv.client(timeout=60) as c:
                        st = c.server_stats()
                    log = srv.log_path.read_text()
                runs.append((f"{label}, {name}", arch, base, ref, got, st, trace, log))
        finally:
            TS.kill_all()
    for name, arch, base, ref, got, st, trace, log in runs:
        check("EAGLE head" in log and arch in log, f"{name}: the server loaded the head beside {arch}")
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
        check_trace(check, ref, name, trace)
    return check.summary()


if __name__ == "__main__":
    sys.exit(main())
