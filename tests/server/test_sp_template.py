#!/usr/bin/env python3
"""A SentencePiece checkpoint directory that carries its own Jinja chat template, served end to end:
`shardlm serve --model DIR --http` where DIR holds a random-weight Llama (tests/reference/
make_models.py), a tokenizer.model trained at test time by the `sentencepiece` package with Gemma's
turn markers `<start_of_turn>` / `<end_of_turn>` as CONTROL pieces, and a tokenizer_config.json
whose chat_template is tests/data/chat_templates/gemma-it.jinja with `{{ bos_token }}` in front (as
Gemma's published templates begin). Driven by the official `openai` package (/v1/chat/completions,
/v1/completions) and the gRPC client (Chat, Generate).

What is checked comes from libraries no one here wrote: the prompt the server must build is the
template rendered by Python jinja2 (configured as transformers does, test_jinja.make_env) and
encoded by the `sentencepiece` package with the control pieces' strings split out as their ids
(test_sp_chat.SpWithSpecials, what Hugging Face's tokenizers do with such added tokens).
- gRPC Chat with prompt_logprobs: the prompt ids the server used equal that reference, control ids
  (BOS, both turn markers) included, for three conversations (one user turn; system + three turns;
  contents holding the markers' and `<s>`'s strings).
- /v1/chat/completions: prompt_tokens equal; the greedy answer's text and log-probabilities equal
  gRPC Generate given the reference ids (random weights: any other prompt moves them).
- End of turn: `<end_of_turn>` (id 4, not the EOS `</s>`) forced by a logit bias ends a chat after
  one token with finish reason stop (HTTP; gRPC's eos); a plain completion goes on past it.
- A template error (roles not alternating: the template raises) is a 400 naming the message, and
  the server answers afterwards.
SKIP (77) without openai, grpcio, jinja2, sentencepiece or the shared assets' tinyshakespeare.

  test_sp_template.py --shardlm BUILD/cli/shardlm
"""
import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

SKIP = 77
HERE = Path(__file__).resolve().parent
TESTS = HERE.parent
sys.dont_write_bytecode = True
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(TESTS))
try:
    import jinja2  # noqa: F401
    import openai
    import sentencepiece
    from test_sp_chat import SpWithSpecials
    from test_jinja import make_env
except (ImportError, SystemExit) as e:
    print(f"SKIP: a test dependency cannot be imported ({e}); run tools/install_deps.sh")
    sys.exit(SKIP)
import test_server as TS  # noqa: E402
from checks import Checks  # noqa: E402

ASSETS = Path(os.environ.get("SHARDLM_ASSETS", TESTS.parent.parent / "shared" / "assets"))
CORPUS = ASSETS / "datasets" / "tinyshakespeare.txt"
check = Checks()

CONVERSATIONS = [
    [{"role": "user", "content": "Who art thou, and whence comest thou?"}],
    [{"role": "system", "content": "Answer as a player in a comedy."},
     {"role": "user", "content": "Good morrow, friend."},
     {"role": "assistant", "content": "And to you, good sir. What news?"},
     {"role": "user", "content": "  The king is come to town!  "}],
    [{"role": "user", "content": "Write <start_of_turn> and <end_of_turn>, then <s> and </s>."},
     {"role": "assistant", "content": "<end_of_turn><s>done"},
     {"role": "user", "content": "Again: <start_of_turn>user"}],
]


def make_checkpoint(work: Path) -> Path:
    """The model directory: random Llama weights, a trained tokenizer.model, the template."""
    d = work / "gemma-sp"
    subprocess.run([sys.executable, str(TESTS / "reference" / "make_models.py"), "llama", "--out", str(d), "--seed", "41"],
                   check=True, capture_output=True)
    text = CORPUS.read_text(encoding="utf-8")[:300000]
    (work / "corpus.txt").write_text(text, encoding="utf-8")
    # vocab 512 = the checkpoint's; ids 0-2 as config.json says (unk, bos 1, eos 2), then the two
    # control pieces (3, 4), the 256 byte pieces, merges.
    sentencepiece.SentencePieceTrainer.train(
        input=str(work / "corpus.txt"), model_prefix=str(d / "tokenizer"), vocab_size=512, model_type="bpe",
        byte_fallback=True, control_symbols=["<start_of_turn>", "<end_of_turn>"], character_coverage=1.0,
        num_threads=1, minloglevel=2, unk_id=0, bos_id=1, eos_id=2, pad_id=-1)
    (d / "tokenizer.vocab").unlink()
    template = "{{ bos_token }}" + (TESTS / "data" / "chat_templates" / "gemma-it.jinja").read_text()
    (d / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "add_bos_token": True,
        "chat_template": template}))
    return d


def close(a, b):
    return len(a) == len(b) and all(math.isclose(x, y, rel_tol=1e-5, abs_tol=1e-5) for x, y in zip(a, b))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shardlm", required=True)
    a = ap.parse_args()
    if not CORPUS.exists():
        print(f"SKIP: {CORPUS} not found (set SHARDLM_ASSETS)")
        return SKIP
    work = Path(tempfile.mkdtemp(prefix="shardlm-sp-template-"))
    try:
        model = make_checkpoint(work)
        tok = SpWithSpecials(model / "tokenizer.model")
        sp = tok.sp
        bos, eos, sot, eot = (sp.piece_to_id(p) for p in ("<s>", "</s>", "<start_of_turn>", "<end_of_turn>"))
        check((bos, eos, sot, eot) == (1, 2, 3, 4) and sp.is_control(sot) and sp.is_control(eot),
              f"tokenizer.model: <s> {bos}, </s> {eos}, CONTROL <start_of_turn> {sot}, <end_of_turn> {eot}")
        src = json.loads((model / "tokenizer_config.json").read_text())["chat_template"]
        env = make_env()
        with TS.Server(a.shardlm, model, name="sp-template", http=True) as srv:
            name = model.name
            oa = openai.OpenAI(base_url=srv.base + "/v1", api_key="none", max_retries=0, timeout=120)
            info = json.load(urllib.request.urlopen(srv.base + "/v1/models", timeout=30))["data"][0]
            check(info["chat_template"] == "jinja (model)", f"/v1/models: chat_template {info['chat_template']!r}")
            with TS.Client(srv.target) as g:
                for i, conv in enumerate(CONVERSATIONS):
                    prompt = env.from_string(src).render(messages=conv, add_generation_prompt=True, bos_token="<s>",
                                                         eos_token="</s>")
                    want = tok.encode(prompt).ids
                    check(want[0] == bos and want.count(sot) == want.count(eot) + 1 and eot in want,
                          f"conversation {i}: the reference prompt has BOS and the turn markers as ids ({len(want)} ids)")
                    chat = g.chat(conv, max_tokens=6, temperature=0, prompt_logprobs=0, logprobs=0)
                    used = [e.token_id for e in chat.prompt_logprobs]
                    check(used == want, f"conversation {i}: gRPC Chat's prompt ids = jinja2 + sentencepiece "
                          f"({len(used)} vs {len(want)} ids)")
                    if used != want:
                        print(f"  want {want}\n  got  {used}")
                    gen = g.generate(prompt_token_ids=want, max_tokens=6, temperature=0, logprobs=0)
                    check(chat.token_ids == gen.token_ids and chat.text == gen.text,
                          f"conversation {i}: gRPC Chat answers as Generate of the reference ids {gen.token_ids}")
                    r = oa.chat.completions.create(model=name, messages=conv, max_tokens=6, temperature=0,
                                                   logprobs=True)
                    got_lp = [t.logprob for t in r.choices[0].logprobs.content]
                    check(r.usage.prompt_tokens == len(want) and r.choices[0].message.content == gen.text
                          and close(got_lp, [e.logprob for e in gen.logprobs]),
                          f"conversation {i}: /v1/chat/completions = Generate of the reference ids "
                          f"({r.usage.prompt_tokens} prompt tokens, {r.choices[0].message.content!r}, "
                          f"{r.choices[0].finish_reason})")
                # End of turn: the template writes <end_of_turn> after an assistant turn; forced
                # first, it ends a chat (it is not the EOS) and does not end a completion.
                conv = CONVERSATIONS[0]
                forced = dict(model=name, max_tokens=5, temperature=0, logit_bias={str(eot): 100})
                r = oa.chat.completions.create(messages=conv, **forced)
                check(r.choices[0].finish_reason == "stop" and r.usage.completion_tokens == 1
                      and r.choices[0].message.content == "",
                      f"HTTP chat ends at <end_of_turn> ({r.choices[0].finish_reason}, {r.usage.completion_tokens} "
                      f"tokens, {r.choices[0].message.content!r})")
                ans = g.chat(conv, max_tokens=5, temperature=0, logit_bias={eot: 100})
                # gRPC names an end-of-turn token's finish as EOS's (FINISH_REASON_EOS; HTTP's "stop").
                check(ans.finish_reason == "eos" and ans.completion_tokens == 1 and ans.text == "",
                      f"gRPC Chat ends at <end_of_turn> ({ans.finish_reason}, {ans.completion_tokens} tokens)")
                c = oa.completions.create(prompt="Good morrow", **forced)
                check(c.choices[0].finish_reason == "length" and c.usage.completion_tokens == 5,
                      f"a completion is not a turn: {c.usage.completion_tokens} tokens ({c.choices[0].finish_reason})")
                # The template raises on roles that do not alternate: a request error, the server lives.
                try:
                    oa.chat.completions.create(model=name, messages=[{"role": "user", "content": "a"},
                                                                     {"role": "user", "content": "b"}], max_tokens=2)
                    check(False, "a template that raises: no error")
                except openai.BadRequestError as e:
                    check("alternate" in str(e), f"a template that raises is a 400: {str(e)[:120]}")
                r = oa.chat.completions.create(model=name, messages=conv, max_tokens=2, temperature=0)
                check(r.usage.completion_tokens >= 1, "the server answers after the template's error")
        # A message's name reaches a Jinja template that writes it (--chat-template FILE.jinja).
        named = work / "named.jinja"
        named.write_text("{{ bos_token }}{% for m in messages %}{{ m.role }}{% if m.name %} ({{ m.name }}){% endif %}: "
                         "{{ m.content }}\n{% endfor %}{% if add_generation_prompt %}assistant: {% endif %}")
        conv = [{"role": "system", "content": "Be brief."}, {"role": "user", "name": "alice", "content": "Good morrow"},
                {"role": "assistant", "name": "bot", "content": "Well met."}, {"role": "user", "content": "Speak"}]
        want = tok.encode(env.from_string(named.read_text()).render(messages=conv, add_generation_prompt=True,
                                                                    bos_token="<s>", eos_token="</s>")).ids
        with TS.Server(a.shardlm, model, "--chat-template", str(named), name="sp-named", http=True) as srv:
            oa = openai.OpenAI(base_url=srv.base + "/v1", api_key="none", max_retries=0, timeout=120)
            r = oa.chat.completions.create(model=model.name, messages=conv, max_tokens=1, temperature=0)
            check(r.usage.prompt_tokens == len(want), f"messages' names written by the template: {r.usage.prompt_tokens} "
                  f"prompt tokens, jinja2 + sentencepiece {len(want)}")
        # With tools and no system message, the server opens the chat with one of its own (the
        # tools' text): the names stay on the body's messages (a system message named: the
        # template raises). The tools' text passes this model's 256-token context, so the answer
        # is that 400 once the template has rendered, or an answer; never the template's error.
        strict = work / "named_strict.jinja"
        strict.write_text("{% for m in messages %}{% if m.role == 'system' and m.name %}{{ raise_exception('a named "
                          "system message') }}{% endif %}{{ m.role }}{% if m.name %} ({{ m.name }}){% endif %}: "
                          "{{ m.content }}\n{% endfor %}{% if add_generation_prompt %}assistant: {% endif %}")
        tool = {"type": "function", "function": {"name": "get_time", "description": "The time",
                                                 "parameters": {"type": "object", "properties": {}}}}
        with TS.Server(a.shardlm, model, "--chat-template", str(strict), name="sp-named-tools", http=True) as srv:
            oa = openai.OpenAI(base_url=srv.base + "/v1", api_key="none", max_retries=0, timeout=120)
            try:
                oa.chat.completions.create(model=model.name, messages=conv[1:2], tools=[tool], max_tokens=1,
                                           temperature=0)
                said = "answered"
            except openai.BadRequestError as e:
                said = str(e)
            check(said == "answered" or "exceeds the model's context" in said,
                  f"with tools, a user's name stays on the user's message: {said[:160]}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
        TS.kill_all()
    return check.summary()


if __name__ == "__main__":
    sys.exit(main())
