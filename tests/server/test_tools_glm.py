#!/usr/bin/env python3
"""GLM-4.5 served end to end, and its tool-call format refused by name (docs/tools.md, docs/models.md):
`shardlm serve --http` on a random GLM-4.5 checkpoint (tests/reference/glm_ref.py: a dense first
layer, experts behind DeepSeek-V3's router, a plain shared expert) with stories260K's tokenizer and
GLM-4.6's published chat template (tests/data/chat_templates/zai-org-GLM-4.6.jinja).
- The server recognises the template's tool format ("glm", logged at start).
- /v1/chat/completions with `tools` is a 400 naming GLM's <arg_key> / <arg_value> format (shardlm
  neither parses nor constrains it yet), by the official `openai` package; the same request
  without `tools` is answered (200, the requested number of tokens, prompt_tokens equal to the
  prompt jinja2 renders, encoded by the `sentencepiece` package), and so is one with the tool
  result of an earlier turn in its history.
- The chat's greedy reply equals /v1/completions' on the same prompt ids.
SKIP (77) without openai, jinja2, sentencepiece or the shared assets.

  test_tools_glm.py --shardlm BUILD/cli/shardlm
"""
import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

SKIP = 77
HERE = Path(__file__).resolve().parent
TESTS = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(TESTS))
sys.path.insert(0, str(TESTS / "reference"))
try:
    import openai
    import sentencepiece as spm
    import test_jinja  # noqa: E402  (exits 77 without jinja2)
except ImportError as e:
    print(f"SKIP: a test dependency cannot be imported ({e}); run tools/install_deps.sh")
    sys.exit(SKIP)
import glm_ref  # noqa: E402
import make_models as MM  # noqa: E402
import test_server as TS  # noqa: E402
from checks import Checks  # noqa: E402

check = Checks()
TEMPLATE = TESTS / "data" / "chat_templates" / "zai-org-GLM-4.6.jinja"
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                           "required": ["city"]}}}]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shardlm", required=True)
    a = ap.parse_args()
    assets = Path(os.environ.get("SHARDLM_ASSETS", TESTS.parent.parent / "shared/assets"))
    tok = assets / "stories260K" / "tok512.model"
    if not tok.exists():
        print(f"SKIP: no stories260K tokenizer under {assets}")
        return SKIP
    work = Path(tempfile.mkdtemp(prefix="shardlm-glm-"))
    try:
        cfg = glm_ref.config("f32")
        MM.write_checkpoint(str(work / "glm"), cfg, glm_ref.init(cfg, 35), "f32", 1)
        shutil.copy(tok, work / "glm" / "tokenizer.model")
        msgs = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Once upon a time"}]
        env = test_jinja.make_env()
        prompt = env.from_string(TEMPLATE.read_text()).render(messages=msgs, add_generation_prompt=True,
                                                               bos_token="<s>", eos_token="</s>")
        sp = spm.SentencePieceProcessor(model_file=str(tok))
        want_prompt = len(sp.encode(prompt))
        with TS.Server(a.shardlm, work / "glm", "--chat-template", str(TEMPLATE), "--no-prefix-caching",
                       name="glm", http=True) as srv:
            log = srv.log_path.read_text()
            check(" tool calls in the glm format" in log, "the server reads GLM-4.6's template as the glm tool format")
            c = openai.OpenAI(base_url=f"http://127.0.0.1:{srv.http_port}/v1", api_key="none", timeout=60)
            try:
                c.chat.completions.create(model="glm", messages=msgs, tools=TOOLS, max_tokens=8)
                check(False, "a request with tools on GLM's format is refused")
            except openai.BadRequestError as e:
                check("GLM-4.5's format" in str(e) and "<arg_key>" in str(e),
                      "a request with tools is a 400 naming GLM's format: %s" % str(e)[:160])
            r = c.chat.completions.create(model="glm", messages=msgs, max_tokens=8, temperature=0)
            check(r.usage.completion_tokens == 8 and r.usage.prompt_tokens == want_prompt,
                  "without tools: 8 tokens after a prompt of %d tokens (jinja2 + sentencepiece: %d)"
                  % (r.usage.prompt_tokens, want_prompt))
            hist = msgs + [{"role": "assistant", "content": "It is sunny."}, {"role": "user", "content": "And then?"}]
            r2 = c.chat.completions.create(model="glm", messages=hist, max_tokens=4, temperature=0)
            check(r2.usage.completion_tokens == 4, "a longer history is answered (%d tokens)" % r2.usage.completion_tokens)
            # The same prompt's ids through /v1/completions (a list of token ids): the same greedy text.
            ids = sp.encode(prompt)
            r3 = c.completions.create(model="glm", prompt=ids, max_tokens=8, temperature=0)
            check(r3.usage.prompt_tokens == len(ids) and r3.choices[0].text == r.choices[0].message.content,
                  "the chat's greedy reply %r is /v1/completions' for the same ids" % (r.choices[0].message.content or "")[:40])
    except Exception as e:  # noqa: BLE001 - reported with the server logs
        check(False, f"{e}")
        for log in sorted(TS.LOG_DIR.glob("*.log")):
            print(f"--- {log.name} (last lines)\n" + "\n".join(log.read_text().splitlines()[-15:]))
    finally:
        TS.kill_all()
        shutil.rmtree(work, ignore_errors=True)
    return check.summary()


if __name__ == "__main__":
    sys.exit(main())
