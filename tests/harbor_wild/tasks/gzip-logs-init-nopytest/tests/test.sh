#!/bin/bash

# Install test dependencies here for shared mode, or in tests/Dockerfile for separate mode.
# Use this file to verify the task and generate a reward.
# It will be copied to /tests/test.sh and run from the working directory.

# Make sure to output a reward to /logs/verifier/reward.txt.
# Or optionally, multiple rewards to /logs/verifier/rewards.json (key-value pairs).

mkdir -p /logs/verifier
reward=1

for name in boot access error; do
  if [ -e "/app/logs/$name.log" ]; then
    echo "FAIL: /app/logs/$name.log still present"; reward=0
  fi
  if ! gzip -t "/app/logs/$name.log.gz" 2>/dev/null; then
    echo "FAIL: /app/logs/$name.log.gz missing or corrupt"; reward=0
  fi
done
if [ "$(zcat /app/logs/access.log.gz 2>/dev/null)" != "$(printf 'GET / 200\nGET /a 404')" ]; then
  echo "FAIL: access.log.gz content"; reward=0
fi
if [ "$(cat /app/logs/README 2>/dev/null)" != "keep me" ]; then
  echo "FAIL: README changed"; reward=0
fi
if [ "$(tr -d '[:space:]' < /app/compressed.txt 2>/dev/null)" != "3" ]; then
  echo "FAIL: compressed.txt should say 3"; reward=0
fi

echo "reward=$reward"
echo "$reward" > /logs/verifier/reward.txt
