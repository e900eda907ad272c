#!/usr/bin/env python3
"""tools/bench_hf_gpu.py - the transformers side of the CUDA decode comparison (a benchmark, never
a test; needs torch and transformers, which make test never has): greedy decode of a checkpoint
directory (tools/make_random_model.py writes one) at batch 1 and batch 64, bf16 on one GPU, with
a static KV cache and the decoding step compiled (torch.compile, as transformers does by itself
for a static cache on CUDA); prompts of --prompt random tokens, exactly --tokens new tokens
(min_new_tokens = max_new_tokens, so EOS cannot stop a sequence).

Per batch size: one warm-up generate (compilation, CUDA graph capture) is not counted; then
--reps generates, each timed per step by a streamer that notes the clock when each step's tokens
reach it (generate already waits for the GPU every step to test for the end, so this adds one
tiny copy). Reported from the best repetition: prefill (the prompt's forward and the first
token), decode step = (time of the last token - time of the first) / (tokens - 1), decode
tokens/s = batch / decode step, and end-to-end tokens/s = batch x tokens / the generate call.
The same figures bench_engine prints (ITL mean, "decode tokens/s").

If compiling fails (an exception at the warm-up), the run goes on without it (disable_compile),
and if the static cache fails too, with the default cache; the last "hf:" line and every RESULT
line say which (compile=0/1, static_cache=0/1).

usage: tools/bench_hf_gpu.py --model DIR [--batches 1,64] [--prompt 32] [--tokens 64] [--reps 3]
                             [--no-compile] [--seed 0]
Prints one human line per batch size and a RESULT line (key=value) for scripts.
"""
import argparse
import sys
import time


def parse_args(argv):
    ap = argparse.ArgumentParser(description="transformers greedy decode throughput on CUDA (static cache, compiled)")
    ap.add_argument("--model", required=True, help="Hugging Face checkpoint directory")
    ap.add_argument("--batches", default="1,64")
    ap.add_argument("--prompt", type=int, default=32, help="prompt tokens (random ids)")
    ap.add_argument("--tokens", type=int, default=64, help="new tokens per sequence")
    ap.add_argument("--reps", type=int, default=3, help="timed generates per batch size (best reported)")
    ap.add_argument("--no-compile", action="store_true", help="eager decoding steps (disable_compile)")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    a.batches = [int(b) for b in a.batches.split(",") if b.strip()]
    if a.prompt < 1 or a.tokens < 2 or a.reps < 1 or not a.batches or min(a.batches) < 1:
        ap.error("--prompt >= 1, --tokens >= 2, --reps >= 1 and batch sizes >= 1")
    return a


def log(msg):
    print(msg, flush=True)


def main(argv=None):
    a = parse_args(argv)
    t_start = time.perf_counter()
    import torch
    import transformers
    from transformers import AutoModelForCausalLM
    try:
        from transformers.generation.streamers import BaseStreamer
    except ImportError:  # generate only calls put() and end()
        BaseStreamer = object

    if not torch.cuda.is_available():
        log("bench_hf_gpu: no CUDA device")
        return 1
    dev = torch.device("cuda")

    class StepClock(BaseStreamer):
        """Notes the clock at each put: the prompt, then every generated step's tokens."""

        def __init__(self):
            self.times = []

        def put(self, value):
            self.times.append(time.perf_counter())

        def end(self):
            pass

    t0 = time.perf_counter()
    try:  # transformers >= 4.56 / 5.x name it dtype; older releases torch_dtype
        model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.bfloat16)
    except TypeError:
        model = AutoModelForCausalLM.from_pretrained(a.model, torch_dtype=torch.bfloat16)
    model.to(dev).eval()
    torch.cuda.synchronize()
    cfg = model.config
    n_params = sum(p.numel() for p in model.parameters())
    log("hf: transformers %s, torch %s, %s; %s loaded in %.1f s: %d layers, hidden %d, vocab %d, %.3g parameters, "
        "%s, attention %s" % (transformers.__version__, torch.__version__, torch.cuda.get_device_name(dev),
                              type(model).__name__, time.perf_counter() - t0, cfg.num_hidden_layers, cfg.hidden_size,
                              cfg.vocab_size, n_params, next(model.parameters()).dtype,
                              getattr(cfg, "_attn_implementation", "?")))

    gen = torch.Generator().manual_seed(a.seed)
    compile_on, compile_note = not a.no_compile, "off (--no-compile)" if a.no_compile else "on"
    static_on, cache_note = True, "static"

    def generate(batch, streamer=None):
        ids = torch.randint(3, cfg.vocab_size, (batch, a.prompt), generator=gen).to(dev)
        kw = dict(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=a.tokens,
                  min_new_tokens=a.tokens, pad_token_id=0, streamer=streamer)
        if static_on:
            kw["cache_implementation"] = "static"
        if not compile_on:
            kw["disable_compile"] = True
        torch.cuda.synchronize()
        t = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(**kw)
        torch.cuda.synchronize()
        dt = time.perf_counter() - t
        if out.shape != (batch, a.prompt + a.tokens):
            raise RuntimeError("generate returned shape %s, expected (%d, %d)" % (tuple(out.shape), batch,
                                                                                 a.prompt + a.tokens))
        return dt

    results = {}
    for batch in a.batches:
        while True:  # the warm-up; on failure step down: compiled -> eager -> dynamic cache, and say so
            t = time.perf_counter()
            try:
                generate(batch)
                break
            except Exception as e:  # noqa: BLE001 - whatever this transformers/torch pair raises
                first_line = (str(e).splitlines() or [""])[0][:200]
                why = "%s: %s" % (type(e).__name__, first_line)
                if compile_on:
                    compile_on = False
                    compile_note = "off (compiling failed: %s)" % why
                    log("hf: batch %d failed compiled, going on without compiling: %s" % (batch, why))
                    try:
                        import torch._dynamo
                        torch._dynamo.reset()
                    except Exception:  # noqa: BLE001
                        pass
                elif static_on:
                    static_on = False
                    cache_note = "dynamic (the static cache failed: %s)" % why
                    log("hf: batch %d failed with a static cache, going on with the default cache: %s" % (batch, why))
                else:
                    raise
        warm = time.perf_counter() - t
        compiled = compile_on and getattr(model, "_compiled_call", None) is not None
        if compile_on and not compiled:
            compile_note = "requested, but generate did not compile (this transformers version's criteria)"
        best = None
        for _ in range(a.reps):
            clock = StepClock()
            total = generate(batch, clock)
            ts = clock.times  # [prompt, step 1 (after prefill), ..., step tokens]
            if len(ts) == a.tokens + 1:
                prefill, step = ts[1] - ts[0], (ts[-1] - ts[1]) / (a.tokens - 1)
            else:  # a streamer not called per step: the mean over the whole call
                prefill, step = float("nan"), total / a.tokens
            if best is None or step < best[1]:
                best = (prefill, step, total)
        prefill, step, total = best
        results[batch] = step
        log("hf batch %d: warm-up %.1f s; prefill %.2f ms; decode step %.3f ms = %.1f decode tokens/s; "
            "end-to-end %.1f tokens/s (%d x %d tokens in %.3f s)" % (batch, warm, 1e3 * prefill, 1e3 * step,
                                                                     batch / step, batch * a.tokens / total, batch,
                                                                     a.tokens, total))
        log("RESULT engine=hf batch=%d prompt=%d tokens=%d prefill_ms=%.3f step_ms=%.4f decode_tok_s=%.1f "
            "e2e_tok_s=%.1f compile=%d static_cache=%d" % (batch, a.prompt, a.tokens, 1e3 * prefill, 1e3 * step,
                                                           batch / step, batch * a.tokens / total, int(compiled),
                                                           int(static_on)))
    log("hf: compile %s; %s cache; greedy; %.1f s in all" % (compile_note, cache_note, time.perf_counter() - t_start))
    if 1 in results and 64 in results:
        log("hf: step time batch 64 / batch 1: %.2f; decode tokens/s batch 64 / batch 1: %.1f"
            % (results[64] / results[1], 64 * results[1] / results[64]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
