#!/bin/bash
# Anti-cheat: the hidden cases stay readable by root only, and the agent's program runs as `nobody`,
# so it can neither read the expected outputs nor write to them.
mkdir -p /logs/verifier
chmod -R go-rwx /tests

passed=0
total=0
for input in /tests/cases/*.in; do
  total=$((total + 1))
  expected="${input%.in}.out"
  actual=$(su nobody -s /bin/bash -c "cd /tmp && timeout 10 python3 /app/solver.py" < "$input" 2>/tmp/solver-stderr)
  if [ "$actual" = "$(cat "$expected")" ]; then
    passed=$((passed + 1))
    echo "case $(basename "$input"): ok"
  else
    echo "case $(basename "$input"): FAILED"
    head -c 2000 /tmp/solver-stderr
  fi
done

echo "$passed/$total cases passed"
if [ "$total" -gt 0 ] && [ "$passed" -eq "$total" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
