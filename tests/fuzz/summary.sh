#!/usr/bin/env bash
# tests/fuzz/summary.sh BUILD_DIR - the totals of every fuzzing run that tests/fuzz/run.sh
# recorded in BUILD_DIR/fuzz-logs/history.tsv: per target, the runs, executions, seconds and
# the runs that ended with a finding (exit status not 0). The figures of docs/reliability.md.
set -eu
hist=${1:?usage: summary.sh BUILD_DIR}/fuzz-logs/history.tsv
printf "%-14s %5s %14s %8s %9s\n" target runs executions seconds findings
awk -F'\t' '
    { runs[$2]++; ex[$2] += $3; sec[$2] += $4; if ($5 != 0) bad[$2]++ }
    END {
        for (t in runs) printf "%-14s %5d %14d %8d %9d\n", t, runs[t], ex[t], sec[t], bad[t]
    }' "$hist" | sort
