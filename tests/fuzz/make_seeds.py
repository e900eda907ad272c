#!/usr/bin/env python3
"""tests/fuzz/make_seeds.py - writes the seed corpora of the fuzz targets into
tests/fuzz/corpus/<target>/seed-*: small valid inputs of each format, hand-encoded (protobuf,
safetensors) or written with gguf-py (GGUF; skipped when gguf-py is not installed), plus the
stories260K config.json when the shared assets are there. Inputs that campaigns found are
kept beside them (tests/fuzz/corpus/<target>/<sha1>, regressions named regress-*); this script
only rewrites seed-* files. Run: python3 tests/fuzz/make_seeds.py"""
import json
import os
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def put(target, name, data):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(d, "seed-" + name), "wb") as f:
        f.write(data)


# ---- protobuf, by hand ------------------------------------------------------------------------
def varint(v):
    v &= (1 << 64) - 1
    out = b""
    while v >= 0x80:
        out += bytes([v & 0x7F | 0x80])
        v >>= 7
    return out + bytes([v])


def f_varint(n, v):
    return varint(n << 3) + varint(v)


def f_bytes(n, b):
    if isinstance(b, str):
        b = b.encode()
    return varint(n << 3 | 2) + varint(len(b)) + b


def f_float(n, x):
    return varint(n << 3 | 5) + struct.pack("<f", x)


def packed(n, values):
    return f_bytes(n, b"".join(varint(v) for v in values))


def sampling_full():
    return (f_varint(1, 16) + f_float(2, 0.8) + f_varint(3, 40) + f_float(4, 0.9) + f_float(5, 0.05)
            + f_float(6, 1.1) + f_float(7, 0.5) + f_float(8, 0.25) + f_varint(9, 7) + f_bytes(10, ".")
            + f_bytes(10, "The end") + packed(11, [2]) + f_varint(12, 0) + f_varint(13, 1) + f_varint(14, 2)
            + f_varint(15, 1) + f_varint(16, 2) + f_bytes(17, f_varint(1, 5) + f_float(2, 1.5)))


def convert_seeds():
    gen = lambda body: b"\x00" + body
    put("convert", "generate-text", gen(f_bytes(1, "r1") + f_bytes(2, "Once upon a time") + f_bytes(4, sampling_full())
                                        + f_varint(5, 1)))
    put("convert", "generate-ids", gen(packed(3, [1, 403, 407]) + f_bytes(4, f_varint(1, 4)) + f_bytes(6, "tiny-lora")))
    put("convert", "generate-merge", gen(f_bytes(2, "Hi") + f_bytes(4, f_varint(1, 4)) + f_bytes(4, f_float(2, 0.5))))
    put("convert", "generate-nul", gen(f_bytes(2, "a\0b")))
    msg = lambda role, text: f_bytes(2, f_bytes(1, role) + f_bytes(2, text))
    put("convert", "chat", b"\x01" + f_bytes(1, "c1") + msg("system", "Be brief.") + msg("user", "Hi")
        + msg("assistant", "Hello.") + msg("user", "Tell a story.") + f_bytes(3, f_varint(1, 8)) + f_bytes(4, "tiny-lora"))
    put("convert", "tokenize", b"\x02" + f_bytes(1, "Hello world") + f_varint(2, 1))
    put("convert", "detokenize", b"\x03" + packed(1, [68, 3, 69]))
    put("convert", "cancel", b"\x04" + f_bytes(1, "r1"))
    put("convert", "model-info", b"\x05")
    put("convert", "health", b"\x06" + f_bytes(1, "shardlm.v1.TextGeneration"))
    put("convert", "reflection-list", b"\x07" + f_bytes(1, "localhost") + f_bytes(7, "*"))
    put("convert", "reflection-symbol", b"\x07" + f_bytes(4, "shardlm.v1.TextGeneration"))


# ---- OpenAI bodies ----------------------------------------------------------------------------
def http_seeds():
    put("http_openai", "completion", b"\x00" + json.dumps({
        "model": "stories260K", "prompt": "Once upon a time", "max_tokens": 16, "temperature": 0.7,
        "top_p": 0.9, "n": 2, "stop": [".", "\n"], "seed": 3, "logprobs": 2,
        "presence_penalty": 0.5, "frequency_penalty": 0.1, "logit_bias": {"5": -100},
        "stream": True, "stream_options": {"include_usage": True}, "user": "u"}).encode())
    put("http_openai", "completion-echo", b"\x00" + json.dumps({"model": "stories260K", "prompt": "Once",
                                                               "echo": True, "max_tokens": 2}).encode())
    put("http_openai", "completion-ids", b"\x00" + json.dumps({"model": "tiny-lora", "prompt": [1, 403, 407],
                                                              "max_tokens": 4}).encode())
    put("http_openai", "completion-prompts", b"\x00" + json.dumps({"prompt": ["Once", [1, 403, 407], "The dog"],
                                                                  "n": 2, "echo": True, "logprobs": 1,
                                                                  "max_tokens": 3}).encode())
    put("http_openai", "chat", b"\x01" + json.dumps({
        "model": "stories260K", "messages": [
            {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello."},
            {"role": "user", "content": [{"type": "text", "text": "Tell a story."}]}],
        "max_completion_tokens": 8, "logprobs": True, "top_logprobs": 2, "stop": "The end"}).encode())
    put("http_openai", "chat-nul", b"\x01" + b'{"messages": [{"role": "user", "content": "a\\u0000b"}]}')


def proxy_seeds():
    """A replica's answers as the router reads them (first byte: 1 for a HEAD request)."""
    sse = b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in
                   [b'data: {"choices":[{"delta":{"content":"Once"}}]}\n\n', b"data: [DONE]\n\n"])
    put("proxy_reply", "sse-chunked", b"\x00HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n" + sse + b"0\r\nX-T: 1\r\n\r\n")
    put("proxy_reply", "length", b"\x00HTTP/1.1 404 Not Found\r\nContent-Length: 11\r\n\r\n{\"error\":1}")
    put("proxy_reply", "eof", b"\x00HTTP/1.0 200 OK\r\n\r\nto the end")
    put("proxy_reply", "head", b"\x01HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n")


# ---- safetensors ------------------------------------------------------------------------------
def safetensors(tensors, metadata=None, pad_to=8):
    header, data = {}, b""
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    if metadata is not None:
        header["__metadata__"] = metadata
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % pad_to)
    return struct.pack("<Q", len(h)) + h + data


def safetensors_seeds():
    f32 = struct.pack("<6f", 1, -2, 3.5, 0, 1e-3, -7)
    put("safetensors", "dtypes", safetensors([
        ("a.f32", "F32", [2, 3], f32), ("b.bf16", "BF16", [4], struct.pack("<4H", 0x3F80, 0xC000, 0x7F80, 1)),
        ("c.f16", "F16", [2, 1], struct.pack("<2H", 0x3C00, 0x8001)), ("d.i32", "I32", [2], struct.pack("<2i", 7, -7)),
        ("e.f64", "F64", [1], struct.pack("<d", 2.0)), ("f.scalar", "F32", [], struct.pack("<f", 5)),
        ("g.empty", "F32", [0, 4], b"")], {"format": "pt"}))
    put("safetensors", "empty", safetensors([]))
    put("safetensors", "unknown-dtype", safetensors([("x", "F8_E4M3", [3], b"\x01\x02\x03"), ("y", "U8", [1], b"\x09")]))
    # shardlm's block tensors: a Q8_0 matrix [2, 32] as U8 [2, 34], named in "shardlm.blocks".
    q8 = (struct.pack("<e", 0.5) + bytes(range(32))) * 2
    put("safetensors", "blocks", safetensors([("w", "U8", [2, 34], q8), ("n", "F32", [2], struct.pack("<2f", 1, 2))],
                                             {"format": "pt", "shardlm.blocks": json.dumps({"w": "Q8_0"})}))


# ---- GGUF (gguf-py) ---------------------------------------------------------------------------
def gguf_seeds():
    try:
        import numpy as np
        import gguf
        from gguf import GGMLQuantizationType as Q
    except ImportError as e:
        print(f"make_seeds: no GGUF seeds ({e})")
        return
    import tempfile
    rng = np.random.default_rng(5)
    tmp = tempfile.mkdtemp()

    def write(name, fill):
        path = os.path.join(tmp, name + ".gguf")
        w = gguf.GGUFWriter(path, arch="llama")
        fill(w)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        put("gguf", name, open(path, "rb").read())

    def tensors(w):
        w.add_uint32("llama.block_count", 1)
        w.add_float32("t.f32", 0.5)
        w.add_int64("t.i64", -3)
        w.add_bool("t.bool", True)
        w.add_string("t.str", "héllo")
        w.add_array("t.arr_f32", [0.5, -1.25])
        w.add_tensor("t.F32", rng.standard_normal((2, 8)).astype(np.float32))
        w.add_tensor("t.F16", rng.standard_normal((1, 8)).astype(np.float16))
        for q in (Q.Q4_0, Q.Q8_0, Q.Q4_K, Q.Q6_K):
            block, size = gguf.GGML_QUANT_SIZES[q]
            raw = rng.integers(0, 256, size=(1, size), dtype=np.uint8)
            raw[:, 0:2] = np.array([0x3C00 & 0xFF, 0x3C00 >> 8], dtype=np.uint8)  # scale 1.0
            w.add_tensor("t." + q.name, raw, raw_dtype=q)

    def tokenizer(w, byte_piece=True):
        # One byte piece: SentencePiece then wants all 256 (byte_fallback), and refuses it.
        toks = [("<unk>", 0.0, 2), ("<s>", 0.0, 3), ("</s>", 0.0, 3),
                ("<0x41>", 0.0, 6) if byte_piece else ("c", -3.0, 1), ("\u2581a", -1.0, 1), ("b", -2.0, 1)]
        w.add_tokenizer_model("llama")
        w.add_token_list([t[0] for t in toks])
        w.add_token_scores([t[1] for t in toks])
        w.add_token_types([t[2] for t in toks])
        w.add_bos_token_id(1)
        w.add_eos_token_id(2)
        w.add_unk_token_id(0)

    def gemma3(w):
        # A whole (tiny) Gemma 3 that gguf_convert imports: d 8, 2 heads of 4, 1 KV head, ffn 16.
        d, nh, nkv, hd, ffn = 8, 2, 1, 4, 16
        w.add_context_length(32)
        w.add_embedding_length(d)
        w.add_block_count(1)
        w.add_feed_forward_length(ffn)
        w.add_head_count(nh)
        w.add_head_count_kv(nkv)
        w.add_key_length(hd)
        w.add_value_length(hd)
        w.add_sliding_window(16)
        w.add_layer_norm_rms_eps(1e-6)
        tokenizer(w, byte_piece=False)
        vocab = 6
        shapes = {"token_embd.weight": (vocab, d), "output_norm.weight": (d,)}
        for name, shape in [("attn_norm", (d,)), ("attn_q", (nh * hd, d)), ("attn_k", (nkv * hd, d)),
                            ("attn_v", (nkv * hd, d)), ("attn_output", (d, nh * hd)), ("attn_q_norm", (hd,)),
                            ("attn_k_norm", (hd,)), ("post_attention_norm", (d,)), ("ffn_norm", (d,)),
                            ("ffn_gate", (ffn, d)), ("ffn_up", (ffn, d)), ("ffn_down", (d, ffn)),
                            ("post_ffw_norm", (d,))]:
            shapes[f"blk.0.{name}.weight"] = shape
        for name, shape in shapes.items():
            w.add_tensor(name, rng.standard_normal(shape).astype(np.float32))

    write("tensors", tensors)
    write("tokenizer", tokenizer)
    path = os.path.join(tmp, "gemma3.gguf")
    w = gguf.GGUFWriter(path, arch="gemma3")
    gemma3(w)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    put("gguf", "gemma3", open(path, "rb").read())


# ---- JSON inputs ------------------------------------------------------------------------------
def config_seeds():
    llama = {"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 172,
             "num_hidden_layers": 5, "num_attention_heads": 8, "num_key_value_heads": 4, "vocab_size": 512,
             "max_position_embeddings": 512, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "rope_style": "pairs",
             "tie_word_embeddings": True, "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "float32"}
    put("config", "stories260K", json.dumps(llama, indent=1))
    put("config", "mistral", json.dumps({"architectures": ["MistralForCausalLM"], "hidden_size": 32,
                                         "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                                         "num_key_value_heads": 2, "vocab_size": 100, "sliding_window": None,
                                         "eos_token_id": [2, 3], "torch_dtype": "bfloat16"}))
    put("config", "gpt2", json.dumps({"architectures": ["GPT2LMHeadModel"], "n_embd": 32, "n_layer": 2, "n_head": 4,
                                      "vocab_size": 100, "n_positions": 64, "n_inner": None,
                                      "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5}))
    put("config", "gemma3", json.dumps({"architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
                                        "text_config": {"model_type": "gemma3_text", "hidden_size": 64,
                                                        "intermediate_size": 128, "num_hidden_layers": 6,
                                                        "num_attention_heads": 4, "num_key_value_heads": 1,
                                                        "head_dim": 16, "vocab_size": 300,
                                                        "layer_types": ["sliding_attention"] * 5 + ["full_attention"],
                                                        "rope_scaling": None, "query_pre_attn_scalar": 16},
                                        "torch_dtype": "bfloat16"}))


def megatron_seeds():
    meta = {"format": "shardlm-megatron", "version": 1, "tp_size": 2, "pp_size": 2, "n_layers": 2,
            "layers_per_stage": [1, 1], "vocab_size": 10, "padded_vocab_size": 10,
            "tensor_names": "megatron-core-local", "qkv_layout": "megatron-core-grouped",
            "fc1_layout": "gate-up-per-rank"}
    put("megatron", "tp2-pp2", json.dumps(meta, indent=1))
    put("megatron", "tp1-pp1", json.dumps(dict(meta, tp_size=1, pp_size=1, layers_per_stage=[2])))
    put("megatron", "padded", json.dumps(dict(meta, padded_vocab_size=12)))


def chat_seeds():
    def msgs(*pairs):
        return b"\0".join(bytes([role]) + (text if isinstance(text, bytes) else text.encode()) for role, text in pairs)
    conv = msgs((0, "Be brief."), (1, "Hi"), (2, "Hello."), (1, "Tell a story."))
    for k, name in enumerate(["plain", "llama2", "chatml", "gemma"]):
        put("chat_template", name, bytes([k, 0]) + conv)
    put("chat_template", "llama2-train", bytes([1, 1]) + conv + b"\0" + msgs((2, "Once upon a time.")))
    put("chat_template", "bytes", bytes([0, 0]) + msgs((1, "\u00e9\u2581<s>".encode() + b"\xff\xc3")))


def detokenize_seeds():
    ids = lambda *v: struct.pack(f"<{len(v)}H", *v)
    put("detokenize", "text", ids(1, 403, 407, 261, 378, 2))
    put("detokenize", "bytes", ids(68, 3, 69, 0xE2 + 3, 0x82 + 3, 0xAC + 3, 0x8000 | 0xF0 + 3, 300))
    put("detokenize", "out-of-range", ids(511, 512, 0x7FFF, 1))


def train_seeds():
    lines = [{"text": "Once upon a time there was a dog."},
             {"prompt": "Once upon a time", "completion": " there was a cat."},
             {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Who?"},
                           {"role": "assistant", "content": "Lily."}]},
             {"conversations": [{"from": "human", "value": "Where?"}, {"from": "gpt", "value": "The park."}]}]
    body = "\n".join(json.dumps(x) for x in lines) + "\n\n"
    for k in range(4):
        put("train_data", f"template{k}", bytes([k, 56]) + body.encode())
    put("train_data", "short-seq-truncate", bytes([4 * 0 + 1, 0]) + body.encode())
    put("train_data", "short-seq-skip", bytes([4 * 1 + 0, 0]) + body.encode())


def grammar_seeds():
    """fuzz_grammar: the kind byte (0 JSON Schema, 1 JSON object, 2 regex, 3 GBNF, 4 choice), then
    the source: every file of tests/data/grammar plus a few hand-written ones."""
    corpus = os.path.join(HERE, "..", "data", "grammar")
    for f in sorted(os.listdir(corpus)):
        kind = 0 if f.endswith(".json") else 2 if f.endswith(".regex") else 3
        with open(os.path.join(corpus, f), "rb") as fh:
            put("grammar", f.replace(".", "_"), bytes([kind]) + fh.read())
    put("grammar", "json_object", bytes([1]))
    put("grammar", "choice", bytes([4]) + b'["yes","no","maybe"]')
    put("grammar", "gbnf_json", bytes([3]) + rb"""root ::= object
value ::= object | array | string | number | ("true" | "false" | "null") ws
object ::= "{" ws ( string ":" ws value ("," ws string ":" ws value)* )? "}" ws
array ::= "[" ws ( value ("," ws value)* )? "]" ws
string ::= "\"" ( [^"\\\x7F\x00-\x1F] | "\\" (["\\bfnrt] | "u" [0-9a-fA-F]{4}) )* "\"" ws
number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws
ws ::= | " " | "\n" [ \t]{0,20}
""")
    put("grammar", "regex_classes", bytes([2]) + rb"^[\w.-]+@(\d{1,3}\.){3}\d{1,3}|[^\s]?(?:x|y)*?$")
    put("grammar", "bad_leftrec", bytes([3]) + b'root ::= root "a" | "b"')
    # Parallel tool calls in the hermes format (server/http_tools.c native_schema).
    put("grammar", "parallel_calls_schema", bytes([0]) + json.dumps({
        "x-shardlm-prefix": "<tool_call>\n", "x-shardlm-repeat": {"close": "\n</tool_call>", "open": "\n<tool_call>\n"},
        "anyOf": [{"type": "object", "properties": {"name": {"const": "f"}, "arguments": {
            "type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}},
            "required": ["name", "arguments"], "additionalProperties": False}]}).encode())
    # DeepSeek's calls (server/http_tools.c deepseek_schema): tagged branches, a list closed by "end".
    put("grammar", "deepseek_calls_schema", bytes([0]) + json.dumps({
        "x-shardlm-escape": "<", "x-shardlm-repeat": {"close": "<\uff5ctool\u2581call\u2581end\uff5c>",
                                                       "open": "<\uff5ctool\u2581call\u2581begin\uff5c>",
                                                       "end": "<\uff5ctool\u2581calls\u2581end\uff5c>"},
        "anyOf": [{"x-shardlm-prefix": "f<\uff5ctool\u2581sep\uff5c>", "type": "object",
                   "properties": {"x": {"type": "integer"}}, "required": ["x"]}]}, ensure_ascii=False).encode())


# ---- Responses API bodies (byte 0: the served template, as http_openai's bits 1-4) -----------
def responses_seeds():
    tool = {"type": "function", "name": "get_weather", "description": "weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
    put("http_responses", "text", b"\x00" + json.dumps({
        "model": "stories260K", "input": "Once upon a time", "instructions": "Be brief.", "max_output_tokens": 8,
        "temperature": 0.7, "top_p": 0.9, "seed": 3, "metadata": {"k": "v"}, "store": False, "stream": True,
        "user": "u", "truncation": "disabled", "include": [], "background": False}).encode())
    put("http_responses", "items-tools", b"\x03" + json.dumps({
        "input": [{"role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
                  {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{\"city\":\"Paris\"}"},
                  {"type": "function_call_output", "call_id": "c1", "output": "18 C"},
                  {"type": "message", "role": "assistant", "content": [
                      {"type": "output_text", "text": "Sunny.", "annotations": [], "logprobs": []}]},
                  {"type": "reasoning", "id": "rs_1", "summary": []}],
        "tools": [tool], "tool_choice": {"type": "function", "name": "get_weather"},
        "parallel_tool_calls": False}).encode())
    put("http_responses", "json-schema", b"\x19" + json.dumps({
        "input": "JSON please", "reasoning": {"effort": "none"},
        "text": {"format": {"type": "json_schema", "name": "x", "strict": True,
                            "schema": {"type": "object", "properties": {"a": {"type": "integer"}}}}}}).encode())
    put("http_responses", "previous", b"\x00" + json.dumps({"input": "again", "previous_response_id": "resp_x"}).encode())


def spm_seeds():
    """SentencePiece BPE protos for fuzz_spm: a 2-byte little-endian length, the ModelProto, a text."""
    NORMAL, UNKNOWN, CONTROL, USER, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

    def piece(text, score, kind=NORMAL):
        return f_bytes(1, f_bytes(1, text) + f_float(2, score) + f_varint(3, kind))

    def model(pieces, trainer, normalizer):
        return b"".join(pieces) + f_bytes(2, trainer) + f_bytes(3, normalizer)

    base = [piece("<unk>", 0, UNKNOWN), piece("<s>", 0, CONTROL), piece("</s>", 0, CONTROL)]
    words = [("\u2581", -1), ("a", -2), ("b", -3), ("c", -4), ("ab", -5), ("\u2581a", -6), ("\u2581ab", -7),
             ("abc", -8), ("bc", -9), ("ca", -10, UNUSED), ("cab", -11), ("<tag>", 0, USER), ("  ", 0, USER),
             ("\u00e9", -12)]
    normal = [piece(*w) for w in words]
    bytes_ = [piece("<0x%02X>" % i, 0, BYTE) for i in range(256)]
    text = "  ab abc <tag> cacab  caca \u00e9\u00e8 <s>x</s> ".encode() + b"\xff\xc3 \xe2\x96\x81ab"
    m1 = model(base + normal + bytes_, f_varint(3, 2) + f_varint(35, 1),
               f_bytes(1, "identity") + f_varint(3, 1) + f_varint(4, 1) + f_varint(5, 1))
    put("spm", "byte-fallback", struct.pack("<H", len(m1)) + m1 + text)
    m2 = model(base + normal, f_varint(3, 2) + f_varint(24, 1) + f_bytes(44, "??"),
               f_bytes(1, "identity") + f_varint(3, 0) + f_varint(4, 0) + f_varint(5, 0))
    put("spm", "unk-runs-suffix", struct.pack("<H", len(m2)) + m2 + text)
    m3 = model(base + normal, f_varint(3, 1), f_bytes(1, "identity"))
    put("spm", "unigram", struct.pack("<H", len(m3)) + m3 + text)


def main():
    convert_seeds()
    http_seeds()
    proxy_seeds()
    responses_seeds()
    safetensors_seeds()
    gguf_seeds()
    config_seeds()
    megatron_seeds()
    chat_seeds()
    detokenize_seeds()
    train_seeds()
    grammar_seeds()
    spm_seeds()


if __name__ == "__main__":
    sys.exit(main())
