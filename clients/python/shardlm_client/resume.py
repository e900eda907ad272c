"""clients/python/shardlm_client/resume.py - OpenAI-compatible HTTP requests that survive a server
restart, for a server started with `serve --journal DIR` (docs/reliability.md): the helpers send
an Idempotency-Key, remember the SSE id of every chunk, and when the connection breaks (the
server was killed or drained, or the connection dropped with the server up) or the server answers
503 while it restarts, they reconnect with Last-Event-ID (or the key, before the first chunk) and go
on, so the caller sees every chunk once (a 409 on a reconnection, the server still seeing the
dropped connection, is waited out too).
Standard library only (http.client); the official `openai` package has no reconnection of its own.

    from shardlm_client.resume import stream, request
    for chunk in stream("http://127.0.0.1:8000", "/v1/chat/completions", {"messages": [...], "stream": True}):
        ...
    answer = request("http://127.0.0.1:8000", "/v1/completions", {"prompt": "Once", "max_tokens": 16})

Tests: tests/server/test_journal.py (group client)."""
import http.client
import json
import time
import urllib.parse
import uuid

__all__ = ["ResumeError", "request", "stream"]


class ResumeError(Exception):
    """The server refused the request (a status other than 200 and 503), or it could not be
    reached again within retry_for seconds."""

    def __init__(self, status, body):
        super().__init__(f"HTTP {status}: {body}")
        self.status, self.body = status, body


def _post(base, path, body, headers, timeout):
    u = urllib.parse.urlsplit(base)
    conn_cls = http.client.HTTPSConnection if u.scheme == "https" else http.client.HTTPConnection
    c = conn_cls(u.hostname, u.port, timeout=timeout)
    c.request("POST", u.path.rstrip("/") + path, json.dumps(body),
              {"Content-Type": "application/json", **headers})
    return c, c.getresponse()


class _Backoff:
    """Waits between attempts (50 ms doubling to 1 s); gives up retry_for seconds after the last
    connection that worked."""

    def __init__(self, retry_for):
        self.retry_for = retry_for
        self.reset()

    def reset(self):
        self.deadline, self.delay = time.monotonic() + self.retry_for, 0.05

    def wait(self):
        if time.monotonic() > self.deadline:
            raise ResumeError(0, f"the server could not be reached again within {self.retry_for} s")
        time.sleep(self.delay)
        self.delay = min(self.delay * 2, 1.0)


def stream(base, path, body, headers=None, key=None, retry_for=120.0, timeout=300.0):
    """Yields the JSON chunks of a streamed completion (body["stream"] must be true) as they
    come, once each, across reconnections. key: the Idempotency-Key (a fresh one by default)."""
    key = key or f"py-{uuid.uuid4().hex}"
    last, backoff, again = None, _Backoff(retry_for), False
    while True:
        h = dict(headers or {})
        if last:
            h["Last-Event-ID"] = last
        else:
            h["Idempotency-Key"] = key
        c = None
        try:
            c, r = _post(base, path, body, h, timeout)
            if r.status == 503 or (r.status == 409 and again):  # restarting; our dropped connection still read
                backoff.wait()
                continue
            if r.status != 200:
                raise ResumeError(r.status, r.read().decode(errors="replace"))
            backoff.reset()
            event_id = None
            while True:
                line = r.readline()
                if not line.endswith(b"\n"):
                    break  # cut (an unfinished line included): reconnect
                line = line.decode().rstrip("\n")
                if line.startswith("id: "):
                    event_id = line[4:]
                elif line.startswith("data: "):
                    if line[6:] == "[DONE]":
                        return
                    chunk = json.loads(line[6:])
                    if event_id:
                        last = event_id
                    yield chunk
        except (ConnectionError, OSError, http.client.HTTPException):
            pass
        finally:
            if c:
                c.close()
        again = True
        backoff.wait()


def request(base, path, body, headers=None, key=None, retry_for=120.0, timeout=300.0):
    """The JSON answer of a unary completion, fetched again by its Idempotency-Key after a restart."""
    key = key or f"py-{uuid.uuid4().hex}"
    backoff, again = _Backoff(retry_for), False
    while True:
        c = None
        try:
            c, r = _post(base, path, body, {**(headers or {}), "Idempotency-Key": key}, timeout)
            text = r.read().decode(errors="replace")
            if r.status == 200:
                return json.loads(text)
            if r.status != 503 and not (r.status == 409 and again):  # 409 again: our dropped connection still read
                raise ResumeError(r.status, text)
        except (ConnectionError, OSError, http.client.HTTPException):
            pass
        finally:
            if c:
                c.close()
        again = True
        backoff.wait()
