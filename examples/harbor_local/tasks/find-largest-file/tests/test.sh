#!/bin/bash
# Verifier of find-largest-file: writes 1 or 0 to /logs/verifier/reward.txt (Harbor's verifier reads it).
mkdir -p /logs/verifier
if [ "$(tr -d "[:space:]" < /app/answer.txt 2>/dev/null)" = "b.log" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
