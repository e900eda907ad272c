# tests/check.sh - sourced by the shell tests (test_cli.sh, test_gguf_generate.sh,
# test_keep_blocks.sh), as tests/check.h is by the C ones: a temporary directory $tmp removed at
# exit, `check NAME COND-EXIT-CODE` printing PASS or FAIL and counting, and `check_summary`,
# which prints the counts and returns non-zero when anything failed (the script's last command).
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pass=0
fail=0
check() { # check NAME COND-EXIT-CODE
  if [ "$2" = 0 ]; then pass=$((pass + 1)); echo "PASS $1"; else fail=$((fail + 1)); echo "FAIL $1"; fi
}
check_summary() {
  echo "$pass passed, $fail failed"
  [ "$fail" = 0 ]
}
