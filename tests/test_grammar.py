#!/usr/bin/env python3
"""tests/test_grammar.py - the grammar engine (engine/grammar/) against independent oracles, over
the corpus tests/data/grammar/ (*.schema.json, *.regex, *.gbnf):

  - strings: random walks over the engine's own masks (tests/test_grammar walk, on SmolLM2's
    vocabulary when its GGUF is present, else on the test's synthetic one), each truncated and
    mutated (a byte deleted, inserted, replaced; whitespace added), plus hand-written ones;
  - every string is decided by the engine (test_grammar check: complete / prefix / reject) and
    by llguidance (PyPI, its byte-level matcher with compact JSON: no whitespace, "," and ":"),
    and the two must agree exactly, except where docs/grammar.md documents a difference (a
    schema's objects that declare properties and leave additionalProperties out are given
    additionalProperties false for llguidance: the engine generates no undeclared members there);
  - every string the engine accepts as complete validates with jsonschema (schemas, with format
    checks) or matches Python's re.fullmatch (regexes), and every finished random walk is such a
    complete string.

Usage: test_grammar.py TEST_GRAMMAR_BINARY [SMOLLM2_GGUF]. Prints SKIP and exits 77 without
llguidance or jsonschema."""
import json
import os
import random
import re
import subprocess
import sys

try:
    import jsonschema
    import llguidance
except ImportError as e:
    print(f"SKIP: {e} (tools/install_deps.sh installs llguidance and jsonschema)")
    sys.exit(77)

HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS = os.path.join(HERE, "data", "grammar")
BIN = sys.argv[1]
GGUF = sys.argv[2] if len(sys.argv) > 2 and os.path.exists(sys.argv[2]) else "synthetic"

# A byte tokenizer for llguidance: token i < 256 is byte i, 256 is EOS.
class ByteTok:
    eos_token_id = 256
    bos_token_id = None
    tokens = [bytes([i]) for i in range(256)] + [b"<eos>"]
    special_token_ids = [256]
    def __call__(self, s):
        return list(s if isinstance(s, bytes) else s.encode())

LLTOK = llguidance.LLTokenizer(llguidance.TokenizerWrapper(ByteTok()))
COMPACT = {"whitespace_flexible": False, "item_separator": ",", "key_separator": ":"}


def closed(node):
    """The schema as the engine generates it: an object that declares properties and says nothing of
    additionalProperties gets none (docs/grammar.md), i.e. additionalProperties false, written out
    for llguidance, which follows the specification's default (allowed)."""
    if isinstance(node, list):
        return [closed(x) for x in node]
    if not isinstance(node, dict):
        return node
    out = dict(node)
    for k in ("properties", "$defs", "definitions"):
        if isinstance(node.get(k), dict):
            out[k] = {name: closed(v) for name, v in node[k].items()}
    # (allOf parts are merged before the default applies: the corpus' allOf parts say it outright.)
    for k in ("items", "additionalProperties", "additionalItems", "prefixItems", "anyOf", "oneOf", "allOf"):
        if k in node:
            out[k] = closed(node[k])
    if node.get("properties") and "additionalProperties" not in node:
        out["additionalProperties"] = False
    return out


def ll_grammar(kind, src):
    if kind == "json_schema":
        src = json.dumps(closed(json.loads(src)))
        return llguidance.LLMatcher.grammar_from_json_schema(src, overrides=COMPACT)
    if kind == "regex":
        return llguidance.LLMatcher.grammar_from_regex(src)
    return llguidance.grammar_from("gbnf", src)


def ll_decide(grammar, data):
    m = llguidance.LLMatcher(LLTOK, grammar, log_level=0)
    if m.is_error():
        raise RuntimeError(m.get_error())
    if not m.consume_tokens(list(data)) or m.is_error():
        return "reject"
    return "complete" if m.is_accepting() else "prefix"


def c_decide(kind, path, strings):
    inp = "".join(s.hex() + "\n" for s in strings)
    out = subprocess.run([BIN, "check", kind, path], input=inp, capture_output=True, text=True, check=True).stdout
    return out.split()


def walks(kind, path, n, seed):
    r = subprocess.run([BIN, "walk", kind, path, GGUF, str(seed), str(n)], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"walk {path}: {r.stdout[-500:]} {r.stderr[-2000:]}")
    res = []
    for line in r.stdout.split("\n"):
        if not line:
            continue
        parts = line.split()
        res.append((bytes.fromhex(parts[0]) if parts and parts[0] != "done" else b"", line.endswith(" done")))
    return res


def mutations(s, rng):
    out = []
    if not s:
        return out
    for _ in range(6):
        i = rng.randrange(len(s))
        b = rng.choice(b'{}[]",:0123456789abcxyz -.\\eE')
        out += [s[:i] + s[i + 1:], s[:i] + bytes([b]) + s[i:], s[:i] + bytes([b]) + s[i + 1:]]
    out += [s[: rng.randrange(len(s))], s + b" ", b" " + s, s.replace(b",", b", ", 1), s.replace(b":", b": ", 1)]
    return out


def oracle_ok(kind, src, data):
    """The independent validators: jsonschema for schemas, re.fullmatch for regexes."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    if kind == "json_schema":
        try:
            inst = json.loads(text)
        except ValueError:
            return False
        schema = json.loads(src)
        cls = jsonschema.validators.validator_for(schema)
        return cls(schema, format_checker=cls.FORMAT_CHECKER).is_valid(inst)
    if kind == "regex":
        return re.fullmatch(src, text) is not None
    return True


# Hand-written strings per file, on top of the generated ones.
EXTRA = {
    "person.schema.json": [b'{"name":"Ann","age":30}', b'{"age":30,"name":"Ann"}', b'{"name":"Ann","age":121}',
                           b'{"name":"Ann","age":30,"email":"a@b.co"}', b'{"name":"Ann","age":30,"tags":["admin","x"]}'],
    "tree.schema.json": [b'{"name":"a","children":[{"name":"b","children":[]}]}', b'{"children":[]}'],
    "linked.schema.json": [b"null", b'{"head":1,"tail":{"head":2,"tail":null}}', b'{"head":1}'],
    "config.schema.json": [b'{"version":2,"retries":-3}', b'{"version":2,"retries":-4}', b'{"version":2,"ports":[1,2]}',
                           b'{"version":2,"ports":[1]}', b'{"version":2,"ratio":-1}', b'{"version":2,"labels":{"a":"b","c":"d"}}'],
    "open.schema.json": [b'{"a":"x","zz":[1,{"k":null}]}', b'{"a":"x","b":[1,2],"c":true}'],
    "order.schema.json": [b'{"id":"123e4567-e89b-12d3-a456-426614174000","status":"shipped","items":[{"sku":"ABC-1234","qty":2}]}'],
    # Integer ranges of many digits (grammar_ir.c same_len: 2^digits expressions until 2026-12-02).
    "wide_ints.schema.json": [b'{"full":999999999999999,"wide":1000878107878107,"signed":-123456789}',
                              b'{"full":0,"wide":70,"signed":987654321}', b'{"full":1000000000000000,"wide":70,"signed":0}',
                              b'{"full":5,"wide":1000878107878108,"signed":0}', b'{"full":5,"wide":69,"signed":0}',
                              b'{"full":5,"wide":999999999999999,"signed":-123456790}', b'{"full":5,"wide":1000878107878099,"signed":987654322}',
                              b'{"full":5,"wide":1000778107878107,"signed":-99999999}', b'{"full":05,"wide":70,"signed":0}'],
    "price.regex": [b"Apple 12.50", b"Apple 1234", b"apple 1"],
    "arith.gbnf": [b"1+2*(3-4)", b"1+", b"(1"],
}

# Documented differences (docs/grammar.md): numbers' bounds other than a non-negative minimum are
# not enforced; additional properties may repeat a declared key. Strings touching them are
# skipped from the exact comparison, not from the jsonschema check of complete strings.
def known_difference(name, data):
    # llguidance bounds a number with a minimum exactly (and refuses huge exponents there); the
    # engine enforces only the sign of such numbers.
    return name == "config.schema.json" and re.search(rb'"ratio":[-0-9.]*[eE]', data) is not None


def main():
    rng = random.Random(1234)
    files = sorted(f for f in os.listdir(CORPUS) if f.endswith((".schema.json", ".regex", ".gbnf")))
    total = mismatches = invalid = 0
    for name in files:
        path = os.path.join(CORPUS, name)
        kind = "json_schema" if name.endswith(".json") else "regex" if name.endswith(".regex") else "ebnf"
        src = open(path, encoding="utf-8").read()
        llg = ll_grammar(kind, src)
        ws = walks(kind, path, 12, rng.randrange(1 << 30))
        strings = [w for w, _ in ws] + EXTRA.get(name, [])
        for w, _ in ws[:8]:
            strings += mutations(w, rng)
        strings = list(dict.fromkeys(strings))
        got = c_decide(kind, path, strings)
        assert len(got) == len(strings), (name, len(got), len(strings))
        for s, c in zip(strings, got):
            total += 1
            want = ll_decide(llg, s)
            if c != want and not known_difference(name, s):
                mismatches += 1
                if mismatches <= 30:
                    print(f"MISMATCH {name}: {s!r}: engine {c}, llguidance {want}")
            if c == "complete" and not oracle_ok(kind, src, s):
                invalid += 1
                print(f"INVALID {name}: {s!r} accepted as complete but fails the {kind} validator")
        for w, done in ws:
            if done and not oracle_ok(kind, src, w):
                invalid += 1
                print(f"INVALID WALK {name}: {w!r}")
        print(f"{name}: {len(strings)} strings, {sum(d for _, d in ws)}/{len(ws)} walks finished")
    print(f"test_grammar.py: {total} strings over {len(files)} grammars ({GGUF}), {mismatches} disagreements with "
          f"llguidance, {invalid} accepted strings invalid")
    sys.exit(1 if mismatches or invalid else 0)


if __name__ == "__main__":
    main()
