"""tests/server/tools_grpc.py - helpers of the tool-calling tests (test_tools.py,
test_tools_native.py) that put the same conversation to the gRPC Chat / ChatStream RPCs and to
the HTTP chat endpoint: both answers as one shape, (content, reasoning, [(name, arguments)],
finish_reason), so that a test checks they are equal."""
import grpc

def http_parts(m, finish):
    """An HTTP chat message as (content, reasoning, [(name, arguments)], finish)."""
    return (m.content or "", (m.model_extra or {}).get("reasoning_content") or "",
            [(c.function.name, c.function.arguments) for c in m.tool_calls or []], finish)


def grpc_finish(f):
    """gRPC's finish reason as OpenAI's: the model's end of sequence is "stop" there."""
    return "stop" if f == "eos" else f


def grpc_parts(g):
    """A gRPC Generation or Completion as http_parts gives."""
    return g.content, g.reasoning_content, [(c.name, c.arguments) for c in g.tool_calls], grpc_finish(g.finish_reason)


def grpc_stream_parts(stream):
    """A ChatStream's chunks of sample 0 assembled as http_parts gives, and the chunks with calls."""
    content, reasoning, calls, finish, n = "", "", {}, None, 0
    for ch in stream:
        content += ch.content
        reasoning += ch.reasoning_content
        n += bool(ch.tool_calls)
        for tc in ch.tool_calls:
            e = calls.setdefault(tc.index, ["", ""])
            e[0] += tc.name
            e[1] += tc.arguments
        finish = ch.finish_reason or finish
    return (content, reasoning, [tuple(e) for _, e in sorted(calls.items())], grpc_finish(finish)), n


def expect_grpc_invalid(check, fn, word):
    try:
        fn()
        check(False, f"gRPC: refused naming {word!r}")
    except grpc.RpcError as e:
        check(e.code() == grpc.StatusCode.INVALID_ARGUMENT and word in (e.details() or ""),
              f"gRPC: INVALID_ARGUMENT naming {word!r}: {e.code()} {(e.details() or '')[:140]}")
