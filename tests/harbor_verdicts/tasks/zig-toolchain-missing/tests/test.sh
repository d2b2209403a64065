#!/bin/bash
mkdir -p /logs/verifier
if [ -x /app/hello ] && [ "$(/app/hello 2>&1)" = "hello" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
