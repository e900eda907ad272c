#!/usr/bin/env python3
"""A second real client of the HTTP front (issue 28): LangChain's ChatOpenAI (PyPI
`langchain-openai`), as an agent framework drives an OpenAI-compatible server, against `shardlm
serve --http` with SmolLM2-135M-Instruct. Everything it sends must be accepted (the server refuses
unknown fields by name, so a field LangChain adds that the server does not take fails here), and
everything it gets must parse in LangChain's own types:

1. bind_tools with a named tool and with tool_choice "any" (OpenAI's "required"): the AIMessage's
   tool_calls name a bound tool and their args validate with `jsonschema` against the tool's JSON
   schema as LangChain itself writes it (convert_to_openai_tool); the same streamed, the chunks
   summed by LangChain.
2. The tool loop: the call's result fed back as a ToolMessage with its tool_call_id, and a final
   answer (text) from the model.
3. with_structured_output(method="json_schema"): the reply parsed by LangChain into the declared
   type (a TypedDict through a JSON schema), valid against the schema.

  test_langchain.py --shardlm BUILD/cli/shardlm --gguf .cache/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
SKIP (77) without the GGUF, langchain-openai or jsonschema.
"""
import argparse
import os
import sys
from pathlib import Path
from typing import Literal

SKIP = 77
sys.dont_write_bytecode = True
sys.path.insert(0, str(Path(__file__).resolve().parent))
try:
    import jsonschema
    from langchain_core.messages import HumanMessage, ToolMessage
    from langchain_core.tools import tool
    from langchain_core.utils.function_calling import convert_to_openai_tool
    from langchain_openai import ChatOpenAI
except ImportError as e:
    print(f"SKIP: a test dependency cannot be imported ({e}); run tools/install_deps.sh")
    sys.exit(SKIP)
import test_server as TS  # noqa: E402
from checks import Checks  # noqa: E402

check = Checks()


@tool
def get_weather(city: str, unit: Literal["celsius", "fahrenheit"]) -> str:
    """The current weather in a city."""
    return f"18 degrees {unit} and sunny in {city}"


@tool
def get_time(zone: str) -> str:
    """The local time in a time zone."""
    return f"It is 14:05 in {zone}"


TOOLS = {t.name: t for t in (get_weather, get_time)}
SCHEMAS = {name: convert_to_openai_tool(t)["function"]["parameters"] for name, t in TOOLS.items()}

ANSWER_SCHEMA = {"title": "Answer", "description": "A short answer with a confidence.", "type": "object",
                 "properties": {"answer": {"type": "string", "maxLength": 40},
                                "confidence": {"type": "integer", "minimum": 0, "maximum": 10}},
                 "required": ["answer", "confidence"], "additionalProperties": False}


def calls_valid(calls, names):
    """Every call (LangChain's dict: name, args, id) names one of names and its args validate."""
    if not calls:
        return False
    for c in calls:
        if c["name"] not in names or not c.get("id"):
            print(f"  bad call {c}")
            return False
        try:
            jsonschema.validate(c["args"], SCHEMAS[c["name"]])
        except jsonschema.ValidationError as e:
            print(f"  {c['name']}({c['args']}): {e.message}")
            return False
    return True


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shardlm", required=True)
    ap.add_argument("--gguf", required=True)
    a = ap.parse_args()
    if not os.path.exists(a.gguf):
        print(f"SKIP: no SmolLM2 GGUF at {a.gguf} (tools/fetch_smollm2.sh)")
        return SKIP
    try:
        with TS.Server(a.shardlm, Path(a.gguf), name="langchain", http=True) as srv:
            llm = ChatOpenAI(base_url=srv.base + "/v1", api_key="none", model=Path(a.gguf).name, temperature=0,
                             max_tokens=120, max_retries=0, timeout=300)
            q = [HumanMessage("What is the weather in Paris, in celsius?")]

            # 1. A named tool, unary and streamed; then tool_choice "any" over two tools.
            # One call (parallel_tool_calls false): SmolLM2 repeats the named call until max_tokens
            # cuts the last one on some CPUs (an AMD Zen 4 VM), which is the model's choice, not the server's.
            named = llm.bind_tools([get_weather, get_time], tool_choice="get_weather", parallel_tool_calls=False)
            ai = named.invoke(q)
            check(calls_valid(ai.tool_calls, {"get_weather"}) and not ai.invalid_tool_calls,
                  f"bind_tools named: tool_calls {ai.tool_calls} invalid {ai.invalid_tool_calls}")
            summed = None
            for chunk in named.stream(q):
                summed = chunk if summed is None else summed + chunk
            check(summed is not None and calls_valid(summed.tool_calls, {"get_weather"}),
                  f"bind_tools named, streamed: {summed and summed.tool_calls}")
            def same(calls):
                return [(c["name"], c["args"]) for c in calls]
            check(summed is not None and same(summed.tool_calls) == same(ai.tool_calls)
                  and summed.tool_calls[0]["id"] == summed.tool_call_chunks[0]["id"],
                  f"streamed calls equal the unary ones (temperature 0): {summed and summed.tool_calls} vs "
                  f"{ai.tool_calls}")
            anyc = llm.bind_tools([get_weather, get_time], tool_choice="any").invoke(
                [HumanMessage("What time is it in Tokyo?")])
            check(calls_valid(anyc.tool_calls, set(TOOLS)), f"bind_tools any: {anyc.tool_calls}")

            # 2. The loop: the tool's result back as a ToolMessage, a final answer in text.
            if ai.tool_calls:
                c = ai.tool_calls[0]
                result = TOOLS[c["name"]].invoke(c["args"])
                final = llm.bind_tools([get_weather, get_time], tool_choice="none").invoke(
                    [*q, ai, ToolMessage(result, tool_call_id=c["id"])])
                check(isinstance(final.content, str) and final.content.strip() and not final.tool_calls,
                      f"final answer after the tool result: {final.content!r} calls {final.tool_calls}")
                check(final.response_metadata.get("finish_reason") in ("stop", "length"),
                      f"final finish_reason: {final.response_metadata.get('finish_reason')}")

            # 3. Structured output through response_format json_schema, parsed by LangChain.
            structured = llm.with_structured_output(ANSWER_SCHEMA, method="json_schema", strict=True)
            got = structured.invoke([HumanMessage("What is the capital of France? Answer in a few words.")])
            ok = isinstance(got, dict)
            try:
                jsonschema.validate(got, ANSWER_SCHEMA)
            except jsonschema.ValidationError as e:
                print(f"  {got}: {e.message}")
                ok = False
            check(ok, f"with_structured_output json_schema: {got!r}")
            check(srv.proc.poll() is None, "the server lives")
    finally:
        TS.kill_all()
    return check.summary()


if __name__ == "__main__":
    sys.exit(main())
