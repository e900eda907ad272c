#!/usr/bin/env python3
"""tests/server/test_models.py --shardlm BIN - several models in one server (`shardlm serve --model A
--model B`, issue 32): requests routed by the model they name.

The models: stories260K (converted from the assets) and a tiny random Llama written by
tools/make_random_model.py (a different vocabulary, width and weights: an answer from the wrong
model cannot match). The reference of each answer is what a server of that model alone gives for
the same request and seed. Checked:
- routing under concurrent load: 24 requests at once over both models and a random LoRA adapter
  of the second (its --lora after the second --model), completions (raw HTTP),
  chat (the official `openai` client) and gRPC Generate (its `adapter` field naming the model),
  each equal, token for token, to its model's single-model answer, and each HTTP answer names
  its model;
- a request naming no model goes to the first; /v1/models lists both, loaded, and the adapter
  with the second as parent;
- /v1/embeddings routed: each model's vector has its model's width;
- an unknown model: 404 (openai.NotFoundError) naming it and listing the served ones, and gRPC
  NOT_FOUND the same; the server keeps serving;
- refused at start, by name: two models with the same id, several models with --journal or
  --draft-model.
Prints SKIP (exit 77) without the stories260K assets, numpy, the openai package, grpcio or the
installed client. Loopback only; bounded waits.
"""
import concurrent.futures
import json
import struct
import subprocess
import sys
import urllib.request
from pathlib import Path

sys.dont_write_bytecode = True
HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(HERE))
import test_server as TS  # noqa: E402  (the server harness and shardlm_client; SKIPs without grpcio)
import stories_main as SM  # noqa: E402  (the mains on stories260K)

grpc = TS.grpc
check, expect_error, Failure = TS.check, TS.expect_error, TS.Failure
try:
    import numpy  # noqa: F401  (make_random_model.py needs it)
    import openai
except ImportError as e:
    print(f"SKIP: needs numpy and openai ({e})")
    sys.exit(TS.SKIP)

A, B, BL = "stories260K", "tiny-random", "tiny-lora"  # BL: an adapter of B
PROMPTS = ["Once upon a time", "The little dog", "Lily went", "A big"]
SAMPLING = dict(max_tokens=12, temperature=0.8, seed=11)


def post(base, path, body, timeout=60):
    return SM.post_json(base, path, body, timeout)


def get(base, path):
    with urllib.request.urlopen(base + path, timeout=30) as r:
        return json.loads(r.read())


def ask(srv, kind, model, i):
    """Request i of a kind against srv, naming model (None: no model field); what its answer is
    compared by: the text and the model the answer names."""
    prompt = PROMPTS[i % len(PROMPTS)]
    if kind == "completion":
        body = dict(prompt=prompt, **SAMPLING)
        if model:
            body["model"] = model
        code, o = post(srv.base, "/v1/completions", body)
        check(code == 200, f"completion for {model}: {code} {o}")
        return o["choices"][0]["text"], o["model"]
    if kind == "chat":
        oa = openai.OpenAI(base_url=srv.base + "/v1", api_key="none", max_retries=0, timeout=60)
        r = oa.chat.completions.create(model=model or "", messages=[{"role": "user", "content": prompt}], **SAMPLING)
        return r.choices[0].message.content, r.model
    with srv.client() as c:  # gRPC Generate: the adapter field names a model, or an adapter of one
        g = c.generate(prompt, adapter=model or "", **SAMPLING)
        return g.token_ids, model


def references(env, model_dir, names, *extra):
    """Each name's (kind, i) answers from a server of model_dir alone (extra: its flags)."""
    with TS.Server(env.shardlm, model_dir, *extra, http=True, name=f"single-{names[0]}") as srv:
        return {n: {(k, i): ask(srv, k, n, i)[0] for k in ("completion", "chat", "grpc") for i in range(len(PROMPTS))}
                for n in names}


def write_random_adapter(out, model_dir, rank=4, alpha=8, seed=3, modules=("q_proj", "v_proj"), scale=0.5):
    """A PEFT adapter (adapter_config.json, adapter_model.safetensors in F32) of `modules` (q_proj,
    k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj) of every layer of the Llama in model_dir,
    A and B both random (standard normal times scale, so that it moves the answers)."""
    c = json.loads((model_dir / "config.json").read_text())
    d, hd = c["hidden_size"], c.get("head_dim", c["hidden_size"] // c["num_attention_heads"])
    q, kv, ff = c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd, c["intermediate_size"]
    shapes = {"q_proj": ("self_attn", q, d), "k_proj": ("self_attn", kv, d), "v_proj": ("self_attn", kv, d),
              "o_proj": ("self_attn", d, q), "gate_proj": ("mlp", ff, d), "up_proj": ("mlp", ff, d),
              "down_proj": ("mlp", d, ff)}  # module: (block, out, in)
    rng = numpy.random.default_rng(seed)
    head, blobs, off = {}, [], 0
    for il in range(c["num_hidden_layers"]):
        for mod in modules:
            block, o, i = shapes[mod]
            for ab, shape in (("A", (rank, i)), ("B", (o, rank))):
                x = (rng.standard_normal(shape) * scale).astype("<f4")
                name = f"base_model.model.model.layers.{il}.{block}.{mod}.lora_{ab}.weight"
                head[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [off, off + x.nbytes]}
                blobs.append(x.tobytes())
                off += x.nbytes
    out.mkdir(parents=True)
    h = json.dumps(head).encode()
    h += b" " * (-len(h) % 8)
    (out / "adapter_model.safetensors").write_bytes(struct.pack("<Q", len(h)) + h + b"".join(blobs))
    (out / "adapter_config.json").write_text(json.dumps(
        {"peft_type": "LORA", "r": rank, "lora_alpha": alpha, "target_modules": list(modules)}))


def expect_refused(env, args, words, name):
    SM.expect_refused(env.shardlm, args, words, name)


def body(work, env):
    a_dir, b_dir = work / A, work / B
    TS.convert_stories260k(env.shardlm, env.src, a_dir)
    subprocess.run([sys.executable, str(ROOT / "tools/make_random_model.py"), "--out", str(b_dir), "--preset", "tiny",
                    "--dtype", "f32", "--seed", "5"], check=True, capture_output=True, timeout=120)
    write_random_adapter(work / "blora", b_dir)
    lora = ["--lora", f"{BL}={work / 'blora'}"]
    ref = {**references(env, a_dir, [A]), **references(env, b_dir, [B, BL], *lora)}
    check(ref[A][("completion", 0)] != ref[B][("completion", 0)], "the two models answer differently")
    check(ref[B] != ref[BL], "the adapter moves the second model's answers")

    with TS.Server(env.shardlm, a_dir, "--model", str(b_dir), *lora, http=True, name="multi") as srv:
        listed = get(srv.base, "/v1/models")["data"]
        ids = [(m["id"], m["parent"]) for m in listed]
        check(ids == [(A, None), (B, None), (BL, B)], f"/v1/models: both models, the adapter under the second: {ids}")
        check(all(m["loaded"] for m in listed), f"all loaded: {listed}")

        jobs = [(k, [A, B, BL][(i + j) % 3], i) for j, k in enumerate(("completion", "chat", "grpc")) for i in
                range(len(PROMPTS))] * 2
        with concurrent.futures.ThreadPoolExecutor(12) as pool:
            futs = [(k, m, i, pool.submit(ask, srv, k, m, i)) for k, m, i in jobs]
            for k, m, i, f in futs:
                got, named = f.result(timeout=120)
                check(got == ref[m][(k, i)], f"{k} {i} for {m}: {got!r}, alone it answers {ref[m][(k, i)]!r}")
                check(named == m, f"{k} {i}: the answer names {named}, not {m}")
        # No model named: the first.
        got, named = ask(srv, "completion", None, 0)
        check(got == ref[A][("completion", 0)] and named == A, f"no model: the first answers ({named})")

        # Embeddings: each model's width.
        widths = {}
        for m in (A, B):
            code, o = post(srv.base, "/v1/embeddings", {"model": m, "input": "Once upon a time"})
            check(code == 200 and o["model"] == m, f"embeddings for {m}: {code} {o}")
            widths[m] = len(o["data"][0]["embedding"])
        check(widths == {A: 64, B: 128}, f"embedding widths by model: {widths}")

        # An unknown model: 404 naming it and the served ones; both fronts.
        oa = openai.OpenAI(base_url=srv.base + "/v1", api_key="none", max_retries=0, timeout=60)
        try:
            oa.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "Hi"}], max_tokens=2)
            raise Failure("an unknown model was answered")
        except openai.NotFoundError as e:
            msg = str(e)
            check("no-such-model" in msg and A in msg and B in msg, f"the 404 names the model and the served: {msg}")
        code, o = post(srv.base, "/v1/embeddings", {"model": "nope", "input": "x"})
        check(code == 404 and A in json.dumps(o), f"embeddings, unknown model: {code} {o}")
        with srv.client() as c:
            expect_error(lambda: c.generate("Once", adapter="no-such-model", max_tokens=2), grpc.StatusCode.NOT_FOUND,
                         "no-such-model")
        got, _ = ask(srv, "completion", B, 1)
        check(got == ref[B][("completion", 1)], "still serving after the refusals")

    # Refused at start, by name.
    expect_refused(env, ["--model", str(a_dir), "--model", str(a_dir)], ["same id", A], "the same model twice")
    expect_refused(env, ["--model", str(a_dir), "--model", str(b_dir), "--http", "127.0.0.1:0", "--journal",
                         str(work / "j")], ["--journal", "several --model"], "a journal")
    expect_refused(env, ["--model", str(a_dir), "--model", str(b_dir), "--draft-model", str(a_dir)],
                   ["--draft-model", "several --model"], "a draft model")


def main():
    return SM.stories_main("models", "shardlm-models-", body)


if __name__ == "__main__":
    sys.exit(main())
