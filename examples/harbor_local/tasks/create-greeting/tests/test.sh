#!/bin/bash
# Verifier of create-greeting: writes 1 or 0 to /logs/verifier/reward.txt (Harbor's verifier reads it).
mkdir -p /logs/verifier
if [ "$(cat /app/greeting.txt 2>/dev/null)" = "Hello, Harbor!" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
