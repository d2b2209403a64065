#!/bin/bash
# Scores each case; reward.json carries the overall reward and the counts.
mkdir -p /logs/verifier
cd /tmp
passed=0
total=0
check() {
  total=$((total + 1))
  printf '%b' "$1" > /tmp/case.txt
  got="$(wordstat /tmp/case.txt 2>/dev/null)"
  [ "$got" = "$2" ] && passed=$((passed + 1))
}
check 'one two\nthree\n' '2 3 14'
check '' '0 0 0'
check 'a b c d\n' '1 4 8'
python3 - "$passed" "$total" <<'PY'
import json, sys
p, t = int(sys.argv[1]), int(sys.argv[2])
json.dump({"reward": 1.0 if p == t else 0.0, "cases_passed": p, "cases_total": t},
          open("/logs/verifier/reward.json", "w"))
PY
