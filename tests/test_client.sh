#!/bin/bash
# tests/test_client.sh SHARDLM [TEST_CLIENT_LIB] - the C client (clients/) against a real
# `shardlm serve` of stories260K on a free 127.0.0.1 port: greedy `shardlm complete` equals
# `shardlm generate`, unary and streamed alike; a piped `shardlm chat` keeps its conversation
# over two turns; Ctrl-C at a terminal cancels a reply and, at the prompt, quits (130);
# `shardlm bench` runs 8 requests 4 at a time without error; API keys, TLS, deadlines, no
# server (UNAVAILABLE, exit 1) and bad flags (exit 2); and, given TEST_CLIENT_LIB
# (tests/test_client_lib.c), the library method by method against the same server.
# Prints SKIP and exits 77 when the stories260K assets are absent.
# Registered by tests/client.cmake (label "server"). Loopback only; every wait is bounded; the
# servers are killed on every exit path.
set -u

BIN=${1:?usage: test_client.sh path/to/shardlm [path/to/test_client_lib]}
LIB_TEST=${2:-}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
ASSETS=${SHARDLM_ASSETS:-$ROOT/../shared/assets}
CKPT=$ASSETS/stories260K/stories260K.bin
TOK=$ASSETS/stories260K/tok512.model
if [ ! -f "$CKPT" ] || [ ! -f "$TOK" ]; then
    echo "SKIP: stories260K assets not found under $ASSETS (set SHARDLM_ASSETS)"
    exit 77
fi

WORK=$(mktemp -d "${TMPDIR:-/tmp}/shardlm-client-test.XXXXXX")
SERVER_PIDS=()
cleanup() {
    for pid in "${SERVER_PIDS[@]}"; do
        kill -TERM "$pid" 2>/dev/null
    done
    for pid in "${SERVER_PIDS[@]}"; do
        # a bounded wait for the drain, then the hard way
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$pid" 2>/dev/null
        wait "$pid" 2>/dev/null
    done
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

FAILS=0
pass() { echo "ok   - $1"; }
fail() { echo "FAIL - $1"; FAILS=$((FAILS + 1)); }
die()  { echo "FAIL - $1"; exit 1; }
# Runs a command with a time limit; stdout/stderr to the files given. Returns its exit code.
run() { local out=$1 err=$2; shift 2; timeout 120 "$@" > "$out" 2> "$err"; }

MODEL=$WORK/model
"$BIN" convert llama2c --checkpoint "$CKPT" --tokenizer "$TOK" --out "$MODEL" > /dev/null 2>&1 \
    || die "shardlm convert llama2c failed"

# Starts `shardlm serve` on a free port (--listen 127.0.0.1:0) with extra flags; sets ADDR.
start_server() {
    local name=$1; shift
    "$BIN" serve --model "$MODEL" --listen 127.0.0.1:0 "$@" \
        > "$WORK/$name.out" 2> "$WORK/$name.err" &
    local pid=$!
    SERVER_PIDS+=("$pid")
    for _ in $(seq 600); do
        if grep -q '^shardlm: ready' "$WORK/$name.out" 2>/dev/null; then
            # "shardlm: listening on HOST:PORT" (with " (TLS)" after it for a TLS server)
            ADDR=$(sed -n 's/^shardlm: listening on \([^ ]*\).*/\1/p' "$WORK/$name.out" | head -n 1)
            [ -n "$ADDR" ] && return 0
        fi
        kill -0 "$pid" 2>/dev/null || { cat "$WORK/$name.err"; die "shardlm serve ($name) exited before it was ready"; }
        sleep 0.1
    done
    cat "$WORK/$name.err"
    die "shardlm serve ($name) was not ready within 60 s"
}

start_server main
echo "# server at $ADDR"

# ---- the library, method by method ----------------------------------------------------------
if [ -n "$LIB_TEST" ]; then
    if timeout 300 "$LIB_TEST" "$ADDR" > "$WORK/lib.out" 2>&1; then
        pass "test_client_lib ($(grep -c '^ok' "$WORK/lib.out") checks)"
    else
        fail "test_client_lib"; cat "$WORK/lib.out"
    fi
fi

# ---- complete: unary and streamed, against `shardlm generate` (greedy) ----------------------
for prompt in "Once upon a time" "The little dog" ""; do
    label="prompt '${prompt}'"
    run "$WORK/gen.txt" "$WORK/gen.err" "$BIN" generate --model "$MODEL" --prompt "$prompt" \
        --max-tokens 48 --temperature 0 || die "shardlm generate failed: $(cat "$WORK/gen.err")"
    if run "$WORK/c.txt" "$WORK/c.err" "$BIN" complete --server "$ADDR" --prompt "$prompt" \
           --max-tokens 48 --temperature 0 && cmp -s "$WORK/gen.txt" "$WORK/c.txt"; then
        pass "complete equals generate ($label)"
    else
        fail "complete equals generate ($label)"; diff "$WORK/gen.txt" "$WORK/c.txt"; cat "$WORK/c.err"
    fi
    if run "$WORK/s.txt" "$WORK/s.err" "$BIN" complete --server "$ADDR" --prompt "$prompt" \
           --max-tokens 48 --temperature 0 --stream && cmp -s "$WORK/gen.txt" "$WORK/s.txt"; then
        pass "complete --stream equals generate ($label)"
    else
        fail "complete --stream equals generate ($label)"; diff "$WORK/gen.txt" "$WORK/s.txt"; cat "$WORK/s.err"
    fi
done

# Seeded sampling is reproducible, unary or streamed.
run "$WORK/r1.txt" "$WORK/r1.err" "$BIN" complete --server "$ADDR" --prompt "Once" --max-tokens 32 \
    --temperature 0.9 --seed 1234
run "$WORK/r2.txt" "$WORK/r2.err" "$BIN" complete --server "$ADDR" --prompt "Once" --max-tokens 32 \
    --temperature 0.9 --seed 1234 --stream
if [ -s "$WORK/r1.txt" ] && cmp -s "$WORK/r1.txt" "$WORK/r2.txt"; then
    pass "complete --seed is reproducible (unary = stream)"
else
    fail "complete --seed is reproducible"; cat "$WORK/r1.txt" "$WORK/r2.txt" "$WORK/r1.err" "$WORK/r2.err"
fi

# --logprobs K: one line per generated token with K alternatives.
if run "$WORK/lp.txt" "$WORK/lp.err" "$BIN" complete --server "$ADDR" --prompt "Once upon a time" \
       --max-tokens 6 --logprobs 2 --no-echo \
   && [ "$(grep -c '^ *[0-9][0-9]*  .*\[.*,.*\]$' "$WORK/lp.txt")" -eq 6 ]; then
    pass "complete --logprobs 2"
else
    fail "complete --logprobs 2"; cat "$WORK/lp.txt" "$WORK/lp.err"
fi

# ---- chat through a pipe: two turns, the second sent with the first ------------------------
printf 'Hello, who are you?\n\nTell me about the park.\n' > "$WORK/chat.in"
if timeout 120 "$BIN" chat --server "$ADDR" --max-tokens 24 --temperature 0 --stats \
       < "$WORK/chat.in" > "$WORK/chat.out" 2> "$WORK/chat.err"; then
    pass "chat exits 0 at end of input"
else
    fail "chat exits 0 at end of input (exit $?)"; cat "$WORK/chat.err"
fi
# "shardlm chat: turn N: ID: prompt P tokens, generated G tokens (REASON), S s"
turns=$(grep -c '^shardlm chat: turn [0-9]*: .* generated [1-9][0-9]* tokens' "$WORK/chat.err")
p1=$(sed -n 's/^shardlm chat: turn 1: .*prompt \([0-9]*\) tokens, generated \([0-9]*\).*/\1/p' "$WORK/chat.err")
g1=$(sed -n 's/^shardlm chat: turn 1: .*prompt \([0-9]*\) tokens, generated \([0-9]*\).*/\2/p' "$WORK/chat.err")
p2=$(sed -n 's/^shardlm chat: turn 2: .*prompt \([0-9]*\) tokens.*/\1/p' "$WORK/chat.err")
if [ "$turns" -eq 2 ] && [ -n "$(tr -d '[:space:]' < "$WORK/chat.out")" ]; then
    pass "chat holds 2 turns with non-empty replies"
else
    fail "chat holds 2 turns with non-empty replies"; cat "$WORK/chat.out" "$WORK/chat.err"
fi
if [ -n "$p1" ] && [ -n "$g1" ] && [ -n "$p2" ] && [ "$p2" -gt $((p1 + g1)) ]; then
    pass "chat sends the conversation again (turn 2 prompt $p2 > $p1 + $g1 tokens)"
else
    fail "chat keeps the conversation (turn 1 prompt '$p1' + reply '$g1', turn 2 prompt '$p2')"
fi
# The first reply equals the unary Chat of the same message: a chat with one line.
printf 'Hello, who are you?\n' | timeout 60 "$BIN" chat --server "$ADDR" --max-tokens 24 \
    --temperature 0 > "$WORK/chat1.out" 2> /dev/null
if [ -s "$WORK/chat1.out" ] && [ "$(head -c "$(wc -c < "$WORK/chat1.out")" "$WORK/chat.out")" = "$(cat "$WORK/chat1.out")" ]; then
    pass "chat's first reply is deterministic at temperature 0"
else
    fail "chat's first reply is deterministic at temperature 0"; cat "$WORK/chat1.out"
fi

# ---- chat at a terminal: Ctrl-C cancels the reply, then quits at the prompt -----------------
if command -v python3 > /dev/null; then
    cat > "$WORK/pty_chat.py" <<'EOF'
import os, pty, select, sys, time

BIN, ADDR = sys.argv[1], sys.argv[2]

def attempt():
    pid, fd = pty.fork()
    if pid == 0:
        os.execv(BIN, [BIN, "chat", "--server", ADDR, "--max-tokens", "480", "--ignore-eos"])
    out = bytearray()

    def wait_for(pred, seconds):
        end = time.time() + seconds
        while time.time() < end:
            if pred():
                return True
            r, _, _ = select.select([fd], [], [], 0.02)
            if r:
                try:
                    chunk = os.read(fd, 4096)
                except OSError:
                    return pred()
                if not chunk:
                    return pred()
                out.extend(chunk)
        return pred()

    def exit_code(seconds):
        end = time.time() + seconds
        while time.time() < end:
            wait_for(lambda: False, 0.05)
            done, st = os.waitpid(pid, os.WNOHANG)
            if done:
                return os.waitstatus_to_exitcode(st)
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        return None

    try:
        if not wait_for(lambda: out.endswith(b"> "), 30):
            return "no prompt", bytes(out)
        line = b"Tell me a long story\r\n"
        os.write(fd, b"Tell me a long story\n")
        # Ctrl-C as soon as the reply has begun.
        if not wait_for(lambda: len(out) > out.find(line) + len(line) >= len(line), 30):
            return "no reply", bytes(out)
        os.write(fd, b"\x03")
        if not wait_for(lambda: b"reply cancelled" in out or out.endswith(b"\n> "), 30):
            return "no answer to Ctrl-C", bytes(out)
        if b"reply cancelled" not in out:
            exit_code(1)
            return "retry", bytes(out)  # the reply finished before Ctrl-C arrived
        if not wait_for(lambda: out.endswith(b"> "), 30):
            return "no prompt after the cancel", bytes(out)
        os.write(fd, b"\x03")
        code = exit_code(30)
        if code != 130:
            return "Ctrl-C at the prompt gave exit %r" % code, bytes(out)
        return "ok", bytes(out)
    finally:
        try:
            os.close(fd)
        except OSError:
            pass

for _ in range(3):
    verdict, out = attempt()
    print(verdict)
    print(out.decode(errors="replace"))
    if verdict != "retry":
        break
sys.exit(0 if verdict == "ok" else 1)
EOF
    if timeout 120 python3 "$WORK/pty_chat.py" "$BIN" "$ADDR" > "$WORK/pty.log" 2>&1; then
        pass "chat: Ctrl-C cancels the reply, Ctrl-C at the prompt exits 130"
    else
        fail "chat: Ctrl-C cancels the reply, Ctrl-C at the prompt exits 130"; cat "$WORK/pty.log"
    fi
    # A journaling server keeps a call whose client went for --journal-detach-grace (it cannot
    # tell a cancel from a lost connection): the client cancels the request by its token too.
    MAIN_ADDR=$ADDR
    start_server journal --journal "$WORK/journal"
    if timeout 120 python3 "$WORK/pty_chat.py" "$BIN" "$ADDR" > "$WORK/pty_journal.log" 2>&1 &&
       grep -q 'cancelled by Cancel' "$WORK/journal.err"; then
        pass "chat: Ctrl-C against a journaling server cancels the request by its token (Cancel)"
    else
        fail "chat: Ctrl-C against a journaling server cancels the request by its token"
        cat "$WORK/pty_journal.log"; grep -i 'cancel\|went away' "$WORK/journal.err"
    fi
    ADDR=$MAIN_ADDR
else
    echo "skip - chat Ctrl-C at a terminal (no python3)"
fi

# ---- bench --------------------------------------------------------------------------------
if run "$WORK/bench.out" "$WORK/bench.err" "$BIN" bench --server "$ADDR" --concurrency 4 --requests 8 \
       --max-tokens 32 \
   && grep -q '^requests: *8 ok, 0 failed' "$WORK/bench.out" \
   && grep -q '^TTFT ms: *p50' "$WORK/bench.out" && grep -q '^inter-token ms: *p50' "$WORK/bench.out"; then
    pass "bench --concurrency 4 --requests 8: 8 ok"
else
    fail "bench --concurrency 4 --requests 8"; cat "$WORK/bench.out" "$WORK/bench.err"
fi

# ---- deadlines ----------------------------------------------------------------------------
# 5 ms: 480 streamed tokens (one gRPC message each) cannot all arrive that soon; 20 ms nearly could
# on a fast CPU (the library check above met that race).
run "$WORK/dl.out" "$WORK/dl.err" "$BIN" complete --server "$ADDR" --prompt "Once" --max-tokens 480 \
    --ignore-eos --timeout 0.005 --stream
rc=$?
if [ $rc -eq 1 ] && grep -q '^shardlm: error: DEADLINE_EXCEEDED: ' "$WORK/dl.err"; then
    pass "complete --timeout: DEADLINE_EXCEEDED, exit 1"
else
    fail "complete --timeout: DEADLINE_EXCEEDED, exit 1 (exit $rc)"; cat "$WORK/dl.err"
fi

# ---- a server that is not there -----------------------------------------------------------
# Port 1 on loopback: privileged, and nothing listens there on a test machine.
DEAD=127.0.0.1:1
for sub in complete chat bench; do
    case $sub in
    complete) args=(--prompt hi) ;;
    chat)     args=() ;;
    bench)    args=(--concurrency 2 --requests 3) ;;
    esac
    echo hi | timeout 60 "$BIN" "$sub" --server "$DEAD" "${args[@]}" > "$WORK/dead.out" 2> "$WORK/dead.err"
    rc=$?
    if [ $rc -eq 1 ] && grep -q '^shardlm: error: UNAVAILABLE: ' "$WORK/dead.err"; then
        pass "$sub with no server: UNAVAILABLE, exit 1"
    else
        fail "$sub with no server: UNAVAILABLE, exit 1 (exit $rc)"; cat "$WORK/dead.err"
    fi
done

# ---- bad flags: exit 2 with a message -----------------------------------------------------
check_usage() {
    local what=$1; shift
    echo | timeout 30 "$BIN" "$@" > "$WORK/u.out" 2> "$WORK/u.err"
    local rc=$?
    if [ $rc -eq 2 ] && grep -q '^shardlm ' "$WORK/u.err"; then
        pass "bad flags exit 2: $what"
    else
        fail "bad flags exit 2: $what (exit $rc)"; cat "$WORK/u.err"
    fi
}
check_usage "complete --bogus" complete --server "$ADDR" --bogus
check_usage "complete --temperature -1" complete --server "$ADDR" --temperature -1
check_usage "complete --max-tokens x" complete --server "$ADDR" --max-tokens x
check_usage "complete --prompt (no value)" complete --server "$ADDR" --prompt
check_usage "chat --top-p 0" chat --server "$ADDR" --top-p 0
check_usage "bench --concurrency 0" bench --server "$ADDR" --concurrency 0
check_usage "bench --requests 1.5" bench --server "$ADDR" --requests 1.5
# A server-side validation error is a server error: exit 1 with its status.
run "$WORK/v.out" "$WORK/v.err" "$BIN" complete --server "$ADDR" --prompt hi --max-tokens 100000
rc=$?
if [ $rc -eq 1 ] && grep -q '^shardlm: error: INVALID_ARGUMENT: .*max_tokens' "$WORK/v.err"; then
    pass "server validation error: INVALID_ARGUMENT, exit 1"
else
    fail "server validation error: INVALID_ARGUMENT, exit 1 (exit $rc)"; cat "$WORK/v.err"
fi

# ---- API keys -----------------------------------------------------------------------------
printf '# test keys\nsecret-key-1\n' > "$WORK/keys"
printf 'wrong-key\n' > "$WORK/wrong"
start_server auth --api-key-file "$WORK/keys"
run "$WORK/k.out" "$WORK/k.err" "$BIN" complete --server "$ADDR" --prompt hi --max-tokens 4
rc=$?
if [ $rc -eq 1 ] && grep -q '^shardlm: error: [A-Z_]*: UNAUTHENTICATED' "$WORK/k.err"; then
    pass "no API key: UNAUTHENTICATED, exit 1"
else
    fail "no API key: UNAUTHENTICATED, exit 1 (exit $rc)"; cat "$WORK/k.err"
fi
run "$WORK/k.out" "$WORK/k.err" "$BIN" complete --server "$ADDR" --prompt hi --max-tokens 4 \
    --api-key-file "$WORK/wrong"
rc=$?
if [ $rc -eq 1 ] && grep -q 'UNAUTHENTICATED' "$WORK/k.err"; then
    pass "wrong API key: UNAUTHENTICATED, exit 1"
else
    fail "wrong API key: UNAUTHENTICATED, exit 1 (exit $rc)"; cat "$WORK/k.err"
fi
if run "$WORK/k.out" "$WORK/k.err" "$BIN" complete --server "$ADDR" --prompt hi --max-tokens 4 \
       --api-key-file "$WORK/keys" --stream; then
    pass "right API key: served"
else
    fail "right API key: served"; cat "$WORK/k.err"
fi

# ---- TLS (a self-signed certificate for localhost / 127.0.0.1) ------------------------------
if command -v openssl > /dev/null && openssl req -x509 -newkey rsa:2048 -nodes -days 2 \
       -keyout "$WORK/key.pem" -out "$WORK/cert.pem" -subj "/CN=localhost" \
       -addext "subjectAltName=DNS:localhost,IP:127.0.0.1" > /dev/null 2>&1; then
    start_server tls --tls-cert "$WORK/cert.pem" --tls-key "$WORK/key.pem"
    if run "$WORK/t.out" "$WORK/t.err" "$BIN" complete --server "$ADDR" --prompt hi --max-tokens 4 \
           --tls-ca "$WORK/cert.pem" --tls-server-name localhost --stream; then
        pass "TLS: served to a client that trusts the certificate"
    else
        fail "TLS: served to a client that trusts the certificate"; cat "$WORK/t.err"
    fi
    run "$WORK/t.out" "$WORK/t.err" "$BIN" complete --server "$ADDR" --prompt hi --max-tokens 4
    rc=$?
    if [ $rc -eq 1 ] && grep -q '^shardlm: error: UNAVAILABLE: ' "$WORK/t.err"; then
        pass "TLS: a plaintext client gets UNAVAILABLE, exit 1"
    else
        fail "TLS: a plaintext client gets UNAVAILABLE, exit 1 (exit $rc)"; cat "$WORK/t.err"
    fi
    run "$WORK/t.out" "$WORK/t.err" "$BIN" complete --server "$ADDR" --prompt hi --max-tokens 4 --tls
    rc=$?
    if [ $rc -eq 1 ] && grep -q '^shardlm: error: UNAVAILABLE: .*certificate verify failed' "$WORK/t.err"; then
        pass "TLS: an untrusted certificate is refused, exit 1"
    else
        fail "TLS: an untrusted certificate is refused, exit 1 (exit $rc)"; cat "$WORK/t.err"
    fi
else
    echo "skip - TLS (no openssl to make a certificate)"
fi

# ---- a model whose logits overflow: the request fails with INTERNAL, the server goes on -------
mkdir -p "$WORK/overflow"
cp "$MODEL"/* "$WORK/overflow/"
python3 - "$WORK/overflow/model.safetensors" <<'PY'
import json, struct, sys
b = bytearray(open(sys.argv[1], "rb").read())
n = struct.unpack("<Q", b[:8])[0]
lo, hi = json.loads(b[8:8 + n])["model.norm.weight"]["data_offsets"]
for i in range((hi - lo) // 4):  # finite (the load check passes), but the logits overflow to NaN
    struct.pack_into("<f", b, 8 + n + lo + 4 * i, 3e38)
open(sys.argv[1], "wb").write(b)
PY
MODEL=$WORK/overflow start_server overflow
for mode in "" --stream; do
    run "$WORK/o.out" "$WORK/o.err" "$BIN" complete --server "$ADDR" --prompt hi --max-tokens 4 $mode
    rc=$?
    if [ $rc -eq 1 ] && grep -q 'INTERNAL: .*NaN or Inf logits' "$WORK/o.err"; then
        pass "non-finite logits: INTERNAL, no token sampled ${mode:-(unary)}"
    else
        fail "non-finite logits: INTERNAL ${mode:-(unary)} (exit $rc)"; cat "$WORK/o.err"
    fi
done
if run "$WORK/o.out" "$WORK/o.err" "$BIN" stats --server "$ADDR"; then
    pass "non-finite logits: the server still answers"
else
    fail "non-finite logits: the server still answers"; cat "$WORK/o.err"
fi

if [ $FAILS -ne 0 ]; then
    echo "$FAILS check(s) failed"
    exit 1
fi
echo "all client checks passed"
exit 0
