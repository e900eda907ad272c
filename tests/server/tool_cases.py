"""Tool calls of every argument kind, as OpenAI clients send them back in a history (strings with
quotes, newlines, tabs and non-ASCII, numbers, booleans, null, nested objects and lists, parallel
calls, a call without arguments): what test_tools_glm.py and test_tools_deepseek.py render with
the models' templates and parse back; and the helpers those tests share to parse replies back
(test_tool_stream --parse-FORMAT) and to have test_grammar decide texts."""
import json
import subprocess

CALLS = [
    [{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}],
    [{"name": "search", "arguments": {"query": "say \"hi\"\n\tthen", "limit": 5, "exact": True, "filters": None}}],
    [{"name": "plan", "arguments": {"steps": [1, 2.5, -3e-2], "meta": {"a": {"b": [True, False]}, "c": "x"}}}],
    [{"name": "a", "arguments": {"x": 1}}, {"name": "b", "arguments": {"y": "two words"}}, {"name": "c", "arguments": {}}],
    [{"name": "unicode", "arguments": {"text": "caf\u00e9 \u2014 \U0001f600", "path": "C:\\dir\\f.txt"}}],
]


def parse_back(tool_stream, flag, path, replies, tools=None):
    """The replies written to path (joined by the byte 0x1e) and parsed by `test_tool_stream FLAG
    path [TOOLS]` (--parse-glm, --parse-deepseek, --parse-kimi, --parse-qwen-xml; tools: the values
    read by their declared types): (its exit code, per reply its calls as [name, arguments text])."""
    path.write_bytes("\x1e".join(replies).encode("utf-8"))
    out = subprocess.run([tool_stream, flag, str(path)] + ([json.dumps(tools)] if tools else []),
                         capture_output=True, text=True, timeout=60)
    return out.returncode, [[line.split("\t", 1) for line in block.strip("\n").split("\n") if line]
                            for block in out.stdout.split("--\n")[:-1]]


def same_calls(calls, back):
    """Whether parsed calls (parse_back's) are calls (CALLS' entries): names equal, arguments equal as JSON."""
    return len(calls) == len(back) and all(c["name"] == b[0] and c["arguments"] == json.loads(b[1])
                                           for c, b in zip(calls, back))


def decide(test_grammar, kind, path, texts):
    """test_grammar's verdict on each text under the grammar (KIND json_schema, ebnf, ...) in path:
    "complete", "prefix", "reject" or "too ambiguous"."""
    out = subprocess.run([test_grammar, "check", kind, str(path)], input="\n".join(x.encode().hex() for x in texts),
                         capture_output=True, text=True, timeout=60)
    return out.stdout.split("\n")[: len(texts)]


def streamed_calls(stream):
    """The calls an openai chat stream's delta.tool_calls assemble to: [(name, arguments text)]."""
    got = {}
    for chunk in stream:
        for ch in chunk.choices:
            for d in ch.delta.tool_calls or []:
                e = got.setdefault(d.index, ["", ""])
                e[0] += d.function.name or ""
                e[1] += d.function.arguments or ""
    return [tuple(v) for _, v in sorted(got.items())]
