# Shared helpers, sourced by every step's test.sh (uploaded with the step's own tests to /tests).
FAILED=0

# expect NAME EXPECTED COMMAND...: run COMMAND, compare its stdout with EXPECTED.
expect() {
  local name="$1" expected="$2"; shift 2
  local got
  got=$("$@" 2>/tmp/expect-stderr)
  if [ "$got" = "$expected" ]; then
    echo "PASS $name"
  else
    echo "FAIL $name"; echo "  expected: $(printf '%q' "$expected")"; echo "  got:      $(printf '%q' "$got")"
    sed 's/^/  stderr: /' /tmp/expect-stderr
    FAILED=1
  fi
}

# finish: write the step's reward (1 when every expectation held) and exit 0.
finish() {
  mkdir -p /logs/verifier
  if [ "$FAILED" = 0 ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
  exit 0
}
