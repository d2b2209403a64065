#!/bin/bash
mkdir -p /logs/verifier
cd /app || exit 1
if python3 -m pytest -q /tests/test_stats.py; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
