#!/bin/bash
# Writes two named rewards to /logs/verifier/reward.json:
#   correct - the script's output is right (this is the task's score)
#   style   - line length / tabs / final newline (informational)
mkdir -p /logs/verifier

correct=0
style=0

expected=$(python3 -c 'print("\n".join("FizzBuzz" if i % 15 == 0 else "Fizz" if i % 3 == 0 else "Buzz" if i % 5 == 0 else str(i) for i in range(1, 31)))')
if [ -f /app/fizzbuzz.py ]; then
  actual=$(cd /tmp && timeout 10 python3 /app/fizzbuzz.py 2>/dev/null)
  [ "$actual" = "$expected" ] && correct=1

  if ! grep -qP '\t' /app/fizzbuzz.py \
     && [ "$(awk '{ if (length($0) > 79) n++ } END { print n + 0 }' /app/fizzbuzz.py)" -eq 0 ] \
     && [ -z "$(tail -c 1 /app/fizzbuzz.py)" ]; then
    style=1
  fi
fi

echo "correct=$correct style=$style"
printf '{"correct": %d, "style": %d}\n' "$correct" "$style" > /logs/verifier/reward.json
