"""Tool calls of every argument kind, as OpenAI clients send them back in a history (strings with
quotes, newlines, tabs and non-ASCII, numbers, booleans, null, nested objects and lists, parallel
calls, a call without arguments): what test_tools_glm.py and test_tools_deepseek.py render with
the models' templates and parse back."""

CALLS = [
    [{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}],
    [{"name": "search", "arguments": {"query": "say \"hi\"\n\tthen", "limit": 5, "exact": True, "filters": None}}],
    [{"name": "plan", "arguments": {"steps": [1, 2.5, -3e-2], "meta": {"a": {"b": [True, False]}, "c": "x"}}}],
    [{"name": "a", "arguments": {"x": 1}}, {"name": "b", "arguments": {"y": "two words"}}, {"name": "c", "arguments": {}}],
    [{"name": "unicode", "arguments": {"text": "caf\u00e9 \u2014 \U0001f600", "path": "C:\\dir\\f.txt"}}],
]
