#!/bin/bash
# Verifier of count-words: writes 1 or 0 to /logs/verifier/reward.txt (Harbor's verifier reads it).
mkdir -p /logs/verifier
if [ "$(tr -d "[:space:]" < /app/answer.txt 2>/dev/null)" = "35" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
