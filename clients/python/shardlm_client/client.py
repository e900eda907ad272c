"""clients/python/shardlm_client/client.py - a small typed wrapper over the shardlm.v1 gRPC API:
plain Python values in, dataclasses out, grpc.RpcError (with .code() and .details()) on errors.
Not here: the stubs (_stubs.py). Tests: tests/server/test_server.py, test_embeddings.py (embed) and
the examples.

    from shardlm_client import Client
    with Client("127.0.0.1:50051") as c:
        print(c.generate("Once upon a time", max_tokens=32, temperature=0).text)
        for chunk in c.chat_stream([("user", "Tell me a story")]):
            print(chunk.text, end="", flush=True)

Against a server with a stream journal (`serve --journal DIR`, docs/reliability.md), generation
calls survive a server restart by themselves: the server names each journaled call's resume token
in its initial metadata (shardlm-resume-token), and when the call fails with UNAVAILABLE (the
server was killed, drained or is restarting, or the connection dropped: the server keeps the
request for --journal-detach-grace) the client calls again with the token and, for a stream, what
it already has (shardlm-resume-from), for up to Client(resume_for=60) seconds (ABORTED, the server
still seeing the dropped call, is retried too), so that the caller sees every chunk once. Calls to a server without a journal carry no token and
fail as before.

Several replicas (separate `serve` jobs): Client("10.0.0.1:50051,10.0.0.2:50051") balances calls
over them itself (gRPC's round_robin over IP addresses, each replica's health watched through
grpc.health.v1, calls that fail UNAVAILABLE before any answer sent again to another replica), so a
lost replica costs no call that had not started answering. A journaled call cut mid-answer is
reattached by its token on each replica in turn (a channel to each, besides the balanced one) until
one holds it: NOT_FOUND from the others, UNAVAILABLE while its own restarts on its journal.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Iterable, Iterator, Optional, Sequence, Union

import grpc

from . import _stubs

pb, pb_grpc = _stubs.load()

FINISH_REASONS = {0: "", 1: "length", 2: "stop", 3: "eos", 4: "cancelled", 5: "deadline", 6: "error", 7: "tool_calls"}

Message = Union[dict, tuple, "pb.ChatMessage"]


@dataclass
class TopLogprob:
    token_id: int
    logprob: float
    piece: str


@dataclass
class TokenLogprob:
    token_id: int
    logprob: float
    piece: str
    top: list[TopLogprob] = field(default_factory=list)


@dataclass
class ToolCall:
    """A tool call of a reply; in a stream's chunks id and name come with the call's first
    fragment only, and arguments are fragments to concatenate."""
    index: int
    id: str
    name: str
    arguments: str


def _tool_calls(calls) -> list[ToolCall]:
    return [ToolCall(c.index, c.id, c.name, c.arguments) for c in calls]


@dataclass
class Completion:
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str
    completion_tokens: int
    logprobs: list[TokenLogprob] = field(default_factory=list)
    content: str = ""
    reasoning_content: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)


@dataclass
class Generation:
    """A unary result: text, token_ids, finish_reason and logprobs are sample 0's."""
    request_id: str
    text: str
    token_ids: list[int]
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    cached_prompt_tokens: int
    seed: int
    logprobs: list[TokenLogprob] = field(default_factory=list)
    prompt_logprobs: list[TokenLogprob] = field(default_factory=list)
    completions: list[Completion] = field(default_factory=list)
    # Chat with tools or a reasoning template: the reply parsed (docs/tools.md); text stays raw.
    content: str = ""
    reasoning_content: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)


@dataclass
class Chunk:
    """One streamed message: the new text and token ids of sample `index`."""
    request_id: str
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str  # "" until the sample's last chunk
    prompt_tokens: int = 0
    completion_tokens: int = 0
    logprobs: list[TokenLogprob] = field(default_factory=list)
    prompt_logprobs: list[TokenLogprob] = field(default_factory=list)
    # Chat with tools or a reasoning template: the new parts of the parsed reply.
    content: str = ""
    reasoning_content: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)


@dataclass
class Embeddings:
    """Embed's result: one vector (the model's width, f32 values) per input, in order."""
    vectors: list[list[float]]
    model: str
    prompt_tokens: int


POOLINGS = {None: 0, "mean": 1, "cls": 2, "last": 3}

EmbedInput = Union[str, Sequence[int]]


def _embed_inputs(inputs) -> list["pb.EmbedInput"]:
    """/v1/embeddings' shapes: a string, a list of token ids (one input), or a list of strings
    and token-id lists."""
    if isinstance(inputs, str):
        inputs = [inputs]
    elif inputs and all(isinstance(t, int) for t in inputs):
        inputs = [inputs]
    return [pb.EmbedInput(text=x) if isinstance(x, str) else pb.EmbedInput(token_ids=pb.TokenIds(ids=list(x)))
            for x in inputs]


def _logprobs(entries) -> list[TokenLogprob]:
    return [TokenLogprob(e.token_id, e.logprob, e.piece, [TopLogprob(t.token_id, t.logprob, t.piece) for t in e.top])
            for e in entries]


def sampling_params(*, max_tokens: Optional[int] = None, temperature: Optional[float] = None, top_k: int = 0,
                    top_p: Optional[float] = None, min_p: float = 0.0, repetition_penalty: Optional[float] = None,
                    presence_penalty: float = 0.0, frequency_penalty: float = 0.0, seed: Optional[int] = None,
                    stop: Sequence[str] = (), stop_token_ids: Sequence[int] = (), ignore_eos: bool = False,
                    min_tokens: int = 0, logprobs: Optional[int] = None, prompt_logprobs: Optional[int] = None,
                    n: Optional[int] = None, logit_bias: Optional[dict[int, float]] = None,
                    json_schema: Optional[Union[str, dict]] = None, json_object: bool = False,
                    regex: Optional[str] = None, grammar: Optional[str] = None,
                    choice: Optional[Sequence[str]] = None, speculative: str = "",
                    speculative_n_max: int = 0, speculative_p_min: Optional[float] = None,
                    show_special_tokens: bool = False) -> "pb.SamplingParams":
    """Builds SamplingParams; None leaves a field unset (the server's default applies). At most one
    of json_schema (a dict or its JSON text), json_object, regex, grammar (GBNF) and choice
    constrains the output (SamplingParams.constraint)."""
    s = pb.SamplingParams(top_k=top_k, min_p=min_p, presence_penalty=presence_penalty,
                          frequency_penalty=frequency_penalty, stop=list(stop), stop_token_ids=list(stop_token_ids),
                          ignore_eos=ignore_eos, min_tokens=min_tokens, logit_bias=logit_bias or {},
                          speculative=speculative, speculative_n_max=speculative_n_max,
                          show_special_tokens=show_special_tokens)
    for name, value in (("max_tokens", max_tokens), ("temperature", temperature), ("top_p", top_p),
                        ("repetition_penalty", repetition_penalty), ("seed", seed), ("logprobs", logprobs),
                        ("prompt_logprobs", prompt_logprobs), ("n", n), ("speculative_p_min", speculative_p_min)):
        if value is not None:
            setattr(s, name, value)
    if isinstance(json_schema, dict):
        json_schema = json.dumps(json_schema)
    given = [k for k, v in (("json_schema", json_schema), ("json_object", json_object or None), ("regex", regex),
                            ("grammar", grammar), ("choice", choice)) if v is not None]
    if len(given) > 1:
        raise ValueError(f"at most one constraint, got {given}")
    if json_schema is not None:
        s.constraint.json_schema = json_schema
    elif json_object:
        s.constraint.json_object = True
    elif regex is not None:
        s.constraint.regex = regex
    elif grammar is not None:
        s.constraint.grammar = grammar
    elif choice is not None:
        s.constraint.choice.choices.extend(choice)
    return s


def _call(c) -> "pb.ToolCall":
    """A tool call: a ToolCall, OpenAI's {"id", "type", "function": {"name", "arguments"}}, or
    {"id", "name", "arguments"}; arguments may be a dict (sent as its JSON)."""
    if isinstance(c, pb.ToolCall):
        return c
    if isinstance(c, ToolCall):
        return pb.ToolCall(index=c.index, id=c.id, name=c.name, arguments=c.arguments)
    f = c.get("function", c)
    args = f.get("arguments", "{}")
    return pb.ToolCall(id=c.get("id", ""), name=f["name"], arguments=args if isinstance(args, str) else json.dumps(args))


def _message(m: Message) -> "pb.ChatMessage":
    """A chat turn: a ChatMessage, a (role, content) pair, or OpenAI's message dict (content may be
    None; tool_calls, tool_call_id, name and reasoning_content are kept)."""
    if isinstance(m, pb.ChatMessage):
        return m
    if isinstance(m, dict):
        return pb.ChatMessage(role=m["role"], content=m.get("content") or "", tool_call_id=m.get("tool_call_id") or "",
                              name=m.get("name") or "", reasoning_content=m.get("reasoning_content") or "",
                              tool_calls=[_call(c) for c in m.get("tool_calls") or []])
    role, content = m
    return pb.ChatMessage(role=role, content=content)


def _tool(t) -> "pb.Tool":
    """A tool: a Tool, OpenAI's {"type": "function", "function": {...}} or its function dict."""
    if isinstance(t, pb.Tool):
        return t
    f = t.get("function", t)
    params = f.get("parameters")
    return pb.Tool(name=f["name"], description=f.get("description") or "",
                   parameters="" if params is None else params if isinstance(params, str) else json.dumps(params))


def _tools_fields(req: "pb.ChatRequest", tools, tool_choice, parallel_tool_calls, chat_template_kwargs) -> None:
    req.tools.extend(_tool(t) for t in tools or [])
    if isinstance(tool_choice, dict):  # OpenAI's {"type": "function", "function": {"name": ...}}
        req.tool_choice_function = tool_choice.get("function", tool_choice)["name"]
    elif tool_choice:
        req.tool_choice = tool_choice
    if parallel_tool_calls is not None:
        req.parallel_tool_calls = parallel_tool_calls
    if chat_template_kwargs is not None:
        req.chat_template_kwargs = (chat_template_kwargs if isinstance(chat_template_kwargs, str)
                                    else json.dumps(chat_template_kwargs))


RESUME_TOKEN = "shardlm-resume-token"
# The service config of a target of several replicas (clients/client.c has the same).
REPLICAS_SERVICE_CONFIG = json.dumps({
    "loadBalancingConfig": [{"round_robin": {}}],
    "healthCheckConfig": {"serviceName": "shardlm.v1.TextGeneration"},
    "methodConfig": [{"name": [{"service": "shardlm.v1.TextGeneration"}],
                      "retryPolicy": {"maxAttempts": 4, "initialBackoff": "0.1s", "maxBackoff": "1s",
                                      "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]}}]})


def replicas_target(target: str):
    """(gRPC target, extra channel options) of a target: "A:P,B:P" (IP addresses) is several
    replicas, balanced by the channel (REPLICAS_SERVICE_CONFIG); anything else is as given."""
    if "," not in target or ":/" in target or target.startswith(("ipv4:", "ipv6:", "dns:", "unix:")):
        return target, []
    return ("ipv6:" if "[" in target else "ipv4:") + target, [("grpc.service_config", REPLICAS_SERVICE_CONFIG)]
RESUME_FROM = "shardlm-resume-from"


def _token(call) -> Optional[str]:
    """The resume token a journaling server put in the call's initial metadata, or None."""
    try:
        return dict(call.initial_metadata() or ()).get(RESUME_TOKEN)
    except grpc.RpcError:
        return None


def _guess(e: grpc.RpcError, own_id: str) -> Optional[str]:
    """A call cut (UNAVAILABLE) before the server named its token may still have been journaled,
    under the request's own request_id: that id is worth a reattach, unless the call never
    reached a server (gRPC's "failed to connect")."""
    if not own_id or e.code() != grpc.StatusCode.UNAVAILABLE or "failed to connect" in (e.details() or ""):
        return None
    return own_id


class Stream:
    """An iterator of Chunk; cancel() ends the call (the server frees the request). With reopen
    (a function of extra metadata and the attempt's number giving a new call of the same request)
    and a resume token from the server, a call that fails with UNAVAILABLE is reattached for up to
    resume_for seconds; over several replicas (n_replicas) attempt k goes to replica k % n, and
    NOT_FOUND means "not this one" until every replica in a row said it."""

    def __init__(self, call, reopen=None, n_samples: int = 1, resume_for: float = 0.0, cancel_id=None,
                 own_id: str = "", n_replicas: int = 1):
        self._call, self._reopen, self._n, self._resume_for = call, reopen, n_samples, resume_for
        self._cancel_id, self._token, self._own_id = cancel_id, None, own_id
        self._cancelled, self._n_replicas = False, n_replicas

    def __iter__(self) -> Iterator[Chunk]:
        token, counts, finals, give_up = None, [0] * self._n, [False] * self._n, None
        guessed = reattached = False
        attempt = misses = 0
        while True:
            try:
                if (token is None or guessed) and not reattached and self._reopen and self._resume_for > 0:
                    token, guessed = _token(self._call), False
                    self._token = token
                for r in self._call:
                    give_up = None
                    if 0 <= r.index < self._n:
                        counts[r.index] += len(r.token_ids)
                        finals[r.index] |= r.finish_reason != 0
                    u = r.usage if r.HasField("usage") else None
                    yield Chunk(r.request_id, r.index, r.text, list(r.token_ids),
                                FINISH_REASONS.get(r.finish_reason, "?"), u.prompt_tokens if u else 0,
                                u.completion_tokens if u else 0, _logprobs(r.logprobs), _logprobs(r.prompt_logprobs),
                                r.content, r.reasoning_content, _tool_calls(r.tool_calls))
                return
            except grpc.RpcError as e:
                # UNAVAILABLE: the server or the connection went; ABORTED (a reattach only): the
                # server still sees an earlier call of ours reading it (its dropped connection
                # not noticed yet).
                # Cut before the server named a token: reattach by the request's own id (_guess);
                # NOT_FOUND to that guess: never journaled, so the request goes again as new.
                nothing = not any(counts) and not any(finals)
                if token is None and not reattached and nothing and self._reopen and self._resume_for > 0:
                    token = self._token = _guess(e, self._own_id)
                    guessed = token is not None
                # NOT_FOUND to a reattach: not on that replica; every replica in a row: not anywhere.
                not_found = reattached and e.code() == grpc.StatusCode.NOT_FOUND
                misses = misses + 1 if not_found else 0
                elsewhere = not_found and misses < self._n_replicas
                as_new = guessed and not_found and nothing and not elsewhere
                again = elsewhere or as_new or e.code() == grpc.StatusCode.UNAVAILABLE or (
                    e.code() == grpc.StatusCode.ABORTED and give_up is not None)
                if self._cancelled or not token or not again:
                    raise
                give_up = give_up or time.monotonic() + self._resume_for
                if time.monotonic() > give_up:
                    raise
                time.sleep(0.1)
                reattached = not as_new
                md = [(RESUME_TOKEN, token)] if reattached else []
                if reattached and not nothing:
                    md.append((RESUME_FROM, ",".join(f"{c}{'!' if f else ''}" for c, f in zip(counts, finals))))
                self._call = self._reopen(md, attempt)
                attempt += 1

    def cancel(self) -> None:
        """Ends the stream. A journaled call is cancelled by its token too (Cancel): the server
        cannot tell a cancelled call from a dropped connection, whose request it keeps running
        for --journal-detach-grace."""
        self._cancelled = True
        if self._token and self._cancel_id:
            try:
                self._cancel_id(self._token)
            except grpc.RpcError:
                pass  # (it had ended, or the server is gone: the call's own cancel below)
        self._call.cancel()


class Client:
    """A connection to a shardlm server. api_key adds 'authorization: Bearer <key>' to every call;
    root_cert (PEM bytes) switches to TLS; timeout is the default per-call deadline in seconds."""

    def __init__(self, target: str = "127.0.0.1:50051", *, api_key: Optional[str] = None,
                 root_cert: Optional[bytes] = None, tls_server_name: Optional[str] = None,
                 timeout: Optional[float] = None, resume_for: float = 60.0):
        # Reconnect within a second of the server coming back (gRPC's default backoff grows to
        # 120 s): a journaled call reattaches to a restarted server while its request still runs.
        options = [("grpc.max_receive_message_length", 64 << 20),
                   ("grpc.initial_reconnect_backoff_ms", 100), ("grpc.max_reconnect_backoff_ms", 1000)]
        balanced, extra = replicas_target(target)
        if tls_server_name:
            options.append(("grpc.ssl_target_name_override", tls_server_name))

        def channel(t, opts):
            if root_cert is not None:
                return grpc.secure_channel(t, grpc.ssl_channel_credentials(root_cert), options=opts)
            return grpc.insecure_channel(t, options=opts)
        self.channel = channel(balanced, options + extra)
        self.stub = pb_grpc.TextGenerationStub(self.channel)
        # Several replicas: one channel to each too, for reattaching a journaled call (_on).
        self._replicas = [channel(t, options) for t in target.split(",")] if extra else []
        self._replica_stubs = [pb_grpc.TextGenerationStub(c) for c in self._replicas]
        self.metadata = [("authorization", f"Bearer {api_key}")] if api_key else []
        self.timeout = timeout
        self.resume_for = resume_for  # seconds a journaled call keeps reattaching (0: never)

    def close(self) -> None:
        self.channel.close()
        for c in self._replicas:
            c.close()

    def _on(self, name, attempt):
        """The stub method name for a reattach: the one server's, or with several replicas
        replica attempt % n's (a journaled request lives on one of them)."""
        stubs = self._replica_stubs or [self.stub]
        return getattr(stubs[attempt % len(stubs)], name)

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _kw(self, timeout):
        return {"timeout": timeout if timeout is not None else self.timeout, "metadata": self.metadata}

    @staticmethod
    def _generation(r) -> Generation:
        return Generation(r.request_id, r.text, list(r.token_ids), FINISH_REASONS.get(r.finish_reason, "?"),
                          r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.cached_prompt_tokens, r.seed,
                          _logprobs(r.logprobs), _logprobs(r.prompt_logprobs),
                          [Completion(c.index, c.text, list(c.token_ids), FINISH_REASONS.get(c.finish_reason, "?"),
                                      c.usage.completion_tokens, _logprobs(c.logprobs), c.content, c.reasoning_content,
                                      _tool_calls(c.tool_calls)) for c in r.completions],
                          r.content, r.reasoning_content, _tool_calls(r.tool_calls))

    @staticmethod
    def generate_request(prompt: Optional[str] = None, *, prompt_token_ids: Optional[Sequence[int]] = None,
                         request_id: str = "", add_bos: Optional[bool] = None, adapter: str = "",
                         cache_salt: str = "", **sampling) -> "pb.GenerateRequest":
        req = pb.GenerateRequest(request_id=request_id, prompt=prompt or "", adapter=adapter, cache_salt=cache_salt,
                                 prompt_token_ids=list(prompt_token_ids or []), sampling=sampling_params(**sampling))
        if add_bos is not None:
            req.add_bos = add_bos
        return req

    @staticmethod
    def chat_request(messages: Iterable[Message], *, request_id: str = "", adapter: str = "", cache_salt: str = "",
                     tools: Optional[Sequence] = None, tool_choice: Optional[Union[str, dict]] = None,
                     parallel_tool_calls: Optional[bool] = None,
                     chat_template_kwargs: Optional[Union[str, dict]] = None, **sampling) -> "pb.ChatRequest":
        """tools: OpenAI's tool dicts (or Tool messages); tool_choice: "auto", "none", "required"
        or OpenAI's named {"type": "function", "function": {"name": ...}}."""
        req = pb.ChatRequest(request_id=request_id, messages=[_message(m) for m in messages], adapter=adapter,
                             cache_salt=cache_salt, sampling=sampling_params(**sampling))
        _tools_fields(req, tools, tool_choice, parallel_tool_calls, chat_template_kwargs)
        return req

    def _unary(self, name, req, timeout):
        """One unary call (the stub method name); reattached with its resume token on UNAVAILABLE
        (a journaling server sends it in the initial metadata at once, which grpcio keeps when the
        call fails), on each replica in turn when there are several (NOT_FOUND: not that one)."""
        fut = getattr(self.stub, name).future(req, **self._kw(timeout))
        try:
            return fut.result()
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.UNAVAILABLE or self.resume_for <= 0:
                raise
            token = _token(fut)
            guessed = token is None and _guess(e, req.request_id) is not None
            if guessed:
                token = req.request_id
            if not token:
                raise
        give_up = time.monotonic() + self.resume_for
        kw = self._kw(timeout)
        with_token = dict(kw, metadata=list(kw["metadata"]) + [(RESUME_TOKEN, token)])
        reattach, attempt, misses, n = True, 0, 0, max(len(self._replicas), 1)
        while True:
            time.sleep(0.1)
            try:
                return self._on(name, attempt)(req, **(with_token if reattach else kw))
            except grpc.RpcError as e:  # ABORTED: our earlier call still reads it (Stream.__iter__)
                # NOT_FOUND: not on this replica (another may hold it); from every one in turn,
                # to a guessed token: never journaled (cut before), so again as new; cut again
                # before its token, the guess is tried again.
                not_found = reattach and e.code() == grpc.StatusCode.NOT_FOUND
                misses = misses + 1 if not_found else 0
                elsewhere = not_found and misses < n
                as_new = guessed and not_found and not elsewhere
                if time.monotonic() > give_up or not (
                        elsewhere or as_new or e.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.ABORTED)):
                    raise
                reattach = not as_new
                attempt += 1

    def _stream(self, name, req, timeout) -> Stream:
        kw = self._kw(timeout)

        def reopen(md, attempt):
            return self._on(name, attempt)(req, **dict(kw, metadata=list(kw["metadata"]) + md))

        return Stream(getattr(self.stub, name)(req, **kw), reopen, max(req.sampling.n, 1), self.resume_for,
                      lambda rid: self.cancel(rid, timeout=5), req.request_id, max(len(self._replicas), 1))

    def generate(self, prompt: Optional[str] = None, *, timeout: Optional[float] = None, **kw) -> Generation:
        return self._generation(self._unary("Generate", self.generate_request(prompt, **kw), timeout))

    def generate_stream(self, prompt: Optional[str] = None, *, timeout: Optional[float] = None, **kw) -> Stream:
        return self._stream("GenerateStream", self.generate_request(prompt, **kw), timeout)

    def chat(self, messages: Iterable[Message], *, timeout: Optional[float] = None, **kw) -> Generation:
        return self._generation(self._unary("Chat", self.chat_request(messages, **kw), timeout))

    def chat_stream(self, messages: Iterable[Message], *, timeout: Optional[float] = None, **kw) -> Stream:
        return self._stream("ChatStream", self.chat_request(messages, **kw), timeout)

    # model (these methods): the served model it is for (a server of several: `serve --model`
    # repeated), by its id or an adapter's name; "" = the first.

    def tokenize(self, text: str, *, add_bos: bool = True, model: str = "",
                 timeout: Optional[float] = None) -> list[int]:
        r = self.stub.Tokenize(pb.TokenizeRequest(text=text, add_bos=add_bos, model=model), **self._kw(timeout))
        return list(r.token_ids)

    def detokenize(self, token_ids: Sequence[int], *, model: str = "", timeout: Optional[float] = None) -> str:
        return self.stub.Detokenize(pb.DetokenizeRequest(token_ids=list(token_ids), model=model),
                                    **self._kw(timeout)).text

    def cancel(self, request_id: str, *, timeout: Optional[float] = None) -> bool:
        return self.stub.Cancel(pb.CancelRequest(request_id=request_id), **self._kw(timeout)).cancelled

    def model_info(self, *, model: str = "", timeout: Optional[float] = None) -> "pb.GetModelInfoResponse":
        return self.stub.GetModelInfo(pb.GetModelInfoRequest(model=model), **self._kw(timeout))

    def server_stats(self, *, model: str = "", timeout: Optional[float] = None) -> "pb.GetServerStatsResponse":
        return self.stub.GetServerStats(pb.GetServerStatsRequest(model=model), **self._kw(timeout))

    def load_adapter(self, name: str, path: str, *, model: str = "",
                     timeout: Optional[float] = None) -> "pb.LoadAdapterResponse":
        """Loads the PEFT adapter in `path` (on the server's file system) as `name`; later requests
        may give adapter=name. Raises grpc.RpcError: ALREADY_EXISTS, NOT_FOUND, INVALID_ARGUMENT,
        RESOURCE_EXHAUSTED (--max-loras), UNIMPLEMENTED (a server that cannot load at run time)."""
        return self.stub.LoadAdapter(pb.LoadAdapterRequest(name=name, path=path, model=model), **self._kw(timeout))

    def embed(self, inputs: Union[EmbedInput, Sequence[EmbedInput]], *, model: str = "", pooling: Optional[str] = None,
              normalize: Optional[bool] = None, timeout: Optional[float] = None) -> Embeddings:
        """Vectors of texts or token-id lists (docs/embeddings.md), as /v1/embeddings makes them.
        pooling: None (the model's default), "mean", "cls" or "last"; normalize: None (true) or
        a bool. Raises grpc.RpcError: INVALID_ARGUMENT (naming the input), NOT_FOUND (model)."""
        if pooling not in POOLINGS:
            raise ValueError(f"pooling must be one of mean, cls, last (or None), got {pooling!r}")
        req = pb.EmbedRequest(inputs=_embed_inputs(inputs), model=model, pooling=POOLINGS[pooling])
        if normalize is not None:
            req.normalize = normalize
        r = self.stub.Embed(req, **self._kw(timeout))
        return Embeddings([list(e.values) for e in r.embeddings], r.model, r.prompt_tokens)

    def unload_adapter(self, name: str, *, model: str = "", timeout: Optional[float] = None) -> None:
        """Unloads an adapter; FAILED_PRECONDITION while requests use it and for the server's default
        adapter (GetModelInfo.default_adapter), NOT_FOUND when not loaded."""
        self.stub.UnloadAdapter(pb.UnloadAdapterRequest(name=name, model=model), **self._kw(timeout))
