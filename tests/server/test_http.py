#!/usr/bin/env python3
"""tests/server/test_http.py - drives the OpenAI-compatible HTTP front of a real `shardlm serve
--http 127.0.0.1:0` (stories260K) with the official `openai` package, raw sockets and
prometheus_client's text parser. One group per ctest test:

  openai     completions and chat, unary and streaming: greedy stream chunks concatenate to
             the unary text, which equals the gRPC answer; n > 1; logprobs (both shapes);
             stop strings; usage; include_usage; /v1/models; /health
  errors     bad parameter types and ranges (engine_validate's message), unknown body and message
             fields refused by name (OpenAI's reply fields sent back taken), unknown model (404),
             unknown route, missing or wrong API key (401); gRPC and HTTP share the keys
  disconnect a client that closes its stream mid-way, or a unary request's socket, frees the
             KV blocks (GetServerStats and /metrics)
  sse        raw SSE framing over a socket: `data: {...}\\n\\n` events, `data: [DONE]`
  metrics    /metrics parses with prometheus_client; counters move by the right amounts for
             HTTP and gRPC requests
  malformed  truncated bodies, huge bodies, wrong content types, invalid UTF-8, invalid JSON,
             garbage request lines: 4xx (or a closed connection), and the server keeps serving
  nul        U+0000 in a request string is refused (400) naming the field; generated U+0000
             (token <0x00>) is in the JSON text
  prompts    `prompt` as a list of several prompts (strings and token ids): each choice equals
             the same prompt alone (greedy), unary and streamed; prompt-major indices with n > 1;
             an invalid prompt among valid ones refuses the whole request (400 naming it) and
             submits nothing; the bound on prompts; a stream of several prompts that the client
             closes frees every block; a prompt that the full queue refuses (429) cancels the
             others
  hardening  issue 35: refusals decided from the headers before a body byte is read (key,
             route, method, content type and length); 405 with Allow for every other method;
             escaped routes are no routes; duplicate member names, trailing bytes and
             non-canonical logit_bias ids are refused; 200,000-item stop lists cost little CPU;
             a request that can never be queued is 400; half-closed clients get their answers;
             slow headers and bodies are cut at their deadlines; the per-address and total
             connection caps answer 503
  echo       echo: the text starts with the prompt (token-id prompts: their decoded text); with
             logprobs, the prompt's tokens and log-probabilities (the first null) equal gRPC's
             prompt_logprobs of the same prompt, unary and streamed, n > 1, max_tokens 0
  verify_prefix  --verify-prefix-cache 1: prompt-cache hits recomputed without the cache; a clean
             cache 0 mismatches, a corrupted one (SHARDLM_TEST_PREFIX_CACHE_FAULT=1) a mismatch per
             hit, logged with the request id; bad fractions refused

Usage: SHARDLM_PY_CLIENT=BUILD/clients/python/site-packages test_http.py --shardlm BUILD/cli/shardlm
GROUP...  (default: every group; the gRPC client as in test_server.py: import_client)
Exit 0 when every check passed, 1 on a failure, 77 (SKIP) when the model assets, openai,
prometheus_client, grpcio or the installed client are missing. Every server is killed at the end; loops are bounded."""
import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SKIP = 77
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

try:
    import openai
    from prometheus_client.parser import text_string_to_metric_families
except ImportError as e:
    print(f"SKIP: a test dependency cannot be imported ({e}); run tools/install_deps.sh")
    sys.exit(SKIP)

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
# The server harness (start, ports, SIGTERM, logs); it imports shardlm_client from the installed
# copy ($SHARDLM_PY_CLIENT, test_server.import_client) or SKIPs without grpcio.
import test_server as TS  # noqa: E402
from shardlm_client import Client  # noqa: E402

SERVERS = TS.SERVERS
LOG_DIR = TS.LOG_DIR
MODEL = "stories260K"
LONG = dict(max_tokens=480, temperature=0, n=16, extra_body={"ignore_eos": True})


Failure = TS.Failure


def check(cond, what):
    if not cond:
        raise Failure(what)


def wait_until(fn, what, timeout=10.0):
    end = time.time() + timeout
    while time.time() < end:
        v = fn()
        if v:
            return v
        time.sleep(0.02)
    raise Failure(f"timed out waiting for {what}")


class Server(TS.Server):
    """test_server's harness with the HTTP front on (`--http 127.0.0.1:0`)."""

    def __init__(self, shardlm, model, *extra, name="http", env=None):
        super().__init__(shardlm, model, *extra, name=name, http=True, env=env)

    def openai(self, key="none", **kw):
        return openai.OpenAI(base_url=self.base + "/v1", api_key=key, max_retries=0, timeout=60, **kw)

    def grpc(self, **kw):
        return Client(self.target, **kw)


def http(srv, method, path, body=None, headers=None, timeout=30):
    """(status, parsed JSON or text) with urllib; errors are answers too."""
    data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
    h = {"Content-Type": "application/json"} if data is not None else {}
    h.update(headers or {})
    req = urllib.request.Request(srv.base + path, data=data, method=method, headers=h)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            code, text = r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        code, text = e.code, e.read().decode()
    try:
        return code, json.loads(text)
    except ValueError:
        return code, text


def raw(srv, data, timeout=10):
    """Sends raw bytes, returns what comes back until the server closes or the timeout."""
    with socket.create_connection(("127.0.0.1", srv.http_port), timeout=timeout) as s:
        s.sendall(data)
        s.shutdown(socket.SHUT_WR) if data.endswith(b"\r\n\r\n") and b"Content-Length" not in data else None
        out = b""
        try:
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                out += chunk
                if b"\r\n\r\n" in out and b"Content-Length" in out.split(b"\r\n\r\n")[0]:
                    head, _, body = out.partition(b"\r\n\r\n")
                    n = int([x for x in head.split(b"\r\n") if x.lower().startswith(b"content-length")][0].split(b":")[1])
                    if len(body) >= n:
                        break
        except socket.timeout:
            pass
        return out


def settled(c):
    s = c.server_stats()
    return s if s.running == 0 and s.waiting == 0 and s.kv_blocks_free + s.kv_blocks_cached == s.kv_blocks_total \
        else None


def metrics(srv):
    code, text = http(srv, "GET", "/metrics")
    check(code == 200, f"/metrics answered {code}")
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def metric(m, name, **labels):
    return m.get((name, tuple(sorted(labels.items()))), 0.0)


# ---- groups ------------------------------------------------------------------------------

def group_openai(env):
    with Server(env.shardlm, env.model, name="openai") as srv, srv.grpc() as g:
        oa = srv.openai()
        models = oa.models.list()
        check([m.id for m in models.data] == [MODEL], f"/v1/models {models}")
        code, body = http(srv, "GET", "/health")
        check(code == 200 and body["status"] == "SERVING", f"/health {code} {body}")
        for prompt, n in (("Once upon a time", 40), ("The little dog", 60)):
            u = oa.completions.create(model=MODEL, prompt=prompt, max_tokens=n, temperature=0)
            ref = g.generate(prompt, max_tokens=n, temperature=0)
            check(u.choices[0].text == ref.text, f"HTTP {u.choices[0].text!r} differs from gRPC {ref.text!r}")
            check(u.usage.completion_tokens == len(ref.token_ids) and u.usage.prompt_tokens == ref.prompt_tokens,
                  f"usage {u.usage}")
            check(u.usage.total_tokens == u.usage.prompt_tokens + u.usage.completion_tokens, "total_tokens")
            check(u.choices[0].finish_reason == ("length" if ref.finish_reason == "length" else "stop"), "finish")
            chunks = list(oa.completions.create(model=MODEL, prompt=prompt, max_tokens=n, temperature=0, stream=True))
            text = "".join(c.choices[0].text for c in chunks if c.choices)
            check(text == u.choices[0].text, f"stream {text!r} differs from unary {u.choices[0].text!r}")
            check(chunks[-1].choices[0].finish_reason == u.choices[0].finish_reason, "stream finish_reason")
        # Chat: the same answer as gRPC Chat; stream with include_usage.
        msgs = [{"role": "system", "content": "You tell stories."}, {"role": "user", "content": "Tell me about a cat."}]
        cu = oa.chat.completions.create(model=MODEL, messages=msgs, max_tokens=30, temperature=0)
        cref = g.chat([("system", msgs[0]["content"]), ("user", msgs[1]["content"])], max_tokens=30, temperature=0)
        check(cu.choices[0].message.content == cref.text and cu.choices[0].message.role == "assistant",
              f"chat {cu.choices[0].message.content!r} vs gRPC {cref.text!r}")
        cs = list(oa.chat.completions.create(model=MODEL, messages=msgs, max_tokens=30, temperature=0, stream=True,
                                             stream_options={"include_usage": True}))
        check(cs[0].choices[0].delta.role == "assistant", "the first chunk carries the role")
        ctext = "".join(c.choices[0].delta.content or "" for c in cs if c.choices)
        check(ctext == cu.choices[0].message.content, f"chat stream {ctext!r} vs unary")
        check(cs[-1].choices == [] and cs[-1].usage.completion_tokens == cu.usage.completion_tokens,
              f"include_usage chunk {cs[-1]}")
        # n > 1 with a seed: reproducible, and each sample has its index.
        a = oa.completions.create(model=MODEL, prompt="Once", max_tokens=20, temperature=1.0, n=3, seed=7)
        b = oa.completions.create(model=MODEL, prompt="Once", max_tokens=20, temperature=1.0, n=3, seed=7)
        check(sorted(c.index for c in a.choices) == [0, 1, 2], "n=3 indices")
        check([c.text for c in a.choices] == [c.text for c in b.choices], "seeded samples repeat")
        check(a.usage.completion_tokens == 60, f"usage sums the samples: {a.usage}")
        sn = list(oa.completions.create(model=MODEL, prompt="Once", max_tokens=20, temperature=1.0, n=3, seed=7,
                                        stream=True))
        for i in range(3):
            t = "".join(c.choices[0].text for c in sn if c.choices and c.choices[0].index == i)
            check(t == a.choices[i].text, f"stream sample {i}: {t!r} vs {a.choices[i].text!r}")
        # Logprobs: completions (top-n dicts) and chat (content entries).
        lp = oa.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=8, temperature=0, logprobs=3)
        L = lp.choices[0].logprobs
        check(len(L.tokens) == 8 and len(L.token_logprobs) == 8 and len(L.top_logprobs) == 8, f"logprobs {L}")
        check(all(x <= 0 for x in L.token_logprobs), "log-probabilities are <= 0")
        check(all(len(d) >= 1 and abs(max(d.values()) - L.token_logprobs[i]) < 1e-4 for i, d in enumerate(L.top_logprobs)),
              "greedy: the chosen token is the top one")
        check("".join(L.tokens).strip() == lp.choices[0].text.strip(), f"tokens {L.tokens} vs {lp.choices[0].text!r}")
        clp = oa.chat.completions.create(model=MODEL, messages=msgs, max_tokens=5, temperature=0, logprobs=True,
                                         top_logprobs=2)
        content = clp.choices[0].logprobs.content
        check(len(content) == 5 and all(len(e.top_logprobs) == 2 for e in content), f"chat logprobs {content}")
        # Stop strings: the text ends before the stop, finish_reason stop.
        full = oa.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=40, temperature=0).choices[0].text
        word = full.split()[3]
        st = oa.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=40, temperature=0, stop=[word])
        check(st.choices[0].finish_reason == "stop" and word not in st.choices[0].text and
              full.startswith(st.choices[0].text), f"stop {word!r}: {st.choices[0].text!r}")
        st1 = oa.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=40, temperature=0, stop=word)
        check(st1.choices[0].text == st.choices[0].text, "stop as a string")
        # vLLM's extras, echo, token-id prompts.
        ex = oa.completions.create(model=MODEL, prompt="Once", max_tokens=10, temperature=0,
                                   extra_body={"min_tokens": 10, "ignore_eos": True, "top_k": 5, "repetition_penalty": 1.1})
        check(ex.usage.completion_tokens == 10, "min_tokens / ignore_eos")
        ec = oa.completions.create(model=MODEL, prompt="Once upon", max_tokens=5, temperature=0, echo=True)
        check(ec.choices[0].text.startswith("Once upon"), f"echo {ec.choices[0].text!r}")
        ids = g.tokenize("Once upon a time")
        ti = oa.completions.create(model=MODEL, prompt=ids, max_tokens=20, temperature=0)
        check(ti.choices[0].text == oa.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=20,
                                                          temperature=0).choices[0].text, "token ids prompt")


def group_errors(env):
    keys = Path(tempfile.mkdtemp()) / "keys"
    keys.write_text("# keys\nsecret-1\n")
    with Server(env.shardlm, env.model, "--api-key-file", str(keys), name="errors") as srv:
        oa = srv.openai(key="secret-1")
        oa.completions.create(model=MODEL, prompt="hi", max_tokens=2)
        for key in ("wrong", None):
            code, body = http(srv, "POST", "/v1/completions", {"prompt": "hi"},
                              {"Authorization": f"Bearer {key}"} if key else {})
            check(code == 401 and body["error"]["type"] == "authentication_error", f"key {key}: {code} {body}")
        try:
            srv.openai(key="wrong").completions.create(model=MODEL, prompt="hi")
            raise Failure("a wrong key was accepted")
        except openai.AuthenticationError:
            pass
        code, _ = http(srv, "GET", "/health")
        check(code == 200, "health needs no key")
        with srv.grpc(api_key="secret-1") as g:
            check(g.generate("hi", max_tokens=2, temperature=0).completion_tokens == 2, "gRPC takes the same key")
        try:
            oa.completions.create(model="gpt-4", prompt="hi")
            raise Failure("an unknown model was accepted")
        except openai.NotFoundError as e:
            check("gpt-4" in str(e), f"404 names the model: {e}")
        H = {"Authorization": "Bearer secret-1"}
        table = [
            ({"prompt": "hi", "temperature": "hot"}, "'temperature' must be a number"),
            ({"prompt": "hi", "max_tokens": 1.5}, "'max_tokens' must be an integer"),
            ({"prompt": "hi", "max_tokens": -5}, "'max_tokens' must be >= 0"),
            ({"prompt": "hi", "max_tokens": 1e12}, "'max_tokens' = 1000000000000 is out of range"),
            ({"prompt": "hi", "stop": 3}, "'stop' must be a string or a list"),
            ({"prompt": "hi", "stream": "yes"}, "'stream' must be a boolean"),
            ({"prompt": "hi", "logit_bias": {"x": 1}}, "logit_bias"),
            ({"prompt": 7}, "'prompt' must be"),
            ({}, "'prompt' is required"),
            ({"prompt": "hi", "temperature": -1}, "temperature"),          # engine_validate's range
            ({"prompt": "hi", "max_tokens": 600}, "context"),
            ({"prompt": "hi", "n": 0}, "n"),
            ({"prompt": "hi", "logprobs": 1000}, "logprobs"),
            ({"prompt": "Once upon a time " * 60000}, "prompt (at least"),  # refused before tokenizing
            # Every field is read or refused by name (never silently ignored).
            ({"prompt": "hi", "unknown_field": {"a": 1}, "max_tokens": 1}, "unknown_field: unknown field"),
            ({"prompt": "hi", "messages": []}, "messages: unknown field (not supported by this server in completions"),
            ({"prompt": "hi", "stream_options": {"continuous_usage_stats": True}},
             "stream_options.continuous_usage_stats: unknown field"),
            ({"prompt": "hi", "store": True}, "'store': true is not supported"),
            ({"prompt": "hi", "service_tier": "flex"}, "'service_tier' 'flex' is not supported"),
            ({"prompt": "hi", "modalities": ["text", "audio"]}, "'modalities' other than"),
            ({"prompt": "hi", "metadata": {"a": 1}}, "'metadata' must be an object of strings"),
            # Client fields that ask nothing of the output, with the values that ask for this server's.
            ({"prompt": "hi", "max_tokens": 1, "store": False, "metadata": {"team": "qa"}, "service_tier": "auto",
              "prompt_cache_key": "k1", "safety_identifier": "u1", "modalities": ["text"],
              "guided_decoding_backend": "xgrammar", "stream_options": None}, None),
            ({"prompt": "hi", "response_format": {"type": "xml"}}, "'response_format.type' must be"),
            ({"prompt": "hi", "response_format": {"type": "json_schema"}}, "'response_format.json_schema' must be"),
            ({"prompt": "hi", "response_format": {"type": "json_object", "schema": {}}},
             "response_format.schema: unknown field"),
            ({"prompt": "hi", "response_format": {"type": "json_schema", "json_schema": {"schema": {}, "strictly": True}}},
             "response_format.json_schema.strictly: unknown field"),
            ({"prompt": "hi", "response_format": {"type": "text", "json_schema": {"schema": {}}}},
             "'response_format.json_schema' is only read with type json_schema"),
            ({"prompt": "hi", "stream_options": {"include_usage": True}},
             "'stream_options' is only allowed when 'stream' is true"),
            ({"prompt": "hi", "guided_regex": "a", "guided_choice": ["a"]}, "exclusive"),
            ({"prompt": "hi", "tools": [{"type": "function", "function": {"name": "f"}}]}, "for /v1/chat/completions"),
            ({"prompt": "hi", "tool_choice": "auto"}, "for /v1/chat/completions"),
            ({"prompt": "hi", "functions": []}, "'functions' is not supported"),
            ({"prompt": "hi", "suffix": "x"}, "'suffix' is not supported"),
            ({"prompt": "hi", "best_of": 2}, "'best_of' other than 1"),
            ({"prompt": "hi", "response_format": {"type": "text"}, "tools": [], "max_tokens": 1}, None),
        ]
        for body, want in table:
            code, ans = http(srv, "POST", "/v1/completions", body, H)
            if want is None:
                check(code == 200, f"{body}: {code} {ans}")
                continue
            check(code == 400 and ans["error"]["type"] == "invalid_request_error" and want in ans["error"]["message"],
                  f"{body}: {code} {ans}")
        code, ans = http(srv, "POST", "/v1/chat/completions", {"messages": [{"role": "robot", "content": "x"}]}, H)
        check(code == 400 and "role" in ans["error"]["message"], f"bad role: {code} {ans}")
        code, ans = http(srv, "POST", "/v1/chat/completions",
                         {"messages": [{"role": "user", "content": "x"}], "prompt": "y", "echo": True}, H)
        check(code == 400 and "prompt: unknown field (not supported by this server in chat; it is /v1/completions'"
              in ans["error"]["message"], f"prompt in chat: {code} {ans}")
        # A message's fields too: each read or refused by name.
        user = {"role": "user", "content": "x"}
        for msg, want in [({**user, "prefix": True}, "'messages[0].prefix': unknown field"),
                          ({**user, "name": "alice"}, "'messages[0].name' needs a Jinja chat template"),
                          ({**user, "name": 3}, "'messages[0].name' must be a string"),
                          ({**user, "tool_call_id": "c1"}, "'messages[0].tool_call_id' is for messages of role tool"),
                          ({"role": "assistant", "content": "x", "refusal": "no"}, "'messages[0].refusal' is not supported"),
                          ({"role": "assistant", "content": "x", "annotations": [{"type": "url_citation"}]},
                           "'messages[0].annotations' is not supported"),
                          ({**user, "reasoning_content": 1}, "'messages[0].reasoning_content' must be a string"),
                          ({"role": "user", "content": [{"type": "text", "text": "x", "detail": "high"}]},
                           "messages[0].content[0].detail: unknown field"),
                          ({"role": "user", "content": [{"type": "text", "text": "x",
                                                         "cache_control": {"type": "ephemeral"}}]}, None),
                          # What OpenAI's own replies carry, sent back: taken.
                          ({"role": "assistant", "content": "x", "refusal": None, "annotations": [], "audio": None,
                            "function_call": None, "tool_calls": None, "reasoning_content": None}, None)]:
            code, ans = http(srv, "POST", "/v1/chat/completions", {"messages": [msg, user], "max_tokens": 1}, H)
            check(code == 200 if want is None else code == 400 and want in ans["error"]["message"], f"{msg}: {code} {ans}")
        # tool_choice as an object: {"type": "function", "function": {"name": ...}} and nothing else.
        fn = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
        for choice, want in [({"type": "function", "function": {"name": "f"}, "allowed": ["f"]},
                              "tool_choice.allowed: unknown field"),
                             ({"type": "function", "function": {"name": "f", "strict": True}},
                              "tool_choice.function.strict: unknown field"),
                             ({"type": "allowed_tools", "function": {"name": "f"}},
                              "'tool_choice.type' must be \"function\"")]:
            code, ans = http(srv, "POST", "/v1/chat/completions", {"messages": [user], "tools": fn,
                                                                    "tool_choice": choice, "max_tokens": 1}, H)
            check(code == 400 and want in ans["error"]["message"], f"tool_choice {choice}: {code} {ans}")
        code, ans = http(srv, "POST", "/v1/chat/completions", {"messages": "hi"}, H)
        check(code == 400 and "'messages' must be a list" in ans["error"]["message"], f"messages type: {code} {ans}")
        code, ans = http(srv, "POST", "/v1/chat/completions",
                         {"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": -5}, H)
        check(code == 400 and "'max_completion_tokens' must be >= 0" in ans["error"]["message"],
              f"max_completion_tokens -5: {code} {ans}")
        code, ans = http(srv, "GET", "/v1/nothing", None, H)
        check(code == 404 and "error" in ans, f"unknown route {code}")
        code, ans = http(srv, "GET", "/v1/completions", None, H)
        check(code == 405, f"GET on a POST route: {code}")


def group_nul(env):
    """U+0000 in a request string ("\\u0000", or a raw NUL byte, which cJSON takes) is refused
    with a 400 naming the field, never cut short; U+0000 in generated text reaches the client."""
    with Server(env.shardlm, env.model, name="nul") as srv:
        H = {"Content-Type": "application/json"}
        table = [
            ("/v1/completions", {"prompt": "hi\0 and a long tail"}, "'prompt' must not contain U+0000"),
            ("/v1/completions", {"prompt": ["hi\0"]}, "'prompt[0]' must not contain U+0000"),
            ("/v1/completions", {"prompt": "hi", "stop": ["ok", "e\0zzz"]}, "'stop[1]' must not contain U+0000"),
            ("/v1/completions", {"prompt": "hi", "max_tokens\0x": 5}, "a member name of the request"),
            ("/v1/chat/completions", {"messages": [{"role": "user", "content": "a"},
                                                   {"role": "user", "content": "hi\0 tail"}]},
             "'messages[1].content' must not contain U+0000"),
            ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "text", "text": "a\0b"}]}]},
             "'messages[0].content[0].text' must not contain U+0000"),
            ("/v1/chat/completions", {"messages": [{"role": "user\0x", "content": "hi"}]},
             "'messages[0].role' must not contain U+0000"),
        ]
        for path, body, want in table:
            code, ans = http(srv, "POST", path, body, H)
            check(code == 400 and want in ans["error"]["message"], f"{body}: {code} {ans}")
        # A raw NUL byte inside a JSON string, and an escaped backslash before "u0000" (no NUL).
        code, ans = http(srv, "POST", "/v1/completions", b'{"prompt": "a\x00b", "max_tokens": 2}', H)
        check(code == 400 and "'prompt' must not contain U+0000" in ans["error"]["message"], f"raw NUL: {code} {ans}")
        code, ans = http(srv, "POST", "/v1/completions", b'{"prompt": "a\\\\u0000b", "max_tokens": 2}', H)
        check(code == 200 and ans["usage"]["prompt_tokens"] > 3, f"escaped backslash: {code} {ans}")
        # Generated U+0000 (token 3 is <0x00>): the JSON text holds every one ("\\u0000").
        nul = {"max_tokens": 6, "temperature": 0, "logit_bias": {"3": 100}}
        oa = srv.openai()
        u = oa.completions.create(model=MODEL, prompt="Once", **nul)
        check(u.choices[0].text == "\0" * 6, f"completion: {u.choices[0].text!r}")
        st = "".join(c.choices[0].text for c in oa.completions.create(model=MODEL, prompt="Once", stream=True, **nul)
                     if c.choices)
        check(st == "\0" * 6, f"completion stream: {st!r}")
        e = oa.completions.create(model=MODEL, prompt='He said "hi\\".\n', echo=True, **nul)
        check(e.choices[0].text == 'He said "hi\\".\n' + "\0" * 6, f"echo: {e.choices[0].text!r}")
        msgs = [{"role": "user", "content": "hi \"there\""}]
        ch = oa.chat.completions.create(model=MODEL, messages=msgs, **nul)
        check(ch.choices[0].message.content == "\0" * 6, f"chat: {ch.choices[0].message.content!r}")
        cs = "".join(c.choices[0].delta.content or "" for c in
                     oa.chat.completions.create(model=MODEL, messages=msgs, stream=True, **nul) if c.choices)
        check(cs == "\0" * 6, f"chat stream: {cs!r}")
        # Mixed text: escaping matches the decoding of the ids (quotes, newlines, NULs).
        m = oa.completions.create(model=MODEL, prompt="Once", max_tokens=24, temperature=0,
                                  logit_bias={"3": 20, "13": 10, "37": 16})
        with srv.grpc() as g:
            ref = g.generate("Once", max_tokens=24, temperature=0, logit_bias={3: 20.0, 13: 10.0, 37: 16.0})
        check(m.choices[0].text == ref.text and "\0" in ref.text, f"mixed: {m.choices[0].text!r} vs {ref.text!r}")


def group_disconnect(env):
    # Each step waits 3 ms (a test hook): the requests below must still run when their clients go,
    # however fast the CPU (stories260K's 16 x 480 tokens take well under a second on some).
    with Server(env.shardlm, env.model, name="disconnect", env=TS.slow_steps(3)) as srv, \
            srv.grpc() as g:
        oa = srv.openai()
        oa.completions.create(model=MODEL, prompt="hi", max_tokens=2)
        base = wait_until(lambda: settled(g), "idle stats")
        # A stream closed after a few chunks.
        s = oa.completions.create(model=MODEL, prompt="Once upon a time", stream=True, **LONG)
        it = iter(s)
        for _ in range(3):
            next(it)
        mid = wait_until(lambda: (lambda x: x if x.running == 16 else None)(g.server_stats()), "16 running samples")
        check(mid.kv_blocks_free + mid.kv_blocks_cached < mid.kv_blocks_total, "running samples hold blocks")
        s.close()
        st = wait_until(lambda: settled(g), "blocks to return after a stream disconnect")
        check(st.generated_tokens - base.generated_tokens < 16 * 480, "generation stopped early")
        m = metrics(srv)
        check(metric(m, "shardlm_kv_blocks_used") == 0 and metric(m, "shardlm_num_requests_running") == 0,
              "/metrics shows the blocks free")
        check(metric(m, "shardlm_requests_total", api="http", status="CANCELLED") >= 1, "counted as CANCELLED")
        # A unary request whose socket closes.
        body = json.dumps({"prompt": "Once upon a time", "max_tokens": 480, "n": 16, "temperature": 0,
                           "ignore_eos": True}).encode()
        # Four of them (64 samples, 4 x 16 x 480 tokens: several seconds), so that they still run
        # when their clients close: a FIN within a second of the request is a half-close (the
        # client still reads: group hardening); a later one, as here, a client that went away.
        socks = []
        for _ in range(4):
            sock = socket.create_connection(("127.0.0.1", srv.http_port), timeout=10)
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n" % len(body) + body)
            socks.append(sock)
        wait_until(lambda: g.server_stats().running > 0, "the unary requests to run")
        time.sleep(1.5)
        for sock in socks:
            sock.close()
        st2 = wait_until(lambda: settled(g), "blocks to return after a unary disconnect")
        check(st2.generated_tokens - st.generated_tokens < 4 * 16 * 480, "the unary requests stopped early")
        check(oa.completions.create(model=MODEL, prompt="hi", max_tokens=3).usage.completion_tokens == 3, "serving")


def group_sse(env):
    with Server(env.shardlm, env.model, name="sse") as srv:
        body = json.dumps({"model": MODEL, "prompt": "Once upon a time", "max_tokens": 12, "temperature": 0,
                           "stream": True}).encode()
        out = raw(srv, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nConnection: close\r\n"
                  b"Content-Length: %d\r\n\r\n" % len(body) + body)
        head, _, rest = out.partition(b"\r\n\r\n")
        check(head.startswith(b"HTTP/1.1 200") and b"text/event-stream" in head.lower(), f"headers {head!r}")
        # Undo the chunked transfer coding.
        payload, r = b"", rest
        while r:
            size, _, r = r.partition(b"\r\n")
            n = int(size, 16)
            if n == 0:
                break
            payload, r = payload + r[:n], r[n + 2:]
        events = payload.decode().split("\n\n")
        check(events[-1] == "" and events[-2] == "data: [DONE]", f"ends with [DONE]: {events[-3:]}")
        text = ""
        for e in events[:-2]:
            check(e.startswith("data: ") and "\n" not in e, f"one data line per event: {e!r}")
            j = json.loads(e[6:])
            check(j["object"] == "text_completion" and j["model"] == MODEL, f"chunk {j}")
            text += j["choices"][0]["text"]
        code, u = http(srv, "POST", "/v1/completions", {"prompt": "Once upon a time", "max_tokens": 12, "temperature": 0})
        check(text == u["choices"][0]["text"], f"SSE text {text!r} vs unary {u['choices'][0]['text']!r}")


def group_metrics(env):
    with Server(env.shardlm, env.model, name="metrics") as srv, srv.grpc() as g:
        oa = srv.openai()
        m0 = metrics(srv)
        for name in ("shardlm_kv_blocks_total", "shardlm_num_requests_waiting", "shardlm_time_to_first_token_seconds_count",
                     "shardlm_e2e_request_latency_seconds_count", "shardlm_inter_token_latency_seconds_count",
                     "shardlm_num_preemptions_total", "shardlm_prefix_cache_hit_tokens_total"):
            check(any(k[0] == name for k in m0), f"{name} is exported")
        check(metric(m0, "shardlm_kv_blocks_total") > 0, "kv blocks total")
        u = oa.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=10, temperature=0)
        list(oa.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=7,
                                        temperature=0, stream=True, extra_body={"ignore_eos": True}))
        r = g.generate("Once upon a time", max_tokens=5, temperature=0)
        http(srv, "POST", "/v1/completions", {"prompt": "hi", "temperature": -1})
        m1 = wait_until(lambda: (lambda m: m if metric(m, "shardlm_requests_total", api="grpc", status="OK") >=
                                 metric(m0, "shardlm_requests_total", api="grpc", status="OK") + 1 else None)(metrics(srv)),
                        "the gRPC request to be counted")
        d = lambda name, **l: metric(m1, name, **l) - metric(m0, name, **l)  # noqa: E731
        check(d("shardlm_requests_total", api="http", status="OK") == 2, "2 HTTP requests OK")
        check(d("shardlm_requests_total", api="http", status="INVALID_ARGUMENT") == 1, "1 HTTP request invalid")
        check(d("shardlm_requests_total", api="grpc", status="OK") == 1, "1 gRPC request OK")
        check(d("shardlm_generation_tokens_total") == 10 + 7 + 5, f"generation tokens {d('shardlm_generation_tokens_total')}")
        check(d("shardlm_prompt_tokens_total") == u.usage.prompt_tokens + r.prompt_tokens +
              (metric(m1, "shardlm_prompt_tokens_total") - metric(m0, "shardlm_prompt_tokens_total") -
               u.usage.prompt_tokens - r.prompt_tokens), "prompt tokens")
        check(d("shardlm_time_to_first_token_seconds_count") == 3, "3 first tokens")
        check(d("shardlm_e2e_request_latency_seconds_count") == 4, "4 ended requests (one invalid)")
        check(d("shardlm_inter_token_latency_seconds_count") == 9 + 6 + 4, "token gaps (one per token after the first)")
        check(d("shardlm_request_queue_time_seconds_count") == 3, "3 queue times (the invalid request never queued)")
        check(0 <= d("shardlm_request_queue_time_seconds_sum") < d("shardlm_e2e_request_latency_seconds_sum"),
              "queue time within the end-to-end time")
        # Every sample's tokens count: n = 3 samples of 4 tokens are 3 x 3 gaps.
        g.generate("Once upon a time", max_tokens=4, temperature=0.8, n=3, ignore_eos=True)
        m2 = wait_until(lambda: (lambda m: m if metric(m, "shardlm_requests_total", api="grpc", status="OK") >=
                                 metric(m1, "shardlm_requests_total", api="grpc", status="OK") + 1 else None)(metrics(srv)),
                        "the n = 3 request to be counted")
        check(metric(m2, "shardlm_inter_token_latency_seconds_count") -
              metric(m1, "shardlm_inter_token_latency_seconds_count") == 9, "n = 3: 9 token gaps")
        check(metric(m1, "shardlm_time_to_first_token_seconds_bucket", le="+Inf") ==
              metric(m1, "shardlm_time_to_first_token_seconds_count"), "+Inf bucket == count")


def group_malformed(env):
    with Server(env.shardlm, env.model, "--max-message-bytes", "65536", name="malformed") as srv:
        H = {"Content-Type": "application/json"}
        code, ans = http(srv, "POST", "/v1/completions", b'{"prompt": "hi"', H)
        check(code == 400 and "JSON" in ans["error"]["message"], f"invalid JSON {code} {ans}")
        code, ans = http(srv, "POST", "/v1/completions", b'{"prompt": "\xff\xfe"}', H)
        check(code == 400 and "UTF-8" in ans["error"]["message"], f"invalid UTF-8 {code} {ans}")
        code, ans = http(srv, "POST", "/v1/completions", b'[1, 2]', H)
        check(code == 400, f"not an object {code}")
        code, ans = http(srv, "POST", "/v1/completions", b'{"prompt": "hi"}', {"Content-Type": "text/plain"})
        check(code == 415, f"wrong content type {code}")
        # A query parameter is a request field too: none is honoured on these routes, so each is refused by name.
        for method, path, body, name in (
                ("POST", "/v1/completions?api-version=2024-06-01", {"prompt": "hi", "max_tokens": 1}, "'api-version'"),
                ("GET", "/v1/models?limit=2", None, "'limit'")):
            code, ans = http(srv, method, path, body)
            check(code in (400, 501) and name in str(ans), f"{method} {path}: refused by name: {code} {ans}")
        check(http(srv, "GET", "/health?probe=1")[0] == 200, "/health takes a probe's query")
        code, ans = http(srv, "POST", "/v1/completions", json.dumps({"prompt": "x" * 100000}).encode(), H)
        check(code == 413, f"huge body {code}")
        # Truncated: Content-Length promises more than comes, then the client closes.
        out = raw(srv, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 100\r\n\r\n{\"prompt\": \"hi\"", timeout=2)
        check(out == b"" or out.startswith(b"HTTP/1.1 4"), f"truncated body: {out[:80]!r}")
        out = raw(srv, b"GARBAGE\r\n\r\n")
        check(out == b"" or out.split(b" ")[1].startswith(b"4"), f"garbage request line: {out[:80]!r}")
        out = raw(srv, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 99999999999\r\n\r\n", timeout=3)
        check(out == b"" or out.startswith(b"HTTP/1.1 4"), f"absurd Content-Length: {out[:80]!r}")
        code, ans = http(srv, "POST", "/v1/completions", {"prompt": "Once", "max_tokens": 3})
        check(code == 200 and ans["usage"]["completion_tokens"] == 3, f"still serving {code} {ans}")
        code, _ = http(srv, "GET", "/health")
        check(code == 200, "still healthy")


def group_fronts(env):
    """TLS on the HTTP front, the bound on open connections, and SIGTERM draining an HTTP stream."""
    import ssl
    # TLS: --tls-cert / --tls-key serve HTTPS on the HTTP port too; plaintext gets nothing.
    d = TS.self_signed_cert("shardlm-http-tls-")
    if d is not None:
        with Server(env.shardlm, env.model, "--tls-cert", str(d / "cert.pem"), "--tls-key", str(d / "key.pem"),
                    name="http-tls") as srv:
            ctx = ssl.create_default_context(cafile=str(d / "cert.pem"))
            req = urllib.request.Request(f"https://127.0.0.1:{srv.http_port}/v1/completions", method="POST",
                                         data=json.dumps({"prompt": "Once", "max_tokens": 4}).encode(),
                                         headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=30, context=ctx) as r:
                ans = json.loads(r.read())
            check(ans["usage"]["completion_tokens"] == 4, f"HTTPS completion {ans}")
            try:
                out = raw(srv, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n", timeout=3)
            except OSError:  # reset by the TLS layer
                out = b""
            check(not out.startswith(b"HTTP/1.1 200"), f"plaintext HTTP to the TLS port answered {out[:40]!r}")
        shutil.rmtree(d, ignore_errors=True)
    else:
        print("  SKIP http tls: no openssl command")
    # At most --http-max-connections open connections: one more is answered 503; freed, served again.
    with Server(env.shardlm, env.model, "--http-max-connections", "4", name="http-limit") as srv:
        idle = [socket.create_connection(("127.0.0.1", srv.http_port), timeout=5) for _ in range(4)]
        time.sleep(0.3)
        try:  # closed at once: the send, the read or the connect itself may see the reset
            with socket.create_connection(("127.0.0.1", srv.http_port), timeout=5) as extra:
                extra.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
                got = extra.recv(100)
        except OSError:
            got = b""
        check(got.startswith(b"HTTP/1.1 503"), f"a fifth connection past --http-max-connections 4: {got[:40]!r}")
        check(srv.proc.poll() is None, "the server is still up")
        for s in idle:
            s.close()

        def serves_again():  # until the front has seen the closes, a new connection is still reset
            try:
                return http(srv, "GET", "/health", timeout=5)[0] == 200
            except OSError:
                return False
        wait_until(serves_again, "the front to serve again")
    # Drain: a running stream completes after SIGTERM; new requests get 503; exit 0. Each step
    # waits 5 ms (a test hook), so that the drain outlasts the checks below: 400 tokens of this
    # model take ~30 ms on a fast CPU, and the server would be gone before the new request.
    srv = Server(env.shardlm, env.model, "--drain-timeout", "30", name="http-drain",
                 env=TS.slow_steps(5))
    try:
        stream = srv.openai().completions.create(model=MODEL, prompt="Once upon a time", max_tokens=400, temperature=0,
                                                 stream=True, extra_body={"ignore_eos": True})
        it = iter(stream)
        chunks = [next(it)]
        srv.terminate()
        code, ans = wait_until(lambda: (lambda r: r if r[0] == 503 else None)(http(srv, "GET", "/health", timeout=5)),
                               "/health to say 503 while draining")
        code, ans = http(srv, "POST", "/v1/completions", {"prompt": "hi", "max_tokens": 2})
        check(code == 503, f"a new request while draining: {code} {ans}")
        chunks += list(it)
        text = "".join(c.choices[0].text for c in chunks if c.choices)
        finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
        check(finish == ["length"] and len(text) > 100, f"the stream finished during the drain: {finish} {len(text)} chars")
        check(srv.proc.wait(timeout=60) == 0, "exit 0 after the HTTP drain")
        check("SHARDLM_TEST_STEP_DELAY_MS=5" in srv.log_path.read_text(), "the steps were slowed (the test hook)")
    finally:
        srv.stop()


def group_prompts(env):
    with Server(env.shardlm, env.model, name="prompts") as srv, srv.grpc() as g:
        oa = srv.openai()
        ids = g.tokenize("The little dog")
        prompts = ["Once upon a time", ids, "Lily and Tom", [ids[0], *g.tokenize("The sun")[1:]]]
        alone = [oa.completions.create(model=MODEL, prompt=p, max_tokens=24, temperature=0) for p in prompts]
        # Unary: one choice per prompt, each the prompt alone; usage sums over the prompts.
        u = oa.completions.create(model=MODEL, prompt=prompts, max_tokens=24, temperature=0)
        check([c.index for c in u.choices] == [0, 1, 2, 3], f"indices {[c.index for c in u.choices]}")
        for c, a in zip(u.choices, alone):
            check(c.text == a.choices[0].text and c.finish_reason == a.choices[0].finish_reason,
                  f"choice {c.index}: {c.text!r} vs alone {a.choices[0].text!r}")
        check(u.usage.prompt_tokens == sum(a.usage.prompt_tokens for a in alone) and
              u.usage.completion_tokens == sum(a.usage.completion_tokens for a in alone), f"usage {u.usage}")
        # Streamed: chunks of every prompt, each with its index, one [DONE] (raw SSE below).
        chunks = list(oa.completions.create(model=MODEL, prompt=prompts, max_tokens=24, temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
        for i, a in enumerate(alone):
            t = "".join(c.choices[0].text for c in chunks if c.choices and c.choices[0].index == i)
            check(t == a.choices[0].text, f"stream prompt {i}: {t!r} vs {a.choices[0].text!r}")
            fin = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].index == i]
            check(fin[-1] == a.choices[0].finish_reason and all(f is None for f in fin[:-1]), f"finish of {i}: {fin}")
        check(chunks[-1].choices == [] and chunks[-1].usage.prompt_tokens == u.usage.prompt_tokens and
              chunks[-1].usage.completion_tokens == u.usage.completion_tokens, f"usage chunk {chunks[-1]}")
        body = json.dumps({"prompt": prompts[:2], "max_tokens": 8, "temperature": 0, "stream": True}).encode()
        out = raw(srv, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Connection: close\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        check(out.count(b"data: [DONE]") == 1 and b'"index":1' in out and b'"index":0' in out, f"raw SSE {out[-200:]!r}")
        # n > 1: prompt-major indices (prompt i, sample j is i * n + j); greedy samples are equal.
        un = oa.completions.create(model=MODEL, prompt=prompts[:3], max_tokens=12, temperature=0, n=2)
        check([c.index for c in un.choices] == list(range(6)), f"n=2 indices {[c.index for c in un.choices]}")
        short = [oa.completions.create(model=MODEL, prompt=p, max_tokens=12, temperature=0) for p in prompts[:3]]
        for c in un.choices:
            check(c.text == short[c.index // 2].choices[0].text, f"n=2 choice {c.index}: {c.text!r}")
        sn = list(oa.completions.create(model=MODEL, prompt=prompts[:3], max_tokens=12, temperature=0, n=2, stream=True))
        for i in range(6):
            t = "".join(c.choices[0].text for c in sn if c.choices and c.choices[0].index == i)
            check(t == un.choices[i].text, f"n=2 stream choice {i}: {t!r} vs {un.choices[i].text!r}")
        seeded = [oa.completions.create(model=MODEL, prompt=prompts[:2], max_tokens=12, temperature=1.0, n=3, seed=5)
                  for _ in range(2)]
        check([c.text for c in seeded[0].choices] == [c.text for c in seeded[1].choices], "seeded prompts repeat")
        # A single-item list is that prompt; a list of one list of ids too.
        one = oa.completions.create(model=MODEL, prompt=[prompts[0]], max_tokens=24, temperature=0)
        check(one.choices[0].text == alone[0].choices[0].text and len(one.choices) == 1, "a list of one string")
        one = oa.completions.create(model=MODEL, prompt=[ids], max_tokens=24, temperature=0)
        check(one.choices[0].text == alone[1].choices[0].text and len(one.choices) == 1, "a list of one list of ids")
        # An invalid prompt among valid ones: 400 naming it, and nothing was submitted.
        before = wait_until(lambda: settled(g), "idle").requests_submitted
        for body, want in (
                ({"prompt": ["Once", [1, 99999], "Lily"]}, "prompt[1]"),                   # engine_validate
                ({"prompt": ["Once", "Lily", []]}, "prompt[2]"),                           # empty
                ({"prompt": ["Once", "Lily " * 600]}, "prompt[1]"),                        # beyond the context
                ({"prompt": ["Once", 7]}, "'prompt[1]' must be a string or a list of token ids"),
                ({"prompt": [[1, 2], [3, "x"]]}, "'prompt[1]' must be a string or a list of token ids"),
                ({"prompt": [1, "x"]}, "'prompt' must be a string or a list of token ids"),
                ({"prompt": ["a"] * 65}, "at most 64 prompts"),
                ({"prompt": {"a": 1}}, "'prompt' must be a string, a list of strings")):
            for stream in (False, True):
                code, ans = http(srv, "POST", "/v1/completions", dict(body, max_tokens=4, stream=stream))
                check(code == 400 and want in ans["error"]["message"], f"{body}: {code} {ans}")
        check(g.server_stats().requests_submitted == before, "nothing was submitted for the invalid requests")
        code, ans = http(srv, "POST", "/v1/completions", {"prompt": ["a"] * 64, "max_tokens": 1})
        check(code == 200 and len(ans["choices"]) == 64, f"64 prompts: {code}")
        # A stream of several long prompts that the client closes: every block comes back.
        s = oa.completions.create(model=MODEL, prompt=prompts, stream=True, max_tokens=480, temperature=0, n=4,
                                  extra_body={"ignore_eos": True})
        it = iter(s)
        seen = {next(it).choices[0].index for _ in range(40)}
        check(len(seen) > 1, f"chunks of several prompts interleave: {seen}")
        wait_until(lambda: g.server_stats().running == 16, "16 running samples")
        s.close()
        st = wait_until(lambda: settled(g), "blocks to return after a disconnect")
        check(st.requests_finished == st.requests_submitted, "every request finished")
        check(oa.completions.create(model=MODEL, prompt="hi", max_tokens=3).usage.completion_tokens == 3, "serving")
    # A prompt that the engine's queue cannot take: 429, and the prompts submitted before it
    # are cancelled (their blocks and queue places come back).
    with Server(env.shardlm, env.model, "--max-seqs", "2", "--max-queue", "4", name="prompts-queue") as srv, \
            srv.grpc() as g:
        oa = srv.openai()
        busy = oa.completions.create(model=MODEL, prompt="Once", stream=True, max_tokens=480, temperature=0, n=2,
                                     extra_body={"ignore_eos": True})
        it = iter(busy)
        next(it)
        wait_until(lambda: g.server_stats().running == 2, "the running slots to fill")
        # Two samples of another request wait; then 3 prompts (3 samples, which the queue of 4
        # could hold: a 6-sample request would be invalid, group hardening) find 2 places.
        filler = []
        t = threading.Thread(target=lambda: filler.append(
            http(srv, "POST", "/v1/completions", {"prompt": "Tom", "n": 2, "max_tokens": 4})))
        t.start()
        wait_until(lambda: g.server_stats().waiting == 2, "two samples to wait")
        code, ans = http(srv, "POST", "/v1/completions", {"prompt": ["Once", "Lily", "Sue"], "max_tokens": 4})
        check(code == 429 and "other prompts were cancelled" in ans["error"]["message"], f"full queue: {code} {ans}")
        check(wait_until(lambda: g.server_stats().waiting == 2, "the cancelled prompts to leave the queue"), "queue")
        busy.close()
        t.join(timeout=60)
        check(filler and filler[0][0] == 200, f"the waiting request was served: {filler}")
        st = wait_until(lambda: settled(g), "blocks to return")
        check(st.requests_finished == st.requests_submitted, "every request finished")
        code, ans = http(srv, "POST", "/v1/completions", {"prompt": ["Once", "Lily"], "n": 2, "max_tokens": 4})
        check(code == 200 and len(ans["choices"]) == 4, f"serving after the refusal: {code}")


def group_echo(env):
    with Server(env.shardlm, env.model, name="echo") as srv, srv.grpc() as g:
        oa = srv.openai()
        prompt = "Once upon a time"
        ids = g.tokenize(prompt)
        plain = oa.completions.create(model=MODEL, prompt=prompt, max_tokens=10, temperature=0, logprobs=2)
        # echo: the prompt, then the same completion; token-id prompts echo their decoded text.
        e = oa.completions.create(model=MODEL, prompt=prompt, max_tokens=10, temperature=0, echo=True)
        check(e.choices[0].text == prompt + plain.choices[0].text, f"echo {e.choices[0].text!r}")
        ei = oa.completions.create(model=MODEL, prompt=ids, max_tokens=10, temperature=0, echo=True)
        check(ei.choices[0].text == g.detokenize(ids) + plain.choices[0].text, f"echo of ids {ei.choices[0].text!r}")
        # echo with logprobs: the prompt's tokens first, the first log-probability null, the rest
        # gRPC's prompt_logprobs of the same prompt; then the completion's as without echo.
        ref = g.generate(prompt, max_tokens=1, temperature=0, prompt_logprobs=2)
        want_lp = [x.logprob for x in ref.prompt_logprobs]
        check(len(want_lp) == len(ids), "gRPC prompt logprobs")
        pieces = [g.detokenize([i]) for i in ids]

        def check_lp(L, gen, what):
            n = len(ids)
            check(len(L.tokens) == len(L.token_logprobs) == len(L.top_logprobs) == len(L.text_offset) == n + len(gen.tokens),
                  f"{what}: lengths {L}")
            check(L.token_logprobs[0] is None and L.top_logprobs[0] is None, f"{what}: the first prompt token has none")
            for i in range(1, n):
                check(abs(L.token_logprobs[i] - want_lp[i]) < 1e-4, f"{what}: prompt token {i}: {L.token_logprobs[i]} "
                      f"vs gRPC {want_lp[i]}")
                check(len(L.top_logprobs[i]) >= 1 and max(L.top_logprobs[i].values()) >= L.token_logprobs[i] - 1e-5,
                      f"{what}: top of prompt token {i}: {L.top_logprobs[i]}")
                check(L.tokens[i].strip() == pieces[i].strip(), f"{what}: token {i} {L.tokens[i]!r} vs {pieces[i]!r}")
            check(L.tokens[n:] == gen.tokens and all(abs(a - b) < 1e-4 for a, b in zip(L.token_logprobs[n:], gen.token_logprobs)),
                  f"{what}: completion part {L.tokens[n:]} vs {gen.tokens}")
            check(L.text_offset[n] == len(prompt) and L.text_offset == sorted(L.text_offset), f"{what}: offsets {L.text_offset}")

        el = oa.completions.create(model=MODEL, prompt=prompt, max_tokens=10, temperature=0, echo=True, logprobs=2)
        check(el.choices[0].text == e.choices[0].text, "echo text with logprobs")
        check_lp(el.choices[0].logprobs, plain.choices[0].logprobs, "unary")
        # Streamed: the first chunk of each sample carries the prompt and its log-probabilities.
        for n in (1, 2):
            chunks = list(oa.completions.create(model=MODEL, prompt=prompt, max_tokens=10, temperature=0, echo=True,
                                                logprobs=2, n=n, stream=True))
            for j in range(n):
                mine = [c.choices[0] for c in chunks if c.choices and c.choices[0].index == j]
                check("".join(c.text for c in mine) == e.choices[0].text, f"stream echo text, sample {j}: {[c.text for c in mine]} vs {e.choices[0].text!r}")
                tokens = sum((c.logprobs.tokens for c in mine), [])
                check(tokens[:len(ids)] == el.choices[0].logprobs.tokens[:len(ids)] and mine[0].logprobs.token_logprobs[0] is None,
                      f"stream sample {j}: prompt tokens {tokens}")
                lps = sum((c.logprobs.token_logprobs for c in mine), [])
                check(all(abs(a - b) < 1e-4 for a, b in zip(lps[1:], el.choices[0].logprobs.token_logprobs[1:])) and
                      len(lps) == len(el.choices[0].logprobs.token_logprobs), f"stream sample {j}: logprobs")
        # Several prompts, n = 2: each choice echoes its own prompt.
        m = oa.completions.create(model=MODEL, prompt=[prompt, ids, "Lily"], max_tokens=6, temperature=0, echo=True,
                                  logprobs=0, n=2)
        for c in m.choices:
            p = [prompt, g.detokenize(ids), "Lily"][c.index // 2]
            check(c.text.startswith(p) and c.logprobs.token_logprobs[0] is None and c.logprobs.top_logprobs is None,
                  f"choice {c.index}: {c.text!r}")
        # The two run in one batch at different rows: the sums inside the kernels may round
        # differently (seen: 8e-7), so equal within 1e-5, not bit for bit.
        a0, a2 = m.choices[0].logprobs.token_logprobs, m.choices[2].logprobs.token_logprobs
        check(len(a0) == len(a2) and a0[0] is None and a2[0] is None and
              all(abs(x - y) < 1e-5 for x, y in zip(a0[1:], a2[1:])), "the same prompt, ids or text")
        # max_tokens 0 with echo and logprobs scores the prompt.
        sc = oa.completions.create(model=MODEL, prompt=prompt, max_tokens=0, temperature=0, echo=True, logprobs=0)
        check(sc.choices[0].text == prompt and sc.usage.completion_tokens == 0, f"scoring: {sc.choices[0]}")
        check(all(abs(a - b) < 1e-4 for a, b in zip(sc.choices[0].logprobs.token_logprobs[1:], want_lp[1:])) and
              len(sc.choices[0].logprobs.token_logprobs) == len(ids), f"scoring logprobs {sc.choices[0].logprobs}")
        code, ans = http(srv, "POST", "/v1/completions", {"prompt": prompt, "max_tokens": 0, "echo": True})
        check(code == 400 and "max_tokens" in ans["error"]["message"], f"max_tokens 0 without logprobs: {code} {ans}")


def cpu_seconds(pid):
    """A process's user + system CPU time: a bound on work done that does not depend on the load."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def connect(srv, source="127.0.0.1", timeout=10):
    """A TCP connection to the HTTP front from a chosen loopback source address (127.0.0.0/8 is
    all loopback on Linux: distinct client addresses without network namespaces)."""
    return socket.create_connection(("127.0.0.1", srv.http_port), timeout=timeout, source_address=(source, 0))


def read_answer(sock, timeout):
    """The bytes of one HTTP answer (head and Content-Length body) or what came before the
    server closed, within timeout seconds."""
    sock.settimeout(timeout)
    out = b""
    try:
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            out += chunk
            head, sep, body = out.partition(b"\r\n\r\n")
            if sep:
                n = [x for x in head.split(b"\r\n") if x.lower().startswith(b"content-length:")]
                if n and len(body) >= int(n[0].split(b":")[1]):
                    break
    except socket.timeout:
        pass
    return out


def closed_by_server(sock, timeout):
    """True when the server closes sock (end of file or reset) within timeout seconds."""
    sock.settimeout(timeout)
    try:
        while sock.recv(4096):
            pass
        return True
    except socket.timeout:
        return False
    except OSError:
        return True


def post_head(path, length, extra=b""):
    return (b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n" % (path, length)
            + extra + b"\r\n")


def group_hardening(env):
    """Issue 35's HTTP defects, each checked as the probe found it: what is decided before a
    body is read (3), slow clients and the per-address cap (4), half-closed clients (8), the
    JSON parser differential (9), methods and escaped routes (10), the linear stop lists (5),
    a request that can never be queued (11)."""
    keys = Path(tempfile.mkdtemp()) / "keys"
    keys.write_text("secret-1\n")
    with Server(env.shardlm, env.model, "--api-key-file", str(keys), "--max-queue", "32", name="hardening") as srv:
        KEY = b"Authorization: Bearer secret-1\r\n"
        # (3) Refused from the headers alone: the answer comes while the 4 MB body is still unsent.
        for extra, want in ((b"", b"HTTP/1.1 401"), (b"Authorization: Bearer wrong\r\n", b"HTTP/1.1 401")):
            with connect(srv) as s:
                s.sendall(post_head(b"/v1/completions", 4 << 20, extra))
                out = read_answer(s, 5)
                check(out.startswith(want), f"no key, body unsent: {out[:60]!r}")
        with connect(srv) as s:
            s.sendall(post_head(b"/v1/completions", 64 << 20, KEY))
            out = read_answer(s, 5)
            check(out.startswith(b"HTTP/1.1 413"), f"a declared body over --max-message-bytes: {out[:60]!r}")
        with connect(srv) as s:
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\nContent-Length: 4194304\r\n"
                      + KEY + b"\r\n")
            out = read_answer(s, 5)
            check(out.startswith(b"HTTP/1.1 415"), f"wrong content type before the body: {out[:60]!r}")
        # (10) Methods and escaped routes.
        H = {"Authorization": "Bearer secret-1"}
        for path in ("/v1/models", "/health", "/metrics", "/v1/completions", "/v1/chat/completions"):
            for method in ("PUT", "DELETE", "PATCH", "OPTIONS", "FROB"):
                with connect(srv) as s:
                    s.sendall(b"%s %s HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer secret-1\r\nContent-Length: 0\r\n\r\n"
                              % (method.encode(), path.encode()))
                    out = read_answer(s, 5)
                head = out.partition(b"\r\n\r\n")[0].lower()
                check(out.startswith(b"HTTP/1.1 405") and b"\r\nallow: " in head, f"{method} {path}: {out[:120]!r}")
        for path in ("/v1/models", "/health", "/metrics"):
            code, _ = http(srv, "GET", path, None, H)
            check(code == 200, f"GET {path}: {code}")
        for path in ("/v1/completions%00", "/v1/completions%2F", "/v1/%63ompletions"):
            code, ans = http(srv, "POST", path, {"prompt": "hi", "max_tokens": 1}, H)
            check(code == 404, f"POST {path} is no route: {code} {ans}")
        # (9) One reading of a body: duplicate names, trailing bytes, token ids as keys.
        HJ = dict(H, **{"Content-Type": "application/json"})
        table = [
            (b'{"prompt": "hi", "max_tokens": 100000, "max_tokens": 1}', "'max_tokens' appears twice"),
            (b'{"prompt": "hi", "stream_options": {"include_usage": true, "include_usage": false}}', "appears twice"),
            (b'{"prompt": "hi", "max_tokens": 1} {"prompt": "x"}', "after its JSON value"),
            (b'{"prompt": "hi", "max_tokens": 1}xyz', "after its JSON value"),
        ] + [(json.dumps({"prompt": "hi", "max_tokens": 1, "logit_bias": {k: 1}}).encode(), "is not a token id")
             for k in ("05", " 5", "+5", "5 ", "-0", "5.0", "0x5", "")]
        for body, want in table:
            code, ans = http(srv, "POST", "/v1/completions", body, HJ)
            check(code == 400 and want in ans["error"]["message"], f"{body[:60]!r}: {code} {ans}")
        code, ans = http(srv, "POST", "/v1/completions", b'{"prompt": "hi", "max_tokens": 1, "logit_bias": {"5": 1, "0": -1}}\n ',
                         HJ)
        check(code == 200, f"canonical ids and trailing whitespace: {code} {ans}")
        # (5) Long stop lists are refused by their count, in linear time: 200,000 ids took 31 s of
        # server CPU when the list was walked by index.
        cpu0 = cpu_seconds(srv.proc.pid)
        for name, items in (("stop_token_ids", [5] * 200000), ("stop", ["a"] * 200000)):
            code, ans = http(srv, "POST", "/v1/completions", {"prompt": "hi", name: items}, H)
            check(code == 400 and "at most" in ans["error"]["message"], f"{name} x 200000: {code} {ans}")
        spent = cpu_seconds(srv.proc.pid) - cpu0
        check(spent < 3.0, f"two 200,000-item lists cost {spent:.1f} s of server CPU")
        # (11) A request that can never be queued is invalid (400), not a retryable 429.
        code, ans = http(srv, "POST", "/v1/completions", {"prompt": ["a", "b", "c"], "n": 16, "max_tokens": 1}, H)
        check(code == 400 and "--max-queue" in ans["error"]["message"], f"48 samples vs --max-queue 32: {code} {ans}")
        code, ans = http(srv, "POST", "/v1/completions", {"prompt": ["a", "b"], "n": 16, "max_tokens": 1}, H)
        check(code == 200, f"32 samples fit --max-queue 32: {code} {ans}")
        # (8) A client that half-closes after its request gets its whole answer, unary and streamed.
        body = json.dumps({"prompt": "Once upon a time", "max_tokens": 40, "temperature": 0}).encode()
        _, want = http(srv, "POST", "/v1/completions", body, HJ)
        for stream in (False, True):
            b = json.dumps({"prompt": "Once upon a time", "max_tokens": 40, "temperature": 0, "stream": stream}).encode()
            with connect(srv) as s:
                s.sendall(post_head(b"/v1/completions", len(b), KEY + b"Connection: close\r\n") + b)
                s.shutdown(socket.SHUT_WR)
                out = b""
                s.settimeout(30)
                while True:
                    chunk = s.recv(65536)
                    if not chunk:
                        break
                    out += chunk
            check(out.startswith(b"HTTP/1.1 200"), f"half-closed, stream={stream}: {out[:80]!r}")
            if stream:
                check(b"data: [DONE]" in out and b'"finish_reason":"length"' in out, f"the stream ran to its end: {out[-200:]!r}")
            else:
                got = json.loads(out.partition(b"\r\n\r\n")[2])
                check(got["choices"][0]["text"] == want["choices"][0]["text"], "the half-closed client's answer")
    # (4) Slow clients. A header sent a byte at a time is cut at --http-header-timeout, a body at
    # --http-body-timeout (the idle timeout, 300 s, never comes into it); meanwhile the fifth
    # connection from one address and the thirteenth in all are answered 503, and others served.
    with Server(env.shardlm, env.model, "--http-header-timeout", "5", "--http-body-timeout", "5",
                "--http-max-connections", "12", "--http-max-connections-per-address", "4", name="slow-clients") as srv:
        KEY = b""
        slow = [connect(srv) for _ in range(4)]
        for s in slow:
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
        with connect(srv) as s:
            s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            out = read_answer(s, 5)
            check(out.startswith(b"HTTP/1.1 503") and b"too_many_connections" in out and b"-per-address" in out,
                  f"a fifth connection from 127.0.0.1: {out[:200]!r}")
        others = [connect(srv, f"127.0.0.{i}") for i in (2, 2, 2, 2, 3, 3, 3, 3)]
        with connect(srv, "127.0.0.4") as s:
            s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            out = read_answer(s, 5)
            check(out.startswith(b"HTTP/1.1 503") and b"--http-max-connections)" in out, f"a thirteenth connection: {out[:200]!r}")
        slow_body = others.pop()
        slow_body.sendall(post_head(b"/v1/completions", 100, KEY) + b'{"prompt"')
        for s in slow:  # a byte now and then keeps an idle timer alive, not a deadline
            s.sendall(b"X")
        check(all(closed_by_server(s, 15) for s in slow + [slow_body]), "slow headers and a slow body were cut")
        for s in slow + others + [slow_body]:
            s.close()
        wait_until(lambda: http(srv, "GET", "/health", timeout=5)[0] == 200, "the front to serve again")
        # A connection the client closed frees its address's slot once the server reads the close,
        # which may come a poll after the next request (a clean-clone run got one 503 here): a 503
        # too_many_connections is retried for up to 5 s, anything else is the answer.
        for _ in range(50):
            code, ans = http(srv, "POST", "/v1/completions", {"prompt": "Once", "max_tokens": 3}, H)
            if not (code == 503 and "too_many_connections" in json.dumps(ans)):
                break
            time.sleep(0.1)
        check(code == 200 and ans["usage"]["completion_tokens"] == 3, f"served after the slow clients: {code} {ans}")
    # (4b) One address's idle sockets cannot fill the daemon (libmicrohttpd's limit, 8 + 16 here,
    # counts refused connections too): 40 from 127.0.0.1 that never send a byte (4 admitted, 8
    # kept for their 503, the rest shut at once), and another address is still served.
    with Server(env.shardlm, env.model, "--http-max-connections", "8", "--http-max-connections-per-address", "4",
                name="one-address") as srv:
        idle = [connect(srv) for _ in range(40)]
        time.sleep(0.5)
        with connect(srv, "127.0.0.5") as s:
            s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            out = read_answer(s, 5)
        check(out.startswith(b"HTTP/1.1 200"), f"another address served beside 40 idle sockets of one: {out[:60]!r}")
        for s in idle:
            s.close()


GROUPS = {"openai": group_openai, "errors": group_errors, "disconnect": group_disconnect, "sse": group_sse,
          "metrics": group_metrics, "malformed": group_malformed, "nul": group_nul, "fronts": group_fronts,
          "prompts": group_prompts, "echo": group_echo, "hardening": group_hardening}


def group_verify_prefix(env):
    """--verify-prefix-cache 1 (issue 33): every prompt served partly from the prefix cache is
    recomputed without it and its first logits compared. A clean cache: every hit verified, no
    mismatch. A cache corrupted on purpose (SHARDLM_TEST_PREFIX_CACHE_FAULT=1 zeroes the first
    reused block of each hit): every hit a mismatch, logged with the request id. A fraction
    outside [0, 1] is refused at start."""
    story = ("Once upon a time, there was a little girl named Lily. She loved to play outside in the park "
             "with her friends and her dog.")
    for fault in (False, True):
        e = dict(os.environ, SHARDLM_TEST_PREFIX_CACHE_FAULT="1") if fault else None
        with Server(env.shardlm, env.model, "--verify-prefix-cache", "1", name=f"verify-{int(fault)}", env=e) as srv:
            oa = srv.openai()
            m0 = metrics(srv)
            for tail in ("", " One day", " She"):
                oa.completions.create(model=MODEL, prompt=story + tail, max_tokens=4, temperature=0)
            m1 = metrics(srv)
            d = lambda name: metric(m1, name) - metric(m0, name)  # noqa: E731
            check(d("shardlm_prefix_cache_hit_tokens_total") >= 32, f"hits: {d('shardlm_prefix_cache_hit_tokens_total')} tokens")
            check(d("shardlm_prefix_cache_verified_total") == 2, f"the 2 hits verified: {d('shardlm_prefix_cache_verified_total')}")
            check(d("shardlm_prefix_cache_verify_skipped_total") == 0, "none skipped")
            mism = d("shardlm_prefix_cache_mismatch_total")
            with srv.grpc() as g:
                st = g.server_stats()
            check((st.prefix_cache_verified, st.prefix_cache_mismatches, st.prefix_cache_verify_skipped)
                  == (metric(m1, "shardlm_prefix_cache_verified_total"), metric(m1, "shardlm_prefix_cache_mismatch_total"),
                      metric(m1, "shardlm_prefix_cache_verify_skipped_total"))
                  and abs(st.prefix_cache_max_abs_diff - metric(m1, "shardlm_prefix_cache_max_abs_diff")) <= 1e-6,
                  f"GetServerStats carries /metrics' verification counters: {st.prefix_cache_verified}, "
                  f"{st.prefix_cache_mismatches}, {st.prefix_cache_verify_skipped}, {st.prefix_cache_max_abs_diff}")
            log = srv.log_path.read_text()
            if fault:
                check(mism == 2, f"a corrupted cache: every hit a mismatch ({mism})")
                check(log.count("prefix cache mismatch") == 2, "each mismatch logged")
                check(len(re.findall(r"req=\S+ prefix cache mismatch", log)) == 2, "with the request id")
            else:
                check(mism == 0, f"a clean cache: no mismatch ({mism}; log: {log[-300:]})")
                check(metric(m1, "shardlm_prefix_cache_max_abs_diff") <= 1e-3,
                      f"largest difference {metric(m1, 'shardlm_prefix_cache_max_abs_diff')}")
    for bad in ("1.5", "-0.1", "x", "nan"):
        p = subprocess.run([env.shardlm, "serve", "--model", str(env.model), "--verify-prefix-cache", bad],
                           capture_output=True, text=True, timeout=30)
        check(p.returncode != 0 and "--verify-prefix-cache must be a fraction" in p.stderr,
              f"--verify-prefix-cache {bad}: rc {p.returncode} {p.stderr[-200:]}")


GROUPS["verify_prefix"] = group_verify_prefix


def group_cache_salt(env):
    """vLLM's cache_salt: the prefix cache shares a prompt's blocks only between requests of the same
    salt (usage.prompt_tokens_details.cached_tokens says what was reused; Anthropic's Messages
    cache_read_input_tokens, the Responses API input_tokens_details), the answers unchanged;
    --prefix-cache-per-key shares them only within one API key's owner; bad salts and the flag
    without keys are refused by name."""
    story = ("Once upon a time, there was a little girl named Lily. She loved to play outside in the park "
             "with her friends and her dog.")

    def ask(srv, salt=None, key=None, path="/v1/completions"):
        body = {"prompt": story, "max_tokens": 8, "temperature": 0}
        if path.endswith("chat/completions"):
            body = {"messages": [{"role": "user", "content": story}], "max_tokens": 8, "temperature": 0}
        if salt is not None:
            body["cache_salt"] = salt
        code, ans = http(srv, "POST", path, body, headers={"Authorization": f"Bearer {key}"} if key else None)
        check(code == 200, f"cache_salt {salt!r} key {key}: {code} {str(ans)[:200]}")
        u = ans.get("usage", {}) if isinstance(ans, dict) else {}
        first = ans["choices"][0] if code == 200 else {}
        return (u.get("prompt_tokens_details") or {}).get("cached_tokens", -1), first.get("text", first.get("message"))

    with Server(env.shardlm, env.model, name="cache-salt") as srv:
        s1a, t1 = ask(srv, "salt-one")
        s1b, t2 = ask(srv, "salt-one")
        s2, t3 = ask(srv, "salt-two")
        n1, t4 = ask(srv)
        n2, t5 = ask(srv)
        c1, _ = ask(srv, "salt-one", path="/v1/chat/completions")
        c2, _ = ask(srv, "salt-one", path="/v1/chat/completions")
        c3, _ = ask(srv, "salt-three", path="/v1/chat/completions")

        def ask_more(path, salt):  # Anthropic's Messages and the Responses API take the salt too
            if path == "/v1/messages":
                body = {"max_tokens": 8, "temperature": 0, "messages": [{"role": "user", "content": story}]}
            else:
                body = {"max_output_tokens": 8, "temperature": 0, "input": story, "store": False}
            code, ans = http(srv, "POST", path, dict(body, cache_salt=salt))
            check(code == 200, f"cache_salt {salt!r} on {path}: {code} {str(ans)[:200]}")
            u = ans.get("usage", {}) if code == 200 else {}
            if path == "/v1/messages":  # computed + read from the cache = the prompt
                return u.get("cache_read_input_tokens", -1), u.get("input_tokens", 0) + u.get("cache_read_input_tokens", 0)
            return (u.get("input_tokens_details") or {}).get("cached_tokens", -1), u.get("input_tokens", 0)
        an = [ask_more("/v1/messages", salt) for salt in ("an-salt", "an-salt", "an-other")]
        rs = [ask_more("/v1/responses", salt) for salt in ("rs-salt", "rs-salt", "rs-other")]
        code, ans = http(srv, "POST", "/v1/messages", {"max_tokens": 2, "messages": [{"role": "user", "content": "hi"}],
                                                       "cache_salt": ""})
        check(code == 400 and "'cache_salt' must be 1 to 1024 bytes" in json.dumps(ans),
              f"an empty cache_salt on /v1/messages: {code} {str(ans)[:160]}")
        check(an[0][0] == 0 and an[1][0] >= 16 and an[2][0] == 0 and an[0][1] == an[1][1] == an[2][1] > 16,
              f"cache_salt on /v1/messages (cache_read_input_tokens, prompt): {an}")
        check(rs[0][0] == 0 and rs[1][0] >= 16 and rs[2][0] == 0, f"cache_salt on /v1/responses (cached, input): {rs}")
        with srv.grpc() as g:  # GenerateRequest / ChatRequest cache_salt
            g1 = g.generate(story, max_tokens=8, temperature=0, cache_salt="grpc-salt").cached_prompt_tokens
            g2 = g.generate(story, max_tokens=8, temperature=0, cache_salt="grpc-salt").cached_prompt_tokens
            g3 = g.generate(story, max_tokens=8, temperature=0, cache_salt="salt-one").cached_prompt_tokens  # HTTP's
            h1 = g.chat([("user", story)], max_tokens=8, temperature=0, cache_salt="grpc-chat").cached_prompt_tokens
            h2 = g.chat([("user", story)], max_tokens=8, temperature=0, cache_salt="grpc-chat").cached_prompt_tokens
            try:
                g.generate("hi", max_tokens=2, cache_salt="x" * 1025)
                long_salt = "accepted"
            except Exception as e:  # noqa: BLE001 (grpc.RpcError: the client's module imports grpc)
                long_salt = f"{e.code().name} {e.details()}" if hasattr(e, "code") else repr(e)
        check(g1 == 0 and g2 >= 16 and g3 >= 16 and h1 == 0 and h2 >= 16,
              f"cache_salt over gRPC: {g1}, {g2}, HTTP's salt {g3}; chat {h1}, {h2}")
        check(long_salt.startswith("INVALID_ARGUMENT") and "cache_salt must be at most 1024 bytes" in long_salt,
              f"a gRPC cache_salt of 1025 bytes: {long_salt}")
        for bad, want in (("", "'cache_salt' must be 1 to 1024 bytes"), (5, "'cache_salt' must be a string"),
                          ("x" * 1025, "'cache_salt' must be 1 to 1024 bytes")):
            code, ans = http(srv, "POST", "/v1/completions", {"prompt": "hi", "max_tokens": 2, "cache_salt": bad})
            check(code == 400 and want in json.dumps(ans), f"cache_salt {str(bad)[:10]!r}: {code} {str(ans)[:160]}")
    check(s1a == 0 and s1b >= 16 and s2 == 0 and n1 == 0 and n2 >= 16,
          f"cache_salt: the blocks one salt cached serve that salt again ({s1b} tokens) and nobody else "
          f"(another salt {s2}, none {n1}; none again {n2})")
    check(t1 == t2 == t3 == t4 == t5, "cache_salt: the answers are the same whatever the cache served")
    check(c1 == 0 and c2 >= 16 and c3 == 0, f"cache_salt on chat: {c1}, {c2}, another salt {c3}")
    d = Path(tempfile.mkdtemp(prefix="shardlm-salt-"))
    (d / "keys").write_text("key-a\nkey-b\n")
    with Server(env.shardlm, env.model, "--api-key-file", str(d / "keys"), name="cache-shared") as srv:
        shared = [ask(srv, key=k)[0] for k in ("key-a", "key-b")]
    with Server(env.shardlm, env.model, "--api-key-file", str(d / "keys"), "--prefix-cache-per-key",
                name="cache-per-key") as srv:
        per_key = [ask(srv, key=k)[0] for k in ("key-a", "key-b", "key-a", "key-b")]
    check(shared[0] == 0 and shared[1] >= 16,
          f"without --prefix-cache-per-key one key's prompt serves another's ({shared[1]} tokens)")
    check(per_key[:2] == [0, 0] and per_key[2] >= 16 and per_key[3] >= 16,
          f"--prefix-cache-per-key: each key's cached blocks serve that key alone ({per_key})")
    for extra, want in ((["--prefix-cache-per-key"], "--prefix-cache-per-key needs --api-key-file"),
                        (["--prefix-cache-per-key", "--no-prefix-caching", "--api-key-file", str(d / "keys")],
                         "choose one")):
        p = subprocess.run([env.shardlm, "serve", "--model", str(env.model), *extra], capture_output=True, text=True,
                           timeout=30)
        check(p.returncode == 2 and want in p.stderr, f"serve {' '.join(extra[:2])}: rc {p.returncode} {p.stderr[-200:]}")
    shutil.rmtree(d, ignore_errors=True)


GROUPS["cache_salt"] = group_cache_salt


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shardlm", required=True)
    ap.add_argument("groups", nargs="*")
    args = ap.parse_args()
    assets = Path(os.environ.get("SHARDLM_ASSETS", ROOT.parent / "shared/assets"))
    src = assets / "stories260K"
    if not (src / "stories260K.bin").exists() or not (src / "tok512.model").exists():
        print(f"SKIP: stories260K not found under {assets} (set SHARDLM_ASSETS)")
        return SKIP
    work = Path(tempfile.mkdtemp(prefix="shardlm-httptest-"))

    class Env:
        pass

    env = Env()
    env.shardlm = args.shardlm
    env.model = work / MODEL
    TS.convert_stories260k(args.shardlm, src, env.model)
    failed = passed = 0
    try:
        for name in args.groups or list(GROUPS):
            t0 = time.time()
            try:
                GROUPS[name](env)
                passed += 1
                print(f"PASS {name} ({time.time() - t0:.1f} s)")
            except Exception as e:  # noqa: BLE001 - reported, then the next group runs
                failed += 1
                print(f"FAIL {name}: {e}")
                for log in sorted(LOG_DIR.glob("*.log")):
                    if log.stat().st_mtime >= t0:
                        print(f"--- {log.name} (last lines)\n" + "\n".join(log.read_text().splitlines()[-15:]))
                if not isinstance(e, Failure):
                    traceback.print_exc()
            finally:
                for p in SERVERS:
                    if p.poll() is None:
                        p.kill()
                        p.wait(timeout=10)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if not failed:
            shutil.rmtree(LOG_DIR, ignore_errors=True)
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
