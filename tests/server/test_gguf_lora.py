#!/usr/bin/env python3
"""tests/server/test_gguf_lora.py --shardlm BIN --fixtures DIR - a GGUF file served as it is (its
matrices kept as quantized blocks) with a LoRA adapter applied unmerged, and the server's default
adapter (`shardlm serve --default-adapter NAME`, what `make run` serves).

The model is tiny_gemma3.gguf (Q8_0 matrices, written by tests/gguf_setup.py: fixture gguf); the
adapter is a random PEFT adapter (rank 4, every projection) written here. Checked:
- the independent expectation: tests/reference/gemma3_ref.py (float64 NumPy over gguf-py's
  dequantization) with the adapter merged in float64 (W + alpha/r B A). The server's
  log-probabilities of a teacher-forced prompt (prompt_logprobs, the prompt token's and the top
  alternatives') must be within LOGPROB_TOL of it: the base product multiplies int8-rounded
  activations with the blocks (PROMPT's 16 rows are below the 32 from which prefill dequantizes
  tiles for sgemm instead; test_gguf_serve measures up to 0.15 on this model's logits and allows
  0.3), the adapter's product is f32. Measured here: 0.077 with the adapter, 0.083
  without. The adapter must move the reference by more than 4 x LOGPROB_TOL somewhere (it moves
  it by 3.4), so that a server that ignored it fails;
- the same through shardlm's own f32 path: `convert gguf` + `merge-lora`, served without
  adapters, within LOGPROB_TOL of the GGUF + unmerged adapter, and within F32_TOL of the reference;
- 6 greedy requests with the adapter at once equal the lone one bit for bit (ids and
  log-probabilities: the adapter's products row by row, whatever the step holds);
- --default-adapter: a request naming no adapter (gRPC adapter "", HTTP without `model`) gets
  exactly the ids and log-probabilities of one naming it; the served model's id reaches the base
  (gRPC adapter, HTTP model), which matches the reference without the adapter; GetModelInfo gives
  model_id and default_adapter; HTTP responses name the model that answered; the default adapter
  cannot be unloaded (FAILED_PRECONDITION), another can; an unknown name stays NOT_FOUND;
- the C client: `shardlm complete` without --adapter = --adapter chat, and --adapter MODEL_ID
  answers otherwise; `shardlm stats` names the model id and the default;
- a --default-adapter naming no --lora adapter (or with none) stops the server at start with a
  message.
With --gemma GGUF DIR ADAPTER instead (ctest golden_gemma3_chat_gguf, fixture gemma): what
`make run` serves, Gemma 3 270M Q4_K_M as blocks with the committed chat adapter unmerged as the
default and `--chat-template gemma`, against DIR (the f32 conversion of that file) with the same
adapter unmerged (the f32 path that server_lora proves equal to merge-lora) and the same
template: Chat renders the same prompt ids through the GGUF's tokenizer as through
tokenizer.model; teacher-forced over that prompt and the f32 path's greedy reply (one prefill of
40 rows: dequantized tiles and sgemm, SHARDLM_CPU_AMX=0), every log-probability (the token's and
the top 5) is within GEMMA_TOL_SGEMM; within GEMMA_TOL_AMX as served by default (on a CPU with
AMX the tiles round x and w to bf16; elsewhere the sgemm path again), and within GEMMA_TOL_INT8
when the server prefills in chunks of 16 rows with AMX off (decode's int8 products), while the
base (named by the model id) is moved by more than 2 x GEMMA_TOL_INT8 somewhere: the adapter is
applied.
Prints SKIP (exit 77) without the fixture (or the Gemma file), numpy / gguf-py (the
reference), grpcio or the installed client. Loopback only; bounded waits.
"""
import argparse
import json
import os
import struct
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

sys.dont_write_bytecode = True
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "reference"))
import test_server as TS  # noqa: E402  (the server harness and shardlm_client; SKIPs without grpcio)

grpc = TS.grpc
check, expect_error, Failure = TS.check, TS.expect_error, TS.Failure
try:
    import numpy as np
    import gemma3_ref as REF  # exits (not ImportError) without gguf-py
except (ImportError, SystemExit) as e:
    print(f"SKIP: the float64 reference needs numpy and gguf-py ({e})")
    sys.exit(TS.SKIP)

LOGPROB_TOL = 0.3    # GGUF blocks (int8 activations) against float64
F32_TOL = 2e-3       # shardlm's f32 path against float64
PROMPT = [2, 278, 271, 272, 277, 269, 5, 100, 273, 274, 30, 276, 60, 271, 2, 99]  # ids < vocab 279
GREEDY = dict(max_tokens=12, temperature=0, logprobs=0)
MODULES = {"self_attn.q_proj": ("nh_hd", "d"), "self_attn.k_proj": ("hd", "d"), "self_attn.v_proj": ("hd", "d"),
           "self_attn.o_proj": ("d", "nh_hd"), "mlp.gate_proj": ("ff", "d"), "mlp.up_proj": ("ff", "d"),
           "mlp.down_proj": ("d", "ff")}


def write_random_adapter(out, model, rank, alpha, seed):
    """A PEFT adapter (adapter_config.json, adapter_model.safetensors in F32) for every projection of
    every layer of the reference model, A and B both random (a trained adapter's B is not zero)."""
    c = model.config
    dims = {"d": c["n_embd"], "hd": c["head_dim"], "nh_hd": c["n_head"] * c["head_dim"], "ff": c["n_ff"]}
    rng = np.random.default_rng(seed)
    head, blobs, off = {}, [], 0
    for il in range(c["n_layer"]):
        for mod, (o, i) in MODULES.items():
            for ab, shape in (("A", (rank, dims[i])), ("B", (dims[o], rank))):
                x = (rng.standard_normal(shape) * 0.3).astype("<f4")
                name = f"base_model.model.model.layers.{il}.{mod}.lora_{ab}.weight"
                head[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [off, off + x.nbytes]}
                blobs.append(x.tobytes())
                off += x.nbytes
    out.mkdir(parents=True)
    h = json.dumps(head).encode()
    h += b" " * (-len(h) % 8)
    (out / "adapter_model.safetensors").write_bytes(struct.pack("<Q", len(h)) + h + b"".join(blobs))
    (out / "adapter_config.json").write_text(json.dumps(
        {"peft_type": "LORA", "r": rank, "lora_alpha": alpha, "target_modules": [m.split(".")[1] for m in MODULES]}))


def ref_logprobs(model, ids):
    """log_softmax of the reference logits, (T, vocab)."""
    z = REF.forward(ids, model=model)
    z = z - z.max(axis=1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=1, keepdims=True))


def scored(c, **kw):
    """The server's prompt log-probabilities of PROMPT: [(token, lp, [(alt, lp)...])] for positions 1.."""
    g = c.generate(prompt_token_ids=PROMPT, max_tokens=0, prompt_logprobs=5, **kw)
    lps = g.prompt_logprobs[1:]
    check(len(lps) == len(PROMPT) - 1, f"{len(lps)} prompt log-probabilities for {len(PROMPT)} tokens")
    return [(e.token_id, e.logprob, [(t.token_id, t.logprob) for t in e.top]) for e in lps]


def worst_vs(got, want):
    """Largest |difference| over every log-probability `got` reports, against rows of `want`
    ((T, vocab) log-probabilities, row i predicting PROMPT[i + 1])."""
    worst = 0.0
    for i, (tok, lp, top) in enumerate(got):
        check(tok == PROMPT[i + 1], f"prompt log-probability {i + 1} is of token {tok}, not {PROMPT[i + 1]}")
        for t, v in [(tok, lp), *top]:
            worst = max(worst, abs(v - want[i, t]))
    return worst


def worst_between(a, b):
    return max(abs(x[1] - y[1]) for x, y in zip(a, b))


def greedy(c, **kw):
    g = c.generate(prompt_token_ids=PROMPT[:6], **GREEDY, **kw)
    return list(g.token_ids), [e.logprob for e in g.logprobs]


def http(base, path, body=None):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(base + path, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        return json.loads(resp.read())


def run(shardlm, fixtures, work):
    gguf = fixtures / "tiny_gemma3.gguf"
    model_id = gguf.name
    base = REF.load_model(str(gguf))
    adapter = work / "chat"
    write_random_adapter(adapter, base, rank=4, alpha=8, seed=7)
    other = work / "other"
    write_random_adapter(other, base, rank=2, alpha=2, seed=8)
    want_base = ref_logprobs(base, PROMPT)[:-1]
    want_chat = ref_logprobs(REF.with_lora(base, str(adapter)), PROMPT)[:-1]
    rows = np.arange(len(PROMPT) - 1)
    moved = float(np.max(np.abs(want_chat[rows, PROMPT[1:]] - want_base[rows, PROMPT[1:]])))
    check(moved > 4 * LOGPROB_TOL, f"the adapter moves the reference's log-probabilities by only {moved:.3f}: "
          f"too little to tell it from the tolerance {LOGPROB_TOL}")

    flags = ["--lora", f"chat={adapter}", "--lora", f"other={other}", "--default-adapter", "chat"]
    with TS.Server(shardlm, gguf, *flags, name="gguf-lora", http=True) as s, s.client(timeout=60) as c:
        info = c.model_info()
        check(info.model_id == model_id and info.default_adapter == "chat" and list(info.adapters) == ["chat", "other"],
              f"GetModelInfo: model_id {info.model_id!r}, default_adapter {info.default_adapter!r}, "
              f"adapters {list(info.adapters)}")
        got_default, got_chat = scored(c), scored(c, adapter="chat")
        got_base = scored(c, adapter=model_id)
        w_chat, w_base = worst_vs(got_chat, want_chat), worst_vs(got_base, want_base)
        print(f"GGUF + unmerged adapter vs float64 reference: max |diff| {w_chat:.4f}; base {w_base:.4f} "
              f"(tolerance {LOGPROB_TOL}; the adapter moves the reference by up to {moved:.2f})")
        check(w_chat <= LOGPROB_TOL, f"GGUF + adapter vs the reference: max |diff| {w_chat:.4f} > {LOGPROB_TOL}")
        check(w_base <= LOGPROB_TOL, f"GGUF base (adapter = model id) vs the reference: {w_base:.4f} > {LOGPROB_TOL}")
        check(got_default == got_chat, "a request naming no adapter differs from one naming the default 'chat'")
        check(worst_between(got_base, got_chat) > 2 * LOGPROB_TOL, "the base (named by the model id) answers like 'chat'")
        g_default, g_chat, g_base = greedy(c), greedy(c, adapter="chat"), greedy(c, adapter=model_id)
        check(g_default == g_chat, f"greedy: no adapter {g_default[0]} vs 'chat' {g_chat[0]}")
        check(g_base[1] != g_chat[1], "greedy: the base's log-probabilities equal the default adapter's")
        # The adapter's rows do not depend on the step around them: 6 requests at once (decode
        # steps of several rows through the adapter's products) give the lone request's ids and
        # log-probabilities bit for bit (the adapter's f32 products row by row, lora_apply).
        together = []

        def one(i):
            with s.client(timeout=60) as cc:
                together.append(greedy(cc, adapter="chat", seed=i))
        workers = [threading.Thread(target=one, args=(i,)) for i in range(6)]
        for t in workers:
            t.start()
        for t in workers:
            t.join(timeout=120)
        same = sum(x == g_chat for x in together)
        check(len(together) == 6 and same == 6, f"greedy with the adapter, 6 requests at once: {same} of "
              f"{len(together)} equal the lone request bit for bit (ids and log-probabilities)")
        # HTTP: no model = the default adapter; the model's id = the base; responses name who answered.
        req = dict(prompt=PROMPT[:6], max_tokens=12, temperature=0, logprobs=0)
        for model, want, name in [(None, g_chat, "chat"), ("chat", g_chat, "chat"), (model_id, g_base, model_id)]:
            r = http(s.base, "/v1/completions", dict(req, **({"model": model} if model else {})))
            lps = r["choices"][0]["logprobs"]["token_logprobs"]
            check(r["model"] == name, f"HTTP model {model!r}: the response names {r['model']!r}, not {name!r}")
            check(len(lps) == len(want[1]) and max(abs(a - b) for a, b in zip(lps, want[1])) < 1e-5,
                  f"HTTP model {model!r}: log-probabilities {lps[:3]} differ from gRPC's {want[1][:3]}")
        # The C client (`shardlm complete --adapter`, `shardlm stats`) says the same.
        def complete(*extra):
            r = subprocess.run([shardlm, "complete", "--server", s.target, "--prompt", "hello world", "--max-tokens",
                                "6", "--logprobs", "3", *extra], capture_output=True, text=True, timeout=60)
            check(r.returncode == 0, f"shardlm complete {extra}: exit {r.returncode}, {r.stderr[-300:]!r}")
            return r.stdout
        out_default, out_chat, out_base = complete(), complete("--adapter", "chat"), complete("--adapter", model_id)
        check(out_default == out_chat and out_base != out_chat,
              f"shardlm complete: default {out_default!r}, chat {out_chat!r}, base {out_base!r}")
        r = subprocess.run([shardlm, "stats", "--server", s.target], capture_output=True, text=True, timeout=60)
        check(f"id: {model_id}; adapters: 2 loaded: chat, other; default: chat" in r.stdout,
              f"shardlm stats: {r.stdout!r}")
        ids = [m["id"] for m in http(s.base, "/v1/models")["data"]]
        check(ids == [model_id, "chat", "other"], f"/v1/models lists {ids}")
        expect_error(lambda: c.generate(prompt_token_ids=PROMPT[:4], adapter="nope", max_tokens=2),
                     grpc.StatusCode.NOT_FOUND, "'nope'")
        expect_error(lambda: c.unload_adapter("chat"), grpc.StatusCode.FAILED_PRECONDITION, "default adapter")
        c.unload_adapter("other")
        check(list(c.model_info().adapters) == ["chat"], f"after unloading other: {list(c.model_info().adapters)}")
        check(greedy(c) == g_chat, "the default adapter changed after another was unloaded")

    # shardlm's f32 path: the GGUF converted, the adapter merged, served without adapters.
    f32, merged = work / "f32", work / "merged"
    subprocess.run([shardlm, "convert", "gguf", "--gguf", str(gguf), "--out", str(f32)], check=True,
                   capture_output=True, timeout=120)
    subprocess.run([shardlm, "merge-lora", "--model", str(f32), "--adapter", str(adapter), "--out", str(merged)],
                   check=True, capture_output=True, timeout=120)
    with TS.Server(shardlm, merged, name="merged") as s, s.client(timeout=60) as c:
        got_merged = scored(c)
    w_ref, w_gguf = worst_vs(got_merged, want_chat), worst_between(got_merged, got_chat)
    print(f"merged f32 vs reference: max |diff| {w_ref:.2e} (tolerance {F32_TOL}); vs GGUF + adapter {w_gguf:.4f}")
    check(w_ref <= F32_TOL, f"merged f32 vs the reference: max |diff| {w_ref:.2e} > {F32_TOL}")
    check(w_gguf <= LOGPROB_TOL, f"merged f32 vs GGUF + unmerged adapter: max |diff| {w_gguf:.4f} > {LOGPROB_TOL}")

    # A default that names no loaded adapter stops the server at start.
    for extra, needle in [(["--lora", f"chat={adapter}", "--default-adapter", "nope"], "--default-adapter 'nope'"),
                          (["--default-adapter", "chat"], "there is none")]:
        r = subprocess.run([shardlm, "serve", "--model", str(gguf), "--listen", "127.0.0.1:0", *extra],
                           capture_output=True, text=True, timeout=60)
        check(r.returncode == 1 and needle in r.stderr and "INVALID_ARGUMENT" in r.stderr,
              f"{extra}: exit {r.returncode}, stderr {r.stderr[-300:]!r}")


# Gemma 3 270M, make run's configuration against the f32 conversion. The GGUF's products use int8
# activations below 32 rows of x (decode; kernels/cpu/matmul.c) and dequantized tiles with sgemm
# from 32 rows on. Int8: test_model gemma-gguf allows 2.0 between the two paths' logits; a
# log-probability is a logit minus the log-sum-exp. Sgemm on the dequantized blocks computes what
# the f32 conversion computes, up to the order of the sums.
GEMMA_TOL_INT8 = 2.0
GEMMA_TOL_SGEMM = 0.01
GEMMA_TOL_AMX = 0.5  # seen 0.17 (2026-11-25)
GEMMA_CHAT = [("user", "What is the capital of France?")]


def worst_lp(got_lp, want_lp):
    """Largest |difference| over the tokens' log-probabilities and the top alternatives both give."""
    worst = 0.0
    for g, w in zip(got_lp[1:], want_lp[1:]):
        alts = {t.token_id: t.logprob for t in w.top}
        worst = max(worst, abs(g.logprob - w.logprob))
        for t in g.top:
            if t.token_id in alts:
                worst = max(worst, abs(t.logprob - alts[t.token_id]))
    return worst


def run_gemma(shardlm, gguf, f32, adapter):
    """make run's configuration against the f32 conversion with the same adapter, unmerged."""
    flags = ["--lora", f"chat={adapter}", "--default-adapter", "chat", "--chat-template", "gemma"]
    with TS.Server(shardlm, f32, *flags, name="gemma-f32") as s, s.client(timeout=300) as c:
        want = c.chat(GEMMA_CHAT, max_tokens=24, temperature=0, prompt_logprobs=0)
        prompt = [e.token_id for e in want.prompt_logprobs]
        ids = prompt + list(want.token_ids)
        want_lp = c.generate(prompt_token_ids=ids, max_tokens=0, prompt_logprobs=5).prompt_logprobs
    check(len(ids) >= 32, f"{len(ids)} tokens: too few for the sgemm path")
    # As make run serves it (the teacher-forced ids are one prefill of >= 32 rows: AMX tiles where
    # the CPU has them, else sgemm), with AMX off (sgemm), then with prefill chunks of 16 rows
    # and AMX off, which go through decode's int8 products.
    worst = {}
    no_amx = dict(os.environ, SHARDLM_CPU_AMX="0")
    for name, extra, env in (("default", [], None), ("sgemm", [], no_amx),
                             ("int8", ["--max-batch-tokens", "16", "--max-seqs", "4"], no_amx)):
        with TS.Server(shardlm, gguf, *flags, *extra, name=f"gemma-gguf-{name}", env=env) as s, \
                s.client(timeout=300) as c:
            info = c.model_info()
            check(info.chat_template == "gemma" and info.default_adapter == "chat", f"GetModelInfo: {info}")
            got = c.chat(GEMMA_CHAT, max_tokens=24, temperature=0, prompt_logprobs=0)
            check([e.token_id for e in got.prompt_logprobs] == prompt,
                  "Chat with the gemma template: the GGUF's tokenizer renders other prompt ids than tokenizer.model")
            worst[name] = worst_lp(c.generate(prompt_token_ids=ids, max_tokens=0, prompt_logprobs=5).prompt_logprobs,
                                   want_lp)
            if name == "int8":
                base_lp = c.generate(prompt_token_ids=ids, max_tokens=0, prompt_logprobs=0,
                                     adapter=gguf.name).prompt_logprobs
    moved = max(abs(b.logprob - w.logprob) for b, w in zip(base_lp[1:], want_lp[1:]))
    print(f"Gemma 3 270M: GGUF + adapter vs f32 + adapter over {len(ids)} tokens: max |diff| {worst['sgemm']:.2e} "
          f"in one prefill without AMX (tolerance {GEMMA_TOL_SGEMM}), {worst['default']:.2e} as served by default "
          f"(tolerance {GEMMA_TOL_AMX}), {worst['int8']:.3f} in chunks of 16 (tolerance "
          f"{GEMMA_TOL_INT8}); the base differs by up to {moved:.2f}; greedy replies {got.text!r} / {want.text!r}")
    check(worst["sgemm"] <= GEMMA_TOL_SGEMM, f"one prefill: max |diff| {worst['sgemm']:.2e} > {GEMMA_TOL_SGEMM}")
    check(worst["default"] <= GEMMA_TOL_AMX, f"one prefill as served: max |diff| {worst['default']:.2e} > {GEMMA_TOL_AMX}")
    check(worst["int8"] <= GEMMA_TOL_INT8, f"chunks of 16: max |diff| {worst['int8']:.3f} > {GEMMA_TOL_INT8}")
    check(moved > 2 * GEMMA_TOL_INT8, f"the base differs from the adapter by only {moved:.2f}: is the adapter applied?")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shardlm", required=True)
    ap.add_argument("--fixtures", help="tests/gguf_setup.py's output directory")
    ap.add_argument("--gemma", nargs=3, metavar=("GGUF", "F32_DIR", "ADAPTER"),
                    help="the real model instead: the GGUF, its f32 conversion and a PEFT adapter")
    args = ap.parse_args()
    if args.gemma:
        gguf, f32, adapter = (Path(p) for p in args.gemma)
        if not gguf.exists() or not (f32 / "model.safetensors").exists():
            print(f"SKIP: no {gguf} or no conversion in {f32} (the model is fetched by make run)")
            return TS.SKIP
    elif not args.fixtures or not (Path(args.fixtures) / "tiny_gemma3.gguf").exists():
        print(f"SKIP: tiny_gemma3.gguf not found in {args.fixtures} (tests/gguf_setup.py needs pip install gguf numpy)")
        return TS.SKIP
    if args.gemma:
        return TS.run_test("gguf lora", "shardlm-ggufloratest-", lambda work: run_gemma(args.shardlm, gguf, f32, adapter))
    return TS.run_test("gguf lora", "shardlm-ggufloratest-", lambda work: run(args.shardlm, Path(args.fixtures), work))

if __name__ == "__main__":
    sys.exit(main())
