#!/usr/bin/env bash
# tests/fuzz/run.sh BUILD_DIR SECONDS [TARGET...] - runs each libFuzzer target (all of them
# when none is named) for SECONDS seconds, one after the other, starting from its seed corpus
# tests/fuzz/corpus/<target>/ (never written to) plus what earlier runs found, kept in
# BUILD_DIR/fuzz-corpus/<target>/. Crashes, leaks, timeouts and out-of-memory inputs go to
# BUILD_DIR/fuzz-findings/<target>-*. Prints one line per target: executions, seconds, corpus
# size, findings; exits 1 when any target found something. Limits: 2 GB RSS, 1 GB per
# allocation (a parser must refuse a huge size, not allocate it), 10 s per input (FUZZ_TIMEOUT).
# Every run appends "date target executions seconds exit findings" to
# BUILD_DIR/fuzz-logs/history.tsv (the totals of docs/reliability.md are its sums).
# Environment: FUZZ_JOBS (default 1) runs that many targets at once; FUZZ_TAG names the log
# (TARGET-TAG.log), so that two runs of one target (one a core) can share its corpus; FUZZ_TIMEOUT (default 10)
# is libFuzzer's seconds per input (raise it for a campaign run at nice 19 beside other work:
# starved of the CPU, an input of 0.2 s once passed 10 s, a false timeout); ASAN_OPTIONS passes
# through (ASAN_OPTIONS=malloc_context_size=0 doubles the speed of the SentencePiece-bound
# targets, whose time goes to recording allocation stacks; rerun a finding without it).
set -u
build=${1:?usage: run.sh BUILD_DIR SECONDS [TARGET...]}
seconds=${2:?usage: run.sh BUILD_DIR SECONDS [TARGET...]}
shift 2
here=$(cd "$(dirname "$0")" && pwd)
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
    for d in "$here"/corpus/*/; do targets+=("$(basename "$d")"); done
fi
mkdir -p "$build/fuzz-findings" "$build/fuzz-logs"

run_one() {
    local t=$1 exe="$build/tests/fuzz/fuzz_$1" log="$build/fuzz-logs/$1${FUZZ_TAG:+-$FUZZ_TAG}.log"
    if [ ! -x "$exe" ]; then echo "$t: no executable $exe (make build-fuzz)"; return 1; fi
    mkdir -p "$build/fuzz-corpus/$t"
    # The targets that run SentencePiece on every input are 10x slower than the others: their
    # inputs are kept to 512 bytes (256 ids, or a few messages) for executions' sake.
    local max_len=4096
    case $t in chat_template | detokenize | train_data) max_len=512 ;; esac
    # -error_exitcode=1: libFuzzer's default (77) for a crash or leak is ctest's SKIP code, which the
    # test below would report as "SKIP" instead of a finding.
    "$exe" -max_total_time="$seconds" -max_len=$max_len -rss_limit_mb=2048 -malloc_limit_mb=1024 -timeout="${FUZZ_TIMEOUT:-10}" -report_slow_units="${FUZZ_TIMEOUT:-10}" -error_exitcode=1 \
        -print_final_stats=1 -artifact_prefix="$build/fuzz-findings/$t-" \
        "$build/fuzz-corpus/$t" "$here/corpus/$t" >"$log" 2>&1
    local rc=$?
    if [ $rc -eq 77 ] || grep -q '^SKIP' "$log"; then echo "$t: SKIP ($(grep -m1 '^SKIP' "$log"))"; return 0; fi
    local runs secs
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    secs=$(sed -n 's/^Done [0-9]* runs in \([0-9]*\) second.*/\1/p' "$log" | tail -1)
    local found
    found=$(ls "$build/fuzz-findings" | grep -c "^$t-" || true)
    printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$(date -u +%FT%TZ)" "$t" "${runs:-0}" "${secs:-0}" "$rc" "$found" \
        >>"$build/fuzz-logs/history.tsv"
    echo "$t: ${runs:-?} executions in ${secs:-?} s, corpus $(ls "$build/fuzz-corpus/$t" | wc -l) files," \
         "exit $rc, findings so far: $found (log: $log)"
    [ $rc -eq 0 ]
}

status=0
jobs=${FUZZ_JOBS:-1}
for t in "${targets[@]}"; do
    if [ "$jobs" -le 1 ]; then
        run_one "$t" || status=1
    else
        run_one "$t" &
        while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n || status=1; done
    fi
done
while [ "$(jobs -rp | wc -l)" -gt 0 ]; do wait -n || status=1; done
exit $status
