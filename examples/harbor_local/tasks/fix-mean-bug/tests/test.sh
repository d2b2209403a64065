#!/bin/bash
# Verifier of fix-mean-bug: writes 1 or 0 to /logs/verifier/reward.txt (Harbor's verifier reads it).
mkdir -p /logs/verifier
if [ "$(python3 /app/stats.py 1 2 3 4)" = "2.5" ] && [ "$(python3 /app/stats.py 10)" = "10.0" ] && [ "$(python3 /app/stats.py 2 4 9)" = "5.0" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
