#!/bin/bash
# Verifier of sort-unique-names: writes 1 or 0 to /logs/verifier/reward.txt (Harbor's verifier reads it).
mkdir -p /logs/verifier
if [ "$(cat /app/unique.txt 2>/dev/null)" = "$(printf 'alice\nbob\ncarol\ndave\nerin')" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
