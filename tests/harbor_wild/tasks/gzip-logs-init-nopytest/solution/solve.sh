#!/bin/bash

# Use this file to solve the task.
set -e
cd /app/logs
n=0
for f in *.log; do
  gzip "$f"
  n=$((n + 1))
done
echo "$n" > /app/compressed.txt
